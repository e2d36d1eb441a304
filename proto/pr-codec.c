/* pr-codec.c — the entry points of pr-msg.h (types, header frame, encode,
 * decode, validate) over the record tables (pr-codec.h), the defaults a
 * record starts from, and the bounds that the encoder's validation
 * (pr-encode.c) and the decoder (pr-decode.c) both hold fields to: UTF-8
 * strings and the elements of number slices. */
#include <stdalign.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-utf8.h"
#include "proto/pr-codec.h"

/* struct pr_slice stands for each slice struct of pr-msg.h */
#define PR_SLICE_LIKE_(T)                                                                          \
  _Static_assert(sizeof(T) == sizeof(struct pr_slice) && alignof(T) == alignof(struct pr_slice) && \
                     offsetof(T, n) == offsetof(struct pr_slice, n),                               \
                 #T " is laid out as struct pr_slice")
PR_SLICE_LIKE_(struct pr_u32s);
PR_SLICE_LIKE_(struct pr_u64s);
PR_SLICE_LIKE_(struct pr_i32s);
PR_SLICE_LIKE_(struct pr_f32s);

/* ======================================================================== */
/* types                                                                     */

static const struct {
  const char *name;
  const struct pr_rec *rec;
} types[PR_LORA_ACK + 1] = {
    [PR_ADD] = {"ADD", &pr_rec_add},
    [PR_ABORT] = {"ABORT", &pr_rec_abort},
    [PR_PING] = {"PING", &pr_rec_ping},
    [PR_DOWN] = {"DOWN", &pr_rec_down},
    [PR_OUT] = {"OUT", &pr_rec_out},
    [PR_ERR] = {"ERR", &pr_rec_err},
    [PR_PONG] = {"PONG", &pr_rec_pong},
    [PR_STEP] = {"STEP", &pr_rec_step},
    [PR_CTRL] = {"CTRL", &pr_rec_ctrl},
    [PR_READY] = {"READY", &pr_rec_ready},
    [PR_RESULT] = {"RESULT", &pr_rec_result},
    [PR_BEAT] = {"BEAT", &pr_rec_beat},
    [PR_FAIL] = {"FAIL", &pr_rec_fail},
    [PR_DIST] = {"DIST", &pr_rec_dist},
    [PR_LORA] = {"LORA", &pr_rec_lora},
    [PR_LORA_DONE] = {"LORA_DONE", &pr_rec_lora},
    [PR_LORA_ACK] = {"LORA_ACK", &pr_rec_lora},
};

const struct pr_rec *pr_rec_of(unsigned t) {
  return t < sizeof(types) / sizeof(types[0]) ? types[t].rec : NULL;
}

const char *pr_type_name(enum pr_type t) {
  return pr_rec_of((unsigned)t) ? types[t].name : "?";
}

bool pr_type_known(unsigned t) {
  return pr_rec_of(t) != NULL;
}

/* ======================================================================== */
/* defaults                                                                  */

void pr_field_default(const struct pr_field *f, void *rec) {
  uint8_t *p = (uint8_t *)rec + f->off;
  switch (f->type) {
  case PR_FT_UINT:
  case PR_FT_INT: pr_uint_set(p, f->size, (uint64_t)(int64_t)f->def); break;
  case PR_FT_FLOAT:
    if (f->size == sizeof(float)) {
      float x = (float)f->def;
      memcpy(p, &x, sizeof(x));
    } else {
      memcpy(p, &f->def, sizeof(double));
    }
    break;
  case PR_FT_STR:
    if (f->when != PR_IF_SET) *(const char **)p = "";
    break;
  case PR_FT_REC: pr_rec_defaults(f->sub, p); break;
  default: break;
  }
}

void pr_rec_defaults(const struct pr_rec *rec, void *at) {
  for (uint32_t k = 0; k < rec->n_fields; k++)
    pr_field_default(&rec->fields[k], at);
}

void pr_field_reset(const struct pr_field *f, void *rec) {
  memset((uint8_t *)rec + f->off, 0, f->size);
  pr_field_default(f, rec);
}

void pr_sampling_default(struct pr_sampling *s) {
  memset(s, 0, sizeof(*s));
  pr_rec_defaults(&pr_rec_sampling, s);
}

void pr_msg_init(struct pr_msg *m, enum pr_type type) {
  memset(m, 0, sizeof(*m));
  m->type = type;
  const struct pr_rec *rec = pr_rec_of((unsigned)type);
  if (rec) pr_rec_defaults(rec, &m->u);
}

/* ======================================================================== */
/* bounds shared by the encoder (validation) and the decoder                 */

int pr_check_utf8(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    if (p[i] == 0) return CM_ERR_PARSE;
    size_t k = cm_utf8_len(p + i, n - i);
    if (!k) return CM_ERR_PARSE;
    i += k;
  }
  return 0;
}

