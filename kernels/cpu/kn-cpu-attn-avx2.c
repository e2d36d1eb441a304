/* kn-cpu-attn-avx2.c — AVX2 paged attention for one (query, kv head): online
 * softmax over key blocks aligned to absolute positions.
 *
 * For a query at absolute position p, the visible key range [lo, hi] is cut
 * into blocks [b, b + KN_ATTN_BLOCK) with b a multiple of KN_ATTN_BLOCK. Each
 * block's scores are computed (invisible keys are -inf), the running maximum,
 * the rescale of the running sum and accumulator, and the V accumulation run
 * in position order. Everything depends only on p, the keys and the query, so
 * a row gets the same bits alone or batched, and whether its prompt was
 * attended in one chunk, several, or token by token. Head dims that are not a
 * multiple of 8 use the reference kernel.
 *
 * Both halves of a block run as register tiles over several rows at once
 * (the query heads of a GQA group, or the rows of a tile below): the scores
 * as 4 rows x 3 keys (qk_micro: each key vector loaded once for the 4 rows,
 * each query vector once for the 3 keys, 12 accumulators), the V half as 4
 * rows x 24 dims (pv_micro: each V vector loaded once for the 4 rows). Every
 * score and every output element has one fixed sequence of operations (the
 * canonical score: one 8-lane accumulator over the head dim, then the fixed
 * horizontal sum), so which rows share a tile never changes a bit. The
 * block's K and V rows are prefetched when the block is gathered.
 *
 * A call's query vectors (a row's query heads, or up to KN_ATTN_TILE rows of
 * one head) walk their key blocks together (kn_cpu_attn_walk): the vectors
 * that see the same keys of a block score it and fold it in while its K and
 * V are in L1, so a tile reads its key range once instead of once per row,
 * and each row's bits are those it gets alone.
 *
 * The cache is f32, bf16 or fp8 e4m3 (kind 0, 1, 2 below): each K/V vector is
 * widened exactly to f32 as it is loaded (e4m3 through a table of its 256
 * values, times the kv head's scale where the cache has scales), so a cache of
 * any kind gives the bits an f32 cache holding the same values gives. */
#include <math.h>

#include "kernels/cpu/kn-cpu-avx2.h"
#include "kernels/cpu/kn-cpu-impl.h"

/* 8 cache elements from element d of a K or V row of kind 0 (f32), 1 (bf16) or
 * 2 (fp8 e4m3: the values of tab, kn_cpu_e4m3_scaled's), widened exactly. */
KN_AVX2 static inline __m256 kv_ld(const void *base, int d, int kind, const float *tab) {
  if (kind == 1) return kn_avx2_bf16((const uint16_t *)base + d);
  if (kind == 2) {
    __m128i b = _mm_loadl_epi64((const __m128i *)((const uint8_t *)base + d));
    return _mm256_i32gather_ps(tab, _mm256_cvtepu8_epi32(b), 4);
  }
  return _mm256_loadu_ps((const float *)base + d);
}

/* The canonical score of this file: one 8-lane accumulator over D (a
 * multiple of 8), acc = fma(q[d..d+8), k[d..d+8), acc) for d = 0, 8, ...,
 * then the fixed horizontal sum, then the scale. qk_micro computes NQ x NK
 * of them at once (NQ <= 4 queries, NK <= 3 keys: 12 accumulators, the keys'
 * vectors loaded once for all queries and the queries' once for all keys);
 * each score's operations are the same whichever tile it is in. */
KN_AVX2 static inline __attribute__((always_inline)) void
qk_micro(float *const *sc, const float *const *q, const void *const *k, const int *col, int D,
         int kind, const float *tab, float scale, const int NQ, const int NK) {
  __m256 acc[4][3];
  _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++)
    _Pragma("GCC unroll 3") for (int j = 0; j < NK; j++)
      acc[i][j] = _mm256_setzero_ps();
  for (int d = 0; d < D; d += 8) {
    __m256 kv[3];
    _Pragma("GCC unroll 3") for (int j = 0; j < NK; j++) kv[j] = kv_ld(k[j], d, kind, tab);
    _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++) {
      __m256 qv = _mm256_loadu_ps(q[i] + d);
      _Pragma("GCC unroll 3") for (int j = 0; j < NK; j++)
        acc[i][j] = _mm256_fmadd_ps(qv, kv[j], acc[i][j]);
    }
  }
  _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++)
    _Pragma("GCC unroll 3") for (int j = 0; j < NK; j++)
      sc[i][col[j]] = kn_avx2_hsum(acc[i][j]) * scale;
}

