/* kn-cpu-q8-tile.h — the q8 mode's register tiles (kn_cpu_dsp.q8dot for T
 * tokens), included once by each kernel file that instantiates them, after it
 * defines
 *   Q8T_ATTR  the functions' target attribute,
 *   Q8T_VNNI  1: four products summed by vpdpbusd (AVX-512 VNNI), 0: AVX2,
 *   Q8T_ZMM   1: Q8_0 and Q4_0 against 16 tokens in 512-bit registers, 0: 8 in
 *             256-bit ones,
 *   Q8_R, Q8_U  the tile's rows and tokens (Q8_R * Q8_U accumulators),
 *   Q8_R1       the rows of one token's tiles (decode; at most 4).
 *
 * The formats summed by lanes (kn-cpu-q8.c): each weight block is unpacked
 * once for the tile's tokens and each input block loaded once for its rows.
 * A tile of several tokens runs its outputs' even chains first, then their
 * odd ones (the reference's two chains are independent until the end); one
 * token's tile runs both, block after block (with VNNI, a K-quant's blocks
 * in pairs, one chain in each half of a register: rows1_k).
 *
 * Q8_0, Q4_0 and Q5_0 (one integer a block): outputs side by side in the lanes.
 * In the layout the q8 mode gives them at load (16 rows side by side,
 * kn-quant.h's X16) the rows are, at every T (x16_tile); rows as a file has
 * them take tokens side by side (int_dot's tok_tile; Q8_0 and Q4_0) or rows
 * gathered eight at a time (row_tile: a few tokens, and Q5_0 at every T).
 *
 * An output's operations are kn-cpu-q8.c's whatever the tile, so a row's
 * result does not depend on T or on the rows beside it. */
#ifndef LMSERVE_KN_CPU_Q8_TILE_H
#define LMSERVE_KN_CPU_Q8_TILE_H
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/kn-cpu-avx2.h"
#include "kernels/kn-quant.h"

#define AI __attribute__((always_inline))

/* Weight bytes of the rows a group of tiles sweeps across all tokens (L1). */
#define Q8_GROUP_BYTES (24 * 1024)

/* How far ahead of its tile one token's sweep prefetches the weights. */
#define Q8_PREFETCH_BYTES 4096

/* Rows of any tile (the accumulators' arrays). */
#define Q8_RMAX 4

KN_AVX2 static inline float h16(const uint8_t *p) {
  return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8));
}

/* The f16 at p in all 8 lanes (the same value as h16): vpbroadcastw from
 * memory, vcvtph2ps. */
KN_AVX2 static inline AI __m256 h16x8(const uint8_t *p) {
  short h;
  memcpy(&h, p, 2);
  return _mm256_cvtph_ps(_mm_set1_epi16(h));
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

/* Q4_0's 32 nibbles at p as bytes: elements 0..15 the low ones, 16..31 the
 * high (the 16 bytes in both halves, the upper half shifted: one load and
 * three operations). */
KN_AVX2 static inline AI __m256i nib32(const uint8_t *p) {
  __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
  q = _mm256_blend_epi32(q, _mm256_srli_epi16(q, 4), 0xF0);
  return _mm256_and_si256(q, _mm256_set1_epi8(0xF));
}

/* ---- register tiles ------------------------------------------------------------- */

enum q8_kind { Q8K_Q8_0, Q8K_Q4_0, Q8K_Q4_1, Q8K_Q5_0, Q8K_Q5_1, Q8K_Q4_K, Q8K_Q5_K, Q8K_Q6_K };

/* Bytes of a kind's block (a K-quant's super-block). */
static inline size_t kind_bytes(enum q8_kind k) {
  static const size_t bytes[] = {34, 18, 20, 22, 24, 144, 176, 210};
  return bytes[k];
}

/* The offset the lanes' kinds' weights carry as a power of two (Q6_K's 32:
 * subtracted as sum q x - (sum x << shift)), 0 for none (Q4_0's 8 and Q5_0's
 * 16 are int_dot's). */
static inline int kind_shift(enum q8_kind k) {
  return k == Q8K_Q6_K ? 5 : 0;
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

/* Sub-block j of a K-quant super-block as the bytes vpmaddubsw takes
 * (unpack()'s u). */
Q8T_ATTR static inline AI __m256i kbytes(const enum q8_kind kind, const uint8_t *blk, int j) {
  if (kind == Q8K_Q6_K) { /* part p of half j / 4 */
    const int half = j >> 2, p = j & 3;
    __m256i hi = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * half));
    hi = _mm256_and_si256(_mm256_srl_epi16(hi, _mm_cvtsi32_si128(2 * p)), _mm256_set1_epi8(3));
    return _mm256_or_si256(nibs(blk + 64 * half + 32 * (p & 1), p >= 2), _mm256_slli_epi16(hi, 4));
  }
  const int five = kind == Q8K_Q5_K;
  __m256i u = nibs(blk + (five ? 48 : 16) + 32 * (j >> 1), j & 1);
  if (five) {
    const __m256i bit = _mm256_set1_epi8((char)(1 << j));
    const __m256i qh = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(blk + 16)), bit);
    u = _mm256_or_si256(u, _mm256_and_si256(_mm256_cmpeq_epi8(qh, bit), _mm256_set1_epi8(0x10)));
  }
  return u;
}

/* 32-element block b of a row, as kn-cpu-q8.c's weights() has it: *u the
 * unsigned bytes vpmaddubsw takes (q before the offset), *d each lane's
 * scale, *m the min (kind_min). */
Q8T_ATTR static inline AI void unpack(const enum q8_kind kind, const uint8_t *row, int b,
                                      __m256i *u, __m256 *d, __m256 *m) {
  const uint8_t *blk = row + (size_t)(kind >= Q8K_Q4_K ? b >> 3 : b) * kind_bytes(kind);
  *m = _mm256_setzero_ps();
  switch (kind) {
  case Q8K_Q4_1:
    *d = h16x8(blk);
    *m = h16x8(blk + 2);
    *u = nib32(blk + 4);
    break;
  case Q8K_Q5_1:
    *d = h16x8(blk);
    *m = h16x8(blk + 2);
    *u = _mm256_or_si256(nib32(blk + 8), bit5x32(u32le(blk + 4)));
    break;
  case Q8K_Q4_K:
  case Q8K_Q5_K: {
    const int sb = b & 7;
    int sc, mn;
    sc_min(sb, blk + 4, &sc, &mn);
    *d = _mm256_set1_ps(h16(blk) * (float)sc);
    *m = _mm256_set1_ps(-(h16(blk + 2) * (float)mn));
    *u = kbytes(kind, blk, sb);
    break;
  }
  case Q8K_Q6_K: {
    const int c = b & 7, half = c >> 2, p = c & 3;
    const int8_t *sc = (const int8_t *)(blk + 192) + 8 * half + 2 * p;
    const float dd = h16(blk + 208);
    *u = kbytes(kind, blk, c);
    __m128 d0 = _mm_set1_ps(dd * (float)sc[0]), d1 = _mm_set1_ps(dd * (float)sc[1]);
    *d = _mm256_set_m128(d1, d0);
    break;
  }
  default: break; /* Q8_0, Q4_0, Q5_0: kernels of their own */
  }
}

