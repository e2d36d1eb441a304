/* test-wk-vision.c — Gemma 3's image path on the worker:
 *   - config: vision_config / mm_tokens_per_image / image token ids and the
 *     preprocessor config parsed, defaults and bad values refused;
 *   - the generated multimodal checkpoint (make-tiny-model --arch gemma3
 *     --vision) loads as a text model and as a vision tower;
 *   - the encoder (SigLIP + projector, CPU backend) against
 *     tests/reference/siglip_ref.py, an independent numpy implementation
 *     written from transformers, run through python3 (skipped, loudly, without
 *     python3 or numpy); the same bits whether images share a pass or not;
 *   - preprocessing: Pillow's bilinear resize on cases worked out by hand from
 *     its definition, rescale and normalisation. */
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
#include "model/md-vision-preproc.h"
#include "tests/unit/worker/wk-test-util.h"
#include "worker/wk-model.h"
#include "worker/wk-vision.h"

/* ---- config ------------------------------------------------------------------ */

#define BASE_CFG                                                                                   \
    "{\"model_type\": \"gemma3\", \"mm_tokens_per_image\": %d, \"boi_token_index\": 255999,"       \
    " \"eoi_token_index\": 256000, \"image_token_index\": 262144,"                                 \
    " \"text_config\": {\"model_type\": \"gemma3_text\", \"vocab_size\": 262208,"                  \
    " \"hidden_size\": 2560, \"intermediate_size\": 10240, \"num_hidden_layers\": 34,"             \
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 4, \"head_dim\": 256},"                 \
    " \"vision_config\": {\"model_type\": \"siglip_vision_model\", \"hidden_size\": %d,"           \
    " \"image_size\": %d, \"intermediate_size\": 4304, \"num_attention_heads\": 16,"               \
    " \"num_hidden_layers\": 27, \"patch_size\": 14, \"vision_use_head\": false}}"

static int parse_cfg(struct md_config *c, int mm_tokens, int hidden, int image, char *err,
                     size_t errlen) {
  char text[2048];
  snprintf(text, sizeof(text), BASE_CFG, mm_tokens, hidden, image);
  return md_config_parse(text, strlen(text), c, err, errlen);
}

