/* cm-hex.h — the value of one hexadecimal digit, as the readers of escapes
 * (a regex's \x and \u, a grammar string's, a URL's %-escapes) take it.
 * Header only. */
#ifndef LMSERVE_CM_HEX_H
#define LMSERVE_CM_HEX_H

/* 0..15 for '0'-'9', 'a'-'f', 'A'-'F'; -1 for anything else. */
static inline int cm_hex_digit(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

#endif
