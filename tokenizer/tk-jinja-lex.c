/* tk-jinja-lex.c — the Jinja lexer: template text and tags to tokens.
 *
 * Whitespace rules, as Hugging Face compiles chat templates
 * (trim_blocks=True, lstrip_blocks=True):
 *   {%- / {{- / {#-   strip all whitespace before the tag
 *   -%} / -}} / -#}   strip all whitespace after the tag
 *   lstrip_blocks     spaces and tabs between a line start and {% or {#
 *                     are removed ({%+ keeps them)
 *   trim_blocks       one newline right after %} or #} is removed
 *   a single newline at the very end of the template is dropped
 *   (keep_trailing_newline=False, Jinja's default) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "tokenizer/tk-jinja-impl.h"

struct lx {
  const char *src, *p, *end;
  int line;
  struct cm_arena *arena;
  struct tk_jk_token *toks;
  size_t n, cap;
  char *err;
  size_t errlen;
};

static int lx_err(struct lx *l, const char *what) {
  if (l->err && l->errlen) snprintf(l->err, l->errlen, "template line %d: %s", l->line, what);
  return CM_ERR_PARSE;
}

static int lx_push(struct lx *l, struct tk_jk_token t) {
  if (l->n == l->cap) {
    size_t nc = l->cap ? l->cap * 2 : 256;
    struct tk_jk_token *nt = cm_arena_alloc(l->arena, nc * sizeof *nt);
    if (!nt) return CM_ERR_NOMEM;
    if (l->n) memcpy(nt, l->toks, l->n * sizeof *nt);
    l->toks = nt;
    l->cap = nc;
  }
  t.line = l->line;
  l->toks[l->n++] = t;
  return 0;
}

static int is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
static int is_ident(char c, int first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         (!first && c >= '0' && c <= '9');
}

static void count_lines(struct lx *l, const char *from, const char *to) {
  for (const char *q = from; q < to; q++) l->line += *q == '\n';
}

/* The previous token if it is text (for stripping before a tag). */
static struct tk_jk_token *prev_text(struct lx *l) {
  return l->n && l->toks[l->n - 1].kind == JK_TEXT ? &l->toks[l->n - 1] : NULL;
}

static int lx_string(struct lx *l) {
  char q = *l->p++;
  const char *start = l->p;
  while (l->p < l->end && *l->p != q) {
    if (*l->p == '\\') l->p++;
    l->p++;
  }
  if (l->p >= l->end) return lx_err(l, "unterminated string");
  size_t raw = (size_t)(l->p - start);
  char *o = cm_arena_alloc(l->arena, raw + 1);
  if (!o) return CM_ERR_NOMEM;
  size_t n = 0;
  for (const char *s = start; s < l->p; s++) {
    if (*s != '\\') {
      o[n++] = *s;
      continue;
    }
    s++;
    switch (*s) {
    case 'n': o[n++] = '\n'; break;
    case 't': o[n++] = '\t'; break;
    case 'r': o[n++] = '\r'; break;
    case '\\': o[n++] = '\\'; break;
    case '\'': o[n++] = '\''; break;
    case '"': o[n++] = '"'; break;
    default: o[n++] = '\\'; o[n++] = *s; break;
    }
  }
  o[n] = 0;
  count_lines(l, start, l->p);
  l->p++;
  return lx_push(l, (struct tk_jk_token){.kind = JK_STRING, .s = o, .n = n});
}

static int lx_number(struct lx *l) {
  const char *s = l->p;
  while (l->p < l->end && *l->p >= '0' && *l->p <= '9') l->p++;
  int is_float = 0;
  if (l->p + 1 < l->end && *l->p == '.' && l->p[1] >= '0' && l->p[1] <= '9') {
    is_float = 1;
    l->p++;
    while (l->p < l->end && *l->p >= '0' && *l->p <= '9') l->p++;
  }
  if (l->p < l->end && (*l->p == 'e' || *l->p == 'E')) {
    const char *q = l->p + 1;
    if (q < l->end && (*q == '+' || *q == '-')) q++;
    if (q < l->end && *q >= '0' && *q <= '9') {
      is_float = 1;
      while (q < l->end && *q >= '0' && *q <= '9') q++;
      l->p = q;
    }
  }
  char buf[64];
  size_t n = (size_t)(l->p - s);
  if (n >= sizeof buf) return lx_err(l, "number too long");
  memcpy(buf, s, n);
  buf[n] = 0;
  struct tk_jk_token t = {.kind = is_float ? JK_FLOAT : JK_INT};
  if (is_float) t.f = strtod(buf, NULL);
  else t.i = strtoll(buf, NULL, 10);
  return lx_push(l, t);
}

