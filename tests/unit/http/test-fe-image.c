/* test-fe-image.c — the image URL loaders and decoders of fe-image.c. Every
 * image is made here at run time with the libraries' own encoders (libpng,
 * libjpeg, libwebp, giflib), so no binary fixture is committed. Lossless
 * formats must decode to exactly the source pixels, JPEG and lossy WebP to
 * within a small mean error; then the URL rules, the file:// sandbox, and a
 * matrix of bad images (every truncation, random bytes behind each magic,
 * zero and huge headers) that must all be errors, never crashes. Inputs are
 * exact-size heap copies, so ASan sees any over-read. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gif_lib.h>
#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>
#include <webp/encode.h>
#include <webp/mux.h>
#include <zlib.h>

#include "common/cm-err.h"
#include "common/cm-fs.h"
#include "frontend/fe-image.h"
#include "tests/harness/th.h"

/* ---- helpers ------------------------------------------------------------------ */

struct mbuf {
  uint8_t *p;
  size_t n, cap; /* bytes */
};

static void mb_put(struct mbuf *b, const void *d, size_t n) {
  if (b->n + n > b->cap) {
    size_t c = b->cap ? b->cap : 1024;
    while (c < b->n + n)
      c *= 2;
    uint8_t *q = realloc(b->p, c);
    if (!q) abort();
    b->p = q;
    b->cap = c;
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
}

static void mb_free(struct mbuf *b) {
  free(b->p);
  memset(b, 0, sizeof(*b));
}

static uint32_t rnd(uint32_t *s) { /* xorshift32 */
  uint32_t x = *s;
  x ^= x << 13, x ^= x >> 17, x ^= x << 5;
  return *s = x;
}

/* Decodes a heap copy of exactly n bytes (an over-read is an ASan error). */
static int decode(const uint8_t *d, size_t n, const struct fe_image_limits *lim,
                  struct fe_image *im, char *err, size_t errlen) {
  uint8_t *copy = malloc(n ? n : 1);
  if (!copy) abort();
  if (n) memcpy(copy, d, n);
  err[0] = 0;
  int rc = fe_image_decode(copy, n, lim, im, err, errlen);
  free(copy);
  return rc;
}

static int load(const char *url, const struct fe_image_limits *lim, struct fe_image *im, char *err,
                size_t errlen) {
  size_t n = strlen(url);
  char *copy = malloc(n ? n : 1); /* not NUL-terminated */
  if (!copy) abort();
  memcpy(copy, url, n);
  err[0] = 0;
  int rc = fe_image_load_url(copy, n, lim, im, err, errlen);
  free(copy);
  return rc;
}

/* An error: the code, a one-line reason that does not name the part itself,
 * and no pixels. A failure names `what` (the input) where it is not NULL. */
#define CHECK_ERR(rc, im, want, err, needle)                                                       \
  check_err(__FILE__, __LINE__, NULL, rc, im, want, err, needle)
static void check_err(const char *file, int line, const char *what, int rc,
                      const struct fe_image *im, int want, const char *err, const char *needle) {
  const char *sep = what ? ": " : "";
  if (!what) what = "";
  if (rc != want)
    th_fail(file, line, "%s%src %d (%s), want %d (%s); err: %s", what, sep, rc, cm_strerror(rc),
            want, cm_strerror(want), err);
  if (!err[0] || strchr(err, '\n') || !strncmp(err, "image_url", 9) || !strncmp(err, "messages", 8))
    th_fail(file, line, "%s%sbad reason \"%s\"", what, sep, err);
  if (needle && !strstr(err, needle))
    th_fail(file, line, "%s%s\"%s\" lacks \"%s\"", what, sep, err, needle);
  if (im->rgb || im->w || im->h) th_fail(file, line, "%s%san error left pixels behind", what, sep);
}

/* The decoded image is exactly want (w x h RGB). */
#define CHECK_PIXELS(im, want, w, h) check_pixels(__FILE__, __LINE__, im, want, w, h)
static void check_pixels(const char *file, int line, const struct fe_image *im, const uint8_t *want,
                         int w, int h) {
  if (!im->rgb || im->w != w || im->h != h) {
    th_fail(file, line, "got %dx%d (%p), want %dx%d", im->w, im->h, (void *)im->rgb, w, h);
    return;
  }
  for (size_t i = 0; i < (size_t)w * h * 3; i++)
    if (im->rgb[i] != want[i]) {
      th_fail(file, line, "pixel (%zu,%zu) channel %zu: %u, want %u", i / 3 % (size_t)w,
              i / 3 / (size_t)w, i % 3, im->rgb[i], want[i]);
      return;
    }
}

/* m, a whole encoded image, decodes (without limits) to exactly want (w x h
 * RGB); m is freed. */
#define CHECK_DECODES(m, want, w, h) check_decodes(__FILE__, __LINE__, m, want, w, h)
static void check_decodes(const char *file, int line, struct mbuf *m, const uint8_t *want, int w,
                          int h) {
  if (m->n == 0) {
    th_fail(file, line, "nothing was encoded");
    th_stop();
  }
  struct fe_image im;
  char err[256];
  int rc = decode(m->p, m->n, NULL, &im, err, sizeof(err));
  if (rc) th_fail(file, line, "decode: %s (%s)", cm_strerror(rc), err);
  check_pixels(file, line, &im, want, w, h);
  fe_image_free(&im);
  mb_free(m);
}

static double mean_abs_err(const uint8_t *a, const uint8_t *b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++)
    s += abs((int)a[i] - (int)b[i]);
  return s / (double)n;
}

static void random_bytes(uint8_t *p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)(rnd(&seed) >> 24);
}

/* A smooth image (what lossy codecs are meant for). */
static void smooth_rgb(uint8_t *p, int w, int h) {
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      uint8_t *q = p + ((size_t)y * w + x) * 3;
      q[0] = (uint8_t)(x * 255 / (w - 1));
      q[1] = (uint8_t)(y * 255 / (h - 1));
      q[2] = (uint8_t)((x + y) * 255 / (w + h - 2));
    }
}

/* ---- PNG encoder ---------------------------------------------------------------- */

struct png_in {
  int w, h, depth, ctype, interlace;
  const uint16_t *samples; /* (h, w, channels) values of `depth` bits */
  const png_color *pal;
  int npal;
  const uint8_t *trns; /* palette alpha */
  int ntrns;
  const png_color_16 *trans_color; /* gray/RGB tRNS */
};

static int png_channels(int ctype) {
  switch (ctype) {
  case PNG_COLOR_TYPE_GRAY: return 1;
  case PNG_COLOR_TYPE_GRAY_ALPHA: return 2;
  case PNG_COLOR_TYPE_RGB: return 3;
  case PNG_COLOR_TYPE_RGB_ALPHA: return 4;
  default: return 1;
  }
}

static void png_wr(png_structp p, png_bytep d, size_t n) {
  mb_put(png_get_io_ptr(p), d, n);
}
static void png_fl(png_structp p) {
  (void)p;
}

struct png_enc {
  png_structp p;
  png_infop info;
  uint8_t *packed;
  png_bytep *rows;
};

