/* kn-cpu-attn-avx2.c — AVX2 paged attention for one (query, kv head): online
 * softmax over key blocks aligned to absolute positions; and the AVX-512
 * table's, the same operations in wider tiles (the wide tiles below).
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
#include "kernels/cpu/kn-cpu-avx512.h"
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
KN_AVX2 static inline __attribute__((always_inline)) void
qk_scores(float *const *sc, const float *const *q, int nq, const void *const *k, const int *col,
          int nk, int D, int kind, const float *tab, float scale, float softcap) {
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
KN_AVX2 static inline __attribute__((always_inline)) void
update_rows(float *const *p, int nr, const void *const *vp, const int *vj, int n_vis, float *m,
            float *l, float *const *acc, int D, int kind, const float *tab) {
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
  float *wide; /* the AVX-512 table's: room for a block's widened keys, or NULL */
  _Alignas(64) float kt[256], vt[256];
};

/* ---- wide tiles: the AVX-512 table's --------------------------------------
 *
 * A block that at least WIDE_MIN vectors see (a prefill tile's rows, on the
 * diagonal too, where their visible keys differ) is folded into all of them at
 * once in 512-bit registers, every score's and every output element's
 * operations unchanged, so its bits are those above:
 *   - its keys are widened once, in pairs: a zmm holds key 2p's 8 dims in
 *     lanes 0-7 and key 2p+1's same dims in lanes 8-15 (an odd last key pairs
 *     with itself; that score is dropped), so one zmm carries two scores'
 *     8-lane accumulators;
 *   - the scores run 4 queries x 4 pairs (16 accumulators; each pair vector
 *     loaded once for 4 queries, each query's 8 dims, broadcast to both
 *     halves, once for 8 keys), then kn_avx2_hsum's three additions for the
 *     32 scores at once (wide_hsum);
 *   - the visible keys' V rows are widened once, and the V half runs 4 rows x
 *     64 dims.
 * Head dims that are not a multiple of 16 stay on the 256-bit tiles. */
#define WIDE_MIN 8

/* 8 dims at d of keys a (lanes 0-7) and b (lanes 8-15), widened exactly. */
KN_AVX512 static inline __m512 pair8(const void *a, const void *b, int d, int kind,
                                     const float *tab) {
  if (kind == 1) {
    __m128i x = _mm_loadu_si128((const __m128i *)((const uint16_t *)a + d));
    __m128i y = _mm_loadu_si128((const __m128i *)((const uint16_t *)b + d));
    __m256i xy = _mm256_inserti128_si256(_mm256_castsi128_si256(x), y, 1);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(xy), 16));
  }
  if (kind == 2) {
    __m128i x = _mm_loadl_epi64((const __m128i *)((const uint8_t *)a + d));
    __m128i y = _mm_loadl_epi64((const __m128i *)((const uint8_t *)b + d));
    return _mm512_i32gather_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi64(x, y)), tab, 4);
  }
  __m256 x = _mm256_loadu_ps((const float *)a + d), y = _mm256_loadu_ps((const float *)b + d);
  return _mm512_insertf32x8(_mm512_castps256_ps512(x), y, 1);
}

/* 16 dims at d of a V row, widened exactly. */
KN_AVX512 static inline __m512 row16(const void *v, int d, int kind, const float *tab) {
  if (kind == 1) {
    __m256i x = _mm256_loadu_si256((const __m256i *)((const uint16_t *)v + d));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
  }
  if (kind == 2) {
    __m128i x = _mm_loadu_si128((const __m128i *)((const uint8_t *)v + d));
    return _mm512_i32gather_ps(_mm512_cvtepu8_epi32(x), tab, 4);
  }
  return _mm512_loadu_ps((const float *)v + d);
}

/* kn_avx2_hsum of the 32 half accumulators of z[16] at once, with its
 * additions per sum: (l0+l4, ..), then (a0+a2, a1+a3), then b0+b1. Lane 4q+e
 * of r[k] (the 128-bit lane q, element e) is the sum of z[8k + 2e + q / 2]'s
 * half q % 2. */
