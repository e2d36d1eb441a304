/* fe-g4-gram.c — a GBNF grammar for tool calls in Gemma 4's notation, built
 * from the tools' parameter schemas (see fe-g4.h): what tool_choice "required"
 * or a named tool enforces on a checkpoint with Gemma 4's tool tokens. Values
 * are written the way Gemma 4's chat template writes arguments: strings between
 * <|"|> tokens, bare keys in sorted order, no spaces. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "frontend/fe-g4.h"
#include "frontend/fe-http-buf.h"

#define MAX_DEPTH 16 /* nested schemas written out; deeper ones take any value */

struct gb {
  struct fe_buf *rules; /* the rules made so far */
  int n;                /* rules made: their names are v0, v1, ... */
  int32_t quote;        /* the <|"|> token */
};

static void lit(struct fe_buf *b, const char *s, size_t n) {
  fe_buf_puts(b, "\"");
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\')
      fe_buf_printf(b, "\\%c", c);
    else if (c < 0x20)
      fe_buf_printf(b, "\\x%02x", c);
    else
      fe_buf_append(b, &s[i], 1);
  }
  fe_buf_puts(b, "\"");
}

/* The fixed rules every grammar has: any value of the notation. */
static void base_rules(struct gb *g) {
  struct fe_buf *b = g->rules;
  fe_buf_printf(b, "str ::= <[%d]> [^\\x00]* <[%d]>\n", (int)g->quote, (int)g->quote);
  fe_buf_puts(b, "int ::= \"-\"? (\"0\" | [1-9] [0-9]{0,17})\n"
                 "num ::= int (\".\" [0-9]{1,17})? ([eE] [-+]? [0-9]{1,3})?\n"
                 "bool ::= \"true\" | \"false\"\n"
                 "key ::= [a-zA-Z_] [a-zA-Z0-9_]{0,63}\n"
                 "any ::= str | num | bool | \"null\" | anyobj | anyarr\n"
                 "anyobj ::= \"{\" (key \":\" any (\",\" key \":\" any)*)? \"}\"\n"
                 "anyarr ::= \"[\" (any (\",\" any)*)? \"]\"\n");
}

static int value(struct gb *g, const json_t *s, int depth);

/* A scalar JSON value as the notation writes it (enum, const). */
static void scalar(struct gb *g, struct fe_buf *b, const json_t *v) {
  if (json_is_string(v)) {
    fe_buf_printf(b, "<[%d]> ", (int)g->quote);
    lit(b, json_string_value(v), json_string_length(v));
    fe_buf_printf(b, " <[%d]>", (int)g->quote);
  } else if (json_is_true(v) || json_is_false(v) || json_is_null(v) || json_is_number(v)) {
    char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    lit(b, t ? t : "null", t ? strlen(t) : 4);
    free(t);
  } else {
    fe_buf_puts(b, "any");
  }
}

/* An object with properties: the present keys in sorted order, the required
 * ones always, separated by commas. Rule names: the chain's rules. */
