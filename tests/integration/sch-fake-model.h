/* sch-fake-model.h — the trivial deterministic "model" shared by the scheduler's fake
 * worker (sch-fake-worker.c) and its integration test (test-scheduler.c): the next
 * token depends on the previous token, the position and the sum of every token before,
 * so a wrong KV read anywhere in the context (a bad prefix-cache hit, a block table
 * pointing elsewhere) changes the output. */
#ifndef LMSERVE_SCH_FAKE_MODEL_H
#define LMSERVE_SCH_FAKE_MODEL_H
#include <stdint.h>

#define SCH_FAKE_VOCAB  1000u
#define SCH_FAKE_EOS    1u
#define SCH_FAKE_MAXLEN 512u /* tokens; the fake worker's max_model_len */
#define SCH_FAKE_LORA_SUM 0x10a4000000000000ull /* --loras N says this + N */

/* The token after toks[0..n), n >= 1. */
static inline uint32_t sch_fake_next(const uint32_t *toks, uint32_t n) {
  uint64_t sum = 0;
  for (uint32_t i = 0; i < n; i++)
    sum += toks[i];
  uint64_t h = (uint64_t)toks[n - 1] * 0x9e3779b97f4a7c15ull ^ (uint64_t)n * 0xc2b2ae3d27d4eb4full ^
               sum * 0x165667b19e3779f9ull;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  return (uint32_t)(h % SCH_FAKE_VOCAB);
}

#endif