/* The inputs of tokens x (Q8_0 blocks ldq bytes apart, their f32 scales d B
 * apart, lane terms s B * 8 apart; struct kn_cpu_q8_in) that block b of a
 * tile takes for token u: the 8 bytes' vector, the scale in all lanes, the
 * offset's lane terms (so) and the min's (sf). */
struct q8t_x {
  const uint8_t *q;
  const float *d;
  const int32_t *s;
  size_t ldq;
};

Q8T_ATTR static inline AI void xblock(const enum q8_kind kind, const struct q8t_x *x, int B, int u,
                                      int b, __m256i *xv, __m256 *dx, __m256i *so, __m256 *sf) {
  *xv = _mm256_loadu_si256((const __m256i *)(x->q + (size_t)u * x->ldq + (size_t)b * 34 + 2));
  *dx = _mm256_broadcast_ss(x->d + (size_t)u * (size_t)B + b);
  const __m256i *s = (const __m256i *)(x->s + ((size_t)u * (size_t)B + (size_t)b) * 8);
  *so = kind_shift(kind) ? _mm256_loadu_si256(s) : _mm256_setzero_si256();
  *sf = kind_min(kind) ? _mm256_cvtepi32_ps(_mm256_loadu_si256(s)) : _mm256_setzero_ps();
}

/* The multiply-adds of one weight block (unpacked) against one input block
 * into a: the reference's operations. */
Q8T_ATTR static inline AI __m256 step(const enum q8_kind kind, __m256 a, __m256i wu, __m256 dw,
                                      __m256 mw, __m256i xv, __m256 dx, __m256i so, __m256 sf) {
  /* the offset's term first: the same integer either way */
  __m256i p = dot4(so, wu, xv);
  a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw, dx), a);
  if (kind_min(kind)) a = _mm256_fmadd_ps(sf, _mm256_mul_ps(mw, dx), a);
  return a;
}

/* One chain (blocks b0, b0 + 2, ...) of the R x U outputs of rows w (row_bytes
 * apart) and tokens x into a[]. */
Q8T_ATTR static inline AI void tile_chain(const enum q8_kind kind, const int R, const int U,
                                          const uint8_t *w, size_t row_bytes, const struct q8t_x *x,
                                          int B, int b0, __m256 *a) {
#pragma GCC unroll 16
  for (int i = 0; i < R * U; i++)
    a[i] = _mm256_setzero_ps();
  for (int b = b0; b < B; b += 2) {
    __m256i wu[Q8_RMAX];
    __m256 dw[Q8_RMAX], mw[Q8_RMAX];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
      unpack(kind, w + (size_t)r * row_bytes, b, &wu[r], &dw[r], &mw[r]);
#pragma GCC unroll 8
    for (int u = 0; u < U; u++) {
      __m256i xv, so;
      __m256 dx, sf;
      xblock(kind, x, B, u, b, &xv, &dx, &so, &sf);
#pragma GCC unroll 8
      for (int r = 0; r < R; r++)
        a[r * U + u] = step(kind, a[r * U + u], wu[r], dw[r], mw[r], xv, dx, so, sf);
    }
  }
}

#if Q8T_VNNI
/* tile_chain for 4 tokens on 512-bit registers: tokens (0, 1) in one register
 * and (2, 3) in another, each weight block unpacked once and put in both
 * halves; every lane with step()'s operations. a[r * 2 + p]: row r, tokens 2p
 * and 2p + 1. */
Q8T_ATTR static inline AI void tile_chain_z(const enum q8_kind kind, const int R, const uint8_t *w,
                                            size_t row_bytes, const struct q8t_x *x, int B, int b0,
                                            __m512 *a) {
#pragma GCC unroll 8
  for (int i = 0; i < R * 2; i++)
    a[i] = _mm512_setzero_ps();
  for (int b = b0; b < B; b += 2) {
    __m512i wu[Q8_RMAX];
    __m512 dw[Q8_RMAX], mw[Q8_RMAX];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      __m256i u;
      __m256 d, m;
      unpack(kind, w + (size_t)r * row_bytes, b, &u, &d, &m);
      wu[r] = _mm512_broadcast_i64x4(u);
      dw[r] = _mm512_broadcast_f32x8(d);
      mw[r] = kind_min(kind) ? _mm512_broadcast_f32x8(m) : _mm512_setzero_ps();
    }
#pragma GCC unroll 2
    for (int p = 0; p < 2; p++) {
      __m256i xv[2], so[2];
      __m256 dx[2], sf[2];
#pragma GCC unroll 2
      for (int h = 0; h < 2; h++)
        xblock(kind, x, B, 2 * p + h, b, &xv[h], &dx[h], &so[h], &sf[h]);
      const __m512i X = _mm512_inserti64x4(_mm512_castsi256_si512(xv[0]), xv[1], 1);
      const __m512i S = _mm512_inserti64x4(_mm512_castsi256_si512(so[0]), so[1], 1);
      const __m512 D = _mm512_insertf32x8(_mm512_castps256_ps512(dx[0]), dx[1], 1);
      const __m512 F = _mm512_insertf32x8(_mm512_castps256_ps512(sf[0]), sf[1], 1);
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) {
        __m512 *ar = &a[r * 2 + p];
        __m512i q = _mm512_dpbusd_epi32(S, wu[r], X);
        *ar = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), _mm512_mul_ps(dw[r], D), *ar);
        if (kind_min(kind)) *ar = _mm512_fmadd_ps(F, _mm512_mul_ps(mw[r], D), *ar);
      }
    }
  }
}
#endif

/* Block b of R rows against one token's, into the chain a[]. */
Q8T_ATTR static inline AI void block1(const enum q8_kind kind, const int R, __m256 *a,
                                      const uint8_t *w, size_t row_bytes, const struct q8t_x *x,
                                      int B, int b) {
  __m256i xv, so;
  __m256 dx, sf;
  xblock(kind, x, B, 0, b, &xv, &dx, &so, &sf);
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) {
    __m256i wu;
    __m256 dw, mw;
    unpack(kind, w + (size_t)r * row_bytes, b, &wu, &dw, &mw);
    a[r] = step(kind, a[r], wu, dw, mw, xv, dx, so, sf);
  }
}

#if Q8T_VNNI
/* A K-quant super-block's scales as unpack() rounds them: Q4_K / Q5_K, the 8
 * sub-blocks' d sc in lanes 0..7 of *ds and -(dmin min) in lanes 8..15 of
 * *ms; Q6_K, its 16 scales' dd sc in lanes 0..15 of *ds. */
Q8T_ATTR static inline AI void ksc(const enum q8_kind kind, const uint8_t *blk, __m512 *ds,
                                   __m512 *ms) {
  if (kind == Q8K_Q6_K) {
    const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192)));
    *ds = _mm512_mul_ps(_mm512_set1_ps(h16(blk + 208)), _mm512_cvtepi32_ps(sc));
    *ms = _mm512_setzero_ps();
    return;
  }
  uint32_t u[3]; /* sc_min()'s six bits, four pairs a word */
  memcpy(u, blk + 4, 12);
  const uint32_t sc = u[0] & 0x3F3F3F3F, mn = u[1] & 0x3F3F3F3F,
                 sc4 = (u[2] & 0x0F0F0F0F) | (u[0] >> 6 & 0x03030303) << 4,
                 mn4 = (u[2] >> 4 & 0x0F0F0F0F) | (u[1] >> 6 & 0x03030303) << 4;
  const __m512 f = _mm512_cvtepi32_ps(
      _mm512_cvtepu8_epi32(_mm_setr_epi32((int)sc, (int)sc4, (int)mn, (int)mn4)));
  *ds = _mm512_mul_ps(_mm512_set1_ps(h16(blk)), f);
  *ms = _mm512_mul_ps(_mm512_set1_ps(-h16(blk + 2)), f);
}

