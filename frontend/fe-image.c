/* fe-image.c — image URLs of the chat API to RGB pixels (see fe-image.h):
 * the data:/file:// loaders, then one decoder per format over the
 * reference libraries, each with its error handlers turned into cm_err codes
 * and a one-line reason. No decoder writes to stderr or aborts. */
#include "frontend/fe-image.h"
#include "frontend/fe-b64.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdio.h> /* before jpeglib.h, which uses FILE */
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gif_lib.h>
#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>
#include <webp/demux.h>

#include <jerror.h> /* after jpeglib.h: its message list depends on jconfig.h */

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-hex.h"

#define FE_JPEG_MAX_SCANS 1000 /* a progressive JPEG with more scans is refused (CPU bomb) */

struct img_limits {
  size_t max_bytes;    /* bytes */
  uint64_t max_pixels; /* pixels */
  const char *local_dir;
};

static struct img_limits limits_of(const struct fe_image_limits *l) {
  struct img_limits r = {FE_IMAGE_DEFAULT_MAX_BYTES, FE_IMAGE_DEFAULT_MAX_PIXELS, NULL};
  if (l) {
    if (l->max_bytes) r.max_bytes = l->max_bytes;
    if (l->max_pixels) r.max_pixels = l->max_pixels;
    r.local_dir = l->local_dir;
  }
  return r;
}

void fe_image_free(struct fe_image *img) {
  if (!img) return;
  free(img->rgb);
  memset(img, 0, sizeof(*img));
}

/* ---- sizes: every decoder calls this on the header's dimensions ------------ */

/* Refuses a w x h image before any pixel buffer exists. */
static int check_size(const char *fmt, uint64_t w, uint64_t h, uint64_t max_pixels, char *err,
                      size_t errlen) {
  unsigned long long uw = w, uh = h;
  if (w == 0 || h == 0)
    return cm_fail(err, errlen, CM_ERR_INVAL, "zero-size image (the %s header says %llux%llu)", fmt,
                   uw, uh);
  if (w * h > max_pixels)
    return cm_fail(err, errlen, CM_ERR_TOOBIG,
                   "%s image is %llux%llu = %llu pixels, over the limit of %llu pixels", fmt, uw,
                   uh, uw * uh, (unsigned long long)max_pixels);
  if (w > FE_IMAGE_MAX_SIDE || h > FE_IMAGE_MAX_SIDE)
    return cm_fail(err, errlen, CM_ERR_TOOBIG,
                   "%s image is %llux%llu: a side over %d pixels is refused", fmt, uw, uh,
                   FE_IMAGE_MAX_SIDE);
  return 0;
}

static int alloc_rgb(struct fe_image *out, uint64_t w, uint64_t h, char *err, size_t errlen) {
  out->rgb = malloc((size_t)(w * h * 3));
  if (!out->rgb)
    return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for a %llux%llu image",
                   (unsigned long long)w, (unsigned long long)h);
  out->w = (int)w;
  out->h = (int)h;
  return 0;
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* ---- PNG (libpng) ------------------------------------------------------------
 * libpng reports errors by longjmp. Everything that must survive the jump
 * lives in a png_job owned by the caller of the function that calls setjmp,
 * so no local of that function is read after the jump. */

struct png_job {
  const uint8_t *data; /* the encoded bytes */
  size_t n, pos;       /* bytes; read position */
  png_structp png;
  png_infop info;
  png_bytep *rows; /* h pointers into the image's rgb */
  int code;        /* cm_err behind the latest longjmp */
  char msg[160];
};

static void png_on_error(png_structp png, png_const_charp msg) {
  struct png_job *j = png_get_error_ptr(png);
  if (!j->code) {
    j->code = CM_ERR_PARSE;
    snprintf(j->msg, sizeof(j->msg), "invalid PNG image: %s", msg);
  }
  png_longjmp(png, 1);
}

/* Warnings (an unknown ancillary chunk, a bad ICC profile, extra image data)
 * lose no pixels; they are dropped instead of printed. */
static void png_on_warning(png_structp png, png_const_charp msg) {
  (void)png;
  (void)msg;
}

static void png_read_mem(png_structp png, png_bytep dst, size_t n) {
  struct png_job *j = png_get_io_ptr(png);
  if (n > j->n - j->pos) {
    j->code = CM_ERR_TRUNC;
    snprintf(j->msg, sizeof(j->msg), "truncated PNG image (the data ends early)");
    png_error(png, "truncated");
  }
  memcpy(dst, j->data + j->pos, n);
  j->pos += n;
}

