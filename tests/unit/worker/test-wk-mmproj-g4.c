/* test-wk-mmproj-g4.c — a Gemma 4 GGUF model folder with llama.cpp's mmproj
 * file beside the model file, holding the vision tower ("gemma4v") and the
 * audio tower ("gemma4a"): a generated Gemma4ForConditionalGeneration
 * checkpoint (the small towers, the audio one with the defaults an mmproj
 * file can hold) written by `lmserve export-gguf --mmproj` (matrices f16, and
 * f32 with --dtype f32, and Q8_0 with --mmproj-dtype q8_0) and read back
 * from the folder. The towers' configs
 * and token ids are the checkpoint's field by field; image and audio
 * embeddings are the safetensors path's within the files' rounding, though
 * the converter stores the patch projection as a convolution's kernel and
 * per_dim_scale after softplus. Bad files are a clear error naming what is
 * wrong when --mmproj names them, and found in the folder a warning (the
 * model serves text). An mmproj file written from the checkpoint by
 * tests/reference/gemma4_mmproj_conv.py, llama.cpp's converter's rules in
 * numpy, is export-gguf's bit for bit and reads the same. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "common/cm-fs.h"
#include "common/cm-proc.h"
#include "model/md-audio-g4.h"
#include "model/md-config.h"
#include "model/md-gguf.h"
#include "model/md-vision-g4.h"
#include "tests/harness/th-buf.h"
#include "tests/harness/th-gguf.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/unit/worker/wk-mmproj-util.h"
#include "tests/unit/worker/wk-test-util.h"
#include "worker/wk-audio-g4.h"
#include "worker/wk-vision-g4.h"

/* The tiny Gemma 4 (Gemma 4's special tokens at their ids, per-layer inputs
 * and KV-shared layers as llama.cpp lays them out) with both towers, the
 * audio one with the defaults an mmproj file holds (wkm_make's folders). */
static void make(char *st, size_t n, char ck[300], char gg[3][300], int n_gg) {
  wkm_make(st, n,
           (char *[]){"--arch", "gemma4", "--preset", "tiny-e", "--chat-format", "gemma4",
                      "--vision", "--audio", "--audio-shape", "tiny-default", NULL},
           ck, gg, n_gg);
}

/* The towers read from the folder are the checkpoint's. */
static void same_towers(const char *st, const char *gg) {
  struct md_config *a, *b;
  wkm_configs(st, gg, &a, &b);
  const struct md_vision_g4_cfg *x = &a->vision_g4, *y = &b->vision_g4;
  TH_CHECK_EQ_INT(b->gguf, 1);
  TH_CHECK(!strcmp(b->model_type, "gemma4"));
  TH_CHECK_EQ_INT(y->present, 1);
  TH_CHECK_EQ_INT(x->hidden, y->hidden);
  TH_CHECK_EQ_INT(x->ffn, y->ffn);
  TH_CHECK_EQ_INT(x->n_layers, y->n_layers);
  TH_CHECK_EQ_INT(x->n_heads, y->n_heads);
  TH_CHECK_EQ_INT(x->n_kv_heads, y->n_kv_heads);
  TH_CHECK_EQ_INT(x->head_dim, y->head_dim);
  TH_CHECK_EQ_INT(x->patch, y->patch);
  TH_CHECK_EQ_INT(x->pool, y->pool);
  TH_CHECK_EQ_INT(x->pos_size, y->pos_size);
  TH_CHECK_EQ_INT(x->default_tokens, y->default_tokens);
  TH_CHECK_EQ_INT(x->clipped_linears, y->clipped_linears);
  TH_CHECK_EQ_INT(x->standardize, y->standardize);
  TH_CHECK_EQ_INT(x->bidir, y->bidir);
  TH_CHECK_EQ_INT(x->boi_id, y->boi_id);
  TH_CHECK_EQ_INT(x->eoi_id, y->eoi_id);
  TH_CHECK_EQ_INT(x->image_id, y->image_id);
  TH_CHECK_NEAR(x->eps, y->eps, 1e-12);
  TH_CHECK_NEAR(x->rope_theta, y->rope_theta, 0);
  const struct md_audio_g4_cfg *p = &a->audio_g4, *q = &b->audio_g4;
  TH_CHECK_EQ_INT(q->present, 1);
  TH_CHECK_EQ_INT(p->hidden, q->hidden);
  TH_CHECK_EQ_INT(p->n_layers, q->n_layers);
  TH_CHECK_EQ_INT(p->n_heads, q->n_heads);
  TH_CHECK_EQ_INT(p->conv_ch[0], q->conv_ch[0]);
  TH_CHECK_EQ_INT(p->conv_ch[1], q->conv_ch[1]);
  TH_CHECK_EQ_INT(p->conv_kernel, q->conv_kernel);
  TH_CHECK_EQ_INT(p->chunk, q->chunk);
  TH_CHECK_EQ_INT(p->ctx_left, q->ctx_left);
  TH_CHECK_EQ_INT(p->ctx_right, q->ctx_right);
  TH_CHECK_EQ_INT(p->output_dims, q->output_dims);
  TH_CHECK_EQ_INT(p->clipped_linears, q->clipped_linears);
  TH_CHECK_EQ_INT(p->audio_id, q->audio_id);
  TH_CHECK_EQ_INT(p->boa_id, q->boa_id);
  TH_CHECK_EQ_INT(p->eoa_id, q->eoa_id);
  TH_CHECK_NEAR(p->eps, q->eps, 0);
  TH_CHECK_NEAR(p->residual_weight, q->residual_weight, 0);
  TH_CHECK_NEAR(p->logit_cap, q->logit_cap, 0);
  TH_CHECK_NEAR(p->grad_clip, q->grad_clip, 0);
  free(a);
  free(b);
}

