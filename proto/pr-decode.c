/* pr-decode.c — the one bounded decoder: it walks a record's table
 * (pr-codec.h) over our own msgpack reader (pr-mp.h), never msgpack-c's
 * unpacker, which allocates whatever a hostile length claims.
 *
 * Every declared length is checked against the bytes left before anything
 * is allocated (pr_rd_array / _map / _str), then against the field's max_n;
 * numbers are type-checked and held to their table bounds as they are read;
 * nesting is capped at PR_MAX_DEPTH (known records nest at most 4 levels,
 * unknown values are skipped with what is left); arrays and strings go into
 * the caller's arena, whose cap bounds what one message can make us
 * allocate. When a record ends, its required keys must have come, fields
 * left at a default are held to their bounds too (the defaults of nested
 * records are valid: test-proto-bounds checks the tables), and the record's
 * own check runs: what the decoder accepts, pr_msg_validate accepts, without
 * a second walk. Errors are negative cm_err codes; nothing here aborts. */
#include <string.h>

#include "common/cm-err.h"
#include "proto/pr-codec.h"

/* Room for n elements of `size` bytes, zeroed; NULL for n == 0. */
static int alloc_elems(struct cm_arena *a, uint32_t n, size_t size, void **out) {
  *out = NULL;
  if (n == 0) return 0;
  *out = cm_arena_calloc(a, n, size);
  return *out ? 0 : CM_ERR_NOMEM;
}

/* The header of an array of at most max_n entries. */
static int read_count(struct pr_rd *r, uint32_t max_n, uint32_t *n) {
  PR_TRY(pr_rd_array(r, n));
  return *n > max_n ? CM_ERR_TOOBIG : 0;
}

/* n numbers of kind f->num into v, held to f's element bounds. */
static int read_numbers(struct pr_rd *r, const struct pr_field *f, void *v, uint32_t n) {
  switch (f->num) {
  case PR_NUM_U32: PR_TRY(pr_rd_u32_array(r, v, n)); break;
  case PR_NUM_U64: PR_TRY(pr_rd_u64_array(r, v, n)); break;
  case PR_NUM_I32:
    PR_TRY(pr_rd_i32_array(r, (int32_t)(f->min > INT32_MIN ? f->min : INT32_MIN), v, n));
    break;
  case PR_NUM_F32: PR_TRY(pr_rd_f32_array(r, v, n)); break;
  case PR_NUM_U8: return CM_ERR_PARSE; /* bytes come as one bin (read_field) */
  }
  return pr_check_numbers(f, v, n);
}

/* A string: <= PR_MAX_STR bytes, valid UTF-8, no NUL; copied NUL-terminated. */
static int read_str(struct pr_rd *r, struct cm_arena *a, const char **out) {
  const char *s;
  uint32_t n;
  PR_TRY(pr_rd_str(r, &s, &n));
  if (n > PR_MAX_STR) return CM_ERR_TOOBIG;
  PR_TRY(pr_check_utf8(s, n));
  char *copy = cm_arena_strndup(a, s, n);
  if (!copy) return CM_ERR_NOMEM;
  *out = copy;
  return 0;
}

/* The value of field f into the record at `rec`, which sits at `level` and
 * holds its defaults already (pr_msg_init, or the array that made room). */
