/* wk-tp-sample.c — sampling from the ranks' candidate records (see
 * wk-tp-sample.h). */
#include "worker/wk-tp-sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu-sample.h"

static int greedy(const struct kn_sample_params *p) {
  return p->temperature < 1e-5f;
}

static int top_k(const struct kn_sample_params *p, int V) {
  return p->top_k > 0 && p->top_k < V ? p->top_k : 0;
}

/* How many candidates a rank sends for params p. */
static int wanted(const struct kn_sample_params *p, int V) {
  if (greedy(p)) return 1;
  int k = top_k(p, V);
  return k ? k : WK_TP_CANDS;
}

int wk_tp_sample_fits(const struct kn_sample_params *p, int V) {
  if (kn_sample_params_check(p) || p->allow) return 0; /* a mask: the whole row */
  if (greedy(p)) return 1;
  int k = top_k(p, V);
  if (k) return k <= WK_TP_CANDS;
  return p->top_p < 1.0f && p->min_p == 0.0f;
}

/* max and sum(exp(x - max)) of x[n], NaN left out. */
static void exp_sum(const float *x, int n, float *max, double *sum) {
  float m = -INFINITY;
  for (int i = 0; i < n; i++)
    if (x[i] > m) m = x[i];
  double z = 0;
  if (isfinite(m))
    for (int i = 0; i < n; i++)
      if (x[i] == x[i]) z += exp((double)(x[i] - m));
  *max = m;
  *sum = z;
}

void wk_tp_sample_local(struct wk_tp_rec *rec, const float *logits, int32_t off, int n, int V,
                        const struct kn_sample_params *p, float *work) {
  memset(rec, 0, sizeof(*rec));
  memcpy(work, logits, sizeof(float) * (size_t)n);
  kn_cpu_sample_penalise(work, off, n, p);
  float inv_t = greedy(p) ? 1.0f : 1.0f / p->temperature;
  for (int i = 0; i < n; i++) {
    if (!greedy(p)) work[i] *= inv_t;            /* the product kn_sample forms */
    if (work[i] != work[i]) work[i] = -INFINITY; /* a NaN is never a candidate */
  }
  int want = wanted(p, V);
  int32_t ids[WK_TP_CANDS];
  float vals[WK_TP_CANDS];
  rec->n_cand = kn_cpu_sample_top(work, off, n, want < n ? want : n, ids, vals);
  for (int i = 0; i < rec->n_cand; i++)
    rec->cand[i] = (struct wk_tp_cand){vals[i], logits[ids[i] - off], ids[i]};
  rec->more = n > rec->n_cand;
  rec->floor = rec->n_cand ? vals[rec->n_cand - 1] : -INFINITY;
  if (!greedy(p) && !top_k(p, V)) exp_sum(work, n, &rec->p_max, &rec->p_sum);
  if (p->n_logprobs >= 0) {
    exp_sum(logits, n, &rec->raw_max, &rec->raw_sum);
    rec->n_top = kn_cpu_sample_top(logits, off, n, p->n_logprobs, rec->top_ids, rec->top_raw);
  }
}

/* The merge's scratch: every rank's candidates, then the kept distribution. */
struct scratch {
  struct wk_tp_cand *all; /* [world * WK_TP_CANDS] */
  struct kn_cand *c;      /* [world * WK_TP_CANDS] */
  int32_t *ids;           /* [world * WK_TP_CANDS] */
  float *probs;           /* [world * WK_TP_CANDS] */
};

size_t wk_tp_sample_scratch_bytes(int world) {
  size_t n = (size_t)world * WK_TP_CANDS;
  return n * (sizeof(struct wk_tp_cand) + sizeof(struct kn_cand) + sizeof(int32_t) + sizeof(float));
}

static struct scratch split(void *mem, int world) {
  size_t n = (size_t)world * WK_TP_CANDS;
  struct scratch s;
  s.all = mem;
  s.c = (struct kn_cand *)(s.all + n);
  s.ids = (int32_t *)(s.c + n);
  s.probs = (float *)(s.ids + n);
  return s;
}

