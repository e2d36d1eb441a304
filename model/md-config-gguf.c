/* md-config-gguf.c — a GGUF file's metadata as a checkpoint config: the keys
 * llama.cpp's converter writes for Gemma 3 (gemma3.*) and Gemma 4 (gemma4.*)
 * turned into the fields of config.json, which md_config_parse then checks
 * and plans as it does any config, so both paths share every rule.
 *
 * Gemma 3. What llama.cpp fixes where the file is silent, followed here the
 * same way: sliding layers' RoPE base 10000 (gemma3.rope.freq_base_swa when
 * present), every sixth layer full (gemma3.attention.sliding_window_pattern
 * when present: one bool per layer, true for sliding), an attention scale of
 * 1/sqrt(head_dim) except on 62-layer models (1/sqrt(hidden / heads)). The
 * norm weights are stored as 1 + w (cfg->gguf).
 *
 * Gemma 4 (dense), as llama.cpp reads it (src/models/gemma4.cpp,
 * llama_model_gemma4::load_arch_hparams / load_arch_tensors, and the generic
 * keys of llama_model_base::load_hparams):
 *   - required: attention.sliding_window_pattern (one bool per layer, true
 *     for sliding), attention.sliding_window, attention.layer_norm_rms_epsilon,
 *     embedding_length_per_layer_input (0: no per-layer embeddings),
 *     attention.key_length (full layers' head dim), attention.key_length_swa
 *     (sliding layers'), each equal to its value_length;
 *   - attention.head_count_kv and feed_forward_length: a number or one per
 *     layer (the converter writes arrays when full layers have their own KV
 *     heads and for the double-wide MLP of KV-shared layers);
 *   - attention.shared_kv_layers (default 0): the last N layers store no KV;
 *     llama.cpp lets a shared sliding layer read layer first_shared - 2 and a
 *     full one first_shared - 1 (llama_model's layer_reuse_cb), which is our
 *     "last storing layer of the kind" only when those two are sliding and
 *     full: other layouts are refused;
 *   - rope.freq_base (full layers, default 10000), rope.freq_base_swa
 *     (default 10000), rope.dimension_count(_swa) equal to the head dims
 *     (ggml's NeoX RoPE over the whole head), and the proportional RoPE of
 *     full layers as the tensor rope_freqs.weight: per frequency pair a
 *     factor 1 (rotated) or a huge one (1e30 from the converter: frequency
 *     0, unrotated), the rotated pairs first;
 *   - final_logit_softcapping: llama.cpp takes 30 when the key is absent, 0
 *     turns it off;
 *   - attention scale 1 and plain norm weights (no 1 + w); K is V (no
 *     attn_v tensor) on a layer when llama.cpp finds no blk.N.attn_v.weight:
 *     lmserve's attention_k_eq_v, full layers only;
 *   - MoE (moe_keys): expert_count, expert_used_count,
 *     expert_feed_forward_length, the router blk.N.ffn_gate_inp on every
 *     layer and the experts' fused gate_up stack. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-log.h"
#include "model/md-config.h"
#include "model/md-gguf.h"
#include "model/md-safetensors.h"

/* What a GGUF file is (gguf_kind): a model (or a split model's first part),
 * a vision tower, a later part of a split model. */
enum { GK_MODEL = 0, GK_CLIP = 1, GK_PART = 2 };
static int gguf_kind(const char *path, char *err, size_t errlen);

/* The .gguf files of folder dir, each opened once: how many are models
 * (*n_model, the first one's path in model[mn] unless model is NULL) and
 * how many vision towers (*n_mm, the first in mm[mmn] unless mm is NULL). 0, or a negative cm_err
 * naming a file that is not readable GGUF. */
static int scan_gguf(const char *dir, char *model, size_t mn, int *n_model, char *mm, size_t mmn,
                     int *n_mm, char *err, size_t errlen) {
  *n_model = *n_mm = 0;
  DIR *d = opendir(dir);
  if (!d) return 0;
  int rc = 0;
  struct dirent *e;
  while (!rc && (e = readdir(d))) {
    size_t l = strlen(e->d_name);
    if (l < 6 || strcmp(e->d_name + l - 5, ".gguf")) continue;
    char p[4200], why[512];
    snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
    int kind = gguf_kind(p, err, errlen);
    if (kind < 0) { /* named, not taken for a model */
      snprintf(why, sizeof(why), "%s", err);
      rc = cm_fail(err, errlen, kind, "%s: %s", p, why);
    } else if (kind == GK_CLIP && !(*n_mm)++) {
      if (mm) snprintf(mm, mmn, "%s", p);
    } else if (kind == GK_MODEL && !(*n_model)++) {
      if (model) snprintf(model, mn, "%s", p);
    }
  }
  closedir(d);
  return rc;
}

int md_model_gguf_path(const char *model, char *path, size_t n, char *err, size_t errlen) {
  struct stat st;
  size_t ml = strlen(model);
  if (stat(model, &st)) {
    if (ml > 5 && !strcmp(model + ml - 5, ".gguf"))
      return cm_fail(err, errlen, CM_ERR_NOENT, "%s: no such file", model);
    return 0; /* the config loader names what is missing */
  }
  if (S_ISREG(st.st_mode)) {
    int k = md_gguf_probe(model);
    if (k != 1)
      return cm_fail(err, errlen, CM_ERR_PARSE,
                     "%s is a file but not a GGUF file (a model is a folder with config.json and "
                     "safetensors, or a .gguf file)",
                     model);
    if ((k = gguf_kind(model, err, errlen)) < 0) return k;
    if (k == GK_PART)
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "%s is a later part of a split model: name its first part (-00001-of-N.gguf)",
                     model);
    snprintf(path, n, "%s", model);
    return 1;
  }
  if (!S_ISDIR(st.st_mode)) return 0;
  char probe[4200];
  snprintf(probe, sizeof(probe), "%s/config.json", model);
  if (!access(probe, F_OK)) return 0; /* a Hugging Face checkpoint */
  int n_model, n_mm;                  /* vision towers beside the model are not models */
  int rc = scan_gguf(model, path, n, &n_model, NULL, 0, &n_mm, err, errlen);
  if (rc) return rc;
  if (n_model > 1)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "%s holds several .gguf files and no config.json: name the file", model);
  return n_model;
}

/* key of the architecture's namespace ("gemma3." + rest) */
static const char *ak(char *buf, size_t n, const char *arch, const char *rest) {
  snprintf(buf, n, "%s.%s", arch, rest);
  return buf;
}

static int need_int(const struct md_gguf *g, const char *key, int64_t *v, char *err,
                    size_t errlen) {
  int rc = md_gguf_get_int(g, key, v);
  if (rc == CM_ERR_NOENT) return cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: %s missing", key);
  if (rc) return cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: %s is not an integer", key);
  return 0;
}

/* The id of token text s in tokenizer.ggml.tokens, or -1. */
static int64_t token_id(const struct md_gguf *g, const char *s) {
  const struct md_gguf_kv *kv = md_gguf_find_kv(g, "tokenizer.ggml.tokens");
  if (!kv) return -1;
  uint64_t pos = 0;
  const char *t;
  size_t len, want = strlen(s);
  for (int64_t i = 0; md_gguf_arr_next_str(kv, &pos, &t, &len) == 0; i++)
    if (len == want && !memcmp(t, s, len)) return i;
  return -1;
}

/* The bos id and the eos list (eos, eot, and the chat's end-of-turn token
 * when the vocabulary has one) into c. */
