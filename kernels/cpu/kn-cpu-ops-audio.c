/* kn-cpu-ops-audio.c — the CPU backend's audio encoder ops (kn-backend.h):
 * the plain C definitions of kn-audio.h, split over the pool's threads by
 * output rows (each row's sums in the definition's order, so the results do
 * not depend on the split or on which rows share a call). Arguments were
 * validated by kn-audio.c. */
#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/kn-audio.h"
#include "kernels/kn-backend-impl.h"

/* Below this much work (multiply-adds) an op runs on the calling thread. */
#define AUDIO_PAR_MIN (1 << 16)

struct audio_task {
  float *out;
  ptrdiff_t ldo;
  const float *x, *w;
  ptrdiff_t ldx;
  int T, F, Cin, Cout;  /* conv3x3_s2 */
  const int32_t *first; /* dwconv_causal (C = Cout, K = Cin) */
  const float *k, *v, *rel;
  ptrdiff_t ldk, ldv;
  const int32_t *span; /* local_attn_rel (q = x, ldq = ldx) */
  int heads, hd, dmin, dmax;
  float cap;
};

static void conv_run(void *arg, long long u0, long long u1, int ith) {
  const struct audio_task *a = arg;
  (void)ith;
  kn_ref_conv3x3_s2(a->out, a->x, a->w, a->T, a->F, a->Cin, a->Cout, u0, u1);
}

static void dwconv_run(void *arg, long long u0, long long u1, int ith) {
  const struct audio_task *a = arg;
  (void)ith;
  kn_ref_dwconv_causal(a->out, a->ldo, a->x, a->ldx, a->w, a->first, a->Cout, a->Cin, (int)u0,
                       (int)u1);
}

static void attn_run(void *arg, long long u0, long long u1, int ith) {
  const struct audio_task *a = arg;
  (void)ith;
  kn_ref_local_attn_rel(a->out, a->ldo, a->x, a->ldx, a->k, a->ldk, a->v, a->ldv, a->rel, a->span,
                        a->heads, a->hd, a->dmin, a->dmax, a->cap, (int)u0, (int)u1);
}

/* Runs fn over n units of `per_unit` multiply-adds each. */
static void run(struct kn_cpu_ctx *ctx, long long n, double per_unit, kn_cpu_task_fn fn,
                struct audio_task *a) {
  double work = per_unit * (double)n;
  long long grain = work < AUDIO_PAR_MIN ? n : (long long)(AUDIO_PAR_MIN / per_unit) + 1;
  kn_cpu_pool_run(ctx->pool, n, grain, fn, a);
}

static int cpu_conv3x3_s2(void *p, float *out, const float *x, const float *w, int T, int F,
                          int Cin, int Cout) {
  struct audio_task a = {.out = out, .x = x, .w = w, .T = T, .F = F, .Cin = Cin, .Cout = Cout};
  run(p, (long long)((T + 1) / 2) * ((F + 1) / 2), 9.0 * Cin * Cout, conv_run, &a);
  return 0;
}

static int cpu_dwconv_causal(void *p, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                             const float *w, const int32_t *first, int T, int C, int K) {
  struct audio_task a = {
      .out = out, .ldo = ldo, .x = x, .ldx = ldx, .w = w, .first = first, .Cin = K, .Cout = C};
  run(p, T, (double)C * K, dwconv_run, &a);
  return 0;
}

static int cpu_local_attn_rel(void *p, float *out, ptrdiff_t ldo, const float *q, ptrdiff_t ldq,
                              const float *k, ptrdiff_t ldk, const float *v, ptrdiff_t ldv,
                              const float *rel, const int32_t *span, int T, int heads, int hd,
                              int dmin, int dmax, float cap) {
  struct audio_task a = {.out = out,
                         .ldo = ldo,
                         .x = q,
                         .ldx = ldq,
                         .k = k,
                         .ldk = ldk,
                         .v = v,
                         .ldv = ldv,
                         .rel = rel,
                         .span = span,
                         .heads = heads,
                         .hd = hd,
                         .dmin = dmin,
                         .dmax = dmax,
                         .cap = cap};
  run(p, T, 3.0 * heads * hd * (dmax - dmin + 1), attn_run, &a);
  return 0;
}

void kn_cpu_audio_ops_fill(struct kn_backend_ops *ops) {
  ops->conv3x3_s2 = cpu_conv3x3_s2;
  ops->dwconv_causal = cpu_dwconv_causal;
  ops->local_attn_rel = cpu_local_attn_rel;
}
