/* wk-audio-g4.c — Gemma 4's audio tower and embedder (wk-audio-g4.h):
 * weight binding and the encoder pass over backend ops.
 *
 * The math, after transformers' modeling_gemma4.py (RMSNorm is x (mean(x^2)
 * + eps)^-1/2 w; "clin" a Gemma4ClippableLinear: clamp, linear, clamp, when
 * use_clipped_linears; "cl" a clamp to +-min(gradient_clipping, the largest
 * value of the named weight's dtype); eps6 the 1e-6 of the norms made
 * without an eps, eps the config's rms_norm_eps):
 *   subsampling, twice: x = relu(layernorm_c(conv3x3_s2(x)))   (channels last,
 *     LayerNorm over channels without bias); then the [t, f, c] grid's rows
 *     flattened and input_proj_linear (no bias);
 *   per layer:
 *     x = ff1(x)
 *     x += rmsnorm(cl(post(attn(rmsnorm(cl(x), norm_pre_attn, eps6)))), norm_post_attn, eps6)
 *     x += linear_end(silu(rmsnorm(cl(dwconv(glu(linear_start(rmsnorm(x,
 *          lconv pre_layer_norm, eps))))), conv_norm, eps)))
 *     x = ff2(x); x = rmsnorm(cl(x), norm_out, eps6)
 *   ff(x) = x + residual_weight rmsnorm(cl(ffw_layer_2(silu(ffw_layer_1(
 *          rmsnorm(cl(x), pre_layer_norm, eps6))))), post_layer_norm, eps6)
 *   attn: q = clin(h, q_proj) * head_dim^-1/2 / ln 2 * softplus(per_dim_scale),
 *     k = clin(h, k_proj) * ln(1 + e) / ln 2, v = clin(h, v_proj); frame t
 *     sees the frames s of its clip with d = t - s in [-(right - 1), left - 2]
 *     (the sliding mask (context_left - 1, context_right) and-ed with the
 *     valid frames); logit q.k + q.rel[d], capped cap tanh(l / cap), softmax;
 *     rel[d] = relative_k_proj of the sinusoid [sin(p w), cos(p w)] (w_i =
 *     exp(-i ln(10^4) / (hidden / 2 - 1))) at p = L - 1 - (left - 1 - d) with
 *     L = context // 2 + 1, context = chunk + left - 1 + right: what the
 *     chunked blocks and _rel_shift give, zero where left - 1 - d >= L;
 *   dwconv: depthwise, causal (left padding kernel - 1); glu: a * sigmoid(b)
 *     over the halves of linear_start's output;
 *   out = output_proj(x) (with bias); emb = embedding_projection(rmsnorm(out,
 *     no weight, eps)).
 * The blocks of attention_chunk_size frames change which keys a query's
 * window holds, not which it sees, so they need no op of their own:
 * kn_local_attn_rel takes the distances directly.
 *
 * A clip's frames past its valid ones (md_audio_features' padding) change
 * none of its valid outputs (the convolutions' inputs are masked, attention
 * and the causal convolution never look ahead past the mask), so only the
 * valid frames run: a clip of V valid frames gives ceil(V / 2) rows after
 * the first convolution and ceil(V / 4), its soft tokens, after the second.
 *
 * Which ops carry it: kn_conv3x3_s2 per clip, kn_layernorm (a zero bias) and
 * kn_bias_act (ReLU, SiLU, the sigmoid, output_proj's bias), kn_clamp,
 * kn_rmsnorm, kn_matmul (wk_clin_run for the clippable linears),
 * kn_standardize (the per-dimension q scale, a zero bias), kn_scale,
 * kn_local_attn_rel, kn_copy_rows and kn_mul (the GLU), kn_dwconv_causal,
 * kn_add_norm (a post-norm joining the residual; residual_weight folded into
 * the feed-forwards' post_layer_norm weights) and kn_add. */
#include "worker/wk-audio-g4.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-arena.h"
#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "kernels/kn-dtype.h"
#include "model/md-audio-g4.h"
#include "model/md-safetensors.h"
#include "worker/wk-owned.h"
#include "worker/wk-tower.h"

#define A_MAX_CLIPS 64    /* clips per encoder pass */
#define A_EPS6      1e-6f /* Gemma4RMSNorm's default eps */

