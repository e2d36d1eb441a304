/* api-images.h — test pictures for the image API tests: RGB patterns, their
 * PNG files, and data: URLs. Every function requires success (TH_REQUIRE). */
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

#endif
