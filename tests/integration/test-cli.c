/* test-cli.c — the `lmserve` binary's top-level CLI behaviour. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

static char *bin(void) {
  char *b = getenv("LMSERVE_BIN");
  return b ? b : "build/tools/lmserve";
}

TH_TEST(cli_help_and_version) {
  th_proc_init(60);
  char *out = NULL, *err = NULL;
  char *a1[] = {bin(), "--help", NULL};
  TH_CHECK_EQ_INT(th_run(a1, NULL, NULL, 0, 10000, &out, &err), 0);
  TH_CHECK(strstr(out, "usage: lmserve") != NULL);
  TH_CHECK(strstr(out, "make-tiny-model") != NULL);
  free(out);
  free(err);
  char *a2[] = {bin(), "--version", NULL};
  TH_CHECK_EQ_INT(th_run(a2, NULL, NULL, 0, 10000, &out, &err), 0);
  TH_CHECK(strncmp(out, "lmserve ", 8) == 0);
  free(out);
  free(err);
}

TH_TEST(cli_unknown_command) {
  th_proc_init(60);
  char *out = NULL, *err = NULL;
  char *a[] = {bin(), "frobnicate", NULL};
  TH_CHECK_EQ_INT(th_run(a, NULL, NULL, 0, 10000, &out, &err), 2);
  TH_CHECK(strstr(err, "unknown command 'frobnicate'") != NULL);
  free(out);
  free(err);
  char *b[] = {bin(), NULL};
  TH_CHECK_EQ_INT(th_run(b, NULL, NULL, 0, 10000, &out, &err), 2);
  free(out);
  free(err);
}

/* `bench model --kv-only` on an E2B-shaped config (no weights): only 15 of
 * the 35 layers store KV (12 sliding x 256, 3 full x 512, one KV head). */
TH_TEST(cli_bench_kv_only_e2b) {
  th_proc_init(60);
  const char *src = getenv("TH_SOURCE_DIR");
  char dir[1024];
  snprintf(dir, sizeof(dir), "%s/tests/fixtures/configs/gemma4-e2b", src ? src : ".");
  char *out = NULL, *err = NULL;
  char *a[] = {bin(), "bench", "model", "--model", dir, "--kv-only", "--json", NULL};
  TH_CHECK_EQ_INT(th_run(a, NULL, NULL, 0, 10000, &out, &err), 0);
  TH_CHECK(strstr(out, "\"layers\":35,\"kv_storing_layers\":15,") != NULL);
  TH_CHECK(strstr(out, "\"kind\":\"sliding\",\"head_dim\":256,\"kv_heads\":1,\"layers\":12,"
                       "\"bytes_per_token\":12288") != NULL);
  TH_CHECK(strstr(out, "\"kind\":\"full\",\"head_dim\":512,\"kv_heads\":1,\"layers\":3,"
                       "\"bytes_per_token\":6144") != NULL);
  TH_CHECK(strstr(out, "\"kv_bytes_per_token\":18432}") != NULL);
  free(out);
  free(err);
  /* a folder without config.json is a clear error, not a crash */
  char *b[] = {bin(), "bench", "model", "--model", "/nonexistent-lmserve", "--kv-only", NULL};
  TH_CHECK_EQ_INT(th_run(b, NULL, NULL, 0, 10000, &out, &err), 1);
  TH_CHECK(strstr(err, "config.json") != NULL);
  free(out);
  free(err);
}
