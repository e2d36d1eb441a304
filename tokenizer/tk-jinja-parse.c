/* tk-jinja-parse.c — the Jinja parser: tokens to a syntax tree, checking
 * every statement, filter, test, method and global name against what the
 * evaluator implements, so an unsupported template fails at load time.
 *
 * Node layout by kind (struct tk_jk_node):
 *   BLOCK items | TEXT s,n | OUT a | IF a=cond b=then c=else | FOR s=var
 *   s2=second var (or NULL) a=iterable b=body c=else d=filter | SET s=name
 *   s2=attribute (ns.attr) a=value or b=body | MACRO s=name items=parameter
 *   NAMEs (each a=default or NULL) b=body | LIST items | DICT items as
 *   key,value pairs | NAME s | ATTR a.s | INDEX a[b] | SLICE a[b:c:d] |
 *   CALL a(items, kw) fn=global or method | FILTER a|s(items, kw) fn |
 *   TEST a is [not (i=1)] s(items) fn | NOT/NEG/POS a | BIN a s b |
 *   COND a if b else c
 * Precedence follows Jinja: if-else < or < and < not < comparisons < + - <
 * ~ < * / // % < unary - + < postfix (. [] () | is). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "tokenizer/tk-jinja-impl.h"

static const char *const filter_names[JF__N] = {
    "trim", "length", "count", "upper", "lower", "capitalize", "title", "first", "last", "join",
    "default", "d", "tojson", "string", "int", "float", "list", "replace", "safe", "reverse",
    "abs", "items", "dictsort", "map", "select", "reject", "selectattr", "rejectattr"};
static const char *const test_names[JT__N] = {
    "defined", "undefined", "none", "string", "number", "integer", "float", "boolean",
    "iterable", "mapping", "sequence", "true", "false", "even", "odd", "divisibleby", "eq",
    "equalto", "==", "ne", "!="};
static const char *const method_names[JM__N] = {
    "strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper", "lower", "title",
    "capitalize", "replace", "items", "keys", "values", "get"};
static const char *const global_names[JG__N] = {"raise_exception", "namespace", "range"};

static int find_name(const char *const *names, int n, const char *s, size_t len) {
  for (int i = 0; i < n; i++)
    if (strlen(names[i]) == len && !memcmp(names[i], s, len)) return i;
  return -1;
}
int tk_jk_filter_id(const char *s, size_t n) { return find_name(filter_names, JF__N, s, n); }
int tk_jk_test_id(const char *s, size_t n) { return find_name(test_names, JT__N, s, n); }
int tk_jk_method_id(const char *s, size_t n) { return find_name(method_names, JM__N, s, n); }
int tk_jk_global_id(const char *s, size_t n) { return find_name(global_names, JG__N, s, n); }

struct ps {
  struct tk_jk_token *t;
  size_t n, pos;
  struct cm_arena *arena;
  char *err;
  size_t errlen;
  int depth;
  int loops; /* enclosing for loops (break / continue need one) */
  struct tk_jk_node *calls;  /* items: calls of names that are not globals */
  struct tk_jk_node *macros; /* items: the JN_MACRO nodes */
};

__attribute__((format(printf, 2, 3))) static int ps_err(struct ps *p, const char *fmt, ...) {
  if (p->err && p->errlen) {
    int k = snprintf(p->err, p->errlen, "template line %d: ", p->t[p->pos].line);
    va_list ap;
    va_start(ap, fmt);
    if (k > 0 && (size_t)k < p->errlen) vsnprintf(p->err + k, p->errlen - (size_t)k, fmt, ap);
    va_end(ap);
  }
  return CM_ERR_PARSE;
}

static struct tk_jk_token *cur(struct ps *p) { return &p->t[p->pos]; }
static int is_op(struct ps *p, const char *op) {
  struct tk_jk_token *t = cur(p);
  return t->kind == JK_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n);
}
static int is_name(struct ps *p, const char *name) {
  struct tk_jk_token *t = cur(p);
  return t->kind == JK_NAME && t->n == strlen(name) && !memcmp(t->s, name, t->n);
}
static int is_name_at(struct ps *p, size_t off, const char *name) {
  if (p->pos + off >= p->n) return 0;
  struct tk_jk_token *t = &p->t[p->pos + off];
  return t->kind == JK_NAME && t->n == strlen(name) && !memcmp(t->s, name, t->n);
}
static int accept_op(struct ps *p, const char *op) {
  if (!is_op(p, op)) return 0;
  p->pos++;
  return 1;
}
static int accept_name(struct ps *p, const char *name) {
  if (!is_name(p, name)) return 0;
  p->pos++;
  return 1;
}

