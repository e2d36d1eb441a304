/* test-wk-mmproj.c — a Gemma 3 GGUF model folder with llama.cpp's mmproj
 * file beside the model file: a generated multimodal checkpoint (the tiny
 * SigLIP tower: 64 px images, 8 px patches, 16 soft tokens) written by
 * `lmserve export-gguf --mmproj` (matrices f16, and f32 with --dtype f32),
 * read back from the folder: the checkpoint's vision config, preprocessing
 * and image tokens, and its image embeddings within the f16 rounding of the
 * files' matrices. The file rebuilt with the older converters' names (fc1
 * as ffn_down, fc2 as ffn_up) gives the same bits; a bad file named by
 * --mmproj is a clear error naming what is wrong, and found in the folder a
 * warning (the model serves text); a second tower in the folder, or a file
 * there that is not GGUF, is an error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "common/cm-fs.h"
#include "common/cm-proc.h"
#include "model/md-config.h"
#include "model/md-gguf.h"
#include "tests/harness/th-buf.h"
#include "tests/harness/th-gguf.h"
#include "tests/harness/th.h"
#include "tests/unit/worker/wk-mmproj-util.h"
#include "tests/unit/worker/wk-test-util.h"
#include "tokenizer/tk-tokenizer.h"
#include "tools/tl-tiny-spec.h"
#include "worker/wk-vision.h"

/* The tiny Gemma 3 with its SigLIP tower (wkm_make's folders). */
static void make(char *st, size_t n, char ck[300], char gg[3][300], int n_gg) {
  wkm_make(st, n, (char *[]){"--arch", "gemma3", "--vision", NULL}, ck, gg, n_gg);
}

/* The vision config read from the folder is the checkpoint's. */
static void same_vision(const char *st, const char *gg) {
  struct md_config *a, *b;
  wkm_configs(st, gg, &a, &b);
  const struct md_vision_cfg *x = &a->vision, *y = &b->vision;
  TH_CHECK_EQ_INT(b->gguf, 1);
  TH_CHECK_EQ_INT(y->present, 1);
  TH_CHECK_EQ_INT(x->hidden, y->hidden);
  TH_CHECK_EQ_INT(x->ffn, y->ffn);
  TH_CHECK_EQ_INT(x->n_layers, y->n_layers);
  TH_CHECK_EQ_INT(x->n_heads, y->n_heads);
  TH_CHECK_EQ_INT(x->channels, y->channels);
  TH_CHECK_EQ_INT(x->image_size, y->image_size);
  TH_CHECK_EQ_INT(x->patch, y->patch);
  TH_CHECK_EQ_INT(x->mm_tokens, y->mm_tokens);
  TH_CHECK_EQ_INT(x->pool, y->pool);
  TH_CHECK_EQ_INT(x->boi_id, y->boi_id);
  TH_CHECK_EQ_INT(x->eoi_id, y->eoi_id);
  TH_CHECK_EQ_INT(x->image_id, y->image_id);
  TH_CHECK_NEAR(x->eps, y->eps, 1e-12);
  TH_CHECK_EQ_INT(x->pre.width, y->pre.width);
  TH_CHECK_EQ_INT(x->pre.height, y->pre.height);
  TH_CHECK_EQ_INT(x->pre.resample, y->pre.resample);
  TH_CHECK_NEAR(x->pre.rescale_factor, y->pre.rescale_factor, 1e-12);
  for (int c = 0; c < x->channels; c++) {
    TH_CHECK_NEAR(x->pre.mean[c], y->pre.mean[c], 0);
    TH_CHECK_NEAR(x->pre.std[c], y->pre.std[c], 0);
  }
  free(a);
  free(b);
}

#define NIMG 2

/* The embeddings of NIMG test images through the tower of model (malloc'd,
 * *count floats). */
static float *embed(const char *model, struct kn_backend *be, size_t *count) {
  char err[512];
  struct wk_vision *v = NULL;
  if (wk_vision_load(model, be, NULL, &v, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "%s: vision tower: %s", model, err);
    th_stop();
  }
  const struct md_vision_cfg *vc = wk_vision_config(v);
  int C = vc->channels, S = vc->image_size;
  size_t n_px = (size_t)NIMG * C * S * S;
  *count = (size_t)NIMG * vc->mm_tokens * (size_t)wk_vision_text_hidden(v);
  float *px = malloc(n_px * sizeof(float)), *out = malloc(*count * sizeof(float));
  TH_REQUIRE(px && out);
  wkt_fill_pixels(px, NIMG, C, S, 0x1ea5);
  TH_REQUIRE(wk_vision_encode(v, px, NIMG, out, err, sizeof(err)) == 0);
  free(px);
  wk_vision_free(v);
  return out;
}

/* ---- files rebuilt -------------------------------------------------------------- */

