/* kn-quant.c — the block formats' reference dequantization and quantization
 * (kn-quant.h). Every product below is the one ggml's reference writes, in
 * its order, so a dequantized row has the bits ggml's has. */
#include "kernels/kn-quant.h"

#include <math.h>
#include <string.h>

#include "common/cm-err.h"

static float h(const uint8_t *p) {
  return kn_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

static void put_h(uint8_t *p, float v) {
  uint16_t u = kn_f32_to_f16(v);
  p[0] = (uint8_t)u;
  p[1] = (uint8_t)(u >> 8);
}

static uint32_t u32le(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The K-quants' j-th 6-bit (scale, min) pair of 8. */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *mn = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

static void block_q4_k(const uint8_t *b, float *y, int five) {
  float d = h(b), dmin = h(b + 2);
  const uint8_t *scales = b + 4, *qh = b + 16, *q = five ? b + 48 : b + 16;
  int is = 0;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0; j < 256; j += 64) {
    uint8_t sc, m;
    scale_min_k4(is, scales, &sc, &m);
    float d1 = d * sc, m1 = dmin * m;
    scale_min_k4(is + 1, scales, &sc, &m);
    float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; l++)
      *y++ = d1 * (float)((q[l] & 0xF) + (five && (qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; l++)
      *y++ = d2 * (float)((q[l] >> 4) + (five && (qh[l] & u2) ? 16 : 0)) - m2;
    q += 32;
    is += 2;
    u1 = (uint8_t)(u1 << 2);
    u2 = (uint8_t)(u2 << 2);
  }
}

static void block_q6_k(const uint8_t *b, float *y) {
  const uint8_t *ql = b, *qh = b + 128;
  const int8_t *sc = (const int8_t *)(b + 192);
  float d = h(b + 208);
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; l++) {
      int is = l / 16;
      int q1 = (int)((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4) - 32;
      int q2 = (int)((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32;
      int q3 = (int)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
      int q4 = (int)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
      y[l] = d * sc[is] * (float)q1;
      y[l + 32] = d * sc[is + 2] * (float)q2;
      y[l + 64] = d * sc[is + 4] * (float)q3;
      y[l + 96] = d * sc[is + 6] * (float)q4;
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

void kn_dequant_row(enum kn_dtype dt, const void *src, float *dst, size_t K) {
  const uint8_t *b = src;
  size_t be = (size_t)kn_block_elems(dt), bb = kn_block_bytes(dt);
  if (!be) {
    for (size_t i = 0; i < K; i++)
      dst[i] = kn_load_f32(src, dt, i);
    return;
  }
  for (size_t blk = 0; blk < K / be; blk++, b += bb, dst += be) {
    switch (dt) {
    case KN_DTYPE_Q8_0: {
      float d = h(b);
      for (int j = 0; j < 32; j++)
        dst[j] = (float)(int8_t)b[2 + j] * d;
      break;
    }
    case KN_DTYPE_Q4_0: {
      float d = h(b);
      for (int j = 0; j < 16; j++) {
        dst[j] = (float)((b[2 + j] & 0xF) - 8) * d;
        dst[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
      }
      break;
    }
    case KN_DTYPE_Q4_1: {
      float d = h(b), m = h(b + 2);
      for (int j = 0; j < 16; j++) {
        dst[j] = (float)(b[4 + j] & 0xF) * d + m;
        dst[j + 16] = (float)(b[4 + j] >> 4) * d + m;
      }
      break;
    }
    case KN_DTYPE_Q5_0:
    case KN_DTYPE_Q5_1: {
      int one = dt == KN_DTYPE_Q5_1;
      float d = h(b), m = one ? h(b + 2) : 0.0f;
      uint32_t qh = u32le(b + (one ? 4 : 2));
      const uint8_t *q = b + (one ? 8 : 6);
      for (int j = 0; j < 16; j++) {
        int x0 = (int)((q[j] & 0xF) | (((qh >> j) << 4) & 0x10));
        int x1 = (int)((q[j] >> 4) | ((qh >> (j + 12)) & 0x10));
        if (one) {
          dst[j] = (float)x0 * d + m;
          dst[j + 16] = (float)x1 * d + m;
        } else {
          dst[j] = (float)(x0 - 16) * d;
          dst[j + 16] = (float)(x1 - 16) * d;
        }
      }
      break;
    }
    case KN_DTYPE_Q4_K: block_q4_k(b, dst, 0); break;
    case KN_DTYPE_Q5_K: block_q4_k(b, dst, 1); break;
    case KN_DTYPE_Q6_K: block_q6_k(b, dst); break;
    default: break;
    }
  }
}

/* The element of largest magnitude (the first of equals), with its sign. */
static float signed_max(const float *x, int n, float *amax) {
  float big = 0.0f, v = 0.0f;
  for (int j = 0; j < n; j++)
    if (fabsf(x[j]) > big) {
      big = fabsf(x[j]);
      v = x[j];
    }
  *amax = big;
  return v;
}

static void min_max(const float *x, int n, float *lo, float *hi) {
  *lo = INFINITY;
  *hi = -INFINITY;
  for (int j = 0; j < n; j++) {
    *lo = x[j] < *lo ? x[j] : *lo;
    *hi = x[j] > *hi ? x[j] : *hi;
  }
}

static int min_int(int a, int b) {
  return a < b ? a : b;
}

int kn_quantize_row(enum kn_dtype dt, const float *x, void *dst, size_t K) {
  if (dt != KN_DTYPE_Q8_0 && dt != KN_DTYPE_Q4_0 && dt != KN_DTYPE_Q4_1 && dt != KN_DTYPE_Q5_0 &&
      dt != KN_DTYPE_Q5_1)
    return CM_ERR_UNSUPPORTED;
  if (K % 32) return CM_ERR_INVAL;
  uint8_t *b = dst;
  size_t bb = kn_block_bytes(dt);
  for (size_t blk = 0; blk < K / 32; blk++, b += bb, x += 32) {
    float amax, d, id, lo, hi;
    memset(b, 0, bb);
    switch (dt) {
    case KN_DTYPE_Q8_0:
      signed_max(x, 32, &amax);
      d = amax / 127.0f;
      id = d ? 1.0f / d : 0.0f;
      put_h(b, d);
      for (int j = 0; j < 32; j++)
        b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
      break;
    case KN_DTYPE_Q4_0:
    case KN_DTYPE_Q5_0: {
      int five = dt == KN_DTYPE_Q5_0;
      float max = signed_max(x, 32, &amax);
      d = max / (five ? -16.0f : -8.0f);
      id = d ? 1.0f / d : 0.0f;
      put_h(b, d);
      uint32_t qh = 0;
      uint8_t *q = b + (five ? 6 : 2);
      for (int j = 0; j < 16; j++) {
        float x0 = x[j] * id, x1 = x[16 + j] * id;
        int xi0 = min_int(five ? 31 : 15, (int8_t)(x0 + (five ? 16.5f : 8.5f)));
        int xi1 = min_int(five ? 31 : 15, (int8_t)(x1 + (five ? 16.5f : 8.5f)));
        q[j] = (uint8_t)((xi0 & 0xF) | ((xi1 & 0xF) << 4));
        qh |= (uint32_t)((xi0 & 0x10) >> 4) << j;
        qh |= (uint32_t)((xi1 & 0x10) >> 4) << (j + 16);
      }
      if (five)
        memcpy(
            b + 2,
            (uint8_t[4]){(uint8_t)qh, (uint8_t)(qh >> 8), (uint8_t)(qh >> 16), (uint8_t)(qh >> 24)},
            4);
      break;
    }
    case KN_DTYPE_Q4_1:
    case KN_DTYPE_Q5_1: {
      int five = dt == KN_DTYPE_Q5_1;
      min_max(x, 32, &lo, &hi);
      d = (hi - lo) / (five ? 31.0f : 15.0f);
      id = d ? 1.0f / d : 0.0f;
      put_h(b, d);
      put_h(b + 2, lo);
      uint32_t qh = 0;
      uint8_t *q = b + (five ? 8 : 4);
      for (int j = 0; j < 16; j++) {
        float x0 = (x[j] - lo) * id, x1 = (x[16 + j] - lo) * id;
        int xi0 = five ? (uint8_t)(x0 + 0.5f) : min_int(15, (int8_t)(x0 + 0.5f));
        int xi1 = five ? (uint8_t)(x1 + 0.5f) : min_int(15, (int8_t)(x1 + 0.5f));
        q[j] = (uint8_t)((xi0 & 0xF) | ((xi1 & 0xF) << 4));
        qh |= (uint32_t)((xi0 & 0x10) >> 4) << j;
        qh |= (uint32_t)((xi1 & 0x10) >> 4) << (j + 16);
      }
      if (five)
        memcpy(
            b + 4,
            (uint8_t[4]){(uint8_t)qh, (uint8_t)(qh >> 8), (uint8_t)(qh >> 16), (uint8_t)(qh >> 24)},
            4);
      break;
    }
    default: break;
    }
  }
  return 0;
}