TH_TEST(vision_config_of_gemma3_4b) {
  struct md_config *c = malloc(sizeof(*c));
  char err[256] = "";
  TH_REQUIRE(c);
  /* gemma-3-4b's vision_config omits num_channels and layer_norm_eps: SigLIP's defaults */
  TH_REQUIRE(parse_cfg(c, 256, 1152, 896, err, sizeof(err)) == 0);
  const struct md_vision_cfg *v = &c->vision;
  TH_CHECK_EQ_INT(v->present, 1);
  TH_CHECK_EQ_INT(v->hidden, 1152);
  TH_CHECK_EQ_INT(v->ffn, 4304);
  TH_CHECK_EQ_INT(v->n_layers, 27);
  TH_CHECK_EQ_INT(v->n_heads, 16);
  TH_CHECK_EQ_INT(v->head_dim, 72);
  TH_CHECK_EQ_INT(v->channels, 3);
  TH_CHECK_EQ_INT(v->patch, 14);
  TH_CHECK_EQ_INT(v->grid, 64);
  TH_CHECK_EQ_INT(v->n_patches, 4096);
  TH_CHECK_EQ_INT(v->mm_tokens, 256);
  TH_CHECK_EQ_INT(v->pool, 4);
  TH_CHECK_EQ_INT(v->boi_id, 255999);
  TH_CHECK_EQ_INT(v->eoi_id, 256000);
  TH_CHECK_EQ_INT(v->image_id, 262144);
  TH_CHECK(v->eps == 1e-6);
  TH_CHECK_EQ_INT(v->pre.width, 896);
  TH_CHECK_EQ_INT(v->pre.height, 896);
  TH_CHECK(fabs(v->pre.rescale_factor - 1.0 / 255.0) < 1e-15);
  TH_CHECK(v->pre.mean[0] == 0.5f && v->pre.std[2] == 0.5f);
  TH_CHECK_EQ_INT(c->hidden, 2560); /* the text model is untouched */
  TH_CHECK_EQ_INT(c->n_layers, 34);

  /* the preprocessor config as gemma-3-4b-it ships it */
  const char *pre =
      "{\"do_convert_rgb\": null, \"do_normalize\": true, \"do_rescale\": true,"
      " \"do_resize\": true, \"image_mean\": [0.5, 0.5, 0.5],"
      " \"image_processor_type\": \"Gemma3ImageProcessor\", \"image_seq_length\": 256,"
      " \"image_std\": [0.25, 0.5, 0.5], \"resample\": 2,"
      " \"rescale_factor\": 0.00392156862745098,"
      " \"size\": {\"height\": 896, \"width\": 896}}";
  TH_CHECK_EQ_INT(md_config_parse_preproc(pre, strlen(pre), 0, c, err, sizeof(err)), 0);
  TH_CHECK(c->vision.pre.std[0] == 0.25f);
  /* the newer processor_config.json nests it */
  const char *nested = "{\"image_processor\": {\"image_mean\": 0.25, \"size\": {\"height\": 896,"
                       " \"width\": 896}}, \"processor_class\": \"Gemma3Processor\"}";
  TH_CHECK_EQ_INT(md_config_parse_preproc(nested, strlen(nested), 1, c, err, sizeof(err)), 0);
  TH_CHECK(c->vision.pre.mean[1] == 0.25f && c->vision.pre.std[0] == 0.25f);
  /* the tower takes image_size only */
  const char *wrong = "{\"size\": {\"height\": 224, \"width\": 224}}";
  TH_CHECK_EQ_INT(md_config_parse_preproc(wrong, strlen(wrong), 0, c, err, sizeof(err)),
                  CM_ERR_INVAL);
  TH_CHECK(strstr(err, "preprocessor_config.json") && strstr(err, "896"));
  /* a zero std, a short mean, bicubic resampling, a field of the wrong type */
  static const struct {
    const char *json;
    int code;
    const char *names; /* NULL: whatever the error says */
  } bad[] = {
      {"{\"image_std\": [0.5, 0, 0.5]}", CM_ERR_RANGE, NULL},
      {"{\"image_mean\": [0.5, 0.5]}", CM_ERR_SHAPE, NULL},
      {"{\"resample\": 3}", CM_ERR_UNSUPPORTED, NULL},
      {"{\"do_resize\": 1}", CM_ERR_PARSE, "preprocessor_config.json: do_resize"},
  };
  for (size_t i = 0; i < CM_ARRAY_LEN(bad); i++) {
    int rc = md_config_parse_preproc(bad[i].json, strlen(bad[i].json), 0, c, err, sizeof(err));
    if (rc != bad[i].code || (bad[i].names && !strstr(err, bad[i].names)))
      th_fail(__FILE__, __LINE__, "%s: %d '%s' (want %d)", bad[i].json, rc, err, bad[i].code);
  }
  free(c);
}

