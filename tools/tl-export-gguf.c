/* tl-export-gguf.c — `lmserve export-gguf`: writes a Gemma 3 or Gemma 4
 * text checkpoint (safetensors + config.json) as one GGUF file that llama.cpp
 * loads, so that
 * the same weights can be run side by side (`tools/bench-llamacpp.mjs`).
 *
 *   lmserve export-gguf --model DIR --out FILE.gguf [--dtype same|f32|TYPE]
 *   lmserve quantize DIR FILE.gguf TYPE        (TYPE: qtypes below)
 *
 * What is written, as llama.cpp's own converter (convert_hf_to_gguf.py,
 * Gemma3Model) writes a Gemma3ForCausalLM checkpoint and as its loader
 * (src/models/gemma3.cpp) reads it back:
 *   - GGUF version 3, little-endian, data aligned to 32 bytes;
 *   - general.architecture "gemma3" and the hyperparameters under "gemma3.":
 *     context_length, embedding_length, block_count, feed_forward_length,
 *     attention.{head_count, head_count_kv, key_length, value_length,
 *     layer_norm_rms_epsilon, sliding_window}, rope.freq_base (full layers),
 *     rope.freq_base_swa (sliding layers), rope.scaling.{type, factor} when
 *     the full layers scale positions, final_logit_softcapping when set, and
 *     attention.sliding_window_pattern as one bool per layer (so the layer
 *     plan is the checkpoint's own, not llama.cpp's default of every 6th);
 *   - the vocabulary of DIR/tokenizer.json: for Gemma 4 as llama.cpp's
 *     converter writes it (tokenizer.ggml.model "gemma4": tokens, token_type,
 *     tokenizer.json's merges as "left right" strings in tokenizer.ggml.merges,
 *     scores 0 and -1000 on control tokens); for Gemma 3 as a SentencePiece-type
 *     one (tokenizer.ggml.model "llama", as for Gemma's tokenizer.model):
 *     tokens, token_type (byte-fallback "<0xXX>" tokens BYTE, special added
 *     tokens CONTROL, other added tokens USER_DEFINED, the rest NORMAL),
 *     scores (minus the rank of the first merge that makes each piece, so
 *     that a SentencePiece-style reading orders merges as tokenizer.json
 *     does), the bos/eos/unk/pad ids, and tokenizer_config.json's chat
 *     template as tokenizer.chat_template; ids past the tokenizer's up to the
 *     config's vocab_size become "<pad_N>", and tokens past vocab_size
 *     (Gemma 3 270m's tokenizer adds <image_soft_token> at 262144, beyond its
 *     262144-row table) are left out, as no embedding row exists for them. Without tokenizer.json:
 *     "no_vocab" and gemma3.vocab_size (llama.cpp itself takes that; some
 *     front ends that tokenize at load do not);
 *   - tensors under llama.cpp's names (token_embd, output_norm, output when
 *     the head is not tied, blk.N.{attn_norm, attn_q, attn_k, attn_v,
 *     attn_output, attn_q_norm, attn_k_norm, post_attention_norm, ffn_norm,
 *     ffn_gate, ffn_up, ffn_down, post_ffw_norm}), dimensions innermost
 *     first. Matrices keep their dtype (or become f32 with --dtype f32); the
 *     RMSNorm weights are written as f32 1 + w, because Gemma's RMSNorm
 *     multiplies by (1 + w) and llama.cpp's by w.
 *
 * Gemma 4 (dense), as llama.cpp's converter (conversion/gemma.py,
 * Gemma4Model) writes it and src/models/gemma4.cpp reads it: "gemma4" and
 * under "gemma4." the keys above (key_length / value_length: the full
 * layers' head dim) plus attention.key_length_swa / value_length_swa (the
 * sliding layers'), rope.dimension_count(_swa) (the whole heads),
 * attention.shared_kv_layers, embedding_length_per_layer_input,
 * final_logit_softcapping always (llama.cpp takes 30 when it is absent: 0
 * is written for none), feed_forward_length and attention.head_count_kv one
 * per layer where layers differ; the norms as they are (Gemma 4 multiplies
 * by w); the tensor rope_freqs.weight (f32, one factor per frequency pair of
 * the full layers: 1 where the proportional RoPE rotates, 1e30 where it does
 * not); per_layer_token_embd (kept in its dtype: it is read by rows, and
 * --quantization leaves it too), per_layer_model_proj, per_layer_proj_norm,
 * and per layer inp_gate, proj, post_norm, layer_output_scale; KV-shared
 * layers without their unread K/V weights, K-as-V layers without attn_v.
 * MoE: expert_count, expert_used_count, expert_feed_forward_length, and per
 * layer ffn_gate_inp (the router, as f32: llama.cpp's quantizer leaves it
 * unquantized) with its .scale, the expert stacks ffn_gate_up_exps [E, 2I, H]
 * and ffn_down_exps [E, H, I] (3-D, quantized row by row when asked),
 * ffn_down_exps.scale (per_expert_scale), pre_ffw_norm_2, post_ffw_norm_1
 * and post_ffw_norm_2.
 * The vocabulary is written as for Gemma 3.
 *
 * With --mmproj FILE, a Gemma 3 checkpoint's vision tower, or a Gemma 4
 * checkpoint's vision and audio towers, go to FILE as llama.cpp's mmproj
 * file (export_mmproj below).
 *
 * Refused, with the reason: other architectures, a vision-only checkpoint,
 * an attention scale llama.cpp would not reproduce (it takes 1/sqrt(head_dim)
 * except for 62-layer models), scaled or partial RoPE on sliding layers;
 * KV-shared layers whose last storing layers are not a
 * sliding then a full one (llama.cpp's gemma4 reads those two, whatever the
 * checkpoint says). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm-args.h"
#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "kernels/kn-dtype.h"
#include "kernels/kn-quant.h"
#include "model/md-audio-g4.h"
#include "model/md-config.h"
#include "model/md-gguf.h"
#include "model/md-safetensors.h"
#include "tokenizer/tk-tokenizer.h"
#include "tools/tl-main.h"

#define GG_ALIGN 32
/* GGUF value types and ggml tensor types (gguf.h, ggml.h) */
enum { GG_U16 = 2, GG_U32 = 4, GG_I32 = 5, GG_F32 = 6, GG_BOOL = 7, GG_STR = 8, GG_ARR = 9 };
/* llama.cpp's token types (llama.h's llama_token_type) */
enum { TT_NORMAL = 1, TT_CONTROL = 3, TT_USER = 4, TT_BYTE = 6 };
enum { GGML_F32 = 0, GGML_F16 = 1, GGML_BF16 = 30 };
/* general.file_type (llama.h's llama_ftype) */
enum { FT_ALL_F32 = 0, FT_MOSTLY_F16 = 1, FT_MOSTLY_BF16 = 32 };

/* The block formats the matrices may be quantized to (kernels/kn-quant.h) and
 * the llama_ftype of a file of them. A matrix whose rows are not whole blocks
 * of 256 takes llama.cpp's fallback (kn_quant_row_type: Q4_K -> Q5_0, Q5_K ->
 * Q5_1, Q6_K -> Q8_0); one whose rows are not whole blocks of 32 stays as it
 * is. q4_k_m is llama.cpp's Q4_K_M mix: Q4_K, with Q6_K for the output matrix
 * (the embedding when it is tied) and for attn_v and ffn_down in the layers
 * llama.cpp gives more bits (the first and last eighth, every third between). */
static const struct {
  const char *name;
  enum kn_dtype dt;
  int ftype;
  int mix; /* 1: the Q4_K_M mix */
} qtypes[] = {
    {"q8_0", KN_DTYPE_Q8_0, 7, 0},    {"q4_0", KN_DTYPE_Q4_0, 2, 0},
    {"q4_1", KN_DTYPE_Q4_1, 3, 0},    {"q5_0", KN_DTYPE_Q5_0, 8, 0},
    {"q5_1", KN_DTYPE_Q5_1, 9, 0},    {"q4_k", KN_DTYPE_Q4_K, 14, 0},
    {"q5_k", KN_DTYPE_Q5_K, 16, 0},   {"q6_k", KN_DTYPE_Q6_K, 18, 0},
    {"q4_k_m", KN_DTYPE_Q4_K, 15, 1},
};
#define QTYPE_NAMES "q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, q4_k_m"

/* ggml's type number of block format dt (ggml.h's ggml_type). */
static int ggml_block_type(enum kn_dtype dt) {
  switch (dt) {
  case KN_DTYPE_Q8_0: return 8;
  case KN_DTYPE_Q4_0: return 2;
  case KN_DTYPE_Q4_1: return 3;
  case KN_DTYPE_Q5_0: return 6;
  case KN_DTYPE_Q5_1: return 7;
  case KN_DTYPE_Q4_K: return 12;
  case KN_DTYPE_Q5_K: return 13;
  case KN_DTYPE_Q6_K: return 14;
  default: CM_ASSERT(!"not a block format"); return -1;
  }
}

struct gg_tensor {
  char name[64];
  const struct md_tensor *src; /* NULL: gen */
  const float *gen;            /* f32 values made here (Gemma 4's rope_freqs) */
  int norm;                    /* 1-D weight (RMSNorm, scalar): written as f32 shift + w */
  float shift;                 /* 1 for Gemma 3's norms (llama.cpp multiplies by w), else 0 */
  int xf;                      /* XF_*: values moved or mapped on the way (mmproj towers) */
  int type;       /* GGML_* written, or a block format's ggml type (qdt) */
  int qdt;        /* the block format written (enum kn_dtype), or -1 */
  int nd;         /* 1, 2, 3 (a stack of expert matrices) or 4 (a convolution's kernel) */
  uint64_t ne[4]; /* innermost first (1 past nd) */
  uint64_t off;   /* from the start of the data section */
  uint64_t bytes;
};

/* gg_tensor.xf: XF_PATCH, Gemma 4's patch projection [D, p p 3] (inputs
 * (y, x, c)) written as a convolution's kernel [D, 3, p, p]; XF_SOFTPLUS,
 * each value x written as log(1 + e^x) (Gemma 4's per_dim_scale, as the
 * converter stores it). */
enum { XF_NONE = 0, XF_PATCH = 1, XF_SOFTPLUS = 2 };

struct gg_out {
  FILE *f;
  int failed;
  int n_kv; /* key-value pairs written */
};

static void put(struct gg_out *o, const void *p, size_t n) {
  if (!o->failed && n && fwrite(p, 1, n, o->f) != n) o->failed = 1;
}
static void put_u32(struct gg_out *o, uint32_t v) {
  put(o, &v, 4);
}
static void put_u64(struct gg_out *o, uint64_t v) {
  put(o, &v, 8);
}
static void put_str(struct gg_out *o, const char *s) {
  put_u64(o, strlen(s));
  put(o, s, strlen(s));
}
static void kv_key(struct gg_out *o, const char *key, uint32_t type) {
  o->n_kv++;
  put_str(o, key);
  put_u32(o, type);
}
static void kv_u32(struct gg_out *o, const char *key, uint32_t v) {
  kv_key(o, key, GG_U32);
  put_u32(o, v);
}
static void kv_f32(struct gg_out *o, const char *key, float v) {
  kv_key(o, key, GG_F32);
  put(o, &v, 4);
}
/* One u32 (n == 1) or an array of n. */
static void kv_u32s(struct gg_out *o, const char *key, const uint32_t *v, int n) {
  if (n == 1) {
    kv_u32(o, key, v[0]);
    return;
  }
  kv_key(o, key, GG_ARR);
  put_u32(o, GG_U32);
  put_u64(o, (uint64_t)n);
  put(o, v, sizeof(uint32_t) * (size_t)n);
}
static void kv_str(struct gg_out *o, const char *key, const char *v) {
  kv_key(o, key, GG_STR);
  put_str(o, v);
}

