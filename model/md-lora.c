/* md-lora.c — PEFT LoRA adapters: adapter_config.json's settings checked
 * against the plain LoRA the server applies, adapter_model.safetensors' tensor
 * names mapped to (layer, module, A or B) and their shapes checked against the
 * model's config; slices of A and B read out as f32. A path that is a file goes
 * to md-lora-gguf.c (llama.cpp's GGUF adapters). */
#include "model/md-lora.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/cm-err.h"
#include "model/md-gguf.h"

#define LORA_CONFIG_CAP (1u << 20) /* bytes: adapter_config.json is a few hundred */
#define LORA_CONFIG     "adapter_config.json"
#define LORA_WEIGHTS    "adapter_model.safetensors"
#define LORA_PICKLE     "adapter_model.bin"

/* PeftModel wraps the model as base_model (LoraModel), whose .model is the
 * transformers model; get_peft_model_state_dict strips the adapter's name
 * ("lora_A.default.weight" is saved "lora_A.weight"). */
#define LORA_ROOT "base_model.model."

static const char *const mod_names[MD_LORA_N_MODS] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
};

/* the submodule of a decoder layer each projection lives in */
static const char *const mod_parents[MD_LORA_N_MODS] = {
    "self_attn", "self_attn", "self_attn", "self_attn", "mlp", "mlp", "mlp",
};

/* Where the decoder layers sit: Gemma3ForCausalLM / Gemma4ForCausalLM
 * ("model."), the multimodal ForConditionalGeneration classes (current
 * transformers "model.language_model.", older "language_model.model."), and
 * their base models ("language_model."). */
static const char *const layer_prefixes[] = {
    "model.",
    "model.language_model.",
    "language_model.model.",
    "language_model.",
};

const char *md_lora_mod_name(enum md_lora_mod mod) {
  return (unsigned)mod < MD_LORA_N_MODS ? mod_names[mod] : "?";
}

int md_lora_dims(const struct md_config *cfg, int layer, enum md_lora_mod mod, int *in, int *out) {
  if (!cfg || layer < 0 || layer >= cfg->n_layers || layer >= MD_MAX_LAYERS ||
      (unsigned)mod >= MD_LORA_N_MODS)
    return CM_ERR_RANGE;
  const struct md_layer_cfg *lc = &cfg->layers[layer];
  int q = cfg->n_heads * lc->head_dim, kv = lc->n_kv_heads * lc->head_dim;
  int i = 0, o = 0;
  switch (mod) {
  case MD_LORA_Q: i = cfg->hidden, o = q; break;
  case MD_LORA_K: i = cfg->hidden, o = kv; break;
  case MD_LORA_V:
    if (lc->k_eq_v) return CM_ERR_INVAL;
    i = cfg->hidden, o = kv;
    break;
  case MD_LORA_O: i = q, o = cfg->hidden; break;
  case MD_LORA_GATE:
  case MD_LORA_UP: i = cfg->hidden, o = lc->ffn_dim; break;
  case MD_LORA_DOWN: i = lc->ffn_dim, o = cfg->hidden; break;
  default: return CM_ERR_RANGE;
  }
  *in = i;
  *out = o;
  return 0;
}

void md_lora_close(struct md_lora *l) {
  if (!l) return;
  md_st_close(l->st);
  free(l->mods);
  free(l);
}

/* ---- adapter_config.json -------------------------------------------------- */

/* Python's truth value of a JSON value, as PEFT tests its settings
 * (`if config.use_dora:`): null, false, 0, "", [] and {} are false. */
static int json_truthy(const json_t *v) {
  if (!v) return 0;
  switch (json_typeof(v)) {
  case JSON_NULL:
  case JSON_FALSE: return 0;
  case JSON_TRUE: return 1;
  case JSON_INTEGER: return json_integer_value(v) != 0;
  case JSON_REAL: return json_real_value(v) != 0;
  case JSON_STRING: return json_string_length(v) != 0;
  case JSON_ARRAY: return json_array_size(v) != 0;
  case JSON_OBJECT: return json_object_size(v) != 0;
  }
  return 1;
}

/* Settings that change what an adapter computes (or add weights beside A and
 * B) in ways the server does not apply: any of them set refuses the adapter. */
