/* test-md-audio-g4.c — Gemma 4's audio feature extractor (model/md-audio-g4.c)
 * against tests/reference/gemma4_audio_ref.py (float64 numpy, run through
 * python3; skipped, loudly, without python3 or numpy): frame counts, masks and
 * soft-token counts exact, features within 1e-4 of the reference's range, on
 * sines, a chirp with noise, silence, clicks, lengths that are and are not
 * multiples of the padding, shorter than one frame, exactly 30 s and over it
 * (truncated), under the default config and configs that turn on every option
 * (both preemphasis flavours, per-bin mean and stddev, FFT overdrive, input
 * scale, another frame and hop). Then the config: defaults, a processor
 * config's nested "feature_extractor", every bad field refused by name. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-proc.h"
#include "model/md-audio-g4.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/unit/model/md-test-util.h"

TH_TEST(defaults) {
  struct md_audio_fe_cfg c;
  md_audio_fe_defaults(&c);
  TH_CHECK_EQ_INT(c.n_mel, 128);
  TH_CHECK_EQ_INT(c.sampling_rate, 16000);
  TH_CHECK_EQ_INT(c.frame_length, 320);
  TH_CHECK_EQ_INT(c.hop_length, 160);
  TH_CHECK_EQ_INT(c.fft_length, 512);
  TH_CHECK_NEAR(c.mel_floor, 1e-3, 0);
  TH_CHECK_EQ_INT(c.max_samples, 480000);
  /* 1 s: 99 frames, 25 soft tokens; 30 s: 750 (the processor's audio_seq_length) */
  TH_CHECK_EQ_INT((int)md_audio_fe_frames(&c, 16000), 99);
  TH_CHECK_EQ_INT((int)md_audio_fe_frames(&c, 480000), 2999);
  TH_CHECK_EQ_INT((int)md_audio_fe_frames(&c, 480001), 2999);
  TH_CHECK_EQ_INT((int)md_audio_fe_frames(&c, 0), 0);
  uint8_t mask[3000];
  memset(mask, 1, sizeof(mask));
  TH_CHECK_EQ_INT(md_audio_soft_tokens(mask, 99), 25);
  TH_CHECK_EQ_INT(md_audio_soft_tokens(mask, 2999), 750);
}

