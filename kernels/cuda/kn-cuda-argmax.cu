/* kn-cuda-argmax.cu — greedy sampling on the device: per row of logits[T, V],
 * the index of the maximum (first on ties, NaN never wins, a row of NaN gives
 * index 0 and value NaN) and the maximum itself. One block per row. */
#include <math.h>

#include "kernels/cuda/kn-cuda-dev.cuh"

#define ARGMAX_THREADS 256
#define ARGMAX_NONE    KN_NONE_ID

__global__ void argmax_kernel(int32_t *ids, float *maxv, const float *logits, ptrdiff_t ld, int V) {
  __shared__ float sv[ARGMAX_THREADS / 32];
  __shared__ int si[ARGMAX_THREADS / 32];
  const float *row = logits + (ptrdiff_t)blockIdx.x * ld;
  float bv = 0.0f;
  int bi = ARGMAX_NONE;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    float x = row[i];
    if (!isnan(x) && (bi == ARGMAX_NONE || x > bv)) { /* i grows: strict > keeps the first */
      bv = x;
      bi = i;
    }
  }
  kn_block_best<kn_beats>(bv, bi, sv, si);
  if (threadIdx.x == 0) {
    if (bi == ARGMAX_NONE) {
      ids[blockIdx.x] = 0;
      maxv[blockIdx.x] = row[0];
    } else {
      ids[blockIdx.x] = bi;
      maxv[blockIdx.x] = bv;
    }
  }
}

extern "C" cudaError_t kn_cuda_launch_argmax(cudaStream_t s, int32_t *ids, float *maxv,
                                             const float *logits, ptrdiff_t ld, int T, int V) {
  argmax_kernel<<<dim3((unsigned)T), ARGMAX_THREADS, 0, s>>>(ids, maxv, logits, ld, V);
  return cudaGetLastError();
}