KN_AVX512 static inline __attribute__((always_inline)) void wide_hsum(const __m512 z[16],
                                                                      __m512 r[2]) {
  __m512 s1[8], s2[4];
  /* 128-bit lane q of s1[k]: z[2k + q / 2]'s half q % 2, its quarters summed */
  _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) s1[k] =
      _mm512_add_ps(_mm512_shuffle_f32x4(z[2 * k], z[2 * k + 1], 0x88),
                    _mm512_shuffle_f32x4(z[2 * k], z[2 * k + 1], 0xdd));
  /* elements 0-1 of each 128-bit lane from s1[2k], 2-3 from s1[2k + 1] */
  _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) s2[k] =
      _mm512_add_ps(_mm512_shuffle_ps(s1[2 * k], s1[2 * k + 1], 0x44),
                    _mm512_shuffle_ps(s1[2 * k], s1[2 * k + 1], 0xee));
  _Pragma("GCC unroll 2") for (int k = 0; k < 2; k++) r[k] =
      _mm512_add_ps(_mm512_shuffle_ps(s2[2 * k], s2[2 * k + 1], 0x88),
                    _mm512_shuffle_ps(s2[2 * k], s2[2 * k + 1], 0xdd));
}

/* sc[i][col[2p + h]] for NQ queries (<= 4) x NP key pairs (<= 4) from pair
 * p0 on, the pairs widened at w (pair p's 8 dims at d: w + p * 2D + 2d);
 * keys past nk are dropped. */
KN_AVX512 static inline __attribute__((always_inline)) void
qk_wide(float *const *sc, const float *const *q, const float *w, int p0, const int *col, int nk,
        int D, float scale, const int NQ, const int NP) {
  __m512 z[16];
  _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) z[i] = _mm512_setzero_ps();
  const float *wp = w + (size_t)p0 * 2 * D;
  for (int d = 0; d < D; d += 8) {
    __m512 kv[4];
    _Pragma("GCC unroll 4") for (int j = 0; j < NP; j++) kv[j] =
        _mm512_load_ps(wp + (size_t)j * 2 * D + 2 * d);
    _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++) {
      __m512 qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(q[i] + d));
      _Pragma("GCC unroll 4") for (int j = 0; j < NP; j++) z[4 * i + j] =
          _mm512_fmadd_ps(qv, kv[j], z[4 * i + j]);
    }
  }
  __m512 r[2];
  wide_hsum(z, r);
  _Alignas(64) float s[32];
  _mm512_store_ps(s, r[0]);
  _mm512_store_ps(s + 16, r[1]);
  for (int x = 0; x < 32; x++) {
    int k = x / 16, q4 = x % 16 / 4, e = x % 4, n = 8 * k + 2 * e + q4 / 2;
    int i = n / 4, j = n % 4, key = 2 * (p0 + j) + q4 % 2;
    if (i < NQ && j < NP && key < nk) sc[i][col[key]] = s[x] * scale;
  }
}

/* Each shape its own function, so that its accumulators get the registers. */
typedef void (*qk_wide_fn)(float *const *sc, const float *const *q, const float *w, int p0,
                           const int *col, int nk, int D, float scale);
#define DEF_QK(NQ, NP)                                                                             \
  KN_AVX512 static void qk_wide_##NQ##x##NP(float *const *sc, const float *const *q,               \
                                            const float *w, int p0, const int *col, int nk, int D, \
                                            float scale) {                                         \
    qk_wide(sc, q, w, p0, col, nk, D, scale, NQ, NP);                                              \
  }
