/* gr-alpha.c — masks of states that take a run of an ASCII alphabet, made
 * without walking the trie: a cell of [a-zA-Z0-9 ]{1,12} that ends where ','
 * goes on allows ~135,000 of Gemma's tokens, and a walk that follows the cell
 * and the returns after it through every subtree of letters took milliseconds.
 *
 * A token's first byte is of a set F, its others of an alphabet A (printable
 * ASCII but '"' and '\\'): F = A (a run), or F one byte outside A that the
 * state alone takes (the space before a word: "; " key). From the matcher's
 * set, the sets after p such bytes are followed level by level: L_0 = the
 * matcher's set, L_1 its step over a byte of F, L_p+1 the step of L_p over a
 * byte of A. Where every top of a level goes to the same state over every byte
 * of its alphabet, L_p is the set after *any* p such bytes, and then:
 * - a token of such bytes alone is allowed exactly when no level up to its
 *   length is empty: the vocabulary's tokens of plain text no longer than r
 *   (plain_le) and of F and A (made once per grammar, F and A);
 * - any other token starts with p such bytes and then a byte b outside its
 *   level's alphabet: it is allowed only when a top of L_p takes b (b is in L_p's
 *   out) and the rest follows the step of L_p over b. Only the tokens that start
 *   with a byte of L_0's out or hold one of a later level's after their first
 *   byte are looked at (the vocabulary's tokens by first byte, and its lists of
 *   the tokens holding a byte further on), each from its own level on: after a
 *   cell, the few tokens with a ',' or a line break.
 * The levels end where one is empty, where one repeats the one before (a loop:
 * every length), or at the vocabulary's longest token. A state whose tops part
 * over an alphabet's bytes, where a level's tops take a byte >= 0x80 or one
 * that many tokens hold, or whose alphabet spells few tokens, is left to the
 * walk (gr-mask.c). */
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "grammar/gr-impl.h"

#define GR_ALPHA_LOOK  4096u /* tokens at most looked at one by one */
#define GR_ALPHA_MIN   512u  /* tokens an alphabet must spell (the walk is quick below) */
#define GR_ALPHA_TRIES 2u    /* alphabets tried per mask, largest first */
#define GR_ALPHA_SETS  16u   /* token sets a grammar keeps (32 KiB each at V = 262,144) */
#define GR_NO_LEAD     128u  /* alpha_run.lead when F = A */

struct gr_alpha_cache {
  uint64_t serial; /* the vocabulary */
  uint32_t n;
  struct {
    uint32_t key;   /* alphabet << 8 | lead */
    uint32_t count; /* its tokens that are plain text */
    uint32_t *bits; /* the tokens of F and A (and empty ones), a bitmap */
  } e[GR_ALPHA_SETS];
};

void gr_alpha_cache_free(struct gr_alpha_cache *c) {
  if (!c) return;
  for (uint32_t i = 0; i < c->n; i++)
    free(c->e[i].bits);
  free(c);
}

static int has_bit(const uint64_t *a, uint32_t b) {
  return b < 128 && (a[b / 64] >> (b % 64) & 1);
}

/* ---- bitmaps (the loops run over a multiple of 4 words first: the compiler
 * vectorizes those at -O2) -------------------------------------------------- */
static void or_words(uint32_t *restrict d, const uint32_t *restrict s, uint32_t n) {
  uint32_t q = n & ~3u;
  for (uint32_t w = 0; w < q; w++)
    d[w] |= s[w];
  for (uint32_t w = q; w < n; w++)
    d[w] |= s[w];
}

/* d = a & ~d */
static void andnot_words(uint32_t *restrict d, const uint32_t *restrict a, uint32_t n) {
  uint32_t q = n & ~3u;
  for (uint32_t w = 0; w < q; w++)
    d[w] = a[w] & ~d[w];
  for (uint32_t w = q; w < n; w++)
    d[w] = a[w] & ~d[w];
}

static void and_words(uint32_t *restrict d, const uint32_t *restrict a, const uint32_t *restrict b,
                      uint32_t n) {
  uint32_t q = n & ~3u;
  for (uint32_t w = 0; w < q; w++)
    d[w] = a[w] & b[w];
  for (uint32_t w = q; w < n; w++)
    d[w] = a[w] & b[w];
}

