/* test-scheduler.c — the `lmserve scheduler` process between a test frontend (DEALER
 * sockets speaking the real protocol) and fake worker ranks (sch-fake-worker, which
 * checks every STEP's positions and block tables against its simulated KV memory and
 * runs the deterministic model of sch-fake-model.h). Outputs must equal the model's
 * sequence exactly: single and concurrent requests, stop conditions, rejections,
 * aborts, prefix caching, speculative decoding, two frontends and two ranks, a full
 * batch. Failures and garbage are in test-scheduler-faults.c. */
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

static struct treq g_reqs[MAXR], g_reqs2[MAXR];

TH_TEST(sched_single_request) {
  struct env e;
  struct client c;
  env_open(&e, &c, 1, NULL, NULL, g_reqs, 1);
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
  env_close(&e, &c);
}

TH_TEST(sched_concurrent_requests) {
  struct env e;
  /* the worker also lists the prefill chunks that sampled nothing */
  const char *wx[] = {"--empty-results", NULL};
  struct client c;
  env_open(&e, &c, 1, NULL, wx, g_reqs, 32);
  for (int i = 0; i < 32; i++) {
    /* long prompts are chunked over steps (64 tokens per step) */
    make_req(&g_reqs[i], 100 + (uint64_t)i, 1 + rnd(150), 1 + rnd(60));
    g_reqs[i].ignore_eos = i % 2;
    send_add(&c, &g_reqs[i]);
  }
  wait_done(&c, 20000);
  for (int i = 0; i < 32; i++)
    check_req(&g_reqs[i]);
  ping(&c);
  TH_CHECK_EQ_INT(c.pong.num_running, 0);
  TH_CHECK(c.pong.kv_usage == 0);
  env_close(&e, &c);
}

/* Sends r[0], a constrained request (id; 20 prompt tokens, nc to generate), then r[1],
 * a plain one (id + 1; np to generate), both ignoring eos; waits for both. */
static void constrained_then_plain(struct client *c, struct treq *r, uint64_t id, uint32_t nc,
                                   uint32_t np, int ms) {
  make_req(&r[0], id, 20, nc);
  r[0].grammar_kind = 1;
  make_req(&r[1], id + 1, 20, np);
  r[0].ignore_eos = r[1].ignore_eos = true;
  send_add(c, &r[0]);
  send_add(c, &r[1]);
  wait_done(c, ms);
}

/* A structured output waits until every rank has built the state to follow it
 * (PR_CTRL_GRAMMARS, then BEAT's flag): the ranks fail a constrained sequence sent
 * before, and the plain requests that come meanwhile run and finish first. */
TH_TEST(sched_constrained_requests_wait_for_every_rank) {
  struct env e;
  struct client c;
  const char *wx[] = {"--grammar-ms", "3000", "--beat-ms", "50", NULL};
  env_open(&e, &c, 2, NULL, wx, g_reqs, 3);
  constrained_then_plain(&c, g_reqs, 1, 8, 20, 20000);
  check_req(&g_reqs[0]);
  check_req(&g_reqs[1]);
  TH_CHECK_EQ_INT(g_reqs[1].done_at, 1);
  TH_CHECK_EQ_INT(g_reqs[0].done_at, 2);
  /* from now on constrained requests run at once */
  make_req(&g_reqs[2], 3, 10, 5);
  g_reqs[2].grammar_kind = 1;
  g_reqs[2].ignore_eos = true;
  send_add(&c, &g_reqs[2]);
  wait_done(&c, 10000);
  check_req(&g_reqs[2]);
  env_close(&e, &c);
}

/* A rank that cannot build the structured-output state: constrained requests get an
 * ERR naming it, waiting ones and later ones alike, and the others are served. */
TH_TEST(sched_constrained_requests_refused_when_a_rank_cannot_follow_them) {
  struct env e;
  struct client c;
  const char *wx[] = {"--grammar-ms", "500", "--grammar-fail", "--beat-ms", "50", NULL};
  env_open(&e, &c, 1, NULL, wx, g_reqs, 4);
  constrained_then_plain(&c, g_reqs, 1, 8, 30, 20000);
  TH_CHECK_EQ_INT(g_reqs[0].err_code, CM_ERR_IO);
  TH_CHECK(strstr(g_reqs[0].err, "worker rank 0 could not build") != NULL);
  check_req(&g_reqs[1]);
  constrained_then_plain(&c, g_reqs + 2, 3, 5, 5, 10000);
  TH_CHECK_EQ_INT(g_reqs[2].err_code, CM_ERR_IO);
  check_req(&g_reqs[3]);
  ping(&c);
  TH_CHECK_EQ_INT(c.pong.workers_ready, 1);
  env_close(&e, &c);
}

