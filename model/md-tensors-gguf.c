/* md-tensors-gguf.c — a GGUF file's tensors as the loader's directory: llama.cpp's
 * names for Gemma 3 and Gemma 4 and their mmproj towers (gguf-py's
 * tensor_mapping.py, src/llama-arch.cpp, tools/mtmd/clip-impl.h)
 * mapped to the Hugging Face names the binder looks up,
 * dimensions turned outermost first, ggml types to the loader's dtypes (the
 * block formats among them; any other type listed as OTHER, refused by name
 * when bound). The tensors' bytes stay in the file's mapping, which the
 * directory owns. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-fs.h"
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

/* A Gemma 4 mmproj file's tensors (llama.cpp's converter, conversion/gemma.py's
 * Gemma4VisionAudioModel, through gguf-py's tensor_mapping.py; clip.cpp's
 * gemma4v and gemma4a read them) and transformers' names for them. Per layer:
 * {llama.cpp's, ours, how}: G4_CLIP a Gemma4ClippableLinear (.weight is
 * ours .linear.weight, the bounds .input_min ... keep their suffix), G4_BARE
 * a tensor whose name has no .weight in transformers, else the suffix as it
 * is. The converter swaps the light conv's two norms on purpose: its
 * conv_norm is lconv1d.pre_layer_norm, its norm_conv lconv1d.conv_norm. */
enum { G4_PLAIN = 0, G4_CLIP = 1, G4_BARE = 2 };
struct g4_name {
  const char *g, *h;
  int how;
};
static const struct g4_name g4_vision_layer[] = {
    {"attn_q", "self_attn.q_proj", G4_CLIP},
    {"attn_k", "self_attn.k_proj", G4_CLIP},
    {"attn_v", "self_attn.v_proj", G4_CLIP},
    {"attn_out", "self_attn.o_proj", G4_CLIP},
    {"ffn_gate", "mlp.gate_proj", G4_CLIP},
    {"ffn_up", "mlp.up_proj", G4_CLIP},
    {"ffn_down", "mlp.down_proj", G4_CLIP},
    {"attn_q_norm", "self_attn.q_norm", G4_PLAIN},
    {"attn_k_norm", "self_attn.k_norm", G4_PLAIN},
    {"ln1", "input_layernorm", G4_PLAIN},
    {"attn_post_norm", "post_attention_layernorm", G4_PLAIN},
    {"ln2", "pre_feedforward_layernorm", G4_PLAIN},
    {"ffn_post_norm", "post_feedforward_layernorm", G4_PLAIN},
    {"out_scale", "layer_scalar", G4_BARE},
};
static const struct g4_name g4_audio_layer[] = {
    {"ffn_norm", "feed_forward1.pre_layer_norm", G4_PLAIN},
    {"ffn_up", "feed_forward1.ffw_layer_1", G4_CLIP},
    {"ffn_down", "feed_forward1.ffw_layer_2", G4_CLIP},
    {"ffn_post_norm", "feed_forward1.post_layer_norm", G4_PLAIN},
    {"ffn_norm_1", "feed_forward2.pre_layer_norm", G4_PLAIN},
    {"ffn_up_1", "feed_forward2.ffw_layer_1", G4_CLIP},
    {"ffn_down_1", "feed_forward2.ffw_layer_2", G4_CLIP},
    {"ffn_post_norm_1", "feed_forward2.post_layer_norm", G4_PLAIN},
    {"attn_pre_norm", "norm_pre_attn", G4_PLAIN},
    {"attn_q", "self_attn.q_proj", G4_CLIP},
    {"attn_k", "self_attn.k_proj", G4_CLIP},
    {"attn_v", "self_attn.v_proj", G4_CLIP},
    {"attn_out", "self_attn.post", G4_CLIP},
    {"attn_k_rel", "self_attn.relative_k_proj", G4_PLAIN},
    {"per_dim_scale", "self_attn.per_dim_scale", G4_BARE},
    {"attn_post_norm", "norm_post_attn", G4_PLAIN},
    {"conv_norm", "lconv1d.pre_layer_norm", G4_PLAIN},
    {"conv_pw1", "lconv1d.linear_start", G4_CLIP},
    {"conv_dw", "lconv1d.depthwise_conv1d", G4_PLAIN},
    {"norm_conv", "lconv1d.conv_norm", G4_PLAIN},
    {"conv_pw2", "lconv1d.linear_end", G4_CLIP},
    {"ln2", "norm_out", G4_PLAIN},
};
static const char *const g4_top[][2] = {
    {"v.patch_embd.weight", "model.vision_tower.patch_embedder.input_proj.weight"},
    {"v.position_embd.weight", "model.vision_tower.patch_embedder.position_embedding_table"},
    {"v.std_bias", "model.vision_tower.std_bias"},
    {"v.std_scale", "model.vision_tower.std_scale"},
    {"mm.input_projection.weight", "model.embed_vision.embedding_projection.weight"},
    {"a.input_projection.weight",
     "model.audio_tower.subsample_conv_projection.input_proj_linear.weight"},
    {"a.pre_encode.out.weight", "model.audio_tower.output_proj.weight"},
    {"a.pre_encode.out.bias", "model.audio_tower.output_proj.bias"},
    {"mm.a.input_projection.weight", "model.embed_audio.embedding_projection.weight"},
};

