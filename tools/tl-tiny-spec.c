/* tl-tiny-spec.c — generated checkpoints: config.json text, tensor lists
 * with their initialisers, and the seeded writer.
 *
 * Weights are scaled so activations stay near unit RMS: linear weights
 * N(0, 1/fan_in), embeddings N(0, 9/hidden) (logits of a few units through
 * the tied head), Gemma 4 norm weights 1 +- 0.1, Gemma 3 ones 0 +- 0.1 (they
 * act as 1 + w), layer scalars in [0.7, 1]. */
#include "tools/tl-tiny-spec.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-grow.h"
#include "common/cm-hash.h"
#include "kernels/kn-dtype.h"

void tl_tiny_spec_free(struct tl_tiny_spec *s) {
  free(s->config_json);
  free(s->generation_json);
  free(s->preproc_json);
  free(s->tensors);
  memset(s, 0, sizeof(*s));
}

static int add(struct tl_tiny_spec *s, enum tl_init init, double a, double b, int ndim, int64_t d0,
               int64_t d1, int64_t d2, const char *fmt, ...) __attribute__((format(printf, 9, 10)));

static int add(struct tl_tiny_spec *s, enum tl_init init, double a, double b, int ndim, int64_t d0,
               int64_t d1, int64_t d2, const char *fmt, ...) {
  if (cm_grow_items(&s->tensors, &s->cap, s->n_tensors + 1, sizeof(*s->tensors), 64))
    return CM_ERR_NOMEM;
  struct tl_tensor_spec *t = &s->tensors[s->n_tensors++];
  memset(t, 0, sizeof(*t));
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->name, sizeof(t->name), fmt, ap);
  va_end(ap);
  t->init = init;
  t->a = a;
  t->b = b;
  t->e.dtype = init == TL_INIT_PERMUTATION ? MD_ST_I64 : MD_ST_BF16;
  t->e.ndim = ndim;
  t->e.shape[0] = d0;
  t->e.shape[1] = d1;
  t->e.shape[2] = d2;
  return 0;
}

#define LIN(out, in, ...)                                                                          \
  add(s, TL_INIT_NORMAL, 1.0 / sqrt((double)(in)), 0, 2, out, in, 0, __VA_ARGS__)
#define NORM(d, ...) add(s, TL_INIT_AROUND, 0.1, norm_center, 1, d, 0, 0, __VA_ARGS__)

/* The tensors of one decoder stack (P = "model." or, in a multimodal
 * checkpoint, "model.language_model."; P + layers.*, norm, embeddings). */
static int add_stack(struct tl_tiny_spec *s, const struct md_config *c, int embed_rows,
                     const char *P) {
  int H = c->hidden, rc = 0;
  double norm_center = c->arch == MD_ARCH_GEMMA3 ? 0.0 : 1.0;
  rc |= add(s, TL_INIT_NORMAL, 0.5 / sqrt((double)H), 0, 2, embed_rows, H, 0,
            "%sembed_tokens.weight", P);
  if (c->ple_dim) {
    int LP = c->n_layers * c->ple_dim;
    rc |= add(s, TL_INIT_NORMAL, 1.0 / sqrt((double)c->ple_dim), 0, 2, c->ple_vocab, LP, 0,
              "%sembed_tokens_per_layer.weight", P);
    rc |= LIN(LP, H, "%sper_layer_model_projection.weight", P);
    rc |= NORM(c->ple_dim, "%sper_layer_projection_norm.weight", P);
  }
  for (int i = 0; i < c->n_layers; i++) {
    const struct md_layer_cfg *l = &c->layers[i];
    int qd = c->n_heads * l->head_dim, kvd = l->n_kv_heads * l->head_dim;
    char p[64];
    snprintf(p, sizeof(p), "%slayers", P);
    rc |= NORM(H, "%s.%d.input_layernorm.weight", p, i);
    rc |= LIN(qd, H, "%s.%d.self_attn.q_proj.weight", p, i);
    rc |= NORM(l->head_dim, "%s.%d.self_attn.q_norm.weight", p, i);
    if (!l->kv_shared) {
      rc |= LIN(kvd, H, "%s.%d.self_attn.k_proj.weight", p, i);
      if (!l->k_eq_v) rc |= LIN(kvd, H, "%s.%d.self_attn.v_proj.weight", p, i);
      rc |= NORM(l->head_dim, "%s.%d.self_attn.k_norm.weight", p, i);
    }
    rc |= LIN(H, qd, "%s.%d.self_attn.o_proj.weight", p, i);
    rc |= NORM(H, "%s.%d.post_attention_layernorm.weight", p, i);
    rc |= NORM(H, "%s.%d.pre_feedforward_layernorm.weight", p, i);
    rc |= LIN(l->ffn_dim, H, "%s.%d.mlp.gate_proj.weight", p, i);
    rc |= LIN(l->ffn_dim, H, "%s.%d.mlp.up_proj.weight", p, i);
    rc |= LIN(H, l->ffn_dim, "%s.%d.mlp.down_proj.weight", p, i);
    rc |= NORM(H, "%s.%d.post_feedforward_layernorm.weight", p, i);
    if (c->moe) {
      int E = c->n_experts, I = c->moe_ffn;
      double gain = s->router_gain > 0 ? s->router_gain : 1.0;
      rc |= add(s, TL_INIT_NORMAL, gain / sqrt((double)H), 0, 2, E, H, 0,
                "%s.%d.router.proj.weight", p, i);
      rc |= NORM(H, "%s.%d.router.scale", p, i);
      rc |= add(s, TL_INIT_UNIFORM, 0.5, 1.5, 1, E, 0, 0, "%s.%d.router.per_expert_scale", p, i);
      rc |= add(s, TL_INIT_NORMAL, 1.0 / sqrt((double)H), 0, 3, E, 2 * I, H,
                "%s.%d.experts.gate_up_proj", p, i);
      rc |= add(s, TL_INIT_NORMAL, 1.0 / sqrt((double)I), 0, 3, E, H, I, "%s.%d.experts.down_proj",
                p, i);
      rc |= NORM(H, "%s.%d.pre_feedforward_layernorm_2.weight", p, i);
      rc |= NORM(H, "%s.%d.post_feedforward_layernorm_1.weight", p, i);
      rc |= NORM(H, "%s.%d.post_feedforward_layernorm_2.weight", p, i);
    }
    if (c->ple_dim) {
      rc |= LIN(c->ple_dim, H, "%s.%d.per_layer_input_gate.weight", p, i);
      rc |= LIN(H, c->ple_dim, "%s.%d.per_layer_projection.weight", p, i);
      rc |= NORM(H, "%s.%d.post_per_layer_input_norm.weight", p, i);
    }
    if (c->arch != MD_ARCH_GEMMA3)
      rc |= add(s, TL_INIT_UNIFORM, 0.7, 1.0, 1, 1, 0, 0, "%s.%d.layer_scalar", p, i);
  }
  rc |= NORM(H, "%snorm.weight", P);
  return rc ? CM_ERR_NOMEM : 0;
}

