/* kn-cpu-bw.c — kn_cpu_measure_bandwidth(): the machine's streaming read
 * bandwidth, the bound a memory-bound decode step is measured against.
 *
 * Each thread sums its share of a buffer much larger than the caches with
 * wide loads (the sum is kept so the reads cannot be removed); the best of a
 * few passes counts. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm-time.h"
#include "kernels/cpu/kn-cpu-avx2.h"
#include "kernels/cpu/kn-cpu-impl.h"

struct bw_task {
  const uint64_t *buf;
  size_t n; /* uint64 words */
  int avx2;
  uint64_t sums[KN_CPU_MAX_THREADS];
};

KN_AVX2 static uint64_t read_avx2(const uint64_t *p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_xor_si256(a0, _mm256_loadu_si256((const __m256i *)(p + i)));
    a1 = _mm256_xor_si256(a1, _mm256_loadu_si256((const __m256i *)(p + i + 4)));
    a2 = _mm256_xor_si256(a2, _mm256_loadu_si256((const __m256i *)(p + i + 8)));
    a3 = _mm256_xor_si256(a3, _mm256_loadu_si256((const __m256i *)(p + i + 12)));
  }
  __m256i a = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
  uint64_t out[4];
  _mm256_storeu_si256((__m256i *)out, a);
  uint64_t s = out[0] ^ out[1] ^ out[2] ^ out[3];
  for (; i < n; i++)
    s ^= p[i];
  return s;
}

static uint64_t read_plain(const uint64_t *p, size_t n) {
  uint64_t s0 = 0, s1 = 0;
  size_t i = 0;
  for (; i + 2 <= n; i += 2) {
    s0 ^= p[i];
    s1 ^= p[i + 1];
  }
  if (i < n) s0 ^= p[i];
  return s0 ^ s1;
}

#define BW_UNIT (1 << 17) /* words (1 MiB) per unit */

static void bw_run(void *arg, long long u0, long long u1, int ith) {
  struct bw_task *t = arg;
  size_t b = (size_t)u0 * BW_UNIT, e = (size_t)u1 * BW_UNIT;
  if (e > t->n) e = t->n;
  t->sums[ith] ^= t->avx2 ? read_avx2(t->buf + b, e - b) : read_plain(t->buf + b, e - b);
}

double kn_cpu_measure_bandwidth(size_t bytes, int n_threads) {
  if (bytes == 0) bytes = (size_t)256 << 20;
  if (n_threads <= 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    n_threads = n > 0 ? (int)n : 1;
  }
  if (n_threads > KN_CPU_MAX_THREADS) n_threads = KN_CPU_MAX_THREADS;
  bytes &= ~(size_t)511;
  if (bytes == 0) return -1.0;
  struct kn_cpu_pool *pool = NULL;
  uint64_t *buf = aligned_alloc(64, bytes);
  if (!buf || kn_cpu_pool_create(n_threads, &pool)) {
    free(buf);
    return -1.0;
  }
  memset(buf, 0x5a, bytes); /* touch every page */
  struct bw_task t = {.buf = buf, .n = bytes / 8, .avx2 = kn_cpu_has_avx2()};
  double best = 0.0;
  uint64_t sink = 0;
  for (int pass = 0; pass < 4; pass++) {
    uint64_t t0 = cm_time_ns();
    kn_cpu_pool_run(pool, (long long)((t.n + BW_UNIT - 1) / BW_UNIT), 1, bw_run, &t);
    uint64_t dt = cm_time_ns() - t0;
    for (int i = 0; i < n_threads; i++)
      sink ^= t.sums[i];
    double gbs = dt ? (double)bytes / (double)dt : 0.0;
    if (gbs > best) best = gbs;
  }
  kn_cpu_pool_destroy(pool);
  free(buf);
  /* the sums are 0x5a5a... patterns; using sink keeps the loads alive */
  return sink == 1 ? best + 0.0 : best;
}