/* rest ("attn_q.weight") under table tab as ours after prefix lp; 1 when
 * named. Only what the towers read is named: .weight, and a clippable
 * linear's four bounds (transformers' towers have no biases). */
static int g4_layer_name(const struct g4_name *tab, size_t n, const char *lp, const char *rest,
                         char *out, size_t outn) {
  static const char *const bounds[] = {"input_min", "input_max", "output_min", "output_max"};
  for (size_t i = 0; i < n; i++) {
    size_t l = strlen(tab[i].g);
    if (strncmp(rest, tab[i].g, l) || rest[l] != '.') continue;
    const char *suf = rest + l + 1;
    if (!strcmp(suf, "weight")) {
      snprintf(out, outn, "%s%s%s", lp, tab[i].h,
               tab[i].how == G4_BARE   ? ""
               : tab[i].how == G4_CLIP ? ".linear.weight"
                                       : ".weight");
      return 1;
    }
    for (int k = 0; k < 4 && tab[i].how == G4_CLIP; k++)
      if (!strcmp(suf, bounds[k])) {
        snprintf(out, outn, "%s%s.%s", lp, tab[i].h, suf);
        return 1;
      }
    return 0;
  }
  return 0;
}

int md_g4_mmproj_name(const char *g, char *out, size_t n) {
  for (size_t i = 0; i < sizeof(g4_top) / sizeof(g4_top[0]); i++)
    if (!strcmp(g, g4_top[i][0])) {
      snprintf(out, n, "%s", g4_top[i][1]);
      return 1;
    }
  int layer, used = 0;
  char lp[96], rest[32];
  if (sscanf(g, "a.conv1d.%d.%n", &layer, &used) == 1 && used && layer >= 0 && layer < 2) {
    snprintf(rest, sizeof(rest), "%s", g + used);
    if (strcmp(rest, "weight") && strcmp(rest, "norm.weight")) return 0;
    snprintf(out, n, "model.audio_tower.subsample_conv_projection.layer%d.%s%s", layer,
             strcmp(rest, "weight") ? "" : "conv.", rest);
    return 1;
  }
  used = 0;
  if (sscanf(g, "v.blk.%d.%n", &layer, &used) == 1 && used && layer >= 0) {
    snprintf(lp, sizeof(lp), "model.vision_tower.encoder.layers.%d.", layer);
    return g4_layer_name(g4_vision_layer, sizeof(g4_vision_layer) / sizeof(g4_vision_layer[0]), lp,
                         g + used, out, n);
  }
  used = 0;
  if (sscanf(g, "a.blk.%d.%n", &layer, &used) == 1 && used && layer >= 0) {
    snprintf(lp, sizeof(lp), "model.audio_tower.layers.%d.", layer);
    return g4_layer_name(g4_audio_layer, sizeof(g4_audio_layer) / sizeof(g4_audio_layer[0]), lp,
                         g + used, out, n);
  }
  return 0;
}

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
 * a Gemma 3 vision tower's widths (mmproj_ffn), 0 in a model file; g4: a
 * Gemma 4 mmproj file. */
