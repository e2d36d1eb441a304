/* test-log.c — log level parsing and error names. */
#include "common/cm-err.h"
#include "common/cm-log.h"
#include "tests/harness/th.h"

TH_TEST(log_levels) {
  enum cm_log_level l;
  TH_CHECK_EQ_INT(cm_log_parse_level("debug", &l), 0);
  TH_CHECK_EQ_INT(l, CM_LOG_DEBUG);
  TH_CHECK_EQ_INT(cm_log_parse_level("WARN", &l), 0);
  TH_CHECK_EQ_INT(l, CM_LOG_WARN);
  TH_CHECK(cm_log_parse_level("loud", &l) < 0);
  cm_log_set_level(CM_LOG_ERROR);
  TH_CHECK(!CM_LOG_ENABLED(CM_LOG_INFO));
  TH_CHECK(CM_LOG_ENABLED(CM_LOG_ERROR));
  cm_log_set_level(CM_LOG_INFO);
  cm_info("test", "a line with\na newline folded");
}

TH_TEST(err_names) {
  for (int e = 0; e > CM_ERR__LAST; e--) TH_CHECK(strcmp(cm_strerror(e), "unknown error") != 0);
  TH_CHECK_EQ_STR(cm_strerror(-1000), "unknown error");
}
