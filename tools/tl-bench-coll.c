/* tl-bench-coll.c — `lmserve bench coll`: latency of the shared-memory collectives
 * of CPU tensor-parallel ranks (kernels/cpu/kn-cpu-shm.h). Forks one process per
 * rank, pinned one per CPU where there are enough, and times back-to-back
 * all-reduces of T rows of hidden size H (a decode step's rows by default), then
 * the 8-byte all-gather of the vocab-parallel head's (max, argmax) pairs and a
 * barrier. Prints the command line that reproduces the run, then one line per
 * size: rank 0's median, p99, p99.9 and mean per call, and the slowest rank's
 * median and p99.
 *
 *   lmserve bench coll [--world-size N] [--rows T] [--floats H] [--iters N]
 *                      [--warmup N] [--no-pin] */
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm-args.h"
#include "common/cm-err.h"
#include "common/cm-time.h"
#include "kernels/cpu/kn-cpu-shm.h"
#include "tools/tl-main.h"

#define BC_MAX_SIZES 4

struct bc_conf {
  int world, rows, pin, iters, warmup;
  int n_sizes;
  int floats[BC_MAX_SIZES];   /* hidden sizes, floats per row */
  int cpus[KN_SHM_MAX_WORLD]; /* the CPU of each rank when pinned */
  char name[64];
};

/* The per-call figures of one measurement, in ns. */
struct bc_stat {
  double median, p99, p999, mean;
};

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static struct bc_stat stat_of(uint64_t *ns, int n) {
  double sum = 0;
  for (int i = 0; i < n; i++)
    sum += (double)ns[i];
  qsort(ns, (size_t)n, sizeof(*ns), cmp_u64);
  struct bc_stat s = {(double)ns[n / 2], (double)ns[(int)((long)n * 99 / 100)],
                      (double)ns[(int)((long)n * 999 / 1000)], sum / n};
  return s;
}

enum { BC_ALLREDUCE, BC_ALLGATHER, BC_BARRIER };

/* Runs warm-up + timed calls of one kind on this rank; gathers every rank's
 * figures; rank 0 prints the line. 0 or a cm-err code. */
static int bc_measure(struct kn_shm_comm *c, const struct bc_conf *cf, int kind, size_t n,
                      float *buf, const float *src, uint64_t *ns) {
  int rank = kn_shm_comm_rank(c), world = kn_shm_comm_world(c), rc = 0;
  /* a vocab-parallel head's (max logit, argmax) of one row */
  struct {
    float max;
    int32_t argmax;
  } pair = {(float)rank, rank}, pairs[KN_SHM_MAX_WORLD];
  for (int i = 0; i < cf->warmup + cf->iters; i++) {
    if (kind == BC_ALLREDUCE) memcpy(buf, src, n * sizeof(float)); /* fresh rows, in cache */
    uint64_t t0 = cm_time_ns();
    if (kind == BC_ALLREDUCE)
      rc = kn_shm_allreduce_sum_f32(c, buf, n);
    else if (kind == BC_ALLGATHER)
      rc = kn_shm_allgather(c, &pair, sizeof(pair), pairs);
    else
      rc = kn_shm_barrier(c);
    uint64_t t1 = cm_time_ns();
    if (rc) return rc;
    if (i >= cf->warmup) ns[i - cf->warmup] = t1 - t0;
  }
  struct bc_stat s = stat_of(ns, cf->iters), all[KN_SHM_MAX_WORLD];
  if ((rc = kn_shm_allgather(c, &s, sizeof(s), all))) return rc;
  if (rank) return 0;
  struct bc_stat worst = all[0];
  for (int r = 1; r < world; r++) {
    if (all[r].median > worst.median) worst.median = all[r].median;
    if (all[r].p99 > worst.p99) worst.p99 = all[r].p99;
  }
  char what[96];
  if (kind == BC_ALLREDUCE)
    snprintf(what, sizeof(what), "allreduce %5zu floats x %d rows (%zu B)", n / (size_t)cf->rows,
             cf->rows, n * sizeof(float));
  else if (kind == BC_ALLGATHER)
    snprintf(what, sizeof(what), "allgather %zu B per rank", sizeof(pair));
  else
    snprintf(what, sizeof(what), "barrier");
  printf("%-42s median %7.2f us  p99 %7.2f us  p99.9 %8.2f us  mean %7.2f us  (slowest rank: "
         "median %.2f us, p99 %.2f us)\n",
         what, s.median * 1e-3, s.p99 * 1e-3, s.p999 * 1e-3, s.mean * 1e-3, worst.median * 1e-3,
         worst.p99 * 1e-3);
  fflush(stdout);
  return 0;
}

