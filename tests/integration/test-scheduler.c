/* test-scheduler.c — the `lmserve scheduler` process between a test frontend (DEALER
 * sockets speaking the real protocol) and fake worker ranks (sch-fake-worker, which
 * checks every STEP's positions and block tables against its simulated KV memory and
 * runs the deterministic model of sch-fake-model.h). Outputs must equal the model's
 * sequence exactly; stop conditions, errors, aborts, prefix caching, speculative
 * decoding, worker failure and recovery, garbage on both sockets, two frontends and two
 * ranks are covered. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-time.h"
#include "proto/pr-zmq.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/sch-fake-model.h"

#define MAXR 64

/* ---- processes --------------------------------------------------------------- */

struct env {
  struct th_proc sched;
  struct th_proc workers[4];
  char fe[160], we[160];
  int world;
  void *ctx;
};

static const char *bin(void) {
  const char *b = getenv("LMSERVE_BIN");
  return b ? b : "build/tools/lmserve";
}

static void fake_path(char *out, size_t len) {
  const char *b = getenv("TH_BUILD_DIR");
  snprintf(out, len, "%s/tests/integration/sch-fake-worker", b ? b : "build");
}

static void start_worker(struct env *e, int rank, const char *const *extra) {
  char path[512], ranks[16], worlds[16];
  fake_path(path, sizeof(path));
  snprintf(ranks, sizeof(ranks), "%d", rank);
  snprintf(worlds, sizeof(worlds), "%d", e->world);
  char *argv[32] = {path, "--endpoint", e->we, "--rank", ranks, "--world-size", worlds};
  int n = 7;
  for (int i = 0; extra && extra[i] && n < 30; i++) argv[n++] = (char *)extra[i];
  argv[n] = NULL;
  TH_REQUIRE(th_proc_spawn(&e->workers[rank], argv, NULL, 0) == 0);
}

/* Starts the scheduler (extra flags appended) and `world` fake workers. */
static void env_start(struct env *e, int world, const char *const *sched_extra,
                      const char *const *worker_extra) {
  static int serial;
  memset(e, 0, sizeof(*e));
  e->world = world;
  snprintf(e->fe, sizeof(e->fe), "ipc:///tmp/lmserve-schtest-%d-%d-f.sock", (int)getpid(), serial);
  snprintf(e->we, sizeof(e->we), "ipc:///tmp/lmserve-schtest-%d-%d-w.sock", (int)getpid(), serial);
  serial++;
  char worlds[16];
  snprintf(worlds, sizeof(worlds), "%d", world);
  char *argv[40] = {(char *)bin(), "scheduler", "--model", "/nonexistent-model",
                    "--frontend-endpoint", e->fe, "--worker-endpoint", e->we,
                    "--world-size", worlds, "--max-num-seqs", "16",
                    "--max-num-batched-tokens", "64", "--enable-prefix-caching",
                    "--worker-timeout", "1.5"};
  int n = 17;
  for (int i = 0; sched_extra && sched_extra[i] && n < 38; i++) argv[n++] = (char *)sched_extra[i];
  argv[n] = NULL;
  TH_REQUIRE(th_proc_spawn(&e->sched, argv, NULL, 0) == 0);
  for (int r = 0; r < world; r++) start_worker(e, r, worker_extra);
  e->ctx = zmq_ctx_new();
  TH_REQUIRE(e->ctx != NULL);
}

static void env_stop(struct env *e) {
  th_proc_signal(&e->sched, SIGTERM);
  int rc = th_proc_wait(&e->sched, 5000);
  TH_CHECK_EQ_INT(rc, 0);
  if (rc == 0) {
    TH_CHECK(WIFEXITED(e->sched.status));
    TH_CHECK_EQ_INT(WEXITSTATUS(e->sched.status), 0);
  }
  th_proc_stop(&e->sched, 1000);
  for (int r = 0; r < e->world; r++) {
    if (e->workers[r].pid && !e->workers[r].exited) {
      /* CTRL shutdown from the scheduler ends a fake worker cleanly */
      int wrc = th_proc_wait(&e->workers[r], 3000);
      TH_CHECK_EQ_INT(wrc, 0);
      if (wrc == 0) TH_CHECK(WIFEXITED(e->workers[r].status) && WEXITSTATUS(e->workers[r].status) == 0);
    }
    th_proc_stop(&e->workers[r], 500);
  }
  zmq_ctx_term(e->ctx);
}

