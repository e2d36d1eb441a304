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
 *   few rows:     bf16 / f16 weights and T <= KN_CUDA_GEMV_MAX_T (decode, small
 *                 batches) run kn-cuda-gemv.cu instead, one launch with the
 *                 same rounding of the inputs, where the backend's check of it
 *                 at creation passed (kn_cuda_gemv_check).
 *   row subset:   the chosen rows of W are gathered into scratch first.
 *   block formats: kn-cuda-quant.c. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>

#include "common/cm-err.h"
#include "common/cm-log.h"
#include "kernels/cuda/kn-cuda-impl.h"
#include "kernels/kn-dtype.h"

static size_t align256(size_t n) {
  return (n + 255) & ~(size_t)255;
}

/* The GEMM proper; w16 (when not NULL) is scratch for the narrowed input,
 * T * K elements of wdt. */
static int gemm(struct kn_cuda_ctx *c, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                const void *w, enum kn_dtype wdt, int T, int N, int K, int accumulate, void *w16) {
  if (c->gemv && kn_cuda_gemv_fits(in, ldi, w, wdt, T, K)) {
    KN_CUDA_RUN(c, kn_cuda_launch_gemv(c->stream, out, ldo, in, ldi, w, wdt, T, N, K, accumulate));
    return 0;
  }
  /* cuBLAS wants ld >= the row length even for a single row */
  if (T == 1) {
    ldo = N;
    ldi = K;
  }
  if (ldo > INT_MAX || ldi > INT_MAX) return CM_ERR_UNSUPPORTED;
  const float one = 1.0f, zero = 0.0f;
  const float *beta = accumulate ? &one : &zero;
  if (wdt == KN_DTYPE_F32) {
    KN_CUBLAS_RUN(c, cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, w, K, in,
                                 (int)ldi, beta, out, (int)ldo));
    return 0;
  }
  cudaDataType dt = wdt == KN_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
  KN_CUDA_RUN(c, kn_cuda_launch_narrow(c->stream, w16, wdt, in, ldi, T, K));
  KN_CUBLAS_RUN(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, w, dt, K, w16, dt,
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
  KN_CUDA_RUN(c, cudaMemset2DAsync(out, pitch, 0, width, (size_t)T, c->stream));
  return 0;
}

