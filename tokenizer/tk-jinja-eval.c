/* tk-jinja-eval.c — renders a parsed Jinja template: scopes, statements and
 * expressions (filters, tests, methods and globals are in
 * tk-jinja-builtins.c). Every value of a render lives in one capped arena
 * dropped at the end; the output goes to a capped growable buffer.
 *
 * Scoping follows Jinja: `set` writes the innermost scope; each for-loop
 * iteration has its own scope, so assignments inside a loop do not leak
 * out (templates use namespace() for that). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "tokenizer/tk-jinja-impl.h"

#define UNDEF ((struct tk_jv){.kind = JV_UNDEF})

int tk_jk_err(struct tk_jk_ev *e, const struct tk_jk_node *n, int code, const char *fmt, ...) {
  if (e->err && e->errlen && !e->err[0]) {
    int k = snprintf(e->err, e->errlen, "template line %d: ", n ? n->line : 0);
    va_list ap;
    va_start(ap, fmt);
    if (k > 0 && (size_t)k < e->errlen) vsnprintf(e->err + k, e->errlen - (size_t)k, fmt, ap);
    va_end(ap);
  }
  return code;
}

/* Moves a rendered buffer into the arena as a string value and frees the
 * buffer, whatever came before: rc is what the rendering returned, and on
 * an error nothing is written to *out. */
static int buf_to_str(struct tk_jk_ev *e, int rc, struct tk_jv_buf *b, struct tk_jv *out) {
  if (!rc) {
    char *s = cm_arena_alloc(e->a, b->n + 1);
    if (!s)
      rc = CM_ERR_NOMEM;
    else {
      if (b->n) memcpy(s, b->p, b->n);
      s[b->n] = 0;
      *out = tk_jv_str(s, b->n);
    }
  }
  free(b->p);
  return rc;
}

static struct tk_jv *lookup(struct tk_jk_ev *e, const char *s, size_t n) {
  for (struct tk_jk_frame *f = e->top; f; f = f->up) {
    struct tk_jv *v = tk_jv_dict_get(&f->vars, s, n);
    if (v) return v;
  }
  return NULL;
}

static int push_frame(struct tk_jk_ev *e) {
  struct tk_jk_frame *f = cm_arena_calloc(e->a, 1, sizeof *f);
  if (!f) return CM_ERR_NOMEM;
  f->up = e->top;
  e->top = f;
  return 0;
}

/* Python's slice indices over a sequence of length len. */
static void slice_bounds(int64_t len, struct tk_jv *b, struct tk_jv *c, int64_t step, int64_t *start,
                         int64_t *stop) {
  int64_t lo = step > 0 ? 0 : -1, hi = step > 0 ? len : len - 1;
  *start = step > 0 ? lo : hi;
  *stop = step > 0 ? hi : lo;
  if (b->kind == JV_INT) {
    *start = b->u.i < 0 ? b->u.i + len : b->u.i;
    if (*start < lo) *start = lo;
    if (*start > hi) *start = hi;
  }
  if (c->kind == JV_INT) {
    *stop = c->u.i < 0 ? c->u.i + len : c->u.i;
    if (*stop < lo) *stop = lo;
    if (*stop > hi) *stop = hi;
  }
}

