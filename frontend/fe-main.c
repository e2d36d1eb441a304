/* fe-main.c — the `lmserve frontend` subcommand: parses flags, runs the
 * HTTP server on a libuv loop, prints the URL once it listens, and drains on
 * SIGINT/SIGTERM (new requests get 503, requests in progress may finish
 * until --drain-timeout, then the process exits 0).
 *
 * With --scheduler (and --model for the tokenizer and chat template) the
 * serving path (fe-engine.h) answers generation routes and /health; without
 * it they answer 503 "engine not ready". */
#include "frontend/fe-main.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "common/cm-args.h"
#include "common/cm-err.h"
#include "common/cm-log.h"
#include "common/cm-time.h"
#include "frontend/fe-cors.h"
#include "frontend/fe-engine.h"
#include "frontend/fe-route.h"
#include "frontend/fe-server.h"
#include "frontend/fe-tls.h"
#include "model/md-config.h"
#include "model/md-lora-list.h"
#include "tokenizer/tk-chat.h"

#define TAG "fe"

struct fe_app {
  uv_loop_t *loop;
  struct fe_server *srv;
  struct fe_router *router;
  uv_signal_t sigint, sigterm;
  uv_timer_t drain_timer;
  uint64_t drain_ns;          /* --drain-timeout */
  uint64_t drain_deadline_ns; /* monotonic */
  int stopping;
};

static void close_cb(uv_handle_t *h) {
  (void)h;
}

static void app_stop(struct fe_app *a) {
  if (a->stopping) return;
  a->stopping = 1;
  fe_server_destroy(a->srv);
  uv_close((uv_handle_t *)&a->sigint, close_cb);
  uv_close((uv_handle_t *)&a->sigterm, close_cb);
  uv_close((uv_handle_t *)&a->drain_timer, close_cb);
}

static void on_drain_tick(uv_timer_t *t) {
  struct fe_app *a = t->data;
  if (fe_server_busy(a->srv) == 0 && fe_server_writing(a->srv) == 0) {
    cm_info(TAG, "drained; exiting");
    app_stop(a);
  } else if (cm_time_ns() >= a->drain_deadline_ns) {
    cm_warn(TAG, "drain timeout: aborting %d request(s) in progress", fe_server_busy(a->srv));
    app_stop(a);
  }
}

static void on_signal(uv_signal_t *s, int signum) {
  struct fe_app *a = s->data;
  if (fe_server_draining(a->srv)) {
    cm_warn(TAG, "second signal: stopping now");
    app_stop(a);
    return;
  }
  cm_info(TAG, "%s: draining (new requests get 503)", signum == SIGINT ? "SIGINT" : "SIGTERM");
  fe_server_drain(a->srv);
  a->drain_deadline_ns = cm_time_ns() + a->drain_ns;
  uv_timer_start(&a->drain_timer, on_drain_tick, 0, 20);
}

int fe_main_cors_check(const char *origins, const char *methods, const char *headers, char *why,
                       size_t whylen) {
  struct fe_cors *k = NULL;
  int rc = fe_cors_create(origins, methods, headers, 0, &k, why, whylen);
  fe_cors_destroy(k);
  return rc;
}

int fe_main_chat_template_check(const char *value, char *why, size_t whylen) {
  char *tmpl = NULL, err[400] = "";
  int rc = tk_chat_template_arg(value, &tmpl, why, whylen);
  if (rc) return rc;
  struct tk_chat *chat = NULL;
  rc = tk_chat_from_string(tmpl, strlen(tmpl), NULL, &chat, err, sizeof(err));
  if (rc) snprintf(why, whylen, "--chat-template: %s", err[0] ? err : cm_strerror(rc));
  tk_chat_free(chat);
  free(tmpl);
  return rc;
}

int fe_main_template_kwargs_ok(const char *json) {
  json_t *kw = json_loads(json, 0, NULL);
  json_t *th = json_object_get(kw, "enable_thinking");
  int ok = json_is_object(kw) && (!th || json_is_boolean(th) || json_is_null(th));
  json_decref(kw);
  return ok;
}

