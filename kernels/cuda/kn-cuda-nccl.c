/* kn-cuda-nccl.c — the CUDA backend's collectives over NCCL (KN_CAP_ALLREDUCE).
 *
 * The group's id is NCCL's unique id (128 bytes): rank 0 makes it, the scheduler
 * relays it (DIST), every rank joins with ncclCommInitRank — GPUs of one host over
 * NVLink / PCIe, of several hosts over NCCL's own network transports.
 *
 * A peer that dies or hangs must not leave this rank waiting forever: the
 * communicator is non-blocking (ncclConfig_t.blocking = 0), and both the join and
 * every collective are waited for by polling the stream and ncclCommGetAsyncError
 * against a deadline; past it the communicator is aborted (ncclCommAbort) and the
 * call fails, as does every later one. Each collective therefore completes before it
 * returns: a host synchronisation per all-reduce, which CUDA graphs of whole steps
 * will take away. Compiled only when the build has NCCL. */
/* nccl.h declares a few functions with () parameter lists */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-log.h"
#include "common/cm-time.h"
#include "kernels/cuda/kn-cuda-impl.h"
#include "kernels/kn-backend-impl.h"

_Static_assert(NCCL_UNIQUE_ID_BYTES == KN_COMM_ID_BYTES, "a comm id holds NCCL's unique id");

struct kn_cuda_nccl {
  ncclComm_t comm;
  int failed; /* the communicator was aborted: every call fails */
};

static int nccl_fail(struct kn_cuda_nccl *n, ncclResult_t r, const char *what) {
  cm_error("cuda", "NCCL %s failed: %s", what, ncclGetErrorString(r));
  if (n->comm) (void)ncclCommAbort(n->comm);
  n->comm = NULL;
  n->failed = 1;
  return r == ncclInvalidArgument || r == ncclInvalidUsage ? CM_ERR_INVAL : CM_ERR_CLOSED;
}

/* Waits until the communicator has no operation in progress (join) or the stream is
 * idle (a collective), watching for asynchronous errors; aborts past the deadline. */
static int nccl_wait(struct kn_cuda_ctx *c, struct kn_cuda_nccl *n, int join, int timeout_ms) {
  uint64_t deadline = cm_time_ns() + (uint64_t)timeout_ms * 1000000ull;
  for (;;) {
    ncclResult_t ar = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(n->comm, &ar);
    if (r != ncclSuccess) return nccl_fail(n, r, "ncclCommGetAsyncError");
    if (ar != ncclSuccess && ar != ncclInProgress) return nccl_fail(n, ar, "collective");
    if (join ? ar == ncclSuccess : ar == ncclSuccess && cudaStreamQuery(c->stream) == cudaSuccess)
      return 0;
    if (!join) {
      cudaError_t e = cudaStreamQuery(c->stream);
      if (e != cudaSuccess && e != cudaErrorNotReady) {
        kn_cuda_fail(e, "cudaStreamQuery", __FILE__, __LINE__);
        return nccl_fail(n, ncclUnhandledCudaError, "stream");
      }
    }
    if (cm_time_ns() > deadline) {
      cm_error("cuda", "NCCL %s: no progress in %d ms (a peer died or hangs)",
               join ? "join" : "collective", timeout_ms);
      (void)ncclCommAbort(n->comm);
      n->comm = NULL;
      n->failed = 1;
      return CM_ERR_TIMEOUT;
    }
    sched_yield();
  }
}

static int cuda_comm_id_new(void *ctx, struct kn_comm_id *id) {
  (void)ctx;
  ncclUniqueId u;
  ncclResult_t r = ncclGetUniqueId(&u);
  if (r != ncclSuccess) {
    cm_error("cuda", "ncclGetUniqueId failed: %s", ncclGetErrorString(r));
    return CM_ERR_DEVICE;
  }
  memcpy(id->bytes, u.internal, sizeof(u.internal));
  return 0;
}

static int cuda_comm_join(void *ctx, const struct kn_comm_id *id, int rank, int world,
                          int timeout_ms) {
  struct kn_cuda_ctx *c = ctx;
  int err = kn_cuda_enter(c);
  if (err) return err;
  struct kn_cuda_nccl *n = calloc(1, sizeof(*n));
  if (!n) return CM_ERR_NOMEM;
  ncclUniqueId u;
  memcpy(u.internal, id->bytes, sizeof(u.internal));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&n->comm, world, u, rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    nccl_fail(n, r, "ncclCommInitRankConfig");
    free(n);
    return CM_ERR_DEVICE;
  }
  if ((err = nccl_wait(c, n, 1, timeout_ms))) {
    free(n);
    return err;
  }
  c->nccl = n;
  cm_info("cuda", "rank %d of %d joined its NCCL group on device %d", rank, world, c->device);
  return 0;
}

/* Before a collective: CM_ERR_CLOSED without a working group, the refusal of
 * one while a graph is captured, else the device entered (0). */
static int collective_begin(struct kn_cuda_ctx *c) {
  if (!c->nccl || c->nccl->failed) return CM_ERR_CLOSED;
  int err = kn_cuda_graph_refuse(c, "a collective");
  return err ? err : kn_cuda_enter(c);
}

/* After enqueueing a collective (`what` returned r): its failure, or the wait
 * for it to finish. */
static int collective_end(struct kn_cuda_ctx *c, ncclResult_t r, const char *what) {
  if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(c->nccl, r, what);
  return nccl_wait(c, c->nccl, 0, KN_COMM_CALL_TIMEOUT_MS);
}

static int cuda_all_reduce_sum(void *ctx, float *buf, size_t count) {
  struct kn_cuda_ctx *c = ctx;
  int err = collective_begin(c);
  if (err) return err;
  ncclResult_t r = ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, c->nccl->comm, c->stream);
  return collective_end(c, r, "ncclAllReduce");
}

static int cuda_all_gather(void *ctx, const void *mine, size_t bytes, void *all) {
  struct kn_cuda_ctx *c = ctx;
  int err = collective_begin(c);
  if (err) return err;
  ncclResult_t r = ncclAllGather(mine, all, bytes, ncclUint8, c->nccl->comm, c->stream);
  return collective_end(c, r, "ncclAllGather");
}

void kn_cuda_nccl_destroy(struct kn_cuda_ctx *c) {
  struct kn_cuda_nccl *n = c->nccl;
  if (!n) return;
  if (n->comm) (void)ncclCommDestroy(n->comm);
  free(n);
  c->nccl = NULL;
}

void kn_cuda_nccl_fill(struct kn_backend_ops *ops) {
  ops->comm_id_new = cuda_comm_id_new;
  ops->comm_join = cuda_comm_join;
  ops->all_reduce_sum = cuda_all_reduce_sum;
  ops->all_gather = cuda_all_gather;
}
