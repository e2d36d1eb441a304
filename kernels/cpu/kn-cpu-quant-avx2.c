/* kn-cpu-quant-avx2.c — matvecs over ggml's block formats (kernels/kn-quant.h)
 * with AVX2: each weight row is read once per call in its packed form, 32
 * elements at a time dequantized into four vectors with the reference's float
 * operations (kn_dequant_row: a scale times an integer, then the offset), and
 * those vectors go through the f32 matvec's fused multiply-adds in its order
 * (four rows, two tokens at a time, one 8-lane accumulator each, k rising,
 * the fixed lane reduction). So an output has the bits the f32 matvec gives
 * over the dequantized row, while only the packed bytes cross the memory bus.
 * The AVX-512 table runs the same bits two rows to a register
 * (kn-cpu-quant-avx512.c); the q8 mode's integer dot products are in
 * kn-cpu-q8-avx2.c. */
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kn-cpu-avx2.h"
#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/kn-quant.h"

/* Unrolled, so that the four vectors of a block and the four rows' accumulators
 * stay in registers (at -O2 the loops run as written, through memory). */
#define KN_UNROLL4 _Pragma("GCC unroll 4")

/* The f16 at p by F16C (the value kn_le_f16 gives). */
KN_AVX2 static inline float h16(const uint8_t *p) {
  return _cvtsh_ss(kn_le16(p));
}

/* 8 bytes as 8 int32 lanes. */
KN_AVX2 static inline __m256i u8x8(const uint8_t *p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

/* d * (float)q (the product rounded once, as the reference's). */
KN_AVX2 static inline __m256 scaled(__m256i q, __m256 d) {
  return _mm256_mul_ps(_mm256_cvtepi32_ps(q), d);
}

/* d * (float)q + m: the product and the sum each rounded, no fused multiply-add. */
KN_AVX2 static inline __m256 scaled_off(__m256i q, __m256 d, __m256 m) {
  return _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), d), m);
}

/* Chunk c (elements 32c .. 32c + 31) of a row, dequantized into v[4]. The
 * K-quants keep their super-block's scales in st[32] (Q2_K its 16 scales, then its 16 mins) from
 * its first chunk on (chunks come in order); the other formats leave st alone. */
typedef void (*deq32_fn)(const uint8_t *row, int c, __m256 *v, float *st);

KN_AVX2 static inline __attribute__((always_inline)) void deq_q8_0(const uint8_t *row, int c,
                                                                   __m256 *v, float *st) {
  const uint8_t *b = row + (size_t)c * 34;
  __m256 d = _mm256_set1_ps(h16(b));
  KN_UNROLL4
  for (int i = 0; i < 4; i++)
    v[i] = scaled(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * i))), d);
}

/* The nibbles of 16 bytes q: elements 0..15 the low ones, 16..31 the high ones. */
KN_AVX2 static inline void nibbles(const uint8_t *q, __m256i *n) {
  const __m256i lo = _mm256_set1_epi32(0xF);
  __m256i a = u8x8(q), b = u8x8(q + 8);
  n[0] = _mm256_and_si256(a, lo);
  n[1] = _mm256_and_si256(b, lo);
  n[2] = _mm256_srli_epi32(a, 4);
  n[3] = _mm256_srli_epi32(b, 4);
}

KN_AVX2 static inline __attribute__((always_inline)) void deq_q4_0(const uint8_t *row, int c,
                                                                   __m256 *v, float *st) {
  const uint8_t *b = row + (size_t)c * 18;
  __m256 d = _mm256_set1_ps(h16(b));
  __m256i n[4];
  nibbles(b + 2, n);
  KN_UNROLL4
  for (int i = 0; i < 4; i++)
    v[i] = scaled(_mm256_sub_epi32(n[i], _mm256_set1_epi32(8)), d);
}

KN_AVX2 static inline __attribute__((always_inline)) void deq_q4_1(const uint8_t *row, int c,
                                                                   __m256 *v, float *st) {
  const uint8_t *b = row + (size_t)c * 20;
  __m256 d = _mm256_set1_ps(h16(b)), m = _mm256_set1_ps(h16(b + 2));
  __m256i n[4];
  nibbles(b + 4, n);
  KN_UNROLL4
  for (int i = 0; i < 4; i++)
    v[i] = scaled_off(n[i], d, m);
}

