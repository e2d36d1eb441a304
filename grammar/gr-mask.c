/* gr-mask.c — vocabularies as a byte trie in preorder, and token masks: a walk
 * of the trie that carries the matcher's state down each path and skips every
 * subtree whose prefix the grammar refuses. Masks are memoized per exact
 * matcher state in a bounded cache kept with the grammar (states recur: inside
 * a string, after a comma, at the same depth of an object). */
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-hash.h"
#include "grammar/gr-impl.h"

/* ---- vocabularies ---------------------------------------------------------- */
static uint64_t g_vocab_serial;

static int cmp_tok(const void *a, const void *b, void *ctx) {
  const struct gr_vocab *v = ctx;
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  uint32_t lx = v->lens[x], ly = v->lens[y];
  int c = memcmp(v->bytes[x], v->bytes[y], lx < ly ? lx : ly);
  if (c) return c;
  if (lx != ly) return lx < ly ? -1 : 1;
  return x < y ? -1 : x > y;
}

_Static_assert(sizeof(struct gr_node) == 32, "a trie node is half a cache line");

/* How many leading bytes the t-th token in sorted order shares with the one
 * before it. */
static uint32_t shared_prefix(const struct gr_vocab *v, int32_t t) {
  if (t == 0) return 0;
  const uint8_t *s = v->bytes[v->ids[t]], *p = v->bytes[v->ids[t - 1]];
  uint32_t len = v->lens[v->ids[t]], pl = v->lens[v->ids[t - 1]], l = 0;
  while (l < len && l < pl && s[l] == p[l])
    l++;
  return l;
}

#define GR_KIDS_MIN 6 /* children of a node that get a table */

/* The children tables (gr_vocab.kid_at): for the root and each node with at least
 * GR_KIDS_MIN children, while their numbers fit gr_node.kids. */
static int kid_tables(struct gr_vocab *v) {
  struct gr_node *node = v->node;
  uint32_t n_tab = 0, n_kid = 0;
  for (int pass = 0; pass < 2; pass++) {
    n_tab = n_kid = 0;
    for (int64_t p = -1; p < (int64_t)v->n_nodes && n_tab < UINT16_MAX; p++) {
      uint32_t first = (uint32_t)(p + 1), end = p < 0 ? v->n_nodes : node[p].end, k = 0;
      for (uint32_t c = first; c < end; c = node[c].end)
        k++;
      if (k < GR_KIDS_MIN) continue;
      if (pass) {
        v->kid_at[n_tab] = n_kid;
        for (uint32_t c = first, j = n_kid; c < end; c = node[c].end, j++) {
          v->kid_node[j] = c;
          v->kid_byte[j] = node[c].byte;
        }
        if (p < 0)
          v->kids_root = (uint16_t)(n_tab + 1);
        else
          node[p].kids = (uint16_t)(n_tab + 1);
      }
      n_tab++;
      n_kid += k;
    }
    if (!pass) {
      v->kid_at = malloc(((size_t)n_tab + 1) * sizeof *v->kid_at);
      v->kid_node = malloc((n_kid ? (size_t)n_kid : 1) * sizeof *v->kid_node);
      v->kid_byte = malloc(n_kid ? n_kid : 1);
      if (!v->kid_at || !v->kid_node || !v->kid_byte) return CM_ERR_NOMEM;
    }
  }
  v->kid_at[n_tab] = n_kid;
  return 0;
}

/* gr_vocab_create, with the trie of the tokens that are not plain text (rest)
 * made too when rest is set. */
