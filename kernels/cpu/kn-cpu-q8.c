/* kn-cpu-q8.c — the q8 mode's reference dot products (kn_cpu_dsp.q8dot): the
 * block formats' weights, 32 elements at a time (a Q8_0 / Q4_0 / Q4_1 / Q5_0 /
 * Q5_1 block, a K-quant's sub-block), against inputs rounded to Q8_0 blocks.
 *
 * Q8_0, Q4_0 and Q5_0 (the files llama.cpp's users run most; Q5_0 is what
 * Q4_K_M files of Gemma's shapes hold in rows that are not whole 256-blocks),
 * and IQ4_NL and IQ4_XS (a nibble's level from a table of 16; IQ4_NL is what
 * IQ4_XS files hold in rows that are not whole 256-blocks, IQ4_XS's 32-element
 * sub-block has a scale of its own):
 * a block's 32 integer products are one exact sum, which times the two blocks' scales is added
 * into the output's f32 accumulator with one rounding (fmaf), block after
 * block, as llama.cpp's kernels do. The kernels then put outputs, not a
 * block's elements, side by side in a register's lanes (tokens when there
 * are several, rows when there is one), so a lane needs no reduction.
 *
 * Q4_1, Q5_1 and the K-quants (Q3_K and Q2_K among them): one integer a
 * block (a K-quant's 32-element sub-block) the same way, its halves' sums
 * times their integer scales where a scale covers 16 elements (Q6_K, Q3_K,
 * Q2_K), then for the formats with a min the min times the block's input
 * sum (Q2_K: the halves' mins times theirs; q8dot_min_ref).
 *
 * The AVX2 and AVX-512 VNNI versions give these bits. */
#include <math.h>
#include <stdint.h>

#include "common/cm-assert.h"
#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/kn-quant.h"

/* The 32 weights of 32-element block b of a row as integers q (the formats'
 * offsets applied: Q4_0's q - 8, Q5_0's q - 16, Q6_K's q - 32; IQ4_NL's
 * levels), the scale of
 * each lane's four (d[l]; Q6_K's change every 16 elements), and for the
 * formats with a min the value every weight adds, *m (Q4_1 / Q5_1: m; Q4_K /
 * Q5_K: -(dmin * min), the sub-block's scale d * sc and min dmin * min each
 * rounded once, as kn_dequant_row has them). Returns whether there is a min. */