struct aff {
  const float *pre_norm;  /* [D] */
  const float *post_norm; /* [D]: post_layer_norm times residual_weight */
  struct wk_clin w1;      /* [4D, D] */
  struct wk_clin w2;      /* [D, 4D] */
  float clip;
};

struct alayer {
  struct aff ff[2];
  const float *norm_pre_attn, *norm_post_attn, *norm_out; /* [D] */
  float clip;
  struct wk_clin wq, wk, wv, post; /* [D, D] */
  const float *qscale;             /* [hd]: head_dim^-1/2 / ln 2 * softplus(per_dim_scale) */
  const float *rel;                /* [n_dist, D]: relative keys by distance, dmin first */
  const float *lc_pre_norm, *lc_conv_norm; /* [D] */
  struct wk_clin start;                    /* [2D, D] */
  struct wk_clin end;                      /* [D, D] */
  const float *dw;                         /* [D, K] */
  float lclip;
};

struct wk_audio_g4 {
  struct wk_tower t;
  struct md_audio_g4_cfg ac; /* = t.cfg.audio_g4 */
  struct md_audio_fe_cfg fe; /* the checkpoint's feature extractor */
  int n_mel, F1, F2;         /* frequency bins in, after conv 1, after conv 2 */
  int dmin, dmax;            /* the distances a frame sees */

  const float *conv_w[2];  /* [C_out, 3, 3, C_in] f32 */
  const float *conv_ln[2]; /* [C_out] */
  const float *zeros;      /* [max(D, C0, C1)]: the LayerNorms' and q scale's bias */
  struct wk_clin in_proj;  /* [D, F2 C1] */
  struct alayer *layers;   /* [n_layers] host (from the arena t.host) */
  struct wk_clin out_proj; /* [O, D] */
  const float *out_bias;   /* [O] */
  struct wk_clin emb_proj; /* [H, O] */

  /* scratch for max_frames valid frames (T0), T1 / T2 rows after each conv */
  int max_frames, T1, T2;
  float *feat_host;             /* [T0, n_mel] host */
  int32_t *first, *span;        /* [T2], [T2, 2] host: each row's clip */
  float *feat, *c0, *c1;        /* [T0, n_mel], [T1, F1, C0], [T2, F2, C1] */
  float *x, *h, *o, *q, *k, *v; /* [T2, D] */
  float *a;                     /* [T2, D] */
  float *g;                     /* [T2, 4D] */
  float *c;                     /* [T2, 4D]: a clamped input */
  float *y;                     /* [T2, O] */
  float *emb;                   /* [T2, H] */
};

_Static_assert(offsetof(struct wk_audio_g4, t) == 0, "a tower begins with its struct wk_tower");

/* ---- memory ---------------------------------------------------------------- */

void wk_audio_g4_free(struct wk_audio_g4 *a) {
  wk_tower_free((struct wk_tower *)a); /* a begins with its tower */
}

const struct md_audio_g4_cfg *wk_audio_g4_config(const struct wk_audio_g4 *a) {
  return &a->ac;
}

int wk_audio_g4_text_hidden(const struct wk_audio_g4 *a) {
  return a->t.text_hidden;
}

/* ---- binding ------------------------------------------------------------------ */

/* min(gradient_clipping, the largest finite value of name's dtype), as
 * Gemma4AudioFeedForward, Gemma4AudioLightConv1d and Gemma4AudioLayer take
 * it from their first weight (f16: 65504). */
static float clip_of(const struct wk_audio_g4 *a, const char *name) {
  const struct md_tensor *t = md_st_find(a->t.st, name);
  double top = t && t->dtype == MD_ST_F16    ? 65504.0
               : t && t->dtype == MD_ST_BF16 ? 3.3895313892515355e38
                                             : FLT_MAX;
  return (float)fmin(a->ac.grad_clip, top);
}

/* A conv weight [co, ci, 3, 3] as f32 [co, 3, 3, ci] in backend memory. */
static const float *conv_weight(struct wk_tower_binder *b, int co, int ci, const char *name) {
  const struct md_tensor *t = wk_tower_tensor(b, name, 4, (const int64_t[]){co, ci, 3, 3});
  if (!t) return NULL;
  size_t n = (size_t)co * ci * 9;
  float *host = malloc(sizeof(float) * n);
  if (!host) {
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_NOMEM, "out of memory for %s", name);
    return NULL;
  }
  for (int o = 0; o < co; o++)
    for (int i = 0; i < ci; i++)
      for (int ab = 0; ab < 9; ab++)
        host[((size_t)o * 9 + ab) * ci + i] =
            kn_load_f32(t->data, (enum kn_dtype)t->dtype, ((size_t)o * ci + i) * 9 + ab);
  const float *p = wk_tower_place(b, host, n * sizeof(float), 1);
  free(host);
  return p;
}

