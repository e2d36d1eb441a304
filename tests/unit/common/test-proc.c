/* test-proc.c — cm_fail's formatting and cm_run_capture's spawn, capture and status. */
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-proc.h"
#include "tests/harness/th.h"

TH_TEST(fail_formats_and_returns_code) {
  char err[16];
  TH_CHECK_EQ_INT(cm_fail(err, sizeof err, CM_ERR_RANGE, "value %d of %s", 42, "field"),
                  CM_ERR_RANGE);
  TH_CHECK(!strcmp(err, "value 42 of fie")); /* truncated to fit, NUL-terminated */
  TH_CHECK_EQ_INT(cm_fail(NULL, 0, CM_ERR_PARSE, "nowhere to write %s", "this"), CM_ERR_PARSE);
  char one[1] = {'x'};
  TH_CHECK_EQ_INT(cm_fail(one, sizeof one, CM_ERR_IO, "abc"), CM_ERR_IO);
  TH_CHECK(one[0] == 0);
}

TH_TEST(run_capture_output_and_status) {
  char out[64];
  char *const ok[] = {"sh", "-c", "printf 'to out '; printf 'to err' >&2", NULL};
  TH_CHECK_EQ_INT(cm_run_capture(ok, out, sizeof out), 0);
  TH_CHECK(!strcmp(out, "to out to err"));
  char *const code[] = {"sh", "-c", "echo x; exit 7", NULL};
  TH_CHECK_EQ_INT(cm_run_capture(code, out, sizeof out), 7);
  TH_CHECK(!strcmp(out, "x\n"));
  char *const killed[] = {"sh", "-c", "kill -9 $$", NULL};
  TH_CHECK_EQ_INT(cm_run_capture(killed, out, sizeof out), 128 + 9);
  /* arguments are passed as they are: no shell parses them */
  char *const literal[] = {"printf", "%s", "'$HOME; rm -rf /'", NULL};
  TH_CHECK_EQ_INT(cm_run_capture(literal, out, sizeof out), 0);
  TH_CHECK(!strcmp(out, "'$HOME; rm -rf /'"));
}

TH_TEST(run_capture_drains_long_output) {
  /* 1 MiB of output into a 32-byte buffer: the child must not block on a full pipe */
  char out[32];
  char *const big[] = {"head", "-c", "1048576", "/dev/zero", NULL};
  TH_CHECK_EQ_INT(cm_run_capture(big, out, sizeof out), 0);
  char *const text[] = {"sh", "-c", "yes abcdef | head -c 100000", NULL};
  TH_CHECK_EQ_INT(cm_run_capture(text, out, sizeof out), 0);
  TH_CHECK_EQ_INT((int)strlen(out), 31);
  TH_CHECK(!strncmp(out, "abcdef\nabcdef\n", 14));
}

TH_TEST(run_capture_bad_arguments) {
  char out[8];
  char *const missing[] = {"lmserve-no-such-program-here", NULL};
  TH_CHECK_EQ_INT(cm_run_capture(missing, out, sizeof out), CM_ERR_NOENT);
  char *const empty[] = {NULL};
  TH_CHECK_EQ_INT(cm_run_capture(empty, out, sizeof out), CM_ERR_INVAL);
  char *const ok[] = {"true", NULL};
  TH_CHECK_EQ_INT(cm_run_capture(ok, out, 0), CM_ERR_INVAL);
}
