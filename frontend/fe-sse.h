/* fe-sse.h — a server-sent-events stream of OpenAI chunks on one
 * connection: `data: {...}\n\n` per chunk, chat deltas with the assistant
 * role first, a final chunk per choice with its finish_reason, a usage chunk
 * when stream_options.include_usage was set, then `data: [DONE]\n\n`. With
 * stream_options.continuous_usage_stats every chunk carries "usage" too (vLLM's
 * extension): the prompt's tokens and its choice's tokens so far. The audio
 * endpoints' streams are OpenAI's events instead: {"type": "transcript.text.delta",
 * "delta"} for each piece of text, {"type": "transcript.text.done", "text", "usage"}
 * (fe_sse_end's usage), then [DONE]. The Responses API's stream is its own
 * events (fe-responses.h), and so is Anthropic's Messages API's (fe-messages.h).
 *
 * The serving path creates one per streamed request and feeds it deltas as
 * tokens are detokenized. Each call returns CM_ERR_CLOSED once the client is
 * gone; the serving path then aborts the request (the connection's abort
 * callback fires as well) and still calls fe_sse_end() to release it. */
#ifndef LMSERVE_FE_SSE_H
#define LMSERVE_FE_SSE_H
#include <stddef.h>
#include <stdint.h>

#include "frontend/fe-api-resp.h"
#include "frontend/fe-api.h"
#include "frontend/fe-http-buf.h"
#include "frontend/fe-messages.h"
#include "frontend/fe-responses.h"
#include "frontend/fe-server.h"

struct fe_sse_stream {
  struct fe_conn *conn;
  enum fe_api_kind kind; /* FE_API_COMPLETION or FE_API_CHAT */
  struct fe_api_resp_meta meta;
  char id[160];
  int n; /* choices */
  int include_usage;
  int continuous_usage;            /* stream_options.continuous_usage_stats: usage in every chunk */
  struct fe_api_usage usage;       /* with continuous_usage: what the next chunk reports (the
                                      caller sets it: the prompt, the choice's tokens so far) */
  uint8_t role_sent[FE_API_MAX_N]; /* chat: the role delta went out for choice i */
  int audio;                       /* the audio endpoints (fe_api_request.audio_api): OpenAI's
                                      transcript.text.delta events, then transcript.text.done */
  struct fe_buf whole;             /* audio: the text sent so far, for the done event */
  int responses;                   /* POST /v1/responses: its events (fe-responses.h), no
                                      [DONE] */
  struct fe_resp_stream resp;
  struct fe_rstore *store;         /* keeps the whole response at the end (NULL: not) */
  const char *conv, *input;        /* what it keeps with it (fe_rstore_put) */
  int anthropic;                   /* POST /v1/messages: its events (fe-messages.h), no [DONE] */
  struct fe_msg_stream msg;
  const char *finish;              /* the finish reason sent (static), or NULL */
  const char *stop_str;            /* the stop string that ended it (the request's), or NULL */
  struct fe_buf buf;               /* reused for every chunk */
};

/* Starts the stream (200, text/event-stream) for request `r`, whose answer's id is
 * `id`. */
int fe_sse_begin(struct fe_sse_stream *s, struct fe_conn *c, const struct fe_api_request *r,
                 const char *id, int64_t created);
/* Sends one choice's new text (and its logprobs); finish_reason set on the
 * choice's last chunk. */
int fe_sse_send(struct fe_sse_stream *s, const struct fe_api_choice *choice);
/* Sends an error event (OpenAI envelope) for a failure mid-stream. */
int fe_sse_send_error(struct fe_sse_stream *s, int status, const char *message);
/* Sends the usage chunk (when asked for; u may be NULL otherwise) and
 * [DONE], ends the response and frees the stream's buffer. */
int fe_sse_end(struct fe_sse_stream *s, const struct fe_api_usage *u);

/* Frames a JSON payload as one SSE event ("data: " + json + "\n\n"). */
int fe_sse_frame(struct fe_buf *out, const char *json, size_t len);

#endif
