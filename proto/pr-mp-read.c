/* pr-mp-read.c — the bounded msgpack reader (see pr-mp.h).
 *
 * Format bytes (msgpack spec): 00-7f positive fixint, 80-8f fixmap, 90-9f
 * fixarray, a0-bf fixstr, c0 nil, c1 never used, c2/c3 false/true, c4-c6 bin
 * 8/16/32, c7-c9 ext 8/16/32, ca/cb float 32/64, cc-cf uint 8..64, d0-d3 int
 * 8..64, d4-d8 fixext 1..16, d9-db str 8/16/32, dc/dd array 16/32, de/df map
 * 16/32, e0-ff negative fixint. Multi-byte values are big-endian. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "common/cm-err.h"
#include "proto/pr-mp.h"

/* Consumes `n` bytes of payload after the format byte, into *v (big-endian). */
static int take(struct pr_rd *r, int n, uint64_t *v) {
  if (pr_rd_left(r) < (size_t)n) return CM_ERR_TRUNC;
  *v = pr_be(r->p, n);
  r->p += n;
  return 0;
}

/* Reads any integer: *neg set when it is negative (then *mag is its value as
 * int64 cast to u64), else *mag is the unsigned value. */
static int rd_anyint(struct pr_rd *r, int *neg, uint64_t *mag) {
  if (pr_rd_left(r) < 1) return CM_ERR_TRUNC;
  uint8_t c = *r->p;
  uint64_t v;
  int rc;
  *neg = 0;
  if (c <= 0x7f) {
    r->p++;
    *mag = c;
    return 0;
  }
  if (c >= 0xe0) {
    r->p++;
    *neg = 1;
    *mag = (uint64_t)(int64_t)(int8_t)c;
    return 0;
  }
  switch (c) {
  case 0xcc:
  case 0xcd:
  case 0xce:
  case 0xcf:
    r->p++;
    if ((rc = take(r, 1 << (c - 0xcc), &v))) return rc;
    *mag = v;
    return 0;
  case 0xd0:
  case 0xd1:
  case 0xd2:
  case 0xd3: {
    int n = 1 << (c - 0xd0);
    r->p++;
    if ((rc = take(r, n, &v))) return rc;
    int64_t s;
    if (n == 1)
      s = (int8_t)v;
    else if (n == 2)
      s = (int16_t)v;
    else if (n == 4)
      s = (int32_t)v;
    else
      s = (int64_t)v;
    *neg = s < 0;
    *mag = (uint64_t)s;
    return 0;
  }
  default: return CM_ERR_PARSE;
  }
}

int pr_rd_uint(struct pr_rd *r, uint64_t max, uint64_t *out) {
  const uint8_t *start = r->p;
  int neg;
  uint64_t v;
  int rc = rd_anyint(r, &neg, &v);
  if (rc) return rc;
  if (neg || v > max) {
    r->p = start;
    return CM_ERR_RANGE;
  }
  *out = v;
  return 0;
}

int pr_rd_int(struct pr_rd *r, int64_t min, int64_t max, int64_t *out) {
  const uint8_t *start = r->p;
  int neg;
  uint64_t v;
  int rc = rd_anyint(r, &neg, &v);
  if (rc) return rc;
  int64_t s;
  if (neg) {
    s = (int64_t)v;
  } else {
    if (v > (uint64_t)INT64_MAX) goto range;
    s = (int64_t)v;
  }
  if (s < min || s > max) goto range;
  *out = s;
  return 0;
range:
  r->p = start;
  return CM_ERR_RANGE;
}

int pr_rd_u64(struct pr_rd *r, uint64_t *out) {
  return pr_rd_uint(r, UINT64_MAX, out);
}

int pr_rd_u32(struct pr_rd *r, uint32_t *out) {
  uint64_t v;
  int rc = pr_rd_uint(r, UINT32_MAX, &v);
  if (!rc) *out = (uint32_t)v;
  return rc;
}

int pr_rd_i32(struct pr_rd *r, int32_t *out) {
  int64_t v;
  int rc = pr_rd_int(r, INT32_MIN, INT32_MAX, &v);
  if (!rc) *out = (int32_t)v;
  return rc;
}

