/* kn-cpu-sample.c — the host sampling math (see kn-cpu-sample.h) and the CPU
 * backend's kn_sample op on top of it. */
#include "kernels/cpu/kn-cpu-sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-hash.h"
#include "kernels/cpu/kn-cpu-impl.h"

struct kn_cpu_sampler {
  int vocab;
  struct kn_cand *cand; /* [vocab] candidate scratch */
  int32_t *ids;         /* [vocab] final distribution ids */
  float *probs;         /* [vocab] final distribution probabilities */
  float *raw;           /* [vocab] copy of the raw logits, when logprobs are asked */
  float *work;          /* [vocab] the op's processed copy of a row */
  float *cval;          /* [vocab] a sparse mask's allowed logits, compacted */
  int32_t *cid;         /* [vocab] their ids */
};

int kn_cpu_sampler_create(int vocab, struct kn_cpu_sampler **out) {
  *out = NULL;
  if (vocab <= 0) return CM_ERR_INVAL;
  /* one block: the struct, the candidates, then six [vocab] arrays of 4-byte elements */
  size_t V = (size_t)vocab;
  struct kn_cpu_sampler *s = malloc(sizeof(*s) + V * sizeof(struct kn_cand) + 6 * V * 4);
  if (!s) return CM_ERR_NOMEM;
  s->vocab = vocab;
  s->cand = (struct kn_cand *)(s + 1);
  s->ids = (int32_t *)(s->cand + V);
  s->probs = (float *)(s->ids + V);
  s->raw = s->probs + V;
  s->work = s->raw + V;
  s->cval = s->work + V;
  s->cid = (int32_t *)(s->cval + V);
  *out = s;
  return 0;
}

void kn_cpu_sampler_destroy(struct kn_cpu_sampler *s) {
  free(s);
}

int kn_cpu_sampler_vocab(const struct kn_cpu_sampler *s) {
  return s->vocab;
}

/* ---- counter-based random numbers ------------------------------------------ */

/* splitmix64's value for state x (cm-hash.h's step without the state). */
static uint64_t splitmix64(uint64_t x) {
  return cm_mix64(x + CM_GOLDEN64);
}

