/* cm-log.c — the logger behind cm-log.h. */
#include "common/cm-log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-time.h"

static enum cm_log_level g_level = CM_LOG_INFO;

void cm_log_set_level(enum cm_log_level level) { g_level = level; }
enum cm_log_level cm_log_get_level(void) { return g_level; }

int cm_log_parse_level(const char *s, enum cm_log_level *out) {
  static const char *names[] = {"error", "warn", "info", "debug", "trace"};
  for (unsigned i = 0; i < CM_ARRAY_LEN(names); i++) {
    if (strcasecmp(s, names[i]) == 0) {
      *out = (enum cm_log_level)i;
      return CM_OK;
    }
  }
  return CM_ERR_INVAL;
}

void cm_log_init_from_env(void) {
  const char *s = getenv("LMSERVE_LOG");
  enum cm_log_level lvl;
  if (s && *s && cm_log_parse_level(s, &lvl) == CM_OK) g_level = lvl;
}

/* The line's head ("2026-...Z I tag[pid] ") into buf; its length, or -1. */
static int line_head(char *buf, size_t cap, enum cm_log_level level, const char *tag) {
  static const char letters[] = "EWIDT";
  uint64_t now = cm_time_wall_ns();
  time_t secs = (time_t)(now / 1000000000ull);
  struct tm tm;
  gmtime_r(&secs, &tm);
  return snprintf(
      buf, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %c %s[%d] ", tm.tm_year + 1900, tm.tm_mon + 1,
      tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)((now / 1000000ull) % 1000ull),
      letters[level <= CM_LOG_TRACE ? level : CM_LOG_TRACE], tag ? tag : "-", (int)getpid());
}

void cm_log_write(enum cm_log_level level, const char *tag, const char *fmt, ...) {
  char buf[2048];
  int n = line_head(buf, sizeof(buf), level, tag);
  if (n < 0) return;
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
  if (len > sizeof(buf) - 2) len = sizeof(buf) - 2;
  /* one event, one line: fold embedded newlines */
  for (size_t i = (size_t)n; i < len; i++)
    if (buf[i] == '\n' || buf[i] == '\r') buf[i] = ' ';
  buf[len++] = '\n';
  ssize_t w = write(STDERR_FILENO, buf, len);
  (void)w;
}

void cm_log_text(enum cm_log_level level, const char *tag, const char *text, size_t len) {
  if (!CM_LOG_ENABLED(level)) return;
  char head[256];
  int n = line_head(head, sizeof(head), level, tag);
  if (n < 0) return;
  if ((size_t)n >= sizeof(head)) n = (int)sizeof(head) - 1; /* (a tag past 200 bytes) */
  size_t total = (size_t)n + len + 1;
  char *line = malloc(total);
  if (!line) return;
  memcpy(line, head, (size_t)n);
  for (size_t i = 0; i < len; i++) /* one event, one line */
    line[(size_t)n + i] = text[i] == '\n' || text[i] == '\r' ? ' ' : text[i];
  line[total - 1] = '\n';
  for (size_t at = 0; at < total;) { /* the whole line, however the writes go */
    ssize_t w = write(STDERR_FILENO, line + at, total - at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    at += (size_t)w;
  }
  free(line);
}

_Noreturn void cm_assert_fail(const char *expr, const char *file, int line, const char *func) {
  cm_log_write(CM_LOG_ERROR, "assert", "%s:%d: %s: assertion failed: %s", file, line, func, expr);
  abort();
}
