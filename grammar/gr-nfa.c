/* gr-nfa.c — the NFA builder (states, byte / epsilon / call edges, rules),
 * code point sets and their UTF-8 byte sequences. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "grammar/gr-impl.h"

void gr_nfa_init(struct gr_nfa *n, char *err, size_t errlen) {
  memset(n, 0, sizeof *n);
  n->err = err;
  n->errlen = errlen;
  n->n_states = 1; /* state 0: the dummy handed out after a failure */
  n->any_obj = n->any_arr = n->any_val = GR_NONE;
  n->tail_to = GR_NONE;
}

void gr_nfa_free(struct gr_nfa *n) {
  free(n->e);
  free(n->rule_start);
  free(n->rule_final);
  memset(n, 0, sizeof *n);
}

int gr_nfa_fail(struct gr_nfa *n, int code, const char *fmt, ...) {
  if (n->rc) return n->rc;
  va_list ap;
  va_start(ap, fmt);
  cm_vfail(n->err, n->errlen, code, fmt, ap);
  va_end(ap);
  /* one line, whatever text of the request it quotes (JSON's "near '...'") */
  for (char *c = n->err; c && n->errlen && *c; c++)
    if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = ' ';
  n->rc = code;
  return code;
}

uint32_t gr_nfa_state(struct gr_nfa *n) {
  if (n->rc) return 0;
  if (n->n_states >= GR_MAX_NFA_STATES) {
    gr_nfa_fail(n, CM_ERR_TOOBIG, "grammar: more than %u automaton states", GR_MAX_NFA_STATES);
    return 0;
  }
  return n->n_states++;
}

uint32_t gr_nfa_rule(struct gr_nfa *n) {
  if (n->rc) return 0;
  if (n->n_rules >= GR_MAX_RULES) {
    gr_nfa_fail(n, CM_ERR_TOOBIG, "grammar: more than %u rules", GR_MAX_RULES);
    return 0;
  }
  if (n->n_rules == n->cap_rules) {
    uint32_t cap = n->cap_rules ? n->cap_rules * 2 : 16;
    uint32_t *a = realloc(n->rule_start, cap * sizeof *a);
    if (a) n->rule_start = a;
    uint32_t *b = realloc(n->rule_final, cap * sizeof *b);
    if (b) n->rule_final = b;
    if (!a || !b) {
      gr_nfa_fail(n, CM_ERR_NOMEM, "grammar: out of memory");
      return 0;
    }
    n->cap_rules = cap;
  }
  uint32_t r = n->n_rules++;
  n->rule_start[r] = gr_nfa_state(n);
  n->rule_final[r] = gr_nfa_state(n);
  return r;
}

static void add_edge(struct gr_nfa *n, uint8_t kind, uint32_t from, uint32_t to, uint32_t callee,
                     uint8_t lo, uint8_t hi) {
  if (n->rc) return;
  if (n->n_e == n->cap_e) {
    size_t cap = n->cap_e ? n->cap_e * 2 : 256;
    if (cap > 8u * GR_MAX_NFA_STATES) {
      gr_nfa_fail(n, CM_ERR_TOOBIG, "grammar: more than %u automaton edges",
                  8u * GR_MAX_NFA_STATES);
      return;
    }
    struct gr_edge *e = realloc(n->e, cap * sizeof *e);
    if (!e) {
      gr_nfa_fail(n, CM_ERR_NOMEM, "grammar: out of memory");
      return;
    }
    n->e = e;
    n->cap_e = cap;
  }
  n->e[n->n_e++] =
      (struct gr_edge){.from = from, .to = to, .callee = callee, .kind = kind, .lo = lo, .hi = hi};
}

void gr_nfa_eps(struct gr_nfa *n, uint32_t from, uint32_t to) {
  add_edge(n, GR_E_EPS, from, to, 0, 0, 0);
}
void gr_nfa_byte(struct gr_nfa *n, uint32_t from, uint32_t to, uint8_t lo, uint8_t hi) {
  add_edge(n, GR_E_BYTE, from, to, 0, lo, hi);
}
void gr_nfa_call(struct gr_nfa *n, uint32_t from, uint32_t to, uint32_t callee) {
  add_edge(n, GR_E_CALL, from, to, callee, 0, 0);
}

void gr_nfa_lit(struct gr_nfa *n, uint32_t from, uint32_t to, const char *s, size_t len) {
  if (len == 0) {
    gr_nfa_eps(n, from, to);
    return;
  }
  uint32_t cur = from;
  for (size_t i = 0; i < len; i++) {
    uint32_t nx = i + 1 == len ? to : gr_nfa_state(n);
    gr_nfa_byte(n, cur, nx, (uint8_t)s[i], (uint8_t)s[i]);
    cur = nx;
  }
}

/* ---- UTF-8 --------------------------------------------------------------- */
static int utf8_len(uint32_t c) {
  return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
}

static void utf8_enc(uint32_t c, uint8_t *b) {
  int k = utf8_len(c);
  if (k == 1) {
    b[0] = (uint8_t)c;
  } else if (k == 2) {
    b[0] = (uint8_t)(0xc0 | (c >> 6));
    b[1] = (uint8_t)(0x80 | (c & 0x3f));
  } else if (k == 3) {
    b[0] = (uint8_t)(0xe0 | (c >> 12));
    b[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3f));
    b[2] = (uint8_t)(0x80 | (c & 0x3f));
  } else {
    b[0] = (uint8_t)(0xf0 | (c >> 18));
    b[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3f));
    b[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3f));
    b[3] = (uint8_t)(0x80 | (c & 0x3f));
  }
}

