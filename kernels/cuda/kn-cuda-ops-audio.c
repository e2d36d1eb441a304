/* kn-cuda-ops-audio.c — host side of the CUDA backend's audio encoder ops
 * (kn_conv3x3_s2, kn_dwconv_causal, kn_local_attn_rel: kn-cuda-audio.cu),
 * and their check when the backend is made: each op on small problems
 * against its plain C definition (kernels/kn-audio.c) run on the host. An
 * op whose check failed answers CM_ERR_UNSUPPORTED, and the public call runs
 * the definition on the host instead (kn-audio.c), after a warning here. */
#include <math.h>
#include <stdlib.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-hash.h"
#include "common/cm-log.h"
#include "kernels/cuda/kn-cuda-impl.h"
#include "kernels/kn-audio.h"

int kn_cuda_op_conv3x3_s2(void *ctx, float *out, const float *x, const float *w, int T, int F,
                          int Cin, int Cout) {
  struct kn_cuda_ctx *c = ctx;
  if (!c->audio_ok || 9 * (size_t)Cin * sizeof(float) > 48 * 1024) return CM_ERR_UNSUPPORTED;
  int err = kn_cuda_enter(c);
  if (err) return err;
  KN_CUDA_RUN(c, kn_cuda_launch_conv3x3_s2(c->stream, out, x, w, T, F, Cin, Cout));
  return 0;
}

int kn_cuda_op_dwconv_causal(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                             const float *w, const int32_t *first, int T, int C, int K) {
  struct kn_cuda_ctx *c = ctx;
  if (!c->audio_ok) return CM_ERR_UNSUPPORTED;
  void *first_d;
  int err = kn_cuda_enter(c);
  if (!err) err = kn_cuda_stage(c, first, (size_t)T * sizeof(int32_t), &first_d);
  if (err) return err;
  KN_CUDA_RUN(c, kn_cuda_launch_dwconv_causal(c->stream, out, ldo, x, ldx, w, first_d, T, C, K));
  return 0;
}

int kn_cuda_op_local_attn_rel(void *ctx, float *out, ptrdiff_t ldo, const float *q, ptrdiff_t ldq,
                              const float *k, ptrdiff_t ldk, const float *v, ptrdiff_t ldv,
                              const float *rel, const int32_t *span, int T, int heads, int hd,
                              int dmin, int dmax, float cap) {
  struct kn_cuda_ctx *c = ctx;
  if (!c->audio_ok) return CM_ERR_UNSUPPORTED;
  void *span_d;
  int err = kn_cuda_enter(c);
  if (!err) err = kn_cuda_stage(c, span, (size_t)T * 2 * sizeof(int32_t), &span_d);
  if (err) return err;
  KN_CUDA_RUN(c, kn_cuda_launch_local_attn_rel(c->stream, out, ldo, q, ldq, k, ldk, v, ldv, rel,
                                               span_d, T, heads, hd, dmin, dmax, cap));
  return 0;
}

/* ---- the check ------------------------------------------------------------------- */

/* n floats in [-1, 1) from s. */
static void fill(float *a, size_t n, uint64_t *s) {
  for (size_t i = 0; i < n; i++)
    a[i] = (float)(cm_splitmix64(s) >> 40) / (float)(1 << 23) - 1.0f;
}

/* Largest |got - want| over n, relative to max(1, the largest |want|). */
static double rel_err(const float *got, const float *want, size_t n) {
  double worst = 0.0, big = 1.0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - (double)want[i]);
    if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    if (fabs((double)want[i]) > big) big = fabs((double)want[i]);
  }
  return worst / big;
}

/* Uploads n host floats into new backend memory (NULL on failure). */
static float *up(struct kn_backend *be, const float *h, size_t n) {
  float *d = kn_alloc(be, n * sizeof(float));
  if (d && kn_upload(be, d, h, n * sizeof(float))) {
    kn_free(be, d);
    d = NULL;
  }
  return d;
}

/* Problems: a 7 x 9 grid of 5 channels into 6 (odd sides: the padding on
 * both ends); 2 sequences of 5 and 6 rows over 7 channels, 3 taps; 11 rows
 * in sequences of 6 and 5, 3 heads of 40 (more than a warp), distances -1 to
 * 3, cap 2 (so that it bites). */
