/* wk-vision.c — the SigLIP vision tower and Gemma 3 projector (wk-vision.h):
 * weight binding and the encoder pass over backend ops.
 *
 * Patch embedding: a convolution with stride = kernel = patch is a matmul of
 * the unfolded patches [T, C * p * p] by the conv weight viewed as
 * [D, C * p * p] (its natural layout); the unfolding is a permutation of the
 * input and is done on the host, where the pixels arrive.
 *
 * Attention reuses the paged kn_attention rather than a dense op of its own:
 * each image's K / V are written into a scratch page set (f32, owned here) and
 * attended as one sequence whose whole span is a bidirectional range. That is
 * exactly full bidirectional attention over the image's patches, and it runs
 * the one attention kernel each backend already tunes and tests (SIMD on the
 * CPU, the flash-decoding kernel on CUDA, head dims up to 512); the price is
 * one copy of K and V per layer (2 T D floats, small next to the matmuls). */
#include "worker/wk-vision.h"

#include <math.h>
#include <stdarg.h>
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

#define WK_VISION_PAGE_TOKENS 16 /* positions per scratch KV page */

/* A weight matrix [rows, cols] in backend memory, in its checkpoint dtype. */
struct vmat {
  const void *w;
  enum kn_dtype dt;
};

struct vlayer {
  const float *ln1_w, *ln1_b;     /* [D] */
  struct vmat wq, wk, wv, wo;     /* [D, D] */
  const float *bq, *bk, *bv, *bo; /* [D] */
  const float *ln2_w, *ln2_b;     /* [D] */
  struct vmat w1;                 /* [F, D] */
  const float *b1;                /* [F] */
  struct vmat w2;                 /* [D, F] */
  const float *b2;                /* [D] */
};

struct wk_vision {
  struct kn_backend *be;
  struct md_st *st; /* open while host-memory backends point into its mappings */
  struct md_config cfg;
  struct md_vision_cfg vc; /* = cfg.vision */
  int text_hidden;         /* H: width of the output embeddings */
  int kp;                  /* C * p * p: features of an unfolded patch */

  struct vmat patch_w;          /* [D, kp] */
  const float *patch_b;         /* [D] */
  const float *pos;             /* [n_patches, D] */
  struct vlayer *layers;        /* [n_layers] host (from the arena host) */
  const float *post_w, *post_b; /* [D] */
  const float *mm_norm_w;       /* [D] (used as 1 + w) */
  struct vmat proj;             /* [H, D]: the checkpoint's [D, H] transposed */

  /* scratch for max_images images (T = max_images * n_patches rows); the
   * host arrays come from the arena host */
  struct cm_arena host;
  int max_images;
  float *patches_host;          /* [T, kp] host */
  float *patches;               /* [T, kp] */
  float *x, *h, *q, *k, *v, *a; /* [T, D] */
  float *f;                     /* [T, F] */
  float *pooled;                /* [max_images * mm_tokens, D] */
  float *emb;                   /* [max_images * mm_tokens, H] */
  struct kn_kv_view view;       /* the scratch KV pages */
  int pages_per_image;
  int32_t *block_tables;    /* [max_images, pages_per_image] host */
  int32_t *slots;           /* [T] host */
  int32_t *bidir;           /* [max_images, 2] host */
  struct kn_attn_seq *seqs; /* [max_images] host */

  struct wk_owned owned; /* backend buffers */
};

/* ---- memory ---------------------------------------------------------------- */

static void *vis_alloc(struct wk_vision *v, size_t bytes) {
  return wk_owned_alloc(&v->owned, v->be, bytes);
}

void wk_vision_free(struct wk_vision *v) {
  if (!v) return;
  wk_owned_free(&v->owned, v->be);
  cm_arena_free(&v->host);
  md_st_close(v->st);
  free(v);
}

const struct md_vision_cfg *wk_vision_config(const struct wk_vision *v) {
  return &v->vc;
}

