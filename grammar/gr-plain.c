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
  v->tchars = malloc((size_t)v->n);
  if (!v->tchars) return CM_ERR_NOMEM;
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
    v->has = calloc((size_t)129 * words, sizeof *v->has);
    if (!v->has) return CM_ERR_NOMEM;
    for (int32_t id = 0; id < v->n; id++)
      for (uint32_t j = 0; j < v->lens[id]; j++) {
        uint32_t b = v->bytes[id][j] < 128 ? v->bytes[id][j] : 128;
        v->has[(size_t)b * words + (uint32_t)id / 32] |= 1u << (id & 31);
      }
    /* the tokens holding a byte after their first, as lists for the bytes few
     * tokens hold so: counted, then placed */
    uint8_t seen[129] = {0};
    for (int pass = 0; pass < 2; pass++) {
      for (int32_t id = 0; id < v->n; id++) {
        for (uint32_t j = 1; j < v->lens[id]; j++) {
          uint32_t b = v->bytes[id][j] < 128 ? v->bytes[id][j] : 128;
          if (seen[b]) continue;
          seen[b] = 1;
          if (!pass)
            v->tail_n[b]++;
          else if (v->tail_n[b] <= GR_TAIL_IDS)
            v->tail_ids[v->tail_at[b + 1]++] = id;
        }
        for (uint32_t j = 1; j < v->lens[id]; j++)
          seen[v->bytes[id][j] < 128 ? v->bytes[id][j] : 128] = 0;
      }
      if (pass) break;
      size_t n_ids = 0;
      for (uint32_t b = 0; b < 129; b++) {
        v->tail_at[b] = (uint32_t)n_ids;
        if (v->tail_n[b] <= GR_TAIL_IDS) n_ids += v->tail_n[b];
      }
      v->tail_at[129] = (uint32_t)n_ids;
      v->tail_ids = malloc((n_ids ? n_ids : 1) * sizeof *v->tail_ids);
      if (!v->tail_ids) return CM_ERR_NOMEM;
      /* tail_at[b + 1] is the fill point of b's list while it is filled */
      for (uint32_t b = 129; b-- > 0;)
        v->tail_at[b + 1] = v->tail_at[b];
    }
    /* so far bitmap w holds exactly w characters: make it "at most w" */
    for (uint32_t w = 1; w <= v->max_len; w++)
      for (size_t k = 0; k < words; k++)
        v->plain_le[w * words + k] |= v->plain_le[(w - 1) * words + k];
  }
  for (uint32_t b = 0, t = 0; b <= 256; b++) { /* ids is sorted by the tokens' bytes */
    while (t < (uint32_t)v->n_ids && v->bytes[v->ids[t]][0] < b)
      t++;
    v->first_at[b] = t;
  }
  /* children come after their parent in preorder: fill from the end */
  struct gr_node *node = v->node;
  for (uint32_t i = v->n_nodes; i-- > 0;) {
    struct gr_node *nd = &node[i];
    uint8_t b = nd->byte, ok = 0;
    unsigned most = 0;
    for (uint32_t j = i + 1; j < nd->end; j = node[j].end)
      if (node[j].nchars > most) most = node[j].nchars;
    for (int q = 0; q < 8; q++) {
      int q2 = gr_u8_step(q, b);
      if (q2 < 0) continue;
      int all = 1;
      for (uint32_t j = i + 1; j < nd->end && all; j = node[j].end)
        all = node[j].u8ok >> q2 & 1;
      if (all) ok |= (uint8_t)(1u << q);
    }
    nd->u8ok = ok;
    uint64_t lo = 0, hi = 0;
    int wide = b >= 0x80;
    if (b < 64)
      lo |= 1ull << b;
    else if (b < 128)
      hi |= 1ull << (b - 64);
    for (uint32_t j = i + 1; j < nd->end; j = node[j].end) {
      lo |= node[j].asc[0];
      hi |= node[j].asc[1];
      wide |= node[j].wide;
    }
    nd->asc[0] = lo;
    nd->asc[1] = hi;
    nd->wide = (uint8_t)wide;
    most += (b & 0xc0) != 0x80; /* continuation bytes start no character */
    nd->nchars = (uint8_t)(most > 255 ? 255 : most);
  }
  v->mixed = malloc((v->n_nodes ? (size_t)v->n_nodes : 1) * sizeof *v->mixed);
  if (!v->mixed) return CM_ERR_NOMEM;
  for (uint32_t i = v->n_nodes; i-- > 0;) {
    uint32_t e = node[i].end; /* the next sibling, or past the parent */
    int sib = e < v->n_nodes && node[e].depth == node[i].depth;
    v->mixed[i] = !(node[i].u8ok & 1) ? i : sib ? v->mixed[e] : e;
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

/* Follows every byte class of sequence k from s (but the ASCII bytes in term);
 * the states after a whole character go to t; fails when a byte has no edge or
 * a state inside the character calls or ends a rule. */
static void follow(const struct gr_grammar *g, uint32_t s, int k, int pos, const uint64_t *term,
                   struct targets *t) {
  if (t->fail) return;
  uint32_t lo = seqs[k][pos][0], hi = seqs[k][pos][1];
  int last_cls = -1;
  for (uint32_t b = lo; b <= hi && !t->fail; b++) {
    if (b < 128 && (term[b / 64] >> (b % 64) & 1)) continue;
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
      follow(g, nx, k, pos + 1, term, t);
    }
  }
}

