/* tk-jinja-builtins.c — the Jinja filters, tests, methods and global
 * functions listed in tk-jinja.h. Names were resolved to ids at parse
 * time; here each id gets its behaviour. Strings are UTF-8 and index by
 * code point; case mapping covers ASCII letters only. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "tokenizer/tk-jinja-impl.h"

#define UNDEF ((struct tk_jv){.kind = JV_UNDEF})
#define NONE ((struct tk_jv){.kind = JV_NONE})

static const char *kind_name(struct tk_jv v) {
  static const char *const names[] = {"undefined", "none", "bool", "int", "float",
                                      "string", "list", "dict", "function", "macro"};
  return names[v.kind];
}

static struct tk_jv mk_list(struct tk_jk_ev *e) {
  struct tk_jv v = {.kind = JV_LIST};
  v.u.list = cm_arena_calloc(e->a, 1, sizeof *v.u.list);
  return v;
}
static struct tk_jv mk_float(double f) {
  struct tk_jv v = {.kind = JV_FLOAT};
  v.u.f = f;
  return v;
}

/* A string copied into the arena. */
static struct tk_jv str_dup(struct tk_jk_ev *e, const char *s, size_t n) {
  char *c = cm_arena_alloc(e->a, n + 1);
  if (!c) return UNDEF;
  memcpy(c, s, n);
  c[n] = 0;
  return tk_jv_str(c, n);
}

int tk_jk_to_string(struct tk_jk_ev *e, struct tk_jv v, struct tk_jv *out) {
  if (v.kind == JV_STR) {
    *out = v;
    return 0;
  }
  struct tk_jv_buf b = {.max = JK_MAX_OUTPUT};
  int rc = tk_jv_print(&b, v);
  if (!rc) {
    *out = str_dup(e, b.p ? b.p : "", b.n);
    if (out->kind != JV_STR) rc = CM_ERR_NOMEM;
  }
  free(b.p);
  return rc;
}

/* ---- UTF-8 helpers (strings index by code point, as Python does) ------------ */

size_t tk_jk_cp_count(const char *s, size_t n) {
  size_t c = 0;
  for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
  return c;
}

/* byte offset of code point k (k <= count) */
size_t tk_jk_cp_offset(const char *s, size_t n, size_t k) {
  size_t i = 0;
  while (i < n && k) {
    i++;
    while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80) i++;
    k--;
  }
  return i;
}

static int is_ws_at(const char *s, size_t n, size_t *len) {
  unsigned char c = (unsigned char)s[0];
  if (c == ' ' || (c >= '\t' && c <= '\r')) return *len = 1, 1;
  static const char *const uws[] = {"\xc2\xa0", "\xe1\x9a\x80", "\xe2\x80\xa8", "\xe2\x80\xa9",
                                    "\xe2\x80\xaf", "\xe2\x81\x9f", "\xe3\x80\x80"};
  for (size_t k = 0; k < sizeof uws / sizeof uws[0]; k++) {
    size_t l = strlen(uws[k]);
    if (n >= l && !memcmp(s, uws[k], l)) return *len = l, 1;
  }
  if (n >= 3 && (unsigned char)s[0] == 0xe2 && (unsigned char)s[1] == 0x80 &&
      (unsigned char)s[2] >= 0x80 && (unsigned char)s[2] <= 0x8a)
    return *len = 3, 1; /* U+2000..U+200A */
  return 0;
}

