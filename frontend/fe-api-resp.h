/* fe-api-resp.h — OpenAI response bodies: non-streamed completion and chat
 * completion JSON, and the JSON of each streamed (SSE) chunk. Written by
 * hand into a reused fe_buf (no allocation at steady state); strings are
 * escaped so the output is always valid JSON, even for token pieces that
 * split a UTF-8 sequence. */
#ifndef LMSERVE_FE_API_RESP_H
#define LMSERVE_FE_API_RESP_H
#include <stddef.h>
#include <stdint.h>

#include "frontend/fe-api.h"
#include "frontend/fe-http-buf.h"

struct fe_api_top_logprob {
  const char *token; /* the token's text (bytes) */
  size_t token_len;  /* bytes */
  float logprob;
};

struct fe_api_token_logprob {
  const char *token;
  size_t token_len; /* bytes */
  float logprob;
  const struct fe_api_top_logprob *top; /* (n_top) most likely tokens at this step */
  size_t n_top;
};

struct fe_api_choice {
  int index;
  const char *text;                            /* generated text (or this chunk's delta) */
  size_t text_len;                             /* bytes */
  const char *finish_reason;                   /* "stop", "length", "abort"; NULL: null */
  const struct fe_api_token_logprob *logprobs; /* (n_logprobs); NULL: "logprobs": null */
  size_t n_logprobs;
  size_t text_offset;     /* bytes of text before this chunk (completions) */
  const char *tool_calls; /* chat: the tool_calls array's JSON (then "content" is null
                           * unless text_len > 0), or NULL */
  int function_call;      /* chat: tool_calls' first call goes as OpenAI's deprecated
                           * "function_call" (its function object), finish reason
                           * "tool_calls" as "function_call" */
  const char *reasoning;  /* chat: the thought (Gemma 4's thinking channel), or NULL */
  size_t reasoning_len;   /* bytes; 0: no "reasoning" field */
  /* return_token_ids (vLLM's): with_ids writes "token_ids" (the answer's, or this
   * chunk's), and prompt_ids (when set) "prompt_token_ids": the choice's for
   * completions, the response's (choice 0's) for chat */
  int with_ids;
  const int32_t *ids;
  size_t n_ids;
  const int32_t *prompt_ids;
  size_t n_prompt_ids;
  /* vLLM's prompt_logprobs: the JSON array (null, then one object per prompt token
   * after the first), written as "prompt_logprobs" in the choice for completions, in
   * the response (choice 0's) for chat; NULL: none */
  const char *prompt_logprobs;
  size_t prompt_logprobs_len;
  /* the stop string (one of the request's stop) that ended the choice, or NULL;
   * Anthropic's stop_sequence */
  const char *stop_str;
};

struct fe_api_usage {
  int64_t prompt_tokens;     /* tokens */
  int64_t completion_tokens; /* tokens, all choices together */
  int details;               /* write prompt_tokens_details (--enable-prompt-tokens-details) */
  int64_t cached_tokens;     /* of the prompt tokens, those the prefix cache served */
  int64_t reasoning_tokens;  /* of the completion tokens, those of the thinking channel (its
                                markers too); the Responses API reports them */
};

struct fe_api_resp_meta {
  const char *id;  /* "cmpl-..." or "chatcmpl-..." */
  int64_t created; /* Unix seconds */
  const char *model;
};

/* Writes a random request id with the given prefix ("cmpl-", "chatcmpl-")
 * into out (at least 48 bytes). */
void fe_api_make_id(char *out, size_t size, const char *prefix);

/* A whole non-streamed response body: /v1/completions or /v1/chat/completions. */
int fe_api_write_completion(struct fe_buf *b, const struct fe_api_resp_meta *m,
                            const struct fe_api_choice *choices, size_t n,
                            const struct fe_api_usage *u);
int fe_api_write_chat(struct fe_buf *b, const struct fe_api_resp_meta *m,
                      const struct fe_api_choice *choices, size_t n, const struct fe_api_usage *u);

/* The JSON of one streamed chunk for one choice (no "data: " framing).
 * Chat: with_role adds "role":"assistant" to the delta (the first chunk of
 * each choice); text_len 0 and no finish reason gives an empty delta. u (NULL:
 * none) adds "usage" to the chunk (stream_options.continuous_usage_stats). */
int fe_api_write_completion_chunk(struct fe_buf *b, const struct fe_api_resp_meta *m,
                                  const struct fe_api_choice *c, const struct fe_api_usage *u);
int fe_api_write_chat_chunk(struct fe_buf *b, const struct fe_api_resp_meta *m,
                            const struct fe_api_choice *c, int with_role,
                            const struct fe_api_usage *u);
/* Chat's logprob entries, comma-separated, each {"token", "logprob", "bytes",
 * "top_logprobs": [{"token", "logprob", "bytes"}]} (the Responses API's form too). */
void fe_api_write_logprob_entries(struct fe_buf *b, const struct fe_api_token_logprob *lps,
                                  size_t n);
/* ,"key":<v's JSON> appended to b (v taken; NULL, or JSON that cannot be written:
 * b's error set), for the event writers (fe-responses.c, fe-messages.c). */
struct json_t;
void fe_api_put_json(struct fe_buf *b, const char *key, struct json_t *v);
/* The final usage chunk: "choices": [] and "usage". */
int fe_api_write_usage_chunk(struct fe_buf *b, enum fe_api_kind kind,
                             const struct fe_api_resp_meta *m, const struct fe_api_usage *u);

/* POST /tokenize's answer, as vLLM gives it:
 * {"count":N,"max_model_len":M,"tokens":[...]}. */
/* The audio endpoints' answer (type NULL): {"text": ..., "usage": {"type": "tokens",
 * "input_tokens", "output_tokens", "total_tokens"}}; a stream's last event: the same
 * with "type" first ("transcript.text.done"). */
int fe_api_write_audio_text(struct fe_buf *b, const char *type, const char *text, size_t len,
                            const struct fe_api_usage *u);
/* POST /tokenize's answer, {"count":N,"max_model_len":M,"tokens":[...]}, and with strs
 * (NULL: none) "token_strs":[...], strs[i] (lens[i] bytes) token i's string in the
 * vocabulary ("\u2581Hello", "<0x0A>": vLLM's return_token_strs). */
int fe_api_write_tokenize(struct fe_buf *b, const int32_t *ids, size_t n, int64_t max_model_len,
                          const char *const *strs, const size_t *lens);
/* POST /detokenize's answer: {"prompt":"..."}. */
int fe_api_write_detokenize(struct fe_buf *b, const char *text, size_t len);

#endif
