/* kn-cpu-quant-avx512.c — the block formats' matvecs of kn-cpu-quant-avx2.c
 * (the exact mode: the f32 matvec's bits over the dequantized rows) with two
 * rows to a 512-bit register. Lanes 0..7 of a register are row A's 8-lane
 * accumulator and lanes 8..15 row B's, each input vector broadcast to both
 * halves, so every lane sees the AVX2 kernel's operations in its order: the
 * element dequantized with the reference's float operations (a scale times an
 * integer, then the offset), one fused multiply-add, k rising, then the fixed
 * lane reduction on each half. What the wider registers save is the
 * dequantization, the kernels' cost (BENCHMARKS, "GGUF decode in the exact
 * mode"): one operation widens, converts or scales 16 elements of two rows
 * instead of 8 of one, Q5's fifth bits come from a mask register instead
 * of shifts and compares, and a 4-bit integer's f32 value (Q4_0, Q4_1, Q4_K)
 * comes from one permutation of a constant table. */
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kn-cpu-avx2.h"
#include "kernels/cpu/kn-cpu-avx512.h"
#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/kn-quant.h"

#define KN_UNROLL4 _Pragma("GCC unroll 4")

/* a in lanes 0..7, b in lanes 8..15. */
KN_AVX512 static inline __m512 two(float a, float b) {
  return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1);
}

/* The f16 at a (lanes 0..7) and the one at b (lanes 8..15). */
KN_AVX512 static inline __m512 two_h16(const uint8_t *a, const uint8_t *b) {
  __m128 f = _mm_cvtph_ps(_mm_insert_epi16(_mm_cvtsi32_si128(kn_le16(a)), kn_le16(b), 1));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                               _mm512_castps128_ps512(f));
}

/* The f16 pairs (d, m) at a and at b: d in *d, m in *m, a's in lanes 0..7. */
KN_AVX512 static inline void two_h16x2(const uint8_t *a, const uint8_t *b, __m512 *d, __m512 *m) {
  __m128 f = _mm_cvtph_ps(
      _mm_unpacklo_epi32(_mm_cvtsi32_si128((int)kn_le32(a)), _mm_cvtsi32_si128((int)kn_le32(b))));
  __m512 f4 = _mm512_castps128_ps512(f);
  *d = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2), f4);
  *m = _mm512_permutexvar_ps(_mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3), f4);
}

/* The 16 bytes at a and at b, widened to 32 bits: lo = [a0..7 | b0..7],
 * hi = [a8..15 | b8..15] (sgn: sign-extended). */
KN_AVX512 static inline void bytes2(const uint8_t *a, const uint8_t *b, int sgn, __m512i *lo,
                                    __m512i *hi) {
  __m128i qa = _mm_loadu_si128((const __m128i *)a), qb = _mm_loadu_si128((const __m128i *)b);
  __m128i l = _mm_unpacklo_epi64(qa, qb), h = _mm_unpackhi_epi64(qa, qb);
  *lo = sgn ? _mm512_cvtepi8_epi32(l) : _mm512_cvtepu8_epi32(l);
  *hi = sgn ? _mm512_cvtepi8_epi32(h) : _mm512_cvtepu8_epi32(h);
}

/* The nibbles of 16 bytes of each row: vector i holds elements 8i .. 8i + 7
 * of both (elements 0..15 the low nibbles, 16..31 the high ones). */
KN_AVX512 static inline void nibbles2(const uint8_t *a, const uint8_t *b, __m512i *n) {
  const __m512i lo = _mm512_set1_epi32(0xF);
  __m512i x, y;
  bytes2(a, b, 0, &x, &y);
  n[0] = _mm512_and_si512(x, lo);
  n[1] = _mm512_and_si512(y, lo);
  n[2] = _mm512_srli_epi32(x, 4);
  n[3] = _mm512_srli_epi32(y, 4);
}

/* The nibbles of 16 bytes of each row as indices (bits 0..3; the bits above
 * are left as they are): vector i holds elements 8i .. 8i + 7 of both, as in
 * nibbles2. vpermps reads only an index's four low bits, so the low nibbles
 * need no mask. */
KN_AVX512 static inline void nibble_idx2(const uint8_t *a, const uint8_t *b, __m512i *n) {
  __m512i x, y;
  bytes2(a, b, 0, &x, &y);
  n[0] = x;
  n[1] = y;
  n[2] = _mm512_srli_epi32(x, 4);
  n[3] = _mm512_srli_epi32(y, 4);
}

