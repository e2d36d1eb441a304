/* wk-encoder.c — the media encoder cache (see wk-encoder.h): a small array of
 * entries searched linearly (a cache holds tens of images and clips, a step
 * meets a few), each with its data (pixels, or a clip's features and mask),
 * its embeddings, the step that last used it and a use clock for LRU. Entries
 * differ in size with Gemma 4's towers (each image its own patch grid, each
 * clip its own length); the capacity counts each entry's own bytes. */
#include "worker/wk-encoder.h"

#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "model/md-audio-g4.h"
#include "model/md-vision-g4.h"
#include "model/md-vision-preproc.h"

#define DEFAULT_CAP (256u << 20)

struct entry {
  uint64_t hash;
  float *rows;     /* [tokens, hidden], then pixels: one block */
  uint8_t *pixels; /* [n_px] */
  size_t n_px;     /* pixel bytes */
  int tokens;      /* soft tokens */
  uint32_t width, height; /* px (0: the Gemma 3 tower's one size); audio: mels, frames */
  uint32_t kind;          /* enum pr_media */
  uint64_t used;   /* use clock of the last lookup */
  uint64_t step;   /* the step that last used it */
};

struct wk_encoder {
  struct wk_vision *vision;                    /* Gemma 3's tower, or NULL */
  struct wk_vision_g4 *g4;                     /* Gemma 4's tower, or NULL */
  struct wk_audio_g4 *audio;                   /* Gemma 4's audio tower, or NULL */
  int n_mel, audio_frames, audio_tokens;       /* a clip's mel bins; the most frames, tokens */
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

int wk_encoder_create_g4(struct wk_vision_g4 *g4, const struct wk_encoder_audio *audio,
                         size_t cap_bytes, struct wk_encoder **out) {
  *out = NULL;
  if (!g4 && !(audio && audio->tower)) return CM_ERR_INVAL;
  struct wk_encoder *e = calloc(1, sizeof(*e));
  if (!e) return CM_ERR_NOMEM;
  e->cap_bytes = cap_bytes ? cap_bytes : DEFAULT_CAP;
  if (audio && audio->tower) {
    e->audio = audio->tower;
    e->hidden = wk_audio_g4_text_hidden(audio->tower);
    e->n_mel = audio->n_mel;
    e->audio_frames = audio->max_frames;
    e->audio_tokens = audio->max_tokens;
  }
  *out = e;
  if (!g4) return 0;
  const struct md_vision_g4_cfg *vc = wk_vision_g4_config(g4);
  e->g4 = g4;
  e->tokens = MD_G4_MAX_SOFT_TOKENS;
  e->hidden = wk_vision_g4_text_hidden(g4);
  e->channels = 3;
  /* the most pixels an image of the largest budget has: its patches, 3 bytes each */
  e->image_bytes = (size_t)MD_G4_MAX_SOFT_TOKENS * (size_t)(vc->pool * vc->pool) *
                   (size_t)(vc->patch * vc->patch) * 3;
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

/* The audio clip's features [frames][mels] f32 and its mask (proto's layout). */
static const uint8_t *clip_mask(const struct pr_image *im) {
  return im->pixels.v + (size_t)im->height * im->width * sizeof(float);
}

void wk_encoder_stats(const struct wk_encoder *e, uint64_t *encodes, uint64_t *hits) {
  *encodes = e->encodes;
  *hits = e->hits;
}

int wk_encoder_check(const struct wk_encoder *e, const struct pr_image *im, char *err,
                     size_t errlen) {
  if (im->kind == PR_MEDIA_AUDIO) { /* features of the extractor's width, a mask that counts */
    if (!e->audio)
      return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                     "audio at position %u: this model has no audio tower", im->pos);
    const uint8_t *mask = clip_mask(im);
    int bad = im->width != (uint32_t)e->n_mel || !im->height ||
              im->height > (uint32_t)e->audio_frames ||
              (uint64_t)im->height * ((uint64_t)im->width * 4 + 1) != im->pixels.n;
    for (uint32_t i = 0; !bad && i < im->height; i++)
      bad = mask[i] > 1;
    if (bad || im->n_tokens != (uint32_t)md_audio_soft_tokens(mask, im->height))
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "audio at position %u: %u tokens, %u x %u features in %u bytes (the model "
                     "takes %d mel bins, at most %d frames, a 0/1 mask byte a frame, the tokens "
                     "its mask gives)",
                     im->pos, im->n_tokens, im->height, im->width, im->pixels.n, e->n_mel,
                     e->audio_frames);
    return 0;
  }
  if (!e->vision && !e->g4)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "image at position %u: this model has no vision tower", im->pos);
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
    if (x->hash == im->hash && x->kind == im->kind && x->n_px == im->pixels.n &&
        x->width == im->width && x->height == im->height &&
        memcmp(x->pixels, im->pixels.v, x->n_px) == 0)
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