/* A vector of n floats computed on the host, placed in backend memory. */
static const float *put(struct wk_tower_binder *b, const double *v, int n) {
  float *host = malloc(sizeof(float) * (size_t)n);
  if (!host) {
    if (!b->rc) b->rc = cm_fail(b->err, b->errlen, CM_ERR_NOMEM, "out of memory");
    return NULL;
  }
  for (int i = 0; i < n; i++)
    host[i] = (float)v[i];
  const float *p = wk_tower_place(b, host, sizeof(float) * (size_t)n, 1);
  free(host);
  return p;
}

/* A norm weight [D] times s (the feed-forwards' residual_weight), f32. */
static const float *scaled_vec(struct wk_tower_binder *b, int D, double s, const char *name) {
  const struct md_tensor *t = wk_tower_tensor(b, name, 1, (const int64_t[]){D});
  if (!t) return NULL;
  double *w = malloc(sizeof(double) * (size_t)D);
  if (!w) {
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_NOMEM, "out of memory for %s", name);
    return NULL;
  }
  for (int i = 0; i < D; i++)
    w[i] = (double)(float)((double)kn_load_f32(t->data, (enum kn_dtype)t->dtype, (size_t)i) * s);
  const float *p = put(b, w, D);
  free(w);
  return p;
}

/* relative_k_proj (PREFIX.relative_k_proj.weight [D, D]) of the sinusoids of
 * the distances dmin..dmax (see the top of the file), in double: [n, D]. */
static const float *relative_keys(struct wk_audio_g4 *a, struct wk_tower_binder *b,
                                  const char *prefix) {
  const struct md_audio_g4_cfg *c = &a->ac;
  int D = c->hidden, n = a->dmax - a->dmin + 1, half = D / 2;
  char name[256];
  snprintf(name, sizeof(name), "%srelative_k_proj.weight", prefix);
  const struct md_tensor *t = wk_tower_matrix(b, name, D, D, 1);
  if (!t) return NULL;
  double *rel = calloc((size_t)n * D, sizeof(double)), *pe = malloc(sizeof(double) * (size_t)D);
  float *w = malloc(sizeof(float) * (size_t)D * D);
  if (w)
    for (int o = 0; o < D; o++)
      wk_tower_row(t, o, D, w + (size_t)o * D);
  if (!rel || !pe || !w) {
    free(rel), free(pe), free(w);
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_NOMEM, "out of memory for %s", name);
    return NULL;
  }
  int past = c->ctx_left - 1, L = (c->chunk + past + c->ctx_right) / 2 + 1;
  double inc = log(10000.0) / (half - 1 > 1 ? half - 1 : 1);
  for (int d = a->dmin; d <= a->dmax; d++) {
    int col = past - d; /* the position column of _rel_shift */
    if (col >= L) continue;
    double p = (double)(L - 1 - col);
    for (int i = 0; i < half; i++) {
      pe[i] = sin(p * exp(-i * inc));
      pe[half + i] = cos(p * exp(-i * inc));
    }
    double *r = rel + (size_t)(d - a->dmin) * D;
    for (int o = 0; o < D; o++) {
      double acc = 0.0;
      for (int i = 0; i < D; i++)
        acc += (double)w[(size_t)o * D + i] * pe[i];
      r[o] = acc;
    }
  }
  const float *p = put(b, rel, n * D);
  free(rel), free(pe), free(w);
  return p;
}

/* head_dim^-1/2 / ln 2 * softplus(PREFIX.per_dim_scale [hd]); softplus'd
 * already (llama.cpp's converter applies it) in an mmproj file. */
static const float *q_scale(struct wk_tower_binder *b, int hd, const char *prefix, int softplused) {
  char name[256];
  snprintf(name, sizeof(name), "%sper_dim_scale", prefix);
  const struct md_tensor *t = wk_tower_tensor(b, name, 1, (const int64_t[]){hd});
  if (!t) return NULL;
  double s[KN_MAX_HEAD_DIM];
  for (int i = 0; i < hd; i++) {
    double x = kn_load_f32(t->data, (enum kn_dtype)t->dtype, (size_t)i);
    s[i] = pow(hd, -0.5) / log(2.0) * (softplused || x > 30 ? x : log1p(exp(x)));
  }
  return put(b, s, hd);
}

