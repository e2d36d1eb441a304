/* kn-cuda-kv-write.cu — writes this step's K and V rows into the paged pool:
 * token t goes to page slot[t] / block_tokens, slot slot[t] % block_tokens,
 * stored as f32, bf16 or fp8 e4m3 (round to nearest even; an fp8 cache with
 * scales stores each value divided by its kv head's scale). One block per
 * token; slot[t] < 0 skips the token. Slots are staged and validated on the
 * host. */
#include "kernels/cuda/kn-cuda-dev.cuh"

/* Where and how a launch writes: the view's layout on the device. */
struct kv_dst {
  char *pool;
  size_t page_bytes, k_off, v_off;
  int block_tokens, row, head_dim;
  const float *k_scale, *v_scale; /* [n_kv_heads] or NULL */
};

/* Row x of one token into dst (row elements), each divided by its head's scale
 * where there are scales. */
template <typename T>
__device__ __forceinline__ void put_row(T *dst, const float *x, const float *scale, int row,
                                        int head_dim) {
  for (int i = threadIdx.x; i < row; i += blockDim.x)
    kn_store(dst, i, scale ? __fdiv_rn(x[i], scale[i / head_dim]) : x[i]);
}

template <typename T>
__global__ void kv_write_kernel(const struct kv_dst d, const int32_t *slots, const float *k,
                                ptrdiff_t ldk, const float *v, ptrdiff_t ldv) {
  int t = blockIdx.x;
  int slot = slots[t];
  if (slot < 0) return;
  char *page = d.pool + (size_t)(slot / d.block_tokens) * d.page_bytes;
  size_t base = (size_t)(slot % d.block_tokens) * (size_t)d.row; /* elements */
  put_row((T *)(page + d.k_off) + base, k + (ptrdiff_t)t * ldk, d.k_scale, d.row, d.head_dim);
  if (v)
    put_row((T *)(page + d.v_off) + base, v + (ptrdiff_t)t * ldv, d.v_scale, d.row, d.head_dim);
}

extern "C" cudaError_t kn_cuda_launch_kv_write(cudaStream_t s, const struct kn_kv_view *view,
                                               const int32_t *slots, const float *k, ptrdiff_t ldk,
                                               const float *v, ptrdiff_t ldv, int T) {
  const struct kv_dst d = {(char *)view->pool, view->page_bytes,  view->k_off,
                           view->v_off,        view->block_tokens, view->n_kv_heads * view->head_dim,
                           view->head_dim,     view->k_scale,     view->v_scale};
  unsigned threads = d.row >= 1024 ? 256 : 128;
  dim3 grid((unsigned)T);
  switch (view->dtype) {
  case KN_DTYPE_F32: kv_write_kernel<float><<<grid, threads, 0, s>>>(d, slots, k, ldk, v, ldv); break;
  case KN_DTYPE_BF16:
    kv_write_kernel<__nv_bfloat16><<<grid, threads, 0, s>>>(d, slots, k, ldk, v, ldv);
    break;
  case KN_DTYPE_F8E4M3:
    kv_write_kernel<__nv_fp8_e4m3><<<grid, threads, 0, s>>>(d, slots, k, ldk, v, ldv);
    break;
  default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
