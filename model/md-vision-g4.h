/* md-vision-g4.h — an image's 8-bit RGB pixels to Gemma 4's vision tower
 * input: a sequence of flattened 16 x 16 patches with their (x, y) grid
 * positions, padded to the soft-token budget.
 *
 * What Hugging Face's Gemma4ImageProcessorPil (image_processing_pil_gemma4.py)
 * does, step by step:
 *   - budget: max_soft_tokens in {70, 140, 280, 560, 1120} (anything else is
 *     refused); max_patches = max_soft_tokens x pool^2;
 *   - size (get_aspect_ratio_preserving_size): factor = sqrt(max_patches x
 *     patch^2 / (h x w)) in double, each side floor(factor x side / (pool x
 *     patch)) x (pool x patch); a side that floors to 0 becomes pool x patch
 *     and the other floor(long / short) x pool x patch, capped at
 *     (max_patches / pool^2) x pool x patch; both 0 is refused. Small images
 *     are upscaled. The same size as the input: no resize;
 *   - resize: PIL's BICUBIC on the 8-bit image (md_image_resize_bicubic:
 *     fixed-point, each pass rounded and clamped to 8 bits);
 *   - rescale: (float)((double)u x (1 / 255.0)), numpy's float64 product — no
 *     normalisation (do_normalize false: the tower does 2 (x - 0.5) itself);
 *   - patches (convert_image_to_patches): row-major over the patch grid, each
 *     patch flattened as [dy][dx][channel] (patch x patch x 3 floats);
 *   - positions: patch k at (x = k % grid_w, y = k / grid_w); rows from
 *     n_patches to max_patches are padding: zero pixels at (-1, -1);
 *   - soft tokens after pool x pool average pooling: n_patches / pool^2.
 * The torchvision processor (Gemma4ImageProcessor, the "fast" one) resizes
 * the uint8 tensor with torch's antialiased bicubic (the same a = -0.5
 * kernel) and multiplies by 1/255 in float32 (within 1 ulp of ours). A
 * resize in float with no rounding or clamping between its passes (our
 * reading of torch's CUDA kernel, not checked against torch here):
 * tests/reference/gemma4_image_ref.py models it in float64 and the unit
 * test prints the distance: at most 1 8-bit level on smooth images and
 * strong downscales, up to 26 levels on noise and sharp-edged upscales
 * (Pillow clamps the cubic's overshoot to 0..255 after the horizontal
 * pass); about 5% of the values differ over the test's images. torch's x86
 * uint8 kernel (ported from Pillow-SIMD) rounds and clamps between passes
 * as Pillow does, with its own fixed-point precision; that path is not
 * measured here (the tests need neither torch nor Pillow). We follow the
 * PIL path exactly, as md-vision-preproc.h does for Gemma 3.
 *
 * Decoding and the conversion to RGB happen before (as for Gemma 3). Pure
 * host code: libc and the config struct. */
#ifndef LMSERVE_MD_VISION_G4_H
#define LMSERVE_MD_VISION_G4_H
#include <stddef.h>
#include <stdint.h>

#include "model/md-config.h"

/* The largest budget, soft tokens (md_g4_soft_tokens_allowed lists them). */
#define MD_G4_MAX_SOFT_TOKENS 1120

/* The shape of one preprocessed image. */
struct md_g4_image {
  int width, height;  /* resized image, px: multiples of pool x patch */
  int grid_w, grid_h; /* patches per row / column */
  int n_patches;      /* grid_w x grid_h: the real patches */
  int max_patches;    /* max_soft_tokens x pool^2: rows of the padded sequence */
  int soft_tokens;    /* n_patches / pool^2: tokens after pooling */
  int patch_dim;      /* patch x patch x 3: floats per patch */
};

/* The resize target of a w x h image for a budget of max_soft_tokens (the
 * rule above), in *tw x *th. 0, or CM_ERR_INVAL with a sentence (a budget
 * outside the allowed set, a bad size, a 0 x 0 target). */
int md_g4_image_size(int w, int h, int patch, int pool, int max_soft_tokens, int *tw, int *th,
                     char *err, size_t errlen);

/* The shape of a w x h image under vc for max_soft_tokens (0: the config's
 * default_output_length), so that the caller can size its buffers. Also
 * refuses a grid wider than the position table. 0 or a negative cm_err. */
int md_g4_image_plan(struct md_g4_image *out, int w, int h, const struct md_vision_g4_cfg *vc,
                     int max_soft_tokens, char *err, size_t errlen);

/* pixels[info->max_patches, info->patch_dim] (f32) and
 * pos[info->max_patches, 2] (x, y; -1 on padding rows) from img[h, w, 3]
 * (8-bit RGB, interleaved, rows contiguous); info receives the plan. The
 * caller owns the buffers, sized from md_g4_image_plan (or for
 * MD_G4_MAX_SOFT_TOKENS). 0 or a negative cm_err with the reason in err. */
int md_g4_image_preprocess(float *pixels, int32_t *pos, struct md_g4_image *info,
                           const uint8_t *img, int w, int h, const struct md_vision_g4_cfg *vc,
                           int max_soft_tokens, char *err, size_t errlen);

/* The frontend's half: *out (malloc'd, [info->height, info->width, 3]
 * 8-bit) = img resized per the plan for max_soft_tokens (0: the config's
 * default), a copy when the size is already the plan's. What travels to the
 * workers (a quarter of the float patches). 0 or a negative cm_err. */
int md_g4_image_resize(uint8_t **out, struct md_g4_image *info, const uint8_t *img, int w, int h,
                       const struct md_vision_g4_cfg *vc, int max_soft_tokens, char *err,
                       size_t errlen);

/* The worker's half: the real patches (no padding rows) of an image that
 * md_g4_image_resize gave, img[h, w, 3]: pixels[n_patches, patch_dim] and
 * pos[n_patches, 2], info with max_patches = n_patches. The budget is not
 * needed: the padding changes nothing in the tower (wk-vision-g4.h). A
 * size that no plan gives (sides not multiples of pool x patch, a grid
 * wider than the position table, more than MD_G4_MAX_SOFT_TOKENS soft
 * tokens) is CM_ERR_INVAL. md_g4_image_preprocess is the two halves plus
 * the padding, bit for bit. */
int md_g4_image_patches(float *pixels, int32_t *pos, struct md_g4_image *info, const uint8_t *img,
                        int w, int h, const struct md_vision_g4_cfg *vc, char *err, size_t errlen);

#endif
