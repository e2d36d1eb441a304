/* kn-cpu-q8-tile.h — the q8 mode's register tiles (kn_cpu_dsp.q8dot for T
 * tokens), included once by each kernel file that instantiates them, after it
 * defines
 *   Q8T_ATTR  the functions' target attribute,
 *   Q8T_VNNI  1: four products summed by vpdpbusd (AVX-512 VNNI on ymm), 0: AVX2,
 *   Q8_R, Q8_U  the tile's rows and tokens (Q8_R * Q8_U accumulators),
 *   Q8_R1       the rows of one token's tiles (decode; at most 4).
 * Each weight block is unpacked once for the tile's tokens and each input
 * block loaded once for its rows. A tile of several tokens runs its outputs'
 * even chains first, then their odd ones (the reference's two chains are
 * independent until the end); one token's tile runs both, block after block.
 * An output's operations are kn-cpu-q8.c's whatever the tile, so a row's
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
    *u = nib32(blk + 2);
    break;
  case Q8K_Q4_1:
    *d = h16x8(blk);
    *m = h16x8(blk + 2);
    *u = nib32(blk + 4);
    break;
  case Q8K_Q5_0:
    *d = h16x8(blk);
    *u = _mm256_or_si256(nib32(blk + 6), bit5x32(u32le(blk + 2)));
    break;
  case Q8K_Q5_1:
    *d = h16x8(blk);
    *m = h16x8(blk + 2);
    *u = _mm256_or_si256(nib32(blk + 8), bit5x32(u32le(blk + 4)));
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

/* The inputs of tokens x (Q8_0 blocks ldq bytes apart, their f32 scales d B
 * apart, lane terms s B * 8 apart; struct kn_cpu_q8_in) that block b of a
 * tile takes for token u: the 8 bytes' vector, the scale in all lanes, the
 * offset's lane terms (so) and the min's (sf). */
struct q8t_x {
  const uint8_t *q;
  const float *d;
  const int32_t *s;
  const int8_t *qp; /* Q4_0's pairs of blocks (struct kn_cpu_q8_in), one token */
  const int32_t *sp;
  const float *dp;
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
Q8T_ATTR static inline AI __m256 step(const enum q8_kind kind, __m256 a, __m256i wu, __m256i ws,
                                      __m256 dw, __m256 mw, __m256i xv, __m256 dx, __m256i so,
                                      __m256 sf) {
  /* the offset's term first: the same integer either way */
  __m256i p = dot4(so, wu, kind == Q8K_Q8_0 ? _mm256_sign_epi8(xv, ws) : xv);
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
    __m256i wu[Q8_RMAX], ws[Q8_RMAX];
    __m256 dw[Q8_RMAX], mw[Q8_RMAX];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
      unpack(kind, w + (size_t)r * row_bytes, b, &wu[r], &ws[r], &dw[r], &mw[r]);
#pragma GCC unroll 8
    for (int u = 0; u < U; u++) {
      __m256i xv, so;
      __m256 dx, sf;
      xblock(kind, x, B, u, b, &xv, &dx, &so, &sf);
#pragma GCC unroll 8
      for (int r = 0; r < R; r++)
        a[r * U + u] = step(kind, a[r * U + u], wu[r], ws[r], dw[r], mw[r], xv, dx, so, sf);
    }
  }
}

#if Q8T_VNNI
/* tile_chain for 4 tokens on 512-bit registers: tokens (0, 1) in one register
 * and (2, 3) in another, each weight block unpacked once and put in both
 * halves; every lane with step()'s operations (Q8_0: w + 128 unsigned against
 * x, the inputs' lane sums times -128 to start from, the same integer as |w|
 * against x with w's sign). a[r * 2 + p]: row r, tokens 2p and 2p + 1. */
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
      __m256i u, sg;
      __m256 d, m;
      unpack(kind, w + (size_t)r * row_bytes, b, &u, &sg, &d, &m);
      if (kind == Q8K_Q8_0) u = _mm256_xor_si256(sg, _mm256_set1_epi8((char)0x80));
      wu[r] = _mm512_broadcast_i64x4(u);
      dw[r] = _mm512_broadcast_f32x8(d);
      mw[r] = kind_min(kind) ? _mm512_broadcast_f32x8(m) : _mm512_setzero_ps();
    }