static void put_special_ids(const struct md_gguf *g, json_t *c, int64_t vocab) {
  json_t *eos = json_array();
  int64_t bos = 2, id;
  md_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &bos);
  if (!md_gguf_get_int(g, "tokenizer.ggml.eos_token_id", &id))
    json_array_append_new(eos, json_integer(id));
  if (!md_gguf_get_int(g, "tokenizer.ggml.eot_token_id", &id))
    json_array_append_new(eos, json_integer(id));
  if ((id = token_id(g, "<end_of_turn>")) >= 0) json_array_append_new(eos, json_integer(id));
  if ((id = token_id(g, "<turn|>")) >= 0) json_array_append_new(eos, json_integer(id));
  json_object_set_new(c, "bos_token_id", json_integer(bos >= 0 && bos < vocab ? bos : 0));
  if (json_array_size(eos))
    json_object_set_new(c, "eos_token_id", eos);
  else
    json_decref(eos);
}

/* c (taken) as config.json text through md_config_parse. */
static int parse_json(json_t *c, struct md_config *cfg, char *err, size_t errlen) {
  char *text = json_dumps(c, JSON_COMPACT);
  json_decref(c);
  if (!text) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  int rc = md_config_parse(text, strlen(text), cfg, err, errlen);
  free(text);
  if (!rc) cfg->gguf = 1;
  return rc;
}

static int from_gemma3(const struct md_gguf *g, const char *a, struct md_config *cfg, char *err,
                       size_t errlen) {
  char k[160];
  int64_t hidden, layers, ffn, heads, kv_heads, head_dim, ctx, window = 4096, vocab;
  int rc = 0;
  if ((rc = need_int(g, ak(k, sizeof(k), a, "embedding_length"), &hidden, err, errlen)) ||
      (rc = need_int(g, ak(k, sizeof(k), a, "block_count"), &layers, err, errlen)) ||
      (rc = need_int(g, ak(k, sizeof(k), a, "feed_forward_length"), &ffn, err, errlen)) ||
      (rc = need_int(g, ak(k, sizeof(k), a, "attention.head_count"), &heads, err, errlen)) ||
      (rc = need_int(g, ak(k, sizeof(k), a, "context_length"), &ctx, err, errlen)))
    return rc;
  if (heads < 1 || hidden < 1)
    return cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: head_count and embedding_length must be > 0");
  if (md_gguf_get_int(g, ak(k, sizeof(k), a, "attention.head_count_kv"), &kv_heads))
    kv_heads = heads;
  if (md_gguf_get_int(g, ak(k, sizeof(k), a, "attention.key_length"), &head_dim))
    head_dim = hidden / heads;
  md_gguf_get_int(g, ak(k, sizeof(k), a, "attention.sliding_window"), &window);
  const struct md_gguf_tensor *emb = md_gguf_find_tensor(g, "token_embd.weight");
  if (!emb || emb->n_dims != 2)
    return cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: tensor token_embd.weight missing or not 2-D");
  vocab = emb->ne[1];
  double eps = 1e-6, base = 1e6, base_swa = 1e4, factor = 1.0, cap = 0.0;
  md_gguf_get_f64(g, ak(k, sizeof(k), a, "attention.layer_norm_rms_epsilon"), &eps);
  md_gguf_get_f64(g, ak(k, sizeof(k), a, "rope.freq_base"), &base);
  md_gguf_get_f64(g, ak(k, sizeof(k), a, "rope.freq_base_swa"), &base_swa);
  md_gguf_get_f64(g, ak(k, sizeof(k), a, "final_logit_softcapping"), &cap);
  const char *st;
  size_t stl;
  if (!md_gguf_get_str(g, ak(k, sizeof(k), a, "rope.scaling.type"), &st, &stl)) {
    if (stl != 6 || memcmp(st, "linear", 6))
      return cm_fail(err, errlen, CM_ERR_UNSUPPORTED, "GGUF: %s \"%.*s\" is not supported (linear)",
                     k, (int)stl, st);
    md_gguf_get_f64(g, ak(k, sizeof(k), a, "rope.scaling.factor"), &factor);
  }
  json_t *c = json_object(), *types = json_array();
  if (!c || !types) {
    json_decref(c), json_decref(types);
    return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  }
  const struct md_gguf_kv *pat =
      md_gguf_find_kv(g, ak(k, sizeof(k), a, "attention.sliding_window_pattern"));
  for (int64_t i = 0; i < layers && i < MD_MAX_LAYERS; i++) {
    int64_t sliding = (i + 1) % 6 != 0;
    if (pat && pat->type == MD_GGUF_ARRAY && md_gguf_arr_int(pat, (uint64_t)i, &sliding)) {
      rc = cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: %s must hold one bool per layer",
                   "attention.sliding_window_pattern");
      break;
    }
    json_array_append_new(types, json_string(sliding ? "sliding_attention" : "full_attention"));
  }
  /* llama.cpp's attention scale (query_pre_attn_scalar is not in the file) */
  double qpas = layers == 62 ? (double)hidden / (double)heads : (double)head_dim;
  json_object_set_new(c, "model_type", json_string("gemma3_text"));
  json_object_set_new(c, "vocab_size", json_integer(vocab));
  json_object_set_new(c, "hidden_size", json_integer(hidden));
  json_object_set_new(c, "intermediate_size", json_integer(ffn));
  json_object_set_new(c, "num_hidden_layers", json_integer(layers));
  json_object_set_new(c, "num_attention_heads", json_integer(heads));
  json_object_set_new(c, "num_key_value_heads", json_integer(kv_heads));
  json_object_set_new(c, "head_dim", json_integer(head_dim));
  json_object_set_new(c, "sliding_window", json_integer(window));
  json_object_set_new(c, "max_position_embeddings", json_integer(ctx));
  json_object_set_new(c, "rms_norm_eps", json_real(eps));
  json_object_set_new(c, "query_pre_attn_scalar", json_real(qpas));
  json_object_set_new(c, "rope_theta", json_real(base));
  json_object_set_new(c, "rope_local_base_freq", json_real(base_swa));
  if (factor != 1.0)
    json_object_set_new(c, "rope_scaling",
                        json_pack("{s:s,s:f}", "rope_type", "linear", "factor", factor));
  if (cap > 0) json_object_set_new(c, "final_logit_softcapping", json_real(cap));
  json_object_set_new(c, "tie_word_embeddings",
                      json_boolean(md_gguf_find_tensor(g, "output.weight") == NULL));
  json_object_set_new(c, "layer_types", types);
  put_special_ids(g, c, vocab);
  if (rc) {
    json_decref(c);
    return rc;
  }
  return parse_json(c, cfg, err, errlen);
}

/* Value `layer` of a key that holds one number or one per layer (llama.cpp's
 * get_key_or_arr); CM_ERR_NOENT when absent. */
static int layer_int(const struct md_gguf *g, const char *key, int64_t layer, int64_t layers,
                     int64_t *v, char *err, size_t errlen) {
  const struct md_gguf_kv *kv = md_gguf_find_kv(g, key);
  if (!kv) return CM_ERR_NOENT;
  if (kv->type != MD_GGUF_ARRAY) {
    if (md_gguf_get_int(g, key, v))
      return cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: %s is not an integer", key);
    return 0;
  }
  if ((int64_t)kv->n != layers || md_gguf_arr_int(kv, (uint64_t)layer, v))
    return cm_fail(err, errlen, CM_ERR_PARSE,
                   "GGUF: %s must be an integer or one integer per layer (%lld)", key,
                   (long long)layers);
  return 0;
}

static int has_layer_tensor(const struct md_gguf *g, int64_t layer, const char *rest) {
  char name[96];
  snprintf(name, sizeof(name), "blk.%lld.%s", (long long)layer, rest);
  return md_gguf_find_tensor(g, name) != NULL;
}

/* The rotated frequency pairs of full layers from rope_freqs.weight (pairs
 * entries): leading factors of 1, then factors so large that the pair's
 * angle is zero in f32 (the converter writes 1e30). */