/* The f32 values of the integers 0..15 (less `off`) by their low four bits of
 * each lane of n: one permutation in place of a mask, a subtraction and a
 * conversion, with the same values (exact integers). */
/* The f32 values of the integers 0..15 less off, a nibble's (nibble_f32's table). */
KN_AVX512 static inline __m512 nibble_table(int off) {
  return _mm512_sub_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                       _mm512_set1_ps((float)off));
}

KN_AVX512 static inline __m512 nibble_f32(__m512i n, int off) {
  return _mm512_permutexvar_ps(n, nibble_table(off));
}

/* The fifth bits (bit j of each row's qh for element j) as one 64-bit mask:
 * bits 16i .. 16i + 15 are vector i's lanes (row A's 8 then row B's 8). */
KN_AVX512 static inline uint64_t bit5_2(uint32_t qa, uint32_t qb) {
  return (uint64_t)_mm_cvtsi128_si64(
      _mm_unpacklo_epi8(_mm_cvtsi32_si128((int)qa), _mm_cvtsi32_si128((int)qb)));
}

/* Chunk c (elements 32c .. 32c + 31) of rows a and b, dequantized into v[4].
 * The K-quants keep their super-block's scales in st[64] (Q2_K its scales, then its mins) from its
 * first chunk on (chunks come in order); the other formats leave st alone. */
typedef void (*deq2_fn)(const uint8_t *a, const uint8_t *b, int c, __m512 *v, float *st);

KN_AVX512 static inline __attribute__((always_inline)) void
deq_q8_0(const uint8_t *ra, const uint8_t *rb, int c, __m512 *v, float *st) {
  const uint8_t *a = ra + (size_t)c * 34, *b = rb + (size_t)c * 34;
  __m512 d = two_h16(a, b);
  __m512i q[4];
  bytes2(a + 2, b + 2, 1, &q[0], &q[1]);
  bytes2(a + 18, b + 18, 1, &q[2], &q[3]);
  KN_UNROLL4
  for (int i = 0; i < 4; i++)
    v[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(q[i]), d);
}

/* Q4_0 and IQ4_NL: the value of each of a block's 32 nibbles (its table t
 * of 16 by permutation) times the block's d. */
KN_AVX512 static inline __attribute__((always_inline)) void
deq_nib4(const uint8_t *ra, const uint8_t *rb, int c, __m512 *v, __m512 t) {
  const uint8_t *a = ra + (size_t)c * 18, *b = rb + (size_t)c * 18;
  __m512 d = two_h16(a, b);
  __m512i n[4];
  nibble_idx2(a + 2, b + 2, n);
  KN_UNROLL4
  for (int i = 0; i < 4; i++)
    v[i] = _mm512_mul_ps(_mm512_permutexvar_ps(n[i], t), d);
}

/* IQ4_NL's and IQ4_XS's 16 levels as f32, a nibble's value. */
KN_AVX512 static inline __m512 iq4_table(void) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)kn_iq4_levels)));
}

KN_AVX512 static inline __attribute__((always_inline)) void
deq_q4_0(const uint8_t *ra, const uint8_t *rb, int c, __m512 *v, float *st) {
  deq_nib4(ra, rb, c, v, nibble_table(8));
}

KN_AVX512 static inline __attribute__((always_inline)) void
deq_q4_1(const uint8_t *ra, const uint8_t *rb, int c, __m512 *v, float *st) {
  const uint8_t *a = ra + (size_t)c * 20, *b = rb + (size_t)c * 20;
  __m512 d, m;
  two_h16x2(a, b, &d, &m);
  __m512i n[4];
  nibble_idx2(a + 4, b + 4, n);
  KN_UNROLL4
  for (int i = 0; i < 4; i++)
    v[i] = _mm512_add_ps(_mm512_mul_ps(nibble_f32(n[i], 0), d), m);
}

/* Q5_0's integer is (nibble | fifth bit << 4) - 16: the nibble less 16 where
 * the bit is clear, the nibble where it is set. */
