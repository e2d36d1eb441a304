/* kn-cpu-sample.h — the host sampling math: penalties, temperature, min-p,
 * top-k, top-p, the seeded counter-based draw and raw logprobs (semantics in
 * kn-backend.h, struct kn_sample_params). The CPU backend's kn_sample and the
 * worker's sampler (worker/wk-sampler.c, which adds penalty state and
 * speculative verification) both run on it: there is one CPU implementation.
 *
 * Large vocabularies (262144) are never sorted whole: top-k keeps a heap of
 * k entries; top-p gathers the tokens above a logit threshold, lowering it
 * until the gathered mass reaches top_p, and sorts only those.
 *
 * A struct kn_cpu_sampler holds scratch for one vocabulary; sampling
 * allocates nothing. One sampler is used by one thread at a time. */
#ifndef LMSERVE_KN_CPU_SAMPLE_H
#define LMSERVE_KN_CPU_SAMPLE_H
#include <stdint.h>

#include "kernels/kn-backend.h"

struct kn_cpu_sampler;

/* One candidate token: its processed logit (penalties and temperature applied). */
struct kn_cand {
  float l;
  int32_t id;
};

/* qsort order of candidates: larger l first, the lower id first on ties. */
int kn_cand_desc(const void *a, const void *b);

/* Scratch for sampling rows of `vocab` logits: 0 and *out, CM_ERR_INVAL for
 * vocab <= 0, CM_ERR_NOMEM. */
int kn_cpu_sampler_create(int vocab, struct kn_cpu_sampler **out);
void kn_cpu_sampler_destroy(struct kn_cpu_sampler *s);
int kn_cpu_sampler_vocab(const struct kn_cpu_sampler *s);

/* The uniform number in [0, 1) for (seed, counter, stream): a pure function,
 * so a request's draws do not depend on what it is batched with. Streams 0
 * (sampling), 1 and 2 (speculative acceptance and replacement) are used. */
double kn_cpu_sample_uniform(uint64_t seed, uint64_t counter, uint32_t stream);

/* The processed distribution of logits[vocab] (modified in place: penalties
 * and temperature are applied to it): *n entries of ids[] / probs[] (pointers
 * into the sampler's scratch, valid until the next call), probabilities
 * summing to 1, best first when the set was sorted. Greedy params give the
 * argmax alone (kn_argmax's rule: first on ties, NaN never wins). 0, or
 * CM_ERR_INVAL for bad params or a row with nothing finite left. */
int kn_cpu_sample_dist(struct kn_cpu_sampler *s, float *logits, const struct kn_sample_params *p,
                       const int32_t **ids, const float **probs, int *n);

/* The n largest of logits[vocab], best first and the lower
 * id first on ties, into ids[] (off + index) / vals[]; returns how many
 * (min(n, vocab) unless NaNs). */
int kn_cpu_sample_top(const float *logits, int32_t off, int vocab, int n, int32_t *ids,
                      float *vals);

/* Applies p's penalties, then its logit biases (and with bias_only, KN_SAMPLE_NEVER to
 * every token not listed), to logits[n], which hold the vocabulary entries [off, off + n)
 * (a vocab-parallel slice; off 0 and n = vocab for a whole row). Ids outside the
 * slice are skipped. */
void kn_cpu_sample_penalise(float *logits, int32_t off, int n, const struct kn_sample_params *p);

/* The end of every distribution: top-p over the candidates c[n] (when sorted,
 * best first, and top_p < 1), relative to zc = the candidate set's mass
 * sum(exp(l - m)), then the kept ones renormalised into ids[] / probs[].
 * Returns how many are kept (>= 1 for n >= 1). *closed (may be NULL): 1 when
 * the kept mass reached top_p * zc within c (or no top-p applied), 0 when c
 * ran out first, so that a partial candidate list cannot decide the set. */
int kn_cpu_sample_keep(const struct kn_cand *c, int n, int sorted, float m, double zc, float top_p,
                       int32_t *ids, float *probs, int *closed);

/* Draws from ids[n] / probs[n] with uniform u by walking the cumulative
 * distribution; entry `skip` (or -1), whose mass is skip_p, is left out and
 * the rest renormalised. */
int32_t kn_cpu_sample_draw(const int32_t *ids, const float *probs, int n, double u, int skip,
                           double skip_p);

/* A copy of the raw logits in the sampler's scratch when p asks for
 * logprobs (processing overwrites them), else NULL. */
const float *kn_cpu_sample_save_raw(struct kn_cpu_sampler *s, const float *logits,
                                    const struct kn_sample_params *p);

/* Fills out->logprob / n_top / top_* for out->token from raw[vocab] (NULL or
 * n_logprobs < 0: zeros). */
void kn_cpu_sample_logprobs(const struct kn_cpu_sampler *s, const float *raw,
                            const struct kn_sample_params *p, struct kn_sample_out *out);

/* One whole row: distribution, draw with stream 0 of (seed, counter),
 * logprobs. logits[vocab] is modified in place. 0 or a negative cm_err. */
int kn_cpu_sample_row(struct kn_cpu_sampler *s, float *logits, const struct kn_sample_params *p,
                      struct kn_sample_out *out);

/* The CPU backend's kn_sample op (ctx: struct kn_cpu_ctx). */
int kn_cpu_op_sample(void *ctx, struct kn_sample_out *out, const float *logits, ptrdiff_t ld, int T,
                     int V, const struct kn_sample_params *params);

#endif