/* strip: which 1 = left, 2 = right, 3 = both; chars NULL = whitespace */
static struct tk_jv strip(struct tk_jv v, int which, const char *chars, size_t cn) {
  const char *s = v.u.str.s;
  size_t n = v.u.str.n, l;
  if (which & 1)
    while (n && (chars ? memchr(chars, s[0], cn) != NULL : is_ws_at(s, n, &l)))
      l = chars ? 1 : l, s += l, n -= l;
  if (which & 2)
    for (;;) {
      if (!n) break;
      if (chars) {
        if (!memchr(chars, s[n - 1], cn)) break;
        n--;
        continue;
      }
      size_t st = n - 1;
      while (st && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
      if (!is_ws_at(s + st, n - st, &l) || st + l != n) break;
      n = st;
    }
  return tk_jv_str(s, n);
}

static struct tk_jv map_case(struct tk_jk_ev *e, struct tk_jv v, int mode) {
  /* mode 0 lower, 1 upper, 2 capitalize, 3 title (ASCII letters) */
  char *c = cm_arena_alloc(e->a, v.u.str.n + 1);
  if (!c) return UNDEF;
  int start = 1;
  for (size_t i = 0; i < v.u.str.n; i++) {
    char ch = v.u.str.s[i];
    int up = mode == 1 || (mode == 2 && i == 0) || (mode == 3 && start);
    if (up && ch >= 'a' && ch <= 'z') ch = (char)(ch - 32);
    else if (!up && mode != 1 && ch >= 'A' && ch <= 'Z') ch = (char)(ch + 32);
    c[i] = ch;
    start = !((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9'));
  }
  c[v.u.str.n] = 0;
  return tk_jv_str(c, v.u.str.n);
}

static struct tk_jv replace_str(struct tk_jk_ev *e, struct tk_jv s, struct tk_jv from, struct tk_jv to,
                             int64_t count) {
  struct tk_jv_buf b = {.max = JK_MAX_OUTPUT};
  const char *p = s.u.str.s, *end = p + s.u.str.n;
  int rc = 0;
  while (p <= end && !rc) {
    const char *hit = NULL;
    if (count != 0) {
      if (from.u.str.n == 0) hit = p; /* Python inserts between code points */
      else hit = memmem(p, (size_t)(end - p), from.u.str.s, from.u.str.n);
    }
    if (!hit) {
      rc = tk_jv_buf_put(&b, p, (size_t)(end - p));
      break;
    }
    rc = tk_jv_buf_put(&b, p, (size_t)(hit - p));
    if (!rc) rc = tk_jv_buf_put(&b, to.u.str.s, to.u.str.n);
    if (count > 0) count--;
    if (from.u.str.n == 0) {
      if (hit == end) break;
      size_t l = 1;
      while (hit + l < end && ((unsigned char)hit[l] & 0xC0) == 0x80) l++;
      if (!rc) rc = tk_jv_buf_put(&b, hit, l);
      p = hit + l;
      if (p == end && count != 0 && !rc) rc = tk_jv_buf_put(&b, to.u.str.s, to.u.str.n);
      if (p == end) break;
    } else {
      p = hit + from.u.str.n;
    }
  }
  struct tk_jv r = rc ? UNDEF : str_dup(e, b.p ? b.p : "", b.n);
  free(b.p);
  return r;
}

/* ---- arguments ----------------------------------------------------------------- */

/* Positional argument i, or keyword `kw`, or `def`. */
static int arg(struct tk_jk_ev *e, const struct tk_jk_node *n, size_t i, const char *kw, struct tk_jv def,
               struct tk_jv *out) {
  if (i < n->n_items) return tk_jk_eval(e, n->items[i], out);
  for (size_t k = 0; kw && k < n->n_kw; k++)
    if (n->kw_lens[k] == strlen(kw) && !memcmp(n->kw_names[k], kw, n->kw_lens[k]))
      return tk_jk_eval(e, n->kw_vals[k], out);
  *out = def;
  return 0;
}

static int want(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv v, enum tk_jv_kind k,
                const char *what) {
  if (v.kind == k) return 0;
  return tk_jk_err(e, n, CM_ERR_INVAL, "%s expects a %s, got %s", what,
                kind_name((struct tk_jv){.kind = k}), kind_name(v));
}

int tk_jk_iterate(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv v, struct tk_jv *list) {
  if (v.kind == JV_LIST) {
    *list = v;
    return 0;
  }
  *list = mk_list(e);
  if (!list->u.list) return CM_ERR_NOMEM;
  int rc = 0;
  if (v.kind == JV_UNDEF) return 0;
  if (v.kind == JV_DICT) {
    for (size_t i = 0; i < v.u.dict->n && !rc; i++)
      rc = tk_jv_list_push(e->a, list->u.list, tk_jv_str(v.u.dict->keys[i], v.u.dict->klens[i]));
    return rc;
  }
  if (v.kind == JV_STR) {
    const char *s = v.u.str.s;
    size_t len = v.u.str.n;
    for (size_t i = 0; i < len && !rc;) {
      size_t l = 1;
      while (i + l < len && ((unsigned char)s[i + l] & 0xC0) == 0x80) l++;
      rc = tk_jv_list_push(e->a, list->u.list, tk_jv_str(s + i, l));
      i += l;
    }
    return rc;
  }
  return tk_jk_err(e, n, CM_ERR_INVAL, "a %s is not iterable", kind_name(v));
}

static int pair(struct tk_jk_ev *e, struct tk_jv k, struct tk_jv v, struct tk_jv *out) {
  *out = mk_list(e);
  if (!out->u.list) return CM_ERR_NOMEM;
  int rc = tk_jv_list_push(e->a, out->u.list, k);
  return rc ? rc : tk_jv_list_push(e->a, out->u.list, v);
}

static int dict_items(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv d, int what,
                      int sorted, struct tk_jv *out) {
  /* what: 0 items, 1 keys, 2 values */
  int rc = want(e, n, d, JV_DICT, "items()/keys()/values()");
  if (rc) return rc;
  size_t cnt = d.u.dict->n;
  size_t *order = cm_arena_alloc(e->a, (cnt ? cnt : 1) * sizeof *order);
  if (!order) return CM_ERR_NOMEM;
  for (size_t i = 0; i < cnt; i++) order[i] = i;
  if (sorted) /* insertion sort by key; dicts in templates are small */
    for (size_t i = 1; i < cnt; i++)
      for (size_t j = i; j > 0; j--) {
        const struct tk_jv_dict *dd = d.u.dict;
        size_t a = order[j - 1], b = order[j];
        size_t m = dd->klens[a] < dd->klens[b] ? dd->klens[a] : dd->klens[b];
        int c = memcmp(dd->keys[a], dd->keys[b], m);
        if (c < 0 || (c == 0 && dd->klens[a] <= dd->klens[b])) break;
        order[j - 1] = b;
        order[j] = a;
      }
  *out = mk_list(e);
  if (!out->u.list) return CM_ERR_NOMEM;
  for (size_t i = 0; i < cnt && !rc; i++) {
    size_t k = order[i];
    struct tk_jv key = tk_jv_str(d.u.dict->keys[k], d.u.dict->klens[k]), item;
    if (what == 1) item = key;
    else if (what == 2) item = d.u.dict->vals[k];
    else if ((rc = pair(e, key, d.u.dict->vals[k], &item))) return rc;
    rc = tk_jv_list_push(e->a, out->u.list, item);
  }
  return rc;
}

int tk_jk_filter(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv v, struct tk_jv *out);

/* map / select / reject / selectattr / rejectattr; the filter or test
 * they apply was resolved at parse time into n->b. */
static int higher_order(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv v,
                        struct tk_jv *out) {
  struct tk_jv items, attr = UNDEF, dflt = UNDEF;
  int rc;
  if ((rc = tk_jk_iterate(e, n, v, &items))) return rc;
  int by_attr = n->fn == JF_SELECTATTR || n->fn == JF_REJECTATTR;
  if (by_attr && (rc = tk_jk_eval(e, n->items[0], &attr))) return rc;
  if (n->fn == JF_MAP && !n->b &&
      ((rc = arg(e, n, 99, "attribute", UNDEF, &attr)) || (rc = arg(e, n, 99, "default", UNDEF, &dflt))))
    return rc;
  if ((by_attr || (n->fn == JF_MAP && !n->b)) && (rc = want(e, n, attr, JV_STR, "attribute")))
    return rc;
  *out = mk_list(e);
  if (!out->u.list) return CM_ERR_NOMEM;
  for (size_t i = 0; i < items.u.list->n; i++) {
    struct tk_jv it = items.u.list->items[i], x = it;
    if (attr.kind == JV_STR) {
      struct tk_jv *f = it.kind == JV_DICT ? tk_jv_dict_get(it.u.dict, attr.u.str.s, attr.u.str.n) : NULL;
      x = f ? *f : dflt;
    }
    if (n->fn == JF_MAP) {
      if (n->b && (rc = tk_jk_filter(e, n->b, it, &x))) return rc;
      if ((rc = tk_jv_list_push(e->a, out->u.list, x))) return rc;
      continue;
    }
    int keep;
    if (n->b) {
      if ((rc = tk_jk_test(e, n->b, x, &keep))) return rc;
    } else {
      keep = tk_jv_truthy(x);
    }
    if (n->fn == JF_REJECT || n->fn == JF_REJECTATTR) keep = !keep;
    if (keep && (rc = tk_jv_list_push(e->a, out->u.list, it))) return rc;
  }
  return 0;
}

/* ---- filters --------------------------------------------------------------------- */

int tk_jk_filter(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv v, struct tk_jv *out) {
  struct tk_jv a0, a1, a2;
  int rc = 0;
  switch ((enum tk_jk_filter)n->fn) {
  case JF_TRIM:
    if ((rc = tk_jk_to_string(e, v, &v))) return rc;
    *out = strip(v, 3, NULL, 0);
    return 0;
  case JF_LENGTH:
  case JF_COUNT:
    if (v.kind == JV_STR) *out = tk_jv_int((int64_t)tk_jk_cp_count(v.u.str.s, v.u.str.n));
    else if (v.kind == JV_LIST) *out = tk_jv_int((int64_t)v.u.list->n);
    else if (v.kind == JV_DICT) *out = tk_jv_int((int64_t)v.u.dict->n);
    else if (v.kind == JV_UNDEF) *out = tk_jv_int(0);
    else return tk_jk_err(e, n, CM_ERR_INVAL, "length of a %s", kind_name(v));
    return 0;
  case JF_UPPER:
  case JF_LOWER:
  case JF_CAPITALIZE:
  case JF_TITLE:
    if ((rc = tk_jk_to_string(e, v, &v))) return rc;
    *out = map_case(e, v, n->fn == JF_LOWER ? 0 : n->fn == JF_UPPER ? 1 : n->fn == JF_CAPITALIZE ? 2 : 3);
    return out->kind == JV_STR ? 0 : CM_ERR_NOMEM;
  case JF_FIRST:
  case JF_LAST: {
    struct tk_jv l;
    if ((rc = tk_jk_iterate(e, n, v, &l))) return rc;
    *out = !l.u.list->n ? UNDEF : l.u.list->items[n->fn == JF_FIRST ? 0 : l.u.list->n - 1];
    return 0;
  }
  case JF_JOIN: {
    struct tk_jv l;
    if ((rc = arg(e, n, 0, "d", tk_jv_str("", 0), &a0)) || (rc = tk_jk_iterate(e, n, v, &l)) ||
        (rc = tk_jk_to_string(e, a0, &a0)))
      return rc;
    struct tk_jv_buf b = {.max = JK_MAX_OUTPUT};
    for (size_t i = 0; i < l.u.list->n && !rc; i++) {
      if (i) rc = tk_jv_buf_put(&b, a0.u.str.s, a0.u.str.n);
      if (!rc) rc = tk_jv_print(&b, l.u.list->items[i]);
    }
    if (!rc) *out = str_dup(e, b.p ? b.p : "", b.n);
    free(b.p);
    return rc ? rc : out->kind == JV_STR ? 0 : CM_ERR_NOMEM;
  }
  case JF_DEFAULT:
  case JF_D:
    if ((rc = arg(e, n, 0, "default_value", tk_jv_str("", 0), &a0)) ||
        (rc = arg(e, n, 1, "boolean", tk_jv_bool(0), &a1)))
      return rc;
    *out = (v.kind == JV_UNDEF || (tk_jv_truthy(a1) && !tk_jv_truthy(v))) ? a0 : v;
    return 0;
  case JF_TOJSON: {
    if ((rc = arg(e, n, 0, "indent", NONE, &a0))) return rc;
    int indent = a0.kind == JV_INT ? (int)(a0.u.i < 0 ? 0 : a0.u.i > 16 ? 16 : a0.u.i) : -1;
    struct tk_jv_buf b = {.max = JK_MAX_OUTPUT};
    rc = tk_jv_tojson(&b, v, indent, 0);
    if (!rc) *out = str_dup(e, b.p ? b.p : "", b.n);
    free(b.p);
    return rc ? rc : out->kind == JV_STR ? 0 : CM_ERR_NOMEM;
  }
  case JF_STRING:
  case JF_SAFE:
    return n->fn == JF_SAFE ? (*out = v, 0) : tk_jk_to_string(e, v, out);
  case JF_INT:
  case JF_FLOAT: {
    double d = 0;
    if (v.kind == JV_INT || v.kind == JV_BOOL) d = v.kind == JV_INT ? (double)v.u.i : v.u.b;
    else if (v.kind == JV_FLOAT) d = v.u.f;
    else if (v.kind == JV_STR) {
      char buf[64];
      size_t l = v.u.str.n < 63 ? v.u.str.n : 63;
      memcpy(buf, v.u.str.s, l);
      buf[l] = 0;
      d = strtod(buf, NULL);
    }
    if (n->fn == JF_INT && v.kind == JV_INT) *out = v;
    else *out = n->fn == JF_INT ? tk_jv_int((int64_t)d) : mk_float(d);
    return 0;
  }
  case JF_LIST:
    if ((rc = tk_jk_iterate(e, n, v, out))) return rc;
    if (v.kind == JV_LIST) { /* a copy */
      struct tk_jv c = mk_list(e);
      if (!c.u.list) return CM_ERR_NOMEM;
      for (size_t i = 0; i < v.u.list->n && !rc; i++)
        rc = tk_jv_list_push(e->a, c.u.list, v.u.list->items[i]);
      *out = c;
    }
    return rc;
  case JF_REPLACE:
    if ((rc = tk_jk_to_string(e, v, &v)) || (rc = arg(e, n, 0, "old", UNDEF, &a0)) ||
        (rc = arg(e, n, 1, "new", UNDEF, &a1)) || (rc = arg(e, n, 2, "count", tk_jv_int(-1), &a2)) ||
        (rc = want(e, n, a0, JV_STR, "replace")) || (rc = want(e, n, a1, JV_STR, "replace")) ||
        (rc = want(e, n, a2, JV_INT, "replace")))
      return rc;
    *out = replace_str(e, v, a0, a1, a2.u.i);
    return out->kind == JV_STR ? 0 : CM_ERR_NOMEM;
  case JF_REVERSE: {
    struct tk_jv l;
    if ((rc = tk_jk_iterate(e, n, v, &l))) return rc;
    struct tk_jv r = mk_list(e);
    if (!r.u.list) return CM_ERR_NOMEM;
    for (size_t i = l.u.list->n; i > 0 && !rc; i--)
      rc = tk_jv_list_push(e->a, r.u.list, l.u.list->items[i - 1]);
    if (rc || v.kind != JV_STR) {
      *out = r;
      return rc;
    }
    struct tk_jv_buf b = {.max = JK_MAX_OUTPUT};
    for (size_t i = 0; i < r.u.list->n && !rc; i++) rc = tk_jv_print(&b, r.u.list->items[i]);
    if (!rc) *out = str_dup(e, b.p ? b.p : "", b.n);
    free(b.p);
    return rc;
  }
  case JF_ABS:
    if (v.kind == JV_INT) *out = tk_jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
    else if (v.kind == JV_FLOAT) *out = mk_float(fabs(v.u.f));
    else return tk_jk_err(e, n, CM_ERR_INVAL, "abs of a %s", kind_name(v));
    return 0;
  case JF_ITEMS:
  case JF_DICTSORT:
    return dict_items(e, n, v, 0, n->fn == JF_DICTSORT, out);
  case JF_MAP:
  case JF_SELECT:
  case JF_REJECT:
  case JF_SELECTATTR:
  case JF_REJECTATTR:
    return higher_order(e, n, v, out);
  case JF__N: break;
  }
  return tk_jk_err(e, n, CM_ERR_UNSUPPORTED, "filter not implemented");
}

/* ---- tests ------------------------------------------------------------------------ */

int tk_jk_test(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv v, int *res) {
  struct tk_jv a0;
  int rc = 0;
  switch ((enum tk_jk_test)n->fn) {
  case JT_DEFINED: *res = v.kind != JV_UNDEF; break;
  case JT_UNDEFINED: *res = v.kind == JV_UNDEF; break;
  case JT_NONE: *res = v.kind == JV_NONE; break;
  case JT_STRING: *res = v.kind == JV_STR; break;
  case JT_NUMBER: *res = v.kind == JV_INT || v.kind == JV_FLOAT; break;
  case JT_INTEGER: *res = v.kind == JV_INT; break;
  case JT_FLOAT: *res = v.kind == JV_FLOAT; break;
  case JT_BOOLEAN: *res = v.kind == JV_BOOL; break;
  case JT_ITERABLE: *res = v.kind == JV_LIST || v.kind == JV_DICT || v.kind == JV_STR; break;
  case JT_MAPPING: *res = v.kind == JV_DICT; break;
  case JT_SEQUENCE: *res = v.kind == JV_LIST || v.kind == JV_DICT || v.kind == JV_STR; break;
  case JT_TRUE: *res = v.kind == JV_BOOL && v.u.b; break;
  case JT_FALSE: *res = v.kind == JV_BOOL && !v.u.b; break;
  case JT_EVEN:
  case JT_ODD:
    if ((rc = want(e, n, v, JV_INT, "even/odd"))) return rc;
    *res = (v.u.i % 2 == 0) == (n->fn == JT_EVEN);
    break;
  case JT_DIVISIBLEBY:
    if ((rc = arg(e, n, 0, "num", UNDEF, &a0)) || (rc = want(e, n, v, JV_INT, "divisibleby")) ||
        (rc = want(e, n, a0, JV_INT, "divisibleby")))
      return rc;
    if (!a0.u.i) return tk_jk_err(e, n, CM_ERR_INVAL, "divisibleby(0)");
    *res = v.u.i % a0.u.i == 0;
    break;
  case JT_EQ:
  case JT_EQUALTO:
  case JT_EQEQ:
  case JT_NE:
  case JT_NEQ:
    if ((rc = arg(e, n, 0, "other", UNDEF, &a0))) return rc;
    *res = tk_jv_equal(v, a0) == (n->fn != JT_NE && n->fn != JT_NEQ);
    break;
  case JT__N: return tk_jk_err(e, n, CM_ERR_UNSUPPORTED, "test not implemented");
  }
  if (n->i) *res = !*res;
  return 0;
}

/* ---- methods and globals ------------------------------------------------------------ */

static int split(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv s, struct tk_jv *out) {
  struct tk_jv sep, maxv;
  int rc;
  if ((rc = arg(e, n, 0, "sep", NONE, &sep)) || (rc = arg(e, n, 1, "maxsplit", tk_jv_int(-1), &maxv)))
    return rc;
  if (sep.kind != JV_NONE && (rc = want(e, n, sep, JV_STR, "split"))) return rc;
  if (sep.kind == JV_STR && !sep.u.str.n) return tk_jk_err(e, n, CM_ERR_INVAL, "empty separator");
  int64_t max = maxv.kind == JV_INT ? maxv.u.i : -1;
  *out = mk_list(e);
  if (!out->u.list) return CM_ERR_NOMEM;
  const char *p = s.u.str.s, *end = p + s.u.str.n;
  if (sep.kind == JV_STR) {
    for (;;) {
      const char *hit = max != 0 ? memmem(p, (size_t)(end - p), sep.u.str.s, sep.u.str.n) : NULL;
      if (!hit) return tk_jv_list_push(e->a, out->u.list, tk_jv_str(p, (size_t)(end - p)));
      if ((rc = tk_jv_list_push(e->a, out->u.list, tk_jv_str(p, (size_t)(hit - p))))) return rc;
      p = hit + sep.u.str.n;
      if (max > 0) max--;
    }
  }
  /* whitespace runs; no empty strings */
  for (;;) {
    size_t l;
    while (p < end && is_ws_at(p, (size_t)(end - p), &l)) p += l;
    if (p >= end) return 0;
    if (max == 0) {
      struct tk_jv rest = strip(tk_jv_str(p, (size_t)(end - p)), 2, NULL, 0);
      return tk_jv_list_push(e->a, out->u.list, rest);
    }
    const char *q = p;
    while (q < end && !is_ws_at(q, (size_t)(end - q), &l)) q++;
    if ((rc = tk_jv_list_push(e->a, out->u.list, tk_jv_str(p, (size_t)(q - p))))) return rc;
    p = q;
    if (max > 0) max--;
  }
}

static int call_method(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv *out) {
  struct tk_jv self, a0, a1, a2;
  int rc = tk_jk_eval(e, n->a->a, &self);
  if (rc) return rc;
  if (self.kind == JV_UNDEF)
    return tk_jk_err(e, n, CM_ERR_INVAL, "method '%.*s' of an undefined value", (int)n->a->n,
                  n->a->s);
  switch ((enum tk_jk_method)n->fn) {
  case JM_STRIP:
  case JM_LSTRIP:
  case JM_RSTRIP:
    if ((rc = want(e, n, self, JV_STR, "strip")) || (rc = arg(e, n, 0, "chars", NONE, &a0)))
      return rc;
    if (a0.kind != JV_NONE && (rc = want(e, n, a0, JV_STR, "strip"))) return rc;
    *out = strip(self, n->fn == JM_STRIP ? 3 : n->fn == JM_LSTRIP ? 1 : 2,
                 a0.kind == JV_STR ? a0.u.str.s : NULL, a0.kind == JV_STR ? a0.u.str.n : 0);
    return 0;
  case JM_SPLIT:
    if ((rc = want(e, n, self, JV_STR, "split"))) return rc;
    return split(e, n, self, out);
  case JM_STARTSWITH:
  case JM_ENDSWITH:
    if ((rc = want(e, n, self, JV_STR, "startswith")) || (rc = arg(e, n, 0, NULL, UNDEF, &a0)) ||
        (rc = want(e, n, a0, JV_STR, "startswith")))
      return rc;
    *out = tk_jv_bool(a0.u.str.n <= self.u.str.n &&
                   !memcmp(self.u.str.s + (n->fn == JM_ENDSWITH ? self.u.str.n - a0.u.str.n : 0),
                           a0.u.str.s, a0.u.str.n));
    return 0;
  case JM_UPPER:
  case JM_LOWER:
  case JM_TITLE:
  case JM_CAPITALIZE:
    if ((rc = want(e, n, self, JV_STR, "upper/lower"))) return rc;
    *out = map_case(e, self, n->fn == JM_LOWER ? 0 : n->fn == JM_UPPER ? 1 : n->fn == JM_CAPITALIZE ? 2 : 3);
    return out->kind == JV_STR ? 0 : CM_ERR_NOMEM;
  case JM_REPLACE:
    if ((rc = want(e, n, self, JV_STR, "replace")) || (rc = arg(e, n, 0, NULL, UNDEF, &a0)) ||
        (rc = arg(e, n, 1, NULL, UNDEF, &a1)) || (rc = arg(e, n, 2, "count", tk_jv_int(-1), &a2)) ||
        (rc = want(e, n, a0, JV_STR, "replace")) || (rc = want(e, n, a1, JV_STR, "replace")) ||
        (rc = want(e, n, a2, JV_INT, "replace")))
      return rc;
    *out = replace_str(e, self, a0, a1, a2.u.i);
    return out->kind == JV_STR ? 0 : CM_ERR_NOMEM;
  case JM_ITEMS: return dict_items(e, n, self, 0, 0, out);
  case JM_KEYS: return dict_items(e, n, self, 1, 0, out);
  case JM_VALUES: return dict_items(e, n, self, 2, 0, out);
  case JM_GET: {
    if ((rc = want(e, n, self, JV_DICT, "get")) || (rc = arg(e, n, 0, "key", UNDEF, &a0)) ||
        (rc = arg(e, n, 1, "default", NONE, &a1)))
      return rc;
    struct tk_jv *v = a0.kind == JV_STR ? tk_jv_dict_get(self.u.dict, a0.u.str.s, a0.u.str.n) : NULL;
    *out = v ? *v : a1;
    return 0;
  }
  case JM__N: break;
  }
  return tk_jk_err(e, n, CM_ERR_UNSUPPORTED, "method not implemented");
}

int tk_jk_call(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv *out) {
  if (n->a->kind == JN_ATTR) return call_method(e, n, out);
  if (n->fn < 0) return tk_jk_call_macro(e, n, out);
  struct tk_jv a0, a1, a2;
  int rc;
  switch ((enum tk_jk_global)n->fn) {
  case JG_RAISE_EXCEPTION:
    if ((rc = arg(e, n, 0, "message", tk_jv_str("error", 5), &a0)) || (rc = tk_jk_to_string(e, a0, &a0)))
      return rc;
    if (e->err && e->errlen && !e->err[0])
      snprintf(e->err, e->errlen, "%.*s", (int)a0.u.str.n, a0.u.str.s);
    return CM_ERR_INVAL;
  case JG_NAMESPACE: {
    struct tk_jv_dict *d = cm_arena_calloc(e->a, 1, sizeof *d);
    if (!d) return CM_ERR_NOMEM;
    d->is_namespace = 1;
    for (size_t k = 0; k < n->n_kw; k++) {
      struct tk_jv v;
      if ((rc = tk_jk_eval(e, n->kw_vals[k], &v)) ||
          (rc = tk_jv_dict_set(e->a, d, n->kw_names[k], n->kw_lens[k], v)))
        return rc;
    }
    *out = (struct tk_jv){.kind = JV_DICT};
    out->u.dict = d;
    return 0;
  }
  case JG_RANGE: {
    if ((rc = arg(e, n, 0, NULL, UNDEF, &a0)) || (rc = arg(e, n, 1, NULL, UNDEF, &a1)) ||
        (rc = arg(e, n, 2, NULL, tk_jv_int(1), &a2)))
      return rc;
    int64_t start = 0, stop, step = a2.kind == JV_INT ? a2.u.i : 1;
    if (a1.kind == JV_UNDEF) a1 = a0, a0 = tk_jv_int(0);
    if ((rc = want(e, n, a0, JV_INT, "range")) || (rc = want(e, n, a1, JV_INT, "range")))
      return rc;
    start = a0.u.i;
    stop = a1.u.i;
    if (!step) return tk_jk_err(e, n, CM_ERR_INVAL, "range() step is 0");
    *out = mk_list(e);
    if (!out->u.list) return CM_ERR_NOMEM;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (out->u.list->n >= 1000000) return tk_jk_err(e, n, CM_ERR_TOOBIG, "range() too long");
      if ((rc = tk_jv_list_push(e->a, out->u.list, tk_jv_int(i)))) return rc;
    }
    return 0;
  }
  case JG__N: break;
  }
  return tk_jk_err(e, n, CM_ERR_UNSUPPORTED, "function not implemented");
}
