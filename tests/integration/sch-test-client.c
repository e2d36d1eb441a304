/* sch-test-client.c — helpers of the scheduler's integration tests (see
 * sch-test-client.h). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-time.h"
#include "tests/harness/th.h"
#include "tests/integration/sch-test-client.h"

/* ---- processes --------------------------------------------------------------- */

static void fake_path(char *out, size_t len) {
  const char *b = getenv("TH_BUILD_DIR");
  snprintf(out, len, "%s/tests/integration/sch-fake-worker", b ? b : "build");
}

void start_worker(struct env *e, int rank, const char *const *extra) {
  char path[512], ranks[16], worlds[16];
  fake_path(path, sizeof(path));
  snprintf(ranks, sizeof(ranks), "%d", rank);
  snprintf(worlds, sizeof(worlds), "%d", e->world);
  TH_REQUIRE(th_proc_spawnl(&e->workers[rank], NULL, 0, (char *const *)extra, path, "--endpoint",
                            e->we, "--rank", ranks, "--world-size", worlds, NULL) == 0);
}

/* Starts the scheduler (extra flags appended) and `world` fake workers. */
void env_start(struct env *e, int world, const char *const *sched_extra,
               const char *const *worker_extra) {
  static int serial;
  memset(e, 0, sizeof(*e));
  e->world = world;
  snprintf(e->fe, sizeof(e->fe), "ipc:///tmp/lmserve-schtest-%d-%d-f.sock", (int)getpid(), serial);
  snprintf(e->we, sizeof(e->we), "ipc:///tmp/lmserve-schtest-%d-%d-w.sock", (int)getpid(), serial);
  serial++;
  char worlds[16];
  snprintf(worlds, sizeof(worlds), "%d", world);
  TH_REQUIRE(th_proc_spawnl(&e->sched, NULL, 0, (char *const *)sched_extra, th_lmserve_bin(),
                            "scheduler", "--model", "/nonexistent-model", "--frontend-endpoint",
                            e->fe, "--worker-endpoint", e->we, "--world-size", worlds,
                            "--max-num-seqs", "16", "--max-num-batched-tokens", "64",
                            "--enable-prefix-caching", "--worker-timeout", "1.5", NULL) == 0);
  for (int r = 0; r < world; r++)
    start_worker(e, r, worker_extra);
  e->ctx = zmq_ctx_new();
  TH_REQUIRE(e->ctx != NULL);
}

void env_stop(struct env *e) {
  th_proc_check_exit(&e->sched, SIGTERM, 5000);
  th_proc_stop(&e->sched, 1000);
  for (int r = 0; r < e->world; r++) {
    /* CTRL shutdown from the scheduler ends a fake worker cleanly */
    if (e->workers[r].pid && !e->workers[r].exited) th_proc_check_exit(&e->workers[r], 0, 3000);
    th_proc_stop(&e->workers[r], 500);
  }
  zmq_ctx_term(e->ctx);
}

/* ---- a test frontend ------------------------------------------------------------ */

void client_open(struct env *e, struct client *c, struct treq *reqs, int n) {
  memset(c, 0, sizeof(*c));
  TH_REQUIRE(pr_sock_open(e->ctx, ZMQ_DEALER, 0, &c->s) == 0);
  TH_REQUIRE(pr_sock_connect(c->s, e->fe) == 0);
  cm_arena_init(&c->a, 1 << 16, 64u << 20);
  c->reqs = reqs;
  c->nreqs = n;
}

void client_close(struct client *c) {
  pr_sock_close(c->s);
  cm_arena_free(&c->a);
}

void env_open(struct env *e, struct client *c, int world, const char *const *sched_extra,
              const char *const *worker_extra, struct treq *reqs, int n) {
  th_proc_init(30);
  env_start(e, world, sched_extra, worker_extra);
  client_open(e, c, reqs, n);
  PING_UNTIL(c, c->pong.workers_ready == (uint32_t)world, 10000);
}

void env_close(struct env *e, struct client *c) {
  client_close(c);
  env_stop(e);
}

static struct treq *find_req(struct client *c, uint64_t id) {
  for (int i = 0; i < c->nreqs; i++)
    if (c->reqs[i].id == id) return &c->reqs[i];
  return NULL;
}