static const struct {
  const char *key;
  const char *why;
} refused_keys[] = {
    {"use_dora", "DoRA adapters are not supported"},
    {"fan_in_fan_out", "weights stored (in, out) are not supported (Gemma's projections are "
                       "nn.Linear)"},
    {"modules_to_save", "whole modules trained beside the adapter are not supported"},
    {"rank_pattern", "per-module ranks are not supported"},
    {"alpha_pattern", "per-module alphas are not supported"},
    {"layer_replication", "replicated layers are not supported"},
    {"lora_bias", "biases on lora_B are not supported"},
    {"use_qalora", "QALoRA is not supported"},
    {"target_parameters", "adapters on parameters (such as MoE experts) are not supported"},
    {"trainable_token_indices", "trainable token embeddings are not supported"},
    {"alora_invocation_tokens", "activated LoRA (aLoRA) is not supported"},
    {"arrow_config", "Arrow routing is not supported"},
    {"use_bdlora", "block-diagonal LoRA is not supported"},
};

/* adapter_config.json's text into l's rank, alpha, rslora, scale and base
 * model; missing settings take LoraConfig's defaults (r 8, lora_alpha 8). */

/* Key `key` of root when present and not null, in *v (NULL otherwise): 0, or
 * CM_ERR_PARSE naming the key when its type is not `want` (JSON_INTEGER, JSON_STRING;
 * JSON_REAL: any number; JSON_TRUE: a boolean). */
static int typed(json_t *root, const char *key, json_type want, const json_t **v, char *err,
                 size_t errlen) {
  json_t *x = json_object_get(root, key);
  *v = NULL;
  if (!x || json_is_null(x)) return 0;
  int ok = want == JSON_REAL   ? json_is_number(x)
           : want == JSON_TRUE ? json_is_boolean(x)
                               : json_typeof(x) == want;
  if (!ok)
    return cm_fail(err, errlen, CM_ERR_PARSE, LORA_CONFIG ": %s is not %s", key,
                   want == JSON_INTEGER  ? "an integer"
                   : want == JSON_STRING ? "a string"
                   : want == JSON_REAL   ? "a number"
                                         : "a boolean");
  *v = x;
  return 0;
}
static int parse_config(const char *text, size_t len, struct md_lora *l, char *err, size_t errlen) {
  json_error_t jerr;
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return cm_fail(err, errlen, CM_ERR_PARSE, LORA_CONFIG ": %s (line %d)", jerr.text, jerr.line);
  int rc = 0;
  if (!json_is_object(root)) {
    rc = cm_fail(err, errlen, CM_ERR_PARSE, LORA_CONFIG ": not a JSON object");
    goto done;
  }
  const json_t *v = json_object_get(root, "peft_type");
  if (v && !json_is_null(v)) {
    if (!json_is_string(v)) {
      rc = cm_fail(err, errlen, CM_ERR_PARSE, LORA_CONFIG ": peft_type is not a string");
      goto done;
    }
    if (strcmp(json_string_value(v), "LORA")) {
      rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   LORA_CONFIG ": peft_type is \"%.40s\": only LORA adapters load",
                   json_string_value(v));
      goto done;
    }
  }
  for (size_t i = 0; i < sizeof(refused_keys) / sizeof(refused_keys[0]); i++)
    if (json_truthy(json_object_get(root, refused_keys[i].key))) {
      rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED, LORA_CONFIG ": %s is set: %s",
                   refused_keys[i].key, refused_keys[i].why);
      goto done;
    }
  if ((rc = typed(root, "bias", JSON_STRING, &v, err, errlen))) goto done;
  if (v && strcmp(json_string_value(v), "none")) {
    rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                 LORA_CONFIG ": bias is \"%.40s\": only \"none\" is supported (trained biases "
                             "of the base layers are not)",
                 json_string_value(v));
    goto done;
  }

  long long r = 8;
  if ((rc = typed(root, "r", JSON_INTEGER, &v, err, errlen))) goto done;
  if (v) r = json_integer_value(v);
  if (r < 1 || r > MD_LORA_MAX_RANK) {
    rc = cm_fail(err, errlen, CM_ERR_RANGE, LORA_CONFIG ": r = %lld outside [1, %d]", r,
                 MD_LORA_MAX_RANK);
    goto done;
  }
  double alpha = 8;
  if ((rc = typed(root, "lora_alpha", JSON_REAL, &v, err, errlen))) goto done;
  if (v) alpha = json_number_value(v);
  if (!isfinite(alpha)) {
    rc = cm_fail(err, errlen, CM_ERR_RANGE, LORA_CONFIG ": lora_alpha is not finite");
    goto done;
  }
  if ((rc = typed(root, "use_rslora", JSON_TRUE, &v, err, errlen))) goto done;
  int rslora = v && json_is_true(v);
  if ((rc = typed(root, "base_model_name_or_path", JSON_STRING, &v, err, errlen))) goto done;
  if (v) snprintf(l->base_model, sizeof(l->base_model), "%s", json_string_value(v));
  l->rank = (int)r;
  l->alpha = alpha;
  l->rslora = rslora;
  l->scale = rslora ? alpha / sqrt((double)r) : alpha / (double)r;
