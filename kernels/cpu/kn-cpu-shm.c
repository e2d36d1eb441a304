/* kn-cpu-shm.c — the shared-memory collectives of CPU tensor-parallel ranks
 * (kn-cpu-shm.h): the segment, joining it, the one synchronisation every call
 * is made of, and failure handling.
 *
 * The segment (offsets in bytes, every part 64-byte aligned):
 *
 *   [0, 64)             struct shm_hdr: magic, version, world, slot size, the
 *                       join count and the `aborted` word (read-mostly)
 *   [64, 64 + 64 W)     struct shm_ctl per rank, one cache line each: the
 *                       rank's arrival counter `seq` (a futex word), the count
 *                       of peers sleeping on it, the descriptor of its last two
 *                       calls, its pid. Only rank r writes line r in the fast
 *                       path, so arrivals never share a line (no false sharing).
 *   [.., + 2 W S)       data slots: [2][W][S] bytes, S = the slot size;
 *                       slot (b, r) is where rank r puts its part of the calls
 *                       whose sequence number has parity b.
 *
 * One synchronisation (a "step"), for the call numbered s (1, 2, ... per
 * communicator, the same on every rank, wrapping at 2^32):
 *   1. the rank copies its data into slot (s & 1, rank) and its descriptor
 *      (operation, bytes) into its line's desc[s & 1];
 *   2. it stores seq = s (release: 1 happens-before any peer's reading it);
 *   3. it waits until every peer's seq has reached s (acquire), then reads the
 *      peers' slots (s & 1, p).
 * A rank that starts step s + 2 overwrites slot (s & 1, rank); every peer
 * finished reading it in step s before arriving at s + 1, and this rank saw all
 * of them arrive at s + 1 before it left step s + 1. So one wait per step is
 * enough: the double buffer by parity is what lets a rank run ahead by one.
 *
 * Memory orderings (C11 atomics on the shared mapping; the segment is the same
 * physical memory in every process, so they work across processes):
 *   - seq is stored with memory_order_seq_cst, peers load it with acquire: the
 *     slot and descriptor written before the store are visible after the load.
 *   - Sleeping: a waiter increments the peer's `sleepers` (seq_cst RMW), then
 *     loads seq (seq_cst) and calls FUTEX_WAIT with the value it saw; the
 *     arriving rank stores seq (seq_cst) and then loads its own `sleepers`
 *     (seq_cst), calling FUTEX_WAKE only when it is non-zero. With seq_cst on
 *     both sides at least one of them sees the other's write: either the waiter
 *     sees the new seq and does not sleep, or the arriver sees the sleeper and
 *     wakes it (FUTEX_WAIT also refuses to sleep once seq differs from the value
 *     passed). The fast path (no sleeper) makes no system call.
 *   - `magic` is stored last by rank 0 (release) and loaded with acquire by the
 *     joining ranks: the header fields are set when it is seen.
 *   - `aborted` is set with a CAS (the first failing rank wins) and read relaxed
 *     while spinning: it only has to be seen eventually; a rank that sees it
 *     fails without reading anything else.
 *   - The descriptors and slots are plain memory: the step protocol above
 *     orders every write before every read of them.
 *
 * Waiting: up to c->spin iterations of `pause` (about 50 ns each), then futex
 * sleeps of at most SHM_SLICE_MS; after each sleep the rank checks the `aborted`
 * word, whether the peer it waits for still lives (a pidfd, or kill(pid, 0)) and
 * its deadline (timeout_ms from the start of the wait). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SHM_X86 1
#else
#define SHM_X86 0
#endif

#include "common/cm-err.h"
#include "common/cm-log.h"
#include "common/cm-time.h"
#include "kernels/cpu/kn-cpu-shm.h"
#include "kernels/cpu/kn-cpu.h"

#define SHM_MAGIC     0x48534d4cu /* "LMSH" */
#define SHM_VERSION   1u
#define SHM_LINE      64
#define SHM_SLICE_MS  5    /* longest futex sleep between liveness checks */
#define SHM_SPIN      2000 /* pause iterations (~100 us) before sleeping */
#define SHM_SPIN_OVER 64   /* the same when ranks outnumber the CPUs */
#define SHM_JOIN_POLL 200  /* us between looks while joining */

