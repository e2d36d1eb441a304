/* kn-cuda-topk.cu — MoE router on the device: per row of logits[T, E],
 * p = softmax(row), the k largest p (ties: lower index first) in descending
 * order, renormalised to sum 1, times expert_scale[id] when given. One block
 * per row; p lives in shared memory (E <= KN_CUDA_TOPK_MAX_E); the k picks
 * are k block-wide argmax passes, each removing its winner. */
#include <math.h>

#include "kernels/cuda/kn-cuda-dev.cuh"

#define TOPK_THREADS 128

__global__ void topk_kernel(int32_t *ids, float *weights, const float *logits, ptrdiff_t ld, int E,
                            int k, const float *expert_scale) {
  extern __shared__ float p[]; /* [E] */
  __shared__ float sh[33];
  __shared__ float wv[TOPK_THREADS / 32];
  __shared__ int wi[TOPK_THREADS / 32];
  __shared__ float picked_sum;
  const float *row = logits + (ptrdiff_t)blockIdx.x * ld;
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;

  float mx = -INFINITY;
  for (int i = threadIdx.x; i < E; i += blockDim.x) mx = fmaxf(mx, row[i]);
  mx = kn_warp_max(mx);
  if (lane == 0) sh[w] = mx;
  __syncthreads();
  mx = sh[0];
  for (int i = 1; i < nw; i++) mx = fmaxf(mx, sh[i]);
  __syncthreads();
  float sum = 0.0f;
  for (int i = threadIdx.x; i < E; i += blockDim.x) {
    float e = expf(row[i] - mx);
    p[i] = e;
    sum += e;
  }
  sum = kn_block_sum(sum, sh);
  for (int i = threadIdx.x; i < E; i += blockDim.x) p[i] /= sum;
  if (threadIdx.x == 0) picked_sum = 0.0f;
  __syncthreads();

  int32_t *oid = ids + (size_t)blockIdx.x * (size_t)k;
  float *ow = weights + (size_t)blockIdx.x * (size_t)k;
  for (int j = 0; j < k; j++) {
    float bv = -1.0f; /* removed entries are -1; p >= 0 (or NaN, never picked first) */
    int bi = E;
    for (int i = threadIdx.x; i < E; i += blockDim.x)
      if (p[i] > bv) { /* i grows per thread: strict > keeps the lower index */
        bv = p[i];
        bi = i;
      }
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) {
      wv[w] = bv;
      wi[w] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int q = 1; q < nw; q++)
        if (wv[q] > bv || (wv[q] == bv && wi[q] < bi)) {
          bv = wv[q];
          bi = wi[q];
        }
      if (bi >= E) { /* only NaN left: take the lowest index not yet picked */
        for (bi = 0; bi < E && p[bi] == -1.0f; bi++) {
        }
        bv = p[bi];
      }
      oid[j] = bi;
      ow[j] = bv;
      picked_sum += bv;
      p[bi] = -1.0f;
    }
    __syncthreads();
  }
  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    float v = ow[j] / picked_sum;
    if (expert_scale) v *= expert_scale[oid[j]];
    ow[j] = v;
  }
}

extern "C" cudaError_t kn_cuda_launch_router_topk(cudaStream_t s, int32_t *ids, float *weights,
                                                  const float *logits, ptrdiff_t ld, int T, int E,
                                                  int k, const float *expert_scale) {
  if (E > KN_CUDA_TOPK_MAX_E) return cudaErrorInvalidValue;
  size_t shm = (size_t)E * sizeof(float);
  topk_kernel<<<dim3((unsigned)T), TOPK_THREADS, shm, s>>>(ids, weights, logits, ld, E, k,
                                                            expert_scale);
  return cudaGetLastError();
}
