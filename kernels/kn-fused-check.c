/* kn-fused-check.c — a backend's fused ops against the unfused sequences
 * they stand for (kn-fused.c), on small random problems run on the backend
 * itself: what a backend checks when it is made (a fused kernel written
 * without the hardware at hand can then make nothing wrong, only nothing
 * faster) and what the tests check on every backend.
 *
 * Each problem's inputs go up once; the fused op and the sequence each run on
 * their own copy; the results come back and are compared as the largest
 * absolute difference over the largest magnitude of the sequence's result. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/kn-backend-impl.h"

struct chk {
  struct kn_backend *be;
  double tol;
  unsigned bad; /* KN_FUSED_* */
  char *why;
  size_t whylen;
  uint64_t rng;
  void *bufs[32]; /* backend memory to free */
  int n_bufs;
};

static float chk_rand(struct chk *c) {
  c->rng ^= c->rng >> 12;
  c->rng ^= c->rng << 25;
  c->rng ^= c->rng >> 27;
  return (float)((c->rng * 0x2545f4914f6cdd1dull >> 40) * (2.0 / 16777216.0) - 1.0);
}

/* n random values in [-amp, amp) of dtype dt, in backend memory (NULL on failure). */
static void *chk_up(struct chk *c, enum kn_dtype dt, size_t n, float amp) {
  size_t bytes = n * kn_dtype_size(dt);
  unsigned char *host = malloc(bytes);
  void *dev = c->n_bufs < 32 ? kn_alloc(c->be, bytes) : NULL;
  if (host && dev) {
    for (size_t i = 0; i < n; i++)
      kn_store_f32(host, dt, i, chk_rand(c) * amp);
    if (kn_upload(c->be, dev, host, bytes)) {
      kn_free(c->be, dev);
      dev = NULL;
    }
  } else if (dev) {
    kn_free(c->be, dev);
    dev = NULL;
  }
  free(host);
  if (dev) c->bufs[c->n_bufs++] = dev;
  return dev;
}

/* A backend copy of src (bytes), or NULL. */
static void *chk_dup(struct chk *c, const void *src, size_t bytes) {
  void *dev = c->n_bufs < 32 ? kn_alloc(c->be, bytes) : NULL;
  if (dev && kn_copy(c->be, dev, src, bytes)) {
    kn_free(c->be, dev);
    dev = NULL;
  }
  if (dev) c->bufs[c->n_bufs++] = dev;
  return dev;
}

static void chk_free_all(struct chk *c) {
  for (int i = 0; i < c->n_bufs; i++)
    kn_free(c->be, c->bufs[i]);
  c->n_bufs = 0;
}

__attribute__((format(printf, 3, 4))) static void chk_fail(struct chk *c, unsigned op,
                                                           const char *fmt, ...) {
  if (!c->bad && c->why && c->whylen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, c->whylen, fmt, ap);
    va_end(ap);
  }
  c->bad |= op;
}

/* Compares n floats of two backend buffers; records op as bad past the tolerance. */
static void chk_same(struct chk *c, unsigned op, const char *what, const float *want,
                     const float *got, size_t n) {
  float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
  double diff = 0.0, mag = 0.0;
  int ok = a && b && !kn_download(c->be, a, want, sizeof(float) * n) &&
           !kn_download(c->be, b, got, sizeof(float) * n);
  for (size_t i = 0; ok && i < n; i++) {
    if (isnan(a[i]) != isnan(b[i])) diff = INFINITY;
    if (isnan(a[i]) || isnan(b[i])) continue;
    diff = fmax(diff, fabs((double)a[i] - (double)b[i]));
    mag = fmax(mag, fabs((double)a[i]));
  }
  free(a);
  free(b);
  if (!ok)
    chk_fail(c, op, "%s: the results could not be read back", what);
  else if (c->tol == 0.0 ? diff != 0.0 : !(diff <= c->tol * mag))
    chk_fail(c, op, "%s: differs from the unfused ops by %.3g of the largest value", what,
             mag > 0 ? diff / mag : diff);
}

