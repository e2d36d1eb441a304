/* fe-messages.c — Anthropic's message object and stream events (see
 * fe-messages.h). The whole message is built with Jansson; the events, one
 * chunk's at a time, are written straight into the buffer. */
#include "frontend/fe-messages.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "frontend/fe-api-error.h"

const char *fe_msg_stop_reason(const char *finish_reason, const char *stop_str, int calls) {
  if (finish_reason && !strcmp(finish_reason, "length")) return "max_tokens";
  if (calls || (finish_reason && !strcmp(finish_reason, "tool_calls"))) return "tool_use";
  if (stop_str) return "stop_sequence";
  return "end_turn";
}

static json_t *usage_obj(const struct fe_api_usage *u) {
  int64_t cached = u->cached_tokens < u->prompt_tokens ? u->cached_tokens : u->prompt_tokens;
  return json_pack("{s:I, s:I, s:I, s:I}", "input_tokens", (json_int_t)(u->prompt_tokens - cached),
                   "cache_creation_input_tokens", (json_int_t)0, "cache_read_input_tokens",
                   (json_int_t)cached, "output_tokens", (json_int_t)u->completion_tokens);
}

/* A call's arguments (JSON text) as tool_use's input: the object, or {} when the
 * text is not one (a call the token limit cut). */
static json_t *input_of(const char *args, size_t len) {
  json_t *v = args ? json_loadb(args, len, 0, NULL) : NULL;
  if (json_is_object(v)) return v;
  json_decref(v);
  return json_object();
}

int fe_msg_write(struct fe_buf *b, const struct fe_api_resp_meta *m, const struct fe_api_choice *c,
                 const struct fe_api_usage *u) {
  json_t *content = json_array();
  if (c->reasoning_len)
    json_array_append_new(content, json_pack("{s:s, s:s%, s:s}", "type", "thinking", "thinking",
                                             c->reasoning, c->reasoning_len, "signature", ""));
  json_t *calls = c->tool_calls ? json_loads(c->tool_calls, 0, NULL) : NULL;
  if (c->text_len || (!json_array_size(calls) && !c->reasoning_len))
    json_array_append_new(content, json_pack("{s:s, s:s%}", "type", "text", "text",
                                             c->text ? c->text : "", c->text_len));
  size_t i;
  json_t *x;
  json_array_foreach(calls, i, x) {
    json_t *fn = json_object_get(x, "function"), *args = json_object_get(fn, "arguments");
    const char *name = json_string_value(json_object_get(fn, "name"));
    char id[48];
    fe_api_make_id(id, sizeof(id), "toolu_");
    json_array_append_new(content,
                          json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", id, "name",
                                    name ? name : "", "input",
                                    input_of(json_string_value(args), json_string_length(args))));
  }
  const char *reason =
      fe_msg_stop_reason(c->finish_reason, c->stop_str, json_array_size(calls) > 0);
  json_decref(calls);
  json_t *r = json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:o}", "id", m->id, "type", "message",
                        "role", "assistant", "model", m->model, "content", content, "stop_reason",
                        reason, "stop_sequence",
                        !strcmp(reason, "stop_sequence") ? json_string(c->stop_str) : json_null(),
                        "usage", usage_obj(u));
  char *s = r ? json_dumps(r, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(r);
  int rc = s ? fe_buf_puts(b, s) : CM_ERR_NOMEM;
  free(s);
  return rc;
}

/* ---- the stream ------------------------------------------------------------- */

void fe_msg_stream_init(struct fe_msg_stream *s, const struct fe_api_resp_meta *m) {
  memset(s, 0, sizeof(*s));
  s->meta = *m;
}

/* `event: type` and data's opening up to its type; the caller adds its fields
 * and closes it with ev_end. */
static void ev_begin(struct fe_buf *out, const char *type) {
  fe_buf_puts(out, "event: ");
  fe_buf_puts(out, type);
  fe_buf_puts(out, "\ndata: {\"type\":\"");
  fe_buf_puts(out, type);
  fe_buf_puts(out, "\"");
}

static void ev_end(struct fe_buf *out) {
  fe_buf_puts(out, "}\n\n");
}

static void start(struct fe_msg_stream *s, struct fe_buf *out, const struct fe_api_usage *u) {
  if (s->started) return;
  s->started = 1;
  struct fe_api_usage in = *u;
  in.completion_tokens = 0;
  ev_begin(out, "message_start");
  fe_api_put_json(out, "message",
                  json_pack("{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:o}", "id", s->meta.id, "type",
                            "message", "role", "assistant", "model", s->meta.model, "content",
                            "stop_reason", "stop_sequence", "usage", usage_obj(&in)));
  ev_end(out);
  ev_begin(out, "ping");
  ev_end(out);
}

static void at_index(struct fe_msg_stream *s, struct fe_buf *out) {
  fe_buf_puts(out, ",\"index\":");
  fe_buf_i64(out, s->blocks - 1);
}

