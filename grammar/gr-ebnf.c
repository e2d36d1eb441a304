/* gr-ebnf.c — EBNF grammars in llama.cpp's GBNF notation (what vLLM's
 * structured_outputs "grammar" takes): rules `name ::= alternatives`, string
 * literals, character classes, rule references, groups, `* + ?` and `{m,n}`,
 * `#` comments; the start rule is `root`. `<[N]>` is special token N (llguidance's
 * notation; gr.h's GR_TOKEN_BYTE says how it is spelled in bytes). Each rule becomes a rule of the
 * automaton (references are calls, so recursion works); literals and classes
 * are emitted as regex pieces. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-hex.h"
#include "grammar/gr-impl.h"

#define EB_MAX_NAMES 1024
#define EB_NESTED    100

struct eb_name {
  const char *s;
  size_t len;
  uint32_t rule;
  int defined;
  size_t at; /* where it was first used (for errors) */
};

struct eb {
  struct gr_nfa *n;
  const char *p;
  size_t len, pos;
  struct eb_name names[EB_MAX_NAMES];
  uint32_t n_names;
  int depth;
};

static int eb_fail(struct eb *e, const char *msg, size_t at) {
  return gr_nfa_fail(e->n, CM_ERR_INVAL, "grammar: %s at %zu", msg, at);
}

