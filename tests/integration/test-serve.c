/* test-serve.c — `lmserve serve` as a whole: worker, scheduler and frontend
 * processes on a tiny Gemma 4 with the real Gemma tokenizer, driven over
 * HTTP. Checks /health, that a greedy completion equals `lmserve generate`
 * for the same prompt ids (non-streamed and streamed with usage), that a
 * bad request is a 400 and the server goes on serving, that chat works
 * through the model's template, and that SIGTERM stops every process. */
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/harness/th-http.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

static const char *jstr(json_t *o, const char *k1, size_t i, const char *k2) {
  json_t *v = json_object_get(json_array_get(json_object_get(o, k1), i), k2);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

TH_TEST(serve_end_to_end) {
  th_proc_init(280);
  char model[300];
  th_tiny_gemma4_or_skip("serve", 1, model, sizeof(model));

  /* the reference: offline greedy generation of the same prompt ids */
  char ids[512];
  th_generate_ids(model, "2,9259,1902", "8", ids, sizeof(ids));
  int n_gen = 1;
  for (const char *p = ids; *p; p++)
    n_gen += *p == ',';

  int port = th_free_port();
  TH_REQUIRE(port > 0);
  char port_s[16];
  snprintf(port_s, sizeof(port_s), "%d", port);
  struct th_proc p;
  TH_REQUIRE(th_proc_spawnl(&p, NULL, 1, NULL, th_lmserve_bin(), "serve", "--port", port_s,
                            "--model", model, "--drain-timeout", "10", NULL) == 0);
  /* wait for serve's URL line (the frontend prints its own before it is ready) */
  if (th_proc_wait_output(&p, "lmserve: serving", 120000) != 0) {
    th_proc_stop(&p, 2000);
    TH_REQUIRE(!"serve printed no URL");
  }

  char *b = NULL;
  TH_CHECK_EQ_INT(th_http(port, "GET", "/health", NULL, 60000, &b), 200);
  free(b);

  /* the reference text: what the frontend's tokenizer makes of those ids */
  char body[1024];
  snprintf(body, sizeof(body), "{\"tokens\":[%s]}", ids);
  TH_CHECK_EQ_INT(th_http(port, "POST", "/detokenize", body, 60000, &b), 200);
  json_t *j = json_loads(b, 0, NULL);
  free(b);
  char want[1024] = "";
  json_t *pr = json_object_get(j, "prompt");
  if (json_is_string(pr)) snprintf(want, sizeof(want), "%s", json_string_value(pr));
  json_decref(j);
  TH_CHECK(want[0] != 0);

  /* greedy completion == generate */
  const char *req = "{\"prompt\":[2,9259,1902],\"max_tokens\":8,\"temperature\":0}";
  TH_CHECK_EQ_INT(th_http(port, "POST", "/v1/completions", req, 60000, &b), 200);
  j = json_loads(b, 0, NULL);
  free(b);
  TH_CHECK_EQ_STR(jstr(j, "choices", 0, "text"), want);
  TH_CHECK_EQ_INT(
      json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), n_gen);
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")),
                  3);
  json_decref(j);

  /* streamed, with usage */
  TH_CHECK_EQ_INT(th_http(port, "POST", "/v1/completions",
                          "{\"prompt\":[2,9259,1902],\"max_tokens\":8,\"temperature\":0,\"stream\":"
                          "true,\"stream_options\":{\"include_usage\":true}}",
                          60000, &b),
                  200);
  char text[1024] = "";
  int usage_ok = 0, done = 0;
  for (const char *q = strstr(b, "data: "); q; q = strstr(q + 6, "data: ")) {
    if (!strncmp(q + 6, "[DONE]", 6)) {
      done = 1;
      continue;
    }
    const char *e = strstr(q, "\n\n");
    if (!e) break;
    json_t *ev = json_loadb(q + 6, (size_t)(e - q - 6), 0, NULL);
    const char *s = jstr(ev, "choices", 0, "text");
    if (s) strncat(text, s, sizeof(text) - strlen(text) - 1);
    json_t *u = json_object_get(ev, "usage");
    if (json_is_object(u) && json_integer_value(json_object_get(u, "completion_tokens")) == n_gen)
      usage_ok = 1;
    json_decref(ev);
  }
  free(b);
  TH_CHECK(done);
  TH_CHECK(usage_ok);
  TH_CHECK_EQ_STR(text, want);

  /* a bad request is a 400 and the server goes on */
  TH_CHECK_EQ_INT(
      th_http(port, "POST", "/v1/completions", "{\"prompt\":\"hi\",\"top_p\":7}", 60000, &b), 400);
  free(b);
  TH_CHECK_EQ_INT(th_http(port, "POST", "/v1/completions", "{\"prompt\":[2,9259,1902", 60000, &b),
                  400);
  free(b);
  TH_CHECK_EQ_INT(
      th_http(port, "POST", "/v1/chat/completions",
              "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":4}", 60000,
              &b),
      200);
  j = json_loads(b, 0, NULL);
  free(b);
  json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
  TH_CHECK(json_is_string(json_object_get(msg, "content")));
  json_decref(j);
  TH_CHECK_EQ_INT(th_http(port, "GET", "/health", NULL, 60000, &b), 200);
  free(b);

  /* what runs the model shows in /metrics and in every `bench serve` result */
  TH_CHECK_EQ_INT(th_http(port, "GET", "/metrics", NULL, 60000, &b), 200);
  TH_CHECK(b &&
           strstr(b, "lmserve:engine_info{model_name=\"default\",replica=\"0\",kernels=\"cpu-"));
  TH_CHECK(b && strstr(b, ",matmul_inputs=\"f32\"} 1\n"));
  free(b);
  char url[64];
  snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
  char *bench_out = NULL, *bench_err = NULL;
  char *bench[] = {th_lmserve_bin(),
                   "bench",
                   "serve",
                   "--url",
                   url,
                   "--num-prompts",
                   "3",
                   "--input-len",
                   "6",
                   "--output-len",
                   "3",
                   "--concurrency",
                   "2",
                   NULL};
  TH_CHECK_EQ_INT(th_run(bench, NULL, NULL, 0, 60000, &bench_out, &bench_err), 0);
  TH_CHECK(bench_out && strstr(bench_out, "Successful requests:                     3\n"));
  const char *kl = bench_out ? strstr(bench_out, "Kernels (replica 0):") : NULL;
  TH_CHECK(kl && strstr(kl, " cpu-") && strstr(kl, ", matmul inputs f32\n"));
  if (!kl && bench_out) fputs(bench_out, stderr);
  free(bench_out);
  free(bench_err);

  /* SIGTERM: everything stops, nothing is left */
  th_proc_check_exit(&p, SIGTERM, 60000);
  int left = 0;
  for (int i = 0; i < 50 && (left = th_procs_with(model)) != 0; i++)
    usleep(100000);
  TH_CHECK_EQ_INT(left, 0);
  th_proc_stop(&p, 1000);
}
