/* md-vision-preproc.c — Pillow-exact bilinear and bicubic resizes of 8-bit
 * images (one separable fixed-point resampler, the filter a parameter), then
 * rescale and normalise to the vision tower's channels-first f32 input
 * (md-vision-preproc.h says which of the Hugging Face processor's steps each
 * reproduces). */
#include "model/md-vision-preproc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"

/* Fixed-point bits of the 8-bit resampling coefficients (Pillow's
 * PRECISION_BITS: 32 - 8 - 2). */
#define COEF_BITS 22

/* One axis of a resize: output pixel o reads inputs [lo[o], lo[o] + n[o])
 * with weights kk[o * ksize + j]. */
struct axis {
  int ksize;
  int *lo, *n;
  int32_t *kk;
};

static void axis_free(struct axis *a) {
  free(a->lo);
  free(a->n);
  free(a->kk);
}

/* Pillow's resampling filters (Resample.c), each with its support in input
 * pixels at scale 1. */
struct filter {
  double (*f)(double x);
  double support;
};

static double triangle(double x) {
  x = fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

/* Keys' cubic convolution kernel with a = -0.5, the polynomials written in
 * the order Pillow evaluates them (the coefficients are rounded to fixed
 * point afterwards, so the last bit of the double matters). */
static double cubic(double x) {
  const double a = -0.5;
  x = fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

static const struct filter BILINEAR = {triangle, 1.0};
static const struct filter BICUBIC = {cubic, 2.0};

/* The coefficients of a resize from in to out pixels along one axis: the
 * filter stretched by the scale when shrinking (support = filter support x
 * scale), centred on each output pixel's centre, normalised to sum 1, then
 * rounded half away from zero to COEF_BITS fixed point. */
static int axis_init(struct axis *a, int in, int out, const struct filter *flt) {
  double scale = (double)in / out, fscale = scale < 1.0 ? 1.0 : scale;
  double support = flt->support * fscale, ss = 1.0 / fscale;
  a->ksize = (int)ceil(support) * 2 + 1;
  a->lo = malloc(sizeof(int) * (size_t)out);
  a->n = malloc(sizeof(int) * (size_t)out);
  a->kk = malloc(sizeof(int32_t) * (size_t)out * (size_t)a->ksize);
  double *k = malloc(sizeof(double) * (size_t)a->ksize);
  if (!a->lo || !a->n || !a->kk || !k) {
    free(k);
    axis_free(a);
    return CM_ERR_NOMEM;
  }
  for (int o = 0; o < out; o++) {
    double center = (o + 0.5) * scale, ww = 0.0;
    /* (int) truncates toward zero, as in Pillow */
    int xmin = (int)(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = (int)(center + support + 0.5);
    if (xmax > in) xmax = in;
    xmax -= xmin;
    for (int x = 0; x < xmax; x++) {
      k[x] = flt->f((x + xmin - center + 0.5) * ss);
      ww += k[x];
    }
    int32_t *kk = a->kk + (size_t)o * a->ksize;
    for (int x = 0; x < a->ksize; x++) {
      double w = x < xmax ? (ww != 0.0 ? k[x] / ww : k[x]) : 0.0;
      kk[x] = (int32_t)(w < 0 ? -0.5 + w * (1 << COEF_BITS) : 0.5 + w * (1 << COEF_BITS));
    }
    a->lo[o] = xmin;
    a->n[o] = xmax;
  }
  free(k);
  return 0;
}

/* Rounded (the accumulator starts at one half) and clamped: a cubic's
 * negative lobes can take acc below 0 or above 255 << COEF_BITS. */
static uint8_t clip8(int64_t acc) {
  if (acc <= 0) return 0;
  int64_t v = acc >> COEF_BITS;
  return (uint8_t)(v > 255 ? 255 : v);
}

/* dst[rows, dw, C] from src[rows, sw, C] (row strides in bytes). */
static void pass_h(uint8_t *dst, const uint8_t *src, int rows, int sw, int dw, int C,
                   const struct axis *a) {
  for (int y = 0; y < rows; y++) {
    const uint8_t *s = src + (size_t)y * sw * C;
    uint8_t *d = dst + (size_t)y * dw * C;
    for (int o = 0; o < dw; o++) {
      const int32_t *kk = a->kk + (size_t)o * a->ksize;
      for (int c = 0; c < C; c++) {
        int64_t acc = 1 << (COEF_BITS - 1);
        for (int j = 0; j < a->n[o]; j++)
          acc += (int64_t)s[(size_t)(a->lo[o] + j) * C + c] * kk[j];
        d[(size_t)o * C + c] = clip8(acc);
      }
    }
  }
}

/* dst[dh, w, C] from src rows (src row r is input row r + row0). */
static void pass_v(uint8_t *dst, const uint8_t *src, int row0, int w, int dh, int C,
                   const struct axis *a) {
  size_t stride = (size_t)w * C;
  for (int o = 0; o < dh; o++) {
    const int32_t *kk = a->kk + (size_t)o * a->ksize;
    uint8_t *d = dst + (size_t)o * stride;
    for (size_t x = 0; x < stride; x++) {
      int64_t acc = 1 << (COEF_BITS - 1);
      for (int j = 0; j < a->n[o]; j++)
        acc += (int64_t)src[(size_t)(a->lo[o] + j - row0) * stride + x] * kk[j];
      d[x] = clip8(acc);
    }
  }
}

static int resize(uint8_t *dst, int dw, int dh, const uint8_t *src, int sw, int sh, int C,
                  const struct filter *flt) {
  if (!dst || !src || C < 1 || C > 4 || dw < 1 || dh < 1 || sw < 1 || sh < 1 ||
      dw > MD_IMAGE_MAX_SIDE || dh > MD_IMAGE_MAX_SIDE || sw > MD_IMAGE_MAX_SIDE ||
      sh > MD_IMAGE_MAX_SIDE)
    return CM_ERR_INVAL;
  int need_h = dw != sw, need_v = dh != sh;
  if (!need_h && !need_v) {
    memcpy(dst, src, (size_t)sw * sh * C);
    return 0;
  }
  struct axis ah = {0}, av = {0};
  int rc = 0;
  if (need_h && (rc = axis_init(&ah, sw, dw, flt))) return rc;
  if (need_v && (rc = axis_init(&av, sh, dh, flt))) {
    axis_free(&ah);
    return rc;
  }
  if (!need_v) {
    pass_h(dst, src, sh, sw, dw, C, &ah);
  } else if (!need_h) {
    pass_v(dst, src, 0, sw, dh, C, &av);
  } else {
    /* horizontal over the input rows the vertical pass reads, then vertical */
    int first = av.lo[0], last = av.lo[dh - 1] + av.n[dh - 1];
    uint8_t *tmp = malloc((size_t)(last - first) * dw * C);
    if (!tmp) {
      rc = CM_ERR_NOMEM;
    } else {
      pass_h(tmp, src + (size_t)first * sw * C, last - first, sw, dw, C, &ah);
      pass_v(dst, tmp, first, dw, dh, C, &av);
      free(tmp);
    }
  }
  axis_free(&ah);
  axis_free(&av);
  return rc;
}

int md_image_resize_bilinear(uint8_t *dst, int dw, int dh, const uint8_t *src, int sw, int sh,
                             int C) {
  return resize(dst, dw, dh, src, sw, sh, C, &BILINEAR);
}

int md_image_resize_bicubic(uint8_t *dst, int dw, int dh, const uint8_t *src, int sw, int sh,
                            int C) {
  return resize(dst, dw, dh, src, sw, sh, C, &BICUBIC);
}

int md_image_preprocess(float *out, const uint8_t *img, int w, int h, int C,
                        const struct md_preproc_cfg *pre, char *err, size_t errlen) {
  if (!out || !img || !pre || C < 1 || C > MD_MAX_CHANNELS)
    return cm_fail(err, errlen, CM_ERR_INVAL, "image preprocessing: bad arguments");
  if (w < 1 || h < 1 || w > MD_IMAGE_MAX_SIDE || h > MD_IMAGE_MAX_SIDE)
    return cm_fail(err, errlen, CM_ERR_INVAL, "image preprocessing: a %d x %d image", w, h);
  int W = pre->width, H = pre->height;
  const uint8_t *px = img;
  uint8_t *resized = NULL;
  if (w != W || h != H) {
    if (!pre->do_resize)
      return cm_fail(err, errlen, CM_ERR_SHAPE,
                     "image preprocessing: a %d x %d image, the model takes %d x %d and the "
                     "processor does not resize",
                     w, h, W, H);
    resized = malloc((size_t)W * H * C);
    if (!resized) return cm_fail(err, errlen, CM_ERR_NOMEM, "image preprocessing: out of memory");
    int rc = md_image_resize_bilinear(resized, W, H, img, w, h, C);
    if (rc) {
      free(resized);
      return cm_fail(err, errlen, rc, "image preprocessing: resize failed: %s", cm_strerror(rc));
    }
    px = resized;
  }
  size_t plane = (size_t)W * H;
  for (int c = 0; c < C; c++) {
    float mean = pre->mean[c], std = pre->std[c];
    for (size_t i = 0; i < plane; i++) {
      uint8_t u = px[i * C + c];
      float x = pre->do_rescale ? (float)((double)u * pre->rescale_factor) : (float)u;
      if (pre->do_normalize) x = (x - mean) / std;
      out[(size_t)c * plane + i] = x;
    }
  }
  free(resized);
  return 0;
}
