/* fe-http-buf.h — a growable byte buffer for building responses: append,
 * printf, and JSON string escaping. Growth past `cap` fails with
 * CM_ERR_NOMEM instead of growing, so a response builder cannot be made to
 * allocate without bound. Buffers are reused across requests (reset keeps
 * the memory), so steady-state serving does not allocate. */
#ifndef LMSERVE_FE_HTTP_BUF_H
#define LMSERVE_FE_HTTP_BUF_H
#include <stddef.h>
#include <stdint.h>

struct fe_buf {
  char *data;  /* NUL-terminated after every append (data[len] == 0) */
  size_t len;  /* bytes used */
  size_t size; /* bytes allocated */
  size_t cap;  /* bytes; the most `size` may grow to (0: 64 MiB) */
  int err;     /* first error (sticky): appends after a failure are no-ops */
};

void fe_buf_init(struct fe_buf *b, size_t cap);
void fe_buf_free(struct fe_buf *b);
void fe_buf_reset(struct fe_buf *b); /* len = 0, err = 0; keeps memory */
/* Ensures room for `extra` more bytes plus the NUL. Returns 0 or CM_ERR_NOMEM. */
int fe_buf_reserve(struct fe_buf *b, size_t extra);
int fe_buf_append(struct fe_buf *b, const void *p, size_t n);
int fe_buf_puts(struct fe_buf *b, const char *s);
int fe_buf_printf(struct fe_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int fe_buf_i64(struct fe_buf *b, int64_t v);
/* Appends a JSON number; NaN and infinities (not JSON) are written as null
 * and -9999.0 for -inf, the way OpenAI servers report impossible logprobs. */
int fe_buf_json_double(struct fe_buf *b, double v);
/* Appends s[0..n) as a quoted JSON string. Invalid UTF-8 bytes become
 * U+FFFD so the output is always valid JSON. */
int fe_buf_json_str(struct fe_buf *b, const char *s, size_t n);
/* The length of s[0..n) without a UTF-8 sequence cut short at its end (text that
 * streams: the rest of that character is still to come). */
size_t fe_utf8_whole(const char *s, size_t n);
/* fe_buf_json_str without the quotes: a JSON string's inside. */
int fe_buf_json_chars(struct fe_buf *b, const char *s, size_t n);
/* Detaches the data (caller frees); the buffer becomes empty. */
char *fe_buf_steal(struct fe_buf *b, size_t *len);

#endif
