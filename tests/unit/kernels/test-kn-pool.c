/* test-kn-pool.c — the CPU backend's thread pool: every unit of every task
 * runs exactly once, on any number of threads (more than the cores too, so
 * workers join late or not at all), back to back and after idle sleeps; a
 * thread runs its own share's units from the front; and the bandwidth probe
 * answers. */
#include <stdatomic.h>
#include <stdlib.h>

#include "common/cm-err.h"
#include "common/cm-time.h"
#include "kernels/cpu/kn-cpu-impl.h"
#include "tests/harness/th.h"

struct count_task {
  _Atomic int *hits; /* [n] */
  _Atomic int bad_ith;
  int n_threads;
};

static void count_units(void *arg, long long u0, long long u1, int ith) {
  struct count_task *c = arg;
  if (ith < 0 || ith >= c->n_threads) atomic_store(&c->bad_ith, 1);
  for (long long u = u0; u < u1; u++)
    atomic_fetch_add(&c->hits[u], 1);
}

static void run_counted(struct kn_cpu_pool *pool, int threads, long long n, long long grain) {
  struct count_task c = {.n_threads = threads};
  c.hits = calloc((size_t)n, sizeof(*c.hits));
  TH_REQUIRE(c.hits);
  kn_cpu_pool_run(pool, n, grain, count_units, &c);
  long long wrong = 0;
  for (long long u = 0; u < n; u++)
    wrong += atomic_load(&c.hits[u]) != 1;
  if (wrong)
    th_fail(__FILE__, __LINE__, "%d threads, %lld units, grain %lld: %lld units not run once",
            threads, n, grain, wrong);
  TH_CHECK(!atomic_load(&c.bad_ith));
  free(c.hits);
}

TH_TEST(pool_runs_every_unit_once) {
  static const int threads[] = {1, 2, 3, 8};
  for (size_t i = 0; i < sizeof(threads) / sizeof(threads[0]); i++) {
    struct kn_cpu_pool *pool = NULL;
    TH_REQUIRE(kn_cpu_pool_create(threads[i], &pool) == 0);
    TH_CHECK_EQ_INT(kn_cpu_pool_threads(pool), threads[i]);
    for (int rep = 0; rep < 300; rep++)
      run_counted(pool, threads[i], 1 + rep % 37, 1 + rep % 3);
    run_counted(pool, threads[i], 100000, 7);
    run_counted(pool, threads[i], 5, 5); /* one claim: runs on the caller */
    cm_time_sleep_ns(1000000);           /* workers go to sleep; a task must wake them */
    run_counted(pool, threads[i], 1000, 1);
    kn_cpu_pool_destroy(pool);
  }
  struct kn_cpu_pool *pool = NULL;
  TH_CHECK_EQ_INT(kn_cpu_pool_create(0, &pool), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_cpu_pool_create(KN_CPU_MAX_THREADS + 1, &pool), CM_ERR_INVAL);
}

/* Records the thread that ran each unit. */
struct who_task {
  _Atomic int *ith; /* [n], -1 before */
};

static void record_units(void *arg, long long u0, long long u1, int ith) {
  struct who_task *w = arg;
  for (long long u = u0; u < u1; u++)
    atomic_store(&w->ith[u], ith);
}

/* A thread's own share of the units (the chunks cut evenly, as the pool
 * does) is claimed from its front: the units of its share that it ran are
 * the share's first ones, adjacent (the others take from the back). */
TH_TEST(pool_threads_claim_their_share_from_the_front) {
  static const int threads[] = {2, 3, 8};
  for (size_t i = 0; i < sizeof(threads) / sizeof(threads[0]); i++) {
    struct kn_cpu_pool *pool = NULL;
    const int nth = threads[i];
    TH_REQUIRE(kn_cpu_pool_create(nth, &pool) == 0);
    for (int rep = 0; rep < 200; rep++) {
      const long long n = 64 + rep % 53, grain = 1 + rep % 3, chunks = (n + grain - 1) / grain;
      struct who_task w = {.ith = calloc((size_t)n, sizeof(*w.ith))};
      TH_REQUIRE(w.ith);
      for (long long u = 0; u < n; u++)
        atomic_init(&w.ith[u], -1);
      kn_cpu_pool_run(pool, n, grain, record_units, &w);
      for (int t = 0; t < nth; t++) {
        const long long s = chunks * t / nth * grain, e = chunks * (t + 1) / nth * grain;
        long long u = s;
        while (u < e && u < n && atomic_load(&w.ith[u]) == t)
          u++;
        for (long long v = u; v < e && v < n; v++)
          if (atomic_load(&w.ith[v]) == t || atomic_load(&w.ith[v]) < 0) {
            th_fail(__FILE__, __LINE__,
                    "%d threads, %lld units, grain %lld: unit %lld of thread %d's share "
                    "[%lld, %lld) ran on %d after a unit it did not run",
                    nth, n, grain, v, t, s, e, atomic_load(&w.ith[v]));
            break;
          }
      }
      free(w.ith);
    }
    kn_cpu_pool_destroy(pool);
  }
}

