/* test-planner.c — hand-checked scheduling scenarios: budget splitting, chunked prefill,
 * decode + prefill mixing, the running cap, sliding-window holes in the plan, prefix
 * hits and counters, preemption and recompute, stop conditions. */
#include <stdio.h>

#include "common/cm-err.h"
#include "scheduler/sch-engine.h"
#include "tests/harness/th.h"
#include "tests/unit/scheduler/sch-test-util.h"

static struct sch_engine *make_engine(int32_t blocks, int32_t bt, int32_t budget, int32_t seqs,
                                      int32_t max_len) {
  struct sch_engine_config c;
  fake_config(&c, blocks, bt, budget, seqs, max_len);
  c.num_eos_ids = 1;
  c.eos_ids[0] = 1;
  return fake_engine(&c);
}

static int add_req(struct sch_engine *e, uint64_t id, const int32_t *prompt, int32_t n,
                   int32_t max_tokens) {
  char err[256];
  return fake_add(e, id, prompt, n, max_tokens, err, sizeof(err));
}

/* The fake rank answering every test's steps (it accepts every draft, so it draws no
 * random numbers and keeps no state from one answer to the next). */
static struct fake_worker g_rank = {.rng = 1};

/* One step with the fake rank; returns the outputs. */
static struct sch_outputs step(struct sch_engine *e, struct sch_plan *plan) {
  return fake_step(e, &g_rank, plan);
}

static int32_t prompt_buf[4096];
static const int32_t *seq_prompt(int32_t n, int32_t base) {
  for (int32_t i = 0; i < n; i++)
    prompt_buf[i] = base + i;
  return prompt_buf;
}

TH_TEST(chunked_prefill_splits_the_budget) {
  struct sch_engine *e = make_engine(64, 4, 8, 4, 64);
  struct sch_plan plan;
  TH_REQUIRE(add_req(e, 1, seq_prompt(20, 100), 20, 3) == 0);
  struct sch_outputs o = step(e, &plan);
  TH_CHECK_EQ_INT(plan.num_seqs, 1);
  TH_CHECK_EQ_INT(plan.seqs[0].start_pos, 0);
  TH_CHECK_EQ_INT(plan.seqs[0].num_tokens, 8);
  TH_CHECK(!plan.seqs[0].sample);
  TH_CHECK(plan.seqs[0].is_new);
  TH_CHECK_EQ_INT(plan.seqs[0].num_blocks[0], 2);
  TH_CHECK_EQ_INT(plan.seqs[0].tokens[0], 100);
  TH_CHECK_EQ_INT(o.num, 0);
  o = step(e, &plan);
  TH_CHECK_EQ_INT(plan.seqs[0].start_pos, 8);
  TH_CHECK_EQ_INT(plan.seqs[0].num_tokens, 8);
  TH_CHECK_EQ_INT(plan.seqs[0].tokens[0], 108);
  TH_CHECK(!plan.seqs[0].is_new);
  TH_CHECK(!plan.seqs[0].sample);
  o = step(e, &plan);
  TH_CHECK_EQ_INT(plan.seqs[0].start_pos, 16);
  TH_CHECK_EQ_INT(plan.seqs[0].num_tokens, 4);
  TH_CHECK(plan.seqs[0].sample);
  TH_CHECK_EQ_INT(plan.num_tokens, 4);
  TH_REQUIRE(o.num == 1);
  int32_t want[3];
  fake_expected(seq_prompt(20, 100), 20, 3, want);
  TH_CHECK_EQ_INT(o.items[0].num_new, 1);
  TH_CHECK_EQ_INT(o.items[0].new_tokens[0], want[0]);
  TH_CHECK_EQ_INT(o.items[0].finish, SCH_FINISH_NONE);
  o = step(e, &plan); /* decode */
  TH_CHECK_EQ_INT(plan.seqs[0].start_pos, 20);
  TH_CHECK_EQ_INT(plan.seqs[0].num_tokens, 1);
  TH_CHECK_EQ_INT(plan.seqs[0].tokens[0], want[0]);
  TH_CHECK_EQ_INT(o.items[0].new_tokens[0], want[1]);
  o = step(e, &plan);
  TH_CHECK_EQ_INT(o.items[0].new_tokens[0], want[2]);
  TH_CHECK_EQ_INT(o.items[0].finish, SCH_FINISH_LENGTH);
  TH_CHECK_EQ_INT(o.items[0].num_generated, 3);
  struct sch_engine_stats st;
  sch_engine_stats(e, &st);
  TH_CHECK_EQ_INT(st.num_running + st.num_waiting, 0);
  TH_CHECK_EQ_INT(st.num_blocks_used, 0);
  /* the next plan tells the workers to forget the finished request */
  TH_REQUIRE(sch_engine_plan_step(e, &plan) == 0);
  TH_CHECK_EQ_INT(plan.num_seqs, 0);
  TH_REQUIRE(plan.num_finished == 1);
  TH_CHECK_EQ_INT(plan.finished[0], 1);
  sch_engine_destroy(e);
}

