/* pr-codec.c — the message codec's entry points (header frame, encode/decode
 * dispatch, validation) and the helpers every message shares: slices,
 * strings, sampling parameters and logprobs (see pr-codec.h). */
#include <float.h>
#include <math.h>
#include <string.h>

#include "common/cm-err.h"
#include "proto/pr-codec.h"

/* ======================================================================== */
/* types                                                                     */

const char *pr_type_name(enum pr_type t) {
  switch (t) {
  case PR_ADD: return "ADD";
  case PR_ABORT: return "ABORT";
  case PR_PING: return "PING";
  case PR_OUT: return "OUT";
  case PR_ERR: return "ERR";
  case PR_PONG: return "PONG";
  case PR_STEP: return "STEP";
  case PR_CTRL: return "CTRL";
  case PR_READY: return "READY";
  case PR_RESULT: return "RESULT";
  case PR_BEAT: return "BEAT";
  case PR_FAIL: return "FAIL";
  }
  return "?";
}

bool pr_type_known(unsigned t) {
  return t <= 0xff && pr_type_name((enum pr_type)t)[0] != '?';
}

void pr_sampling_default(struct pr_sampling *s) {
  memset(s, 0, sizeof(*s));
  s->temperature = 1.0f;
  s->top_p = 1.0f;
  s->top_k = 0;
  s->repetition_penalty = 1.0f;
  s->logprobs = -1;
}

void pr_msg_init(struct pr_msg *m, enum pr_type type) {
  memset(m, 0, sizeof(*m));
  m->type = type;
  if (type == PR_ADD) pr_sampling_default(&m->u.add.sampling);
}

/* ======================================================================== */
/* decode helpers                                                            */

int pr_dec_key(struct pr_rd *r, uint64_t *seen, int level, uint32_t *key) {
  uint64_t k;
  PR_TRY(pr_rd_key(r, PR_MAX_DEPTH - level, &k));
  if (k >= 64) {
    *key = PR_KEY_NONE;
    return pr_dec_skip(r, level);
  }
  if (*seen & PR_BIT(k)) return CM_ERR_PARSE;
  *seen |= PR_BIT(k);
  *key = (uint32_t)k;
  return 0;
}

int pr_dec_skip(struct pr_rd *r, int level) {
  return pr_rd_skip(r, PR_MAX_DEPTH - level);
}

int pr_dec_records(struct cm_arena *a, uint32_t n, size_t size, void **out) {
  *out = NULL;
  if (n == 0) return 0;
  *out = cm_arena_calloc(a, n, size);
  return *out ? 0 : CM_ERR_NOMEM;
}

int pr_dec_u32s(struct pr_rd *r, struct cm_arena *a, uint32_t max_n, struct pr_u32s *out) {
  uint32_t n;
  void *mem;
  PR_TRY(pr_rd_array(r, &n));
  if (n > max_n) return CM_ERR_TOOBIG;
  PR_TRY(pr_dec_records(a, n, sizeof(uint32_t), &mem));
  uint32_t *v = mem;
  PR_TRY(pr_rd_u32_array(r, v, n));
  out->v = v;
  out->n = n;
  return 0;
}

int pr_dec_u64s(struct pr_rd *r, struct cm_arena *a, struct pr_u64s *out) {
  uint32_t n;
  void *mem;
  PR_TRY(pr_rd_array(r, &n));
  PR_TRY(pr_dec_records(a, n, sizeof(uint64_t), &mem));
  uint64_t *v = mem;
  PR_TRY(pr_rd_u64_array(r, v, n));
  out->v = v;
  out->n = n;
  return 0;
}

int pr_dec_blocks(struct pr_rd *r, struct cm_arena *a, struct pr_i32s *out) {
  uint32_t n;
  void *mem;
  PR_TRY(pr_rd_array(r, &n));
  PR_TRY(pr_dec_records(a, n, sizeof(int32_t), &mem));
  int32_t *v = mem;
  PR_TRY(pr_rd_i32_array(r, -1, v, n));
  out->v = v;
  out->n = n;
  return 0;
}

