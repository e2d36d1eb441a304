/* kn-block-check.c — a backend's ops over weights in ggml's block formats
 * (KN_CAP_BLOCK_WEIGHTS: kn_matmul, kn_matmul_argmax with a softcap,
 * kn_embed, kn_embed_dev) against the host's reference on small random
 * problems: what a backend checks when it is made, so that block kernels
 * written without the hardware at hand can make nothing wrong, and what the
 * tests check on the CPU.
 *
 * The reference is kn_dequant_row's values (optionally rounded to bf16 with
 * the inputs, for a backend whose GEMMs take bf16 operands) and the sums of
 * their products in double. A matmul output passes when it is within tol of
 * the sum of the products' magnitudes, which bounds any order of f32 sums
 * (tol a few f32 epsilons per term of the longest chain) while one wrong
 * element in a row of a few blocks is far outside it; the embeddings are the
 * dequantized values times the scale, bit for bit. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/kn-backend-impl.h"
#include "kernels/kn-quant.h"

/* BC_BLOCKS K-quant super-blocks a row (96 octets of 8 elements), or
 * BC_BLOCKS32 blocks of 32 (44 octets): both more than a warp's 32 lanes
 * take at once, so a device kernel's lanes go round more than once. */
enum { BC_N = 37, BC_T = 37, BC_BLOCKS = 3, BC_BLOCKS32 = 11, BC_PAD_I = 3, BC_PAD_O = 2 };

struct bchk {
  struct kn_backend *be;
  int bf16_above; /* rows of calls with more than this many rows: bf16 operands */
  double tol;
  unsigned bad; /* 1u << dtype of the formats that failed */
  char *why;
  size_t whylen;
  uint64_t rng;
  enum kn_dtype dt;
  int K;
  size_t rb;
  float *x, *wf; /* host: inputs [BC_T, ldi], dequantized weights [N, K] */
  float *o;      /* host: [BC_T, ldo] */
  void *w_d, *x_d, *o_d, *s_d, *id_d;
};

static float bc_rand(struct bchk *c) {
  return (float)((kn_xorshift64s(&c->rng) >> 40) * (2.0 / 16777216.0) - 1.0);
}

__attribute__((format(printf, 2, 3))) static void bc_fail(struct bchk *c, const char *fmt, ...) {
  if (!c->bad && c->why && c->whylen) {
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(c->why, c->whylen, "%s ", kn_dtype_name(c->dt));
    if (n >= 0 && (size_t)n < c->whylen) vsnprintf(c->why + n, c->whylen - (size_t)n, fmt, ap);
    va_end(ap);
  }
  c->bad |= 1u << c->dt;
}

static float bc_round(float v, int bf) {
  return bf ? kn_bf16_to_f32(kn_f32_to_bf16(v)) : v;
}

/* Row t of the reference product for output n: the sum and the sum of magnitudes. */
static void bc_ref(const struct bchk *c, int T, int t, int n, double *sum, double *mag) {
  const int bf = T > c->bf16_above, ldi = c->K + BC_PAD_I;
  double s = 0, m = 0;
  for (int k = 0; k < c->K; k++) {
    double p = (double)bc_round(c->wf[(size_t)n * c->K + k], bf) *
               (double)bc_round(c->x[(size_t)t * ldi + k], bf);
    s += p;
    m += fabs(p);
  }
  *sum = s;
  *mag = m;
}