/* 1 when no plain character (but those of term) can start from s (every first
 * byte has no edge). */
static int takes_none(const struct gr_grammar *g, uint32_t s, const uint64_t *term) {
  const uint32_t *row = g->delta + (size_t)s * g->n_cls;
  for (uint32_t b = 0x20; b <= 0xf4; b++) {
    if (b == '"' || b == '\\' || (b >= 0x80 && b < 0xc2)) continue;
    if (b < 128 && (term[b / 64] >> (b % 64) & 1)) continue;
    if (row[g->cls[b]] != GR_NONE) return 0;
  }
  return 1;
}

/* ---- runs of an ASCII alphabet ----------------------------------------------- */

/* bits b of the 128-bit set a */
static int has(const uint64_t *a, unsigned b) {
  return a[b / 64] >> (b % 64) & 1;
}

static void add_alpha(struct gr_grammar *g, const uint64_t *a) {
  if (!(a[0] | a[1]) || g->n_alpha >= GR_MAX_ALPHA) return;
  for (uint32_t k = 0; k < g->n_alpha; k++)
    if (g->alpha[2 * k] == a[0] && g->alpha[2 * k + 1] == a[1]) return;
  g->alpha[2 * g->n_alpha] = a[0];
  g->alpha[2 * g->n_alpha + 1] = a[1];
  g->n_alpha++;
}

static void range(uint64_t *a, unsigned lo, unsigned hi) {
  for (unsigned b = lo; b <= hi; b++)
    a[b / 64] |= 1ull << (b % 64);
}

/* Frees the alphabets and runs (runs() below); none are left. */
static void runs_free(struct gr_grammar *g) {
  free(g->alpha);
  free(g->run);
  free(g->run_any);
  free(g->run_set);
  g->alpha = NULL;
  g->run = g->run_any = NULL;
  g->run_set = NULL;
  g->n_alpha = 0;
}

/* The alphabets (common ones, then each state's own: the ASCII bytes that lead to
 * a state taking the same byte again, as a bounded run's or a loop's states do)
 * and each state's run of each (gr_grammar's run). CM_ERR_NOMEM leaves what it
 * made for the caller to free. */
