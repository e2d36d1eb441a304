/* kn-cpu-avx512.c — AVX-512 (F/DQ/BW/VL) versions of the kernels where the
 * wider registers pay: the batched matmul (pack + tile), softcap, argmax,
 * and the greedy head of kn_matmul_argmax (16 tokens across the lanes, below);
 * attention's wide tiles are in kn-cpu-attn-avx2.c. Everything else keeps the
 * AVX2 table (kn_cpu_dsp_init_avx2 runs first).
 *
 * Same bits as the AVX2 table. The matmul follows the canonical dot product
 * of kn-cpu-avx2.c exactly: one 8-lane accumulator per output, fma over
 * k-blocks of 8 in order, the zero-padded tail last, then the fixed lane
 * reduction ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). A zmm register holds the
 * 8-lane accumulators of two outputs side by side (features 2p and 2p+1 of a
 * packed pair), so each fma does the work of two AVX2 ones while every lane
 * sees the same operations; a T = 1 row (the AVX2 matvec) and the same row in
 * a batch (here) agree bit for bit. softcap and argmax do per lane what the
 * AVX2 versions do, 16 lanes at a time. */
#include <math.h>

#include "kernels/cpu/kn-cpu-avx2.h"
#include "kernels/cpu/kn-cpu-avx512.h"
#include "kernels/cpu/kn-cpu-impl.h"

/* ---- packing: weights widened to f32 in feature pairs ------------------- */

/* Packed layout of n weight rows of K elements: features in groups of
 * KN_PACK_GROUP (8; zero rows past n), each group as 4 pairs; pair p of the
 * whole matrix (features 2p, 2p+1) is KB = ceil(K / 8) blocks of 16 floats:
 * block b = [row 2p, k = 8b .. 8b+7 | row 2p+1, the same k], zero past K.
 * Pair p starts at p * KB * 16. */
KN_AVX512 static inline __m256 ld8(const void *src, enum kn_dtype dt, size_t i) {
  if (dt == KN_DTYPE_BF16) return kn_avx2_bf16((const uint16_t *)src + i);
  if (dt == KN_DTYPE_F16) return kn_avx2_f16((const uint16_t *)src + i);
  return _mm256_loadu_ps((const float *)src + i);
}

KN_AVX512 static inline __m256 ld8_tail(const void *src, enum kn_dtype dt, size_t i, int r) {
  if (dt == KN_DTYPE_BF16) return kn_avx2_bf16_tail((const uint16_t *)src + i, r);
  if (dt == KN_DTYPE_F16) return kn_avx2_f16_tail((const uint16_t *)src + i, r);
  return _mm256_maskz_loadu_ps((__mmask8)((1u << r) - 1), (const float *)src + i);
}

/* Prefetch distance of pack's weight stream. */
#define PACK_PF_BYTES 4096

/* Two bf16 / f16 rows' block b (8 elements each) widened side by side. */
KN_AVX512 static inline __m512 ld_pair16(const uint16_t *r0, const uint16_t *r1, int b, int f16) {
  __m256i v = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(r0 + 8 * b))),
      _mm_loadu_si128((const __m128i *)(r1 + 8 * b)), 1);
  if (f16) return _mm512_cvtph_ps(v);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

KN_AVX512 static void pack_avx512(float *dst, const void *src, enum kn_dtype dt, int K, int n) {
  const int KB = (K + 7) / 8, KF = K / 8, r = K & 7;
  const int rows = (n + KN_PACK_GROUP - 1) / KN_PACK_GROUP * KN_PACK_GROUP;
  const size_t es = kn_dtype_size(dt), row_bytes = (size_t)K * es;
  const int f16 = dt == KN_DTYPE_F16;
  for (int j = 0; j < rows; j += 2) {
    float *d = dst + (size_t)(j / 2) * KB * 16;
    if (j + 1 >= n || dt == KN_DTYPE_F32 || r) { /* edges, f32, K % 8 != 0: row by row */
      for (int h = 0; h < 2; h++) {
        int row = j + h;
        for (int b = 0; b < KB; b++) {
          __m256 v = _mm256_setzero_ps();
          if (row < n) {
            size_t at = (size_t)row * K + (size_t)b * 8;
            v = b < KF ? ld8(src, dt, at) : ld8_tail(src, dt, at, r);
          }
          _mm256_storeu_ps(d + b * 16 + h * 8, v);
        }
      }
      continue;
    }
    /* the rows are one contiguous stream, short per work unit: prefetch it
     * ahead in software */
    const char *r0 = (const char *)src + (size_t)j * row_bytes;
    for (size_t o = 0; o < 2 * row_bytes; o += 64)
      _mm_prefetch(r0 + PACK_PF_BYTES + o, _MM_HINT_T0);
    const uint16_t *w0 = (const uint16_t *)r0, *w1 = w0 + K;
    for (int b = 0; b < KF; b++)
      _mm512_storeu_ps(d + b * 16, ld_pair16(w0, w1, b, f16));
  }
}

/* ---- the tile: 4 pairs (8 features) x TT tokens -------------------------- */

