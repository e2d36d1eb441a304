/* test-wk-audio-g4.c — Gemma 4's audio encoder on the worker:
 *   - the generated checkpoint (make-tiny-model --arch gemma4 --audio, with
 *     and without --vision) loads as a text model and as a Gemma 4 audio
 *     tower, its audio_config, token ids and feature extractor read back;
 *   - the encoder (subsampling convolutions, Conformer layers, projection,
 *     embedder; CPU backend) against the encode command of
 *     tests/reference/gemma4_audio_ref.py, an independent numpy
 *     implementation written from transformers' modeling_gemma4.py that runs
 *     the clips batched and padded as transformers does (skipped, loudly,
 *     without python3 or numpy): one clip, then clips of different lengths
 *     in one pass (one with padding frames past its valid ones, one with
 *     extra zero frames as a batch pads it), f32 and bf16 weights, within
 *     1e-4 of the range; soft-token counts those of md_audio_soft_tokens;
 *     the same bits whether clips share a pass or not;
 *   - bad clips, a missing tensor and bad audio_config fields refused by name. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-fs.h"
#include "common/cm-proc.h"
#include "kernels/cpu/kn-cpu.h"
#include "model/md-audio-g4.h"
#include "model/md-config.h"
#include "tests/unit/worker/wk-test-util.h"
#include "worker/wk-audio-g4.h"
#include "worker/wk-model.h"

/* A generated Gemma 4 checkpoint with the audio tower (and the vision one
 * when vision) in a new directory. */
static void make_model(char *dir, size_t n, int vocab, int vision, enum md_st_dtype dt) {
  struct tl_tiny_opts o = {
      .arch = "gemma4", .preset = "tiny", .vocab = vocab, .vision = vision, .audio = 1};
  wkt_make_tiny(dir, n, &o, 13, dt);
}

TH_TEST(tiny_gemma4_audio_checkpoint_loads) {
  char dir[4096], err[512] = "";
  struct md_config *c = malloc(sizeof(*c));
  TH_REQUIRE(c);
  struct kn_backend *be = wkt_cpu_backend(2);
  for (int vision = 0; vision < 2; vision++) {
    make_model(dir, sizeof(dir), 262144, vision, MD_ST_BF16);
    TH_REQUIRE(md_config_load(dir, c, err, sizeof(err)) == 0);
    const struct md_audio_g4_cfg *a = &c->audio_g4;
    TH_CHECK_EQ_INT(c->arch, MD_ARCH_GEMMA4);
    TH_CHECK_EQ_INT(c->vision_g4.present, vision);
    TH_CHECK_EQ_INT(a->present, 1);
    TH_CHECK_EQ_INT(a->hidden, 32);
    TH_CHECK_EQ_INT(a->n_layers, 2);
    TH_CHECK_EQ_INT(a->n_heads, 4);
    TH_CHECK_EQ_INT(a->conv_ch[0], 16);
    TH_CHECK_EQ_INT(a->conv_ch[1], 8);
    TH_CHECK_EQ_INT(a->conv_kernel, 5);
    TH_CHECK_EQ_INT(a->chunk, 4);
    TH_CHECK_EQ_INT(a->ctx_left, 5);
    TH_CHECK_EQ_INT(a->ctx_right, 2);
    TH_CHECK_EQ_INT(a->output_dims, 48);
    TH_CHECK_EQ_INT(a->clipped_linears, 1);
    TH_CHECK(a->residual_weight == 0.5 && a->logit_cap == 50.0 && a->grad_clip == 1.25);
    TH_CHECK(a->invalid_logit == -1e9 && a->eps == 1e-2);
    /* Gemma4Config's ids, inside the tokenizer's vocabulary */
    TH_CHECK_EQ_INT(a->audio_id, 258881);
    TH_CHECK_EQ_INT(a->boa_id, 256000);
    TH_CHECK_EQ_INT(a->eoa_id, 258883);
    if (vision) TH_CHECK_EQ_INT(c->vision_g4.default_tokens, 280); /* the image processor read */
    struct md_audio_fe_cfg fe;
    TH_REQUIRE(md_audio_fe_load(dir, &fe, err, sizeof(err)) == 0);
    TH_CHECK_EQ_INT(fe.n_mel, 16);
    wkt_check_text_model(dir, be);
    struct wk_audio_g4 *t = NULL;
    if (wk_audio_g4_load(dir, be, NULL, &t, err, sizeof(err)))
      th_fail(__FILE__, __LINE__, "audio tower: %s", err);
    if (t) TH_CHECK_EQ_INT(wk_audio_g4_text_hidden(t), 64);
    if (t) TH_CHECK_EQ_INT(wk_audio_g4_config(t)->hidden, 32);
    wk_audio_g4_free(t);
    cm_rmtree(dir);
  }
  /* a text-only checkpoint has no tower */
  TH_REQUIRE(wkt_make_model(dir, sizeof(dir), "gemma4", 0, 0, MD_ST_F32, 1) == 0);
  struct wk_audio_g4 *t = NULL;
  TH_CHECK_EQ_INT(wk_audio_g4_load(dir, be, NULL, &t, err, sizeof(err)), CM_ERR_UNSUPPORTED);
  TH_CHECK(t == NULL);
  cm_rmtree(dir);
  kn_backend_destroy(be);
  free(c);
}