static int is_name(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

/* Skips spaces, tabs and comments; newlines too when nl. */
static void skip(struct eb *e, int nl) {
  while (e->pos < e->len) {
    char c = e->p[e->pos];
    if (c == ' ' || c == '\t' || (nl && (c == '\n' || c == '\r'))) {
      e->pos++;
    } else if (c == '#') {
      while (e->pos < e->len && e->p[e->pos] != '\n')
        e->pos++;
    } else {
      break;
    }
  }
}

static uint32_t name_rule(struct eb *e, const char *s, size_t len, size_t at) {
  for (uint32_t i = 0; i < e->n_names; i++)
    if (e->names[i].len == len && memcmp(e->names[i].s, s, len) == 0) return i;
  if (e->n_names >= EB_MAX_NAMES) {
    gr_nfa_fail(e->n, CM_ERR_TOOBIG, "grammar: more than %d rules", EB_MAX_NAMES);
    return GR_NONE;
  }
  struct eb_name *nm = &e->names[e->n_names];
  nm->s = s;
  nm->len = len;
  nm->rule = gr_nfa_rule(e->n);
  nm->defined = 0;
  nm->at = at;
  return e->n_names++;
}

/* A rule body's continuation ends at the end of the text or where the next
 * line starts a new rule (`name ::=`). */
static int at_rule_start(struct eb *e) {
  size_t i = e->pos;
  while (i < e->len && is_name(e->p[i]))
    i++;
  if (i == e->pos) return 0;
  while (i < e->len && (e->p[i] == ' ' || e->p[i] == '\t'))
    i++;
  return i + 3 <= e->len && memcmp(e->p + i, "::=", 3) == 0;
}

/* A string literal "..." emitted from -> to. */
static void literal(struct eb *e, uint32_t from, uint32_t to) {
  size_t at = e->pos++;
  char *buf = malloc(e->len - e->pos + 1);
  size_t k = 0;
  if (!buf) {
    gr_nfa_fail(e->n, CM_ERR_NOMEM, "grammar: out of memory");
    return;
  }
  for (;;) {
    if (e->pos >= e->len || e->p[e->pos] == '\n') {
      eb_fail(e, "unterminated string", at);
      break;
    }
    char c = e->p[e->pos++];
    if (c == '"') {
      gr_nfa_lit(e->n, from, to, buf, k);
      break;
    }
    if (c != '\\') {
      buf[k++] = c;
      continue;
    }
    if (e->pos >= e->len) continue;
    char x = e->p[e->pos++];
    unsigned v = 0;
    int nd = x == 'x' ? 2 : x == 'u' ? 4 : x == 'U' ? 8 : 0;
    if (nd) {
      for (int i = 0; i < nd; i++) {
        char h = e->pos < e->len ? e->p[e->pos] : 0;
        int d = cm_hex_digit(h);
        if (d < 0) {
          eb_fail(e, "invalid escape in string", e->pos);
          free(buf);
          return;
        }
        v = v * 16 + (unsigned)d;
        e->pos++;
      }
      if (v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) {
        eb_fail(e, "invalid code point in string", e->pos);
        free(buf);
        return;
      }
      /* UTF-8 */
      if (v < 0x80)
        buf[k++] = (char)v;
      else if (v < 0x800)
        buf[k++] = (char)(0xc0 | v >> 6), buf[k++] = (char)(0x80 | (v & 0x3f));
      else if (v < 0x10000)
        buf[k++] = (char)(0xe0 | v >> 12), buf[k++] = (char)(0x80 | ((v >> 6) & 0x3f)),
        buf[k++] = (char)(0x80 | (v & 0x3f));
      else
        buf[k++] = (char)(0xf0 | v >> 18), buf[k++] = (char)(0x80 | ((v >> 12) & 0x3f)),
        buf[k++] = (char)(0x80 | ((v >> 6) & 0x3f)), buf[k++] = (char)(0x80 | (v & 0x3f));
      continue;
    }
    /* the letters of the one-character escapes, and what each stands for */
    static const char named[] = "ntr\\\"[]", raw[] = "\n\t\r\\\"[]";
    const char *q = x ? strchr(named, x) : NULL;
    if (!q) {
      eb_fail(e, "invalid escape in string", e->pos - 2);
      free(buf);
      return;
    }
    buf[k++] = raw[q - named];
  }
  free(buf);
}

static void alternatives(struct eb *e, uint32_t from, uint32_t to);

/* One item (literal, class, reference, group, '.') from -> to. It may be
 * emitted several times (quantifiers): so items are re-parsed from `start`. */
static void item(struct eb *e, uint32_t from, uint32_t to) {
  size_t at = e->pos;
  char c = e->p[e->pos];
  if (c == '"') {
    literal(e, from, to);
  } else if (c == '[') {
    size_t i = e->pos + 1;
    if (i < e->len && e->p[i] == '^') i++;
    if (i < e->len && e->p[i] == ']') i++;
    while (i < e->len && e->p[i] != ']' && e->p[i] != '\n')
      i += e->p[i] == '\\' ? 2 : 1;
    if (i >= e->len || e->p[i] != ']') {
      eb_fail(e, "unterminated character class", at);
      return;
    }
    gr_regex_emit(e->n, e->p + e->pos, i + 1 - e->pos, GR_RX_FULL, 0, from, to, "grammar");
    e->pos = i + 1;
  } else if (c == '.') {
    e->pos++;
    gr_nfa_cps(e->n, from, to, 0, 0x10ffff);
  } else if (c == '<' && e->pos + 1 < e->len && e->p[e->pos + 1] == '[') {
    uint64_t id = 0;
    size_t i = e->pos + 2, d = i;
    while (i < e->len && e->p[i] >= '0' && e->p[i] <= '9' && i - d < 9)
      id = id * 10 + (uint64_t)(e->p[i++] - '0');
    if (i == d || i + 2 > e->len || memcmp(e->p + i, "]>", 2) != 0 || id > GR_TOKEN_MAX) {
      eb_fail(e, "a token is <[N]> with N a token id below 2^24", at);
      return;
    }
    uint8_t b[GR_TOKEN_LEN];
    gr_token_bytes((int32_t)id, b);
    gr_nfa_lit(e->n, from, to, (const char *)b, sizeof(b));
    e->pos = i + 2;
  } else if (c == '(') {
    e->pos++;
    if (++e->depth > EB_NESTED) {
      gr_nfa_fail(e->n, CM_ERR_TOOBIG, "grammar: groups nested deeper than %d at %zu", EB_NESTED,
                  at);
      return;
    }
    alternatives(e, from, to);
    e->depth--;
    skip(e, 1);
    if (e->pos >= e->len || e->p[e->pos] != ')') {
      eb_fail(e, "unbalanced '('", at);
      return;
    }
    e->pos++;
  } else if (is_name(c)) {
    size_t s = e->pos;
    while (e->pos < e->len && is_name(e->p[e->pos]))
      e->pos++;
    uint32_t id = name_rule(e, e->p + s, e->pos - s, s);
    if (id != GR_NONE) gr_nfa_call(e->n, from, to, e->names[id].rule);
  } else {
    eb_fail(e, "unexpected character", at);
  }
}

/* A sequence of items with their quantifiers, from -> to. */
static void sequence(struct eb *e, uint32_t from, uint32_t to) {
  uint32_t cur = from;
  for (;;) {
    skip(e, 1); /* a rule goes on over lines until the next `name ::=` */
    if (e->pos >= e->len || at_rule_start(e) || e->p[e->pos] == '|' || e->p[e->pos] == ')') break;
    if (e->n->rc) return;
    size_t start = e->pos;
    uint32_t a = gr_nfa_state(e->n);
    item(e, cur, a);
    if (e->n->rc) return;
    /* quantifier */
    uint32_t min = 1, max = 1;
    char q = e->pos < e->len ? e->p[e->pos] : 0;
    if (q == '*' || q == '+' || q == '?') {
      min = q == '+';
      max = q == '?' ? 1 : UINT32_MAX;
      e->pos++;
    } else if (q == '{') {
      unsigned long m1 = 0, m2 = 0;
      int nread = 0;
      char tail[4] = {0}, q2[40];
      size_t ql = 0; /* the text is not NUL-terminated: copy the braces out */
      while (e->pos + ql < e->len && ql < sizeof q2 - 1 && e->p[e->pos + ql] != '}')
        ql++;
      if (e->pos + ql < e->len && ql < sizeof q2 - 1) ql++;
      memcpy(q2, e->p + e->pos, ql);
      q2[ql] = 0;
      if (sscanf(q2, "{%lu,%lu%1[}]%n", &m1, &m2, tail, &nread) == 3 && nread > 0) {
        min = (uint32_t)m1, max = (uint32_t)m2;
      } else if (sscanf(q2, "{%lu,%1[}]%n", &m1, tail, &nread) == 2 && nread > 0) {
        min = (uint32_t)m1, max = UINT32_MAX;
      } else if (sscanf(q2, "{%lu%1[}]%n", &m1, tail, &nread) == 2 && nread > 0) {
        min = max = (uint32_t)m1;
      } else {
        eb_fail(e, "invalid repetition", e->pos);
        return;
      }
      if (m1 > GR_MAX_REPEAT || (max != UINT32_MAX && m2 > GR_MAX_REPEAT)) {
        gr_nfa_fail(e->n, CM_ERR_TOOBIG, "grammar: repetition count above %u at %zu", GR_MAX_REPEAT,
                    e->pos);
        return;
      }
      if (max < min) {
        eb_fail(e, "numbers out of order in {}", e->pos);
        return;
      }
      e->pos += (size_t)nread;
    }
    if (min == 1 && max == 1) {
      cur = a;
      continue;
    }
    /* re-emit the item: the first copy (cur -> a) stands for one occurrence */
    size_t after = e->pos;
    uint32_t end_state = gr_nfa_state(e->n);
    uint32_t done = 1, at_state = a;
    if (min == 0) gr_nfa_eps(e->n, cur, end_state);
    for (; done < min && !e->n->rc; done++) {
      uint32_t nx = gr_nfa_state(e->n);
      e->pos = start;
      item(e, at_state, nx);
      at_state = nx;
    }
    if (max == UINT32_MAX) {
      uint32_t l = gr_nfa_state(e->n);
      e->pos = start;
      item(e, at_state, l);
      gr_nfa_eps(e->n, l, at_state);
      gr_nfa_eps(e->n, at_state, end_state);
    } else {
      for (; done < max && !e->n->rc; done++) {
        uint32_t nx = gr_nfa_state(e->n);
        gr_nfa_eps(e->n, at_state, end_state);
        e->pos = start;
        item(e, at_state, nx);
        at_state = nx;
      }
      gr_nfa_eps(e->n, at_state, end_state);
    }
    e->pos = after;
    cur = end_state;
  }
  gr_nfa_eps(e->n, cur, to);
}

static void alternatives(struct eb *e, uint32_t from, uint32_t to) {
  for (;;) {
    sequence(e, from, to);
    if (e->n->rc) return;
    skip(e, 1);
    if (e->pos < e->len && e->p[e->pos] == '|') {
      e->pos++;
      continue;
    }
    return;
  }
}

int gr_ebnf_build(struct gr_nfa *n, const char *text, size_t len) {
  struct eb *e = calloc(1, sizeof *e);
  if (!e) return gr_nfa_fail(n, CM_ERR_NOMEM, "grammar: out of memory");
  e->n = n;
  e->p = text;
  e->len = len;
  uint32_t root = gr_nfa_rule(n); /* rule 0 calls `root` */
  for (;;) {
    skip(e, 1);
    if (e->pos >= e->len || n->rc) break;
    size_t at = e->pos, s = e->pos;
    while (e->pos < e->len && is_name(e->p[e->pos]))
      e->pos++;
    if (e->pos == s) {
      eb_fail(e, "expected a rule name", at);
      break;
    }
    uint32_t id = name_rule(e, e->p + s, e->pos - s, s);
    if (id == GR_NONE) break;
    skip(e, 0);
    if (e->pos + 3 > e->len || memcmp(e->p + e->pos, "::=", 3) != 0) {
      eb_fail(e, "expected '::='", e->pos);
      break;
    }
    e->pos += 3;
    if (e->names[id].defined) {
      eb_fail(e, "rule defined twice", at);
      break;
    }
    e->names[id].defined = 1;
    uint32_t r = e->names[id].rule;
    alternatives(e, n->rule_start[r], n->rule_final[r]);
    skip(e, 1);
    if (!n->rc && e->pos < e->len && !at_rule_start(e)) eb_fail(e, "unexpected character", e->pos);
  }
  if (!n->rc) {
    uint32_t rid = GR_NONE;
    for (uint32_t i = 0; i < e->n_names; i++) {
      if (!e->names[i].defined) {
        gr_nfa_fail(n, CM_ERR_INVAL, "grammar: rule '%.*s' used at %zu is not defined",
                    (int)(e->names[i].len > 64 ? 64 : e->names[i].len), e->names[i].s,
                    e->names[i].at);
        break;
      }
      if (e->names[i].len == 4 && memcmp(e->names[i].s, "root", 4) == 0) rid = i;
    }
    if (!n->rc && rid == GR_NONE) gr_nfa_fail(n, CM_ERR_INVAL, "grammar: no 'root' rule");
    if (!n->rc) gr_nfa_call(n, n->rule_start[root], n->rule_final[root], e->names[rid].rule);
  }
  free(e);
  return n->rc;
}
