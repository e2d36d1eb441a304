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

/* The f16 at p (no alignment: blocks are bytes), widened (exact). */
KN_QHD float q_f16(const uint8_t *p) {
  const unsigned short u = (unsigned short)(p[0] | p[1] << 8);
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

/* The formats, by their dtype; QK elements and BYTES bytes a block. */
template <int DT> struct qfmt;

#define KN_QFMT(dt, qk, bytes)                                                                     \
  template <> struct qfmt<dt> {                                                                    \
    enum { QK = qk, BYTES = bytes };                                                               \
  }
KN_QFMT(KN_DTYPE_Q8_0, 32, 34);
KN_QFMT(KN_DTYPE_Q4_0, 32, 18);
KN_QFMT(KN_DTYPE_Q4_1, 32, 20);
KN_QFMT(KN_DTYPE_Q5_0, 32, 22);
KN_QFMT(KN_DTYPE_Q5_1, 32, 24);
KN_QFMT(KN_DTYPE_Q4_K, 256, 144);
KN_QFMT(KN_DTYPE_Q5_K, 256, 176);
KN_QFMT(KN_DTYPE_Q6_K, 256, 210);
#undef KN_QFMT

/* Q4_0 .. Q5_1: element e's 4 low bits (low nibbles hold 0..15, high ones 16..31). */
KN_QHD int q_nib32(const uint8_t *q, int e) {
  return e < 16 ? q[e] & 0xF : q[e - 16] >> 4;
}

/* Elements 8j .. 8j + 7 of the block at b into v. */
template <int DT> KN_QHD void oct(const uint8_t *b, int j, float v[8]) {
  const int e0 = 8 * j;
  if (DT == KN_DTYPE_Q8_0) {
    float d = q_f16(b);
    KN_QUNROLL
    for (int i = 0; i < 8; i++)
      v[i] = q_mul((float)(int8_t)b[2 + e0 + i], d);
  } else if (DT == KN_DTYPE_Q4_0) {
    float d = q_f16(b);
    KN_QUNROLL
    for (int i = 0; i < 8; i++)
      v[i] = q_mul((float)(q_nib32(b + 2, e0 + i) - 8), d);
  } else if (DT == KN_DTYPE_Q4_1) {
    float d = q_f16(b), m = q_f16(b + 2);
    KN_QUNROLL
    for (int i = 0; i < 8; i++)
      v[i] = q_add(q_mul((float)q_nib32(b + 4, e0 + i), d), m);
  } else if (DT == KN_DTYPE_Q5_0 || DT == KN_DTYPE_Q5_1) {
    const int one = DT == KN_DTYPE_Q5_1;
    float d = q_f16(b), m = one ? q_f16(b + 2) : 0.0f;
    const uint8_t *h = b + (one ? 4 : 2), *q = b + (one ? 8 : 6);
    uint32_t qh = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 |
                  (uint32_t)h[3] << 24; /* bit e: element e's fifth bit */
    KN_QUNROLL
    for (int i = 0; i < 8; i++) {
      int e = e0 + i, x = q_nib32(q, e) | (int)((qh >> e) & 1u) << 4;
      v[i] = one ? q_add(q_mul((float)x, d), m) : q_mul((float)(x - 16), d);
    }
  } else if (DT == KN_DTYPE_Q4_K || DT == KN_DTYPE_Q5_K) {
    /* 64 elements per 32 bytes of q: sub-block s = e / 32 (its 6-bit scale
     * and min), low nibbles for even s, high for odd; Q5_K's fifth bit of
     * element e is bit s of qh[e % 32] */
    const int five = DT == KN_DTYPE_Q5_K, s = e0 / 32, l0 = e0 % 32;
    const uint8_t *sc = b + 4, *qh = b + 16, *q = b + (five ? 48 : 16) + 32 * (s / 2);
    int scv, mnv;
    if (s < 4) {
      scv = sc[s] & 63;
      mnv = sc[s + 4] & 63;
    } else {
      scv = (sc[s + 4] & 0xF) | (sc[s - 4] >> 6) << 4;
      mnv = (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
    }
    float d1 = q_mul(q_f16(b), (float)scv), m1 = q_mul(q_f16(b + 2), (float)mnv);
    KN_QUNROLL
    for (int i = 0; i < 8; i++) {
      int l = l0 + i, x = (s & 1 ? q[l] >> 4 : q[l] & 0xF);
      if (five) x += (qh[l] >> s) & 1 ? 16 : 0;
      v[i] = q_sub(q_mul(d1, (float)x), m1);
    }
  } else { /* Q6_K */
    /* halves of 128 elements; in each, quarter g of 32: ql[l + 32 (g & 1)]'s
     * nibble g >> 1, qh[l]'s bits 2g, 2g + 1, scale (l / 16) + 2g */
    const int n = e0 / 128, g = (e0 % 128) / 32, l0 = e0 % 32;
    const uint8_t *ql = b + 64 * n + 32 * (g & 1), *qh = b + 128 + 32 * n;
    const float dsc = q_mul(q_f16(b + 208), (float)(int8_t)b[192 + 8 * n + l0 / 16 + 2 * g]);
    KN_QUNROLL
    for (int i = 0; i < 8; i++) {
      int l = l0 + i;
      int x = ((ql[l] >> (4 * (g >> 1))) & 0xF) | ((qh[l] >> (2 * g)) & 3) << 4;
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
