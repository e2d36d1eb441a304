/* wk-encoder.c — the image encoder cache (see wk-encoder.h): a small array of
 * entries searched linearly (a cache holds tens of images, a step meets a few),
 * each with its pixels, its embeddings, the step that last used it and a use
 * clock for LRU. Entries differ in size with Gemma 4's towers (each image its
 * own patch grid); the capacity counts each entry's own bytes. */
#include "worker/wk-encoder.h"

#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "model/md-vision-g4.h"
#include "model/md-vision-preproc.h"

#define DEFAULT_CAP (256u << 20)

struct entry {
  uint64_t hash;
  float *rows;     /* [tokens, hidden], then pixels: one block */
  uint8_t *pixels; /* [n_px] */
  size_t n_px;     /* pixel bytes */
  int tokens;      /* soft tokens */
  uint32_t width, height; /* px (0: the Gemma 3 tower's one size) */
  uint64_t used;   /* use clock of the last lookup */
  uint64_t step;   /* the step that last used it */
};

struct wk_encoder {
  struct wk_vision *vision;                    /* Gemma 3's tower, or NULL */
  struct wk_vision_g4 *g4;                     /* Gemma 4's tower, or NULL */
  int tokens, hidden, channels, width, height; /* Gemma 3: every image's; Gemma 4: the most */
  size_t image_bytes, cap_bytes, held;         /* held: bytes of the cached entries */
  float *stage_px;   /* Gemma 3: [cap_stage, channels, height, width] images to encode */
  float *stage_rows; /* [cap_stage, tokens, hidden] their embeddings, after stage_px in its block */
  int cap_stage;
  struct entry *v; /* [n] */
  int n, cap_n;
  uint64_t clock, step;
  uint64_t encodes, hits;
};

static size_t entry_bytes(const struct wk_encoder *e, size_t n_px, int tokens) {
  return n_px + sizeof(float) * (size_t)tokens * (size_t)e->hidden;
}

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
  e->cap_bytes = cap_bytes ? cap_bytes : DEFAULT_CAP;
  *out = e;
  return 0;
}

