/* kn-fused.c — the fused ops of kn-backend.h: their argument checks, and the
 * unfused sequence each stands for, run when a backend has no fused version
 * (or its fused kernel failed the check it gets when the backend is made).
 *
 * A backend's fused op may also decline a call (CM_ERR_UNSUPPORTED: a shape
 * its kernel does not take, or a kernel that failed its check), and then the
 * sequence runs. The sequences are the definition: every fused kernel is
 * tested against them (kn-fused-check.c, when a backend is made, and
 * tests/unit/kernels/test-kn-fused.c), and a forward pass written with the
 * fused calls gives, on a backend without them, the bits it gave with the
 * unfused ones. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/kn-backend-impl.h"

int kn_fused_enabled(void) {
  static int on = -1; /* the environment is read once */
  int v = __atomic_load_n(&on, __ATOMIC_RELAXED);
  if (v < 0) {
    const char *e = getenv("LMSERVE_FUSED");
    v = !(e && !strcmp(e, "0"));
    __atomic_store_n(&on, v, __ATOMIC_RELAXED);
  }
  return v;
}

/* ---- add + norm ------------------------------------------------------------ */

/* A norm's mode and weight as kn_rmsnorm checks them: 0 or a cm_err. */
static int norm_args(const void *w, enum kn_dtype wdt, enum kn_norm_mode mode) {
  if (mode != KN_NORM_MUL_W && mode != KN_NORM_MUL_ONE_PLUS_W && mode != KN_NORM_NO_W)
    return CM_ERR_INVAL;
  if (mode == KN_NORM_NO_W) return 0;
  if (!w) return CM_ERR_INVAL;
  return kn__valid_weight_dtype(wdt) ? 0 : CM_ERR_UNSUPPORTED;
}

/* x[T, H] = (x + o) * scale, row by row unless both are contiguous. */
static int add_scale(struct kn_backend *be, float *x, ptrdiff_t ldx, const float *o, ptrdiff_t ldo,
                     int T, int H, float scale) {
  int rc = 0;
  if ((ldx == H && ldo == H) || T == 1) {
    size_t n = (size_t)T * (size_t)H;
    rc = kn_add(be, x, x, o, n);
    if (!rc && scale != 1.0f) rc = kn_scale(be, x, x, scale, n);
    return rc;
  }
  for (int t = 0; t < T && !rc; t++) {
    float *xr = x + (ptrdiff_t)t * ldx;
    rc = kn_add(be, xr, xr, o + (ptrdiff_t)t * ldo, (size_t)H);
    if (!rc && scale != 1.0f) rc = kn_scale(be, xr, xr, scale, (size_t)H);
  }
  return rc;
}

int kn_add_norm(struct kn_backend *be, float *x, ptrdiff_t ldx, float *o, ptrdiff_t ldo, float *h,
                ptrdiff_t ldh, int T, int H, const void *post_w, const void *next_w,
                enum kn_dtype wdt, float scale, float eps, enum kn_norm_mode mode) {
  if (!be || T < 0 || H < 0) return CM_ERR_INVAL;
  if (T == 0 || H == 0) return 0;
  if (!x || !o || !kn__valid_ld(ldx, T, H) || !kn__valid_ld(ldo, T, H)) return CM_ERR_INVAL;
  if (h && !kn__valid_ld(ldh, T, H)) return CM_ERR_INVAL;
  int err = norm_args(post_w, wdt, mode);
  if (!err && h) err = norm_args(next_w, wdt, mode);
  if (err) return err;
  if (!(eps >= 0.0f) || !(scale == scale)) return CM_ERR_INVAL;
  if (be->ops->add_norm && kn_fused_enabled()) {
    err = KN_CALL(add_norm, x, ldx, o, ldo, h, ldh, T, H, post_w, next_w, wdt, scale, eps, mode);
    if (err != CM_ERR_UNSUPPORTED) return err;
  }
  return kn__seq_add_norm(be, x, ldx, o, ldo, h, ldh, T, H, post_w, next_w, wdt, scale, eps, mode);
}

int kn__seq_add_norm(struct kn_backend *be, float *x, ptrdiff_t ldx, float *o, ptrdiff_t ldo,
                     float *h, ptrdiff_t ldh, int T, int H, const void *post_w, const void *next_w,
                     enum kn_dtype wdt, float scale, float eps, enum kn_norm_mode mode) {
  int rc = kn_rmsnorm(be, o, ldo, o, ldo, T, H, post_w, wdt, eps, mode);
  if (!rc) rc = add_scale(be, x, ldx, o, ldo, T, H, scale);
  if (!rc && h) rc = kn_rmsnorm(be, h, ldh, x, ldx, T, H, next_w, wdt, eps, mode);
  return rc;
}

