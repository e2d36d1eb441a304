/* api-images.c — test pictures for the image API tests (api-images.h). */
#include "tests/integration/api/api-images.h"

#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness/th.h"

uint8_t *api_picture_rgb(int kind, int w, int h) {
  uint8_t *rgb = malloc((size_t)w * h * 3);
  TH_REQUIRE(rgb != NULL);
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      uint8_t *p = rgb + ((size_t)y * w + x) * 3;
      if (kind == 1) {
        int on = ((x / 8) + (y / 8)) & 1;
        p[0] = on ? 230 : 20, p[1] = on ? 40 : 200, p[2] = (uint8_t)(x * 4);
      } else {
        p[0] = (uint8_t)(x * 255 / (w - 1)), p[1] = (uint8_t)(y * 255 / (h - 1));
        p[2] = (uint8_t)((x + y) * 3);
        if (kind == 2) p[0] = (uint8_t)(255 - p[0]), p[1] = (uint8_t)(255 - p[1]);
      }
    }
  return rgb;
}

struct membuf {
  uint8_t *p;
  size_t n, cap;
};

static void mem_write(png_structp png, png_bytep data, png_size_t n) {
  struct membuf *b = png_get_io_ptr(png);
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2;
    b->p = realloc(b->p, b->cap);
    TH_REQUIRE(b->p != NULL);
  }
  memcpy(b->p + b->n, data, n);
  b->n += n;
}

static void mem_flush(png_structp png) {
  (void)png;
}

uint8_t *api_png_encode(const uint8_t *rgb, int w, int h, size_t *n) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
  png_infop info = png_create_info_struct(png);
  TH_REQUIRE(png && info);
  struct membuf b = {0};
  TH_REQUIRE(setjmp(png_jmpbuf(png)) == 0);
  png_set_write_fn(png, &b, mem_write, mem_flush);
  png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < h; y++)
    png_write_row(png, (png_const_bytep)(rgb + (size_t)y * w * 3));
  png_write_end(png, NULL);
  png_destroy_write_struct(&png, &info);
  *n = b.n;
  return b.p;
}

char *api_base64(const uint8_t *p, size_t n) {
  static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char *s = malloc(4 * ((n + 2) / 3) + 1), *o = s;
  TH_REQUIRE(s != NULL);
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                 (i + 2 < n ? p[i + 2] : 0);
    *o++ = tab[v >> 18 & 63];
    *o++ = tab[v >> 12 & 63];
    *o++ = i + 1 < n ? tab[v >> 6 & 63] : '=';
    *o++ = i + 2 < n ? tab[v & 63] : '=';
  }
  *o = 0;
  return s;
}

char *api_data_url(const uint8_t *p, size_t n) {
  char *b = api_base64(p, n), *s = malloc(strlen(b) + 32);
  TH_REQUIRE(s != NULL);
  sprintf(s, "data:image/png;base64,%s", b);
  free(b);
  return s;
}

static void le(uint8_t *p, uint32_t v, int bytes) {
  for (int i = 0; i < bytes; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

uint8_t *api_wav_f32(const float *x, size_t n, int rate, size_t *len) {
  size_t data = n * 4;
  uint8_t *w = malloc(44 + data);
  TH_REQUIRE(w != NULL);
  memcpy(w, "RIFF", 4);
  le(w + 4, (uint32_t)(36 + data), 4);
  memcpy(w + 8, "WAVEfmt ", 8);
  le(w + 16, 16, 4);
  le(w + 20, 3, 2); /* WAVE_FORMAT_IEEE_FLOAT */
  le(w + 22, 1, 2); /* mono */
  le(w + 24, (uint32_t)rate, 4);
  le(w + 28, (uint32_t)rate * 4, 4);
  le(w + 32, 4, 2);
  le(w + 34, 32, 2);
  memcpy(w + 36, "data", 4);
  le(w + 40, (uint32_t)data, 4);
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &x[i], 4);
    le(w + 44 + 4 * i, u, 4);
  }
  *len = 44 + data;
  return w;
}
