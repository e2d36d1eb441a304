/* kn-cuda-rmsnorm.cu — RMSNorm in its three forms (x * r * w, x * r * (1 + w),
 * x * r), r = rsqrt(mean(x^2) + eps), one block per row. The sum of squares
 * is accumulated in f32 per thread, then reduced over the block. out may
 * alias x: each thread rewrites only the elements it read. */
#include "kernels/cuda/kn-cuda-dev.cuh"

template <typename W>
__global__ void rmsnorm_kernel(float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx, int d,
                               const W *w, float eps, int mode) {
  __shared__ float sh[33];
  const float *xr = x + (ptrdiff_t)blockIdx.x * ldx;
  float *o = out + (ptrdiff_t)blockIdx.x * ldo;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x)
    ss = fmaf(xr[i], xr[i], ss);
  ss = kn_block_sum(ss, sh);
  float r = rsqrtf(ss / (float)d + eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float y = xr[i] * r;
    if (mode == KN_NORM_MUL_W)
      y *= kn_load(w, i);
    else if (mode == KN_NORM_MUL_ONE_PLUS_W)
      y *= 1.0f + kn_load(w, i);
    o[i] = y;
  }
}

extern "C" cudaError_t kn_cuda_launch_rmsnorm(cudaStream_t s, float *out, ptrdiff_t ldo,
                                              const float *x, ptrdiff_t ldx, int rows, int d,
                                              const void *w, enum kn_dtype wdt, float eps,
                                              enum kn_norm_mode mode) {
  unsigned threads = d >= 2048 ? 512 : d >= 512 ? 256 : d >= 128 ? 128 : 32;
  dim3 grid(rows), block(threads);
  int m = (int)mode;
  if (mode == KN_NORM_NO_W) wdt = KN_DTYPE_F32; /* w unused (may be NULL) */
  switch (wdt) {
  case KN_DTYPE_F32:
    rmsnorm_kernel<<<grid, block, 0, s>>>(out, ldo, x, ldx, d, (const float *)w, eps, m);
    break;
  case KN_DTYPE_F16:
    rmsnorm_kernel<<<grid, block, 0, s>>>(out, ldo, x, ldx, d, (const __half *)w, eps, m);
    break;
  case KN_DTYPE_BF16:
    rmsnorm_kernel<<<grid, block, 0, s>>>(out, ldo, x, ldx, d, (const __nv_bfloat16 *)w, eps, m);
    break;
  default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