/* Sub-blocks 2 j and 2 j + 1, one in each half. */
Q8T_ATTR static inline AI __m512i kpair(const enum q8_kind kind, const uint8_t *blk, int j) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(kbytes(kind, blk, 2 * j)),
                            kbytes(kind, blk, 2 * j + 1), 1);
}

/* rows1 of the K-quants on 512-bit registers: a super-block's scales taken
 * once a row (ksc), then its sub-blocks in pairs (b, b + 1), the even chain's
 * block in lanes 0..7 and the odd one's in 8..15: one register of weights,
 * one vpdpbusd and the multiply-adds of both blocks, each lane with step()'s
 * operations. */
Q8T_ATTR static inline AI void rows1_k(const enum q8_kind kind, const int R, float *out,
                                       const uint8_t *w, size_t row_bytes, const struct q8t_x *x,
                                       int B, int acc) {
  const int six = kind == Q8K_Q6_K;
  const size_t kb = kind_bytes(kind);
  /* the scale of each lane of a pair: Q4_K / Q5_K's d sc (lanes 0..7: 2 j,
   * 8..15: 2 j + 1) and mins (8 on), Q6_K's four (4 j .. 4 j + 3, four lanes each) */
  const __m512i id0 = six ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
                          : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                idm = _mm512_add_epi32(id0, _mm512_set1_epi32(8));
  __m512 a[Q8_RMAX];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
    a[r] = _mm512_setzero_ps();
  for (int sb = 0; sb < B / 8; sb++) {
    __m512 ds[Q8_RMAX], ms[Q8_RMAX];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
      ksc(kind, w + (size_t)r * row_bytes + (size_t)sb * kb, &ds[r], &ms[r]);
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
      const int b = 8 * sb + 2 * j;
      const uint8_t *xb = x->q + (size_t)b * 34 + 2;
      const __m512i X =
          _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)xb)),
                             _mm256_loadu_si256((const __m256i *)(xb + 34)), 1);
      const __m512 D = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_broadcast_ss(x->d + b)),
                                          _mm256_broadcast_ss(x->d + b + 1), 1);
      const __m512i S = _mm512_loadu_si512((const void *)(x->s + (size_t)b * 8));
      const __m512i is = _mm512_add_epi32(id0, _mm512_set1_epi32(six ? 4 * j : 2 * j)),
                    im = _mm512_add_epi32(idm, _mm512_set1_epi32(2 * j));
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) {
        const uint8_t *blk = w + (size_t)r * row_bytes + (size_t)sb * kb;
        const __m512i q =
            _mm512_dpbusd_epi32(six ? S : _mm512_setzero_si512(), kpair(kind, blk, j), X);
        a[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q),
                               _mm512_mul_ps(_mm512_permutexvar_ps(is, ds[r]), D), a[r]);
        if (!six)
          a[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S),
                                 _mm512_mul_ps(_mm512_permutexvar_ps(im, ms[r]), D), a[r]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
    put1(out + r,
         kn_avx2_hsum(_mm256_add_ps(_mm512_castps512_ps256(a[r]), _mm512_extractf32x8_ps(a[r], 1))),
         acc);
}
#endif

/* One token's R outputs, both chains block after block (decode: each row
 * streamed once). */
Q8T_ATTR static inline AI void rows1(const enum q8_kind kind, const int R, float *out,
                                     const uint8_t *w, size_t row_bytes, const struct q8t_x *x,
                                     int B, int acc) {
#if Q8T_VNNI
  if (kind == Q8K_Q4_K || kind == Q8K_Q5_K || kind == Q8K_Q6_K) {
    rows1_k(kind, R, out, w, row_bytes, x, B, acc);
    return;
  }
#endif
  __m256 e[Q8_RMAX], o[Q8_RMAX];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
    e[r] = o[r] = _mm256_setzero_ps();
  int b = 0;
  for (; b + 2 <= B; b += 2) {
    block1(kind, R, e, w, row_bytes, x, B, b);
    block1(kind, R, o, w, row_bytes, x, B, b + 1);
  }
  if (b < B) block1(kind, R, e, w, row_bytes, x, B, b);
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
    put1(out + r, kn_avx2_hsum(_mm256_add_ps(e[r], o[r])), acc);
}

Q8T_ATTR static inline AI void tile(const enum q8_kind kind, const int R, const int U, float *out,
                                    ptrdiff_t ldo, const struct q8t_x *x, const uint8_t *w,
                                    size_t row_bytes, int B, int acc) {
  if (U == 1) {
    rows1(kind, R, out, w, row_bytes, x, B, acc);
    return;
  }
#if Q8T_VNNI
  if (U == 4) {
    __m512 ez[Q8_RMAX * 2], oz[Q8_RMAX * 2];
    tile_chain_z(kind, R, w, row_bytes, x, B, 0, ez);
    tile_chain_z(kind, R, w, row_bytes, x, B, 1, oz);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
      for (int u = 0; u < 4; u++) {
        const __m512 t = _mm512_add_ps(ez[r * 2 + u / 2], oz[r * 2 + u / 2]);
        put1(out + (ptrdiff_t)u * ldo + r,
             kn_avx2_hsum(u & 1 ? _mm512_extractf32x8_ps(t, 1) : _mm512_castps512_ps256(t)), acc);
      }
    return;
  }
#endif
  __m256 e[Q8_RMAX * Q8_U], o[Q8_RMAX * Q8_U];
  tile_chain(kind, R, U, w, row_bytes, x, B, 0, e);
  tile_chain(kind, R, U, w, row_bytes, x, B, 1, o);
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
#pragma GCC unroll 8
    for (int u = 0; u < U; u++)
      put1(out + (ptrdiff_t)u * ldo + r, kn_avx2_hsum(_mm256_add_ps(e[r * U + u], o[r * U + u])),
           acc);
}

/* The tile of r rows (<= Q8_R, one token's <= Q8_R1) x u (<= Q8_U) tokens,
 * each shape compiled on its own (shapes beyond the tile's are never asked
 * for). */
#define Q8T_CLAMP(v, m) ((v) < (m) ? (v) : (m))
#define Q8T_CASE(KIND, R, U)                                                                       \
  case R * 8 + U:                                                                                  \
    tile(KIND, Q8T_CLAMP(R, (U) == 1 ? Q8_R1 : Q8_R), Q8T_CLAMP(U, Q8_U), out, ldo, x, w,          \
         row_bytes, B, acc);                                                                       \
    break;
#define Q8T_CASES(KIND, R)                                                                         \
  Q8T_CASE(KIND, R, 1) Q8T_CASE(KIND, R, 2) Q8T_CASE(KIND, R, 3) Q8T_CASE(KIND, R, 4)
#define DEF_TILES(SUF, KIND)                                                                       \
  Q8T_ATTR static void tiles_##SUF(int r, int u, float *out, ptrdiff_t ldo, const struct q8t_x *x, \
                                   const uint8_t *w, size_t row_bytes, int B, int acc) {           \
    switch (r * 8 + u) {                                                                           \
      Q8T_CASES(KIND, 1)                                                                           \
      Q8T_CASES(KIND, 2)                                                                           \
      Q8T_CASES(KIND, 3)                                                                           \
      Q8T_CASES(KIND, 4)                                                                           \
    }                                                                                              \
  }