#define UNROTATED_FACTOR 1e20
static int rope_pairs(const struct md_gguf *g, int64_t pairs, int *rot, char *err, size_t errlen) {
  const struct md_gguf_tensor *t = md_gguf_find_tensor(g, "rope_freqs.weight");
  if (!t)
    return cm_fail(err, errlen, CM_ERR_PARSE,
                   "GGUF: tensor rope_freqs.weight missing (the full layers' proportional RoPE)");
  if (t->type != MD_GGML_F32 || t->n_dims != 1 || t->ne[0] != pairs || !t->data)
    return cm_fail(err, errlen, CM_ERR_PARSE,
                   "GGUF: rope_freqs.weight must be f32 [%lld] (attention.key_length / 2)",
                   (long long)pairs);
  *rot = 0;
  for (int64_t i = 0; i < pairs; i++) {
    float f;
    memcpy(&f, (const uint8_t *)t->data + 4 * i, 4);
    if (f == 1.0f && *rot == i) {
      (*rot)++;
    } else if (!(f >= UNROTATED_FACTOR)) {
      return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                     "GGUF: rope_freqs.weight[%lld] is %g: only factors of 1 (rotated pairs, "
                     "first) and >= %g (unrotated) are supported",
                     (long long)i, (double)f, UNROTATED_FACTOR);
    }
  }
  return 0;
}

/* Gemma 4 MoE, as llama.cpp's gemma4 reads it: a layer is MoE when it has
 * blk.N.ffn_gate_inp.weight (the router); expert_count (E), expert_used_count
 * (top k) and expert_feed_forward_length (I; else the width of
 * blk.0.ffn_down_exps.weight) from the metadata. lmserve's Gemma 4 has the
 * block on every layer or none (enable_moe_block), and the experts' gate and
 * up in one stack (ffn_gate_up_exps, which the converter writes); other
 * layouts are refused by name. *experts = 0: a dense file. */
static int moe_keys(const struct md_gguf *g, const char *a, int64_t layers, int64_t *experts,
                    int64_t *top_k, int64_t *moe_ffn, char *err, size_t errlen) {
  char k[160];
  int64_t with = 0;
  *experts = *top_k = *moe_ffn = 0;
  for (int64_t i = 0; i < layers; i++)
    with += has_layer_tensor(g, i, "ffn_gate_inp.weight");
  md_gguf_get_int(g, ak(k, sizeof(k), a, "expert_count"), experts);
  if (!with && *experts <= 0) {
    *experts = 0;
    return 0;
  }
  if (!with)
    return cm_fail(err, errlen, CM_ERR_PARSE,
                   "GGUF: %s.expert_count is %lld but no layer has blk.N.ffn_gate_inp.weight", a,
                   (long long)*experts);
  if (with != layers)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "GGUF: %lld of %lld layers have blk.N.ffn_gate_inp.weight (an MoE block on "
                   "every layer or none is supported)",
                   (long long)with, (long long)layers);
  if (*experts < 1 || *experts > 4096)
    return cm_fail(err, errlen, CM_ERR_PARSE,
                   "GGUF: %s.expert_count missing or not 1..4096 in a file with MoE layers", a);
  if (need_int(g, ak(k, sizeof(k), a, "expert_used_count"), top_k, err, errlen) || *top_k < 1 ||
      *top_k > *experts)
    return cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: %s.expert_used_count missing or not 1..%lld",
                   a, (long long)*experts);
  if (has_layer_tensor(g, 0, "ffn_gate_exps.weight") ||
      !has_layer_tensor(g, 0, "ffn_gate_up_exps.weight"))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "GGUF: blk.0.ffn_gate_up_exps.weight missing: experts with separate "
                   "ffn_gate_exps / ffn_up_exps are not supported (the fused stack is)");
  const struct md_gguf_tensor *dn = md_gguf_find_tensor(g, "blk.0.ffn_down_exps.weight");
  if (md_gguf_get_int(g, ak(k, sizeof(k), a, "expert_feed_forward_length"), moe_ffn))
    *moe_ffn = dn && dn->n_dims == 3 ? dn->ne[0] : 0;
  if (*moe_ffn < 1 || *moe_ffn > (1 << 20))
    return cm_fail(err, errlen, CM_ERR_PARSE,
                   "GGUF: %s.expert_feed_forward_length missing or out of range (and no 3-D "
                   "blk.0.ffn_down_exps.weight to take it from)",
                   a);
  return 0;
}

