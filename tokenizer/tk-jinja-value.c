/* tk-jinja-value.c — Jinja values: construction from JSON, dicts and lists
 * in the render arena, truthiness, equality, and the three ways a value is
 * written out: print (Python str), repr, and tojson (Python json.dumps with
 * ensure_ascii=False). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-grow.h"
#include "tokenizer/tk-jinja-impl.h"

struct tk_jv tk_jv_str(const char *s, size_t n) {
  struct tk_jv v = {.kind = JV_STR};
  v.u.str.s = s;
  v.u.str.n = n;
  return v;
}
struct tk_jv tk_jv_int(int64_t i) {
  struct tk_jv v = {.kind = JV_INT};
  v.u.i = i;
  return v;
}
struct tk_jv tk_jv_bool(int b) {
  struct tk_jv v = {.kind = JV_BOOL};
  v.u.b = b != 0;
  return v;
}

struct tk_jv *tk_jv_dict_get(const struct tk_jv_dict *d, const char *k, size_t kn) {
  for (size_t i = 0; i < d->n; i++)
    if (d->klens[i] == kn && !memcmp(d->keys[i], k, kn)) return &d->vals[i];
  return NULL;
}

int tk_jv_dict_set(struct cm_arena *a, struct tk_jv_dict *d, const char *k, size_t kn, struct tk_jv v) {
  struct tk_jv *old = tk_jv_dict_get(d, k, kn);
  if (old) {
    *old = v;
    return 0;
  }
  if (d->n == d->cap) {
    size_t nc = d->cap ? d->cap * 2 : 8;
    const char **nk = cm_arena_alloc(a, nc * sizeof *nk);
    size_t *nl = cm_arena_alloc(a, nc * sizeof *nl);
    struct tk_jv *nv = cm_arena_alloc(a, nc * sizeof *nv);
    if (!nk || !nl || !nv) return CM_ERR_NOMEM;
    if (d->n) {
      memcpy(nk, d->keys, d->n * sizeof *nk);
      memcpy(nl, d->klens, d->n * sizeof *nl);
      memcpy(nv, d->vals, d->n * sizeof *nv);
    }
    d->keys = nk;
    d->klens = nl;
    d->vals = nv;
    d->cap = nc;
  }
  d->keys[d->n] = k;
  d->klens[d->n] = kn;
  d->vals[d->n] = v;
  d->n++;
  return 0;
}

int tk_jv_list_push(struct cm_arena *a, struct tk_jv_list *l, struct tk_jv v) {
  if (l->n == l->cap) {
    size_t nc = l->cap ? l->cap * 2 : 8;
    struct tk_jv *ni = cm_arena_alloc(a, nc * sizeof *ni);
    if (!ni) return CM_ERR_NOMEM;
    if (l->n) memcpy(ni, l->items, l->n * sizeof *ni);
    l->items = ni;
    l->cap = nc;
  }
  l->items[l->n++] = v;
  return 0;
}

int tk_jv_truthy(struct tk_jv v) {
  switch (v.kind) {
  case JV_BOOL: return v.u.b;
  case JV_INT: return v.u.i != 0;
  case JV_FLOAT: return v.u.f != 0.0;
  case JV_STR: return v.u.str.n != 0;
  case JV_LIST: return v.u.list->n != 0;
  case JV_DICT: return v.u.dict->n != 0;
  case JV_FUNC:
  case JV_MACRO: return 1;
  default: return 0;
  }
}

int tk_jv_equal(struct tk_jv a, struct tk_jv b) {
  int an = a.kind == JV_INT || a.kind == JV_FLOAT || a.kind == JV_BOOL;
  int bn = b.kind == JV_INT || b.kind == JV_FLOAT || b.kind == JV_BOOL;
  if (an && bn) {
    if (a.kind != JV_FLOAT && b.kind != JV_FLOAT)
      return (a.kind == JV_BOOL ? a.u.b : a.u.i) == (b.kind == JV_BOOL ? b.u.b : b.u.i);
    double x = a.kind == JV_FLOAT ? a.u.f : a.kind == JV_INT ? (double)a.u.i : a.u.b;
    double y = b.kind == JV_FLOAT ? b.u.f : b.kind == JV_INT ? (double)b.u.i : b.u.b;
    return x == y;
  }
  if (a.kind != b.kind) return 0;
  switch (a.kind) {
  case JV_UNDEF:
  case JV_NONE: return 1;
  case JV_STR: return a.u.str.n == b.u.str.n && !memcmp(a.u.str.s, b.u.str.s, a.u.str.n);
  case JV_LIST:
    if (a.u.list->n != b.u.list->n) return 0;
    for (size_t i = 0; i < a.u.list->n; i++)
      if (!tk_jv_equal(a.u.list->items[i], b.u.list->items[i])) return 0;
    return 1;
  case JV_DICT:
    if (a.u.dict->n != b.u.dict->n) return 0;
    for (size_t i = 0; i < a.u.dict->n; i++) {
      struct tk_jv *o = tk_jv_dict_get(b.u.dict, a.u.dict->keys[i], a.u.dict->klens[i]);
      if (!o || !tk_jv_equal(a.u.dict->vals[i], *o)) return 0;
    }
    return 1;
  case JV_FUNC: return a.u.fn == b.u.fn;
  case JV_MACRO: return a.u.macro == b.u.macro;
  default: return 0;
  }
}

int tk_jv_from_json(struct cm_arena *a, json_t *j, struct tk_jv *out, int depth) {
  if (depth > JK_MAX_DEPTH) return CM_ERR_DEPTH;
  int rc;
  switch (json_typeof(j)) {
  case JSON_NULL: *out = (struct tk_jv){.kind = JV_NONE}; return 0;
  case JSON_TRUE: *out = tk_jv_bool(1); return 0;
  case JSON_FALSE: *out = tk_jv_bool(0); return 0;
  case JSON_INTEGER: *out = tk_jv_int(json_integer_value(j)); return 0;
  case JSON_REAL:
    *out = (struct tk_jv){.kind = JV_FLOAT};
    out->u.f = json_real_value(j);
    return 0;
  case JSON_STRING: *out = tk_jv_str(json_string_value(j), json_string_length(j)); return 0;
  case JSON_ARRAY: {
    struct tk_jv_list *l = cm_arena_calloc(a, 1, sizeof *l);
    if (!l) return CM_ERR_NOMEM;
    size_t i;
    json_t *e;
    json_array_foreach(j, i, e) {
      struct tk_jv v;
      if ((rc = tk_jv_from_json(a, e, &v, depth + 1)) || (rc = tk_jv_list_push(a, l, v))) return rc;
    }
    *out = (struct tk_jv){.kind = JV_LIST};
    out->u.list = l;
    return 0;
  }
  case JSON_OBJECT: {
    struct tk_jv_dict *d = cm_arena_calloc(a, 1, sizeof *d);
    if (!d) return CM_ERR_NOMEM;
    const char *k;
    json_t *e;
    json_object_foreach(j, k, e) {
      struct tk_jv v;
      if ((rc = tk_jv_from_json(a, e, &v, depth + 1)) ||
          (rc = tk_jv_dict_set(a, d, k, strlen(k), v)))
        return rc;
    }
    *out = (struct tk_jv){.kind = JV_DICT};
    out->u.dict = d;
    return 0;
  }
  }
  return CM_ERR_INVAL;
}

/* ---- output ------------------------------------------------------------------ */