static int png_run(struct png_job *j, const struct img_limits *lim, struct fe_image *out, char *err,
                   size_t errlen) {
  if (setjmp(png_jmpbuf(j->png))) return cm_fail(err, errlen, j->code, "%s", j->msg);
  png_set_read_fn(j->png, j, png_read_mem);
  /* our check_size replaces libpng's default limit of 1e6 per side */
  png_set_user_limits(j->png, 0x7fffffff, 0x7fffffff);
  png_read_info(j->png, j->info);
  png_uint_32 w, h;
  int depth, ctype, interlace;
  png_get_IHDR(j->png, j->info, &w, &h, &depth, &ctype, &interlace, NULL, NULL);
  int rc = check_size("PNG", w, h, lim->max_pixels, err, errlen);
  if (rc) return rc;
  if (depth == 16) png_set_strip_16(j->png); /* the high byte, as Pillow's ;16B unpackers */
  if (ctype == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(j->png);
  if ((ctype & PNG_COLOR_MASK_COLOR) == 0) {
    if (depth < 8) png_set_expand_gray_1_2_4_to_8(j->png);
    png_set_gray_to_rgb(j->png);
  }
  /* alpha is dropped, not composited; a palette's tRNS would become alpha */
  if ((ctype & PNG_COLOR_MASK_ALPHA) || ctype == PNG_COLOR_TYPE_PALETTE)
    png_set_strip_alpha(j->png);
  png_set_interlace_handling(j->png);
  png_read_update_info(j->png, j->info);
  if (png_get_bit_depth(j->png, j->info) != 8 || png_get_channels(j->png, j->info) != 3 ||
      png_get_rowbytes(j->png, j->info) != (size_t)w * 3)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED, "PNG layout not supported (%d-bit type %d)",
                   depth, ctype);
  if ((rc = alloc_rgb(out, w, h, err, errlen))) return rc;
  j->rows = malloc(sizeof(*j->rows) * h);
  if (!j->rows) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  for (png_uint_32 y = 0; y < h; y++)
    j->rows[y] = out->rgb + (size_t)y * w * 3;
  png_read_image(j->png, j->rows);
  /* what follows the image data (text chunks, IEND) is not read */
  return 0;
}

static int png_decode(const uint8_t *data, size_t n, const struct img_limits *lim,
                      struct fe_image *out, char *err, size_t errlen) {
  /* the first chunk must be IHDR: refuse its size before libpng allocates */
  if (n >= 24 && memcmp(data + 12, "IHDR", 4) == 0) {
    int rc = check_size("PNG", be32(data + 16), be32(data + 20), lim->max_pixels, err, errlen);
    if (rc) return rc;
  }
  struct png_job j = {.data = data, .n = n};
  j.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &j, png_on_error, png_on_warning);
  if (!j.png) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  j.info = png_create_info_struct(j.png);
  int rc = j.info ? png_run(&j, lim, out, err, errlen)
                  : cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  png_destroy_read_struct(&j.png, &j.info, NULL);
  free(j.rows);
  if (rc) fe_image_free(out);
  return rc;
}

/* ---- JPEG (libjpeg-turbo) ----------------------------------------------------
 * Fatal errors and the warnings that mean lost pixels longjmp back here;
 * libjpeg would otherwise print the warning and fill the missing part gray. */

struct jpeg_job {
  struct jpeg_error_mgr pub; /* first: libjpeg hands back &pub as cinfo->err */
  jmp_buf jb;
  struct jpeg_decompress_struct cinfo;
  struct jpeg_progress_mgr progress;
  uint8_t *cmyk; /* (w, 4) bytes: one CMYK row */
  int code;
  char msg[JMSG_LENGTH_MAX + 32];
};

static _Noreturn void jpeg_bail(j_common_ptr c, int code) {
  struct jpeg_job *j = (struct jpeg_job *)c->err;
  if (!j->code) {
    char text[JMSG_LENGTH_MAX];
    (*c->err->format_message)(c, text);
    j->code = code;
    switch (code) {
    case CM_ERR_INVAL:
      snprintf(j->msg, sizeof(j->msg), "zero-size image (the JPEG header says 0 pixels)");
      break;
    case CM_ERR_TRUNC: snprintf(j->msg, sizeof(j->msg), "truncated JPEG image (%s)", text); break;
    case CM_ERR_TOOBIG: snprintf(j->msg, sizeof(j->msg), "JPEG image too large (%s)", text); break;
    case CM_ERR_NOMEM: snprintf(j->msg, sizeof(j->msg), "out of memory decoding a JPEG"); break;
    default: snprintf(j->msg, sizeof(j->msg), "invalid JPEG image: %s", text);
    }
  }
  longjmp(j->jb, 1);
}