enum { OP_BARRIER = 1, OP_ALLREDUCE_F32 = 2, OP_ALLGATHER = 3 };

struct shm_hdr {
  _Atomic uint32_t magic; /* SHM_MAGIC once the rest is set */
  uint32_t version;       /* SHM_VERSION */
  uint32_t world;         /* ranks */
  uint32_t pad0;
  uint64_t slot_bytes;        /* bytes per rank per parity */
  uint64_t total_bytes;       /* bytes of the whole segment */
  _Atomic uint32_t joined;    /* ranks that have joined */
  _Atomic uint32_t aborted;   /* 0, or 1 + the rank that failed first */
  _Atomic int32_t abort_code; /* its cm-err code */
} __attribute__((aligned(SHM_LINE)));

struct shm_desc {
  uint32_t op;    /* OP_* */
  uint32_t bytes; /* bytes of this step (at most a slot, KN_SHM_MAX_SLOT) */
  uint64_t total; /* bytes of the whole call (a call may be several steps) */
};

struct shm_ctl {
  _Atomic uint32_t seq;      /* the last step this rank arrived at (futex word) */
  _Atomic uint32_t sleepers; /* peers sleeping, or about to, on seq */
  _Atomic int32_t pid;       /* the rank's process, 0 until it joins */
  uint32_t pad;
  uint64_t pidns;          /* inode of its pid namespace, 0 if unknown */
  struct shm_desc desc[2]; /* by parity of the step */
} __attribute__((aligned(SHM_LINE)));

_Static_assert(sizeof(struct shm_hdr) == SHM_LINE, "header is one line");
_Static_assert(sizeof(struct shm_ctl) == SHM_LINE, "control words are one line per rank");
_Static_assert(sizeof(_Atomic uint32_t) == 4, "futex words are 32-bit");

struct kn_shm_comm {
  char name[KN_SHM_NAME_MAX + 2]; /* "/..." */
  int rank, world;
  int timeout_ms;
  int spin;     /* pause iterations before sleeping */
  int avx2;     /* the sum uses AVX2 */
  int failed;   /* 0, or the code this rank failed with */
  int linked;   /* rank 0: the name still exists */
  uint32_t seq; /* the last step this rank completed */
  size_t slot_bytes;
  size_t map_bytes;
  void *map;                          /* the segment, map_bytes */
  struct shm_hdr *hdr;                /* at map */
  struct shm_ctl *ctl;                /* [world] */
  uint8_t *data;                      /* [2][world][slot_bytes] */
  int pidfd[KN_SHM_MAX_WORLD];        /* per peer, -1 when none */
  pid_t pid[KN_SHM_MAX_WORLD];        /* per peer, 0 when it cannot be checked */
  const float *src[KN_SHM_MAX_WORLD]; /* the all-reduce's operands */
  char errmsg[256];
};

/* ---- the sum: rank order, the same bits in both versions ---------------- */

void kn_shm_sum_f32_ref(float *dst, const float *const *src, int nsrc, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float a = src[0][i];
    for (int k = 1; k < nsrc; k++)
      a += src[k][i];
    dst[i] = a;
  }
}

#if SHM_X86
/* Lane by lane the same additions, in the same order, as the reference; each
 * block is loaded from every source before it is stored, so dst may be a source. */