/* ---- q/k norm, RoPE, KV write ------------------------------------------------ */

/* rmsnorm of every head of a [T, heads, D] operand with token stride ld, in place. */
static int norm_heads(struct kn_backend *be, float *a, ptrdiff_t ld, int T, int heads, int D,
                      const void *w, enum kn_dtype wdt, float eps, enum kn_norm_mode mode) {
  if (ld == (ptrdiff_t)heads * D || T == 1)
    return kn_rmsnorm(be, a, D, a, D, T * heads, D, w, wdt, eps, mode);
  int rc = 0;
  for (int t = 0; t < T && !rc; t++) {
    float *r = a + (ptrdiff_t)t * ld;
    rc = kn_rmsnorm(be, r, D, r, D, heads, D, w, wdt, eps, mode);
  }
  return rc;
}

int kn_qkv_prep(struct kn_backend *be, const struct kn_qkv_prep_args *p, int T) {
  if (!be || !p || T < 0) return CM_ERR_INVAL;
  if (T == 0) return 0;
  const struct kn_kv_view *view = p->view;
  if (!view || !p->q || !p->pos || !p->inv_freq || p->n_heads <= 0) return CM_ERR_INVAL;
  int D = view->head_dim;
  if (D <= 0 || (D & 1) || D > KN_MAX_HEAD_DIM)
    return D > KN_MAX_HEAD_DIM ? CM_ERR_UNSUPPORTED : CM_ERR_INVAL;
  if (!kn__valid_ld(p->ldq, T, p->n_heads * D)) return CM_ERR_INVAL;
  int err = norm_args(p->q_w, p->wdt, p->mode);
  if (err) return err;
  if (!(p->eps >= 0.0f) || !p->k != !p->v) return CM_ERR_INVAL;
  for (int t = 0; t < T; t++)
    if (p->pos[t] < 0) return CM_ERR_RANGE;
  if (p->k) {
    err = norm_args(p->k_w, p->wdt, p->mode);
    if (!err) err = kn__check_kv_write(view, p->slots, p->k, p->ldk, p->v, p->ldv, T);
    if (err) return err;
  }
  if (be->ops->qkv_prep && kn_fused_enabled()) {
    err = KN_CALL(qkv_prep, p, T);
    if (err != CM_ERR_UNSUPPORTED) return err;
  }
  return kn__seq_qkv_prep(be, p, T);
}

int kn__seq_qkv_prep(struct kn_backend *be, const struct kn_qkv_prep_args *p, int T) {
  const struct kn_kv_view *view = p->view;
  int D = view->head_dim;
  int rc = norm_heads(be, p->q, p->ldq, T, p->n_heads, D, p->q_w, p->wdt, p->eps, p->mode);
  if (!rc) rc = kn_rope(be, p->q, p->ldq, T, p->n_heads, D, p->pos, p->inv_freq);
  if (rc || !p->k) return rc;
  int kvh = view->n_kv_heads;
  rc = norm_heads(be, p->k, p->ldk, T, kvh, D, p->k_w, p->wdt, p->eps, p->mode);
  if (!rc) rc = kn_rope(be, p->k, p->ldk, T, kvh, D, p->pos, p->inv_freq);
  if (!rc && p->v_norm)
    rc = norm_heads(be, p->v, p->ldv, T, kvh, D, NULL, KN_DTYPE_F32, p->eps, KN_NORM_NO_W);
  if (!rc) rc = kn_kv_write(be, view, p->slots, p->k, p->ldk, p->v, p->ldv, T);
  return rc;
}

/* ---- matmuls of one input ------------------------------------------------------ */

/* The weight types the matmul ops take: the element types and the block
 * formats where be takes them (kn_matmul), FP8 codes with per-feature scales
 * (kn_matmul_fp8). 0, CM_ERR_UNSUPPORTED or CM_ERR_INVAL. */
static int mm_dtype_check(const struct kn_backend *be, enum kn_dtype wdt, int K) {
  return wdt == KN_DTYPE_F8E4M3 ? 0 : kn__check_matmul_dtype(be, wdt, K);
}