/* Reduces the accumulators of one token (a[p]: pair p's two features) to the
 * 8 outputs in feature order, with the canonical additions per output. */
KN_AVX512 static inline __m256 reduce8(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  /* quarters of a[p]: [f(2p) l0-3, f(2p) l4-7, f(2p+1) l0-3, f(2p+1) l4-7];
   * s: quarter q = lanes 0-3 + lanes 4-7 of feature q (s2: feature 4 + q) */
  __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x88), _mm512_shuffle_f32x4(a0, a1, 0xdd));
  __m512 s2 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x88), _mm512_shuffle_f32x4(a2, a3, 0xdd));
  /* per quarter: [s0 + s2, s1 + s3] of feature q, then of feature 4 + q */
  __m512d sd = _mm512_castps_pd(s), s2d = _mm512_castps_pd(s2);
  __m512 q = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(sd, s2d)),
                           _mm512_castpd_ps(_mm512_unpackhi_pd(sd, s2d)));
  /* lane 0 of quarter q: feature q's sum; lane 2: feature 4 + q's */
  q = _mm512_add_ps(q, _mm512_permute_ps(q, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, q));
}

KN_AVX512 static inline void put8(float *o, __m256 s, __mmask8 m, int acc) {
  if (acc) s = _mm256_add_ps(_mm256_maskz_loadu_ps(m, o), s);
  _mm256_mask_storeu_ps(o, m, s);
}

/* x rows broadcast to both halves of a zmm: block b of token row x. */
#define XB(x, b) _mm512_broadcast_f32x8(_mm256_loadu_ps((x) + 8 * (b)))
#define XT(x, b) _mm512_broadcast_f32x8(_mm256_maskz_loadu_ps(xm, (x) + 8 * (b)))

/* The body of a tile: outputs [TT tokens, 8 features] into out (row stride
 * ldo, lanes om), WB(p, b) giving pair p's block b as a zmm (the two 8-lane
 * halves of features 2p and 2p+1). Blocks past K / 8 exist only in packed
 * weights (zero-padded); the token side of such a block is a masked load. */
/* One k-block of a tile: the 4 pairs' block b against TT tokens' block b
 * (XL: a full or a masked token load). */
#define TILE_KSTEP(TT, WB, XL)                                                                     \
  do {                                                                                             \
    __m512 w0 = WB(0, b), w1 = WB(1, b), w2 = WB(2, b), w3 = WB(3, b);                             \
    _Pragma("GCC unroll 8") for (int t = 0; t < TT; t++) {                                         \
      __m512 xv = XL(in + t * ldi, b);                                                             \
      a[0][t] = _mm512_fmadd_ps(w0, xv, a[0][t]);                                                  \
      a[1][t] = _mm512_fmadd_ps(w1, xv, a[1][t]);                                                  \
      a[2][t] = _mm512_fmadd_ps(w2, xv, a[2][t]);                                                  \
      a[3][t] = _mm512_fmadd_ps(w3, xv, a[3][t]);                                                  \
    }                                                                                              \
  } while (0)
#define TILE_BODY(TT, WB)                                                                          \
  const int KB = (K + 7) / 8, KF = K / 8;                                                          \
  const __mmask8 xm = (__mmask8)((1u << (K & 7)) - 1);                                             \
  __m512 a[4][TT];                                                                                 \
  _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++)                                              \
      _Pragma("GCC unroll 8") for (int t = 0; t < TT; t++) a[p][t] = _mm512_setzero_ps();          \
  int b = 0;                                                                                       \
  for (; b < KF; b++)                                                                              \
    TILE_KSTEP(TT, WB, XB);                                                                        \
  if (b < KB) TILE_KSTEP(TT, WB, XT);                                                              \
  _Pragma("GCC unroll 8") for (int t = 0; t < TT; t++)                                             \
      put8(out + t * ldo, reduce8(a[0][t], a[1][t], a[2][t], a[3][t]), om, acc)

/* tile_tt<TT>: the 4 packed pairs at wp (pair stride KB * 16 floats). */
#define WB_PACKED(p, b) _mm512_loadu_ps(wp + (size_t)(p)*KB * 16 + (size_t)(b)*16)
#define DEF_TILE(TT)                                                                               \
  KN_AVX512 static void tile_tt##TT(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,     \
                                    const float *wp, int K, __mmask8 om, int acc) {                \
    TILE_BODY(TT, WB_PACKED);                                                                      \
  }

DEF_TILE(1)
DEF_TILE(2)
DEF_TILE(3)
DEF_TILE(4)
DEF_TILE(5)
DEF_TILE(6)

/* mv_<dtype>_tt<TT>: the same tile straight from 8 weight rows in their own
 * dtype (row-major, K % 8 == 0), widened in registers: for small T, where
 * packing would cost more than it saves. */