/* ---- the problems ---------------------------------------------------------- */

static void check_add_norm(struct chk *c, int T, int H, enum kn_dtype wdt, enum kn_norm_mode mode,
                           float scale, int with_h) {
  size_t n = (size_t)T * H, fb = n * sizeof(float);
  float *x = chk_up(c, KN_DTYPE_F32, n, 2.0f), *o = chk_up(c, KN_DTYPE_F32, n, 1.0f);
  void *pw = chk_up(c, wdt, (size_t)H, 1.0f), *nw = chk_up(c, wdt, (size_t)H, 1.0f);
  float *h1 = chk_up(c, KN_DTYPE_F32, n, 1.0f);
  float *x2 = x ? chk_dup(c, x, fb) : NULL, *o2 = o ? chk_dup(c, o, fb) : NULL;
  float *h2 = h1 ? chk_dup(c, h1, fb) : NULL;
  if (!x2 || !o2 || !h2 || !pw || !nw) {
    chk_fail(c, KN_FUSED_ADD_NORM, "%s: no memory for the check", "add_norm");
    return;
  }
  float eps = 1e-6f;
  int rc = c->be->ops->add_norm(c->be->ctx, x, H, o, H, with_h ? h1 : NULL, H, T, H, pw, nw, wdt,
                                scale, eps, mode);
  if (rc == CM_ERR_UNSUPPORTED) return; /* declined: the sequence runs instead */
  if (!rc)
    rc = kn__seq_add_norm(c->be, x2, H, o2, H, with_h ? h2 : NULL, H, T, H, pw, nw, wdt, scale, eps,
                          mode);
  if (rc) {
    chk_fail(c, KN_FUSED_ADD_NORM, "%s failed: error %d", "add_norm", rc);
    return;
  }
  chk_same(c, KN_FUSED_ADD_NORM, "add_norm x", x2, x, n);
  if (with_h) chk_same(c, KN_FUSED_ADD_NORM, "add_norm h", h2, h1, n);
}

#define KN_FUSED_CHECK_MAX_KVH 8 /* kv heads of the scaled check, at most */

/* A pool of pages; T tokens at positions pos0.. of one sequence written through
 * a shuffled block table (a few slots skipped with -1); an fp8 pool with scales
 * per kv head when scaled. */