TH_TEST(decodes_mix_with_prefill_chunks) {
  struct sch_engine *e = make_engine(64, 4, 8, 4, 64);
  struct sch_plan plan;
  TH_REQUIRE(add_req(e, 1, seq_prompt(5, 100), 5, 10) == 0);
  TH_REQUIRE(add_req(e, 2, seq_prompt(5, 200), 5, 10) == 0);
  step(e, &plan); /* both prompts: 5 + 3 tokens */
  TH_CHECK_EQ_INT(plan.num_seqs, 2);
  TH_CHECK_EQ_INT(fake_find_seq(&plan, 1)->num_tokens, 5);
  TH_CHECK_EQ_INT(fake_find_seq(&plan, 2)->num_tokens, 3);
  TH_CHECK(!fake_find_seq(&plan, 2)->sample);
  TH_REQUIRE(add_req(e, 3, seq_prompt(30, 300), 30, 10) == 0);
  step(e, &plan);
  /* decode of 1 first, then the rest of 2's prompt, then 3's first chunk */
  TH_REQUIRE(plan.num_seqs == 3);
  TH_CHECK_EQ_INT(plan.seqs[0].req_id, 1);
  TH_CHECK_EQ_INT(plan.seqs[0].num_tokens, 1);
  TH_CHECK_EQ_INT(plan.seqs[1].req_id, 2);
  TH_CHECK_EQ_INT(plan.seqs[1].num_tokens, 2);
  TH_CHECK(plan.seqs[1].sample);
  TH_CHECK_EQ_INT(plan.seqs[2].req_id, 3);
  TH_CHECK_EQ_INT(plan.seqs[2].num_tokens, 5);
  TH_CHECK_EQ_INT(plan.num_tokens, 8);
  step(e, &plan);
  /* two decodes come first, 3's prefill gets the 6 tokens left */
  TH_CHECK_EQ_INT(fake_find_seq(&plan, 1)->num_tokens, 1);
  TH_CHECK_EQ_INT(fake_find_seq(&plan, 2)->num_tokens, 1);
  TH_CHECK_EQ_INT(fake_find_seq(&plan, 3)->num_tokens, 6);
  TH_CHECK_EQ_INT(fake_find_seq(&plan, 3)->start_pos, 5);
  sch_engine_destroy(e);
}

TH_TEST(max_num_seqs_caps_running) {
  struct sch_engine *e = make_engine(64, 4, 64, 2, 64);
  struct sch_plan plan;
  TH_REQUIRE(add_req(e, 1, seq_prompt(3, 100), 3, 2) == 0);
  TH_REQUIRE(add_req(e, 2, seq_prompt(3, 200), 3, 5) == 0);
  TH_REQUIRE(add_req(e, 3, seq_prompt(3, 300), 3, 5) == 0);
  step(e, &plan);
  TH_CHECK_EQ_INT(plan.num_seqs, 2);
  TH_CHECK(fake_find_seq(&plan, 3) == NULL);
  struct sch_engine_stats st;
  sch_engine_stats(e, &st);
  TH_CHECK_EQ_INT(st.num_running, 2);
  TH_CHECK_EQ_INT(st.num_waiting, 1);
  struct sch_outputs o = step(e, &plan); /* 1 finishes here */
  TH_CHECK(fake_find_seq(&plan, 3) == NULL);
  TH_CHECK(o.num == 2 && o.items[0].req_id == 1 && o.items[0].finish == SCH_FINISH_LENGTH);
  step(e, &plan);
  TH_CHECK(fake_find_seq(&plan, 3) != NULL && fake_find_seq(&plan, 3)->is_new);
  TH_CHECK_EQ_INT(plan.num_finished, 1);
  sch_engine_destroy(e);
}

/* While the workers lack the structured-output state, a constrained request waits
 * aside: the requests behind it are admitted in their order, and it runs in its place
 * once the state is there; preempted, it waits aside again only if the state went. */