static uint32_t count_and(const uint32_t *a, const uint32_t *b, uint32_t n) {
  uint32_t c = 0;
  for (uint32_t w = 0; w < n; w++) {
    uint32_t x = a[w] & b[w];
    x = x - ((x >> 1) & 0x55555555u);
    x = (x & 0x33333333u) + ((x >> 2) & 0x33333333u);
    c += (((x + (x >> 4)) & 0x0f0f0f0fu) * 0x01010101u) >> 24;
  }
  return c;
}

/* ---- the levels ------------------------------------------------------------- */
/* What the levels of one alphabet came to. */
struct alpha_run {
  uint32_t k;     /* the alphabet (gr_grammar.alpha) */
  uint32_t lead;  /* F's one byte, or GR_NO_LEAD when F = A */
  uint64_t f[2];  /* F */
  uint64_t a[2];  /* A: alpha[k]'s plain bytes */
  uint32_t r;     /* tokens of F and A no longer than r are allowed, longer ones refused */
  uint32_t last;  /* levels 0..last are made; beyond: empty, or last again (loop) */
  int loop;       /* the levels from last on are all the same */
  uint64_t o0[2]; /* L_0's out: the first bytes of the tokens to look at */
  uint64_t o1[2]; /* the out of the levels after a token's first byte: bytes they hold later */
  uint32_t look;  /* tokens to look at (counted once per byte) */
};

/* The tokens starting with byte b. */
static uint32_t first_n(const struct gr_vocab *v, uint32_t b) {
  return v->first_at[b + 1] - v->first_at[b];
}

/* Adds the bytes of out that later bytes of a token may be to x->o1 (each must
 * have a list): 0 when one has none. */
static int add_later(const struct gr_vocab *v, struct alpha_run *x, const uint64_t *out) {
  for (uint32_t b = 0; b < 128; b++)
    if (has_bit(out, b) && !has_bit(x->o1, b)) {
      if (v->tail_n[b] > GR_TAIL_IDS) return 0; /* too many tokens */
      x->look += v->tail_n[b];
      x->o1[b / 64] |= 1ull << (b % 64);
    }
  return 1;
}

/* alpha[k]'s bytes that plain text holds: printable ASCII (DEL too) but '"' and '\\' */
static void plain_part(const struct gr_grammar *g, uint32_t k, uint64_t *a) {
  a[0] = g->alpha[2 * k] & (~0ull << 32) & ~(1ull << '"');
  a[1] = g->alpha[2 * k + 1] & ~(1ull << ('\\' - 64));
}

/* The level set L_p: the matcher's own for p = 0. */
static const struct gr_stackset *level(const struct gr_matcher *m, uint32_t p) {
  return p ? &m->levels[p].set : &m->cur;
}

/* A byte of each class that the bytes of a fall in: their count. */
static uint32_t class_reps(const struct gr_grammar *g, const uint64_t *a, uint8_t *rep) {
  uint8_t seen[256] = {0};
  uint32_t n = 0;
  for (uint32_t b = 0; b < 128; b++)
    if (has_bit(a, b) && !seen[g->cls[b]]) seen[g->cls[b]] = 1, rep[n++] = (uint8_t)b;
  return n;
}

/* Follows the levels from m's state into lv[1..].set and their out: 1 when they
 * tell every token apart as above, 0 when not. */
