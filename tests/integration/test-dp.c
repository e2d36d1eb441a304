/* test-dp.c — data parallelism: two model replicas (a scheduler and a worker
 * each, over tcp:// on loopback) behind one `lmserve frontend` given both
 * --scheduler endpoints. Checks that
 *   - /metrics labels the engine gauges by replica (replica="0", replica="1");
 *   - routing goes by load: with replica 0 busy, a new prompt runs on replica 1
 *     (its running gauge shows it);
 *   - routing goes by prefix affinity: a prompt sent before goes back to the
 *     replica that has its KV blocks even while that one is busier, and the
 *     prefix cache hits it;
 *   - a replica that dies is routed around: /health stays 200, the requests
 *     that follow are served by the other replica, a stream running on the dead
 *     one ends with an error event, and the greedy text is the same;
 *   - every engine-side series carries the replica label, and per replica the
 *     counters and histograms add up to what the clients were told;
 *   - `lmserve serve --data-parallel-size 2` runs two replicas behind its
 *     frontend, and restarts a replica whose worker dies while the other one
 *     keeps serving (/health never leaves 200). */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm-arena.h"
#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-time.h"
#include "proto/pr-zmq.h"
#include "tests/harness/th-http.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

static int http_port;

static int get(const char *path, char **body) {
  return th_http(http_port, "GET", path, NULL, 10000, body);
}

/* The sum of the series of `name` carrying label text `label` (or all series); 0 when
 * there is none. */
static double metric(const char *name, const char *label) {
  char *m = NULL;
  double v = get("/metrics", &m) == 200 && m ? th_metric(m, name, label) : 0;
  free(m);
  return v < 0 ? 0 : v;
}

/* Waits until metric(name, label) >= want (PONGs refresh the gauges twice a second). */
static double metric_wait(const char *name, const char *label, double want, int ms) {
  double v = metric(name, label);
  for (int t = 0; v < want && t < ms; t += 100) {
    usleep(100000);
    v = metric(name, label);
  }
  return v;
}

/* Waits (at most ms) until neither replica's running gauge shows a request:
 * 1 when so. A finished request stays in the gauge until its replica's next
 * PONG. */
static int both_idle(int ms) {
  for (int t = 0;; t += 100) {
    if (metric("lmserve:num_requests_running", "replica=\"0\"") < 1 &&
        metric("lmserve:num_requests_running", "replica=\"1\"") < 1)
      return 1;
    if (t >= ms) return 0;
    usleep(100000);
  }
}

/* A gauge of replica 1, which shows once the frontend has its first PONG
 * (the other series of replica 1 show from the start). */
#define GAUGE_OF_REPLICA_1 "lmserve:num_requests_running{model_name=\"default\",replica=\"1\"}"

/* Waits (at most ms) until /metrics holds `needle`: 1 when it does. */
static int metrics_have(const char *needle, int ms) {
  for (int t = 0;; t += 100) {
    char *m = NULL;
    int ok = get("/metrics", &m) == 200 && m && strstr(m, needle);
    free(m);
    if (ok || t >= ms) return ok;
    usleep(100000);
  }
}

/* /health until it answers 200 (at most 2 minutes): its last status. */
static int wait_health(void) {
  int st = 0;
  for (int i = 0; i < 1200 && st != 200; i++) {
    char *b = NULL;
    st = get("/health", &b);
    free(b);
    if (st != 200) usleep(100000);
  }
  return st;
}

/* A prompt of n ids from seed. */
static void prompt(char *out, size_t size, int n, int seed) {
  int len = snprintf(out, size, "[2");
  for (int i = 1; i < n; i++)
    len +=
        snprintf(out + len, size - (size_t)len, ",%d", 1000 + (seed * 7919 + i * 104729) % 200000);
  snprintf(out + len, size - (size_t)len, "]");
}

/* Starts a streamed completion; the connection's fd. */
static int stream_start(const char *ids, int max_tokens) {
  char body[4096];
  snprintf(
      body, sizeof(body),
      "{\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}",
      ids, max_tokens);
  return th_http_post_open(http_port, "/v1/completions", body);
}

