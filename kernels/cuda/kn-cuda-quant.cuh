/* kn-cuda-quant.cuh — the decode of ggml's block formats (kn-quant.h) that
 * the device kernels of kn-cuda-quant.cu share: row_oct<DT>(row, o, v)
 * writes elements 8o .. 8o + 7 of a row of whole blocks with
 * kn_dequant_row's float operations in its order (each product and sum
 * rounded on its own: __fmul_rn, __fadd_rn, __fsub_rn on the device, so that
 * nvcc fuses no multiply-add the reference does not), so the values are its
 * bits. Host code can call it too (test-cuda-quant-decode checks it against
 * kn_dequant_row without a device; such a build takes -ffp-contract=off). */
#ifndef LMSERVE_KN_CUDA_QUANT_CUH
#define LMSERVE_KN_CUDA_QUANT_CUH
#include <stdint.h>

#include <cuda_fp16.h>

#include "kernels/kn-dtype.h"

#define KN_QHD __host__ __device__ __forceinline__
/* loops of 8 unrolled on the device (a host compiler knows no such pragma) */
#ifdef __CUDA_ARCH__
#define KN_QUNROLL _Pragma("unroll")
#else
#define KN_QUNROLL
#endif

/* Little-endian loads from blocks. Every format's block size is even and a
 * matrix starts at a multiple of 4 (the launchers check it; weights start
 * 64-byte aligned), so a block starts at an even address. Loads of 2 or 4
 * bytes, not bytes, are what lets the few-rows matmul keep up with the
 * memory. The host (test-cuda-quant-decode) runs the same word arithmetic. */
KN_QHD uint32_t q_ld16(const uint8_t *p) { /* p even */
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const unsigned short *>(p);
#else
  return (uint32_t)p[0] | (uint32_t)p[1] << 8;
#endif
}
KN_QHD uint32_t q_ld32(const uint8_t *p) { /* p a multiple of 4 */
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const uint32_t *>(p);
#else
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
#endif
}
/* The 8 bytes at p (p even) as two words, bytes 0..3 and 4..7: two aligned
 * words from p rounded down to a multiple of 4, then (p 2 past one) the 2
 * bytes after them, shifted into place. The first word may hold the 2 bytes
 * before p: they are in the same matrix, which starts at a multiple of 4
 * (Q6_K and Q3_K read from a block's first byte, so a block of theirs that
 * starts 2 past a multiple of 4, never the first, shows the end of the one
 * before). */
KN_QHD void q_ld64(const uint8_t *p, uint32_t w[2]) {
  const uint8_t *a = p - ((uintptr_t)p & 2u);
  const unsigned sh = (unsigned)((uintptr_t)p & 2u) * 8u;
  const uint32_t w0 = q_ld32(a), w1 = q_ld32(a + 4), w2 = sh ? q_ld16(a + 8) : 0u;
#ifdef __CUDA_ARCH__
  w[0] = __funnelshift_r(w0, w1, sh);
  w[1] = __funnelshift_r(w1, w2, sh);
#else
  w[0] = (uint32_t)(((uint64_t)w1 << 32 | w0) >> sh);
  w[1] = (uint32_t)(((uint64_t)w2 << 32 | w1) >> sh);
#endif
}
/* Byte i (0..7) of the 8 that q_ld64 loaded. */
KN_QHD uint32_t q_byte(const uint32_t w[2], int i) {
  return w[i >> 2] >> (8 * (i & 3)) & 0xFFu;
}

/* The f16 at p (p even), widened (exact). */
KN_QHD float q_f16(const uint8_t *p) {
  const unsigned short u = (unsigned short)q_ld16(p);
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(u));
#else
  return kn_f16_to_f32(u);
#endif
}

/* a * b, a + b, a - b, each rounded on its own (never fused into an fma). */
KN_QHD float q_mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b; /* host builds of this header take -ffp-contract=off */
#endif
}
KN_QHD float q_add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
KN_QHD float q_sub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

/* The formats the device decodes, X(dtype, elements a block, bytes a block):
 * the one list that qfmt and the launchers' dispatch (kn-cuda-quant.cu) take. */
