/* tk-bpe.c — the BPE model: vocab and merge lookups, the merge loop of
 * one word, and the per-state word cache.
 *
 * The merge loop follows Hugging Face tokenizers' Word::merge_all: symbols
 * are the word's characters (or their <0xXX> byte tokens with byte_fallback,
 * or unk), kept in a doubly linked list; a binary min-heap holds candidate
 * merges ordered by (rank, position); a popped candidate is applied only if
 * its two symbols still hold the ids it was made from (Hugging Face checks
 * the merged id instead: the same test, since a symbol's id only changes by
 * growing into a longer string). Cost O(n log n) per word, no allocation
 * once the state's scratch has grown to the longest word seen. */
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "tokenizer/tk-impl.h"

uint64_t tk_hash(const char *s, size_t len) {
  /* FNV-1a, 64-bit, then a final avalanche so low bits are usable */
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < len; i++) {
    h ^= (unsigned char)s[i];
    h *= 0x100000001b3ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h ? h : 1;
}

int32_t tk_vocab_get(const struct tk_tokenizer *tok, const char *s, size_t len) {
  uint64_t hash = tk_hash(s, len);
  uint32_t h = (uint32_t)hash & tok->vmask;
  uint32_t tag = tk_vtag(hash, len);
  for (;;) {
    uint64_t e = tok->vhash[h];
    if (!e) return -1;
    int32_t id = (int32_t)(uint32_t)e - 1;
    if ((uint32_t)(e >> 32) == tag && tok->tok_len[id] == len &&
        !memcmp(tok->blob + tok->tok_off[id], s, len))
      return id;
    h = (h + 1) & tok->vmask;
  }
}

const struct tk_merge *tk_merge_get(const struct tk_tokenizer *tok, int32_t a, int32_t b) {
  if (!tok->mhash) return NULL;
  uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
  uint64_t h = tk_hash((const char *)&key, sizeof key) & tok->mmask;
  for (;;) {
    const struct tk_merge *m = &tok->mhash[h];
    if (m->key == key) return m;
    if (m->key == UINT64_MAX) return NULL;
    h = (h + 1) & tok->mmask;
  }
}

int tk_ids_push(int32_t **ids, size_t *n_ids, size_t *cap, int32_t id) {
  if (*n_ids == *cap) {
    size_t nc = *cap ? *cap * 2 : 256;
    int32_t *n = realloc(*ids, nc * sizeof *n);
    if (!n) return CM_ERR_NOMEM;
    *ids = n;
    *cap = nc;
  }
  (*ids)[(*n_ids)++] = id;
  return 0;
}

/* ---- heap of candidate merges ---------------------------------------------- */

static int heap_less(const struct tk_heap_ent *a, const struct tk_heap_ent *b) {
  return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct tk_heap_ent *h, size_t *n, struct tk_heap_ent e) {
  size_t i = (*n)++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!heap_less(&e, &h[p])) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = e;
}

static struct tk_heap_ent heap_pop(struct tk_heap_ent *h, size_t *n) {
  struct tk_heap_ent top = h[0], last = h[--(*n)];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
    if (!heap_less(&h[c], &last)) break;
    h[i] = h[c];
    i = c;
  }
  if (*n) h[i] = last;
  return top;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t nc = *cap ? *cap : 64;
  while (nc < need) nc *= 2;
  void *n = realloc(*p, nc * elem);
  if (!n) return CM_ERR_NOMEM;
  *p = n;
  *cap = nc;
  return 0;
}