/* ---- a test frontend ------------------------------------------------------------ */

struct treq {
  uint64_t id;
  uint32_t prompt[SCH_FAKE_MAXLEN];
  uint32_t plen, max_tokens;
  int64_t stop_id; /* -1 = none */
  bool ignore_eos;
  int32_t logprobs;
  uint32_t out[SCH_FAKE_MAXLEN];
  uint32_t nout, nlogprobs, n_cached;
  int finish, nouts;
  int64_t stop_token;
  int err_code;
  char err[256];
  bool done;
};

struct client {
  struct pr_sock *s;
  struct cm_arena a;
  struct treq *reqs;
  int nreqs;
  struct pr_pong pong;
  uint64_t nonce;
  int errs_unmatched; /* ERRs with request id 0 or unknown */
};

static void client_open(struct env *e, struct client *c, struct treq *reqs, int n) {
  memset(c, 0, sizeof(*c));
  TH_REQUIRE(pr_sock_open(e->ctx, ZMQ_DEALER, 0, &c->s) == 0);
  TH_REQUIRE(pr_sock_connect(c->s, e->fe) == 0);
  cm_arena_init(&c->a, 1 << 16, 64u << 20);
  c->reqs = reqs;
  c->nreqs = n;
}

static void client_close(struct client *c) {
  pr_sock_close(c->s);
  cm_arena_free(&c->a);
}

static struct treq *find_req(struct client *c, uint64_t id) {
  for (int i = 0; i < c->nreqs; i++)
    if (c->reqs[i].id == id) return &c->reqs[i];
  return NULL;
}

/* Handles one message; returns its type, or 0 when none came within timeout_ms. */
static int pump(struct client *c, int timeout_ms) {
  zmq_pollitem_t it = {pr_sock_zmq(c->s), 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&it, 1, timeout_ms) <= 0) return 0;
  struct pr_msg m;
  cm_arena_reset(&c->a);
  int rc = pr_sock_recv(c->s, NULL, &m, &c->a, PR_DONTWAIT);
  if (rc == CM_ERR_AGAIN) return 0;
  TH_REQUIRE(rc == 0);
  if (m.type == PR_OUT) {
    for (uint32_t i = 0; i < m.u.out.n_seqs; i++) {
      const struct pr_out_seq *o = &m.u.out.seqs[i];
      struct treq *r = find_req(c, o->request_id);
      TH_REQUIRE(r != NULL);
      TH_CHECK(!r->done);
      TH_REQUIRE(r->nout + o->tokens.n <= SCH_FAKE_MAXLEN);
      memcpy(r->out + r->nout, o->tokens.v, o->tokens.n * sizeof(uint32_t));
      r->nout += o->tokens.n;
      r->nlogprobs += o->logprobs.sampled.n;
      for (uint32_t j = 0; j < o->logprobs.sampled.n; j++)
        TH_CHECK(o->logprobs.sampled.v[j] == -(float)(o->tokens.v[j] % 10) / 10.0f);
      r->n_cached = o->n_cached_tokens;
      TH_CHECK_EQ_INT(o->n_prompt_tokens, r->plen);
      TH_CHECK(o->queued_ns > 0 && o->scheduled_ns >= o->queued_ns);
      r->nouts++;
      if (o->finish != PR_FINISH_NONE) {
        r->finish = o->finish;
        r->stop_token = o->stop_token;
        r->done = true;
      }
    }
  } else if (m.type == PR_ERR) {
    struct treq *r = m.u.err.request_id ? find_req(c, m.u.err.request_id) : NULL;
    if (r && !r->done) {
      r->err_code = m.u.err.code;
      snprintf(r->err, sizeof(r->err), "%s", m.u.err.message);
      r->done = true;
    } else {
      c->errs_unmatched++;
    }
  } else if (m.type == PR_PONG) {
    c->pong = m.u.pong;
  }
  return m.type;
}

static void send_msg(struct client *c, const struct pr_msg *m) {
  TH_REQUIRE(pr_sock_send(c->s, NULL, m, 0) == 0);
}

static void ping(struct client *c) {
  struct pr_msg m;
  pr_msg_init(&m, PR_PING);
  m.u.ping.nonce = ++c->nonce;
  m.u.ping.send_ns = cm_time_wall_ns();
  send_msg(c, &m);
  uint64_t end = cm_time_ns() + 5000000000ull;
  while (cm_time_ns() < end) {
    if (pump(c, 100) == PR_PONG && c->pong.nonce == c->nonce) return;
  }
  TH_REQUIRE(!"no PONG within 5 s");
}