int wk_vision_text_hidden(const struct wk_vision *v) {
  return v->text_hidden;
}

/* ---- binding ---------------------------------------------------------------- */

struct vbinder {
  struct wk_vision *v;
  char *err;
  size_t errlen;
  int rc; /* first failure */
};

/* b as the shared binder (wk-tower.h) sees it; its failure comes back to b. */
static struct wk_tower_binder tower(struct vbinder *b) {
  return (struct wk_tower_binder){.be = b->v->be,
                                  .owned = &b->v->owned,
                                  .st = b->v->st,
                                  .what = "vision tower",
                                  .err = b->err,
                                  .errlen = b->errlen,
                                  .rc = b->rc};
}

static const struct md_tensor *vlookup(struct vbinder *b, const char *name, int ndim,
                                       const int64_t *dims) {
  struct wk_tower_binder tb = tower(b);
  const struct md_tensor *t = wk_tower_tensor(&tb, name, ndim, dims);
  b->rc = tb.rc;
  return t;
}

static const void *vplace(struct vbinder *b, const void *data, size_t bytes, int copy) {
  struct wk_tower_binder tb = tower(b);
  const void *p = wk_tower_place(&tb, data, bytes, copy);
  b->rc = tb.rc;
  return p;
}

static struct vmat bind_mat(struct vbinder *b, int64_t rows, int64_t cols, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static struct vmat bind_mat(struct vbinder *b, int64_t rows, int64_t cols, const char *fmt, ...) {
  char name[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof(name), fmt, ap);
  va_end(ap);
  struct vmat m = {0};
  const struct md_tensor *t = vlookup(b, name, 2, (const int64_t[]){rows, cols});
  if (!t) return m;
  m.dt = (enum kn_dtype)t->dtype;
  m.w = vplace(b, t->data, t->nbytes, 0);
  return m;
}

/* A tensor (dims as given, its name a format) widened to f32 in backend memory. */
static const float *bind_f32(struct vbinder *b, int ndim, const int64_t *dims, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static const float *bind_f32(struct vbinder *b, int ndim, const int64_t *dims, const char *fmt,
                             ...) {
  char name[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof(name), fmt, ap);
  va_end(ap);
  struct wk_tower_binder tb = tower(b);
  const float *p = wk_tower_f32(&tb, ndim, dims, name);
  b->rc = tb.rc;
  return p;
}

static const float *bind_vec(struct vbinder *b, int64_t n, const char *prefix, const char *name) {
  return bind_f32(b, 1, (const int64_t[]){n}, "%s%s", prefix, name);
}

/* A linear layer: PREFIX NAME.weight [rows, cols] and its bias [rows]. */
static void bind_linear(struct vbinder *b, int64_t rows, int64_t cols, const char *prefix,
                        const char *name, struct vmat *w, const float **bias) {
  *w = bind_mat(b, rows, cols, "%s%s.weight", prefix, name);
  *bias = bind_f32(b, 1, (const int64_t[]){rows}, "%s%s.bias", prefix, name);
}

/* A layer norm: PREFIX NAME.weight and .bias, [n] each. */
static void bind_norm(struct vbinder *b, int64_t n, const char *prefix, const char *name,
                      const float **w, const float **bias) {
  *w = bind_f32(b, 1, (const int64_t[]){n}, "%s%s.weight", prefix, name);
  *bias = bind_f32(b, 1, (const int64_t[]){n}, "%s%s.bias", prefix, name);
}

/* mm_input_projection_weight [D, H] (used as x @ W), stored transposed as
 * [H, D] in its own dtype so that kn_matmul applies it. */
static struct vmat bind_projection(struct vbinder *b, const char *name, int D, int H) {
  struct vmat m = {0};
  const struct md_tensor *t = vlookup(b, name, 2, (const int64_t[]){D, H});
  if (!t) return m;
  size_t esz = md_st_dtype_size(t->dtype);
  char *tr = malloc(t->nbytes ? t->nbytes : 1);
  if (!tr) {
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_NOMEM, "out of memory for %s", name);
    return m;
  }
  const char *src = t->data;
  for (int i = 0; i < D; i++)
    for (int j = 0; j < H; j++)
      memcpy(tr + ((size_t)j * D + i) * esz, src + ((size_t)i * H + j) * esz, esz);
  m.dt = (enum kn_dtype)t->dtype;
  m.w = vplace(b, tr, t->nbytes, 1);
  free(tr);
  return m;
}

/* "model.vision_tower.vision_model." or the older "vision_tower.vision_model.",
 * with the projector's prefix of the same layout. */
static int find_prefixes(const struct md_st *st, const char **vp, const char **pp) {
  static const char *const vps[] = {"model.vision_tower.vision_model.",
                                    "vision_tower.vision_model."};
  static const char *const pps[] = {"model.multi_modal_projector.", "multi_modal_projector."};
  for (int i = 0; i < 2; i++) {
    char name[128];
    snprintf(name, sizeof(name), "%sembeddings.patch_embedding.weight", vps[i]);
    if (md_st_find(st, name)) {
      *vp = vps[i];
      *pp = pps[i];
      return 0;
    }
  }
  return CM_ERR_NOENT;
}

static int bind_all(struct wk_vision *v, char *err, size_t errlen) {
  const struct md_vision_cfg *c = &v->vc;
  struct vbinder b = {v, err, errlen, 0};
  const char *VP, *PP;
  if (find_prefixes(v->st, &VP, &PP))
    return cm_fail(err, errlen, CM_ERR_NOENT,
                   "vision tower: no embeddings.patch_embedding.weight under "
                   "model.vision_tower.vision_model. or vision_tower.vision_model.");
  int D = c->hidden, F = c->ffn, p = c->patch;
  char name[256];
  snprintf(name, sizeof(name), "%sembeddings.patch_embedding.weight", VP);
  /* [D, C, p, p] is [D, C * p * p] row-major: the unfolded patch order */
  const struct md_tensor *t = vlookup(&b, name, 4, (const int64_t[]){D, c->channels, p, p});
  if (t) {
    v->patch_w.dt = (enum kn_dtype)t->dtype;
    v->patch_w.w = vplace(&b, t->data, t->nbytes, 0);
  }
  v->patch_b = bind_vec(&b, D, VP, "embeddings.patch_embedding.bias");
  v->pos = bind_f32(&b, 2, (const int64_t[]){c->n_patches, D},
                    "%sembeddings.position_embedding.weight", VP);
  v->layers = cm_arena_calloc(&v->host, (size_t)c->n_layers, sizeof(*v->layers));
  if (!v->layers) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  for (int i = 0; i < c->n_layers && !b.rc; i++) {
    struct vlayer *l = &v->layers[i];
    char lp[160];
    snprintf(lp, sizeof(lp), "%sencoder.layers.%d.", VP, i);
    bind_norm(&b, D, lp, "layer_norm1", &l->ln1_w, &l->ln1_b);
    bind_linear(&b, D, D, lp, "self_attn.q_proj", &l->wq, &l->bq);
    bind_linear(&b, D, D, lp, "self_attn.k_proj", &l->wk, &l->bk);
    bind_linear(&b, D, D, lp, "self_attn.v_proj", &l->wv, &l->bv);
    bind_linear(&b, D, D, lp, "self_attn.out_proj", &l->wo, &l->bo);
    bind_norm(&b, D, lp, "layer_norm2", &l->ln2_w, &l->ln2_b);
    bind_linear(&b, F, D, lp, "mlp.fc1", &l->w1, &l->b1);
    bind_linear(&b, D, F, lp, "mlp.fc2", &l->w2, &l->b2);
  }
  bind_norm(&b, D, VP, "post_layernorm", &v->post_w, &v->post_b);
  v->mm_norm_w = bind_vec(&b, D, PP, "mm_soft_emb_norm.weight");
  snprintf(name, sizeof(name), "%smm_input_projection_weight", PP);
  v->proj = bind_projection(&b, name, D, v->text_hidden);
  return b.rc;
}

/* ---- scratch ----------------------------------------------------------------- */

static int alloc_scratch(struct wk_vision *v, char *err, size_t errlen) {
  const struct md_vision_cfg *c = &v->vc;
  size_t T = (size_t)v->max_images * (size_t)c->n_patches, D = (size_t)c->hidden;
  size_t M = (size_t)v->max_images * (size_t)c->mm_tokens;
  int bt = WK_VISION_PAGE_TOKENS;
  v->pages_per_image = (c->n_patches + bt - 1) / bt;
  int n_pages = v->max_images * v->pages_per_image;
  size_t half = (size_t)bt * D * sizeof(float); /* one layer's K (or V) per page */
  v->view = (struct kn_kv_view){.page_bytes = 2 * half,
                                .n_pages = n_pages,
                                .k_off = 0,
                                .v_off = half,
                                .block_tokens = bt,
                                .n_kv_heads = c->n_heads,
                                .head_dim = c->head_dim,
                                .dtype = KN_DTYPE_F32};
  v->patches_host = cm_arena_alloc(&v->host, T * (size_t)v->kp * sizeof(float));
  v->block_tables = cm_arena_alloc(&v->host, sizeof(int32_t) * (size_t)n_pages);
  v->slots = cm_arena_alloc(&v->host, sizeof(int32_t) * T);
  v->bidir = cm_arena_alloc(&v->host, sizeof(int32_t) * 2 * (size_t)v->max_images);
  v->seqs = cm_arena_calloc(&v->host, (size_t)v->max_images, sizeof(*v->seqs));
  v->patches = vis_alloc(v, T * (size_t)v->kp * sizeof(float));
  v->x = vis_alloc(v, T * D * sizeof(float));
  v->h = vis_alloc(v, T * D * sizeof(float));
  v->q = vis_alloc(v, T * D * sizeof(float));
  v->k = vis_alloc(v, T * D * sizeof(float));
  v->v = vis_alloc(v, T * D * sizeof(float));
  v->a = vis_alloc(v, T * D * sizeof(float));
  v->f = vis_alloc(v, T * (size_t)c->ffn * sizeof(float));
  v->pooled = vis_alloc(v, M * D * sizeof(float));
  v->emb = vis_alloc(v, M * (size_t)v->text_hidden * sizeof(float));
  v->view.pool = vis_alloc(v, (size_t)n_pages * v->view.page_bytes);
  if (!v->patches_host || !v->block_tables || !v->slots || !v->bidir || !v->seqs || !v->patches ||
      !v->x || !v->h || !v->q || !v->k || !v->v || !v->a || !v->f || !v->pooled || !v->emb ||
      !v->view.pool)
    return cm_fail(err, errlen, CM_ERR_NOMEM,
                   "vision tower: out of memory for the scratch of %d images", v->max_images);
  /* image i owns pages i * pages_per_image ..; its tokens fill them in order */
  for (int i = 0; i < n_pages; i++)
    v->block_tables[i] = i;
  for (int i = 0; i < v->max_images; i++) {
    for (int t = 0; t < c->n_patches; t++)
      v->slots[(size_t)i * c->n_patches + t] = i * v->pages_per_image * bt + t;
    v->bidir[2 * i] = 0;
    v->bidir[2 * i + 1] = c->n_patches;
    v->seqs[i] = (struct kn_attn_seq){.q_begin = i * c->n_patches,
                                      .n_q = c->n_patches,
                                      .pos0 = 0,
                                      .block_table = v->block_tables + i * v->pages_per_image,
                                      .n_blocks = v->pages_per_image,
                                      .bidir = v->bidir + 2 * i,
                                      .n_bidir = 1};
  }
  return 0;
}

/* ---- load ------------------------------------------------------------------- */

int wk_vision_load(const char *dir, struct kn_backend *be, const struct wk_vision_opts *opts,
                   struct wk_vision **out, char *err, size_t errlen) {
  *out = NULL;
  if (!dir || !be)
    return cm_fail(err, errlen, CM_ERR_INVAL, "vision tower: no directory or backend");
  struct wk_vision *v = calloc(1, sizeof(*v));
  if (!v) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  v->be = be;
  cm_arena_init(&v->host, 64u << 10, 0);
  int rc = md_config_load(dir, &v->cfg, err, errlen);
  if (rc) goto fail;
  if (!v->cfg.vision.present) {
    rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                 "%s: the checkpoint has no vision tower (model_type \"%s\" without "
                 "vision_config)",
                 dir, v->cfg.model_type);
    goto fail;
  }
  v->vc = v->cfg.vision;
  v->text_hidden = v->cfg.hidden;
  v->kp = v->vc.channels * v->vc.patch * v->vc.patch;
  v->max_images = opts && opts->max_images > 0 ? opts->max_images : 2;
  if ((long long)v->max_images * v->vc.n_patches > (1 << 24)) {
    rc = cm_fail(err, errlen, CM_ERR_TOOBIG, "vision tower: %d images of %d patches per pass",
                 v->max_images, v->vc.n_patches);
    goto fail;
  }
  if ((rc = md_st_open_dir(dir, &v->st, err, errlen))) goto fail;
  if ((rc = bind_all(v, err, errlen))) goto fail;
  if ((rc = alloc_scratch(v, err, errlen))) goto fail;
  *out = v;
  return 0;
fail:
  wk_vision_free(v);
  return rc;
}

