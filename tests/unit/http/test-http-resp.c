/* test-http-resp.c — response shapes (parsed back with Jansson), SSE
 * framing, JSON escaping, the error envelope, the metrics registry's text
 * format and the API-key check. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "frontend/fe-api-error.h"
#include "frontend/fe-api-resp.h"
#include "frontend/fe-http-buf.h"
#include "frontend/fe-http-metrics.h"
#include "frontend/fe-messages.h"
#include "frontend/fe-responses.h"
#include "frontend/fe-route.h"
#include "frontend/fe-rstore.h"
#include "frontend/fe-sse.h"
#include "tests/harness/th.h"

static json_t *parse(const struct fe_buf *b) {
  json_error_t e;
  json_t *j = json_loadb(b->data, b->len, 0, &e);
  if (!j) th_fail(__FILE__, __LINE__, "invalid JSON (%s): %s", e.text, b->data);
  return j;
}

static const struct fe_api_top_logprob top[2] = {{"a", 1, -0.1f}, {"b", 1, -2.5f}};
static const struct fe_api_token_logprob lps[2] = {{"Hel", 3, -0.25f, top, 2},
                                                   {"lo", 2, -1.0f, top, 1}};
static const struct fe_api_resp_meta meta = {"cmpl-1", 1700000000, "gemma"};

TH_TEST(resp_completion_shape) {
  struct fe_buf b;
  fe_buf_init(&b, 0);
  struct fe_api_choice ch[2] = {{0, "Hello", 5, "length", lps, 2, 0},
                                {1, "x\"y\n", 4, "stop", NULL, 0, 0}};
  struct fe_api_usage u = {7, 6};
  TH_REQUIRE(fe_api_write_completion(&b, &meta, ch, 2, &u) == 0);
  json_t *j = parse(&b);
  TH_REQUIRE(j);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "object")), "text_completion");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "id")), "cmpl-1");
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(j, "created")), 1700000000);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "model")), "gemma");
  json_t *u_ = json_object_get(j, "usage");
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(u_, "prompt_tokens")), 7);
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(u_, "completion_tokens")), 6);
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(u_, "total_tokens")), 13);
  json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
  json_t *c1 = json_array_get(json_object_get(j, "choices"), 1);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(c0, "text")), "Hello");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(c0, "finish_reason")), "length");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(c1, "text")), "x\"y\n");
  TH_CHECK(json_is_null(json_object_get(c1, "logprobs")));
  json_t *lp = json_object_get(c0, "logprobs");
  TH_CHECK_EQ_STR(json_string_value(json_array_get(json_object_get(lp, "tokens"), 1)), "lo");
  TH_CHECK_NEAR(json_real_value(json_array_get(json_object_get(lp, "token_logprobs"), 0)), -0.25,
                1e-6);
  TH_CHECK_EQ_INT(json_integer_value(json_array_get(json_object_get(lp, "text_offset"), 1)), 3);
  json_t *t0 = json_array_get(json_object_get(lp, "top_logprobs"), 0);
  TH_CHECK_NEAR(json_real_value(json_object_get(t0, "b")), -2.5, 1e-6);
  json_decref(j);
  fe_buf_free(&b);
}

TH_TEST(resp_chat_shape) {
  struct fe_buf b;
  fe_buf_init(&b, 0);
  struct fe_api_choice ch = {0, "Hello", 5, "stop", lps, 2, 0};
  struct fe_api_usage u = {3, 2};
  struct fe_api_resp_meta m = {"chatcmpl-9", 5, "gemma"};
  TH_REQUIRE(fe_api_write_chat(&b, &m, &ch, 1, &u) == 0);
  json_t *j = parse(&b);
  TH_REQUIRE(j);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "object")), "chat.completion");
  json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
  json_t *msg = json_object_get(c0, "message");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(msg, "role")), "assistant");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(msg, "content")), "Hello");
  json_t *content = json_object_get(json_object_get(c0, "logprobs"), "content");
  TH_CHECK_EQ_INT(json_array_size(content), 2);
  json_t *e0 = json_array_get(content, 0);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(e0, "token")), "Hel");
  TH_CHECK_EQ_INT(json_array_size(json_object_get(e0, "bytes")), 3);
  TH_CHECK_EQ_INT(json_integer_value(json_array_get(json_object_get(e0, "bytes"), 0)), 'H');
  TH_CHECK_EQ_INT(json_array_size(json_object_get(e0, "top_logprobs")), 2);
  json_decref(j);
  fe_buf_free(&b);
}

/* A call asked with OpenAI's deprecated functions goes back as message.function_call
 * (the call's function object) with finish reason "function_call", and a stream's
 * delta as its part of that object. */
TH_TEST(resp_legacy_function_call) {
  struct fe_buf b;
  fe_buf_init(&b, 0);
  struct fe_api_choice ch = {0, "", 0, "tool_calls", NULL, 0, 0};
  ch.tool_calls = "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"add\","
                  "\"arguments\":\"{\\\"a\\\": 1}\"}}]";
  ch.function_call = 1;
  struct fe_api_resp_meta m = {"chatcmpl-9", 5, "gemma"};
  TH_REQUIRE(fe_api_write_chat(&b, &m, &ch, 1, NULL) == 0);
  json_t *j = parse(&b);
  TH_REQUIRE(j);
  json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
  json_t *msg = json_object_get(c0, "message");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(c0, "finish_reason")), "function_call");
  TH_CHECK(json_object_get(msg, "tool_calls") == NULL);
  TH_CHECK(json_is_null(json_object_get(msg, "content")));
  json_t *fc = json_object_get(msg, "function_call");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(fc, "name")), "add");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(fc, "arguments")), "{\"a\": 1}");
  TH_CHECK_EQ_INT((int)json_object_size(fc), 2);
  json_decref(j);
  fe_buf_reset(&b);
  ch.finish_reason = NULL;
  /* a delta that begins the call and writes some of its arguments: one object */
  ch.tool_calls = "[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":"
                  "{\"name\":\"add\",\"arguments\":\"\"}},"
                  "{\"index\":0,\"function\":{\"arguments\":\"{\\\"a\"}},"
                  "{\"index\":0,\"function\":{\"arguments\":\"\\\": 1\"}}]";
  TH_REQUIRE(fe_api_write_chat_chunk(&b, &m, &ch, 0, NULL) == 0);
  j = parse(&b);
  TH_REQUIRE(j);
  json_t *d = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
  fc = json_object_get(d, "function_call");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(fc, "name")), "add");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(fc, "arguments")), "{\"a\": 1");
  TH_CHECK(json_object_get(d, "tool_calls") == NULL);
  json_decref(j);
  fe_buf_reset(&b);
  ch.tool_calls = "[{\"index\":0,\"function\":{\"arguments\":\"}\"}}]"; /* more of them */
  TH_REQUIRE(fe_api_write_chat_chunk(&b, &m, &ch, 0, NULL) == 0);
  j = parse(&b);
  TH_REQUIRE(j);
  d = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
  TH_CHECK_EQ_STR(
      json_string_value(json_object_get(json_object_get(d, "function_call"), "arguments")), "}");
  TH_CHECK(json_object_get(json_object_get(d, "function_call"), "name") == NULL);
  json_decref(j);
  fe_buf_free(&b);
}