TH_TEST(sched_stop_conditions) {
  struct env e;
  struct client c;
  env_open(&e, &c, 1, NULL, NULL, g_reqs, 4);
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
  for (int i = 0; i < 4; i++)
    send_add(&c, &g_reqs[i]);
  wait_done(&c, 10000);
  for (int i = 0; i < 4; i++)
    check_req(&g_reqs[i]);
  TH_CHECK_EQ_INT(g_reqs[0].finish, PR_FINISH_STOP);
  TH_CHECK_EQ_INT(g_reqs[0].nout, 6);
  TH_CHECK_EQ_INT(g_reqs[1].finish, PR_FINISH_LENGTH);
  TH_CHECK_EQ_INT(g_reqs[2].finish, PR_FINISH_STOP);
  TH_CHECK_EQ_INT(g_reqs[2].stop_token, SCH_FAKE_EOS);
  TH_CHECK_EQ_INT(g_reqs[3].finish, PR_FINISH_LENGTH);
  TH_CHECK_EQ_INT(g_reqs[3].nout, 300);
  env_close(&e, &c);
}

TH_TEST(sched_rejections) {
  struct env e;
  struct client c;
  env_open(&e, &c, 1, NULL, NULL, g_reqs, 4);
  make_req(&g_reqs[0], 1, 500, 100); /* longer than max_model_len 512 */
  make_req(&g_reqs[1], 2, 10, 10);
  g_reqs[1].prompt[3] = SCH_FAKE_VOCAB + 5; /* outside the vocabulary */
  make_req(&g_reqs[2], 3, 10, 200);         /* live, then added again */
  g_reqs[2].ignore_eos = true;
  for (int i = 0; i < 3; i++)
    send_add(&c, &g_reqs[i]);
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
  env_close(&e, &c);
}

/* LoRA adapters: an adapter the workers do not hold, or a frontend whose list is not
 * theirs, is refused; an adapter's prompt is cached apart from the base model's. */
TH_TEST(sched_lora) {
  struct env e;
  struct client c;
  const char *wx[] = {"--loras", "2", NULL};
  env_open(&e, &c, 1, NULL, wx, g_reqs, 6);
  const uint64_t sum = SCH_FAKE_LORA_SUM + 2;
  make_req(&g_reqs[0], 1, 100, 4); /* the base model, then adapter 1 twice, then 2 */
  for (int i = 1; i < 4; i++) {
    g_reqs[i] = g_reqs[0];
    g_reqs[i].id = (uint64_t)i + 1;
    g_reqs[i].lora = i < 3 ? 1 : 2;
    g_reqs[i].lora_sum = sum;
  }
  make_req(&g_reqs[4], 5, 10, 4);
  g_reqs[4].lora = 3; /* not held */
  g_reqs[4].lora_sum = sum;
  make_req(&g_reqs[5], 6, 10, 4);
  g_reqs[5].lora = 1;
  g_reqs[5].lora_sum = sum + 1; /* another list */
  for (int i = 0; i < 6; i++) {
    c.nreqs = i + 1;
    send_add(&c, &g_reqs[i]);
    if (i < 4) wait_done(&c, 10000); /* one after another: each may find the last's blocks */
  }
  wait_done(&c, 10000);
  for (int i = 0; i < 4; i++)
    TH_CHECK_EQ_INT(g_reqs[i].err_code, 0);
  TH_CHECK_EQ_INT(g_reqs[0].n_cached, 0);
  TH_CHECK_EQ_INT(g_reqs[1].n_cached, 0); /* the base model's blocks are not adapter 1's */
  TH_CHECK(g_reqs[2].n_cached >= 64);     /* adapter 1's own */
  TH_CHECK_EQ_INT(g_reqs[3].n_cached, 0);
  TH_CHECK_EQ_INT(g_reqs[4].err_code, CM_ERR_INVAL);
  TH_CHECK(strstr(g_reqs[4].err, "LoRA adapter 3") && strstr(g_reqs[4].err, "hold 2"));
  TH_CHECK_EQ_INT(g_reqs[5].err_code, CM_ERR_INVAL);
  TH_CHECK(strstr(g_reqs[5].err, "not the workers'") != NULL);
  ping(&c);
  TH_CHECK_EQ_INT(c.pong.num_running, 0);
  env_close(&e, &c);
}

