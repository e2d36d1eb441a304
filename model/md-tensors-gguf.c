/* md-tensors-gguf.c — a GGUF file's tensors as the loader's directory: llama.cpp's
 * names for Gemma 3 and Gemma 4 (gguf-py's tensor_mapping.py, src/llama-arch.cpp)
 * mapped to the Hugging Face names the binder looks up,
 * dimensions turned outermost first, ggml types to the loader's dtypes (the
 * block formats among them; any other type listed as OTHER, refused by name
 * when bound). The tensors' bytes stay in the file's mapping, which the
 * directory owns. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "model/md-config.h"
#include "model/md-gguf.h"
#include "model/md-safetensors.h"

/* llama.cpp's per-layer tensor names (after "blk.N.") and ours (after
 * "model.layers.N."). */
static const char *const layer_names[][2] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
    /* Gemma 4: per-layer embeddings, the layer's output scale (a 1-element tensor) */
    {"inp_gate.weight", "per_layer_input_gate.weight"},
    {"proj.weight", "per_layer_projection.weight"},
    {"post_norm.weight", "post_per_layer_input_norm.weight"},
    {"layer_output_scale.weight", "layer_scalar"},
    /* Gemma 4 MoE (src/models/gemma4.cpp's load_arch_tensors; the converter,
       conversion/gemma.py's Gemma4Model, writes these as the checkpoint holds
       them: the experts' fused gate_up stack [E, 2I, H] with gate first) */
    {"ffn_gate_inp.weight", "router.proj.weight"},
    {"ffn_gate_inp.scale", "router.scale"},
    {"ffn_gate_up_exps.weight", "experts.gate_up_proj"},
    {"ffn_down_exps.weight", "experts.down_proj"},
    {"ffn_down_exps.scale", "router.per_expert_scale"},
    {"post_ffw_norm_1.weight", "post_feedforward_layernorm_1.weight"},
    {"pre_ffw_norm_2.weight", "pre_feedforward_layernorm_2.weight"},
    {"post_ffw_norm_2.weight", "post_feedforward_layernorm_2.weight"},
};

/* Names outside the layers (rope_freqs.weight, Gemma 4's proportional RoPE,
 * is read by the config, md-config-gguf.c, and left as it is). */
static const char *const top_names[][2] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
    {"per_layer_token_embd.weight", "model.embed_tokens_per_layer.weight"},
    {"per_layer_model_proj.weight", "model.per_layer_model_projection.weight"},
    {"per_layer_proj_norm.weight", "model.per_layer_projection_norm.weight"},
};

/* A Gemma 3 mmproj file's tensors (llama.cpp's converter, Gemma3VisionModel,
 * through gguf-py's tensor_mapping.py; tools/mtmd/clip.cpp reads them): the
 * SigLIP tower's after "v.blk.N." (ours after "vision_tower.vision_model.
 * encoder.layers.N."), then those outside the layers. The MLP's two matrices
 * are told apart by their shapes (mmproj_ffn), as clip.cpp does for files
 * whose converter swapped ffn_up and ffn_down. */
static const char *const vision_layer_names[][2] = {
    {"attn_q.", "self_attn.q_proj."}, {"attn_k.", "self_attn.k_proj."},
    {"attn_v.", "self_attn.v_proj."}, {"attn_out.", "self_attn.out_proj."},
    {"ln1.", "layer_norm1."},         {"ln2.", "layer_norm2."},
};

#define VISION_PREFIX "vision_tower.vision_model."
static const char *const vision_top_names[][2] = {
    {"v.patch_embd.weight", VISION_PREFIX "embeddings.patch_embedding.weight"},
    {"v.patch_embd.bias", VISION_PREFIX "embeddings.patch_embedding.bias"},
    {"v.position_embd.weight", VISION_PREFIX "embeddings.position_embedding.weight"},
    {"v.post_ln.weight", VISION_PREFIX "post_layernorm.weight"},
    {"v.post_ln.bias", VISION_PREFIX "post_layernorm.bias"},
    {"mm.input_projection.weight", "multi_modal_projector.mm_input_projection_weight"},
    {"mm.soft_emb_norm.weight", "multi_modal_projector.mm_soft_emb_norm.weight"},
};

/* v.blk.N.ffn_up / ffn_down (weight or bias) of tensor gt as SigLIP's fc1
 * (hidden -> ffn) or fc2 (ffn -> hidden) by its output rows: fc2's are the
 * tower's width D (clip.vision.embedding_length), fc1's the MLP's F
 * (feed_forward_length). Where F is D, or either is unknown, the name
 * decides as the current converter writes it (ffn_up: fc1). */
static void mmproj_ffn(const struct md_gguf_tensor *gt, int layer, const char *rest, int64_t D,
                       int64_t F, char *out, size_t n) {
  int up = !strncmp(rest, "ffn_up.", 7), bias = !!strstr(rest, ".bias");
  int64_t rows = gt->n_dims >= 2 ? (int64_t)gt->ne[1] : (int64_t)gt->ne[0];
  int fc2 = !up;
  if (D > 0 && F > 0 && D != F && (rows == D || rows == F)) fc2 = rows == D;
  snprintf(out, n, VISION_PREFIX "encoder.layers.%d.mlp.fc%d.%s", layer, fc2 ? 2 : 1,
           bias ? "bias" : "weight");
}