static void jpeg_on_error(j_common_ptr c) {
  int code = CM_ERR_PARSE;
  switch (c->err->msg_code) {
  case JERR_EMPTY_IMAGE: code = CM_ERR_INVAL; break;
  case JERR_OUT_OF_MEMORY: code = CM_ERR_NOMEM; break;
  case JERR_NO_BACKING_STORE: code = CM_ERR_TOOBIG; break; /* over max_memory_to_use */
  case JERR_IMAGE_TOO_BIG: code = CM_ERR_TOOBIG; break;    /* a side over 65500 */
  case JERR_INPUT_EOF: code = CM_ERR_TRUNC; break;
  default: break;
  }
  jpeg_bail(c, code);
}

/* level -1 is a warning, >= 0 trace output: neither is ever printed. The
 * warnings about corrupt or missing entropy data are errors here. Kept as
 * warnings: an unknown JFIF revision or Adobe transform, a bad ICC marker
 * (ignored anyway), and junk bytes before a marker, which camera files often
 * carry and which cost no pixels. */
static void jpeg_on_message(j_common_ptr c, int level) {
  if (level >= 0) return;
  switch (c->err->msg_code) {
  case JWRN_JPEG_EOF: jpeg_bail(c, CM_ERR_TRUNC);
  case JWRN_HIT_MARKER:
  case JWRN_HUFF_BAD_CODE:
  case JWRN_ARITH_BAD_CODE:
  case JWRN_MUST_RESYNC:
  case JWRN_NOT_SEQUENTIAL:
  case JWRN_BOGUS_PROGRESSION: jpeg_bail(c, CM_ERR_PARSE);
  default: c->err->num_warnings++;
  }
}

static void jpeg_on_output(j_common_ptr c) {
  (void)c;
}

static void jpeg_on_progress(j_common_ptr c) {
  struct jpeg_job *j = (struct jpeg_job *)c->err;
  if (j->cinfo.input_scan_number > FE_JPEG_MAX_SCANS) {
    j->code = CM_ERR_TOOBIG;
    snprintf(j->msg, sizeof(j->msg), "JPEG image has over %d scans", FE_JPEG_MAX_SCANS);
    longjmp(j->jb, 1);
  }
}

/* One row of Adobe CMYK to RGB the way Pillow does it: invert every sample
 * ("CMYK;I"), then cmyk2rgb: nk = 255 - K, R = nk - nk*C/255 (rounded). */
static void cmyk_row_to_rgb(const uint8_t *in, uint8_t *out, size_t w) {
  for (size_t x = 0; x < w; x++, in += 4, out += 3) {
    int nk = in[3]; /* 255 - (255 - k) */
    for (int c = 0; c < 3; c++) {
      int t = (255 - in[c]) * nk + 128; /* (255 - c) * nk / 255, rounded */
      out[c] = (uint8_t)(nk - (((t >> 8) + t) >> 8));
    }
  }
}