static int png_enc_run(struct png_enc *e, const struct png_in *in, struct mbuf *out) {
  if (setjmp(png_jmpbuf(e->p))) return -1;
  int ch = png_channels(in->ctype);
  size_t rb = ((size_t)in->w * ch * in->depth + 7) / 8;
  e->packed = calloc((size_t)in->h, rb);
  e->rows = calloc((size_t)in->h, sizeof(*e->rows));
  if (!e->packed || !e->rows) abort();
  for (int y = 0; y < in->h; y++) {
    uint8_t *row = e->packed + (size_t)y * rb;
    e->rows[y] = row;
    for (int i = 0; i < in->w * ch; i++) {
      unsigned v = in->samples[(size_t)y * in->w * ch + i];
      if (in->depth == 16) {
        row[2 * i] = (uint8_t)(v >> 8), row[2 * i + 1] = (uint8_t)v;
      } else if (in->depth == 8) {
        row[i] = (uint8_t)v;
      } else {
        int bit = i * in->depth;
        row[bit / 8] |= (uint8_t)(v << (8 - in->depth - bit % 8));
      }
    }
  }
  png_set_write_fn(e->p, out, png_wr, png_fl);
  png_set_IHDR(e->p, e->info, (png_uint_32)in->w, (png_uint_32)in->h, in->depth, in->ctype,
               in->interlace, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (in->pal) png_set_PLTE(e->p, e->info, in->pal, in->npal);
  if (in->trns || in->trans_color)
    png_set_tRNS(e->p, e->info, in->trns, in->ntrns, in->trans_color);
  png_write_info(e->p, e->info);
  png_write_image(e->p, e->rows);
  png_write_end(e->p, e->info);
  return 0;
}

static struct mbuf png_make(const struct png_in *in) {
  struct mbuf out = {0};
  struct png_enc e = {0};
  e.p = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
  e.info = png_create_info_struct(e.p);
  if (png_enc_run(&e, in, &out) != 0) mb_free(&out);
  png_destroy_write_struct(&e.p, &e.info);
  free(e.packed);
  free(e.rows);
  return out;
}

/* Encodes, decodes and compares against want. */
static void png_roundtrip(const struct png_in *in, const uint8_t *want, const char *what) {
  struct mbuf m = png_make(in);
  if (!m.n) {
    th_fail(__FILE__, __LINE__, "%s: encoding failed", what);
    return;
  }
  struct fe_image im;
  char err[256];
  int rc = decode(m.p, m.n, NULL, &im, err, sizeof(err));
  if (rc != 0)
    th_fail(__FILE__, __LINE__, "%s: rc %d: %s", what, rc, err);
  else
    check_pixels(__FILE__, __LINE__, &im, want, in->w, in->h);
  fe_image_free(&im);
  mb_free(&m);
}

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* Rewrites the IHDR's size with a valid CRC, so only our limits can refuse it. */
static void png_set_size(struct mbuf *m, uint32_t w, uint32_t h) {
  put_be32(m->p + 16, w);
  put_be32(m->p + 20, h);
  put_be32(m->p + 29, (uint32_t)crc32(0, m->p + 12, 17));
}

/* A w x h random RGB PNG, and its pixels in *px when px is non-NULL. */
static struct mbuf png_rgb(int w, int h, int interlace, uint32_t seed, uint8_t **px) {
  uint16_t *s = malloc(sizeof(*s) * (size_t)w * h * 3);
  uint8_t *p = malloc((size_t)w * h * 3);
  random_bytes(p, (size_t)w * h * 3, seed);
  for (size_t i = 0; i < (size_t)w * h * 3; i++)
    s[i] = p[i];
  struct png_in in = {w, h, 8, PNG_COLOR_TYPE_RGB, interlace, s};
  struct mbuf m = png_make(&in);
  free(s);
  if (px)
    *px = p;
  else
    free(p);
  return m;
}

/* ---- JPEG encoder --------------------------------------------------------------- */

struct jpeg_enc {
  struct jpeg_error_mgr pub;
  jmp_buf jb;
  struct jpeg_compress_struct c;
  unsigned char *buf;
  unsigned long size;
};

static void jpeg_enc_exit(j_common_ptr c) {
  longjmp(((struct jpeg_enc *)c->err)->jb, 1);
}

static int jpeg_enc_run(struct jpeg_enc *e, int w, int h, int comps, J_COLOR_SPACE in_cs,
                        int jpeg_cs, int quality, int progressive, const uint8_t *px) {
  if (setjmp(e->jb)) return -1;
  jpeg_create_compress(&e->c);
  jpeg_mem_dest(&e->c, &e->buf, &e->size);
  e->c.image_width = (JDIMENSION)w;
  e->c.image_height = (JDIMENSION)h;
  e->c.input_components = comps;
  e->c.in_color_space = in_cs;
  jpeg_set_defaults(&e->c);
  if (jpeg_cs >= 0) jpeg_set_colorspace(&e->c, (J_COLOR_SPACE)jpeg_cs);
  jpeg_set_quality(&e->c, quality, TRUE);
  if (progressive) jpeg_simple_progression(&e->c);
  jpeg_start_compress(&e->c, TRUE);
  while (e->c.next_scanline < e->c.image_height) {
    JSAMPROW row = (JSAMPROW)(px + (size_t)e->c.next_scanline * w * comps);
    jpeg_write_scanlines(&e->c, &row, 1);
  }
  jpeg_finish_compress(&e->c);
  return 0;
}

/* jpeg_cs: the JPEG's color space, or -1 for libjpeg's default for in_cs. */
static struct mbuf jpeg_make(int w, int h, int comps, J_COLOR_SPACE in_cs, int jpeg_cs, int quality,
                             int progressive, const uint8_t *px) {
  struct mbuf out = {0};
  struct jpeg_enc *e = calloc(1, sizeof(*e));
  if (!e) abort();
  e->c.err = jpeg_std_error(&e->pub);
  e->pub.error_exit = jpeg_enc_exit;
  if (jpeg_enc_run(e, w, h, comps, in_cs, jpeg_cs, quality, progressive, px) == 0)
    mb_put(&out, e->buf, e->size);
  jpeg_destroy_compress(&e->c);
  free(e->buf);
  free(e);
  return out;
}

/* The offset of the first SOFn marker segment (FF Cn), or 0. */
static size_t jpeg_find_sof(const struct mbuf *m) {
  size_t i = 2;
  while (i + 4 <= m->n && m->p[i] == 0xff) {
    uint8_t mk = m->p[i + 1];
    if (mk >= 0xc0 && mk <= 0xcf && mk != 0xc4 && mk != 0xc8 && mk != 0xcc) return i;
    i += 2 + ((size_t)m->p[i + 2] << 8 | m->p[i + 3]);
  }
  return 0;
}

static void jpeg_set_size(struct mbuf *m, unsigned w, unsigned h) {
  size_t s = jpeg_find_sof(m);
  if (!s) abort();
  m->p[s + 5] = (uint8_t)(h >> 8), m->p[s + 6] = (uint8_t)h;
  m->p[s + 7] = (uint8_t)(w >> 8), m->p[s + 8] = (uint8_t)w;
}

/* ---- WebP encoders ------------------------------------------------------------------ */

static struct mbuf webp_wrap(uint8_t *p, size_t n) {
  struct mbuf m = {0};
  if (p && n) mb_put(&m, p, n);
  WebPFree(p);
  return m;
}

static struct mbuf webp_lossless_rgb(const uint8_t *px, int w, int h) {
  uint8_t *out = NULL;
  size_t n = WebPEncodeLosslessRGB(px, w, h, w * 3, &out);
  return webp_wrap(out, n);
}

/* Two full-canvas lossless frames of w x h RGBA. */
static struct mbuf webp_animated(const uint8_t *f1, const uint8_t *f2, int w, int h) {
  struct mbuf m = {0};
  WebPAnimEncoderOptions eo;
  WebPConfig cfg;
  if (!WebPAnimEncoderOptionsInit(&eo) || !WebPConfigInit(&cfg)) return m;
  cfg.lossless = 1;
  WebPAnimEncoder *enc = WebPAnimEncoderNew(w, h, &eo);
  if (!enc) return m;
  const uint8_t *frames[2] = {f1, f2};
  int ok = 1;
  for (int i = 0; i < 2 && ok; i++) {
    WebPPicture pic;
    ok = WebPPictureInit(&pic);
    pic.width = w, pic.height = h, pic.use_argb = 1;
    ok = ok && WebPPictureImportRGBA(&pic, frames[i], w * 4) &&
         WebPAnimEncoderAdd(enc, &pic, i * 100, &cfg);
    WebPPictureFree(&pic);
  }
  WebPData d;
  WebPDataInit(&d);
  if (ok && WebPAnimEncoderAdd(enc, NULL, 200, NULL) && WebPAnimEncoderAssemble(enc, &d))
    mb_put(&m, d.bytes, d.size);
  WebPDataClear(&d);
  WebPAnimEncoderDelete(enc);
  return m;
}

/* ---- GIF encoder ---------------------------------------------------------------------- */

struct gif_frame {
  int left, top, w, h, interlace;
  int transparent;         /* index, or -1 */
  const GifColorType *pal; /* local color map, or NULL */
  int npal;                /* a power of 2 */
  const uint8_t *idx;      /* (h, w) indices */
};

static int gif_wr(GifFileType *g, const GifByteType *d, int n) {
  mb_put(g->UserData, d, (size_t)n);
  return n;
}

static struct mbuf gif_make(int sw, int sh, const GifColorType *gpal, int ngpal, int bg,
                            const struct gif_frame *f, int nf) {
  struct mbuf out = {0};
  int e = 0;
  GifFileType *g = EGifOpen(&out, gif_wr, &e);
  if (!g) return out;
  EGifSetGifVersion(g, true);
  ColorMapObject *gm = gpal ? GifMakeMapObject(ngpal, gpal) : NULL;
  bool ok = EGifPutScreenDesc(g, sw, sh, 8, bg, gm) == GIF_OK;
  for (int i = 0; i < nf && ok; i++) {
    if (f[i].transparent >= 0) {
      GraphicsControlBlock gcb = {DISPOSAL_UNSPECIFIED, false, 0, f[i].transparent};
      GifByteType ext[4];
      size_t n = EGifGCBToExtension(&gcb, ext);
      ok = EGifPutExtension(g, GRAPHICS_EXT_FUNC_CODE, (int)n, ext) == GIF_OK;
    }
    ColorMapObject *lm = f[i].pal ? GifMakeMapObject(f[i].npal, f[i].pal) : NULL;
    ok = ok &&
         EGifPutImageDesc(g, f[i].left, f[i].top, f[i].w, f[i].h, f[i].interlace, lm) == GIF_OK;
    GifFreeMapObject(lm);
    GifPixelType *line = malloc((size_t)f[i].w); /* EGifPutLine masks it in place */
    static const int start[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
    for (int p = 0; p < (f[i].interlace ? 4 : 1) && ok; p++)
      for (int y = f[i].interlace ? start[p] : 0; y < f[i].h && ok;
           y += f[i].interlace ? step[p] : 1) {
        memcpy(line, f[i].idx + (size_t)y * f[i].w, (size_t)f[i].w);
        ok = EGifPutLine(g, line, f[i].w) == GIF_OK;
      }
    free(line);
  }
  if (EGifCloseFile(g, &e) != GIF_OK) ok = false;
  GifFreeMapObject(gm);
  if (!ok) mb_free(&out);
  return out;
}

static void gif_palette(GifColorType *pal, int n, uint32_t seed) {
  for (int i = 0; i < n; i++) {
    pal[i].Red = (GifByteType)(rnd(&seed) >> 24);
    pal[i].Green = (GifByteType)(rnd(&seed) >> 24);
    pal[i].Blue = (GifByteType)(rnd(&seed) >> 24);
  }
}

/* A w x h single-frame GIF over a 16-color global map; its pixels in *px. */
static struct mbuf gif_simple(int w, int h, int interlace, uint8_t **px) {
  GifColorType pal[16];
  gif_palette(pal, 16, 7);
  uint8_t *idx = malloc((size_t)w * h);
  uint32_t s = 99;
  for (int i = 0; i < w * h; i++)
    idx[i] = (uint8_t)(rnd(&s) % 16);
  struct gif_frame f = {0, 0, w, h, interlace, -1, NULL, 0, idx};
  struct mbuf m = gif_make(w, h, pal, 16, 0, &f, 1);
  if (px) {
    *px = malloc((size_t)w * h * 3);
    for (int i = 0; i < w * h; i++)
      memcpy(*px + i * 3, &pal[idx[i]], 3);
  }
  free(idx);
  return m;
}

/* ---- PNG --------------------------------------------------------------------------------- */

TH_TEST(png_rgb_rgba_gray) {
  enum { W = 13, H = 7, N = W * H };
  uint8_t r[N * 4], want[N * 3];
  uint16_t s[N * 4];
  random_bytes(r, sizeof(r), 1);
  r[3] = 0; /* a fully transparent pixel keeps its color: alpha is dropped */
  /* RGB */
  for (int i = 0; i < N * 3; i++)
    s[i] = r[i], want[i] = r[i];
  png_roundtrip(&(struct png_in){W, H, 8, PNG_COLOR_TYPE_RGB, 0, s}, want, "rgb8");
  /* RGBA: alpha dropped, not composited */
  for (int i = 0; i < N; i++)
    for (int c = 0; c < 4; c++) {
      s[i * 4 + c] = r[i * 4 + c];
      if (c < 3) want[i * 3 + c] = r[i * 4 + c];
    }
  png_roundtrip(&(struct png_in){W, H, 8, PNG_COLOR_TYPE_RGB_ALPHA, 0, s}, want, "rgba8");
  /* gray, gray+alpha: replicated */
  for (int i = 0; i < N; i++) {
    s[i] = r[i];
    memset(want + i * 3, r[i], 3);
  }
  png_roundtrip(&(struct png_in){W, H, 8, PNG_COLOR_TYPE_GRAY, 0, s}, want, "gray8");
  png_color_16 tc = {0, 0, 0, 0, r[5]}; /* a gray tRNS is ignored too */
  png_roundtrip(&(struct png_in){W, H, 8, PNG_COLOR_TYPE_GRAY, 0, s, .trans_color = &tc}, want,
                "gray8 tRNS");
  for (int i = 0; i < N; i++)
    s[i * 2] = r[i], s[i * 2 + 1] = r[N + i];
  png_roundtrip(&(struct png_in){W, H, 8, PNG_COLOR_TYPE_GRAY_ALPHA, 0, s}, want, "gray-alpha8");
}

TH_TEST(png_low_bit_gray) {
  enum { W = 11, H = 5, N = W * H };
  uint16_t s[N];
  uint8_t want[N * 3];
  static const int scale[] = {0, 255, 85, 0, 17}; /* 1, 2, 4 bits to 0..255 */
  for (int depth = 1; depth <= 4; depth *= 2) {
    uint32_t seed = 5;
    for (int i = 0; i < N; i++) {
      s[i] = (uint16_t)(rnd(&seed) % (1u << depth));
      memset(want + i * 3, s[i] * scale[depth], 3);
    }
    png_roundtrip(&(struct png_in){W, H, depth, PNG_COLOR_TYPE_GRAY, 0, s}, want, "low-bit gray");
  }
}

TH_TEST(png_palette) {
  enum { W = 9, H = 6, N = W * H };
  png_color pal[16];
  uint8_t trns[16], want[N * 3];
  uint16_t s[N];
  random_bytes((uint8_t *)pal, sizeof(pal), 3);
  memset(trns, 0, sizeof(trns)); /* every entry fully transparent: still its palette color */
  for (int depth = 4; depth <= 8; depth += 4) {
    uint32_t seed = 11;
    for (int i = 0; i < N; i++) {
      s[i] = (uint16_t)(rnd(&seed) % 16);
      memcpy(want + i * 3, &pal[s[i]], 3);
    }
    png_roundtrip(&(struct png_in){W, H, depth, PNG_COLOR_TYPE_PALETTE, 0, s, pal, 16}, want,
                  "palette");
    png_roundtrip(&(struct png_in){W, H, depth, PNG_COLOR_TYPE_PALETTE, 0, s, pal, 16, trns, 16},
                  want, "palette tRNS");
    png_roundtrip(&(struct png_in){W, H, depth, PNG_COLOR_TYPE_PALETTE, 1, s, pal, 16, trns, 16},
                  want, "palette interlaced");
  }
}

/* 16-bit samples become their high byte. The low byte is 0xff everywhere, so
 * scaling (v * 255 / 65535, rounded) would give hi + 1 and fail. */
TH_TEST(png_16bit) {
  enum { W = 10, H = 4, N = W * H };
  uint16_t s[N * 4];
  uint8_t want[N * 3];
  uint32_t seed = 21;
  for (int i = 0; i < N * 4; i++)
    s[i] = (uint16_t)((rnd(&seed) % 255) << 8 | 0xff);
  for (int i = 0; i < N * 3; i++)
    want[i] = (uint8_t)(s[i] >> 8);
  png_roundtrip(&(struct png_in){W, H, 16, PNG_COLOR_TYPE_RGB, 0, s}, want, "rgb16");
  png_roundtrip(&(struct png_in){W, H, 16, PNG_COLOR_TYPE_RGB, 1, s}, want, "rgb16 interlaced");
  for (int i = 0; i < N; i++)
    for (int c = 0; c < 3; c++)
      want[i * 3 + c] = (uint8_t)(s[i * 4 + c] >> 8);
  png_roundtrip(&(struct png_in){W, H, 16, PNG_COLOR_TYPE_RGB_ALPHA, 0, s}, want, "rgba16");
  for (int i = 0; i < N; i++)
    memset(want + i * 3, s[i] >> 8, 3);
  png_roundtrip(&(struct png_in){W, H, 16, PNG_COLOR_TYPE_GRAY, 0, s}, want, "gray16");
}

TH_TEST(png_interlaced) {
  /* sizes that leave Adam7 passes empty or ragged */
  static const int sizes[][2] = {{1, 1}, {2, 3}, {33, 17}, {8, 8}, {5, 1}};
  for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
    uint8_t *px;
    struct mbuf m = png_rgb(sizes[k][0], sizes[k][1], 1, 40 + (uint32_t)k, &px);
    TH_REQUIRE(m.n > 0);
    struct fe_image im;
    char err[256];
    TH_CHECK_EQ_INT(decode(m.p, m.n, NULL, &im, err, sizeof(err)), 0);
    CHECK_PIXELS(&im, px, sizes[k][0], sizes[k][1]);
    fe_image_free(&im);
    fe_image_free(&im); /* idempotent */
    fe_image_free(NULL);
    free(px);
    mb_free(&m);
  }
}

/* ---- JPEG -------------------------------------------------------------------------------- */

static void jpeg_check(const struct mbuf *m, const uint8_t *want, int w, int h, double max_mae,
                       const char *what) {
  struct fe_image im;
  char err[256];
  int rc = decode(m->p, m->n, NULL, &im, err, sizeof(err));
  if (rc != 0 || im.w != w || im.h != h) {
    th_fail(__FILE__, __LINE__, "%s: rc %d (%s), %dx%d", what, rc, err, im.w, im.h);
  } else {
    double e = mean_abs_err(im.rgb, want, (size_t)w * h * 3);
    if (e > max_mae)
      th_fail(__FILE__, __LINE__, "%s: mean abs error %.2f > %.2f", what, e, max_mae);
  }
  fe_image_free(&im);
}

TH_TEST(jpeg_rgb_gray) {
  enum { W = 64, H = 48, N = W * H };
  uint8_t *px = malloc(N * 3), *gray = malloc(N), *want = malloc(N * 3);
  smooth_rgb(px, W, H);
  struct mbuf m = jpeg_make(W, H, 3, JCS_RGB, -1, 95, 0, px);
  TH_REQUIRE(m.n > 0);
  jpeg_check(&m, px, W, H, 2.0, "baseline");
  mb_free(&m);
  m = jpeg_make(W, H, 3, JCS_RGB, -1, 95, 1, px);
  jpeg_check(&m, px, W, H, 2.0, "progressive");
  mb_free(&m);
  m = jpeg_make(W, H, 3, JCS_RGB, JCS_RGB, 95, 0, px); /* Adobe RGB-transform JPEG */
  jpeg_check(&m, px, W, H, 2.0, "rgb");
  mb_free(&m);
  for (int i = 0; i < N; i++) {
    gray[i] = px[i * 3];
    memset(want + i * 3, gray[i], 3);
  }
  m = jpeg_make(W, H, 1, JCS_GRAYSCALE, -1, 95, 0, gray);
  jpeg_check(&m, want, W, H, 1.0, "gray");
  struct fe_image im;
  char err[256];
  TH_REQUIRE(decode(m.p, m.n, NULL, &im, err, sizeof(err)) == 0);
  int replicated = 1;
  for (int i = 0; i < N; i++)
    replicated &= im.rgb[i * 3] == im.rgb[i * 3 + 1] && im.rgb[i * 3] == im.rgb[i * 3 + 2];
  TH_CHECK(replicated);
  fe_image_free(&im);
  mb_free(&m);
  free(px);
  free(gray);
  free(want);
}

/* libjpeg stores CMYK samples as given, in Adobe's inverted convention (255 =
 * no ink), and Pillow reads them so: R = c * k / 255. Flat quadrants (white,
 * black, pure colors) then a gradient. */
TH_TEST(jpeg_cmyk_ycck) {
  enum { W = 32, H = 32, N = W * H };
  uint8_t *cmyk = malloc(N * 4), *want = malloc(N * 3);
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++) {
      uint8_t *p = cmyk + (y * W + x) * 4;
      if (y < 16) {
        static const uint8_t q[4][4] = {
            {255, 255, 255, 255}, {255, 255, 255, 0}, {0, 255, 255, 255}, {255, 0, 128, 255}};
        memcpy(p, q[x / 8], 4);
      } else {
        p[0] = (uint8_t)(x * 8), p[1] = (uint8_t)(255 - x * 8), p[2] = (uint8_t)(y * 4);
        p[3] = (uint8_t)(128 + x * 4);
      }
      for (int c = 0; c < 3; c++)
        want[(y * W + x) * 3 + c] = (uint8_t)((p[c] * p[3] + 127) / 255);
    }
  struct mbuf m = jpeg_make(W, H, 4, JCS_CMYK, -1, 98, 0, cmyk);
  TH_REQUIRE(m.n > 0);
  jpeg_check(&m, want, W, H, 3.0, "cmyk");
  mb_free(&m);
  m = jpeg_make(W, H, 4, JCS_CMYK, JCS_YCCK, 98, 0, cmyk);
  TH_REQUIRE(m.n > 0);
  jpeg_check(&m, want, W, H, 4.0, "ycck"); /* its chroma is subsampled */
  /* white stays white, no ink in K gives black */
  struct fe_image im;
  char err[256];
  TH_REQUIRE(decode(m.p, m.n, NULL, &im, err, sizeof(err)) == 0);
  TH_CHECK(im.rgb[(4 * W + 4) * 3] >= 250 && im.rgb[(4 * W + 12) * 3] <= 5);
  fe_image_free(&im);
  mb_free(&m);
  free(cmyk);
  free(want);
}