/* v.blk.N.ffn_up and ffn_down exchanged (the older converters' names) */
static void swap_ffn(const struct md_gguf_tensor *t, char *name, size_t n) {
  int layer, used = 0;
  if (sscanf(t->name, "v.blk.%d.%n", &layer, &used) != 1 || !used) return;
  if (!strncmp(t->name + used, "ffn_up.", 7))
    snprintf(name, n, "v.blk.%d.ffn_down.%s", layer, t->name + used + 7);
  else if (!strncmp(t->name + used, "ffn_down.", 9))
    snprintf(name, n, "v.blk.%d.ffn_up.%s", layer, t->name + used + 9);
}

/* ---- tests ---------------------------------------------------------------------- */

TH_TEST(gguf_folder_with_an_mmproj_file_embeds_images_as_the_checkpoint) {
  char st[256], ck[300], gg[3][300];
  make(st, sizeof(st), ck, gg, 3);
  for (int i = 0; i < 2; i++)
    same_vision(ck, gg[i]);
  struct kn_backend *be = wkt_cpu_backend(2);
  size_t n, m;
  float *want = embed(ck, be, &n), *f32 = embed(gg[1], be, &m), *f16 = embed(gg[0], be, &m);
  TH_REQUIRE(n == m);
  /* f32 matrices, the projection in f16 (as llama.cpp's converter forces it):
     bf16 values are f16's too, but for the few below f16's normal range */
  wkm_near("mmproj with f32 matrices", f32, want, n, 1e-4);
  wkm_near("mmproj with f16 matrices", f16, want, n, 1e-4);
  /* Q8_0 matrices (llama.cpp's --outtype q8_0): 8 bits a weight */
  float *q8 = embed(gg[2], be, &m);
  TH_REQUIRE(n == m);
  wkm_near("mmproj with Q8_0 matrices", q8, want, n, 2e-2);
  TH_CHECK(memcmp(q8, f32, n * sizeof(float)) != 0);
  free(q8);
  /* the older converters' names for SigLIP's MLP (fc1 as ffn_down): the same bits */
  char path[400], out[400];
  snprintf(path, sizeof(path), "%s/mmproj-model.gguf", gg[1]);
  snprintf(out, sizeof(out), "%s/swapped.gguf", st);
  wkm_rebuild(path, out, &(struct wkm_change){.rename = swap_ffn});
  TH_REQUIRE(rename(out, path) == 0);
  float *sw = embed(gg[1], be, &m);
  TH_CHECK(memcmp(sw, f32, n * sizeof(float)) == 0);
  free(sw);
  free(f16);
  free(f32);
  free(want);
  kn_backend_destroy(be);
  cm_rmtree(st);
}

static int vision_present(const struct md_config *c) {
  return c->vision.present;
}

TH_TEST(bad_mmproj_files_are_clear_errors) {
  char st[256], ck[300], gg[3][300];
  make(st, sizeof(st), ck, gg, 2);
  char path[400], out[400], err[512];
  snprintf(path, sizeof(path), "%s/mmproj-model.gguf", gg[0]);
  snprintf(out, sizeof(out), "%s/bad.gguf", gg[1]);
  /* gg[1]: its own mmproj file moved away, then one bad file at a time */
  char own[400];
  snprintf(own, sizeof(own), "%s/mmproj-model.gguf", gg[1]);
  TH_REQUIRE(unlink(own) == 0);
  static const struct wkm_bad cases[] = {
      {{"clip.projector_type", "llava", MD_GGUF_STRING, 0}, "clip.projector_type"},
      {{"clip.use_gelu", NULL, MD_GGUF_BOOL, 0}, "clip.use_gelu"},
      {{"clip.has_vision_encoder", NULL, MD_GGUF_BOOL, 0}, "no vision encoder"},
      {{"clip.vision.projection_dim", NULL, MD_GGUF_U32, 96}, "projection_dim"},
      {{"clip.vision.image_size", NULL, MD_GGUF_STRING, 0}, "clip.vision.image_size"},
      {{"clip.vision.projector.scale_factor", NULL, MD_GGUF_U32, 3}, "scale_factor"},
  };
  char model[400];
  snprintf(model, sizeof(model), "%s/model.gguf", gg[1]);
  wkm_check_bad(path, out, gg[1], model, cases, CM_ARRAY_LEN(cases), vision_present);
  struct md_config *cfg = calloc(1, sizeof(*cfg));
  TH_REQUIRE(cfg != NULL);
  /* a .gguf in the folder that is not readable GGUF: named */
  char junk[400];
  snprintf(junk, sizeof(junk), "%s/junk.gguf", gg[1]);
  TH_REQUIRE(wkt_write_file(junk, "GGUF\3\0\0\0", 8) == 0);
  TH_CHECK(md_config_load(gg[1], cfg, err, sizeof(err)) < 0);
  TH_CHECK(strstr(err, "junk.gguf") != NULL);
  TH_REQUIRE(unlink(junk) == 0);
  /* two towers in one folder */
  wkm_rebuild(path, out, &(struct wkm_change){0});
  wkm_rebuild(path, own, &(struct wkm_change){0});
  TH_CHECK(md_config_load(gg[1], cfg, err, sizeof(err)) < 0);
  TH_CHECK(strstr(err, "several vision towers") != NULL);
  /* with one, the model file is still found among them */
  TH_REQUIRE(unlink(out) == 0);
  TH_CHECK_EQ_INT(md_config_load(gg[1], cfg, err, sizeof(err)), 0);
  TH_CHECK_EQ_INT(cfg->vision.present, 1);
  /* the model file named alone: text only; with --mmproj, its tower wherever it lies */
  snprintf(out, sizeof(out), "%s/model.gguf", gg[1]);
  TH_CHECK_EQ_INT(md_config_load(out, cfg, err, sizeof(err)), 0);
  TH_CHECK_EQ_INT(cfg->vision.present, 0);
  TH_CHECK_EQ_INT(md_model_mmproj_arg(out, path, err, sizeof(err)), 0);
  TH_CHECK_EQ_INT(md_config_load(out, cfg, err, sizeof(err)), 0);
  TH_CHECK_EQ_INT(cfg->vision.present, 1);
  TH_CHECK(md_model_mmproj_arg(out, out, err, sizeof(err)) < 0); /* a model file */
  TH_CHECK(strstr(err, "is not a vision tower") != NULL);
  TH_CHECK(md_model_mmproj_arg(ck, path, err, sizeof(err)) < 0); /* a checkpoint folder */
  TH_CHECK(strstr(err, "goes with a GGUF model") != NULL);
  TH_CHECK_EQ_INT(md_model_set_mmproj(NULL, err, sizeof(err)), 0);
  TH_CHECK_EQ_INT(md_config_load(out, cfg, err, sizeof(err)), 0);
  TH_CHECK_EQ_INT(cfg->vision.present, 0);
  free(cfg);
  cm_rmtree(st);
}