TH_TEST(resp_stream_chunks) {
  struct fe_buf b;
  fe_buf_init(&b, 0);
  struct fe_api_choice first = {0, "", 0, NULL, NULL, 0, 0};
  TH_REQUIRE(fe_api_write_chat_chunk(&b, &meta, &first, 1, NULL) == 0);
  json_t *j = parse(&b);
  TH_REQUIRE(j);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "object")), "chat.completion.chunk");
  json_t *d = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(d, "role")), "assistant");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(d, "content")), "");
  json_decref(j);
  fe_buf_reset(&b);
  struct fe_api_choice last = {0, "", 0, "stop", NULL, 0, 0};
  TH_REQUIRE(fe_api_write_chat_chunk(&b, &meta, &last, 0, NULL) == 0);
  j = parse(&b);
  json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
  TH_CHECK_EQ_INT(json_object_size(json_object_get(c0, "delta")), 0);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(c0, "finish_reason")), "stop");
  json_decref(j);
  fe_buf_reset(&b);
  struct fe_api_usage u = {4, 9};
  TH_REQUIRE(fe_api_write_usage_chunk(&b, FE_API_COMPLETION, &meta, &u) == 0);
  j = parse(&b);
  TH_CHECK_EQ_INT(json_array_size(json_object_get(j, "choices")), 0);
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "total_tokens")),
                  13);
  json_decref(j);
  fe_buf_reset(&b);
  struct fe_api_choice mid = {2, "tok", 3, NULL, NULL, 0, 0};
  TH_REQUIRE(fe_api_write_completion_chunk(&b, &meta, &mid, NULL) == 0);
  j = parse(&b);
  c0 = json_array_get(json_object_get(j, "choices"), 0);
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(c0, "index")), 2);
  TH_CHECK(json_is_null(json_object_get(c0, "finish_reason")));
  json_decref(j);
  fe_buf_reset(&b);
  TH_REQUIRE(fe_sse_frame(&b, "{}", 2) == 0);
  TH_CHECK_EQ_STR(b.data, "data: {}\n\n");
  fe_buf_free(&b);
}

/* The answer the Responses and Messages objects are tested with: c gets the thought
 * "hmm" and two calls, f with no arguments and g with {"a":1}; u counts 10 prompt
 * tokens (4 of them cached) and 7 completion tokens (3 of them the thought's). */
static void thought_and_two_calls(struct fe_api_choice *c, struct fe_api_usage *u) {
  c->reasoning = "hmm";
  c->reasoning_len = 3;
  c->tool_calls = "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
                  "\"arguments\":\"{}\"}},{\"id\":\"call_2\",\"type\":\"function\","
                  "\"function\":{\"name\":\"g\",\"arguments\":\"{\\\"a\\\":1}\"}}]";
  *u = (struct fe_api_usage){10, 7, 0, 4, 3};
}

/* The Responses API's object: a thought, text with its logprobs, two calls. */
TH_TEST(resp_responses_object) {
  struct fe_buf b;
  fe_buf_init(&b, 0);
  struct fe_api_choice c = {0, "Hello", 5, "tool_calls", lps, 2};
  struct fe_api_usage u;
  thought_and_two_calls(&c, &u);
  struct fe_api_resp_meta m = {"resp_1", 1700000000, "gemma"};
  TH_REQUIRE(fe_resp_write(&b, &m, "{\"store\":false,\"tools\":[]}", &c, &u) == 0);
  json_t *j = parse(&b);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "object")), "response");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "status")), "completed");
  TH_CHECK(json_is_false(json_object_get(j, "store")));
  json_t *out = json_object_get(j, "output");
  TH_REQUIRE(json_array_size(out) == 4);
  static const char *const types[] = {"reasoning", "message", "function_call", "function_call"};
  for (size_t i = 0; i < 4; i++)
    TH_CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(out, i), "type")), types[i]);
  json_t *part = json_array_get(json_object_get(json_array_get(out, 1), "content"), 0);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(part, "text")), "Hello");
  TH_CHECK(json_array_size(json_object_get(part, "logprobs")) == 2);
  json_t *call = json_array_get(out, 3);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(call, "call_id")), "call_2");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(call, "arguments")), "{\"a\":1}");
  json_t *us = json_object_get(j, "usage");
  TH_CHECK(json_integer_value(json_object_get(us, "total_tokens")) == 17);
  TH_CHECK(json_integer_value(json_object_get(json_object_get(us, "output_tokens_details"),
                                              "reasoning_tokens")) == 3);
  TH_CHECK(json_integer_value(
               json_object_get(json_object_get(us, "input_tokens_details"), "cached_tokens")) == 4);
  json_decref(j);
  /* cut by max tokens: incomplete, and so is its last item */
  fe_buf_reset(&b);
  struct fe_api_choice cut = {0, "Hel", 3, "length"};
  TH_REQUIRE(fe_resp_write(&b, &m, NULL, &cut, &u) == 0);
  j = parse(&b);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "status")), "incomplete");
  TH_CHECK_EQ_STR(
      json_string_value(json_object_get(json_object_get(j, "incomplete_details"), "reason")),
      "max_output_tokens");
  TH_CHECK_EQ_STR(
      json_string_value(json_object_get(json_array_get(json_object_get(j, "output"), 0), "status")),
      "incomplete");
  json_decref(j);
  fe_buf_free(&b);
}

/* The next named event of a stream at *p (before end): its data's JSON (new), whose
 * "type" its `event:` line must name, *p moved past it; NULL at the end. */
static json_t *next_event(const char **p, const char *end) {
  if (!*p || *p >= end) return NULL;
  const char *nl = strchr(*p, '\n'), *stop = strstr(*p, "\n\n");
  TH_REQUIRE(nl && stop && !strncmp(*p, "event: ", 7) && !strncmp(nl + 1, "data: ", 6));
  json_error_t e;
  json_t *j = json_loadb(nl + 7, (size_t)(stop - nl - 7), 0, &e);
  TH_REQUIRE(j != NULL);
  const char *type = json_string_value(json_object_get(j, "type"));
  TH_REQUIRE(type != NULL);
  TH_CHECK((size_t)(nl - *p - 7) == strlen(type) && !strncmp(*p + 7, type, strlen(type)));
  *p = stop + 2;
  return j;
}

/* A Responses stream: the events of chunks (a thought, text whose logprobs came
 * before it, a call in two pieces) in order, numbered, each item added and done,
 * and the whole response last. */