/* ---- WebP --------------------------------------------------------------------------------- */

TH_TEST(webp_still) {
  enum { W = 21, H = 13, N = W * H };
  uint8_t px[N * 3], rgba[N * 4], smooth[N * 3];
  random_bytes(px, sizeof(px), 8);
  struct mbuf m = webp_lossless_rgb(px, W, H);
  CHECK_DECODES(&m, px, W, H);
  /* with alpha (never 0, whose color the encoder may change): alpha dropped */
  for (int i = 0; i < N; i++) {
    memcpy(rgba + i * 4, px + i * 3, 3);
    rgba[i * 4 + 3] = (uint8_t)(i % 2 ? 128 : 1);
  }
  uint8_t *out = NULL;
  size_t n = WebPEncodeLosslessRGBA(rgba, W, H, W * 4, &out);
  m = webp_wrap(out, n);
  CHECK_DECODES(&m, px, W, H);
  /* lossy */
  smooth_rgb(smooth, W, H);
  n = WebPEncodeRGB(smooth, W, H, W * 3, 95, &out);
  m = webp_wrap(out, n);
  TH_REQUIRE(m.n > 0);
  struct fe_image im;
  char err[256];
  TH_CHECK_EQ_INT(decode(m.p, m.n, NULL, &im, err, sizeof(err)), 0);
  TH_REQUIRE(im.rgb && im.w == W && im.h == H);
  TH_CHECK(mean_abs_err(im.rgb, smooth, N * 3) < 4.0);
  fe_image_free(&im);
  mb_free(&m);
}

