/* kn-cpu-q8.c — the q8 mode's reference dot products (kn_cpu_dsp.q8dot):
 * Q8_0 and Q4_0 weight blocks against inputs rounded to Q8_0 blocks, integer
 * products summed exactly in groups of four elements (the lanes of the AVX2
 * kernel), each group's sum times the two blocks' scales added into its
 * lane's f32 accumulator with one rounding (fmaf), even and odd blocks into
 * two accumulators (two independent chains for the kernels), added lane by
 * lane at the end, then the lanes reduced as kn_avx2_hsum does. The AVX2
 * version gives these bits. */
#include <math.h>
#include <stdint.h>

#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/kn-quant.h"

static float h16(const uint8_t *p) {
  return kn_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

/* The 32 integer weights of block b of a row. */
static void weights(enum kn_dtype dt, const uint8_t *row, int b, int *q, float *d) {
  if (dt == KN_DTYPE_Q8_0) {
    const uint8_t *blk = row + (size_t)b * 34;
    *d = h16(blk);
    for (int j = 0; j < 32; j++)
      q[j] = (int8_t)blk[2 + j];
  } else {
    const uint8_t *blk = row + (size_t)b * 18;
    *d = h16(blk);
    for (int j = 0; j < 16; j++) {
      q[j] = (blk[2 + j] & 0xF) - 8;
      q[j + 16] = (blk[2 + j] >> 4) - 8;
    }
  }
}

/* kn_avx2_hsum's order: (l0+l4, l1+l5, l2+l6, l3+l7), (a0+a2, a1+a3), b0+b1. */
static float hsum8(const float *a) {
  float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
  float t0 = s0 + s2, t1 = s1 + s3;
  return t0 + t1;
}

static void q8dot_ref(enum kn_dtype dt, float *out, ptrdiff_t ldo, const uint8_t *x, size_t ldx,
                      const uint8_t *w, size_t row_bytes, int K, int T, int n, int acc) {
  const int B = K / 32;
  int q[32];
  for (int j = 0; j < n; j++)
    for (int t = 0; t < T; t++) {
      const uint8_t *xr = x + (size_t)t * ldx;
      float a2[2][8] = {{0}}; /* even and odd blocks: two chains of multiply-adds */
      for (int b = 0; b < B; b++) {
        float *a = a2[b & 1];
        float dw;
        weights(dt, w + (size_t)j * row_bytes, b, q, &dw);
        const uint8_t *xb = xr + (size_t)b * 34;
        float d = dw * h16(xb);
        for (int l = 0; l < 8; l++) {
          int p = 0;
          for (int e = 4 * l; e < 4 * l + 4; e++)
            p += q[e] * (int8_t)xb[2 + e];
          a[l] = fmaf((float)p, d, a[l]);
        }
      }
      float a[8];
      for (int l = 0; l < 8; l++)
        a[l] = a2[0][l] + a2[1][l];
      float s = hsum8(a);
      float *o = out + (ptrdiff_t)t * ldo + j;
      *o = acc ? *o + s : s;
    }
}

static void q8dot_q8_0(float *out, ptrdiff_t ldo, const uint8_t *x, size_t ldx, const int32_t *xs,
                       const uint8_t *w, size_t row_bytes, int K, int T, int n, int acc) {
  (void)xs;
  q8dot_ref(KN_DTYPE_Q8_0, out, ldo, x, ldx, w, row_bytes, K, T, n, acc);
}

static void q8dot_q4_0(float *out, ptrdiff_t ldo, const uint8_t *x, size_t ldx, const int32_t *xs,
                       const uint8_t *w, size_t row_bytes, int K, int T, int n, int acc) {
  (void)xs;
  q8dot_ref(KN_DTYPE_Q4_0, out, ldo, x, ldx, w, row_bytes, K, T, n, acc);
}

void kn_cpu_dsp_init_q8_ref(struct kn_cpu_dsp *dsp) {
  dsp->q8dot[KN_DTYPE_Q8_0] = q8dot_q8_0;
  dsp->q8dot[KN_DTYPE_Q4_0] = q8dot_q4_0;
}
