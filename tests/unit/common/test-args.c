/* test-args.c — cm_args_parse: forms, ranges, sizes, errors. */
#include <stdint.h>

#include "common/cm-args.h"
#include "common/cm-err.h"
#include "tests/harness/th.h"

TH_TEST(args_forms) {
  const char *model = NULL;
  int64_t port = 8000;
  uint64_t kv = 0;
  int prefix = 1;
  double temp = 1.0;
  int seen_port = 0;
  struct cm_opt opts[] = {
      {"model", CM_OPT_STR, &model, "DIR", "model", 0, 0, 0, 0, NULL},
      {"port", CM_OPT_INT, &port, "N", "port", 1, 65535, 0, 0, &seen_port},
      {"kv-cache-memory", CM_OPT_SIZE, &kv, "BYTES", "kv", 0, 0, 0, 0, NULL},
      {"enable-prefix-caching", CM_OPT_BOOL, &prefix, NULL, "pc", 0, 0, 0, 0, NULL},
      {"temperature", CM_OPT_DOUBLE, &temp, "T", "t", 0, 0, 0.0, 2.0, NULL},
      {0},
  };
  char *argv[] = {"x", "--model", "/m", "--port=9000", "--kv-cache-memory", "1.5G",
                  "--no-enable-prefix-caching", "--temperature", "0.5", "pos"};
  const char *pos[2];
  int npos = 0;
  int rc = cm_args_parse("x", NULL, opts, 10, argv, 1, pos, 2, &npos);
  TH_CHECK_EQ_INT(rc, CM_ARGS_OK);
  TH_CHECK_EQ_STR(model, "/m");
  TH_CHECK_EQ_INT(port, 9000);
  TH_CHECK_EQ_INT(seen_port, 1);
  TH_CHECK_EQ_INT(kv, 1610612736);
  TH_CHECK_EQ_INT(prefix, 0);
  TH_CHECK_NEAR(temp, 0.5, 0);
  TH_CHECK_EQ_INT(npos, 1);
  TH_CHECK_EQ_STR(pos[0], "pos");
}

TH_TEST(args_errors) {
  int64_t port = 0;
  struct cm_opt opts[] = {
      {"port", CM_OPT_INT, &port, "N", "port", 1, 65535, 0, 0, NULL},
      {0},
  };
  const char *pos[1];
  char *bad1[] = {"x", "--port", "abc"};
  TH_CHECK(cm_args_parse("x", NULL, opts, 3, bad1, 1, pos, 0, NULL) < 0);
  char *bad2[] = {"x", "--port", "70000"};
  TH_CHECK(cm_args_parse("x", NULL, opts, 3, bad2, 1, pos, 0, NULL) < 0);
  char *bad3[] = {"x", "--nope"};
  TH_CHECK(cm_args_parse("x", NULL, opts, 2, bad3, 1, pos, 0, NULL) < 0);
  char *bad4[] = {"x", "--port"};
  TH_CHECK(cm_args_parse("x", NULL, opts, 2, bad4, 1, pos, 0, NULL) < 0);
  char *bad5[] = {"x", "stray"};
  TH_CHECK(cm_args_parse("x", NULL, opts, 2, bad5, 1, pos, 0, NULL) < 0);
  uint64_t v;
  TH_CHECK(cm_parse_size("12Q", &v) < 0);
  TH_CHECK(cm_parse_size("-1", &v) < 0);
  TH_CHECK(cm_parse_size("512MiB", &v) == 0 && v == 512ull << 20);
  TH_CHECK(cm_parse_size("4096", &v) == 0 && v == 4096);
}
