/* kn-cuda-avg-pool.cu — average pooling of square patch grids with
 * kernel = stride = k (the Gemma 3 projector's AvgPool2d): block x = output
 * row (image, pooled row, pooled column), threads over the C features; each
 * thread sums its feature over the k x k window in row order (f32), then
 * divides by k * k. And the pooling of one rectangular grid times a scale
 * (Gemma 4's pooler, kn_avg_pool_grid), laid out the same way. */
#include "kernels/cuda/kn-cuda-dev.cuh"

__global__ void avg_pool2d_kernel(float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                                  int side, int k, int os, int C) {
  long long r = blockIdx.x;
  long long img = r / ((long long)os * os);
  int rr = (int)(r % ((long long)os * os)), R = rr / os, Q = rr % os;
  const float *base = x + img * side * side * ldx;
  float win = (float)(k * k);
  for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < C; c += gridDim.y * blockDim.x) {
    float acc = 0.0f;
    for (int y = 0; y < k; y++)
      for (int z = 0; z < k; z++)
        acc += base[((long long)(R * k + y) * side + (Q * k + z)) * ldx + c];
    out[r * ldo + c] = acc / win;
  }
}

extern "C" cudaError_t kn_cuda_launch_avg_pool2d(cudaStream_t s, float *out, ptrdiff_t ldo,
                                                 const float *x, ptrdiff_t ldx, int n_img, int side,
                                                 int k, int C) {
  int os = side / k;
  unsigned rows = (unsigned)((long long)n_img * os * os);
  unsigned threads = C >= 256 ? 256 : C > 32 ? (unsigned)((C + 31) / 32 * 32) : 32;
  dim3 grid(rows, (unsigned)kn_grid((size_t)C, threads, 64));
  avg_pool2d_kernel<<<grid, threads, 0, s>>>(out, ldo, x, ldx, side, k, os, C);
  return cudaGetLastError();
}

__global__ void avg_pool_grid_kernel(float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                                     int gw, int k, int ow, int C, float scale) {
  long long r = blockIdx.x;
  int Y = (int)(r / ow), X = (int)(r % ow);
  float f = scale / (float)(k * k);
  for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < C; c += gridDim.y * blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; j++)
      for (int i = 0; i < k; i++)
        acc += x[((long long)(Y * k + j) * gw + (X * k + i)) * ldx + c];
    out[r * ldo + c] = acc * f;
  }
}

extern "C" cudaError_t kn_cuda_launch_avg_pool_grid(cudaStream_t s, float *out, ptrdiff_t ldo,
                                                    const float *x, ptrdiff_t ldx, int gw, int gh,
                                                    int k, int C, float scale) {
  int ow = gw / k;
  unsigned rows = (unsigned)((long long)ow * (gh / k));
  unsigned threads = C >= 256 ? 256 : C > 32 ? (unsigned)((C + 31) / 32 * 32) : 32;
  dim3 grid(rows, (unsigned)kn_grid((size_t)C, threads, 64));
  avg_pool_grid_kernel<<<grid, threads, 0, s>>>(out, ldo, x, ldx, gw, k, ow, C, scale);
  return cudaGetLastError();
}
