/* kn-cuda-topk.cu — MoE router on the device: per row of logits[T, E],
 * p = softmax(row), the k largest p (ties: lower index first; NaN last) in
 * descending order, renormalised to sum 1, times expert_scale[id] when given.
 * One block per row; the row and its softmax live in shared memory
 * (E <= KN_CUDA_TOPK_MAX_E); the k picks are k block-wide argmax passes over
 * the logits, each marking its winner taken. */
#include <math.h>

#include "kernels/cuda/kn-cuda-dev.cuh"

#define TOPK_THREADS 128
#define TOPK_NONE    0x7fffffff

/* Does candidate (bv, bi) beat (av, ai) in the selection order: numbers
 * before NaN, larger first, lower index on ties? TOPK_NONE never wins. */
__device__ __forceinline__ bool topk_beats(float bv, int bi, float av, int ai) {
  if (bi == TOPK_NONE) return false;
  if (ai == TOPK_NONE) return true;
  bool bn = isnan(bv), an = isnan(av);
  if (bn != an) return an;
  if (!bn && bv != av) return bv > av;
  return bi < ai;
}

/* Selection is by logit (as on the CPU), weights from the softmax. */
__global__ void topk_kernel(int32_t *ids, float *weights, const float *logits, ptrdiff_t ld, int E,
                            int k, const float *expert_scale) {
  extern __shared__ float shm[];
  float *sl = shm;                                       /* [E] logits */
  float *p = shm + E;                                    /* [E] softmax numerators */
  unsigned char *taken = (unsigned char *)(shm + 2 * E); /* [E] */
  __shared__ float sh[33];
  __shared__ float wv[TOPK_THREADS / 32];
  __shared__ int wi[TOPK_THREADS / 32];
  __shared__ float picked_sum;
  const float *row = logits + (ptrdiff_t)blockIdx.x * ld;
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;

  float mx = -INFINITY;
  for (int i = threadIdx.x; i < E; i += blockDim.x) {
    float x = row[i];
    sl[i] = x;
    taken[i] = 0;
    mx = fmaxf(mx, x); /* fmaxf ignores NaN */
  }
  mx = kn_warp_max(mx);
  if (lane == 0) sh[w] = mx;
  __syncthreads();
  mx = sh[0];
  for (int i = 1; i < nw; i++)
    mx = fmaxf(mx, sh[i]);
  __syncthreads();
  float sum = 0.0f;
  for (int i = threadIdx.x; i < E; i += blockDim.x) {
    float e = expf(sl[i] - mx);
    p[i] = e;
    sum += e;
  }
  sum = kn_block_sum(sum, sh); /* also orders the writes to sl, p, taken */
  if (threadIdx.x == 0) picked_sum = 0.0f;

  int32_t *oid = ids + (size_t)blockIdx.x * (size_t)k;
  float *ow = weights + (size_t)blockIdx.x * (size_t)k;
  for (int j = 0; j < k; j++) {
    float bv = 0.0f;
    int bi = TOPK_NONE;
    for (int i = threadIdx.x; i < E; i += blockDim.x)
      if (!taken[i] && topk_beats(sl[i], i, bv, bi)) {
        bv = sl[i];
        bi = i;
      }
    kn_block_best<topk_beats>(bv, bi, wv, wi);
    if (threadIdx.x == 0) {
      oid[j] = bi; /* j < k <= E: something is always left */
      ow[j] = p[bi] / sum;
      picked_sum += p[bi] / sum;
      taken[bi] = 1;
    }
    __syncthreads();
  }
  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    float v = picked_sum > 0.0f ? ow[j] / picked_sum : 1.0f / (float)k;
    if (expert_scale) v *= expert_scale[oid[j]];
    ow[j] = v;
  }
}

extern "C" cudaError_t kn_cuda_launch_router_topk(cudaStream_t s, int32_t *ids, float *weights,
                                                  const float *logits, ptrdiff_t ld, int T, int E,
                                                  int k, const float *expert_scale) {
  if (E > KN_CUDA_TOPK_MAX_E) return cudaErrorInvalidValue;
  size_t shm = (size_t)E * (2 * sizeof(float) + 1);
  topk_kernel<<<dim3((unsigned)T), TOPK_THREADS, shm, s>>>(ids, weights, logits, ld, E, k,
                                                           expert_scale);
  return cudaGetLastError();
}
