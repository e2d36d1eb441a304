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

#define WK_VISION_PAGE_TOKENS 16 /* positions per scratch KV page */

struct vlayer {
  const float *ln1_w, *ln1_b;     /* [D] */
  struct wk_clin wq, wk, wv, wo;  /* [D, D] */
  const float *bq, *bk, *bv, *bo; /* [D] */
  const float *ln2_w, *ln2_b;     /* [D] */
  struct wk_clin w1;              /* [F, D] */
  const float *b1;                /* [F] */
  struct wk_clin w2;              /* [D, F] */
  const float *b2;                /* [D] */
};

struct wk_vision {
  struct wk_tower t;
  struct md_vision_cfg vc; /* = t.cfg.vision */
  int kp;                  /* C * p * p: features of an unfolded patch */

  struct wk_clin patch_w;       /* [D, kp] */
  const float *patch_b;         /* [D] */
  const float *pos;             /* [n_patches, D] */
  struct vlayer *layers;        /* [n_layers] host (from the arena host) */
  const float *post_w, *post_b; /* [D] */
  const float *mm_norm_w;       /* [D] (used as 1 + w; as w from an mmproj file, which
                                   stores 1 + w) */
  enum kn_norm_mode mm_norm_mode;
  struct wk_clin proj;          /* [H, D]: the checkpoint's [D, H] transposed */

  /* scratch for max_images images (T = max_images * n_patches rows); the
   * host arrays come from the arena t.host */
  int max_images;
  float *patches_host;          /* [T, kp] host */
  float *patches;               /* [T, kp] */
  float *x, *h, *q, *k, *v, *a; /* [T, D] */
  float *f;                     /* [T, F] */
  float *pooled;                /* [max_images * mm_tokens, D] */
  float *emb;                   /* [max_images * mm_tokens, H] */
  struct wk_tower_kv kv;        /* image i on pages i * pages_per_image .. */
  int pages_per_image;
};

_Static_assert(offsetof(struct wk_vision, t) == 0, "a tower begins with its struct wk_tower");

/* ---- memory ---------------------------------------------------------------- */

void wk_vision_free(struct wk_vision *v) {
  wk_tower_free((struct wk_tower *)v); /* v begins with its tower */
}

const struct md_vision_cfg *wk_vision_config(const struct wk_vision *v) {
  return &v->vc;
}

int wk_vision_text_hidden(const struct wk_vision *v) {
  return v->t.text_hidden;
}

/* ---- binding ---------------------------------------------------------------- */

static const float *bind_vec(struct wk_tower_binder *b, int64_t n, const char *prefix,
                             const char *name) {
  return wk_tower_vec(b, n, "%s%s", prefix, name);
}

/* A linear layer: PREFIX NAME.weight [rows, cols] and its bias [rows]. */
static void bind_linear(struct wk_tower_binder *b, int64_t rows, int64_t cols, const char *prefix,
                        const char *name, struct wk_clin *w, const float **bias) {
  char wn[256];
  snprintf(wn, sizeof(wn), "%s%s.weight", prefix, name);
  *w = wk_tower_linear(b, rows, cols, wn);
  *bias = wk_tower_vec(b, rows, "%s%s.bias", prefix, name);
}

/* A layer norm: PREFIX NAME.weight and .bias, [n] each. */
static void bind_norm(struct wk_tower_binder *b, int64_t n, const char *prefix, const char *name,
                      const float **w, const float **bias) {
  *w = wk_tower_vec(b, n, "%s%s.weight", prefix, name);
  *bias = wk_tower_vec(b, n, "%s%s.bias", prefix, name);
}

/* mm_input_projection_weight [D, H] (used as x @ W), stored transposed as
 * [H, D] in its own dtype so that kn_matmul applies it. */
static struct wk_clin bind_projection(struct wk_tower_binder *b, const char *name, int D, int H) {
  struct wk_clin m = {0};
  const struct md_tensor *t = wk_tower_tensor(b, name, 2, (const int64_t[]){D, H});
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
  m.w = wk_tower_place(b, tr, t->nbytes, 1);
  free(tr);
  return m;
}