TH_TEST(bandwidth_probe_answers) {
  double gbs = kn_cpu_measure_bandwidth((size_t)16 << 20, 2);
  TH_CHECK(gbs > 0.1 && gbs < 10000.0);
}

TH_TEST(backend_isa_choice) {
  struct kn_backend *be = NULL;
  TH_REQUIRE(kn_cpu_backend_create_isa(1, KN_CPU_ISA_REF, &be) == 0);
  TH_CHECK_EQ_STR(kn_backend_name(be), "cpu-ref");
  kn_backend_destroy(be);
  TH_REQUIRE(kn_cpu_backend_create(2, &be) == 0);
  {
    /* what the processor has under LMSERVE_KERNELS's cap: the choice follows it */
    enum kn_cpu_isa have = kn_cpu_isa_detect();
    /* the default mode stops at AVX-512: the bf16 dot products serve the
     * bf16 mode alone */
    TH_CHECK_EQ_STR(kn_backend_name(be), have >= KN_CPU_ISA_AVX512     ? "cpu-avx512"
                                         : have == KN_CPU_ISA_AVX2VNNI ? "cpu-avx2vnni"
                                         : have == KN_CPU_ISA_AVX2     ? "cpu-avx2"
                                                                       : "cpu-ref");
    kn_backend_destroy(be);
    TH_REQUIRE(kn_cpu_backend_create_mode(1, KN_CPU_ISA_AVX512BF16, 1, &be) == 0);
    TH_CHECK_EQ_STR(kn_backend_name(be), have >= KN_CPU_ISA_AVX512BF16 ? "cpu-avx512bf16"
                                         : have == KN_CPU_ISA_AVX512   ? "cpu-avx512"
                                         : have == KN_CPU_ISA_AVX2VNNI ? "cpu-avx2vnni"
                                         : have == KN_CPU_ISA_AVX2     ? "cpu-avx2"
                                                                       : "cpu-ref");
    kn_backend_destroy(be);
    /* the best table of the bf16 mode: the AMX tiles where they are usable */
    TH_REQUIRE(kn_cpu_backend_create_mode(1, KN_CPU_ISA_BEST, 1, &be) == 0);
    TH_CHECK_EQ_STR(kn_backend_name(be), have == KN_CPU_ISA_AMX          ? "cpu-amx"
                                         : have == KN_CPU_ISA_AVX512BF16 ? "cpu-avx512bf16"
                                         : have == KN_CPU_ISA_AVX512     ? "cpu-avx512"
                                         : have == KN_CPU_ISA_AVX2VNNI   ? "cpu-avx2vnni"
                                         : have == KN_CPU_ISA_AVX2       ? "cpu-avx2"
                                                                         : "cpu-ref");
    kn_backend_destroy(be);
    /* a request above what the processor has is capped */
    TH_REQUIRE(kn_cpu_backend_create_isa(1, KN_CPU_ISA_AVX2, &be) == 0);
    TH_CHECK_EQ_STR(kn_backend_name(be), have >= KN_CPU_ISA_AVX2 ? "cpu-avx2" : "cpu-ref");
    kn_backend_destroy(be);
    /* the AVX-VNNI table exactly: where AVX-512 stands without AVX-VNNI (Ice
     * Lake, Zen 4), the AVX2 table */
    TH_REQUIRE(kn_cpu_backend_create_isa(1, KN_CPU_ISA_AVX2VNNI, &be) == 0);
    TH_CHECK_EQ_STR(kn_backend_name(be), have >= KN_CPU_ISA_AVX2VNNI && kn_cpu_has_avxvnni()
                                             ? "cpu-avx2vnni"
                                         : have >= KN_CPU_ISA_AVX2 ? "cpu-avx2"
                                                                   : "cpu-ref");
  }
  kn_backend_destroy(be);
}