DEF_TILES(q4_1, Q8K_Q4_1)
DEF_TILES(q5_1, Q8K_Q5_1)
DEF_TILES(q4_k, Q8K_Q4_K)
DEF_TILES(q5_k, Q8K_Q5_K)
DEF_TILES(q6_k, Q8K_Q6_K)

typedef void (*tiles_fn)(int r, int u, float *out, ptrdiff_t ldo, const struct q8t_x *x,
                         const uint8_t *w, size_t row_bytes, int B, int acc);

/* Prefetches w's bytes from *pf up to want (at most end), a line at a time. */
static inline AI void prefetch_to(const uint8_t **pf, const uint8_t *want, const uint8_t *end) {
  for (want = want < end ? want : end; *pf < want; *pf += 64)
    _mm_prefetch((const char *)*pf, _MM_HINT_T0);
}

/* Groups of rows that fit L1, each swept by tiles across all T tokens. */
Q8T_ATTR static void tiled(tiles_fn f, float *out, ptrdiff_t ldo, const struct kn_cpu_q8_in *in,
                           const uint8_t *w, size_t row_bytes, int K, int T, int n, int acc) {
  const int B = K / 32;
  int G = (int)(Q8_GROUP_BYTES / row_bytes) / Q8_RMAX * Q8_RMAX;
  if (G < Q8_RMAX) G = Q8_RMAX;
  for (int j0 = 0; j0 < n; j0 += G) {
    const int j1 = j0 + G < n ? j0 + G : n;
    for (int t = 0; t < T; t += Q8_U) {
      const int u = T - t < Q8_U ? T - t : Q8_U, R = u == 1 ? Q8_R1 : Q8_R;
      const struct q8t_x x = {in->q + (size_t)t * in->ldq, in->d + (size_t)t * (size_t)B,
                              in->s + (size_t)t * (size_t)B * 8, in->ldq};
      const uint8_t *pf = w + (size_t)j0 * row_bytes; /* the first byte not prefetched */
      for (int j = j0; j < j1; j += R) {
        if (u == 1) { /* decode streams each row once from memory: ask for it ahead, */
          const uint8_t *want = w + (size_t)(j + R) * row_bytes + Q8_PREFETCH_BYTES;
          /* at most Q8_PREFETCH_BYTES a tile: a K-quant tile's rows (15 KB) asked
           * for at once fill the line buffers and stall the tile */
          if (want > pf + Q8_PREFETCH_BYTES) want = pf + Q8_PREFETCH_BYTES;
          prefetch_to(&pf, want, w + (size_t)n * row_bytes);
        }
        f(j1 - j < R ? j1 - j : R, u, out + (ptrdiff_t)t * ldo + j, ldo, &x,
          w + (size_t)j * row_bytes, row_bytes, B, acc);
      }
    }
  }
}