/* Waits (at most ms) until the stream on fd has sent its first token, without
 * consuming it: 1 when it has. A stream with no output yet is not bound to its
 * replica (were that one to fail, the frontend would send it to another), so the
 * checks that kill a replica wait for this first. */
static int stream_has_output(int fd, int ms) {
  static char buf[1 << 16];
  for (int t = 0; t <= ms; t += 20) {
    ssize_t k = recv(fd, buf, sizeof(buf) - 1, MSG_PEEK | MSG_DONTWAIT);
    if (k > 0) {
      buf[k] = 0;
      if (strstr(buf, "\ndata: {")) return 1;
    }
    usleep(20000);
  }
  return 0;
}

/* A greedy completion's text (NULL on failure; free it). */
static char *complete(const char *ids, int max_tokens) {
  char body[4096], *out = NULL;
  snprintf(body, sizeof(body), "{\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0}", ids,
           max_tokens);
  int st = th_http(http_port, "POST", "/v1/completions", body, 60000, &out);
  char *text = NULL;
  json_t *j = st == 200 && out ? json_loads(out, 0, NULL) : NULL;
  json_t *t = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text");
  if (json_is_string(t)) text = strdup(json_string_value(t));
  json_decref(j);
  free(out);
  return text;
}

struct replica {
  struct th_proc sched, worker;
  char fe_ep[64], wk_ep[64];
};

static void replica_start(struct replica *r, const char *model) {
  int p1 = th_free_port(), p2 = th_free_port();
  TH_REQUIRE(p1 > 0 && p2 > 0 && p1 != p2);
  snprintf(r->fe_ep, sizeof(r->fe_ep), "tcp://127.0.0.1:%d", p1);
  snprintf(r->wk_ep, sizeof(r->wk_ep), "tcp://127.0.0.1:%d", p2);
  static char *env[] = {"LMSERVE_DEVICE=cpu", NULL};
  TH_REQUIRE(th_proc_spawnl(&r->sched, NULL, 0, NULL, th_lmserve_bin(), "scheduler", "--model",
                            model, "--frontend-endpoint", r->fe_ep, "--worker-endpoint", r->wk_ep,
                            "--world-size", "1", NULL) == 0);
  TH_REQUIRE(th_proc_spawnl(&r->worker, env, 0, NULL, th_lmserve_bin(), "worker", "--model", model,
                            "--scheduler", r->wk_ep, "--rank", "0", "--world-size", "1",
                            "--kv-cache-memory", "64M", "--threads", "1", NULL) == 0);
}

/* Waits (at most 2 minutes) until r's scheduler answers a PING with all its
 * worker ranks ready. The frontend's /health is 200 as soon as one replica is
 * ready; the routing checks below need both. */
static void replica_wait_ready(struct replica *r) {
  void *ctx = zmq_ctx_new();
  struct pr_sock *s = NULL;
  struct cm_arena a;
  cm_arena_init(&a, 1 << 12, 1 << 20);
  TH_REQUIRE(ctx && pr_sock_open(ctx, ZMQ_DEALER, 0, &s) == 0 && pr_sock_connect(s, r->fe_ep) == 0);
  int ready = 0;
  uint64_t nonce = 0, end = cm_time_ns() + 120000000000ull;
  while (!ready && cm_time_ns() < end) {
    struct pr_msg m;
    pr_msg_init(&m, PR_PING);
    m.u.ping.nonce = ++nonce;
    m.u.ping.send_ns = cm_time_wall_ns();
    (void)pr_sock_send(s, NULL, &m, PR_DONTWAIT);
    uint64_t wait_end = cm_time_ns() + 200000000ull;
    while (!ready && cm_time_ns() < wait_end) {
      cm_arena_reset(&a);
      int rc = pr_sock_recv(s, NULL, &m, &a, PR_DONTWAIT);
      if (rc == CM_ERR_AGAIN) {
        usleep(10000);
        continue;
      }
      ready = rc == 0 && m.type == PR_PONG && m.u.pong.world_size > 0 &&
              m.u.pong.workers_ready == m.u.pong.world_size;
    }
  }
  pr_sock_close(s);
  cm_arena_free(&a);
  zmq_ctx_term(ctx);
  if (!ready) {
    th_fail(__FILE__, __LINE__, "the replica at %s was not ready in 2 minutes", r->fe_ep);
    th_stop();
  }
}