static int vocab_make(const uint8_t *const *bytes, const uint32_t *lens, int32_t n, int rest,
                      struct gr_vocab **out) {
  *out = NULL;
  if (n <= 0 || !bytes || !lens) return CM_ERR_INVAL;
  struct gr_vocab *v = calloc(1, sizeof *v);
  if (!v) return CM_ERR_NOMEM;
  int rc = CM_ERR_NOMEM;
  size_t total = 0;
  int32_t n_ids = 0;
  for (int32_t i = 0; i < n; i++) {
    if (lens[i] > 65535) {
      rc = CM_ERR_TOOBIG;
      goto fail;
    }
    if (lens[i] && !bytes[i]) {
      rc = CM_ERR_INVAL;
      goto fail;
    }
    total += lens[i];
    n_ids += lens[i] > 0;
  }
  v->n = n;
  v->lens = malloc((size_t)n * sizeof *v->lens);
  v->bytes = malloc((size_t)n * sizeof *v->bytes);
  v->blob = malloc(total ? total : 1);
  v->ids = malloc((n_ids ? (size_t)n_ids : 1) * sizeof *v->ids);
  if (!v->lens || !v->bytes || !v->blob || !v->ids) goto fail;
  size_t at = 0;
  int32_t k = 0;
  for (int32_t i = 0; i < n; i++) {
    v->lens[i] = lens[i];
    v->bytes[i] = v->blob + at;
    if (lens[i]) memcpy(v->blob + at, bytes[i], lens[i]);
    at += lens[i];
    if (lens[i]) v->ids[k++] = i;
    if (lens[i] > v->max_len) v->max_len = lens[i];
  }
  qsort_r(v->ids, (size_t)n_ids, sizeof *v->ids, cmp_tok, v);
  /* the trie in preorder: each token adds the nodes past its common prefix with
   * the one before it in sorted order (counted first, then made) */
  uint64_t count = 0;
  for (int32_t t = 0; t < n_ids; t++)
    count += v->lens[v->ids[t]] - shared_prefix(v, t);
  if (count >= UINT32_MAX) { /* node ids are 32-bit */
    rc = CM_ERR_TOOBIG;
    goto fail;
  }
  uint32_t nn = (uint32_t)count, path_len = 0;
  v->node = calloc((size_t)nn + 1, sizeof *v->node);
  uint32_t *path = malloc(((size_t)v->max_len + 1) * sizeof *path);
  if (!v->node || !path) {
    free(path);
    goto fail;
  }
  struct gr_node *node = v->node;
  nn = 0;
  for (int32_t t = 0; t < n_ids; t++) {
    int32_t id = v->ids[t];
    const uint8_t *s = v->bytes[id];
    uint32_t len = v->lens[id], l = shared_prefix(v, t);
    for (uint32_t d = l; d < path_len; d++)
      node[path[d]].end = nn; /* subtrees that close */
    path_len = l;
    for (uint32_t d = l; d < len; d++) {
      node[nn].byte = s[d];
      node[nn].depth = (uint16_t)(d + 1);
      node[nn].tok = (uint32_t)t;
      path[path_len++] = nn++;
    }
  }
  for (uint32_t d = 0; d < path_len; d++)
    node[path[d]].end = nn;
  node[nn].tok = (uint32_t)n_ids;
  /* a node's tokens begin where its first token was placed; nodes made for a
   * longer token's inner bytes have none: tok[i] == tok[i+1] must hold there */
  for (uint32_t i = nn; i-- > 0;) {
    int32_t id = v->ids[node[i].tok < (uint32_t)n_ids ? node[i].tok : 0];
    if (node[i].tok >= (uint32_t)n_ids || v->lens[id] != node[i].depth)
      node[i].tok = node[i + 1].tok;
  }
  free(path);
  v->n_nodes = nn;
  v->n_ids = n_ids;
  rc = kid_tables(v);
  if (rc) goto fail;
  rc = gr_plain_vocab(v);
  if (rc) goto fail;
  if (rest && v->plain_le) { /* the same tokens, those of plain_le's last bitmap left out */
    size_t words = ((size_t)n + 31) / 32;
    const uint32_t *plain = v->plain_le + (size_t)v->max_len * words;
    uint32_t *rl = malloc((size_t)n * sizeof *rl);
    if (!rl) goto fail;
    for (int32_t i = 0; i < n; i++)
      rl[i] = plain[i / 32] >> (i % 32) & 1 ? 0 : lens[i];
    rc = vocab_make(bytes, rl, n, 0, &v->rest);
    free(rl);
    if (rc) goto fail;
    free(v->rest->plain_le); /* a walk of rest copies in the plain tokens of v's */
    free(v->rest->has);
    free(v->rest->tail_ids);
    v->rest->plain_le = NULL;
    v->rest->has = NULL;
    v->rest->tail_ids = NULL;
  }
  v->serial = __atomic_add_fetch(&g_vocab_serial, 1, __ATOMIC_RELAXED);
  *out = v;
  return 0;
fail:
  gr_vocab_free(v);
  return rc;
}

