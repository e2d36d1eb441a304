/* test-api-edge.c — `lmserve serve --max-model-len 512` on a tiny Gemma 4,
 * at the edges of what clients send:
 *   - token ids outside the vocabulary, in every field that takes ids
 *     (completions prompts, flat and nested, /detokenize, stop_token_ids,
 *     logit_bias keys, allowed_token_ids), are 400s naming the field;
 *   - numbers out of range (1e999, a 400-digit integer, a seed past 64 bits,
 *     negative counts, NaN and Infinity) are 400s naming the field;
 *   - a 1 MB prompt is tokenized off the event loop: while its chat template
 *     and tokenization run, requests on other connections are answered in a
 *     small fraction of the time the big one takes (both measured here,
 *     side by side);
 *   - the counters a finished request moves (prefix-cache queries and hits,
 *     prompt and generation tokens, successes) already count it when
 *     /metrics is read right after its answer ended, streamed or not;
 *   - --chat-template (vLLM's flag): a template file in place of the model's,
 *     for chat completions and /tokenize's messages alike; a value that is
 *     neither a file nor a template, or a template that does not parse, stops
 *     serve at once with the reason;
 *   - continue_final_message (vLLM's): the rendered chat ends with the last
 *     message's text; with add_generation_prompt, or with no text, a 400;
 *   - truncate_prompt_tokens (vLLM's): each prompt's last k tokens;
 *   - return_tokens_as_token_ids (vLLM's): logprobs' tokens as "token_id:N";
 *   - n choices of each of several prompts;
 *   - echo (vLLM's): the prompt's text, or the assistant's message, first;
 *   - cache_salt (vLLM's): the prefix cache shared only under the same salt;
 *   - --enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens;
 *   - logit_bias: +100 makes a token every draw, -100 bans one; logprobs stay raw;
 *   - allowed_token_ids (vLLM's): only those tokens drawn, the best allowed one of
 *     the raw distribution when greedy;
 *   - bad_words (vLLM's): a greedy completion follows the unconstrained one up to
 *     where that one spells a bad word, and never spells one. */
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/cm-time.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/api/api-serve.h"

static struct as_server g_srv;
static double g_5xx; /* lmserve:http_server_errors_total once serving */

static struct as_server *server(void) {
  if (!g_srv.port) {
    th_proc_init(900);
    as_start(&g_srv, 0, (char *[]){"--max-model-len", "512", NULL});
    g_5xx = as_metric(&g_srv, "lmserve:http_server_errors_total");
  }
  return &g_srv;
}

/* POSTs body; the answer must be a 400 naming `param`, and its message must
 * hold `word` when given. */
static void check_400(const char *path, const char *body, const char *param, const char *word,
                      int line) {
  struct as_resp r;
  as_post(server(), path, body, &r);
  if (r.status != 400 || (word && !strstr(r.body, word)))
    th_fail(__FILE__, line, "%s %.120s: %d %.300s", path, body, r.status, r.body);
  as_check_error_at(__FILE__, line, &r, 400, param);
  as_resp_free(&r);
}

