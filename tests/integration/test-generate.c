/* test-generate.c — `lmserve make-tiny-model` and `lmserve generate` as real
 * processes: deterministic checkpoints, the stdout format, chunked prefill
 * giving the same tokens, the assistant checkpoint, and clear errors. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

static char tmp[256];

/* The test's temporary folder with name in it, in path[300]; the folder goes at exit. */
static void tmp_path(char *path, const char *name) {
  if (!tmp[0]) TH_REQUIRE(th_tmpdir("gen", tmp, sizeof(tmp)) == 0);
  snprintf(path, 300, "%s/%s", tmp, name);
}

/* Runs `lmserve ARG...` (NULL-terminated) within 2 minutes: its exit code; o holds what
 * it wrote. */
#define lm(o, ...) th_lmserve((o), 120000, __VA_ARGS__, NULL)

/* 1 when the two files hold the same bytes. */
static int files_equal(const char *a, const char *b) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  int same = fa && fb;
  while (same) {
    int ca = getc(fa), cb = getc(fb);
    if (ca != cb) same = 0;
    if (ca == EOF || cb == EOF) break;
  }
  if (fa) fclose(fa);
  if (fb) fclose(fb);
  return same;
}

TH_TEST(make_tiny_model_is_deterministic) {
  th_proc_init(300);
  char m1[300], m2[300], m3[300], f1[400], f2[400], f3[400];
  tmp_path(m1, "m1");
  tmp_path(m2, "m2");
  tmp_path(m3, "m3");
  struct th_out o = {0};
  TH_CHECK_EQ_INT(lm(&o, "make-tiny-model", "--out", m1, "--vocab", "512", "--seed", "3"), 0);
  TH_CHECK_EQ_INT(lm(&o, "make-tiny-model", "--out", m2, "--vocab", "512", "--seed", "3"), 0);
  TH_CHECK_EQ_INT(lm(&o, "make-tiny-model", "--out", m3, "--vocab", "512", "--seed", "4"), 0);
  TH_CHECK(strstr(o.err, "no tokenizer") != NULL); /* vocab 512 is not the Gemma tokenizer's */
  snprintf(f1, sizeof(f1), "%s/model.safetensors", m1);
  snprintf(f2, sizeof(f2), "%s/model.safetensors", m2);
  snprintf(f3, sizeof(f3), "%s/model.safetensors", m3);
  TH_CHECK(files_equal(f1, f2));
  TH_CHECK(!files_equal(f1, f3));
  snprintf(f1, sizeof(f1), "%s/config.json", m1);
  snprintf(f2, sizeof(f2), "%s/config.json", m2);
  TH_CHECK(files_equal(f1, f2));
  th_out_free(&o);
}

TH_TEST(generate_ids_and_chunking) {
  th_proc_init(300);
  char m[300];
  tmp_path(m, "g3");
  struct th_out o = {0};
  TH_REQUIRE(lm(&o, "make-tiny-model", "--arch", "gemma3", "--out", m, "--vocab", "512") == 0);
  /* 100 prompt ids: crosses the 64-token sliding window */
  char ids[1024] = "[2";
  for (int i = 1; i < 100; i++)
    snprintf(ids + strlen(ids), sizeof(ids) - strlen(ids), ",%d", (i * 37) % 500 + 3);
  strcat(ids, "]");
  struct th_out r1 = {0}, r2 = {0}, r3 = {0};
  TH_REQUIRE(lm(&r1, "generate", "--model", m, "--prompt-ids", ids, "--max-tokens", "12",
                "--ignore-eos") == 0);
  TH_REQUIRE(lm(&r2, "generate", "--model", m, "--prompt-ids", ids, "--max-tokens", "12",
                "--chunk=7", "--ignore-eos") == 0);
  TH_REQUIRE(lm(&r3, "generate", "--model", m, "--prompt-ids", ids, "--max-tokens", "12",
                "--chunk=1", "--ignore-eos") == 0);
  const char *o1 = r1.out, *o2 = r2.out, *o3 = r3.out;
  TH_CHECK(o1[0] == '[' && strchr(o1, ']') && strchr(o1, '\n'));
  int commas = 0;
  for (const char *p = o1; *p && *p != '\n'; p++)
    commas += *p == ',';
  TH_CHECK_EQ_INT(commas, 11);
  /* the same tokens however the prompt is chunked */
  TH_CHECK_EQ_STR(o1, o2);
  TH_CHECK_EQ_STR(o1, o3);
  TH_CHECK(strcmp(strchr(o1, '\n'), "\n\n") == 0); /* no tokenizer: empty second line */
  /* the bf16 mode: 12 tokens, the same whether the prompt is chunked or not */
  TH_REQUIRE(lm(&r2, "generate", "--model", m, "--prompt-ids", ids, "--max-tokens", "12", "--dtype",
                "bfloat16", "--ignore-eos") == 0);
  TH_REQUIRE(lm(&r3, "generate", "--model", m, "--prompt-ids", ids, "--max-tokens", "12",
                "--chunk=7", "--dtype=bf16", "--ignore-eos") == 0);
  TH_CHECK_EQ_STR(r2.out, r3.out);
  commas = 0;
  for (const char *p = r2.out; *p && *p != '\n'; p++)
    commas += *p == ',';
  TH_CHECK_EQ_INT(commas, 11);
  th_out_free(&o);
  th_out_free(&r1);
  th_out_free(&r2);
  th_out_free(&r3);
}