/* ---- the encoder pass ---------------------------------------------------------- */

/* patches_host[i * N + r * grid + c][ch * p * p + y * p + z] =
 * pixels[i][ch][r * p + y][c * p + z]: the convolution's receptive fields. */
static void unfold(const struct wk_vision *v, const float *pixels, int n) {
  const struct md_vision_cfg *c = &v->vc;
  int S = c->image_size, p = c->patch, g = c->grid;
  for (int i = 0; i < n; i++)
    for (int r = 0; r < g; r++)
      for (int q = 0; q < g; q++) {
        float *dst = v->patches_host + ((size_t)i * c->n_patches + (size_t)r * g + q) * v->kp;
        for (int ch = 0; ch < c->channels; ch++)
          for (int y = 0; y < p; y++) {
            const float *src = pixels +
                               (((size_t)i * c->channels + ch) * S + (size_t)r * p + y) * S +
                               (size_t)q * p;
            memcpy(dst + ((size_t)ch * p + y) * p, src, sizeof(float) * (size_t)p);
          }
      }
}

static int linear(struct wk_vision *v, float *out, const float *in, struct vmat w, const float *b,
                  int T, int N, int K, enum kn_act act) {
  int rc = kn_matmul(v->be, out, N, in, K, w.w, w.dt, T, N, K, 0);
  return rc ? rc : kn_bias_act(v->be, out, N, out, N, b, T, N, act);
}