/* Gemma 3: the k entries *x[0..k) through the SigLIP tower, batched. */
static int encode_g3(struct wk_encoder *e, struct entry *const *x, int k, char *err,
                     size_t errlen) {
  if (stage_reserve(e, k))
    return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for the images to encode");
  const struct md_vision_cfg *vc = wk_vision_config(e->vision);
  for (int j = 0; j < k; j++) {
    int rc = md_image_preprocess(e->stage_px + e->image_bytes * (size_t)j, x[j]->pixels, e->width,
                                 e->height, e->channels, &vc->pre, err, errlen);
    if (rc) return rc;
  }
  int rc = wk_vision_encode(e->vision, e->stage_px, k, e->stage_rows, err, errlen);
  if (rc) return rc;
  size_t per = (size_t)e->tokens * (size_t)e->hidden;
  for (int j = 0; j < k; j++)
    memcpy(x[j]->rows, e->stage_rows + per * (size_t)j, sizeof(float) * per);
  return 0;
}

/* The rows of k entries, one after the other in rows, into each entry. */
static void spread_rows(const struct wk_encoder *e, struct entry *const *x, int k,
                        const float *rows) {
  for (int j = 0, t0 = 0; j < k; j++) {
    size_t n = (size_t)x[j]->tokens * (size_t)e->hidden;
    memcpy(x[j]->rows, rows + (size_t)t0 * (size_t)e->hidden, sizeof(float) * n);
    t0 += x[j]->tokens;
  }
}

/* Gemma 4's audio: the k clips *x[0..k) through the audio tower in one call
 * (it packs as many per pass as its scratch holds). */
static int encode_audio(struct wk_encoder *e, struct entry *const *x, int k, char *err,
                        size_t errlen) {
  if (k <= 0) return 0;
  size_t tokens = 0;
  for (int j = 0; j < k; j++)
    tokens += (size_t)x[j]->tokens;
  struct wk_g4_audio *clips = calloc((size_t)k, sizeof(*clips));
  float *rows = malloc(sizeof(float) * tokens * (size_t)e->hidden);
  int rc = 0;
  if (!clips || !rows) {
    rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for the audio clips to encode");
    goto out;
  }
  for (int j = 0; j < k; j++) /* the entry's copy: features (float-aligned after the rows),
                                 then the mask */
    clips[j] = (struct wk_g4_audio){(const float *)x[j]->pixels,
                                    x[j]->pixels + (size_t)x[j]->height * x[j]->width * 4,
                                    (int)x[j]->height, x[j]->tokens};
  if ((rc = wk_audio_g4_encode(e->audio, clips, k, rows, err, errlen))) goto out;
  spread_rows(e, x, k, rows);
out:
  free(clips);
  free(rows);
  return rc;
}

/* Gemma 4: the k entries *x[0..k) cut into their patches, then through the
 * tower in one call (it packs as many per pass as its scratch holds). The
 * staging is sized per call: images of any size meet here. */
static int encode_g4(struct wk_encoder *e, struct entry *const *x, int k, char *err,
                     size_t errlen) {
  const struct md_vision_g4_cfg *vc = wk_vision_g4_config(e->g4);
  size_t pd = (size_t)vc->patch * (size_t)vc->patch * 3, patches = 0, tokens = 0;
  int pool2 = vc->pool * vc->pool;
  for (int j = 0; j < k; j++) {
    patches += (size_t)x[j]->tokens * (size_t)pool2;
    tokens += (size_t)x[j]->tokens;
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
    rc = md_g4_image_patches((float *)im->pixels, (int32_t *)im->pos, &im->info, x[j]->pixels,
                             (int)x[j]->width, (int)x[j]->height, vc, err, errlen);
    if (rc) goto out;
    p0 += im->info.n_patches;
  }
  if ((rc = wk_vision_g4_encode(e->g4, ims, k, rows, err, errlen))) goto out;
  spread_rows(e, x, k, rows);
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
        rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for the encoder cache");
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
                       .kind = ims[i]->kind,
                       .used = ++e->clock,
                       .step = e->step};
    nx.rows = malloc(bytes);
    if (!nx.rows) {
      rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for an item's embeddings");
      goto undo;
    }
    nx.pixels = (uint8_t *)(nx.rows + (size_t)nx.tokens * (size_t)e->hidden);
    memcpy(nx.pixels, ims[i]->pixels.v, n_px);
    e->v[e->n++] = nx;
    e->held += bytes;
    k++;
    rows[i] = nx.rows;
  }
  if (k) { /* the new images in one call, the new clips in another: the towers batch them */
    struct entry **by = malloc(sizeof(*by) * (size_t)k);
    int n_img = 0, n_clip = 0;
    for (int pass = 0; by && pass < 2; pass++) /* the images, then the clips, in order */
      for (int j = 0; j < k; j++)
        if ((e->v[e->n - k + j].kind == PR_MEDIA_AUDIO) == pass)
          by[pass ? n_img + n_clip++ : n_img++] = &e->v[e->n - k + j];
    if (!by)
      rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for the items to encode");
    else if (n_img)
      rc = e->g4 ? encode_g4(e, by, n_img, err, errlen) : encode_g3(e, by, n_img, err, errlen);
    if (!rc && n_clip) rc = encode_audio(e, by + n_img, n_clip, err, errlen);
    free(by);
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