/* The SigLIP tower and the Gemma 3 projector, named as transformers saves
 * Gemma3ForConditionalGeneration (model.vision_tower.vision_model.*,
 * model.multi_modal_projector.*). Linear and conv weights N(0, 1/fan_in),
 * biases N(0, 0.1^2) (small but not zero, so that every bias path counts),
 * LayerNorm weights 1 +- 0.1, the projector's RMSNorm weight 0 +- 0.1 (it
 * acts as 1 + w), position embeddings N(0, 0.5^2). */
static int add_vision(struct tl_tiny_spec *s, const struct md_config *c) {
  const struct md_vision_cfg *v = &c->vision;
  int D = v->hidden, F = v->ffn, rc = 0, pp = v->channels * v->patch * v->patch;
  const char *VP = "model.vision_tower.vision_model.";
  double norm_center = 1.0;
#define BIAS(d, ...) add(s, TL_INIT_NORMAL, 0.1, 0, 1, d, 0, 0, __VA_ARGS__)
  rc |= add(s, TL_INIT_NORMAL, 1.0 / sqrt((double)pp), 0, 4, D, v->channels, v->patch,
            "%sembeddings.patch_embedding.weight", VP);
  if (!rc) s->tensors[s->n_tensors - 1].e.shape[3] = v->patch;
  rc |= BIAS(D, "%sembeddings.patch_embedding.bias", VP);
  rc |= add(s, TL_INIT_NORMAL, 0.5, 0, 2, v->n_patches, D, 0,
            "%sembeddings.position_embedding.weight", VP);
  for (int i = 0; i < v->n_layers; i++) {
    char lp[128];
    snprintf(lp, sizeof(lp), "%sencoder.layers.%d.", VP, i);
    rc |= NORM(D, "%slayer_norm1.weight", lp);
    rc |= BIAS(D, "%slayer_norm1.bias", lp);
    static const char *const proj[] = {"q_proj", "k_proj", "v_proj", "out_proj"};
    for (int j = 0; j < 4; j++) {
      rc |= LIN(D, D, "%sself_attn.%s.weight", lp, proj[j]);
      rc |= BIAS(D, "%sself_attn.%s.bias", lp, proj[j]);
    }
    rc |= NORM(D, "%slayer_norm2.weight", lp);
    rc |= BIAS(D, "%slayer_norm2.bias", lp);
    rc |= LIN(F, D, "%smlp.fc1.weight", lp);
    rc |= BIAS(F, "%smlp.fc1.bias", lp);
    rc |= LIN(D, F, "%smlp.fc2.weight", lp);
    rc |= BIAS(D, "%smlp.fc2.bias", lp);
  }
  rc |= NORM(D, "%spost_layernorm.weight", VP);
  rc |= BIAS(D, "%spost_layernorm.bias", VP);
#undef BIAS
  rc |= add(s, TL_INIT_NORMAL, 1.0 / sqrt((double)D), 0, 2, D, c->hidden, 0,
            "model.multi_modal_projector.mm_input_projection_weight");
  norm_center = 0.0;
  rc |= NORM(D, "model.multi_modal_projector.mm_soft_emb_norm.weight");
  return rc ? CM_ERR_NOMEM : 0;
}

/* The four 0-d clip bounds of the Gemma4ClippableLinear PREFIX NAME, drawn
 * near 1.5 to 3 so that some values clip. */
static int add_bounds(struct tl_tiny_spec *s, const char *prefix, const char *name) {
  static const char *const key[] = {"input_min", "input_max", "output_min", "output_max"};
  int rc = 0;
  for (int i = 0; i < 4; i++)
    rc |= add(s, TL_INIT_UNIFORM, i % 2 ? 1.5 : -3.0, i % 2 ? 3.0 : -1.5, 0, 0, 0, 0, "%s%s.%s",
              prefix, name, key[i]);
  return rc;
}

/* Gemma 4's vision tower and its embedder, named as transformers saves
 * Gemma4ForConditionalGeneration (modeling_gemma4.py: Gemma4VisionModel under
 * model.vision_tower., Gemma4MultimodalEmbedder as model.embed_vision.):
 * patch_embedder.input_proj.weight [Dv, 3 p^2] and
 * patch_embedder.position_embedding_table [2, pos, Dv]; per layer
 * encoder.layers.N.self_attn.{q,k,v,o}_proj.linear.weight (a
 * Gemma4ClippableLinear wraps each nn.Linear), self_attn.{q,k}_norm.weight
 * [head_dim], {input,post_attention,pre_feedforward,post_feedforward}_layernorm
 * .weight [Dv], mlp.{gate,up,down}_proj.linear.weight; with clipped linears
 * each projection's input_min, input_max, output_min, output_max (0-d
 * buffers); with standardize std_bias, std_scale [Dv]; and
 * model.embed_vision.embedding_projection.weight [H, Dv]. Clip bounds are
 * drawn near 1.5 to 3 so that some activations are clipped. */