/* The integers of a Q5 block as 32 bytes (element j at byte j): the nibbles
 * of its 16 bytes q (elements 0..15 the low ones, 16..31 the high ones), 16
 * added where bit j of qh is set, less sub. */
KN_AVX2 static inline __m256i q5_bytes(const uint8_t *q, uint32_t qh, int sub) {
  const __m128i lo4 = _mm_set1_epi8(0xF), x = _mm_loadu_si128((const __m128i *)q);
  const __m256i n =
      _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), lo4), _mm_and_si128(x, lo4));
  /* byte j takes qh's byte j / 8, then tests its bit j % 8 */
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
  h = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit), _mm256_set1_epi8(16));
  return _mm256_sub_epi8(_mm256_or_si256(n, h), _mm256_set1_epi8((char)sub));
}

/* Bytes 8i .. 8i + 7 of y, sign-extended to 8 lanes. */
KN_AVX2 static inline __m256i i8x8_of(__m256i y, int i) {
  __m128i h = i < 2 ? _mm256_castsi256_si128(y) : _mm256_extracti128_si256(y, 1);
  return _mm256_cvtepi8_epi32(i & 1 ? _mm_unpackhi_epi64(h, h) : h);
}

KN_AVX2 static inline __attribute__((always_inline)) void deq_q5_0(const uint8_t *row, int c,
                                                                   __m256 *v, float *st) {
  const uint8_t *b = row + (size_t)c * 22;
  __m256 d = _mm256_set1_ps(h16(b));
  __m256i q = q5_bytes(b + 6, kn_le32(b + 2), 16);
  KN_UNROLL4
  for (int i = 0; i < 4; i++)
    v[i] = scaled(i8x8_of(q, i), d);
}

KN_AVX2 static inline __attribute__((always_inline)) void deq_q5_1(const uint8_t *row, int c,
                                                                   __m256 *v, float *st) {
  const uint8_t *b = row + (size_t)c * 24;
  __m256 d = _mm256_set1_ps(h16(b)), m = _mm256_set1_ps(h16(b + 2));
  __m256i q = q5_bytes(b + 8, kn_le32(b + 4), 0);
  KN_UNROLL4
  for (int i = 0; i < 4; i++)
    v[i] = scaled_off(i8x8_of(q, i), d, m);
}

/* Q4_K and Q5_K: chunk c % 8 of a 256-element super-block is the low (c even)
 * or high nibbles of its 32 bytes (c / 2), with pair c's scale and min (st[c
 * % 8] and st[8 + c % 8], from the super-block's first chunk on). */
KN_AVX2 static inline __attribute__((always_inline)) void deq_k(const uint8_t *row, int c,
                                                                __m256 *v, float *st, int five) {
  const uint8_t *b = row + (size_t)(c >> 3) * (five ? 176 : 144);
  int s = c & 7;
  if (s == 0) kn_avx2_k_scales(b, st, st + 8);
  __m256 d = _mm256_set1_ps(st[s]), m = _mm256_set1_ps(st[8 + s]);
  const uint8_t *q = b + (five ? 48 : 16) + 32 * (s >> 1), *qh = b + 16;
  KN_UNROLL4
  for (int i = 0; i < 4; i++) {
    __m256i x = u8x8(q + 8 * i);
    x = s & 1 ? _mm256_srli_epi32(x, 4) : _mm256_and_si256(x, _mm256_set1_epi32(0xF));
    if (five) {
      __m256i hb = _mm256_and_si256(u8x8(qh + 8 * i), _mm256_set1_epi32(1 << s));
      x = _mm256_add_epi32(x, _mm256_and_si256(_mm256_cmpgt_epi32(hb, _mm256_setzero_si256()),
                                               _mm256_set1_epi32(16)));
    }
    v[i] = _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(x)), m);
  }
}

KN_AVX2 static inline __attribute__((always_inline)) void deq_q4_k(const uint8_t *row, int c,
                                                                   __m256 *v, float *st) {
  deq_k(row, c, v, st, 0);
}