static int eval_slice(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv *out) {
  struct tk_jv base, b = UNDEF, c = UNDEF, d = UNDEF;
  int rc;
  if ((rc = tk_jk_eval(e, n->a, &base)) || (n->b && (rc = tk_jk_eval(e, n->b, &b))) ||
      (n->c && (rc = tk_jk_eval(e, n->c, &c))) || (n->d && (rc = tk_jk_eval(e, n->d, &d))))
    return rc;
  int64_t step = d.kind == JV_INT ? d.u.i : 1;
  if (!step) return tk_jk_err(e, n, CM_ERR_INVAL, "slice step is 0");
  if ((b.kind != JV_INT && b.kind != JV_UNDEF && b.kind != JV_NONE) ||
      (c.kind != JV_INT && c.kind != JV_UNDEF && c.kind != JV_NONE))
    return tk_jk_err(e, n, CM_ERR_INVAL, "slice indices must be integers");
  struct tk_jv items;
  if (base.kind == JV_LIST) items = base;
  else if (base.kind == JV_STR) {
    if ((rc = tk_jk_iterate(e, n, base, &items))) return rc;
  } else {
    return tk_jk_err(e, n, CM_ERR_INVAL, "cannot slice this value");
  }
  int64_t start, stop, len = (int64_t)items.u.list->n;
  slice_bounds(len, &b, &c, step, &start, &stop);
  struct tk_jv r = {.kind = JV_LIST};
  if (!(r.u.list = cm_arena_calloc(e->a, 1, sizeof *r.u.list))) return CM_ERR_NOMEM;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
    if ((rc = tk_jv_list_push(e->a, r.u.list, items.u.list->items[i]))) return rc;
  if (base.kind != JV_STR) {
    *out = r;
    return 0;
  }
  struct tk_jv_buf buf = {.max = JK_MAX_OUTPUT};
  for (size_t i = 0; i < r.u.list->n && !rc; i++) rc = tk_jv_print(&buf, r.u.list->items[i]);
  return buf_to_str(e, rc, &buf, out);
}

static int eval_index(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv base, struct tk_jv key,
                      struct tk_jv *out) {
  *out = UNDEF;
  if (base.kind == JV_UNDEF || base.kind == JV_NONE)
    return tk_jk_err(e, n, CM_ERR_INVAL, "cannot read an item or attribute of %s",
                  base.kind == JV_NONE ? "none" : "an undefined value");
  if (base.kind == JV_DICT) {
    if (key.kind != JV_STR) return 0;
    struct tk_jv *v = tk_jv_dict_get(base.u.dict, key.u.str.s, key.u.str.n);
    if (v) *out = *v;
    return 0;
  }
  if ((base.kind == JV_LIST || base.kind == JV_STR) && key.kind == JV_INT) {
    int64_t len = base.kind == JV_LIST ? (int64_t)base.u.list->n
                                       : (int64_t)tk_jk_cp_count(base.u.str.s, base.u.str.n);
    int64_t i = key.u.i < 0 ? key.u.i + len : key.u.i;
    if (i < 0 || i >= len) return 0;
    if (base.kind == JV_LIST) {
      *out = base.u.list->items[i];
    } else {
      size_t o = tk_jk_cp_offset(base.u.str.s, base.u.str.n, (size_t)i);
      size_t o2 = tk_jk_cp_offset(base.u.str.s, base.u.str.n, (size_t)i + 1);
      *out = tk_jv_str(base.u.str.s + o, o2 - o);
    }
  }
  return 0;
}

static int num(struct tk_jv v, double *d, int64_t *i) {
  if (v.kind == JV_INT) return *i = v.u.i, *d = (double)v.u.i, 1;
  if (v.kind == JV_BOOL) return *i = v.u.b, *d = v.u.b, 1;
  if (v.kind == JV_FLOAT) return *d = v.u.f, 2;
  return 0;
}

static int compare(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv a, struct tk_jv b, int *cmp) {
  double x = 0, y = 0;
  int64_t i = 0, j = 0;
  int ka = num(a, &x, &i), kb = num(b, &y, &j);
  if (ka && kb) {
    if (ka == 1 && kb == 1) *cmp = (i > j) - (i < j);
    else *cmp = (x > y) - (x < y);
    return 0;
  }
  if (a.kind == JV_STR && b.kind == JV_STR) {
    size_t m = a.u.str.n < b.u.str.n ? a.u.str.n : b.u.str.n;
    int c = memcmp(a.u.str.s, b.u.str.s, m);
    *cmp = c ? (c > 0) - (c < 0) : (a.u.str.n > b.u.str.n) - (a.u.str.n < b.u.str.n);
    return 0;
  }
  return tk_jk_err(e, n, CM_ERR_INVAL, "cannot order these values");
}

