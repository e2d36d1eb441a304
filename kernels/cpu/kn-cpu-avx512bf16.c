/* kn-cpu-avx512bf16.c — the bf16 mode's matmul on AVX-512-BF16: inputs
 * rounded to bf16 once per call (round_rows), then vdpbf16ps against the bf16
 * weight rows as they lie in the checkpoint, no packing.
 *
 * One output element, wherever it is computed (a decode row, a prefill tile,
 * matmul_rows), is the same sequence: one 16-lane accumulator, vdpbf16ps over
 * k-blocks of 32 in order (the last block masked, the inputs zero past K),
 * then the lanes summed as (i, i+8), (i, i+4), (i, i+2), (0, 1) — the tree of
 * kn_bf16_reduce16, which sums 16 accumulators at once. So a row's logits do not
 * depend on how many rows share the matmul.
 *
 * Why only in the bf16 mode: vdpbf16ps multiplies bf16 by bf16. Keeping the
 * default path's f32 accuracy would take the activations split into three
 * bf16 parts (8 + 8 + 8 bits of mantissa), three vdpbf16ps per 32 products
 * against two f32 FMAs for the same 32 products on the widened weights: on
 * processors where vdpbf16ps issues as fast as an FMA (BENCHMARKS.md), that
 * is slower than the AVX-512 table. Rounded to one bf16 part, as GPUs and
 * transformers' bf16 mode run, it does twice an FMA's work per instruction. */
#include <immintrin.h>

#include "kernels/cpu/kn-cpu-avx512bf16.h"
#include "kernels/cpu/kn-cpu-impl.h"

#define INLINE static inline __attribute__((always_inline))

/* Bytes of input rows per token block of the tile path (stays in L1 while
 * the feature groups of a work unit pass over it). */
#define BF16_X_BYTES (16 * 1024)

KN_BF16 static void round_rows(uint16_t *dst, ptrdiff_t ldd, const float *in, ptrdiff_t ldi, int T,
                               int K) {
  for (int t = 0; t < T; t++) {
    const float *x = in + (ptrdiff_t)t * ldi;
    uint16_t *d = dst + (ptrdiff_t)t * ldd;
    for (int k = 0; k < K; k += 32)
      _mm512_storeu_si512(d + k, kn_bf16_round32(x + k, K - k));
  }
}

/* Stores (acc: adds) the reduced outputs s of TT tokens x TF features, lane
 * t * TF + f for token t, feature f < nf. */
KN_BF16 INLINE void put_tile(float *out, ptrdiff_t ldo, __m512 s, int nf, int acc, const int TF,
                             const int TT) {
  if (TF == 4 && nf == 4) { /* token t's 4 outputs are quarter t */
    _Pragma("GCC unroll 4") for (int t = 0; t < TT; t++) {
      __m128 v = _mm512_extractf32x4_ps(s, 0);
      if (t == 1) v = _mm512_extractf32x4_ps(s, 1);
      if (t == 2) v = _mm512_extractf32x4_ps(s, 2);
      if (t == 3) v = _mm512_extractf32x4_ps(s, 3);
      float *o = out + t * ldo;
      _mm_storeu_ps(o, acc ? _mm_add_ps(_mm_loadu_ps(o), v) : v);
    }
    return;
  }
  float lanes[16];
  _mm512_storeu_ps(lanes, s);
  for (int t = 0; t < TT; t++) {
    float *o = out + t * ldo;
    for (int f = 0; f < nf; f++)
      o[f] = acc ? o[f] + lanes[t * TF + f] : lanes[t * TF + f];
  }
}

/* Outputs of TT tokens x TF features (TT * TF <= 16; nf <= TF of the features
 * are real, the others repeat feature 0 and are not stored): accumulator
 * t * TF + f is token t against weight row f. */
KN_BF16 INLINE void tile(float *out, ptrdiff_t ldo, const uint16_t *x, ptrdiff_t ldx,
                         const uint16_t *w, int K, int nf, int acc, const int TF, const int TT) {
  const uint16_t *wr[16];
  _Pragma("GCC unroll 16") for (int f = 0; f < TF; f++) wr[f] = w + (size_t)(f < nf ? f : 0) * K;
  __m512 a[16];
  _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
  const int KF = K / 32;
  /* the next TF rows, a line per row and block, while these stream: the
   * next tile's weights whether the tokens fit one block (decode, small
   * batches: from memory) or not (prefill: the next group of the chunk) */
  const char *next = (const char *)(w + (size_t)TF * K);
  int b = 0;
  for (; b < KF; b++) {
    __m512i wv[16];
    _Pragma("GCC unroll 16") for (int f = 0; f < TF; f++) {
      wv[f] = _mm512_loadu_si512(wr[f] + 32 * b);
      _mm_prefetch(next + ((size_t)b * TF + f) * 64, _MM_HINT_T0);
    }
    _Pragma("GCC unroll 4") for (int t = 0; t < TT; t++) {
      __m512bh xv = (__m512bh)_mm512_loadu_si512(x + t * ldx + 32 * b);
      _Pragma("GCC unroll 16") for (int f = 0; f < TF; f++) a[t * TF + f] =
          _mm512_dpbf16_ps(a[t * TF + f], (__m512bh)wv[f], xv);
    }
  }
  if (K & 31) {
    const __mmask32 m = (__mmask32)((1u << (K & 31)) - 1);
    _Pragma("GCC unroll 4") for (int t = 0; t < TT; t++) {
      __m512bh xv = (__m512bh)_mm512_loadu_si512(x + t * ldx + 32 * b);
      _Pragma("GCC unroll 16") for (int f = 0; f < TF; f++) a[t * TF + f] = _mm512_dpbf16_ps(
          a[t * TF + f], (__m512bh)_mm512_maskz_loadu_epi16(m, wr[f] + 32 * b), xv);
    }
  }
  put_tile(out, ldo, kn_bf16_reduce16(a), nf, acc, TF, TT);
}