int gr_vocab_create(const uint8_t *const *bytes, const uint32_t *lens, int32_t n,
                    struct gr_vocab **out) {
  return vocab_make(bytes, lens, n, 1, out);
}

void gr_vocab_free(struct gr_vocab *v) {
  if (!v) return;
  gr_vocab_free(v->rest);
  free(v->lens);
  free(v->bytes);
  free(v->blob);
  free(v->ids);
  free(v->node);
  free(v->mixed);
  free(v->kid_at);
  free(v->kid_node);
  free(v->kid_byte);
  free(v->tchars);
  free(v->plain_le);
  free(v->has);
  free(v->tail_ids);
  free(v);
}

int32_t gr_vocab_size(const struct gr_vocab *v) {
  return v->n;
}

uint32_t gr_vocab_token(const struct gr_vocab *v, int32_t id, const uint8_t **bytes) {
  if (id < 0 || id >= v->n) {
    *bytes = NULL;
    return 0;
  }
  *bytes = v->bytes[id];
  return v->lens[id];
}

/* ---- the mask cache ------------------------------------------------------------ */
#define GR_CACHE_BYTES (4u << 20) /* masks kept per grammar */

struct gr_cache_entry {
  uint64_t h;
  uint32_t *key; /* n, off[0..n], frames: the exact stack set */
  uint32_t key_len;
  uint32_t *bits;
  uint64_t used; /* the clock when last used (0: never) */
};

struct gr_mask_cache {
  uint64_t serial; /* the vocabulary the masks are for */
  uint32_t words;  /* per mask */
  uint32_t n;      /* entries (a power of two, at least 2): sets of two ways, by hash */
  uint64_t clock;
  struct gr_cache_entry *e;
  uint64_t hits, misses;
};

void gr_mask_cache_free(struct gr_mask_cache *c) {
  if (!c) return;
  for (uint32_t i = 0; i < c->n; i++) {
    free(c->e[i].key);
    free(c->e[i].bits);
  }
  free(c->e);
  free(c);
}

static uint32_t key_len(const struct gr_stackset *s) {
  return 2 + s->n + (s->n ? s->off[s->n] : 0);
}

static void key_fill(const struct gr_stackset *s, uint32_t *k) {
  k[0] = s->n;
  for (uint32_t i = 0; i <= s->n; i++)
    k[1 + i] = s->n ? s->off[i] : 0;
  if (s->n) memcpy(k + 2 + s->n, s->frames, s->off[s->n] * sizeof *k);
}

static int key_eq(const struct gr_cache_entry *e, const struct gr_stackset *s) {
  if (!e->key || e->key_len != key_len(s) || e->key[0] != s->n) return 0;
  for (uint32_t i = 0; i <= s->n; i++)
    if (e->key[1 + i] != (s->n ? s->off[i] : 0)) return 0;
  return !s->n || memcmp(e->key + 2 + s->n, s->frames, s->off[s->n] * sizeof *s->frames) == 0;
}

/* Copies the cached mask of m's state into bits: 1, or 0 when there is none. */
static int cache_get(struct gr_grammar *g, const struct gr_vocab *v, const struct gr_stackset *s,
                     uint64_t h, uint32_t *bits) {
  int hit = 0;
  pthread_mutex_lock(&g->lock);
  struct gr_mask_cache *c = g->cache;
  if (c && c->serial == v->serial) {
    struct gr_cache_entry *set = &c->e[(h & (c->n / 2 - 1)) * 2];
    for (int w = 0; w < 2 && !hit; w++) {
      struct gr_cache_entry *e = &set[w];
      if (e->h == h && key_eq(e, s)) {
        memcpy(bits, e->bits, c->words * sizeof *bits);
        e->used = ++c->clock;
        hit = 1;
      }
    }
    if (hit)
      c->hits++;
    else
      c->misses++;
  }
  pthread_mutex_unlock(&g->lock);
  return hit;
}

