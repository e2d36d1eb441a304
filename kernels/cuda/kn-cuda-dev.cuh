/* kn-cuda-dev.cuh — device helpers shared by the .cu files: element loads
 * and stores per dtype, warp and block reductions, grid sizing. Included only
 * by nvcc; everything here is static / inline (no symbols exported). */
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

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread
 * gets the result. Uses 33 floats of shared memory passed in. */
__device__ __forceinline__ float kn_block_sum(float v, float *sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = kn_warp_sum(v);
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    float t = lane < nw ? sh[lane] : 0.0f;
    t = kn_warp_sum(t);
    if (lane == 0) sh[32] = t;
  }
  __syncthreads();
  float r = sh[32];
  __syncthreads(); /* sh may be reused by the caller right after */
  return r;
}

/* Blocks for n items at `per` items per block, capped for grid-stride loops. */
static inline unsigned kn_grid(size_t n, unsigned per, unsigned cap) {
  size_t g = (n + per - 1) / per;
  if (g < 1) g = 1;
  return g > cap ? cap : (unsigned)g;
}

#endif