/* kn_matmul of T rows (accumulating onto ones when acc) against the reference. */
static void bc_matmul(struct bchk *c, int T, int acc) {
  const int ldo = BC_N + BC_PAD_O, K = c->K;
  const size_t ob = sizeof(float) * (size_t)T * ldo;
  for (size_t i = 0; i < (size_t)T * ldo; i++)
    c->o[i] = 1.0f;
  int rc = kn_upload(c->be, c->o_d, c->o, ob);
  if (!rc) rc = kn_matmul(c->be, c->o_d, ldo, c->x_d, K + BC_PAD_I, c->w_d, c->dt, T, BC_N, K, acc);
  if (!rc) rc = kn_download(c->be, c->o, c->o_d, ob);
  if (rc) return bc_fail(c, "matmul T=%d: %s", T, cm_strerror(rc));
  for (int t = 0; t < T; t++)
    for (int n = 0; n < BC_N; n++) {
      double ref, mag, got = c->o[(size_t)t * ldo + n] - (acc ? 1.0 : 0.0);
      bc_ref(c, T, t, n, &ref, &mag);
      if (!(fabs(got - ref) <= c->tol * mag))
        return bc_fail(c, "matmul T=%d: out[%d, %d] = %.9g, reference %.9g (allowed %.3g)", T, t, n,
                       got, ref, c->tol * mag);
    }
  for (int t = 0; t < T; t++) /* the columns past N are not the call's */
    for (int n = BC_N; n < ldo; n++)
      if (c->o[(size_t)t * ldo + n] != 1.0f)
        return bc_fail(c, "matmul T=%d: wrote out[%d, %d], past its %d columns", T, t, n, BC_N);
}

/* kn_matmul_argmax of T rows with a softcap: each row's id must be a largest
 * reference logit within the tolerance, and its max that logit. */
static void bc_head(struct bchk *c, int T) {
  const float cap = 4.0f;
  int32_t ids[BC_T];
  float maxv[BC_T];
  int rc = kn_matmul_argmax(c->be, ids, maxv, c->x_d, c->K + BC_PAD_I, c->w_d, c->dt, T, BC_N, c->K,
                            cap, c->s_d);
  if (rc) return bc_fail(c, "head T=%d: %s", T, cm_strerror(rc));
  for (int t = 0; t < T; t++) {
    double z[BC_N], best = -INFINITY, slack = 0;
    for (int n = 0; n < BC_N; n++) {
      double s, mag;
      bc_ref(c, T, t, n, &s, &mag);
      z[n] = cap * tanh(s / cap);
      best = z[n] > best ? z[n] : best;
      slack = fmax(slack, c->tol * mag + 1e-6 * cap); /* + tanhf's own rounding */
    }
    if (ids[t] < 0 || ids[t] >= BC_N || !(z[ids[t]] >= best - 2 * slack))
      return bc_fail(c, "head T=%d: row %d took id %d, the reference's largest logit is %.9g", T, t,
                     (int)ids[t], best);
    if (!(fabs(maxv[t] - z[ids[t]]) <= slack))
      return bc_fail(c, "head T=%d: row %d's max %.9g, reference %.9g", T, t, maxv[t], z[ids[t]]);
  }
}

/* kn_embed (host ids) or kn_embed_dev (device ids, vocab BC_N - 1 so that
 * id 36 is outside it): the dequantized rows times the scale, bit for bit. */
static void bc_embed(struct bchk *c, int dev) {
  enum { T = 5 };
  const int32_t ids[T] = {BC_N - 1, 0, -1, 17, 5};
  const int H = c->K, vocab = dev ? BC_N - 1 : BC_N, ldo = H + BC_PAD_O;
  const float scale = 1.5f;
  int rc = dev ? kn_upload(c->be, c->id_d, ids, sizeof(ids)) : 0;
  if (!rc)
    rc = dev ? kn_embed_dev(c->be, c->o_d, ldo, c->w_d, c->dt, vocab, H, c->id_d, T, scale)
             : kn_embed(c->be, c->o_d, ldo, c->w_d, c->dt, vocab, H, ids, T, scale);
  if (!rc) rc = kn_download(c->be, c->o, c->o_d, sizeof(float) * T * (size_t)ldo);
  const char *what = dev ? "embed_dev" : "embed";
  if (rc) return bc_fail(c, "%s: %s", what, cm_strerror(rc));
  for (int t = 0; t < T; t++)
    for (int k = 0; k < H; k++) {
      int in = ids[t] >= 0 && ids[t] < vocab;
      float want = in ? c->wf[(size_t)ids[t] * H + k] * scale : 0.0f;
      float got = c->o[(size_t)t * ldo + k];
      if (memcmp(&got, &want, sizeof(float)))
        return bc_fail(c, "%s: row %d (id %d) element %d = %.9g, reference %.9g", what, t,
                       (int)ids[t], k, got, want);
    }
}

