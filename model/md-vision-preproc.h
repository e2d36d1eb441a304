/* md-vision-preproc.h — an image's 8-bit pixels to the vision tower's input:
 * resize (bilinear, as Pillow's Image.resize does it), rescale and normalise
 * per the checkpoint's preprocessor config, channels first.
 *
 * What Hugging Face's Gemma3ImageProcessor (the PIL one) does, to the bit:
 *   - resize: Pillow's BILINEAR for 8-bit images — a triangle filter whose
 *     support widens with the downscale factor (it antialiases), coefficients
 *     in 22-bit fixed point, a horizontal pass then a vertical one, each
 *     rounded and clamped to 8 bits;
 *   - rescale: (float)((double)u * rescale_factor), as numpy's float64
 *     product cast to float32;
 *   - normalise: (x - mean[c]) / std[c] in float32.
 * The torchvision ("fast") processor resizes with its own antialiased
 * bilinear kernel, which can differ from Pillow's by one 8-bit level at some
 * pixels, and fuses the rescale into the normalisation (float rounding
 * differences); we follow the PIL path.
 *
 * Image decoding (PNG, JPEG, ...) and the conversion to RGB (alpha dropped,
 * not composited) happen before: the input here is interleaved 8-bit pixels.
 * Pure host code with no dependency beyond libc and the config struct, so
 * that whoever decodes the image (the frontend's thread pool) can call it. */
#ifndef LMSERVE_MD_VISION_PREPROC_H
#define LMSERVE_MD_VISION_PREPROC_H
#include <stddef.h>
#include <stdint.h>

#include "model/md-config.h"

/* Largest side accepted, px (decoders cap what they produce before this). */
#define MD_IMAGE_MAX_SIDE 65536

/* dst[dh, dw, C] = src[sh, sw, C] resized as Pillow's Image.resize(...,
 * BILINEAR) does for 8-bit images (interleaved channels, rows contiguous).
 * 0, CM_ERR_INVAL (a size < 1 or above MD_IMAGE_MAX_SIDE, C outside 1..4,
 * NULL) or CM_ERR_NOMEM. */
int md_image_resize_bilinear(uint8_t *dst, int dw, int dh, const uint8_t *src, int sw, int sh,
                             int C);

/* The same with Pillow's BICUBIC (Keys' cubic, a = -0.5, support 2 input
 * pixels stretched by the downscale factor): what Gemma 4's PIL image
 * processor uses (md-vision-g4.h). Same returns. */
int md_image_resize_bicubic(uint8_t *dst, int dw, int dh, const uint8_t *src, int sw, int sh,
                            int C);

/* out[C, pre->height, pre->width] (f32) = the preprocessed image of
 * img[h, w, C] (8-bit, interleaved), C = the tower's channels. Without
 * do_resize the image must already have the target size. 0 or a negative
 * cm_err with the reason in err. */
int md_image_preprocess(float *out, const uint8_t *img, int w, int h, int C,
                        const struct md_preproc_cfg *pre, char *err, size_t errlen);

#endif