/* Two replicas (a scheduler and a worker each) and a frontend routing over
 * both on http_port; returns once both replicas are ready and /health is 200. */
static void two_replicas_start(struct replica rep[2], struct th_proc *fe, const char *model) {
  for (int i = 0; i < 2; i++)
    replica_start(&rep[i], model);
  http_port = th_free_port();
  TH_REQUIRE(http_port > 0);
  char port_s[16];
  snprintf(port_s, sizeof(port_s), "%d", http_port);
  TH_REQUIRE(th_proc_spawnl(fe, NULL, 0, NULL, th_lmserve_bin(), "frontend", "--model", model,
                            "--served-model-name", "default", "--scheduler", rep[0].fe_ep,
                            "--scheduler", rep[1].fe_ep, "--host", "127.0.0.1", "--port", port_s,
                            "--drain-timeout", "2", NULL) == 0);
  for (int i = 0; i < 2; i++)
    replica_wait_ready(&rep[i]);
  TH_REQUIRE(wait_health() == 200);
  /* the frontend has heard from both (its PINGs go out five times a second) */
  TH_REQUIRE(metrics_have(GAUGE_OF_REPLICA_1, 10000));
}

/* SIGTERM to the frontend (it must exit 0), then the replicas stop. */
static void two_replicas_stop(struct replica rep[2], struct th_proc *fe) {
  th_proc_check_exit(fe, SIGTERM, 30000);
  for (int i = 0; i < 2; i++) {
    th_proc_stop(&rep[i].sched, 5000);
    th_proc_stop(&rep[i].worker, 5000);
  }
}