TH_TEST(resp_responses_events) {
  struct fe_resp_stream s;
  struct fe_api_resp_meta m = {"resp_2", 1700000000, "gemma"};
  fe_resp_stream_init(&s, &m, "{\"store\":false}");
  struct fe_buf b;
  fe_buf_init(&b, 0);
  fe_resp_stream_begin(&s, &b);
  struct fe_api_choice c1 = {0};
  c1.reasoning = "thi";
  c1.reasoning_len = 3;
  fe_resp_stream_chunk(&s, &b, &c1);
  struct fe_api_choice c2 = {0, "", 0, NULL, lps, 1}; /* logprobs, no text yet */
  c2.reasoning = "nk";
  c2.reasoning_len = 2;
  fe_resp_stream_chunk(&s, &b, &c2);
  struct fe_api_choice c3 = {0, "Hello", 5, NULL, lps + 1, 1};
  fe_resp_stream_chunk(&s, &b, &c3);
  struct fe_api_choice c4 = {0};
  c4.tool_calls =
      "[{\"index\":0,\"id\":\"call_9\",\"type\":\"function\",\"function\":{\"name\":"
      "\"f\",\"arguments\":\"\"}},{\"index\":0,\"function\":{\"arguments\":\"{\\\"a\"}}]";
  fe_resp_stream_chunk(&s, &b, &c4);
  c4.tool_calls = "[{\"index\":0,\"function\":{\"arguments\":\"\\\":1}\"}}]";
  fe_resp_stream_chunk(&s, &b, &c4);
  struct fe_api_usage u = {4, 9, 0, 0, 3};
  char *whole = NULL;
  TH_REQUIRE(fe_resp_stream_end(&s, &b, "tool_calls", &u, &whole) == 0);
  TH_REQUIRE(b.err == 0);
  /* the events, type by type */
  static const char *const want[] = {"response.created",
                                     "response.in_progress",
                                     "response.output_item.added",
                                     "response.content_part.added",
                                     "response.reasoning_text.delta",
                                     "response.reasoning_text.delta",
                                     "response.reasoning_text.done",
                                     "response.content_part.done",
                                     "response.output_item.done",
                                     "response.output_item.added",
                                     "response.content_part.added",
                                     "response.output_text.delta",
                                     "response.output_text.done",
                                     "response.content_part.done",
                                     "response.output_item.done",
                                     "response.output_item.added",
                                     "response.function_call_arguments.delta",
                                     "response.function_call_arguments.delta",
                                     "response.function_call_arguments.done",
                                     "response.output_item.done",
                                     "response.completed"};
  size_t n = 0;
  json_t *last = NULL;
  const char *p = b.data;
  for (json_t *j; (j = next_event(&p, b.data + b.len)) && n < CM_ARRAY_LEN(want) + 1; n++) {
    const char *type = json_string_value(json_object_get(j, "type"));
    TH_REQUIRE(n < CM_ARRAY_LEN(want));
    TH_CHECK_EQ_STR(type, want[n]);
    TH_CHECK(json_integer_value(json_object_get(j, "sequence_number")) == (json_int_t)n);
    if (!strcmp(type, "response.output_text.delta")) { /* the held logprob goes with it */
      TH_CHECK(json_array_size(json_object_get(j, "logprobs")) == 2);
      TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "delta")), "Hello");
    }
    if (!strcmp(type, "response.function_call_arguments.done"))
      TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "arguments")), "{\"a\":1}");
    json_decref(last);
    last = j;
  }
  TH_CHECK(n == CM_ARRAY_LEN(want));
  json_t *r = json_object_get(last, "response"), *out = json_object_get(r, "output");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(r, "status")), "completed");
  TH_REQUIRE(json_array_size(out) == 3);
  TH_CHECK_EQ_STR(
      json_string_value(json_object_get(
          json_array_get(json_object_get(json_array_get(out, 0), "content"), 0), "text")),
      "think");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(out, 2), "call_id")), "call_9");
  TH_CHECK(json_is_false(json_object_get(r, "store")));
  json_t *w = whole ? json_loads(whole, 0, NULL) : NULL; /* what the store would keep */
  TH_CHECK(w && json_equal(w, r));
  json_decref(w);
  free(whole);
  json_decref(last);
  fe_buf_free(&b);
  fe_resp_stream_free(&s);
}

/* The response store: the conversation a response ends (its thought dropped, its
 * text and calls as the assistant's turn), lookups, deletes, the oldest dropped
 * past the cap, and what is refused. */
TH_TEST(resp_store) {
  struct fe_rstore *st;
  TH_CHECK(fe_rstore_create(0, &st) == CM_ERR_INVAL);
  TH_REQUIRE(fe_rstore_create(4096, &st) == 0);
  const char *r1 = "{\"id\":\"resp_a\",\"output\":[{\"type\":\"reasoning\",\"content\":[{\"type\":"
                   "\"reasoning_text\",\"text\":\"hm\"}]},{\"type\":\"message\",\"content\":[{"
                   "\"type\":\"output_text\",\"text\":\"Hi \"},{\"type\":\"output_text\",\"text\":"
                   "\"there\"}]},{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"f\","
                   "\"arguments\":\"{}\"}]}";
  TH_REQUIRE(fe_rstore_put(st, r1, strlen(r1), "[{\"role\":\"user\",\"content\":\"q\"}]",
                           "[{\"id\":\"msg_1\"}]") == 0);
  const struct fe_rstore_entry *e = fe_rstore_get(st, "resp_a", 6);
  TH_REQUIRE(e != NULL);
  TH_CHECK(e->response_len == strlen(r1) && !strcmp(e->response, r1));
  TH_CHECK_EQ_STR(e->input, "[{\"id\":\"msg_1\"}]");
  json_t *conv = json_loads(e->conv, 0, NULL);
  TH_REQUIRE(json_array_size(conv) == 2);
  json_t *turn = json_array_get(conv, 1);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(turn, "role")), "assistant");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(turn, "content")), "Hi there");
  json_t *call = json_array_get(json_object_get(turn, "tool_calls"), 0);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(call, "id")), "call_1");
  TH_CHECK_EQ_STR(
      json_string_value(json_object_get(json_object_get(call, "function"), "arguments")), "{}");
  json_decref(conv);
  TH_CHECK(fe_rstore_get(st, "resp_", 5) == NULL && fe_rstore_get(st, "resp_ab", 7) == NULL);
  /* the oldest go first past the cap (each entry counts its texts and 256 bytes) */
  char r[128];
  for (int i = 0; i < 40; i++) {
    snprintf(r, sizeof(r), "{\"id\":\"resp_%d\",\"output\":[]}", i);
    TH_REQUIRE(fe_rstore_put(st, r, strlen(r), NULL, NULL) == 0);
  }
  size_t n, bytes;
  fe_rstore_usage(st, &n, &bytes);
  TH_CHECK(bytes <= 4096 && n >= 10 && n < 40);
  TH_CHECK(fe_rstore_get(st, "resp_a", 6) == NULL);
  TH_CHECK(fe_rstore_get(st, "resp_39", 7) != NULL);
  snprintf(r, sizeof(r), "resp_%d", (int)(40 - n));
  TH_CHECK(fe_rstore_get(st, r, strlen(r)) != NULL);
  snprintf(r, sizeof(r), "resp_%d", (int)(39 - n));
  TH_CHECK(fe_rstore_get(st, r, strlen(r)) == NULL);
  TH_CHECK(fe_rstore_delete(st, "resp_39", 7) == 0);
  TH_CHECK(fe_rstore_delete(st, "resp_39", 7) == CM_ERR_NOENT);
  TH_CHECK(fe_rstore_get(st, "resp_39", 7) == NULL);
  /* the same id again: the newer is kept */
  const char *again = "{\"id\":\"resp_38\",\"output\":[],\"v\":2}";
  TH_REQUIRE(fe_rstore_put(st, again, strlen(again), NULL, NULL) == 0);
  TH_CHECK_EQ_STR(fe_rstore_get(st, "resp_38", 7)->response, again);
  /* refused: not a response, larger than the store */
  TH_CHECK(fe_rstore_put(st, "[1]", 3, NULL, NULL) == CM_ERR_PARSE);
  TH_CHECK(fe_rstore_put(st, "{\"output\":[]}", 13, NULL, NULL) == CM_ERR_PARSE);
  char *big = malloc(8192);
  TH_REQUIRE(big != NULL);
  int o = snprintf(big, 8192, "{\"id\":\"resp_big\",\"output\":[],\"pad\":\"");
  memset(big + o, 'x', 8000 - (size_t)o);
  snprintf(big + 8000, 192, "\"}");
  TH_CHECK(fe_rstore_put(st, big, strlen(big), NULL, NULL) == CM_ERR_TOOBIG);
  TH_CHECK(fe_rstore_get(st, "resp_38", 7) != NULL); /* nothing dropped for it */
  free(big);
  fe_rstore_destroy(st);
}

