/* kn-cuda-dev.cuh — device helpers shared by the .cu files: element loads
 * and stores per dtype, warp and block reductions (and the block's best
 * candidate), GELU-tanh, grid sizing and row-sliced launches, and the
 * few-rows matmuls' dot products (bf16 / f16 and e4m3 weights). Included
 * only by nvcc; everything here is static / inline (no symbols exported). */
#ifndef LMSERVE_KN_CUDA_DEV_CUH
#define LMSERVE_KN_CUDA_DEV_CUH
#include <stdint.h>

/* before cuda_fp16.h: kn-dtype.h has locals named `half`, which -Wshadow
 * would flag against cuda_fp16.h's typedef */
#include "kernels/cuda/kn-cuda-impl.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

/* Element i of a tensor of element type T, widened to f32 (exact). */
__device__ __forceinline__ float kn_load(const float *p, size_t i) {
  return p[i];
}
__device__ __forceinline__ float kn_load(const __half *p, size_t i) {
  return __half2float(p[i]);
}
__device__ __forceinline__ float kn_load(const __nv_bfloat16 *p, size_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ float kn_load(const __nv_fp8_e4m3 *p, size_t i) {
  return (float)p[i]; /* exact */
}

/* Stores f32 v as element i, rounding to nearest even. */
__device__ __forceinline__ void kn_store(float *p, size_t i, float v) {
  p[i] = v;
}
__device__ __forceinline__ void kn_store(__half *p, size_t i, float v) {
  p[i] = __float2half_rn(v);
}
__device__ __forceinline__ void kn_store(__nv_bfloat16 *p, size_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
/* e4m3, nearest even, saturating to +-448 (kn_f32_to_f8e4m3 on the host) */
__device__ __forceinline__ void kn_store(__nv_fp8_e4m3 *p, size_t i, float v) {
  p[i].__x = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ float kn_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float kn_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Warp (kn_warp_sum or kn_warp_max) over the block (blockDim.x a multiple of
 * 32, <= 1024): within each warp, then over the warps' results, the missing
 * warps counting as 0; every thread gets the result. Uses 33 floats of shared
 * memory passed in. */
template <float (*Warp)(float)>
__device__ __forceinline__ float kn_block_reduce(float v, float *sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = Warp(v);
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    float t = lane < nw ? sh[lane] : 0.0f;
    t = Warp(t);
    if (lane == 0) sh[32] = t;
  }
  __syncthreads();
  float r = sh[32];
  __syncthreads(); /* sh may be reused by the caller right after */
  return r;
}

/* Sum over the block (as kn_block_reduce). */
__device__ __forceinline__ float kn_block_sum(float v, float *sh) {
  return kn_block_reduce<kn_warp_sum>(v, sh);
}

/* Maximum over the block of values >= 0 (as kn_block_reduce). */
__device__ __forceinline__ float kn_block_max(float v, float *sh) {
  return kn_block_reduce<kn_warp_max>(v, sh);
}

#define KN_NONE_ID 0x7fffffff /* an index of "nothing seen yet" (or only NaN) */

/* Does candidate (bv, bi) beat (av, ai)? The larger value, then the lower
 * index; KN_NONE_ID never wins (argmax and sampling pick by it). */
__device__ __forceinline__ bool kn_beats(float bv, int bi, float av, int ai) {
  if (bi == KN_NONE_ID) return false;
  if (ai == KN_NONE_ID) return true;
  return bv > av || (bv == av && bi < ai);
}

/* The block's best candidate (v, i) of every thread's under Beats (does
 * (bv, bi) beat (av, ai)?): within each warp, then over the warps' bests in
 * wv, wi (blockDim.x / 32 entries of shared memory) by thread 0, the only
 * thread that gets the result. The argmax, top-k and sampling kernels pick
 * with it; the caller syncs before wv, wi are written again. */
template <bool (*Beats)(float, int, float, int)>
__device__ __forceinline__ void kn_block_best(float &v, int &i, float *wv, int *wi) {
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, v, o);
    int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (Beats(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
  if ((threadIdx.x & 31) == 0) {
    wv[threadIdx.x >> 5] = v;
    wi[threadIdx.x >> 5] = i;
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int k = 1; k < (int)(blockDim.x >> 5); k++)
      if (Beats(wv[k], wi[k], v, i)) {
        v = wv[k];
        i = wi[k];
      }
}

/* gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))): the
 * activation of the bias-act, gated-product and fused MLP kernels, which so
 * agree bit for bit. */
__device__ __forceinline__ float kn_gelu_tanh(float g) {
  float u = 0.7978845608028654f * (g + 0.044715f * g * g * g);
  return 0.5f * g * (1.0f + tanhf(u));
}

/* Blocks for n items at `per` items per block, capped for grid-stride loops. */
static inline unsigned kn_grid(size_t n, unsigned per, unsigned cap) {
  size_t g = (n + per - 1) / per;
  if (g < 1) g = 1;
  return g > cap ? cap : (unsigned)g;
}

/* The launches of a row-wise kernel over T rows of N elements: one thread
 * per element, 256 along a row per block, blockIdx.y the row within a slice
 * of at most 65535 rows (gridDim.y's cap). launch(t0, grid) launches the
 * slice that starts at row t0. */
template <typename Launch> static inline void kn_row_slices(int T, int N, Launch launch) {
  for (int t0 = 0; t0 < T; t0 += 65535) {
    int nt = T - t0 < 65535 ? T - t0 : 65535;
    launch(t0, dim3((unsigned)((N + 255) / 256), (unsigned)nt));
  }
}

/* The thread's warp over the grid (x only): the few-rows kernels' output row. */
__device__ __forceinline__ int kn_warp_id() {
  return (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
}

/* The few-rows kernels' end: each row t < TT's warp sum of acc[t] into
 * out[t, n] (added to it when accumulating), written by lane 0. */
template <int TT>
__device__ __forceinline__ void kn_gemv_store(const float (&acc)[TT], float *out, ptrdiff_t ldo,
                                              int n, int lane, int accumulate) {
#pragma unroll
  for (int t = 0; t < TT; t++) {
    float s = kn_warp_sum(acc[t]);
    if (lane == 0) {
      float *o = out + (ptrdiff_t)t * ldo + n;
      *o = accumulate ? *o + s : s;
    }
  }
}

/* The few-rows kernels' launch shape: a warp per output row, KN_GEMV_WARPS
 * warps a block. */
#define KN_GEMV_WARPS 8
static inline dim3 kn_gemv_grid(int N) {
  return dim3((unsigned)((N + KN_GEMV_WARPS - 1) / KN_GEMV_WARPS));
}

/* The cases of a switch over a few-rows launch's row count: CASE(1) .. CASE(8)
 * (KN_CUDA_GEMV_MAX_T), each launching the kernel instantiated for it. */
#define KN_GEMV_T_CASES(CASE)                                                                      \
  CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)

/* The two elements of a 32-bit word of bf16 / f16 values, widened (exact). */
__device__ __forceinline__ float2 widen2(uint32_t u, const __nv_bfloat16 *) {
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}
__device__ __forceinline__ float2 widen2(uint32_t u, const __half *) {
  return make_float2(__half2float(__ushort_as_half((unsigned short)(u & 0xffffu))),
                     __half2float(__ushort_as_half((unsigned short)(u >> 16))));
}

/* x rounded to the weights' type and widened back (exact in f32). */
__device__ __forceinline__ float round_to(float x, const __nv_bfloat16 *) {
  return __bfloat162float(__float2bfloat16_rn(x));
}
__device__ __forceinline__ float round_to(float x, const __half *) {
  return __half2float(__float2half_rn(x));
}

/* acc[t] += the lane's share (16-byte vectors v = lane, lane + 32, ...) of
 * sum_k round(in[t, k]) * wrow[k] for t < TT: each input rounded to the weights'
 * type (nearest even) as the narrowing before cuBLAS does, exact f32 products,
 * f32 sums in this order. K % 8 == 0; wrow, in and every input row 16-byte
 * aligned. The few-rows matmuls (kn-cuda-gemv.cu, kn-cuda-fused.cu) share it,
 * so they agree bit for bit; e4m3 weights have their own overload below. */
template <typename W, int TT>
__device__ __forceinline__ void kn_gemv_dot(float (&acc)[TT], const W *wrow, const float *in,
                                            ptrdiff_t ldi, int K, int lane) {
  const uint4 *wr = reinterpret_cast<const uint4 *>(wrow);
  const W *tag = nullptr;
  for (int v = lane; v < K / 8; v += 32) {
    uint4 q = wr[v];
    float2 w01 = widen2(q.x, tag), w23 = widen2(q.y, tag), w45 = widen2(q.z, tag),
           w67 = widen2(q.w, tag);
#pragma unroll
    for (int t = 0; t < TT; t++) {
      const float4 *x = reinterpret_cast<const float4 *>(in + (ptrdiff_t)t * ldi) + 2 * v;
      float4 a = x[0], b = x[1];
      float s = acc[t];
      s = fmaf(round_to(a.x, tag), w01.x, s);
      s = fmaf(round_to(a.y, tag), w01.y, s);
      s = fmaf(round_to(a.z, tag), w23.x, s);
      s = fmaf(round_to(a.w, tag), w23.y, s);
      s = fmaf(round_to(b.x, tag), w45.x, s);
      s = fmaf(round_to(b.y, tag), w45.y, s);
      s = fmaf(round_to(b.z, tag), w67.x, s);
      s = fmaf(round_to(b.w, tag), w67.y, s);
      acc[t] = s;
    }
  }
}

/* e4m3 code c widened (exact: every e4m3 value is a half). */
__device__ __forceinline__ float e4m3_value(unsigned c) {
  __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3);
  return __half2float(__half(h));
}

/* The four codes of a 32-bit word, widened. */
__device__ __forceinline__ void widen4(unsigned u, float *w) {
  w[0] = e4m3_value(u & 0xffu);
  w[1] = e4m3_value((u >> 8) & 0xffu);
  w[2] = e4m3_value((u >> 16) & 0xffu);
  w[3] = e4m3_value(u >> 24);
}

/* kn_gemv_dot for a row of e4m3 codes (kn_matmul_fp8's definition without
 * its scale): 16-byte vectors of 16 codes, each widened exactly, each input
 * rounded to bf16 (nearest even), exact f32 products, f32 sums in this order.
 * K % 16 == 0; wrow, in and every input row 16-byte aligned. The FP8 few-rows
 * kernel (kn-cuda-fp8.cu) and the fused ones over FP8 weights
 * (kn-cuda-fused.cu) share it and apply the scale to the warp's sum, so they
 * agree bit for bit. Called with the template arguments deduced, overload
 * resolution picks it over the generic one for __nv_fp8_e4m3 rows. */
template <int TT>
__device__ __forceinline__ void kn_gemv_dot(float (&acc)[TT], const __nv_fp8_e4m3 *wrow,
                                            const float *in, ptrdiff_t ldi, int K, int lane) {
  const uint4 *wr = reinterpret_cast<const uint4 *>(wrow);
  const __nv_bfloat16 *tag = nullptr;
  for (int v = lane; v < K / 16; v += 32) {
    uint4 q = wr[v];
    float wv[16];
    widen4(q.x, wv);
    widen4(q.y, wv + 4);
    widen4(q.z, wv + 8);
    widen4(q.w, wv + 12);
#pragma unroll
    for (int t = 0; t < TT; t++) {
      const float4 *x = reinterpret_cast<const float4 *>(in + (ptrdiff_t)t * ldi) + 4 * v;
      float s = acc[t];
#pragma unroll
      for (int j = 0; j < 4; j++) {
        float4 a = x[j];
        s = fmaf(round_to(a.x, tag), wv[4 * j], s);
        s = fmaf(round_to(a.y, tag), wv[4 * j + 1], s);
        s = fmaf(round_to(a.z, tag), wv[4 * j + 2], s);
        s = fmaf(round_to(a.w, tag), wv[4 * j + 3], s);
      }
      acc[t] = s;
    }
  }
}

#endif
