/* fe-http-buf.c — the response byte buffer (see fe-http-buf.h). */
#include "frontend/fe-http-buf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-utf8.h"

#define FE_BUF_DEFAULT_CAP ((size_t)64 << 20) /* bytes */

void fe_buf_init(struct fe_buf *b, size_t cap) {
  memset(b, 0, sizeof(*b));
  b->cap = cap ? cap : FE_BUF_DEFAULT_CAP;
}

void fe_buf_free(struct fe_buf *b) {
  free(b->data);
  size_t cap = b->cap;
  memset(b, 0, sizeof(*b));
  b->cap = cap;
}

void fe_buf_reset(struct fe_buf *b) {
  b->len = 0;
  b->err = 0;
  if (b->data) b->data[0] = 0;
}

int fe_buf_reserve(struct fe_buf *b, size_t extra) {
  if (b->err) return b->err;
  if (extra > b->cap || b->len + extra + 1 > b->cap) return b->err = CM_ERR_NOMEM;
  size_t need = b->len + extra + 1;
  if (need <= b->size) return 0;
  size_t ns = b->size ? b->size : 256;
  while (ns < need)
    ns *= 2;
  if (ns > b->cap) ns = b->cap;
  char *p = realloc(b->data, ns);
  if (!p) return b->err = CM_ERR_NOMEM;
  b->data = p;
  b->size = ns;
  return 0;
}

int fe_buf_append(struct fe_buf *b, const void *p, size_t n) {
  int rc = fe_buf_reserve(b, n);
  if (rc) return rc;
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = 0;
  return 0;
}

int fe_buf_puts(struct fe_buf *b, const char *s) {
  return fe_buf_append(b, s, strlen(s));
}

int fe_buf_printf(struct fe_buf *b, const char *fmt, ...) {
  if (b->err) return b->err;
  va_list ap;
  va_start(ap, fmt);
  char small[256];
  int n = vsnprintf(small, sizeof(small), fmt, ap);
  va_end(ap);
  if (n < 0) return b->err = CM_ERR_INVAL;
  if ((size_t)n < sizeof(small)) return fe_buf_append(b, small, (size_t)n);
  int rc = fe_buf_reserve(b, (size_t)n);
  if (rc) return rc;
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
  return 0;
}

int fe_buf_i64(struct fe_buf *b, int64_t v) {
  char tmp[24];
  char *e = tmp + sizeof(tmp), *p = e;
  uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
  do {
    *--p = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (v < 0) *--p = '-';
  return fe_buf_append(b, p, (size_t)(e - p));
}

int fe_buf_json_double(struct fe_buf *b, double v) {
  if (isnan(v) || (isinf(v) && v > 0)) return fe_buf_puts(b, "null");
  if (isinf(v)) return fe_buf_puts(b, "-9999.0");
  return fe_buf_printf(b, "%.9g", v);
}

size_t fe_utf8_whole(const char *s, size_t n) {
  for (size_t i = 1; i <= n && i <= 4; i++) {
    unsigned char u = (unsigned char)s[n - i];
    if ((u & 0xc0) == 0x80) continue; /* a continuation byte */
    size_t need = u >= 0xf0 ? 4 : u >= 0xe0 ? 3 : u >= 0xc0 ? 2 : 1;
    return need > i ? n - i : n;
  }
  return n;
}

int fe_buf_json_str(struct fe_buf *b, const char *s, size_t n) {
  if (fe_buf_append(b, "\"", 1) || fe_buf_json_chars(b, s, n)) return b->err;
  return fe_buf_append(b, "\"", 1);
}

int fe_buf_json_chars(struct fe_buf *b, const char *s, size_t n) {
  static const char hex[] = "0123456789abcdef";
  const unsigned char *u = (const unsigned char *)s;
  /* in blocks, reserving the worst case of each: every byte becomes
   * \u00XX (6) or U+FFFD (3); a UTF-8 sequence may run 3 bytes past */
  for (size_t i = 0; i < n;) {
    size_t end = n - i > 4096 ? i + 4096 : n;
    if (fe_buf_reserve(b, (end - i + 3) * 6 + 1)) return b->err;
    char *o = b->data + b->len;
    while (i < end) {
      unsigned char c = u[i];
      if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
        *o++ = (char)c;
        i++;
        continue;
      }
      if (c < 0x80) {
        *o++ = '\\';
        switch (c) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '\n': *o++ = 'n'; break;
        case '\r': *o++ = 'r'; break;
        case '\t': *o++ = 't'; break;
        case '\b': *o++ = 'b'; break;
        case '\f': *o++ = 'f'; break;
        default: *o++ = 'u', *o++ = '0', *o++ = '0', *o++ = hex[c >> 4], *o++ = hex[c & 15];
        }
        i++;
        continue;
      }
      size_t k = cm_utf8_len(u + i, n - i);
      if (k == 0) {
        memcpy(o, "\xef\xbf\xbd", 3);
        o += 3;
        i++;
      } else {
        memcpy(o, u + i, k);
        o += k;
        i += k;
      }
    }
    b->len = (size_t)(o - b->data);
    b->data[b->len] = 0;
  }
  return b->err;
}

char *fe_buf_steal(struct fe_buf *b, size_t *len) {
  char *p = b->data;
  if (len) *len = b->len;
  if (!p) p = calloc(1, 1);
  b->data = NULL;
  b->len = b->size = 0;
  b->err = 0;
  return p;
}