/* A matmul's scale as its weight type wants it: present for FP8, else absent. */
static int mm_scale_ok(enum kn_dtype wdt, const float *scale) {
  return (wdt == KN_DTYPE_F8E4M3) == (scale != NULL);
}

/* One part of the sequence: kn_matmul, or kn_matmul_fp8 for FP8 weights. */
static int mm_one(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                  const void *w, const float *scale, enum kn_dtype wdt, int T, int N, int K) {
  if (wdt == KN_DTYPE_F8E4M3) return kn_matmul_fp8(be, out, ldo, in, ldi, w, scale, T, N, K, 0);
  return kn_matmul(be, out, ldo, in, ldi, w, wdt, T, N, K, 0);
}

int kn_matmul_n(struct kn_backend *be, const float *in, ptrdiff_t ldi, enum kn_dtype wdt, int T,
                int K, const struct kn_mm_part *parts, int n_parts) {
  if (!be || T < 0 || K < 0 || !parts || n_parts < 1 || n_parts > KN_MM_MAX_PARTS)
    return CM_ERR_INVAL;
  int rc = mm_dtype_check(be, wdt, K);
  if (rc) return rc;
  if (T == 0) return 0;
  if (K > 0 && (!in || !kn__valid_ld(ldi, T, K))) return CM_ERR_INVAL;
  for (int i = 0; i < n_parts; i++) {
    const struct kn_mm_part *p = &parts[i];
    if (p->N < 0 || (p->N > 0 && (!p->out || (K > 0 && !p->w) || !kn__valid_ld(p->ldo, T, p->N))))
      return CM_ERR_INVAL;
    if (wdt != KN_DTYPE_F8E4M3 ? p->scale != NULL : p->N > 0 && !p->scale) return CM_ERR_INVAL;
  }
  rc = CM_ERR_UNSUPPORTED;
  if (be->ops->matmul_n && K > 0 && kn_fused_enabled())
    rc = KN_CALL(matmul_n, in, ldi, wdt, T, K, parts, n_parts);
  if (rc != CM_ERR_UNSUPPORTED) return rc;
  return kn__seq_matmul_n(be, in, ldi, wdt, T, K, parts, n_parts);
}

int kn__seq_matmul_n(struct kn_backend *be, const float *in, ptrdiff_t ldi, enum kn_dtype wdt,
                     int T, int K, const struct kn_mm_part *parts, int n_parts) {
  int rc = 0;
  for (int i = 0; i < n_parts && !rc; i++)
    rc = mm_one(be, parts[i].out, parts[i].ldo, in, ldi, parts[i].w, parts[i].scale, wdt, T,
                parts[i].N, K);
  return rc;
}

int kn_matmul_glu(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                  const void *wg, const float *sg, const void *wu, const float *su,
                  enum kn_dtype wdt, int T, int N, int K, float *scratch) {
  if (!be || T < 0 || N < 0 || K < 0) return CM_ERR_INVAL;
  int rc = mm_dtype_check(be, wdt, K);
  if (rc) return rc;
  if (T == 0 || N == 0) return 0;
  if (!out || !kn__valid_ld(ldo, T, N)) return CM_ERR_INVAL;
  if (K > 0 && (!in || !wg || !wu || !kn__valid_ld(ldi, T, K))) return CM_ERR_INVAL;
  if (!mm_scale_ok(wdt, sg) || !mm_scale_ok(wdt, su)) return CM_ERR_INVAL;
  if (be->ops->matmul_glu && K > 0 && kn_fused_enabled()) {
    int err = KN_CALL(matmul_glu, out, ldo, in, ldi, wg, sg, wu, su, wdt, T, N, K);
    if (err != CM_ERR_UNSUPPORTED) return err;
  }
  if (!scratch) return CM_ERR_INVAL;
  return kn__seq_matmul_glu(be, out, ldo, in, ldi, wg, sg, wu, su, wdt, T, N, K, scratch);
}

int kn__seq_matmul_glu(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *in,
                       ptrdiff_t ldi, const void *wg, const float *sg, const void *wu,
                       const float *su, enum kn_dtype wdt, int T, int N, int K, float *scratch) {
  int rc = mm_one(be, out, ldo, in, ldi, wg, sg, wdt, T, N, K);
  if (!rc) rc = mm_one(be, scratch, N, in, ldi, wu, su, wdt, T, N, K);
  if (!rc) rc = kn_gelu_mul(be, out, ldo, out, ldo, scratch, N, T, N);
  return rc;
}
