/* fuzz-image.c — fuzz target for the image inputs of the chat API
 * (frontend/fe-image.c): the input goes through fe_image_decode as encoded
 * bytes and through fe_image_load_url as a URL (file:// stays refused: no
 * folder is allowed). The seeds are data: URLs of small images of every
 * format, so the corpus is text. Each call must return 0 with pixels within
 * the limits or a negative cm_err with a one-line reason and no pixels; any
 * other outcome aborts (a finding). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "frontend/fe-image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int rc, struct fe_image *im, const char *err, uint64_t max_pixels) {
  if (rc == 0) {
    if (!im->rgb || im->w <= 0 || im->h <= 0 || (uint64_t)im->w * (uint64_t)im->h > max_pixels)
      abort();
    volatile uint8_t sink = im->rgb[(size_t)im->w * (size_t)im->h * 3 - 1]; /* all of it exists */
    (void)sink;
  } else if (rc > 0 || rc <= CM_ERR__LAST || im->rgb || !err[0] || strchr(err, '\n')) {
    abort();
  }
  fe_image_free(im);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* small limits keep each run fast; the limits themselves are tested elsewhere */
  const struct fe_image_limits lim = {1 << 20, 1 << 20, NULL};
  struct fe_image im;
  char err[256] = "";
  check(fe_image_decode(data, size, &lim, &im, err, sizeof(err)), &im, err, lim.max_pixels);
  err[0] = 0;
  check(fe_image_load_url((const char *)data, size, &lim, &im, err, sizeof(err)), &im, err,
        lim.max_pixels);
  return 0;
}
