/* gr-regex.c — ECMA-262 patterns (the subset JSON Schema `pattern`s and
 * structured-output users write) parsed into a small tree and emitted into the
 * NFA as UTF-8 byte sequences. Constructs that a regular language cannot hold
 * or that we do not implement (lookaround, backreferences, \b, flags, property
 * escapes) are refused with their offset. */
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-hex.h"
#include "grammar/gr-impl.h"

enum { RX_SET, RX_CAT, RX_ALT, RX_REP };
#define RX_INF    UINT32_MAX
#define RX_NESTED 200 /* groups inside groups */

struct rx_node {
  int kind;
  uint32_t child, next;         /* CAT / ALT: first child; siblings chain (GR_NONE ends) */
  uint32_t min, max;            /* RX_REP: of child */
  uint8_t anch_start, anch_end; /* top-level branches of ALT: ^ / $ */
  struct gr_cpset set;          /* RX_SET */
};

struct rx {
  struct gr_nfa *n;
  const char *p;
  size_t len, pos;
  struct rx_node *nodes;
  uint32_t n_nodes, cap_nodes;
  const char *what; /* "regex" or "json_schema: pattern at /x" */
  int json, depth;
};

static int rx_fail(struct rx *x, int code, const char *msg, size_t at) {
  return gr_nfa_fail(x->n, code, "%s: %s at %zu", x->what, msg, at);
}

static uint32_t rx_new(struct rx *x, int kind) {
  if (x->n->rc) return GR_NONE;
  if (x->n_nodes == x->cap_nodes) {
    uint32_t cap = x->cap_nodes ? x->cap_nodes * 2 : 64;
    if (cap > 1000000u) {
      rx_fail(x, CM_ERR_TOOBIG, "pattern too long", x->pos);
      return GR_NONE;
    }
    struct rx_node *a = realloc(x->nodes, cap * sizeof *a);
    if (!a) {
      gr_nfa_fail(x->n, CM_ERR_NOMEM, "%s: out of memory", x->what);
      return GR_NONE;
    }
    x->nodes = a;
    x->cap_nodes = cap;
  }
  uint32_t i = x->n_nodes++;
  memset(&x->nodes[i], 0, sizeof x->nodes[i]);
  x->nodes[i].kind = kind;
  x->nodes[i].child = x->nodes[i].next = GR_NONE;
  return i;
}

