/* fe-mm.c — image input on the frontend (see fe-mm.h). */
#include "frontend/fe-mm.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/cm-err.h"
#include "common/cm-hash.h"
#include "model/md-config.h"
#include "model/md-vision-g4.h"
#include "model/md-vision-preproc.h"

#define DEFAULT_LIMIT 16

/* The text of one special token (its vocabulary entry). */
static int token_text(const struct tk_tokenizer *tok, int32_t id, char *out, size_t cap) {
  char *s = NULL;
  size_t len = 0, scap = 0;
  int rc = tk_decode(tok, &id, 1, 0, &s, &len, &scap);
  if (rc == 0 && (len == 0 || len >= cap)) rc = CM_ERR_RANGE;
  if (rc == 0) {
    memcpy(out, s, len);
    out[len] = 0;
  }
  free(s);
  return rc;
}

/* One modality's count of --limit-mm-per-prompt into *image or *audio. */
static int set_limit(const char *spec, const char *name, long long n, int *image, int *audio,
                     char *err, size_t errlen) {
  int *dst = !strcmp(name, "image") ? image : !strcmp(name, "audio") ? audio : NULL;
  if (!dst)
    return cm_fail(err, errlen, CM_ERR_INVAL, "'%s': only image and audio are taken, not '%.20s'",
                   spec, name);
  if (n < 0 || n > PR_MAX_IMAGES)
    return cm_fail(err, errlen, CM_ERR_INVAL, "'%s': the %s count must be 0..%d", spec, name,
                   PR_MAX_IMAGES);
  *dst = (int)n;
  return 0;
}

int fe_mm_parse_kwargs(const char *json, int *max_soft_tokens, char *err, size_t errlen) {
  json_error_t je;
  json_t *j = json_loads(json, 0, &je), *v;
  const char *k;
  int rc = 0;
  if (!json_is_object(j))
    rc = cm_fail(err, errlen, CM_ERR_INVAL, "not a JSON object");
  else
    json_object_foreach(j, k, v) {
      long long n = json_is_integer(v) ? (long long)json_integer_value(v) : -1;
      if (strcmp(k, "max_soft_tokens")) {
        rc = cm_fail(err, errlen, CM_ERR_INVAL,
                     "'%.64s' is not an argument of this server's processors (max_soft_tokens is)",
                     k);
        break;
      }
      if (n < 1 || n > MD_G4_MAX_SOFT_TOKENS || !md_g4_soft_tokens_allowed((int)n)) {
        rc = cm_fail(err, errlen, CM_ERR_INVAL,
                     "max_soft_tokens must be one of 70, 140, 280, 560, 1120");
        break;
      }
      *max_soft_tokens = (int)n;
    }
  json_decref(j);
  return rc;
}

int fe_mm_parse_limit(const char *spec, int *image, int *audio, char *err, size_t errlen) {
  int im = *image, au = *audio;
  if (spec[0] == '{') {
    json_error_t je;
    json_t *j = json_loads(spec, 0, &je), *v;
    const char *k;
    if (!json_is_object(j) || json_object_size(j) == 0) {
      json_decref(j);
      return cm_fail(err, errlen, CM_ERR_INVAL, "'%s': expected {\"image\": N, \"audio\": M}",
                     spec);
    }
    json_object_foreach(j, k, v) {
      int rc = json_is_integer(v) ? set_limit(spec, k, json_integer_value(v), &im, &au, err, errlen)
                                  : cm_fail(err, errlen, CM_ERR_INVAL,
                                            "'%s': the %.20s count must be a number", spec, k);
      if (rc) {
        json_decref(j);
        return rc;
      }
    }
    json_decref(j);
  } else { /* name=N[,name=N] */
    for (const char *p = spec;; p++) {
      const char *eq = strchr(p, '='), *end = strchr(p, ',');
      if (!end) end = p + strlen(p);
      if (!eq || eq > end || eq == p || eq - p > 15)
        return cm_fail(err, errlen, CM_ERR_INVAL, "'%s': expected image=N,audio=M or JSON", spec);
      char name[16], *stop;
      memcpy(name, p, (size_t)(eq - p));
      name[eq - p] = 0;
      errno = 0;
      long long n = strtoll(eq + 1, &stop, 10);
      if (errno || stop == eq + 1 || stop != end) n = -1;
      int rc = set_limit(spec, name, n, &im, &au, err, errlen);
      if (rc) return rc;
      if (!*end) break;
      p = end; /* the comma; the next name follows it */
    }
  }
  *image = im;
  *audio = au;
  return 0;
}

