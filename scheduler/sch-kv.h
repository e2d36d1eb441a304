/* sch-kv.h — per-sequence KV block tables over the shared block pool: one table per KV
 * group, sliding-window freeing, automatic prefix caching, reservation and rollback of
 * slots for speculative drafts.
 *
 * Groups. The model's layers are grouped by KV spec (Gemma 4: sliding and full). Each
 * group has its own tokens per block and window W (0 = full attention); all draw pages
 * from one pool. KV-shared layers are not groups: they read their source layer's blocks.
 *
 * Tables. table[g][i] is the physical block holding positions [i*bt, (i+1)*bt) of group
 * g, or SCH_BLOCK_HOLE once a sliding group has released it: the worker indexes tables
 * by position / bt, so freed entries keep their index. A block is dead for a group of
 * window W when its last position < q0 - W + 1, q0 being the next query position.
 *
 * Prefix caching. A full, computed block is content-hashed (parent hash, group, token
 * ids; sch-hash.h) and registered in the pool. A new sequence reuses the longest prefix
 * that every group can serve: a full-attention group needs all of its blocks before the
 * hit, a sliding group only those its first query still sees (the window); the ones
 * before are holes and are not revived. So a shared prompt still hits after the LRU
 * evicted its sliding group's old blocks, which out-of-window release puts first in line
 * (vLLM's hybrid managers do the same). The hit length is a multiple of every group's
 * block size and leaves at least one prompt token to compute, so the last prompt token
 * always runs and produces logits. */
#ifndef LMSERVE_SCH_KV_H
#define LMSERVE_SCH_KV_H

#include <stdint.h>

#include "scheduler/sch-block-pool.h"

#define SCH_MAX_GROUPS 8
#define SCH_BLOCK_HOLE (-1)

struct sch_kv_group_cfg {
  int32_t block_tokens; /* tokens per block of this group (pages are equal in bytes) */
  int32_t window;       /* sliding window W in tokens; 0 = full attention */
};

/* Per-sequence KV state; embedded in a request, filled by sch_kv_seq_init. */
struct sch_kv_seq {
  int32_t *table[SCH_MAX_GROUPS];         /* [cap[g]] physical block ids or SCH_BLOCK_HOLE */
  int32_t len[SCH_MAX_GROUPS];            /* entries in use: covers positions [0, len*bt) */
  int32_t cap[SCH_MAX_GROUPS];            /* entries allocated (blocks for max_tokens) */
  int32_t first_live[SCH_MAX_GROUPS];     /* entries below are holes (sliding groups) */
  int32_t num_registered[SCH_MAX_GROUPS]; /* entries already offered to the prefix cache */
  uint64_t *hash[SCH_MAX_GROUPS];         /* [cap[g]] content hashes of full blocks */
  int32_t num_hashed[SCH_MAX_GROUPS];     /* hash[g][0..num_hashed) are valid */
  int32_t max_tokens;                     /* positions the tables can cover */
  uint64_t salt; /* the first block's parent hash: a request's cache salt (0: none) */
  void *mem;                              /* one allocation behind table[] and hash[] */
};

struct sch_kv;

/* groups[0..ngroups) as the worker reported them; the pool is borrowed (it must outlive
 * the manager). hash_key seeds the content hash. Returns 0 or CM_ERR_INVAL/NOMEM. */
int sch_kv_create(struct sch_block_pool *pool, const struct sch_kv_group_cfg *groups,
                  int32_t ngroups, int prefix_caching, uint64_t hash_key, struct sch_kv **out);
void sch_kv_destroy(struct sch_kv *kv);

int32_t sch_kv_num_groups(const struct sch_kv *kv);
const struct sch_kv_group_cfg *sch_kv_group(const struct sch_kv *kv, int32_t g);
struct sch_block_pool *sch_kv_pool(struct sch_kv *kv);

/* Tables able to cover max_tokens positions (grown later with sch_kv_seq_reserve).
 * Returns 0 or CM_ERR_NOMEM. The sequence holds no block afterwards. */
int sch_kv_seq_init(const struct sch_kv *kv, struct sch_kv_seq *seq, int32_t max_tokens);
/* Grows the tables to cover max_tokens positions (a no-op when they already do); they
 * move, so pointers into them taken before are stale. 0 or CM_ERR_NOMEM (unchanged). */
int sch_kv_seq_reserve(const struct sch_kv *kv, struct sch_kv_seq *seq, int32_t max_tokens);
/* Frees the tables' memory; the sequence must hold no block (see sch_kv_free). */
void sch_kv_seq_release(struct sch_kv_seq *seq);

/* The most blocks one sequence of max_len tokens can hold at once when a step runs at
 * most step_tokens of it (sliding groups keep only the window plus the step's chunk). */
int64_t sch_kv_worst_case_blocks(const struct sch_kv *kv, int64_t max_len, int64_t step_tokens);

/* For a sequence that holds no block: how many leading tokens of tokens[0..ntok) the
 * prefix cache already holds in every group (0 when prefix caching is off). Computes and
 * keeps the sequence's block hashes. Changes nothing else. */
int32_t sch_kv_prefix_match(struct sch_kv *kv, struct sch_kv_seq *seq, const int32_t *tokens,
                            int32_t ntok);

/* Makes the tables cover positions [0, end). q0 is the first position this step
 * computes (the sequence's computed tokens). When the sequence holds no block and
 * q0 > 0, positions [0, q0) are taken from the prefix cache: q0 must be the value
 * sch_kv_prefix_match just returned for the same tokens. Sliding groups first release
 * blocks dead for q0. All or nothing: CM_ERR_FULL, with no block taken, when the pool
 * cannot give enough. */
int sch_kv_allocate(struct sch_kv *kv, struct sch_kv_seq *seq, const int32_t *tokens, int32_t q0,
                    int32_t end);

/* Registers in the prefix cache every full block wholly inside [0, num_computed), whose
 * KV now holds tokens[]. No-op when prefix caching is off. */
void sch_kv_commit(struct sch_kv *kv, struct sch_kv_seq *seq, const int32_t *tokens,
                   int32_t num_computed);

/* Releases the blocks that hold only positions >= keep (rejected speculative drafts):
 * afterwards the tables cover [0, ceil(keep / bt)) blocks per group. */
void sch_kv_rollback(struct sch_kv *kv, struct sch_kv_seq *seq, int32_t keep);

/* Releases every block, last first (so a finished prompt's tail is evicted before its
 * shared head); hashed blocks go to the LRU list. Keeps the computed hashes. */
void sch_kv_free(struct sch_kv *kv, struct sch_kv_seq *seq);

/* Blocks (not holes) the sequence holds across all groups. */
int32_t sch_kv_seq_num_blocks(const struct sch_kv_seq *seq, int32_t ngroups);

/* Prefix-cache counters in tokens (vLLM's prefix_cache_queries / _hits). */
void sch_kv_count_query(struct sch_kv *kv, int64_t queried, int64_t hit);
void sch_kv_counters(const struct sch_kv *kv, uint64_t *queries, uint64_t *hits);

#endif