static int jpeg_run(struct jpeg_job *j, const uint8_t *data, size_t n, const struct img_limits *lim,
                    struct fe_image *out, char *err, size_t errlen) {
  struct jpeg_decompress_struct *ci = &j->cinfo;
  if (setjmp(j->jb)) return cm_fail(err, errlen, j->code, "%s", j->msg);
  jpeg_create_decompress(ci);
  /* whole-image coefficient buffers (progressive) beyond this fail instead of growing:
   * 2 bytes per coefficient, up to 4 components, MCU padding */
  uint64_t cap = lim->max_pixels * 10 + ((uint64_t)64 << 20); /* bytes */
  ci->mem->max_memory_to_use = lim->max_pixels > LONG_MAX / 16 ? LONG_MAX : (long)cap;
  j->progress.progress_monitor = jpeg_on_progress;
  ci->progress = &j->progress;
  jpeg_mem_src(ci, data, (unsigned long)n);
  if (jpeg_read_header(ci, TRUE) != JPEG_HEADER_OK)
    return cm_fail(err, errlen, CM_ERR_PARSE, "invalid JPEG image: tables but no image");
  int rc = check_size("JPEG", ci->image_width, ci->image_height, lim->max_pixels, err, errlen);
  if (rc) return rc;
  switch (ci->jpeg_color_space) {
  case JCS_GRAYSCALE: /* libjpeg-turbo replicates gray into RGB */
  case JCS_YCbCr:
  case JCS_RGB: ci->out_color_space = JCS_RGB; break;
  case JCS_CMYK:
  case JCS_YCCK: ci->out_color_space = JCS_CMYK; break;
  default:
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED, "JPEG with %d color components not supported",
                   ci->num_components);
  }
  jpeg_start_decompress(ci);
  size_t w = ci->output_width, h = ci->output_height;
  int comps = ci->out_color_space == JCS_CMYK ? 4 : 3;
  if (w != ci->image_width || h != ci->image_height || ci->output_components != comps)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED, "JPEG layout not supported");
  if ((rc = alloc_rgb(out, w, h, err, errlen))) return rc;
  if (comps == 4 && !(j->cmyk = malloc(w * 4)))
    return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  while (ci->output_scanline < h) {
    size_t y = ci->output_scanline;
    JSAMPROW row = comps == 4 ? j->cmyk : out->rgb + y * w * 3;
    if (jpeg_read_scanlines(ci, &row, 1) != 1)
      return cm_fail(err, errlen, CM_ERR_TRUNC, "truncated JPEG image");
    if (comps == 4) cmyk_row_to_rgb(j->cmyk, out->rgb + y * w * 3, w);
  }
  /* what follows the last scanline (EOI, trailing bytes) is not read */
  return 0;
}

static int jpeg_decode(const uint8_t *data, size_t n, const struct img_limits *lim,
                       struct fe_image *out, char *err, size_t errlen) {
  struct jpeg_job *j = calloc(1, sizeof(*j)); /* ~1 KiB, kept off the thread pool's stacks */
  if (!j) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  j->cinfo.err = jpeg_std_error(&j->pub);
  j->pub.error_exit = jpeg_on_error;
  j->pub.emit_message = jpeg_on_message;
  j->pub.output_message = jpeg_on_output;
  int rc = jpeg_run(j, data, n, lim, out, err, errlen);
  jpeg_destroy_decompress(&j->cinfo);
  free(j->cmyk);
  free(j);
  if (rc) fe_image_free(out);
  return rc;
}

/* ---- WebP (libwebp) ------------------------------------------------------------ */

static int webp_fail(VP8StatusCode st, char *err, size_t errlen) {
  switch (st) {
  case VP8_STATUS_OUT_OF_MEMORY: return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  case VP8_STATUS_NOT_ENOUGH_DATA:
    return cm_fail(err, errlen, CM_ERR_TRUNC, "truncated WebP image (the data ends early)");
  case VP8_STATUS_UNSUPPORTED_FEATURE:
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED, "WebP feature not supported");
  default: return cm_fail(err, errlen, CM_ERR_PARSE, "invalid WebP image (error %d)", (int)st);
  }
}

/* An animated WebP: the first frame, composited by the demuxer onto the canvas
 * (transparent black where the frame does not reach; alpha then dropped). */
static int webp_first_frame(const uint8_t *data, size_t n, const struct img_limits *lim,
                            struct fe_image *out, char *err, size_t errlen) {
  WebPAnimDecoderOptions opt;
  if (!WebPAnimDecoderOptionsInit(&opt))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED, "libwebpdemux version mismatch");
  opt.color_mode = MODE_RGBA;
  opt.use_threads = 0;
  WebPData wd = {data, n};
  WebPAnimDecoder *dec = WebPAnimDecoderNew(&wd, &opt);
  if (!dec) return cm_fail(err, errlen, CM_ERR_PARSE, "invalid animated WebP image");
  WebPAnimInfo info;
  uint8_t *frame;
  int ts, rc;
  if (!WebPAnimDecoderGetInfo(dec, &info)) {
    rc = cm_fail(err, errlen, CM_ERR_PARSE, "invalid animated WebP image");
  } else if (!(rc = check_size("WebP", info.canvas_width, info.canvas_height, lim->max_pixels, err,
                               errlen))) {
    if (!WebPAnimDecoderGetNext(dec, &frame, &ts)) {
      rc = cm_fail(err, errlen, CM_ERR_PARSE, "invalid animated WebP image: first frame");
    } else if (!(rc = alloc_rgb(out, info.canvas_width, info.canvas_height, err, errlen))) {
      size_t px = (size_t)info.canvas_width * info.canvas_height;
      for (size_t i = 0; i < px; i++)
        memcpy(out->rgb + i * 3, frame + i * 4, 3);
    }
  }
  WebPAnimDecoderDelete(dec);
  return rc;
}