static int contains(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv item, struct tk_jv seq,
                    int *res) {
  if (seq.kind == JV_STR) {
    if (item.kind != JV_STR) return tk_jk_err(e, n, CM_ERR_INVAL, "'in <string>' needs a string");
    *res = item.u.str.n == 0 || memmem(seq.u.str.s, seq.u.str.n, item.u.str.s, item.u.str.n);
    return 0;
  }
  if (seq.kind == JV_LIST) {
    *res = 0;
    for (size_t i = 0; i < seq.u.list->n && !*res; i++) *res = tk_jv_equal(item, seq.u.list->items[i]);
    return 0;
  }
  if (seq.kind == JV_DICT) {
    *res = item.kind == JV_STR && tk_jv_dict_get(seq.u.dict, item.u.str.s, item.u.str.n);
    return 0;
  }
  if (seq.kind == JV_UNDEF) return *res = 0, 0;
  return tk_jk_err(e, n, CM_ERR_INVAL, "'in' needs a string, list or dict");
}

static int arith(struct tk_jk_ev *e, const struct tk_jk_node *n, char op, int floordiv, struct tk_jv a,
                 struct tk_jv b, struct tk_jv *out) {
  double x = 0, y = 0;
  int64_t i = 0, j = 0;
  int ka = num(a, &x, &i), kb = num(b, &y, &j);
  int rc;
  if (op == '+' && a.kind == JV_STR && b.kind == JV_STR) {
    char *s = cm_arena_alloc(e->a, a.u.str.n + b.u.str.n + 1);
    if (!s) return CM_ERR_NOMEM;
    memcpy(s, a.u.str.s, a.u.str.n);
    memcpy(s + a.u.str.n, b.u.str.s, b.u.str.n);
    s[a.u.str.n + b.u.str.n] = 0;
    *out = tk_jv_str(s, a.u.str.n + b.u.str.n);
    return 0;
  }
  if (op == '+' && a.kind == JV_LIST && b.kind == JV_LIST) {
    struct tk_jv r = {.kind = JV_LIST};
    if (!(r.u.list = cm_arena_calloc(e->a, 1, sizeof *r.u.list))) return CM_ERR_NOMEM;
    for (size_t k = 0; k < a.u.list->n; k++)
      if ((rc = tk_jv_list_push(e->a, r.u.list, a.u.list->items[k]))) return rc;
    for (size_t k = 0; k < b.u.list->n; k++)
      if ((rc = tk_jv_list_push(e->a, r.u.list, b.u.list->items[k]))) return rc;
    *out = r;
    return 0;
  }
  if (op == '*' && a.kind == JV_STR && kb == 1) {
    int64_t times = j < 0 ? 0 : j;
    if ((double)a.u.str.n * (double)times > JK_MAX_OUTPUT)
      return tk_jk_err(e, n, CM_ERR_TOOBIG, "string repetition too large");
    size_t len = a.u.str.n * (size_t)times;
    char *s = cm_arena_alloc(e->a, len + 1);
    if (!s) return CM_ERR_NOMEM;
    for (int64_t k = 0; k < times; k++) memcpy(s + (size_t)k * a.u.str.n, a.u.str.s, a.u.str.n);
    s[len] = 0;
    *out = tk_jv_str(s, len);
    return 0;
  }
  if (!ka || !kb)
    return tk_jk_err(e, n, CM_ERR_INVAL, "unsupported operand types for '%c'", op);
  int ints = ka == 1 && kb == 1;
  if ((op == '/' || op == '%') && (ints ? j == 0 : y == 0.0))
    return tk_jk_err(e, n, CM_ERR_INVAL, "division by zero");
  switch (op) {
  case '+': *out = ints ? tk_jv_int(i + j) : (struct tk_jv){.kind = JV_FLOAT, .u.f = x + y}; break;
  case '-': *out = ints ? tk_jv_int(i - j) : (struct tk_jv){.kind = JV_FLOAT, .u.f = x - y}; break;
  case '*': *out = ints ? tk_jv_int(i * j) : (struct tk_jv){.kind = JV_FLOAT, .u.f = x * y}; break;
  case '/':
    if (floordiv) {
      if (ints) {
        int64_t q = i / j;
        if ((i % j != 0) && ((i < 0) != (j < 0))) q--;
        *out = tk_jv_int(q);
      } else {
        *out = (struct tk_jv){.kind = JV_FLOAT, .u.f = floor(x / y)};
      }
    } else {
      *out = (struct tk_jv){.kind = JV_FLOAT, .u.f = x / y};
    }
    break;
  case '%':
    if (ints) {
      int64_t r = i % j;
      if (r != 0 && ((r < 0) != (j < 0))) r += j;
      *out = tk_jv_int(r);
    } else {
      double r = fmod(x, y);
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      *out = (struct tk_jv){.kind = JV_FLOAT, .u.f = r};
    }
    break;
  }
  return 0;
}

