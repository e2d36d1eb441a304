/* md-config.c — config.json / generation_config.json parsing and the
 * per-layer plan (layer kinds, head dims, KV sharing) of Gemma 3 / Gemma 4. */
#include "model/md-config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"

const char *md_arch_name(enum md_arch arch) {
  switch (arch) {
  case MD_ARCH_GEMMA3: return "gemma3";
  case MD_ARCH_GEMMA4: return "gemma4";
  case MD_ARCH_GEMMA4_ASSISTANT: return "gemma4_assistant";
  }
  return "?";
}

int md_read_file(const char *path, size_t cap, char **out, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return errno == ENOENT ? CM_ERR_NOENT : CM_ERR_IO;
  size_t n = 0, c = 4096;
  char *buf = malloc(c + 1);
  if (!buf) {
    fclose(f);
    return CM_ERR_NOMEM;
  }
  for (;;) {
    if (n == c) {
      if (c >= cap) {
        free(buf);
        fclose(f);
        return CM_ERR_TOOBIG;
      }
      c = CM_MIN(c * 2, cap);
      char *nb = realloc(buf, c + 1);
      if (!nb) {
        free(buf);
        fclose(f);
        return CM_ERR_NOMEM;
      }
      buf = nb;
    }
    size_t r = fread(buf + n, 1, c - n, f);
    n += r;
    if (r == 0) break;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(buf);
    return CM_ERR_IO;
  }
  buf[n] = 0;
  *out = buf;
  if (len) *len = n;
  return CM_OK;
}

/* ---- typed field readers ------------------------------------------------- */

/* Integer field: absent -> def (or error when required). */
static int get_int(const json_t *o, const char *key, int required, long long def, long long lo,
                   long long hi, long long *out, char *err, size_t errlen) {
  const json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) {
    if (required) return cm_fail(err, errlen, CM_ERR_PARSE, "config.json: %s missing", key);
    if (def < lo || def > hi)
      return cm_fail(err, errlen, CM_ERR_RANGE,
                      "config.json: %s missing and its default %lld is outside [%lld, %lld]", key,
                      def, lo, hi);
    *out = def;
    return 0;
  }
  long long x;
  if (json_is_integer(v)) {
    x = json_integer_value(v);
  } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
             fabs(json_real_value(v)) < 9e15) {
    x = (long long)json_real_value(v);
  } else {
    return cm_fail(err, errlen, CM_ERR_PARSE, "config.json: %s is not an integer", key);
  }
  if (x < lo || x > hi)
    return cm_fail(err, errlen, CM_ERR_RANGE, "config.json: %s = %lld outside [%lld, %lld]", key,
                    x, lo, hi);
  *out = x;
  return 0;
}

static int get_num(const json_t *o, const char *key, double def, double lo, double hi, double *out,
                   char *err, size_t errlen) {
  const json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) {
    *out = def;
    return 0;
  }
  if (!json_is_number(v))
    return cm_fail(err, errlen, CM_ERR_PARSE, "config.json: %s is not a number", key);
  double x = json_number_value(v);
  if (!(x >= lo && x <= hi))
    return cm_fail(err, errlen, CM_ERR_RANGE, "config.json: %s = %g outside [%g, %g]", key, x, lo,
                    hi);
  *out = x;
  return 0;
}

static int get_bool(const json_t *o, const char *key, int def, int *out, char *err, size_t errlen) {
  const json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) {
    *out = def;
    return 0;
  }
  if (!json_is_boolean(v))
    return cm_fail(err, errlen, CM_ERR_PARSE, "config.json: %s is not a boolean", key);
  *out = json_is_true(v);
  return 0;
}

/* get_int into an int field. */
static int get_int_to(const json_t *o, const char *key, int required, long long def, long long lo,
                      long long hi, int *dst, char *err, size_t errlen) {
  long long x;
  int rc = get_int(o, key, required, def, lo, hi, &x, err, errlen);
  if (!rc) *dst = (int)x;
  return rc;
}

/* eos_token_id: an integer or a list of integers. */
static int get_eos(const json_t *o, struct md_config *cfg, const char *file, char *err,
                   size_t errlen) {
  const json_t *v = json_object_get(o, "eos_token_id");
  if (!v || json_is_null(v)) return 0;
  int n = 0;
  if (json_is_integer(v)) {
    cfg->eos_ids[n++] = (int)json_integer_value(v);
  } else if (json_is_array(v)) {
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e) {
      if (!json_is_integer(e))
        return cm_fail(err, errlen, CM_ERR_PARSE, "%s: eos_token_id[%zu] is not an integer", file,
                        i);
      if (n < MD_MAX_EOS) cfg->eos_ids[n++] = (int)json_integer_value(e);
    }
  } else {
    return cm_fail(err, errlen, CM_ERR_PARSE, "%s: eos_token_id is not an integer or list", file);
  }
  for (int i = 0; i < n; i++)
    if (cfg->eos_ids[i] < 0 || cfg->eos_ids[i] >= cfg->vocab)
      return cm_fail(err, errlen, CM_ERR_RANGE, "%s: eos_token_id %d outside the vocabulary", file,
                      cfg->eos_ids[i]);
  cfg->n_eos = n;
  return 0;
}

/* One rope_parameters entry (newer configs). */
static int parse_rope_entry(const json_t *e, const char *kind_name, int head_dim, struct md_rope *r,
                            char *err, size_t errlen) {
  if (!json_is_object(e))
    return cm_fail(err, errlen, CM_ERR_PARSE, "config.json: rope_parameters.%s is not an object",
                    kind_name);
  const json_t *t = json_object_get(e, "rope_type");
  if (!t) t = json_object_get(e, "type");
  const char *type = t && json_is_string(t) ? json_string_value(t) : "default";
  int rc;
  double partial = 1.0;
  if ((rc = get_num(e, "rope_theta", r->theta, 1.0, 1e12, &r->theta, err, errlen))) return rc;
  if ((rc = get_num(e, "factor", 1.0, 1e-3, 1e6, &r->factor, err, errlen))) return rc;
  if ((rc = get_num(e, "partial_rotary_factor", 1.0, 0.0, 1.0, &partial, err, errlen))) return rc;
  if (!strcmp(type, "default") || !strcmp(type, "linear")) {
    if (!strcmp(type, "default")) r->factor = 1.0;
    if (partial != 1.0)
      return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                      "config.json: rope_parameters.%s: partial_rotary_factor with rope_type "
                      "\"%s\" is not supported",
                      kind_name, type);
    r->rot_pairs = head_dim / 2;
  } else if (!strcmp(type, "proportional")) {
    /* The first partial * head_dim / 2 pairs rotate with exponents over the
     * whole head dim; the rest are the identity. */
    r->rot_pairs = (int)floor(partial * head_dim / 2.0);
  } else {
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                    "config.json: rope_parameters.%s.rope_type \"%s\" is not supported", kind_name,
                    type);
  }
  return 0;
}

static int parse_layer_types(const json_t *tc, struct md_config *cfg, enum md_layer_kind *kinds,
                             char *err, size_t errlen) {
  const json_t *lt = json_object_get(tc, "layer_types");
  if (lt && !json_is_null(lt)) {
    if (!json_is_array(lt) || json_array_size(lt) != (size_t)cfg->n_layers)
      return cm_fail(err, errlen, CM_ERR_SHAPE,
                      "config.json: layer_types must list %d entries (num_hidden_layers)",
                      cfg->n_layers);
    for (int i = 0; i < cfg->n_layers; i++) {
      const json_t *e = json_array_get(lt, (size_t)i);
      const char *s = json_is_string(e) ? json_string_value(e) : "";
      if (!strcmp(s, "sliding_attention"))
        kinds[i] = MD_LAYER_SLIDING;
      else if (!strcmp(s, "full_attention"))
        kinds[i] = MD_LAYER_FULL;
      else
        return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                        "config.json: layer_types[%d] \"%s\" is not supported", i, s);
    }
    return 0;
  }
  long long pattern;
  int rc = get_int(tc, "sliding_window_pattern", 0, 6, 1, 1000, &pattern, err, errlen);
  if (rc) return rc;
  for (int i = 0; i < cfg->n_layers; i++)
    kinds[i] = ((i + 1) % pattern) == 0 ? MD_LAYER_FULL : MD_LAYER_SLIDING;
  if (cfg->arch != MD_ARCH_GEMMA3) kinds[cfg->n_layers - 1] = MD_LAYER_FULL;
  return 0;
}

