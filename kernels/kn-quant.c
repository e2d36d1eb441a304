/* kn-quant.c — the block formats' reference dequantization and quantization
 * (kn-quant.h). Every product below is the one ggml's reference writes, in
 * its order, so a dequantized row has the bits ggml's has. */
#include "kernels/kn-quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"

static void put_h(uint8_t *p, float v) {
  uint16_t u = kn_f32_to_f16(v);
  p[0] = (uint8_t)u;
  p[1] = (uint8_t)(u >> 8);
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
  float d = kn_le_f16(b), dmin = kn_le_f16(b + 2);
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
  float d = kn_le_f16(b + 208);
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

const int8_t kn_iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                  1,    13,   25,  38,  53,  69,  89,  113};

/* Q3_K's super-block at b (kn-quant.h's layout). */
static void block_q3_k(const uint8_t *b, float *y) {
  int8_t sc[16];
  kn_q3k_scales(b + 96, sc);
  const float d = kn_le_f16(b + 108);
  for (int c = 0; c < 8; c++) {
    const uint8_t *q = b + 32 + 32 * (c / 4);
    for (int k = 0; k < 2; k++) {
      const float dl = d * (float)sc[2 * c + k];
      for (int l = 16 * k; l < 16 * k + 16; l++)
        y[32 * c + l] = dl * (float)(((q[l] >> 2 * (c % 4)) & 3) - (b[l] >> c & 1 ? 0 : 4));
    }
  }
}

/* Q2_K's super-block at b (kn-quant.h's layout). */
static void block_q2_k(const uint8_t *b, float *y) {
  const float d = kn_le_f16(b + 80), dmin = kn_le_f16(b + 82);
  for (int c = 0; c < 8; c++) {
    const uint8_t *q = b + 16 + 32 * (c / 4);
    for (int k = 0; k < 2; k++) {
      const int sc = b[2 * c + k];
      const float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
      for (int l = 16 * k; l < 16 * k + 16; l++)
        y[32 * c + l] = dl * (float)((q[l] >> 2 * (c % 4)) & 3) - ml;
    }
  }
}