/* PINGs until `cond` holds on the PONG or timeout_ms passes. */
#define PING_UNTIL(c, cond, timeout_ms)                                                            \
  do {                                                                                             \
    uint64_t end_ = cm_time_ns() + (uint64_t)(timeout_ms) * 1000000ull;                            \
    for (;;) {                                                                                     \
      ping(c);                                                                                     \
      if (cond) break;                                                                             \
      if (cm_time_ns() > end_) {                                                                   \
        th_fail(__FILE__, __LINE__, "timed out waiting for %s", #cond);                            \
        th_stop();                                                                                 \
      }                                                                                            \
      cm_time_sleep_ns(20000000);                                                                  \
    }                                                                                              \
  } while (0)

static void send_add(struct client *c, struct treq *r) {
  struct pr_msg m;
  pr_msg_init(&m, PR_ADD);
  m.u.add.request_id = r->id;
  m.u.add.prompt = (struct pr_u32s){r->prompt, r->plen};
  m.u.add.max_tokens = r->max_tokens;
  m.u.add.sampling.ignore_eos = r->ignore_eos;
  m.u.add.sampling.logprobs = r->logprobs;
  uint32_t stop = (uint32_t)r->stop_id;
  if (r->stop_id >= 0) m.u.add.stop_token_ids = (struct pr_u32s){&stop, 1};
  m.u.add.arrival_ns = cm_time_wall_ns();
  send_msg(c, &m);
}

static void wait_done(struct client *c, int timeout_ms) {
  uint64_t end = cm_time_ns() + (uint64_t)timeout_ms * 1000000ull;
  for (;;) {
    int all = 1;
    for (int i = 0; i < c->nreqs; i++) all &= c->reqs[i].done || c->reqs[i].id == 0;
    if (all) return;
    if (cm_time_ns() > end) {
      th_fail(__FILE__, __LINE__, "requests not done within %d ms", timeout_ms);
      th_stop();
    }
    pump(c, 100);
  }
}

static uint64_t rng_state = 12345;
static uint32_t rnd(uint32_t n) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng_state >> 33) % n;
}

static void make_req(struct treq *r, uint64_t id, uint32_t plen, uint32_t max_tokens) {
  memset(r, 0, sizeof(*r));
  r->id = id;
  r->plen = plen;
  r->max_tokens = max_tokens;
  r->stop_id = -1;
  r->logprobs = -1;
  for (uint32_t i = 0; i < plen; i++) r->prompt[i] = 2 + rnd(SCH_FAKE_VOCAB - 2);
}

/* What the model generates for r, and how it finishes. */
static uint32_t expected(const struct treq *r, uint32_t *out, int *finish) {
  uint32_t hist[SCH_FAKE_MAXLEN + 1];
  memcpy(hist, r->prompt, r->plen * sizeof(uint32_t));
  uint32_t len = r->plen, n = 0;
  *finish = PR_FINISH_LENGTH;
  while (n < r->max_tokens && len < SCH_FAKE_MAXLEN) {
    uint32_t t = sch_fake_next(hist, len);
    hist[len++] = t;
    out[n++] = t;
    if ((!r->ignore_eos && t == SCH_FAKE_EOS) || (r->stop_id >= 0 && t == (uint32_t)r->stop_id)) {
      *finish = PR_FINISH_STOP;
      break;
    }
  }
  return n;
}

static void check_req(const struct treq *r) {
  uint32_t exp[SCH_FAKE_MAXLEN];
  int fin;
  uint32_t n = expected(r, exp, &fin);
  if (r->err_code) th_fail(__FILE__, __LINE__, "request %llu: ERR %d %s", (unsigned long long)r->id, r->err_code, r->err);
  TH_CHECK(r->done);
  TH_CHECK_EQ_INT(r->nout, n);
  TH_CHECK_EQ_INT(r->finish, fin);
  TH_CHECK(memcmp(r->out, exp, CM_MIN(n, r->nout) * sizeof(uint32_t)) == 0);
  if (fin == PR_FINISH_STOP) TH_CHECK_EQ_INT(r->stop_token, exp[n - 1]);
  else TH_CHECK_EQ_INT(r->stop_token, -1);
}

/* ---- tests --------------------------------------------------------------------- */