static int parse_rope(const json_t *tc, struct md_config *cfg, char *err, size_t errlen) {
  struct md_rope *sl = &cfg->rope[MD_LAYER_SLIDING], *fu = &cfg->rope[MD_LAYER_FULL];
  int gemma4 = cfg->arch != MD_ARCH_GEMMA3;
  /* defaults */
  sl->theta = 10000.0;
  sl->factor = 1.0;
  sl->rot_pairs = cfg->head_dim / 2;
  fu->theta = 1000000.0;
  fu->factor = 1.0;
  fu->rot_pairs = gemma4 ? (int)floor(0.25 * cfg->global_head_dim / 2.0) : cfg->global_head_dim / 2;
  int rc;
  /* top-level thetas (older generation; newer Gemma 3 checkpoints keep them
   * beside rope_parameters entries that omit rope_theta) */
  if ((rc = get_num(tc, "rope_theta", fu->theta, 1.0, 1e12, &fu->theta, err, errlen))) return rc;
  if ((rc = get_num(tc, "rope_local_base_freq", sl->theta, 1.0, 1e12, &sl->theta, err, errlen)))
    return rc;
  const json_t *rp = json_object_get(tc, "rope_parameters");
  if (rp && json_is_object(rp) &&
      (json_object_get(rp, "sliding_attention") || json_object_get(rp, "full_attention"))) {
    const json_t *e;
    if ((e = json_object_get(rp, "sliding_attention")) &&
        (rc = parse_rope_entry(e, "sliding_attention", cfg->head_dim, sl, err, errlen)))
      return rc;
    if ((e = json_object_get(rp, "full_attention")) &&
        (rc = parse_rope_entry(e, "full_attention", cfg->global_head_dim, fu, err, errlen)))
      return rc;
    return 0;
  }
  if (rp && json_is_object(rp)) { /* one entry for every layer */
    if ((rc = parse_rope_entry(rp, "*", cfg->head_dim, sl, err, errlen))) return rc;
    *fu = *sl;
    fu->rot_pairs = fu->rot_pairs * cfg->global_head_dim / cfg->head_dim;
    return 0;
  }
  /* older generation: rope_scaling applies to full layers */
  const json_t *rs = json_object_get(tc, "rope_scaling");
  if (rs && json_is_object(rs)) {
    if ((rc = parse_rope_entry(rs, "rope_scaling", cfg->global_head_dim, &(struct md_rope){0}, err,
                               errlen)))
      return rc;
    const json_t *t = json_object_get(rs, "rope_type");
    if (!t) t = json_object_get(rs, "type");
    if (t && json_is_string(t) && !strcmp(json_string_value(t), "linear"))
      if ((rc = get_num(rs, "factor", 1.0, 1e-3, 1e6, &fu->factor, err, errlen))) return rc;
  }
  return 0;
}

/* Derives the per-layer plan once every scalar field is known. */
/* Per-layer overrides from "per_layer_config" (0 = none). */
struct overrides {
  int head_dim[MD_MAX_LAYERS];
  int n_kv_heads[MD_MAX_LAYERS];
};

/* Newer Gemma 4 configs may carry "per_layer_config": {"<layer index>" or
 * "<layer type>": {"head_dim", "num_key_value_heads"}} instead of (or beside)
 * global_head_dim / num_global_key_value_heads. */
static int parse_per_layer(const json_t *tc, struct md_config *cfg, const enum md_layer_kind *kinds,
                           struct overrides *ov, char *err, size_t errlen) {
  memset(ov, 0, sizeof(*ov));
  const json_t *plc = json_object_get(tc, "per_layer_config");
  if (!plc || json_is_null(plc)) return 0;
  if (!json_is_object(plc))
    return cm_fail(err, errlen, CM_ERR_PARSE, "config.json: per_layer_config is not an object");
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)plc, key, val) {
    int first = 0, last = -1, kind = -1;
    if (!strcmp(key, "full_attention"))
      kind = MD_LAYER_FULL;
    else if (!strcmp(key, "sliding_attention"))
      kind = MD_LAYER_SLIDING;
    else {
      char *end;
      long i = strtol(key, &end, 10);
      if (end == key || *end || i < 0 || i >= cfg->n_layers)
        return cm_fail(err, errlen, CM_ERR_PARSE,
                        "config.json: per_layer_config key \"%s\" is not a layer", key);
      first = last = (int)i;
    }
    if (kind >= 0) last = cfg->n_layers - 1;
    if (!json_is_object(val))
      return cm_fail(err, errlen, CM_ERR_PARSE,
                      "config.json: per_layer_config.%s is not an object", key);
    long long hd, kv;
    int rc;
    if ((rc = get_int(val, "head_dim", 0, 0, 0, 512, &hd, err, errlen)) ||
        (rc = get_int(val, "num_key_value_heads", 0, 0, 0, 1024, &kv, err, errlen)))
      return rc;
    if (hd % 2)
      return cm_fail(err, errlen, CM_ERR_INVAL, "config.json: per_layer_config.%s.head_dim is odd",
                      key);
    for (int i = first; i <= last; i++) {
      if (kind >= 0 && (int)kinds[i] != kind) continue;
      if (hd) ov->head_dim[i] = (int)hd;
      if (kv) ov->n_kv_heads[i] = (int)kv;
      if (hd && kinds[i] == MD_LAYER_FULL && !json_object_get(tc, "global_head_dim"))
        cfg->global_head_dim = (int)hd;
    }
  }
  return 0;
}

static int plan_layers(struct md_config *cfg, const enum md_layer_kind *kinds,
                       const struct overrides *ov, char *err, size_t errlen) {
  int L = cfg->n_layers;
  int first_shared = L - cfg->n_kv_shared;
  int assistant = cfg->arch == MD_ARCH_GEMMA4_ASSISTANT;
  for (int i = 0; i < L; i++) {
    struct md_layer_cfg *l = &cfg->layers[i];
    l->kind = kinds[i];
    l->head_dim = l->kind == MD_LAYER_FULL ? cfg->global_head_dim : cfg->head_dim;
    if (ov->head_dim[i] && ov->head_dim[i] != l->head_dim)
      return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                     "config.json: per_layer_config: layer %d head_dim %d differs from the other "
                     "%s layers' %d",
                     i, ov->head_dim[i], l->kind == MD_LAYER_FULL ? "full" : "sliding",
                     l->head_dim);
    l->k_eq_v = cfg->k_eq_v && l->kind == MD_LAYER_FULL;
    l->n_kv_heads = l->k_eq_v && cfg->n_global_kv_heads ? cfg->n_global_kv_heads : cfg->n_kv_heads;
    if (ov->n_kv_heads[i]) l->n_kv_heads = ov->n_kv_heads[i];
    if (cfg->n_heads % l->n_kv_heads)
      return cm_fail(err, errlen, CM_ERR_INVAL,
                      "config.json: layer %d: %d heads are not a multiple of %d KV heads", i,
                      cfg->n_heads, l->n_kv_heads);
    l->kv_shared = i >= first_shared;
    l->kv_source = i;
    if (assistant) {
      l->kv_source = -1;
    } else if (l->kv_shared) {
      l->kv_source = -1;
      for (int j = first_shared - 1; j >= 0; j--)
        if (kinds[j] == l->kind) {
          l->kv_source = j;
          break;
        }
      if (l->kv_source < 0)
        return cm_fail(err, errlen, CM_ERR_INVAL,
                       "config.json: KV-shared layer %d has no earlier %s layer to read", i,
                       l->kind == MD_LAYER_FULL ? "full" : "sliding");
    }
    l->ffn_dim = cfg->ffn * (cfg->double_wide_mlp && l->kv_shared && first_shared > 0 ? 2 : 1);
  }
  return 0;
}

int md_config_last_storing_layer(const struct md_config *cfg, enum md_layer_kind kind) {
  for (int j = cfg->n_layers - cfg->n_kv_shared - 1; j >= 0; j--)
    if (cfg->layers[j].kind == kind) return j;
  return -1;
}

/* ---- vision tower (Gemma3ForConditionalGeneration) --------------------------- */

/* Rewrites a field reader's "config.json: KEY ..." message as "FILE: PREFIXKEY ...". */
static int retag(int rc, const char *file, const char *prefix, char *err, size_t errlen) {
  static const char head[] = "config.json: ";
  if (err && errlen && !strncmp(err, head, sizeof(head) - 1)) {
    char tmp[512];
    snprintf(tmp, sizeof(tmp), "%s: %s%s", file, prefix, err + sizeof(head) - 1);
    snprintf(err, errlen, "%s", tmp);
  }
  return rc;
}

