/* fe-rstore.c — the Responses API's store (see fe-rstore.h): entries in a
 * list oldest first, found by a chained hash table of their ids. */
#include "frontend/fe-rstore.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-hash.h"
#include "common/cm-log.h"

#define N_BUCKETS 4096 /* a power of two */

struct entry {
  struct fe_rstore_entry pub;
  char *id;
  size_t bytes;                /* what it counts against the cap */
  struct entry *older, *newer; /* the list, oldest first */
  struct entry *chain;         /* the bucket's next */
};

struct fe_rstore {
  size_t cap, bytes, n; /* bytes: the entries' texts */
  struct entry *oldest, *newest;
  struct entry *bucket[N_BUCKETS];
};

static size_t bucket_of(const char *id, size_t n) {
  uint64_t h = 0;
  for (size_t i = 0; i < n; i++)
    h = cm_mix64(h ^ (unsigned char)id[i]);
  return (size_t)(h & (N_BUCKETS - 1));
}

int fe_rstore_create(size_t cap, struct fe_rstore **out) {
  *out = NULL;
  if (!cap) return CM_ERR_INVAL;
  struct fe_rstore *s = calloc(1, sizeof(*s));
  if (!s) return CM_ERR_NOMEM;
  s->cap = cap;
  *out = s;
  return 0;
}

static void entry_free(struct entry *e) {
  free((char *)e->pub.response);
  free((char *)e->pub.conv);
  free((char *)e->pub.input);
  free(e->id);
  free(e);
}

void fe_rstore_destroy(struct fe_rstore *s) {
  if (!s) return;
  for (struct entry *e = s->oldest, *next; e; e = next) {
    next = e->newer;
    entry_free(e);
  }
  free(s);
}

static struct entry **slot_of(const struct fe_rstore *s, const char *id, size_t n) {
  struct entry **p = (struct entry **)&s->bucket[bucket_of(id, n)];
  for (; *p; p = &(*p)->chain)
    if (strlen((*p)->id) == n && !memcmp((*p)->id, id, n)) break;
  return p;
}

static void unlink_entry(struct fe_rstore *s, struct entry **slot) {
  struct entry *e = *slot;
  *slot = e->chain;
  if (e->older)
    e->older->newer = e->newer;
  else
    s->oldest = e->newer;
  if (e->newer)
    e->newer->older = e->older;
  else
    s->newest = e->older;
  s->bytes -= e->bytes;
  s->n--;
  entry_free(e);
}

/* The assistant's turn of a response's output items: its text and its calls (new). */
static json_t *turn_of(json_t *output) {
  json_t *calls = json_array(), *item;
  size_t i, len = 0;
  char *text = NULL;
  json_array_foreach(output, i, item) {
    const char *type = json_string_value(json_object_get(item, "type"));
    if (type && !strcmp(type, "function_call")) {
      json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id",
                                             json_object_get(item, "call_id"), "type", "function",
                                             "function", "name", json_object_get(item, "name"),
                                             "arguments", json_object_get(item, "arguments")));
      continue;
    }
    if (!type || strcmp(type, "message")) continue; /* a thought */
    size_t k;
    json_t *part;
    json_array_foreach(json_object_get(item, "content"), k, part) {
      json_t *t = json_object_get(part, "text");
      char *grown = json_is_string(t) ? realloc(text, len + json_string_length(t) + 1) : NULL;
      if (!grown) continue;
      memcpy(grown + len, json_string_value(t), json_string_length(t));
      len += json_string_length(t);
      text = grown;
    }
  }
  json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content",
                        text ? json_stringn(text, len) : json_null());
  free(text);
  if (m && json_array_size(calls))
    json_object_set_new(m, "tool_calls", calls);
  else
    json_decref(calls);
  return m;
}

int fe_rstore_put(struct fe_rstore *s, const char *response, size_t len, const char *conv,
                  const char *input) {
  json_t *r = json_loadb(response, len, 0, NULL), *c = json_loads(conv ? conv : "[]", 0, NULL);
  const char *id = json_string_value(json_object_get(r, "id"));
  json_t *out = json_object_get(r, "output");
  int rc = id && json_is_array(out) && json_is_array(c) ? 0 : CM_ERR_PARSE;
  json_t *turn = rc ? NULL : turn_of(out);
  char *conv_all = NULL;
  if (!rc && (!turn || json_array_append_new(c, turn))) rc = CM_ERR_NOMEM;
  if (!rc && !(conv_all = json_dumps(c, JSON_COMPACT))) rc = CM_ERR_NOMEM;
  struct entry *e = rc ? NULL : calloc(1, sizeof(*e));
  if (!rc && e) {
    e->id = strdup(id);
    e->pub.response = strndup(response, len);
    e->pub.response_len = len;
    e->pub.conv = conv_all;
    e->pub.input = strdup(input ? input : "[]");
    conv_all = NULL;
    if (!e->id || !e->pub.response || !e->pub.input) rc = CM_ERR_NOMEM;
    e->bytes = len + strlen(e->pub.conv) + (e->pub.input ? strlen(e->pub.input) : 0) + 256;
    if (!rc && e->bytes > s->cap) rc = CM_ERR_TOOBIG;
  } else if (!rc) {
    rc = CM_ERR_NOMEM;
  }
  if (!rc) {
    struct entry **slot = slot_of(s, e->id, strlen(e->id));
    if (*slot) unlink_entry(s, slot); /* the same id again: the newer wins */
    while (s->bytes + e->bytes > s->cap && s->oldest)
      unlink_entry(s, slot_of(s, s->oldest->id, strlen(s->oldest->id)));
    slot = slot_of(s, e->id, strlen(e->id));
    *slot = e;
    e->older = s->newest;
    if (s->newest)
      s->newest->newer = e;
    else
      s->oldest = e;
    s->newest = e;
    s->bytes += e->bytes;
    s->n++;
  } else if (e) {
    entry_free(e);
  }
  if (rc)
    cm_warn("fe-rstore", "response %.64s not kept: %s", id ? id : "?",
            rc == CM_ERR_TOOBIG ? "larger than the whole store" : cm_strerror(rc));
  free(conv_all);
  json_decref(c);
  json_decref(r);
  return rc;
}

const struct fe_rstore_entry *fe_rstore_get(const struct fe_rstore *s, const char *id, size_t n) {
  struct entry *e = *slot_of(s, id, n);
  return e ? &e->pub : NULL;
}

int fe_rstore_delete(struct fe_rstore *s, const char *id, size_t n) {
  struct entry **slot = slot_of(s, id, n);
  if (!*slot) return CM_ERR_NOENT;
  unlink_entry(s, slot);
  return 0;
}

void fe_rstore_usage(const struct fe_rstore *s, size_t *entries, size_t *bytes) {
  *entries = s->n;
  *bytes = s->bytes;
}
