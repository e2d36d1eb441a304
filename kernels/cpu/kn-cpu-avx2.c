/* kn-cpu-avx2.c — AVX2 + FMA (+ F16C) versions of the CPU backend's dense
 * kernels: matmul (small-T matvec per weight dtype, prefill tile kernel),
 * weight widening, RMSNorm, GELU-tanh gating, softcap and elementwise ops.
 *
 * The canonical dot product (the reduction every matmul element follows, in
 * every variant here): one 8-lane f32 accumulator starting at zero;
 * acc = fma(w[k..k+8), x[k..k+8), acc) for k = 0, 8, ... < K rounded down to 8;
 * then, when K % 8 != 0, one more fma with both tails zero-padded; then
 * kn_avx2_hsum(acc); then out = sum or out = out + sum. Widening bf16/f16 to f32
 * is exact, so the matvec (weights widened in registers) and the tile kernel
 * (weights widened into a buffer first) produce identical bits. */
#include <math.h>

#include "kernels/cpu/kn-cpu-avx2.h"
#include "kernels/cpu/kn-cpu-impl.h"

static inline void put(float *o, float s, int acc) {
  *o = acc ? *o + s : s;
}

/* ---- matvec: T small, weights in their own dtype ------------------------ */

/* 8 weights from element k of w of dtype dt (f32, f16 or bf16; a constant
 * where this is inlined), widened: the matvec's rows, RMSNorm's weight; the
 * _tail version reads r < 8 and makes the rest zero. */
KN_AVX2 static inline __attribute__((always_inline)) __m256 ld_w(const void *w, enum kn_dtype dt,
                                                                 size_t k) {
  if (dt == KN_DTYPE_F32) return _mm256_loadu_ps((const float *)w + k);
  if (dt == KN_DTYPE_F16) return kn_avx2_f16((const uint16_t *)w + k);
  return kn_avx2_bf16((const uint16_t *)w + k);
}
/* 16 weights from element k as ld_w gives them for k and k + 8 (bf16: one
 * load, kn_avx2_bf16x16). */
KN_AVX2 static inline __attribute__((always_inline)) void ld_w16(const void *w, enum kn_dtype dt,
                                                                 size_t k, __m256 *lo, __m256 *hi) {
  if (dt == KN_DTYPE_BF16) {
    kn_avx2_bf16x16((const uint16_t *)w + k, lo, hi);
    return;
  }
  *lo = ld_w(w, dt, k);
  *hi = ld_w(w, dt, k + 8);
}
KN_AVX2 static inline __attribute__((always_inline)) __m256
ld_w_tail(const void *w, enum kn_dtype dt, size_t k, int r) {
  if (dt == KN_DTYPE_F32) return _mm256_maskload_ps((const float *)w + k, kn_avx2_mask(r));
  if (dt == KN_DTYPE_F16) return kn_avx2_f16_tail((const uint16_t *)w + k, r);
  return kn_avx2_bf16_tail((const uint16_t *)w + k, r);
}

/* kn_cpu_dot_fn over weights of dtype dt: 4 weight rows at a time, each read
 * from memory once per call (later tokens hit L1), 16 weights of a row at a
 * time, two tokens sharing each widened weight vector, then the leftover rows
 * one by one. The 4 rows of a group are a quarter of the rows apart (i,
 * i + s, i + 2s, i + 3s): four long sequential streams, which the hardware
 * prefetcher follows. */