static int add_vision_g4(struct tl_tiny_spec *s, const struct md_config *c) {
  const struct md_vision_g4_cfg *v = &c->vision_g4;
  int D = v->hidden, F = v->ffn, hd = v->head_dim, rc = 0, pp = 3 * v->patch * v->patch;
  int qd = v->n_heads * hd, kvd = v->n_kv_heads * hd;
  const char *VP = "model.vision_tower.";
  double norm_center = 1.0;
  rc |= LIN(D, pp, "%spatch_embedder.input_proj.weight", VP);
  rc |= add(s, TL_INIT_NORMAL, 0.5, 0, 3, 2, v->pos_size, D,
            "%spatch_embedder.position_embedding_table", VP);
  for (int i = 0; i < v->n_layers; i++) {
    char lp[128];
    snprintf(lp, sizeof(lp), "%sencoder.layers.%d.", VP, i);
    static const char *const lin[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                      "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                      "mlp.down_proj"};
    const int rows[] = {qd, kvd, kvd, D, F, F, D}, cols[] = {D, D, D, qd, D, D, F};
    rc |= NORM(D, "%sinput_layernorm.weight", lp);
    for (int j = 0; j < 7; j++) {
      rc |= LIN(rows[j], cols[j], "%s%s.linear.weight", lp, lin[j]);
      if (!v->clipped_linears) continue;
      rc |= add_bounds(s, lp, lin[j]);
    }
    rc |= NORM(hd, "%sself_attn.q_norm.weight", lp);
    rc |= NORM(hd, "%sself_attn.k_norm.weight", lp);
    rc |= NORM(D, "%spost_attention_layernorm.weight", lp);
    rc |= NORM(D, "%spre_feedforward_layernorm.weight", lp);
    rc |= NORM(D, "%spost_feedforward_layernorm.weight", lp);
  }
  if (v->standardize) {
    rc |= add(s, TL_INIT_NORMAL, 0.5, 0, 1, D, 0, 0, "%sstd_bias", VP);
    rc |= add(s, TL_INIT_UNIFORM, 0.5, 1.5, 1, D, 0, 0, "%sstd_scale", VP);
  }
  rc |= LIN(c->hidden, D, "model.embed_vision.embedding_projection.weight");
  return rc ? CM_ERR_NOMEM : 0;
}

/* Gemma 4's audio tower and its embedder, named as transformers saves
 * Gemma4ForConditionalGeneration (modeling_gemma4.py: Gemma4AudioModel under
 * model.audio_tower., Gemma4MultimodalEmbedder as model.embed_audio.):
 * subsample_conv_projection.layer{0,1}.conv.weight [C0, 1, 3, 3] and
 * [C1, C0, 3, 3], .layer{0,1}.norm.weight [C0] / [C1] (LayerNorm without
 * bias), .input_proj_linear.weight [Da, C0 / 4 * C1]; per layer
 * layers.N.feed_forward{1,2}.{ffw_layer_1 [4 Da, Da], ffw_layer_2 [Da, 4 Da]}
 * .linear.weight with .pre_layer_norm/.post_layer_norm.weight,
 * .self_attn.{q_proj,k_proj,v_proj,post}.linear.weight [Da, Da],
 * .self_attn.relative_k_proj.weight [Da, Da], .self_attn.per_dim_scale
 * [Da / heads], .lconv1d.linear_start.linear.weight [2 Da, Da],
 * .lconv1d.linear_end.linear.weight [Da, Da], .lconv1d.depthwise_conv1d.weight
 * [Da, 1, K], .lconv1d.{pre_layer_norm,conv_norm}.weight,
 * .norm_{pre_attn,post_attn,out}.weight [Da]; with clipped linears each
 * Gemma4ClippableLinear's four 0-d bounds; output_proj.weight [O, Da] and
 * .bias [O]; model.embed_audio.embedding_projection.weight [H, O]. Clip
 * bounds near 1.5 to 3, as the vision tower's, so that some values clip. */
static int add_audio_g4(struct tl_tiny_spec *s, const struct md_config *c) {
  const struct md_audio_g4_cfg *a = &c->audio_g4;
  int D = a->hidden, C0 = a->conv_ch[0], C1 = a->conv_ch[1], rc = 0;
  const char *AP = "model.audio_tower.";
  double norm_center = 1.0;
  rc |= add(s, TL_INIT_NORMAL, 1.0 / 3.0, 0, 4, C0, 1, 3,
            "%ssubsample_conv_projection.layer0.conv.weight", AP);
  if (!rc) s->tensors[s->n_tensors - 1].e.shape[3] = 3;
  rc |= NORM(C0, "%ssubsample_conv_projection.layer0.norm.weight", AP);
  rc |= add(s, TL_INIT_NORMAL, 1.0 / sqrt(9.0 * C0), 0, 4, C1, C0, 3,
            "%ssubsample_conv_projection.layer1.conv.weight", AP);
  if (!rc) s->tensors[s->n_tensors - 1].e.shape[3] = 3;
  rc |= NORM(C1, "%ssubsample_conv_projection.layer1.norm.weight", AP);
  rc |= LIN(D, C0 / 4 * C1, "%ssubsample_conv_projection.input_proj_linear.weight", AP);
  for (int i = 0; i < a->n_layers; i++) {
    char lp[128];
    snprintf(lp, sizeof(lp), "%slayers.%d.", AP, i);
    static const char *const lin[] = {"feed_forward1.ffw_layer_1", "feed_forward1.ffw_layer_2",
                                      "self_attn.q_proj",          "self_attn.k_proj",
                                      "self_attn.v_proj",          "self_attn.post",
                                      "lconv1d.linear_start",      "lconv1d.linear_end",
                                      "feed_forward2.ffw_layer_1", "feed_forward2.ffw_layer_2"};
    const int rows[] = {4 * D, D, D, D, D, D, 2 * D, D, 4 * D, D};
    const int cols[] = {D, 4 * D, D, D, D, D, D, D, D, 4 * D};
    for (int j = 0; j < 10; j++) {
      rc |= LIN(rows[j], cols[j], "%s%s.linear.weight", lp, lin[j]);
      if (!a->clipped_linears) continue;
      rc |= add_bounds(s, lp, lin[j]);
    }
    static const char *const norms[] = {"feed_forward1.pre_layer_norm",
                                        "feed_forward1.post_layer_norm",
                                        "feed_forward2.pre_layer_norm",
                                        "feed_forward2.post_layer_norm",
                                        "lconv1d.pre_layer_norm",
                                        "lconv1d.conv_norm",
                                        "norm_pre_attn",
                                        "norm_post_attn",
                                        "norm_out"};
    for (int j = 0; j < 9; j++)
      rc |= NORM(D, "%s%s.weight", lp, norms[j]);
    rc |= LIN(D, D, "%sself_attn.relative_k_proj.weight", lp);
    rc |= add(s, TL_INIT_NORMAL, 0.5, 0, 1, D / a->n_heads, 0, 0, "%sself_attn.per_dim_scale", lp);
    rc |= add(s, TL_INIT_NORMAL, 1.0 / sqrt((double)a->conv_kernel), 0, 3, D, 1, a->conv_kernel,
              "%slconv1d.depthwise_conv1d.weight", lp);
  }
  rc |= LIN(a->output_dims, D, "%soutput_proj.weight", AP);
  rc |= add(s, TL_INIT_NORMAL, 0.1, 0, 1, a->output_dims, 0, 0, "%soutput_proj.bias", AP);
  rc |= LIN(c->hidden, a->output_dims, "model.embed_audio.embedding_projection.weight");
  return rc ? CM_ERR_NOMEM : 0;
}

static json_t *int_list(const int *v, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++)
    json_array_append_new(a, json_integer(v[i]));
  return a;
}

static json_t *layer_types(const int *full, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++)
    json_array_append_new(a, json_string(full[i] ? "full_attention" : "sliding_attention"));
  return a;
}

/* What both generated Gemma text configs hold: the sizes, the attention
 * layout, the norm and activation, and the special token ids. Each family
 * adds its own keys after these. */
static json_t *text_config(const char *model_type, int V, int H, int F, int L, int nh, int nkv,
                           int hd, int window, const int *full, int max_pos) {
  json_t *t = json_object();
  json_object_set_new(t, "model_type", json_string(model_type));
  json_object_set_new(t, "vocab_size", json_integer(V));
  json_object_set_new(t, "hidden_size", json_integer(H));
  json_object_set_new(t, "intermediate_size", json_integer(F));
  json_object_set_new(t, "num_hidden_layers", json_integer(L));
  json_object_set_new(t, "num_attention_heads", json_integer(nh));
  json_object_set_new(t, "num_key_value_heads", json_integer(nkv));
  json_object_set_new(t, "head_dim", json_integer(hd));
  json_object_set_new(t, "sliding_window", json_integer(window));
  json_object_set_new(t, "layer_types", layer_types(full, L));
  json_object_set_new(t, "max_position_embeddings", json_integer(max_pos));
  json_object_set_new(t, "rms_norm_eps", json_real(1e-6));
  json_object_set_new(t, "hidden_activation", json_string("gelu_pytorch_tanh"));
  json_object_set_new(t, "tie_word_embeddings", json_true());
  json_object_set_new(t, "pad_token_id", json_integer(0));
  json_object_set_new(t, "bos_token_id", json_integer(2));
  json_object_set_new(t, "eos_token_id", int_list((const int[]){1, 106}, V > 106 ? 2 : 1));
  return t;
}