TH_TEST(constrained_requests_wait_for_the_grammars) {
  struct sch_engine *e = make_engine(64, 4, 64, 4, 64);
  struct sch_plan plan;
  char err[256];
  TH_CHECK(!sch_engine_set_grammars(e, false)); /* nothing waits */
  struct sch_request_params p = {
      .id = 1, .prompt = seq_prompt(3, 100), .prompt_len = 3, .max_tokens = 4, .constrained = true};
  TH_REQUIRE(sch_engine_add(e, &p, err, sizeof(err)) == 0);
  TH_REQUIRE(add_req(e, 2, seq_prompt(3, 200), 3, 4) == 0);
  p.id = 3;
  p.prompt = seq_prompt(3, 300);
  TH_REQUIRE(sch_engine_add(e, &p, err, sizeof(err)) == 0);
  TH_REQUIRE(add_req(e, 4, seq_prompt(3, 400), 3, 4) == 0);
  step(e, &plan);
  TH_CHECK_EQ_INT(plan.num_seqs, 2);
  TH_CHECK(fake_find_seq(&plan, 2) && fake_find_seq(&plan, 4));
  TH_CHECK(!fake_find_seq(&plan, 1) && !fake_find_seq(&plan, 3));
  step(e, &plan);
  TH_CHECK(!fake_find_seq(&plan, 1) && !fake_find_seq(&plan, 3));
  struct sch_engine_stats st;
  sch_engine_stats(e, &st);
  TH_CHECK_EQ_INT(st.num_waiting, 2);
  TH_CHECK(sch_engine_set_grammars(e, false)); /* two wait */
  TH_CHECK(sch_engine_set_grammars(e, true));
  step(e, &plan);
  TH_CHECK(fake_find_seq(&plan, 1) && fake_find_seq(&plan, 1)->is_new);
  TH_CHECK(fake_find_seq(&plan, 3) && fake_find_seq(&plan, 3)->is_new);
  TH_CHECK(!sch_engine_set_grammars(e, true)); /* none waits now */
  CHECK_ENGINE(e);
  sch_engine_destroy(e);
}

TH_TEST(sliding_window_holes_reach_the_plan) {
  struct sch_engine_config c;
  fake_config(&c, 64, 4, 16, 4, 128);
  fake_groups(&c, (const struct sch_kv_group_cfg[]){{4, 0}, {4, 8}}, 2);
  struct sch_engine *e = fake_engine(&c);
  struct sch_plan plan;
  TH_REQUIRE(add_req(e, 1, seq_prompt(40, 10), 40, 8) == 0);
  step(e, &plan); /* positions 0..15 */
  TH_CHECK_EQ_INT(plan.seqs[0].num_blocks[1], 4);
  step(e, &plan); /* 16..31: query 16 sees 9..16 -> sliding blocks 0, 1 dead */
  const struct sch_plan_seq *s = &plan.seqs[0];
  TH_CHECK_EQ_INT(s->num_blocks[0], 8);
  TH_CHECK_EQ_INT(s->num_blocks[1], 8);
  TH_CHECK_EQ_INT(s->block_table[1][0], SCH_BLOCK_HOLE);
  TH_CHECK_EQ_INT(s->block_table[1][1], SCH_BLOCK_HOLE);
  for (int i = 2; i < 8; i++)
    TH_CHECK(s->block_table[1][i] >= 0);
  for (int i = 0; i < 8; i++)
    TH_CHECK(s->block_table[0][i] >= 0);
  step(e, &plan); /* 32..39 + sample: query 32 sees 25..32 -> blocks < 6 dead */
  s = &plan.seqs[0];
  for (int i = 0; i < 6; i++)
    TH_CHECK_EQ_INT(s->block_table[1][i], SCH_BLOCK_HOLE);
  TH_CHECK_EQ_INT(s->num_blocks[1], 10);
  struct sch_engine_stats st;
  sch_engine_stats(e, &st);
  TH_CHECK_EQ_INT(st.num_blocks_used, 10 + 4);
  sch_engine_destroy(e);
}