static int read_field(struct pr_rd *r, struct cm_arena *a, const struct pr_field *f, uint8_t *rec,
                      int level) {
  uint8_t *p = rec + f->off;
  switch (f->type) {
  case PR_FT_UINT: {
    uint64_t v;
    if (!pr_rd_fast_uint(&r->p, r->end, &v)) PR_TRY(pr_rd_uint(r, UINT64_MAX, &v));
    if (v > ~0ull >> (64 - 8 * f->size)) return CM_ERR_RANGE; /* past the member's type */
    if (!pr_uint_in(f, v)) return pr_range_err(f);
    pr_uint_set(p, f->size, v);
    return 0;
  }
  case PR_FT_INT: {
    int64_t v;
    PR_TRY(pr_rd_int(r, INT64_MIN, INT64_MAX, &v));
    if (!pr_int_in(f, v)) return pr_range_err(f);
    pr_uint_set(p, f->size, (uint64_t)v);
    return 0;
  }
  case PR_FT_BOOL: {
    int v;
    PR_TRY(pr_rd_bool(r, &v));
    *(bool *)p = v;
    return 0;
  }
  case PR_FT_FLOAT: {
    float x = 0;
    double d;
    if (f->size == sizeof(float)) {
      PR_TRY(pr_rd_f32(r, &x));
      d = x;
    } else {
      PR_TRY(pr_rd_f64(r, &d));
    }
    if (!pr_float_in(f, d)) return CM_ERR_RANGE;
    if (f->size == sizeof(float))
      memcpy(p, &x, sizeof(x));
    else
      memcpy(p, &d, sizeof(d));
    return 0;
  }
  case PR_FT_STR: return read_str(r, a, (const char **)p);
  case PR_FT_SLICE: {
    struct pr_slice s;
    void *v;
    if (f->num == PR_NUM_U8) { /* one bin, copied out of the input */
      const uint8_t *bytes;
      PR_TRY(pr_rd_bin(r, &bytes, &s.n));
      if (s.n > f->max_n) return CM_ERR_TOOBIG;
      PR_TRY(alloc_elems(a, s.n, 1, &v));
      if (s.n) memcpy(v, bytes, s.n);
      s.v = v;
      memcpy(p, &s, sizeof(s));
      return 0;
    }
    PR_TRY(read_count(r, f->max_n, &s.n));
    PR_TRY(alloc_elems(a, s.n, pr_num_size(f->num), &v));
    PR_TRY(read_numbers(r, f, v, s.n));
    s.v = v;
    memcpy(p, &s, sizeof(s));
    return 0;
  }
  case PR_FT_INLINE: {
    uint32_t n;
    PR_TRY(read_count(r, f->max_n, &n));
    PR_TRY(read_numbers(r, f, p, n));
    memcpy(rec + f->count, &n, sizeof(n));
    return 0;
  }
  case PR_FT_REC: return pr_rec_decode(r, a, f->sub, p, level + 1);
  case PR_FT_ARRAY: {
    uint32_t n;
    void *v;
    PR_TRY(read_count(r, f->max_n, &n));
    PR_TRY(alloc_elems(a, n, f->size, &v));
    memcpy(p, &v, sizeof(v));
    memcpy(rec + f->count, &n, sizeof(n));
    if (n) pr_field_default(f->elem, v); /* the defaults once, copied to the others */
    for (uint32_t i = 1; i < n; i++)
      memcpy((uint8_t *)v + (size_t)i * f->size, v, f->size);
    for (uint32_t i = 0; i < n; i++)
      PR_TRY(read_field(r, a, f->elem, (uint8_t *)v + (size_t)i * f->size, level + 1));
    return 0;
  }
  default: return CM_ERR_PARSE; /* PR_FT_NONE never gets here */
  }
}

int pr_rec_decode(struct pr_rd *r, struct cm_arena *a, const struct pr_rec *rec, void *at,
                  int level) {
  uint8_t *base = at;
  uint64_t seen = 0; /* keys below PR_MAX_KEYS met so far, known or not */
  uint32_t n;
  PR_TRY(pr_rd_map(r, &n));
  for (uint32_t i = 0; i < n; i++) {
    uint64_t k;
    PR_TRY(pr_rd_key(r, PR_MAX_DEPTH - level, &k)); /* other keys than uints: skipped */
    if (k < PR_MAX_KEYS) {
      if (seen & 1ull << k) return CM_ERR_PARSE;
      seen |= 1ull << k;
    }
    const struct pr_field *f = k < rec->n_fields ? &rec->fields[k] : NULL;
    if (!f || f->type == PR_FT_NONE) {
      PR_TRY(pr_rd_skip(r, PR_MAX_DEPTH - level));
      continue;
    }
    PR_TRY(read_field(r, a, f, base, level));
    if (f->when == PR_IF_FLAG) *(bool *)(base + f->cond) = true;
  }
  for (uint32_t k = 0; k < rec->n_fields; k++) {
    const struct pr_field *f = &rec->fields[k];
    if (seen & 1ull << k) {
      if (f->when == PR_IF_BITS && !pr_field_sent(f, base))
        pr_field_reset(f, base); /* sent where it means nothing */
    } else if (f->flags & PR_F_REQ) {
      return CM_ERR_PARSE;
    } else if (!f->any && f->type >= PR_FT_UINT && f->type <= PR_FT_FLOAT) {
      PR_TRY(pr_field_put(NULL, f, base)); /* a default outside the bounds */
    }
  }
  return rec->check ? rec->check(base) : 0;
}