int kn_cuda_audio_check(struct kn_backend *be, struct kn_cuda_ctx *c) {
  enum { T = 7, F = 9, CI = 5, CO = 6, TO = 4, FO = 5 };
  enum { R = 11, C = 7, K = 3, NH = 3, HD = 40, W = NH * HD, DMIN = -1, DMAX = 3, ND = 5 };
  static float x[T * F * CI], w[CO * 9 * CI], cw[TO * FO * CO], cr[TO * FO * CO];
  static float dx[R * C], dw[C * K], dg[R * C], dr[R * C];
  static float q[R * W], k[R * W], v[R * W], rel[ND * W], ag[R * W], ar[R * W];
  int32_t first[R], span[2 * R];
  for (int t = 0; t < R; t++) {
    first[t] = t < 6 ? 0 : 6;
    span[2 * t] = first[t];
    span[2 * t + 1] = t < 6 ? 6 : R;
  }
  uint64_t s = 0x617564696f;
  fill(x, CM_ARRAY_LEN(x), &s), fill(w, CM_ARRAY_LEN(w), &s), fill(dx, CM_ARRAY_LEN(dx), &s);
  fill(dw, CM_ARRAY_LEN(dw), &s), fill(q, CM_ARRAY_LEN(q), &s), fill(k, CM_ARRAY_LEN(k), &s);
  fill(v, CM_ARRAY_LEN(v), &s), fill(rel, CM_ARRAY_LEN(rel), &s);
  kn_ref_conv3x3_s2(cr, x, w, T, F, CI, CO, 0, TO * FO);
  kn_ref_dwconv_causal(dr, C, dx, C, dw, first, C, K, 0, R);
  kn_ref_local_attn_rel(ar, W, q, W, k, W, v, W, rel, span, NH, HD, DMIN, DMAX, 2.0f, 0, R);
  c->audio_ok = 1; /* for the check's own calls */
  float *xd = up(be, x, CM_ARRAY_LEN(x)), *wd = up(be, w, CM_ARRAY_LEN(w));
  float *dxd = up(be, dx, CM_ARRAY_LEN(dx)), *dwd = up(be, dw, CM_ARRAY_LEN(dw));
  float *qd = up(be, q, CM_ARRAY_LEN(q)), *kd = up(be, k, CM_ARRAY_LEN(k));
  float *vd = up(be, v, CM_ARRAY_LEN(v)), *reld = up(be, rel, CM_ARRAY_LEN(rel));
  float *o1 = kn_alloc(be, sizeof(cw)), *o2 = kn_alloc(be, sizeof(dg)),
        *o3 = kn_alloc(be, sizeof(ag));
  int err = xd && wd && dxd && dwd && qd && kd && vd && reld && o1 && o2 && o3 ? 0 : CM_ERR_NOMEM;
  if (!err) err = kn_conv3x3_s2(be, o1, xd, wd, T, F, CI, CO);
  if (!err) err = kn_dwconv_causal(be, o2, C, dxd, C, dwd, first, R, C, K);
  if (!err)
    err =
        kn_local_attn_rel(be, o3, W, qd, W, kd, W, vd, W, reld, span, R, NH, HD, DMIN, DMAX, 2.0f);
  if (!err) err = kn_download(be, cw, o1, sizeof(cw));
  if (!err) err = kn_download(be, dg, o2, sizeof(dg));
  if (!err) err = kn_download(be, ag, o3, sizeof(ag));
  double e1 = err ? INFINITY : rel_err(cw, cr, CM_ARRAY_LEN(cw));
  double e2 = err ? INFINITY : rel_err(dg, dr, CM_ARRAY_LEN(dg));
  double e3 = err ? INFINITY : rel_err(ag, ar, CM_ARRAY_LEN(ag));
  c->audio_ok = e1 <= 1e-5 && e2 <= 1e-5 && e3 <= 1e-5;
  if (!c->audio_ok)
    cm_warn("cuda",
            "the audio encoder's ops run on the host: their kernels failed the check (%s; "
            "errors %.3g, %.3g, %.3g of the largest value)",
            err ? cm_strerror(err) : "wrong values", e1, e2, e3);
  float *all[] = {xd, wd, dxd, dwd, qd, kd, vd, reld, o1, o2, o3};
  for (size_t i = 0; i < CM_ARRAY_LEN(all); i++)
    kn_free(be, all[i]);
  return err == CM_ERR_DEVICE ? err : 0;
}
