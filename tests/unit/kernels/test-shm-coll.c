/* test-shm-coll.c — the shared-memory collectives (kernels/cpu/kn-cpu-shm.h) between
 * real processes: groups of 2 and 4 forked ranks run thousands of all-reduces of
 * decode, prefill and chunked sizes with rank-dependent data, interleaved with
 * all-gathers and barriers, and every rank must get exactly the rank-order sum
 * (the same bits everywhere); world size 1; a rank killed with SIGKILL or stopped
 * with SIGSTOP mid-stream, and ranks that disagree on a size, fail the others
 * quickly; bad arguments give error codes; no segment is left behind.
 *
 * Each rank reports through a pipe: one byte when it is ready (joined and
 * running), then a struct rank_result. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "common/cm-time.h"
#include "kernels/cpu/kn-cpu-shm.h"
#include "tests/harness/th.h"

#define MAX_RANKS 8

/* ---- rank-dependent data and its rank-order sum ------------------------- */

static uint32_t mix(uint32_t h) {
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return h;
}

/* Values of widely different magnitudes and both signs, so that a sum in any
 * other order than rank order gives other bits. */
static float val(int rank, uint32_t call, size_t i) {
  static float pow2[32]; /* 2^-16 .. 2^15 */
  if (pow2[0] == 0)
    for (int e = 0; e < 32; e++)
      pow2[e] = ldexpf(1.0f, e - 16);
  uint32_t h = mix((uint32_t)rank * 0x9e3779b1u ^ mix(call * 0x85ebca77u ^ (uint32_t)i));
  float m = (float)((int32_t)(h & 0xfffff) - 0x80000) * (1.0f / 524288.0f);
  return m * pow2[h >> 27]; /* exact: a power of two */
}

static float expect(int world, uint32_t call, size_t i) {
  float a = val(0, call, i);
  for (int r = 1; r < world; r++)
    a += val(r, call, i);
  return a;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

/* ---- groups of forked ranks --------------------------------------------- */

struct rank_result {
  int rc;          /* the first failing call's code, or 0 */
  int bad;         /* wrong results seen */
  long calls;      /* collectives that succeeded */
  uint64_t hash;   /* of every all-reduce result */
  uint64_t t_fail; /* cm_time_ns() when a call failed */
  int after;       /* the code of a call made after the failure */
};

struct args {
  char name[64];
  int world;
  int timeout_ms;
  size_t max_bytes;
  long iters;
};

typedef void (*rank_fn)(const struct args *a, int rank, int fd, struct rank_result *res);

struct group {
  int world;
  pid_t pid[MAX_RANKS];
  int fd[MAX_RANKS];
  int ready[MAX_RANKS]; /* its ready byte was read */
};

static int g_serial;

static void unique_name(char *out, size_t n, const char *what) {
  snprintf(out, n, "/lmserve-test-shm-%d-%s-%d", (int)getpid(), what, g_serial++);
}

static void ready(int fd) {
  char r = 'R';
  if (write(fd, &r, 1) != 1) _exit(3);
}

static void group_start(struct group *g, const struct args *a, rank_fn fn) {
  g->world = a->world;
  for (int r = 0; r < a->world; r++) {
    int p[2];
    TH_REQUIRE(pipe(p) == 0);
    pid_t pid = fork();
    TH_REQUIRE(pid >= 0);
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(p[0]);
      for (int k = 0; k < r; k++)
        close(g->fd[k]);
      struct rank_result res = {0};
      fn(a, r, p[1], &res);
      ssize_t w = write(p[1], &res, sizeof(res));
      _exit(w == (ssize_t)sizeof(res) ? 0 : 3);
    }
    close(p[1]);
    g->pid[r] = pid;
    g->fd[r] = p[0];
    g->ready[r] = 0;
  }
}

static int read_full(int fd, void *buf, size_t n, int timeout_ms) {
  uint64_t end = cm_time_ns() + (uint64_t)timeout_ms * 1000000ull;
  size_t got = 0;
  while (got < n) {
    uint64_t now = cm_time_ns();
    if (now >= end) return -1;
    struct pollfd q = {.fd = fd, .events = POLLIN};
    if (poll(&q, 1, (int)((end - now) / 1000000ull) + 1) <= 0) continue;
    ssize_t k = read(fd, (char *)buf + got, n - got);
    if (k <= 0) return -1;
    got += (size_t)k;
  }
  return 0;
}

