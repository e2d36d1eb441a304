/* wk-sampler.h — token sampling on worker rank 0: penalties, temperature,
 * min-p, top-k, top-p, per-request seeded draws, logprobs, and the
 * verification that speculative decoding uses.
 *
 * Order of processing (as vLLM's sampler): repetition / frequency / presence
 * penalties on the raw logits, then temperature (0 = greedy argmax of the
 * penalised logits), min-p, top-k, top-p, renormalise, draw. Logprobs are
 * those of the RAW model distribution (log-softmax of the logits before any
 * processing), as vLLM reports them by default.
 *
 * Reproducibility: a draw uses a uniform number derived only from the
 * request's seed and the index of the token being sampled (counter-based),
 * so the same request gives the same tokens whatever it is batched with.
 *
 * A struct wk_sampler holds scratch for one vocabulary; sampling allocates
 * nothing. One sampler is used by one thread at a time. */
#ifndef LMSERVE_WK_SAMPLER_H
#define LMSERVE_WK_SAMPLER_H
#include <stdint.h>

#include "kernels/kn-backend.h"

#define WK_MAX_LOGPROBS 20

struct wk_sampling_params {
  float temperature;        /* 0 (or < 1e-5) = greedy */
  int top_k;                /* <= 0: off */
  float top_p;              /* in (0, 1]; 1 = off */
  float min_p;              /* in [0, 1]; 0 = off */
  float presence_penalty;   /* [-2, 2]; 0 = off */
  float frequency_penalty;  /* [-2, 2]; 0 = off */
  float repetition_penalty; /* (0, 2]; 1 = off */
  uint64_t seed;            /* the request's seed (the scheduler picks one when none given) */
  int n_logprobs;           /* -1: none; 0: the sampled token's; k <= 20: also the top k */
  /* logit_bias: bias[i] added to token bias_ids[i]'s logit (the arrays are the
   * caller's and outlive the parameters) */
  const int32_t *bias_ids;
  const float *bias;
  int n_bias;
  int bias_only; /* allowed_token_ids: only the tokens of bias_ids may be drawn */
};

void wk_sampling_params_default(struct wk_sampling_params *p);

/* ---- per-sequence penalty state ---------------------------------------------- */

/* Counts of generated tokens (frequency / presence penalties) and the set of
 * prompt tokens (repetition penalty applies to prompt and output tokens).
 * Open-addressing tables that grow as needed (amortised; not per token). */
struct wk_penalty_state {
  int32_t *keys;   /* [cap] token ids, -1 empty */
  int32_t *counts; /* [cap] output count; 0 = seen in the prompt only */
  int cap, used;
};

void wk_penalty_init(struct wk_penalty_state *st);
void wk_penalty_free(struct wk_penalty_state *st);
void wk_penalty_reset(struct wk_penalty_state *st);
/* Records prompt tokens / one generated token. 0 or CM_ERR_NOMEM. */
int wk_penalty_add_prompt(struct wk_penalty_state *st, const int32_t *ids, int n);
int wk_penalty_add_output(struct wk_penalty_state *st, int32_t id);

/* ---- the sampler ----------------------------------------------------------- */

struct wk_sampler;

struct wk_sample_result {
  int32_t token;
  float logprob;                    /* raw logprob of `token` (when n_logprobs >= 0) */
  int n_top;                        /* entries in top_ids / top_logprobs */
  int32_t top_ids[WK_MAX_LOGPROBS]; /* raw top logprobs, best first */
  float top_logprobs[WK_MAX_LOGPROBS];
};

/* 0 and *out, or CM_ERR_INVAL (vocab <= 0) / CM_ERR_NOMEM. */
int wk_sampler_create(int vocab, struct wk_sampler **out);
void wk_sampler_destroy(struct wk_sampler *s);

/* Samples one token from logits[vocab] (modified in place: penalties and
 * temperature are applied to it). `st` may be NULL (no penalties);
 * token_index is the position of this token in the request's output (the
 * counter of the seeded draw). 0 or a negative cm_err. */
int wk_sample(struct wk_sampler *s, float *logits, const struct wk_sampling_params *p,
              const struct wk_penalty_state *st, uint64_t token_index,
              struct wk_sample_result *out);
/* wk_sample drawing only tokens whose bit is set in allow (kn_sample_params.allow:
 * a structured output's mask); logprobs stay the raw distribution's. */
int wk_sample_masked(struct wk_sampler *s, float *logits, const struct wk_sampling_params *p,
                     const struct wk_penalty_state *st, uint64_t token_index, const uint32_t *allow,
                     struct wk_sample_result *out);

/* The processed distribution (after penalties, temperature, min-p, top-k,
 * top-p): *n entries of ids[] / probs[] (pointers into the sampler's scratch,
 * valid until the next call), probabilities summing to 1, best first when the
 * set was sorted. For greedy params the distribution is the argmax alone. */
int wk_sampler_dist(struct wk_sampler *s, float *logits, const struct wk_sampling_params *p,
                    const struct wk_penalty_state *st, const int32_t **ids, const float **probs,
                    int *n);

/* Speculative verification of one drafted token `draft` (proposed
 * deterministically, i.e. with draft probability 1): the row's own draw
 * (wk_sample_masked at token_index), which takes the draft when it is the
 * draw. That is speculative sampling for such a drafter: the draft is
 * accepted with probability p_target(draft), and on rejection the token
 * comes from the target with `draft` removed and renormalised (the residual
 * max(p - q, 0)); and the token is the one sampling without drafts gives at
 * that position, so a seeded request's tokens do not depend on which drafts
 * it was offered (a preemption, a batch's budget, async steps). For greedy
 * params it accepts iff draft is the argmax and returns the argmax.
 * *accepted is 1 or 0; out->token is the draft or the replacement. With
 * allow (a structured output's mask, as wk_sample_masked's) the target is the
 * masked distribution: a draft the mask refuses is rejected. */
int wk_sample_verify(struct wk_sampler *s, float *logits, const struct wk_sampling_params *p,
                     const struct wk_penalty_state *st, uint64_t token_index, int32_t draft,
                     const uint32_t *allow, int *accepted, struct wk_sample_result *out);

/* The kernels' row parameters (kn_sample) for p, penalty state st (or NULL,
 * borrowed: valid until st changes) and the draw's counter; and a kernel
 * result as a sampler result. */
void wk_sampling_to_kn(const struct wk_sampling_params *p, const struct wk_penalty_state *st,
                       uint64_t token_index, struct kn_sample_params *k);
void wk_sample_result_from_kn(const struct kn_sample_out *k, struct wk_sample_result *out);

/* The uniform draw in [0, 1) for (seed, token_index, stream); exposed for tests. */
double wk_sampler_uniform(uint64_t seed, uint64_t token_index, uint32_t stream);

#endif