/* The preprocessing defaults for a tower of image_size px (see md_preproc_cfg). */
static void preproc_defaults(struct md_vision_cfg *v) {
  struct md_preproc_cfg *p = &v->pre;
  p->width = p->height = v->image_size;
  p->do_resize = p->do_rescale = p->do_normalize = 1;
  p->resample = 2;
  p->rescale_factor = 1.0 / 255.0;
  for (int c = 0; c < MD_MAX_CHANNELS; c++) {
    p->mean[c] = 0.5f;
    p->std[c] = 0.5f;
  }
}

/* root's vision_config object into *vc: NULL when there is none (a text-only
 * checkpoint). */
static int vision_object(const json_t *root, const json_t **vc, char *err, size_t errlen) {
  *vc = json_object_get(root, "vision_config");
  if (*vc && json_is_null(*vc)) *vc = NULL;
  if (*vc && !json_is_object(*vc))
    return cm_fail(err, errlen, CM_ERR_PARSE, "config.json: vision_config is not an object");
  return 0;
}

static int parse_vision(const json_t *root, struct md_config *cfg, char *err, size_t errlen) {
  struct md_vision_cfg *v = &cfg->vision;
  const json_t *vc;
  int rc = vision_object(root, &vc, err, errlen);
  if (rc || !vc) return rc;
  const json_t *mt = json_object_get(vc, "model_type");
  if (mt && json_is_string(mt) && strcmp(json_string_value(mt), "siglip_vision_model"))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "config.json: vision_config.model_type \"%s\" is not supported "
                   "(siglip_vision_model)",
                   json_string_value(mt));
  /* transformers' SiglipVisionConfig defaults */
  if ((rc = get_int_to(vc, "hidden_size", 0, 768, 1, 65536, &v->hidden, err, errlen)) ||
      (rc = get_int_to(vc, "intermediate_size", 0, 3072, 1, 1 << 20, &v->ffn, err, errlen)) ||
      (rc = get_int_to(vc, "num_hidden_layers", 0, 12, 1, MD_MAX_LAYERS, &v->n_layers, err,
                       errlen)) ||
      (rc = get_int_to(vc, "num_attention_heads", 0, 12, 1, 1024, &v->n_heads, err, errlen)) ||
      (rc = get_int_to(vc, "num_channels", 0, 3, 1, MD_MAX_CHANNELS, &v->channels, err, errlen)) ||
      (rc = get_int_to(vc, "image_size", 0, 224, 1, 16384, &v->image_size, err, errlen)) ||
      (rc = get_int_to(vc, "patch_size", 0, 16, 1, 16384, &v->patch, err, errlen)) ||
      (rc = get_num(vc, "layer_norm_eps", 1e-6, 0.0, 1.0, &v->eps, err, errlen)))
    return retag(rc, "config.json", "vision_config.", err, errlen);
  const json_t *act = json_object_get(vc, "hidden_act");
  if (act && json_is_string(act) && strcmp(json_string_value(act), "gelu_pytorch_tanh") &&
      strcmp(json_string_value(act), "gelu_tanh"))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "config.json: vision_config.hidden_act \"%s\" is not supported "
                   "(gelu_pytorch_tanh)",
                   json_string_value(act));
  if (v->hidden % v->n_heads)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "config.json: vision_config.hidden_size %d is not a multiple of "
                   "num_attention_heads %d",
                   v->hidden, v->n_heads);
  v->head_dim = v->hidden / v->n_heads;
  if (v->head_dim > 512)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "config.json: vision_config: head dim %d is above 512", v->head_dim);
  /* the patch convolution is "valid": a remainder of pixels is not seen */
  v->grid = v->image_size / v->patch;
  if (v->grid < 1)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "config.json: vision_config.patch_size %d is larger than image_size %d",
                   v->patch, v->image_size);
  if ((long long)v->grid * v->grid > (1 << 20))
    return cm_fail(err, errlen, CM_ERR_TOOBIG, "config.json: vision_config: %d x %d patches",
                   v->grid, v->grid);
  v->n_patches = v->grid * v->grid;
  /* Gemma3Config's defaults */
  if ((rc = get_int_to(root, "mm_tokens_per_image", 0, 256, 1, v->n_patches, &v->mm_tokens, err,
                       errlen)))
    return rc;
  int side = (int)lround(sqrt((double)v->mm_tokens));
  while ((long long)side * side > v->mm_tokens)
    side--;
  /* the projector pools with kernel grid / side; torch's AvgPool2d then gives
   * grid / kernel tokens per side, which must be `side` */
  v->pool = side > 0 ? v->grid / side : 0;
  if ((long long)side * side != v->mm_tokens || v->pool < 1 || v->grid / v->pool != side)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "config.json: mm_tokens_per_image %d is not the square of a pooled %d x %d "
                   "patch grid",
                   v->mm_tokens, v->grid, v->grid);
  int hi = 1 << 30;
  if ((rc = get_int_to(root, "boi_token_index", 0, 255999, 0, hi, &v->boi_id, err, errlen)) ||
      (rc = get_int_to(root, "eoi_token_index", 0, 256000, 0, hi, &v->eoi_id, err, errlen)) ||
      (rc = get_int_to(root, "image_token_index", 0, 262144, 0, hi, &v->image_id, err, errlen)))
    return rc;
  if (v->boi_id >= cfg->vocab || v->eoi_id >= cfg->vocab)
    return cm_fail(err, errlen, CM_ERR_RANGE,
                   "config.json: boi_token_index %d / eoi_token_index %d outside the vocabulary "
                   "(%d)",
                   v->boi_id, v->eoi_id, cfg->vocab);
  /* image_token_index may lie past the vocabulary: its rows are overwritten
   * by the image features, and transformers embeds them as the pad token */
  v->present = 1;
  preproc_defaults(v);
  return 0;
}

/* ---- vision tower (Gemma4ForConditionalGeneration) --------------------------- */

/* The soft-token budgets Gemma 4's image processor accepts
 * (image_processing_gemma4.py, _SUPPORTED_SOFT_TOKENS). */
int md_g4_soft_tokens_allowed(int n) {
  return n == 70 || n == 140 || n == 280 || n == 560 || n == 1120;
}

/* Gemma 4's image mask on full-attention layers: 0 follows transformers at
 * c308a30 and vLLM (sliding layers only); 1 would follow newer transformers. */
#define MD_G4_IMAGE_BIDIR_FULL 0

int md_image_bidir(const struct md_config *cfg, enum md_layer_kind kind) {
  if (!cfg->vision_g4.present) return 1; /* Gemma 3, or ranges a caller gives a text model */
  if (!cfg->vision_g4.bidir) return 0;
  return kind == MD_LAYER_SLIDING || MD_G4_IMAGE_BIDIR_FULL;
}

/* One string field that must be one of `n` choices: its index in *out, `def`
 * when missing or null. */
static int get_choice(const json_t *o, const char *key, const char *const *choices, int n, int def,
                      int *out, char *err, size_t errlen) {
  const json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) {
    *out = def;
    return 0;
  }
  if (json_is_string(v))
    for (int i = 0; i < n; i++)
      if (choices[i] && !strcmp(json_string_value(v), choices[i])) {
        *out = i;
        return 0;
      }
  return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                 "config.json: %s is not one of the supported "
                 "values",
                 key);
}

/* A Gemma 4 tower's config object o (`what`: vision_config, audio_config) whose
 * model_type, given and not null, is not `type`: CM_ERR_UNSUPPORTED. */
static int tower_type(const json_t *o, const char *what, const char *type, char *err,
                      size_t errlen) {
  const json_t *mt = json_object_get(o, "model_type");
  if (mt && !json_is_null(mt) && !(json_is_string(mt) && !strcmp(json_string_value(mt), type)))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "config.json: %s.model_type is not supported (%s)", what, type);
  return 0;
}

/* vision_config of a gemma4 checkpoint (struct md_vision_g4_cfg); tc is its
 * text_config. Defaults are Gemma4VisionConfig's and Gemma4Config's. */