static json_t *gemma4_text_config(int V, int H, int F, int L, int nh, int nkv, int hd, int ghd,
                                  int ngkv, int kev, int window, const int *full, int shared,
                                  int dwide, int ple, int moe) {
  json_t *t = text_config("gemma4_text", V, H, F, L, nh, nkv, hd, window, full, 8192);
  json_t *rope = json_pack("{s:{s:s,s:f},s:{s:s,s:f,s:f}}", "sliding_attention", "rope_type",
                           "default", "rope_theta", 10000.0, "full_attention", "rope_type",
                           "proportional", "partial_rotary_factor", 0.25, "rope_theta", 1000000.0);
  /* global (full-attention) layers, shared KV, per-layer inputs, experts */
  json_object_update_new(
      t, json_pack("{s:i, s:o, s:b, s:i, s:b, s:i, s:i, s:b, s:o, s:o, s:o, s:f, s:b, s:o}",
                   "global_head_dim", ghd, "num_global_key_value_heads",
                   ngkv ? json_integer(ngkv) : json_null(), "attention_k_eq_v", kev,
                   "num_kv_shared_layers", shared, "use_double_wide_mlp", dwide,
                   "hidden_size_per_layer_input", ple, "vocab_size_per_layer_input", ple ? V : 0,
                   "enable_moe_block", moe, "num_experts", moe ? json_integer(4) : json_null(),
                   "top_k_experts", moe ? json_integer(2) : json_null(), "moe_intermediate_size",
                   moe ? json_integer(32) : json_null(), "final_logit_softcapping", 30.0,
                   "attention_bias", 0, "rope_parameters", rope));
  return t;
}

/* Centroids of a generated assistant's ordered embedding for a vocabulary
 * (1: none). */
static int n_centroids(int vocab) {
  int C = vocab % 2048 == 0 && vocab >= 2048 * 128 ? 2048 : 0;
  if (!C)
    for (C = 64; C > 1 && vocab % C; C /= 2) {
    }
  return C;
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

/* The rigged pair (tl_tiny_spec_assistant_agreeing): rewrites initialisers. */
static void rig_tensors(struct tl_tiny_spec *s, const struct md_config *c) {
  int per = c->vocab / n_centroids(c->vocab);
  for (int i = 0; i < s->n_tensors; i++) {
    struct tl_tensor_spec *t = &s->tensors[i];
    if (ends_with(t->name, "post_attention_layernorm.weight") ||
        ends_with(t->name, "post_feedforward_layernorm.weight") ||
        ends_with(t->name, "post_per_layer_input_norm.weight")) {
      t->init = TL_INIT_AROUND;
      t->a = 0;
      t->b = s->rig == 1 ? s->rig_leak : 0;
    } else if (!strcmp(t->name, "model.embed_tokens.weight")) {
      t->init = TL_INIT_CLUSTERED;
      t->a = 0.5 / sqrt(2.0 * (double)t->e.shape[1]);
      t->per = per;
    } else if (s->rig == 2 && !strcmp(t->name, "pre_projection.weight")) {
      t->init = TL_INIT_EYE;
    } else if (s->rig == 2 && !strcmp(t->name, "masked_embedding.centroids.weight")) {
      t->init = TL_INIT_CENTROIDS;
      t->a = 1.0 / sqrt((double)t->e.shape[1]);
      t->per = per;
    } else if (s->rig == 2 && !strcmp(t->name, "masked_embedding.token_ordering")) {
      t->init = TL_INIT_ARANGE;
    }
  }
}

/* Parses our own config text back so that tensor shapes follow the exact
 * per-layer plan the loader will derive. */
static int finish(struct tl_tiny_spec *s, json_t *root, char *err, size_t errlen) {
  s->config_json = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  json_decref(root);
  if (!s->config_json) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  struct md_config *c = malloc(sizeof(*c));
  if (!c) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  int rc = md_config_parse(s->config_json, strlen(s->config_json), c, err, errlen);
  if (!rc) {
    snprintf(s->model_type, sizeof(s->model_type), "%s", c->model_type);
    s->vocab = c->vocab;
    int mm = c->vision.present || c->vision_g4.present || c->audio_g4.present;
    rc = add_stack(s, c, c->vocab, mm ? "model.language_model." : "model.");
    if (!rc && c->vision.present) rc = add_vision(s, c);
    if (!rc && c->vision_g4.present) rc = add_vision_g4(s, c);
    if (!rc && c->audio_g4.present) rc = add_audio_g4(s, c);
    if (!rc && c->arch == MD_ARCH_GEMMA4_ASSISTANT) {
      int h = c->hidden, B = c->backbone_hidden;
      rc |= add(s, TL_INIT_NORMAL, 1.0 / sqrt(2.0 * B), 0, 2, h, 2 * B, 0, "pre_projection.weight");
      rc |= add(s, TL_INIT_NORMAL, 1.0 / sqrt((double)h), 0, 2, B, h, 0, "post_projection.weight");
      if (c->use_ordered_embeddings) {
        rc |= add(s, TL_INIT_NORMAL, 1.0 / sqrt((double)h), 0, 2, c->num_centroids, h, 0,
                  "masked_embedding.centroids.weight");
        rc |=
            add(s, TL_INIT_PERMUTATION, 0, 0, 1, c->vocab, 0, 0, "masked_embedding.token_ordering");
      }
      if (rc) rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
    }
    if (!rc && s->rig) rig_tensors(s, c);
  }
  char gen[128];
  int n = c->n_eos;
  if (!rc) {
    int len =
        snprintf(gen, sizeof(gen), "{\n  \"bos_token_id\": %d,\n  \"eos_token_id\": [", c->bos_id);
    for (int i = 0; i < n; i++)
      len += snprintf(gen + len, sizeof(gen) - (size_t)len, "%s%d", i ? ", " : "", c->eos_ids[i]);
    snprintf(gen + len, sizeof(gen) - (size_t)len, "]\n}\n");
    s->generation_json = strdup(gen);
    if (!s->generation_json) rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  }
  free(c);
  return rc;
}

/* Turns a gemma3_text config into a Gemma3ForConditionalGeneration one: the
 * text settings move under text_config, the SigLIP tower's under
 * vision_config, the image token ids and soft tokens per image go to the top
 * level (as transformers' Gemma3Config saves them); also writes the
 * preprocessor config. The real tokenizer's ids when the vocabulary holds
 * them, else the last three ids. `siglip400m`: the tower of Gemma 3 4B-27B
 * (SigLIP-So400m: 896 px images, 14 px patches, 27 layers of width 1152,
 * 256 soft tokens), else a small one (64 px, 8 px patches, 2 layers of 32,
 * 16 soft tokens). */
static int wrap_vision(struct tl_tiny_spec *s, json_t **root, int V, int siglip400m) {
  const int IMAGE = siglip400m ? 896 : 64, PATCH = siglip400m ? 14 : 8;
  const int TOKENS = siglip400m ? 256 : 16, VH = siglip400m ? 1152 : 32;
  const int VF = siglip400m ? 4304 : 96, VL = siglip400m ? 27 : 2, VNH = siglip400m ? 16 : 4;
  json_t *text = *root;
  json_object_del(text, "architectures");
  int boi = 255999, eoi = 256000, img = 262144;
  if (V <= img) boi = V - 3, eoi = V - 2, img = V - 1;
  json_t *vision =
      json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:s, s:f, s:b}", "model_type",
                "siglip_vision_model", "hidden_size", VH, "intermediate_size", VF,
                "num_hidden_layers", VL, "num_attention_heads", VNH, "num_channels", 3,
                "image_size", IMAGE, "patch_size", PATCH, "layer_norm_eps", 1e-6, "hidden_act",
                "gelu_pytorch_tanh", "attention_dropout", 0.0, "vision_use_head", 0);
  json_t *r = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:[i,i], s:b, s:o, s:o}", "architectures",
                        "Gemma3ForConditionalGeneration", "model_type", "gemma3",
                        "mm_tokens_per_image", TOKENS, "boi_token_index", boi, "eoi_token_index",
                        eoi, "image_token_index", img, "eos_token_id", 1, 106,
                        "tie_word_embeddings", 1, "text_config", text, "vision_config", vision);
  if (!r) return CM_ERR_NOMEM;
  *root = r;
  json_t *pre = json_pack(
      "{s:n, s:b, s:n, s:b, s:b, s:[f,f,f], s:s, s:i, s:[f,f,f], s:s, s:i, s:f, s:{s:i, s:i}}",
      "do_convert_rgb", "do_normalize", 1, "do_pan_and_scan", "do_rescale", 1, "do_resize", 1,
      "image_mean", 0.5, 0.5, 0.5, "image_processor_type", "Gemma3ImageProcessor",
      "image_seq_length", TOKENS, "image_std", 0.5, 0.5, 0.5, "processor_class", "Gemma3Processor",
      "resample", 2, "rescale_factor", 1.0 / 255.0, "size", "height", IMAGE, "width", IMAGE);
  s->preproc_json = pre ? json_dumps(pre, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
  json_decref(pre);
  return s->preproc_json ? 0 : CM_ERR_NOMEM;
}

