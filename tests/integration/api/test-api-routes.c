/* test-api-routes.c — every route of `lmserve serve` on a tiny Gemma 4 whose
 * config says max_position_embeddings = 640 (serve gets no --max-model-len,
 * so the engine's limit must be the one reported): /health, /version,
 * /v1/models, /metrics, /tokenize, /detokenize, /v1/completions and
 * /v1/chat/completions, non-streamed and streamed (the same greedy text
 * both ways, usage last, [DONE]), n > 1, and seeded sampling that repeats. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-time.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/api/api-serve.h"

#define MAX_POS 640
#define NAME    "tiny-gemma"

static struct as_server g_srv;

static const char *or_empty(const char *s) {
  return s ? s : "";
}

static struct as_server *server(void) {
  if (!g_srv.port) {
    th_proc_init(600);
    as_start(&g_srv, MAX_POS, (char *[]){"--served-model-name", NAME, NULL});
  }
  return &g_srv;
}

/* POSTs `body` and returns the answer's JSON (status checked). */
static json_t *post_json(const char *path, const char *body, int want_status) {
  struct as_resp r;
  as_post(server(), path, body, &r);
  if (r.status != want_status) fprintf(stderr, "POST %s %s: %d %s\n", path, body, r.status, r.body);
  TH_CHECK_EQ_INT(r.status, want_status);
  json_t *j = as_json(&r);
  as_resp_free(&r);
  return j;
}

/* POSTs a streaming request; the text of choice `index` into out, usage
 * (when asked) into *usage. Returns the number of events (-1: bad). */
static int post_stream(const char *path, const char *body, int index, char *out, size_t size,
                       json_t **usage) {
  struct as_resp r;
  TH_CHECK_EQ_INT(as_post(server(), path, body, &r), 200);
  char ctype[128] = "";
  as_header(&r, "Content-Type", ctype, sizeof(ctype));
  TH_CHECK(strncmp(ctype, "text/event-stream", 17) == 0);
  int n = as_sse_text(r.body, index, out, size, usage);
  if (n < 0) fprintf(stderr, "bad SSE body: %s\n", r.body);
  as_resp_free(&r);
  return n;
}

TH_TEST(api_info_routes) {
  struct as_server *s = server();
  struct as_resp r;
  TH_CHECK_EQ_INT(as_get(s, "/health", &r), 200);
  as_resp_free(&r);

  TH_CHECK_EQ_INT(as_get(s, "/version", &r), 200);
  json_t *j = as_json(&r);
  json_t *v = json_object_get(j, "version");
  TH_CHECK(json_is_string(v) && json_string_length(v) > 0);
  json_decref(j);
  as_resp_free(&r);

  /* the engine's context length (from the model's config), not a default */
  TH_CHECK_EQ_INT(as_get(s, "/v1/models", &r), 200);
  j = as_json(&r);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "object")), "list");
  json_t *m = json_array_get(json_object_get(j, "data"), 0);
  TH_CHECK_EQ_INT(json_array_size(json_object_get(j, "data")), 1);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(m, "id")), NAME);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(m, "object")), "model");
  TH_CHECK(json_is_integer(json_object_get(m, "created")));
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(m, "max_model_len")), MAX_POS);
  json_decref(j);
  as_resp_free(&r);

  /* OpenAI's retrieve: the name percent-decoded (clients encode a '/'); another is a 404 */
  TH_CHECK_EQ_INT(as_get(s, "/v1/models/tiny%2dgemma", &r), 200);
  j = as_json(&r);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "id")), NAME);
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(j, "max_model_len")), MAX_POS);
  json_decref(j);
  as_resp_free(&r);
  TH_CHECK_EQ_INT(as_get(s, "/v1/models/org%2Ftiny-gemma", &r), 404);
  as_check_error_at(__FILE__, __LINE__, &r, 404, "model");
  as_resp_free(&r);
  TH_CHECK_EQ_INT(as_get(s, "/v1/models/tiny-gemma%00", &r), 404);
  as_resp_free(&r);

  /* vLLM's /invocations (SageMaker's): a chat body or a completion body, else a 400 */
  TH_CHECK_EQ_INT(as_post(s, "/invocations", "{\"prompt\":[2,9259],\"max_tokens\":2}", &r), 200);
  j = as_json(&r);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "object")), "text_completion");
  json_decref(j);
  as_resp_free(&r);
  TH_CHECK_EQ_INT(as_post(s, "/invocations",
                          "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                          "\"max_tokens\":2}",
                          &r),
                  200);
  j = as_json(&r);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "object")), "chat.completion");
  json_decref(j);
  as_resp_free(&r);
  TH_CHECK_EQ_INT(as_post(s, "/invocations", "{\"input\":\"hi\"}", &r), 400);
  as_resp_free(&r);
  TH_CHECK_EQ_INT(as_post(s, "/invocations", "{\"prompt\":", &r), 400);
  as_resp_free(&r);

  TH_CHECK_EQ_INT(as_get(s, "/metrics", &r), 200);
  char ctype[128] = "";
  as_header(&r, "Content-Type", ctype, sizeof(ctype));
  TH_CHECK(strncmp(ctype, "text/plain", 10) == 0);
  static const char *const names[] = {"num_requests_running",
                                      "num_requests_waiting",
                                      "kv_cache_usage_perc",
                                      "prompt_tokens_total",
                                      "generation_tokens_total",
                                      "time_to_first_token_seconds",
                                      "inter_token_latency_seconds",
                                      "e2e_request_latency_seconds",
                                      "prefix_cache_queries",
                                      "prefix_cache_hits",
                                      "spec_decode_num_drafts",
                                      "spec_decode_num_draft_tokens",
                                      "spec_decode_num_accepted_tokens"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    char want[160];
    snprintf(want, sizeof(want), "\nlmserve:%s", names[i]);
    if (!strstr(r.body, want)) th_fail(__FILE__, __LINE__, "/metrics lacks lmserve:%s", names[i]);
  }
  TH_CHECK(strstr(r.body, "# TYPE lmserve:num_requests_running gauge") != NULL);
  as_resp_free(&r);
  TH_CHECK_EQ_INT((long long)as_metric(s, "lmserve:num_requests_running"), 0);
}