/* One format's problems: weights quantized from random values (the formats of
 * kn_dtype_lowbit, which nothing here writes, random blocks), inputs. */
static void bc_format(struct bchk *c, enum kn_dtype dt) {
  c->dt = dt;
  c->K = (kn_block_elems(dt) == 32 ? BC_BLOCKS32 : BC_BLOCKS) * kn_block_elems(dt);
  c->rb = kn_row_bytes(dt, (size_t)c->K);
  const int K = c->K, ldi = K + BC_PAD_I;
  const size_t wb = c->rb * BC_N, xb = sizeof(float) * (size_t)BC_T * ldi;
  /* the matmuls' [BC_T, N + pad] and the embeddings' [5, K + pad] outputs */
  const size_t ob = sizeof(float) * BC_T * (size_t)(K + BC_N + BC_PAD_O);
  uint8_t *wq = malloc(wb);
  float *row = malloc(sizeof(float) * (size_t)K);
  c->x = malloc(xb);
  c->wf = malloc(sizeof(float) * (size_t)BC_N * K);
  c->o = malloc(ob);
  c->w_d = kn_alloc(c->be, wb);
  c->x_d = kn_alloc(c->be, xb);
  c->o_d = kn_alloc(c->be, ob);
  c->s_d = kn_alloc(c->be, sizeof(float) * BC_T * BC_N);
  c->id_d = kn_alloc(c->be, sizeof(int32_t) * 8);
  int rc = wq && row && c->x && c->wf && c->o && c->w_d && c->x_d && c->o_d && c->s_d && c->id_d
               ? 0
               : CM_ERR_NOMEM;
  /* the formats read from files only: random blocks (small finite scales) */
  if (!rc && kn_dtype_lowbit(dt)) kn_random_blocks(dt, wq, wb / kn_block_bytes(dt), &c->rng);
  for (int n = 0; !rc && n < BC_N; n++) {
    if (!kn_dtype_lowbit(dt)) {
      for (int k = 0; k < K; k++) /* rows of different magnitudes, some entries zero */
        row[k] = (k % 29 == 3 ? 0.0f : bc_rand(c)) * (float)(1 + n % 5) * 0.25f;
      rc = kn_quantize_row(dt, row, wq + (size_t)n * c->rb, (size_t)K);
    }
    kn_dequant_row(dt, wq + (size_t)n * c->rb, c->wf + (size_t)n * K, (size_t)K);
  }
  for (size_t i = 0; !rc && i < (size_t)BC_T * ldi; i++)
    c->x[i] = 2.0f * bc_rand(c);
  if (!rc) rc = kn_upload(c->be, c->w_d, wq, wb);
  if (!rc) rc = kn_upload(c->be, c->x_d, c->x, xb);
  if (rc) {
    bc_fail(c, "setup: %s", cm_strerror(rc));
  } else {
    static const int ts[] = {1, 3, 8, 13, BC_T};
    for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
      bc_matmul(c, ts[i], ts[i] == 3);
    bc_head(c, 2);
    bc_head(c, 13);
    bc_head(c, BC_T);
    bc_embed(c, 0);
    bc_embed(c, 1);
  }
  void *dev[] = {c->w_d, c->x_d, c->o_d, c->s_d, c->id_d};
  for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
    if (dev[i]) kn_free(c->be, dev[i]);
  free(wq);
  free(row);
  free(c->x);
  free(c->wf);
  free(c->o);
}

unsigned kn_block_check(struct kn_backend *be, int bf16_above, double tol, char *why,
                        size_t whylen) {
  struct bchk c = {.be = be, .bf16_above = bf16_above, .tol = tol, .why = why, .whylen = whylen};
  if (why && whylen) why[0] = 0;
  c.rng = 0x626c6f636bull; /* fixed: the same problems every time */
  for (int dt = KN_DTYPE_Q8_0; dt <= KN_DTYPE_Q2_K; dt++) /* the block formats, not X16 layouts */
    if (!kn_dtype_x16((enum kn_dtype)dt)) bc_format(&c, (enum kn_dtype)dt);
  return c.bad;
}