KN_AVX2 static inline __attribute__((always_inline)) void deq_q5_k(const uint8_t *row, int c,
                                                                   __m256 *v, float *st) {
  deq_k(row, c, v, st, 1);
}

/* Q6_K: chunk c % 8 is part (c % 4) of half (c % 8) / 4 of the super-block,
 * its scales st[16] from the super-block's first chunk on. */
KN_AVX2 static inline __attribute__((always_inline)) void deq_q6_k(const uint8_t *row, int c,
                                                                   __m256 *v, float *st) {
  const uint8_t *b = row + (size_t)(c >> 3) * 210;
  int half = (c & 7) >> 2, p = c & 3;
  if ((c & 7) == 0) kn_avx2_q6k_scales(b, st);
  const uint8_t *ql = b + 64 * half + (p & 1) * 32, *qh = b + 128 + 32 * half;
  KN_UNROLL4
  for (int i = 0; i < 4; i++) {
    __m256i lo = u8x8(ql + 8 * i);
    lo = p >= 2 ? _mm256_srli_epi32(lo, 4) : _mm256_and_si256(lo, _mm256_set1_epi32(0xF));
    __m256i hi = _mm256_and_si256(_mm256_srli_epi32(u8x8(qh + 8 * i), 2 * p), _mm256_set1_epi32(3));
    __m256i q =
        _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
    v[i] = _mm256_mul_ps(_mm256_set1_ps(st[8 * half + i / 2 + 2 * p]), _mm256_cvtepi32_ps(q));
  }
}

/* The 2-bit field 2 (s % 4) of the 8 bytes at q as 8 int32 lanes (Q2_K's and
 * Q3_K's chunk s). */
KN_AVX2 static inline __m256i two_bits(const uint8_t *q, int s) {
  return _mm256_and_si256(_mm256_srl_epi32(u8x8(q), _mm_cvtsi32_si128(2 * (s & 3))),
                          _mm256_set1_epi32(3));
}

/* Q3_K: chunk c % 8 is the 2-bit field 2 (c % 4) of the 32 bytes of half
 * (c % 8) / 4, less 4 where bit c % 8 of hmask's byte is clear; vectors 0 and
 * 1 take one 16-element scale, 2 and 3 the next, st[16] the super-block's d *
 * (sc - 32) from its first chunk on. */
KN_AVX2 static inline __attribute__((always_inline)) void deq_q3_k(const uint8_t *row, int c,
                                                                   __m256 *v, float *st) {
  const uint8_t *b = row + (size_t)(c >> 3) * 110;
  const int s = c & 7;
  if (s == 0) {
    int8_t sc[16];
    kn_q3k_scales(b + 96, sc);
    const float d = h16(b + 108);
    for (int j = 0; j < 16; j++)
      st[j] = d * (float)sc[j];
  }
  const uint8_t *q = b + 32 + 32 * (s >> 2);
  KN_UNROLL4
  for (int i = 0; i < 4; i++) {
    __m256i x = two_bits(q + 8 * i, s);
    __m256i clear = _mm256_cmpeq_epi32(_mm256_and_si256(u8x8(b + 8 * i), _mm256_set1_epi32(1 << s)),
                                       _mm256_setzero_si256());
    x = _mm256_sub_epi32(x, _mm256_and_si256(clear, _mm256_set1_epi32(4)));
    v[i] = _mm256_mul_ps(_mm256_set1_ps(st[2 * s + i / 2]), _mm256_cvtepi32_ps(x));
  }
}

/* Q2_K: chunk c % 8 is the 2-bit field 2 (c % 4) of the 32 bytes of half
 * (c % 8) / 4; vectors 0 and 1 take one 16-element scale and min, 2 and 3 the
 * next, st[32] the super-block's d * sc and dmin * mn from its first chunk on. */