#define DEF_QK4(NQ) DEF_QK(NQ, 1) DEF_QK(NQ, 2) DEF_QK(NQ, 3) DEF_QK(NQ, 4)
DEF_QK4(1)
DEF_QK4(2)
DEF_QK4(3)
DEF_QK4(4)
#define QK_ROW(NQ)                                                                                 \
  { NULL, qk_wide_##NQ##x1, qk_wide_##NQ##x2, qk_wide_##NQ##x3, qk_wide_##NQ##x4 }
static const qk_wide_fn qk_wide_fns[5][5] = {{NULL}, QK_ROW(1), QK_ROW(2), QK_ROW(3), QK_ROW(4)};

/* The V half for NR rows (<= 4) and NV vectors of 16 dims (<= 4) at dims d,
 * pv_micro's operations per element: acc_r *= corr_r, then acc_r += p_r[vj[n]]
 * v_n over the visible keys in position order. MASKED: only the keys n that
 * row r sees (bit n of rm[r]); a key it does not see leaves its accumulator as
 * it is, as when the row takes the block alone. */
KN_AVX512 static inline __attribute__((always_inline)) void
pv_wide(float *const *acc, float *const *p, const float *corr, const float *const *v, const int *vj,
        const uint32_t *rm, int n_vis, int d, const int NR, const int NV, const int MASKED) {
  __m512 a[4][4];
  _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++) {
    __m512 cv = _mm512_set1_ps(corr[r]);
    _Pragma("GCC unroll 4") for (int e = 0; e < NV; e++) a[r][e] =
        _mm512_mul_ps(_mm512_load_ps(acc[r] + d + 16 * e), cv);
  }
  for (int n = 0; n < n_vis; n++) {
    __m512 vv[4];
    _Pragma("GCC unroll 4") for (int e = 0; e < NV; e++) vv[e] = _mm512_loadu_ps(v[n] + d + 16 * e);
    _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++) {
      __m512 pv = _mm512_set1_ps(p[r][vj[n]]);
      __mmask16 km = MASKED ? (__mmask16)(0u - (rm[r] >> n & 1u)) : (__mmask16)0xffff;
      _Pragma("GCC unroll 4") for (int e = 0; e < NV; e++) a[r][e] =
          MASKED ? _mm512_mask3_fmadd_ps(pv, vv[e], a[r][e], km)
                 : _mm512_fmadd_ps(pv, vv[e], a[r][e]);
    }
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++)
      _Pragma("GCC unroll 4") for (int e = 0; e < NV; e++)
          _mm512_store_ps(acc[r] + d + 16 * e, a[r][e]);
}
typedef void (*pv_wide_fn)(float *const *acc, float *const *p, const float *corr,
                           const float *const *v, const int *vj, const uint32_t *rm, int n_vis,
                           int d);
#define DEF_PV(NR, NV, M, SUF)                                                                     \
  KN_AVX512 static void pv_wide_##NR##x##NV##SUF(                                                  \
      float *const *acc, float *const *p, const float *corr, const float *const *v, const int *vj, \
      const uint32_t *rm, int n_vis, int d) {                                                      \
    pv_wide(acc, p, corr, v, vj, rm, n_vis, d, NR, NV, M);                                         \
  }
#define DEF_PV4(NR, M, SUF)                                                                        \
  DEF_PV(NR, 1, M, SUF) DEF_PV(NR, 2, M, SUF) DEF_PV(NR, 3, M, SUF) DEF_PV(NR, 4, M, SUF)
DEF_PV4(1, 0, )
DEF_PV4(2, 0, )
DEF_PV4(3, 0, )
DEF_PV4(4, 0, )
DEF_PV4(1, 1, m)
DEF_PV4(2, 1, m)
DEF_PV4(3, 1, m)
DEF_PV4(4, 1, m)
#define PV_ROW(NR, SUF)                                                                            \
  {                                                                                                \
    NULL, pv_wide_##NR##x1##SUF, pv_wide_##NR##x2##SUF, pv_wide_##NR##x3##SUF,                     \
        pv_wide_##NR##x4##SUF                                                                      \
  }
/* [masked][NR][NV] */
static const pv_wide_fn pv_wide_fns[2][5][5] = {
    {{NULL}, PV_ROW(1, ), PV_ROW(2, ), PV_ROW(3, ), PV_ROW(4, )},
    {{NULL}, PV_ROW(1, m), PV_ROW(2, m), PV_ROW(3, m), PV_ROW(4, m)}};

