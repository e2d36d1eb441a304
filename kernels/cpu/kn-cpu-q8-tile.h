/* kn-cpu-q8-tile.h — the q8 mode's register tiles (kn_cpu_dsp.q8dot for T
 * tokens), included once by each kernel file that instantiates them, after it
 * defines
 *   Q8T_ATTR  the functions' target attribute,
 *   Q8T_VNNI  1: four products summed by vpdpbusd (AVX-512 VNNI on ymm), 0: AVX2,
 *   Q8_R, Q8_U  the tile's rows and tokens (Q8_R * Q8_U accumulators).
 * Each weight block is unpacked once for the tile's tokens and each input
 * block loaded once for its rows. A tile runs its outputs' even chains first,
 * then their odd ones (the reference's two chains are independent until the
 * end); an output's operations are kn-cpu-q8.c's whatever the tile, so a row's
 * result does not depend on T or on the rows beside it. */
#ifndef LMSERVE_KN_CPU_Q8_TILE_H
#define LMSERVE_KN_CPU_Q8_TILE_H
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/kn-cpu-avx2.h"

#define AI __attribute__((always_inline))

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

/* c plus the 8 lanes' exact sums of four products each (bytes 4l .. 4l + 3)
 * of unsigned bytes u and signed bytes s. AVX2: pairs summed in 16 bits (no
 * saturation for the operands here: at most 2 * 128 * 127), then pairs of
 * those; VNNI: vpdpbusd. */
Q8T_ATTR static inline AI __m256i dot4(__m256i c, __m256i u, __m256i s) {
#if Q8T_VNNI
  return _mm256_dpbusd_epi32(c, u, s);
#else
  return _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

KN_AVX2 static inline AI __m256i sum4(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* Q4_0's 32 nibbles as bytes: elements 0..15 the low ones, 16..31 the high. */
KN_AVX2 static inline AI __m256i nib32(const uint8_t *blk) {
  __m128i q = _mm_loadu_si128((const __m128i *)(blk + 2)), m = _mm_set1_epi8(0xF);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

/* ---- register tiles ------------------------------------------------------------- */

enum q8_kind { Q8K_Q8_0, Q8K_Q4_0, Q8K_Q4_1, Q8K_Q5_0, Q8K_Q5_1, Q8K_Q4_K, Q8K_Q5_K, Q8K_Q6_K };

/* Bytes of a kind's block (a K-quant's super-block). */
static inline size_t kind_bytes(enum q8_kind k) {
  static const size_t bytes[] = {34, 18, 20, 22, 24, 144, 176, 210};
  return bytes[k];
}

/* The offset the kind's weights carry as a power of two (Q4_0's 8, Q5_0's 16,
 * Q6_K's 32: subtracted as sum q x - (sum x << shift)), 0 for none. */
static inline int kind_shift(enum q8_kind k) {
  return k == Q8K_Q4_0 ? 3 : k == Q8K_Q5_0 ? 4 : k == Q8K_Q6_K ? 5 : 0;
}

/* Whether every weight adds a min (times the lane's input sum). */
static inline int kind_min(enum q8_kind k) {
  return k == Q8K_Q4_1 || k == Q8K_Q5_1 || k == Q8K_Q4_K || k == Q8K_Q5_K;
}

/* Byte j = 0x10 where bit j of qh is set, else 0. */
Q8T_ATTR static inline AI __m256i bit5x32(uint32_t qh) {
  const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                       2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), sel), bit);
  return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(0x10));
}

Q8T_ATTR static inline AI uint32_t u32le(const uint8_t *p) {
  uint32_t u;
  memcpy(&u, p, 4);
  return u;
}

/* The K-quants' j-th 6-bit (scale, min) pair of 8. */
static inline AI void sc_min(int j, const uint8_t *q, int *sc, int *mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

/* The low (hi = 0) or high nibbles of 32 bytes at p. */
Q8T_ATTR static inline AI __m256i nibs(const uint8_t *p, int hi) {
  __m256i v = _mm256_loadu_si256((const __m256i *)p);
  return _mm256_and_si256(hi ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0xF));
}

/* 32-element block b of a row, as kn-cpu-q8.c's weights() has it: *u the
 * unsigned bytes vpmaddubsw takes (Q8_0: |w|, with the weights themselves in
 * *sg for their signs; the others: q before the offset), *d each lane's scale,
 * *m the min (kind_min). */
