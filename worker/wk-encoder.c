/* wk-encoder.c — the image encoder cache (see wk-encoder.h): a small array of
 * entries searched linearly (a cache holds tens of images, a step meets a few),
 * each with its pixels, its embeddings, the step that last used it and a use
 * clock for LRU. */
#include "worker/wk-encoder.h"

#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "worker/wk-vision-preproc.h"

#define DEFAULT_CAP (256u << 20)

struct entry {
  uint64_t hash;
  uint8_t *pixels; /* [image_bytes] */
  float *rows;     /* [tokens, hidden] */
  uint64_t used;   /* use clock of the last lookup */
  uint64_t step;   /* the step that last used it */
};

struct wk_encoder {
  struct wk_vision *vision;
  int tokens, hidden, channels, width, height;
  size_t image_bytes, entry_bytes, cap_bytes;
  float *pixels_f32; /* [channels, height, width] scratch */
  struct entry *v;   /* [n] */
  int n, cap_n;
  uint64_t clock, step;
  uint64_t encodes, hits;
};

int wk_encoder_create(struct wk_vision *vision, size_t cap_bytes, struct wk_encoder **out) {
  *out = NULL;
  const struct wk_vision_cfg *vc = wk_vision_config(vision);
  if (vc->pre.width != vc->image_size || vc->pre.height != vc->image_size) return CM_ERR_SHAPE;
  struct wk_encoder *e = calloc(1, sizeof(*e));
  if (!e) return CM_ERR_NOMEM;
  e->vision = vision;
  e->tokens = vc->mm_tokens;
  e->hidden = wk_vision_text_hidden(vision);
  e->channels = vc->channels;
  e->width = vc->pre.width;
  e->height = vc->pre.height;
  e->image_bytes = (size_t)e->width * (size_t)e->height * (size_t)e->channels;
  e->entry_bytes = e->image_bytes + sizeof(float) * (size_t)e->tokens * (size_t)e->hidden;
  e->cap_bytes = cap_bytes ? cap_bytes : DEFAULT_CAP;
  e->pixels_f32 = malloc(sizeof(float) * e->image_bytes);
  if (!e->pixels_f32) {
    wk_encoder_free(e);
    return CM_ERR_NOMEM;
  }
  *out = e;
  return 0;
}

static void entry_release(struct entry *x) {
  free(x->pixels);
  free(x->rows);
  memset(x, 0, sizeof(*x));
}

void wk_encoder_free(struct wk_encoder *e) {
  if (!e) return;
  for (int i = 0; i < e->n; i++)
    entry_release(&e->v[i]);
  free(e->v);
  free(e->pixels_f32);
  free(e);
}

int wk_encoder_image_tokens(const struct wk_encoder *e) {
  return e->tokens;
}

size_t wk_encoder_image_bytes(const struct wk_encoder *e) {
  return e->image_bytes;
}

void wk_encoder_stats(const struct wk_encoder *e, uint64_t *encodes, uint64_t *hits) {
  *encodes = e->encodes;
  *hits = e->hits;
}

int wk_encoder_check(const struct wk_encoder *e, const struct pr_image *im, char *err,
                     size_t errlen) {
  if (im->n_tokens != (uint32_t)e->tokens || im->pixels.n != e->image_bytes)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "image at position %u: %u tokens and %u pixel bytes (the model takes %d "
                   "tokens of a %d x %d x %d image)",
                   im->pos, im->n_tokens, im->pixels.n, e->tokens, e->width, e->height,
                   e->channels);
  return 0;
}

void wk_encoder_begin_step(struct wk_encoder *e) {
  e->step++;
}

/* Frees least recently used entries not pinned by this step until one more
 * entry fits the capacity (or nothing unpinned is left). */
static void make_room(struct wk_encoder *e) {
  while (e->n > 0 && (size_t)(e->n + 1) * e->entry_bytes > e->cap_bytes) {
    int victim = -1;
    for (int i = 0; i < e->n; i++)
      if (e->v[i].step != e->step && (victim < 0 || e->v[i].used < e->v[victim].used)) victim = i;
    if (victim < 0) return;
    entry_release(&e->v[victim]);
    e->v[victim] = e->v[--e->n];
  }
}

int wk_encoder_get(struct wk_encoder *e, const struct pr_image *im, const float **rows, char *err,
                   size_t errlen) {
  int rc = wk_encoder_check(e, im, err, errlen);
  if (rc) return rc;
  for (int i = 0; i < e->n; i++) {
    struct entry *x = &e->v[i];
    if (x->hash == im->hash && memcmp(x->pixels, im->pixels.v, e->image_bytes) == 0) {
      x->used = ++e->clock;
      x->step = e->step;
      e->hits++;
      *rows = x->rows;
      return 0;
    }
  }
  make_room(e);
  if (e->n == e->cap_n) {
    int cap = e->cap_n ? 2 * e->cap_n : 8;
    struct entry *v = realloc(e->v, sizeof(*v) * (size_t)cap);
    if (!v) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for the image cache");
    e->v = v;
    e->cap_n = cap;
  }
  struct entry x = {.hash = im->hash, .used = ++e->clock, .step = e->step};
  x.pixels = malloc(e->image_bytes);
  x.rows = malloc(sizeof(float) * (size_t)e->tokens * (size_t)e->hidden);
  if (!x.pixels || !x.rows) {
    entry_release(&x);
    return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for an image's embeddings");
  }
  memcpy(x.pixels, im->pixels.v, e->image_bytes);
  const struct wk_vision_cfg *vc = wk_vision_config(e->vision);
  rc = wk_image_preprocess(e->pixels_f32, x.pixels, e->width, e->height, e->channels, &vc->pre,
                           err, errlen);
  if (!rc) rc = wk_vision_encode(e->vision, e->pixels_f32, 1, x.rows, err, errlen);
  if (rc) {
    entry_release(&x);
    return rc;
  }
  e->encodes++;
  e->v[e->n++] = x;
  *rows = x.rows;
  return 0;
}
