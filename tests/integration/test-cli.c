/* test-cli.c — the `lmserve` binary's top-level CLI behaviour. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

TH_TEST(cli_help_and_version) {
  th_proc_init(60);
  struct th_out o = {0};
  TH_CHECK_EQ_INT(th_lmserve(&o, 10000, "--help", NULL), 0);
  TH_CHECK(strstr(o.out, "usage: lmserve") != NULL);
  TH_CHECK(strstr(o.out, "make-tiny-model") != NULL);
  TH_CHECK_EQ_INT(th_lmserve(&o, 10000, "--version", NULL), 0);
  TH_CHECK(strncmp(o.out, "lmserve ", 8) == 0);
  TH_CHECK(strstr(o.out, "(cpu: ") != NULL);
  th_out_free(&o);
}

TH_TEST(cli_unknown_command) {
  th_proc_init(60);
  struct th_out o = {0};
  TH_CHECK_EQ_INT(th_lmserve(&o, 10000, "frobnicate", NULL), 2);
  TH_CHECK(strstr(o.err, "unknown command 'frobnicate'") != NULL);
  TH_CHECK_EQ_INT(th_lmserve(&o, 10000, NULL), 2);
  th_out_free(&o);
}

/* `bench model --kv-only` on an E2B-shaped config (no weights): only 15 of
 * the 35 layers store KV (12 sliding x 256, 3 full x 512, one KV head). */
TH_TEST(cli_bench_kv_only_e2b) {
  th_proc_init(60);
  const char *src = getenv("TH_SOURCE_DIR");
  char dir[1024];
  snprintf(dir, sizeof(dir), "%s/tests/fixtures/configs/gemma4-e2b", src ? src : ".");
  struct th_out o = {0};
  TH_CHECK_EQ_INT(
      th_lmserve(&o, 10000, "bench", "model", "--model", dir, "--kv-only", "--json", NULL), 0);
  const char *out = o.out;
  TH_CHECK(strstr(out, "\"layers\":35,\"kv_storing_layers\":15,") != NULL);
  TH_CHECK(strstr(out, "\"kind\":\"sliding\",\"head_dim\":256,\"kv_heads\":1,\"layers\":12,"
                       "\"bytes_per_token\":12288") != NULL);
  TH_CHECK(strstr(out, "\"kind\":\"full\",\"head_dim\":512,\"kv_heads\":1,\"layers\":3,"
                       "\"bytes_per_token\":6144") != NULL);
  TH_CHECK(strstr(out, "\"kv_bytes_per_token\":18432}") != NULL);
  /* a folder without config.json is a clear error, not a crash */
  TH_CHECK_EQ_INT(
      th_lmserve(&o, 10000, "bench", "model", "--model", "/nonexistent-lmserve", "--kv-only", NULL),
      1);
  TH_CHECK(strstr(o.err, "config.json") != NULL);
  th_out_free(&o);
}

/* --dtype takes auto, float32 or bfloat16 (and their short names), --kv-cache-dtype auto,
 * bf16, fp8 or f32 (and vLLM's long names); anything else is refused before a role starts,
 * by serve, worker, bench model and generate. */
TH_TEST(cli_dtypes_refused) {
  th_proc_init(60);
  static const struct th_refusal cases[] = {
      {{"serve", "--dtype", "float16"}, 2, "--dtype float16: not one of auto, float32, bfloat16"},
      {{"worker", "--model", "/nonexistent-lmserve", "--scheduler", "ipc:///nonexistent-lmserve",
        "--dtype", "int8"},
       2,
       "--dtype int8"},
      {{"bench", "model", "--model", "/nonexistent-lmserve", "--dtype", "fp8"}, 2, "--dtype fp8"},
      {{"serve", "--kv-cache-dtype", "fp8_e5m2"},
       2,
       "--kv-cache-dtype 'fp8_e5m2' is not one of auto, bf16, fp8, f32"},
      {{"worker", "--model", "/nonexistent-lmserve", "--scheduler", "ipc:///nonexistent-lmserve",
        "--kv-cache-dtype", "int4"},
       2,
       "--kv-cache-dtype 'int4'"},
      {{"generate", "--model", "/nonexistent-lmserve", "--prompt", "x", "--kv-dtype", "fp16"},
       2,
       "'fp16'"},
  };
  th_lmserve_refusals(cases, sizeof(cases) / sizeof(cases[0]), 10000);
}

/* serve checks the speculative flags before any role starts, in both their forms: the
 * JSON and the flags it stands for together, a method or key it does not serve, lookup
 * lengths without n-gram drafts or the wrong way round. */