TH_TEST(resp_tokenize_shapes) {
  struct fe_buf b;
  fe_buf_init(&b, 0);
  const int32_t ids[3] = {2, 9259, 106};
  TH_REQUIRE(fe_api_write_tokenize(&b, ids, 3, 8192, NULL, NULL) == 0);
  TH_CHECK_EQ_STR(b.data, "{\"count\":3,\"max_model_len\":8192,\"tokens\":[2,9259,106]}");
  fe_buf_reset(&b);
  const char *strs[3] = {"<bos>", "\xe2\x96\x81Hi\"", "<0x0A>"};
  const size_t lens[3] = {5, 6, 6};
  TH_REQUIRE(fe_api_write_tokenize(&b, ids, 3, 8192, strs, lens) == 0);
  TH_CHECK_EQ_STR(b.data, "{\"count\":3,\"max_model_len\":8192,\"tokens\":[2,9259,106],"
                          "\"token_strs\":[\"<bos>\",\"\xe2\x96\x81Hi\\\"\",\"<0x0A>\"]}");
  fe_buf_reset(&b);
  TH_REQUIRE(fe_api_write_detokenize(&b, "a\"b", 3) == 0);
  TH_CHECK_EQ_STR(b.data, "{\"prompt\":\"a\\\"b\"}");
  fe_buf_free(&b);
}

TH_TEST(resp_json_escaping) {
  struct fe_buf b;
  fe_buf_init(&b, 0);
  /* control bytes, a split UTF-8 sequence, an overlong form, a surrogate, valid é */
  static const char s[] = "a\x01\t\"\\\xe2\x82 \xc0\xaf \xed\xa0\x80 \xc3\xa9";
  TH_REQUIRE(fe_buf_json_str(&b, s, sizeof(s) - 1) == 0);
  json_error_t e;
  json_t *j = json_loadb(b.data, b.len, JSON_DECODE_ANY, &e);
  TH_REQUIRE(j != NULL);
  TH_CHECK(strstr(json_string_value(j), "\xc3\xa9") != NULL);
  TH_CHECK(strstr(json_string_value(j), "\xef\xbf\xbd") != NULL);
  json_decref(j);
  fe_buf_reset(&b);
  fe_buf_json_double(&b, -INFINITY);
  fe_buf_puts(&b, ",");
  fe_buf_json_double(&b, NAN);
  TH_CHECK_EQ_STR(b.data, "-9999.0,null");
  fe_buf_free(&b);
  /* a long string needs no more room than its escaped size */
  fe_buf_init(&b, 1 << 20);
  char *big = malloc(600000);
  TH_REQUIRE(big);
  for (size_t i = 0; i < 600000; i++)
    big[i] = (char)("ab\"\n\xc3\xa9"[i % 6]);
  TH_REQUIRE(fe_buf_json_str(&b, big, 600000) == 0);
  j = json_loadb(b.data, b.len, JSON_DECODE_ANY, &e);
  TH_REQUIRE(j != NULL);
  TH_CHECK(json_string_length(j) == 600000 && memcmp(json_string_value(j), big, 600000) == 0);
  json_decref(j);
  free(big);
  fe_buf_free(&b);
  /* the cap holds */
  fe_buf_init(&b, 64);
  TH_CHECK(fe_buf_puts(&b, "0123456789012345678901234567890123456789") == 0);
  TH_CHECK(fe_buf_puts(&b, "0123456789012345678901234567890123456789") == CM_ERR_NOMEM);
  TH_CHECK(fe_buf_puts(&b, "x") == CM_ERR_NOMEM); /* sticky */
  fe_buf_free(&b);
}

TH_TEST(resp_error_envelope) {
  struct fe_buf b;
  fe_buf_init(&b, 0);
  fe_api_error_body(&b, 404, "The model `x` does not exist.", "model");
  json_t *j = parse(&b);
  TH_REQUIRE(j);
  json_t *e = json_object_get(j, "error");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(e, "message")),
                  "The model `x` does not exist.");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(e, "type")), "NotFoundError");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(e, "param")), "model");
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(e, "code")), 404);
  json_decref(j);
  fe_buf_reset(&b);
  fe_api_error_body(&b, 400, "bad", NULL);
  j = parse(&b);
  TH_CHECK(json_is_null(json_object_get(json_object_get(j, "error"), "param")));
  json_decref(j);
  fe_buf_free(&b);
}

/* A registry for model `name` with the standard series, their ids in *ids. */
static struct fe_metrics *standard_metrics(const char *name, struct fe_metric_ids *ids) {
  struct fe_metrics *m = NULL;
  TH_REQUIRE(fe_metrics_create(name, &m) == 0);
  TH_REQUIRE(fe_metrics_register_standard(m, ids) == 0);
  return m;
}

/* m's text format into b, made here; the caller frees it (fe_buf_free). */
static void render(struct fe_metrics *m, struct fe_buf *b) {
  fe_buf_init(b, 0);
  TH_REQUIRE(fe_metrics_render(m, b) == 0);
}

/* m's text format holds `has` and not `lacks` (either NULL: not checked). */
static void check_rendered(struct fe_metrics *m, const char *has, const char *lacks) {
  struct fe_buf b;
  render(m, &b);
  if (has && !strstr(b.data, has)) th_fail(__FILE__, __LINE__, "metrics text lacks: %s", has);
  if (lacks && strstr(b.data, lacks)) th_fail(__FILE__, __LINE__, "metrics text has: %s", lacks);
  fe_buf_free(&b);
}