KN_AVX512 static inline __m512 pair_f32(const float *r0, const float *r1, int b) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(r0 + 8 * b)),
                            _mm256_loadu_ps(r1 + 8 * b), 1);
}
KN_AVX512 static inline __m512 pair_bf16(const uint16_t *r0, const uint16_t *r1, int b) {
  return ld_pair16(r0, r1, b, 0);
}
KN_AVX512 static inline __m512 pair_f16(const uint16_t *r0, const uint16_t *r1, int b) {
  return ld_pair16(r0, r1, b, 1);
}
#define DEF_MV(SUF, TYPE, TT)                                                                      \
  KN_AVX512 static void mv_##SUF##_tt##TT(float *out, ptrdiff_t ldo, const float *in,              \
                                          ptrdiff_t ldi, const TYPE *w, int K, int acc) {          \
    const __mmask8 om = 0xff;                                                                      \
    TILE_BODY(TT, WB_##SUF);                                                                       \
  }
#define WB_f32(p, b)  pair_f32(w + (size_t)(2 * (p)) * K, w + (size_t)(2 * (p) + 1) * K, (b))
#define WB_bf16(p, b) pair_bf16(w + (size_t)(2 * (p)) * K, w + (size_t)(2 * (p) + 1) * K, (b))
#define WB_f16(p, b)  pair_f16(w + (size_t)(2 * (p)) * K, w + (size_t)(2 * (p) + 1) * K, (b))
#define DEF_MV_ALL(SUF, TYPE)                                                                      \
  DEF_MV(SUF, TYPE, 1)                                                                             \
  DEF_MV(SUF, TYPE, 2)                                                                             \
  DEF_MV(SUF, TYPE, 3)                                                                             \
  DEF_MV(SUF, TYPE, 4)                                                                             \
  DEF_MV(SUF, TYPE, 5)                                                                             \
  DEF_MV(SUF, TYPE, 6)
DEF_MV_ALL(f32, float)
DEF_MV_ALL(bf16, uint16_t)
DEF_MV_ALL(f16, uint16_t)

/* Prefetch distance of the small-T matmul's weight stream. */
#define MV_PF_BYTES 8192

/* The fewest tokens the tiles below take; fewer go to mv4 (same bits). Set
 * by kn_cpu_dsp_init_avx512 for the core it runs on. */
static int mv512_min_t = 3;

/* Defines mv4_<SUF>: the AVX2 matvec's arithmetic (kn-cpu-avx2.c: per
 * output one 8-lane accumulator over K in order, the masked tail, then
 * kn_avx2_hsum8's additions) on 4 weight rows x 4 tokens at a time in 256-bit
 * registers, 16 accumulators, which AVX-512VL's 32 registers hold: each
 * widened weight vector serves 4 tokens instead of 2. The tokens past the
 * last 4 and the rows past the last 4 go to the AVX2 matvec (the row group
 * is in L1 by then). Same bits as the AVX2 matvec. */
#define DEF_MV4(SUF, TYPE, LOAD, LOAD_TAIL, DT)                                                    \
  KN_AVX512 static void mv4_##SUF(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,       \
                                  const void *wv, int K, int T, int n, int acc) {                  \
    const TYPE *w = wv;                                                                            \
    const int K8 = K & ~7, r = K - K8;                                                             \
    const __m256i mask = kn_avx2_mask(r);                                                          \
    int j = 0;                                                                                     \
    for (; j + 4 <= n; j += 4) {                                                                   \
      const TYPE *wr[4] = {w + (size_t)j * K, w + (size_t)(j + 1) * K, w + (size_t)(j + 2) * K,    \
                           w + (size_t)(j + 3) * K};                                               \
      __m256 tl[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),               \
                      _mm256_setzero_ps()};                                                        \
      if (r)                                                                                       \
        _Pragma("GCC unroll 4") for (int f = 0; f < 4; f++) tl[f] = LOAD_TAIL(wr[f] + K8, r);      \
      int t = 0;                                                                                   \
      for (; t + 4 <= T; t += 4) {                                                                 \
        const float *x = in + (ptrdiff_t)t * ldi;                                                  \
        __m256 a[4][4];                                                                            \
        _Pragma("GCC unroll 4") for (int f = 0; f < 4; f++)                                        \
            _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) a[f][u] = _mm256_setzero_ps();     \
        for (int k = 0; k < K8; k += 8) {                                                          \
          __m256 xv[4];                                                                            \
          _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) xv[u] =                              \
              _mm256_loadu_ps(x + u * ldi + k);                                                    \
          PREFETCH_W((const char *)(wr[0] + 4 * k) + MV_PF_BYTES, 32 * sizeof(TYPE));              \
          _Pragma("GCC unroll 4") for (int f = 0; f < 4; f++) {                                    \
            __m256 wv8 = LOAD(wr[f] + k);                                                          \
            _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) a[f][u] =                          \
                _mm256_fmadd_ps(wv8, xv[u], a[f][u]);                                              \
          }                                                                                        \
        }                                                                                          \
        if (r)                                                                                     \
          _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) {                                    \
            __m256 xv = _mm256_maskload_ps(x + u * ldi + K8, mask);                                \
            _Pragma("GCC unroll 4") for (int f = 0; f < 4; f++) a[f][u] =                          \
                _mm256_fmadd_ps(tl[f], xv, a[f][u]);                                               \
          }                                                                                        \
        _Pragma("GCC unroll 2") for (int u = 0; u < 4; u += 2) {                                   \
          kn_avx2_put_2x4(out + (ptrdiff_t)(t + u) * ldo + j, ldo, a[0][u], a[1][u], a[2][u],      \
                          a[3][u], a[0][u + 1], a[1][u + 1], a[2][u + 1], a[3][u + 1], acc);       \
        }                                                                                          \
      }                                                                                            \
      if (t < T)                                                                                   \
        kn_cpu_matvec_avx2[DT](out + (ptrdiff_t)t * ldo + j, ldo, in + (ptrdiff_t)t * ldi, ldi,    \
                               wr[0], K, T - t, 4, acc);                                           \
    }                                                                                              \
    if (j < n) kn_cpu_matvec_avx2[DT](out + j, ldo, in, ldi, w + (size_t)j * K, K, T, n - j, acc); \
  }

