/* test-engine.c — preemption by recompute, aborts in every state, admission limits,
 * stop conditions, speculative-decoding slots and rollback, result validation, failure
 * recovery, memory growth. (It looks inside the engine: sch-engine-impl.h.) */
#include <stdio.h>

#include "common/cm-err.h"
#include "scheduler/sch-engine-impl.h"
#include "tests/harness/th.h"
#include "tests/unit/scheduler/sch-test-util.h"

static struct sch_engine *engine(int32_t blocks, int32_t bt, int32_t budget, int32_t seqs,
                                 int32_t max_len, int caching, int32_t spec) {
  struct sch_engine_config c;
  fake_config(&c, blocks, bt, budget, seqs, max_len);
  c.enable_prefix_caching = caching;
  c.num_spec_tokens = spec;
  c.num_eos_ids = 1;
  c.eos_ids[0] = 1;
  c.vocab_size = 2000;
  c.max_waiting = 8;
  return fake_engine(&c);
}

static int32_t P1[8] = {11, 12, 13, 14, 15, 16, 17, 18};
static int32_t P2[8] = {21, 22, 23, 24, 25, 26, 27, 28};

/* Generated tokens per request id (ids 1..4). */
struct sink {
  int32_t toks[5][128];
  int32_t n[5];
  enum sch_finish fin[5];
};

static void collect(struct sink *s, const struct sch_outputs *o) {
  for (int32_t i = 0; i < o->num; i++) {
    const struct sch_output *x = &o->items[i];
    TH_REQUIRE(x->req_id >= 1 && x->req_id <= 4);
    TH_REQUIRE(s->n[x->req_id] + x->num_new <= 128);
    for (int32_t j = 0; j < x->num_new; j++)
      s->toks[x->req_id][s->n[x->req_id]++] = x->new_tokens[j];
    s->fin[x->req_id] = x->finish;
    TH_CHECK_EQ_INT(x->num_generated, s->n[x->req_id]);
  }
}

/* Answers the plan just made (accept_all as in fake_answer) and collects the outputs. */
static void answer_plan(struct sch_engine *e, const struct sch_plan *plan, struct fake_worker *w,
                        struct sink *s, int accept_all) {
  struct sch_outputs o;
  fake_answer(w, plan, accept_all);
  TH_REQUIRE(sch_engine_apply(e, w->res, w->num, &o) == 0);
  CHECK_ENGINE(e);
  collect(s, &o);
}

static void run_step(struct sch_engine *e, struct sch_plan *plan, struct fake_worker *w,
                     struct sink *s, int accept_all) {
  TH_REQUIRE(sch_engine_plan_step(e, plan) == 0);
  CHECK_ENGINE(e);
  if (plan->num_seqs == 0) return;
  answer_plan(e, plan, w, s, accept_all);
}

/* Request id generated n tokens, exactly those plain decoding gives after prompt[0..8). */
static void check_output(const struct sink *s, uint64_t id, const int32_t *prompt, int32_t n) {
  int32_t want[128];
  fake_expected(prompt, 8, n, want);
  TH_CHECK_EQ_INT(s->n[id], n);
  for (int32_t i = 0; i < n; i++)
    TH_CHECK_EQ_INT(s->toks[id][i], want[i]);
}