__attribute__((target("avx2"))) static void sum_avx2(float *dst, const float *const *src, int nsrc,
                                                     size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const float *s0 = src[0] + i;
    __m256 a0 = _mm256_loadu_ps(s0), a1 = _mm256_loadu_ps(s0 + 8);
    __m256 a2 = _mm256_loadu_ps(s0 + 16), a3 = _mm256_loadu_ps(s0 + 24);
    for (int k = 1; k < nsrc; k++) {
      const float *s = src[k] + i;
      a0 = _mm256_add_ps(a0, _mm256_loadu_ps(s));
      a1 = _mm256_add_ps(a1, _mm256_loadu_ps(s + 8));
      a2 = _mm256_add_ps(a2, _mm256_loadu_ps(s + 16));
      a3 = _mm256_add_ps(a3, _mm256_loadu_ps(s + 24));
    }
    _mm256_storeu_ps(dst + i, a0);
    _mm256_storeu_ps(dst + i + 8, a1);
    _mm256_storeu_ps(dst + i + 16, a2);
    _mm256_storeu_ps(dst + i + 24, a3);
  }
  for (; i + 8 <= n; i += 8) {
    __m256 a = _mm256_loadu_ps(src[0] + i);
    for (int k = 1; k < nsrc; k++)
      a = _mm256_add_ps(a, _mm256_loadu_ps(src[k] + i));
    _mm256_storeu_ps(dst + i, a);
  }
  for (; i < n; i++) {
    float a = src[0][i];
    for (int k = 1; k < nsrc; k++)
      a += src[k][i];
    dst[i] = a;
  }
}
#endif

void kn_shm_sum_f32(float *dst, const float *const *src, int nsrc, size_t n, int avx2) {
#if SHM_X86
  if (avx2) {
    sum_avx2(dst, src, nsrc, n);
    return;
  }
#endif
  kn_shm_sum_f32_ref(dst, src, nsrc, n);
}

int kn_shm_cpu_avx2(void) {
#if SHM_X86
  return kn_cpu_isa_detect() >= KN_CPU_ISA_AVX2;
#else
  return 0;
#endif
}

/* ---- small helpers ------------------------------------------------------ */

static inline void cpu_relax(void) {
#if SHM_X86
  _mm_pause();
#else
  __asm__ __volatile__("" ::: "memory");
#endif
}

static long futex_wait(_Atomic uint32_t *w, uint32_t val, int ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  /* FUTEX_WAIT, not FUTEX_WAIT_PRIVATE: the word is shared between processes */
  return syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *w) {
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* step s has been reached by a rank whose counter reads v (wrapping compare) */
static inline int reached(uint32_t v, uint32_t s) {
  return (int32_t)(v - s) >= 0;
}

static inline uint8_t *slot(struct kn_shm_comm *c, uint32_t b, int r) {
  return c->data + ((size_t)b * (size_t)c->world + (size_t)r) * c->slot_bytes;
}

static uint64_t pidns_self(void) {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* "name" or "/name" -> "/name" in out; 0 or CM_ERR_INVAL. */
static int shm_name(const char *name, char *out, char *err, size_t errlen) {
  if (!name) return cm_fail(err, errlen, CM_ERR_INVAL, "shm: no segment name");
  size_t len = strlen(name);
  if (len > KN_SHM_NAME_MAX)
    return cm_fail(err, errlen, CM_ERR_INVAL, "shm: segment name of %zu bytes (at most %d)", len,
                   KN_SHM_NAME_MAX);
  const char *base = name[0] == '/' ? name + 1 : name;
  if (!*base || strchr(base, '/'))
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "shm: segment name \"%s\" must be non-empty with no '/' but a leading one",
                   name);
  out[0] = '/';
  memcpy(out + 1, base, strlen(base) + 1);
  return 0;
}

/* ---- failure ------------------------------------------------------------ */

/* Marks the segment aborted (unless another rank did first), wakes every
 * sleeper so that it notices, records the reason; returns code. */
__attribute__((format(printf, 3, 4))) static int comm_fail(struct kn_shm_comm *c, int code,
                                                           const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->errmsg, sizeof(c->errmsg), fmt, ap);
  va_end(ap);
  c->failed = code;
  if (c->hdr) {
    uint32_t none = 0;
    if (atomic_compare_exchange_strong(&c->hdr->aborted, &none, (uint32_t)c->rank + 1))
      atomic_store_explicit(&c->hdr->abort_code, code, memory_order_relaxed);
    for (int p = 0; p < c->world; p++)
      futex_wake_all(&c->ctl[p].seq);
  }
  cm_error("kn", "shm %s rank %d/%d: %s", c->name, c->rank, c->world, c->errmsg);
  return code;
}

