/* md-test-util.h — what the model unit tests share: a small text file (a
 * config, an index) written into a test's folder. */
#ifndef LMSERVE_TESTS_MD_TEST_UTIL_H
#define LMSERVE_TESTS_MD_TEST_UTIL_H
#include <stdio.h>

#include "tests/harness/th.h"

/* Writes text to dir/name, replacing what was there; the test stops if the
 * file cannot be written whole. */
static inline void mdt_write_text(const char *dir, const char *name, const char *text) {
  char path[4200];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  TH_REQUIRE(f != NULL);
  TH_REQUIRE(fputs(text, f) >= 0 && fclose(f) == 0);
}

#endif
