/* sch-engine.h — the scheduler's engine: request queues, continuous batching under a
 * token budget, chunked prefill, the KV block manager (per-group block tables, prefix
 * caching, sliding-window freeing), preemption by recompute, aborts and the slot
 * bookkeeping of speculative decoding. Pure logic: no sockets, threads or tensors, and
 * not thread-safe (one thread drives an engine); the `lmserve scheduler` process
 * drives it:
 *
 *   sch_engine_create(&cfg, &e);              // cfg from flags + the workers' READY
 *   sch_engine_add(e, &params, err, len);     // ADD from a frontend (or an ERR back)
 *   loop:
 *     sch_engine_plan_step(e, &plan);         // -> STEP to the workers
 *     if (plan.num_seqs > 0) {
 *       ... RESULT from rank 0 ...
 *       sch_engine_apply(e, results, n, &outs);   // -> OUT to the frontends
 *     }
 *   sch_engine_abort(e, id);                  // ABORT, any state, any time
 *
 * Plan and apply alternate: a plan with sequences puts a step in flight, and the next
 * plan is refused (CM_ERR_STATE) until its results are applied (or the step is declared
 * failed). Blocks released in between (aborts) are handed out only by a later plan,
 * which the workers run after the step in flight. A plan's pointers stay valid until
 * the next plan_step, or for one sequence until its request is aborted or finishes;
 * outputs until the next apply.
 *
 * Async scheduling (cfg.async_scheduling, vLLM's): one more step may be planned while
 * one is in flight, so the workers find step N+1 waiting when they finish step N and
 * the scheduler's planning and the round trip overlap their work. The plan assumes
 * that every sequence sampling in the step in flight gets exactly one token: its decode
 * in the new step runs that token (SCH_TOKEN_PREV: the workers put in the token they
 * sampled), unless the request will have reached max_tokens. With speculative decoding
 * the step in flight may also accept drafts, which only the workers know of: the new
 * step's positions are planned as if it accepted none, its blocks reach as far as
 * accepting all would take them, the workers move the positions on by what was
 * accepted and verify the drafts that step proposed, and apply returns rejected slots
 * once no later step holds them. Results are applied in
 * step order. A request that turns out to have stopped (an eos or stop id in step N's
 * result), is aborted or is preempted while a later step holds it leaves that step:
 * the workers still run it, its blocks are released at once (the workers run steps in
 * order, so a block handed out again is written only after), and its result for it is
 * ignored. Outputs are the tokens synchronous steps give.
 *
 * Policy: the waiting queue is ordered by (priority, arrival): lower priority values
 * first, FCFS among equals, and it never skips its head (a request that does not fit yet
 * blocks those behind it rather than starving). Each step schedules the running
 * requests' decode tokens first, then the running prefills, then admits from the
 * waiting queue (only when no preemption happened this step), chunking every prefill to
 * the tokens left in the budget. When the pool runs dry, the running request with the
 * largest (priority, admission order) that is not yet scheduled this step — under FCFS,
 * the most recently admitted — is preempted: its blocks are released (cached ones stay
 * in the LRU list), and it returns to the waiting queue in its arrival place with its
 * generated tokens appended to the prompt to recompute. Priority orders admission and
 * picks victims; it does not preempt a running request to admit a waiting one.
 *
 * Speculative decoding: a decode gets up to num_spec_tokens draft slots (fewer near
 * max_tokens or the budget's end); the workers draft into them and verify; the result
 * carries the accepted drafts plus one token, and the slots of rejected drafts are
 * released (rolled back) when the result is applied. The drafts a step verifies are
 * those the workers proposed after the step before: a decode's, or a final prefill
 * chunk's (num_propose). */
#ifndef LMSERVE_SCH_ENGINE_H
#define LMSERVE_SCH_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "scheduler/sch-kv.h"

#define SCH_MAX_EOS_IDS        16
#define SCH_MAX_STOP_IDS       64
#define SCH_MAX_SPEC_TOKENS    64 /* num_spec_tokens limit */
#define SCH_MAX_SAMPLING_BYTES 65536
#define SCH_MAX_IMAGES         64 /* images per request */