int pr_rd_f64(struct pr_rd *r, double *out) {
  if (pr_rd_left(r) < 1) return CM_ERR_TRUNC;
  uint8_t c = *r->p;
  uint64_t v;
  int rc;
  if (c == 0xca) {
    r->p++;
    if ((rc = take(r, 4, &v))) return rc;
    uint32_t u = (uint32_t)v;
    float f;
    memcpy(&f, &u, sizeof(f));
    *out = f;
    return 0;
  }
  if (c == 0xcb) {
    r->p++;
    if ((rc = take(r, 8, &v))) return rc;
    double d;
    memcpy(&d, &v, sizeof(d));
    *out = d;
    return 0;
  }
  int neg;
  if ((rc = rd_anyint(r, &neg, &v))) return rc;
  *out = neg ? (double)(int64_t)v : (double)v;
  return 0;
}

int pr_rd_f32(struct pr_rd *r, float *out) {
  double d;
  int rc = pr_rd_f64(r, &d);
  if (rc) return rc;
  if (isnan(d) || (isfinite(d) && fabs(d) > FLT_MAX)) return CM_ERR_RANGE;
  *out = (float)d;
  return 0;
}

int pr_rd_bool(struct pr_rd *r, int *out) {
  if (pr_rd_left(r) < 1) return CM_ERR_TRUNC;
  if (*r->p != 0xc2 && *r->p != 0xc3) return CM_ERR_PARSE;
  *out = *r->p == 0xc3;
  r->p++;
  return 0;
}

/* A container or str header: `fix_lo`..`fix_hi` hold the count in the low bits
 * (mask), `b16`/`b32` (and `b8` when nonzero) carry it in 1/2/4 bytes. */
static int rd_len(struct pr_rd *r, uint8_t fix_lo, uint8_t fix_mask, uint8_t b8, uint8_t b16,
                  uint8_t b32, uint64_t *n) {
  if (pr_rd_left(r) < 1) return CM_ERR_TRUNC;
  uint8_t c = *r->p;
  const uint8_t *start = r->p;
  int rc = 0;
  if ((c & (uint8_t)~fix_mask) == fix_lo) {
    r->p++;
    *n = c & fix_mask;
    return 0;
  }
  r->p++;
  if (b8 && c == b8)
    rc = take(r, 1, n);
  else if (c == b16)
    rc = take(r, 2, n);
  else if (c == b32)
    rc = take(r, 4, n);
  else
    rc = CM_ERR_PARSE;
  if (rc) r->p = start;
  return rc;
}

int pr_rd_array(struct pr_rd *r, uint32_t *n) {
  uint64_t v;
  int rc = rd_len(r, 0x90, 0x0f, 0, 0xdc, 0xdd, &v);
  if (rc) return rc;
  if (v > pr_rd_left(r)) return CM_ERR_TOOBIG; /* each element needs >= 1 byte */
  *n = (uint32_t)v;
  return 0;
}

int pr_rd_map(struct pr_rd *r, uint32_t *n) {
  uint64_t v;
  int rc = rd_len(r, 0x80, 0x0f, 0, 0xde, 0xdf, &v);
  if (rc) return rc;
  if (v > pr_rd_left(r) / 2) return CM_ERR_TOOBIG; /* key + value >= 2 bytes */
  *n = (uint32_t)v;
  return 0;
}

int pr_rd_str(struct pr_rd *r, const char **s, uint32_t *n) {
  uint64_t v;
  int rc = rd_len(r, 0xa0, 0x1f, 0xd9, 0xda, 0xdb, &v);
  if (rc) return rc;
  if (v > pr_rd_left(r)) return CM_ERR_TRUNC;
  *s = (const char *)r->p;
  *n = (uint32_t)v;
  r->p += v;
  return 0;
}

int pr_rd_bin(struct pr_rd *r, const uint8_t **s, uint32_t *n) {
  uint64_t v;
  if (pr_rd_left(r) < 1) return CM_ERR_TRUNC;
  uint8_t c = *r->p;
  if (c < 0xc4 || c > 0xc6) return CM_ERR_PARSE; /* bin has no fix form */
  r->p++;
  int rc = take(r, 1 << (c - 0xc4), &v);
  if (rc) {
    r->p--;
    return rc;
  }
  if (v > pr_rd_left(r)) return CM_ERR_TRUNC;
  *s = r->p;
  *n = (uint32_t)v;
  r->p += v;
  return 0;
}

/* Skips `n` payload bytes. */
static int skip_bytes(struct pr_rd *r, uint64_t n) {
  if (n > pr_rd_left(r)) return CM_ERR_TRUNC;
  r->p += n;
  return 0;
}