static int weights(enum kn_dtype dt, const uint8_t *row, int b, int *q, float *d, float *m) {
  float s = 0.0f;
  int has_m = 0;
  switch (dt) {
  case KN_DTYPE_Q8_0: {
    const uint8_t *blk = row + (size_t)b * 34;
    s = kn_le_f16(blk);
    for (int j = 0; j < 32; j++)
      q[j] = (int8_t)blk[2 + j];
    break;
  }
  case KN_DTYPE_Q4_0:
  case KN_DTYPE_Q4_1: {
    const int one = dt == KN_DTYPE_Q4_1;
    const uint8_t *blk = row + (size_t)b * (one ? 20 : 18), *n = blk + (one ? 4 : 2);
    s = kn_le_f16(blk);
    for (int j = 0; j < 16; j++) {
      q[j] = (n[j] & 0xF) - (one ? 0 : 8);
      q[j + 16] = (n[j] >> 4) - (one ? 0 : 8);
    }
    if (one) *m = kn_le_f16(blk + 2), has_m = 1;
    break;
  }
  case KN_DTYPE_IQ4_NL:
  case KN_DTYPE_IQ4_XS: { /* Q4_0's bytes, levels (IQ4_XS: sub-block b % 8, d (sc - 32)) */
    const int xs = dt == KN_DTYPE_IQ4_XS, sb = b & 7;
    const uint8_t *blk = row + (xs ? (size_t)(b >> 3) * 136 : (size_t)b * 18),
                  *n = blk + (xs ? 8 + 16 * sb : 2);
    s = xs ? kn_le_f16(blk) * (float)kn_iq4xs_scale(blk, sb) : kn_le_f16(blk);
    for (int j = 0; j < 16; j++) {
      q[j] = kn_iq4_levels[n[j] & 0xF];
      q[j + 16] = kn_iq4_levels[n[j] >> 4];
    }
    break;
  }
  case KN_DTYPE_Q5_0:
  case KN_DTYPE_Q5_1: {
    const int one = dt == KN_DTYPE_Q5_1;
    const uint8_t *blk = row + (size_t)b * (one ? 24 : 22), *n = blk + (one ? 8 : 6);
    uint32_t qh = kn_le32(blk + (one ? 4 : 2));
    s = kn_le_f16(blk);
    for (int j = 0; j < 16; j++) {
      q[j] = (int)((n[j] & 0xF) | ((qh >> j & 1) << 4)) - (one ? 0 : 16);
      q[j + 16] = (int)((n[j] >> 4) | ((qh >> (j + 16) & 1) << 4)) - (one ? 0 : 16);
    }
    if (one) *m = kn_le_f16(blk + 2), has_m = 1;
    break;
  }
  case KN_DTYPE_Q4_K:
  case KN_DTYPE_Q5_K: {
    /* sub-block s of a super-block: the low (s even) or high nibbles of its
     * bytes 32 (s / 2) .. + 31, Q5_K's fifth bit bit s of qh[l] */
    const int five = dt == KN_DTYPE_Q5_K, sb = b & 7;
    const uint8_t *blk = row + (size_t)(b >> 3) * (five ? 176 : 144);
    const uint8_t *n = blk + (five ? 48 : 16) + 32 * (sb >> 1), *qh = blk + 16;
    uint64_t sc, mn;
    kn_k_scales_mins(blk + 4, &sc, &mn);
    s = kn_le_f16(blk) * (float)(int)(sc >> 8 * sb & 0xFF);
    *m = -(kn_le_f16(blk + 2) * (float)(int)(mn >> 8 * sb & 0xFF));
    has_m = 1;
    for (int l = 0; l < 32; l++)
      q[l] = (sb & 1 ? n[l] >> 4 : n[l] & 0xF) + (five && (qh[l] >> sb & 1) ? 16 : 0);
    break;
  }
  case KN_DTYPE_Q6_K: {
    /* sub-block c: part p = c % 4 of half c / 4 (kn_dequant_row's q1 .. q4) */
    const int c = b & 7, half = c >> 2, p = c & 3;
    const uint8_t *blk = row + (size_t)(b >> 3) * 210;
    const uint8_t *ql = blk + 64 * half + 32 * (p & 1), *qh = blk + 128 + 32 * half;
    const int8_t *sc = (const int8_t *)(blk + 192) + 8 * half + 2 * p;
    float dd = kn_le_f16(blk + 208);
    for (int l = 0; l < 32; l++)
      q[l] = (int)((p >= 2 ? ql[l] >> 4 : ql[l] & 0xF) | ((qh[l] >> (2 * p)) & 3) << 4) - 32;
    for (int l = 0; l < 8; l++)
      d[l] = dd * (float)sc[l / 4];
    return 0;
  }
  case KN_DTYPE_Q3_K:
  case KN_DTYPE_Q2_K: {
    /* sub-block c: q's bytes 32 (c / 4) .. + 31 shifted right by 2 (c % 4);
     * Q3_K's less 4 where bit c of hmask's byte is clear (the scales:
     * half_scales) */
    const int c = b & 7, three = dt == KN_DTYPE_Q3_K;
    const uint8_t *blk = row + (size_t)(b >> 3) * (three ? 110 : 84);
    const uint8_t *qs = blk + (three ? 32 : 16) + 32 * (c >> 2);
    for (int l = 0; l < 32; l++)
      q[l] = (qs[l] >> 2 * (c & 3) & 3) - (three && !(blk[l] >> c & 1) ? 4 : 0);
    return 0;
  }
  default: CM_ASSERT(0);
  }
  for (int l = 0; l < 8; l++)
    d[l] = s;
  return has_m;
}

/* Q8_0, Q4_0, Q5_0, IQ4_NL and IQ4_XS (a 32-element sub-block's scale d (sc -
 * 32), exact), and their X16 layouts (each block as its format's first): one
 * integer a block, one multiply-add a block. */
static void q8dot_int_ref(enum kn_dtype dt, float *out, ptrdiff_t ldo, const uint8_t *x, size_t ldx,
                          const uint8_t *w, size_t row_bytes, int K, int T, int n, int acc) {
  const int B = K / 32, per = kn_block_elems(dt) / 32;
  int q[32];
  float dw[8], m = 0.0f;
  uint8_t blk[256]; /* an X16 row's (super-)block, as its format has it */
  for (int j = 0; j < n; j++)
    for (int t = 0; t < T; t++) {
      const uint8_t *xr = x + (size_t)t * ldx;
      float a = 0.0f;
      for (int b = 0; b < B; b++) {
        if (kn_dtype_x16(dt)) {
          if (b % per == 0) kn_x16_block(dt, w, n, K, j, b / per, blk);
          weights(kn_dtype_rows_of(dt), blk, b % per, q, dw, &m);
        } else {
          weights(dt, w + (size_t)j * row_bytes, b, q, dw, &m);
        }
        const uint8_t *xb = xr + (size_t)b * 34;
        int p = 0;
        for (int e = 0; e < 32; e++)
          p += q[e] * (int8_t)xb[2 + e];
        a = fmaf((float)p, dw[0] * kn_le_f16(xb), a);
      }
      float *o = out + (ptrdiff_t)t * ldo + j;
      *o = acc ? *o + a : a;
    }
}