static int runs(struct gr_grammar *g) {
  uint32_t n = g->n_states, nc = g->n_cls;
  g->alpha = calloc(2 * GR_MAX_ALPHA, sizeof *g->alpha);
  uint64_t *edges = calloc((size_t)n * 2 + 2, sizeof *edges); /* ASCII bytes with an edge */
  uint64_t *cls_bits = calloc((size_t)nc * 2 + 2, sizeof *cls_bits);
  uint32_t *cnt = NULL, *queue = NULL, *xcls = malloc(((size_t)nc + 1) * sizeof *xcls);
  if (!g->alpha || !edges || !cls_bits || !xcls) goto nomem;
  static const char *const common[] = {"09",     "az",       "AZ",   "azAZ",
                                       "09azAZ", "09azAZ__", "09af", "09afAF"};
  for (size_t i = 0; i < sizeof common / sizeof common[0]; i++) {
    uint64_t a[2] = {0, 0};
    for (const char *p = common[i]; p[0] && p[1]; p += 2)
      range(a, (uint8_t)p[0], (uint8_t)p[1]);
    add_alpha(g, a);
  }
  for (unsigned b = 0; b < 128; b++)
    cls_bits[2 * g->cls[b] + b / 64] |= 1ull << (b % 64);
  for (uint32_t s = 0; s < n; s++)
    for (uint32_t c = 0; c < nc; c++)
      if (g->delta[(size_t)s * nc + c] != GR_NONE) {
        edges[2 * (size_t)s] |= cls_bits[2 * c];
        edges[2 * (size_t)s + 1] |= cls_bits[2 * c + 1];
      }
  for (uint32_t s = 0; s < n; s++) {
    uint64_t a[2] = {0, 0};
    for (unsigned b = 0; b < 128; b++) {
      if (!has(edges + 2 * (size_t)s, b)) continue;
      uint32_t t = g->delta[(size_t)s * nc + g->cls[b]];
      if (has(edges + 2 * (size_t)t, b)) a[b / 64] |= 1ull << (b % 64);
    }
    add_alpha(g, a);
  }
  uint32_t na = g->n_alpha;
  g->run = malloc((size_t)n * na + 1);
  g->run_any = calloc((size_t)n + 1, 1);
  g->run_set = calloc((size_t)n * 2 + 2, sizeof *g->run_set);
  cnt = calloc((size_t)n + 1, sizeof *cnt);
  queue = malloc(((size_t)n + 1) * sizeof *queue);
  if (!g->run || !g->run_any || !g->run_set || !cnt || !queue) goto nomem;
  for (uint32_t k = 0; k < na; k++) {
    /* run(s) = 0 where a byte of x has no edge from s, else 1 + the least run after
     * one byte of x: the length of the shortest path over x's bytes to a state of
     * run 0, found breadth first from those states backwards */
    const uint64_t *x = g->alpha + 2 * k;
    uint32_t nxc = 0;
    for (uint32_t c = 0; c < nc; c++)
      if ((cls_bits[2 * c] & x[0]) || (cls_bits[2 * c + 1] & x[1])) xcls[nxc++] = c;
    uint8_t *run = g->run; /* run[s * na + k] */
    memset(cnt, 0, ((size_t)n + 1) * sizeof *cnt);
    size_t ne = 0;
    for (uint32_t s = 0; s < n; s++) {
      const uint64_t *e = edges + 2 * (size_t)s;
      int cand = !((x[0] & ~e[0]) || (x[1] & ~e[1]));
      run[(size_t)s * na + k] = cand ? 255 : 0;
      if (cand) /* its edges over x, counted at their targets */
        for (uint32_t j = 0; j < nxc; j++, ne++)
          cnt[g->delta[(size_t)s * nc + xcls[j]] + 1]++;
    }
    for (uint32_t s = 0; s < n; s++)
      cnt[s + 1] += cnt[s];
    uint32_t *pred = malloc((ne ? ne : 1) * sizeof *pred);
    if (!pred) goto nomem;
    for (uint32_t s = 0; s < n; s++)
      if (run[(size_t)s * na + k])
        for (uint32_t j = 0; j < nxc; j++)
          pred[cnt[g->delta[(size_t)s * nc + xcls[j]]]++] = s;
    /* cnt[t] is now the end of t's predecessors, cnt[t - 1] (or 0) their start */
    size_t qh = 0, qt = 0;
    for (uint32_t s = 0; s < n; s++)
      if (!run[(size_t)s * na + k]) queue[qt++] = s;
    while (qh < qt) {
      uint32_t t = queue[qh++];
      unsigned d = run[(size_t)t * na + k];
      for (uint32_t p = t ? cnt[t - 1] : 0; p < cnt[t]; p++) {
        uint8_t *r = &run[(size_t)pred[p] * na + k];
        if (*r == 255 && d < 254) {
          *r = (uint8_t)(d + 1);
          queue[qt++] = pred[p];
        }
      }
    }
    free(pred);
    for (uint32_t s = 0; s < n; s++)
      if (run[(size_t)s * na + k]) {
        if (run[(size_t)s * na + k] > g->run_any[s]) g->run_any[s] = run[(size_t)s * na + k];
        g->run_set[2 * (size_t)s] |= x[0];
        g->run_set[2 * (size_t)s + 1] |= x[1];
      }
  }
  free(edges);
  free(cls_bits);
  free(cnt);
  free(queue);
  free(xcls);
  return 0;
nomem:
  free(edges);
  free(cls_bits);
  free(cnt);
  free(queue);
  free(xcls);
  return CM_ERR_NOMEM;
}

