/* gr-matcher.c — following a generation byte by byte: the state is a small set
 * of stacks of DFA states (the top is where we are, the frames below are where
 * the rules called return to). After every byte the set is closed: calls are
 * entered and finished rules return, so every top can take a byte or is the
 * end of the root rule. */
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-hash.h"
#include "grammar/gr-impl.h"

/* ---- stack sets ------------------------------------------------------------ */
static uint64_t frames_hash(const uint32_t *f, uint32_t len) {
  uint64_t h = 0x2545f4914f6cdd1dull + len;
  for (uint32_t i = 0; i < len; i++)
    h = cm_mix64(h ^ f[i]);
  return h;
}

static int ss_reserve(struct gr_stackset *s, uint32_t n, uint32_t f) {
  if (n > s->cap_n) {
    uint32_t cap = s->cap_n ? s->cap_n : 4;
    while (cap < n)
      cap *= 2;
    uint32_t *off = realloc(s->off, ((size_t)cap + 1) * sizeof *off);
    if (!off) return CM_ERR_NOMEM;
    s->off = off;
    uint64_t *h = realloc(s->hash, (size_t)cap * sizeof *h);
    if (!h) return CM_ERR_NOMEM;
    s->hash = h;
    s->cap_n = cap;
  }
  if (f > s->cap_f) {
    uint32_t cap = s->cap_f ? s->cap_f : 16;
    while (cap < f)
      cap *= 2;
    uint32_t *fr = realloc(s->frames, (size_t)cap * sizeof *fr);
    if (!fr) return CM_ERR_NOMEM;
    s->frames = fr;
    s->cap_f = cap;
  }
  return 0;
}

static void ss_reset(struct gr_stackset *s) {
  s->n = 0;
  if (s->off) s->off[0] = 0;
}

/* Adds a stack unless an equal one is there: 0, 1 when the set is full, or an error. */
static int ss_add(struct gr_stackset *s, const uint32_t *f, uint32_t len, uint64_t h) {
  for (uint32_t i = 0; i < s->n; i++)
    if (s->hash[i] == h && s->off[i + 1] - s->off[i] == len &&
        memcmp(s->frames + s->off[i], f, len * sizeof *f) == 0)
      return 0;
  if (s->n >= GR_MAX_STACKS) return 1;
  uint32_t used = s->n ? s->off[s->n] : 0;
  int rc = ss_reserve(s, s->n + 1, used + len);
  if (rc) return rc;
  if (s->n == 0) s->off[0] = 0;
  memcpy(s->frames + used, f, len * sizeof *f);
  s->hash[s->n] = h;
  s->off[s->n + 1] = used + len;
  s->n++;
  return 0;
}

void gr_stackset_free(struct gr_stackset *s) {
  free(s->off);
  free(s->frames);
  free(s->hash);
  memset(s, 0, sizeof *s);
}

int gr_stackset_copy(struct gr_stackset *d, const struct gr_stackset *s) {
  uint32_t nf = s->n ? s->off[s->n] : 0;
  int rc = ss_reserve(d, s->n ? s->n : 1, nf ? nf : 1);
  if (rc) return rc;
  d->n = s->n;
  d->off[0] = 0;
  if (s->n) {
    memcpy(d->off, s->off, ((size_t)s->n + 1) * sizeof *s->off);
    memcpy(d->hash, s->hash, (size_t)s->n * sizeof *s->hash);
    memcpy(d->frames, s->frames, (size_t)nf * sizeof *s->frames);
  }
  return 0;
}

int gr_stackset_one(struct gr_stackset *d, const struct gr_stackset *s, uint32_t j) {
  ss_reset(d);
  uint32_t len = s->off[j + 1] - s->off[j];
  int rc = ss_add(d, s->frames + s->off[j], len, s->hash[j]);
  return rc > 0 ? CM_ERR_NOMEM : rc;
}

uint64_t gr_stackset_hash(const struct gr_stackset *s) {
  uint64_t h = 0x9ae16a3b2f90404full + s->n;
  for (uint32_t i = 0; i < s->n; i++)
    h = cm_mix64(h ^ s->hash[i]);
  return h;
}

/* ---- closure ------------------------------------------------------------- */
static int seen_add(struct gr_matcher *m, uint64_t h) {
  for (uint32_t i = 0; i < m->n_seen; i++)
    if (m->seen[i] == h) return 0;
  if (m->n_seen == m->cap_seen) {
    uint32_t cap = m->cap_seen ? m->cap_seen * 2 : 64;
    uint64_t *a = realloc(m->seen, cap * sizeof *a);
    if (!a) return -1;
    m->seen = a;
    m->cap_seen = cap;
  }
  m->seen[m->n_seen++] = h;
  return 1;
}

