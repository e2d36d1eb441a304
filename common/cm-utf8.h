/* cm-utf8.h — UTF-8 validation for text from outside (request bodies, wire
 * messages, vocabularies). Inline: validators call it for every byte. */
#ifndef LMSERVE_CM_UTF8_H
#define LMSERVE_CM_UTF8_H
#include <stddef.h>
#include <stdint.h>

/* Length (1..4 bytes) of the valid UTF-8 sequence at s[0..n), n > 0, or 0 when
 * it is not one: a stray continuation byte, a cut-off sequence, an overlong
 * form, a surrogate or a code point past U+10FFFF. */
static inline size_t cm_utf8_len(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  if (c < 0x80) return 1;
  size_t len;
  uint32_t cp, min;
  if (c >= 0xc2 && c <= 0xdf)
    len = 2, cp = c & 0x1f, min = 0x80;
  else if (c >= 0xe0 && c <= 0xef)
    len = 3, cp = c & 0x0f, min = 0x800;
  else if (c >= 0xf0 && c <= 0xf4)
    len = 4, cp = c & 0x07, min = 0x10000;
  else
    return 0;
  if (n < len) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (s[i] & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return len;
}

#endif