TH_TEST(api_tokenize_detokenize) {
  json_t *j = post_json("/tokenize", "{\"prompt\":\"Hello world\"}", 200);
  json_t *toks = json_object_get(j, "tokens");
  TH_CHECK(json_array_size(toks) >= 2);
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(j, "count")), json_array_size(toks));
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(j, "max_model_len")), MAX_POS);
  TH_CHECK_EQ_INT(json_integer_value(json_array_get(toks, 0)), 2); /* <bos> */
  char *ids = json_dumps(toks, JSON_COMPACT);
  char body[512];
  snprintf(body, sizeof(body), "{\"tokens\":%s}", ids);
  free(ids);
  json_decref(j);
  j = post_json("/detokenize", body, 200);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "prompt")), "<bos>Hello world");
  json_decref(j);

  /* without special tokens: no <bos>, one id fewer */
  j = post_json("/tokenize", "{\"prompt\":\"Hello world\",\"add_special_tokens\":false}", 200);
  TH_CHECK(json_integer_value(json_array_get(json_object_get(j, "tokens"), 0)) != 2);
  json_decref(j);

  /* messages go through the chat template: more ids than the text alone */
  j = post_json("/tokenize", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello world\"}]}",
                200);
  TH_CHECK(json_integer_value(json_object_get(j, "count")) > 4);
  TH_CHECK(json_object_get(j, "token_strs") == NULL);
  json_decref(j);

  /* return_token_strs (vLLM's): each id's string as tokenizer.json's vocabulary has it */
  j = post_json("/tokenize",
                "{\"prompt\":\"Hello world\\n\\u00e9t\\u00e9!\",\"return_token_strs\":true}", 200);
  char path[1024];
  snprintf(path, sizeof(path), "%s/tokenizer.json", server()->model);
  json_t *tj = json_load_file(path, 0, NULL);
  json_t *vocab = json_object_get(json_object_get(tj, "model"), "vocab");
  TH_REQUIRE(json_is_object(vocab));
  json_t *ids_a = json_object_get(j, "tokens"), *strs = json_object_get(j, "token_strs");
  TH_REQUIRE(json_array_size(strs) == json_array_size(ids_a) && json_array_size(ids_a) >= 4);
  for (size_t i = 0; i < json_array_size(ids_a); i++) {
    json_int_t id = json_integer_value(json_array_get(ids_a, i));
    const char *got = json_string_value(json_array_get(strs, i));
    const char *key;
    json_t *v;
    const char *want = NULL;
    json_object_foreach(vocab, key, v) {
      if (json_integer_value(v) == id) {
        want = key;
        break;
      }
    }
    if (!got || !want || strcmp(got, want))
      th_fail(__FILE__, __LINE__, "token %zu (id %lld): '%s', the vocabulary says '%s'", i,
              (long long)id, got ? got : "(none)", want ? want : "(none)");
  }
  json_decref(tj);
  json_decref(j);
}

TH_TEST(api_completions) {
  const char *req = "{\"model\":\"" NAME "\",\"prompt\":\"The quick brown fox\",\"max_tokens\":8,"
                    "\"temperature\":0,\"ignore_eos\":true";
  char body[1024];
  snprintf(body, sizeof(body), "%s}", req);
  json_t *j = post_json("/v1/completions", body, 200);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "object")), "text_completion");
  TH_CHECK(!strncmp(or_empty(json_string_value(json_object_get(j, "id"))), "cmpl-", 5));
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "model")), NAME);
  TH_CHECK_EQ_INT(json_array_size(json_object_get(j, "choices")), 1);
  TH_CHECK_EQ_STR(as_jstr(j, "choices", 0, "finish_reason"), "length");
  char text[2048] = "";
  snprintf(text, sizeof(text), "%s", or_empty(as_jstr(j, "choices", 0, "text")));
  TH_CHECK(text[0] != 0);
  json_t *tk = post_json("/tokenize", "{\"prompt\":\"The quick brown fox\"}", 200);
  long long n_prompt = json_integer_value(json_object_get(tk, "count"));
  json_decref(tk);
  TH_CHECK_EQ_INT(as_jint(j, "usage", "prompt_tokens"), n_prompt);
  TH_CHECK_EQ_INT(as_jint(j, "usage", "completion_tokens"), 8);
  TH_CHECK_EQ_INT(as_jint(j, "usage", "total_tokens"), n_prompt + 8);
  json_decref(j);

  /* streamed: the same greedy text, usage in a last chunk of its own */
  snprintf(body, sizeof(body), "%s,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
           req);
  char streamed[2048];
  json_t *usage = NULL;
  int n = post_stream("/v1/completions", body, 0, streamed, sizeof(streamed), &usage);
  TH_CHECK(n >= 2);
  TH_CHECK_EQ_STR(streamed, text);
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(usage, "completion_tokens")), 8);
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(usage, "prompt_tokens")), n_prompt);
  json_decref(usage);

  /* without include_usage no chunk carries usage */
  snprintf(body, sizeof(body), "%s,\"stream\":true}", req);
  n = post_stream("/v1/completions", body, 0, streamed, sizeof(streamed), &usage);
  TH_CHECK(n >= 1);
  TH_CHECK(usage == NULL);
  json_decref(usage);
  TH_CHECK_EQ_STR(streamed, text);
}

