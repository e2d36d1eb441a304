/* fe-messages.h — Anthropic's Messages API's answer (POST /v1/messages): the
 * message object, and a stream's events.
 *
 * An answer is a message whose content is a list of blocks: the thought as a
 * "thinking" block (Gemma 4's thinking channel; its signature empty: nothing here
 * checks one), the text as a "text" block, and each tool call as a "tool_use" block
 * (a fresh "toolu_" id, its input the arguments' JSON object). Its stop_reason is
 * end_turn, max_tokens (the token limit cut it), stop_sequence (one of the
 * request's stop_sequences matched, and stop_sequence says which) or tool_use.
 * Usage counts as Anthropic's does: input_tokens are the prompt's tokens the
 * prefix cache did not serve, cache_read_input_tokens those it did, and
 * cache_creation_input_tokens 0 (caching costs nothing extra here).
 *
 * A stream is Anthropic's event sequence, each event as `event: TYPE` and `data:
 * {"type": TYPE, ...}`: message_start (the message with no content, its usage the
 * input's) and a ping; per block content_block_start, its deltas (text_delta,
 * thinking_delta, input_json_delta; a thinking block's signature_delta last) and
 * content_block_stop; then message_delta (stop_reason, stop_sequence, the usage)
 * and message_stop. The chat answer's chunks (fe_api_choice deltas) drive it; a
 * block closes when one of another kind begins. */
#ifndef LMSERVE_FE_MESSAGES_H
#define LMSERVE_FE_MESSAGES_H
#include <stddef.h>
#include <stdint.h>

#include "frontend/fe-api-resp.h"
#include "frontend/fe-http-buf.h"

/* Anthropic's stop_reason for a chat finish reason ("stop", "length", "tool_calls"),
 * the stop string that matched (NULL: none) and whether the answer calls tools. */
const char *fe_msg_stop_reason(const char *finish_reason, const char *stop_str, int calls);

/* The message object of a finished answer c (whole, not a delta). */
int fe_msg_write(struct fe_buf *b, const struct fe_api_resp_meta *m, const struct fe_api_choice *c,
                 const struct fe_api_usage *u);

struct fe_msg_stream {
  struct fe_api_resp_meta meta; /* its strings outlive the stream */
  int started;                  /* message_start went out */
  int open;                     /* the open block: 0 none, 'k' thinking, 't' text, 'u' tool_use */
  int blocks;                   /* blocks begun (the open one's index is blocks - 1) */
  int calls;                    /* tool_use blocks begun */
};

void fe_msg_stream_init(struct fe_msg_stream *s, const struct fe_api_resp_meta *m);
/* Writes the events of one chunk (c's text, reasoning and tool_calls deltas) into
 * out, message_start first when it has not gone out (its usage u's prompt). */
int fe_msg_stream_chunk(struct fe_msg_stream *s, struct fe_buf *out, const struct fe_api_choice *c,
                        const struct fe_api_usage *u);
/* Closes the open block, then message_delta and message_stop. */
int fe_msg_stream_end(struct fe_msg_stream *s, struct fe_buf *out, const char *finish_reason,
                      const char *stop_str, const struct fe_api_usage *u);
/* A failure after the stream began: an "error" event carrying Anthropic's envelope. */
int fe_msg_stream_error(struct fe_buf *out, int status, const char *message);

#endif
