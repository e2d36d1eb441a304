/* th-buf.h — a growing byte buffer for tests that build binary files byte by
 * byte (GGUF images): little-endian integers, GGUF strings (a u64 length and
 * the bytes), zero padding. Out of memory fails the test (TH_REQUIRE). */
#ifndef LMSERVE_TH_BUF_H
#define LMSERVE_TH_BUF_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness/th.h"

struct th_buf {
  uint8_t *p;
  size_t n, cap;
};

static inline void th_buf_put(struct th_buf *b, const void *x, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    TH_REQUIRE(b->p != NULL);
  }
  memcpy(b->p + b->n, x, n);
  b->n += n;
}

static inline void th_buf_u32(struct th_buf *b, uint32_t v) {
  uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  th_buf_put(b, x, 4);
}

static inline void th_buf_u64(struct th_buf *b, uint64_t v) {
  th_buf_u32(b, (uint32_t)v);
  th_buf_u32(b, (uint32_t)(v >> 32));
}

/* A GGUF string: its length as a u64, then its bytes. */
static inline void th_buf_str(struct th_buf *b, const char *s) {
  th_buf_u64(b, strlen(s));
  th_buf_put(b, s, strlen(s));
}

/* Zero bytes up to the next multiple of align. */
static inline void th_buf_pad(struct th_buf *b, size_t align) {
  static const uint8_t z[1];
  while (b->n % align)
    th_buf_put(b, z, 1);
}

#endif