static void bind_ff(struct wk_audio_g4 *a, struct wk_tower_binder *b, struct aff *f, const char *lp,
                    int j) {
  int D = a->ac.hidden, cl = a->ac.clipped_linears;
  char name[224];
  f->pre_norm = wk_tower_vec(b, D, "%sfeed_forward%d.pre_layer_norm.weight", lp, j);
  snprintf(name, sizeof(name), "%sfeed_forward%d.post_layer_norm.weight", lp, j);
  f->post_norm = scaled_vec(b, D, a->ac.residual_weight, name);
  f->w1 = wk_tower_clin(b, 4 * D, D, cl, "%sfeed_forward%d.ffw_layer_1", lp, j);
  f->w2 = wk_tower_clin(b, D, 4 * D, cl, "%sfeed_forward%d.ffw_layer_2", lp, j);
  snprintf(name, sizeof(name), "%sfeed_forward%d.ffw_layer_1.linear.weight", lp, j);
  f->clip = clip_of(a, name);
}

static int bind_all(struct wk_tower *tower, char *err, size_t errlen) {
  struct wk_audio_g4 *a = (struct wk_audio_g4 *)tower;
  const struct md_audio_g4_cfg *c = &a->ac;
  struct wk_tower_binder b = wk_tower_bind(tower, "audio tower", err, errlen);
  const char *AP = "model.audio_tower.", *EP = "model.embed_audio.";
  if (!md_st_find(a->t.st, "model.audio_tower.output_proj.weight"))
    AP = "audio_tower.", EP = "embed_audio.";
  int D = c->hidden, hd = D / c->n_heads, C0 = c->conv_ch[0], C1 = c->conv_ch[1];
  int O = c->output_dims, cl = c->clipped_linears;
  char name[256], sp[200];
  snprintf(sp, sizeof(sp), "%ssubsample_conv_projection.", AP);
  snprintf(name, sizeof(name), "%slayer0.conv.weight", sp);
  a->conv_w[0] = conv_weight(&b, C0, 1, name);
  snprintf(name, sizeof(name), "%slayer1.conv.weight", sp);
  a->conv_w[1] = conv_weight(&b, C1, C0, name);
  a->conv_ln[0] = wk_tower_vec(&b, C0, "%slayer0.norm.weight", sp);
  a->conv_ln[1] = wk_tower_vec(&b, C1, "%slayer1.norm.weight", sp);
  snprintf(name, sizeof(name), "%sinput_proj_linear.weight", sp);
  a->in_proj = wk_tower_linear(&b, D, (int64_t)(C0 / 4) * C1, name);
  a->layers = cm_arena_calloc(&a->t.host, (size_t)c->n_layers, sizeof(*a->layers));
  if (!a->layers) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  for (int i = 0; i < c->n_layers && !b.rc; i++) {
    struct alayer *l = &a->layers[i];
    char lp[160], ap[200];
    snprintf(lp, sizeof(lp), "%slayers.%d.", AP, i);
    snprintf(ap, sizeof(ap), "%sself_attn.", lp);
    bind_ff(a, &b, &l->ff[0], lp, 1);
    bind_ff(a, &b, &l->ff[1], lp, 2);
    l->norm_pre_attn = wk_tower_vec(&b, D, "%snorm_pre_attn.weight", lp);
    l->norm_post_attn = wk_tower_vec(&b, D, "%snorm_post_attn.weight", lp);
    l->norm_out = wk_tower_vec(&b, D, "%snorm_out.weight", lp);
    snprintf(name, sizeof(name), "%snorm_pre_attn.weight", lp);
    l->clip = clip_of(a, name);
    l->wq = wk_tower_clin(&b, D, D, cl, "%sq_proj", ap);
    l->wk = wk_tower_clin(&b, D, D, cl, "%sk_proj", ap);
    l->wv = wk_tower_clin(&b, D, D, cl, "%sv_proj", ap);
    l->post = wk_tower_clin(&b, D, D, cl, "%spost", ap);
    l->qscale = q_scale(&b, hd, ap, a->t.cfg.gguf);
    l->rel = relative_keys(a, &b, ap);
    l->lc_pre_norm = wk_tower_vec(&b, D, "%slconv1d.pre_layer_norm.weight", lp);
    l->lc_conv_norm = wk_tower_vec(&b, D, "%slconv1d.conv_norm.weight", lp);
    l->start = wk_tower_clin(&b, 2 * D, D, cl, "%slconv1d.linear_start", lp);
    l->end = wk_tower_clin(&b, D, D, cl, "%slconv1d.linear_end", lp);
    snprintf(name, sizeof(name), "%slconv1d.depthwise_conv1d.weight", lp);
    l->dw = wk_tower_f32(&b, 3, (const int64_t[]){D, 1, c->conv_kernel}, name);
    snprintf(name, sizeof(name), "%slconv1d.linear_start.linear.weight", lp);
    l->lclip = clip_of(a, name);
  }
  snprintf(name, sizeof(name), "%soutput_proj.weight", AP);
  a->out_proj = wk_tower_linear(&b, O, D, name);
  a->out_bias = wk_tower_vec(&b, O, "%soutput_proj.bias", AP);
  snprintf(name, sizeof(name), "%sembedding_projection.weight", EP);
  a->emb_proj = wk_tower_linear(&b, a->t.text_hidden, O, name);
  int nz = CM_MAX(D, CM_MAX(C0, C1));
  double *z = calloc((size_t)nz, sizeof(double));
  if (!z) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  a->zeros = put(&b, z, nz);
  free(z);
  return b.rc;
}

