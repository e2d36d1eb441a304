/* wk-vision.h — Gemma 3's image encoder on a kernel backend: the SigLIP
 * vision tower and the multimodal projector of a Gemma3ForConditionalGeneration
 * checkpoint, turning preprocessed images into soft-token embeddings in the
 * text model's hidden size.
 *
 *   struct wk_vision *v;
 *   wk_vision_load(dir, be, NULL, &v, err, sizeof err);
 *   const struct md_vision_cfg *vc = wk_vision_config(v);
 *   // pixels: [n, channels, image_size, image_size] f32 (md-vision-preproc.h)
 *   float *emb = malloc(n * vc->mm_tokens * wk_vision_text_hidden(v) * 4);
 *   wk_vision_encode(v, pixels, n, emb, err, sizeof err);
 *   wk_vision_free(v);
 *
 * The math (transformers' SiglipVisionModel and Gemma3MultiModalProjector):
 *   x = conv_patch(pixels) + position_embedding   (stride = kernel = patch)
 *   per layer: x += out_proj(attn(layer_norm1(x)));  x += fc2(gelu_tanh(fc1(layer_norm2(x))))
 *              (LayerNorms with bias, every projection with bias, attention
 *              bidirectional over the image's patches, scale head_dim^-0.5)
 *   x = post_layernorm(x)
 *   t = avg_pool(grid of patches, kernel grid / sqrt(mm_tokens))
 *   emb = rmsnorm_(1+w)(t) @ mm_input_projection_weight
 * The embeddings are the rows that replace the image tokens' embeddings as
 * they are (not multiplied by the text embedding scale).
 *
 * The model is loaded from the same directory as the text model (its own
 * handle on the safetensors files; the mappings are shared by the OS), so the
 * text runtime needs no change to carry it. Weight names in both layouts
 * transformers has saved: model.vision_tower.vision_model.* and
 * model.multi_modal_projector.*, or vision_tower.vision_model.* and
 * multi_modal_projector.*. */
#ifndef LMSERVE_WK_VISION_H
#define LMSERVE_WK_VISION_H
#include <stddef.h>

#include "kernels/kn-backend.h"
#include "model/md-config.h"

struct wk_vision;

struct wk_vision_opts {
  int max_images; /* images per encoder pass (scratch is sized for it); 0 = 2 */
};

/* Loads the vision tower of the checkpoint in DIR onto be (which must outlive
 * it). CM_ERR_UNSUPPORTED when the checkpoint has none; otherwise 0 or a
 * negative cm_err with a one-line reason naming the file and tensor. */
int wk_vision_load(const char *dir, struct kn_backend *be, const struct wk_vision_opts *opts,
                   struct wk_vision **out, char *err, size_t errlen);
void wk_vision_free(struct wk_vision *v); /* NULL is a no-op */

/* The tower's shapes, token ids and preprocessing (md-config.h). */
const struct md_vision_cfg *wk_vision_config(const struct wk_vision *v);
/* Width of each output embedding: the text model's hidden size. */
int wk_vision_text_hidden(const struct wk_vision *v);

/* Encodes n_images images: pixels [n_images, channels, image_size,
 * image_size] f32 (host, preprocessed), out [n_images * mm_tokens,
 * text_hidden] f32 (host), image i's soft tokens in rows i * mm_tokens ..,
 * row-major over the pooled grid. Images run max_images at a time; on the
 * CPU backend an image's rows are the same bits whichever images share its
 * pass. Returns 0 or a negative cm_err with the reason in err. */
int wk_vision_encode(struct wk_vision *v, const float *pixels, int n_images, float *out, char *err,
                     size_t errlen);

#endif
