/* gr-json.c — JSON's pieces as NFA fragments (bounded whitespace, strings with
 * escapes and valid UTF-8, numbers, literals, any value through recursive
 * object and array rules), the json_object grammar and the choice grammar. */
#include <jansson.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-hex.h"
#include "grammar/gr-impl.h"

/* Whitespace between tokens: JSON allows any run of space, tab, CR and LF; we
 * allow at most GR_WS_INLINE spaces or tabs, or one line break followed by at
 * most GR_WS_INDENT of them (pretty printing), so that a model cannot run on
 * in whitespace. */
#define GR_WS_INLINE 2
#define GR_WS_INDENT 16

/* At most max spaces or tabs from `from` to `to`. */
static void blanks(struct gr_nfa *n, uint32_t from, uint32_t to, int max) {
  uint32_t cur = from;
  for (int i = 0; i < max; i++) {
    uint32_t nx = gr_nfa_state(n);
    gr_nfa_eps(n, cur, to);
    gr_nfa_byte(n, cur, nx, ' ', ' ');
    gr_nfa_byte(n, cur, nx, '\t', '\t');
    cur = nx;
  }
  gr_nfa_eps(n, cur, to);
}

void gr_json_ws(struct gr_nfa *n, uint32_t from, uint32_t to) {
  blanks(n, from, to, GR_WS_INLINE);
  uint32_t cr = gr_nfa_state(n), nl = gr_nfa_state(n);
  gr_nfa_byte(n, from, cr, '\r', '\r');
  gr_nfa_eps(n, from, cr);
  gr_nfa_byte(n, cr, nl, '\n', '\n');
  blanks(n, nl, to, GR_WS_INDENT);
}

void gr_json_colon(struct gr_nfa *n, uint32_t from, uint32_t to) {
  uint32_t a = gr_nfa_state(n), b = gr_nfa_state(n);
  blanks(n, from, a, GR_WS_INLINE);
  gr_nfa_byte(n, a, b, ':', ':');
  blanks(n, b, to, GR_WS_INLINE);
}

static void hex4(struct gr_nfa *n, uint32_t from, uint32_t to) {
  uint32_t cur = from;
  for (int i = 0; i < 4; i++) {
    uint32_t nx = i == 3 ? to : gr_nfa_state(n);
    gr_nfa_byte(n, cur, nx, '0', '9');
    gr_nfa_byte(n, cur, nx, 'a', 'f');
    gr_nfa_byte(n, cur, nx, 'A', 'F');
    cur = nx;
  }
}

void gr_json_char(struct gr_nfa *n, uint32_t from, uint32_t to) {
  gr_nfa_cps(n, from, to, 0x20, 0x21);
  gr_nfa_cps(n, from, to, 0x23, 0x5b);
  gr_nfa_cps(n, from, to, 0x5d, 0x10ffff);
  uint32_t bs = gr_nfa_state(n), u = gr_nfa_state(n);
  gr_nfa_byte(n, from, bs, '\\', '\\');
  static const char esc[] = "\"\\/bfnrt";
  for (const char *e = esc; *e; e++)
    gr_nfa_byte(n, bs, to, (uint8_t)*e, (uint8_t)*e);
  gr_nfa_byte(n, bs, u, 'u', 'u');
  hex4(n, u, to);
}

void gr_json_string(struct gr_nfa *n, uint32_t from, uint32_t to) {
  uint32_t a = gr_nfa_state(n), b = gr_nfa_state(n);
  gr_nfa_byte(n, from, a, '"', '"');
  gr_json_char(n, a, a);
  gr_nfa_eps(n, a, b);
  gr_nfa_byte(n, b, to, '"', '"');
}

static void digits(struct gr_nfa *n, uint32_t from, uint32_t to) { /* [0-9]+ */
  gr_nfa_byte(n, from, to, '0', '9');
  gr_nfa_byte(n, to, to, '0', '9');
}

void gr_json_integer(struct gr_nfa *n, uint32_t from, uint32_t to) {
  uint32_t a = gr_nfa_state(n), b = gr_nfa_state(n);
  gr_nfa_eps(n, from, a);
  gr_nfa_byte(n, from, a, '-', '-');
  gr_nfa_byte(n, a, to, '0', '0');
  gr_nfa_byte(n, a, b, '1', '9');
  gr_nfa_eps(n, b, to);
  gr_nfa_byte(n, b, b, '0', '9');
}

void gr_json_number(struct gr_nfa *n, uint32_t from, uint32_t to) {
  uint32_t i = gr_nfa_state(n), f = gr_nfa_state(n), f1 = gr_nfa_state(n), f2 = gr_nfa_state(n);
  gr_json_integer(n, from, i);
  gr_nfa_eps(n, i, f);
  gr_nfa_byte(n, i, f1, '.', '.');
  digits(n, f1, f2);
  gr_nfa_eps(n, f2, f);
  uint32_t e1 = gr_nfa_state(n), e2 = gr_nfa_state(n), e3 = gr_nfa_state(n);
  gr_nfa_eps(n, f, to);
  gr_nfa_byte(n, f, e1, 'e', 'e');
  gr_nfa_byte(n, f, e1, 'E', 'E');
  gr_nfa_eps(n, e1, e2);
  gr_nfa_byte(n, e1, e2, '+', '+');
  gr_nfa_byte(n, e1, e2, '-', '-');
  digits(n, e2, e3);
  gr_nfa_eps(n, e3, to);
}

