/* pr-encode.c — the one encoder, which is also the validator: it walks a
 * record's table (pr-codec.h), holds each field to its bounds and, given a
 * buffer, writes it through msgpack-c's packer (pr_buf_write is the packer's
 * callback). Validation is the same walk writing nothing, so what we send
 * and what we check cannot drift apart; the decoder holds received fields to
 * the same bounds.
 *
 * Fields go in key order, each under its key, those whose condition is false
 * left out; integers take their shortest encoding, float members float32 and
 * double members float64, so that a round trip is exact and re-encoding a
 * decoded message gives the same bytes. A count past its bound is
 * CM_ERR_RANGE here (the decoder, which meets it before allocating, says
 * CM_ERR_TOOBIG); a NULL pointer with a nonzero count is CM_ERR_INVAL. */
#include <msgpack.h>
#include <string.h>

#include "common/cm-err.h"
#include "proto/pr-codec.h"

/* A string field: NULL (sent as "", or not at all), or <= PR_MAX_STR bytes of UTF-8. */
static int check_str(const char *s) {
  if (!s) return 0;
  size_t n = strnlen(s, PR_MAX_STR + 1);
  if (n > PR_MAX_STR) return CM_ERR_TOOBIG;
  return pr_check_utf8(s, n);
}

int pr_field_put(struct pr_buf *b, const struct pr_field *f, const void *at) {
  const uint8_t *rec = at, *p = rec + f->off;
  msgpack_packer pk;
  msgpack_packer_init(&pk, b, pr_buf_write);
  switch (f->type) {
  case PR_FT_UINT: {
    uint64_t v = pr_uint_get(p, f->size);
    if (!pr_uint_in(f, v)) return pr_range_err(f);
    if (b) msgpack_pack_uint64(&pk, v);
    return 0;
  }
  case PR_FT_INT: {
    int64_t v = pr_int_get(p, f->size);
    if (!pr_int_in(f, v)) return pr_range_err(f);
    if (b) msgpack_pack_int64(&pk, v);
    return 0;
  }
  case PR_FT_BOOL:
    if (b && *(const bool *)p) msgpack_pack_true(&pk);
    if (b && !*(const bool *)p) msgpack_pack_false(&pk);
    return 0;
  case PR_FT_FLOAT: {
    double v = pr_float_get(p, f->size);
    if (!pr_float_in(f, v)) return CM_ERR_RANGE;
    if (b && f->size == sizeof(float)) msgpack_pack_float(&pk, (float)v);
    if (b && f->size == sizeof(double)) msgpack_pack_double(&pk, v);
    return 0;
  }
  case PR_FT_STR: {
    const char *s = *(const char *const *)p;
    PR_TRY(check_str(s));
    if (b) msgpack_pack_str_with_body(&pk, s ? s : "", s ? strlen(s) : 0);
    return 0;
  }
  case PR_FT_SLICE: {
    struct pr_slice s = pr_slice_get(p);
    if (s.n && !s.v) return CM_ERR_INVAL;
    if (s.n > f->max_n) return CM_ERR_RANGE;
    PR_TRY(pr_check_numbers(f, s.v, s.n));
    if (b) pr_pack_numbers(b, f->num, s.v, s.n);
    return 0;
  }
  case PR_FT_INLINE: { /* sends at most its capacity, whatever the count says */
    uint32_t n = pr_u32_get(rec + f->count);
    if (b) pr_pack_numbers(b, f->num, p, n < f->max_n ? n : f->max_n);
    return 0;
  }
  case PR_FT_REC: return pr_rec_put(b, f->sub, p);
  case PR_FT_ARRAY: {
    const uint8_t *v;
    uint32_t n = pr_u32_get(rec + f->count);
    memcpy(&v, p, sizeof(v));
    if (n && !v) return CM_ERR_INVAL;
    if (n > f->max_n) return CM_ERR_RANGE;
    if (b) msgpack_pack_array(&pk, n);
    for (uint32_t i = 0; i < n; i++)
      PR_TRY(pr_field_put(b, f->elem, v + (size_t)i * f->size));
    return 0;
  }
  default: return 0;
  }
}

int pr_rec_put(struct pr_buf *b, const struct pr_rec *rec, const void *at) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, b, pr_buf_write);
  if (b) {
    uint32_t n = 0;
    for (uint32_t k = 0; k < rec->n_fields; k++)
      n += rec->fields[k].type != PR_FT_NONE && pr_field_sent(&rec->fields[k], at);
    msgpack_pack_map(&pk, n);
  }
  for (uint32_t k = 0; k < rec->n_fields; k++) {
    const struct pr_field *f = &rec->fields[k];
    if (f->type == PR_FT_NONE) continue;
    int sent = pr_field_sent(f, at);
    if (!sent && f->when == PR_IF_BITS) continue; /* means nothing */
    if (b && sent) {
      msgpack_pack_uint32(&pk, k);
      PR_TRY(pr_field_put(b, f, at));
    } else if (!f->any) { /* checked even where not sent */
      PR_TRY(pr_field_put(NULL, f, at));
    }
  }
  return rec->check ? rec->check(at) : 0;
}
