/* md-lora.h — LoRA adapters as PEFT saves them: a folder with
 * adapter_config.json and adapter_model.safetensors.
 *
 * An adapter adds to a linear layer's output y = x W^T the low-rank term
 * scale * (x A^T) B^T, A [r, in] (lora_A) and B [out, r] (lora_B), with
 * scale = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora (PEFT's
 * LoraLayer). Adapters on the language model's attention projections (q, k,
 * v, o) and MLP (gate, up, down) are taken; anything else an adapter holds
 * (embeddings, the head, a vision or audio tower, modules_to_save, biases,
 * DoRA, per-module ranks) is refused at open, naming the tensor or the key.
 *
 * adapter_config.json: peft_type "LORA" (or absent); r (1..MD_LORA_MAX_RANK),
 * lora_alpha, use_rslora and base_model_name_or_path, missing ones taking
 * LoraConfig's defaults (r 8, lora_alpha 8, no rslora). Refused when set (as
 * Python tests them: null, false, 0, "", [] and {} are unset): use_dora,
 * fan_in_fan_out, modules_to_save, rank_pattern, alpha_pattern,
 * layer_replication, lora_bias, use_qalora, target_parameters,
 * trainable_token_indices, alora_invocation_tokens, arrow_config, use_bdlora;
 * and a bias other than "none". Other keys are ignored. Weights come from
 * adapter_model.safetensors only: an adapter_model.bin (pickle) is never read.
 *
 * Tensor names: base_model.model.<PREFIX>layers.<i>.self_attn.q_proj.lora_A.weight
 * (and k_proj, v_proj, o_proj; mlp.gate_proj, up_proj, down_proj; lora_B), PREFIX
 * one of "model.", "model.language_model.", "language_model.model.",
 * "language_model." (the causal-LM and the multimodal classes' layouts). A
 * module's A and B come together or not at all; a layer or module without them
 * is not adapted. The shapes are checked against the model's config (the full,
 * unsharded one). Adapters on a KV-shared layer's k_proj and v_proj are kept
 * (transformers has those modules, but the layer reads another layer's K/V:
 * whether they count is the caller's to say).
 *
 * A GGUF adapter file as llama.cpp's convert_lora_to_gguf.py writes it (what
 * llama-server --lora loads; md-lora-gguf.c says what it holds and what is
 * refused) loads into the same struct: general.type "adapter", adapter.type
 * "lora", general.architecture the model's, tensors blk.N.attn_q.weight.lora_a
 * (ggml's ne [in, r]) and .lora_b (ne [r, out]) and the like for attn_k, attn_v,
 * attn_output, ffn_gate, ffn_up and ffn_down, F32, F16 or BF16; its tensors are
 * listed as A [r, in] and B [out, r] over the same bytes. Its scale is
 * llama.cpp's: adapter.lora.alpha / r, or 1 where the alpha is absent or 0. */
#ifndef LMSERVE_MD_LORA_H
#define LMSERVE_MD_LORA_H
#include <stddef.h>

#include "model/md-config.h"
#include "model/md-safetensors.h"

enum md_lora_mod {
  MD_LORA_Q = 0,
  MD_LORA_K,
  MD_LORA_V,
  MD_LORA_O,
  MD_LORA_GATE,
  MD_LORA_UP,
  MD_LORA_DOWN,
  MD_LORA_N_MODS,
};

#define MD_LORA_MAX_RANK 512

/* One adapted module: A [rank, in], B [out, rank], F32, F16 or BF16 each (in the
 * adapter's file: a and b point into the md_st). */
struct md_lora_mod_w {
  const struct md_tensor *a, *b; /* both NULL: the module is not adapted */
};

struct md_lora {
  int rank;                                     /* r, 1..MD_LORA_MAX_RANK: every module's */
  double alpha;                                 /* lora_alpha */
  int rslora;                                   /* use_rslora */
  double scale;                                 /* alpha / r, or alpha / sqrt(r) with rslora */
  int n_layers;                                 /* the model's */
  int n_adapted;                                /* modules with A and B, over every layer */
  struct md_lora_mod_w (*mods)[MD_LORA_N_MODS]; /* [n_layers] */
  char base_model[256];                         /* base_model_name_or_path, "" when absent */
  struct md_st *st;                             /* the tensors */
  int gguf; /* 1: read from a GGUF adapter file (tensor names llama.cpp's) */
};

/* Opens the adapter in folder dir for the model cfg (Gemma 3 or Gemma 4, its
 * text config), or the GGUF adapter file dir names (any path that is not a
 * folder: md_lora_open_gguf): 0, or a negative cm_err with a one-line reason in
 * err that names the file, the key or the tensor. */
int md_lora_open(const char *dir, const struct md_config *cfg, struct md_lora **out, char *err,
                 size_t errlen);
/* The same for the GGUF adapter file at path, whatever its name. */
int md_lora_open_gguf(const char *path, const struct md_config *cfg, struct md_lora **out,
                      char *err, size_t errlen);
void md_lora_close(struct md_lora *l);

/* The input and output widths module `mod` of layer `layer` has in the full model
 * (q: hidden -> n_heads * head_dim; k, v: hidden -> n_kv_heads * head_dim; o:
 * n_heads * head_dim -> hidden; gate, up: hidden -> ffn_dim; down: ffn_dim ->
 * hidden), from the layer's md_layer_cfg. 0, CM_ERR_INVAL where the layer has no
 * such module (v on a k_eq_v layer), or CM_ERR_RANGE for a layer or module out of
 * range. */
int md_lora_dims(const struct md_config *cfg, int layer, enum md_lora_mod mod, int *in, int *out);

/* Rows [r0, r0 + nr) and columns [c0, c0 + nc) of a 2-D F32, F16 or BF16
 * tensor as f32, row-major into dst [nr, nc], times `mul` (mul 1: every value
 * exactly, bit for bit); the tensor's data need not be aligned (a GGUF file's
 * general.alignment may be 1). 0 (nothing written for an empty slice), CM_ERR_RANGE
 * for a slice outside the tensor, CM_ERR_INVAL for another dtype or rank. */
int md_lora_read_f32(const struct md_tensor *t, int r0, int nr, int c0, int nc, float mul,
                     float *dst);

/* The module's name as PEFT's target_modules spell it ("q_proj", ..., "down_proj"). */
const char *md_lora_mod_name(enum md_lora_mod mod);

#endif