static int ggml_type_of(enum md_st_dtype dt) {
  switch (dt) {
  case MD_ST_F32: return GGML_F32;
  case MD_ST_F16: return GGML_F16;
  case MD_ST_BF16: return GGML_BF16;
  default: return -1;
  }
}

static uint64_t type_size(int type) {
  return type == GGML_F32 ? 4 : 2;
}

struct gg_plan {
  struct gg_tensor *t;
  int n, cap;
  int to_f32;
  float norm_shift;  /* added to RMSNorm weights: 1 for Gemma 3, 0 for Gemma 4 */
  int qt;            /* matrices quantized to qtypes[qt] (-1: none) */
  int mm_q8;         /* an mmproj file's matrices in Q8_0 (--mmproj-dtype q8_0) */
  float *rope_freqs; /* Gemma 4's made tensor (owned) */
  int n_layers;
  int n_attn_v, i_attn_v; /* attn_v matrices in the file; those planned so far */
  const struct md_st *st;
  char *err;
  size_t errlen;
};

/* llama.cpp's use_more_bits (src/llama-quant.cpp): the first and last eighth of
 * n, and every third between. */
static int more_bits(int i, int n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* The block format qtypes[qt] asks for matrix `gname` (of layer `layer`, -1
 * outside the layers; `tied`: the embedding is the output matrix too). The
 * Q4_K_M mix as llama.cpp's quantizer chooses it (llama_tensor_get_type_impl):
 * attn_v by its place among the file's attn_v matrices (KV-shared and K-as-V
 * layers have none), ffn_down and the experts' ffn_down_exps by their layer. */
static enum kn_dtype asked_type(struct gg_plan *p, const char *gname, int layer, int tied) {
  int qt = p->qt;
  if (!qtypes[qt].mix) return qtypes[qt].dt;
  if (!strcmp(gname, "output.weight") || (tied && !strcmp(gname, "token_embd.weight")))
    return KN_DTYPE_Q6_K;
  if (strstr(gname, ".attn_v.") && more_bits(p->i_attn_v++, p->n_attn_v)) return KN_DTYPE_Q6_K;
  if (layer >= 0 && strstr(gname, ".ffn_down") && more_bits(layer, p->n_layers))
    return KN_DTYPE_Q6_K;
  return qtypes[qt].dt;
}

/* What plan_add writes: a matrix (in a block format when one is asked), a
 * norm weight or scalar (f32, + norm_shift for norms), a matrix kept in its
 * dtype (Gemma 4's per-layer embedding table, read by rows as --quantization
 * leaves it), a matrix written as f32 whatever is asked (the MoE router). */
enum { PT_MAT = 0, PT_NORM = 1, PT_KEEP = 2, PT_SCALAR = 3, PT_F32 = 4 };

/* Adds tensor `gname` (of layer `layer`, -1 outside them) from checkpoint
 * tensor `hname` of the expected shape (mats x rows x cols; mats == 0 for one
 * matrix, rows == 0 too for a vector of cols); `tied`: the embedding is the
 * output matrix too. A stack of expert matrices is quantized row by row as
 * one matrix of mats x rows rows. */
/* *out: the next planned tensor, gname from checkpoint tensor hname, which
 * must have shape dims[nd] (outermost first) and a float dtype: its name,
 * source and dimensions set (innermost first), the rest zero. 0, or a
 * negative cm_err with p->err set. */
static int plan_take(struct gg_plan *p, const char *gname, const char *hname, int nd,
                     const int64_t *dims, struct gg_tensor **out) {
  const struct md_tensor *s = md_st_find(p->st, hname);
  if (!s) return cm_fail(p->err, p->errlen, CM_ERR_NOENT, "checkpoint has no %s", hname);
  int same = s->ndim == nd || (nd == 1 && dims[0] == 1 && s->ndim == 0); /* a 0-d scalar */
  for (int d = 0; same && d < s->ndim; d++)
    same = s->shape[d] == dims[d];
  if (!same)
    return cm_fail(p->err, p->errlen, CM_ERR_SHAPE, "%s: shape does not match config.json", hname);
  if (ggml_type_of(s->dtype) < 0)
    return cm_fail(p->err, p->errlen, CM_ERR_UNSUPPORTED,
                   "%s: dtype %s (want F32, F16 or BF16: the input must hold the weights "
                   "unquantized, as llama.cpp's quantizer asks of its input)",
                   hname, s->dtype_name);
  CM_ASSERT(p->n < p->cap);
  struct gg_tensor *t = *out = &p->t[p->n++];
  memset(t, 0, sizeof(*t));
  snprintf(t->name, sizeof(t->name), "%s", gname);
  t->src = s;
  t->nd = nd;
  for (int d = 0; d < 4; d++)
    t->ne[d] = d < nd ? (uint64_t)dims[nd - 1 - d] : 1;
  t->qdt = -1;
  return 0;
}

static int plan_add_nd(struct gg_plan *p, const char *gname, const char *hname, int64_t mats,
                       int64_t rows, int64_t cols, int what, int layer, int tied) {
  int norm = what == PT_NORM || what == PT_SCALAR || what == PT_F32;
  int64_t dims[3], nd = 0;
  if (mats) dims[nd++] = mats;
  if (rows) dims[nd++] = rows;
  dims[nd++] = cols;
  struct gg_tensor *t;
  int rc = plan_take(p, gname, hname, (int)nd, dims, &t);
  if (rc) return rc;
  const struct md_tensor *s = t->src;
  t->norm = norm;
  t->shift = what == PT_NORM ? p->norm_shift : 0.0f;
  t->type = (norm || p->to_f32) ? GGML_F32 : ggml_type_of(s->dtype);
  t->bytes = t->ne[0] * t->ne[1] * t->ne[2] * type_size(t->type);
  /* matrices in a block format (or its fallback); one whose rows are not whole
     blocks of 32 stays as it is */
  enum kn_dtype q = KN_DTYPE__COUNT;
  if (p->qt >= 0 && rows && what == PT_MAT)
    q = kn_quant_row_type(asked_type(p, gname, layer, tied), (size_t)cols);
  if (q != KN_DTYPE__COUNT) {
    t->qdt = (int)q;
    t->type = ggml_block_type(q);
    t->bytes = t->ne[2] * (uint64_t)rows * kn_row_bytes(q, (size_t)cols);
  }
  return 0;
}

static int plan_add(struct gg_plan *p, const char *gname, const char *hname, int64_t rows,
                    int64_t cols, int what, int layer, int tied) {
  return plan_add_nd(p, gname, hname, 0, rows, cols, what, layer, tied);
}

/* Gemma 4's tensors under llama.cpp's names (gguf-py's tensor_mapping.py;
 * src/models/gemma4.cpp's load_arch_tensors): the per-layer-embedding set,
 * rope_freqs for the full layers' proportional RoPE, per layer as Gemma 3's
 * less what KV-shared layers never read (their K/V projections and k_norm:
 * llama.cpp does not require them there) and attn_v on K-as-V layers, plus
 * inp_gate, proj and post_norm (per-layer inputs) and layer_output_scale. */
static int plan_gemma4(struct gg_plan *p, const struct md_config *c, const char *P) {
  char h[160], g[64];
  int H = c->hidden, L = c->n_layers, E = c->ple_dim, rc, tied = c->tie_embeddings;
  if (E) {
    snprintf(h, sizeof(h), "%sembed_tokens_per_layer.weight", P);
    if ((rc = plan_add(p, "per_layer_token_embd.weight", h, c->ple_vocab, (int64_t)L * E, PT_KEEP,
                       -1, tied)))
      return rc;
    snprintf(h, sizeof(h), "%sper_layer_model_projection.weight", P);
    if ((rc = plan_add(p, "per_layer_model_proj.weight", h, (int64_t)L * E, H, PT_MAT, -1, tied)))
      return rc;
    snprintf(h, sizeof(h), "%sper_layer_projection_norm.weight", P);
    if ((rc = plan_add(p, "per_layer_proj_norm.weight", h, 0, E, PT_NORM, -1, tied))) return rc;
  }
  int any_full = 0;
  for (int i = 0; i < L; i++)
    any_full |= c->layers[i].kind == MD_LAYER_FULL;
  if (any_full) {
    /* one factor per frequency pair: 1 rotates, 1e30 (the converter's) makes
       the angle 0, so those pairs pass through (Gemma4Model.generate_extra_tensors) */
    int pairs = c->global_head_dim / 2;
    float *f = malloc(sizeof(float) * (size_t)pairs);
    if (!f) return cm_fail(p->err, p->errlen, CM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < pairs; i++)
      f[i] = i < c->rope[MD_LAYER_FULL].rot_pairs ? 1.0f : 1e30f;
    CM_ASSERT(p->n < p->cap);
    struct gg_tensor *t = &p->t[p->n++];
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "rope_freqs.weight");
    t->gen = p->rope_freqs = f;
    t->nd = 1;
    t->ne[0] = (uint64_t)pairs;
    t->ne[1] = t->ne[2] = 1;
    t->type = GGML_F32;
    t->bytes = 4 * (uint64_t)pairs;
    t->qdt = -1;
  }
  for (int i = 0; i < L; i++) {
    const struct md_layer_cfg *l = &c->layers[i];
    int D = l->head_dim, q = c->n_heads * D, kv = l->n_kv_heads * D, F = l->ffn_dim;
    const struct {
      const char *g, *h;
      int64_t rows, cols;
      int what;
      int skip;
    } map[] = {
        {"attn_norm", "input_layernorm.weight", 0, H, PT_NORM, 0},
        {"attn_q", "self_attn.q_proj.weight", q, H, PT_MAT, 0},
        {"attn_k", "self_attn.k_proj.weight", kv, H, PT_MAT, l->kv_shared},
        {"attn_v", "self_attn.v_proj.weight", kv, H, PT_MAT, l->kv_shared || l->k_eq_v},
        {"attn_output", "self_attn.o_proj.weight", H, q, PT_MAT, 0},
        {"attn_q_norm", "self_attn.q_norm.weight", 0, D, PT_NORM, 0},
        {"attn_k_norm", "self_attn.k_norm.weight", 0, D, PT_NORM, l->kv_shared},
        {"post_attention_norm", "post_attention_layernorm.weight", 0, H, PT_NORM, 0},
        {"ffn_norm", "pre_feedforward_layernorm.weight", 0, H, PT_NORM, 0},
        {"ffn_gate", "mlp.gate_proj.weight", F, H, PT_MAT, 0},
        {"ffn_up", "mlp.up_proj.weight", F, H, PT_MAT, 0},
        {"ffn_down", "mlp.down_proj.weight", H, F, PT_MAT, 0},
        {"post_ffw_norm", "post_feedforward_layernorm.weight", 0, H, PT_NORM, 0},
        {"inp_gate", "per_layer_input_gate.weight", E, H, PT_MAT, !E},
        {"proj", "per_layer_projection.weight", H, E, PT_MAT, !E},
        {"post_norm", "post_per_layer_input_norm.weight", 0, H, PT_NORM, !E},
    };
    for (size_t k = 0; k < CM_ARRAY_LEN(map); k++) {
      if (map[k].skip) continue;
      snprintf(g, sizeof(g), "blk.%d.%s.weight", i, map[k].g);
      snprintf(h, sizeof(h), "%slayers.%d.%s", P, i, map[k].h);
      if ((rc = plan_add(p, g, h, map[k].rows, map[k].cols, map[k].what, i, tied))) return rc;
    }
    if (c->moe) {
      /* the MoE block (conversion/gemma.py's Gemma4Model): the router as f32
         (llama.cpp's quantizer leaves ffn_gate_inp unquantized too; f32, so
         that no runtime rounds the router's input to 16 bits, where a near-tie
         of two experts would go another way), its scales as f32, the expert
         stacks as they are (or quantized) */
      int NE = c->n_experts, I = c->moe_ffn;
      const struct {
        const char *g, *h;
        int64_t mats, rows, cols;
        int what;
      } moe[] = {
          {"ffn_gate_inp.weight", "router.proj.weight", 0, NE, H, PT_F32},
          {"ffn_gate_inp.scale", "router.scale", 0, 0, H, PT_SCALAR},
          {"ffn_gate_up_exps.weight", "experts.gate_up_proj", NE, 2 * I, H, PT_MAT},
          {"ffn_down_exps.weight", "experts.down_proj", NE, H, I, PT_MAT},
          {"ffn_down_exps.scale", "router.per_expert_scale", 0, 0, NE, PT_SCALAR},
          {"pre_ffw_norm_2.weight", "pre_feedforward_layernorm_2.weight", 0, 0, H, PT_NORM},
          {"post_ffw_norm_1.weight", "post_feedforward_layernorm_1.weight", 0, 0, H, PT_NORM},
          {"post_ffw_norm_2.weight", "post_feedforward_layernorm_2.weight", 0, 0, H, PT_NORM},
      };
      for (size_t k = 0; k < CM_ARRAY_LEN(moe); k++) {
        snprintf(g, sizeof(g), "blk.%d.%s", i, moe[k].g);
        snprintf(h, sizeof(h), "%slayers.%d.%s", P, i, moe[k].h);
        if ((rc =
                 plan_add_nd(p, g, h, moe[k].mats, moe[k].rows, moe[k].cols, moe[k].what, i, tied)))
          return rc;
      }
    }
    /* the layer's output scale, when the checkpoint has one (llama.cpp: optional) */
    snprintf(h, sizeof(h), "%slayers.%d.layer_scalar", P, i);
    snprintf(g, sizeof(g), "blk.%d.layer_output_scale.weight", i);
    if (md_st_find(p->st, h) && (rc = plan_add(p, g, h, 0, 1, PT_SCALAR, i, tied))) return rc;
  }
  return 0;
}

