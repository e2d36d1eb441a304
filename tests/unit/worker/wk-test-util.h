/* wk-test-util.h — helpers for the worker unit tests: temporary directories
 * holding generated checkpoints. */
#ifndef LMSERVE_WK_TEST_UTIL_H
#define LMSERVE_WK_TEST_UTIL_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-proc.h"
#include "kernels/cpu/kn-cpu.h"
#include "model/md-safetensors.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tools/tl-tiny-spec.h"
#include "worker/wk-kv.h"
#include "worker/wk-model.h"

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

/* Runs build/tools/lmserve with args (NULL-terminated, the command first); if it
 * does not exit 0, the test fails at file:line with its output and stops. */
static inline void wkt_lmserve_at(const char *file, int line, char *const *args) {
  char lm[1024], log[4096], *argv[32];
  snprintf(lm, sizeof(lm), "%s/tools/lmserve", th_build_dir());
  int n = 0;
  argv[n++] = lm;
  while (n < 31 && args[n - 1]) {
    argv[n] = args[n - 1];
    n++;
  }
  TH_REQUIRE(!args[n - 1]); /* at most 30 arguments */
  argv[n] = NULL;
  int rc = cm_run_capture(argv, log, sizeof(log));
  if (rc) {
    th_fail(file, line, "lmserve %s exited with %d:\n%s", args[0], rc, log);
    th_stop();
  }
}
#define wkt_lmserve(...) wkt_lmserve_at(__FILE__, __LINE__, (char *[]){__VA_ARGS__, NULL})

/* The CPU backend with `threads` threads (the test stops if it cannot be made). */
static inline struct kn_backend *wkt_cpu_backend(int threads) {
  struct kn_backend *be = NULL;
  TH_REQUIRE(kn_cpu_backend_create(threads, &be) == 0 && be);
  return be;
}

/* Points in at blk's pages: every KV group's page table and its length. */
static inline void wkt_seq_pages(struct wk_seq_input *in, const struct wk_kv_spec *kv,
                                 const struct wk_seq_blocks *blk) {
  for (int g = 0; g < kv->n_groups; g++) {
    in->block_tables[g] = blk->table[g];
    in->n_blocks[g] = blk->n[g];
  }
}

/* The options of a small load (16 batch tokens, one sequence, 64 KV tokens,
 * quiet) with `quantization` (WK_QUANT_*, or 0). */
static inline struct wk_model_opts wkt_small_opts(int quantization) {
  return (struct wk_model_opts){.max_batch_tokens = 16,
                                .max_seqs = 1,
                                .kv_tokens = 64,
                                .quiet = 1,
                                .quantization = quantization};
}

/* Writes a generated checkpoint of arch's preset (small vocabulary) into a new directory. */
static inline int wkt_make_preset(char *dir, size_t n, const char *arch, const char *preset,
                                  int moe, int window, enum md_st_dtype dt, uint64_t seed) {
  if (wkt_tmpdir(dir, n)) return -1;
  struct tl_tiny_spec s;
  struct tl_tiny_opts o = {
      .arch = arch, .preset = preset, .vocab = 512, .moe = moe, .sliding_window = window};
  char err[256];
  if (tl_tiny_spec_build(&s, &o, err, sizeof(err))) return -1;
  int rc = tl_tiny_write(&s, dir, seed, dt);
  tl_tiny_spec_free(&s);
  return rc;
}

/* Writes the checkpoint tl_tiny builds from o (weights of dtype dt, values from
 * seed) into a new directory, its path in dir[n]; the test stops, saying why,
 * if it cannot. */
static inline void wkt_make_tiny(char *dir, size_t n, const struct tl_tiny_opts *o, uint64_t seed,
                                 enum md_st_dtype dt) {
  TH_REQUIRE(wkt_tmpdir(dir, n) == 0);
  struct tl_tiny_spec s;
  char err[256] = "";
  if (tl_tiny_spec_build(&s, o, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "tiny spec: %s", err);
    th_stop();
  }
  TH_REQUIRE(tl_tiny_write(&s, dir, seed, dt) == 0);
  tl_tiny_spec_free(&s);
}

