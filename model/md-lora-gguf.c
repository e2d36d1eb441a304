/* md-lora-gguf.c — LoRA adapters in llama.cpp's GGUF layout (what its
 * convert_lora_to_gguf.py writes and llama_adapter_lora_init, src/llama-adapter.cpp,
 * loads), read into the same struct md_lora as a PEFT folder: A [r, in] and B
 * [out, r] as the tensors' bytes in the file, which ggml stores innermost
 * dimension first (A's ne [in, r], B's ne [r, out]: the same bytes as PEFT's
 * row-major A and B), so that the worker reads either kind alike.
 *
 * What the file holds (llama.cpp's converter, gguf-py's constants.py):
 *   general.type "adapter", adapter.type "lora" (llama.cpp refuses anything else);
 *   general.architecture the base model's ("gemma3", "gemma4"; llama.cpp refuses
 *     an adapter of another architecture than the model's);
 *   adapter.lora.alpha (f32): a module's scale is alpha / r, r its lora_b's ne[0];
 *     alpha absent or 0 scales by 1 (llama_adapter_lora_weight::get_scale);
 *   adapter.alora.invocation_tokens (u32 array): activated LoRA, refused here;
 *   adapter.lora.task_name, adapter.lora.prompt_prefix: names llama.cpp lists
 *     and nothing else reads, ignored;
 *   tensors blk.N.attn_q.weight.lora_a / .lora_b (and attn_k, attn_v, attn_output,
 *     ffn_gate, ffn_up, ffn_down: tensor_mapping.py's names for the q/k/v/o_proj
 *     and gate/up/down_proj of decoder layer N), F32, F16, BF16 or Q8_0 (the
 *     converter's --outtype); token_embd.weight.lora_a / _b (token embeddings,
 *     A transposed) and *_norm.weight (norms replaced whole, which llama.cpp
 *     skips) come from mergekit's adapters.
 * llama.cpp checks A's ne[0] and B's ne[1] against the model tensor's ne[0]
 * (in) and ne[1] (out), and A's ne[1] against B's ne[0] (the rank).
 *
 * Refused, naming the file and the key or tensor: a file that is not a LoRA
 * adapter (a model, an mmproj file), an architecture other than the model's,
 * aLoRA, a tensor of a block format (Q8_0 ...) or of an unknown type, token
 * embeddings, the head, norms, any other name, a shape that does not fit the
 * model, ranks that differ between modules (the worker takes one rank per
 * adapter), an A without its B. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-fs.h"
#include "model/md-gguf.h"
#include "model/md-lora.h"

/* llama.cpp's names of a decoder layer's projections, in enum md_lora_mod's order */
static const char *const gguf_mods[MD_LORA_N_MODS] = {
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
};

static void close_gguf(void *g) {
  md_gguf_close(g);
}

/* ---- metadata --------------------------------------------------------------- */

/* The string value of key into out[n] (cut to fit): 1, 0 when absent, or
 * CM_ERR_PARSE (with a reason) when it is not a string. */
static int get_str(const struct md_gguf *g, const char *path, const char *key, char *out, size_t n,
                   char *err, size_t errlen) {
  const char *s;
  size_t len;
  int rc = md_gguf_get_str(g, key, &s, &len);
  if (rc == CM_ERR_NOENT) return 0;
  if (rc) return cm_fail(err, errlen, CM_ERR_PARSE, "%s: %s is not a string", path, key);
  snprintf(out, n, "%.*s", (int)(len < n ? len : n - 1), s);
  return 1;
}

/* general.type, adapter.type, general.architecture and the keys that are
 * refused checked; adapter.lora.alpha into *alpha (0 when absent; llama.cpp's
 * converter writes an f32, any number is taken). */
