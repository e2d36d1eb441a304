/* kn-cpu-q8-tile.h — the q8 mode's register tiles (kn_cpu_dsp.q8dot for T
 * tokens), included once by each kernel file that instantiates them, after it
 * defines
 *   Q8T_ATTR  the functions' target attribute,
 *   Q8T_VNNI  1: four products summed by vpdpbusd (AVX-512 VNNI), 0: AVX2,
 *   Q8T_AVXVNNI (optional, with Q8T_VNNI 0) 1: the AVX2 tiles with AVX-VNNI's
 *             256-bit vpdpbusd where they sum four products, and Q8_0 and
 *             Q4_0 the VNNI tiles' ways (w + 128 against x; nibbles in place),
 *   Q8T_ZMM   1: tokens side by side 16 to a 512-bit register, 0: 8 to a
 *             256-bit one.
 *
 * Every format sums one integer a 32-element block (a K-quant's sub-block;
 * Q6_K, Q3_K and Q2_K one a half of 16, each times its integer scale),
 * kn-cpu-q8.c's definitions, with outputs side by side in the lanes. In the
 * layouts the q8 mode gives every block format at load (16 rows side by side,
 * kn-quant.h's X16) the rows are, at every T (x16_tile, IQ4_NL's and IQ4_XS's
 * too; kx16_tile for Q4_K and Q5_K, q6x16_tile for Q6_K, k16_tile for Q3_K
 * and Q2_K, k16_quads for their decode); rows as a file has them (a matrix
 * of fewer than 16 rows, the last n % 16 of one, weights not prepared) take
 * tokens side by side (int_dot's tok_tile, from KN_CPU_Q8_TOKENS tokens:
 * kind_xi's formats) or rows gathered eight at a time (row_tile: a few
 * tokens, and the other formats at every T).
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

#ifndef Q8T_AVXVNNI
#define Q8T_AVXVNNI 0
#endif
/* vpdpbusd in some width: the ways of summing that need it (Q8_0's offset
 * w + 128, Q4_0's high nibbles in place, several chains a token) */
#define Q8T_DPBUSD (Q8T_VNNI || Q8T_AVXVNNI)

#define AI __attribute__((always_inline))

/* How far ahead of each block an X16 group's first sweep asks for the weights. */
#define Q8_PREFETCH_BYTES 4096

KN_AVX2 static inline float h16(const uint8_t *p) {
  return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8));
}

KN_AVX2 static inline void put1(float *o, float s, int acc) {
  *o = acc ? *o + s : s;
}

/* Keeps an integer sum where it is: integer adds associate, and without this
 * GCC gathers a tile's whole tree of vpmaddubsw products (every token, every
 * quad of a block) before adding any, more registers than AVX2 has: the
 * spills made the AVX2 tiles 1.5-2.4x slower. */
#define Q8_KEEP(v) __asm__("" : "+x"(v))

/* c plus the 8 lanes' exact sums of four products each (bytes 4l .. 4l + 3)
 * of unsigned bytes u and signed bytes s. AVX2: pairs summed in 16 bits (no
 * saturation for the operands here: at most 2 * 128 * 127), then pairs of
 * those; VNNI: vpdpbusd. */