int pr_dec_f32(struct pr_rd *r, float *out) {
  double d;
  PR_TRY(pr_rd_f64(r, &d));
  if (isnan(d) || (isfinite(d) && fabs(d) > FLT_MAX)) return CM_ERR_RANGE;
  *out = (float)d;
  return 0;
}

int pr_dec_logprob_f32s(struct pr_rd *r, struct cm_arena *a, struct pr_f32s *out) {
  uint32_t n;
  void *mem;
  PR_TRY(pr_rd_array(r, &n));
  PR_TRY(pr_dec_records(a, n, sizeof(float), &mem));
  float *v = mem;
  for (uint32_t i = 0; i < n; i++) {
    if (pr_rd_left(r) >= 5 && r->p[0] == 0xca) { /* the usual float32: inline */
      uint32_t u =
          (uint32_t)r->p[1] << 24 | (uint32_t)r->p[2] << 16 | (uint32_t)r->p[3] << 8 | r->p[4];
      memcpy(&v[i], &u, sizeof(float));
      if (isnan(v[i])) return CM_ERR_RANGE;
      r->p += 5;
    } else {
      PR_TRY(pr_dec_f32(r, &v[i]));
    }
    if (v[i] == INFINITY) return CM_ERR_RANGE;
  }
  out->v = v;
  out->n = n;
  return 0;
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one
 * (overlong forms, surrogates and code points past U+10FFFF are refused). */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  if (c < 0x80) return 1;
  size_t len;
  uint32_t cp, min;
  if ((c & 0xe0) == 0xc0)
    len = 2, cp = c & 0x1f, min = 0x80;
  else if ((c & 0xf0) == 0xe0)
    len = 3, cp = c & 0x0f, min = 0x800;
  else if ((c & 0xf8) == 0xf0)
    len = 4, cp = c & 0x07, min = 0x10000;
  else
    return 0;
  if (n < len) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (s[i] & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return len;
}

static int check_utf8(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    if (p[i] == 0) return CM_ERR_PARSE;
    size_t k = utf8_seq(p + i, n - i);
    if (!k) return CM_ERR_PARSE;
    i += k;
  }
  return 0;
}

int pr_dec_str(struct pr_rd *r, struct cm_arena *a, const char **out) {
  const char *s;
  uint32_t n;
  PR_TRY(pr_rd_str(r, &s, &n));
  if (n > PR_MAX_STR) return CM_ERR_TOOBIG;
  PR_TRY(check_utf8(s, n));
  char *copy = cm_arena_strndup(a, s, n);
  if (!copy) return CM_ERR_NOMEM;
  *out = copy;
  return 0;
}

int pr_dec_sampling(struct pr_rd *r, int level, struct pr_sampling *s) {
  uint32_t n, k;
  uint64_t seen = 0;
  int b;
  pr_sampling_default(s);
  PR_TRY(pr_rd_map(r, &n));
  for (uint32_t i = 0; i < n; i++) {
    PR_TRY(pr_dec_key(r, &seen, level, &k));
    switch (k) {
    case PR_KEY_NONE: break;
    case PR_K_SAMP_TEMPERATURE: PR_TRY(pr_dec_f32(r, &s->temperature)); break;
    case PR_K_SAMP_TOP_P: PR_TRY(pr_dec_f32(r, &s->top_p)); break;
    case PR_K_SAMP_TOP_K: PR_TRY(pr_rd_i32(r, &s->top_k)); break;
    case PR_K_SAMP_MIN_P: PR_TRY(pr_dec_f32(r, &s->min_p)); break;
    case PR_K_SAMP_PRESENCE: PR_TRY(pr_dec_f32(r, &s->presence_penalty)); break;
    case PR_K_SAMP_FREQUENCY: PR_TRY(pr_dec_f32(r, &s->frequency_penalty)); break;
    case PR_K_SAMP_REPETITION: PR_TRY(pr_dec_f32(r, &s->repetition_penalty)); break;
    case PR_K_SAMP_SEED:
      PR_TRY(pr_rd_u64(r, &s->seed));
      s->has_seed = true;
      break;
    case PR_K_SAMP_LOGPROBS: PR_TRY(pr_rd_i32(r, &s->logprobs)); break;
    case PR_K_SAMP_IGNORE_EOS:
      PR_TRY(pr_rd_bool(r, &b));
      s->ignore_eos = b;
      break;
    default: PR_TRY(pr_dec_skip(r, level)); break;
    }
  }
  return pr_check_sampling(s);
}

