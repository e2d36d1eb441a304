/* kn-cuda-rope.cu — rotary position embedding, rotate-half form, in place on
 * x[T, heads, D]: one block per (token, head), one thread per pair (i, i + D/2).
 * The angle pos * inv_freq[i] is formed in f32 as on the CPU; sincosf is the
 * accurate version (no fast-math), which matters at large positions. */
#include "kernels/cuda/kn-cuda-dev.cuh"

__global__ void rope_kernel(float *x, ptrdiff_t ldx, int heads, int D, const int32_t *pos,
                            const float *inv_freq) {
  int t = blockIdx.x / heads, h = blockIdx.x % heads;
  int hd = D / 2;
  float *xh = x + (ptrdiff_t)t * ldx + (ptrdiff_t)h * D;
  float p = (float)pos[t];
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    float a = p * inv_freq[i];
    float sn, cs;
    sincosf(a, &sn, &cs);
    float x0 = xh[i], x1 = xh[i + hd];
    xh[i] = x0 * cs - x1 * sn;
    xh[i + hd] = x1 * cs + x0 * sn;
  }
}

extern "C" cudaError_t kn_cuda_launch_rope(cudaStream_t s, float *x, ptrdiff_t ldx, int T,
                                           int heads, int D, const int32_t *pos,
                                           const float *inv_freq) {
  int hd = D / 2;
  unsigned threads = hd >= 256 ? 256 : hd >= 128 ? 128 : hd >= 64 ? 64 : 32;
  rope_kernel<<<dim3((unsigned)T * (unsigned)heads), dim3(threads), 0, s>>>(x, ldx, heads, D, pos,
                                                                            inv_freq);
  return cudaGetLastError();
}
