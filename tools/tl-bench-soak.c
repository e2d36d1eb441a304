/* tl-bench-soak.c — `lmserve bench soak`: a long run against a running server
 * that checks it loses nothing and leaks nothing.
 *
 * Requests arrive at --request-rate per second (Poisson) for --duration
 * seconds, at most --concurrency in flight. Each is, by draw:
 *   - malformed (--malformed-rate): one of a set of bad bodies (broken JSON,
 *     wrong types, out-of-range numbers, unknown fields' values, a bad model
 *     name); it must be answered 4xx with an OpenAI error object;
 *   - aborted by the client (--abort-rate): a stream the client closes after
 *     a random delay or its first token;
 *   - normal: a streamed /v1/completions of --output-len tokens that must end
 *     with [DONE] (ok) or in an error the client sees: an HTTP error status
 *     (rejected, e.g. 503 while a role restarts) or an error event (failed).
 * A request that gets nothing the client can act on — no status line, a
 * stream that ends without [DONE] or an error event, no answer within
 * --request-timeout — is lost. The books must balance:
 * sent = ok + rejected + failed + aborted + malformed-refused, and lost = 0.
 *
 * With --serve-pid, the processes under that pid (serve's roles) are sampled
 * every second: resident memory and open file descriptors per role. Every
 * --kill-worker-every seconds a worker process is killed with SIGKILL (serve
 * restarts it). After --warmup seconds the long-lived roles' (frontend,
 * scheduler, serve) memory is followed: its growth over the run and its slope
 * in MB/h. At the end, once idle, the frontend's and scheduler's descriptor
 * counts and the KV usage (/metrics) must be back at their baselines.
 *
 * Exit status: 0 when every check holds, 1 otherwise (the report says which). */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/cm-args.h"
#include "common/cm-err.h"
#include "common/cm-time.h"
#include "tools/tl-http-client.h"
#include "tools/tl-main.h"

enum sk_kind { SK_NORMAL, SK_ABORT, SK_MALFORMED };
enum sk_outcome { SK_OK, SK_REJECTED, SK_FAILED, SK_ABORTED, SK_REFUSED, SK_LOST, SK_ACCEPTED_BAD };
static const char *const outcome_names[] = {
    "ok", "rejected", "failed", "aborted", "malformed refused", "lost", "malformed accepted"};
#define SK_N_OUTCOMES 7

struct sk_config {
  const char *url, *api_key, *model;
  struct tl_url u;
  double duration, rate, abort_rate, malformed_rate, kill_every, warmup, timeout;
  double max_growth_mb, max_slope_mb_h;
  int64_t concurrency, input_len, output_len, seed, serve_pid;
};

/* A process under serve, as sampled. */
struct sk_proc {
  int pid;
  char role[16];
  long rss_kb;
  int fds;
};

struct sk_state {
  struct sk_config *c;
  pthread_mutex_t mu;
  double t0;
  int64_t next, n_total; /* requests drawn / scheduled */
  double *start_at;
  uint8_t *kind;
  long counts[SK_N_OUTCOMES];
  char first_lost[256];
  int stop;
};

static uint64_t xorshift(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return *s;
}

/* ---- one request ------------------------------------------------------------------ */

static const char *const bad_bodies[] = {
    "{\"prompt\": [2, 818, ",                                         /* cut short */
    "{\"prompt\": \"hi\", \"max_tokens\": \"eight\"}",                /* wrong type */
    "{\"prompt\": \"hi\", \"max_tokens\": -3}",                       /* out of range */
    "{\"prompt\": \"hi\", \"temperature\": 1e999}",                   /* not finite */
    "{\"prompt\": \"hi\", \"seed\": 123456789012345678901234567890}", /* beyond 64 bits */
    "{\"prompt\": [2, -7, 9]}",                                       /* id out of vocabulary */
    "{\"prompt\": \"hi\", \"model\": \"no-such-model\"}",             /* unknown model */
    "[1, 2, 3]",                                                      /* not an object */
    "{\"prompt\": \"hi\", \"n\": 0}",                                 /* out of range */
    "{\"prompt\": \"hi\", \"top_p\": 7}",                             /* out of range */
};
#define SK_N_BAD (sizeof(bad_bodies) / sizeof(bad_bodies[0]))

