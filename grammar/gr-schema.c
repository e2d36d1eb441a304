/* gr-schema.c — JSON Schema (draft 2020-12 and older drafts' common forms) to
 * grammar. Each object- or array-shaped subschema, and each $ref target,
 * becomes a rule of its own (shared by every place that uses it, recursion
 * included); scalars are emitted inline. A keyword we cannot enforce is an
 * error naming it and its JSON pointer, never ignored; annotations are. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "grammar/gr-schema-impl.h"

int gr_sc_fail(struct sc *c, const char *path, const char *kw, const char *why) {
  if (why)
    return gr_nfa_fail(c->n, CM_ERR_INVAL, "json_schema: keyword '%s' at %s is not supported (%s)",
                       kw, path[0] ? path : "/", why);
  return gr_nfa_fail(c->n, CM_ERR_INVAL, "json_schema: keyword '%s' at %s is not supported", kw,
                     path[0] ? path : "/");
}

static void path_join(char *out, const char *path, const char *key) {
  size_t k = strlen(path);
  if (k >= SC_MAX_PATH - 2) {
    memcpy(out, path, k + 1);
    return;
  }
  memcpy(out, path, k);
  out[k++] = '/';
  for (const char *p = key; *p && k < SC_MAX_PATH - 3; p++) {
    if (*p == '~')
      out[k++] = '~', out[k++] = '0';
    else if (*p == '/')
      out[k++] = '~', out[k++] = '1';
    else
      out[k++] = *p;
  }
  out[k] = 0;
}

static void path_index(char *out, const char *path, const char *key, size_t i) {
  char num[24];
  path_join(out, path, key);
  snprintf(num, sizeof num, "%zu", i);
  char tmp[SC_MAX_PATH];
  memcpy(tmp, out, SC_MAX_PATH);
  path_join(out, tmp, num);
}

/* ---- keywords ------------------------------------------------------------ */
static const char *annotations[] = {
    "$schema",     "$id",      "$anchor",     "$comment",         "$defs",
    "definitions", "title",    "description", "examples",         "default",
    "deprecated",  "readOnly", "writeOnly",   "contentMediaType", "contentEncoding",
    "$vocabulary", NULL};
static const char *handled[] = {"type",
                                "properties",
                                "required",
                                "additionalProperties",
                                "items",
                                "prefixItems",
                                "additionalItems",
                                "minItems",
                                "maxItems",
                                "enum",
                                "const",
                                "anyOf",
                                "oneOf",
                                "allOf",
                                "$ref",
                                "minLength",
                                "maxLength",
                                "pattern",
                                "minimum",
                                "maximum",
                                "exclusiveMinimum",
                                "exclusiveMaximum",
                                "format",
                                "minProperties",
                                "maxProperties",
                                "multipleOf",
                                NULL};

static int in_list(const char *k, const char **list) {
  for (const char **p = list; *p; p++)
    if (strcmp(*p, k) == 0) return 1;
  return 0;
}

static int check_keywords(struct sc *c, const json_t *s, const char *path) {
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)s, k, v) {
    if (!in_list(k, annotations) && !in_list(k, handled)) return gr_sc_fail(c, path, k, NULL);
  }
  return 0;
}

/* 1 when s has a keyword other than annotations and those in `except`. */
static const char *other_keyword(const json_t *s, const char **except) {
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)s, k, v) {
    if (!in_list(k, annotations) && !in_list(k, except)) return k;
  }
  return NULL;
}

/* ---- subschemas ------------------------------------------------------------ */
static void emit(struct sc *c, const json_t *s, const char *path, uint32_t from, uint32_t to);

/* The rule of subschema s (made on first use; s's body emitted into it). */
static uint32_t rule_of(struct sc *c, const json_t *s, const char *path) {
  for (uint32_t i = 0; i < c->n_rules; i++)
    if (c->rules[i].schema == s) return c->rules[i].rule;
  if (c->n_rules >= SC_MAX_RULES) {
    gr_nfa_fail(c->n, CM_ERR_TOOBIG, "json_schema: more than %u subschemas", SC_MAX_RULES);
    return GR_NONE;
  }
  if (c->n_rules == c->cap_rules) {
    uint32_t cap = c->cap_rules ? c->cap_rules * 2 : 16;
    struct sc_rule *r = realloc(c->rules, cap * sizeof *r);
    if (!r) {
      gr_nfa_fail(c->n, CM_ERR_NOMEM, "json_schema: out of memory");
      return GR_NONE;
    }
    c->rules = r;
    c->cap_rules = cap;
  }
  uint32_t r = gr_nfa_rule(c->n);
  if (c->n->rc) return GR_NONE;
  c->rules[c->n_rules++] = (struct sc_rule){s, r};
  emit(c, s, path, c->n->rule_start[r], c->n->rule_final[r]);
  return r;
}

static const json_t *resolve_ref(struct sc *c, const json_t *ref, const char *path) {
  if (!json_is_string(ref)) return gr_sc_fail(c, path, "$ref", "not a string"), NULL;
  const char *p = json_string_value(ref);
  if (p[0] != '#') return gr_sc_fail(c, path, "$ref", "only local references (#...)"), NULL;
  const json_t *cur = c->root;
  p++;
  while (*p == '/') {
    p++;
    char key[256];
    size_t k = 0;
    while (*p && *p != '/' && k < sizeof key - 1) {
      if (p[0] == '~' && p[1] == '0')
        key[k++] = '~', p += 2;
      else if (p[0] == '~' && p[1] == '1')
        key[k++] = '/', p += 2;
      else
        key[k++] = *p++;
    }
    key[k] = 0;
    if (json_is_object(cur))
      cur = json_object_get(cur, key);
    else if (json_is_array(cur))
      cur = json_array_get(cur, (size_t)strtoul(key, NULL, 10));
    else
      cur = NULL;
    if (!cur) return gr_sc_fail(c, path, "$ref", "target not found"), NULL;
  }
  if (*p) return gr_sc_fail(c, path, "$ref", "only JSON pointers (#/...)"), NULL;
  return cur;
}