/* The embeddings of two test images (a landscape shape under 70 soft
 * tokens, a square under 140) through model's vision tower (malloc'd,
 * *count floats). */
static float *embed_images(const char *model, struct kn_backend *be, size_t *count) {
  char err[512];
  struct wk_vision_g4 *v = NULL;
  if (wk_vision_g4_load(model, be, NULL, &v, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "%s: vision tower: %s", model, err);
    th_stop();
  }
  static const int dims[2][3] = {{320, 200, 70}, {150, 150, 140}};
  struct wk_g4_image ims[2];
  float *px[2];
  int32_t *pos[2];
  int tokens = 0;
  for (int i = 0; i < 2; i++) {
    struct md_g4_image info;
    const struct md_vision_g4_cfg *vc = wk_vision_g4_config(v);
    TH_REQUIRE(md_g4_image_plan(&info, dims[i][0], dims[i][1], vc, dims[i][2], err, sizeof(err)) ==
               0);
    px[i] = malloc(sizeof(float) * (size_t)info.max_patches * info.patch_dim);
    pos[i] = malloc(sizeof(int32_t) * 2 * (size_t)info.max_patches);
    TH_REQUIRE(px[i] && pos[i]);
    uint8_t *img = wkt_rgb_image(dims[i][0], dims[i][1], 11 + (uint64_t)i);
    TH_REQUIRE(md_g4_image_preprocess(px[i], pos[i], &info, img, dims[i][0], dims[i][1], vc,
                                      dims[i][2], err, sizeof(err)) == 0);
    free(img);
    ims[i] = (struct wk_g4_image){.pixels = px[i], .pos = pos[i], .info = info};
    tokens += info.soft_tokens;
  }
  *count = (size_t)tokens * (size_t)wk_vision_g4_text_hidden(v);
  float *out = malloc(*count * sizeof(float));
  TH_REQUIRE(out);
  if (wk_vision_g4_encode(v, ims, 2, out, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "%s: encode: %s", model, err);
    th_stop();
  }
  for (int i = 0; i < 2; i++) {
    free(px[i]);
    free(pos[i]);
  }
  wk_vision_g4_free(v);
  return out;
}

/* The embeddings of two clips (0.6 s and 1.1 s of tones and noise) through
 * model's audio tower (malloc'd, *count floats). */
