/* kn-cuda-embed.cu — token embedding lookup: out[t, :] = table[ids[t], :] * scale,
 * one block per token, the table in f32, f16 or bf16 (a block format's
 * rows: kn-cuda-quant.cu); an id outside [0, vocab) is a zero
 * row (-1: another rank's; kn_embed's staged ids are validated on the host by
 * kn-backend.c, kn_embed_dev's device ids cannot be). Also kn_ids_take's gather of a
 * step's ids, some from device memory. */
#include "kernels/cuda/kn-cuda-dev.cuh"

template <typename T>
__global__ void embed_kernel(float *out, ptrdiff_t ldo, const T *table, int vocab, int H,
                             const int32_t *ids, float scale) {
  int t = blockIdx.x;
  float *o = out + (ptrdiff_t)t * ldo;
  if (ids[t] < 0 || ids[t] >= vocab) { /* a row another tensor-parallel rank holds */
    for (int i = threadIdx.x; i < H; i += blockDim.x)
      o[i] = 0.0f;
    return;
  }
  const T *row = table + (size_t)ids[t] * (size_t)H;
  for (int i = threadIdx.x; i < H; i += blockDim.x)
    o[i] = kn_load(row, i) * scale;
}

extern "C" cudaError_t kn_cuda_launch_embed(cudaStream_t s, float *out, ptrdiff_t ldo,
                                            const void *table, enum kn_dtype tdt, int vocab, int H,
                                            const int32_t *ids, int T, float scale) {
  dim3 grid(T), block(256);
  switch (tdt) {
  case KN_DTYPE_F32:
    embed_kernel<<<grid, block, 0, s>>>(out, ldo, (const float *)table, vocab, H, ids, scale);
    break;
  case KN_DTYPE_F16:
    embed_kernel<<<grid, block, 0, s>>>(out, ldo, (const __half *)table, vocab, H, ids, scale);
    break;
  case KN_DTYPE_BF16:
    embed_kernel<<<grid, block, 0, s>>>(out, ldo, (const __nv_bfloat16 *)table, vocab, H, ids,
                                        scale);
    break;
  default: /* the block formats, dequantized (kn-cuda-quant.cu) */
    return kn_cuda_launch_qembed(s, out, ldo, table, tdt, vocab, H, ids, T, scale);
  }
  return cudaGetLastError();
}

__global__ void ids_take_kernel(int32_t *dst, const int32_t *ids, const int32_t *src,
                                const int32_t *map, int T) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < T) dst[t] = map[t] < 0 ? ids[t] : src[map[t]];
}

extern "C" cudaError_t kn_cuda_launch_ids_take(cudaStream_t s, int32_t *dst, const int32_t *ids,
                                               const int32_t *src, const int32_t *map, int T) {
  ids_take_kernel<<<(T + 255) / 256, 256, 0, s>>>(dst, ids, src, map, T);
  return cudaGetLastError();
}