/* Turns a gemma4_text config into a Gemma4ForConditionalGeneration one
 * (transformers' Gemma4Config): the text settings under text_config, the
 * tower's under vision_config (Gemma4VisionConfig's fields), the image token
 * ids at the top level; also writes processor_config.json with its
 * image_processor (Gemma4ImageProcessor's fields, which md-config.c reads).
 * The ids are Gemma4Config's defaults when the vocabulary holds them, else
 * its last three. `e2b`: Gemma 4 E2B's tower (16 layers of 768, 12 heads of
 * 64, MLP 3072, clipped linears); else a small one (2 layers of 32, 4 heads
 * of 16 over 2 KV heads, MLP 64) with clipped linears and standardisation,
 * so that every path of the tower counts. */
static int wrap_vision_g4(struct tl_tiny_spec *s, json_t **root, int V, int e2b, int bidir) {
  const int VH = e2b ? 768 : 32, VF = e2b ? 3072 : 64, VL = e2b ? 16 : 2;
  const int VNH = e2b ? 12 : 4, VKV = e2b ? 12 : 2, VHD = e2b ? 64 : 16;
  json_t *text = *root;
  json_object_del(text, "architectures");
  if (bidir) json_object_set_new(text, "use_bidirectional_attention", json_string("vision"));
  int boi = 255999, eoi = 258882, img = 258880;
  if (V <= eoi) boi = V - 3, eoi = V - 2, img = V - 1;
  json_t *vision = json_pack(
      "{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:f, s:i, s:i, s:i, s:i, s:{s:s, s:f}, s:b, "
      "s:b, s:b, s:f}",
      "model_type", "gemma4_vision", "hidden_size", VH, "intermediate_size", VF,
      "num_hidden_layers", VL, "num_attention_heads", VNH, "num_key_value_heads", VKV, "head_dim",
      VHD, "hidden_activation", "gelu_pytorch_tanh", "rms_norm_eps", 1e-6, "patch_size", 16,
      "pooling_kernel_size", 3, "position_embedding_size", 10240, "default_output_length", 280,
      "rope_parameters", "rope_type", "default", "rope_theta", 100.0, "use_clipped_linears", 1,
      "standardize", !e2b, "attention_bias", 0, "attention_dropout", 0.0);
  json_t *r = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:n, s:b, s:o, s:o}", "architectures",
                        "Gemma4ForConditionalGeneration", "model_type", "gemma4", "boi_token_id",
                        boi, "eoi_token_id", eoi, "image_token_id", img, "audio_config",
                        "tie_word_embeddings", 1, "text_config", text, "vision_config", vision);
  if (!r) return CM_ERR_NOMEM;
  *root = r;
  json_t *pre =
      json_pack("{s:s, s:{s:s, s:b, s:b, s:f, s:b, s:b, s:i, s:i, s:i, s:i}, s:i}",
                "processor_class", "Gemma4Processor", "image_processor", "image_processor_type",
                "Gemma4ImageProcessor", "do_resize", 1, "do_rescale", 1, "rescale_factor",
                1.0 / 255.0, "do_normalize", 0, "do_convert_rgb", 1, "resample", 3, "patch_size",
                16, "pooling_kernel_size", 3, "max_soft_tokens", 280, "image_seq_length", 280);
  s->preproc_json = pre ? json_dumps(pre, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
  s->preproc_nested = 1;
  json_decref(pre);
  return s->preproc_json ? 0 : CM_ERR_NOMEM;
}

/* Adds Gemma 4's audio tower to a gemma4 config (a text one first becomes a
 * Gemma4ForConditionalGeneration one, as wrap_vision_g4 makes it): its
 * audio_config (Gemma4AudioConfig's fields), the audio token ids at the top
 * level, and the feature extractor's fields (Gemma4AudioFeatureExtractor's,
 * which md_audio_fe_parse reads) in processor_config.json's
 * "feature_extractor", next to the image processor when there is one. The ids
 * are Gemma4Config's defaults when the vocabulary holds them, else the three
 * before the image markers' (the last three). `e2b`: E2B's tower
 * (Gemma4AudioConfig's defaults: 12 layers of 1024, 8 heads, output 1536,
 * 128 mel bins); else a small one (2
 * layers of 32, 4 heads of 8, chunks of 4, context left 5 and right 2 (a
 * key one frame ahead), 16 mel bins, channels [16, 8], a gradient clip of
 * 1.25 (inside the clip bounds, so that it bites after a clipped linear too),
 * rms_norm_eps 1e-2 apart from the norms' fixed 1e-6) so that every path
 * counts, the clamps and the two epsilons included. `defaults`: the small
 * tower's sizes with the rest Gemma4AudioConfig's and the extractor's
 * defaults (128 mel bins, channels [128, 32]), as an mmproj file holds it. */