static struct tk_jk_node *node(struct ps *p, enum tk_jk_node_kind kind) {
  struct tk_jk_node *nd = cm_arena_calloc(p->arena, 1, sizeof *nd);
  if (nd) {
    nd->kind = kind;
    nd->line = cur(p)->line;
  }
  return nd;
}

static int add_item(struct ps *p, struct tk_jk_node *nd, struct tk_jk_node *it) {
  /* grow by doubling into the arena (old arrays are left behind) */
  if ((nd->n_items & (nd->n_items - 1)) == 0) {
    size_t nc = nd->n_items ? nd->n_items * 2 : 1;
    struct tk_jk_node **ni = cm_arena_alloc(p->arena, nc * sizeof *ni);
    if (!ni) return CM_ERR_NOMEM;
    if (nd->n_items) memcpy(ni, nd->items, nd->n_items * sizeof *ni);
    nd->items = ni;
  }
  nd->items[nd->n_items++] = it;
  return 0;
}

static int parse_expr(struct ps *p, struct tk_jk_node **out);

/* (args, kw=args) after the opening parenthesis was consumed */
static int parse_args(struct ps *p, struct tk_jk_node *nd) {
  const char *kn[32];
  size_t kl[32];
  struct tk_jk_node *kv[32];
  size_t nk = 0;
  int rc;
  while (!accept_op(p, ")")) {
    if (nd->n_items + nk && !accept_op(p, ",")) return ps_err(p, "expected ',' or ')'");
    if (accept_op(p, ")")) break;
    if (cur(p)->kind == JK_NAME && p->pos + 1 < p->n && p->t[p->pos + 1].kind == JK_OP &&
        p->t[p->pos + 1].n == 1 && p->t[p->pos + 1].s[0] == '=') {
      if (nk == 32) return ps_err(p, "too many keyword arguments");
      kn[nk] = cur(p)->s;
      kl[nk] = cur(p)->n;
      p->pos += 2;
      if ((rc = parse_expr(p, &kv[nk]))) return rc;
      nk++;
    } else {
      struct tk_jk_node *a;
      if (nk) return ps_err(p, "positional argument after a keyword argument");
      if ((rc = parse_expr(p, &a)) || (rc = add_item(p, nd, a))) return rc;
    }
  }
  if (nk) {
    nd->kw_names = cm_arena_alloc(p->arena, nk * sizeof *nd->kw_names);
    nd->kw_lens = cm_arena_alloc(p->arena, nk * sizeof *nd->kw_lens);
    nd->kw_vals = cm_arena_alloc(p->arena, nk * sizeof *nd->kw_vals);
    if (!nd->kw_names || !nd->kw_lens || !nd->kw_vals) return CM_ERR_NOMEM;
    memcpy(nd->kw_names, kn, nk * sizeof *kn);
    memcpy(nd->kw_lens, kl, nk * sizeof *kl);
    memcpy(nd->kw_vals, kv, nk * sizeof *kv);
    nd->n_kw = nk;
  }
  return 0;
}

