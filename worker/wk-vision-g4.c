/* wk-vision-g4.c — Gemma 4's vision tower, pooling and embedder
 * (wk-vision-g4.h): weight binding and the encoder pass over backend ops.
 *
 * Which ops carry which step of transformers' modeling_gemma4.py:
 *   Gemma4VisionPatchEmbedder   2 (px - 0.5) on the host as the patches are
 *                               gathered, kn_matmul, two kn_embed of the
 *                               position table's halves, kn_add;
 *   Gemma4ClippableLinear       kn_clamp (into a copy of the input, in place
 *                               on the output) around kn_matmul; skipped for
 *                               bounds that are both infinite;
 *   Gemma4RMSNorm, q/k/v norms  kn_rmsnorm (per head for q, k, v);
 *   apply_multidimensional_rope kn_rope over rows of half-heads: rows of
 *                               head_dim / 2 at stride head_dim, one position
 *                               per row (x for the first halves, y for the
 *                               second), inv_freq [head_dim / 4];
 *   attention                   the paged kn_attention over scratch pages,
 *                               each image one sequence whose whole span is a
 *                               bidirectional range, scale 1 (as wk-vision.c
 *                               does for SigLIP);
 *   sandwich norms + residual   kn_add_norm;
 *   Gemma4VisionMLP             kn_gelu_mul between the clipped linears;
 *   Gemma4VisionPooler          kn_avg_pool_grid with scale sqrt(hidden);
 *   standardize                 kn_standardize;
 *   Gemma4MultimodalEmbedder    kn_rmsnorm (no weight), kn_matmul. */
#include "worker/wk-vision-g4.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-arena.h"
#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "kernels/kn-dtype.h"
#include "model/md-safetensors.h"
#include "worker/wk-owned.h"
#include "worker/wk-tower.h"

#define G4_PAGE_TOKENS 16 /* positions per scratch KV page */

struct g4layer {
  const float *in_norm, *post_attn_norm, *pre_ff_norm, *post_ff_norm; /* [D] */
  const float *q_norm, *k_norm;                                       /* [hd] */
  struct wk_clin wq;                                                  /* [nh hd, D] */
  struct wk_clin wk, wv;                                              /* [nkv hd, D] */
  struct wk_clin wo;                                                  /* [D, nh hd] */
  struct wk_clin gate, up;                                            /* [F, D] */
  struct wk_clin down;                                                /* [D, F] */
};

struct wk_vision_g4 {
  struct wk_tower t;
  struct md_vision_g4_cfg vc; /* = t.cfg.vision_g4 */
  int pd;                     /* 3 patch^2: floats per patch */
  int conv_order;             /* 1: the patch projection's inputs channel-major (c, y, x), as
                                 llama.cpp's mmproj file holds it (a convolution's kernel);
                                 0: (y, x, c), as transformers' checkpoint */
  int qd, kvd;                /* nh hd, nkv hd */

  struct wk_clin patch_w; /* [D, pd] */
  const void *pos_table; /* [2, pos_size, D] of pos_dt */
  enum kn_dtype pos_dt;
  struct g4layer *layers; /* [n_layers] host (from the arena host) */
  const float *std_bias;  /* [D], NULL without standardize */
  const float *std_scale; /* [D] */
  struct wk_clin proj;    /* [H, D] */
  const float *inv_freq;  /* [hd / 4] */

  /* scratch for max_patches rows (T) and max_images images per pass */
  int max_patches, max_images, max_pages;
  float *patches_host;      /* [T, pd] host */
  float *patch_tmp;         /* [pd] host: one patch reordered (conv_order) */
  int32_t *px, *py;         /* [T] host: patch positions */
  int32_t *qx, *qy;         /* [T nh] host: positions per q half-head row */
  int32_t *kx, *ky;         /* [T nkv] host: positions per k half-head row */
  float *patches;           /* [T, pd] */
  float *x, *h, *o;         /* [T, D] */
  float *q, *a;             /* [T, max(qd, D)] */
  float *k, *v;             /* [T, kvd] */
  float *g, *u;             /* [T, F] */
  float *c;                 /* [T, max(D, qd, F)]: a clamped input */
  float *pooled;            /* [T / pool^2, D] */
  float *emb;               /* [T / pool^2, H] */
  struct wk_tower_kv kv;    /* max_pages pages, max_images sequences */
};