static void check_qkv_prep(struct chk *c, int T, int nh, int kvh, int D, enum kn_dtype kvdt,
                           int with_kv, int v_norm, enum kn_norm_mode mode, int scaled) {
  const int bt = 16, pos0 = 21, n_pages = (pos0 + T) / bt + 3;
  size_t blk = (size_t)bt * kvh * D * kn_dtype_size(kvdt);
  struct kn_kv_view view = {.page_bytes = 2 * blk + 64,
                            .n_pages = n_pages,
                            .k_off = blk + 64,
                            .v_off = 0,
                            .block_tokens = bt,
                            .n_kv_heads = kvh,
                            .head_dim = D,
                            .dtype = kvdt};
  size_t pool_bytes = (size_t)n_pages * view.page_bytes;
  size_t nq = (size_t)T * nh * D, nk = (size_t)T * kvh * D;
  float *q1 = chk_up(c, KN_DTYPE_F32, nq, 3.0f), *k1 = chk_up(c, KN_DTYPE_F32, nk, 3.0f);
  float *v1 = chk_up(c, KN_DTYPE_F32, nk, 3.0f);
  void *qw = chk_up(c, KN_DTYPE_F32, (size_t)D, 1.0f),
       *kw = chk_up(c, KN_DTYPE_F32, (size_t)D, 1.0f);
  float *freq = chk_up(c, KN_DTYPE_F32, (size_t)D / 2, 0.5f);
  void *pool1 = chk_up(c, KN_DTYPE_F32, pool_bytes / 4, 1.0f);
  float *q2 = q1 ? chk_dup(c, q1, nq * 4) : NULL, *k2 = k1 ? chk_dup(c, k1, nk * 4) : NULL;
  float *v2 = v1 ? chk_dup(c, v1, nk * 4) : NULL;
  void *pool2 = pool1 ? chk_dup(c, pool1, pool_bytes) : NULL;
  /* scales in [0.25, 2.25): |random| in [0, 1) is amp 1's, shifted */
  float *sc = scaled ? chk_up(c, KN_DTYPE_F32, (size_t)2 * kvh, 0.0f) : NULL;
  if (sc) {
    float h[2 * KN_FUSED_CHECK_MAX_KVH];
    for (int i = 0; i < 2 * kvh && i < 2 * KN_FUSED_CHECK_MAX_KVH; i++)
      h[i] = 0.25f + 2.0f * fabsf(chk_rand(c));
    if (kvh > KN_FUSED_CHECK_MAX_KVH || kn_upload(c->be, sc, h, sizeof(float) * 2 * (size_t)kvh))
      sc = NULL;
    view.k_scale = sc;
    view.v_scale = sc ? sc + kvh : NULL;
  }
  int32_t pos[8], slots[8];
  if (!q2 || !k2 || !v2 || !pool2 || !qw || !kw || !freq || T > 8 || (scaled && !sc)) {
    chk_fail(c, KN_FUSED_QKV_PREP, "%s: no memory for the check", "qkv_prep");
    return;
  }
  for (int t = 0; t < T; t++) { /* pages in reverse order; the third token not written */
    int p = pos0 + t;
    pos[t] = p;
    slots[t] = t == 2 ? -1 : (n_pages - 1 - p / bt) * bt + p % bt;
  }
  struct kn_qkv_prep_args pr = {.q = q1,
                                .ldq = (ptrdiff_t)nh * D,
                                .n_heads = nh,
                                .k = with_kv ? k1 : NULL,
                                .v = with_kv ? v1 : NULL,
                                .ldk = (ptrdiff_t)kvh * D,
                                .ldv = (ptrdiff_t)kvh * D,
                                .q_w = qw,
                                .k_w = kw,
                                .wdt = KN_DTYPE_F32,
                                .eps = 1e-6f,
                                .mode = mode,
                                .v_norm = v_norm,
                                .pos = pos,
                                .inv_freq = freq,
                                .view = &view,
                                .slots = slots};
  view.pool = pool1;
  int rc = c->be->ops->qkv_prep(c->be->ctx, &pr, T);
  if (rc == CM_ERR_UNSUPPORTED) return;
  struct kn_kv_view view2 = view;
  view2.pool = pool2;
  pr.q = q2;
  pr.k = with_kv ? k2 : NULL;
  pr.v = with_kv ? v2 : NULL;
  pr.view = &view2;
  if (!rc) rc = kn__seq_qkv_prep(c->be, &pr, T);
  if (rc) {
    chk_fail(c, KN_FUSED_QKV_PREP, "%s failed: error %d", "qkv_prep", rc);
    return;
  }
  chk_same(c, KN_FUSED_QKV_PREP, "qkv_prep q", q2, q1, nq);
  if (kvdt == KN_DTYPE_F32) {
    chk_same(c, KN_FUSED_QKV_PREP, "qkv_prep pages", pool2, pool1, pool_bytes / 4);
    return;
  }
  /* a bf16 or fp8 pool: compared as f32 would mix neighbours; widen both first */
  size_t ne = pool_bytes / kn_dtype_size(kvdt);
  float *w1 = chk_up(c, KN_DTYPE_F32, ne, 0.0f), *w2 = chk_up(c, KN_DTYPE_F32, ne, 0.0f);
  unsigned char *hb = malloc(pool_bytes);
  float *hf = malloc(sizeof(float) * ne);
  int ok = w1 && w2 && hb && hf;
  for (int i = 0; ok && i < 2; i++) {
    ok = !kn_download(c->be, hb, i ? pool1 : pool2, pool_bytes);
    for (size_t j = 0; ok && j < ne; j++)
      hf[j] = kn_load_f32(hb, kvdt, j);
    ok = ok && !kn_upload(c->be, i ? w1 : w2, hf, sizeof(float) * ne);
  }
  free(hb);
  free(hf);
  if (!ok)
    chk_fail(c, KN_FUSED_QKV_PREP, "%s: no memory for the check", "qkv_prep");
  else
    chk_same(c, KN_FUSED_QKV_PREP, "qkv_prep pages", w2, w1, ne);
}

