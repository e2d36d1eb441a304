/* test-scheduler-faults.c — the `lmserve scheduler` process when things go wrong: a
 * worker killed mid-generation (heartbeat timeout: running requests get ERR, PONG shows
 * the rank missing, a new worker restores service), a worker's FAIL, and garbage or
 * misdirected messages on both sockets. */
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

static struct treq g_reqs[MAXR];

TH_TEST(sched_worker_death_and_recovery) {
  struct env e;
  const char *wx[] = {"--slow-ms", "3", NULL};
  struct client c;
  env_open(&e, &c, 1, NULL, wx, g_reqs, 3);
  send_reqs_ignoring_eos(&c, 3, 1, 30, 400);
  while (g_reqs[0].nout == 0)
    pump(&c, 100);
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
  serve_one(&c, 51, 30, 20);
  env_close(&e, &c);
}

TH_TEST(sched_worker_fail_message) {
  struct env e;
  const char *wx[] = {"--fail-at-step", "5", NULL};
  struct client c;
  env_open(&e, &c, 1, NULL, wx, g_reqs, 2);
  send_reqs_ignoring_eos(&c, 1, 1, 10, 100);
  wait_done(&c, 10000);
  TH_CHECK_EQ_INT(g_reqs[0].err_code, CM_ERR_STATE);
  TH_CHECK(strstr(g_reqs[0].err, "worker rank 0 failed: injected failure") != NULL);
  ping(&c);
  TH_CHECK_EQ_INT(c.pong.workers_ready, 0);
  env_close(&e, &c);
}

/* Raw frames on a socket, bypassing the codec. */
static void send_raw(void *zs, const void *a, size_t na, const void *b, size_t nb) {
  zmq_send(zs, a, na, b ? ZMQ_SNDMORE : 0);
  if (b) zmq_send(zs, b, nb, 0);
}

TH_TEST(sched_garbage_on_both_sockets) {
  struct env e;
  struct client c;
  env_open(&e, &c, 1, NULL, NULL, g_reqs, 1);
  struct pr_sock *gf, *gw;
  TH_REQUIRE(pr_sock_open(e.ctx, ZMQ_DEALER, 0, &gf) == 0);
  TH_REQUIRE(pr_sock_open(e.ctx, ZMQ_DEALER, 0, &gw) == 0);
  TH_REQUIRE(pr_sock_connect(gf, e.fe) == 0);
  TH_REQUIRE(pr_sock_connect(gw, e.we) == 0);
  uint8_t hdr_add[2] = {PR_ADD, PR_VERSION}, hdr_bad[2] = {200, PR_VERSION};
  uint8_t hdr_old[2] = {PR_PING, 99}, hdr_step[2] = {PR_STEP, PR_VERSION};
  uint8_t hdr_res[2] = {PR_RESULT, PR_VERSION}, hdr_ready[2] = {PR_READY, PR_VERSION};
  uint8_t bomb[] = {0xdd, 0xff, 0xff, 0xff, 0xff}, junk[64];
  for (int i = 0; i < 64; i++)
    junk[i] = (uint8_t)rnd(256);
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
  serve_one(&c, 9, 12, 15);
  env_close(&e, &c);
}

TH_TEST(sched_frontend_gone) {
  struct env e;
  const char *wx[] = {"--slow-ms", "2", NULL};
  static struct treq gone[4];
  struct client c, g;
  env_open(&e, &c, 1, NULL, wx, g_reqs, 1);
  client_open(&e, &g, gone, 4);
  send_reqs_ignoring_eos(&g, 4, 1, 20, 400);
  while (gone[3].nout == 0)
    pump(&g, 100);
  /* the frontend vanishes without ABORT: its OUTs cannot be delivered, so the
   * scheduler aborts its requests and frees their blocks */
  client_close(&g);
  PING_UNTIL(&c, c.pong.num_running == 0 && c.pong.kv_usage == 0, 10000);
  serve_one(&c, 1, 20, 10); /* the same id from another frontend is fine */
  env_close(&e, &c);
}

TH_TEST(sched_cli_errors) {
  th_proc_init(30);
  struct th_out o = {0};
  TH_CHECK_EQ_INT(th_lmserve(&o, 10000, "scheduler", "--help", NULL), 0);
  TH_CHECK(o.out && strstr(o.out, "--worker-endpoint") && strstr(o.out, "--enable-prefix-caching"));
  TH_CHECK_EQ_INT(th_lmserve(&o, 10000, "scheduler", "--world-size", "1", NULL), 2);
  TH_CHECK(o.err && strstr(o.err, "--frontend-endpoint") != NULL);
  TH_CHECK_EQ_INT(th_lmserve(&o, 10000, "scheduler", "--frontend-endpoint", "ipc:///tmp/x-f.sock",
                             "--worker-endpoint", "ipc:///tmp/x-w.sock", "--world-size", "0", NULL),
                  2);
  TH_CHECK(o.err && strstr(o.err, "world-size") != NULL);
  TH_CHECK_EQ_INT(th_lmserve(&o, 10000, "scheduler", "--frontend-endpoint", "no/slashes",
                             "--worker-endpoint", "w", NULL),
                  2);
  /* an endpoint that cannot be bound: exit 1 with a message, no crash */
  TH_CHECK_EQ_INT(th_lmserve(&o, 10000, "scheduler", "--frontend-endpoint", "tcp://256.1.1.1:5",
                             "--worker-endpoint", "ipc:///tmp/lmserve-schtest-nobind-w.sock", NULL),
                  1);
  TH_CHECK(o.err && strstr(o.err, "cannot bind") != NULL);
  th_out_free(&o);
}

/* Bare endpoint names become ipc sockets in the runtime directory. */
TH_TEST(sched_bare_endpoint_names) {
  th_proc_init(30);
  char dir[64], fe[120], we[120], envv[100];
  snprintf(dir, sizeof(dir), "/tmp/lmserve-schtest-rt-%d", (int)getpid());
  snprintf(envv, sizeof(envv), "LMSERVE_RUNTIME_DIR=%s", dir);
  snprintf(fe, sizeof(fe), "ipc://%s/front.sock", dir);
  snprintf(we, sizeof(we), "ipc://%s/work.sock", dir);
  char *argv[] = {
      th_lmserve_bin(), "scheduler", "--frontend-endpoint", "front", "--worker-endpoint",
      "work",           NULL};
  char *envp[] = {envv, NULL};
  struct env e;
  memset(&e, 0, sizeof(e));
  e.world = 1;
  snprintf(e.fe, sizeof(e.fe), "%s", fe);
  snprintf(e.we, sizeof(e.we), "%s", we);
  TH_REQUIRE(th_proc_spawn(&e.sched, argv, envp, 0) == 0);
  start_worker(&e, 0, NULL);
  e.ctx = zmq_ctx_new();
  struct client c;
  client_open(&e, &c, g_reqs, 1);
  PING_UNTIL(&c, c.pong.workers_ready == 1, 10000);
  serve_one(&c, 1, 9, 9);
  env_close(&e, &c);
  unlink(fe + 6);
  unlink(we + 6);
  rmdir(dir);
}