static int parse_primary(struct ps *p, struct tk_jk_node **out) {
  struct tk_jk_token *t = cur(p);
  struct tk_jk_node *nd = NULL;
  int rc;
  if (t->kind == JK_STRING) {
    if (!(nd = node(p, JN_STR))) return CM_ERR_NOMEM;
    nd->s = t->s;
    nd->n = t->n;
    p->pos++;
    /* adjacent literals concatenate, as in Python */
    while (cur(p)->kind == JK_STRING) {
      char *s = cm_arena_alloc(p->arena, nd->n + cur(p)->n + 1);
      if (!s) return CM_ERR_NOMEM;
      memcpy(s, nd->s, nd->n);
      memcpy(s + nd->n, cur(p)->s, cur(p)->n + 1);
      nd->s = s;
      nd->n += cur(p)->n;
      p->pos++;
    }
  } else if (t->kind == JK_INT || t->kind == JK_FLOAT) {
    if (!(nd = node(p, t->kind == JK_INT ? JN_INT : JN_FLOAT))) return CM_ERR_NOMEM;
    nd->i = t->i;
    nd->f = t->f;
    p->pos++;
  } else if (t->kind == JK_NAME) {
    if (is_name(p, "true") || is_name(p, "True") || is_name(p, "false") || is_name(p, "False")) {
      if (!(nd = node(p, JN_BOOL))) return CM_ERR_NOMEM;
      nd->i = t->s[0] == 't' || t->s[0] == 'T';
    } else if (is_name(p, "none") || is_name(p, "None")) {
      if (!(nd = node(p, JN_NONE))) return CM_ERR_NOMEM;
    } else {
      if (!(nd = node(p, JN_NAME))) return CM_ERR_NOMEM;
      nd->s = t->s;
      nd->n = t->n;
    }
    p->pos++;
  } else if (accept_op(p, "(")) {
    if ((rc = parse_expr(p, &nd))) return rc;
    if (!accept_op(p, ")")) return ps_err(p, "expected ')'");
  } else if (accept_op(p, "[")) {
    if (!(nd = node(p, JN_LIST))) return CM_ERR_NOMEM;
    while (!accept_op(p, "]")) {
      struct tk_jk_node *e;
      if (nd->n_items && !accept_op(p, ",")) return ps_err(p, "expected ',' or ']'");
      if (accept_op(p, "]")) break;
      if ((rc = parse_expr(p, &e)) || (rc = add_item(p, nd, e))) return rc;
    }
  } else if (accept_op(p, "{")) {
    if (!(nd = node(p, JN_DICT))) return CM_ERR_NOMEM;
    while (!accept_op(p, "}")) {
      struct tk_jk_node *k, *v;
      if (nd->n_items && !accept_op(p, ",")) return ps_err(p, "expected ',' or '}'");
      if (accept_op(p, "}")) break;
      if ((rc = parse_expr(p, &k))) return rc;
      if (!accept_op(p, ":")) return ps_err(p, "expected ':' in a dict literal");
      if ((rc = parse_expr(p, &v)) || (rc = add_item(p, nd, k)) || (rc = add_item(p, nd, v)))
        return rc;
    }
  } else {
    return ps_err(p, "expected an expression");
  }
  *out = nd;
  return 0;
}

static int parse_postfix(struct ps *p, struct tk_jk_node **io) {
  int rc;
  for (;;) {
    struct tk_jk_node *base = *io, *nd;
    if (accept_op(p, ".")) {
      if (cur(p)->kind != JK_NAME) return ps_err(p, "expected a name after '.'");
      if (!(nd = node(p, JN_ATTR))) return CM_ERR_NOMEM;
      nd->a = base;
      nd->s = cur(p)->s;
      nd->n = cur(p)->n;
      p->pos++;
    } else if (accept_op(p, "[")) {
      struct tk_jk_node *x[3] = {0};
      int k = 0, colon = 0;
      for (;;) {
        if (is_op(p, ":")) {
          if (++k > 2) return ps_err(p, "bad slice");
          colon = 1;
          p->pos++;
        } else if (is_op(p, "]")) {
          p->pos++;
          break;
        } else {
          if (x[k]) return ps_err(p, "expected ']'");
          if ((rc = parse_expr(p, &x[k]))) return rc;
        }
      }
      if (!(nd = node(p, colon ? JN_SLICE : JN_INDEX))) return CM_ERR_NOMEM;
      if (!colon && !x[0]) return ps_err(p, "empty subscript");
      nd->a = base;
      nd->b = x[0];
      nd->c = x[1];
      nd->d = x[2];
    } else if (accept_op(p, "(")) {
      if (!(nd = node(p, JN_CALL))) return CM_ERR_NOMEM;
      nd->a = base;
      if (base->kind == JN_NAME) {
        /* a global, or a macro (checked once the whole template is read) */
        nd->fn = tk_jk_global_id(base->s, base->n);
        if (nd->fn < 0 && (rc = add_item(p, p->calls, nd))) return rc;
      } else if (base->kind == JN_ATTR) {
        if ((nd->fn = tk_jk_method_id(base->s, base->n)) < 0)
          return ps_err(p, "unsupported method '%.*s'", (int)base->n, base->s);
      } else {
        return ps_err(p, "only functions and methods can be called");
      }
      if ((rc = parse_args(p, nd))) return rc;
    } else {
      return 0;
    }
    *io = nd;
  }
}

