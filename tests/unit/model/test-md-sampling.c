/* test-md-sampling.c — the sampling defaults of generation_config.json as vLLM's
 * --generation-config reads them: transformers' own defaults say nothing, an
 * override names every field it has, bad values are errors naming them, and the
 * modes auto, vllm and a folder. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "model/md-config.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

static int parse(const char *text, int override, struct md_sampling *s, char *err, size_t n) {
  return md_sampling_parse(text, strlen(text), override, "gc.json", s, err, n);
}

TH_TEST(sampling_from_generation_config) {
  struct md_sampling s = {0};
  char err[256];
  /* Gemma 3's: top_k and top_p; do_sample and the ids are not sampling defaults */
  TH_CHECK_EQ_INT(parse("{\"bos_token_id\":2,\"do_sample\":true,\"eos_token_id\":[1,106],"
                        "\"top_k\":64,\"top_p\":0.95}",
                        0, &s, err, sizeof err),
                  0);
  TH_CHECK_EQ_INT(s.has, MD_SAMPLE_TOP_K | MD_SAMPLE_TOP_P);
  TH_CHECK_EQ_INT(s.top_k, 64);
  TH_CHECK(s.top_p == 0.95);
  /* transformers' defaults say nothing (to_diff_dict drops them), as in vLLM */
  memset(&s, 0, sizeof s);
  TH_CHECK_EQ_INT(parse("{\"temperature\":1.0,\"top_k\":50,\"top_p\":1.0,"
                        "\"repetition_penalty\":1.0,\"min_p\":null}",
                        0, &s, err, sizeof err),
                  0);
  TH_CHECK_EQ_INT(s.has, 0);
  /* every field */
  TH_CHECK_EQ_INT(parse("{\"temperature\":0.6,\"top_k\":0,\"top_p\":0.9,\"min_p\":0.05,"
                        "\"repetition_penalty\":1.1,\"max_new_tokens\":300}",
                        0, &s, err, sizeof err),
                  0);
  TH_CHECK_EQ_INT(s.has, MD_SAMPLE_TEMPERATURE | MD_SAMPLE_TOP_K | MD_SAMPLE_TOP_P |
                             MD_SAMPLE_MIN_P | MD_SAMPLE_REPETITION_PENALTY |
                             MD_SAMPLE_MAX_TOKENS);
  TH_CHECK(s.temperature == 0.6 && s.top_p == 0.9 && s.min_p == 0.05 &&
           s.repetition_penalty == 1.1);
  TH_CHECK_EQ_INT(s.top_k, -1); /* 0: off */
  TH_CHECK_EQ_INT(s.max_tokens, 300);
  /* an override names what it has, a default value too, over what was there */
  TH_CHECK_EQ_INT(parse("{\"temperature\":1}", 1, &s, err, sizeof err), 0);
  TH_CHECK(s.temperature == 1.0 && (s.has & MD_SAMPLE_TEMPERATURE));
  TH_CHECK(s.top_p == 0.9); /* kept */
  /* refusals name the field */
  static const char *const bad[][2] = {
      {"{\"temperature\":3}", "temperature"},   {"{\"temperature\":\"hot\"}", "temperature"},
      {"{\"top_p\":0}", "top_p"},               {"{\"top_k\":-2}", "top_k"},
      {"{\"top_k\":1.5}", "top_k"},             {"{\"min_p\":2}", "min_p"},
      {"{\"repetition_penalty\":0}", "repetition_penalty"},
      {"{\"max_new_tokens\":0}", "max_new_tokens"},
      {"[1]", "not a JSON object"},             {"{\"top_k\":", "gc.json: line"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    memset(&s, 0, sizeof s);
    int rc = parse(bad[i][0], 0, &s, err, sizeof err);
    if (!rc || !strstr(err, bad[i][1]) || strncmp(err, "gc.json", 7))
      th_fail(__FILE__, __LINE__, "%s: rc %d, '%s'", bad[i][0], rc, err);
  }
}

TH_TEST(sampling_modes) {
  char dir[512], path[600], err[512];
  TH_REQUIRE(th_tmpdir("sampling", dir, sizeof dir) == 0);
  snprintf(path, sizeof path, "%s/generation_config.json", dir);
  FILE *f = fopen(path, "w");
  TH_REQUIRE(f);
  fputs("{\"temperature\":0.7,\"top_k\":64}", f);
  fclose(f);
  struct md_sampling s;
  /* auto: the model folder's */
  TH_CHECK_EQ_INT(md_sampling_load("auto", dir, NULL, &s, err, sizeof err), 0);
  TH_CHECK_EQ_INT(s.has, MD_SAMPLE_TEMPERATURE | MD_SAMPLE_TOP_K);
  /* vllm: none, and an override alone */
  TH_CHECK_EQ_INT(md_sampling_load("vllm", dir, NULL, &s, err, sizeof err), 0);
  TH_CHECK_EQ_INT(s.has, 0);
  TH_CHECK_EQ_INT(md_sampling_load("vllm", dir, "{\"top_p\":0.5}", &s, err, sizeof err), 0);
  TH_CHECK_EQ_INT(s.has, MD_SAMPLE_TOP_P);
  /* a folder named, with the model elsewhere; an override on top */
  TH_CHECK_EQ_INT(md_sampling_load(dir, "/nonexistent", "{\"temperature\":0}", &s, err, sizeof err),
                  0);
  TH_CHECK_EQ_INT(s.has, MD_SAMPLE_TEMPERATURE | MD_SAMPLE_TOP_K);
  TH_CHECK(s.temperature == 0.0);
  /* auto on a file (a GGUF model) or a folder without one: none */
  TH_CHECK_EQ_INT(md_sampling_load("auto", path, NULL, &s, err, sizeof err), 0);
  TH_CHECK_EQ_INT(s.has, 0);
  /* a named folder that is not one, a bad override */
  TH_CHECK(md_sampling_load("/nonexistent/gc", dir, NULL, &s, err, sizeof err) != 0);
  TH_CHECK(strstr(err, "--generation-config /nonexistent/gc") != NULL);
  TH_CHECK(md_sampling_load("auto", dir, "{\"top_p\":7}", &s, err, sizeof err) != 0);
  TH_CHECK(strstr(err, "--override-generation-config") && strstr(err, "top_p"));
  unlink(path);
  rmdir(dir);
}