/* A subschema where a value goes: a call of its rule when it is an object or an
 * array (or a reference), inline otherwise. */
static void emit_value(struct sc *c, const json_t *s, const char *path, uint32_t from,
                       uint32_t to) {
  if (json_is_object(s)) {
    const json_t *t = json_object_get(s, "type");
    int big = json_object_get(s, "$ref") || json_object_get(s, "properties") ||
              json_object_get(s, "items") || json_object_get(s, "anyOf") ||
              json_object_get(s, "oneOf") || json_object_get(s, "allOf") ||
              json_object_get(s, "prefixItems") || json_object_get(s, "additionalProperties") ||
              (json_is_string(t) && (strcmp(json_string_value(t), "object") == 0 ||
                                     strcmp(json_string_value(t), "array") == 0));
    if (big) {
      uint32_t r = rule_of(c, s, path);
      if (r != GR_NONE) gr_nfa_call(c->n, from, to, r);
      return;
    }
  }
  emit(c, s, path, from, to);
}

/* An anyOf branch, inline: branches that start alike (objects, a union of
 * tools) then share their first states in one automaton instead of being as
 * many calls, each a stack of its own. A branch that is a reference is inlined
 * too, unless that reference is already being inlined (recursion). */
static void any_branch(struct sc *c, const json_t *b, const char *path, uint32_t from,
                       uint32_t to) {
  const json_t *ref = json_is_object(b) ? json_object_get(b, "$ref") : NULL;
  if (ref && !other_keyword(b, (const char *[]){"$ref", NULL})) {
    const json_t *t = resolve_ref(c, ref, path);
    if (!t) return;
    int busy = c->n_inlined >= SC_MAX_DEPTH;
    for (int i = 0; i < c->n_inlined && !busy; i++)
      busy = c->inlined[i] == t;
    if (busy || !json_is_object(t)) {
      emit_value(c, b, path, from, to);
      return;
    }
    char rp[SC_MAX_PATH];
    snprintf(rp, sizeof rp, "%s", json_string_value(ref) + 1);
    c->inlined[c->n_inlined++] = t;
    emit(c, t, rp, from, to);
    c->n_inlined--;
    return;
  }
  emit(c, b, path, from, to);
}

static void emit_array(struct sc *c, const json_t *s, const char *path, uint32_t from,
                       uint32_t to) {
  struct gr_nfa *n = c->n;
  json_t *prefix = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
  json_t *extra = json_object_get(s, "additionalItems");
  const char *prefix_kw = "prefixItems";
  if (json_is_array(items)) { /* the older drafts' tuple form */
    prefix = items;
    prefix_kw = "items";
    items = extra;
  } else if (extra) {
    return (void)gr_sc_fail(c, path, "additionalItems", "without an items array");
  }
  if (prefix && !json_is_array(prefix)) return (void)gr_sc_fail(c, path, prefix_kw, "not an array");
  size_t k = prefix ? json_array_size(prefix) : 0;
  json_t *mi = json_object_get(s, "minItems"), *ma = json_object_get(s, "maxItems");
  if ((mi && (!json_is_integer(mi) || json_integer_value(mi) < 0)) ||
      (ma && (!json_is_integer(ma) || json_integer_value(ma) < 0)))
    return (void)gr_sc_fail(c, path, mi ? "minItems" : "maxItems", "not a non-negative integer");
  long long min = mi ? json_integer_value(mi) : 0, max = ma ? json_integer_value(ma) : -1;
  int items_false = json_is_false(items);
  if (items_false && (max < 0 || max > (long long)k)) max = (long long)k;
  if (min > (long long)GR_MAX_REPEAT || max > (long long)GR_MAX_REPEAT) {
    gr_nfa_fail(n, CM_ERR_TOOBIG, "json_schema: minItems/maxItems at %s above %u",
                path[0] ? path : "/", GR_MAX_REPEAT);
    return;
  }
  if (max >= 0 && min > max) return; /* nothing: the caller sees a dead branch */
  uint32_t open = gr_nfa_state(n), close = gr_nfa_state(n);
  gr_nfa_byte(n, from, open, '[', '[');
  gr_nfa_byte(n, close, to, ']', ']');
  uint32_t body = gr_nfa_state(n);
  gr_json_ws(n, open, body);
  char ip[SC_MAX_PATH];
  path_join(ip, path, "items");
  /* cur: before element i (after '[' and whitespace, or after element i-1 and
   * whitespace); the first `unroll` positions are spelled out, then a loop */
  long long unroll = (long long)k > min ? (long long)k : min;
  uint32_t cur = body;
  for (long long i = 0; !n->rc; i++) {
    if (i >= min) gr_nfa_eps(n, cur, close);
    if ((max >= 0 && i >= max) || (i >= (long long)k && items_false)) break;
    uint32_t el = cur;
    if (i > 0) {
      uint32_t comma = gr_nfa_state(n);
      el = gr_nfa_state(n);
      gr_nfa_byte(n, cur, comma, ',', ',');
      gr_json_ws(n, comma, el);
    }
    uint32_t after = gr_nfa_state(n), next = gr_nfa_state(n);
    const json_t *es = i < (long long)k ? json_array_get(prefix, (size_t)i)
                       : items          ? items
                                        : json_true();
    char pp[SC_MAX_PATH];
    if (i < (long long)k)
      path_index(pp, path, prefix_kw, (size_t)i);
    else
      memcpy(pp, ip, sizeof pp);
    /* items (emitted at several positions) go through one rule; tuple items inline */
    if (i >= (long long)k && json_is_object(es) && (max < 0 || max - (long long)k > 1)) {
      uint32_t r = rule_of(c, es, pp);
      if (r != GR_NONE) gr_nfa_call(n, el, after, r);
    } else {
      emit_value(c, es, pp, el, after);
    }
    gr_json_ws(n, after, next);
    if (i >= (long long)k && i >= unroll && max < 0) {
      /* the open tail: more elements, each after a comma, back to next */
      uint32_t comma = gr_nfa_state(n), el2 = gr_nfa_state(n), after2 = gr_nfa_state(n);
      gr_nfa_byte(n, next, comma, ',', ',');
      gr_json_ws(n, comma, el2);
      if (json_is_object(es)) {
        uint32_t r = rule_of(c, es, pp);
        if (r != GR_NONE) gr_nfa_call(n, el2, after2, r);
      } else {
        emit_value(c, es, pp, el2, after2);
      }
      gr_json_ws(n, after2, next);
      gr_nfa_eps(n, next, close);
      break;
    }
    cur = next;
  }
}

