/* sch-kv.c — per-sequence KV block tables: allocation per group, sliding-window
 * freeing with holes, prefix-cache lookup and registration, rollback. */
#include "scheduler/sch-kv.h"

#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "scheduler/sch-hash.h"

struct sch_kv {
  struct sch_block_pool *pool; /* borrowed */
  struct sch_kv_group_cfg groups[SCH_MAX_GROUPS];
  int32_t ngroups;
  int32_t align;      /* lcm of the groups' block sizes, tokens: prefix hits are multiples */
  int prefix_caching; /* 0 = off */
  uint64_t hash_key;
  uint64_t queries; /* prompt tokens looked up, tokens */
  uint64_t hits;    /* of those, found in the cache, tokens */
};

int sch_kv_create(struct sch_block_pool *pool, const struct sch_kv_group_cfg *groups,
                  int32_t ngroups, int prefix_caching, uint64_t hash_key, struct sch_kv **out) {
  *out = NULL;
  if (!pool || !groups || ngroups <= 0 || ngroups > SCH_MAX_GROUPS) return CM_ERR_INVAL;
  int64_t align = 1;
  for (int32_t g = 0; g < ngroups; g++) {
    if (groups[g].block_tokens <= 0 || groups[g].block_tokens > 4096 || groups[g].window < 0)
      return CM_ERR_INVAL;
    align = align /
            (int64_t)cm_gcd((unsigned long long)align, (unsigned long long)groups[g].block_tokens) *
            groups[g].block_tokens;
    if (align > (1 << 20)) return CM_ERR_INVAL;
  }
  struct sch_kv *kv = calloc(1, sizeof(*kv));
  if (!kv) return CM_ERR_NOMEM;
  kv->pool = pool;
  memcpy(kv->groups, groups, (size_t)ngroups * sizeof(*groups));
  kv->ngroups = ngroups;
  kv->align = (int32_t)align;
  kv->prefix_caching = prefix_caching != 0;
  kv->hash_key = hash_key;
  *out = kv;
  return 0;
}

void sch_kv_destroy(struct sch_kv *kv) {
  free(kv);
}

int32_t sch_kv_num_groups(const struct sch_kv *kv) {
  return kv->ngroups;
}
const struct sch_kv_group_cfg *sch_kv_group(const struct sch_kv *kv, int32_t g) {
  CM_ASSERT(g >= 0 && g < kv->ngroups);
  return &kv->groups[g];
}
struct sch_block_pool *sch_kv_pool(struct sch_kv *kv) {
  return kv->pool;
}

static int32_t ceil_div(int64_t a, int64_t b) {
  return (int32_t)((a + b - 1) / b);
}

/* Lays out tables able to cover max_tokens positions in one allocation, copying what
 * the sequence holds so far. */
static int seq_layout(const struct sch_kv *kv, struct sch_kv_seq *seq, int32_t max_tokens) {
  size_t entries = 0;
  for (int32_t g = 0; g < kv->ngroups; g++)
    entries += (size_t)ceil_div(max_tokens, kv->groups[g].block_tokens);
  /* hashes first (8-byte aligned), then the tables */
  char *mem = malloc(entries * (sizeof(uint64_t) + sizeof(int32_t)));
  if (!mem) return CM_ERR_NOMEM;
  uint64_t *h = (uint64_t *)mem;
  int32_t *t = (int32_t *)(h + entries);
  for (int32_t g = 0; g < kv->ngroups; g++) {
    int32_t cap = ceil_div(max_tokens, kv->groups[g].block_tokens);
    if (seq->mem) {
      memcpy(h, seq->hash[g], (size_t)seq->num_hashed[g] * sizeof(*h));
      memcpy(t, seq->table[g], (size_t)seq->len[g] * sizeof(*t));
    }
    seq->cap[g] = cap;
    seq->hash[g] = h;
    seq->table[g] = t;
    h += cap;
    t += cap;
  }
  free(seq->mem);
  seq->mem = mem;
  seq->max_tokens = max_tokens;
  return 0;
}

