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
  fe_buf_init(&o->deltas, 0);
  o->n_calls = o->n_deltas = 0;
}

void fe_g4_out_reset(struct fe_g4_out *o) {
  fe_buf_reset(&o->content);
  fe_buf_reset(&o->reasoning);
  fe_buf_reset(&o->calls);
  fe_buf_reset(&o->deltas);
  o->n_calls = o->n_deltas = 0;
}

void fe_g4_out_free(struct fe_g4_out *o) {
  fe_buf_free(&o->content);
  fe_buf_free(&o->reasoning);
  fe_buf_free(&o->calls);
  fe_buf_free(&o->deltas);
  o->n_calls = o->n_deltas = 0;
}

/* ---- the splitter ---------------------------------------------------------- */

enum { MODE_CONTENT, MODE_REASONING, MODE_CALL };

void fe_g4_split_init(struct fe_g4_split *s, unsigned flags) {
  memset(s, 0, sizeof(*s));
  s->flags = flags;
  s->mode = MODE_CONTENT;
  fe_buf_init(&s->hold, 0);
  fe_buf_init(&s->call, 0);
  fe_buf_init(&s->conv, 0);
}

void fe_g4_split_free(struct fe_g4_split *s) {
  fe_buf_free(&s->hold);
  fe_buf_free(&s->call);
  fe_buf_free(&s->conv);
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

/* A call's text turned into JSON (below): how far it got. */
enum { CV_MORE = 0, CV_DONE = 1, CV_BAD = -1, CV_COMMA = 2 };
static int cv_call(const char *s, size_t n, int final, size_t *name_at, size_t *name_len,
                   struct fe_buf *o);

static void delta(struct fe_g4_out *out, const char *key, const char *t, size_t n) {
  if (out->n_deltas++) fe_buf_puts(&out->deltas, ",");
  fe_buf_printf(&out->deltas, "{\"%s\":", key);
  fe_buf_json_str(&out->deltas, t, n);
  fe_buf_puts(&out->deltas, "}");
}

/* FE_G4_STREAM_CALLS: what the call read so far decides, as deltas: its name once
 * known, then what its arguments' JSON grew by. */
static void call_progress(struct fe_g4_split *s, struct fe_g4_out *out, int final) {
  if (!(s->flags & FE_G4_STREAM_CALLS)) return;
  fe_buf_reset(&s->conv);
  size_t at, len;
  const char *t = s->call.data ? s->call.data : "";
  if (cv_call(t, s->call.len, final, &at, &len, &s->conv) == CV_BAD || !len) return;
  if (!s->call_open) {
    delta(out, "name", t + at, len);
    s->call_open = 1;
    s->call_sent = 0;
  }
  if (s->conv.len > s->call_sent) {
    delta(out, "arguments", s->conv.data + s->call_sent, s->conv.len - s->call_sent);
    s->call_sent = s->conv.len;
  }
}

/* A complete call in s->call: into out->calls, or back into the content as it
 * was written when it is not a call. */
static void end_call(struct fe_g4_split *s, struct fe_g4_out *out) {
  char *name = NULL, *args = NULL;
  if (fe_g4_parse_call(s->call.data ? s->call.data : "", s->call.len, &name, &args) == 0) {
    call_progress(s, out, 1);
    if (out->n_calls++) fe_buf_puts(&out->calls, ",");
    fe_buf_puts(&out->calls, "{\"name\":");
    fe_buf_json_str(&out->calls, name, strlen(name));
    fe_buf_puts(&out->calls, ",\"arguments\":");
    fe_buf_json_str(&out->calls, args, strlen(args));
    fe_buf_puts(&out->calls, "}");
  } else if (!s->call_open) { /* (a stream has given what it read of it as a call) */
    fe_buf_puts(&out->content, marker_strs[FE_G4_CALL]);
    fe_buf_append(&out->content, s->call.data, s->call.len);
    fe_buf_puts(&out->content, marker_strs[FE_G4_CALL_END]);
  }
  free(name);
  free(args);
  fe_buf_reset(&s->call);
  s->call_open = 0;
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
  if (s->mode == MODE_CALL) call_progress(s, out, 0);
  return s->hold.err || s->call.err || s->conv.err || out->content.err || out->reasoning.err ||
                 out->calls.err || out->deltas.err
             ? CM_ERR_NOMEM
             : 0;
}

int fe_g4_split_flush(struct fe_g4_split *s, struct fe_g4_out *out) {
  if (s->hold.len) drain(s, out, 1);
  if (s->mode == MODE_CALL) { /* cut before its end: the text as it came, unless the stream
                               * has given it as a call already */
    if (!s->call_open) {
      fe_buf_puts(&out->content, marker_strs[FE_G4_CALL]);
      fe_buf_append(&out->content, s->call.data, s->call.len);
    }
    fe_buf_reset(&s->call);
    s->call_open = 0;
    s->mode = MODE_CONTENT;
  }
  return s->hold.err || out->content.err || out->reasoning.err || out->calls.err ? CM_ERR_NOMEM : 0;
}

/* ---- a call's text as JSON --------------------------------------------------- */

/* The notation is turned into JSON text as it is read, writing only what the
 * text so far decides: a bare key once its ':' came, a bare value once what
 * ends it came, a string's characters as they come (but a tail that may start
 * <|"|>). So the JSON of a longer prefix of a call always extends that of a
 * shorter one: the stream's argument fragments are the difference, and joined
 * they are the arguments of the whole call. */

#define MAX_DEPTH 64

struct cv {
  const char *s;
  size_t n, pos;
  int final; /* the text is whole: running out of it is an error */
  struct fe_buf *o;
};

static void skip_ws(struct cv *c) {
  while (c->pos < c->n && (c->s[c->pos] == ' ' || c->s[c->pos] == '\n' || c->s[c->pos] == '\t' ||
                           c->s[c->pos] == '\r'))
    c->pos++;
}

static int at(const struct cv *c, const char *lit) {
  size_t l = strlen(lit);
  return c->n - c->pos >= l && memcmp(c->s + c->pos, lit, l) == 0;
}

/* Out of text at c->pos: more may come, unless the text is whole. */
static int out_of_text(const struct cv *c) {
  return c->final ? CV_BAD : CV_MORE;
}

/* 1 when the rest of the text is a proper prefix of lit (more may make it lit). */
static int may_become(const struct cv *c, const char *lit) {
  size_t l = strlen(lit), r = c->n - c->pos;
  return r < l && memcmp(c->s + c->pos, lit, r) == 0;
}

/* A string between <|"|> markers (c at the first one), written as a JSON string. */
static int cv_string(struct cv *c) {
  const char *q = marker_strs[FE_G4_QUOTE];
  size_t ql = strlen(q);
  c->pos += ql;
  fe_buf_puts(c->o, "\"");
  for (;;) {
    if (c->pos >= c->n) return out_of_text(c);
    if (at(c, q)) {
      c->pos += ql;
      fe_buf_puts(c->o, "\"");
      return CV_DONE;
    }
    if (!c->final && may_become(c, q)) return CV_MORE;
    const char *end = memchr(c->s + c->pos, q[0], c->n - c->pos);
    size_t run = end ? (size_t)(end - (c->s + c->pos)) : c->n - c->pos;
    if (!end && !c->final) { /* a character cut at the end waits for its other bytes */
      run = fe_utf8_whole(c->s + c->pos, run);
      if (!run) return CV_MORE;
    }
    fe_buf_json_chars(c->o, c->s + c->pos, run ? run : 1);
    c->pos += run ? run : 1;
  }
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

/* A bare scalar up to , } ] or <|"|>: a number as written, true, false, null
 * (None, as Jinja prints Python's), else its text as a string. */
static int cv_bare(struct cv *c) {
  size_t b = c->pos;
  while (c->pos < c->n && c->s[c->pos] != ',' && c->s[c->pos] != '}' && c->s[c->pos] != ']' &&
         !at(c, marker_strs[FE_G4_QUOTE]))
    c->pos++;
  if (c->pos >= c->n) return out_of_text(c); /* what ends it decides what it is */
  size_t e = c->pos;
  while (e > b && (c->s[e - 1] == ' ' || c->s[e - 1] == '\n' || c->s[e - 1] == '\t'))
    e--;
  const char *t = c->s + b;
  size_t n = e - b;
  if (!n) return CV_BAD;
  if ((n == 4 && !memcmp(t, "true", 4)) || (n == 5 && !memcmp(t, "false", 5)) ||
      (n == 4 && !memcmp(t, "null", 4)) || is_number(t, n))
    fe_buf_append(c->o, t, n);
  else if (n == 4 && !memcmp(t, "None", 4))
    fe_buf_puts(c->o, "null");
  else
    fe_buf_json_str(c->o, t, n);
  return CV_DONE;
}

static int cv_value(struct cv *c, int depth);

/* After a member or an element: ',' (written: CV_COMMA) or the closing byte. */
static int cv_next(struct cv *c, char close) {
  skip_ws(c);
  if (c->pos >= c->n) return out_of_text(c);
  if (c->s[c->pos] == ',') {
    c->pos++;
    fe_buf_puts(c->o, ",");
    return CV_COMMA;
  }
  if (c->s[c->pos] != close) return CV_BAD;
  c->pos++;
  fe_buf_append(c->o, &close, 1);
  return CV_DONE;
}

/* A container's opening bracket (c at it) and, when it is empty, its close:
 * CV_DONE then, CV_COMMA when items follow. */
static int cv_open(struct cv *c, char close) {
  fe_buf_append(c->o, c->s + c->pos++, 1);
  skip_ws(c);
  if (c->pos >= c->n) return out_of_text(c);
  if (c->s[c->pos] != close) return CV_COMMA;
  c->pos++;
  fe_buf_append(c->o, &close, 1);
  return CV_DONE;
}

/* {key:value,...} (c at '{'). */
static int cv_object(struct cv *c, int depth) {
  int rc = cv_open(c, '}');
  if (rc != CV_COMMA) return rc;
  for (;;) {
    skip_ws(c);
    if (c->pos >= c->n || may_become(c, marker_strs[FE_G4_QUOTE])) return out_of_text(c);
    if (at(c, marker_strs[FE_G4_QUOTE])) {
      if ((rc = cv_string(c)) != CV_DONE) return rc;
      skip_ws(c);
      if (c->pos >= c->n) return out_of_text(c);
      if (c->s[c->pos] != ':') return CV_BAD;
    } else {
      size_t b = c->pos;
      while (c->pos < c->n && c->s[c->pos] != ':' && c->s[c->pos] != ',' && c->s[c->pos] != '}')
        c->pos++;
      if (c->pos >= c->n) return out_of_text(c); /* the key's end decides it */
      size_t e = c->pos;
      while (e > b && c->s[e - 1] == ' ')
        e--;
      if (e == b || c->s[c->pos] != ':') return CV_BAD;
      fe_buf_json_str(c->o, c->s + b, e - b);
    }
    c->pos++;
    fe_buf_puts(c->o, ":");
    if ((rc = cv_value(c, depth + 1)) != CV_DONE) return rc;
    if ((rc = cv_next(c, '}')) != CV_COMMA) return rc;
  }
}

/* [value,...] (c at '['). */
static int cv_array(struct cv *c, int depth) {
  int rc = cv_open(c, ']');
  if (rc != CV_COMMA) return rc;
  for (;;) {
    if ((rc = cv_value(c, depth + 1)) != CV_DONE) return rc;
    if ((rc = cv_next(c, ']')) != CV_COMMA) return rc;
  }
}

static int cv_value(struct cv *c, int depth) {
  if (depth > MAX_DEPTH) return CV_BAD;
  skip_ws(c);
  if (c->pos >= c->n || may_become(c, marker_strs[FE_G4_QUOTE])) return out_of_text(c);
  if (at(c, marker_strs[FE_G4_QUOTE])) return cv_string(c);
  if (c->s[c->pos] == '{') return cv_object(c, depth);
  if (c->s[c->pos] == '[') return cv_array(c, depth);
  return cv_bare(c);
}

/* `call:NAME{...}` in s[0..n): the name's span, and the arguments' JSON so far
 * into o. CV_DONE (whole), CV_MORE (a prefix: *name_len 0 until the name is
 * known), CV_BAD. */
static int cv_call(const char *s, size_t n, int final, size_t *name_at, size_t *name_len,
                   struct fe_buf *o) {
  struct cv c = {s, n, 0, final, o};
  *name_at = *name_len = 0;
  skip_ws(&c);
  if (!at(&c, "call:")) return may_become(&c, "call:") ? out_of_text(&c) : CV_BAD;
  c.pos += 5;
  size_t b = c.pos;
  while (c.pos < n && s[c.pos] != '{' && s[c.pos] != ' ' && s[c.pos] != '\n')
    c.pos++;
  if (c.pos >= n) return out_of_text(&c);
  if (c.pos == b || s[c.pos] != '{') return CV_BAD;
  *name_at = b;
  *name_len = c.pos - b;
  int rc = cv_object(&c, 0);
  if (rc != CV_DONE) return rc;
  skip_ws(&c);
  return c.pos == n ? CV_DONE : c.final ? CV_BAD : CV_MORE;
}

int fe_g4_parse_call(const char *s, size_t n, char **name, char **args) {
  *name = NULL;
  *args = NULL;
  struct fe_buf o;
  fe_buf_init(&o, 0);
  size_t at_, len;
  int rc = cv_call(s, n, 1, &at_, &len, &o);
  /* what the conversion wrote is JSON by construction but for the string bytes
   * it copied: checked whole */
  json_t *j = rc == CV_DONE && !o.err ? json_loadb(o.data, o.len, 0, NULL) : NULL;
  int ok = json_is_object(j);
  json_decref(j);
  if (!ok) {
    fe_buf_free(&o);
    return o.err ? CM_ERR_NOMEM : CM_ERR_PARSE;
  }
  *args = fe_buf_steal(&o, NULL);
  *name = strndup(s + at_, len);
  if (!*args || !*name) {
    free(*args), free(*name);
    *args = *name = NULL;
    return CM_ERR_NOMEM;
  }
  return 0;
}