TH_TEST(api_chat) {
#define MSGS                                                                                       \
  "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Name a "      \
  "colour.\"}]"
  const char *req = "{\"messages\":" MSGS ",\"max_tokens\":6,\"temperature\":0,\"ignore_eos\":true";
  char body[1024];
  snprintf(body, sizeof(body), "%s}", req);
  json_t *j = post_json("/v1/chat/completions", body, 200);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "object")), "chat.completion");
  TH_CHECK(!strncmp(or_empty(json_string_value(json_object_get(j, "id"))), "chatcmpl-", 9));
  json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(msg, "role")), "assistant");
  char content[2048] = "";
  snprintf(content, sizeof(content), "%s",
           or_empty(json_string_value(json_object_get(msg, "content"))));
  TH_CHECK(content[0] != 0);
  TH_CHECK_EQ_STR(as_jstr(j, "choices", 0, "finish_reason"), "length");
  TH_CHECK_EQ_INT(as_jint(j, "usage", "completion_tokens"), 6);
  /* the prompt is the rendered template, as /tokenize renders it */
  json_t *tk = post_json("/tokenize", "{\"messages\":" MSGS "}", 200);
  TH_CHECK_EQ_INT(as_jint(j, "usage", "prompt_tokens"),
                  json_integer_value(json_object_get(tk, "count")));
  json_decref(tk);
  json_decref(j);

  /* streamed: the role first, then the same greedy content */
  snprintf(body, sizeof(body), "%s,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
           req);
  struct as_resp r;
  TH_CHECK_EQ_INT(as_post(server(), "/v1/chat/completions", body, &r), 200);
  const char *first = strstr(r.body, "data: ");
  TH_CHECK(first && strstr(first, "\"role\":\"assistant\"") &&
           strstr(first, "\"role\":\"assistant\"") < strstr(first, "\n\n"));
  TH_CHECK(strstr(r.body, "\"object\":\"chat.completion.chunk\"") != NULL);
  char streamed[2048];
  json_t *usage = NULL;
  TH_CHECK(as_sse_text(r.body, 0, streamed, sizeof(streamed), &usage) >= 2);
  TH_CHECK_EQ_STR(streamed, content);
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(usage, "completion_tokens")), 6);
  json_decref(usage);
  as_resp_free(&r);

  /* continuous_usage_stats (vLLM's): usage in every chunk, the prompt's tokens and the
   * choice's so far, from 0 on the role's chunk to 6, then the usage chunk */
  snprintf(body, sizeof(body),
           "%s,\"stream\":true,\"stream_options\":{\"include_usage\":true,"
           "\"continuous_usage_stats\":true}}",
           req);
  TH_CHECK_EQ_INT(as_post(server(), "/v1/chat/completions", body, &r), 200);
  long long prompt = -1, last = -1;
  int events = 0;
  for (const char *d = strstr(r.body, "data: {"); d; d = strstr(d + 1, "data: {")) {
    json_t *c = json_loads(d + 6, JSON_DISABLE_EOF_CHECK, NULL);
    json_t *u = json_object_get(c, "usage");
    TH_CHECK(json_is_object(u));
    long long p = json_integer_value(json_object_get(u, "prompt_tokens")),
              g = json_integer_value(json_object_get(u, "completion_tokens"));
    if (events == 0) {
      prompt = p;
      TH_CHECK_EQ_INT(g, 0);
    }
    TH_CHECK_EQ_INT(p, prompt);
    TH_CHECK(g >= last && json_integer_value(json_object_get(u, "total_tokens")) == p + g);
    last = g;
    events++;
    json_decref(c);
  }
  TH_CHECK(events >= 3 && last == 6 && prompt > 0);
  as_resp_free(&r);
  snprintf(body, sizeof(body),
           "%s,\"stream\":true,\"stream_options\":{\"continuous_usage_stats\":1}}", req);
  json_decref(post_json("/v1/chat/completions", body, 400));
}

/* The text of every choice of a non-streamed answer, and their count. */
static int choice_texts(json_t *j, int chat, char texts[][512], int max) {
  json_t *ch = json_object_get(j, "choices");
  int n = (int)json_array_size(ch);
  for (int i = 0; i < n && i < max; i++) {
    json_t *c = json_array_get(ch, (size_t)i);
    int idx = (int)json_integer_value(json_object_get(c, "index"));
    TH_CHECK(idx >= 0 && idx < max);
    if (idx < 0 || idx >= max) continue;
    json_t *t = chat ? json_object_get(json_object_get(c, "message"), "content")
                     : json_object_get(c, "text");
    snprintf(texts[idx], 512, "%s", or_empty(json_string_value(t)));
    TH_CHECK(json_is_string(json_object_get(c, "finish_reason")));
  }
  return n;
}

