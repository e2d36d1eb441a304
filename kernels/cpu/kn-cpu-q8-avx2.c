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

#define AI __attribute__((always_inline))
/* The tiles' loops over rows and tokens, unrolled so the accumulators stay in registers. */
#define UNROLL _Pragma("GCC unroll 8")

/* Register tile of the prefill kernels: rows x tokens. */
#define Q8_R 2
#define Q8_U 4
/* Weight bytes of the rows a group of tiles sweeps across all tokens (L1). */
#define Q8_GROUP_BYTES (24 * 1024)

KN_AVX2 static inline float h16(const uint8_t *p) {
  return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8));
}

/* The f16 at p in all 8 lanes (the same value as h16). */
KN_AVX2 static inline AI __m256 h16x8(const uint8_t *p) {
  return _mm256_cvtph_ps(_mm_set1_epi16((short)(p[0] | p[1] << 8)));
}

KN_AVX2 static inline void put1(float *o, float s, int acc) {
  *o = acc ? *o + s : s;
}

/* The 8 lanes' exact sums of four products each (bytes 4l .. 4l + 3) of
 * unsigned bytes u and signed bytes s: pairs summed in 16 bits (no saturation
 * for the operands here: at most 2 * 128 * 127), then pairs of those. */
KN_AVX2 static inline AI __m256i sum4(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* Q4_0's 32 nibbles as bytes: elements 0..15 the low ones, 16..31 the high. */
KN_AVX2 static inline AI __m256i nib32(const uint8_t *blk) {
  __m128i q = _mm_loadu_si128((const __m128i *)(blk + 2)), m = _mm_set1_epi8(0xF);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

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

/* ---- register tiles ------------------------------------------------------------- */

enum q8_kind { Q8K_Q8_0, Q8K_Q4_0 };

/* One chain (blocks b0, b0 + 2, ...) of the R x U outputs of rows w (row_bytes
 * apart) and tokens x (ldx bytes apart, lane sums xs B * 8 apart) into a[]. */
KN_AVX2 static inline AI void tile_chain(const enum q8_kind kind, const int R, const int U,
                                         const uint8_t *w, size_t row_bytes, const uint8_t *x,
                                         size_t ldx, const int32_t *xs, int B, int b0, __m256 *a) {
  const size_t bb = kind == Q8K_Q8_0 ? 34 : 18;
  UNROLL for (int i = 0; i < R * U; i++) a[i] = _mm256_setzero_ps();
  for (int b = b0; b < B; b += 2) {
    __m256i wu[Q8_R], ws[Q8_R];
    __m256 dw[Q8_R];
    UNROLL for (int r = 0; r < R; r++) {
      const uint8_t *blk = w + (size_t)r * row_bytes + (size_t)b * bb;
      dw[r] = h16x8(blk);
      if (kind == Q8K_Q8_0) {
        ws[r] = _mm256_loadu_si256((const __m256i *)(blk + 2));
        wu[r] = _mm256_abs_epi8(ws[r]);
      } else {
        wu[r] = nib32(blk);
        ws[r] = _mm256_setzero_si256();
      }
    }
    UNROLL for (int u = 0; u < U; u++) {
      const uint8_t *xb = x + (size_t)u * ldx + (size_t)b * 34;
      __m256i xv = _mm256_loadu_si256((const __m256i *)(xb + 2)), s8 = _mm256_setzero_si256();
      __m256 dx = h16x8(xb);
      if (kind == Q8K_Q4_0)
        s8 = _mm256_slli_epi32(
            _mm256_loadu_si256((const __m256i *)(xs + (size_t)u * (size_t)B * 8 + 8 * b)), 3);
      UNROLL for (int r = 0; r < R; r++) {
        __m256i p = kind == Q8K_Q8_0 ? sum4(wu[r], _mm256_sign_epi8(xv, ws[r]))
                                     : _mm256_sub_epi32(sum4(wu[r], xv), s8);
        a[r * U + u] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw[r], dx), a[r * U + u]);
      }
    }
  }
}

KN_AVX2 static inline AI void tile(const enum q8_kind kind, const int R, const int U, float *out,
                                   ptrdiff_t ldo, const uint8_t *x, size_t ldx, const int32_t *xs,
                                   const uint8_t *w, size_t row_bytes, int B, int acc) {
  __m256 e[Q8_R * Q8_U], o[Q8_R * Q8_U];
  tile_chain(kind, R, U, w, row_bytes, x, ldx, xs, B, 0, e);
  tile_chain(kind, R, U, w, row_bytes, x, ldx, xs, B, 1, o);
  UNROLL for (int r = 0; r < R; r++) UNROLL for (int u = 0; u < U; u++) put1(
      out + (ptrdiff_t)u * ldo + r, kn_avx2_hsum(_mm256_add_ps(e[r * U + u], o[r * U + u])), acc);
}