static void cache_put(struct gr_grammar *g, const struct gr_vocab *v, const struct gr_stackset *s,
                      uint64_t h, const uint32_t *bits) {
  uint32_t words = ((uint32_t)v->n + 31) / 32;
  pthread_mutex_lock(&g->lock);
  struct gr_mask_cache *c = g->cache;
  if (c && c->serial != v->serial) { /* another vocabulary: start over */
    gr_mask_cache_free(c);
    c = g->cache = NULL;
  }
  if (!c) {
    c = calloc(1, sizeof *c);
    uint32_t n = 1;
    while ((size_t)n * 2 * words * 4 <= GR_CACHE_BYTES && n < 4096)
      n *= 2;
    if (c) c->e = calloc(n, sizeof *c->e);
    if (!c || !c->e) {
      free(c);
      goto out;
    }
    c->serial = v->serial;
    c->words = words;
    c->n = n;
    g->cache = c;
  }
  /* two ways per set: the one used least recently goes */
  struct gr_cache_entry *set = &c->e[(h & (c->n / 2 - 1)) * 2];
  struct gr_cache_entry *e = set[0].used <= set[1].used ? &set[0] : &set[1];
  e->used = ++c->clock;
  uint32_t kl = key_len(s);
  if (!e->bits) e->bits = malloc(words * sizeof *e->bits);
  if (e->key_len < kl || !e->key) {
    free(e->key);
    e->key = malloc(kl * sizeof *e->key);
  }
  if (!e->bits || !e->key) {
    free(e->key);
    e->key = NULL;
    e->key_len = 0;
    goto out;
  }
  key_fill(s, e->key);
  e->key_len = kl;
  e->h = h;
  memcpy(e->bits, bits, words * sizeof *bits);
out:
  pthread_mutex_unlock(&g->lock);
}

/* ---- the walk ------------------------------------------------------------------ */
static int levels_reserve(struct gr_matcher *m, uint32_t n) {
  if (m->n_levels >= n) return 0;
  struct gr_level *l = realloc(m->levels, n * sizeof *l);
  if (!l) return CM_ERR_NOMEM;
  memset(l + m->n_levels, 0, (n - m->n_levels) * sizeof *l);
  m->levels = l;
  m->n_levels = n;
  return 0;
}

/* Level d's set, written out when it is simple (its base with the top replaced). */
static const struct gr_stackset *level_set(struct gr_matcher *m, uint32_t d) {
  struct gr_level *l = &m->levels[d];
  if (!l->simple) return &l->set;
  const struct gr_stackset *c = l->base;
  uint32_t len = c->off[1];
  if (c->frames[len - 1] == l->top) return c;
  struct gr_stackset *w = &m->walk;
  if (gr_stackset_copy(w, c)) return NULL;
  w->frames[len - 1] = l->top;
  w->hash[0] = 0; /* not used for steps */
  return w;
}

/* Every token of trie node i's subtree into bits. */
static void allow_subtree(const struct gr_vocab *v, uint32_t i, uint32_t *bits) {
  const struct gr_node *nd = &v->node[i];
  for (uint32_t k = nd->tok; k < v->node[nd->end].tok; k++) {
    uint32_t id = (uint32_t)v->ids[k];
    bits[id >> 5] |= 1u << (id & 31);
  }
}

/* Whether state s takes every token below trie node i by its rule's own edges:
 * the subtree is ASCII of an alphabet s takes a run of, no longer than the run. */
