/* md-vision-g4.c — Gemma 4's image preprocessing: the budgeted,
 * aspect-preserving size, Pillow's bicubic resize (md-vision-preproc.c),
 * the 1/255 rescale and the padded patch sequence with (x, y) positions
 * (md-vision-g4.h says which of transformers' steps each reproduces). */
#include "model/md-vision-g4.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "model/md-vision-preproc.h"

int md_g4_image_size(int w, int h, int patch, int pool, int max_soft_tokens, int *tw, int *th,
                     char *err, size_t errlen) {
  if (!md_g4_soft_tokens_allowed(max_soft_tokens))
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "max_soft_tokens %d is not one of 70, 140, 280, 560, 1120", max_soft_tokens);
  if (w < 1 || h < 1 || w > MD_IMAGE_MAX_SIDE || h > MD_IMAGE_MAX_SIDE || patch < 1 || pool < 1 ||
      patch > 1024 || pool > 64)
    return cm_fail(err, errlen, CM_ERR_INVAL, "image size: a %d x %d image, patch %d, pool %d", w,
                   h, patch, pool);
  long long max_patches = (long long)max_soft_tokens * pool * pool;
  long long target_px = max_patches * patch * patch;
  long long side = (long long)pool * patch;
  /* in double as Python computes it: the int quotient is correctly rounded,
   * as is sqrt, and every operand below 2^53 is exact */
  double factor = sqrt((double)target_px / ((double)h * (double)w));
  long long H = (long long)floor(factor * h / side) * side;
  long long W = (long long)floor(factor * w / side) * side;
  if (H == 0 && W == 0)
    return cm_fail(err, errlen, CM_ERR_INVAL, "image size: a %d x %d image resizes to 0 x 0", w, h);
  long long max_side = (max_patches / ((long long)pool * pool)) * side;
  if (H == 0) {
    H = side;
    W = (long long)floor((double)w / h) * side;
    if (W > max_side) W = max_side;
  } else if (W == 0) {
    W = side;
    H = (long long)floor((double)h / w) * side;
    if (H > max_side) H = max_side;
  }
  if (H * W > target_px || W > MD_IMAGE_MAX_SIDE || H > MD_IMAGE_MAX_SIDE)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "image size: a %d x %d image resizes to %lld x %lld, over %lld patches", w, h, W,
                   H, max_patches);
  *tw = (int)W;
  *th = (int)H;
  return 0;
}

/* The shape of a resized W x H image under vc (sides multiples of the patch),
 * its padded sequence max_patches rows long (0: its real patches, no padding). */
static void image_shape(struct md_g4_image *out, int W, int H, int max_patches,
                        const struct md_vision_g4_cfg *vc) {
  memset(out, 0, sizeof(*out));
  out->width = W;
  out->height = H;
  out->grid_w = W / vc->patch;
  out->grid_h = H / vc->patch;
  out->n_patches = out->grid_w * out->grid_h;
  out->max_patches = max_patches ? max_patches : out->n_patches;
  out->soft_tokens = out->n_patches / (vc->pool * vc->pool);
  out->patch_dim = vc->patch * vc->patch * 3;
}

int md_g4_image_plan(struct md_g4_image *out, int w, int h, const struct md_vision_g4_cfg *vc,
                     int max_soft_tokens, char *err, size_t errlen) {
  if (!out || !vc || !vc->present)
    return cm_fail(err, errlen, CM_ERR_INVAL, "image preprocessing: no Gemma 4 vision tower");
  int budget = max_soft_tokens ? max_soft_tokens : vc->default_tokens;
  int W, H, rc = md_g4_image_size(w, h, vc->patch, vc->pool, budget, &W, &H, err, errlen);
  if (rc) return rc;
  image_shape(out, W, H, budget * vc->pool * vc->pool, vc);
  /* the tower looks positions up in tables of pos_size rows */
  if (out->grid_w > vc->pos_size || out->grid_h > vc->pos_size)
    return cm_fail(err, errlen, CM_ERR_RANGE,
                   "image preprocessing: a %d x %d patch grid, the position table has %d rows",
                   out->grid_w, out->grid_h, vc->pos_size);
  return 0;
}

