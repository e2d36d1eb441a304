/* fe-api-resp.c — OpenAI response and stream-chunk JSON (see fe-api-resp.h). */
#include "frontend/fe-api-resp.h"

#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/cm-err.h"
#include "common/cm-time.h"

void fe_api_make_id(char *out, size_t size, const char *prefix) {
  static const char hex[] = "0123456789abcdef";
  unsigned char r[16];
  if (getrandom(r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
    uint64_t t = cm_time_ns() ^ cm_time_wall_ns();
    for (size_t i = 0; i < sizeof(r); i++)
      r[i] = (unsigned char)(t >> (i % 8 * 8)) ^ (unsigned char)(i * 131);
  }
  size_t o = (size_t)snprintf(out, size, "%s", prefix);
  for (size_t i = 0; i < sizeof(r) && o + 2 < size; i++) {
    out[o++] = hex[r[i] >> 4];
    out[o++] = hex[r[i] & 15];
  }
  out[o < size ? o : size - 1] = 0;
}

void fe_api_put_json(struct fe_buf *b, const char *key, json_t *v) {
  char *d = v ? json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY) : NULL;
  json_decref(v);
  fe_buf_printf(b, ",\"%s\":", key);
  if (d)
    fe_buf_puts(b, d);
  else
    b->err = CM_ERR_NOMEM;
  free(d);
}

static void head(struct fe_buf *b, const struct fe_api_resp_meta *m, const char *object) {
  fe_buf_puts(b, "{\"id\":");
  fe_buf_json_str(b, m->id, strlen(m->id));
  fe_buf_puts(b, ",\"object\":\"");
  fe_buf_puts(b, object);
  fe_buf_puts(b, "\",\"created\":");
  fe_buf_i64(b, m->created);
  fe_buf_puts(b, ",\"model\":");
  fe_buf_json_str(b, m->model, strlen(m->model));
  fe_buf_puts(b, ",\"choices\":[");
}

static void usage(struct fe_buf *b, const struct fe_api_usage *u) {
  fe_buf_puts(b, "\"usage\":{\"prompt_tokens\":");
  fe_buf_i64(b, u->prompt_tokens);
  fe_buf_puts(b, ",\"total_tokens\":");
  fe_buf_i64(b, u->prompt_tokens + u->completion_tokens);
  fe_buf_puts(b, ",\"completion_tokens\":");
  fe_buf_i64(b, u->completion_tokens);
  if (u->details) {
    fe_buf_puts(b, ",\"prompt_tokens_details\":{\"cached_tokens\":");
    fe_buf_i64(b, u->cached_tokens);
    fe_buf_puts(b, "}");
  }
  fe_buf_puts(b, "}");
}

static void finish_reason(struct fe_buf *b, const char *fr) {
  fe_buf_puts(b, ",\"finish_reason\":");
  if (fr)
    fe_buf_json_str(b, fr, strlen(fr));
  else
    fe_buf_puts(b, "null");
}

/* Completions logprobs: {"text_offset","token_logprobs","tokens","top_logprobs"}
 * (c->logprobs is set). */
static void completion_logprobs(struct fe_buf *b, const struct fe_api_choice *c) {
  fe_buf_puts(b, "{\"text_offset\":[");
  size_t off = c->text_offset;
  for (size_t i = 0; i < c->n_logprobs; i++) {
    if (i) fe_buf_puts(b, ",");
    fe_buf_i64(b, (int64_t)off);
    off += c->logprobs[i].token_len;
  }
  fe_buf_puts(b, "],\"token_logprobs\":[");
  for (size_t i = 0; i < c->n_logprobs; i++) {
    if (i) fe_buf_puts(b, ",");
    fe_buf_json_double(b, c->logprobs[i].logprob);
  }
  fe_buf_puts(b, "],\"tokens\":[");
  for (size_t i = 0; i < c->n_logprobs; i++) {
    if (i) fe_buf_puts(b, ",");
    fe_buf_json_str(b, c->logprobs[i].token, c->logprobs[i].token_len);
  }
  fe_buf_puts(b, "],\"top_logprobs\":[");
  for (size_t i = 0; i < c->n_logprobs; i++) {
    const struct fe_api_token_logprob *t = &c->logprobs[i];
    if (isnan(t->logprob)) { /* an echoed prompt's first token */
      fe_buf_puts(b, i ? ",null" : "null");
      continue;
    }
    fe_buf_puts(b, i ? ",{" : "{");
    for (size_t k = 0; k < t->n_top; k++) {
      if (k) fe_buf_puts(b, ",");
      fe_buf_json_str(b, t->top[k].token, t->top[k].token_len);
      fe_buf_puts(b, ":");
      fe_buf_json_double(b, t->top[k].logprob);
    }
    fe_buf_puts(b, "}");
  }
  fe_buf_puts(b, "]}");
}