KN_AVX2 static inline __attribute__((always_inline)) void deq_q2_k(const uint8_t *row, int c,
                                                                   __m256 *v, float *st) {
  const uint8_t *b = row + (size_t)(c >> 3) * 84;
  const int s = c & 7;
  if (s == 0) {
    const float d = h16(b + 80), dmin = h16(b + 82);
    for (int j = 0; j < 16; j++) {
      st[j] = d * (float)(b[j] & 0xF);
      st[16 + j] = dmin * (float)(b[j] >> 4);
    }
  }
  const uint8_t *q = b + 16 + 32 * (s >> 2);
  KN_UNROLL4
  for (int i = 0; i < 4; i++) {
    __m256i x = two_bits(q + 8 * i, s);
    const int j = 2 * s + i / 2;
    v[i] = _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(st[j]), _mm256_cvtepi32_ps(x)),
                         _mm256_set1_ps(st[16 + j]));
  }
}

/* The IQ4 levels of the 16 bytes q (elements 0..15 the low nibbles, 16..31
 * the high ones) as 32 signed bytes. */
KN_AVX2 static inline __m256i iq4_bytes(const uint8_t *q) {
  const __m128i lut = _mm_loadu_si128((const __m128i *)kn_iq4_levels), lo4 = _mm_set1_epi8(0xF);
  const __m128i x = _mm_loadu_si128((const __m128i *)q);
  return _mm256_set_m128i(_mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(x, 4), lo4)),
                          _mm_shuffle_epi8(lut, _mm_and_si128(x, lo4)));
}

KN_AVX2 static inline __attribute__((always_inline)) void deq_iq4_nl(const uint8_t *row, int c,
                                                                     __m256 *v, float *st) {
  const uint8_t *b = row + (size_t)c * 18;
  __m256 d = _mm256_set1_ps(h16(b));
  __m256i q = iq4_bytes(b + 2);
  KN_UNROLL4
  for (int i = 0; i < 4; i++)
    v[i] = scaled(i8x8_of(q, i), d);
}

/* IQ4_XS: chunk c % 8 is sub-block c % 8, its scale d * (sc - 32). */
KN_AVX2 static inline __attribute__((always_inline)) void deq_iq4_xs(const uint8_t *row, int c,
                                                                     __m256 *v, float *st) {
  const uint8_t *b = row + (size_t)(c >> 3) * 136;
  const int s = c & 7;
  __m256 d = _mm256_set1_ps(h16(b) * (float)kn_iq4xs_scale(b, s));
  __m256i q = iq4_bytes(b + 8 + 16 * s);
  KN_UNROLL4
  for (int i = 0; i < 4; i++)
    v[i] = scaled(i8x8_of(q, i), d);
}

KN_AVX2 static inline void put1(float *o, float s, int acc) {
  *o = acc ? *o + s : s;
}

/* out[t, j] {=, +=} the dot products of n packed rows (row_bytes apart) with T
 * inputs, as the AVX2 f32 matvec computes them over the dequantized rows. Inlined
 * into each format's wrapper, so that its deq is too (one indirect call a block
 * otherwise, and the four vectors through memory). */