struct sch_engine_config {
  int32_t num_blocks;                             /* pages in the KV pool (the workers' READY) */
  int32_t num_groups;                             /* KV-cache groups, 1..SCH_MAX_GROUPS */
  struct sch_kv_group_cfg groups[SCH_MAX_GROUPS]; /* tokens per block and window each */
  int32_t max_num_seqs;                           /* running requests at most */
  int32_t max_num_batched_tokens;   /* tokens per step (prefill + decode + draft slots) */
  int32_t max_model_len;            /* prompt + generated, tokens */
  int32_t max_waiting;              /* queued requests at most; beyond: CM_ERR_FULL */
  int32_t num_spec_tokens;          /* draft slots K per decode (0 = no speculation) */
  int32_t spec_disable_batch;       /* while this many requests or more run, decodes get
                                       no draft slots and propose none (vLLM's
                                       disable_by_batch_size; 0 = never, else >= 2) */
  int32_t long_prefill_threshold;   /* a prefill chunk takes at most this many tokens of a
                                      step, so that short prompts beside a long one start
                                      soon (0 = no limit) */
  int32_t vocab_size;               /* token ids must be < this; 0 = unchecked */
  int32_t eos_ids[SCH_MAX_EOS_IDS]; /* the model's end-of-sequence ids */
  int32_t num_eos_ids;
  bool enable_prefix_caching;
  bool async_scheduling;            /* plan the next step while one is in flight: see
                                       "Async scheduling" above */
  uint64_t hash_key;                /* seeds the block content hash */
  uint64_t max_image_bytes_per_step; /* image payload bytes one step carries at most
                                       (0 = no limit); one image alone always may */
};

/* Fills the defaults vLLM users expect: 16-token blocks, one full group, 256 seqs,
 * 8192 tokens per step, 4096 waiting, prefix caching on. num_blocks and max_model_len
 * must still be set. */
void sch_engine_config_default(struct sch_engine_config *cfg);

/* A media item in a prompt (an image, or an audio clip: the engine treats them
 * alike): the run of its soft tokens at prompt positions pos ..
 * pos + num_tokens - 1. An image's tokens attend to each other both ways, and
 * the encoder turns a whole item into its rows at once, so a prefill chunk never
 * ends inside the run (the planner moves the chunk's end to the run's start, or
 * past its end); the prefix cache keys the run's blocks on the item's kind and
 * content hash, not on the (identical) placeholder ids. The payload (the workers'
 * pixels, or a clip's features) is copied at admission and handed to the workers
 * with every chunk that meets the run. */
struct sch_image {
  int32_t pos;
  int32_t num_tokens; /* >= 1, <= max_num_batched_tokens */
  uint64_t hash;      /* content hash of the image */
  const void *data;   /* [len] opaque payload */
  size_t len;
  uint32_t width, height; /* the payload's shape, passed on to the workers (0: not said) */
  uint32_t kind;          /* proto's enum pr_media, passed on (and keyed) */
};

struct sch_request_params {
  uint64_t id;           /* unique among live requests */
  const int32_t *prompt; /* [prompt_len] token ids (copied) */
  int32_t prompt_len;
  int32_t max_tokens;            /* >= 1 */
  const int32_t *stop_token_ids; /* [num_stop_token_ids] extra stop ids (copied) */
  int32_t num_stop_token_ids;
  bool ignore_eos;
  int32_t priority;     /* lower runs first; 0 for plain FCFS */
  uint64_t arrival_ns;  /* when the request arrived (cm_time_ns clock); 0 = now. Echoed in
                           outputs for latency metrics; order is by add() call */
  const void *sampling; /* [sampling_len] opaque, copied, given to workers */
  size_t sampling_len;
  const struct sch_image *images; /* [num_images] in prompt order, not overlapping (copied) */
  int32_t num_images;
  bool constrained; /* a structured output: admitted only while the workers have the
                       structured-output state (sch_engine_set_grammars) */
  int32_t lora_slot;   /* a run-time LoRA adapter's slot (1 .. 64): admitted only while the
                          workers hold it (sch_engine_set_lora); 0: none */
  uint64_t cache_salt; /* the parent of its first KV block's hash (0: none): only requests
                          with the same salt share cached prefixes */
  bool score_prompt;   /* its prompt's logprobs are asked: every prompt position is computed
                          (no prefix-cache hit), however often it is admitted */
};