static int parse_vision_g4(const json_t *root, const json_t *tc, struct md_config *cfg, char *err,
                           size_t errlen) {
  struct md_vision_g4_cfg *v = &cfg->vision_g4;
  const json_t *vc;
  int rc = vision_object(root, &vc, err, errlen);
  if (rc || !vc) return rc;
  if ((rc = tower_type(vc, "vision_config", "gemma4_vision", err, errlen))) return rc;
  static const char *const acts[] = {"gelu_pytorch_tanh", "gelu_tanh"};
  int act;
  if ((rc = get_int_to(vc, "hidden_size", 0, 768, 1, 65536, &v->hidden, err, errlen)) ||
      (rc = get_int_to(vc, "intermediate_size", 0, 3072, 1, 1 << 20, &v->ffn, err, errlen)) ||
      (rc = get_int_to(vc, "num_hidden_layers", 0, 16, 1, MD_MAX_LAYERS, &v->n_layers, err,
                       errlen)) ||
      (rc = get_int_to(vc, "num_attention_heads", 0, 12, 1, 1024, &v->n_heads, err, errlen)) ||
      (rc = get_int_to(vc, "num_key_value_heads", 0, v->n_heads, 1, v->n_heads, &v->n_kv_heads, err,
                       errlen)) ||
      (rc = get_int_to(vc, "head_dim", 0, 64, 4, 512, &v->head_dim, err, errlen)) ||
      (rc = get_int_to(vc, "patch_size", 0, 16, 1, 1024, &v->patch, err, errlen)) ||
      (rc = get_int_to(vc, "pooling_kernel_size", 0, 3, 1, 64, &v->pool, err, errlen)) ||
      (rc = get_int_to(vc, "position_embedding_size", 0, 10240, 1, 1 << 20, &v->pos_size, err,
                       errlen)) ||
      (rc = get_int_to(vc, "default_output_length", 0, 280, 1, 1 << 20, &v->default_tokens, err,
                       errlen)) ||
      (rc = get_int_to(vc, "max_position_embeddings", 0, 131072, 1, 1 << 30, &v->max_pos, err,
                       errlen)) ||
      (rc = get_bool(vc, "use_clipped_linears", 0, &v->clipped_linears, err, errlen)) ||
      (rc = get_bool(vc, "standardize", 0, &v->standardize, err, errlen)) ||
      (rc = get_bool(vc, "attention_bias", 0, &v->attention_bias, err, errlen)) ||
      (rc = get_num(vc, "rms_norm_eps", 1e-6, 0.0, 1.0, &v->eps, err, errlen)) ||
      (rc = get_choice(vc, "hidden_activation", acts, 2, 0, &act, err, errlen)))
    return retag(rc, "config.json", "vision_config.", err, errlen);
  if (v->n_heads % v->n_kv_heads)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "config.json: vision_config.num_attention_heads %d is not a multiple of "
                   "num_key_value_heads %d",
                   v->n_heads, v->n_kv_heads);
  if (v->head_dim % 4)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "config.json: vision_config.head_dim %d is not a multiple of 4 (2D RoPE "
                   "rotates half of each head by x, half by y)",
                   v->head_dim);
  if (v->attention_bias)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "config.json: vision_config.attention_bias true is not supported");
  if (!md_g4_soft_tokens_allowed(v->default_tokens))
    return cm_fail(err, errlen, CM_ERR_RANGE,
                   "config.json: vision_config.default_output_length %d is not one of 70, 140, "
                   "280, 560, 1120",
                   v->default_tokens);
  /* rope_parameters {"rope_type": "default", "rope_theta": 100} (Gemma4VisionConfig's
   * default_theta); any other type is refused */
  v->rope_theta = 100.0;
  const json_t *rp = json_object_get(vc, "rope_parameters");
  if (rp && !json_is_null(rp)) {
    if (!json_is_object(rp))
      return cm_fail(err, errlen, CM_ERR_PARSE,
                     "config.json: vision_config.rope_parameters is not an object");
    static const char *const types[] = {"default"};
    int t;
    if ((rc = get_choice(rp, "rope_type", types, 1, 0, &t, err, errlen)))
      return retag(rc, "config.json", "vision_config.rope_parameters.", err, errlen);
    if ((rc = get_num(rp, "rope_theta", 100.0, 1e-6, 1e12, &v->rope_theta, err, errlen)))
      return retag(rc, "config.json", "vision_config.rope_parameters.", err, errlen);
  }
  static const char *const bidir[] = {NULL, "vision", "all"};
  if ((rc = get_choice(tc, "use_bidirectional_attention", bidir, 3, 0, &v->bidir, err, errlen)))
    return retag(rc, "config.json", "text_config.", err, errlen);
  /* Gemma4Config's defaults */
  int hi = 1 << 30;
  if ((rc = get_int_to(root, "boi_token_id", 0, 255999, 0, hi, &v->boi_id, err, errlen)) ||
      (rc = get_int_to(root, "eoi_token_id", 0, 258882, 0, hi, &v->eoi_id, err, errlen)) ||
      (rc = get_int_to(root, "image_token_id", 0, 258880, 0, hi, &v->image_id, err, errlen)))
    return rc;
  if (v->boi_id >= cfg->vocab || v->eoi_id >= cfg->vocab || v->image_id >= cfg->vocab)
    return cm_fail(err, errlen, CM_ERR_RANGE,
                   "config.json: boi_token_id %d / eoi_token_id %d / image_token_id %d outside "
                   "the vocabulary (%d)",
                   v->boi_id, v->eoi_id, v->image_id, cfg->vocab);
  v->present = 1;
  return 0;
}

/* audio_config.subsampling_conv_channels: two positive integers. */
static int get_conv_channels(const json_t *ac, int *ch, char *err, size_t errlen) {
  const json_t *a = json_object_get(ac, "subsampling_conv_channels");
  ch[0] = 128;
  ch[1] = 32;
  if (!a || json_is_null(a)) return 0;
  if (!json_is_array(a) || json_array_size(a) != 2)
    return cm_fail(err, errlen, CM_ERR_PARSE,
                   "config.json: audio_config.subsampling_conv_channels is not a list of two "
                   "integers");
  for (int i = 0; i < 2; i++) {
    const json_t *v = json_array_get(a, (size_t)i);
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65536)
      return cm_fail(err, errlen, CM_ERR_RANGE,
                     "config.json: audio_config.subsampling_conv_channels[%d] is not an integer "
                     "in [1, 65536]",
                     i);
    ch[i] = (int)json_integer_value(v);
  }
  return 0;
}

/* audio_config of a gemma4 checkpoint (struct md_audio_g4_cfg). Defaults are
 * Gemma4AudioConfig's and Gemma4Config's. */
static int parse_audio_g4(const json_t *root, struct md_config *cfg, char *err, size_t errlen) {
  struct md_audio_g4_cfg *a = &cfg->audio_g4;
  const json_t *ac = json_object_get(root, "audio_config");
  if (!ac || json_is_null(ac)) return 0;
  if (!json_is_object(ac))
    return cm_fail(err, errlen, CM_ERR_PARSE, "config.json: audio_config is not an object");
  int rc = tower_type(ac, "audio_config", "gemma4_audio", err, errlen);
  if (rc) return rc;
  static const char *const acts[] = {"silu", "swish"};
  int act;
  if ((rc = get_int_to(ac, "hidden_size", 0, 1024, 2, 65536, &a->hidden, err, errlen)) ||
      (rc = get_int_to(ac, "num_hidden_layers", 0, 12, 1, MD_MAX_LAYERS, &a->n_layers, err,
                       errlen)) ||
      (rc = get_int_to(ac, "num_attention_heads", 0, 8, 1, 1024, &a->n_heads, err, errlen)) ||
      (rc = get_int_to(ac, "conv_kernel_size", 0, 5, 1, 1024, &a->conv_kernel, err, errlen)) ||
      (rc = get_int_to(ac, "attention_chunk_size", 0, 12, 1, 4096, &a->chunk, err, errlen)) ||
      (rc = get_int_to(ac, "attention_context_left", 0, 13, 2, 4096, &a->ctx_left, err, errlen)) ||
      (rc = get_int_to(ac, "attention_context_right", 0, 0, 0, 4096, &a->ctx_right, err, errlen)) ||
      (rc =
           get_int_to(ac, "output_proj_dims", 0, 1536, 1, 1 << 20, &a->output_dims, err, errlen)) ||
      (rc = get_bool(ac, "use_clipped_linears", 1, &a->clipped_linears, err, errlen)) ||
      (rc = get_num(ac, "residual_weight", 0.5, -1e6, 1e6, &a->residual_weight, err, errlen)) ||
      (rc = get_num(ac, "attention_logit_cap", 50.0, 1e-6, 1e9, &a->logit_cap, err, errlen)) ||
      (rc = get_num(ac, "attention_invalid_logits_value", -1e9, -1e30, 0.0, &a->invalid_logit, err,
                    errlen)) ||
      (rc = get_num(ac, "rms_norm_eps", 1e-6, 0.0, 1.0, &a->eps, err, errlen)) ||
      (rc = get_num(ac, "gradient_clipping", 1e10, 1e-30, 1e38, &a->grad_clip, err, errlen)) ||
      (rc = get_choice(ac, "hidden_act", acts, 2, 0, &act, err, errlen)))
    return retag(rc, "config.json", "audio_config.", err, errlen);
  if ((rc = get_conv_channels(ac, a->conv_ch, err, errlen))) return rc;
  if (a->hidden % a->n_heads || a->hidden % 2)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "config.json: audio_config.hidden_size %d is not an even multiple of "
                   "num_attention_heads %d",
                   a->hidden, a->n_heads);
  if (a->conv_ch[0] % 4)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "config.json: audio_config.subsampling_conv_channels[0] %d is not a multiple "
                   "of 4 (the projection takes channels[0] / 4 frequency bins)",
                   a->conv_ch[0]);
  /* masked keys are skipped, not summed with weight exp(invalid - max): exact
   * only while that weight is 0 in f32 (the logits are capped at +-cap) */
  if (a->invalid_logit > -(a->logit_cap + 128.0))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "config.json: audio_config.attention_invalid_logits_value %g is not below "
                   "-(attention_logit_cap + 128)",
                   a->invalid_logit);
  int hi = 1 << 30;
  if ((rc = get_int_to(root, "audio_token_id", 0, 258881, 0, hi, &a->audio_id, err, errlen)) ||
      (rc = get_int_to(root, "boa_token_id", 0, 256000, 0, hi, &a->boa_id, err, errlen)))
    return rc;
  /* Gemma4Config names it eoa_token_index; accept eoa_token_id too */
  const char *eoa = json_object_get(root, "eoa_token_index") ? "eoa_token_index" : "eoa_token_id";
  if ((rc = get_int_to(root, eoa, 0, 258883, 0, hi, &a->eoa_id, err, errlen))) return rc;
  if (a->audio_id >= cfg->vocab || a->boa_id >= cfg->vocab || a->eoa_id >= cfg->vocab)
    return cm_fail(err, errlen, CM_ERR_RANGE,
                   "config.json: audio_token_id %d / boa_token_id %d / %s %d outside the "
                   "vocabulary (%d)",
                   a->audio_id, a->boa_id, eoa, a->eoa_id, cfg->vocab);
  a->present = 1;
  return 0;
}