static int bind_all(struct wk_tower *tower, char *err, size_t errlen) {
  struct wk_vision *v = (struct wk_vision *)tower;
  const struct md_vision_cfg *c = &v->vc;
  struct wk_tower_binder b = wk_tower_bind(tower, "vision tower", err, errlen);
  /* "model.vision_tower.vision_model." or the older "vision_tower.vision_model.",
   * with the projector's prefix of the same layout */
  static const char *const vps[] = {"model.vision_tower.vision_model.",
                                    "vision_tower.vision_model."};
  static const char *const pps[] = {"model.multi_modal_projector.", "multi_modal_projector."};
  int at = wk_tower_prefix(tower->st, vps, 2, "embeddings.patch_embedding.weight");
  if (at < 0)
    return cm_fail(err, errlen, CM_ERR_NOENT,
                   "vision tower: no embeddings.patch_embedding.weight under "
                   "model.vision_tower.vision_model. or vision_tower.vision_model.");
  const char *VP = vps[at], *PP = pps[at];
  int D = c->hidden, F = c->ffn, p = c->patch;
  char name[256];
  snprintf(name, sizeof(name), "%sembeddings.patch_embedding.weight", VP);
  /* [D, C, p, p] is [D, C * p * p] row-major: the unfolded patch order */
  const struct md_tensor *t = wk_tower_tensor(&b, name, 4, (const int64_t[]){D, c->channels, p, p});
  if (t) {
    v->patch_w.dt = (enum kn_dtype)t->dtype;
    v->patch_w.w = wk_tower_place(&b, t->data, t->nbytes, 0);
  }
  v->patch_b = bind_vec(&b, D, VP, "embeddings.patch_embedding.bias");
  snprintf(name, sizeof(name), "%sembeddings.position_embedding.weight", VP);
  v->pos = wk_tower_f32(&b, 2, (const int64_t[]){c->n_patches, D}, name);
  v->layers = cm_arena_calloc(&v->t.host, (size_t)c->n_layers, sizeof(*v->layers));
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
  v->mm_norm_mode = tower->cfg.gguf ? KN_NORM_MUL_W : KN_NORM_MUL_ONE_PLUS_W;
  snprintf(name, sizeof(name), "%smm_input_projection_weight", PP);
  v->proj = bind_projection(&b, name, D, v->t.text_hidden);
  return b.rc;
}

/* ---- scratch ----------------------------------------------------------------- */

static int alloc_scratch(struct wk_tower *tower, char *err, size_t errlen) {
  struct wk_vision *v = (struct wk_vision *)tower;
  const struct md_vision_cfg *c = &v->vc;
  size_t T = (size_t)v->max_images * (size_t)c->n_patches, D = (size_t)c->hidden;
  size_t M = (size_t)v->max_images * (size_t)c->mm_tokens;
  int bt = WK_VISION_PAGE_TOKENS;
  v->pages_per_image = (c->n_patches + bt - 1) / bt;
  v->patches_host = cm_arena_alloc(&tower->host, T * (size_t)v->kp * sizeof(float));
  if (!v->patches_host ||
      wk_tower_kv_alloc(tower, &v->kv, v->max_images * v->pages_per_image, bt, c->n_heads,
                        c->head_dim, T, v->max_images) ||
      WK_TOWER_FLOATS(tower, T * (size_t)v->kp, &v->patches) ||
      WK_TOWER_FLOATS(tower, T * D, &v->x, &v->h, &v->q, &v->k, &v->v, &v->a) ||
      WK_TOWER_FLOATS(tower, T * (size_t)c->ffn, &v->f) ||
      WK_TOWER_FLOATS(tower, M * D, &v->pooled) ||
      WK_TOWER_FLOATS(tower, M * (size_t)tower->text_hidden, &v->emb))
    return cm_fail(err, errlen, CM_ERR_NOMEM,
                   "vision tower: out of memory for the scratch of %d images", v->max_images);
  /* image i owns pages i * pages_per_image ..; its tokens fill them in order */
  for (int i = 0; i < v->max_images; i++)
    wk_tower_kv_seq(&v->kv, i, i * c->n_patches, c->n_patches, i * v->pages_per_image);
  return 0;
}

