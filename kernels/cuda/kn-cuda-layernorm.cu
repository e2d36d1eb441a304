/* kn-cuda-layernorm.cu — LayerNorm with weight and bias,
 * out = (x - mean) / sqrt(var + eps) * w + b, one block per row. Two passes
 * over the row (mean, then the centred sum of squares), each accumulated in
 * f32 per thread and reduced over the block. out may alias x: each thread
 * rewrites only the elements it read, after both reductions. */
#include "kernels/cuda/kn-cuda-dev.cuh"

template <typename W>
__global__ void layernorm_kernel(float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx, int d,
                                 const W *w, const W *b, float eps) {
  __shared__ float sh[33];
  const float *xr = x + (ptrdiff_t)blockIdx.x * ldx;
  float *o = out + (ptrdiff_t)blockIdx.x * ldo;
  float s = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x)
    s += xr[i];
  float mean = kn_block_sum(s, sh) / (float)d;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float c = xr[i] - mean;
    ss = fmaf(c, c, ss);
  }
  float rstd = rsqrtf(kn_block_sum(ss, sh) / (float)d + eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x)
    o[i] = (xr[i] - mean) * rstd * kn_load(w, i) + kn_load(b, i);
}

extern "C" cudaError_t kn_cuda_launch_layernorm(cudaStream_t s, float *out, ptrdiff_t ldo,
                                                const float *x, ptrdiff_t ldx, int rows, int d,
                                                const void *w, const void *b, enum kn_dtype wdt,
                                                float eps) {
  unsigned threads = d >= 2048 ? 512 : d >= 512 ? 256 : d >= 128 ? 128 : 32;
  dim3 block(threads);
  /* gridDim.x is 2^31 - 1: every realistic row count fits in one launch */
  dim3 grid((unsigned)rows);
  switch (wdt) {
  case KN_DTYPE_F32:
    layernorm_kernel<<<grid, block, 0, s>>>(out, ldo, x, ldx, d, (const float *)w, (const float *)b,
                                            eps);
    break;
  case KN_DTYPE_F16:
    layernorm_kernel<<<grid, block, 0, s>>>(out, ldo, x, ldx, d, (const __half *)w,
                                            (const __half *)b, eps);
    break;
  case KN_DTYPE_BF16:
    layernorm_kernel<<<grid, block, 0, s>>>(out, ldo, x, ldx, d, (const __nv_bfloat16 *)w,
                                            (const __nv_bfloat16 *)b, eps);
    break;
  default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