Q8T_ATTR static inline AI void unpack(const enum q8_kind kind, const uint8_t *row, int b,
                                      __m256i *u, __m256i *sg, __m256 *d, __m256 *m) {
  const uint8_t *blk = row + (size_t)(kind >= Q8K_Q4_K ? b >> 3 : b) * kind_bytes(kind);
  *sg = _mm256_setzero_si256();
  *m = _mm256_setzero_ps();
  switch (kind) {
  case Q8K_Q8_0:
    *d = h16x8(blk);
    *sg = _mm256_loadu_si256((const __m256i *)(blk + 2));
    *u = _mm256_abs_epi8(*sg);
    break;
  case Q8K_Q4_0:
    *d = h16x8(blk);
    *u = nib32(blk);
    break;
  case Q8K_Q4_1:
    *d = h16x8(blk);
    *m = h16x8(blk + 2);
    *u = nib32(blk + 2);
    break;
  case Q8K_Q5_0:
    *d = h16x8(blk);
    *u = _mm256_or_si256(nib32(blk + 4), bit5x32(u32le(blk + 2)));
    break;
  case Q8K_Q5_1:
    *d = h16x8(blk);
    *m = h16x8(blk + 2);
    *u = _mm256_or_si256(nib32(blk + 6), bit5x32(u32le(blk + 4)));
    break;
  case Q8K_Q4_K:
  case Q8K_Q5_K: {
    const int five = kind == Q8K_Q5_K, sb = b & 7;
    int sc, mn;
    sc_min(sb, blk + 4, &sc, &mn);
    *d = _mm256_set1_ps(h16(blk) * (float)sc);
    *m = _mm256_set1_ps(-(h16(blk + 2) * (float)mn));
    *u = nibs(blk + (five ? 48 : 16) + 32 * (sb >> 1), sb & 1);
    if (five) {
      const __m256i bit = _mm256_set1_epi8((char)(1 << sb));
      __m256i qh = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(blk + 16)), bit);
      *u =
          _mm256_or_si256(*u, _mm256_and_si256(_mm256_cmpeq_epi8(qh, bit), _mm256_set1_epi8(0x10)));
    }
    break;
  }
  case Q8K_Q6_K: {
    const int c = b & 7, half = c >> 2, p = c & 3;
    const int8_t *sc = (const int8_t *)(blk + 192) + 8 * half + 2 * p;
    const float dd = h16(blk + 208);
    __m256i hi = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * half));
    hi = _mm256_and_si256(_mm256_srl_epi16(hi, _mm_cvtsi32_si128(2 * p)), _mm256_set1_epi8(3));
    *u = _mm256_or_si256(nibs(blk + 64 * half + 32 * (p & 1), p >= 2), _mm256_slli_epi16(hi, 4));
    __m128 d0 = _mm_set1_ps(dd * (float)sc[0]), d1 = _mm_set1_ps(dd * (float)sc[1]);
    *d = _mm256_set_m128(d1, d0);
    break;
  }
  }
}

/* One chain (blocks b0, b0 + 2, ...) of the R x U outputs of rows w (row_bytes
 * apart) and tokens x (ldx bytes apart, lane sums xs B * 8 apart) into a[]. */
Q8T_ATTR static inline AI void tile_chain(const enum q8_kind kind, const int R, const int U,
                                          const uint8_t *w, size_t row_bytes, const uint8_t *x,
                                          size_t ldx, const int32_t *xs, int B, int b0, __m256 *a) {
  const int shift = kind_shift(kind), has_m = kind_min(kind);
#pragma GCC unroll 8
  for (int i = 0; i < R * U; i++)
    a[i] = _mm256_setzero_ps();
  for (int b = b0; b < B; b += 2) {
    __m256i wu[Q8_R], ws[Q8_R];
    __m256 dw[Q8_R], mw[Q8_R];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
      unpack(kind, w + (size_t)r * row_bytes, b, &wu[r], &ws[r], &dw[r], &mw[r]);
#pragma GCC unroll 8
    for (int u = 0; u < U; u++) {
      const uint8_t *xb = x + (size_t)u * ldx + (size_t)b * 34;
      __m256i xv = _mm256_loadu_si256((const __m256i *)(xb + 2)), so = _mm256_setzero_si256();
      __m256 dx = h16x8(xb), sf = _mm256_setzero_ps();
      if (shift || has_m) {
        __m256i s = _mm256_loadu_si256((const __m256i *)(xs + (size_t)u * (size_t)B * 8 + 8 * b));
        if (shift) so = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s, shift));
        if (has_m) sf = _mm256_cvtepi32_ps(s);
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) {
        /* the offset's term first: the same integer either way */
        __m256i p = dot4(so, wu[r], kind == Q8K_Q8_0 ? _mm256_sign_epi8(xv, ws[r]) : xv);
        __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw[r], dx), a[r * U + u]);
        if (has_m) t = _mm256_fmadd_ps(sf, _mm256_mul_ps(mw[r], dx), t);
        a[r * U + u] = t;
      }
    }
  }
}

