/* sch-block-pool.c — the logical KV block pool: free list, reference counts, LRU list of
 * free-but-cached blocks and the content-hash table (chained buckets threaded through
 * the block array, so nothing is allocated after create). */
#include "scheduler/sch-block-pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"

enum { BLK_FREE = 0, BLK_USED = 1, BLK_CACHED = 2 };

struct sch_block {
  int32_t ref;     /* block tables holding it */
  int32_t state;   /* BLK_* */
  int32_t prev;    /* LRU neighbours (older) or -1 */
  int32_t next;    /* LRU newer neighbour, or next on the free list, or -1 */
  int32_t hnext;   /* next block in the same hash bucket, or -1 */
  int32_t group;   /* KV group of the hashed content */
  int32_t ntok;    /* tokens in the hashed content; 0 when not hashed */
  uint64_t hash;   /* content hash (valid when ntok > 0) */
  uint64_t parent; /* parent block's content hash */
};

struct sch_block_pool {
  int32_t num_blocks;
  int32_t max_block_tokens; /* tokens kept per block for collision checks */
  struct sch_block *blocks; /* [num_blocks] */
  int32_t *tokens;          /* [num_blocks, max_block_tokens] token ids of hashed blocks */
  int32_t *buckets;         /* [num_buckets] first block of each hash chain, or -1 */
  uint64_t bucket_mask;     /* num_buckets - 1 (a power of two) */
  int32_t free_head;        /* free list (a stack) */
  int32_t num_free;
  int32_t lru_head, lru_tail; /* oldest, newest cached-free block */
  int32_t num_cached;
  uint64_t evictions;
};

int sch_block_pool_create(int32_t num_blocks, int32_t max_block_tokens,
                          struct sch_block_pool **out) {
  *out = NULL;
  if (num_blocks <= 0 || num_blocks > (1 << 28) || max_block_tokens <= 0 || max_block_tokens > 4096)
    return CM_ERR_INVAL;
  struct sch_block_pool *p = calloc(1, sizeof(*p));
  if (!p) return CM_ERR_NOMEM;
  size_t nb = 1;
  while (nb < (size_t)num_blocks * 2)
    nb <<= 1;
  p->num_blocks = num_blocks;
  p->max_block_tokens = max_block_tokens;
  /* one allocation: the blocks (8-byte aligned) first, then the tokens and buckets */
  size_t ntok = (size_t)num_blocks * (size_t)max_block_tokens;
  p->blocks = calloc(1, (size_t)num_blocks * sizeof(*p->blocks) + ntok * sizeof(*p->tokens) +
                            nb * sizeof(*p->buckets));
  if (!p->blocks) {
    free(p);
    return CM_ERR_NOMEM;
  }
  p->tokens = (int32_t *)(p->blocks + num_blocks);
  p->buckets = p->tokens + ntok;
  p->bucket_mask = nb - 1;
  for (size_t i = 0; i < nb; i++)
    p->buckets[i] = -1;
  /* free list in id order: block 0 is handed out first */
  for (int32_t i = 0; i < num_blocks; i++) {
    struct sch_block *b = &p->blocks[i];
    b->state = BLK_FREE;
    b->prev = -1;
    b->next = i + 1 < num_blocks ? i + 1 : -1;
    b->hnext = -1;
  }
  p->free_head = 0;
  p->num_free = num_blocks;
  p->lru_head = p->lru_tail = -1;
  *out = p;
  return 0;
}

void sch_block_pool_destroy(struct sch_block_pool *p) {
  if (!p) return;
  free(p->blocks); /* the tokens and buckets with them */
  free(p);
}

int32_t sch_block_pool_num_blocks(const struct sch_block_pool *p) {
  return p->num_blocks;
}
int32_t sch_block_pool_num_available(const struct sch_block_pool *p) {
  return p->num_free + p->num_cached;
}
int32_t sch_block_pool_num_cached_free(const struct sch_block_pool *p) {
  return p->num_cached;
}
int32_t sch_block_pool_num_used(const struct sch_block_pool *p) {
  return p->num_blocks - p->num_free - p->num_cached;
}
double sch_block_pool_usage(const struct sch_block_pool *p) {
  return (double)sch_block_pool_num_used(p) / (double)p->num_blocks;
}
uint64_t sch_block_pool_num_evictions(const struct sch_block_pool *p) {
  return p->evictions;
}