static int from_gemma4(const struct md_gguf *g, const char *a, struct md_config *cfg, char *err,
                       size_t errlen) {
  char k[160];
  int64_t hidden, layers, hd_full, hd_swa, v_full, v_swa, window, ctx, ple, vocab;
  int64_t shared = 0, experts = 0, rot_full, rot_swa;
  double eps, base = 10000.0, base_swa = 10000.0, cap = 30.0, factor = 1.0;
  int rc;
  if ((rc = need_int(g, ak(k, sizeof(k), a, "embedding_length"), &hidden, err, errlen)) ||
      (rc = need_int(g, ak(k, sizeof(k), a, "block_count"), &layers, err, errlen)) ||
      (rc = need_int(g, ak(k, sizeof(k), a, "context_length"), &ctx, err, errlen)) ||
      (rc = need_int(g, ak(k, sizeof(k), a, "attention.sliding_window"), &window, err, errlen)) ||
      (rc = need_int(g, ak(k, sizeof(k), a, "embedding_length_per_layer_input"), &ple, err,
                     errlen)) ||
      (rc = need_int(g, ak(k, sizeof(k), a, "attention.key_length"), &hd_full, err, errlen)) ||
      (rc = need_int(g, ak(k, sizeof(k), a, "attention.key_length_swa"), &hd_swa, err, errlen)))
    return rc;
  if (layers < 1 || layers > MD_MAX_LAYERS)
    return cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: %s.block_count must be 1..%d", a,
                   MD_MAX_LAYERS);
  if (md_gguf_get_f64(g, ak(k, sizeof(k), a, "attention.layer_norm_rms_epsilon"), &eps))
    return cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: %s missing or not a number", k);
  if (md_gguf_get_int(g, ak(k, sizeof(k), a, "attention.value_length"), &v_full)) v_full = hd_full;
  if (md_gguf_get_int(g, ak(k, sizeof(k), a, "attention.value_length_swa"), &v_swa)) v_swa = hd_swa;
  if (v_full != hd_full || v_swa != hd_swa)
    return cm_fail(err, errlen, CM_ERR_PARSE,
                   "GGUF: %s.attention.value_length(_swa) must equal key_length(_swa)", a);
  /* ggml's RoPE over the whole head (partial RoPE of full layers: rope_freqs) */
  if (md_gguf_get_int(g, ak(k, sizeof(k), a, "rope.dimension_count"), &rot_full))
    rot_full = hd_full;
  if (md_gguf_get_int(g, ak(k, sizeof(k), a, "rope.dimension_count_swa"), &rot_swa))
    rot_swa = rot_full == hd_full ? hd_swa : rot_full;
  if (rot_full != hd_full)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "GGUF: %s.rope.dimension_count %lld is not attention.key_length %lld", a,
                   (long long)rot_full, (long long)hd_full);
  if (rot_swa != hd_swa)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "GGUF: %s.rope.dimension_count_swa %lld is not attention.key_length_swa %lld "
                   "(partial RoPE on sliding layers)",
                   a, (long long)rot_swa, (long long)hd_swa);
  int64_t top_k = 0, moe_ffn = 0;
  if ((rc = moe_keys(g, a, layers, &experts, &top_k, &moe_ffn, err, errlen))) return rc;
  md_gguf_get_int(g, ak(k, sizeof(k), a, "attention.shared_kv_layers"), &shared);
  if (shared < 0 || shared >= layers)
    return cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: %s.attention.shared_kv_layers must be 0..%lld",
                   a, (long long)layers - 1);
  md_gguf_get_f64(g, ak(k, sizeof(k), a, "rope.freq_base"), &base);
  md_gguf_get_f64(g, ak(k, sizeof(k), a, "rope.freq_base_swa"), &base_swa);
  md_gguf_get_f64(g, ak(k, sizeof(k), a, "final_logit_softcapping"), &cap);
  const char *st;
  size_t stl;
  if (!md_gguf_get_str(g, ak(k, sizeof(k), a, "rope.scaling.type"), &st, &stl) &&
      (stl != 6 || memcmp(st, "linear", 6)))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED, "GGUF: %s \"%.*s\" is not supported (linear)",
                   k, (int)stl, st);
  md_gguf_get_f64(g, ak(k, sizeof(k), a, "rope.scaling.factor"), &factor);
  if (factor == 0) factor = 1.0; /* llama.cpp: 0 is none */
  const struct md_gguf_tensor *emb = md_gguf_find_tensor(g, "token_embd.weight");
  if (!emb || emb->n_dims != 2)
    return cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: tensor token_embd.weight missing or not 2-D");
  vocab = emb->ne[1];
  int64_t ple_vocab = 0;
  if (ple > 0) {
    const struct md_gguf_tensor *pe = md_gguf_find_tensor(g, "per_layer_token_embd.weight");
    if (!pe || pe->n_dims != 2 || pe->ne[0] != layers * ple)
      return cm_fail(err, errlen, CM_ERR_PARSE,
                     "GGUF: %s.embedding_length_per_layer_input is %lld but tensor "
                     "per_layer_token_embd.weight is missing or not [%lld, vocab]",
                     a, (long long)ple, (long long)(layers * ple));
    ple_vocab = pe->ne[1];
  }
  json_t *c = json_object(), *types = json_array(), *plc = json_object();
  if (!c || !types || !plc) {
    json_decref(c), json_decref(types), json_decref(plc);
    return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  }
  int kinds[MD_MAX_LAYERS];
  int64_t first_shared = layers - shared, kv[MD_MAX_LAYERS], ffn = 0, wide = -1;
  int64_t heads0 = 0, kv_swa = 0, kv_full = 0, kev = -1, any_full = 0;
  const struct md_gguf_kv *pat =
      md_gguf_find_kv(g, ak(k, sizeof(k), a, "attention.sliding_window_pattern"));
  if (!pat)
    rc = cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: %s missing (one bool per layer)", k);
  else if (pat->type != MD_GGUF_ARRAY || (int64_t)pat->n != layers)
    rc = cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: %s must hold one bool per layer (%lld)", k,
                 (long long)layers);
  for (int64_t i = 0; i < layers && !rc; i++) {
    int64_t swa, h, f;
    if (md_gguf_arr_int(pat, (uint64_t)i, &swa)) {
      rc = cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: %s must hold one bool per layer", k);
      break;
    }
    kinds[i] = swa ? MD_LAYER_SLIDING : MD_LAYER_FULL;
    any_full |= !swa;
    json_array_append_new(types, json_string(swa ? "sliding_attention" : "full_attention"));
    if ((rc = layer_int(g, ak(k, sizeof(k), a, "attention.head_count"), i, layers, &h, err,
                        errlen))) {
      if (rc == CM_ERR_NOENT) rc = cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: %s missing", k);
      break;
    }
    if (i == 0) heads0 = h;
    if (h != heads0 || h < 1) {
      rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "GGUF: %s: %lld heads in layer %lld (every layer must have %lld)", k,
                   (long long)h, (long long)i, (long long)heads0);
      break;
    }
    rc = layer_int(g, ak(k, sizeof(k), a, "attention.head_count_kv"), i, layers, &kv[i], err,
                   errlen);
    if (rc == CM_ERR_NOENT) kv[i] = h, rc = 0;
    if (rc) break;
    if (kv[i] < 1 || h % kv[i]) {
      rc = cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: %s: %lld KV heads in layer %lld", k,
                   (long long)kv[i], (long long)i);
      break;
    }
    if (swa && !kv_swa) kv_swa = kv[i];
    if (!swa && !kv_full) kv_full = kv[i];
    if ((rc = layer_int(g, ak(k, sizeof(k), a, "feed_forward_length"), i, layers, &f, err,
                        errlen))) {
      if (rc == CM_ERR_NOENT) rc = cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: %s missing", k);
      break;
    }
    /* the double-wide MLP: 2x on every KV-shared layer */
    if (i == 0) ffn = f;
    int64_t w = i < first_shared ? (f == ffn ? 0 : -1) : f == ffn ? 0 : f == 2 * ffn ? 1 : -1;
    if (w >= 0 && i >= first_shared && wide < 0) wide = w;
    if (w < 0 || (i >= first_shared && w != wide) || f < 1) {
      rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "GGUF: %s: layer %lld is %lld wide (the stored layers must all be %lld, the "
                   "KV-shared ones all that or twice it)",
                   k, (long long)i, (long long)f, (long long)ffn);
      break;
    }
    /* K as V where the layer has no attn_v (llama.cpp's use_alternative_attention) */
    if (i < first_shared && !has_layer_tensor(g, i, "attn_qkv.weight")) {
      int no_v = !has_layer_tensor(g, i, "attn_v.weight");
      if (no_v && swa) {
        rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                     "GGUF: blk.%lld.attn_v.weight missing on a sliding layer (K as V is "
                     "supported on full layers only)",
                     (long long)i);
        break;
      }
      if (!swa && kev >= 0 && kev != no_v) {
        rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                     "GGUF: blk.%lld.attn_v.weight: some full layers have attn_v and others not",
                     (long long)i);
        break;
      }
      if (!swa) kev = no_v;
    } else if (i < first_shared) {
      rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "GGUF: blk.%lld.attn_qkv.weight: fused QKV matrices are not supported",
                   (long long)i);
      break;
    }
    char li[24];
    snprintf(li, sizeof(li), "%lld", (long long)i);
    json_object_set_new(plc, li, json_pack("{s:I}", "num_key_value_heads", (json_int_t)kv[i]));
  }
  int rot = 0;
  if (!rc && any_full) rc = rope_pairs(g, hd_full / 2, &rot, err, errlen);
  if (!rc && shared > 0 && first_shared < 2)
    rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                 "GGUF: %s.attention.shared_kv_layers %lld leaves fewer than 2 storing layers", a,
                 (long long)shared);
  if (!rc && shared > 0 &&
      (kinds[first_shared - 1] != MD_LAYER_FULL || kinds[first_shared - 2] != MD_LAYER_SLIDING))
    rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                 "GGUF: %s.attention.shared_kv_layers: llama.cpp's gemma4 lets KV-shared sliding "
                 "layers read layer %lld and full ones layer %lld, which must then be sliding and "
                 "full (they are %s and %s)",
                 a, (long long)first_shared - 2, (long long)first_shared - 1,
                 kinds[first_shared - 2] == MD_LAYER_FULL ? "full" : "sliding",
                 kinds[first_shared - 1] == MD_LAYER_FULL ? "full" : "sliding");
  if (rc) {
    json_decref(c), json_decref(types), json_decref(plc);
    return rc;
  }
  json_object_set_new(c, "model_type", json_string("gemma4_text"));
  json_object_set_new(c, "vocab_size", json_integer(vocab));
  json_object_set_new(c, "hidden_size", json_integer(hidden));
  json_object_set_new(c, "intermediate_size", json_integer(ffn));
  json_object_set_new(c, "num_hidden_layers", json_integer(layers));
  json_object_set_new(c, "num_attention_heads", json_integer(heads0));
  json_object_set_new(c, "num_key_value_heads", json_integer(kv_swa ? kv_swa : kv_full));
  json_object_set_new(c, "head_dim", json_integer(hd_swa));
  json_object_set_new(c, "global_head_dim", json_integer(hd_full));
  if (kev == 1) {
    json_object_set_new(c, "attention_k_eq_v", json_true());
    json_object_set_new(c, "num_global_key_value_heads", json_integer(kv_full));
  }
  json_object_set_new(c, "per_layer_config", plc);
  json_object_set_new(c, "num_kv_shared_layers", json_integer(shared));
  json_object_set_new(c, "use_double_wide_mlp", json_boolean(wide == 1));
  json_object_set_new(c, "hidden_size_per_layer_input", json_integer(ple > 0 ? ple : 0));
  json_object_set_new(c, "vocab_size_per_layer_input", json_integer(ple_vocab));
  json_object_set_new(c, "sliding_window", json_integer(window));
  json_object_set_new(c, "max_position_embeddings", json_integer(ctx));
  json_object_set_new(c, "rms_norm_eps", json_real(eps));
  json_object_set_new(c, "hidden_activation", json_string("gelu_pytorch_tanh"));
  /* the rotated pairs are set from rope_freqs after the parse (a factor would round) */
  json_object_set_new(c, "rope_parameters",
                      json_pack("{s:{s:s,s:f},s:{s:s,s:f,s:f,s:f}}", "sliding_attention",
                                "rope_type", "default", "rope_theta", base_swa, "full_attention",
                                "rope_type", "proportional", "rope_theta", base, "factor", factor,
                                "partial_rotary_factor", 1.0));
  if (cap > 0) json_object_set_new(c, "final_logit_softcapping", json_real(cap));
  json_object_set_new(c, "tie_word_embeddings",
                      json_boolean(md_gguf_find_tensor(g, "output.weight") == NULL));
  json_object_set_new(c, "layer_types", types);
  if (experts) {
    json_object_set_new(c, "enable_moe_block", json_true());
    json_object_set_new(c, "num_experts", json_integer(experts));
    json_object_set_new(c, "top_k_experts", json_integer(top_k));
    json_object_set_new(c, "moe_intermediate_size", json_integer(moe_ffn));
  }
  put_special_ids(g, c, vocab);
  if ((rc = parse_json(c, cfg, err, errlen))) return rc;
  if (any_full) cfg->rope[MD_LAYER_FULL].rot_pairs = rot;
  return 0;
}