KN_AVX512 static inline void PREFETCH_W(const char *p, size_t bytes) {
  for (size_t b = 0; b < bytes; b += 64)
    _mm_prefetch(p + b, _MM_HINT_T0);
}
KN_AVX512 static inline __m256 ld8_f32(const float *p) {
  return _mm256_loadu_ps(p);
}
KN_AVX512 static inline __m256 ld8_f32_tail(const float *p, int r) {
  return _mm256_maskload_ps(p, kn_avx2_mask(r));
}
DEF_MV4(f32, float, ld8_f32, ld8_f32_tail, KN_DTYPE_F32)
DEF_MV4(bf16, uint16_t, kn_avx2_bf16, kn_avx2_bf16_tail, KN_DTYPE_BF16)
DEF_MV4(f16, uint16_t, kn_avx2_f16, kn_avx2_f16_tail, KN_DTYPE_F16)

/* Defines matvec512_<SUF>, the kn_cpu_dot_fn for small T: T = 1 and 2 (bound
 * by the weight stream, where the AVX2 matvec already keeps up), K % 8 != 0
 * and rows past the last group of 8 go to the AVX2 matvec, T below
 * mv512_min_t to mv4 (same bits). */
#define DEF_MATVEC512(SUF, TYPE, DT)                                                               \
  KN_AVX512 static void matvec512_##SUF(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi, \
                                        const void *wv, int K, int T, int n, int acc) {            \
    const TYPE *w = wv;                                                                            \
    int j = 0;                                                                                     \
    if (T > 2 && T < mv512_min_t) {                                                                \
      mv4_##SUF(out, ldo, in, ldi, w, K, T, n, acc);                                               \
      return;                                                                                      \
    }                                                                                              \
    if (T >= mv512_min_t && K % 8 == 0) {                                                          \
      const size_t gbytes = (size_t)8 * K * sizeof(TYPE);                                          \
      for (; j + 8 <= n; j += 8) {                                                                 \
        const TYPE *g = w + (size_t)j * K;                                                         \
        for (size_t o = 0; o < gbytes; o += 64)                                                    \
          _mm_prefetch((const char *)g + MV_PF_BYTES + o, _MM_HINT_T0);                            \
        int t = 0;                                                                                 \
        for (; t + 6 <= T; t += 6)                                                                 \
          mv_##SUF##_tt6(out + (ptrdiff_t)t * ldo + j, ldo, in + (ptrdiff_t)t * ldi, ldi, g, K,    \
                         acc);                                                                     \
        float *o_ = out + (ptrdiff_t)t * ldo + j;                                                  \
        const float *x_ = in + (ptrdiff_t)t * ldi;                                                 \
        switch (T - t) {                                                                           \
        case 1: mv_##SUF##_tt1(o_, ldo, x_, ldi, g, K, acc); break;                                \
        case 2: mv_##SUF##_tt2(o_, ldo, x_, ldi, g, K, acc); break;                                \
        case 3: mv_##SUF##_tt3(o_, ldo, x_, ldi, g, K, acc); break;                                \
        case 4: mv_##SUF##_tt4(o_, ldo, x_, ldi, g, K, acc); break;                                \
        case 5: mv_##SUF##_tt5(o_, ldo, x_, ldi, g, K, acc); break;                                \
        default: break;                                                                            \
        }                                                                                          \
      }                                                                                            \
    }                                                                                              \
    if (j < n) kn_cpu_matvec_avx2[DT](out + j, ldo, in, ldi, w + (size_t)j * K, K, T, n - j, acc); \
  }

DEF_MATVEC512(f32, float, KN_DTYPE_F32)
DEF_MATVEC512(bf16, uint16_t, KN_DTYPE_BF16)
DEF_MATVEC512(f16, uint16_t, KN_DTYPE_F16)

#undef XB
#undef XT

typedef void (*tile_fn)(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi, const float *wp,
                        int K, __mmask8 om, int acc);
static const tile_fn tiles[7] = {NULL, tile_tt1, tile_tt2, tile_tt3, tile_tt4, tile_tt5, tile_tt6};