Q8T_ATTR static inline AI __m256i dot4(__m256i c, __m256i u, __m256i s) {
#if Q8T_VNNI
  return _mm256_dpbusd_epi32(c, u, s);
#elif Q8T_AVXVNNI
  return _mm256_dpbusd_avx_epi32(c, u, s);
#else
  __m256i r =
      _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  Q8_KEEP(r);
  return r;
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

/* (the K-quants last: from Q8K_Q4_K on, a kind's blocks are super-blocks;
 * IQ4_XS's are too, and every use of its blocks says so) */
enum q8_kind {
  Q8K_Q8_0,
  Q8K_Q4_0,
  Q8K_Q4_1,
  Q8K_Q5_0,
  Q8K_Q5_1,
  Q8K_IQ4_NL,
  Q8K_IQ4_XS, /* its 32-element sub-blocks, each with a scale, as blocks */
  Q8K_Q4_K,
  Q8K_Q5_K,
  Q8K_Q6_K,
  Q8K_Q3_K, /* a scale each 16 elements, as Q6_K (k16_tile) */
  Q8K_Q2_K
};

/* Bytes of a kind's block (a K-quant's super-block). */
static inline size_t kind_bytes(enum q8_kind k) {
  static const size_t bytes[] = {34, 18, 20, 22, 24, 18, 136, 144, 176, 210, 110, 84};
  return bytes[k];
}

/* Whether a kind's scales cover 16 elements and its weights are 2-bit fields
 * (Q3_K: and a third bit): k16_tile, row_k16. */
static inline int kind_k16(enum q8_kind k) {
  return k == Q8K_Q3_K || k == Q8K_Q2_K;
}

/* Whether a kind's weights are IQ4's levels (a nibble's of 16: iq4_table). */
static inline int kind_iq4(enum q8_kind k) {
  return k == Q8K_IQ4_NL || k == Q8K_IQ4_XS;
}

/* Whether a block's weights are signed bytes summed against x with their
 * signs (|w| against x with w's sign: vpmaddubsw's first operand is
 * unsigned), with no offset's term: Q8_0 and IQ4's levels without
 * vpdpbusd (with it, w + 128 unsigned against x, and -128 times x's sum). */
static inline int kind_signed(enum q8_kind k) {
  return !Q8T_DPBUSD && (k == Q8K_Q8_0 || kind_iq4(k));
}

/* Whether a kind takes tokens side by side (struct kn_cpu_q8_in's xi: tok_tile). */
static inline int kind_xi(enum q8_kind k) {
  return k == Q8K_Q8_0 || k == Q8K_Q4_0 || (k >= Q8K_Q4_K && k <= Q8K_Q6_K) || k == Q8K_Q4_1 ||
         k == Q8K_Q5_1;
}

/* Whether every weight adds a min (times the block's input sum). */
static inline int kind_min(enum q8_kind k) {
  return k == Q8K_Q4_1 || k == Q8K_Q5_1 || k == Q8K_Q4_K || k == Q8K_Q5_K;
}

/* Whether a block is summed by kint_block (the formats with a min, and Q6_K). */
static inline int kind_kint(enum q8_kind k) {
  return kind_min(k) || k == Q8K_Q6_K;
}

/* The four bits of b as bytes, 0x10 where set. */
static inline AI uint32_t fifth4(uint32_t b) {
  return ((b & 1) | (b & 2) << 7 | (b & 4) << 14 | (b & 8) << 21) << 4;
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

/* IQ4_NL's and IQ4_XS's 16 levels as bytes, a nibble's at its index (vpshufb's table):
 * signed where kind_signed, else + 128 unsigned. */
Q8T_ATTR static inline AI __m128i iq4_table(void) {
  const __m128i t = _mm_loadu_si128((const __m128i *)kn_iq4_levels);
  return Q8T_DPBUSD ? _mm_xor_si128(t, _mm_set1_epi8((char)0x80)) : t;
}

/* Sub-block j of a K-quant super-block as the bytes vpmaddubsw takes
 * (as kn-cpu-q8.c's weights() has them, before the offset). */
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

/* Prefetches w's bytes from *pf up to want (at most end), a line at a time. */
static inline AI void prefetch_to(const uint8_t **pf, const uint8_t *want, const uint8_t *end) {
  for (want = want < end ? want : end; *pf < want; *pf += 64)
    _mm_prefetch((const char *)*pf, _MM_HINT_T0);
}

/* Asks for part k of n of the gb bytes of a group's block at blk,
 * Q8_PREFETCH_BYTES ahead, a fixed count of lines (unrolled), where pfe is
 * given and the block ahead ends by it (an X16 tile's first sweep). */
static inline AI void prefetch_part(const uint8_t *blk, size_t gb, int k, int n,
                                    const uint8_t *pfe) {
  if (!pfe || blk + gb + Q8_PREFETCH_BYTES > pfe) return;
  const size_t part = gb / n; /* out of the loop's test: unoptimized GCC drops the
                                 annotation of a loop whose test divides */
#pragma GCC unroll 16
  for (size_t o = 0; o < part; o += 64)
    _mm_prefetch((const char *)blk + Q8_PREFETCH_BYTES + part * k + o, _MM_HINT_T0);
}

/* ---- one integer a block ------------------------------------------------------ */

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
#define vi_srl16(a, n)  _mm512_srl_epi16(a, _mm_cvtsi32_si128(n))
#define vi_srl32(a, n)  _mm512_srl_epi32(a, _mm_cvtsi32_si128(n))
#define vi_sll32(a, n)  _mm512_sll_epi32(a, _mm_cvtsi32_si128(n))
#define vi_sra32(a, n)  _mm512_sra_epi32(a, _mm_cvtsi32_si128(n))
#define vi_sll16(a, n)  _mm512_sll_epi16(a, _mm_cvtsi32_si128(n))
#define vf_fnmadd(a, b, c) _mm512_fnmadd_ps(a, b, c)
#define vi_slli16_4(a)  _mm512_slli_epi16(a, 4)
#define vi_sub8(a, b)   _mm512_sub_epi8(a, b)
#define vi_abs8(a)      _mm512_abs_epi8(a)
#define vi_sign8(x, w)  _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x)
#define vi_mullo(a, b)  _mm512_mullo_epi32(a, b)
#define vi_shuf(t, i)      _mm512_shuffle_epi8(t, i)
#define vi_lanes(t)        _mm512_broadcast_i32x4(t)
#define vi_u16(p)          _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p)))
#define Q8_XU           8 /* tokens of an X16 tile: each register of weights serves them all */
#define Q8_KXU          4 /* tokens of Q4_K's X16 tile: two accumulators each */
#define Q8_6XU          3 /* of Q6_K's: four each */
#define Q8_K16U            6 /* of Q3_K's and Q2_K's: three each */
#define Q8_K16G            2 /* of theirs a quad group at a time: eight each */
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
#define vi_srl16(a, n)  _mm256_srl_epi16(a, _mm_cvtsi32_si128(n))
#define vi_srl32(a, n)  _mm256_srl_epi32(a, _mm_cvtsi32_si128(n))
#define vi_sll32(a, n)  _mm256_sll_epi32(a, _mm_cvtsi32_si128(n))
#define vi_sra32(a, n)  _mm256_sra_epi32(a, _mm_cvtsi32_si128(n))
#define vi_sll16(a, n)  _mm256_sll_epi16(a, _mm_cvtsi32_si128(n))
#define vf_fnmadd(a, b, c) _mm256_fnmadd_ps(a, b, c)
#define vi_slli16_4(a)  _mm256_slli_epi16(a, 4)
#define vi_sub8(a, b)   _mm256_sub_epi8(a, b)
#define vi_abs8(a)      _mm256_abs_epi8(a)
#define vi_sign8(x, w)  _mm256_sign_epi8(x, w)
#define vi_mullo(a, b)  _mm256_mullo_epi32(a, b)
#define vi_shuf(t, i)      _mm256_shuffle_epi8(t, i)
#define vi_lanes(t)        _mm256_broadcastsi128_si256(t)
#define vi_u16(p)          _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define Q8_XU           4 /* AVX2's 16 registers */
#define Q8_KXU          2
#define Q8_6XU          2
#define Q8_K16U            2
#define Q8_K16G            1
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
#if Q8T_DPBUSD
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

/* Sub-block j of a K-quant super-block sb (Q4_1, Q5_1: the block sb) against
 * NG token registers' block b, one integer a lane each (kn-cpu-q8.c's
 * q8dot_min_ref): p[g], the sum of products (q without its min; Q6_K's
 * sc0 p0 + sc1 p1 over q - 32, |q - 32| against x with q - 32's sign); *dw
 * the block's scale in every lane, *mw its min (zero for Q6_K). Each four
 * weights are unpacked once for the NG registers. */
Q8T_ATTR static inline AI void kint_block(const enum q8_kind kind, const int NG, const uint8_t *sb,
                                          int j, const struct q8_tv *tv, size_t b, q8vi *p,
                                          q8vf *dw, q8vf *mw) {
#define XQ(g, k) vi_load(tv[g].x + Q8_XB * b + 4 * KN_CPU_Q8_GROUP * (k))
  q8vi a[Q8_NG], c[Q8_NG]; /* Q6_K: the halves; else two chains */
#pragma GCC unroll 2
  for (int g = 0; g < NG; g++)
    a[g] = c[g] = vi_zero();
  if (kind == Q8K_Q6_K) {
    const int half = j >> 2, pp = j & 3;
    const uint8_t *ql = sb + 64 * half + 32 * (pp & 1), *qh = sb + 128 + 32 * half;
    const int8_t *sc = (const int8_t *)(sb + 192) + 2 * j;
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
      q8vi v = vi_bcast4(ql + 4 * k);
      v = vi_and(pp >= 2 ? vi_srli16_4(v) : v, vi_set1_8(0x0F));
      const q8vi h = vi_and(vi_srl16(vi_bcast4(qh + 4 * k), 2 * pp), vi_set1_8(3));
      const q8vi w = vi_sub8(vi_or(v, vi_slli16_4(h)), vi_set1_8(32)), aw = vi_abs8(w);
#pragma GCC unroll 2
      for (int g = 0; g < NG; g++) {
        q8vi *d = k < 4 ? &a[g] : &c[g];
        *d = vi_dot(*d, aw, vi_sign8(XQ(g, k), w));
      }
    }
#pragma GCC unroll 2
    for (int g = 0; g < NG; g++)
      p[g] = vi_add(vi_mullo(a[g], vi_set1_32(sc[0])), vi_mullo(c[g], vi_set1_32(sc[1])));
    *dw = vf_set1(h16(sb + 208));
    *mw = vf_zero();
    return;
  }
  if (kind == Q8K_Q4_1 || kind == Q8K_Q5_1) { /* sb: the block; elements k, 16 + k a byte */
    const int five = kind == Q8K_Q5_1;
    const uint8_t *qs = sb + (five ? 8 : 4);
    const uint32_t qh = five ? u32le(sb + 4) : 0;
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
      const q8vi v = vi_bcast4(qs + 4 * k);
      q8vi l = vi_and(v, vi_set1_8(0x0F)), h = vi_and(vi_srli16_4(v), vi_set1_8(0x0F));
      if (five) {
        l = vi_or(l, vi_set1_32((int)fifth4(qh >> (4 * k) & 0xF)));
        h = vi_or(h, vi_set1_32((int)fifth4(qh >> (16 + 4 * k) & 0xF)));
      }
#pragma GCC unroll 2
      for (int g = 0; g < NG; g++) {
        a[g] = vi_dot(a[g], l, XQ(g, k));
        c[g] = vi_dot(c[g], h, XQ(g, k + 4));
      }
    }
#pragma GCC unroll 2
    for (int g = 0; g < NG; g++)
      p[g] = vi_add(a[g], c[g]);
    *dw = vf_set1(h16(sb));
    *mw = vf_set1(h16(sb + 2));
    return;
  }
  const int five = kind == Q8K_Q5_K;
  const uint8_t *qs = sb + (five ? 48 : 16) + 32 * (j >> 1), *qh = sb + 16;
#pragma GCC unroll 8
  for (int k = 0; k < 8; k++) {
    q8vi v = vi_bcast4(qs + 4 * k);
    v = vi_and(j & 1 ? vi_srli16_4(v) : v, vi_set1_8(0x0F));
    if (five) /* bit j of each qh byte as 16 */
      v = vi_or(v, vi_slli16_4(vi_and(vi_srl16(vi_bcast4(qh + 4 * k), j), vi_set1_8(1))));
#pragma GCC unroll 2
    for (int g = 0; g < NG; g++) {
      q8vi *d = k & 1 ? &c[g] : &a[g];
      *d = vi_dot(*d, v, XQ(g, k));
    }
  }
#pragma GCC unroll 2
  for (int g = 0; g < NG; g++)
    p[g] = vi_add(a[g], c[g]);
  int sc, mn;
  sc_min(j, sb + 4, &sc, &mn);
  *dw = vf_set1(h16(sb) * (float)sc);
  *mw = vf_set1(-(h16(sb + 2) * (float)mn));
#undef XQ
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
      q8vi p[Q8_NG];
      q8vf dw, mw;
      if (kind_kint(kind)) {
        const size_t at = kind >= Q8K_Q4_K ? (size_t)(b >> 3) : (size_t)b;
        kint_block(kind, NG, rp[r] + at * kind_bytes(kind), b & 7, tv, (size_t)b, p, &dw, &mw);
      } else {
        const uint8_t *blk = rp[r] + (size_t)b * kind_bytes(kind);
        int_block(kind, NG, blk, tv, (size_t)b, p);
        dw = vf_set1(h16(blk));
      }
#pragma GCC unroll 2
      for (int g = 0; g < NG; g++) {
        const q8vf dx = vf_load(tv[g].d + KN_CPU_Q8_GROUP * (size_t)b);
        f[g][r] = vf_fma(vf_cvt(p[g]), vf_mul(dw, dx), f[g][r]);
        if (kind_min(kind)) /* the min times the block's input sum (si: their shift is 0) */
          f[g][r] = vf_fma(vf_cvt(vi_load(tv[g].s + KN_CPU_Q8_GROUP * (size_t)b)), vf_mul(mw, dx),
                           f[g][r]);
      }
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

/* The scales of a K-quant super-block at off in eight rows rp[], a
 * sub-block's eight rows in the lanes: Q4_K / Q5_K, d sc in ka[j] and
 * -(dmin min) in kb[j] (each rounded once, as weights() has them); Q6_K, the
 * integer scales of sub-block j's halves in ka[j] and kb[j] (their bits) and
 * each row's dd in *dd. */
KN_AVX2 static inline AI void kscales(const enum q8_kind kind, const uint8_t *const *rp, size_t off,
                                      __m256 *ka, __m256 *kb, __m256 *dd) {
  if (kind == Q8K_Q6_K) {
    *dd = scales8(rp, off + 208);
    /* each row's 16 scales as 8 words (sub-block j's halves' scales in word
     * j), rows r and r + 4 in the 128-bit halves, transposed: word j's rows
     * 0..3 in qword j % 2 of the low half of y[j / 2], rows 4..7 of the high */
    __m256i x[4], a[4], y[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
      x[r] = _mm256_loadu2_m128i((const __m128i *)(rp[r + 4] + off + 192),
                                 (const __m128i *)(rp[r] + off + 192));
    a[0] = _mm256_unpacklo_epi16(x[0], x[1]), a[1] = _mm256_unpackhi_epi16(x[0], x[1]);
    a[2] = _mm256_unpacklo_epi16(x[2], x[3]), a[3] = _mm256_unpackhi_epi16(x[2], x[3]);
    y[0] = _mm256_unpacklo_epi32(a[0], a[2]), y[1] = _mm256_unpackhi_epi32(a[0], a[2]);
    y[2] = _mm256_unpacklo_epi32(a[1], a[3]), y[3] = _mm256_unpackhi_epi32(a[1], a[3]);
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
      /* the eight rows' word j, sign-extended: its low byte's scale in
       * bits 0..7, the high byte's from bit 8 up */
      const __m256i w = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(
          j & 1 ? _mm256_permute4x64_epi64(y[j >> 1], _MM_SHUFFLE(3, 3, 3, 1))
                : _mm256_permute4x64_epi64(y[j >> 1], _MM_SHUFFLE(2, 2, 2, 0))));
      ka[j] = _mm256_castsi256_ps(_mm256_srai_epi32(_mm256_slli_epi32(w, 24), 24));
      kb[j] = _mm256_castsi256_ps(_mm256_srai_epi32(w, 8));
    }
    return;
  }
  /* each row's first 16 bytes, the dwords (d, dmin), u0, u1, u2 (sc_min()'s
   * six bits, four pairs a word), rows 0..3 and 4..7 in the 128-bit halves,
   * transposed: a dword's eight rows in the lanes */
  __m256i v[4];
#pragma GCC unroll 4
  for (int r = 0; r < 4; r++)
    v[r] = _mm256_loadu2_m128i((const __m128i *)(rp[r + 4] + off), (const __m128i *)(rp[r] + off));
  const __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]),
                t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
  const __m256i D = _mm256_unpacklo_epi64(t0, t2), u0 = _mm256_unpackhi_epi64(t0, t2),
                u1 = _mm256_unpacklo_epi64(t1, t3), u2 = _mm256_unpackhi_epi64(t1, t3);
  const __m256i m6 = _mm256_set1_epi32(0x3F3F3F3F), m4 = _mm256_set1_epi32(0x0F0F0F0F),
                m2 = _mm256_set1_epi32(0x03030303);
  const __m256i sc[2] = {_mm256_and_si256(u0, m6),
                         _mm256_or_si256(
                             _mm256_and_si256(u2, m4),
                             _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), m2), 4))},
                mn[2] = {_mm256_and_si256(u1, m6),
                         _mm256_or_si256(
                             _mm256_and_si256(_mm256_srli_epi32(u2, 4), m4),
                             _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), m2), 4))};
  /* the rows' d and dmin: the low and the high halves of D, eight halves each */
  const __m256i h = _mm256_permute4x64_epi64(
      _mm256_packus_epi32(_mm256_and_si256(D, _mm256_set1_epi32(0xFFFF)), _mm256_srli_epi32(D, 16)),
      _MM_SHUFFLE(3, 1, 2, 0));
  const __m256 d = _mm256_cvtph_ps(_mm256_castsi256_si128(h)),
               nm = _mm256_xor_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)),
                                  _mm256_set1_ps(-0.0f)); /* -dmin */
  const __m256i b8 = _mm256_set1_epi32(0xFF);
#pragma GCC unroll 8
  for (int j = 0; j < 8; j++) {
    const int sh = 8 * (j & 3);
    ka[j] = _mm256_mul_ps(
        d, _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(sc[j >> 2], sh), b8)));
    kb[j] = _mm256_mul_ps(
        nm, _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(mn[j >> 2], sh), b8)));
  }
}

/* Sub-block b's one integers of eight rows (lanes), q, into token u's f
 * (Q6_K: q's halves' sums h0, h1; kn-cpu-q8.c's q8dot_min_ref). */
KN_AVX2 static inline AI __m256 kfma(const enum q8_kind kind, __m256 f, __m256i q, __m256i h1,
                                     __m256 ka, __m256 kb, __m256 dd, float dx, int32_t sx) {
  const __m256 d = _mm256_set1_ps(dx);
  if (kind == Q8K_Q6_K) {
    q = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_castps_si256(ka), q),
                         _mm256_mullo_epi32(_mm256_castps_si256(kb), h1));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_mul_ps(dd, d), f);
  }
  f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_mul_ps(ka, d), f);
  return _mm256_fmadd_ps(_mm256_set1_ps((float)sx), _mm256_mul_ps(kb, d), f);
}

#if Q8T_VNNI
/* Sub-blocks 2 m and 2 m + 1 of a K-quant super-block as the bytes
 * vpdpbusd takes, one in each half (kbytes' pair). */