TH_TEST(api_n_and_seed) {
  /* n = 3 sampled with a seed: three choices, not all the same, and the
   * same three again for the same seed, streamed or not */
  const char *req = "{\"prompt\":\"Once upon a time\",\"max_tokens\":6,\"temperature\":1.0,"
                    "\"ignore_eos\":true,\"n\":3,\"seed\":1234";
  char body[1024];
  snprintf(body, sizeof(body), "%s}", req);
  char a[3][512] = {{0}}, b[3][512] = {{0}};
  json_t *j = post_json("/v1/completions", body, 200);
  TH_CHECK_EQ_INT(choice_texts(j, 0, a, 3), 3);
  TH_CHECK_EQ_INT(as_jint(j, "usage", "completion_tokens"), 18);
  json_decref(j);
  TH_CHECK(strcmp(a[0], a[1]) || strcmp(a[1], a[2]));
  j = post_json("/v1/completions", body, 200);
  TH_CHECK_EQ_INT(choice_texts(j, 0, b, 3), 3);
  json_decref(j);
  for (int i = 0; i < 3; i++)
    TH_CHECK_EQ_STR(b[i], a[i]);
  snprintf(body, sizeof(body), "%s,\"stream\":true}", req);
  struct as_resp r;
  TH_CHECK_EQ_INT(as_post(server(), "/v1/completions", body, &r), 200);
  for (int i = 0; i < 3; i++) {
    char t[512];
    TH_CHECK(as_sse_text(r.body, i, t, sizeof(t), NULL) > 0);
    TH_CHECK_EQ_STR(t, a[i]);
  }
  as_resp_free(&r);

  /* another seed samples other text */
  snprintf(body, sizeof(body),
           "{\"prompt\":\"Once upon a time\",\"max_tokens\":6,\"temperature\":1.0,"
           "\"ignore_eos\":true,\"seed\":4321}");
  j = post_json("/v1/completions", body, 200);
  TH_CHECK(choice_texts(j, 0, b, 3) == 1);
  TH_CHECK(strcmp(b[0], a[0]) != 0);
  json_decref(j);

  /* chat, n = 2, seeded: repeats too */
  const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story.\"}],"
                     "\"max_tokens\":5,\"temperature\":0.8,\"top_p\":0.95,\"n\":2,\"seed\":7,"
                     "\"ignore_eos\":true}";
  j = post_json("/v1/chat/completions", chat, 200);
  TH_CHECK_EQ_INT(choice_texts(j, 1, a, 2), 2);
  json_decref(j);
  j = post_json("/v1/chat/completions", chat, 200);
  TH_CHECK_EQ_INT(choice_texts(j, 1, b, 2), 2);
  json_decref(j);
  for (int i = 0; i < 2; i++) {
    TH_CHECK(a[i][0] != 0);
    TH_CHECK_EQ_STR(b[i], a[i]);
  }

  /* greedy n = 2: both choices are the greedy text */
  j = post_json("/v1/completions",
                "{\"prompt\":\"Once upon a time\",\"max_tokens\":6,\"temperature\":0,\"n\":2,"
                "\"ignore_eos\":true}",
                200);
  TH_CHECK_EQ_INT(choice_texts(j, 0, a, 2), 2);
  TH_CHECK_EQ_STR(a[1], a[0]);
  json_decref(j);
}

TH_TEST(api_engine_length_limit) {
  /* the limit the engine reports is the one enforced, naming both numbers */
  json_t *j = post_json("/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":700}", 400);
  const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
  TH_CHECK(msg && strstr(msg, "640") && strstr(msg, "702"));
  json_decref(j);
  TH_CHECK(!isnan(as_metric(server(), "lmserve:generation_tokens_total")));
  TH_CHECK(as_metric(server(), "lmserve:generation_tokens_total") > 0);
}

/* The access log: a line per request answered in serve's log (client, method, path,
 * status, seconds, bytes), the client's quotes and control bytes made harmless, the
 * health probe's only at debug level. */
TH_TEST(api_access_log) {
  struct as_resp r;
  as_post(server(), "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2}", &r);
  TH_CHECK_EQ_INT(r.status, 200);
  size_t body = r.body_len;
  as_resp_free(&r);
  as_get(server(), "/v1/nope%22%0d", &r);
  TH_CHECK_EQ_INT(r.status, 404);
  as_resp_free(&r);
  as_get(server(), "/health", &r);
  as_resp_free(&r);
  char want[160];
  snprintf(want, sizeof(want), "\"POST /v1/completions HTTP/1.1\" 200 ");
  for (int tries = 0; tries < 50; tries++) { /* (the frontend writes it as it answers) */
    FILE *f = fopen(server()->log, "r");
    TH_REQUIRE(f != NULL);
    char line[1024];
    int post = 0, nope = 0, health = 0;
    while (fgets(line, sizeof(line), f)) {
      const char *at = strstr(line, want);
      if (at && strstr(line, "127.0.0.1:")) {
        char tail[64];
        snprintf(tail, sizeof(tail), " s %zu bytes", body);
        post |= strstr(at, tail) != NULL;
      }
      nope |= strstr(line, "\"GET /v1/nope%22%0d HTTP/1.1\" 404 ") != NULL;
      health |= strstr(line, "\"GET /health") != NULL;
    }
    fclose(f);
    if (post && nope) {
      TH_CHECK(!health);
      return;
    }
    cm_time_sleep_ns(100000000ull);
  }
  th_fail(__FILE__, __LINE__, "no access log lines in %s", server()->log);
}