static int check_meta(const struct md_gguf *g, const char *path, const struct md_config *cfg,
                      double *alpha, char *err, size_t errlen) {
  char type[64] = "", atype[64] = "", arch[64] = "";
  int rc, has = get_str(g, path, "general.type", type, sizeof(type), err, errlen);
  if (has < 0) return has;
  if (!has || strcmp(type, "adapter")) {
    if (!strcmp(type, "model") || (!has && md_gguf_find_tensor(g, "token_embd.weight")))
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "%s is a model (%s), not a LoRA adapter: name a GGUF adapter file "
                     "(convert_lora_to_gguf.py) or a PEFT adapter folder",
                     path, has ? "general.type \"model\"" : "no general.type, a token_embd.weight");
    if (!strcmp(type, "mmproj"))
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "%s is a vision/audio tower (general.type \"mmproj\"), not a LoRA adapter",
                     path);
    if (!has)
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "%s: general.type is missing: not a LoRA adapter (an adapter file says "
                     "\"adapter\")",
                     path);
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "%s: general.type is \"%s\", not \"adapter\": not a LoRA adapter", path, type);
  }
  if ((has = get_str(g, path, "adapter.type", atype, sizeof(atype), err, errlen)) < 0) return has;
  if (!has || strcmp(atype, "lora"))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "%s: adapter.type is %s%s%s, not \"lora\": only LoRA adapters load", path,
                   has ? "\"" : "", has ? atype : "missing", has ? "\"" : "");
  if ((has = get_str(g, path, "general.architecture", arch, sizeof(arch), err, errlen)) < 0)
    return has;
  const char *want = md_arch_name(cfg->arch);
  if (!has)
    return cm_fail(err, errlen, CM_ERR_PARSE,
                   "%s: general.architecture is missing (the base model's, %s)", path, want);
  if (strcmp(arch, want))
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "%s: an adapter for %s (general.architecture), the model is %s", path, arch,
                   want);
  if (md_gguf_find_kv(g, "adapter.alora.invocation_tokens"))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "%s: adapter.alora.invocation_tokens is set: activated LoRA (aLoRA) is not "
                   "supported",
                   path);
  *alpha = 0;
  rc = md_gguf_get_f64(g, "adapter.lora.alpha", alpha);
  if (rc && rc != CM_ERR_NOENT)
    return cm_fail(err, errlen, CM_ERR_PARSE, "%s: adapter.lora.alpha is not a number", path);
  if (!isfinite(*alpha))
    return cm_fail(err, errlen, CM_ERR_RANGE, "%s: adapter.lora.alpha is not finite", path);
  return 0;
}

/* ---- tensor names --------------------------------------------------------------- */

static int ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), k = strlen(tail);
  return n >= k && !memcmp(s + n - k, tail, k);
}

/* Tensor `name` as (layer, module, B or A): 0, or a negative cm_err with the
 * reason. The layer is only parsed (bounded by MD_MAX_LAYERS), not checked
 * against the model. */
static int parse_name(const char *path, const char *name, int *layer, int *mod, int *is_b,
                      char *err, size_t errlen) {
  int b = ends_with(name, ".lora_b");
  size_t stem = strlen(name) - (b || ends_with(name, ".lora_a") ? 7 : 0); /* without the suffix */
  if (stem == strlen(name)) {
    if (ends_with(name, "_norm.weight"))
      return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                     "%s: tensor %s replaces a norm's weight: only LoRA pairs (lora_a, lora_b) "
                     "are supported (llama.cpp skips such tensors)",
                     path, name);
  } else if (!strncmp(name, "token_embd.weight", stem) && stem == 17) {
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "%s: tensor %s adapts the token embeddings: only the language model's "
                   "linear layers take adapters",
                   path, name);
  } else if (!strncmp(name, "output.weight", stem) && stem == 13) {
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "%s: tensor %s adapts the output head: only the language model's linear "
                   "layers take adapters",
                   path, name);
  } else if (!strncmp(name, "blk.", 4)) {
    const char *p = name + 4;
    long n = 0;
    int ok = p[0] >= '0' && p[0] <= '9' && !(p[0] == '0' && p[1] >= '0' && p[1] <= '9');
    for (; ok && *p >= '0' && *p <= '9'; p++)
      if ((n = n * 10 + (*p - '0')) >= MD_MAX_LAYERS) n = MD_MAX_LAYERS; /* out of any model */
    ok = ok && *p++ == '.';
    for (int m = 0; ok && m < MD_LORA_N_MODS; m++) {
      size_t k = strlen(gguf_mods[m]);
      if (!strncmp(p, gguf_mods[m], k) && !strncmp(p + k, ".weight", 7) &&
          (size_t)(p + k + 7 - name) == stem) {
        *layer = (int)n;
        *mod = m;
        *is_b = b;
        return 0;
      }
    }
  }
  return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                 "%s: tensor %s is not a LoRA weight of a layer's attn_q/k/v/output or "
                 "ffn_gate/up/down (blk.N.attn_q.weight.lora_a, ...)",
                 path, name);
}