static int levels(struct gr_matcher *m, const struct gr_vocab *v, struct alpha_run *x) {
  const struct gr_grammar *g = m->g;
  struct gr_level *lv = m->levels;
  uint8_t rep_f[128], rep_a[128];
  uint32_t n_f = class_reps(g, x->f, rep_f), n_a = class_reps(g, x->a, rep_a);
  x->o0[0] = x->o0[1] = x->o1[0] = x->o1[1] = 0;
  x->look = 0;
  for (uint32_t p = 0;; p++) {
    const struct gr_stackset *l = level(m, p);
    const uint64_t *al = p ? x->a : x->f;
    const uint8_t *rep = p ? rep_a : rep_f;
    uint32_t n_rep = p ? n_a : n_f;
    uint64_t out[2] = {0, 0};
    for (uint32_t j = 0; j < l->n; j++) {
      uint32_t top = l->frames[l->off[j + 1] - 1];
      const uint64_t *t = g->takes + 3 * (size_t)top;
      if (t[2] & 1) return 0; /* a byte >= 0x80 may come: most of the vocabulary */
      out[0] |= t[0] & ~al[0];
      out[1] |= t[1] & ~al[1];
      const uint32_t *row = g->delta + (size_t)top * g->n_cls;
      for (uint32_t c = 1; c < n_rep; c++) /* every byte of the alphabet: the same state */
        if (row[g->cls[rep[c]]] != row[g->cls[rep[0]]]) return 0;
    }
    if (p) {
      if (!add_later(v, x, out)) return 0;
    } else {
      for (uint32_t b = 0; b < 128; b++)
        if (has_bit(out, b)) x->look += first_n(v, b);
      x->o0[0] = out[0], x->o0[1] = out[1];
    }
    if (x->look > GR_ALPHA_LOOK) return 0;
    lv[p].out[0] = out[0];
    lv[p].out[1] = out[1];
    x->last = p;
    x->loop = 0;
    if (p == v->max_len) { /* no token is longer */
      x->r = p;
      return 1;
    }
    struct gr_stackset *nx = &lv[p + 1].set;
    gr_step(m, l, rep[0], nx);
    if (nx->n == 0) {
      x->r = p;
      return 1;
    }
    if ((p || x->lead == GR_NO_LEAD) && nx->n == l->n &&
        !memcmp(nx->off, l->off, ((size_t)l->n + 1) * sizeof *l->off) &&
        !memcmp(nx->frames, l->frames, (size_t)l->off[l->n] * sizeof *l->frames)) {
      x->r = v->max_len; /* the same set again over the same alphabet: every length */
      x->loop = 1;
      /* from L_0 on: its out for later bytes too */
      return p || (add_later(v, x, x->o0) && x->look <= GR_ALPHA_LOOK);
    }
  }
}

/* ---- the tokens of F and A ------------------------------------------------- */
/* The grammar's set of x's F and A for vocabulary v (made when new), under g's
 * lock; NULL when out of memory or the cache is full. */
static struct gr_alpha_cache *cache_of(struct gr_grammar *g, const struct gr_vocab *v) {
  struct gr_alpha_cache *c = g->alpha_cache;
  if (c && c->serial != v->serial) { /* another vocabulary: start over */
    gr_alpha_cache_free(c);
    c = g->alpha_cache = NULL;
  }
  if (!c && (c = calloc(1, sizeof *c))) {
    c->serial = v->serial;
    g->alpha_cache = c;
  }
  return c;
}

/* Clears in's bits of the tokens that start with b or hold it later (b has a list). */
static void clear_byte(const struct gr_vocab *v, uint32_t b, uint32_t *in) {
  for (uint32_t k = v->first_at[b]; k < v->first_at[b + 1]; k++)
    in[v->ids[k] >> 5] &= ~(1u << (v->ids[k] & 31));
  for (uint32_t j = v->tail_at[b]; j < v->tail_at[b + 1]; j++)
    in[v->tail_ids[j] >> 5] &= ~(1u << (v->tail_ids[j] & 31));
}

/* in = the tokens of x's F and A, as set_of says. 0, or -1 when F's byte holds
 * too many tokens to tell those that hold it again. */
static int make_set(const struct gr_vocab *v, const struct alpha_run *x, uint32_t *in) {
  uint32_t words = ((uint32_t)v->n + 31) / 32, lead = x->lead;
  if (lead != GR_NO_LEAD && first_n(v, lead) <= GR_TAIL_IDS) { /* one by one */
    for (uint32_t k = v->first_at[lead]; k < v->first_at[lead + 1]; k++) {
      int32_t id = v->ids[k];
      uint32_t p = 1;
      while (p < v->lens[id] && has_bit(x->a, v->bytes[id][p]))
        p++;
      if (p == v->lens[id]) in[id >> 5] |= 1u << (id & 31);
    }
    return 0;
  }
  if (lead != GR_NO_LEAD && v->tail_n[lead] > GR_TAIL_IDS) return -1;
  /* the tokens holding a plain byte outside F and A (the others are not in
   * plain_le): by bitmaps, and by lists below */
  uint64_t keep[2] = {x->a[0] | x->f[0], x->a[1] | x->f[1]};
  for (uint32_t b = 0x20; b <= 128; b++)
    if (!has_bit(keep, b) && b != '"' && b != '\\' && v->tail_n[b] > GR_TAIL_IDS)
      or_words(in, v->has + (size_t)b * words, words);
  if (lead == GR_NO_LEAD) {
    for (uint32_t w = 0; w < words; w++)
      in[w] = ~in[w];
  } else { /* and not starting with the lead, or holding it again */
    uint32_t *first = calloc(words, sizeof *first);
    if (!first) return -1;
    for (uint32_t k = v->first_at[lead]; k < v->first_at[lead + 1]; k++)
      first[v->ids[k] >> 5] |= 1u << (v->ids[k] & 31);
    andnot_words(in, first, words);
    free(first);
    for (uint32_t j = v->tail_at[lead]; j < v->tail_at[lead + 1]; j++)
      in[v->tail_ids[j] >> 5] &= ~(1u << (v->tail_ids[j] & 31));
  }
  for (uint32_t b = 0x20; b < 128; b++)
    if (!has_bit(keep, b) && b != '"' && b != '\\' && v->tail_n[b] <= GR_TAIL_IDS)
      clear_byte(v, b, in);
  return 0;
}