/* Closes the stack f[len] into out: enters calls, returns from finished rules. */
static int closure(struct gr_matcher *m, struct gr_stackset *todo, const uint32_t *f, uint32_t len,
                   struct gr_stackset *out) {
  const struct gr_grammar *g = m->g;
  uint32_t buf[GR_MAX_DEPTH + 1];
  ss_reset(todo);
  int rc = ss_add(todo, f, len, 0);
  if (rc) return rc < 0 ? rc : 0;
  while (todo->n) {
    if (m->n_seen >= GR_MAX_SEEN) { /* a grammar whose calls nest without input */
      m->truncated = 1;
      break;
    }
    uint32_t i = --todo->n;
    len = todo->off[i + 1] - todo->off[i];
    memcpy(buf, todo->frames + todo->off[i], len * sizeof *buf);
    uint64_t h = frames_hash(buf, len);
    int s = seen_add(m, h);
    if (s < 0) return CM_ERR_NOMEM;
    if (s == 0) continue;
    uint32_t top = buf[len - 1];
    uint8_t fl = g->flags[top];
    if ((fl & GR_F_BYTES) || ((fl & GR_F_FINAL) && len == 1)) {
      rc = ss_add(out, buf, len, h);
      if (rc < 0) return rc;
      if (rc > 0) m->truncated = 1;
    }
    if ((fl & GR_F_FINAL) && len > 1) {
      /* the caller's frame already holds the state to return to */
      rc = ss_add(todo, buf, len - 1, 0);
      if (rc < 0) return rc;
    }
    if ((fl & GR_F_CALLS) && len < GR_MAX_DEPTH) {
      for (uint32_t k = g->call_off[top]; k < g->call_off[top + 1]; k++) {
        buf[len - 1] = g->calls[k].ret;
        buf[len] = g->calls[k].start;
        rc = ss_add(todo, buf, len + 1, 0);
        if (rc < 0) return rc;
        if (rc > 0) m->truncated = 1;
      }
      buf[len - 1] = top;
    }
  }
  return 0;
}

const struct gr_stackset *gr_returns(struct gr_matcher *m, const uint32_t *f, uint32_t len) {
  uint64_t h = frames_hash(f, len);
  for (uint32_t k = 0; k < GR_RET_MEMO; k++) {
    struct gr_ret *r = &m->ret[k];
    if (r->h == h && r->len == len && len <= GR_RET_FRAMES && !memcmp(r->f, f, len * sizeof *f))
      return &r->set;
  }
  struct gr_ret *r = &m->ret[m->ret_next++ % GR_RET_MEMO];
  r->len = 0; /* none while it is made */
  ss_reset(&r->set);
  m->n_seen = 0;
  if (len && closure(m, &m->todo, f, len, &r->set) < 0) return NULL;
  if (len <= GR_RET_FRAMES) { /* longer ones are made each time */
    r->h = h;
    r->len = len;
    memcpy(r->f, f, len * sizeof *f);
  }
  return &r->set;
}

int gr_step(struct gr_matcher *m, const struct gr_stackset *in, uint8_t b,
            struct gr_stackset *out) {
  const struct gr_grammar *g = m->g;
  uint32_t c = g->cls[b];
  uint32_t buf[GR_MAX_DEPTH + 1];
  ss_reset(out);
  m->n_seen = 0;
  for (uint32_t i = 0; i < in->n; i++) {
    uint32_t len = in->off[i + 1] - in->off[i];
    const uint32_t *f = in->frames + in->off[i];
    uint32_t t = g->delta[(size_t)f[len - 1] * g->n_cls + c];
    if (t == GR_NONE) continue;
    uint8_t fl = g->flags[t];
    if (!(fl & (GR_F_CALLS | GR_F_FINAL))) { /* the common case: no call, no return */
      memcpy(buf, f, (len - 1) * sizeof *buf);
      buf[len - 1] = t;
      int rc = ss_add(out, buf, len, frames_hash(buf, len));
      if (rc < 0) return 0;
      if (rc > 0) m->truncated = 1;
      continue;
    }
    memcpy(buf, f, (len - 1) * sizeof *buf);
    buf[len - 1] = t;
    if (closure(m, &m->todo, buf, len, out) < 0) return 0;
  }
  return out->n > 0;
}

int gr_follows(struct gr_matcher *m, const struct gr_stackset *from, const uint8_t *b, size_t n) {
  const struct gr_grammar *g = m->g;
  const struct gr_stackset *cur = from;
  struct gr_stackset *out = &m->next;
  /* while cur is one stack: its top, which steps that neither call nor return
   * replace without writing the stack out */
  uint32_t top = cur->n == 1 ? cur->frames[cur->off[1] - 1] : GR_NONE;
  for (size_t i = 0; i < n; i++) {
    if (cur->n == 1) {
      uint32_t len = cur->off[1];
      uint32_t t = g->delta[(size_t)top * g->n_cls + g->cls[b[i]]];
      if (t == GR_NONE) return 0;
      uint8_t fl = g->flags[t];
      if (!(fl & GR_F_CALLS) && (!(fl & GR_F_FINAL) || len == 1)) {
        top = t;
        continue;
      }
      if (cur->frames[len - 1] != top) { /* the stack with its top replaced */
        if (gr_stackset_copy(&m->walk, cur)) return CM_ERR_NOMEM;
        m->walk.frames[len - 1] = top;
        cur = &m->walk;
      }
    }
    if (!gr_step(m, cur, b[i], out)) return 0;
    cur = out;
    out = out == &m->next ? &m->alt : &m->next;
    if (cur->n == 1) top = cur->frames[cur->off[1] - 1];
  }
  return 1;
}

