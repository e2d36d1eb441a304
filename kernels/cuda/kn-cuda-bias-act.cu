/* kn-cuda-bias-act.cu — the bias and activation of a Linear layer,
 * out[T, N] = act(x[T, N] + bias[N]) with row strides (bias may be NULL; act
 * GELU-tanh, SiLU, ReLU or the sigmoid), and
 * the feature-wise standardisation out[T, N] = (x - bias[N]) * scale[N]
 * (kn_standardize). One thread per element; out may alias x (same stride). */
#include "kernels/cuda/kn-cuda-dev.cuh"

__global__ void bias_act_kernel(float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                                const float *bias, int N, int act) {
  int t = blockIdx.y;
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= N) return;
  float v = x[(ptrdiff_t)t * ldx + j];
  if (bias) v += bias[j];
  switch (act) {
  case KN_ACT_GELU_TANH: v = kn_gelu_tanh(v); break;
  case KN_ACT_SILU: v = v / (1.0f + expf(-v)); break;
  case KN_ACT_RELU: v = v < 0.0f ? 0.0f : v; break;
  case KN_ACT_SIGMOID: v = 1.0f / (1.0f + expf(-v)); break;
  default: break;
  }
  out[(ptrdiff_t)t * ldo + j] = v;
}

extern "C" cudaError_t kn_cuda_launch_bias_act(cudaStream_t s, float *out, ptrdiff_t ldo,
                                               const float *x, ptrdiff_t ldx, const float *bias,
                                               int T, int N, enum kn_act act) {
  kn_row_slices(T, N, [&](int t0, dim3 grid) {
    bias_act_kernel<<<grid, 256, 0, s>>>(out + (ptrdiff_t)t0 * ldo, ldo, x + (ptrdiff_t)t0 * ldx,
                                         ldx, bias, N, (int)act);
  });
  return cudaGetLastError();
}

__global__ void standardize_kernel(float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                                   const float *bias, const float *scale, int N) {
  int t = blockIdx.y;
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= N) return;
  out[(ptrdiff_t)t * ldo + j] = (x[(ptrdiff_t)t * ldx + j] - bias[j]) * scale[j];
}

extern "C" cudaError_t kn_cuda_launch_standardize(cudaStream_t s, float *out, ptrdiff_t ldo,
                                                  const float *x, ptrdiff_t ldx,
                                                  const float *bias, const float *scale, int T,
                                                  int N) {
  kn_row_slices(T, N, [&](int t0, dim3 grid) {
    standardize_kernel<<<grid, 256, 0, s>>>(out + (ptrdiff_t)t0 * ldo, ldo,
                                            x + (ptrdiff_t)t0 * ldx, ldx, bias, scale, N);
  });
  return cudaGetLastError();
}