static void preemption_case(int caching) {
  /* 8 blocks of 4 tokens; each request grows to 8 + 16 = 24 tokens (6 blocks) */
  struct sch_engine *e = engine(8, 4, 64, 4, 64, caching, 0);
  struct fake_worker w = {.rng = 3};
  struct sink s = {0};
  struct sch_plan plan;
  char err[256];
  TH_REQUIRE(fake_add(e, 1, P1, 8, 16, err, sizeof(err)) == 0);
  TH_REQUIRE(fake_add(e, 2, P2, 8, 16, err, sizeof(err)) == 0);
  int preempted_at = -1;
  for (int step = 0; step < 100; step++) {
    TH_REQUIRE(sch_engine_plan_step(e, &plan) == 0);
    CHECK_ENGINE(e);
    if (plan.num_preempted > 0) {
      TH_CHECK_EQ_INT(plan.num_preempted, 1);
      TH_CHECK_EQ_INT(plan.preempted[0], 2); /* the most recently admitted */
      TH_CHECK_EQ_INT(plan.num_seqs, 1);
      TH_CHECK_EQ_INT(plan.seqs[0].req_id, 1);
      if (preempted_at < 0) {
        preempted_at = step;
        /* generated token g runs at position 7 + g: the 9th needs a 5th block each */
        TH_CHECK_EQ_INT(s.n[2], 9);
      }
    }
    for (int32_t i = 0; i < plan.num_seqs; i++) {
      const struct sch_plan_seq *q = &plan.seqs[i];
      if (q->req_id == 2 && q->is_new && preempted_at >= 0) {
        /* recompute: prompt + the 9 generated tokens, minus what the cache still had */
        TH_CHECK_EQ_INT(q->start_pos + q->num_tokens, 17);
        if (!caching) TH_CHECK_EQ_INT(q->start_pos, 0);
        for (int32_t j = 0; j < q->num_tokens; j++) {
          int32_t pos = q->start_pos + j;
          TH_CHECK_EQ_INT(q->tokens[j], pos < 8 ? P2[pos] : s.toks[2][pos - 8]);
        }
        TH_CHECK(q->sample);
      }
    }
    if (plan.num_seqs == 0) break;
    answer_plan(e, &plan, &w, &s, 1);
  }
  TH_CHECK(preempted_at > 0);
  check_output(&s, 1, P1, 16);
  check_output(&s, 2, P2, 16);
  TH_CHECK(s.fin[1] == SCH_FINISH_LENGTH && s.fin[2] == SCH_FINISH_LENGTH);
  struct sch_engine_stats st;
  sch_engine_stats(e, &st);
  TH_CHECK(st.num_preemptions >= 1);
  TH_CHECK_EQ_INT(st.num_blocks_used, 0);
  TH_CHECK_NEAR(st.kv_usage, 0.0, 1e-12);
  sch_engine_destroy(e);
}

TH_TEST(preemption_recomputes_without_cache) {
  preemption_case(0);
}
TH_TEST(preemption_recomputes_with_cache) {
  preemption_case(1);
}

TH_TEST(abort_in_every_state_returns_every_block) {
  struct sch_engine *e = engine(64, 4, 20, 3, 64, 1, 0);
  struct fake_worker w = {.rng = 5};
  struct sink s = {0};
  struct sch_plan plan;
  char err[256];
  int32_t big[40];
  for (int i = 0; i < 40; i++)
    big[i] = 500 + i;
  TH_REQUIRE(fake_add(e, 1, P1, 8, 30, err, sizeof(err)) == 0);  /* decoding */
  TH_REQUIRE(fake_add(e, 3, P2, 8, 5, err, sizeof(err)) == 0);   /* decoding, then in flight */
  TH_REQUIRE(fake_add(e, 2, big, 40, 5, err, sizeof(err)) == 0); /* mid-prefill */
  run_step(e, &plan, &w, &s, 1);
  TH_REQUIRE(fake_add(e, 4, P2, 6, 5, err, sizeof(err)) == 0); /* waiting (cap 3) */
  run_step(e, &plan, &w, &s, 1);
  struct sch_engine_stats st;
  sch_engine_stats(e, &st);
  TH_CHECK_EQ_INT(st.num_running, 3);
  TH_CHECK_EQ_INT(st.num_waiting, 1);
  TH_CHECK(st.num_blocks_used > 0);
  TH_CHECK_EQ_INT(sch_engine_abort(e, 4), 0); /* waiting */
  TH_CHECK_EQ_INT(sch_engine_abort(e, 4), CM_ERR_NOENT);
  TH_CHECK_EQ_INT(sch_engine_abort(e, 2), 0); /* running, mid-prefill */
  CHECK_ENGINE(e);
  TH_REQUIRE(sch_engine_plan_step(e, &plan) == 0);
  TH_CHECK_EQ_INT(plan.num_finished, 1);
  TH_CHECK_EQ_INT(plan.finished[0], 2);
  fake_answer(&w, &plan, 1);
  TH_CHECK_EQ_INT(sch_engine_abort(e, 3), 0); /* in flight: its result is ignored */
  TH_CHECK_EQ_INT(sch_engine_abort(e, 1), 0);
  struct sch_outputs o;
  TH_CHECK_EQ_INT(sch_engine_apply(e, w.res, w.num, &o), 0);
  TH_CHECK_EQ_INT(o.num, 0);
  CHECK_ENGINE(e);
  sch_engine_stats(e, &st);
  TH_CHECK_EQ_INT(st.num_running + st.num_waiting, 0);
  TH_CHECK_EQ_INT(st.num_blocks_used, 0);
  TH_REQUIRE(sch_engine_plan_step(e, &plan) == 0);
  TH_CHECK_EQ_INT(plan.num_finished, 2);
  sch_engine_destroy(e);

  /* a preempted request, waiting to be recomputed */
  e = engine(8, 4, 64, 4, 64, 1, 0);
  memset(&s, 0, sizeof(s));
  TH_REQUIRE(fake_add(e, 1, P1, 8, 16, err, sizeof(err)) == 0);
  TH_REQUIRE(fake_add(e, 2, P2, 8, 16, err, sizeof(err)) == 0);
  uint64_t pre = 0;
  for (int i = 0; i < 40 && st.num_preemptions == 0; i++) {
    run_step(e, &plan, &w, &s, 1);
    sch_engine_stats(e, &st);
  }
  TH_REQUIRE(st.num_preemptions == 1 && st.num_waiting == 1);
  pre = 2;
  TH_CHECK_EQ_INT(sch_engine_abort(e, pre), 0);
  TH_CHECK_EQ_INT(sch_engine_abort(e, 1), 0);
  CHECK_ENGINE(e);
  sch_engine_stats(e, &st);
  TH_CHECK_EQ_INT(st.num_blocks_used, 0);
  TH_CHECK_NEAR(st.kv_usage, 0.0, 1e-12);
  TH_REQUIRE(sch_engine_plan_step(e, &plan) == 0);
  TH_CHECK_EQ_INT(plan.num_finished, 1); /* only 1 was still in the workers */
  TH_CHECK_EQ_INT(plan.finished[0], 1);
  sch_engine_destroy(e);
}