/* Sets a receive timeout on fd. */
static void recv_timeout(int fd, double s) {
  struct timeval tv = {(time_t)s, (suseconds_t)((s - floor(s)) * 1e6)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

static enum sk_outcome run_one(const struct sk_config *c, int64_t i, enum sk_kind kind, char *why,
                               size_t whylen) {
  uint64_t s = (uint64_t)c->seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xD1B54A32D192ED03ull + 1;
  char *body = NULL;
  if (kind == SK_MALFORMED) {
    body = strdup(bad_bodies[xorshift(&s) % SK_N_BAD]);
  } else {
    json_t *ids = json_array();
    json_array_append_new(ids, json_integer(2));
    for (int64_t k = 1; k < c->input_len; k++)
      json_array_append_new(ids, json_integer(256 + (json_int_t)(xorshift(&s) % 200000)));
    json_t *j =
        json_pack("{s:s, s:o, s:I, s:b, s:b, s:f}", "model", c->model, "prompt", ids, "max_tokens",
                  (json_int_t)c->output_len, "ignore_eos", 1, "stream", 1, "temperature", 0.0);
    body = json_dumps(j, JSON_COMPACT);
    json_decref(j);
  }
  char *req = NULL, auth[600] = "";
  if (c->api_key) snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", c->api_key);
  if (!body || asprintf(&req,
                        "POST %s/v1/completions HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: "
                        "application/json\r\n%sContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                        c->u.base_path, c->u.host, c->u.port, auth, strlen(body), body) < 0) {
    free(body);
    snprintf(why, whylen, "out of memory");
    return SK_LOST;
  }
  free(body);
  /* the client's abort: after a delay of up to 300 ms, or at the first token */
  double abort_after = kind == SK_ABORT ? (double)(xorshift(&s) % 300) / 1000.0 : -1;
  int abort_at_token = kind == SK_ABORT && xorshift(&s) % 2;
  enum sk_outcome out = SK_LOST;
  struct tl_buf in = {0};
  int fd = tl_url_connect(&c->u);
  double t_start = cm_time_s();
  if (fd < 0 || tl_write_all(fd, req, strlen(req)) != 0) {
    /* nothing reached the server: the client knows (connection refused) */
    out = SK_REJECTED;
    snprintf(why, whylen, "cannot connect: %s", strerror(errno));
    goto done;
  }
  recv_timeout(fd, kind == SK_ABORT ? 0.05 : c->timeout);
  int status = 0, done_seen = 0, error_seen = 0, tokens = 0;
  size_t scan = 0;
  for (;;) {
    if (kind == SK_ABORT && ((abort_after >= 0 && cm_time_s() - t_start >= abort_after) ||
                             (abort_at_token && tokens > 0))) {
      out = SK_ABORTED;
      goto done;
    }
    long k = tl_buf_read(&in, fd);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (kind == SK_ABORT) continue;
      snprintf(why, whylen, "no answer within %.0f s", c->timeout);
      goto done;
    }
    if (k <= 0) break;
    if (!status) {
      char *end = strstr(in.p, "\r\n\r\n");
      if (!end) continue;
      status = tl_http_status(in.p);
      scan = (size_t)(end + 4 - in.p);
    }
    if (status != 200) continue; /* read the whole error body */
    for (;;) {
      char *nl = memchr(in.p + scan, '\n', in.n - scan);
      if (!nl) break;
      const char *line = in.p + scan;
      if (!strncmp(line, "data: [DONE]", 12))
        done_seen = 1;
      else if (!strncmp(line, "data: ", 6) && strstr(line, "\"error\"") &&
               strstr(line, "\"error\"") < nl)
        error_seen = 1;
      else if (!strncmp(line, "data: ", 6))
        tokens++;
      scan = (size_t)(nl + 1 - in.p);
    }
  }
  if (kind == SK_ABORT) { /* the server finished before the client left */
    out = status == 200 && done_seen ? SK_ABORTED : status >= 400 ? SK_REJECTED : SK_LOST;
  } else if (kind == SK_MALFORMED) {
    const char *b = status ? strstr(in.p, "\r\n\r\n") : NULL;
    if (status >= 400 && status < 500 && b && strstr(b, "\"error\""))
      out = SK_REFUSED;
    else if (status >= 200 && status < 300)
      out = SK_ACCEPTED_BAD;
    else if (status >= 500)
      out = SK_REJECTED; /* an engine restarting answers 503 before it validates */
    if (out != SK_REFUSED) snprintf(why, whylen, "malformed request answered %d", status);
  } else if (status == 200) {
    out = error_seen ? SK_FAILED : done_seen ? SK_OK : SK_LOST;
    if (out == SK_LOST) snprintf(why, whylen, "stream ended without [DONE] or an error event");
  } else if (status >= 400) {
    const char *b = strstr(in.p, "\r\n\r\n");
    out = b && strstr(b, "\"error\"") ? SK_REJECTED : SK_LOST;
    if (out == SK_LOST) snprintf(why, whylen, "HTTP %d without an error object", status);
  } else {
    snprintf(why, whylen, "no status line");
  }
done:
  if (fd >= 0) close(fd);
  free(in.p);
  free(req);
  return out;
}

static void *client(void *arg) {
  struct sk_state *st = arg;
  char why[200];
  for (;;) {
    pthread_mutex_lock(&st->mu);
    int64_t i = st->next < st->n_total && !st->stop ? st->next++ : -1;
    pthread_mutex_unlock(&st->mu);
    if (i < 0) break;
    double wait = st->t0 + st->start_at[i] - cm_time_s();
    if (wait > 0) cm_time_sleep_ns((uint64_t)(wait * 1e9));
    why[0] = 0;
    enum sk_outcome o = run_one(st->c, i, (enum sk_kind)st->kind[i], why, sizeof(why));
    pthread_mutex_lock(&st->mu);
    st->counts[o]++;
    if ((o == SK_LOST || o == SK_ACCEPTED_BAD) && !st->first_lost[0])
      snprintf(st->first_lost, sizeof(st->first_lost), "request %lld: %s", (long long)i, why);
    pthread_mutex_unlock(&st->mu);
  }
  return NULL;
}

/* ---- the processes under serve ------------------------------------------------------- */

/* The processes whose parent is `parent` (one level: serve's roles). */
static int list_children(int parent, struct sk_proc *out, int cap) {
  DIR *d = opendir("/proc");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < cap) {
    int pid = atoi(e->d_name);
    if (pid <= 0) continue;
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t k = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[k] = 0;
    const char *rp = strrchr(buf, ')'); /* after "pid (comm)" */
    int ppid = 0;
    char state = 0;
    if (!rp || sscanf(rp + 1, " %c %d", &state, &ppid) != 2 || ppid != parent || state == 'Z')
      continue;
    struct sk_proc *p = &out[n];
    memset(p, 0, sizeof(*p));
    p->pid = pid;
    snprintf(path, sizeof(path), "/proc/%d/cmdline", pid);
    f = fopen(path, "r");
    if (f) {
      k = fread(buf, 1, sizeof(buf) - 1, f);
      fclose(f);
      buf[k] = 0;
      const char *arg1 = memchr(buf, 0, k) ? buf + strlen(buf) + 1 : "";
      snprintf(p->role, sizeof(p->role), "%s", arg1 < buf + k ? arg1 : "?");
    }
    n++;
  }
  closedir(d);
  return n;
}

static void sample_proc(struct sk_proc *p) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/statm", p->pid);
  FILE *f = fopen(path, "r");
  long size = 0, res = 0;
  if (f) {
    if (fscanf(f, "%ld %ld", &size, &res) != 2) res = 0;
    fclose(f);
  }
  p->rss_kb = res * (sysconf(_SC_PAGESIZE) / 1024);
  snprintf(path, sizeof(path), "/proc/%d/fd", p->pid);
  DIR *d = opendir(path);
  p->fds = 0;
  if (d) {
    struct dirent *e;
    while ((e = readdir(d)))
      if (e->d_name[0] != '.') p->fds++;
    closedir(d);
  }
}

