/* kn-cuda-gemv.cu — matmuls of a few input rows (T <= KN_CUDA_GEMV_MAX_T:
 * decode, small batches, speculative verification) against bf16 / f16
 * weights, in one launch. Each warp reads one weight row once, in 16-byte
 * vectors, and multiplies it with every input row, each input rounded to the
 * weights' type on the fly (round to nearest even, as the narrowing before
 * cuBLAS does): products exact in f32, sums in f32, one warp reduction per
 * output. It replaces a narrowing kernel and cublasGemmEx, whose host cost
 * is most of a decode step (BENCHMARKS.md, "The CUDA backend on a GPU"). */
#include "kernels/cuda/kn-cuda-dev.cuh"

/* One warp per weight row n: out[t, n] (+)= sum_k round(in[t, k]) * w[n, k]
 * for t < TT. K % 8 == 0; w, in and every input row 16-byte aligned. */
template <typename W, int TT>
__global__ void gemv_kernel(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi, const W *w,
                            int N, int K, int accumulate) {
  int n = kn_warp_id(), lane = threadIdx.x & 31;
  if (n >= N) return;
  float acc[TT] = {};
  kn_gemv_dot<W, TT>(acc, w + (size_t)n * (size_t)K, in, ldi, K, lane);
  kn_gemv_store<TT>(acc, out, ldo, n, lane, accumulate);
}

template <typename W>
static cudaError_t launch(cudaStream_t s, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                          const W *w, int T, int N, int K, int accumulate) {
  const dim3 grid = kn_gemv_grid(N), block(32 * KN_GEMV_WARPS);
  switch (T) {
#define KN_GEMV_CASE(tt)                                                                           \
  case tt: gemv_kernel<W, tt><<<grid, block, 0, s>>>(out, ldo, in, ldi, w, N, K, accumulate); break;
    KN_GEMV_T_CASES(KN_GEMV_CASE)
#undef KN_GEMV_CASE
  default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

extern "C" cudaError_t kn_cuda_launch_gemv(cudaStream_t s, float *out, ptrdiff_t ldo,
                                           const float *in, ptrdiff_t ldi, const void *w,
                                           enum kn_dtype wdt, int T, int N, int K, int accumulate) {
  if (N <= 0 || T <= 0) return cudaSuccess;
  if (wdt == KN_DTYPE_BF16)
    return launch(s, out, ldo, in, ldi, (const __nv_bfloat16 *)w, T, N, K, accumulate);
  if (wdt == KN_DTYPE_F16)
    return launch(s, out, ldo, in, ldi, (const __half *)w, T, N, K, accumulate);
  return cudaErrorInvalidValue;
}