static int object(struct gb *g, const json_t *s, int depth) {
  const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
  size_t n = json_object_size(props);
  if (!n) return -1;
  const char **keys = calloc(n, sizeof(*keys));
  int *need = calloc(n, sizeof(*need)), *vals = calloc(n, sizeof(*vals));
  int id = -1;
  if (!keys || !need || !vals) goto done;
  size_t k = 0;
  const char *key;
  json_t *sub;
  json_object_foreach((json_t *)props, key, sub) keys[k++] = key;
  for (size_t i = 1; i < n; i++) /* sorted, as the template's dictsort */
    for (size_t j = i; j > 0 && strcmp(keys[j - 1], keys[j]) > 0; j--) {
      const char *t = keys[j];
      keys[j] = keys[j - 1], keys[j - 1] = t;
    }
  for (size_t i = 0; i < n; i++) {
    for (size_t r = 0; r < json_array_size(req); r++)
      if (json_is_string(json_array_get(req, r)) &&
          !strcmp(json_string_value(json_array_get(req, r)), keys[i]))
        need[i] = 1;
    vals[i] = value(g, json_object_get(props, keys[i]), depth + 1);
  }
  /* c<i>f (first) and c<i>n (after a key): the keys from i on */
  int base = g->n;
  g->n += 2 * (int)n + 2;
  struct fe_buf *b = g->rules;
  for (size_t i = 0; i <= n; i++)
    for (int first = 1; first >= 0; first--) {
      fe_buf_printf(b, "v%d ::= ", base + 2 * (int)i + first);
      if (i == n) {
        fe_buf_puts(b, "\"\"\n");
        continue;
      }
      if (!first) fe_buf_puts(b, "\",\" ");
      lit(b, keys[i], strlen(keys[i]));
      fe_buf_puts(b, " \":\" ");
      if (vals[i] < 0)
        fe_buf_puts(b, "any");
      else
        fe_buf_printf(b, "v%d", vals[i]);
      fe_buf_printf(b, " v%d", base + 2 * (int)(i + 1));
      if (!need[i]) fe_buf_printf(b, " | v%d", base + 2 * (int)(i + 1) + first);
      fe_buf_puts(b, "\n");
    }
  id = g->n++;
  fe_buf_printf(b, "v%d ::= \"{\" v%d \"}\"\n", id, base + 1);
done:
  free(keys);
  free(need);
  free(vals);
  return id;
}

/* One alternative of a schema of one type. -1 for any value. */
static int typed(struct gb *g, const json_t *s, const char *type, int depth) {
  struct fe_buf *b = g->rules;
  int id;
  if (!strcmp(type, "string")) {
    const json_t *lo = json_object_get(s, "minLength"), *hi = json_object_get(s, "maxLength");
    if (!json_is_integer(lo) && !json_is_integer(hi)) return -2;
    json_int_t a = json_is_integer(lo) ? json_integer_value(lo) : 0;
    id = g->n++;
    fe_buf_printf(b, "v%d ::= <[%d]> [^\\x00]{%d,", id, (int)g->quote,
                  (int)(a < 0       ? 0
                        : a > 10000 ? 10000
                                    : a));
    if (json_is_integer(hi))
      fe_buf_printf(b, "%d",
                    (int)(json_integer_value(hi) < a       ? a
                          : json_integer_value(hi) > 10000 ? 10000
                                                           : json_integer_value(hi)));
    fe_buf_printf(b, "} <[%d]>\n", (int)g->quote);
    return id;
  }
  if (!strcmp(type, "integer")) return -3;
  if (!strcmp(type, "number")) return -4;
  if (!strcmp(type, "boolean")) return -5;
  if (!strcmp(type, "null")) return -6;
  if (!strcmp(type, "object")) {
    id = object(g, s, depth);
    return id >= 0 ? id : -7;
  }
  if (!strcmp(type, "array")) {
    const json_t *items = json_object_get(s, "items");
    int it = json_is_object(items) ? value(g, items, depth + 1) : -1;
    id = g->n++;
    char iname[24];
    snprintf(iname, sizeof(iname), it < 0 ? "any" : "v%d", it);
    fe_buf_printf(b, "v%d ::= \"[\" (%s (\",\" %s)*)? \"]\"\n", id, iname, iname);
    return id;
  }
  return -1;
}

static const char *named(int v) {
  switch (v) {
  case -2: return "str";
  case -3: return "int";
  case -4: return "num";
  case -5: return "bool";
  case -6: return "\"null\"";
  case -7: return "anyobj";
  default: return "any";
  }
}