static struct treq g_reqs[MAXR], g_reqs2[MAXR];

TH_TEST(sched_single_request) {
  th_proc_init(30);
  struct env e;
  env_start(&e, 1, NULL, NULL);
  struct client c;
  client_open(&e, &c, g_reqs, 1);
  PING_UNTIL(&c, c.pong.workers_ready == 1, 10000);
  TH_CHECK_EQ_INT(c.pong.world_size, 1);
  TH_CHECK_EQ_INT(c.pong.max_model_len, SCH_FAKE_MAXLEN);
  make_req(&g_reqs[0], 7, 37, 50);
  g_reqs[0].ignore_eos = true;
  g_reqs[0].logprobs = 0;
  send_add(&c, &g_reqs[0]);
  wait_done(&c, 10000);
  check_req(&g_reqs[0]);
  TH_CHECK_EQ_INT(g_reqs[0].nlogprobs, 50);
  TH_CHECK(g_reqs[0].nouts > 1); /* streamed step by step */
  ping(&c);
  TH_CHECK_EQ_INT(c.pong.num_running, 0);
  TH_CHECK_EQ_INT(c.pong.num_waiting, 0);
  TH_CHECK(c.pong.kv_usage == 0);
  TH_CHECK_EQ_INT(c.pong.prompt_tokens, 37);
  TH_CHECK_EQ_INT(c.pong.generation_tokens, 50);
  client_close(&c);
  env_stop(&e);
}

TH_TEST(sched_concurrent_requests) {
  th_proc_init(30);
  struct env e;
  env_start(&e, 1, NULL, NULL);
  struct client c;
  client_open(&e, &c, g_reqs, 32);
  PING_UNTIL(&c, c.pong.workers_ready == 1, 10000);
  for (int i = 0; i < 32; i++) {
    /* long prompts are chunked over steps (64 tokens per step) */
    make_req(&g_reqs[i], 100 + (uint64_t)i, 1 + rnd(150), 1 + rnd(60));
    g_reqs[i].ignore_eos = i % 2;
    send_add(&c, &g_reqs[i]);
  }
  wait_done(&c, 20000);
  for (int i = 0; i < 32; i++) check_req(&g_reqs[i]);
  ping(&c);
  TH_CHECK_EQ_INT(c.pong.num_running, 0);
  TH_CHECK(c.pong.kv_usage == 0);
  client_close(&c);
  env_stop(&e);
}

TH_TEST(sched_stop_conditions) {
  th_proc_init(30);
  struct env e;
  env_start(&e, 1, NULL, NULL);
  struct client c;
  client_open(&e, &c, g_reqs, 4);
  PING_UNTIL(&c, c.pong.workers_ready == 1, 10000);
  uint32_t exp[SCH_FAKE_MAXLEN];
  int fin;
  /* a stop id: the 6th token the model makes */
  make_req(&g_reqs[0], 1, 20, 100);
  g_reqs[0].ignore_eos = true;
  expected(&g_reqs[0], exp, &fin);
  g_reqs[0].stop_id = exp[5];
  /* max_tokens */
  make_req(&g_reqs[1], 2, 5, 3);
  g_reqs[1].ignore_eos = true;
  /* eos: find a prompt whose continuation reaches token SCH_FAKE_EOS */
  for (int tries = 0;; tries++) {
    TH_REQUIRE(tries < 10000);
    make_req(&g_reqs[2], 3, 10, 300);
    uint32_t n = expected(&g_reqs[2], exp, &fin);
    if (fin == PR_FINISH_STOP && exp[n - 1] == SCH_FAKE_EOS) break;
  }
  /* the same prompt with ignore_eos runs to max_tokens */
  g_reqs[3] = g_reqs[2];
  g_reqs[3].id = 4;
  g_reqs[3].ignore_eos = true;
  for (int i = 0; i < 4; i++) send_add(&c, &g_reqs[i]);
  wait_done(&c, 10000);
  for (int i = 0; i < 4; i++) check_req(&g_reqs[i]);
  TH_CHECK_EQ_INT(g_reqs[0].finish, PR_FINISH_STOP);
  TH_CHECK_EQ_INT(g_reqs[0].nout, 6);
  TH_CHECK_EQ_INT(g_reqs[1].finish, PR_FINISH_LENGTH);
  TH_CHECK_EQ_INT(g_reqs[2].finish, PR_FINISH_STOP);
  TH_CHECK_EQ_INT(g_reqs[2].stop_token, SCH_FAKE_EOS);
  TH_CHECK_EQ_INT(g_reqs[3].finish, PR_FINISH_LENGTH);
  TH_CHECK_EQ_INT(g_reqs[3].nout, 300);
  client_close(&c);
  env_stop(&e);
}

