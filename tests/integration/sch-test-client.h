/* sch-test-client.h — helpers of the scheduler's integration tests: start `lmserve
 * scheduler` and sch-fake-worker ranks (th-proc.h), a test frontend on a DEALER socket
 * that sends ADD/ABORT/PING and gathers OUT/ERR/PONG per request, and the expected
 * output of the fake model (sch-fake-model.h) to compare against. */
#ifndef LMSERVE_SCH_TEST_CLIENT_H
#define LMSERVE_SCH_TEST_CLIENT_H
#include <stdbool.h>
#include <stdint.h>

#include "proto/pr-zmq.h"
#include "tests/harness/th-proc.h"
#include "tests/integration/sch-fake-model.h"

#define MAXR 64

struct env {
  struct th_proc sched;
  struct th_proc workers[4];
  char fe[160], we[160];
  int world;
  void *ctx;
};

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
  int done_at;           /* 1 for the first of the client's requests done, 2 the next... */
  uint32_t grammar_kind; /* a structured output (its text "x": the fake workers follow none) */
  uint32_t lora;         /* the adapter asked for (0: none), with its list's sum */
  uint64_t lora_sum;
};

struct client {
  struct pr_sock *s;
  struct cm_arena a;
  struct treq *reqs;
  int nreqs;
  struct pr_pong pong;
  uint64_t nonce;
  int errs_unmatched; /* ERRs with request id 0 or unknown */
  int n_done;         /* requests done */
};

/* Starts the scheduler (its test flags, then sched_extra) and `world` fake workers
 * (worker_extra appended to each). */
void env_start(struct env *e, int world, const char *const *sched_extra,
               const char *const *worker_extra);
void start_worker(struct env *e, int rank, const char *const *extra);
/* SIGTERM to the scheduler: it must exit 0 and its CTRL shutdown must end the workers. */
void env_stop(struct env *e);

void client_open(struct env *e, struct client *c, struct treq *reqs, int n);
void client_close(struct client *c);
/* Arms the test's 30 s watchdog (th_proc_init; a test that needs longer arms it again
 * after), env_start, then client_open over reqs[0..n) and PINGs until all `world` ranks
 * are ready (10 s at most). */
void env_open(struct env *e, struct client *c, int world, const char *const *sched_extra,
              const char *const *worker_extra, struct treq *reqs, int n);
/* client_close, then env_stop. */
void env_close(struct env *e, struct client *c);
/* Handles one message; returns its type, or 0 when none came within timeout_ms. */
int pump(struct client *c, int timeout_ms);
void send_msg(struct client *c, const struct pr_msg *m);
void send_add(struct client *c, struct treq *r);
/* PING and wait for its PONG (in c->pong). */
void ping(struct client *c);
/* Pumps until every tracked request is done; fails the test after timeout_ms. */
void wait_done(struct client *c, int timeout_ms);

uint32_t rnd(uint32_t n);
/* A request with a random prompt of plen tokens, no stop id, no logprobs. */
void make_req(struct treq *r, uint64_t id, uint32_t plen, uint32_t max_tokens);
/* What the model generates for r, and how it finishes (enum pr_finish). */
uint32_t expected(const struct treq *r, uint32_t *out, int *finish);
/* r's outputs equal expected() and it finished the expected way without ERR. */
void check_req(const struct treq *r);
/* Makes c->reqs[0..n) with make_req (ids id0, id0 + 1, ..., each ignoring eos) and
 * sends them. */
void send_reqs_ignoring_eos(struct client *c, int n, uint64_t id0, uint32_t plen,
                            uint32_t max_tokens);
/* A new request in c->reqs[0], alone on c from now on (nreqs 1), ignoring eos: sent,
 * run to its end within 10 s and checked against the model. */
void serve_one(struct client *c, uint64_t id, uint32_t plen, uint32_t max_tokens);

/* PINGs until `cond` holds on the PONG or timeout_ms passes. */
#define PING_UNTIL(c, cond, timeout_ms)                                                            \
  do {                                                                                             \
    uint64_t end_ = cm_time_ns() + (uint64_t)(timeout_ms)*1000000ull;                              \
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

#endif
