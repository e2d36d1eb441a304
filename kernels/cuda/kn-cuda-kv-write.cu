/* kn-cuda-kv-write.cu — writes this step's K and V rows into the paged pool:
 * token t goes to page slot[t] / block_tokens, slot slot[t] % block_tokens,
 * stored as f32 or bf16 (round to nearest even). One block per token;
 * slot[t] < 0 skips the token. Slots are staged and validated on the host. */
#include "kernels/cuda/kn-cuda-dev.cuh"

template <typename T>
__global__ void kv_write_kernel(char *pool, size_t page_bytes, size_t k_off, size_t v_off,
                                int block_tokens, int row, const int32_t *slots, const float *k,
                                ptrdiff_t ldk, const float *v, ptrdiff_t ldv) {
  int t = blockIdx.x;
  int slot = slots[t];
  if (slot < 0) return;
  char *page = pool + (size_t)(slot / block_tokens) * page_bytes;
  size_t base = (size_t)(slot % block_tokens) * (size_t)row; /* elements */
  T *kd = (T *)(page + k_off) + base;
  const float *ks = k + (ptrdiff_t)t * ldk;
  for (int i = threadIdx.x; i < row; i += blockDim.x)
    kn_store(kd, i, ks[i]);
  if (v) {
    T *vd = (T *)(page + v_off) + base;
    const float *vs = v + (ptrdiff_t)t * ldv;
    for (int i = threadIdx.x; i < row; i += blockDim.x)
      kn_store(vd, i, vs[i]);
  }
}

extern "C" cudaError_t kn_cuda_launch_kv_write(cudaStream_t s, const struct kn_kv_view *view,
                                               const int32_t *slots, const float *k, ptrdiff_t ldk,
                                               const float *v, ptrdiff_t ldv, int T) {
  int row = view->n_kv_heads * view->head_dim;
  unsigned threads = row >= 1024 ? 256 : 128;
  char *pool = (char *)view->pool;
  switch (view->dtype) {
  case KN_DTYPE_F32:
    kv_write_kernel<float>
        <<<dim3((unsigned)T), threads, 0, s>>>(pool, view->page_bytes, view->k_off, view->v_off,
                                               view->block_tokens, row, slots, k, ldk, v, ldv);
    break;
  case KN_DTYPE_BF16:
    kv_write_kernel<__nv_bfloat16>
        <<<dim3((unsigned)T), threads, 0, s>>>(pool, view->page_bytes, view->k_off, view->v_off,
                                               view->block_tokens, row, slots, k, ldk, v, ldv);
    break;
  case KN_DTYPE_F8E4M3:
    kv_write_kernel<__nv_fp8_e4m3>
        <<<dim3((unsigned)T), threads, 0, s>>>(pool, view->page_bytes, view->k_off, view->v_off,
                                               view->block_tokens, row, slots, k, ldk, v, ldv);
    break;
  default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