/* Fails the test (at file:line) unless the text model of the multimodal
 * checkpoint in dir loads on be: it reads model.language_model.*. */
static inline void wkt_check_text_model_at(const char *file, int line, const char *dir,
                                           struct kn_backend *be) {
  char err[512] = "";
  struct wk_model *m = NULL;
  struct wk_model_opts mo = {.max_batch_tokens = 32, .max_seqs = 2, .kv_tokens = 64, .quiet = 1};
  if (wk_model_load(dir, be, &mo, &m, err, sizeof(err))) th_fail(file, line, "text model: %s", err);
  wk_model_free(m);
}
#define wkt_check_text_model(dir, be) wkt_check_text_model_at(__FILE__, __LINE__, (dir), (be))

/* wkt_make_preset with the tiny preset. */
static inline int wkt_make_model(char *dir, size_t n, const char *arch, int moe, int window,
                                 enum md_st_dtype dt, uint64_t seed) {
  return wkt_make_preset(dir, n, arch, "tiny", moe, window, dt, seed);
}

/* Opens the golden fixture tests/fixtures/models/NAME/golden.safetensors (its folder in
 * dir[4096]). When it is absent the test skips, saying how to make it:
 * `make_fixtures.py ARGS`, then commit the folder. */
static inline struct md_st *wkt_golden_open(const char *name, const char *args, char *dir) {
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
  struct md_st *g = NULL;
  if (md_st_open_file(path, &g, err, sizeof(err)) != 0) {
    th_fail(__FILE__, __LINE__, "%s: %s", path, err);
    th_stop();
  }
  return g;
}

/* Deterministic pixels in [-1, 1] for px[n, C, S, S]: smooth patterns plus a
 * little noise (from seed), a different one per image and channel. */
static inline void wkt_fill_pixels(float *px, int n, int C, int S, uint64_t seed) {
  uint64_t st = seed;
  for (int i = 0; i < n; i++)
    for (int c = 0; c < C; c++)
      for (int y = 0; y < S; y++)
        for (int x = 0; x < S; x++) {
          st = st * 6364136223846793005ull + 1442695040888963407ull;
          double noise = (double)(st >> 40) / (double)(1ull << 24) - 0.5;
          double v = 0.7 * sin(0.11 * (i + 1) * x + 0.07 * (c + 1) * y + i) + 0.3 * noise;
          px[(((size_t)i * C + c) * S + y) * S + x] = (float)v;
        }
}

/* bytes to / raw little-endian f32 from a file (the numpy references' I/O);
 * 0 or -1 (a short file, or one with more in it, is -1) */
static inline int wkt_write_file(const char *path, const void *a, size_t bytes) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t w = fwrite(a, 1, bytes, f);
  return fclose(f) || w != bytes ? -1 : 0;
}

static inline int wkt_read_f32(const char *path, float *a, size_t n) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  size_t r = fread(a, sizeof(float), n, f);
  int extra = fgetc(f) != EOF;
  fclose(f);
  return r == n && !extra ? 0 : -1;
}

/* The largest |got[i] - want[i]| over n (infinite when one is NaN), want's
 * range in *lo, *hi. */
static inline double wkt_max_err(const float *got, const float *want, size_t n, double *lo,
                                 double *hi) {
  double worst = 0.0;
  *lo = INFINITY, *hi = -INFINITY;
  for (size_t i = 0; i < n; i++) {
    *lo = fmin(*lo, want[i]);
    *hi = fmax(*hi, want[i]);
    double e = fabs((double)got[i] - (double)want[i]);
    if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
  }
  return worst;
}

/* wkt_max_err as a fraction of want's range. */
static inline double wkt_rel_err(const float *got, const float *want, size_t n) {
  double lo, hi, worst = wkt_max_err(got, want, n, &lo, &hi);
  return worst / (hi - lo);
}