/* Closes the open block: a thinking block's (empty) signature, then its stop. */
static void close_block(struct fe_msg_stream *s, struct fe_buf *out) {
  if (!s->open) return;
  if (s->open == 'k') {
    ev_begin(out, "content_block_delta");
    at_index(s, out);
    fe_buf_puts(out, ",\"delta\":{\"type\":\"signature_delta\",\"signature\":\"\"}");
    ev_end(out);
  }
  ev_begin(out, "content_block_stop");
  at_index(s, out);
  ev_end(out);
  s->open = 0;
}

/* Opens a block of kind k (closing another; a tool_use block always opens). */
static void open_block(struct fe_msg_stream *s, struct fe_buf *out, int k, const char *name) {
  if (s->open == k && k != 'u') return;
  close_block(s, out);
  s->open = k;
  s->blocks++;
  ev_begin(out, "content_block_start");
  at_index(s, out);
  if (k == 'k') {
    fe_buf_puts(out,
                ",\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}");
  } else if (k == 't') {
    fe_buf_puts(out, ",\"content_block\":{\"type\":\"text\",\"text\":\"\"}");
  } else {
    char id[48];
    fe_api_make_id(id, sizeof(id), "toolu_");
    s->calls++;
    fe_buf_puts(out, ",\"content_block\":{\"type\":\"tool_use\",\"id\":");
    fe_buf_json_str(out, id, strlen(id));
    fe_buf_puts(out, ",\"name\":");
    fe_buf_json_str(out, name, strlen(name));
    fe_buf_puts(out, ",\"input\":{}}");
  }
  ev_end(out);
}

/* A delta of the open block. */
static void delta(struct fe_msg_stream *s, struct fe_buf *out, const char *d, size_t n) {
  static const char *const kinds[][2] = {
      {"thinking_delta", "thinking"}, {"text_delta", "text"}, {"input_json_delta", "partial_json"}};
  int k = s->open == 'k' ? 0 : s->open == 't' ? 1 : 2;
  ev_begin(out, "content_block_delta");
  at_index(s, out);
  fe_buf_printf(out, ",\"delta\":{\"type\":\"%s\",\"%s\":", kinds[k][0], kinds[k][1]);
  fe_buf_json_str(out, d, n);
  fe_buf_puts(out, "}");
  ev_end(out);
}

/* A chunk's tool_calls delta entries: a call's beginning (its id and name) opens
 * its block, its arguments' fragments go as input_json_delta. */
static void call_deltas(struct fe_msg_stream *s, struct fe_buf *out, const char *calls) {
  json_t *a = json_loads(calls, 0, NULL), *e;
  size_t i;
  json_array_foreach(a, i, e) {
    json_t *fn = json_object_get(e, "function"), *args = json_object_get(fn, "arguments");
    const char *name = json_string_value(json_object_get(fn, "name"));
    if (json_is_string(json_object_get(e, "id"))) open_block(s, out, 'u', name ? name : "");
    if (s->open == 'u' && json_string_length(args))
      delta(s, out, json_string_value(args), json_string_length(args));
  }
  json_decref(a);
}

int fe_msg_stream_chunk(struct fe_msg_stream *s, struct fe_buf *out, const struct fe_api_choice *c,
                        const struct fe_api_usage *u) {
  start(s, out, u);
  /* a call's arguments go on before what follows it in the same chunk */
  int calls_first = s->open == 'u' && c->tool_calls;
  if (calls_first) call_deltas(s, out, c->tool_calls);
  if (c->reasoning_len) {
    open_block(s, out, 'k', NULL);
    delta(s, out, c->reasoning, c->reasoning_len);
  }
  if (c->text_len) {
    open_block(s, out, 't', NULL);
    delta(s, out, c->text, c->text_len);
  }
  if (c->tool_calls && !calls_first) call_deltas(s, out, c->tool_calls);
  return out->err;
}

int fe_msg_stream_end(struct fe_msg_stream *s, struct fe_buf *out, const char *finish_reason,
                      const char *stop_str, const struct fe_api_usage *u) {
  start(s, out, u);
  if (!s->blocks) open_block(s, out, 't', NULL); /* an empty answer: one empty text block */
  close_block(s, out);
  const char *reason = fe_msg_stop_reason(finish_reason, stop_str, s->calls > 0);
  ev_begin(out, "message_delta");
  fe_buf_puts(out, ",\"delta\":{\"stop_reason\":");
  fe_buf_json_str(out, reason, strlen(reason));
  fe_buf_puts(out, ",\"stop_sequence\":");
  if (!strcmp(reason, "stop_sequence"))
    fe_buf_json_str(out, stop_str, strlen(stop_str));
  else
    fe_buf_puts(out, "null");
  fe_buf_puts(out, "}");
  fe_api_put_json(out, "usage", usage_obj(u));
  ev_end(out);
  ev_begin(out, "message_stop");
  ev_end(out);
  return out->err;
}

int fe_msg_stream_error(struct fe_buf *out, int status, const char *message) {
  fe_buf_puts(out, "event: error\ndata: ");
  fe_api_anthropic_error_body(out, status, message);
  return fe_buf_puts(out, "\n\n");
}
