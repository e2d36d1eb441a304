/* test-cluster.c — the three roles run alone, as deploy/docker-compose.yml
 * places them: `lmserve frontend`, `lmserve scheduler` and `lmserve worker`
 * as separate processes talking ZeroMQ over tcp:// (loopback here, the
 * compose network there), started in the worst order (frontend first,
 * scheduler last). Checks that /health is 503 until the scheduler and its
 * worker answer, then 200; that a greedy completion through the cluster
 * equals `lmserve generate`; that a worker sized smaller than the
 * scheduler's limits (left at their defaults) still serves a burst of
 * concurrent requests, because the scheduler plans within what the worker's
 * READY says it takes; and that SIGTERM stops every role cleanly. */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/test-http-client.h"

/* n distinct loopback ports nobody listens on right now. */
static int free_ports(int *ports, int n) {
  for (int i = 0; i < n; i++) {
    int again = 1;
    for (int tries = 0; again && tries < 20; tries++) {
      ports[i] = th_free_port();
      again = ports[i] <= 0;
      for (int k = 0; k < i; k++)
        again |= ports[k] == ports[i];
    }
    if (again) return -1;
  }
  return 0;
}

static int health(int port) {
  static struct resp r;
  return hc_request(port, GET("/health", ""), &r) == 0 ? r.status : -1;
}

TH_TEST(cluster_over_tcp) {
  th_proc_init(280);
  char model[300];
  th_tiny_gemma4_or_skip("cluster", 5, model, sizeof(model));
  char ids[512];
  th_generate_ids(model, "2,818,5279,563", "6", ids, sizeof(ids));

  int ports[3];
  TH_REQUIRE(free_ports(ports, 3) == 0);
  char http_s[16], fe_ep[64], wk_ep[64];
  snprintf(http_s, sizeof(http_s), "%d", ports[0]);
  snprintf(fe_ep, sizeof(fe_ep), "tcp://127.0.0.1:%d", ports[1]);
  snprintf(wk_ep, sizeof(wk_ep), "tcp://127.0.0.1:%d", ports[2]);

  /* the frontend first: it serves 503 until a scheduler answers */
  struct th_proc pf, pw, ps;
  TH_REQUIRE(th_proc_spawnl(&pf, NULL, 1, NULL, th_lmserve_bin(), "frontend", "--model", model,
                            "--scheduler", fe_ep, "--host", "127.0.0.1", "--port", http_s,
                            "--drain-timeout", "5", "--disable-access-log", NULL) == 0);
  TH_REQUIRE(th_proc_wait_output(&pf, "listening on", 60000) == 0);
  TH_CHECK_EQ_INT(health(ports[0]), 503);

  /* the worker connects to a scheduler that does not exist yet */
  TH_REQUIRE(th_proc_spawnl(&pw, NULL, 0, NULL, th_lmserve_bin(), "worker", "--model", model,
                            "--scheduler", wk_ep, "--rank", "0", "--world-size", "1",
                            "--max-num-seqs", "3", "--max-num-batched-tokens", "48",
                            "--kv-cache-memory", "64M", "--threads", "1", NULL) == 0);
  /* the scheduler keeps its default limits (256 sequences, 8192 tokens) */
  TH_REQUIRE(th_proc_spawnl(&ps, NULL, 0, NULL, th_lmserve_bin(), "scheduler", "--model", model,
                            "--frontend-endpoint", fe_ep, "--worker-endpoint", wk_ep,
                            "--world-size", "1", NULL) == 0);

  int st = -1;
  for (int i = 0; i < 1200 && (st = health(ports[0])) != 200; i++)
    usleep(100000);
  TH_REQUIRE(st == 200);

  /* greedy through the cluster == generate */
  char body[1024], req[1400];
  snprintf(body, sizeof(body), "{\"tokens\":[%s]}", ids);
  hc_post(req, sizeof(req), "/detokenize", body);
  static struct resp r;
  TH_REQUIRE(hc_request(ports[0], req, &r) == 0 && r.status == 200);
  json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
  char want[1024] = "";
  json_t *pr = json_object_get(j, "prompt");
  if (json_is_string(pr)) snprintf(want, sizeof(want), "%s", json_string_value(pr));
  json_decref(j);
  TH_CHECK(want[0] != 0);
  hc_post(req, sizeof(req), "/v1/completions",
          "{\"prompt\":[2,818,5279,563],\"max_tokens\":6,\"temperature\":0}");
  TH_REQUIRE(hc_request(ports[0], req, &r) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  j = json_loadb(r.body, r.body_len, 0, NULL);
  json_t *text = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text");
  TH_CHECK_EQ_STR(json_is_string(text) ? json_string_value(text) : "(none)", want);
  json_decref(j);

  /* a burst larger than the worker's step: 8 requests of ~40 prompt tokens
   * against 3 sequences and 48 tokens per step */
  enum { BURST = 8 };
  static struct conn cs[BURST];
  char prompt[512];
  int pl = snprintf(prompt, sizeof(prompt), "[2");
  for (int i = 0; i < 40; i++)
    pl += snprintf(prompt + pl, sizeof(prompt) - (size_t)pl, ",%d", 1000 + 37 * i);
  snprintf(prompt + pl, sizeof(prompt) - (size_t)pl, "]");
  for (int i = 0; i < BURST; i++) {
    snprintf(body, sizeof(body), "{\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0}", prompt,
             4 + i);
    hc_post(req, sizeof(req), "/v1/completions", body);
    TH_REQUIRE(hc_conn_open(&cs[i], ports[0]) == 0);
    TH_REQUIRE(hc_send_str(&cs[i], req) == 0);
  }
  for (int i = 0; i < BURST; i++) {
    TH_CHECK(hc_read_resp(&cs[i], &r, 60000) == 0);
    TH_CHECK_EQ_INT(r.status, 200);
    j = json_loadb(r.body, r.body_len, 0, NULL);
    json_t *u = json_object_get(json_object_get(j, "usage"), "completion_tokens");
    TH_CHECK_EQ_INT(json_integer_value(u), 4 + i);
    json_decref(j);
    hc_conn_close(&cs[i]);
  }
  TH_CHECK_EQ_INT(health(ports[0]), 200);

  /* each role stops on SIGTERM by itself */
  struct th_proc *roles[] = {&pf, &ps, &pw};
  for (int i = 0; i < 3; i++) {
    th_proc_signal(roles[i], SIGTERM);
    TH_CHECK_EQ_INT(th_proc_wait(roles[i], 30000), 0);
    TH_CHECK(roles[i]->exited && WIFEXITED(roles[i]->status));
    th_proc_stop(roles[i], 1000);
  }
}