done:
  json_decref(root);
  return rc;
}

/* ---- tensor names --------------------------------------------------------- */

/* Parts of a checkpoint that take no adapter here (the towers and embedders of
 * a multimodal one, the head, the embeddings), by a piece of their names. */
static const struct {
  const char *part;
  const char *what;
} foreign_parts[] = {
    {"vision_tower", "vision tower"},
    {"audio_tower", "audio tower"},
    {"multi_modal_projector", "multimodal projector"},
    {"embed_vision", "vision embedder"},
    {"embed_audio", "audio embedder"},
    {"lm_head", "output head (lm_head)"},
    {"lora_embedding_", "token embeddings"},
    {"embed_tokens", "token embeddings"},
};

/* Skips `s` at *p: 1 and *p moved past it, or 0. */
static int skip(const char **p, const char *s) {
  size_t n = strlen(s);
  if (strncmp(*p, s, n)) return 0;
  *p += n;
  return 1;
}

/* Tensor `name` as (layer, module, B or A): 0, or a negative cm_err with the
 * reason. The layer is only parsed here (bounded by MD_MAX_LAYERS), not
 * checked against the model. */
static int parse_name(const char *name, int *layer, int *mod, int *is_b, char *err, size_t errlen) {
  for (size_t i = 0; i < sizeof(foreign_parts) / sizeof(foreign_parts[0]); i++)
    if (strstr(name, foreign_parts[i].part))
      return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                     LORA_WEIGHTS ": tensor %s adapts the %s: only the language model's linear "
                                  "layers take adapters",
                     name, foreign_parts[i].what);
  if (strstr(name, "lora_magnitude_vector"))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   LORA_WEIGHTS ": tensor %s is DoRA's magnitude: DoRA adapters are not supported",
                   name);
  const char *p = name;
  int ok = skip(&p, LORA_ROOT), found = 0;
  for (size_t i = 0; ok && !found && i < sizeof(layer_prefixes) / sizeof(layer_prefixes[0]); i++) {
    const char *q = p;
    if (skip(&q, layer_prefixes[i]) && skip(&q, "layers.")) {
      p = q;
      found = 1;
    }
  }
  ok = found;
  long n = 0;
  if (ok && (p[0] < '0' || p[0] > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9'))) ok = 0;
  for (; ok && *p >= '0' && *p <= '9'; p++)
    if ((n = n * 10 + (*p - '0')) >= MD_MAX_LAYERS) n = MD_MAX_LAYERS; /* out of any model */
  ok = ok && skip(&p, ".");
  int m = -1;
  for (int i = 0; ok && m < 0 && i < MD_LORA_N_MODS; i++) {
    const char *q = p;
    if (skip(&q, mod_parents[i]) && skip(&q, ".") && skip(&q, mod_names[i]) && skip(&q, ".")) {
      p = q;
      m = i;
    }
  }
  ok = ok && m >= 0;
  int b = 0;
  if (ok && !strcmp(p, "lora_A.weight"))
    b = 0;
  else if (ok && !strcmp(p, "lora_B.weight"))
    b = 1;
  else
    ok = 0;
  if (!ok)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   LORA_WEIGHTS ": tensor %s is not a LoRA weight of a language-model layer's "
                                "q/k/v/o_proj or gate/up/down_proj (" LORA_ROOT
                                "model.layers.N.self_attn.q_proj.lora_A.weight, ...)",
                   name);
  *layer = (int)n;
  *mod = m;
  *is_b = b;
  return 0;
}

/* "[d0, d1, ...]" of t into buf. */
static const char *shape_str(const struct md_tensor *t, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < t->ndim && k < n; d++)
    k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

