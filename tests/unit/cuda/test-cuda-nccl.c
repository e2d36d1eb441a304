/* test-cuda-nccl.c — the CUDA backend's collectives over NCCL: a group of one on
 * device 0 (all-reduce leaves the data as it is, all-gather copies), and, where two
 * devices are visible, a group of two ranks (two processes, one device each) whose
 * all-reduce sums and all-gather concatenates in rank order; a peer that dies makes
 * the survivor's next collective fail within a few seconds instead of hanging.
 * Skips loudly where no GPU is visible or the build has no NCCL. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "kernels/cuda/kn-cuda.h"
#include "kernels/kn-backend.h"
#include "lmserve-config.h"
#include "tests/harness/th.h"

static void need_devices(int n) {
  static char why[128];
  if (!LMSERVE_HAVE_NCCL) TH_SKIP("this build has no NCCL");
  int have = kn_cuda_device_count();
  if (have >= n) return;
  snprintf(why, sizeof why, "needs %d CUDA device(s), %d visible", n, have);
  TH_SKIP(why);
}

#define N 1000

TH_TEST(nccl_group_of_one) {
  need_devices(1);
  struct kn_backend *be = NULL;
  TH_REQUIRE(kn_cuda_backend_create(0, &be) == 0);
  TH_CHECK(kn_backend_has(be, KN_CAP_ALLREDUCE));
  struct kn_comm_id id;
  TH_REQUIRE(kn_comm_id_new(be, &id) == 0);
  TH_REQUIRE(kn_comm_join(be, &id, 0, 1, 10000) == 0);
  float host[N], back[N];
  for (int i = 0; i < N; i++)
    host[i] = (float)i * 0.5f - 7.0f;
  float *d = kn_alloc(be, sizeof host), *all = kn_alloc(be, sizeof host);
  TH_REQUIRE(d && all);
  TH_REQUIRE(kn_upload(be, d, host, sizeof host) == 0);
  TH_CHECK(kn_all_reduce_sum(be, d, N) == 0);
  TH_CHECK(kn_all_gather(be, d, sizeof host, all) == 0);
  TH_REQUIRE(kn_download(be, back, all, sizeof back) == 0);
  TH_CHECK(!memcmp(host, back, sizeof host));
  kn_free(be, d);
  kn_free(be, all);
  kn_backend_destroy(be);
}

/* Rank r of 2 on device r: all-reduce and all-gather, checked; rank 1 then exits
 * (die = 1) or stays. Exit status 0 when everything held. */
static int rank_main(const struct kn_comm_id *id, int rank, int die) {
  struct kn_backend *be = NULL;
  if (kn_cuda_backend_create(rank, &be) || kn_comm_join(be, id, rank, 2, 30000)) return 1;
  float host[N], back[2 * N];
  for (int i = 0; i < N; i++)
    host[i] = (float)(rank + 1) * (float)i;
  float *d = kn_alloc(be, sizeof host), *all = kn_alloc(be, 2 * sizeof host);
  if (!d || !all || kn_upload(be, d, host, sizeof host)) return 1;
  if (kn_all_gather(be, d, sizeof host, all) || kn_download(be, back, all, sizeof back)) return 1;
  for (int i = 0; i < N; i++)
    if (back[i] != (float)i || back[N + i] != 2.0f * (float)i) return 1;
  if (kn_all_reduce_sum(be, d, N) || kn_download(be, host, d, sizeof host)) return 1;
  for (int i = 0; i < N; i++)
    if (host[i] != 3.0f * (float)i) return 1;
  if (die) {
    if (rank == 1) _exit(0); /* gone without a word */
    sleep(1);
    int rc = kn_all_reduce_sum(be, d, N); /* the peer never comes */
    return rc == CM_ERR_TIMEOUT || rc == CM_ERR_CLOSED ? 0 : 1;
  }
  kn_backend_destroy(be);
  return 0;
}

static void run_pair(int die) {
  need_devices(2);
  struct kn_backend *be = NULL;
  TH_REQUIRE(kn_cuda_backend_create(0, &be) == 0);
  struct kn_comm_id id;
  TH_REQUIRE(kn_comm_id_new(be, &id) == 0);
  kn_backend_destroy(be);
  pid_t pids[2];
  for (int r = 0; r < 2; r++) {
    pids[r] = fork();
    TH_REQUIRE(pids[r] >= 0);
    if (pids[r] == 0) _exit(rank_main(&id, r, die));
  }
  for (int r = 0; r < 2; r++) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    TH_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
}

TH_TEST(nccl_two_ranks_sum_and_gather) {
  run_pair(0);
}

TH_TEST(nccl_dead_peer_fails_the_survivor) {
  run_pair(1);
}