/* The real patches of a resized image px[info->height, info->width, 3]:
 * numpy's float64 product by 1/255, then float32 (transformers' rescale),
 * each patch flattened [dy][dx][channel], patch k at (k % grid_w, k / grid_w). */
static void patchify(float *pixels, int32_t *pos, const struct md_g4_image *info, const uint8_t *px,
                     int P) {
  const double scale = 1.0 / 255.0;
  size_t dim = (size_t)info->patch_dim;
  int W = info->width;
  for (int k = 0; k < info->n_patches; k++) {
    int gx = k % info->grid_w, gy = k / info->grid_w;
    float *dst = pixels + (size_t)k * dim;
    for (int dy = 0; dy < P; dy++) {
      const uint8_t *row = px + ((size_t)(gy * P + dy) * W + (size_t)gx * P) * 3;
      for (int i = 0; i < P * 3; i++)
        dst[(size_t)dy * P * 3 + i] = (float)((double)row[i] * scale);
    }
    pos[2 * k] = gx;
    pos[2 * k + 1] = gy;
  }
}

int md_g4_image_resize(uint8_t **out, struct md_g4_image *info, const uint8_t *img, int w, int h,
                       const struct md_vision_g4_cfg *vc, int max_soft_tokens, char *err,
                       size_t errlen) {
  *out = NULL;
  if (!info || !img)
    return cm_fail(err, errlen, CM_ERR_INVAL, "image preprocessing: bad arguments");
  int rc = md_g4_image_plan(info, w, h, vc, max_soft_tokens, err, errlen);
  if (rc) return rc;
  size_t n = (size_t)info->width * (size_t)info->height * 3;
  uint8_t *px = malloc(n);
  if (!px) return cm_fail(err, errlen, CM_ERR_NOMEM, "image preprocessing: out of memory");
  if (info->width == w && info->height == h) { /* the same size: no resize */
    memcpy(px, img, n);
  } else if ((rc = md_image_resize_bicubic(px, info->width, info->height, img, w, h, 3))) {
    free(px);
    return cm_fail(err, errlen, rc, "image preprocessing: resize failed: %s", cm_strerror(rc));
  }
  *out = px;
  return 0;
}

int md_g4_image_patches(float *pixels, int32_t *pos, struct md_g4_image *info, const uint8_t *img,
                        int w, int h, const struct md_vision_g4_cfg *vc, char *err, size_t errlen) {
  if (!pixels || !pos || !info || !img || !vc || !vc->present)
    return cm_fail(err, errlen, CM_ERR_INVAL, "image patches: bad arguments");
  int side = vc->patch * vc->pool;
  if (w < side || h < side || w % side || h % side || w / vc->patch > vc->pos_size ||
      h / vc->patch > vc->pos_size || (long long)(w / side) * (h / side) > MD_G4_MAX_SOFT_TOKENS)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "image patches: a %d x %d image is not a resized one (sides multiples of %d, "
                   "at most %d soft tokens)",
                   w, h, side, MD_G4_MAX_SOFT_TOKENS);
  image_shape(info, w, h, 0, vc);
  patchify(pixels, pos, info, img, vc->patch);
  return 0;
}

int md_g4_image_preprocess(float *pixels, int32_t *pos, struct md_g4_image *info,
                           const uint8_t *img, int w, int h, const struct md_vision_g4_cfg *vc,
                           int max_soft_tokens, char *err, size_t errlen) {
  if (!pixels || !pos || !info || !img)
    return cm_fail(err, errlen, CM_ERR_INVAL, "image preprocessing: bad arguments");
  uint8_t *resized = NULL;
  int rc = md_g4_image_resize(&resized, info, img, w, h, vc, max_soft_tokens, err, errlen);
  if (rc) return rc;
  patchify(pixels, pos, info, resized, vc->patch);
  size_t dim = (size_t)info->patch_dim;
  size_t pad = (size_t)(info->max_patches - info->n_patches);
  memset(pixels + (size_t)info->n_patches * dim, 0, pad * dim * sizeof(float));
  for (int k = info->n_patches; k < info->max_patches; k++)
    pos[2 * k] = pos[2 * k + 1] = -1;
  free(resized);
  return 0;
}