Q8T_ATTR static inline AI void tile(const enum q8_kind kind, const int R, const int U, float *out,
                                    ptrdiff_t ldo, const uint8_t *x, size_t ldx, const int32_t *xs,
                                    const uint8_t *w, size_t row_bytes, int B, int acc) {
  __m256 e[Q8_R * Q8_U], o[Q8_R * Q8_U];
  tile_chain(kind, R, U, w, row_bytes, x, ldx, xs, B, 0, e);
  tile_chain(kind, R, U, w, row_bytes, x, ldx, xs, B, 1, o);
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
#pragma GCC unroll 8
    for (int u = 0; u < U; u++)
      put1(out + (ptrdiff_t)u * ldo + r, kn_avx2_hsum(_mm256_add_ps(e[r * U + u], o[r * U + u])),
           acc);
}

/* The tile of r (<= Q8_R) rows x u (<= Q8_U) tokens, each shape compiled
 * on its own (shapes beyond the tile's are never asked for). */
#define Q8T_CLAMP(v, m) ((v) < (m) ? (v) : (m))
#define Q8T_CASE(KIND, R, U)                                                                       \
  case R * 8 + U:                                                                                  \
    tile(KIND, Q8T_CLAMP(R, Q8_R), Q8T_CLAMP(U, Q8_U), out, ldo, x, ldx, xs, w, row_bytes, B,      \
         acc);                                                                                     \
    break;
#define Q8T_CASES(KIND, R)                                                                         \
  Q8T_CASE(KIND, R, 1) Q8T_CASE(KIND, R, 2) Q8T_CASE(KIND, R, 3) Q8T_CASE(KIND, R, 4)
#define DEF_TILES(SUF, KIND)                                                                       \
  Q8T_ATTR static void tiles_##SUF(int r, int u, float *out, ptrdiff_t ldo, const uint8_t *x,      \
                                   size_t ldx, const int32_t *xs, const uint8_t *w,                \
                                   size_t row_bytes, int B, int acc) {                             \
    switch (r * 8 + u) {                                                                           \
      Q8T_CASES(KIND, 1)                                                                           \
      Q8T_CASES(KIND, 2)                                                                           \
      Q8T_CASES(KIND, 3)                                                                           \
      Q8T_CASES(KIND, 4)                                                                           \
    }                                                                                              \
  }

DEF_TILES(q8_0, Q8K_Q8_0)
DEF_TILES(q4_0, Q8K_Q4_0)
DEF_TILES(q4_1, Q8K_Q4_1)
DEF_TILES(q5_0, Q8K_Q5_0)
DEF_TILES(q5_1, Q8K_Q5_1)
DEF_TILES(q4_k, Q8K_Q4_K)
DEF_TILES(q5_k, Q8K_Q5_K)
DEF_TILES(q6_k, Q8K_Q6_K)

typedef void (*tiles_fn)(int r, int u, float *out, ptrdiff_t ldo, const uint8_t *x, size_t ldx,
                         const int32_t *xs, const uint8_t *w, size_t row_bytes, int B, int acc);

/* Groups of rows that fit L1, each swept by tiles across all T tokens. */
Q8T_ATTR static void tiled(tiles_fn f, float *out, ptrdiff_t ldo, const uint8_t *x, size_t ldx,
                           const int32_t *xs, const uint8_t *w, size_t row_bytes, int K, int T,
                           int n, int acc) {
  const int B = K / 32;
  int G = (int)(Q8_GROUP_BYTES / row_bytes) / Q8_R * Q8_R;
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

#endif
