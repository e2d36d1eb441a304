/* fe-sse.c — OpenAI streaming over server-sent events (see fe-sse.h). */
#include "frontend/fe-sse.h"

#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "frontend/fe-api-error.h"
#include "frontend/fe-rstore.h"

#define SSE_BUF_CAP ((size_t)8 << 20) /* bytes: one chunk's JSON at most */

int fe_sse_frame(struct fe_buf *out, const char *json, size_t len) {
  fe_buf_puts(out, "data: ");
  fe_buf_append(out, json, len);
  return fe_buf_puts(out, "\n\n");
}

/* Sends what is in s->buf (built after the "data: " prefix) as one event. */
static int send_event(struct fe_sse_stream *s) {
  if (fe_buf_puts(&s->buf, "\n\n") != 0) return CM_ERR_NOMEM;
  return fe_conn_stream_write(s->conn, s->buf.data, s->buf.len);
}

int fe_sse_begin(struct fe_sse_stream *s, struct fe_conn *c, const struct fe_api_request *r,
                 const char *id, int64_t created) {
  memset(s, 0, sizeof(*s));
  s->conn = c;
  s->kind = r->kind;
  s->n = r->n;
  s->include_usage = r->include_usage;
  s->continuous_usage = r->continuous_usage;
  s->audio = r->audio_api != 0;
  fe_buf_init(&s->whole, 0);
  snprintf(s->id, sizeof(s->id), "%s", id);
  s->meta.id = s->id;
  s->meta.created = created;
  s->meta.model = r->model;
  fe_buf_init(&s->buf, SSE_BUF_CAP);
  if (r->responses) { /* the Responses API's events (set first: fe_sse_end frees them) */
    s->responses = 1;
    s->store = r->store;
    s->conv = r->responses_conv;
    s->input = r->responses_input;
    fe_resp_stream_init(&s->resp, &s->meta, r->responses);
  }
  if (r->anthropic) { /* Anthropic's events: message_start goes with the first chunk */
    s->anthropic = 1;
    fe_msg_stream_init(&s->msg, &s->meta);
  }
  int rc = fe_conn_stream_begin(c, 200, "text/event-stream",
                                "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n");
  if (rc || !s->responses) return rc;
  fe_resp_stream_begin(&s->resp, &s->buf);
  return s->buf.err ? s->buf.err : fe_conn_stream_write(c, s->buf.data, s->buf.len);
}

int fe_sse_send(struct fe_sse_stream *s, const struct fe_api_choice *choice) {
  if (fe_conn_closed(s->conn)) return CM_ERR_CLOSED;
  if (choice->index < 0 || choice->index >= s->n) return CM_ERR_RANGE;
  if (s->audio && !choice->text_len) return 0; /* the role, the finish: no text, no event */
  fe_buf_reset(&s->buf);
  if (choice->finish_reason) s->finish = choice->finish_reason;
  if (choice->stop_str) s->stop_str = choice->stop_str;
  if (s->anthropic) {
    int rc = fe_msg_stream_chunk(&s->msg, &s->buf, choice, &s->usage);
    if (rc || !s->buf.len) return rc;
    return fe_conn_stream_write(s->conn, s->buf.data, s->buf.len);
  }
  if (s->responses) {
    int rc = fe_resp_stream_chunk(&s->resp, &s->buf, choice);
    if (rc || !s->buf.len) return rc;
    return fe_conn_stream_write(s->conn, s->buf.data, s->buf.len);
  }
  fe_buf_puts(&s->buf, "data: ");
  if (s->audio) {
    fe_buf_puts(&s->buf, "{\"type\":\"transcript.text.delta\",\"delta\":");
    fe_buf_json_str(&s->buf, choice->text, choice->text_len);
    fe_buf_puts(&s->buf, "}");
    if (fe_buf_append(&s->whole, choice->text, choice->text_len)) return CM_ERR_NOMEM;
  } else if (s->kind == FE_API_CHAT) {
    int first = !s->role_sent[choice->index];
    s->role_sent[choice->index] = 1;
    fe_api_write_chat_chunk(&s->buf, &s->meta, choice, first,
                            s->continuous_usage ? &s->usage : NULL);
  } else {
    fe_api_write_completion_chunk(&s->buf, &s->meta, choice,
                                  s->continuous_usage ? &s->usage : NULL);
  }
  return send_event(s);
}

int fe_sse_send_error(struct fe_sse_stream *s, int status, const char *message) {
  fe_buf_reset(&s->buf);
  if (s->anthropic) {
    if (fe_msg_stream_error(&s->buf, status, message)) return CM_ERR_NOMEM;
    return fe_conn_stream_write(s->conn, s->buf.data, s->buf.len);
  }
  if (s->responses) {
    if (fe_resp_stream_error(&s->buf, status, message)) return CM_ERR_NOMEM;
    return fe_conn_stream_write(s->conn, s->buf.data, s->buf.len);
  }
  fe_buf_puts(&s->buf, "data: ");
  fe_api_error_body(&s->buf, status, message, NULL);
  return send_event(s);
}

int fe_sse_end(struct fe_sse_stream *s, const struct fe_api_usage *u) {
  int rc = 0;
  if (!fe_conn_closed(s->conn) && s->anthropic) {
    if (u) { /* (without: it failed, and its error event went out) */
      fe_buf_reset(&s->buf);
      rc = fe_msg_stream_end(&s->msg, &s->buf, s->finish, s->stop_str, u);
      if (!rc) rc = fe_conn_stream_write(s->conn, s->buf.data, s->buf.len);
    }
  } else if (!fe_conn_closed(s->conn) && s->responses) {
    if (u) { /* (without: it failed, and its error event went out) */
      fe_buf_reset(&s->buf);
      char *whole = NULL;
      rc = fe_resp_stream_end(&s->resp, &s->buf, s->finish, u, s->store ? &whole : NULL);
      if (whole) fe_rstore_put(s->store, whole, strlen(whole), s->conv, s->input);
      free(whole);
      if (!rc) rc = fe_conn_stream_write(s->conn, s->buf.data, s->buf.len);
    }
  } else if (!fe_conn_closed(s->conn)) {
    if (s->audio && u) {
      fe_buf_reset(&s->buf);
      fe_buf_puts(&s->buf, "data: ");
      fe_api_write_audio_text(&s->buf, "transcript.text.done", s->whole.data ? s->whole.data : "",
                              s->whole.len, u);
      rc = send_event(s);
    } else if (s->include_usage && u) {
      fe_buf_reset(&s->buf);
      fe_buf_puts(&s->buf, "data: ");
      fe_api_write_usage_chunk(&s->buf, s->kind, &s->meta, u);
      rc = send_event(s);
    }
    if (!rc) rc = fe_conn_stream_write(s->conn, "data: [DONE]\n\n", 14);
  }
  int rc2 = fe_conn_stream_end(s->conn);
  fe_buf_free(&s->buf);
  fe_buf_free(&s->whole);
  if (s->responses) fe_resp_stream_free(&s->resp);
  return rc ? rc : rc2;
}