TH_TEST(config_parse) {
  struct md_audio_fe_cfg c;
  char err[256] = "";
  const char *nested =
      "{\"processor_class\":\"Gemma4Processor\",\"feature_extractor\":{\"feature_size\":64,"
      "\"frame_length_ms\":25.0,\"hop_length_ms\":10.0,\"preemphasis\":0.97,"
      "\"preemphasis_htk_flavor\":false,\"fft_overdrive\":true,\"dither\":0.0,"
      "\"mel_floor\":1e-5,\"max_frequency\":7600.0}}";
  TH_REQUIRE(md_audio_fe_parse(nested, strlen(nested), &c, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT(c.n_mel, 64);
  TH_CHECK_EQ_INT(c.frame_length, 400);
  TH_CHECK_EQ_INT(c.fft_length, 1024);
  TH_CHECK_EQ_INT(c.preemphasis_htk, 0);
  TH_CHECK_NEAR(c.max_frequency, 7600, 0);
  static const struct {
    const char *json, *names;
  } bad[] = {
      {"{\"feature_size\":0}", "feature_size"},
      {"{\"feature_size\":12.5}", "feature_size"},
      {"{\"sampling_rate\":\"16k\"}", "sampling_rate"},
      {"{\"dither\":0.0001}", "dither"},
      {"{\"preemphasis\":1.5}", "preemphasis"},
      {"{\"preemphasis_htk_flavor\":1}", "preemphasis_htk_flavor"},
      {"{\"max_frequency\":9000}", "max_frequency"},
      {"{\"min_frequency\":8000}", "max_frequency"},
      {"{\"mel_floor\":0}", "mel_floor"},
      {"{\"per_bin_mean\":[1,2]}", "per_bin_mean"},
      {"{\"feature_size\":2,\"per_bin_stddev\":[1,0]}", "per_bin_stddev"},
      {"[1,2]", "JSON object"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    err[0] = 0;
    int rc = md_audio_fe_parse(bad[i].json, strlen(bad[i].json), &c, err, sizeof(err));
    if (rc == 0 || !strstr(err, bad[i].names))
      th_fail(__FILE__, __LINE__, "%s: rc %d, \"%s\" does not name %s", bad[i].json, rc, err,
              bad[i].names);
  }
}

/* ---- against the numpy reference ----------------------------------------------------- */

static const char *configs[] = {
    "{}",
    "{\"preemphasis\":0.97,\"input_scale_factor\":2.0,\"fft_overdrive\":true,"
    "\"per_bin_mean\":\"MEAN\",\"per_bin_stddev\":\"STD\"}",
    "{\"preemphasis\":0.9,\"preemphasis_htk_flavor\":false,\"feature_size\":80,"
    "\"frame_length_ms\":25.0,\"hop_length_ms\":12.5,\"min_frequency\":60.0,"
    "\"max_frequency\":7000.0,\"mel_floor\":1e-5,\"pad_to_multiple_of\":100}",
};

/* configs[k] with "MEAN"/"STD" replaced by 128 numbers */
static char *config_text(int k) {
  const char *t = configs[k];
  size_t cap = strlen(t) + 2 * 128 * 24 + 1;
  char *s = malloc(cap), *o = s;
  while (*t) {
    int mean = !strncmp(t, "\"MEAN\"", 6), std = !strncmp(t, "\"STD\"", 5);
    if (mean || std) {
      o += sprintf(o, "[");
      for (int i = 0; i < 128; i++)
        o += sprintf(o, "%s%.17g", i ? "," : "", mean ? -3.0 + 0.05 * i : 0.5 + 0.02 * (i % 17));
      o += sprintf(o, "]");
      t += mean ? 6 : 5;
    } else {
      *o++ = *t++;
    }
  }
  *o = 0;
  return s;
}

static float *signal(int kind, size_t n, unsigned seed) {
  float *x = calloc(n ? n : 1, sizeof(float));
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; i++) {
    double t = (double)i / 16000;
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    double noise = (double)(s >> 11) / 9007199254740992.0 - 0.5;
    switch (kind) {
    case 0: x[i] = (float)(0.5 * sin(2 * M_PI * 440 * t)); break;
    case 1: x[i] = (float)(0.3 * sin(2 * M_PI * (100 + 3000 * t) * t) + 0.05 * noise); break;
    case 2: x[i] = 0; break;
    case 3: x[i] = i % 800 == 0 ? 0.9f : 0.0f; break;
    default: x[i] = (float)(0.8 * noise); break;
    }
  }
  return x;
}

TH_TEST(features_match_reference) {
  const char *python = th_require_numpy("Gemma 4's audio features", "gemma4_audio_ref.py");
  char dir[4096];
  TH_REQUIRE(th_tmpdir("g4-audio", dir, sizeof(dir)) == 0);
  static const struct {
    int kind;
    size_t n;
  } cases[] = {{0, 16000}, {1, 37913},  {2, 5000},   {3, 12800}, {4, 100},
               {4, 321},   {0, 480000}, {1, 481000}, {4, 1},     {1, 160 * 50 + 17}};
  char script[4200], cfgp[4300], inp[4300], outp[4300], log[8192];
  snprintf(script, sizeof(script), "%s/reference/gemma4_audio_ref.py", th_tests_dir());
  snprintf(cfgp, sizeof(cfgp), "%s/config.json", dir);
  snprintf(inp, sizeof(inp), "%s/in.f32", dir);
  snprintf(outp, sizeof(outp), "%s/out.bin", dir);
  double worst_rel = 0;
  for (int k = 0; k < (int)(sizeof(configs) / sizeof(configs[0])); k++) {
    char *text = config_text(k);
    struct md_audio_fe_cfg c;
    char err[256] = "";
    TH_REQUIRE(md_audio_fe_parse(text, strlen(text), &c, err, sizeof(err)) == 0);
    FILE *f = fopen(cfgp, "w");
    TH_REQUIRE(f);
    fputs(text, f);
    fclose(f);
    free(text);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
      size_t n = cases[i].n;
      float *x = signal(cases[i].kind, n, (unsigned)(i + 1));
      f = fopen(inp, "wb");
      TH_REQUIRE(f);
      fwrite(x, sizeof(float), n, f);
      fclose(f);
      char *argv[] = {(char *)python, script, "features", cfgp, inp, outp, NULL};
      if (cm_run_capture(argv, log, sizeof(log)) != 0) {
        th_fail(__FILE__, __LINE__, "gemma4_audio_ref.py failed:\n%s", log);
        th_stop();
      }
      int ref_frames = -1, ref_tokens = -1;
      sscanf(log, "%d %d", &ref_frames, &ref_tokens);
      size_t nf = md_audio_fe_frames(&c, n);
      TH_CHECK_EQ_INT((int)nf, ref_frames);
      size_t nm = (size_t)c.n_mel;
      float *feat = malloc((nf ? nf : 1) * nm * sizeof(float));
      uint8_t *mask = malloc(nf ? nf : 1);
      TH_REQUIRE(md_audio_features(&c, x, n, feat, mask) == 0);
      TH_CHECK_EQ_INT(md_audio_soft_tokens(mask, nf), ref_tokens);
      double *ref = malloc((nf ? nf : 1) * nm * sizeof(double));
      uint8_t *rmask = malloc(nf ? nf : 1);
      f = fopen(outp, "rb");
      TH_REQUIRE(f);
      size_t got = fread(ref, sizeof(double), nf * nm, f);
      got += fread(rmask, 1, nf, f);
      fclose(f);
      TH_REQUIRE(got == nf * nm + nf);
      double lo = INFINITY, hi = -INFINITY, diff = 0;
      for (size_t j = 0; j < nf * nm; j++) {
        lo = fmin(lo, ref[j]), hi = fmax(hi, ref[j]);
        diff = fmax(diff, fabs(feat[j] - ref[j]));
      }
      size_t mask_off = 0;
      for (size_t j = 0; j < nf; j++)
        mask_off += mask[j] != rmask[j];
      TH_CHECK_EQ_INT((int)mask_off, 0);
      double range = hi > lo ? hi - lo : 1.0;
      printf("  config %d, signal %d, %zu samples: %zu frames, %d tokens, max diff %.3g (range "
             "%.3g)\n",
             k, cases[i].kind, n, nf, ref_tokens, diff, nf ? range : 0.0);
      if (nf && diff / range > worst_rel) worst_rel = diff / range;
      if (nf && diff > 1e-4 * range)
        th_fail(__FILE__, __LINE__, "config %d case %zu: off by %g, over 1e-4 of the range %g", k,
                i, diff, range);
      free(x), free(feat), free(mask), free(ref), free(rmask);
    }
  }
  printf("  worst difference: %.3g of the range\n", worst_rel);
}

/* The longest clip: 2999 frames and 750 tokens under the defaults, the very
 * count md_audio_features' mask of a 30 s clip gives. */
TH_TEST(longest_clip) {
  struct md_audio_fe_cfg c;
  md_audio_fe_defaults(&c);
  TH_CHECK_EQ_INT((int)md_audio_fe_max_frames(&c), 2999);
  TH_CHECK_EQ_INT(md_audio_fe_max_tokens(&c), 750);
  c.max_samples = 16000 * 7 + 77; /* a shorter cap: the features' own mask decides */
  size_t nf = md_audio_fe_max_frames(&c);
  float *pcm = calloc((size_t)c.max_samples, sizeof(float));
  float *feat = malloc(sizeof(float) * nf * (size_t)c.n_mel);
  uint8_t *mask = malloc(nf);
  TH_REQUIRE(pcm && feat && mask);
  TH_REQUIRE(md_audio_features(&c, pcm, (size_t)c.max_samples, feat, mask) == 0);
  TH_CHECK_EQ_INT(md_audio_fe_max_tokens(&c), md_audio_soft_tokens(mask, nf));
  free(pcm);
  free(feat);
  free(mask);
}

/* A checkpoint's extractor: processor_config.json's "feature_extractor"; an
 * older preprocessor_config.json only when it is a feature extractor's; the
 * defaults without either; a bad field an error naming the file. */
TH_TEST(load_from_checkpoint) {
  char dir[256], err[256] = "";
  TH_REQUIRE(th_tmpdir("g4-audio-load", dir, sizeof(dir)) == 0);
  struct md_audio_fe_cfg c;
  TH_REQUIRE(md_audio_fe_load(dir, &c, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT(c.n_mel, 128);
  mdt_write_text(dir, "preprocessor_config.json",
                 "{\"image_processor_type\":\"Gemma4ImageProcessor\","
                 "\"feature_size\":32}");
  TH_REQUIRE(md_audio_fe_load(dir, &c, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT(c.n_mel, 128); /* an image processor's: not read */
  mdt_write_text(dir, "preprocessor_config.json",
                 "{\"feature_extractor_type\":\"Gemma4AudioFeatureExtractor\","
                 "\"feature_size\":32}");
  TH_REQUIRE(md_audio_fe_load(dir, &c, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT(c.n_mel, 32);
  mdt_write_text(dir, "processor_config.json", "{\"feature_extractor\":{\"feature_size\":64}}");
  TH_REQUIRE(md_audio_fe_load(dir, &c, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT(c.n_mel, 64); /* the newer file first */
  mdt_write_text(dir, "processor_config.json", "{\"feature_extractor\":{\"dither\":0.5}}");
  TH_CHECK_EQ_INT(md_audio_fe_load(dir, &c, err, sizeof(err)), CM_ERR_UNSUPPORTED);
  TH_CHECK(strstr(err, "processor_config.json") && strstr(err, "dither"));
}