TH_TEST(cli_speculative_flags_refused) {
  th_proc_init(60);
  static const struct th_refusal cases[] = {
      {{"serve", "--model", "/nonexistent-lmserve", "--speculative-config",
        "{\"method\": \"ngram\"}", "--num-speculative-tokens", "3"},
       2,
       "lmserve serve: --speculative-config or the separate speculative flags, not both"},
      {{"serve", "--model", "/nonexistent-lmserve", "--speculative-model", "ngram",
        "--speculative-config", "{\"method\": \"ngram\"}"},
       2,
       "not both"},
      {{"serve", "--model", "/nonexistent-lmserve", "--speculative-config",
        "{\"method\": \"eagle\", \"model\": \"x\"}"},
       2,
       "method \"eagle\" is not served"},
      {{"serve", "--model", "/nonexistent-lmserve", "--speculative-config",
        "{\"method\": \"ngram\", \"acceptance_method\": \"typical\"}"},
       2,
       "\"acceptance_method\" is not taken"},
      {{"serve", "--model", "/nonexistent-lmserve", "--speculative-config", "[4]"},
       2,
       "--speculative-config must be a JSON object"},
      {{"serve", "--model", "/nonexistent-lmserve", "--ngram-prompt-lookup-max", "3"},
       2,
       "lmserve serve: --ngram-prompt-lookup-max needs --speculative-model ngram"},
      {{"serve", "--model", "/nonexistent-lmserve", "--speculative-model", "ngram",
        "--ngram-prompt-lookup-max", "2", "--ngram-prompt-lookup-min", "3"},
       2,
       "--ngram-prompt-lookup-min 3 is above --ngram-prompt-lookup-max 2"},
      {{"serve", "--model", "/nonexistent-lmserve", "--speculative-model", "ngram",
        "--speculative-disable-by-batch-size", "1"},
       2,
       "--speculative-disable-by-batch-size must be between 2 and 65536"},
      {{"serve", "--model", "/nonexistent-lmserve", "--speculative-disable-by-batch-size", "8"},
       2,
       "--speculative-disable-by-batch-size needs speculative decoding"},
      {{"serve", "--model", "/nonexistent-lmserve", "--speculative-config",
        "{\"method\": \"ngram\", \"disable_by_batch_size\": 1}"},
       2,
       "disable_by_batch_size must be an integer in [2, 65536]"},
      {{"serve", "--model", "/nonexistent-lmserve", "--speculative-config",
        "{\"method\": \"ngram\"}", "--speculative-disable-by-batch-size", "8"},
       2,
       "not both"},
  };
  th_lmserve_refusals(cases, sizeof(cases) / sizeof(cases[0]), 10000);
}

/* `bench grammar` over a corpus: every grammar of the shipped corpus compiles (a
 * refused one would be a corpus or compiler regression) and the pooled figures
 * are printed; a corpus line that is not a grammar is an error naming the line. */
TH_TEST(cli_bench_grammar) {
  th_proc_init(300);
  struct th_out o = {0};
  TH_CHECK_EQ_INT(
      th_lmserve(&o, 240000, "bench", "grammar", "--generations", "1", "--max-tokens", "8", NULL),
      0);
  TH_CHECK(strstr(o.out, "pooled") && strstr(o.out, "; 0 refused"));
  TH_CHECK(strstr(o.out, "shapes (oneOf by const)") && strstr(o.out, "gbnf arithmetic"));
  char dir[256], path[320];
  TH_REQUIRE(th_tmpdir("bench-grammar", dir, sizeof dir) == 0);
  snprintf(path, sizeof path, "%s/corpus.jsonl", dir);
  FILE *f = fopen(path, "w");
  TH_REQUIRE(f);
  fputs("{\"name\":\"ok\",\"kind\":\"regex\",\"text\":\"[a-z]+\"}\n{\"name\":\"x\",\"kind\":"
        "\"yaml\",\"text\":\"\"}\n",
        f);
  fclose(f);
  TH_CHECK_EQ_INT(th_lmserve(&o, 60000, "bench", "grammar", "--corpus", path, NULL), 1);
  TH_CHECK(strstr(o.err, "corpus line 2") != NULL);
  th_out_free(&o);
}

/* `bench matmul`: a line a token count for weight formats in each mode, from
 * cache and from memory (the fraction of the probe printed); a format it does
 * not know, columns that are not whole blocks, a token count out of range and
 * an unknown --from are refused before anything runs. */
TH_TEST(cli_bench_matmul) {
  th_proc_init(120);
  struct th_out o = {0};
  static const char *const runs[][4] = {
      {"q8_0", "q8", "cache", "laid out as q8_0x16"},
      {"q4_k", "q8", "cache", "laid out as q4_kx16"},
      {"q6_k", "auto", "cache", "laid out as q6_k"},
      {"bf16", "bfloat16", "cache", "laid out as bf16"},
      {"q4_0", "q8", "memory", "; the probe "},
      {"q2_k", "q8", "cache", "laid out as q2_kx16"}, /* read-only formats: random blocks */
      {"iq4_xs", "auto", "cache", "laid out as iq4_xs"},
  };
  for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
    TH_CHECK_EQ_INT(th_lmserve(&o, 60000, "bench", "matmul", "--weights", runs[i][0], "--dtype",
                               runs[i][1], "--from", runs[i][2], "--rows", "40", "--cols", "512",
                               "--tokens", "1,17", "--threads", "2", "--seconds", "0.05", NULL),
                    0);
    TH_CHECK(strstr(o.out, "# lmserve bench matmul --weights ") != NULL);
    TH_CHECK(strstr(o.out, "\nT    1 ") && strstr(o.out, "\nT   17 ") && strstr(o.out, " GOP/s "));
    /* (the reference table keeps a weight's rows as they are) */
    const int said = strstr(o.out, runs[i][3]) || strstr(o.out, "cpu-ref");
    if (!said) fprintf(stderr, "no '%s' in:\n%s", runs[i][3], o.out);
    TH_CHECK(said);
  }
  static const struct th_refusal cases[] = {
      {{"bench", "matmul", "--weights", "q8_0x16"}, 2, "unknown format 'q8_0x16'"},
      {{"bench", "matmul", "--weights", "iq2_xs"}, 2, "unknown format 'iq2_xs'"},
      {{"bench", "matmul", "--weights", "q4_k", "--cols", "288"}, 2, "not whole blocks of q4_k"},
      {{"bench", "matmul", "--tokens", "1,0"}, 2, "'0' is not a count"},
      {{"bench", "matmul", "--from", "disk"}, 2, "neither cache nor memory"},
      {{"bench", "matmul", "--dtype", "int8"}, 2, "--dtype"},
  };
  th_lmserve_refusals(cases, sizeof(cases) / sizeof(cases[0]), 10000);
  th_out_free(&o);
}