/* kn_cpu_attn_fold_all_fn of the wide tiles: block b folded into every vector
 * that sees some of it (vis[i] != 0), their visible sets alike or not. The
 * scores of the union of those sets are computed for all of them (each score
 * as it is alone); a vector's scores of keys it does not see go back to -inf
 * before its softmax step, and its V half passes them by (pv_wide, MASKED). */
KN_AVX512 static inline __attribute__((always_inline)) void
fold_wide(struct vecs *v, int b, const uint32_t *vis, const int kind) {
  const struct kn_cpu_attn_job *job = v->w.job;
  int idx[KN_ATTN_MAX_VEC] = {0}, k = 0; /* (k >= WIDE_MIN: gcc cannot tell) */
  uint32_t all = 0;
  for (int i = 0; i < v->w.n; i++)
    if (vis[i]) {
      idx[k++] = i;
      all |= vis[i];
    }
  struct kn_cpu_attn_group g;
  const float *gq[KN_ATTN_MAX_VEC];
  kn_cpu_attn_group_take(&g, &v->w, b, all, idx, k);
  for (int j = 0; j < k; j++)
    gq[j] = v->q[idx[j]];
  const int D = job->view->head_dim, nk = g.n_vis, np = (nk + 1) / 2;
  float *w = v->wide;
  for (int p = 0; p < np; p++) {
    const void *ka = g.kp[2 * p], *kb = 2 * p + 1 < nk ? g.kp[2 * p + 1] : ka;
    for (int d = 0; d < D; d += 8)
      _mm512_store_ps(w + (size_t)p * 2 * D + 2 * d, pair8(ka, kb, d, kind, v->ktab));
  }
  for (int i = 0; i < k; i += 4) {
    const int NQ = k - i < 4 ? k - i : 4;
    for (int p = 0; p < np; p += 4)
      qk_wide_fns[NQ][np - p < 4 ? np - p : 4](g.s + i, gq + i, w, p, g.vj, nk, D, job->scale);
  }
  if (job->softcap > 0.0f) kn_cpu_attn_softcap(g.s, k, g.vj, nk, job->softcap);
  /* rm[r], bit n: vector r sees the block's n-th key of the union */
  uint32_t rm[KN_ATTN_MAX_VEC], full = nk == 32 ? ~0u : (1u << nk) - 1;
  for (int r = 0; r < k; r++) {
    uint32_t m = vis[idx[r]];
    rm[r] = m == all ? full : 0;
    for (int n = 0; m != all && n < nk; n++)
      if (m >> g.vj[n] & 1u)
        rm[r] |= 1u << n;
      else
        g.s[r][g.vj[n]] = -INFINITY;
  }
  float corr[KN_ATTN_MAX_VEC];
  for (int r = 0; r < k; r++)
    corr[r] = kn_avx2_softmax_block(g.s[r], &g.m[r], &g.l[r]);
  /* the V rows: the cache's own (f32) or widened once into w */
  const float *vr[KN_ATTN_BLOCK];
  for (int n = 0; n < nk; n++) {
    if (kind == 0) {
      vr[n] = g.vp[n];
      continue;
    }
    float *o = w + (size_t)n * D;
    for (int d = 0; d < D; d += 16)
      _mm512_store_ps(o + d, row16(g.vp[n], d, kind, v->vtab));
    vr[n] = o;
  }
  for (int r = 0; r < k; r += 4) {
    const int NR = k - r < 4 ? k - r : 4;
    int masked = 0;
    for (int j = r; j < r + NR; j++)
      masked |= rm[j] != full;
    for (int d = 0; d < D; d += 64)
      pv_wide_fns[masked][NR][(D - d) / 16 < 4 ? (D - d) / 16 : 4](g.acc + r, g.s + r, corr + r, vr,
                                                                   g.vj, rm + r, nk, d);
  }
  kn_cpu_attn_group_give(&g, &v->w, idx, k);
}
KN_AVX512 static void fold_wide_f32(void *v, int b, const uint32_t *vis) {
  fold_wide(v, b, vis, 0);
}
KN_AVX512 static void fold_wide_bf16(void *v, int b, const uint32_t *vis) {
  fold_wide(v, b, vis, 1);
}
KN_AVX512 static void fold_wide_fp8(void *v, int b, const uint32_t *vis) {
  fold_wide(v, b, vis, 2);
}

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
  struct kn_cpu_attn_vecs *w = &v->w;
  const int D = w->job->view->head_dim;
  v->q = q;
  enum kn_dtype dt = w->job->view->dtype;
  v->ktab = v->vtab = kn_cpu_e4m3;
  if (dt == KN_DTYPE_F8E4M3) {
    v->ktab = kn_cpu_e4m3_scaled(v->kt, w->job->view->k_scale, w->kvh);
    v->vtab = kn_cpu_e4m3_scaled(v->vt, w->job->view->v_scale, w->kvh);
  }
  kn_cpu_attn_walk_all(w,
                       dt == KN_DTYPE_BF16     ? fold_bf16_cache
                       : dt == KN_DTYPE_F8E4M3 ? fold_fp8_cache
                                               : fold_f32_cache,
                       !v->wide                ? NULL
                       : dt == KN_DTYPE_BF16   ? fold_wide_bf16
                       : dt == KN_DTYPE_F8E4M3 ? fold_wide_fp8
                                               : fold_wide_f32,
                       WIDE_MIN, v);
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
  v.wide = NULL;
  kn_cpu_attn_sets(&v.w, job, seq, i0, nr, kvh, g0, ng, attn_vectors, &v);
}