/* map / select / reject / selectattr / rejectattr name a filter or a test
 * by a string literal: resolve it now into a node in nd->b that applies it
 * with the remaining arguments, so an unknown name fails at load time. */
static int resolve_higher_order(struct ps *p, struct tk_jk_node *nd) {
  size_t name_at;
  int is_test;
  switch (nd->fn) {
  case JF_MAP:
    for (size_t k = 0; k < nd->n_kw; k++)
      if (nd->kw_lens[k] == 9 && !memcmp(nd->kw_names[k], "attribute", 9)) return 0;
    name_at = 0, is_test = 0;
    break;
  case JF_SELECT:
  case JF_REJECT: name_at = 0, is_test = 1; break;
  case JF_SELECTATTR:
  case JF_REJECTATTR:
    if (nd->n_items < 1) return ps_err(p, "%.*s needs an attribute name", (int)nd->n, nd->s);
    name_at = 1, is_test = 1;
    break;
  default: return 0;
  }
  if (nd->n_items <= name_at) {
    if (!is_test) return ps_err(p, "map needs a filter name or attribute=");
    return 0; /* no test: truthiness */
  }
  const struct tk_jk_node *name = nd->items[name_at];
  if (name->kind != JN_STR)
    return ps_err(p, "%.*s: the %s name must be a string literal", (int)nd->n, nd->s,
                  is_test ? "test" : "filter");
  struct tk_jk_node *app = node(p, is_test ? JN_TEST : JN_FILTER);
  if (!app) return CM_ERR_NOMEM;
  app->s = name->s;
  app->n = name->n;
  app->fn = is_test ? tk_jk_test_id(name->s, name->n) : tk_jk_filter_id(name->s, name->n);
  if (app->fn < 0)
    return ps_err(p, "unsupported %s '%.*s'", is_test ? "test" : "filter", (int)name->n, name->s);
  for (size_t k = name_at + 1; k < nd->n_items; k++) {
    int rc = add_item(p, app, nd->items[k]);
    if (rc) return rc;
  }
  if (!is_test) {
    app->kw_names = nd->kw_names, app->kw_lens = nd->kw_lens;
    app->kw_vals = nd->kw_vals, app->n_kw = nd->n_kw;
  }
  nd->b = app;
  return 0;
}

/* filters and tests bind to the postfix expression before them */
static int parse_filters(struct ps *p, struct tk_jk_node **io) {
  int rc;
  for (;;) {
    struct tk_jk_node *nd;
    if (accept_op(p, "|")) {
      if (cur(p)->kind != JK_NAME) return ps_err(p, "expected a filter name");
      if (!(nd = node(p, JN_FILTER))) return CM_ERR_NOMEM;
      nd->s = cur(p)->s;
      nd->n = cur(p)->n;
      if ((nd->fn = tk_jk_filter_id(nd->s, nd->n)) < 0)
        return ps_err(p, "unsupported filter '%.*s'", (int)nd->n, nd->s);
      p->pos++;
      nd->a = *io;
      if (accept_op(p, "(") && (rc = parse_args(p, nd))) return rc;
      if ((rc = resolve_higher_order(p, nd))) return rc;
    } else if (accept_name(p, "is")) {
      if (!(nd = node(p, JN_TEST))) return CM_ERR_NOMEM;
      nd->i = accept_name(p, "not");
      struct tk_jk_token *t = cur(p);
      if (t->kind != JK_NAME && !(t->kind == JK_OP && (is_op(p, "==") || is_op(p, "!="))))
        return ps_err(p, "expected a test name");
      if ((nd->fn = tk_jk_test_id(t->s, t->n)) < 0)
        return ps_err(p, "unsupported test '%.*s'", (int)t->n, t->s);
      p->pos++;
      nd->a = *io;
      if (accept_op(p, "(")) {
        if ((rc = parse_args(p, nd))) return rc;
      } else if (nd->fn == JT_DIVISIBLEBY || nd->fn == JT_EQ || nd->fn == JT_EQUALTO ||
                 nd->fn == JT_EQEQ || nd->fn == JT_NE || nd->fn == JT_NEQ) {
        struct tk_jk_node *arg;
        if ((rc = parse_primary(p, &arg)) || (rc = parse_postfix(p, &arg)) ||
            (rc = add_item(p, nd, arg)))
          return rc;
      }
    } else {
      return 0;
    }
    *io = nd;
  }
}

