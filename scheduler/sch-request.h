/* sch-request.h — one generation request as the scheduler sees it: its token ids
 * (prompt, then generated), how far its KV is computed, its stop conditions, its place
 * in the queues and its KV block tables.
 *
 * The token buffer and the KV tables start with the prompt plus a little headroom and
 * grow by doubling (up to prompt + max_tokens) when the planner reserves room for a
 * step, never while results are applied: a queued request with a huge max_tokens costs
 * only its prompt, and nothing is allocated per token. The sampling parameters are an opaque blob
 * copied at admission and handed to the workers unchanged: the scheduler reads only the stop
 * fields. */
#ifndef LMSERVE_SCH_REQUEST_H
#define LMSERVE_SCH_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "scheduler/sch-engine.h"
#include "scheduler/sch-kv.h"

enum sch_req_state {
  SCH_REQ_WAITING = 0,   /* never admitted yet */
  SCH_REQ_RUNNING = 1,   /* holds blocks; prefilling or decoding */
  SCH_REQ_PREEMPTED = 2, /* back in the waiting queue; its KV is recomputed on return */
  SCH_REQ_FINISHED = 3,
};

struct sch_request {
  uint64_t id;
  enum sch_req_state state;
  int32_t *tokens;      /* [cap] prompt ids, then generated ids */
  int32_t cap;          /* tokens the buffer (and the KV tables) hold now; grows */
  int32_t max_len;      /* prompt + max_tokens: the most it will ever need, tokens */
  int32_t num_prompt;   /* tokens */
  int32_t num_tokens;   /* prompt + generated, tokens */
  int32_t max_tokens;   /* generated tokens allowed */
  int32_t num_computed; /* leading tokens whose KV is in the cache */
  int32_t num_cached;   /* prefix-cache hit at first admission, tokens */
  int32_t priority;     /* lower runs first */
  uint64_t arrival_seq; /* order of arrival (FCFS) */
  uint64_t arrival_ns;  /* arrival time, cm_time_ns clock */
  uint64_t admit_seq;   /* order of the latest admission to running */
  int32_t *stop_ids;    /* [num_stop] ids that end generation (besides eos) */
  int32_t num_stop;
  bool ignore_eos;
  bool constrained; /* a structured output (sch_engine_set_grammars) */
  int32_t lora_slot; /* a run-time LoRA slot (sch_engine_set_lora); 0: none */
  bool score_prompt; /* its prompt's logprobs are asked: no prefix-cache hit */
  bool counted;   /* prefix-cache query counted */
  bool in_worker; /* the workers hold per-sequence state */
  void *sampling; /* [sampling_len] opaque sampling parameters, bytes */
  size_t sampling_len;
  int32_t num_preemptions;
  int32_t proposed; /* drafts its last applied result proposed for the next decode to
                       verify (a final prefill chunk's result comes before any decode) */
  struct sch_kv_seq kv;
  struct sch_image *images; /* [num_images] with their payloads (owned) */
  int32_t num_images;
  int32_t *keys; /* [cap] what the prefix cache hashes: the token ids, but an image's
                    soft tokens carry values drawn from its content hash (high bit set,
                    so never a token id); NULL without images (the ids are the keys) */

  /* the steps that run it, by plan slot (sch-engine-impl.h): valid while
   * sched[i].step is the step of slot i (in flight, or being planned) */
  struct sch_req_sched {
    uint64_t step;  /* step id it was scheduled in (0: none) */
    int32_t tokens; /* tokens scheduled in that step */
    int32_t draft;  /* draft slots reserved after them */
    int32_t index;  /* its index in that plan, or -1 */
    bool sample;    /* the step samples its next token */
  } sched[2];
  const struct sch_seq_result *result; /* this step's result, during apply */

  /* queue links */
  struct sch_request *prev, *next; /* waiting list */
  struct sch_request *hnext;       /* id map chain */
  int32_t run_index;               /* index in the running array, or -1 */
};

/* Validates params against the engine's limits and builds a waiting request. Errors
 * (with a message in err): CM_ERR_INVAL (empty prompt, bad token id, max_tokens < 1),
 * CM_ERR_TOOBIG (longer than max_model_len, needs more KV blocks than the pool has,
 * too many stop ids or too large sampling blob), CM_ERR_NOMEM. */
int sch_request_create(const struct sch_engine_config *cfg, const struct sch_kv *kv,
                       const struct sch_request_params *params, struct sch_request **out, char *err,
                       size_t err_len);
/* Makes the token buffer and the KV tables hold ntokens (capped at max_len), doubling.
 * 0 or CM_ERR_NOMEM (then nothing changed that matters: the request still works). */
int sch_request_reserve(struct sch_request *r, const struct sch_kv *kv, int32_t ntokens);
/* Frees the request; it must hold no block. */
void sch_request_destroy(struct sch_request *r);

/* The prefix cache's view of the tokens (see keys). */
static inline const int32_t *sch_request_keys(const struct sch_request *r) {
  return r->keys ? r->keys : r->tokens;
}

static inline int32_t sch_request_num_generated(const struct sch_request *r) {
  return r->num_tokens - r->num_prompt;
}

/* Appends up to n sampled tokens, stopping at the first that ends the request (an eos
 * id unless ignore_eos, a stop id, max_tokens, max_model_len). Returns how many were
 * appended; *finish says why the request ended, or SCH_FINISH_NONE. */
int32_t sch_request_append(struct sch_request *r, const int32_t *tokens, int32_t n,
                           const struct sch_engine_config *cfg, enum sch_finish *finish);

#endif