static void comma_ws(struct gr_nfa *n, uint32_t from, uint32_t to) {
  uint32_t w = gr_nfa_state(n);
  gr_nfa_byte(n, from, w, ',', ',');
  gr_json_ws(n, w, to);
}

/* "key" : value, then whitespace (key NULL: any key) */
static void member(struct sc *c, const char *key, const char *const *except, size_t n_except,
                   const json_t *vs, const char *path, uint32_t from, uint32_t to, int call) {
  struct gr_nfa *n = c->n;
  uint32_t k1 = gr_nfa_state(n), v0 = gr_nfa_state(n), v1 = gr_nfa_state(n);
  if (key)
    gr_json_lit_string(n, from, k1, key, strlen(key));
  else
    gr_json_string_except(n, from, k1, except, n_except);
  gr_json_colon(n, k1, v0);
  if (call && json_is_object(vs)) { /* written many times: once, as a rule */
    uint32_t r = rule_of(c, vs, path);
    if (r != GR_NONE) gr_nfa_call(n, v0, v1, r);
  } else {
    emit_value(c, vs, path, v0, v1);
  }
  gr_json_ws(n, v1, to); /* before ',' or '}' */
}

#define SC_MAX_COUNT 32 /* minProperties / maxProperties counted up to this */

/* The count after one more member than k, counting up to K (K stands for "K
 * or more" when there is no maximum mxp); -1: no more may come. */
static long long count_after(long long k, long long K, long long mxp) {
  return k + 1 > K ? (mxp >= 0 ? -1 : K) : k + 1;
}

/* A new state where the member after k others begins: at `at` itself for the
 * first, after a comma and whitespace otherwise. */
static uint32_t member_begins(struct gr_nfa *n, uint32_t at, long long k) {
  uint32_t e = gr_nfa_state(n);
  if (k == 0)
    gr_nfa_eps(n, at, e);
  else
    comma_ws(n, at, e);
  return e;
}

/* An object whose members must be counted (minProperties / maxProperties
 * beyond what required and the listed properties give): states t[k] after k
 * members, the listed properties in order, then the others. */
static void object_counted(struct sc *c, const json_t *props, const json_t *req, const json_t *addl,
                           int open_addl, long long mnp, long long mxp, const char *path,
                           uint32_t open, uint32_t close) {
  struct gr_nfa *n = c->n;
  long long K = mxp >= 0 ? mxp : mnp; /* without a maximum the count stops at mnp */
  uint32_t t[SC_MAX_COUNT + 1], nx[SC_MAX_COUNT + 1];
  for (long long k = 0; k <= K; k++)
    t[k] = gr_nfa_state(n);
  gr_json_ws(n, open, t[0]);
  const char *key;
  json_t *ps;
  size_t np = json_object_size(props), i;
  json_object_foreach((json_t *)props, key, ps) {
    int required = 0;
    json_t *r;
    json_array_foreach(req, i, r) required |= strcmp(json_string_value(r), key) == 0;
    char pp[SC_MAX_PATH], pk[SC_MAX_PATH];
    path_join(pk, path, "properties");
    path_join(pp, pk, key);
    for (long long k = 0; k <= K; k++)
      nx[k] = gr_nfa_state(n);
    for (long long k = 0; k <= K && !n->rc; k++) {
      if (!required) gr_nfa_eps(n, t[k], nx[k]);
      long long k2 = count_after(k, K, mxp);
      if (k2 < 0) continue;
      uint32_t e = member_begins(n, t[k], k);
      member(c, key, NULL, 0, ps, pp, e, nx[k2], 1);
    }
    memcpy(t, nx, sizeof t);
  }
  if (open_addl) {
    char ap[SC_MAX_PATH];
    path_join(ap, path, "additionalProperties");
    const char **names = calloc(np ? np : 1, sizeof *names);
    if (!names) {
      gr_nfa_fail(n, CM_ERR_NOMEM, "json_schema: out of memory");
      return;
    }
    size_t k = 0;
    json_object_foreach((json_t *)props, key, ps) names[k++] = key;
    for (long long q = 0; q <= K && !n->rc; q++) {
      long long q2 = count_after(q, K, mxp);
      if (q2 < 0) continue;
      uint32_t e = member_begins(n, t[q], q);
      member(c, NULL, names, k, json_is_object(addl) ? addl : json_true(), ap, e, t[q2], 1);
    }
    free(names);
  }
  for (long long k = mnp; k <= K; k++)
    gr_nfa_eps(n, t[k], close);
}

