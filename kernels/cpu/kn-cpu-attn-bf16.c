/* kn-cpu-attn-bf16.c — the bf16 mode's paged attention on AVX-512-BF16: Q·K
 * and P·V as vdpbf16ps against the bf16 KV cache, 32 products per
 * instruction, with the queries and the probabilities rounded to bf16 (as a
 * GPU's bf16 attention and transformers' bf16 mode take them). The blocks,
 * their order, the online softmax and the rows that share a block are those
 * of kn-cpu-attn-avx2.c (see there); only the two products change.
 *
 *   - a score is one 16-lane accumulator over the head dim in steps of 32,
 *     then kn_bf16_reduce16's tree, then the scale (and softcap): computed 4
 *     queries x 4 keys at a time, the 16 accumulators summed at once;
 *   - P·V takes the block's visible keys in pairs (in position order; an odd
 *     last one pairs with a zero row and probability 0): each pair's two V
 *     rows interleaved element by element (vpunpck{l,h}wd within each 128-bit
 *     lane) against the pair's probabilities broadcast. The accumulators hold
 *     the head dims in that interleaved order (per 32 dims: 0-3, 8-11, 16-19,
 *     24-27, then 4-7, 12-15, 20-23, 28-31) until the row is written.
 *
 * Each score and output element has one sequence of operations whatever rows
 * share the call (a decode row's query heads, a tile of prefill rows), so a
 * row's bits do not depend on the batch or the chunking. Head dims that are
 * not a multiple of 32, and an f32 cache, go to the AVX2 kernels. */
#include <immintrin.h>
#include <math.h>

#include "kernels/cpu/kn-cpu-avx2.h"
#include "kernels/cpu/kn-cpu-avx512bf16.h"
#include "kernels/cpu/kn-cpu-impl.h"

#define INLINE static inline __attribute__((always_inline))

const uint16_t kn_bf16_zero_row[KN_MAX_HEAD_DIM] __attribute__((aligned(64)));

/* The query vectors of one call: the walk's state (accumulators in the
 * interleaved order above) and the queries rounded to bf16. */
struct qv {
  struct kn_cpu_attn_vecs w;
  const uint16_t *q[KN_ATTN_MAX_VEC];
  _Alignas(64) uint16_t qb[KN_ATTN_MAX_VEC][KN_MAX_HEAD_DIM];
};

/* sc[i][col[j]] for NQ queries x NK keys (<= 4 each): 16 accumulators (the
 * unused ones stay zero), each key block loaded once for the NQ queries. */
KN_BF16 INLINE void qk_tile(float *const *sc, const uint16_t *const *q, const void *const *k,
                            const int *col, int D, float scale, const int NQ, const int NK) {
  __m512 a[16];
  _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
  for (int d = 0; d < D; d += 32) {
    __m512i kv[4];
    _Pragma("GCC unroll 4") for (int j = 0; j < NK; j++) kv[j] =
        _mm512_loadu_si512((const uint16_t *)k[j] + d);
    _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++) {
      __m512bh qv = (__m512bh)_mm512_load_si512(q[i] + d);
      _Pragma("GCC unroll 4") for (int j = 0; j < NK; j++) a[i * 4 + j] =
          _mm512_dpbf16_ps(a[i * 4 + j], qv, (__m512bh)kv[j]);
    }
  }
  float r[16];
  _mm512_storeu_ps(r, kn_bf16_reduce16(a));
  _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++)
    _Pragma("GCC unroll 4") for (int j = 0; j < NK; j++) sc[i][col[j]] = r[i * 4 + j] * scale;
}

KN_BF16 static void qk_scores(float *const *sc, const uint16_t *const *q, int nq,
                              const void *const *k, const int *col, int nk, int D, float scale,
                              float softcap) {
  for (int i = 0; i < nq; i += 4) {
    const int NQ = nq - i < 4 ? nq - i : 4;
    for (int j = 0; j < nk; j += 4) {
      const int NK = nk - j < 4 ? nk - j : 4;
#define QK(a, b)                                                                                   \
  case (a) * 4 + (b): qk_tile(sc + i, q + i, k + j, col + j, D, scale, a, b); break
      switch (NQ * 4 + NK) {
        QK(1, 1); QK(1, 2); QK(1, 3); QK(1, 4);
        QK(2, 1); QK(2, 2); QK(2, 3); QK(2, 4);
        QK(3, 1); QK(3, 2); QK(3, 3); QK(3, 4);
        QK(4, 1); QK(4, 2); QK(4, 3); QK(4, 4);
      default: break;
      }
#undef QK
    }
    if (softcap > 0.0f) kn_cpu_attn_softcap(sc + i, NQ, col, nk, softcap);
  }
}

