/* cm-log.h — leveled logging to stderr, one line per event:
 *
 *   2026-11-22T04:35:01.123Z I sch[1234] admitted request 7 (412 tokens)
 *
 * The level letter is E/W/I/D/T; the tag names the subsystem. The threshold
 * comes from LMSERVE_LOG (error|warn|info|debug|trace) or cm_log_set_level().
 * Each event is written with one write(2), so lines from several processes
 * sharing stderr do not interleave. */
#ifndef LMSERVE_CM_LOG_H
#define LMSERVE_CM_LOG_H
#include <stddef.h>

enum cm_log_level {
  CM_LOG_ERROR = 0,
  CM_LOG_WARN = 1,
  CM_LOG_INFO = 2,
  CM_LOG_DEBUG = 3,
  CM_LOG_TRACE = 4,
};

void cm_log_set_level(enum cm_log_level level);
enum cm_log_level cm_log_get_level(void);
/* Parses "error".."trace"; returns 0 or CM_ERR_INVAL. */
int cm_log_parse_level(const char *s, enum cm_log_level *out);
/* Reads LMSERVE_LOG once; called by main(). */
void cm_log_init_from_env(void);

void cm_log_write(enum cm_log_level level, const char *tag, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* One event of any length (cm_log_write cuts at 2 KiB): text[0..len) as its line,
 * its newlines folded, where the level is enabled. A line longer than PIPE_BUF (4 KiB)
 * may interleave with other processes' lines on a shared pipe. */
void cm_log_text(enum cm_log_level level, const char *tag, const char *text, size_t len);

#define CM_LOG_ENABLED(lvl) ((lvl) <= cm_log_get_level())
#define cm_log(lvl, tag, ...) \
  do { \
    if (CM_LOG_ENABLED(lvl)) cm_log_write((lvl), (tag), __VA_ARGS__); \
  } while (0)
#define cm_error(tag, ...) cm_log(CM_LOG_ERROR, tag, __VA_ARGS__)
#define cm_warn(tag, ...) cm_log(CM_LOG_WARN, tag, __VA_ARGS__)
#define cm_info(tag, ...) cm_log(CM_LOG_INFO, tag, __VA_ARGS__)
#define cm_debug(tag, ...) cm_log(CM_LOG_DEBUG, tag, __VA_ARGS__)
#define cm_trace(tag, ...) cm_log(CM_LOG_TRACE, tag, __VA_ARGS__)

#endif