static size_t utf8_len(unsigned char c) {
  return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

/* The id of one character: a table for the BMP, the hash beyond it. */
static int32_t cl_lookup(const struct tk_tokenizer *tok, const char *s, size_t cl) {
  const unsigned char *u = (const unsigned char *)s;
  if (cl == 1) return tok->bmp_id[u[0]];
  if (cl == 2) return tok->bmp_id[(u[0] & 0x1Fu) << 6 | (u[1] & 0x3Fu)];
  if (cl == 3) return tok->bmp_id[(u[0] & 0x0Fu) << 12 | (u[1] & 0x3Fu) << 6 | (u[2] & 0x3Fu)];
  return tk_vocab_get(tok, s, cl);
}

static int have_bytes(const struct tk_tokenizer *tok, const char *s, size_t n) {
  for (size_t k = 0; k < n; k++)
    if (tok->byte_id[(unsigned char)s[k]] < 0) return 0;
  return 1;
}

/* ---- one word --------------------------------------------------------------- */

static int bpe_merge(struct tk_state *st, const char *w, size_t len, int32_t **ids,
                     size_t *n_ids, size_t *cap) {
  const struct tk_tokenizer *tok = st->tok;
  /* at most one symbol per byte, and a heap entry per symbol pair plus
   * two per merge */
  if (grow((void **)&st->syms, &st->syms_cap, len + 1, sizeof *st->syms) ||
      grow((void **)&st->heap, &st->heap_cap, 3 * len + 1, sizeof *st->heap))
    return CM_ERR_NOMEM;
  struct tk_sym *sy = st->syms;
  int32_t n = 0;
  int last_unk = 0;
  for (size_t i = 0; i < len;) {
    size_t cl = utf8_len((unsigned char)w[i]);
    if (cl > len - i) cl = len - i;
    int32_t id = cl_lookup(tok, w + i, cl);
    if (id >= 0) {
      sy[n++] = (struct tk_sym){.id = id, .len = (int32_t)cl};
      last_unk = 0;
    } else if (tok->byte_fallback && have_bytes(tok, w + i, cl)) {
      for (size_t k = 0; k < cl; k++)
        sy[n++] = (struct tk_sym){.id = tok->byte_id[(unsigned char)w[i + k]], .len = 1};
      last_unk = 0;
    } else if (tok->unk >= 0) {
      if (tok->fuse_unk && last_unk) {
        sy[n - 1].len += (int32_t)cl;
      } else {
        sy[n++] = (struct tk_sym){.id = tok->unk, .len = (int32_t)cl};
      }
      last_unk = 1;
    }
    i += cl;
  }
  for (int32_t i = 0; i < n; i++) {
    sy[i].prev = i - 1;
    sy[i].next = i + 1 < n ? i + 1 : -1;
  }
  size_t hn = 0;
  for (int32_t i = 0; i + 1 < n; i++) {
    const struct tk_merge *m = tk_merge_get(tok, sy[i].id, sy[i + 1].id);
    if (m)
      heap_push(st->heap, &hn,
                (struct tk_heap_ent){m->rank, i, sy[i].id, sy[i + 1].id, m->result});
  }
  while (hn) {
    struct tk_heap_ent top = heap_pop(st->heap, &hn);
    struct tk_sym *a = &sy[top.pos];
    if (a->len == 0 || a->next < 0 || a->id != top.left) continue;
    struct tk_sym *b = &sy[a->next];
    if (b->id != top.right) continue;
    a->id = top.result;
    a->len += b->len;
    b->len = 0;
    a->next = b->next;
    if (b->next >= 0) sy[b->next].prev = top.pos;
    if (a->prev >= 0) {
      const struct tk_merge *pm = tk_merge_get(tok, sy[a->prev].id, a->id);
      if (pm)
        heap_push(st->heap, &hn, (struct tk_heap_ent){pm->rank, a->prev, sy[a->prev].id,
                                                          a->id, pm->result});
    }
    if (a->next >= 0) {
      const struct tk_merge *nm = tk_merge_get(tok, a->id, sy[a->next].id);
      if (nm)
        heap_push(st->heap, &hn, (struct tk_heap_ent){nm->rank, top.pos, a->id,
                                                          sy[a->next].id, nm->result});
    }
  }
  for (int32_t i = 0; i < n; i = sy[i].next) {
    int rc = tk_ids_push(ids, n_ids, cap, sy[i].id);
    if (rc) return rc;
    if (sy[i].next < 0) break;
  }
  return 0;
}

/* ---- the word cache ----------------------------------------------------------- */

static void cache_clear(struct tk_state *st) {
  memset(st->cache, 0, TK_CACHE_SLOTS * sizeof *st->cache);
  st->cache_used = 0;
  st->cw_len = 0;
  st->ci_len = 0;
}

static void cache_put(struct tk_state *st, uint64_t h, const char *w, size_t len,
                      const int32_t *ids, size_t n) {
  if (st->cache_used >= TK_CACHE_SLOTS / 2 || st->cw_len + len > st->cw_cap ||
      st->ci_len + n > st->ci_cap)
    cache_clear(st);
  uint32_t slot = (uint32_t)h & (TK_CACHE_SLOTS - 1);
  while (st->cache[slot].hash) slot = (slot + 1) & (TK_CACHE_SLOTS - 1);
  struct tk_cache_ent *e = &st->cache[slot];
  e->hash = h;
  e->w_off = st->cw_len;
  e->w_len = (uint32_t)len;
  e->i_off = st->ci_len;
  e->i_len = (uint32_t)n;
  memcpy(st->cache_words + st->cw_len, w, len);
  memcpy(st->cache_ids + st->ci_len, ids, n * sizeof *ids);
  st->cw_len += (uint32_t)len;
  st->ci_len += (uint32_t)n;
  st->cache_used++;
}

static int bpe_cached(struct tk_state *st, const char *w, size_t len, int32_t **ids,
                      size_t *n_ids, size_t *cap);

/* 1 when a pre-token may be cut at byte p (the start of a run of the
 * marker after another character, spanned by no cross token). */
static int can_cut(const struct tk_tokenizer *tok, const char *w, size_t len, size_t p) {
  const size_t ml = tok->marker_len;
  if (p < ml || p + ml > len || memcmp(w + p, tok->marker, ml) || !memcmp(w + p - ml, tok->marker, ml))
    return 0;
  for (int c = 0; c < tok->n_cross; c++) {
    size_t k = tok->cross_off[c], tl = tok->tok_len[tok->cross_id[c]];
    if (p >= k && p - k + tl <= len && !memcmp(w + p - k, tok->blob + tok->tok_off[tok->cross_id[c]], tl))
      return 0;
  }
  return 1;
}

int tk_bpe_word(struct tk_state *st, const char *w, size_t len, int32_t **ids,
                    size_t *n_ids, size_t *cap) {
  const struct tk_tokenizer *tok = st->tok;
  if (!tok->marker || len <= TK_CACHE_MAX_WORD / 4) return bpe_cached(st, w, len, ids, n_ids, cap);
  size_t start = 0;
  const char m0 = tok->marker[0];
  for (size_t p = 1; p < len; p++) {
    if (w[p] != m0 || !can_cut(tok, w, len, p)) continue;
    int rc = bpe_cached(st, w + start, p - start, ids, n_ids, cap);
    if (rc) return rc;
    start = p;
  }
  return bpe_cached(st, w + start, len - start, ids, n_ids, cap);
}

static int bpe_cached(struct tk_state *st, const char *w, size_t len, int32_t **ids,
                      size_t *n_ids, size_t *cap) {
  const struct tk_tokenizer *tok = st->tok;
  if (len == 0) return 0;
  if (tok->ignore_merges) {
    int32_t id = tk_vocab_get(tok, w, len);
    if (id >= 0) return tk_ids_push(ids, n_ids, cap, id);
  }
  int cacheable = st->cache && len <= TK_CACHE_MAX_WORD;
  uint64_t h = 0;
  if (cacheable) {
    h = tk_hash(w, len);
    uint32_t slot = (uint32_t)h & (TK_CACHE_SLOTS - 1);
    while (st->cache[slot].hash) {
      const struct tk_cache_ent *e = &st->cache[slot];
      if (e->hash == h && e->w_len == len && !memcmp(st->cache_words + e->w_off, w, len)) {
        for (uint32_t i = 0; i < e->i_len; i++) {
          int rc = tk_ids_push(ids, n_ids, cap, st->cache_ids[e->i_off + i]);
          if (rc) return rc;
        }
        return 0;
      }
      slot = (slot + 1) & (TK_CACHE_SLOTS - 1);
    }
  }
  size_t before = *n_ids;
  int rc = bpe_merge(st, w, len, ids, n_ids, cap);
  if (rc) return rc;
  if (cacheable) cache_put(st, h, w, len, *ids + before, *n_ids - before);
  return 0;
}

int tk_state_create(const struct tk_tokenizer *tok, struct tk_state **out) {
  struct tk_state *st = calloc(1, sizeof *st);
  if (!st) return CM_ERR_NOMEM;
  st->tok = tok;
  st->cw_cap = TK_CACHE_SLOTS * 24;   /* bytes of cached words */
  st->ci_cap = TK_CACHE_SLOTS * 8;    /* cached ids */
  /* one allocation: the slots (8-byte aligned), then the id pool and the word bytes */
  st->cache = calloc(1, TK_CACHE_SLOTS * sizeof *st->cache + st->ci_cap * sizeof *st->cache_ids +
                            st->cw_cap);
  if (!st->cache) {
    free(st);
    return CM_ERR_NOMEM;
  }
  st->cache_ids = (int32_t *)(st->cache + TK_CACHE_SLOTS);
  st->cache_words = (char *)(st->cache_ids + st->ci_cap);
  *out = st;
  return 0;
}

void tk_state_free(struct tk_state *st) {
  if (!st) return;
  free(st->norm);
  free(st->norm2);
  free(st->syms);
  free(st->heap);
  free(st->cache); /* the pools with it */
  free(st);
}

/* ---- the shared pool of states ------------------------------------------ */

int tk_state_pool_init(struct tk_tokenizer *tok) {
  tok->pool = calloc(1, sizeof *tok->pool);
  if (!tok->pool) return CM_ERR_NOMEM;
  if (pthread_mutex_init(&tok->pool->mu, NULL) != 0) {
    free(tok->pool);
    tok->pool = NULL;
    return CM_ERR_NOMEM;
  }
  return 0;
}

void tk_state_pool_free(struct tk_tokenizer *tok) {
  if (!tok->pool) return;
  for (int i = 0; i < tok->pool->n_idle; i++)
    tk_state_free(tok->pool->idle[i]);
  pthread_mutex_destroy(&tok->pool->mu);
  free(tok->pool);
  tok->pool = NULL;
}

int tk_state_acquire(const struct tk_tokenizer *tok, struct tk_state **out) {
  struct tk_state_pool *p = tok->pool;
  struct tk_state *st = NULL;
  if (p) {
    pthread_mutex_lock(&p->mu);
    if (p->n_idle) st = p->idle[--p->n_idle];
    pthread_mutex_unlock(&p->mu);
  }
  if (st) {
    *out = st;
    return 0;
  }
  return tk_state_create(tok, out);
}

void tk_state_release(const struct tk_tokenizer *tok, struct tk_state *st) {
  struct tk_state_pool *p = tok->pool;
  if (!st) return;
  if (p) {
    pthread_mutex_lock(&p->mu);
    int kept = p->n_idle < TK_STATE_POOL_MAX;
    if (kept) p->idle[p->n_idle++] = st;
    pthread_mutex_unlock(&p->mu);
    if (kept) return;
  }
  tk_state_free(st);
}