/* ---- load ------------------------------------------------------------------- */

static int setup(struct wk_tower *tower, const char *dir, const void *opts_, char *err,
                 size_t errlen) {
  struct wk_vision *v = (struct wk_vision *)tower;
  const struct wk_vision_opts *opts = opts_;
  if (!tower->cfg.vision.present)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "%s: the checkpoint has no vision tower (model_type \"%s\" without "
                   "vision_config)",
                   dir, tower->cfg.model_type);
  v->vc = tower->cfg.vision;
  v->kp = v->vc.channels * v->vc.patch * v->vc.patch;
  v->max_images = opts && opts->max_images > 0 ? opts->max_images : 2;
  if ((long long)v->max_images * v->vc.n_patches > (1 << 24))
    return cm_fail(err, errlen, CM_ERR_TOOBIG, "vision tower: %d images of %d patches per pass",
                   v->max_images, v->vc.n_patches);
  return 0;
}

static const struct wk_tower_kind vision_kind = {.what = "vision tower",
                                                 .size = sizeof(struct wk_vision),
                                                 .setup = setup,
                                                 .bind = bind_all,
                                                 .scratch = alloc_scratch,
                                                 .mmproj = 1};

int wk_vision_load(const char *dir, struct kn_backend *be, const struct wk_vision_opts *opts,
                   struct wk_vision **out, char *err, size_t errlen) {
  struct wk_tower *t;
  int rc = wk_tower_load(&vision_kind, dir, be, opts, &t, err, errlen);
  *out = (struct wk_vision *)t; /* it begins with its tower */
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

static int linear(struct wk_vision *v, float *out, const float *in, struct wk_clin w,
                  const float *b, int T, int N, int K, enum kn_act act) {
  int rc = kn_matmul(v->t.be, out, N, in, K, w.w, w.dt, T, N, K, 0);
  return rc ? rc : kn_bias_act(v->t.be, out, N, out, N, b, T, N, act);
}

/* n <= max_images images: pixels [n, C, S, S] -> out [n * mm_tokens, H] (host). */
static int encode_pass(struct wk_vision *v, const float *pixels, int n, float *out) {
  const struct md_vision_cfg *c = &v->vc;
  struct kn_backend *be = v->t.be;
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
        (rc = kn_kv_write(be, &v->kv.view, v->kv.slots, v->k, D, v->v, D, T)) ||
        (rc = kn_attention(be, v->a, D, v->q, D, &v->kv.view, v->kv.seqs, n, c->n_heads, 0, scale,
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
                       (float)c->eps, v->mm_norm_mode)) ||
      (rc = kn_matmul(be, v->emb, v->t.text_hidden, v->pooled, D, v->proj.w, v->proj.dt, M,
                      v->t.text_hidden, D, 0)))
    return rc;
  return kn_download(be, out, v->emb, (size_t)M * (size_t)v->t.text_hidden * sizeof(float));
}

int wk_vision_encode(struct wk_vision *v, const float *pixels, int n_images, float *out, char *err,
                     size_t errlen) {
  if (!v || n_images < 0 || (n_images > 0 && (!pixels || !out)))
    return cm_fail(err, errlen, CM_ERR_INVAL, "vision encode: bad arguments");
  const struct md_vision_cfg *c = &v->vc;
  size_t in_per = (size_t)c->channels * c->image_size * c->image_size;
  size_t out_per = (size_t)c->mm_tokens * v->t.text_hidden;
  for (int i0 = 0; i0 < n_images; i0 += v->max_images) {
    int n = CM_MIN(v->max_images, n_images - i0);
    int rc = encode_pass(v, pixels + (size_t)i0 * in_per, n, out + (size_t)i0 * out_per);
    if (rc)
      return cm_fail(err, errlen, rc, "vision encode: images %d..%d: %s", i0, i0 + n - 1,
                     cm_strerror(rc));
  }
  return 0;
}