static int webp_decode(const uint8_t *data, size_t n, const struct img_limits *lim,
                       struct fe_image *out, char *err, size_t errlen) {
  WebPBitstreamFeatures f;
  VP8StatusCode st = WebPGetFeatures(data, n, &f);
  if (st != VP8_STATUS_OK) return webp_fail(st, err, errlen);
  int rc = check_size("WebP", (uint64_t)f.width, (uint64_t)f.height, lim->max_pixels, err, errlen);
  if (rc) return rc;
  if (f.has_animation) {
    rc = webp_first_frame(data, n, lim, out, err, errlen);
    if (rc) fe_image_free(out);
    return rc;
  }
  WebPDecoderConfig cfg;
  if (!WebPInitDecoderConfig(&cfg))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED, "libwebp version mismatch");
  if ((rc = alloc_rgb(out, (uint64_t)f.width, (uint64_t)f.height, err, errlen))) return rc;
  /* MODE_RGB leaves the alpha plane out: dropped, not composited */
  cfg.output.colorspace = MODE_RGB;
  cfg.output.is_external_memory = 1;
  cfg.output.u.RGBA.rgba = out->rgb;
  cfg.output.u.RGBA.stride = f.width * 3;
  cfg.output.u.RGBA.size = (size_t)f.width * f.height * 3;
  st = WebPDecode(data, n, &cfg);
  WebPFreeDecBuffer(&cfg.output);
  if (st != VP8_STATUS_OK) {
    fe_image_free(out);
    return webp_fail(st, err, errlen);
  }
  return 0;
}

/* ---- GIF (giflib): the first frame only ------------------------------------------ */

struct gif_src {
  const uint8_t *data;
  size_t n, pos; /* bytes */
};

static int gif_read(GifFileType *g, GifByteType *dst, int len) {
  struct gif_src *s = g->UserData;
  size_t k = len > 0 ? (size_t)len : 0;
  if (k > s->n - s->pos) k = s->n - s->pos;
  memcpy(dst, s->data + s->pos, k);
  s->pos += k;
  return (int)k; /* short: giflib reports D_GIF_ERR_READ_FAILED */
}

static int gif_fail(int gerr, char *err, size_t errlen) {
  const char *why = GifErrorString(gerr);
  switch (gerr) {
  case D_GIF_ERR_READ_FAILED:
    return cm_fail(err, errlen, CM_ERR_TRUNC, "truncated GIF image (the data ends early)");
  case D_GIF_ERR_NOT_ENOUGH_MEM: return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  default:
    return cm_fail(err, errlen, CM_ERR_PARSE, "invalid GIF image: %s", why ? why : "unknown error");
  }
}