TH_TEST(dp_two_replicas) {
  th_proc_init(400);
  char model[300];
  th_tiny_gemma4_or_skip("dp", 5, model, sizeof(model));
  char ids_x[2048], ids_y[2048], ids_y2[2048], ids_z[2048], ids_w[2048];
  prompt(ids_x, sizeof ids_x, 64, 1);
  prompt(ids_y, sizeof ids_y, 20, 2);
  /* Y2: Y and more, so that Y's prefix sends it where Y went */
  snprintf(ids_y2, sizeof ids_y2, "%.*s,777,778,779]", (int)strlen(ids_y) - 1, ids_y);
  prompt(ids_z, sizeof ids_z, 20, 3);
  prompt(ids_w, sizeof ids_w, 20, 4);

  static struct replica rep[2];
  struct th_proc fe;
  two_replicas_start(rep, &fe, model);

  char *m = NULL;
  TH_REQUIRE(get("/metrics", &m) == 200);
  TH_CHECK(m && strstr(m, "lmserve:num_requests_running{") && strstr(m, "replica=\"0\""));
  free(m);

  /* X goes to replica 0 (both idle: the first); its blocks are cached there */
  char *x1 = complete(ids_x, 4);
  TH_REQUIRE(x1 != NULL);
  /* X's finish reported: a running gauge below then shows Y alone, not X late */
  TH_REQUIRE(both_idle(15000));
  /* a long stream Y goes to the idler replica: replica 0 on a tie, replica 1 when
   * replica 0's load report counts X's cached KV blocks */
  int fy = stream_start(ids_y, 8000), ry = -1;
  for (int t = 0; t < 15000 && ry < 0; t += 100) {
    if (metric("lmserve:num_requests_running", "replica=\"0\"") >= 1)
      ry = 0;
    else if (metric("lmserve:num_requests_running", "replica=\"1\"") >= 1)
      ry = 1;
    else
      usleep(100000);
  }
  TH_REQUIRE(ry >= 0);
  char ly[16], lz[16];
  snprintf(ly, sizeof ly, "replica=\"%d\"", ry);
  snprintf(lz, sizeof lz, "replica=\"%d\"", 1 - ry);
  /* by load: a long stream Z goes to the other, idle replica */
  int fz = stream_start(ids_z, 8000);
  TH_CHECK(metric_wait("lmserve:num_requests_running", lz, 1, 15000) >= 1);
  TH_CHECK(stream_has_output(fz, 30000));
  /* a third stream with Y's prefix: affinity sends it where Y went (2 running there,
   * 1 on the other) */
  int fy2 = stream_start(ids_y2, 8000);
  /* (the gauges follow the PONGs, which a loaded machine under the sanitizers
   * can hold back for seconds) */
  if (metric_wait("lmserve:num_requests_running", ly, 2, 15000) < 2)
    th_fail(__FILE__, __LINE__,
            "Y2 did not join Y on replica %d: running %g there, %g on the other", ry,
            metric("lmserve:num_requests_running", ly), metric("lmserve:num_requests_running", lz));
  /* by affinity: X again goes back to replica 0 (when Y went there too, the busier one,
   * but within the slack), and hits the prefix cache there */
  double hits0 = metric("lmserve:prefix_cache_hits_total", NULL);
  char *x2 = complete(ids_x, 4);
  TH_CHECK(x2 && !strcmp(x1, x2));
  double hits1 = metric_wait("lmserve:prefix_cache_hits_total", NULL, hits0 + 48, 15000);
  if (!(hits1 >= hits0 + 48))
    th_fail(__FILE__, __LINE__, "X's prefix did not hit the cache (%g -> %g tokens)", hits0, hits1);
  free(x2);

  /* replica 1 dies: its streams (Z, or Y and Y2) end with an error; the rest goes to
   * replica 0 */
  th_proc_signal(&rep[1].sched, SIGKILL);
  int dead[2] = {ry == 1 ? fy : fz, ry == 1 ? fy2 : -1};
  for (int k = 0; k < 2; k++) {
    if (dead[k] < 0) continue;
    char *zb = NULL;
    int zst = th_http_read(dead[k], 20000, &zb);
    TH_CHECK_EQ_INT(zst, 200);
    TH_CHECK(zb && strstr(zb, "\"error\""));
    free(zb);
  }
  char *hb = NULL;
  TH_CHECK_EQ_INT(get("/health", &hb), 200);
  free(hb);
  for (int i = 0; i < 3; i++) {
    char *w = complete(ids_w, 4);
    TH_CHECK(w != NULL);
    free(w);
  }
  char *x3 = complete(ids_x, 4);
  TH_CHECK(x3 && !strcmp(x1, x3));
  free(x3);
  free(x1);
  close(fy);
  close(fy2);
  close(fz);

  two_replicas_stop(rep, &fe);
}

/* ---- metrics per replica ---------------------------------------------------- */

/* A greedy completion of max_tokens (ignore_eos) and its usage: 0 or -1. */
static int complete_usage(const char *ids, int max_tokens, long long *prompt, long long *gen) {
  char body[4096], *out = NULL;
  snprintf(body, sizeof(body),
           "{\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true}", ids,
           max_tokens);
  int st = th_http(http_port, "POST", "/v1/completions", body, 60000, &out);
  json_t *j = st == 200 && out ? json_loads(out, 0, NULL) : NULL;
  json_t *u = json_object_get(j, "usage");
  int rc = u ? 0 : -1;
  *prompt = json_integer_value(json_object_get(u, "prompt_tokens"));
  *gen = json_integer_value(json_object_get(u, "completion_tokens"));
  json_decref(j);
  free(out);
  return rc;
}

/* Every histogram series in the text is whole: buckets never fall, the +Inf
 * bucket is its _count, a _sum is there. Returns the series checked. */
