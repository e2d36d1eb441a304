/* test-cli.c — the `lmserve` binary's top-level CLI behaviour. */
#include <stdlib.h>

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