static int plan_model(struct gg_plan *p, const struct md_config *c) {
  const char *P = md_st_text_prefix(p->st);
  if (!P) return cm_fail(p->err, p->errlen, CM_ERR_NOENT, "checkpoint has no embed_tokens.weight");
  char h[160], g[64];
  int H = c->hidden, D = c->head_dim, rc;
  snprintf(h, sizeof(h), "%sembed_tokens.weight", P);
  int tied = c->tie_embeddings;
  p->n_layers = c->n_layers;
  for (int i = 0; i < c->n_layers; i++)
    p->n_attn_v += !c->layers[i].kv_shared && !c->layers[i].k_eq_v;
  if ((rc = plan_add(p, "token_embd.weight", h, c->vocab, H, PT_MAT, -1, tied))) return rc;
  snprintf(h, sizeof(h), "%snorm.weight", P);
  if ((rc = plan_add(p, "output_norm.weight", h, 0, H, PT_NORM, -1, tied))) return rc;
  if (!tied && (rc = plan_add(p, "output.weight", "lm_head.weight", c->vocab, H, PT_MAT, -1, tied)))
    return rc;
  if (c->arch == MD_ARCH_GEMMA4) return plan_gemma4(p, c, P);
  static const struct {
    const char *g, *h;
    int kind; /* 0: norm [H]; 1: head norm [D]; 2: [q, H]; 3: [kv, H]; 4: [H, q];
                 5: [F, H]; 6: [H, F] */
  } map[] = {
      {"attn_norm", "input_layernorm", 0},
      {"attn_q", "self_attn.q_proj", 2},
      {"attn_k", "self_attn.k_proj", 3},
      {"attn_v", "self_attn.v_proj", 3},
      {"attn_output", "self_attn.o_proj", 4},
      {"attn_q_norm", "self_attn.q_norm", 1},
      {"attn_k_norm", "self_attn.k_norm", 1},
      {"post_attention_norm", "post_attention_layernorm", 0},
      {"ffn_norm", "pre_feedforward_layernorm", 0},
      {"ffn_gate", "mlp.gate_proj", 5},
      {"ffn_up", "mlp.up_proj", 5},
      {"ffn_down", "mlp.down_proj", 6},
      {"post_ffw_norm", "post_feedforward_layernorm", 0},
  };
  for (int i = 0; i < c->n_layers; i++) {
    int q = c->n_heads * D, kv = c->layers[i].n_kv_heads * D, F = c->layers[i].ffn_dim;
    for (size_t k = 0; k < CM_ARRAY_LEN(map); k++) {
      int64_t rows = 0, cols = H;
      switch (map[k].kind) {
      case 1: cols = D; break;
      case 2: rows = q; break;
      case 3: rows = kv; break;
      case 4: rows = H, cols = q; break;
      case 5: rows = F; break;
      case 6: rows = H, cols = F; break;
      default: break;
      }
      snprintf(g, sizeof(g), "blk.%d.%s.weight", i, map[k].g);
      snprintf(h, sizeof(h), "%slayers.%d.%s.weight", P, i, map[k].h);
      if ((rc = plan_add(p, g, h, rows, cols, map[k].kind <= 1, i, tied))) return rc;
    }
  }
  return 0;
}

/* What llama.cpp's Gemma 4 graph (src/models/gemma4.cpp) could not reproduce,
 * or NULL; why[n] holds a sentence with numbers. */
static const char *unsupported_gemma4(const struct md_config *c, char *why, size_t n) {
  if (c->attn_softcap != 0) return "attn_logit_softcapping is set (Gemma 4 has none)";
  const struct md_rope *sl = &c->rope[MD_LAYER_SLIDING];
  if (sl->factor != 1.0) return "sliding layers scale RoPE positions";
  if (sl->rot_pairs != c->head_dim / 2) return "partial RoPE on sliding layers";
  int first = c->n_layers - c->n_kv_shared;
  if (c->n_kv_shared > 0 && (first < 2 || c->layers[first - 1].kind != MD_LAYER_FULL ||
                             c->layers[first - 2].kind != MD_LAYER_SLIDING)) {
    /* llama.cpp's layer_reuse_cb: shared sliding layers read first - 2, full ones first - 1 */
    snprintf(why, n,
             "KV-shared layers: llama.cpp's gemma4 lets them read layer %d (sliding) and %d "
             "(full), but this checkpoint's last storing layers are not sliding then full",
             first - 2, first - 1);
    return why;
  }
  for (int i = 0; i < c->n_layers; i++)
    if (c->layers[i].ffn_dim != c->ffn && !c->layers[i].kv_shared)
      return "layers of different MLP widths";
  return NULL;
}

/* What llama.cpp's Gemma 3 graph could not reproduce, or NULL. */
static const char *unsupported(const struct md_config *c, char *why, size_t n) {
  if (c->arch == MD_ARCH_GEMMA4) return unsupported_gemma4(c, why, n);
  if (c->arch != MD_ARCH_GEMMA3) return "only Gemma 3 and Gemma 4 text models are exported";
  /* llama.cpp scales queries by 1/sqrt(head_dim), or 1/sqrt(hidden/heads) at 62 layers */
  double d = c->n_layers == 62 ? (double)c->hidden / c->n_heads : (double)c->head_dim;
  if (fabs(c->attn_scale * sqrt(d) - 1.0) > 1e-9)
    return "query_pre_attn_scalar differs from the one llama.cpp assumes for this shape";
  if (c->attn_softcap != 0) return "attn_logit_softcapping is set (Gemma 3 has none)";
  if (c->rope[MD_LAYER_SLIDING].factor != 1.0) return "sliding layers scale RoPE positions";
  for (int k = 0; k < 2; k++)
    if (c->rope[k].rot_pairs != c->head_dim / 2) return "partial RoPE";
  for (int i = 0; i < c->n_layers; i++)
    if (c->layers[i].head_dim != c->head_dim || c->layers[i].n_kv_heads != c->n_kv_heads ||
        c->layers[i].ffn_dim != c->ffn || c->layers[i].kv_shared)
      return "layers of different shapes";
  return NULL;
}

/* tokenizer.ggml.merges: tokenizer.json's merges in order as "left right",
 * those of tokens inside the vocabulary written. 0, or 1 with o failed. */
static int write_merges(struct gg_out *o, const struct tk_tokenizer *tok, int32_t vocab) {
  int32_t nm = tk_n_merges(tok);
  int32_t *lr = malloc(sizeof(int32_t) * 2 * (size_t)(nm > 0 ? nm : 1));
  if (!lr) return o->failed = 1;
  tk_merge_pairs(tok, lr);
  uint64_t n = 0;
  for (int32_t i = 0; i < nm; i++)
    n += lr[2 * i] >= 0 && lr[2 * i] < vocab && lr[2 * i + 1] >= 0 && lr[2 * i + 1] < vocab;
  kv_key(o, "tokenizer.ggml.merges", GG_ARR);
  put_u32(o, GG_STR);
  put_u64(o, n);
  for (int32_t i = 0; i < nm; i++) {
    if (lr[2 * i] < 0 || lr[2 * i] >= vocab || lr[2 * i + 1] < 0 || lr[2 * i + 1] >= vocab)
      continue;
    size_t ll, rl;
    const char *l = tk_token_str(tok, lr[2 * i], &ll), *r = tk_token_str(tok, lr[2 * i + 1], &rl);
    put_u64(o, ll + 1 + rl);
    put(o, l, ll);
    put(o, " ", 1);
    put(o, r, rl);
  }
  free(lr);
  return 0;
}

/* A GGUF input's tokenizer.* pairs, as they are (llama.cpp's quantizer keeps its
 * input's metadata): its scores, merges and chat template stay the file's own. 1
 * when it had any. */
static int copy_tokenizer_kv(struct gg_out *o, const struct md_gguf *src) {
  int n = 0;
  for (int i = 0; i < md_gguf_kv_count(src); i++) {
    const struct md_gguf_kv *kv = md_gguf_kv_at(src, i);
    if (strncmp(kv->key, "tokenizer.", 10) != 0) continue;
    kv_key(o, kv->key, (uint32_t)kv->type);
    if (kv->type == MD_GGUF_ARRAY) {
      put_u32(o, (uint32_t)kv->arr_type);
      put_u64(o, kv->n);
    }
    put(o, kv->val, (size_t)kv->bytes);
    n++;
  }
  return n > 0;
}

/* The key-value pairs (into o, which counts them); a GGUF input's (src) own
 * tokenizer pairs in place of tok's. */