/* One channel list (image_mean / image_std): a number or one per channel. */
static int get_channels(const json_t *o, const char *key, int channels, float *dst, int positive,
                        char *err, size_t errlen) {
  const json_t *a = json_object_get(o, key);
  if (!a || json_is_null(a)) return 0;
  double vals[MD_MAX_CHANNELS];
  if (json_is_number(a)) {
    for (int c = 0; c < channels; c++)
      vals[c] = json_number_value(a);
  } else if (json_is_array(a) && json_array_size(a) == (size_t)channels) {
    for (int c = 0; c < channels; c++) {
      const json_t *e = json_array_get(a, (size_t)c);
      if (!json_is_number(e))
        return cm_fail(err, errlen, CM_ERR_PARSE, "config.json: %s[%d] is not a number", key, c);
      vals[c] = json_number_value(e);
    }
  } else {
    return cm_fail(err, errlen, CM_ERR_SHAPE, "config.json: %s must list %d numbers", key,
                   channels);
  }
  for (int c = 0; c < channels; c++) {
    if (!isfinite(vals[c]) || fabs(vals[c]) > 1e6 || (positive && !(vals[c] > 0)))
      return cm_fail(err, errlen, CM_ERR_RANGE, "config.json: %s[%d] = %g is out of range", key, c,
                     vals[c]);
    dst[c] = (float)vals[c];
  }
  return 0;
}

/* A processor file opened for its image settings. */
struct preproc {
  const char *file;   /* its name, for messages */
  json_t *root;       /* to json_decref */
  const json_t *o;    /* the object of image settings; NULL: none (the defaults stay) */
  const char *prefix; /* names o in messages */
};

/* Opens a processor file's object of image settings: the file itself, or
 * (nested: processor_config.json) its "image_processor". Fails when the model
 * has no such tower (present 0; tower names it). p->root is set on success. */
static int preproc_open(const char *text, size_t len, int nested, int present, const char *tower,
                        struct preproc *p, char *err, size_t errlen) {
  p->file = nested ? "processor_config.json" : "preprocessor_config.json";
  if (!present)
    return cm_fail(err, errlen, CM_ERR_STATE, "%s: the model has no %s", p->file, tower);
  json_error_t jerr;
  p->root = json_loadb(text, len, 0, &jerr);
  if (!p->root)
    return cm_fail(err, errlen, CM_ERR_PARSE, "%s: line %d column %d: %s", p->file, jerr.line,
                   jerr.column, jerr.text);
  p->o = p->root;
  p->prefix = "";
  if (nested) {
    p->o = json_object_get(p->root, "image_processor");
    p->prefix = "image_processor.";
    if (!p->o) return 0;
  }
  if (!json_is_object(p->o)) {
    int rc = cm_fail(err, errlen, CM_ERR_PARSE, "%s: %snot a JSON object", p->file, p->prefix);
    json_decref(p->root);
    p->root = NULL;
    return rc;
  }
  return 0;
}

/* A Gemma 3 tower's image settings (f->o) into v->pre. */
static int read_preproc(const struct preproc *f, struct md_vision_cfg *v, char *err,
                        size_t errlen) {
  const json_t *o = f->o;
  struct md_preproc_cfg p = v->pre;
  int rc;
  if ((rc = get_bool(o, "do_resize", p.do_resize, &p.do_resize, err, errlen)) ||
      (rc = get_bool(o, "do_rescale", p.do_rescale, &p.do_rescale, err, errlen)) ||
      (rc = get_bool(o, "do_normalize", p.do_normalize, &p.do_normalize, err, errlen)) ||
      (rc = get_num(o, "rescale_factor", p.rescale_factor, 1e-9, 1e9, &p.rescale_factor, err,
                    errlen)) ||
      (rc = get_int_to(o, "resample", 0, p.resample, 0, 5, &p.resample, err, errlen)) ||
      (rc = get_channels(o, "image_mean", v->channels, p.mean, 0, err, errlen)) ||
      (rc = get_channels(o, "image_std", v->channels, p.std, 1, err, errlen)))
    return retag(rc, f->file, f->prefix, err, errlen);
  if (p.resample != 2)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "%s: %sresample %d is not supported (2: bilinear)", f->file, f->prefix,
                   p.resample);
  const json_t *size = json_object_get(o, "size");
  if (size && !json_is_null(size)) {
    if (!json_is_object(size))
      return cm_fail(err, errlen, CM_ERR_PARSE, "%s: %ssize is not an object", f->file, f->prefix);
    const char *wkey = json_object_get(size, "width") ? "width" : "shortest_edge";
    const char *hkey = json_object_get(size, "height") ? "height" : "shortest_edge";
    if ((rc = get_int_to(size, wkey, 1, 0, 1, 16384, &p.width, err, errlen)) ||
        (rc = get_int_to(size, hkey, 1, 0, 1, 16384, &p.height, err, errlen)))
      return retag(rc, f->file, f->prefix, err, errlen);
  }
  if (p.do_resize && (p.width != v->image_size || p.height != v->image_size))
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "%s: %ssize %d x %d differs from the vision tower's image_size %d", f->file,
                   f->prefix, p.width, p.height, v->image_size);
  v->pre = p;
  return 0;
}

