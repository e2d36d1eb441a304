/* test-wk-vision-g4.c — Gemma 4's image encoder on the worker:
 *   - the generated checkpoint (make-tiny-model --arch gemma4 --vision) loads
 *     as a text model and as a Gemma 4 vision tower, its config and
 *     processor_config.json read back;
 *   - the encoder (tower, pooling, standardisation, embedder; CPU backend)
 *     against tests/reference/gemma4_vision_ref.py, an independent numpy
 *     implementation written from transformers' modeling_gemma4.py, run
 *     through python3 (skipped, loudly, without python3 or numpy), on images
 *     of several sizes and budgets (non-square ones with padding patches);
 *     the same bits whether images share a pass or not;
 *   - bad images and a missing clip bound refused by name. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-fs.h"
#include "common/cm-proc.h"
#include "kernels/cpu/kn-cpu.h"
#include "model/md-config.h"
#include "model/md-vision-g4.h"
#include "tests/unit/worker/wk-test-util.h"
#include "worker/wk-model.h"
#include "worker/wk-vision-g4.h"

/* A generated Gemma 4 multimodal checkpoint (weights of dtype dt) in a new directory. */
static void make_model(char *dir, size_t n, int vocab, enum md_st_dtype dt) {
  struct tl_tiny_opts o = {.arch = "gemma4", .preset = "tiny", .vocab = vocab, .vision = 1};
  wkt_make_tiny(dir, n, &o, 11, dt);
}

TH_TEST(tiny_gemma4_vision_checkpoint_loads) {
  char dir[4096], err[512] = "";
  make_model(dir, sizeof(dir), 262144, MD_ST_BF16);
  struct md_config *c = malloc(sizeof(*c));
  TH_REQUIRE(c);
  TH_REQUIRE(md_config_load(dir, c, err, sizeof(err)) == 0);
  const struct md_vision_g4_cfg *v = &c->vision_g4;
  TH_CHECK_EQ_INT(c->arch, MD_ARCH_GEMMA4);
  TH_CHECK_EQ_INT(c->vision.present, 0);
  TH_CHECK_EQ_INT(v->present, 1);
  TH_CHECK_EQ_INT(v->hidden, 32);
  TH_CHECK_EQ_INT(v->n_layers, 2);
  TH_CHECK_EQ_INT(v->n_heads, 4);
  TH_CHECK_EQ_INT(v->n_kv_heads, 2);
  TH_CHECK_EQ_INT(v->head_dim, 16);
  TH_CHECK_EQ_INT(v->patch, 16);
  TH_CHECK_EQ_INT(v->pool, 3);
  TH_CHECK_EQ_INT(v->default_tokens, 280);
  TH_CHECK_EQ_INT(v->clipped_linears, 1);
  TH_CHECK_EQ_INT(v->standardize, 1);
  TH_CHECK(v->rope_theta == 100.0);
  /* Gemma4Config's ids, inside the tokenizer's vocabulary */
  TH_CHECK_EQ_INT(v->boi_id, 255999);
  TH_CHECK_EQ_INT(v->eoi_id, 258882);
  TH_CHECK_EQ_INT(v->image_id, 258880);
  free(c);
  struct kn_backend *be = wkt_cpu_backend(2);
  wkt_check_text_model(dir, be);
  struct wk_vision_g4 *t = NULL;
  if (wk_vision_g4_load(dir, be, NULL, &t, err, sizeof(err)))
    th_fail(__FILE__, __LINE__, "vision tower: %s", err);
  if (t) TH_CHECK_EQ_INT(wk_vision_g4_text_hidden(t), 64);
  wk_vision_g4_free(t);
  cm_rmtree(dir);
  /* a text-only checkpoint has no tower */
  TH_REQUIRE(wkt_make_model(dir, sizeof(dir), "gemma4", 0, 0, MD_ST_F32, 1) == 0);
  TH_CHECK_EQ_INT(wk_vision_g4_load(dir, be, NULL, &t, err, sizeof(err)), CM_ERR_UNSUPPORTED);
  TH_CHECK(t == NULL);
  cm_rmtree(dir);
  kn_backend_destroy(be);
}

/* ---- the encoder against the numpy reference --------------------------------------- */

struct case_image {
  int w, h, budget;
};

/* The images of the comparison: a landscape photo shape, a square, a tall
 * strip and a small upscaled one, under budgets 70 and 140. */
static const struct case_image cases[] = {
    {640, 480, 70}, {200, 200, 70}, {30, 200, 70}, {50, 40, 140}};
#define N_CASES ((int)CM_ARRAY_LEN(cases))

struct prepared {
  struct wk_g4_image ims[N_CASES];
  float *px[N_CASES];
  int32_t *pos[N_CASES];
  int total_rows, total_tokens;
};

