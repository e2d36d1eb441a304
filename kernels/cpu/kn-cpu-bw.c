/* kn-cpu-bw.c — kn_cpu_measure_bandwidth(): the machine's streaming read
 * bandwidth, the bound a memory-bound decode step is measured against.
 *
 * Each thread sums its share of a buffer much larger than the caches with
 * wide loads (the sum is kept so the reads cannot be removed); the best of a
 * few passes counts. The buffer asks for transparent huge pages, as the
 * worker's copy of the weights does (wk-model.c): the bound is the fastest
 * plain read of memory like the weights'. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "common/cm-huge.h"
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

struct kn_cpu_bw_probe {
  struct kn_cpu_pool *pool;
  struct bw_task t;
  int n_threads;
  size_t bytes;
  struct cm_huge mem; /* t.buf */
};

int kn_cpu_bw_probe_create(size_t bytes, int n_threads, struct kn_cpu_bw_probe **out) {
  *out = NULL;
  if (bytes == 0) bytes = (size_t)256 << 20;
  if (n_threads <= 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    n_threads = n > 0 ? (int)n : 1;
  }
  if (n_threads > KN_CPU_MAX_THREADS) n_threads = KN_CPU_MAX_THREADS;
  bytes &= ~(size_t)511;
  if (bytes == 0) return CM_ERR_INVAL;
  struct kn_cpu_bw_probe *p = calloc(1, sizeof(*p));
  if (!p || cm_huge_map(bytes, &p->mem) || kn_cpu_pool_create(n_threads, &p->pool)) {
    if (p) cm_huge_unmap(&p->mem);
    free(p);
    return CM_ERR_NOMEM;
  }
  uint64_t *buf = (uint64_t *)p->mem.base;
  memset(buf, 0x5a, bytes); /* touch every page */
  p->t = (struct bw_task){.buf = buf, .n = bytes / 8, .avx2 = kn_cpu_isa_detect() >= KN_CPU_ISA_AVX2};
  p->n_threads = n_threads;
  p->bytes = bytes;
  *out = p;
  return 0;
}

size_t kn_cpu_bw_probe_bytes(const struct kn_cpu_bw_probe *p) {
  return p->bytes;
}

double kn_cpu_bw_probe_pass(struct kn_cpu_bw_probe *p) {
  uint64_t t0 = cm_time_ns();
  kn_cpu_pool_run(p->pool, (long long)((p->t.n + BW_UNIT - 1) / BW_UNIT), 1, bw_run, &p->t);
  return (double)(cm_time_ns() - t0) * 1e-9; /* the sums stay in p->t: the reads are kept */
}

void kn_cpu_bw_probe_destroy(struct kn_cpu_bw_probe *p) {
  if (!p) return;
  kn_cpu_pool_destroy(p->pool);
  cm_huge_unmap(&p->mem);
  free(p);
}

double kn_cpu_measure_bandwidth(size_t bytes, int n_threads) {
  struct kn_cpu_bw_probe *p = NULL;
  if (kn_cpu_bw_probe_create(bytes, n_threads, &p)) return -1.0;
  double best = 0.0;
  for (int pass = 0; pass < 4; pass++) {
    double s = kn_cpu_bw_probe_pass(p);
    double gbs = s > 0 ? (double)p->bytes / s / 1e9 : 0.0;
    if (gbs > best) best = gbs;
  }
  kn_cpu_bw_probe_destroy(p);
  return best;
}