_Static_assert(offsetof(struct wk_vision_g4, t) == 0, "a tower begins with its struct wk_tower");

/* ---- memory ---------------------------------------------------------------- */

void wk_vision_g4_free(struct wk_vision_g4 *v) {
  wk_tower_free((struct wk_tower *)v); /* v begins with its tower */
}

const struct md_vision_g4_cfg *wk_vision_g4_config(const struct wk_vision_g4 *v) {
  return &v->vc;
}

int wk_vision_g4_text_hidden(const struct wk_vision_g4 *v) {
  return v->t.text_hidden;
}

/* ---- binding ------------------------------------------------------------------ */

static int bind_all(struct wk_tower *tower, char *err, size_t errlen) {
  struct wk_vision_g4 *v = (struct wk_vision_g4 *)tower;
  const struct md_vision_g4_cfg *c = &v->vc;
  struct wk_tower_binder b = wk_tower_bind(tower, "vision tower", err, errlen);
  /* "model.vision_tower." with "model.embed_vision.", or the same without "model." */
  static const char *const vps[] = {"model.vision_tower.", "vision_tower."};
  static const char *const eps[] = {"model.embed_vision.", "embed_vision."};
  int at = wk_tower_prefix(tower->st, vps, 2, "patch_embedder.input_proj.weight");
  if (at < 0)
    return cm_fail(err, errlen, CM_ERR_NOENT,
                   "vision tower: no patch_embedder.input_proj.weight under model.vision_tower. "
                   "or vision_tower.");
  const char *VP = vps[at], *EP = eps[at];
  int D = c->hidden, F = c->ffn, hd = c->head_dim, cl = c->clipped_linears;
  char name[256];
  snprintf(name, sizeof(name), "%spatch_embedder.input_proj.weight", VP);
  v->patch_w = wk_tower_linear(&b, D, v->pd, name);
  snprintf(name, sizeof(name), "%spatch_embedder.position_embedding_table", VP);
  const struct md_tensor *t = wk_tower_tensor(&b, name, 3, (const int64_t[]){2, c->pos_size, D});
  if (t) {
    v->pos_dt = (enum kn_dtype)t->dtype;
    v->pos_table = wk_tower_place(&b, t->data, t->nbytes, 0);
  }
  v->layers = cm_arena_calloc(&v->t.host, (size_t)c->n_layers, sizeof(*v->layers));
  if (!v->layers) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  for (int i = 0; i < c->n_layers && !b.rc; i++) {
    struct g4layer *l = &v->layers[i];
    char lp[160];
    snprintf(lp, sizeof(lp), "%sencoder.layers.%d.", VP, i);
    l->in_norm = wk_tower_vec(&b, D, "%sinput_layernorm.weight", lp);
    l->post_attn_norm = wk_tower_vec(&b, D, "%spost_attention_layernorm.weight", lp);
    l->pre_ff_norm = wk_tower_vec(&b, D, "%spre_feedforward_layernorm.weight", lp);
    l->post_ff_norm = wk_tower_vec(&b, D, "%spost_feedforward_layernorm.weight", lp);
    l->q_norm = wk_tower_vec(&b, hd, "%sself_attn.q_norm.weight", lp);
    l->k_norm = wk_tower_vec(&b, hd, "%sself_attn.k_norm.weight", lp);
    l->wq = wk_tower_clin(&b, v->qd, D, cl, "%sself_attn.q_proj", lp);
    l->wk = wk_tower_clin(&b, v->kvd, D, cl, "%sself_attn.k_proj", lp);
    l->wv = wk_tower_clin(&b, v->kvd, D, cl, "%sself_attn.v_proj", lp);
    l->wo = wk_tower_clin(&b, D, v->qd, cl, "%sself_attn.o_proj", lp);
    l->gate = wk_tower_clin(&b, F, D, cl, "%smlp.gate_proj", lp);
    l->up = wk_tower_clin(&b, F, D, cl, "%smlp.up_proj", lp);
    l->down = wk_tower_clin(&b, D, F, cl, "%smlp.down_proj", lp);
  }
  if (c->standardize) {
    v->std_bias = wk_tower_vec(&b, D, "%sstd_bias", VP);
    v->std_scale = wk_tower_vec(&b, D, "%sstd_scale", VP);
  }
  snprintf(name, sizeof(name), "%sembedding_projection.weight", EP);
  v->proj = wk_tower_linear(&b, v->t.text_hidden, D, name);
  if (b.rc) return b.rc;
  /* compute_default_rope_parameters: theta^-(2i / (hd / 2)), i < hd / 4, in
   * double rounded once */
  int nf = hd / 4;
  float freq[KN_MAX_HEAD_DIM / 4];
  for (int i = 0; i < nf; i++)
    freq[i] = (float)(1.0 / pow(c->rope_theta, (2.0 * i) / (hd / 2)));
  v->inv_freq = wk_tower_place(&b, freq, sizeof(float) * (size_t)nf, 1);
  return b.rc;
}