/* Another rank aborted: this one fails with CM_ERR_CLOSED. */
static int comm_closed(struct kn_shm_comm *c, uint32_t aborted) {
  int code = atomic_load_explicit(&c->hdr->abort_code, memory_order_relaxed);
  return comm_fail(c, CM_ERR_CLOSED, "rank %u failed (%s): communicator closed", aborted - 1,
                   code ? cm_strerror(code) : "no reason recorded");
}

/* 1 when process pid is a zombie (exited, not yet reaped by its parent). */
static int pid_zombie(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char *e = strrchr(buf, ')'); /* "pid (comm) STATE ...": comm may hold ')' */
  return e && e[1] == ' ' && (e[2] == 'Z' || e[2] == 'X');
}

/* 1 when peer p's process has exited (a zombie counts as exited). Called in
 * the slow path only, once per sleep. */
static int peer_dead(struct kn_shm_comm *c, int p) {
  if (c->pidfd[p] >= 0) {
    struct pollfd q = {.fd = c->pidfd[p], .events = POLLIN};
    return poll(&q, 1, 0) > 0;
  }
  if (c->pid[p] <= 0) return 0;
  if (kill(c->pid[p], 0) != 0) return errno == ESRCH;
  return pid_zombie(c->pid[p]);
}

/* After joining: how each peer's liveness is checked. A pidfd sees a zombie as
 * exited and cannot name a recycled pid; kill(pid, 0) is the fallback. A peer
 * in another pid namespace is not checked (its pid means nothing here): its
 * death is noticed by the deadline only. */
static void peers_watch(struct kn_shm_comm *c) {
  uint64_t ns = pidns_self();
  for (int p = 0; p < c->world; p++) {
    c->pidfd[p] = -1;
    c->pid[p] = 0;
    if (p == c->rank) continue;
    pid_t pid = atomic_load_explicit(&c->ctl[p].pid, memory_order_acquire);
    if (pid <= 0 || !ns || c->ctl[p].pidns != ns) continue;
    c->pid[p] = pid;
#ifdef SYS_pidfd_open
    long fd = syscall(SYS_pidfd_open, pid, 0);
    if (fd >= 0) c->pidfd[p] = (int)fd;
#endif
  }
}

/* ---- the step ----------------------------------------------------------- */

/* Waits until peer p has arrived at step s. *deadline is 0 until the first
 * slow wait of the step sets it. */
static int wait_peer(struct kn_shm_comm *c, int p, uint32_t s, uint64_t *deadline) {
  struct shm_ctl *q = &c->ctl[p];
  uint32_t ab;
  for (int i = 0; i < c->spin; i++) {
    if (reached(atomic_load_explicit(&q->seq, memory_order_acquire), s)) return 0;
    if ((ab = atomic_load_explicit(&c->hdr->aborted, memory_order_relaxed))) goto closed;
    cpu_relax();
  }
  if (!*deadline) *deadline = cm_time_ns() + (uint64_t)c->timeout_ms * 1000000ull;
  for (;;) {
    atomic_fetch_add_explicit(&q->sleepers, 1, memory_order_seq_cst);
    uint32_t v = atomic_load_explicit(&q->seq, memory_order_seq_cst);
    if (!reached(v, s) && !atomic_load_explicit(&c->hdr->aborted, memory_order_relaxed)) {
      uint64_t now = cm_time_ns(), left = now < *deadline ? *deadline - now : 0;
      if (left)
        futex_wait(&q->seq, v,
                   left < SHM_SLICE_MS * 1000000ull ? (int)(left / 1000000ull) + 1 : SHM_SLICE_MS);
    }
    atomic_fetch_sub_explicit(&q->sleepers, 1, memory_order_relaxed);
    if (reached(atomic_load_explicit(&q->seq, memory_order_acquire), s)) return 0;
    if ((ab = atomic_load_explicit(&c->hdr->aborted, memory_order_relaxed))) goto closed;
    if (peer_dead(c, p))
      return comm_fail(c, CM_ERR_CLOSED, "rank %d (pid %d) exited during step %u", p,
                       (int)c->pid[p], s);
    if (cm_time_ns() >= *deadline)
      return comm_fail(c, CM_ERR_TIMEOUT, "rank %d did not arrive at step %u within %d ms", p, s,
                       c->timeout_ms);
  }
closed:
  return comm_closed(c, ab);
}