static int check_histograms(const char *text) {
  int series = 0;
  for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
    const char *inf = strstr(l, ",le=\"+Inf\"} ");
    const char *eol = l + strcspn(l, "\n");
    if (*l == '#' || !inf || inf > eol) continue;
    const char *us = strstr(l, "_bucket{");
    TH_REQUIRE(us && us < inf);
    char name[160], labels[256], key[600];
    snprintf(name, sizeof(name), "%.*s", (int)(us - l), l);
    snprintf(labels, sizeof(labels), "%.*s", (int)(inf - (us + 8)), us + 8);
    double inf_v = strtod(inf + 12, NULL), prev = 0;
    /* the buckets of this series, in order */
    snprintf(key, sizeof(key), "%s_bucket{%s,le=", name, labels);
    for (const char *b = text; (b = strstr(b, key)); b++) {
      double v = strtod(strstr(b, "} ") + 2, NULL);
      if (v < prev) th_fail(__FILE__, __LINE__, "%s{%s}: a bucket falls", name, labels);
      prev = v;
    }
    snprintf(key, sizeof(key), "%s_count{%s} ", name, labels);
    const char *c = strstr(text, key);
    TH_CHECK(c != NULL);
    if (c && strtod(c + strlen(key), NULL) != inf_v)
      th_fail(__FILE__, __LINE__, "%s{%s}: +Inf bucket %g, count %g", name, labels, inf_v,
              strtod(c + strlen(key), NULL));
    snprintf(key, sizeof(key), "%s_sum{%s} ", name, labels);
    TH_CHECK(strstr(text, key) != NULL);
    series++;
  }
  return series;
}

/* Every engine-side series of /metrics: first those with one observation
 * per finished request, then the other counters. */
static const char *const engine_series[] = {
    "lmserve:request_success_total",
    "lmserve:time_to_first_token_seconds_count",
    "lmserve:e2e_request_latency_seconds_count",
    "lmserve:request_queue_time_seconds_count",
    "lmserve:request_prefill_time_seconds_count",
    "lmserve:request_decode_time_seconds_count",
    "lmserve:request_inference_time_seconds_count",
    "lmserve:request_prompt_tokens_count",
    "lmserve:request_generation_tokens_count",
    "lmserve:request_params_max_tokens_count",
    "lmserve:inter_token_latency_seconds_count",
    "lmserve:prompt_tokens_total",
    "lmserve:generation_tokens_total",
    "lmserve:prefix_cache_queries_total",
    "lmserve:prefix_cache_hits_total",
    "lmserve:num_preemptions_total",
    "lmserve:spec_decode_num_drafts_total",
    "lmserve:spec_decode_num_draft_tokens_total",
    "lmserve:spec_decode_num_accepted_tokens_total",
};
#define PER_REQUEST 10 /* engine_series[0, 10): one per request */

/* Two replicas serve requests; every engine-side series carries replica="0"
 * and replica="1", and per replica they add up to what the clients were
 * told (usage) and to each other: token counters, request_success by finish
 * reason, and every request histogram's count and sum. */