KN_AVX512 static inline __attribute__((always_inline)) void
deq_q5_0(const uint8_t *ra, const uint8_t *rb, int c, __m512 *v, float *st) {
  const uint8_t *a = ra + (size_t)c * 22, *b = rb + (size_t)c * 22;
  __m512 d = two_h16(a, b);
  const uint64_t clear = ~bit5_2(kn_le32(a + 2), kn_le32(b + 2));
  __m512i n[4];
  nibbles2(a + 6, b + 6, n);
  KN_UNROLL4
  for (int i = 0; i < 4; i++) {
    __m512i q =
        _mm512_mask_sub_epi32(n[i], (__mmask16)(clear >> 16 * i), n[i], _mm512_set1_epi32(16));
    v[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(q), d);
  }
}

KN_AVX512 static inline __attribute__((always_inline)) void
deq_q5_1(const uint8_t *ra, const uint8_t *rb, int c, __m512 *v, float *st) {
  const uint8_t *a = ra + (size_t)c * 24, *b = rb + (size_t)c * 24;
  __m512 d, m;
  two_h16x2(a, b, &d, &m);
  const uint64_t set = bit5_2(kn_le32(a + 4), kn_le32(b + 4));
  __m512i n[4];
  nibbles2(a + 8, b + 8, n);
  KN_UNROLL4
  for (int i = 0; i < 4; i++) {
    __m512i q = _mm512_mask_or_epi32(n[i], (__mmask16)(set >> 16 * i), n[i], _mm512_set1_epi32(16));
    v[i] = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(q), d), m);
  }
}

/* Q4_K and Q5_K: chunk c % 8 of a 256-element super-block is the low (c even)
 * or high nibbles of its 32 bytes (c / 2), with pair c's scale and min. At a
 * super-block's first chunk, st gets its 8 scales d * sc (row a's, then row
 * b's) and its 8 mins dmin * mn (the same). */
KN_AVX512 static inline __attribute__((always_inline)) void
deq_k(const uint8_t *ra, const uint8_t *rb, int c, __m512 *v, float *st, int five) {
  const size_t bb = five ? 176 : 144;
  const uint8_t *a = ra + (size_t)(c >> 3) * bb, *b = rb + (size_t)(c >> 3) * bb;
  const int s = c & 7;
  if (s == 0) {
    kn_avx2_k_scales(a, st, st + 16);
    kn_avx2_k_scales(b, st + 8, st + 24);
  }
  __m512 d = two(st[s], st[8 + s]), m = two(st[16 + s], st[24 + s]);
  const size_t q = (five ? 48 : 16) + 32 * (size_t)(s >> 1);
  __m512i x[4];
  bytes2(a + q, b + q, 0, &x[0], &x[1]);
  bytes2(a + q + 16, b + q + 16, 0, &x[2], &x[3]);
  __mmask16 hb[4] = {0, 0, 0, 0};
  if (five) {
    const __m128i bit = _mm_set1_epi8((char)(1 << s));
    KN_UNROLL4
    for (int h = 0; h < 2; h++) {
      __m128i qa = _mm_loadu_si128((const __m128i *)(a + 16 + 16 * h));
      __m128i qb = _mm_loadu_si128((const __m128i *)(b + 16 + 16 * h));
      hb[2 * h] = _mm_test_epi8_mask(_mm_unpacklo_epi64(qa, qb), bit);
      hb[2 * h + 1] = _mm_test_epi8_mask(_mm_unpackhi_epi64(qa, qb), bit);
    }
  }
  KN_UNROLL4
  for (int i = 0; i < 4; i++) {
    if (!five) { /* Q4_K: the nibble's value by permutation */
      __m512i n = s & 1 ? _mm512_srli_epi32(x[i], 4) : x[i];
      v[i] = _mm512_sub_ps(_mm512_mul_ps(d, nibble_f32(n, 0)), m);
      continue;
    }
    __m512i n = s & 1 ? _mm512_srli_epi32(x[i], 4) : _mm512_and_si512(x[i], _mm512_set1_epi32(0xF));
    n = _mm512_mask_or_epi32(n, hb[i], n, _mm512_set1_epi32(16));
    v[i] = _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(n)), m);
  }
}

KN_AVX512 static inline __attribute__((always_inline)) void
deq_q4_k(const uint8_t *ra, const uint8_t *rb, int c, __m512 *v, float *st) {
  deq_k(ra, rb, c, v, st, 0);
}