static int parse_text(const json_t *root, const json_t *tc, struct md_config *cfg, char *err,
                      size_t errlen) {
  long long v;
  int rc;
#define INT_FIELD(key, req, def, lo, hi, dst)                                                      \
  do {                                                                                             \
    if ((rc = get_int(tc, key, req, def, lo, hi, &v, err, errlen))) return rc;                     \
    dst = (int)v;                                                                                  \
  } while (0)
  INT_FIELD("vocab_size", 1, 0, 1, 1 << 22, cfg->vocab);
  INT_FIELD("hidden_size", 1, 0, 1, 65536, cfg->hidden);
  INT_FIELD("intermediate_size", 1, 0, 1, 1 << 20, cfg->ffn);
  INT_FIELD("num_hidden_layers", 1, 0, 1, MD_MAX_LAYERS, cfg->n_layers);
  INT_FIELD("num_attention_heads", 1, 0, 1, 1024, cfg->n_heads);
  INT_FIELD("num_key_value_heads", 0, cfg->n_heads, 1, 1024, cfg->n_kv_heads);
  INT_FIELD("head_dim", 0, cfg->hidden / cfg->n_heads, 2, 512, cfg->head_dim);
  INT_FIELD("global_head_dim", 0, cfg->head_dim, 2, 512, cfg->global_head_dim);
  INT_FIELD("num_global_key_value_heads", 0, 0, 0, 1024, cfg->n_global_kv_heads);
  INT_FIELD("sliding_window", 0, 4096, 1, 1 << 24, cfg->sliding_window);
  INT_FIELD("max_position_embeddings", 0, 131072, 1, 1 << 24, cfg->max_pos);
  INT_FIELD("num_kv_shared_layers", 0, 0, 0, cfg->n_layers, cfg->n_kv_shared);
  INT_FIELD("hidden_size_per_layer_input", 0, 0, 0, 65536, cfg->ple_dim);
  INT_FIELD("vocab_size_per_layer_input", 0, cfg->vocab, 0, 1 << 22, cfg->ple_vocab);
  INT_FIELD("bos_token_id", 0, CM_MIN(2, cfg->vocab - 1), 0, cfg->vocab - 1, cfg->bos_id);
  INT_FIELD("pad_token_id", 0, 0, 0, cfg->vocab - 1, cfg->pad_id);
  if (cfg->head_dim % 2 || cfg->global_head_dim % 2)
    return cm_fail(err, errlen, CM_ERR_INVAL, "config.json: head dims must be even");
  if (cfg->arch == MD_ARCH_GEMMA3 && json_object_get(tc, "global_head_dim"))
    cfg->global_head_dim = cfg->head_dim; /* not a Gemma 3 field */
  if ((rc = get_num(tc, "rms_norm_eps", 1e-6, 0.0, 1.0, &cfg->eps, err, errlen))) return rc;
  double qpas;
  if ((rc = get_num(tc, "query_pre_attn_scalar", cfg->head_dim, 1e-6, 1e9, &qpas, err, errlen)))
    return rc;
  cfg->attn_scale = cfg->arch == MD_ARCH_GEMMA3 ? 1.0 / sqrt(qpas) : 1.0;
  if ((rc = get_num(tc, "attn_logit_softcapping", 0.0, 0.0, 1e9, &cfg->attn_softcap, err, errlen)))
    return rc;
  if ((rc =
           get_num(tc, "final_logit_softcapping", 0.0, 0.0, 1e9, &cfg->final_softcap, err, errlen)))
    return rc;
  if ((rc = get_bool(tc, "attention_k_eq_v", 0, &cfg->k_eq_v, err, errlen))) return rc;
  if ((rc = get_bool(tc, "use_double_wide_mlp", 0, &cfg->double_wide_mlp, err, errlen))) return rc;
  if ((rc = get_bool(tc, "enable_moe_block", 0, &cfg->moe, err, errlen))) return rc;
  int tie_root = 1;
  if ((rc = get_bool(root, "tie_word_embeddings", 1, &tie_root, err, errlen))) return rc;
  if ((rc = get_bool(tc, "tie_word_embeddings", tie_root, &cfg->tie_embeddings, err, errlen)))
    return rc;
  if (cfg->moe) {
    INT_FIELD("num_experts", 1, 0, 1, 4096, cfg->n_experts);
    INT_FIELD("top_k_experts", 1, 0, 1, cfg->n_experts, cfg->top_k_experts);
    INT_FIELD("moe_intermediate_size", 1, 0, 1, 1 << 20, cfg->moe_ffn);
  }
  if (cfg->ple_dim && cfg->ple_vocab < 1)
    return cm_fail(err, errlen, CM_ERR_RANGE, "config.json: vocab_size_per_layer_input is 0");
  const json_t *act = json_object_get(tc, "hidden_activation");
  if (!act) act = json_object_get(tc, "hidden_act");
  if (act && json_is_string(act) && strcmp(json_string_value(act), "gelu_pytorch_tanh") &&
      strcmp(json_string_value(act), "gelu_tanh"))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                    "config.json: hidden_activation \"%s\" is not supported (gelu_pytorch_tanh)",
                    json_string_value(act));
  if (cfg->arch == MD_ARCH_GEMMA4_ASSISTANT && cfg->n_kv_shared == 0)
    cfg->n_kv_shared = cfg->n_layers; /* every assistant layer reads the target */
#undef INT_FIELD
  enum md_layer_kind kinds[MD_MAX_LAYERS];
  struct overrides ov;
  if ((rc = parse_layer_types(tc, cfg, kinds, err, errlen))) return rc;
  if ((rc = parse_per_layer(tc, cfg, kinds, &ov, err, errlen))) return rc;
  if ((rc = parse_rope(tc, cfg, err, errlen))) return rc;
  if ((rc = get_eos(tc, cfg, "config.json", err, errlen))) return rc;
  if (!cfg->n_eos && (rc = get_eos(root, cfg, "config.json", err, errlen))) return rc;
  if (!cfg->n_eos) {
    cfg->eos_ids[0] = 1 < cfg->vocab ? 1 : 0;
    cfg->n_eos = 1;
  }
  return plan_layers(cfg, kinds, &ov, err, errlen);
}

/* One compressed-tensors quantization scheme's "weights" (or, with act set,
 * "input_activations") object: 8-bit floats, per channel or per tensor. */
static int check_scheme(const json_t *q, const char *group, int act, char *err, size_t errlen) {
  const char *what = act ? "input_activations" : "weights";
  if (!q || json_is_null(q)) {
    if (act) return 0; /* weight-only */
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "config.json: quantization_config.config_groups.%s has no weights scheme",
                   group);
  }
  const json_t *bits = json_object_get(q, "num_bits"), *type = json_object_get(q, "type");
  if (!json_is_object(q) || !json_is_integer(bits) || json_integer_value(bits) != 8 ||
      !json_is_string(type) || strcmp(json_string_value(type), "float"))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "config.json: quantization_config.config_groups.%s.%s: only 8-bit float (FP8 "
                   "e4m3) schemes are supported",
                   group, what);
  const json_t *strat = json_object_get(q, "strategy");
  const char *st = json_is_string(strat) ? json_string_value(strat) : "";
  int ok = act ? !strcmp(st, "token") || !strcmp(st, "tensor")
               : !strcmp(st, "channel") || !strcmp(st, "tensor");
  if (!ok)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "config.json: quantization_config.config_groups.%s.%s.strategy \"%s\" is not "
                   "supported (%s)",
                   group, what, st, act ? "token or tensor" : "channel or tensor");
  const json_t *sym = json_object_get(q, "symmetric");
  if (json_is_false(sym))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "config.json: quantization_config.config_groups.%s.%s: asymmetric FP8 (zero "
                   "points) is not supported",
                   group, what);
  return 0;
}

/* compressed-tensors' kv_cache_scheme (absent or null: none): static 8-bit float
 * scales, one per tensor or per attention head, for an fp8 KV cache. */
static int parse_kv_scheme(const json_t *kv, struct md_config *cfg, char *err, size_t errlen) {
  if (!kv || json_is_null(kv)) return 0;
  const json_t *bits = json_object_get(kv, "num_bits"), *type = json_object_get(kv, "type");
  const json_t *strat = json_object_get(kv, "strategy");
  const char *st = json_is_string(strat) ? json_string_value(strat) : "";
  const char *bad = !json_is_object(kv) ? "it is not an object"
                    : !json_is_integer(bits) || json_integer_value(bits) != 8 ||
                            !json_is_string(type) || strcmp(json_string_value(type), "float")
                        ? "only 8-bit float (e4m3) caches are supported"
                    : json_is_true(json_object_get(kv, "dynamic"))
                        ? "dynamic scales are not supported (static: the checkpoint's)"
                    : json_is_false(json_object_get(kv, "symmetric"))
                        ? "asymmetric scales (zero points) are not supported"
                    : strcmp(st, "tensor") && strcmp(st, "attn_head")
                        ? "the strategy must be tensor or attn_head"
                        : NULL;
  if (bad)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "config.json: quantization_config.kv_cache_scheme: %s", bad);
  cfg->kv_scales = 1;
  return 0;
}

/* quantization_config: absent, FP8 linear weights (cfg->fp8), and/or the fp8 KV
 * cache's scales (cfg->kv_scales). Anything else is refused by name, never
 * loaded as if it were bf16. */