int sch_kv_seq_init(const struct sch_kv *kv, struct sch_kv_seq *seq, int32_t max_tokens) {
  memset(seq, 0, sizeof(*seq));
  if (max_tokens <= 0) return CM_ERR_INVAL;
  return seq_layout(kv, seq, max_tokens);
}

int sch_kv_seq_reserve(const struct sch_kv *kv, struct sch_kv_seq *seq, int32_t max_tokens) {
  if (max_tokens <= seq->max_tokens) return 0;
  return seq_layout(kv, seq, max_tokens);
}

void sch_kv_seq_release(struct sch_kv_seq *seq) {
  for (int32_t g = 0; g < SCH_MAX_GROUPS; g++)
    CM_ASSERT(seq->len[g] == 0);
  free(seq->mem);
  memset(seq, 0, sizeof(*seq));
}

int64_t sch_kv_worst_case_blocks(const struct sch_kv *kv, int64_t max_len, int64_t step_tokens) {
  int64_t total = 0;
  for (int32_t g = 0; g < kv->ngroups; g++) {
    int64_t bt = kv->groups[g].block_tokens, w = kv->groups[g].window;
    int64_t full = (max_len + bt - 1) / bt;
    if (w > 0) {
      /* live span: the window behind the first query plus the step's own positions;
       * a span of m positions touches at most ceil(m / bt) + 1 blocks */
      int64_t m = w - 1 + step_tokens;
      int64_t live = (m + bt - 1) / bt + 1;
      if (live < full) full = live;
    }
    total += full;
  }
  return total;
}

int32_t sch_kv_seq_num_blocks(const struct sch_kv_seq *seq, int32_t ngroups) {
  int32_t n = 0;
  for (int32_t g = 0; g < ngroups; g++)
    for (int32_t i = seq->first_live[g]; i < seq->len[g]; i++)
      if (seq->table[g][i] != SCH_BLOCK_HOLE) n++;
  return n;
}

/* ---- windows and hashes --------------------------------------------------------- */

/* First block index that a query at q0 (or later) can still see in group g. */
static int32_t first_live_index(const struct sch_kv *kv, int32_t g, int32_t q0) {
  int32_t w = kv->groups[g].window;
  if (w == 0) return 0;
  int64_t lo = (int64_t)q0 - w + 1;
  return lo <= 0 ? 0 : (int32_t)(lo / kv->groups[g].block_tokens);
}

static void free_window(struct sch_kv *kv, struct sch_kv_seq *seq, int32_t g, int32_t q0) {
  int32_t fl = first_live_index(kv, g, q0);
  if (fl > seq->len[g]) fl = seq->len[g];
  for (int32_t i = seq->first_live[g]; i < fl; i++) {
    if (seq->table[g][i] != SCH_BLOCK_HOLE) sch_block_pool_unref(kv->pool, seq->table[g][i]);
    seq->table[g][i] = SCH_BLOCK_HOLE;
  }
  if (fl > seq->first_live[g]) seq->first_live[g] = fl;
}

/* The hash block i of group g follows: the block before, or the salt. */
static uint64_t parent_of(const struct sch_kv_seq *seq, int32_t g, int32_t i) {
  return i > 0 ? seq->hash[g][i - 1] : seq->salt;
}

/* Makes hash[g][0..nblocks) valid; tokens must hold nblocks * bt ids. */
static void ensure_hashes(const struct sch_kv *kv, struct sch_kv_seq *seq, int32_t g,
                          const int32_t *tokens, int32_t nblocks) {
  int32_t bt = kv->groups[g].block_tokens;
  CM_ASSERT(nblocks <= seq->cap[g]);
  for (int32_t i = seq->num_hashed[g]; i < nblocks; i++)
    seq->hash[g][i] =
        sch_hash_block(kv->hash_key, parent_of(seq, g, i), g, tokens + (size_t)i * bt, bt);
  if (nblocks > seq->num_hashed[g]) seq->num_hashed[g] = nblocks;
}

