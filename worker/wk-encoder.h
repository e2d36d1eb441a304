/* wk-encoder.h — the worker's image encoder cache: a STEP's images (proto's
 * struct pr_image: 8-bit resized pixels and a content hash) to the soft-token
 * embeddings that replace their placeholder rows.
 *
 *   struct wk_encoder *e;
 *   wk_encoder_create(vision, 0, &e);
 *   per step: wk_encoder_begin_step(e);
 *             for each image: wk_encoder_check(e, im, ...); wk_encoder_get(e, im, &rows, ...);
 *             ... the forward pass reads rows ...
 *   wk_encoder_free(e);
 *
 * An image is encoded (rescaled and normalised per the preprocessor config,
 * then the SigLIP tower and projector) the first time a step carries it, and
 * kept while the cache has room, so that a prompt whose prefill is chunked,
 * preempted and recomputed, or a later prompt with the same image, does not
 * encode it again. Entries are found by hash and confirmed by comparing the
 * pixels, so a hash collision costs an encode, never a wrong image. Entries
 * a step uses stay until the next step begins, whatever the capacity; past
 * the capacity, the least recently used others go. */
#ifndef LMSERVE_WK_ENCODER_H
#define LMSERVE_WK_ENCODER_H
#include <stddef.h>
#include <stdint.h>

#include "proto/pr-msg.h"
#include "worker/wk-vision.h"

struct wk_encoder;

/* vision must outlive the cache. cap_bytes: what cached entries may hold
 * (pixels and embeddings); 0 = 256 MiB. 0, CM_ERR_NOMEM or CM_ERR_SHAPE (a
 * preprocessor size other than the tower's). */
int wk_encoder_create(struct wk_vision *vision, size_t cap_bytes, struct wk_encoder **out);
void wk_encoder_free(struct wk_encoder *e); /* NULL is a no-op */

int wk_encoder_image_tokens(const struct wk_encoder *e); /* soft tokens per image */
size_t wk_encoder_image_bytes(const struct wk_encoder *e); /* pixel bytes per image */

/* Whether an image record is one this model takes (token count, pixel bytes):
 * 0 or CM_ERR_INVAL with the reason in err. */
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