static int eval_bin(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv *out) {
  struct tk_jv a, b;
  int rc = tk_jk_eval(e, n->a, &a);
  if (rc) return rc;
  const char *op = n->s;
  if (!strcmp(op, "and") || !strcmp(op, "or")) {
    int t = tk_jv_truthy(a);
    if ((op[0] == 'a') != t) return *out = a, 0; /* short circuit */
    return tk_jk_eval(e, n->b, out);
  }
  if ((rc = tk_jk_eval(e, n->b, &b))) return rc;
  int res = 0, cmp = 0;
  if (!strcmp(op, "==") || !strcmp(op, "!=")) {
    *out = tk_jv_bool(tk_jv_equal(a, b) == (op[0] == '='));
  } else if (!strcmp(op, "in") || !strcmp(op, "notin")) {
    if ((rc = contains(e, n, a, b, &res))) return rc;
    *out = tk_jv_bool(res == (op[0] == 'i'));
  } else if (op[0] == '<' || op[0] == '>') {
    if ((rc = compare(e, n, a, b, &cmp))) return rc;
    *out = tk_jv_bool(op[0] == '<' ? (op[1] ? cmp <= 0 : cmp < 0) : (op[1] ? cmp >= 0 : cmp > 0));
  } else if (op[0] == '~') {
    struct tk_jv x, y;
    if ((rc = tk_jk_to_string(e, a, &x)) || (rc = tk_jk_to_string(e, b, &y))) return rc;
    return arith(e, n, '+', 0, x, y, out);
  } else {
    return arith(e, n, op[0], op[0] == '/' && op[1] == '/', a, b, out);
  }
  return 0;
}