static int parse_unary(struct ps *p, struct tk_jk_node **out) {
  int rc;
  if (++p->depth > JK_MAX_DEPTH) return ps_err(p, "expression nested too deeply");
  if (is_op(p, "-") || is_op(p, "+")) {
    struct tk_jk_node *nd = node(p, is_op(p, "-") ? JN_NEG : JN_POS);
    if (!nd) return CM_ERR_NOMEM;
    p->pos++;
    if ((rc = parse_unary(p, &nd->a))) return rc;
    *out = nd;
  } else {
    if ((rc = parse_primary(p, out)) || (rc = parse_postfix(p, out)) ||
        (rc = parse_filters(p, out)))
      return rc;
  }
  p->depth--;
  return 0;
}

static int bin(struct ps *p, const char *op, struct tk_jk_node *a, struct tk_jk_node *b,
               struct tk_jk_node **out) {
  struct tk_jk_node *nd = node(p, JN_BIN);
  if (!nd) return CM_ERR_NOMEM;
  nd->s = op;
  nd->n = strlen(op);
  nd->a = a;
  nd->b = b;
  *out = nd;
  return 0;
}

typedef int (*level_fn)(struct ps *, struct tk_jk_node **);
/* The operator of one level at the cursor, consumed; NULL when none is. */
typedef const char *(*op_fn)(struct ps *);

/* One left-associative level of binary operators over the next level. */
static int parse_level(struct ps *p, struct tk_jk_node **out, level_fn next, op_fn take) {
  int rc = next(p, out);
  while (!rc) {
    const char *op = take(p);
    if (!op) return 0;
    struct tk_jk_node *rhs;
    if ((rc = next(p, &rhs))) return rc;
    rc = bin(p, op, *out, rhs, out);
  }
  return rc;
}

/* The first of the symbol operators ops (NULL-terminated) at the cursor. */
static const char *take_sym(struct ps *p, const char *const *ops) {
  for (; *ops; ops++)
    if (is_op(p, *ops)) {
      p->pos++;
      return *ops;
    }
  return NULL;
}

static const char *mul_op(struct ps *p) {
  static const char *const ops[] = {"*", "//", "/", "%", NULL};
  return take_sym(p, ops);
}
static const char *concat_op(struct ps *p) {
  static const char *const ops[] = {"~", NULL};
  return take_sym(p, ops);
}
static const char *add_op(struct ps *p) {
  static const char *const ops[] = {"+", "-", NULL};
  return take_sym(p, ops);
}
static const char *compare_op(struct ps *p) {
  static const char *const ops[] = {"==", "!=", "<=", ">=", "<", ">", NULL};
  const char *op = take_sym(p, ops);
  if (!op && accept_name(p, "in")) op = "in";
  if (!op && is_name(p, "not") && is_name_at(p, 1, "in")) {
    op = "notin";
    p->pos += 2;
  }
  return op;
}
static const char *and_op(struct ps *p) {
  return accept_name(p, "and") ? "and" : NULL;
}
static const char *or_op(struct ps *p) {
  return accept_name(p, "or") ? "or" : NULL;
}

static int parse_mul(struct ps *p, struct tk_jk_node **out) {
  return parse_level(p, out, parse_unary, mul_op);
}
static int parse_concat(struct ps *p, struct tk_jk_node **out) {
  return parse_level(p, out, parse_mul, concat_op);
}
static int parse_add(struct ps *p, struct tk_jk_node **out) {
  return parse_level(p, out, parse_concat, add_op);
}
static int parse_compare(struct ps *p, struct tk_jk_node **out) {
  return parse_level(p, out, parse_add, compare_op);
}

