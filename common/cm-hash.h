/* cm-hash.h — the 64-bit mixing every module shares: splitmix64's finaliser
 * (a strong avalanche: each input bit flips each output bit with probability
 * about one half), a rotation, and splitmix64's generator step on top of them;
 * and xorshift64's step (Marsaglia's 13, 7, 17), the tests' and benchmarks' cheap
 * stream. Header only; the values are part of what tests and generated checkpoints
 * pin down, so they must not change. */
#ifndef LMSERVE_CM_HASH_H
#define LMSERVE_CM_HASH_H
#include <stdint.h>

#define CM_GOLDEN64 0x9e3779b97f4a7c15ull /* 2^64 / the golden ratio */

static inline uint64_t cm_mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static inline uint64_t cm_rotl64(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}

/* The next value of the splitmix64 sequence whose state is *s. */
static inline uint64_t cm_splitmix64(uint64_t *s) {
  return cm_mix64(*s += CM_GOLDEN64);
}

/* The next value of the xorshift64 sequence whose state is *s (not 0). */
static inline uint64_t cm_xorshift64(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

#endif
