/* kn-cpu-q8-avx2.c — the q8 mode's integer dot products (kn_cpu_dsp.q8dot) in
 * AVX2, with kn-cpu-q8.c's bits: weight blocks against inputs rounded to Q8_0
 * blocks, each lane's four products summed exactly (vpmaddubsw + vpmaddwd),
 * the sum times the two blocks' scales added into the lane's accumulator with
 * one rounding, even and odd blocks in two chains.
 *
 * One token (decode) streams each row once, its two chains interleaved. More
 * tokens (prefill) run register tiles of Q8_R rows x Q8_U tokens: each weight
 * block is unpacked once for the tile's tokens and each input block loaded
 * once for its rows. A tile runs its outputs' even chains first, then their odd
 * ones (the two are independent until the end), so it holds Q8_R * Q8_U
 * accumulators at a time; an output's operations are the reference's whatever
 * the tile, so a row's result does not depend on T or on the rows beside it. */
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kn-cpu-avx2.h"
#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/kn-quant.h"

/* AVX2 register tiles of 2 rows x 4 tokens (16 ymm registers). */
#define Q8T_ATTR KN_AVX2
#define Q8T_VNNI 0
#define Q8_R     2
#define Q8_U     4
#include "kernels/cpu/kn-cpu-q8-tile.h"

/* ---- one token ------------------------------------------------------------------ */

/* Q8_0: |w| times x with w's sign (inputs are never -128: the quantizer's range
 * is +-127). */
KN_AVX2 static inline AI __m256 dot8_q8_0(const uint8_t *blk, const uint8_t *xb) {
  __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 2));
  __m256i x = _mm256_loadu_si256((const __m256i *)(xb + 2));
  return _mm256_cvtepi32_ps(sum4(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)));
}

/* Q4_0: the nibbles q are unsigned, so vpmaddubsw takes them as they are, and
 * sum (q - 8) x = sum q x - 8 sum x with each lane's input sum from xs: the
 * reference's integers, two operations fewer a block. */
KN_AVX2 static inline AI __m256 dot8_q4_0(const uint8_t *blk, const uint8_t *xb, const int32_t *s) {
  __m256i x = _mm256_loadu_si256((const __m256i *)(xb + 2));
  __m256i s8 = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)s), 3);
  return _mm256_cvtepi32_ps(_mm256_sub_epi32(sum4(nib32(blk), x), s8));
}

#define Q8_STEP_Q8_0(b, a)                                                                         \
  do {                                                                                             \
    const uint8_t *blk_ = row + (size_t)(b)*34, *xb_ = x + (size_t)(b)*34;                         \
    (a) = _mm256_fmadd_ps(dot8_q8_0(blk_, xb_), _mm256_set1_ps(h16(blk_) * h16(xb_)), (a));        \
  } while (0)

#define Q8_STEP_Q4_0(b, a)                                                                         \
  do {                                                                                             \
    const uint8_t *blk_ = row + (size_t)(b)*18, *xb_ = x + (size_t)(b)*34;                         \
    (a) = _mm256_fmadd_ps(dot8_q4_0(blk_, xb_, xs + 8 * (b)),                                      \
                          _mm256_set1_ps(h16(blk_) * h16(xb_)), (a));                              \
  } while (0)

/* out[j] {=, +=} the n rows against one token's blocks x (lane sums xs). */
#define DEF_ONE(SUF, STEP)                                                                         \
  KN_AVX2 static void one_##SUF(float *out, const uint8_t *x, const int32_t *xs, const uint8_t *w, \
                                size_t row_bytes, int B, int n, int acc) {                         \
    for (int j = 0; j < n; j++) {                                                                  \
      const uint8_t *row = w + (size_t)j * row_bytes;                                              \
      __m256 e = _mm256_setzero_ps(), o = e;                                                       \
      int b = 0;                                                                                   \
      for (; b + 2 <= B; b += 2) {                                                                 \
        STEP(b, e);                                                                                \
        STEP(b + 1, o);                                                                            \
      }                                                                                            \
      if (b < B) STEP(b, e);                                                                       \
      put1(out + j, kn_avx2_hsum(_mm256_add_ps(e, o)), acc);                                       \
    }                                                                                              \
  }

DEF_ONE(q8_0, Q8_STEP_Q8_0)
DEF_ONE(q4_0, Q8_STEP_Q4_0)

void kn_cpu_q8_one_avx2(enum kn_dtype dt, float *out, const uint8_t *x, const int32_t *xs,
                        const uint8_t *w, size_t row_bytes, int K, int n, int acc) {
  if (dt == KN_DTYPE_Q8_0)
    one_q8_0(out, x, xs, w, row_bytes, K / 32, n, acc);
  else
    one_q4_0(out, x, xs, w, row_bytes, K / 32, n, acc);
}

/* Q8_0 and Q4_0: one token streams each row once (the decode kernel), more
 * run the tiles; the other formats run the tiles at every T. */
#define DEF_Q8DOT(SUF, DT)                                                                         \
  KN_AVX2 static void q8dot_##SUF(float *out, ptrdiff_t ldo, const uint8_t *x, size_t ldx,         \
                                  const int32_t *xs, const uint8_t *w, size_t row_bytes, int K,    \
                                  int T, int n, int acc) {                                         \
    if (T == 1 && (DT == KN_DTYPE_Q8_0 || DT == KN_DTYPE_Q4_0))                                    \
      kn_cpu_q8_one_avx2(DT, out, x, xs, w, row_bytes, K, n, acc);                                 \
    else                                                                                           \
      tiled(tiles_##SUF, out, ldo, x, ldx, xs, w, row_bytes, K, T, n, acc);                        \
  }

DEF_Q8DOT(q8_0, KN_DTYPE_Q8_0)
DEF_Q8DOT(q4_0, KN_DTYPE_Q4_0)
DEF_Q8DOT(q4_1, KN_DTYPE_Q4_1)
DEF_Q8DOT(q5_0, KN_DTYPE_Q5_0)
DEF_Q8DOT(q5_1, KN_DTYPE_Q5_1)
DEF_Q8DOT(q4_k, KN_DTYPE_Q4_K)
DEF_Q8DOT(q5_k, KN_DTYPE_Q5_K)
DEF_Q8DOT(q6_k, KN_DTYPE_Q6_K)

void kn_cpu_dsp_init_q8_avx2(struct kn_cpu_dsp *dsp) {
  dsp->q8dot[KN_DTYPE_Q8_0] = q8dot_q8_0;
  dsp->q8dot[KN_DTYPE_Q4_0] = q8dot_q4_0;
  dsp->q8dot[KN_DTYPE_Q4_1] = q8dot_q4_1;
  dsp->q8dot[KN_DTYPE_Q5_0] = q8dot_q5_0;
  dsp->q8dot[KN_DTYPE_Q5_1] = q8dot_q5_1;
  dsp->q8dot[KN_DTYPE_Q4_K] = q8dot_q4_k;
  dsp->q8dot[KN_DTYPE_Q5_K] = q8dot_q5_k;
  dsp->q8dot[KN_DTYPE_Q6_K] = q8dot_q6_k;
}
