/* kn-cpu-shm.h — collectives between CPU tensor-parallel ranks on one host, over a
 * POSIX shared-memory segment: an in-place all-reduce (sum) of f32 rows, an
 * all-gather of equal-sized byte blocks, and a barrier.
 *
 * Each rank is its own process. Rank 0 creates the segment (its name is relayed
 * to the others by the scheduler's DIST message), the other ranks open it, and
 * kn_shm_comm_create returns once all `world` ranks have joined; rank 0 then
 * removes the name, so nothing is left in /dev/shm even if a rank dies later.
 *
 * Every rank must issue the same collectives, in the same order, with the same
 * sizes (a mismatch is detected and fails every rank with CM_ERR_SHAPE). A call
 * larger than the segment's slot (max_bytes per rank) is split into chunks
 * transparently. The all-reduce sums in rank order, (((x0 + x1) + x2) + ...),
 * on every rank, with the same additions in the SIMD and plain C versions: the
 * result is the same bits on all ranks and from run to run.
 *
 * Failure: each wait has a deadline (timeout_ms) and watches its peers' processes,
 * so a rank that dies or stops never leaves the others waiting forever. The first
 * rank to fail marks the segment aborted and every other rank fails at once with
 * CM_ERR_CLOSED. A failed communicator stays failed: every later call returns
 * CM_ERR_CLOSED (the caller reports the failure and the rank group is restarted).
 *
 * World size 1 needs no segment: create maps nothing, the all-reduce and the
 * barrier are no-ops and the all-gather is a copy. A communicator is used by one
 * thread at a time. */
#ifndef LMSERVE_KN_CPU_SHM_H
#define LMSERVE_KN_CPU_SHM_H

#include <stddef.h>

#define KN_SHM_MAX_WORLD       64
#define KN_SHM_NAME_MAX        200        /* bytes of a segment name, without the NUL */
#define KN_SHM_MAX_SLOT        (1u << 30) /* bytes: largest max_bytes */
#define KN_SHM_DEFAULT_TIMEOUT 1000       /* ms, when timeout_ms <= 0 */

struct kn_shm_comm;

/* Joins rank `rank` of `world` to the communicator called `name` (a POSIX shm
 * name: "/lmserve-tp-1234" or the same without the leading '/'; no other '/').
 * Rank 0 creates the segment (it must not exist yet: CM_ERR_STATE if it does, see
 * kn_shm_unlink) with room for max_bytes per rank per collective call; the others
 * open it, retrying until it appears. Returns once all ranks have joined, or
 * CM_ERR_TIMEOUT after timeout_ms (each rank waits at most that long; it is also
 * every later call's per-wait deadline, see kn_shm_comm_set_timeout); CM_ERR_INVAL for bad
 * arguments (rank outside [0, world), a name that is empty, too long or holds a '/', max_bytes 0),
 * CM_ERR_TOOBIG for max_bytes over KN_SHM_MAX_SLOT or world over KN_SHM_MAX_WORLD,
 * CM_ERR_STATE when the segment disagrees (another world size or slot size, the
 * rank already taken), CM_ERR_IO for a failing system call. On success *out is
 * the caller's to kn_shm_comm_destroy. */
int kn_shm_comm_create(const char *name, int rank, int world, size_t max_bytes, int timeout_ms,
                       struct kn_shm_comm **out, char *err, size_t errlen);

/* Unmaps the segment and frees the handle (NULL is fine). Rank 0 removes the name
 * if it is still there. Peers still in a call are not waited for: destroy after
 * the last collective every rank issues, or after a failure. */
void kn_shm_comm_destroy(struct kn_shm_comm *c);

/* Removes the segment called `name` (a supervisor's clean-up after a crashed
 * rank 0, before it starts a new group under the same name). 0, CM_ERR_NOENT when
 * there is none, CM_ERR_INVAL for a bad name, CM_ERR_IO otherwise. */
int kn_shm_unlink(const char *name);

/* buf[0..n) (floats) becomes the sum over ranks, in rank order, on every rank.
 * 0, or a negative cm-err code: CM_ERR_TIMEOUT (a peer did not arrive within the
 * deadline), CM_ERR_CLOSED (a peer died, or another rank failed first, or this
 * communicator failed before), CM_ERR_SHAPE (ranks passed different n),
 * CM_ERR_INVAL (buf NULL with n > 0). */
int kn_shm_allreduce_sum_f32(struct kn_shm_comm *c, float *buf, size_t n);

/* all[r * bytes .. (r + 1) * bytes) = rank r's `mine` (bytes each), on every rank.
 * all is [world][bytes]; mine may be all + rank * bytes. Errors as the all-reduce,
 * plus CM_ERR_TOOBIG when world * bytes overflows. */
int kn_shm_allgather(struct kn_shm_comm *c, const void *mine, size_t bytes, void *all);

/* Returns once every rank has called it. Errors as the all-reduce. */
int kn_shm_barrier(struct kn_shm_comm *c);

/* Sets the deadline of every later wait (ms; <= 0: KN_SHM_DEFAULT_TIMEOUT). For a
 * group that joins with a long timeout (ranks load their weights at different
 * speeds) and then fails fast in its steps. */
void kn_shm_comm_set_timeout(struct kn_shm_comm *c, int timeout_ms);

int kn_shm_comm_rank(const struct kn_shm_comm *c);
int kn_shm_comm_world(const struct kn_shm_comm *c);
/* The slot size in bytes (max_bytes rounded up to 64): the largest call that is
 * one synchronisation; larger calls take ceil(bytes / slot) of them. */
size_t kn_shm_comm_slot_bytes(const struct kn_shm_comm *c);
/* Why the communicator failed ("" while it has not): for the caller's report. */
const char *kn_shm_comm_error(const struct kn_shm_comm *c);
/* "avx2" or "c": the version of the sum the all-reduce uses. */
const char *kn_shm_comm_isa(const struct kn_shm_comm *c);

/* dst[i] = ((src[0][i] + src[1][i]) + ...) + src[nsrc - 1][i] for i < n: the
 * all-reduce's sum (dst may be one of the src). _ref is the plain C version, the
 * oracle; kn_shm_sum_f32 uses AVX2 when `avx2` is set (the caller checked the CPU
 * has it) and gives the same bits. */
void kn_shm_sum_f32_ref(float *dst, const float *const *src, int nsrc, size_t n);
void kn_shm_sum_f32(float *dst, const float *const *src, int nsrc, size_t n, int avx2);
/* 1 when this CPU has AVX2 under LMSERVE_KERNELS's cap (kn_cpu_isa_detect). */
int kn_shm_cpu_avx2(void);

#endif