TH_TEST(api_ids_outside_the_vocabulary) {
  static const struct {
    const char *path, *body, *param;
  } cases[] = {
      {"/v1/completions", "{\"prompt\":[2,262144],\"max_tokens\":2}", "prompt"},
      {"/v1/completions", "{\"prompt\":[2,999999999],\"max_tokens\":2}", "prompt"},
      {"/v1/completions", "{\"prompt\":[2,-1],\"max_tokens\":2}", "prompt"},
      {"/v1/completions", "{\"prompt\":[2,4294967296],\"max_tokens\":2}", "prompt"},
      {"/v1/completions", "{\"prompt\":[[2,9259],[2,262144]],\"max_tokens\":2}", "prompt"},
      {"/v1/completions", "{\"prompt\":[[2,9259],[-7]],\"max_tokens\":2}", "prompt"},
      {"/detokenize", "{\"tokens\":[2,999999999]}", "tokens"},
      {"/detokenize", "{\"tokens\":[2,-1]}", "tokens"},
      {"/detokenize", "{\"tokens\":[2,99999999999999]}", "tokens"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"stop_token_ids\":[1,262144]}", "stop_token_ids"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"stop_token_ids\":[-3]}", "stop_token_ids"},
      {"/v1/chat/completions",
       "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop_token_ids\":[500000]}",
       "stop_token_ids"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"logit_bias\":{\"262144\":5}}", "logit_bias"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"logit_bias\":{\"-5\":5}}", "logit_bias"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"logit_bias\":{\"99999999999999999999\":1}}",
       "logit_bias"},
      {"/v1/chat/completions",
       "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"7000000\":-1}}",
       "logit_bias"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"allowed_token_ids\":[5,262144]}",
       "allowed_token_ids"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    check_400(cases[i].path, cases[i].body, cases[i].param, "vocabulary", __LINE__);
  /* and the largest id is fine where ids are used */
  struct as_resp r;
  TH_CHECK_EQ_INT(as_post(server(), "/v1/completions",
                          "{\"prompt\":[2,9259],\"max_tokens\":2,\"stop_token_ids\":[0,106]}", &r),
                  200);
  as_resp_free(&r);
  TH_CHECK_EQ_INT(as_post(server(), "/detokenize", "{\"tokens\":[2,9259]}", &r), 200);
  as_resp_free(&r);
}

TH_TEST(api_numbers_out_of_range) {
  char digits[420];
  memset(digits, '9', 400);
  digits[400] = 0;
  char big_n[600], big_prompt[600];
  snprintf(big_n, sizeof(big_n), "{\"prompt\":\"hi\",\"n\":%s}", digits);
  snprintf(big_prompt, sizeof(big_prompt), "{\"prompt\":[2,%s]}", digits);
  static const struct {
    const char *body, *param;
  } cases[] = {
      {"{\"prompt\":\"hi\",\"seed\":18446744073709551616}", "seed"},
      {"{\"prompt\":\"hi\",\"seed\":-9223372036854775809}", "seed"},
      {"{\"prompt\":\"hi\",\"seed\":1e19}", "seed"},
      {"{\"prompt\":\"hi\",\"max_tokens\":1e999}", "max_tokens"},
      {"{\"prompt\":\"hi\",\"max_tokens\":-1e999}", "max_tokens"},
      {"{\"prompt\":\"hi\",\"max_tokens\":9223372036854775807}", "max_tokens"},
      {"{\"prompt\":\"hi\",\"max_tokens\":-3}", "max_tokens"},
      {"{\"prompt\":\"hi\",\"temperature\":1e999}", "temperature"},
      {"{\"prompt\":\"hi\",\"temperature\":NaN}", "temperature"},
      {"{\"prompt\":\"hi\",\"top_p\":-Infinity}", "top_p"},
      {"{\"prompt\":\"hi\",\"top_p\":Infinity}", "top_p"},
      {"{\"prompt\":\"hi\",\"top_k\":-2}", "top_k"},
      {"{\"prompt\":\"hi\",\"min_tokens\":-1}", "min_tokens"},
      {"{\"prompt\":\"hi\",\"logprobs\":-1}", "logprobs"},
      {"{\"prompt\":\"hi\",\"priority\":1e999}", "priority"},
      {"{\"prompt\":\"hi\",\"frequency_penalty\":-1e400}", "frequency_penalty"},
      {"{\"prompt\":\"hi\",\"stream\":true,\"stream_options\":{\"include_usage\":1e999}}",
       "stream_options.include_usage"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    check_400("/v1/completions", cases[i].body, cases[i].param, NULL, __LINE__);
  check_400("/v1/completions", big_n, "n", "out of range", __LINE__);
  check_400("/v1/completions", big_prompt, "prompt", "out of range", __LINE__);
  check_400("/v1/chat/completions",
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":"
            "123456789012345678901234567890}",
            "max_completion_tokens", "out of range", __LINE__);
  check_400("/v1/chat/completions",
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,"
            "\"top_logprobs\":1e308}",
            "top_logprobs", NULL, __LINE__);
  /* still serving, and nothing above was a 5xx */
  struct as_resp r;
  TH_CHECK_EQ_INT(as_post(server(), "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2}", &r),
                  200);
  as_resp_free(&r);
  TH_CHECK(as_metric(server(), "lmserve:http_server_errors_total") == g_5xx);
}

/* The completion's text and usage.prompt_tokens for body at /v1/completions (or
 * chat, with messages) into text[512]. */
static long long complete(const char *body, char *text) {
  struct as_resp r;
  const char *path = strstr(body, "\"messages\"") ? "/v1/chat/completions" : "/v1/completions";
  if (as_post(server(), path, body, &r) != 200)
    th_fail(__FILE__, __LINE__, "%.200s: %d %.300s", body, r.status, r.body);
  json_t *j = as_json(&r);
  const char *t = as_jstr(j, "choices", 0, "text");
  snprintf(text, 512, "%s", t ? t : "");
  long long n = as_jint(j, "usage", "prompt_tokens");
  json_decref(j);
  as_resp_free(&r);
  return n;
}

/* The JSON answer to body at path, which must be a 200. */
static json_t *post_ok(const char *path, const char *body, int line) {
  struct as_resp r;
  if (as_post(server(), path, body, &r) != 200)
    th_fail(__FILE__, line, "%s %.200s: %d %.300s", path, body, r.status, r.body);
  json_t *j = as_json(&r);
  as_resp_free(&r);
  TH_REQUIRE(j != NULL);
  return j;
}

/* truncate_prompt_tokens (vLLM's): each prompt's last k tokens, as if sent so; -1
 * the last max_model_len; a prompt past the context then fits. Out of range, 400s. */
TH_TEST(api_truncate_prompt_tokens) {
  char a[512], b[512];
  TH_CHECK_EQ_INT(complete("{\"prompt\":[2,10,11,12,13,14],\"truncate_prompt_tokens\":3,"
                           "\"max_tokens\":4,\"temperature\":0}",
                           a),
                  3);
  TH_CHECK_EQ_INT(complete("{\"prompt\":[12,13,14],\"max_tokens\":4,\"temperature\":0}", b), 3);
  TH_CHECK(!strcmp(a, b));
  /* two prompts, each cut */
  TH_CHECK_EQ_INT(complete("{\"prompt\":[[2,10,11,12],[2,20,21,22,23]],"
                           "\"truncate_prompt_tokens\":2,\"max_tokens\":1}",
                           a),
                  4);
  /* a short prompt is left as it is */
  TH_CHECK_EQ_INT(
      complete("{\"prompt\":[2,10,11],\"truncate_prompt_tokens\":-1,\"max_tokens\":1}", a), 3);
  TH_CHECK_EQ_INT(complete("{\"messages\":[{\"role\":\"user\",\"content\":\"one two three four "
                           "five six\"}],\"truncate_prompt_tokens\":4,\"max_tokens\":1}",
                           a),
                  4);
  /* 600 tokens: past the 512 of the context, unless cut */
  char *big = malloc(8192);
  TH_REQUIRE(big != NULL);
  size_t n = (size_t)snprintf(big, 8192, "{\"prompt\":[2");
  for (int i = 1; i < 600; i++)
    n += (size_t)snprintf(big + n, 8192 - n, ",%d", 100 + i % 50);
  snprintf(big + n, 8192 - n, "],\"max_tokens\":1,\"truncate_prompt_tokens\":500}");
  TH_CHECK_EQ_INT(complete(big, a), 500);
  snprintf(big + n, 8192 - n, "],\"max_tokens\":1}");
  check_400("/v1/completions", big, "prompt", NULL, __LINE__);
  free(big);
  check_400("/v1/completions", "{\"prompt\":[2,10],\"truncate_prompt_tokens\":513}",
            "truncate_prompt_tokens", "max_model_len", __LINE__);
  check_400("/v1/completions", "{\"prompt\":[2,10],\"truncate_prompt_tokens\":0}",
            "truncate_prompt_tokens", NULL, __LINE__);
}

/* return_tokens_as_token_ids (vLLM's): the logprobs' tokens, top ones included, as
 * "token_id:N", N the token whose text the same request without it shows; chat's
 * bytes those of that string. */
TH_TEST(api_tokens_as_token_ids) {
  const char *plain = "{\"prompt\":[2,10,11,12],\"max_tokens\":3,\"temperature\":0,\"logprobs\":2}";
  const char *ids = "{\"prompt\":[2,10,11,12],\"max_tokens\":3,\"temperature\":0,\"logprobs\":2,"
                    "\"return_tokens_as_token_ids\":true}";
  json_t *a = post_ok("/v1/completions", plain, __LINE__);
  json_t *b = post_ok("/v1/completions", ids, __LINE__);
  json_t *la = json_object_get(json_array_get(json_object_get(a, "choices"), 0), "logprobs"),
         *lb = json_object_get(json_array_get(json_object_get(b, "choices"), 0), "logprobs");
  TH_CHECK(
      json_equal(json_object_get(la, "token_logprobs"), json_object_get(lb, "token_logprobs")));
  json_t *ta = json_object_get(la, "tokens"), *tb = json_object_get(lb, "tokens");
  TH_REQUIRE(json_array_size(ta) == 3 && json_array_size(tb) == 3);
  for (size_t i = 0; i < 3; i++) {
    int id = -1, used = 0;
    const char *t = json_string_value(json_array_get(tb, i));
    TH_REQUIRE(t && sscanf(t, "token_id:%d%n", &id, &used) == 1 && t[used] == 0);
    char body[96];
    snprintf(body, sizeof(body), "{\"tokens\":[%d],\"skip_special_tokens\":false}", id);
    json_t *d = post_ok("/detokenize", body, __LINE__);
    const char *piece = json_string_value(json_object_get(d, "prompt"));
    if (!piece || strcmp(piece, json_string_value(json_array_get(ta, i))))
      th_fail(__FILE__, __LINE__, "token %zu: %s is '%s', the plain answer's '%s'", i, t,
              piece ? piece : "?", json_string_value(json_array_get(ta, i)));
    json_decref(d);
    /* the top ones: keys of the same form, the token among them */
    json_t *top = json_array_get(json_object_get(lb, "top_logprobs"), i);
    TH_CHECK_EQ_INT((int)json_object_size(top), 2);
    TH_CHECK(json_object_get(top, t) != NULL);
  }
  json_decref(a);
  json_decref(b);
  json_t *c = post_ok("/v1/chat/completions",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":1,"
                      "\"logprobs\":true,\"top_logprobs\":1,\"return_tokens_as_token_ids\":true}",
                      __LINE__);
  json_t *e = json_array_get(
      json_object_get(json_object_get(json_array_get(json_object_get(c, "choices"), 0), "logprobs"),
                      "content"),
      0);
  const char *tok = json_string_value(json_object_get(e, "token"));
  TH_REQUIRE(tok && !strncmp(tok, "token_id:", 9));
  json_t *bytes = json_object_get(e, "bytes");
  TH_CHECK_EQ_INT((int)json_array_size(bytes), (int)strlen(tok));
  TH_CHECK_EQ_INT((int)json_integer_value(json_array_get(bytes, 0)), 't');
  json_decref(c);
}

/* n choices of each of several prompts (as vLLM): choice i * n + j is prompt i's
 * j-th, the prompt tokens counted once each. Greedy, a prompt's choices agree
 * with each other and with that prompt sent alone. */
TH_TEST(api_n_choices_of_several_prompts) {
  char a[512], b[512];
  long long na = complete("{\"prompt\":[2,10,11,12],\"max_tokens\":3,\"temperature\":0,"
                          "\"ignore_eos\":true}",
                          a),
            nb = complete("{\"prompt\":[2,30,31],\"max_tokens\":3,\"temperature\":0,"
                          "\"ignore_eos\":true}",
                          b);
  json_t *j = post_ok("/v1/completions",
                      "{\"prompt\":[[2,10,11,12],[2,30,31]],\"n\":2,\"max_tokens\":3,"
                      "\"temperature\":0,\"ignore_eos\":true}",
                      __LINE__);
  json_t *cs = json_object_get(j, "choices");
  TH_REQUIRE(json_array_size(cs) == 4);
  for (size_t i = 0; i < 4; i++) {
    json_t *c = NULL;
    for (size_t k = 0; k < 4 && !c; k++) /* by index, whatever the order */
      if (json_integer_value(json_object_get(json_array_get(cs, k), "index")) == (json_int_t)i)
        c = json_array_get(cs, k);
    TH_REQUIRE(c != NULL);
    const char *t = json_string_value(json_object_get(c, "text"));
    TH_CHECK(t && !strcmp(t, i < 2 ? a : b));
  }
  TH_CHECK_EQ_INT(as_jint(j, "usage", "prompt_tokens"), na + nb);
  TH_CHECK_EQ_INT(as_jint(j, "usage", "completion_tokens"), 12);
  json_decref(j);
  check_400("/v1/completions", "{\"prompt\":[[2,10],[2,11],[2,12]],\"n\":100}", "n", "choices",
            __LINE__);
}

/* echo (vLLM's): a completion's text after its prompt's (as given, or as its ids
 * decode), streamed or not; a chat answer after the assistant's last message. */
TH_TEST(api_echo) {
  char a[512], b[512], want[600];
  complete("{\"prompt\":\"hello there\",\"max_tokens\":3,\"temperature\":0}", a);
  complete("{\"prompt\":\"hello there\",\"max_tokens\":3,\"temperature\":0,\"echo\":true}", b);
  snprintf(want, sizeof(want), "hello there%s", a);
  TH_CHECK_EQ_STR(b, want);
  struct as_resp r;
  TH_REQUIRE(as_post(server(), "/v1/completions",
                     "{\"prompt\":\"hello there\",\"max_tokens\":3,\"temperature\":0,"
                     "\"echo\":true,\"stream\":true}",
                     &r) == 200);
  char st[512];
  TH_CHECK(as_sse_text(r.body, 0, st, sizeof(st), NULL) > 0);
  TH_CHECK_EQ_STR(st, want);
  as_resp_free(&r);
  /* token ids: their text, special tokens included */
  complete("{\"prompt\":[2,10,11],\"max_tokens\":2,\"temperature\":0}", a);
  complete("{\"prompt\":[2,10,11],\"max_tokens\":2,\"temperature\":0,\"echo\":true}", b);
  json_t *d = post_ok("/detokenize", "{\"tokens\":[2,10,11]}", __LINE__);
  snprintf(want, sizeof(want), "%s%s", json_string_value(json_object_get(d, "prompt")), a);
  json_decref(d);
  TH_CHECK_EQ_STR(b, want);
  /* chat: after the assistant's message it continues */
  const char *msgs = "[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\","
                     "\"content\":\"Sure, \"}],\"continue_final_message\":true,"
                     "\"add_generation_prompt\":false,\"max_tokens\":2,\"temperature\":0";
  char body[512];
  snprintf(body, sizeof(body), "{\"messages\":%s}", msgs);
  json_t *c = post_ok("/v1/chat/completions", body, __LINE__);
  snprintf(want, sizeof(want), "Sure, %s",
           json_string_value(json_object_get(
               json_object_get(json_array_get(json_object_get(c, "choices"), 0), "message"),
               "content")));
  json_decref(c);
  snprintf(body, sizeof(body), "{\"messages\":%s,\"echo\":true}", msgs);
  c = post_ok("/v1/chat/completions", body, __LINE__);
  const char *got = json_string_value(json_object_get(
      json_object_get(json_array_get(json_object_get(c, "choices"), 0), "message"), "content"));
  TH_CHECK(got && !strcmp(got, want));
  json_decref(c);
}

/* prompt_logprobs (vLLM's): null, then per prompt token an object keyed by token id
 * holding its own entry (logprob, rank, decoded_token) and the top ones. Held to
 * the first token generated after each prefix of the prompt (its top logprobs, the
 * sampling path's), the same answer again (the prefix cache is not used for it),
 * chat's top-level field, echo with logprobs leading with the prompt's tokens (in a
 * stream, its first chunk), and
 * the 400s of a stream and of too many, and a server that prefills in chunks of 5
 * tokens (each chunk's last row scores the next one's first token), with the prompt
 * in its prefix cache already, giving the same array. The values themselves are
 * checked against transformers in test-wk-golden (golden_scores_*). */
/* "2,107,114,...": n prompt ids, token i (after the first) 100 + 7 i */
static void prompt_ids(char *out, size_t size, int n) {
  snprintf(out, size, "2");
  for (int i = 1; i < n; i++)
    snprintf(out + strlen(out), size - strlen(out), ",%d", 100 + 7 * i);
}

/* A completion's first choice's top logprobs at its first token (an object). */
static json_t *top_of_first(json_t *a) {
  json_t *lp = json_object_get(json_array_get(json_object_get(a, "choices"), 0), "logprobs");
  return json_array_get(json_object_get(lp, "top_logprobs"), 0);
}

TH_TEST(api_prompt_logprobs) {
  char ids[256], body[512];
  int n = 24;
  prompt_ids(ids, sizeof(ids), n);
  snprintf(body, sizeof(body),
           "{\"prompt\":[%s],\"max_tokens\":1,\"temperature\":0,\"prompt_logprobs\":2,"
           "\"return_tokens_as_token_ids\":true}",
           ids);
  json_t *a = post_ok("/v1/completions", body, __LINE__);
  json_t *again = post_ok("/v1/completions", body, __LINE__);
  json_t *pl = json_object_get(json_array_get(json_object_get(a, "choices"), 0), "prompt_logprobs");
  TH_REQUIRE((int)json_array_size(pl) == n);
  TH_CHECK(json_is_null(json_array_get(pl, 0)));
  TH_CHECK(json_equal(pl, json_object_get(json_array_get(json_object_get(again, "choices"), 0),
                                          "prompt_logprobs")));
  for (int i = 1; i < n; i++) {
    json_t *o = json_array_get(pl, (size_t)i);
    char key[16];
    snprintf(key, sizeof(key), "%d", 100 + 7 * i);
    json_t *own = json_object_get(o, key);
    TH_REQUIRE(own != NULL);
    TH_CHECK(json_integer_value(json_object_get(own, "rank")) >= 1);
    TH_CHECK(json_object_size(o) == 2 || json_object_size(o) == 3);
    if (i % 4 != 1) continue;
    /* the prefix before token i, one token generated: its top two are position i's */
    char pre[256], b2[512];
    prompt_ids(pre, sizeof(pre), i);
    snprintf(b2, sizeof(b2),
             "{\"prompt\":[%s],\"max_tokens\":1,\"temperature\":0,\"logprobs\":2,"
             "\"return_tokens_as_token_ids\":true}",
             pre);
    json_t *g = post_ok("/v1/completions", b2, __LINE__);
    json_t *top = top_of_first(g);
    TH_REQUIRE(json_object_size(top) == 2);
    const char *k;
    json_t *v;
    json_object_foreach(top, k, v) {
      int id = -1;
      TH_REQUIRE(sscanf(k, "token_id:%d", &id) == 1);
      char idk[16];
      snprintf(idk, sizeof(idk), "%d", id);
      json_t *e = json_object_get(o, idk);
      if (!e) {
        th_fail(__FILE__, __LINE__,
                "position %d: token %d is among the generated top two, "
                "not the prompt's",
                i, id);
        continue;
      }
      double d = json_real_value(json_object_get(e, "logprob")) - json_real_value(v);
      if (!(fabs(d) < 1e-5))
        th_fail(__FILE__, __LINE__, "position %d: token %d: %g here, %g generated", i, id,
                json_real_value(json_object_get(e, "logprob")), json_real_value(v));
    }
    json_decref(g);
  }
  /* echo with logprobs: the prompt's tokens lead, the first without a logprob */
  snprintf(body, sizeof(body),
           "{\"prompt\":[%s],\"max_tokens\":2,\"temperature\":0,\"echo\":true,"
           "\"logprobs\":1}",
           ids);
  json_t *ec = post_ok("/v1/completions", body, __LINE__);
  json_t *lp = json_object_get(json_array_get(json_object_get(ec, "choices"), 0), "logprobs");
  json_t *tl = json_object_get(lp, "token_logprobs");
  TH_REQUIRE((int)json_array_size(tl) == n + 2);
  TH_CHECK(json_is_null(json_array_get(tl, 0)));
  TH_CHECK(json_is_null(json_array_get(json_object_get(lp, "top_logprobs"), 0)));
  for (int i = 1; i < n; i++) {
    char key[16];
    snprintf(key, sizeof(key), "%d", 100 + 7 * i);
    json_t *own = json_object_get(json_array_get(pl, (size_t)i), key);
    TH_CHECK(fabs(json_real_value(json_array_get(tl, (size_t)i)) -
                  json_real_value(json_object_get(own, "logprob"))) < 1e-6);
  }
  /* streamed, the first chunk leads with them (the text after the echo's) */
  snprintf(body, sizeof(body),
           "{\"prompt\":[%s],\"max_tokens\":2,\"temperature\":0,\"echo\":true,"
           "\"logprobs\":1,\"stream\":true}",
           ids);
  struct as_resp sr;
  TH_REQUIRE(as_post(server(), "/v1/completions", body, &sr) == 200);
  const char *d0 = strstr(sr.body, "data: ");
  const char *d1 = d0 ? strstr(d0 + 6, "\n") : NULL;
  json_t *c0 = d1 ? json_loadb(d0 + 6, (size_t)(d1 - d0 - 6), 0, NULL) : NULL;
  json_t *sl = json_object_get(
      json_object_get(json_array_get(json_object_get(c0, "choices"), 0), "logprobs"),
      "token_logprobs");
  TH_REQUIRE((int)json_array_size(sl) >= n + 1);
  for (int i = 0; i <= n; i++)
    TH_CHECK(json_equal(json_array_get(sl, (size_t)i), json_array_get(tl, (size_t)i)));
  json_decref(c0);
  as_resp_free(&sr);
  json_decref(ec);
  /* chunked prefill, after the same prompt went into the prefix cache */
  th_proc_init(300);
  struct as_server s4;
  memset(&s4, 0, sizeof(s4));
  as_start(&s4, 0, (char *[]){"--max-model-len", "512", "--max-num-batched-tokens", "5", NULL});
  char plain[512];
  snprintf(plain, sizeof(plain), "{\"prompt\":[%s],\"max_tokens\":1}", ids);
  struct as_resp r;
  TH_CHECK_EQ_INT(as_post(&s4, "/v1/completions", plain, &r), 200);
  as_resp_free(&r);
  snprintf(body, sizeof(body),
           "{\"prompt\":[%s],\"max_tokens\":1,\"temperature\":0,\"prompt_logprobs\":2,"
           "\"return_tokens_as_token_ids\":true}",
           ids);
  TH_CHECK_EQ_INT(as_post(&s4, "/v1/completions", body, &r), 200);
  json_t *ch = as_json(&r);
  TH_CHECK(json_equal(
      pl, json_object_get(json_array_get(json_object_get(ch, "choices"), 0), "prompt_logprobs")));
  json_decref(ch);
  as_resp_free(&r);
  as_stop(&s4);
  json_decref(a);
  json_decref(again);
  /* chat: in the response, one entry per prompt token */
  json_t *c = post_ok("/v1/chat/completions",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi there\"}],"
                      "\"max_tokens\":1,\"prompt_logprobs\":0}",
                      __LINE__);
  json_t *cp = json_object_get(c, "prompt_logprobs");
  TH_CHECK_EQ_INT((int)json_array_size(cp), (int)json_integer_value(json_object_get(
                                                json_object_get(c, "usage"), "prompt_tokens")));
  TH_CHECK(json_object_size(json_array_get(cp, 1)) >= 1);
  json_decref(c);
  check_400("/v1/completions", "{\"prompt\":\"x\",\"prompt_logprobs\":1,\"stream\":true}",
            "prompt_logprobs", "stream", __LINE__);
  check_400("/v1/completions", "{\"prompt\":\"x\",\"prompt_logprobs\":21}", "prompt_logprobs", NULL,
            __LINE__);
}

#define BEAM_W   3 /* beams */
#define BEAM_LEN 4 /* tokens each at most */
#define BEAM_P   4 /* prompt tokens */

/* a beam of the test's own search */
struct tbeam {
  int toks[BEAM_LEN];
  int n, stop;
  double cum, score;
};

static int tbeam_cum_cmp(const void *a, const void *b) {
  const struct tbeam *x = a, *y = b;
  return x->cum > y->cum ? -1 : x->cum < y->cum ? 1 : 0;
}

static int tbeam_score_cmp(const void *a, const void *b) {
  const struct tbeam *x = a, *y = b;
  return x->score > y->score ? -1 : x->score < y->score ? 1 : 0;
}

/* vLLM's beam search, run here over the server's one-token answers (2 w best raw
 * logprobs of each beam): a candidate that is stop_id completes its beam, the w best
 * others live on; after BEAM_LEN steps the best w of all, by cumulative logprob over
 * (prompt + tokens, a stop id not)^penalty, into best[w]. */
static void ref_beams(const char *prompt, int stop_id, double penalty, struct tbeam *best) {
  struct tbeam live[BEAM_W] = {{{0}, 0, 0, 0, 0}}, cand[BEAM_W * 2 * BEAM_W];
  struct tbeam done[BEAM_W * 2 * BEAM_W * BEAM_LEN + BEAM_W];
  int n_live = 1, n_done = 0;
  for (int step = 0; step < BEAM_LEN; step++) {
    int n_c = 0;
    for (int b = 0; b < n_live; b++) {
      char body[512], toks[128] = "";
      for (int i = 0; i < live[b].n; i++)
        snprintf(toks + strlen(toks), sizeof(toks) - strlen(toks), ",%d", live[b].toks[i]);
      snprintf(body, sizeof(body),
               "{\"prompt\":[%s%s],\"max_tokens\":1,\"temperature\":0,\"logprobs\":%d,"
               "\"ignore_eos\":true,\"return_tokens_as_token_ids\":true}",
               prompt, toks, 2 * BEAM_W);
      json_t *a = post_ok("/v1/completions", body, __LINE__);
      json_t *top = top_of_first(a);
      TH_REQUIRE(json_object_size(top) == 2 * BEAM_W);
      const char *k;
      json_t *v;
      json_object_foreach(top, k, v) {
        struct tbeam c = live[b];
        TH_REQUIRE(sscanf(k, "token_id:%d", &c.toks[c.n]) == 1);
        c.cum += json_real_value(v);
        c.stop = c.toks[c.n++] == stop_id;
        if (c.stop)
          done[n_done++] = c;
        else
          cand[n_c++] = c;
      }
      json_decref(a);
    }
    qsort(cand, (size_t)n_c, sizeof(*cand), tbeam_cum_cmp);
    n_live = n_c < BEAM_W ? n_c : BEAM_W;
    memcpy(live, cand, sizeof(*live) * (size_t)n_live);
  }
  for (int b = 0; b < n_live; b++)
    done[n_done++] = live[b];
  for (int b = 0; b < n_done; b++)
    done[b].score = done[b].cum / pow(BEAM_P + done[b].n - done[b].stop, penalty);
  qsort(done, (size_t)n_done, sizeof(*done), tbeam_score_cmp);
  TH_REQUIRE(n_done >= BEAM_W);
  memcpy(best, done, sizeof(*best) * BEAM_W);
}

/* The server's beams for the same search: its choices, best first, against want. */
static void check_beams(const char *prompt, const char *extra, const struct tbeam *want) {
  char body[512];
  snprintf(body, sizeof(body),
           "{\"prompt\":[%s],\"max_tokens\":%d,\"use_beam_search\":true,\"n\":%d,"
           "\"ignore_eos\":true,\"return_token_ids\":true,\"logprobs\":0%s}",
           prompt, BEAM_LEN, BEAM_W, extra);
  json_t *a = post_ok("/v1/completions", body, __LINE__);
  json_t *chs = json_object_get(a, "choices");
  TH_REQUIRE(json_array_size(chs) == BEAM_W);
  for (int b = 0; b < BEAM_W; b++) {
    json_t *ch = json_array_get(chs, (size_t)b), *ids = json_object_get(ch, "token_ids");
    json_t *lps = json_object_get(json_object_get(ch, "logprobs"), "token_logprobs");
    TH_CHECK_EQ_INT((int)json_integer_value(json_object_get(ch, "index")), b);
    TH_CHECK_EQ_STR(json_string_value(json_object_get(ch, "finish_reason")),
                    want[b].stop ? "stop" : "length");
    TH_REQUIRE((int)json_array_size(ids) == want[b].n && (int)json_array_size(lps) == want[b].n);
    double cum = 0;
    for (int i = 0; i < want[b].n; i++) {
      TH_CHECK_EQ_INT((int)json_integer_value(json_array_get(ids, (size_t)i)), want[b].toks[i]);
      cum += json_real_value(json_array_get(lps, (size_t)i));
    }
    if (!(fabs(cum - want[b].cum) < 1e-4))
      th_fail(__FILE__, __LINE__, "beam %d: cumulative logprob %g, the test's search %g", b, cum,
              want[b].cum);
  }
  json_decref(a);
}

/* use_beam_search (vLLM's): held to a beam search the test runs itself over the
 * server's one-token answers, the answer's choices its w beams best first, their
 * logprobs each token's: EOS ids ignored (the tiny model's random weights seldom rank
 * one among the best), then with a stop id that the first step ranks second, which
 * completes a beam of one token (with length_penalty 0.5 it ranks first); one beam is
 * the greedy answer; several prompts and a chat answer; and the 400s of what it
 * cannot be combined with. */
TH_TEST(api_beam_search) {
  const char *prompt = "2,651,6037,576";
  struct tbeam want[BEAM_W];
  ref_beams(prompt, -1, 1.0, want);
  check_beams(prompt, "", want);
  /* the first step's second best as a stop id */
  json_t *a = post_ok("/v1/completions",
                      "{\"prompt\":[2,651,6037,576],\"max_tokens\":1,\"temperature\":0,"
                      "\"logprobs\":2,\"return_tokens_as_token_ids\":true}",
                      __LINE__);
  json_t *top = top_of_first(a);
  int stop = -1, i = 0;
  const char *k;
  json_t *v;
  json_object_foreach(top, k, v) {
    if (i++ == 1) TH_REQUIRE(sscanf(k, "token_id:%d", &stop) == 1);
  }
  json_decref(a);
  TH_REQUIRE(stop >= 0);
  ref_beams(prompt, stop, 0.5, want);
  TH_CHECK(want[0].stop && want[0].n == 1);
  char extra[96];
  snprintf(extra, sizeof(extra), ",\"stop_token_ids\":[%d],\"length_penalty\":0.5", stop);
  check_beams(prompt, extra, want);
  /* one beam ranks each step's best first: the greedy answer */
  char g1[512], b1[512];
  complete("{\"prompt\":[2,651,6037,576],\"max_tokens\":4,\"temperature\":0,"
           "\"ignore_eos\":true}",
           g1);
  complete("{\"prompt\":[2,651,6037,576],\"max_tokens\":4,\"use_beam_search\":true,"
           "\"ignore_eos\":true}",
           b1);
  TH_CHECK_EQ_STR(b1, g1);
  /* several prompts: n choices each, in order; a chat answer */
  json_t *m = post_ok("/v1/completions",
                      "{\"prompt\":[[2,651,6037,576],[2,9259]],\"max_tokens\":2,"
                      "\"use_beam_search\":true,\"n\":2}",
                      __LINE__);
  TH_CHECK_EQ_INT((int)json_array_size(json_object_get(m, "choices")), 4);
  TH_CHECK_EQ_INT((int)as_jint(m, "usage", "completion_tokens"), 8);
  json_decref(m);
  json_t *c = post_ok("/v1/chat/completions",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2,"
                      "\"use_beam_search\":true,\"n\":2}",
                      __LINE__);
  TH_CHECK_EQ_INT((int)json_array_size(json_object_get(c, "choices")), 2);
  json_decref(c);
  static const struct {
    const char *extra, *param;
  } no[] = {{",\"stream\":true", "stream"},
            {",\"n\":11", "n"},
            {",\"logit_bias\":{\"5\":1}", "logit_bias"},
            {",\"allowed_token_ids\":[5,6]", "allowed_token_ids"},
            {",\"presence_penalty\":0.5", "presence_penalty"},
            {",\"min_tokens\":1", "min_tokens"},
            {",\"prompt_logprobs\":1", "prompt_logprobs"},
            {",\"echo\":true,\"logprobs\":1", "echo"},
            {",\"structured_outputs\":{\"regex\":\"a+\"}", "structured_outputs"}};
  for (size_t j = 0; j < sizeof(no) / sizeof(no[0]); j++) {
    char body[160];
    snprintf(body, sizeof(body), "{\"prompt\":\"x\",\"use_beam_search\":true%s}", no[j].extra);
    check_400("/v1/completions", body, no[j].param, NULL, __LINE__);
  }
}

/* --enable-prompt-tokens-details (vLLM's): usage.prompt_tokens_details.cached_tokens,
 * 0 the first time and the cached blocks' tokens after, in answers and a
 * stream's usage chunk; without the flag no such field. */
TH_TEST(api_prompt_tokens_details) {
  th_proc_init(300);
  struct as_server s3;
  memset(&s3, 0, sizeof(s3));
  as_start(&s3, 0, (char *[]){"--max-model-len", "512", "--enable-prompt-tokens-details", NULL});
  char body[4096];
  size_t n = (size_t)snprintf(body, sizeof(body), "{\"prompt\":[2");
  for (int i = 1; i < 200; i++)
    n += (size_t)snprintf(body + n, sizeof(body) - n, ",%d", 5000 + i);
  snprintf(body + n, sizeof(body) - n, "],\"max_tokens\":1}");
  for (int k = 0; k < 2; k++) {
    struct as_resp r;
    TH_REQUIRE(as_post(&s3, "/v1/completions", body, &r) == 200);
    json_t *j = as_json(&r);
    as_resp_free(&r);
    json_t *d = json_object_get(json_object_get(j, "usage"), "prompt_tokens_details");
    TH_REQUIRE(json_is_integer(json_object_get(d, "cached_tokens")));
    long long c = (long long)json_integer_value(json_object_get(d, "cached_tokens"));
    if (k == 0 ? c != 0 : !(c > 0 && c < 200))
      th_fail(__FILE__, __LINE__, "request %d: %lld cached tokens", k, c);
    json_decref(j);
  }
  snprintf(body + n, sizeof(body) - n,
           "],\"max_tokens\":1,\"stream\":true,\"stream_options\":{\"include_usage\":true}}");
  struct as_resp r;
  TH_REQUIRE(as_post(&s3, "/v1/completions", body, &r) == 200);
  char t[256];
  json_t *u = NULL;
  TH_CHECK(as_sse_text(r.body, 0, t, sizeof(t), &u) > 0);
  TH_CHECK(json_integer_value(
               json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")) > 0);
  json_decref(u);
  as_resp_free(&r);
  as_stop(&s3);
  /* the default server: no details */
  json_t *j = post_ok("/v1/completions", "{\"prompt\":[2,3],\"max_tokens\":1}", __LINE__);
  TH_CHECK(json_object_get(json_object_get(j, "usage"), "prompt_tokens_details") == NULL);
  json_decref(j);
}

/* The ids of a completion's logprobs (return_tokens_as_token_ids) into ids[n], and
 * the first token's reported logprob. */
static double completion_ids(const char *body, int *ids, int n) {
  json_t *j = post_ok("/v1/completions", body, __LINE__);
  json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
  json_t *toks = json_object_get(lp, "tokens");
  TH_REQUIRE((int)json_array_size(toks) == n);
  for (int i = 0; i < n; i++)
    TH_REQUIRE(sscanf(json_string_value(json_array_get(toks, i)), "token_id:%d", &ids[i]) == 1);
  double first = json_number_value(json_array_get(json_object_get(lp, "token_logprobs"), 0));
  json_decref(j);
  return first;
}

static int same_ints(const int *a, const int *b, int n) {
  return !memcmp(a, b, sizeof(int) * (size_t)n);
}

/* The ids of a JSON array into ids[] (at most cap); how many. */
static int id_array(json_t *a, int *ids, int cap) {
  int n = (int)json_array_size(a);
  TH_REQUIRE(n <= cap);
  for (int i = 0; i < n; i++)
    ids[i] = (int)json_integer_value(json_array_get(a, (size_t)i));
  return n;
}

/* A completion's choices: each one's token_ids into ids[c] (at most 16), its length
 * and the sum of its token_logprobs (0 without logprobs); how many choices. */
struct tdraw {
  int ids[16], n;
  double cum;
};

static int draws_of(json_t *a, struct tdraw *d, int cap) {
  json_t *chs = json_object_get(a, "choices");
  int n = (int)json_array_size(chs);
  TH_REQUIRE(n <= cap);
  for (int c = 0; c < n; c++) {
    json_t *ch = json_array_get(chs, (size_t)c);
    TH_CHECK_EQ_INT((int)json_integer_value(json_object_get(ch, "index")), c);
    d[c].n = id_array(json_object_get(ch, "token_ids"), d[c].ids, 16);
    json_t *lps = json_object_get(json_object_get(ch, "logprobs"), "token_logprobs");
    d[c].cum = 0;
    for (size_t i = 0; i < json_array_size(lps); i++)
      d[c].cum += json_real_value(json_array_get(lps, i));
  }
  return n;
}

/* best_of above n (vLLM's, OpenAI's): the answer's n choices are the n of the best_of
 * the server drew with the highest cumulative logprob, best first. A choice is drawn
 * with the request's seed plus its index, so the same request with n = best_of and
 * logprobs shows every draw, and the test ranks them itself; the usage counts every
 * draw's tokens. Then several prompts, a chat, and the 400s. */
TH_TEST(api_best_of) {
  double n_sum = as_metric(server(), "lmserve:request_params_n_sum");
  double n_count = as_metric(server(), "lmserve:request_params_n_count");
  const char *head = "{\"prompt\":[2,651,6037,576],\"max_tokens\":6,\"temperature\":1.5,"
                     "\"seed\":7,\"ignore_eos\":true,\"return_token_ids\":true,";
  char body[512];
  snprintf(body, sizeof(body), "%s\"n\":4,\"logprobs\":0}", head);
  json_t *a = post_ok("/v1/completions", body, __LINE__);
  struct tdraw all[4], tmp;
  TH_REQUIRE(draws_of(a, all, 4) == 4);
  json_decref(a);
  for (int i = 1; i < 4; i++) /* best first, the earlier of equals first */
    for (int j = i; j > 0 && all[j - 1].cum < all[j].cum; j--)
      tmp = all[j], all[j] = all[j - 1], all[j - 1] = tmp;
  for (int with_lp = 0; with_lp < 2; with_lp++) {
    snprintf(body, sizeof(body), "%s\"n\":2,\"best_of\":4%s}", head,
             with_lp ? ",\"logprobs\":0" : "");
    a = post_ok("/v1/completions", body, __LINE__);
    struct tdraw got[4];
    TH_REQUIRE(draws_of(a, got, 4) == 2);
    for (int c = 0; c < 2; c++) {
      TH_CHECK(got[c].n == all[c].n && same_ints(got[c].ids, all[c].ids, got[c].n));
      if (with_lp && !(fabs(got[c].cum - all[c].cum) < 1e-4))
        th_fail(__FILE__, __LINE__, "choice %d: cumulative logprob %g, not %g", c, got[c].cum,
                all[c].cum);
    }
    json_t *lp = json_object_get(json_array_get(json_object_get(a, "choices"), 0), "logprobs");
    TH_CHECK(with_lp ? json_is_object(lp) : lp == NULL || json_is_null(lp));
    TH_CHECK_EQ_INT((int)as_jint(a, "usage", "completion_tokens"), 24);
    json_decref(a);
  }
  static const struct {
    const char *path, *body;
    int choices, tokens;
  } more[] = {{"/v1/completions",
               "{\"prompt\":[[2,651,6037,576],[2,9259]],\"max_tokens\":2,\"best_of\":3,"
               "\"ignore_eos\":true}",
               2, 12},
              {"/v1/chat/completions",
               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2,"
               "\"n\":2,\"best_of\":3,\"ignore_eos\":true}",
               2, 6}};
  for (size_t i = 0; i < sizeof(more) / sizeof(more[0]); i++) {
    a = post_ok(more[i].path, more[i].body, __LINE__);
    TH_CHECK_EQ_INT((int)json_array_size(json_object_get(a, "choices")), more[i].choices);
    TH_CHECK_EQ_INT((int)as_jint(a, "usage", "completion_tokens"), more[i].tokens);
    json_decref(a);
  }
  check_400("/v1/completions", "{\"prompt\":\"x\",\"best_of\":2,\"stream\":true}", "best_of", NULL,
            __LINE__);
  check_400("/v1/completions", "{\"prompt\":\"x\",\"n\":2,\"best_of\":1}", "best_of", NULL,
            __LINE__);
  /* /metrics' n of each request: the n it answered with (4, 2, 2, 1, 2), not best_of */
  TH_CHECK_EQ_INT((int)(as_metric(server(), "lmserve:request_params_n_sum") - n_sum), 11);
  TH_CHECK_EQ_INT((int)(as_metric(server(), "lmserve:request_params_n_count") - n_count), 5);
}

/* return_token_ids through a stream of path: the chunks' token_ids one after another
 * into ids (how many), the first chunk's prompt_token_ids (a chat's at the top level,
 * a completion's in its choice; none in the later chunks) into prompt (*n_prompt). */
static int streamed_ids(const char *path, const char *body, int *ids, int *prompt, int *n_prompt) {
  struct as_resp r;
  TH_REQUIRE(as_post(server(), path, body, &r) == 200);
  int n = 0, chunks = 0, chat = strstr(path, "chat") != NULL;
  *n_prompt = -1;
  for (const char *at = r.body; (at = strstr(at, "data: ")); at += 6) {
    if (!strncmp(at + 6, "[DONE]", 6)) break;
    json_t *j = json_loads(at + 6, JSON_DISABLE_EOF_CHECK, NULL);
    TH_REQUIRE(j != NULL);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    json_t *p = json_object_get(chat ? j : c, "prompt_token_ids");
    if (chunks++ == 0) {
      TH_REQUIRE(p != NULL);
      *n_prompt = id_array(p, prompt, 256);
    } else {
      TH_CHECK(p == NULL);
    }
    json_t *t = json_object_get(c, "token_ids");
    if (c) TH_CHECK(json_is_array(t));
    n += id_array(t, ids + n, 64 - n);
    json_decref(j);
  }
  as_resp_free(&r);
  return n;
}

/* A structured output whose tokens allowed_token_ids all refuse, or bad_words all ban:
 * the constraints cannot all hold, and the request is answered within its grammar
 * (the step is not failed, so its batch and the server go on). */
TH_TEST(api_constraints_that_leave_nothing) {
  const char *bodies[] = {
      "{\"prompt\":[2,10,11],\"max_tokens\":4,\"temperature\":0,"
      "\"structured_outputs\":{\"choice\":[\"yes\",\"no\"]},\"allowed_token_ids\":[9259]}",
      "{\"prompt\":[2,10,11],\"max_tokens\":4,\"temperature\":0.8,\"seed\":4,"
      "\"structured_outputs\":{\"choice\":[\"yes\",\"no\"]},\"allowed_token_ids\":[9259]}",
      "{\"prompt\":[2,10,11],\"max_tokens\":4,\"temperature\":0,"
      "\"structured_outputs\":{\"choice\":[\"yes\",\"no\"]},\"bad_words\":[\"yes\",\"no\"]}"};
  for (int i = 0; i < 3; i++) {
    json_t *j = post_ok("/v1/completions", bodies[i], __LINE__);
    const char *t = as_jstr(j, "choices", 0, "text");
    TH_CHECK(t && (!strcmp(t, "yes") || !strcmp(t, "no")));
    json_decref(j);
  }
  json_decref(post_ok("/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2}", __LINE__));
}

/* return_token_ids (vLLM's): a completion's choice carries its prompt's ids (those
 * /tokenize gives the text) and its answer's (those its logprobs name); a chat answer
 * its prompt's at the top level (those /tokenize gives the messages); streamed, the
 * first chunk the prompt's and the chunks' ids add up to the answer's; without it,
 * neither field. */
TH_TEST(api_return_token_ids) {
  int want[64], got[64], prompt[256], tok[256], n_prompt;
  const char *tail = "\"max_tokens\":6,\"temperature\":0,\"ignore_eos\":true,"
                     "\"logprobs\":0,\"return_tokens_as_token_ids\":true",
             *chat_tail = "\"max_tokens\":6,\"temperature\":0,\"ignore_eos\":true,"
                          "\"logprobs\":true,\"return_tokens_as_token_ids\":true";
  char body[1024];
  snprintf(body, sizeof(body), "{\"prompt\":\"hello there\",%s,\"return_token_ids\":true}", tail);
  completion_ids(body, want, 6);
  json_t *j = post_ok("/v1/completions", body, __LINE__);
  json_t *c = json_array_get(json_object_get(j, "choices"), 0);
  TH_CHECK_EQ_INT(id_array(json_object_get(c, "token_ids"), got, 64), 6);
  TH_CHECK(same_ints(got, want, 6));
  n_prompt = id_array(json_object_get(c, "prompt_token_ids"), prompt, 256);
  json_decref(j);
  j = post_ok("/tokenize", "{\"prompt\":\"hello there\"}", __LINE__);
  int n_tok = id_array(json_object_get(j, "tokens"), tok, 256);
  json_decref(j);
  TH_CHECK_EQ_INT(n_prompt, n_tok);
  TH_CHECK(same_ints(prompt, tok, n_tok));
  snprintf(body, sizeof(body),
           "{\"prompt\":\"hello there\",%s,\"return_token_ids\":true,"
           "\"stream\":true}",
           tail);
  TH_CHECK_EQ_INT(streamed_ids("/v1/completions", body, got, prompt, &n_prompt), 6);
  TH_CHECK(same_ints(got, want, 6));
  TH_CHECK(n_prompt == n_tok && same_ints(prompt, tok, n_tok));
  /* chat */
  const char *msgs = "\"messages\":[{\"role\":\"user\",\"content\":\"hello there\"}]";
  snprintf(body, sizeof(body), "{%s}", msgs);
  j = post_ok("/tokenize", body, __LINE__);
  n_tok = id_array(json_object_get(j, "tokens"), tok, 256);
  json_decref(j);
  snprintf(body, sizeof(body), "{%s,%s,\"return_token_ids\":true}", msgs, chat_tail);
  j = post_ok("/v1/chat/completions", body, __LINE__);
  c = json_array_get(json_object_get(j, "choices"), 0);
  TH_CHECK_EQ_INT(id_array(json_object_get(c, "token_ids"), want, 64), 6);
  json_t *content = json_object_get(json_object_get(c, "logprobs"), "content");
  for (int i = 0; i < 6; i++) {
    int id = -1;
    const char *t = json_string_value(json_object_get(json_array_get(content, (size_t)i), "token"));
    TH_CHECK(t && sscanf(t, "token_id:%d", &id) == 1 && id == want[i]);
  }
  n_prompt = id_array(json_object_get(j, "prompt_token_ids"), prompt, 256);
  TH_CHECK(n_prompt == n_tok && same_ints(prompt, tok, n_tok));
  json_decref(j);
  snprintf(body, sizeof(body), "{%s,%s,\"return_token_ids\":true,\"stream\":true}", msgs,
           chat_tail);
  TH_CHECK_EQ_INT(streamed_ids("/v1/chat/completions", body, got, prompt, &n_prompt), 6);
  TH_CHECK(same_ints(got, want, 6));
  TH_CHECK(n_prompt == n_tok && same_ints(prompt, tok, n_tok));
  /* off: neither field */
  snprintf(body, sizeof(body), "{%s,%s}", msgs, chat_tail);
  j = post_ok("/v1/chat/completions", body, __LINE__);
  c = json_array_get(json_object_get(j, "choices"), 0);
  TH_CHECK(!json_object_get(c, "token_ids") && !json_object_get(j, "prompt_token_ids"));
  json_decref(j);
}

/* A completion whose field `param` holds 1025 ids (an object of ids to 1, or a list)
 * must be a 400 saying how many it may hold. */
static void too_many_ids(const char *param, int object) {
  char *big = malloc(20000);
  TH_REQUIRE(big != NULL);
  size_t n =
      (size_t)snprintf(big, 20000, "{\"prompt\":\"hi\",\"%s\":%c", param, object ? '{' : '[');
  for (int i = 0; i <= 1024; i++)
    n += (size_t)(object ? snprintf(big + n, 20000 - n, "%s\"%d\":1", i ? "," : "", i)
                         : snprintf(big + n, 20000 - n, "%s%d", i ? "," : "", i));
  snprintf(big + n, 20000 - n, "%c}", object ? '}' : ']');
  check_400("/v1/completions", big, param, "at most", __LINE__);
  free(big);
}

/* logit_bias (OpenAI's): +100 makes a token every draw, greedy or seeded; -100 bans
 * the greedy one; the logprobs reported stay the raw model's. */
TH_TEST(api_logit_bias) {
  const char *base = "{\"prompt\":[2,10,11],\"max_tokens\":3,\"logprobs\":0,"
                     "\"return_tokens_as_token_ids\":true,\"ignore_eos\":true";
  char body[512];
  int plain[3], got[3];
  snprintf(body, sizeof(body), "%s,\"temperature\":0}", base);
  completion_ids(body, plain, 3);
  snprintf(body, sizeof(body), "%s,\"temperature\":0,\"logit_bias\":{\"9259\":100}}", base);
  double lp = completion_ids(body, got, 3);
  for (int i = 0; i < 3; i++)
    TH_CHECK_EQ_INT(got[i], 9259);
  TH_CHECK(lp < -1.0); /* raw: the bias would have made it about 0 */
  snprintf(body, sizeof(body), "%s,\"temperature\":1,\"seed\":5,\"logit_bias\":{\"9259\":100}}",
           base);
  completion_ids(body, got, 3);
  for (int i = 0; i < 3; i++)
    TH_CHECK_EQ_INT(got[i], 9259);
  snprintf(body, sizeof(body), "%s,\"temperature\":0,\"logit_bias\":{\"%d\":-100}}", base,
           plain[0]);
  completion_ids(body, got, 3);
  TH_CHECK(got[0] != plain[0]);
  too_many_ids("logit_bias", 1);
}

/* The first position's top n raw logprobs of a greedy completion of base (ids, values). */
static void first_top(const char *base, int n, int *ids, double *lps) {
  char body[512];
  snprintf(body, sizeof(body), "%s,\"temperature\":0,\"logprobs\":%d}", base, n);
  json_t *j = post_ok("/v1/completions", body, __LINE__);
  json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
  json_t *top = json_array_get(json_object_get(lp, "top_logprobs"), 0);
  TH_REQUIRE((int)json_object_size(top) == n);
  const char *k;
  json_t *v;
  int i = 0;
  json_object_foreach(top, k, v) {
    TH_REQUIRE(sscanf(k, "token_id:%d", &ids[i]) == 1);
    lps[i++] = json_number_value(v);
  }
  for (int a = 0; a < n; a++) /* best first */
    for (int b = a + 1; b < n; b++)
      if (lps[b] > lps[a]) {
        double t = lps[a];
        int u = ids[a];
        lps[a] = lps[b], ids[a] = ids[b], lps[b] = t, ids[b] = u;
      }
  json_decref(j);
}

static int in_set(int id, const int *set, int n) {
  for (int i = 0; i < n; i++)
    if (set[i] == id) return 1;
  return 0;
}

/* allowed_token_ids (vLLM's): a greedy row takes the allowed token the raw
 * distribution ranks best (read from the unconstrained request's top logprobs), with
 * its raw logprob; every token of greedy and seeded completions, and of a chat
 * answer, is allowed; a logit_bias moves the choice within the set and cannot leave
 * it; ids listed twice count once; more than 1024 is a 400; [] asks for nothing. */
TH_TEST(api_allowed_token_ids) {
  const char *base = "{\"prompt\":[2,10,11],\"max_tokens\":4,"
                     "\"return_tokens_as_token_ids\":true,\"ignore_eos\":true";
  int top[5], got[4];
  double tlp[5];
  first_top(base, 5, top, tlp);
  const int set[3] = {top[2], top[4], top[3]};
  char body[768];
  snprintf(body, sizeof(body),
           "%s,\"temperature\":0,\"logprobs\":0,\"allowed_token_ids\":[%d,%d,%d,%d]}", base, set[0],
           set[1], set[2], set[0]);
  double lp = completion_ids(body, got, 4);
  TH_CHECK_EQ_INT(got[0], top[2]);
  TH_CHECK_NEAR(lp, tlp[2], 1e-4);
  for (int i = 0; i < 4; i++)
    TH_CHECK(in_set(got[i], set, 3));
  snprintf(body, sizeof(body),
           "%s,\"temperature\":1.5,\"seed\":3,\"logprobs\":0,"
           "\"allowed_token_ids\":[%d,%d,%d]}",
           base, set[0], set[1], set[2]);
  completion_ids(body, got, 4);
  for (int i = 0; i < 4; i++)
    TH_CHECK(in_set(got[i], set, 3));
  /* a bias within the set moves the choice; one outside it does nothing */
  snprintf(body, sizeof(body),
           "%s,\"temperature\":0,\"logprobs\":0,\"allowed_token_ids\":[%d,%d,%d],"
           "\"logit_bias\":{\"%d\":100,\"%d\":100}}",
           base, set[0], set[1], set[2], set[1], top[0]);
  completion_ids(body, got, 4);
  for (int i = 0; i < 4; i++)
    TH_CHECK_EQ_INT(got[i], set[1]);
  /* chat: every generated token allowed (the answer's ids through the logprobs) */
  snprintf(body, sizeof(body),
           "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3,"
           "\"ignore_eos\":true,\"logprobs\":true,\"return_tokens_as_token_ids\":true,"
           "\"allowed_token_ids\":[%d,%d,%d]}",
           set[0], set[1], set[2]);
  json_t *j = post_ok("/v1/chat/completions", body, __LINE__);
  json_t *content = json_object_get(
      json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "content");
  TH_CHECK_EQ_INT((int)json_array_size(content), 3);
  for (size_t i = 0; i < json_array_size(content); i++) {
    int id = -1;
    const char *t = json_string_value(json_object_get(json_array_get(content, i), "token"));
    TH_CHECK(t && sscanf(t, "token_id:%d", &id) == 1 && in_set(id, set, 3));
  }
  json_decref(j);
  /* [] is the field's "off" value */
  snprintf(body, sizeof(body), "%s,\"temperature\":0,\"logprobs\":0,\"allowed_token_ids\":[]}",
           base);
  completion_ids(body, got, 4);
  TH_CHECK_EQ_INT(got[0], top[0]);
  too_many_ids("allowed_token_ids", 0);
}

/* The token ids of text as /tokenize gives them without special tokens (at most 32). */
static int tokenize_text(const char *text, int *ids) {
  json_t *b = json_pack("{s:s, s:b}", "prompt", text, "add_special_tokens", 0);
  char *body = json_dumps(b, JSON_COMPACT);
  json_decref(b);
  json_t *j = post_ok("/tokenize", body, __LINE__);
  free(body);
  json_t *t = json_object_get(j, "tokens");
  int n = (int)json_array_size(t);
  TH_REQUIRE(n >= 1 && n <= 32);
  for (int i = 0; i < n; i++)
    ids[i] = (int)json_integer_value(json_array_get(t, (size_t)i));
  json_decref(j);
  return n;
}

/* The first index i of gen[n] where gen[i - len + 1 .. i] is one of the n_seq
 * sequences (seq[k] of lens[k] ids) within gen, or n. */
static int first_bad(const int *gen, int n, int seq[][32], const int *lens, int n_seq) {
  for (int i = 0; i < n; i++)
    for (int k = 0; k < n_seq; k++) {
      int L = lens[k], j = 0;
      if (L > i + 1) continue;
      while (j < L && gen[i - L + 1 + j] == seq[k][j])
        j++;
      if (j == L) return i;
    }
  return n;
}

/* bad_words (vLLM's): each word's token sequences as vLLM makes them (the word
 * without its leading white space, then with one space before it where that gives as
 * many tokens with another first one, both from /tokenize); a greedy completion then
 * equals the unconstrained one up to where that one first ends a sequence, differs
 * there, and never ends one. One and two-token words; bad lists are 400s. */
TH_TEST(api_bad_words) {
  const char *base = "{\"prompt\":[2,10,11],\"max_tokens\":10,\"temperature\":0,"
                     "\"logprobs\":0,\"return_tokens_as_token_ids\":true,\"ignore_eos\":true";
  enum { N = 10 };
  int plain[N], got[N];
  char body[2048];
  snprintf(body, sizeof(body), "%s}", base);
  completion_ids(body, plain, N);
  int triggered = 0;
  for (int c = 0; c < 4; c++) {
    int from = c < 2 ? c : c - 1, n_tok = c < 2 ? 1 : 2; /* words of 1 and 2 tokens */
    snprintf(body, sizeof(body), "{\"tokens\":[%d,%d]}", plain[from], plain[from + 1]);
    if (n_tok == 1) snprintf(body, sizeof(body), "{\"tokens\":[%d]}", plain[from]);
    json_t *d = post_ok("/detokenize", body, __LINE__);
    const char *word = json_string_value(json_object_get(d, "prompt"));
    TH_REQUIRE(word != NULL);
    while (*word == ' ' || *word == '\n' || *word == '\t' || *word == '\r')
      word++;
    if (!*word) { /* white space only: no word to ban */
      json_decref(d);
      continue;
    }
    int seq[2][32], lens[2], n_seq = 1;
    char spaced[512];
    lens[0] = tokenize_text(word, seq[0]);
    snprintf(spaced, sizeof(spaced), " %s", word);
    lens[1] = tokenize_text(spaced, seq[1]);
    if (lens[1] == lens[0] && seq[1][0] != seq[0][0]) n_seq = 2;
    char *wj = json_dumps(json_object_get(d, "prompt"), JSON_ENCODE_ANY);
    snprintf(body, sizeof(body), "%s,\"bad_words\":[%s]}", base, wj);
    free(wj);
    json_decref(d);
    completion_ids(body, got, N);
    int e = first_bad(plain, N, seq, lens, n_seq);
    TH_CHECK_EQ_INT(first_bad(got, N, seq, lens, n_seq), N);
    for (int i = 0; i < e && i < N; i++)
      TH_CHECK_EQ_INT(got[i], plain[i]);
    if (e < N) {
      TH_CHECK(got[e] != plain[e]);
      triggered++;
    }
  }
  TH_CHECK(triggered > 0); /* some word was one the greedy completion spelt */
  check_400("/v1/completions", "{\"prompt\":\"hi\",\"bad_words\":\"x\"}", "bad_words", "array",
            __LINE__);
  check_400("/v1/completions", "{\"prompt\":\"hi\",\"bad_words\":[\" \"]}", "bad_words", "empty",
            __LINE__);
  check_400("/v1/completions", "{\"prompt\":\"hi\",\"bad_words\":[\"a\",3]}", "bad_words", "string",
            __LINE__);
  /* digits are a token each: 40 of them are past a word's 32 tokens */
  check_400("/v1/completions",
            "{\"prompt\":\"hi\",\"bad_words\":[\"1234567890123456789012345678901234567890\"]}",
            "bad_words", "tokens", __LINE__);
}

/* ---- the event loop is not blocked by tokenization ------------------------------ */

/* A body of about `bytes` of varied words (few repeats, so the word cache
 * does not make it cheap) for the field `key` of a completions or chat
 * request. */
static char *big_body(size_t bytes, int chat) {
  char *b = malloc(bytes + 256);
  TH_REQUIRE(b);
  size_t n = (size_t)snprintf(
      b, 256, chat ? "{\"messages\":[{\"role\":\"user\",\"content\":\"" : "{\"prompt\":\"");
  uint64_t x = 88172645463325252ull;
  while (n < bytes) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    int len = 3 + (int)(x % 7);
    for (int k = 0; k < len; k++)
      b[n++] = (char)('a' + (x >> (8 + 5 * k)) % 26);
    b[n++] = (x >> 60) & 1 ? ',' : ' ';
  }
  snprintf(b + n, 256, chat ? "\"}],\"max_tokens\":2}" : "\",\"max_tokens\":2}");
  return b;
}

/* Sends a POST without reading its answer; the socket. */
static int post_nowait(const char *path, const char *body) {
  int fd = as_connect(server());
  TH_REQUIRE(fd >= 0);
  char head[512];
  size_t blen = strlen(body);
  int hn = snprintf(head, sizeof(head),
                    "POST %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                    "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                    path, blen);
  TH_REQUIRE(send(fd, head, (size_t)hn, MSG_NOSIGNAL) == hn);
  for (size_t off = 0; off < blen;) {
    ssize_t k = send(fd, body + off, blen - off, MSG_NOSIGNAL);
    TH_REQUIRE(k > 0);
    off += (size_t)k;
  }
  return fd;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int readable(int fd) {
  struct pollfd pf = {fd, POLLIN, 0};
  return poll(&pf, 1, 0) > 0;
}

/* The big request alone: seconds from its last byte sent to its answer. */
static double time_alone(const char *path, const char *body) {
  double t0 = cm_time_s();
  int fd = post_nowait(path, body);
  struct as_resp r;
  as_read_answer(fd, &r);
  double dt = cm_time_s() - t0;
  /* past the context length once tokenized: refused, with the count */
  if (r.status != 400 || !strstr(r.body, "maximum context length"))
    th_fail(__FILE__, __LINE__, "%s: %d %.200s", path, r.status, r.body);
  as_resp_free(&r);
  return dt;
}

static void check_not_blocked(const char *path, int chat) {
  char *body = big_body(1u << 20, chat);
  time_alone(path, body); /* warm-up: the server's first big allocation */
  double alone = time_alone(path, body);
  /* side by side: small requests on other connections while it runs */
  enum { MAX_SMALL = 100000 };
  double *lat = malloc(MAX_SMALL * sizeof(*lat));
  TH_REQUIRE(lat);
  double t0 = cm_time_s(), sum = 0;
  int fd = post_nowait(path, body), n = 0;
  while (!readable(fd) && n < MAX_SMALL && cm_time_s() - t0 < 120) {
    struct as_resp r;
    double s0 = cm_time_s();
    int st = as_get(server(), n % 2 ? "/health" : "/v1/models", &r);
    double dt = cm_time_s() - s0;
    as_resp_free(&r);
    TH_CHECK_EQ_INT(st, 200);
    lat[n++] = dt;
    sum += dt;
  }
  qsort(lat, (size_t)n, sizeof(*lat), cmp_double);
  double p90 = n ? lat[n * 9 / 10] : 0, worst = n ? lat[n - 1] : 0;
  free(lat);
  struct as_resp r;
  as_read_answer(fd, &r);
  double together = cm_time_s() - t0;
  TH_CHECK_EQ_INT(r.status, 400);
  as_resp_free(&r);
  fprintf(stderr,
          "%s, 1 MB: %.0f ms alone, %.0f ms beside %d small requests (mean %.1f ms, 90%% "
          "under %.1f ms, worst %.1f ms)\n",
          path, alone * 1e3, together * 1e3, n, n ? sum / n * 1e3 : 0, p90 * 1e3, worst * 1e3);
  /* A blocked loop would hold the small request that arrives during the
   * tokenization for about all of it, and answer one or two in all. They
   * must have been answered all along, nearly all in a small part of it
   * (a percentile: single ones may wait out the loop's own share of the big
   * request, parsing its JSON, or a busy machine's scheduling). */
  if (alone < 0.08) fprintf(stderr, "  (tokenization too fast here for a strong bound)\n");
  TH_CHECK(n >= 20);
  if (p90 > alone / 10 && p90 > 0.005)
    th_fail(__FILE__, __LINE__,
            "%s: 10%% of the small requests took over %.1f ms beside a %.0f ms tokenization", path,
            p90 * 1e3, alone * 1e3);
  free(body);
}

TH_TEST(api_big_prompt_off_the_loop) {
  check_not_blocked("/v1/completions", 0);
  check_not_blocked("/v1/chat/completions", 1); /* the chat template too */
}

/* ---- counters are up to date when an answer ends ------------------------------- */

struct counters {
  double q, h, prompt, gen, ok;
};

/* One /metrics read. */
static void read_counters(struct counters *c) {
  static const char *const names[] = {
      "lmserve:prefix_cache_queries_total", "lmserve:prefix_cache_hits_total",
      "lmserve:prompt_tokens_total", "lmserve:generation_tokens_total",
      "lmserve:request_success_total"};
  double *v[] = {&c->q, &c->h, &c->prompt, &c->gen, &c->ok};
  struct as_resp r;
  TH_REQUIRE(as_get(server(), "/metrics", &r) == 200);
  for (size_t i = 0; i < 5; i++) {
    *v[i] = NAN;
    size_t nl = strlen(names[i]);
    for (const char *l = r.body; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
      if (strncmp(l, names[i], nl) || l[nl] != '{') continue;
      char line[256];
      snprintf(line, sizeof(line), "%.*s", (int)strcspn(l, "\n"), l);
      const char *sp = strrchr(line, ' ');
      if (sp) *v[i] = (isnan(*v[i]) ? 0 : *v[i]) + strtod(sp, NULL); /* over its series */
    }
  }
  as_resp_free(&r);
}

/* cache_salt (vLLM's): a prompt served again hits the prefix cache only under the
 * salt it was cached with; an empty or non-string salt is a 400. */
TH_TEST(api_cache_salt) {
  char *body = malloc(4096);
  TH_REQUIRE(body != NULL);
  static const char *const salts[] = {"alice", "alice", "bob", NULL, "bob"};
  static const int hit[] = {0, 1, 0, 0, 1};
  for (int k = 0; k < 5; k++) {
    size_t n = (size_t)snprintf(body, 4096, "{\"prompt\":[2");
    for (int i = 1; i < 100; i++) /* a prompt no other test sends */
      n += (size_t)snprintf(body + n, 4096 - n, ",%d", 4000 + i);
    n += (size_t)snprintf(body + n, 4096 - n, "],\"max_tokens\":1");
    if (salts[k]) n += (size_t)snprintf(body + n, 4096 - n, ",\"cache_salt\":\"%s\"", salts[k]);
    snprintf(body + n, 4096 - n, "}");
    struct counters a, b;
    read_counters(&a);
    char t[512];
    complete(body, t);
    read_counters(&b);
    if ((b.h - a.h > 0) != hit[k])
      th_fail(__FILE__, __LINE__, "request %d (salt %s): %g prefix-cache hits", k,
              salts[k] ? salts[k] : "none", b.h - a.h);
  }
  free(body);
  check_400("/v1/completions", "{\"prompt\":\"x\",\"cache_salt\":\"\"}", "cache_salt", NULL,
            __LINE__);
  check_400("/v1/chat/completions",
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"cache_salt\":5}", "cache_salt",
            NULL, __LINE__);
}

/* Without --trust-request-chat-template a request's own template is refused, as
 * vLLM refuses it, in the field and in chat_template_kwargs. */
TH_TEST(api_request_chat_template_untrusted) {
  const char *bodies[] = {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                          "\"chat_template\":\"{{ messages }}\"}",
                          "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                          "\"chat_template_kwargs\":{\"chat_template\":\"{{ messages }}\"}}"};
  for (int i = 0; i < 2; i++)
    check_400("/v1/chat/completions", bodies[i], "chat_template", "--trust-request-chat-template",
              __LINE__);
}

TH_TEST(api_metrics_at_response_end) {
  char *body = malloc(16384);
  TH_REQUIRE(body);
  /* several rounds: a PING answer between a request's start and end could
   * hide stale counters once, not every time */
  for (int round = 0; round < 6; round++) {
    int stream = round % 2;
    /* about 250 tokens, new each round (a miss), then the same again (hits) */
    size_t n = (size_t)snprintf(body, 16384, "{\"prompt\":\"round %d:", round);
    for (int i = 0; i < 70; i++)
      n += (size_t)snprintf(body + n, 16384 - n, " w%d", i * (round + 3));
    snprintf(body + n, 16384 - n,
             "\",\"max_tokens\":3,\"temperature\":0,\"ignore_eos\":true,\"stream\":%s%s}",
             stream ? "true" : "false",
             stream ? ",\"stream_options\":{\"include_usage\":true}" : "");
    for (int again = 0; again < 2; again++) {
      struct counters a, b;
      read_counters(&a);
      struct as_resp r;
      if (as_post(server(), "/v1/completions", body, &r) != 200)
        th_fail(__FILE__, __LINE__, "%d %.300s", r.status, r.body);
      TH_REQUIRE(r.status == 200);
      read_counters(&b); /* right after the answer ended */
      long long n_prompt = -1, n_gen = -1;
      if (stream) {
        char text[256];
        json_t *u = NULL;
        TH_CHECK(as_sse_text(r.body, 0, text, sizeof(text), &u) > 0);
        n_prompt = json_integer_value(json_object_get(u, "prompt_tokens"));
        n_gen = json_integer_value(json_object_get(u, "completion_tokens"));
        json_decref(u);
      } else {
        json_t *j = as_json(&r);
        n_prompt = as_jint(j, "usage", "prompt_tokens");
        n_gen = as_jint(j, "usage", "completion_tokens");
        json_decref(j);
      }
      as_resp_free(&r);
      TH_REQUIRE(n_prompt > 200 && n_gen == 3);
      double want_hits = again ? (double)((n_prompt - 1) / 16 * 16 - 16) : 0;
      if (b.q - a.q != (double)n_prompt || b.prompt - a.prompt != (double)n_prompt ||
          b.gen - a.gen != (double)n_gen || b.ok - a.ok != 1 || b.h - a.h < want_hits ||
          b.h - a.h > (double)n_prompt || (!again && b.h != a.h))
        th_fail(__FILE__, __LINE__,
                "round %d%s (%s, %lld prompt tokens): at the answer's end queries +%g, hits "
                "+%g, prompt +%g, generation +%g, successes +%g",
                round, again ? " again" : "", stream ? "stream" : "json", n_prompt, b.q - a.q,
                b.h - a.h, b.prompt - a.prompt, b.gen - a.gen, b.ok - a.ok);
    }
  }
  free(body);
  as_stop(server());
}

/* /tokenize of a messages body and of a prompt body at s must give the same ids
 * (the chat template's text is that prompt); their count. */
static long long same_ids(const struct as_server *s, const char *messages, const char *prompt,
                          int line) {
  struct as_resp r;
  TH_REQUIRE(as_post(s, "/tokenize", messages, &r) == 200);
  json_t *chat = as_json(&r);
  as_resp_free(&r);
  TH_REQUIRE(as_post(s, "/tokenize", prompt, &r) == 200);
  json_t *text = as_json(&r);
  as_resp_free(&r);
  char *a = json_dumps(json_object_get(chat, "tokens"), JSON_COMPACT);
  char *b = json_dumps(json_object_get(text, "tokens"), JSON_COMPACT);
  if (!a || !b || strcmp(a, b))
    th_fail(__FILE__, line, "%.160s: %s, the text's %s", messages, a ? a : "?", b ? b : "?");
  long long n = (long long)json_array_size(json_object_get(text, "tokens"));
  free(a);
  free(b);
  json_decref(chat);
  json_decref(text);
  return n;
}

TH_TEST(api_chat_template_flag) {
  th_proc_init(300);
  char dir[256], path[320];
  TH_REQUIRE(th_tmpdir("chat-template", dir, sizeof(dir)) == 0);
  snprintf(path, sizeof(path), "%s/qa.jinja", dir);
  FILE *f = fopen(path, "w");
  TH_REQUIRE(f);
  fputs("{{ bos_token }}{% for d in documents or [] %}[{{ d['text'] }}] {% endfor %}Q: "
        "{% for m in messages %}{{ m['content'] }} {% endfor %}A:",
        f);
  fclose(f);
  struct as_server s2;
  memset(&s2, 0, sizeof(s2));
  as_start(&s2, 0,
           (char *[]){"--max-model-len", "512", "--chat-template", path,
                      "--trust-request-chat-template", NULL});
  const char *msgs = "[{\"role\":\"user\",\"content\":\"hello there\"}]";
  char body[512];
  struct as_resp r;
  /* the rendered prompt is the template's text: the ids of that text with BOS */
  snprintf(body, sizeof(body), "{\"messages\":%s}", msgs);
  long long want = same_ids(&s2, body, "{\"prompt\":\"Q: hello there A:\"}", __LINE__);
  /* documents reach the template as its variable documents */
  snprintf(body, sizeof(body), "{\"messages\":%s,\"documents\":[{\"text\":\"doc one\"}]}", msgs);
  same_ids(&s2, body, "{\"prompt\":\"[doc one] Q: hello there A:\"}", __LINE__);
  snprintf(body, sizeof(body), "{\"messages\":%s,\"max_tokens\":1,\"temperature\":0}", msgs);
  TH_REQUIRE(as_post(&s2, "/v1/chat/completions", body, &r) == 200);
  json_t *j = as_json(&r);
  TH_CHECK_EQ_INT(as_jint(j, "usage", "prompt_tokens"), want);
  json_decref(j);
  as_resp_free(&r);
  /* continue_final_message (vLLM's): the rendered text cut after the last message's
     text, its trailing space kept where the template writes it */
  const char *cont = "[{\"role\":\"user\",\"content\":\"hello there\"},"
                     "{\"role\":\"assistant\",\"content\":\"The answer is \"}]";
  snprintf(body, sizeof(body),
           "{\"messages\":%s,\"continue_final_message\":true,\"add_generation_prompt\":false}",
           cont);
  want = same_ids(&s2, body, "{\"prompt\":\"Q: hello there The answer is \"}", __LINE__);
  snprintf(body, sizeof(body),
           "{\"messages\":%s,\"continue_final_message\":true,\"add_generation_prompt\":false,"
           "\"max_tokens\":1,\"temperature\":0}",
           cont);
  TH_REQUIRE(as_post(&s2, "/v1/chat/completions", body, &r) == 200);
  j = as_json(&r);
  TH_CHECK_EQ_INT(as_jint(j, "usage", "prompt_tokens"), want);
  json_decref(j);
  as_resp_free(&r);
  snprintf(body, sizeof(body), "{\"messages\":%s,\"continue_final_message\":true}", cont);
  TH_CHECK_EQ_INT(as_post(&s2, "/v1/chat/completions", body, &r), 400);
  as_check_error(&r, 400, "continue_final_message");
  as_resp_free(&r);
  TH_CHECK_EQ_INT(as_post(&s2, "/tokenize",
                          "{\"messages\":[{\"role\":\"user\",\"content\":\" \"}],"
                          "\"continue_final_message\":true,\"add_generation_prompt\":false}",
                          &r),
                  400);
  TH_CHECK(strstr(r.body, "no text to continue") != NULL);
  as_resp_free(&r);
  /* a request's own template (--trust-request-chat-template), its *_token variables the
     model's, in the field or in chat_template_kwargs */
  const char *own = "{{ bos_token }}U: {% for m in messages %}{{ m['content'] }}{% endfor %} B:";
  for (int kw = 0; kw < 2; kw++) {
    json_t *b = json_pack("{s:[{s:s, s:s}]}", "messages", "role", "user", "content", "hello there");
    if (kw)
      json_object_set_new(b, "chat_template_kwargs", json_pack("{s:s}", "chat_template", own));
    else
      json_object_set_new(b, "chat_template", json_string(own));
    char *t = json_dumps(b, JSON_COMPACT);
    want = same_ids(&s2, t, "{\"prompt\":\"U: hello there B:\"}", __LINE__);
    json_object_set_new(b, "max_tokens", json_integer(1));
    free(t);
    t = json_dumps(b, JSON_COMPACT);
    TH_REQUIRE(as_post(&s2, "/v1/chat/completions", t, &r) == 200);
    j = as_json(&r);
    TH_CHECK_EQ_INT(as_jint(j, "usage", "prompt_tokens"), want);
    json_decref(j);
    as_resp_free(&r);
    free(t);
    json_decref(b);
  }
  TH_CHECK_EQ_INT(as_post(&s2, "/v1/chat/completions",
                          "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                          "\"chat_template\":\"{% for m in messages %}\"}",
                          &r),
                  400);
  as_check_error(&r, 400, "chat_template");
  as_resp_free(&r);
  as_stop(&s2);

  /* refused at start, naming the reason */
  struct th_out o = {0};
  TH_CHECK_EQ_INT(th_lmserve(&o, 30000, "serve", "--chat-template", "/nonexistent/qa.jinja", NULL),
                  2);
  TH_CHECK(strstr(o.err, "no such file") != NULL);
  TH_CHECK_EQ_INT(
      th_lmserve(&o, 30000, "serve", "--chat-template", "{% for m in messages %}{{ m }", NULL), 2);
  TH_CHECK(strstr(o.err, "--chat-template") != NULL);
  th_out_free(&o);
}
