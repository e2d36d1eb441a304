/* fe-responses.h — the Responses API's answer (POST /v1/responses): the
 * response object, and a stream's events.
 *
 * An answer is a list of output items: the thought as a "reasoning" item
 * (Gemma 4's thinking channel; its text as a reasoning_text part), the text as a
 * "message" item (one output_text part, with its logprobs when asked), and each
 * tool call as a "function_call" item. Its status is "completed", or
 * "incomplete" (incomplete_details.reason "max_output_tokens") when max tokens
 * cut it. Usage is input_tokens, output_tokens and their details (cached and
 * reasoning tokens).
 *
 * A stream is OpenAI's event sequence, each event as `event: TYPE` and `data:
 * {"type": TYPE, "sequence_number": N, ...}`: response.created and
 * response.in_progress; per item response.output_item.added, its part's
 * content_part.added, the deltas (output_text.delta, reasoning_text.delta,
 * function_call_arguments.delta), their .done, content_part.done and
 * output_item.done; and last response.completed (or response.incomplete) with
 * the whole response. The chat answer's chunks (fe_api_choice deltas) drive it;
 * an item closes when one of another kind begins. */
#ifndef LMSERVE_FE_RESPONSES_H
#define LMSERVE_FE_RESPONSES_H
#include <stddef.h>
#include <stdint.h>

#include "frontend/fe-api-resp.h"
#include "frontend/fe-http-buf.h"

struct json_t;

/* The response object of a finished answer c (whole, not a delta); echo is the
 * request's fe_api_request.responses. */
int fe_resp_write(struct fe_buf *b, const struct fe_api_resp_meta *m, const char *echo,
                  const struct fe_api_choice *c, const struct fe_api_usage *u);

struct fe_resp_stream {
  struct fe_api_resp_meta meta; /* its strings outlive the stream */
  const char *echo;
  int64_t seq;          /* the next event's sequence_number */
  struct json_t *items; /* the output items so far; the last is open when `open` */
  int open;             /* the open item: 0 none, 'r' reasoning, 'm' message, 'f' call */
  char item_id[48];     /* its id */
  struct fe_buf text;   /* its text (a call: its arguments) so far */
  struct fe_buf lps;    /* a message's logprob entries so far, comma-separated */
  size_t lps_sent;      /* bytes of lps that went out in deltas */
};

void fe_resp_stream_init(struct fe_resp_stream *s, const struct fe_api_resp_meta *m,
                         const char *echo);
void fe_resp_stream_free(struct fe_resp_stream *s);
/* Writes response.created and response.in_progress into out. */
int fe_resp_stream_begin(struct fe_resp_stream *s, struct fe_buf *out);
/* Writes the events of one chunk (c's text, reasoning and tool_calls deltas,
 * its logprobs) into out; nothing when it holds none. */
int fe_resp_stream_chunk(struct fe_resp_stream *s, struct fe_buf *out,
                         const struct fe_api_choice *c);
/* Closes the open item and writes response.completed (response.incomplete when
 * finish_reason is "length") with usage u; *whole (when whole is not NULL; malloc'd,
 * NULL when out of memory) is that response's JSON. */
int fe_resp_stream_end(struct fe_resp_stream *s, struct fe_buf *out, const char *finish_reason,
                       const struct fe_api_usage *u, char **whole);
/* A failure after the stream began: an "error" event carrying OpenAI's envelope. */
int fe_resp_stream_error(struct fe_buf *out, int status, const char *message);

#endif
