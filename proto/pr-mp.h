/* pr-mp.h — proto's own msgpack primitives (internal to proto/).
 *
 * pr_rd is a bounded reader over the caller's buffer: it allocates nothing,
 * checks every declared length against the bytes left (an array or map of n
 * entries needs at least n or 2n more bytes), type-checks and range-checks
 * numbers. msgpack-c's unpacker is never used on received bytes: it trusts
 * declared lengths (5 bytes `dd ff ff ff ff` make it reserve ~96 GB).
 *
 * The writer appends to a struct pr_buf with a sticky error, so encoders can
 * write a whole message and check once at the end.
 *
 * Reader errors: CM_ERR_TRUNC (input ends early), CM_ERR_PARSE (wrong type or
 * a byte that is not msgpack), CM_ERR_RANGE (number out of the asked range),
 * CM_ERR_DEPTH (pr_rd_skip nesting), CM_ERR_TOOBIG (a declared length larger
 * than what is left or than a caller's limit). */
#ifndef LMSERVE_PR_MP_H
#define LMSERVE_PR_MP_H
#include <stddef.h>
#include <stdint.h>

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
/* Skips one value of any type, nested at most `depth` levels. */
int pr_rd_skip(struct pr_rd *r, int depth);
/* Reads a map key: an unsigned integer < 2^32 in *key (returns 0), or any other
 * value, which is skipped (nested at most `depth` levels) and *key set to
 * UINT64_MAX (unknown). */
int pr_rd_key(struct pr_rd *r, int depth, uint64_t *key);

/* Arrays of n numbers (the array header already read), into v[0..n):
 * unsigned < 2^32, unsigned, and signed in [min, INT32_MAX]. A fast path
 * takes the usual encodings without a call per element. */
int pr_rd_u32_array(struct pr_rd *r, uint32_t *v, uint32_t n);
int pr_rd_u64_array(struct pr_rd *r, uint64_t *v, uint32_t n);
int pr_rd_i32_array(struct pr_rd *r, int32_t min, int32_t *v, uint32_t n);

/* ---- writer ---- */
void pr_wr_uint(struct pr_buf *b, uint64_t v);
void pr_wr_int(struct pr_buf *b, int64_t v);
void pr_wr_f32(struct pr_buf *b, float v);
void pr_wr_f64(struct pr_buf *b, double v);
void pr_wr_bool(struct pr_buf *b, int v);
void pr_wr_nil(struct pr_buf *b);
void pr_wr_array(struct pr_buf *b, uint32_t n);
void pr_wr_map(struct pr_buf *b, uint32_t n);
void pr_wr_str(struct pr_buf *b, const char *s, size_t n);
/* Whole arrays (header and elements), shortest encoding per element. */
void pr_wr_u32_array(struct pr_buf *b, const uint32_t *v, uint32_t n);
void pr_wr_u64_array(struct pr_buf *b, const uint64_t *v, uint32_t n);
void pr_wr_i32_array(struct pr_buf *b, const int32_t *v, uint32_t n);
void pr_wr_f32_array(struct pr_buf *b, const float *v, uint32_t n); /* float32 each */

#endif
