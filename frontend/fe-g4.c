/* fe-g4.c — Gemma 4's thinking channel and native tool calls read out of
 * generated text (see fe-g4.h). The notation is the one Gemma 4's chat template
 * writes for calls in the history (its format_argument macro): `call:NAME{`,
 * then `key:value` pairs, strings between <|"|> tokens, `}`. */
#include "frontend/fe-g4.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"

static const char *const marker_strs[FE_G4_N_MARKERS] = {
    [FE_G4_CHANNEL] = "<|channel>",
    [FE_G4_CHANNEL_END] = "<channel|>",
    [FE_G4_CALL] = "<|tool_call>",
    [FE_G4_CALL_END] = "<tool_call|>",
    [FE_G4_QUOTE] = "<|\"|>",
    [FE_G4_RESPONSE] = "<|tool_response>",
    [FE_G4_RESPONSE_END] = "<tool_response|>",
    [FE_G4_THINK] = "<|think|>",
};

#define THOUGHT_LABEL "thought\n" /* the channel's name, as vLLM's parser strips it */

const char *fe_g4_marker_str(enum fe_g4_marker m) {
  return m < FE_G4_N_MARKERS ? marker_strs[m] : "";
}

void fe_g4_out_init(struct fe_g4_out *o) {
  fe_buf_init(&o->content, 0);
  fe_buf_init(&o->reasoning, 0);
  fe_buf_init(&o->calls, 0);
  o->n_calls = 0;
}

void fe_g4_out_reset(struct fe_g4_out *o) {
  fe_buf_reset(&o->content);
  fe_buf_reset(&o->reasoning);
  fe_buf_reset(&o->calls);
  o->n_calls = 0;
}

void fe_g4_out_free(struct fe_g4_out *o) {
  fe_buf_free(&o->content);
  fe_buf_free(&o->reasoning);
  fe_buf_free(&o->calls);
  o->n_calls = 0;
}

/* ---- the splitter ---------------------------------------------------------- */

enum { MODE_CONTENT, MODE_REASONING, MODE_CALL };

void fe_g4_split_init(struct fe_g4_split *s, unsigned flags) {
  memset(s, 0, sizeof(*s));
  s->flags = flags;
  s->mode = MODE_CONTENT;
  fe_buf_init(&s->hold, 0);
  fe_buf_init(&s->call, 0);
}

void fe_g4_split_free(struct fe_g4_split *s) {
  fe_buf_free(&s->hold);
  fe_buf_free(&s->call);
}

/* The markers that mean something in the current mode (at most 3). */
static int mode_markers(const struct fe_g4_split *s, enum fe_g4_marker *m) {
  int n = 0;
  switch (s->mode) {
  case MODE_CONTENT:
    if (s->flags & FE_G4_REASONING) {
      m[n++] = FE_G4_CHANNEL;
      m[n++] = FE_G4_CHANNEL_END; /* a stray close: dropped */
    }
    if (s->flags & FE_G4_TOOLS) m[n++] = FE_G4_CALL;
    break;
  case MODE_REASONING:
    m[n++] = FE_G4_CHANNEL_END;
    if (s->flags & FE_G4_TOOLS) m[n++] = FE_G4_CALL; /* a call ends the thought */
    break;
  default: m[n++] = FE_G4_CALL_END; break;
  }
  return n;
}

/* Where text goes in the current mode. */
static struct fe_buf *sink(struct fe_g4_split *s, struct fe_g4_out *out) {
  return s->mode == MODE_CONTENT     ? &out->content
         : s->mode == MODE_REASONING ? &out->reasoning
                                     : &s->call;
}

/* Places t[0..n) in the current mode: reasoning first loses its label. Returns
 * how many bytes it took (fewer only while the label is undecided at the end of
 * the text, when more is to come). */