enum sch_finish {
  SCH_FINISH_NONE = 0,
  SCH_FINISH_STOP = 1,   /* an eos or stop id was generated (it is in the output) */
  SCH_FINISH_LENGTH = 2, /* max_tokens or max_model_len reached */
};

/* A token the plan does not know yet: the one the sequence samples in the step in
 * flight before this one (async scheduling); the workers run the token they sampled.
 * When that step verifies drafts, the plan's positions are those of accepting none:
 * the workers move them on by the drafts it accepted (the blocks cover every outcome),
 * and verify the drafts it proposed. */
#define SCH_TOKEN_PREV (-1)

/* One sequence of a step. */
struct sch_plan_seq {
  uint64_t req_id;
  const int32_t *tokens; /* [num_tokens] ids to run at positions start_pos.. (a decode's
                            one token may be SCH_TOKEN_PREV) */
  int32_t num_tokens;
  int32_t start_pos;    /* position of tokens[0] */
  int32_t num_draft;    /* draft slots after the tokens: positions start_pos +
                           num_tokens .. + num_draft - 1 have blocks; the workers
                           verify up to that many drafts */
  int32_t num_propose;  /* drafts the workers propose after the step's token, for the
                           next step to verify: a decode's num_draft, and a final
                           prefill chunk's as many as its first decode may take (so
                           that every decode, the first and one after a preemption
                           too, has drafts) */
  bool sample;          /* samples after the last token (false for a non-final
                           prefill chunk, which returns no result) */
  bool is_new;          /* first step the workers see it (or first after a
                           preemption): set up per-sequence state */
  int32_t num_prompt;   /* prompt tokens */
  int32_t max_tokens;   /* the request's */
  int32_t num_cached;   /* prefix-cache hit at first admission, tokens */
  const void *sampling; /* [sampling_len] as given to sch_engine_add */
  size_t sampling_len;
  const int32_t *block_table[SCH_MAX_GROUPS]; /* [num_blocks[g]] ids or SCH_BLOCK_HOLE;
                                                 entry i holds positions [i*bt, (i+1)*bt) */
  int32_t num_blocks[SCH_MAX_GROUPS];
  const struct sch_image *images; /* [num_images] the request's images whose tokens meet
                                     this step's (each lies wholly before the step's
                                     end; the first may begin before start_pos) */
  int32_t num_images;
};

struct sch_plan {
  uint64_t step_id;
  int32_t num_seqs;
  const struct sch_plan_seq *seqs; /* [num_seqs] */
  int32_t num_tokens;              /* scheduled tokens incl. draft slots (<= budget) */
  int32_t num_finished;
  const uint64_t *finished; /* [num_finished] ids the workers may forget:
                               finished or aborted since the last plan */
  int32_t num_preempted;
  const uint64_t *preempted; /* [num_preempted] preempted by this plan: forget
                                them too; they come back with is_new */
};

/* Rank 0's answer for one sampling sequence: the target's accepted draft tokens then
 * its own token (1 + accepted tokens; exactly 1 without drafts). */
struct sch_seq_result {
  uint64_t req_id;
  const int32_t *tokens; /* [num_tokens] */
  int32_t num_tokens;    /* 1 .. 1 + num_draft */
  int32_t num_verified;  /* drafts the workers verified (<= num_draft; fewer when fewer
                          * had been proposed, as in the first decode after a prefill):
                          * what the spec_* counters count */
  int32_t num_proposed;  /* drafts the workers proposed after these tokens (<= the plan's
                          * num_propose): a next decode planned after this result gets
                          * no more draft slots than that, and one without gets none
                          * (an n-gram lookup that found nothing) */
};

struct sch_output {
  uint64_t req_id;
  const int32_t *new_tokens; /* [num_new] tokens appended this step */
  int32_t num_new;
  enum sch_finish finish; /* SCH_FINISH_NONE while it goes on */
  int32_t num_prompt;     /* prompt tokens */
  int32_t num_generated;  /* generated so far, tokens */
  int32_t num_cached;     /* prefix-cache hit at first admission, tokens */
  uint64_t arrival_ns;    /* as given to sch_engine_add */
};

struct sch_outputs {
  int32_t num;
  const struct sch_output *items; /* [num] */
};