static void bytes_array(struct fe_buf *b, const char *s, size_t n) {
  fe_buf_puts(b, ",\"bytes\":[");
  for (size_t i = 0; i < n; i++) {
    if (i) fe_buf_puts(b, ",");
    fe_buf_i64(b, (unsigned char)s[i]);
  }
  fe_buf_puts(b, "]");
}

void fe_api_write_logprob_entries(struct fe_buf *b, const struct fe_api_token_logprob *lps,
                                  size_t n) {
  for (size_t i = 0; i < n; i++) {
    const struct fe_api_token_logprob *t = &lps[i];
    fe_buf_puts(b, i ? ",{\"token\":" : "{\"token\":");
    fe_buf_json_str(b, t->token, t->token_len);
    fe_buf_puts(b, ",\"logprob\":");
    fe_buf_json_double(b, t->logprob);
    bytes_array(b, t->token, t->token_len);
    fe_buf_puts(b, ",\"top_logprobs\":[");
    for (size_t k = 0; k < t->n_top; k++) {
      fe_buf_puts(b, k ? ",{\"token\":" : "{\"token\":");
      fe_buf_json_str(b, t->top[k].token, t->top[k].token_len);
      fe_buf_puts(b, ",\"logprob\":");
      fe_buf_json_double(b, t->top[k].logprob);
      bytes_array(b, t->top[k].token, t->top[k].token_len);
      fe_buf_puts(b, "}");
    }
    fe_buf_puts(b, "]}");
  }
}

/* Chat logprobs: {"content":[entries]} (c->logprobs is set). */
static void chat_logprobs(struct fe_buf *b, const struct fe_api_choice *c) {
  fe_buf_puts(b, "{\"content\":[");
  fe_api_write_logprob_entries(b, c->logprobs, c->n_logprobs);
  fe_buf_puts(b, "]}");
}

/* ,"key":[ids] */
static void id_list(struct fe_buf *b, const char *key, const int32_t *ids, size_t n) {
  fe_buf_puts(b, ",\"");
  fe_buf_puts(b, key);
  fe_buf_puts(b, "\":[");
  for (size_t i = 0; i < n; i++) {
    if (i) fe_buf_puts(b, ",");
    fe_buf_i64(b, ids[i]);
  }
  fe_buf_puts(b, "]");
}

/* A choice's last fields, "token_ids" when asked for, "logprobs" (in the endpoint's
 * form, or null) and "finish_reason", and its closing brace. */
static void choice_end(struct fe_buf *b, const struct fe_api_choice *c,
                       void (*logprobs)(struct fe_buf *, const struct fe_api_choice *)) {
  if (c->with_ids) id_list(b, "token_ids", c->ids, c->n_ids);
  fe_buf_puts(b, ",\"logprobs\":");
  if (c->logprobs)
    logprobs(b, c);
  else
    fe_buf_puts(b, "null");
  const char *fr = c->finish_reason;
  finish_reason(b, c->function_call && fr && !strcmp(fr, "tool_calls") ? "function_call" : fr);
  fe_buf_puts(b, "}");
}

/* ,"prompt_logprobs":[...] when c has them */
static void prompt_logprobs(struct fe_buf *b, const struct fe_api_choice *c) {
  if (!c || !c->prompt_logprobs) return;
  fe_buf_puts(b, ",\"prompt_logprobs\":");
  fe_buf_append(b, c->prompt_logprobs, c->prompt_logprobs_len);
}