/* ---- the encoder against the numpy reference --------------------------------------- */

/* n samples at 16 kHz: two tones, a slow sweep and a little noise. */
static float *make_pcm(size_t n, uint64_t seed) {
  float *pcm = malloc(sizeof(float) * (n ? n : 1));
  TH_REQUIRE(pcm);
  uint64_t st = seed;
  for (size_t i = 0; i < n; i++) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    double t = (double)i / 16000.0, noise = (double)(st >> 40) / (double)(1ull << 24) - 0.5;
    pcm[i] = (float)(0.3 * sin(2 * M_PI * (220.0 + 40.0 * (double)seed) * t) +
                     0.2 * sin(2 * M_PI * (1500.0 + 900.0 * t) * t) + 0.05 * noise);
  }
  return pcm;
}

/* Clip lengths (samples): about 0.37 s, 1.02 s and 0.61 s, each just past a
 * multiple of the extractor's padding of 128, so that each ends with a
 * padding frame (its window's last sample past the audio). */
static const size_t lengths[] = {5889, 16390, 9729};
#define N_CLIPS ((int)CM_ARRAY_LEN(lengths))
#define EXTRA   7 /* zero frames appended to the last clip, masked, as a batch pads it */

struct clips {
  struct wk_g4_audio c[N_CLIPS];
  float *feat[N_CLIPS];
  uint8_t *mask[N_CLIPS];
  int total_frames, total_tokens;
};

static void prepare(struct clips *p, const struct md_audio_fe_cfg *fe) {
  memset(p, 0, sizeof(*p));
  for (int i = 0; i < N_CLIPS; i++) {
    int nf = (int)md_audio_fe_frames(fe, lengths[i]), rows = nf + (i == N_CLIPS - 1 ? EXTRA : 0);
    p->feat[i] = calloc((size_t)rows * fe->n_mel, sizeof(float));
    p->mask[i] = calloc((size_t)rows, 1);
    TH_REQUIRE(p->feat[i] && p->mask[i]);
    float *pcm = make_pcm(lengths[i], (uint64_t)i + 1);
    TH_REQUIRE(md_audio_features(fe, pcm, lengths[i], p->feat[i], p->mask[i]) == 0);
    free(pcm);
    int valid = 0;
    for (int t = 0; t < nf; t++)
      valid += p->mask[i][t];
    TH_CHECK(valid < nf); /* padding frames past the valid ones */
    p->c[i] = (struct wk_g4_audio){.feat = p->feat[i],
                                   .mask = p->mask[i],
                                   .n_frames = rows,
                                   .soft_tokens = md_audio_soft_tokens(p->mask[i], (size_t)rows)};
    p->total_frames += rows;
    p->total_tokens += p->c[i].soft_tokens;
  }
}

static void release(struct clips *p) {
  for (int i = 0; i < N_CLIPS; i++) {
    free(p->feat[i]);
    free(p->mask[i]);
  }
}

/* The reference's embeddings of clips [0, n) into want; its soft-token counts
 * checked against ours. */