int pr_dec_logprobs(struct pr_rd *r, struct cm_arena *a, int level, struct pr_logprobs *lp) {
  uint32_t n, k;
  uint64_t seen = 0;
  memset(lp, 0, sizeof(*lp));
  PR_TRY(pr_rd_map(r, &n));
  for (uint32_t i = 0; i < n; i++) {
    PR_TRY(pr_dec_key(r, &seen, level, &k));
    switch (k) {
    case PR_KEY_NONE: break;
    case PR_K_LP_N_TOP:
      PR_TRY(pr_rd_u32(r, &lp->n_top));
      if (lp->n_top > PR_MAX_TOP_LOGPROBS) return CM_ERR_RANGE;
      break;
    case PR_K_LP_SAMPLED: PR_TRY(pr_dec_logprob_f32s(r, a, &lp->sampled)); break;
    case PR_K_LP_TOP_IDS: PR_TRY(pr_dec_u32s(r, a, UINT32_MAX, &lp->top_ids)); break;
    case PR_K_LP_TOP: PR_TRY(pr_dec_logprob_f32s(r, a, &lp->top)); break;
    default: PR_TRY(pr_dec_skip(r, level)); break;
    }
  }
  return 0; /* agreement with the token count is checked by the caller */
}

/* ======================================================================== */
/* encode helpers                                                            */

void pr_enc_u32s(struct pr_buf *b, struct pr_u32s s) {
  pr_wr_u32_array(b, s.v, s.n);
}

void pr_enc_u64s(struct pr_buf *b, struct pr_u64s s) {
  pr_wr_u64_array(b, s.v, s.n);
}

void pr_enc_i32s(struct pr_buf *b, struct pr_i32s s) {
  pr_wr_i32_array(b, s.v, s.n);
}

void pr_enc_f32s(struct pr_buf *b, struct pr_f32s s) {
  pr_wr_f32_array(b, s.v, s.n);
}

void pr_enc_str(struct pr_buf *b, const char *s) {
  pr_wr_str(b, s ? s : "", s ? strlen(s) : 0);
}

void pr_enc_sampling(struct pr_buf *b, const struct pr_sampling *s) {
  pr_wr_map(b, s->has_seed ? 10 : 9);
  pr_wr_uint(b, PR_K_SAMP_TEMPERATURE), pr_wr_f32(b, s->temperature);
  pr_wr_uint(b, PR_K_SAMP_TOP_P), pr_wr_f32(b, s->top_p);
  pr_wr_uint(b, PR_K_SAMP_TOP_K), pr_wr_int(b, s->top_k);
  pr_wr_uint(b, PR_K_SAMP_MIN_P), pr_wr_f32(b, s->min_p);
  pr_wr_uint(b, PR_K_SAMP_PRESENCE), pr_wr_f32(b, s->presence_penalty);
  pr_wr_uint(b, PR_K_SAMP_FREQUENCY), pr_wr_f32(b, s->frequency_penalty);
  pr_wr_uint(b, PR_K_SAMP_REPETITION), pr_wr_f32(b, s->repetition_penalty);
  if (s->has_seed) pr_wr_uint(b, PR_K_SAMP_SEED), pr_wr_uint(b, s->seed);
  pr_wr_uint(b, PR_K_SAMP_LOGPROBS), pr_wr_int(b, s->logprobs);
  pr_wr_uint(b, PR_K_SAMP_IGNORE_EOS), pr_wr_bool(b, s->ignore_eos);
}