/* The index of x's set in c: the tokens whose first byte is of F and the others
 * of A (and empty ones), made when new; -1 when out of memory or out of room. A
 * set that cannot be made is kept as one of no tokens (too few to be tried). */
static int set_of(struct gr_alpha_cache *c, const struct gr_vocab *v, const struct alpha_run *x) {
  uint32_t key = x->k << 8 | x->lead;
  for (uint32_t i = 0; i < c->n; i++)
    if (c->e[i].key == key) return (int)i;
  if (c->n == GR_ALPHA_SETS) return -1;
  uint32_t words = ((uint32_t)v->n + 31) / 32;
  uint32_t *in = calloc(words, sizeof *in);
  if (!in) return -1;
  if (make_set(v, x, in)) memset(in, 0, words * sizeof *in);
  c->e[c->n].key = key;
  c->e[c->n].count = count_and(in, v->plain_le + (size_t)v->max_len * words, words);
  c->e[c->n].bits = in;
  return (int)c->n++;
}

/* bits = the tokens of x's F and A no longer than x->r: 1; 0 when they are too
 * few to be worth it, or out of memory (bits untouched: the walk makes the mask). */
static int run_bits(struct gr_grammar *g, const struct gr_vocab *v, const struct alpha_run *x,
                    uint32_t *bits) {
  int rc = 0;
  pthread_mutex_lock(&g->lock);
  struct gr_alpha_cache *c = cache_of(g, v);
  int i = c ? set_of(c, v, x) : -1;
  /* the walk costs about a node a token it allows, this a token it looks at */
  if (i >= 0 && c->e[i].count >= GR_ALPHA_MIN && c->e[i].count >= 4 * x->look) {
    uint32_t words = ((uint32_t)v->n + 31) / 32;
    and_words(bits, v->plain_le + (size_t)x->r * words, c->e[i].bits, words);
    rc = 1;
  }
  pthread_mutex_unlock(&g->lock);
  return rc;
}

/* 1 when x's set is known to spell too few tokens (no need to follow its levels). */
static int known_few(struct gr_grammar *g, const struct gr_vocab *v, const struct alpha_run *x) {
  int few = 0;
  pthread_mutex_lock(&g->lock);
  const struct gr_alpha_cache *c = g->alpha_cache;
  for (uint32_t i = 0; c && c->serial == v->serial && i < c->n; i++)
    if (c->e[i].key == (x->k << 8 | x->lead)) few = c->e[i].count < GR_ALPHA_MIN;
  pthread_mutex_unlock(&g->lock);
  return few;
}

/* ---- the other tokens ------------------------------------------------------- */
/* Whether the bytes s[0..n) may follow set `from` (level q's, or q = GR_NO_LEAD:
 * the matcher's own): 1, 0, or an error. Steps of one stack that neither call
 * nor return change its top alone; the first step that does, which depends on
 * (q, the top, the byte) alone, is remembered for the rest of this mask. */