TH_TEST(admission_rejects_the_impossible) {
  struct sch_engine *e = engine(8, 4, 64, 4, 64, 1, 0);
  char err[256];
  int32_t p[64] = {0};
  TH_CHECK_EQ_INT(fake_add(e, 1, p, 60, 5, err, sizeof(err)), CM_ERR_TOOBIG);
  TH_CHECK(strstr(err, "maximum context length is 64") != NULL);
  /* fits max_model_len but needs 10 blocks of a pool of 8 */
  TH_CHECK_EQ_INT(fake_add(e, 1, p, 30, 10, err, sizeof(err)), CM_ERR_TOOBIG);
  TH_CHECK(strstr(err, "10 KV cache blocks") != NULL);
  TH_CHECK_EQ_INT(fake_add(e, 1, p, 0, 5, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(fake_add(e, 1, p, 4, 0, err, sizeof(err)), CM_ERR_INVAL);
  p[2] = -4;
  TH_CHECK_EQ_INT(fake_add(e, 1, p, 4, 4, err, sizeof(err)), CM_ERR_INVAL);
  p[2] = 2000; /* vocab_size 2000 */
  TH_CHECK_EQ_INT(fake_add(e, 1, p, 4, 4, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK(strstr(err, "vocabulary") != NULL);
  p[2] = 1999;
  TH_CHECK_EQ_INT(fake_add(e, 1, p, 28, 4, err, sizeof(err)), 0);           /* exactly 8 blocks */
  TH_CHECK_EQ_INT(fake_add(e, 1, p, 4, 4, err, sizeof(err)), CM_ERR_INVAL); /* duplicate id */
  struct sch_request_params rp = {.id = 9, .prompt = p, .prompt_len = 4, .max_tokens = 4};
  rp.num_stop_token_ids = SCH_MAX_STOP_IDS + 1;
  rp.stop_token_ids = p;
  TH_CHECK_EQ_INT(sch_engine_add(e, &rp, err, sizeof(err)), CM_ERR_TOOBIG);
  for (uint64_t id = 2; id <= 8; id++)
    TH_CHECK_EQ_INT(fake_add(e, id, p, 4, 4, err, sizeof(err)), 0);
  TH_CHECK_EQ_INT(fake_add(e, 100, p, 4, 4, err, sizeof(err)), CM_ERR_FULL); /* max_waiting 8 */
  CHECK_ENGINE(e);
  sch_engine_destroy(e);

  struct sch_engine_config c;
  sch_engine_config_default(&c);
  TH_CHECK_EQ_INT(sch_engine_create(&c, &e, err, sizeof(err)), CM_ERR_INVAL); /* no blocks */
  c.num_blocks = 10;
  c.max_model_len = 100;
  c.groups[0].block_tokens = 0;
  TH_CHECK_EQ_INT(sch_engine_create(&c, &e, err, sizeof(err)), CM_ERR_INVAL);
  c.groups[0].block_tokens = 16;
  c.num_groups = SCH_MAX_GROUPS + 1;
  TH_CHECK_EQ_INT(sch_engine_create(&c, &e, err, sizeof(err)), CM_ERR_INVAL);
}

/* Plans one step and answers request 1 with the given tokens. */
static struct sch_outputs answer(struct sch_engine *e, const int32_t *toks, int32_t n) {
  struct sch_plan plan;
  struct sch_outputs o = {0};
  TH_REQUIRE(sch_engine_plan_step(e, &plan) == 0);
  TH_REQUIRE(plan.num_seqs == 1 && plan.seqs[0].sample);
  struct sch_seq_result r = {.req_id = plan.seqs[0].req_id, .tokens = toks, .num_tokens = n};
  TH_REQUIRE(sch_engine_apply(e, &r, 1, &o) == 0);
  CHECK_ENGINE(e);
  return o;
}

TH_TEST(stop_conditions) {
  struct sch_engine *e = engine(64, 4, 64, 4, 64, 1, 0);
  char err[256];
  int32_t t;
  TH_REQUIRE(fake_add(e, 1, P1, 8, 10, err, sizeof(err)) == 0);
  t = 50;
  struct sch_outputs o = answer(e, &t, 1);
  TH_CHECK(o.num == 1 && o.items[0].finish == SCH_FINISH_NONE);
  t = 1; /* eos */
  o = answer(e, &t, 1);
  TH_CHECK(o.num == 1 && o.items[0].finish == SCH_FINISH_STOP && o.items[0].new_tokens[0] == 1);
  TH_CHECK_EQ_INT(o.items[0].num_generated, 2);

  struct sch_request_params p = {
      .id = 2, .prompt = P1, .prompt_len = 8, .max_tokens = 3, .arrival_ns = 12345};
  int32_t stop = 77;
  p.ignore_eos = true;
  p.stop_token_ids = &stop;
  p.num_stop_token_ids = 1;
  TH_REQUIRE(sch_engine_add(e, &p, err, sizeof(err)) == 0);
  t = 1;
  o = answer(e, &t, 1);
  TH_CHECK(o.items[0].finish == SCH_FINISH_NONE); /* eos ignored */
  TH_CHECK_EQ_INT(o.items[0].arrival_ns, 12345);
  t = 77;
  o = answer(e, &t, 1);
  TH_CHECK(o.items[0].finish == SCH_FINISH_STOP);

  p.id = 3;
  p.num_stop_token_ids = 0;
  TH_REQUIRE(sch_engine_add(e, &p, err, sizeof(err)) == 0);
  for (int i = 0; i < 3; i++) {
    t = 1;
    o = answer(e, &t, 1);
    TH_CHECK_EQ_INT(o.items[0].finish, i < 2 ? SCH_FINISH_NONE : SCH_FINISH_LENGTH);
  }
  struct sch_engine_stats st;
  sch_engine_stats(e, &st);
  TH_CHECK_EQ_INT(st.num_running + st.num_waiting + st.num_blocks_used, 0);
  sch_engine_destroy(e);
}

/* An engine with 3 draft slots a decode, and request 1 (7 prompt tokens, 8 to make). */
static struct sch_engine *spec_engine(void) {
  struct sch_engine *e = engine(64, 4, 64, 4, 64, 1, 3);
  char err[256];
  TH_REQUIRE(fake_add(e, 1, P1, 7, 8, err, sizeof(err)) == 0);
  return e;
}

TH_TEST(spec_decode_reserves_and_rolls_back) {
  struct sch_engine *e = spec_engine();
  struct sch_plan plan;
  struct sch_outputs o;
  TH_REQUIRE(sch_engine_plan_step(e, &plan) == 0);
  TH_CHECK_EQ_INT(plan.seqs[0].num_draft, 0);   /* no drafts on a prefill to verify, */
  TH_CHECK_EQ_INT(plan.seqs[0].num_propose, 3); /* but its first decode's proposed */
  int32_t t[4] = {40, 41, 42, 43};
  struct sch_seq_result r = {
      .req_id = 1, .tokens = t, .num_tokens = 1, .num_verified = 0, .num_proposed = 3};
  TH_REQUIRE(sch_engine_apply(e, &r, 1, &o) == 0);
  r.num_verified = 3;
  /* decode at 7 with 3 draft slots: positions 7..10 -> blocks 0..2 */
  TH_REQUIRE(sch_engine_plan_step(e, &plan) == 0);
  TH_CHECK_EQ_INT(plan.seqs[0].start_pos, 7);
  TH_CHECK_EQ_INT(plan.seqs[0].num_draft, 3);
  TH_CHECK_EQ_INT(plan.seqs[0].num_propose, 3);
  TH_CHECK_EQ_INT(plan.seqs[0].num_blocks[0], 3);
  TH_CHECK_EQ_INT(plan.num_tokens, 4);
  /* too many tokens for 3 drafts: refused, nothing changes */
  r.num_tokens = 5;
  TH_CHECK_EQ_INT(sch_engine_apply(e, &r, 1, &o), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(sch_engine_apply(e, &r, 0, &o), CM_ERR_INVAL); /* missing */
  struct sch_seq_result dup[2] = {{1, t, 1, 0, 3}, {1, t, 1, 0, 3}};
  TH_CHECK_EQ_INT(sch_engine_apply(e, dup, 2, &o), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(sch_engine_plan_step(e, &plan), CM_ERR_STATE); /* still in flight */
  /* nothing accepted: the bonus token only; position 7 computed, block 2 released */
  r.num_tokens = 1;
  TH_REQUIRE(sch_engine_apply(e, &r, 1, &o) == 0);
  TH_CHECK_EQ_INT(sch_engine_apply(e, &r, 1, &o), CM_ERR_STATE);
  CHECK_ENGINE(e);
  struct sch_engine_stats st;
  sch_engine_stats(e, &st);
  TH_CHECK_EQ_INT(st.num_blocks_used, 2);
  /* decode at 8 (block 2): 3 slots again; all accepted -> 4 tokens, computed 12 */
  TH_REQUIRE(sch_engine_plan_step(e, &plan) == 0);
  TH_CHECK_EQ_INT(plan.seqs[0].num_draft, 3);
  r.num_tokens = 4;
  TH_REQUIRE(sch_engine_apply(e, &r, 1, &o) == 0);
  TH_CHECK(o.num == 1 && o.items[0].num_new == 4 && o.items[0].num_generated == 6);
  CHECK_ENGINE(e);
  /* 2 tokens left to generate: only 1 draft slot */
  TH_REQUIRE(sch_engine_plan_step(e, &plan) == 0);
  TH_CHECK_EQ_INT(plan.seqs[0].num_draft, 1);
  TH_CHECK_EQ_INT(plan.seqs[0].start_pos, 12);
  int32_t eos_run[2] = {1, 60};
  r.tokens = eos_run;
  r.num_tokens = 2; /* the accepted draft is eos: the bonus token is cut */
  r.num_verified = 1;
  TH_REQUIRE(sch_engine_apply(e, &r, 1, &o) == 0);
  TH_CHECK(o.num == 1 && o.items[0].num_new == 1 && o.items[0].finish == SCH_FINISH_STOP);
  sch_engine_stats(e, &st);
  TH_CHECK_EQ_INT(st.spec_num_drafts, 3);
  TH_CHECK_EQ_INT(st.spec_num_draft_tokens, 7);
  TH_CHECK_EQ_INT(st.spec_num_accepted_tokens, 0 + 3 + 1);
  /* by position: the run of 3 counts at 0, 1, 2; the run of 1 at 0 */
  TH_CHECK_EQ_INT(st.spec_accepted_per_pos[0], 2);
  TH_CHECK_EQ_INT(st.spec_accepted_per_pos[1], 1);
  TH_CHECK_EQ_INT(st.spec_accepted_per_pos[2], 1);
  TH_CHECK_EQ_INT(st.spec_accepted_per_pos[3], 0);
  TH_CHECK_EQ_INT(st.num_blocks_used, 0);
  sch_engine_destroy(e);
}

/* Draft slots the workers had no drafts for (a step whose proposals stopped short
 * after they reported them, as with async scheduling) are not counted as drafts. */
TH_TEST(spec_counters_count_verified_drafts_only) {
  struct sch_engine *e = spec_engine();
  struct sch_plan plan;
  struct sch_outputs o;
  int32_t t[4] = {40, 41, 42, 43};
  struct sch_seq_result r = {
      .req_id = 1, .tokens = t, .num_tokens = 1, .num_verified = 0, .num_proposed = 3};
  TH_REQUIRE(sch_engine_plan_step(e, &plan) == 0); /* prefill */
  TH_REQUIRE(sch_engine_apply(e, &r, 1, &o) == 0);
  TH_REQUIRE(sch_engine_plan_step(e, &plan) == 0); /* 3 slots, no draft came */
  TH_CHECK_EQ_INT(plan.seqs[0].num_draft, 3);
  TH_REQUIRE(sch_engine_apply(e, &r, 1, &o) == 0);
  struct sch_engine_stats st;
  sch_engine_stats(e, &st);
  TH_CHECK_EQ_INT(st.spec_num_drafts, 0);
  TH_CHECK_EQ_INT(st.spec_num_draft_tokens, 0);
  TH_REQUIRE(sch_engine_plan_step(e, &plan) == 0); /* 2 of 3 slots verified, both taken */
  r.num_tokens = 3;
  r.num_verified = 2;
  TH_REQUIRE(sch_engine_apply(e, &r, 1, &o) == 0);
  sch_engine_stats(e, &st);
  TH_CHECK_EQ_INT(st.spec_num_drafts, 1);
  TH_CHECK_EQ_INT(st.spec_num_draft_tokens, 2);
  TH_CHECK_EQ_INT(st.spec_num_accepted_tokens, 2);
  TH_CHECK_EQ_INT(st.spec_accepted_per_pos[1], 1);
  sch_engine_destroy(e);
}

/* Without a step in flight, a decode gets no more draft slots than its last result
 * proposed drafts (none when an n-gram lookup found nothing): the budget and the blocks
 * of the slots it would leave empty go to others. It still asks for all K proposals. A
 * decode planned behind a step in flight cannot know that step's proposals: K slots. */
/* Plans the next step of a one-request engine: its draft slots, the proposals it asks
 * for and the step's tokens (-1: not checked). */
static void expect_slots(struct sch_engine *e, struct sch_plan *plan, int draft, int propose,
                         int tokens) {
  TH_REQUIRE(sch_engine_plan_step(e, plan) == 0);
  TH_REQUIRE(plan->num_seqs == 1);
  TH_CHECK_EQ_INT(plan->seqs[0].num_draft, draft);
  TH_CHECK_EQ_INT(plan->seqs[0].num_propose, propose);
  if (tokens >= 0) TH_CHECK_EQ_INT(plan->num_tokens, tokens);
}

TH_TEST(spec_slots_follow_the_proposals) {
  for (int async = 0; async < 2; async++) {
    struct sch_engine_config c;
    fake_config(&c, 64, 4, 64, 4, 64);
    c.num_spec_tokens = 3;
    c.vocab_size = 2000;
    c.async_scheduling = async;
    struct sch_engine *e = fake_engine(&c);
    char err[256];
    TH_REQUIRE(fake_add(e, 1, P1, 7, 12, err, sizeof(err)) == 0);
    struct sch_plan plan;
    struct sch_outputs o;
    int32_t t[4] = {40, 41, 42, 43};
    struct sch_seq_result r = {.req_id = 1, .tokens = t, .num_tokens = 1};
    TH_REQUIRE(sch_engine_plan_step(e, &plan) == 0); /* prefill: it proposes 3 */
    TH_CHECK_EQ_INT(plan.seqs[0].num_propose, 3);
    if (async) {
      /* behind the prefill in flight: its first decode, 3 slots whatever comes */
      struct sch_plan next;
      expect_slots(e, &next, 3, 3, 4);
      r.num_proposed = 0;
      TH_REQUIRE(sch_engine_apply(e, &r, 1, &o) == 0);
      r.num_proposed = 1;
      TH_REQUIRE(sch_engine_apply(e, &r, 1, &o) == 0);
      CHECK_ENGINE(e);
      expect_slots(e, &plan, 1, 3, 2); /* nothing in flight now: the last result's 1 counts */
      expect_slots(e, &next, 3, 3, 4); /* and behind it, 3 slots again */
      sch_engine_destroy(e);
      continue;
    }
    r.num_proposed = 0; /* the lookup found nothing */
    TH_REQUIRE(sch_engine_apply(e, &r, 1, &o) == 0);
    expect_slots(e, &plan, 0, 3, 1);
    TH_CHECK_EQ_INT(plan.seqs[0].start_pos, 7);
    TH_CHECK_EQ_INT(plan.seqs[0].num_blocks[0], 2); /* positions 0..8 of the next */
    r.num_proposed = 2;
    TH_REQUIRE(sch_engine_apply(e, &r, 1, &o) == 0);
    CHECK_ENGINE(e);
    expect_slots(e, &plan, 2, 3, 3);
    r.num_tokens = 3; /* both taken */
    r.num_verified = 2;
    r.num_proposed = 3;
    TH_REQUIRE(sch_engine_apply(e, &r, 1, &o) == 0);
    TH_CHECK(o.num == 1 && o.items[0].num_new == 3);
    CHECK_ENGINE(e);
    expect_slots(e, &plan, 3, 3, 4);
    /* more than it asked for counts as what it asked for */
    r.num_tokens = 1;
    r.num_proposed = 60;
    TH_REQUIRE(sch_engine_apply(e, &r, 1, &o) == 0);
    expect_slots(e, &plan, 3, 3, 4);
    TH_REQUIRE(sch_engine_apply(e, &r, 1, &o) == 0);
    CHECK_ENGINE(e);
    sch_engine_destroy(e);
  }
}

/* spec_disable_batch 2 (vLLM's disable_by_batch_size): while two requests or more run,
 * no decode gets draft slots and none asks for proposals; alone again, a request asks
 * for them, and verifies them the step after. */
TH_TEST(spec_off_above_batch_size) {
  struct sch_engine_config c;
  fake_config(&c, 64, 4, 64, 4, 64);
  c.num_spec_tokens = 3;
  c.vocab_size = 2000;
  c.spec_disable_batch = 2;
  struct sch_engine *e = fake_engine(&c);
  struct fake_worker w = {.rng = 3};
  char err[256];
  struct sch_plan plan;
  TH_REQUIRE(fake_add(e, 1, P1, 7, 30, err, sizeof(err)) == 0);
  fake_step(e, &w, &plan);
  TH_CHECK_EQ_INT(plan.seqs[0].num_propose, 3); /* alone */
  TH_REQUIRE(fake_add(e, 2, P2, 8, 30, err, sizeof(err)) == 0);
  fake_step(e, &w, &plan); /* 1 decodes (alone when planned), then 2 is admitted */
  TH_REQUIRE(plan.num_seqs == 2);
  TH_CHECK_EQ_INT(fake_find_seq(&plan, 1)->num_draft, 3);
  TH_CHECK_EQ_INT(fake_find_seq(&plan, 2)->num_propose, 0);
  for (int i = 0; i < 3; i++) { /* two run: no drafts */
    fake_step(e, &w, &plan);
    TH_REQUIRE(plan.num_seqs == 2);
    for (int j = 0; j < 2; j++) {
      TH_CHECK_EQ_INT(plan.seqs[j].num_draft, 0);
      TH_CHECK_EQ_INT(plan.seqs[j].num_propose, 0);
    }
  }
  TH_CHECK_EQ_INT(sch_engine_abort(e, 2), 0);
  fake_step(e, &w, &plan); /* alone again: it asks, */
  TH_CHECK_EQ_INT(plan.seqs[0].num_draft, 0);
  TH_CHECK_EQ_INT(plan.seqs[0].num_propose, 3);
  fake_step(e, &w, &plan); /* and verifies */
  TH_CHECK_EQ_INT(plan.seqs[0].num_draft, 3);
  struct sch_engine *bad = NULL;
  c.spec_disable_batch = -1;
  TH_CHECK_EQ_INT(sch_engine_create(&c, &bad, err, sizeof(err)), CM_ERR_INVAL);
  c.spec_disable_batch = 1; /* always off: vLLM refuses it too */
  TH_CHECK_EQ_INT(sch_engine_create(&c, &bad, err, sizeof(err)), CM_ERR_INVAL);
  sch_engine_destroy(e);
}

TH_TEST(failed_step_and_lost_kv_recompute) {
  struct sch_engine *e = engine(64, 4, 64, 4, 64, 1, 2);
  struct fake_worker w = {.rng = 9};
  struct sink s = {0};
  struct sch_plan plan;
  struct sch_outputs o;
  char err[256];
  TH_REQUIRE(fake_add(e, 1, P1, 8, 12, err, sizeof(err)) == 0);
  TH_REQUIRE(fake_add(e, 2, P2, 8, 12, err, sizeof(err)) == 0);
  run_step(e, &plan, &w, &s, 0);
  run_step(e, &plan, &w, &s, 0);
  /* a step that never comes back */
  TH_REQUIRE(sch_engine_plan_step(e, &plan) == 0);
  TH_REQUIRE(plan.num_seqs == 2);
  sch_engine_step_failed(e);
  CHECK_ENGINE(e);
  TH_CHECK_EQ_INT(sch_engine_apply(e, NULL, 0, &o), CM_ERR_STATE);
  struct sch_engine_stats st;
  sch_engine_stats(e, &st);
  TH_CHECK_EQ_INT(st.num_running, 0);
  TH_CHECK_EQ_INT(st.num_waiting, 2);
  TH_CHECK_EQ_INT(st.num_blocks_used, 0);
  TH_CHECK(st.num_blocks_cached_free > 0); /* the prompts' blocks stay cached */
  uint64_t hits = st.prefix_hits;
  /* the next plan tells the workers to forget both and sets them up anew */
  TH_REQUIRE(sch_engine_plan_step(e, &plan) == 0);
  TH_CHECK_EQ_INT(plan.num_finished, 2);
  TH_REQUIRE(plan.num_seqs == 2);
  TH_CHECK(plan.seqs[0].is_new && plan.seqs[1].is_new);
  TH_CHECK(plan.seqs[0].start_pos >= 8); /* recomputed from the cached prompt blocks */
  answer_plan(e, &plan, &w, &s, 0);
  sch_engine_stats(e, &st);
  TH_CHECK_EQ_INT(st.prefix_hits, hits); /* counted once per request */
  run_step(e, &plan, &w, &s, 0);
  /* the workers restarted: nothing cached survives */
  sch_engine_reset_kv(e);
  CHECK_ENGINE(e);
  sch_engine_stats(e, &st);
  TH_CHECK_EQ_INT(st.num_running, 0);
  TH_CHECK_EQ_INT(st.num_blocks_used + st.num_blocks_cached_free, 0);
  TH_REQUIRE(sch_engine_plan_step(e, &plan) == 0);
  TH_REQUIRE(plan.num_seqs == 2);
  TH_CHECK_EQ_INT(plan.seqs[0].start_pos, 0);
  TH_CHECK_EQ_INT(plan.seqs[1].start_pos, 0);
  answer_plan(e, &plan, &w, &s, 0);
  for (int i = 0; i < 40 && (s.fin[1] == SCH_FINISH_NONE || s.fin[2] == SCH_FINISH_NONE); i++)
    run_step(e, &plan, &w, &s, 0);
  check_output(&s, 1, P1, 12);
  check_output(&s, 2, P2, 12);
  sch_engine_destroy(e);
}

TH_TEST(queued_requests_cost_only_their_prompt) {
  struct sch_engine_config c;
  sch_engine_config_default(&c);
  c.num_blocks = 5000;
  c.groups[0].block_tokens = 256;
  c.max_model_len = 1 << 20;
  c.max_num_batched_tokens = 64;
  struct sch_engine *e = fake_engine(&c);
  char err[256];
  TH_REQUIRE(fake_add(e, 1, P1, 8, (1 << 20) - 8, err, sizeof(err)) == 0);
  struct sch_request *r = sch_queue_find(&e->q, 1);
  TH_REQUIRE(r != NULL);
  TH_CHECK(r->cap <= 8 + 16);
  TH_CHECK(r->kv.max_tokens <= 8 + 16);
  TH_CHECK_EQ_INT(r->max_len, 1 << 20);
  /* it grows by doubling as it decodes */
  struct fake_worker w = {.rng = 1};
  struct sink s = {0};
  struct sch_plan plan;
  for (int i = 0; i < 100; i++)
    run_step(e, &plan, &w, &s, 1);
  TH_CHECK(r->cap >= 108 && r->cap <= 2 * 109);
  check_output(&s, 1, P1, 100);
  sch_engine_destroy(e);
}
