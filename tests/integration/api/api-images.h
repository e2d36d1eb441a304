/* api-images.h — test media for the image and audio API tests: RGB patterns,
 * their PNG files, data: URLs; WAV files of float samples; base64. Every
 * function requires success (TH_REQUIRE). */
#ifndef LMSERVE_TESTS_API_IMAGES_H
#define LMSERVE_TESTS_API_IMAGES_H
#include <stddef.h>
#include <stdint.h>

/* rgb[h, w, 3] (malloc'd): kind 0 a gradient, 1 a checkerboard, 2 the gradient
 * inverted. */
uint8_t *api_picture_rgb(int kind, int w, int h);
/* An 8-bit RGB PNG of rgb[h, w, 3] (malloc'd, *n bytes). */
uint8_t *api_png_encode(const uint8_t *rgb, int w, int h, size_t *n);
/* "data:image/png;base64,..." of p[0..n) (malloc'd). */
char *api_data_url(const uint8_t *p, size_t n);
/* Standard base64 of p[0..n) with padding (malloc'd). */
char *api_base64(const uint8_t *p, size_t n);
/* A mono 32-bit float WAV (WAVE_FORMAT_IEEE_FLOAT) of x[0..n) at rate Hz
 * (malloc'd, *len bytes): decoders read its samples back exactly. */
uint8_t *api_wav_f32(const float *x, size_t n, int rate, size_t *len);

#endif