int kn_cuda_op_matmul(void *ctx, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                      const void *w, enum kn_dtype wdt, int T, int N, int K, int accumulate) {
  struct kn_cuda_ctx *c = ctx;
  void *scratch = NULL;
  int err = kn_cuda_enter(c);
  if (err) return err;
  if (K == 0) return gemm_empty(c, out, ldo, T, N, accumulate);
  if (kn_block_elems(wdt))
    return kn_cuda_matmul_q(c, out, ldo, in, ldi, w, wdt, T, N, K, accumulate);
  if (wdt != KN_DTYPE_F32 && !(c->gemv && kn_cuda_gemv_fits(in, ldi, w, wdt, T, K))) {
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
  KN_CUDA_RUN(c, kn_cuda_launch_gather_rows(c->stream, scratch, w, row_bytes, rows_d, n_rows));
  void *act = abytes ? (char *)scratch + wbytes : NULL;
  return gemm(c, out, ldo, in, ldi, scratch, wdt, T, n_rows, K, 0, act);
}

/* ---- the few-rows kernel, checked before use ------------------------------ */

/* The check's inputs: uniform in [-1, 1) from the generator r. */
static float check_value(uint32_t *r) {
  *r = *r * 1664525u + 1013904223u;
  return (float)(*r >> 8) / (float)(1u << 23) - 1.0f;
}

/* Runs one problem (T rows, N outputs, K with a tail of vectors past a
 * multiple of 32 lanes, accumulating onto ones) through the few-rows kernel
 * and through the cuBLAS path, for wdt; 0 when they agree to 1e-3 of the
 * largest output, else CM_ERR_DEVICE or the CUDA failure. */
static int gemv_case(struct kn_cuda_ctx *c, enum kn_dtype wdt, int T) {
  enum { N = 37, K = 1160 };
  uint16_t *wh = malloc(sizeof(uint16_t) * N * K);
  float *xh = malloc(sizeof(float) * T * K), *a = malloc(sizeof(float) * T * N),
        *b = malloc(sizeof(float) * T * N), *ones = malloc(sizeof(float) * T * N);
  void *wd = NULL, *xd = NULL, *od = NULL, *scratch = NULL;
  int err = wh && xh && a && b && ones ? 0 : CM_ERR_NOMEM;
  uint32_t r = 0x9e3779b9u ^ (uint32_t)(T * 31 + (int)wdt);
  for (int i = 0; !err && i < N * K; i++) { /* as bf16 or f16 */
    float v = check_value(&r);
    wh[i] = wdt == KN_DTYPE_BF16 ? kn_f32_to_bf16(v) : kn_f32_to_f16(v);
  }
  for (int i = 0; !err && i < T * K; i++)
    xh[i] = 3.0f * check_value(&r);
  const size_t obytes = sizeof(float) * T * N;
  if (!err && (cudaMalloc(&wd, sizeof(uint16_t) * N * K) != cudaSuccess ||
               cudaMalloc(&xd, sizeof(float) * T * K) != cudaSuccess ||
               cudaMalloc(&od, obytes) != cudaSuccess))
    err = CM_ERR_DEVICE;
  if (!err) err = kn_cuda_scratch(c, (size_t)T * K * 2, &scratch);
  for (int i = 0; !err && i < T * N; i++)
    ones[i] = 1.0f;
  /* pass 0: the kernel into a, pass 1: cuBLAS into b; both onto ones, in the
   * backend's stream (not ordered with the legacy default stream) */
  for (int pass = 0; pass < 2 && !err; pass++) {
    if (cudaMemcpyAsync(wd, wh, sizeof(uint16_t) * N * K, cudaMemcpyHostToDevice, c->stream) !=
            cudaSuccess ||
        cudaMemcpyAsync(xd, xh, sizeof(float) * T * K, cudaMemcpyHostToDevice, c->stream) !=
            cudaSuccess ||
        cudaMemcpyAsync(od, ones, obytes, cudaMemcpyHostToDevice, c->stream) != cudaSuccess) {
      err = CM_ERR_DEVICE;
      break;
    }
    int keep = c->gemv;
    c->gemv = pass == 0;
    err = gemm(c, od, N, xd, K, wd, wdt, T, N, K, 1, scratch);
    c->gemv = keep;
    if (!err && (cudaStreamSynchronize(c->stream) != cudaSuccess ||
                 cudaMemcpy(pass ? b : a, od, obytes, cudaMemcpyDeviceToHost) != cudaSuccess))
      err = CM_ERR_DEVICE;
  }
  if (!err) {
    double big = 1, worst = 0;
    for (int i = 0; i < T * N; i++) {
      big = fabs(b[i]) > big ? fabs(b[i]) : big;
      worst = fabs((double)a[i] - b[i]) > worst ? fabs((double)a[i] - b[i]) : worst;
    }
    if (!(worst <= 1e-3 * big)) {
      cm_warn("cuda", "few-rows matmul %s T=%d: differs from cuBLAS by %g (largest output %g)",
              kn_dtype_name(wdt), T, worst, big);
      err = CM_ERR_DEVICE;
    }
  }
  cudaFree(wd);
  cudaFree(xd);
  cudaFree(od);
  free(wh);
  free(xh);
  free(a);
  free(b);
  free(ones);
  return err;
}

int kn_cuda_gemv_check(struct kn_cuda_ctx *c) {
  static const int ts[] = {1, 3, KN_CUDA_GEMV_MAX_T};
  int err = 0;
  for (int d = 0; d < 2 && !err; d++)
    for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]) && !err; i++)
      err = gemv_case(c, d ? KN_DTYPE_F16 : KN_DTYPE_BF16, ts[i]);
  (void)cudaGetLastError(); /* a failure here is reported, not left pending */
  /* a fault that broke the context (not a mere mismatch) fails the backend */
  KN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
  return err;
}