static int group_ready(struct group *g, int r, int timeout_ms) {
  char c = 0;
  g->ready[r] = read_full(g->fd[r], &c, 1, timeout_ms) == 0 && c == 'R';
  return g->ready[r] ? 0 : -1;
}

/* Reads rank r's ready byte and result and reaps it: 0, or -1 (it is killed). */
static int group_result(struct group *g, int r, struct rank_result *res, int timeout_ms) {
  int ok = (g->ready[r] || group_ready(g, r, timeout_ms) == 0) &&
           read_full(g->fd[r], res, sizeof(*res), timeout_ms) == 0;
  if (!ok) kill(g->pid[r], SIGKILL);
  int st = 0;
  waitpid(g->pid[r], &st, 0);
  close(g->fd[r]);
  g->pid[r] = 0;
  return ok && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static void group_reap(struct group *g, int r) {
  waitpid(g->pid[r], NULL, 0);
  close(g->fd[r]);
  g->pid[r] = 0;
}

static int segment_exists(const char *name) {
  int fd = shm_open(name, O_RDONLY, 0);
  if (fd >= 0) close(fd);
  return fd >= 0;
}

/* ---- the all-reduce stream ---------------------------------------------- */

/* Call k's size in floats: mostly decode and prefill rows, every 50th a size
 * that needs several steps (per = floats per slot). */
static size_t stream_n(long k, size_t per) {
  static const size_t small[] = {1, 15, 640, 1152, 2560, 0, 2560 * 4, 7};
  if (k % 50 == 49) {
    const size_t big[] = {2560 * 64, per + 1, 3 * per - 5, per, 2 * per};
    return big[(k / 50) % 5];
  }
  return small[k % 8];
}

/* Rank `rank` of a's group joins it (waiting up to join_ms for the others):
 * the communicator, or NULL with the error in res->rc, said on stderr. */
static struct kn_shm_comm *rank_join(const struct args *a, int rank, int join_ms,
                                     struct rank_result *res) {
  struct kn_shm_comm *c = NULL;
  char err[256] = "";
  res->rc =
      kn_shm_comm_create(a->name, rank, a->world, a->max_bytes, join_ms, &c, err, sizeof(err));
  if (res->rc) fprintf(stderr, "rank %d: %s\n", rank, err);
  return res->rc ? NULL : c;
}

static void rank_stream(const struct args *a, int rank, int fd, struct rank_result *res) {
  struct kn_shm_comm *c = rank_join(a, rank, a->timeout_ms, res);
  ready(fd);
  if (!c) return;
  size_t per = kn_shm_comm_slot_bytes(c) / sizeof(float);
  size_t cap = 2560 * 64 > 3 * per ? 2560 * 64 : 3 * per;
  float *buf = malloc(cap * sizeof(float));
  uint8_t *all = malloc((size_t)a->world * (3 * per * sizeof(float) + 64));
  uint64_t h = 0xcbf29ce484222325ull;
  for (long k = 0; k < a->iters && !res->rc; k++) {
    uint32_t call = (uint32_t)k;
    size_t n = stream_n(k, per);
    for (size_t i = 0; i < n; i++)
      buf[i] = val(rank, call, i);
    if ((res->rc = kn_shm_allreduce_sum_f32(c, buf, n))) break;
    res->calls++;
    for (size_t i = 0; i < n; i++) {
      float e = expect(a->world, call, i);
      if (memcmp(&e, &buf[i], sizeof(e))) {
        if (res->bad++ < 3)
          fprintf(stderr, "rank %d call %ld: [%zu] of %zu is %a, the rank-order sum %a\n", rank, k,
                  i, n, (double)buf[i], (double)e);
      }
    }
    h = fnv(h, buf, n * sizeof(float));
    if (k % 7 == 3) { /* (max, argmax) pairs of a vocab-parallel head, or larger blocks */
      size_t bytes = k % 70 == 3 ? per * sizeof(float) + 24 : 8 + (size_t)(k % 5);
      uint8_t *mine = all + (size_t)rank * bytes; /* in place */
      for (size_t i = 0; i < bytes; i++)
        mine[i] = (uint8_t)mix((uint32_t)(rank * 131 + k * 7 + (long)i));
      if ((res->rc = kn_shm_allgather(c, mine, bytes, all))) break;
      res->calls++;
      for (int r = 0; r < a->world; r++)
        for (size_t i = 0; i < bytes; i++)
          if (all[(size_t)r * bytes + i] != (uint8_t)mix((uint32_t)(r * 131 + k * 7 + (long)i))) {
            if (res->bad++ < 3)
              fprintf(stderr, "rank %d call %ld: all-gather byte %zu of rank %d\n", rank, k, i, r);
            break;
          }
    }
    if (k % 13 == 5) {
      if ((res->rc = kn_shm_barrier(c))) break;
      res->calls++;
    }
  }
  if (res->rc) fprintf(stderr, "rank %d: %s\n", rank, kn_shm_comm_error(c));
  res->hash = h;
  free(buf);
  free(all);
  kn_shm_comm_destroy(c);
}

static void stream_group(int world, long iters) {
  struct args a = {.world = world, .timeout_ms = 20000, .max_bytes = 64 * 1024, .iters = iters};
  unique_name(a.name, sizeof(a.name), "stream");
  struct group g;
  uint64_t t0 = cm_time_ns();
  group_start(&g, &a, rank_stream);
  struct rank_result res[MAX_RANKS];
  for (int r = 0; r < world; r++)
    TH_CHECK(group_result(&g, r, &res[r], 60000) == 0);
  for (int r = 0; r < world; r++) {
    TH_CHECK_EQ_INT(res[r].rc, 0);
    TH_CHECK_EQ_INT(res[r].bad, 0);
    TH_CHECK_EQ_INT(res[r].calls, res[0].calls);
    TH_CHECK(res[r].hash == res[0].hash);
  }
  TH_CHECK(res[0].calls > iters);
  TH_CHECK(!segment_exists(a.name));
  printf("  %d ranks: %ld collectives each in %.2f s\n", world, res[0].calls,
         (double)(cm_time_ns() - t0) * 1e-9);
}

TH_TEST(allreduce_2_ranks) {
  stream_group(2, 4000);
}
TH_TEST(allreduce_4_ranks) {
  stream_group(4, 2000);
}

/* ---- the sum itself ----------------------------------------------------- */

TH_TEST(sum_avx2_equals_reference) {
  if (!kn_shm_cpu_avx2()) TH_SKIP("no AVX2 on this processor (or LMSERVE_KERNELS=ref)");
  enum { N = 300 };
  static float in[8][N], a[N], b[N];
  const float *src[8];
  int bad = 0;
  uint32_t seed = 1;
  for (int nsrc = 1; nsrc <= 8; nsrc++)
    for (size_t n = 0; n <= N; n += (n < 80 ? 1 : 37)) {
      for (int k = 0; k < nsrc; k++) {
        for (int i = 0; i < N; i++) {
          seed = mix(seed + 1);
          in[k][i] = seed % 23 == 0   ? INFINITY
                     : seed % 29 == 0 ? -0.0f
                     : seed % 31 == 0 ? NAN
                                      : val(k, seed, (size_t)i);
        }
        src[k] = in[k];
      }
      kn_shm_sum_f32_ref(a, src, nsrc, n);
      kn_shm_sum_f32(b, src, nsrc, n, 1);
      for (size_t i = 0; i < n; i++)
        if (isnan(a[i]) ? !isnan(b[i]) : memcmp(&a[i], &b[i], sizeof(float)) != 0) bad++;
      /* in place: dst is one of the sources */
      memcpy(b, in[nsrc - 1], sizeof(b));
      src[nsrc - 1] = b;
      kn_shm_sum_f32(b, src, nsrc, n, 1);
      for (size_t i = 0; i < n; i++)
        if (isnan(a[i]) ? !isnan(b[i]) : memcmp(&a[i], &b[i], sizeof(float)) != 0) bad++;
    }
  TH_CHECK_EQ_INT(bad, 0);
}

/* ---- world size 1 ------------------------------------------------------- */

TH_TEST(world_of_one) {
  char name[64], err[256] = "";
  unique_name(name, sizeof(name), "one");
  struct kn_shm_comm *c = NULL;
  TH_REQUIRE(kn_shm_comm_create(name, 0, 1, 4096, 0, &c, err, sizeof(err)) == 0);
  TH_CHECK(!segment_exists(name)); /* nothing to share */
  TH_CHECK_EQ_INT(kn_shm_comm_world(c), 1);
  float buf[100], ref[100];
  for (int i = 0; i < 100; i++)
    buf[i] = ref[i] = val(0, 9, (size_t)i);
  TH_CHECK_EQ_INT(kn_shm_allreduce_sum_f32(c, buf, 100), 0);
  TH_CHECK(!memcmp(buf, ref, sizeof(buf)));
  TH_CHECK_EQ_INT(kn_shm_allreduce_sum_f32(c, buf, 0), 0);
  uint8_t mine[8] = {1, 2, 3, 4, 5, 6, 7, 8}, all[8] = {0};
  TH_CHECK_EQ_INT(kn_shm_allgather(c, mine, 8, all), 0);
  TH_CHECK(!memcmp(mine, all, 8));
  TH_CHECK_EQ_INT(kn_shm_allgather(c, all, 8, all), 0); /* in place */
  TH_CHECK_EQ_INT(kn_shm_barrier(c), 0);
  kn_shm_comm_destroy(c);
}

/* ---- bad arguments ------------------------------------------------------ */

static int create_rc(const char *name, int rank, int world, size_t max_bytes) {
  struct kn_shm_comm *c = (struct kn_shm_comm *)&c; /* must be set to NULL */
  char err[256] = "";
  int rc = kn_shm_comm_create(name, rank, world, max_bytes, 100, &c, err, sizeof(err));
  if (rc && (c != NULL || !err[0])) return 1; /* a failure leaves no handle, says why */
  if (!rc) kn_shm_comm_destroy(c);
  return rc;
}

TH_TEST(bad_arguments) {
  char name[64], err[256];
  unique_name(name, sizeof(name), "bad");
  char longname[KN_SHM_NAME_MAX + 2];
  memset(longname, 'x', sizeof(longname) - 1);
  longname[sizeof(longname) - 1] = 0;
  TH_CHECK_EQ_INT(create_rc(name, 2, 2, 1024), CM_ERR_INVAL); /* rank >= world */
  TH_CHECK_EQ_INT(create_rc(name, -1, 2, 1024), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(create_rc(name, 0, 0, 1024), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(create_rc(name, 0, KN_SHM_MAX_WORLD + 1, 1024), CM_ERR_TOOBIG);
  TH_CHECK_EQ_INT(create_rc(longname, 0, 2, 1024), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(create_rc(NULL, 0, 2, 1024), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(create_rc("", 0, 2, 1024), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(create_rc("/", 0, 2, 1024), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(create_rc("/a/b", 0, 2, 1024), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(create_rc(name, 0, 2, 0), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(create_rc(name, 0, 2, (size_t)KN_SHM_MAX_SLOT + 1), CM_ERR_TOOBIG);
  TH_CHECK_EQ_INT(kn_shm_comm_create(name, 0, 1, 64, 0, NULL, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_shm_unlink(longname), CM_ERR_INVAL);
  TH_CHECK(!segment_exists(name));
  float x = 1;
  TH_CHECK_EQ_INT(kn_shm_allreduce_sum_f32(NULL, &x, 1), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_shm_allgather(NULL, &x, 4, &x), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_shm_barrier(NULL), CM_ERR_INVAL);
  /* a NULL buffer fails the communicator; it stays failed */
  struct kn_shm_comm *c = NULL;
  TH_REQUIRE(kn_shm_comm_create(name, 0, 1, 64, 0, &c, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT(kn_shm_allreduce_sum_f32(c, NULL, 3), CM_ERR_INVAL);
  TH_CHECK(kn_shm_comm_error(c)[0] != 0);
  TH_CHECK_EQ_INT(kn_shm_allreduce_sum_f32(c, &x, 1), CM_ERR_CLOSED);
  TH_CHECK_EQ_INT(kn_shm_barrier(c), CM_ERR_CLOSED);
  kn_shm_comm_destroy(c);
}

/* A rank > 0 whose group never forms, and a rank 0 whose peers never come:
 * CM_ERR_TIMEOUT after about timeout_ms, and no segment left. A segment that
 * exists already is refused until kn_shm_unlink removes it. */
TH_TEST(join_timeout_and_stale_segment) {
  char name[64], err[256] = "";
  unique_name(name, sizeof(name), "join");
  struct kn_shm_comm *c = NULL;
  uint64_t t0 = cm_time_ns();
  TH_CHECK_EQ_INT(kn_shm_comm_create(name, 1, 2, 1024, 150, &c, err, sizeof(err)), CM_ERR_TIMEOUT);
  double ms = (double)(cm_time_ns() - t0) * 1e-6;
  TH_CHECK(ms >= 140 && ms < 1000);
  TH_CHECK(c == NULL);
  t0 = cm_time_ns();
  TH_CHECK_EQ_INT(kn_shm_comm_create(name, 0, 2, 1024, 150, &c, err, sizeof(err)), CM_ERR_TIMEOUT);
  ms = (double)(cm_time_ns() - t0) * 1e-6;
  TH_CHECK(ms >= 140 && ms < 1000);
  TH_CHECK(!segment_exists(name));
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  TH_REQUIRE(fd >= 0);
  close(fd);
  TH_CHECK_EQ_INT(kn_shm_comm_create(name, 0, 2, 1024, 150, &c, err, sizeof(err)), CM_ERR_STATE);
  TH_CHECK(strstr(err, "exists") != NULL);
  TH_CHECK_EQ_INT(kn_shm_unlink(name), 0);
  TH_CHECK_EQ_INT(kn_shm_unlink(name), CM_ERR_NOENT);
}

/* ---- failures between processes ----------------------------------------- */

/* All-reduces of 640 floats until one fails; ready after 200 of them. Then one
 * more call, which must fail too (the communicator stays failed). The group
 * forms with a generous timeout, the steps use the test's. */
static void rank_until_failure(const struct args *a, int rank, int fd, struct rank_result *res) {
  struct kn_shm_comm *c = rank_join(a, rank, 20000, res);
  if (!c) {
    ready(fd);
    return;
  }
  kn_shm_comm_set_timeout(c, a->timeout_ms);
  float buf[640];
  uint64_t end = cm_time_ns() + 20000000000ull; /* the test ends it well before */
  for (long k = 0; cm_time_ns() < end; k++) {
    for (int i = 0; i < 640; i++)
      buf[i] = val(rank, (uint32_t)k, (size_t)i);
    int rc = kn_shm_allreduce_sum_f32(c, buf, 640);
    if (rc) {
      res->rc = rc;
      res->t_fail = cm_time_ns();
      break;
    }
    res->calls++;
    if (k == 200) ready(fd);
  }
  if (res->calls <= 200) ready(fd);
  res->after = kn_shm_barrier(c);
  kn_shm_comm_destroy(c);
}

/* A group of a->world ranks in rank_until_failure, each past its 200th call,
 * then rank `victim` sent sig: returns when it was sent. */
static uint64_t group_signal_one(struct group *g, const struct args *a, int victim, int sig) {
  group_start(g, a, rank_until_failure);
  for (int r = 0; r < a->world; r++)
    TH_CHECK(group_ready(g, r, 20000) == 0);
  uint64_t t_sig = cm_time_ns();
  kill(g->pid[victim], sig);
  return t_sig;
}

/* Rank r's result once a peer was signalled at t_sig (`what` says how): its
 * all-reduce failed, closed or timed out, less than limit_ms after. */
static struct rank_result survivor_result(struct group *g, int r, uint64_t t_sig, double limit_ms,
                                          const char *what) {
  struct rank_result res = {0};
  TH_CHECK(group_result(g, r, &res, 10000) == 0);
  TH_CHECK(res.rc == CM_ERR_CLOSED || res.rc == CM_ERR_TIMEOUT);
  double ms = (double)(res.t_fail - t_sig) * 1e-6;
  printf("  rank %d failed %.1f ms after %s (%s)\n", r, ms, what, cm_strerror(res.rc));
  TH_CHECK(res.t_fail >= t_sig && ms < limit_ms);
  return res;
}

TH_TEST(peer_killed) {
  /* a timeout far longer than the bound: only the liveness check meets it */
  struct args a = {.world = 3, .timeout_ms = 5000, .max_bytes = 4096};
  unique_name(a.name, sizeof(a.name), "kill");
  struct group g;
  uint64_t t_kill = group_signal_one(&g, &a, 1, SIGKILL);
  group_reap(&g, 1); /* a zombie counts as dead as well: not needed, but tidy */
  for (int r = 0; r < 3; r += 2) {
    struct rank_result res = survivor_result(&g, r, t_kill, 1500, "its peer was killed");
    TH_CHECK(res.calls >= 200);
    TH_CHECK_EQ_INT(res.after, CM_ERR_CLOSED);
  }
  TH_CHECK(!segment_exists(a.name));
}

TH_TEST(peer_killed_before_reaped) {
  /* the same, the dead peer left a zombie while the others wait */
  struct args a = {.world = 2, .timeout_ms = 5000, .max_bytes = 4096};
  unique_name(a.name, sizeof(a.name), "zombie");
  struct group g;
  uint64_t t_kill = group_signal_one(&g, &a, 0, SIGKILL);
  survivor_result(&g, 1, t_kill, 1500, "rank 0 was killed");
  group_reap(&g, 0);
}

TH_TEST(peer_stopped) {
  struct args a = {.world = 3, .timeout_ms = 400, .max_bytes = 4096};
  unique_name(a.name, sizeof(a.name), "stop");
  struct group g;
  uint64_t t_stop = group_signal_one(&g, &a, 1, SIGSTOP);
  int timeouts = 0;
  for (int r = 0; r < 3; r += 2) {
    struct rank_result res = survivor_result(&g, r, t_stop, a.timeout_ms + 1000,
                                             "its peer was stopped (timeout 400 ms)");
    timeouts += res.rc == CM_ERR_TIMEOUT;
    TH_CHECK_EQ_INT(res.after, CM_ERR_CLOSED);
  }
  TH_CHECK(timeouts >= 1); /* the first to give up timed out; the other may have too */
  kill(g.pid[1], SIGCONT);
  struct rank_result res = {0};
  TH_CHECK(group_result(&g, 1, &res, 10000) == 0);
  TH_CHECK_EQ_INT(res.rc, CM_ERR_CLOSED); /* it sees the abort, not a timeout of its own */
  TH_CHECK_EQ_INT(res.after, CM_ERR_CLOSED);
  TH_CHECK(!segment_exists(a.name));
}

/* Rank 0 all-reduces 10 floats, rank 1 11: both fail with CM_ERR_SHAPE. Then
 * rank 1 asks for an all-gather too large to address, which fails it at once,
 * and rank 0's barrier of a new group fails within a fraction of its timeout. */
static void rank_mismatch(const struct args *a, int rank, int fd, struct rank_result *res) {
  struct kn_shm_comm *c = rank_join(a, rank, a->timeout_ms, res);
  ready(fd);
  if (!c) return;
  float buf[11] = {0};
  if (kn_shm_barrier(c) == 0) res->calls++;
  res->rc = kn_shm_allreduce_sum_f32(c, buf, rank ? 11 : 10);
  res->after = kn_shm_allreduce_sum_f32(c, buf, 10);
  kn_shm_comm_destroy(c);
  /* a second group under another name */
  char name2[80], err[256] = "";
  snprintf(name2, sizeof(name2), "%s-2", a->name);
  if (kn_shm_comm_create(name2, rank, a->world, a->max_bytes, a->timeout_ms, &c, err, sizeof(err)))
    return;
  if (rank == 1) {
    res->bad = kn_shm_allgather(c, buf, SIZE_MAX / 2 + 1, buf) != CM_ERR_TOOBIG;
  } else {
    uint64_t t0 = cm_time_ns();
    int rc = kn_shm_barrier(c);
    res->bad = rc != CM_ERR_CLOSED || cm_time_ns() - t0 > 1000000000ull;
  }
  kn_shm_comm_destroy(c);
}

TH_TEST(ranks_disagree) {
  struct args a = {.world = 2, .timeout_ms = 5000, .max_bytes = 1024};
  unique_name(a.name, sizeof(a.name), "shape");
  struct group g;
  group_start(&g, &a, rank_mismatch);
  for (int r = 0; r < 2; r++) {
    struct rank_result res = {0};
    TH_CHECK(group_result(&g, r, &res, 20000) == 0);
    TH_CHECK_EQ_INT(res.calls, 1);
    TH_CHECK_EQ_INT(res.rc, CM_ERR_SHAPE);
    TH_CHECK_EQ_INT(res.after, CM_ERR_CLOSED);
    TH_CHECK_EQ_INT(res.bad, 0);
  }
  TH_CHECK(!segment_exists(a.name));
}