/* ---- scratch ----------------------------------------------------------------- */

static int alloc_scratch(struct wk_tower *tower, char *err, size_t errlen) {
  struct wk_vision_g4 *v = (struct wk_vision_g4 *)tower;
  const struct md_vision_g4_cfg *c = &v->vc;
  size_t T = (size_t)v->max_patches, D = (size_t)c->hidden, F = (size_t)c->ffn;
  size_t wide = CM_MAX(D, (size_t)v->qd), widest = CM_MAX(wide, F);
  size_t M = T / (size_t)(c->pool * c->pool) + 1;
  int bt = G4_PAGE_TOKENS;
  /* an image has at least pool^2 patches: so many images fit a pass */
  v->max_images = v->max_patches / (c->pool * c->pool) + 1;
  v->max_pages = v->max_patches / bt + v->max_images;
  v->patches_host = cm_arena_alloc(&tower->host, T * (size_t)v->pd * sizeof(float));
  v->patch_tmp = cm_arena_alloc(&tower->host, (size_t)v->pd * sizeof(float));
  if (!v->patches_host || !v->patch_tmp ||
      wk_tower_kv_alloc(tower, &v->kv, v->max_pages, bt, c->n_kv_heads, c->head_dim, T,
                        v->max_images) ||
      WK_TOWER_INTS(tower, T, &v->px, &v->py) ||
      WK_TOWER_INTS(tower, T * (size_t)c->n_heads, &v->qx, &v->qy) ||
      WK_TOWER_INTS(tower, T * (size_t)c->n_kv_heads, &v->kx, &v->ky) ||
      WK_TOWER_FLOATS(tower, T * (size_t)v->pd, &v->patches) ||
      WK_TOWER_FLOATS(tower, T * D, &v->x, &v->h, &v->o) ||
      WK_TOWER_FLOATS(tower, T * wide, &v->q, &v->a) ||
      WK_TOWER_FLOATS(tower, T * (size_t)v->kvd, &v->k, &v->v) ||
      WK_TOWER_FLOATS(tower, T * F, &v->g, &v->u) || WK_TOWER_FLOATS(tower, T * widest, &v->c) ||
      WK_TOWER_FLOATS(tower, M * D, &v->pooled) ||
      WK_TOWER_FLOATS(tower, M * (size_t)tower->text_hidden, &v->emb))
    return cm_fail(err, errlen, CM_ERR_NOMEM,
                   "vision tower: out of memory for the scratch of %d patches", v->max_patches);
  return 0;
}

/* ---- load ------------------------------------------------------------------- */

