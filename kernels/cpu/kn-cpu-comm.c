/* kn-cpu-comm.c — the CPU backend's collectives (KN_CAP_ALLREDUCE): its
 * tensor-parallel group is a shared-memory communicator (kn-cpu-shm.h) whose
 * segment name is the group's kn_comm_id. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "common/cm-log.h"
#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/cpu/kn-cpu-shm.h"
#include "kernels/kn-backend-impl.h"

/* Bytes per rank per synchronisation: a decode step's rows in one, a long prefill
 * chunk's in a few (kn_shm splits larger calls). */
#define KN_CPU_COMM_SLOT (4u << 20)

static int cpu_comm_id_new(void *p, struct kn_comm_id *id) {
  (void)p;
  unsigned long long r = 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    if (read(fd, &r, sizeof r) != (ssize_t)sizeof r) r = 0;
    close(fd);
  }
  if (!r) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r = (unsigned long long)ts.tv_nsec * 2654435761ull ^ (unsigned long long)ts.tv_sec;
  }
  snprintf((char *)id->bytes, sizeof id->bytes, "/lmserve-tp-%ld-%016llx", (long)getpid(), r);
  return 0;
}

static int cpu_comm_join(void *p, const struct kn_comm_id *id, int rank, int world,
                         int timeout_ms) {
  struct kn_cpu_ctx *ctx = p;
  char name[KN_COMM_ID_BYTES + 1], err[256];
  memcpy(name, id->bytes, KN_COMM_ID_BYTES);
  name[KN_COMM_ID_BYTES] = 0;
  int rc = kn_shm_comm_create(name, rank, world, KN_CPU_COMM_SLOT, timeout_ms, &ctx->comm, err,
                              sizeof err);
  if (rc) {
    cm_error("kn", "rank %d of %d cannot join %s: %s", rank, world, name, err);
    return rc;
  }
  kn_shm_comm_set_timeout(ctx->comm, KN_COMM_CALL_TIMEOUT_MS);
  return 0;
}

static int report(struct kn_cpu_ctx *ctx, const char *what, int rc) {
  if (rc) cm_error("kn", "%s failed: %s", what, kn_shm_comm_error(ctx->comm));
  return rc;
}

static int cpu_all_reduce_sum(void *p, float *buf, size_t n) {
  struct kn_cpu_ctx *ctx = p;
  if (!ctx->comm) return CM_ERR_STATE;
  return report(ctx, "all-reduce", kn_shm_allreduce_sum_f32(ctx->comm, buf, n));
}

static int cpu_all_gather(void *p, const void *mine, size_t bytes, void *all) {
  struct kn_cpu_ctx *ctx = p;
  if (!ctx->comm) return CM_ERR_STATE;
  return report(ctx, "all-gather", kn_shm_allgather(ctx->comm, mine, bytes, all));
}

void kn_cpu_comm_fill(struct kn_backend_ops *ops) {
  ops->comm_id_new = cpu_comm_id_new;
  ops->comm_join = cpu_comm_join;
  ops->all_reduce_sum = cpu_all_reduce_sum;
  ops->all_gather = cpu_all_gather;
}