static void prepare(struct prepared *p, const struct md_vision_g4_cfg *vc) {
  memset(p, 0, sizeof(*p));
  char err[256];
  for (int i = 0; i < N_CASES; i++) {
    struct md_g4_image info;
    TH_REQUIRE(md_g4_image_plan(&info, cases[i].w, cases[i].h, vc, cases[i].budget, err,
                                sizeof(err)) == 0);
    p->px[i] = malloc(sizeof(float) * (size_t)info.max_patches * info.patch_dim);
    p->pos[i] = malloc(sizeof(int32_t) * 2 * (size_t)info.max_patches);
    TH_REQUIRE(p->px[i] && p->pos[i]);
    uint8_t *img = wkt_rgb_image(cases[i].w, cases[i].h, 100 + (uint64_t)i);
    TH_REQUIRE(md_g4_image_preprocess(p->px[i], p->pos[i], &info, img, cases[i].w, cases[i].h, vc,
                                      cases[i].budget, err, sizeof(err)) == 0);
    free(img);
    p->ims[i] = (struct wk_g4_image){.pixels = p->px[i], .pos = p->pos[i], .info = info};
    p->total_rows += info.max_patches;
    p->total_tokens += info.soft_tokens;
  }
  /* the comparison covers padding: at least one image does not fill its budget */
  int padded = 0;
  for (int i = 0; i < N_CASES; i++)
    padded |= p->ims[i].info.n_patches < p->ims[i].info.max_patches &&
              p->ims[i].info.grid_w != p->ims[i].info.grid_h;
  TH_CHECK(padded);
}

static void release(struct prepared *p) {
  for (int i = 0; i < N_CASES; i++) {
    free(p->px[i]);
    free(p->pos[i]);
  }
}

static void check_against_reference(const char *python, enum md_st_dtype dt) {
  char dir[4096], err[512] = "";
  make_model(dir, sizeof(dir), 512, dt);
  struct kn_backend *be = wkt_cpu_backend(2);
  struct wk_vision_g4 *v = NULL, *v_small = NULL;
  if (wk_vision_g4_load(dir, be, NULL, &v, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "vision tower: %s", err);
    th_stop();
  }
  /* room for the largest image (1170 patches) or two smaller ones per pass:
   * the passes split differently */
  struct wk_vision_g4_opts small = {.max_patches = 1200};
  TH_REQUIRE(wk_vision_g4_load(dir, be, &small, &v_small, err, sizeof(err)) == 0);
  struct prepared p;
  prepare(&p, wk_vision_g4_config(v));
  int H = wk_vision_g4_text_hidden(v);
  size_t n_out = (size_t)p.total_tokens * H;
  float *got = malloc(n_out * sizeof(float)), *want = malloc(n_out * sizeof(float));
  float *again = malloc(n_out * sizeof(float));
  TH_REQUIRE(got && want && again);
  if (wk_vision_g4_encode(v, p.ims, N_CASES, got, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "encode: %s", err);
    th_stop();
  }
  /* the same bits one image per pass, and each image alone */
  if (wk_vision_g4_encode(v_small, p.ims, N_CASES, again, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "encode in smaller passes: %s", err);
    th_stop();
  }
  TH_CHECK(memcmp(got, again, n_out * sizeof(float)) == 0);
  size_t at = 0;
  for (int i = 0; i < N_CASES; i++) {
    TH_REQUIRE(wk_vision_g4_encode(v, &p.ims[i], 1, again, err, sizeof(err)) == 0);
    size_t k = (size_t)p.ims[i].info.soft_tokens * H;
    TH_CHECK(memcmp(again, got + at, k * sizeof(float)) == 0);
    at += k;
  }

  /* the reference reads the padded sequences, as transformers takes them */
  char px_path[4200], pos_path[4200], out_path[4200], script[4200], rows[128] = "", log[4096];
  snprintf(px_path, sizeof(px_path), "%s/pixels.f32", dir);
  snprintf(pos_path, sizeof(pos_path), "%s/positions.i32", dir);
  snprintf(out_path, sizeof(out_path), "%s/reference.f32", dir);
  snprintf(script, sizeof(script), "%s/reference/gemma4_vision_ref.py", th_tests_dir());
  FILE *fp = fopen(px_path, "wb"), *fq = fopen(pos_path, "wb");
  TH_REQUIRE(fp && fq);
  for (int i = 0; i < N_CASES; i++) {
    const struct md_g4_image *f = &p.ims[i].info;
    TH_REQUIRE(fwrite(p.px[i], sizeof(float) * f->patch_dim, (size_t)f->max_patches, fp) ==
               (size_t)f->max_patches);
    TH_REQUIRE(fwrite(p.pos[i], sizeof(int32_t) * 2, (size_t)f->max_patches, fq) ==
               (size_t)f->max_patches);
    size_t l = strlen(rows);
    snprintf(rows + l, sizeof(rows) - l, "%s%d", i ? "," : "", f->max_patches);
  }
  TH_REQUIRE(fclose(fp) == 0 && fclose(fq) == 0);
  char *argv[] = {(char *)python, script, dir, px_path, pos_path, rows, out_path, NULL};
  int rc = cm_run_capture(argv, log, sizeof(log));
  if (rc != 0) {
    th_fail(__FILE__, __LINE__, "gemma4_vision_ref.py exited with %d:\n%s", rc, log);
    th_stop();
  }
  TH_REQUIRE(wkt_read_f32(out_path, want, n_out) == 0);
  double lo, hi, worst = wkt_max_err(got, want, n_out, &lo, &hi);
  double rel = worst / (hi - lo);
  printf("Gemma 4 vision encoder (%s weights) vs gemma4_vision_ref.py: %d images (",
         md_st_dtype_name(dt), N_CASES);
  for (int i = 0; i < N_CASES; i++)
    printf("%s%dx%d px -> %dx%d patches of %d, %d tokens", i ? "; " : "", p.ims[i].info.width,
           p.ims[i].info.height, p.ims[i].info.grid_w, p.ims[i].info.grid_h,
           p.ims[i].info.max_patches, p.ims[i].info.soft_tokens);
  printf("), %zu values in [%.4f, %.4f], max abs error %.3g (%.3g of the range)\n", n_out, lo, hi,
         worst, rel);
  TH_CHECK(hi - lo > 0.1); /* the embeddings are not degenerate */
  if (!(rel < 1e-4))
    th_fail(__FILE__, __LINE__, "max abs error %g is %g of the range %g (limit 1e-4)", worst, rel,
            hi - lo);
  release(&p);
  free(got);
  free(want);
  free(again);
  wk_vision_g4_free(v);
  wk_vision_g4_free(v_small);
  kn_backend_destroy(be);
  cm_rmtree(dir);
}

