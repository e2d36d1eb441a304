/* test-plan-cost.c — the cost of planning and applying a step at serving scale: 256
 * running requests with 2-group (Gemma-like full + sliding) tables, a 8192-token budget
 * and a 60000-block pool. Checks the steps' shapes and prints microseconds per step. */
#include <stdio.h>
#include <stdlib.h>

#include "common/cm-time.h"
#include "scheduler/sch-engine.h"
#include "tests/harness/th.h"
#include "tests/unit/scheduler/sch-test-util.h"

TH_TEST(plan_and_apply_cost_at_scale) {
  struct sch_engine_config c;
  fake_config(&c, 60000, 16, 8192, 256, 4096);
  fake_groups(&c, (const struct sch_kv_group_cfg[]){{16, 0}, {16, 512}}, 2);
  struct sch_engine *e = fake_engine(&c);
  char err[256];
  static int32_t prompt[1000];
  for (uint64_t id = 1; id <= 256; id++) {
    for (int i = 0; i < 1000; i++)
      prompt[i] = 10 + (int32_t)((id * 7919 + (uint64_t)i * 31) % 1000);
    struct sch_request_params p = {
        .id = id, .prompt = prompt, .prompt_len = 1000, .max_tokens = 2000, .ignore_eos = true};
    TH_REQUIRE(sch_engine_add(e, &p, err, sizeof(err)) == 0);
  }
  struct fake_worker *w = calloc(1, sizeof(*w));
  TH_REQUIRE(w != NULL);
  struct sch_plan plan;
  struct sch_outputs o;
  uint64_t t0 = cm_time_ns();
  int prefill_steps = 0;
  for (;;) {
    TH_REQUIRE(sch_engine_plan_step(e, &plan) == 0);
    TH_REQUIRE(plan.num_seqs > 0);
    fake_answer(w, &plan, 1);
    TH_REQUIRE(sch_engine_apply(e, w->res, w->num, &o) == 0);
    prefill_steps++;
    if (plan.num_seqs == 256 && plan.num_tokens == 256) break;
    TH_REQUIRE(prefill_steps < 100);
  }
  uint64_t t1 = cm_time_ns();
  /* 256 000 prompt tokens in 8192-token steps: 32 steps, then the first pure decode */
  TH_CHECK_EQ_INT(prefill_steps, 33);
  enum { DECODE_STEPS = 1000 };
  uint64_t plan_ns = 0;
  for (int s = 0; s < DECODE_STEPS; s++) {
    uint64_t a = cm_time_ns();
    TH_REQUIRE(sch_engine_plan_step(e, &plan) == 0);
    plan_ns += cm_time_ns() - a;
    TH_REQUIRE(plan.num_seqs == 256 && plan.num_tokens == 256);
    fake_answer(w, &plan, 1);
    TH_REQUIRE(sch_engine_apply(e, w->res, w->num, &o) == 0);
    TH_REQUIRE(o.num == 256);
  }
  uint64_t t2 = cm_time_ns();
  struct sch_engine_stats st;
  sch_engine_stats(e, &st);
  /* each request computed 2000 .. 2034 tokens (the first ones decoded while the last
   * prompts were prefilled): full group 125 .. 128 blocks, sliding group 32 .. 34 live */
  TH_CHECK(st.num_blocks_used >= 256 * (125 + 32));
  TH_CHECK(st.num_blocks_used <= 256 * (128 + 34));
  printf("  prefill: %.1f us/step; decode (256 seqs): plan %.1f us/step, plan+apply %.1f "
         "us/step; %d blocks used\n",
         (double)(t1 - t0) / 1e3 / prefill_steps, (double)plan_ns / 1e3 / DECODE_STEPS,
         (double)(t2 - t1) / 1e3 / DECODE_STEPS, (int)st.num_blocks_used);
  free(w);
  sch_engine_destroy(e);
}
