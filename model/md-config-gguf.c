/* md-config-gguf.c — a GGUF file's metadata as a checkpoint config: the keys
 * llama.cpp's converter writes for Gemma 3 (gemma3.*) turned into the fields
 * of config.json, which md_config_parse then checks and plans as it does any
 * config, so both paths share every rule.
 *
 * What llama.cpp fixes where the file is silent, followed here the same way:
 * sliding layers' RoPE base 10000 (gemma3.rope.freq_base_swa when present),
 * every sixth layer full (gemma3.attention.sliding_window_pattern when
 * present: one bool per layer, true for sliding), an attention scale of
 * 1/sqrt(head_dim) except on 62-layer models (1/sqrt(hidden / heads)). The
 * norm weights are stored as 1 + w (cfg->gguf). */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "model/md-config.h"
#include "model/md-gguf.h"

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
    snprintf(path, n, "%s", model);
    return 1;
  }
  if (!S_ISDIR(st.st_mode)) return 0;
  char probe[4200];
  snprintf(probe, sizeof(probe), "%s/config.json", model);
  if (!access(probe, F_OK)) return 0; /* a Hugging Face checkpoint */
  DIR *d = opendir(model);
  if (!d) return 0;
  int found = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t l = strlen(e->d_name);
    if (l < 6 || strcmp(e->d_name + l - 5, ".gguf")) continue;
    if (found++) {
      closedir(d);
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "%s holds several .gguf files and no config.json: name the file", model);
    }
    snprintf(path, n, "%s/%s", model, e->d_name);
  }
  closedir(d);
  return found;
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

int md_config_from_gguf(const struct md_gguf *g, struct md_config *cfg, char *err, size_t errlen) {
  const char *arch;
  size_t alen;
  char a[32], k[160];
  if (md_gguf_get_str(g, "general.architecture", &arch, &alen))
    return cm_fail(err, errlen, CM_ERR_PARSE, "GGUF: general.architecture missing");
  if (alen != 6 || memcmp(arch, "gemma3", 6))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "GGUF: general.architecture \"%.*s\" is not supported (gemma3)", (int)alen,
                   arch);
  snprintf(a, sizeof(a), "%.*s", (int)alen, arch);
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
  json_t *c = json_object(), *types = json_array(), *eos = json_array();
  if (!c || !types || !eos) {
    json_decref(c), json_decref(types), json_decref(eos);
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
  int64_t bos = 2, id;
  md_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &bos);
  if (!md_gguf_get_int(g, "tokenizer.ggml.eos_token_id", &id))
    json_array_append_new(eos, json_integer(id));
  if (!md_gguf_get_int(g, "tokenizer.ggml.eot_token_id", &id))
    json_array_append_new(eos, json_integer(id));
  if ((id = token_id(g, "<end_of_turn>")) >= 0) json_array_append_new(eos, json_integer(id));
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
  json_object_set_new(c, "bos_token_id", json_integer(bos >= 0 && bos < vocab ? bos : 0));
  json_object_set_new(c, "layer_types", types);
  if (json_array_size(eos))
    json_object_set_new(c, "eos_token_id", eos);
  else
    json_decref(eos);
  char *text = rc ? NULL : json_dumps(c, JSON_COMPACT);
  json_decref(c);
  if (rc) return rc;
  if (!text) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  rc = md_config_parse(text, strlen(text), cfg, err, errlen);
  free(text);
  if (!rc) cfg->gguf = 1;
  return rc;
}

int md_config_load_gguf(const char *path, struct md_config *cfg, char *err, size_t errlen) {
  struct md_gguf *g = NULL;
  int rc = md_gguf_open(path, &g, err, errlen);
  if (rc) return rc;
  rc = md_config_from_gguf(g, cfg, err, errlen);
  md_gguf_close(g);
  return rc;
}