/* A rule for schema s: its number, or -1 (any value). */
static int value(struct gb *g, const json_t *s, int depth) {
  if (!json_is_object(s) || depth > MAX_DEPTH) return -1;
  struct fe_buf alts;
  fe_buf_init(&alts, 0);
  const json_t *en = json_object_get(s, "enum"), *cst = json_object_get(s, "const");
  const json_t *any = json_object_get(s, "anyOf");
  if (!any) any = json_object_get(s, "oneOf");
  const json_t *ty = json_object_get(s, "type");
  if (cst) {
    scalar(g, &alts, cst);
  } else if (json_is_array(en) && json_array_size(en)) {
    for (size_t i = 0; i < json_array_size(en); i++) {
      if (i) fe_buf_puts(&alts, " | ");
      scalar(g, &alts, json_array_get(en, i));
    }
  } else if (json_is_array(any) && json_array_size(any)) {
    for (size_t i = 0; i < json_array_size(any); i++) {
      int v = value(g, json_array_get(any, i), depth + 1);
      if (i) fe_buf_puts(&alts, " | ");
      if (v >= 0)
        fe_buf_printf(&alts, "v%d", v);
      else
        fe_buf_puts(&alts, "any");
    }
  } else if (json_is_string(ty) || json_is_array(ty)) {
    size_t nt = json_is_string(ty) ? 1 : json_array_size(ty);
    for (size_t i = 0; i < nt; i++) {
      const json_t *t = json_is_string(ty) ? ty : json_array_get(ty, i);
      int v = json_is_string(t) ? typed(g, s, json_string_value(t), depth) : -1;
      if (i) fe_buf_puts(&alts, " | ");
      if (v >= 0)
        fe_buf_printf(&alts, "v%d", v);
      else
        fe_buf_puts(&alts, named(v));
    }
  } else if (json_object_get(s, "properties")) {
    int v = typed(g, s, "object", depth);
    if (v >= 0)
      fe_buf_printf(&alts, "v%d", v);
    else
      fe_buf_puts(&alts, named(v));
  } else {
    fe_buf_free(&alts);
    return -1;
  }
  int id = g->n++;
  fe_buf_printf(g->rules, "v%d ::= %s\n", id, alts.data ? alts.data : "any");
  if (alts.err) g->rules->err = alts.err;
  fe_buf_free(&alts);
  return id;
}

/* ---- what the notation's grammar enforces ------------------------------------ */

static const char *const k_taken[] = {"type",
                                      "properties",
                                      "required",
                                      "items",
                                      "enum",
                                      "const",
                                      "anyOf",
                                      "oneOf",
                                      "minLength",
                                      "maxLength",
                                      "additionalProperties",
                                      "title",
                                      "description",
                                      "default",
                                      "examples",
                                      "$comment",
                                      "$schema",
                                      "$id",
                                      "deprecated",
                                      "readOnly",
                                      "writeOnly",
                                      NULL};

/* Refuses (CM_ERR_INVAL, a sentence in err) what value() would not enforce in
 * schema s at JSON pointer path (of plen bytes, in a buffer of SCHEMA_PATH). */