KN_AVX2 static inline __attribute__((always_inline)) void
matvec(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi, const void *wv, int K, int T,
       int n, int acc, const enum kn_dtype dt) {
  const size_t es = kn_dtype_size(dt); /* bytes per weight */
  const unsigned char *w = wv;
  const int K8 = K & ~7, r = K - K8;
  const __m256i mask = kn_avx2_mask(r);
  const int s = n / 4; /* the stride between a group's rows */
  for (int i = 0; i < s; i++) {
    const int js[4] = {i, i + s, i + 2 * s, i + 3 * s};
    const void *wr[4];
    _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) wr[q] = w + (size_t)js[q] * K * es;
    __m256 tl[4]; /* the rows' K tails */
    _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) tl[q] =
        r ? ld_w_tail(wr[q], dt, (size_t)K8, r) : _mm256_setzero_ps();
    int t = 0;
    for (; t + 2 <= T; t += 2) {
      const float *x = in + (ptrdiff_t)t * ldi, *y = x + ldi;
      __m256 a[4], b[4];
      _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) a[q] = b[q] = _mm256_setzero_ps();
      int k = 0;
      for (; k + 16 <= K8; k += 16) {
        const __m256 x0 = _mm256_loadu_ps(x + k), y0 = _mm256_loadu_ps(y + k);
        const __m256 x1 = _mm256_loadu_ps(x + k + 8), y1 = _mm256_loadu_ps(y + k + 8);
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
          __m256 w0, w1;
          ld_w16(wr[q], dt, (size_t)k, &w0, &w1);
          a[q] = _mm256_fmadd_ps(w0, x0, a[q]);
          b[q] = _mm256_fmadd_ps(w0, y0, b[q]);
          a[q] = _mm256_fmadd_ps(w1, x1, a[q]);
          b[q] = _mm256_fmadd_ps(w1, y1, b[q]);
        }
      }
      if (k < K8) {
        __m256 xv = _mm256_loadu_ps(x + k), yv = _mm256_loadu_ps(y + k);
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
          __m256 wq = ld_w(wr[q], dt, (size_t)k);
          a[q] = _mm256_fmadd_ps(wq, xv, a[q]);
          b[q] = _mm256_fmadd_ps(wq, yv, b[q]);
        }
      }
      if (r) {
        __m256 xv = _mm256_maskload_ps(x + K8, mask), yv = _mm256_maskload_ps(y + K8, mask);
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
          a[q] = _mm256_fmadd_ps(tl[q], xv, a[q]);
          b[q] = _mm256_fmadd_ps(tl[q], yv, b[q]);
        }
      }
      float h[8];
      _mm256_storeu_ps(h, kn_avx2_hsum8(a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]));
      float *o = out + (ptrdiff_t)t * ldo;
      _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
        put(o + js[q], h[q], acc);
        put(o + ldo + js[q], h[4 + q], acc);
      }
    }
    for (; t < T; t++) {
      const float *x = in + (ptrdiff_t)t * ldi;
      __m256 a[4];
      _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) a[q] = _mm256_setzero_ps();
      int k = 0;
      for (; k + 16 <= K8; k += 16) {
        const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
          __m256 w0, w1;
          ld_w16(wr[q], dt, (size_t)k, &w0, &w1);
          a[q] = _mm256_fmadd_ps(w1, x1, _mm256_fmadd_ps(w0, x0, a[q]));
        }
      }
      if (k < K8) {
        __m256 xv = _mm256_loadu_ps(x + k);
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) a[q] =
            _mm256_fmadd_ps(ld_w(wr[q], dt, (size_t)k), xv, a[q]);
      }
      if (r) {
        __m256 xv = _mm256_maskload_ps(x + K8, mask);
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) a[q] = _mm256_fmadd_ps(tl[q], xv, a[q]);
      }
      float *o = out + (ptrdiff_t)t * ldo;
      _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) put(o + js[q], kn_avx2_hsum(a[q]), acc);
    }
  }
  for (int j = 4 * s; j < n; j++) {
    const void *w0 = w + (size_t)j * K * es;
    __m256 t0 = r ? ld_w_tail(w0, dt, (size_t)K8, r) : _mm256_setzero_ps();
    for (int t = 0; t < T; t++) {
      const float *x = in + (ptrdiff_t)t * ldi;
      __m256 a0 = _mm256_setzero_ps();
      for (int k = 0; k < K8; k += 8)
        a0 = _mm256_fmadd_ps(ld_w(w0, dt, (size_t)k), _mm256_loadu_ps(x + k), a0);
      if (r) a0 = _mm256_fmadd_ps(t0, _mm256_maskload_ps(x + K8, mask), a0);
      put(out + (ptrdiff_t)t * ldo + j, kn_avx2_hsum(a0), acc);
    }
  }
}