TH_TEST(sched_rejections) {
  th_proc_init(30);
  struct env e;
  env_start(&e, 1, NULL, NULL);
  struct client c;
  client_open(&e, &c, g_reqs, 4);
  PING_UNTIL(&c, c.pong.workers_ready == 1, 10000);
  make_req(&g_reqs[0], 1, 500, 100); /* longer than max_model_len 512 */
  make_req(&g_reqs[1], 2, 10, 10);
  g_reqs[1].prompt[3] = SCH_FAKE_VOCAB + 5; /* outside the vocabulary */
  make_req(&g_reqs[2], 3, 10, 200);          /* live, then added again */
  g_reqs[2].ignore_eos = true;
  for (int i = 0; i < 3; i++) send_add(&c, &g_reqs[i]);
  send_add(&c, &g_reqs[2]);
  wait_done(&c, 10000);
  TH_CHECK_EQ_INT(g_reqs[0].err_code, CM_ERR_TOOBIG);
  TH_CHECK(strstr(g_reqs[0].err, "512") != NULL || strlen(g_reqs[0].err) > 0);
  TH_CHECK_EQ_INT(g_reqs[1].err_code, CM_ERR_INVAL);
  /* the duplicate got ERR, the first one ran to its end */
  TH_CHECK_EQ_INT(g_reqs[2].err_code, CM_ERR_INVAL);
  TH_CHECK(strstr(g_reqs[2].err, "already live") != NULL);
  g_reqs[2].err_code = 0;
  g_reqs[2].done = false;
  g_reqs[2].nout = 0;
  /* tokens may have arrived before the ERR was matched: just drain to the end */
  wait_done(&c, 10000);
  ping(&c);
  TH_CHECK_EQ_INT(c.pong.num_running, 0);
  client_close(&c);
  env_stop(&e);
}

TH_TEST(sched_abort_frees_everything) {
  th_proc_init(30);
  struct env e;
  const char *wx[] = {"--slow-ms", "3", NULL};
  env_start(&e, 1, NULL, wx);
  struct client c;
  client_open(&e, &c, g_reqs, 4);
  PING_UNTIL(&c, c.pong.workers_ready == 1, 10000);
  for (int i = 0; i < 4; i++) {
    make_req(&g_reqs[i], 10 + (uint64_t)i, 40, 400);
    g_reqs[i].ignore_eos = true;
    send_add(&c, &g_reqs[i]);
  }
  /* wait until every request has produced tokens, then abort them all */
  uint64_t end = cm_time_ns() + 10000000000ull;
  for (;;) {
    int started = 0;
    for (int i = 0; i < 4; i++) started += g_reqs[i].nout > 0;
    if (started == 4) break;
    TH_REQUIRE(cm_time_ns() < end);
    pump(&c, 100);
  }
  ping(&c);
  TH_CHECK_EQ_INT(c.pong.num_running, 4);
  TH_CHECK(c.pong.kv_usage > 0);
  struct pr_msg m;
  pr_msg_init(&m, PR_ABORT);
  uint64_t ids[4] = {10, 11, 12, 13};
  m.u.abort.request_ids = (struct pr_u64s){ids, 4};
  send_msg(&c, &m);
  PING_UNTIL(&c, c.pong.num_running == 0 && c.pong.kv_usage == 0, 5000);
  TH_CHECK_EQ_INT(c.pong.num_waiting, 0);
  for (int i = 0; i < 4; i++) TH_CHECK(!g_reqs[i].done && g_reqs[i].nout < 400);
  /* the scheduler still serves: a new request completes */
  make_req(&g_reqs[0], 20, 8, 5);
  g_reqs[0].ignore_eos = true;
  c.nreqs = 1;
  send_add(&c, &g_reqs[0]);
  wait_done(&c, 10000);
  check_req(&g_reqs[0]);
  client_close(&c);
  env_stop(&e);
}