static size_t place(struct fe_g4_split *s, struct fe_g4_out *out, const char *t, size_t n,
                    int final) {
  if (s->mode == MODE_REASONING && s->label) {
    size_t ll = sizeof(THOUGHT_LABEL) - 1, k = n < ll ? n : ll;
    if (memcmp(t, THOUGHT_LABEL, k) == 0) {
      if (k < ll && !final) return 0; /* "thou": wait */
      if (k == ll) {
        t += ll, n -= ll;
        s->label = 0;
        fe_buf_append(&out->reasoning, t, n);
        return n + ll;
      }
    }
    if (n) s->label = 0; /* something else: the thought has no label */
  }
  fe_buf_append(sink(s, out), t, n);
  return n;
}

/* A complete call in s->call: into out->calls, or back into the content as it
 * was written when it is not a call. */
static void end_call(struct fe_g4_split *s, struct fe_g4_out *out) {
  char *name = NULL, *args = NULL;
  if (fe_g4_parse_call(s->call.data ? s->call.data : "", s->call.len, &name, &args) == 0) {
    if (out->n_calls++) fe_buf_puts(&out->calls, ",");
    fe_buf_puts(&out->calls, "{\"name\":");
    fe_buf_json_str(&out->calls, name, strlen(name));
    fe_buf_puts(&out->calls, ",\"arguments\":");
    fe_buf_json_str(&out->calls, args, strlen(args));
    fe_buf_puts(&out->calls, "}");
  } else {
    fe_buf_puts(&out->content, marker_strs[FE_G4_CALL]);
    fe_buf_append(&out->content, s->call.data, s->call.len);
    fe_buf_puts(&out->content, marker_strs[FE_G4_CALL_END]);
  }
  free(name);
  free(args);
  fe_buf_reset(&s->call);
}

static void on_marker(struct fe_g4_split *s, struct fe_g4_out *out, enum fe_g4_marker m) {
  switch (m) {
  case FE_G4_CHANNEL:
    s->mode = MODE_REASONING;
    s->label = 1;
    break;
  case FE_G4_CHANNEL_END: s->mode = MODE_CONTENT; break;
  case FE_G4_CALL:
    s->mode = MODE_CALL;
    fe_buf_reset(&s->call);
    break;
  case FE_G4_CALL_END:
    end_call(s, out);
    s->mode = MODE_CONTENT;
    break;
  default: break;
  }
}

/* The length of the longest tail of t[0..n) that is a proper prefix of one of
 * the markers m[0..nm). */
static size_t marker_tail(const char *t, size_t n, const enum fe_g4_marker *m, int nm) {
  size_t best = 0;
  for (int i = 0; i < nm; i++) {
    size_t ml = strlen(marker_strs[m[i]]);
    for (size_t k = ml - 1 < n ? ml - 1 : n; k > best; k--)
      if (memcmp(t + n - k, marker_strs[m[i]], k) == 0) {
        best = k;
        break;
      }
  }
  return best;
}

/* Runs the held text through the modes; `final`: nothing more comes. */
static void drain(struct fe_g4_split *s, struct fe_g4_out *out, int final) {
  size_t pos = 0;
  const char *t = s->hold.data;
  size_t n = s->hold.len;
  for (;;) {
    enum fe_g4_marker m[3];
    int nm = mode_markers(s, m);
    /* the first marker of this mode in t[pos..n) */
    const char *hit = NULL;
    int which = -1;
    for (int i = 0; i < nm; i++) {
      const char *h = memmem(t + pos, n - pos, marker_strs[m[i]], strlen(marker_strs[m[i]]));
      if (h && (!hit || h < hit)) hit = h, which = m[i];
    }
    if (hit) {
      size_t before = (size_t)(hit - (t + pos));
      size_t took = place(s, out, t + pos, before, 1);
      (void)took; /* a marker follows: the label is decided */
      pos += before + strlen(marker_strs[which]);
      on_marker(s, out, (enum fe_g4_marker)which);
      continue;
    }
    size_t keep = final ? 0 : marker_tail(t + pos, n - pos, m, nm);
    pos += place(s, out, t + pos, n - pos - keep, final);
    break;
  }
  /* what stays held moves to the front */
  memmove(s->hold.data, s->hold.data + pos, n - pos);
  s->hold.len = n - pos;
  s->hold.data[s->hold.len] = 0;
}