/* kn_cpu_dot_fn over packed weights (pack_avx512's layout for these n rows). */
KN_AVX512 static void tile_packed(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                                  const void *wv, int K, int T, int n, int acc) {
  const float *w = wv;
  const size_t group = (size_t)(K + 7) / 8 * 16 * 4; /* floats per 4 pairs */
  for (int j = 0; j < n; j += KN_PACK_GROUP) {
    int left = n - j;
    __mmask8 om = left >= 8 ? 0xff : (__mmask8)((1u << left) - 1);
    const float *wp = w + (size_t)(j / KN_PACK_GROUP) * group;
    int t = 0;
    for (; t + 6 <= T; t += 6)
      tile_tt6(out + (ptrdiff_t)t * ldo + j, ldo, in + (ptrdiff_t)t * ldi, ldi, wp, K, om, acc);
    if (t < T)
      tiles[T - t](out + (ptrdiff_t)t * ldo + j, ldo, in + (ptrdiff_t)t * ldi, ldi, wp, K, om, acc);
  }
}

/* ---- softcap and argmax ------------------------------------------------- */

/* kn_avx2_exp, 16 lanes: the same operations per lane. */
KN_AVX512 static inline __m512 exp16(__m512 x) {
  const __m512 hi = _mm512_set1_ps(88.7228f), lo = _mm512_set1_ps(-87.3365f);
  __mmask16 over = _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ);
  __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  __m512 xc = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  __m512i ni = _mm512_cvtps_epi32(n);
  __m512i n1 = _mm512_srai_epi32(ni, 1);
  __m512i n2 = _mm512_sub_epi32(ni, n1);
  __m512 s1 =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, _mm512_set1_epi32(127)), 23));
  __m512 s2 =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, _mm512_set1_epi32(127)), 23));
  __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
  y = _mm512_mask_mov_ps(y, over, _mm512_set1_ps(__builtin_inff()));
  y = _mm512_maskz_mov_ps((__mmask16)~under, y);
  return _mm512_mask_mov_ps(y, nan, x);
}

/* tanh8 of kn-cpu-avx2.c, 16 lanes. */
KN_AVX512 static inline __m512 tanh16(__m512 y) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  __m512 ay = _mm512_andnot_ps(sign, y);
  __m512 z = _mm512_mul_ps(y, y);
  __m512 p = _mm512_set1_ps(-5.70498872745e-3f);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036e-1f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422e-1f));
  __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), y, y);
  __mmask16 is_small = _mm512_cmp_ps_mask(ay, _mm512_set1_ps(0.625f), _CMP_LT_OQ);
  if (is_small == 0xffff) return small;
  __m512 e = exp16(_mm512_add_ps(ay, ay));
  __m512 big =
      _mm512_sub_ps(_mm512_set1_ps(1.0f),
                    _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
  big = _mm512_or_ps(big, _mm512_and_ps(y, sign));
  return _mm512_mask_mov_ps(big, is_small, small);
}

KN_AVX512 static void softcap_avx512(float *out, const float *a, float cap, size_t n) {
  __m512 c = _mm512_set1_ps(cap), ic = _mm512_set1_ps(1.0f / cap);
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, _mm512_mul_ps(tanh16(_mm512_mul_ps(_mm512_loadu_ps(a + i), ic)), c));
  if (i < n) { /* the tail through the same vector code, masked */
    __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    __m512 v = _mm512_maskz_loadu_ps(m, a + i);
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(tanh16(_mm512_mul_ps(v, ic)), c));
  }
}

/* kn_cpu_argmax_row_ref's answer: the maximum (max_ps keeps the running
 * maxima NaN-free, as in the AVX2 version), then its first index. */
KN_AVX512 int kn_cpu_argmax_row_avx512(const float *row, int n, float *max_out) {
  __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
  int i = 0;
  for (; i + 64 <= n; i += 64) {
    m0 = _mm512_max_ps(_mm512_loadu_ps(row + i), m0);
    m1 = _mm512_max_ps(_mm512_loadu_ps(row + i + 16), m1);
    m2 = _mm512_max_ps(_mm512_loadu_ps(row + i + 32), m2);
    m3 = _mm512_max_ps(_mm512_loadu_ps(row + i + 48), m3);
  }
  for (; i + 16 <= n; i += 16)
    m0 = _mm512_max_ps(_mm512_loadu_ps(row + i), m0);
  float m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
  for (; i < n; i++)
    if (row[i] > m) m = row[i];
  __m512 mv = _mm512_set1_ps(m);
  for (i = 0; i + 16 <= n; i += 16) {
    __mmask16 bits = _mm512_cmp_ps_mask(_mm512_loadu_ps(row + i), mv, _CMP_EQ_OQ);
    if (bits) return kn_cpu_argmax_first_eq(row, i + __builtin_ctz((unsigned)bits), n, m, max_out);
  }
  return kn_cpu_argmax_first_eq(row, i, n, m, max_out);
}

/* ---- the greedy head: 16 tokens across the lanes ----------------------- */