static void hf_name(const struct md_gguf_tensor *gt, int64_t D, int64_t F, int g4, char *out,
                    size_t n) {
  const char *g = gt->name;
  if (g4) {
    if (!md_g4_mmproj_name(g, out, n)) snprintf(out, n, "%s", g);
    return;
  }
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
  case MD_GGML_Q3_K: return MD_ST_Q3_K;
  case MD_GGML_IQ4_NL: return MD_ST_IQ4_NL;
  case MD_GGML_IQ4_XS: return MD_ST_IQ4_XS;
  case MD_GGML_Q2_K: return MD_ST_Q2_K;
  default: return MD_ST_OTHER;
  }
}

/* 1 when g is a Gemma 4 mmproj file: a gemma4v vision or gemma4a audio
 * projector (md_mmproj_projector, the config's reading). */
static int is_g4_mmproj(const struct md_gguf *g) {
  char v[32], a[32];
  md_mmproj_projector(g, "vision", v, sizeof(v));
  md_mmproj_projector(g, "audio", a, sizeof(a));
  return !strcmp(v, "gemma4v") || !strcmp(a, "gemma4a");
}

/* The two Gemma 4 tensors the converter reshapes, in transformers' shapes
 * over the same bytes: the patch projection, written as a convolution's
 * kernel [D, 3, p, p], as [D, 3 p p] (its inputs then in channel-major
 * order: wk-vision-g4.c gathers them so for a GGUF file), and the light
 * conv's depthwise kernel, written as [C, K], as [C, 1, K]. */
static void g4_shape(const struct md_gguf_tensor *gt, struct md_tensor *t) {
  if (!strcmp(gt->name, "v.patch_embd.weight") && gt->n_dims == 4) {
    t->ndim = 2;
    t->shape[0] = gt->ne[3];
    t->shape[1] = gt->ne[0] * gt->ne[1] * gt->ne[2];
  } else if (gt->n_dims == 2 && strstr(gt->name, ".conv_dw.weight") &&
             !strncmp(gt->name, "a.blk.", 6)) {
    t->ndim = 3;
    t->shape[0] = gt->ne[1];
    t->shape[1] = 1;
    t->shape[2] = gt->ne[0];
  }
}

/* The open parts of a GGUF model (one for a file not split), the
 * directory's owner: g[0] holds the metadata. */
struct gguf_parts {
  int n;
  struct md_gguf *g[];
};

static void close_parts(void *p) {
  struct gguf_parts *s = p;
  for (int i = 0; i < s->n; i++)
    md_gguf_close(s->g[i]);
  free(s);
}

const struct md_gguf *md_st_gguf(const struct md_st *st) {
  const struct gguf_parts *s = md_st_owner(st, close_parts);
  return s ? s->g[0] : NULL;
}

/* Part g's tensors into st under the names the loader binds (meta: the
 * first part, whose metadata says what the file is). */