static void emit_object(struct sc *c, const json_t *s, const char *path, uint32_t from,
                        uint32_t to) {
  struct gr_nfa *n = c->n;
  json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
  json_t *addl = json_object_get(s, "additionalProperties");
  if (props && !json_is_object(props))
    return (void)gr_sc_fail(c, path, "properties", "not an object");
  if (req && !json_is_array(req)) return (void)gr_sc_fail(c, path, "required", "not an array");
  if (addl && !json_is_boolean(addl) && !json_is_object(addl))
    return (void)gr_sc_fail(c, path, "additionalProperties", "not a boolean or schema");
  /* without 'properties', an object is open unless it says otherwise; with
   * them, only they may come unless additionalProperties says more */
  int open_addl = addl ? !json_is_false(addl) : !props;
  /* required names without a schema in 'properties' are properties of any value */
  size_t i;
  json_t *r;
  json_array_foreach(req, i, r) {
    if (!json_is_string(r)) return (void)gr_sc_fail(c, path, "required", "not an array of strings");
    if (props && json_object_get(props, json_string_value(r))) continue;
    json_t *np2 = props ? json_copy(props) : json_object();
    if (!np2) return (void)gr_nfa_fail(n, CM_ERR_NOMEM, "json_schema: out of memory");
    json_array_append_new(c->keep, np2);
    json_array_foreach(req, i, r) {
      if (json_is_string(r) && !json_object_get(np2, json_string_value(r)))
        json_object_set(np2, json_string_value(r), json_true());
    }
    props = np2;
    break;
  }
  size_t np = props ? json_object_size(props) : 0, nreq = json_array_size(req);
  json_t *minp = json_object_get(s, "minProperties"), *maxp = json_object_get(s, "maxProperties");
  if ((minp && (!json_is_integer(minp) || json_integer_value(minp) < 0)) ||
      (maxp && (!json_is_integer(maxp) || json_integer_value(maxp) < 0)))
    return (void)gr_sc_fail(c, path, minp ? "minProperties" : "maxProperties",
                            "not a non-negative integer");
  long long mnp = minp ? json_integer_value(minp) : 0, mxp = maxp ? json_integer_value(maxp) : -1;
  int counted = (size_t)mnp > nreq || (mxp >= 0 && (open_addl || (size_t)mxp < np));
  if (counted && (mnp > SC_MAX_COUNT || mxp > SC_MAX_COUNT))
    return (void)gr_sc_fail(c, path, mnp > SC_MAX_COUNT ? "minProperties" : "maxProperties",
                            "counts above 32");
  if (counted && !open_addl && (size_t)mnp > np) return; /* nothing satisfies it */
  uint32_t open = gr_nfa_state(n), close = gr_nfa_state(n);
  gr_nfa_byte(n, from, open, '{', '{');
  if (counted) {
    gr_nfa_byte(n, close, to, '}', '}');
    object_counted(c, props ? props : json_object_get(s, "properties"), req, addl, open_addl, mnp,
                   mxp, path, open, close);
    return;
  }
  gr_nfa_byte(n, close, to, '}', '}');
  /* two tracks: t0 (nothing written yet), t1 (something written: a comma first) */
  uint32_t t0 = gr_nfa_state(n), t1 = gr_nfa_state(n);
  gr_json_ws(n, open, t0);
  int t1_live = 0;
  const char *key;
  json_t *ps;
  json_object_foreach(props, key, ps) {
    int required = 0;
    json_array_foreach(req, i, r) {
      if (strcmp(json_string_value(r), key) == 0) required = 1;
    }
    char pp[SC_MAX_PATH], pk[SC_MAX_PATH];
    path_join(pk, path, "properties");
    path_join(pp, pk, key);
    uint32_t n0 = gr_nfa_state(n), n1 = gr_nfa_state(n), k0 = gr_nfa_state(n);
    /* the member, written once: first (from t0) or after a comma (from t1) */
    gr_nfa_eps(n, t0, k0);
    if (t1_live) comma_ws(n, t1, k0);
    member(c, key, NULL, 0, ps, pp, k0, n1, 0);
    if (!required) {
      gr_nfa_eps(n, t0, n0);
      if (t1_live) gr_nfa_eps(n, t1, n1);
    }
    t0 = n0;
    t1 = n1;
    t1_live = 1;
    if (required) t0 = gr_nfa_state(n); /* nothing written past a required one: dead */
  }
  if (open_addl) {
    char ap[SC_MAX_PATH];
    path_join(ap, path, "additionalProperties");
    uint32_t a1 = gr_nfa_state(n), k0 = gr_nfa_state(n);
    gr_nfa_eps(n, t0, k0);
    if (t1_live) comma_ws(n, t1, k0);
    comma_ws(n, a1, k0);
    /* the other members' names are not the listed ones (a repeated name would
     * be read as the listed property's value) */
    const char **names = calloc(np ? np : 1, sizeof *names);
    if (!names) {
      gr_nfa_fail(n, CM_ERR_NOMEM, "json_schema: out of memory");
      return;
    }
    size_t k = 0;
    json_object_foreach(props, key, ps) names[k++] = key;
    member(c, NULL, names, k, json_is_object(addl) ? addl : json_true(), ap, k0, a1, 0);
    free(names);
    gr_nfa_eps(n, a1, close);
  }
  gr_nfa_eps(n, t0, close);
  if (t1_live) gr_nfa_eps(n, t1, close);
}

static int type_mask_of(struct sc *c, const json_t *s, const char *path, unsigned *mask);

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_NUM = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64 };

