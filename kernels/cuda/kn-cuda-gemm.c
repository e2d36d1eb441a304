/* kn-cuda-gemm.c — dense matmuls through cuBLAS.
 *
 * out[T, N] (row stride ldo) {=, +=} in[T, K] (row stride ldi) · W[N, K]^T.
 * Row-major out is column-major out^T [N, T] with ld = ldo, so this is the
 * column-major GEMM  out^T = W^T(op T on the column-major [K, N] view of W)
 * · in^T, i.e. cublas(OP_T, OP_N, m = N, n = T, k = K, A = W (lda = K),
 * B = in (ldb = ldi), C = out (ldc = ldo)).
 *
 *   f32 weights:  SGEMM in full f32 (no TF32: the CPU backend is the oracle).
 *   bf16 / f16:   the activations are narrowed to the weights' type into
 *                 scratch, then cublasGemmEx with f32 output and
 *                 CUBLAS_COMPUTE_32F accumulation.
 *   row subset:   the chosen rows of W are gathered into scratch first. */
#include <limits.h>

#include "common/cm-err.h"
#include "kernels/cuda/kn-cuda-impl.h"

static size_t align256(size_t n) {
  return (n + 255) & ~(size_t)255;
}

/* The GEMM proper; w16 (when not NULL) is scratch for the narrowed input,
 * T * K elements of wdt. */
static int gemm(struct kn_cuda_ctx *c, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                const void *w, enum kn_dtype wdt, int T, int N, int K, int accumulate, void *w16) {
  /* cuBLAS wants ld >= the row length even for a single row */
  if (T == 1) {
    ldo = N;
    ldi = K;
  }
  if (ldo > INT_MAX || ldi > INT_MAX) return CM_ERR_UNSUPPORTED;
  const float one = 1.0f, zero = 0.0f;
  const float *beta = accumulate ? &one : &zero;
  if (wdt == KN_DTYPE_F32) {
    KN_CUBLAS_CHECK(cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, w, K, in,
                                (int)ldi, beta, out, (int)ldo));
    return 0;
  }
  cudaDataType dt = wdt == KN_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
  KN_CUDA_CHECK(kn_cuda_launch_narrow(c->stream, w16, wdt, in, ldi, T, K));
  KN_CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, w, dt, K, w16, dt,
                               K, beta, out, CUDA_R_32F, (int)ldo, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
  return 0;
}

/* K == 0: the product is zero; out is cleared unless accumulating. */
static int gemm_empty(struct kn_cuda_ctx *c, float *out, ptrdiff_t ldo, int T, int N,
                      int accumulate) {
  if (accumulate) return 0;
  size_t width = (size_t)N * sizeof(float);
  size_t pitch = T == 1 ? width : (size_t)ldo * sizeof(float);
  KN_CUDA_CHECK(cudaMemset2DAsync(out, pitch, 0, width, (size_t)T, c->stream));
  return 0;
}

int kn_cuda_op_matmul(void *ctx, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                      const void *w, enum kn_dtype wdt, int T, int N, int K, int accumulate) {
  struct kn_cuda_ctx *c = ctx;
  void *scratch = NULL;
  int err = kn_cuda_enter(c);
  if (err) return err;
  if (K == 0) return gemm_empty(c, out, ldo, T, N, accumulate);
  if (wdt != KN_DTYPE_F32) {
    err = kn_cuda_scratch(c, (size_t)T * (size_t)K * 2, &scratch);
    if (err) return err;
  }
  return gemm(c, out, ldo, in, ldi, w, wdt, T, N, K, accumulate, scratch);
}

int kn_cuda_op_matmul_rows(void *ctx, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                           const void *w, enum kn_dtype wdt, int K, const int32_t *rows, int n_rows,
                           int T) {
  struct kn_cuda_ctx *c = ctx;
  int err = kn_cuda_enter(c);
  if (err) return err;
  if (K == 0) return gemm_empty(c, out, ldo, T, n_rows, 0);
  size_t row_bytes = (size_t)K * kn_dtype_size(wdt);
  size_t wbytes = align256((size_t)n_rows * row_bytes);
  size_t abytes = wdt == KN_DTYPE_F32 ? 0 : (size_t)T * (size_t)K * 2;
  void *rows_d, *scratch;
  err = kn_cuda_stage(c, rows, (size_t)n_rows * sizeof(int32_t), &rows_d);
  if (!err) err = kn_cuda_scratch(c, wbytes + abytes, &scratch);
  if (err) return err;
  KN_CUDA_CHECK(kn_cuda_launch_gather_rows(c->stream, scratch, w, row_bytes, rows_d, n_rows));
  void *act = abytes ? (char *)scratch + wbytes : NULL;
  return gemm(c, out, ldo, in, ldi, scratch, wdt, T, n_rows, K, 0, act);
}
