/* wk-sampler.c — penalties, temperature, min-p, top-k, top-p, seeded draws,
 * raw logprobs and speculative verification (see wk-sampler.h).
 *
 * Large vocabularies (262144) are never sorted whole: top-k keeps a heap of
 * k entries; top-p gathers the tokens above a logit threshold, lowering it
 * until the gathered mass reaches top_p, and sorts only those. */
#include "worker/wk-sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"

struct wk_cand {
  float l;    /* processed logit */
  int32_t id;
};

struct wk_sampler {
  int vocab;
  struct wk_cand *cand; /* [vocab] candidate scratch */
  int32_t *ids;         /* [vocab] final distribution ids */
  float *probs;         /* [vocab] final distribution probabilities */
  float *raw;           /* [vocab] copy of the raw logits, when logprobs are asked */
};

void wk_sampling_params_default(struct wk_sampling_params *p) {
  memset(p, 0, sizeof(*p));
  p->temperature = 1.0f;
  p->top_k = 0;
  p->top_p = 1.0f;
  p->repetition_penalty = 1.0f;
  p->n_logprobs = -1;
}

/* ---- counter-based random numbers ------------------------------------------ */

static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double wk_sampler_uniform(uint64_t seed, uint64_t token_index, uint32_t stream) {
  uint64_t z = splitmix64(splitmix64(seed) ^ (token_index * 4 + stream) * 0xD1B54A32D192ED03ull);
  return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- penalty state ------------------------------------------------------------ */

void wk_penalty_init(struct wk_penalty_state *st) { memset(st, 0, sizeof(*st)); }

void wk_penalty_free(struct wk_penalty_state *st) {
  free(st->keys);
  free(st->counts);
  memset(st, 0, sizeof(*st));
}

void wk_penalty_reset(struct wk_penalty_state *st) {
  if (st->keys) memset(st->keys, 0xff, (size_t)st->cap * sizeof(int32_t));
  st->used = 0;
}

static uint32_t hash_id(int32_t id) { return (uint32_t)id * 2654435761u; }

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
    while (keys[h] >= 0) h = (h + 1) & (uint32_t)(cap - 1);
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
  while (st->keys[h] >= 0 && st->keys[h] != id) h = (h + 1) & mask;
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

static void apply_penalties(float *logits, int vocab, const struct wk_sampling_params *p,
                            const struct wk_penalty_state *st) {
  if (!st || !st->keys) return;
  int rep = p->repetition_penalty > 0 && p->repetition_penalty != 1.0f;
  int freq = p->frequency_penalty != 0.0f, pres = p->presence_penalty != 0.0f;
  if (!rep && !freq && !pres) return;
  for (int i = 0; i < st->cap; i++) {
    int32_t id = st->keys[i];
    if (id < 0 || id >= vocab) continue;
    float l = logits[id];
    if (rep) l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
    if (st->counts[i] > 0) {
      l -= p->frequency_penalty * (float)st->counts[i];
      if (pres) l -= p->presence_penalty;
    }
    logits[id] = l;
  }
}

/* ---- sampler ------------------------------------------------------------------- */

struct wk_sampler *wk_sampler_create(int vocab) {
  if (vocab <= 0) return NULL;
  struct wk_sampler *s = calloc(1, sizeof(*s));
  if (!s) return NULL;
  s->vocab = vocab;
  s->cand = malloc((size_t)vocab * sizeof(*s->cand));
  s->ids = malloc((size_t)vocab * sizeof(int32_t));
  s->probs = malloc((size_t)vocab * sizeof(float));
  s->raw = malloc((size_t)vocab * sizeof(float));
  if (!s->cand || !s->ids || !s->probs || !s->raw) {
    wk_sampler_destroy(s);
    return NULL;
  }
  return s;
}

void wk_sampler_destroy(struct wk_sampler *s) {
  if (!s) return;
  free(s->cand);
  free(s->ids);
  free(s->probs);
  free(s->raw);
  free(s);
}

static int check_params(const struct wk_sampling_params *p) {
  if (!(p->temperature >= 0) || !(p->top_p > 0 && p->top_p <= 1) ||
      !(p->min_p >= 0 && p->min_p <= 1) || !(p->repetition_penalty > 0) ||
      p->n_logprobs > WK_MAX_LOGPROBS)
    return CM_ERR_INVAL;
  return 0;
}

static int is_greedy(const struct wk_sampling_params *p) { return p->temperature < 1e-5f; }

/* Raw logprobs: log-softmax of the unprocessed logits; top n best first. */
static void raw_logprobs(const float *logits, int vocab, int n, int32_t token,
                         struct wk_sample_result *out) {
  float m = -INFINITY;
  for (int i = 0; i < vocab; i++)
    if (logits[i] > m) m = logits[i];
  double z = 0;
  for (int i = 0; i < vocab; i++) z += exp((double)(logits[i] - m));
  float lse = m + (float)log(z);
  out->logprob = logits[token] - lse;
  out->n_top = 0;
  for (int i = 0; i < vocab && n > 0; i++) {
    float l = logits[i];
    int k = out->n_top;
    if (k == n && l <= out->top_logprobs[n - 1]) continue;
    if (k < n) out->n_top++;
    else k = n - 1;
    /* insertion: ties keep the lower id first */
    while (k > 0 && out->top_logprobs[k - 1] < l) {
      out->top_logprobs[k] = out->top_logprobs[k - 1];
      out->top_ids[k] = out->top_ids[k - 1];
      k--;
    }
    out->top_logprobs[k] = l;
    out->top_ids[k] = i;
  }
  for (int k = 0; k < out->n_top; k++) out->top_logprobs[k] -= lse;
}

static int cand_desc(const void *a, const void *b) {
  const struct wk_cand *x = a, *y = b;
  if (x->l != y->l) return x->l > y->l ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* min-heap on l (then larger id is "smaller", so ties keep lower ids) */
static int heap_less(const struct wk_cand *a, const struct wk_cand *b) {
  return a->l < b->l || (a->l == b->l && a->id > b->id);
}

static void heap_sift_down(struct wk_cand *h, int n, int i) {
  for (;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < n && heap_less(&h[l], &h[m])) m = l;
    if (r < n && heap_less(&h[r], &h[m])) m = r;
    if (m == i) return;
    struct wk_cand t = h[i];
    h[i] = h[m];
    h[m] = t;
    i = m;
  }
}

static int32_t argmax(const float *logits, int vocab) {
  int32_t best = 0;
  for (int i = 1; i < vocab; i++)
    if (logits[i] > logits[best]) best = i;
  return best;
}

int wk_sampler_dist(struct wk_sampler *s, float *logits, const struct wk_sampling_params *p,
                    const struct wk_penalty_state *st, const int32_t **ids_out,
                    const float **probs_out, int *n_out) {
  int rc = check_params(p);
  if (rc) return rc;
  const int V = s->vocab;
  apply_penalties(logits, V, p, st);
  if (is_greedy(p)) {
    s->ids[0] = argmax(logits, V);
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
  int topk = p->top_k > 0 && p->top_k < V ? p->top_k : 0;
  int n = 0, sorted = 0;
  double zc; /* normaliser of the candidate set's probabilities */

  if (topk) {
    struct wk_cand *h = s->cand;
    for (int i = 0; i < V; i++) {
      float l = logits[i];
      if (!(l >= cut_minp)) continue;
      struct wk_cand c = {l, i};
      if (n < topk) {
        h[n++] = c;
        if (n == topk)
          for (int j = topk / 2 - 1; j >= 0; j--) heap_sift_down(h, n, j);
      } else if (heap_less(&h[0], &c)) {
        h[0] = c;
        heap_sift_down(h, n, 0);
      }
    }
    qsort(h, (size_t)n, sizeof(*h), cand_desc);
    sorted = 1;
    zc = 0;
    for (int i = 0; i < n; i++) zc += exp((double)(h[i].l - m));
  } else {
    double z = 0;
    for (int i = 0; i < V; i++)
      if (logits[i] >= cut_minp) z += exp((double)(logits[i] - m));
    zc = z;
    if (p->top_p < 1.0f) {
      /* gather above a falling threshold until the mass reaches top_p */
      for (float drop = 8.0f;; drop *= 2.0f) {
        float cut = m - drop;
        if (cut < cut_minp) cut = cut_minp;
        n = 0;
        double mass = 0;
        for (int i = 0; i < V; i++)
          if (logits[i] >= cut) {
            s->cand[n++] = (struct wk_cand){logits[i], i};
            mass += exp((double)(logits[i] - m));
          }
        if (mass / z >= (double)p->top_p || cut == cut_minp || drop > 1e4f) break;
      }
      qsort(s->cand, (size_t)n, sizeof(*s->cand), cand_desc);
      sorted = 1;
    } else {
      for (int i = 0; i < V; i++)
        if (logits[i] >= cut_minp) s->cand[n++] = (struct wk_cand){logits[i], i};
    }
  }
  if (n == 0) return CM_ERR_INVAL;

  /* top-p over the (sorted) candidates, then renormalise what is kept */
  int keep = n;
  if (sorted && p->top_p < 1.0f) {
    double cum = 0;
    for (int i = 0; i < n; i++) {
      if (cum >= (double)p->top_p * zc) {
        keep = i;
        break;
      }
      cum += exp((double)(s->cand[i].l - m));
    }
    if (keep < 1) keep = 1;
  }
  double zk = 0;
  for (int i = 0; i < keep; i++) zk += exp((double)(s->cand[i].l - m));
  for (int i = 0; i < keep; i++) {
    s->ids[i] = s->cand[i].id;
    s->probs[i] = (float)(exp((double)(s->cand[i].l - m)) / zk);
  }
  *ids_out = s->ids;
  *probs_out = s->probs;
  *n_out = keep;
  return 0;
}

/* Draws from a distribution with uniform u; skips index `skip` (or -1) whose
 * mass is `skip_p`, renormalising the rest. */
static int32_t draw(const int32_t *ids, const float *probs, int n, double u, int skip,
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

static void fill_logprobs(struct wk_sampler *s, const float *raw, const struct wk_sampling_params *p,
                          struct wk_sample_result *out) {
  out->n_top = 0;
  out->logprob = 0;
  if (p->n_logprobs >= 0) raw_logprobs(raw, s->vocab, p->n_logprobs, out->token, out);
}

/* Logprobs are of the raw logits, which processing overwrites: keep a copy. */
static const float *save_raw(struct wk_sampler *s, const float *logits,
                             const struct wk_sampling_params *p) {
  if (p->n_logprobs < 0) return NULL;
  memcpy(s->raw, logits, (size_t)s->vocab * sizeof(float));
  return s->raw;
}

int wk_sample(struct wk_sampler *s, float *logits, const struct wk_sampling_params *p,
              const struct wk_penalty_state *st, uint64_t token_index,
              struct wk_sample_result *out) {
  const float *raw = save_raw(s, logits, p);
  const int32_t *ids;
  const float *probs;
  int n;
  int rc = wk_sampler_dist(s, logits, p, st, &ids, &probs, &n);
  if (rc == 0) {
    out->token = n == 1 ? ids[0] : draw(ids, probs, n, wk_sampler_uniform(p->seed, token_index, 0), -1, 0);
    if (raw) fill_logprobs(s, raw, p, out);
    else out->n_top = 0, out->logprob = 0;
  }
  return rc;
}

int wk_sample_verify(struct wk_sampler *s, float *logits, const struct wk_sampling_params *p,
                     const struct wk_penalty_state *st, uint64_t token_index, int32_t draft,
                     int *accepted, struct wk_sample_result *out) {
  const float *raw = save_raw(s, logits, p);
  const int32_t *ids;
  const float *probs;
  int n;
  int rc = wk_sampler_dist(s, logits, p, st, &ids, &probs, &n);
  if (rc == 0) {
    int at = -1;
    for (int i = 0; i < n; i++)
      if (ids[i] == draft) {
        at = i;
        break;
      }
    double pd = at >= 0 ? probs[at] : 0.0;
    if (at >= 0 && (pd >= 1.0 || wk_sampler_uniform(p->seed, token_index, 1) < pd)) {
      *accepted = 1;
      out->token = draft;
    } else {
      *accepted = 0;
      out->token = draw(ids, probs, n, wk_sampler_uniform(p->seed, token_index, 2), at, pd);
    }
    if (raw) fill_logprobs(s, raw, p, out);
    else out->n_top = 0, out->logprob = 0;
  }
  return rc;
}
