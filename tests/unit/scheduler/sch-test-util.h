/* sch-test-util.h — a fake rank 0 for scheduler tests: answers a plan with tokens that
 * depend only on the sequence's content (the previous token and its position), so a
 * request's output is the same however it is batched, chunked, preempted or drafted,
 * and a test can compute the expected output on its own. */
#ifndef LMSERVE_SCH_TEST_UTIL_H
#define LMSERVE_SCH_TEST_UTIL_H

#include <stdint.h>
#include <string.h>

#include "common/cm-hash.h"
#include "scheduler/sch-engine.h"
#include "tests/harness/th.h"

#define FAKE_MAX_SEQS   256
#define FAKE_MAX_TOKENS 65

/* The "model": next token after prev at position pos, in 10..1009 (0..9 are left for
 * eos / stop ids a test chooses). */
static inline int32_t fake_next(int32_t prev, int32_t pos) {
  uint32_t x = (uint32_t)prev * 2654435761u ^ (uint32_t)pos * 40503u;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  return (int32_t)(x % 1000u) + 10;
}

/* Expected output of a prompt: n tokens continuing it. */
static inline void fake_expected(const int32_t *prompt, int32_t plen, int32_t n, int32_t *out) {
  int32_t prev = prompt[plen - 1];
  for (int32_t i = 0; i < n; i++)
    out[i] = prev = fake_next(prev, plen + i);
}

struct fake_worker {
  int32_t toks[FAKE_MAX_SEQS][FAKE_MAX_TOKENS];
  struct sch_seq_result res[FAKE_MAX_SEQS];
  int32_t num;
  uint64_t rng;
};

/* Results for every sampling sequence. With drafts, a random number of them is
 * "accepted" (accept_all: all of them): the answer is then that many continuation
 * tokens plus the bonus one, exactly what plain decoding would produce. The workers
 * propose what the plan asks, or (not accept_all) now and then fewer. */
static inline void fake_answer(struct fake_worker *w, const struct sch_plan *plan, int accept_all) {
  w->num = 0;
  for (int32_t i = 0; i < plan->num_seqs; i++) {
    const struct sch_plan_seq *s = &plan->seqs[i];
    if (!s->sample) continue;
    TH_REQUIRE(w->num < FAKE_MAX_SEQS && s->num_draft + 1 <= FAKE_MAX_TOKENS);
    int32_t a = accept_all ? s->num_draft
                           : (int32_t)(cm_xorshift64(&w->rng) % (uint64_t)(s->num_draft + 1));
    int32_t prev = s->tokens[s->num_tokens - 1], pos = s->start_pos + s->num_tokens;
    for (int32_t j = 0; j <= a; j++)
      w->toks[w->num][j] = prev = fake_next(prev, pos + j);
    w->res[w->num].req_id = s->req_id;
    w->res[w->num].tokens = w->toks[w->num];
    w->res[w->num].num_tokens = a + 1;
    w->res[w->num].num_verified = s->num_draft;
    int32_t p = s->num_propose;
    if (!accept_all && p > 0 && cm_xorshift64(&w->rng) % 4 == 0)
      p = (int32_t)(cm_xorshift64(&w->rng) % (uint64_t)p);
    w->res[w->num].num_proposed = p;
    w->num++;
  }
}

/* Defaults, then the sizes the scenario tests vary: `blocks` blocks of bt tokens (one
 * full-attention group), a step budget of `budget` tokens, `seqs` running at most,
 * max_len tokens a request. */
static inline void fake_config(struct sch_engine_config *c, int32_t blocks, int32_t bt,
                               int32_t budget, int32_t seqs, int32_t max_len) {
  sch_engine_config_default(c);
  c->num_blocks = blocks;
  c->groups[0].block_tokens = bt;
  c->max_num_batched_tokens = budget;
  c->max_num_seqs = seqs;
  c->max_model_len = max_len;
}

/* The KV groups of c: n of them, g[i] each. */
static inline void fake_groups(struct sch_engine_config *c, const struct sch_kv_group_cfg *g,
                               int32_t n) {
  c->num_groups = n;
  for (int32_t i = 0; i < n; i++)
    c->groups[i] = g[i];
}

/* sch_engine_create; a failure stops the test (with the engine's reason). */
static inline struct sch_engine *fake_engine(const struct sch_engine_config *c) {
  struct sch_engine *e = NULL;
  char err[256];
  if (sch_engine_create(c, &e, err, sizeof(err)) != 0) {
    th_fail(__FILE__, __LINE__, "create: %s", err);
    th_stop();
  }
  return e;
}

/* Adds request id (prompt[0..n), max_tokens, no stop ids) with sch_engine_add: its result,
 * the reason in err. */
static inline int fake_add(struct sch_engine *e, uint64_t id, const int32_t *prompt, int32_t n,
                           int32_t max_tokens, char *err, size_t err_len) {
  struct sch_request_params p = {0};
  p.id = id;
  p.prompt = prompt;
  p.prompt_len = n;
  p.max_tokens = max_tokens;
  return sch_engine_add(e, &p, err, err_len);
}

static inline void check_engine(const struct sch_engine *e, const char *file, int line) {
  char err[512];
  if (sch_engine_check(e, err, sizeof(err)) != 0) {
    th_fail(file, line, "engine check: %s", err);
    th_stop();
  }
}
#define CHECK_ENGINE(e) check_engine((e), __FILE__, __LINE__)

/* The plan's entry for request id, or NULL when the step does not run it. */
static inline const struct sch_plan_seq *fake_find_seq(const struct sch_plan *p, uint64_t id) {
  for (int32_t i = 0; i < p->num_seqs; i++)
    if (p->seqs[i].req_id == id) return &p->seqs[i];
  return NULL;
}

/* One step answered by rank w accepting every draft (the engine checked before
 * and after); returns the outputs. */
static inline struct sch_outputs fake_step(struct sch_engine *e, struct fake_worker *w,
                                           struct sch_plan *plan) {
  struct sch_outputs outs = {0};
  TH_REQUIRE(sch_engine_plan_step(e, plan) == 0);
  CHECK_ENGINE(e);
  if (plan->num_seqs > 0) {
    fake_answer(w, plan, 1);
    TH_REQUIRE(sch_engine_apply(e, w->res, w->num, &outs) == 0);
  }
  CHECK_ENGINE(e);
  return outs;
}

#endif