/* One synchronisation: this rank's slot (s & 1, rank) holds its part of step
 * s = c->seq + 1; publishes it and its descriptor, waits for every peer, checks
 * that all ranks are in the same call. Afterwards the peers' slots of parity
 * s & 1 may be read until this rank starts step s + 2. */
static int step(struct kn_shm_comm *c, uint32_t op, uint64_t bytes, uint64_t total) {
  uint32_t s = c->seq + 1, b = s & 1;
  struct shm_ctl *me = &c->ctl[c->rank];
  me->desc[b] = (struct shm_desc){.op = op, .bytes = (uint32_t)bytes, .total = total};
  atomic_store_explicit(&me->seq, s, memory_order_seq_cst);
  if (atomic_load_explicit(&me->sleepers, memory_order_seq_cst)) futex_wake_all(&me->seq);
  uint64_t deadline = 0;
  for (int k = 1; k < c->world; k++) {
    int p = (c->rank + k) % c->world; /* each rank looks at a different peer first */
    int rc = wait_peer(c, p, s, &deadline);
    if (rc) return rc;
  }
  for (int p = 0; p < c->world; p++) {
    const struct shm_desc *d = &c->ctl[p].desc[b];
    if (d->op != op || d->bytes != bytes || d->total != total)
      return comm_fail(c, CM_ERR_SHAPE,
                       "ranks disagree at step %u: rank %d does op %u of %llu bytes, rank %d op "
                       "%u of %llu bytes",
                       s, c->rank, op, (unsigned long long)total, p, d->op,
                       (unsigned long long)d->total);
  }
  c->seq = s;
  return 0;
}

/* Entry check of every collective. */
static int usable(struct kn_shm_comm *c) {
  if (c->failed) return CM_ERR_CLOSED;
  if (c->hdr) {
    uint32_t ab = atomic_load_explicit(&c->hdr->aborted, memory_order_relaxed);
    if (ab) {
      comm_closed(c, ab);
      return CM_ERR_CLOSED;
    }
  }
  return 0;
}

/* ---- the collectives ---------------------------------------------------- */

int kn_shm_allreduce_sum_f32(struct kn_shm_comm *c, float *buf, size_t n) {
  if (!c) return CM_ERR_INVAL;
  int rc = usable(c);
  if (rc) return rc;
  if (n && !buf) return comm_fail(c, CM_ERR_INVAL, "all-reduce of %zu floats from NULL", n);
  if (c->world == 1) return 0;
  if (n > SIZE_MAX / sizeof(float))
    return comm_fail(c, CM_ERR_TOOBIG, "all-reduce of %zu floats", n);
  size_t per = c->slot_bytes / sizeof(float), off = 0;
  uint64_t total = (uint64_t)n * sizeof(float);
  do {
    size_t m = n - off < per ? n - off : per;
    uint32_t b = (c->seq + 1) & 1;
    if (m) memcpy(slot(c, b, c->rank), buf + off, m * sizeof(float));
    if ((rc = step(c, OP_ALLREDUCE_F32, (uint64_t)m * sizeof(float), total))) return rc;
    if (!m) break; /* n == 0: a synchronisation only (buf may be NULL) */
    for (int p = 0; p < c->world; p++)
      c->src[p] = p == c->rank ? buf + off : (const float *)slot(c, b, p);
    kn_shm_sum_f32(buf + off, c->src, c->world, m, c->avx2);
    off += m;
  } while (off < n);
  return 0;
}