static int parse_quant(const json_t *root, struct md_config *cfg, char *err, size_t errlen) {
  const json_t *qc = json_object_get(root, "quantization_config");
  if (!qc || json_is_null(qc)) return 0;
  const json_t *m = json_object_get(qc, "quant_method");
  if (!json_is_object(qc) || !json_is_string(m))
    return cm_fail(err, errlen, CM_ERR_PARSE,
                   "config.json: quantization_config must be an object with a quant_method");
  const char *method = json_string_value(m);
  if (!strcmp(method, "fp8")) {
    if (json_object_get(qc, "weight_block_size") &&
        !json_is_null(json_object_get(qc, "weight_block_size")))
      return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                     "config.json: quantization_config.weight_block_size: block-wise FP8 scales "
                     "are not supported (per-channel or per-tensor are)");
    cfg->fp8 = 1;
    return 0;
  }
  if (strcmp(method, "compressed-tensors"))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "config.json: quantization_config.quant_method \"%s\" is not supported (FP8 "
                   "checkpoints: compressed-tensors or fp8)",
                   method);
  int rc = parse_kv_scheme(json_object_get(qc, "kv_cache_scheme"), cfg, err, errlen);
  if (rc) return rc;
  const json_t *groups = json_object_get(qc, "config_groups");
  if (cfg->kv_scales &&
      (!groups || json_is_null(groups) || (json_is_object(groups) && !json_object_size(groups))))
    return 0; /* the KV cache's scales alone */
  const json_t *fmt = json_object_get(qc, "format");
  if (json_is_string(fmt) && strcmp(json_string_value(fmt), "float-quantized") &&
      strcmp(json_string_value(fmt), "naive-quantized"))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "config.json: quantization_config.format \"%s\" is not supported "
                   "(float-quantized)",
                   json_string_value(fmt));
  if (!json_is_object(groups) || !json_object_size(groups))
    return cm_fail(err, errlen, CM_ERR_PARSE,
                   "config.json: quantization_config.config_groups missing");
  const char *name;
  const json_t *g;
  json_object_foreach((json_t *)groups, name, g) {
    if (!json_is_object(g))
      return cm_fail(err, errlen, CM_ERR_PARSE,
                     "config.json: quantization_config.config_groups.%s is not an object", name);
    rc = check_scheme(json_object_get(g, "weights"), name, 0, err, errlen);
    if (!rc) rc = check_scheme(json_object_get(g, "input_activations"), name, 1, err, errlen);
    if (rc) return rc;
  }
  cfg->fp8 = 1;
  return 0;
}

int md_config_parse(const char *text, size_t len, struct md_config *cfg, char *err, size_t errlen) {
  memset(cfg, 0, sizeof(*cfg));
  json_error_t jerr;
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return cm_fail(err, errlen, CM_ERR_PARSE, "config.json: line %d column %d: %s", jerr.line,
                    jerr.column, jerr.text);
  int rc = 0;
  if (!json_is_object(root)) {
    rc = cm_fail(err, errlen, CM_ERR_PARSE, "config.json: not a JSON object");
    goto done;
  }
  const json_t *mt = json_object_get(root, "model_type");
  if (!mt || !json_is_string(mt)) {
    rc = cm_fail(err, errlen, CM_ERR_PARSE, "config.json: model_type missing");
    goto done;
  }
  const char *type = json_string_value(mt);
  snprintf(cfg->model_type, sizeof(cfg->model_type), "%s", type);
  const json_t *tc = root;
  int nested = 0;
  if (!strcmp(type, "gemma3_text")) {
    cfg->arch = MD_ARCH_GEMMA3;
  } else if (!strcmp(type, "gemma3")) {
    cfg->arch = MD_ARCH_GEMMA3;
    nested = 1;
  } else if (!strcmp(type, "gemma4_text")) {
    cfg->arch = MD_ARCH_GEMMA4;
  } else if (!strcmp(type, "gemma4")) {
    cfg->arch = MD_ARCH_GEMMA4;
    nested = 1;
  } else if (!strcmp(type, "gemma4_assistant")) {
    cfg->arch = MD_ARCH_GEMMA4_ASSISTANT;
    nested = 1;
  } else {
    rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                  "config.json: model_type \"%s\" is not supported (gemma3_text, gemma3, "
                  "gemma4_text, gemma4, gemma4_assistant)",
                  type);
    goto done;
  }
  if (nested) {
    tc = json_object_get(root, "text_config");
    if (!tc || !json_is_object(tc)) {
      rc = cm_fail(err, errlen, CM_ERR_PARSE, "config.json: text_config missing for %s", type);
      goto done;
    }
  }
  if ((rc = parse_text(root, tc, cfg, err, errlen))) goto done;
  if ((rc = parse_quant(root, cfg, err, errlen))) goto done;
  if (!strcmp(type, "gemma3") && (rc = parse_vision(root, cfg, err, errlen))) goto done;
  if (!strcmp(type, "gemma4") && (rc = parse_vision_g4(root, tc, cfg, err, errlen))) goto done;
  if (!strcmp(type, "gemma4") && (rc = parse_audio_g4(root, cfg, err, errlen))) goto done;
  if (cfg->arch == MD_ARCH_GEMMA4_ASSISTANT) {
    long long v;
    if ((rc = get_int(root, "backbone_hidden_size", 1, 0, 1, 65536, &v, err, errlen))) goto done;
    cfg->backbone_hidden = (int)v;
    if ((rc = get_bool(root, "use_ordered_embeddings", 0, &cfg->use_ordered_embeddings, err,
                       errlen)))
      goto done;
    if ((rc = get_int(root, "num_centroids", 0, 2048, 1, 1 << 20, &v, err, errlen))) goto done;
    cfg->num_centroids = (int)v;
    if ((rc = get_int(root, "centroid_intermediate_top_k", 0, CM_MIN(32, cfg->num_centroids), 1,
                      cfg->num_centroids, &v, err, errlen)))
      goto done;
    cfg->centroid_top_k = (int)v;
    if (cfg->use_ordered_embeddings && cfg->vocab % cfg->num_centroids) {
      rc = cm_fail(err, errlen, CM_ERR_INVAL,
                    "config.json: vocab_size %d is not a multiple of num_centroids %d", cfg->vocab,
                    cfg->num_centroids);
      goto done;
    }
  }
done:
  json_decref(root);
  return rc;
}

/* A Gemma 4 tower's image settings (f->o): Gemma4ImageProcessor's fields; a
 * missing one keeps the tower's value or the processor's default. */
static int read_preproc_g4(const struct preproc *f, struct md_vision_g4_cfg *v, char *err,
                           size_t errlen) {
  const json_t *o = f->o;
  int do_resize = 1, do_rescale = 1, do_normalize = 0;
  long long tokens = 0, patch = 0, pool = 0, resample = 0;
  double factor = 0;
  int rc;
  if ((rc =
           get_int(o, "max_soft_tokens", 0, v->default_tokens, 1, 1 << 20, &tokens, err, errlen)) ||
      (rc = get_int(o, "patch_size", 0, v->patch, 1, 1 << 20, &patch, err, errlen)) ||
      (rc = get_int(o, "pooling_kernel_size", 0, v->pool, 1, 1 << 20, &pool, err, errlen)) ||
      (rc = get_int(o, "resample", 0, 3, 0, 5, &resample, err, errlen)) ||
      (rc = get_bool(o, "do_resize", 1, &do_resize, err, errlen)) ||
      (rc = get_bool(o, "do_rescale", 1, &do_rescale, err, errlen)) ||
      (rc = get_bool(o, "do_normalize", 0, &do_normalize, err, errlen)) ||
      (rc = get_num(o, "rescale_factor", 1.0 / 255.0, 1e-9, 1e9, &factor, err, errlen)))
    return retag(rc, f->file, f->prefix, err, errlen);
  if (!md_g4_soft_tokens_allowed((int)tokens))
    return cm_fail(err, errlen, CM_ERR_RANGE,
                   "%s: %smax_soft_tokens %lld is not one of 70, 140, 280, 560, 1120", f->file,
                   f->prefix, tokens);
  if (patch != v->patch || pool != v->pool)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "%s: %spatch_size %lld / pooling_kernel_size %lld differ from the vision "
                   "tower's %d / %d",
                   f->file, f->prefix, patch, pool, v->patch, v->pool);
  if (resample != 3)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "%s: %sresample %lld is not supported (3: bicubic)", f->file, f->prefix,
                   resample);
  if (!do_resize || !do_rescale || do_normalize || fabs(factor * 255.0 - 1.0) > 1e-9)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "%s: %sdo_resize, do_rescale (rescale_factor 1/255) and no do_normalize are "
                   "the only Gemma 4 preprocessing supported",
                   f->file, f->prefix);
  v->default_tokens = (int)tokens;
  return 0;
}

/* A processor file's image settings for the tower (g4: Gemma 4's) read by its
 * reader; a processor without images keeps the defaults. */
