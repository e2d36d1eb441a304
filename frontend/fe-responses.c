/* fe-responses.c — the Responses API's response object and stream events
 * (see fe-responses.h). Items and whole responses are built with Jansson; the
 * deltas, one per chunk, are written straight into the buffer. */
#include "frontend/fe-responses.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "frontend/fe-api-error.h"

/* ---- the response object ------------------------------------------------------ */

static json_t *usage_obj(const struct fe_api_usage *u) {
  return json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I}", "input_tokens",
                   (json_int_t)u->prompt_tokens, "input_tokens_details", "cached_tokens",
                   (json_int_t)u->cached_tokens, "output_tokens", (json_int_t)u->completion_tokens,
                   "output_tokens_details", "reasoning_tokens", (json_int_t)u->reasoning_tokens,
                   "total_tokens", (json_int_t)(u->prompt_tokens + u->completion_tokens));
}

static int incomplete(const char *finish_reason) {
  return finish_reason && strcmp(finish_reason, "stop") && strcmp(finish_reason, "tool_calls");
}

/* The response object: status, output (taken), usage (NULL: null), the echo's fields. */
static json_t *response_obj(const struct fe_api_resp_meta *m, const char *echo, const char *status,
                            const char *finish_reason, json_t *output,
                            const struct fe_api_usage *u) {
  json_t *r = json_object();
  json_object_set_new(r, "id", json_string(m->id));
  json_object_set_new(r, "object", json_string("response"));
  json_object_set_new(r, "created_at", json_integer(m->created));
  json_object_set_new(r, "status", json_string(status));
  json_object_set_new(r, "error", json_null());
  json_object_set_new(r, "incomplete_details",
                      finish_reason && !strcmp(finish_reason, "length")
                          ? json_pack("{s:s}", "reason", "max_output_tokens")
                          : json_null());
  json_object_set_new(r, "model", json_string(m->model));
  json_object_set_new(r, "output", output);
  json_t *e = json_loads(echo ? echo : "{}", 0, NULL);
  json_object_update(r, e);
  json_decref(e);
  json_object_set_new(r, "usage", u ? usage_obj(u) : json_null());
  return r;
}

static json_t *reasoning_item(const char *id, const char *text, size_t len, const char *status) {
  return json_pack("{s:s, s:s, s:[], s:[{s:s, s:s%}], s:s}", "id", id, "type", "reasoning",
                   "summary", "content", "type", "reasoning_text", "text", text, len, "status",
                   status);
}

/* An output_text part; lps: its logprob entries' JSON (comma-separated) */
static json_t *text_part(const char *text, size_t len, const char *lps, size_t lps_len) {
  struct fe_buf b;
  fe_buf_init(&b, 0);
  fe_buf_puts(&b, "[");
  fe_buf_append(&b, lps, lps_len);
  fe_buf_puts(&b, "]");
  json_t *lp = b.err ? NULL : json_loadb(b.data, b.len, 0, NULL);
  fe_buf_free(&b);
  return json_pack("{s:s, s:s%, s:[], s:o}", "type", "output_text", "text", text, len,
                   "annotations", "logprobs", lp ? lp : json_array());
}

static json_t *message_item(const char *id, json_t *part, const char *status) {
  return json_pack("{s:s, s:s, s:s, s:s, s:[o]}", "id", id, "type", "message", "status", status,
                   "role", "assistant", "content", part);
}

static json_t *call_item(const char *id, const char *call_id, const char *name, const char *args,
                         size_t args_len, const char *status) {
  return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s%}", "id", id, "type", "function_call", "status",
                   status, "call_id", call_id, "name", name, "arguments", args, args_len);
}

