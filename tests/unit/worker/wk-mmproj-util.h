/* wk-mmproj-util.h — what the mmproj tests share (test-wk-mmproj.c: Gemma 3's
 * vision tower; test-wk-mmproj-g4.c: Gemma 4's vision and audio towers): a
 * generated checkpoint exported as GGUF folders three ways, embeddings held
 * to the checkpoint's, and mmproj files rebuilt with one change, each a
 * warning from the model's folder and an error naming it from --mmproj.
 * Header-only. */
#ifndef LMSERVE_WK_MMPROJ_UTIL_H
#define LMSERVE_WK_MMPROJ_UTIL_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/md-config.h"
#include "model/md-gguf.h"
#include "tests/harness/th-buf.h"
#include "tests/harness/th-gguf.h"
#include "tests/harness/th.h"
#include "tests/unit/worker/wk-test-util.h"

/* In a new folder st: the checkpoint ck, `lmserve make-tiny-model` with args
 * (NULL-terminated, the Gemma tokenizer its default; seed 7), and the
 * first n_gg of the folders gg[0] (export-gguf's defaults: mmproj f16),
 * gg[1] (--dtype f32) and gg[2] (--mmproj-dtype q8_0), each with model.gguf
 * and mmproj-model.gguf. */
static inline void wkm_make(char *st, size_t n, char *const *args, char ck[300], char gg[3][300],
                            int n_gg) {
  char out[400], mm[400];
  char *mk[24] = {"make-tiny-model", "--out", ck, "--seed", "7"};
  int k = 5;
  for (int i = 0; args[i] && k < 23; i++)
    mk[k++] = args[i];
  mk[k] = NULL;
  TH_REQUIRE(wkt_tmpdir(st, n) == 0);
  snprintf(ck, 300, "%s/ck", st);
  wkt_lmserve_at(__FILE__, __LINE__, mk);
  snprintf(out, sizeof(out), "%s/tokenizer.json", ck);
  if (access(out, R_OK) != 0) TH_SKIP("no Gemma tokenizer in the tiny model (run tools/setup)");
  for (int i = 0; i < n_gg && i < 3; i++) {
    snprintf(gg[i], 300, "%s/gguf-%d", st, i);
    TH_REQUIRE(mkdir(gg[i], 0755) == 0);
    snprintf(out, sizeof(out), "%s/model.gguf", gg[i]);
    snprintf(mm, sizeof(mm), "%s/mmproj-model.gguf", gg[i]);
    char *argv[] = {"export-gguf", "--model", ck,        "--out", out,
                    "--mmproj",    mm,        "--dtype", "f32",   NULL};
    if (i == 0) argv[7] = NULL;
    if (i == 2) argv[7] = "--mmproj-dtype", argv[8] = "q8_0";
    wkt_lmserve_at(__FILE__, __LINE__, argv);
  }
}

/* The configs of the checkpoint st and of the GGUF folder gg (malloc'd). */
static inline void wkm_configs(const char *st, const char *gg, struct md_config **a,
                               struct md_config **b) {
  char err[512];
  *a = calloc(1, sizeof(**a));
  *b = calloc(1, sizeof(**b));
  TH_REQUIRE(*a && *b && md_config_load(st, *a, err, sizeof(err)) == 0);
  if (md_config_load(gg, *b, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "%s: %s", gg, err);
    th_stop();
  }
}

/* got against want (n values): the largest difference as a fraction of
 * want's range, which must be below limit. */
static inline void wkm_near(const char *what, const float *got, const float *want, size_t n,
                            double limit) {
  double lo = INFINITY, hi = -INFINITY, worst = 0;
  for (size_t i = 0; i < n; i++) {
    lo = fmin(lo, want[i]);
    hi = fmax(hi, want[i]);
    double e = fabs((double)got[i] - want[i]);
    if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
  }
  printf("# %s: max abs difference %.3g, %.3g of the range [%.3f, %.3f]\n", what, worst,
         worst / (hi - lo), lo, hi);
  TH_CHECK(hi - lo > 0.1);
  if (!(worst / (hi - lo) < limit))
    th_fail(__FILE__, __LINE__, "%s: %g of the range (limit %g)", what, worst / (hi - lo), limit);
}

