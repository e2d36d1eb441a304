/* fe-engine.h — the frontend's serving path: from a validated OpenAI
 * request (fe-api.h) to token ids from the scheduler and back as OpenAI
 * responses (JSON or SSE).
 *
 * The engine owns one ZeroMQ DEALER per scheduler (model replica: one with
 * `scheduler`, several for data parallelism), connected to its frontend
 * endpoint and polled on the libuv loop. It PINGs each every ping_ms; a
 * replica is ready while a PONG came back within ready_ms that reported
 * every worker rank ready, and the engine is ready while one replica is.
 * Each request goes to one ready replica: the one that took the longest
 * remembered prefix of its prompt (its KV blocks are cached there) unless
 * that one is much busier than the least busy, else the least busy.
 *
 * When the engine loses the requests in flight — the scheduler's connection
 * closes (a socket monitor sees it at once), the scheduler restarts, a worker
 * fails (the scheduler's ERR), or dead_ms pass without a PONG — a request
 * that has produced nothing yet is parked and sent again as soon as a
 * replica is ready (a supervisor restarts it meanwhile), within retry_ms and
 * at most a few times; one that has begun fails with 503, or an error event
 * on its stream. /health answers 503 from the moment of the loss.
 *
 * Per request it tokenizes (completions: text with BOS, or the given ids;
 * chat: the model's chat template with add_generation_prompt, encoded
 * without a second BOS), checks the length against max_model_len, sends one
 * ADD per choice (n > 1 and several prompts: one id per choice, seed + i),
 * and turns each OUT into text (incremental detokenization, stop strings,
 * logprobs). /tokenize and /detokenize are answered without the scheduler.
 * A client that goes away gets its choices ABORTed at the scheduler.
 *
 *   struct fe_engine *e;
 *   fe_engine_create(loop, router, &cfg, &e);
 *   struct fe_engine_hooks h;
 *   fe_engine_hooks_get(e, &h);
 *   fe_router_set_hooks(router, &h);
 *   uv_run(loop, ...);             // engine handles are unref'd: they never
 *                                  // keep the loop alive on their own
 *   fe_engine_destroy(e);          // after the server is gone; runs the
 *                                  // loop once to close its handles
 *
 * Everything runs on the loop's thread. */
#ifndef LMSERVE_FE_ENGINE_H
#define LMSERVE_FE_ENGINE_H
#include <stdint.h>
#include <uv.h>

#include "frontend/fe-mm.h"
#include "frontend/fe-route.h"

struct fe_engine;

struct fe_engine_config {
  const char *model_dir;     /* tokenizer.json, tokenizer_config.json, generation_config.json; or a
                                GGUF file (its config; the tokenizer from tokenizer_dir) */
  const char *tokenizer_dir; /* tokenizer.json, tokenizer_config.json, generation_config.json
                                from here instead (NULL: model_dir); needed with GGUF */
  const char *chat_template; /* --chat-template: a file, or the template itself
                                (tk_chat_template_arg), in place of the model's; NULL: none */
  const char *scheduler; /* the scheduler's frontend endpoint (ipc://, tcp://) */
  /* data parallelism: several schedulers (model replicas), each request routed to
   * one by load and prompt-prefix affinity; when n_schedulers > 0 these replace
   * `scheduler` */
  const char *const *schedulers;
  int n_schedulers;
  const char *model_name; /* served model name (response "model") */
  int64_t max_model_len;  /* tokens; used until a PONG reports the engine's (0: none) */
  uint32_t ping_ms;       /* PING period; 0: 500 */
  uint32_t ready_ms;      /* a PONG this recent makes the engine ready; 0: 2000 */
  uint32_t dead_ms;       /* no PONG this long loses requests in flight; 0: 10000 */
  uint32_t retry_ms;      /* a parked request fails after this long; 0: 30000 */
  struct fe_mm_opts mm;   /* image input (a checkpoint with a vision tower) */
  int prompt_tokens_details; /* usage.prompt_tokens_details.cached_tokens in answers (vLLM's
                                --enable-prompt-tokens-details) */
  int trust_request_chat_template; /* a chat request's own chat_template is rendered (vLLM's
                                      --trust-request-chat-template); else a 400 */
  /* vLLM's --enable-log-requests and --enable-log-outputs: an info line for each request
   * received (its prompts' text and ids, its parameters) and for each choice finished
   * (its text); --max-log-len N (> 0) cuts each text to N bytes and each id list to N ids */
  int log_requests, log_outputs;
  int64_t max_log_len;
  /* a line of each replica's throughput and load every log_stats_s seconds (vLLM's
   * stats log; 0: none) */
  double log_stats_s;
};

/* Loads the tokenizer and chat template from cfg->model_dir, connects to
 * the scheduler and starts pinging. `router` gives the metrics registry
 * (may be NULL: no metrics). Returns 0 or a negative cm_err (logged). */
int fe_engine_create(uv_loop_t *loop, struct fe_router *router, const struct fe_engine_config *cfg,
                     struct fe_engine **out);
/* Closes the socket and the handles (requests still in flight are
 * aborted), runs the loop until they are closed, frees everything. */
void fe_engine_destroy(struct fe_engine *e);

/* The router hooks (ready, submit) bound to this engine. */
void fe_engine_hooks_get(struct fe_engine *e, struct fe_engine_hooks *out);

/* 1 when the last PONG is recent and reported all workers ready. */
int fe_engine_ready(const struct fe_engine *e);
/* The context length in force (from PONG, else the configured one). */
int64_t fe_engine_max_model_len(const struct fe_engine *e);
/* Requests in flight (HTTP requests, not choices). */
int fe_engine_in_flight(const struct fe_engine *e);

#endif