static int wrap_audio_g4(struct tl_tiny_spec *s, json_t **root, int V, int e2b, int defaults) {
  json_t *r = *root;
  if (strcmp(json_string_value(json_object_get(r, "model_type")), "gemma4")) {
    json_object_del(r, "architectures");
    r = json_pack("{s:[s], s:s, s:n, s:b, s:o}", "architectures", "Gemma4ForConditionalGeneration",
                  "model_type", "gemma4", "vision_config", "tie_word_embeddings", 1, "text_config",
                  r);
    if (!r) return CM_ERR_NOMEM;
    *root = r;
  }
  int boa = 256000, audio = 258881, eoa = 258883;
  if (V <= eoa) boa = V - 6, audio = V - 5, eoa = V - 4;
  json_t *ac =
      e2b ? json_pack("{s:s}", "model_type", "gemma4_audio")
      : defaults
          ? json_pack("{s:s, s:i, s:i, s:i, s:i}", "model_type", "gemma4_audio", "hidden_size", 32,
                      "num_hidden_layers", 2, "num_attention_heads", 4, "output_proj_dims", 48)
          : json_pack("{s:s, s:i, s:i, s:i, s:s, s:[i,i], s:i, s:f, s:i, s:i, s:i, s:f, s:f, s:b, "
                      "s:f, s:f, s:i}",
                      "model_type", "gemma4_audio", "hidden_size", 32, "num_hidden_layers", 2,
                      "num_attention_heads", 4, "hidden_act", "silu", "subsampling_conv_channels",
                      16, 8, "conv_kernel_size", 5, "residual_weight", 0.5, "attention_chunk_size",
                      4, "attention_context_left", 5, "attention_context_right", 2,
                      "attention_logit_cap", 50.0, "attention_invalid_logits_value", -1e9,
                      "use_clipped_linears", 1, "rms_norm_eps", 1e-2, "gradient_clipping", 1.25,
                      "output_proj_dims", 48);
  if (!ac) return CM_ERR_NOMEM;
  json_object_set_new(r, "audio_config", ac);
  json_object_set_new(r, "audio_token_id", json_integer(audio));
  json_object_set_new(r, "boa_token_id", json_integer(boa));
  json_object_set_new(r, "eoa_token_index", json_integer(eoa));
  json_t *pre = s->preproc_json ? json_loads(s->preproc_json, 0, NULL)
                                : json_pack("{s:s}", "processor_class", "Gemma4Processor");
  json_t *fe = json_pack("{s:s, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:b, s:f, s:i}",
                         "feature_extractor_type", "Gemma4AudioFeatureExtractor", "feature_size",
                         e2b || defaults ? 128 : 16, "sampling_rate", 16000, "frame_length_ms",
                         20.0, "hop_length_ms", 10.0, "min_frequency", 0.0, "max_frequency", 8000.0,
                         "preemphasis", 0.0, "mel_floor", 1e-3, "dither", 0.0, "fft_overdrive", 0,
                         "input_scale_factor", 1.0, "padding_value", 0);
  if (!pre || !fe) {
    json_decref(pre);
    json_decref(fe);
    return CM_ERR_NOMEM;
  }
  json_object_set_new(pre, "feature_extractor", fe);
  json_object_set_new(pre, "audio_seq_length", json_integer(750));
  free(s->preproc_json);
  s->preproc_json = json_dumps(pre, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  s->preproc_nested = 1;
  json_decref(pre);
  return s->preproc_json ? 0 : CM_ERR_NOMEM;
}

int tl_tiny_spec_build(struct tl_tiny_spec *s, const struct tl_tiny_opts *o, char *err,
                       size_t errlen) {
  memset(s, 0, sizeof(*s));
  int V = o->vocab;
  json_t *root;
  if (!strcmp(o->arch, "gemma4")) {
    if (!strcmp(o->preset, "tiny")) {
      /* 6 layers: sliding, sliding, full, sliding | shared sliding, shared full */
      static const int full[6] = {0, 0, 1, 0, 0, 1};
      root = gemma4_text_config(V, 64, 128, 6, 4, 2, 32, 64, 1, 1,
                                o->sliding_window ? o->sliding_window : 64, full, 2, 1, 8, o->moe);
    } else if (!strcmp(o->preset, "tiny-e")) {
      /* E2B's features in llama.cpp's layout: 6 layers, sliding x3, full | shared
       * sliding, shared full (the last storing layers are sliding then full, which is
       * where llama.cpp's gemma4 lets shared layers read); per-layer inputs of 16
       * (a scale of 4, exact in bf16) */
      static const int full[6] = {0, 0, 0, 1, 0, 1};
      root = gemma4_text_config(V, 64, 128, 6, 4, 2, 32, 64, 1, 1,
                                o->sliding_window ? o->sliding_window : 64, full, 2, 1, 16, o->moe);
    } else if (!strcmp(o->preset, "tiny-dense")) {
      /* the larger models' features: no per-layer inputs, no KV sharing, a V
       * projection on every layer, no final softcap */
      static const int full[6] = {0, 0, 1, 0, 0, 1};
      root = gemma4_text_config(V, 64, 128, 6, 4, 2, 32, 64, 0, 0,
                                o->sliding_window ? o->sliding_window : 64, full, 0, 0, 0, o->moe);
      json_object_del(root, "final_logit_softcapping");
    } else if (!strcmp(o->preset, "tiny-large")) {
      /* the 26B's and 31B's attention: K as V on full layers (their own KV head count,
       * a head dim twice the sliding one), no per-layer inputs, no KV sharing */
      static const int full[6] = {0, 0, 1, 0, 0, 1};
      root = gemma4_text_config(V, 64, 128, 6, 4, 2, 32, 64, 1, 1,
                                o->sliding_window ? o->sliding_window : 64, full, 0, 0, 0, o->moe);
    } else if (!strcmp(o->preset, "e2b")) {
      /* Gemma 4 E2B's text shape: 35 layers, full every fifth, the last 20 KV-shared */
      int full[35];
      for (int i = 0; i < 35; i++)
        full[i] = i % 5 == 4;
      root =
          gemma4_text_config(V, 1536, 6144, 35, 8, 1, 256, 512, 0, 0,
                             o->sliding_window ? o->sliding_window : 512, full, 20, 1, 256, o->moe);
    } else {
      return cm_fail(
          err, errlen, CM_ERR_INVAL,
          "preset \"%s\" is not known for gemma4 (tiny, tiny-e, tiny-dense, tiny-large, e2b)",
          o->preset);
    }
    json_object_set_new(root, "architectures", json_pack("[s]", "Gemma4ForCausalLM"));
    if (o->moe && o->moe_ffn)
      json_object_set_new(root, "moe_intermediate_size", json_integer(o->moe_ffn));
    s->rig = o->echo ? 1 : 0;
    s->rig_leak = o->echo_leak;
    s->router_gain = o->router_gain;
    int rc = 0;
    if (o->vision) rc = wrap_vision_g4(s, &root, V, !strcmp(o->preset, "e2b"), o->bidir_vision);
    if (!rc && o->audio) rc = wrap_audio_g4(s, &root, V, o->audio_e2b, o->audio_defaults);
    if (rc) {
      json_decref(root);
      tl_tiny_spec_free(s);
      return cm_fail(err, errlen, rc, "out of memory");
    }
  } else if (!strcmp(o->arch, "gemma3")) {
    int H, F, L, nh, nkv, hd, win, pattern;
    if (!strcmp(o->preset, "tiny")) {
      H = 64, F = 128, L = 6, nh = 4, nkv = 2, hd = 32, win = 64, pattern = 3;
    } else if (!strcmp(o->preset, "k256")) { /* tiny, every matrix's rows whole 256-blocks */
      H = 256, F = 512, L = 6, nh = 8, nkv = 2, hd = 64, win = 64, pattern = 3;
    } else if (!strcmp(o->preset, "270m")) {
      H = 640, F = 2048, L = 18, nh = 4, nkv = 1, hd = 256, win = 512, pattern = 6;
    } else if (!strcmp(o->preset, "1b")) {
      H = 1152, F = 6912, L = 26, nh = 4, nkv = 1, hd = 256, win = 512, pattern = 6;
    } else if (!strcmp(o->preset, "4b")) { /* gemma-3-4b's language model */
      H = 2560, F = 10240, L = 34, nh = 8, nkv = 4, hd = 256, win = 1024, pattern = 6;
    } else {
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "preset \"%s\" is not known for gemma3 (tiny, k256, 270m, 1b, 4b)", o->preset);
    }
    if (o->sliding_window) win = o->sliding_window;
    if (o->ffn) F = o->ffn;
    int full[MD_MAX_LAYERS];
    for (int i = 0; i < L; i++)
      full[i] = (i + 1) % pattern == 0;
    if (o->vision && V == 262144) V = 262208;
    root = text_config("gemma3_text", V, H, F, L, nh, nkv, hd, win, full, 32768);
    json_object_update_new(
        root, json_pack("{s:[s], s:i, s:i, s:f, s:f, s:n, s:n, s:n}", "architectures",
                        "Gemma3ForCausalLM", "query_pre_attn_scalar", hd, "sliding_window_pattern",
                        pattern, "rope_theta", 1000000.0, "rope_local_base_freq", 10000.0,
                        "rope_scaling", "final_logit_softcapping", "attn_logit_softcapping"));
    if (o->vision) {
      int rc = wrap_vision(s, &root, V, !strcmp(o->preset, "270m"));
      if (rc) {
        json_decref(root);
        tl_tiny_spec_free(s);
        return cm_fail(err, errlen, rc, "out of memory");
      }
    }
  } else {
    return cm_fail(err, errlen, CM_ERR_INVAL, "unknown arch \"%s\"", o->arch);
  }
  int rc = finish(s, root, err, errlen);
  if (rc) tl_tiny_spec_free(s);
  return rc;
}

