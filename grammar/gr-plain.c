/* gr-plain.c — the fast path of mask walks through plain text. Inside a JSON
 * string (or a free-text regex) nearly every token is allowed, and walking the
 * whole trie byte by byte costs milliseconds at V = 262,144. So: per grammar
 * state, how many plain characters any text may take from it (reach), and per
 * trie node, whether its whole subtree is plain text and how many characters
 * it spans (u8ok, nchars). Where a subtree fits the state's reach, the walk
 * allows all its tokens at once and skips it. */
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "grammar/gr-impl.h"

/* The UTF-8 decoder of plain text: 0 at a boundary; 1..3 continuation bytes
 * left; 4 after E0, 5 after ED, 6 after F0, 7 after F4 (their narrower second
 * byte). -1: not plain text. */
int gr_u8_step(int q, uint8_t b) {
  switch (q) {
  case 0:
    if (b >= 0x20 && b < 0x80) return b == '"' || b == '\\' ? -1 : 0;
    if (b >= 0xc2 && b <= 0xdf) return 1;
    if (b == 0xe0) return 4;
    if ((b >= 0xe1 && b <= 0xec) || b == 0xee || b == 0xef) return 2;
    if (b == 0xed) return 5;
    if (b == 0xf0) return 6;
    if (b >= 0xf1 && b <= 0xf3) return 3;
    if (b == 0xf4) return 7;
    return -1;
  case 1: return b >= 0x80 && b <= 0xbf ? 0 : -1;
  case 2: return b >= 0x80 && b <= 0xbf ? 1 : -1;
  case 3: return b >= 0x80 && b <= 0xbf ? 2 : -1;
  case 4: return b >= 0xa0 && b <= 0xbf ? 1 : -1;
  case 5: return b >= 0x80 && b <= 0x9f ? 1 : -1;
  case 6: return b >= 0x90 && b <= 0xbf ? 2 : -1;
  case 7: return b >= 0x80 && b <= 0x8f ? 2 : -1;
  }
  return -1;
}

int gr_plain_vocab(struct gr_vocab *v) {
  v->u8ok = malloc(v->n_nodes ? v->n_nodes : 1);
  v->nchars = malloc(v->n_nodes ? v->n_nodes : 1);
  v->tchars = malloc((size_t)v->n);
  if (!v->u8ok || !v->nchars || !v->tchars) return CM_ERR_NOMEM;
  for (int32_t id = 0; id < v->n; id++) {
    unsigned k = 0;
    for (uint32_t j = 0; j < v->lens[id]; j++)
      k += (v->bytes[id][j] & 0xc0) != 0x80;
    v->tchars[id] = (uint8_t)(k > 255 ? 255 : k);
  }
  if (v->max_len <= 64) {
    size_t words = ((size_t)v->n + 31) / 32;
    v->plain_le = calloc((v->max_len + 1) * words, sizeof *v->plain_le);
    if (!v->plain_le) return CM_ERR_NOMEM;
    for (int32_t id = 0; id < v->n; id++) {
      int q = v->lens[id] ? 0 : -1;
      for (uint32_t j = 0; j < v->lens[id] && q >= 0; j++)
        q = gr_u8_step(q, v->bytes[id][j]);
      if (q < 0 || v->tchars[id] > v->max_len) continue;
      v->plain_le[v->tchars[id] * words + (uint32_t)id / 32] |= 1u << (id & 31);
    }
    /* so far bitmap w holds exactly w characters: make it "at most w" */
    for (uint32_t w = 1; w <= v->max_len; w++)
      for (size_t k = 0; k < words; k++)
        v->plain_le[w * words + k] |= v->plain_le[(w - 1) * words + k];
  }
  v->asc = calloc((size_t)v->n_nodes * 2 + 2, sizeof *v->asc);
  v->wide = calloc((size_t)v->n_nodes / 8 + 1, 1);
  if (!v->asc || !v->wide) return CM_ERR_NOMEM;
  /* children come after their parent in preorder: fill from the end */
  for (uint32_t i = v->n_nodes; i-- > 0;) {
    uint8_t b = v->byte[i], ok = 0;
    unsigned most = 0;
    for (uint32_t j = i + 1; j < v->end[i]; j = v->end[j])
      if (v->nchars[j] > most) most = v->nchars[j];
    for (int q = 0; q < 8; q++) {
      int q2 = gr_u8_step(q, b);
      if (q2 < 0) continue;
      int all = 1;
      for (uint32_t j = i + 1; j < v->end[i] && all; j = v->end[j])
        all = v->u8ok[j] >> q2 & 1;
      if (all) ok |= (uint8_t)(1u << q);
    }
    v->u8ok[i] = ok;
    uint64_t lo = 0, hi = 0;
    int wide = b >= 0x80;
    if (b < 64)
      lo |= 1ull << b;
    else if (b < 128)
      hi |= 1ull << (b - 64);
    for (uint32_t j = i + 1; j < v->end[i]; j = v->end[j]) {
      lo |= v->asc[2 * (size_t)j];
      hi |= v->asc[2 * (size_t)j + 1];
      wide |= v->wide[j / 8] >> (j % 8) & 1;
    }
    v->asc[2 * (size_t)i] = lo;
    v->asc[2 * (size_t)i + 1] = hi;
    if (wide) v->wide[i / 8] |= (uint8_t)(1u << (i % 8));
    most += (b & 0xc0) != 0x80; /* continuation bytes start no character */
    v->nchars[i] = (uint8_t)(most > 255 ? 255 : most);
  }
  return 0;
}