int pr_rd_skip(struct pr_rd *r, int depth) {
  if (pr_rd_left(r) < 1) return CM_ERR_TRUNC;
  uint8_t c = *r->p;
  uint64_t v;
  uint32_t n;
  int rc;
  if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3) {
    r->p++;
    return 0;
  }
  if ((c >= 0x80 && c <= 0x9f) || c == 0xdc || c == 0xdd || c == 0xde || c == 0xdf) {
    if (depth <= 0) return CM_ERR_DEPTH;
    int is_map = (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf;
    rc = is_map ? pr_rd_map(r, &n) : pr_rd_array(r, &n);
    if (rc) return rc;
    uint64_t items = is_map ? 2ull * n : n;
    for (uint64_t i = 0; i < items; i++)
      if ((rc = pr_rd_skip(r, depth - 1))) return rc;
    return 0;
  }
  if ((c >= 0xa0 && c <= 0xbf) || c == 0xd9 || c == 0xda || c == 0xdb) {
    const char *s;
    return pr_rd_str(r, &s, &n);
  }
  r->p++;
  switch (c) {
  case 0xc4:
  case 0xc5:
  case 0xc6: /* bin 8/16/32 */
    if ((rc = take(r, 1 << (c - 0xc4), &v))) return rc;
    return skip_bytes(r, v);
  case 0xc7:
  case 0xc8:
  case 0xc9: /* ext 8/16/32: length, type, data */
    if ((rc = take(r, 1 << (c - 0xc7), &v))) return rc;
    return skip_bytes(r, v + 1);
  case 0xca: return skip_bytes(r, 4);
  case 0xcb: return skip_bytes(r, 8);
  case 0xcc:
  case 0xcd:
  case 0xce:
  case 0xcf: return skip_bytes(r, 1u << (c - 0xcc));
  case 0xd0:
  case 0xd1:
  case 0xd2:
  case 0xd3: return skip_bytes(r, 1u << (c - 0xd0));
  case 0xd4:
  case 0xd5:
  case 0xd6:
  case 0xd7:
  case 0xd8: /* fixext: type + 1..16 */ return skip_bytes(r, 1 + (1u << (c - 0xd4)));
  default: /* 0xc1 */ r->p--; return CM_ERR_PARSE;
  }
}

int pr_rd_key(struct pr_rd *r, int depth, uint64_t *key) {
  int rc = pr_rd_uint(r, UINT32_MAX, key);
  if (rc == CM_ERR_PARSE || rc == CM_ERR_RANGE) {
    *key = UINT64_MAX;
    return pr_rd_skip(r, depth);
  }
  return rc;
}

/* ---- arrays with a fast path for the usual encodings ---- */

int pr_rd_u32_array(struct pr_rd *r, uint32_t *v, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    const uint8_t *p = r->p;
    uint64_t x;
    if (pr_rd_fast_uint(&p, r->end, &x) && x <= UINT32_MAX) {
      v[i] = (uint32_t)x;
      r->p = p;
    } else {
      int rc = pr_rd_u32(r, &v[i]); /* the exact error, nothing consumed */
      if (rc) return rc;
    }
  }
  return 0;
}

int pr_rd_u64_array(struct pr_rd *r, uint64_t *v, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    if (!pr_rd_fast_uint(&r->p, r->end, &v[i])) {
      int rc = pr_rd_u64(r, &v[i]);
      if (rc) return rc;
    }
  }
  return 0;
}

int pr_rd_i32_array(struct pr_rd *r, int32_t min, int32_t *v, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    const uint8_t *p = r->p;
    uint64_t x;
    if (pr_rd_fast_uint(&p, r->end, &x) && x <= INT32_MAX && (int64_t)x >= min) {
      v[i] = (int32_t)x;
      r->p = p;
    } else {
      int64_t s;
      int rc = pr_rd_int(r, min, INT32_MAX, &s);
      if (rc) return rc;
      v[i] = (int32_t)s;
    }
  }
  return 0;
}

int pr_rd_f32_array(struct pr_rd *r, float *v, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    if (pr_rd_left(r) >= 5 && r->p[0] == 0xca) { /* the usual float32: inline */
      uint32_t u = (uint32_t)pr_be(r->p + 1, 4);
      memcpy(&v[i], &u, sizeof(float));
      if (isnan(v[i])) return CM_ERR_RANGE;
      r->p += 5;
    } else {
      int rc = pr_rd_f32(r, &v[i]);
      if (rc) return rc;
    }
  }
  return 0;
}
