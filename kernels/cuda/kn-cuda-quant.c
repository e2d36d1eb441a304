/* kn-cuda-quant.c — matmuls over weights in ggml's block formats
 * (KN_CAP_BLOCK_WEIGHTS; the kernels are kn-cuda-quant.cu), and their check
 * when the backend is made.
 *
 *   few rows (T <= KN_CUDA_QGEMV_T): the dequantizing few-rows kernel in
 *     launches of up to 8 rows, each reading the weights once, exact f32
 *     values and f32 sums (the CPU's f32 definition up to the order of the
 *     sums);
 *   more rows: the inputs narrowed to bf16, then for each tile of at most
 *     KN_CUDA_QTILE_BYTES of weights the tile's rows dequantized to bf16 in
 *     scratch and cublasGemmEx (f32 accumulation) into its columns of out:
 *     no dequantized copy of a whole matrix is ever made.
 *
 * kn_embed's block tables go through kn-cuda-embed.cu's launcher into the
 * dequantizing gather; kn_matmul_softcap and kn_matmul_argmax run kn_matmul,
 * then the softcap and argmax kernels (kn-backend.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-log.h"
#include "kernels/cuda/kn-cuda-impl.h"
#include "kernels/kn-backend-impl.h"
#include "kernels/kn-dtype.h"

#define KN_CUDA_QTILE_BYTES ((size_t)64 << 20) /* bytes of bf16 weights a tile, at most */

int kn_cuda_matmul_q(struct kn_cuda_ctx *c, float *out, ptrdiff_t ldo, const float *in,
                     ptrdiff_t ldi, const void *w, enum kn_dtype wdt, int T, int N, int K,
                     int accumulate) {
  if (c->qgemv && T <= KN_CUDA_QGEMV_T) {
    for (int t0 = 0; t0 < T; t0 += KN_CUDA_GEMV_MAX_T) {
      int tt = T - t0 < KN_CUDA_GEMV_MAX_T ? T - t0 : KN_CUDA_GEMV_MAX_T;
      KN_CUDA_RUN(c, kn_cuda_launch_qgemv(c->stream, out + (ptrdiff_t)t0 * ldo, ldo,
                                          in + (ptrdiff_t)t0 * ldi, ldi, w, wdt, tt, N, K,
                                          c->qgemv_rows, c->qgemv_octets, accumulate));
    }
    return 0;
  }
  int rows = c->qtile_rows;
  if (rows <= 0) { /* whole multiples of 64 rows within the budget */
    size_t fit = KN_CUDA_QTILE_BYTES / ((size_t)K * 2);
    rows = fit < 64 ? 64 : fit > (size_t)N ? N : (int)(fit - fit % 64);
  }
  if (rows > N) rows = N;
  if (T == 1) ldo = N; /* cuBLAS wants ldc >= the tile's rows even for one column */
  if (ldo > INT32_MAX) return CM_ERR_UNSUPPORTED;
  const size_t abytes = ((size_t)T * (size_t)K * 2 + 255) & ~(size_t)255;
  const size_t rb = kn_row_bytes(wdt, (size_t)K);
  void *scratch;
  int err = kn_cuda_scratch(c, abytes + (size_t)rows * (size_t)K * 2, &scratch);
  if (err) return err;
  void *act = scratch, *tile = (char *)scratch + abytes;
  const float one = 1.0f, zero = 0.0f;
  KN_CUDA_RUN(c, kn_cuda_launch_narrow(c->stream, act, KN_DTYPE_BF16, in, ldi, T, K));
  for (int n0 = 0; n0 < N; n0 += rows) {
    int m = N - n0 < rows ? N - n0 : rows;
    KN_CUDA_RUN(
        c, kn_cuda_launch_qtile(c->stream, tile, (const char *)w + (size_t)n0 * rb, wdt, m, K));
    KN_CUBLAS_RUN(c,
                  cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, T, K, &one, tile, CUDA_R_16BF,
                               K, act, CUDA_R_16BF, K, accumulate ? &one : &zero, out + n0,
                               CUDA_R_32F, (int)ldo, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  return 0;
}

/* Warns that block formats (only_low: only kn_dtype_lowbit's) are refused,
 * naming the formats of bad (bits 1u << dtype) and the first failure, why. */
static void warn_refused(unsigned bad, int only_low, const char *why) {
  char names[96] = "";
  for (int dt = 0; dt < KN_DTYPE__COUNT; dt++)
    if (bad & 1u << dt)
      snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", *names ? " " : "",
               kn_dtype_name((enum kn_dtype)dt));
  cm_warn("cuda",
          "weights in %s are refused on this device: the kernels of %s failed their check (%s)",
          only_low ? "q3_k, iq4_nl, iq4_xs and q2_k (llama.cpp's Q2_K, Q3_K and IQ4 files)"
                   : "block formats (GGUF files, --quantization q8_0|q4_0|q4_k)",
          names, why);
}

/* $name as 1, 2 or 4; dflt where unset, or (with a warning) anything else. */
static int env_124(const char *name, int dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  if (!strcmp(v, "1") || !strcmp(v, "2") || !strcmp(v, "4")) return v[0] - '0';
  cm_warn("cuda", "%s=%s is not 1, 2 or 4: ignored", name, v);
  return dflt;
}

int kn_cuda_quant_check(struct kn_backend *be, struct kn_cuda_ctx *c) {
  const char *gv = getenv("LMSERVE_CUDA_GEMV");
  c->qgemv = !gv || strcmp(gv, "0");
  c->qgemv_rows = env_124("LMSERVE_CUDA_QGEMV_ROWS", 0);
  c->qgemv_octets = env_124("LMSERVE_CUDA_QGEMV_OCTETS", 1);
  /* tiles of 16 rows, so that the check's 37 outputs take three */
  int keep = c->qtile_rows;
  c->qtile_rows = 16;
  char why[256];
  /* the few-rows kernel's f32 sums and cuBLAS's over bf16 operands: about
   * an f32 epsilon per term of the longest chain, far below one element of
   * the check's rows of 3 blocks */
  unsigned bad = kn_block_check(be, c->qgemv ? KN_CUDA_QGEMV_T : 0, 3e-5, why, sizeof why);
  c->qtile_rows = keep;
  (void)cudaGetLastError(); /* a failure inside is reported here, not left pending */
  /* a failing format of kn_dtype_lowbit takes only those formats with it */
  if (bad) {
    unsigned low = 0;
    for (int dt = 0; dt < KN_DTYPE__COUNT; dt++)
      low |= kn_dtype_lowbit((enum kn_dtype)dt) ? 1u << dt : 0u;
    be->caps &=
        ~(unsigned)(bad & ~low ? KN_CAP_BLOCK_WEIGHTS | KN_CAP_BLOCK_LOWBIT : KN_CAP_BLOCK_LOWBIT);
    warn_refused(bad, !(bad & ~low), why);
  }
  /* a fault that broke the context (not a mere mismatch) fails the backend */
  KN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
  return 0;
}