static void completion_choice(struct fe_buf *b, const struct fe_api_choice *c) {
  fe_buf_puts(b, "{\"index\":");
  fe_buf_i64(b, c->index);
  fe_buf_puts(b, ",\"text\":");
  fe_buf_json_str(b, c->text ? c->text : "", c->text_len);
  if (c->prompt_ids) id_list(b, "prompt_token_ids", c->prompt_ids, c->n_prompt_ids);
  prompt_logprobs(b, c);
  choice_end(b, c, completion_logprobs);
}

/* "function_call": the function object ({name, arguments}, or a stream delta's
 * part of it) of the call in the tool_calls array's JSON calls (legacy functions ask
 * one call at most; a delta may hold its beginning and more of its arguments as
 * two entries, joined here). */
static void function_call(struct fe_buf *b, const char *calls) {
  json_t *a = json_loads(calls, 0, NULL), *fn = json_object(), *e;
  size_t i;
  fe_buf_puts(b, "\"function_call\":");
  json_array_foreach(a, i, e) {
    json_t *f = json_object_get(e, "function"), *name = json_object_get(f, "name");
    json_t *args = json_object_get(f, "arguments");
    if (json_is_string(name) && !json_object_get(fn, "name")) json_object_set(fn, "name", name);
    if (!json_is_string(args)) continue;
    json_t *had = json_object_get(fn, "arguments"); /* arguments join */
    size_t n1 = had ? json_string_length(had) : 0, n2 = json_string_length(args);
    char *t = malloc(n1 + n2 + 1);
    if (!t) break;
    if (n1) memcpy(t, json_string_value(had), n1);
    memcpy(t + n1, json_string_value(args), n2);
    json_object_set_new(fn, "arguments", json_stringn_nocheck(t, n1 + n2));
    free(t);
  }
  json_decref(a);
  char *d = json_dumps(fn, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(fn);
  fe_buf_puts(b, d ? d : "null");
  free(d);
}

/* One chat choice; its text goes in "message", or in "delta" for a stream
 * chunk, where the role is only in the first chunk and content only when
 * there is text. */
static void chat_choice(struct fe_buf *b, const struct fe_api_choice *c, const char *field,
                        int with_role) {
  fe_buf_puts(b, "{\"index\":");
  fe_buf_i64(b, c->index);
  fe_buf_puts(b, ",\"");
  fe_buf_puts(b, field);
  fe_buf_puts(b, "\":{");
  int first = !with_role; /* no field written yet */
  if (with_role) fe_buf_puts(b, "\"role\":\"assistant\"");
  if (c->reasoning_len) { /* "reasoning" (vLLM's name) and "reasoning_content" (the older one) */
    fe_buf_puts(b, first ? "\"reasoning\":" : ",\"reasoning\":");
    fe_buf_json_str(b, c->reasoning, c->reasoning_len);
    fe_buf_puts(b, ",\"reasoning_content\":");
    fe_buf_json_str(b, c->reasoning, c->reasoning_len);
    first = 0;
  }
  if (c->text_len || (with_role && !c->tool_calls)) {
    fe_buf_puts(b, first ? "\"content\":" : ",\"content\":");
    fe_buf_json_str(b, c->text ? c->text : "", c->text_len);
    first = 0;
  } else if (with_role) {
    fe_buf_puts(b, ",\"content\":null");
  }
  if (c->tool_calls && c->function_call) {
    if (!first) fe_buf_puts(b, ",");
    function_call(b, c->tool_calls);
  } else if (c->tool_calls) {
    fe_buf_puts(b, first ? "\"tool_calls\":" : ",\"tool_calls\":");
    fe_buf_puts(b, c->tool_calls);
  }
  fe_buf_puts(b, "}");
  choice_end(b, c, chat_logprobs);
}

/* The end of a response: the choices array closed, a chat answer's prompt_token_ids
 * (from c, when it has them), then usage (when given). */
static int tail(struct fe_buf *b, const struct fe_api_choice *c, const struct fe_api_usage *u) {
  fe_buf_puts(b, "]");
  if (c && c->prompt_ids) id_list(b, "prompt_token_ids", c->prompt_ids, c->n_prompt_ids);
  prompt_logprobs(b, c);
  if (!u) return fe_buf_puts(b, "}");
  fe_buf_puts(b, ",");
  usage(b, u);
  return fe_buf_puts(b, "}");
}

int fe_api_write_completion(struct fe_buf *b, const struct fe_api_resp_meta *m,
                            const struct fe_api_choice *choices, size_t n,
                            const struct fe_api_usage *u) {
  head(b, m, "text_completion");
  for (size_t i = 0; i < n; i++) {
    if (i) fe_buf_puts(b, ",");
    completion_choice(b, &choices[i]);
  }
  return tail(b, NULL, u);
}

int fe_api_write_chat(struct fe_buf *b, const struct fe_api_resp_meta *m,
                      const struct fe_api_choice *choices, size_t n, const struct fe_api_usage *u) {
  head(b, m, "chat.completion");
  for (size_t i = 0; i < n; i++) {
    if (i) fe_buf_puts(b, ",");
    chat_choice(b, &choices[i], "message", 1);
  }
  return tail(b, n ? &choices[0] : NULL, u);
}

int fe_api_write_completion_chunk(struct fe_buf *b, const struct fe_api_resp_meta *m,
                                  const struct fe_api_choice *c, const struct fe_api_usage *u) {
  head(b, m, "text_completion");
  completion_choice(b, c);
  return tail(b, NULL, u);
}

int fe_api_write_chat_chunk(struct fe_buf *b, const struct fe_api_resp_meta *m,
                            const struct fe_api_choice *c, int with_role,
                            const struct fe_api_usage *u) {
  head(b, m, "chat.completion.chunk");
  chat_choice(b, c, "delta", with_role);
  return tail(b, c, u);
}

int fe_api_write_usage_chunk(struct fe_buf *b, enum fe_api_kind kind,
                             const struct fe_api_resp_meta *m, const struct fe_api_usage *u) {
  head(b, m, kind == FE_API_CHAT ? "chat.completion.chunk" : "text_completion");
  return tail(b, NULL, u);
}

int fe_api_write_tokenize(struct fe_buf *b, const int32_t *ids, size_t n, int64_t max_model_len,
                          const char *const *strs, const size_t *lens) {
  fe_buf_puts(b, "{\"count\":");
  fe_buf_i64(b, (int64_t)n);
  fe_buf_puts(b, ",\"max_model_len\":");
  fe_buf_i64(b, max_model_len);
  id_list(b, "tokens", ids, n);
  if (strs) {
    fe_buf_puts(b, ",\"token_strs\":[");
    for (size_t i = 0; i < n; i++) {
      if (i) fe_buf_puts(b, ",");
      fe_buf_json_str(b, strs[i] ? strs[i] : "", strs[i] ? lens[i] : 0);
    }
    fe_buf_puts(b, "]");
  }
  return fe_buf_puts(b, "}");
}

int fe_api_write_detokenize(struct fe_buf *b, const char *text, size_t len) {
  fe_buf_puts(b, "{\"prompt\":");
  fe_buf_json_str(b, text, len);
  return fe_buf_puts(b, "}");
}

int fe_api_write_audio_text(struct fe_buf *b, const char *type, const char *text, size_t len,
                            const struct fe_api_usage *u) {
  fe_buf_puts(b, "{");
  if (type) {
    fe_buf_puts(b, "\"type\":");
    fe_buf_json_str(b, type, strlen(type));
    fe_buf_puts(b, ",");
  }
  fe_buf_puts(b, "\"text\":");
  fe_buf_json_str(b, text, len);
  fe_buf_puts(b, ",\"usage\":{\"type\":\"tokens\",\"input_tokens\":");
  fe_buf_i64(b, u->prompt_tokens);
  fe_buf_puts(b, ",\"output_tokens\":");
  fe_buf_i64(b, u->completion_tokens);
  fe_buf_puts(b, ",\"total_tokens\":");
  fe_buf_i64(b, u->prompt_tokens + u->completion_tokens);
  return fe_buf_puts(b, "}}");
}