int tk_jk_eval(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv *out) {
  struct tk_jv a, b;
  int rc, res;
  if (++e->depth > 4 * JK_MAX_DEPTH) return tk_jk_err(e, n, CM_ERR_DEPTH, "nested too deeply");
  switch (n->kind) {
  case JN_STR: *out = tk_jv_str(n->s, n->n); break;
  case JN_INT: *out = tk_jv_int(n->i); break;
  case JN_FLOAT: *out = (struct tk_jv){.kind = JV_FLOAT, .u.f = n->f}; break;
  case JN_BOOL: *out = tk_jv_bool((int)n->i); break;
  case JN_NONE: *out = (struct tk_jv){.kind = JV_NONE}; break;
  case JN_LIST:
    *out = (struct tk_jv){.kind = JV_LIST};
    if (!(out->u.list = cm_arena_calloc(e->a, 1, sizeof *out->u.list))) return CM_ERR_NOMEM;
    for (size_t i = 0; i < n->n_items; i++)
      if ((rc = tk_jk_eval(e, n->items[i], &a)) || (rc = tk_jv_list_push(e->a, out->u.list, a)))
        return rc;
    break;
  case JN_DICT:
    *out = (struct tk_jv){.kind = JV_DICT};
    if (!(out->u.dict = cm_arena_calloc(e->a, 1, sizeof *out->u.dict))) return CM_ERR_NOMEM;
    for (size_t i = 0; i + 1 < n->n_items; i += 2) {
      if ((rc = tk_jk_eval(e, n->items[i], &a)) || (rc = tk_jk_eval(e, n->items[i + 1], &b)))
        return rc;
      if (a.kind != JV_STR) return tk_jk_err(e, n, CM_ERR_INVAL, "dict keys must be strings");
      if ((rc = tk_jv_dict_set(e->a, out->u.dict, a.u.str.s, a.u.str.n, b))) return rc;
    }
    break;
  case JN_NAME: {
    struct tk_jv *v = lookup(e, n->s, n->n);
    int g = v ? -1 : tk_jk_global_id(n->s, n->n);
    *out = v ? *v : g >= 0 ? (struct tk_jv){.kind = JV_FUNC, .u.fn = g} : UNDEF;
    break;
  }
  case JN_ATTR:
    if ((rc = tk_jk_eval(e, n->a, &a))) return rc;
    if ((rc = eval_index(e, n, a, tk_jv_str(n->s, n->n), out))) return rc;
    break;
  case JN_INDEX:
    if ((rc = tk_jk_eval(e, n->a, &a)) || (rc = tk_jk_eval(e, n->b, &b)) ||
        (rc = eval_index(e, n, a, b, out)))
      return rc;
    break;
  case JN_SLICE:
    if ((rc = eval_slice(e, n, out))) return rc;
    break;
  case JN_CALL:
    if ((rc = tk_jk_call(e, n, out))) return rc;
    break;
  case JN_FILTER:
    if ((rc = tk_jk_eval(e, n->a, &a)) || (rc = tk_jk_filter(e, n, a, out))) return rc;
    break;
  case JN_TEST:
    if ((rc = tk_jk_eval(e, n->a, &a)) || (rc = tk_jk_test(e, n, a, &res))) return rc;
    *out = tk_jv_bool(res);
    break;
  case JN_NOT:
    if ((rc = tk_jk_eval(e, n->a, &a))) return rc;
    *out = tk_jv_bool(!tk_jv_truthy(a));
    break;
  case JN_NEG:
  case JN_POS:
    if ((rc = tk_jk_eval(e, n->a, &a))) return rc;
    if (n->kind == JN_POS) *out = a;
    else if ((rc = arith(e, n, '-', 0, tk_jv_int(0), a, out))) return rc;
    break;
  case JN_BIN:
    if ((rc = eval_bin(e, n, out))) return rc;
    break;
  case JN_COND:
    if ((rc = tk_jk_eval(e, n->b, &a))) return rc;
    if (tk_jv_truthy(a)) rc = tk_jk_eval(e, n->a, out);
    else if (n->c) rc = tk_jk_eval(e, n->c, out);
    else *out = UNDEF;
    if (rc) return rc;
    break;
  default: return tk_jk_err(e, n, CM_ERR_STATE, "not an expression");
  }
  e->depth--;
  return 0;
}

/* ---- statements --------------------------------------------------------------- */

static int exec_block(struct tk_jk_ev *e, const struct tk_jk_node *blk);