void gr_json_lit_string(struct gr_nfa *n, uint32_t from, uint32_t to, const char *s, size_t len) {
  json_t *j = json_stringn(s, len);
  char *t = j ? json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
  if (!t)
    gr_nfa_fail(n, CM_ERR_NOMEM, "grammar: out of memory");
  else
    gr_nfa_lit(n, from, to, t, strlen(t));
  free(t);
  json_decref(j);
}

/* ---- a string that is none of some names ---------------------------------- */
/* The DFA of a string's contents after its opening quote: 0 at a character
 * boundary; 1-3 continuation bytes left; 4 after E0, 5 after ED, 6 after F0,
 * 7 after F4; 8 after a backslash; 9-12 hex digits of \u left (4..1); 13 the
 * closing quote. */
enum { SX_END = 13, SX_N = 14 };

int gr_json_sx_step(int a, uint8_t b) {
  switch (a) {
  case 0:
    if (b == '"') return SX_END;
    if (b == '\\') return 8;
    break;
  case 8: return strchr("\"\\/bfnrt", b) && b ? 0 : b == 'u' ? 9 : -1;
  case 9:
  case 10:
  case 11: return cm_hex_digit(b) >= 0 ? a + 1 : -1;
  case 12: return cm_hex_digit(b) >= 0 ? 0 : -1;
  }
  return gr_u8_step(a, b); /* states 0-7 are those of plain text's UTF-8 */
}

struct sx_trie {
  uint32_t *child; /* (n, 256) or GR_NONE */
  uint8_t *term;   /* (n) */
  uint32_t n, cap;
};

static uint32_t sx_node(struct sx_trie *t) {
  if (t->n == t->cap) {
    uint32_t cap = t->cap ? t->cap * 2 : 16;
    uint32_t *c = realloc(t->child, (size_t)cap * 256 * sizeof *c);
    if (!c) return GR_NONE;
    t->child = c;
    uint8_t *m = realloc(t->term, cap);
    if (!m) return GR_NONE;
    t->term = m;
    t->cap = cap;
  }
  for (int b = 0; b < 256; b++)
    t->child[(size_t)t->n * 256 + (size_t)b] = GR_NONE;
  t->term[t->n] = 0;
  return t->n++;
}

void gr_json_string_except(struct gr_nfa *n, uint32_t from, uint32_t to, const char *const *names,
                           size_t count) {
  if (count == 0) {
    gr_json_string(n, from, to);
    return;
  }
  struct sx_trie t = {0};
  uint32_t *map = NULL;
  if (sx_node(&t) == GR_NONE) goto nomem;
  for (size_t i = 0; i < count; i++) {
    json_t *j = json_string(names[i]);
    char *e = j ? json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    json_decref(j);
    if (!e) goto nomem;
    uint32_t cur = 0;
    size_t len = strlen(e);
    for (size_t k = 1; k + 1 < len; k++) { /* the contents, between the quotes */
      uint8_t b = (uint8_t)e[k];
      uint32_t nx = t.child[(size_t)cur * 256 + b];
      if (nx == GR_NONE) {
        nx = sx_node(&t);
        if (nx == GR_NONE) {
          free(e);
          goto nomem;
        }
        t.child[(size_t)cur * 256 + b] = nx;
      }
      cur = nx;
    }
    t.term[cur] = 1;
    free(e);
  }
  /* the product of the contents' DFA and the trie (node t.n: off the trie) */
  size_t np = (size_t)SX_N * (t.n + 1);
  map = malloc(np * sizeof *map);
  if (!map) goto nomem;
  for (size_t i = 0; i < np; i++)
    map[i] = GR_NONE;
  uint32_t *queue = malloc(np * sizeof *queue);
  if (!queue) goto nomem;
  size_t qh = 0, qt = 0;
  uint32_t open = gr_nfa_state(n);
  gr_nfa_byte(n, from, open, '"', '"');
  map[0] = open; /* (state 0, trie root 0) */
  queue[qt++] = 0;
  while (qh < qt && !n->rc) {
    uint32_t key = queue[qh++];
    int a = (int)(key % SX_N);
    uint32_t node = key / SX_N, src = map[key];
    uint32_t run_lo = 0, run_to = GR_NONE;
    for (uint32_t b = 0; b <= 256; b++) {
      uint32_t target = GR_NONE;
      if (b < 256) {
        int a2 = gr_json_sx_step(a, (uint8_t)b);
        if (a2 == SX_END) {
          if (node == t.n || !t.term[node]) target = to;
        } else if (a2 >= 0) {
          uint32_t n2 = node == t.n ? t.n : t.child[(size_t)node * 256 + b];
          if (n2 == GR_NONE) n2 = t.n;
          uint32_t k2 = n2 * SX_N + (uint32_t)a2;
          if (map[k2] == GR_NONE) {
            map[k2] = gr_nfa_state(n);
            queue[qt++] = k2;
          }
          target = map[k2];
        }
      }
      if (target != run_to || b == 256) {
        if (run_to != GR_NONE) gr_nfa_byte(n, src, run_to, (uint8_t)run_lo, (uint8_t)(b - 1));
        run_to = target;
        run_lo = b;
      }
    }
  }
  free(queue);
  free(map);
  free(t.child);
  free(t.term);
  return;
nomem:
  free(map);
  free(t.child);
  free(t.term);
  gr_nfa_fail(n, CM_ERR_NOMEM, "grammar: out of memory");
}