static void write_kv(struct gg_out *o, const struct md_config *c, const struct gg_plan *p,
                     const struct tk_tokenizer *tok, const char *tmpl, const char *name,
                     const struct md_gguf *src) {
  int full_scaled = c->rope[MD_LAYER_FULL].factor != 1.0;
  /* the block format when any matrix is in it, else the 16-bit type kept */
  int ft = FT_ALL_F32, quantized = 0;
  for (int i = 0; i < p->n; i++)
    if (p->t[i].nd >= 2 && p->t[i].type != GGML_F32) {
      quantized |= p->t[i].qdt >= 0;
      if (p->t[i].qdt < 0) ft = p->t[i].type == GGML_BF16 ? FT_MOSTLY_BF16 : FT_MOSTLY_F16;
    }
  if (quantized) ft = qtypes[p->qt].ftype;
  const char *A = c->arch == MD_ARCH_GEMMA4 ? "gemma4" : "gemma3";
  char k[96];
#define AK(rest) (snprintf(k, sizeof(k), "%s.%s", A, rest), k)
  kv_str(o, "general.architecture", A);
  kv_str(o, "general.name", name);
  kv_u32(o, "general.file_type", (uint32_t)ft);
  kv_u32(o, "general.alignment", GG_ALIGN);
  kv_u32(o, AK("context_length"), (uint32_t)c->max_pos);
  kv_u32(o, AK("embedding_length"), (uint32_t)c->hidden);
  kv_u32(o, AK("block_count"), (uint32_t)c->n_layers);
  /* a number, or one per layer where layers differ (Gemma 4's double-wide MLP of
     KV-shared layers, its full layers' own KV heads), as the converter writes them */
  uint32_t ffn[MD_MAX_LAYERS], kvh[MD_MAX_LAYERS];
  int ffn_vary = 0, kv_vary = 0;
  for (int i = 0; i < c->n_layers; i++) {
    ffn[i] = (uint32_t)c->layers[i].ffn_dim;
    kvh[i] = (uint32_t)c->layers[i].n_kv_heads;
    ffn_vary |= ffn[i] != ffn[0];
    kv_vary |= kvh[i] != kvh[0];
  }
  kv_u32s(o, AK("feed_forward_length"), ffn, ffn_vary ? c->n_layers : 1);
  kv_u32(o, AK("attention.head_count"), (uint32_t)c->n_heads);
  kv_u32s(o, AK("attention.head_count_kv"), kvh, kv_vary ? c->n_layers : 1);
  /* Gemma 4: key_length is the full layers' head dim, key_length_swa the sliding layers' */
  int D = c->arch == MD_ARCH_GEMMA4 ? c->global_head_dim : c->head_dim;
  kv_u32(o, AK("attention.key_length"), (uint32_t)D);
  kv_u32(o, AK("attention.value_length"), (uint32_t)D);
  if (c->arch == MD_ARCH_GEMMA4) {
    kv_u32(o, AK("attention.key_length_swa"), (uint32_t)c->head_dim);
    kv_u32(o, AK("attention.value_length_swa"), (uint32_t)c->head_dim);
    kv_u32(o, AK("rope.dimension_count"), (uint32_t)c->global_head_dim);
    kv_u32(o, AK("rope.dimension_count_swa"), (uint32_t)c->head_dim);
    kv_u32(o, AK("attention.shared_kv_layers"), (uint32_t)c->n_kv_shared);
    kv_u32(o, AK("embedding_length_per_layer_input"), (uint32_t)c->ple_dim);
    if (c->moe) {
      kv_u32(o, AK("expert_count"), (uint32_t)c->n_experts);
      kv_u32(o, AK("expert_used_count"), (uint32_t)c->top_k_experts);
      kv_u32(o, AK("expert_feed_forward_length"), (uint32_t)c->moe_ffn);
    }
  }
  kv_f32(o, AK("attention.layer_norm_rms_epsilon"), (float)c->eps);
  kv_u32(o, AK("attention.sliding_window"), (uint32_t)c->sliding_window);
  kv_key(o, AK("attention.sliding_window_pattern"), GG_ARR);
  put_u32(o, GG_BOOL);
  put_u64(o, (uint64_t)c->n_layers);
  for (int i = 0; i < c->n_layers; i++) {
    uint8_t swa = c->layers[i].kind == MD_LAYER_SLIDING;
    put(o, &swa, 1);
  }
  kv_f32(o, AK("rope.freq_base"), (float)c->rope[MD_LAYER_FULL].theta);
  kv_f32(o, AK("rope.freq_base_swa"), (float)c->rope[MD_LAYER_SLIDING].theta);
  if (full_scaled) {
    kv_str(o, AK("rope.scaling.type"), "linear");
    kv_f32(o, AK("rope.scaling.factor"), (float)c->rope[MD_LAYER_FULL].factor);
  }
  /* llama.cpp's gemma4 takes 30 when the key is absent: 0 (none) is written */
  if (c->final_softcap != 0 || c->arch == MD_ARCH_GEMMA4)
    kv_f32(o, AK("final_logit_softcapping"), (float)c->final_softcap);
  if (src && copy_tokenizer_kv(o, src)) return;
  if (!tok) {
    kv_str(o, "tokenizer.ggml.model", "no_vocab");
    kv_u32(o, AK("vocab_size"), (uint32_t)c->vocab);
    return;
  }
#undef AK
  int32_t nt = tk_n_vocab(tok);
  const int bpe = c->arch == MD_ARCH_GEMMA4; /* llama.cpp's converter's Gemma 4 vocabulary */
  kv_str(o, "tokenizer.ggml.model", bpe ? "gemma4" : "llama");
  kv_key(o, "tokenizer.ggml.tokens", GG_ARR);
  put_u32(o, GG_STR);
  put_u64(o, (uint64_t)c->vocab);
  for (int32_t id = 0; id < c->vocab; id++) {
    size_t len = 0;
    const char *s = id < nt ? tk_token_str(tok, id, &len) : NULL;
    char pad[32];
    if (!s) {
      len = (size_t)snprintf(pad, sizeof(pad), "<pad_%d>", (int)id);
      s = pad;
    }
    put_u64(o, len);
    put(o, s, len);
  }
  /* scores: minus the rank of the first merge that makes the piece (pieces no merge
   * makes: below every merge), so that merges ordered by score are tokenizer.json's */
  int32_t *ranks = malloc(sizeof(int32_t) * (size_t)(nt > 0 ? nt : 1));
  if (!ranks) {
    o->failed = 1;
    return;
  }
  tk_merge_ranks(tok, ranks);
  kv_key(o, "tokenizer.ggml.scores", GG_ARR);
  put_u32(o, GG_F32);
  put_u64(o, (uint64_t)c->vocab);
  for (int32_t id = 0; id < c->vocab; id++) {
    float score = id < nt && ranks[id] >= 0 ? -(float)ranks[id] : -1e9f;
    if (bpe) score = id < nt && tk_is_special(tok, id) ? -1000.0f : 0.0f; /* unused by BPE */
    put(o, &score, 4);
  }
  free(ranks);
  if (bpe && write_merges(o, tok, c->vocab)) return;
  kv_key(o, "tokenizer.ggml.token_type", GG_ARR);
  put_u32(o, GG_I32);
  put_u64(o, (uint64_t)c->vocab);
  for (int32_t id = 0; id < c->vocab; id++) {
    int32_t type = TT_NORMAL;
    if (id < nt && tk_is_special(tok, id))
      type = TT_CONTROL;
    else if (id < nt && tk_is_added(tok, id))
      type = TT_USER;
    else if (id < nt && tk_byte_value(tok, id) >= 0)
      type = TT_BYTE;
    put(o, &type, 4);
  }
  static const char *names[] = {"bos", "eos", "unknown", "padding"};
  int32_t ids[] = {tk_bos(tok), tk_eos(tok), tk_unk(tok), tk_pad(tok)};
  for (int i = 0; i < 4; i++)
    if (ids[i] >= 0) {
      char key[64];
      snprintf(key, sizeof(key), "tokenizer.ggml.%s_token_id", names[i]);
      kv_u32(o, key, (uint32_t)ids[i]);
    }
  kv_key(o, "tokenizer.ggml.add_bos_token", GG_BOOL);
  put(o, "\1", 1);
  kv_key(o, "tokenizer.ggml.add_space_prefix", GG_BOOL);
  put(o, "\0", 1);
  if (tmpl) kv_str(o, "tokenizer.chat_template", tmpl);
}

/* A part of a file's tensors, [i0, i1) of the plan's: with count > 1, part
 * no (from 0) of a model split in count files, as llama.cpp's gguf-split
 * writes them (the metadata in the first; split.no, split.count and
 * split.tensors.count in each). */
struct gg_part {
  int i0, i1, no, count;
};

/* The fixed header, the pairs kv_n of them in kv (the first part's) and the
 * split's keys, the part's tensor infos. */
static void write_header(struct gg_out *o, const struct gg_plan *p, const struct gg_part *pt,
                         const char *kv, size_t kv_len, int kv_n) {
  const int split = pt->count > 1;
  if (pt->no) kv_len = 0, kv_n = 0;
  put(o, "GGUF", 4);
  put_u32(o, 3);
  put_u64(o, (uint64_t)(pt->i1 - pt->i0));
  put_u64(o, (uint64_t)kv_n + (split ? 3 : 0));
  put(o, kv, kv_len);
  if (split) {
    const uint16_t no = (uint16_t)pt->no, count = (uint16_t)pt->count;
    kv_key(o, "split.no", GG_U16);
    put(o, &no, 2);
    kv_key(o, "split.count", GG_U16);
    put(o, &count, 2);
    kv_key(o, "split.tensors.count", GG_I32);
    put(o, &(int32_t){p->n}, 4);
  }
  for (int i = pt->i0; i < pt->i1; i++) {
    const struct gg_tensor *t = &p->t[i];
    put_str(o, t->name);
    put_u32(o, (uint32_t)t->nd);
    for (int d = 0; d < t->nd; d++)
      put_u64(o, t->ne[d]);
    put_u32(o, (uint32_t)t->type);
    put_u64(o, t->off);
  }
}

static void pad_to(struct gg_out *o, uint64_t *pos, uint64_t align) {
  static const char zeros[GG_ALIGN];
  uint64_t n = (align - *pos % align) % align;
  put(o, zeros, (size_t)n);
  *pos += n;
}

/* Writes one tensor's data: as it is, quantized row by row, or converted to
 * f32 (+1 for norms). */