/* kn_matmul_argmax for T >= 16 and short rows (the tiny model's [262144 x 64]
 * head at 32 decode tokens), where the per-output reductions of the tiles
 * above cost as much as the dot products. Here lane t of accumulator l holds
 * token t's canonical lane l (the products of k = 8b + l): each fma is the
 * one the AVX2 matvec does for that token and lane, with the weight
 * broadcast, and the fixed lane reduction is seven vertical adds for 16
 * tokens. The inputs come transposed (xt: per group of 16 tokens, Kp = K
 * rounded up to 8 rows of 16 floats, zero past K and past T) and blocks of
 * weight rows are widened into a small buffer with their own zero tail. The
 * results stay in registers: each token's lane keeps its running maximum.
 * (As a plain matmul this layout loses to the tiles: the results would have
 * to be transposed back to token rows.) */

KN_AVX512 static inline __m512 lane_sum(const __m512 a[8]) {
  return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                       _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])));
}

/* Makes v opaque to the compiler, so it stays in its register: without it
 * GCC re-reads each input vector as a memory operand of every fma and
 * broadcasts the weights into registers, twice the loads per fma. */
#define KEEP_IN_REG(v) __asm__("" : "+v"(v))

/* s[r * 16 + t] = dot(weight row r, token t of the group) for J rows at w
 * (row stride Kp floats) against the group's transposed inputs xg. */
#define DEF_TOK_ROWS(J)                                                                            \
  /* not inlined: in the caller the compiler would spill accumulators */                           \
  KN_AVX512 __attribute__((noinline)) static void tok_rows##J(float *s, const float *xg,           \
                                                              const float *w, int Kp) {            \
    __m512 a[J][8];                                                                                \
    _Pragma("GCC unroll 3") for (int r = 0; r < J; r++)                                            \
        _Pragma("GCC unroll 8") for (int l = 0; l < 8; l++) a[r][l] = _mm512_setzero_ps();         \
    for (int k = 0; k < Kp; k += 8) {                                                              \
      _Pragma("GCC unroll 8") for (int l = 0; l < 8; l++) {                                        \
        __m512 xv = _mm512_load_ps(xg + (size_t)(k + l) * 16);                                     \
        KEEP_IN_REG(xv);                                                                           \
        _Pragma("GCC unroll 3") for (int r = 0; r < J; r++) a[r][l] =                              \
            _mm512_fmadd_ps(_mm512_set1_ps(w[(size_t)r * Kp + k + l]), xv, a[r][l]);               \
      }                                                                                            \
    }                                                                                              \
    _Pragma("GCC unroll 3") for (int r = 0; r < J; r++)                                            \
        _mm512_store_ps(s + r * 16, lane_sum(a[r]));                                               \
  }
DEF_TOK_ROWS(1)
DEF_TOK_ROWS(2)
DEF_TOK_ROWS(3)

/* Rows r of the weights (K elements of dt each) widened to f32 at dst, row
 * stride Kp floats, zero from K to Kp. */
KN_AVX512 static void tok_widen(float *dst, const void *w, enum kn_dtype dt, int K, int Kp,
                                int rows) {
  if (dt != KN_DTYPE_F32 && K % 16 == 0) { /* 16 at a time, the rows back to back */
    const uint16_t *src = w;
    for (int r = 0; r < rows; r++)
      for (int k = 0; k < K; k += 16) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(src + (size_t)r * K + k));
        __m512 f = dt == KN_DTYPE_F16
                       ? _mm512_cvtph_ps(v)
                       : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
        _mm512_store_ps(dst + (size_t)r * Kp + k, f);
      }
    return;
  }
  const int KF = K / 8, r8 = K & 7;
  for (int r = 0; r < rows; r++) {
    size_t at = (size_t)r * K;
    float *d = dst + (size_t)r * Kp;
    int b = 0;
    for (; b < KF; b++)
      _mm256_store_ps(d + 8 * b, ld8(w, dt, at + 8 * (size_t)b));
    if (r8) _mm256_store_ps(d + 8 * b, ld8_tail(w, dt, at + 8 * (size_t)b, r8));
  }
}

/* The words of the masks over a block of rows: for each group of 16 tokens,
 * the 1 to 3 words holding features [f0, f0 + rows) (a word per token lane;
 * lanes past T: 0, no mask: all ones) into mw[g * 48 + 16 * k + lane]. Returns
 * whether any token allows any of the block's rows. */
static int tok_mask_words(uint32_t *mw, const uint32_t *const *allow, int T, int G, int f0,
                          int rows) {
  const int w0 = f0 >> 5, nw = ((f0 + rows - 1) >> 5) - w0 + 1;
  uint32_t any = 0;
  for (int g = 0; g < G; g++)
    for (int l = 0; l < 16; l++) {
      const int t = 16 * g + l;
      for (int k = 0; k < 3; k++) {
        uint32_t v = 0;
        if (t < T && k < nw) v = allow[t] ? allow[t][w0 + k] : 0xffffffffu;
        mw[g * 48 + 16 * k + l] = v;
        any |= v;
      }
    }
  if (!any) return 0;
  /* only the block's own rows: the bits outside [f0, f0 + rows) may be set */
  const int lo = f0 & 31, hi = lo + rows; /* bits [lo, hi) of the words 0..nw-1 */
  for (int k = 0; k < nw; k++) {
    int a = lo - 32 * k, b = hi - 32 * k;
    a = a < 0 ? 0 : a;
    b = b > 32 ? 32 : b;
    uint32_t keep = (b - a == 32 ? 0xffffffffu : ((1u << (b - a)) - 1)) << a;
    for (int g = 0; g < G; g++)
      for (int l = 0; l < 16; l++)
        if (mw[g * 48 + 16 * k + l] & keep) return 1;
  }
  return 0;
}

