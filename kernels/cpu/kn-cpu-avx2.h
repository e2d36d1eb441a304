/* kn-cpu-avx2.h — inline AVX2 helpers shared by the AVX2 kernel files: loads
 * that widen bf16 / f16 to f32, tail masks, the fixed horizontal sum (and the
 * store of two tokens' four sums), a vector exp, and the online softmax's
 * step over one key block. Every
 * function carries the avx2,fma,f16c target attribute so the build needs no
 * -march flag; only files whose kernels run after a CPU check include this. */
#ifndef LMSERVE_KN_CPU_AVX2_H
#define LMSERVE_KN_CPU_AVX2_H
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kn-quant.h"

#define KN_AVX2 __attribute__((target("avx2,fma,f16c")))

/* Lanes 0..r-1 set (0 <= r <= 8). */
KN_AVX2 static inline __m256i kn_avx2_mask(int r) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), idx);
}

KN_AVX2 static inline __m256 kn_avx2_bf16(const uint16_t *p) {
  __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* 16 bf16 values from p widened: elements 0-7 into *lo, 8-15 into *hi (the
 * values kn_avx2_bf16 gives for p and p + 8). One 32-byte load, its quarters
 * reordered 0, 2, 1, 3, and each 128-bit lane's words interleaved under
 * zeros, in place of two zero-extending loads and two shifts: on processors
 * whose 256-bit operations run as two 128-bit halves (AMD Zen 1) those bound
 * a one-token bf16 matvec below the memory's rate. */
KN_AVX2 static inline void kn_avx2_bf16x16(const uint16_t *p, __m256 *lo, __m256 *hi) {
  const __m256i v = _mm256_permute4x64_epi64(_mm256_loadu_si256((const __m256i *)p), 0xD8);
  *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), v));
  *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), v));
}

KN_AVX2 static inline __m256 kn_avx2_f16(const uint16_t *p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* r (< 8) 16-bit elements, the rest zero. */
KN_AVX2 static inline __m256 kn_avx2_bf16_tail(const uint16_t *p, int r) {
  uint16_t buf[8] = {0};
  memcpy(buf, p, (size_t)r * 2);
  return kn_avx2_bf16(buf);
}

KN_AVX2 static inline __m256 kn_avx2_f16_tail(const uint16_t *p, int r) {
  uint16_t buf[8] = {0};
  memcpy(buf, p, (size_t)r * 2);
  return kn_avx2_f16(buf);
}

/* The fixed lane reduction: (l0+l4, l1+l5, l2+l6, l3+l7), then (a0+a2, a1+a3),
 * then b0+b1. Every dot product of a kernel table ends with this. */
KN_AVX2 static inline float kn_avx2_hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* kn_avx2_hsum of eight accumulators at once, with the same additions per
 * sum (so the same bits): lanes (l0+l4, ..) of each, then (a0+a2, a1+a3),
 * then b0+b1. Returns lane 0..3 = the sums of r0..r3, lane 4..7 = those of
 * s0..s3: four outputs of two tokens. */
KN_AVX2 static inline __m256 kn_avx2_hsum8(__m256 r0, __m256 r1, __m256 r2, __m256 r3, __m256 s0,
                                           __m256 s1, __m256 s2, __m256 s3) {
  /* per pair (rk, sk): [rk.lo + rk.hi | sk.lo + sk.hi] */
  __m256 p0 =
      _mm256_add_ps(_mm256_permute2f128_ps(r0, s0, 0x20), _mm256_permute2f128_ps(r0, s0, 0x31));
  __m256 p1 =
      _mm256_add_ps(_mm256_permute2f128_ps(r1, s1, 0x20), _mm256_permute2f128_ps(r1, s1, 0x31));
  __m256 p2 =
      _mm256_add_ps(_mm256_permute2f128_ps(r2, s2, 0x20), _mm256_permute2f128_ps(r2, s2, 0x31));
  __m256 p3 =
      _mm256_add_ps(_mm256_permute2f128_ps(r3, s3, 0x20), _mm256_permute2f128_ps(r3, s3, 0x31));
  /* (x0 + x2, x1 + x3) of each: q01 = [r0 r0 r1 r1 | s0 s0 s1 s1] */
  __m256d p0d = _mm256_castps_pd(p0), p1d = _mm256_castps_pd(p1);
  __m256d p2d = _mm256_castps_pd(p2), p3d = _mm256_castps_pd(p3);
  __m256 q01 = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(p0d, p1d)),
                             _mm256_castpd_ps(_mm256_unpackhi_pd(p0d, p1d)));
  __m256 q23 = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(p2d, p3d)),
                             _mm256_castpd_ps(_mm256_unpackhi_pd(p2d, p3d)));
  /* y0 + y1 of each: [r0 r1 r2 r3 | s0 s1 s2 s3] */
  return _mm256_add_ps(_mm256_shuffle_ps(q01, q23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm256_shuffle_ps(q01, q23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Stores, or adds to what is there (acc), the sums of r0..r3 at o[0..3] and
 * those of s0..s3 at o[ldo .. ldo + 3] (kn_avx2_hsum8): two tokens' four
 * outputs of a matvec. */
KN_AVX2 static inline __attribute__((always_inline)) void
kn_avx2_put_2x4(float *o, ptrdiff_t ldo, __m256 r0, __m256 r1, __m256 r2, __m256 r3, __m256 s0,
                __m256 s1, __m256 s2, __m256 s3, int acc) {
  __m256 h = kn_avx2_hsum8(r0, r1, r2, r3, s0, s1, s2, s3);
  __m128 lo = _mm256_castps256_ps128(h), hi = _mm256_extractf128_ps(h, 1);
  _mm_storeu_ps(o, acc ? _mm_add_ps(_mm_loadu_ps(o), lo) : lo);
  _mm_storeu_ps(o + ldo, acc ? _mm_add_ps(_mm_loadu_ps(o + ldo), hi) : hi);
}

/* How far ahead of its rows a block-format matvec with one or two inputs
 * (decode; kn-cpu-quant-avx2.c, -avx512.c) asks for the weights: such a call
 * streams each row once from memory, and its rows, a few hundred bytes each,
 * are too short a stream for the hardware prefetcher. */
#define KN_QMV_PREFETCH_BYTES 4096

/* Asks for the cache lines from *pf to the first row not yet begun (next) plus
 * KN_QMV_PREFETCH_BYTES, at most end; *pf: the first byte not asked for. */
KN_AVX2 static inline void kn_avx2_qmv_prefetch(const uint8_t **pf, const uint8_t *next,
                                                const uint8_t *end) {
  const uint8_t *want = next + KN_QMV_PREFETCH_BYTES;
  for (want = want < end ? want : end; *pf < want; *pf += 64)
    _mm_prefetch((const char *)*pf, _MM_HINT_T0);
}

/* A Q4_K or Q5_K super-block's eight scales d * sc into ds[8] and its eight
 * mins dmin * mn into ms[8] (each product rounded once, as kn_dequant_row's). */
KN_AVX2 static inline void kn_avx2_k_scales(const uint8_t *blk, float *ds, float *ms) {
  uint64_t sc, mn;
  kn_k_scales_mins(blk + 4, &sc, &mn);
  __m256 fs = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
  __m256 fm = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)));
  _mm256_storeu_ps(ds, _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(kn_le16(blk))), fs));
  _mm256_storeu_ps(ms, _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(kn_le16(blk + 2))), fm));
}