/* X-Request-Id names the answer, as vLLM takes it: "cmpl-ID", a stream's every chunk
 * "chatcmpl-ID"; one that could break a log line is a 400. With
 * --enable-request-id-headers the answers carry it, or one made, which then names
 * the answer. */
TH_TEST(api_request_id) {
  struct as_resp r;
  as_request(server(), "POST", "/v1/completions", "X-Request-Id: job-7.a:b\r\n",
             "{\"prompt\":\"hi\",\"max_tokens\":2}", &r);
  TH_CHECK_EQ_INT(r.status, 200);
  json_t *j = as_json(&r);
  TH_CHECK_EQ_STR(or_empty(json_string_value(json_object_get(j, "id"))), "cmpl-job-7.a:b");
  json_decref(j);
  char hv[160];
  TH_CHECK(!as_header(&r, "X-Request-Id", hv, sizeof(hv))); /* (not asked for) */
  as_resp_free(&r);
  as_request(server(), "POST", "/v1/chat/completions", "X-Request-Id: s1\r\n",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3,"
             "\"stream\":true}",
             &r);
  TH_CHECK_EQ_INT(r.status, 200);
  int chunks = 0;
  for (const char *p = strstr(r.body, "data: {"); p; p = strstr(p + 1, "data: {"), chunks++)
    TH_CHECK(!strncmp(p, "data: {\"id\":\"chatcmpl-s1\",", 26));
  TH_CHECK(chunks >= 2);
  as_resp_free(&r);
  static const char *const bad[] = {"X-Request-Id: a\"b\r\n", "X-Request-Id: \r\n",
                                    "X-Request-Id: a\\b\r\n", "X-Request-Id: a/b\r\n",
                                    "X-Request-Id: a%20b\r\n"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    as_request(server(), "POST", "/v1/completions", bad[i], "{\"prompt\":\"hi\",\"max_tokens\":2}",
               &r);
    TH_CHECK_EQ_INT(r.status, 400);
    as_resp_free(&r);
  }
  /* a stored response's id is never the client's: no client can overwrite another's */
  as_request(server(), "POST", "/v1/responses", "X-Request-Id: job-7\r\n",
             "{\"input\":\"hi\",\"max_output_tokens\":2}", &r);
  TH_CHECK_EQ_INT(r.status, 200);
  j = as_json(&r);
  const char *rid = or_empty(json_string_value(json_object_get(j, "id")));
  TH_CHECK(!strncmp(rid, "resp_", 5) && strcmp(rid, "resp_job-7"));
  json_decref(j);
  as_resp_free(&r);
  struct as_server h = {0};
  as_start(&h, 0, (char *[]){"--enable-request-id-headers", NULL});
  as_request(&h, "POST", "/v1/completions", "X-Request-Id: mine\r\n",
             "{\"prompt\":\"hi\",\"max_tokens\":2}", &r);
  TH_CHECK(as_header(&r, "X-Request-Id", hv, sizeof(hv)) && !strcmp(hv, "mine"));
  as_resp_free(&r);
  as_post(&h, "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2}", &r);
  TH_CHECK(as_header(&r, "X-Request-Id", hv, sizeof(hv)) && strlen(hv) == 32);
  j = as_json(&r);
  char want[192];
  snprintf(want, sizeof(want), "cmpl-%s", hv);
  TH_CHECK_EQ_STR(or_empty(json_string_value(json_object_get(j, "id"))), want);
  json_decref(j);
  as_resp_free(&r);
  as_request(&h, "POST", "/v1/completions", "X-Request-Id: a b\r\n", "{\"prompt\":\"hi\"}", &r);
  TH_CHECK_EQ_INT(r.status, 400);
  as_resp_free(&r);
  as_stop(&h);
}

/* --disable-access-log (and vLLM's --disable-uvicorn-access-log): no such lines */
TH_TEST(api_access_log_off) {
  for (int k = 0; k < 2; k++) {
    struct as_server s = {0};
    as_start(&s, 0, (char *[]){k ? "--disable-uvicorn-access-log" : "--disable-access-log", NULL});
    struct as_resp r;
    as_post(&s, "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2}", &r);
    TH_CHECK_EQ_INT(r.status, 200);
    as_resp_free(&r);
    as_stop(&s);
    FILE *f = fopen(s.log, "r");
    TH_REQUIRE(f != NULL);
    char line[1024];
    while (fgets(line, sizeof(line), f))
      TH_CHECK(strstr(line, "\"POST /v1/completions") == NULL);
    fclose(f);
  }
}

/* GET /props (llama.cpp's): the context, the names, the checkpoint's chat template as
 * tokenizer_config.json holds it, Gemma's <bos> and <eos> (MODELS.md), the slots (the
 * scheduler's --max-num-seqs), and the sampling defaults of its generation_config.json
 * where it has them. */