/* ---- scratch ----------------------------------------------------------------- */

static int alloc_scratch(struct wk_tower *tower, char *err, size_t errlen) {
  struct wk_audio_g4 *a = (struct wk_audio_g4 *)tower;
  const struct md_audio_g4_cfg *c = &a->ac;
  size_t T0 = (size_t)a->max_frames, D = (size_t)c->hidden, O = (size_t)c->output_dims;
  /* each clip rounds its rows up once per convolution */
  a->T1 = a->max_frames / 2 + A_MAX_CLIPS;
  a->T2 = a->T1 / 2 + A_MAX_CLIPS;
  size_t T1 = (size_t)a->T1, T2 = (size_t)a->T2;
  a->feat_host = cm_arena_alloc(&tower->host, T0 * (size_t)a->n_mel * sizeof(float));
  if (!a->feat_host || WK_TOWER_INTS(tower, T2, &a->first) ||
      WK_TOWER_INTS(tower, 2 * T2, &a->span) ||
      WK_TOWER_FLOATS(tower, T0 * (size_t)a->n_mel, &a->feat) ||
      WK_TOWER_FLOATS(tower, T1 * (size_t)a->F1 * (size_t)c->conv_ch[0], &a->c0) ||
      WK_TOWER_FLOATS(tower, T2 * (size_t)a->F2 * (size_t)c->conv_ch[1], &a->c1) ||
      WK_TOWER_FLOATS(tower, T2 * D, &a->x, &a->h, &a->o, &a->q, &a->k, &a->v, &a->a) ||
      WK_TOWER_FLOATS(tower, T2 * 4 * D, &a->g, &a->c) || WK_TOWER_FLOATS(tower, T2 * O, &a->y) ||
      WK_TOWER_FLOATS(tower, T2 * (size_t)tower->text_hidden, &a->emb))
    return cm_fail(err, errlen, CM_ERR_NOMEM,
                   "audio tower: out of memory for the scratch of %d frames", a->max_frames);
  return 0;
}

/* ---- load ------------------------------------------------------------------- */