/* Checks tensor t as module `mod` of `layer` (A or B) and records it in l. */
static int bind_tensor(struct md_lora *l, const struct md_config *cfg, const struct md_tensor *t,
                       int layer, int mod, int is_b, char *err, size_t errlen) {
  if (layer >= cfg->n_layers)
    return cm_fail(err, errlen, CM_ERR_RANGE,
                   LORA_WEIGHTS ": tensor %s: layer %s%d, the model has %d layers", t->name,
                   layer >= MD_MAX_LAYERS ? ">= " : "", layer, cfg->n_layers);
  int in, out;
  if (md_lora_dims(cfg, layer, (enum md_lora_mod)mod, &in, &out))
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   LORA_WEIGHTS ": tensor %s: layer %d has no %s (attention_k_eq_v: its V is its "
                                "K projection)",
                   t->name, layer, mod_names[mod]);
  if (t->dtype != MD_ST_F32 && t->dtype != MD_ST_F16 && t->dtype != MD_ST_BF16)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   LORA_WEIGHTS ": tensor %s is %s: adapters load F32, F16 or BF16", t->name,
                   t->dtype_name);
  int64_t rows = is_b ? out : l->rank, cols = is_b ? l->rank : in;
  if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols) {
    char found[96];
    return cm_fail(err, errlen, CM_ERR_SHAPE,
                   LORA_WEIGHTS ": tensor %s has shape %s, expected [%lld, %lld] (%s, r = %d)",
                   t->name, shape_str(t, found, sizeof(found)), (long long)rows, (long long)cols,
                   is_b ? "lora_B [out, r]" : "lora_A [r, in]", l->rank);
  }
  struct md_lora_mod_w *w = &l->mods[layer][mod];
  const struct md_tensor **slot = is_b ? &w->b : &w->a;
  if (*slot)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   LORA_WEIGHTS ": tensors %s and %s are both layer %d's %s lora_%c", (*slot)->name,
                   t->name, layer, mod_names[mod], is_b ? 'B' : 'A');
  *slot = t;
  return 0;
}

/* ---- open ----------------------------------------------------------------- */

/* dir/name into buf[n]: 0, or CM_ERR_TOOBIG. */
static int join(char *buf, size_t n, const char *dir, const char *name, char *err, size_t errlen) {
  int k = snprintf(buf, n, "%s/%s", dir, name);
  if (k < 0 || (size_t)k >= n)
    return cm_fail(err, errlen, CM_ERR_TOOBIG, "%s: adapter path too long", dir);
  return 0;
}

int md_lora_open(const char *dir, const struct md_config *cfg, struct md_lora **out, char *err,
                 size_t errlen) {
  *out = NULL;
  struct stat sd;
  if (!stat(dir, &sd) && !S_ISDIR(sd.st_mode)) {
    int gguf = md_gguf_probe(dir);
    if (gguf == 1) return md_lora_open_gguf(dir, cfg, out, err, errlen);
    return cm_fail(err, errlen, gguf < 0 ? gguf : CM_ERR_INVAL,
                   "%s: %s: an adapter is a PEFT folder (" LORA_CONFIG ", " LORA_WEIGHTS
                   ") or a GGUF adapter file",
                   dir, gguf < 0 ? "cannot be read" : "not a folder nor a GGUF file");
  }
  size_t dn = strlen(dir);
  if (dn > 5 && !strcmp(dir + dn - 5, ".gguf") && stat(dir, &sd))
    return cm_fail(err, errlen, CM_ERR_NOENT, "%s: missing (no such GGUF adapter file)", dir);
  if (!cfg || cfg->n_layers < 1 || cfg->n_layers > MD_MAX_LAYERS)
    return cm_fail(err, errlen, CM_ERR_INVAL, "%s: the model's config has no layers", dir);
  char path[4096];
  int rc = join(path, sizeof(path), dir, LORA_CONFIG, err, errlen);
  if (rc) return rc;
  char *text = NULL;
  size_t len = 0;
  rc = md_read_file(path, LORA_CONFIG_CAP, &text, &len);
  if (rc == CM_ERR_NOENT)
    return cm_fail(err, errlen, rc, "%s: missing (a PEFT adapter folder holds it)", path);
  if (rc == CM_ERR_TOOBIG)
    return cm_fail(err, errlen, rc, "%s: larger than %u bytes", path, LORA_CONFIG_CAP);
  if (rc) return cm_fail(err, errlen, rc, "%s: cannot be read (%s)", path, cm_strerror(rc));

  struct md_lora *l = calloc(1, sizeof(*l));
  if (!l) {
    free(text);
    return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  }
  rc = parse_config(text, len, l, err, errlen);
  free(text);
  if (rc) goto fail;
  l->n_layers = cfg->n_layers;
  l->mods = calloc((size_t)cfg->n_layers, sizeof(*l->mods));
  if (!l->mods) {
    rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
    goto fail;
  }

  if ((rc = join(path, sizeof(path), dir, LORA_WEIGHTS, err, errlen))) goto fail;
  struct stat sb;
  if (stat(path, &sb) && errno == ENOENT) {
    char pickle[4096];
    if ((rc = join(pickle, sizeof(pickle), dir, LORA_PICKLE, err, errlen))) goto fail;
    if (!stat(pickle, &sb))
      rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "%s: only safetensors adapters load (" LORA_WEIGHTS
                   "); pickle files are never read",
                   pickle);
    else
      rc = cm_fail(err, errlen, CM_ERR_NOENT, "%s: missing", path);
    goto fail;
  }
  if ((rc = md_st_open_file(path, &l->st, err, errlen))) goto fail;

  for (int i = 0; i < md_st_count(l->st); i++) {
    const struct md_tensor *t = md_st_get(l->st, i);
    int layer = 0, mod = 0, is_b = 0;
    if ((rc = parse_name(t->name, &layer, &mod, &is_b, err, errlen))) goto fail;
    if ((rc = bind_tensor(l, cfg, t, layer, mod, is_b, err, errlen))) goto fail;
  }
  for (int i = 0; i < l->n_layers; i++)
    for (int m = 0; m < MD_LORA_N_MODS; m++) {
      const struct md_lora_mod_w *w = &l->mods[i][m];
      if (!w->a != !w->b) {
        const char *name = w->a ? w->a->name : w->b->name;
        size_t n = strlen(name) - strlen(".lora_A.weight"); /* parse_name's suffix */
        rc = cm_fail(err, errlen, CM_ERR_INVAL, LORA_WEIGHTS ": %.*s has lora_%c but no lora_%c",
                     (int)n, name, w->a ? 'A' : 'B', w->a ? 'B' : 'A');
        goto fail;
      }
      l->n_adapted += w->a != NULL;
    }
  if (!l->n_adapted) {
    rc = cm_fail(err, errlen, CM_ERR_INVAL, "%s: adapts no layer of the language model", path);
    goto fail;
  }
  *out = l;
  return 0;
