/* sch-block-pool.h — the logical KV block pool: N physical pages (ids 0..N-1) shared by
 * every KV-cache group, with reference counts for shared prefix blocks, a free list,
 * an LRU list of free-but-cached blocks and the content-hash table of prefix caching.
 *
 * A block is in exactly one state:
 *   used    ref > 0: held by ref block tables (several when a cached prefix is shared);
 *   free    ref == 0, no content hash: on the free list, handed out first;
 *   cached  ref == 0, content hashed: on the LRU list, still findable by lookup; it is
 *           evicted (oldest first) only when the free list is empty.
 * The pool knows nothing of sequences or groups beyond the group id stored with a
 * block's hash; sch-kv.c builds block tables on top of it. No allocation after create. */
#ifndef LMSERVE_SCH_BLOCK_POOL_H
#define LMSERVE_SCH_BLOCK_POOL_H

#include <stddef.h>
#include <stdint.h>

struct sch_block_pool;

/* num_blocks pages; max_block_tokens is the largest tokens-per-block of any group
 * (the pool keeps the token ids of hashed blocks to rule out hash collisions).
 * Returns 0 or CM_ERR_INVAL / CM_ERR_NOMEM. */
int sch_block_pool_create(int32_t num_blocks, int32_t max_block_tokens,
                          struct sch_block_pool **out);
void sch_block_pool_destroy(struct sch_block_pool *p);

int32_t sch_block_pool_num_blocks(const struct sch_block_pool *p);
/* Blocks an allocation can still get: free list plus cached-but-free (evictable). */
int32_t sch_block_pool_num_available(const struct sch_block_pool *p);
/* Blocks on the LRU list (free but still holding cached content). */
int32_t sch_block_pool_num_cached_free(const struct sch_block_pool *p);
int32_t sch_block_pool_num_used(const struct sch_block_pool *p);
/* Fraction of blocks in use, 0..1 (cached-but-free blocks count as free). */
double sch_block_pool_usage(const struct sch_block_pool *p);
/* Cached blocks evicted from the LRU list so far. */
uint64_t sch_block_pool_num_evictions(const struct sch_block_pool *p);

/* Takes a block with ref 1: the free list first, else the least recently freed cached
 * block (its hash is forgotten). Returns the id or CM_ERR_FULL when none is left. */
int32_t sch_block_pool_alloc(struct sch_block_pool *p);
/* One more holder of a used block, or revives a cached block found by lookup. */
void sch_block_pool_ref(struct sch_block_pool *p, int32_t id);
/* One holder fewer; at zero the block goes to the LRU tail when hashed, else to the
 * free list. */
void sch_block_pool_unref(struct sch_block_pool *p, int32_t id);
int32_t sch_block_pool_refcount(const struct sch_block_pool *p, int32_t id);
/* 1 when the block holds registered (hashed) content, else 0. */
int sch_block_pool_is_hashed(const struct sch_block_pool *p, int32_t id);
/* 1 when the block is free-but-cached (on the LRU list). */
int sch_block_pool_is_cached_free(const struct sch_block_pool *p, int32_t id);

/* ---- prefix cache --------------------------------------------------------------- */

/* The block registered with exactly this content (hash, parent hash, group and the n
 * token ids, compared in full), or -1. Does not change its state: see _ref. */
int32_t sch_block_pool_lookup(const struct sch_block_pool *p, uint64_t hash, uint64_t parent,
                              int32_t group, const int32_t *tokens, int32_t n);
/* Registers the content of a used, full block. Returns 0, or CM_ERR_STATE when the
 * block is already hashed or another block holds the same content (then this one stays
 * unregistered and returns to the free list when released). */
int sch_block_pool_set_hash(struct sch_block_pool *p, int32_t id, uint64_t hash, uint64_t parent,
                            int32_t group, const int32_t *tokens, int32_t n);

/* Forgets all cached content (the workers lost their KV memory): cached-free blocks go
 * back to the free list and held blocks lose their hash. */
void sch_block_pool_forget_cached(struct sch_block_pool *p);

/* Consistency check of every list, count and hash chain (tests and debug builds):
 * returns 0 or CM_ERR_STATE with a description in err. O(N). */
int sch_block_pool_check(const struct sch_block_pool *p, char *err, size_t err_len);

#endif