Q8T_ATTR static inline AI __m512i kpair(const enum q8_kind kind, const uint8_t *blk, int m) {
  if (kind == Q8K_Q6_K) { /* parts pp, pp + 1 of half m / 2: ql 32 bytes apart */
    const int half = m >> 1, pp = 2 * (m & 1);
    const uint8_t *ql = blk + 64 * half;
    __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)ql)),
                                   _mm256_loadu_si256((const __m256i *)(ql + 32)), 1);
    v = _mm512_and_si512(pp ? _mm512_srli_epi16(v, 4) : v, _mm512_set1_epi8(0xF));
    const __m512i qh =
        _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * half)));
    const __m512i cnt = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16((short)(2 * pp)),
                                                _mm512_set1_epi16((short)(2 * pp + 2)));
    const __m512i h = _mm512_and_si512(_mm512_srlv_epi16(qh, cnt), _mm512_set1_epi8(3));
    return _mm512_or_si512(v, _mm512_slli_epi16(h, 4));
  }
  const int five = kind == Q8K_Q5_K;
  __m512i v = _mm512_broadcast_i64x4(
      _mm256_loadu_si256((const __m256i *)(blk + (five ? 48 : 16) + 32 * m)));
  v = _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xFFFF0000u, v, 4), _mm512_set1_epi8(0xF));
  if (five) { /* bits 2 m and 2 m + 1 of each qh byte as 16 */
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)));
    const __m512i cnt = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16((short)(2 * m)),
                                                _mm512_set1_epi16((short)(2 * m + 1)));
    v = _mm512_or_si512(
        v, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, cnt), _mm512_set1_epi8(1)), 4));
  }
  return v;
}

/* The sums of eight rows' registers p[] of a sub-block pair (lanes 0..7 the
 * first sub-block's four-element sums, 8..15 the second's): the rows in the
 * lanes, *e the first sub-block's and *o the second's; Q6_K, each
 * sub-block's halves apart (*e, *o their first halves, *e1, *o1 the second).
 * Exact. */
Q8T_ATTR static inline AI void kreduce(const enum q8_kind kind, const __m512i *p, __m256i *e,
                                       __m256i *o, __m256i *e1, __m256i *o1) {
  __m512i t[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++)
    t[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2 * i], p[2 * i + 1]),
                            _mm512_unpackhi_epi32(p[2 * i], p[2 * i + 1]));
  /* rows 0..3 and 4..7, each 128-bit quarter's sums (quarters 0, 1: the
   * first sub-block's halves; 2, 3: the second's) */
  const __m512i u0 = _mm512_add_epi32(_mm512_unpacklo_epi64(t[0], t[1]),
                                      _mm512_unpackhi_epi64(t[0], t[1])),
                u1 = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2], t[3]),
                                      _mm512_unpackhi_epi64(t[2], t[3]));
  /* first halves: (rows 0..3 of 2m, of 2m + 1, rows 4..7 of 2m, of 2m + 1) */
  const __m512i a = _mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)),
                b = _mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(3, 1, 3, 1));
  const __m512i pick = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15);
  if (kind == Q8K_Q6_K) {
    const __m512i ha = _mm512_permutexvar_epi32(pick, a), hb = _mm512_permutexvar_epi32(pick, b);
    *e = _mm512_castsi512_si256(ha), *o = _mm512_extracti64x4_epi64(ha, 1);
    *e1 = _mm512_castsi512_si256(hb), *o1 = _mm512_extracti64x4_epi64(hb, 1);
    return;
  }
  const __m512i r = _mm512_permutexvar_epi32(pick, _mm512_add_epi32(a, b));
  *e = _mm512_castsi512_si256(r), *o = _mm512_extracti64x4_epi64(r, 1);
  *e1 = *o1 = _mm256_setzero_si256();
}
#endif

/* row_tile's K-quant super-block from block b0 (its eight sub-blocks): the
 * rows' scales taken once (kscales), each sub-block's eight rows summed in
 * registers of their own and reduced together (Q6_K: each half apart, the
 * offset's term from the s lanes), then a row's one integer times the
 * scales into f[u] (kfma). With VNNI, one token takes the sub-blocks in
 * pairs, one in each half of a 512-bit register (kpair, kreduce). */
Q8T_ATTR static inline AI void row_k(const enum q8_kind kind, const int U, __m256 *f,
                                     const struct kn_cpu_q8_in *x, int t, const uint8_t *const *rp,
                                     int B, int b0) {
  const size_t off = (size_t)(b0 >> 3) * kind_bytes(kind), B8 = (size_t)B * 8;
  const uint8_t *xr = x->q + (size_t)t * x->ldq;
  const float *dx = x->d + (size_t)t * (size_t)B;
  const int32_t *s = x->s + (size_t)t * B8, *o = x->o + (size_t)t * (size_t)B;
  __m256 ka[8], kb[8], dd = _mm256_setzero_ps();
  kscales(kind, rp, off, ka, kb, &dd);
#if Q8T_VNNI
  if (U == 1) {
#pragma GCC unroll 1
    for (int m = 0; m < 4; m++) {
      const int b = b0 + 2 * m;
      const uint8_t *xb = xr + (size_t)b * 34 + 2;
      const __m512i X =
          _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)xb)),
                             _mm256_loadu_si256((const __m256i *)(xb + 34)), 1);
      const __m512i so = kind == Q8K_Q6_K ? _mm512_loadu_si512((const void *)(s + (size_t)b * 8))
                                          : _mm512_setzero_si512();
      __m512i p[8];
#pragma GCC unroll 8
      for (int r = 0; r < 8; r++)
        p[r] = _mm512_dpbusd_epi32(so, kpair(kind, rp[r] + off, m), X);
      __m256i e, od, e1, o1;
      kreduce(kind, p, &e, &od, &e1, &o1);
      f[0] = kfma(kind, f[0], e, e1, ka[2 * m], kb[2 * m], dd, dx[b], o[b]);
      f[0] = kfma(kind, f[0], od, o1, ka[2 * m + 1], kb[2 * m + 1], dd, dx[b + 1], o[b + 1]);
    }
    return;
  }
#endif
  for (int j = 0; j < 8; j++) {
    const int b = b0 + j;
    __m256i wv[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++)
      wv[r] = kbytes(kind, rp[r] + off, j);
#pragma GCC unroll 4
    for (int u = 0; u < U; u++) {
      const __m256i xv =
          _mm256_loadu_si256((const __m256i *)(xr + (size_t)u * x->ldq + (size_t)b * 34 + 2));
      const __m256i so = kind == Q8K_Q6_K
                             ? _mm256_loadu_si256((const __m256i *)(s + (size_t)u * B8 + b * 8))
                             : _mm256_setzero_si256();
      __m256i p[8], q, h1 = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int r = 0; r < 8; r++)
        p[r] = dot4(so, wv[r], xv);
      if (kind == Q8K_Q6_K)
        hsum8_halves(p, &q, &h1);
      else
        q = hsum8_epi32(p);
      f[u] = kfma(kind, f[u], q, h1, ka[j], kb[j], dd, dx[(size_t)u * (size_t)B + b],
                  o[(size_t)u * (size_t)B + b]);
    }
  }
}

/* Sub-block c (of 32 elements) of a Q3_K or Q2_K super-block as the bytes
 * vpmaddubsw takes: q's 2-bit fields (Q3_K: q + 4, its third bit set where
 * hmask's bit c is). */
Q8T_ATTR static inline AI __m256i k16bytes(const enum q8_kind kind, const uint8_t *blk, int c) {
  const int three = kind == Q8K_Q3_K;
  __m256i q = _mm256_loadu_si256((const __m256i *)(blk + (three ? 32 : 16) + 32 * (c >> 2)));
  q = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * (c & 3))), _mm256_set1_epi8(3));
  if (!three) return q;
  const __m256i hm = _mm256_loadu_si256((const __m256i *)blk);
  const __m256i h = c >= 2 ? _mm256_srl_epi16(hm, _mm_cvtsi32_si128(c - 2))
                           : _mm256_sll_epi16(hm, _mm_cvtsi32_si128(2 - c));
  return _mm256_or_si256(q, _mm256_and_si256(h, _mm256_set1_epi8(4)));
}

/* The sums of a block's halves of 16 from its eight lane sums s (the s lanes). */
static inline AI void half_sums(const int32_t *s, int *h0, int *h1) {
  *h0 = s[0] + s[1] + s[2] + s[3], *h1 = s[4] + s[5] + s[6] + s[7];
}

/* row_tile's Q3_K or Q2_K super-block from block b0: the eight rows' integer
 * scales (and Q2_K's mins) a sub-block's in the lanes, each sub-block's
 * eight rows summed in registers of their own (Q3_K from the offset's term)
 * and reduced a half apart, then as q8dot_min_ref. */
Q8T_ATTR static inline AI void row_k16(const enum q8_kind kind, const int U, __m256 *f,
                                       const struct kn_cpu_q8_in *x, int t,
                                       const uint8_t *const *rp, int B, int b0) {
  const int three = kind == Q8K_Q3_K;
  const size_t off = (size_t)(b0 >> 3) * kind_bytes(kind), B8 = (size_t)B * 8;
  const uint8_t *xr = x->q + (size_t)t * x->ldq;
  const float *dx = x->d + (size_t)t * (size_t)B;
  const int32_t *s = x->s + (size_t)t * B8;
  int32_t sc[16][8], mn[16][8];
  for (int r = 0; r < 8; r++) {
    const uint8_t *blk = rp[r] + off;
    int8_t q3[16];
    if (three) kn_q3k_scales(blk + 96, q3);
    for (int j = 0; j < 16; j++) {
      sc[j][r] = three ? q3[j] : blk[j] & 0xF;
      mn[j][r] = three ? 0 : blk[j] >> 4;
    }
  }
  const __m256 d = scales8(rp, off + (three ? 108 : 80)),
               ndm = three ? _mm256_setzero_ps()
                           : _mm256_xor_ps(scales8(rp, off + 82), _mm256_set1_ps(-0.0f));
  for (int c = 0; c < 8; c++) {
    const int b = b0 + c;
    __m256i wv[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++)
      wv[r] = k16bytes(kind, rp[r] + off, c);
    const __m256i s0 = _mm256_loadu_si256((const __m256i *)sc[2 * c]),
                  s1 = _mm256_loadu_si256((const __m256i *)sc[2 * c + 1]);
#pragma GCC unroll 4
    for (int u = 0; u < U; u++) {
      const __m256i xv =
          _mm256_loadu_si256((const __m256i *)(xr + (size_t)u * x->ldq + (size_t)b * 34 + 2));
      const int32_t *su = s + (size_t)u * B8 + (size_t)b * 8;
      const __m256i so = three ? _mm256_loadu_si256((const __m256i *)su) : _mm256_setzero_si256();
      __m256i p[8], q0, q1;
#pragma GCC unroll 8
      for (int r = 0; r < 8; r++)
        p[r] = dot4(so, wv[r], xv);
      hsum8_halves(p, &q0, &q1);
      const __m256i P = _mm256_add_epi32(_mm256_mullo_epi32(s0, q0), _mm256_mullo_epi32(s1, q1));
      const __m256 dxv = _mm256_set1_ps(dx[(size_t)u * (size_t)B + b]);
      f[u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(P), _mm256_mul_ps(d, dxv), f[u]);
      if (!three) {
        int h0, h1;
        half_sums(su, &h0, &h1);
        const __m256i M =
            _mm256_add_epi32(_mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)mn[2 * c]),
                                                _mm256_set1_epi32(h0)),
                             _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)mn[2 * c + 1]),
                                                _mm256_set1_epi32(h1)));
        f[u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(M), _mm256_mul_ps(ndm, dxv), f[u]);
      }
    }
  }
}