int md_config_from_gguf(const struct md_gguf *g, struct md_config *cfg, char *err, size_t errlen) {
  const char *arch;
  size_t alen;
  char a[32];
  if (md_gguf_get_str(g, "general.architecture", &arch, &alen))
    return cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: general.architecture missing");
  snprintf(a, sizeof(a), "%.*s", (int)(alen < sizeof(a) ? alen : sizeof(a) - 1), arch);
  if (alen == 6 && !memcmp(arch, "gemma3", 6)) return from_gemma3(g, a, cfg, err, errlen);
  if (alen == 6 && !memcmp(arch, "gemma4", 6)) return from_gemma4(g, a, cfg, err, errlen);
  return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                 "GGUF: general.architecture \"%.*s\" is not supported (gemma3, gemma4)", (int)alen,
                 arch);
}

static int load_mmproj(const char *model, const struct md_gguf *text, struct md_config *cfg,
                       char *err, size_t errlen);

int md_config_from_gguf_model(const char *model, const struct md_gguf *g, struct md_config *cfg,
                              char *err, size_t errlen) {
  int rc = md_config_from_gguf(g, cfg, err, errlen);
  return rc ? rc : load_mmproj(model, g, cfg, err, errlen);
}

int md_config_load_gguf(const char *model, const char *path, struct md_config *cfg, char *err,
                        size_t errlen) {
  struct md_gguf *g = NULL;
  int rc = md_gguf_open(path, &g, err, errlen);
  if (rc) return rc;
  rc = md_config_from_gguf_model(model, g, cfg, err, errlen);
  md_gguf_close(g);
  return rc;
}

/* ---- a vision tower beside the model file (llama.cpp's mmproj) -------------- */

/* GK_CLIP when the GGUF file at path is a vision tower (general.architecture
 * "clip", as llama.cpp's converter writes an mmproj file), GK_PART when it is
 * a split model's part after the first, else GK_MODEL; a negative cm_err when
 * it cannot be read. */
static int gguf_kind(const char *path, char *err, size_t errlen) {
  struct md_gguf *g = NULL;
  int rc = md_gguf_open(path, &g, err, errlen);
  if (rc) return rc;
  const char *arch;
  size_t alen;
  int no, count;
  if ((rc = md_gguf_split(g, &no, &count, err, errlen)) == 0)
    rc = no ? GK_PART
         : !md_gguf_get_str(g, "general.architecture", &arch, &alen) && alen == 4 &&
                 !memcmp(arch, "clip", 4)
             ? GK_CLIP
             : GK_MODEL;
  md_gguf_close(g);
  return rc;
}

/* --mmproj FILE of this process's command line ("" without it) */
static char mmproj_named[4096];

int md_model_set_mmproj(const char *path, char *err, size_t errlen) {
  mmproj_named[0] = 0;
  if (!path || !*path) return 0;
  int kind = gguf_kind(path, err, errlen);
  if (kind < 0) return kind;
  if (kind != GK_CLIP)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "--mmproj %s is not a vision tower (a GGUF file of general.architecture clip)",
                   path);
  if (strlen(path) >= sizeof(mmproj_named))
    return cm_fail(err, errlen, CM_ERR_TOOBIG, "--mmproj: path too long");
  snprintf(mmproj_named, sizeof(mmproj_named), "%s", path);
  return 0;
}

int md_model_mmproj_arg(const char *model, const char *mmproj, char *err, size_t errlen) {
  if (!mmproj) return 0;
  char path[4200];
  int g = model ? md_model_gguf_path(model, path, sizeof(path), err, errlen) : 0;
  if (g < 0) return g;
  if (!g)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "--mmproj goes with a GGUF model (a checkpoint folder's tower is in its "
                   "safetensors)");
  return md_model_set_mmproj(mmproj, err, errlen);
}

int md_model_mmproj_path(const char *model, char *path, size_t n, char *err, size_t errlen) {
  if (mmproj_named[0]) {
    snprintf(path, n, "%s", mmproj_named);
    return 1;
  }
  struct stat st;
  if (stat(model, &st) || !S_ISDIR(st.st_mode)) return 0;
  int n_model, n_mm;
  int rc = scan_gguf(model, NULL, 0, &n_model, path, n, &n_mm, err, errlen);
  if (rc) return rc;
  if (n_mm > 1)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "%s holds several vision towers (.gguf files of architecture clip): keep one",
                   model);
  return n_mm;
}

/* clip.<modality>.projection_dim, where the file says it, must be the text
 * model's width. */
static int check_projection(const struct md_gguf *mm, const char *modality, int64_t hidden,
                            char *err, size_t errlen) {
  char k[64];
  int64_t proj;
  snprintf(k, sizeof(k), "clip.%s.projection_dim", modality);
  if (!md_gguf_get_int(mm, k, &proj) && proj != hidden)
    return cm_fail(err, errlen, CM_ERR_SHAPE, "mmproj: %s %lld is not the model's hidden size %lld",
                   k, (long long)proj, (long long)hidden);
  return 0;
}

/* A clip.<modality>.* integer as the JSON field `field` of o (and in *out
 * unless NULL). */
static int clip_int(const struct md_gguf *mm, const char *modality, const char *key, json_t *o,
                    const char *field, int64_t *out, char *err, size_t errlen) {
  char k[96];
  int64_t v;
  snprintf(k, sizeof(k), "clip.%s.%s", modality, key);
  int rc = need_int(mm, k, &v, err, errlen);
  if (!rc) json_object_set_new(o, field, json_integer(v));
  if (!rc && out) *out = v;
  return rc;
}