/* q8dot of each format: the tiles at every T. */
#define DEF_Q8DOT(SUF)                                                                             \
  Q8T_ATTR static void q8dot_##SUF(float *out, ptrdiff_t ldo, const struct kn_cpu_q8_in *x,        \
                                   const uint8_t *w, size_t row_bytes, int K, int T, int n,        \
                                   int acc) {                                                      \
    tiled(tiles_##SUF, out, ldo, x, w, row_bytes, K, T, n, acc);                                   \
  }

DEF_Q8DOT(q4_1)
DEF_Q8DOT(q5_1)
DEF_Q8DOT(q4_k)
DEF_Q8DOT(q5_k)
DEF_Q8DOT(q6_k)

/* ---- Q8_0, Q4_0 and Q5_0: one integer a block ---------------------------------- */

/* Several tokens: the tokens side by side in a register's lanes (struct
 * kn_cpu_q8_in's xi), each weight row's four bytes at a time broadcast to
 * every lane, so a lane sums its token's block products into one integer and
 * adds it times the scales into its own accumulator: no reduction, and the
 * weight's unpacking shared by the register's tokens. AVX-512 VNNI: 16
 * tokens to a register; AVX2: 8, a group of 16 in two halves. */
#if Q8T_VNNI && Q8T_ZMM
#define Q8_TL 16
typedef __m512i q8vi;
typedef __m512 q8vf;
#define vi_load(p)      _mm512_loadu_si512((const void *)(p))
#define vf_load(p)      _mm512_loadu_ps(p)
#define vi_bcast4(p)    _mm512_set1_epi32((int)u32le(p))
#define vi_set1_8(v)    _mm512_set1_epi8((char)(v))
#define vi_and(a, b)    _mm512_and_si512(a, b)
#define vi_or(a, b)     _mm512_or_si512(a, b)
#define vi_fifth(p)     _mm512_maskz_mov_epi8(_load_mask64((__mmask64 *)(p)), _mm512_set1_epi8(0x10))
#define vi_xor(a, b)    _mm512_xor_si512(a, b)
#define vi_add(a, b)    _mm512_add_epi32(a, b)
#define vi_srai4(a)     _mm512_srai_epi32(a, 4)
#define vi_zero()       _mm512_setzero_si512()
#define vi_dot(c, u, s) _mm512_dpbusd_epi32(c, u, s)
#define vf_zero()       _mm512_setzero_ps()
#define vf_set1(v)      _mm512_set1_ps(v)
#define vf_mul(a, b)    _mm512_mul_ps(a, b)
#define vf_fma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define vf_cvt(a)       _mm512_cvtepi32_ps(a)
#define vf_store(p, a)  _mm512_storeu_ps(p, a)
#define vi_set1_32(v)   _mm512_set1_epi32(v)
#define vi_srli16_4(a)  _mm512_srli_epi16(a, 4)
#define vf_h16(p)       _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define vf_add(a, b)    _mm512_add_ps(a, b)
#define Q8_XU           8 /* tokens of an X16 tile: each register of weights serves them all */
#else
#define Q8_TL           8
typedef __m256i q8vi;
typedef __m256 q8vf;
#define vi_load(p)      _mm256_loadu_si256((const __m256i *)(p))
#define vf_load(p)      _mm256_loadu_ps(p)
#define vi_bcast4(p)    _mm256_set1_epi32((int)u32le(p))
#define vi_set1_8(v)    _mm256_set1_epi8((char)(v))
#define vi_and(a, b)    _mm256_and_si256(a, b)
#define vi_or(a, b)     _mm256_or_si256(a, b)
#define vi_fifth(p)     bit5x32(u32le(p))
#define vi_xor(a, b)    _mm256_xor_si256(a, b)
#define vi_add(a, b)    _mm256_add_epi32(a, b)
#define vi_srai4(a)     _mm256_srai_epi32(a, 4)
#define vi_zero()       _mm256_setzero_si256()
#define vi_dot(c, u, s) dot4(c, u, s)
#define vf_zero()       _mm256_setzero_ps()
#define vf_set1(v)      _mm256_set1_ps(v)
#define vf_mul(a, b)    _mm256_mul_ps(a, b)
#define vf_fma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define vf_cvt(a)       _mm256_cvtepi32_ps(a)
#define vf_store(p, a)  _mm256_storeu_ps(p, a)
#define vi_set1_32(v)   _mm256_set1_epi32(v)
#define vi_srli16_4(a)  _mm256_srli_epi16(a, 4)
#define vf_h16(p)       _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define vf_add(a, b)    _mm256_add_ps(a, b)
#define Q8_XU           4 /* AVX2's 16 registers */
#endif

/* Rows of a tile of tokens side by side, and its registers of tokens (NG of
 * Q8_TL each): a weight's unpacking is shared by Q8_NG * Q8_TL tokens. */
#if Q8T_ZMM
#define Q8_TR 4
#else
#define Q8_TR 2 /* AVX2's 16 registers */
#endif
#define Q8_NG 2

/* Rows whose results a sweep of tiles puts in a buffer first, and its stride
 * (not a power of two). */
#define Q8_SR  64
#define Q8_SLD (Q8_SR + 8)

/* Token register v's inputs from block 0 (struct kn_cpu_q8_in's xi, di, si):
 * block b's at x + Q8_XB b (four elements j at + 4 * KN_CPU_Q8_GROUP * j),
 * d + KN_CPU_Q8_GROUP b, s + KN_CPU_Q8_GROUP b. */
#define Q8_XB (8 * 4 * KN_CPU_Q8_GROUP)
struct q8_tv {
  const int8_t *x;
  const float *d;
  const int32_t *s;
};

static inline AI struct q8_tv tv_at(const struct kn_cpu_q8_in *in, int B, int v) {
  const size_t GS = KN_CPU_Q8_GROUP, g = (size_t)v * Q8_TL / GS, h = (size_t)v * Q8_TL % GS;
  return (struct q8_tv){in->xi + g * (size_t)B * Q8_XB + h * 4, in->di + g * (size_t)B * GS + h,
                        in->si + g * (size_t)B * GS + h};
}

/* Block b of a weight row (blk) against NG token registers' block, as one
 * integer a lane each: p[g] (the offset's term included). */
Q8T_ATTR static inline AI void int_block(const enum q8_kind kind, const int NG, const uint8_t *blk,
                                         const struct q8_tv *tv, size_t b, q8vi *p) {
#define XQ(g, k) vi_load(tv[g].x + Q8_XB * b + 4 * KN_CPU_Q8_GROUP * (k))
#define SO(g)    vi_load(tv[g].s + KN_CPU_Q8_GROUP * b)
#if Q8T_VNNI
  /* two chains of four vpdpbusd, the first from the offset's term: Q4_0's low
   * nibbles against elements 0..15 and its high ones in place (16 q: their
   * sum is 16 times theirs, shifted back exactly) against 16..31; Q8_0's
   * w + 128 unsigned against x, even and odd four-element groups */
  q8vi ua[4], uc[4], a[Q8_NG], c[Q8_NG];
  int ka[4], kc[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    if (kind == Q8K_Q4_0) {
      const q8vi v = vi_bcast4(blk + 2 + 4 * i);
      ua[i] = vi_and(v, vi_set1_8(0x0F)), uc[i] = vi_and(v, vi_set1_8(0xF0));
      ka[i] = i, kc[i] = i + 4;
    } else {
      ua[i] = vi_xor(vi_bcast4(blk + 2 + 8 * i), vi_set1_8(0x80));
      uc[i] = vi_xor(vi_bcast4(blk + 6 + 8 * i), vi_set1_8(0x80));
      ka[i] = 2 * i, kc[i] = 2 * i + 1;
    }
  }
#pragma GCC unroll 2
  for (int g = 0; g < NG; g++)
    a[g] = SO(g), c[g] = vi_zero();
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++)
#pragma GCC unroll 2
    for (int g = 0; g < NG; g++) {
      a[g] = vi_dot(a[g], ua[i], XQ(g, ka[i]));
      c[g] = vi_dot(c[g], uc[i], XQ(g, kc[i]));
    }
#pragma GCC unroll 2
  for (int g = 0; g < NG; g++)
    p[g] = vi_add(a[g], kind == Q8K_Q4_0 ? vi_srai4(c[g]) : c[g]);
#else
  if (kind == Q8K_Q4_0) {
#pragma GCC unroll 2
    for (int g = 0; g < NG; g++) /* vpmaddubsw's pairs would saturate with 16 q */
      p[g] = SO(g);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
      const q8vi v = vi_bcast4(blk + 2 + 4 * k), l = vi_and(v, vi_set1_8(0x0F)),
                 h = vi_and(_mm256_srli_epi16(v, 4), vi_set1_8(0x0F));
#pragma GCC unroll 2
      for (int g = 0; g < NG; g++)
        p[g] = vi_dot(vi_dot(p[g], l, XQ(g, k)), h, XQ(g, k + 4));
    }
    return;
  }
  /* Q8_0: |w| against x with w's sign (inputs are never -128) */
#pragma GCC unroll 2
  for (int g = 0; g < NG; g++)
    p[g] = vi_zero();
#pragma GCC unroll 8
  for (int k = 0; k < 8; k++) {
    const q8vi v = vi_bcast4(blk + 2 + 4 * k), a = _mm256_abs_epi8(v);
#pragma GCC unroll 2
    for (int g = 0; g < NG; g++)
      p[g] = vi_dot(p[g], a, _mm256_sign_epi8(XQ(g, k), v));
  }
#endif
#undef XQ
#undef SO
}

/* Rows rp[0 .. Q8_TR) (the last valid one repeated past nr) against NG
 * token registers from v0 (nt tokens real in all): out[u * ldo + r] = the
 * sum for u < nt, r < nr. */
Q8T_ATTR static inline AI void tok_tile(const enum q8_kind kind, const int NG, float *out,
                                        ptrdiff_t ldo, const struct kn_cpu_q8_in *x, int v0, int nt,
                                        const uint8_t *const *rp, int nr, int B) {
  struct q8_tv tv[Q8_NG];
  q8vf f[Q8_NG][Q8_TR];
#pragma GCC unroll 2
  for (int g = 0; g < NG; g++) {
    tv[g] = tv_at(x, B, v0 + g);
#pragma GCC unroll 8
    for (int r = 0; r < Q8_TR; r++)
      f[g][r] = vf_zero();
  }
  for (int b = 0; b < B; b++) {
#pragma GCC unroll 8
    for (int r = 0; r < Q8_TR; r++) {
      const uint8_t *blk = rp[r] + (size_t)b * kind_bytes(kind);
      q8vi p[Q8_NG];
      int_block(kind, NG, blk, tv, (size_t)b, p);
      const q8vf dw = vf_set1(h16(blk));
#pragma GCC unroll 2
      for (int g = 0; g < NG; g++)
        f[g][r] = vf_fma(vf_cvt(p[g]), vf_mul(dw, vf_load(tv[g].d + KN_CPU_Q8_GROUP * (size_t)b)),
                         f[g][r]);
    }
  }
  float v[Q8_TL];
#pragma GCC unroll 2
  for (int g = 0; g < NG; g++)
#pragma GCC unroll 8
    for (int r = 0; r < Q8_TR; r++) {
      if (r >= nr) break;
      vf_store(v, f[g][r]);
      for (int u = 0; u < Q8_TL && g * Q8_TL + u < nt; u++)
        out[(ptrdiff_t)(g * Q8_TL + u) * ldo + r] = v[u];
    }
}

/* The half sums of eight vectors: lane i of *l is the sum of p[i]'s lanes
 * 0..3, of *h of its lanes 4..7. */
