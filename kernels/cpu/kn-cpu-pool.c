/* kn-cpu-pool.c — the CPU backend's persistent thread pool.
 *
 * n_threads - 1 worker threads plus the calling thread (index 0) run one task
 * at a time: kn_cpu_pool_run() publishes (fn, arg, nth), bumps a generation
 * counter, runs share 0 itself and waits until every worker has acknowledged.
 * Waiting spins briefly (ops of a decode step follow each other within
 * microseconds) and then sleeps on a condition variable, so an idle server
 * burns no CPU. Workers with index >= nth acknowledge without running. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "common/cm-err.h"
#include "common/cm-time.h"
#include "kernels/cpu/kn-cpu-impl.h"

#define POOL_SPIN_NS 200000ull /* how long a waiter spins before sleeping */

struct kn_cpu_pool {
  int n_threads; /* including the caller */
  pthread_t *threads; /* [n_threads - 1] */
  int n_started;

  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* workers sleep here for a new generation */
  pthread_cond_t done_cv; /* the caller sleeps here for pending == 0 */

  _Atomic uint64_t gen; /* bumped once per task */
  _Atomic int pending;  /* workers that have not acknowledged this task */
  _Atomic int stop;

  /* the current task; written before gen is bumped */
  kn_cpu_task_fn fn;
  void *arg;
  int nth;
};

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

static void *worker_main(void *p) {
  struct worker_arg wa = *(struct worker_arg *)p;
  free(p);
  struct kn_cpu_pool *pool = wa.pool;
  uint64_t seen = 0;
  for (;;) {
    seen = wait_generation(pool, seen);
    if (atomic_load_explicit(&pool->stop, memory_order_acquire)) break;
    if (wa.ith < pool->nth) pool->fn(pool->arg, wa.ith, pool->nth);
    pthread_mutex_lock(&pool->mu);
    if (atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel) == 1)
      pthread_cond_signal(&pool->done_cv);
    pthread_mutex_unlock(&pool->mu);
  }
  return NULL;
}

int kn_cpu_pool_create(int n_threads, struct kn_cpu_pool **out) {
  *out = NULL;
  if (n_threads < 1 || n_threads > KN_CPU_MAX_THREADS) return CM_ERR_INVAL;
  struct kn_cpu_pool *pool = calloc(1, sizeof(*pool));
  if (!pool) return CM_ERR_NOMEM;
  pool->n_threads = n_threads;
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
  for (int i = 0; i < pool->n_started; i++) pthread_join(pool->threads[i], NULL);
  free(pool->threads);
  pthread_mutex_destroy(&pool->mu);
  pthread_cond_destroy(&pool->work_cv);
  pthread_cond_destroy(&pool->done_cv);
  free(pool);
}

int kn_cpu_pool_threads(const struct kn_cpu_pool *pool) { return pool->n_threads; }

void kn_cpu_pool_run(struct kn_cpu_pool *pool, int nth, kn_cpu_task_fn fn, void *arg) {
  if (nth > pool->n_threads) nth = pool->n_threads;
  if (nth <= 1 || pool->n_started == 0) {
    fn(arg, 0, 1);
    return;
  }
  pool->fn = fn;
  pool->arg = arg;
  pool->nth = nth;
  atomic_store_explicit(&pool->pending, pool->n_started, memory_order_release);
  pthread_mutex_lock(&pool->mu);
  atomic_fetch_add_explicit(&pool->gen, 1, memory_order_acq_rel);
  pthread_cond_broadcast(&pool->work_cv);
  pthread_mutex_unlock(&pool->mu);

  fn(arg, 0, nth);

  uint64_t t0 = cm_time_ns();
  for (unsigned i = 0; atomic_load_explicit(&pool->pending, memory_order_acquire) != 0; i++) {
    cpu_relax();
    if ((i & 255) == 255 && cm_time_ns() - t0 > POOL_SPIN_NS) {
      pthread_mutex_lock(&pool->mu);
      while (atomic_load_explicit(&pool->pending, memory_order_acquire) != 0)
        pthread_cond_wait(&pool->done_cv, &pool->mu);
      pthread_mutex_unlock(&pool->mu);
      break;
    }
  }
}

/* Splits [0, n) into nth nearly equal parts aligned to `align`; part ith is
 * [*b, *e). */
void kn_cpu_split(long long n, int ith, int nth, long long align, long long *b, long long *e) {
  long long units = (n + align - 1) / align;
  long long per = units / nth, extra = units % nth;
  long long ub = ith * per + (ith < extra ? ith : extra);
  long long ue = ub + per + (ith < extra ? 1 : 0);
  *b = ub * align < n ? ub * align : n;
  *e = ue * align < n ? ue * align : n;
}