/* clip.vision.image_mean or image_std as a JSON array (3 numbers). */
static int vision_triple(const struct md_gguf *mm, const char *key, json_t *pre, char *err,
                         size_t errlen) {
  char k[96];
  snprintf(k, sizeof(k), "clip.vision.%s", key);
  const struct md_gguf_kv *kv = md_gguf_find_kv(mm, k);
  if (!kv) return 0; /* the processor's default */
  json_t *a = json_array();
  double x;
  for (uint64_t i = 0; kv->type == MD_GGUF_ARRAY && i < kv->n && i < MD_MAX_CHANNELS; i++)
    if (!md_gguf_arr_f64(kv, i, &x)) json_array_append_new(a, json_real(x));
  if (kv->type != MD_GGUF_ARRAY || json_array_size(a) != kv->n) {
    json_decref(a);
    return cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: %s must hold one number per channel", k);
  }
  json_object_set_new(pre, key, a);
  return 0;
}

static int add_mmproj_g4(const struct md_gguf *mm, const struct md_gguf *text,
                         struct md_config *cfg, char *err, size_t errlen);

/* Gemma 3's SigLIP tower from an mmproj file (clip.projector_type "gemma3";
 * llama.cpp's converter, Gemma3VisionModel, and tools/mtmd/clip.cpp): the
 * keys below as vision_config, 256 soft tokens an image unless
 * clip.vision.projector.scale_factor pools otherwise than by 4, the image
 * tokens found in the text file's vocabulary (Gemma3Config's ids in a file without
 * one, which takes --tokenizer), and image_mean / image_std as
 * the preprocessing (resized to image_size, bilinear, rescaled by 1/255). All
 * of it then goes through md_config_parse_vision's checks. */
int md_config_add_mmproj(const struct md_gguf *mm, const struct md_gguf *text,
                         struct md_config *cfg, char *err, size_t errlen) {
  const char *pt;
  size_t plen;
  if (cfg->arch == MD_ARCH_GEMMA4) return add_mmproj_g4(mm, text, cfg, err, errlen);
  if (cfg->arch != MD_ARCH_GEMMA3)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "mmproj: towers are read for Gemma 3 and Gemma 4 models (this model is %s)",
                   cfg->model_type);
  if (md_gguf_get_str(mm, "clip.projector_type", &pt, &plen) || plen != 6 ||
      memcmp(pt, "gemma3", 6))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "mmproj: clip.projector_type is not \"gemma3\" (a Gemma 3 model takes Gemma "
                   "3's projector)");
  int has = 1;
  md_gguf_get_bool(mm, "clip.has_vision_encoder", &has);
  if (!has)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED, "mmproj: the file has no vision encoder");
  int gelu = 1; /* absent: SigLIP's tanh GELU, as transformers computes it */
  md_gguf_get_bool(mm, "clip.use_gelu", &gelu);
  if (!gelu)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "mmproj: clip.use_gelu is false (the quick GELU is not Gemma 3's)");
  json_t *root = json_object(), *vc = json_object(), *pre = json_object();
  json_object_set_new(root, "vision_config", vc);
  json_object_set_new(vc, "model_type", json_string("siglip_vision_model"));
  int64_t image = 0, patch = 0, scale = 4;
  double eps = 1e-6;
  int rc = 0;
  if ((rc = clip_int(mm, "vision", "embedding_length", vc, "hidden_size", NULL, err, errlen)) ||
      (rc = clip_int(mm, "vision", "feed_forward_length", vc, "intermediate_size", NULL, err,
                     errlen)) ||
      (rc = clip_int(mm, "vision", "block_count", vc, "num_hidden_layers", NULL, err, errlen)) ||
      (rc = clip_int(mm, "vision", "attention.head_count", vc, "num_attention_heads", NULL, err,
                     errlen)) ||
      (rc = need_int(mm, "clip.vision.image_size", &image, err, errlen)) ||
      (rc = need_int(mm, "clip.vision.patch_size", &patch, err, errlen)) ||
      (rc = vision_triple(mm, "image_mean", pre, err, errlen)) ||
      (rc = vision_triple(mm, "image_std", pre, err, errlen)))
    goto done;
  md_gguf_get_f64(mm, "clip.vision.attention.layer_norm_epsilon", &eps);
  md_gguf_get_int(mm, "clip.vision.projector.scale_factor", &scale);
  if ((rc = check_projection(mm, "vision", cfg->hidden, err, errlen))) goto done;
  /* clip.cpp pools the patch grid by scale_factor x scale_factor; that is the
     pooling md_config_parse_vision derives only when it divides the grid */
  if (image < 1 || patch < 1 || scale < 1 || image / patch < scale || image / patch % scale) {
    rc = cm_fail(err, errlen, CM_ERR_INVAL,
                 "mmproj: clip.vision.projector.scale_factor %lld does not divide the %lld x %lld "
                 "patch grid (image_size %lld, patch_size %lld)",
                 (long long)scale, (long long)(patch > 0 ? image / patch : 0),
                 (long long)(patch > 0 ? image / patch : 0), (long long)image, (long long)patch);
    goto done;
  }
  int64_t side = image / patch / scale, boi = token_id(text, "<start_of_image>"),
          eoi = token_id(text, "<end_of_image>"), img = token_id(text, "<image_soft_token>");
  if (!md_gguf_find_kv(text, "tokenizer.ggml.tokens")) /* no vocabulary: Gemma3Config's ids */
    boi = 255999, eoi = 256000, img = 262144;
  if (boi < 0 || eoi < 0) {
    rc = cm_fail(err, errlen, CM_ERR_PARSE,
                 "mmproj: the model's vocabulary has no <start_of_image> / <end_of_image>");
    goto done;
  }
  json_object_set_new(vc, "image_size", json_integer(image));
  json_object_set_new(vc, "patch_size", json_integer(patch));
  json_object_set_new(vc, "layer_norm_eps", json_real(eps));
  /* llama.cpp's converter cuts Gemma 3's vocabulary (and token_embd) to
     tokenizer.model's 262144 pieces, which leaves <image_soft_token> (262144)
     out: llama.cpp feeds the features with no ids. The soft tokens then take
     <unused0>, an unused piece of the vocabulary: their rows are replaced by
     the image's features, so which id they carry changes no logit (and the
     text "<unused0>" in a prompt is refused as a stray soft token is). */
  if (img < 0 || img >= cfg->vocab) {
    img = md_gguf_find_kv(text, "tokenizer.ggml.tokens") ? token_id(text, "<unused0>") : 6;
    if (img < 0 || img >= cfg->vocab) {
      rc = cm_fail(err, errlen, CM_ERR_PARSE,
                   "mmproj: the model's vocabulary has neither <image_soft_token> nor <unused0> "
                   "to stand in for it");
      goto done;
    }
  }
  json_object_set_new(root, "mm_tokens_per_image", json_integer(side * side));
  json_object_set_new(root, "boi_token_index", json_integer(boi));
  json_object_set_new(root, "eoi_token_index", json_integer(eoi));
  json_object_set_new(root, "image_token_index", json_integer(img));
  json_object_set_new(pre, "size", json_pack("{s:I,s:I}", "height", image, "width", image));
  char *vt = json_dumps(root, JSON_COMPACT), *pt2 = json_dumps(pre, JSON_COMPACT);
  if (!vt || !pt2)
    rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  else if (!(rc = md_config_parse_vision(vt, strlen(vt), cfg, err, errlen)))
    rc = md_config_parse_preproc(pt2, strlen(pt2), 0, cfg, err, errlen);
  free(vt);
  free(pt2);
done:
  json_decref(root);
  json_decref(pre);
  if (rc)
    cfg->vision.present = 0;
  else /* as a checkpoint with a tower names itself */
    snprintf(cfg->model_type, sizeof(cfg->model_type), "gemma3");
  return rc;
}