#define KN_QFORMATS(X)                                                                             \
  X(KN_DTYPE_Q8_0, 32, 34)                                                                         \
  X(KN_DTYPE_Q4_0, 32, 18)                                                                         \
  X(KN_DTYPE_Q4_1, 32, 20)                                                                         \
  X(KN_DTYPE_Q5_0, 32, 22)                                                                         \
  X(KN_DTYPE_Q5_1, 32, 24)                                                                         \
  X(KN_DTYPE_Q4_K, 256, 144)                                                                       \
  X(KN_DTYPE_Q5_K, 256, 176)                                                                       \
  X(KN_DTYPE_Q6_K, 256, 210)                                                                       \
  X(KN_DTYPE_Q3_K, 256, 110)                                                                       \
  X(KN_DTYPE_IQ4_NL, 32, 18)                                                                       \
  X(KN_DTYPE_IQ4_XS, 256, 136)                                                                     \
  X(KN_DTYPE_Q2_K, 256, 84)

/* A format by its dtype; QK elements and BYTES bytes a block. */
template <int DT> struct qfmt;
#define KN_QFMT(dt, qk, bytes)                                                                     \
  template <> struct qfmt<dt> {                                                                    \
    enum { QK = qk, BYTES = bytes };                                                               \
  };
KN_QFORMATS(KN_QFMT)
#undef KN_QFMT

/* IQ4_NL's and IQ4_XS's level of nibble x (kn_iq4_levels), from the sixteen
 * int8 levels packed into two words (no table in memory on either side). */
KN_QHD float q_iq4_level(uint32_t x) {
  const unsigned long long lo = 0xF6EADDCFBFAD9881ull, hi = 0x7159453526190D01ull;
  return (float)(int8_t)(uint8_t)((x & 8u ? hi : lo) >> (8u * (x & 7u)));
}