/* The integer scales of 32-element sub-block c's two halves of 16 in the
 * super-block blk of Q6_K, Q3_K (less 32) or Q2_K (and Q2_K's mins, m0 and
 * m1), and the super-block's d (and Q2_K's dmin, *dm). */
static void half_scales(enum kn_dtype dt, const uint8_t *blk, int c, int *s0, int *s1, int *m0,
                        int *m1, float *dd, float *dm) {
  if (dt == KN_DTYPE_Q6_K) {
    const int8_t *sc = (const int8_t *)(blk + 192) + 2 * c;
    *s0 = sc[0], *s1 = sc[1], *dd = kn_le_f16(blk + 208);
  } else if (dt == KN_DTYPE_Q3_K) {
    int8_t sc[16];
    kn_q3k_scales(blk + 96, sc);
    *s0 = sc[2 * c], *s1 = sc[2 * c + 1], *dd = kn_le_f16(blk + 108);
  } else {
    *s0 = blk[2 * c] & 0xF, *m0 = blk[2 * c] >> 4;
    *s1 = blk[2 * c + 1] & 0xF, *m1 = blk[2 * c + 1] >> 4;
    *dd = kn_le_f16(blk + 80), *dm = kn_le_f16(blk + 82);
  }
}

/* Q4_1, Q5_1 and the K-quants: one integer a 32-element block (a K-quant's
 * sub-block). Q4_1, Q5_1, Q4_K and Q5_K: p = the exact sum of its 32 products
 * (q without its min), acc = fma((float)p, ds * dx, acc), then acc =
 * fma((float)sx, m * dx, acc) with sx the block's input sum (Q4_K and Q5_K:
 * ds = d * sc and m = -(dmin * min), each rounded once; weights()).
 * Q6_K, Q3_K and Q2_K (a scale each 16 elements): p = sc0 p0 + sc1 p1
 * exactly, p0 and p1 the sums of products of its two halves (Q6_K's q - 32,
 * Q3_K's q in -4 .. 3; |p| < 2^24), acc = fma((float)p, dd * dx, acc); Q2_K
 * then acc = fma((float)(m0 sx0 + m1 sx1), -(dmin * dx), acc), sx0 and sx1
 * the halves' input sums. */
static void q8dot_min_ref(enum kn_dtype xdt, float *out, ptrdiff_t ldo, const uint8_t *x,
                          size_t ldx, const uint8_t *w, size_t row_bytes, int K, int T, int n,
                          int acc) {
  const int B = K / 32;
  const enum kn_dtype dt = kn_dtype_rows_of(xdt);
  int q[32];
  uint8_t sbk[256]; /* an X16 row's super-block, as its format has it */
  for (int j = 0; j < n; j++)
    for (int t = 0; t < T; t++) {
      const uint8_t *xr = x + (size_t)t * ldx, *row = w + (size_t)j * row_bytes;
      float a = 0.0f;
      for (int b = 0; b < B; b++) {
        float dw[8], m = 0.0f;
        const uint8_t *src = row; /* block bi of src is the row's block b */
        int bi = b;
        if (kn_dtype_x16(xdt)) { /* the (super-)block alone, once: its block b % per */
          const int per = kn_block_elems(dt) / 32;
          if (b % per == 0) kn_x16_block(xdt, w, n, K, j, b / per, sbk);
          src = sbk, bi = b % per;
        }
        weights(dt, src, bi, q, dw, &m);
        const uint8_t *xb = xr + (size_t)b * 34;
        const float dx = kn_le_f16(xb);
        int p0 = 0, p1 = 0, sx0 = 0, sx1 = 0;
        for (int e = 0; e < 32; e++) {
          const int v = (int8_t)xb[2 + e];
          *(e < 16 ? &p0 : &p1) += q[e] * v;
          *(e < 16 ? &sx0 : &sx1) += v;
        }
        if (dt == KN_DTYPE_Q6_K || dt == KN_DTYPE_Q3_K || dt == KN_DTYPE_Q2_K) {
          int s0, s1, m0 = 0, m1 = 0;
          float dd, dm = 0.0f;
          half_scales(dt, src + (size_t)(bi >> 3) * kn_block_bytes(dt), b & 7, &s0, &s1, &m0, &m1,
                      &dd, &dm);
          a = fmaf((float)(s0 * p0 + s1 * p1), dd * dx, a);
          if (dt == KN_DTYPE_Q2_K) a = fmaf((float)(m0 * sx0 + m1 * sx1), -(dm * dx), a);
        } else {
          a = fmaf((float)(p0 + p1), dw[0] * dx, a);
          a = fmaf((float)(sx0 + sx1), m * dx, a);
        }
      }
      float *o = out + (ptrdiff_t)t * ldo + j;
      *o = acc ? *o + a : a;
    }
}