/* sc[i][col[j]] = score of query q[i] (i < nq) against key k[j] (j < nk),
 * softcapped when softcap > 0, in tiles of 4 x 3. */
KN_AVX2 static void qk_scores(float *const *sc, const float *const *q, int nq, const void *const *k,
                              const int *col, int nk, int D, int kind, const float *tab,
                              float scale, float softcap) {
  for (int i = 0; i < nq; i += 4) {
    const int NQ = nq - i < 4 ? nq - i : 4;
    for (int j = 0; j < nk; j += 3) {
      const int NK = nk - j < 3 ? nk - j : 3;
#define QK(a, b)                                                                                   \
  case (a)*4 + (b): qk_micro(sc + i, q + i, k + j, col + j, D, kind, tab, scale, a, b); break
      switch (NQ * 4 + NK) {
        QK(1, 1); QK(1, 2); QK(1, 3);
        QK(2, 1); QK(2, 2); QK(2, 3);
        QK(3, 1); QK(3, 2); QK(3, 3);
        QK(4, 1); QK(4, 2); QK(4, 3);
      default: break;
      }
#undef QK
    }
    if (softcap > 0.0f) kn_cpu_attn_softcap(sc + i, NQ, col, nk, softcap);
  }
}

/* The V half for NR rows (<= 4) and NV vectors of 8 dims (<= 3) at dims d:
 * acc_r = acc_r * corr_r, then acc_r += p_r[vj[n]] v_n over the visible keys
 * in position order. Each V vector is loaded once for all rows; each
 * element's operations are the same whichever rows share the call. */
KN_AVX2 static inline __attribute__((always_inline)) void
pv_micro(float *const *acc, float *const *p, const float *corr, const void *const *vp,
         const int *vj, int n_vis, int d, int kind, const float *tab, const int NR, const int NV) {
  __m256 a[4][3];
  _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++) {
    __m256 cv = _mm256_set1_ps(corr[r]);
    _Pragma("GCC unroll 3") for (int e = 0; e < NV; e++)
      a[r][e] = _mm256_mul_ps(_mm256_load_ps(acc[r] + d + 8 * e), cv);
  }
  for (int n = 0; n < n_vis; n++) {
    __m256 vv[3];
    _Pragma("GCC unroll 3") for (int e = 0; e < NV; e++) vv[e] = kv_ld(vp[n], d + 8 * e, kind, tab);
    _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++) {
      __m256 pv = _mm256_set1_ps(p[r][vj[n]]);
      _Pragma("GCC unroll 3") for (int e = 0; e < NV; e++)
        a[r][e] = _mm256_fmadd_ps(pv, vv[e], a[r][e]);
    }
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++)
    _Pragma("GCC unroll 3") for (int e = 0; e < NV; e++)
      _mm256_store_ps(acc[r] + d + 8 * e, a[r][e]);
}

/* One key block folded into nr rows' accumulators: each row's softmax half,
 * then the V half for all of them, in tiles of 4 rows x 24 dims. p[r] holds
 * row r's scores (KN_ATTN_BLOCK of them, -inf where invisible); the visible
 * keys' V are vp, at block offsets vj. */
KN_AVX2 static void update_rows(float *const *p, int nr, const void *const *vp, const int *vj,
                                int n_vis, float *m, float *l, float *const *acc, int D, int kind,
                                const float *tab) {
  float corr[KN_ATTN_MAX_VEC];
  for (int r = 0; r < nr; r++)
    corr[r] = kn_avx2_softmax_block(p[r], &m[r], &l[r]);
  for (int r = 0; r < nr; r += 4) {
    const int NR = nr - r < 4 ? nr - r : 4;
    for (int d = 0; d < D; d += 24) {
      const int NV = (D - d) / 8 < 3 ? (D - d) / 8 : 3;
#define PV(a, b)                                                                                   \
  case (a)*4 + (b): pv_micro(acc + r, p + r, corr + r, vp, vj, n_vis, d, kind, tab, a, b); break
      switch (NR * 4 + NV) {
        PV(1, 1); PV(1, 2); PV(1, 3);
        PV(2, 1); PV(2, 2); PV(2, 3);
        PV(3, 1); PV(3, 2); PV(3, 3);
        PV(4, 1); PV(4, 2); PV(4, 3);
      default: break;
      }
#undef PV
    }
  }
}