/* NR rows (<= 4) x ND blocks of 32 dims (<= 2) at dims d: acc *= corr, then
 * acc += the pairs' probabilities times their interleaved V, pair by pair. */
KN_BF16 INLINE void pv_tile(float *const *acc, const uint32_t (*pp)[KN_ATTN_BLOCK / 2],
                            const float *corr, const void *const *vp, int n_pairs, int d,
                            const int NR, const int ND) {
  __m512 a[4][4];
  _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++) {
    __m512 cv = _mm512_set1_ps(corr[r]);
    _Pragma("GCC unroll 4") for (int e = 0; e < 2 * ND; e++) a[r][e] =
        _mm512_mul_ps(_mm512_load_ps(acc[r] + d + 16 * e), cv);
  }
  for (int k = 0; k < n_pairs; k++) {
    const uint16_t *va = vp[2 * k], *vb = vp[2 * k + 1];
    __m512i iv[4];
    _Pragma("GCC unroll 2") for (int e = 0; e < ND; e++) {
      __m512i x = _mm512_loadu_si512(va + d + 32 * e), y = _mm512_loadu_si512(vb + d + 32 * e);
      iv[2 * e] = _mm512_unpacklo_epi16(x, y);
      iv[2 * e + 1] = _mm512_unpackhi_epi16(x, y);
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++) {
      __m512bh pv = (__m512bh)_mm512_set1_epi32((int)pp[r][k]);
      _Pragma("GCC unroll 4") for (int e = 0; e < 2 * ND; e++) a[r][e] =
          _mm512_dpbf16_ps(a[r][e], pv, (__m512bh)iv[e]);
    }
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++)
    _Pragma("GCC unroll 4") for (int e = 0; e < 2 * ND; e++)
      _mm512_store_ps(acc[r] + d + 16 * e, a[r][e]);
}

/* Each shape its own function, so that its 16 accumulators and 4 V vectors
 * get the registers (inlined into one switch they were spilled). */
typedef void (*pv_fn)(float *const *acc, const uint32_t (*pp)[KN_ATTN_BLOCK / 2],
                      const float *corr, const void *const *vp, int n_pairs, int d);
#define DEF_PV(NR, ND)                                                                             \
  KN_BF16 static void pv_##NR##x##ND(float *const *acc, const uint32_t (*pp)[KN_ATTN_BLOCK / 2], \
                                     const float *corr, const void *const *vp, int n_pairs,        \
                                     int d) {                                                      \
    pv_tile(acc, pp, corr, vp, n_pairs, d, NR, ND);                                                \
  }
DEF_PV(1, 1)
DEF_PV(1, 2)
DEF_PV(2, 1)
DEF_PV(2, 2)
DEF_PV(3, 1)
DEF_PV(3, 2)
DEF_PV(4, 1)
DEF_PV(4, 2)
static const pv_fn pv_fns[5][3] = {{NULL},
                                   {NULL, pv_1x1, pv_1x2},
                                   {NULL, pv_2x1, pv_2x2},
                                   {NULL, pv_3x1, pv_3x2},
                                   {NULL, pv_4x1, pv_4x2}};

/* One key block folded into nr rows: each row's softmax step, its
 * probabilities of the visible keys (vj) rounded to bf16 in pairs, then the
 * V half in tiles of 4 rows x 64 dims. vp holds the visible keys' V rows
 * and room for the odd partner. */