TH_TEST(prefix_hit_on_repeated_prompt) {
  struct sch_engine *e = make_engine(64, 16, 64, 4, 128);
  struct sch_plan plan;
  const int32_t *p = seq_prompt(40, 50);
  TH_REQUIRE(add_req(e, 1, p, 40, 2) == 0);
  step(e, &plan);
  TH_CHECK_EQ_INT(plan.seqs[0].num_cached, 0);
  step(e, &plan); /* finishes: its 2 full blocks stay cached */
  struct sch_engine_stats st;
  sch_engine_stats(e, &st);
  TH_CHECK_EQ_INT(st.num_blocks_used, 0);
  TH_CHECK_EQ_INT(st.num_blocks_cached_free, 2);
  TH_CHECK_EQ_INT(st.prefix_queries, 40);
  TH_CHECK_EQ_INT(st.prefix_hits, 0);
  TH_REQUIRE(add_req(e, 2, p, 40, 5) == 0);
  struct sch_outputs o = step(e, &plan);
  TH_REQUIRE(plan.num_seqs == 1);
  TH_CHECK_EQ_INT(plan.seqs[0].start_pos, 32);
  TH_CHECK_EQ_INT(plan.seqs[0].num_tokens, 8);
  TH_CHECK_EQ_INT(plan.seqs[0].num_cached, 32);
  TH_CHECK(plan.seqs[0].is_new);
  int32_t want[2];
  fake_expected(p, 40, 2, want);
  TH_CHECK(o.num == 1 && o.items[0].new_tokens[0] == want[0] && o.items[0].num_cached == 32);
  sch_engine_stats(e, &st);
  TH_CHECK_EQ_INT(st.prefix_queries, 80);
  TH_CHECK_EQ_INT(st.prefix_hits, 32);
  TH_CHECK_EQ_INT(st.num_blocks_cached_free, 0);
  /* a third identical request shares the blocks while 2 still holds them */
  TH_REQUIRE(add_req(e, 3, p, 40, 2) == 0);
  o = step(e, &plan);
  const struct sch_plan_seq *s2 = fake_find_seq(&plan, 2), *s3 = fake_find_seq(&plan, 3);
  TH_REQUIRE(s2 && s3);
  TH_CHECK_EQ_INT(s3->num_cached, 32);
  TH_CHECK_EQ_INT(s3->block_table[0][0], s2->block_table[0][0]);
  TH_CHECK_EQ_INT(s3->block_table[0][1], s2->block_table[0][1]);
  TH_CHECK(s3->block_table[0][2] != s2->block_table[0][2]);
  sch_engine_stats(e, &st);
  TH_CHECK_EQ_INT(st.prefix_hits, 64);
  sch_engine_destroy(e);
}

TH_TEST(prefix_caching_off_counts_nothing) {
  struct sch_engine_config c;
  sch_engine_config_default(&c);
  c.num_blocks = 64;
  c.max_model_len = 128;
  c.enable_prefix_caching = false;
  struct sch_engine *e = fake_engine(&c);
  struct sch_plan plan;
  const int32_t *p = seq_prompt(40, 50);
  for (uint64_t id = 1; id <= 2; id++) {
    TH_REQUIRE(add_req(e, id, p, 40, 1) == 0);
    step(e, &plan);
    TH_CHECK_EQ_INT(plan.seqs[0].start_pos, 0);
    TH_CHECK_EQ_INT(plan.seqs[0].num_tokens, 40);
  }
  struct sch_engine_stats st;
  sch_engine_stats(e, &st);
  TH_CHECK_EQ_INT(st.prefix_queries, 0);
  TH_CHECK_EQ_INT(st.num_blocks_cached_free, 0);
  sch_engine_destroy(e);
}

/* An engine on c with a 40-token prompt (id 1) and then a 5-token one (id 2) waiting. */
static struct sch_engine *long_and_short(const struct sch_engine_config *c) {
  struct sch_engine *e = fake_engine(c);
  TH_REQUIRE(add_req(e, 1, seq_prompt(40, 100), 40, 2) == 0);
  TH_REQUIRE(add_req(e, 2, seq_prompt(5, 300), 5, 2) == 0);
  return e;
}

TH_TEST(long_prefill_threshold_lets_short_prompts_in) {
  struct sch_engine_config c;
  fake_config(&c, 64, 4, 16, 256, 64);
  c.long_prefill_threshold = 8;
  struct sch_engine *e = long_and_short(&c);
  struct sch_plan plan;
  step(e, &plan);
  TH_REQUIRE(plan.num_seqs == 2);
  TH_CHECK_EQ_INT(fake_find_seq(&plan, 1)->num_tokens, 8);
  TH_CHECK_EQ_INT(fake_find_seq(&plan, 2)->num_tokens, 5);
  TH_CHECK(fake_find_seq(&plan, 2)->sample);
  step(e, &plan);
  TH_CHECK_EQ_INT(fake_find_seq(&plan, 1)->num_tokens, 8); /* 15 tokens left, capped at 8 */
  TH_CHECK_EQ_INT(fake_find_seq(&plan, 2)->num_tokens, 1);
  sch_engine_destroy(e);
  /* without the threshold the long prompt takes the whole budget first */
  c.long_prefill_threshold = 0;
  e = long_and_short(&c);
  step(e, &plan);
  TH_REQUIRE(plan.num_seqs == 1);
  TH_CHECK_EQ_INT(plan.seqs[0].num_tokens, 16);
  sch_engine_destroy(e);
}