static void write_data(struct gg_out *o, const struct gg_tensor *t) {
  const struct md_tensor *s = t->src;
  if (!s) {
    put(o, t->gen, (size_t)t->bytes);
    return;
  }
  if (t->qdt >= 0) {
    CM_ASSERT(!t->xf); /* blocks are written from rows as they are */
    enum kn_dtype dt = (enum kn_dtype)t->qdt;
    size_t K = (size_t)t->ne[0], rb = kn_row_bytes(dt, K);
    float *row = malloc(sizeof(float) * K);
    uint8_t *q = malloc(rb);
    if (!row || !q) o->failed = 1;
    for (uint64_t r = 0; r < t->ne[1] * t->ne[2] && !o->failed; r++) {
      for (size_t k = 0; k < K; k++)
        row[k] = kn_load_f32(s->data, (enum kn_dtype)s->dtype, (size_t)r * K + k);
      if (kn_quantize_row(dt, row, q, K)) o->failed = 1;
      put(o, q, rb);
    }
    free(row);
    free(q);
    return;
  }
  if (t->type == ggml_type_of(s->dtype) && !t->norm && !t->xf) {
    put(o, s->data, s->nbytes);
    return;
  }
  float buf[4096];
  uint16_t half[4096];
  size_t n = (size_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
  size_t pp = (size_t)(t->ne[0] * t->ne[1]); /* XF_PATCH: pixels a patch */
  for (size_t i = 0; i < n && !o->failed;) {
    size_t m = n - i < CM_ARRAY_LEN(buf) ? n - i : CM_ARRAY_LEN(buf);
    for (size_t k = 0; k < m; k++) {
      size_t at = i + k;
      if (t->xf == XF_PATCH) { /* [d][c][e] written from [d][e][c] */
        size_t d = at / (3 * pp), c = at / pp % 3, e = at % pp;
        at = d * 3 * pp + e * 3 + c;
      }
      double v = kn_load_f32(s->data, (enum kn_dtype)s->dtype, at);
      if (t->xf == XF_SOFTPLUS) v = v > 30 ? v : log1p(exp(v));
      buf[k] = t->norm ? t->shift + (float)v : (float)v;
      half[k] = kn_f32_to_f16(buf[k]);
    }
    if (t->type == GGML_F16)
      put(o, half, m * sizeof(uint16_t));
    else
      put(o, buf, m * sizeof(float));
    i += m;
  }
}

/* Writes part pt of the file to out: the header (kv_n pairs in kv), then its
 * tensors, each aligned; written beside out and renamed, so a failed run
 * leaves no half file. *bytes: the file's size. */
static int write_part(const char *out, struct gg_plan *p, const struct gg_part *pt, const char *kv,
                      size_t kv_len, int kv_n, uint64_t *bytes, char *err, size_t errlen) {
  uint64_t off = 0;
  for (int i = pt->i0; i < pt->i1; i++) {
    p->t[i].off = off;
    off += (p->t[i].bytes + GG_ALIGN - 1) / GG_ALIGN * GG_ALIGN;
  }
  char tmp[4300];
  snprintf(tmp, sizeof(tmp), "%s.tmp%ld", out, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) return cm_fail(err, errlen, CM_ERR_IO, "%s: cannot create", tmp);
  struct gg_out o = {f, 0, 0};
  write_header(&o, p, pt, kv, kv_len, kv_n);
  uint64_t pos = (uint64_t)ftell(f);
  pad_to(&o, &pos, GG_ALIGN);
  for (int i = pt->i0; i < pt->i1 && !o.failed; i++) {
    write_data(&o, &p->t[i]);
    pos += p->t[i].bytes;
    pad_to(&o, &pos, GG_ALIGN);
  }
  if (fclose(f) != 0) o.failed = 1;
  if (o.failed || rename(tmp, out) != 0) {
    unlink(tmp);
    return cm_fail(err, errlen, CM_ERR_IO, "%s: write failed (disk full?)", out);
  }
  *bytes = pos;
  return 0;
}

/* Where a file's tensors are cut into parts (--split-max-size,
 * --split-max-tensors; 0: no limit), as llama.cpp's gguf-split cuts: a part
 * takes the next tensor while it stays within both (a tensor larger than the
 * size is a part of its own). */
struct gg_split {
  uint64_t max_bytes;
  int max_tensors;
};

/* Writes p to out, in one file or, where split cuts it in more, in the parts
 * OUT-00001-of-0000N.gguf .. (out less .gguf); a failure removes the parts
 * written. *bytes: all the files' size; *n_files: how many. */
static int write_file(const char *out, struct gg_plan *p, const struct gg_split *split,
                      const char *kv, size_t kv_len, int kv_n, uint64_t *bytes, int *n_files,
                      char *err, size_t errlen) {
  int count = 0, *start = malloc(sizeof(int) * (size_t)(p->n + 1));
  if (!start) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  uint64_t used = 0;
  for (int i = 0, n = 0; i < p->n; i++, n++) { /* each part's first tensor */
    const uint64_t b = (p->t[i].bytes + GG_ALIGN - 1) / GG_ALIGN * GG_ALIGN;
    if (i == 0 || (split && ((split->max_tensors && n == split->max_tensors) ||
                             (split->max_bytes && used + b > split->max_bytes)))) {
      start[count++] = i;
      n = 0;
      used = 0;
    }
    used += b;
  }
  if (!count) start[count++] = 0;
  start[count] = p->n;
  size_t ol = strlen(out);
  int rc = 0;
  if (count > 1 && (ol < 6 || strcmp(out + ol - 5, ".gguf")))
    rc = cm_fail(err, errlen, CM_ERR_INVAL, "%s: a split file's name must end in .gguf", out);
  if (count > MD_GGUF_MAX_SPLITS)
    rc = cm_fail(err, errlen, CM_ERR_INVAL, "%s: %d parts, more than %d", out, count,
                 MD_GGUF_MAX_SPLITS);
  *bytes = 0;
  *n_files = count;
  char path[4200];
  int k = 0;
  for (; k < count && !rc; k++) {
    const struct gg_part pt = {start[k], start[k + 1], k, count};
    if (count > 1)
      snprintf(path, sizeof(path), "%.*s-%05d-of-%05d.gguf", (int)(ol - 5), out, k + 1, count);
    else
      snprintf(path, sizeof(path), "%s", out);
    uint64_t b = 0;
    rc = write_part(path, p, &pt, kv, kv_len, kv_n, &b, err, errlen);
    *bytes += b;
  }
  for (int j = 0; rc && count > 1 && j < k - 1; j++) { /* the parts written before */
    snprintf(path, sizeof(path), "%.*s-%05d-of-%05d.gguf", (int)(ol - 5), out, j + 1, count);
    unlink(path);
  }
  free(start);
  return rc;
}

/* ---- the vision tower as llama.cpp's mmproj file ------------------------------
 * Gemma 3's SigLIP tower and projector as llama.cpp's converter writes them
 * (conversion/gemma.py's Gemma3VisionModel on MmprojModel; tools/mtmd/clip.cpp
 * reads them): general.architecture "clip", general.type "mmproj",
 * clip.has_vision_encoder, clip.projector_type "gemma3", clip.use_gelu, and
 * under clip.vision. projection_dim (the text model's width), image_size,
 * patch_size, embedding_length, feed_forward_length, block_count,
 * attention.head_count, attention.layer_norm_epsilon, image_mean and
 * image_std (f32 arrays), projector.scale_factor only where the pooling is
 * not 4. Tensors: v.patch_embd (the convolution's kernel, 4-D) and
 * v.position_embd in f32 (".embeddings." is forced to f32), v.blk.N.{attn_q,
 * attn_k, attn_v, attn_out, ffn_up (fc1), ffn_down (fc2)} in f16 (f32 with
 * --dtype f32), v.blk.N.ln1 / ln2, v.post_ln and the biases in f32,
 * mm.input_projection as the checkpoint holds it ([D, H], used as x W) in f16
 * whatever is asked, and mm.soft_emb_norm as f32 1 + w. */
enum { VT_F32 = 0, VT_MAT = 1, VT_F16 = 2 };

/* Adds checkpoint tensor hname as gname, of shape dims[nd] (outermost first),
 * written as `how` asks; shift is added to every value (an f32 tensor). */
static int plan_vision(struct gg_plan *p, const char *gname, const char *hname, int nd,
                       const int64_t *dims, int how, float shift) {
  struct gg_tensor *t;
  int rc = plan_take(p, gname, hname, nd, dims, &t);
  if (rc) return rc;
  t->norm = how == VT_F32;
  t->shift = shift;
  t->type = how == VT_F32 || (how == VT_MAT && p->to_f32) ? GGML_F32 : GGML_F16;
  t->bytes = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3] * type_size(t->type);
  if (how == VT_MAT && p->mm_q8 && nd == 2 && dims[1] % 32 == 0) { /* else f16, as llama.cpp */
    t->qdt = KN_DTYPE_Q8_0;
    t->type = ggml_block_type(KN_DTYPE_Q8_0);
    t->bytes = (uint64_t)dims[0] * kn_row_bytes(KN_DTYPE_Q8_0, (size_t)dims[1]);
  }
  return 0;
}

static int plan_mmproj(struct gg_plan *p, const struct md_config *c) {
  const struct md_vision_cfg *v = &c->vision;
  static const char *const vps[] = {"model.vision_tower.vision_model.",
                                    "vision_tower.vision_model."};
  static const char *const pps[] = {"model.multi_modal_projector.", "multi_modal_projector."};
  int at = md_st_find(p->st, "model.vision_tower.vision_model.post_layernorm.weight") ? 0 : 1;
  const char *VP = vps[at], *PP = pps[at];
  int64_t D = v->hidden, F = v->ffn, P = v->patch;
  char h[192], g[64];
  int rc = 0;
  snprintf(h, sizeof(h), "%sembeddings.patch_embedding.weight", VP);
  if ((rc = plan_vision(p, "v.patch_embd.weight", h, 4, (const int64_t[]){D, v->channels, P, P},
                        VT_F32, 0)))
    return rc;
  snprintf(h, sizeof(h), "%sembeddings.patch_embedding.bias", VP);
  if ((rc = plan_vision(p, "v.patch_embd.bias", h, 1, (const int64_t[]){D}, VT_F32, 0))) return rc;
  snprintf(h, sizeof(h), "%sembeddings.position_embedding.weight", VP);
  if ((rc = plan_vision(p, "v.position_embd.weight", h, 2, (const int64_t[]){v->n_patches, D},
                        VT_F32, 0)))
    return rc;
  static const struct {
    const char *g, *h;
    int kind; /* 0: [D, D]; 1: fc1 [F, D]; 2: fc2 [D, F]; 3: a layer norm [D] */
  } map[] = {
      {"attn_q", "self_attn.q_proj", 0}, {"attn_k", "self_attn.k_proj", 0},
      {"attn_v", "self_attn.v_proj", 0}, {"attn_out", "self_attn.out_proj", 0},
      {"ffn_up", "mlp.fc1", 1},          {"ffn_down", "mlp.fc2", 2},
      {"ln1", "layer_norm1", 3},         {"ln2", "layer_norm2", 3},
  };
  for (int i = 0; i < v->n_layers && !rc; i++)
    for (size_t k = 0; k < CM_ARRAY_LEN(map) && !rc; k++) {
      int64_t rows = map[k].kind == 1 ? F : D, cols = map[k].kind == 2 ? F : D;
      for (int bias = 0; bias < 2 && !rc; bias++) {
        const char *part = bias ? "bias" : "weight";
        snprintf(g, sizeof(g), "v.blk.%d.%s.%s", i, map[k].g, part);
        snprintf(h, sizeof(h), "%sencoder.layers.%d.%s.%s", VP, i, map[k].h, part);
        if (map[k].kind == 3 || bias)
          rc = plan_vision(p, g, h, 1, (const int64_t[]){rows}, VT_F32, 0);
        else
          rc = plan_vision(p, g, h, 2, (const int64_t[]){rows, cols}, VT_MAT, 0);
      }
    }
  for (int bias = 0; bias < 2 && !rc; bias++) {
    snprintf(g, sizeof(g), "v.post_ln.%s", bias ? "bias" : "weight");
    snprintf(h, sizeof(h), "%spost_layernorm.%s", VP, bias ? "bias" : "weight");
    rc = plan_vision(p, g, h, 1, (const int64_t[]){D}, VT_F32, 0);
  }
  if (rc) return rc;
  snprintf(h, sizeof(h), "%smm_input_projection_weight", PP);
  if ((rc = plan_vision(p, "mm.input_projection.weight", h, 2, (const int64_t[]){D, c->hidden},
                        VT_F16, 0)))
    return rc;
  snprintf(h, sizeof(h), "%smm_soft_emb_norm.weight", PP);
  return plan_vision(p, "mm.soft_emb_norm.weight", h, 1, (const int64_t[]){D}, VT_F32, 1.0f);
}

static void kv_f32s(struct gg_out *o, const char *key, const float *v, int n) {
  kv_key(o, key, GG_ARR);
  put_u32(o, GG_F32);
  put_u64(o, (uint64_t)n);
  put(o, v, sizeof(float) * (size_t)n);
}

/* The general.* pairs of an mmproj file. */
static void write_kv_clip(struct gg_out *o, const struct gg_plan *p, const char *name) {
  kv_str(o, "general.architecture", "clip");
  kv_str(o, "general.type", "mmproj");
  kv_str(o, "general.name", name);
  kv_u32(o, "general.file_type", p->mm_q8 ? 7u : p->to_f32 ? FT_ALL_F32 : FT_MOSTLY_F16);
  kv_u32(o, "general.alignment", GG_ALIGN);
}

/* A vision tower's clip.vision.* pairs (both generations): the text model's
 * width H, then the tower's. */