KN_AVX2 static inline __attribute__((always_inline)) void
qmatvec(deq32_fn deq, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi, const uint8_t *w,
        size_t row_bytes, int K, int T, int n, int acc) {
  const int C = K / 32;
  const uint8_t *pf = w, *end = w + (size_t)n * row_bytes; /* pf: the first byte not asked for */
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    if (T <= 2) kn_avx2_qmv_prefetch(&pf, w + (size_t)(j + 4) * row_bytes, end);
    const uint8_t *r[4];
    float st[4][32];
    KN_UNROLL4
    for (int i = 0; i < 4; i++)
      r[i] = w + (size_t)(j + i) * row_bytes;
    int t = 0;
    for (; t + 2 <= T; t += 2) {
      const float *x = in + (ptrdiff_t)t * ldi, *y = x + ldi;
      __m256 a[4], b[4];
      KN_UNROLL4
      for (int i = 0; i < 4; i++)
        a[i] = b[i] = _mm256_setzero_ps();
      for (int c = 0; c < C; c++)
        KN_UNROLL4
      for (int i = 0; i < 4; i++) {
        __m256 v[4];
        deq(r[i], c, v, st[i]);
        KN_UNROLL4
        for (int u = 0; u < 4; u++) {
          a[i] = _mm256_fmadd_ps(v[u], _mm256_loadu_ps(x + 32 * c + 8 * u), a[i]);
          b[i] = _mm256_fmadd_ps(v[u], _mm256_loadu_ps(y + 32 * c + 8 * u), b[i]);
        }
      }
      kn_avx2_put_2x4(out + (ptrdiff_t)t * ldo + j, ldo, a[0], a[1], a[2], a[3], b[0], b[1], b[2],
                      b[3], acc);
    }
    for (; t < T; t++) {
      const float *x = in + (ptrdiff_t)t * ldi;
      __m256 a[4];
      KN_UNROLL4
      for (int i = 0; i < 4; i++)
        a[i] = _mm256_setzero_ps();
      for (int c = 0; c < C; c++)
        KN_UNROLL4
      for (int i = 0; i < 4; i++) {
        __m256 v[4];
        deq(r[i], c, v, st[i]);
        KN_UNROLL4
        for (int u = 0; u < 4; u++)
          a[i] = _mm256_fmadd_ps(v[u], _mm256_loadu_ps(x + 32 * c + 8 * u), a[i]);
      }
      float *o = out + (ptrdiff_t)t * ldo + j;
      KN_UNROLL4
      for (int i = 0; i < 4; i++)
        put1(o + i, kn_avx2_hsum(a[i]), acc);
    }
  }
  for (; j < n; j++) {
    const uint8_t *r0 = w + (size_t)j * row_bytes;
    float st[1][32];
    for (int t = 0; t < T; t++) {
      const float *x = in + (ptrdiff_t)t * ldi;
      __m256 a0 = _mm256_setzero_ps();
      for (int c = 0; c < C; c++) {
        __m256 v[4];
        deq(r0, c, v, st[0]);
        KN_UNROLL4
        for (int u = 0; u < 4; u++)
          a0 = _mm256_fmadd_ps(v[u], _mm256_loadu_ps(x + 32 * c + 8 * u), a0);
      }
      put1(out + (ptrdiff_t)t * ldo + j, kn_avx2_hsum(a0), acc);
    }
  }
}

#define DEF_QMV(SUF, DT)                                                                           \
  KN_AVX2 static void qmv_##SUF(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,         \
                                const void *w, int K, int T, int n, int acc) {                     \
    qmatvec(deq_##SUF, out, ldo, in, ldi, w, kn_row_bytes(DT, (size_t)K), K, T, n, acc);           \
  }

KN_CPU_QMV_FORMATS(DEF_QMV)

/* n rows of K elements as f32 rows K apart at dst, with the matvecs' values
 * (the prefill tiles' weights). */
#define DEF_DEQ_ROWS(SUF, DT)                                                                      \
  KN_AVX2 static void deq_rows_##SUF(float *dst, const void *w, int K, int n) {                    \
    const size_t rb = kn_row_bytes(DT, (size_t)K);                                                 \
    float st[32];                                                                                  \
    for (int j = 0; j < n; j++) {                                                                  \
      const uint8_t *r = (const uint8_t *)w + (size_t)j * rb;                                      \
      float *o = dst + (size_t)j * (size_t)K;                                                      \
      for (int c = 0; c < K / 32; c++) {                                                           \
        __m256 v[4];                                                                               \
        deq_##SUF(r, c, v, st);                                                                    \
        KN_UNROLL4                                                                                 \
        for (int u = 0; u < 4; u++)                                                                \
          _mm256_storeu_ps(o + 32 * c + 8 * u, v[u]);                                              \
      }                                                                                            \
    }                                                                                              \
  }

KN_CPU_QMV_FORMATS(DEF_DEQ_ROWS)

#define QMV_ENTRY(SUF, DT) [DT] = qmv_##SUF,
const kn_cpu_dot_fn kn_cpu_qmv_avx2[KN_DTYPE__COUNT] = {KN_CPU_QMV_FORMATS(QMV_ENTRY)};

void kn_cpu_dsp_init_quant_avx2(struct kn_cpu_dsp *dsp) {
  for (int d = 0; d < KN_DTYPE__COUNT; d++)
    if (kn_cpu_qmv_avx2[d]) dsp->matvec[d] = kn_cpu_qmv_avx2[d];
#define DEQ_SET(SUF, DT) dsp->deq_rows[DT] = deq_rows_##SUF;
  KN_CPU_QMV_FORMATS(DEQ_SET)
#undef DEQ_SET
}
