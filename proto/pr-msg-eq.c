/* pr-msg-eq.c — pr_msg_equal: field-by-field comparison of two messages
 * over the record tables (pr-codec.h), as the round-trip tests and the fuzz
 * target need it. Numbers compare bitwise (a round trip must be exact, NaN
 * and -0 included); slices by length and contents, so an empty slice equals
 * another whatever its pointer; a field sent only with a flag (the seed)
 * only when the flag is set. Strings sent as "" when NULL treat NULL as "";
 * those left out when NULL (CTRL text) keep NULL distinct. */
#include <string.h>

#include "proto/pr-codec.h"

static bool str_eq(const char *x, const char *y, bool null_is_empty) {
  if (null_is_empty) {
    x = x ? x : "";
    y = y ? y : "";
  }
  if (!x || !y) return x == y;
  return strcmp(x, y) == 0;
}

static bool bytes_eq(const void *x, const void *y, uint32_t n, size_t elem) {
  return n == 0 || memcmp(x, y, (size_t)n * elem) == 0;
}

/* Field f of the records at x and y. */
static bool field_eq(const struct pr_field *f, const uint8_t *x, const uint8_t *y) {
  const uint8_t *px = x + f->off, *py = y + f->off;
  switch (f->type) {
  case PR_FT_UINT:
  case PR_FT_INT:
  case PR_FT_BOOL:
  case PR_FT_FLOAT: return memcmp(px, py, f->size) == 0;
  case PR_FT_STR:
    return str_eq(*(const char *const *)px, *(const char *const *)py, f->when != PR_IF_SET);
  case PR_FT_SLICE: {
    struct pr_slice a = pr_slice_get(px), b = pr_slice_get(py);
    return a.n == b.n && bytes_eq(a.v, b.v, a.n, pr_num_size(f->num));
  }
  case PR_FT_INLINE: {
    uint32_t n = pr_u32_get(x + f->count);
    return n == pr_u32_get(y + f->count) &&
           bytes_eq(px, py, n < f->max_n ? n : f->max_n, pr_num_size(f->num));
  }
  case PR_FT_REC: return pr_rec_equal(f->sub, px, py);
  case PR_FT_ARRAY: {
    const uint8_t *a, *b;
    uint32_t n = pr_u32_get(x + f->count);
    if (n != pr_u32_get(y + f->count)) return false;
    memcpy(&a, px, sizeof(a));
    memcpy(&b, py, sizeof(b));
    for (uint32_t i = 0; i < n; i++)
      if (!field_eq(f->elem, a + (size_t)i * f->size, b + (size_t)i * f->size)) return false;
    return true;
  }
  default: return true;
  }
}

bool pr_rec_equal(const struct pr_rec *rec, const void *x, const void *y) {
  for (uint32_t k = 0; k < rec->n_fields; k++) {
    const struct pr_field *f = &rec->fields[k];
    if (f->when == PR_IF_FLAG) {
      bool fx = pr_field_sent(f, x), fy = pr_field_sent(f, y);
      if (fx != fy) return false;
      if (!fx) continue;
    }
    if (!field_eq(f, x, y)) return false;
  }
  return true;
}

bool pr_msg_equal(const struct pr_msg *x, const struct pr_msg *y) {
  const struct pr_rec *rec = pr_rec_of((unsigned)x->type);
  return x->type == y->type && rec && pr_rec_equal(rec, &x->u, &y->u);
}