/* ---- the matcher API ----------------------------------------------------- */
struct gr_matcher *gr_matcher_new(const struct gr_grammar *g) {
  struct gr_matcher *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->g = g;
  uint32_t root = g->root;
  if (closure(m, &m->todo, &root, 1, &m->cur) < 0 || ss_reserve(&m->next, 4, 64) ||
      ss_reserve(&m->alt, 4, 64)) {
    gr_matcher_free(m);
    return NULL;
  }
  return m;
}

struct gr_matcher *gr_matcher_clone(const struct gr_matcher *m) {
  struct gr_matcher *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->g = m->g;
  if (gr_matcher_copy(c, m)) {
    gr_matcher_free(c);
    return NULL;
  }
  return c;
}

int gr_matcher_copy(struct gr_matcher *m, const struct gr_matcher *src) {
  if (m->g != src->g) return CM_ERR_INVAL;
  if (m == src) return 0;
  m->truncated = src->truncated;
  return gr_stackset_copy(&m->cur, &src->cur);
}

void gr_matcher_free(struct gr_matcher *m) {
  if (!m) return;
  gr_stackset_free(&m->cur);
  gr_stackset_free(&m->next);
  gr_stackset_free(&m->alt);
  gr_stackset_free(&m->todo);
  gr_stackset_free(&m->walk);
  free(m->seen);
  for (uint32_t i = 0; i < m->n_levels; i++) {
    gr_stackset_free(&m->levels[i].set);
    gr_stackset_free(&m->levels[i].one);
  }
  for (uint32_t k = 0; k < GR_RET_MEMO; k++)
    gr_stackset_free(&m->ret[k].set);
  for (uint32_t k = 0; k < GR_STEP_MEMO; k++)
    gr_stackset_free(&m->amemo[k].set);
  free(m->levels);
  free(m);
}

int gr_matcher_accept_bytes(struct gr_matcher *m, const uint8_t *b, size_t n) {
  if (n == 0) return 0;
  if (!gr_step(m, &m->cur, b[0], &m->next)) return CM_ERR_INVAL;
  for (size_t i = 1; i < n; i++) {
    if (!gr_step(m, &m->next, b[i], &m->alt)) return CM_ERR_INVAL;
    struct gr_stackset t = m->next;
    m->next = m->alt;
    m->alt = t;
  }
  struct gr_stackset t = m->cur;
  m->cur = m->next;
  m->next = t;
  return 0;
}

int gr_matcher_accept_token(struct gr_matcher *m, const struct gr_vocab *v, int32_t id) {
  if (id < 0 || id >= v->n || v->lens[id] == 0) return CM_ERR_INVAL;
  return gr_matcher_accept_bytes(m, v->bytes[id], v->lens[id]);
}

int gr_matcher_is_accepting(const struct gr_matcher *m) {
  const struct gr_stackset *s = &m->cur;
  for (uint32_t i = 0; i < s->n; i++)
    if (s->off[i + 1] - s->off[i] == 1 && (m->g->flags[s->frames[s->off[i]]] & GR_F_FINAL))
      return 1;
  return 0;
}

int gr_matcher_can_continue(const struct gr_matcher *m) {
  const struct gr_stackset *s = &m->cur;
  for (uint32_t i = 0; i < s->n; i++)
    if (m->g->flags[s->frames[s->off[i + 1] - 1]] & GR_F_BYTES) return 1;
  return 0;
}

/* The bytes some stack of s can take next, as a 256-bit set; their count. */
static int next_bytes(const struct gr_grammar *g, const struct gr_stackset *s, uint8_t *ok) {
  memset(ok, 0, 256);
  int cnt = 0;
  for (uint32_t i = 0; i < s->n; i++) {
    const uint32_t *row = g->delta + (size_t)s->frames[s->off[i + 1] - 1] * g->n_cls;
    for (int b = 0; b < 256; b++)
      if (!ok[b] && row[g->cls[b]] != GR_NONE) ok[b] = 1, cnt++;
  }
  return cnt;
}

int gr_matcher_next_bytes(const struct gr_matcher *m, uint8_t *ok) {
  return next_bytes(m->g, &m->cur, ok);
}

size_t gr_matcher_forced(const struct gr_matcher *m, uint8_t *buf, size_t cap) {
  struct gr_matcher *w = gr_matcher_clone(m);
  if (!w) return 0;
  size_t k = 0;
  uint8_t ok[256];
  while (k < cap && !gr_matcher_is_accepting(w) && next_bytes(w->g, &w->cur, ok) == 1) {
    uint8_t b = (uint8_t)(memchr(ok, 1, 256) ? (const uint8_t *)memchr(ok, 1, 256) - ok : 0);
    if (gr_matcher_accept_bytes(w, &b, 1)) break;
    buf[k++] = b;
  }
  gr_matcher_free(w);
  return k;
}