/* The query vectors of one call (kn_cpu_attn_sets): the walk's state, the
 * queries, and an fp8 cache's code values for their kv head (kn_cpu_e4m3_scaled). */
struct vecs {
  struct kn_cpu_attn_vecs w;
  const float *const *q;
  const float *ktab, *vtab;
  _Alignas(64) float kt[256], vt[256];
};

/* Block b's keys in mask folded into vectors idx[0 .. k): the work of the two
 * kn_cpu_attn_fold_fns below, one per cache dtype. */
KN_AVX2 static inline __attribute__((always_inline)) void
fold(struct vecs *v, int b, uint32_t mask, const int *idx, int k, const int kind) {
  const struct kn_cpu_attn_job *job = v->w.job;
  struct kn_cpu_attn_group g;
  const float *gq[KN_ATTN_MAX_VEC] = {0}; /* (k >= 1: gcc cannot tell) */
  kn_cpu_attn_group_take(&g, &v->w, b, mask, idx, k);
  for (int j = 0; j < k; j++)
    gq[j] = v->q[idx[j]];
  qk_scores(g.s, gq, k, g.kp, g.vj, g.n_vis, job->view->head_dim, kind, v->ktab, job->scale,
            job->softcap);
  update_rows(g.s, k, g.vp, g.vj, g.n_vis, g.m, g.l, g.acc, job->view->head_dim, kind, v->vtab);
  kn_cpu_attn_group_give(&g, &v->w, idx, k);
}
KN_AVX2 static void fold_f32_cache(void *v, int b, uint32_t mask, const int *idx, int k) {
  fold(v, b, mask, idx, k, 0);
}
KN_AVX2 static void fold_bf16_cache(void *v, int b, uint32_t mask, const int *idx, int k) {
  fold(v, b, mask, idx, k, 1);
}
KN_AVX2 static void fold_fp8_cache(void *v, int b, uint32_t mask, const int *idx, int k) {
  fold(v, b, mask, idx, k, 2);
}

/* kn_cpu_attn_run_fn: a set of vectors over their blocks (kn_cpu_attn_walk),
 * then each written: its accumulator over l. */
KN_AVX2 static void attn_vectors(void *ctx, const float *const *q) {
  struct vecs *v = ctx;
  const struct kn_cpu_attn_vecs *w = &v->w;
  const int D = w->job->view->head_dim;
  v->q = q;
  enum kn_dtype dt = w->job->view->dtype;
  v->ktab = v->vtab = kn_cpu_e4m3;
  if (dt == KN_DTYPE_F8E4M3) {
    v->ktab = kn_cpu_e4m3_scaled(v->kt, w->job->view->k_scale, w->kvh);
    v->vtab = kn_cpu_e4m3_scaled(v->vt, w->job->view->v_scale, w->kvh);
  }
  kn_cpu_attn_walk(w,
                   dt == KN_DTYPE_BF16     ? fold_bf16_cache
                   : dt == KN_DTYPE_F8E4M3 ? fold_fp8_cache
                                           : fold_f32_cache,
                   v);
  for (int i = 0; i < w->n; i++) {
    __m256 lv = _mm256_set1_ps(w->l[i]);
    for (int d = 0; d < D; d += 8)
      _mm256_storeu_ps(w->out[i] + d, _mm256_div_ps(_mm256_load_ps(&w->acc[i][d]), lv));
  }
}

/* Rows i0 .. i0 + nr - 1 (nr <= KN_ATTN_TILE), head by head. */
void kn_cpu_attn_tile_avx2(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq,
                           int i0, int nr, int kvh, int g0, int ng) {
  if (job->view->head_dim & 7) { /* the reference kernel, row by row */
    for (int r = 0; r < nr; r++)
      kn_cpu_attn_ref(job, seq, i0 + r, kvh, g0, ng);
    return;
  }
  struct vecs v; /* not zeroed: kn_cpu_attn_sets sets what the walk reads */
  kn_cpu_attn_sets(&v.w, job, seq, i0, nr, kvh, g0, ng, attn_vectors, &v);
}

/* Query heads g0 .. g0 + ng - 1 of row i, KN_ATTN_MAX_GROUP at a time: the
 * tile of that one row (kn_cpu_attn_sets sets a row's heads by group). */
void kn_cpu_attn_avx2(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq, int i,
                      int kvh, int g0, int ng) {
  kn_cpu_attn_tile_avx2(job, seq, i, 1, kvh, g0, ng);
}