TH_TEST(webp_animated_first_frame) {
  enum { W = 12, H = 10, N = W * H };
  uint8_t f1[N * 4], f2[N * 4], want[N * 3];
  random_bytes(f1, sizeof(f1), 31);
  random_bytes(f2, sizeof(f2), 32);
  for (int i = 0; i < N; i++) {
    f1[i * 4 + 3] = f2[i * 4 + 3] = 255;
    memcpy(want + i * 3, f1 + i * 4, 3);
  }
  struct mbuf m = webp_animated(f1, f2, W, H);
  TH_REQUIRE(m.n > 0);
  WebPBitstreamFeatures f;
  TH_REQUIRE(WebPGetFeatures(m.p, m.n, &f) == VP8_STATUS_OK && f.has_animation);
  CHECK_DECODES(&m, want, W, H);
}

/* ---- GIF ----------------------------------------------------------------------------------- */

TH_TEST(gif_full_and_interlaced) {
  for (int il = 0; il <= 1; il++) {
    static const int sizes[][2] = {{7, 5}, {6, 19}, {1, 1}, {3, 9}};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
      uint8_t *px;
      struct mbuf m = gif_simple(sizes[k][0], sizes[k][1], il, &px);
      CHECK_DECODES(&m, px, sizes[k][0], sizes[k][1]);
      free(px);
    }
  }
}

/* A 4x3 frame at (5,4) on a 10x8 screen whose background is index 3: the
 * canvas shows the background color around the frame and under its
 * transparent pixels (index 1). */