struct sch_engine_stats {
  int32_t num_running; /* admitted: prefilling or decoding */
  int32_t num_waiting; /* queued, preempted ones included */
  double kv_usage;     /* used blocks / all blocks, 0..1 */
  int32_t num_blocks;
  int32_t num_blocks_used;
  int32_t num_blocks_cached_free; /* free blocks still holding cached prefixes */
  uint64_t prefix_queries;        /* prompt tokens looked up in the prefix cache */
  uint64_t prefix_hits;           /* of those, found, tokens */
  uint64_t num_preemptions;
  uint64_t num_evictions; /* cached blocks reused for new content */
  uint64_t num_steps;
  uint64_t spec_num_drafts; /* decode steps with draft slots */
  uint64_t spec_num_draft_tokens;
  uint64_t spec_num_accepted_tokens;
  /* accepted drafts by position in the draft (0 = the first draft token): a
   * step that accepts a drafts adds 1 at positions 0 .. a-1 */
  uint64_t spec_accepted_per_pos[SCH_MAX_SPEC_TOKENS];
};

struct sch_engine;

/* Validates cfg (CM_ERR_INVAL with a message in err) and builds the engine. */
int sch_engine_create(const struct sch_engine_config *cfg, struct sch_engine **out, char *err,
                      size_t err_len);
void sch_engine_destroy(struct sch_engine *e);

/* Queues a request. Errors, with a message for the client in err: CM_ERR_INVAL (bad
 * params, duplicate id), CM_ERR_TOOBIG (can never fit: longer than max_model_len or
 * more KV blocks than the whole pool), CM_ERR_FULL (waiting queue full), CM_ERR_NOMEM. */
int sch_engine_add(struct sch_engine *e, const struct sch_request_params *params, char *err,
                   size_t err_len);
/* Drops a request in any state and returns all its blocks. CM_ERR_NOENT if unknown. */
int sch_engine_abort(struct sch_engine *e, uint64_t id);

/* Builds the next step into *plan. CM_ERR_STATE while a step is in flight (two, with
 * async_scheduling). A plan with no sequence puts nothing in flight (it may still list
 * finished ids). */
int sch_engine_plan_step(struct sch_engine *e, struct sch_plan *plan);
/* Applies rank 0's results of the step in flight (the oldest): one result per sampling
 * sequence that
 * is still alive (results for requests not in the step, such as aborted ones, are
 * ignored). Appends tokens, checks the
 * stop conditions, registers full blocks in the prefix cache, releases the slots of
 * rejected drafts and the blocks of finished requests. All or nothing: CM_ERR_INVAL
 * (a missing, duplicate or malformed result) changes nothing. */
int sch_engine_apply(struct sch_engine *e, const struct sch_seq_result *results, int32_t num,
                     struct sch_outputs *outs);
/* The steps in flight will never be answered (a worker failed one) but the KV cache
 * survives: their sequences are preempted (they recompute, from the prefix cache where it
 * still holds their blocks) and named in the next plan's finished list. With async
 * scheduling the prefix cache is emptied too: a plan made behind a step registers that
 * step's blocks before they are written. */
void sch_engine_step_failed(struct sch_engine *e);
/* The workers lost their KV cache (a restart): the step in flight is dropped, every
 * running request is preempted and the prefix cache is emptied. */
void sch_engine_reset_kv(struct sch_engine *e);

void sch_engine_stats(const struct sch_engine *e, struct sch_engine_stats *st);

/* Whether the workers have the structured-output state (true from create). While
 * they do not, a waiting constrained request is passed over by admission, as vLLM
 * passes over a request whose grammar is still compiling: the requests behind it are
 * admitted in their order, and it is admitted in its place once the state is there
 * (the workers build it beside the steps: PR_CTRL_GRAMMARS). Returns whether a
 * constrained request waits. */
bool sch_engine_set_grammars(struct sch_engine *e, bool ready);
/* Whether the workers hold run-time LoRA slot `slot` (1 .. 64): a waiting request
 * with that slot is passed over by admission while they do not. */
void sch_engine_set_lora(struct sch_engine *e, int32_t slot, bool ready);

/* Verifies every invariant of queues, tables and pool (refcount of each block = the
 * tables holding it; no block both free and held; waiting requests hold nothing).
 * O(blocks + table entries), for tests and debugging: 0 or CM_ERR_STATE with err. */
int sch_engine_check(const struct sch_engine *e, char *err, size_t err_len);

#endif