/* Any value from -> to: strings, numbers and literals inline, objects and
 * arrays through their rules. */
static void any_value(struct gr_nfa *n, uint32_t from, uint32_t to) {
  gr_nfa_call(n, from, to, n->any_obj);
  gr_nfa_call(n, from, to, n->any_arr);
  gr_json_string(n, from, to);
  gr_json_number(n, from, to);
  gr_nfa_lit(n, from, to, "true", 4);
  gr_nfa_lit(n, from, to, "false", 5);
  gr_nfa_lit(n, from, to, "null", 4);
}

/* An object's member: "key" : value (any value). */
static void any_member(struct gr_nfa *n, uint32_t from, uint32_t to) {
  uint32_t k = gr_nfa_state(n), v = gr_nfa_state(n);
  gr_json_string(n, from, k);
  gr_json_colon(n, k, v);
  any_value(n, v, to);
}

/* Rule r's body, an object or an array: open, then close or elements
 * separated by commas, then close; whitespace around every element. */
static void any_container(struct gr_nfa *n, uint32_t r, uint8_t open, uint8_t close,
                          void (*elem)(struct gr_nfa *n, uint32_t from, uint32_t to)) {
  uint32_t s = n->rule_start[r], f = n->rule_final[r];
  uint32_t a = gr_nfa_state(n), b = gr_nfa_state(n), c = gr_nfa_state(n), d = gr_nfa_state(n),
           e = gr_nfa_state(n), g = gr_nfa_state(n), m = gr_nfa_state(n);
  gr_nfa_byte(n, s, a, open, open);
  gr_json_ws(n, a, b);
  gr_nfa_byte(n, b, f, close, close); /* empty: closed at once */
  gr_nfa_eps(n, b, m);                /* the first element and (from g) the others: */
  elem(n, m, c);                      /* one copy of the element's automaton */
  gr_json_ws(n, c, d);
  gr_nfa_byte(n, d, f, close, close);
  gr_nfa_byte(n, d, e, ',', ',');
  gr_json_ws(n, e, g);
  gr_nfa_eps(n, g, m);
}

static void make_any_rules(struct gr_nfa *n) {
  if (n->any_obj != GR_NONE || n->rc) return;
  n->any_obj = gr_nfa_rule(n);
  n->any_arr = gr_nfa_rule(n);
  if (n->rc) return;
  any_container(n, n->any_obj, '{', '}', any_member);
  any_container(n, n->any_arr, '[', ']', any_value);
}

uint32_t gr_json_value_rule(struct gr_nfa *n, uint32_t *rule) {
  make_any_rules(n);
  if (n->any_val == GR_NONE && !n->rc) {
    n->any_val = gr_nfa_rule(n);
    any_value(n, n->rule_start[n->any_val], n->rule_final[n->any_val]);
  }
  if (rule) *rule = n->any_val;
  return n->any_val;
}

int gr_json_object_build(struct gr_nfa *n) {
  uint32_t root = gr_nfa_rule(n);
  make_any_rules(n);
  if (n->rc) return n->rc;
  /* the root is an object's rule body: the same language as any_obj's */
  gr_nfa_call(n, n->rule_start[root], n->rule_final[root], n->any_obj);
  return n->rc;
}

int gr_choice_build(struct gr_nfa *n, const char *text, size_t len) {
  json_error_t je;
  json_t *j = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
  if (!j)
    return gr_nfa_fail(n, CM_ERR_INVAL, "choice: invalid JSON at %d: %s", je.position, je.text);
  int rc = 0;
  if (!json_is_array(j) || json_array_size(j) == 0) {
    rc = gr_nfa_fail(n, CM_ERR_INVAL, "choice: must be a non-empty JSON array of strings");
    goto done;
  }
  uint32_t root = gr_nfa_rule(n);
  size_t i;
  json_t *v;
  json_array_foreach(j, i, v) {
    if (!json_is_string(v)) {
      rc = gr_nfa_fail(n, CM_ERR_INVAL, "choice: item %zu is not a string", i);
      goto done;
    }
    gr_nfa_lit(n, n->rule_start[root], n->rule_final[root], json_string_value(v),
               json_string_length(v));
  }
  rc = n->rc;
done:
  json_decref(j);
  return rc;
}