TH_TEST(metrics_registry) {
  struct fe_metric_ids ids;
  struct fe_metrics *m = standard_metrics("ge\"m", &ids);
  const struct fe_replica_metric_ids *r0 = &ids.rep[0];
  TH_CHECK_EQ_INT(ids.n_rep, 1);
  fe_metrics_inc(m, r0->prompt_tokens, 12);
  fe_metrics_inc(m, r0->prompt_tokens, -5); /* ignored: counters only go up */
  fe_metrics_set_at(m, ids.kv_cache_usage_perc, 0, 0.25);
  fe_metrics_set_at(m, ids.kv_cache_usage_perc, 1, 0.5); /* a second replica */
  fe_metrics_observe(m, r0->time_to_first_token_seconds, 0.003);
  fe_metrics_observe(m, r0->time_to_first_token_seconds, 0.5);
  fe_metrics_observe(m, r0->time_to_first_token_seconds, 1e9);
  TH_CHECK_NEAR(fe_metrics_value(m, r0->prompt_tokens), 12, 0);
  TH_CHECK_NEAR(fe_metrics_count(m, r0->time_to_first_token_seconds), 3, 0);
  TH_CHECK(fe_metrics_add(m, FE_METRIC_COUNTER, "lmserve:no_suffix", "x", NULL, 0) == CM_ERR_INVAL);
  TH_CHECK(fe_metrics_add(m, FE_METRIC_GAUGE, "bad name", "x", NULL, 0) == CM_ERR_INVAL);
  TH_CHECK(fe_metrics_add(m, FE_METRIC_GAUGE, "lmserve:num_requests_running", "dup", NULL, 0) ==
           CM_ERR_INVAL);
  double bad_b[] = {1, 1};
  TH_CHECK(fe_metrics_add(m, FE_METRIC_HISTOGRAM, "lmserve:h", "x", bad_b, 2) == CM_ERR_INVAL);
  struct fe_buf b;
  render(m, &b);
  static const char *const want[] = {
      "# TYPE lmserve:prompt_tokens_total counter\n",
      "lmserve:prompt_tokens_total{model_name=\"ge\\\"m\",replica=\"0\"} 12.0\n",
      "lmserve:kv_cache_usage_perc{model_name=\"ge\\\"m\",replica=\"0\"} 0.25\n",
      "lmserve:kv_cache_usage_perc{model_name=\"ge\\\"m\",replica=\"1\"} 0.5\n",
      "# TYPE lmserve:kv_cache_usage_perc gauge\n",
      "# TYPE lmserve:time_to_first_token_seconds histogram\n",
      "lmserve:time_to_first_token_seconds_bucket{model_name=\"ge\\\"m\",replica=\"0\",le=\"0."
      "001\"} 0.0\n",
      "lmserve:time_to_first_token_seconds_bucket{model_name=\"ge\\\"m\",replica=\"0\",le=\"0."
      "005\"} 1.0\n",
      "lmserve:time_to_first_token_seconds_bucket{model_name=\"ge\\\"m\",replica=\"0\",le=\"0.5\"} "
      "2.0\n",
      "lmserve:time_to_first_token_seconds_bucket{model_name=\"ge\\\"m\",replica=\"0\",le=\"2560."
      "0\"} 2.0\n",
      "lmserve:time_to_first_token_seconds_bucket{model_name=\"ge\\\"m\",replica=\"0\",le=\"+Inf\"}"
      " 3.0\n",
      "lmserve:time_to_first_token_seconds_count{model_name=\"ge\\\"m\",replica=\"0\"} 3.0\n",
      "lmserve:num_requests_running",
      "lmserve:num_requests_waiting",
      "lmserve:generation_tokens_total",
      "lmserve:inter_token_latency_seconds_bucket",
      "lmserve:e2e_request_latency_seconds_sum",
      "lmserve:prefix_cache_queries_total",
      "lmserve:prefix_cache_hits_total",
      "lmserve:spec_decode_num_drafts_total",
      "lmserve:spec_decode_num_draft_tokens_total",
      "lmserve:spec_decode_num_accepted_tokens_total",
      "# TYPE lmserve:num_preemptions_total counter\n",
      "# TYPE lmserve:request_queue_time_seconds histogram\n",
      "# TYPE lmserve:request_prefill_time_seconds histogram\n",
      "# TYPE lmserve:request_decode_time_seconds histogram\n",
      "# TYPE lmserve:request_prompt_tokens histogram\n",
      "# TYPE lmserve:request_generation_tokens histogram\n",
      "# TYPE lmserve:request_params_max_tokens histogram\n",
      "# TYPE lmserve:request_params_n histogram\n",
      "lmserve:request_success_total{model_name=\"ge\\\"m\",replica=\"0\",finished_reason="
      "\"length\"} "
      "0.0\n",
  };
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
    if (!strstr(b.data, want[i])) th_fail(__FILE__, __LINE__, "metrics text lacks: %s", want[i]);
  fe_buf_free(&b);
  fe_metrics_destroy(m);
}

/* Families of labelled series: more replicas' series join their families
 * (one HELP/TYPE each, series in registration order), duplicates and
 * mismatched kinds, buckets or labels are refused. */