TH_TEST(generate_text_with_tokenizer_and_assistant) {
  th_proc_init(300);
  char m[300], a[300];
  tmp_path(m, "g4");
  tmp_path(a, "g4-assistant");
  struct th_out o = {0};
  TH_REQUIRE(lm(&o, "make-tiny-model", "--out", m) == 0);
  int have_tok = strstr(o.err, "no tokenizer") == NULL;
  if (have_tok) {
    TH_REQUIRE(lm(&o, "generate", "--model", m, "--prompt", "The capital of France is",
                  "--max-tokens", "8", "--ignore-eos") == 0);
    char *nl = strchr(o.out, '\n');
    TH_REQUIRE(nl && o.out[0] == '[');
    TH_CHECK(strlen(nl + 1) > 1); /* some decoded text */
  } else {
    fprintf(stderr, "note: the Gemma tokenizer is not installed; --prompt not exercised\n");
  }
  TH_REQUIRE(lm(&o, "make-tiny-model", "--arch", "gemma4-assistant", "--target", m, "--out", a) ==
             0);
  char cfg[400];
  snprintf(cfg, sizeof(cfg), "%s/config.json", a);
  FILE *f = fopen(cfg, "r");
  TH_REQUIRE(f);
  char buf[4096] = "";
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  buf[n] = 0;
  fclose(f);
  TH_CHECK(strstr(buf, "\"gemma4_assistant\"") && strstr(buf, "\"backbone_hidden_size\": 64"));
  /* speculative decoding with the assistant gives the same tokens */
  char dflag[400];
  snprintf(dflag, sizeof(dflag), "--draft=%s", a);
  struct th_out plain = {0};
  TH_REQUIRE(lm(&plain, "generate", "--model", m, "--prompt-ids", "2,100,200,300,400",
                "--max-tokens", "12", "--ignore-eos") == 0);
  TH_REQUIRE(lm(&o, "generate", "--model", m, "--prompt-ids", "2,100,200,300,400",
                "--max-tokens=12", "--ignore-eos", dflag, "--draft-tokens=3") == 0);
  TH_CHECK(strstr(o.err, "draft tokens proposed") != NULL);
  TH_CHECK_EQ_STR(plain.out, o.out);
  th_out_free(&plain);
  /* the assistant is not a standalone model: a clear error, no crash */
  TH_CHECK_EQ_INT(lm(&o, "generate", "--model", a, "--prompt-ids", "2,3"), 1);
  TH_CHECK(strstr(o.err, "draft model") != NULL);
  th_out_free(&o);
}

TH_TEST(generate_errors) {
  th_proc_init(120);
  char m[300];
  tmp_path(m, "e");
  struct th_out o = {0};
  TH_REQUIRE(lm(&o, "make-tiny-model", "--out", m, "--vocab", "512") == 0);
  TH_CHECK_EQ_INT(lm(&o, "generate", "--model", m, "--prompt-ids", "2,999"), 1);
  TH_CHECK(strstr(o.err, "999") && strstr(o.err, "vocabulary"));
  TH_CHECK_EQ_INT(lm(&o, "generate", "--model", m, "--prompt", "hi"), 2);
  TH_CHECK(strstr(o.err, "tokenizer.json") != NULL);
  TH_CHECK_EQ_INT(lm(&o, "generate", "--model", "/nonexistent-dir", "--prompt-ids", "2"), 1);
  TH_CHECK(strstr(o.err, "config.json") != NULL);
  TH_CHECK_EQ_INT(lm(&o, "generate", "--model", m, "--prompt-ids", "x"), 2);
  TH_CHECK_EQ_INT(lm(&o, "make-tiny-model", "--arch", "llama", "--out", m), 2);
  TH_CHECK(strstr(o.err, "llama") != NULL);
  TH_CHECK_EQ_INT(lm(&o, "generate", "--model", m, "--prompt-ids", "2", "--dtype", "half"), 2);
  TH_CHECK(strstr(o.err, "--dtype half") != NULL);
  th_out_free(&o);
}