/* Weights of dtype wdt for the matmul checks, and for FP8 their scales (else NULL). */
static void *chk_weights(struct chk *c, enum kn_dtype wdt, int N, int K, float **scale) {
  int fp8 = wdt == KN_DTYPE_F8E4M3; /* codes over most of e4m3's range */
  *scale = fp8 ? chk_up(c, KN_DTYPE_F32, (size_t)N, 2e-3f) : NULL;
  void *w = chk_up(c, wdt, (size_t)N * K, fp8 ? 300.0f : 0.5f);
  return fp8 && !*scale ? NULL : w;
}

static void check_matmul_n(struct chk *c, int T, int K, enum kn_dtype wdt) {
  static const int Ns[3] = {72, 40, 40};
  int fp8 = wdt == KN_DTYPE_F8E4M3;
  unsigned op = fp8 ? KN_FUSED_MATMUL_N_FP8 : KN_FUSED_MATMUL_N;
  const char *name = fp8 ? "matmul_n fp8" : "matmul_n";
  float *in = chk_up(c, KN_DTYPE_F32, (size_t)T * K, 1.0f);
  struct kn_mm_part p1[3], p2[3];
  int ok = in != NULL;
  for (int i = 0; i < 3 && ok; i++) {
    float *sc;
    void *w = chk_weights(c, wdt, Ns[i], K, &sc);
    float *o1 = chk_up(c, KN_DTYPE_F32, (size_t)T * Ns[i], 1.0f);
    float *o2 = o1 ? chk_dup(c, o1, sizeof(float) * (size_t)T * Ns[i]) : NULL;
    ok = w && o2;
    p1[i] = (struct kn_mm_part){o1, Ns[i], w, Ns[i], sc};
    p2[i] = (struct kn_mm_part){o2, Ns[i], w, Ns[i], sc};
  }
  if (!ok) {
    chk_fail(c, op, "%s: no memory for the check", name);
    return;
  }
  int rc = c->be->ops->matmul_n(c->be->ctx, in, K, wdt, T, K, p1, 3);
  if (rc == CM_ERR_UNSUPPORTED) return;
  if (!rc) rc = kn__seq_matmul_n(c->be, in, K, wdt, T, K, p2, 3);
  if (rc) {
    chk_fail(c, op, "%s failed: error %d", name, rc);
    return;
  }
  for (int i = 0; i < 3; i++)
    chk_same(c, op, name, p2[i].out, p1[i].out, (size_t)T * Ns[i]);
}

static void check_matmul_glu(struct chk *c, int T, int N, int K, enum kn_dtype wdt) {
  int fp8 = wdt == KN_DTYPE_F8E4M3;
  unsigned op = fp8 ? KN_FUSED_MATMUL_GLU_FP8 : KN_FUSED_MATMUL_GLU;
  const char *name = fp8 ? "matmul_glu fp8" : "matmul_glu";
  float *in = chk_up(c, KN_DTYPE_F32, (size_t)T * K, 1.0f), *sg, *su;
  void *wg = chk_weights(c, wdt, N, K, &sg), *wu = chk_weights(c, wdt, N, K, &su);
  float *o1 = chk_up(c, KN_DTYPE_F32, (size_t)T * N, 1.0f);
  float *o2 = o1 ? chk_dup(c, o1, sizeof(float) * (size_t)T * N) : NULL;
  float *scratch = chk_up(c, KN_DTYPE_F32, (size_t)T * N, 1.0f);
  if (!in || !wg || !wu || !o2 || !scratch) {
    chk_fail(c, op, "%s: no memory for the check", name);
    return;
  }
  int rc = c->be->ops->matmul_glu(c->be->ctx, o1, N, in, K, wg, sg, wu, su, wdt, T, N, K);
  if (rc == CM_ERR_UNSUPPORTED) return;
  if (!rc) rc = kn__seq_matmul_glu(c->be, o2, N, in, K, wg, sg, wu, su, wdt, T, N, K, scratch);
  if (rc) {
    chk_fail(c, op, "%s failed: error %d", name, rc);
    return;
  }
  chk_same(c, op, name, o2, o1, (size_t)T * N);
}