/* One token against 4 rows (decode: bound by the weight stream), each
 * accumulator's 16 lanes as two 8-lane halves, the same operations per lane
 * as tile's (lane l of a 32-element block reads elements 2l and 2l + 1
 * either way), so the same bits. The weights come in 32-byte loads: with
 * 64-byte ones, from checkpoint rows at 16 mod 64 bytes, the decode read
 * its weights about 15% slower than the AVX2 matvec (perf samples against
 * the streaming read measured beside it); with these, as fast. Each block's
 * 4 lines are prefetched BF16_PF_BYTES ahead in the group's linear order: with
 * the weights in huge pages, 16 KiB ahead ran decode at about 80% of the
 * bound where the next group (5 KiB for K = 640) gave 75% (BENCHMARKS.md,
 * "Weights in huge pages"). */
#define BF16_PF_BYTES 16384
KN_BF16 static void tile4x1h(float *out, const uint16_t *x, const uint16_t *w, int K, int nf,
                             int acc) {
  const uint16_t *wr[4];
  for (int f = 0; f < 4; f++)
    wr[f] = w + (size_t)(f < nf ? f : 0) * K;
  __m256 lo[4], hi[4];
  for (int f = 0; f < 4; f++)
    lo[f] = hi[f] = _mm256_setzero_ps();
  const int KF = K / 32;
  const char *next = (const char *)w + BF16_PF_BYTES;
  int b = 0;
  for (; b < KF; b++) {
    __m256bh x0 = (__m256bh)_mm256_loadu_si256((const __m256i *)(x + 32 * b));
    __m256bh x1 = (__m256bh)_mm256_loadu_si256((const __m256i *)(x + 32 * b + 16));
    _Pragma("GCC unroll 4") for (int f = 0; f < 4; f++) {
      _mm_prefetch(next + ((size_t)b * 4 + f) * 64, _MM_HINT_T0);
      lo[f] = _mm256_dpbf16_ps(lo[f],
                               (__m256bh)_mm256_loadu_si256((const __m256i *)(wr[f] + 32 * b)), x0);
      hi[f] = _mm256_dpbf16_ps(
          hi[f], (__m256bh)_mm256_loadu_si256((const __m256i *)(wr[f] + 32 * b + 16)), x1);
    }
  }
  __m512 a[16];
  for (int i = 0; i < 16; i++)
    a[i] = _mm512_setzero_ps();
  for (int f = 0; f < 4; f++)
    a[f] = _mm512_insertf32x8(_mm512_castps256_ps512(lo[f]), hi[f], 1);
  if (K & 31) {
    const __mmask32 m = (__mmask32)((1u << (K & 31)) - 1);
    __m512bh xv = (__m512bh)_mm512_loadu_si512(x + 32 * b);
    for (int f = 0; f < 4; f++)
      a[f] = _mm512_dpbf16_ps(a[f], (__m512bh)_mm512_maskz_loadu_epi16(m, wr[f] + 32 * b), xv);
  }
  put_tile(out, 0, kn_bf16_reduce16(a), nf, acc, 4, 1);
}
#define DEF_TILE4(TT)                                                                              \
  KN_BF16 static void tile4x##TT(float *out, ptrdiff_t ldo, const uint16_t *x, ptrdiff_t ldx,      \
                                 const uint16_t *w, int K, int nf, int acc) {                      \
    tile(out, ldo, x, ldx, w, K, nf, acc, 4, TT);                                                  \
  }
DEF_TILE4(1)
DEF_TILE4(2)
DEF_TILE4(3)
DEF_TILE4(4)

typedef void (*tile_fn)(float *out, ptrdiff_t ldo, const uint16_t *x, ptrdiff_t ldx,
                        const uint16_t *w, int K, int nf, int acc);
static const tile_fn tiles4[5] = {NULL, tile4x1, tile4x2, tile4x3, tile4x4};

/* kn_cpu_dsp.dot_bf16: one token, 4 weight rows at a time; more, groups of
 * 4 rows against blocks of tokens that stay in L1, 4 tokens at a time. */
KN_BF16 static void dot_bf16(float *out, ptrdiff_t ldo, const uint16_t *x, ptrdiff_t ldx,
                             const uint16_t *w, int K, int T, int n, int acc) {
  if (T == 1) {
    for (int j = 0; j < n; j += 4)
      tile4x1h(out + j, x, w + (size_t)j * K, K, n - j < 4 ? n - j : 4, acc);
    return;
  }
  int tb = BF16_X_BYTES / (int)(2 * ldx);
  tb = tb < 4 ? 4 : tb & ~3;
  for (int t0 = 0; t0 < T; t0 += tb) {
    int te = T - t0 < tb ? T : t0 + tb;
    for (int j = 0; j < n; j += 4) {
      int nf = n - j < 4 ? n - j : 4;
      const uint16_t *wj = w + (size_t)j * K;
      for (int t = t0; t < te; t += 4) {
        int tt = te - t < 4 ? te - t : 4;
        tiles4[tt](out + (ptrdiff_t)t * ldo + j, ldo, x + (ptrdiff_t)t * ldx, ldx, wj, K, nf, acc);
      }
    }
  }
}

void kn_cpu_dsp_init_avx512bf16(struct kn_cpu_dsp *dsp) {
  dsp->isa = KN_CPU_ISA_AVX512BF16;
  dsp->round_bf16 = round_rows;
  dsp->dot_bf16 = dot_bf16;
  dsp->attn_bf16 = kn_cpu_attn_bf16;
  dsp->attn_tile_bf16 = kn_cpu_attn_tile_bf16;
}