static int assistant(struct tl_tiny_spec *s, const struct md_config *t, int agree, char *err,
                     size_t errlen) {
  memset(s, 0, sizeof(*s));
  if (t->arch != MD_ARCH_GEMMA4)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "the target must be a gemma4 model (got model_type \"%s\")", t->model_type);
  int sl = md_config_last_storing_layer(t, MD_LAYER_SLIDING);
  int fl = md_config_last_storing_layer(t, MD_LAYER_FULL);
  if (sl < 0 || fl < 0)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "the target needs a storing sliding and a storing full layer");
  static const int full[4] = {0, 0, 0, 1};
  int h = agree ? t->hidden : 32, nh = 4;
  int kvh = t->layers[sl].n_kv_heads, gkvh = t->layers[fl].n_kv_heads;
  if (nh % kvh || nh % gkvh) nh = kvh * gkvh;
  json_t *text =
      gemma4_text_config(t->vocab, h, 64, 4, nh, kvh, t->head_dim, t->global_head_dim,
                         t->k_eq_v ? gkvh : 0, t->k_eq_v, t->sliding_window, full, 4, 0, 0, 0);
  json_object_set_new(text, "final_logit_softcapping", json_null());
  json_t *root = json_object();
  json_object_set_new(root, "architectures", json_pack("[s]", "Gemma4AssistantForCausalLM"));
  json_object_set_new(root, "model_type", json_string("gemma4_assistant"));
  json_object_set_new(root, "backbone_hidden_size", json_integer(t->hidden));
  int C = n_centroids(t->vocab);
  json_object_set_new(root, "use_ordered_embeddings", json_boolean(C > 1));
  json_object_set_new(root, "num_centroids", json_integer(C > 1 ? C : 2048));
  json_object_set_new(root, "centroid_intermediate_top_k", json_integer(C >= 32 ? 32 : 1));
  json_object_set_new(root, "tie_word_embeddings", json_true());
  json_object_set_new(root, "text_config", text);
  s->rig = agree ? 2 : 0;
  int rc = finish(s, root, err, errlen);
  if (rc) tl_tiny_spec_free(s);
  return rc;
}

int tl_tiny_spec_assistant(struct tl_tiny_spec *s, const struct md_config *t, char *err,
                           size_t errlen) {
  return assistant(s, t, 0, err, errlen);
}

int tl_tiny_spec_assistant_agreeing(struct tl_tiny_spec *s, const struct md_config *t, char *err,
                                    size_t errlen) {
  return assistant(s, t, 1, err, errlen);
}

/* ---- writer: deterministic random numbers (splitmix64 + Box-Muller) ------- */

struct rng {
  uint64_t s;
};

static uint64_t rng_next(struct rng *r) {
  return cm_splitmix64(&r->s);
}