/* Reduces eight rows' registers p[] and adds their sums (plus the offset's
 * term o) times the scales into f: lane r is row r's. */
KN_AVX2 static inline AI __m256 row_fma(__m256 f, const __m256i *p, int o, __m256 dw, float dx) {
  const __m256i v = _mm256_add_epi32(hsum8_epi32(p), _mm256_set1_epi32(o));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(dw, _mm256_set1_ps(dx)), f);
}

/* U tokens from t (a few: decode, or a few sequences' steps): eight rows
 * rp[] (the last valid one repeated past nr) side by side in the lanes, each
 * row's block summed in a register of its own and the eight reduced together
 * into one: out[u * ldo + r * rs] for u < U, r < nr. Each weight block is
 * unpacked once for the U tokens. Q4_0 takes blocks in pairs (b, b + 1): one
 * load of both blocks' nibbles gives their low ones (elements 0..15 of b in
 * lanes 0..3, of b + 1 in lanes 4..7) after a mask and their high ones after
 * a shift, so a row's register holds both blocks' sums, four lanes each; the
 * offset's term (the sum of the block's s lanes) is added once the rows are
 * reduced. */
Q8T_ATTR static inline AI void row_tile(const enum q8_kind kind, const int U, float *out,
                                        ptrdiff_t ldo, int rs, const struct kn_cpu_q8_in *x, int t,
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
  if (kind_k16(kind))
    for (; b < B; b += 8)
      row_k16(kind, U, f, x, t, rp, B, b);
  else if (kind >= Q8K_Q4_K)
    for (; b < B; b += 8)
      row_k(kind, U, f, x, t, rp, B, b);
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
    /* IQ4_XS: sub-block b % 8 of super-block b / 8, its scale d (sc - 32) */
    const size_t xo = (size_t)(b >> 3) * kb;
    float xs[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) {
      const uint8_t *blk = rp[r] + (kind == Q8K_IQ4_XS ? xo : (size_t)b * kb);
      if (kind == Q8K_IQ4_XS) xs[r] = h16(blk) * (float)kn_iq4xs_scale(blk, b & 7);
      if (kind == Q8K_Q4_0)
        wv[r] = nib32(blk + 2);
      else if (kind == Q8K_Q5_0)
        wv[r] = _mm256_or_si256(nib32(blk + 6), bit5x32(u32le(blk + 2)));
      else if (kind == Q8K_Q4_1)
        wv[r] = nib32(blk + 4);
      else if (kind == Q8K_Q5_1)
        wv[r] = _mm256_or_si256(nib32(blk + 8), bit5x32(u32le(blk + 4)));
      else if (kind_iq4(kind))
        wv[r] = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(iq4_table()),
                                    nib32(blk + (kind == Q8K_IQ4_XS ? 8 + 16 * (b & 7) : 2)));
      else
        wv[r] = _mm256_loadu_si256((const __m256i *)(blk + 2));
#if Q8T_DPBUSD
      if (kind == Q8K_Q8_0) wv[r] = _mm256_xor_si256(wv[r], _mm256_set1_epi8((char)0x80));
#endif
    }
    const __m256 dw = kind == Q8K_IQ4_XS ? _mm256_loadu_ps(xs) : scales8(rp, (size_t)b * kb),
                 mw = kind_min(kind) ? scales8(rp, (size_t)b * kb + 2) : _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int u = 0; u < U; u++) {
      const __m256i xv =
          _mm256_loadu_si256((const __m256i *)(xr + (size_t)u * x->ldq + (size_t)b * 34 + 2));
      /* the offset's lane terms (kind_signed has none; a min's are its sums) */
      const __m256i so = !kind_min(kind) && !kind_signed(kind)
                             ? _mm256_loadu_si256((const __m256i *)(s + (size_t)u * B8 + b * 8))
                             : _mm256_setzero_si256();
      __m256i p[8];
#pragma GCC unroll 8
      for (int r = 0; r < 8; r++)
        p[r] = kind_signed(kind) ? dot4(so, _mm256_abs_epi8(wv[r]), _mm256_sign_epi8(xv, wv[r]))
                                 : dot4(so, wv[r], xv);
      f[u] = row_fma(f[u], p, 0, dw, dx[(size_t)u * (size_t)B + b]);
      if (kind_min(kind))
        f[u] =
            _mm256_fmadd_ps(_mm256_set1_ps((float)x->o[(size_t)(t + u) * (size_t)B + b]),
                            _mm256_mul_ps(mw, _mm256_set1_ps(dx[(size_t)u * (size_t)B + b])), f[u]);
    }
  }
  float v[8];
#pragma GCC unroll 4
  for (int u = 0; u < U; u++) {
    _mm256_storeu_ps(v, f[u]);
    for (int r = 0; r < nr; r++)
      put1(out + (ptrdiff_t)u * ldo + (ptrdiff_t)r * rs, v[r], acc);
  }
}

/* R rows (Q8_TR or 8) from j, rs rows apart, the last valid one repeated. */
static inline AI void tile_rows(const uint8_t **rp, int R, const uint8_t *w, size_t row_bytes,
                                int j, int rs, int nr) {
  for (int r = 0; r < R; r++)
    rp[r] = w + (size_t)(j + (size_t)rs * (size_t)(r < nr ? r : nr - 1)) * row_bytes;
}

/* Accumulators a token's block sums into (1, 2 or 4): vpdpbusd adds into
 * its destination, so one accumulator makes a block's eight products a chain
 * of eight latencies. With a few tokens nothing else overlaps them: the
 * products go to several chains, summed at the block's end. */
#define Q8_CHAINS(U) (Q8T_DPBUSD ? ((U) == 1 ? 4 : (U) <= 4 ? 2 : 1) : 1)

/* Tokens up to which an X16 tile of one group, 8 rows to a register (AVX2),
 * runs its two halves of rows side by side in one sweep (x16_tile). */
#define Q8_HV_U 2

/* Tokens up to which an X16 tile loads a block's weights one block ahead
 * (in registers: the loads' latency then overlaps the block before). */
#define Q8_PIPE_U (Q8T_VNNI && Q8T_ZMM ? 4 : 0)

/* Tokens of an X16 tile over two groups at Q8_XU tokens and more (0: no
 * such tiles): 16 accumulators and 8 chains in 32 registers. */
#define Q8_X2U (Q8T_VNNI && Q8T_ZMM ? 4 : 0)

/* The bytes of a group from which one or two tokens take two groups a tile:
 * a group of 16 long rows streams more than L1 holds between two reads of
 * the same inputs, which then come from L2; two groups read them once. */
#define Q8_DEC2_BYTES (32 * 1024)

/* The bytes of inputs a sweep of the X16 groups takes (L2). */
#define Q8_XTOK_BYTES (192 * 1024)

/* The inputs of U tokens from t as the X16 tiles take them: a token's Q8_0
 * quants (past each block's scale, 34 bytes a block), its blocks' scales,
 * their sums (struct kn_cpu_q8_in's o) and their lane sums (s). */
struct q8_xt {
  const uint8_t *q[Q8_XU];
  const float *d[Q8_XU];
  const int32_t *o[Q8_XU], *s[Q8_XU];
};

static inline AI void xt_at(struct q8_xt *xt, const struct kn_cpu_q8_in *x, int t, int U, int B) {
#pragma GCC unroll 8
  for (int u = 0; u < U; u++) {
    xt->q[u] = x->q + (size_t)(t + u) * x->ldq + 2;
    xt->d[u] = x->d + (size_t)(t + u) * (size_t)B;
    xt->o[u] = x->o ? x->o + (size_t)(t + u) * (size_t)B : NULL;
    xt->s[u] = x->s + (size_t)(t + u) * (size_t)B * 8;
  }
}

/* U accumulators f at zero. */
Q8T_ATTR static inline AI void xt_zero(q8vf *f, int U) {
#pragma GCC unroll 8
  for (int u = 0; u < U; u++)
    f[u] = vf_zero();
}

/* Row half h's U accumulators f into out (u * ldo apart), or added to it. */
Q8T_ATTR static inline AI void xt_store(float *out, ptrdiff_t ldo, int h, const q8vf *f, int U,
                                        int acc) {
#pragma GCC unroll 8
  for (int u = 0; u < U; u++) {
    float *o = out + (ptrdiff_t)u * ldo + Q8_TL * h;
    vf_store(o, acc ? vf_add(vf_load(o), f[u]) : f[u]);
  }
}

/* U tokens from t against the 16 rows of G0 X16 groups (G0 1 or 2; g: the
 * first's block 0, the second's B blocks on), rows in the lanes (Q8_TL of
 * them at a time): a lane's block is one integer, its offset's term included,
 * times the two scales into the lane's accumulator, block after block;
 * out[u * ldo + 16 i + r] for u < U, group i, r < 16. Each register of
 * weights serves the U tokens, each with its four inputs broadcast once for
 * the register groups (a broadcast takes a vector unit's slot as vpdpbusd
 * does: two groups halve them a product). With pfe, the first sweep asks for the
 * weights Q8_PREFETCH_BYTES ahead of each block as it goes, up to pfe (a
 * group of long rows is larger than L1: asked for at once, its first lines
 * would leave before they are read); with two groups, what lies past a
 * group's end is the next pair's same group, read next. */
