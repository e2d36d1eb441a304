/* test-md-vision-g4.c — Gemma 4's vision_config and processor config (read,
 * defaults, every bad field refused by name) and its image preprocessing against
 * tests/reference/gemma4_image_ref.py (numpy, run through python3; skipped,
 * loudly, without python3 or numpy): target sizes for many shapes and every
 * budget (exact, refusals included), patch positions and padding (exact),
 * pixel values on gradients, checkerboards and noise, tiny, very wide and
 * very tall images (exact: both sides compute Pillow's fixed-point bicubic;
 * the check allows one 8-bit level on 1 value in 10^4 so that a coefficient
 * rounded the other way at a tie would not fail it), and how far
 * torchvision's float resize lies from ours (printed). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-fs.h"
#include "common/cm-proc.h"
#include "model/md-config.h"
#include "model/md-vision-g4.h"
#include "model/md-vision-preproc.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/unit/model/md-test-util.h"

/* ---- config ------------------------------------------------------------------ */

/* A gemma4 config: a small text stack, then `vision` (the vision_config member
 * and any top-level fields after it, or "" for none). */
static void g4_json(char *buf, size_t n, const char *text_extra, const char *vision) {
  snprintf(buf, n,
           "{\"model_type\":\"gemma4\",\"text_config\":{\"model_type\":\"gemma4_text\","
           "\"vocab_size\":262144,\"hidden_size\":64,\"intermediate_size\":128,"
           "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"num_key_value_heads\":1,"
           "\"head_dim\":32,\"global_head_dim\":64,"
           "\"layer_types\":[\"sliding_attention\",\"full_attention\"]%s}%s%s}",
           text_extra, *vision ? "," : "", vision);
}

static int parse(const char *json, struct md_config *c, char *err) {
  return md_config_parse(json, strlen(json), c, err, 256);
}