static float *embed_audio(const char *model, struct kn_backend *be, size_t *count) {
  char err[512];
  struct wk_audio_g4 *a = NULL;
  if (wk_audio_g4_load(model, be, NULL, &a, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "%s: audio tower: %s", model, err);
    th_stop();
  }
  struct md_audio_fe_cfg fe;
  TH_REQUIRE(md_audio_fe_load(model, &fe, err, sizeof(err)) == 0);
  static const size_t len[2] = {9729, 17700};
  struct wk_g4_audio clips[2];
  float *feat[2];
  uint8_t *mask[2];
  int tokens = 0;
  for (int i = 0; i < 2; i++) {
    size_t nf = md_audio_fe_frames(&fe, len[i]);
    float *pcm = malloc(sizeof(float) * len[i]);
    feat[i] = calloc(nf * (size_t)fe.n_mel, sizeof(float));
    mask[i] = calloc(nf, 1);
    TH_REQUIRE(pcm && feat[i] && mask[i]);
    uint64_t s = 5 + (uint64_t)i;
    for (size_t k = 0; k < len[i]; k++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      double t = (double)k / 16000.0;
      pcm[k] = (float)(0.3 * sin(2 * M_PI * (300.0 + 150.0 * i) * t) +
                       0.2 * sin(2 * M_PI * (1200.0 + 700.0 * t) * t) +
                       0.05 * ((double)(s >> 40) / (double)(1ull << 24) - 0.5));
    }
    TH_REQUIRE(md_audio_features(&fe, pcm, len[i], feat[i], mask[i]) == 0);
    free(pcm);
    clips[i] = (struct wk_g4_audio){.feat = feat[i],
                                    .mask = mask[i],
                                    .n_frames = (int)nf,
                                    .soft_tokens = md_audio_soft_tokens(mask[i], nf)};
    tokens += clips[i].soft_tokens;
  }
  *count = (size_t)tokens * (size_t)wk_audio_g4_text_hidden(a);
  float *out = malloc(*count * sizeof(float));
  TH_REQUIRE(out);
  if (wk_audio_g4_encode(a, clips, 2, out, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "%s: encode: %s", model, err);
    th_stop();
  }
  for (int i = 0; i < 2; i++) {
    free(feat[i]);
    free(mask[i]);
  }
  wk_audio_g4_free(a);
  return out;
}

/* ---- tests ---------------------------------------------------------------------- */

/* An mmproj file written by tests/reference/gemma4_mmproj_conv.py (llama.cpp's
 * converter's rules, in numpy, sharing no code with lmserve) holds the same
 * tensors, bit for bit, as export-gguf's (in gg, beside its model file), and
 * read beside the model file it gives the checkpoint ck's embeddings. */