int fe_g4_split_push(struct fe_g4_split *s, const char *text, size_t n, struct fe_g4_out *out) {
  if (n && fe_buf_append(&s->hold, text, n)) return CM_ERR_NOMEM;
  if (s->hold.len) drain(s, out, 0);
  return s->hold.err || s->call.err || out->content.err || out->reasoning.err || out->calls.err
             ? CM_ERR_NOMEM
             : 0;
}

int fe_g4_split_flush(struct fe_g4_split *s, struct fe_g4_out *out) {
  if (s->hold.len) drain(s, out, 1);
  if (s->mode == MODE_CALL) { /* cut before its end: the text as it came */
    fe_buf_puts(&out->content, marker_strs[FE_G4_CALL]);
    fe_buf_append(&out->content, s->call.data, s->call.len);
    fe_buf_reset(&s->call);
    s->mode = MODE_CONTENT;
  }
  return s->hold.err || out->content.err || out->reasoning.err || out->calls.err ? CM_ERR_NOMEM : 0;
}

/* ---- a call's text as JSON --------------------------------------------------- */

#define MAX_DEPTH 64

struct rd {
  const char *s;
  size_t n, pos;
};

static void skip_ws(struct rd *r) {
  while (r->pos < r->n && (r->s[r->pos] == ' ' || r->s[r->pos] == '\n' || r->s[r->pos] == '\t' ||
                           r->s[r->pos] == '\r'))
    r->pos++;
}

static int at(const struct rd *r, const char *lit) {
  size_t l = strlen(lit);
  return r->n - r->pos >= l && memcmp(r->s + r->pos, lit, l) == 0;
}

/* A string between <|"|> markers (r at the first one): a new JSON string. */
static json_t *quoted(struct rd *r) {
  const char *q = marker_strs[FE_G4_QUOTE];
  size_t ql = strlen(q);
  r->pos += ql;
  const char *end = memmem(r->s + r->pos, r->n - r->pos, q, ql);
  if (!end) return NULL;
  json_t *v = json_stringn(r->s + r->pos, (size_t)(end - (r->s + r->pos)));
  r->pos = (size_t)(end - r->s) + ql;
  return v;
}

/* 1 when t[0..n) is a JSON number. */
static int is_number(const char *t, size_t n) {
  size_t i = 0;
  if (i < n && t[i] == '-') i++;
  if (i >= n) return 0;
  if (t[i] == '0') {
    i++;
  } else if (t[i] >= '1' && t[i] <= '9') {
    while (i < n && t[i] >= '0' && t[i] <= '9')
      i++;
  } else {
    return 0;
  }
  if (i < n && t[i] == '.') {
    size_t d = ++i;
    while (i < n && t[i] >= '0' && t[i] <= '9')
      i++;
    if (i == d) return 0;
  }
  if (i < n && (t[i] == 'e' || t[i] == 'E')) {
    i++;
    if (i < n && (t[i] == '+' || t[i] == '-')) i++;
    size_t d = i;
    while (i < n && t[i] >= '0' && t[i] <= '9')
      i++;
    if (i == d) return 0;
  }
  return i == n;
}

/* A bare scalar up to , } or ]: a number, true, false, null (None, as Jinja
 * prints Python's), else its text as a string. */
static json_t *bare(struct rd *r) {
  size_t b = r->pos;
  while (r->pos < r->n && r->s[r->pos] != ',' && r->s[r->pos] != '}' && r->s[r->pos] != ']' &&
         !at(r, marker_strs[FE_G4_QUOTE]))
    r->pos++;
  size_t e = r->pos;
  while (e > b && (r->s[e - 1] == ' ' || r->s[e - 1] == '\n' || r->s[e - 1] == '\t'))
    e--;
  const char *t = r->s + b;
  size_t n = e - b;
  if (!n) return NULL;
  if (n == 4 && !memcmp(t, "true", 4)) return json_true();
  if (n == 5 && !memcmp(t, "false", 5)) return json_false();
  if ((n == 4 && !memcmp(t, "null", 4)) || (n == 4 && !memcmp(t, "None", 4))) return json_null();
  if (is_number(t, n)) return json_loadb(t, n, JSON_DECODE_ANY, NULL);
  return json_stringn(t, n);
}