static int32_t lookup_block(const struct sch_kv *kv, const struct sch_kv_seq *seq, int32_t g,
                            const int32_t *tokens, int32_t i) {
  int32_t bt = kv->groups[g].block_tokens;
  return sch_block_pool_lookup(kv->pool, seq->hash[g][i], parent_of(seq, g, i), g,
                               tokens + (size_t)i * bt, bt);
}

/* ---- prefix match, allocate ----------------------------------------------------- */

/* The longest hit x <= h (h a multiple of the group's block size) that group g can
 * serve: a full group needs every block before x, a sliding group only the blocks that
 * the first query (at x) still sees, [first_live(x), x / bt). */
static int32_t group_hit(struct sch_kv *kv, struct sch_kv_seq *seq, int32_t g,
                         const int32_t *tokens, int32_t h) {
  int32_t bt = kv->groups[g].block_tokens, nb = h / bt;
  ensure_hashes(kv, seq, g, tokens, nb);
  if (kv->groups[g].window == 0) {
    int32_t i = 0;
    while (i < nb && lookup_block(kv, seq, g, tokens, i) >= 0)
      i++;
    return i * bt;
  }
  /* from the right: a missing block j rules out every end above it whose window holds
   * it, which (first_live growing with the end) is every end above it */
  int32_t e = nb;
  while (e > 0) {
    int32_t fl = first_live_index(kv, g, e * bt), j = e - 1;
    while (j >= fl && lookup_block(kv, seq, g, tokens, j) >= 0)
      j--;
    if (j < fl) return e * bt;
    e = j;
  }
  return 0;
}

int32_t sch_kv_prefix_match(struct sch_kv *kv, struct sch_kv_seq *seq, const int32_t *tokens,
                            int32_t ntok) {
  CM_ASSERT(seq->len[0] == 0);
  if (!kv->prefix_caching || ntok <= 1) return 0;
  int32_t h = (ntok - 1) / kv->align * kv->align; /* the last prompt token always runs */
  /* a sliding group's answer is not monotone in h: iterate to the fixed point, where
   * every group serves h (h only shrinks, so this ends) */
  for (;;) {
    int32_t before = h;
    for (int32_t g = 0; g < kv->ngroups && h > 0; g++) {
      int32_t x = group_hit(kv, seq, g, tokens, h);
      if (x < h) h = x / kv->align * kv->align;
    }
    if (h == before || h == 0) return h;
  }
}

/* Blocks the pool must give for allocate(q0, end), after dead blocks were released. */
static int32_t blocks_needed(struct sch_kv *kv, struct sch_kv_seq *seq, const int32_t *tokens,
                             int fresh, int32_t q0, int32_t end) {
  int32_t need = 0;
  for (int32_t g = 0; g < kv->ngroups; g++) {
    int32_t bt = kv->groups[g].block_tokens, fl = first_live_index(kv, g, q0);
    int32_t start = fresh ? q0 / bt : seq->len[g], stop = ceil_div(end, bt);
    int32_t from = start > fl ? start : fl;
    if (stop > from) need += stop - from;
    if (fresh) /* prefix hits leave the LRU list: they count against what is available */
      for (int32_t i = fl; i < q0 / bt; i++) {
        int32_t id = lookup_block(kv, seq, g, tokens, i);
        CM_ASSERT(id >= 0); /* prefix_match just found it */
        if (sch_block_pool_is_cached_free(kv->pool, id)) need++;
      }
  }
  return need;
}

