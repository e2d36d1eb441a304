/* kn-cpu-pool.c — the CPU backend's persistent thread pool.
 *
 * n_threads - 1 worker threads plus the calling thread (index 0) run one task
 * at a time. A task is n_units units of work, cut into one contiguous range a
 * thread; each thread claims its own range's units `grain` at a time from the
 * front, so that its units follow each other in memory (a matvec's weights
 * then stream as one sequence, which the hardware prefetcher keeps up with,
 * instead of a fresh stream every unit), and once its range is empty takes
 * the others' from their back. Whoever has woken up works: on a busy machine a
 * worker that is not scheduled in time simply takes no part, its range taken
 * by the others, instead of stalling the caller. Once the caller finds no unit
 * left it closes the task (workers can no longer enter) and waits only for
 * those inside.
 * Waiting spins briefly (ops of a decode step follow each other within
 * microseconds) and then sleeps on a condition variable, so an idle server
 * burns no CPU. Which thread runs a unit never changes its result: kernels
 * compute each output element within one unit. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "common/cm-err.h"
#include "common/cm-time.h"
#include "kernels/cpu/kn-cpu-impl.h"

#define POOL_SPIN_NS 200000ull /* how long a waiter spins before sleeping */

struct kn_cpu_pool {
  int n_threads;      /* including the caller */
  pthread_t *threads; /* [n_threads - 1] */
  int n_started;

  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* workers sleep here for a new generation */
  pthread_cond_t done_cv; /* the caller sleeps here for the last worker to leave */

  _Atomic uint64_t gen;   /* bumped once per task */
  _Atomic uint32_t state; /* POOL_CLOSED bit | number of workers inside the task */
  _Atomic int stop;

  /* the current task; written while the task is closed, before it opens */
  kn_cpu_task_fn fn;
  void *arg;
  long long n_units, grain;
  struct pool_range *ranges; /* [n_threads] */
};

/* A thread's range of a task's chunks (grain units each) not yet claimed:
 * [lo, hi) packed as lo | hi << 32, claimed by compare-and-swap, its own
 * thread from lo up, the others from hi down; a cache line each. */
struct pool_range {
  _Alignas(64) _Atomic uint64_t r;
};

#define POOL_CLOSED 0x80000000u