/* One change to an mmproj file: key set to (or added as) a string (str), a
 * u32 or a bool (v, as type says); tensor `from` renamed `to`; rename, when
 * set, renaming any tensor (name[n] holds its own on entry). */
struct wkm_change {
  const char *key, *str;
  int type;
  uint32_t v;
  const char *from, *to;
  void (*rename)(const struct md_gguf_tensor *t, char *name, size_t n);
};

static inline void wkm_put_value(struct th_buf *b, const void *val) {
  const struct wkm_change *c = val;
  th_buf_u32(b, (uint32_t)c->type);
  if (c->type == MD_GGUF_STRING)
    th_buf_str(b, c->str);
  else if (c->type == MD_GGUF_BOOL)
    th_buf_put(b, c->v ? "\1" : "\0", 1);
  else
    th_buf_u32(b, c->v);
}

static inline void wkm_tensor(const struct md_gguf_tensor *t, char *name, size_t n, uint64_t *ne,
                              void *arg) {
  const struct wkm_change *c = ((const struct th_gguf_pair *)arg)->val;
  if (c->from && !strcmp(t->name, c->from)) snprintf(name, n, "%s", c->to);
  if (c->rename) c->rename(t, name, n);
}

/* The file at path with change c, written to out. */
static inline void wkm_rebuild(const char *path, const char *out, const struct wkm_change *c) {
  struct md_gguf *g = NULL;
  size_t len, base;
  uint8_t *bytes = th_gguf_slurp(path, &len, &g);
  struct th_gguf_pair p = {c->key, 0, wkm_put_value, c};
  struct th_gguf_edit e = th_gguf_pair_edit(g, &p);
  e.tensor = wkm_tensor;
  struct th_buf b = th_gguf_rebuild(g, bytes, len, &e, &base);
  TH_REQUIRE(wkt_write_file(out, b.p, b.n) == 0);
  md_gguf_close(g);
  free(b.p);
  free(bytes);
}

/* A bad mmproj file: the change that makes it, and what its error says. */
struct wkm_bad {
  struct wkm_change c;
  const char *want;
};

/* Each of cases[n] applied to the good file at path and written to out,
 * which lies in the folder dir beside the model file model: loading dir
 * warns and leaves no tower (towers(cfg) == 0); --mmproj out with model is
 * an error whose sentence holds cases[i].want. */
static inline void wkm_check_bad(const char *path, const char *out, const char *dir,
                                 const char *model, const struct wkm_bad *cases, size_t n,
                                 int (*towers)(const struct md_config *)) {
  struct md_config *cfg = calloc(1, sizeof(*cfg));
  char err[512];
  TH_REQUIRE(cfg != NULL);
  for (size_t i = 0; i < n; i++) {
    struct wkm_change c = cases[i].c;
    if (c.type == MD_GGUF_STRING && !c.str) c.str = "x";
    wkm_rebuild(path, out, &c);
    /* found in the folder: a warning, and the model serves text */
    TH_CHECK_EQ_INT(md_config_load(dir, cfg, err, sizeof(err)), 0);
    TH_CHECK_EQ_INT(towers(cfg), 0);
    /* named by --mmproj: the error */
    err[0] = 0;
    int rc = md_model_mmproj_arg(model, out, err, sizeof(err));
    if (!rc) rc = md_config_load(model, cfg, err, sizeof(err));
    if (!rc || !strstr(err, cases[i].want))
      th_fail(__FILE__, __LINE__, "case %zu: rc %d, \"%s\" (want \"%s\")", i, rc, err,
              cases[i].want);
    else
      printf("# %s\n", err);
    TH_REQUIRE(md_model_set_mmproj(NULL, err, sizeof(err)) == 0);
  }
  free(cfg);
}

#endif
