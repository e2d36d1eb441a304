/* sch-hash.h — the 64-bit content hash of a KV block for automatic prefix caching.
 *
 * A block's hash covers its parent block's hash, its KV group and its token ids, so
 * equal hashes mean "same tokens at the same positions of the same prefix" with
 * overwhelming probability. The mixing is keyed (a per-engine seed) so that a client
 * cannot precompute colliding prompts; on a hit the block pool still compares the
 * group, parent hash and token ids, so a collision can only cost a cache miss. */
#ifndef LMSERVE_SCH_HASH_H
#define LMSERVE_SCH_HASH_H

#include <stdint.h>

#include "common/cm-hash.h"

#define SCH_HASH_K1 0x9e3779b97f4a7c15ull
#define SCH_HASH_K2 0xc2b2ae3d27d4eb4full
#define SCH_HASH_K3 0x165667b19e3779f9ull

/* Hash of one block: n token ids (n = the group's tokens per block) after parent. */
static inline uint64_t sch_hash_block(uint64_t key, uint64_t parent, int32_t group,
                                      const int32_t *tokens, int32_t n) {
  uint64_t h = cm_mix64(key ^ SCH_HASH_K1) ^ cm_mix64(parent + SCH_HASH_K2);
  h = cm_mix64(h ^ ((uint64_t)(uint32_t)group * SCH_HASH_K3) ^ (uint64_t)(uint32_t)n);
  int32_t i = 0;
  /* two token ids per 64-bit lane */
  for (; i + 1 < n; i += 2) {
    uint64_t v = (uint64_t)(uint32_t)tokens[i] | ((uint64_t)(uint32_t)tokens[i + 1] << 32);
    h = cm_rotl64(h ^ (v * SCH_HASH_K2), 31) * SCH_HASH_K1 + SCH_HASH_K3;
  }
  if (i < n) h = cm_rotl64(h ^ ((uint64_t)(uint32_t)tokens[i] * SCH_HASH_K2), 31) * SCH_HASH_K1;
  return cm_mix64(h ^ (uint64_t)n);
}

#endif