KN_BF16 static void update_rows(float *const *p, int nr, const void **vp, const int *vj, int n_vis,
                                float *m, float *l, float *const *acc, int D) {
  float corr[KN_ATTN_MAX_VEC];
  _Alignas(64) uint32_t pp[KN_ATTN_MAX_VEC][KN_ATTN_BLOCK / 2];
  kn_bf16_block_probs(p, nr, vj, n_vis, m, l, corr, pp);
  if (n_vis & 1) vp[n_vis] = kn_bf16_zero_row;
  const int n_pairs = (n_vis + 1) / 2;
  for (int r = 0; r < nr; r += 4) {
    const int NR = nr - r < 4 ? nr - r : 4;
    for (int d = 0; d < D; d += 64)
      pv_fns[NR][D - d >= 64 ? 2 : 1](acc + r, (const uint32_t(*)[KN_ATTN_BLOCK / 2])(pp + r),
                                      corr + r, vp, n_pairs, d);
  }
}

/* kn_cpu_attn_fold_fn: block b's keys in mask folded into vectors idx[0 .. k). */
KN_BF16 static void fold(void *ctx, int b, uint32_t mask, const int *idx, int k) {
  struct qv *v = ctx;
  const struct kn_cpu_attn_job *job = v->w.job;
  struct kn_cpu_attn_group g;
  const uint16_t *gq[KN_ATTN_MAX_VEC] = {0}; /* (k >= 1: gcc cannot tell) */
  kn_cpu_attn_group_take(&g, &v->w, b, mask, idx, k);
  for (int j = 0; j < k; j++)
    gq[j] = v->q[idx[j]];
  qk_scores(g.s, gq, k, g.kp, g.vj, g.n_vis, job->view->head_dim, job->scale, job->softcap);
  update_rows(g.s, k, g.vp, g.vj, g.n_vis, g.m, g.l, g.acc, job->view->head_dim);
  kn_cpu_attn_group_give(&g, &v->w, idx, k);
}

/* kn_cpu_attn_run_fn: a set of vectors, their queries rounded to bf16, over
 * their blocks (kn_cpu_attn_walk); then each written: its accumulator in
 * head-dim order over l. */
KN_BF16 static void attn_vectors(void *ctx, const float *const *q) {
  struct qv *v = ctx;
  struct kn_cpu_attn_vecs *w = &v->w;
  const int D = w->job->view->head_dim, n = w->n;
  for (int i = 0; i < n; i++) {
    for (int d = 0; d < D; d += 32) {
      __m512 lo = _mm512_loadu_ps(q[i] + d), hi = _mm512_loadu_ps(q[i] + d + 16);
      _mm512_store_si512(&v->qb[i][d], (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
    v->q[i] = v->qb[i];
  }
  kn_cpu_attn_walk(w, fold, v);
  /* per 32 dims: lanes 0-3 of the low half are dims 0-3, of the high half 4-7, ... */
  const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i i1 =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int i = 0; i < n; i++) {
    __m512 lv = _mm512_set1_ps(w->l[i]);
    for (int d = 0; d < D; d += 32) {
      __m512 a = _mm512_load_ps(&w->acc[i][d]), c = _mm512_load_ps(&w->acc[i][d + 16]);
      _mm512_storeu_ps(w->out[i] + d, _mm512_div_ps(_mm512_permutex2var_ps(a, i0, c), lv));
      _mm512_storeu_ps(w->out[i] + d + 16, _mm512_div_ps(_mm512_permutex2var_ps(a, i1, c), lv));
    }
  }
}

/* kn_cpu_attn_tile_fn of the bf16 mode: rows i0 .. i0 + nr - 1, head by head. */
KN_BF16 void kn_cpu_attn_tile_bf16(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq,
                                   int i0, int nr, int kvh, int g0, int ng) {
  struct qv v; /* not zeroed: kn_cpu_attn_sets sets what the walk reads */
  kn_cpu_attn_bf16_sets(&v.w, job, seq, i0, nr, kvh, g0, ng, attn_vectors, &v);
}

/* kn_cpu_attn_fn of the bf16 mode: query heads g0 .. g0 + ng - 1 of row i, the
 * tile of that one row. */
KN_BF16 void kn_cpu_attn_bf16(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq,
                              int i, int kvh, int g0, int ng) {
  kn_cpu_attn_tile_bf16(job, seq, i, 1, kvh, g0, ng);
}