TH_TEST(dp_metrics_per_replica) {
  th_proc_init(400);
  char model[300];
  th_tiny_gemma4_or_skip("dp-metrics", 5, model, sizeof(model));
  static struct replica rep[2];
  struct th_proc fe;
  two_replicas_start(rep, &fe, model);

  /* a long stream holds one replica; the completions meanwhile go to the other.
   * LONG tokens outlast the three completions' ~25 steps many times over, and
   * take seconds here but minutes on a loaded machine under the sanitizers */
  enum { LONG = 400 };
  long long prompt_sum = 0, gen_sum = 0, max_sum = 0;
  int n_req = 0;
  char ids[2048];
  prompt(ids, sizeof ids, 30, 11);
  int fa = stream_start(ids, LONG);
  TH_CHECK(metric_wait("lmserve:num_requests_running", NULL, 1, 10000) >= 1);
  for (int k = 0; k < 3; k++) {
    char other[2048];
    prompt(other, sizeof other, 12 + 5 * k, 20 + k);
    long long p = 0, g = 0;
    TH_CHECK(complete_usage(other, 6 + k, &p, &g) == 0);
    TH_CHECK_EQ_INT((int)g, 6 + k);
    prompt_sum += p, gen_sum += g, max_sum += 6 + k, n_req++;
  }
  char *sb = NULL;
  TH_CHECK_EQ_INT(th_http_read(fa, 60000, &sb), 200);
  TH_CHECK(sb && strstr(sb, "[DONE]"));
  free(sb);
  close(fa);
  prompt_sum += 30, gen_sum += LONG, max_sum += LONG, n_req++;
  /* and two more once both are idle */
  for (int k = 0; k < 2; k++) {
    char other[2048];
    prompt(other, sizeof other, 16, 40 + k);
    long long p = 0, g = 0;
    TH_CHECK(complete_usage(other, 5, &p, &g) == 0);
    prompt_sum += p, gen_sum += g, max_sum += 5, n_req++;
  }

  /* the PONG-fed counters (prefix cache, preemptions) settle within a PONG */
  usleep(1500 * 1000);
  char *m = NULL;
  TH_REQUIRE(get("/metrics", &m) == 200 && m);

  for (size_t f = 0; f < CM_ARRAY_LEN(engine_series); f++)
    for (int r = 0; r < 2; r++) {
      char want[200];
      snprintf(want, sizeof(want), "%s{model_name=\"default\",replica=\"%d\"", engine_series[f], r);
      if (!strstr(m, want)) th_fail(__FILE__, __LINE__, "/metrics lacks %s", want);
    }
  /* not a single unlabelled engine-side series */
  TH_CHECK(!strstr(m, "lmserve:prompt_tokens_total{model_name=\"default\"}"));
  TH_CHECK(check_histograms(m) >= 2 * 10);
  free(m);

  /* per replica, then summed: what the clients were told */
  const char *rl[2] = {"replica=\"0\"", "replica=\"1\""};
  double req[2], total_req = 0;
  for (int r = 0; r < 2; r++) {
    req[r] = metric("lmserve:e2e_request_latency_seconds_count", rl[r]);
    total_req += req[r];
    TH_CHECK(req[r] >= 1); /* both replicas served */
    /* within a replica: one observation per request in every histogram */
    for (size_t k = 0; k < PER_REQUEST; k++) {
      double v = metric(engine_series[k], rl[r]);
      if (v != req[r])
        th_fail(__FILE__, __LINE__, "replica %d: %s is %g, %g requests", r, engine_series[k], v,
                req[r]);
    }
    TH_CHECK(metric("lmserve:request_prompt_tokens_sum", rl[r]) ==
             metric("lmserve:prompt_tokens_total", rl[r]));
    TH_CHECK(metric("lmserve:request_generation_tokens_sum", rl[r]) ==
             metric("lmserve:generation_tokens_total", rl[r]));
    TH_CHECK(metric("lmserve:prefix_cache_queries_total", rl[r]) >=
             metric("lmserve:prompt_tokens_total", rl[r]));
    TH_CHECK(metric("lmserve:prefix_cache_hits_total", rl[r]) <=
             metric("lmserve:prefix_cache_queries_total", rl[r]));
  }
  TH_CHECK_EQ_INT((int)total_req, n_req);
  TH_CHECK_EQ_INT((int)metric("lmserve:request_success_total", "finished_reason=\"length\""),
                  n_req);
  TH_CHECK_EQ_INT((int)metric("lmserve:request_success_total", "finished_reason=\"stop\""), 0);
  TH_CHECK_EQ_INT((int)metric("lmserve:prompt_tokens_total", NULL), (int)prompt_sum);
  TH_CHECK_EQ_INT((int)metric("lmserve:generation_tokens_total", NULL), (int)gen_sum);
  TH_CHECK_EQ_INT((int)metric("lmserve:request_prompt_tokens_sum", NULL), (int)prompt_sum);
  TH_CHECK_EQ_INT((int)metric("lmserve:request_generation_tokens_sum", NULL), (int)gen_sum);
  TH_CHECK_EQ_INT((int)metric("lmserve:request_params_max_tokens_sum", NULL), (int)max_sum);
  TH_CHECK_EQ_INT((int)metric("lmserve:num_preemptions_total", NULL), 0);
  /* the stream's decode (LONG tokens) took time; every queue/prefill time is sane */
  TH_CHECK(metric("lmserve:request_decode_time_seconds_sum", NULL) > 0);
  double q = metric("lmserve:request_queue_time_seconds_sum", NULL);
  double pf = metric("lmserve:request_prefill_time_seconds_sum", NULL);
  TH_CHECK(q >= 0 && q < 60 && pf > 0 && pf < 60);
  TH_CHECK(metric("lmserve:e2e_request_latency_seconds_sum", NULL) >=
           metric("lmserve:request_decode_time_seconds_sum", NULL));

  two_replicas_stop(rep, &fe);
}