/* ---- tensors -------------------------------------------------------------------- */

/* Checks GGUF tensor gt as module `mod` of `layer` (A or B) against the model
 * and the rank seen so far (l->rank, 0 before the first; *first names the
 * tensor that set it), and adds it to l->st as [r, in] / [out, r]. */
static int add_tensor(struct md_lora *l, const struct md_config *cfg, const char *path,
                      const struct md_gguf_tensor *gt, int layer, int mod, int is_b,
                      const char **first, char *err, size_t errlen) {
  const char *name = gt->name;
  if (layer >= cfg->n_layers)
    return cm_fail(err, errlen, CM_ERR_RANGE, "%s: tensor %s: layer %s%d, the model has %d layers",
                   path, name, layer >= MD_MAX_LAYERS ? ">= " : "", layer, cfg->n_layers);
  int in, out;
  if (md_lora_dims(cfg, layer, (enum md_lora_mod)mod, &in, &out))
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "%s: tensor %s: layer %d has no %s (attention_k_eq_v: its V is its K "
                   "projection)",
                   path, name, layer, gguf_mods[mod]);
  enum md_st_dtype dt = gt->type == MD_GGML_F32    ? MD_ST_F32
                        : gt->type == MD_GGML_F16  ? MD_ST_F16
                        : gt->type == MD_GGML_BF16 ? MD_ST_BF16
                                                   : MD_ST_OTHER;
  char tb[32];
  if (dt == MD_ST_OTHER)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "%s: tensor %s is %s: adapters load F32, F16 or BF16 (convert_lora_to_gguf.py "
                   "--outtype f32, f16 or bf16)",
                   path, name, md_ggml_type_name(gt->type, tb, sizeof(tb)));
  /* A: ne [in, r]; B: ne [r, out] */
  int64_t r = is_b ? gt->ne[0] : gt->ne[1], width = is_b ? gt->ne[1] : gt->ne[0];
  if (gt->n_dims != 2 || width != (is_b ? out : in) || r < 1 || r > MD_LORA_MAX_RANK) {
    char found[96];
    int k = snprintf(found, sizeof(found), "[");
    for (int d = 0; d < gt->n_dims && k > 0 && (size_t)k < sizeof(found); d++)
      k += snprintf(found + k, sizeof(found) - (size_t)k, "%s%lld", d ? ", " : "",
                    (long long)gt->ne[d]);
    if (k > 0 && (size_t)k < sizeof(found)) snprintf(found + k, sizeof(found) - (size_t)k, "]");
    return cm_fail(err, errlen, CM_ERR_SHAPE,
                   is_b ? "%s: tensor %s has ne %s, expected [r, %d] (lora_b: ne [r, out], r in "
                          "[1, %d])"
                        : "%s: tensor %s has ne %s, expected [%d, r] (lora_a: ne [in, r], r in "
                          "[1, %d])",
                   path, name, found, is_b ? out : in, MD_LORA_MAX_RANK);
  }
  if (!gt->data) /* md_gguf gives every tensor of a known type with elements its bytes */
    return cm_fail(err, errlen, CM_ERR_INVAL, "%s: tensor %s has no data", path, name);
  if (!l->rank) {
    l->rank = (int)r;
    *first = name;
  } else if (r != l->rank) {
    return cm_fail(err, errlen, CM_ERR_SHAPE,
                   "%s: tensor %s has rank %lld, tensor %s rank %d: adapters whose modules' ranks "
                   "differ are not supported",
                   path, name, (long long)r, *first, l->rank);
  }
  struct md_tensor t = {
      .name = name, .dtype = dt, .ndim = 2, .data = gt->data, .nbytes = gt->nbytes};
  snprintf(t.dtype_name, sizeof(t.dtype_name), "%s", md_st_dtype_name(dt));
  t.shape[0] = gt->ne[1];
  t.shape[1] = gt->ne[0];
  if (md_st_add(l->st, &t)) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  return 0;
}