static int set_loop(struct tk_jk_ev *e, struct tk_jv_dict *d, const struct tk_jv_list *items, size_t i) {
  size_t len = items->n;
  int rc = 0;
  struct { const char *k; struct tk_jv v; } f[] = {
      {"index", tk_jv_int((int64_t)i + 1)}, {"index0", tk_jv_int((int64_t)i)},
      {"revindex", tk_jv_int((int64_t)(len - i))}, {"revindex0", tk_jv_int((int64_t)(len - i - 1))},
      {"first", tk_jv_bool(i == 0)}, {"last", tk_jv_bool(i + 1 == len)},
      {"length", tk_jv_int((int64_t)len)},
      {"previtem", i > 0 ? items->items[i - 1] : UNDEF},
      {"nextitem", i + 1 < len ? items->items[i + 1] : UNDEF},
  };
  for (size_t k = 0; k < sizeof f / sizeof f[0] && !rc; k++)
    rc = tk_jv_dict_set(e->a, d, f[k].k, strlen(f[k].k), f[k].v);
  return rc;
}

static int exec_for(struct tk_jk_ev *e, const struct tk_jk_node *n) {
  struct tk_jv it, all;
  int rc;
  if ((rc = tk_jk_eval(e, n->a, &it))) return rc;
  if (it.kind == JV_NONE) return tk_jk_err(e, n, CM_ERR_INVAL, "cannot loop over none");
  if ((rc = tk_jk_iterate(e, n, it, &all))) return rc;
  struct tk_jk_frame *outer = e->top;
  /* the `if` clause filters before the loop, so loop.length counts kept items */
  if (n->d) {
    struct tk_jv kept = {.kind = JV_LIST};
    if (!(kept.u.list = cm_arena_calloc(e->a, 1, sizeof *kept.u.list))) return CM_ERR_NOMEM;
    for (size_t i = 0; i < all.u.list->n; i++) {
      struct tk_jv c;
      if ((rc = push_frame(e))) return rc;
      rc = tk_jv_dict_set(e->a, &e->top->vars, n->s, n->n, all.u.list->items[i]);
      if (!rc) rc = tk_jk_eval(e, n->d, &c);
      e->top = outer;
      if (rc) return rc;
      if (tk_jv_truthy(c) && (rc = tk_jv_list_push(e->a, kept.u.list, all.u.list->items[i])))
        return rc;
    }
    all = kept;
  }
  const struct tk_jv_list *items = all.u.list;
  /* one scope and one loop object, emptied / overwritten each iteration:
   * a long loop allocates nothing per iteration */
  if ((rc = push_frame(e))) return rc;
  struct tk_jk_frame *scope = e->top;
  e->top = outer;
  struct tk_jv_dict *loop = cm_arena_calloc(e->a, 1, sizeof *loop);
  if (!loop) return CM_ERR_NOMEM;
  struct tk_jv lv = {.kind = JV_DICT};
  lv.u.dict = loop;
  for (size_t i = 0; i < items->n; i++) {
    if (++e->iters > JK_MAX_ITERS) return tk_jk_err(e, n, CM_ERR_TOOBIG, "too many loop iterations");
    scope->vars.n = 0;
    e->top = scope;
    struct tk_jv item = items->items[i];
    if ((rc = set_loop(e, loop, items, i)) ||
        (rc = tk_jv_dict_set(e->a, &e->top->vars, "loop", 4, lv)))
      return rc;
    if (n->s2) {
      if (item.kind != JV_LIST || item.u.list->n != 2)
        return tk_jk_err(e, n, CM_ERR_INVAL, "cannot unpack a %s into two names",
                      item.kind == JV_LIST ? "list of another length" : "non-list");
      if ((rc = tk_jv_dict_set(e->a, &e->top->vars, n->s, n->n, item.u.list->items[0])) ||
          (rc = tk_jv_dict_set(e->a, &e->top->vars, n->s2, n->n2, item.u.list->items[1])))
        return rc;
    } else if ((rc = tk_jv_dict_set(e->a, &e->top->vars, n->s, n->n, item))) {
      return rc;
    }
    rc = exec_block(e, n->b);
    e->top = outer;
    if (rc) return rc;
    if (e->ctl == 1) {
      e->ctl = 0;
      break;
    }
    e->ctl = 0;
  }
  if (!items->n && n->c) return exec_block(e, n->c);
  return 0;
}