int kn_shm_allgather(struct kn_shm_comm *c, const void *mine, size_t bytes, void *all) {
  if (!c) return CM_ERR_INVAL;
  int rc = usable(c);
  if (rc) return rc;
  if (bytes && (!mine || !all))
    return comm_fail(c, CM_ERR_INVAL, "all-gather of %zu bytes with a NULL buffer", bytes);
  if (bytes > SIZE_MAX / (size_t)c->world)
    return comm_fail(c, CM_ERR_TOOBIG, "all-gather of %d x %zu bytes", c->world, bytes);
  const uint8_t *in = mine;
  uint8_t *out = all;
  if (c->world == 1) {
    if (bytes && in != out) memmove(out, in, bytes);
    return 0;
  }
  size_t off = 0;
  do {
    size_t m = bytes - off < c->slot_bytes ? bytes - off : c->slot_bytes;
    uint32_t b = (c->seq + 1) & 1;
    if (m) memcpy(slot(c, b, c->rank), in + off, m);
    if ((rc = step(c, OP_ALLGATHER, m, bytes))) return rc;
    if (!m) break; /* bytes == 0: a synchronisation only */
    for (int p = 0; p < c->world; p++) {
      uint8_t *dst = out + (size_t)p * bytes + off;
      const uint8_t *src = p == c->rank ? in + off : slot(c, b, p);
      if (dst != src) memmove(dst, src, m);
    }
    off += m;
  } while (off < bytes);
  return 0;
}

int kn_shm_barrier(struct kn_shm_comm *c) {
  if (!c) return CM_ERR_INVAL;
  int rc = usable(c);
  if (rc) return rc;
  if (c->world == 1) return 0;
  return step(c, OP_BARRIER, 0, 0);
}

/* ---- joining ------------------------------------------------------------ */

static size_t shm_total(int world, size_t slot_bytes) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t t = sizeof(struct shm_hdr) + (size_t)world * sizeof(struct shm_ctl) +
             2 * (size_t)world * slot_bytes;
  return (t + page - 1) / page * page;
}

static void comm_map(struct kn_shm_comm *c, void *map, size_t bytes) {
  c->map = map;
  c->map_bytes = bytes;
  c->hdr = map;
  c->ctl = (struct shm_ctl *)((uint8_t *)map + sizeof(struct shm_hdr));
  c->data = (uint8_t *)c->ctl + (size_t)c->world * sizeof(struct shm_ctl);
}

/* Rank 0: creates, sizes and maps the segment, then publishes the header. */
static int shm_make(struct kn_shm_comm *c, char *err, size_t errlen) {
  size_t total = shm_total(c->world, c->slot_bytes);
  int fd = shm_open(c->name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    if (errno == EEXIST)
      return cm_fail(err, errlen, CM_ERR_STATE,
                     "shm %s exists already (a previous group's? kn_shm_unlink it first)", c->name);
    return cm_fail(err, errlen, CM_ERR_IO, "shm_open %s: %s", c->name, strerror(errno));
  }
  c->linked = 1;
  if (ftruncate(fd, (off_t)total) != 0) {
    int e = errno;
    close(fd);
    return cm_fail(err, errlen, CM_ERR_IO, "sizing shm %s to %zu bytes: %s", c->name, total,
                   strerror(e));
  }
  void *map = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (map == MAP_FAILED)
    return cm_fail(err, errlen, CM_ERR_IO, "mapping shm %s (%zu bytes): %s", c->name, total,
                   strerror(e));
  comm_map(c, map, total); /* ftruncate zero-filled it: every counter starts at 0 */
  struct shm_hdr *h = c->hdr;
  h->version = SHM_VERSION;
  h->world = (uint32_t)c->world;
  h->slot_bytes = c->slot_bytes;
  h->total_bytes = total;
  c->ctl[0].pidns = pidns_self();
  atomic_store_explicit(&c->ctl[0].pid, (int32_t)getpid(), memory_order_relaxed);
  atomic_store_explicit(&h->joined, 1, memory_order_relaxed);
  atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
  return 0;
}

/* Ranks > 0: opens and maps the segment once rank 0 has published it, checks
 * that it is the group this rank expects, claims the rank. */
