/* kn-cpu-pool.c — the CPU backend's persistent thread pool.
 *
 * n_threads - 1 worker threads plus the calling thread (index 0) run one task
 * at a time. A task is n_units units of work claimed `grain` at a time from an
 * atomic counter, by the caller and by whichever workers have woken up: on a
 * busy machine a worker that is not scheduled in time simply takes no part,
 * instead of stalling the caller. Once the caller finds no unit left it closes
 * the task (workers can no longer enter) and waits only for those inside.
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
  _Atomic long long next; /* next unclaimed unit */
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

/* Claims and runs units until none are left. */
static void run_units(struct kn_cpu_pool *pool, int ith) {
  for (;;) {
    long long u = atomic_fetch_add_explicit(&pool->next, pool->grain, memory_order_relaxed);
    if (u >= pool->n_units) break;
    long long e = u + pool->grain < pool->n_units ? u + pool->grain : pool->n_units;
    pool->fn(pool->arg, u, e, ith);
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
  pool->n_units = n_units;
  pool->grain = grain;
  atomic_store_explicit(&pool->next, 0, memory_order_relaxed);
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