unsigned kn_fused_check(struct kn_backend *be, double tol, char *why, size_t whylen) {
  struct chk c = {.be = be, .tol = tol, .why = why, .whylen = whylen, .rng = 0x853c49e6748fea9bull};
  if (why && whylen) why[0] = 0;
  const struct kn_backend_ops *ops = be->ops;
  static const enum kn_dtype wdts[] = {KN_DTYPE_F32, KN_DTYPE_BF16, KN_DTYPE_F16};
  if (ops->add_norm) {
    static const enum kn_norm_mode modes[] = {KN_NORM_MUL_W, KN_NORM_MUL_ONE_PLUS_W, KN_NORM_NO_W};
    for (int i = 0; i < 3; i++) {
      check_add_norm(&c, 3, 136, wdts[i], modes[i], i == 1 ? 1.0f : 0.71f, i != 2);
      check_add_norm(&c, 1, 1152, KN_DTYPE_F32, modes[i], 1.0f, 1);
      chk_free_all(&c);
    }
  }
  if (ops->qkv_prep) {
    check_qkv_prep(&c, 5, 4, 2, 64, KN_DTYPE_BF16, 1, 1, KN_NORM_MUL_W, 0);
    chk_free_all(&c);
    check_qkv_prep(&c, 1, 8, 1, 256, KN_DTYPE_F32, 1, 0, KN_NORM_MUL_ONE_PLUS_W, 0);
    chk_free_all(&c);
    check_qkv_prep(&c, 3, 4, 4, 512, KN_DTYPE_BF16, 0, 1, KN_NORM_MUL_W, 0);
    chk_free_all(&c);
    /* fp8 caches, with a checkpoint's scales and without */
    check_qkv_prep(&c, 4, 4, 2, 128, KN_DTYPE_F8E4M3, 1, 1, KN_NORM_MUL_W, 1);
    chk_free_all(&c);
    check_qkv_prep(&c, 2, 8, 4, 256, KN_DTYPE_F8E4M3, 1, 0, KN_NORM_MUL_ONE_PLUS_W, 0);
    chk_free_all(&c);
  }
  if (ops->matmul_n)
    for (int i = 0; i < 3; i++) {
      check_matmul_n(&c, i == 0 ? 1 : i == 1 ? 3 : 8, 128, wdts[i]);
      chk_free_all(&c);
      check_matmul_n(&c, 5, 136, wdts[(i + 1) % 3]);
      chk_free_all(&c);
    }
  if (ops->matmul_glu)
    for (int i = 0; i < 3; i++) {
      check_matmul_glu(&c, i == 0 ? 1 : i == 1 ? 3 : 8, 96, 128, wdts[i]);
      chk_free_all(&c);
    }
  if (ops->matmul_fp8) { /* FP8 weights: K a multiple of 16, T past one launch's 8 rows */
    static const int ts[] = {1, 3, 8, 21};
    for (int i = 0; i < 4; i++) {
      if (ops->matmul_n) check_matmul_n(&c, ts[i], i & 1 ? 176 : 128, KN_DTYPE_F8E4M3);
      chk_free_all(&c);
      if (ops->matmul_glu) check_matmul_glu(&c, ts[i], i & 1 ? 37 : 96, 128, KN_DTYPE_F8E4M3);
      chk_free_all(&c);
    }
  }
  chk_free_all(&c);
  return c.bad;
}
