/* test-heal.c — roles that die or hang, and an engine that heals: `lmserve serve`
 * with a tiny Gemma 4 on the CPU, and the roles alone (frontend, scheduler,
 * worker), with processes killed under running and waiting requests.
 *
 * What is measured, from the kill (SIGKILL, or SIGSTOP for a hang):
 *   - a running stream gets its error event within 2 s, a running non-streamed
 *     request its 503 within 2 s, and /health answers 503 within 2 s; with the
 *     roles alone (no supervisor to tell anyone) the peers' own connection
 *     monitors make both happen within 1 s although the heartbeat limit is 30 s;
 *   - serve restarts the engine (a worker group whole: every rank of a
 *     tensor-parallel group gets a new process), /health is 200 again and a new
 *     request is served; a request that was waiting (it had produced nothing) is
 *     sent again by the frontend and answered 200 with all its tokens;
 *   - a hung worker (SIGSTOP) is declared dead by its missed heartbeats and
 *     killed by serve within 5 s;
 *   - a checkpoint gone bad makes every restart die at start-up: serve stops
 *     after --max-start-failures tries with an error that says so;
 *   - SIGKILL of serve alone (not its process group) takes every child with it;
 *   - a worker whose scheduler dies ends by itself (status 1). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/harness/th-http.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#define CM_MIN_(a, b) ((a) < (b) ? (a) : (b))

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- a stderr drain: the roles log there, and a full pipe would stall them -- */

struct drain {
  int fd;
  pthread_t th;
  pthread_mutex_t mu;
  char *buf; /* everything read so far, NUL-terminated */
  size_t len, cap;
};

static void *drain_main(void *arg) {
  struct drain *d = arg;
  char chunk[4096];
  for (;;) {
    ssize_t k = read(d->fd, chunk, sizeof(chunk));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    pthread_mutex_lock(&d->mu);
    if (d->len + (size_t)k + 1 > d->cap) {
      size_t cap = (d->len + (size_t)k + 1) * 2;
      char *b = realloc(d->buf, cap);
      if (b) d->buf = b, d->cap = cap;
    }
    if (d->len + (size_t)k + 1 <= d->cap) {
      memcpy(d->buf + d->len, chunk, (size_t)k);
      d->len += (size_t)k;
      d->buf[d->len] = 0;
    }
    pthread_mutex_unlock(&d->mu);
  }
  return NULL;
}

static void drain_start(struct drain *d, int fd) {
  memset(d, 0, sizeof(*d));
  d->fd = fd;
  pthread_mutex_init(&d->mu, NULL);
  TH_REQUIRE(pthread_create(&d->th, NULL, drain_main, d) == 0);
}

/* 1 when the text read so far holds needle. */
static int drain_has(struct drain *d, const char *needle) {
  pthread_mutex_lock(&d->mu);
  int has = d->buf && strstr(d->buf, needle) != NULL;
  pthread_mutex_unlock(&d->mu);
  return has;
}

/* After the process is gone (EOF): joins the thread; prints the log when asked. */
static void drain_end(struct drain *d, int print) {
  pthread_join(d->th, NULL);
  if (print && d->buf) fprintf(stderr, "---- the server's log ----\n%s---- end ----\n", d->buf);
  free(d->buf);
  pthread_mutex_destroy(&d->mu);
}

/* ---- an HTTP exchange read on its own thread, with the time it ended -------- */

struct call {
  int fd;
  pthread_t th;
  pthread_mutex_t mu;
  char buf[1 << 18]; /* the raw answer, NUL-terminated */
  size_t len;
  double t_first; /* now_s() when the first SSE event arrived, 0 = not yet */
  double t_end;   /* now_s() when the server closed the connection, 0 = not yet */
};

