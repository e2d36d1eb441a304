/* kn-cuda-convert.cu — feeding cuBLAS: narrowing f32 activations [rows, cols]
 * (row stride lds) to contiguous f16 / bf16 (round to nearest even) for the
 * half-precision GEMMs, and gathering a subset of weight rows into a
 * contiguous matrix for the row-subset matmul. */
#include "kernels/cuda/kn-cuda-dev.cuh"

template <typename T>
__global__ void narrow_kernel(T *dst, const float *src, ptrdiff_t lds, int rows, int cols) {
  size_t n = (size_t)rows * (size_t)cols;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    size_t r = i / (size_t)cols, c = i % (size_t)cols;
    kn_store(dst, i, src[(ptrdiff_t)r * lds + (ptrdiff_t)c]);
  }
}

extern "C" cudaError_t kn_cuda_launch_narrow(cudaStream_t s, void *dst, enum kn_dtype dt,
                                             const float *src, ptrdiff_t lds, int rows, int cols) {
  size_t n = (size_t)rows * (size_t)cols;
  unsigned grid = kn_grid(n, 256, 65535);
  switch (dt) {
  case KN_DTYPE_F16: narrow_kernel<<<grid, 256, 0, s>>>((__half *)dst, src, lds, rows, cols); break;
  case KN_DTYPE_BF16:
    narrow_kernel<<<grid, 256, 0, s>>>((__nv_bfloat16 *)dst, src, lds, rows, cols);
    break;
  default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

/* One block per gathered row, copying 16-bit units (rows are whole elements
 * of 2 or 4 bytes). */
__global__ void gather_rows_kernel(uint16_t *dst, const uint16_t *w, size_t units,
                                   const int32_t *rows) {
  const uint16_t *src = w + (size_t)rows[blockIdx.x] * units;
  uint16_t *d = dst + (size_t)blockIdx.x * units;
  for (size_t i = threadIdx.x; i < units; i += blockDim.x)
    d[i] = src[i];
}

extern "C" cudaError_t kn_cuda_launch_gather_rows(cudaStream_t s, void *dst, const void *w,
                                                  size_t row_bytes, const int32_t *rows,
                                                  int n_rows) {
  gather_rows_kernel<<<dim3((unsigned)n_rows), 256, 0, s>>>((uint16_t *)dst, (const uint16_t *)w,
                                                            row_bytes / 2, rows);
  return cudaGetLastError();
}