/* A Q6_K super-block's sixteen scales d * sc into ds[16]. */
KN_AVX2 static inline void kn_avx2_q6k_scales(const uint8_t *blk, float *ds) {
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(kn_le16(blk + 208)));
  for (int h = 0; h < 2; h++) {
    __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 192 + 8 * h)));
    _mm256_storeu_ps(ds + 8 * h, _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc)));
  }
}

KN_AVX2 static inline float kn_avx2_hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* exp(x) for f32 lanes, about 2 ulp: x = n ln2 + r with |r| <= ln2/2 (two-part
 * ln2), exp(r) by its Taylor series to r^7, times 2^n built in the exponent
 * bits. exp(x) is +inf above 88.72 and exactly 0 below -87.33 (and for -inf);
 * NaN stays NaN. */
KN_AVX2 static inline __m256 kn_avx2_exp(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.7228f), lo = _mm256_set1_ps(-87.3365f);
  __m256 over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
  __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  /* 2^n: n in [-126, 128]; split in two factors so n = 128 does not overflow
   * the exponent field */
  __m256i ni = _mm256_cvtps_epi32(n);
  __m256i n1 = _mm256_srai_epi32(ni, 1);
  __m256i n2 = _mm256_sub_epi32(ni, n1);
  __m256 s1 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
  __m256 s2 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), over);
  y = _mm256_andnot_ps(under, y);
  return _mm256_blendv_ps(y, x, nan);
}

/* The softmax half of one key block of one query head: the block's scores
 * s[32] (-inf where invisible; 32-byte aligned) become p_j = exp(s_j - m') in place,
 * the running maximum *m and sum *l move to m' and l * corr + sum p_j, and
 * the factor corr = exp(m - m') the accumulator must take is returned. */
KN_AVX2 static inline float kn_avx2_softmax_block(float *s, float *m, float *l) {
  __m256 v0 = _mm256_load_ps(&s[0]), v1 = _mm256_load_ps(&s[8]);
  __m256 v2 = _mm256_load_ps(&s[16]), v3 = _mm256_load_ps(&s[24]);
  float bm = kn_avx2_hmax(_mm256_max_ps(_mm256_max_ps(v0, v1), _mm256_max_ps(v2, v3)));
  float mnew = bm > *m ? bm : *m;
  __m256 mv = _mm256_set1_ps(mnew);
  float corr = _mm256_cvtss_f32(kn_avx2_exp(_mm256_set1_ps(*m - mnew)));
  v0 = kn_avx2_exp(_mm256_sub_ps(v0, mv));
  v1 = kn_avx2_exp(_mm256_sub_ps(v1, mv));
  v2 = kn_avx2_exp(_mm256_sub_ps(v2, mv));
  v3 = kn_avx2_exp(_mm256_sub_ps(v3, mv));
  _mm256_store_ps(&s[0], v0);
  _mm256_store_ps(&s[8], v1);
  _mm256_store_ps(&s[16], v2);
  _mm256_store_ps(&s[24], v3);
  float bsum = kn_avx2_hsum(_mm256_add_ps(_mm256_add_ps(v0, v1), _mm256_add_ps(v2, v3)));
  *l = *l * corr + bsum;
  *m = mnew;
  return corr;
}

#endif
