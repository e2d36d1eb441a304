/* kn-cuda-fp8.c — kn_matmul_fp8 on the device, three ways:
 *
 *   few rows (T <= KN_CUDA_FP8_GEMV_T, decode): the few-rows kernel
 *     (kn-cuda-fp8.cu), at most 8 input rows a launch, each weight row read
 *     once a launch: bf16 inputs, exact products, f32 sums, the scale last;
 *   many rows (T >= KN_FP8_ACT_MIN_T, prefill) on FP8 tensor cores: each
 *     input row quantized to e4m3 with its own scale (largest magnitude /
 *     448, vLLM's per-token dynamic scheme), cuBLASLt's e4m3 x e4m3 GEMM into
 *     f32, then the weight and row scales;
 *   otherwise (and wherever a fast path failed its check or does not take
 *     the shape): the codes widened to bf16 in scratch (exact), the inputs
 *     narrowed to bf16, cublasGemmEx into f32, then the scales: the same
 *     arithmetic as the few-rows kernel up to the order of the sums.
 *
 * Each path is checked against a host computation of its definition when
 * the backend is made (kn_cuda_fp8_check); one that differs is not used,
 * loudly. FP8 weights are served (kn_fp8_weights) on compute capability 8.9
 * or newer, where the tensor cores take e4m3, and only if the widening path
 * passed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* cublasLt.h declares a function without a prototype */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop

#include "common/cm-err.h"
#include "common/cm-log.h"
#include "kernels/cuda/kn-cuda-impl.h"
#include "kernels/kn-dtype.h"

#define LT_WS ((size_t)32 << 20)

static size_t al256(size_t n) {
  return (n + 255) & ~(size_t)255;
}

/* cuBLASLt's FP8 GEMM wants 16-byte aligned operands and dimensions that are
 * multiples of 16. */
static int lt_fits(const void *w, int T, int N, int K) {
  return T >= KN_FP8_ACT_MIN_T && K % 16 == 0 && N % 16 == 0 && (uintptr_t)w % 16 == 0;
}

static int run_gemv(struct kn_cuda_ctx *c, float *out, ptrdiff_t ldo, const float *in,
                    ptrdiff_t ldi, const void *w, const float *scale, int T, int N, int K,
                    int accumulate) {
  for (int t0 = 0; t0 < T; t0 += 8) {
    int n = T - t0 < 8 ? T - t0 : 8;
    KN_CUDA_RUN(c, kn_cuda_launch_gemv_fp8(c->stream, out + (ptrdiff_t)t0 * ldo, ldo,
                                           in + (ptrdiff_t)t0 * ldi, ldi, w, scale, n, N, K,
                                           accumulate));
  }
  return 0;
}

static int run_widened(struct kn_cuda_ctx *c, float *out, ptrdiff_t ldo, const float *in,
                       ptrdiff_t ldi, const void *w, const float *scale, int T, int N, int K,
                       int accumulate) {
  size_t wb = al256((size_t)N * (size_t)K * 2), xb = al256((size_t)T * (size_t)K * 2);
  void *scratch;
  int err = kn_cuda_scratch(c, wb + xb + (size_t)T * (size_t)N * 4, &scratch);
  if (err) return err;
  void *wbf = scratch, *xbf = (char *)scratch + wb;
  float *tmp = (float *)((char *)scratch + wb + xb);
  if (T == 1) ldi = K;
  const float one = 1.0f, zero = 0.0f;
  KN_CUDA_RUN(c, kn_cuda_launch_fp8_dequant(c->stream, wbf, w, (size_t)N * (size_t)K));
  KN_CUDA_RUN(c, kn_cuda_launch_narrow(c->stream, xbf, KN_DTYPE_BF16, in, ldi, T, K));
  KN_CUBLAS_RUN(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, wbf, CUDA_R_16BF,
                                K, xbf, CUDA_R_16BF, K, &zero, tmp, CUDA_R_32F, N,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  KN_CUDA_RUN(c,
              kn_cuda_launch_fp8_epilogue(c->stream, out, ldo, tmp, scale, NULL, T, N, accumulate));
  return 0;
}

/* Column-major views for out^T [N, T] = W (op T of the [K, N] view) x codes^T. */
static int run_lt(struct kn_cuda_ctx *c, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                  const void *w, const float *scale, int T, int N, int K, int accumulate) {
  size_t cb = al256((size_t)T * (size_t)K), sb = al256((size_t)T * 4);
  void *scratch;
  int err = kn_cuda_scratch(c, cb + sb + (size_t)T * (size_t)N * 4, &scratch);
  if (err) return err;
  void *codes = scratch;
  float *sa = (float *)((char *)scratch + cb), *tmp = (float *)((char *)scratch + cb + sb);
  KN_CUDA_RUN(c, kn_cuda_launch_fp8_quant_rows(c->stream, codes, sa, in, ldi, T, K));
  cublasLtMatmulDesc_t op = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const float one = 1.0f, zero = 0.0f;
  cublasStatus_t st = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, (uint64_t)K, (uint64_t)N, K);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, (uint64_t)K, (uint64_t)T, K);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, (uint64_t)N, (uint64_t)T, N);
  if (st == CUBLAS_STATUS_SUCCESS && c->graph_mode != KN_GRAPH_REPLAY)
    st = cublasLtMatmul((cublasLtHandle_t)c->lt, op, &one, w, la, codes, lb, &zero, tmp, ld, tmp,
                        ld, NULL, c->lt_ws, LT_WS, c->stream);
  if (ld) cublasLtMatrixLayoutDestroy(ld);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (op) cublasLtMatmulDescDestroy(op);
  if (st != CUBLAS_STATUS_SUCCESS) return kn_cublas_fail(st, "cublasLtMatmul", __FILE__, __LINE__);
  KN_CUDA_RUN(c,
              kn_cuda_launch_fp8_epilogue(c->stream, out, ldo, tmp, scale, sa, T, N, accumulate));
  return 0;
}