int32_t sch_block_pool_refcount(const struct sch_block_pool *p, int32_t id) {
  CM_ASSERT(id >= 0 && id < p->num_blocks);
  return p->blocks[id].ref;
}
int sch_block_pool_is_hashed(const struct sch_block_pool *p, int32_t id) {
  CM_ASSERT(id >= 0 && id < p->num_blocks);
  return p->blocks[id].ntok > 0;
}
int sch_block_pool_is_cached_free(const struct sch_block_pool *p, int32_t id) {
  CM_ASSERT(id >= 0 && id < p->num_blocks);
  return p->blocks[id].state == BLK_CACHED;
}

/* ---- LRU and hash chains -------------------------------------------------------- */

static void lru_remove(struct sch_block_pool *p, int32_t id) {
  struct sch_block *b = &p->blocks[id];
  if (b->prev >= 0)
    p->blocks[b->prev].next = b->next;
  else
    p->lru_head = b->next;
  if (b->next >= 0)
    p->blocks[b->next].prev = b->prev;
  else
    p->lru_tail = b->prev;
  b->prev = b->next = -1;
  p->num_cached--;
}

static void lru_push_tail(struct sch_block_pool *p, int32_t id) {
  struct sch_block *b = &p->blocks[id];
  b->prev = p->lru_tail;
  b->next = -1;
  if (p->lru_tail >= 0)
    p->blocks[p->lru_tail].next = id;
  else
    p->lru_head = id;
  p->lru_tail = id;
  p->num_cached++;
}

static void hash_unlink(struct sch_block_pool *p, int32_t id) {
  struct sch_block *b = &p->blocks[id];
  int32_t *link = &p->buckets[b->hash & p->bucket_mask];
  while (*link != id) {
    CM_ASSERT(*link >= 0);
    link = &p->blocks[*link].hnext;
  }
  *link = b->hnext;
  b->hnext = -1;
  b->ntok = 0;
}

/* ---- alloc / ref / unref -------------------------------------------------------- */

int32_t sch_block_pool_alloc(struct sch_block_pool *p) {
  int32_t id;
  if (p->free_head >= 0) {
    id = p->free_head;
    p->free_head = p->blocks[id].next;
    p->num_free--;
  } else if (p->lru_head >= 0) {
    id = p->lru_head;
    lru_remove(p, id);
    hash_unlink(p, id);
    p->evictions++;
  } else {
    return CM_ERR_FULL;
  }
  struct sch_block *b = &p->blocks[id];
  b->state = BLK_USED;
  b->ref = 1;
  b->prev = b->next = -1;
  return id;
}

void sch_block_pool_ref(struct sch_block_pool *p, int32_t id) {
  CM_ASSERT(id >= 0 && id < p->num_blocks);
  struct sch_block *b = &p->blocks[id];
  if (b->state == BLK_CACHED) {
    lru_remove(p, id);
    b->state = BLK_USED;
    b->ref = 1;
    return;
  }
  CM_ASSERT(b->state == BLK_USED && b->ref > 0);
  b->ref++;
}

void sch_block_pool_unref(struct sch_block_pool *p, int32_t id) {
  CM_ASSERT(id >= 0 && id < p->num_blocks);
  struct sch_block *b = &p->blocks[id];
  CM_ASSERT(b->state == BLK_USED && b->ref > 0);
  if (--b->ref > 0) return;
  if (b->ntok > 0) {
    b->state = BLK_CACHED;
    lru_push_tail(p, id);
  } else {
    b->state = BLK_FREE;
    b->prev = -1;
    b->next = p->free_head;
    p->free_head = id;
    p->num_free++;
  }
}

/* ---- prefix cache --------------------------------------------------------------- */

static int same_content(const struct sch_block_pool *p, int32_t id, uint64_t hash, uint64_t parent,
                        int32_t group, const int32_t *tokens, int32_t n) {
  const struct sch_block *b = &p->blocks[id];
  return b->hash == hash && b->parent == parent && b->group == group && b->ntok == n &&
         memcmp(&p->tokens[(size_t)id * (size_t)p->max_block_tokens], tokens,
                (size_t)n * sizeof(*tokens)) == 0;
}

int32_t sch_block_pool_lookup(const struct sch_block_pool *p, uint64_t hash, uint64_t parent,
                              int32_t group, const int32_t *tokens, int32_t n) {
  if (n <= 0 || n > p->max_block_tokens) return -1;
  for (int32_t id = p->buckets[hash & p->bucket_mask]; id >= 0; id = p->blocks[id].hnext)
    if (same_content(p, id, hash, parent, group, tokens, n)) return id;
  return -1;
}