int fe_resp_write(struct fe_buf *b, const struct fe_api_resp_meta *m, const char *echo,
                  const struct fe_api_choice *c, const struct fe_api_usage *u) {
  json_t *out = json_array();
  char id[48];
  int inc = incomplete(c->finish_reason);
  if (c->reasoning_len) {
    fe_api_make_id(id, sizeof(id), "rs_");
    json_array_append_new(out, reasoning_item(id, c->reasoning, c->reasoning_len, "completed"));
  }
  json_t *calls = c->tool_calls ? json_loads(c->tool_calls, 0, NULL) : NULL;
  if (c->text_len || !json_array_size(calls)) {
    struct fe_buf lps;
    fe_buf_init(&lps, 0);
    if (c->logprobs) fe_api_write_logprob_entries(&lps, c->logprobs, c->n_logprobs);
    fe_api_make_id(id, sizeof(id), "msg_");
    json_array_append_new(
        out,
        message_item(
            id, text_part(c->text ? c->text : "", c->text_len, lps.data ? lps.data : "", lps.len),
            inc && !json_array_size(calls) ? "incomplete" : "completed"));
    fe_buf_free(&lps);
  }
  size_t i;
  json_t *x;
  json_array_foreach(calls, i, x) {
    json_t *fn = json_object_get(x, "function"), *args = json_object_get(fn, "arguments");
    const char *name = json_string_value(json_object_get(fn, "name"));
    const char *cid = json_string_value(json_object_get(x, "id"));
    fe_api_make_id(id, sizeof(id), "fc_");
    json_array_append_new(
        out,
        call_item(id, cid ? cid : id, name ? name : "",
                  json_string_value(args) ? json_string_value(args) : "", json_string_length(args),
                  inc && i + 1 == json_array_size(calls) ? "incomplete" : "completed"));
  }
  json_decref(calls);
  json_t *r = response_obj(m, echo, inc ? "incomplete" : "completed", c->finish_reason, out, u);
  char *s = json_dumps(r, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(r);
  int rc = s ? fe_buf_puts(b, s) : CM_ERR_NOMEM;
  free(s);
  return rc;
}

/* ---- the stream ------------------------------------------------------------- */

void fe_resp_stream_init(struct fe_resp_stream *s, const struct fe_api_resp_meta *m,
                         const char *echo) {
  memset(s, 0, sizeof(*s));
  s->meta = *m;
  s->echo = echo;
  s->items = json_array();
  fe_buf_init(&s->text, 0);
  fe_buf_init(&s->lps, 0);
}

void fe_resp_stream_free(struct fe_resp_stream *s) {
  json_decref(s->items);
  fe_buf_free(&s->text);
  fe_buf_free(&s->lps);
  memset(s, 0, sizeof(*s));
}

/* `event: type`, then data's opening up to its sequence number; the caller adds
 * its fields and closes it with ev_end. */
static void ev_begin(struct fe_resp_stream *s, struct fe_buf *out, const char *type) {
  fe_buf_puts(out, "event: ");
  fe_buf_puts(out, type);
  fe_buf_puts(out, "\ndata: {\"type\":\"");
  fe_buf_puts(out, type);
  fe_buf_puts(out, "\",\"sequence_number\":");
  fe_buf_i64(out, s->seq++);
}

static int ev_end(struct fe_buf *out) {
  return fe_buf_puts(out, "}\n\n");
}

/* ,"item_id":"..","output_index":N (the open item) */
static void at_item(struct fe_resp_stream *s, struct fe_buf *out) {
  fe_buf_puts(out, ",\"item_id\":");
  fe_buf_json_str(out, s->item_id, strlen(s->item_id));
  fe_buf_puts(out, ",\"output_index\":");
  fe_buf_i64(out, (int64_t)json_array_size(s->items) - 1);
}

/* An item event: "output_item.added" or ".done", with the item (a copy of items' last). */
static void item_event(struct fe_resp_stream *s, struct fe_buf *out, const char *type) {
  ev_begin(s, out, type);
  fe_buf_puts(out, ",\"output_index\":");
  fe_buf_i64(out, (int64_t)json_array_size(s->items) - 1);
  fe_api_put_json(out, "item",
                  json_deep_copy(json_array_get(s->items, json_array_size(s->items) - 1)));
  ev_end(out);
}

/* A content part event of the open item (content index 0). */
static void part_event(struct fe_resp_stream *s, struct fe_buf *out, const char *type,
                       json_t *part) {
  ev_begin(s, out, type);
  at_item(s, out);
  fe_buf_puts(out, ",\"content_index\":0");
  fe_api_put_json(out, "part", part);
  ev_end(out);
}

static json_t *open_part(const struct fe_resp_stream *s) {
  if (s->open == 'r')
    return json_pack("{s:s, s:s%}", "type", "reasoning_text", "text",
                     s->text.data ? s->text.data : "", s->text.len);
  return text_part(s->text.data ? s->text.data : "", s->text.len, s->lps.data ? s->lps.data : "",
                   s->lps.len);
}

/* Closes the open item: its .done events, then output_item.done. */
static void close_item(struct fe_resp_stream *s, struct fe_buf *out, const char *status) {
  if (!s->open) return;
  json_t *item = json_array_get(s->items, json_array_size(s->items) - 1);
  const char *text = s->text.data ? s->text.data : "";
  if (s->open == 'f') {
    ev_begin(s, out, "response.function_call_arguments.done");
    at_item(s, out);
    fe_buf_puts(out, ",\"name\":");
    const char *name = json_string_value(json_object_get(item, "name"));
    fe_buf_json_str(out, name, strlen(name));
    fe_buf_puts(out, ",\"arguments\":");
    fe_buf_json_str(out, text, s->text.len);
    ev_end(out);
    json_object_set_new(item, "arguments", json_stringn_nocheck(text, s->text.len));
  } else {
    ev_begin(s, out, s->open == 'r' ? "response.reasoning_text.done" : "response.output_text.done");
    at_item(s, out);
    fe_buf_puts(out, ",\"content_index\":0,\"text\":");
    fe_buf_json_str(out, text, s->text.len);
    if (s->open == 'm') {
      fe_buf_puts(out, ",\"logprobs\":[");
      fe_buf_append(out, s->lps.data, s->lps.len);
      fe_buf_puts(out, "]");
    }
    ev_end(out);
    part_event(s, out, "response.content_part.done", open_part(s));
    json_object_set_new(item, "content", json_pack("[o]", open_part(s)));
  }
  json_object_set_new(item, "status", json_string(status));
  item_event(s, out, "response.output_item.done");
  if (s->open == 'm') { /* (other items' logprobs wait for the next message) */
    fe_buf_reset(&s->lps);
    s->lps_sent = 0;
  }
  s->open = 0;
  fe_buf_reset(&s->text);
}

/* Opens an item of kind k (closing another): output_item.added, and the
 * content_part.added of a reasoning or message item. */
static void open_item(struct fe_resp_stream *s, struct fe_buf *out, int k, const char *call_id,
                      const char *name) {
  if (s->open == k && k != 'f') return;
  close_item(s, out, "completed");
  fe_api_make_id(s->item_id, sizeof(s->item_id), k == 'r' ? "rs_" : k == 'm' ? "msg_" : "fc_");
  json_t *item;
  if (k == 'r')
    item = json_pack("{s:s, s:s, s:[], s:[], s:s}", "id", s->item_id, "type", "reasoning",
                     "summary", "content", "status", "in_progress");
  else if (k == 'm')
    item = json_pack("{s:s, s:s, s:s, s:s, s:[]}", "id", s->item_id, "type", "message", "status",
                     "in_progress", "role", "assistant", "content");
  else
    item = call_item(s->item_id, call_id, name, "", 0, "in_progress");
  if (!item || json_array_append_new(s->items, item)) {
    out->err = CM_ERR_NOMEM;
    return;
  }
  s->open = k;
  item_event(s, out, "response.output_item.added");
  if (k != 'f') part_event(s, out, "response.content_part.added", open_part(s));
}

/* A delta event of the open item: its text's new bytes (a message's: with the
 * logprob entries not yet sent). */
static void delta_event(struct fe_resp_stream *s, struct fe_buf *out, const char *d, size_t n) {
  ev_begin(s, out,
           s->open == 'r'   ? "response.reasoning_text.delta"
           : s->open == 'm' ? "response.output_text.delta"
                            : "response.function_call_arguments.delta");
  at_item(s, out);
  if (s->open != 'f') fe_buf_puts(out, ",\"content_index\":0");
  fe_buf_puts(out, ",\"delta\":");
  fe_buf_json_str(out, d, n);
  if (s->open == 'm') {
    size_t at = s->lps_sent + (s->lps_sent && s->lps_sent < s->lps.len); /* past its comma */
    fe_buf_puts(out, ",\"logprobs\":[");
    fe_buf_append(out, s->lps.data + at, s->lps.len - at);
    fe_buf_puts(out, "]");
    s->lps_sent = s->lps.len;
  }
  ev_end(out);
  fe_buf_append(&s->text, d, n);
}

int fe_resp_stream_begin(struct fe_resp_stream *s, struct fe_buf *out) {
  static const char *const types[] = {"response.created", "response.in_progress"};
  for (int i = 0; i < 2; i++) {
    ev_begin(s, out, types[i]);
    fe_api_put_json(out, "response",
                    response_obj(&s->meta, s->echo, "in_progress", NULL, json_array(), NULL));
    ev_end(out);
  }
  return out->err;
}

/* A chunk's tool_calls delta entries: a call's beginning (its id and name) opens
 * its item, its arguments' fragments go as deltas. */
static void call_deltas(struct fe_resp_stream *s, struct fe_buf *out, const char *calls) {
  json_t *a = json_loads(calls, 0, NULL), *e;
  size_t i;
  json_array_foreach(a, i, e) {
    json_t *fn = json_object_get(e, "function"), *args = json_object_get(fn, "arguments");
    const char *id = json_string_value(json_object_get(e, "id"));
    const char *name = json_string_value(json_object_get(fn, "name"));
    if (id) open_item(s, out, 'f', id, name ? name : "");
    if (s->open == 'f' && json_string_length(args))
      delta_event(s, out, json_string_value(args), json_string_length(args));
  }
  json_decref(a);
}

int fe_resp_stream_chunk(struct fe_resp_stream *s, struct fe_buf *out,
                         const struct fe_api_choice *c) {
  /* a call's arguments go on before what follows it in the same chunk */
  int calls_first = s->open == 'f' && c->tool_calls;
  if (calls_first) call_deltas(s, out, c->tool_calls);
  if (c->reasoning_len) {
    open_item(s, out, 'r', NULL, NULL);
    delta_event(s, out, c->reasoning, c->reasoning_len);
  }
  if (c->logprobs) { /* with the text they make (held when it is still to come) */
    if (s->lps.len) fe_buf_puts(&s->lps, ",");
    fe_api_write_logprob_entries(&s->lps, c->logprobs, c->n_logprobs);
  }
  if (c->text_len) {
    open_item(s, out, 'm', NULL, NULL);
    delta_event(s, out, c->text, c->text_len);
  }
  if (c->tool_calls && !calls_first) call_deltas(s, out, c->tool_calls);
  return out->err;
}

int fe_resp_stream_end(struct fe_resp_stream *s, struct fe_buf *out, const char *finish_reason,
                       const struct fe_api_usage *u, char **whole) {
  int inc = incomplete(finish_reason);
  if (!json_array_size(s->items)) open_item(s, out, 'm', NULL, NULL);         /* an empty answer */
  if (s->open == 'm' && s->lps.len > s->lps_sent) delta_event(s, out, "", 0); /* held logprobs */
  close_item(s, out, inc ? "incomplete" : "completed");
  const char *type = inc ? "response.incomplete" : "response.completed";
  json_t *r = response_obj(&s->meta, s->echo, inc ? "incomplete" : "completed", finish_reason,
                           json_deep_copy(s->items), u);
  char *d = r ? json_dumps(r, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL; /* once, for both */
  json_decref(r);
  ev_begin(s, out, type);
  fe_buf_puts(out, ",\"response\":");
  if (d)
    fe_buf_puts(out, d);
  else
    out->err = CM_ERR_NOMEM;
  if (whole)
    *whole = d;
  else
    free(d);
  return ev_end(out);
}

int fe_resp_stream_error(struct fe_buf *out, int status, const char *message) {
  fe_buf_puts(out, "event: error\ndata: ");
  fe_api_error_body(out, status, message, NULL);
  return fe_buf_puts(out, "\n\n");
}