/* Our name for GGUF tensor gt (its own name when it has no other); D and F:
 * a vision tower's widths (mmproj_ffn), 0 in a model file. */
static void hf_name(const struct md_gguf_tensor *gt, int64_t D, int64_t F, char *out, size_t n) {
  const char *g = gt->name;
  for (size_t i = 0; i < sizeof(top_names) / sizeof(top_names[0]); i++)
    if (!strcmp(g, top_names[i][0])) {
      snprintf(out, n, "%s", top_names[i][1]);
      return;
    }
  for (size_t i = 0; i < sizeof(vision_top_names) / sizeof(vision_top_names[0]); i++)
    if (!strcmp(g, vision_top_names[i][0])) {
      snprintf(out, n, "%s", vision_top_names[i][1]);
      return;
    }
  int layer, used = 0;
  if (sscanf(g, "v.blk.%d.%n", &layer, &used) == 1 && used > 0 && layer >= 0) {
    if (!strncmp(g + used, "ffn_up.", 7) || !strncmp(g + used, "ffn_down.", 9)) {
      mmproj_ffn(gt, layer, g + used, D, F, out, n);
      return;
    }
    for (size_t i = 0; i < sizeof(vision_layer_names) / sizeof(vision_layer_names[0]); i++) {
      size_t l = strlen(vision_layer_names[i][0]);
      if (!strncmp(g + used, vision_layer_names[i][0], l)) {
        snprintf(out, n, VISION_PREFIX "encoder.layers.%d.%s%s", layer, vision_layer_names[i][1],
                 g + used + l);
        return;
      }
    }
  }
  used = 0;
  if (sscanf(g, "blk.%d.%n", &layer, &used) == 1 && used > 0 && layer >= 0)
    for (size_t i = 0; i < sizeof(layer_names) / sizeof(layer_names[0]); i++)
      if (!strcmp(g + used, layer_names[i][0])) {
        snprintf(out, n, "model.layers.%d.%s", layer, layer_names[i][1]);
        return;
      }
  snprintf(out, n, "%s", g);
}

static enum md_st_dtype st_dtype(uint32_t t) {
  switch (t) {
  case MD_GGML_F32: return MD_ST_F32;
  case MD_GGML_F16: return MD_ST_F16;
  case MD_GGML_BF16: return MD_ST_BF16;
  case MD_GGML_Q8_0: return MD_ST_Q8_0;
  case MD_GGML_Q4_0: return MD_ST_Q4_0;
  case MD_GGML_Q4_1: return MD_ST_Q4_1;
  case MD_GGML_Q5_0: return MD_ST_Q5_0;
  case MD_GGML_Q5_1: return MD_ST_Q5_1;
  case MD_GGML_Q4_K: return MD_ST_Q4_K;
  case MD_GGML_Q5_K: return MD_ST_Q5_K;
  case MD_GGML_Q6_K: return MD_ST_Q6_K;
  default: return MD_ST_OTHER;
  }
}

static void close_gguf(void *g) {
  md_gguf_close(g);
}

const struct md_gguf *md_st_gguf(const struct md_st *st) {
  return md_st_owner(st, close_gguf);
}

int md_st_open_gguf(const char *path, struct md_st **out, char *err, size_t errlen) {
  struct md_gguf *g = NULL;
  *out = NULL;
  int rc = md_gguf_open(path, &g, err, errlen);
  if (rc) return rc;
  const char *base = strrchr(path, '/');
  struct md_st *st = NULL;
  if (md_st_new(base ? base + 1 : path, close_gguf, g, &st)) {
    md_gguf_close(g);
    return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  }
  size_t map_len;
  void *map = md_gguf_mapping(g, &map_len);
  if (map) md_st_owner_pages(st, map, map_len);
  int64_t D = 0, F = 0; /* a vision tower's widths (mmproj_ffn) */
  md_gguf_get_int(g, "clip.vision.embedding_length", &D);
  md_gguf_get_int(g, "clip.vision.feed_forward_length", &F);
  for (int i = 0; i < md_gguf_tensor_count(g) && !rc; i++) {
    const struct md_gguf_tensor *gt = md_gguf_tensor_at(g, i);
    char name[512], tb[32];
    hf_name(gt, D, F, name, sizeof(name));
    struct md_tensor t = {.name = name, .dtype = st_dtype(gt->type), .ndim = gt->n_dims};
    snprintf(t.dtype_name, sizeof(t.dtype_name), "%s", md_ggml_type_name(gt->type, tb, sizeof(tb)));
    for (int d = 0; d < gt->n_dims; d++)
      t.shape[d] = gt->ne[gt->n_dims - 1 - d];
    t.data = gt->data;
    t.nbytes = gt->nbytes;
    if (md_st_add(st, &t)) rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  }
  if (!rc) rc = md_st_seal(st, err, errlen);
  if (rc) {
    md_st_close(st);
    return rc;
  }
  *out = st;
  return 0;
}

int md_st_open_mmproj(const char *model, struct md_st **out, char *err, size_t errlen) {
  char path[4200];
  *out = NULL;
  int rc = md_model_mmproj_path(model, path, sizeof(path), err, errlen);
  if (rc < 0) return rc;
  if (!rc)
    return cm_fail(err, errlen, CM_ERR_NOENT,
                   "%s: no vision tower (an mmproj .gguf file) beside the model", model);
  return md_st_open_gguf(path, out, err, errlen);
}
