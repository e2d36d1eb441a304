/* kn-cpu-ops-misc.c — CPU ops that need no SIMD table entry: embedding
 * gather, RoPE, argmax and the MoE router's softmax + top-k.
 *
 * Each is exact or close to it in plain C and cheap next to the matmuls:
 * the gather is one rounding (widen, multiply), RoPE computes each cos/sin
 * once per token in double and rounds it to f32 (as a float32 reference
 * would hold it), argmax is exact. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu-avx2.h"
#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/kn-quant.h"

/* ---- embedding ---------------------------------------------------------- */

int kn_cpu_op_embed(void *p, float *out, ptrdiff_t ldo, const void *table, enum kn_dtype tdt, int H,
                    const int32_t *ids, int T, float scale) {
  (void)p;
  size_t row_bytes = kn_row_bytes(tdt, (size_t)H);
  for (int t = 0; t < T; t++) {
    float *o = out + (ptrdiff_t)t * ldo;
    if (ids[t] < 0) { /* a row another tensor-parallel rank holds */
      memset(o, 0, sizeof(float) * (size_t)H);
      continue;
    }
    const void *row = (const char *)table + (size_t)ids[t] * row_bytes;
    switch (tdt) {
    case KN_DTYPE_BF16: {
      const uint16_t *r = row;
      for (int i = 0; i < H; i++)
        o[i] = kn_bf16_to_f32(r[i]) * scale;
      break;
    }
    case KN_DTYPE_F16: {
      const uint16_t *r = row;
      for (int i = 0; i < H; i++)
        o[i] = kn_f16_to_f32(r[i]) * scale;
      break;
    }
    case KN_DTYPE_F32: {
      const float *r = row;
      for (int i = 0; i < H; i++)
        o[i] = r[i] * scale;
      break;
    }
    default: /* a block format: the row's values, then the scale */
      kn_dequant_row(tdt, row, o, (size_t)H);
      for (int i = 0; i < H; i++)
        o[i] = o[i] * scale;
      break;
    }
  }
  return 0;
}

/* ---- RoPE --------------------------------------------------------------- */

struct rope_task {
  float *x;
  ptrdiff_t ldx;
  int T, heads, D;
  const int32_t *pos;
  const float *inv_freq;
  float *cs, *sn; /* [T][D / 2] */
  int fill;       /* 1: compute cs and sn first (else they hold these positions') */
  int avx2;       /* the table has AVX2: rope_head_avx2 */
};

/* One head's pairs (x[i], x[i + half]) rotated by (cs[i], sn[i]), each written as
 * two rounded products and one sum (no fused multiply-add). */
static void rope_head(float *x, const float *cs, const float *sn, int i, int half) {
  for (; i < half; i++) {
    float x0 = x[i], x1 = x[i + half];
    float a0 = x0 * cs[i], b0 = x1 * sn[i];
    float a1 = x1 * cs[i], b1 = x0 * sn[i];
    x[i] = a0 - b0;
    x[i + half] = a1 + b1;
  }
}

/* rope_head eight pairs at a time: the same roundings lane by lane. */
KN_AVX2 static void rope_head_avx2(float *x, const float *cs, const float *sn, int half) {
  int i = 0;
  for (; i + 8 <= half; i += 8) {
    const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + half);
    const __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(sn + i);
    _mm256_storeu_ps(x + i, _mm256_sub_ps(_mm256_mul_ps(x0, c), _mm256_mul_ps(x1, s)));
    _mm256_storeu_ps(x + i + half, _mm256_add_ps(_mm256_mul_ps(x1, c), _mm256_mul_ps(x0, s)));
  }
  rope_head(x, cs, sn, i, half);
}

static void rope_run(void *arg, long long b, long long e, int ith) {
  struct rope_task *r = arg;
  const int half = r->D / 2;
  (void)ith;
  for (long long t = b; t < e; t++) {
    float *cs = r->cs + t * half, *sn = r->sn + t * half;
    if (r->fill) {
      float fp = (float)r->pos[t];
      for (int i = 0; i < half; i++) {
        float a = fp * r->inv_freq[i]; /* the angle rounded to f32, as a float32 reference has it */
        cs[i] = (float)cos((double)a);
        sn[i] = (float)sin((double)a);
      }
    }
    float *row = r->x + t * r->ldx;
    for (int h = 0; h < r->heads; h++) {
      float *x = row + (ptrdiff_t)h * r->D;
      if (r->avx2)
        rope_head_avx2(x, cs, sn, half);
      else
        rope_head(x, cs, sn, 0, half);
    }
  }
}

/* The cache entry for (D, pos[0 .. T), inv_freq) and whether it already holds
 * their cos and sin: a step's q and k of every layer of one kind share them,
 * so they are computed once per kind and step, not twice per layer. The entry
 * is matched by contents, not by address. NULL: out of memory. */
