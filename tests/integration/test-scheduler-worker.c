/* test-scheduler-worker.c — `lmserve scheduler` with a real `lmserve worker` on a
 * generated tiny Gemma 4 checkpoint, driven by a test frontend: greedy requests run
 * together (chunked prefill, batched decode) produce exactly what `lmserve generate`
 * produces alone, a repeated prompt is served from the prefix cache with the same
 * output, and a seeded random request is reproducible alone and in a batch. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "common/cm-time.h"
#include "tests/harness/th.h"
#include "tests/integration/sch-test-client.h"

#define NGEN 8

static char g_tmp[128];

static void add(struct client *c, struct treq *r, float temperature, bool seeded, uint64_t seed) {
  struct pr_msg m;
  pr_msg_init(&m, PR_ADD);
  m.u.add.request_id = r->id;
  m.u.add.prompt = (struct pr_u32s){r->prompt, r->plen};
  m.u.add.max_tokens = r->max_tokens;
  m.u.add.sampling.temperature = temperature;
  m.u.add.sampling.ignore_eos = true;
  m.u.add.sampling.has_seed = seeded;
  m.u.add.sampling.seed = seed;
  send_msg(c, &m);
}

static void reset(struct treq *r, uint64_t id) {
  r->id = id;
  r->nout = 0;
  r->nouts = 0;
  r->done = false;
  r->err_code = 0;
  r->finish = 0;
}

static struct treq g_reqs[8];

TH_TEST(sched_real_worker_greedy_and_seeded) {
  th_proc_init(280);
  TH_REQUIRE(th_tmpdir("schw", g_tmp, sizeof(g_tmp)) == 0);
  char model[200];
  snprintf(model, sizeof(model), "%s/m4", g_tmp);
  struct th_out o = {0};
  int rc = th_lmserve(&o, 120000, "make-tiny-model", "--arch", "gemma4", "--out", model, "--seed",
                      "1", NULL);
  if (rc) fprintf(stderr, "make-tiny-model: %d %s\n", rc, o.err ? o.err : "");
  th_out_free(&o);
  TH_REQUIRE(rc == 0);

  struct env env;
  memset(&env, 0, sizeof(env));
  env.world = 1;
  snprintf(env.fe, sizeof(env.fe), "ipc://%s/f.sock", g_tmp);
  snprintf(env.we, sizeof(env.we), "ipc://%s/w.sock", g_tmp);
  TH_REQUIRE(th_proc_spawnl(&env.sched, NULL, 0, NULL, th_lmserve_bin(), "scheduler", "--model",
                            model, "--frontend-endpoint", env.fe, "--worker-endpoint", env.we,
                            "--world-size", "1", "--max-num-seqs", "8", "--max-num-batched-tokens",
                            "64", "--enable-prefix-caching", NULL) == 0);
  TH_REQUIRE(th_proc_spawnl(&env.workers[0], NULL, 0, NULL, th_lmserve_bin(), "worker", "--model",
                            model, "--scheduler", env.we, "--rank", "0", "--world-size", "1",
                            TH_TINY_WORKER_ARGS, NULL) == 0);
  env.ctx = zmq_ctx_new();
  struct client c;
  client_open(&env, &c, g_reqs, 4);
  PING_UNTIL(&c, c.pong.workers_ready == 1, 120000);
  TH_CHECK_EQ_INT(c.pong.max_model_len, 8192);

  /* greedy: three prompts (one longer than a step's 64 tokens) together */
  uint32_t plens[3] = {10, 5, 90};
  uint32_t ref[3][NGEN];
  c.nreqs = 3;
  for (int i = 0; i < 3; i++) {
    make_req(&g_reqs[i], 1 + (uint64_t)i, plens[i], NGEN);
    TH_REQUIRE(th_generate(model, g_reqs[i].prompt, (int)g_reqs[i].plen, NGEN, 120000, ref[i]) ==
               NGEN);
    add(&c, &g_reqs[i], 0.0f, false, 0);
  }
  wait_done(&c, 120000);
  for (int i = 0; i < 3; i++) {
    TH_CHECK_EQ_INT(g_reqs[i].err_code, 0);
    TH_CHECK_EQ_INT(g_reqs[i].finish, PR_FINISH_LENGTH);
    TH_CHECK_EQ_INT(g_reqs[i].nout, NGEN);
    TH_CHECK(memcmp(g_reqs[i].out, ref[i], sizeof(ref[i])) == 0);
  }

  /* the long prompt again: prefix-cache hit, same tokens */
  reset(&g_reqs[2], 10);
  c.reqs = &g_reqs[2];
  c.nreqs = 1;
  add(&c, &g_reqs[2], 0.0f, false, 0);
  wait_done(&c, 60000);
  /* whole blocks only, and at least one (how many depends on the sliding group's window) */
  TH_CHECK(g_reqs[2].n_cached >= 16 && g_reqs[2].n_cached % 16 == 0);
  TH_CHECK(memcmp(g_reqs[2].out, ref[2], sizeof(ref[2])) == 0);

  /* seeded sampling: alone, then beside another request, the same tokens */
  make_req(&g_reqs[4], 20, 12, NGEN);
  c.reqs = &g_reqs[4];
  c.nreqs = 1;
  add(&c, &g_reqs[4], 1.0f, true, 1234);
  wait_done(&c, 60000);
  TH_CHECK_EQ_INT(g_reqs[4].nout, NGEN);
  uint32_t first[NGEN];
  memcpy(first, g_reqs[4].out, sizeof(first));
  reset(&g_reqs[4], 21);
  make_req(&g_reqs[5], 22, 40, NGEN);
  c.nreqs = 2;
  add(&c, &g_reqs[5], 1.0f, false, 0);
  add(&c, &g_reqs[4], 1.0f, true, 1234);
  wait_done(&c, 60000);
  TH_CHECK_EQ_INT(g_reqs[4].nout, NGEN);
  TH_CHECK(memcmp(g_reqs[4].out, first, sizeof(first)) == 0);
  TH_CHECK_EQ_INT(g_reqs[5].nout, NGEN);
  ping(&c);
  TH_CHECK_EQ_INT(c.pong.num_running, 0);
  TH_CHECK(c.pong.kv_usage == 0);
  env_close(&env, &c);
}