static int shm_join(struct kn_shm_comm *c, uint64_t deadline, char *err, size_t errlen) {
  size_t total = shm_total(c->world, c->slot_bytes);
  for (;;) {
    int fd = shm_open(c->name, O_RDWR, 0);
    if (fd < 0 && errno != ENOENT)
      return cm_fail(err, errlen, CM_ERR_IO, "shm_open %s: %s", c->name, strerror(errno));
    if (fd >= 0) {
      struct stat st;
      if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return cm_fail(err, errlen, CM_ERR_IO, "fstat shm %s: %s", c->name, strerror(e));
      }
      void *map = MAP_FAILED;
      /* rank 0 sizes the segment before it sets magic: until then, look again */
      if ((size_t)st.st_size >= sizeof(struct shm_hdr))
        map = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
      if (map != MAP_FAILED) {
        struct shm_hdr *h = map;
        if (atomic_load_explicit(&h->magic, memory_order_acquire) == SHM_MAGIC) {
          if (h->version != SHM_VERSION || h->world != (uint32_t)c->world ||
              h->slot_bytes != c->slot_bytes || h->total_bytes != total ||
              (size_t)st.st_size != total) {
            int rc = cm_fail(err, errlen, CM_ERR_STATE,
                             "shm %s is version %u for %u ranks of %llu-byte slots; rank %d "
                             "expects version %u, %d ranks, %zu-byte slots",
                             c->name, h->version, h->world, (unsigned long long)h->slot_bytes,
                             c->rank, SHM_VERSION, c->world, c->slot_bytes);
            munmap(map, (size_t)st.st_size);
            return rc;
          }
          comm_map(c, map, total);
          break;
        }
        munmap(map, (size_t)st.st_size);
      }
    }
    if (cm_time_ns() >= deadline)
      return cm_fail(err, errlen, CM_ERR_TIMEOUT, "shm %s did not appear within %d ms", c->name,
                     c->timeout_ms);
    cm_time_sleep_ns(SHM_JOIN_POLL * 1000ull);
  }
  struct shm_ctl *me = &c->ctl[c->rank];
  int32_t none = 0;
  me->pidns = pidns_self(); /* published by the pid CAS (release) below */
  if (!atomic_compare_exchange_strong_explicit(&me->pid, &none, (int32_t)getpid(),
                                               memory_order_acq_rel, memory_order_acquire))
    return cm_fail(err, errlen, CM_ERR_STATE, "shm %s: rank %d joined already (pid %d)", c->name,
                   c->rank, (int)none);
  atomic_fetch_add_explicit(&c->hdr->joined, 1, memory_order_acq_rel);
  return 0;
}

/* Every rank: waits until all have joined, watching those that did. */
static int shm_wait_all(struct kn_shm_comm *c, uint64_t deadline, char *err, size_t errlen) {
  for (;;) {
    if (atomic_load_explicit(&c->hdr->joined, memory_order_acquire) >= (uint32_t)c->world) return 0;
    uint32_t ab = atomic_load_explicit(&c->hdr->aborted, memory_order_relaxed);
    if (ab) {
      comm_closed(c, ab);
      return cm_fail(err, errlen, CM_ERR_CLOSED, "%s", c->errmsg);
    }
    for (int p = 0; p < c->world; p++) {
      pid_t pid = atomic_load_explicit(&c->ctl[p].pid, memory_order_acquire);
      if (p != c->rank && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
        comm_fail(c, CM_ERR_CLOSED, "rank %d (pid %d) exited while the group was forming", p,
                  (int)pid);
        return cm_fail(err, errlen, CM_ERR_CLOSED, "%s", c->errmsg);
      }
    }
    if (cm_time_ns() >= deadline) {
      comm_fail(c, CM_ERR_TIMEOUT, "only %u of %d ranks joined within %d ms",
                atomic_load(&c->hdr->joined), c->world, c->timeout_ms);
      return cm_fail(err, errlen, CM_ERR_TIMEOUT, "%s", c->errmsg);
    }
    cm_time_sleep_ns(SHM_JOIN_POLL * 1000ull);
  }
}