/* Handles one message; returns its type, or 0 when none came within timeout_ms. */
int pump(struct client *c, int timeout_ms) {
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
        r->done_at = ++c->n_done;
      }
    }
  } else if (m.type == PR_ERR) {
    struct treq *r = m.u.err.request_id ? find_req(c, m.u.err.request_id) : NULL;
    if (r && !r->done) {
      r->err_code = m.u.err.code;
      snprintf(r->err, sizeof(r->err), "%s", m.u.err.message);
      r->done = true;
      r->done_at = ++c->n_done;
    } else {
      c->errs_unmatched++;
    }
  } else if (m.type == PR_PONG) {
    c->pong = m.u.pong;
  }
  return m.type;
}

void send_msg(struct client *c, const struct pr_msg *m) {
  TH_REQUIRE(pr_sock_send(c->s, NULL, m, 0) == 0);
}

void ping(struct client *c) {
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

void send_add(struct client *c, struct treq *r) {
  struct pr_msg m;
  pr_msg_init(&m, PR_ADD);
  m.u.add.request_id = r->id;
  m.u.add.prompt = (struct pr_u32s){r->prompt, r->plen};
  m.u.add.max_tokens = r->max_tokens;
  m.u.add.sampling.ignore_eos = r->ignore_eos;
  m.u.add.sampling.logprobs = r->logprobs;
  m.u.add.sampling.grammar_kind = r->grammar_kind;
  m.u.add.sampling.lora = r->lora;
  m.u.add.lora_sum = r->lora_sum;
  if (r->grammar_kind) m.u.add.sampling.grammar = (struct pr_bytes){(const uint8_t *)"x", 1};
  uint32_t stop = (uint32_t)r->stop_id;
  if (r->stop_id >= 0) m.u.add.stop_token_ids = (struct pr_u32s){&stop, 1};
  m.u.add.arrival_ns = cm_time_wall_ns();
  send_msg(c, &m);
}

void wait_done(struct client *c, int timeout_ms) {
  uint64_t end = cm_time_ns() + (uint64_t)timeout_ms * 1000000ull;
  for (;;) {
    int all = 1;
    for (int i = 0; i < c->nreqs; i++)
      all &= c->reqs[i].done || c->reqs[i].id == 0;
    if (all) return;
    if (cm_time_ns() > end) {
      th_fail(__FILE__, __LINE__, "requests not done within %d ms", timeout_ms);
      th_stop();
    }
    pump(c, 100);
  }
}

static uint64_t rng_state = 12345;
uint32_t rnd(uint32_t n) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng_state >> 33) % n;
}

void make_req(struct treq *r, uint64_t id, uint32_t plen, uint32_t max_tokens) {
  memset(r, 0, sizeof(*r));
  r->id = id;
  r->plen = plen;
  r->max_tokens = max_tokens;
  r->stop_id = -1;
  r->logprobs = -1;
  for (uint32_t i = 0; i < plen; i++)
    r->prompt[i] = 2 + rnd(SCH_FAKE_VOCAB - 2);
}

/* What the model generates for r, and how it finishes. */
uint32_t expected(const struct treq *r, uint32_t *out, int *finish) {
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

void check_req(const struct treq *r) {
  uint32_t exp[SCH_FAKE_MAXLEN];
  int fin;
  uint32_t n = expected(r, exp, &fin);
  if (r->err_code)
    th_fail(__FILE__, __LINE__, "request %llu: ERR %d %s", (unsigned long long)r->id, r->err_code,
            r->err);
  TH_CHECK(r->done);
  TH_CHECK_EQ_INT(r->nout, n);
  TH_CHECK_EQ_INT(r->finish, fin);
  TH_CHECK(memcmp(r->out, exp, CM_MIN(n, r->nout) * sizeof(uint32_t)) == 0);
  if (fin == PR_FINISH_STOP)
    TH_CHECK_EQ_INT(r->stop_token, exp[n - 1]);
  else
    TH_CHECK_EQ_INT(r->stop_token, -1);
}

void send_reqs_ignoring_eos(struct client *c, int n, uint64_t id0, uint32_t plen,
                            uint32_t max_tokens) {
  for (int i = 0; i < n; i++) {
    make_req(&c->reqs[i], id0 + (uint64_t)i, plen, max_tokens);
    c->reqs[i].ignore_eos = true;
    send_add(c, &c->reqs[i]);
  }
}

void serve_one(struct client *c, uint64_t id, uint32_t plen, uint32_t max_tokens) {
  c->nreqs = 1;
  send_reqs_ignoring_eos(c, 1, id, plen, max_tokens);
  wait_done(c, 10000);
  check_req(&c->reqs[0]);
}