int kn_cuda_op_matmul_fp8(void *ctx, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                          const uint8_t *w, const float *scale, int T, int N, int K,
                          int accumulate) {
  struct kn_cuda_ctx *c = ctx;
  int err = kn_cuda_enter(c);
  if (err) return err;
  if (K == 0) {
    if (accumulate) return 0;
    size_t width = (size_t)N * sizeof(float);
    size_t pitch = T == 1 ? width : (size_t)ldo * sizeof(float);
    KN_CUDA_RUN(c, cudaMemset2DAsync(out, pitch, 0, width, (size_t)T, c->stream));
    return 0;
  }
  if (c->fp8_gemv && kn_cuda_fp8_gemv_fits(in, ldi, w, T, K))
    return run_gemv(c, out, ldo, in, ldi, w, scale, T, N, K, accumulate);
  if (c->fp8_lt && lt_fits(w, T, N, K))
    return run_lt(c, out, ldo, in, ldi, w, scale, T, N, K, accumulate);
  return run_widened(c, out, ldo, in, ldi, w, scale, T, N, K, accumulate);
}

int kn_cuda_op_fp8_weights(void *ctx, char *why, size_t whylen) {
  struct kn_cuda_ctx *c = ctx;
  if (c->cc < 89)
    return cm_fail(why, whylen, CM_ERR_UNSUPPORTED,
                   "device %d has compute capability %d.%d; FP8 weights need 8.9 or newer (Ada, "
                   "Hopper, Blackwell)",
                   c->device, c->cc / 10, c->cc % 10);
  if (!c->fp8_ok)
    return cm_fail(why, whylen, CM_ERR_UNSUPPORTED,
                   "the FP8 matmul failed its check on device %d (see the log)", c->device);
  return 0;
}

/* ---- the check ------------------------------------------------------------------ */

static float check_value(uint32_t *r) {
  *r = *r * 1664525u + 1013904223u;
  return (float)(*r >> 8) / (float)(1u << 23) - 1.0f;
}

enum { PATH_GEMV, PATH_WIDENED, PATH_LT };

/* One problem through one path, against the host's double sums of the path's
 * definition (the Lt path quantizes the inputs per row first); 0 when every
 * output is within 1e-4 of the largest (1e-3 for the Lt path: Hopper's FP8
 * tensor cores add their products with fewer bits than f32 between the
 * promotions cuBLASLt makes to f32, and an H200 differs by 1.6e-4 of the
 * largest output at K = 1168; a wrong layout or scale is off by far more). */