static int setup(struct wk_tower *tower, const char *dir, const void *opts_, char *err,
                 size_t errlen) {
  struct wk_vision_g4 *v = (struct wk_vision_g4 *)tower;
  const struct wk_vision_g4_opts *opts = opts_;
  if (!tower->cfg.vision_g4.present)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "%s: the checkpoint has no Gemma 4 vision tower (model_type \"%s\")", dir,
                   tower->cfg.model_type);
  v->vc = tower->cfg.vision_g4;
  v->pd = 3 * v->vc.patch * v->vc.patch;
  v->conv_order = tower->cfg.gguf;
  v->qd = v->vc.n_heads * v->vc.head_dim;
  v->kvd = v->vc.n_kv_heads * v->vc.head_dim;
  int pp = v->vc.pool * v->vc.pool;
  v->max_patches = opts && opts->max_patches > 0 ? opts->max_patches : MD_G4_MAX_SOFT_TOKENS * pp;
  if (v->vc.head_dim > KN_MAX_HEAD_DIM || v->max_patches < pp || v->max_patches > (1 << 22))
    return cm_fail(err, errlen, CM_ERR_TOOBIG,
                   "vision tower: head_dim %d (at most %d), %d patches per pass (%d to %d)",
                   v->vc.head_dim, KN_MAX_HEAD_DIM, v->max_patches, pp, 1 << 22);
  return 0;
}

static const struct wk_tower_kind vision_g4_kind = {.what = "vision tower",
                                                    .size = sizeof(struct wk_vision_g4),
                                                    .setup = setup,
                                                    .bind = bind_all,
                                                    .scratch = alloc_scratch,
                                                    .mmproj = 1};

int wk_vision_g4_load(const char *dir, struct kn_backend *be, const struct wk_vision_g4_opts *opts,
                      struct wk_vision_g4 **out, char *err, size_t errlen) {
  struct wk_tower *t;
  int rc = wk_tower_load(&vision_g4_kind, dir, be, opts, &t, err, errlen);
  *out = (struct wk_vision_g4 *)t; /* it begins with its tower */
  return rc;
}

/* ---- the encoder pass ---------------------------------------------------------- */

static int clin(struct wk_vision_g4 *v, float *out, const float *in, const struct wk_clin *m, int T,
                int N, int K) {
  return wk_clin_run(v->t.be, v->c, out, in, m, T, N, K);
}

/* Whether image im is what md_g4_image_plan gives: its grid within the
 * position table, whole pooling windows, patch k at (k % grid_w, k / grid_w). */
static int image_ok(const struct wk_vision_g4 *v, const struct wk_g4_image *im) {
  const struct md_g4_image *f = &im->info;
  int k = v->vc.pool;
  if (!im->pixels || !im->pos || f->patch_dim != v->pd || f->grid_w < k || f->grid_h < k ||
      f->grid_w % k || f->grid_h % k || f->grid_w > v->vc.pos_size || f->grid_h > v->vc.pos_size ||
      (long long)f->grid_w * f->grid_h != f->n_patches || f->n_patches > v->max_patches ||
      f->soft_tokens != f->n_patches / (k * k))
    return 0;
  for (int p = 0; p < f->n_patches; p++)
    if (im->pos[2 * p] != p % f->grid_w || im->pos[2 * p + 1] != p / f->grid_w) return 0;
  return 1;
}