struct worker_arg {
  struct kn_cpu_pool *pool;
  int ith;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* Waits until pool->gen != seen; returns the new generation. */
static uint64_t wait_generation(struct kn_cpu_pool *pool, uint64_t seen) {
  uint64_t g = atomic_load_explicit(&pool->gen, memory_order_acquire);
  if (g != seen) return g;
  uint64_t t0 = cm_time_ns();
  for (unsigned i = 0;; i++) {
    g = atomic_load_explicit(&pool->gen, memory_order_acquire);
    if (g != seen) return g;
    cpu_relax();
    if ((i & 255) == 255 && cm_time_ns() - t0 > POOL_SPIN_NS) break;
  }
  pthread_mutex_lock(&pool->mu);
  while ((g = atomic_load_explicit(&pool->gen, memory_order_acquire)) == seen)
    pthread_cond_wait(&pool->work_cv, &pool->mu);
  pthread_mutex_unlock(&pool->mu);
  return g;
}

/* Claims a chunk of range r, from its front (own) or its back: the chunk's
 * index, or -1 when the range is empty. */
static long long claim(struct pool_range *r, int own) {
  uint64_t v = atomic_load_explicit(&r->r, memory_order_relaxed);
  for (;;) {
    const uint32_t lo = (uint32_t)v, hi = (uint32_t)(v >> 32);
    if (lo >= hi) return -1;
    const uint64_t nv = own ? v + 1 : (uint64_t)lo | (uint64_t)(hi - 1) << 32;
    if (atomic_compare_exchange_weak_explicit(&r->r, &v, nv, memory_order_relaxed,
                                              memory_order_relaxed))
      return own ? lo : hi - 1;
  }
}

/* Claims and runs chunks until none are left: its own range's, then the
 * others' (the next thread's first). */
static void run_units(struct kn_cpu_pool *pool, int ith) {
  const int n = pool->n_threads;
  for (int k = 0; k < n; k++) {
    struct pool_range *r = &pool->ranges[(ith + k) % n];
    for (long long c; (c = claim(r, k == 0)) >= 0;) {
      const long long u = c * pool->grain;
      pool->fn(pool->arg, u, u + pool->grain < pool->n_units ? u + pool->grain : pool->n_units,
               ith);
    }
  }
}

/* Enters the open task, if any: 1 when entered. A task closes once the
 * caller has found no unit left, so a late worker never holds it up. */
static int try_join(struct kn_cpu_pool *pool) {
  uint32_t s = atomic_load_explicit(&pool->state, memory_order_acquire);
  while (!(s & POOL_CLOSED)) {
    if (atomic_compare_exchange_weak_explicit(&pool->state, &s, s + 1, memory_order_acq_rel,
                                              memory_order_acquire))
      return 1;
  }
  return 0;
}

static void leave(struct kn_cpu_pool *pool) {
  uint32_t s = atomic_fetch_sub_explicit(&pool->state, 1, memory_order_acq_rel) - 1;
  if (s == POOL_CLOSED) { /* closed and we were the last one inside */
    pthread_mutex_lock(&pool->mu);
    pthread_cond_signal(&pool->done_cv);
    pthread_mutex_unlock(&pool->mu);
  }
}

static void *worker_main(void *p) {
  struct worker_arg wa = *(struct worker_arg *)p;
  free(p);
  struct kn_cpu_pool *pool = wa.pool;
  uint64_t seen = 0;
  for (;;) {
    seen = wait_generation(pool, seen);
    if (atomic_load_explicit(&pool->stop, memory_order_acquire)) break;
    if (!try_join(pool)) continue;
    run_units(pool, wa.ith);
    leave(pool);
  }
  return NULL;
}

int kn_cpu_pool_create(int n_threads, struct kn_cpu_pool **out) {
  *out = NULL;
  if (n_threads < 1 || n_threads > KN_CPU_MAX_THREADS) return CM_ERR_INVAL;
  struct kn_cpu_pool *pool = calloc(1, sizeof(*pool));
  if (!pool) return CM_ERR_NOMEM;
  pool->n_threads = n_threads;
  pool->ranges =
      aligned_alloc(_Alignof(struct pool_range), (size_t)n_threads * sizeof(struct pool_range));
  if (!pool->ranges) {
    free(pool);
    return CM_ERR_NOMEM;
  }
  for (int i = 0; i < n_threads; i++)
    atomic_init(&pool->ranges[i].r, 0);
  atomic_init(&pool->state, POOL_CLOSED);
  pthread_mutex_init(&pool->mu, NULL);
  pthread_cond_init(&pool->work_cv, NULL);
  pthread_cond_init(&pool->done_cv, NULL);
  if (n_threads > 1) {
    pool->threads = calloc((size_t)n_threads - 1, sizeof(pthread_t));
    if (!pool->threads) goto fail;
  }
  for (int i = 1; i < n_threads; i++) {
    struct worker_arg *wa = malloc(sizeof(*wa));
    if (!wa) goto fail;
    wa->pool = pool;
    wa->ith = i;
    if (pthread_create(&pool->threads[i - 1], NULL, worker_main, wa) != 0) {
      free(wa);
      goto fail;
    }
    pool->n_started++;
  }
  *out = pool;
  return 0;
fail:
  kn_cpu_pool_destroy(pool);
  return CM_ERR_NOMEM;
}

void kn_cpu_pool_destroy(struct kn_cpu_pool *pool) {
  if (!pool) return;
  pthread_mutex_lock(&pool->mu);
  atomic_store_explicit(&pool->stop, 1, memory_order_release);
  atomic_fetch_add_explicit(&pool->gen, 1, memory_order_acq_rel);
  pthread_cond_broadcast(&pool->work_cv);
  pthread_mutex_unlock(&pool->mu);
  for (int i = 0; i < pool->n_started; i++)
    pthread_join(pool->threads[i], NULL);
  free(pool->threads);
  free(pool->ranges);
  pthread_mutex_destroy(&pool->mu);
  pthread_cond_destroy(&pool->work_cv);
  pthread_cond_destroy(&pool->done_cv);
  free(pool);
}

int kn_cpu_pool_threads(const struct kn_cpu_pool *pool) {
  return pool->n_threads;
}

void kn_cpu_pool_run(struct kn_cpu_pool *pool, long long n_units, long long grain,
                     kn_cpu_task_fn fn, void *arg) {
  if (n_units <= 0) return;
  if (grain < 1) grain = 1;
  if (grain >= n_units || pool->n_started == 0) {
    fn(arg, 0, n_units, 0);
    return;
  }
  /* the previous task is closed and empty: publish, open, wake */
  pool->fn = fn;
  pool->arg = arg;
  /* chunks counted in 32 bits: larger grains past 2^31 of them */
  const long long most = (long long)INT32_MAX;
  if ((n_units + grain - 1) / grain > most) grain = (n_units + most - 1) / most;
  pool->n_units = n_units;
  pool->grain = grain;
  const long long chunks = (n_units + grain - 1) / grain;
  for (int i = 0; i < pool->n_threads; i++) /* thread i's share of the chunks */
    atomic_store_explicit(&pool->ranges[i].r,
                          (uint64_t)(chunks * i / pool->n_threads) |
                              (uint64_t)(chunks * (i + 1) / pool->n_threads) << 32,
                          memory_order_relaxed);
  atomic_store_explicit(&pool->state, 0, memory_order_release);
  pthread_mutex_lock(&pool->mu);
  atomic_fetch_add_explicit(&pool->gen, 1, memory_order_acq_rel);
  pthread_cond_broadcast(&pool->work_cv);
  pthread_mutex_unlock(&pool->mu);

  run_units(pool, 0);

  /* close; wait for the workers inside to finish their claimed units */
  uint32_t s = atomic_fetch_or_explicit(&pool->state, POOL_CLOSED, memory_order_acq_rel);
  if (s == 0) return;
  uint64_t t0 = cm_time_ns();
  for (unsigned i = 0; atomic_load_explicit(&pool->state, memory_order_acquire) != POOL_CLOSED;
       i++) {
    cpu_relax();
    if ((i & 255) == 255 && cm_time_ns() - t0 > POOL_SPIN_NS) {
      pthread_mutex_lock(&pool->mu);
      while (atomic_load_explicit(&pool->state, memory_order_acquire) != POOL_CLOSED)
        pthread_cond_wait(&pool->done_cv, &pool->mu);
      pthread_mutex_unlock(&pool->mu);
      break;
    }
  }
}