TH_TEST(sched_abort_frees_everything) {
  struct env e;
  const char *wx[] = {"--slow-ms", "3", NULL};
  struct client c;
  env_open(&e, &c, 1, NULL, wx, g_reqs, 4);
  send_reqs_ignoring_eos(&c, 4, 10, 40, 400);
  /* wait until every request has produced tokens, then abort them all */
  uint64_t end = cm_time_ns() + 10000000000ull;
  for (;;) {
    int started = 0;
    for (int i = 0; i < 4; i++)
      started += g_reqs[i].nout > 0;
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
  for (int i = 0; i < 4; i++)
    TH_CHECK(!g_reqs[i].done && g_reqs[i].nout < 400);
  /* the scheduler still serves: a new request completes */
  serve_one(&c, 20, 8, 5);
  env_close(&e, &c);
}

TH_TEST(sched_prefix_cache_hits) {
  struct env e;
  struct client c;
  env_open(&e, &c, 1, NULL, NULL, g_reqs, 2);
  serve_one(&c, 1, 100, 10);
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
  env_close(&e, &c);
}

TH_TEST(sched_speculative_decoding) {
  struct env e;
  const char *sx[] = {"--num-speculative-tokens", "3", NULL};
  const char *wx[] = {"--max-draft", "3", NULL};
  struct client c;
  env_open(&e, &c, 1, sx, wx, g_reqs, 8);
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
  env_close(&e, &c);
}

/* --speculative-disable-by-batch-size 2: a request alone drafts; four that run together
 * draft only while fewer than two of them run (a few steps at either end, where the ADDs
 * arrive and where the last ones finish), and give the model's tokens all the same. */
TH_TEST(sched_speculation_off_above_batch_size) {
  struct env e;
  const char *sx[] = {"--num-speculative-tokens", "3", "--speculative-disable-by-batch-size", "2",
                      NULL};
  const char *wx[] = {"--max-draft", "3", NULL};
  struct client c;
  env_open(&e, &c, 1, sx, wx, g_reqs, 5);
  make_req(&g_reqs[0], 1, 20, 80);
  g_reqs[0].ignore_eos = true;
  send_add(&c, &g_reqs[0]);
  wait_done(&c, 20000);
  check_req(&g_reqs[0]);
  ping(&c);
  double alone = (double)c.pong.spec_num_draft_tokens;
  for (int i = 1; i < 5; i++) {
    make_req(&g_reqs[i], 1 + (uint64_t)i, 20, 80);
    g_reqs[i].ignore_eos = true;
    send_add(&c, &g_reqs[i]);
  }
  wait_done(&c, 20000);
  for (int i = 1; i < 5; i++)
    check_req(&g_reqs[i]);
  ping(&c);
  double together = (double)c.pong.spec_num_draft_tokens - alone;
  fprintf(stderr, "draft tokens: %.0f for one request alone, %.0f for four together\n", alone,
          together);
  TH_CHECK(alone >= 30);
  TH_CHECK(together < alone); /* drafting all along, they would draft about 4 x alone */
  TH_CHECK(c.pong.kv_usage == 0);
  env_close(&e, &c);
}

TH_TEST(sched_two_frontends_two_ranks) {
  struct env e;
  struct client c1, c2;
  env_open(&e, &c1, 2, NULL, NULL, g_reqs, 12);
  client_open(&e, &c2, g_reqs2, 12);
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
    for (int i = 0; i < 12; i++)
      done += g_reqs[i].done + g_reqs2[i].done;
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
  client_close(&c2);
  env_close(&e, &c1);
}

static struct treq g_many[256];

/* A full batch: 256 requests running at once over a large pool (and the scheduler's
 * per-step cost, which it logs at exit). */
TH_TEST(sched_batch_256) {
  struct env e;
  const char *sx[] = {"--max-num-seqs", "256", "--max-num-batched-tokens", "4096", NULL};
  const char *wx[] = {"--blocks", "8192", NULL};
  struct client c;
  env_open(&e, &c, 1, sx, wx, g_many, 256);
  th_proc_init(60);
  for (int i = 0; i < 256; i++) {
    make_req(&g_many[i], 1 + (uint64_t)i, 16 + rnd(100), 100);
    g_many[i].ignore_eos = true;
    send_add(&c, &g_many[i]);
  }
  wait_done(&c, 40000);
  for (int i = 0; i < 256; i++)
    check_req(&g_many[i]);
  ping(&c);
  TH_CHECK_EQ_INT(c.pong.generation_tokens, 256 * 100);
  TH_CHECK(c.pong.kv_usage == 0);
  env_close(&e, &c);
}