fail:
  md_lora_close(l);
  return rc;
}

/* ---- reading -------------------------------------------------------------- */

static float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* IEEE binary16 to f32, exact (kernels/ has the same conversion; model/ links
 * only common/). */
static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (man << 13); /* inf, NaN (payload kept) */
  } else if (exp) {
    u = sign | ((exp + 112u) << 23) | (man << 13); /* normal: exponent bias 15 -> 127 */
  } else if (!man) {
    u = sign;
  } else {
    float v = (float)man * (1.0f / 16777216.0f); /* subnormal: man * 2^-24, exact */
    memcpy(&u, &v, 4);
    u |= sign;
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

int md_lora_read_f32(const struct md_tensor *t, int r0, int nr, int c0, int nc, float mul,
                     float *dst) {
  if (!t || t->ndim != 2 ||
      (t->dtype != MD_ST_F32 && t->dtype != MD_ST_F16 && t->dtype != MD_ST_BF16))
    return CM_ERR_INVAL;
  int64_t rows = t->shape[0], cols = t->shape[1];
  if (r0 < 0 || nr < 0 || c0 < 0 || nc < 0 || (int64_t)r0 + nr > rows || (int64_t)c0 + nc > cols)
    return CM_ERR_RANGE;
  if (!nr || !nc) return 0;
  if (!dst || !t->data) return CM_ERR_INVAL;
  for (int i = 0; i < nr; i++) {
    size_t at = (size_t)(r0 + i) * (size_t)cols + (size_t)c0; /* elements */
    float *d = dst + (size_t)i * (size_t)nc;
    /* element loads through memcpy: the data may sit at any address */
    const unsigned char *s = (const unsigned char *)t->data + at * md_st_dtype_size(t->dtype);
    uint16_t h;
    switch (t->dtype) {
    case MD_ST_F32: memcpy(d, s, sizeof(float) * (size_t)nc); break;
    case MD_ST_F16:
      for (int j = 0; j < nc; j++) {
        memcpy(&h, s + 2 * (size_t)j, 2);
        d[j] = f16_to_f32(h);
      }
      break;
    default:
      for (int j = 0; j < nc; j++) {
        memcpy(&h, s + 2 * (size_t)j, 2);
        d[j] = bf16_to_f32(h);
      }
      break;
    }
    if (mul != 1.0f) /* mul 1 keeps every bit, a signalling NaN's too */
      for (int j = 0; j < nc; j++)
        d[j] *= mul;
  }
  return 0;
}