static void reference(const char *python, const char *dir, const struct clips *p, int n,
                      float *want, size_t n_out) {
  char feat_path[4200], mask_path[4200], out_path[4200], script[4200], frames[128] = "";
  char log[4096], tokens[128] = "";
  snprintf(feat_path, sizeof(feat_path), "%s/features.f32", dir);
  snprintf(mask_path, sizeof(mask_path), "%s/mask.u8", dir);
  snprintf(out_path, sizeof(out_path), "%s/reference.f32", dir);
  snprintf(script, sizeof(script), "%s/reference/gemma4_audio_ref.py", th_tests_dir());
  FILE *ff = fopen(feat_path, "wb"), *fm = fopen(mask_path, "wb");
  TH_REQUIRE(ff && fm);
  int n_mel = 16;
  for (int i = 0; i < n; i++) {
    size_t rows = (size_t)p->c[i].n_frames;
    TH_REQUIRE(fwrite(p->feat[i], sizeof(float) * (size_t)n_mel, rows, ff) == rows);
    TH_REQUIRE(fwrite(p->mask[i], 1, rows, fm) == rows);
    size_t l = strlen(frames), k = strlen(tokens);
    snprintf(frames + l, sizeof(frames) - l, "%s%d", i ? "," : "", p->c[i].n_frames);
    snprintf(tokens + k, sizeof(tokens) - k, "%s%d", i ? "," : "", p->c[i].soft_tokens);
  }
  TH_REQUIRE(fclose(ff) == 0 && fclose(fm) == 0);
  char *argv[] = {(char *)python, script, "encode", (char *)dir, feat_path,
                  mask_path,      frames, out_path, NULL};
  int rc = cm_run_capture(argv, log, sizeof(log));
  if (rc != 0) {
    th_fail(__FILE__, __LINE__, "gemma4_audio_ref.py exited with %d:\n%s", rc, log);
    th_stop();
  }
  /* its first line: each clip's soft tokens */
  char *nl = strchr(log, '\n');
  if (nl) *nl = 0;
  if (strcmp(log, tokens))
    th_fail(__FILE__, __LINE__, "soft tokens: the reference's %s, md_audio_soft_tokens %s", log,
            tokens);
  TH_REQUIRE(wkt_read_f32(out_path, want, n_out) == 0);
}

/* Largest |got - want| over n relative to want's range (printed). */
static double compare(const char *what, const float *got, const float *want, size_t n) {
  double lo, hi, worst = wkt_max_err(got, want, n, &lo, &hi);
  double rel = worst / (hi - lo);
  printf("Gemma 4 audio encoder vs gemma4_audio_ref.py, %s: %zu values in [%.4f, %.4f], max abs "
         "error %.3g (%.3g of the range)\n",
         what, n, lo, hi, worst, rel);
  TH_CHECK(hi - lo > 0.1); /* the embeddings are not degenerate */
  return rel;
}

static void check_against_reference(const char *python, enum md_st_dtype dt) {
  char dir[4096], err[512] = "";
  make_model(dir, sizeof(dir), 512, 0, dt);
  struct kn_backend *be = wkt_cpu_backend(2);
  struct wk_audio_g4 *a = NULL, *a_small = NULL;
  if (wk_audio_g4_load(dir, be, NULL, &a, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "audio tower: %s", err);
    th_stop();
  }
  /* room for the longest clip's valid frames only: one clip a pass */
  struct wk_audio_g4_opts small = {.max_frames = 104};
  TH_REQUIRE(wk_audio_g4_load(dir, be, &small, &a_small, err, sizeof(err)) == 0);
  struct md_audio_fe_cfg fe;
  TH_REQUIRE(md_audio_fe_load(dir, &fe, err, sizeof(err)) == 0);
  struct clips p;
  prepare(&p, &fe);
  int H = wk_audio_g4_text_hidden(a);
  size_t n_out = (size_t)p.total_tokens * H;
  float *got = malloc(n_out * sizeof(float)), *want = malloc(n_out * sizeof(float));
  float *again = malloc(n_out * sizeof(float));
  TH_REQUIRE(got && want && again);
  char what[96];
  /* one clip */
  size_t n0 = (size_t)p.c[0].soft_tokens * H;
  TH_REQUIRE(wk_audio_g4_encode(a, p.c, 1, got, err, sizeof(err)) == 0);
  reference(python, dir, &p, 1, want, n0);
  snprintf(what, sizeof(what), "%s weights, one clip of %d frames", md_st_dtype_name(dt),
           p.c[0].n_frames);
  double rel = compare(what, got, want, n0);
  if (!(rel < 1e-4)) th_fail(__FILE__, __LINE__, "one clip: %.3g of the range (limit 1e-4)", rel);
  /* every clip in one pass */
  if (wk_audio_g4_encode(a, p.c, N_CLIPS, got, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "encode: %s", err);
    th_stop();
  }
  reference(python, dir, &p, N_CLIPS, want, n_out);
  snprintf(what, sizeof(what), "%s weights, %d clips of %d, %d and %d frames in one pass",
           md_st_dtype_name(dt), N_CLIPS, p.c[0].n_frames, p.c[1].n_frames, p.c[2].n_frames);
  rel = compare(what, got, want, n_out);
  if (!(rel < 1e-4)) th_fail(__FILE__, __LINE__, "clips: %.3g of the range (limit 1e-4)", rel);
  /* the same bits one clip a pass, and each clip alone */
  TH_REQUIRE(wk_audio_g4_encode(a_small, p.c, N_CLIPS, again, err, sizeof(err)) == 0);
  TH_CHECK(memcmp(got, again, n_out * sizeof(float)) == 0);
  size_t at = 0;
  for (int i = 0; i < N_CLIPS; i++) {
    TH_REQUIRE(wk_audio_g4_encode(a, &p.c[i], 1, again, err, sizeof(err)) == 0);
    size_t k = (size_t)p.c[i].soft_tokens * H;
    TH_CHECK(memcmp(again, got + at, k * sizeof(float)) == 0);
    at += k;
  }
  release(&p);
  free(got);
  free(want);
  free(again);
  wk_audio_g4_free(a);
  wk_audio_g4_free(a_small);
  kn_backend_destroy(be);
  cm_rmtree(dir);
}

