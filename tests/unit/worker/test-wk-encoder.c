/* test-wk-encoder.c — the worker's image encoder cache (wk-encoder.h) on the
 * tiny multimodal checkpoint: embeddings equal the tower's on the normalised
 * pixels; an image met again (in the same call or a later step) is not encoded
 * again; an image with another's hash but other pixels is; least recently
 * used entries go past the capacity, never those the current step uses; bad
 * records are refused. */
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu.h"
#include "model/md-vision-preproc.h"
#include "tests/unit/worker/wk-test-util.h"
#include "worker/wk-encoder.h"
#include "worker/wk-vision.h"

#define SIDE 64 /* the tiny tower's image size */
#define NPIX (SIDE * SIDE * 3)

static uint8_t g_px[4][NPIX];

static struct pr_image image(int k, uint64_t hash) {
  return (struct pr_image){10, 16, hash, {g_px[k], NPIX}};
}

struct fixture {
  char dir[4096];
  struct kn_backend *be;
  struct wk_vision *v;
};

static void setup(struct fixture *f) {
  struct tl_tiny_opts o = {.arch = "gemma3", .preset = "tiny", .vocab = 512, .vision = 1};
  wkt_make_tiny(f->dir, sizeof(f->dir), &o, 5, MD_ST_F32);
  char err[256] = "";
  TH_REQUIRE(kn_cpu_backend_create(1, &f->be) == 0);
  TH_REQUIRE(wk_vision_load(f->dir, f->be, NULL, &f->v, err, sizeof(err)) == 0);
  uint32_t x = 99;
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < NPIX; i++)
      g_px[k][i] = (uint8_t)((x = x * 1664525u + 1013904223u) >> 24);
}

static void teardown(struct fixture *f) {
  wk_vision_free(f->v);
  kn_backend_destroy(f->be);
  char p[4200];
  snprintf(p, sizeof(p), "%s/preprocessor_config.json", f->dir);
  unlink(p);
  wkt_rmdir(f->dir);
}

/* The tower's own embeddings of image k (normalised as the processor does). */
static float *direct(struct fixture *f, int k) {
  const struct md_vision_cfg *vc = wk_vision_config(f->v);
  size_t per = (size_t)vc->mm_tokens * (size_t)wk_vision_text_hidden(f->v);
  float *px = malloc(sizeof(float) * NPIX), *out = malloc(sizeof(float) * per);
  char err[256];
  TH_REQUIRE(px && out);
  TH_REQUIRE(md_image_preprocess(px, g_px[k], SIDE, SIDE, 3, &vc->pre, err, sizeof(err)) == 0);
  TH_REQUIRE(wk_vision_encode(f->v, px, 1, out, err, sizeof(err)) == 0);
  free(px);
  return out;
}

TH_TEST(encoder_cache) {
  struct fixture f;
  setup(&f);
  const struct md_vision_cfg *vc = wk_vision_config(f.v);
  size_t per = (size_t)vc->mm_tokens * (size_t)wk_vision_text_hidden(f.v);
  /* room for two entries */
  size_t entry = NPIX + sizeof(float) * per;
  struct wk_encoder *e = NULL;
  TH_REQUIRE(wk_encoder_create(f.v, 2 * entry + 1, &e) == 0);
  TH_CHECK_EQ_INT(wk_encoder_image_tokens(e), 16);
  TH_CHECK(wk_encoder_image_bytes(e) == NPIX);
  char err[256] = "";
  uint64_t enc, hits;

  /* one step with A, B and A again: two encodes, A's rows shared */
  struct pr_image a = image(0, 1), b = image(1, 2);
  const struct pr_image *ims[4] = {&a, &b, &a};
  const float *rows[4];
  wk_encoder_begin_step(e);
  TH_REQUIRE(wk_encoder_get_many(e, ims, 3, rows, err, sizeof(err)) == 0);
  wk_encoder_stats(e, &enc, &hits);
  TH_CHECK_EQ_INT((int)enc, 2);
  TH_CHECK(rows[0] == rows[2]);
  float *da = direct(&f, 0), *db = direct(&f, 1);
  TH_CHECK(memcmp(rows[0], da, sizeof(float) * per) == 0); /* batched = alone, bit for bit */
  TH_CHECK(memcmp(rows[1], db, sizeof(float) * per) == 0);

  /* a later step: A is a hit */
  wk_encoder_begin_step(e);
  TH_REQUIRE(wk_encoder_get(e, &a, &rows[0], err, sizeof(err)) == 0);
  wk_encoder_stats(e, &enc, &hits);
  TH_CHECK_EQ_INT((int)enc, 2);
  TH_CHECK_EQ_INT((int)hits, 1);
  TH_CHECK(memcmp(rows[0], da, sizeof(float) * per) == 0);

  /* C with A's hash: compared by pixels, so encoded, and its own rows */
  struct pr_image c = image(2, 1);
  wk_encoder_begin_step(e);
  TH_REQUIRE(wk_encoder_get(e, &c, &rows[0], err, sizeof(err)) == 0);
  wk_encoder_stats(e, &enc, &hits);
  TH_CHECK_EQ_INT((int)enc, 3);
  float *dc = direct(&f, 2);
  TH_CHECK(memcmp(rows[0], dc, sizeof(float) * per) == 0);
  TH_CHECK(memcmp(rows[0], da, sizeof(float) * per) != 0);

  /* capacity two: B (least recently used) went for C; A is still there */
  wk_encoder_begin_step(e);
  TH_REQUIRE(wk_encoder_get(e, &a, &rows[0], err, sizeof(err)) == 0);
  wk_encoder_stats(e, &enc, &hits);
  TH_CHECK_EQ_INT((int)enc, 3);
  TH_REQUIRE(wk_encoder_get(e, &b, &rows[1], err, sizeof(err)) == 0);
  wk_encoder_stats(e, &enc, &hits);
  TH_CHECK_EQ_INT((int)enc, 4);

  /* a step with four images over a capacity of two: all four valid at once */
  struct pr_image d = image(3, 4);
  const struct pr_image *four[4] = {&a, &b, &c, &d};
  wk_encoder_begin_step(e);
  TH_REQUIRE(wk_encoder_get_many(e, four, 4, rows, err, sizeof(err)) == 0);
  float *dd = direct(&f, 3);
  TH_CHECK(memcmp(rows[0], da, sizeof(float) * per) == 0);
  TH_CHECK(memcmp(rows[1], db, sizeof(float) * per) == 0);
  TH_CHECK(memcmp(rows[2], dc, sizeof(float) * per) == 0);
  TH_CHECK(memcmp(rows[3], dd, sizeof(float) * per) == 0);

  /* bad records: wrong token count, wrong pixel bytes */
  struct pr_image bad = image(0, 9);
  bad.n_tokens = 15;
  TH_CHECK_EQ_INT(wk_encoder_get(e, &bad, &rows[0], err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK(strstr(err, "16 tokens") != NULL);
  bad = image(0, 9);
  bad.pixels.n = NPIX - 3;
  TH_CHECK_EQ_INT(wk_encoder_get(e, &bad, &rows[0], err, sizeof(err)), CM_ERR_INVAL);

  free(da), free(db), free(dc), free(dd);
  wk_encoder_free(e);
  teardown(&f);
}