static int parse_preproc(const char *text, size_t len, int nested, struct md_config *cfg, int g4,
                         char *err, size_t errlen) {
  struct preproc f;
  int rc = preproc_open(text, len, nested, g4 ? cfg->vision_g4.present : cfg->vision.present,
                        g4 ? "Gemma 4 vision tower" : "vision tower", &f, err, errlen);
  if (rc) return rc;
  if (f.o)
    rc = g4 ? read_preproc_g4(&f, &cfg->vision_g4, err, errlen)
            : read_preproc(&f, &cfg->vision, err, errlen);
  json_decref(f.root);
  return rc;
}

int md_config_parse_vision(const char *text, size_t len, struct md_config *cfg, char *err,
                           size_t errlen) {
  json_error_t jerr;
  json_t *root = json_loadb(text, len, 0, &jerr);
  if (!root) return cm_fail(err, errlen, CM_ERR_PARSE, "vision config: %s", jerr.text);
  int rc;
  if (cfg->arch == MD_ARCH_GEMMA4) { /* Gemma 4: its vision and audio towers */
    const json_t *tc = json_object_get(root, "text_config");
    if (!(rc = parse_vision_g4(root, tc, cfg, err, errlen)))
      rc = parse_audio_g4(root, cfg, err, errlen);
  } else {
    rc = parse_vision(root, cfg, err, errlen);
  }
  json_decref(root);
  return rc;
}

int md_config_parse_preproc(const char *text, size_t len, int nested, struct md_config *cfg,
                            char *err, size_t errlen) {
  return parse_preproc(text, len, nested, cfg, 0, err, errlen);
}

int md_config_parse_preproc_g4(const char *text, size_t len, int nested, struct md_config *cfg,
                               char *err, size_t errlen) {
  return parse_preproc(text, len, nested, cfg, 1, err, errlen);
}

int md_config_parse_generation(const char *text, size_t len, struct md_config *cfg, char *err,
                               size_t errlen) {
  json_error_t jerr;
  json_t *root = json_loadb(text, len, 0, &jerr);
  if (!root)
    return cm_fail(err, errlen, CM_ERR_PARSE, "generation_config.json: line %d column %d: %s",
                    jerr.line, jerr.column, jerr.text);
  int rc = 0;
  if (!json_is_object(root))
    rc = cm_fail(err, errlen, CM_ERR_PARSE, "generation_config.json: not a JSON object");
  else
    rc = get_eos(root, cfg, "generation_config.json", err, errlen);
  json_decref(root);
  return rc;
}

/* One sampling default from o (absent or null: none); `skip` is transformers' own
 * default, which says nothing unless the text is an override. */
static int sampling_number(const json_t *o, const char *key, double lo, int lo_open, double hi,
                           double skip, int override, unsigned bit, double *out, unsigned *has,
                           const char *what, char *err, size_t errlen) {
  const json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  double x = json_number_value(v);
  if (!json_is_number(v) || !isfinite(x) || (lo_open ? x <= lo : x < lo) || x > hi)
    return cm_fail(err, errlen, CM_ERR_INVAL, "%s: '%s' must be a number in %s%g, %g]", what, key,
                   lo_open ? "(" : "[", lo, hi);
  if (!override && x == skip) return 0;
  *out = x;
  *has |= bit;
  return 0;
}

int md_sampling_parse(const char *text, size_t len, int override, const char *what,
                      struct md_sampling *s, char *err, size_t errlen) {
  json_error_t je;
  json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
  if (!o)
    return cm_fail(err, errlen, CM_ERR_PARSE, "%s: line %d column %d: %s", what, je.line, je.column,
                   je.text);
  int rc =
      json_is_object(o) ? 0 : cm_fail(err, errlen, CM_ERR_PARSE, "%s: not a JSON object", what);
  if (!rc)
    rc = sampling_number(o, "temperature", 0, 0, 2, 1, override, MD_SAMPLE_TEMPERATURE,
                         &s->temperature, &s->has, what, err, errlen);
  if (!rc)
    rc = sampling_number(o, "top_p", 0, 1, 1, 1, override, MD_SAMPLE_TOP_P, &s->top_p, &s->has,
                         what, err, errlen);
  if (!rc)
    rc = sampling_number(o, "min_p", 0, 0, 1, -1, override, MD_SAMPLE_MIN_P, &s->min_p, &s->has,
                         what, err, errlen);
  if (!rc)
    rc =
        sampling_number(o, "repetition_penalty", 0, 1, 2, 1, override, MD_SAMPLE_REPETITION_PENALTY,
                        &s->repetition_penalty, &s->has, what, err, errlen);
  const json_t *k = json_object_get(o, "top_k");
  if (!rc && k && !json_is_null(k)) {
    json_int_t x = json_integer_value(k);
    if (!json_is_integer(k) || x < -1 || x > INT32_MAX)
      rc = cm_fail(err, errlen, CM_ERR_INVAL, "%s: 'top_k' must be an integer, -1 or more", what);
    else if (override || x != 50)
      s->top_k = x <= 0 ? -1 : (int32_t)x, s->has |= MD_SAMPLE_TOP_K;
  }
  const json_t *m = json_object_get(o, "max_new_tokens");
  if (!rc && m && !json_is_null(m)) {
    json_int_t x = json_integer_value(m);
    if (!json_is_integer(m) || x < 1 || x > INT32_MAX)
      rc = cm_fail(err, errlen, CM_ERR_INVAL, "%s: 'max_new_tokens' must be an integer, 1 or more",
                   what);
    else
      s->max_tokens = x, s->has |= MD_SAMPLE_MAX_TOKENS;
  }
  json_decref(o);
  return rc;
}

int md_sampling_load(const char *mode, const char *dir, const char *override, struct md_sampling *s,
                     char *err, size_t errlen) {
  memset(s, 0, sizeof(*s));
  const char *from = !mode || !strcmp(mode, "auto") ? dir : strcmp(mode, "vllm") ? mode : NULL;
  struct stat st;
  if (from && mode && strcmp(mode, "auto")) { /* a folder named: it must be one */
    int e = stat(from, &st) ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
    if (e)
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "--generation-config %s: not auto, vllm or a folder (%s)", from, strerror(e));
  }
  if (from && !stat(from, &st) && S_ISDIR(st.st_mode)) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/generation_config.json", from);
    char *text = NULL;
    size_t len = 0;
    int rc = md_read_file(path, 16u << 20, &text, &len);
    if (rc && rc != CM_ERR_NOENT) return cm_fail(err, errlen, rc, "%s: %s", path, cm_strerror(rc));
    if (!rc) {
      rc = md_sampling_parse(text, len, 0, path, s, err, errlen);
      free(text);
      if (rc) return rc;
    }
  }
  if (override && *override)
    return md_sampling_parse(override, strlen(override), 1, "--override-generation-config", s, err,
                             errlen);
  return 0;
}

int md_config_load(const char *dir, struct md_config *cfg, char *err, size_t errlen) {
  char path[4096];
  int g = md_model_gguf_path(dir, path, sizeof(path), err, errlen);
  if (g < 0) return g;
  if (g) return md_config_load_gguf(dir, path, cfg, err, errlen);
  snprintf(path, sizeof(path), "%s/config.json", dir);
  char *text = NULL;
  size_t len = 0;
  int rc = md_read_file(path, 16u << 20, &text, &len);
  if (rc) return cm_fail(err, errlen, rc, "%s: %s", path, cm_strerror(rc));
  rc = md_config_parse(text, len, cfg, err, errlen);
  free(text);
  if (rc) return rc;
  snprintf(path, sizeof(path), "%s/generation_config.json", dir);
  rc = md_read_file(path, 16u << 20, &text, &len);
  if (rc && rc != CM_ERR_NOENT) return cm_fail(err, errlen, rc, "%s: %s", path, cm_strerror(rc));
  if (!rc) {
    rc = md_config_parse_generation(text, len, cfg, err, errlen);
    free(text);
    if (rc) return rc;
  }
  if (!cfg->vision.present && !cfg->vision_g4.present) return 0;
  /* preprocessor_config.json, else the newer processor_config.json */
  for (int nested = 0; nested < 2; nested++) {
    snprintf(path, sizeof(path), "%s/%s", dir,
             nested ? "processor_config.json" : "preprocessor_config.json");
    rc = md_read_file(path, 16u << 20, &text, &len);
    if (rc == CM_ERR_NOENT) continue;
    if (rc) return cm_fail(err, errlen, rc, "%s: %s", path, cm_strerror(rc));
    rc = cfg->vision_g4.present ? md_config_parse_preproc_g4(text, len, nested, cfg, err, errlen)
                                : md_config_parse_preproc(text, len, nested, cfg, err, errlen);
    free(text);
    return rc;
  }
  return 0;
}