int sch_kv_allocate(struct sch_kv *kv, struct sch_kv_seq *seq, const int32_t *tokens, int32_t q0,
                    int32_t end) {
  CM_ASSERT(q0 >= 0 && q0 < end && end <= seq->max_tokens);
  int fresh = seq->len[0] == 0;
  CM_ASSERT(!fresh || q0 == 0 || kv->prefix_caching);
  if (!fresh)
    for (int32_t g = 0; g < kv->ngroups; g++)
      free_window(kv, seq, g, q0);
  if (blocks_needed(kv, seq, tokens, fresh, q0, end) > sch_block_pool_num_available(kv->pool))
    return CM_ERR_FULL;
  /* prefix hits of every group first, so that allocating new blocks cannot evict them */
  for (int32_t g = 0; fresh && g < kv->ngroups; g++) {
    int32_t bt = kv->groups[g].block_tokens, fl = first_live_index(kv, g, q0), nb = q0 / bt;
    int32_t *t = seq->table[g];
    for (int32_t i = 0; i < nb; i++) {
      if (i < fl) {
        t[i] = SCH_BLOCK_HOLE;
        continue;
      }
      t[i] = lookup_block(kv, seq, g, tokens, i);
      sch_block_pool_ref(kv->pool, t[i]);
    }
    seq->len[g] = nb;
    seq->first_live[g] = fl < nb ? fl : nb;
    seq->num_registered[g] = nb;
  }
  for (int32_t g = 0; g < kv->ngroups; g++) {
    int32_t bt = kv->groups[g].block_tokens, fl = first_live_index(kv, g, q0);
    int32_t *t = seq->table[g];
    int32_t stop = ceil_div(end, bt);
    CM_ASSERT(stop <= seq->cap[g]);
    for (int32_t i = seq->len[g]; i < stop; i++) {
      if (i < fl) {
        t[i] = SCH_BLOCK_HOLE;
        continue;
      }
      t[i] = sch_block_pool_alloc(kv->pool);
      CM_ASSERT(t[i] >= 0); /* counted above */
    }
    if (stop > seq->len[g]) seq->len[g] = stop;
    if (seq->first_live[g] < fl && fl <= seq->len[g]) seq->first_live[g] = fl;
  }
  return 0;
}

/* ---- commit, rollback, free ----------------------------------------------------- */

void sch_kv_commit(struct sch_kv *kv, struct sch_kv_seq *seq, const int32_t *tokens,
                   int32_t num_computed) {
  if (!kv->prefix_caching) return;
  for (int32_t g = 0; g < kv->ngroups; g++) {
    int32_t bt = kv->groups[g].block_tokens, nfull = num_computed / bt;
    if (nfull > seq->len[g]) nfull = seq->len[g];
    if (nfull <= seq->num_registered[g]) continue;
    ensure_hashes(kv, seq, g, tokens, nfull);
    for (int32_t i = seq->num_registered[g]; i < nfull; i++) {
      int32_t id = seq->table[g][i];
      if (id == SCH_BLOCK_HOLE || sch_block_pool_is_hashed(kv->pool, id)) continue;
      /* CM_ERR_STATE: another block already holds this content; this one stays private */
      (void)sch_block_pool_set_hash(kv->pool, id, seq->hash[g][i], parent_of(seq, g, i), g,
                                    tokens + (size_t)i * bt, bt);
    }
    seq->num_registered[g] = nfull;
  }
}

void sch_kv_rollback(struct sch_kv *kv, struct sch_kv_seq *seq, int32_t keep) {
  for (int32_t g = 0; g < kv->ngroups; g++) {
    int32_t nb = ceil_div(keep, kv->groups[g].block_tokens);
    for (int32_t i = seq->len[g] - 1; i >= nb; i--) {
      if (seq->table[g][i] != SCH_BLOCK_HOLE) sch_block_pool_unref(kv->pool, seq->table[g][i]);
      seq->table[g][i] = SCH_BLOCK_HOLE;
    }
    if (seq->len[g] > nb) seq->len[g] = nb;
    if (seq->first_live[g] > seq->len[g]) seq->first_live[g] = seq->len[g];
    if (seq->num_registered[g] > seq->len[g]) seq->num_registered[g] = seq->len[g];
  }
}

void sch_kv_free(struct sch_kv *kv, struct sch_kv_seq *seq) {
  sch_kv_rollback(kv, seq, 0);
}

/* ---- counters ------------------------------------------------------------------- */

void sch_kv_count_query(struct sch_kv *kv, int64_t queried, int64_t hit) {
  if (!kv->prefix_caching) return;
  kv->queries += (uint64_t)queried;
  kv->hits += (uint64_t)hit;
}

void sch_kv_counters(const struct sch_kv *kv, uint64_t *queries, uint64_t *hits) {
  *queries = kv->queries;
  *hits = kv->hits;
}