/* 1 when the 128-bit set a is within b */
static int within(const uint64_t *a, const uint64_t *b) {
  return !(a[0] & ~b[0]) && !(a[1] & ~b[1]);
}

/* term[s]: the plain ASCII bytes that do not lead where most of them lead from s
 * (the quote that ends a run of [^']{0,24}): the plain text of s's reach and
 * wall is without them. */
static int terms(const struct gr_grammar *g, uint64_t *term) {
  uint32_t nc = g->n_cls;
  uint32_t *per = calloc((size_t)nc + 1, sizeof *per); /* plain ASCII bytes of each class */
  uint32_t *tgt = malloc(((size_t)nc + 1) * sizeof *tgt), *cnt = malloc(((size_t)nc + 1) * 4);
  if (!per || !tgt || !cnt) {
    free(per), free(tgt), free(cnt);
    return CM_ERR_NOMEM;
  }
  for (uint32_t b = 0x20; b < 0x80; b++)
    per[g->cls[b]] += b != '"' && b != '\\';
  for (uint32_t s = 0; s < g->n_states; s++) {
    const uint32_t *row = g->delta + (size_t)s * nc;
    uint32_t main = GR_NONE, best = 0, nt = 0;
    for (uint32_t c = 0; c < nc; c++) { /* the target most plain bytes go to */
      if (!per[c] || row[c] == GR_NONE) continue;
      uint32_t j = 0;
      while (j < nt && tgt[j] != row[c])
        j++;
      if (j == nt) tgt[nt] = row[c], cnt[nt++] = 0;
      if ((cnt[j] += per[c]) > best) best = cnt[j], main = row[c];
    }
    uint64_t *x = term + 2 * (size_t)s;
    x[0] = x[1] = 0;
    for (uint32_t b = 0x20; b < 0x80; b++)
      if (b != '"' && b != '\\' && row[g->cls[b]] != main) x[b / 64] |= 1ull << (b % 64);
  }
  free(per), free(tgt), free(cnt);
  return 0;
}