TH_TEST(vision_config_refuses_bad_shapes) {
  struct md_config *c = malloc(sizeof(*c));
  char err[256] = "";
  TH_REQUIRE(c);
  /* not a square */
  TH_CHECK_EQ_INT(parse_cfg(c, 250, 1152, 896, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK(strstr(err, "mm_tokens_per_image") != NULL);
  /* more tokens than patches */
  TH_CHECK_EQ_INT(parse_cfg(c, 8192, 1152, 896, err, sizeof(err)), CM_ERR_RANGE);
  /* heads do not divide the width */
  TH_CHECK_EQ_INT(parse_cfg(c, 256, 1150, 896, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK(strstr(err, "vision_config.hidden_size") != NULL);
  /* another grid: 448 / 14 = 32 patches a side pooled by 2 to 16 */
  TH_CHECK_EQ_INT(parse_cfg(c, 256, 1152, 448, err, sizeof(err)), 0);
  TH_CHECK_EQ_INT(c->vision.grid, 32);
  TH_CHECK_EQ_INT(c->vision.pool, 2);
  TH_CHECK_EQ_INT(c->vision.pre.width, 448);
  /* a text-only gemma3 config has no tower */
  const char *text_only = "{\"model_type\": \"gemma3\", \"text_config\": {\"model_type\": "
                          "\"gemma3_text\", \"vocab_size\": 512, \"hidden_size\": 64, "
                          "\"intermediate_size\": 128, \"num_hidden_layers\": 2, "
                          "\"num_attention_heads\": 2}}";
  TH_CHECK_EQ_INT(md_config_parse(text_only, strlen(text_only), c, err, sizeof(err)), 0);
  TH_CHECK_EQ_INT(c->vision.present, 0);
  const char *bad_vc = "{\"model_type\": \"gemma3\", \"vision_config\": {\"hidden_size\": \"x\"},"
                       " \"text_config\": {\"vocab_size\": 512, \"hidden_size\": 64, "
                       "\"intermediate_size\": 128, \"num_hidden_layers\": 2, "
                       "\"num_attention_heads\": 2}}";
  TH_CHECK_EQ_INT(md_config_parse(bad_vc, strlen(bad_vc), c, err, sizeof(err)), CM_ERR_PARSE);
  TH_CHECK(strstr(err, "vision_config.hidden_size") != NULL);
  free(c);
}

/* ---- the generated checkpoint ---------------------------------------------------- */

/* A generated multimodal checkpoint (weights of dtype dt) in a new directory. */
static void make_vision_model_dt(char *dir, size_t n, int vocab, enum md_st_dtype dt) {
  struct tl_tiny_opts o = {.arch = "gemma3", .preset = "tiny", .vocab = vocab, .vision = 1};
  wkt_make_tiny(dir, n, &o, 7, dt);
}

static void make_vision_model(char *dir, size_t n, int vocab) {
  make_vision_model_dt(dir, n, vocab, MD_ST_F32);
}

TH_TEST(tiny_vision_checkpoint_loads) {
  char dir[4096], err[512] = "";
  make_vision_model(dir, sizeof(dir), 262144);
  struct md_config *c = malloc(sizeof(*c));
  TH_REQUIRE(c);
  TH_REQUIRE(md_config_load(dir, c, err, sizeof(err)) == 0);
  /* 262144 becomes Gemma 3's 262208 so that <image_soft_token> is inside */
  TH_CHECK_EQ_INT(c->vocab, 262208);
  TH_CHECK_EQ_INT(c->vision.present, 1);
  TH_CHECK_EQ_INT(c->vision.image_size, 64);
  TH_CHECK_EQ_INT(c->vision.patch, 8);
  TH_CHECK_EQ_INT(c->vision.n_patches, 64);
  TH_CHECK_EQ_INT(c->vision.mm_tokens, 16);
  TH_CHECK_EQ_INT(c->vision.pool, 2);
  TH_CHECK_EQ_INT(c->vision.image_id, 262144);
  TH_CHECK_EQ_INT(c->vision.pre.width, 64);
  free(c);
  struct kn_backend *be = wkt_cpu_backend(2);
  wkt_check_text_model(dir, be);
  struct wk_vision *v = NULL;
  if (wk_vision_load(dir, be, NULL, &v, err, sizeof(err)))
    th_fail(__FILE__, __LINE__, "vision tower: %s", err);
  if (v) TH_CHECK_EQ_INT(wk_vision_text_hidden(v), 64);
  wk_vision_free(v);
  cm_rmtree(dir);
  /* a text-only checkpoint has no tower */
  TH_REQUIRE(wkt_make_model(dir, sizeof(dir), "gemma3", 0, 0, MD_ST_F32, 1) == 0);
  TH_CHECK_EQ_INT(wk_vision_load(dir, be, NULL, &v, err, sizeof(err)), CM_ERR_UNSUPPORTED);
  TH_CHECK(v == NULL);
  cm_rmtree(dir);
  kn_backend_destroy(be);
}

/* ---- the encoder against the numpy reference --------------------------------------- */

/* f32 weights, and bf16 ones (the reference widens them exactly, as we do) */
static void check_against_reference(const char *python, enum md_st_dtype dt) {
  char dir[4096], err[512] = "";
  make_vision_model_dt(dir, sizeof(dir), 512, dt);
  struct kn_backend *be = wkt_cpu_backend(2);
  struct wk_vision *v = NULL;
  /* 3 images, 2 per pass: a full pass and a partial one */
  struct wk_vision_opts vo = {.max_images = 2};
  if (wk_vision_load(dir, be, &vo, &v, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "vision tower: %s", err);
    th_stop();
  }
  const struct md_vision_cfg *vc = wk_vision_config(v);
  int n = 3, C = vc->channels, S = vc->image_size, M = vc->mm_tokens;
  int H = wk_vision_text_hidden(v);
  size_t n_px = (size_t)n * C * S * S, n_out = (size_t)n * M * H;
  float *px = malloc(n_px * sizeof(float)), *got = malloc(n_out * sizeof(float));
  float *want = malloc(n_out * sizeof(float)), *one = malloc((size_t)M * H * sizeof(float));
  TH_REQUIRE(px && got && want && one);
  wkt_fill_pixels(px, n, C, S, 0x5eed);
  if (wk_vision_encode(v, px, n, got, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "encode: %s", err);
    th_stop();
  }
  /* each image alone gives the same bits as in its pass */
  for (int i = 0; i < n; i++) {
    TH_REQUIRE(wk_vision_encode(v, px + (size_t)i * C * S * S, 1, one, err, sizeof(err)) == 0);
    TH_CHECK(memcmp(one, got + (size_t)i * M * H, (size_t)M * H * sizeof(float)) == 0);
  }

  char px_path[4200], out_path[4200], script[4200], count[16], log[4096];
  snprintf(px_path, sizeof(px_path), "%s/pixels.f32", dir);
  snprintf(out_path, sizeof(out_path), "%s/reference.f32", dir);
  snprintf(script, sizeof(script), "%s/reference/siglip_ref.py", th_tests_dir());
  snprintf(count, sizeof(count), "%d", n);
  TH_REQUIRE(wkt_write_file(px_path, px, n_px * sizeof(float)) == 0);
  char *argv[] = {(char *)python, script, dir, px_path, count, out_path, NULL};
  int rc = cm_run_capture(argv, log, sizeof(log));
  if (rc != 0) {
    th_fail(__FILE__, __LINE__, "siglip_ref.py exited with %d:\n%s", rc, log);
    th_stop();
  }
  TH_REQUIRE(wkt_read_f32(out_path, want, n_out) == 0);
  double lo = INFINITY, hi = -INFINITY, worst = 0.0;
  for (size_t i = 0; i < n_out; i++) {
    lo = fmin(lo, want[i]);
    hi = fmax(hi, want[i]);
    double e = fabs((double)got[i] - (double)want[i]);
    if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
  }
  double rel = worst / (hi - lo);
  printf("vision encoder (%s weights) vs siglip_ref.py: %zu values in [%.4f, %.4f], max abs error "
         "%.3g "
         "(%.3g of the range)\n",
         md_st_dtype_name(dt), n_out, lo, hi, worst, rel);
  TH_CHECK(hi - lo > 0.1); /* the embeddings are not degenerate */
  if (!(rel < 1e-4))
    th_fail(__FILE__, __LINE__, "max abs error %g is %g of the range %g (limit 1e-4)", worst, rel,
            hi - lo);
  free(px);
  free(got);
  free(want);
  free(one);
  wk_vision_free(v);
  kn_backend_destroy(be);
  cm_rmtree(dir);
}

TH_TEST(vision_encoder_matches_numpy_reference) {
  const char *python = th_require_numpy("the vision encoder", "siglip_ref.py");
  check_against_reference(python, MD_ST_F32);
  check_against_reference(python, MD_ST_BF16);
}

TH_TEST(vision_encode_rejects_bad_arguments) {
  char dir[4096], err[512] = "";
  make_vision_model(dir, sizeof(dir), 512);
  struct kn_backend *be = wkt_cpu_backend(1);
  struct wk_vision *v = NULL;
  TH_REQUIRE(wk_vision_load(dir, be, NULL, &v, err, sizeof(err)) == 0);
  float x[4];
  TH_CHECK_EQ_INT(wk_vision_encode(v, NULL, 1, x, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(wk_vision_encode(v, x, -1, x, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(wk_vision_encode(v, NULL, 0, NULL, err, sizeof(err)), 0);
  wk_vision_free(v);
  /* a tower whose projector is missing is refused by name */
  char path[4200];
  snprintf(path, sizeof(path), "%s/config.json", dir);
  struct tl_tiny_opts o = {.arch = "gemma3", .preset = "tiny", .vocab = 512, .vision = 1};
  wkt_write_without(dir, &o, "mm_input_projection_weight", 7, MD_ST_BF16);
  TH_CHECK_EQ_INT(wk_vision_load(dir, be, NULL, &v, err, sizeof(err)), CM_ERR_NOENT);
  TH_CHECK(strstr(err, "mm_input_projection_weight") != NULL);
  TH_CHECK(v == NULL);
  kn_backend_destroy(be);
  cm_rmtree(dir);
}

/* ---- preprocessing ------------------------------------------------------------------- */

/* Pillow's BILINEAR worked out by hand from its definition (triangle filter,
 * support widened by the downscale factor, centres at (o + 0.5) * scale). */
TH_TEST(resize_matches_pillow_by_hand) {
  /* 4 -> 2 (scale 2, support 2): out 0 = (3a + 3b + c) / 7, out 1 = (b + 3c + 3d) / 7 */
  uint8_t row[4] = {10, 20, 30, 40}, out2[2];
  TH_CHECK_EQ_INT(md_image_resize_bilinear(out2, 2, 1, row, 4, 1, 1), 0);
  TH_CHECK_EQ_INT(out2[0], 17); /* 120 / 7 = 17.14 */
  TH_CHECK_EQ_INT(out2[1], 33); /* 230 / 7 = 32.86 */
  /* 2 -> 4 (scale 0.5, support 1): a, (3a + b) / 4, (a + 3b) / 4, b */
  uint8_t two[2] = {0, 100}, out4[4];
  TH_CHECK_EQ_INT(md_image_resize_bilinear(out4, 4, 1, two, 2, 1, 1), 0);
  TH_CHECK(out4[0] == 0 && out4[1] == 25 && out4[2] == 75 && out4[3] == 100);
  /* the same along columns, with 3 interleaved channels kept apart */
  uint8_t col[4 * 3], outc[2 * 3];
  for (int i = 0; i < 4; i++) {
    col[3 * i] = row[i];
    col[3 * i + 1] = (uint8_t)(255 - row[i]);
    col[3 * i + 2] = 7;
  }
  TH_CHECK_EQ_INT(md_image_resize_bilinear(outc, 1, 2, col, 1, 4, 3), 0);
  TH_CHECK(outc[0] == 17 && outc[3] == 33);
  TH_CHECK(outc[1] == 238 && outc[4] == 222); /* (255 * 7 - 120) / 7, (255 * 7 - 230) / 7 */
  TH_CHECK(outc[2] == 7 && outc[5] == 7);
  /* both axes: a constant image stays constant, any size */
  uint8_t flat[37 * 23 * 3], outf[64 * 64 * 3];
  memset(flat, 200, sizeof(flat));
  TH_CHECK_EQ_INT(md_image_resize_bilinear(outf, 64, 64, flat, 37, 23, 3), 0);
  int constant = 1;
  for (size_t i = 0; i < sizeof(outf); i++)
    constant &= outf[i] == 200;
  TH_CHECK(constant);
  /* the same size is a copy */
  TH_CHECK_EQ_INT(md_image_resize_bilinear(outf, 37, 23, flat, 37, 23, 3), 0);
  TH_CHECK(memcmp(outf, flat, sizeof(flat)) == 0);
  TH_CHECK_EQ_INT(md_image_resize_bilinear(outf, 0, 4, flat, 4, 4, 3), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(md_image_resize_bilinear(outf, 4, 4, flat, 4, 4, 5), CM_ERR_INVAL);
}

TH_TEST(preprocess_rescales_and_normalises) {
  struct md_preproc_cfg pre = {.width = 2,
                               .height = 2,
                               .do_resize = 1,
                               .resample = 2,
                               .do_rescale = 1,
                               .rescale_factor = 1.0 / 255.0,
                               .do_normalize = 1,
                               .mean = {0.5f, 0.5f, 0.5f},
                               .std = {0.5f, 0.5f, 0.25f}};
  /* 2 x 2 RGB, channels interleaved */
  uint8_t img[12] = {0, 255, 128, 255, 0, 64, 10, 20, 30, 40, 50, 60};
  float out[12];
  char err[256];
  TH_REQUIRE(md_image_preprocess(out, img, 2, 2, 3, &pre, err, sizeof(err)) == 0);
  /* channels first: out[c * 4 + pixel] */
  for (int c = 0; c < 3; c++)
    for (int p = 0; p < 4; p++) {
      float r = (float)((double)img[p * 3 + c] * (1.0 / 255.0));
      float want = (r - pre.mean[c]) / pre.std[c];
      TH_CHECK(out[c * 4 + p] == want);
    }
  TH_CHECK(out[0] == -1.0f && out[4] == 1.0f && out[1] == 1.0f);
  /* a 4 x 4 image is resized first: constant stays constant */
  uint8_t big[4 * 4 * 3];
  memset(big, 255, sizeof(big));
  TH_REQUIRE(md_image_preprocess(out, big, 4, 4, 3, &pre, err, sizeof(err)) == 0);
  TH_CHECK(out[0] == 1.0f && out[11] == 2.0f);
  /* without do_resize the size must already be right */
  pre.do_resize = 0;
  TH_CHECK_EQ_INT(md_image_preprocess(out, big, 4, 4, 3, &pre, err, sizeof(err)), CM_ERR_SHAPE);
  TH_CHECK_EQ_INT(md_image_preprocess(out, big, 0, 4, 3, &pre, err, sizeof(err)), CM_ERR_INVAL);
  /* no rescale, no normalisation: the raw values */
  pre.do_rescale = pre.do_normalize = 0;
  TH_REQUIRE(md_image_preprocess(out, img, 2, 2, 3, &pre, err, sizeof(err)) == 0);
  TH_CHECK(out[0] == 0.0f && out[1] == 255.0f && out[4] == 255.0f);
}