KN_AVX512 static inline __attribute__((always_inline)) void
deq_q5_k(const uint8_t *ra, const uint8_t *rb, int c, __m512 *v, float *st) {
  deq_k(ra, rb, c, v, st, 1);
}

/* Q6_K: chunk c % 8 is part (c % 4) of half (c % 8) / 4 of the super-block;
 * vectors 0 and 1 take one 16-element scale, 2 and 3 the next. At a
 * super-block's first chunk, st gets its 16 scales d * sc (row a's, then row
 * b's). */
KN_AVX512 static inline __attribute__((always_inline)) void
deq_q6_k(const uint8_t *ra, const uint8_t *rb, int c, __m512 *v, float *st) {
  const uint8_t *a = ra + (size_t)(c >> 3) * 210, *b = rb + (size_t)(c >> 3) * 210;
  const int half = (c & 7) >> 2, p = c & 3;
  if ((c & 7) == 0) {
    kn_avx2_q6k_scales(a, st);
    kn_avx2_q6k_scales(b, st + 16);
  }
  const size_t ql = 64 * (size_t)half + (size_t)(p & 1) * 32, qh = 128 + 32 * (size_t)half;
  __m512i lo[4], hi[4];
  bytes2(a + ql, b + ql, 0, &lo[0], &lo[1]);
  bytes2(a + ql + 16, b + ql + 16, 0, &lo[2], &lo[3]);
  bytes2(a + qh, b + qh, 0, &hi[0], &hi[1]);
  bytes2(a + qh + 16, b + qh + 16, 0, &hi[2], &hi[3]);
  const __m128i sh = _mm_cvtsi32_si128(2 * p);
  const int k = 8 * half + 2 * p;
  const __m512 ds[2] = {two(st[k], st[16 + k]), two(st[k + 1], st[17 + k])};
  KN_UNROLL4
  for (int i = 0; i < 4; i++) {
    __m512i l =
        p >= 2 ? _mm512_srli_epi32(lo[i], 4) : _mm512_and_si512(lo[i], _mm512_set1_epi32(0xF));
    __m512i h = _mm512_and_si512(_mm512_srl_epi32(hi[i], sh), _mm512_set1_epi32(3));
    __m512i q =
        _mm512_sub_epi32(_mm512_or_si512(l, _mm512_slli_epi32(h, 4)), _mm512_set1_epi32(32));
    v[i] = _mm512_mul_ps(ds[i / 2], _mm512_cvtepi32_ps(q));
  }
}

/* The 2-bit fields 2 (s % 4) of the 32 bytes at offset q of rows a and b,
 * vector i elements 8i .. 8i + 7 of both (Q2_K's and Q3_K's chunk s). */
KN_AVX512 static inline void two_bits2(const uint8_t *a, const uint8_t *b, size_t q, int s,
                                       __m512i *l) {
  __m512i x[4];
  bytes2(a + q, b + q, 0, &x[0], &x[1]);
  bytes2(a + q + 16, b + q + 16, 0, &x[2], &x[3]);
  const __m128i sh = _mm_cvtsi32_si128(2 * (s & 3));
  KN_UNROLL4
  for (int i = 0; i < 4; i++)
    l[i] = _mm512_and_si512(_mm512_srl_epi32(x[i], sh), _mm512_set1_epi32(3));
}

/* Q3_K: chunk c % 8 is the 2-bit field 2 (c % 4) of the 32 bytes of half
 * (c % 8) / 4, less 4 where bit c % 8 of hmask's byte is clear; vectors 0 and
 * 1 take one 16-element scale, 2 and 3 the next. At a super-block's first
 * chunk, st gets its 16 scales d * (sc - 32) (row a's, then row b's). */