static double rng_unit(struct rng *r) { /* (0, 1) */
  return ((double)(rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double rng_normal(struct rng *r) {
  double u = rng_unit(r), v = rng_unit(r);
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* bytes at *off of fd, *off advanced; 0 or CM_ERR_IO */
static int put(int fd, const void *buf, size_t bytes, off_t *off) {
  const char *p = buf;
  while (bytes) {
    ssize_t w = pwrite(fd, p, bytes, *off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return CM_ERR_IO;
    p += w;
    bytes -= (size_t)w;
    *off += w;
  }
  return 0;
}

/* Fills and writes one tensor at offset off of fd in chunks (no whole-tensor
 * buffer). Its values come from its own streams (seed, index): tensors can be
 * written in any order, by any thread. */
static int write_tensor(int fd, off_t off, const struct tl_tensor_spec *t, uint64_t seed, int index,
                        enum md_st_dtype dt, uint16_t *buf16, float *buf32, size_t chunk) {
  struct rng r = {seed * 0x100000001b3ull + (uint64_t)index * 0x9e3779b97f4a7c15ull + 1};
  uint64_t n = 1;
  for (int d = 0; d < t->e.ndim; d++)
    n *= (uint64_t)t->e.shape[d];
  if (t->init == TL_INIT_PERMUTATION) {
    int64_t *p = malloc(sizeof(int64_t) * (n ? n : 1));
    if (!p) return CM_ERR_NOMEM;
    for (uint64_t i = 0; i < n; i++)
      p[i] = (int64_t)i;
    for (uint64_t i = n; i > 1; i--) { /* Fisher-Yates */
      uint64_t j = rng_next(&r) % i;
      int64_t tmp = p[i - 1];
      p[i - 1] = p[j];
      p[j] = tmp;
    }
    int rc = put(fd, p, sizeof(int64_t) * n, &off);
    free(p);
    return rc;
  }
  if (t->init == TL_INIT_ARANGE) {
    for (uint64_t i = 0; i < n; i++) {
      int64_t v = (int64_t)i;
      if (put(fd, &v, sizeof(v), &off)) return CM_ERR_IO;
    }
    return 0;
  }
  size_t esz = md_st_dtype_size(dt);
  /* clustered rows: u from a stream per cluster, r from a stream per row,
   * both fixed whatever the seed (the target and its agreeing assistant
   * write the same values) */
  uint64_t cols = t->e.ndim == 2 ? (uint64_t)t->e.shape[1] : 1;
  struct rng ru = {0}, rr = {0};
  for (uint64_t done = 0; done < n;) {
    size_t m = (size_t)CM_MIN(n - done, (uint64_t)chunk);
    for (size_t i = 0; i < m; i++) {
      double v;
      uint64_t row = (done + i) / cols, col = (done + i) % cols;
      if (col == 0) {
        uint64_t cl =
            t->init == TL_INIT_CLUSTERED ? row / (uint64_t)(t->per > 0 ? t->per : 1) : row;
        ru.s = 0x5eed0c105e7ull ^ (cl * 0x9e3779b97f4a7c15ull);
        rr.s = 0x5eed0a0e5ull ^ (row * 0xd1b54a32d192ed03ull);
      }
      switch (t->init) {
      case TL_INIT_NORMAL: v = rng_normal(&r) * t->a; break;
      case TL_INIT_AROUND: v = t->b + rng_normal(&r) * t->a; break;
      case TL_INIT_CLUSTERED: v = t->a * (rng_normal(&ru) + rng_normal(&rr)); break;
      case TL_INIT_CENTROIDS: v = t->a * rng_normal(&ru); break;
      case TL_INIT_EYE: v = row == col ? 1.0 : 0.0; break;
      default: v = t->a + (t->b - t->a) * rng_unit(&r); break; /* TL_INIT_UNIFORM */
      }
      if (dt == MD_ST_F32)
        buf32[i] = (float)v;
      else if (dt == MD_ST_F16)
        buf16[i] = kn_f32_to_f16((float)v);
      else
        buf16[i] = kn_f32_to_bf16((float)v);
    }
    const void *src = dt == MD_ST_F32 ? (const void *)buf32 : (const void *)buf16;
    if (put(fd, src, esz * m, &off)) return CM_ERR_IO;
    done += m;
  }
  return 0;
}

static int write_text(const char *dir, const char *name, const char *text) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) return CM_ERR_IO;
  size_t n = strlen(text);
  int rc = fwrite(text, 1, n, f) == n ? 0 : CM_ERR_IO;
  if (fclose(f)) rc = CM_ERR_IO;
  return rc;
}

/* The tensors, written by threads that each take the next unwritten one (the
 * biggest first, so the last to finish is not a big one started late). */
struct tiny_job {
  const struct tl_tiny_spec *s;
  const struct md_st_entry *e;
  const off_t *at;
  const int *order;
  uint64_t seed;
  int fd;
  atomic_int next, rc;
};

enum { TINY_CHUNK = 1 << 16 };

/* tensor i's bytes: from its offset to the next one's (the end, pos, for the last) */
static off_t tensor_bytes(const off_t *at, int i, int n, off_t pos) {
  return (i + 1 < n ? at[i + 1] : pos) - at[i];
}

static void *tiny_thread(void *arg) {
  struct tiny_job *j = arg;
  uint16_t *b16 = malloc(TINY_CHUNK * sizeof(uint16_t));
  float *b32 = malloc(TINY_CHUNK * sizeof(float));
  if (!b16 || !b32) atomic_store(&j->rc, CM_ERR_NOMEM);
  for (int k; !atomic_load(&j->rc) && (k = atomic_fetch_add(&j->next, 1)) < j->s->n_tensors;) {
    int i = j->order[k];
    int rc = write_tensor(j->fd, j->at[i], &j->s->tensors[i], j->seed, i, j->e[i].dtype, b16, b32,
                          TINY_CHUNK);
    if (rc) atomic_store(&j->rc, rc);
  }
  free(b16);
  free(b32);
  return NULL;
}

int tl_tiny_write(const struct tl_tiny_spec *s, const char *dir, uint64_t seed,
                  enum md_st_dtype dt) {
  if (dt != MD_ST_F32 && dt != MD_ST_F16 && dt != MD_ST_BF16) return CM_ERR_INVAL;
  int rc = write_text(dir, "config.json", s->config_json);
  if (!rc && s->generation_json) rc = write_text(dir, "generation_config.json", s->generation_json);
  if (!rc && s->preproc_json)
    rc = write_text(dir, s->preproc_nested ? "processor_config.json" : "preprocessor_config.json",
                    s->preproc_json);
  if (rc) return rc;
  char path[4096];
  snprintf(path, sizeof(path), "%s/model.safetensors", dir);
  FILE *f = fopen(path, "wb");
  if (!f) return CM_ERR_IO;
  int n = s->n_tensors;
  size_t n_alloc = n > 0 ? (size_t)n : 1;
  struct md_st_entry *e = calloc(n_alloc, sizeof(*e));
  off_t *at = calloc(n_alloc, sizeof(*at));
  int *order = calloc(n_alloc, sizeof(*order));
  rc = e && at && order ? 0 : CM_ERR_NOMEM;
  for (int i = 0; i < n && !rc; i++) {
    e[i] = s->tensors[i].e;
    e[i].name = s->tensors[i].name;
    if (s->tensors[i].init != TL_INIT_PERMUTATION && s->tensors[i].init != TL_INIT_ARANGE)
      e[i].dtype = dt;
  }
  if (!rc) rc = md_st_write_header(f, e, n);
  if (!rc && fflush(f)) rc = CM_ERR_IO;
  /* the data follow the header, tensor after tensor in table order */
  off_t pos = rc ? 0 : ftello(f);
  if (pos < 0) rc = CM_ERR_IO;
  for (int i = 0; i < n && !rc; i++) {
    uint64_t elems = 1;
    for (int d = 0; d < e[i].ndim; d++)
      elems *= (uint64_t)e[i].shape[d];
    at[i] = pos;
    pos += (off_t)(elems * (uint64_t)md_st_dtype_size(e[i].dtype));
    order[i] = i;
  }
  for (int i = 1; i < n && !rc; i++) /* by size, biggest first (insertion sort) */
    for (int k = i;
         k > 0 && tensor_bytes(at, order[k], n, pos) > tensor_bytes(at, order[k - 1], n, pos);
         k--) {
      int t = order[k];
      order[k] = order[k - 1];
      order[k - 1] = t;
    }
  if (!rc) {
    struct tiny_job j = {.s = s, .e = e, .at = at, .order = order, .seed = seed, .fd = fileno(f)};
    atomic_init(&j.next, 0);
    atomic_init(&j.rc, 0);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = (int)CM_MIN(CM_MAX(cores, 1L), 32L);
    pthread_t th[32];
    int started = 0;
    while (started + 1 < nt && !pthread_create(&th[started], NULL, tiny_thread, &j))
      started++;
    tiny_thread(&j); /* this thread writes too */
    for (int i = 0; i < started; i++)
      pthread_join(th[i], NULL);
    rc = atomic_load(&j.rc);
  }
  free(e);
  free(at);
  free(order);
  if (fclose(f) && !rc) rc = CM_ERR_IO;
  return rc;
}
