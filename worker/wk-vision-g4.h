/* wk-vision-g4.h — Gemma 4's image encoder on a kernel backend: the vision
 * tower (Gemma4VisionModel), its pooling and the embedder into the text
 * width (Gemma4MultimodalEmbedder) of a Gemma4ForConditionalGeneration
 * checkpoint, turning preprocessed images (md-vision-g4.h) of any size into
 * soft-token embeddings.
 *
 *   struct wk_vision_g4 *v;
 *   wk_vision_g4_load(dir, be, NULL, &v, err, sizeof err);
 *   struct wk_g4_image im = {pixels, pos, info};   // md_g4_image_preprocess
 *   float *emb = malloc(info.soft_tokens * wk_vision_g4_text_hidden(v) * 4);
 *   wk_vision_g4_encode(v, &im, 1, emb, err, sizeof err);
 *   wk_vision_g4_free(v);
 *
 * The math (transformers' modeling_gemma4.py; RMSNorm is x (mean(x^2) +
 * eps)^-1/2 w, "clin" a Gemma4ClippableLinear: clamp, linear without bias,
 * clamp, when vision_config.use_clipped_linears):
 *   x = input_proj(2 (pixels - 0.5)) + T[0][px] + T[1][py]   (a plain Linear)
 *   per layer: h = rmsnorm(x, input_layernorm)
 *     q = rope2d(rmsnorm_head(clin(h, q_proj), q_norm)), k likewise,
 *     v = rmsnorm_head(clin(h, v_proj)) (no weight);
 *     a = softmax(q k^T) v (scale 1, every patch of the image sees every
 *     other, grouped KV heads); x += rmsnorm(clin(a, o_proj),
 *     post_attention_layernorm)
 *     x += rmsnorm(clin(gelu_tanh(clin(h', gate)) * clin(h', up), down),
 *     post_feedforward_layernorm) with h' = rmsnorm(x, pre_feedforward_layernorm)
 *   t = sqrt(hidden) x avg_pool(k x k windows of the patch grid)
 *   t = (t - std_bias) * std_scale                     (vision_config.standardize)
 *   emb = embedding_projection(rmsnorm(t))             (no weight)
 * rope2d rotates the first half of each head by the patch's x, the second
 * by its y, each as rotate-half RoPE with inv_freq[i] = theta^(-4i / head_dim).
 *
 * Padding patches: transformers runs them through the tower with their keys
 * masked and zeroes them before pooling, so they change nothing; here only
 * an image's real patches (the first n_patches rows) are run. Images of
 * different sizes share a pass (their rows concatenated, attention per
 * image). The embeddings replace the image tokens' embeddings as they are
 * (not multiplied by the text embedding scale).
 *
 * Weight names (both layouts transformers has saved): model.vision_tower.* and
 * model.embed_vision.*, or vision_tower.* and embed_vision.*. */
#ifndef LMSERVE_WK_VISION_G4_H
#define LMSERVE_WK_VISION_G4_H
#include <stddef.h>
#include <stdint.h>

#include "kernels/kn-backend.h"
#include "model/md-config.h"
#include "model/md-vision-g4.h"

struct wk_vision_g4;

struct wk_vision_g4_opts {
  int max_patches; /* real patches per encoder pass (scratch is sized for it);
                      0 = one image of the largest budget (1120 x pool^2) */
};

/* One preprocessed image, host memory (md_g4_image_preprocess's output). */
struct wk_g4_image {
  const float *pixels; /* [info.n_patches or more, info.patch_dim] */
  const int32_t *pos;  /* [same rows, 2]: (x, y), patch k at (k % grid_w, k / grid_w) */
  struct md_g4_image info;
};

/* Loads the Gemma 4 vision tower of the checkpoint in DIR onto be (which must
 * outlive it). CM_ERR_UNSUPPORTED when the checkpoint has none; otherwise 0
 * or a negative cm_err with a one-line reason naming the tensor. */
int wk_vision_g4_load(const char *dir, struct kn_backend *be, const struct wk_vision_g4_opts *opts,
                      struct wk_vision_g4 **out, char *err, size_t errlen);
void wk_vision_g4_free(struct wk_vision_g4 *v); /* NULL is a no-op */

const struct md_vision_g4_cfg *wk_vision_g4_config(const struct wk_vision_g4 *v);
/* Width of each output embedding: the text model's hidden size. */
int wk_vision_g4_text_hidden(const struct wk_vision_g4 *v);

/* Encodes n images into out [sum of ims[i].info.soft_tokens, text_hidden]
 * (host), image after image, each image's tokens row-major over its pooled
 * grid. Images run as many at a time as max_patches allows; on the CPU
 * backend an image's rows are the same bits whichever images share its pass.
 * An image whose shape or positions are not those md_g4_image_plan gives is
 * refused (CM_ERR_INVAL). 0 or a negative cm_err with the reason in err. */
int wk_vision_g4_encode(struct wk_vision_g4 *v, const struct wk_g4_image *ims, int n, float *out,
                        char *err, size_t errlen);

#endif