static int follow(struct gr_matcher *m, uint32_t q, const struct gr_stackset *from,
                  const uint8_t *s, uint32_t n) {
  const struct gr_grammar *g = m->g;
  uint32_t top = GR_NONE, i = 0;
  if (from->n == 1) {
    uint32_t len = from->off[1];
    for (top = from->frames[len - 1]; i < n; i++) {
      uint32_t t = g->delta[(size_t)top * g->n_cls + g->cls[s[i]]];
      if (t == GR_NONE) return 0;
      if ((g->flags[t] & GR_F_CALLS) || ((g->flags[t] & GR_F_FINAL) && len > 1)) break;
      top = t;
    }
    if (i == n) return 1;
  }
  uint64_t key = (uint64_t)q << 40 | (uint64_t)top << 8 | s[i];
  struct gr_amemo *e = NULL;
  for (uint32_t k = 0; k < m->n_amemo && !e; k++)
    if (m->amemo[k].key == key) e = &m->amemo[k];
  if (!e) { /* when all are taken, the last one is made again each time */
    e = &m->amemo[m->n_amemo < GR_STEP_MEMO ? m->n_amemo++ : GR_STEP_MEMO - 1];
    e->key = key;
    const struct gr_stackset *in = from;
    if (top != GR_NONE && top != from->frames[from->off[1] - 1]) { /* its top replaced */
      if (gr_stackset_copy(&m->walk, from)) return CM_ERR_NOMEM;
      m->walk.frames[m->walk.off[1] - 1] = top;
      in = &m->walk;
    }
    if (!gr_step(m, in, s[i], &e->set) && e->set.n) return CM_ERR_NOMEM;
  }
  if (!e->set.n) return 0;
  return i + 1 == n ? 1 : gr_follows(m, &e->set, s + i + 1, n - i - 1);
}

/* Whether token id, which holds a byte of x's out and is not in bits, is
 * allowed: 1, 0, or an error. */
static int token_allowed(struct gr_matcher *m, const struct gr_vocab *v, const void *ctx,
                         int32_t id) {
  const struct alpha_run *x = ctx;
  const uint8_t *s = v->bytes[id];
  uint32_t n = v->lens[id], p = 0;
  if (has_bit(x->f, s[0]))
    for (p = 1; p < n && has_bit(x->a, s[p]);)
      p++;
  if (p == n) return 0; /* of F and A alone, longer than r */
  uint32_t q = p;
  if (q > x->last) {
    if (!x->loop) return 0;
    q = x->last;
  }
  if (!has_bit(m->levels[q].out, s[p])) return 0;
  return follow(m, q, level(m, q), s + p, n - p);
}

/* Each token that starts with an ASCII byte of o0 or holds one of o1 after its
 * first (o1's bytes have lists), not in bits yet, into bits where test(ctx, id)
 * says it is allowed: 0, or an error. */
static int listed(struct gr_matcher *m, const struct gr_vocab *v, const uint64_t *o0,
                  const uint64_t *o1, uint32_t *bits,
                  int (*test)(struct gr_matcher *, const struct gr_vocab *, const void *, int32_t),
                  const void *ctx) {
  for (uint32_t c = 0; c < 128; c++)
    for (int later = 0; later < 2; later++) {
      if (!has_bit(later ? o1 : o0, c)) continue;
      uint32_t j = later ? v->tail_at[c] : v->first_at[c];
      uint32_t e = later ? v->tail_at[c + 1] : v->first_at[c + 1];
      for (; j < e; j++) {
        int32_t id = later ? v->tail_ids[j] : v->ids[j];
        if (bits[id >> 5] >> (id & 31) & 1) continue; /* allowed already */
        int rc = test(m, v, ctx, id);
        if (rc < 0) return rc;
        if (rc) bits[id >> 5] |= 1u << (id & 31);
      }
    }
  return 0;
}

static int follows_whole(struct gr_matcher *m, const struct gr_vocab *v, const void *ctx,
                         int32_t id) {
  (void)ctx;
  return follow(m, GR_NO_LEAD, &m->cur, v->bytes[id], v->lens[id]);
}

int gr_alpha_listed(struct gr_matcher *m, const struct gr_vocab *v, const uint64_t *b,
                    uint32_t *bits) {
  if (!v->tail_ids) return 0;
  for (uint32_t c = 0; c < 128; c++)
    if (has_bit(b, c) && v->tail_n[c] > GR_TAIL_IDS) return 0;
  m->n_amemo = 0;
  int rc = listed(m, v, b, b, bits, follows_whole, NULL);
  return rc < 0 ? rc : 1;
}

/* ---- choosing alphabets ------------------------------------------------------- */
/* The alphabets worth trying from set s, largest first (some top of s takes a run
 * of them), leaving out those holding byte skip: their count into k[GR_ALPHA_TRIES]. */
