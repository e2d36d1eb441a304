/* pr-mp.h — proto's own msgpack primitives (internal to proto/).
 *
 * pr_rd is a bounded reader over the caller's buffer: it allocates nothing,
 * checks every declared length against the bytes left (an array or map of n
 * entries needs at least n or 2n more bytes), type-checks and range-checks
 * numbers. msgpack-c's unpacker is never used on received bytes: it trusts
 * declared lengths (5 bytes `dd ff ff ff ff` make it reserve ~96 GB).
 *
 * Writing is msgpack-c's packer (msgpack_packer, <msgpack.h>) with
 * pr_buf_write as its callback: it appends to a struct pr_buf with a sticky
 * error, so an encoder writes a whole message and checks once at the end.
 * pr_pack_numbers adds what the packer lacks, whole arrays of numbers.
 *
 * Reader errors: CM_ERR_TRUNC (input ends early), CM_ERR_PARSE (wrong type or
 * a byte that is not msgpack), CM_ERR_RANGE (number out of the asked range),
 * CM_ERR_DEPTH (pr_rd_skip nesting), CM_ERR_TOOBIG (a declared length larger
 * than what is left or than a caller's limit). */
#ifndef LMSERVE_PR_MP_H
#define LMSERVE_PR_MP_H
#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "proto/pr-msg.h"

struct pr_rd {
  const uint8_t *p;   /* next byte */
  const uint8_t *end; /* one past the last byte */
};

static inline void pr_rd_init(struct pr_rd *r, const void *buf, size_t len) {
  r->p = (const uint8_t *)buf;
  r->end = r->p + len;
}
static inline size_t pr_rd_left(const struct pr_rd *r) {
  return (size_t)(r->end - r->p);
}

/* n bytes at p, big-endian */
static inline uint64_t pr_be(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++)
    v = v << 8 | p[i];
  return v;
}

/* The fast path of the integer readers, inline: takes an unsigned integer in
 * fixint/uint8/16/32/64 form at *pp when the bytes are there; returns 0
 * (nothing consumed) for anything else, which the full readers then judge. */
static inline int pr_rd_fast_uint(const uint8_t **pp, const uint8_t *end, uint64_t *v) {
  const uint8_t *p = *pp;
  if (p >= end) return 0;
  uint8_t c = *p;
  size_t left = (size_t)(end - p);
  if (c <= 0x7f) {
    *v = c;
    *pp = p + 1;
  } else if (c == 0xcd && left >= 3) {
    *v = (uint64_t)p[1] << 8 | p[2];
    *pp = p + 3;
  } else if (c == 0xce && left >= 5) {
    *v = pr_be(p + 1, 4);
    *pp = p + 5;
  } else if (c == 0xcc && left >= 2) {
    *v = p[1];
    *pp = p + 2;
  } else if (c == 0xcf && left >= 9) {
    *v = pr_be(p + 1, 8);
    *pp = p + 9;
  } else {
    return 0;
  }
  return 1;
}

/* Unsigned integer of any msgpack int encoding in [0, max]. */
int pr_rd_uint(struct pr_rd *r, uint64_t max, uint64_t *out);
/* Signed integer of any msgpack int encoding in [min, max]. */
int pr_rd_int(struct pr_rd *r, int64_t min, int64_t max, int64_t *out);
int pr_rd_u64(struct pr_rd *r, uint64_t *out);
int pr_rd_u32(struct pr_rd *r, uint32_t *out);
int pr_rd_i32(struct pr_rd *r, int32_t *out);
/* A number: float 32/64 or an integer, as double (no range check: callers do). */
int pr_rd_f64(struct pr_rd *r, double *out);
int pr_rd_bool(struct pr_rd *r, int *out);
/* Array / map headers: *n entries follow; checked against the bytes left. */
int pr_rd_array(struct pr_rd *r, uint32_t *n);
int pr_rd_map(struct pr_rd *r, uint32_t *n);
/* A str; *s points into the buffer (not NUL-terminated), *n bytes. */
int pr_rd_str(struct pr_rd *r, const char **s, uint32_t *n);
/* A bin (8/16/32): *s points at its n bytes in the input. */
int pr_rd_bin(struct pr_rd *r, const uint8_t **s, uint32_t *n);
/* Skips one value of any type, nested at most `depth` levels. */
int pr_rd_skip(struct pr_rd *r, int depth);
/* Reads a map key: an unsigned integer < 2^32 in *key (returns 0), or any other
 * value, which is skipped (nested at most `depth` levels) and *key set to
 * UINT64_MAX (unknown). */
int pr_rd_key(struct pr_rd *r, int depth, uint64_t *key);

/* A float: any msgpack number within float's range, or +-inf; NaN and
 * finite values beyond FLT_MAX are refused (CM_ERR_RANGE). */
int pr_rd_f32(struct pr_rd *r, float *out);

/* Arrays of n numbers (the array header already read), into v[0..n):
 * unsigned < 2^32, unsigned, signed in [min, INT32_MAX], and floats as
 * pr_rd_f32 reads them. A fast path takes the usual encodings without a
 * call per element. */
int pr_rd_u32_array(struct pr_rd *r, uint32_t *v, uint32_t n);
int pr_rd_u64_array(struct pr_rd *r, uint64_t *v, uint32_t n);
int pr_rd_i32_array(struct pr_rd *r, int32_t min, int32_t *v, uint32_t n);
int pr_rd_f32_array(struct pr_rd *r, float *v, uint32_t n);

/* ---- writing: msgpack-c's packer into a struct pr_buf ---- */

/* Room for n more bytes (growth up to b->max), or the sticky error. */
int pr_buf_grow(struct pr_buf *b, size_t n);

/* A msgpack_packer_write callback that appends to the struct pr_buf `data`:
 *   msgpack_packer pk;
 *   msgpack_packer_init(&pk, &buf, pr_buf_write);
 *   msgpack_pack_map(&pk, 1); ...
 * then check buf.err once. Inline so that a packer whose callback is known
 * at the call site costs no call per value. */
static inline int pr_buf_write(void *data, const char *p, size_t n) {
  struct pr_buf *b = (struct pr_buf *)data;
  if (b->err || b->cap - b->len < n || !b->data) {
    int rc = pr_buf_grow(b, n);
    if (rc) return rc;
  }
  if (n) memcpy(b->data + b->len, p, n); /* an empty bin or string may come with NULL */
  b->len += n;
  return 0;
}

/* A packer writing into the struct pr_buf *b, as one expression (for tests
 * that write msgpack by hand): msgpack_pack_map(PR_PACKER(&buf), 2). */
#define PR_PACKER(b) (&(msgpack_packer){(void *)(b), pr_buf_write})

/* What the packer lacks: a whole array of numbers (header and elements, the
 * shortest encoding of each integer, float32 for floats) written by chunks
 * instead of one callback per element. */
enum pr_num {
  PR_NUM_U32, /* uint32_t */
  PR_NUM_U64, /* uint64_t */
  PR_NUM_I32, /* int32_t */
  PR_NUM_F32, /* float */
  PR_NUM_U8,  /* uint8_t: raw bytes, written as one msgpack bin */
};
void pr_pack_numbers(struct pr_buf *b, enum pr_num kind, const void *v, uint32_t n);

#endif