KN_AVX2 static inline AI void hsum8_halves(const __m256i *p, __m256i *l, __m256i *h) {
  __m256i a0 = _mm256_hadd_epi32(p[0], p[1]), a1 = _mm256_hadd_epi32(p[2], p[3]);
  __m256i a2 = _mm256_hadd_epi32(p[4], p[5]), a3 = _mm256_hadd_epi32(p[6], p[7]);
  __m256i b0 = _mm256_hadd_epi32(a0, a1), b1 = _mm256_hadd_epi32(a2, a3);
  *l = _mm256_permute2x128_si256(b0, b1, 0x20);
  *h = _mm256_permute2x128_si256(b0, b1, 0x31);
}

/* The lanes' sums of eight vectors: lane i of the result is p[i]'s. */
KN_AVX2 static inline AI __m256i hsum8_epi32(const __m256i *p) {
  __m256i l, h;
  hsum8_halves(p, &l, &h);
  return _mm256_add_epi32(l, h);
}

/* The f16 scales at p[r] + off of eight rows, as f32 lanes. */
KN_AVX2 static inline AI __m256 scales8(const uint8_t *const *p, size_t off) {
  uint16_t h[8];
#pragma GCC unroll 8
  for (int r = 0; r < 8; r++)
    memcpy(&h[r], p[r] + off, 2);
  return _mm256_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3],
                                        (short)h[4], (short)h[5], (short)h[6], (short)h[7]));
}

/* Tokens of a row tile (each weight block unpacked once for them). */
#define Q8_RU 4

/* Reduces eight rows' registers p[] and adds their sums (plus the offset's
 * term o) times the scales into f: lane r is row r's. */
KN_AVX2 static inline AI __m256 row_fma(__m256 f, const __m256i *p, int o, __m256 dw, float dx) {
  const __m256i v = _mm256_add_epi32(hsum8_epi32(p), _mm256_set1_epi32(o));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(dw, _mm256_set1_ps(dx)), f);
}

/* U tokens from t (a few: decode, or a few sequences' steps): eight rows
 * rp[] (the last valid one repeated past nr) side by side in the lanes, each
 * row's block summed in a register of its own and the eight reduced together
 * into one: out[u * ldo + r] for u < U, r < nr. Each weight block is
 * unpacked once for the U tokens. Q4_0 takes blocks in pairs (b, b + 1): one
 * load of both blocks' nibbles gives their low ones (elements 0..15 of b in
 * lanes 0..3, of b + 1 in lanes 4..7) after a mask and their high ones after
 * a shift, so a row's register holds both blocks' sums, four lanes each; the
 * offset's term (the sum of the block's s lanes) is added once the rows are
 * reduced. */
Q8T_ATTR static inline AI void row_tile(const enum q8_kind kind, const int U, float *out,
                                        ptrdiff_t ldo, const struct kn_cpu_q8_in *x, int t,
                                        const uint8_t *const *rp, int nr, int B, int acc) {
  const size_t kb = kind_bytes(kind), B8 = (size_t)B * 8;
  const uint8_t *xr = x->q + (size_t)t * x->ldq;
  const float *dx = x->d + (size_t)t * (size_t)B;
  const int32_t *s = x->s + (size_t)t * B8;
  __m256 f[Q8_RU];
#pragma GCC unroll 4
  for (int u = 0; u < U; u++)
    f[u] = _mm256_setzero_ps();
  int b = 0;
  if (kind == Q8K_Q4_0)
    for (; b + 2 <= B; b += 2) {
      __m256i wl[8], wh[8];
#pragma GCC unroll 8
      for (int r = 0; r < 8; r++) {
        const uint8_t *b0 = rp[r] + (size_t)b * 18 + 2;
        const __m256i v = _mm256_loadu2_m128i((const __m128i *)(b0 + 18), (const __m128i *)b0);
        const __m256i m4 = _mm256_set1_epi8(0xF);
        wl[r] = _mm256_and_si256(v, m4);
        wh[r] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      }
      const __m256 d0 = scales8(rp, (size_t)b * 18), d1 = scales8(rp, (size_t)b * 18 + 18);
#pragma GCC unroll 4
      for (int u = 0; u < U; u++) {
        const uint8_t *x0 = xr + (size_t)u * x->ldq + (size_t)b * 34 + 2, *x1 = x0 + 34;
        const __m256i xl = _mm256_loadu2_m128i((const __m128i *)x1, (const __m128i *)x0),
                      xh = _mm256_loadu2_m128i((const __m128i *)(x1 + 16),
                                               (const __m128i *)(x0 + 16));
        __m256i p[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++)
          p[r] = dot4(dot4(_mm256_setzero_si256(), wl[r], xl), wh[r], xh);
        __m256i q[2]; /* the eight rows' sums of block b, of b + 1 */
        hsum8_halves(p, &q[0], &q[1]);
        const int32_t *ou = x->o + (size_t)(t + u) * (size_t)B + b;
        const int o0 = ou[0], o1 = ou[1];
        const float *du = dx + (size_t)u * (size_t)B + b;
        f[u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(q[0], _mm256_set1_epi32(o0))),
                               _mm256_mul_ps(d0, _mm256_set1_ps(du[0])), f[u]);
        f[u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(q[1], _mm256_set1_epi32(o1))),
                               _mm256_mul_ps(d1, _mm256_set1_ps(du[1])), f[u]);
      }
    }
  for (; b < B; b++) {
    __m256i wv[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) {
      const uint8_t *blk = rp[r] + (size_t)b * kb;
      if (kind == Q8K_Q4_0)
        wv[r] = nib32(blk + 2);
      else if (kind == Q8K_Q5_0)
        wv[r] = _mm256_or_si256(nib32(blk + 6), bit5x32(u32le(blk + 2)));
      else
        wv[r] = _mm256_loadu_si256((const __m256i *)(blk + 2));
#if Q8T_VNNI
      if (kind == Q8K_Q8_0) wv[r] = _mm256_xor_si256(wv[r], _mm256_set1_epi8((char)0x80));
#endif
    }
    const __m256 dw = scales8(rp, (size_t)b * kb);
#pragma GCC unroll 4
    for (int u = 0; u < U; u++) {
      const __m256i xv =
          _mm256_loadu_si256((const __m256i *)(xr + (size_t)u * x->ldq + (size_t)b * 34 + 2));
      const __m256i so = kind != Q8K_Q8_0 || Q8T_VNNI
                             ? _mm256_loadu_si256((const __m256i *)(s + (size_t)u * B8 + b * 8))
                             : _mm256_setzero_si256();
      __m256i p[8];
#pragma GCC unroll 8
      for (int r = 0; r < 8; r++) {
#if Q8T_VNNI
        p[r] = dot4(so, wv[r], xv);
#else
        p[r] = kind != Q8K_Q8_0 ? dot4(so, wv[r], xv)
                                : dot4(so, _mm256_abs_epi8(wv[r]), _mm256_sign_epi8(xv, wv[r]));
#endif
      }
      f[u] = row_fma(f[u], p, 0, dw, dx[(size_t)u * (size_t)B + b]);
    }
  }
  float v[8];
#pragma GCC unroll 4
  for (int u = 0; u < U; u++) {
    _mm256_storeu_ps(v, f[u]);
    for (int r = 0; r < nr; r++)
      put1(out + (ptrdiff_t)u * ldo + r, v[r], acc);
  }
}