static int run_covers(const struct gr_grammar *g, const struct gr_vocab *v, uint32_t s,
                      uint32_t i) {
  const struct gr_node *nd = &v->node[i];
  if (!g->run_any || g->run_any[s] < nd->nchars || nd->wide) return 0;
  const uint8_t *run = g->run + (size_t)s * g->n_alpha;
  const uint64_t *sub = nd->asc, *un = g->run_set + 2 * (size_t)s;
  if ((sub[0] & ~un[0]) || (sub[1] & ~un[1])) return 0; /* a byte of none of them */
  for (uint32_t k = 0; k < g->n_alpha; k++)
    if (run[k] >= nd->nchars && !(sub[0] & ~g->alpha[2 * k]) && !(sub[1] & ~g->alpha[2 * k + 1]))
      return 1;
  return 0;
}

/* The next child in level *act's table whose byte the level's state may take (its
 * subtree's end into cend), or when none is left the end of the table's node,
 * the table closed and *act the next one out. A set of stacks is closed (every
 * stack's top takes bytes: calls and returns are expanded), so a byte none of
 * the tops takes is refused by the set too. */
static uint32_t next_kid(const struct gr_grammar *g, const struct gr_vocab *v, struct gr_level *lv,
                         int *act) {
  struct gr_level *l = &lv[*act];
  const uint32_t *row = g->delta + (size_t)l->top * g->n_cls;
  for (uint32_t k = l->kpos, e = v->kid_at[l->kt]; k < e; k++) {
    uint32_t c = g->cls[v->kid_byte[k]];
    int takes = l->simple && row[c] != GR_NONE;
    for (uint32_t j = 0; !l->simple && j < l->set.n && !takes; j++)
      takes = g->delta[(size_t)l->set.frames[l->set.off[j + 1] - 1] * g->n_cls + c] != GR_NONE;
    if (takes) {
      uint32_t kc = v->kid_node[k];
      l->kpos = k + 1;
      l->cend = v->node[kc].end;
      return kc;
    }
  }
  l->kt = 0;
  *act = l->kprev;
  return l->pend;
}

/* Level l follows the children table kt of a node whose subtree ends at
 * end, from the walk's next step on. */
static void open_kids(const struct gr_vocab *v, struct gr_level *l, uint32_t kt, uint32_t end,
                      int *act, int d) {
  l->kt = kt;
  l->kpos = v->kid_at[kt - 1];
  l->pend = end;
  l->cend = 0; /* the first child: at once */
  l->kprev = *act;
  *act = d;
}

/* What a walk keeps from its first state. */
struct walk_env {
  struct gr_matcher *m;
  const struct gr_vocab *v;
  uint32_t *bits;
  int pre, termless;
  const uint64_t *term0;
};

/* The walk over nodes [first, end): the whole trie, or the subtree below a node
 * at depth d, whose level lv[d] is set (act: the innermost level whose children
 * table is open, -1: none). Below a node where a step leaves several stacks, the
 * subtree is walked once for each stack alone: a token is allowed by a set when
 * one of its stacks allows it, and a stack alone steps on its top state (one
 * table look-up a byte) until it calls or returns, where a step of the whole
 * set would expand them for every node below. */
/* Whether state s may take a byte below trie node i (the subtree's bytes, its own
 * included: a superset of its children's). */
static int may_take(const struct gr_grammar *g, uint32_t s, const struct gr_node *nd) {
  const uint64_t *t = g->takes + 3 * (size_t)s;
  return (t[0] & nd->asc[0]) || (t[1] & nd->asc[1]) || ((t[2] & 1) && nd->wide);
}

static int walk_range(struct walk_env *e, uint32_t first, uint32_t end, int act);

/* Walks the subtree below node i (at depth d, lv[d] its level) once for each stack
 * of lv[d].set alone that may take a byte below it, then once more for the stack
 * base with its top replaced by top when base is set. */