/* The tile of r (<= Q8_R) rows x u (<= Q8_U) tokens, each shape compiled
 * on its own. */
#define DEF_TILES(SUF, KIND)                                                                       \
  KN_AVX2 static void tiles_##SUF(int r, int u, float *out, ptrdiff_t ldo, const uint8_t *x,       \
                                  size_t ldx, const int32_t *xs, const uint8_t *w,                 \
                                  size_t row_bytes, int B, int acc) {                              \
    switch (r * 8 + u) {                                                                           \
    case 8 + 1: tile(KIND, 1, 1, out, ldo, x, ldx, xs, w, row_bytes, B, acc); break;               \
    case 8 + 2: tile(KIND, 1, 2, out, ldo, x, ldx, xs, w, row_bytes, B, acc); break;               \
    case 8 + 3: tile(KIND, 1, 3, out, ldo, x, ldx, xs, w, row_bytes, B, acc); break;               \
    case 8 + 4: tile(KIND, 1, 4, out, ldo, x, ldx, xs, w, row_bytes, B, acc); break;               \
    case 16 + 1: tile(KIND, 2, 1, out, ldo, x, ldx, xs, w, row_bytes, B, acc); break;              \
    case 16 + 2: tile(KIND, 2, 2, out, ldo, x, ldx, xs, w, row_bytes, B, acc); break;              \
    case 16 + 3: tile(KIND, 2, 3, out, ldo, x, ldx, xs, w, row_bytes, B, acc); break;              \
    default: tile(KIND, 2, 4, out, ldo, x, ldx, xs, w, row_bytes, B, acc); break;                  \
    }                                                                                              \
  }

DEF_TILES(q8_0, Q8K_Q8_0)
DEF_TILES(q4_0, Q8K_Q4_0)

typedef void (*tiles_fn)(int r, int u, float *out, ptrdiff_t ldo, const uint8_t *x, size_t ldx,
                         const int32_t *xs, const uint8_t *w, size_t row_bytes, int B, int acc);

/* Groups of rows that fit L1, each swept by tiles across all T tokens. */
KN_AVX2 static void tiled(tiles_fn f, float *out, ptrdiff_t ldo, const uint8_t *x, size_t ldx,
                          const int32_t *xs, const uint8_t *w, size_t row_bytes, int K, int T,
                          int n, int acc) {
  const int B = K / 32;
  int G = (int)(Q8_GROUP_BYTES / row_bytes) & ~(Q8_R - 1);
  if (G < Q8_R) G = Q8_R;
  for (int j0 = 0; j0 < n; j0 += G) {
    const int j1 = j0 + G < n ? j0 + G : n;
    for (int t = 0; t < T; t += Q8_U) {
      const int u = T - t < Q8_U ? T - t : Q8_U;
      for (int j = j0; j < j1; j += Q8_R)
        f(j1 - j < Q8_R ? j1 - j : Q8_R, u, out + (ptrdiff_t)t * ldo + j, ldo, x + (size_t)t * ldx,
          ldx, xs + (size_t)t * (size_t)B * 8, w + (size_t)j * row_bytes, row_bytes, B, acc);
    }
  }
}

#define DEF_Q8DOT(SUF)                                                                             \
  KN_AVX2 static void q8dot_##SUF(float *out, ptrdiff_t ldo, const uint8_t *x, size_t ldx,         \
                                  const int32_t *xs, const uint8_t *w, size_t row_bytes, int K,    \
                                  int T, int n, int acc) {                                         \
    if (T >= 2) {                                                                                  \
      tiled(tiles_##SUF, out, ldo, x, ldx, xs, w, row_bytes, K, T, n, acc);                        \
      return;                                                                                      \
    }                                                                                              \
    if (T == 1) one_##SUF(out, x, xs, w, row_bytes, K / 32, n, acc);                               \
  }

DEF_Q8DOT(q8_0)
DEF_Q8DOT(q4_0)

void kn_cpu_dsp_init_q8_avx2(struct kn_cpu_dsp *dsp) {
  dsp->q8dot[KN_DTYPE_Q8_0] = q8dot_q8_0;
  dsp->q8dot[KN_DTYPE_Q4_0] = q8dot_q4_0;
}