static int setup(struct wk_tower *tower, const char *dir, const void *opts_, char *err,
                 size_t errlen) {
  struct wk_audio_g4 *a = (struct wk_audio_g4 *)tower;
  const struct wk_audio_g4_opts *opts = opts_;
  if (!tower->cfg.audio_g4.present)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "%s: the checkpoint has no Gemma 4 audio tower (model_type \"%s\")", dir,
                   tower->cfg.model_type);
  a->ac = tower->cfg.audio_g4;
  int rc = md_audio_fe_load(dir, &a->fe, err, errlen);
  if (rc) return rc;
  a->n_mel = a->fe.n_mel;
  a->F1 = (a->n_mel + 1) / 2;
  a->F2 = (a->F1 + 1) / 2;
  if (a->F2 != a->ac.conv_ch[0] / 4)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "audio tower: the feature extractor's feature_size %d leaves %d frequency bins "
                   "after the subsampling convolutions, input_proj_linear takes "
                   "subsampling_conv_channels[0] / 4 = %d",
                   a->n_mel, a->F2, a->ac.conv_ch[0] / 4);
  a->dmin = a->ac.ctx_right > 0 ? 1 - a->ac.ctx_right : 0;
  a->dmax = a->ac.ctx_left - 2;
  int hd = a->ac.hidden / a->ac.n_heads;
  long long frames = (long long)md_audio_fe_frames(&a->fe, (size_t)a->fe.max_samples);
  a->max_frames = opts && opts->max_frames > 0 ? opts->max_frames : (int)CM_MIN(frames, 1 << 22);
  if (hd > KN_MAX_HEAD_DIM || a->dmax - a->dmin + 1 > KN_LOCAL_ATTN_MAX_KEYS ||
      a->max_frames > (1 << 22))
    return cm_fail(err, errlen, CM_ERR_TOOBIG,
                   "audio tower: head_dim %d (at most %d), %d keys a frame sees (at most %d), %d "
                   "frames per pass (at most %d)",
                   hd, KN_MAX_HEAD_DIM, a->dmax - a->dmin + 1, KN_LOCAL_ATTN_MAX_KEYS,
                   a->max_frames, 1 << 22);
  return 0;
}

static const struct wk_tower_kind audio_g4_kind = {.what = "audio tower",
                                                   .size = sizeof(struct wk_audio_g4),
                                                   .setup = setup,
                                                   .bind = bind_all,
                                                   .scratch = alloc_scratch,
                                                   .mmproj = 1};

int wk_audio_g4_load(const char *dir, struct kn_backend *be, const struct wk_audio_g4_opts *opts,
                     struct wk_audio_g4 **out, char *err, size_t errlen) {
  struct wk_tower *t;
  int rc = wk_tower_load(&audio_g4_kind, dir, be, opts, &t, err, errlen);
  *out = (struct wk_audio_g4 *)t; /* it begins with its tower */
  return rc;
}

/* ---- the encoder pass ---------------------------------------------------------- */

static int clin(struct wk_audio_g4 *a, float *out, const float *in, const struct wk_clin *m, int T,
                int N, int K) {
  return wk_clin_run(a->t.be, a->c, out, in, m, T, N, K);
}

/* h = rmsnorm(clamp(x, +-clip), w, eps) over S rows of D (x untouched). */
static int clamp_norm(struct wk_audio_g4 *a, float *h, const float *x, float clip, const float *w,
                      float eps, int S) {
  int D = a->ac.hidden, rc;
  if ((rc = kn_clamp(a->t.be, a->c, x, -clip, clip, (size_t)S * D))) return rc;
  return kn_rmsnorm(a->t.be, h, D, a->c, D, S, D, w, KN_DTYPE_F32, eps, KN_NORM_MUL_W);
}

/* x += rmsnorm(clamp(o), w) (o clamped in place; w may carry a scale). */
static int join(struct wk_audio_g4 *a, float *x, float *o, float clip, const float *w, int S) {
  int D = a->ac.hidden, rc;
  if ((rc = kn_clamp(a->t.be, o, o, -clip, clip, (size_t)S * D))) return rc;
  return kn_add_norm(a->t.be, x, D, o, D, NULL, D, S, D, w, NULL, KN_DTYPE_F32, 1.0f, A_EPS6,
                     KN_NORM_MUL_W);
}

/* Gemma4AudioFeedForward on x [S, D]. */
static int feed_forward(struct wk_audio_g4 *a, const struct aff *f, int S) {
  int D = a->ac.hidden, rc;
  if ((rc = clamp_norm(a, a->h, a->x, f->clip, f->pre_norm, A_EPS6, S)) ||
      (rc = clin(a, a->g, a->h, &f->w1, S, 4 * D, D)) ||
      (rc = kn_bias_act(a->t.be, a->g, 4 * D, a->g, 4 * D, NULL, S, 4 * D, KN_ACT_SILU)) ||
      (rc = clin(a, a->o, a->g, &f->w2, S, D, 4 * D)))
    return rc;
  return join(a, a->x, a->o, f->clip, f->post_norm, S);
}