static int walk_alone(struct walk_env *e, uint32_t i, uint32_t d, uint32_t top,
                      const struct gr_stackset *base) {
  struct gr_level *l = &e->m->levels[d];
  const struct gr_node *nd = &e->v->node[i];
  for (uint32_t j = 0; j <= l->set.n; j++) {
    if (j < l->set.n) {
      if (!may_take(e->m->g, l->set.frames[l->set.off[j + 1] - 1], nd)) continue;
      if (gr_stackset_one(&l->one, &l->set, j)) return CM_ERR_NOMEM;
      l->top = l->one.frames[l->one.off[1] - 1];
      l->base = &l->one;
    } else if (base) {
      l->top = top;
      l->base = base;
    } else {
      break;
    }
    l->simple = 1;
    int a = -1;
    if (!e->pre && nd->kids) open_kids(e->v, l, nd->kids, nd->end, &a, (int)d);
    int rc = walk_range(e, i + 1, nd->end, a);
    if (rc) return rc;
  }
  return 0;
}

static int walk_range(struct walk_env *e, uint32_t first, uint32_t end, int act) {
  struct gr_matcher *m = e->m;
  const struct gr_grammar *g = m->g;
  const struct gr_vocab *v = e->v;
  uint32_t *bits = e->bits;
  const int pre = e->pre, termless = e->termless;
  const uint64_t *term0 = e->term0;
  struct gr_level *lv = m->levels;
  const uint8_t *reach = g->reach, *wall = g->wall;
  const uint64_t *loop = g->loop;
  const uint32_t *delta = g->delta;
  const uint8_t *flags = g->flags;
  uint32_t ncls = g->n_cls;
  for (uint32_t i = first;;) {
    while (act >= 0 && i >= lv[act].cend)
      i = next_kid(g, v, lv, &act);
    if (i >= end) break;
    const struct gr_node *nd = &v->node[i];
    uint32_t d = nd->depth;
    uint8_t b = nd->byte;
    struct gr_level *pl = &lv[d - 1], *l = &lv[d];
    int ok;
    l->pc = pl->pc + ((b & 0xc0) != 0x80);
    l->pq = pl->pq < 0 ? -1 : gr_u8_step(pl->pq, b);
    l->pt = pl->pt || (b < 128 && (term0[b / 64] >> (b % 64) & 1));
    if (pre && pl->pq >= 0 && !l->pt && (nd->u8ok >> pl->pq & 1) && !(nd->asc[0] & term0[0]) &&
        !(nd->asc[1] & term0[1])) {
      /* plain tokens: already in; at a character boundary with no term, so
       * are the plain siblings that follow */
      i = pl->pq == 0 && termless ? v->mixed[i] : nd->end;
      continue;
    }
    if (pl->simple) {
      const uint64_t *tm = g->term + 2 * (size_t)pl->top, *sub = nd->asc;
      int plain = (nd->u8ok & 1) && !(sub[0] & tm[0]) && !(sub[1] & tm[1]);
      if (reach[pl->top] && plain && nd->nchars <= reach[pl->top]) {
        /* plain text the state takes whole: every token below is allowed */
        allow_subtree(v, i, bits);
        i = nd->end;
        continue;
      }
      const uint64_t *lp = loop + 2 * (size_t)pl->top, *as = nd->asc;
      if ((lp[0] | lp[1]) && !(as[0] & ~lp[0]) && !(as[1] & ~lp[1]) && !nd->wide) {
        /* ASCII bytes the state loops on, only: every token below is allowed */
        allow_subtree(v, i, bits);
        i = nd->end;
        continue;
      }
      if (run_covers(g, v, pl->top, i)) {
        allow_subtree(v, i, bits);
        i = nd->end;
        continue;
      }
      if (wall[pl->top] != 255 && plain) {
        /* plain text into a bounded string: the tokens short enough */
        uint32_t w = wall[pl->top] + pl->pc; /* counted from the token's start */
        if (l->pc > w) { /* every token below is longer: none */
          i = nd->end;
          continue;
        }
        if (pl->pc + nd->nchars <= w) { /* every token below fits */
          allow_subtree(v, i, bits);
          i = nd->end;
          continue;
        }
        for (uint32_t k = nd->tok; k < v->node[nd->end].tok; k++) {
          uint32_t id = (uint32_t)v->ids[k];
          if (v->tchars[id] <= w) bits[id >> 5] |= 1u << (id & 31);
        }
        i = nd->end;
        continue;
      }
      uint32_t t = delta[(size_t)pl->top * ncls + g->cls[b]];
      if (t == GR_NONE) {
        i = nd->end;
        continue;
      }
      uint8_t fl = flags[t];
      if (!(fl & GR_F_CALLS) && (!(fl & GR_F_FINAL) || pl->base->off[1] == 1)) {
        l->simple = 1;
        l->top = t;
        l->base = pl->base;
        ok = 1;
      } else if (!(fl & GR_F_CALLS)) {
        /* t may end its rule: the stack on t (when t takes bytes) and the stacks
         * after the return, which depend on the caller's frames alone (gr_returns
         * remembers them), each walked alone below */
        const struct gr_stackset *r = gr_returns(m, pl->base->frames, pl->base->off[1] - 1);
        if (!r || gr_stackset_copy(&l->set, r)) return CM_ERR_NOMEM;
        if (!(fl & GR_F_BYTES) && !l->set.n) {
          i = nd->end;
          continue;
        }
        for (uint32_t k = nd->tok; k < nd[1].tok; k++) {
          uint32_t id = (uint32_t)v->ids[k];
          bits[id >> 5] |= 1u << (id & 31);
        }
        if (nd->end > i + 1) {
          int rc = walk_alone(e, i, d, t, fl & GR_F_BYTES ? pl->base : NULL);
          if (rc) return rc;
        }
        i = nd->end;
        continue;
      } else {
        const struct gr_stackset *in = level_set(m, d - 1);
        if (!in) return CM_ERR_NOMEM;
        l->simple = 0;
        ok = gr_step(m, in, b, &l->set);
      }
    } else {
      /* one stack whose state takes the whole subtree as a run: all allowed */
      int covered = 0;
      for (uint32_t j = 0; j < pl->set.n && !covered; j++)
        covered = run_covers(g, v, pl->set.frames[pl->set.off[j + 1] - 1], i);
      if (covered) {
        allow_subtree(v, i, bits);
        i = nd->end;
        continue;
      }
      l->simple = 0;
      ok = gr_step(m, &pl->set, b, &l->set);
    }
    if (!ok) {
      i = nd->end;
      continue;
    }
    if (!l->simple && l->set.n == 1) { /* one stack again: simple below, on this set */
      l->simple = 1;
      l->top = l->set.frames[l->set.off[1] - 1];
      l->base = &l->set;
    }
    for (uint32_t k = nd->tok; k < nd[1].tok; k++) {
      uint32_t id = (uint32_t)v->ids[k];
      bits[id >> 5] |= 1u << (id & 31);
    }
    if (!l->simple && l->set.n > 1 && nd->end > i + 1) {
      int rc = walk_alone(e, i, d, 0, NULL);
      if (rc) return rc;
      i = nd->end;
      continue;
    }
    if (!pre && nd->kids) open_kids(v, l, nd->kids, nd->end, &act, (int)d);
    i++;
  }
  return 0;
}

