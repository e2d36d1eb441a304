/* wk-sampler.c — the worker's sampler: per-sequence penalty state, the
 * conversion to the kernels' per-row parameters, and speculative
 * verification (see wk-sampler.h). The math itself (penalties, temperature,
 * min-p, top-k, top-p, seeded draws, raw logprobs) is the CPU backend's, in
 * kernels/cpu/kn-cpu-sample.c, so that kn_sample on every backend is tested
 * against the same code the CPU worker runs. */
#include "worker/wk-sampler.h"

#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu-sample.h"

_Static_assert(WK_MAX_LOGPROBS == KN_SAMPLE_MAX_LOGPROBS, "one logprobs limit");

struct wk_sampler {
  struct kn_cpu_sampler *k;
};

void wk_sampling_params_default(struct wk_sampling_params *p) {
  memset(p, 0, sizeof(*p));
  p->temperature = 1.0f;
  p->top_k = 0;
  p->top_p = 1.0f;
  p->repetition_penalty = 1.0f;
  p->n_logprobs = -1;
}

double wk_sampler_uniform(uint64_t seed, uint64_t token_index, uint32_t stream) {
  return kn_cpu_sample_uniform(seed, token_index, stream);
}

/* ---- penalty state ------------------------------------------------------------ */

void wk_penalty_init(struct wk_penalty_state *st) {
  memset(st, 0, sizeof(*st));
}

void wk_penalty_free(struct wk_penalty_state *st) {
  free(st->keys);
  free(st->counts);
  memset(st, 0, sizeof(*st));
}

void wk_penalty_reset(struct wk_penalty_state *st) {
  if (st->keys) memset(st->keys, 0xff, (size_t)st->cap * sizeof(int32_t));
  st->used = 0;
}

static uint32_t hash_id(int32_t id) {
  return (uint32_t)id * 2654435761u;
}

static int penalty_grow(struct wk_penalty_state *st) {
  int cap = st->cap ? st->cap * 2 : 256;
  int32_t *keys = malloc((size_t)cap * sizeof(int32_t));
  int32_t *counts = calloc((size_t)cap, sizeof(int32_t));
  if (!keys || !counts) {
    free(keys);
    free(counts);
    return CM_ERR_NOMEM;
  }
  memset(keys, 0xff, (size_t)cap * sizeof(int32_t));
  for (int i = 0; i < st->cap; i++) {
    if (st->keys[i] < 0) continue;
    uint32_t h = hash_id(st->keys[i]) & (uint32_t)(cap - 1);
    while (keys[h] >= 0)
      h = (h + 1) & (uint32_t)(cap - 1);
    keys[h] = st->keys[i];
    counts[h] = st->counts[i];
  }
  free(st->keys);
  free(st->counts);
  st->keys = keys;
  st->counts = counts;
  st->cap = cap;
  return 0;
}

/* Returns the slot of id, inserting it (count 0) when absent; -1 on NOMEM. */
static int penalty_slot(struct wk_penalty_state *st, int32_t id) {
  if ((st->used + 1) * 2 > st->cap && penalty_grow(st) != 0) return -1;
  uint32_t mask = (uint32_t)(st->cap - 1);
  uint32_t h = hash_id(id) & mask;
  while (st->keys[h] >= 0 && st->keys[h] != id)
    h = (h + 1) & mask;
  if (st->keys[h] < 0) {
    st->keys[h] = id;
    st->counts[h] = 0;
    st->used++;
  }
  return (int)h;
}

int wk_penalty_add_prompt(struct wk_penalty_state *st, const int32_t *ids, int n) {
  for (int i = 0; i < n; i++)
    if (ids[i] >= 0 && penalty_slot(st, ids[i]) < 0) return CM_ERR_NOMEM;
  return 0;
}

int wk_penalty_add_output(struct wk_penalty_state *st, int32_t id) {
  if (id < 0) return CM_ERR_INVAL;
  int h = penalty_slot(st, id);
  if (h < 0) return CM_ERR_NOMEM;
  st->counts[h]++;
  return 0;
}

/* ---- sampler ------------------------------------------------------------------- */

int wk_sampler_create(int vocab, struct wk_sampler **out) {
  *out = NULL;
  struct wk_sampler *s = calloc(1, sizeof(*s));
  if (!s) return CM_ERR_NOMEM;
  int rc = kn_cpu_sampler_create(vocab, &s->k);
  if (rc) {
    free(s);
    return rc;
  }
  *out = s;
  return 0;
}

void wk_sampler_destroy(struct wk_sampler *s) {
  if (!s) return;
  kn_cpu_sampler_destroy(s->k);
  free(s);
}

void wk_sampling_to_kn(const struct wk_sampling_params *p, const struct wk_penalty_state *st,
                       uint64_t counter, struct kn_sample_params *k) {
  kn_sample_params_default(k);
  k->temperature = p->temperature;
  k->top_k = p->top_k;
  k->top_p = p->top_p;
  k->min_p = p->min_p;
  k->presence_penalty = p->presence_penalty;
  k->frequency_penalty = p->frequency_penalty;
  k->repetition_penalty = p->repetition_penalty;
  k->seed = p->seed;
  k->counter = counter;
  k->n_logprobs = p->n_logprobs;
  k->bias_ids = p->bias_ids;
  k->bias = p->bias;
  k->n_bias = p->n_bias;
  k->bias_only = p->bias_only;
  if (st && st->keys) {
    k->pen_ids = st->keys;
    k->pen_counts = st->counts;
    k->n_pen = st->cap;
  }
}

void wk_sample_result_from_kn(const struct kn_sample_out *k, struct wk_sample_result *out) {
  out->token = k->token;
  out->logprob = k->logprob;
  out->n_top = k->n_top;
  for (int i = 0; i < k->n_top; i++) {
    out->top_ids[i] = k->top_ids[i];
    out->top_logprobs[i] = k->top_logprobs[i];
  }
}

int wk_sampler_dist(struct wk_sampler *s, float *logits, const struct wk_sampling_params *p,
                    const struct wk_penalty_state *st, const int32_t **ids_out,
                    const float **probs_out, int *n_out) {
  struct kn_sample_params kp;
  wk_sampling_to_kn(p, st, 0, &kp);
  return kn_cpu_sample_dist(s->k, logits, &kp, ids_out, probs_out, n_out);
}

int wk_sample(struct wk_sampler *s, float *logits, const struct wk_sampling_params *p,
              const struct wk_penalty_state *st, uint64_t token_index,
              struct wk_sample_result *out) {
  return wk_sample_masked(s, logits, p, st, token_index, NULL, out);
}

int wk_sample_masked(struct wk_sampler *s, float *logits, const struct wk_sampling_params *p,
                     const struct wk_penalty_state *st, uint64_t token_index, const uint32_t *allow,
                     struct wk_sample_result *out) {
  struct kn_sample_params kp;
  struct kn_sample_out ko;
  wk_sampling_to_kn(p, st, token_index, &kp);
  kp.allow = allow;
  int rc = kn_cpu_sample_row(s->k, logits, &kp, &ko);
  if (rc == 0) wk_sample_result_from_kn(&ko, out);
  return rc;
}

int wk_sample_verify(struct wk_sampler *s, float *logits, const struct wk_sampling_params *p,
                     const struct wk_penalty_state *st, uint64_t token_index, int32_t draft,
                     const uint32_t *allow, int *accepted, struct wk_sample_result *out) {
  int rc = wk_sample_masked(s, logits, p, st, token_index, allow, out);
  *accepted = rc == 0 && out->token == draft;
  return rc;
}