/* Images ims[0..n) (their patches fit max_patches) -> out [their soft tokens, H]. */
static int encode_pass(struct wk_vision_g4 *v, const struct wk_g4_image *ims, int n, float *out) {
  const struct md_vision_g4_cfg *c = &v->vc;
  struct kn_backend *be = v->t.be;
  int D = c->hidden, F = c->ffn, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
  int pp = c->pool * c->pool;
  float eps = (float)c->eps;
  int rc;
  /* gather the real patches as 2 (px - 0.5) (float, as torch computes it),
   * their positions, pages and attention sequences */
  int T = 0, page = 0, M = 0;
  for (int i = 0; i < n; i++) {
    const struct md_g4_image *f = &ims[i].info;
    int N = f->n_patches;
    const float *src = ims[i].pixels;
    float *dst = v->patches_host + (size_t)T * v->pd;
    for (size_t e = 0; e < (size_t)N * v->pd; e++)
      dst[e] = 2.0f * (src[e] - 0.5f);
    if (v->conv_order) /* (y, x, c) -> (c, y, x) within each patch */
      for (int p = 0; p < N; p++) {
        float *row = dst + (size_t)p * v->pd;
        int px = v->pd / 3; /* pixels a patch */
        for (int e = 0; e < px; e++)
          for (int ch = 0; ch < 3; ch++)
            v->patch_tmp[ch * px + e] = row[e * 3 + ch];
        memcpy(row, v->patch_tmp, sizeof(float) * (size_t)v->pd);
      }
    for (int p = 0; p < N; p++) {
      v->px[T + p] = ims[i].pos[2 * p];
      v->py[T + p] = ims[i].pos[2 * p + 1];
    }
    page += wk_tower_kv_seq(&v->kv, i, T, N, page);
    T += N;
    M += f->soft_tokens;
  }
  /* positions per half-head row: q rows are (token, head), k rows (token, kv head) */
  for (int t = 0; t < T; t++) {
    for (int hh = 0; hh < nh; hh++) {
      v->qx[t * nh + hh] = v->px[t];
      v->qy[t * nh + hh] = v->py[t];
    }
    for (int hh = 0; hh < nkv; hh++) {
      v->kx[t * nkv + hh] = v->px[t];
      v->ky[t * nkv + hh] = v->py[t];
    }
  }
  size_t TD = (size_t)T * (size_t)D;
  if ((rc = kn_upload(be, v->patches, v->patches_host, (size_t)T * v->pd * sizeof(float))) ||
      (rc = clin(v, v->x, v->patches, &v->patch_w, T, D, v->pd)))
    return rc;
  /* T[0][x] + T[1][y], then added to the projected patches */
  const void *table_y =
      (const char *)v->pos_table + (size_t)c->pos_size * D * kn_dtype_size(v->pos_dt);
  if ((rc = kn_embed(be, v->h, D, v->pos_table, v->pos_dt, c->pos_size, D, v->px, T, 1.0f)) ||
      (rc = kn_embed(be, v->a, D, table_y, v->pos_dt, c->pos_size, D, v->py, T, 1.0f)) ||
      (rc = kn_add(be, v->h, v->h, v->a, TD)) || (rc = kn_add(be, v->x, v->x, v->h, TD)) ||
      (rc = kn_rmsnorm(be, v->h, D, v->x, D, T, D, v->layers[0].in_norm, KN_DTYPE_F32, eps,
                       KN_NORM_MUL_W)))
    return rc;
  for (int li = 0; li < c->n_layers; li++) {
    const struct g4layer *l = &v->layers[li];
    /* attention: h holds input_layernorm(x) */
    if ((rc = clin(v, v->q, v->h, &l->wq, T, v->qd, D)) ||
        (rc = clin(v, v->k, v->h, &l->wk, T, v->kvd, D)) ||
        (rc = clin(v, v->v, v->h, &l->wv, T, v->kvd, D)) ||
        (rc = kn_rmsnorm(be, v->q, hd, v->q, hd, T * nh, hd, l->q_norm, KN_DTYPE_F32, eps,
                         KN_NORM_MUL_W)) ||
        (rc = kn_rmsnorm(be, v->k, hd, v->k, hd, T * nkv, hd, l->k_norm, KN_DTYPE_F32, eps,
                         KN_NORM_MUL_W)) ||
        (rc = kn_rmsnorm(be, v->v, hd, v->v, hd, T * nkv, hd, NULL, KN_DTYPE_F32, eps,
                         KN_NORM_NO_W)) ||
        /* rope2d: the first half of each head by x, the second by y */
        (rc = kn_rope(be, v->q, hd, T * nh, 1, hd / 2, v->qx, v->inv_freq)) ||
        (rc = kn_rope(be, v->q + hd / 2, hd, T * nh, 1, hd / 2, v->qy, v->inv_freq)) ||
        (rc = kn_rope(be, v->k, hd, T * nkv, 1, hd / 2, v->kx, v->inv_freq)) ||
        (rc = kn_rope(be, v->k + hd / 2, hd, T * nkv, 1, hd / 2, v->ky, v->inv_freq)) ||
        (rc = kn_kv_write(be, &v->kv.view, v->kv.slots, v->k, v->kvd, v->v, v->kvd, T)) ||
        (rc = kn_attention(be, v->a, v->qd, v->q, v->qd, &v->kv.view, v->kv.seqs, n, nh, 0, 1.0f,
                           0.0f)) ||
        (rc = clin(v, v->o, v->a, &l->wo, T, D, v->qd)) ||
        /* x += post_attention_layernorm(o); h = pre_feedforward_layernorm(x) */
        (rc = kn_add_norm(be, v->x, D, v->o, D, v->h, D, T, D, l->post_attn_norm, l->pre_ff_norm,
                          KN_DTYPE_F32, 1.0f, eps, KN_NORM_MUL_W)) ||
        (rc = clin(v, v->g, v->h, &l->gate, T, F, D)) ||
        (rc = clin(v, v->u, v->h, &l->up, T, F, D)) ||
        (rc = kn_gelu_mul(be, v->g, F, v->g, F, v->u, F, T, F)) ||
        (rc = clin(v, v->o, v->g, &l->down, T, D, F)))
      return rc;
    /* x += post_feedforward_layernorm(o); h = the next layer's input_layernorm(x) */
    const float *next = li + 1 < c->n_layers ? v->layers[li + 1].in_norm : NULL;
    if ((rc = kn_add_norm(be, v->x, D, v->o, D, next ? v->h : NULL, D, T, D, l->post_ff_norm, next,
                          KN_DTYPE_F32, 1.0f, eps, KN_NORM_MUL_W)))
      return rc;
  }
  /* pooling per image, times sqrt(hidden) (Gemma4VisionPooler's root_hidden_size) */
  float root = (float)sqrt((double)D);
  for (int i = 0, t0 = 0, m0 = 0; i < n; i++) {
    const struct md_g4_image *f = &ims[i].info;
    if ((rc = kn_avg_pool_grid(be, v->pooled + (size_t)m0 * D, D, v->x + (size_t)t0 * D, D,
                               f->grid_w, f->grid_h, c->pool, D, root)))
      return rc;
    t0 += f->n_patches;
    m0 += f->n_patches / pp;
  }
  if (v->std_bias &&
      (rc = kn_standardize(be, v->pooled, D, v->pooled, D, M, D, v->std_bias, v->std_scale)))
    return rc;
  if ((rc = kn_rmsnorm(be, v->pooled, D, v->pooled, D, M, D, NULL, KN_DTYPE_F32, eps,
                       KN_NORM_NO_W)) ||
      (rc = kn_matmul(be, v->emb, v->t.text_hidden, v->pooled, D, v->proj.w, v->proj.dt, M,
                      v->t.text_hidden, D, 0)))
    return rc;
  return kn_download(be, out, v->emb, (size_t)M * (size_t)v->t.text_hidden * sizeof(float));
}