static int cand_desc(const void *a, const void *b) {
  const struct wk_tp_cand *x = a, *y = b;
  if (x->l != y->l) return x->l > y->l ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* m + log(sum_k sums[k] * exp(maxes[k] - m)): the ranks' normalisers combined
 * relative to m, their largest max. */
static double combine(const struct wk_tp_rec *recs, int world, int n_rows, int r, int raw,
                      float *m_out) {
  float m = -INFINITY;
  for (int k = 0; k < world; k++) {
    const struct wk_tp_rec *q = &recs[(size_t)k * (size_t)n_rows + (size_t)r];
    float x = raw ? q->raw_max : q->p_max;
    if (x > m) m = x;
  }
  double z = 0;
  if (isfinite(m))
    for (int k = 0; k < world; k++) {
      const struct wk_tp_rec *q = &recs[(size_t)k * (size_t)n_rows + (size_t)r];
      z += (raw ? q->raw_sum : q->p_sum) * exp((double)((raw ? q->raw_max : q->p_max) - m));
    }
  *m_out = m;
  return z;
}

/* Raw logprobs of out->token (raw logit `raw`) and the top n over all ranks;
 * all: scratch for world * KN_SAMPLE_MAX_LOGPROBS entries. */
static void logprobs(const struct wk_tp_rec *recs, int world, int n_rows, int r, int n, float raw,
                     struct wk_tp_cand *all, struct kn_sample_out *out) {
  float m;
  double z = combine(recs, world, n_rows, r, 1, &m);
  float lse = m + (float)log(z);
  out->logprob = raw - lse;
  int N = 0;
  for (int k = 0; k < world; k++) {
    const struct wk_tp_rec *q = &recs[(size_t)k * (size_t)n_rows + (size_t)r];
    for (int i = 0; i < q->n_top && i < KN_SAMPLE_MAX_LOGPROBS; i++)
      all[N++] = (struct wk_tp_cand){q->top_raw[i], q->top_raw[i], q->top_ids[i]};
  }
  qsort(all, (size_t)N, sizeof(*all), cand_desc); /* best raw first, lower id on ties */
  out->n_top = N < n ? N : n;
  for (int i = 0; i < out->n_top; i++) {
    out->top_ids[i] = all[i].id;
    out->top_logprobs[i] = all[i].raw - lse;
  }
}

int wk_tp_sample_merge(const struct wk_tp_rec *recs, int world, int n_rows, int r, int V,
                       const struct kn_sample_params *p, void *scratch, struct kn_sample_out *out) {
  struct scratch s = split(scratch, world);
  int N = 0, more = 0;
  float low = -INFINITY; /* everything above the highest floor of a cut slice was sent */
  for (int k = 0; k < world; k++) {
    const struct wk_tp_rec *q = &recs[(size_t)k * (size_t)n_rows + (size_t)r];
    int nc = q->n_cand < WK_TP_CANDS ? q->n_cand : WK_TP_CANDS;
    for (int i = 0; i < nc; i++)
      s.all[N++] = q->cand[i];
    if (q->more) {
      more = 1;
      if (q->floor > low) low = q->floor;
    }
  }
  if (N == 0) return CM_ERR_INVAL;
  qsort(s.all, (size_t)N, sizeof(*s.all), cand_desc);
  int pick = 0; /* index into s.all of the token */
  if (!greedy(p)) {
    float m = s.all[0].l;
    if (!isfinite(m)) return CM_ERR_INVAL; /* all -inf or NaN */
    float cut = p->min_p > 0 ? m + logf(p->min_p) : -INFINITY;
    int k = top_k(p, V), n = 0;
    for (int i = 0; i < N && (!k || n < k); i++)
      if (s.all[i].l >= cut) s.c[n++] = (struct kn_cand){s.all[i].l, i}; /* id: index in all */
    double zc = 0;
    if (k)
      for (int i = 0; i < n; i++)
        zc += exp((double)(s.c[i].l - m));
    else {
      float pm;
      zc = combine(recs, world, n_rows, r, 0, &pm) * exp((double)(pm - m));
    }
    int closed;
    int keep = kn_cpu_sample_keep(s.c, n, 1, m, zc, p->top_p, s.ids, s.probs, &closed);
    /* a top-p set is decided only if nothing left out could belong to it */
    if (!k && more && (!closed || !(s.c[keep - 1].l > low))) return 1;
    pick = keep == 1 ? s.ids[0]
                     : kn_cpu_sample_draw(s.ids, s.probs, keep,
                                          kn_cpu_sample_uniform(p->seed, p->counter, 0), -1, 0);
  }
  out->token = s.all[pick].id;
  out->logprob = 0;
  out->n_top = 0;
  if (p->n_logprobs >= 0) /* s.all is free again once the token is out */
    logprobs(recs, world, n_rows, r, p->n_logprobs, s.all[pick].raw, s.all, out);
  return 0;
}