/* The pid of serve's child running `lmserve <role>` whose command line holds
 * `needle`, or -1 (the role is the first argument: a scheduler's command line
 * names the workers' endpoint too). */
static int child_with(int parent, const char *role, const char *needle) {
  char want[64];
  snprintf(want, sizeof(want), "lmserve %s ", role);
  /* one scan of /proc once missed a worker that was serving (under a loaded
   * machine): look again for up to a second before saying there is none */
  int pid = -1;
  for (int i = 0; i < 20 && pid <= 0; i++) {
    if (i) usleep(50000);
    pid = th_pid_with(parent, want, needle, NULL);
  }
  return pid;
}

TH_TEST(dp_serve_restarts_one_replica) {
  th_proc_init(300);
  char model[300];
  th_tiny_gemma4_or_skip("dp", 5, model, sizeof(model));
  http_port = th_free_port();
  TH_REQUIRE(http_port > 0);
  char port_s[16];
  snprintf(port_s, sizeof(port_s), "%d", http_port);
  static char *env[] = {"LMSERVE_DEVICE=cpu", NULL};
  struct th_proc s;
  TH_REQUIRE(th_proc_spawnl(&s, env, 0, NULL, th_lmserve_bin(), "serve", "--model", model, "--port",
                            port_s, "--served-model-name", "default", "--data-parallel-size", "2",
                            "--kv-cache-memory", "32M", "--threads", "1", "--drain-timeout", "2",
                            NULL) == 0);
  TH_REQUIRE(wait_health() == 200);
  char ids[2048];
  prompt(ids, sizeof ids, 20, 9);
  char *t0 = complete(ids, 4);
  TH_REQUIRE(t0 != NULL);
  /* both replicas report: their gauges are labelled 0 and 1 */
  TH_CHECK(metrics_have(GAUGE_OF_REPLICA_1, 15000));
  char *m = NULL;
  TH_REQUIRE(get("/metrics", &m) == 200);
  TH_CHECK(m && strstr(m, GAUGE_OF_REPLICA_1));
  free(m);
  int w1 = child_with((int)s.pid, "worker", "workers-1"),
      w0 = child_with((int)s.pid, "worker", "workers-0");
  TH_REQUIRE(w1 > 0 && w0 > 0);
  TH_REQUIRE(kill(w1, SIGKILL) == 0);
  /* replica 0 serves throughout; replica 1 comes back with a new worker */
  int w1b = 0;
  for (uint64_t end = cm_time_ns() + 60000000000ull;
       cm_time_ns() < end && !(w1b > 0 && w1b != w1);) {
    char *b = NULL;
    int h = get("/health", &b);
    free(b);
    TH_CHECK_EQ_INT(h, 200);
    char *t = complete(ids, 4);
    TH_CHECK(t && !strcmp(t, t0));
    free(t);
    usleep(100000);
    w1b = child_with((int)s.pid, "worker", "workers-1");
  }
  TH_CHECK(w1b > 0 && w1b != w1);
  TH_CHECK_EQ_INT(child_with((int)s.pid, "worker", "workers-0"), w0); /* untouched */
  free(t0);
  th_proc_check_exit(&s, SIGTERM, 30000);
}