/* Writes the checkpoint o describes into dir (seed, dt) with every tensor
 * whose name holds `part` renamed away (the test stops if it cannot). */
static inline void wkt_write_without(const char *dir, const struct tl_tiny_opts *o,
                                     const char *part, uint64_t seed, enum md_st_dtype dt) {
  struct tl_tiny_spec s;
  char err[256] = "";
  TH_REQUIRE(tl_tiny_spec_build(&s, o, err, sizeof(err)) == 0);
  for (int i = 0; i < s.n_tensors; i++)
    if (strstr(s.tensors[i].name, part))
      snprintf(s.tensors[i].name, sizeof(s.tensors[i].name), "renamed.weight");
  TH_REQUIRE(tl_tiny_write(&s, dir, seed, dt) == 0);
  tl_tiny_spec_free(&s);
}

/* th_require_numpy under the name the worker tests knew it by first. */
static inline const char *wkt_require_numpy(const char *what, const char *script) {
  return th_require_numpy(what, script);
}

/* Every position's logits of one prompt of np tokens (a chunk of `chunk`, then
 * one token at a time; f32 KV) through path's model loaded with quantization
 * quant: [np, V] (malloc'd) into *out. */
static inline int wkt_prompt_logits(const char *path, struct kn_backend *be, int quant, int np,
                                    int chunk, float **out, int *V, char *err, size_t errlen) {
  struct wk_model_opts o = {.max_batch_tokens = chunk,
                            .max_seqs = 1,
                            .kv_tokens = 2 * np + 32,
                            .quiet = 1,
                            .kv_dtype = 1 + KN_DTYPE_F32,
                            .quantization = quant};
  struct wk_model *m = NULL;
  int rc = wk_model_load(path, be, &o, &m, err, errlen);
  if (rc) return rc;
  *V = wk_model_config(m)->vocab;
  float *all = malloc(sizeof(float) * (size_t)np * *V);
  int32_t *prompt = malloc(sizeof(int32_t) * (size_t)np);
  struct wk_page_alloc pa;
  struct wk_seq_blocks blk = {0};
  const struct wk_kv_spec *kv = wk_model_kv_spec(m);
  TH_REQUIRE(all && prompt && wk_page_alloc_init(&pa, wk_model_n_pages(m)) == 0);
  for (int i = 0; i < np; i++)
    prompt[i] = (int32_t)((i * 37 + 2) % *V);
  for (int done = 0; done < np && !rc;) {
    int n = done == 0 ? chunk : 1;
    TH_REQUIRE(wk_seq_blocks_reserve(&blk, kv, &pa, done + n) == 0);
    struct wk_seq_input in = {.tokens = prompt + done, .n_tokens = n, .pos0 = done, .n_out = n};
    wkt_seq_pages(&in, kv, &blk);
    struct wk_batch b = {.seqs = &in, .n_seqs = 1, .logits = all + (size_t)done * *V};
    rc = wk_model_forward(m, &b, err, errlen);
    done += n;
  }
  wk_seq_blocks_release(&blk, kv, &pa);
  wk_page_alloc_free(&pa);
  wk_model_free(m);
  free(prompt);
  *out = all;
  return rc;
}

/* A w x h RGB image (malloc'd): smooth gradients, stripes and a little noise. */
static inline uint8_t *wkt_rgb_image(int w, int h, uint64_t seed) {
  uint8_t *img = malloc((size_t)w * h * 3);
  TH_REQUIRE(img);
  uint64_t st = seed;
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int c = 0; c < 3; c++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        double noise = (double)(st >> 40) / (double)(1ull << 24) - 0.5;
        double v = 128 + 90 * sin(0.05 * (c + 1) * x + 0.09 * y + (double)seed) + 40 * noise;
        img[((size_t)y * w + x) * 3 + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
      }
  return img;
}

#endif