TH_TEST(metrics_replica_families) {
  struct fe_metric_ids ids;
  struct fe_metrics *m = standard_metrics("g", &ids);
  TH_REQUIRE(fe_metrics_register_replicas(m, &ids, 3) == 0);
  TH_CHECK_EQ_INT(ids.n_rep, 3);
  TH_REQUIRE(fe_metrics_register_replicas(m, &ids, 2) == 0); /* already there */
  TH_CHECK_EQ_INT(ids.n_rep, 3);
  struct fe_metric_ids again = ids; /* an engine's copy of the router's, made again */
  again.n_rep = 1;
  TH_REQUIRE(fe_metrics_register_replicas(m, &again, 3) == 0);
  TH_CHECK(!memcmp(&again, &ids, sizeof(ids))); /* the same series */
  TH_CHECK(fe_metrics_register_replicas(m, &ids, FE_METRICS_MAX_REPLICAS + 1) == CM_ERR_INVAL);
  fe_metrics_inc(m, ids.rep[2].generation_tokens, 7);
  fe_metrics_inc(m, ids.rep[1].request_success[FE_FINISH_LENGTH], 1);
  fe_metrics_observe(m, ids.rep[1].request_queue_time_seconds, 0.4);
  fe_metrics_inc_at(m, ids.rep[2].spec_decode_num_accepted_tokens_per_pos, 1, 2);
  TH_CHECK(fe_metrics_add_labelled(m, FE_METRIC_COUNTER, "lmserve:generation_tokens_total", "x",
                                   NULL, 0, ",replica=\"1\"") == CM_ERR_INVAL);
  TH_CHECK(fe_metrics_add_labelled(m, FE_METRIC_GAUGE, "lmserve:generation_tokens_total", "x", NULL,
                                   0, ",replica=\"9\"") == CM_ERR_INVAL);
  TH_CHECK(fe_metrics_add_labelled(m, FE_METRIC_COUNTER, "lmserve:x_total", "x", NULL, 0,
                                   "replica=\"9\"") == CM_ERR_INVAL);
  TH_CHECK(fe_metrics_add_labelled(m, FE_METRIC_COUNTER, "lmserve:x_total", "x", NULL, 0,
                                   ",replica=\"9") == CM_ERR_INVAL);
  TH_CHECK(fe_metrics_add_labelled(m, FE_METRIC_COUNTER, "lmserve:x_total", "x", NULL, 0,
                                   ",a=\"1\",b=\"q\\\"\"") >= 0);
  struct fe_buf b;
  render(m, &b);
  const char *t = b.data;
  const char *h = strstr(t, "# TYPE lmserve:generation_tokens_total counter\n");
  TH_REQUIRE(h != NULL);
  TH_CHECK(!strstr(h + 1, "# TYPE lmserve:generation_tokens_total")); /* one header */
  const char *s0 =
      strstr(t, "lmserve:generation_tokens_total{model_name=\"g\",replica=\"0\"} 0.0\n");
  const char *s2 =
      strstr(t, "lmserve:generation_tokens_total{model_name=\"g\",replica=\"2\"} 7.0\n");
  TH_CHECK(s0 && s2 && h < s0 && s0 < s2);
  TH_CHECK(strstr(t, "lmserve:request_success_total{model_name=\"g\",replica=\"1\","
                     "finished_reason=\"length\"} 1.0\n"));
  TH_CHECK(strstr(t, "lmserve:request_queue_time_seconds_bucket{model_name=\"g\",replica=\"1\","
                     "le=\"0.5\"} 1.0\n"));
  TH_CHECK(strstr(t, "lmserve:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"g\","
                     "replica=\"2\",position=\"1\"} 2.0\n"));
  TH_CHECK(strstr(t, "lmserve:x_total{model_name=\"g\",a=\"1\",b=\"q\\\"\"} 0.0\n"));
  fe_buf_free(&b);
  fe_metrics_destroy(m);
}

/* A counter fed early (per request) and late (engine totals) shows the
 * larger sum: an early count shows at once, the late one catching up adds
 * nothing, and what only the late source saw shows once it reports. */
TH_TEST(metrics_two_sources) {
  struct fe_metric_ids ids;
  struct fe_metrics *m = standard_metrics("g", &ids);
  int q = ids.rep[0].prefix_cache_queries;
  fe_metrics_inc_early(m, q, 300); /* a request's first output */
  TH_CHECK_NEAR(fe_metrics_value(m, q), 300, 0);
  fe_metrics_inc(m, q, 300); /* the engine's totals report the same request */
  TH_CHECK_NEAR(fe_metrics_value(m, q), 300, 0);
  fe_metrics_inc(m, q, 50); /* one that never produced output */
  TH_CHECK_NEAR(fe_metrics_value(m, q), 350, 0);
  fe_metrics_inc_early(m, q, -4); /* ignored */
  fe_metrics_inc_early(m, q, 20);
  TH_CHECK_NEAR(fe_metrics_value(m, q), 350, 0);
  fe_metrics_inc_early(m, q, 40);
  TH_CHECK_NEAR(fe_metrics_value(m, q), 360, 0);
  check_rendered(m, "lmserve:prefix_cache_queries_total{model_name=\"g\",replica=\"0\"} 360.0\n",
                 NULL);
  fe_metrics_destroy(m);
}

/* The per-position counter: series appear as positions are counted. */
TH_TEST(metrics_indexed_counter) {
  struct fe_metric_ids ids;
  struct fe_metrics *m = standard_metrics("g", &ids);
  int id = ids.rep[0].spec_decode_num_accepted_tokens_per_pos;
  check_rendered(m, "# TYPE lmserve:spec_decode_num_accepted_tokens_per_pos_total counter\n",
                 "position=");
  fe_metrics_inc_at(m, id, 0, 5);
  fe_metrics_inc_at(m, id, 2, 3);
  fe_metrics_inc_at(m, id, 2, 1);
  fe_metrics_inc_at(m, id, 1, -1);   /* ignored */
  fe_metrics_inc_at(m, id, 4000, 1); /* beyond the family: ignored */
  TH_CHECK_NEAR(fe_metrics_value_at(m, id, 2), 4, 0);
  TH_CHECK_NEAR(fe_metrics_value(m, id), 9, 0);
  struct fe_buf b;
  render(m, &b);
  const char *pre =
      "lmserve:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"g\",replica=\"0\",";
  char want[3][160];
  snprintf(want[0], sizeof(want[0]), "%sposition=\"0\"} 5.0\n", pre);
  snprintf(want[1], sizeof(want[1]), "%sposition=\"1\"} 0.0\n", pre);
  snprintf(want[2], sizeof(want[2]), "%sposition=\"2\"} 4.0\n", pre);
  for (int i = 0; i < 3; i++)
    if (!strstr(b.data, want[i])) th_fail(__FILE__, __LINE__, "metrics text lacks: %s", want[i]);
  TH_CHECK(!strstr(b.data, "position=\"3\""));
  fe_buf_free(&b);
  TH_CHECK(fe_metrics_add_indexed(m, FE_METRIC_COUNTER, "lmserve:x_total", "x", "bad label") ==
           CM_ERR_INVAL);
  fe_metrics_destroy(m);
}

/* The engine's info series: one per replica once it has said what runs its
 * model, value 1, the labels escaped, a long value cut short but closed. */
TH_TEST(metrics_info_family) {
  struct fe_metric_ids ids;
  struct fe_metrics *m = standard_metrics("g", &ids);
  int id = ids.engine_info;
  /* the family, and nothing said yet */
  check_rendered(m, "# TYPE lmserve:engine_info gauge\n", "lmserve:engine_info{");
  static const char *const keys[] = {"kernels", "matmul_inputs"};
  const char *v1[] = {"cpu-avx2", NULL}, *v0[] = {"cu\"da\\x\n", "weights"};
  fe_metrics_set_info_at(m, id, 1, keys, v1, 2);
  /* replica 1 has said, replica 0 has not */
  check_rendered(m,
                 "lmserve:engine_info{model_name=\"g\",replica=\"1\",kernels=\"cpu-avx2\","
                 "matmul_inputs=\"\"} 1\n",
                 "replica=\"0\",kernels");
  fe_metrics_set_info_at(m, id, 0, keys, v0, 2);
  fe_metrics_set_info_at(m, id, 1, keys, v0 + 1, 1); /* said again: replaced */
  check_rendered(m,
                 "lmserve:engine_info{model_name=\"g\",replica=\"0\",kernels=\"cu\\\"da\\\\x\\n\","
                 "matmul_inputs=\"weights\"} 1\n",
                 NULL);
  check_rendered(m, "lmserve:engine_info{model_name=\"g\",replica=\"1\",kernels=\"weights\"} 1\n",
                 NULL);
  char big[400];
  memset(big, 'k', sizeof(big) - 1);
  big[sizeof(big) - 1] = 0;
  const char *vb[] = {big, "bf16"};
  fe_metrics_set_info_at(m, id, 2, keys, vb, 2);
  struct fe_buf b;
  render(m, &b);
  const char *l = strstr(b.data, "replica=\"2\",kernels=\"kkk");
  TH_REQUIRE(l != NULL);
  const char *eol = strchr(l, '\n');
  TH_REQUIRE(eol != NULL);
  TH_CHECK(eol - l < FE_METRIC_INFO_LEN + 16 && !memcmp(eol - 4, "\"} 1", 4));
  fe_buf_free(&b);
  fe_metrics_destroy(m);
}