void pr_enc_logprobs(struct pr_buf *b, const struct pr_logprobs *lp) {
  pr_wr_map(b, 4);
  pr_wr_uint(b, PR_K_LP_N_TOP), pr_wr_uint(b, lp->n_top);
  pr_wr_uint(b, PR_K_LP_SAMPLED), pr_enc_f32s(b, lp->sampled);
  pr_wr_uint(b, PR_K_LP_TOP_IDS), pr_enc_u32s(b, lp->top_ids);
  pr_wr_uint(b, PR_K_LP_TOP), pr_enc_f32s(b, lp->top);
}

/* ======================================================================== */
/* validation helpers                                                        */

static bool in(float x, float lo, float hi) {
  return x >= lo && x <= hi;
}

int pr_check_sampling(const struct pr_sampling *s) {
  if (!in(s->temperature, 0.0f, FLT_MAX)) return CM_ERR_RANGE;
  if (!(s->top_p > 0.0f && s->top_p <= 1.0f)) return CM_ERR_RANGE;
  if (s->top_k < -1) return CM_ERR_RANGE;
  if (!in(s->min_p, 0.0f, 1.0f)) return CM_ERR_RANGE;
  if (!in(s->presence_penalty, -2.0f, 2.0f)) return CM_ERR_RANGE;
  if (!in(s->frequency_penalty, -2.0f, 2.0f)) return CM_ERR_RANGE;
  if (!(s->repetition_penalty > 0.0f && s->repetition_penalty <= 100.0f)) return CM_ERR_RANGE;
  if (s->logprobs < -1 || s->logprobs > PR_MAX_TOP_LOGPROBS) return CM_ERR_RANGE;
  return 0;
}

int pr_check_slice(const void *v, uint32_t n) {
  return n && !v ? CM_ERR_INVAL : 0;
}

int pr_check_logprobs(const struct pr_logprobs *lp, uint32_t n_tokens) {
  PR_TRY(pr_check_slice(lp->sampled.v, lp->sampled.n));
  PR_TRY(pr_check_slice(lp->top_ids.v, lp->top_ids.n));
  PR_TRY(pr_check_slice(lp->top.v, lp->top.n));
  if (lp->n_top > PR_MAX_TOP_LOGPROBS) return CM_ERR_RANGE;
  if (lp->sampled.n == 0) {
    if (lp->n_top || lp->top_ids.n || lp->top.n) return CM_ERR_INVAL;
    return 0;
  }
  if (lp->sampled.n != n_tokens) return CM_ERR_INVAL;
  uint64_t want = (uint64_t)n_tokens * lp->n_top;
  if (lp->top_ids.n != want || lp->top.n != want) return CM_ERR_INVAL;
  for (uint32_t i = 0; i < lp->sampled.n; i++)
    if (isnan(lp->sampled.v[i]) || lp->sampled.v[i] == INFINITY) return CM_ERR_RANGE;
  for (uint32_t i = 0; i < lp->top.n; i++)
    if (isnan(lp->top.v[i]) || lp->top.v[i] == INFINITY) return CM_ERR_RANGE;
  return 0;
}

int pr_check_str(const char *s) {
  if (!s) return 0;
  size_t n = strnlen(s, PR_MAX_STR + 1);
  if (n > PR_MAX_STR) return CM_ERR_TOOBIG;
  return check_utf8(s, n);
}

/* ======================================================================== */
/* entry points                                                              */

int pr_msg_validate(const struct pr_msg *m) {
  switch (m->type) {
  case PR_ADD: return pr_check_add(&m->u.add);
  case PR_ABORT: return pr_check_abort(&m->u.abort);
  case PR_PING: return pr_check_ping(&m->u.ping);
  case PR_OUT: return pr_check_out(&m->u.out);
  case PR_ERR: return pr_check_err(&m->u.err);
  case PR_PONG: return pr_check_pong(&m->u.pong);
  case PR_STEP: return pr_check_step(&m->u.step);
  case PR_CTRL: return pr_check_ctrl(&m->u.ctrl);
  case PR_READY: return pr_check_ready(&m->u.ready);
  case PR_RESULT: return pr_check_result(&m->u.result);
  case PR_BEAT: return pr_check_beat(&m->u.beat);
  case PR_FAIL: return pr_check_fail(&m->u.fail);
  }
  return CM_ERR_UNKNOWN;
}