/* Splits lo..hi until every piece's UTF-8 encodings differ only in ranges of
 * each byte (then a chain of byte ranges spells exactly that piece). */
static void cps_rec(struct gr_nfa *n, uint32_t from, uint32_t to, uint32_t lo, uint32_t hi) {
  if (lo > hi || n->rc) return;
  static const uint32_t lim[3] = {0x7f, 0x7ff, 0xffff};
  for (int i = 0; i < 3; i++) {
    if (lo <= lim[i] && hi > lim[i]) {
      cps_rec(n, from, to, lo, lim[i]);
      cps_rec(n, from, to, lim[i] + 1, hi);
      return;
    }
  }
  int k = utf8_len(lo);
  for (int i = 1; i < k; i++) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        cps_rec(n, from, to, lo, lo | m);
        cps_rec(n, from, to, (lo | m) + 1, hi);
        return;
      }
      if ((hi & m) != m) {
        cps_rec(n, from, to, lo, (hi & ~m) - 1);
        cps_rec(n, from, to, hi & ~m, hi);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  utf8_enc(lo, a);
  utf8_enc(hi, b);
  /* the last bytes are often any continuation byte: those tails (k bytes of
   * 80..BF, then `to`) are shared, so that the automaton stays small */
  int full = k;
  while (full > 1 && a[full - 1] == 0x80 && b[full - 1] == 0xbf)
    full--;
  if (n->tail_to != to) {
    n->tail_to = to;
    memset(n->tail, 0, sizeof n->tail);
  }
  uint32_t cur = from;
  for (int i = 0; i < k; i++) {
    if (i == full) break;
    uint32_t nx;
    if (i + 1 == k) {
      nx = to;
    } else if (i + 1 >= full) { /* the rest is k - i - 1 full continuation bytes */
      int rest = k - i - 1;
      if (!n->tail[rest]) {
        uint32_t t = gr_nfa_state(n), c = t;
        for (int j = 0; j < rest; j++) {
          uint32_t x = j + 1 == rest ? to : gr_nfa_state(n);
          gr_nfa_byte(n, c, x, 0x80, 0xbf);
          c = x;
        }
        n->tail[rest] = t;
      }
      nx = n->tail[rest];
    } else {
      nx = gr_nfa_state(n);
    }
    gr_nfa_byte(n, cur, nx, a[i], b[i]);
    cur = nx;
  }
}

void gr_nfa_cps(struct gr_nfa *n, uint32_t from, uint32_t to, uint32_t lo, uint32_t hi) {
  if (hi > 0x10ffff) hi = 0x10ffff;
  if (lo <= 0xdfff && hi >= 0xd800) { /* surrogates never appear in UTF-8 */
    if (lo < 0xd800) cps_rec(n, from, to, lo, 0xd7ff);
    if (hi > 0xdfff) cps_rec(n, from, to, 0xe000, hi);
    return;
  }
  cps_rec(n, from, to, lo, hi);
}

/* ---- code point sets ----------------------------------------------------- */
void gr_cpset_add(struct gr_cpset *s, uint32_t lo, uint32_t hi) {
  if (s->n == s->cap) {
    uint32_t cap = s->cap ? s->cap * 2 : 8;
    uint32_t *r = realloc(s->r, (size_t)cap * 2 * sizeof *r);
    if (!r) {
      s->oom = 1;
      return;
    }
    s->r = r;
    s->cap = cap;
  }
  s->r[2 * s->n] = lo;
  s->r[2 * s->n + 1] = hi;
  s->n++;
}

void gr_cpset_addset(struct gr_cpset *s, const struct gr_cpset *o) {
  for (uint32_t i = 0; i < o->n; i++)
    gr_cpset_add(s, o->r[2 * i], o->r[2 * i + 1]);
}

static int cmp_pair(const void *a, const void *b) {
  const uint32_t *x = a, *y = b;
  return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : 0;
}

void gr_cpset_normalize(struct gr_cpset *s) {
  if (s->n == 0) return;
  qsort(s->r, s->n, 2 * sizeof(uint32_t), cmp_pair);
  uint32_t w = 0;
  for (uint32_t i = 1; i < s->n; i++) {
    if (s->r[2 * i] <= s->r[2 * w + 1] + 1) {
      if (s->r[2 * i + 1] > s->r[2 * w + 1]) s->r[2 * w + 1] = s->r[2 * i + 1];
    } else {
      w++;
      s->r[2 * w] = s->r[2 * i];
      s->r[2 * w + 1] = s->r[2 * i + 1];
    }
  }
  s->n = w + 1;
}

void gr_cpset_negate(struct gr_cpset *s) {
  gr_cpset_normalize(s);
  struct gr_cpset o = {.oom = s->oom};
  uint32_t next = 0;
  for (uint32_t i = 0; i < s->n; i++) {
    if (s->r[2 * i] > next) gr_cpset_add(&o, next, s->r[2 * i] - 1);
    next = s->r[2 * i + 1] + 1;
  }
  if (next <= 0x10ffff) gr_cpset_add(&o, next, 0x10ffff);
  free(s->r);
  *s = o;
}

void gr_cpset_free(struct gr_cpset *s) {
  free(s->r);
  memset(s, 0, sizeof *s);
}

void gr_nfa_cpset(struct gr_nfa *n, uint32_t from, uint32_t to, const struct gr_cpset *s) {
  if (s->oom) gr_nfa_fail(n, CM_ERR_NOMEM, "grammar: out of memory");
  for (uint32_t i = 0; i < s->n; i++)
    gr_nfa_cps(n, from, to, s->r[2 * i], s->r[2 * i + 1]);
}