TH_TEST(gif_offset_transparent) {
  enum { SW = 10, SH = 8, FW = 4, FH = 3, FX = 5, FY = 4 };
  GifColorType pal[8];
  gif_palette(pal, 8, 17);
  uint8_t idx[FW * FH] = {0, 1, 2, 3, 4, 5, 1, 7, 1, 1, 6, 2};
  uint8_t want[SW * SH * 3];
  for (int i = 0; i < SW * SH; i++)
    memcpy(want + i * 3, &pal[3], 3);
  for (int y = 0; y < FH; y++)
    for (int x = 0; x < FW; x++)
      if (idx[y * FW + x] != 1)
        memcpy(want + ((FY + y) * SW + FX + x) * 3, &pal[idx[y * FW + x]], 3);
  struct gif_frame f = {FX, FY, FW, FH, 0, 1, NULL, 0, idx};
  struct mbuf m = gif_make(SW, SH, pal, 8, 3, &f, 1);
  CHECK_DECODES(&m, want, SW, SH);
  /* no global color map: a black canvas, the frame through its local map */
  memset(want, 0, sizeof(want));
  for (int y = 0; y < FH; y++)
    for (int x = 0; x < FW; x++)
      if (idx[y * FW + x] != 1)
        memcpy(want + ((FY + y) * SW + FX + x) * 3, &pal[idx[y * FW + x]], 3);
  f.pal = pal, f.npal = 8;
  m = gif_make(SW, SH, NULL, 0, 3, &f, 1);
  CHECK_DECODES(&m, want, SW, SH);
}

/* A frame sticking out of the screen grows the canvas (as Pillow does); a
 * 2-frame GIF gives its first frame. */
TH_TEST(gif_grow_and_two_frames) {
  GifColorType pal[4];
  gif_palette(pal, 4, 23);
  uint8_t idx[6 * 3] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 3, 3, 3, 0, 0, 0};
  uint8_t want[6 * 5 * 3];
  for (int i = 0; i < 6 * 5; i++)
    memcpy(want + i * 3, &pal[2], 3); /* background index 2 */
  for (int y = 0; y < 3; y++)
    for (int x = 0; x < 6; x++)
      memcpy(want + ((2 + y) * 6 + x) * 3, &pal[idx[y * 6 + x]], 3);
  struct gif_frame f = {0, 2, 6, 3, 0, -1, NULL, 0, idx};
  struct mbuf m = gif_make(4, 4, pal, 4, 2, &f, 1);
  CHECK_DECODES(&m, want, 6, 5);

  uint8_t a[4 * 4], b[4 * 4], wa[4 * 4 * 3];
  for (int i = 0; i < 16; i++) {
    a[i] = (uint8_t)(i % 4), b[i] = (uint8_t)(3 - i % 4);
    memcpy(wa + i * 3, &pal[a[i]], 3);
  }
  struct gif_frame two[2] = {{0, 0, 4, 4, 0, -1, NULL, 0, a}, {0, 0, 4, 4, 0, -1, NULL, 0, b}};
  m = gif_make(4, 4, pal, 4, 0, two, 2);
  CHECK_DECODES(&m, wa, 4, 4);
}

/* ---- data: URLs --------------------------------------------------------------------------- */

static char *b64(const uint8_t *p, size_t n, int pad) {
  static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char *s = malloc(n / 3 * 4 + 8), *o = s;
  size_t i = 0;
  for (; i + 3 <= n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
    *o++ = al[v >> 18], *o++ = al[v >> 12 & 63], *o++ = al[v >> 6 & 63], *o++ = al[v & 63];
  }
  if (n - i == 1) {
    uint32_t v = (uint32_t)p[i] << 16;
    *o++ = al[v >> 18], *o++ = al[v >> 12 & 63];
    if (pad) *o++ = '=', *o++ = '=';
  } else if (n - i == 2) {
    uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
    *o++ = al[v >> 18], *o++ = al[v >> 12 & 63], *o++ = al[v >> 6 & 63];
    if (pad) *o++ = '=';
  }
  *o = 0;
  return s;
}

static char *data_url(const char *head, const uint8_t *p, size_t n, int pad) {
  char *body = b64(p, n, pad);
  char *u = malloc(strlen(head) + strlen(body) + 1);
  strcpy(u, head);
  strcat(u, body);
  free(body);
  return u;
}

/* Every base64 tail (0, 1 or 2 bytes over a multiple of 3), padded or not,
 * decodes to the image: bytes past the PNG's IEND are never read. */
TH_TEST(data_url_roundtrip) {
  uint8_t *px;
  struct mbuf m = png_rgb(6, 5, 0, 50, &px);
  TH_REQUIRE(m.n > 0);
  static const char *heads[] = {"data:image/png;base64,", "data:;base64,",
                                "DATA:IMAGE/JPEG;BASE64," /* the declared type is ignored */,
                                "data:image/png;name=x.png;base64,"};
  for (int extra = 0; extra < 3; extra++) {
    for (int pad = 0; pad <= 1; pad++)
      for (size_t h = 0; h < sizeof(heads) / sizeof(heads[0]); h++) {
        char *u = data_url(heads[h], m.p, m.n, pad);
        struct fe_image im;
        char err[256];
        int rc = load(u, NULL, &im, err, sizeof(err));
        if (rc) th_fail(__FILE__, __LINE__, "%s pad %d extra %d: %s", heads[h], pad, extra, err);
        CHECK_PIXELS(&im, px, 6, 5);
        fe_image_free(&im);
        free(u);
      }
    mb_put(&m, "\0", 1);
  }
  free(px);
  mb_free(&m);
}

/* A WebP's every byte counts (its RIFF size covers the file), so the last
 * base64 group of each tail length must decode exactly. */
TH_TEST(data_url_tails) {
  int seen = 0; /* bit r: a file of n % 3 == r bytes went through */
  for (int w = 1; w < 40 && seen != 7; w++) {
    uint8_t px[40 * 3 * 3];
    random_bytes(px, sizeof(px), (uint32_t)w);
    struct mbuf m = webp_lossless_rgb(px, w, 3);
    TH_REQUIRE(m.n > 0);
    seen |= 1 << (m.n % 3);
    for (int pad = 0; pad <= 1; pad++) {
      char *u = data_url("data:image/webp;base64,", m.p, m.n, pad);
      struct fe_image im;
      char err[256];
      int rc = load(u, NULL, &im, err, sizeof(err));
      if (rc) th_fail(__FILE__, __LINE__, "%zu bytes, pad %d: %s", m.n, pad, err);
      CHECK_PIXELS(&im, px, w, 3);
      fe_image_free(&im);
      free(u);
    }
    mb_free(&m);
  }
  TH_CHECK_EQ_INT(seen, 7);
}

/* A URL refused without limits: the code and what the reason holds. */
struct refused_url {
  const char *url;
  int rc;
  const char *needle;
};

static void check_refused_urls(const struct refused_url *cases, size_t n) {
  for (size_t i = 0; i < n; i++) {
    struct fe_image im;
    char err[512];
    int rc = load(cases[i].url, NULL, &im, err, sizeof(err));
    check_err(__FILE__, __LINE__, cases[i].url, rc, &im, cases[i].rc, err, cases[i].needle);
  }
}