KN_AVX512 static inline __attribute__((always_inline)) void
deq_q3_k(const uint8_t *ra, const uint8_t *rb, int c, __m512 *v, float *st) {
  const uint8_t *a = ra + (size_t)(c >> 3) * 110, *b = rb + (size_t)(c >> 3) * 110;
  const int s = c & 7;
  if (s == 0) {
    int8_t sc[2][16];
    kn_q3k_scales(a + 96, sc[0]);
    kn_q3k_scales(b + 96, sc[1]);
    const float d[2] = {kn_le_f16(a + 108), kn_le_f16(b + 108)};
    for (int r = 0; r < 2; r++)
      for (int j = 0; j < 16; j++)
        st[16 * r + j] = d[r] * (float)sc[r][j];
  }
  __m512i l[4], h[4];
  two_bits2(a, b, 32 + 32 * (size_t)(s >> 2), s, l);
  bytes2(a, b, 0, &h[0], &h[1]);
  bytes2(a + 16, b + 16, 0, &h[2], &h[3]);
  const int k = 2 * s;
  const __m512 ds[2] = {two(st[k], st[16 + k]), two(st[k + 1], st[17 + k])};
  KN_UNROLL4
  for (int i = 0; i < 4; i++) {
    __mmask16 clear = _mm512_testn_epi32_mask(h[i], _mm512_set1_epi32(1 << s));
    __m512i q = _mm512_mask_sub_epi32(l[i], clear, l[i], _mm512_set1_epi32(4));
    v[i] = _mm512_mul_ps(ds[i / 2], _mm512_cvtepi32_ps(q));
  }
}

/* Q2_K: chunk c % 8 is the 2-bit field 2 (c % 4) of the 32 bytes of half
 * (c % 8) / 4; vectors 0 and 1 take one 16-element scale and min, 2 and 3 the
 * next. At a super-block's first chunk, st gets its 16 d * sc (row a's, then
 * row b's) and its 16 dmin * mn (the same, from st + 32). */
KN_AVX512 static inline __attribute__((always_inline)) void
deq_q2_k(const uint8_t *ra, const uint8_t *rb, int c, __m512 *v, float *st) {
  const uint8_t *a = ra + (size_t)(c >> 3) * 84, *b = rb + (size_t)(c >> 3) * 84;
  const int s = c & 7;
  if (s == 0) {
    const uint8_t *r2[2] = {a, b};
    for (int r = 0; r < 2; r++) {
      const float d = kn_le_f16(r2[r] + 80), dmin = kn_le_f16(r2[r] + 82);
      for (int j = 0; j < 16; j++) {
        st[16 * r + j] = d * (float)(r2[r][j] & 0xF);
        st[32 + 16 * r + j] = dmin * (float)(r2[r][j] >> 4);
      }
    }
  }
  __m512i l[4];
  two_bits2(a, b, 16 + 32 * (size_t)(s >> 2), s, l);
  const int k = 2 * s;
  const __m512 ds[2] = {two(st[k], st[16 + k]), two(st[k + 1], st[17 + k])};
  const __m512 ms[2] = {two(st[32 + k], st[48 + k]), two(st[33 + k], st[49 + k])};
  KN_UNROLL4
  for (int i = 0; i < 4; i++)
    v[i] = _mm512_sub_ps(_mm512_mul_ps(ds[i / 2], _mm512_cvtepi32_ps(l[i])), ms[i / 2]);
}

KN_AVX512 static inline __attribute__((always_inline)) void
deq_iq4_nl(const uint8_t *ra, const uint8_t *rb, int c, __m512 *v, float *st) {
  deq_nib4(ra, rb, c, v, iq4_table());
}

/* IQ4_XS: chunk c % 8 is sub-block c % 8, its scale d * (sc - 32). */
KN_AVX512 static inline __attribute__((always_inline)) void
deq_iq4_xs(const uint8_t *ra, const uint8_t *rb, int c, __m512 *v, float *st) {
  const uint8_t *a = ra + (size_t)(c >> 3) * 136, *b = rb + (size_t)(c >> 3) * 136;
  const int s = c & 7;
  __m512 d =
      two(kn_le_f16(a) * (float)kn_iq4xs_scale(a, s), kn_le_f16(b) * (float)kn_iq4xs_scale(b, s));
  __m512i n[4];
  nibble_idx2(a + 8 + 16 * s, b + 8 + 16 * s, n);
  const __m512 t = iq4_table();
  KN_UNROLL4
  for (int i = 0; i < 4; i++)
    v[i] = _mm512_mul_ps(_mm512_permutexvar_ps(n[i], t), d);
}

KN_AVX512 static inline void put1(float *o, float s, int acc) {
  *o = acc ? *o + s : s;
}

/* out[t, j] {=, +=} the dot products of n packed rows (row_bytes apart) with T
 * inputs: rows in fours (two registers of two), tokens in twos, as the AVX2
 * kernel; the rows past the last four go to it (tail). */