Q8T_ATTR static inline AI void x16_tile(const enum q8_kind kind, const int G0, const int U,
                                        float *out, ptrdiff_t ldo, const struct kn_cpu_q8_in *x,
                                        int t, const uint8_t *g, int B, int acc,
                                        const uint8_t *pfe) {
  /* a block's bytes (IQ4_XS: a sub-block's share of its super-block's) */
  const size_t gb = KN_X16_ROWS * kind_bytes(kind) / (kind == Q8K_IQ4_XS ? 8 : 1),
               hdr = kind_min(kind) ? 64 : 32;
  const size_t gs = (size_t)B * gb; /* a group's bytes */
  /* where block b's quads start (IQ4_XS: sub-block b % 8's, past the
   * super-block's 128 bytes of scales) */
#define QS(b)                                                                                      \
  (kind == Q8K_IQ4_XS ? g + (size_t)((b) >> 3) * 8 * gb + 128 + 256 * ((b)&7)                      \
                      : g + (size_t)(b)*gb + hdr)
  /* 8 rows to a register (AVX2), one group and a few tokens: its two halves
   * of rows are the two register groups, side by side in one sweep, so that
   * each block is used whole as it arrives (in two sweeps, the first waits on
   * the memory and the second reads from cache with the memory idle) */
  const int HV = KN_X16_ROWS / Q8_TL > 1 && G0 == 1 && U <= Q8_HV_U;
  const int G = HV ? 2 : G0;                   /* register groups */
  const size_t gst = HV ? 0 : gs;              /* bytes from one register group to the next */
#define HOF(i) (HV ? (i) : h)                  /* a register group's half of the rows */
  const int NS = HV ? 1 : KN_X16_ROWS / Q8_TL; /* sweeps */
  const int four = kind == Q8K_Q4_0 || kind == Q8K_Q4_1, five = kind == Q8K_Q5_0 || kind == Q8K_Q5_1;
  /* Q4_0 and Q4_1 in several chains: the high nibbles in place (16 q), in the
   * odd chains, their sum shifted back exactly (one shift a block, not four) */
  const int CH = G > 1 ? (U <= 2 ? 2 : 1) : Q8_CHAINS(U), HIP = Q8T_DPBUSD && four && CH > 1;
  const int PIPE = U <= (G0 > 1 ? 1 : Q8_PIPE_U) && kind != Q8K_Q8_0; /* Q8_0: 8 registers more */
  struct q8_xt xt;
  xt_at(&xt, x, t, U, B);
#pragma GCC unroll 2
  for (int h = 0; h < NS; h++) { /* AVX2 without HV: rows 0..7, then 8..15 */
    q8vf f[2][Q8_XU];
#pragma GCC unroll 2
    for (int i = 0; i < G; i++)
      xt_zero(f[i], U);
    q8vi nx[2][4]; /* PIPE: the next block's weight registers */
    if (PIPE)
#pragma GCC unroll 2
      for (int i = 0; i < G; i++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
          nx[i][c] = vi_load(QS(0) + i * gst + 4 * Q8_TL * HOF(i) + 64 * c);
    for (int b = 0; b < B; b++) {
      const uint8_t *blk = g + (size_t)b * gb, *qs = QS(b), *qn = QS(b + 1 < B ? b + 1 : b);
      q8vi wv[2][4];
      if (PIPE)
#pragma GCC unroll 2
        for (int i = 0; i < G; i++)
#pragma GCC unroll 4
          for (int c = 0; c < 4; c++)
            wv[i][c] = nx[i][c], nx[i][c] = vi_load(qn + i * gst + 4 * Q8_TL * HOF(i) + 64 * c);
#define WV(i, c) (PIPE ? wv[i][c] : vi_load(qs + (i)*gst + 4 * Q8_TL * HOF(i) + 64 * (c)))
      /* two groups: past a group's end, the next pair's same group (read next) */
      const size_t jump = G0 > 1 && (size_t)b * gb + Q8_PREFETCH_BYTES >= gs ? gs : 0;
#pragma GCC unroll 2
      for (int i = 0; i < G0; i++)
        prefetch_part(blk + i * gs + jump, gb, 0, 1, h == 0 ? pfe : NULL);
      q8vi p[2][Q8_XU][4]; /* a token's chains: the offset's term in the first */
#pragma GCC unroll 8
      for (int u = 0; u < U; u++) { /* (kind_signed has none; a min is added after) */
        const q8vi o0 = !kind_min(kind) && !kind_signed(kind) ? vi_set1_32(xt.o[u][b]) : vi_zero();
#pragma GCC unroll 2
        for (int i = 0; i < G; i++) {
          p[i][u][0] = o0;
#pragma GCC unroll 4
          for (int k = 1; k < CH; k++)
            p[i][u][k] = vi_zero();
        }
      }
#if !Q8T_DPBUSD
      if (four) {
        /* vpmaddubsw's pairs of 15 x 127 summed in 16 bits: eight of them fit */
        __m256i s16[2][Q8_XU];
#pragma GCC unroll 2
        for (int i = 0; i < G; i++)
#pragma GCC unroll 8
          for (int u = 0; u < U; u++)
            s16[i][u] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
          __m256i l[2], hi[2];
#pragma GCC unroll 2
          for (int i = 0; i < G; i++) {
            const __m256i v = WV(i, c);
            l[i] = vi_and(v, vi_set1_8(0x0F));
            hi[i] = vi_and(vi_srli16_4(v), vi_set1_8(0x0F));
          }
#pragma GCC unroll 8
          for (int u = 0; u < U; u++) {
            const __m256i xl = vi_bcast4(xt.q[u] + 34 * (size_t)b + 4 * c),
                          xh = vi_bcast4(xt.q[u] + 34 * (size_t)b + 16 + 4 * c);
#pragma GCC unroll 2
            for (int i = 0; i < G; i++) {
              s16[i][u] = _mm256_add_epi16(s16[i][u], _mm256_add_epi16(_mm256_maddubs_epi16(l[i], xl),
                                                                       _mm256_maddubs_epi16(hi[i], xh)));
              Q8_KEEP(s16[i][u]);
            }
          }
        }
#pragma GCC unroll 2
        for (int i = 0; i < G; i++)
#pragma GCC unroll 8
          for (int u = 0; u < U; u++)
            p[i][u][0] =
                _mm256_add_epi32(p[i][u][0], _mm256_madd_epi16(s16[i][u], _mm256_set1_epi16(1)));
      } else
#endif
          if (kind != Q8K_Q8_0) {
        /* Q5_0, Q5_1: each quad register's fifth bits from its two planes
         * (the low and the high nibbles'), this half's rows at 4 h; IQ4_NL:
         * and IQ4_XS: the nibbles' levels (iq4_table), kind_signed's as |w|
         * against x with w's sign */
        const q8vi tab = vi_lanes(iq4_table());
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
          q8vi l[2], hi[2], ls[2], hs[2];
#pragma GCC unroll 2
          for (int i = 0; i < G; i++) {
            const q8vi v = WV(i, c);
            l[i] = vi_and(v, vi_set1_8(0x0F));
            hi[i] = HIP ? vi_and(v, vi_set1_8((char)0xF0)) : vi_and(vi_srli16_4(v), vi_set1_8(0x0F));
            if (five) {
              const uint8_t *planes = blk + i * gst + hdr + 256 + 4 * HOF(i);
              l[i] = vi_or(l[i], vi_fifth(planes + 16 * c));
              hi[i] = vi_or(hi[i], vi_fifth(planes + 16 * c + 8));
            }
            if (kind_iq4(kind)) l[i] = vi_shuf(tab, l[i]), hi[i] = vi_shuf(tab, hi[i]);
            ls[i] = l[i], hs[i] = hi[i];
            if (kind_signed(kind)) l[i] = vi_abs8(l[i]), hi[i] = vi_abs8(hi[i]);
          }
#pragma GCC unroll 8
          for (int u = 0; u < U; u++) {
            const q8vi xl = vi_bcast4(xt.q[u] + 34 * (size_t)b + 4 * c),
                       xh = vi_bcast4(xt.q[u] + 34 * (size_t)b + 16 + 4 * c);
#pragma GCC unroll 2
            for (int i = 0; i < G; i++) {
              q8vi *pl = &p[i][u][2 * c % CH], *ph = &p[i][u][(2 * c + 1) % CH];
              *pl = vi_dot(*pl, l[i], kind_signed(kind) ? vi_sign8(xl, ls[i]) : xl);
              *ph = vi_dot(*ph, hi[i], kind_signed(kind) ? vi_sign8(xh, hs[i]) : xh);
            }
          }
        }
      } else {
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
#if Q8T_DPBUSD
          q8vi uw[2];
#pragma GCC unroll 2
          for (int i = 0; i < G; i++)
            uw[i] = vi_xor(WV(i, c), vi_set1_8(0x80)); /* w + 128 unsigned */
#pragma GCC unroll 8
          for (int u = 0; u < U; u++) {
            const q8vi xc = vi_bcast4(xt.q[u] + 34 * (size_t)b + 4 * c);
#pragma GCC unroll 2
            for (int i = 0; i < G; i++)
              p[i][u][c % CH] = vi_dot(p[i][u][c % CH], uw[i], xc);
          }
#else
#pragma GCC unroll 2
          for (int i = 0; i < G; i++) {
            const __m256i v = WV(i, c), a = _mm256_abs_epi8(v); /* |w| against x with w's sign */
#pragma GCC unroll 8
            for (int u = 0; u < U; u++)
              p[i][u][0] = vi_dot(p[i][u][0], a,
                                  _mm256_sign_epi8(vi_bcast4(xt.q[u] + 34 * (size_t)b + 4 * c), v));
          }
#endif
        }
      }
      q8vf dw[2], mw[2];
#pragma GCC unroll 2
      for (int i = 0; i < G; i++) {
        if (kind == Q8K_IQ4_XS) { /* d (sc - 32): sc from scales_l's nibble, scales_h's two bits */
          const uint8_t *sb = g + (size_t)(b >> 3) * 8 * gb + i * gst;
          const int j = b & 7;
          const q8vi sl = vi_load(sb + 32 + 4 * Q8_TL * HOF(i)),
                     sh = vi_u16(sb + 96 + 2 * Q8_TL * HOF(i));
          const q8vi sc = vi_or(vi_and(vi_srl32(sl, 4 * j), vi_set1_32(0xF)),
                                vi_sll32(vi_and(vi_srl32(sh, 2 * j), vi_set1_32(3)), 4));
          dw[i] = vf_mul(vf_h16(sb + 2 * Q8_TL * HOF(i)), vf_cvt(vi_add(sc, vi_set1_32(-32))));
        } else {
          dw[i] = vf_h16(blk + i * gst + 2 * Q8_TL * HOF(i));
        }
        mw[i] = kind_min(kind) ? vf_h16(blk + i * gst + 32 + 2 * Q8_TL * HOF(i)) : vf_zero();
      }
#pragma GCC unroll 8
      for (int u = 0; u < U; u++) { /* the chains' sum: integers, exact in any order */
        const q8vf dxb = vf_set1(xt.d[u][b]);
#pragma GCC unroll 2
        for (int i = 0; i < G; i++) {
          const q8vi ev = CH > 2 ? vi_add(p[i][u][0], p[i][u][2]) : p[i][u][0],
                     od = CH > 2 ? vi_add(p[i][u][1], p[i][u][3]) : p[i][u][1];
          const q8vi sum = CH > 1 ? vi_add(ev, HIP ? vi_srai4(od) : od) : ev;
          f[i][u] = vf_fma(vf_cvt(sum), vf_mul(dw[i], dxb), f[i][u]);
          if (kind_min(kind)) /* the min times the block's input sum */
            f[i][u] = vf_fma(vf_set1((float)xt.o[u][b]), vf_mul(mw[i], dxb), f[i][u]);
        }
      }
    }
#pragma GCC unroll 2
    for (int i = 0; i < G; i++)
      xt_store(out + KN_X16_ROWS * (HV ? 0 : i), ldo, HOF(i), f[i], U, acc);
  }
#undef WV
#undef HOF
#undef QS
}

/* Sub-block j's 6-bit scale (mn 0) or min (mn 1) of the lanes' rows, from
 * the three dwords D[] of their 12 bytes (sc_min's bits, a lane each). */
Q8T_ATTR static inline AI q8vi kx16_sc(const q8vi *D, int j, int mn) {
  if (j < 4) return vi_and(vi_srl32(D[mn], 8 * j), vi_set1_32(63));
  const int k = j - 4;
  return vi_or(vi_and(vi_srl32(D[2], 8 * k + 4 * mn), vi_set1_32(0xF)),
               vi_and(vi_srl32(D[mn], 8 * k + 2), vi_set1_32(0x30)));
}

/* U tokens from t (U <= Q8_KXU) against the 16 rows of a Q4_K or Q5_K X16
 * group (g: its super-block 0, kn-quant.h's layout), rows in the lanes
 * (Q8_TL at a time). A sub-block pair's 64 nibbles of a lane's row are eight
 * quads: the low nibbles against the first sub-block's inputs, the high ones
 * against the second's (Q4_K with VNNI in place, 16 q, the sum shifted back
 * exactly; Q5_K's fifth bits from qh's quad of the same elements, bits 2 m
 * and 2 m + 1), a sub-block's 32 products one integer; then as
 * q8dot_min_ref, sub-block after sub-block, fma((float)p, d sc dx) and
 * fma((float)sx, -(dmin mn) dx) (the products d sc and dmin mn exact). pfe
 * as x16_tile's. */
