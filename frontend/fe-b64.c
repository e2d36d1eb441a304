/* fe-b64.c — base64 payloads (fe-b64.h). */
#include "frontend/fe-b64.h"

#include <stdlib.h>

#include "common/cm-err.h"

static int b64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

int fe_b64_decode(const unsigned char *p, size_t len, size_t max_bytes, const char *what,
                  uint8_t **out, size_t *n, char *err, size_t errlen) {
  *out = NULL;
  *n = 0;
  if (len == 0) return cm_fail(err, errlen, CM_ERR_INVAL, "empty %s", what);
  size_t pad = 0;
  if (p[len - 1] == '=') pad = (len >= 2 && p[len - 2] == '=') ? 2 : 1;
  if (pad && len % 4 != 0)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "invalid base64: '=' padding on a payload of %zu characters (not a multiple "
                   "of 4)",
                   len);
  size_t body = len - pad; /* characters that carry bits */
  if (body % 4 == 1)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "invalid base64: a payload of %zu characters leaves one character over", body);
  size_t size = body / 4 * 3 + (body % 4 == 3 ? 2 : body % 4 == 2 ? 1 : 0); /* bytes */
  if (size > max_bytes)
    return cm_fail(err, errlen, CM_ERR_TOOBIG,
                   "%s is %zu bytes after base64 decoding, over the limit of %zu bytes", what, size,
                   max_bytes);
  uint8_t *buf = malloc(size ? size : 1);
  if (!buf) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  uint32_t acc = 0;
  size_t k = 0;
  for (size_t i = 0; i < body; i++) {
    int v = b64_value(p[i]);
    if (v < 0) {
      free(buf);
      if (p[i] > 0x20 && p[i] < 0x7f)
        return cm_fail(err, errlen, CM_ERR_INVAL,
                       "invalid base64 character '%c' at offset %zu of the %s's payload", p[i], i,
                       what);
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "invalid base64 character 0x%02x at offset %zu of the %s's payload", p[i], i,
                     what);
    }
    acc = acc << 6 | (uint32_t)v;
    if (i % 4 == 3) {
      buf[k++] = (uint8_t)(acc >> 16), buf[k++] = (uint8_t)(acc >> 8), buf[k++] = (uint8_t)acc;
      acc = 0;
    }
  }
  /* the tail: 2 characters hold 1 byte, 3 hold 2 (the leftover low bits are ignored) */
  if (body % 4 == 2) buf[k++] = (uint8_t)(acc >> 4);
  if (body % 4 == 3) buf[k++] = (uint8_t)(acc >> 10), buf[k++] = (uint8_t)(acc >> 2);
  *out = buf;
  *n = k;
  return 0;
}

int fe_b64_encode(const uint8_t *p, size_t len, char **out, size_t *n) {
  static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t m = (len + 2) / 3 * 4; /* characters */
  char *s = malloc(m + 1);
  *out = NULL;
  *n = 0;
  if (!s) return CM_ERR_NOMEM;
  size_t k = 0, i = 0;
  for (; i + 3 <= len; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
    s[k++] = abc[v >> 18], s[k++] = abc[v >> 12 & 63], s[k++] = abc[v >> 6 & 63],
    s[k++] = abc[v & 63];
  }
  if (len - i) { /* 1 or 2 bytes left: 2 or 3 characters, then padding */
    uint32_t v = (uint32_t)p[i] << 16 | (len - i == 2 ? (uint32_t)p[i + 1] << 8 : 0);
    s[k++] = abc[v >> 18], s[k++] = abc[v >> 12 & 63];
    s[k++] = len - i == 2 ? abc[v >> 6 & 63] : '=';
    s[k++] = '=';
  }
  s[k] = 0;
  *out = s;
  *n = k;
  return 0;
}