/* One rank's whole run; the process's exit status. */
static int bc_rank(const struct bc_conf *cf, int rank) {
  if (cf->pin) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cf->cpus[rank], &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) perror("sched_setaffinity");
  }
  size_t max_n = 0;
  for (int k = 0; k < cf->n_sizes; k++)
    if ((size_t)cf->floats[k] * (size_t)cf->rows > max_n)
      max_n = (size_t)cf->floats[k] * (size_t)cf->rows;
  char err[256] = "";
  struct kn_shm_comm *c = NULL;
  int rc = kn_shm_comm_create(cf->name, rank, cf->world, max_n * sizeof(float), 10000, &c, err,
                              sizeof(err));
  if (rc) {
    fprintf(stderr, "lmserve bench coll: rank %d: %s\n", rank, err);
    return 1;
  }
  if (rank == 0) {
    printf("# %d ranks, %s sum, %zu-byte slots\n", cf->world, kn_shm_comm_isa(c),
           kn_shm_comm_slot_bytes(c));
    fflush(stdout);
  }
  float *buf = malloc(max_n * sizeof(float)), *src = malloc(max_n * sizeof(float));
  uint64_t *ns = malloc((size_t)cf->iters * sizeof(uint64_t));
  if (!buf || !src || !ns) {
    fprintf(stderr, "lmserve bench coll: rank %d: out of memory\n", rank);
    rc = CM_ERR_NOMEM;
  }
  for (size_t i = 0; !rc && i < max_n; i++)
    src[i] = (float)((int)((i * 2654435761u + (size_t)rank * 40503u) % 2001u) - 1000) * 1e-3f;
  for (int k = 0; !rc && k < cf->n_sizes; k++)
    rc = bc_measure(c, cf, BC_ALLREDUCE, (size_t)cf->floats[k] * (size_t)cf->rows, buf, src, ns);
  if (!rc) rc = bc_measure(c, cf, BC_ALLGATHER, 0, NULL, NULL, ns);
  if (!rc) rc = bc_measure(c, cf, BC_BARRIER, 0, NULL, NULL, ns);
  if (rc)
    fprintf(stderr, "lmserve bench coll: rank %d: %s (%s)\n", rank, kn_shm_comm_error(c),
            cm_strerror(rc));
  free(buf);
  free(src);
  free(ns);
  kn_shm_comm_destroy(c);
  return rc ? 1 : 0;
}

int tl_bench_coll_main(int argc, char **argv) {
  int64_t world = 2, rows = 1, floats = 0, iters = 20000, warmup = 2000;
  int pin = 1, floats_seen = 0;
  const struct cm_opt opts[] = {
      {"world-size", CM_OPT_INT, &world, "N", "ranks, one process each (default 2)", 1,
       KN_SHM_MAX_WORLD},
      {"rows", CM_OPT_INT, &rows, "T", "rows per all-reduce (default 1: a decode step)", 1, 65536},
      {"floats", CM_OPT_INT, &floats, "H", "hidden size (default: 640, 1152 and 2560 in turn)", 1,
       1 << 24, 0, 0, &floats_seen},
      {"iters", CM_OPT_INT, &iters, "N", "timed calls per size (default 20000)", 1, 10000000},
      {"warmup", CM_OPT_INT, &warmup, "N", "untimed calls first (default 2000)", 0, 10000000},
      {"pin", CM_OPT_BOOL, &pin, NULL, "pin rank r to the r-th allowed CPU (default on)"},
      {0},
  };
  int rc = tl_args_parse("lmserve bench coll",
                         "all-reduce latency of CPU tensor-parallel ranks over shared memory", opts,
                         argc, argv);
  if (rc >= 0) return rc;
  static struct bc_conf cf;
  cf.world = (int)world;
  cf.rows = (int)rows;
  cf.iters = (int)iters;
  cf.warmup = (int)warmup;
  if (floats_seen) {
    cf.floats[cf.n_sizes++] = (int)floats;
  } else {
    cf.floats[cf.n_sizes++] = 640;
    cf.floats[cf.n_sizes++] = 1152;
    cf.floats[cf.n_sizes++] = 2560;
  }
  if ((uint64_t)rows * (uint64_t)(floats_seen ? floats : 2560) * sizeof(float) > KN_SHM_MAX_SLOT) {
    fprintf(stderr, "lmserve bench coll: --rows x --floats is over %u bytes\n", KN_SHM_MAX_SLOT);
    return 2;
  }
  /* one CPU per rank, from the CPUs this process may use */
  cpu_set_t allowed;
  int ncpu = 0;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0)
    for (int i = 0; i < CPU_SETSIZE && ncpu < KN_SHM_MAX_WORLD; i++)
      if (CPU_ISSET(i, &allowed)) cf.cpus[ncpu++] = i;
  cf.pin = pin && ncpu >= cf.world;
  snprintf(cf.name, sizeof(cf.name), "/lmserve-bench-coll-%d", (int)getpid());

  printf("# lmserve bench coll --world-size %d --rows %d", cf.world, cf.rows);
  if (floats_seen) printf(" --floats %d", cf.floats[0]);
  printf(" --iters %d --warmup %d%s\n", cf.iters, cf.warmup, pin ? "" : " --no-pin");
  if (cf.pin) {
    printf("# pinned: rank r on CPU");
    for (int r = 0; r < cf.world; r++)
      printf("%s%d", r ? "," : " ", cf.cpus[r]);
    printf("\n");
  } else {
    printf("# not pinned: %s (%d ranks, %d CPUs allowed)\n",
           pin ? "fewer CPUs than ranks" : "--no-pin", cf.world, ncpu);
  }
  fflush(stdout);

  pid_t pids[KN_SHM_MAX_WORLD];
  int started = 0, failed = 0;
  for (int r = 0; r < cf.world; r++) {
    pid_t p = fork();
    if (p < 0) {
      perror("lmserve bench coll: fork");
      failed = 1;
      break;
    }
    if (p == 0) _exit(bc_rank(&cf, r));
    pids[started++] = p;
  }
  for (int r = 0; r < started; r++) {
    int st = 0;
    if (failed) kill(pids[r], SIGKILL); /* the group cannot form: do not wait out its timeout */
    if (waitpid(pids[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) failed = 1;
  }
  if (failed) kn_shm_unlink(cf.name); /* in case rank 0 died before it removed the name */
  return failed ? 1 : 0;
}