static int walk(struct gr_matcher *m, const struct gr_vocab *v, uint32_t *bits) {
  const struct gr_grammar *g = m->g;
  if (levels_reserve(m, v->max_len + 1)) return CM_ERR_NOMEM;
  struct gr_level *lv = m->levels;
  if (m->cur.n == 1) {
    lv[0].simple = 1;
    lv[0].top = m->cur.frames[m->cur.off[1] - 1];
    lv[0].base = &m->cur;
  } else {
    lv[0].simple = 0;
    if (gr_stackset_copy(&lv[0].set, &m->cur)) return CM_ERR_NOMEM;
  }
  const uint8_t *reach = g->reach, *wall = g->wall;
  lv[0].pc = 0;
  lv[0].pq = 0;
  /* from a state that takes plain text (freely, or up to a wall), every token
   * that is plain text is decided by its length alone: copy those in, and skip
   * their subtrees below */
  int pre = 0;
  const uint64_t no_term[2] = {0, 0};
  const uint64_t *term0 = lv[0].simple ? g->term + 2 * (size_t)lv[0].top : no_term;
  const int termless = !(term0[0] | term0[1]); /* plain siblings may be jumped over */
  lv[0].pt = 0;
  if (v->plain_le && lv[0].simple && (termless || v->has)) {
    uint32_t s = lv[0].top, w = 255;
    if (reach[s] >= v->max_len)
      w = v->max_len;
    else if (wall[s] != 255)
      w = wall[s] < v->max_len ? wall[s] : v->max_len;
    if (w != 255) { /* (without the tokens that hold a byte of the state's term) */
      uint32_t words = ((uint32_t)v->n + 31) / 32;
      memcpy(bits, v->plain_le + (size_t)w * words, words * sizeof *bits);
      for (uint32_t b = 0x20; b < 0x80; b++)
        if (term0[b / 64] >> (b % 64) & 1) {
          const uint32_t *h = v->has + (size_t)b * words;
          for (uint32_t k = 0; k < words; k++)
            bits[k] &= ~h[k];
        }
      pre = 1;
    }
  }
  /* a state that takes a run of an alphabet: its mask from the alphabet's tokens
   * and the few that hold a byte to come after a run (gr-alpha.c) */
  if (!pre) {
    int rc = gr_alpha_mask(m, v, bits);
    if (rc) return rc < 0 ? rc : 0;
  }
  /* with the plain tokens in and no term, what is left is the other tokens: their
   * own trie, whose nodes lie together in a few hundred KiB (the whole trie's
   * nodes on their paths are scattered over tens of MiB) */
  if (pre && termless && v->rest) v = v->rest;
  /* and with a term, when few tokens hold its bytes: those one by one, then the
   * other tokens' trie */
  if (pre && !termless && v->rest) {
    int rc = gr_alpha_listed(m, v, term0, bits);
    if (rc < 0) return rc;
    if (rc) v = v->rest;
  }
  /* the children of the root and of nodes with many go by
   * their tables (a refused byte costs no read of its node), innermost act */
  int act = -1;
  if (!pre && v->kids_root) open_kids(v, &lv[0], v->kids_root, v->n_nodes, &act, 0);
  struct walk_env e = {m, v, bits, pre, termless, term0};
  if (lv[0].simple || lv[0].set.n < 2) return walk_range(&e, 0, v->n_nodes, act);
  /* several stacks: each walked alone (see walk_range) */
  for (uint32_t j = 0; j < lv[0].set.n; j++) {
    if (gr_stackset_one(&lv[0].one, &lv[0].set, j)) return CM_ERR_NOMEM;
    lv[0].simple = 1;
    lv[0].top = lv[0].one.frames[lv[0].one.off[1] - 1];
    lv[0].base = &lv[0].one;
    act = -1;
    if (!pre && v->kids_root) open_kids(v, &lv[0], v->kids_root, v->n_nodes, &act, 0);
    int rc = walk_range(&e, 0, v->n_nodes, act);
    if (rc) return rc;
  }
  return 0;
}
int gr_grammar_prepare(struct gr_grammar *g) {
  if (__atomic_load_n(&g->reach, __ATOMIC_ACQUIRE)) return 0;
  pthread_mutex_lock(&g->lock);
  int rc = g->reach ? 0 : gr_plain_reach(g);
  pthread_mutex_unlock(&g->lock);
  return rc;
}

int gr_matcher_mask(struct gr_matcher *m, const struct gr_vocab *v, uint32_t *bits) {
  uint32_t words = ((uint32_t)v->n + 31) / 32;
  struct gr_grammar *g = (struct gr_grammar *)m->g; /* the cache is the only mutable part */
  uint64_t h = gr_stackset_hash(&m->cur);
  if (cache_get(g, v, &m->cur, h, bits)) return 0;
  int rc = gr_grammar_prepare(g);
  if (rc) return rc;
  memset(bits, 0, words * sizeof *bits);
  rc = walk(m, v, bits);
  if (rc) return rc;
  cache_put(g, v, &m->cur, h, bits);
  return 0;
}