/* Elements 8j .. 8j + 7 of the block at b into v. */
template <int DT> KN_QHD void oct(const uint8_t *b, int j, float v[8]) {
  const int e0 = 8 * j;
  uint32_t q[2];
  if (DT == KN_DTYPE_Q8_0) {
    float d = q_f16(b);
    q_ld64(b + 2 + e0, q);
    KN_QUNROLL
    for (int i = 0; i < 8; i++)
      v[i] = q_mul((float)(int8_t)q_byte(q, i), d);
  } else if (DT == KN_DTYPE_Q4_0 || DT == KN_DTYPE_Q4_1 || DT == KN_DTYPE_Q5_0 ||
             DT == KN_DTYPE_Q5_1) {
    /* 16 bytes of nibbles: elements 0..15 the low ones, 16..31 the high ones,
     * so octet j reads bytes 8 (j & 1) .. + 7, shifted by 4 (j >> 1) */
    const int m = DT == KN_DTYPE_Q4_1 || DT == KN_DTYPE_Q5_1,
              five = DT == KN_DTYPE_Q5_0 || DT == KN_DTYPE_Q5_1;
    float d = q_f16(b), mv = m ? q_f16(b + 2) : 0.0f;
    const uint8_t *h = b + (m ? 4 : 2); /* Q5's fifth bits: bit e, element e's */
    uint32_t qh = five ? q_ld16(h) | q_ld16(h + 2) << 16 : 0u;
    q_ld64(b + (m ? 4 : 2) + (five ? 4 : 0) + 8 * (j & 1), q);
    const int shift = 4 * (j >> 1);
    KN_QUNROLL
    for (int i = 0; i < 8; i++) {
      int x = (int)(q_byte(q, i) >> shift & 0xFu);
      if (five) x |= (int)((qh >> (e0 + i)) & 1u) << 4;
      const int off = five ? 16 : 8;
      v[i] = m ? q_add(q_mul((float)x, d), mv) : q_mul((float)(x - off), d);
    }
  } else if (DT == KN_DTYPE_Q4_K || DT == KN_DTYPE_Q5_K) {
    /* 64 elements per 32 bytes of q: sub-block s = e / 32 (its 6-bit scale
     * and min, in the 12 bytes at b + 4), low nibbles for even s, high for
     * odd; Q5_K's fifth bit of element e is bit s of qh[e % 32] */
    const int five = DT == KN_DTYPE_Q5_K, s = e0 / 32, l0 = e0 % 32;
    const uint8_t *sc = b + 4; /* two or three bytes of the twelve: loaded one by one */
    int scv, mnv;
    if (s < 4) {
      scv = sc[s] & 63;
      mnv = sc[s + 4] & 63;
    } else {
      scv = (sc[s + 4] & 0xF) | (sc[s - 4] >> 6) << 4;
      mnv = (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
    }
    float d1 = q_mul(q_f16(b), (float)scv), m1 = q_mul(q_f16(b + 2), (float)mnv);
    uint32_t qh[2] = {0u, 0u};
    q_ld64(b + (five ? 48 : 16) + 32 * (s / 2) + l0, q);
    if (five) q_ld64(b + 16 + l0, qh);
    KN_QUNROLL
    for (int i = 0; i < 8; i++) {
      int x = (int)(s & 1 ? q_byte(q, i) >> 4 : q_byte(q, i) & 0xFu);
      if (five) x += (q_byte(qh, i) >> s) & 1u ? 16 : 0;
      v[i] = q_sub(q_mul(d1, (float)x), m1);
    }
  } else if (DT == KN_DTYPE_IQ4_NL || DT == KN_DTYPE_IQ4_XS) {
    /* Q4_0's nibble order in each 32 elements (IQ4_NL's block; IQ4_XS's
     * sub-block s, its 16 bytes of q at b + 8 + 16 s, scale dl = d (sc - 32)) */
    const int xs = DT == KN_DTYPE_IQ4_XS, s = xs ? e0 / 32 : 0, jj = xs ? j % 4 : j;
    float dl = q_f16(b);
    if (xs) {
      const int sc = (int)((b[4 + s / 2] >> 4 * (s % 2)) & 0xFu) |
                     (int)((q_ld16(b + 2) >> 2 * s) & 3u) << 4;
      dl = q_mul(dl, (float)(sc - 32));
    }
    q_ld64(b + (xs ? 8 + 16 * s : 2) + 8 * (jj & 1), q);
    KN_QUNROLL
    for (int i = 0; i < 8; i++)
      v[i] = q_mul(dl, q_iq4_level(q_byte(q, i) >> 4 * (jj >> 1) & 0xFu));
  } else if (DT == KN_DTYPE_Q3_K || DT == KN_DTYPE_Q2_K) {
    /* chunk c of 32 elements: q's bytes 32 (c / 4) + l shifted right by
     * 2 (c % 4); Q3_K less 4 where bit c of hmask[l] is clear, times d times
     * its scale 2 c + l / 16 (6 bits in the 12 bytes at b + 96, less 32);
     * Q2_K times d times the scale byte's low nibble, less dmin times its high */
    const int three = DT == KN_DTYPE_Q3_K, c = e0 / 32, l0 = e0 % 32, is = 2 * c + l0 / 16;
    float dl, ml = 0.0f;
    if (three) {
      const int jj = is & 3, g = is >> 2;
      const int sc = (int)((b[96 + jj + 4 * (g & 1)] >> 4 * (g >> 1)) & 0xFu) |
                     (int)((b[104 + jj] >> 2 * g) & 3u) << 4;
      dl = q_mul(q_f16(b + 108), (float)(sc - 32));
    } else {
      const uint32_t sc = b[is];
      dl = q_mul(q_f16(b + 80), (float)(sc & 0xFu));
      ml = q_mul(q_f16(b + 82), (float)(sc >> 4));
    }
    uint32_t hm[2] = {0u, 0u};
    q_ld64(b + (three ? 32 : 16) + 32 * (c / 4) + l0, q);
    if (three) q_ld64(b + l0, hm);
    KN_QUNROLL
    for (int i = 0; i < 8; i++) {
      int x = (int)((q_byte(q, i) >> 2 * (c % 4)) & 3u);
      if (three) x -= (q_byte(hm, i) >> c) & 1u ? 0 : 4;
      v[i] = three ? q_mul(dl, (float)x) : q_sub(q_mul(dl, (float)x), ml);
    }
  } else { /* Q6_K */
    /* halves of 128 elements; in each, quarter g of 32: ql[l + 32 (g & 1)]'s
     * nibble g >> 1, qh[l]'s bits 2g, 2g + 1, scale (l / 16) + 2g */
    const int n = e0 / 128, g = (e0 % 128) / 32, l0 = e0 % 32;
    const float dsc = q_mul(q_f16(b + 208), (float)(int8_t)b[192 + 8 * n + l0 / 16 + 2 * g]);
    uint32_t qh[2];
    q_ld64(b + 64 * n + 32 * (g & 1) + l0, q);
    q_ld64(b + 128 + 32 * n + l0, qh);
    KN_QUNROLL
    for (int i = 0; i < 8; i++) {
      int x = (int)((q_byte(q, i) >> (4 * (g >> 1))) & 0xFu) |
              (int)((q_byte(qh, i) >> (2 * g)) & 3u) << 4;
      v[i] = q_mul(dsc, (float)(x - 32));
    }
  }
}

/* Element octet o of a row of whole blocks at row (o < K / 8). */
template <int DT> KN_QHD void row_oct(const uint8_t *row, int o, float v[8]) {
  constexpr int per = qfmt<DT>::QK / 8;
  oct<DT>(row + (size_t)(o / per) * qfmt<DT>::BYTES, o % per, v);
}

#endif
