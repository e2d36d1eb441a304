/* kn-cuda-ops-vision.c — host side of the CUDA backend's vision encoder ops
 * (LayerNorm, bias + activation, average pooling; Gemma 4's clamp, grid
 * pooling and standardisation): make the device current
 * and launch on the backend's stream. Arguments arrive validated by
 * kn-backend.c; nothing here waits. */
#include "common/cm-err.h"
#include "kernels/cuda/kn-cuda-impl.h"

int kn_cuda_op_layernorm(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                         int rows, int d, const void *w, const void *b, enum kn_dtype wdt,
                         float eps) {
  struct kn_cuda_ctx *c = ctx;
  int err = kn_cuda_enter(c);
  if (err) return err;
  KN_CUDA_CHECK(kn_cuda_launch_layernorm(c->stream, out, ldo, x, ldx, rows, d, w, b, wdt, eps));
  return 0;
}

int kn_cuda_op_bias_act(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                        const float *bias, int T, int N, enum kn_act act) {
  struct kn_cuda_ctx *c = ctx;
  int err = kn_cuda_enter(c);
  if (err) return err;
  KN_CUDA_CHECK(kn_cuda_launch_bias_act(c->stream, out, ldo, x, ldx, bias, T, N, act));
  return 0;
}

int kn_cuda_op_avg_pool2d(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                          int n_img, int side, int k, int C) {
  struct kn_cuda_ctx *c = ctx;
  int err = kn_cuda_enter(c);
  if (err) return err;
  KN_CUDA_CHECK(kn_cuda_launch_avg_pool2d(c->stream, out, ldo, x, ldx, n_img, side, k, C));
  return 0;
}

int kn_cuda_op_clamp(void *ctx, float *out, const float *a, float lo, float hi, size_t n) {
  struct kn_cuda_ctx *c = ctx;
  int err = kn_cuda_enter(c);
  if (err) return err;
  KN_CUDA_CHECK(kn_cuda_launch_clamp(c->stream, out, a, lo, hi, n));
  return 0;
}

int kn_cuda_op_avg_pool_grid(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                             int gw, int gh, int k, int C, float scale) {
  struct kn_cuda_ctx *c = ctx;
  int err = kn_cuda_enter(c);
  if (err) return err;
  KN_CUDA_CHECK(kn_cuda_launch_avg_pool_grid(c->stream, out, ldo, x, ldx, gw, gh, k, C, scale));
  return 0;
}

int kn_cuda_op_standardize(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                           int rows, int d, const float *bias, const float *scale) {
  struct kn_cuda_ctx *c = ctx;
  int err = kn_cuda_enter(c);
  if (err) return err;
  KN_CUDA_CHECK(kn_cuda_launch_standardize(c->stream, out, ldo, x, ldx, bias, scale, rows, d));
  return 0;
}