/* The rows from j, Q8_TR or 8 of them, the last valid one repeated. */
static inline AI void tile_rows(const uint8_t **rp, int R, const uint8_t *w, size_t row_bytes,
                                int j, int nr) {
  for (int r = 0; r < R; r++)
    rp[r] = w + (size_t)(j + (r < nr ? r : nr - 1)) * row_bytes;
}

/* The bytes of inputs a sweep of the X16 groups takes (L2). */
#define Q8_XTOK_BYTES (192 * 1024)

/* U tokens from t (a few: decode, or a few sequences' steps) against the 16
 * rows of an X16 group (g: its block 0), rows in the lanes (Q8_TL of them at
 * a time): a lane's block is one integer, its offset's term included, times
 * the two scales into the lane's accumulator, block after block;
 * out[u * ldo + r] for u < U, r < 16. Each register of weights serves the U
 * tokens, each with its four inputs broadcast. */
Q8T_ATTR static inline AI void x16_tile(const enum q8_kind kind, const int U, float *out,
                                        ptrdiff_t ldo, const struct kn_cpu_q8_in *x, int t,
                                        const uint8_t *g, int B, int acc) {
  const size_t gb = KN_X16_ROWS * kind_bytes(kind);
  const uint8_t *xq[Q8_XU];
  const float *dx[Q8_XU];
  const int32_t *xo[Q8_XU];
#pragma GCC unroll 8
  for (int u = 0; u < U; u++) {
    xq[u] = x->q + (size_t)(t + u) * x->ldq + 2;
    dx[u] = x->d + (size_t)(t + u) * (size_t)B;
    xo[u] = x->o + (size_t)(t + u) * (size_t)B;
  }
#pragma GCC unroll 2
  for (int h = 0; h < KN_X16_ROWS / Q8_TL; h++) { /* AVX2: rows 0..7, then 8..15 */
    q8vf f[Q8_XU];
#pragma GCC unroll 8
    for (int u = 0; u < U; u++)
      f[u] = vf_zero();
    for (int b = 0; b < B; b++) {
      const uint8_t *blk = g + (size_t)b * gb, *qs = blk + 32 + 4 * Q8_TL * h;
      q8vi p[Q8_XU];
#pragma GCC unroll 8
      for (int u = 0; u < U; u++) /* the offset's term (AVX2's Q8_0 has none: signs) */
        p[u] = kind != Q8K_Q8_0 || Q8T_VNNI ? vi_set1_32(xo[u][b]) : vi_zero();
#if !Q8T_VNNI
      if (kind == Q8K_Q4_0) {
        /* vpmaddubsw's pairs of 15 x 127 summed in 16 bits: eight of them fit */
        __m256i s16[Q8_XU];
#pragma GCC unroll 8
        for (int u = 0; u < U; u++)
          s16[u] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
          const __m256i v = vi_load(qs + 64 * c), l = vi_and(v, vi_set1_8(0x0F)),
                        hi = vi_and(vi_srli16_4(v), vi_set1_8(0x0F));
#pragma GCC unroll 8
          for (int u = 0; u < U; u++) {
            const __m256i a = _mm256_maddubs_epi16(l, vi_bcast4(xq[u] + 34 * (size_t)b + 4 * c)),
                          e = _mm256_maddubs_epi16(hi,
                                                   vi_bcast4(xq[u] + 34 * (size_t)b + 16 + 4 * c));
            s16[u] = _mm256_add_epi16(s16[u], _mm256_add_epi16(a, e));
          }
        }
#pragma GCC unroll 8
        for (int u = 0; u < U; u++)
          p[u] = _mm256_add_epi32(p[u], _mm256_madd_epi16(s16[u], _mm256_set1_epi16(1)));
      } else
#endif
          if (kind != Q8K_Q8_0) {
        /* Q5_0: each quad register's fifth bits from its two planes (the
         * low and the high nibbles'), this half's rows at 4 h */
        const uint8_t *planes = blk + 32 + 256 + 4 * h;
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
          const q8vi v = vi_load(qs + 64 * c);
          q8vi l = vi_and(v, vi_set1_8(0x0F)), hi = vi_and(vi_srli16_4(v), vi_set1_8(0x0F));
          if (kind == Q8K_Q5_0) {
            l = vi_or(l, vi_fifth(planes + 16 * c));
            hi = vi_or(hi, vi_fifth(planes + 16 * c + 8));
          }
#pragma GCC unroll 8
          for (int u = 0; u < U; u++)
            p[u] = vi_dot(vi_dot(p[u], l, vi_bcast4(xq[u] + 34 * (size_t)b + 4 * c)), hi,
                          vi_bcast4(xq[u] + 34 * (size_t)b + 16 + 4 * c));
        }
      } else {
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
          const q8vi v = vi_load(qs + 64 * c);
#if Q8T_VNNI
          const q8vi uw = vi_xor(v, vi_set1_8(0x80)); /* w + 128 unsigned */
#pragma GCC unroll 8
          for (int u = 0; u < U; u++)
            p[u] = vi_dot(p[u], uw, vi_bcast4(xq[u] + 34 * (size_t)b + 4 * c));
#else
          const __m256i a = _mm256_abs_epi8(v); /* |w| against x with w's sign */
#pragma GCC unroll 8
          for (int u = 0; u < U; u++)
            p[u] = vi_dot(p[u], a, _mm256_sign_epi8(vi_bcast4(xq[u] + 34 * (size_t)b + 4 * c), v));
#endif
        }
      }
      const q8vf dw = vf_h16(blk + 2 * Q8_TL * h);
#pragma GCC unroll 8
      for (int u = 0; u < U; u++)
        f[u] = vf_fma(vf_cvt(p[u]), vf_mul(dw, vf_set1(dx[u][b])), f[u]);
    }
#pragma GCC unroll 8
    for (int u = 0; u < U; u++) {
      float *o = out + (ptrdiff_t)u * ldo + Q8_TL * h;
      vf_store(o, acc ? vf_add(vf_load(o), f[u]) : f[u]);
    }
  }
}