int gr_plain_reach(struct gr_grammar *g) {
  uint32_t n = g->n_states;
  uint8_t *wall = malloc(n ? n : 1);
  uint8_t *reach = calloc(n ? n : 1, 1);
  uint32_t *off = calloc((size_t)n + 1, sizeof *off);
  uint64_t *term = calloc((size_t)n * 2 + 2, sizeof *term);
  struct targets all = {0};
  if (!reach || !off || !wall || !term || terms(g, term)) goto nomem;
  for (uint32_t s = 0; s < n; s++) {
    off[s] = (uint32_t)all.n;
    if (!clean(g, s)) continue;
    struct targets t = {0};
    for (int k = 0; k < (int)(sizeof seq_len / sizeof seq_len[0]) && !t.fail; k++)
      follow(g, s, k, 0, term + 2 * (size_t)s, &t);
    if (!t.fail) {
      reach[s] = 255;
      for (size_t i = 0; i < t.n && !all.fail; i++)
        push_target(&all, t.a[i]);
    }
    free(t.a);
    if (all.fail) goto nomem;
  }
  off[n] = (uint32_t)all.n;
  /* reach(s) = 1 + min reach(t): shrink from 255 until nothing changes (a target
   * whose plain text leaves out bytes that s's does not counts as 0) */
  for (int changed = 1, round = 0; changed && round < 300; round++) {
    changed = 0;
    for (uint32_t s = 0; s < n; s++) {
      if (!reach[s]) continue;
      unsigned m = 255;
      for (uint32_t i = off[s]; i < off[s + 1]; i++) {
        uint32_t t = all.a[i];
        unsigned r = within(term + 2 * (size_t)t, term + 2 * (size_t)s) ? reach[t] : 0;
        if (r < m) m = r;
      }
      unsigned r = m + 1 > 255 ? 255 : m + 1;
      if (r < reach[s]) reach[s] = (uint8_t)r, changed = 1;
    }
  }
  /* wall(s) = 0 where no plain character goes on; d + 1 where every plain
   * character goes to states whose wall is d */
  for (uint32_t s = 0; s < n; s++)
    wall[s] = clean(g, s) && takes_none(g, s, term + 2 * (size_t)s) ? 0 : 255;
  for (int changed = 1, round = 0; changed && round < 300; round++) {
    changed = 0;
    for (uint32_t s = 0; s < n; s++) {
      if (wall[s] != 255 || !reach[s] || off[s] == off[s + 1]) continue;
      /* a target whose term is another's counts as 0 when it takes none of s's plain
       * text (the last state of a run of [^']{0,24}, which only takes the quote) */
      unsigned d = 256;
      for (uint32_t i = off[s]; i < off[s + 1] && d != 255; i++) {
        uint32_t t = all.a[i];
        unsigned w = within(term + 2 * (size_t)t, term + 2 * (size_t)s)      ? wall[t]
                     : clean(g, t) && takes_none(g, t, term + 2 * (size_t)s) ? 0
                                                                             : 255;
        if (d == 256) d = w;
        if (w != d) d = 255;
      }
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
  /* what each state takes: its ASCII bytes, and bit 128 any other */
  uint64_t *takes = calloc((size_t)n * 3 + 3, sizeof *takes);
  if (!takes) {
    free(loop);
    goto nomem;
  }
  for (uint32_t st = 0; st < n; st++) {
    const uint32_t *row = g->delta + (size_t)st * g->n_cls;
    for (uint32_t b = 0; b < 256; b++)
      if (row[g->cls[b]] != GR_NONE) {
        uint32_t bit = b < 128 ? b : 128;
        takes[3 * (size_t)st + bit / 64] |= 1ull << (bit % 64);
      }
  }
  g->takes = takes;
  g->loop = loop;
  g->wall = wall;
  g->term = term;
  if (runs(g)) runs_free(g); /* out of memory: masks go without the fast path of runs */
  __atomic_store_n(&g->reach, reach, __ATOMIC_RELEASE);
  return 0;
nomem:
  free(wall);
  free(reach);
  free(off);
  free(term);
  free(all.a);
  return CM_ERR_NOMEM;
}

void gr_plain_free(struct gr_grammar *g) {
  free(g->reach);
  free(g->wall);
  free(g->loop);
  free(g->term);
  free(g->takes);
  runs_free(g);
}