TH_TEST(sched_prefix_cache_hits) {
  th_proc_init(30);
  struct env e;
  env_start(&e, 1, NULL, NULL);
  struct client c;
  client_open(&e, &c, g_reqs, 2);
  PING_UNTIL(&c, c.pong.workers_ready == 1, 10000);
  make_req(&g_reqs[0], 1, 100, 10);
  g_reqs[0].ignore_eos = true;
  send_add(&c, &g_reqs[0]);
  c.nreqs = 1;
  wait_done(&c, 10000);
  check_req(&g_reqs[0]);
  ping(&c);
  uint64_t hits0 = c.pong.prefix_cache_hits;
  g_reqs[1] = g_reqs[0];
  g_reqs[1].id = 2;
  g_reqs[1].done = false;
  g_reqs[1].nout = 0;
  c.nreqs = 2;
  send_add(&c, &g_reqs[1]);
  wait_done(&c, 10000);
  check_req(&g_reqs[1]);
  TH_CHECK(g_reqs[1].n_cached >= 64); /* whole 16-token blocks of the 100-token prompt */
  ping(&c);
  TH_CHECK(c.pong.prefix_cache_hits >= hits0 + 64);
  TH_CHECK(c.pong.prefix_cache_queries >= 200);
  client_close(&c);
  env_stop(&e);
}

TH_TEST(sched_speculative_decoding) {
  th_proc_init(30);
  struct env e;
  const char *sx[] = {"--num-speculative-tokens", "3", NULL};
  const char *wx[] = {"--max-draft", "3", NULL};
  env_start(&e, 1, sx, wx);
  struct client c;
  client_open(&e, &c, g_reqs, 8);
  PING_UNTIL(&c, c.pong.workers_ready == 1, 10000);
  for (int i = 0; i < 8; i++) {
    make_req(&g_reqs[i], 1 + (uint64_t)i, 1 + rnd(80), 20 + rnd(80));
    g_reqs[i].ignore_eos = i % 2;
    g_reqs[i].logprobs = 0;
    send_add(&c, &g_reqs[i]);
  }
  wait_done(&c, 20000);
  for (int i = 0; i < 8; i++) {
    check_req(&g_reqs[i]);
    TH_CHECK_EQ_INT(g_reqs[i].nlogprobs, g_reqs[i].nout);
  }
  ping(&c);
  TH_CHECK(c.pong.spec_num_drafts > 0);
  TH_CHECK(c.pong.spec_num_accepted_tokens > 0);
  TH_CHECK(c.pong.spec_num_accepted_tokens < c.pong.spec_num_draft_tokens);
  TH_CHECK(c.pong.kv_usage == 0);
  client_close(&c);
  env_stop(&e);
}

TH_TEST(sched_worker_death_and_recovery) {
  th_proc_init(30);
  struct env e;
  const char *wx[] = {"--slow-ms", "3", NULL};
  env_start(&e, 1, NULL, wx);
  struct client c;
  client_open(&e, &c, g_reqs, 3);
  PING_UNTIL(&c, c.pong.workers_ready == 1, 10000);
  for (int i = 0; i < 3; i++) {
    make_req(&g_reqs[i], 1 + (uint64_t)i, 30, 400);
    g_reqs[i].ignore_eos = true;
    send_add(&c, &g_reqs[i]);
  }
  while (g_reqs[0].nout == 0) pump(&c, 100);
  th_proc_signal(&e.workers[0], SIGKILL);
  th_proc_stop(&e.workers[0], 100);
  wait_done(&c, 10000); /* the 1.5 s heartbeat timeout fails them */
  for (int i = 0; i < 3; i++) {
    TH_CHECK(g_reqs[i].err_code < 0);
    TH_CHECK(strstr(g_reqs[i].err, "worker rank 0 failed") != NULL);
  }
  ping(&c);
  TH_CHECK_EQ_INT(c.pong.workers_ready, 0);
  TH_CHECK_EQ_INT(c.pong.world_size, 1);
  TH_CHECK_EQ_INT(c.pong.num_running, 0);
  /* no service meanwhile: an ADD gets ERR at once */
  make_req(&g_reqs[0], 50, 5, 5);
  c.nreqs = 1;
  send_add(&c, &g_reqs[0]);
  wait_done(&c, 5000);
  TH_CHECK_EQ_INT(g_reqs[0].err_code, CM_ERR_AGAIN);
  /* a new worker restores service */
  start_worker(&e, 0, NULL);
  PING_UNTIL(&c, c.pong.workers_ready == 1, 10000);
  make_req(&g_reqs[0], 51, 30, 20);
  g_reqs[0].ignore_eos = true;
  send_add(&c, &g_reqs[0]);
  wait_done(&c, 10000);
  check_req(&g_reqs[0]);
  client_close(&c);
  env_stop(&e);
}