static const char *type_names[] = {"null",   "boolean", "integer", "number",
                                   "string", "array",   "object"};

static int type_mask_of(struct sc *c, const json_t *s, const char *path, unsigned *mask) {
  json_t *t = json_object_get(s, "type");
  *mask = 0;
  if (!t) {
    /* no type: the types the keywords speak of, or any value */
    if (json_object_get(s, "properties") || json_object_get(s, "required") ||
        json_object_get(s, "additionalProperties") || json_object_get(s, "minProperties") ||
        json_object_get(s, "maxProperties"))
      *mask |= T_OBJ;
    if (json_object_get(s, "items") || json_object_get(s, "prefixItems") ||
        json_object_get(s, "minItems") || json_object_get(s, "maxItems"))
      *mask |= T_ARR;
    if (json_object_get(s, "minLength") || json_object_get(s, "maxLength") ||
        json_object_get(s, "pattern") || json_object_get(s, "format"))
      *mask |= T_STR;
    if (json_object_get(s, "minimum") || json_object_get(s, "maximum") ||
        json_object_get(s, "exclusiveMinimum") || json_object_get(s, "exclusiveMaximum") ||
        json_object_get(s, "multipleOf"))
      *mask |= T_NUM;
    if (!*mask) *mask = 127;
    return 0;
  }
  const json_t *list = t;
  json_t *one = NULL;
  if (json_is_string(t)) {
    one = json_array();
    json_array_append((json_t *)one, (json_t *)t);
    list = one;
  }
  if (!json_is_array(list)) return gr_sc_fail(c, path, "type", "not a string or an array");
  size_t i;
  json_t *v;
  json_array_foreach(list, i, v) {
    int found = 0;
    for (int k = 0; k < 7; k++)
      if (json_is_string(v) && strcmp(json_string_value(v), type_names[k]) == 0)
        *mask |= 1u << k, found = 1;
    if (!found) {
      json_decref(one);
      return gr_sc_fail(c, path, "type", "unknown type name");
    }
  }
  json_decref(one);
  if ((*mask & T_NUM) && (*mask & T_INT)) *mask &= ~(unsigned)T_INT; /* number covers it */
  return 0;
}

static int value_has_type(const json_t *v, unsigned mask) {
  if (json_is_null(v)) return mask & T_NULL;
  if (json_is_boolean(v)) return mask & T_BOOL;
  if (json_is_integer(v)) return mask & (T_INT | T_NUM);
  if (json_is_real(v))
    return (mask & T_NUM) || ((mask & T_INT) && json_real_value(v) == floor(json_real_value(v)));
  if (json_is_string(v)) return mask & T_STR;
  if (json_is_array(v)) return mask & T_ARR;
  return mask & T_OBJ;
}

/* An enum / const value: scalars as JSON writes them (compact), arrays and
 * objects with whitespace wherever JSON allows it (bounded as everywhere),
 * members in the order the schema gives them. */
static void emit_literal(struct sc *c, const json_t *v, uint32_t from, uint32_t to) {
  struct gr_nfa *n = c->n;
  if (json_is_array(v) || json_is_object(v)) {
    int obj = json_is_object(v);
    uint32_t cur = gr_nfa_state(n), w = gr_nfa_state(n);
    gr_nfa_byte(n, from, cur, obj ? '{' : '[', obj ? '{' : '[');
    gr_json_ws(n, cur, w);
    cur = w;
    void *it = obj ? json_object_iter((json_t *)v) : NULL;
    for (size_t i = 0; obj ? it != NULL : i < json_array_size(v); i++) {
      if (i) {
        w = gr_nfa_state(n);
        comma_ws(n, cur, w);
        cur = w;
      }
      if (obj) {
        const char *key = json_object_iter_key(it);
        uint32_t k = gr_nfa_state(n);
        gr_json_lit_string(n, cur, k, key, strlen(key));
        cur = gr_nfa_state(n);
        gr_json_colon(n, k, cur);
      }
      uint32_t e = gr_nfa_state(n);
      emit_literal(c, obj ? json_object_iter_value(it) : json_array_get(v, i), cur, e);
      cur = gr_nfa_state(n);
      gr_json_ws(n, e, cur);
      if (obj) it = json_object_iter_next((json_t *)v, it);
    }
    gr_nfa_byte(n, cur, to, obj ? '}' : ']', obj ? '}' : ']');
    return;
  }
  char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
  if (!t) {
    gr_nfa_fail(n, CM_ERR_NOMEM, "json_schema: out of memory");
    return;
  }
  gr_nfa_lit(n, from, to, t, strlen(t));
  free(t);
}

/* allOf: the branches merged into one schema (properties joined, required
 * joined, any other keyword must agree). NULL and an error when they cannot. */