/* ---- Gemma 4's towers from an mmproj file -------------------------------------
 * llama.cpp's converter (conversion/gemma.py, Gemma4VisionAudioModel on
 * MmprojModel) writes Gemma 4's vision tower as clip.vision.projector_type
 * "gemma4v" and its audio tower as clip.audio.projector_type "gemma4a" (one
 * file, either or both); tools/mtmd/clip.cpp reads them back. What the keys
 * do not say, clip.cpp fixes in code or the tensors' shapes tell:
 *   - vision: the RoPE base 100 and the pooling 3 (unless
 *     clip.vision.projector.scale_factor); head_dim from attn_q_norm's
 *     length, the KV heads from attn_k's rows; the position table's rows
 *     from v.position_embd (2 tables of [P, D]); clipped linears where
 *     v.blk.0.attn_q.input_min is present, standardisation where v.std_bias
 *     is; 280 soft tokens an image by default (Gemma4VisionConfig's), the
 *     image processor's defaults (Gemma4ImageProcessor: bicubic, 1/255, no
 *     normalisation, so image_mean / image_std must be 0 / 1 when given);
 *   - audio: the channels of the two subsampling convolutions from
 *     a.conv1d.{0,1}.weight, the light conv's taps from a.blk.0.conv_dw, the
 *     output projection's width from a.pre_encode.out; chunks of 12 with 12
 *     frames of left context (clip.cpp's, Gemma4AudioConfig's defaults), the
 *     norms' eps 1e-6 (the converter writes 1e-5 for every file; clip.cpp's
 *     graph takes 1e-6, as the checkpoints do); 128 mel bins (the feature
 *     extractor's, so clip.audio.num_mel_bins must say 128).
 * The text file holds no use_bidirectional_attention: Google's configs say
 * "vision" for the models without per-layer embeddings (26B A4B, 31B) and
 * nothing for E2B and E4B, which is what is taken here. A tensor the towers
 * do not read (md_g4_mmproj_name names what they read) is refused by name:
 * biases, a key scale (a.blk.N.per_dim_k_scale), a soft-embedding norm weight
 * (mm.a.soft_emb_norm), a layer output scale other than 1 (v.blk.N.out_scale):
 * transformers' towers have none of them. */

void md_mmproj_projector(const struct md_gguf *mm, const char *modality, char *buf, size_t n) {
  const char *s;
  size_t len;
  char k[64];
  snprintf(k, sizeof(k), "clip.%s.projector_type", modality);
  buf[0] = 0;
  if (!md_gguf_get_str(mm, "clip.projector_type", &s, &len) || !md_gguf_get_str(mm, k, &s, &len))
    snprintf(buf, n, "%.*s", (int)(len < n ? len : n - 1), s);
}

/* Tensor name's dimensions (innermost first) into ne, or a sentence when it
 * is missing or has not dims of them. */
static int tensor_dims(const struct md_gguf *mm, const char *name, int dims, int64_t *ne, char *err,
                       size_t errlen) {
  const struct md_gguf_tensor *t = md_gguf_find_tensor(mm, name);
  if (!t) return cm_fail(err, errlen, CM_ERR_PARSE, "mmproj: %s missing", name);
  if (t->n_dims != dims)
    return cm_fail(err, errlen, CM_ERR_SHAPE, "mmproj: %s has %d dimensions (want %d)", name,
                   t->n_dims, dims);
  memcpy(ne, t->ne, sizeof(t->ne));
  return 0;
}

/* Tensors the towers do not read, which transformers' towers have no
 * counterpart of (md_g4_mmproj_name names only what they read): a sentence
 * naming the first, or 0. A layer output scale (v.blk.N.out_scale, which the
 * vision layers of transformers' tower do not have) passes only as f32 ones. */
static int refuse_unread(const struct md_gguf *mm, char *err, size_t errlen) {
  for (int i = 0; i < md_gguf_tensor_count(mm); i++) {
    const struct md_gguf_tensor *t = md_gguf_tensor_at(mm, i);
    char hf[256];
    int layer, used = 0;
    if (!md_g4_mmproj_name(t->name, hf, sizeof(hf)))
      return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                     "mmproj: %s is not read (transformers' Gemma 4 towers have no such tensor)",
                     t->name);
    if (sscanf(t->name, "v.blk.%d.%n", &layer, &used) != 1 || !used ||
        strcmp(t->name + used, "out_scale.weight"))
      continue;
    int ones = t->type == MD_GGML_F32 && t->data;
    for (size_t e = 0; ones && e < t->nbytes / 4; e++) {
      float x;
      memcpy(&x, (const char *)t->data + 4 * e, 4);
      ones = x == 1.0f;
    }
    if (!ones)
      return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                     "mmproj: %s is a layer output scale %s (transformers' Gemma 4 vision layers "
                     "have none)",
                     t->name, t->type == MD_GGML_F32 ? "other than 1" : "not in f32");
  }
  return 0;
}

/* Three marker tokens' ids as root's fields: from the text file's
 * vocabulary, or Gemma4Config's defaults def in a file without one. */
static int g4_tokens(const struct md_gguf *text, json_t *root, const char *const *tok,
                     const char *const *field, const int64_t *def, char *err, size_t errlen) {
  int vocab = md_gguf_find_kv(text, "tokenizer.ggml.tokens") != NULL;
  for (int i = 0; i < 3; i++) {
    int64_t id = vocab ? token_id(text, tok[i]) : def[i];
    if (id < 0)
      return cm_fail(err, errlen, CM_ERR_PARSE, "mmproj: the model's vocabulary has no %s", tok[i]);
    json_object_set_new(root, field[i], json_integer(id));
  }
  return 0;
}

/* The vision tower's fields as vision_config and its token ids into root. */
static int g4_vision_json(const struct md_gguf *mm, const struct md_gguf *text, json_t *root,
                          int64_t hidden, char *err, size_t errlen) {
  json_t *vc = json_object();
  json_object_set_new(root, "vision_config", vc);
  json_object_set_new(vc, "model_type", json_string("gemma4_vision"));
  int64_t D = 0, patch = 0, pool = 3, qn[MD_GGUF_MAX_DIMS], kn[MD_GGUF_MAX_DIMS];
  int64_t pe[MD_GGUF_MAX_DIMS], pk[MD_GGUF_MAX_DIMS];
  double eps = 1e-6;
  int rc;
  if ((rc = clip_int(mm, "vision", "embedding_length", vc, "hidden_size", &D, err, errlen)) ||
      (rc = clip_int(mm, "vision", "feed_forward_length", vc, "intermediate_size", NULL, err,
                     errlen)) ||
      (rc = clip_int(mm, "vision", "block_count", vc, "num_hidden_layers", NULL, err, errlen)) ||
      (rc = clip_int(mm, "vision", "attention.head_count", vc, "num_attention_heads", NULL, err,
                     errlen)) ||
      (rc = clip_int(mm, "vision", "patch_size", vc, "patch_size", &patch, err, errlen)) ||
      (rc = tensor_dims(mm, "v.blk.0.attn_q_norm.weight", 1, qn, err, errlen)) ||
      (rc = tensor_dims(mm, "v.blk.0.attn_k.weight", 2, kn, err, errlen)) ||
      (rc = tensor_dims(mm, "v.position_embd.weight", 3, pe, err, errlen)) ||
      (rc = tensor_dims(mm, "v.patch_embd.weight", 4, pk, err, errlen)))
    return rc;
  int64_t hd = qn[0], kv = kn[1], P = pe[1];
  /* the patch projection as a convolution's kernel [D, 3, p, p] (ne innermost first) */
  if (pk[0] != patch || pk[1] != patch || pk[2] != 3 || pk[3] != D)
    return cm_fail(err, errlen, CM_ERR_SHAPE,
                   "mmproj: v.patch_embd.weight is not a convolution's kernel of %lld x %lld "
                   "pixels, 3 channels in and %lld out",
                   (long long)patch, (long long)patch, (long long)D);
  if (hd < 1 || kv % hd || pe[2] != 2 || pe[0] != D)
    return cm_fail(err, errlen, CM_ERR_SHAPE,
                   "mmproj: v.blk.0.attn_k's %lld rows are not whole heads of %lld (attn_q_norm), "
                   "or v.position_embd is not two tables of width %lld",
                   (long long)kv, (long long)hd, (long long)D);
  md_gguf_get_f64(mm, "clip.vision.attention.layer_norm_epsilon", &eps);
  md_gguf_get_int(mm, "clip.vision.projector.scale_factor", &pool);
  if ((rc = check_projection(mm, "vision", hidden, err, errlen))) return rc;
  static const char *const norm[2] = {"image_mean", "image_std"};
  for (int i = 0; i < 2; i++) {
    char k[64];
    double x;
    snprintf(k, sizeof(k), "clip.vision.%s", norm[i]);
    const struct md_gguf_kv *a = md_gguf_find_kv(mm, k);
    for (uint64_t c = 0; a && c < (a->type == MD_GGUF_ARRAY ? a->n : 0); c++)
      if (md_gguf_arr_f64(a, c, &x) || x != (double)i)
        return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                       "mmproj: %s is not %d (Gemma 4's image processor does not normalise)", k, i);
  }
  json_object_set_new(vc, "num_key_value_heads", json_integer(kv / hd));
  json_object_set_new(vc, "head_dim", json_integer(hd));
  json_object_set_new(vc, "pooling_kernel_size", json_integer(pool));
  json_object_set_new(vc, "position_embedding_size", json_integer(P));
  json_object_set_new(vc, "rms_norm_eps", json_real(eps));
  json_object_set_new(vc, "use_clipped_linears",
                      json_boolean(md_gguf_find_tensor(mm, "v.blk.0.attn_q.input_min") != NULL));
  json_object_set_new(vc, "standardize",
                      json_boolean(md_gguf_find_tensor(mm, "v.std_bias") != NULL));
  return g4_tokens(text, root, (const char *const[]){"<|image>", "<image|>", "<|image|>"},
                   (const char *const[]){"boi_token_id", "eoi_token_id", "image_token_id"},
                   (const int64_t[]){255999, 258882, 258880}, err, errlen);
}

