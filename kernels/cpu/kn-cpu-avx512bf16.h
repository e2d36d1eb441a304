/* kn-cpu-avx512bf16.h — what the AVX-512-BF16 kernel files (and the AMX
 * table's code around its tiles) share: their target attribute; the fixed
 * transpose-and-sum of 16 accumulators that ends every bf16 dot product (the
 * matmul's outputs, the attention's scores), so that an output's bits do not
 * depend on which of the 16 it was; the rounding of inputs to bf16; and the
 * bf16 attention's softmax step. Include only in files whose kernels run
 * after a CPU check. */
#ifndef LMSERVE_KN_CPU_AVX512BF16_H
#define LMSERVE_KN_CPU_AVX512BF16_H
#include <immintrin.h>

#include "kernels/cpu/kn-cpu-avx2.h"
#include "kernels/cpu/kn-cpu-impl.h"

#define KN_BF16 \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512dq,avx512bw,avx512vl,avx512bf16")))

/* 32 inputs at x rounded to bf16 (to nearest even, denormals to zero) by one
 * vcvtne2ps2bf16: the first r of them (all when r >= 32), zeros after; x is
 * not read when r <= 0. */
KN_BF16 static inline __m512i kn_bf16_round32(const float *x, int r) {
  if (r <= 0) return _mm512_setzero_si512();
  __mmask16 m0 = r >= 16 ? 0xffff : (__mmask16)((1u << r) - 1);
  __mmask16 m1 = r >= 32 ? 0xffff : r <= 16 ? 0 : (__mmask16)((1u << (r - 16)) - 1);
  __m512 lo = _mm512_maskz_loadu_ps(m0, x), hi = _mm512_maskz_loadu_ps(m1, x + 16);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* The partner of an odd key block's last V row in the bf16 attention kernels
 * (kn-cpu-attn-bf16.c): zeros. */
extern const uint16_t kn_bf16_zero_row[KN_MAX_HEAD_DIM];

/* The softmax half of one key block for nr query vectors, as the bf16
 * attention kernels (AVX-512-BF16 and AMX) take it: each vector's step over
 * its scores p[r] (kn_avx2_softmax_block; corr[r], m[r] and l[r] move on),
 * then its probabilities of the visible keys, p[r][vj[n]] for n < n_vis,
 * rounded to bf16 into pp[r] in pairs, zeros after them. */
KN_BF16 static inline void kn_bf16_block_probs(float *const *p, int nr, const int *vj, int n_vis,
                                               float *m, float *l, float *corr,
                                               uint32_t (*pp)[KN_ATTN_BLOCK / 2]) {
  for (int r = 0; r < nr; r++) {
    corr[r] = kn_avx2_softmax_block(p[r], &m[r], &l[r]);
    _Alignas(64) float c[KN_ATTN_BLOCK] = {0};
    for (int n = 0; n < n_vis; n++)
      c[n] = p[r][vj[n]];
    _mm512_store_si512(pp[r],
                       (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(c + 16), _mm512_load_ps(c)));
  }
}

/* Lane i of the result: accumulator a[i]'s lanes summed by the canonical
 * tree (i + 8, then i + 4, i + 2, i + 1). */
KN_BF16 static inline __attribute__((always_inline)) __m512 kn_bf16_reduce16(const __m512 a[16]) {
  __m512 b[8], c[4], d[2];
  /* b[p], lanes 0-7: a[2p]'s halves summed; lanes 8-15: a[2p+1]'s */
  _Pragma("GCC unroll 8") for (int p = 0; p < 8; p++) b[p] =
      _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x44),
                    _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xee));
  /* c[r], quarter j: a[4r + j]'s quarters summed */
  _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) c[r] =
      _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * r], b[2 * r + 1], 0x88),
                    _mm512_shuffle_f32x4(b[2 * r], b[2 * r + 1], 0xdd));
  /* d[s], quarter j: pairs of a[8s + j], then of a[8s + 4 + j] */
  _Pragma("GCC unroll 2") for (int s = 0; s < 2; s++) {
    __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(c[2 * s]), _mm512_castps_pd(c[2 * s + 1]));
    __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(c[2 * s]), _mm512_castps_pd(c[2 * s + 1]));
    d[s] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
  }
  /* quarter j, lane m: a[j + 4m]'s sum */
  __m512 e =
      _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xdd));
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(idx, e);
}

#endif