#pragma GCC unroll 2
    for (int p = 0; p < 2; p++) {
      __m256i xv[2], so[2];
      __m256 dx[2], sf[2];
#pragma GCC unroll 2
      for (int h = 0; h < 2; h++) {
        xblock(kind, x, B, 2 * p + h, b, &xv[h], &dx[h], &so[h], &sf[h]);
        if (kind == Q8K_Q8_0) /* the lane sums, times -128 for Q8_0 (q8_inputs) */
          so[h] = _mm256_loadu_si256(
              (const __m256i *)(x->s + ((size_t)(2 * p + h) * (size_t)B + (size_t)b) * 8));
      }
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
    __m256i wu, ws;
    __m256 dw, mw;
    unpack(kind, w + (size_t)r * row_bytes, b, &wu, &ws, &dw, &mw);
    a[r] = step(kind, a[r], wu, ws, dw, mw, xv, dx, so, sf);
  }
}

/* One token's R outputs of Q4_0 rows, blocks in pairs (b, b + 1): one load of
 * both blocks' nibbles gives their low ones (elements 0..15: lanes 0..3 of b,
 * then of b + 1) after a mask and their high ones (lanes 4..7) after a shift
 * and a mask, and one conversion their two scales. So lo[r] holds lanes 0..3 of
 * the even chain and of the odd one, hi[r] lanes 4..7: every lane is one of
 * the reference's accumulators, with its operations. */
Q8T_ATTR static inline AI void rows1_q4_0(const int R, float *out, const uint8_t *w,
                                          size_t row_bytes, const struct q8t_x *x, int B, int acc) {
  const __m256i m4 = _mm256_set1_epi8(0xF);
  const __m128i dup = _mm_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3);
  __m256 lo[Q8_RMAX], hi[Q8_RMAX];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
    lo[r] = hi[r] = _mm256_setzero_ps();
  for (int i = 0; i < B / 2; i++) {
    const __m256i xl = _mm256_loadu_si256((const __m256i *)(x->qp + 64 * i));
    const __m256i xh = _mm256_loadu_si256((const __m256i *)(x->qp + 64 * i + 32));
    const __m256i sl = _mm256_loadu_si256((const __m256i *)(x->sp + 16 * i));
    const __m256i sh = _mm256_loadu_si256((const __m256i *)(x->sp + 16 * i + 8));
    const __m256 dx = _mm256_loadu_ps(x->dp + 8 * i);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      const uint8_t *b0 = w + (size_t)r * row_bytes + (size_t)(2 * i) * 18, *b1 = b0 + 18;
      __m256i v = _mm256_loadu2_m128i((const __m128i *)(b1 + 2), (const __m128i *)(b0 + 2));
      __m256i ql = _mm256_and_si256(v, m4), qh = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      uint16_t h0, h1;
      memcpy(&h0, b0, 2);
      memcpy(&h1, b1, 2);
      __m128i hh = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)(h0 | (uint32_t)h1 << 16)), dup);
      __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(hh), dx);
      lo[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot4(sl, ql, xl)), d, lo[r]);
      hi[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot4(sh, qh, xh)), d, hi[r]);
    }
  }
  if (B & 1) { /* the last block alone, on the even chain (the lower halves) */
    const int b = B - 1;
    __m256i xv, so;
    __m256 dx, sf;
    xblock(Q8K_Q4_0, x, B, 0, b, &xv, &dx, &so, &sf);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      __m256i wu, ws;
      __m256 dw, mw;
      unpack(Q8K_Q4_0, w + (size_t)r * row_bytes, b, &wu, &ws, &dw, &mw);
      __m256 p = _mm256_cvtepi32_ps(dot4(so, wu, xv)), d = _mm256_mul_ps(dw, dx);
      __m256 pl = _mm256_permute2f128_ps(p, p, 0x00), ph = _mm256_permute2f128_ps(p, p, 0x11);
      lo[r] = _mm256_blend_ps(_mm256_fmadd_ps(pl, d, lo[r]), lo[r], 0xF0);
      hi[r] = _mm256_blend_ps(_mm256_fmadd_ps(ph, d, hi[r]), hi[r], 0xF0);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) {
    __m256 e = _mm256_permute2f128_ps(lo[r], hi[r], 0x20),
           o = _mm256_permute2f128_ps(lo[r], hi[r], 0x31);
    put1(out + r, kn_avx2_hsum(_mm256_add_ps(e, o)), acc);
  }
}