int kn_shm_comm_create(const char *name, int rank, int world, size_t max_bytes, int timeout_ms,
                       struct kn_shm_comm **out, char *err, size_t errlen) {
  if (!out) return cm_fail(err, errlen, CM_ERR_INVAL, "shm: no output handle");
  *out = NULL;
  if (world < 1)
    return cm_fail(err, errlen, CM_ERR_INVAL, "shm: world size %d (at least 1)", world);
  if (world > KN_SHM_MAX_WORLD)
    return cm_fail(err, errlen, CM_ERR_TOOBIG, "shm: world size %d (at most %d)", world,
                   KN_SHM_MAX_WORLD);
  if (rank < 0 || rank >= world)
    return cm_fail(err, errlen, CM_ERR_INVAL, "shm: rank %d outside [0, %d)", rank, world);
  if (max_bytes == 0) return cm_fail(err, errlen, CM_ERR_INVAL, "shm: max_bytes is 0");
  if (max_bytes > KN_SHM_MAX_SLOT)
    return cm_fail(err, errlen, CM_ERR_TOOBIG, "shm: max_bytes %zu (at most %u per rank)",
                   max_bytes, KN_SHM_MAX_SLOT);
  struct kn_shm_comm *c = calloc(1, sizeof(*c));
  if (!c) return cm_fail(err, errlen, CM_ERR_NOMEM, "shm: no memory for the handle");
  int rc = shm_name(name, c->name, err, errlen);
  if (rc) {
    free(c);
    return rc;
  }
  c->rank = rank;
  c->world = world;
  c->timeout_ms = timeout_ms > 0 ? timeout_ms : KN_SHM_DEFAULT_TIMEOUT;
  c->slot_bytes = (max_bytes + SHM_LINE - 1) / SHM_LINE * SHM_LINE;
  c->avx2 = kn_shm_cpu_avx2();
  /* more ranks than CPUs to run on: a spinning rank may be keeping the one it
   * waits for off its CPU, so it soon sleeps instead */
  cpu_set_t cpus;
  int ncpu = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 0;
  c->spin = ncpu > 0 && world > ncpu ? SHM_SPIN_OVER : SHM_SPIN;
  for (int p = 0; p < KN_SHM_MAX_WORLD; p++)
    c->pidfd[p] = -1;
  if (world == 1) {
    *out = c;
    return 0;
  }
  uint64_t deadline = cm_time_ns() + (uint64_t)c->timeout_ms * 1000000ull;
  rc = rank == 0 ? shm_make(c, err, errlen) : shm_join(c, deadline, err, errlen);
  if (!rc) rc = shm_wait_all(c, deadline, err, errlen);
  if (rc) {
    kn_shm_comm_destroy(c);
    return rc;
  }
  /* every rank has it mapped: the name is no longer needed */
  if (rank == 0 && shm_unlink(c->name) == 0) c->linked = 0;
  peers_watch(c);
  cm_debug("kn", "shm %s rank %d/%d joined: %zu-byte slots, %s sum", c->name, rank, world,
           c->slot_bytes, c->avx2 ? "avx2" : "c");
  *out = c;
  return 0;
}

void kn_shm_comm_destroy(struct kn_shm_comm *c) {
  if (!c) return;
  for (int p = 0; p < KN_SHM_MAX_WORLD; p++)
    if (c->pidfd[p] >= 0) close(c->pidfd[p]);
  if (c->map) munmap(c->map, c->map_bytes);
  if (c->rank == 0 && c->linked) shm_unlink(c->name);
  free(c);
}

int kn_shm_unlink(const char *name) {
  char full[KN_SHM_NAME_MAX + 2];
  int rc = shm_name(name, full, NULL, 0);
  if (rc) return rc;
  if (shm_unlink(full) == 0) return 0;
  return errno == ENOENT ? CM_ERR_NOENT : CM_ERR_IO;
}

void kn_shm_comm_set_timeout(struct kn_shm_comm *c, int timeout_ms) {
  c->timeout_ms = timeout_ms > 0 ? timeout_ms : KN_SHM_DEFAULT_TIMEOUT;
}

int kn_shm_comm_rank(const struct kn_shm_comm *c) {
  return c->rank;
}
int kn_shm_comm_world(const struct kn_shm_comm *c) {
  return c->world;
}
size_t kn_shm_comm_slot_bytes(const struct kn_shm_comm *c) {
  return c->slot_bytes;
}
const char *kn_shm_comm_error(const struct kn_shm_comm *c) {
  return c->errmsg;
}
const char *kn_shm_comm_isa(const struct kn_shm_comm *c) {
  return c->avx2 ? "avx2" : "c";
}