/* kn_cpu_dsp.tok_argmax: rows [0, n) of w against the T tokens of xt, each
 * token's first maximum (softcapped when cap > 0) as feature n0 + row into
 * best[T], without writing the outputs: each lane keeps its token's running
 * maximum over the rows in order (strictly greater replaces, so the first
 * index stays; NaN never enters; the first non-NaN enters even at -inf).
 * With masks, a lane takes only the rows its token allows; a block of rows
 * no token allows is neither read nor computed, and a group of tokens none of
 * which allows a block skips it.
 *
 * The softcap is monotone non-decreasing (tanh16 is, over every float:
 * test-kn-dense checks all of them), so an output whose raw value is not
 * above the raw value of its lane's maximum cannot replace it: most rows
 * need no softcap at all, only the comparison of the raw values. */
KN_AVX512 static void tok_argmax(struct kn_cpu_best *best, int n0, const float *xt, int T,
                                 const void *w, enum kn_dtype dt, int K, int n, float cap,
                                 const uint32_t *const *allow, float *wbuf) {
  const int Kp = (K + 7) & ~7, G = (T + 15) / 16;
  /* rows per widened block: up to 48, about 12 KB of f32 weights (L1) */
  int blk = 3072 / Kp / 3 * 3;
  blk = blk < 3 ? 3 : blk > 48 ? 48 : blk;
  const size_t es = kn_dtype_size(dt), row_bytes = (size_t)K * es;
  /* per group of 16 tokens: the maxima (softcapped), their raw values, their
   * features (-1: none yet) and the masks' words of the block */
  float *bv = wbuf + (((size_t)blk * Kp + 15) & ~(size_t)15);
  float *br = bv + (size_t)G * 16;
  int32_t *bi = (int32_t *)(br + (size_t)G * 16);
  uint32_t *mw = (uint32_t *)(bi + (size_t)G * 16);
  for (int g = 0; g < G; g++) {
    _mm512_store_ps(bv + 16 * g, _mm512_set1_ps(-INFINITY));
    _mm512_store_ps(br + 16 * g, _mm512_set1_ps(-INFINITY));
    _mm512_store_si512((__m512i *)(bi + 16 * g), _mm512_set1_epi32(-1));
  }
  const __m512 cv = _mm512_set1_ps(cap), ic = _mm512_set1_ps(1.0f / cap);
  const __m512i no_id = _mm512_set1_epi32(-1);
  _Alignas(64) float s[3 * 16];
  for (int j = 0; j < n; j += blk) {
    const int rows = n - j < blk ? n - j : blk;
    const char *wj = (const char *)w + (size_t)j * row_bytes;
    if (allow && !tok_mask_words(mw, allow, T, G, n0 + j, rows)) continue;
    /* the next block arrives from L3 while this one is computed, a few lines
     * per call of tok_rows (all at once would stall on the fill buffers) */
    const char *pf = wj + (size_t)rows * row_bytes;
    size_t pf_left =
        j + rows < n ? (size_t)(n - j - rows < blk ? n - j - rows : blk) * row_bytes : 0;
    size_t pf_step = (pf_left / (size_t)(G * ((rows + 2) / 3)) + 64) & ~(size_t)63;
    tok_widen(wbuf, wj, dt, K, Kp, rows);
    const int sh = (n0 + j) & 31;
    for (int g = 0; g < G; g++) {
      const float *xg = xt + (size_t)g * Kp * 16;
      __m512i mk[3];
      if (allow) {
        mk[0] = _mm512_loadu_si512(mw + g * 48);
        mk[1] = _mm512_loadu_si512(mw + g * 48 + 16);
        mk[2] = _mm512_loadu_si512(mw + g * 48 + 32);
        if (!_mm512_test_epi32_mask(_mm512_or_si512(_mm512_or_si512(mk[0], mk[1]), mk[2]),
                                    _mm512_set1_epi32(-1)))
          continue;
      }
      __m512 v_best = _mm512_load_ps(bv + 16 * g), r_best = _mm512_load_ps(br + 16 * g);
      __m512i i_best = _mm512_load_si512((const __m512i *)(bi + 16 * g));
      for (int r = 0; r < rows; r += 3) {
        for (size_t o = 0; o < pf_step && o < pf_left; o += 64)
          _mm_prefetch(pf + o, _MM_HINT_T0);
        if (pf_left) {
          size_t d = pf_step < pf_left ? pf_step : pf_left;
          pf += d;
          pf_left -= d;
        }
        int nr = rows - r < 3 ? rows - r : 3;
        /* the lanes whose tokens allow each row */
        __mmask16 al[3] = {0xffff, 0xffff, 0xffff}, any = 0xffff;
        if (allow) {
          any = 0;
          for (int q = 0; q < nr; q++) {
            int b = sh + r + q;
            al[q] = _mm512_test_epi32_mask(mk[b >> 5], _mm512_set1_epi32((int)(1u << (b & 31))));
            any |= al[q];
          }
          if (!any) continue;
        }
        const float *wr = wbuf + (size_t)r * Kp;
        if (nr == 3)
          tok_rows3(s, xg, wr, Kp);
        else if (nr == 2)
          tok_rows2(s, xg, wr, Kp);
        else
          tok_rows1(s, xg, wr, Kp);
        /* the usual case, once the lanes have maxima: no row above them */
        __mmask16 none = _mm512_cmpeq_epi32_mask(i_best, no_id), above = 0;
        for (int q = 0; q < nr; q++)
          above |= al[q] & _mm512_cmp_ps_mask(_mm512_load_ps(s + 16 * q), r_best, _CMP_GT_OQ);
        if (!((none & any) | above)) continue;
        for (int q = 0; q < nr; q++) {
          __m512 v = _mm512_load_ps(s + 16 * q), vc = v;
          none = _mm512_cmpeq_epi32_mask(i_best, no_id);
          __mmask16 cand = al[q] & (_mm512_cmp_ps_mask(v, r_best, _CMP_GT_OQ) |
                                    (none & _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q)));
          if (!cand) continue;
          if (cap > 0.0f) vc = _mm512_mul_ps(tanh16(_mm512_mul_ps(v, ic)), cv);
          __mmask16 take = cand & (_mm512_cmp_ps_mask(vc, v_best, _CMP_GT_OQ) | none);
          v_best = _mm512_mask_mov_ps(v_best, take, vc);
          r_best = _mm512_mask_mov_ps(r_best, take, v);
          i_best = _mm512_mask_mov_epi32(i_best, take, _mm512_set1_epi32(n0 + j + r + q));
        }
      }
      _mm512_store_ps(bv + 16 * g, v_best);
      _mm512_store_ps(br + 16 * g, r_best);
      _mm512_store_si512((__m512i *)(bi + 16 * g), i_best);
    }
  }
  for (int t = 0; t < T; t++) {
    best[t].max = bv[t];
    best[t].id = bi[t];
  }
}