TH_TEST(g4_vision_config_e2b) {
  char j[4096], err[256] = "";
  g4_json(j, sizeof(j), ",\"use_bidirectional_attention\":\"vision\"",
          "\"vision_config\":{\"model_type\":\"gemma4_vision\",\"hidden_size\":768,"
          "\"intermediate_size\":3072,\"num_hidden_layers\":16,\"num_attention_heads\":12,"
          "\"num_key_value_heads\":12,\"head_dim\":64,\"hidden_activation\":\"gelu_pytorch_tanh\","
          "\"rms_norm_eps\":1e-06,\"max_position_embeddings\":131072,\"attention_bias\":false,"
          "\"attention_dropout\":0.0,\"rope_parameters\":{\"rope_type\":\"default\","
          "\"rope_theta\":100.0},\"pooling_kernel_size\":3,\"patch_size\":16,"
          "\"position_embedding_size\":10240,\"use_clipped_linears\":true,\"standardize\":false,"
          "\"default_output_length\":280},\"boi_token_id\":255999,\"eoi_token_id\":258882,"
          "\"image_token_id\":258880");
  struct md_config c;
  TH_REQUIRE(parse(j, &c, err) == 0);
  const struct md_vision_g4_cfg *v = &c.vision_g4;
  TH_CHECK_EQ_INT(c.arch, MD_ARCH_GEMMA4);
  TH_CHECK_EQ_INT(c.vision.present, 0); /* never taken for Gemma 3's tower */
  TH_CHECK_EQ_INT(v->present, 1);
  TH_CHECK_EQ_INT(v->hidden, 768);
  TH_CHECK_EQ_INT(v->ffn, 3072);
  TH_CHECK_EQ_INT(v->n_layers, 16);
  TH_CHECK_EQ_INT(v->n_heads, 12);
  TH_CHECK_EQ_INT(v->n_kv_heads, 12);
  TH_CHECK_EQ_INT(v->head_dim, 64);
  TH_CHECK_EQ_INT(v->patch, 16);
  TH_CHECK_EQ_INT(v->pool, 3);
  TH_CHECK_EQ_INT(v->pos_size, 10240);
  TH_CHECK_EQ_INT(v->default_tokens, 280);
  TH_CHECK_EQ_INT(v->max_pos, 131072);
  TH_CHECK_NEAR(v->eps, 1e-6, 0);
  TH_CHECK_NEAR(v->rope_theta, 100.0, 0);
  TH_CHECK_EQ_INT(v->clipped_linears, 1);
  TH_CHECK_EQ_INT(v->standardize, 0);
  TH_CHECK_EQ_INT(v->bidir, 1);
  TH_CHECK_EQ_INT(v->boi_id, 255999);
  TH_CHECK_EQ_INT(v->eoi_id, 258882);
  TH_CHECK_EQ_INT(v->image_id, 258880);

  /* an empty vision_config takes Gemma4VisionConfig's defaults */
  g4_json(j, sizeof(j), "", "\"vision_config\":{},\"image_token_id\":7");
  TH_REQUIRE(parse(j, &c, err) == 0);
  TH_CHECK_EQ_INT(v->present, 1);
  TH_CHECK_EQ_INT(v->n_layers, 16);
  TH_CHECK_EQ_INT(v->n_kv_heads, 12);
  TH_CHECK_EQ_INT(v->default_tokens, 280);
  TH_CHECK_NEAR(v->rope_theta, 100.0, 0);
  TH_CHECK_EQ_INT(v->bidir, 0);
  TH_CHECK_EQ_INT(v->clipped_linears, 0);
  TH_CHECK_EQ_INT(v->image_id, 7);
  TH_CHECK_EQ_INT(v->boi_id, 255999);

  /* none (or null): text only */
  g4_json(j, sizeof(j), "", "");
  TH_REQUIRE(parse(j, &c, err) == 0);
  TH_CHECK_EQ_INT(v->present, 0);
  g4_json(j, sizeof(j), "", "\"vision_config\":null");
  TH_REQUIRE(parse(j, &c, err) == 0);
  TH_CHECK_EQ_INT(v->present, 0);

  /* a gemma3 checkpoint's SigLIP tower is still read as before */
  const char *g3 = "{\"model_type\":\"gemma3\",\"text_config\":{\"model_type\":\"gemma3_text\","
                   "\"vocab_size\":262208,\"hidden_size\":64,\"intermediate_size\":128,"
                   "\"num_hidden_layers\":2,\"num_attention_heads\":2},\"vision_config\":"
                   "{\"image_size\":896,\"patch_size\":14,\"hidden_size\":1152,"
                   "\"num_attention_heads\":16}}";
  TH_REQUIRE(parse(g3, &c, err) == 0);
  TH_CHECK_EQ_INT(c.vision.present, 1);
  TH_CHECK_EQ_INT(c.vision.grid, 64);
  TH_CHECK_EQ_INT(v->present, 0);
}