struct kv_vision {
  int H, image, patch, D, F, layers, heads;
  double eps;
  const float *mean, *std;
  int channels;
  int pool, pool_default; /* projector.scale_factor written where they differ */
};

static void write_kv_vision(struct gg_out *o, const struct kv_vision *v) {
  kv_key(o, "clip.has_vision_encoder", GG_BOOL);
  put(o, "\1", 1);
  kv_u32(o, "clip.vision.projection_dim", (uint32_t)v->H);
  kv_u32(o, "clip.vision.image_size", (uint32_t)v->image);
  kv_u32(o, "clip.vision.patch_size", (uint32_t)v->patch);
  kv_u32(o, "clip.vision.embedding_length", (uint32_t)v->D);
  kv_u32(o, "clip.vision.feed_forward_length", (uint32_t)v->F);
  kv_u32(o, "clip.vision.block_count", (uint32_t)v->layers);
  kv_u32(o, "clip.vision.attention.head_count", (uint32_t)v->heads);
  kv_f32(o, "clip.vision.attention.layer_norm_epsilon", (float)v->eps);
  kv_f32s(o, "clip.vision.image_mean", v->mean, v->channels);
  kv_f32s(o, "clip.vision.image_std", v->std, v->channels);
  if (v->pool != v->pool_default)
    kv_u32(o, "clip.vision.projector.scale_factor", (uint32_t)v->pool);
}

static void write_kv_mmproj(struct gg_out *o, const struct md_config *c, const struct gg_plan *p,
                            const char *name) {
  const struct md_vision_cfg *v = &c->vision;
  write_kv_clip(o, p, name);
  kv_str(o, "clip.projector_type", "gemma3");
  kv_key(o, "clip.use_gelu", GG_BOOL);
  put(o, "\1", 1);
  write_kv_vision(o, &(struct kv_vision){c->hidden, v->image_size, v->patch, v->hidden, v->ffn,
                                         v->n_layers, v->n_heads, v->eps, v->pre.mean, v->pre.std,
                                         v->channels, v->pool, 4});
}

/* ---- Gemma 4's towers as llama.cpp's mmproj file ------------------------------
 * As conversion/gemma.py's Gemma4VisionAudioModel writes them (clip.cpp's
 * gemma4v and gemma4a read them; model/md-tensors-gguf.c maps the names
 * back): general.architecture "clip", general.type "mmproj"; for the vision
 * tower clip.has_vision_encoder, clip.vision.projector_type "gemma4v" and
 * under clip.vision. projection_dim, image_size (224, as the converter forces
 * it: unused), patch_size, embedding_length, feed_forward_length,
 * block_count, attention.head_count, attention.layer_norm_epsilon, image_mean
 * 0 and image_std 1 (Gemma4ImageProcessor does not normalise),
 * projector.scale_factor only where the pooling is not 3; for the audio
 * tower clip.has_audio_encoder, clip.audio.projector_type "gemma4a" and under
 * clip.audio. projection_dim, embedding_length, feed_forward_length (4 x the
 * width), block_count, attention.head_count, num_mel_bins (128) and
 * attention.layer_norm_epsilon 1e-5 (the converter's constant). Tensors:
 * v.patch_embd as a convolution's kernel [D, 3, p, p] (f16, or f32 with
 * --dtype f32), v.position_embd in f32, v.std_bias / v.std_scale, per layer
 * v.blk.N.{attn_q, attn_k, attn_v, attn_out, ffn_gate, ffn_up, ffn_down}
 * (f16 or f32) with their clip bounds (.input_min ... as [1] f32),
 * attn_q_norm, attn_k_norm, ln1, attn_post_norm, ln2, ffn_post_norm (f32),
 * mm.input_projection (the embedder's projection); a.conv1d.{0,1}.weight and
 * .norm.weight and a.input_projection in f32 (the converter forces the
 * subsampling's tensors to f32), per layer a.blk.N.{ffn_norm, ffn_up,
 * ffn_down, ffn_post_norm, and the same with _1, attn_pre_norm, attn_q,
 * attn_k, attn_v, attn_out, attn_k_rel, per_dim_scale (softplus applied),
 * attn_post_norm, conv_norm (lconv1d.pre_layer_norm), conv_pw1, conv_dw
 * ([C, K], f32), norm_conv (lconv1d.conv_norm), conv_pw2, ln2},
 * a.pre_encode.out (output_proj, weight and bias) and mm.a.input_projection. */

/* A Gemma4ClippableLinear HP [rows, cols] as GP (its weight as `how`) and,
 * when clipped, its four bounds. */
static int plan_clin(struct gg_plan *p, const char *gp, const char *hp, int64_t rows, int64_t cols,
                     int clipped) {
  static const char *const bound[] = {"input_min", "input_max", "output_min", "output_max"};
  char g[128], h[192];
  snprintf(g, sizeof(g), "%s.weight", gp);
  snprintf(h, sizeof(h), "%s.linear.weight", hp);
  int rc = plan_vision(p, g, h, 2, (const int64_t[]){rows, cols}, VT_MAT, 0);
  for (int i = 0; i < 4 && clipped && !rc; i++) {
    snprintf(g, sizeof(g), "%s.%s", gp, bound[i]);
    snprintf(h, sizeof(h), "%s.%s", hp, bound[i]);
    rc = plan_vision(p, g, h, 1, (const int64_t[]){1}, VT_F32, 0);
  }
  return rc;
}

/* A vector [n] named by formats, in f32. */
static int plan_vec(struct gg_plan *p, int64_t n, const char *g, const char *h) {
  return plan_vision(p, g, h, 1, (const int64_t[]){n}, VT_F32, 0);
}

static int plan_vision_g4(struct gg_plan *p, const struct md_config *c) {
  const struct md_vision_g4_cfg *v = &c->vision_g4;
  const char *VP = "model.vision_tower.";
  int64_t D = v->hidden, F = v->ffn, P = v->patch, hd = v->head_dim;
  int64_t qd = (int64_t)v->n_heads * hd, kvd = (int64_t)v->n_kv_heads * hd;
  char g[96], h[192];
  snprintf(h, sizeof(h), "%spatch_embedder.input_proj.weight", VP);
  /* the converter: f16 in a file of f16, else f32 */
  int rc = plan_vision(p, "v.patch_embd.weight", h, 2, (const int64_t[]){D, 3 * P * P},
                       p->mm_q8 ? VT_F32 : VT_MAT, 0);
  if (rc) return rc;
  struct gg_tensor *t = &p->t[p->n - 1]; /* written as the convolution's kernel [D, 3, P, P] */
  t->xf = XF_PATCH;
  t->nd = 4;
  t->ne[0] = t->ne[1] = (uint64_t)P;
  t->ne[2] = 3;
  t->ne[3] = (uint64_t)D;
  snprintf(h, sizeof(h), "%spatch_embedder.position_embedding_table", VP);
  if ((rc = plan_vision(p, "v.position_embd.weight", h, 3, (const int64_t[]){2, v->pos_size, D},
                        VT_F32, 0)))
    return rc;
  static const struct {
    const char *g, *h;
    int kind; /* 0 q, 1 k / v, 2 o, 3 gate / up, 4 down */
  } lin[] = {{"attn_q", "self_attn.q_proj", 0}, {"attn_k", "self_attn.k_proj", 1},
             {"attn_v", "self_attn.v_proj", 1}, {"attn_out", "self_attn.o_proj", 2},
             {"ffn_gate", "mlp.gate_proj", 3},  {"ffn_up", "mlp.up_proj", 3},
             {"ffn_down", "mlp.down_proj", 4}};
  static const char *const norms[][2] = {
      {"ln1", "input_layernorm"},           {"attn_post_norm", "post_attention_layernorm"},
      {"ln2", "pre_feedforward_layernorm"}, {"ffn_post_norm", "post_feedforward_layernorm"},
      {"attn_q_norm", "self_attn.q_norm"},  {"attn_k_norm", "self_attn.k_norm"}};
  for (int i = 0; i < v->n_layers && !rc; i++) {
    for (size_t k = 0; k < CM_ARRAY_LEN(lin) && !rc; k++) {
      const int64_t rows[] = {qd, kvd, D, F, D}, cols[] = {D, D, qd, D, F};
      char gp[64], hp[160];
      snprintf(gp, sizeof(gp), "v.blk.%d.%s", i, lin[k].g);
      snprintf(hp, sizeof(hp), "%sencoder.layers.%d.%s", VP, i, lin[k].h);
      rc = plan_clin(p, gp, hp, rows[lin[k].kind], cols[lin[k].kind], v->clipped_linears);
    }
    for (size_t k = 0; k < CM_ARRAY_LEN(norms) && !rc; k++) {
      snprintf(g, sizeof(g), "v.blk.%d.%s.weight", i, norms[k][0]);
      snprintf(h, sizeof(h), "%sencoder.layers.%d.%s.weight", VP, i, norms[k][1]);
      rc = plan_vec(p, k < 4 ? D : hd, g, h);
    }
  }
  if (!rc && v->standardize) {
    snprintf(h, sizeof(h), "%sstd_bias", VP);
    if (!(rc = plan_vec(p, D, "v.std_bias", h))) {
      snprintf(h, sizeof(h), "%sstd_scale", VP);
      rc = plan_vec(p, D, "v.std_scale", h);
    }
  }
  return rc ? rc
            : plan_vision(p, "mm.input_projection.weight",
                          "model.embed_vision.embedding_projection.weight", 2,
                          (const int64_t[]){c->hidden, D}, VT_MAT, 0);
}

