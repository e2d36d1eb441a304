/* kn-fp8.c — FP8 weights: kn_matmul_fp8's argument checks, whether a backend
 * serves FP8 weights, and the per-feature quantization --quantization fp8
 * does at load (the numpy reference in tests/unit/kernels rounds the same
 * values the same way). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/kn-backend-impl.h"

int kn_matmul_fp8(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                  const uint8_t *w, const float *scale, int T, int N, int K, int accumulate) {
  if (!be || T < 0 || N < 0 || K < 0) return CM_ERR_INVAL;
  if (T == 0 || N == 0) return 0;
  if (!out || !kn__valid_ld(ldo, T, N)) return CM_ERR_INVAL;
  if (K > 0 && (!in || !w || !kn__valid_ld(ldi, T, K))) return CM_ERR_INVAL;
  if (!scale) return CM_ERR_INVAL;
  return KN_CALL(matmul_fp8, out, ldo, in, ldi, w, scale, T, N, K, accumulate);
}

int kn_fp8_weights(struct kn_backend *be, char *why, size_t whylen) {
  if (!be) return CM_ERR_INVAL;
  if (!be->ops->fp8_weights || !be->ops->matmul_fp8)
    return cm_fail(why, whylen, CM_ERR_UNSUPPORTED,
                   "the %s backend has no FP8 weight kernels (they need a GPU with FP8 tensor "
                   "cores: compute capability 8.9 or newer)",
                   kn_backend_name(be));
  return be->ops->fp8_weights(be->ctx, why, whylen);
}

int kn_fp8_quantize_rows(uint8_t *q, float *scale, const void *w, enum kn_dtype wdt, ptrdiff_t ldw,
                         int N, int K, const float *amax) {
  for (int n = 0; n < N; n++) {
    size_t row = (size_t)n * (size_t)ldw;
    float big = 0.0f;
    if (amax) {
      big = amax[n];
    } else {
      for (int k = 0; k < K; k++) {
        float a = fabsf(kn_load_f32(w, wdt, row + (size_t)k));
        big = a > big || a != a ? a : big;
      }
    }
    if (!isfinite(big)) return CM_ERR_RANGE;
    float s = big > 0.0f ? big / 448.0f : 1.0f;
    if (!(s > 0.0f)) s = 1.0f; /* a largest magnitude below 448 * the smallest f32 */
    scale[n] = s;
    uint8_t *qr = q + (size_t)n * (size_t)K;
    for (int k = 0; k < K; k++) {
      float v = kn_load_f32(w, wdt, row + (size_t)k);
      if (!isfinite(v)) return CM_ERR_RANGE;
      qr[k] = kn_f32_to_f8e4m3(v / s);
    }
  }
  return 0;
}