TH_TEST(api_props) {
  struct as_resp r;
  as_get(server(), "/props", &r);
  TH_CHECK_EQ_INT(r.status, 200);
  json_t *j = as_json(&r);
  as_resp_free(&r);
  json_t *dg = json_object_get(j, "default_generation_settings");
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(dg, "n_ctx")), MAX_POS);
  TH_CHECK_EQ_STR(or_empty(json_string_value(json_object_get(j, "model_alias"))), NAME);
  TH_CHECK_EQ_STR(or_empty(json_string_value(json_object_get(j, "model_path"))), server()->model);
  TH_CHECK_EQ_STR(or_empty(json_string_value(json_object_get(j, "bos_token"))), "<bos>");
  TH_CHECK_EQ_STR(or_empty(json_string_value(json_object_get(j, "eos_token"))), "<eos>");
  TH_CHECK(json_is_false(json_object_get(json_object_get(j, "modalities"), "audio")));
  TH_CHECK(json_is_string(json_object_get(j, "build_info")));
  /* serve's --max-num-seqs default, as the scheduler's PONG says it */
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(j, "total_slots")), 64);
  char path[1024];
  snprintf(path, sizeof(path), "%s/tokenizer_config.json", server()->model);
  json_t *tc = json_load_file(path, 0, NULL);
  TH_REQUIRE(json_is_string(json_object_get(tc, "chat_template")));
  TH_CHECK(json_equal(json_object_get(j, "chat_template"), json_object_get(tc, "chat_template")));
  json_decref(tc);
  /* the defaults a request gets: generation_config.json's, else OpenAI's */
  snprintf(path, sizeof(path), "%s/generation_config.json", server()->model);
  json_t *gc = json_load_file(path, 0, NULL);
  json_t *pa = json_object_get(dg, "params");
  static const char *const keys[][2] = {{"temperature", "temperature"},
                                        {"top_p", "top_p"},
                                        {"top_k", "top_k"},
                                        {"min_p", "min_p"},
                                        {"repetition_penalty", "repeat_penalty"}};
  static const double openai[] = {1, 1, -1, 0, 1};
  for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
    json_t *g = json_object_get(gc, keys[k][0]);
    double want = json_is_number(g) ? json_number_value(g) : openai[k];
    TH_CHECK(json_number_value(json_object_get(pa, keys[k][1])) == want);
  }
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(pa, "n_predict")), -1);
  json_decref(gc);
  json_decref(j);
  /* the defaults as --override-generation-config sets them */
  struct as_server s2 = {0};
  as_start(&s2, 0,
           (char *[]){"--override-generation-config",
                      "{\"temperature\":0.5,\"top_k\":64,\"max_new_tokens\":100}", "--max-num-seqs",
                      "3", NULL});
  as_get(&s2, "/props", &r);
  TH_CHECK_EQ_INT(r.status, 200);
  j = as_json(&r);
  as_resp_free(&r);
  as_stop(&s2);
  pa = json_object_get(json_object_get(j, "default_generation_settings"), "params");
  TH_CHECK(json_number_value(json_object_get(pa, "temperature")) == 0.5);
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(pa, "top_k")), 64);
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(pa, "n_predict")), 100);
  TH_CHECK(json_number_value(json_object_get(pa, "top_p")) == 1);
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(j, "total_slots")), 3);
  json_decref(j);
}

/* POST /apply-template (llama.cpp's): the chat as Gemma 3's template writes it
 * (MODELS.md's turns), which /v1/completions then takes without a second <bos>: its
 * prompt ids and greedy answer are the chat completion's. */