int md_lora_open_gguf(const char *path, const struct md_config *cfg, struct md_lora **out,
                      char *err, size_t errlen) {
  *out = NULL;
  if (!cfg || cfg->n_layers < 1 || cfg->n_layers > MD_MAX_LAYERS)
    return cm_fail(err, errlen, CM_ERR_INVAL, "%s: the model's config has no layers", path);
  struct md_gguf *g = NULL;
  int rc = md_gguf_open(path, &g, err, errlen);
  if (rc) return rc;
  double alpha = 0;
  if ((rc = check_meta(g, path, cfg, &alpha, err, errlen))) {
    md_gguf_close(g);
    return rc;
  }
  struct md_lora *l = calloc(1, sizeof(*l));
  if (!l || md_st_new(cm_base_name(path), close_gguf, g, &l->st)) {
    free(l);
    md_gguf_close(g);
    return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  }
  size_t map_len;
  void *map = md_gguf_mapping(g, &map_len);
  if (map) md_st_owner_pages(l->st, map, map_len);
  l->gguf = 1;
  l->alpha = alpha;
  l->n_layers = cfg->n_layers;
  l->mods = calloc((size_t)cfg->n_layers, sizeof(*l->mods));
  if (!l->mods) {
    rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
    goto fail;
  }

  /* every tensor checked and added to the directory, then bound by name (the
     directory sorts its tensors when sealed) */
  const char *first = NULL;
  for (int i = 0; i < md_gguf_tensor_count(g); i++) {
    const struct md_gguf_tensor *gt = md_gguf_tensor_at(g, i);
    int layer = 0, mod = 0, is_b = 0;
    if ((rc = parse_name(path, gt->name, &layer, &mod, &is_b, err, errlen))) goto fail;
    if ((rc = add_tensor(l, cfg, path, gt, layer, mod, is_b, &first, err, errlen))) goto fail;
  }
  if ((rc = md_st_seal(l->st, err, errlen))) goto fail;
  for (int i = 0; i < md_st_count(l->st); i++) {
    const struct md_tensor *t = md_st_get(l->st, i);
    int layer = 0, mod = 0, is_b = 0;
    if ((rc = parse_name(path, t->name, &layer, &mod, &is_b, err, errlen))) goto fail;
    struct md_lora_mod_w *w = &l->mods[layer][mod];
    *(is_b ? &w->b : &w->a) = t; /* one of each: the file's names are unique */
  }
  for (int i = 0; i < l->n_layers; i++)
    for (int m = 0; m < MD_LORA_N_MODS; m++) {
      const struct md_lora_mod_w *w = &l->mods[i][m];
      if (!w->a != !w->b) {
        const char *name = w->a ? w->a->name : w->b->name;
        rc = cm_fail(err, errlen, CM_ERR_INVAL, "%s: %.*s has lora_%c but no lora_%c", path,
                     (int)(strlen(name) - 7), name, w->a ? 'a' : 'b', w->a ? 'b' : 'a');
        goto fail;
      }
      l->n_adapted += w->a != NULL;
    }
  if (!l->n_adapted) {
    rc = cm_fail(err, errlen, CM_ERR_INVAL, "%s: adapts no layer of the language model", path);
    goto fail;
  }
  /* llama.cpp: alpha / r, r lora_b's ne[0]; a zero (or absent) alpha scales by 1 */
  l->scale = alpha != 0 ? alpha / (double)l->rank : 1.0;
  *out = l;
  return 0;
fail:
  md_lora_close(l);
  return rc;
}