Q8T_ATTR static inline AI void kx16_tile(const enum q8_kind kind, const int U, float *out,
                                         ptrdiff_t ldo, const struct kn_cpu_q8_in *x, int t,
                                         const uint8_t *g, int B, int acc, const uint8_t *pfe) {
  const size_t gb = KN_X16_ROWS * kind_bytes(kind);
  const int five = kind == Q8K_Q5_K, HIP = Q8T_DPBUSD && !five;
  const int CH = Q8_CHAINS(U) > 1 ? 2 : 1; /* one token: two chains a half */
  struct q8_xt xt;
  xt_at(&xt, x, t, U, B);
  /* 8 rows to a register (AVX2), a few tokens: both halves of the rows of
   * each super-block in turn, in one sweep (x16_tile's reason) */
  const int HV = KN_X16_ROWS / Q8_TL > 1 && U <= Q8_HV_U;
  const int NS = HV ? 1 : KN_X16_ROWS / Q8_TL, NH = HV ? KN_X16_ROWS / Q8_TL : 1;
#pragma GCC unroll 2
  for (int hs = 0; hs < NS; hs++) { /* AVX2 without HV: rows 0..7, then 8..15 */
    q8vf fs[2][Q8_KXU];
#pragma GCC unroll 2
    for (int hh = 0; hh < NH; hh++)
      xt_zero(fs[hh], U);
    for (int s = 0; s < B / 8; s++) {
      const uint8_t *sb = g + (size_t)s * gb;
#pragma GCC unroll 2
      for (int hh = 0; hh < NH; hh++) {
        const int h = HV ? hh : hs;
        q8vf *f = fs[hh];
        const q8vf d = vf_h16(sb + 2 * Q8_TL * h), dm = vf_h16(sb + 32 + 2 * Q8_TL * h);
        q8vi D[3];
#pragma GCC unroll 3
        for (int k = 0; k < 3; k++)
          D[k] = vi_load(sb + 64 + 64 * k + 4 * Q8_TL * h);
#pragma GCC unroll 4
        for (int m = 0; m < 4; m++) { /* sub-blocks 2 m and 2 m + 1: a quarter of the bytes */
          const int b = 8 * s + 2 * m;
          prefetch_part(sb, gb, m, 4, h == 0 ? pfe : NULL);
          q8vi pl[Q8_KXU][2], ph[Q8_KXU][2];
#pragma GCC unroll 4
          for (int u = 0; u < U; u++)
#pragma GCC unroll 2
            for (int k = 0; k < CH; k++)
              pl[u][k] = ph[u][k] = vi_zero();
          const uint8_t *qs = sb + 256 + 512 * m + 4 * Q8_TL * h;
#pragma GCC unroll 8
          for (int c = 0; c < 8; c++) {
            const q8vi v = vi_load(qs + 64 * c);
            q8vi lo = vi_and(v, vi_set1_8(0x0F)),
                 hi = HIP ? vi_and(v, vi_set1_8((char)0xF0))
                          : vi_and(vi_srli16_4(v), vi_set1_8(0x0F));
            if (five) { /* bit 2 m (2 m + 1) of each qh byte to bit 4 */
              const q8vi qh = vi_load(sb + 2304 + 64 * c + 4 * Q8_TL * h);
              lo = vi_or(lo, vi_and(m < 2 ? vi_sll16(qh, 4 - 2 * m) : vi_srl16(qh, 2 * m - 4),
                                    vi_set1_8(0x10)));
              hi = vi_or(hi, vi_and(m < 2 ? vi_sll16(qh, 3 - 2 * m) : vi_srl16(qh, 2 * m - 3),
                                    vi_set1_8(0x10)));
            }
#pragma GCC unroll 4
            for (int u = 0; u < U; u++) {
              q8vi *a = &pl[u][c % CH], *e = &ph[u][c % CH];
              *a = vi_dot(*a, lo, vi_bcast4(xt.q[u] + 34 * (size_t)b + 4 * c));
              *e = vi_dot(*e, hi, vi_bcast4(xt.q[u] + 34 * (size_t)(b + 1) + 4 * c));
            }
          }
          const q8vf ds0 = vf_mul(d, vf_cvt(kx16_sc(D, 2 * m, 0))),
                     mn0 = vf_mul(dm, vf_cvt(kx16_sc(D, 2 * m, 1))),
                     ds1 = vf_mul(d, vf_cvt(kx16_sc(D, 2 * m + 1, 0))),
                     mn1 = vf_mul(dm, vf_cvt(kx16_sc(D, 2 * m + 1, 1)));
#pragma GCC unroll 4
          for (int u = 0; u < U; u++) {
            const q8vi p0 = CH > 1 ? vi_add(pl[u][0], pl[u][1]) : pl[u][0],
                       p1 = CH > 1 ? vi_add(ph[u][0], ph[u][1]) : ph[u][0];
            const q8vf x0 = vf_set1(xt.d[u][b]), x1 = vf_set1(xt.d[u][b + 1]);
            f[u] = vf_fma(vf_cvt(p0), vf_mul(ds0, x0), f[u]);
            f[u] = vf_fnmadd(vf_set1((float)xt.o[u][b]), vf_mul(mn0, x0), f[u]);
            f[u] = vf_fma(vf_cvt(HIP ? vi_srai4(p1) : p1), vf_mul(ds1, x1), f[u]);
            f[u] = vf_fnmadd(vf_set1((float)xt.o[u][b + 1]), vf_mul(mn1, x1), f[u]);
          }
        }
      }
    }
#pragma GCC unroll 2
    for (int hh = 0; hh < NH; hh++)
      xt_store(out, ldo, HV ? hh : hs, fs[hh], U, acc);
  }
}

/* Byte k (0..3) of each 32-bit lane of D, sign-extended. */
Q8T_ATTR static inline AI q8vi vi_sbyte(q8vi D, int k) {
  return vi_sra32(vi_sll32(D, 24 - 8 * k), 24);
}

/* f plus sub-block b's integers P times the scales (d dx_b), a token's. */
Q8T_ATTR static inline AI q8vf q6x16_fma(q8vf f, q8vi P, q8vf d, float dxb) {
  return vf_fma(vf_cvt(P), vf_mul(d, vf_set1(dxb)), f);
}

/* U tokens from t (U <= Q8_6XU) against the 16 rows of a Q6_K X16 group (g:
 * its super-block 0, kn-quant.h's layout), rows in the lanes (Q8_TL at a
 * time). Half hf of a super-block (sub-blocks 4 hf .. 4 hf + 3) in two
 * passes p: ql's quads 16 hf + 8 p + c (c < 8) with qh's 8 hf + c are the
 * elements 4 c .. 4 c + 3 of sub-block 4 hf + p (the low nibbles, qh's bits
 * 2 p, 2 p + 1) and of 4 hf + p + 2 (the high nibbles, bits 2 p + 4, 2 p + 5).
 * A sub-block's halves (c < 4, c >= 4) are summed apart from the offset's
 * term (-32 times their inputs' sum: the s lanes), then as q8dot_min_ref:
 * sc0 p0 + sc1 p1 exactly, fma((float)p, d dx), sub-block after sub-block
 * (4 hf + 2's after 4 hf + 1's). pfe as x16_tile's. */
Q8T_ATTR static inline AI void q6x16_tile(const int U, float *out, ptrdiff_t ldo,
                                          const struct kn_cpu_q8_in *x, int t, const uint8_t *g,
                                          int B, int acc, const uint8_t *pfe) {
  const size_t gb = KN_X16_ROWS * 210;
  struct q8_xt xt;
  xt_at(&xt, x, t, U, B);
  /* 8 rows to a register (AVX2), a few tokens: both halves of the rows of
   * each super-block in turn, in one sweep (x16_tile's reason) */
  const int HV = KN_X16_ROWS / Q8_TL > 1 && U <= Q8_HV_U;
  const int NS = HV ? 1 : KN_X16_ROWS / Q8_TL, NH = HV ? KN_X16_ROWS / Q8_TL : 1;
#pragma GCC unroll 2
  for (int hs = 0; hs < NS; hs++) { /* AVX2 without HV: rows 0..7, then 8..15 */
    q8vf fs[2][Q8_6XU];
#pragma GCC unroll 2
    for (int hh = 0; hh < NH; hh++)
      xt_zero(fs[hh], U);
    for (int s = 0; s < B / 8; s++) {
      const uint8_t *sb = g + (size_t)s * gb;
#pragma GCC unroll 2
      for (int hh = 0; hh < NH; hh++) {
        const int rh = HV ? hh : hs;
        q8vf *f = fs[hh];
        const q8vf d = vf_h16(sb + 2 * Q8_TL * rh);
#pragma GCC unroll 1
        for (int hf = 0; hf < 2; hf++) {
          /* the half's scale bytes 8 hf .. 8 hf + 3, 8 hf + 4 .. 8 hf + 7 */
          const q8vi D0 = vi_load(sb + 32 + 128 * hf + 4 * Q8_TL * rh),
                     D1 = vi_load(sb + 96 + 128 * hf + 4 * Q8_TL * rh);
          q8vi pend[Q8_6XU]; /* sub-block 4 hf + 2's integers, after 4 hf + 1's */
#pragma GCC unroll 2
          for (int p = 0; p < 2; p++) {
            prefetch_part(sb, gb, 2 * hf + p, 4, rh == 0 ? pfe : NULL);
            const int bl = 8 * s + 4 * hf + p, bh = bl + 2;
            q8vi a[Q8_6XU][2][2]; /* a token's [low, high nibbles' sub-block][its half] */
#pragma GCC unroll 4
            for (int u = 0; u < U; u++)
#pragma GCC unroll 2
              for (int e = 0; e < 2; e++) {
                const int32_t *l = xt.s[u] + (size_t)bl * 8 + 4 * e, *m = l + 16;
                a[u][0][e] = vi_set1_32(l[0] + l[1] + l[2] + l[3]);
                a[u][1][e] = vi_set1_32(m[0] + m[1] + m[2] + m[3]);
              }
            const uint8_t *ql = sb + 288 + 64 * (16 * hf + 8 * p) + 4 * Q8_TL * rh,
                          *qh = sb + 2336 + 512 * hf + 4 * Q8_TL * rh;
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
              const q8vi Q = vi_load(ql + 64 * c), H = vi_load(qh + 64 * c);
              const q8vi wl = vi_or(vi_and(Q, vi_set1_8(0x0F)),
                                    vi_and(vi_sll16(H, 4 - 2 * p), vi_set1_8(0x30))),
                         wh = vi_or(vi_and(vi_srli16_4(Q), vi_set1_8(0x0F)),
                                    vi_and(vi_srl16(H, 2 * p), vi_set1_8(0x30)));
#pragma GCC unroll 4
              for (int u = 0; u < U; u++) {
                q8vi *al = &a[u][0][c >> 2], *ah = &a[u][1][c >> 2];
                *al = vi_dot(*al, wl, vi_bcast4(xt.q[u] + 34 * (size_t)bl + 4 * c));
                *ah = vi_dot(*ah, wh, vi_bcast4(xt.q[u] + 34 * (size_t)bh + 4 * c));
              }
            }
            /* sub-block 4 hf + p's scales are bytes 2 p, 2 p + 1 of D0, 4 hf + p + 2's of D1 */
            const q8vi l0 = vi_sbyte(D0, 2 * p), l1 = vi_sbyte(D0, 2 * p + 1),
                       h0 = vi_sbyte(D1, 2 * p), h1 = vi_sbyte(D1, 2 * p + 1);
#pragma GCC unroll 4
            for (int u = 0; u < U; u++) {
              const q8vi Pl = vi_add(vi_mullo(l0, a[u][0][0]), vi_mullo(l1, a[u][0][1])),
                         Ph = vi_add(vi_mullo(h0, a[u][1][0]), vi_mullo(h1, a[u][1][1]));
              f[u] = q6x16_fma(f[u], Pl, d, xt.d[u][bl]);
              if (p == 0) {
                pend[u] = Ph;
              } else {
                f[u] = q6x16_fma(f[u], pend[u], d, xt.d[u][bl + 1]);
                f[u] = q6x16_fma(f[u], Ph, d, xt.d[u][bh]);
              }
            }
          }
        }
      }
    }
#pragma GCC unroll 2
    for (int hh = 0; hh < NH; hh++)
      xt_store(out, ldo, HV ? hh : hs, fs[hh], U, acc);
  }
}