/* Resident kB and descriptors of the long-lived roles (serve itself, frontend,
 * scheduler): *rss summed, fds[0] the frontend's, fds[1] the scheduler's. */
static void sample_long_lived(int serve_pid, long *rss, int fds[2]) {
  struct sk_proc ps[64];
  int n = list_children(serve_pid, ps, 64);
  struct sk_proc self = {.pid = serve_pid};
  sample_proc(&self);
  *rss = self.rss_kb;
  fds[0] = fds[1] = -1;
  for (int i = 0; i < n; i++) {
    int fe = !strcmp(ps[i].role, "frontend"), sc = !strcmp(ps[i].role, "scheduler");
    if (!fe && !sc) continue;
    sample_proc(&ps[i]);
    *rss += ps[i].rss_kb;
    fds[fe ? 0 : 1] = ps[i].fds;
  }
}

static int kill_a_worker(int serve_pid) {
  struct sk_proc ps[64];
  int n = list_children(serve_pid, ps, 64);
  for (int i = 0; i < n; i++)
    if (!strcmp(ps[i].role, "worker")) return kill(ps[i].pid, SIGKILL) == 0 ? ps[i].pid : -1;
  return -1;
}

static double kv_usage(const struct sk_config *c) {
  char *m = tl_http_get(&c->u, "/metrics", c->api_key);
  double v = m && tl_http_status(m) == 200 ? tl_metric_sum(m, "lmserve:kv_cache_usage_perc") : -1;
  free(m);
  return v;
}