/* One Gemma4AudioLayer on x [S, D]. */
static int layer(struct wk_audio_g4 *a, const struct alayer *l, int S) {
  const struct md_audio_g4_cfg *c = &a->ac;
  struct kn_backend *be = a->t.be;
  int D = c->hidden, nh = c->n_heads, hd = D / nh, rc;
  float eps = (float)c->eps;
  static const double k_scale = 1.4426950408889634 * 1.3132616875182228; /* ln(1 + e) / ln 2 */
  if ((rc = feed_forward(a, &l->ff[0], S)) ||
      /* attention */
      (rc = clamp_norm(a, a->h, a->x, l->clip, l->norm_pre_attn, A_EPS6, S)) ||
      (rc = clin(a, a->q, a->h, &l->wq, S, D, D)) || (rc = clin(a, a->k, a->h, &l->wk, S, D, D)) ||
      (rc = clin(a, a->v, a->h, &l->wv, S, D, D)) ||
      (rc = kn_standardize(be, a->q, hd, a->q, hd, S * nh, hd, a->zeros, l->qscale)) ||
      (rc = kn_scale(be, a->k, a->k, (float)k_scale, (size_t)S * D)) ||
      (rc = kn_local_attn_rel(be, a->a, D, a->q, D, a->k, D, a->v, D, l->rel, a->span, S, nh, hd,
                              a->dmin, a->dmax, (float)c->logit_cap)) ||
      (rc = clin(a, a->o, a->a, &l->post, S, D, D)) ||
      (rc = join(a, a->x, a->o, l->clip, l->norm_post_attn, S)) ||
      /* the light convolution: glu(start) into a, its gate through h */
      (rc = kn_rmsnorm(be, a->h, D, a->x, D, S, D, l->lc_pre_norm, KN_DTYPE_F32, eps,
                       KN_NORM_MUL_W)) ||
      (rc = clin(a, a->g, a->h, &l->start, S, 2 * D, D)) ||
      (rc = kn_bias_act(be, a->h, D, a->g + D, 2 * D, NULL, S, D, KN_ACT_SIGMOID)) ||
      (rc = kn_copy_rows(be, a->a, D, a->g, 2 * D, S, D)) ||
      (rc = kn_mul(be, a->a, a->a, a->h, (size_t)S * D)) ||
      (rc = kn_dwconv_causal(be, a->o, D, a->a, D, l->dw, a->first, S, D, c->conv_kernel)) ||
      (rc = clamp_norm(a, a->h, a->o, l->lclip, l->lc_conv_norm, eps, S)) ||
      (rc = kn_bias_act(be, a->h, D, a->h, D, NULL, S, D, KN_ACT_SILU)) ||
      (rc = clin(a, a->o, a->h, &l->end, S, D, D)) ||
      (rc = kn_add(be, a->x, a->x, a->o, (size_t)S * D)) || (rc = feed_forward(a, &l->ff[1], S)))
    return rc;
  if ((rc = kn_clamp(be, a->x, a->x, -l->clip, l->clip, (size_t)S * D))) return rc;
  return kn_rmsnorm(be, a->x, D, a->x, D, S, D, l->norm_out, KN_DTYPE_F32, A_EPS6, KN_NORM_MUL_W);
}

/* One subsampling layer: relu(layernorm(conv3x3_s2(in))) per clip, rows
 * rows[i] -> (rows[i] + 1) / 2 of F -> (F + 1) / 2 bins. */
static int subsample(struct wk_audio_g4 *a, int j, float *out, const float *in, const int *rows,
                     int n, int F, int ci) {
  int co = a->ac.conv_ch[j], Fo = (F + 1) / 2, rc, total = 0;
  for (int i = 0; i < n; i++) {
    if (!rows[i]) continue;
    if ((rc = kn_conv3x3_s2(a->t.be, out + (size_t)total * Fo * co, in, a->conv_w[j], rows[i], F,
                            ci, co)))
      return rc;
    in += (size_t)rows[i] * F * ci;
    total += (rows[i] + 1) / 2;
  }
  int pos = total * Fo;
  if ((rc = kn_layernorm(a->t.be, out, co, out, co, pos, co, a->conv_ln[j], a->zeros, KN_DTYPE_F32,
                         (float)a->ac.eps)))
    return rc;
  return kn_bias_act(a->t.be, out, co, out, co, NULL, pos, co, KN_ACT_RELU);
}

/* The valid frames of a clip (its mask's leading run of ones), or -1 when
 * the mask is not such a run followed by padding. */