/* Scale s (0..15) of the lanes' rows of a Q3_K super-block (less 32) or a
 * Q2_K one (mn 0: the scale, 1: the min), from the dwords D[] of their scale
 * bytes (Q3_K's as the X16 layout rearranges them: s < 15 a 6-bit two's
 * complement at bit 6 (s % 5) of D[s / 5], s = 15 two bits at the top of
 * each; Q2_K's byte s, scale under min). */
Q8T_ATTR static inline AI q8vi k16_sc(const enum q8_kind kind, const q8vi *D, int s, int mn) {
  if (kind == Q8K_Q2_K) return vi_and(vi_srl32(D[s >> 2], 8 * (s & 3) + 4 * mn), vi_set1_32(0xF));
  if (s < 15) return vi_sra32(vi_sll32(D[s / 5], 26 - 6 * (s % 5)), 26);
  return vi_or(vi_or(vi_srl32(D[0], 30), vi_and(vi_srl32(D[1], 28), vi_set1_32(0xC))),
               vi_sll32(vi_sra32(D[2], 30), 4));
}

/* The power of 2 that k16_quads' sums of sub-block j (of a quad group) carry. */
static inline AI int k16_sh(const enum q8_kind kind, int j) {
  if (kind == Q8K_Q3_K) return j < 3 ? 2 * j : 2;
  return j < 3 || Q8T_DPBUSD ? 2 * j : 0;
}

/* Sub-block c = 4 G + j's fields from a quad Q of q (and H of hmask), times
 * 2^k16_sh: q's bits 2 j, 2 j + 1 in place, Q3_K's third bit (bit c of H)
 * moved to 2 j + 2, so that one mask takes them. Where a byte cannot hold a
 * field in place they move down: Q3_K's j = 3 ((7 << 6) > 255) to (q + 4 h)
 * << 2, Q2_K's j = 3 to bit 0 under vpmaddubsw, whose pairs 2 x 192 x 127
 * would saturate. A 16-bit shift moves a byte's bit within the byte, which the
 * mask keeps. */
Q8T_ATTR static inline AI q8vi k16_field(const enum q8_kind kind, q8vi Q, q8vi H, int j, int c) {
  if (kind == Q8K_Q2_K)
    return k16_sh(kind, j) == 2 * j ? vi_and(Q, vi_set1_8(3 << 2 * j))
                                    : vi_and(vi_srl16(Q, 6), vi_set1_8(3));
  const int to = j < 3 ? 2 * j + 2 : 4, n = c - to; /* where bit c of H goes */
  const q8vi w = j < 3 ? vi_and(Q, vi_set1_8(3 << 2 * j)) : vi_and(vi_srl16(Q, 4), vi_set1_8(0xC));
  const q8vi hb = n > 0 ? vi_srl16(H, n) : n < 0 ? vi_sll16(H, -n) : H;
  return vi_or(w, vi_and(hb, vi_set1_8(1 << to)));
}

/* k16_tile's sweep of a super-block half h (sb, its scale dwords D, d, and
 * Q2_K's -dmin ndm) for U <= Q8_K16G tokens (decode): the four sub-blocks c
 * = 4 G + j of q's quad group G at once, each of q's quads and hmask's
 * loaded once for the four and each field taken with one mask (k16_field).
 * Sub-block j's sums carry 2^k16_sh (Q3_K's offset term is entered times it
 * too), and so does sc0 p0 + sc1 p1 (under 2^24 in magnitude), which an
 * arithmetic shift makes k16_tile's integer exactly; then as k16_tile. */
Q8T_ATTR static inline AI void k16_quads(const enum q8_kind kind, const int U, q8vf *f,
                                         const struct q8_xt *xt, const uint8_t *sb, size_t gb,
                                         int h, int s, const q8vi *D, q8vf d, q8vf ndm,
                                         const uint8_t *pfe) {
  const int three = kind == Q8K_Q3_K;
  const uint8_t *hm = sb + 224 + 4 * Q8_TL * h;
#pragma GCC unroll 1
  for (int G = 0; G < 2; G++) {
    const uint8_t *qs = sb + (three ? 736 : 320) + 512 * G + 4 * Q8_TL * h;
    q8vi a[4][2][Q8_K16G]; /* sub-block j's halves, a token's */
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
#pragma GCC unroll 2
      for (int u = 0; u < U; u++) {
        int h0 = 0, h1 = 0;
        if (three) half_sums(xt->s[u] + (size_t)(8 * s + 4 * G + j) * 8, &h0, &h1);
        a[j][0][u] = vi_set1_32(h0 * (1 << k16_sh(kind, j)));
        a[j][1][u] = vi_set1_32(h1 * (1 << k16_sh(kind, j)));
      }
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
      if (!(k & 1)) prefetch_part(sb, gb, 4 * G + k / 2, 8, h == 0 ? pfe : NULL);
      const q8vi Q = vi_load(qs + 64 * k), H = three ? vi_load(hm + 64 * k) : vi_zero();
#pragma GCC unroll 4
      for (int j = 0; j < 4; j++) {
        const q8vi w = k16_field(kind, Q, H, j, 4 * G + j);
        const size_t xo = 34 * (size_t)(8 * s + 4 * G + j) + 4 * k;
#pragma GCC unroll 2
        for (int u = 0; u < U; u++)
          a[j][k >> 2][u] = vi_dot(a[j][k >> 2][u], w, vi_bcast4(xt->q[u] + xo));
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
      const int c = 4 * G + j, b = 8 * s + c, sh = k16_sh(kind, j);
      const q8vi s0 = k16_sc(kind, D, 2 * c, 0), s1 = k16_sc(kind, D, 2 * c + 1, 0),
                 m0 = three ? vi_zero() : k16_sc(kind, D, 2 * c, 1),
                 m1 = three ? vi_zero() : k16_sc(kind, D, 2 * c + 1, 1);
#pragma GCC unroll 2
      for (int u = 0; u < U; u++) {
        const q8vi p = vi_add(vi_mullo(s0, a[j][0][u]), vi_mullo(s1, a[j][1][u])),
                   P = sh ? vi_sra32(p, sh) : p;
        const q8vf dxb = vf_set1(xt->d[u][b]);
        f[u] = vf_fma(vf_cvt(P), vf_mul(d, dxb), f[u]);
        if (!three) {
          int h0, h1;
          half_sums(xt->s[u] + (size_t)b * 8, &h0, &h1);
          const q8vi M = vi_add(vi_mullo(m0, vi_set1_32(h0)), vi_mullo(m1, vi_set1_32(h1)));
          f[u] = vf_fma(vf_cvt(M), vf_mul(ndm, dxb), f[u]);
        }
      }
    }
  }
}

/* U tokens from t (U <= Q8_K16U) against the 16 rows of a Q3_K or Q2_K X16
 * group (g: its super-block 0, kn-quant.h's layout), rows in the lanes
 * (Q8_TL at a time). Sub-block c (of 32 elements) of a super-block: q's
 * quads 8 (c / 4) .. + 7 shifted right by 2 (c % 4), Q3_K's third bit bit c
 * of hmask's quads (so that a byte is q + 4), against the inputs' eight
 * quads; its halves (quads 0..3, 4..7) summed apart (Q3_K from the offset's
 * term, -4 times their inputs' sum: the s lanes), then as q8dot_min_ref:
 * sc0 p0 + sc1 p1 exactly, fma((float)p, d dx); Q2_K then fma((float)(mn0
 * sx0 + mn1 sx1), -(dmin dx)). pfe as x16_tile's. */
Q8T_ATTR static inline AI void k16_tile(const enum q8_kind kind, const int U, float *out,
                                        ptrdiff_t ldo, const struct kn_cpu_q8_in *x, int t,
                                        const uint8_t *g, int B, int acc, const uint8_t *pfe) {
  const int three = kind == Q8K_Q3_K;
  const size_t gb = KN_X16_ROWS * kind_bytes(kind);
  const size_t sco = three ? 32 : 64, qso = three ? 736 : 320; /* the scales' and q's quads */
  struct q8_xt xt;
  xt_at(&xt, x, t, U, B);
  /* 8 rows to a register (AVX2), a few tokens: both halves of the rows of
   * each super-block in turn, in one sweep (x16_tile's reason) */
  const int HV = KN_X16_ROWS / Q8_TL > 1 && U <= Q8_HV_U;
  const int NS = HV ? 1 : KN_X16_ROWS / Q8_TL, NH = HV ? KN_X16_ROWS / Q8_TL : 1;
#pragma GCC unroll 2
  for (int hs = 0; hs < NS; hs++) { /* AVX2 without HV: rows 0..7, then 8..15 */
    q8vf fs[2][Q8_K16U];
#pragma GCC unroll 2
    for (int hh = 0; hh < NH; hh++)
      xt_zero(fs[hh], U);
    for (int s = 0; s < B / 8; s++) {
      const uint8_t *sb = g + (size_t)s * gb;
#pragma GCC unroll 2
      for (int hh = 0; hh < NH; hh++) {
        const int h = HV ? hh : hs;
        q8vf *f = fs[hh];
        const q8vf d = vf_h16(sb + 2 * Q8_TL * h),
                   ndm =
                       three ? vf_zero() : vf_mul(vf_h16(sb + 32 + 2 * Q8_TL * h), vf_set1(-1.0f));
        q8vi D[4]; /* (Q3_K's three, and the first of hmask's quads) */
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
          D[k] = vi_load(sb + sco + 64 * k + 4 * Q8_TL * h);
        if (U <= Q8_K16G) {
          k16_quads(kind, U, f, &xt, sb, gb, h, s, D, d, ndm, pfe);
          continue;
        }
#pragma GCC unroll 1
        for (int c = 0; c < 8; c++) {
          const int b = 8 * s + c;
          prefetch_part(sb, gb, c, 8, h == 0 ? pfe : NULL);
          q8vi a[Q8_K16U][2]; /* a token's halves */
#pragma GCC unroll 8
          for (int u = 0; u < U; u++) {
            int h0 = 0, h1 = 0;
            if (three) half_sums(xt.s[u] + (size_t)b * 8, &h0, &h1);
            a[u][0] = vi_set1_32(h0), a[u][1] = vi_set1_32(h1);
          }
          const uint8_t *qs = sb + qso + 512 * (c >> 2) + 4 * Q8_TL * h,
                        *hm = sb + 224 + 4 * Q8_TL * h;
#pragma GCC unroll 8
          for (int k = 0; k < 8; k++) {
            q8vi w = vi_and(vi_srl16(vi_load(qs + 64 * k), 2 * (c & 3)), vi_set1_8(3));
            if (three) { /* bit c of each hmask byte to bit 2 */
              const q8vi H = vi_load(hm + 64 * k);
              w = vi_or(w, vi_and(c >= 2 ? vi_srl16(H, c - 2) : vi_sll16(H, 2 - c), vi_set1_8(4)));
            }
#pragma GCC unroll 8
            for (int u = 0; u < U; u++)
              a[u][k >> 2] = vi_dot(a[u][k >> 2], w, vi_bcast4(xt.q[u] + 34 * (size_t)b + 4 * k));
          }
          const q8vi s0 = k16_sc(kind, D, 2 * c, 0), s1 = k16_sc(kind, D, 2 * c + 1, 0),
                     m0 = three ? vi_zero() : k16_sc(kind, D, 2 * c, 1),
                     m1 = three ? vi_zero() : k16_sc(kind, D, 2 * c + 1, 1);
#pragma GCC unroll 8
          for (int u = 0; u < U; u++) {
            const q8vi P = vi_add(vi_mullo(s0, a[u][0]), vi_mullo(s1, a[u][1]));
            const q8vf dxb = vf_set1(xt.d[u][b]);
            f[u] = vf_fma(vf_cvt(P), vf_mul(d, dxb), f[u]);
            if (!three) {
              int h0, h1;
              half_sums(xt.s[u] + (size_t)b * 8, &h0, &h1);
              const q8vi M = vi_add(vi_mullo(m0, vi_set1_32(h0)), vi_mullo(m1, vi_set1_32(h1)));
              f[u] = vf_fma(vf_cvt(M), vf_mul(ndm, dxb), f[u]);
            }
          }
        }
      }
    }
#pragma GCC unroll 2
    for (int hh = 0; hh < NH; hh++)
      xt_store(out, ldo, HV ? hh : hs, fs[hh], U, acc);
  }
}