/* Gemma 3's model file as llama.cpp's converter writes it: the vocabulary and
 * token_embd cut to tokenizer.model's 262144 pieces, so <image_soft_token>
 * (262144) is not in it. The soft tokens take <unused0>, which the file's
 * own tokenizer gives back as one id, and the tower reads as before. */
TH_TEST(a_vocabulary_without_the_image_token_takes_a_stand_in) {
  char st[256], ck[300], gg[3][300], path[400], err[512];
  make(st, sizeof(st), ck, gg, 2);
  snprintf(path, sizeof(path), "%s/model.gguf", gg[0]);
  th_gguf_cut_vocab(path, path, 262144);
  struct md_config *c = calloc(1, sizeof(*c));
  TH_REQUIRE(c != NULL);
  if (md_config_load(gg[0], c, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "%s", err);
    th_stop();
  }
  TH_CHECK_EQ_INT(c->vocab, 262144);
  TH_CHECK_EQ_INT(c->vision.present, 1);
  TH_CHECK_EQ_INT(c->vision.image_id, 6); /* <unused0> */
  TH_CHECK_EQ_INT(c->vision.boi_id, 255999);
  TH_CHECK_EQ_INT(c->vision.eoi_id, 256000);
  struct md_gguf *g = NULL;
  struct tk_tokenizer *tok = NULL;
  char *tmpl = NULL;
  TH_REQUIRE(md_gguf_open(path, &g, err, sizeof(err)) == 0);
  TH_REQUIRE(tk_from_gguf(g, path, &tok, &tmpl, err, sizeof(err)) == 0);
  static const char text[] = "a<start_of_image><unused0><unused0><end_of_image>b";
  int32_t *ids = NULL;
  size_t nid = 0, cap = 0;
  TH_REQUIRE(tk_encode(tok, NULL, text, sizeof(text) - 1, TK_MATCH_SPECIAL, &ids, &nid, &cap) == 0);
  int soft = 0, boi = 0, eoi = 0;
  for (size_t i = 0; i < nid; i++) {
    soft += ids[i] == 6;
    boi += ids[i] == 255999;
    eoi += ids[i] == 256000;
  }
  TH_CHECK_EQ_INT(soft, 2);
  TH_CHECK_EQ_INT(boi, 1);
  TH_CHECK_EQ_INT(eoi, 1);
  free(ids);
  free(tmpl);
  tk_free(tok);
  md_gguf_close(g);
  struct kn_backend *be = wkt_cpu_backend(2);
  size_t n, m;
  float *want = embed(ck, be, &n), *got = embed(gg[0], be, &m);
  TH_REQUIRE(n == m);
  wkm_near("mmproj beside a cut vocabulary", got, want, n, 1e-4);
  free(want);
  free(got);
  kn_backend_destroy(be);
  free(c);
  cm_rmtree(st);
}