/* The token texts of the ids (boi, soft, eoi) into the three buffers. */
static int marker_texts(const struct tk_tokenizer *tok, const int ids[3], char *boi, char *soft,
                        char *eoi, const char *dir, const char *what, char *err, size_t errlen) {
  if (token_text(tok, ids[0], boi, 32) || token_text(tok, ids[1], soft, 32) ||
      token_text(tok, ids[2], eoi, 32))
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "%s: the tokenizer has no text for the %s token ids %d / %d / %d", dir, what,
                   ids[0], ids[1], ids[2]);
  return 0;
}

/* Gemma 4's audio: the token texts and the feature extractor. */
static int load_audio(const char *dir, const struct tk_tokenizer *tok,
                      const struct md_audio_g4_cfg *a, int limit, struct fe_mm *mm, char *err,
                      size_t errlen) {
  const int ids[3] = {a->boa_id, a->audio_id, a->eoa_id};
  int rc = marker_texts(tok, ids, mm->boa, mm->audio_soft, mm->eoa, dir, "audio", err, errlen);
  if (rc) return rc;
  if ((rc = md_audio_fe_load(dir, &mm->fe, err, errlen))) return rc;
  mm->audio_limit = limit > PR_MAX_IMAGES ? PR_MAX_IMAGES : limit;
  mm->audio_id = a->audio_id;
  mm->audio = 1;
  return 0;
}

int fe_mm_load(const char *dir, const struct md_config *cfg, const struct tk_tokenizer *tok,
               const struct fe_mm_opts *o, struct fe_mm *mm, char *err, size_t errlen) {
  memset(mm, 0, sizeof(*mm));
  mm->image_id = mm->audio_id = -1;
  int limit = o && o->limit >= 0 ? o->limit : DEFAULT_LIMIT;
  int audio_limit = o && o->audio_limit >= 0 ? o->audio_limit : DEFAULT_LIMIT;
  if (limit == 0 && audio_limit == 0) return 0;
  struct md_config *c = NULL;
  if (!cfg) { /* read here: a folder's config.json (a GGUF file's config comes read) */
    if (!(c = calloc(1, sizeof(*c)))) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
    char why[256] = "";
    int rc = md_config_load(dir, c, why, sizeof(why));
    if (rc == CM_ERR_NOENT) { /* a tokenizer-only directory: text only */
      free(c);
      return 0;
    }
    if (rc) {
      free(c);
      return cm_fail(err, errlen, rc, "%s", why);
    }
    cfg = c;
  }
  const struct md_vision_cfg v = cfg->vision; /* what follows needs no more of cfg */
  const struct md_vision_g4_cfg g4 = cfg->vision_g4;
  const struct md_audio_g4_cfg a = cfg->audio_g4;
  free(c);
  int rc;
  if (o) {
    mm->lim.max_bytes = o->max_bytes;
    mm->lim.max_pixels = o->max_pixels;
    mm->lim.local_dir = o->local_dir;
  }
  if (getrandom(&mm->hash_key, sizeof(mm->hash_key), 0) != (ssize_t)sizeof(mm->hash_key))
    mm->hash_key = (uint64_t)(uintptr_t)mm ^ 0x5bd1e9955bd1e995ull;
  if (a.present && audio_limit > 0 && (rc = load_audio(dir, tok, &a, audio_limit, mm, err, errlen)))
    return rc;
  if (o && o->max_soft_tokens && !g4.present)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "--mm-processor-kwargs: max_soft_tokens is Gemma 4's image budget, and %s "
                   "has no Gemma 4 vision tower",
                   dir);
  if (limit == 0) return 0;
  if (g4.present) { /* Gemma 4: a size and a token count per image */
    mm->g4 = 1;
    mm->g4cfg = g4;
    mm->tokens = o && o->max_soft_tokens ? o->max_soft_tokens : g4.default_tokens;
    mm->image_id = g4.image_id;
    mm->channels = 3;
    mm->do_resize = 1;
    const int ids[3] = {g4.boi_id, g4.image_id, g4.eoi_id};
    if ((rc = marker_texts(tok, ids, mm->boi, mm->soft, mm->eoi, dir, "image", err, errlen)))
      return rc;
  } else {
    if (!v.present) return 0;
    if (v.channels != 3)
      return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                     "%s: vision_config.num_channels %d (3 supported)", dir, v.channels);
    mm->tokens = v.mm_tokens;
    mm->image_id = v.image_id;
    mm->width = v.pre.width;
    mm->height = v.pre.height;
    mm->channels = 3;
    mm->do_resize = v.pre.do_resize;
    const int ids[3] = {v.boi_id, v.image_id, v.eoi_id};
    if ((rc = marker_texts(tok, ids, mm->boi, mm->soft, mm->eoi, dir, "image", err, errlen)))
      return rc;
  }
  mm->limit = limit > PR_MAX_IMAGES ? PR_MAX_IMAGES : limit;
  mm->enabled = 1;
  return 0;
}