TH_TEST(gemma4_audio_encoder_matches_numpy_reference) {
  const char *python = th_require_numpy("the Gemma 4 audio encoder", "gemma4_audio_ref.py");
  check_against_reference(python, MD_ST_F32);
  check_against_reference(python, MD_ST_BF16);
}

/* ---- refusals --------------------------------------------------------------------- */

TH_TEST(gemma4_audio_refuses_bad_clips) {
  char dir[4096], err[512] = "";
  make_model(dir, sizeof(dir), 512, 0, MD_ST_BF16);
  struct kn_backend *be = wkt_cpu_backend(1);
  struct wk_audio_g4 *a = NULL;
  struct wk_audio_g4_opts small = {.max_frames = 60};
  TH_REQUIRE(wk_audio_g4_load(dir, be, &small, &a, err, sizeof(err)) == 0);
  struct md_audio_fe_cfg fe;
  TH_REQUIRE(md_audio_fe_load(dir, &fe, err, sizeof(err)) == 0);
  struct clips p;
  prepare(&p, &fe);
  float out[64 * 64];
  TH_CHECK_EQ_INT(wk_audio_g4_encode(a, NULL, 1, out, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(wk_audio_g4_encode(a, p.c, -1, out, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(wk_audio_g4_encode(a, NULL, 0, NULL, err, sizeof(err)), 0);
  /* a soft-token count that is not the mask's, a mask with a hole, too many frames */
  struct wk_g4_audio bad = p.c[0];
  bad.soft_tokens += 1;
  TH_CHECK_EQ_INT(wk_audio_g4_encode(a, &bad, 1, out, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK(strstr(err, "clip 0") != NULL);
  p.mask[0][3] = 0;
  TH_CHECK_EQ_INT(wk_audio_g4_encode(a, p.c, 1, out, err, sizeof(err)), CM_ERR_INVAL);
  p.mask[0][3] = 1;
  TH_CHECK_EQ_INT(wk_audio_g4_encode(a, p.c, 2, out, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK(strstr(err, "clip 1") != NULL); /* 1 s: more valid frames than the 60 a pass holds */
  release(&p);
  wk_audio_g4_free(a);
  /* a clipped linear without its bound, and the embedder missing, are refused by name */
  struct tl_tiny_opts o = {.arch = "gemma4", .preset = "tiny", .vocab = 512, .audio = 1};
  static const char *const drop[] = {"layers.1.lconv1d.linear_end.output_max",
                                     "layers.0.self_attn.relative_k_proj.weight",
                                     "embed_audio.embedding_projection.weight"};
  for (size_t d = 0; d < CM_ARRAY_LEN(drop); d++) {
    wkt_write_without(dir, &o, drop[d], 7, MD_ST_BF16);
    TH_CHECK_EQ_INT(wk_audio_g4_load(dir, be, NULL, &a, err, sizeof(err)), CM_ERR_NOENT);
    TH_CHECK(strstr(err, drop[d]) != NULL);
    TH_CHECK(a == NULL);
  }
  kn_backend_destroy(be);
  cm_rmtree(dir);
}

/* A gemma4 config.json with audio_config's FIELD (or a top-level one) set to VALUE. */
static char *audio_config(const char *field, const char *value, int top) {
  static const char base[] =
      "{\"model_type\": \"gemma4\", \"text_config\": {\"model_type\": \"gemma4_text\", "
      "\"vocab_size\": 512, \"hidden_size\": 64, \"intermediate_size\": 128, "
      "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
      "\"head_dim\": 16, \"global_head_dim\": 32, \"hidden_size_per_layer_input\": 0, "
      "\"layer_types\": [\"sliding_attention\", \"full_attention\"]}, "
      "\"audio_token_id\": 500, \"boa_token_id\": 501, \"eoa_token_index\": 502%s%s%s, "
      "\"audio_config\": {\"model_type\": \"gemma4_audio\"%s%s%s}}";
  char *out = malloc(4096);
  TH_REQUIRE(out);
  char kv[512];
  snprintf(kv, sizeof(kv), "\"%s\": %s", field, value);
  snprintf(out, 4096, base, top ? ", " : "", top ? kv : "", "", top ? "" : ", ", top ? "" : kv, "");
  return out;
}

TH_TEST(gemma4_audio_config_refuses_bad_fields) {
  struct md_config *c = malloc(sizeof(*c));
  TH_REQUIRE(c);
  char err[512];
  /* the defaults (Gemma4AudioConfig's) under a valid field */
  char *ok = audio_config("conv_kernel_size", "5", 0);
  TH_REQUIRE(md_config_parse(ok, strlen(ok), c, err, sizeof(err)) == 0);
  free(ok);
  TH_CHECK_EQ_INT(c->audio_g4.present, 1);
  TH_CHECK_EQ_INT(c->audio_g4.n_layers, 12);
  TH_CHECK_EQ_INT(c->audio_g4.conv_ch[0], 128);
  TH_CHECK_EQ_INT(c->audio_g4.conv_ch[1], 32);
  TH_CHECK_EQ_INT(c->audio_g4.chunk, 12);
  TH_CHECK_EQ_INT(c->audio_g4.ctx_left, 13);
  TH_CHECK_EQ_INT(c->audio_g4.ctx_right, 0);
  TH_CHECK_EQ_INT(c->audio_g4.output_dims, 1536);
  TH_CHECK_EQ_INT(c->audio_g4.clipped_linears, 1);
  TH_CHECK(c->audio_g4.grad_clip == 1e10 && c->audio_g4.logit_cap == 50.0);
  TH_CHECK_EQ_INT(c->audio_g4.eoa_id, 502);
  struct {
    const char *field, *value;
    int top;
    const char *named;
  } bad[] = {
      {"hidden_size", "30", 0, "hidden_size"},
      {"num_attention_heads", "0", 0, "num_attention_heads"},
      {"subsampling_conv_channels", "[128]", 0, "subsampling_conv_channels"},
      {"subsampling_conv_channels", "[126, 32]", 0, "subsampling_conv_channels[0]"},
      {"subsampling_conv_channels", "[128, -1]", 0, "subsampling_conv_channels[1]"},
      {"hidden_act", "\"gelu\"", 0, "hidden_act"},
      {"attention_context_left", "1", 0, "attention_context_left"},
      {"attention_chunk_size", "0", 0, "attention_chunk_size"},
      {"attention_logit_cap", "0", 0, "attention_logit_cap"},
      {"attention_invalid_logits_value", "-10", 0, "attention_invalid_logits_value"},
      {"use_clipped_linears", "3", 0, "use_clipped_linears"},
      {"gradient_clipping", "-1", 0, "gradient_clipping"},
      {"output_proj_dims", "0", 0, "output_proj_dims"},
      {"model_type", "\"gemma3n_audio\"", 0, "model_type"},
      {"audio_token_id", "512", 1, "audio_token_id"},
      {"boa_token_id", "\"x\"", 1, "boa_token_id"},
  };
  for (size_t i = 0; i < CM_ARRAY_LEN(bad); i++) {
    char *text = audio_config(bad[i].field, bad[i].value, bad[i].top);
    err[0] = 0;
    int rc = md_config_parse(text, strlen(text), c, err, sizeof(err));
    free(text);
    if (!rc || !strstr(err, bad[i].named))
      th_fail(__FILE__, __LINE__, "%s = %s: rc %d, \"%s\" (should name %s)", bad[i].field,
              bad[i].value, rc, err, bad[i].named);
  }
  /* eoa_token_id is read when eoa_token_index is absent */
  char *alt = audio_config("hidden_act", "\"silu\"", 0);
  char *at = strstr(alt, "eoa_token_index");
  memcpy(at, "eoa_token_id\"   ", 16);
  TH_REQUIRE(md_config_parse(alt, strlen(alt), c, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT(c->audio_g4.eoa_id, 502);
  free(alt);
  free(c);
}