static json_t *merge_all_of(struct sc *c, const json_t *s, const char *path) {
  json_t *all = json_object_get(s, "allOf");
  if (!json_is_array(all) || json_array_size(all) == 0)
    return gr_sc_fail(c, path, "allOf", "not a non-empty array"), NULL;
  json_t *m = json_deep_copy(s);
  json_object_del(m, "allOf");
  size_t i;
  json_t *b;
  json_array_foreach(all, i, b) {
    char bp[SC_MAX_PATH];
    path_index(bp, path, "allOf", i);
    const json_t *br = b;
    int guard = 0;
    while (json_is_object(br) && json_object_get(br, "$ref") && guard++ < 16) {
      const char *o = other_keyword(br, (const char *[]){"$ref", NULL});
      if (o) {
        json_decref(m);
        return gr_sc_fail(c, bp, o, "next to '$ref' inside allOf"), NULL;
      }
      br = resolve_ref(c, json_object_get(br, "$ref"), bp);
      if (!br) {
        json_decref(m);
        return NULL;
      }
    }
    if (json_is_true(br)) continue;
    if (!json_is_object(br) || json_object_get(br, "allOf")) {
      json_decref(m);
      return gr_sc_fail(c, bp, "allOf", "only object schemas are merged"), NULL;
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)br, k, v) {
      if (in_list(k, annotations)) continue;
      json_t *have = json_object_get(m, k);
      if (strcmp(k, "properties") == 0 && json_is_object(v)) {
        if (!have) {
          json_object_set_new(m, k, json_deep_copy(v));
          continue;
        }
        const char *pk;
        json_t *pv;
        json_object_foreach(v, pk, pv) {
          json_t *h = json_object_get(have, pk);
          if (h && !json_equal(h, pv)) {
            json_decref(m);
            return gr_sc_fail(c, bp, "allOf", "the same property with two schemas"), NULL;
          }
          if (!h) json_object_set(have, pk, pv);
        }
      } else if (strcmp(k, "required") == 0 && json_is_array(v)) {
        if (!have) {
          json_object_set_new(m, k, json_deep_copy(v));
          continue;
        }
        size_t j;
        json_t *rv;
        json_array_foreach(v, j, rv) {
          size_t q;
          json_t *hv;
          int dup = 0;
          json_array_foreach(have, q, hv) dup |= json_equal(hv, rv);
          if (!dup) json_array_append(have, rv);
        }
      } else if (!have) {
        json_object_set(m, k, v);
      } else if (!json_equal(have, v)) {
        json_decref(m);
        return gr_sc_fail(c, bp, k, "allOf branches disagree on it"), NULL;
      }
    }
  }
  /* additionalProperties (other than true) in one part sees only that part's
   * properties: merged, it must still list every property */
  json_t *mp = json_object_get(m, "properties");
  for (size_t q = 0; q <= json_array_size(all); q++) {
    const json_t *part = q == 0 ? s : json_array_get(all, q - 1);
    int guard = 0;
    while (json_is_object(part) && json_object_get(part, "$ref") && guard++ < 16)
      part = resolve_ref(c, json_object_get(part, "$ref"), path);
    json_t *ap = json_is_object(part) ? json_object_get(part, "additionalProperties") : NULL;
    if (!ap || json_is_true(ap)) continue;
    json_t *own = json_object_get(part, "properties");
    const char *pk;
    json_t *pv;
    json_object_foreach(mp, pk, pv) {
      if (!own || !json_object_get(own, pk)) {
        json_decref(m);
        return gr_sc_fail(c, path, "additionalProperties",
                          "in allOf, where other parts add properties"),
               NULL;
      }
    }
  }
  json_array_append_new(c->keep, m);
  return m;
}

/* ---- oneOf: branches that no value can match twice ----------------------- */

/* What a branch may be, to tell branches apart: its types and, when it lists
 * them (enum / const), its values. */
struct shape {
  const json_t *s; /* the branch (an object schema), or NULL for true / false */
  unsigned types;  /* T_* (integers counted as numbers too) */
  const json_t *lits;
  json_t *one; /* lits made from a const, owned */
  int none;    /* false: matches nothing */
};

static unsigned value_type(const json_t *v) {
  return json_is_null(v)      ? T_NULL
         : json_is_boolean(v) ? T_BOOL
         : json_is_integer(v) ? T_INT | T_NUM
         : json_is_real(v)    ? T_NUM
         : json_is_string(v)  ? T_STR
         : json_is_array(v)   ? T_ARR
                              : T_OBJ;
}

static int shape_of(struct sc *c, const json_t *b, const char *path, struct shape *sh) {
  memset(sh, 0, sizeof *sh);
  for (int guard = 0; json_is_object(b) && json_object_get(b, "$ref") && guard < 16; guard++) {
    if (other_keyword(b, (const char *[]){"$ref", NULL})) break;
    if (!(b = resolve_ref(c, json_object_get(b, "$ref"), path))) return -1;
  }
  if (json_is_boolean(b)) {
    sh->none = json_is_false(b);
    sh->types = 127;
    return 0;
  }
  if (!json_is_object(b)) return 0; /* emit says what is wrong */
  sh->s = b;
  if (json_object_get(b, "anyOf") || json_object_get(b, "oneOf") || json_object_get(b, "allOf") ||
      json_object_get(b, "$ref")) {
    sh->types = 127; /* not looked into */
    return 0;
  }
  if (type_mask_of(c, b, path, &sh->types)) return -1;
  if (sh->types & T_NUM) sh->types |= T_INT;
  const json_t *en = json_object_get(b, "enum"), *cn = json_object_get(b, "const");
  if (cn) {
    sh->lits = sh->one = json_pack("[O]", cn);
    if (!sh->one) return gr_nfa_fail(c->n, CM_ERR_NOMEM, "json_schema: out of memory");
  } else if (json_is_array(en)) {
    sh->lits = en;
  }
  if (sh->lits) {
    unsigned t = 0;
    size_t i;
    const json_t *v;
    json_array_foreach(sh->lits, i, v) t |= value_type(v);
    sh->types &= t;
  }
  return 0;
}

/* Whether object schema s allows a member named key. */
static int allows_member(const json_t *s, const char *key) {
  const json_t *props = json_object_get(s, "properties"), *addl;
  if (props && json_object_get(props, key)) return 1;
  addl = json_object_get(s, "additionalProperties");
  return addl ? !json_is_false(addl) : !props; /* emit_object's default */
}