#if Q8T_VNNI
/* rows1_q4_0 for 4 rows and an even number of blocks on 512-bit registers: a
 * register holds two rows' lo (or hi) lanes, row 2k in its lower half and row
 * 2k + 1 in its upper half, each lane with the 256-bit version's operations,
 * so the same bits with half the instructions. */
Q8T_ATTR static inline AI void rows4_q4_0_z(float *out, const uint8_t *w, size_t row_bytes,
                                            const struct q8t_x *x, int B, int acc) {
  const __m512i m4 = _mm512_set1_epi8(0xF);
  const __m256i dup = _mm256_setr_epi16(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  __m512 lo[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()}, hi[2] = {lo[0], lo[0]};
  for (int i = 0; i < B / 2; i++) {
    const __m512i xl =
        _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->qp + 64 * i)));
    const __m512i xh =
        _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->qp + 64 * i + 32)));
    const __m512i sl =
        _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->sp + 16 * i)));
    const __m512i sh =
        _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->sp + 16 * i + 8)));
    const __m512 dx = _mm512_castsi512_ps(
        _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->dp + 8 * i))));
#pragma GCC unroll 2
    for (int k = 0; k < 2; k++) {
      const uint8_t *a0 = w + (size_t)(2 * k) * row_bytes + (size_t)(2 * i) * 18, *a1 = a0 + 18;
      const uint8_t *c0 = a0 + row_bytes, *c1 = c0 + 18;
      __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(a0 + 2)));
      v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(a1 + 2)), 1);
      v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(c0 + 2)), 2);
      v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(c1 + 2)), 3);
      __m512i ql = _mm512_and_si512(v, m4), qh = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
      uint16_t h[4];
      memcpy(&h[0], a0, 2);
      memcpy(&h[1], a1, 2);
      memcpy(&h[2], c0, 2);
      memcpy(&h[3], c1, 2);
      uint64_t hh;
      memcpy(&hh, h, 8);
      __m256i hv =
          _mm256_permutexvar_epi16(dup, _mm256_castsi128_si256(_mm_cvtsi64_si128((long long)hh)));
      __m512 d = _mm512_mul_ps(_mm512_cvtph_ps(hv), dx);
      lo[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(sl, ql, xl)), d, lo[k]);
      hi[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(sh, qh, xh)), d, hi[k]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < 4; r++) {
    const __m512 l = lo[r >> 1], h = hi[r >> 1];
    const __m256 lr = r & 1 ? _mm512_extractf32x8_ps(l, 1) : _mm512_castps512_ps256(l),
                 hr = r & 1 ? _mm512_extractf32x8_ps(h, 1) : _mm512_castps512_ps256(h);
    __m256 e = _mm256_permute2f128_ps(lr, hr, 0x20), o = _mm256_permute2f128_ps(lr, hr, 0x31);
    put1(out + r, kn_avx2_hsum(_mm256_add_ps(e, o)), acc);
  }
}
#endif

/* One token's R outputs, both chains block after block (decode: each row
 * streamed once). */