/* Tokens t .. t1 against the X16 group of rows j at g (x16_tile's, Q8_XU
 * tokens at a time; the first sweep, t 0, asks for the weights up to end). */
Q8T_ATTR static inline AI void x16_tiles(const enum q8_kind kind, float *out, ptrdiff_t ldo,
                                         const struct kn_cpu_q8_in *x, int t, int t1, int j,
                                         const uint8_t *g, int B, int acc, const uint8_t *end) {
  for (; t < t1; t += Q8_XU) {
    float *o = out + (ptrdiff_t)t * ldo + j;
    const uint8_t *pfe = t == 0 ? end : NULL;
    switch (t1 - t < Q8_XU ? t1 - t : Q8_XU) {
    case 1: x16_tile(kind, 1, 1, o, ldo, x, t, g, B, acc, pfe); break;
    case 2: x16_tile(kind, 1, 2, o, ldo, x, t, g, B, acc, pfe); break;
    case 3: x16_tile(kind, 1, 3, o, ldo, x, t, g, B, acc, pfe); break;
#if Q8_XU == 8
    case 4: x16_tile(kind, 1, 4, o, ldo, x, t, g, B, acc, pfe); break;
    case 5: x16_tile(kind, 1, 5, o, ldo, x, t, g, B, acc, pfe); break;
    case 6: x16_tile(kind, 1, 6, o, ldo, x, t, g, B, acc, pfe); break;
    case 7: x16_tile(kind, 1, 7, o, ldo, x, t, g, B, acc, pfe); break;
    default: x16_tile(kind, 1, 8, o, ldo, x, t, g, B, acc, pfe); break;
#else
    default: x16_tile(kind, 1, 4, o, ldo, x, t, g, B, acc, pfe); break;
#endif
    }
  }
}

Q8T_ATTR static inline AI void int_dot(const enum q8_kind kind, const int il, float *out,
                                       ptrdiff_t ldo, const struct kn_cpu_q8_in *x,
                                       const uint8_t *w, size_t row_bytes, int K, int T, int n,
                                       int acc) {
  const int B = K / 32, ng = il ? n / KN_X16_ROWS * KN_X16_ROWS : 0; /* rows in X16 groups */
  const uint8_t *rp[8];
  if (kind_xi(kind) && x->xi && !il) { /* the rows as they are, at least KN_CPU_Q8_TOKENS tokens */
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
          tile_rows(rp, Q8_TR, w, row_bytes, j, 1, nr);
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
   * first sweep streams the weights from memory and asks for them ahead,
   * Q8_PREFETCH_BYTES past the unit's end too: what follows it in memory is
   * most often the same thread's next unit (the pool gives a thread adjacent
   * units) or the next matrix (prefetches never fault) */
  const uint8_t *end = w + (size_t)n * row_bytes + Q8_PREFETCH_BYTES;
  int TB = (int)(Q8_XTOK_BYTES / x->ldq) / Q8_XU * Q8_XU;
  if (TB < Q8_XU) TB = Q8_XU;
  if (ng) {
    const uint8_t *pf = w;
    prefetch_to(&pf, w + Q8_PREFETCH_BYTES, end);
  }
  for (int t0 = 0; t0 < T && ng; t0 += TB) {
    const int t1 = t0 + TB < T ? t0 + TB : T;
    for (int j = 0; j < ng; j += KN_X16_ROWS) {
      const uint8_t *g = w + (size_t)j * row_bytes;
      for (int t = t0; t < t1 && (kind == Q8K_Q4_K || kind == Q8K_Q5_K); t += Q8_KXU) {
        float *o = out + (ptrdiff_t)t * ldo + j;
        const uint8_t *pfe = t == 0 ? end : NULL;
        switch (t1 - t < Q8_KXU ? t1 - t : Q8_KXU) {
        case 1: kx16_tile(kind, 1, o, ldo, x, t, g, B, acc, pfe); break;
#if Q8_KXU == 4
        case 2: kx16_tile(kind, 2, o, ldo, x, t, g, B, acc, pfe); break;
        case 3: kx16_tile(kind, 3, o, ldo, x, t, g, B, acc, pfe); break;
        default: kx16_tile(kind, 4, o, ldo, x, t, g, B, acc, pfe); break;
#else
        default: kx16_tile(kind, 2, o, ldo, x, t, g, B, acc, pfe); break;
#endif
        }
      }
      for (int t = t0; t < t1 && kind == Q8K_Q6_K; t += Q8_6XU) {
        float *o = out + (ptrdiff_t)t * ldo + j;
        const uint8_t *pfe = t == 0 ? end : NULL;
        switch (t1 - t < Q8_6XU ? t1 - t : Q8_6XU) {
        case 1: q6x16_tile(1, o, ldo, x, t, g, B, acc, pfe); break;
        case 2: q6x16_tile(2, o, ldo, x, t, g, B, acc, pfe); break;
#if Q8_6XU == 3
        default: q6x16_tile(3, o, ldo, x, t, g, B, acc, pfe); break;
#endif
        }
      }
      for (int t = t0; t < t1 && kind_k16(kind); t += Q8_K16U) {
        float *o = out + (ptrdiff_t)t * ldo + j;
        const uint8_t *pfe = t == 0 ? end : NULL;
        switch (t1 - t < Q8_K16U ? t1 - t : Q8_K16U) {
        case 1: k16_tile(kind, 1, o, ldo, x, t, g, B, acc, pfe); break;
#if Q8_K16U == 6
        case 2: k16_tile(kind, 2, o, ldo, x, t, g, B, acc, pfe); break;
        case 3: k16_tile(kind, 3, o, ldo, x, t, g, B, acc, pfe); break;
        case 4: k16_tile(kind, 4, o, ldo, x, t, g, B, acc, pfe); break;
        case 5: k16_tile(kind, 5, o, ldo, x, t, g, B, acc, pfe); break;
        default: k16_tile(kind, 6, o, ldo, x, t, g, B, acc, pfe); break;
#else
        default: k16_tile(kind, 2, o, ldo, x, t, g, B, acc, pfe); break;
#endif
        }
      }
      if (kind >= Q8K_Q4_K) continue;
      /* two groups a tile where two are left: many tokens, Q8_X2U at a time,
       * or one or two against long rows; then the tokens past the last such
       * tile, group by group */
      const int G = Q8_X2U &&
                            (T >= Q8_XU || (T <= 2 && KN_X16_ROWS * row_bytes >= Q8_DEC2_BYTES)) &&
                            j + 2 * KN_X16_ROWS <= ng
                        ? 2
                        : 1;
      const int UG = T >= Q8_XU ? Q8_X2U : T;
      int t = t0;
      for (; G == 2 && t + UG <= t1; t += UG) {
        float *o = out + (ptrdiff_t)t * ldo + j;
        const uint8_t *pfe = t == 0 ? end : NULL;
        if (UG == 1) x16_tile(kind, 2, 1, o, ldo, x, t, g, B, acc, pfe);
        else if (UG == 2) x16_tile(kind, 2, 2, o, ldo, x, t, g, B, acc, pfe);
        else x16_tile(kind, 2, Q8_X2U, o, ldo, x, t, g, B, acc, pfe);
      }
      for (int i = 0; i < G; i++)
        x16_tiles(kind, out, ldo, x, t, t1, j + KN_X16_ROWS * i,
                  g + (size_t)KN_X16_ROWS * i * row_bytes, B, acc, end);
      j += KN_X16_ROWS * (G - 1);
    }
  }
  /* the rows as they are, a few tokens (or an X16 weight's last n % 16 rows):
   * tiles of 8 rows an eighth of them apart (rows ng + i + r * s), eight long
   * sequential streams that the hardware prefetcher follows, then the last
   * (n - ng) % 8 rows; each tile swept for every token */
  const int s = (n - ng) / 8;
  for (int i = 0; i < s || (i == s && (n - ng) % 8); i++) {
    const int j = i < s ? ng + i : ng + 8 * s, rs = i < s ? s : 1, nr = i < s ? 8 : n - j;
    tile_rows(rp, 8, w, row_bytes, j, rs, nr);
    for (int t = 0; t < T; t += Q8_RU) {
      float *o = out + (ptrdiff_t)t * ldo + j;
      switch (T - t < Q8_RU ? T - t : Q8_RU) {
      case 1: row_tile(kind, 1, o, ldo, rs, x, t, rp, nr, B, acc); break;
      case 2: row_tile(kind, 2, o, ldo, rs, x, t, rp, nr, B, acc); break;
      case 3: row_tile(kind, 3, o, ldo, rs, x, t, rp, nr, B, acc); break;
      default: row_tile(kind, 4, o, ldo, rs, x, t, rp, nr, B, acc); break;
      }
    }
  }
}

/* q8dot of each format, as rows (il 0) or in X16 groups (il 1). */
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
DEF_INT_DOT(q4_1, Q8K_Q4_1, 0)
DEF_INT_DOT(q5_1, Q8K_Q5_1, 0)
DEF_INT_DOT(q4_1x16, Q8K_Q4_1, 1)
DEF_INT_DOT(q5_1x16, Q8K_Q5_1, 1)
DEF_INT_DOT(q4_k, Q8K_Q4_K, 0)
DEF_INT_DOT(q4_kx16, Q8K_Q4_K, 1)
DEF_INT_DOT(q5_k, Q8K_Q5_K, 0)
DEF_INT_DOT(q5_kx16, Q8K_Q5_K, 1)
DEF_INT_DOT(q6_k, Q8K_Q6_K, 0)
DEF_INT_DOT(q6_kx16, Q8K_Q6_K, 1)
DEF_INT_DOT(iq4_nl, Q8K_IQ4_NL, 0)
DEF_INT_DOT(iq4_nlx16, Q8K_IQ4_NL, 1)
DEF_INT_DOT(iq4_xs, Q8K_IQ4_XS, 0)
DEF_INT_DOT(iq4_xsx16, Q8K_IQ4_XS, 1)
DEF_INT_DOT(q3_k, Q8K_Q3_K, 0)
DEF_INT_DOT(q3_kx16, Q8K_Q3_K, 1)
DEF_INT_DOT(q2_k, Q8K_Q2_K, 0)
DEF_INT_DOT(q2_kx16, Q8K_Q2_K, 1)

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
