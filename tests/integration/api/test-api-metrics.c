/* test-api-metrics.c — the engine's state as `lmserve serve` reports it in
 * /metrics, on a tiny Gemma 4 with a small KV cache (so that one request's
 * blocks show in lmserve:kv_cache_usage_perc):
 *   - a client that disconnects mid-stream, or while it waits for a JSON
 *     answer, has its request aborted: num_requests_running and
 *     kv_cache_usage_perc go back to 0, long before it could have finished;
 *   - a long prompt sent again is served from the prefix cache
 *     (prefix_cache_hits grows) with the same greedy output;
 *   - the token counters count what the answers' usage reports. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/api/api-serve.h"

#define LONG_TOKENS 4000 /* max_tokens of the request that is cut short */

static struct as_server g_srv;

static struct as_server *server(void) {
  if (!g_srv.port) {
    th_proc_init(900);
    as_start(&g_srv, 0, (char *[]){"--kv-cache-memory", "24M", NULL});
  }
  return &g_srv;
}

static double metric(const char *name) {
  return as_metric(server(), name);
}

/* Waits until the long request runs and holds KV blocks; then the client
 * goes away (close_fd) and both gauges must fall back to 0. */
static void check_abort(int fd, const char *what) {
  double gen0 = metric("lmserve:generation_tokens_total");
  double ok0 = metric("lmserve:request_success_total");
  TH_CHECK_EQ_INT(as_metric_wait(server(), "lmserve:num_requests_running", 1, 60000), 1);
  double kv = 0;
  for (int i = 0; i < 600 && !(kv > 0); i++) {
    kv = metric("lmserve:kv_cache_usage_perc");
    if (!(kv > 0)) usleep(100 * 1000);
  }
  if (!(kv > 0)) th_fail(__FILE__, __LINE__, "%s: no KV usage while running", what);
  close(fd);
  TH_CHECK_EQ_INT(as_metric_wait(server(), "lmserve:num_requests_running", 0, 60000), 0);
  TH_CHECK_EQ_INT(as_metric_wait(server(), "lmserve:num_requests_waiting", 0, 60000), 0);
  double left = as_metric_wait(server(), "lmserve:kv_cache_usage_perc", 0, 60000);
  if (left != 0) th_fail(__FILE__, __LINE__, "%s: KV usage %g after the disconnect", what, left);
  /* cut short: it neither finished nor ran to its max_tokens */
  double gen = metric("lmserve:generation_tokens_total") - gen0;
  if (gen >= LONG_TOKENS / 2)
    th_fail(__FILE__, __LINE__, "%s: %g tokens generated after the client left", what, gen);
  TH_CHECK(metric("lmserve:request_success_total") == ok0);
}

static const char *long_request(int stream) {
  static char body[256];
  snprintf(body, sizeof(body),
           "{\"prompt\":\"Tell me everything.\",\"max_tokens\":%d,\"temperature\":0,"
           "\"ignore_eos\":true,\"stream\":%s}",
           LONG_TOKENS, stream ? "true" : "false");
  return body;
}

TH_TEST(api_disconnect_mid_stream) {
  struct as_server *s = server();
  TH_CHECK_EQ_INT(as_metric(s, "lmserve:num_requests_running"), 0);
  int fd = as_stream_open(s, "/v1/completions", long_request(1));
  TH_REQUIRE(fd >= 0);
  check_abort(fd, "stream");
}

TH_TEST(api_disconnect_while_waiting) {
  /* not streamed: nothing is written until the end; the client leaves */
  int fd = as_connect(server());
  TH_REQUIRE(fd >= 0);
  const char *body = long_request(0);
  char req[1024];
  int n = snprintf(req, sizeof(req),
                   "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                   "Content-Length: %zu\r\n\r\n%s",
                   strlen(body), body);
  TH_REQUIRE(write(fd, req, (size_t)n) == n);
  check_abort(fd, "non-streamed");

  /* and the server goes on: a short request completes */
  struct as_resp r;
  TH_CHECK_EQ_INT(as_post(server(), "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":3}", &r),
                  200);
  as_resp_free(&r);
}

TH_TEST(api_prefix_cache_hits) {
  struct as_server *s = server();
  /* about 300 tokens: many full KV blocks of 16 */
  char *body = malloc(8192);
  TH_REQUIRE(body);
  size_t n = (size_t)snprintf(body, 8192, "{\"prompt\":\"");
  for (int i = 0; i < 150; i++)
    n += (size_t)snprintf(body + n, 8192 - n, "line %d ", i);
  snprintf(body + n, 8192 - n, "\",\"max_tokens\":4,\"temperature\":0,\"ignore_eos\":true}");

  double q0 = as_metric(s, "lmserve:prefix_cache_queries_total");
  double h0 = as_metric(s, "lmserve:prefix_cache_hits_total");
  double p0 = as_metric(s, "lmserve:prompt_tokens_total");
  struct as_resp r;
  TH_CHECK_EQ_INT(as_post(s, "/v1/completions", body, &r), 200);
  json_t *first = as_json(&r);
  as_resp_free(&r);
  long long n_prompt = as_jint(first, "usage", "prompt_tokens");
  TH_CHECK(n_prompt > 200);
  /* the first time nothing of it is cached */
  double q1 =
      as_metric_wait_min(s, "lmserve:prefix_cache_queries_total", q0 + (double)n_prompt, 30000);
  TH_CHECK(q1 >= q0 + (double)n_prompt);
  TH_CHECK(as_metric(s, "lmserve:prefix_cache_hits_total") == h0);
  TH_CHECK(as_metric_wait_min(s, "lmserve:prompt_tokens_total", p0 + (double)n_prompt, 30000) >=
           p0 + (double)n_prompt);

  TH_CHECK_EQ_INT(as_post(s, "/v1/completions", body, &r), 200);
  json_t *again = as_json(&r);
  as_resp_free(&r);
  TH_CHECK_EQ_STR(as_jstr(again, "choices", 0, "text"), as_jstr(first, "choices", 0, "text"));
  /* every full block of the prompt but the last is a hit */
  double want = (double)((n_prompt - 1) / 16 * 16 - 16);
  double h1 = as_metric_wait_min(s, "lmserve:prefix_cache_hits_total", h0 + want, 30000);
  if (h1 < h0 + want)
    th_fail(__FILE__, __LINE__, "prefix_cache_hits grew by %g for a repeated %lld-token prompt",
            h1 - h0, n_prompt);
  TH_CHECK(h1 <= h0 + (double)n_prompt);
  json_decref(first);
  json_decref(again);
  free(body);
  as_stop(s);
}
