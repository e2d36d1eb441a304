/* kn-cuda-fused.c — host side of the CUDA backend's fused ops
 * (kn-cuda-fused.cu): stage the host arrays, launch, and decline
 * (CM_ERR_UNSUPPORTED: kn-fused.c then runs the unfused sequence) what the
 * kernels do not take — shapes past their limits, f32 weights for the
 * matmuls, more than KN_CUDA_GEMV_MAX_T rows (KN_CUDA_FP8_GEMV_T for FP8
 * weights), misaligned operands — and every op whose check failed when the
 * backend was made (ctx->fused_off). */
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-log.h"
#include "kernels/cuda/kn-cuda-impl.h"
#include "kernels/kn-backend-impl.h"

#define KN_CUDA_ADD_NORM_MAX_H 12288 /* the row in 48 KiB of shared memory */

int kn_cuda_op_add_norm(void *ctx, float *x, ptrdiff_t ldx, float *o, ptrdiff_t ldo, float *h,
                        ptrdiff_t ldh, int T, int H, const void *post_w, const void *next_w,
                        enum kn_dtype wdt, float scale, float eps, enum kn_norm_mode mode) {
  struct kn_cuda_ctx *c = ctx;
  if ((c->fused_off & KN_FUSED_ADD_NORM) || H > KN_CUDA_ADD_NORM_MAX_H) return CM_ERR_UNSUPPORTED;
  int err = kn_cuda_enter(c);
  if (err) return err;
  KN_CUDA_RUN(c, kn_cuda_launch_add_norm(c->stream, x, ldx, o, ldo, h, ldh, T, H, post_w, next_w,
                                         wdt, scale, eps, mode));
  return 0;
}

int kn_cuda_op_qkv_prep(void *ctx, const struct kn_qkv_prep_args *p, int T) {
  struct kn_cuda_ctx *c = ctx;
  const struct kn_kv_view *view = p->view;
  if ((c->fused_off & KN_FUSED_QKV_PREP) || (p->mode != KN_NORM_NO_W && p->wdt != KN_DTYPE_F32) ||
      (unsigned)T > 65535u)
    return CM_ERR_UNSUPPORTED;
  int err = kn_cuda_enter(c);
  if (!err && p->k) err = kn_cuda_check_view(view);
  if (err) return err;
  struct kn_cuda_qkv_args a = {
      .q = p->q,
      .k = p->k,
      .v = p->v,
      .ldq = p->ldq,
      .ldk = p->ldk,
      .ldv = p->ldv,
      .nh = p->n_heads,
      .kvh = view->n_kv_heads,
      .D = view->head_dim,
      .q_w = p->q_w,
      .k_w = p->k_w,
      .eps = p->eps,
      .mode = (int)p->mode,
      .v_norm = p->v_norm,
      .inv_freq = p->inv_freq,
      .pool = view->pool,
      .page_bytes = view->page_bytes,
      .k_off = view->k_off,
      .k_scale = view->k_scale,
      .v_scale = view->v_scale,
      .v_off = view->v_off,
      .block_tokens = view->block_tokens,
  };
  void *pos_d = NULL, *slots_d = NULL;
  err = kn_cuda_stage(c, p->pos, (size_t)T * sizeof(int32_t), &pos_d);
  if (!err && p->k) err = kn_cuda_stage(c, p->slots, (size_t)T * sizeof(int32_t), &slots_d);
  if (err) return err;
  a.pos = pos_d;
  a.slots = slots_d;
  KN_CUDA_RUN(c, kn_cuda_launch_qkv_prep(c->stream, &a, T, view->dtype));
  return 0;
}

/* Whether the few-rows kernels take w (and the call's input): bf16 / f16
 * weights for T <= KN_CUDA_GEMV_MAX_T (kn_cuda_gemv_fits); e4m3 codes for T <=
 * KN_CUDA_FP8_GEMV_T (kn_cuda_fp8_gemv_fits, in launches of
 * KN_CUDA_GEMV_MAX_T rows as kn_matmul_fp8 runs them) where kn-cuda-fp8.c's
 * few-rows kernel, whose dot product the fused ones share, passed its check. */
static int gemv_ok(const struct kn_cuda_ctx *c, const float *in, ptrdiff_t ldi, const void *w,
                   enum kn_dtype wdt, int T, int K) {
  if (wdt == KN_DTYPE_F8E4M3) return c->fp8_gemv && kn_cuda_fp8_gemv_fits(in, ldi, w, T, K);
  return c->gemv && kn_cuda_gemv_fits(in, ldi, w, wdt, T, K);
}