static int parse_not(struct ps *p, struct tk_jk_node **out) {
  if (is_name(p, "not")) {
    struct tk_jk_node *nd = node(p, JN_NOT);
    if (!nd) return CM_ERR_NOMEM;
    p->pos++;
    if (++p->depth > JK_MAX_DEPTH) return ps_err(p, "expression nested too deeply");
    int rc = parse_not(p, &nd->a);
    p->depth--;
    *out = nd;
    return rc;
  }
  return parse_compare(p, out);
}

static int parse_and(struct ps *p, struct tk_jk_node **out) {
  return parse_level(p, out, parse_not, and_op);
}
static int parse_or(struct ps *p, struct tk_jk_node **out) {
  return parse_level(p, out, parse_and, or_op);
}

static int parse_expr(struct ps *p, struct tk_jk_node **out) {
  int rc = parse_or(p, out);
  if (rc || !is_name(p, "if")) return rc;
  /* a if cond else b (else optional: undefined) */
  p->pos++;
  struct tk_jk_node *nd = node(p, JN_COND);
  if (!nd) return CM_ERR_NOMEM;
  nd->a = *out;
  if ((rc = parse_or(p, &nd->b))) return rc;
  if (accept_name(p, "else") && (rc = parse_expr(p, &nd->c))) return rc;
  *out = nd;
  return 0;
}

/* ---- statements ------------------------------------------------------------ */

static int expect_stmt_end(struct ps *p) {
  if (cur(p)->kind != JK_STMT_END) return ps_err(p, "expected '%%}'");
  p->pos++;
  return 0;
}

/* Takes the name at the cursor into *s, *n, or fails saying what was
 * expected there ("a loop variable"). */
static int take_name(struct ps *p, const char *what, const char **s, size_t *n) {
  if (cur(p)->kind != JK_NAME) return ps_err(p, "expected %s", what);
  *s = cur(p)->s;
  *n = cur(p)->n;
  p->pos++;
  return 0;
}

/* A for's or a set's target: a name into nd->s, then, after the operator
 * sep, an optional second into nd->s2 (`for k, v in`, `set ns.x =`). */
static int take_target(struct ps *p, struct tk_jk_node *nd, const char *what, const char *sep,
                       const char *what2) {
  int rc = take_name(p, what, &nd->s, &nd->n);
  if (!rc && accept_op(p, sep)) rc = take_name(p, what2, &nd->s2, &nd->n2);
  return rc;
}

/* Parses statements until a {% name %} whose name is in `ends` (NULL-
 * terminated) and leaves the cursor on that name; at top level (ends NULL)
 * until the end. */
static int parse_block(struct ps *p, const char *const *ends, struct tk_jk_node **out);

/* The end of an if or a for: its optional {% else %} branch into nd->c,
 * then {% end[0] %}; *out is nd once the statement is whole. */
static int parse_else_end(struct ps *p, const char *const *end, struct tk_jk_node *nd,
                          struct tk_jk_node **out) {
  int rc;
  if (accept_name(p, "else") && ((rc = expect_stmt_end(p)) || (rc = parse_block(p, end, &nd->c))))
    return rc;
  if (!accept_name(p, end[0])) return ps_err(p, "expected %s", end[0]);
  *out = nd;
  return expect_stmt_end(p);
}

static int parse_if(struct ps *p, struct tk_jk_node **out) {
  static const char *const ends[] = {"elif", "else", "endif", NULL};
  struct tk_jk_node *nd = node(p, JN_IF);
  int rc;
  if (!nd) return CM_ERR_NOMEM;
  if ((rc = parse_expr(p, &nd->a)) || (rc = expect_stmt_end(p)) ||
      (rc = parse_block(p, ends, &nd->b)))
    return rc;
  if (accept_name(p, "elif")) {
    struct tk_jk_node *blk = node(p, JN_BLOCK), *inner;
    if (!blk) return CM_ERR_NOMEM;
    if ((rc = parse_if(p, &inner)) || (rc = add_item(p, blk, inner))) return rc;
    nd->c = blk;
    *out = nd;
    return 0; /* the innermost if consumed endif */
  }
  static const char *const end[] = {"endif", NULL};
  return parse_else_end(p, end, nd, out);
}