int pr_check_numbers(const struct pr_field *f, const void *v, uint32_t n) {
  switch (f->num) {
  case PR_NUM_U32:
    if (f->min == 0 && f->max >= UINT32_MAX) break; /* any uint32_t */
    for (uint32_t i = 0; i < n; i++)
      if (!pr_uint_in(f, ((const uint32_t *)v)[i])) return CM_ERR_RANGE;
    break;
  case PR_NUM_U64:
    if (f->min == 0 && f->max == UINT64_MAX) break; /* any uint64_t */
    for (uint32_t i = 0; i < n; i++)
      if (!pr_uint_in(f, ((const uint64_t *)v)[i])) return CM_ERR_RANGE;
    break;
  case PR_NUM_I32:
    for (uint32_t i = 0; i < n; i++)
      if (!pr_int_in(f, ((const int32_t *)v)[i])) return CM_ERR_RANGE;
    break;
  case PR_NUM_F32:
    for (uint32_t i = 0; i < n; i++)
      if (!pr_float_in(f, ((const float *)v)[i])) return CM_ERR_RANGE;
    break;
  case PR_NUM_U8: break; /* any bytes */
  }
  return 0;
}

/* ======================================================================== */
/* entry points                                                              */

int pr_msg_validate(const struct pr_msg *m) {
  const struct pr_rec *rec = pr_rec_of((unsigned)m->type);
  return rec ? pr_rec_put(NULL, rec, &m->u) : CM_ERR_UNKNOWN;
}

void pr_msg_header(enum pr_type t, uint8_t hdr[PR_HDR_LEN]) {
  hdr[0] = (uint8_t)t;
  hdr[1] = PR_VERSION;
}

int pr_msg_encode(const struct pr_msg *m, struct pr_buf *body) {
  const struct pr_rec *rec = pr_rec_of((unsigned)m->type);
  pr_buf_reset(body);
  int rc = rec ? pr_rec_put(body, rec, &m->u) : CM_ERR_UNKNOWN;
  if (!rc) rc = body->err;
  if (rc) pr_buf_reset(body); /* nothing half-written stays */
  return rc;
}

int pr_msg_decode_header(const void *hdr, size_t len, enum pr_type *type) {
  const uint8_t *h = hdr;
  if (len != PR_HDR_LEN) return CM_ERR_PARSE;
  if (!pr_type_known(h[0])) return CM_ERR_UNKNOWN;
  if (h[1] != PR_VERSION) return CM_ERR_VERSION;
  *type = (enum pr_type)h[0];
  return 0;
}

int pr_msg_decode_body(enum pr_type type, const void *body, size_t len, struct cm_arena *arena,
                       struct pr_msg *out) {
  const struct pr_rec *rec = pr_rec_of((unsigned)type);
  if (!rec) return CM_ERR_UNKNOWN;
  if (!body && len) return CM_ERR_INVAL;
  struct pr_rd r;
  pr_rd_init(&r, body ? body : "", len);
  pr_msg_init(out, type);
  PR_TRY(pr_rec_decode(&r, arena, rec, &out->u, 1)); /* bounds and checks included */
  return pr_rd_left(&r) ? CM_ERR_PARSE : 0;          /* trailing bytes */
}

int pr_msg_decode(const void *hdr, size_t hdr_len, const void *body, size_t body_len,
                  struct cm_arena *arena, struct pr_msg *out) {
  enum pr_type t;
  PR_TRY(pr_msg_decode_header(hdr, hdr_len, &t));
  return pr_msg_decode_body(t, body, body_len, arena, out);
}