KN_AVX2 static void matvec_f32(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                               const void *w, int K, int T, int n, int acc) {
  matvec(out, ldo, in, ldi, w, K, T, n, acc, KN_DTYPE_F32);
}
KN_AVX2 static void matvec_f16(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                               const void *w, int K, int T, int n, int acc) {
  matvec(out, ldo, in, ldi, w, K, T, n, acc, KN_DTYPE_F16);
}
KN_AVX2 static void matvec_bf16(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                                const void *w, int K, int T, int n, int acc) {
  matvec(out, ldo, in, ldi, w, K, T, n, acc, KN_DTYPE_BF16);
}

const kn_cpu_dot_fn kn_cpu_matvec_avx2[KN_DTYPE__COUNT] = {
    [KN_DTYPE_F32] = matvec_f32, [KN_DTYPE_F16] = matvec_f16, [KN_DTYPE_BF16] = matvec_bf16};

/* ---- tile kernel: f32 weights, 4 tokens x 3 features per tile ----------- */

/* One step of a 4 x 3 tile at offset off: the three weight rows' vectors
 * against the four tokens' (masked loads where masked: the K tail). */
KN_AVX2 static inline __attribute__((always_inline)) void
tile_step(__m256 acc[4][3], const float *const w[3], const float *const x[4], int off, __m256i mask,
          int masked) {
  __m256 wv[3];
  _Pragma("GCC unroll 3") for (int j = 0; j < 3; j++) wv[j] =
      masked ? _mm256_maskload_ps(w[j] + off, mask) : _mm256_loadu_ps(w[j] + off);
  _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
    __m256 xv = masked ? _mm256_maskload_ps(x[i] + off, mask) : _mm256_loadu_ps(x[i] + off);
    _Pragma("GCC unroll 3") for (int j = 0; j < 3; j++) acc[i][j] =
        _mm256_fmadd_ps(wv[j], xv, acc[i][j]);
  }
}

KN_AVX2 static void tile_f32(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                             const void *wv, int K, int T, int n, int acc) {
  const float *w = wv;
  const int K8 = K & ~7, r = K - K8;
  const __m256i mask = kn_avx2_mask(r);
  int j = 0;
  for (; j + 3 <= n; j += 3) {
    const float *w0 = w + (size_t)j * K;
    const float *const wr[3] = {w0, w0 + K, w0 + 2 * (size_t)K};
    int t = 0;
    for (; t + 4 <= T; t += 4) {
      const float *x0 = in + (ptrdiff_t)t * ldi;
      const float *const x[4] = {x0, x0 + ldi, x0 + 2 * ldi, x0 + 3 * ldi};
      __m256 a[4][3];
      _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
          _Pragma("GCC unroll 3") for (int f = 0; f < 3; f++) a[i][f] = _mm256_setzero_ps();
      for (int k = 0; k < K8; k += 8)
        tile_step(a, wr, x, k, mask, 0);
      if (r) tile_step(a, wr, x, K8, mask, 1);
      _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
          _Pragma("GCC unroll 3") for (int f = 0; f < 3; f++)
              put(out + (ptrdiff_t)(t + i) * ldo + j + f, kn_avx2_hsum(a[i][f]), acc);
    }
    if (t < T)
      matvec_f32(out + (ptrdiff_t)t * ldo + j, ldo, in + (ptrdiff_t)t * ldi, ldi, w0, K, T - t, 3,
                 acc);
  }
  if (j < n) matvec_f32(out + j, ldo, in, ldi, w + (size_t)j * K, K, T, n - j, acc);
}