/* ---- content hash ------------------------------------------------------------
 * A keyed 64-bit hash of the pixels and their shape: eight bytes at a time,
 * multiply-rotate rounds, a final avalanche. The key is random per frontend
 * process, so nobody outside can aim two images at one hash; a worker still
 * compares the pixels before it reuses an encoding. */

static uint64_t pixel_hash(uint64_t key, const uint8_t *p, size_t n, int w, int h) {
  const uint64_t k1 = 0x9e3779b97f4a7c15ull, k2 = 0xc2b2ae3d27d4eb4full;
  uint64_t a = cm_mix64(key ^ k1);
  uint64_t b = cm_mix64(key + k2 + ((uint64_t)(uint32_t)w << 32 | (uint32_t)h));
  size_t i = 0;
  for (; i + 16 <= n; i += 16) { /* two lanes */
    uint64_t x, y;
    memcpy(&x, p + i, 8);
    memcpy(&y, p + i + 8, 8);
    a = cm_rotl64(a ^ (x * k2), 31) * k1;
    b = cm_rotl64(b ^ (y * k2), 29) * k1;
  }
  uint64_t tail = 0;
  if (i < n) memcpy(&tail, p + i, n - i < 8 ? n - i : 8);
  if (i + 8 < n) {
    uint64_t t2 = 0;
    memcpy(&t2, p + i + 8, n - i - 8);
    b ^= cm_mix64(t2 + k1);
  }
  a ^= cm_mix64(tail + k2);
  return cm_mix64(a ^ cm_rotl64(b, 17) ^ (uint64_t)n);
}

/* ---- one image ------------------------------------------------------------------ */

void fe_mm_image_free(struct fe_mm_image *img) {
  if (!img) return;
  free(img->pixels);
  img->pixels = NULL;
  img->n_bytes = 0;
}

size_t fe_mm_image_max_bytes(const struct fe_mm *mm, int max_soft_tokens) {
  if (!mm->g4) return (size_t)mm->width * (size_t)mm->height * (size_t)mm->channels;
  const struct md_vision_g4_cfg *v = &mm->g4cfg;
  size_t budget = (size_t)(max_soft_tokens ? max_soft_tokens : mm->tokens);
  return budget * (size_t)(v->pool * v->pool) * (size_t)(v->patch * v->patch) * 3;
}

/* Gemma 4: src resized to its size for the budget (md_g4_image_resize). */
static int image_g4(const struct fe_mm *mm, const struct fe_image *src, int max_soft_tokens,
                    struct fe_mm_image *out, char *err, size_t errlen) {
  struct md_g4_image info;
  char why[256] = "";
  int rc = md_g4_image_resize(&out->pixels, &info, src->rgb, src->w, src->h, &mm->g4cfg,
                              max_soft_tokens ? max_soft_tokens : mm->tokens, why, sizeof(why));
  if (rc) return cm_fail(err, errlen, rc, "the %d x %d image: %s", src->w, src->h, why);
  out->width = info.width;
  out->height = info.height;
  out->tokens = info.soft_tokens;
  out->n_bytes = (size_t)info.width * (size_t)info.height * 3;
  out->hash = pixel_hash(mm->hash_key, out->pixels, out->n_bytes, info.width, info.height);
  return 0;
}