/* ---- reach ------------------------------------------------------------------ */
static const uint8_t seqs[][4][2] = {
    {{0x20, 0x21}},
    {{0x23, 0x5b}},
    {{0x5d, 0x7f}},
    {{0xc2, 0xdf}, {0x80, 0xbf}},
    {{0xe0, 0xe0}, {0xa0, 0xbf}, {0x80, 0xbf}},
    {{0xe1, 0xec}, {0x80, 0xbf}, {0x80, 0xbf}},
    {{0xed, 0xed}, {0x80, 0x9f}, {0x80, 0xbf}},
    {{0xee, 0xef}, {0x80, 0xbf}, {0x80, 0xbf}},
    {{0xf0, 0xf0}, {0x90, 0xbf}, {0x80, 0xbf}, {0x80, 0xbf}},
    {{0xf1, 0xf3}, {0x80, 0xbf}, {0x80, 0xbf}, {0x80, 0xbf}},
    {{0xf4, 0xf4}, {0x80, 0x8f}, {0x80, 0xbf}, {0x80, 0xbf}},
};
static const int seq_len[] = {1, 1, 1, 2, 3, 3, 3, 3, 4, 4, 4};

struct targets {
  uint32_t *a;
  size_t n, cap;
  int fail;
};

static void push_target(struct targets *t, uint32_t s) {
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 16;
    uint32_t *a = realloc(t->a, cap * sizeof *a);
    if (!a) {
      t->fail = 1;
      return;
    }
    t->a = a;
    t->cap = cap;
  }
  t->a[t->n++] = s;
}

static void add_target(struct targets *t, uint32_t s) {
  for (size_t i = 0; i < t->n; i++)
    if (t->a[i] == s) return;
  push_target(t, s);
}

/* A state the walk's simple mode stays in: no calls, and no return (the end of
 * the root rule is no return: it is only ever at a stack's bottom). */
static int clean(const struct gr_grammar *g, uint32_t s) {
  return !(g->flags[s] & GR_F_CALLS) && (!(g->flags[s] & GR_F_FINAL) || s < g->n_root);
}

/* Follows every byte class of sequence k from s; the states after a whole
 * character go to t; fails when a byte has no edge or a state inside the
 * character calls or ends a rule. */
