/* pr-mp-write.c — struct pr_buf and the msgpack writer (see pr-mp.h).
 *
 * Integers take their shortest encoding; floats keep their width (float32 for
 * float fields so that a round trip is exact). The buffer grows by doubling up
 * to `max` bytes and is reused across messages. */
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "proto/pr-mp.h"

void pr_buf_init(struct pr_buf *b, size_t max) {
  memset(b, 0, sizeof(*b));
  b->max = max ? max : PR_MAX_MSG_DEFAULT;
}

void pr_buf_reset(struct pr_buf *b) {
  b->len = 0;
  b->err = 0;
}

void pr_buf_free(struct pr_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
  b->err = 0;
}

/* Makes room for `n` more bytes; returns a pointer to them or NULL (err set). */
static uint8_t *reserve(struct pr_buf *b, size_t n) {
  if (b->err) return NULL;
  if (n > b->max || b->len > b->max - n) {
    b->err = CM_ERR_TOOBIG;
    return NULL;
  }
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n)
      cap = cap > b->max / 2 ? b->max : cap * 2;
    uint8_t *d = realloc(b->data, cap);
    if (!d) {
      b->err = CM_ERR_NOMEM;
      return NULL;
    }
    b->data = d;
    b->cap = cap;
  }
  uint8_t *p = b->data + b->len;
  b->len += n;
  return p;
}

/* Format byte `c` followed by `n` big-endian bytes of v. */
static void put(struct pr_buf *b, uint8_t c, uint64_t v, int n) {
  uint8_t *p = reserve(b, 1 + (size_t)n);
  if (!p) return;
  p[0] = c;
  for (int i = 0; i < n; i++)
    p[1 + i] = (uint8_t)(v >> (8 * (n - 1 - i)));
}

void pr_wr_uint(struct pr_buf *b, uint64_t v) {
  if (v <= 0x7f)
    put(b, (uint8_t)v, 0, 0);
  else if (v <= UINT8_MAX)
    put(b, 0xcc, v, 1);
  else if (v <= UINT16_MAX)
    put(b, 0xcd, v, 2);
  else if (v <= UINT32_MAX)
    put(b, 0xce, v, 4);
  else
    put(b, 0xcf, v, 8);
}

void pr_wr_int(struct pr_buf *b, int64_t v) {
  if (v >= 0)
    pr_wr_uint(b, (uint64_t)v);
  else if (v >= -32)
    put(b, (uint8_t)(int8_t)v, 0, 0);
  else if (v >= INT8_MIN)
    put(b, 0xd0, (uint8_t)(int8_t)v, 1);
  else if (v >= INT16_MIN)
    put(b, 0xd1, (uint16_t)(int16_t)v, 2);
  else if (v >= INT32_MIN)
    put(b, 0xd2, (uint32_t)(int32_t)v, 4);
  else
    put(b, 0xd3, (uint64_t)v, 8);
}

void pr_wr_f32(struct pr_buf *b, float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  put(b, 0xca, u, 4);
}

void pr_wr_f64(struct pr_buf *b, double v) {
  uint64_t u;
  memcpy(&u, &v, sizeof(u));
  put(b, 0xcb, u, 8);
}

void pr_wr_bool(struct pr_buf *b, int v) {
  put(b, v ? 0xc3 : 0xc2, 0, 0);
}

void pr_wr_nil(struct pr_buf *b) {
  put(b, 0xc0, 0, 0);
}

void pr_wr_array(struct pr_buf *b, uint32_t n) {
  if (n <= 15)
    put(b, (uint8_t)(0x90 | n), 0, 0);
  else if (n <= UINT16_MAX)
    put(b, 0xdc, n, 2);
  else
    put(b, 0xdd, n, 4);
}

void pr_wr_map(struct pr_buf *b, uint32_t n) {
  if (n <= 15)
    put(b, (uint8_t)(0x80 | n), 0, 0);
  else if (n <= UINT16_MAX)
    put(b, 0xde, n, 2);
  else
    put(b, 0xdf, n, 4);
}

void pr_wr_str(struct pr_buf *b, const char *s, size_t n) {
  if (n > UINT32_MAX) {
    if (!b->err) b->err = CM_ERR_TOOBIG;
    return;
  }
  if (n <= 31)
    put(b, (uint8_t)(0xa0 | n), 0, 0);
  else if (n <= UINT8_MAX)
    put(b, 0xd9, n, 1);
  else if (n <= UINT16_MAX)
    put(b, 0xda, n, 2);
  else
    put(b, 0xdb, n, 4);
  uint8_t *p = reserve(b, n);
  if (p && n) memcpy(p, s, n);
}