/* kn_cpu_attn_part_fn: one span of row i, the tile of that one row over the
 * span's keys. */
void kn_cpu_attn_part_avx2(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq, int i,
                           int kvh, int g0, int ng, struct kn_cpu_attn_part *part) {
  struct vecs v;
  v.wide = NULL;
  kn_cpu_attn_sets_part(&v.w, job, seq, i, 1, kvh, g0, ng, part, attn_vectors, &v);
}

/* The AVX-512 table's rows i0 .. i0 + nr - 1, or one row's span part: the
 * blocks that WIDE_MIN vectors take together on the wide tiles (the same
 * bits); head dims that are not a multiple of 16 on the 256-bit ones. */
static void rows_avx512(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq, int i0,
                        int nr, int kvh, int g0, int ng, struct kn_cpu_attn_part *part) {
  if (job->view->head_dim & 15) {
    if (part)
      kn_cpu_attn_part_avx2(job, seq, i0, kvh, g0, ng, part);
    else
      kn_cpu_attn_tile_avx2(job, seq, i0, nr, kvh, g0, ng);
    return;
  }
  _Alignas(64) float wide[KN_ATTN_BLOCK * KN_MAX_HEAD_DIM];
  struct vecs v;
  v.wide = wide;
  kn_cpu_attn_sets_part(&v.w, job, seq, i0, nr, kvh, g0, ng, part, attn_vectors, &v);
}

void kn_cpu_attn_tile_avx512(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq,
                             int i0, int nr, int kvh, int g0, int ng) {
  rows_avx512(job, seq, i0, nr, kvh, g0, ng, NULL);
}

void kn_cpu_attn_part_avx512(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq,
                             int i, int kvh, int g0, int ng, struct kn_cpu_attn_part *part) {
  rows_avx512(job, seq, i, 1, kvh, g0, ng, part);
}

/* Query heads g0 .. g0 + ng - 1 of row i, KN_ATTN_MAX_GROUP at a time: the
 * tile of that one row (kn_cpu_attn_sets sets a row's heads by group). */
void kn_cpu_attn_avx2(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq, int i,
                      int kvh, int g0, int ng) {
  kn_cpu_attn_tile_avx2(job, seq, i, 1, kvh, g0, ng);
}

void kn_cpu_attn_avx512(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq, int i,
                        int kvh, int g0, int ng) {
  kn_cpu_attn_tile_avx512(job, seq, i, 1, kvh, g0, ng);
}