static void follow(const struct gr_grammar *g, uint32_t s, int k, int pos, struct targets *t) {
  if (t->fail) return;
  uint32_t lo = seqs[k][pos][0], hi = seqs[k][pos][1];
  int last_cls = -1;
  for (uint32_t b = lo; b <= hi && !t->fail; b++) {
    int c = g->cls[b];
    if (c == last_cls) continue;
    last_cls = c;
    uint32_t nx = g->delta[(size_t)s * g->n_cls + (uint32_t)c];
    if (nx == GR_NONE) {
      t->fail = 1;
      return;
    }
    if (pos + 1 == seq_len[k]) {
      add_target(t, nx);
    } else {
      if (!clean(g, nx)) {
        t->fail = 1;
        return;
      }
      follow(g, nx, k, pos + 1, t);
    }
  }
}

/* 1 when no plain character can start from s (every first byte has no edge). */
static int takes_none(const struct gr_grammar *g, uint32_t s) {
  const uint32_t *row = g->delta + (size_t)s * g->n_cls;
  for (uint32_t b = 0x20; b <= 0xf4; b++) {
    if (b == '"' || b == '\\' || (b >= 0x80 && b < 0xc2)) continue;
    if (row[g->cls[b]] != GR_NONE) return 0;
  }
  return 1;
}

int gr_plain_reach(struct gr_grammar *g) {
  uint32_t n = g->n_states;
  uint8_t *wall = malloc(n ? n : 1);
  uint8_t *reach = calloc(n ? n : 1, 1);
  uint32_t *off = calloc((size_t)n + 1, sizeof *off);
  struct targets all = {0};
  if (!reach || !off || !wall) goto nomem;
  for (uint32_t s = 0; s < n; s++) {
    off[s] = (uint32_t)all.n;
    if (!clean(g, s)) continue;
    struct targets t = {0};
    for (int k = 0; k < (int)(sizeof seq_len / sizeof seq_len[0]) && !t.fail; k++)
      follow(g, s, k, 0, &t);
    if (!t.fail) {
      reach[s] = 255;
      for (size_t i = 0; i < t.n && !all.fail; i++)
        push_target(&all, t.a[i]);
    }
    free(t.a);
    if (all.fail) goto nomem;
  }
  off[n] = (uint32_t)all.n;
  /* reach(s) = 1 + min reach(t): shrink from 255 until nothing changes */
  for (int changed = 1, round = 0; changed && round < 300; round++) {
    changed = 0;
    for (uint32_t s = 0; s < n; s++) {
      if (!reach[s]) continue;
      unsigned m = 255;
      for (uint32_t i = off[s]; i < off[s + 1]; i++)
        if (reach[all.a[i]] < m) m = reach[all.a[i]];
      unsigned r = m + 1 > 255 ? 255 : m + 1;
      if (r < reach[s]) reach[s] = (uint8_t)r, changed = 1;
    }
  }
  /* wall(s) = 0 where no plain character goes on; d + 1 where every plain
   * character goes to states whose wall is d */
  for (uint32_t s = 0; s < n; s++)
    wall[s] = clean(g, s) && takes_none(g, s) ? 0 : 255;
  for (int changed = 1, round = 0; changed && round < 300; round++) {
    changed = 0;
    for (uint32_t s = 0; s < n; s++) {
      if (wall[s] != 255 || !reach[s] || off[s] == off[s + 1]) continue;
      unsigned d = wall[all.a[off[s]]];
      for (uint32_t i = off[s]; i < off[s + 1] && d != 255; i++)
        if (wall[all.a[i]] != d) d = 255;
      if (d < 254) wall[s] = (uint8_t)(d + 1), changed = 1;
    }
  }
  free(off);
  free(all.a);
  uint64_t *loop = calloc((size_t)n * 2 + 2, sizeof *loop);
  if (!loop) goto nomem;
  for (uint32_t st = 0; st < n; st++) {
    if (!clean(g, st)) continue;
    const uint32_t *row = g->delta + (size_t)st * g->n_cls;
    for (uint32_t b = 0; b < 128; b++)
      if (row[g->cls[b]] == st) loop[2 * (size_t)st + b / 64] |= 1ull << (b % 64);
  }
  g->loop = loop;
  g->wall = wall;
  __atomic_store_n(&g->reach, reach, __ATOMIC_RELEASE);
  return 0;
nomem:
  free(wall);
  free(reach);
  free(off);
  free(all.a);
  return CM_ERR_NOMEM;
}