TH_TEST(sched_worker_fail_message) {
  th_proc_init(30);
  struct env e;
  const char *wx[] = {"--fail-at-step", "5", NULL};
  env_start(&e, 1, NULL, wx);
  struct client c;
  client_open(&e, &c, g_reqs, 2);
  PING_UNTIL(&c, c.pong.workers_ready == 1, 10000);
  make_req(&g_reqs[0], 1, 10, 100);
  g_reqs[0].ignore_eos = true;
  send_add(&c, &g_reqs[0]);
  wait_done(&c, 10000);
  TH_CHECK_EQ_INT(g_reqs[0].err_code, CM_ERR_STATE);
  TH_CHECK(strstr(g_reqs[0].err, "worker rank 0 failed: injected failure") != NULL);
  ping(&c);
  TH_CHECK_EQ_INT(c.pong.workers_ready, 0);
  client_close(&c);
  env_stop(&e);
}

/* Raw frames on a socket, bypassing the codec. */
static void send_raw(void *zs, const void *a, size_t na, const void *b, size_t nb) {
  zmq_send(zs, a, na, b ? ZMQ_SNDMORE : 0);
  if (b) zmq_send(zs, b, nb, 0);
}

TH_TEST(sched_garbage_on_both_sockets) {
  th_proc_init(30);
  struct env e;
  env_start(&e, 1, NULL, NULL);
  struct client c;
  client_open(&e, &c, g_reqs, 1);
  PING_UNTIL(&c, c.pong.workers_ready == 1, 10000);
  struct pr_sock *gf, *gw;
  TH_REQUIRE(pr_sock_open(e.ctx, ZMQ_DEALER, 0, &gf) == 0);
  TH_REQUIRE(pr_sock_open(e.ctx, ZMQ_DEALER, 0, &gw) == 0);
  TH_REQUIRE(pr_sock_connect(gf, e.fe) == 0);
  TH_REQUIRE(pr_sock_connect(gw, e.we) == 0);
  uint8_t hdr_add[2] = {PR_ADD, PR_VERSION}, hdr_bad[2] = {200, PR_VERSION};
  uint8_t hdr_old[2] = {PR_PING, 99}, hdr_step[2] = {PR_STEP, PR_VERSION};
  uint8_t hdr_res[2] = {PR_RESULT, PR_VERSION}, hdr_ready[2] = {PR_READY, PR_VERSION};
  uint8_t bomb[] = {0xdd, 0xff, 0xff, 0xff, 0xff}, junk[64];
  for (int i = 0; i < 64; i++) junk[i] = (uint8_t)rnd(256);
  void *sockets[2] = {pr_sock_zmq(gf), pr_sock_zmq(gw)};
  for (int k = 0; k < 2; k++) {
    void *z = sockets[k];
    send_raw(z, junk, sizeof(junk), NULL, 0);
    send_raw(z, hdr_add, 2, bomb, sizeof(bomb));
    send_raw(z, hdr_bad, 2, junk, sizeof(junk));
    send_raw(z, hdr_old, 2, junk, 3);
    send_raw(z, hdr_step, 2, junk, sizeof(junk));
    send_raw(z, hdr_res, 2, bomb, sizeof(bomb));
    send_raw(z, hdr_ready, 2, junk, sizeof(junk));
    zmq_send(z, hdr_add, 2, ZMQ_SNDMORE);
    zmq_send(z, junk, 4, ZMQ_SNDMORE);
    zmq_send(z, junk, 4, 0);
  }
  /* well-formed messages in the wrong direction or from strangers */
  struct pr_msg m;
  pr_msg_init(&m, PR_STEP);
  TH_CHECK(pr_sock_send(gf, NULL, &m, 0) == 0);
  pr_msg_init(&m, PR_RESULT);
  m.u.result.step_id = 1;
  TH_CHECK(pr_sock_send(gw, NULL, &m, 0) == 0);
  pr_msg_init(&m, PR_ADD);
  uint32_t p = 5;
  m.u.add.request_id = 1;
  m.u.add.prompt = (struct pr_u32s){&p, 1};
  m.u.add.max_tokens = 1;
  TH_CHECK(pr_sock_send(gw, NULL, &m, 0) == 0);
  /* a READY that disagrees with the world size */
  struct pr_kv_group g = {16, 1, 64, 0};
  pr_msg_init(&m, PR_READY);
  m.u.ready = (struct pr_ready){0, 3, 10, &g, 1, 10, 100, {NULL, 0}, 0};
  TH_CHECK(pr_sock_send(gw, NULL, &m, 0) == 0);
  /* the frontend that sent garbage gets ERRs with request id 0 */
  int errs = 0;
  uint64_t end = cm_time_ns() + 3000000000ull;
  cm_time_sleep_ns(200000000);
  struct cm_arena a;
  cm_arena_init(&a, 1 << 16, 1 << 24);
  while (cm_time_ns() < end && errs < 3) {
    zmq_pollitem_t it = {pr_sock_zmq(gf), 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 100) <= 0) continue;
    cm_arena_reset(&a);
    if (pr_sock_recv(gf, NULL, &m, &a, PR_DONTWAIT) == 0 && m.type == PR_ERR) {
      TH_CHECK_EQ_INT(m.u.err.request_id, 0);
      errs++;
    }
  }
  TH_CHECK(errs >= 3);
  cm_arena_free(&a);
  pr_sock_close(gf);
  pr_sock_close(gw);
  /* still alive and serving */
  PING_UNTIL(&c, c.pong.workers_ready == 1, 5000);
  make_req(&g_reqs[0], 9, 12, 15);
  g_reqs[0].ignore_eos = true;
  send_add(&c, &g_reqs[0]);
  wait_done(&c, 10000);
  check_req(&g_reqs[0]);
  client_close(&c);
  env_stop(&e);
}