KN_AVX2 static void widen_avx2(float *dst, const void *src, enum kn_dtype dt, size_t n) {
  size_t i = 0;
  const uint16_t *s = src;
  if (dt == KN_DTYPE_BF16)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, kn_avx2_bf16(s + i));
  else if (dt == KN_DTYPE_F16)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, kn_avx2_f16(s + i));
  for (; i < n; i++)
    dst[i] = kn_load_f32(src, dt, i);
}

/* ---- RMSNorm ------------------------------------------------------------ */

KN_AVX2 static void rmsnorm_avx2(float *out, const float *x, int d, const void *w,
                                 enum kn_dtype wdt, float eps, enum kn_norm_mode mode) {
  const int d8 = d & ~7, r = d - d8;
  __m256 ss = _mm256_setzero_ps();
  for (int i = 0; i < d8; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    ss = _mm256_fmadd_ps(v, v, ss);
  }
  if (r) {
    __m256 v = _mm256_maskload_ps(x + d8, kn_avx2_mask(r));
    ss = _mm256_fmadd_ps(v, v, ss);
  }
  float rs = (float)(1.0 / sqrt((double)kn_avx2_hsum(ss) / d + (double)eps));
  __m256 rv = _mm256_set1_ps(rs), one = _mm256_set1_ps(1.0f);
  int i = 0;
  for (; i < d8; i += 8) {
    __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + i), rv);
    if (mode == KN_NORM_MUL_W)
      y = _mm256_mul_ps(y, ld_w(w, wdt, (size_t)i));
    else if (mode == KN_NORM_MUL_ONE_PLUS_W)
      y = _mm256_mul_ps(y, _mm256_add_ps(one, ld_w(w, wdt, (size_t)i)));
    _mm256_storeu_ps(out + i, y);
  }
  kn_cpu_norm_scale(out, x, i, d, rs, w, wdt, mode);
}

/* ---- GELU-tanh gating and softcap --------------------------------------- */

/* gelu_tanh(g) = 0.5 g (1 + tanh(u)) = g / (1 + exp(-2u)),
 * u = sqrt(2/pi) (g + 0.044715 g^3): no cancellation for negative g. */
KN_AVX2 static inline __m256 gelu8(__m256 g) {
  __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
  __m256 u = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f),
                           _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), g3, g));
  __m256 e = kn_avx2_exp(_mm256_mul_ps(_mm256_set1_ps(-2.0f), u));
  return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

KN_AVX2 static void gelu_mul_avx2(float *out, const float *gate, const float *up, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i,
                     _mm256_mul_ps(gelu8(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
  if (i < n) { /* the tail through the same vector code, so every element gets the same bits */
    float g[8] = {0}, u[8] = {0}, o[8];
    memcpy(g, gate + i, (size_t)(n - i) * 4);
    memcpy(u, up + i, (size_t)(n - i) * 4);
    _mm256_storeu_ps(o, _mm256_mul_ps(gelu8(_mm256_loadu_ps(g)), _mm256_loadu_ps(u)));
    memcpy(out + i, o, (size_t)(n - i) * 4);
  }
}

/* tanh(y): |y| < 0.625 by an odd minimax polynomial (Cephes tanhf's
 * coefficients), else 1 - 2 / (exp(2|y|) + 1) with the sign put back. */
KN_AVX2 static inline __m256 tanh8(__m256 y) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 ay = _mm256_andnot_ps(sign, y);
  __m256 z = _mm256_mul_ps(y, y);
  __m256 p = _mm256_set1_ps(-5.70498872745e-3f);
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954e-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531e-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036e-1f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422e-1f));
  __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), y, y);
  __m256 is_small = _mm256_cmp_ps(ay, _mm256_set1_ps(0.625f), _CMP_LT_OQ);
  /* every lane small (the common case: softcapped logits of a few units):
   * the blend below would return `small` as it is */
  if (_mm256_movemask_ps(is_small) == 0xff) return small;
  __m256 e = kn_avx2_exp(_mm256_add_ps(ay, ay));
  __m256 big =
      _mm256_sub_ps(_mm256_set1_ps(1.0f),
                    _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
  big = _mm256_or_ps(big, _mm256_and_ps(y, sign));
  return _mm256_blendv_ps(big, small, is_small);
}