#define SCHEMA_PATH 512
static int check(const json_t *s, char *path, size_t plen, int depth, const char *where, char *err,
                 size_t errlen) {
  if (json_is_boolean(s) || !json_is_object(s)) return 0; /* any value */
  if (depth > MAX_DEPTH)
    return snprintf(err, errlen,
                    "%s%s: schemas nested deeper than %d are not supported in "
                    "Gemma 4's tool-call notation",
                    where, path, MAX_DEPTH),
           CM_ERR_INVAL;
  const char *key;
  const json_t *v;
  json_object_foreach((json_t *)s, key, v) {
    int ok = 0;
    for (int i = 0; k_taken[i] && !ok; i++)
      ok = !strcmp(key, k_taken[i]);
    if (ok && !strcmp(key, "items") && !json_is_object(v) && !json_is_boolean(v)) ok = 0;
    if (!ok)
      return snprintf(err, errlen,
                      "keyword '%s' at %s%s is not supported in Gemma 4's tool-call "
                      "notation",
                      key, where, plen ? path : "/"),
             CM_ERR_INVAL;
  }
  const json_t *en = json_object_get(s, "enum");
  const json_t *lits[2] = {json_object_get(s, "const"), NULL};
  for (size_t i = 0; !lits[0] && json_is_array(en) && i < json_array_size(en); i++)
    if (json_is_object(json_array_get(en, i)) || json_is_array(json_array_get(en, i)))
      lits[0] = json_array_get(en, i);
  if (json_is_object(lits[0]) || json_is_array(lits[0]))
    return snprintf(err, errlen,
                    "keyword '%s' at %s%s: objects and arrays in enum / const are "
                    "not supported in Gemma 4's tool-call notation",
                    json_object_get(s, "const") ? "const" : "enum", where, plen ? path : "/"),
           CM_ERR_INVAL;
  /* the subschemas: properties/K, items, anyOf/I, oneOf/I */
  static const char *const subs[] = {"properties", "items", "anyOf", "oneOf"};
  for (int k = 0; k < 4; k++) {
    const json_t *sub = json_object_get(s, subs[k]);
    if (!sub) continue;
    size_t i, n = json_is_array(sub) ? json_array_size(sub) : json_is_object(sub) ? 1 : 0;
    if (k == 0) n = json_is_object(sub) ? json_object_size(sub) : 0;
    void *it = k == 0 ? json_object_iter((json_t *)sub) : NULL;
    for (i = 0; i < n; i++) {
      const json_t *child = k == 0   ? json_object_iter_value(it)
                            : k == 1 ? sub
                                     : json_array_get(sub, i);
      int w = k == 0   ? snprintf(path + plen, SCHEMA_PATH - plen, "/properties/%s",
                                  json_object_iter_key(it))
              : k == 1 ? snprintf(path + plen, SCHEMA_PATH - plen, "/items")
                       : snprintf(path + plen, SCHEMA_PATH - plen, "/%s/%zu", subs[k], i);
      size_t nl = w < 0 ? plen : CM_MIN(plen + (size_t)w, (size_t)SCHEMA_PATH - 1);
      int rc = check(child, path, nl, depth + 1, where, err, errlen);
      path[plen] = 0;
      if (rc) return rc;
      if (k == 0) it = json_object_iter_next((json_t *)sub, it);
    }
  }
  return 0;
}

int fe_g4_tools_grammar(const json_t *tools, const char *only, int parallel, const int32_t *marker,
                        char **out, char *param, char *err, size_t errlen) {
  *out = NULL;
  size_t ti;
  const json_t *tt;
  json_array_foreach((json_t *)tools, ti, tt) {
    const char *name = json_string_value(json_object_get(tt, "name"));
    if (!name || (only && strcmp(only, name))) continue;
    const json_t *params = json_object_get(tt, "parameters");
    char *where = param, path[SCHEMA_PATH] = "";
    snprintf(where, 64, "tools[%zu].function.parameters", ti);
    int rc = check(params, path, 0, 0, where, err, errlen);
    if (rc) return rc;
  }
  struct fe_buf rules, root;
  fe_buf_init(&rules, 0);
  fe_buf_init(&root, 0);
  struct gb g = {&rules, 0, marker[FE_G4_QUOTE]};
  base_rules(&g);
  fe_buf_printf(&root, "root ::= call%s\ncall ::= <[%d]> \"call:\" (", parallel ? "+" : "",
                (int)marker[FE_G4_CALL]);
  size_t i, k = 0;
  const json_t *t;
  json_array_foreach((json_t *)tools, i, t) {
    const char *name = json_string_value(json_object_get(t, "name"));
    if (!name || (only && strcmp(only, name))) continue;
    const json_t *params = json_object_get(t, "parameters");
    int v = json_object_size(json_object_get(params, "properties")) ? value(&g, params, 0) : -1;
    if (k++) fe_buf_puts(&root, " | ");
    lit(&root, name, strlen(name));
    if (v >= 0)
      fe_buf_printf(&root, " v%d", v);
    else
      fe_buf_puts(&root, " anyobj");
  }
  fe_buf_printf(&root, ") <[%d]>\n", (int)marker[FE_G4_CALL_END]);
  fe_buf_append(&root, rules.data, rules.len);
  int rc = root.err || rules.err ? CM_ERR_NOMEM : 0;
  fe_buf_free(&rules);
  if (!rc) *out = fe_buf_steal(&root, NULL);
  fe_buf_free(&root);
  return rc || *out ? rc : CM_ERR_NOMEM;
}
