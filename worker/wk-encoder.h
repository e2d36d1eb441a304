/* wk-encoder.h — the worker's encoder cache: a STEP's images and audio clips
 * (proto's struct pr_image: 8-bit resized pixels and a content hash, Gemma 4's
 * also their width and height; or a clip's log-mel features and frame mask)
 * to the soft-token embeddings that replace their placeholder rows.
 *
 *   struct wk_encoder *e;
 *   wk_encoder_create(vision, 0, &e);
 *   per step: wk_encoder_begin_step(e);
 *             for each image: wk_encoder_check(e, im, ...); wk_encoder_get(e, im, &rows, ...);
 *             ... the forward pass reads rows ...
 *   wk_encoder_free(e);
 *
 * An image is encoded (Gemma 3: rescaled and normalised per the preprocessor
 * config, then the SigLIP tower and projector; Gemma 4: cut into its 16 x 16
 * patches by md_g4_image_patches, then wk_vision_g4_encode, every new image
 * of the step in one call whatever its size; an audio clip: Gemma 4's audio
 * tower, wk_audio_g4_encode, every new clip of the step in one call) the
 * first time a step carries it, and
 * kept while the cache has room, so that a prompt whose prefill is chunked,
 * preempted and recomputed, or a later prompt with the same image, does not
 * encode it again. Entries are found by hash and confirmed by comparing the
 * pixels, so a hash collision costs an encode, never a wrong image. Entries
 * a step uses stay until the next step begins, whatever the capacity; past
 * the capacity (each entry counts its own pixels and embeddings: Gemma 4's
 * images differ in size), the least recently used others go. */
#ifndef LMSERVE_WK_ENCODER_H
#define LMSERVE_WK_ENCODER_H
#include <stddef.h>
#include <stdint.h>

#include "proto/pr-msg.h"
#include "worker/wk-audio-g4.h"
#include "worker/wk-vision-g4.h"
#include "worker/wk-vision.h"

struct wk_encoder;

/* vision must outlive the cache. cap_bytes: what cached entries may hold
 * (pixels and embeddings); 0 = 256 MiB. 0, CM_ERR_NOMEM or CM_ERR_SHAPE (a
 * preprocessor size other than the tower's). */
int wk_encoder_create(struct wk_vision *vision, size_t cap_bytes, struct wk_encoder **out);
/* Gemma 4's audio tower and what its clips may be (model/md-audio-g4.h's
 * extractor of the checkpoint). */
struct wk_encoder_audio {
  struct wk_audio_g4 *tower;
  int n_mel;      /* mel bins of a frame (feature_size) */
  int max_frames; /* frames of the longest clip (md_audio_fe_max_frames) */
  int max_tokens; /* its soft tokens (md_audio_fe_max_tokens) */
};

/* The same over Gemma 4's towers (each must outlive the cache; either may be
 * NULL, not both: CM_ERR_INVAL): images of any size the frontend's
 * md_g4_image_resize gives, each with its width and height; audio clips of up
 * to audio->max_frames frames. */
int wk_encoder_create_g4(struct wk_vision_g4 *g4, const struct wk_encoder_audio *audio,
                         size_t cap_bytes, struct wk_encoder **out);
void wk_encoder_free(struct wk_encoder *e); /* NULL is a no-op */

/* Soft tokens and pixel bytes per image (Gemma 4: the most an image may have;
 * 0 without a vision tower). */
int wk_encoder_image_tokens(const struct wk_encoder *e);
size_t wk_encoder_image_bytes(const struct wk_encoder *e);
/* 1 when images vary in size and carry it (Gemma 4), 0 when they all have one. */
int wk_encoder_varsize(const struct wk_encoder *e);

/* Whether an image or clip record is one this model takes (token count, pixel
 * bytes; a clip's mel bins, frames and the tokens its mask gives): 0,
 * CM_ERR_UNSUPPORTED (no tower for its kind) or CM_ERR_INVAL with the reason
 * in err. */
int wk_encoder_check(const struct wk_encoder *e, const struct pr_image *im, char *err,
                     size_t errlen);

/* Unpins the previous step's entries. */
void wk_encoder_begin_step(struct wk_encoder *e);

/* *rows = the image's embeddings [image tokens, text hidden] (host), valid
 * until the next wk_encoder_begin_step. 0 or a negative cm_err with the reason
 * in err. */
int wk_encoder_get(struct wk_encoder *e, const struct pr_image *im, const float **rows, char *err,
                   size_t errlen);

/* The same for n images at once: the new ones go through the tower in one
 * call (batched), an image twice in the list is encoded once. rows[i] for
 * ims[i]. */
int wk_encoder_get_many(struct wk_encoder *e, const struct pr_image *const *ims, int n,
                        const float **rows, char *err, size_t errlen);

/* Encodes so far (misses), and lookups that found their entry (tests, logs). */
void wk_encoder_stats(const struct wk_encoder *e, uint64_t *encodes, uint64_t *hits);

#endif