/* Paints the frame whose descriptor was just read onto the canvas. */
static int gif_paint(GifFileType *g, int transparent, const struct img_limits *lim,
                     struct fe_image *out, char *err, size_t errlen) {
  const GifImageDesc *d = &g->Image;
  if (d->Width <= 0 || d->Height <= 0)
    return cm_fail(err, errlen, CM_ERR_INVAL, "zero-size image (the GIF frame is %dx%d)", d->Width,
                   d->Height);
  /* a frame that sticks out of the logical screen grows the canvas, as Pillow does */
  uint64_t cw = CM_MAX((uint64_t)g->SWidth, (uint64_t)d->Left + (uint64_t)d->Width);
  uint64_t ch = CM_MAX((uint64_t)g->SHeight, (uint64_t)d->Top + (uint64_t)d->Height);
  int rc = check_size("GIF", cw, ch, lim->max_pixels, err, errlen);
  if (rc) return rc;
  const ColorMapObject *cm = d->ColorMap ? d->ColorMap : g->SColorMap;
  uint8_t bg[3] = {0, 0, 0};
  if (g->SColorMap && g->SBackGroundColor >= 0 && g->SBackGroundColor < g->SColorMap->ColorCount) {
    const GifColorType *c = &g->SColorMap->Colors[g->SBackGroundColor];
    bg[0] = c->Red, bg[1] = c->Green, bg[2] = c->Blue;
  }
  if ((rc = alloc_rgb(out, cw, ch, err, errlen))) return rc;
  for (size_t i = 0; i < cw * ch; i++)
    memcpy(out->rgb + i * 3, bg, 3);
  GifPixelType *line = malloc((size_t)d->Width);
  if (!line) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  /* interlaced frames store rows in four passes */
  static const int start[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
  int passes = d->Interlace ? 4 : 1;
  for (int p = 0; p < passes && !rc; p++) {
    for (int y = d->Interlace ? start[p] : 0; y < d->Height; y += d->Interlace ? step[p] : 1) {
      if (DGifGetLine(g, line, d->Width) == GIF_ERROR) {
        rc = gif_fail(g->Error, err, errlen);
        break;
      }
      uint8_t *dst = out->rgb + (((size_t)d->Top + y) * cw + d->Left) * 3;
      for (int x = 0; x < d->Width; x++, dst += 3) {
        int idx = line[x];
        if (idx == transparent) continue;
        if (!cm) { /* no color map at all: the index is a gray level (Pillow's "L") */
          dst[0] = dst[1] = dst[2] = (uint8_t)idx;
        } else if (idx < cm->ColorCount) {
          dst[0] = cm->Colors[idx].Red, dst[1] = cm->Colors[idx].Green;
          dst[2] = cm->Colors[idx].Blue;
        } else {
          dst[0] = dst[1] = dst[2] = 0;
        }
      }
    }
  }
  free(line);
  return rc;
}

/* Reads records up to the first image: a graphics control extension before it
 * names its transparent index. */
static int gif_first_frame(GifFileType *g, const struct img_limits *lim, struct fe_image *out,
                           char *err, size_t errlen) {
  int transparent = NO_TRANSPARENT_COLOR;
  for (;;) {
    GifRecordType t;
    if (DGifGetRecordType(g, &t) == GIF_ERROR) return gif_fail(g->Error, err, errlen);
    if (t == IMAGE_DESC_RECORD_TYPE) {
      if (DGifGetImageDesc(g) == GIF_ERROR) return gif_fail(g->Error, err, errlen);
      return gif_paint(g, transparent, lim, out, err, errlen);
    }
    if (t == EXTENSION_RECORD_TYPE) {
      int code;
      GifByteType *ext;
      if (DGifGetExtension(g, &code, &ext) == GIF_ERROR) return gif_fail(g->Error, err, errlen);
      GraphicsControlBlock gcb;
      if (code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] == 4 &&
          DGifExtensionToGCB(4, ext + 1, &gcb) == GIF_OK)
        transparent = gcb.TransparentColor;
      while (ext)
        if (DGifGetExtensionNext(g, &ext) == GIF_ERROR) return gif_fail(g->Error, err, errlen);
      continue;
    }
    if (t == TERMINATE_RECORD_TYPE)
      return cm_fail(err, errlen, CM_ERR_PARSE, "invalid GIF image: no image in it");
    return gif_fail(D_GIF_ERR_WRONG_RECORD, err, errlen);
  }
}

static int gif_decode(const uint8_t *data, size_t n, const struct img_limits *lim,
                      struct fe_image *out, char *err, size_t errlen) {
  struct gif_src src = {data, n, 0};
  int gerr = 0;
  GifFileType *g = DGifOpen(&src, gif_read, &gerr);
  if (!g) return gif_fail(gerr, err, errlen);
  int rc = gif_first_frame(g, lim, out, err, errlen);
  DGifCloseFile(g, &gerr);
  if (rc) fe_image_free(out);
  return rc;
}

/* ---- bytes: sniff the type ------------------------------------------------------- */

static int decode_bytes(const uint8_t *d, size_t n, const struct img_limits *lim,
                        struct fe_image *out, char *err, size_t errlen) {
  if (n == 0) return cm_fail(err, errlen, CM_ERR_INVAL, "empty image");
  if (n > lim->max_bytes)
    return cm_fail(err, errlen, CM_ERR_TOOBIG, "image is %zu bytes, over the limit of %zu bytes", n,
                   lim->max_bytes);
  if (n >= 8 && memcmp(d, "\x89PNG\r\n\x1a\n", 8) == 0)
    return png_decode(d, n, lim, out, err, errlen);
  if (n >= 3 && d[0] == 0xff && d[1] == 0xd8 && d[2] == 0xff)
    return jpeg_decode(d, n, lim, out, err, errlen);
  if (n >= 12 && memcmp(d, "RIFF", 4) == 0 && memcmp(d + 8, "WEBP", 4) == 0)
    return webp_decode(d, n, lim, out, err, errlen);
  if (n >= 6 && (memcmp(d, "GIF87a", 6) == 0 || memcmp(d, "GIF89a", 6) == 0))
    return gif_decode(d, n, lim, out, err, errlen);
  return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                 "unsupported image type (PNG, JPEG, WebP and GIF are)");
}