int sch_block_pool_set_hash(struct sch_block_pool *p, int32_t id, uint64_t hash, uint64_t parent,
                            int32_t group, const int32_t *tokens, int32_t n) {
  CM_ASSERT(id >= 0 && id < p->num_blocks);
  struct sch_block *b = &p->blocks[id];
  CM_ASSERT(b->state == BLK_USED);
  if (n <= 0 || n > p->max_block_tokens) return CM_ERR_INVAL;
  if (b->ntok > 0) return CM_ERR_STATE;
  if (sch_block_pool_lookup(p, hash, parent, group, tokens, n) >= 0) return CM_ERR_STATE;
  b->hash = hash;
  b->parent = parent;
  b->group = group;
  b->ntok = n;
  memcpy(&p->tokens[(size_t)id * (size_t)p->max_block_tokens], tokens, (size_t)n * sizeof(*tokens));
  int32_t *head = &p->buckets[hash & p->bucket_mask];
  b->hnext = *head;
  *head = id;
  return 0;
}

void sch_block_pool_forget_cached(struct sch_block_pool *p) {
  while (p->lru_head >= 0) {
    int32_t id = p->lru_head;
    struct sch_block *b = &p->blocks[id];
    lru_remove(p, id);
    hash_unlink(p, id);
    b->state = BLK_FREE;
    b->next = p->free_head;
    p->free_head = id;
    p->num_free++;
  }
  for (int32_t id = 0; id < p->num_blocks; id++)
    if (p->blocks[id].ntok > 0) hash_unlink(p, id);
}

/* ---- consistency check ---------------------------------------------------------- */

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      snprintf(err, err_len, __VA_ARGS__);                                                         \
      return CM_ERR_STATE;                                                                         \
    }                                                                                              \
  } while (0)

int sch_block_pool_check(const struct sch_block_pool *p, char *err, size_t err_len) {
  int32_t n = p->num_blocks, nfree = 0, ncached = 0, nhashed = 0, nchained = 0;
  /* walk the free list: every member free, no cycle */
  for (int32_t id = p->free_head; id >= 0; id = p->blocks[id].next) {
    CHECK(nfree < n, "free list has a cycle");
    CHECK(p->blocks[id].state == BLK_FREE, "block %d on free list in state %d", id,
          p->blocks[id].state);
    nfree++;
  }
  CHECK(nfree == p->num_free, "free list holds %d, count says %d", nfree, p->num_free);
  int32_t prev = -1;
  for (int32_t id = p->lru_head; id >= 0; id = p->blocks[id].next) {
    CHECK(ncached < n, "LRU list has a cycle");
    CHECK(p->blocks[id].state == BLK_CACHED, "block %d on LRU in state %d", id,
          p->blocks[id].state);
    CHECK(p->blocks[id].prev == prev, "LRU back link of %d broken", id);
    prev = id;
    ncached++;
  }
  CHECK(prev == p->lru_tail, "LRU tail is %d, walk ends at %d", p->lru_tail, prev);
  CHECK(ncached == p->num_cached, "LRU holds %d, count says %d", ncached, p->num_cached);
  for (int32_t id = 0; id < n; id++) {
    const struct sch_block *b = &p->blocks[id];
    CHECK(b->state != BLK_USED || b->ref > 0, "used block %d has ref %d", id, b->ref);
    CHECK(b->state == BLK_USED || b->ref == 0, "unused block %d has ref %d", id, b->ref);
    CHECK(b->state != BLK_CACHED || b->ntok > 0, "cached block %d has no hash", id);
    CHECK(b->state != BLK_FREE || b->ntok == 0, "free block %d still hashed", id);
    if (b->ntok > 0) nhashed++;
  }
  for (uint64_t i = 0; i <= p->bucket_mask; i++)
    for (int32_t id = p->buckets[i]; id >= 0; id = p->blocks[id].hnext) {
      CHECK(nchained < n, "hash chain has a cycle");
      CHECK(p->blocks[id].ntok > 0, "unhashed block %d in a hash chain", id);
      CHECK((p->blocks[id].hash & p->bucket_mask) == i, "block %d in the wrong bucket", id);
      nchained++;
    }
  CHECK(nchained == nhashed, "%d hashed blocks but %d chained", nhashed, nchained);
  return 0;
}