static int valid_frames(const struct wk_g4_audio *c) {
  int v = 0;
  while (v < c->n_frames && c->mask[v])
    v++;
  for (int t = v; t < c->n_frames; t++)
    if (c->mask[t]) return -1;
  return v;
}

/* Clips [0, n) (their valid frames fit max_frames) -> out [their soft tokens, H]. */
static int encode_pass(struct wk_audio_g4 *a, const struct wk_g4_audio *clips, int n, float *out) {
  const struct md_audio_g4_cfg *c = &a->ac;
  struct kn_backend *be = a->t.be;
  int D = c->hidden, C0 = c->conv_ch[0], C1 = c->conv_ch[1], O = c->output_dims;
  int r0[A_MAX_CLIPS], r1[A_MAX_CLIPS], T0 = 0, S = 0, rc;
  for (int i = 0; i < n; i++) {
    r0[i] = valid_frames(&clips[i]);
    r1[i] = (r0[i] + 1) / 2;
    memcpy(a->feat_host + (size_t)T0 * a->n_mel, clips[i].feat,
           (size_t)r0[i] * a->n_mel * sizeof(float));
    int s0 = S, rows = (r1[i] + 1) / 2;
    for (int t = S; t < S + rows; t++) {
      a->first[t] = s0;
      a->span[2 * t] = s0;
      a->span[2 * t + 1] = s0 + rows;
    }
    T0 += r0[i];
    S += rows;
  }
  if (!S) return 0;
  if ((rc = kn_upload(be, a->feat, a->feat_host, (size_t)T0 * a->n_mel * sizeof(float))) ||
      (rc = subsample(a, 0, a->c0, a->feat, r0, n, a->n_mel, 1)) ||
      (rc = subsample(a, 1, a->c1, a->c0, r1, n, a->F1, C0)) ||
      (rc = clin(a, a->x, a->c1, &a->in_proj, S, D, a->F2 * C1)))
    return rc;
  for (int li = 0; li < c->n_layers; li++)
    if ((rc = layer(a, &a->layers[li], S))) return rc;
  if ((rc = clin(a, a->y, a->x, &a->out_proj, S, O, D)) ||
      (rc = kn_bias_act(be, a->y, O, a->y, O, a->out_bias, S, O, KN_ACT_NONE)) ||
      (rc = kn_rmsnorm(be, a->y, O, a->y, O, S, O, NULL, KN_DTYPE_F32, (float)c->eps,
                       KN_NORM_NO_W)) ||
      (rc = clin(a, a->emb, a->y, &a->emb_proj, S, a->t.text_hidden, O)))
    return rc;
  return kn_download(be, out, a->emb, (size_t)S * (size_t)a->t.text_hidden * sizeof(float));
}

int wk_audio_g4_encode(struct wk_audio_g4 *a, const struct wk_g4_audio *clips, int n, float *out,
                       char *err, size_t errlen) {
  if (!a || n < 0 || (n > 0 && (!clips || !out)))
    return cm_fail(err, errlen, CM_ERR_INVAL, "audio encode: bad arguments");
  for (int i = 0; i < n; i++) {
    const struct wk_g4_audio *c = &clips[i];
    int v = c->n_frames < 0 || (c->n_frames > 0 && (!c->feat || !c->mask)) ? -1 : valid_frames(c);
    if (v < 0 || v > a->max_frames ||
        c->soft_tokens != md_audio_soft_tokens(c->mask, (size_t)c->n_frames))
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "audio encode: clip %d (%d frames, %d valid, %d soft tokens) is not a Gemma 4 "
                     "clip this tower takes (its mask valid frames then padding, at most %d valid "
                     "frames, the soft tokens md_audio_soft_tokens gives)",
                     i, c->n_frames, v, c->soft_tokens, a->max_frames);
  }
  size_t H = (size_t)a->t.text_hidden;
  for (int i0 = 0; i0 < n;) {
    int k = 0, T = 0;
    while (i0 + k < n && k < A_MAX_CLIPS && T + valid_frames(&clips[i0 + k]) <= a->max_frames)
      T += valid_frames(&clips[i0 + k++]);
    int rc = encode_pass(a, clips + i0, k, out);
    if (rc)
      return cm_fail(err, errlen, rc, "audio encode: clips %d..%d: %s", i0, i0 + k - 1,
                     cm_strerror(rc));
    for (int j = 0; j < k; j++)
      out += (size_t)clips[i0 + j].soft_tokens * H;
    i0 += k;
  }
  return 0;
}