TH_TEST(g4_vision_config_refusals_name_the_field) {
  static const struct {
    const char *text_extra, *vision, *names;
  } cases[] = {
      {"", "\"vision_config\":[]", "vision_config"},
      {"", "\"vision_config\":{\"model_type\":\"siglip_vision_model\"}",
       "vision_config.model_type"},
      {"", "\"vision_config\":{\"hidden_size\":0}", "vision_config.hidden_size"},
      {"", "\"vision_config\":{\"hidden_size\":\"768\"}", "vision_config.hidden_size"},
      {"", "\"vision_config\":{\"intermediate_size\":-1}", "vision_config.intermediate_size"},
      {"", "\"vision_config\":{\"num_hidden_layers\":100000}", "vision_config.num_hidden_layers"},
      {"", "\"vision_config\":{\"num_attention_heads\":0}", "vision_config.num_attention_heads"},
      {"", "\"vision_config\":{\"num_attention_heads\":12,\"num_key_value_heads\":5}",
       "num_key_value_heads"},
      {"", "\"vision_config\":{\"num_attention_heads\":4,\"num_key_value_heads\":8}",
       "vision_config.num_key_value_heads"},
      {"", "\"vision_config\":{\"head_dim\":62}", "vision_config.head_dim"},
      {"", "\"vision_config\":{\"head_dim\":1024}", "vision_config.head_dim"},
      {"", "\"vision_config\":{\"patch_size\":0}", "vision_config.patch_size"},
      {"", "\"vision_config\":{\"pooling_kernel_size\":1.5}", "vision_config.pooling_kernel_size"},
      {"", "\"vision_config\":{\"position_embedding_size\":0}",
       "vision_config.position_embedding_size"},
      {"", "\"vision_config\":{\"default_output_length\":256}",
       "vision_config.default_output_length"},
      {"", "\"vision_config\":{\"default_output_length\":0}",
       "vision_config.default_output_length"},
      {"", "\"vision_config\":{\"rms_norm_eps\":-1}", "vision_config.rms_norm_eps"},
      {"", "\"vision_config\":{\"hidden_activation\":\"relu\"}", "vision_config.hidden_activation"},
      {"", "\"vision_config\":{\"use_clipped_linears\":1}", "vision_config.use_clipped_linears"},
      {"", "\"vision_config\":{\"standardize\":\"no\"}", "vision_config.standardize"},
      {"", "\"vision_config\":{\"attention_bias\":true}", "vision_config.attention_bias"},
      {"", "\"vision_config\":{\"rope_parameters\":7}", "vision_config.rope_parameters"},
      {"", "\"vision_config\":{\"rope_parameters\":{\"rope_type\":\"linear\"}}",
       "vision_config.rope_parameters.rope_type"},
      {"", "\"vision_config\":{\"rope_parameters\":{\"rope_theta\":\"x\"}}",
       "vision_config.rope_parameters.rope_theta"},
      {",\"use_bidirectional_attention\":\"images\"", "\"vision_config\":{}",
       "text_config.use_bidirectional_attention"},
      {"", "\"vision_config\":{},\"boi_token_id\":-3", "boi_token_id"},
      {"", "\"vision_config\":{},\"eoi_token_id\":\"x\"", "eoi_token_id"},
      {"", "\"vision_config\":{},\"image_token_id\":262144", "image_token_id"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char j[4096], err[256] = "";
    g4_json(j, sizeof(j), cases[i].text_extra, cases[i].vision);
    struct md_config c;
    int rc = parse(j, &c, err);
    if (rc >= 0 || !strstr(err, cases[i].names))
      th_fail(__FILE__, __LINE__, "case %zu (%s): rc %d, \"%s\" does not name %s", i,
              cases[i].vision, rc, err, cases[i].names);
  }
}

static int preproc(const char *json, int nested, struct md_config *c, char *err) {
  return md_config_parse_preproc_g4(json, strlen(json), nested, c, err, 256);
}

TH_TEST(g4_processor_config) {
  char j[4096], err[256] = "";
  struct md_config c;
  g4_json(j, sizeof(j), "", "\"vision_config\":{}");
  TH_REQUIRE(parse(j, &c, err) == 0);
  /* processor_config.json as transformers saves it */
  const char *e2b = "{\"image_processor\":{\"do_convert_rgb\":true,\"do_normalize\":false,"
                    "\"do_rescale\":true,\"do_resize\":true,\"image_mean\":[0.0,0.0,0.0],"
                    "\"image_processor_type\":\"Gemma4ImageProcessor\",\"image_std\":[1.0,1.0,"
                    "1.0],\"max_soft_tokens\":560,\"patch_size\":16,\"pooling_kernel_size\":3,"
                    "\"resample\":3,\"rescale_factor\":0.00392156862745098},"
                    "\"processor_class\":\"Gemma4Processor\"}";
  TH_REQUIRE(preproc(e2b, 1, &c, err) == 0);
  TH_CHECK_EQ_INT(c.vision_g4.default_tokens, 560);
  TH_REQUIRE(preproc("{\"max_soft_tokens\":70}", 0, &c, err) == 0);
  TH_CHECK_EQ_INT(c.vision_g4.default_tokens, 70);
  TH_REQUIRE(preproc("{\"processor_class\":\"x\"}", 1, &c, err) == 0);
  TH_CHECK_EQ_INT(c.vision_g4.default_tokens, 70);
  static const struct {
    const char *json, *names;
  } bad[] = {
      {"{\"image_processor\":{\"max_soft_tokens\":300}}", "image_processor.max_soft_tokens"},
      {"{\"image_processor\":{\"max_soft_tokens\":\"280\"}}", "image_processor.max_soft_tokens"},
      {"{\"image_processor\":{\"patch_size\":14}}", "image_processor.patch_size"},
      {"{\"image_processor\":{\"pooling_kernel_size\":4}}", "pooling_kernel_size"},
      {"{\"image_processor\":{\"resample\":2}}", "image_processor.resample"},
      {"{\"image_processor\":{\"resample\":9}}", "image_processor.resample"},
      {"{\"image_processor\":{\"do_normalize\":true}}", "do_normalize"},
      {"{\"image_processor\":{\"do_rescale\":\"yes\"}}", "image_processor.do_rescale"},
      {"{\"image_processor\":{\"rescale_factor\":0.5}}", "rescale_factor"},
      {"{\"image_processor\":3}", "image_processor"},
      {"{\"image_processor\":", "processor_config.json: line"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    int rc = preproc(bad[i].json, 1, &c, err);
    if (rc >= 0 || !strstr(err, bad[i].names) || !strstr(err, "processor_config.json"))
      th_fail(__FILE__, __LINE__, "case %zu (%s): rc %d, \"%s\" does not name %s", i, bad[i].json,
              rc, err, bad[i].names);
    TH_CHECK_EQ_INT(c.vision_g4.default_tokens, 70); /* untouched */
  }
  /* a Gemma 3 (or text-only) config has no Gemma 4 tower to configure */
  g4_json(j, sizeof(j), "", "");
  TH_REQUIRE(parse(j, &c, err) == 0);
  TH_CHECK_EQ_INT(preproc("{}", 0, &c, err), CM_ERR_STATE);

  /* md_config_load reads it from the checkpoint folder */
  char dir[4096];
  TH_REQUIRE(th_tmpdir("g4-config", dir, sizeof(dir)) == 0);
  g4_json(j, sizeof(j), "", "\"vision_config\":{}");
  mdt_write_text(dir, "config.json", j);
  TH_REQUIRE(md_config_load(dir, &c, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT(c.vision_g4.default_tokens, 280);
  mdt_write_text(dir, "processor_config.json", e2b);
  TH_REQUIRE(md_config_load(dir, &c, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT(c.vision_g4.default_tokens, 560);
  TH_CHECK_EQ_INT(c.vision.present, 0);
  mdt_write_text(dir, "processor_config.json", "{\"image_processor\":{\"max_soft_tokens\":100}}");
  TH_CHECK_EQ_INT(md_config_load(dir, &c, err, sizeof(err)), CM_ERR_RANGE);
  TH_CHECK(strstr(err, "processor_config.json: image_processor.max_soft_tokens 100") != NULL);
  cm_rmtree(dir);
}

/* ---- sizes -------------------------------------------------------------------- */

static const int budgets[] = {70, 140, 280, 560, 1120};

TH_TEST(g4_image_budget_refused) {
  static const int bad[] = {0, -1, 1, 69, 71, 256, 279, 281, 1119, 1121, 2240};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    char err[256] = "";
    int w = 0, h = 0;
    TH_CHECK_EQ_INT(md_g4_image_size(640, 480, 16, 3, bad[i], &w, &h, err, sizeof(err)),
                    CM_ERR_INVAL);
    TH_CHECK(strstr(err, "max_soft_tokens") != NULL);
    TH_CHECK(strstr(err, "70, 140, 280, 560, 1120") != NULL);
  }
  for (size_t i = 0; i < 5; i++)
    TH_CHECK(md_g4_soft_tokens_allowed(budgets[i]));
  /* through the plan, and the config's default when the request names none */
  char j[4096], err[256] = "";
  g4_json(j, sizeof(j), "", "\"vision_config\":{\"default_output_length\":70}");
  struct md_config c;
  TH_REQUIRE(parse(j, &c, err) == 0);
  struct md_g4_image im;
  TH_CHECK_EQ_INT(md_g4_image_plan(&im, 640, 480, &c.vision_g4, 100, err, sizeof(err)),
                  CM_ERR_INVAL);
  TH_CHECK(strstr(err, "max_soft_tokens 100") != NULL);
  TH_REQUIRE(md_g4_image_plan(&im, 640, 480, &c.vision_g4, 0, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT(im.max_patches, 70 * 9);
  TH_REQUIRE(md_g4_image_plan(&im, 640, 480, &c.vision_g4, 1120, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT(im.max_patches, 1120 * 9);
  /* a grid wider than the position table */
  c.vision_g4.pos_size = 100;
  TH_CHECK_EQ_INT(md_g4_image_plan(&im, 1, 4000, &c.vision_g4, 280, err, sizeof(err)),
                  CM_ERR_RANGE);
  TH_CHECK(strstr(err, "position table") != NULL);
  /* sizes no image has */
  int w, h;
  TH_CHECK_EQ_INT(md_g4_image_size(0, 10, 16, 3, 280, &w, &h, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(md_g4_image_size(10, MD_IMAGE_MAX_SIDE + 1, 16, 3, 280, &w, &h, err, sizeof(err)),
                  CM_ERR_INVAL);
}

static void run_reference(const char *python, const char *mode, const char *a, const char *b) {
  char script[4200], log[8192];
  snprintf(script, sizeof(script), "%s/reference/gemma4_image_ref.py", th_tests_dir());
  char *argv[] = {(char *)python, script, (char *)mode, (char *)a, (char *)b, NULL};
  if (!b) argv[4] = NULL;
  int rc = cm_run_capture(argv, log, sizeof(log));
  if (rc != 0) {
    th_fail(__FILE__, __LINE__, "gemma4_image_ref.py %s exited with %d:\n%s", mode, rc, log);
    th_stop();
  }
}

/* w, h pairs: squares, landscapes and portraits, primes, tiny, very wide and
 * very tall (the sides that floor to 0), and the largest accepted side. */
static const int shapes[][2] = {
    {1, 1},         {2, 3},       {3, 2},       {7, 5},     {16, 16},   {47, 48},    {48, 48},
    {100, 100},     {224, 224},   {640, 480},   {480, 640}, {768, 768}, {800, 600},  {1024, 768},
    {1920, 1080},   {1080, 1920}, {4032, 3024}, {997, 991}, {1000, 1},  {1, 1000},   {4000, 7},
    {7, 4000},      {3000, 9},    {9, 3000},    {300, 20},  {20, 300},  {65536, 1},  {1, 65536},
    {65536, 65536}, {65536, 300}, {300, 65536}, {5000, 40}, {40, 5000}, {2500, 100}, {100, 2500},
    {1366, 768},    {768, 1366},  {333, 1},     {1, 333},   {96, 48},   {48, 96},    {12345, 678},
};

TH_TEST(g4_image_sizes_match_reference) {
  const char *python = th_require_numpy("Gemma 4's image preprocessing", "gemma4_image_ref.py");
  char dir[4096], cases[4200], out[4200];
  TH_REQUIRE(th_tmpdir("g4-sizes", dir, sizeof(dir)) == 0);
  snprintf(cases, sizeof(cases), "%s/cases.txt", dir);
  snprintf(out, sizeof(out), "%s/sizes.txt", dir);
  size_t n_shapes = sizeof(shapes) / sizeof(shapes[0]);
  /* plus a sweep of aspect ratios around the floors */
  FILE *f = fopen(cases, "w");
  TH_REQUIRE(f != NULL);
  int n = 0;
  for (size_t b = 0; b < 5; b++) {
    for (size_t s = 0; s < n_shapes; s++, n++)
      fprintf(f, "%d %d 16 3 %d\n", shapes[s][0], shapes[s][1], budgets[b]);
    for (int k = 1; k <= 60; k++, n++)
      fprintf(f, "%d %d 16 3 %d\n", 37 * k, 1500 - 23 * k, budgets[b]);
  }
  /* another patch and pool (a tiny tower's) and two budgets outside the set */
  for (size_t s = 0; s < n_shapes; s++, n++)
    fprintf(f, "%d %d 4 2 140\n", shapes[s][0], shapes[s][1]);
  fprintf(f, "640 480 16 3 100\n640 480 16 3 0\n");
  n += 2;
  fclose(f);
  run_reference(python, "sizes", cases, out);

  FILE *fc = fopen(cases, "r"), *fo = fopen(out, "r");
  TH_REQUIRE(fc && fo);
  int checked = 0, refused = 0;
  for (int i = 0; i < n; i++) {
    int w, h, patch, pool, mst, tw = 0, th = 0;
    char line[64];
    TH_REQUIRE(fscanf(fc, "%d %d %d %d %d", &w, &h, &patch, &pool, &mst) == 5);
    TH_REQUIRE(fgets(line, sizeof(line), fo) != NULL);
    if (line[0] == '\n') TH_REQUIRE(fgets(line, sizeof(line), fo) != NULL);
    char err[256] = "";
    int rc = md_g4_image_size(w, h, patch, pool, mst, &tw, &th, err, sizeof(err));
    if (!strncmp(line, "error", 5)) {
      refused++;
      if (rc != CM_ERR_INVAL)
        th_fail(__FILE__, __LINE__,
                "%d x %d (patch %d, pool %d, %d tokens): reference refuses, "
                "we give %d x %d",
                w, h, patch, pool, mst, tw, th);
      continue;
    }
    int rw, rh;
    TH_REQUIRE(sscanf(line, "%d %d", &rw, &rh) == 2);
    if (rc || tw != rw || th != rh)
      th_fail(__FILE__, __LINE__,
              "%d x %d (patch %d, pool %d, %d tokens): %d x %d, reference "
              "%d x %d (%s)",
              w, h, patch, pool, mst, tw, th, rw, rh, err);
    int side = patch * pool;
    TH_CHECK(tw % side == 0 && th % side == 0);
    TH_CHECK((long long)(tw / patch) * (th / patch) <= (long long)mst * pool * pool);
    checked++;
  }
  fclose(fc);
  fclose(fo);
  printf("%d target sizes equal to gemma4_image_ref.py's, %d refused by both\n", checked, refused);
  TH_CHECK_EQ_INT(refused, 2);
  cm_rmtree(dir);
}

/* ---- pixels ------------------------------------------------------------------- */

enum pattern { GRADIENT, CHECKER, CHECKER1, NOISE, STRIPES };

struct image_case {
  int w, h, budget;
  enum pattern pat;
};

static const struct image_case images[] = {
    {640, 480, 280, GRADIENT}, /* shrink, smooth */
    {480, 640, 280, NOISE},    /* shrink, every pixel an edge */
    {97, 61, 280, CHECKER},    /* upscale, sharp edges: the cubic overshoots */
    {200, 150, 140, CHECKER1}, /* one-pixel checkerboard, upscale */
    {1000, 700, 70, CHECKER1}, /* one-pixel checkerboard, strong shrink */
    {1, 1, 280, NOISE},        /* tiny */
    {2, 3, 70, GRADIENT},      /* tiny */
    {2000, 5, 70, STRIPES},    /* very wide: height floors to 0 */
    {9, 1500, 70, NOISE},      /* very tall: width floors to 0 */
    {768, 768, 280, NOISE},    /* already the target: no resize */
    {1200, 96, 1120, GRADIENT}, {333, 517, 560, STRIPES},
};

static uint32_t rng(uint32_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 17;
  *s ^= *s << 5;
  return *s;
}

static void fill(uint8_t *px, int w, int h, enum pattern pat, uint32_t seed) {
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int c = 0; c < 3; c++) {
        uint8_t *p = px + ((size_t)y * w + x) * 3 + c;
        switch (pat) {
        case GRADIENT:
          *p = (uint8_t)((255 * (c == 0   ? x
                                 : c == 1 ? y
                                          : x + y)) /
                         (c == 0   ? CM_MAX(w - 1, 1)
                          : c == 1 ? CM_MAX(h - 1, 1)
                                   : CM_MAX(w + h - 2, 1)));
          break;
        case CHECKER:
          *p = ((x / 8 + y / 8) & 1) ? (uint8_t)(255 - 40 * c) : (uint8_t)(20 * c);
          break;
        case CHECKER1: *p = ((x + y) & 1) ? 255 : 0; break;
        case NOISE: *p = (uint8_t)(rng(&seed) >> 24); break;
        case STRIPES: *p = (uint8_t)(((x / 3) % 2) ? 230 : 10 + 60 * c); break;
        }
      }
}

TH_TEST(g4_image_pixels_match_reference) {
  const char *python = th_require_numpy("Gemma 4's image preprocessing", "gemma4_image_ref.py");
  char dir[4096], manifest[4200], err[256] = "";
  TH_REQUIRE(th_tmpdir("g4-pixels", dir, sizeof(dir)) == 0);
  snprintf(manifest, sizeof(manifest), "%s/manifest.txt", dir);
  size_t n_img = sizeof(images) / sizeof(images[0]);
  struct md_vision_g4_cfg vc = {
      .present = 1, .patch = 16, .pool = 3, .pos_size = 10240, .default_tokens = 280};
  FILE *mf = fopen(manifest, "w");
  TH_REQUIRE(mf != NULL);
  for (size_t i = 0; i < n_img; i++) {
    const struct image_case *ic = &images[i];
    size_t bytes = (size_t)ic->w * ic->h * 3;
    uint8_t *px = malloc(bytes);
    TH_REQUIRE(px != NULL);
    fill(px, ic->w, ic->h, ic->pat, 0x9e3779b9u + (uint32_t)i);
    char in[4200];
    snprintf(in, sizeof(in), "%s/in%zu.u8", dir, i);
    FILE *f = fopen(in, "wb");
    TH_REQUIRE(f && fwrite(px, 1, bytes, f) == bytes && fclose(f) == 0);
    free(px);
    fprintf(mf, "%s %d %d 16 3 %d %s/out%zu.bin\n", in, ic->w, ic->h, ic->budget, dir, i);
  }
  fclose(mf);
  run_reference(python, "images", manifest, NULL);

  size_t cap = (size_t)MD_G4_MAX_SOFT_TOKENS * 9, dim = 16 * 16 * 3;
  float *got = malloc(cap * dim * sizeof(float)), *want = malloc(cap * dim * sizeof(float));
  float *tv = malloc(cap * dim * sizeof(float));
  int32_t *pos = malloc(cap * 2 * sizeof(int32_t)), *wpos = malloc(cap * 2 * sizeof(int32_t));
  TH_REQUIRE(got && want && tv && pos && wpos);
  size_t total = 0, off_one = 0;
  double worst = 0, tv_worst = 0;
  size_t tv_off = 0, tv_total = 0;
  for (size_t i = 0; i < n_img; i++) {
    const struct image_case *ic = &images[i];
    size_t bytes = (size_t)ic->w * ic->h * 3;
    uint8_t *px = malloc(bytes);
    TH_REQUIRE(px != NULL);
    fill(px, ic->w, ic->h, ic->pat, 0x9e3779b9u + (uint32_t)i);
    /* sentinels: every value of the padded sequence must be written */
    for (size_t k = 0; k < cap * dim; k++)
      got[k] = NAN;
    for (size_t k = 0; k < cap * 2; k++)
      pos[k] = 12345;
    struct md_g4_image im;
    if (md_g4_image_preprocess(got, pos, &im, px, ic->w, ic->h, &vc, ic->budget, err,
                               sizeof(err))) {
      th_fail(__FILE__, __LINE__, "image %zu: %s", i, err);
      th_stop();
    }
    free(px);
    char out[4200];
    snprintf(out, sizeof(out), "%s/out%zu.bin", dir, i);
    FILE *f = fopen(out, "rb");
    TH_REQUIRE(f != NULL);
    int32_t head[6];
    TH_REQUIRE(fread(head, sizeof(int32_t), 6, f) == 6);
    TH_CHECK_EQ_INT(im.width, head[0]);
    TH_CHECK_EQ_INT(im.height, head[1]);
    TH_CHECK_EQ_INT(im.n_patches, head[2]);
    TH_CHECK_EQ_INT(im.max_patches, head[3]);
    TH_CHECK_EQ_INT(im.soft_tokens, head[4]);
    TH_CHECK_EQ_INT(im.patch_dim, head[5]);
    TH_REQUIRE(im.max_patches == head[3] && (size_t)head[3] <= cap && (size_t)head[5] == dim);
    size_t rows = (size_t)im.max_patches;
    TH_REQUIRE(fread(wpos, sizeof(int32_t), rows * 2, f) == rows * 2);
    TH_REQUIRE(fread(want, sizeof(float), rows * dim, f) == rows * dim);
    TH_REQUIRE(fread(tv, sizeof(float), rows * dim, f) == rows * dim);
    TH_CHECK(fgetc(f) == EOF);
    fclose(f);
    /* positions and padding: exact */
    TH_CHECK(memcmp(pos, wpos, rows * 2 * sizeof(int32_t)) == 0);
    for (size_t k = (size_t)im.n_patches; k < rows; k++)
      TH_CHECK(pos[2 * k] == -1 && pos[2 * k + 1] == -1);
    TH_CHECK_EQ_INT(pos[2 * (im.n_patches - 1)], im.grid_w - 1);
    TH_CHECK_EQ_INT(pos[2 * (im.n_patches - 1) + 1], im.grid_h - 1);
    size_t diff = 0;
    double img_worst = 0, img_tv = 0;
    for (size_t k = 0; k < rows * dim; k++) {
      double e = fabs((double)got[k] - (double)want[k]);
      if (!(e <= img_worst)) img_worst = isnan(e) ? INFINITY : e;
      if (e > 0) diff++;
      if (k >= (size_t)im.n_patches * dim) TH_CHECK(got[k] == 0.0f); /* padding rows */
      double t = fabs((double)tv[k] - (double)want[k]) * 255.0;
      if (t > img_tv) img_tv = t;
      if (t > 0.5) tv_off++;
    }
    tv_total += (size_t)im.n_patches * dim;
    printf("%4d x %-4d %4d tokens -> %4d x %-4d (%3d x %-3d patches, %3d soft tokens): %zu values "
           "differ, max %.3g; torchvision-style float resize: max %.0f levels\n",
           ic->w, ic->h, ic->budget, im.width, im.height, im.grid_w, im.grid_h, im.soft_tokens,
           diff, img_worst, img_tv);
    total += (size_t)im.n_patches * dim;
    off_one += diff;
    worst = fmax(worst, img_worst);
    tv_worst = fmax(tv_worst, img_tv);
  }
  printf("pixels vs gemma4_image_ref.py: %zu values, %zu differ, max abs error %.3g (limit one "
         "8-bit level, %.3g, on at most 1e-4 of them); torchvision-style resize differs at %zu "
         "(%.2f%%), by at most %.0f levels\n",
         total, off_one, worst, 1.0 / 255, tv_off, 100.0 * (double)tv_off / (double)tv_total,
         tv_worst);
  if (!(worst <= 1.0 / 255 + 1e-7) || (double)off_one > 1e-4 * (double)total)
    th_fail(__FILE__, __LINE__, "%zu of %zu values differ, by up to %g", off_one, total, worst);
  free(got);
  free(want);
  free(tv);
  free(pos);
  free(wpos);
  cm_rmtree(dir);
}