static int parse_for(struct ps *p, struct tk_jk_node **out) {
  static const char *const ends[] = {"else", "endfor", NULL};
  struct tk_jk_node *nd = node(p, JN_FOR);
  int rc;
  if (!nd) return CM_ERR_NOMEM;
  if ((rc = take_target(p, nd, "a loop variable", ",", "a second loop variable"))) return rc;
  if (!accept_name(p, "in")) return ps_err(p, "expected 'in'");
  /* the iterable may not use a bare conditional (its 'if' filters items) */
  if ((rc = parse_or(p, &nd->a))) return rc;
  if (accept_name(p, "if") && (rc = parse_or(p, &nd->d))) return rc;
  if (accept_name(p, "recursive")) return ps_err(p, "recursive loops are not supported");
  if ((rc = expect_stmt_end(p))) return rc;
  p->loops++;
  rc = parse_block(p, ends, &nd->b);
  p->loops--;
  if (rc) return rc;
  static const char *const end[] = {"endfor", NULL};
  return parse_else_end(p, end, nd, out);
}

static int parse_set(struct ps *p, struct tk_jk_node **out) {
  struct tk_jk_node *nd = node(p, JN_SET);
  int rc;
  if (!nd) return CM_ERR_NOMEM;
  if ((rc = take_target(p, nd, "a name after set", ".", "an attribute name"))) return rc;
  if (is_op(p, ",")) return ps_err(p, "tuple assignment is not supported");
  if (accept_op(p, "=")) {
    if ((rc = parse_expr(p, &nd->a))) return rc;
    *out = nd;
    return expect_stmt_end(p);
  }
  static const char *const ends[] = {"endset", NULL};
  if ((rc = expect_stmt_end(p)) || (rc = parse_block(p, ends, &nd->b))) return rc;
  p->pos++; /* endset */
  *out = nd;
  return expect_stmt_end(p);
}

static int parse_macro(struct ps *p, struct tk_jk_node **out) {
  static const char *const ends[] = {"endmacro", NULL};
  struct tk_jk_node *nd = node(p, JN_MACRO);
  int rc;
  if (!nd) return CM_ERR_NOMEM;
  if ((rc = take_name(p, "a macro name", &nd->s, &nd->n))) return rc;
  if (!accept_op(p, "(")) return ps_err(p, "expected '(' after the macro name");
  while (!accept_op(p, ")")) {
    if (nd->n_items && !accept_op(p, ",")) return ps_err(p, "expected ',' or ')'");
    struct tk_jk_node *param = node(p, JN_NAME);
    if (!param) return CM_ERR_NOMEM;
    if ((rc = take_name(p, "a parameter name", &param->s, &param->n))) return rc;
    if (accept_op(p, "=") && (rc = parse_expr(p, &param->a))) return rc;
    if ((rc = add_item(p, nd, param))) return rc;
  }
  int loops = p->loops;
  p->loops = 0; /* break / continue do not reach out of a macro */
  if ((rc = expect_stmt_end(p)) || (rc = parse_block(p, ends, &nd->b))) return rc;
  p->loops = loops;
  p->pos++; /* endmacro */
  if ((rc = add_item(p, p->macros, nd))) return rc;
  *out = nd;
  return expect_stmt_end(p);
}

static int parse_stmt(struct ps *p, struct tk_jk_node **out) {
  struct tk_jk_token *t = cur(p);
  if (t->kind != JK_NAME) return ps_err(p, "expected a statement name");
  p->pos++;
  if (++p->depth > JK_MAX_DEPTH) return ps_err(p, "statements nested too deeply");
  int rc;
  if (t->n == 2 && !memcmp(t->s, "if", 2)) {
    rc = parse_if(p, out);
  } else if (t->n == 3 && !memcmp(t->s, "for", 3)) {
    rc = parse_for(p, out);
  } else if (t->n == 3 && !memcmp(t->s, "set", 3)) {
    rc = parse_set(p, out);
  } else if (t->n == 5 && !memcmp(t->s, "macro", 5)) {
    rc = parse_macro(p, out);
  } else if ((t->n == 5 && !memcmp(t->s, "break", 5)) ||
             (t->n == 8 && !memcmp(t->s, "continue", 8))) {
    if (!p->loops) return ps_err(p, "'%.*s' outside a loop", (int)t->n, t->s);
    if (!(*out = node(p, t->n == 5 ? JN_BREAK : JN_CONTINUE))) return CM_ERR_NOMEM;
    rc = expect_stmt_end(p);
  } else if ((t->n == 10 && !memcmp(t->s, "generation", 10)) ||
             (t->n == 13 && !memcmp(t->s, "endgeneration", 13))) {
    /* assistant-mask markers: no output of their own */
    if (!(*out = node(p, JN_BLOCK))) return CM_ERR_NOMEM;
    rc = expect_stmt_end(p);
  } else {
    p->pos--;
    return ps_err(p, "unsupported statement '%.*s'", (int)t->n, t->s);
  }
  p->depth--;
  return rc;
}