int fe_image_decode(const uint8_t *data, size_t n, const struct fe_image_limits *lim,
                    struct fe_image *out, char *err, size_t errlen) {
  memset(out, 0, sizeof(*out));
  struct img_limits l = limits_of(lim);
  return decode_bytes(data, n, &l, out, err, errlen);
}

/* ---- data: URLs ---------------------------------------------------------------------- */

/* s[0..n) follows "data:". */
static int load_data_url(const char *s, size_t n, const struct img_limits *lim,
                         struct fe_image *out, char *err, size_t errlen) {
  const char *comma = memchr(s, ',', n);
  if (!comma) return cm_fail(err, errlen, CM_ERR_INVAL, "data: URL has no ',' before its payload");
  size_t hlen = (size_t)(comma - s);
  if (hlen < 7 || strncasecmp(comma - 7, ";base64", 7) != 0)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "data: URL is not base64 (';base64' missing before the ','): send "
                   "data:image/png;base64,...");
  uint8_t *buf;
  size_t k;
  int rc = fe_b64_decode((const unsigned char *)comma + 1, n - hlen - 1, lim->max_bytes, "image",
                         &buf, &k, err, errlen);
  if (rc) return rc;
  rc = decode_bytes(buf, k, lim, out, err, errlen);
  free(buf);
  return rc;
}

/* ---- file:// URLs ------------------------------------------------------------------------ */

/* The path of a file:// URL (s[0..n) follows "file://"), percent-decoded into
 * a malloc'd string. */
static int file_url_path(const char *s, size_t n, char **path, char *err, size_t errlen) {
  if (n >= 9 && strncasecmp(s, "localhost", 9) == 0) s += 9, n -= 9;
  if (n == 0 || s[0] != '/')
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "file:// URL must name an absolute path on this host (file:///path)");
  for (size_t i = 0; i < n; i++) /* a query or fragment ends the path */
    if (s[i] == '?' || s[i] == '#') n = i;
  char *p = malloc(n + 1);
  if (!p) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (c == '%') {
      int hi = i + 2 < n ? cm_hex_digit(s[i + 1]) : -1, lo = hi >= 0 ? cm_hex_digit(s[i + 2]) : -1;
      if (lo < 0) {
        free(p);
        return cm_fail(err, errlen, CM_ERR_INVAL, "file:// URL has a bad %%-escape at offset %zu",
                       i);
      }
      c = (char)(hi << 4 | lo);
      i += 2;
    }
    if (c == 0) {
      free(p);
      return cm_fail(err, errlen, CM_ERR_INVAL, "file:// URL has a NUL byte in its path");
    }
    p[k++] = c;
  }
  p[k] = 0;
  *path = p;
  return 0;
}

/* Reads a regular file of at most max_bytes into a malloc'd buffer. */
static int read_regular_file(const char *path, size_t max_bytes, uint8_t **data, size_t *n,
                             char *err, size_t errlen) {
  /* O_NONBLOCK: a FIFO must not hang the thread; it is refused below */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  char why[128];
  if (fd < 0) {
    int e = errno;
    return cm_fail(err, errlen, e == ENOENT ? CM_ERR_NOENT : CM_ERR_IO,
                   "cannot open the file:// image (%s)", strerror_r(e, why, sizeof(why)));
  }
  struct stat st;
  int rc = 0;
  uint8_t *buf = NULL;
  if (fstat(fd, &st) != 0) {
    rc = cm_fail(err, errlen, CM_ERR_IO, "cannot stat the file:// image (%s)",
                 strerror_r(errno, why, sizeof(why)));
  } else if (!S_ISREG(st.st_mode)) {
    rc = cm_fail(err, errlen, CM_ERR_INVAL, "file:// path is not a regular file");
  } else if ((uint64_t)st.st_size > max_bytes) {
    rc = cm_fail(err, errlen, CM_ERR_TOOBIG, "image is %lld bytes, over the limit of %zu bytes",
                 (long long)st.st_size, max_bytes);
  } else if (st.st_size == 0) {
    rc = cm_fail(err, errlen, CM_ERR_INVAL, "empty image");
  } else if (!(buf = malloc((size_t)st.st_size))) {
    rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  } else {
    size_t want = (size_t)st.st_size, got = 0;
    while (got < want) {
      ssize_t r = read(fd, buf + got, want - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        rc = cm_fail(err, errlen, CM_ERR_IO, "cannot read the file:// image (%s)",
                     r < 0 ? strerror_r(errno, why, sizeof(why)) : "it shrank while being read");
        break;
      }
      got += (size_t)r;
    }
  }
  close(fd);
  if (rc) {
    free(buf);
    return rc;
  }
  *data = buf;
  *n = (size_t)st.st_size;
  return 0;
}