static json_t *value(struct rd *r, int depth);

/* {key:value,...} (r at '{'). */
static json_t *object(struct rd *r, int depth) {
  json_t *o = json_object();
  r->pos++;
  skip_ws(r);
  if (r->pos < r->n && r->s[r->pos] == '}') {
    r->pos++;
    return o;
  }
  while (o) {
    skip_ws(r);
    json_t *k = NULL;
    if (at(r, marker_strs[FE_G4_QUOTE])) {
      k = quoted(r);
    } else {
      size_t b = r->pos;
      while (r->pos < r->n && r->s[r->pos] != ':' && r->s[r->pos] != ',' && r->s[r->pos] != '}')
        r->pos++;
      size_t e = r->pos;
      while (e > b && r->s[e - 1] == ' ')
        e--;
      if (e > b) k = json_stringn(r->s + b, e - b);
    }
    skip_ws(r);
    if (!k || r->pos >= r->n || r->s[r->pos] != ':') {
      json_decref(k);
      break;
    }
    r->pos++;
    json_t *v = value(r, depth + 1);
    if (!v || json_object_set_new(o, json_string_value(k), v)) {
      json_decref(k);
      break;
    }
    json_decref(k);
    skip_ws(r);
    if (r->pos < r->n && r->s[r->pos] == ',') {
      r->pos++;
      continue;
    }
    if (r->pos < r->n && r->s[r->pos] == '}') {
      r->pos++;
      return o;
    }
    break;
  }
  json_decref(o);
  return NULL;
}

/* [value,...] (r at '['). */
static json_t *array(struct rd *r, int depth) {
  json_t *a = json_array();
  r->pos++;
  skip_ws(r);
  if (r->pos < r->n && r->s[r->pos] == ']') {
    r->pos++;
    return a;
  }
  while (a) {
    json_t *v = value(r, depth + 1);
    if (!v || json_array_append_new(a, v)) break;
    skip_ws(r);
    if (r->pos < r->n && r->s[r->pos] == ',') {
      r->pos++;
      continue;
    }
    if (r->pos < r->n && r->s[r->pos] == ']') {
      r->pos++;
      return a;
    }
    break;
  }
  json_decref(a);
  return NULL;
}

static json_t *value(struct rd *r, int depth) {
  if (depth > MAX_DEPTH) return NULL;
  skip_ws(r);
  if (r->pos >= r->n) return NULL;
  if (at(r, marker_strs[FE_G4_QUOTE])) return quoted(r);
  if (r->s[r->pos] == '{') return object(r, depth);
  if (r->s[r->pos] == '[') return array(r, depth);
  return bare(r);
}

int fe_g4_parse_call(const char *s, size_t n, char **name, char **args) {
  *name = NULL;
  *args = NULL;
  struct rd r = {s, n, 0};
  skip_ws(&r);
  if (!at(&r, "call:")) return CM_ERR_PARSE;
  r.pos += 5;
  size_t b = r.pos;
  while (r.pos < n && s[r.pos] != '{' && s[r.pos] != ' ' && s[r.pos] != '\n')
    r.pos++;
  if (r.pos == b || r.pos >= n || s[r.pos] != '{') return CM_ERR_PARSE;
  size_t name_len = r.pos - b;
  json_t *o = object(&r, 0);
  skip_ws(&r);
  if (!o || r.pos != n) {
    json_decref(o);
    return CM_ERR_PARSE;
  }
  *args = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  *name = strndup(s + b, name_len);
  if (!*args || !*name) {
    free(*args), free(*name);
    *args = *name = NULL;
    return CM_ERR_NOMEM;
  }
  return 0;
}