Q8T_ATTR static inline AI void rows1(const enum q8_kind kind, const int R, float *out,
                                     const uint8_t *w, size_t row_bytes, const struct q8t_x *x,
                                     int B, int acc) {
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
  if (U == 1 && kind == Q8K_Q4_0 && x->qp) {
#if Q8T_VNNI
    if (R == 4 && !(B & 1)) {
      rows4_q4_0_z(out, w, row_bytes, x, B, acc);
      return;
    }
#endif
    rows1_q4_0(R, out, w, row_bytes, x, B, acc);
    return;
  }
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

DEF_TILES(q8_0, Q8K_Q8_0)
DEF_TILES(q4_0, Q8K_Q4_0)
DEF_TILES(q4_1, Q8K_Q4_1)
DEF_TILES(q5_0, Q8K_Q5_0)
DEF_TILES(q5_1, Q8K_Q5_1)
DEF_TILES(q4_k, Q8K_Q4_K)
DEF_TILES(q5_k, Q8K_Q5_K)
DEF_TILES(q6_k, Q8K_Q6_K)

typedef void (*tiles_fn)(int r, int u, float *out, ptrdiff_t ldo, const struct q8t_x *x,
                         const uint8_t *w, size_t row_bytes, int B, int acc);

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
      const size_t P = (size_t)t * (size_t)(B / 2); /* pairs before token t */
      const struct q8t_x x = {in->q + (size_t)t * in->ldq,
                              in->d + (size_t)t * (size_t)B,
                              in->s + (size_t)t * (size_t)B * 8,
                              in->qp ? in->qp + P * 64 : NULL,
                              in->sp ? in->sp + P * 16 : NULL,
                              in->dp ? in->dp + P * 8 : NULL,
                              in->ldq};
      const uint8_t *pf = w + (size_t)j0 * row_bytes; /* the first byte not prefetched */
      for (int j = j0; j < j1; j += R) {
        if (u == 1) { /* decode streams each row once from memory: ask for it ahead */
          const uint8_t *want = w + (size_t)(j + R) * row_bytes + Q8_PREFETCH_BYTES,
                        *end = w + (size_t)n * row_bytes;
          if (want > end) want = end;
          for (; pf < want; pf += 64)
            _mm_prefetch((const char *)pf, _MM_HINT_T0);
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

/* Q8_0's decode: each row streamed once, block after block into the even and odd
 * chains, |w| times x with w's sign (dot4; inputs are never -128: the
 * quantizer's range is +-127). Streams its bytes faster than the 4-row tile,
 * whose Q8_0 rows (34 bytes a block, twice Q4_0's) leave its loads unaligned and
 * its registers spilled; the reference's bits. */
Q8T_ATTR static inline AI __m256 step_q8_0(const uint8_t *row, const struct kn_cpu_q8_in *in, int b,
                                           __m256 a) {
  const uint8_t *blk = row + (size_t)b * 34, *xb = in->q + (size_t)b * 34;
  __m256i wv = _mm256_loadu_si256((const __m256i *)(blk + 2)),
          xv = _mm256_loadu_si256((const __m256i *)(xb + 2));
  __m256i p = dot4(_mm256_setzero_si256(), _mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(kn_le_f16(blk) * in->d[b]), a);
}

#if Q8T_VNNI
/* Four Q8_0 rows of one token on 512-bit registers, two rows to a register
 * (row 2k in the lower half, 2k + 1 in the upper), the even and odd chains
 * apart: each lane as step_q8_0 has it, its four products summed as the
 * unsigned w + 128 times x plus -128 times the lane's input sum (in->s: the
 * q8 inputs' lane terms for Q8_0 carry that offset), the same integer. */
Q8T_ATTR static inline AI void rows4_q8_0_z(float *out, const struct kn_cpu_q8_in *in,
                                            const uint8_t *w, size_t row_bytes, int B, int acc) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  const __m256i dup = _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  __m512 a[2][2]; /* [chain][pair of rows] */
  for (int c = 0; c < 2; c++)
    a[c][0] = a[c][1] = _mm512_setzero_ps();
  for (int b = 0; b < B; b++) {
    const uint8_t *xb = in->q + (size_t)b * 34;
    const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xb + 2)));
    const __m512i so = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(in->s + 8 * b)));
    const __m512 dx = _mm512_set1_ps(in->d[b]);