TH_TEST(api_apply_template) {
  static const char msgs[] = "[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                             "{\"role\":\"user\",\"content\":\"Hi \\\"you\\\"\\n\"}]";
  char body[1024];
  snprintf(body, sizeof(body), "{\"messages\":%s}", msgs);
  json_t *j = post_json("/apply-template", body, 200);
  const char *prompt = json_string_value(json_object_get(j, "prompt"));
  TH_REQUIRE(prompt != NULL);
  /* Gemma 3's turns: the system text leads the first user turn */
  TH_CHECK_EQ_STR(prompt, "<bos><start_of_turn>user\nBe brief.\n\nHi \"you\"<end_of_turn>\n"
                          "<start_of_turn>model\n");
  json_t *done = post_json("/apply-template",
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                           "\"add_generation_prompt\":false}",
                           200);
  TH_CHECK_EQ_STR(or_empty(json_string_value(json_object_get(done, "prompt"))),
                  "<bos><start_of_turn>user\nHi<end_of_turn>\n");
  json_decref(done);

  /* the text as a completion's prompt: the chat's prompt ids and greedy tokens */
  json_t *cq = json_pack("{s:s, s:b, s:i, s:i, s:b}", "prompt", prompt, "add_special_tokens", 0,
                         "max_tokens", 6, "temperature", 0, "return_token_ids", 1);
  char *cbody = json_dumps(cq, 0);
  json_t *comp = post_json("/v1/completions", cbody, 200);
  snprintf(body, sizeof(body),
           "{\"messages\":%s,\"max_tokens\":6,\"temperature\":0,\"return_token_ids\":true,"
           "\"skip_special_tokens\":false}",
           msgs);
  json_t *chat = post_json("/v1/chat/completions", body, 200);
  json_t *c0 = json_array_get(json_object_get(comp, "choices"), 0),
         *h0 = json_array_get(json_object_get(chat, "choices"), 0);
  json_t *cp = json_object_get(c0, "prompt_token_ids"),
         *hp = json_object_get(chat, "prompt_token_ids");
  TH_REQUIRE(json_array_size(cp) > 8);
  TH_CHECK(json_equal(cp, hp));
  TH_CHECK(json_equal(json_object_get(c0, "token_ids"), json_object_get(h0, "token_ids")));
  TH_CHECK_EQ_INT(json_array_size(json_object_get(c0, "token_ids")), 6);
  free(cbody);
  json_decref(cq);
  json_decref(comp);
  json_decref(chat);
  json_decref(j);

  /* what it refuses, as /tokenize does, and without messages */
  json_decref(post_json("/apply-template", "{\"prompt\":\"Hi\"}", 400));
  json_decref(post_json("/apply-template", "{\"messages\":[]}", 400));
  json_decref(post_json("/apply-template",
                        "{\"messages\":[{\"role\":\"nobody\",\"content\":\"x\"}]}", 400));
  json_decref(post_json("/apply-template", "not json", 400));
}

/* The lines of serve's log `s` that hold `what`, appended to out (NUL-terminated);
 * how many. */
static int log_lines(const struct as_server *s, const char *what, char *out, size_t size) {
  FILE *f = fopen(s->log, "r");
  TH_REQUIRE(f != NULL);
  static char line[1 << 16];
  int n = 0;
  size_t at = 0;
  out[0] = 0;
  while (fgets(line, sizeof(line), f))
    if (strstr(line, what)) {
      n++;
      int w = snprintf(out + at, size - at, "%s", line);
      at += w > 0 && (size_t)w < size - at ? (size_t)w : 0;
    }
  fclose(f);
  return n;
}

/* The JSON string at p (then optionally " (+N bytes)"): its text into out, N into
 * *more (0 without); the end of what was read. */
static const char *logged_text(const char *p, char *out, size_t size, long *more) {
  json_error_t je;
  json_t *v = json_loads(p, JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK, &je);
  TH_REQUIRE(json_is_string(v));
  snprintf(out, size, "%s", json_string_value(v));
  json_decref(v);
  p += je.position;
  *more = 0;
  if (!strncmp(p, " (+", 3)) {
    *more = strtol(p + 3, (char **)&p, 10);
    TH_CHECK(!strncmp(p, " bytes)", 7));
    p += 7;
  }
  return p;
}

/* vLLM's --enable-log-requests, --enable-log-outputs and --max-log-len: a line for the
 * request received (its prompt's text and ids as /tokenize has them, cut at N bytes
 * and N ids, and its parameters) and one for each choice finished (its text as the
 * answer has it, cut the same way); the stats lines every --log-stats-interval. */
TH_TEST(api_request_log) {
  struct as_server s = {0};
  as_start(&s, 0,
           (char *[]){"--enable-log-requests", "--enable-log-outputs", "--max-log-len", "12",
                      "--log-stats-interval", "0.5", NULL});
  const char *prompt = "Hello \"there\"\nfriend, a prompt of a few more words";
  json_t *q = json_pack("{s:s, s:i, s:i, s:[s]}", "prompt", prompt, "max_tokens", 6, "seed", 7,
                        "stop", "zz\"z");
  char *body = json_dumps(q, 0);
  struct as_resp r;
  as_request(&s, "POST", "/v1/completions", "X-Request-Id: logged-1\r\n", body, &r);
  TH_REQUIRE(r.status == 200);
  json_t *a = as_json(&r);
  as_resp_free(&r);
  const char *text =
      json_string_value(json_object_get(json_array_get(json_object_get(a, "choices"), 0), "text"));
  TH_REQUIRE(text != NULL);
  json_t *tq = json_pack("{s:s}", "prompt", prompt);
  char *tbody = json_dumps(tq, 0);
  as_post(&s, "/tokenize", tbody, &r);
  TH_REQUIRE(r.status == 200);
  json_t *tok = as_json(&r);
  as_resp_free(&r);
  json_t *ids = json_object_get(tok, "tokens");
  TH_REQUIRE(json_array_size(ids) > 12);

  static char lines[1 << 17];
  int got = 0;
  for (int tries = 0; tries < 50 && !got; tries++) { /* (written as it answers) */
    got = log_lines(&s, "request cmpl-logged-1 choice 0 finished", lines, sizeof(lines));
    if (!got) cm_time_sleep_ns(100000000ull);
  }
  TH_CHECK_EQ_INT(got, 1);
  char shown[256];
  long more;
  /* the answer's text: its first 12 bytes at most, a character's end, and the rest counted */
  const char *p = strstr(lines, "finished (length): 6 tokens, ");
  TH_REQUIRE(p != NULL);
  logged_text(p + strlen("finished (length): 6 tokens, "), shown, sizeof(shown), &more);
  size_t sl = strlen(shown);
  TH_CHECK(sl <= 12 && (sl >= 9 || sl == strlen(text)));
  TH_CHECK(!strncmp(shown, text, sl));
  TH_CHECK_EQ_INT(more, (long)(strlen(text) - sl));

  TH_CHECK_EQ_INT(log_lines(&s, "request cmpl-logged-1 received: prompt ", lines, sizeof(lines)),
                  1);
  p = strstr(lines, "received: prompt ") + strlen("received: prompt ");
  p = logged_text(p, shown, sizeof(shown), &more);
  TH_CHECK_EQ_STR(shown, "Hello \"there");
  TH_CHECK_EQ_INT(more, (long)(strlen(prompt) - 12));
  char want[512];
  int w = snprintf(want, sizeof(want), ", %zu tokens [", json_array_size(ids));
  for (size_t i = 0; i < 12; i++)
    w += snprintf(want + w, sizeof(want) - (size_t)w, "%s%lld", i ? ", " : "",
                  (long long)json_integer_value(json_array_get(ids, i)));
  snprintf(want + w, sizeof(want) - (size_t)w, "] (+%zu), params {", json_array_size(ids) - 12);
  TH_CHECK(!strncmp(p, want, strlen(want)));
  TH_CHECK(strstr(p, "\"max_tokens\":6,") && strstr(p, "\"seed\":7,") &&
           strstr(p, "\"stop\":[\"zz\\\"z\"]"));

  /* the stats: the request's tokens in one interval's rates */
  got = 0;
  for (int tries = 0; tries < 50 && !got; tries++) {
    log_lines(&s, "replica 0: prompt ", lines, sizeof(lines));
    for (const char *l = lines; l && *l && !got; l = strchr(l + 1, '\n')) {
      const char *at = strstr(l, "replica 0: prompt ");
      double pr = 0, ge = 0;
      if (at &&
          sscanf(at, "replica 0: prompt %lf tokens/s, generation %lf tokens/s", &pr, &ge) == 2)
        got = pr > 0 && ge > 0;
    }
    if (!got) cm_time_sleep_ns(100000000ull);
  }
  TH_CHECK(got);
  as_stop(&s);
  free(body);
  free(tbody);
  json_decref(q);
  json_decref(tq);
  json_decref(a);
  json_decref(tok);

  /* vLLM's older --disable-log-requests wins; --disable-log-stats; and the flags vLLM's
   * command lines carry that change nothing here are taken */
  struct as_server s2 = {0};
  as_start(&s2, 0,
           (char *[]){"--enable-log-requests", "--disable-log-requests", "--disable-log-stats",
                      "--log-stats-interval", "0.5", "--trust-remote-code",
                      "--enable-chunked-prefill", "--enable-auto-tool-choice", "--tool-call-parser",
                      "gemma4", "--reasoning-parser", "gemma4", "--disable-fastapi-docs", NULL});
  as_post(&s2, "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2}", &r);
  TH_CHECK_EQ_INT(r.status, 200);
  as_resp_free(&r);
  cm_time_sleep_ns(800000000ull);
  as_stop(&s2);
  TH_CHECK_EQ_INT(log_lines(&s2, "received: prompt", lines, sizeof(lines)), 0);
  TH_CHECK_EQ_INT(log_lines(&s2, "finished (", lines, sizeof(lines)), 0);
  TH_CHECK_EQ_INT(log_lines(&s2, "replica 0: prompt", lines, sizeof(lines)), 0);
}

/* vLLM's --max-logprobs, --scheduling-policy fcfs, --uvicorn-log-level and
 * --kv-cache-memory-bytes: what they allow and refuse, as vLLM does. */
TH_TEST(api_vllm_policy_flags) {
  struct as_server s = {0};
  as_start(&s, 0,
           (char *[]){"--max-logprobs", "3", "--scheduling-policy", "fcfs", "--uvicorn-log-level",
                      "warning", "--kv-cache-memory-bytes", "256M", NULL});
  static const struct {
    const char *path, *body, *param; /* param NULL: a 200 */
  } cases[] = {
      {"/v1/chat/completions",
       "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2,\"logprobs\":true,"
       "\"top_logprobs\":4}",
       "top_logprobs"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2,\"logprobs\":4}", "logprobs"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2,\"prompt_logprobs\":4}",
       "prompt_logprobs"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2,\"priority\":1}", "priority"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2,\"priority\":0}", NULL},
      {"/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2,\"prompt_logprobs\":3}", NULL},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    struct as_resp r;
    as_post(&s, cases[i].path, cases[i].body, &r);
    TH_CHECK_EQ_INT(r.status, cases[i].param ? 400 : 200);
    if (cases[i].param) {
      json_t *j = as_json(&r);
      TH_CHECK_EQ_STR(
          or_empty(json_string_value(json_object_get(json_object_get(j, "error"), "param"))),
          cases[i].param);
      json_decref(j);
    }
    as_resp_free(&r);
  }
  /* three top entries a token, as many as allowed */
  struct as_resp r;
  as_post(&s, "/v1/chat/completions",
          "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2,"
          "\"logprobs\":true,\"top_logprobs\":3}",
          &r);
  TH_CHECK_EQ_INT(r.status, 200);
  json_t *j = as_json(&r);
  as_resp_free(&r);
  json_t *lc = json_object_get(
      json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "content");
  TH_REQUIRE(json_array_size(lc) == 2);
  TH_CHECK_EQ_INT(json_array_size(json_object_get(json_array_get(lc, 0), "top_logprobs")), 3);
  json_decref(j);
  as_stop(&s);
  /* at uvicorn's warning level the access log is out */
  static char lines[1 << 16];
  TH_CHECK_EQ_INT(log_lines(&s, "\"POST /v1/completions HTTP/1.1\"", lines, sizeof(lines)), 0);

  /* what serve refuses, by flag */
  static const struct {
    const char *flag, *value, *says;
  } bad[] = {{"--scheduling-policy", "lifo", "--scheduling-policy"},
             {"--uvicorn-log-level", "loud", "--uvicorn-log-level"},
             {"--max-logprobs", "65", "max-logprobs"},
             {"--mm-processor-kwargs", "{\"max_soft_tokens\":71}", "max_soft_tokens must be"},
             {"--mm-processor-kwargs", "{\"do_pan_and_scan\":true}", "'do_pan_and_scan'"},
             {"--mm-processor-kwargs", "[70]", "not a JSON object"}};
  struct th_out o = {0};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    TH_CHECK_EQ_INT(th_lmserve(&o, 10000, "serve", bad[i].flag, bad[i].value, NULL), 2);
    TH_CHECK(o.err && strstr(o.err, bad[i].says));
  }
  th_out_free(&o);
}

TH_TEST(api_routes_stop) {
  as_stop(server());
}