static int plan_audio_g4(struct gg_plan *p, const struct md_config *c) {
  const struct md_audio_g4_cfg *a = &c->audio_g4;
  const char *AP = "model.audio_tower.";
  int64_t D = a->hidden, C0 = a->conv_ch[0], C1 = a->conv_ch[1], O = a->output_dims;
  char g[96], h[192];
  struct gg_tensor *t;
  int rc = 0;
  for (int i = 0; i < 2 && !rc; i++) {
    int64_t oc = i ? C1 : C0, ic = i ? C0 : 1;
    snprintf(g, sizeof(g), "a.conv1d.%d.weight", i);
    snprintf(h, sizeof(h), "%ssubsample_conv_projection.layer%d.conv.weight", AP, i);
    if ((rc = plan_vision(p, g, h, 4, (const int64_t[]){oc, ic, 3, 3}, VT_F32, 0))) break;
    snprintf(g, sizeof(g), "a.conv1d.%d.norm.weight", i);
    snprintf(h, sizeof(h), "%ssubsample_conv_projection.layer%d.norm.weight", AP, i);
    rc = plan_vec(p, oc, g, h);
  }
  snprintf(h, sizeof(h), "%ssubsample_conv_projection.input_proj_linear.weight", AP);
  if (rc || (rc = plan_vision(p, "a.input_projection.weight", h, 2,
                              (const int64_t[]){D, C0 / 4 * C1}, VT_F32, 0)))
    return rc;
  static const struct {
    const char *g, *h;
    int kind; /* 0 [4D, D], 1 [D, 4D], 2 [D, D], 3 [2D, D] */
  } lin[] = {{"ffn_up", "feed_forward1.ffw_layer_1", 0},
             {"ffn_down", "feed_forward1.ffw_layer_2", 1},
             {"ffn_up_1", "feed_forward2.ffw_layer_1", 0},
             {"ffn_down_1", "feed_forward2.ffw_layer_2", 1},
             {"attn_q", "self_attn.q_proj", 2},
             {"attn_k", "self_attn.k_proj", 2},
             {"attn_v", "self_attn.v_proj", 2},
             {"attn_out", "self_attn.post", 2},
             {"conv_pw1", "lconv1d.linear_start", 3},
             {"conv_pw2", "lconv1d.linear_end", 2}};
  static const char *const norms[][2] = {{"ffn_norm", "feed_forward1.pre_layer_norm"},
                                         {"ffn_post_norm", "feed_forward1.post_layer_norm"},
                                         {"ffn_norm_1", "feed_forward2.pre_layer_norm"},
                                         {"ffn_post_norm_1", "feed_forward2.post_layer_norm"},
                                         {"attn_pre_norm", "norm_pre_attn"},
                                         {"attn_post_norm", "norm_post_attn"},
                                         {"conv_norm", "lconv1d.pre_layer_norm"},
                                         {"norm_conv", "lconv1d.conv_norm"},
                                         {"ln2", "norm_out"}};
  for (int i = 0; i < a->n_layers && !rc; i++) {
    char lp[96];
    snprintf(lp, sizeof(lp), "%slayers.%d.", AP, i);
    for (size_t k = 0; k < CM_ARRAY_LEN(lin) && !rc; k++) {
      const int64_t rows[] = {4 * D, D, D, 2 * D}, cols[] = {D, 4 * D, D, D};
      char gp[64], hp[192];
      snprintf(gp, sizeof(gp), "a.blk.%d.%s", i, lin[k].g);
      snprintf(hp, sizeof(hp), "%s%s", lp, lin[k].h);
      rc = plan_clin(p, gp, hp, rows[lin[k].kind], cols[lin[k].kind], a->clipped_linears);
    }
    for (size_t k = 0; k < CM_ARRAY_LEN(norms) && !rc; k++) {
      snprintf(g, sizeof(g), "a.blk.%d.%s.weight", i, norms[k][0]);
      snprintf(h, sizeof(h), "%s%s.weight", lp, norms[k][1]);
      rc = plan_vec(p, D, g, h);
    }
    if (rc) break;
    snprintf(g, sizeof(g), "a.blk.%d.attn_k_rel.weight", i);
    snprintf(h, sizeof(h), "%sself_attn.relative_k_proj.weight", lp);
    if ((rc = plan_vision(p, g, h, 2, (const int64_t[]){D, D}, VT_MAT, 0))) break;
    snprintf(g, sizeof(g), "a.blk.%d.per_dim_scale.weight", i);
    snprintf(h, sizeof(h), "%sself_attn.per_dim_scale", lp);
    if ((rc = plan_vec(p, D / a->n_heads, g, h))) break;
    p->t[p->n - 1].xf = XF_SOFTPLUS;
    snprintf(g, sizeof(g), "a.blk.%d.conv_dw.weight", i);
    snprintf(h, sizeof(h), "%slconv1d.depthwise_conv1d.weight", lp);
    if ((rc = plan_vision(p, g, h, 3, (const int64_t[]){D, 1, a->conv_kernel}, VT_F32, 0))) break;
    t = &p->t[p->n - 1]; /* [C, 1, K] written as [C, K] */
    t->nd = 2;
    t->ne[1] = (uint64_t)D;
    t->ne[2] = 1;
  }
  if (rc) return rc;
  snprintf(h, sizeof(h), "%soutput_proj.weight", AP);
  if ((rc = plan_vision(p, "a.pre_encode.out.weight", h, 2, (const int64_t[]){O, D}, VT_MAT, 0)))
    return rc;
  snprintf(h, sizeof(h), "%soutput_proj.bias", AP);
  if ((rc = plan_vec(p, O, "a.pre_encode.out.bias", h))) return rc;
  return plan_vision(p, "mm.a.input_projection.weight",
                     "model.embed_audio.embedding_projection.weight", 2,
                     (const int64_t[]){c->hidden, O}, VT_MAT, 0);
}

static void write_kv_mmproj_g4(struct gg_out *o, const struct md_config *c, const struct gg_plan *p,
                               const char *name) {
  write_kv_clip(o, p, name);
  if (c->vision_g4.present) {
    const struct md_vision_g4_cfg *v = &c->vision_g4;
    static const float mean[3] = {0, 0, 0}, std[3] = {1, 1, 1};
    kv_str(o, "clip.vision.projector_type", "gemma4v");
    write_kv_vision(o, &(struct kv_vision){c->hidden, 224, v->patch, v->hidden, v->ffn, v->n_layers,
                                           v->n_heads, v->eps, mean, std, 3, v->pool, 3});
  }
  if (c->audio_g4.present) {
    const struct md_audio_g4_cfg *a = &c->audio_g4;
    kv_key(o, "clip.has_audio_encoder", GG_BOOL);
    put(o, "\1", 1);
    kv_str(o, "clip.audio.projector_type", "gemma4a");
    kv_u32(o, "clip.audio.projection_dim", (uint32_t)c->hidden);
    kv_u32(o, "clip.audio.embedding_length", (uint32_t)a->hidden);
    kv_u32(o, "clip.audio.feed_forward_length", (uint32_t)(4 * a->hidden));
    kv_u32(o, "clip.audio.block_count", (uint32_t)a->n_layers);
    kv_u32(o, "clip.audio.attention.head_count", (uint32_t)a->n_heads);
    kv_u32(o, "clip.audio.num_mel_bins", 128);
    kv_f32(o, "clip.audio.attention.layer_norm_epsilon", 1e-5f);
  }
}

/* What a Gemma 4 mmproj file cannot say of c's towers (their reading,
 * model/md-config-gguf.c, fixes it): 0, or a cm_err naming the field. */
static int mmproj_check_g4(const struct md_config *c, const char *dir, char *err, size_t errlen) {
  const struct md_vision_g4_cfg *v = &c->vision_g4;
  const struct md_audio_g4_cfg *a = &c->audio_g4;
  if (!v->present && !a->present)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "--mmproj: the checkpoint has no Gemma 4 vision or audio tower");
  if (v->present && (v->rope_theta != 100.0 || v->default_tokens != 280))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "--mmproj: vision_config's rope_theta %g / default_output_length %d (an mmproj "
                   "file says neither: llama.cpp takes 100 and 280)",
                   v->rope_theta, v->default_tokens);
  if (v->present && v->bidir != (c->ple_dim ? 0 : 1))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "--mmproj: text_config.use_bidirectional_attention is not what a GGUF model is "
                   "read with (\"vision\" without per-layer embeddings, none with them)");
  if (a->present) {
    struct md_audio_fe_cfg fe, def;
    md_audio_fe_defaults(&def);
    int rc = md_audio_fe_load(dir, &fe, err, errlen);
    if (rc) return rc;
    if (a->chunk != 12 || a->ctx_left != 13 || a->ctx_right != 0 || a->logit_cap != 50.0 ||
        a->residual_weight != 0.5 || a->eps != 1e-6 || a->invalid_logit != -1e9 ||
        a->grad_clip != 1e10)
      return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                     "--mmproj: audio_config's attention_chunk_size, attention_context_left / "
                     "right, attention_logit_cap, residual_weight, rms_norm_eps, "
                     "attention_invalid_logits_value or gradient_clipping is not the default an "
                     "mmproj file is read with");
    if (fe.n_mel != def.n_mel || fe.sampling_rate != def.sampling_rate ||
        fe.frame_length != def.frame_length || fe.hop_length != def.hop_length ||
        fe.fft_length != def.fft_length || fe.min_frequency != def.min_frequency ||
        fe.max_frequency != def.max_frequency || fe.preemphasis != def.preemphasis ||
        fe.input_scale != def.input_scale || fe.mel_floor != def.mel_floor ||
        fe.max_samples != def.max_samples || fe.pad_multiple != def.pad_multiple || fe.has_mean ||
        fe.has_stddev)
      return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                     "--mmproj: the feature extractor is not Gemma4AudioFeatureExtractor's "
                     "defaults (an mmproj file holds only the mel bins)");
  }
  return 0;
}

/* Whether c's tower can be written as an mmproj file: 0, or a cm_err with
 * the reason (checked before anything is written). */
static int mmproj_check(const struct md_config *c, const char *dir, char *err, size_t errlen) {
  if (c->arch == MD_ARCH_GEMMA4) return mmproj_check_g4(c, dir, err, errlen);
  if (!c->vision.present)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "--mmproj: the checkpoint has no Gemma 3 vision tower");
  if (c->vision.pre.width != c->vision.image_size || c->vision.pre.height != c->vision.image_size ||
      !c->vision.pre.do_rescale || !c->vision.pre.do_normalize)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "--mmproj: the preprocessing is not a resize to image_size, 1/255 and a "
                   "normalisation (an mmproj file holds only the mean and std)");
  return 0;
}

/* --mmproj-dtype: an mmproj file's matrices in f16 (the default), f32 or Q8_0
 * (llama.cpp's converter's --outtype; rows that are not whole blocks stay
 * f16); the tensors the converter forces to f32 or f16 stay so. */
enum { MM_F16 = 0, MM_F32 = 1, MM_Q8_0 = 2 };

static int export_mmproj(const struct md_config *c, const struct md_st *st, const char *out,
                         int mm_dt, const char *name, char *err, size_t errlen) {
  int g4 = c->arch == MD_ARCH_GEMMA4;
  int layers =
      g4 ? 45 * c->vision_g4.n_layers + 70 * c->audio_g4.n_layers : 16 * c->vision.n_layers;
  struct gg_plan p = {.cap = 16 + layers,
                      .st = st,
                      .to_f32 = mm_dt == MM_F32,
                      .mm_q8 = mm_dt == MM_Q8_0,
                      .qt = -1,
                      .err = err,
                      .errlen = errlen};
  if (!(p.t = calloc((size_t)p.cap, sizeof(*p.t))))
    return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  int rc = !g4 ? plan_mmproj(&p, c) : 0;
  if (g4 && !rc && c->vision_g4.present) rc = plan_vision_g4(&p, c);
  if (g4 && !rc && c->audio_g4.present) rc = plan_audio_g4(&p, c);
  char *kv = NULL;
  size_t kv_len = 0;
  uint64_t bytes = 0;
  FILE *mf = rc ? NULL : open_memstream(&kv, &kv_len);
  if (!rc && !mf) rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  if (mf) {
    struct gg_out m = {mf, 0, 0};
    if (g4)
      write_kv_mmproj_g4(&m, c, &p, name);
    else
      write_kv_mmproj(&m, c, &p, name);
    if (fclose(mf) != 0 || m.failed)
      rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
    else
      rc = write_file(out, &p, NULL, kv, kv_len, m.n_kv, &bytes, &(int){0}, err, errlen);
  }
  if (!rc && g4)
    printf("wrote %s: Gemma 4 towers (clip:%s%s), %d tensors, %.1f MB\n", out,
           c->vision_g4.present ? " vision gemma4v" : "",
           c->audio_g4.present ? " audio gemma4a" : "", p.n, (double)bytes / 1e6);
  else if (!rc)
    printf("wrote %s: Gemma 3 vision tower (clip, projector gemma3), %d layers, %d tensors, "
           "%.1f MB\n",
           out, c->vision.n_layers, p.n, (double)bytes / 1e6);
  free(kv);
  free(p.t);
  return rc;
}