TH_TEST(route_auth) {
  const char *k = "sk-secret";
  TH_CHECK(fe_route_auth_ok("Bearer sk-secret", 16, k));
  TH_CHECK(fe_route_auth_ok("bearer  sk-secret", 17, k));
  TH_CHECK(!fe_route_auth_ok("Bearer sk-secreT", 16, k));
  TH_CHECK(!fe_route_auth_ok("Bearer sk-secret2", 17, k));
  TH_CHECK(!fe_route_auth_ok("Bearer sk-secre", 15, k));
  TH_CHECK(!fe_route_auth_ok("Bearer ", 7, k));
  TH_CHECK(!fe_route_auth_ok("Basic sk-secret", 15, k));
  TH_CHECK(!fe_route_auth_ok("sk-secret", 9, k));
  TH_CHECK(!fe_route_auth_ok("Bearersk-secret", 15, k));
}

/* Anthropic's message object: the thought, the text and each call as blocks in that
 * order, stop_reason from the finish (and the stop string), usage as Anthropic
 * counts it (the cached tokens apart from the input). */
TH_TEST(resp_messages_object) {
  struct fe_buf b;
  fe_buf_init(&b, 0);
  struct fe_api_choice c = {0, "Hello", 5, "tool_calls"};
  struct fe_api_usage u;
  thought_and_two_calls(&c, &u);
  struct fe_api_resp_meta m = {"msg_1", 1700000000, "gemma"};
  TH_REQUIRE(fe_msg_write(&b, &m, &c, &u) == 0);
  json_t *j = parse(&b);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "id")), "msg_1");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "type")), "message");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "role")), "assistant");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "model")), "gemma");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "stop_reason")), "tool_use");
  TH_CHECK(json_is_null(json_object_get(j, "stop_sequence")));
  json_t *content = json_object_get(j, "content");
  TH_REQUIRE(json_array_size(content) == 4);
  static const char *const types[] = {"thinking", "text", "tool_use", "tool_use"};
  for (size_t i = 0; i < 4; i++)
    TH_CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(content, i), "type")),
                    types[i]);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(content, 0), "thinking")), "hmm");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(content, 1), "text")), "Hello");
  json_t *call = json_array_get(content, 3);
  TH_CHECK(!strncmp(json_string_value(json_object_get(call, "id")), "toolu_", 6));
  TH_CHECK_EQ_STR(json_string_value(json_object_get(call, "name")), "g");
  TH_CHECK(json_integer_value(json_object_get(json_object_get(call, "input"), "a")) == 1);
  json_t *us = json_object_get(j, "usage");
  TH_CHECK(json_integer_value(json_object_get(us, "input_tokens")) == 6);
  TH_CHECK(json_integer_value(json_object_get(us, "cache_read_input_tokens")) == 4);
  TH_CHECK(json_integer_value(json_object_get(us, "cache_creation_input_tokens")) == 0);
  TH_CHECK(json_integer_value(json_object_get(us, "output_tokens")) == 7);
  json_decref(j);
  /* a stop string, max tokens, a call cut short (its input {}), an empty answer */
  static const struct {
    const char *finish, *stop_str, *calls, *reason;
  } cases[] = {
      {"stop", "##", NULL, "stop_sequence"},
      {"stop", NULL, NULL, "end_turn"},
      {"length", NULL, NULL, "max_tokens"},
      {"length", NULL,
       "[{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
       "\"{\\\"a\"}}]",
       "max_tokens"},
  };
  for (size_t i = 0; i < CM_ARRAY_LEN(cases); i++) {
    fe_buf_reset(&b);
    struct fe_api_choice d = {0, "", 0, cases[i].finish};
    d.stop_str = cases[i].stop_str;
    d.tool_calls = cases[i].calls;
    TH_REQUIRE(fe_msg_write(&b, &m, &d, &u) == 0);
    j = parse(&b);
    TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "stop_reason")), cases[i].reason);
    json_t *ss = json_object_get(j, "stop_sequence");
    if (cases[i].stop_str)
      TH_CHECK_EQ_STR(json_string_value(ss), cases[i].stop_str);
    else
      TH_CHECK(json_is_null(ss));
    content = json_object_get(j, "content");
    TH_REQUIRE(json_array_size(content) == 1);
    json_t *blk = json_array_get(content, 0);
    if (cases[i].calls)
      TH_CHECK(json_is_object(json_object_get(blk, "input")) &&
               json_object_size(json_object_get(blk, "input")) == 0);
    else
      TH_CHECK_EQ_STR(json_string_value(json_object_get(blk, "text")), "");
    json_decref(j);
  }
  fe_buf_free(&b);
}

/* An Anthropic stream: message_start with the input's usage and a ping, each block
 * started, its deltas, (a thought's signature) and stopped before the next, indices
 * in order, then message_delta with the stop reason and usage, and message_stop. */