void fe_main_sampling_text(const struct md_sampling *s, char *out, size_t size) {
  size_t o = 0;
  out[0] = 0;
#define PUT(...) o += (size_t)snprintf(out + o, o < size ? size - o : 0, __VA_ARGS__)
  if (s->has & MD_SAMPLE_TEMPERATURE) PUT("%stemperature %g", o ? ", " : "", s->temperature);
  if (s->has & MD_SAMPLE_TOP_P) PUT("%stop_p %g", o ? ", " : "", s->top_p);
  if (s->has & MD_SAMPLE_TOP_K) PUT("%stop_k %d", o ? ", " : "", (int)s->top_k);
  if (s->has & MD_SAMPLE_MIN_P) PUT("%smin_p %g", o ? ", " : "", s->min_p);
  if (s->has & MD_SAMPLE_REPETITION_PENALTY)
    PUT("%srepetition_penalty %g", o ? ", " : "", s->repetition_penalty);
  if (s->has & MD_SAMPLE_MAX_TOKENS)
    PUT("%smax_tokens at most %lld", o ? ", " : "", (long long)s->max_tokens);
#undef PUT
}

/* --api-key's keys (NULL: none) and those of the file `path`, a line apart, into
 * *out (malloc'd): 0, or -1 with the reason printed. The file is read once, at
 * start (a restart picks up a rotated key). */
int fe_main_read_keys(const char *keys, const char *path, char **out) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "lmserve: --api-key-file %s: %s\n", path, strerror(errno));
    return -1;
  }
  size_t kl = keys ? strlen(keys) : 0, cap = kl + 4096, n = 0;
  char *buf = malloc(cap);
  if (buf && kl) {
    memcpy(buf, keys, kl);
    buf[kl] = '\n';
    n = kl + 1;
  }
  size_t k = 0;
  while (buf && (k = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += k;
    if (cap - n - 1 == 0) {
      char *nb = cap < (1u << 20) ? realloc(buf, 2 * cap) : NULL;
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap *= 2;
    }
  }
  int bad = ferror(f);
  fclose(f);
  if (!buf || bad || memchr(buf, 0, n)) {
    fprintf(stderr, "lmserve: --api-key-file %s: %s\n", path,
            bad   ? strerror(errno)
            : buf ? "not a text file"
                  : "larger than 1 MiB");
    free(buf);
    return -1;
  }
  buf[n] = 0;
  int any = 0; /* a key in the file (a line neither blank nor a comment) */
  for (const char *l = buf + (kl ? kl + 1 : 0); *l && !any;) {
    const char *p = l + strspn(l, " \t,");
    any = *p && *p != '#' && *p != '\r' && *p != '\n';
    l += strcspn(l, "\n");
    l += *l == '\n';
  }
  if (!any) {
    fprintf(stderr, "lmserve: --api-key-file %s holds no key\n", path);
    free(buf);
    return -1;
  }
  *out = buf;
  return 0;
}

int fe_main_policy_check(const char *prog, const struct fe_main_policy *pl, int *fcfs,
                         enum cm_log_level *level) {
  *fcfs = 0;
  if (pl->scheduling && strcmp(pl->scheduling, "priority")) {
    if (strcmp(pl->scheduling, "fcfs")) {
      fprintf(stderr, "%s: --scheduling-policy: '%s' is neither fcfs nor priority\n", prog,
              pl->scheduling);
      return -1;
    }
    *fcfs = 1;
  }
  if (!pl->uvicorn_level) return 0;
  static const struct {
    const char *name;
    enum cm_log_level level;
  } names[] = {{"critical", CM_LOG_ERROR}, {"error", CM_LOG_ERROR}, {"warning", CM_LOG_WARN},
               {"info", CM_LOG_INFO},      {"debug", CM_LOG_DEBUG}, {"trace", CM_LOG_TRACE}};
  for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++)
    if (!strcmp(pl->uvicorn_level, names[k].name)) {
      *level = names[k].level;
      return 0;
    }
  fprintf(stderr,
          "%s: --uvicorn-log-level: '%s' is none of critical, error, warning, info, debug, "
          "trace\n",
          prog, pl->uvicorn_level);
  return -1;
}