int tk_jv_buf_put(struct tk_jv_buf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    if (b->n + n + 1 > b->max) return CM_ERR_TOOBIG;
    if (cm_grow(&b->p, &b->cap, b->n + n + 1, 1024)) return CM_ERR_NOMEM;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
  return 0;
}

static int put_s(struct tk_jv_buf *b, const char *s) { return tk_jv_buf_put(b, s, strlen(s)); }

/* Python's float repr: the shortest digits that read back the same. */
static int put_float(struct tk_jv_buf *b, double f, int json) {
  char s[40];
  if (isnan(f)) return put_s(b, json ? "NaN" : "nan");
  if (isinf(f)) return put_s(b, f > 0 ? (json ? "Infinity" : "inf") : (json ? "-Infinity" : "-inf"));
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(s, sizeof s, "%.*g", prec, f);
    if (strtod(s, NULL) == f) break;
  }
  /* Python writes exponents with at least two digits and keeps ".0" */
  if (!strpbrk(s, ".en")) strcat(s, ".0");
  return put_s(b, s);
}

int tk_jv_print(struct tk_jv_buf *b, struct tk_jv v) {
  char s[32];
  switch (v.kind) {
  case JV_UNDEF: return 0;
  case JV_NONE: return put_s(b, "None");
  case JV_BOOL: return put_s(b, v.u.b ? "True" : "False");
  case JV_INT:
    snprintf(s, sizeof s, "%lld", (long long)v.u.i);
    return put_s(b, s);
  case JV_FLOAT: return put_float(b, v.u.f, 0);
  case JV_STR: return tk_jv_buf_put(b, v.u.str.s, v.u.str.n);
  default: return tk_jv_repr(b, v);
  }
}