/* Decodes one UTF-8 code point of the pattern; GR_NONE on bad UTF-8. */
static uint32_t rx_utf8(struct rx *x) {
  const uint8_t *s = (const uint8_t *)x->p + x->pos;
  size_t left = x->len - x->pos;
  uint32_t c = s[0];
  int k = c < 0x80             ? 1
          : (c & 0xe0) == 0xc0 ? 2
          : (c & 0xf0) == 0xe0 ? 3
          : (c & 0xf8) == 0xf0 ? 4
                               : 0;
  if (k == 0 || (size_t)k > left) return GR_NONE;
  if (k > 1) c &= 0x3fu >> (k - 1);
  for (int i = 1; i < k; i++) {
    if ((s[i] & 0xc0) != 0x80) return GR_NONE;
    c = (c << 6) | (s[i] & 0x3f);
  }
  static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (c < min[k] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return GR_NONE;
  x->pos += (size_t)k;
  return c;
}

static int rx_hex(struct rx *x, int digits, uint32_t *out) {
  if (x->pos + (size_t)digits > x->len) return -1;
  uint32_t v = 0;
  for (int i = 0; i < digits; i++) {
    int h = cm_hex_digit(x->p[x->pos + (size_t)i]);
    if (h < 0) return -1;
    v = v * 16 + (uint32_t)h;
  }
  x->pos += (size_t)digits;
  *out = v;
  return 0;
}

static void set_class(struct gr_cpset *s, char k) {
  switch (k) {
  case 'd': gr_cpset_add(s, '0', '9'); break;
  case 'w':
    gr_cpset_add(s, '0', '9');
    gr_cpset_add(s, 'A', 'Z');
    gr_cpset_add(s, '_', '_');
    gr_cpset_add(s, 'a', 'z');
    break;
  case 's': {
    static const uint32_t ws[][2] = {
        {9, 13},          {32, 32},         {0xa0, 0xa0},     {0x1680, 0x1680}, {0x2000, 0x200a},
        {0x2028, 0x2029}, {0x202f, 0x202f}, {0x205f, 0x205f}, {0x3000, 0x3000}, {0xfeff, 0xfeff}};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
      gr_cpset_add(s, ws[i][0], ws[i][1]);
    break;
  }
  }
}

/* After a backslash: one code point into *cp (returns 1), or a class into set
 * (returns 2), or an error (returns 0). in_class: inside [...]. */
static int rx_escape(struct rx *x, int in_class, uint32_t *cp, struct gr_cpset *set) {
  size_t at = x->pos - 1;
  if (x->pos >= x->len) return rx_fail(x, CM_ERR_INVAL, "pattern ends with a lone '\\'", at), 0;
  char c = x->p[x->pos++];
  switch (c) {
  case 'd':
  case 'w':
  case 's': set_class(set, c); return 2;
  case 'D':
  case 'W':
  case 'S':
    set_class(set, (char)(c + 32));
    gr_cpset_negate(set);
    return 2;
  case 't': *cp = '\t'; return 1;
  case 'n': *cp = '\n'; return 1;
  case 'r': *cp = '\r'; return 1;
  case 'f': *cp = '\f'; return 1;
  case 'v': *cp = '\v'; return 1;
  case '0':
    if (x->pos < x->len && x->p[x->pos] >= '0' && x->p[x->pos] <= '9')
      return rx_fail(x, CM_ERR_INVAL, "octal escape is not supported", at), 0;
    *cp = 0;
    return 1;
  case 'b':
    if (in_class) {
      *cp = 8;
      return 1;
    }
    return rx_fail(x, CM_ERR_INVAL, "word boundary '\\b' is not supported", at), 0;
  case 'B': return rx_fail(x, CM_ERR_INVAL, "word boundary '\\B' is not supported", at), 0;
  case 'k': return rx_fail(x, CM_ERR_INVAL, "backreference '\\k' is not supported", at), 0;
  case 'p':
  case 'P': return rx_fail(x, CM_ERR_INVAL, "unicode property escape is not supported", at), 0;
  case 'c':
    if (x->pos < x->len && ((x->p[x->pos] | 32) >= 'a' && (x->p[x->pos] | 32) <= 'z')) {
      *cp = (uint32_t)(x->p[x->pos++] & 31);
      return 1;
    }
    return rx_fail(x, CM_ERR_INVAL, "invalid '\\c' escape", at), 0;
  case 'x':
    if (rx_hex(x, 2, cp)) return rx_fail(x, CM_ERR_INVAL, "invalid '\\x' escape", at), 0;
    return 1;
  case 'u':
    if (x->pos < x->len && x->p[x->pos] == '{') {
      uint32_t v = 0;
      size_t i = x->pos + 1;
      int nd = 0;
      while (i < x->len && cm_hex_digit(x->p[i]) >= 0 && v <= 0x10ffff)
        v = v * 16 + (uint32_t)cm_hex_digit(x->p[i++]), nd++;
      if (nd == 0 || i >= x->len || x->p[i] != '}' || v > 0x10ffff)
        return rx_fail(x, CM_ERR_INVAL, "invalid '\\u{...}' escape", at), 0;
      x->pos = i + 1;
      *cp = v;
    } else if (rx_hex(x, 4, cp)) {
      return rx_fail(x, CM_ERR_INVAL, "invalid '\\u' escape", at), 0;
    }
    if (*cp >= 0xd800 && *cp <= 0xdbff && x->pos + 6 <= x->len && x->p[x->pos] == '\\' &&
        x->p[x->pos + 1] == 'u') {
      size_t save = x->pos;
      uint32_t lo;
      x->pos += 2;
      if (!rx_hex(x, 4, &lo) && lo >= 0xdc00 && lo <= 0xdfff) {
        *cp = 0x10000 + ((*cp - 0xd800) << 10) + (lo - 0xdc00);
        return 1;
      }
      x->pos = save;
    }
    if (*cp >= 0xd800 && *cp <= 0xdfff)
      return rx_fail(x, CM_ERR_INVAL, "lone surrogate escape is not supported", at), 0;
    return 1;
  default: break;
  }
  if (c >= '1' && c <= '9')
    return rx_fail(x, CM_ERR_INVAL, "backreference is not supported", at), 0;
  if (strchr("^$\\.*+?()[]{}|/", c) || (in_class && c == '-')) {
    *cp = (uint32_t)(uint8_t)c;
    return 1;
  }
  return rx_fail(x, CM_ERR_INVAL, "invalid escape", at), 0;
}

static uint32_t rx_class(struct rx *x) {
  size_t at = x->pos - 1;
  uint32_t id = rx_new(x, RX_SET);
  if (id == GR_NONE) return GR_NONE;
  int neg = 0;
  if (x->pos < x->len && x->p[x->pos] == '^') neg = 1, x->pos++;
  struct gr_cpset *set = &x->nodes[id].set;
  for (;;) {
    if (x->pos >= x->len) return rx_fail(x, CM_ERR_INVAL, "unterminated '['", at), GR_NONE;
    if (x->p[x->pos] == ']') {
      x->pos++;
      break;
    }
    /* one atom: a code point or a class escape */
    uint32_t lo = 0, hi = 0;
    struct gr_cpset tmp = {0};
    int k;
    size_t a_at = x->pos;
    if (x->p[x->pos] == '\\') {
      x->pos++;
      k = rx_escape(x, 1, &lo, &tmp);
      if (k == 0) return gr_cpset_free(&tmp), GR_NONE;
    } else {
      lo = rx_utf8(x);
      if (lo == GR_NONE) return rx_fail(x, CM_ERR_INVAL, "invalid UTF-8", a_at), GR_NONE;
      k = 1;
    }
    if (k == 2) {
      gr_cpset_addset(set, &tmp);
      gr_cpset_free(&tmp);
      if (x->pos + 1 < x->len && x->p[x->pos] == '-' && x->p[x->pos + 1] != ']')
        return rx_fail(x, CM_ERR_INVAL, "class escape in a range", a_at), GR_NONE;
      continue;
    }
    hi = lo;
    if (x->pos + 1 < x->len && x->p[x->pos] == '-' && x->p[x->pos + 1] != ']') {
      x->pos++;
      size_t b_at = x->pos;
      if (x->p[x->pos] == '\\') {
        x->pos++;
        k = rx_escape(x, 1, &hi, &tmp);
        gr_cpset_free(&tmp);
        if (k == 0) return GR_NONE;
        if (k == 2) return rx_fail(x, CM_ERR_INVAL, "class escape in a range", b_at), GR_NONE;
      } else {
        hi = rx_utf8(x);
        if (hi == GR_NONE) return rx_fail(x, CM_ERR_INVAL, "invalid UTF-8", b_at), GR_NONE;
      }
      if (hi < lo) return rx_fail(x, CM_ERR_INVAL, "range out of order in class", a_at), GR_NONE;
    }
    gr_cpset_add(set, lo, hi);
  }
  if (neg) gr_cpset_negate(set);
  gr_cpset_normalize(set);
  return id;
}

/* Reads {n}, {n,}, {n,m} at x->pos ('{' there): 1 and min/max, 0 when it is not a
 * quantifier (left unread), -1 on error. */
static int rx_braces(struct rx *x, uint32_t *min, uint32_t *max) {
  size_t i = x->pos + 1;
  uint64_t a = 0, b;
  int nd = 0;
  while (i < x->len && x->p[i] >= '0' && x->p[i] <= '9') {
    if (a < 100000000) a = a * 10 + (uint64_t)(x->p[i] - '0');
    i++, nd++;
  }
  if (nd == 0) return 0;
  b = a;
  if (i < x->len && x->p[i] == ',') {
    i++;
    nd = 0;
    b = 0;
    while (i < x->len && x->p[i] >= '0' && x->p[i] <= '9') {
      if (b < 100000000) b = b * 10 + (uint64_t)(x->p[i] - '0');
      i++, nd++;
    }
    if (nd == 0) b = RX_INF;
  }
  if (i >= x->len || x->p[i] != '}') return 0;
  size_t at = x->pos;
  x->pos = i + 1;
  if (b != RX_INF && b < a)
    return rx_fail(x, CM_ERR_INVAL, "numbers out of order in {} quantifier", at), -1;
  if (a > GR_MAX_REPEAT || (b != RX_INF && b > GR_MAX_REPEAT))
    return gr_nfa_fail(x->n, CM_ERR_TOOBIG, "%s: repetition count above %u at %zu", x->what,
                       GR_MAX_REPEAT, at),
           -1;
  *min = (uint32_t)a;
  *max = (uint32_t)b;
  return 1;
}

static uint32_t rx_alt(struct rx *x, int top);

static uint32_t rx_atom(struct rx *x) {
  size_t at = x->pos;
  char c = x->p[x->pos];
  switch (c) {
  case '(': {
    x->pos++;
    if (x->pos < x->len && x->p[x->pos] == '?') {
      if (x->pos + 1 < x->len && x->p[x->pos + 1] == ':') {
        x->pos += 2;
      } else if (x->pos + 1 < x->len && (x->p[x->pos + 1] == '=' || x->p[x->pos + 1] == '!')) {
        return rx_fail(x, CM_ERR_INVAL, "lookahead is not supported", at), GR_NONE;
      } else if (x->pos + 2 < x->len && x->p[x->pos + 1] == '<' &&
                 (x->p[x->pos + 2] == '=' || x->p[x->pos + 2] == '!')) {
        return rx_fail(x, CM_ERR_INVAL, "lookbehind is not supported", at), GR_NONE;
      } else if (x->pos + 1 < x->len && x->p[x->pos + 1] == '<') {
        size_t i = x->pos + 2;
        while (i < x->len && x->p[i] != '>' &&
               (((x->p[i] | 32) >= 'a' && (x->p[i] | 32) <= 'z') || x->p[i] == '_' ||
                x->p[i] == '$' || (unsigned char)x->p[i] >= 0x80 ||
                (i > x->pos + 2 && x->p[i] >= '0' && x->p[i] <= '9')))
          i++;
        if (i >= x->len || x->p[i] != '>' || i == x->pos + 2)
          return rx_fail(x, CM_ERR_INVAL, "invalid group name", at), GR_NONE;
        x->pos = i + 1;
      } else {
        return rx_fail(x, CM_ERR_INVAL, "group modifiers / flags are not supported", at), GR_NONE;
      }
    }
    if (++x->depth > RX_NESTED)
      return gr_nfa_fail(x->n, CM_ERR_TOOBIG, "%s: groups nested deeper than %d at %zu", x->what,
                         RX_NESTED, at),
             GR_NONE;
    uint32_t id = rx_alt(x, 0);
    x->depth--;
    if (id == GR_NONE) return GR_NONE;
    if (x->pos >= x->len || x->p[x->pos] != ')')
      return rx_fail(x, CM_ERR_INVAL, "unbalanced '('", at), GR_NONE;
    x->pos++;
    return id;
  }
  case ')': return rx_fail(x, CM_ERR_INVAL, "unbalanced ')'", at), GR_NONE;
  case '[': x->pos++; return rx_class(x);
  case '*':
  case '+':
  case '?': return rx_fail(x, CM_ERR_INVAL, "nothing to repeat", at), GR_NONE;
  case '{': {
    uint32_t a, b;
    int k = rx_braces(x, &a, &b);
    if (k < 0) return GR_NONE;
    if (k > 0) return rx_fail(x, CM_ERR_INVAL, "nothing to repeat", at), GR_NONE;
    return rx_fail(x, CM_ERR_INVAL, "lone '{' (escape it as '\\{')", at), GR_NONE;
  }
  case '}': return rx_fail(x, CM_ERR_INVAL, "lone '}' (escape it as '\\}')", at), GR_NONE;
  case ']': return rx_fail(x, CM_ERR_INVAL, "lone ']' (escape it as '\\]')", at), GR_NONE;
  case '^':
  case '$':
    return rx_fail(x, CM_ERR_INVAL,
                   c == '^' ? "anchor '^' is supported only at the start"
                            : "anchor '$' is supported only at the end",
                   at),
           GR_NONE;
  default: break;
  }
  uint32_t id = rx_new(x, RX_SET);
  if (id == GR_NONE) return GR_NONE;
  struct gr_cpset *set = &x->nodes[id].set;
  if (c == '.') {
    x->pos++;
    gr_cpset_add(set, '\n', '\n');
    gr_cpset_add(set, '\r', '\r');
    gr_cpset_add(set, 0x2028, 0x2029);
    gr_cpset_negate(set);
    return id;
  }
  uint32_t cp;
  if (c == '\\') {
    x->pos++;
    int k = rx_escape(x, 0, &cp, set);
    if (k == 0) return GR_NONE;
    if (k == 1) gr_cpset_add(set, cp, cp);
    gr_cpset_normalize(set);
    return id;
  }
  cp = rx_utf8(x);
  if (cp == GR_NONE) return rx_fail(x, CM_ERR_INVAL, "invalid UTF-8", at), GR_NONE;
  gr_cpset_add(set, cp, cp);
  return id;
}

static uint32_t rx_seq(struct rx *x, int top, uint8_t *anch_start, uint8_t *anch_end) {
  uint32_t cat = rx_new(x, RX_CAT), last = GR_NONE;
  if (cat == GR_NONE) return GR_NONE;
  if (top && x->pos < x->len && x->p[x->pos] == '^') x->pos++, *anch_start = 1;
  while (x->pos < x->len && x->p[x->pos] != '|' && x->p[x->pos] != ')') {
    if (top && x->p[x->pos] == '$' && (x->pos + 1 == x->len || x->p[x->pos + 1] == '|')) {
      x->pos++;
      *anch_end = 1;
      break;
    }
    uint32_t a = rx_atom(x);
    if (a == GR_NONE) return GR_NONE;
    for (;;) { /* quantifiers (several in a row are an error, as in JS) */
      if (x->pos >= x->len) break;
      char q = x->p[x->pos];
      uint32_t min, max;
      size_t at = x->pos;
      if (q == '*')
        min = 0, max = RX_INF, x->pos++;
      else if (q == '+')
        min = 1, max = RX_INF, x->pos++;
      else if (q == '?')
        min = 0, max = 1, x->pos++;
      else if (q == '{') {
        int k = rx_braces(x, &min, &max);
        if (k < 0) return GR_NONE;
        if (k == 0) break;
      } else
        break;
      if (x->pos < x->len && x->p[x->pos] == '?') x->pos++; /* lazy: the same language */
      uint32_t r = rx_new(x, RX_REP);
      if (r == GR_NONE) return GR_NONE;
      x->nodes[r].child = a;
      x->nodes[r].min = min;
      x->nodes[r].max = max;
      a = r;
      if (x->pos < x->len && strchr("*+?", x->p[x->pos]))
        return rx_fail(x, CM_ERR_INVAL, "nothing to repeat", x->pos), GR_NONE;
      if (x->pos < x->len && x->p[x->pos] == '{') {
        uint32_t m1, m2;
        size_t save = x->pos;
        int k = rx_braces(x, &m1, &m2);
        if (k < 0) return GR_NONE;
        if (k > 0) return rx_fail(x, CM_ERR_INVAL, "nothing to repeat", save), GR_NONE;
      }
      (void)at;
      break;
    }
    if (last == GR_NONE)
      x->nodes[cat].child = a;
    else
      x->nodes[last].next = a;
    last = a;
  }
  return cat;
}

static uint32_t rx_alt(struct rx *x, int top) {
  uint32_t alt = rx_new(x, RX_ALT), last = GR_NONE;
  if (alt == GR_NONE) return GR_NONE;
  for (;;) {
    uint8_t as = 0, ae = 0;
    uint32_t s = rx_seq(x, top, &as, &ae);
    if (s == GR_NONE) return GR_NONE;
    x->nodes[s].anch_start = as;
    x->nodes[s].anch_end = ae;
    if (last == GR_NONE)
      x->nodes[alt].child = s;
    else
      x->nodes[last].next = s;
    last = s;
    if (x->pos < x->len && x->p[x->pos] == '|') {
      x->pos++;
      continue;
    }
    break;
  }
  return alt;
}

/* ---- emission -------------------------------------------------------------- */
static void emit_json_cp(struct gr_nfa *n, uint32_t from, uint32_t to, uint32_t c) {
  static const char hex[] = "0123456789abcdef";
  /* the characters with a two-character escape, and the letter after '\\' */
  static const char raw[] = "\"\\\n\t\r\b\f", named[] = "\"\\ntrbf";
  const char *e = c && c < 0x80 ? strchr(raw, (int)c) : NULL;
  if (e) {
    char two[2] = {'\\', named[e - raw]};
    gr_nfa_lit(n, from, to, two, 2);
    return;
  }
  char six[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
  gr_nfa_lit(n, from, to, six, 6);
}

static void emit_set(struct rx *x, uint32_t from, uint32_t to, const struct gr_cpset *s) {
  if (!x->json) {
    gr_nfa_cpset(x->n, from, to, s);
    return;
  }
  for (uint32_t i = 0; i < s->n; i++) {
    uint32_t lo = s->r[2 * i], hi = s->r[2 * i + 1];
    /* the code points JSON must escape go as escapes; the rest as they are */
    for (uint32_t c = lo; c <= hi && c < 0x20; c++)
      emit_json_cp(x->n, from, to, c);
    if (lo <= '"' && hi >= '"') emit_json_cp(x->n, from, to, '"');
    if (lo <= '\\' && hi >= '\\') emit_json_cp(x->n, from, to, '\\');
    static const uint32_t seg[3][2] = {{0x20, 0x21}, {0x23, 0x5b}, {0x5d, 0x10ffff}};
    for (int k = 0; k < 3; k++) {
      uint32_t a = lo > seg[k][0] ? lo : seg[k][0], b = hi < seg[k][1] ? hi : seg[k][1];
      if (a <= b) gr_nfa_cps(x->n, from, to, a, b);
    }
  }
  if (s->oom) gr_nfa_fail(x->n, CM_ERR_NOMEM, "%s: out of memory", x->what);
}

static void emit(struct rx *x, uint32_t id, uint32_t from, uint32_t to) {
  struct gr_nfa *n = x->n;
  if (n->rc) return;
  const struct rx_node *nd = &x->nodes[id];
  switch (nd->kind) {
  case RX_SET: emit_set(x, from, to, &nd->set); break;
  case RX_CAT: {
    uint32_t cur = from;
    for (uint32_t c = nd->child; c != GR_NONE; c = x->nodes[c].next) {
      uint32_t nx = x->nodes[c].next == GR_NONE ? to : gr_nfa_state(n);
      emit(x, c, cur, nx);
      cur = nx;
    }
    if (nd->child == GR_NONE) gr_nfa_eps(n, from, to);
    break;
  }
  case RX_ALT:
    for (uint32_t c = nd->child; c != GR_NONE; c = x->nodes[c].next)
      emit(x, c, from, to);
    break;
  case RX_REP: {
    uint32_t cur = from;
    for (uint32_t i = 0; i < nd->min && !n->rc; i++) {
      uint32_t nx = gr_nfa_state(n);
      emit(x, nd->child, cur, nx);
      cur = nx;
    }
    if (nd->max == RX_INF) {
      uint32_t a = gr_nfa_state(n), b = gr_nfa_state(n);
      gr_nfa_eps(n, cur, a);
      emit(x, nd->child, a, b);
      gr_nfa_eps(n, b, a);
      gr_nfa_eps(n, a, to);
    } else {
      for (uint32_t i = nd->min; i < nd->max && !n->rc; i++) {
        uint32_t nx = gr_nfa_state(n);
        gr_nfa_eps(n, cur, to);
        emit(x, nd->child, cur, nx);
        cur = nx;
      }
      gr_nfa_eps(n, cur, to);
    }
    break;
  }
  }
}

/* Any text: for SEARCH mode's unanchored ends. */
static void emit_any(struct rx *x, uint32_t from, uint32_t to) {
  uint32_t a = gr_nfa_state(x->n);
  gr_nfa_eps(x->n, from, a);
  gr_nfa_eps(x->n, a, to);
  if (x->json) {
    gr_json_char(x->n, a, a);
  } else {
    gr_nfa_cps(x->n, a, a, 0, 0x10ffff);
  }
}

void gr_regex_emit(struct gr_nfa *n, const char *pat, size_t len, int mode, int json, uint32_t from,
                   uint32_t to, const char *what) {
  struct rx x = {.n = n, .p = pat, .len = len, .what = what, .json = json};
  if (n->rc) return;
  uint32_t root = rx_alt(&x, 1);
  if (root != GR_NONE && x.pos < x.len) rx_fail(&x, CM_ERR_INVAL, "unbalanced ')'", x.pos);
  if (!n->rc) {
    for (uint32_t b = x.nodes[root].child; b != GR_NONE; b = x.nodes[b].next) {
      const struct rx_node *br = &x.nodes[b];
      uint32_t s = from, e = to;
      if (mode == GR_RX_SEARCH && !br->anch_start) {
        s = gr_nfa_state(n);
        emit_any(&x, from, s);
      }
      if (mode == GR_RX_SEARCH && !br->anch_end) {
        e = gr_nfa_state(n);
        emit_any(&x, e, to);
      }
      emit(&x, b, s, e);
    }
  }
  for (uint32_t i = 0; i < x.n_nodes; i++)
    gr_cpset_free(&x.nodes[i].set);
  free(x.nodes);
}