TH_TEST(gemma4_vision_encoder_matches_numpy_reference) {
  const char *python = th_require_numpy("the Gemma 4 vision encoder", "gemma4_vision_ref.py");
  check_against_reference(python, MD_ST_F32);
  check_against_reference(python, MD_ST_BF16);
}

/* ---- refusals --------------------------------------------------------------------- */

TH_TEST(gemma4_vision_refuses_bad_input) {
  char dir[4096], err[512] = "";
  make_model(dir, sizeof(dir), 512, MD_ST_BF16);
  struct kn_backend *be = wkt_cpu_backend(1);
  struct wk_vision_g4 *v = NULL;
  TH_REQUIRE(wk_vision_g4_load(dir, be, NULL, &v, err, sizeof(err)) == 0);
  struct prepared p;
  prepare(&p, wk_vision_g4_config(v));
  float out[1];
  TH_CHECK_EQ_INT(wk_vision_g4_encode(v, NULL, 1, out, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(wk_vision_g4_encode(v, p.ims, -1, out, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(wk_vision_g4_encode(v, NULL, 0, NULL, err, sizeof(err)), 0);
  /* a grid that pooling does not tile, a shuffled position, a wrong patch size */
  struct wk_g4_image bad = p.ims[0];
  bad.info.grid_w -= 1;
  bad.info.n_patches = bad.info.grid_w * bad.info.grid_h;
  TH_CHECK_EQ_INT(wk_vision_g4_encode(v, &bad, 1, out, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK(strstr(err, "image 0") != NULL);
  p.pos[1][2] = 5;
  TH_CHECK_EQ_INT(wk_vision_g4_encode(v, p.ims, N_CASES, out, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK(strstr(err, "image 1") != NULL);
  bad = p.ims[2];
  bad.info.patch_dim = 3 * 14 * 14;
  TH_CHECK_EQ_INT(wk_vision_g4_encode(v, &bad, 1, out, err, sizeof(err)), CM_ERR_INVAL);
  release(&p);
  wk_vision_g4_free(v);
  /* a clipped linear without its bound, and the embedder missing, are refused by name */
  struct tl_tiny_opts o = {.arch = "gemma4", .preset = "tiny", .vocab = 512, .vision = 1};
  static const char *const drop[] = {"encoder.layers.1.mlp.up_proj.output_max",
                                     "embed_vision.embedding_projection.weight"};
  for (size_t d = 0; d < CM_ARRAY_LEN(drop); d++) {
    wkt_write_without(dir, &o, drop[d], 7, MD_ST_BF16);
    TH_CHECK_EQ_INT(wk_vision_g4_load(dir, be, NULL, &v, err, sizeof(err)), CM_ERR_NOENT);
    TH_CHECK(strstr(err, drop[d]) != NULL);
    TH_CHECK(v == NULL);
  }
  kn_backend_destroy(be);
  cm_rmtree(dir);
}