static void *call_main(void *arg) {
  struct call *c = arg;
  char chunk[8192];
  for (;;) {
    struct pollfd pf = {c->fd, POLLIN, 0};
    if (poll(&pf, 1, 60000) <= 0) break;
    ssize_t k = read(c->fd, chunk, sizeof(chunk));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    pthread_mutex_lock(&c->mu);
    size_t take = CM_MIN_((size_t)k, sizeof(c->buf) - 1 - c->len);
    memcpy(c->buf + c->len, chunk, take);
    c->len += take;
    c->buf[c->len] = 0;
    if (!c->t_first && strstr(c->buf, "data: {")) c->t_first = now_s();
    pthread_mutex_unlock(&c->mu);
  }
  pthread_mutex_lock(&c->mu);
  c->t_end = now_s();
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

static void call_start(struct call *c, int port, const char *path, const char *body) {
  memset(c, 0, sizeof(*c));
  pthread_mutex_init(&c->mu, NULL);
  c->fd = th_http_post_open(port, path, body);
  TH_REQUIRE(pthread_create(&c->th, NULL, call_main, c) == 0);
}

static double call_get(struct call *c, int first) {
  pthread_mutex_lock(&c->mu);
  double t = first ? c->t_first : c->t_end;
  pthread_mutex_unlock(&c->mu);
  return t;
}

/* Waits up to timeout_ms for the first SSE event (first) or the end: 0 or -1. */
static int call_wait(struct call *c, int first, int timeout_ms) {
  double end = now_s() + timeout_ms / 1000.0;
  while (call_get(c, first) == 0 && now_s() < end)
    sleep_ms(10);
  return call_get(c, first) > 0 ? 0 : -1;
}

/* The HTTP status of the answer, -1 when there is none. */
static int call_status(struct call *c) {
  int st = -1;
  pthread_mutex_lock(&c->mu);
  if (sscanf(c->buf, "HTTP/1.1 %d", &st) != 1) st = -1;
  pthread_mutex_unlock(&c->mu);
  return st;
}

static int call_has(struct call *c, const char *needle) {
  pthread_mutex_lock(&c->mu);
  int has = strstr(c->buf, needle) != NULL;
  pthread_mutex_unlock(&c->mu);
  return has;
}

/* completion_tokens of a non-streamed answer, -1 when absent. */
static long long call_completion_tokens(struct call *c) {
  pthread_mutex_lock(&c->mu);
  const char *u = strstr(c->buf, "\"completion_tokens\":");
  long long n = u ? atoll(u + strlen("\"completion_tokens\":")) : -1;
  pthread_mutex_unlock(&c->mu);
  return n;
}

static void call_end(struct call *c) {
  shutdown(c->fd, SHUT_RDWR);
  pthread_join(c->th, NULL);
  close(c->fd);
  pthread_mutex_destroy(&c->mu);
}

/* ---- processes --------------------------------------------------------------- */

static int health(int port) {
  char *b = NULL;
  int st = th_http(port, "GET", "/health", NULL, 3000, &b);
  free(b);
  return st;
}

/* Polls /health every 20 ms until it answers want: seconds it took, or -1 past limit_s. */
static double health_until(int port, int want, double limit_s) {
  double t0 = now_s();
  while (now_s() - t0 < limit_s) {
    if (health(port) == want) return now_s() - t0;
    sleep_ms(20);
  }
  return -1;
}

/* The pid of serve's child `lmserve ROLE` (a worker: of that --rank), or -1. */
static int child_pid(int serve_pid, const char *role, int rank) {
  char want[64], rank_s[32];
  snprintf(want, sizeof(want), "lmserve %s ", role);
  snprintf(rank_s, sizeof(rank_s), "--rank %d ", rank);
  return th_pid_with(serve_pid, want, rank < 0 ? NULL : rank_s, NULL);
}

/* Waits until pid is no more (reaped by its parent): seconds, or -1 past limit_s. */
static double gone_within(int pid, double limit_s) {
  double t0 = now_s();
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d", pid);
  struct stat st;
  while (now_s() - t0 < limit_s) {
    if (stat(path, &st) != 0) return now_s() - t0;
    sleep_ms(10);
  }
  return -1;
}

/* One tiny model for the whole file. */
static const char *model(void) {
  static char path[300];
  if (!path[0]) th_tiny_gemma4_or_skip("heal", 7, path, sizeof(path));
  return path;
}

struct serve {
  struct th_proc p;
  struct drain log;
  int port;
};

/* `lmserve serve` on the CPU with small pools and the extra flags (NULL-ended). */
static void serve_start(struct serve *s, const char *model_dir, const char *const *extra) {
  s->port = th_free_port();
  TH_REQUIRE(s->port > 0);
  char port_s[16];
  snprintf(port_s, sizeof(port_s), "%d", s->port);
  static char *env[] = {"LMSERVE_DEVICE=cpu", NULL};
  TH_REQUIRE(th_proc_spawnl(&s->p, env, 1, (char *const *)extra, th_lmserve_bin(), "serve",
                            "--model", model_dir, "--port", port_s, "--kv-cache-memory", "16M",
                            "--threads", "1", "--max-num-seqs", "2", "--max-num-batched-tokens",
                            "64", "--drain-timeout", "2", NULL) == 0);
  drain_start(&s->log, s->p.err_fd);
  if (th_proc_wait_output(&s->p, "lmserve: serving", 120000) != 0) {
    th_proc_stop(&s->p, 2000);
    drain_end(&s->log, 1);
    TH_REQUIRE(!"serve printed no URL");
  }
}

/* Stops serve (SIGTERM: it exits 0) and prints its log. */
static void serve_stop(struct serve *s) {
  th_proc_check_exit(&s->p, SIGTERM, 30000);
  th_proc_stop(&s->p, 1000);
  drain_end(&s->log, 1);
}

/* A completion's body: max_tokens tokens whatever the model says. */
static void body_of(char *out, size_t size, int max_tokens, int stream) {
  snprintf(out, size,
           "{\"prompt\":[2,9259,1902],\"max_tokens\":%d,\"ignore_eos\":true,\"temperature\":0%s}",
           max_tokens, stream ? ",\"stream\":true" : "");
}

/* A stream of 4000 tokens started on port and its first event come: the time then. */
static double stream_running(struct call *a, int port) {
  char body[256];
  body_of(body, sizeof(body), 4000, 1);
  call_start(a, port, "/v1/completions", body);
  TH_REQUIRE(call_wait(a, 1, 30000) == 0);
  return now_s();
}

/* `what` killed at t_kill under stream a: the stream's error, saying `says`, within 1 s
 * and /health 503 within 2 s; the call ended. */
static void check_cut(struct call *a, int port, double t_kill, const char *what, const char *says) {
  double t_503 = health_until(port, 503, 2.0);
  TH_CHECK(call_wait(a, 0, 5000) == 0);
  double t_a = call_get(a, 0) - t_kill;
  fprintf(stderr, "%s killed: stream error after %.3f s, /health 503 after %.3f s\n", what, t_a,
          t_503);
  TH_CHECK(t_a > 0 && t_a < 1.0);
  TH_CHECK(t_503 >= 0 && t_503 < 2.0);
  TH_CHECK(call_has(a, says));
  call_end(a);
}

/* A request after the engine came back: 200 with its 5 tokens. */
static void check_serves(int port) {
  char body[256], *b = NULL;
  body_of(body, sizeof(body), 5, 0);
  int st = th_http(port, "POST", "/v1/completions", body, 60000, &b);
  TH_CHECK_EQ_INT(st, 200);
  TH_CHECK(b && strstr(b, "\"completion_tokens\":5") != NULL);
  free(b);
}

/* waiting requests in /metrics (the engine's PONG, every 0.5 s) */
static double metric(int port, const char *name) {
  char *b = NULL;
  double v =
      th_http(port, "GET", "/metrics", NULL, 3000, &b) == 200 ? th_metric(b, name, NULL) : -1;
  free(b);
  return v;
}

/* The kill scenario shared by the worker and the scheduler: stream A and
 * request C running (max-num-seqs 2), B waiting behind them; `victim` killed.
 * A's error event and C's 503 within 2 s, /health 503 within 2 s, then 200 again,
 * B answered in full, a new request served. */
static void kill_under_load(struct serve *s, int victim, const char *what) {
  char body[256];
  struct call a, b, c;
  body_of(body, sizeof(body), 8000, 0);
  call_start(&c, s->port, "/v1/completions", body);
  body_of(body, sizeof(body), 8000, 1);
  call_start(&a, s->port, "/v1/completions", body);
  TH_REQUIRE(call_wait(&a, 1, 30000) == 0);
  body_of(body, sizeof(body), 7, 0);
  call_start(&b, s->port, "/v1/completions", body);
  /* B is queued at the scheduler (and C has produced tokens: it runs beside A) */
  double t_wait = now_s();
  while (metric(s->port, "lmserve:num_requests_waiting") < 1 && now_s() - t_wait < 10)
    sleep_ms(50);
  TH_REQUIRE(metric(s->port, "lmserve:num_requests_waiting") >= 1);
  TH_REQUIRE(call_get(&a, 0) == 0 && call_get(&c, 0) == 0);

  double t_kill = now_s();
  TH_REQUIRE(kill(victim, SIGKILL) == 0);
  double t_503 = health_until(s->port, 503, 2.0);
  if (t_503 < 0) th_fail(__FILE__, __LINE__, "%s: /health not 503 within 2 s", what);
  TH_CHECK(call_wait(&a, 0, 5000) == 0);
  TH_CHECK(call_wait(&c, 0, 5000) == 0);
  double t_a = call_get(&a, 0) - t_kill, t_c = call_get(&c, 0) - t_kill;
  fprintf(stderr,
          "%s killed: /health 503 after %.3f s, stream error after %.3f s, 503 after %.3f s\n",
          what, t_503, t_a, t_c);
  TH_CHECK(t_a > 0 && t_a < 2.0);
  TH_CHECK(t_c > 0 && t_c < 2.0);
  TH_CHECK(call_has(&a, "\"error\""));
  TH_CHECK(call_has(&a, "data: [DONE]"));
  TH_CHECK_EQ_INT(call_status(&c), 503);

  /* the engine comes back; the waiting request is answered in full */
  double t_back = health_until(s->port, 200, 30.0);
  fprintf(stderr, "%s: /health 200 again %.3f s after the kill\n", what, now_s() - t_kill);
  TH_CHECK(t_back >= 0);
  TH_CHECK(call_wait(&b, 0, 30000) == 0);
  TH_CHECK_EQ_INT(call_status(&b), 200);
  TH_CHECK_EQ_INT(call_completion_tokens(&b), 7);
  check_serves(s->port);
  call_end(&a);
  call_end(&b);
  call_end(&c);
}

/* ---- the tests ----------------------------------------------------------------- */

TH_TEST(serve_heals_a_killed_worker) {
  th_proc_init(120);
  struct serve s;
  serve_start(&s, model(), NULL);
  int w = child_pid(s.p.pid, "worker", 0);
  TH_REQUIRE(w > 0);
  kill_under_load(&s, w, "worker");
  int w2 = child_pid(s.p.pid, "worker", 0);
  TH_CHECK(w2 > 0 && w2 != w);
  TH_CHECK(drain_has(&s.log, "restarting the workers"));
  serve_stop(&s);
}

TH_TEST(serve_heals_a_killed_scheduler) {
  th_proc_init(120);
  struct serve s;
  serve_start(&s, model(), NULL);
  int sc = child_pid(s.p.pid, "scheduler", -1), w = child_pid(s.p.pid, "worker", 0);
  TH_REQUIRE(sc > 0 && w > 0);
  kill_under_load(&s, sc, "scheduler");
  /* the scheduler restarted with its workers; the frontend kept running */
  int sc2 = child_pid(s.p.pid, "scheduler", -1), w2 = child_pid(s.p.pid, "worker", 0);
  TH_CHECK(sc2 > 0 && sc2 != sc);
  TH_CHECK(w2 > 0 && w2 != w);
  serve_stop(&s);
}

/* A beam search (use_beam_search) under way when a worker is killed: its beams live
 * in the frontend, so the steps the engine lost wait for it and are sent again, and
 * the answer comes whole (200, both beams' tokens) instead of a 503. */
TH_TEST(serve_beam_search_outlives_a_killed_worker) {
  th_proc_init(120);
  struct serve s;
  serve_start(&s, model(), NULL);
#define BEAM_BODY(last)                                                                            \
  "{\"prompt\":[2,9259," last "],\"max_tokens\":60,\"use_beam_search\":true,\"n\":8,"              \
  "\"ignore_eos\":true}"
  /* how long a search takes once the engine is warm (other prompts: the prefix cache
   * holds none of the last one's) */
  const char *warm[] = {BEAM_BODY("1903"), BEAM_BODY("1904")};
  double t_search = 0;
  for (int i = 0; i < 2; i++) {
    char *b = NULL;
    double t0 = now_s();
    TH_REQUIRE(th_http(s.port, "POST", "/v1/completions", warm[i], 60000, &b) == 200);
    t_search = now_s() - t0;
    free(b);
  }
  int w = child_pid(s.p.pid, "worker", 0);
  TH_REQUIRE(w > 0);
  struct call c;
  call_start(&c, s.port, "/v1/completions", BEAM_BODY("1902"));
  sleep_ms((int)(t_search * 1000 / 4)); /* a quarter of the way */
  if (call_get(&c, 0) != 0) th_fail(__FILE__, __LINE__, "the search ended before the kill");
  double t_kill = now_s();
  TH_REQUIRE(kill(w, SIGKILL) == 0);
  TH_CHECK(call_wait(&c, 0, 60000) == 0);
  fprintf(stderr, "beam search of %.3f s: answered %.3f s after the kill\n", t_search,
          call_get(&c, 0) - t_kill);
  TH_CHECK_EQ_INT(call_status(&c), 200);
  TH_CHECK_EQ_INT((int)call_completion_tokens(&c), 480);
  TH_CHECK(drain_has(&s.log, "sent again"));
  int w2 = child_pid(s.p.pid, "worker", 0);
  TH_CHECK(w2 > 0 && w2 != w);
  call_end(&c);
  serve_stop(&s);
}

TH_TEST(serve_restarts_a_whole_tensor_parallel_group) {
  th_proc_init(120);
  struct serve s;
  const char *extra[] = {"--tensor-parallel-size", "2", NULL};
  serve_start(&s, model(), extra);
  int r0 = child_pid(s.p.pid, "worker", 0), r1 = child_pid(s.p.pid, "worker", 1);
  TH_REQUIRE(r0 > 0 && r1 > 0);
  struct call a;
  double t_kill = stream_running(&a, s.port);
  TH_REQUIRE(kill(r1, SIGKILL) == 0);
  TH_CHECK(call_wait(&a, 0, 5000) == 0);
  TH_CHECK(call_get(&a, 0) - t_kill < 2.0);
  TH_CHECK(call_has(&a, "\"error\""));
  TH_CHECK(health_until(s.port, 503, 2.0) >= 0);
  /* rank 0 is killed by serve and both start again */
  TH_CHECK(gone_within(r0, 5.0) >= 0);
  TH_CHECK(health_until(s.port, 200, 30.0) >= 0);
  int n0 = child_pid(s.p.pid, "worker", 0), n1 = child_pid(s.p.pid, "worker", 1);
  TH_CHECK(n0 > 0 && n0 != r0);
  TH_CHECK(n1 > 0 && n1 != r1);
  check_serves(s.port);
  call_end(&a);
  serve_stop(&s);
}

TH_TEST(serve_kills_a_hung_worker) {
  th_proc_init(120);
  struct serve s;
  serve_start(&s, model(), NULL); /* heartbeats: 1 s, 3 missed */
  int w = child_pid(s.p.pid, "worker", 0);
  TH_REQUIRE(w > 0);
  struct call a;
  double t_stop = stream_running(&a, s.port);
  TH_REQUIRE(kill(w, SIGSTOP) == 0);
  double t_gone = gone_within(w, 5.0);
  fprintf(stderr, "hung worker killed %.3f s after SIGSTOP\n", t_gone);
  TH_CHECK(t_gone >= 0);
  if (t_gone < 0) kill(w, SIGKILL);
  TH_CHECK(call_wait(&a, 0, 5000) == 0);
  TH_CHECK(call_get(&a, 0) - t_stop < 5.0);
  TH_CHECK(call_has(&a, "no heartbeat"));
  TH_CHECK(health_until(s.port, 200, 30.0) >= 0);
  check_serves(s.port);
  call_end(&a);
  serve_stop(&s);
}

TH_TEST(serve_gives_up_on_a_bad_checkpoint) {
  th_proc_init(120);
  char bad[300], path[400];
  th_tiny_gemma4_or_skip("heal-bad", 7, bad, sizeof(bad));
  struct serve s;
  const char *extra[] = {"--max-start-failures", "2", NULL};
  serve_start(&s, bad, extra);
  int w = child_pid(s.p.pid, "worker", 0);
  TH_REQUIRE(w > 0);
  /* the weights go bad under the running server; the next start of a worker fails */
  snprintf(path, sizeof(path), "%s/model.safetensors", bad);
  TH_REQUIRE(truncate(path, 100) == 0);
  double t_kill = now_s();
  TH_REQUIRE(kill(w, SIGKILL) == 0);
  /* back-offs of 0.5 and 1 s, two failed starts: serve ends by itself */
  int waited = th_proc_wait(&s.p, 30000);
  fprintf(stderr, "serve gave up %.3f s after the kill\n", now_s() - t_kill);
  TH_CHECK_EQ_INT(waited, 0);
  TH_CHECK(s.p.exited && WIFEXITED(s.p.status) && WEXITSTATUS(s.p.status) == 1);
  th_proc_stop(&s.p, 1000);
  TH_CHECK_EQ_INT(th_procs_with(bad), 0);
  TH_CHECK(drain_has(&s.log, "the engine failed 2 times in a row before it was ready"));
  TH_CHECK(drain_has(&s.log, "giving up"));
  TH_CHECK(drain_has(&s.log, "model.safetensors")); /* the worker's own reason */
  drain_end(&s.log, 1);
}

TH_TEST(serve_sigkill_takes_every_child) {
  th_proc_init(120);
  struct serve s;
  serve_start(&s, model(), NULL);
  int kids[3] = {child_pid(s.p.pid, "worker", 0), child_pid(s.p.pid, "scheduler", -1),
                 child_pid(s.p.pid, "frontend", -1)};
  for (int i = 0; i < 3; i++)
    TH_REQUIRE(kids[i] > 0);
  /* serve alone, not its process group */
  TH_REQUIRE(kill(s.p.pid, SIGKILL) == 0);
  for (int i = 0; i < 3; i++) {
    double t = gone_within(kids[i], 3.0);
    if (t < 0) th_fail(__FILE__, __LINE__, "child %d outlived serve", kids[i]);
  }
  th_proc_stop(&s.p, 1000);
  drain_end(&s.log, 1);
}

/* The roles alone, as on several hosts: nobody supervises them, the heartbeat limit
 * is 30 s, and still a peer's death is known within a second through the
 * connection monitors (the scheduler's on its workers, the frontend's on the
 * scheduler). */
TH_TEST(roles_alone_see_deaths_at_once) {
  th_proc_init(120);
  char dir[256], fe_ep[320], wk_ep[320], port_s[16];
  TH_REQUIRE(th_tmpdir("heal-roles", dir, sizeof(dir)) == 0);
  snprintf(fe_ep, sizeof(fe_ep), "ipc://%s/fe", dir);
  snprintf(wk_ep, sizeof(wk_ep), "ipc://%s/wk", dir);
  int port = th_free_port();
  TH_REQUIRE(port > 0);
  snprintf(port_s, sizeof(port_s), "%d", port);
  static char *env[] = {"LMSERVE_DEVICE=cpu", NULL};
  struct th_proc sch, wk, fe, wk2, sch2;
  const char *m = model();
  TH_REQUIRE(th_proc_spawnl(&sch, NULL, 0, NULL, th_lmserve_bin(), "scheduler", "--model", m,
                            "--frontend-endpoint", fe_ep, "--worker-endpoint", wk_ep,
                            "--max-num-seqs", "2", "--max-num-batched-tokens", "64",
                            "--heartbeat-limit", "30", NULL) == 0);
  TH_REQUIRE(th_proc_spawnl(&wk, env, 0, NULL, th_lmserve_bin(), "worker", "--model", m,
                            "--scheduler", wk_ep, TH_TINY_WORKER_ARGS, NULL) == 0);
  TH_REQUIRE(th_proc_spawnl(&fe, NULL, 0, NULL, th_lmserve_bin(), "frontend", "--model", m,
                            "--scheduler", fe_ep, "--port", port_s, "--drain-timeout", "2",
                            NULL) == 0);
  TH_REQUIRE(health_until(port, 200, 60.0) >= 0);

  /* a worker dies: the scheduler's monitor fails its rank */
  struct call a;
  double t_kill = stream_running(&a, port);
  th_proc_signal(&wk, SIGKILL);
  check_cut(&a, port, t_kill, "worker", "connection closed");
  th_proc_stop(&wk, 1000);

  /* a new worker: service again */
  TH_REQUIRE(th_proc_spawnl(&wk2, env, 0, NULL, th_lmserve_bin(), "worker", "--model", m,
                            "--scheduler", wk_ep, TH_TINY_WORKER_ARGS, NULL) == 0);
  TH_CHECK(health_until(port, 200, 60.0) >= 0);
  check_serves(port);

  /* the scheduler dies: the frontend's monitor fails the stream (its PONG timeout is 10 s) */
  t_kill = stream_running(&a, port);
  th_proc_signal(&sch, SIGKILL);
  check_cut(&a, port, t_kill, "scheduler", "connection to the scheduler closed");
  /* so does the worker's: it ends, for its supervisor to start it again */
  TH_CHECK_EQ_INT(th_proc_wait(&wk2, 2000), 0);
  TH_CHECK(wk2.exited && WIFEXITED(wk2.status) && WEXITSTATUS(wk2.status) == 1);
  th_proc_stop(&sch, 1000);
  th_proc_stop(&wk2, 1000);

  /* a new scheduler and worker on the same endpoints: the frontend serves again */
  TH_REQUIRE(th_proc_spawnl(&sch2, NULL, 0, NULL, th_lmserve_bin(), "scheduler", "--model", m,
                            "--frontend-endpoint", fe_ep, "--worker-endpoint", wk_ep,
                            "--max-num-seqs", "2", "--max-num-batched-tokens", "64", NULL) == 0);
  TH_REQUIRE(th_proc_spawnl(&wk, env, 0, NULL, th_lmserve_bin(), "worker", "--model", m,
                            "--scheduler", wk_ep, TH_TINY_WORKER_ARGS, NULL) == 0);
  TH_CHECK(health_until(port, 200, 60.0) >= 0);
  check_serves(port);
  th_proc_check_exit(&fe, SIGTERM, 10000);
  th_proc_stop(&fe, 1000);
  th_proc_stop(&sch2, 1000);
  th_proc_stop(&wk, 1000);
}