TH_TEST(resp_messages_events) {
  struct fe_msg_stream s;
  struct fe_api_resp_meta m = {"msg_2", 1700000000, "gemma"};
  fe_msg_stream_init(&s, &m);
  struct fe_buf b;
  fe_buf_init(&b, 0);
  struct fe_api_usage u = {4, 0, 0, 1, 0};
  struct fe_api_choice c0 = {0, "", 0}; /* the role chunk: message_start alone */
  fe_msg_stream_chunk(&s, &b, &c0, &u);
  struct fe_api_choice c1 = {0};
  c1.reasoning = "thi";
  c1.reasoning_len = 3;
  fe_msg_stream_chunk(&s, &b, &c1, &u);
  c1.reasoning = "nk";
  c1.reasoning_len = 2;
  fe_msg_stream_chunk(&s, &b, &c1, &u);
  struct fe_api_choice c3 = {0, "Hello", 5};
  fe_msg_stream_chunk(&s, &b, &c3, &u);
  struct fe_api_choice c4 = {0};
  c4.tool_calls =
      "[{\"index\":0,\"id\":\"call_9\",\"type\":\"function\",\"function\":{\"name\":"
      "\"f\",\"arguments\":\"\"}},{\"index\":0,\"function\":{\"arguments\":\"{\\\"a\"}}]";
  fe_msg_stream_chunk(&s, &b, &c4, &u);
  c4.tool_calls = "[{\"index\":0,\"function\":{\"arguments\":\"\\\":1}\"}},{\"index\":1,"
                  "\"id\":\"call_8\",\"type\":\"function\",\"function\":{\"name\":\"g\","
                  "\"arguments\":\"{}\"}}]";
  fe_msg_stream_chunk(&s, &b, &c4, &u);
  u.completion_tokens = 9;
  TH_REQUIRE(fe_msg_stream_end(&s, &b, "tool_calls", NULL, &u) == 0);
  TH_REQUIRE(b.err == 0);
  static const struct {
    const char *type, *delta;
    int index;
  } want[] = {
      {"message_start", NULL, -1},
      {"ping", NULL, -1},
      {"content_block_start", NULL, 0},
      {"content_block_delta", "thinking_delta", 0},
      {"content_block_delta", "thinking_delta", 0},
      {"content_block_delta", "signature_delta", 0},
      {"content_block_stop", NULL, 0},
      {"content_block_start", NULL, 1},
      {"content_block_delta", "text_delta", 1},
      {"content_block_stop", NULL, 1},
      {"content_block_start", NULL, 2},
      {"content_block_delta", "input_json_delta", 2},
      {"content_block_delta", "input_json_delta", 2},
      {"content_block_stop", NULL, 2},
      {"content_block_start", NULL, 3},
      {"content_block_delta", "input_json_delta", 3},
      {"content_block_stop", NULL, 3},
      {"message_delta", NULL, -1},
      {"message_stop", NULL, -1},
  };
  size_t n = 0;
  struct fe_buf json; /* the tool_use block's partial_json, put together */
  fe_buf_init(&json, 0);
  const char *p = b.data;
  for (json_t *j; (j = next_event(&p, b.data + b.len)) && n < CM_ARRAY_LEN(want) + 1; n++) {
    const char *type = json_string_value(json_object_get(j, "type"));
    TH_REQUIRE(n < CM_ARRAY_LEN(want));
    TH_CHECK_EQ_STR(type, want[n].type);
    if (want[n].index >= 0)
      TH_CHECK(json_integer_value(json_object_get(j, "index")) == want[n].index);
    json_t *d = json_object_get(j, "delta");
    if (want[n].delta) TH_CHECK_EQ_STR(json_string_value(json_object_get(d, "type")), want[n].delta);
    if (want[n].delta && !strcmp(want[n].delta, "input_json_delta") && want[n].index == 2) {
      json_t *pj = json_object_get(d, "partial_json");
      fe_buf_append(&json, json_string_value(pj), json_string_length(pj));
    }
    if (!strcmp(type, "message_start")) {
      json_t *msg = json_object_get(j, "message");
      TH_CHECK_EQ_STR(json_string_value(json_object_get(msg, "id")), "msg_2");
      TH_CHECK(json_array_size(json_object_get(msg, "content")) == 0);
      TH_CHECK(json_integer_value(json_object_get(json_object_get(msg, "usage"), "input_tokens")) ==
               3);
    }
    if (!strcmp(type, "content_block_start") && want[n].index == 2) {
      json_t *blk = json_object_get(j, "content_block");
      TH_CHECK_EQ_STR(json_string_value(json_object_get(blk, "type")), "tool_use");
      TH_CHECK_EQ_STR(json_string_value(json_object_get(blk, "name")), "f");
    }
    if (!strcmp(type, "message_delta")) {
      TH_CHECK_EQ_STR(json_string_value(json_object_get(d, "stop_reason")), "tool_use");
      TH_CHECK(json_is_null(json_object_get(d, "stop_sequence")));
      TH_CHECK(json_integer_value(json_object_get(json_object_get(j, "usage"), "output_tokens")) ==
               9);
    }
    json_decref(j);
  }
  TH_CHECK(n == CM_ARRAY_LEN(want));
  TH_CHECK(json.len == 7 && !memcmp(json.data, "{\"a\":1}", 7));
  fe_buf_free(&json);
  /* an empty answer stopped by a stop string: one empty text block */
  fe_msg_stream_init(&s, &m);
  fe_buf_reset(&b);
  TH_REQUIRE(fe_msg_stream_end(&s, &b, "stop", "##", &u) == 0);
  TH_CHECK(strstr(b.data, "event: message_start") && strstr(b.data, "\"type\":\"text\""));
  TH_CHECK(strstr(b.data, "\"stop_reason\":\"stop_sequence\",\"stop_sequence\":\"##\"") != NULL);
  fe_buf_reset(&b);
  TH_REQUIRE(fe_msg_stream_error(&b, 503, "no engine") == 0);
  TH_CHECK(strstr(b.data, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":"
                          "\"overloaded_error\"") == b.data);
  fe_buf_free(&b);
}

/* A chunk that ends a call's arguments and begins text after the call: the
 * arguments go first, into the call, in both APIs' streams (the text's block or
 * item closes the call). */
TH_TEST(resp_call_arguments_before_text) {
  struct fe_api_choice a = {0};
  a.tool_calls = "[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
                 "\"f\",\"arguments\":\"{\\\"a\"}}]";
  struct fe_api_choice b = {0, "after", 5};
  b.tool_calls = "[{\"index\":0,\"function\":{\"arguments\":\"\\\":1}\"}}]";
  struct fe_api_usage u = {4, 2, 0, 0, 0};
  struct fe_api_resp_meta m = {"msg_3", 1700000000, "gemma"};
  struct fe_buf out;
  fe_buf_init(&out, 0);
  struct fe_msg_stream ms;
  fe_msg_stream_init(&ms, &m);
  fe_msg_stream_chunk(&ms, &out, &a, &u);
  fe_msg_stream_chunk(&ms, &out, &b, &u);
  TH_REQUIRE(fe_msg_stream_end(&ms, &out, "stop", NULL, &u) == 0);
  const char *args = strstr(out.data, "\"partial_json\":\"\\\":1}\"");
  const char *stop0 = strstr(out.data, "\"type\":\"content_block_stop\",\"index\":0");
  const char *text = strstr(out.data, "\"type\":\"text_delta\",\"text\":\"after\"");
  TH_CHECK(args && stop0 && text && args < stop0 && stop0 < text);
  fe_buf_reset(&out);
  struct fe_resp_stream rs;
  fe_resp_stream_init(&rs, &m, NULL);
  fe_resp_stream_chunk(&rs, &out, &a);
  fe_resp_stream_chunk(&rs, &out, &b);
  TH_REQUIRE(fe_resp_stream_end(&rs, &out, "stop", &u, NULL) == 0);
  const char *done = strstr(out.data, "\"type\":\"response.function_call_arguments.done\"");
  const char *tdelta = strstr(out.data, "\"type\":\"response.output_text.delta\"");
  TH_CHECK(done && tdelta && done < tdelta);
  TH_CHECK(done && strstr(done, "\"arguments\":\"{\\\"a\\\":1}\"") != NULL);
  fe_resp_stream_free(&rs);
  fe_buf_free(&out);
}