TH_TEST(sched_two_frontends_two_ranks) {
  th_proc_init(30);
  struct env e;
  env_start(&e, 2, NULL, NULL);
  struct client c1, c2;
  client_open(&e, &c1, g_reqs, 12);
  client_open(&e, &c2, g_reqs2, 12);
  PING_UNTIL(&c1, c1.pong.workers_ready == 2, 10000);
  TH_CHECK_EQ_INT(c1.pong.world_size, 2);
  /* the same request ids on both frontends are different requests */
  for (int i = 0; i < 12; i++) {
    make_req(&g_reqs[i], 1 + (uint64_t)i, 1 + rnd(90), 1 + rnd(40));
    make_req(&g_reqs2[i], 1 + (uint64_t)i, 1 + rnd(90), 1 + rnd(40));
    g_reqs[i].ignore_eos = g_reqs2[i].ignore_eos = true;
    send_add(&c1, &g_reqs[i]);
    send_add(&c2, &g_reqs2[i]);
  }
  uint64_t end = cm_time_ns() + 20000000000ull;
  for (;;) {
    int done = 0;
    for (int i = 0; i < 12; i++) done += g_reqs[i].done + g_reqs2[i].done;
    if (done == 24) break;
    TH_REQUIRE(cm_time_ns() < end);
    pump(&c1, 10);
    pump(&c2, 10);
  }
  for (int i = 0; i < 12; i++) {
    check_req(&g_reqs[i]);
    check_req(&g_reqs2[i]);
  }
  TH_CHECK_EQ_INT(c1.errs_unmatched + c2.errs_unmatched, 0);
  client_close(&c1);
  client_close(&c2);
  env_stop(&e);
}

static struct treq g_many[256];

/* A full batch: 256 requests running at once over a large pool (and the scheduler's
 * per-step cost, which it logs at exit). */
TH_TEST(sched_batch_256) {
  th_proc_init(60);
  struct env e;
  const char *sx[] = {"--max-num-seqs", "256", "--max-num-batched-tokens", "4096", NULL};
  const char *wx[] = {"--blocks", "8192", NULL};
  env_start(&e, 1, sx, wx);
  struct client c;
  client_open(&e, &c, g_many, 256);
  PING_UNTIL(&c, c.pong.workers_ready == 1, 10000);
  for (int i = 0; i < 256; i++) {
    make_req(&g_many[i], 1 + (uint64_t)i, 16 + rnd(100), 100);
    g_many[i].ignore_eos = true;
    send_add(&c, &g_many[i]);
  }
  wait_done(&c, 40000);
  for (int i = 0; i < 256; i++) check_req(&g_many[i]);
  ping(&c);
  TH_CHECK_EQ_INT(c.pong.generation_tokens, 256 * 100);
  TH_CHECK(c.pong.kv_usage == 0);
  client_close(&c);
  env_stop(&e);
}