static int add_part(struct md_st *st, const struct md_gguf *g, const struct md_gguf *meta,
                    char *err, size_t errlen) {
  size_t map_len;
  void *map = md_gguf_mapping(g, &map_len);
  if (map) md_st_owner_pages(st, map, map_len);
  int64_t D = 0, F = 0; /* a vision tower's widths (mmproj_ffn) */
  md_gguf_get_int(meta, "clip.vision.embedding_length", &D);
  md_gguf_get_int(meta, "clip.vision.feed_forward_length", &F);
  int g4 = is_g4_mmproj(meta);
  for (int i = 0; i < md_gguf_tensor_count(g); i++) {
    const struct md_gguf_tensor *gt = md_gguf_tensor_at(g, i);
    char name[512], tb[32];
    hf_name(gt, D, F, g4, name, sizeof(name));
    struct md_tensor t = {.name = name, .dtype = st_dtype(gt->type), .ndim = gt->n_dims};
    snprintf(t.dtype_name, sizeof(t.dtype_name), "%s", md_ggml_type_name(gt->type, tb, sizeof(tb)));
    for (int d = 0; d < gt->n_dims; d++)
      t.shape[d] = gt->ne[gt->n_dims - 1 - d];
    if (g4) g4_shape(gt, &t);
    t.data = gt->data;
    t.nbytes = gt->nbytes;
    if (md_st_add(st, &t)) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  }
  return 0;
}

/* Opens parts 1 .. count - 1 of the model whose first part (path) is s->g[0],
 * each checked to be the part its name says, and adds their tensors; then
 * checks the first part's split.tensors.count against them all. */
static int add_parts(struct md_st *st, struct gguf_parts *s, const char *path, int count, char *err,
                     size_t errlen) {
  int rc = 0;
  char p[4200], why[512];
  for (int i = 1; i < count && !rc; i++) {
    if (md_gguf_split_path(path, i, count, p, sizeof(p)))
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "%s is part 1 of %d of a split model, but its name does not end in "
                     "-00001-of-%05d.gguf, so its other parts cannot be found",
                     path, count, count);
    if ((rc = md_gguf_open(p, &s->g[i], why, sizeof(why))))
      return cm_fail(err, errlen, rc, "part %d of %d of %s: %s", i + 1, count, path, why);
    s->n++;
    int no, n;
    if ((rc = md_gguf_split(s->g[i], &no, &n, err, errlen))) return rc;
    if (no != i || n != count)
      return cm_fail(err, errlen, CM_ERR_PARSE,
                     "%s: its split.no and split.count say part %d of %d, its name part %d of %d",
                     p, no + 1, n, i + 1, count);
    if (md_st_add_file(st, cm_base_name(p)))
      return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
    rc = add_part(st, s->g[i], s->g[0], err, errlen);
  }
  int64_t want;
  if (!rc && !md_gguf_get_int(s->g[0], "split.tensors.count", &want) && want != md_st_count(st))
    rc = cm_fail(err, errlen, CM_ERR_PARSE,
                 "%s: split.tensors.count says %lld tensors, its %d parts hold %d", path,
                 (long long)want, count, md_st_count(st));
  return rc;
}

int md_st_open_gguf(const char *path, struct md_st **out, char *err, size_t errlen) {
  struct md_gguf *g = NULL;
  *out = NULL;
  int rc = md_gguf_open(path, &g, err, errlen);
  if (rc) return rc;
  int no = 0, count = 1;
  if ((rc = md_gguf_split(g, &no, &count, err, errlen)) || no) {
    if (!rc)
      rc =
          cm_fail(err, errlen, CM_ERR_INVAL,
                  "%s is part %d of %d of a split model: name its first part (-00001-of-%05d.gguf)",
                  path, no + 1, count, count);
    md_gguf_close(g);
    return rc;
  }
  struct gguf_parts *s = calloc(1, sizeof(*s) + sizeof(s->g[0]) * (size_t)count);
  struct md_st *st = NULL;
  if (!s || md_st_new(cm_base_name(path), close_parts, s, &st)) {
    free(s);
    md_gguf_close(g);
    return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  }
  s->g[s->n++] = g;
  rc = add_part(st, g, g, err, errlen);
  if (!rc && count > 1) rc = add_parts(st, s, path, count, err, errlen);
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
                   "%s: no towers (an mmproj .gguf file) beside the model", model);
  return md_st_open_gguf(path, out, err, errlen);
}