int fe_mm_image(const struct fe_mm *mm, const char *url, size_t url_len, int max_soft_tokens,
                struct fe_mm_image *out, char *err, size_t errlen) {
  memset(out, 0, sizeof(*out));
  struct fe_image src;
  memset(&src, 0, sizeof(src));
  int rc = fe_image_load_url(url, url_len, &mm->lim, &src, err, errlen);
  if (rc) return rc;
  if (mm->g4) {
    rc = image_g4(mm, &src, max_soft_tokens, out, err, errlen);
    fe_image_free(&src);
    if (rc) fe_mm_image_free(out);
    return rc;
  }
  size_t n = (size_t)mm->width * (size_t)mm->height * (size_t)mm->channels;
  if (src.w == mm->width && src.h == mm->height) {
    out->pixels = src.rgb; /* already the size the model takes */
    src.rgb = NULL;
  } else if (!mm->do_resize) {
    rc = cm_fail(err, errlen, CM_ERR_INVAL,
                 "a %d x %d image; this model takes %d x %d images and its processor does not "
                 "resize",
                 src.w, src.h, mm->width, mm->height);
  } else if (!(out->pixels = malloc(n))) {
    rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for the resized image");
  } else if ((rc = md_image_resize_bilinear(out->pixels, mm->width, mm->height, src.rgb, src.w,
                                            src.h, mm->channels))) {
    rc = cm_fail(err, errlen, rc, "the %d x %d image cannot be resized", src.w, src.h);
  }
  fe_image_free(&src);
  if (rc) {
    fe_mm_image_free(out);
    return rc;
  }
  out->n_bytes = n;
  out->width = mm->width;
  out->height = mm->height;
  out->tokens = mm->tokens;
  out->hash = pixel_hash(mm->hash_key, out->pixels, n, mm->width, mm->height);
  return 0;
}

/* ---- one audio clip ---------------------------------------------------------------- */

size_t fe_mm_audio_max_bytes(const struct fe_mm *mm) {
  return md_audio_fe_max_frames(&mm->fe) * ((size_t)mm->fe.n_mel * sizeof(float) + 1);
}

int fe_mm_audio(const struct fe_mm *mm, const char *b64, size_t len, const char *format,
                struct fe_mm_image *out, char *err, size_t errlen) {
  memset(out, 0, sizeof(*out));
  struct fe_audio a;
  int rc = fe_audio_decode_b64(b64, len, format, &mm->alim, mm->fe.sampling_rate, &a, err, errlen);
  if (rc) return rc;
  size_t nf = md_audio_fe_frames(&mm->fe, a.n), nm = (size_t)mm->fe.n_mel;
  size_t n = nf * (nm * sizeof(float) + 1);
  /* features first (malloc's alignment holds the floats), then the mask */
  if (nf && !(out->pixels = malloc(n))) rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  uint8_t *mask = out->pixels + nf * nm * sizeof(float);
  if (!rc && nf && md_audio_features(&mm->fe, a.pcm, a.n, (float *)out->pixels, mask))
    rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for the audio features");
  if (!rc && (!nf || (out->tokens = md_audio_soft_tokens(mask, nf)) < 1))
    rc = cm_fail(err, errlen, CM_ERR_INVAL, "%.3f s of audio is too short for one audio token",
                 a.seconds);
  fe_audio_free(&a);
  if (rc) {
    fe_mm_image_free(out);
    return rc;
  }
  out->n_bytes = n;
  out->width = (int)nm;
  out->height = (int)nf;
  /* keyed apart from images: a clip's bytes never hash as a picture's */
  out->hash = pixel_hash(mm->hash_key ^ 0xa0d10a0d10a0d10aull, out->pixels, n, (int)nm, (int)nf);
  return 0;
}

/* ---- the prompt ------------------------------------------------------------------ */

static size_t count_markers(const char *text, size_t len, const char *m) {
  size_t ml = strlen(m), n = 0;
  for (const char *p = text; (p = memmem(p, len - (size_t)(p - text), m, ml)) != NULL; p += ml)
    n++;
  return n;
}