static uint32_t pick(const struct gr_grammar *g, const struct gr_stackset *s, uint32_t skip,
                     uint32_t *k) {
  uint32_t n = 0, pop[GR_ALPHA_TRIES];
  for (uint32_t a = 0; a < g->n_alpha; a++) {
    uint64_t x[2];
    plain_part(g, a, x);
    uint32_t c = (uint32_t)(__builtin_popcountll(x[0]) + __builtin_popcountll(x[1]));
    int runs = 0;
    for (uint32_t j = 0; j < s->n && !runs; j++)
      runs = g->run[(size_t)s->frames[s->off[j + 1] - 1] * g->n_alpha + a] > 0;
    if (!c || !runs || has_bit(x, skip)) continue;
    uint32_t i = n < GR_ALPHA_TRIES ? n++ : GR_ALPHA_TRIES;
    for (; i > 0 && pop[i - 1] < c; i--)
      if (i < GR_ALPHA_TRIES) k[i] = k[i - 1], pop[i] = pop[i - 1];
    if (i < GR_ALPHA_TRIES) k[i] = a, pop[i] = c;
  }
  return n;
}

/* The one byte m's state takes when it is plain ASCII (a byte before a run), or
 * GR_NO_LEAD. */
static uint32_t lead_byte(const struct gr_matcher *m) {
  const struct gr_grammar *g = m->g;
  uint64_t t[3] = {0, 0, 0};
  for (uint32_t j = 0; j < m->cur.n; j++) {
    const uint64_t *x = g->takes + 3 * (size_t)m->cur.frames[m->cur.off[j + 1] - 1];
    t[0] |= x[0], t[1] |= x[1], t[2] |= x[2];
  }
  if (t[2] || __builtin_popcountll(t[0]) + __builtin_popcountll(t[1]) != 1) return GR_NO_LEAD;
  uint32_t b = t[0] ? (uint32_t)__builtin_ctzll(t[0]) : 64 + (uint32_t)__builtin_ctzll(t[1]);
  return b >= 0x20 && b != '"' && b != '\\' ? b : GR_NO_LEAD;
}

/* Tries alphabet k with F = {lead} (or F = A): 1 when the mask is made. */
static int try_run(struct gr_matcher *m, const struct gr_vocab *v, uint32_t k, uint32_t lead,
                   uint32_t *bits) {
  struct gr_grammar *g = (struct gr_grammar *)m->g; /* the alphabet cache is mutable */
  struct alpha_run x = {.k = k, .lead = lead};
  plain_part(g, k, x.a);
  if (lead == GR_NO_LEAD)
    x.f[0] = x.a[0], x.f[1] = x.a[1];
  else
    x.f[lead / 64] = 1ull << (lead % 64);
  uint32_t most = 0; /* the tokens that start with a byte of F: at most so many */
  for (uint32_t b = 0x20; b < 128; b++)
    if (has_bit(x.f, b)) most += first_n(v, b);
  if (most < GR_ALPHA_MIN || known_few(g, v, &x) || !levels(m, v, &x)) return 0;
  int rc = run_bits(g, v, &x, bits);
  if (rc <= 0) return rc;
  /* the tokens holding a byte some level's tops take: each from its level */
  m->n_amemo = 0;
  rc = listed(m, v, x.o0, x.o1, bits, token_allowed, &x);
  if (rc < 0) return rc;
  m->n_alpha_masks++;
  return 1;
}

int gr_alpha_mask(struct gr_matcher *m, const struct gr_vocab *v, uint32_t *bits) {
  const struct gr_grammar *g = m->g;
  if (!g->run || !v->plain_le || !v->tail_ids || !m->cur.n) return 0;
  uint32_t ks[GR_ALPHA_TRIES], n_k = pick(g, &m->cur, GR_NO_LEAD, ks);
  for (uint32_t t = 0; t < n_k; t++) {
    int rc = try_run(m, v, ks[t], GR_NO_LEAD, bits);
    if (rc) return rc;
  }
  /* a byte first, then a run (the space before a word) */
  uint32_t lead = lead_byte(m);
  if (lead == GR_NO_LEAD || !gr_step(m, &m->cur, (uint8_t)lead, &m->levels[1].set)) return 0;
  n_k = pick(g, &m->levels[1].set, lead, ks);
  for (uint32_t t = 0; t < n_k; t++) {
    int rc = try_run(m, v, ks[t], lead, bits);
    if (rc) return rc;
  }
  return 0;
}