static int exec_set(struct tk_jk_ev *e, const struct tk_jk_node *n) {
  struct tk_jv v;
  int rc;
  if (n->a) {
    if ((rc = tk_jk_eval(e, n->a, &v))) return rc;
  } else {
    /* block set: render the body into a string */
    struct tk_jv_buf *saved = e->out, tmp = {.max = JK_MAX_OUTPUT};
    e->out = &tmp;
    rc = exec_block(e, n->b);
    e->out = saved;
    if ((rc = buf_to_str(e, rc, &tmp, &v))) return rc;
  }
  if (n->s2) {
    struct tk_jv *ns = lookup(e, n->s, n->n);
    if (!ns || ns->kind != JV_DICT || !ns->u.dict->is_namespace)
      return tk_jk_err(e, n, CM_ERR_INVAL, "'%.*s' is not a namespace", (int)n->n, n->s);
    return tk_jv_dict_set(e->a, ns->u.dict, n->s2, n->n2, v);
  }
  return tk_jv_dict_set(e->a, &e->top->vars, n->s, n->n, v);
}

static int exec_block(struct tk_jk_ev *e, const struct tk_jk_node *blk) {
  int rc = 0;
  for (size_t i = 0; i < blk->n_items && !rc && !e->ctl; i++) {
    const struct tk_jk_node *n = blk->items[i];
    struct tk_jv v;
    switch (n->kind) {
    case JN_TEXT: rc = tk_jv_buf_put(e->out, n->s, n->n); break;
    case JN_OUT:
      if (!(rc = tk_jk_eval(e, n->a, &v))) rc = tk_jv_print(e->out, v);
      break;
    case JN_IF:
      if (!(rc = tk_jk_eval(e, n->a, &v))) {
        if (tk_jv_truthy(v)) rc = exec_block(e, n->b);
        else if (n->c) rc = exec_block(e, n->c);
      }
      break;
    case JN_FOR: rc = exec_for(e, n); break;
    case JN_SET: rc = exec_set(e, n); break;
    case JN_MACRO: {
      struct tk_jv mv = {.kind = JV_MACRO};
      mv.u.macro = n;
      rc = tk_jv_dict_set(e->a, &e->top->vars, n->s, n->n, mv);
      break;
    }
    case JN_BREAK: e->ctl = 1; break;
    case JN_CONTINUE: e->ctl = 2; break;
    case JN_BLOCK: rc = exec_block(e, n); break;
    default: rc = tk_jk_err(e, n, CM_ERR_STATE, "not a statement"); break;
    }
    if (rc == CM_ERR_TOOBIG && e->err && !e->err[0])
      rc = tk_jk_err(e, n, CM_ERR_TOOBIG, "output larger than %u bytes", JK_MAX_OUTPUT);
  }
  return rc;
}