/* Lexes the inside of a {{ }} or {% %} tag up to and including its end. */
static int lx_tag(struct lx *l, char closer, int *strip_after) {
  int depth = 0, rc;
  for (;;) {
    while (l->p < l->end && is_space(*l->p)) l->line += *l->p++ == '\n';
    if (l->p >= l->end) return lx_err(l, "unterminated tag");
    char c = *l->p;
    /* the end of the tag: [-]%} or [-]}} (only outside brackets) */
    if (depth == 0) {
      int dash = c == '-' && l->end - l->p >= 3 && l->p[1] == closer && l->p[2] == '}';
      if (dash || (c == closer && l->end - l->p >= 2 && l->p[1] == '}')) {
        l->p += dash ? 3 : 2;
        *strip_after = dash;
        return lx_push(l, (struct tk_jk_token){.kind = closer == '%' ? JK_STMT_END : JK_EXPR_END});
      }
    }
    if (c == '\'' || c == '"') {
      if ((rc = lx_string(l))) return rc;
    } else if (c >= '0' && c <= '9') {
      if ((rc = lx_number(l))) return rc;
    } else if (is_ident(c, 1)) {
      const char *s = l->p;
      while (l->p < l->end && is_ident(*l->p, 0)) l->p++;
      if ((rc = lx_push(l, (struct tk_jk_token){.kind = JK_NAME, .s = s, .n = (size_t)(l->p - s)})))
        return rc;
    } else {
      static const char *const two[] = {"==", "!=", "<=", ">=", "//", "**"};
      size_t n = 0;
      for (size_t k = 0; k < sizeof two / sizeof two[0]; k++)
        if (l->end - l->p >= 2 && !memcmp(l->p, two[k], 2)) n = 2;
      if (!n && strchr("+-*/%~<>=()[]{},.:|", c)) n = 1;
      if (!n) return lx_err(l, "unexpected character in a tag");
      if (c == '(' || c == '[' || c == '{') depth++;
      if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
      if ((rc = lx_push(l, (struct tk_jk_token){.kind = JK_OP, .s = l->p, .n = n}))) return rc;
      l->p += n;
    }
  }
}

int tk_jk_lex(const char *src, size_t len, struct cm_arena *arena, struct tk_jk_token **toks,
           size_t *n_toks, char *err, size_t errlen) {
  struct lx l = {.src = src, .p = src, .end = src + len, .line = 1, .arena = arena,
                 .err = err, .errlen = errlen};
  int strip_next = 0, rc;
  /* keep_trailing_newline=False: one final newline is not output */
  if (len && src[len - 1] == '\n') l.end--;
  while (l.p < l.end) {
    /* text up to the next tag */
    const char *t = l.p;
    while (t < l.end && !(t[0] == '{' && t + 1 < l.end && (t[1] == '{' || t[1] == '%' ||
                                                           t[1] == '#')))
      t++;
    const char *ts = l.p, *te = t;
    if (strip_next)
      while (ts < te && is_space(*ts)) ts++;
    strip_next = 0;
    if (ts < te && (rc = lx_push(&l, (struct tk_jk_token){.kind = JK_TEXT, .s = ts,
                                                         .n = (size_t)(te - ts)})))
      return rc;
    count_lines(&l, l.p, t);
    l.p = t;
    if (t >= l.end) break;
    char kind = t[1];
    l.p = t + 2;
    struct tk_jk_token *pt = prev_text(&l);
    if (l.p < l.end && *l.p == '-') {
      l.p++;
      if (pt) {
        while (pt->n && is_space(pt->s[pt->n - 1])) pt->n--;
        if (!pt->n) l.n--;
      }
    } else if (l.p < l.end && *l.p == '+') {
      l.p++;
    } else if (kind != '{' && pt) {
      /* lstrip_blocks: only spaces / tabs back to a line start */
      const char *q = t;
      while (q > src && (q[-1] == ' ' || q[-1] == '\t')) q--;
      if (q == src || q[-1] == '\n') {
        const char *cut = q > pt->s ? q : pt->s;
        if (pt->s + pt->n == t) pt->n = (size_t)(cut - pt->s);
        if (!pt->n) l.n--;
      }
    }
    int strip_after = 0;
    if (kind == '#') {
      const char *e = l.p;
      while (e + 1 < l.end && !(e[0] == '#' && e[1] == '}')) e++;
      if (e + 1 >= l.end) return lx_err(&l, "unterminated comment");
      strip_after = e > l.p && e[-1] == '-';
      count_lines(&l, l.p, e);
      l.p = e + 2;
    } else {
      if ((rc = lx_push(&l, (struct tk_jk_token){.kind = kind == '%' ? JK_STMT_BEGIN
                                                                  : JK_EXPR_BEGIN})))
        return rc;
      if ((rc = lx_tag(&l, kind == '%' ? '%' : '}', &strip_after))) return rc;
    }
    if (strip_after) strip_next = 1;
    else if (kind != '{' && l.p < l.end && *l.p == '\n') { /* trim_blocks */
      l.p++;
      l.line++;
    }
  }
  if ((rc = lx_push(&l, (struct tk_jk_token){.kind = JK_EOF}))) return rc;
  *toks = l.toks;
  *n_toks = l.n;
  return 0;
}