/* The literal values a member `key` of s may take, or NULL: any. */
static const json_t *member_lits(const json_t *s, const char *key, json_t **own) {
  const json_t *p = json_object_get(json_object_get(s, "properties"), key);
  *own = NULL;
  if (!json_is_object(p)) return NULL;
  if (json_object_get(p, "const")) return *own = json_pack("[O]", json_object_get(p, "const"));
  const json_t *en = json_object_get(p, "enum");
  return json_is_array(en) ? en : NULL;
}

static int lits_disjoint(const json_t *a, const json_t *b) {
  size_t i, j;
  const json_t *x, *y;
  json_array_foreach(a, i, x) json_array_foreach(b, j, y) if (json_equal(x, y)) return 0;
  return 1;
}

static int is_required(const json_t *s, const char *key) {
  size_t i;
  const json_t *r;
  json_array_foreach(json_object_get(s, "required"), i,
                     r) if (json_is_string(r) && !strcmp(json_string_value(r), key)) return 1;
  return 0;
}

/* Objects of a and b can never be the same value: a member one requires the
 * other does not allow, or one both require with literal values apart. */
static int objects_disjoint(const json_t *a, const json_t *b) {
  for (int k = 0; k < 2; k++) {
    const json_t *x = k ? b : a, *y = k ? a : b;
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(x, "required"), i, r) {
      if (!json_is_string(r)) continue;
      const char *key = json_string_value(r);
      if (!allows_member(y, key)) return 1;
      if (!is_required(y, key)) continue;
      json_t *o1, *o2;
      const json_t *l1 = member_lits(x, key, &o1), *l2 = member_lits(y, key, &o2);
      int apart = l1 && l2 && lits_disjoint(l1, l2);
      json_decref(o1);
      json_decref(o2);
      if (apart) return 1;
    }
  }
  return 0;
}

static int shapes_disjoint(const struct shape *a, const struct shape *b) {
  if (a->none || b->none || !(a->types & b->types)) return 1;
  if (a->lits && b->lits) return lits_disjoint(a->lits, b->lits);
  for (int k = 0; k < 2; k++) {
    const struct shape *x = k ? b : a, *y = k ? a : b;
    if (!x->lits || y->lits) continue;
    size_t i;
    const json_t *v;
    int any = 0;
    json_array_foreach(x->lits, i, v) any |= (value_type(v) & y->types) != 0;
    if (!any) return 1;
  }
  return (a->types & b->types) == T_OBJ && a->s && b->s && objects_disjoint(a->s, b->s);
}

/* oneOf is enforced as anyOf, which is the same language only where no value
 * matches two branches: refused unless every pair of branches is told apart
 * by type, by enum / const values, or (objects) by a required member that the
 * other branch does not allow or that both require with different values.
 * branches[n] are the branches as emitted (merged with the keywords beside). */
static int one_of_disjoint(struct sc *c, const json_t *const *branches, size_t n,
                           const char *path) {
  struct shape *sh = calloc(n, sizeof *sh);
  if (!sh) return gr_nfa_fail(c->n, CM_ERR_NOMEM, "json_schema: out of memory");
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++)
    rc = shape_of(c, branches[i], path, &sh[i]);
  for (size_t i = 0; i < n && !rc; i++)
    for (size_t j = i + 1; j < n && !rc; j++)
      if (!shapes_disjoint(&sh[i], &sh[j])) {
        char why[160];
        snprintf(why, sizeof why,
                 "branches %zu and %zu may both match a value; anyOf, or branches told apart "
                 "by type, enum / const or a required member",
                 i, j);
        rc = gr_sc_fail(c, path, "oneOf", why);
      }
  for (size_t i = 0; i < n; i++)
    json_decref(sh[i].one);
  free(sh);
  return rc ? rc : c->n->rc;
}

