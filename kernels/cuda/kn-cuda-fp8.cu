/* kn-cuda-fp8.cu — FP8 (e4m3) weights with a scale per output feature
 * (kn_matmul_fp8): the few-rows kernel, which reads each weight row once as
 * 16-byte vectors of codes, widens them exactly and multiplies them with the
 * inputs rounded to bf16 (exact f32 products, f32 sums, one warp per output
 * feature, the scale last); the pieces of the two GEMM paths (dequantized
 * bf16 weights for cuBLAS; inputs quantized per row to e4m3 for cuBLASLt's
 * FP8 GEMM); and their shared epilogue, which applies the scales. */
#include "kernels/cuda/kn-cuda-dev.cuh"

/* One warp per weight row n: out[t, n] (+)= scale[n] * sum_k bf16(in[t, k]) *
 * e4m3(w[n, k]) for t < TT, the sum kn_gemv_dot's (kn-cuda-dev.cuh, shared
 * with the fused kernels over FP8 weights). K % 16 == 0; w, in and every
 * input row 16-byte aligned. */
template <int TT>
__global__ void gemv_fp8_kernel(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                                const unsigned char *w, const float *scale, int N, int K,
                                int accumulate) {
  int n = kn_warp_id(), lane = threadIdx.x & 31;
  if (n >= N) return;
  float acc[TT] = {};
  kn_gemv_dot(acc, reinterpret_cast<const __nv_fp8_e4m3 *>(w + (size_t)n * (size_t)K), in, ldi, K,
              lane);
#pragma unroll
  for (int t = 0; t < TT; t++) {
    float s = kn_warp_sum(acc[t]);
    if (lane == 0) {
      float *o = out + (ptrdiff_t)t * ldo + n;
      float v = s * scale[n];
      *o = accumulate ? *o + v : v;
    }
  }
}

extern "C" cudaError_t kn_cuda_launch_gemv_fp8(cudaStream_t s, float *out, ptrdiff_t ldo,
                                               const float *in, ptrdiff_t ldi, const void *w,
                                               const float *scale, int T, int N, int K,
                                               int accumulate) {
  enum { WARPS = 8 };
  if (N <= 0 || T <= 0) return cudaSuccess;
  dim3 grid((unsigned)((N + WARPS - 1) / WARPS)), block(32 * WARPS);
  const unsigned char *wb = (const unsigned char *)w;
  switch (T) {
#define KN_FP8_CASE(tt)                                                                            \
  case tt:                                                                                         \
    gemv_fp8_kernel<tt><<<grid, block, 0, s>>>(out, ldo, in, ldi, wb, scale, N, K, accumulate);    \
    break;
    KN_FP8_CASE(1)
    KN_FP8_CASE(2)
    KN_FP8_CASE(3)
    KN_FP8_CASE(4)
    KN_FP8_CASE(5)
    KN_FP8_CASE(6)
    KN_FP8_CASE(7)
    KN_FP8_CASE(8)
#undef KN_FP8_CASE
  default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

__global__ void dequant_kernel(__nv_bfloat16 *dst, const unsigned char *w, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = __float2bfloat16_rn(e4m3_value(w[i])); /* exact: every e4m3 value is a bf16 */
}

extern "C" cudaError_t kn_cuda_launch_fp8_dequant(cudaStream_t s, void *dst, const void *w,
                                                  size_t n) {
  if (!n) return cudaSuccess;
  size_t blocks = (n + 255) / 256;
  dequant_kernel<<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, s>>>(
      (__nv_bfloat16 *)dst, (const unsigned char *)w, n);
  return cudaGetLastError();
}

/* One block per row t: sa[t] = (largest |in[t, k]|) / 448 (1 for zeros) and
 * codes[t, k] = e4m3(in[t, k] / sa[t]), nearest even, saturating. */
__global__ void quant_rows_kernel(unsigned char *codes, float *sa, const float *in, ptrdiff_t ldi,
                                  int K) {
  __shared__ float sh[33];
  const float *x = in + (ptrdiff_t)blockIdx.x * ldi;
  float m = 0.0f;
  for (int k = threadIdx.x; k < K; k += blockDim.x)
    m = fmaxf(m, fabsf(x[k]));
  m = kn_block_max(m, sh);
  float s = m > 0.0f ? m / 448.0f : 1.0f;
  if (!(s > 0.0f)) s = 1.0f;
  unsigned char *c = codes + (size_t)blockIdx.x * (size_t)K;
  for (int k = threadIdx.x; k < K; k += blockDim.x)
    c[k] = (unsigned char)__nv_cvt_float_to_fp8(x[k] / s, __NV_SATFINITE, __NV_E4M3);
  if (threadIdx.x == 0) sa[blockIdx.x] = s;
}

extern "C" cudaError_t kn_cuda_launch_fp8_quant_rows(cudaStream_t s, void *codes, float *sa,
                                                     const float *in, ptrdiff_t ldi, int T, int K) {
  if (T <= 0) return cudaSuccess;
  quant_rows_kernel<<<(unsigned)T, 256, 0, s>>>((unsigned char *)codes, sa, in, ldi, K);
  return cudaGetLastError();
}

/* out[t, n] (+)= tmp[t, n] * scale[n] (* sa[t] when sa is not NULL). */
__global__ void fp8_epilogue_kernel(float *out, ptrdiff_t ldo, const float *tmp, const float *scale,
                                    const float *sa, int T, int N, int accumulate) {
  size_t total = (size_t)T * (size_t)N;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    int t = (int)(i / (size_t)N), n = (int)(i % (size_t)N);
    float v = tmp[i] * scale[n];
    if (sa) v *= sa[t];
    float *o = out + (ptrdiff_t)t * ldo + n;
    *o = accumulate ? *o + v : v;
  }
}

extern "C" cudaError_t kn_cuda_launch_fp8_epilogue(cudaStream_t s, float *out, ptrdiff_t ldo,
                                                   const float *tmp, const float *scale,
                                                   const float *sa, int T, int N, int accumulate) {
  size_t total = (size_t)T * (size_t)N, blocks = (total + 255) / 256;
  if (!total) return cudaSuccess;
  fp8_epilogue_kernel<<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, s>>>(
      out, ldo, tmp, scale, sa, T, N, accumulate);
  return cudaGetLastError();
}