/* ---- the run --------------------------------------------------------------------- */

int tl_bench_soak_main(int argc, char **argv) {
  struct sk_config c = {.url = "http://127.0.0.1:8000",
                        .duration = 60,
                        .rate = 2,
                        .abort_rate = 0.05,
                        .malformed_rate = 0.01,
                        .warmup = 10,
                        .timeout = 120,
                        .max_growth_mb = 16,
                        .max_slope_mb_h = 1,
                        .concurrency = 64,
                        .input_len = 32,
                        .output_len = 16};
  const struct cm_opt opts[] = {
      {"url", CM_OPT_STR, &c.url, "URL", "server base URL (http://127.0.0.1:8000)"},
      {"model", CM_OPT_STR, &c.model, "NAME",
       "model name sent in requests (default: the server's)"},
      {"api-key", CM_OPT_STR, &c.api_key, "KEY", "bearer token"},
      {"duration", CM_OPT_DOUBLE, &c.duration, "S", "seconds of traffic (60)", 0, 0, 1, 1e7},
      {"request-rate", CM_OPT_DOUBLE, &c.rate, "R", "requests/s, Poisson (2)", 0, 0, 1e-3, 1e6},
      {"concurrency", CM_OPT_INT, &c.concurrency, "C", "most requests in flight (64)", 1, 4096},
      {"input-len", CM_OPT_INT, &c.input_len, "I", "prompt tokens (32)", 1, 1 << 20},
      {"output-len", CM_OPT_INT, &c.output_len, "O", "output tokens (16)", 1, 1 << 20},
      {"abort-rate", CM_OPT_DOUBLE, &c.abort_rate, "P", "share the client aborts (0.05)", 0, 0, 0,
       1},
      {"malformed-rate", CM_OPT_DOUBLE, &c.malformed_rate, "P", "share that is malformed (0.01)", 0,
       0, 0, 1},
      {"serve-pid", CM_OPT_INT, &c.serve_pid, "PID",
       "`lmserve serve`'s pid: sample its roles' memory and descriptors", 0, INT32_MAX},
      {"kill-worker-every", CM_OPT_DOUBLE, &c.kill_every, "S",
       "SIGKILL a worker of --serve-pid this often (0: never)", 0, 0, 0, 1e7},
      {"warmup", CM_OPT_DOUBLE, &c.warmup, "S", "seconds before memory is followed (10)", 0, 0, 0,
       1e7},
      {"request-timeout", CM_OPT_DOUBLE, &c.timeout, "S",
       "a request unanswered this long is lost (120)", 0, 0, 1, 1e6},
      {"max-rss-growth-mb", CM_OPT_DOUBLE, &c.max_growth_mb, "MB",
       "most the long-lived roles' memory may grow after warm-up (16)", 0, 0, 0, 1e6},
      {"max-rss-slope-mb-h", CM_OPT_DOUBLE, &c.max_slope_mb_h, "MB",
       "most MB/h of memory growth, checked on runs of 10 minutes or more (1)", 0, 0, 0, 1e6},
      {"seed", CM_OPT_INT, &c.seed, "N", "draws (0)", 0, INT64_MAX},
      {0},
  };
  int rc = tl_args_parse("lmserve bench soak",
                         "Long run with aborts, malformed requests and worker kills: nothing lost, "
                         "nothing leaked.",
                         opts, argc, argv);
  if (rc >= 0) return rc;
  if (tl_url_parse(c.url, &c.u)) {
    fprintf(stderr, "lmserve bench soak: --url must look like http://HOST:PORT, got '%s'\n", c.url);
    return 2;
  }
  if (c.kill_every > 0 && !c.serve_pid) {
    fprintf(stderr, "lmserve bench soak: --kill-worker-every needs --serve-pid\n");
    return 2;
  }
  char model_buf[256];
  if (!c.model) {
    if (tl_http_first_model(&c.u, c.api_key, model_buf, sizeof(model_buf))) {
      fprintf(stderr, "lmserve bench soak: no model name from %s/v1/models\n", c.url);
      return 1;
    }
    c.model = model_buf;
  }
  signal(SIGPIPE, SIG_IGN);

  /* the schedule: Poisson arrivals over the duration, each with its kind */
  struct sk_state st = {.c = &c};
  size_t cap = (size_t)(c.rate * c.duration * 1.5 + 64);
  st.start_at = malloc(cap * sizeof(double));
  st.kind = malloc(cap);
  if (!st.start_at || !st.kind) return 1;
  /* a well-mixed start: a small state's first draws are tiny (the first gap huge) */
  uint64_t s = ((uint64_t)c.seed + 1) * 0x9E3779B97F4A7C15ull ^ 0xD1B54A32D192ED03ull;
  for (double t = 0; st.n_total < (int64_t)cap;) {
    double u = ((double)(xorshift(&s) >> 11) + 0.5) / 9007199254740992.0;
    t += -log(u) / c.rate;
    if (t >= c.duration) break;
    double k = ((double)(xorshift(&s) >> 11) + 0.5) / 9007199254740992.0;
    st.start_at[st.n_total] = t;
    st.kind[st.n_total++] = k < c.malformed_rate                  ? SK_MALFORMED
                            : k < c.malformed_rate + c.abort_rate ? SK_ABORT
                                                                  : SK_NORMAL;
  }
  /* baselines, idle, before any traffic (one request first: lazily made state) */
  char why[200];
  run_one(&c, -1, SK_NORMAL, why, sizeof(why));
  cm_time_sleep_ns(500000000ull);
  long rss0 = 0, rss_w = -1;
  int fds0[2] = {-1, -1}, fds1[2] = {-1, -1};
  if (c.serve_pid) sample_long_lived((int)c.serve_pid, &rss0, fds0);
  double kv0 = kv_usage(&c);

  pthread_mutex_init(&st.mu, NULL);
  int nthreads = (int)c.concurrency;
  pthread_t *th = calloc((size_t)nthreads, sizeof(pthread_t));
  if (!th) return 1;
  st.t0 = cm_time_s();
  for (int i = 0; i < nthreads; i++)
    pthread_create(&th[i], NULL, client, &st);
  /* the sampler and the killer run here, once a second */
  double *rs_t = malloc(sizeof(double) * (size_t)(c.duration + 2)),
         *rs_v = malloc(sizeof(double) * (size_t)(c.duration + 2));
  int n_rs = 0, kills = 0;
  double next_kill = c.kill_every > 0 ? c.kill_every : INFINITY;
  for (;;) {
    double now = cm_time_s() - st.t0;
    if (now >= c.duration) break;
    if (now >= next_kill) {
      int pid = kill_a_worker((int)c.serve_pid);
      printf("%7.1f s  killed worker pid %d\n", now, pid);
      fflush(stdout);
      kills += pid > 0;
      next_kill += c.kill_every;
    }
    if (c.serve_pid && now >= c.warmup && rs_t && rs_v && n_rs < (int)(c.duration + 2)) {
      long rss;
      int fds[2];
      sample_long_lived((int)c.serve_pid, &rss, fds);
      if (rss_w < 0) rss_w = rss;
      rs_t[n_rs] = now / 3600.0;
      rs_v[n_rs++] = (double)rss / 1024.0;
    }
    cm_time_sleep_ns(1000000000ull);
  }
  for (int i = 0; i < nthreads; i++)
    pthread_join(th[i], NULL);
  double dur = cm_time_s() - st.t0;

  /* idle again: KV blocks and descriptors back to their baselines */
  double kv1 = -1;
  long rss1 = 0;
  for (int tries = 0; tries < 60; tries++) {
    kv1 = kv_usage(&c);
    if (c.serve_pid) sample_long_lived((int)c.serve_pid, &rss1, fds1);
    if (kv1 <= kv0 + 1e-9 && fds1[0] <= fds0[0] && fds1[1] <= fds0[1]) break;
    cm_time_sleep_ns(500000000ull);
  }
  long sent = st.n_total, sum = 0;
  for (int k = 0; k < SK_N_OUTCOMES; k++)
    sum += st.counts[k];
  double slope = 0;
  if (n_rs >= 2) { /* least squares, MB per hour */
    double mt = 0, mv = 0, sxy = 0, sxx = 0;
    for (int i = 0; i < n_rs; i++)
      mt += rs_t[i], mv += rs_v[i];
    mt /= n_rs, mv /= n_rs;
    for (int i = 0; i < n_rs; i++)
      sxy += (rs_t[i] - mt) * (rs_v[i] - mv), sxx += (rs_t[i] - mt) * (rs_t[i] - mt);
    slope = sxx > 0 ? sxy / sxx : 0;
  }
  double growth = rss_w >= 0 ? (double)(rss1 - rss_w) / 1024.0 : 0;

  printf("================ Soak Result ================\n");
  printf("%-34s %.1f\n", "duration (s):", dur);
  printf("%-34s %ld\n", "requests sent:", sent);
  for (int k = 0; k < SK_N_OUTCOMES; k++)
    printf("  %-32s %ld\n", outcome_names[k], st.counts[k]);
  printf("%-34s %d\n", "workers killed:", kills);
  if (st.first_lost[0]) printf("%-34s %s\n", "first lost:", st.first_lost);
  if (c.serve_pid) {
    printf("%-34s %.1f MB -> %.1f MB after warm-up (%+.2f MB), slope %+.2f MB/h\n",
           "long-lived roles' memory:", (double)rss0 / 1024.0, (double)rss1 / 1024.0, growth,
           slope);
    printf("%-34s frontend %d -> %d, scheduler %d -> %d\n", "file descriptors idle:", fds0[0],
           fds1[0], fds0[1], fds1[1]);
  }
  printf("%-34s %.4f -> %.4f\n", "KV usage idle:", kv0, kv1);
  int bad = 0;
#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      printf("FAILED: " __VA_ARGS__);                                                              \
      printf("\n");                                                                                \
      bad = 1;                                                                                     \
    }                                                                                              \
  } while (0)
  CHECK(sum == sent, "%ld requests sent, %ld accounted for", sent, sum);
  CHECK(st.counts[SK_LOST] == 0, "%ld requests lost", st.counts[SK_LOST]);
  CHECK(st.counts[SK_ACCEPTED_BAD] == 0, "%ld malformed requests accepted",
        st.counts[SK_ACCEPTED_BAD]);
  CHECK(st.counts[SK_OK] > 0, "no request succeeded");
  CHECK(kv0 >= 0 && kv1 >= 0 && kv1 <= kv0 + 1e-9, "KV usage idle %.4f, baseline %.4f", kv1, kv0);
  if (c.serve_pid) {
    CHECK(fds1[0] >= 0 && fds1[0] <= fds0[0], "frontend descriptors %d, baseline %d", fds1[0],
          fds0[0]);
    CHECK(fds1[1] >= 0 && fds1[1] <= fds0[1], "scheduler descriptors %d, baseline %d", fds1[1],
          fds0[1]);
    CHECK(growth <= c.max_growth_mb, "memory grew %.2f MB after warm-up (limit %.2f)", growth,
          c.max_growth_mb);
    if (c.duration >= 600)
      CHECK(slope <= c.max_slope_mb_h, "memory slope %.2f MB/h (limit %.2f)", slope,
            c.max_slope_mb_h);
  }
  if (c.kill_every > 0) CHECK(kills > 0, "no worker was killed");
#undef CHECK
  printf("%s\n", bad ? "SOAK FAILED" : "SOAK PASSED");
  printf("=============================================\n");
  free(th);
  free(rs_t);
  free(rs_v);
  free(st.start_at);
  free(st.kind);
  pthread_mutex_destroy(&st.mu);
  return bad;
}