TH_TEST(data_url_rules) {
  struct mbuf m = png_rgb(4, 4, 0, 51, NULL);
  TH_REQUIRE(m.n > 0);
  struct fe_image im;
  char err[256];
  char *u = data_url("data:image/png;base64,", m.p, m.n, 1);
  size_t head = strlen("data:image/png;base64,");
  /* a bad character, named with its offset in the payload */
  char *bad = strdup(u);
  bad[head + 10] = '!';
  CHECK_ERR(load(bad, NULL, &im, err, sizeof(err)), &im, CM_ERR_INVAL, err, "offset 10");
  TH_CHECK(strstr(err, "'!'") != NULL);
  bad[head + 10] = '\n';
  CHECK_ERR(load(bad, NULL, &im, err, sizeof(err)), &im, CM_ERR_INVAL, err, "0x0a");
  strcpy(bad, u);
  bad[head + 4] = '-'; /* base64url is not the standard alphabet */
  CHECK_ERR(load(bad, NULL, &im, err, sizeof(err)), &im, CM_ERR_INVAL, err, "offset 4");
  free(bad);
  /* missing ;base64 */
  char *plain = data_url("data:image/png,", m.p, m.n, 1);
  CHECK_ERR(load(plain, NULL, &im, err, sizeof(err)), &im, CM_ERR_INVAL, err, ";base64");
  free(plain);
  /* no ',', no payload; padding; well-formed base64 of bytes that are no image */
  static const struct refused_url refused[] = {
      {"data:image/png;base64", CM_ERR_INVAL, "','"},
      {"data:image/png;base64,", CM_ERR_INVAL, "empty image"},
      {"data:;base64,QUJD=", CM_ERR_INVAL, "padding"},
      {"data:;base64,QU=", CM_ERR_INVAL, "padding"},
      {"data:;base64,QUJDR", CM_ERR_INVAL, "one character"},
      {"data:;base64,Q===", CM_ERR_INVAL, "offset 1"},
      {"data:;base64,QU=J", CM_ERR_INVAL, "offset 2"},
      {"data:;base64,QUJD", CM_ERR_UNSUPPORTED,
       "unsupported image type (PNG, JPEG, WebP and GIF are)"},
  };
  check_refused_urls(refused, sizeof(refused) / sizeof(refused[0]));
  /* size over max_bytes, refused from the payload's length */
  struct fe_image_limits lim = {m.n - 1, 0, NULL};
  char want[160];
  snprintf(want, sizeof(want), "%zu bytes after base64 decoding, over the limit of %zu bytes", m.n,
           m.n - 1);
  CHECK_ERR(load(u, &lim, &im, err, sizeof(err)), &im, CM_ERR_TOOBIG, err, want);
  lim.max_bytes = m.n;
  TH_CHECK_EQ_INT(load(u, &lim, &im, err, sizeof(err)), 0);
  fe_image_free(&im);
  free(u);
  mb_free(&m);
}

TH_TEST(url_schemes) {
  struct fe_image im;
  char err[512];
  static const char *remote[] = {"http://example.com/a.png", "https://example.com/a.png",
                                 "HTTPS://EXAMPLE.COM/A.PNG"};
  for (int i = 0; i < 3; i++) {
    CHECK_ERR(load(remote[i], NULL, &im, err, sizeof(err)), &im, CM_ERR_UNSUPPORTED, err,
              "does not fetch images from the network");
    TH_CHECK(strstr(err, "data:") && strstr(err, "file://") &&
             strstr(err, "--allowed-local-media-path"));
  }
  static const struct refused_url refused[] = {
      {"ftp://example.com/a.png", CM_ERR_INVAL, "'ftp:'"},
      {"", CM_ERR_INVAL, "empty"},
      {"iVBORw0KGgo", CM_ERR_INVAL, "not a URL"},
      {"file:///etc/passwd", CM_ERR_UNSUPPORTED, "--allowed-local-media-path"},
  };
  check_refused_urls(refused, sizeof(refused) / sizeof(refused[0]));
}

/* ---- file:// URLs ------------------------------------------------------------------------- */

static void write_file(const char *path, const struct mbuf *m) {
  FILE *f = fopen(path, "wb");
  if (!f || (m->n && fwrite(m->p, 1, m->n, f) != m->n) || fclose(f) != 0) abort();
}

TH_TEST(file_urls) {
  char root[] = "/tmp/lmserve-image-XXXXXX";
  TH_REQUIRE(mkdtemp(root) != NULL);
  char dir[512], p[1024], u[1200];
  snprintf(dir, sizeof(dir), "%s/allowed", root);
  snprintf(p, sizeof(p), "%s/allowed/sub", root);
  TH_REQUIRE(cm_mkdir_p(p, 0700) == 0);
  snprintf(p, sizeof(p), "%s/outside", root);
  TH_REQUIRE(cm_mkdir_p(p, 0700) == 0);
  snprintf(p, sizeof(p), "%s/allowed2", root);
  TH_REQUIRE(cm_mkdir_p(p, 0700) == 0);
  uint8_t *px;
  struct mbuf m = png_rgb(5, 3, 0, 60, &px);
  TH_REQUIRE(m.n > 0);
  static const char *files[] = {"allowed/a.png", "allowed/sub/c d%.png", "outside/b.png",
                                "allowed2/x.png"};
  for (int i = 0; i < 4; i++) {
    snprintf(p, sizeof(p), "%s/%s", root, files[i]);
    write_file(p, &m);
  }
  snprintf(p, sizeof(p), "%s/allowed/escape.png", root);
  TH_REQUIRE(symlink("../outside/b.png", p) == 0);
  snprintf(p, sizeof(p), "%s/allowed/inner.png", root);
  TH_REQUIRE(symlink("sub/c d%.png", p) == 0);
  snprintf(p, sizeof(p), "%s/allowed/up", root);
  TH_REQUIRE(symlink("..", p) == 0);

  struct fe_image_limits lim = {0, 0, dir};
  struct fe_image im;
  char err[512];
  /* inside: plain, percent-decoded, via a symlink that stays inside, localhost */
  static const struct {
    const char *host, *rest;
  } good[] = {{"", "allowed/a.png"},        {"", "allowed/sub/c%20d%25.png"},
              {"", "allowed/inner.png"},    {"localhost", "allowed/a.png"},
              {"", "allowed/sub/../a.png"}, {"", "allowed/a.png?x=1#y"}};
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    snprintf(u, sizeof(u), "file://%s%s/%s", good[i].host, root, good[i].rest);
    int rc = load(u, &lim, &im, err, sizeof(err));
    if (rc) th_fail(__FILE__, __LINE__, "%s: %s", u, err);
    CHECK_PIXELS(&im, px, 5, 3);
    fe_image_free(&im);
  }
  /* the folder given with a trailing slash works the same */
  char dir_slash[600];
  snprintf(dir_slash, sizeof(dir_slash), "%s/", dir);
  struct fe_image_limits lim2 = {0, 0, dir_slash};
  snprintf(u, sizeof(u), "file://%s/allowed/a.png", root);
  TH_CHECK_EQ_INT(load(u, &lim2, &im, err, sizeof(err)), 0);
  fe_image_free(&im);
  /* outside, missing, escaping: the same answer */
  static const char *outside[] = {"outside/b.png",
                                  "allowed/../outside/b.png",
                                  "allowed/escape.png",
                                  "allowed/up/outside/b.png",
                                  "allowed2/x.png",
                                  "allowed/missing.png",
                                  "allowed",
                                  "allowed/"};
  for (size_t i = 0; i < sizeof(outside) / sizeof(outside[0]); i++) {
    snprintf(u, sizeof(u), "file://%s/%s", root, outside[i]);
    CHECK_ERR(load(u, &lim, &im, err, sizeof(err)), &im, CM_ERR_NOENT, err,
              "not a file inside --allowed-local-media-path");
  }
  snprintf(u, sizeof(u), "file://%s/allowed/sub", root);
  CHECK_ERR(load(u, &lim, &im, err, sizeof(err)), &im, CM_ERR_INVAL, err, "not a regular file");
  snprintf(u, sizeof(u), "file://%s/allowed/a%%2.png", root);
  CHECK_ERR(load(u, &lim, &im, err, sizeof(err)), &im, CM_ERR_INVAL, err, "%-escape");
  snprintf(u, sizeof(u), "file://%s/allowed/a.png%%00.txt", root);
  CHECK_ERR(load(u, &lim, &im, err, sizeof(err)), &im, CM_ERR_INVAL, err, "NUL");
  CHECK_ERR(load("file://otherhost/a.png", &lim, &im, err, sizeof(err)), &im, CM_ERR_INVAL, err,
            "absolute path");
  CHECK_ERR(load("file://a.png", &lim, &im, err, sizeof(err)), &im, CM_ERR_INVAL, err,
            "absolute path");
  /* without --allowed-local-media-path */
  snprintf(u, sizeof(u), "file://%s/allowed/a.png", root);
  CHECK_ERR(load(u, NULL, &im, err, sizeof(err)), &im, CM_ERR_UNSUPPORTED, err,
            "--allowed-local-media-path");
  /* over max_bytes: refused from fstat */
  struct fe_image_limits small = {m.n - 1, 0, dir};
  CHECK_ERR(load(u, &small, &im, err, sizeof(err)), &im, CM_ERR_TOOBIG, err, "limit of");
  /* an empty file */
  snprintf(p, sizeof(p), "%s/allowed/empty.png", root);
  struct mbuf none = {0};
  write_file(p, &none);
  snprintf(u, sizeof(u), "file://%s/allowed/empty.png", root);
  CHECK_ERR(load(u, &lim, &im, err, sizeof(err)), &im, CM_ERR_INVAL, err, "empty image");
  free(px);
  mb_free(&m);
  TH_CHECK_EQ_INT(cm_rmtree(root), 0);
}