/* ---- arrays: reserve the worst case once, write in place, keep what was used */

/* Shortest encoding of v at p; returns the end. */
static uint8_t *raw_uint(uint8_t *p, uint64_t v) {
  if (v <= 0x7f) {
    *p++ = (uint8_t)v;
  } else if (v <= UINT8_MAX) {
    *p++ = 0xcc;
    *p++ = (uint8_t)v;
  } else if (v <= UINT16_MAX) {
    *p++ = 0xcd;
    *p++ = (uint8_t)(v >> 8);
    *p++ = (uint8_t)v;
  } else if (v <= UINT32_MAX) {
    *p++ = 0xce;
    for (int s = 24; s >= 0; s -= 8)
      *p++ = (uint8_t)(v >> s);
  } else {
    *p++ = 0xcf;
    for (int s = 56; s >= 0; s -= 8)
      *p++ = (uint8_t)(v >> s);
  }
  return p;
}

/* Room for `worst` bytes written in place, or NULL when that would pass the
 * buffer's cap (the caller then writes element by element, which fails only
 * when the real size does not fit). */
static uint8_t *begin_inplace(struct pr_buf *b, size_t worst) {
  if (b->err || worst > b->max || b->len > b->max - worst) return NULL;
  size_t len = b->len;
  uint8_t *p = reserve(b, worst);
  if (p) b->len = len;
  return p;
}

void pr_wr_u32_array(struct pr_buf *b, const uint32_t *v, uint32_t n) {
  pr_wr_array(b, n);
  uint8_t *p = begin_inplace(b, (size_t)n * 5);
  if (!p) {
    for (uint32_t i = 0; i < n; i++)
      pr_wr_uint(b, v[i]);
    return;
  }
  for (uint32_t i = 0; i < n; i++)
    p = raw_uint(p, v[i]);
  b->len = (size_t)(p - b->data);
}

void pr_wr_u64_array(struct pr_buf *b, const uint64_t *v, uint32_t n) {
  pr_wr_array(b, n);
  uint8_t *p = begin_inplace(b, (size_t)n * 9);
  if (!p) {
    for (uint32_t i = 0; i < n; i++)
      pr_wr_uint(b, v[i]);
    return;
  }
  for (uint32_t i = 0; i < n; i++)
    p = raw_uint(p, v[i]);
  b->len = (size_t)(p - b->data);
}

void pr_wr_i32_array(struct pr_buf *b, const int32_t *v, uint32_t n) {
  pr_wr_array(b, n);
  uint8_t *p = begin_inplace(b, (size_t)n * 5);
  if (!p) {
    for (uint32_t i = 0; i < n; i++)
      pr_wr_int(b, v[i]);
    return;
  }
  for (uint32_t i = 0; i < n; i++) {
    int32_t x = v[i];
    if (x >= 0) {
      p = raw_uint(p, (uint32_t)x);
    } else if (x >= -32) {
      *p++ = (uint8_t)(int8_t)x;
    } else if (x >= INT8_MIN) {
      *p++ = 0xd0;
      *p++ = (uint8_t)(int8_t)x;
    } else if (x >= INT16_MIN) {
      *p++ = 0xd1;
      *p++ = (uint8_t)((uint16_t)(int16_t)x >> 8);
      *p++ = (uint8_t)(uint16_t)(int16_t)x;
    } else {
      *p++ = 0xd2;
      for (int s = 24; s >= 0; s -= 8)
        *p++ = (uint8_t)((uint32_t)x >> s);
    }
  }
  b->len = (size_t)(p - b->data);
}

void pr_wr_f32_array(struct pr_buf *b, const float *v, uint32_t n) {
  pr_wr_array(b, n);
  uint8_t *p = begin_inplace(b, (size_t)n * 5);
  if (!p) {
    for (uint32_t i = 0; i < n; i++)
      pr_wr_f32(b, v[i]);
    return;
  }
  for (uint32_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &v[i], sizeof(u));
    *p++ = 0xca;
    for (int s = 24; s >= 0; s -= 8)
      *p++ = (uint8_t)(u >> s);
  }
  b->len = (size_t)(p - b->data);
}