void pr_msg_header(enum pr_type t, uint8_t hdr[PR_HDR_LEN]) {
  hdr[0] = (uint8_t)t;
  hdr[1] = PR_VERSION;
}

int pr_msg_encode(const struct pr_msg *m, struct pr_buf *body) {
  pr_buf_reset(body);
  PR_TRY(pr_msg_validate(m));
  switch (m->type) {
  case PR_ADD: pr_enc_add(body, &m->u.add); break;
  case PR_ABORT: pr_enc_abort(body, &m->u.abort); break;
  case PR_PING: pr_enc_ping(body, &m->u.ping); break;
  case PR_OUT: pr_enc_out(body, &m->u.out); break;
  case PR_ERR: pr_enc_err(body, &m->u.err); break;
  case PR_PONG: pr_enc_pong(body, &m->u.pong); break;
  case PR_STEP: pr_enc_step(body, &m->u.step); break;
  case PR_CTRL: pr_enc_ctrl(body, &m->u.ctrl); break;
  case PR_READY: pr_enc_ready(body, &m->u.ready); break;
  case PR_RESULT: pr_enc_result(body, &m->u.result); break;
  case PR_BEAT: pr_enc_beat(body, &m->u.beat); break;
  case PR_FAIL: pr_enc_fail(body, &m->u.fail); break;
  }
  return body->err;
}

int pr_msg_decode_header(const void *hdr, size_t len, enum pr_type *type) {
  const uint8_t *h = hdr;
  if (len != PR_HDR_LEN) return CM_ERR_PARSE;
  if (!pr_type_known(h[0])) return CM_ERR_UNKNOWN;
  if (h[1] != PR_VERSION) return CM_ERR_VERSION;
  *type = (enum pr_type)h[0];
  return 0;
}

static int decode_any(struct pr_rd *r, struct cm_arena *a, struct pr_msg *m) {
  switch (m->type) {
  case PR_ADD: return pr_dec_add(r, a, &m->u.add);
  case PR_ABORT: return pr_dec_abort(r, a, &m->u.abort);
  case PR_PING: return pr_dec_ping(r, a, &m->u.ping);
  case PR_OUT: return pr_dec_out(r, a, &m->u.out);
  case PR_ERR: return pr_dec_err(r, a, &m->u.err);
  case PR_PONG: return pr_dec_pong(r, a, &m->u.pong);
  case PR_STEP: return pr_dec_step(r, a, &m->u.step);
  case PR_CTRL: return pr_dec_ctrl(r, a, &m->u.ctrl);
  case PR_READY: return pr_dec_ready(r, a, &m->u.ready);
  case PR_RESULT: return pr_dec_result(r, a, &m->u.result);
  case PR_BEAT: return pr_dec_beat(r, a, &m->u.beat);
  case PR_FAIL: return pr_dec_fail(r, a, &m->u.fail);
  }
  return CM_ERR_UNKNOWN;
}

int pr_msg_decode_body(enum pr_type type, const void *body, size_t len, struct cm_arena *arena,
                       struct pr_msg *out) {
  if (!pr_type_known((unsigned)type)) return CM_ERR_UNKNOWN;
  if (!body && len) return CM_ERR_INVAL;
  struct pr_rd r;
  pr_rd_init(&r, body ? body : "", len);
  pr_msg_init(out, type);
  PR_TRY(decode_any(&r, arena, out));
  if (pr_rd_left(&r)) return CM_ERR_PARSE; /* trailing bytes */
  return pr_msg_validate(out);
}

int pr_msg_decode(const void *hdr, size_t hdr_len, const void *body, size_t body_len,
                  struct cm_arena *arena, struct pr_msg *out) {
  enum pr_type t;
  PR_TRY(pr_msg_decode_header(hdr, hdr_len, &t));
  return pr_msg_decode_body(t, body, body_len, arena, out);
}