int fe_frontend_main(int argc, char **argv) {
  const char *host = "127.0.0.1", *api_key = NULL, *model = NULL, *key_file = NULL;
  static struct cm_strs schedulers, names, lora_args; /* values live as long as the process */
  static struct md_lora_module loras[CM_STRS_MAX];
  static const char *lora_names[CM_STRS_MAX], *lora_paths[CM_STRS_MAX];
  const char *model_dir = NULL, *tok_dir = NULL, *mmproj = NULL;
  struct fe_engine *engine = NULL;
  int64_t port = 8000, max_model_len = 8192, max_headers = 100, max_conns = 4096;
  uint64_t max_body = 32ull << 20, max_header_bytes = 16u << 10;
  double header_timeout = 10, body_timeout = 30, idle_timeout = 5, drain_timeout = 30;
  const char *media_dir = NULL, *limit_mm = NULL, *template_kwargs = NULL, *chat_template = NULL;
  const char *mm_kwargs = NULL;
  const char *gen_config = "auto", *gen_override = NULL;
  static struct md_sampling sampling; /* the router keeps a pointer */
  const char *cors_origins = NULL, *cors_methods = NULL, *cors_headers = NULL;
  int cors_credentials = 0, prompt_details = 0, trust_template = 0, no_access_log = 0;
  int id_headers = 0;
  struct fe_main_log lg = {.stats_s = 10};
  struct fe_main_policy pol = {0};
  int runtime_lora = 0;
  const char *ssl_key = NULL, *ssl_cert = NULL, *ssl_ca = NULL;
  uint64_t max_image_bytes = 20u << 20;
  uint64_t store_size = 64u << 20; /* bytes: the Responses API's store */
  int64_t max_image_pixels = 40000000;
  struct cm_opt opts[] = {
      {"host", CM_OPT_STR, &host, "ADDR", "address or host name to listen on (default 127.0.0.1)"},
      {"port", CM_OPT_INT, &port, "N", "TCP port (default 8000; 0 picks a free one)", 0, 65535},
      {"api-key", CM_OPT_STR, &api_key, "KEY", FE_MAIN_API_KEY_HELP},
      {"api-key-file", CM_OPT_STR, &key_file, "FILE", FE_MAIN_API_KEY_FILE_HELP},
      {"served-model-name", CM_OPT_STRS, &names, "NAME", FE_MAIN_SERVED_NAME_HELP},
      {"lora-modules", CM_OPT_STRS, &lora_args, "NAME=PATH", MD_LORA_MODULES_HELP},
      {"allow-runtime-lora-updating", CM_OPT_BOOL, &runtime_lora, NULL, MD_RUNTIME_LORA_HELP},
      {"ssl-keyfile", CM_OPT_STR, &ssl_key, "FILE",
       "PEM private key: serve HTTPS (with --ssl-certfile)"},
      {"ssl-certfile", CM_OPT_STR, &ssl_cert, "FILE",
       "PEM certificate chain, the server's first (with --ssl-keyfile)"},
      {"ssl-ca-certs", CM_OPT_STR, &ssl_ca, "FILE",
       "PEM CA certificates: clients must present a certificate one of them signed"},
      {"max-model-len", CM_OPT_INT, &max_model_len, "N",
       "context length in tokens (default 8192); with --scheduler, only until the schedulers "
       "answer: then theirs (the model's, or their --max-model-len)",
       1, INT32_MAX},
      {"scheduler", CM_OPT_STRS, &schedulers, "ENDPOINT",
       "scheduler endpoint (ipc:// or tcp://); several (repeated, or comma-separated): model "
       "replicas, each request routed by load and prompt-prefix affinity"},
      {"model", CM_OPT_STR, &model_dir, "DIR",
       "model directory: tokenizer.json, tokenizer_config.json (needed with --scheduler); or a "
       "GGUF file (its own tokenizer and chat template, or --tokenizer's)"},
      {"tokenizer", CM_OPT_STR, &tok_dir, "DIR",
       "tokenizer.json, tokenizer_config.json and generation_config.json from DIR instead of "
       "--model's"},
      {"mmproj", CM_OPT_STR, &mmproj, "FILE", MD_MMPROJ_HELP},
      {"chat-template", CM_OPT_STR, &chat_template, "FILE|TEMPLATE", FE_MAIN_CHAT_TEMPLATE_HELP},
      FE_MAIN_CORS_OPTS(cors_origins, cors_methods, cors_headers, cors_credentials),
      {"enable-prompt-tokens-details", CM_OPT_BOOL, &prompt_details, NULL,
       FE_MAIN_PROMPT_DETAILS_HELP},
      {"trust-request-chat-template", CM_OPT_BOOL, &trust_template, NULL,
       FE_MAIN_TRUST_TEMPLATE_HELP},
      {"disable-access-log", CM_OPT_BOOL, &no_access_log, NULL, FE_MAIN_ACCESS_LOG_HELP},
      {"enable-request-id-headers", CM_OPT_BOOL, &id_headers, NULL, FE_MAIN_ID_HEADERS_HELP},
      {"disable-uvicorn-access-log", CM_OPT_BOOL, &no_access_log, NULL, "the same (vLLM's name)"},
      FE_MAIN_LOG_OPTS(lg),
      FE_MAIN_POLICY_OPTS(pol),
      {"generation-config", CM_OPT_STR, &gen_config, "auto|vllm|DIR", FE_MAIN_GEN_CONFIG_HELP},
      {"override-generation-config", CM_OPT_STR, &gen_override, "JSON", FE_MAIN_GEN_OVERRIDE_HELP},
      {"default-chat-template-kwargs", CM_OPT_STR, &template_kwargs, "JSON",
       "chat template variables every chat request gets, under its own chat_template_kwargs "
       "(e.g. '{\"enable_thinking\": true}')"},
      {"allowed-local-media-path", CM_OPT_STR, &media_dir, "DIR",
       "images may be file:// URLs of files under DIR (default: file:// refused)"},
      {"limit-mm-per-prompt", CM_OPT_STR, &limit_mm, FE_MAIN_LIMIT_MM_ARG, FE_MAIN_LIMIT_MM_HELP},
      {"mm-processor-kwargs", CM_OPT_STR, &mm_kwargs, "JSON", FE_MAIN_MM_KWARGS_HELP},
      {"max-image-bytes", CM_OPT_SIZE, &max_image_bytes, "BYTES", "largest encoded image (20M)"},
      {"responses-store-size", CM_OPT_SIZE, &store_size, "BYTES", FE_MAIN_RSTORE_HELP},
      {"max-image-pixels", CM_OPT_INT, &max_image_pixels, "N",
       "largest decoded image in pixels, checked before decoding (40000000)", 1, INT64_MAX},
      {"max-body-size", CM_OPT_SIZE, &max_body, "BYTES",
       "largest request body (default 32M); more is 413"},
      {"max-header-size", CM_OPT_SIZE, &max_header_bytes, "BYTES",
       "largest request head (default 16K); more is 431"},
      {"max-headers", CM_OPT_INT, &max_headers, "N", "most header fields per request (default 100)",
       1, 10000},
      {"max-connections", CM_OPT_INT, &max_conns, "N", "most open connections (default 4096)", 1,
       1000000},
      {"header-timeout", CM_OPT_DOUBLE, &header_timeout, "S",
       "seconds to receive a request head (default 10)", 0, 0, 0.001, 3600},
      {"body-timeout", CM_OPT_DOUBLE, &body_timeout, "S",
       "seconds between reads of a body (default 30)", 0, 0, 0.001, 3600},
      {"idle-timeout", CM_OPT_DOUBLE, &idle_timeout, "S", "keep-alive idle seconds (default 5)", 0,
       0, 0.001, 3600},
      {"drain-timeout", CM_OPT_DOUBLE, &drain_timeout, "S",
       "seconds requests may finish after SIGTERM (default 30)", 0, 0, 0, 3600},
      {0},
  };
  int rc = cm_args_parse("lmserve frontend", "run the HTTP frontend role alone", opts, argc, argv,
                         1, NULL, 0, NULL);
  if (rc == CM_ARGS_HELP) return 0;
  if (rc < 0) return 2;
  int fcfs = 0;
  enum cm_log_level level = cm_log_get_level();
  if (fe_main_policy_check("lmserve frontend", &pol, &fcfs, &level) != 0) return 2;
  cm_log_set_level(level);
  if (!api_key) api_key = getenv("LMSERVE_API_KEY");
  static char *keys; /* --api-key's and --api-key-file's keys, a line apart */
  if (key_file) {
    if (fe_main_read_keys(api_key, key_file, &keys) != 0) return 2;
    api_key = keys;
  }
  for (int i = 0; i < names.n; i++)
    if (!*names.v[i]) {
      fprintf(stderr, "lmserve frontend: --served-model-name must not be empty\n");
      return 2;
    }
  model = names.n ? names.v[0] : model_dir && *model_dir ? model_dir : "default";
  char lwhy[256];
  int n_loras = md_lora_modules(&lora_args, loras, lwhy, sizeof(lwhy));
  if (n_loras < 0) {
    fprintf(stderr, "lmserve frontend: %s\n", lwhy);
    return 2;
  }
  for (int i = 0; i < n_loras; i++) {
    lora_names[i] = loras[i].name;
    lora_paths[i] = loras[i].path;
    int clash = !strcmp(loras[i].name, model);
    for (int j = 0; j < names.n; j++)
      clash |= !strcmp(loras[i].name, names.v[j]);
    if (clash) {
      fprintf(stderr, "lmserve frontend: --lora-modules: %s is the served model's name\n",
              loras[i].name);
      return 2;
    }
  }
  if (max_header_bytes < 256 || max_body > (1ull << 34)) {
    fprintf(stderr,
            "lmserve frontend: --max-header-size must be >= 256 and --max-body-size <= 16G\n");
    return 2;
  }

  int mm_limit = -1, audio_limit = -1;
  if (limit_mm) {
    char why[160];
    if (fe_mm_parse_limit(limit_mm, &mm_limit, &audio_limit, why, sizeof(why)) != 0) {
      fprintf(stderr, "lmserve frontend: --limit-mm-per-prompt: %s\n", why);
      return 2;
    }
  }
  int soft_tokens = 0;
  if (mm_kwargs) {
    char why[160];
    if (fe_mm_parse_kwargs(mm_kwargs, &soft_tokens, why, sizeof(why)) != 0) {
      fprintf(stderr, "lmserve frontend: --mm-processor-kwargs: %s\n", why);
      return 2;
    }
  }
  char ctwhy[512];
  if (chat_template && fe_main_chat_template_check(chat_template, ctwhy, sizeof(ctwhy))) {
    fprintf(stderr, "lmserve frontend: %s\n", ctwhy);
    return 2;
  }
  if (template_kwargs && !fe_main_template_kwargs_ok(template_kwargs)) {
    fprintf(stderr,
            "lmserve frontend: --default-chat-template-kwargs must be a JSON object (with "
            "enable_thinking a boolean): %s\n",
            template_kwargs);
    return 2;
  }
  char gwhy[512];
  if (md_sampling_load(gen_config, tok_dir ? tok_dir : model_dir, gen_override, &sampling, gwhy,
                       sizeof(gwhy))) {
    fprintf(stderr, "lmserve frontend: %s\n", gwhy);
    return 2;
  }
  if (sampling.has) {
    char said[256];
    fe_main_sampling_text(&sampling, said, sizeof(said));
    cm_info(TAG,
            "sampling defaults from the checkpoint's generation config: %s (--generation-config "
            "vllm for none)",
            said);
  }
  char mm_why[512];
  if (md_model_mmproj_arg(model_dir, mmproj, mm_why, sizeof(mm_why))) {
    fprintf(stderr, "lmserve frontend: %s\n", mm_why);
    return 2;
  }
  if (media_dir && access(media_dir, R_OK | X_OK) != 0) {
    fprintf(stderr, "lmserve frontend: --allowed-local-media-path %s: %s\n", media_dir,
            strerror(errno));
    return 2;
  }

  struct fe_tls *tls = NULL;
  if (ssl_key || ssl_cert || ssl_ca) {
    char why[512];
    if (!ssl_key || !ssl_cert) {
      fprintf(stderr, "lmserve frontend: HTTPS needs both --ssl-keyfile and --ssl-certfile\n");
      return 2;
    }
    if (fe_tls_create(ssl_key, ssl_cert, ssl_ca, &tls, why, sizeof(why)) != 0) {
      fprintf(stderr, "lmserve frontend: %s\n", why);
      return 2;
    }
  }

  struct fe_app app;
  memset(&app, 0, sizeof(app));
  app.loop = uv_default_loop();
  struct fe_route_config rcfg = {api_key,
                                 model,
                                 max_model_len,
                                 template_kwargs,
                                 cors_origins,
                                 cors_methods,
                                 cors_headers,
                                 cors_credentials,
                                 &sampling,
                                 (const char *const *)names.v + (names.n > 0),
                                 names.n > 1 ? names.n - 1 : 0};
  rcfg.responses_store = store_size;
  rcfg.request_id_headers = id_headers;
  rcfg.max_logprobs = (int)pol.max_logprobs;
  const char *rl = getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING");
  rcfg.runtime_lora = runtime_lora || (rl && (!strcmp(rl, "1") || !strcasecmp(rl, "true")));
  rcfg.fcfs = fcfs;
  rcfg.lora_names = lora_names;
  rcfg.lora_paths = lora_paths;
  rcfg.n_loras = n_loras;
  rcfg.lora_sum = md_lora_list_sum(loras, n_loras);
  char rwhy[256] = "";
  if ((rc = fe_router_create(&rcfg, &app.router, rwhy, sizeof(rwhy))) != 0) {
    fprintf(stderr, "lmserve frontend: %s\n", rwhy[0] ? rwhy : cm_strerror(rc));
    fe_tls_destroy(tls);
    return rc == CM_ERR_INVAL ? 2 : 1;
  }
  if (schedulers.n) {
    struct fe_engine_config ecfg = {.model_dir = model_dir,
                                    .tokenizer_dir = tok_dir,
                                    .chat_template = chat_template,
                                    .schedulers = (const char *const *)schedulers.v,
                                    .n_schedulers = schedulers.n,
                                    .model_name = model,
                                    .max_model_len = max_model_len,
                                    .prompt_tokens_details = prompt_details,
                                    .trust_request_chat_template = trust_template,
                                    .log_requests = lg.requests && !lg.no_requests,
                                    .log_outputs = lg.outputs,
                                    .max_log_len = lg.max_len,
                                    .log_stats_s = lg.no_stats ? 0 : lg.stats_s,
                                    .mm = {.limit = mm_limit,
                                           .audio_limit = audio_limit,
                                           .max_bytes = max_image_bytes,
                                           .max_pixels = (uint64_t)max_image_pixels,
                                           .local_dir = media_dir,
                                           .max_soft_tokens = soft_tokens}};
    if (!model_dir || (rc = fe_engine_create(app.loop, app.router, &ecfg, &engine)) != 0) {
      fprintf(stderr, "lmserve frontend: %s\n",
              model_dir ? "cannot start the serving path (see the log)"
                        : "--scheduler needs --model DIR");
      fe_router_destroy(app.router);
      fe_tls_destroy(tls);
      /* a model or flags this frontend cannot serve is a configuration error */
      return !model_dir || rc == CM_ERR_INVAL || rc == CM_ERR_UNSUPPORTED ? 2 : 1;
    }
    struct fe_engine_hooks hooks;
    fe_engine_hooks_get(engine, &hooks);
    fe_router_set_hooks(app.router, &hooks);
  }
  struct fe_server_limits lim;
  fe_server_limits_default(&lim);
  lim.max_body_bytes = max_body;
  lim.max_header_bytes = max_header_bytes;
  lim.max_headers = (size_t)max_headers;
  lim.max_connections = (int)max_conns;
  lim.header_timeout_ms = (uint32_t)(header_timeout * 1000 + 0.5);
  lim.body_timeout_ms = (uint32_t)(body_timeout * 1000 + 0.5);
  lim.idle_timeout_ms = (uint32_t)(idle_timeout * 1000 + 0.5);
  if ((rc = fe_server_create(app.loop, host, (int)port, &lim, fe_router_handle, app.router,
                             &app.srv)) != 0) {
    uv_run(app.loop, UV_RUN_DEFAULT); /* lets the failed listener close */
    fe_tls_destroy(tls);
    fe_engine_destroy(engine);
    fe_router_destroy(app.router);
    uv_loop_close(app.loop);
    return 1;
  }
  if (tls) fe_server_set_tls(app.srv, tls);
  fe_server_set_access_log(app.srv, !no_access_log);
  uv_signal_init(app.loop, &app.sigint);
  uv_signal_init(app.loop, &app.sigterm);
  app.sigint.data = app.sigterm.data = &app;
  uv_signal_start(&app.sigint, on_signal, SIGINT);
  uv_signal_start(&app.sigterm, on_signal, SIGTERM);
  uv_timer_init(app.loop, &app.drain_timer);
  app.drain_timer.data = &app;
  app.drain_ns = (uint64_t)(drain_timeout * 1e9);

  int bound = fe_server_port(app.srv);
  int v6 = strchr(host, ':') != NULL;
  if (!schedulers.n)
    printf("lmserve frontend: model '%s' (max_model_len %lld) listening on ", model,
           (long long)max_model_len);
  else
    printf("lmserve frontend: model '%s' (max_model_len the scheduler's) listening on ", model);
  printf("%s://%s%s%s:%d\n", tls ? "https" : "http", v6 ? "[" : "", host, v6 ? "]" : "", bound);
  fflush(stdout);
  cm_info(TAG, "listening on %s port %d%s", host, bound,
          !tls                       ? ""
          : fe_tls_client_certs(tls) ? " (HTTPS, client certificates required)"
                                     : " (HTTPS)");

  uv_run(app.loop, UV_RUN_DEFAULT); /* until drained and every handle is closed */
  fe_engine_destroy(engine);        /* its handles do not keep the loop alive */
  fe_router_destroy(app.router);
  int close_rc = uv_loop_close(app.loop);
  if (close_rc != 0) cm_warn(TAG, "event loop closed with handles open: %s", uv_strerror(close_rc));
  return 0;
}