/* s[0..n) follows "file://". The folder and the file are both resolved with
 * realpath(), so `..` and symlinks are judged by where they really lead. The
 * folder is the operator's and the client cannot change the file system, so
 * the window between realpath() and open() is not a client's to use. */
static int load_file_url(const char *s, size_t n, const struct img_limits *lim,
                         struct fe_image *out, char *err, size_t errlen) {
  if (!lim->local_dir)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "file:// image URLs are refused: the server was not started with "
                   "--allowed-local-media-path");
  char *path = NULL, *dir = NULL, *real = NULL;
  uint8_t *data = NULL;
  size_t len = 0;
  int rc = file_url_path(s, n, &path, err, errlen);
  if (rc) return rc;
  if (!(dir = realpath(lim->local_dir, NULL))) {
    char why[128];
    rc = cm_fail(err, errlen, CM_ERR_IO, "--allowed-local-media-path cannot be resolved (%s)",
                 strerror_r(errno, why, sizeof(why)));
    goto out;
  }
  real = realpath(path, NULL);
  size_t dlen = strlen(dir);
  int inside = real && (dlen == 1 ? real[1] != 0 /* dir is "/" */
                                  : strncmp(real, dir, dlen) == 0 && real[dlen] == '/' &&
                                        real[dlen + 1] != 0);
  if (!inside) {
    /* the same answer for a missing file and one outside the folder */
    rc = cm_fail(err, errlen, CM_ERR_NOENT,
                 "file:// path is not a file inside --allowed-local-media-path");
    goto out;
  }
  if ((rc = read_regular_file(real, lim->max_bytes, &data, &len, err, errlen))) goto out;
  rc = decode_bytes(data, len, lim, out, err, errlen);
out:
  free(data);
  free(real);
  free(dir);
  free(path);
  return rc;
}

/* ---- URLs --------------------------------------------------------------------------------- */

static int has_prefix(const char *s, size_t n, const char *prefix) {
  size_t k = strlen(prefix);
  return n >= k && strncasecmp(s, prefix, k) == 0;
}

int fe_image_load_url(const char *url, size_t url_len, const struct fe_image_limits *lim,
                      struct fe_image *out, char *err, size_t errlen) {
  memset(out, 0, sizeof(*out));
  struct img_limits l = limits_of(lim);
  if (has_prefix(url, url_len, "data:"))
    return load_data_url(url + 5, url_len - 5, &l, out, err, errlen);
  if (has_prefix(url, url_len, "file://"))
    return load_file_url(url + 7, url_len - 7, &l, out, err, errlen);
  if (has_prefix(url, url_len, "http://") || has_prefix(url, url_len, "https://"))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "remote image URLs are not supported: this server does not fetch images "
                   "from the network; send the image inline as a data: URL "
                   "(data:image/png;base64,...) or as a file:// path under the server's "
                   "--allowed-local-media-path");
  if (url_len == 0) return cm_fail(err, errlen, CM_ERR_INVAL, "empty image URL");
  size_t i = 0; /* a scheme: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ) ":" */
  while (i < url_len && i < 32 &&
         ((url[i] >= 'a' && url[i] <= 'z') || (url[i] >= 'A' && url[i] <= 'Z') ||
          (i > 0 &&
           ((url[i] >= '0' && url[i] <= '9') || url[i] == '+' || url[i] == '-' || url[i] == '.'))))
    i++;
  if (i > 0 && i < url_len && url[i] == ':')
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "unsupported URL scheme '%.*s:' (data: and file:// are accepted)", (int)i, url);
  return cm_fail(err, errlen, CM_ERR_INVAL,
                 "not a URL: expected a data: URL (data:image/png;base64,...) or a file:// path");
}