/* *out = text with each of its n markers `mark` replaced by nl + boi +
 * tokens[k] (NULL: def) x soft + eoi + nl; what names the items in errors. */
static int expand(const char *text, size_t len, const char *mark, const char *nl, const char *boi,
                  const char *soft, const char *eoi, size_t n, const int *tokens, int def,
                  const char *what, char **out, size_t *out_len, char *err, size_t errlen) {
  *out = NULL;
  *out_len = 0;
  size_t ml = strlen(mark), nll = strlen(nl);
  size_t markers = count_markers(text, len, mark);
  if (markers != n)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "the prompt has %zu %s placeholder%s (%s) for %zu %s%s", markers, what,
                   markers == 1 ? "" : "s", mark, n, what, n == 1 ? "" : "s");
  size_t bl = strlen(boi), sl = strlen(soft), el = strlen(eoi);
  size_t total = len - markers * ml;
  for (size_t k = 0; k < markers; k++)
    total += 2 * nll + bl + (size_t)(tokens ? tokens[k] : def) * sl + el;
  char *s = malloc(total + 1);
  if (!s) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  size_t o = 0;
  const char *p = text, *end = text + len;
  for (size_t k = 0; k < markers; k++) {
    const char *q = memmem(p, (size_t)(end - p), mark, ml);
    memcpy(s + o, p, (size_t)(q - p));
    o += (size_t)(q - p);
    memcpy(s + o, nl, nll);
    o += nll;
    memcpy(s + o, boi, bl);
    o += bl;
    for (int t = 0, nt = tokens ? tokens[k] : def; t < nt; t++, o += sl)
      memcpy(s + o, soft, sl);
    memcpy(s + o, eoi, el);
    o += el;
    memcpy(s + o, nl, nll);
    o += nll;
    p = q + ml;
  }
  memcpy(s + o, p, (size_t)(end - p));
  o += (size_t)(end - p);
  s[o] = 0;
  *out = s;
  *out_len = o;
  return 0;
}

int fe_mm_expand(const struct fe_mm *mm, const char *text, size_t len, size_t n_images,
                 const int *tokens, char **out, size_t *out_len, char *err, size_t errlen) {
  /* the template's marker: Gemma 3's <start_of_image>, Gemma 4's image token;
   * Gemma 4 puts nothing around an image */
  return expand(text, len, mm->g4 ? mm->soft : mm->boi, mm->g4 ? "" : "\n\n", mm->boi, mm->soft,
                mm->eoi, n_images, tokens, mm->tokens, "image", out, out_len, err, errlen);
}

int fe_mm_expand_audio(const struct fe_mm *mm, const char *text, size_t len, size_t n_clips,
                       const int *tokens, char **out, size_t *out_len, char *err, size_t errlen) {
  return expand(text, len, mm->audio_soft, "", mm->boa, mm->audio_soft, mm->eoa, n_clips, tokens, 0,
                "audio clip", out, out_len, err, errlen);
}

int fe_mm_find_runs(const struct fe_mm *mm, const int32_t *ids, size_t n, struct pr_image *imgs,
                    size_t n_images, const int *tokens, char *err, size_t errlen) {
  size_t k = 0;
  for (size_t i = 0; i < n;) {
    int32_t id = ids[i];
    if (id != mm->image_id && id != mm->audio_id) {
      i++;
      continue;
    }
    size_t j = i;
    while (j < n && ids[j] == id)
      j++;
    int audio = id == mm->audio_id;
    if (k == n_images || (imgs[k].kind == PR_MEDIA_AUDIO) != audio ||
        j - i != (size_t)(tokens ? tokens[k] : mm->tokens))
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "the prompt's %s tokens do not match its %s (%s written in the text?)",
                     audio ? "audio" : "image", audio ? "audio clips" : "images",
                     audio ? mm->audio_soft : mm->soft);
    imgs[k].pos = (uint32_t)i;
    imgs[k].n_tokens = (uint32_t)(j - i);
    k++;
    i = j;
  }
  if (k != n_images)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "the prompt has %zu image and audio token runs for %zu images and clips", k,
                   n_images);
  return 0;
}