void kn_cpu_dsp_init_avx512(struct kn_cpu_dsp *dsp) {
  dsp->isa = KN_CPU_ISA_AVX512;
  dsp->matvec[KN_DTYPE_F32] = matvec512_f32;
  dsp->matvec[KN_DTYPE_BF16] = matvec512_bf16;
  dsp->matvec[KN_DTYPE_F16] = matvec512_f16;
  dsp->pack = pack_avx512;
  dsp->tile_f32 = tile_packed;
  dsp->tile_tokens = 6;
  /* pack + tile once a packed row serves enough tokens to repay its packing.
   * Where that is depends on the core. On the machine the tiles were tuned
   * on, packed tiles won from T = 8 on [2048 x 640]. On AMD's cores, which
   * run a 512-bit operation as two 256-bit halves, widening in registers
   * wins up to T = 32: on a Zen 4, [65536 x 640] at T = 8 took 7.9-8.6 ms
   * that way against 13.4-13.5 ms packed, T = 16 11.4-11.8 against
   * 15.2-15.5 ms, [2048 x 640] at T = 8 122-130 against 171-187 us, and from
   * T = 64 the two tie (bench-kn). The [262144 x 64] head widens in
   * registers up to T = 64 at least. At T = 32 and 48, widening in registers
   * streamed 4.2-4.7 and 3.0-3.4 GB/s against 3.7-4.5 and 2.9-3.4 packed
   * (three runs each), so AMD's switch is at 64. Either way, the same bits. */
  dsp->tile_min_t = kn_cpu_is_amd() ? 64 : 8;
  /* Below that, the 512-bit register tiles take T >= 3 where they were tuned;
   * on a Zen 4 the AVX2 matvec's arithmetic streams [65536 x 640] faster up to
   * T = 10 (at T = 3, 4, 6, 8, 10: 25-26, 20-23, 15-17, 12-14, 11-12 GB/s
   * against 13-14, 13-14, 11-12, 10, 8-9 GB/s), they tie at T = 12 and the
   * tiles win at 16 (bench-kn, four runs each). mv4 adds 0-15% to the AVX2
   * matvec there (T = 8: 15.5-15.7 against 13.2-13.9 GB/s). */
  mv512_min_t = kn_cpu_is_amd() ? 12 : 3;
  dsp->tile_min_tk = 4096;
  dsp->softcap = softcap_avx512;
  dsp->attn = kn_cpu_attn_avx512;
  dsp->attn_tile = kn_cpu_attn_tile_avx512;
  dsp->attn_part = kn_cpu_attn_part_avx512;
  dsp->tok_argmax = tok_argmax;
  dsp->tok_min_t = 16;
  dsp->tok_max_k = 1280;
}
