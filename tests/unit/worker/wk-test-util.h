/* wk-test-util.h — helpers for the worker unit tests: temporary directories
 * holding generated checkpoints. */
#ifndef LMSERVE_WK_TEST_UTIL_H
#define LMSERVE_WK_TEST_UTIL_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness/th.h"
#include "worker/wk-safetensors.h"
#include "worker/wk-tiny-spec.h"

/* Creates a fresh directory under $TMPDIR (or /tmp); path in buf. */
static inline int wkt_tmpdir(char *buf, size_t n) {
  const char *t = getenv("TMPDIR");
  snprintf(buf, n, "%s/lmserve-wk-XXXXXX", t && *t ? t : "/tmp");
  return mkdtemp(buf) ? 0 : -1;
}

/* Removes a directory made by wkt_tmpdir and the files in it. */
static inline void wkt_rmdir(const char *dir) {
  static const char *names[] = {"config.json",       "generation_config.json",
                                "model.safetensors", "model.safetensors.index.json",
                                "a.safetensors",     "b.safetensors",
                                "tokenizer.json",    "tokenizer_config.json"};
  char p[4200];
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
    unlink(p);
  }
  rmdir(dir);
}

/* Writes a generated checkpoint (small vocabulary) into a new directory. */
static inline int wkt_make_model(char *dir, size_t n, const char *arch, int moe, int window,
                                 enum wk_st_dtype dt, uint64_t seed) {
  if (wkt_tmpdir(dir, n)) return -1;
  struct wk_tiny_spec s;
  struct wk_tiny_opts o = {
      .arch = arch, .preset = "tiny", .vocab = 512, .moe = moe, .sliding_window = window};
  char err[256];
  if (wk_tiny_spec_build(&s, &o, err, sizeof(err))) return -1;
  int rc = wk_tiny_write(&s, dir, seed, dt);
  wk_tiny_spec_free(&s);
  return rc;
}

/* Opens the golden fixture tests/fixtures/models/NAME/golden.safetensors (its folder in
 * dir[4096]). When it is absent the test skips, saying how to make it:
 * `make_fixtures.py ARGS`, then commit the folder. */
static inline struct wk_st *wkt_golden_open(const char *name, const char *args, char *dir) {
  char path[4200], why[4400];
  snprintf(dir, 4096, "%s/fixtures/models/%s", th_tests_dir(), name);
  snprintf(path, sizeof(path), "%s/golden.safetensors", dir);
  if (access(path, R_OK)) {
    snprintf(why, sizeof(why),
             "NO GOLDEN FIXTURE at %s: run `python3 tests/reference/make_fixtures.py%s` on a "
             "machine with torch + transformers 5 and commit tests/fixtures/models/%s",
             dir, args, *args ? name : "");
    TH_SKIP(why);
  }
  char err[512] = "";
  struct wk_st *g = NULL;
  if (wk_st_open_file(path, &g, err, sizeof(err)) != 0) {
    th_fail(__FILE__, __LINE__, "%s: %s", path, err);
    th_stop();
  }
  return g;
}

#endif