Q8T_ATTR static inline AI void int_dot(const enum q8_kind kind, const int il, float *out,
                                       ptrdiff_t ldo, const struct kn_cpu_q8_in *x,
                                       const uint8_t *w, size_t row_bytes, int K, int T, int n,
                                       int acc) {
  const int B = K / 32, ng = il ? n / KN_X16_ROWS * KN_X16_ROWS : 0; /* rows in X16 groups */
  const uint8_t *rp[8];
  if (x->xi && !il) { /* the rows as they are, at least KN_CPU_Q8_TOKENS tokens */
    /* token registers outside, their inputs near across the rows; the tiles'
     * results for Q8_SR rows go to a buffer first and then to out a token's
     * row at a time (a tile writes a line for each of its tokens, and ldo is
     * often a power of two: in out, those lines would share one L1 set) */
    float sb[Q8_NG * Q8_TL * Q8_SLD] __attribute__((aligned(64)));
    for (int t0 = 0; t0 < T; t0 += Q8_NG * Q8_TL) {
      const int nt = T - t0 < Q8_NG * Q8_TL ? T - t0 : Q8_NG * Q8_TL;
      for (int j0 = 0; j0 < n; j0 += Q8_SR) {
        const int j1 = j0 + Q8_SR < n ? j0 + Q8_SR : n;
        for (int j = j0; j < j1; j += Q8_TR) {
          const int nr = j1 - j < Q8_TR ? j1 - j : Q8_TR;
          tile_rows(rp, Q8_TR, w, row_bytes, j, nr);
          if (nt > Q8_TL)
            tok_tile(kind, Q8_NG, sb + (j - j0), Q8_SLD, x, t0 / Q8_TL, nt, rp, nr, B);
          else
            tok_tile(kind, 1, sb + (j - j0), Q8_SLD, x, t0 / Q8_TL, nt, rp, nr, B);
        }
        for (int u = 0; u < nt; u++)
          for (int r = 0; r < j1 - j0; r++)
            put1(out + (ptrdiff_t)(t0 + u) * ldo + j0 + r, sb[u * Q8_SLD + r], acc);
      }
    }
    return;
  }
  /* X16 groups, rows in the lanes: a group at a time for a block of tokens
   * whose inputs stay in L2 (Q8_XTOK_BYTES), Q8_XU tokens at a time; the
   * first block streams the weights from memory (ask for them ahead) */
  const uint8_t *pf = w, *end = w + (size_t)n * row_bytes; /* the first byte not prefetched */
  int TB = (int)(Q8_XTOK_BYTES / x->ldq) / Q8_XU * Q8_XU;
  if (TB < Q8_XU) TB = Q8_XU;
  for (int t0 = 0; t0 < T && ng; t0 += TB) {
    const int t1 = t0 + TB < T ? t0 + TB : T;
    for (int j = 0; j < ng; j += KN_X16_ROWS) {
      if (t0 == 0)
        prefetch_to(&pf, w + (size_t)(j + KN_X16_ROWS) * row_bytes + Q8_PREFETCH_BYTES, end);
      const uint8_t *g = w + (size_t)j * row_bytes;
      for (int t = t0; t < t1; t += Q8_XU) {
        float *o = out + (ptrdiff_t)t * ldo + j;
        switch (t1 - t < Q8_XU ? t1 - t : Q8_XU) {
        case 1: x16_tile(kind, 1, o, ldo, x, t, g, B, acc); break;
        case 2: x16_tile(kind, 2, o, ldo, x, t, g, B, acc); break;
        case 3: x16_tile(kind, 3, o, ldo, x, t, g, B, acc); break;
#if Q8_XU == 8
        case 4: x16_tile(kind, 4, o, ldo, x, t, g, B, acc); break;
        case 5: x16_tile(kind, 5, o, ldo, x, t, g, B, acc); break;
        case 6: x16_tile(kind, 6, o, ldo, x, t, g, B, acc); break;
        case 7: x16_tile(kind, 7, o, ldo, x, t, g, B, acc); break;
        default: x16_tile(kind, 8, o, ldo, x, t, g, B, acc); break;
#else
        default: x16_tile(kind, 4, o, ldo, x, t, g, B, acc); break;
#endif
        }
      }
    }
  }
  /* the rows as they are, a few tokens (or an X16 weight's last n % 16 rows):
   * groups of rows that fit L1, each swept for every token */
  int G = (int)(Q8_GROUP_BYTES / row_bytes) / 8 * 8;
  if (G < 8) G = 8;
  for (int j0 = ng; j0 < n; j0 += G) {
    const int j1 = j0 + G < n ? j0 + G : n;
    for (int t = 0; t < T; t += Q8_RU)
      for (int j = j0; j < j1; j += 8) {
        if (t == 0) prefetch_to(&pf, w + (size_t)(j + 8) * row_bytes + Q8_PREFETCH_BYTES, end);
        const int nr = j1 - j < 8 ? j1 - j : 8;
        float *o = out + (ptrdiff_t)t * ldo + j;
        tile_rows(rp, 8, w, row_bytes, j, nr);
        switch (T - t < Q8_RU ? T - t : Q8_RU) {
        case 1: row_tile(kind, 1, o, ldo, x, t, rp, nr, B, acc); break;
        case 2: row_tile(kind, 2, o, ldo, x, t, rp, nr, B, acc); break;
        case 3: row_tile(kind, 3, o, ldo, x, t, rp, nr, B, acc); break;
        default: row_tile(kind, 4, o, ldo, x, t, rp, nr, B, acc); break;
        }
      }
  }
}

/* q8dot of Q8_0 and Q4_0, as rows (il 0) or in X16 groups (il 1). */
#define DEF_INT_DOT(SUF, KIND, IL)                                                                 \
  Q8T_ATTR static void q8dot_##SUF(float *out, ptrdiff_t ldo, const struct kn_cpu_q8_in *x,        \
                                   const uint8_t *w, size_t row_bytes, int K, int T, int n,        \
                                   int acc) {                                                      \
    int_dot(KIND, IL, out, ldo, x, w, row_bytes, K, T, n, acc);                                    \
  }
DEF_INT_DOT(q8_0, Q8K_Q8_0, 0)
DEF_INT_DOT(q4_0, Q8K_Q4_0, 0)
DEF_INT_DOT(q8_0x16, Q8K_Q8_0, 1)
DEF_INT_DOT(q4_0x16, Q8K_Q4_0, 1)
DEF_INT_DOT(q5_0, Q8K_Q5_0, 0)
DEF_INT_DOT(q5_0x16, Q8K_Q5_0, 1)

/* ---- the inputs ----------------------------------------------------------------- */

/* kn_cpu_dsp.q8_prep: kn_quantize_row's Q8_0 blocks (d = amax / 127, q =
 * roundf(x / d), halves away from zero: the truncation plus one away from
 * zero where the part cut off is half or more, exact) and the lane sums. */
Q8T_ATTR static void q8_prep_vec(const float *x, int K, uint8_t *q, float *d, int32_t *s,
                                 int shift) {
  const __m256 sgn = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  const __m256i ones = _mm256_set1_epi8(1);
  for (int b = 0; b < K / 32; b++) {
    const float *xb = x + (size_t)b * 32;
    __m256 v[4], big = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) { /* vmaxps keeps big where |x| is NaN, as the reference */
      v[k] = _mm256_loadu_ps(xb + 8 * k);
      big = _mm256_max_ps(_mm256_andnot_ps(sgn, v[k]), big);
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(big), _mm256_extractf128_ps(big, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    const float amax = _mm_cvtss_f32(m), db = amax / 127.0f, id = db ? 1.0f / db : 0.0f;
    const uint16_t h = (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(db), 0), 0);
    uint8_t *qb = q + (size_t)b * 34;
    memcpy(qb, &h, 2);
    d[b] = _cvtsh_ss(h);
    __m256i r[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
      const __m256 y = _mm256_mul_ps(v[k], _mm256_set1_ps(id));
      const __m256 t = _mm256_round_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __m256 up = _mm256_cmp_ps(_mm256_andnot_ps(sgn, _mm256_sub_ps(y, t)), half, _CMP_GE_OQ);
      const __m256 away = _mm256_or_ps(_mm256_and_ps(y, sgn), one);
      r[k] = _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(up, away)));
    }
    /* 32 int32 to 32 int8 in order: packs interleave the 128-bit halves */
    __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
    w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)(qb + 2), w);
    __m256i l = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, w), _mm256_set1_epi16(1));
    if (shift) l = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(l, shift));
    _mm256_storeu_si256((__m256i *)(s + (size_t)b * 8), l);
  }
}

/* The table's entries. */
static inline void q8t_init(struct kn_cpu_dsp *dsp) {
  KN_CPU_Q8_FILL(dsp, q8_prep_vec);
}

#endif