static int fp8_case(struct kn_cuda_ctx *c, int path, int T, int N, int K) {
  uint8_t *wh = malloc((size_t)N * K), *xq = malloc((size_t)T * K);
  float *xh = malloc(sizeof(float) * T * K), *sh = malloc(sizeof(float) * N);
  float *got = malloc(sizeof(float) * T * N), *sa = malloc(sizeof(float) * T);
  void *wd = NULL, *xd = NULL, *sd = NULL, *od = NULL;
  int err = wh && xq && xh && sh && got && sa ? 0 : CM_ERR_NOMEM;
  uint32_t r = 0x2545f491u ^ (uint32_t)(T * 131 + path);
  for (int i = 0; !err && i < N * K; i++)
    wh[i] = kn_f32_to_f8e4m3(300.0f * check_value(&r));
  for (int n = 0; !err && n < N; n++)
    sh[n] = 1e-3f * (1.0f + (float)n / (float)N);
  for (int i = 0; !err && i < T * K; i++)
    xh[i] = 3.0f * check_value(&r);
  for (int t = 0; !err && t < T; t++) { /* the Lt path's input quantization, on the host */
    float m = 0.0f;
    for (int k = 0; k < K; k++)
      m = fabsf(xh[t * K + k]) > m ? fabsf(xh[t * K + k]) : m;
    sa[t] = m > 0.0f ? m / 448.0f : 1.0f;
    for (int k = 0; k < K; k++)
      xq[t * K + k] = kn_f32_to_f8e4m3(xh[t * K + k] / sa[t]);
  }
  if (!err && (cudaMalloc(&wd, (size_t)N * K) != cudaSuccess ||
               cudaMalloc(&xd, sizeof(float) * T * K) != cudaSuccess ||
               cudaMalloc(&sd, sizeof(float) * N) != cudaSuccess ||
               cudaMalloc(&od, sizeof(float) * T * N) != cudaSuccess ||
               cudaMemcpy(wd, wh, (size_t)N * K, cudaMemcpyHostToDevice) != cudaSuccess ||
               cudaMemcpy(xd, xh, sizeof(float) * T * K, cudaMemcpyHostToDevice) != cudaSuccess ||
               cudaMemcpy(sd, sh, sizeof(float) * N, cudaMemcpyHostToDevice) != cudaSuccess))
    err = CM_ERR_DEVICE;
  if (!err) {
    err = path == PATH_GEMV      ? run_gemv(c, od, N, xd, K, wd, sd, T, N, K, 0)
          : path == PATH_WIDENED ? run_widened(c, od, N, xd, K, wd, sd, T, N, K, 0)
                                 : run_lt(c, od, N, xd, K, wd, sd, T, N, K, 0);
    if (!err && (cudaStreamSynchronize(c->stream) != cudaSuccess ||
                 cudaMemcpy(got, od, sizeof(float) * T * N, cudaMemcpyDeviceToHost) != cudaSuccess))
      err = CM_ERR_DEVICE;
  }
  double big = 1e-30, worst = 0;
  for (int t = 0; !err && t < T; t++)
    for (int n = 0; n < N; n++) {
      double s = 0;
      for (int k = 0; k < K; k++) {
        double x = path == PATH_LT ? (double)kn_f8e4m3_to_f32(xq[t * K + k]) * sa[t]
                                   : (double)kn_bf16_to_f32(kn_f32_to_bf16(xh[t * K + k]));
        s += x * (double)kn_f8e4m3_to_f32(wh[(size_t)n * K + k]);
      }
      s *= sh[n];
      big = fmax(big, fabs(s));
      double e = fabs(s - got[t * N + n]);
      worst = isnan(e) ? INFINITY : fmax(worst, e);
    }
  if (!err && !(worst <= (path == PATH_LT ? 1e-3 : 1e-4) * big)) {
    static const char *names[] = {"few-rows kernel", "widened GEMM", "cuBLASLt FP8 GEMM"};
    cm_warn("cuda", "FP8 matmul, %s, T=%d: differs from the host by %g (largest output %g)",
            names[path], T, worst, big);
    err = CM_ERR_DEVICE;
  }
  cudaFree(wd);
  cudaFree(xd);
  cudaFree(sd);
  cudaFree(od);
  free(wh);
  free(xq);
  free(xh);
  free(sh);
  free(got);
  free(sa);
  return err;
}

int kn_cuda_fp8_check(struct kn_cuda_ctx *c) {
  int major = 0, minor = 0;
  KN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device));
  KN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c->device));
  c->cc = major * 10 + minor;
  int err = fp8_case(c, PATH_WIDENED, 40, 48, 1168);
  c->fp8_ok = err == 0;
  if (err) cm_warn("cuda", "FP8 weights are off: the widened FP8 GEMM failed its check");
  static const int ts[] = {1, 3, 8, 21};
  int g = 0;
  for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]) && !g; i++)
    g = fp8_case(c, PATH_GEMV, ts[i], 37, 1168);
  c->fp8_gemv = g == 0;
  if (g) cm_warn("cuda", "FP8 few-rows matmuls take the widened GEMM: the kernel's check failed");
  cublasLtHandle_t lt = NULL;
  if (c->cc >= 89 && cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS && (c->lt = lt) &&
      cudaMalloc(&c->lt_ws, LT_WS) == cudaSuccess) {
    int l = fp8_case(c, PATH_LT, KN_FP8_ACT_MIN_T + 16, 64, 1168);
    c->fp8_lt = l == 0;
    if (l)
      cm_warn("cuda", "FP8 prefill takes the widened GEMM: cuBLASLt's FP8 GEMM failed its check");
  }
  (void)cudaGetLastError(); /* a mismatch is reported, not left pending */
  KN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
  return 0;
}

void kn_cuda_fp8_destroy(struct kn_cuda_ctx *c) {
  if (c->lt) cublasLtDestroy((cublasLtHandle_t)c->lt);
  if (c->lt_ws) cudaFree(c->lt_ws);
  c->lt = NULL;
  c->lt_ws = NULL;
}
