/* wk-encoder.c — the image encoder cache (see wk-encoder.h): a small array of
 * entries searched linearly (a cache holds tens of images, a step meets a few),
 * each with its pixels, its embeddings, the step that last used it and a use
 * clock for LRU. */
#include "worker/wk-encoder.h"

#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "model/md-vision-preproc.h"

#define DEFAULT_CAP (256u << 20)

struct entry {
  uint64_t hash;
  float *rows;     /* [tokens, hidden], then pixels: one block */
  uint8_t *pixels; /* [image_bytes] */
  uint64_t used;   /* use clock of the last lookup */
  uint64_t step;   /* the step that last used it */
};

struct wk_encoder {
  struct wk_vision *vision;
  int tokens, hidden, channels, width, height;
  size_t image_bytes, entry_bytes, cap_bytes;
  float *stage_px;   /* [cap_stage, channels, height, width] images to encode */
  float *stage_rows; /* [cap_stage, tokens, hidden] their embeddings, after stage_px in its block */
  int cap_stage;
  struct entry *v;   /* [n] */
  int n, cap_n;
  uint64_t clock, step;
  uint64_t encodes, hits;
};

int wk_encoder_create(struct wk_vision *vision, size_t cap_bytes, struct wk_encoder **out) {
  *out = NULL;
  const struct md_vision_cfg *vc = wk_vision_config(vision);
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
  *out = e;
  return 0;
}

static void entry_release(struct entry *x) {
  free(x->rows);
  memset(x, 0, sizeof(*x));
}

void wk_encoder_free(struct wk_encoder *e) {
  if (!e) return;
  for (int i = 0; i < e->n; i++)
    entry_release(&e->v[i]);
  free(e->v);
  free(e->stage_px);
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
    /* keep the order: the entries a call adds stay the last ones */
    memmove(&e->v[victim], &e->v[victim + 1], sizeof(*e->v) * (size_t)(e->n - victim - 1));
    e->n--;
  }
}

/* The entry holding this image, or NULL. */
static struct entry *find(struct wk_encoder *e, const struct pr_image *im) {
  for (int i = 0; i < e->n; i++) {
    struct entry *x = &e->v[i];
    if (x->hash == im->hash && memcmp(x->pixels, im->pixels.v, e->image_bytes) == 0) return x;
  }
  return NULL;
}

/* Room for k more pixel planes and embeddings in the staging buffers. */
static int stage_reserve(struct wk_encoder *e, int k) {
  if (k <= e->cap_stage) return 0;
  int cap = k < 2 * e->cap_stage ? 2 * e->cap_stage : k;
  /* the images staged so far stay where they are; the embeddings are written later */
  size_t per = e->image_bytes + (size_t)e->tokens * (size_t)e->hidden; /* floats */
  float *px = realloc(e->stage_px, sizeof(float) * per * (size_t)cap);
  if (!px) return CM_ERR_NOMEM;
  e->stage_px = px;
  e->stage_rows = px + e->image_bytes * (size_t)cap;
  e->cap_stage = cap;
  return 0;
}

int wk_encoder_get_many(struct wk_encoder *e, const struct pr_image *const *ims, int n,
                        const float **rows, char *err, size_t errlen) {
  int rc = 0, k = 0; /* k: new entries, the last k of e->v */
  for (int i = 0; i < n; i++) {
    rc = wk_encoder_check(e, ims[i], err, errlen);
    if (rc) return rc;
  }
  for (int i = 0; i < n; i++) {
    struct entry *x = find(e, ims[i]);
    if (x) {
      x->used = ++e->clock;
      x->step = e->step;
      if (x < e->v + e->n - k) e->hits++; /* found, not one this call adds */
      /* entries may move (eviction, growth) but their buffers stay, and nothing
       * this step uses is evicted */
      rows[i] = x->rows;
      continue;
    }
    make_room(e); /* evicts only entries this step has not used */
    if (e->n == e->cap_n) {
      int cap = e->cap_n ? 2 * e->cap_n : 8;
      struct entry *v = realloc(e->v, sizeof(*v) * (size_t)cap);
      if (!v) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for the image cache");
      e->v = v;
      e->cap_n = cap;
    }
    struct entry nx = {.hash = ims[i]->hash, .used = ++e->clock, .step = e->step};
    nx.rows = malloc(e->entry_bytes);
    if (nx.rows) nx.pixels = (uint8_t *)(nx.rows + (size_t)e->tokens * (size_t)e->hidden);
    if (!nx.rows || stage_reserve(e, k + 1)) {
      entry_release(&nx);
      rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for an image's embeddings");
      goto undo;
    }
    memcpy(nx.pixels, ims[i]->pixels.v, e->image_bytes);
    const struct md_vision_cfg *vc = wk_vision_config(e->vision);
    rc = md_image_preprocess(e->stage_px + e->image_bytes * (size_t)k, nx.pixels, e->width,
                             e->height, e->channels, &vc->pre, err, errlen);
    e->v[e->n++] = nx;
    k++;
    rows[i] = nx.rows;
    if (rc) goto undo;
  }
  if (k) { /* the new images in one call: the tower runs them max_images at a time */
    rc = wk_vision_encode(e->vision, e->stage_px, k, e->stage_rows, err, errlen);
    if (rc) goto undo;
    size_t per = (size_t)e->tokens * (size_t)e->hidden;
    for (int j = 0; j < k; j++)
      memcpy(e->v[e->n - k + j].rows, e->stage_rows + per * (size_t)j, sizeof(float) * per);
    e->encodes += (uint64_t)k;
  }
  return 0;
undo: /* the entries this call added hold nothing valid */
  while (k-- > 0)
    entry_release(&e->v[--e->n]);
  return rc;
}

int wk_encoder_get(struct wk_encoder *e, const struct pr_image *im, const float **rows, char *err,
                   size_t errlen) {
  return wk_encoder_get_many(e, &im, 1, rows, err, errlen);
}
