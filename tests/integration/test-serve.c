/* test-serve.c — `lmserve serve` as a whole: worker, scheduler and frontend
 * processes on a tiny Gemma 4 with the real Gemma tokenizer, driven over
 * HTTP. Checks /health, that a greedy completion equals `lmserve generate`
 * for the same prompt ids (non-streamed and streamed with usage), that a
 * bad request is a 400 and the server goes on serving, that chat works
 * through the model's template, and that SIGTERM stops every process; and
 * that the checkpoint's generation_config.json sets the sampling defaults. */
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
  TH_CHECK_EQ_INT(th_http(port, "GET", "/ping", NULL, 60000, &b), 200);
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

  /* the served name is --model as given (vLLM's default): listed, and taken */
  TH_CHECK_EQ_INT(th_http(port, "GET", "/v1/models", NULL, 60000, &b), 200);
  j = json_loads(b, 0, NULL);
  free(b);
  const char *id =
      json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
  TH_CHECK(id && !strcmp(id, model));
  json_decref(j);
  snprintf(body, sizeof(body), "{\"model\":\"%s\",\"prompt\":\"Hi\",\"max_tokens\":2}", model);
  TH_CHECK_EQ_INT(th_http(port, "POST", "/v1/completions", body, 60000, &b), 200);
  free(b);
  TH_CHECK_EQ_INT(th_http(port, "POST", "/v1/completions",
                          "{\"model\":\"default\",\"prompt\":\"Hi\",\"max_tokens\":2}", 60000, &b),
                  404);
  free(b);

  /* what runs the model shows in /metrics and in every `bench serve` result */
  TH_CHECK_EQ_INT(th_http(port, "GET", "/metrics", NULL, 60000, &b), 200);
  char info[400];
  snprintf(info, sizeof(info), "lmserve:engine_info{model_name=\"%s\",replica=\"0\",kernels=\"cpu-",
           model);
  TH_CHECK(b && strstr(b, info));
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

/* The text and completion token count of a completion of body on port. */
static void completion(int port, const char *body, char *text, size_t size, int *n_gen) {
  char *b = NULL;
  TH_CHECK_EQ_INT(th_http(port, "POST", "/v1/completions", body, 60000, &b), 200);
  json_t *j = json_loads(b ? b : "", 0, NULL);
  const char *t = jstr(j, "choices", 0, "text");
  snprintf(text, size, "%s", t ? t : "(none)");
  *n_gen =
      (int)json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens"));
  json_decref(j);
  free(b);
}

/* As vLLM's --generation-config auto: the fields a request leaves out come from the
 * checkpoint's generation_config.json (here temperature 0: greedy), a field sent
 * wins; --generation-config vllm gives vLLM's own (temperature 1), and
 * --override-generation-config's max_new_tokens caps every request. */
TH_TEST(serve_takes_the_checkpoints_sampling_defaults) {
  th_proc_init(280);
  char model[300], path[400];
  th_tiny_gemma4_or_skip("serve-gc", 2, model, sizeof(model));
  snprintf(path, sizeof(path), "%s/generation_config.json", model);
  FILE *f = fopen(path, "w");
  TH_REQUIRE(f);
  fputs("{\"bos_token_id\":2,\"eos_token_id\":[1,106],\"temperature\":0.0}\n", f);
  fclose(f);
  static const char *const seeded =
      "{\"prompt\":[2,9259,1902,563],\"max_tokens\":8,\"ignore_eos\":true,\"seed\":3}";
  static const char *const greedy = "{\"prompt\":[2,9259,1902,563],\"max_tokens\":8,"
                                    "\"ignore_eos\":true,\"temperature\":0}";
  static const char *const hot = "{\"prompt\":[2,9259,1902,563],\"max_tokens\":8,"
                                 "\"ignore_eos\":true,\"temperature\":1,\"seed\":3}";
  char t_seeded[512], t_greedy[512], t_hot[512], t_vllm[512];
  int n;
  struct th_proc p;
  int port = th_serve_start(&p, model, NULL);
  TH_REQUIRE(port > 0);
  completion(port, seeded, t_seeded, sizeof t_seeded, &n);
  completion(port, greedy, t_greedy, sizeof t_greedy, &n);
  completion(port, hot, t_hot, sizeof t_hot, &n);
  th_proc_stop(&p, 20000);
  TH_CHECK_EQ_STR(t_seeded, t_greedy); /* the checkpoint's temperature 0 */
  port = th_serve_start(&p, model,
                        (char *[]){"--generation-config", "vllm", "--override-generation-config",
                                   "{\"max_new_tokens\": 3}", NULL});
  TH_REQUIRE(port > 0);
  completion(port, seeded, t_vllm, sizeof t_vllm, &n);
  th_proc_stop(&p, 20000);
  TH_CHECK_EQ_INT(n, 3); /* capped */
  /* vLLM's temperature 1 with the same seed: the sampled answer's first 3 tokens */
  if (strncmp(t_vllm, t_hot, strlen(t_vllm)) != 0)
    th_fail(__FILE__, __LINE__, "vllm defaults: '%s' does not begin '%s'", t_vllm, t_hot);
  TH_CHECK(strcmp(t_hot, t_greedy) != 0); /* and sampling at 1 is not greedy here */
  /* a bad value stops start-up with its name */
  struct th_out o = {0};
  TH_CHECK_EQ_INT(th_lmserve(&o, 60000, "serve", "--model", model, "--port", "1",
                             "--override-generation-config", "{\"top_p\": 3}", NULL),
                  2);
  TH_CHECK(o.err && strstr(o.err, "--override-generation-config") && strstr(o.err, "top_p"));
  th_out_free(&o);
}