double kn_cpu_sample_uniform(uint64_t seed, uint64_t counter, uint32_t stream) {
  uint64_t z = splitmix64(splitmix64(seed) ^ (counter * 4 + stream) * 0xD1B54A32D192ED03ull);
  return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- penalties ----------------------------------------------------------------- */

void kn_cpu_sample_penalise(float *logits, int32_t off, int n, const struct kn_sample_params *p) {
  int rep = p->repetition_penalty != 1.0f;
  int freq = p->frequency_penalty != 0.0f, pres = p->presence_penalty != 0.0f;
  for (int i = 0; (rep || freq || pres) && i < p->n_pen; i++) {
    int32_t id = p->pen_ids[i] - off;
    if (p->pen_ids[i] < off || id >= n) continue;
    float l = logits[id];
    if (rep) l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
    if (p->pen_counts[i] > 0) {
      l -= p->frequency_penalty * (float)p->pen_counts[i];
      if (pres) l -= p->presence_penalty;
    }
    logits[id] = l;
  }
  for (int i = 0; i < p->n_bias; i++) /* logit_bias, after the penalties (as vLLM) */
    if (p->bias_ids[i] >= off && p->bias_ids[i] - off < n)
      logits[p->bias_ids[i] - off] += p->bias[i];
  if (p->bias_only) { /* allowed_token_ids: the listed tokens' values, every other NEVER */
    float keep[KN_SAMPLE_MAX_BIAS];
    int nk = p->n_bias < KN_SAMPLE_MAX_BIAS ? p->n_bias : KN_SAMPLE_MAX_BIAS;
    for (int i = 0; i < nk; i++)
      keep[i] = p->bias_ids[i] >= off && p->bias_ids[i] - off < n ? logits[p->bias_ids[i] - off]
                                                                  : -INFINITY;
    for (int i = 0; i < n; i++)
      logits[i] = KN_SAMPLE_NEVER;
    for (int i = 0; i < nk; i++)
      if (p->bias_ids[i] >= off && p->bias_ids[i] - off < n) logits[p->bias_ids[i] - off] = keep[i];
  }
}

/* ---- raw logprobs ---------------------------------------------------------------- */

int kn_cpu_sample_top(const float *logits, int32_t off, int vocab, int n, int32_t *ids,
                      float *vals) {
  int have = 0;
  for (int i = 0; i < vocab && n > 0; i++) {
    float l = logits[i];
    int k = have;
    if (k == n && l <= vals[n - 1]) continue;
    if (k < n)
      have++;
    else
      k = n - 1;
    /* insertion: ties keep the lower id first */
    while (k > 0 && vals[k - 1] < l) {
      vals[k] = vals[k - 1];
      ids[k] = ids[k - 1];
      k--;
    }
    vals[k] = l;
    ids[k] = off + i;
  }
  return have;
}

/* log-softmax of the unprocessed logits; top n best first. */
static void raw_logprobs(const float *logits, int vocab, int n, struct kn_sample_out *out) {
  float m = -INFINITY;
  for (int i = 0; i < vocab; i++)
    if (logits[i] > m) m = logits[i];
  double z = 0;
  for (int i = 0; i < vocab; i++)
    z += exp((double)(logits[i] - m));
  float lse = m + (float)log(z);
  out->logprob = logits[out->token] - lse;
  out->n_top = kn_cpu_sample_top(logits, 0, vocab, n, out->top_ids, out->top_logprobs);
  for (int k = 0; k < out->n_top; k++)
    out->top_logprobs[k] -= lse;
}

const float *kn_cpu_sample_save_raw(struct kn_cpu_sampler *s, const float *logits,
                                    const struct kn_sample_params *p) {
  if (p->n_logprobs < 0) return NULL;
  memcpy(s->raw, logits, (size_t)s->vocab * sizeof(float));
  return s->raw;
}

void kn_cpu_sample_logprobs(const struct kn_cpu_sampler *s, const float *raw,
                            const struct kn_sample_params *p, struct kn_sample_out *out) {
  out->n_top = 0;
  out->logprob = 0;
  if (raw && p->n_logprobs >= 0) raw_logprobs(raw, s->vocab, p->n_logprobs, out);
}

/* ---- the filtered distribution ---------------------------------------------------- */

int kn_cand_desc(const void *a, const void *b) {
  const struct kn_cand *x = a, *y = b;
  if (x->l != y->l) return x->l > y->l ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* min-heap on l (then larger id is "smaller", so ties keep lower ids) */
static int heap_less(const struct kn_cand *a, const struct kn_cand *b) {
  return a->l < b->l || (a->l == b->l && a->id > b->id);
}

static void heap_sift_down(struct kn_cand *h, int n, int i) {
  for (;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < n && heap_less(&h[l], &h[m])) m = l;
    if (r < n && heap_less(&h[r], &h[m])) m = r;
    if (m == i) return;
    struct kn_cand t = h[i];
    h[i] = h[m];
    h[m] = t;
    i = m;
  }
}

/* The k largest of the logits >= cut, sorted; returns how many. Token i's logit
 * is logits[i] (ids NULL) or that of ids[i]. */
static int gather_top_k(struct kn_cand *h, const float *logits, const int32_t *ids, int V,
                        float cut, int topk) {
  int n = 0;
  for (int i = 0; i < V; i++) {
    float l = logits[i];
    if (!(l >= cut)) continue;
    struct kn_cand c = {l, ids ? ids[i] : i};
    if (n < topk) {
      h[n++] = c;
      if (n == topk)
        for (int j = topk / 2 - 1; j >= 0; j--)
          heap_sift_down(h, n, j);
    } else if (heap_less(&h[0], &c)) {
      h[0] = c;
      heap_sift_down(h, n, 0);
    }
  }
  qsort(h, (size_t)n, sizeof(*h), kn_cand_desc);
  return n;
}

/* The logits >= cut_minp with mass (relative to z) reaching top_p, sorted:
 * gathered above a falling threshold. Returns how many. */
static int gather_top_p(struct kn_cand *c, const float *logits, const int32_t *ids, int V, float m,
                        float cut_minp, double z, float top_p) {
  int n = 0;
  for (float drop = 8.0f;; drop *= 2.0f) {
    float cut = m - drop;
    if (cut < cut_minp) cut = cut_minp;
    n = 0;
    double mass = 0;
    for (int i = 0; i < V; i++)
      if (logits[i] >= cut) {
        c[n++] = (struct kn_cand){logits[i], ids ? ids[i] : i};
        mass += exp((double)(logits[i] - m));
      }
    if (mass / z >= (double)top_p || cut == cut_minp || drop > 1e4f) break;
  }
  qsort(c, (size_t)n, sizeof(*c), kn_cand_desc);
  return n;
}

int kn_cpu_sample_dist(struct kn_cpu_sampler *s, float *logits, const struct kn_sample_params *p,
                       const int32_t **ids_out, const float **probs_out, int *n_out) {
  int rc = kn_sample_params_check(p);
  if (rc) return rc;
  int V = s->vocab;
  const int32_t *ids = NULL; /* token i is logits[i], or the compacted ids[i] */
  kn_cpu_sample_penalise(logits, 0, V, p);
  if (p->allow) {
    /* a mask (a structured output's): the allowed tokens alone, compacted in order,
     * which give what -inf everywhere else would, without passes over the whole row */
    int words = (V + 31) / 32, n = 0;
    for (int w = 0; w < words; w++) {
      uint32_t b = p->allow[w];
      if (b == 0xffffffffu && w * 32 + 32 <= V) {
        for (int k = 0; k < 32; k++)
          s->cval[n + k] = logits[w * 32 + k], s->cid[n + k] = w * 32 + k;
        n += 32;
        continue;
      }
      for (; b; b &= b - 1) {
        int id = w * 32 + __builtin_ctz(b);
        if (id < V) s->cval[n] = logits[id], s->cid[n++] = id;
      }
    }
    logits = s->cval;
    ids = s->cid;
    V = n;
    if (!V) return CM_ERR_INVAL; /* nothing allowed */
  }
  if (p->temperature < 1e-5f) {
    kn_cpu_op_argmax(NULL, &s->ids[0], NULL, logits, V, 1, V);
    if (ids) s->ids[0] = ids[s->ids[0]];
    s->probs[0] = 1.0f;
    *ids_out = s->ids;
    *probs_out = s->probs;
    *n_out = 1;
    return 0;
  }
  float inv_t = 1.0f / p->temperature;
  float m = -INFINITY;
  for (int i = 0; i < V; i++) {
    logits[i] *= inv_t;
    if (logits[i] > m) m = logits[i];
  }
  if (!isfinite(m)) return CM_ERR_INVAL; /* all -inf or NaN logits */
  float cut_minp = p->min_p > 0 ? m + logf(p->min_p) : -INFINITY;
  /* (the whole vocabulary's size decides, so that a sparse mask draws as a dense one) */
  int topk = p->top_k > 0 && p->top_k < s->vocab ? p->top_k : 0;
  int n = 0, sorted = 0;
  double zc = 0; /* normaliser of the candidate set's probabilities */

  if (topk) {
    n = gather_top_k(s->cand, logits, ids, V, cut_minp, topk);
    sorted = 1;
    for (int i = 0; i < n; i++)
      zc += exp((double)(s->cand[i].l - m));
  } else {
    for (int i = 0; i < V; i++)
      if (logits[i] >= cut_minp) zc += exp((double)(logits[i] - m));
    if (p->top_p < 1.0f) {
      n = gather_top_p(s->cand, logits, ids, V, m, cut_minp, zc, p->top_p);
      sorted = 1;
    } else {
      for (int i = 0; i < V; i++)
        if (logits[i] >= cut_minp) s->cand[n++] = (struct kn_cand){logits[i], ids ? ids[i] : i};
    }
  }
  if (n == 0) return CM_ERR_INVAL;

  *ids_out = s->ids;
  *probs_out = s->probs;
  *n_out = kn_cpu_sample_keep(s->cand, n, sorted, m, zc, p->top_p, s->ids, s->probs, NULL);
  return 0;
}

int kn_cpu_sample_keep(const struct kn_cand *c, int n, int sorted, float m, double zc, float top_p,
                       int32_t *ids, float *probs, int *closed) {
  int keep = n, done = !sorted || top_p >= 1.0f;
  if (!done) {
    double cum = 0;
    for (int i = 0; i < n; i++) {
      if (cum >= (double)top_p * zc) {
        keep = i;
        done = 1;
        break;
      }
      cum += exp((double)(c[i].l - m));
    }
    if (!done) done = cum >= (double)top_p * zc;
    if (keep < 1) keep = 1;
  }
  double zk = 0;
  for (int i = 0; i < keep; i++)
    zk += exp((double)(c[i].l - m));
  for (int i = 0; i < keep; i++) {
    ids[i] = c[i].id;
    probs[i] = (float)(exp((double)(c[i].l - m)) / zk);
  }
  if (closed) *closed = done;
  return keep;
}

int32_t kn_cpu_sample_draw(const int32_t *ids, const float *probs, int n, double u, int skip,
                           double skip_p) {
  double target = u * (1.0 - skip_p), cum = 0;
  int last = -1;
  for (int i = 0; i < n; i++) {
    if (i == skip || probs[i] <= 0) continue;
    cum += probs[i];
    last = i;
    if (target < cum) return ids[i];
  }
  return last >= 0 ? ids[last] : ids[0];
}

/* ---- one row, and the backend op ---------------------------------------------------- */

/* Samples from work[vocab] (processed in place); raw: the unprocessed logits
 * for logprobs (or NULL). */
static int sample_row(struct kn_cpu_sampler *s, float *work, const float *raw,
                      const struct kn_sample_params *p, struct kn_sample_out *out) {
  const int32_t *ids;
  const float *probs;
  int n;
  int rc = kn_cpu_sample_dist(s, work, p, &ids, &probs, &n);
  if (rc) return rc;
  out->token = n == 1 ? ids[0]
                      : kn_cpu_sample_draw(ids, probs, n,
                                           kn_cpu_sample_uniform(p->seed, p->counter, 0), -1, 0);
  kn_cpu_sample_logprobs(s, raw, p, out);
  return 0;
}

int kn_cpu_sample_row(struct kn_cpu_sampler *s, float *logits, const struct kn_sample_params *p,
                      struct kn_sample_out *out) {
  return sample_row(s, logits, kn_cpu_sample_save_raw(s, logits, p), p, out);
}

/* Nothing changes the row's logits: no penalty, no bias. */
static int unchanged(const struct kn_sample_params *p) {
  return p->repetition_penalty == 1.0f && p->frequency_penalty == 0.0f &&
         p->presence_penalty == 0.0f && p->n_bias == 0;
}

/* Greedy with nothing to apply: the token is the argmax of the row as it is,
 * so the row needs no private copy. */
static int plain_greedy(const struct kn_sample_params *p) {
  return p->temperature < 1e-5f && unchanged(p) && !p->allow;
}

struct sample_job {
  struct kn_cpu_ctx *c;
  struct kn_sample_out *out;
  const float *logits;
  ptrdiff_t ld;
  int V;
  const struct kn_sample_params *params;
  int rc; /* the first error any thread met (0: none) */
};

/* Rows [t0, t1) on pool thread ith. Each row's result depends on the row
 * alone, whichever thread takes it. A thread makes its sampler (about 24
 * bytes per vocabulary entry) the first time it meets a row that needs one:
 * greedy rows without penalties need none, so a many-core machine serving
 * greedy requests holds no per-thread scratch. */
static void sample_run(void *arg, long long t0, long long t1, int ith) {
  struct sample_job *j = arg;
  struct kn_cpu_sampler **sp = &j->c->samplers[ith];
  for (long long t = t0; t < t1; t++) {
    const float *row = j->logits + t * j->ld;
    const struct kn_sample_params *p = &j->params[t];
    struct kn_sample_out *o = &j->out[t];
    int rc;
    if (plain_greedy(p)) {
      if (!(rc = kn_sample_params_check(p))) {
        kn_cpu_op_argmax(NULL, &o->token, NULL, row, j->V, 1, j->V);
        o->n_top = 0;
        o->logprob = 0;
        if (p->n_logprobs >= 0) raw_logprobs(row, j->V, p->n_logprobs, o);
      }
    } else {
      if (*sp && (*sp)->vocab != j->V) {
        kn_cpu_sampler_destroy(*sp);
        *sp = NULL;
      }
      if (!*sp && (rc = kn_cpu_sampler_create(j->V, sp))) {
        /* rc says why */
      } else if (p->allow && unchanged(p)) {
        /* a masked row without penalties or biases is only read: its allowed logits are
         * compacted before anything is done to them */
        rc = sample_row(*sp, (float *)(uintptr_t)row, p->n_logprobs >= 0 ? row : NULL, p, o);
      } else {
        memcpy((*sp)->work, row, (size_t)j->V * sizeof(float));
        rc = sample_row(*sp, (*sp)->work, p->n_logprobs >= 0 ? row : NULL, p, o);
      }
    }
    if (rc) {
      int none = 0;
      __atomic_compare_exchange_n(&j->rc, &none, rc, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    }
  }
}

int kn_cpu_op_sample(void *ctx, struct kn_sample_out *out, const float *logits, ptrdiff_t ld, int T,
                     int V, const struct kn_sample_params *params) {
  struct sample_job j = {ctx, out, logits, ld, V, params, 0};
  kn_cpu_pool_run(j.c->pool, T, 1, sample_run, &j);
  return j.rc;
}
