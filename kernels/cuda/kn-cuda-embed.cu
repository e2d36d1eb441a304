/* kn-cuda-embed.cu — token embedding lookup: out[t, :] = table[ids[t], :] * scale,
 * one block per token, the table in f32, f16 or bf16; id -1 is a zero row. ids are staged on the
 * device (validated on the host by kn-backend.c). */
#include "kernels/cuda/kn-cuda-dev.cuh"

template <typename T>
__global__ void embed_kernel(float *out, ptrdiff_t ldo, const T *table, int H, const int32_t *ids,
                             float scale) {
  int t = blockIdx.x;
  float *o = out + (ptrdiff_t)t * ldo;
  if (ids[t] < 0) { /* a row another tensor-parallel rank holds */
    for (int i = threadIdx.x; i < H; i += blockDim.x)
      o[i] = 0.0f;
    return;
  }
  const T *row = table + (size_t)ids[t] * (size_t)H;
  for (int i = threadIdx.x; i < H; i += blockDim.x)
    o[i] = kn_load(row, i) * scale;
}

extern "C" cudaError_t kn_cuda_launch_embed(cudaStream_t s, float *out, ptrdiff_t ldo,
                                            const void *table, enum kn_dtype tdt, int H,
                                            const int32_t *ids, int T, float scale) {
  dim3 grid(T), block(256);
  switch (tdt) {
  case KN_DTYPE_F32:
    embed_kernel<<<grid, block, 0, s>>>(out, ldo, (const float *)table, H, ids, scale);
    break;
  case KN_DTYPE_F16:
    embed_kernel<<<grid, block, 0, s>>>(out, ldo, (const __half *)table, H, ids, scale);
    break;
  case KN_DTYPE_BF16:
    embed_kernel<<<grid, block, 0, s>>>(out, ldo, (const __nv_bfloat16 *)table, H, ids, scale);
    break;
  default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