/* ---- bad images ---------------------------------------------------------------------------- */

struct sample {
  const char *name;
  struct mbuf m;
  size_t tail; /* trailing bytes no pixel depends on (PNG's IEND, JPEG's EOI, GIF's ';') */
};

/* One encoded image of every kind the decoders take. */
static int make_samples(struct sample *s) {
  enum { W = 24, H = 17, N = W * H };
  uint8_t px[N * 3], rgba[N * 4], gray[N];
  smooth_rgb(px, W, H);
  for (int i = 0; i < N; i++) {
    memcpy(rgba + i * 4, px + i * 3, 3);
    rgba[i * 4 + 3] = 255;
    gray[i] = px[i * 3 + 1];
  }
  int k = 0;
  s[k++] = (struct sample){"png", png_rgb(W, H, 0, 70, NULL), 12};
  s[k++] = (struct sample){"png-interlaced", png_rgb(W, H, 1, 71, NULL), 12};
  s[k++] = (struct sample){"jpeg", jpeg_make(W, H, 3, JCS_RGB, -1, 90, 0, px), 2};
  s[k++] = (struct sample){"jpeg-progressive", jpeg_make(W, H, 3, JCS_RGB, -1, 90, 1, px), 2};
  s[k++] = (struct sample){"jpeg-gray", jpeg_make(W, H, 1, JCS_GRAYSCALE, -1, 90, 0, gray), 2};
  s[k++] = (struct sample){"webp-lossless", webp_lossless_rgb(px, W, H), 0};
  uint8_t *out = NULL;
  size_t n = WebPEncodeRGB(px, W, H, W * 3, 80, &out);
  s[k++] = (struct sample){"webp-lossy", webp_wrap(out, n), 0};
  s[k++] = (struct sample){"webp-animated", webp_animated(rgba, rgba + 4, W / 2, H / 2), 0};
  s[k++] = (struct sample){"gif", gif_simple(W, H, 0, NULL), 1};
  s[k++] = (struct sample){"gif-interlaced", gif_simple(W, H, 1, NULL), 1};
  for (int i = 0; i < k; i++)
    if (!s[i].m.n) th_fail(__FILE__, __LINE__, "%s: encoding failed", s[i].name);
  return k;
}

static void free_samples(struct sample *s, int k) {
  for (int i = 0; i < k; i++)
    mb_free(&s[i].m);
}

/* Every prefix of every image short of its pixel-free tail is an error; the
 * whole image decodes. */
TH_TEST(truncated_every_length) {
  struct sample s[16];
  int k = make_samples(s);
  for (int i = 0; i < k; i++) {
    struct fe_image im;
    char err[256];
    int rc = decode(s[i].m.p, s[i].m.n, NULL, &im, err, sizeof(err));
    if (rc) th_fail(__FILE__, __LINE__, "%s whole: %s", s[i].name, err);
    fe_image_free(&im);
    int fails = 0;
    for (size_t len = 0; len + s[i].tail < s[i].m.n && fails < 3; len++) {
      rc = decode(s[i].m.p, len, NULL, &im, err, sizeof(err));
      if (rc == 0 || im.rgb || !err[0] || strchr(err, '\n')) {
        th_fail(__FILE__, __LINE__, "%s cut at %zu of %zu: rc %d, \"%s\"", s[i].name, len, s[i].m.n,
                rc, err);
        fails++;
      }
      fe_image_free(&im);
    }
  }
  free_samples(s, k);
}

/* Flipped bytes anywhere: an error or an image, never a crash or a leak. */
TH_TEST(corrupt_bytes) {
  struct sample s[16];
  int k = make_samples(s);
  uint32_t seed = 77;
  for (int i = 0; i < k; i++) {
    for (int t = 0; t < 300; t++) {
      struct mbuf c = {0};
      mb_put(&c, s[i].m.p, s[i].m.n);
      for (int f = 0; f < 1 + t % 4; f++)
        c.p[rnd(&seed) % c.n] ^= (uint8_t)(1u << (rnd(&seed) % 8));
      struct fe_image im;
      char err[256];
      int rc = decode(c.p, c.n, NULL, &im, err, sizeof(err));
      if (rc == 0 ? !im.rgb || im.w <= 0 || im.h <= 0 : im.rgb != NULL || !err[0])
        th_fail(__FILE__, __LINE__, "%s flip %d: rc %d, inconsistent result", s[i].name, t, rc);
      fe_image_free(&im);
      mb_free(&c);
    }
  }
  free_samples(s, k);
}

/* Random bytes behind each format's magic are an error. */
TH_TEST(random_after_magic) {
  static const struct {
    const char *magic;
    size_t n;
  } magics[] = {{"\x89PNG\r\n\x1a\n", 8},
                {"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR", 16},
                {"\xff\xd8\xff", 3},
                {"\xff\xd8\xff\xe0", 4},
                {"RIFF\0\0\0\0WEBP", 12},
                {"RIFF\0\0\0\0WEBPVP8L", 16},
                {"RIFF\0\0\0\0WEBPVP8 ", 16},
                {"GIF89a", 6},
                {"GIF87a\x10\0\x10\0\x80\0\0", 13}};
  uint32_t seed = 1234;
  for (size_t i = 0; i < sizeof(magics) / sizeof(magics[0]); i++)
    for (int t = 0; t < 200; t++) {
      size_t n = 16 + rnd(&seed) % 2048;
      uint8_t *p = malloc(n);
      random_bytes(p, n, rnd(&seed));
      memcpy(p, magics[i].magic, magics[i].n);
      if (magics[i].magic[0] == 'R') { /* a RIFF size that matches */
        uint32_t r = (uint32_t)n - 8;
        p[4] = (uint8_t)r, p[5] = (uint8_t)(r >> 8), p[6] = (uint8_t)(r >> 16), p[7] = 0;
      }
      struct fe_image im;
      char err[256];
      int rc = decode(p, n, NULL, &im, err, sizeof(err));
      if (rc == 0 || im.rgb || !err[0])
        th_fail(__FILE__, __LINE__, "magic %zu try %d: rc %d \"%s\"", i, t, rc, err);
      fe_image_free(&im);
      free(p);
    }
}

/* Headers of zero size, and headers too big: refused from the header, naming
 * the numbers. */