KN_AVX512 static inline __attribute__((always_inline)) void
qmatvec(deq2_fn deq, kn_cpu_dot_fn tail, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
        const uint8_t *w, size_t row_bytes, int K, int T, int n, int acc) {
  const int C = K / 32;
  const uint8_t *pf = w, *end = w + (size_t)n * row_bytes; /* pf: the first byte not asked for */
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    if (T <= 2) kn_avx2_qmv_prefetch(&pf, w + (size_t)(j + 4) * row_bytes, end);
    const uint8_t *r0 = w + (size_t)j * row_bytes, *r1 = r0 + row_bytes, *r2 = r1 + row_bytes,
                  *r3 = r2 + row_bytes;
    float st[2][64];
    int t = 0;
    for (; t + 2 <= T; t += 2) {
      const float *x = in + (ptrdiff_t)t * ldi, *y = x + ldi;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
      for (int c = 0; c < C; c++) {
        __m512 xv[4], yv[4], v[4];
        KN_UNROLL4
        for (int u = 0; u < 4; u++) {
          xv[u] = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + 32 * c + 8 * u));
          yv[u] = _mm512_broadcast_f32x8(_mm256_loadu_ps(y + 32 * c + 8 * u));
        }
        deq(r0, r1, c, v, st[0]);
        KN_UNROLL4
        for (int u = 0; u < 4; u++) {
          a0 = _mm512_fmadd_ps(v[u], xv[u], a0);
          b0 = _mm512_fmadd_ps(v[u], yv[u], b0);
        }
        deq(r2, r3, c, v, st[1]);
        KN_UNROLL4
        for (int u = 0; u < 4; u++) {
          a1 = _mm512_fmadd_ps(v[u], xv[u], a1);
          b1 = _mm512_fmadd_ps(v[u], yv[u], b1);
        }
      }
      kn_avx2_put_2x4(out + (ptrdiff_t)t * ldo + j, ldo, _mm512_castps512_ps256(a0),
                      _mm512_extractf32x8_ps(a0, 1), _mm512_castps512_ps256(a1),
                      _mm512_extractf32x8_ps(a1, 1), _mm512_castps512_ps256(b0),
                      _mm512_extractf32x8_ps(b0, 1), _mm512_castps512_ps256(b1),
                      _mm512_extractf32x8_ps(b1, 1), acc);
    }
    for (; t < T; t++) {
      const float *x = in + (ptrdiff_t)t * ldi;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0;
      for (int c = 0; c < C; c++) {
        __m512 xv[4], v[4];
        KN_UNROLL4
        for (int u = 0; u < 4; u++)
          xv[u] = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + 32 * c + 8 * u));
        deq(r0, r1, c, v, st[0]);
        KN_UNROLL4
        for (int u = 0; u < 4; u++)
          a0 = _mm512_fmadd_ps(v[u], xv[u], a0);
        deq(r2, r3, c, v, st[1]);
        KN_UNROLL4
        for (int u = 0; u < 4; u++)
          a1 = _mm512_fmadd_ps(v[u], xv[u], a1);
      }
      float *o = out + (ptrdiff_t)t * ldo + j;
      put1(o, kn_avx2_hsum(_mm512_castps512_ps256(a0)), acc);
      put1(o + 1, kn_avx2_hsum(_mm512_extractf32x8_ps(a0, 1)), acc);
      put1(o + 2, kn_avx2_hsum(_mm512_castps512_ps256(a1)), acc);
      put1(o + 3, kn_avx2_hsum(_mm512_extractf32x8_ps(a1, 1)), acc);
    }
  }
  if (j < n) tail(out + j, ldo, in, ldi, w + (size_t)j * row_bytes, K, T, n - j, acc);
}

#define DEF_QMV(SUF, DT)                                                                           \
  KN_AVX512 static void qmv_##SUF(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,       \
                                  const void *w, int K, int T, int n, int acc) {                   \
    qmatvec(deq_##SUF, kn_cpu_qmv_avx2[DT], out, ldo, in, ldi, w, kn_row_bytes(DT, (size_t)K), K,  \
            T, n, acc);                                                                            \
  }

KN_CPU_QMV_FORMATS(DEF_QMV)

void kn_cpu_dsp_init_quant_avx512(struct kn_cpu_dsp *dsp) {
#define QMV_SET(SUF, DT) dsp->matvec[DT] = qmv_##SUF;
  KN_CPU_QMV_FORMATS(QMV_SET)
#undef QMV_SET
}