/* n <= max_images images: pixels [n, C, S, S] -> out [n * mm_tokens, H] (host). */
static int encode_pass(struct wk_vision *v, const float *pixels, int n, float *out) {
  const struct md_vision_cfg *c = &v->vc;
  struct kn_backend *be = v->be;
  int N = c->n_patches, D = c->hidden, F = c->ffn, T = n * N, M = n * c->mm_tokens;
  size_t TD = (size_t)T * (size_t)D;
  float scale = (float)(1.0 / sqrt((double)c->head_dim));
  int rc;
  unfold(v, pixels, n);
  if ((rc = kn_upload(be, v->patches, v->patches_host, (size_t)T * v->kp * sizeof(float))))
    return rc;
  if ((rc = linear(v, v->x, v->patches, v->patch_w, v->patch_b, T, D, v->kp, KN_ACT_NONE)))
    return rc;
  for (int i = 0; i < n; i++)
    if ((rc =
             kn_add(be, v->x + (size_t)i * N * D, v->x + (size_t)i * N * D, v->pos, (size_t)N * D)))
      return rc;
  for (int li = 0; li < c->n_layers; li++) {
    const struct vlayer *l = &v->layers[li];
    if ((rc = kn_layernorm(be, v->h, D, v->x, D, T, D, l->ln1_w, l->ln1_b, KN_DTYPE_F32,
                           (float)c->eps)) ||
        (rc = linear(v, v->q, v->h, l->wq, l->bq, T, D, D, KN_ACT_NONE)) ||
        (rc = linear(v, v->k, v->h, l->wk, l->bk, T, D, D, KN_ACT_NONE)) ||
        (rc = linear(v, v->v, v->h, l->wv, l->bv, T, D, D, KN_ACT_NONE)) ||
        (rc = kn_kv_write(be, &v->view, v->slots, v->k, D, v->v, D, T)) ||
        (rc = kn_attention(be, v->a, D, v->q, D, &v->view, v->seqs, n, c->n_heads, 0, scale,
                           0.0f)) ||
        (rc = linear(v, v->h, v->a, l->wo, l->bo, T, D, D, KN_ACT_NONE)) ||
        (rc = kn_add(be, v->x, v->x, v->h, TD)) ||
        (rc = kn_layernorm(be, v->h, D, v->x, D, T, D, l->ln2_w, l->ln2_b, KN_DTYPE_F32,
                           (float)c->eps)) ||
        (rc = linear(v, v->f, v->h, l->w1, l->b1, T, F, D, KN_ACT_GELU_TANH)) ||
        (rc = linear(v, v->h, v->f, l->w2, l->b2, T, D, F, KN_ACT_NONE)) ||
        (rc = kn_add(be, v->x, v->x, v->h, TD)))
      return rc;
  }
  if ((rc = kn_layernorm(be, v->x, D, v->x, D, T, D, v->post_w, v->post_b, KN_DTYPE_F32,
                         (float)c->eps)) ||
      (rc = kn_avg_pool2d(be, v->pooled, D, v->x, D, n, c->grid, c->pool, D)) ||
      (rc = kn_rmsnorm(be, v->pooled, D, v->pooled, D, M, D, v->mm_norm_w, KN_DTYPE_F32,
                       (float)c->eps, KN_NORM_MUL_ONE_PLUS_W)) ||
      (rc = kn_matmul(be, v->emb, v->text_hidden, v->pooled, D, v->proj.w, v->proj.dt, M,
                      v->text_hidden, D, 0)))
    return rc;
  return kn_download(be, out, v->emb, (size_t)M * (size_t)v->text_hidden * sizeof(float));
}

int wk_vision_encode(struct wk_vision *v, const float *pixels, int n_images, float *out, char *err,
                     size_t errlen) {
  if (!v || n_images < 0 || (n_images > 0 && (!pixels || !out)))
    return cm_fail(err, errlen, CM_ERR_INVAL, "vision encode: bad arguments");
  const struct md_vision_cfg *c = &v->vc;
  size_t in_per = (size_t)c->channels * c->image_size * c->image_size;
  size_t out_per = (size_t)c->mm_tokens * v->text_hidden;
  for (int i0 = 0; i0 < n_images; i0 += v->max_images) {
    int n = CM_MIN(v->max_images, n_images - i0);
    int rc = encode_pass(v, pixels + (size_t)i0 * in_per, n, out + (size_t)i0 * out_per);
    if (rc)
      return cm_fail(err, errlen, rc, "vision encode: images %d..%d: %s", i0, i0 + n - 1,
                     cm_strerror(rc));
  }
  return 0;
}