static void converters_rules(const char *st, const char *ck, const char *gg,
                             struct kn_backend *be) {
  const char *python = th_require_numpy("Gemma 4's mmproj layout", "gemma4_mmproj_conv.py");
  char script[1024], dir[400], mm[500], model[500], log[4096];
  snprintf(script, sizeof(script), "%s/reference/gemma4_mmproj_conv.py", th_tests_dir());
  snprintf(dir, sizeof(dir), "%s/py", st);
  TH_REQUIRE(mkdir(dir, 0755) == 0);
  snprintf(mm, sizeof(mm), "%s/mmproj-model.gguf", dir);
  char *argv[] = {(char *)python, script, (char *)ck, mm, NULL};
  int rc = cm_run_capture(argv, log, sizeof(log));
  if (rc) {
    th_fail(__FILE__, __LINE__, "gemma4_mmproj_conv.py exited with %d:\n%s", rc, log);
    th_stop();
  }
  snprintf(model, sizeof(model), "%s/model.gguf", gg);
  char link[500];
  snprintf(link, sizeof(link), "%s/model.gguf", dir);
  TH_REQUIRE(symlink(model, link) == 0);
  /* the tensors: the same names, types, dimensions and bytes */
  char ours[500], err[512];
  snprintf(ours, sizeof(ours), "%s/mmproj-model.gguf", gg);
  struct md_gguf *a = NULL, *b = NULL;
  TH_REQUIRE(md_gguf_open(mm, &a, err, sizeof(err)) == 0);
  TH_REQUIRE(md_gguf_open(ours, &b, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT(md_gguf_tensor_count(a), md_gguf_tensor_count(b));
  int same = 0;
  for (int i = 0; i < md_gguf_tensor_count(a); i++) {
    const struct md_gguf_tensor *x = md_gguf_tensor_at(a, i);
    const struct md_gguf_tensor *y = md_gguf_find_tensor(b, x->name);
    int ok = y && x->type == y->type && x->n_dims == y->n_dims && x->nbytes == y->nbytes &&
             !memcmp(x->ne, y->ne, sizeof(x->ne)) && !memcmp(x->data, y->data, x->nbytes);
    if (!ok) th_fail(__FILE__, __LINE__, "tensor %s differs from export-gguf's", x->name);
    same += ok;
  }
  printf("# %d of %d tensors the same as export-gguf's\n", same, md_gguf_tensor_count(a));
  md_gguf_close(a);
  md_gguf_close(b);
  /* read back: the checkpoint's embeddings */
  size_t n, m;
  float *want = embed_images(ck, be, &n), *got = embed_images(dir, be, &m);
  TH_REQUIRE(n == m);
  wkm_near("images, the converter's rules", got, want, n, 1e-4);
  free(want), free(got);
  want = embed_audio(ck, be, &n);
  got = embed_audio(dir, be, &m);
  TH_REQUIRE(n == m);
  wkm_near("audio, the converter's rules", got, want, n, 1e-4);
  free(want), free(got);
}

TH_TEST(gguf_folder_with_a_gemma4_mmproj_file_embeds_images_and_audio_as_the_checkpoint) {
  char st[256], ck[300], gg[3][300];
  make(st, sizeof(st), ck, gg, 3);
  for (int i = 0; i < 2; i++)
    same_towers(ck, gg[i]);
  struct kn_backend *be = wkt_cpu_backend(2);
  size_t n, m;
  float *want = embed_images(ck, be, &n), *f32 = embed_images(gg[1], be, &m);
  TH_REQUIRE(n == m);
  float *f16 = embed_images(gg[0], be, &m);
  TH_REQUIRE(n == m);
  /* the checkpoint's bf16 values are f16's too (but for the few below f16's
     normal range): both files hold the same weights */
  wkm_near("images, mmproj with f32 matrices", f32, want, n, 1e-4);
  wkm_near("images, mmproj with f16 matrices", f16, want, n, 1e-4);
  /* Q8_0 matrices (llama.cpp's --outtype q8_0): the weights rounded to 8 bits
     a value, 1/254 of each block's largest at worst */
  float *q8 = embed_images(gg[2], be, &m);
  TH_REQUIRE(n == m);
  wkm_near("images, mmproj with Q8_0 matrices", q8, want, n, 2e-2);
  TH_CHECK(memcmp(q8, f32, n * sizeof(float)) != 0);
  free(want), free(f32), free(f16), free(q8);
  want = embed_audio(ck, be, &n);
  f32 = embed_audio(gg[1], be, &m);
  TH_REQUIRE(n == m);
  f16 = embed_audio(gg[0], be, &m);
  TH_REQUIRE(n == m);
  /* per_dim_scale after softplus, rounded to f32 once: within 1e-4 */
  wkm_near("audio, mmproj with f32 matrices", f32, want, n, 1e-4);
  wkm_near("audio, mmproj with f16 matrices", f16, want, n, 1e-4);
  q8 = embed_audio(gg[2], be, &m);
  TH_REQUIRE(n == m);
  wkm_near("audio, mmproj with Q8_0 matrices", q8, want, n, 2e-2);
  TH_CHECK(memcmp(q8, f32, n * sizeof(float)) != 0);
  free(want), free(f32), free(f16), free(q8);
  converters_rules(st, ck, gg[0], be);
  kn_backend_destroy(be);
  cm_rmtree(st);
}

static int towers_present(const struct md_config *c) {
  return c->vision_g4.present || c->audio_g4.present;
}

TH_TEST(bad_gemma4_mmproj_files_are_clear_errors) {
  char st[256], ck[300], gg[3][300];
  make(st, sizeof(st), ck, gg, 2);
  char path[400], out[400], err[512], own[400], model[400];
  snprintf(path, sizeof(path), "%s/mmproj-model.gguf", gg[0]);
  snprintf(out, sizeof(out), "%s/bad.gguf", gg[1]);
  snprintf(own, sizeof(own), "%s/mmproj-model.gguf", gg[1]);
  snprintf(model, sizeof(model), "%s/model.gguf", gg[1]);
  TH_REQUIRE(unlink(own) == 0);
  static const struct wkm_bad cases[] = {
      {{"clip.vision.projector_type", "gemma4uv", MD_GGUF_STRING}, "\"gemma4uv\""},
      {{"clip.audio.projector_type", "qwen3a", MD_GGUF_STRING}, "\"qwen3a\""},
      {{"clip.audio.num_mel_bins", NULL, MD_GGUF_U32, 80}, "num_mel_bins 80"},
      {{"clip.vision.projection_dim", NULL, MD_GGUF_U32, 96}, "projection_dim"},
      {{.from = "v.blk.0.attn_q.input_min", .to = "v.blk.0.out_scale.weight"},
       "v.blk.0.out_scale.weight"},
      {{.from = "a.blk.1.per_dim_scale.weight", .to = "a.blk.1.per_dim_k_scale.weight"},
       "a.blk.1.per_dim_k_scale.weight"},
      {{.from = "v.blk.0.attn_q_norm.weight", .to = "v.blk.0.q_norm.weight"},
       "v.blk.0.q_norm.weight is not read"},
      {{.from = "a.pre_encode.out.bias", .to = "a.blk.0.conv_pw1.bias"},
       "a.blk.0.conv_pw1.bias is not read"},
      {{.from = "v.std_bias", .to = "v.blk.1.attn_q.bias"}, "v.blk.1.attn_q.bias is not read"},
      {{"clip.vision.patch_size", NULL, MD_GGUF_U32, 8}, "v.patch_embd.weight is not a"},
  };
  wkm_check_bad(path, out, gg[1], model, cases, CM_ARRAY_LEN(cases), towers_present);
  struct md_config *cfg = calloc(1, sizeof(*cfg));
  TH_REQUIRE(cfg != NULL);
  /* a file that declares one encoder: that tower only */
  for (int audio = 0; audio < 2; audio++) {
    wkm_rebuild(path, out,
                &(struct wkm_change){audio ? "clip.has_vision_encoder" : "clip.has_audio_encoder",
                                     NULL, MD_GGUF_BOOL, 0, NULL, NULL});
    TH_CHECK_EQ_INT(md_model_mmproj_arg(model, out, err, sizeof(err)), 0);
    TH_CHECK_EQ_INT(md_config_load(model, cfg, err, sizeof(err)), 0);
    TH_CHECK_EQ_INT(cfg->vision_g4.present, !audio);
    TH_CHECK_EQ_INT(cfg->audio_g4.present, audio);
    TH_REQUIRE(md_model_set_mmproj(NULL, err, sizeof(err)) == 0);
  }
  /* neither */
  wkm_rebuild(path, own, &(struct wkm_change){"clip.has_vision_encoder", NULL, MD_GGUF_BOOL, 0});
  wkm_rebuild(own, out, &(struct wkm_change){"clip.has_audio_encoder", NULL, MD_GGUF_BOOL, 0});
  TH_REQUIRE(unlink(own) == 0);
  TH_CHECK(md_model_mmproj_arg(model, out, err, sizeof(err)) == 0 &&
           md_config_load(model, cfg, err, sizeof(err)) < 0);
  TH_CHECK(strstr(err, "vision none") != NULL);
  TH_REQUIRE(md_model_set_mmproj(NULL, err, sizeof(err)) == 0);
  free(cfg);
  cm_rmtree(st);
}