static int export(const char *dir, const char *out, const struct gg_split *split,
                  const char *mmproj, int mm_dt, int to_f32, int qt, char *err, size_t errlen) {
  struct md_config *c = calloc(1, sizeof(*c));
  if (!c) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  struct md_st *st = NULL;
  struct tk_tokenizer *tok = NULL;
  json_t *tcfg = NULL;
  const char *tmpl = NULL;
  struct gg_plan p = {0};
  char tmp[4096];
  int rc = md_config_load(dir, c, err, errlen);
  if (rc) goto done;
  char whybuf[256];
  const char *why = unsupported(c, whybuf, sizeof(whybuf));
  if (why) {
    rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED, "%s: %s", dir, why);
    goto done;
  }
  if (mmproj && (rc = mmproj_check(c, dir, err, errlen))) goto done;
  if ((rc = md_st_open_dir(dir, &st, err, errlen))) goto done;
  p.cap = 7 + 25 * c->n_layers;
  /* a GGUF input's Gemma 3 norms hold 1 + w already */
  p.norm_shift = c->arch == MD_ARCH_GEMMA3 && !c->gguf ? 1.0f : 0.0f;
  p.t = calloc((size_t)p.cap, sizeof(*p.t));
  p.st = st;
  p.to_f32 = to_f32;
  p.qt = qt;
  p.err = err;
  p.errlen = errlen;
  if (!p.t) {
    rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
    goto done;
  }
  if ((rc = plan_model(&p, c))) goto done;
  snprintf(tmp, sizeof(tmp), "%s/tokenizer.json", dir);
  if (access(tmp, F_OK) == 0) {
    if ((rc = tk_load(tmp, &tok, err, errlen))) goto done;
  }
  /* the chat template (tokenizer_config.json's string form), carried in the file */
  snprintf(tmp, sizeof(tmp), "%s/tokenizer_config.json", dir);
  if ((tcfg = json_load_file(tmp, 0, NULL)) &&
      json_is_string(json_object_get(tcfg, "chat_template")))
    tmpl = json_string_value(json_object_get(tcfg, "chat_template"));
  char *kv = NULL;
  size_t kv_len = 0;
  FILE *mf = open_memstream(&kv, &kv_len);
  struct gg_out m = {mf, !mf, 0};
  const char *base = strrchr(dir, '/'), *gguf_name = NULL;
  size_t gn_len = 0;
  char gn[256];
  if (c->gguf && md_gguf_get_str(md_st_gguf(st), "general.name", &gguf_name, &gn_len) == 0) {
    snprintf(gn, sizeof(gn), "%.*s", (int)(gn_len < 255 ? gn_len : 255), gguf_name);
    gguf_name = gn;
  } else {
    gguf_name = NULL;
  }
  if (mf) {
    write_kv(&m, c, &p, tok, tmpl,
             gguf_name         ? gguf_name
             : base && base[1] ? base + 1
                               : dir,
             c->gguf ? md_st_gguf(st) : NULL);
    if (fclose(mf) != 0) m.failed = 1;
  }
  uint64_t bytes = 0;
  int n_files = 1;
  rc = m.failed ? cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory")
                : write_file(out, &p, split, kv, kv_len, m.n_kv, &bytes, &n_files, err, errlen);
  free(kv);
  if (rc) goto done;
  char parts[64] = "";
  if (n_files > 1)
    snprintf(parts, sizeof(parts), " in %d parts (-00001-of-%05d.gguf ..)", n_files, n_files);
  printf("wrote %s%s: %s, %d layers, %d tensors%s%s, %.1f MB\n", out, parts, md_arch_name(c->arch),
         c->n_layers, p.n, qt >= 0 ? ", matrices " : "", qt >= 0 ? qtypes[qt].name : "",
         (double)bytes / 1e6);
  if (mmproj &&
      (rc = export_mmproj(c, st, mmproj, mm_dt, base && base[1] ? base + 1 : dir, err, errlen)))
    goto done;
done:
  free(p.t);
  free(p.rope_freqs);
  json_decref(tcfg);
  tk_free(tok);
  md_st_close(st);
  free(c);
  return rc;
}

#define SPLIT_SIZE_HELP                                                                            \
  "write the file in parts of at most SIZE bytes each (K, M, G: thousands, millions, billions), "  \
  "named OUT-00001-of-0000N.gguf .., as llama.cpp's gguf-split and converter write them; serve "   \
  "and generate take the first part"
#define SPLIT_TENSORS_HELP                                                                         \
  "write the file in parts of at most N tensors each (see --split-max-size)"

/* The output options quantize and export-gguf share: the towers' dtype, the parts. */
#define GG_OUT_OPTS(mm_dtype, ssize, stensors)                                                     \
  {"mmproj-dtype", CM_OPT_STR, &(mm_dtype), "T", MM_DTYPE_HELP},                                   \
      {"split-max-size", CM_OPT_STR, &(ssize), "SIZE", SPLIT_SIZE_HELP}, {                         \
    "split-max-tensors", CM_OPT_STR, &(stensors), "N", SPLIT_TENSORS_HELP                          \
  }

/* --split-max-size and --split-max-tensors (NULL: none) into sp: 0, or -1
 * with a message. */
static int split_of(const char *cmd, const char *size, const char *tensors, struct gg_split *sp) {
  *sp = (struct gg_split){0};
  if (size) {
    char *end;
    errno = 0;
    double v = strtod(size, &end);
    double mul = !strcmp(end, "")    ? 1
                 : !strcmp(end, "K") ? 1e3
                 : !strcmp(end, "M") ? 1e6
                 : !strcmp(end, "G") ? 1e9
                                     : 0;
    if (end == size || errno || !mul || !(v * mul >= 1) || v * mul > 1e18) {
      fprintf(stderr, "lmserve %s: --split-max-size is a size such as 500M or 2G, not '%s'\n", cmd,
              size);
      return -1;
    }
    sp->max_bytes = (uint64_t)(v * mul);
  }
  if (tensors) {
    char *end;
    errno = 0;
    long n = strtol(tensors, &end, 10);
    if (end == tensors || *end || errno || n < 1 || n > INT32_MAX) {
      fprintf(stderr, "lmserve %s: --split-max-tensors is a count of 1 or more, not '%s'\n", cmd,
              tensors);
      return -1;
    }
    sp->max_tensors = (int)n;
  }
  return 0;
}

/* qtypes' index of name, or -1. */
static int qtype_of(const char *name) {
  for (size_t i = 0; i < CM_ARRAY_LEN(qtypes); i++)
    if (!strcmp(name, qtypes[i].name)) return (int)i;
  return -1;
}

#define MM_DTYPE_HELP                                                                              \
  "with --mmproj: the towers' matrices in f16 (default), f32 or q8_0 (as llama.cpp's converter's " \
  "--outtype; the tensors it keeps in f32 or f16 stay so)"

/* --mmproj-dtype's value (NULL: def): MM_*, or -1 with a message. */
static int mm_dtype_of(const char *cmd, const char *v, int def) {
  if (!v) return def;
  static const char *const names[] = {"f16", "f32", "q8_0"};
  for (int i = 0; i < 3; i++)
    if (!strcmp(v, names[i])) return i;
  fprintf(stderr, "lmserve %s: --mmproj-dtype is f16, f32 or q8_0, not '%s'\n", cmd, v);
  return -1;
}

int tl_quantize_main(int argc, char **argv) {
  const char *pos[3], *mmproj = NULL, *mm_dtype = NULL, *ssize = NULL, *stensors = NULL;
  int n_pos = 0;
  int rc = cm_args_parse(
      "lmserve quantize IN OUT.gguf TYPE",
      "write a Gemma 3 or Gemma 4 text checkpoint (dense or MoE) as a GGUF file with its "
      "matrices in a block format that llama.cpp loads. IN: a checkpoint folder, or a GGUF "
      "file in F32, F16 or BF16 (its vocabulary and chat template kept, as llama.cpp's "
      "quantizer keeps them). TYPE: q8_0, q4_0, q4_1, q5_0, "
      "q5_1 (32-element blocks), q4_k, q5_k, q6_k (256-element K-quant "
      "blocks, as llama.cpp's reference rounding without an importance "
      "matrix; a matrix whose rows are not whole 256-blocks falls back as "
      "llama.cpp's does: q4_k to q5_0, q5_k to q5_1, q6_k to q8_0), or "
      "q4_k_m (llama.cpp's Q4_K_M mix: q4_k, with q6_k for the output "
      "matrix or tied embedding and for attn_v and ffn_down in the first and "
      "last eighth of the layers and every third layer between)",
      (const struct cm_opt[]){{"mmproj", CM_OPT_STR, &mmproj, "FILE",
                               "also write the checkpoint's towers (Gemma 3's "
                               "vision, Gemma 4's vision and audio) as "
                               "llama.cpp's mmproj file"},
                              GG_OUT_OPTS(mm_dtype, ssize, stensors),
                              {0}},
      argc, argv, 1, pos, 3, &n_pos);
  if (rc == CM_ARGS_HELP) return 0;
  if (rc < 0) return 2;
  if (n_pos != 3) {
    fprintf(stderr, "lmserve quantize: usage: lmserve quantize IN OUT.gguf TYPE\n");
    return 2;
  }
  int qt = qtype_of(pos[2]);
  if (qt < 0) {
    fprintf(stderr, "lmserve quantize: TYPE '%s' is not one of " QTYPE_NAMES "\n", pos[2]);
    return 2;
  }
  int mm_dt = mm_dtype_of("quantize", mm_dtype, MM_F16);
  struct gg_split sp;
  if (mm_dt < 0 || split_of("quantize", ssize, stensors, &sp)) return 2;
  char err[512];
  if ((rc = export(pos[0], pos[1], &sp, mmproj, mm_dt, 0, qt, err, sizeof(err)))) {
    fprintf(stderr, "lmserve quantize: %s\n", err);
    return 1;
  }
  return 0;
}

int tl_export_gguf_main(int argc, char **argv) {
  const char *model = NULL, *out = NULL, *dtype = "same", *mmproj = NULL, *mm_dtype = NULL,
             *ssize = NULL, *stensors = NULL;
  const struct cm_opt opts[] = {
      {"model", CM_OPT_STR, &model, "DIR", "checkpoint folder (config.json + safetensors)"},
      {"out", CM_OPT_STR, &out, "FILE", "GGUF file to write"},
      {"dtype", CM_OPT_STR, &dtype, "same|f32|q8_0|q4_0|q4_1|q5_0|q5_1|q4_k|q5_k|q6_k|q4_k_m",
       "matrices as stored (default), widened to f32, or quantized to a block format; norms are "
       "always f32"},
      {"mmproj", CM_OPT_STR, &mmproj, "FILE",
       "also write the checkpoint's towers (Gemma 3's vision, Gemma 4's vision and audio) as "
       "llama.cpp's mmproj file (matrices f16, or f32 with --dtype f32, or as --mmproj-dtype "
       "says)"},
      GG_OUT_OPTS(mm_dtype, ssize, stensors),
      {0},
  };
  int rc = tl_args_parse(
      "lmserve export-gguf",
      "write a Gemma 3 or Gemma 4 text checkpoint (dense or MoE) as a GGUF file llama.cpp "
      "loads",
      opts, argc, argv);
  if (rc >= 0) return rc;
  if (!model || !out) {
    fprintf(stderr, "lmserve export-gguf: --model and --out are required\n");
    return 2;
  }
  int qt = qtype_of(dtype);
  if (strcmp(dtype, "same") && strcmp(dtype, "f32") && qt < 0) {
    fprintf(stderr,
            "lmserve export-gguf: --dtype must be same, f32 or one of " QTYPE_NAMES ", not '%s'\n",
            dtype);
    return 2;
  }
  char err[512];
  int mm_dt = mm_dtype_of("export-gguf", mm_dtype, !strcmp(dtype, "f32") ? MM_F32 : MM_F16);
  struct gg_split sp;
  if (mm_dt < 0 || split_of("export-gguf", ssize, stensors, &sp)) return 2;
  rc = export(model, out, &sp, mmproj, mm_dt, !strcmp(dtype, "f32"), qt, err, sizeof(err));
  if (rc) {
    fprintf(stderr, "lmserve export-gguf: %s\n", err);
    return 1;
  }
  return 0;
}