#pragma GCC unroll 2
    for (int k = 0; k < 2; k++) {
      const uint8_t *b0 = w + (size_t)(2 * k) * row_bytes + (size_t)b * 34, *b1 = b0 + row_bytes;
      __m512i wv =
          _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2))),
                             _mm256_loadu_si256((const __m256i *)(b1 + 2)), 1);
      uint16_t h0, h1;
      memcpy(&h0, b0, 2);
      memcpy(&h1, b1, 2);
      __m256i hv = _mm256_permutexvar_epi16(
          dup, _mm256_castsi128_si256(_mm_cvtsi32_si128((int)(h0 | (uint32_t)h1 << 16))));
      __m512 d = _mm512_mul_ps(_mm512_cvtph_ps(hv), dx);
      __m512i p = _mm512_dpbusd_epi32(so, _mm512_xor_si512(wv, flip), xv);
      a[b & 1][k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), d, a[b & 1][k]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < 4; r++) {
    const __m512 t = _mm512_add_ps(a[0][r >> 1], a[1][r >> 1]);
    put1(out + r, kn_avx2_hsum(r & 1 ? _mm512_extractf32x8_ps(t, 1) : _mm512_castps512_ps256(t)),
         acc);
  }
}
#endif

Q8T_ATTR static void one_q8_0(float *out, const struct kn_cpu_q8_in *in, const uint8_t *w,
                              size_t row_bytes, int B, int n, int acc) {
  const uint8_t *pf = w, *end = w + (size_t)n * row_bytes; /* pf: the first byte not prefetched */
  for (int j = 0; j < n;) {
    const uint8_t *row = w + (size_t)j * row_bytes;
    const uint8_t *want = row + 4 * row_bytes + Q8_PREFETCH_BYTES;
    for (want = want < end ? want : end; pf < want; pf += 64)
      _mm_prefetch((const char *)pf, _MM_HINT_T0);
#if Q8T_VNNI
    if (n - j >= 4) {
      rows4_q8_0_z(out + j, in, row, row_bytes, B, acc);
      j += 4;
      continue;
    }
#endif
    __m256 e = _mm256_setzero_ps(), o = e;
    int b = 0;
    for (; b + 2 <= B; b += 2) {
      e = step_q8_0(row, in, b, e);
      o = step_q8_0(row, in, b + 1, o);
    }
    if (b < B) e = step_q8_0(row, in, b, e);
    put1(out + j, kn_avx2_hsum(_mm256_add_ps(e, o)), acc);
    j++;
  }
}

Q8T_ATTR static void q8dot_q8_0(float *out, ptrdiff_t ldo, const struct kn_cpu_q8_in *x,
                                const uint8_t *w, size_t row_bytes, int K, int T, int n, int acc) {
  if (T == 1)
    one_q8_0(out, x, w, row_bytes, K / 32, n, acc);
  else
    tiled(tiles_q8_0, out, ldo, x, w, row_bytes, K, T, n, acc);
}
DEF_Q8DOT(q4_0)
DEF_Q8DOT(q4_1)
DEF_Q8DOT(q5_0)
DEF_Q8DOT(q5_1)
DEF_Q8DOT(q4_k)
DEF_Q8DOT(q5_k)
DEF_Q8DOT(q6_k)

/* The table's entries. */
static inline void q8t_init(struct kn_cpu_dsp *dsp) {
  dsp->q8dot[KN_DTYPE_Q8_0] = q8dot_q8_0;
  dsp->q8dot[KN_DTYPE_Q4_0] = q8dot_q4_0;
  dsp->q8dot[KN_DTYPE_Q4_1] = q8dot_q4_1;
  dsp->q8dot[KN_DTYPE_Q5_0] = q8dot_q5_0;
  dsp->q8dot[KN_DTYPE_Q5_1] = q8dot_q5_1;
  dsp->q8dot[KN_DTYPE_Q4_K] = q8dot_q4_k;
  dsp->q8dot[KN_DTYPE_Q5_K] = q8dot_q5_k;
  dsp->q8dot[KN_DTYPE_Q6_K] = q8dot_q6_k;
}

#endif