int wk_encoder_create_g4(struct wk_vision_g4 *g4, size_t cap_bytes, struct wk_encoder **out) {
  *out = NULL;
  const struct md_vision_g4_cfg *vc = wk_vision_g4_config(g4);
  struct wk_encoder *e = calloc(1, sizeof(*e));
  if (!e) return CM_ERR_NOMEM;
  e->g4 = g4;
  e->tokens = MD_G4_MAX_SOFT_TOKENS;
  e->hidden = wk_vision_g4_text_hidden(g4);
  e->channels = 3;
  /* the most pixels an image of the largest budget has: its patches, 3 bytes each */
  e->image_bytes = (size_t)MD_G4_MAX_SOFT_TOKENS * (size_t)(vc->pool * vc->pool) *
                   (size_t)(vc->patch * vc->patch) * 3;
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

int wk_encoder_varsize(const struct wk_encoder *e) {
  return e->g4 != NULL;
}

void wk_encoder_stats(const struct wk_encoder *e, uint64_t *encodes, uint64_t *hits) {
  *encodes = e->encodes;
  *hits = e->hits;
}

int wk_encoder_check(const struct wk_encoder *e, const struct pr_image *im, char *err,
                     size_t errlen) {
  if (e->g4) { /* the size the frontend resized it to: a plan's, with as many tokens */
    const struct md_vision_g4_cfg *vc = wk_vision_g4_config(e->g4);
    int side = vc->patch * vc->pool;
    uint64_t w = im->width, h = im->height;
    if (!w || !h || w % (uint64_t)side || h % (uint64_t)side || w * h * 3 != im->pixels.n ||
        w / (uint64_t)vc->patch > (uint64_t)vc->pos_size ||
        h / (uint64_t)vc->patch > (uint64_t)vc->pos_size ||
        (w / (uint64_t)side) * (h / (uint64_t)side) != im->n_tokens ||
        im->n_tokens > (uint32_t)e->tokens)
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "image at position %u: %u tokens, %u pixel bytes, %u x %u px (the model "
                     "takes sides that are multiples of %d px and one token per %d x %d px, at "
                     "most %d)",
                     im->pos, im->n_tokens, im->pixels.n, im->width, im->height, side, side, side,
                     e->tokens);
    return 0;
  }
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

/* Frees least recently used entries not pinned by this step until `need`
 * more bytes fit the capacity (or nothing unpinned is left). */
static void make_room(struct wk_encoder *e, size_t need) {
  while (e->n > 0 && e->held + need > e->cap_bytes) {
    int victim = -1;
    for (int i = 0; i < e->n; i++)
      if (e->v[i].step != e->step && (victim < 0 || e->v[i].used < e->v[victim].used)) victim = i;
    if (victim < 0) return;
    e->held -= entry_bytes(e, e->v[victim].n_px, e->v[victim].tokens);
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
    if (x->hash == im->hash && x->n_px == im->pixels.n && x->width == im->width &&
        x->height == im->height && memcmp(x->pixels, im->pixels.v, x->n_px) == 0)
      return x;
  }
  return NULL;
}

/* Room for k more pixel planes and embeddings in the staging buffers (Gemma 3). */
static int stage_reserve(struct wk_encoder *e, int k) {
  if (k <= e->cap_stage) return 0;
  int cap = k < 2 * e->cap_stage ? 2 * e->cap_stage : k;
  /* the embeddings are written after every image is staged: nothing to keep */
  size_t per = e->image_bytes + (size_t)e->tokens * (size_t)e->hidden; /* floats */
  float *px = realloc(e->stage_px, sizeof(float) * per * (size_t)cap);
  if (!px) return CM_ERR_NOMEM;
  e->stage_px = px;
  e->stage_rows = px + e->image_bytes * (size_t)cap;
  e->cap_stage = cap;
  return 0;
}

/* Gemma 3: the k entries x[0..k) through the SigLIP tower, batched. */
static int encode_g3(struct wk_encoder *e, struct entry *x, int k, char *err, size_t errlen) {
  if (stage_reserve(e, k))
    return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for the images to encode");
  const struct md_vision_cfg *vc = wk_vision_config(e->vision);
  for (int j = 0; j < k; j++) {
    int rc = md_image_preprocess(e->stage_px + e->image_bytes * (size_t)j, x[j].pixels, e->width,
                                 e->height, e->channels, &vc->pre, err, errlen);
    if (rc) return rc;
  }
  int rc = wk_vision_encode(e->vision, e->stage_px, k, e->stage_rows, err, errlen);
  if (rc) return rc;
  size_t per = (size_t)e->tokens * (size_t)e->hidden;
  for (int j = 0; j < k; j++)
    memcpy(x[j].rows, e->stage_rows + per * (size_t)j, sizeof(float) * per);
  return 0;
}

/* Gemma 4: the k entries x[0..k) cut into their patches, then through the
 * tower in one call (it packs as many per pass as its scratch holds). The
 * staging is sized per call: images of any size meet here. */
static int encode_g4(struct wk_encoder *e, struct entry *x, int k, char *err, size_t errlen) {
  const struct md_vision_g4_cfg *vc = wk_vision_g4_config(e->g4);
  size_t pd = (size_t)vc->patch * (size_t)vc->patch * 3, patches = 0, tokens = 0;
  int pool2 = vc->pool * vc->pool;
  for (int j = 0; j < k; j++) {
    patches += (size_t)x[j].tokens * (size_t)pool2;
    tokens += (size_t)x[j].tokens;
  }
  struct wk_g4_image *ims = calloc((size_t)k, sizeof(*ims));
  float *px = malloc(sizeof(float) * patches * pd);
  int32_t *pos = malloc(sizeof(int32_t) * 2 * patches);
  float *rows = malloc(sizeof(float) * tokens * (size_t)e->hidden);
  int rc = 0;
  if (!ims || !px || !pos || !rows) {
    rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for the images to encode");
    goto out;
  }
  for (int j = 0, p0 = 0; j < k; j++) {
    struct wk_g4_image *im = &ims[j];
    im->pixels = px + (size_t)p0 * pd;
    im->pos = pos + 2 * (size_t)p0;
    rc = md_g4_image_patches((float *)im->pixels, (int32_t *)im->pos, &im->info, x[j].pixels,
                             (int)x[j].width, (int)x[j].height, vc, err, errlen);
    if (rc) goto out;
    p0 += im->info.n_patches;
  }
  if ((rc = wk_vision_g4_encode(e->g4, ims, k, rows, err, errlen))) goto out;
  for (int j = 0, t0 = 0; j < k; j++) {
    size_t n = (size_t)x[j].tokens * (size_t)e->hidden;
    memcpy(x[j].rows, rows + (size_t)t0 * (size_t)e->hidden, sizeof(float) * n);
    t0 += x[j].tokens;
  }
out:
  free(ims);
  free(px);
  free(pos);
  free(rows);
  return rc;
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
    size_t n_px = ims[i]->pixels.n, bytes = entry_bytes(e, n_px, (int)ims[i]->n_tokens);
    make_room(e, bytes); /* evicts only entries this step has not used */
    if (e->n == e->cap_n) {
      int cap = e->cap_n ? 2 * e->cap_n : 8;
      struct entry *v = realloc(e->v, sizeof(*v) * (size_t)cap);
      if (!v) {
        rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for the image cache");
        goto undo;
      }
      e->v = v;
      e->cap_n = cap;
    }
    struct entry nx = {.hash = ims[i]->hash,
                       .n_px = n_px,
                       .tokens = (int)ims[i]->n_tokens,
                       .width = ims[i]->width,
                       .height = ims[i]->height,
                       .used = ++e->clock,
                       .step = e->step};
    nx.rows = malloc(bytes);
    if (!nx.rows) {
      rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for an image's embeddings");
      goto undo;
    }
    nx.pixels = (uint8_t *)(nx.rows + (size_t)nx.tokens * (size_t)e->hidden);
    memcpy(nx.pixels, ims[i]->pixels.v, n_px);
    e->v[e->n++] = nx;
    e->held += bytes;
    k++;
    rows[i] = nx.rows;
  }
  if (k) { /* the new images in one call: the tower batches them */
    struct entry *x = e->v + e->n - k;
    rc = e->g4 ? encode_g4(e, x, k, err, errlen) : encode_g3(e, x, k, err, errlen);
    if (rc) goto undo;
    e->encodes += (uint64_t)k;
  }
  return 0;
undo: /* the entries this call added hold nothing valid */
  while (k-- > 0) {
    struct entry *x = &e->v[--e->n];
    e->held -= entry_bytes(e, x->n_px, x->tokens);
    entry_release(x);
  }
  return rc;
}

int wk_encoder_get(struct wk_encoder *e, const struct pr_image *im, const float **rows, char *err,
                   size_t errlen) {
  return wk_encoder_get_many(e, &im, 1, rows, err, errlen);
}