/* Rows in the launch that starts at row t0 of T. */
static int launch_rows(int T, int t0) {
  return T - t0 < KN_CUDA_GEMV_MAX_T ? T - t0 : KN_CUDA_GEMV_MAX_T;
}

int kn_cuda_op_matmul_n(void *ctx, const float *in, ptrdiff_t ldi, enum kn_dtype wdt, int T, int K,
                        const struct kn_mm_part *parts, int n_parts) {
  struct kn_cuda_ctx *c = ctx;
  if (c->fused_off & (wdt == KN_DTYPE_F8E4M3 ? KN_FUSED_MATMUL_N_FP8 : KN_FUSED_MATMUL_N))
    return CM_ERR_UNSUPPORTED;
  struct kn_cuda_gemv_parts g;
  memset(&g, 0, sizeof(g));
  for (int i = 0; i < n_parts; i++) {
    if (!gemv_ok(c, in, ldi, parts[i].w, wdt, T, K) || parts[i].N > (1 << 28))
      return CM_ERR_UNSUPPORTED;
    g.out[i] = parts[i].out;
    g.ldo[i] = parts[i].ldo;
    g.w[i] = parts[i].w;
    g.scale[i] = parts[i].scale; /* NULL but for FP8 (kn_matmul_n checked) */
    g.first[i + 1] = g.first[i] + parts[i].N;
  }
  g.n = n_parts;
  for (int i = n_parts + 1; i < 5; i++) /* rows past the last part belong to none */
    g.first[i] = g.first[n_parts];
  int err = kn_cuda_enter(c);
  if (err) return err;
  for (int t0 = 0; t0 < T; t0 += KN_CUDA_GEMV_MAX_T) { /* one launch but for FP8 past 8 rows */
    struct kn_cuda_gemv_parts gt = g;
    for (int i = 0; i < n_parts; i++)
      if (g.out[i]) gt.out[i] = g.out[i] + (ptrdiff_t)t0 * g.ldo[i];
    KN_CUDA_RUN(c, kn_cuda_launch_gemv_n(c->stream, &gt, in + (ptrdiff_t)t0 * ldi, ldi, wdt,
                                         launch_rows(T, t0), K));
  }
  return 0;
}

int kn_cuda_op_matmul_glu(void *ctx, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                          const void *wg, const float *sg, const void *wu, const float *su,
                          enum kn_dtype wdt, int T, int N, int K) {
  struct kn_cuda_ctx *c = ctx;
  unsigned off = wdt == KN_DTYPE_F8E4M3 ? KN_FUSED_MATMUL_GLU_FP8 : KN_FUSED_MATMUL_GLU;
  if ((c->fused_off & off) || !gemv_ok(c, in, ldi, wg, wdt, T, K) ||
      !gemv_ok(c, in, ldi, wu, wdt, T, K))
    return CM_ERR_UNSUPPORTED;
  int err = kn_cuda_enter(c);
  if (err) return err;
  for (int t0 = 0; t0 < T; t0 += KN_CUDA_GEMV_MAX_T)
    KN_CUDA_RUN(c, kn_cuda_launch_gemv_glu(c->stream, out + (ptrdiff_t)t0 * ldo, ldo,
                                           in + (ptrdiff_t)t0 * ldi, ldi, wg, sg, wu, su, wdt,
                                           launch_rows(T, t0), N, K));
  return 0;
}

int kn_cuda_fused_check(struct kn_backend *be) {
  struct kn_cuda_ctx *c = be->ctx;
  if (!kn_fused_enabled()) {
    c->fused_off = ~0u;
    cm_info("cuda", "fused ops off ($LMSERVE_FUSED=0): the unfused sequences run");
    return 0;
  }
  char why[256];
  /* the kernels repeat the sequence's float operations; 1e-5 of the largest
   * value leaves room only for a contraction the compiler chose differently */
  unsigned bad = kn_fused_check(be, 1e-5, why, sizeof why);
  (void)cudaGetLastError(); /* a failure inside is reported here, not left pending */
  c->fused_off = bad;
  if (bad)
    cm_warn("cuda",
            "fused ops 0x%x run as their unfused sequences: their kernels' check failed "
            "(%s)",
            bad, why);
  /* a fault that broke the context (not a mere mismatch) fails the backend */
  KN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
  return 0;
}