static struct kn_cpu_rope_cache *rope_entry(struct kn_cpu_ctx *ctx, int T, int D,
                                            const int32_t *pos, const float *inv_freq, int *hit) {
  const int half = D / 2;
  uint64_t tick = ++ctx->rope_tick;
  for (int i = 0; i < 2; i++) {
    struct kn_cpu_rope_cache *c = &ctx->rope[i];
    if (c->D == D && c->T == T && !memcmp(c->pos, pos, sizeof(int32_t) * (size_t)T) &&
        !memcmp(c->inv_freq, inv_freq, sizeof(float) * (size_t)half)) {
      c->used = tick;
      *hit = 1;
      return c;
    }
  }
  struct kn_cpu_rope_cache *c =
      ctx->rope[0].used <= ctx->rope[1].used ? &ctx->rope[0] : &ctx->rope[1];
  c->T = c->D = 0;    /* invalid until filled */
  if (T > c->cap_T) { /* cs: cap_T rows of cos, then cap_T of sin, KN_MAX_HEAD_DIM / 2 each */
    int cap = T > 2 * c->cap_T ? T : 2 * c->cap_T;
    int32_t *np = realloc(c->pos, sizeof(int32_t) * (size_t)cap);
    if (np) c->pos = np;
    float *nc = np ? realloc(c->cs, sizeof(float) * (size_t)cap * KN_MAX_HEAD_DIM) : NULL;
    if (!nc) return NULL;
    c->cs = nc;
    c->cap_T = cap;
  }
  memcpy(c->pos, pos, sizeof(int32_t) * (size_t)T);
  memcpy(c->inv_freq, inv_freq, sizeof(float) * (size_t)half);
  c->T = T;
  c->D = D;
  c->used = tick;
  *hit = 0;
  return c;
}

int kn_cpu_op_rope(void *p, float *x, ptrdiff_t ldx, int T, int heads, int D, const int32_t *pos,
                   const float *inv_freq) {
  struct kn_cpu_ctx *ctx = p;
  if (D > KN_MAX_HEAD_DIM) return CM_ERR_UNSUPPORTED;
  if (T <= 0) return 0;
  int hit = 0;
  struct kn_cpu_rope_cache *c = rope_entry(ctx, T, D, pos, inv_freq, &hit);
  if (!c) return CM_ERR_NOMEM;
  struct rope_task r = {x,
                        ldx,
                        T,
                        heads,
                        D,
                        pos,
                        inv_freq,
                        c->cs,
                        c->cs + (size_t)c->cap_T * (size_t)(D / 2),
                        !hit,
                        ctx->dsp.isa >= KN_CPU_ISA_AVX2};
  kn_cpu_pool_run(ctx->pool, T, (double)T * heads * D < (1 << 16) ? T : 4, rope_run, &r);
  return 0;
}

/* ---- argmax ------------------------------------------------------------- */

int kn_cpu_argmax_row_ref(const float *row, int n, float *max_out) {
  int best = -1;
  float bv = 0.0f;
  for (int i = 0; i < n; i++) {
    float v = row[i];
    if (v != v) continue; /* NaN never wins */
    if (best < 0 || v > bv) {
      best = i;
      bv = v;
    }
  }
  if (max_out) *max_out = best < 0 ? NAN : bv;
  return best;
}

int kn_cpu_argmax_row(const float *row, int n, float *max_out) {
  /* every version gives the same index and value; the choice is cached */
  static int level = -1;
  int a = __atomic_load_n(&level, __ATOMIC_RELAXED);
  if (a < 0) {
    const enum kn_cpu_isa isa = kn_cpu_isa_detect();
    a = isa >= KN_CPU_ISA_AVX512 ? 2 : isa >= KN_CPU_ISA_AVX2 ? 1 : 0;
    __atomic_store_n(&level, a, __ATOMIC_RELAXED);
  }
  return a == 2   ? kn_cpu_argmax_row_avx512(row, n, max_out)
         : a == 1 ? kn_cpu_argmax_row_avx2(row, n, max_out)
                  : kn_cpu_argmax_row_ref(row, n, max_out);
}

int kn_cpu_op_argmax(void *p, int32_t *ids, float *max_out, const float *logits, ptrdiff_t ld,
                     int T, int V) {
  (void)p;
  for (int t = 0; t < T; t++) {
    float mx;
    int best = kn_cpu_argmax_row(logits + (ptrdiff_t)t * ld, V, &mx);
    ids[t] = best < 0 ? 0 : best;
    if (max_out) max_out[t] = mx;
  }
  return 0;
}

/* ---- MoE router --------------------------------------------------------- */

int kn_cpu_op_router_topk(void *p, int32_t *ids, float *weights, const float *logits, ptrdiff_t ld,
                          int T, int E, int k, const float *expert_scale) {
  (void)p;
  for (int t = 0; t < T; t++) {
    const float *row = logits + (ptrdiff_t)t * ld;
    int32_t *id = ids + (ptrdiff_t)t * k;
    float *wt = weights + (ptrdiff_t)t * k;
    double mx = -INFINITY;
    for (int e = 0; e < E; e++)
      if (row[e] > mx) mx = row[e];
    double sum = 0.0;
    for (int e = 0; e < E; e++)
      sum += exp((double)row[e] - mx);
    /* selection: k passes, each taking the largest not yet taken (lower index on ties);
     * NaN logits are never taken while a number is left */
    for (int j = 0; j < k; j++) {
      int best = -1;
      for (int e = 0; e < E; e++) {
        int taken = 0;
        for (int i = 0; i < j; i++)
          taken |= id[i] == e;
        if (taken) continue;
        if (best < 0 || row[e] > row[best] || (row[best] != row[best] && row[e] == row[e]))
          best = e;
      }
      id[j] = best;
    }
    double top = 0.0;
    double pr[64];
    for (int j = 0; j < k; j++) {
      double pj = exp((double)row[id[j]] - mx) / sum;
      if (j < 64) pr[j] = pj;
      top += pj;
    }
    for (int j = 0; j < k; j++) {
      double pj = j < 64 ? pr[j] : exp((double)row[id[j]] - mx) / sum;
      double w = top > 0.0 ? pj / top : 1.0 / k;
      if (expert_scale) w *= expert_scale[id[j]];
      wt[j] = (float)w;
    }
  }
  return 0;
}