KN_AVX2 static void softcap_avx2(float *out, const float *a, float cap, size_t n) {
  __m256 c = _mm256_set1_ps(cap), ic = _mm256_set1_ps(1.0f / cap);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(tanh8(_mm256_mul_ps(_mm256_loadu_ps(a + i), ic)), c));
  if (i < n) { /* the tail through the same vector code */
    float t[8] = {0}, o[8];
    memcpy(t, a + i, (n - i) * 4);
    _mm256_storeu_ps(o, _mm256_mul_ps(tanh8(_mm256_mul_ps(_mm256_loadu_ps(t), ic)), c));
    memcpy(out + i, o, (n - i) * 4);
  }
}

/* ---- elementwise (exact: the same bits as the reference) ---------------- */

KN_AVX2 static void add_avx2(float *out, const float *a, const float *b, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  for (; i < n; i++)
    out[i] = a[i] + b[i];
}

KN_AVX2 static void mul_avx2(float *out, const float *a, const float *b, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  for (; i < n; i++)
    out[i] = a[i] * b[i];
}

KN_AVX2 static void scale_avx2(float *out, const float *a, float s, size_t n) {
  __m256 sv = _mm256_set1_ps(s);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), sv));
  for (; i < n; i++)
    out[i] = a[i] * s;
}

/* First index of the largest non-NaN value (kn_cpu_argmax_row_ref's answer):
 * one pass for the maximum (max_ps returns its second operand when the first
 * is NaN, so NaNs never enter the running maxima), one for the first index
 * equal to it. A vocabulary-sized row per sampled token makes this worth
 * the two passes. */
KN_AVX2 int kn_cpu_argmax_row_avx2(const float *row, int n, float *max_out) {
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm256_max_ps(_mm256_loadu_ps(row + i), m0);
    m1 = _mm256_max_ps(_mm256_loadu_ps(row + i + 8), m1);
    m2 = _mm256_max_ps(_mm256_loadu_ps(row + i + 16), m2);
    m3 = _mm256_max_ps(_mm256_loadu_ps(row + i + 24), m3);
  }
  for (; i + 8 <= n; i += 8)
    m0 = _mm256_max_ps(_mm256_loadu_ps(row + i), m0);
  float m = kn_avx2_hmax(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
  for (; i < n; i++)
    if (row[i] > m) m = row[i];
  /* the first index equal to the maximum (all NaN: none) */
  __m256 mv = _mm256_set1_ps(m);
  for (i = 0; i + 8 <= n; i += 8) {
    int bits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(row + i), mv, _CMP_EQ_OQ));
    if (bits) return kn_cpu_argmax_first_eq(row, i + __builtin_ctz((unsigned)bits), n, m, max_out);
  }
  return kn_cpu_argmax_first_eq(row, i, n, m, max_out);
}

void kn_cpu_dsp_init_avx2(struct kn_cpu_dsp *dsp) {
  dsp->isa = KN_CPU_ISA_AVX2;
  for (int d = 0; d < KN_DTYPE__COUNT; d++)
    if (kn_cpu_matvec_avx2[d]) dsp->matvec[d] = kn_cpu_matvec_avx2[d];
  dsp->tile_f32 = tile_f32;
  dsp->tile_tokens = 4;
  dsp->tile_min_t = 16; /* widen + tile beats the two-token matvec from about here */
  dsp->widen = widen_avx2;
  dsp->rmsnorm = rmsnorm_avx2;
  dsp->gelu_mul = gelu_mul_avx2;
  dsp->add = add_avx2;
  dsp->mul = mul_avx2;
  dsp->scale = scale_avx2;
  dsp->softcap = softcap_avx2;
  dsp->attn = kn_cpu_attn_avx2;
  dsp->attn_tile = kn_cpu_attn_tile_avx2;
  dsp->attn_part = kn_cpu_attn_part_avx2;
}