int wk_vision_g4_encode(struct wk_vision_g4 *v, const struct wk_g4_image *ims, int n, float *out,
                        char *err, size_t errlen) {
  if (!v || n < 0 || (n > 0 && (!ims || !out)))
    return cm_fail(err, errlen, CM_ERR_INVAL, "vision encode: bad arguments");
  for (int i = 0; i < n; i++)
    if (!image_ok(v, &ims[i]))
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "vision encode: image %d (a %d x %d patch grid, %d patches) is not a "
                     "preprocessed Gemma 4 image of this tower (at most %d patches)",
                     i, ims[i].info.grid_w, ims[i].info.grid_h, ims[i].info.n_patches,
                     v->max_patches);
  size_t H = (size_t)v->t.text_hidden;
  for (int i0 = 0; i0 < n;) {
    int k = 0, T = 0;
    while (i0 + k < n && k < v->max_images && T + ims[i0 + k].info.n_patches <= v->max_patches)
      T += ims[i0 + k++].info.n_patches;
    int rc = encode_pass(v, ims + i0, k, out);
    if (rc)
      return cm_fail(err, errlen, rc, "vision encode: images %d..%d: %s", i0, i0 + k - 1,
                     cm_strerror(rc));
    for (int j = 0; j < k; j++)
      out += (size_t)ims[i0 + j].info.soft_tokens * H;
    i0 += k;
  }
  return 0;
}