TH_TEST(zero_and_huge_headers) {
  struct fe_image im;
  char err[256];
  /* PNG: IHDR rewritten with a valid CRC */
  struct mbuf m = png_rgb(3, 2, 0, 80, NULL);
  TH_REQUIRE(m.n > 33);
  png_set_size(&m, 0, 2);
  CHECK_ERR(decode(m.p, m.n, NULL, &im, err, sizeof(err)), &im, CM_ERR_INVAL, err,
            "zero-size image");
  png_set_size(&m, 100000, 100000);
  CHECK_ERR(decode(m.p, m.n, NULL, &im, err, sizeof(err)), &im, CM_ERR_TOOBIG, err,
            "100000x100000");
  TH_CHECK(strstr(err, "40000000") != NULL);
  png_set_size(&m, 70000, 1); /* few pixels, too wide */
  CHECK_ERR(decode(m.p, m.n, NULL, &im, err, sizeof(err)), &im, CM_ERR_TOOBIG, err, "65536");
  png_set_size(&m, 3, 2);
  TH_CHECK_EQ_INT(decode(m.p, m.n, NULL, &im, err, sizeof(err)), 0); /* the patch is sound */
  fe_image_free(&im);
  /* max_pixels at its boundary */
  struct fe_image_limits lim = {0, 6, NULL};
  TH_CHECK_EQ_INT(decode(m.p, m.n, &lim, &im, err, sizeof(err)), 0);
  fe_image_free(&im);
  lim.max_pixels = 5;
  CHECK_ERR(decode(m.p, m.n, &lim, &im, err, sizeof(err)), &im, CM_ERR_TOOBIG, err,
            "3x2 = 6 pixels, over the limit of 5 pixels");
  mb_free(&m);

  /* JPEG: the SOF's size */
  uint8_t px[8 * 8 * 3];
  smooth_rgb(px, 8, 8);
  m = jpeg_make(8, 8, 3, JCS_RGB, -1, 90, 0, px);
  TH_REQUIRE(jpeg_find_sof(&m) != 0);
  jpeg_set_size(&m, 8, 0);
  CHECK_ERR(decode(m.p, m.n, NULL, &im, err, sizeof(err)), &im, CM_ERR_INVAL, err,
            "zero-size image");
  jpeg_set_size(&m, 60000, 60000);
  CHECK_ERR(decode(m.p, m.n, NULL, &im, err, sizeof(err)), &im, CM_ERR_TOOBIG, err, "60000x60000");
  jpeg_set_size(&m, 65535, 65535); /* over libjpeg's own 65500 */
  CHECK_ERR(decode(m.p, m.n, NULL, &im, err, sizeof(err)), &im, CM_ERR_TOOBIG, err, "65500");
  mb_free(&m);

  /* WebP: a lossless header of 16384x16384 (its largest) */
  m = webp_lossless_rgb(px, 8, 8);
  TH_REQUIRE(m.n > 25 && memcmp(m.p + 12, "VP8L", 4) == 0 && m.p[20] == 0x2f);
  uint32_t v = (uint32_t)m.p[21] | (uint32_t)m.p[22] << 8 | (uint32_t)m.p[23] << 16 |
               (uint32_t)m.p[24] << 24;
  v = (v & 0xf0000000u) | 16383u | 16383u << 14;
  for (int i = 0; i < 4; i++)
    m.p[21 + i] = (uint8_t)(v >> (8 * i));
  CHECK_ERR(decode(m.p, m.n, NULL, &im, err, sizeof(err)), &im, CM_ERR_TOOBIG, err, "16384x16384");
  mb_free(&m);

  /* GIF: the screen (bytes 6..9) and the frame (after a 4-color global map) */
  GifColorType pal[4];
  gif_palette(pal, 4, 5);
  uint8_t idx[4] = {0, 1, 2, 3};
  struct gif_frame f = {0, 0, 2, 2, 0, -1, NULL, 0, idx};
  m = gif_make(2, 2, pal, 4, 0, &f, 1);
  TH_REQUIRE(m.n > 35 && m.p[25] == ',');
  m.p[6] = m.p[7] = m.p[8] = m.p[9] = 0xff;
  CHECK_ERR(decode(m.p, m.n, NULL, &im, err, sizeof(err)), &im, CM_ERR_TOOBIG, err, "65535x65535");
  m.p[6] = m.p[7] = m.p[8] = m.p[9] = 0; /* a 0x0 screen takes the frame's size */
  TH_CHECK_EQ_INT(decode(m.p, m.n, NULL, &im, err, sizeof(err)), 0);
  TH_CHECK(im.w == 2 && im.h == 2);
  fe_image_free(&im);
  m.p[30] = m.p[31] = 0; /* a frame 0 pixels wide */
  CHECK_ERR(decode(m.p, m.n, NULL, &im, err, sizeof(err)), &im, CM_ERR_INVAL, err,
            "zero-size image");
  mb_free(&m);
}

TH_TEST(bytes_limits_and_types) {
  struct fe_image im;
  char err[256];
  struct mbuf m = png_rgb(4, 4, 0, 90, NULL);
  struct fe_image_limits lim = {m.n - 1, 0, NULL};
  char want[160];
  snprintf(want, sizeof(want), "%zu bytes, over the limit of %zu bytes", m.n, m.n - 1);
  CHECK_ERR(decode(m.p, m.n, &lim, &im, err, sizeof(err)), &im, CM_ERR_TOOBIG, err, want);
  mb_free(&m);
  CHECK_ERR(decode((const uint8_t *)"", 0, NULL, &im, err, sizeof(err)), &im, CM_ERR_INVAL, err,
            "empty image");
  static const char *unknown[] = {"hello, world", "BM\x36\0\0\0\0\0\0\0\x36\0\0\0",
                                  "\0\0\0\x0cjP  \r\n\x87\n", "\x89PN", "GIF8"};
  for (int i = 0; i < 5; i++)
    CHECK_ERR(decode((const uint8_t *)unknown[i], strlen(unknown[i]) + (i == 2 ? 1 : 0), NULL, &im,
                     err, sizeof(err)),
              &im, CM_ERR_UNSUPPORTED, err, "unsupported image type (PNG, JPEG, WebP and GIF are)");
}

/* Nothing reaches stderr, from the decoders or the libraries: bad data of
 * every kind runs with stderr sent to a file, which must stay empty. */
TH_TEST(silent_on_stderr) {
  struct sample s[16];
  int k = make_samples(s);
  char path[] = "/tmp/lmserve-image-stderr-XXXXXX";
  int fd = mkstemp(path);
  TH_REQUIRE(fd >= 0);
  fflush(stderr);
  int saved = dup(2);
  TH_REQUIRE(saved >= 0 && dup2(fd, 2) == 2);
  int bad = 0;
  uint32_t seed = 5;
  for (int i = 0; i < k; i++)
    for (int t = 0; t < 60; t++) {
      struct mbuf c = {0};
      mb_put(&c, s[i].m.p, s[i].m.n);
      if (t < 30) {
        c.n = c.n * (size_t)(t + 1) / 31; /* truncated */
      } else {
        for (int f = 0; f < 3; f++) /* corrupt */
          c.p[8 + rnd(&seed) % (c.n - 8)] ^= (uint8_t)(rnd(&seed) | 1);
      }
      struct fe_image im;
      char err[256];
      int rc = decode(c.p, c.n, NULL, &im, err, sizeof(err));
      if (rc != 0 && im.rgb) bad++;
      fe_image_free(&im);
      mb_free(&c);
    }
  /* a PNG whose text chunk has a bad CRC: libpng warns (benign) and goes on */
  struct png_in in = {2, 2, 8, PNG_COLOR_TYPE_GRAY, 0, (const uint16_t[]){1, 2, 3, 4}};
  struct mbuf m = png_make(&in);
  static const uint8_t text[] = {0, 0, 0, 3, 't', 'E', 'X', 't', 'a', 0, 'b', 1, 2, 3, 4};
  struct mbuf w = {0};
  mb_put(&w, m.p, 33); /* signature + IHDR */
  mb_put(&w, text, sizeof(text));
  mb_put(&w, m.p + 33, m.n - 33);
  struct fe_image im;
  char err[256];
  int rc_warn = decode(w.p, w.n, NULL, &im, err, sizeof(err));
  fe_image_free(&im);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  struct stat st;
  TH_CHECK(fstat(fd, &st) == 0 && st.st_size == 0);
  close(fd);
  unlink(path);
  TH_CHECK_EQ_INT(bad, 0);
  TH_CHECK_EQ_INT(rc_warn, 0);
  mb_free(&w);
  mb_free(&m);
  free_samples(s, k);
}

/* ---- threads -------------------------------------------------------------------------------- */

struct thread_arg {
  const struct sample *s;
  int k;
  const struct fe_image *ref; /* one per sample */
  int mismatches;
};

static void *decode_loop(void *p) {
  struct thread_arg *a = p;
  for (int round = 0; round < 20; round++)
    for (int i = 0; i < a->k; i++) {
      struct fe_image im;
      char err[256];
      int rc = fe_image_decode(a->s[i].m.p, a->s[i].m.n, NULL, &im, err, sizeof(err));
      if (rc || im.w != a->ref[i].w || im.h != a->ref[i].h ||
          memcmp(im.rgb, a->ref[i].rgb, (size_t)im.w * im.h * 3) != 0)
        a->mismatches++;
      fe_image_free(&im);
      /* an error path too */
      rc = fe_image_decode(a->s[i].m.p, a->s[i].m.n / 2, NULL, &im, err, sizeof(err));
      if (rc == 0) a->mismatches++;
    }
  return NULL;
}

TH_TEST(concurrent_decoding) {
  struct sample s[16];
  struct fe_image ref[16];
  int k = make_samples(s);
  for (int i = 0; i < k; i++) {
    char err[256];
    TH_REQUIRE(fe_image_decode(s[i].m.p, s[i].m.n, NULL, &ref[i], err, sizeof(err)) == 0);
  }
  enum { T = 4 };
  pthread_t th[T];
  struct thread_arg args[T];
  for (int t = 0; t < T; t++) {
    args[t] = (struct thread_arg){s, k, ref, 0};
    TH_REQUIRE(pthread_create(&th[t], NULL, decode_loop, &args[t]) == 0);
  }
  for (int t = 0; t < T; t++) {
    pthread_join(th[t], NULL);
    TH_CHECK_EQ_INT(args[t].mismatches, 0);
  }
  for (int i = 0; i < k; i++)
    fe_image_free(&ref[i]);
  free_samples(s, k);
}