/* The audio tower's fields as audio_config and its token ids into root. */
static int g4_audio_json(const struct md_gguf *mm, const struct md_gguf *text, json_t *root,
                         int64_t hidden, char *err, size_t errlen) {
  json_t *ac = json_object();
  json_object_set_new(root, "audio_config", ac);
  json_object_set_new(ac, "model_type", json_string("gemma4_audio"));
  int64_t mel = 128, c0[MD_GGUF_MAX_DIMS], c1[MD_GGUF_MAX_DIMS], dw[MD_GGUF_MAX_DIMS];
  int64_t out[MD_GGUF_MAX_DIMS];
  int rc;
  if ((rc = clip_int(mm, "audio", "embedding_length", ac, "hidden_size", NULL, err, errlen)) ||
      (rc = clip_int(mm, "audio", "block_count", ac, "num_hidden_layers", NULL, err, errlen)) ||
      (rc = clip_int(mm, "audio", "attention.head_count", ac, "num_attention_heads", NULL, err,
                     errlen)) ||
      (rc = tensor_dims(mm, "a.conv1d.0.weight", 4, c0, err, errlen)) ||
      (rc = tensor_dims(mm, "a.conv1d.1.weight", 4, c1, err, errlen)) ||
      (rc = tensor_dims(mm, "a.blk.0.conv_dw.weight", 2, dw, err, errlen)) ||
      (rc = tensor_dims(mm, "a.pre_encode.out.weight", 2, out, err, errlen)))
    return rc;
  md_gguf_get_int(mm, "clip.audio.num_mel_bins", &mel);
  if (mel != 128)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "mmproj: clip.audio.num_mel_bins %lld (the feature extractor makes 128)",
                   (long long)mel);
  if ((rc = check_projection(mm, "audio", hidden, err, errlen))) return rc;
  json_object_set_new(ac, "subsampling_conv_channels", json_pack("[I,I]", c0[3], c1[3]));
  json_object_set_new(ac, "conv_kernel_size", json_integer(dw[0]));
  json_object_set_new(ac, "output_proj_dims", json_integer(out[1]));
  json_object_set_new(ac, "rms_norm_eps", json_real(1e-6));
  json_object_set_new(ac, "use_clipped_linears",
                      json_boolean(md_gguf_find_tensor(mm, "a.blk.0.attn_q.input_min") != NULL));
  return g4_tokens(text, root, (const char *const[]){"<|audio>", "<audio|>", "<|audio|>"},
                   (const char *const[]){"boa_token_id", "eoa_token_index", "audio_token_id"},
                   (const int64_t[]){256000, 258883, 258881}, err, errlen);
}

static int add_mmproj_g4(const struct md_gguf *mm, const struct md_gguf *text,
                         struct md_config *cfg, char *err, size_t errlen) {
  char vt[32], at[32];
  int has_v = 0, has_a = 0;
  md_gguf_get_bool(mm, "clip.has_vision_encoder", &has_v);
  md_gguf_get_bool(mm, "clip.has_audio_encoder", &has_a);
  md_mmproj_projector(mm, "vision", vt, sizeof(vt));
  md_mmproj_projector(mm, "audio", at, sizeof(at));
  if ((has_v && strcmp(vt, "gemma4v")) || (has_a && strcmp(at, "gemma4a")) || (!has_v && !has_a))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "mmproj: a Gemma 4 model takes Gemma 4's towers: a vision encoder of projector "
                   "\"gemma4v\" and/or an audio encoder of \"gemma4a\" (this file: vision %s%s%s, "
                   "audio %s%s%s)",
                   has_v ? "\"" : "none", has_v ? vt : "", has_v ? "\"" : "", has_a ? "\"" : "none",
                   has_a ? at : "", has_a ? "\"" : "");
  int rc = refuse_unread(mm, err, errlen);
  if (rc) return rc;
  json_t *root = json_object(), *tc = json_object();
  json_object_set_new(root, "text_config", tc);
  json_object_set_new(tc, "use_bidirectional_attention",
                      cfg->ple_dim ? json_null() : json_string("vision"));
  if (has_v) rc = g4_vision_json(mm, text, root, cfg->hidden, err, errlen);
  if (!rc && has_a) rc = g4_audio_json(mm, text, root, cfg->hidden, err, errlen);
  char *js = rc ? NULL : json_dumps(root, JSON_COMPACT);
  json_decref(root);
  if (rc) return rc;
  if (!js) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  rc = md_config_parse_vision(js, strlen(js), cfg, err, errlen);
  free(js);
  if (rc) {
    cfg->vision_g4.present = cfg->audio_g4.present = 0;
    if (!strncmp(err, "config.json: ", 13)) { /* the fields came from this file */
      char why[512];
      snprintf(why, sizeof(why), "%s", err + 13);
      cm_fail(err, errlen, rc, "mmproj: %s (as read from the file)", why);
    }
    return rc;
  }
  snprintf(cfg->model_type, sizeof(cfg->model_type), "gemma4");
  return 0;
}

/* The tower md_model_mmproj_path finds for model into cfg (0 and cfg as it
 * was when there is none, or when one found in the folder cannot be read: a
 * warning, and the model serves text). */
static int load_mmproj(const char *model, const struct md_gguf *text, struct md_config *cfg,
                       char *err, size_t errlen) {
  char path[4200];
  int rc = md_model_mmproj_path(model, path, sizeof(path), err, errlen);
  if (rc <= 0) return rc;
  struct md_gguf *mm = NULL;
  if (!(rc = md_gguf_open(path, &mm, err, errlen)))
    rc = md_config_add_mmproj(mm, text, cfg, err, errlen);
  md_gguf_close(mm);
  if (!rc) return 0;
  char why[512];
  snprintf(why, sizeof(why), "%s", err);
  if (!mmproj_named[0]) { /* found in the folder, not asked for: the text still serves */
    cm_warn("model", "%s: %s; serving text only (--mmproj FILE names a tower)", path, why);
    err[0] = 0;
    return 0;
  }
  return cm_fail(err, errlen, rc, "%s: %s", path, why);
}