int tk_jk_call_macro(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv *out) {
  const struct tk_jk_node *callee = n->a;
  struct tk_jv *mv = lookup(e, callee->s, callee->n);
  if (!mv || mv->kind != JV_MACRO)
    return tk_jk_err(e, n, CM_ERR_INVAL, "'%.*s' is not defined as a macro here",
                     (int)callee->n, callee->s);
  const struct tk_jk_node *m = mv->u.macro;
  if (n->n_items > m->n_items)
    return tk_jk_err(e, n, CM_ERR_INVAL, "macro '%.*s' takes %zu arguments", (int)m->n,
                     m->s, m->n_items);
  /* arguments are evaluated in the caller's scope */
  struct tk_jk_frame *f = cm_arena_calloc(e->a, 1, sizeof *f);
  if (!f) return CM_ERR_NOMEM;
  int rc;
  for (size_t i = 0; i < m->n_items; i++) {
    const struct tk_jk_node *param = m->items[i];
    struct tk_jv v = UNDEF;
    if (i < n->n_items) {
      if ((rc = tk_jk_eval(e, n->items[i], &v))) return rc;
    } else {
      size_t k = 0;
      while (k < n->n_kw && !(n->kw_lens[k] == param->n && !memcmp(n->kw_names[k], param->s, param->n)))
        k++;
      if (k < n->n_kw) rc = tk_jk_eval(e, n->kw_vals[k], &v);
      else rc = param->a ? tk_jk_eval(e, param->a, &v) : 0;
      if (rc) return rc;
    }
    if ((rc = tk_jv_dict_set(e->a, &f->vars, param->s, param->n, v))) return rc;
  }
  for (size_t k = 0; k < n->n_kw; k++) {
    size_t i = 0;
    while (i < m->n_items && !(m->items[i]->n == n->kw_lens[k] &&
                               !memcmp(m->items[i]->s, n->kw_names[k], n->kw_lens[k])))
      i++;
    if (i == m->n_items)
      return tk_jk_err(e, n, CM_ERR_INVAL, "macro '%.*s' has no parameter '%.*s'", (int)m->n,
                       m->s, (int)n->kw_lens[k], n->kw_names[k]);
  }
  /* the body sees its arguments and the template's globals */
  struct tk_jk_frame *globals = e->top;
  while (globals->up) globals = globals->up;
  f->up = globals;
  struct tk_jk_frame *saved_top = e->top;
  if (e->macro_depth >= JK_MAX_MACRO_DEPTH)
    return tk_jk_err(e, n, CM_ERR_DEPTH, "macros nested deeper than %d", JK_MAX_MACRO_DEPTH);
  /* a macro's text is bounded by what its caller may still write */
  struct tk_jv_buf *saved_out = e->out, tmp = {.max = e->out->max - e->out->n};
  int saved_ctl = e->ctl;
  e->top = f;
  e->out = &tmp;
  e->ctl = 0;
  e->macro_depth++;
  rc = exec_block(e, m->b);
  e->macro_depth--;
  e->top = saved_top;
  e->out = saved_out;
  e->ctl = saved_ctl;
  return buf_to_str(e, rc, &tmp, out);
}

int tk_jinja_render(const struct tk_jinja *t, json_t *vars, char **out, size_t *out_len,
                    char *errbuf, size_t errlen) {
  struct cm_arena arena;
  struct tk_jv_buf buf = {.max = JK_MAX_OUTPUT};
  struct tk_jk_frame globals = {0};
  struct tk_jk_ev e = {.a = &arena, .out = &buf, .err = errbuf, .errlen = errlen, .top = &globals};
  int rc = 0;
  *out = NULL;
  *out_len = 0;
  if (errbuf && errlen) errbuf[0] = 0;
  if (!json_is_object(vars)) return CM_ERR_INVAL;
  cm_arena_init(&arena, 64 * 1024, JK_MAX_ARENA);
  const char *k;
  json_t *jv;
  json_object_foreach(vars, k, jv) {
    struct tk_jv v;
    if ((rc = tk_jv_from_json(&arena, jv, &v, 0)) ||
        (rc = tk_jv_dict_set(&arena, &globals.vars, k, strlen(k), v)))
      break;
  }
  if (!rc) rc = exec_block(&e, t->root);
  if (!rc) rc = tk_jv_buf_put(&buf, "", 0); /* a NUL-terminated empty result too */
  if (rc) {
    if (errbuf && errlen && !errbuf[0])
      snprintf(errbuf, errlen, "%s", rc == CM_ERR_NOMEM ? "template render exceeded its memory limit"
                                                          : cm_strerror(rc));
    free(buf.p);
  } else {
    *out = buf.p;
    *out_len = buf.n;
  }
  cm_arena_free(&arena);
  return rc;
}