int tk_jv_repr(struct tk_jv_buf *b, struct tk_jv v) {
  int rc = 0;
  if (v.kind == JV_STR) {
    /* Python prefers single quotes unless the string has one and no double */
    int sq = memchr(v.u.str.s, '\'', v.u.str.n) != NULL;
    int dq = memchr(v.u.str.s, '"', v.u.str.n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    rc = tk_jv_buf_put(b, &q, 1);
    for (size_t i = 0; i < v.u.str.n && !rc; i++) {
      unsigned char c = (unsigned char)v.u.str.s[i];
      char e[8];
      if (c == '\\' || c == (unsigned char)q) e[0] = '\\', e[1] = (char)c, e[2] = 0;
      else if (c == '\n') strcpy(e, "\\n");
      else if (c == '\r') strcpy(e, "\\r");
      else if (c == '\t') strcpy(e, "\\t");
      else if (c < 0x20 || c == 0x7f) snprintf(e, sizeof e, "\\x%02x", c);
      else e[0] = (char)c, e[1] = 0;
      rc = put_s(b, e);
    }
    return rc ? rc : tk_jv_buf_put(b, &q, 1);
  }
  if (v.kind == JV_LIST) {
    rc = put_s(b, "[");
    for (size_t i = 0; i < v.u.list->n && !rc; i++) {
      if (i) rc = put_s(b, ", ");
      if (!rc) rc = tk_jv_repr(b, v.u.list->items[i]);
    }
    return rc ? rc : put_s(b, "]");
  }
  if (v.kind == JV_DICT) {
    rc = put_s(b, v.u.dict->is_namespace ? "<Namespace {" : "{");
    for (size_t i = 0; i < v.u.dict->n && !rc; i++) {
      if (i) rc = put_s(b, ", ");
      if (!rc) rc = tk_jv_repr(b, tk_jv_str(v.u.dict->keys[i], v.u.dict->klens[i]));
      if (!rc) rc = put_s(b, ": ");
      if (!rc) rc = tk_jv_repr(b, v.u.dict->vals[i]);
    }
    return rc ? rc : put_s(b, v.u.dict->is_namespace ? "}>" : "}");
  }
  if (v.kind == JV_UNDEF) return 0;
  if (v.kind == JV_FUNC || v.kind == JV_MACRO) return put_s(b, "<function>");
  return tk_jv_print(b, v);
}

static int put_json_str(struct tk_jv_buf *b, const char *s, size_t n) {
  int rc = put_s(b, "\"");
  for (size_t i = 0; i < n && !rc; i++) {
    unsigned char c = (unsigned char)s[i];
    char e[8];
    if (c == '"') strcpy(e, "\\\"");
    else if (c == '\\') strcpy(e, "\\\\");
    else if (c == '\n') strcpy(e, "\\n");
    else if (c == '\r') strcpy(e, "\\r");
    else if (c == '\t') strcpy(e, "\\t");
    else if (c == '\b') strcpy(e, "\\b");
    else if (c == '\f') strcpy(e, "\\f");
    else if (c < 0x20) snprintf(e, sizeof e, "\\u%04x", c);
    else e[0] = (char)c, e[1] = 0;
    rc = put_s(b, e);
  }
  return rc ? rc : put_s(b, "\"");
}

static int put_indent(struct tk_jv_buf *b, int indent, int depth) {
  int rc = put_s(b, "\n");
  for (int i = 0; i < indent * depth && !rc; i++) rc = put_s(b, " ");
  return rc;
}

/* A list or a dict as JSON: its items (a dict's as "key": value) between
 * brackets, each on its own line when indenting. */
static int put_json_items(struct tk_jv_buf *b, struct tk_jv v, int indent, int depth) {
  int dict = v.kind == JV_DICT;
  size_t n = dict ? v.u.dict->n : v.u.list->n;
  if (!n) return put_s(b, dict ? "{}" : "[]");
  int rc = put_s(b, dict ? "{" : "[");
  for (size_t i = 0; i < n && !rc; i++) {
    if (i) rc = put_s(b, indent >= 0 ? "," : ", ");
    if (!rc && indent >= 0) rc = put_indent(b, indent, depth + 1);
    if (!rc && dict && !(rc = put_json_str(b, v.u.dict->keys[i], v.u.dict->klens[i])))
      rc = put_s(b, ": ");
    if (!rc) rc = tk_jv_tojson(b, dict ? v.u.dict->vals[i] : v.u.list->items[i], indent, depth + 1);
  }
  if (!rc && indent >= 0) rc = put_indent(b, indent, depth);
  return rc ? rc : put_s(b, dict ? "}" : "]");
}

int tk_jv_tojson(struct tk_jv_buf *b, struct tk_jv v, int indent, int depth) {
  if (depth > JK_MAX_DEPTH) return CM_ERR_DEPTH;
  switch (v.kind) {
  case JV_UNDEF:
  case JV_NONE: return put_s(b, "null");
  case JV_BOOL: return put_s(b, v.u.b ? "true" : "false");
  case JV_INT: return tk_jv_print(b, v);
  case JV_FLOAT: return put_float(b, v.u.f, 1);
  case JV_STR: return put_json_str(b, v.u.str.s, v.u.str.n);
  case JV_LIST:
  case JV_DICT: return put_json_items(b, v, indent, depth);
  case JV_FUNC:
  case JV_MACRO: return put_s(b, "null");
  }
  return 0;
}