/* q8dot of each format: REF (q8dot_int_ref, or q8dot_min_ref for the formats
 * with a min and Q6_K) on x's Q8_0 blocks. */
#define DEF_REF(SUF, REF, DT)                                                                      \
  static void q8dot_##SUF(float *out, ptrdiff_t ldo, const struct kn_cpu_q8_in *x,                 \
                          const uint8_t *w, size_t row_bytes, int K, int T, int n, int acc) {      \
    REF(DT, out, ldo, x->q, x->ldq, w, row_bytes, K, T, n, acc);                                   \
  }

DEF_REF(q8_0, q8dot_int_ref, KN_DTYPE_Q8_0)
DEF_REF(q4_0, q8dot_int_ref, KN_DTYPE_Q4_0)
DEF_REF(q8_0x16, q8dot_int_ref, KN_DTYPE_Q8_0_X16)
DEF_REF(q4_0x16, q8dot_int_ref, KN_DTYPE_Q4_0_X16)
DEF_REF(q5_0, q8dot_int_ref, KN_DTYPE_Q5_0)
DEF_REF(q5_0x16, q8dot_int_ref, KN_DTYPE_Q5_0_X16)
DEF_REF(iq4_nl, q8dot_int_ref, KN_DTYPE_IQ4_NL)
DEF_REF(iq4_nlx16, q8dot_int_ref, KN_DTYPE_IQ4_NL_X16)
DEF_REF(iq4_xs, q8dot_int_ref, KN_DTYPE_IQ4_XS)
DEF_REF(iq4_xsx16, q8dot_int_ref, KN_DTYPE_IQ4_XS_X16)
DEF_REF(q4_kx16, q8dot_min_ref, KN_DTYPE_Q4_K_X16)
DEF_REF(q5_kx16, q8dot_min_ref, KN_DTYPE_Q5_K_X16)
DEF_REF(q4_1x16, q8dot_min_ref, KN_DTYPE_Q4_1_X16)
DEF_REF(q5_1x16, q8dot_min_ref, KN_DTYPE_Q5_1_X16)
DEF_REF(q6_kx16, q8dot_min_ref, KN_DTYPE_Q6_K_X16)
DEF_REF(q4_1, q8dot_min_ref, KN_DTYPE_Q4_1)
DEF_REF(q5_1, q8dot_min_ref, KN_DTYPE_Q5_1)
DEF_REF(q4_k, q8dot_min_ref, KN_DTYPE_Q4_K)
DEF_REF(q5_k, q8dot_min_ref, KN_DTYPE_Q5_K)
DEF_REF(q6_k, q8dot_min_ref, KN_DTYPE_Q6_K)
DEF_REF(q3_k, q8dot_min_ref, KN_DTYPE_Q3_K)
DEF_REF(q3_kx16, q8dot_min_ref, KN_DTYPE_Q3_K_X16)
DEF_REF(q2_k, q8dot_min_ref, KN_DTYPE_Q2_K)
DEF_REF(q2_kx16, q8dot_min_ref, KN_DTYPE_Q2_K_X16)

static void q8_prep_ref(const float *x, int K, uint8_t *q, float *d, int32_t *s, int shift) {
  kn_quantize_row(KN_DTYPE_Q8_0, x, q, (size_t)K);
  for (int b = 0; b < K / 32; b++) {
    d[b] = kn_le_f16(q + (size_t)b * 34);
    for (int l = 0; l < 8; l++) {
      const int8_t *v = (const int8_t *)q + (size_t)b * 34 + 2 + 4 * l;
      const int sum = v[0] + v[1] + v[2] + v[3];
      s[b * 8 + l] = shift ? -sum * (1 << shift) : sum;
    }
  }
}

void kn_cpu_dsp_init_q8_ref(struct kn_cpu_dsp *dsp) {
  KN_CPU_Q8_FILL(dsp, q8_prep_ref);
}