static int parse_block(struct ps *p, const char *const *ends, struct tk_jk_node **out) {
  struct tk_jk_node *blk = node(p, JN_BLOCK);
  int rc;
  if (!blk) return CM_ERR_NOMEM;
  for (;;) {
    struct tk_jk_token *t = cur(p);
    struct tk_jk_node *nd = NULL;
    if (t->kind == JK_EOF) {
      if (ends) return ps_err(p, "unexpected end of template (missing %s)", ends[0]);
      break;
    }
    if (t->kind == JK_TEXT) {
      if (!(nd = node(p, JN_TEXT))) return CM_ERR_NOMEM;
      nd->s = t->s;
      nd->n = t->n;
      p->pos++;
    } else if (t->kind == JK_EXPR_BEGIN) {
      p->pos++;
      if (!(nd = node(p, JN_OUT))) return CM_ERR_NOMEM;
      if ((rc = parse_expr(p, &nd->a))) return rc;
      if (cur(p)->kind != JK_EXPR_END) return ps_err(p, "expected '}}'");
      p->pos++;
    } else if (t->kind == JK_STMT_BEGIN) {
      p->pos++;
      for (size_t k = 0; ends && ends[k]; k++)
        if (is_name(p, ends[k])) {
          *out = blk;
          return 0;
        }
      if ((rc = parse_stmt(p, &nd))) return rc;
    } else {
      return ps_err(p, "unexpected token");
    }
    if ((rc = add_item(p, blk, nd))) return rc;
  }
  *out = blk;
  return 0;
}

int tk_jinja_parse(const char *src, size_t len, struct tk_jinja **out, char *errbuf,
                   size_t errlen) {
  struct tk_jinja *t = calloc(1, sizeof *t);
  if (!t) return CM_ERR_NOMEM;
  if (errbuf && errlen) errbuf[0] = 0;
  cm_arena_init(&t->arena, 64 * 1024, 64u << 20);
  struct ps p = {.arena = &t->arena, .err = errbuf, .errlen = errlen};
  /* tokens and nodes point into the source: keep our own copy */
  char *copy = cm_arena_strndup(&t->arena, src, len);
  int rc = copy ? tk_jk_lex(copy, len, &t->arena, &p.t, &p.n, errbuf, errlen) : CM_ERR_NOMEM;
  if (!rc && (!(p.calls = node(&p, JN_BLOCK)) || !(p.macros = node(&p, JN_BLOCK))))
    rc = CM_ERR_NOMEM;
  if (!rc) rc = parse_block(&p, NULL, &t->root);
  /* every call of a non-global must name a macro of this template */
  for (size_t i = 0; !rc && i < p.calls->n_items; i++) {
    const struct tk_jk_node *callee = p.calls->items[i]->a;
    int found = 0;
    for (size_t k = 0; k < p.macros->n_items && !found; k++)
      found = p.macros->items[k]->n == callee->n &&
              !memcmp(p.macros->items[k]->s, callee->s, callee->n);
    if (!found && errbuf && errlen) {
      snprintf(errbuf, errlen, "template line %d: unknown function '%.*s'",
               p.calls->items[i]->line, (int)callee->n, callee->s);
      rc = CM_ERR_PARSE;
    } else if (!found) {
      rc = CM_ERR_PARSE;
    }
  }
  if (rc) {
    if (rc == CM_ERR_NOMEM && errbuf && errlen) snprintf(errbuf, errlen, "template too large");
    tk_jinja_free(t);
    return rc;
  }
  *out = t;
  return 0;
}

void tk_jinja_free(struct tk_jinja *t) {
  if (!t) return;
  cm_arena_free(&t->arena);
  free(t);
}