static void emit(struct sc *c, const json_t *s, const char *path, uint32_t from, uint32_t to) {
  struct gr_nfa *n = c->n;
  if (n->rc) return;
  if (json_is_true(s)) {
    uint32_t r = gr_json_value_rule(n, NULL);
    if (r != GR_NONE) gr_nfa_call(n, from, to, r);
    return;
  }
  if (json_is_false(s)) return;
  if (!json_is_object(s)) {
    gr_nfa_fail(n, CM_ERR_INVAL, "json_schema: the schema at %s is not an object or a boolean",
                path[0] ? path : "/");
    return;
  }
  if (++c->depth > SC_MAX_DEPTH) {
    gr_nfa_fail(n, CM_ERR_TOOBIG, "json_schema: subschemas nested deeper than %d at %s",
                SC_MAX_DEPTH, path[0] ? path : "/");
    return;
  }
  if (check_keywords(c, s, path)) goto out;
  if (json_object_get(s, "allOf")) {
    json_t *m = merge_all_of(c, s, path);
    if (m) emit(c, m, path, from, to);
    goto out;
  }
  json_t *ref = json_object_get(s, "$ref");
  if (ref) {
    const char *o = other_keyword(s, (const char *[]){"$ref", NULL});
    if (o) { /* keywords next to $ref apply too: allOf [the rest, the reference] */
      json_t *rest = json_deep_copy(s);
      json_t *both = rest ? json_pack("{s:[o,{s:O}]}", "allOf", rest, "$ref", ref) : NULL;
      if (!both) {
        gr_nfa_fail(n, CM_ERR_NOMEM, "json_schema: out of memory");
        goto out;
      }
      json_object_del(rest, "$ref");
      json_array_append_new(c->keep, both);
      emit(c, both, path, from, to);
      goto out;
    }
    const json_t *t = resolve_ref(c, ref, path);
    if (!t) goto out;
    char rp[SC_MAX_PATH];
    snprintf(rp, sizeof rp, "%s", json_string_value(ref) + 1);
    if (json_is_boolean(t)) {
      emit(c, t, rp, from, to);
      goto out;
    }
    uint32_t r = rule_of(c, t, rp);
    if (r != GR_NONE) gr_nfa_call(n, from, to, r);
    goto out;
  }
  json_t *any = json_object_get(s, "anyOf");
  const char *any_kw = "anyOf";
  if (!any) any = json_object_get(s, "oneOf"), any_kw = "oneOf";
  if (any) {
    if (json_object_get(s, "anyOf") && json_object_get(s, "oneOf")) {
      gr_sc_fail(c, path, "oneOf", "next to anyOf");
      goto out;
    }
    if (!json_is_array(any) || json_array_size(any) == 0) {
      gr_sc_fail(c, path, any_kw, "not a non-empty array");
      goto out;
    }
    /* keywords next to anyOf apply to every branch: each branch becomes
     * allOf [the rest, the branch], merged */
    const char *o = other_keyword(s, (const char *[]){"anyOf", "oneOf", NULL});
    json_t *rest = NULL;
    if (o) {
      rest = json_deep_copy(s);
      if (!rest) {
        gr_nfa_fail(n, CM_ERR_NOMEM, "json_schema: out of memory");
        goto out;
      }
      json_object_del(rest, any_kw);
      json_array_append_new(c->keep, rest);
    }
    size_t i, nb = json_array_size(any);
    json_t *b;
    if (!strcmp(any_kw, "oneOf")) { /* the branches as they will be, checked apart first */
      const json_t **br = calloc(nb, sizeof *br);
      if (!br) {
        gr_nfa_fail(n, CM_ERR_NOMEM, "json_schema: out of memory");
        goto out;
      }
      json_array_foreach(any, i, b) {
        char bp[SC_MAX_PATH];
        path_index(bp, path, any_kw, i);
        json_t *both = rest ? json_pack("{s:[O,O]}", "allOf", rest, b) : NULL;
        if (both) json_array_append_new(c->keep, both);
        br[i] = rest ? (both ? merge_all_of(c, both, bp) : NULL) : b;
        if (rest && br[i]) json_array_append_new(c->keep, (json_t *)br[i]);
        if (!br[i] && !n->rc) gr_nfa_fail(n, CM_ERR_NOMEM, "json_schema: out of memory");
        if (n->rc) break;
      }
      int rc = n->rc ? n->rc : one_of_disjoint(c, br, nb, path);
      free(br);
      if (rc) goto out;
    }
    json_array_foreach(any, i, b) {
      char bp[SC_MAX_PATH];
      path_index(bp, path, any_kw, i);
      if (!rest) {
        any_branch(c, b, bp, from, to);
        continue;
      }
      json_t *both = json_pack("{s:[O,O]}", "allOf", rest, b);
      if (!both) {
        gr_nfa_fail(n, CM_ERR_NOMEM, "json_schema: out of memory");
        goto out;
      }
      json_array_append_new(c->keep, both);
      emit(c, both, bp, from, to);
    }
    goto out;
  }
  unsigned mask;
  if (type_mask_of(c, s, path, &mask)) goto out;
  json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
  if (en || cn) {
    const char *o = other_keyword(s, (const char *[]){"enum", "const", "type", NULL});
    if (o) {
      gr_sc_fail(c, path, o, "next to enum / const");
      goto out;
    }
    if (en && !json_is_array(en)) {
      gr_sc_fail(c, path, "enum", "not an array");
      goto out;
    }
    size_t i;
    json_t *v;
    json_array_foreach(en, i, v) {
      if (value_has_type(v, mask) && (!cn || json_equal(v, cn))) emit_literal(c, v, from, to);
    }
    if (cn && !en && value_has_type(cn, mask)) emit_literal(c, cn, from, to);
    goto out;
  }
  for (int k = 0; k < 7 && !n->rc; k++) {
    if (!(mask & (1u << k))) continue;
    switch (1u << k) {
    case T_NULL: gr_nfa_lit(n, from, to, "null", 4); break;
    case T_BOOL:
      gr_nfa_lit(n, from, to, "true", 4);
      gr_nfa_lit(n, from, to, "false", 5);
      break;
    case T_INT: gr_sc_numeric(c, s, path, 1, from, to); break;
    case T_NUM: gr_sc_numeric(c, s, path, 0, from, to); break;
    case T_STR: gr_sc_string(c, s, path, from, to); break;
    case T_ARR: emit_array(c, s, path, from, to); break;
    case T_OBJ: emit_object(c, s, path, from, to); break;
    }
  }
out:
  c->depth--;
}

int gr_schema_build(struct gr_nfa *n, const char *text, size_t len) {
  json_error_t je;
  json_t *root = json_loadb(text, len, JSON_DECODE_ANY, &je);
  if (!root)
    return gr_nfa_fail(n, CM_ERR_INVAL, "json_schema: invalid JSON at %d: %s", je.position,
                       je.text);
  struct sc c = {.n = n, .root = root, .keep = json_array()};
  uint32_t r = gr_nfa_rule(n); /* rule 0: the root */
  if (!n->rc) {
    if (json_is_object(root) || json_is_boolean(root)) {
      c.rules = malloc(16 * sizeof *c.rules);
      c.cap_rules = c.rules ? 16 : 0;
      emit(&c, root, "", n->rule_start[r], n->rule_final[r]);
    } else {
      gr_nfa_fail(n, CM_ERR_INVAL, "json_schema: the schema is not an object or a boolean");
    }
  }
  free(c.rules);
  json_decref(c.keep);
  json_decref(root);
  return n->rc;
}