/* 32 IQ4 levels of the 16 bytes q (Q4_0's nibble order) times dl. */
static void iq4_levels(const uint8_t *q, float dl, float *y) {
  for (int j = 0; j < 16; j++) {
    y[j] = dl * (float)kn_iq4_levels[q[j] & 0xF];
    y[j + 16] = dl * (float)kn_iq4_levels[q[j] >> 4];
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
      float d = kn_le_f16(b);
      for (int j = 0; j < 32; j++)
        dst[j] = (float)(int8_t)b[2 + j] * d;
      break;
    }
    case KN_DTYPE_Q4_0: {
      float d = kn_le_f16(b);
      for (int j = 0; j < 16; j++) {
        dst[j] = (float)((b[2 + j] & 0xF) - 8) * d;
        dst[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
      }
      break;
    }
    case KN_DTYPE_Q4_1: {
      float d = kn_le_f16(b), m = kn_le_f16(b + 2);
      for (int j = 0; j < 16; j++) {
        dst[j] = (float)(b[4 + j] & 0xF) * d + m;
        dst[j + 16] = (float)(b[4 + j] >> 4) * d + m;
      }
      break;
    }
    case KN_DTYPE_Q5_0:
    case KN_DTYPE_Q5_1: {
      int one = dt == KN_DTYPE_Q5_1;
      float d = kn_le_f16(b), m = one ? kn_le_f16(b + 2) : 0.0f;
      uint32_t qh = kn_le32(b + (one ? 4 : 2));
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
    case KN_DTYPE_Q3_K: block_q3_k(b, dst); break;
    case KN_DTYPE_Q2_K: block_q2_k(b, dst); break;
    case KN_DTYPE_IQ4_NL: iq4_levels(b + 2, kn_le_f16(b), dst); break;
    case KN_DTYPE_IQ4_XS:
      for (int j = 0; j < 8; j++)
        iq4_levels(b + 8 + 16 * j, kn_le_f16(b) * (float)kn_iq4xs_scale(b, j), dst + 32 * j);
      break;
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

/* ---- The K-quants' quantizers: ggml's reference rounding ----------------
 *
 * Q4_K / Q5_K: each 32-element sub-block gets a (scale, min) pair fitted by a
 * weighted least-squares search over a grid of level counts; the 8 pairs are
 * then rounded to 6 bits against the block's largest scale and min, and every
 * element is rounded again against the pair it decodes with. Q6_K: each
 * 16-element sub-block gets a signed scale from a search over 19 candidate
 * scales (weights x^2), rounded to int8 against the block's largest. Every
 * float operation is ggml's, in its order (this file is built with
 * -ffp-contract=off), so the blocks have the bits of ggml's reference. */

/* ggml's nearest integer: x + 1.5 * 2^23 rounds to an integer in the float
 * adder (half to even), whose low mantissa bits are then read; exact for
 * |x| < 2^22, and the same bits as ggml's outside (no conversion UB). */
static int nearest_int(float x) {
  float v = x + 12582912.0f;
  int32_t i;
  memcpy(&i, &v, sizeof(i));
  return (i & 0x007fffff) - 0x00400000;
}

static int clamp_int(int v, int lo, int hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

/* The levels L[n] in 0..nmax, scale and offset (returned, and -min in
 * *neg_min) that fit x[n] with weights w[n]: first min(x, 0)..max(x) over
 * nmax steps, then for each of nstep + 1 level counts nmax + rmin + rdelta*is
 * the levels it rounds to and their weighted least-squares (scale, min), kept
 * where the weighted squared error is lower. aux[n] is scratch. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
                           float *neg_min, uint8_t *aux, float rmin, float rdelta, int nstep) {
  float lo = x[0], hi = x[0], sum_w = w[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; i++) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0) lo = 0;
  if (hi == lo) {
    memset(L, 0, (size_t)n);
    *neg_min = -lo;
    return 0.0f;
  }
  float iscale = nmax / (hi - lo), scale = 1 / iscale, best = 0;
  for (int i = 0; i < n; i++) {
    L[i] = (uint8_t)clamp_int(nearest_int(iscale * (x[i] - lo)), 0, nmax);
    float diff = scale * L[i] + lo - x[i];
    best += w[i] * (diff * diff);
  }
  for (int is = 0; is <= nstep; is++) {
    iscale = (rmin + rdelta * is + nmax) / (hi - lo);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; i++) {
      int l = clamp_int(nearest_int(iscale * (x[i] - lo)), 0, nmax);
      aux[i] = (uint8_t)l;
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    float D = sum_w * sum_l2 - sum_l * sum_l;
    if (!(D > 0)) continue;
    float s = (sum_w * sum_xl - sum_x * sum_l) / D, m = (sum_l2 * sum_x - sum_l * sum_xl) / D;
    if (m > 0) {
      m = 0;
      s = sum_xl / sum_l2;
    }
    float err = 0;
    for (int i = 0; i < n; i++) {
      float diff = s * aux[i] + m - x[i];
      err += w[i] * (diff * diff);
    }
    if (err < best) {
      memcpy(L, aux, (size_t)n);
      best = err;
      scale = s;
      lo = m;
    }
  }
  *neg_min = -lo;
  return scale;
}

/* One 256-element block of Q4_K (five = 0) or Q5_K (five = 1) at b. */
static void quant_block_q45_k(const float *x, uint8_t *b, int five) {
  int nmax = five ? 31 : 15;
  uint8_t L[256], aux[32];
  float w[32], sc[8], mn[8], max_sc = 0, max_mn = 0;
  for (int j = 0; j < 8; j++) {
    const float *xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; l++)
      sum_x2 += xs[l] * xs[l];
    float av = sqrtf(sum_x2 / 32);
    for (int l = 0; l < 32; l++)
      w[l] = av + fabsf(xs[l]);
    sc[j] = fit_scale_min(32, nmax, xs, w, L + 32 * j, &mn[j], aux, five ? -0.5f : -1.0f, 0.1f,
                          five ? 15 : 20);
    max_sc = sc[j] > max_sc ? sc[j] : max_sc;
    max_mn = mn[j] > max_mn ? mn[j] : max_mn;
  }
  memset(b, 0, kn_block_bytes(five ? KN_DTYPE_Q5_K : KN_DTYPE_Q4_K));
  uint8_t *scales = b + 4;
  float inv_sc = max_sc > 0 ? 63.0f / max_sc : 0.0f, inv_mn = max_mn > 0 ? 63.0f / max_mn : 0.0f;
  for (int j = 0; j < 8; j++) {
    uint8_t ls = (uint8_t)nearest_int(inv_sc * sc[j]), lm = (uint8_t)nearest_int(inv_mn * mn[j]);
    ls = ls < 63 ? ls : 63;
    lm = lm < 63 ? lm : 63;
    if (j < 4) {
      scales[j] = ls;
      scales[j + 4] = lm;
    } else {
      scales[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
      scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
      scales[j] |= (uint8_t)((lm >> 4) << 6);
    }
  }
  put_h(b, max_sc / 63.0f);
  put_h(b + 2, max_mn / 63.0f);
  float d = kn_le_f16(b), dmin = kn_le_f16(b + 2);
  for (int j = 0; j < 8; j++) {
    uint8_t s, m;
    scale_min_k4(j, scales, &s, &m);
    float dj = d * s;
    if (!dj) continue; /* the sub-block keeps the levels of its fit */
    float dm = dmin * m;
    for (int l = 0; l < 32; l++)
      L[32 * j + l] = (uint8_t)clamp_int(nearest_int((x[32 * j + l] + dm) / dj), 0, nmax);
  }
  uint8_t *qh = b + 16, *q = five ? b + 48 : b + 16;
  for (int n = 0, g = 0; n < 256; n += 64, g++, q += 32)
    for (int l = 0; l < 32; l++) {
      int l1 = L[n + l], l2 = L[n + l + 32];
      if (five) {
        qh[l] |= (uint8_t)((l1 >> 4) << (2 * g) | (l2 >> 4) << (2 * g + 1));
        l1 &= 0xF;
        l2 &= 0xF;
      }
      q[l] = (uint8_t)(l1 | l2 << 4);
    }
}

/* The signed scale and levels L[n] in 0..2*nmax-1 (value l - nmax) that fit
 * x[n] with weights x^2: -nmax at the element of largest magnitude, then the
 * least-squares scale of each of 18 nearby level counts, kept where it
 * explains more of x (ggml's make_qx_quants, rmse_type 1). */
static float fit_scale_sym(int n, int nmax, const float *x, int8_t *L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; i++)
    if (fabsf(x[i]) > amax) {
      amax = fabsf(x[i]);
      max = x[i];
    }
  if (amax < 1e-15f) {
    memset(L, 0, (size_t)n);
    return 0.0f;
  }
  float iscale = -nmax / max, sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; i++) {
    int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = (int8_t)(l + nmax);
    float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
  for (int is = -9; is <= 9; is++) {
    if (!is) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; i++) {
      int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; i++)
        L[i] = (int8_t)(nmax + clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

/* One 256-element block of Q6_K at b. */
static void quant_block_q6_k(const float *x, uint8_t *b) {
  int8_t L[256];
  float sc[16], max_sc = 0, max_abs = 0;
  for (int j = 0; j < 16; j++) {
    sc[j] = fit_scale_sym(16, 32, x + 16 * j, L + 16 * j);
    if (fabsf(sc[j]) > max_abs) {
      max_abs = fabsf(sc[j]);
      max_sc = sc[j];
    }
  }
  memset(b, 0, 210);
  if (max_abs < 1e-15f) return;
  int8_t *scales = (int8_t *)(b + 192);
  float iscale = -128.0f / max_sc;
  put_h(b + 208, 1 / iscale);
  for (int j = 0; j < 16; j++) {
    int v = nearest_int(iscale * sc[j]);
    scales[j] = (int8_t)(v < 127 ? v : 127);
  }
  float d = kn_le_f16(b + 208);
  for (int j = 0; j < 16; j++) {
    float dj = d * scales[j];
    if (!dj) continue; /* the sub-block keeps the levels of its fit */
    for (int l = 0; l < 16; l++)
      L[16 * j + l] = (int8_t)(clamp_int(nearest_int(x[16 * j + l] / dj), -32, 31) + 32);
  }
  uint8_t *ql = b, *qh = b + 128;
  for (int n = 0; n < 256; n += 128, ql += 64, qh += 32)
    for (int l = 0; l < 32; l++) {
      int q1 = L[n + l], q2 = L[n + l + 32], q3 = L[n + l + 64], q4 = L[n + l + 96];
      ql[l] = (uint8_t)((q1 & 0xF) | (q3 & 0xF) << 4);
      ql[l + 32] = (uint8_t)((q2 & 0xF) | (q4 & 0xF) << 4);
      qh[l] = (uint8_t)((q1 >> 4) | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6);
    }
}

/* The 32 quants xi of a Q4_0 / Q4_1 / Q5_0 / Q5_1 block into its bytes: the
 * low nibbles in q[16] (element j in the low half of byte j, element 16 + j
 * in the high half) and, where qh is not NULL (Q5), the fifth bits as a
 * little-endian 32-bit word at qh. */
static void pack_q45(uint8_t *q, uint8_t *qh, const int *xi) {
  uint32_t h = 0;
  for (int j = 0; j < 16; j++) {
    q[j] = (uint8_t)((xi[j] & 0xF) | ((xi[16 + j] & 0xF) << 4));
    h |= (uint32_t)((xi[j] & 0x10) >> 4) << j;
    h |= (uint32_t)((xi[16 + j] & 0x10) >> 4) << (j + 16);
  }
  if (qh)
    memcpy(qh, (uint8_t[4]){(uint8_t)h, (uint8_t)(h >> 8), (uint8_t)(h >> 16), (uint8_t)(h >> 24)},
           4);
}

int kn_quantize_row(enum kn_dtype dt, const float *x, void *dst, size_t K) {
  if (dt != KN_DTYPE_Q8_0 && dt != KN_DTYPE_Q4_0 && dt != KN_DTYPE_Q4_1 && dt != KN_DTYPE_Q5_0 &&
      dt != KN_DTYPE_Q5_1 && dt != KN_DTYPE_Q4_K && dt != KN_DTYPE_Q5_K && dt != KN_DTYPE_Q6_K)
    return CM_ERR_UNSUPPORTED;
  size_t be = (size_t)kn_block_elems(dt), bb = kn_block_bytes(dt);
  if (K % be) return CM_ERR_INVAL;
  uint8_t *b = dst;
  if (be == 256) {
    for (size_t blk = 0; blk < K / 256; blk++, b += bb, x += 256)
      if (dt == KN_DTYPE_Q6_K)
        quant_block_q6_k(x, b);
      else
        quant_block_q45_k(x, b, dt == KN_DTYPE_Q5_K);
    return 0;
  }
  for (size_t blk = 0; blk < K / 32; blk++, b += bb, x += 32) {
    float amax, d, id, lo, hi;
    int xi[32]; /* Q4 / Q5 quants */
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
      for (int j = 0; j < 32; j++) {
        float v = x[j] * id;
        xi[j] = min_int(five ? 31 : 15, (int8_t)(v + (five ? 16.5f : 8.5f)));
      }
      pack_q45(b + (five ? 6 : 2), five ? b + 2 : NULL, xi);
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
      for (int j = 0; j < 32; j++) {
        float v = (x[j] - lo) * id;
        xi[j] = five ? (uint8_t)(v + 0.5f) : min_int(15, (int8_t)(v + 0.5f));
      }
      pack_q45(b + (five ? 8 : 4), five ? b + 4 : NULL, xi);
      break;
    }
    default: break;
    }
  }
  return 0;
}

void kn_random_blocks(enum kn_dtype dt, void *dst, size_t n, uint64_t *rng) {
  const size_t bb = kn_block_bytes(dt);
  /* the f16 scales: from the block's start (d, and Q4_1's, Q5_1's, Q4_K's and
   * Q5_K's min or dmin) or at its end (Q6_K's and Q3_K's d, Q2_K's d, dmin) */
  const int head = dt == KN_DTYPE_Q6_K || dt == KN_DTYPE_Q3_K || dt == KN_DTYPE_Q2_K ? 0
                   : dt == KN_DTYPE_Q4_1 || dt == KN_DTYPE_Q5_1 || dt == KN_DTYPE_Q4_K ||
                           dt == KN_DTYPE_Q5_K
                       ? 2
                       : 1,
            tail = dt == KN_DTYPE_Q2_K ? 2 : dt == KN_DTYPE_Q6_K || dt == KN_DTYPE_Q3_K;
  uint8_t *b = dst;
  for (size_t i = 0; i < n * bb; i++)
    b[i] = (uint8_t)(kn_xorshift64s(rng) >> 32);
  for (size_t i = 0; i < n; i++, b += bb) {
    for (int f = 0; f < head + tail; f++) {
      const float u = (float)(kn_xorshift64s(rng) >> 40) * (2.0f / 16777216.0f) - 1.0f;
      put_h(f < head ? b + 2 * f : b + bb - 2 * (head + tail - f), (f < head ? 0.02f : 0.01f) * u);
    }
  }
}

enum kn_dtype kn_quant_row_type(enum kn_dtype dt, size_t K) {
  if (K % (size_t)kn_block_elems(dt) == 0) return dt;
  enum kn_dtype fb = dt == KN_DTYPE_Q4_K   ? KN_DTYPE_Q5_0
                     : dt == KN_DTYPE_Q5_K ? KN_DTYPE_Q5_1
                     : dt == KN_DTYPE_Q6_K ? KN_DTYPE_Q8_0
                                           : KN_DTYPE__COUNT;
  return fb != KN_DTYPE__COUNT && K % 32 == 0 ? fb : KN_DTYPE__COUNT;
}

/* Q3_K's 12 bytes of scales q (kn_q3k_scales) as its X16 layout's three dwords D: scale s < 15 in
 * dword s / 5 at bit 6 (s % 5), as a 6-bit two's complement (scale less 32), and scale 15's bits
 * 2 k, 2 k + 1 at bits 30, 31 of dword k; so that an arithmetic shift takes all but one (pack), or
 * back (unpack). */
static void q3k_x16_scales(uint8_t *q, uint32_t D[3], int pack) {
  int8_t sc[16];
  if (pack) {
    kn_q3k_scales(q, sc);
    for (int k = 0; k < 3; k++) {
      D[k] = (uint32_t)(sc[15] & 63) >> 2 * k << 30;
      for (int m = 0; m < 5; m++)
        D[k] |= (uint32_t)(sc[5 * k + m] & 63) << 6 * m;
    }
    return;
  }
  int raw[16]; /* the scales' 6 bits as the block has them (scale + 32) */
  for (int s = 0; s < 16; s++) {
    const uint32_t f = s < 15 ? D[s / 5] >> 6 * (s % 5) & 63
                              : (D[0] >> 30) | (D[1] >> 30) << 2 | (D[2] >> 30) << 4;
    raw[s] = (int)(f ^ 32);
  }
  for (int j = 0; j < 4; j++) {
    q[j] = (uint8_t)((raw[j] & 15) | (raw[8 + j] & 15) << 4);
    q[4 + j] = (uint8_t)((raw[4 + j] & 15) | (raw[12 + j] & 15) << 4);
    q[8 + j] = (uint8_t)(raw[j] >> 4 | raw[4 + j] >> 4 << 2 | raw[8 + j] >> 4 << 4 |
                         raw[12 + j] >> 4 << 6);
  }
}

/* Row i's block at blk and its place in a block of an X16 group at grp
 * (kn-quant.h's layouts; for the 32-element formats the scale at 2 i, Q4_1's and Q5_1's min at 32 +
 * 2 i, quad c at h + 64 c + 4 i after the h = 32 or 64 bytes of those, Q5_0's and Q5_1's fifth bits
 * in the planes from h + 64 quads): copied into the group (pack), or back out of it. */
static void x16_copy(uint8_t *grp, uint8_t *blk, int i, enum kn_dtype dt, int pack) {
  if (dt == KN_DTYPE_IQ4_XS) { /* d, scales_l, scales_h, then 32 quads */
    for (int c = -3; c < 32; c++) {
      uint8_t *g = c == -3   ? grp + 2 * i
                   : c == -2 ? grp + 32 + 4 * i
                   : c == -1 ? grp + 96 + 2 * i
                             : grp + 128 + 64 * c + 4 * i,
              *r = c == -3   ? blk
                   : c == -2 ? blk + 4
                   : c == -1 ? blk + 2
                             : blk + 8 + 4 * c;
      const size_t len = c == -2 || c >= 0 ? 4 : 2;
      memcpy(pack ? g : r, pack ? r : g, len);
    }
    return;
  }
  if (dt == KN_DTYPE_Q3_K || dt == KN_DTYPE_Q2_K) {
    /* d (Q2_K: and dmin), then quads: the scales' (3 or 4), Q3_K's hmask's
     * 8, q's 16 */
    const int three = dt == KN_DTYPE_Q3_K, nd = three ? 1 : 2, ns = three ? 3 : 4,
              nh = three ? 8 : 0;
    uint32_t D[3];
    if (three && pack) q3k_x16_scales(blk + 96, D, 1);
    for (int c = -nd; c < ns + nh + 16; c++) {
      uint8_t *g = c < 0 ? grp + 32 * (c + nd) + 2 * i : grp + 32 * nd + 64 * c + 4 * i,
              *r = c < 0         ? blk + (three ? 108 : 80 + 2 * (c + nd))
                   : c < ns      ? blk + (three ? 96 : 0) + 4 * c
                   : c < ns + nh ? blk + 4 * (c - ns)
                                 : blk + (three ? 32 : 16) + 4 * (c - ns - nh);
      if (three && c >= 0 && c < ns) { /* the scales' dwords, rearranged */
        if (pack)
          for (int k = 0; k < 4; k++)
            g[k] = (uint8_t)(D[c] >> 8 * k);
        else
          D[c] = kn_le32(g);
      } else
        memcpy(pack ? g : r, pack ? r : g, c < 0 ? 2 : 4);
    }
    if (three && !pack) q3k_x16_scales(blk + 96, D, 0);
    return;
  }
  if (kn_block_elems(dt) == 256) {
    /* Q4_K and Q5_K: d, dmin, then 3 + 32 quads (the scales', the nibbles')
     * and Q5_K's 8 of qh; Q6_K: d, then 4 + 32 + 16 quads (the scales', ql's,
     * qh's) */
    const int six = dt == KN_DTYPE_Q6_K, five = dt == KN_DTYPE_Q5_K, nd = six ? 1 : 2,
              nq = six ? 52 : five ? 43 : 35;
    for (int c = -nd; c < nq; c++) {
      uint8_t *g = c < 0 ? grp + 32 * (c + nd) + 2 * i : grp + 32 * nd + 64 * c + 4 * i,
              *r = c < 0            ? blk + (six ? 208 : 2 * (c + nd))
                   : six && c < 4   ? blk + 192 + 4 * c
                   : six            ? blk + 4 * (c - 4)
                   : c < 3 || !five ? blk + 4 + 4 * c
                   : c < 35         ? blk + 48 + 4 * (c - 3)
                                    : blk + 16 + 4 * (c - 35);
      const size_t len = c < 0 ? 2 : 4;
      memcpy(pack ? g : r, pack ? r : g, len);
    }
    return;
  }
  /* (IQ4_NL's bytes are Q4_0's) */
  const int five = dt == KN_DTYPE_Q5_0 || dt == KN_DTYPE_Q5_1, quads = dt == KN_DTYPE_Q8_0 ? 8 : 4;
  const int ns = dt == KN_DTYPE_Q4_1 || dt == KN_DTYPE_Q5_1 ? 2 : 1; /* f16s: d (and m) */
  const int q0 = 2 * ns + (five ? 4 : 0);                           /* the row's quants */
  for (int c = -ns; c < quads; c++) {
    uint8_t *g = c < 0 ? grp + 32 * (c + ns) + 2 * i : grp + 32 * ns + 64 * c + 4 * i,
            *r = c < 0 ? blk + 2 * (c + ns) : blk + q0 + 4 * c;
    const size_t len = c < 0 ? 2 : 4;
    memcpy(pack ? g : r, pack ? r : g, len);
  }
  if (!five) return;
  /* element e's fifth bit (bit e of the block's qh) is bit 4 i + e % 4 of
   * plane 2 (e % 16 / 4) + e / 16, eight bytes each: a plane marks the
   * bytes of one quad register (16 rows x 4) whose weights take 16 */
  uint8_t *planes = grp + 32 * ns + 64 * quads;
  uint32_t qh = pack ? kn_le32(blk + 2 * ns) : 0;
  for (int e = 0; e < 32; e++) {
    const int bit = 4 * i + (e & 3);
    uint8_t *at = planes + 8 * (2 * ((e & 15) >> 2) + (e >> 4)) + bit / 8;
    if (pack)
      *at = (uint8_t)((*at & ~(1u << bit % 8)) | (qh >> e & 1) << bit % 8);
    else
      qh |= (uint32_t)(*at >> bit % 8 & 1) << e;
  }
  if (!pack)
    for (int k = 0; k < 4; k++)
      blk[2 * ns + k] = (uint8_t)(qh >> 8 * k);
}

int kn_x16_pack(enum kn_dtype dt, void *w, int n, int K) {
  const int be = kn_block_elems(dt);
  if (kn_dtype_x16_of(dt) == KN_DTYPE__COUNT || K <= 0 || K % be || n < 0) return CM_ERR_INVAL;
  const size_t bb = kn_block_bytes(dt), rb = kn_row_bytes(dt, (size_t)K), B = (size_t)(K / be);
  if (n < KN_X16_ROWS) return 0;
  uint8_t *rows = malloc(KN_X16_ROWS * rb);
  if (!rows) return CM_ERR_NOMEM;
  for (int g = 0; g < n / KN_X16_ROWS; g++) {
    uint8_t *grp = (uint8_t *)w + (size_t)g * KN_X16_ROWS * rb;
    memcpy(rows, grp, KN_X16_ROWS * rb);
    for (size_t b = 0; b < B; b++)
      for (int i = 0; i < KN_X16_ROWS; i++)
        x16_copy(grp + b * KN_X16_ROWS * bb, rows + (size_t)i * rb + b * bb, i, dt, 1);
  }
  free(rows);
  return 0;
}

void kn_x16_block(enum kn_dtype xdt, const void *w, int n, int K, int r, int b, void *dst) {
  const enum kn_dtype dt = kn_dtype_rows_of(xdt);
  const size_t bb = kn_block_bytes(dt), rb = kn_row_bytes(dt, (size_t)K);
  const int i = r % KN_X16_ROWS;
  if (r >= n / KN_X16_ROWS * KN_X16_ROWS) { /* past the groups: as it was */
    memcpy(dst, (const uint8_t *)w + (size_t)r * rb + (size_t)b * bb, bb);
    return;
  }
  /* read only: x16_copy writes the group when it packs */
  x16_copy((uint8_t *)w + (size_t)(r - i) * rb + (size_t)b * KN_X16_ROWS * bb, dst, i, dt, 0);
}

void kn_x16_row(enum kn_dtype xdt, const void *w, int n, int K, int r, void *dst) {
  const size_t bb = kn_block_bytes(xdt);
  for (int b = 0; b < K / kn_block_elems(xdt); b++)
    kn_x16_block(xdt, w, n, K, r, b, (uint8_t *)dst + (size_t)b * bb);
}
