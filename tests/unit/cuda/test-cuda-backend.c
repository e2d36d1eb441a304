/* test-cuda-backend.c — the CUDA backend's handle and memory: cuBLAS loaded
 * on first use, device discovery and creation errors (these run everywhere,
 * GPU or not), then —
 * on a machine with a device — the memory hooks and the pinned staging ring
 * (wrap-around, growth past a segment, many ops in flight). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cuda/kn-cuda-impl.h"
#include "kernels/cuda/kn-cuda.h"
#include "tests/harness/th.h"

static char g_skip_why[128];

/* Skips the test loudly when no device is visible. */
static void need_device(void) {
  int n = kn_cuda_device_count();
  if (n > 0) return;
  snprintf(g_skip_why, sizeof(g_skip_why), "no CUDA device visible: %d devices", n);
  TH_SKIP(g_skip_why);
}

/* Whether a library whose path contains name is mapped into this process. */
static int mapped(const char *name) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[1024];
  int found = 0;
  while (!found && fgets(line, sizeof(line), f))
    found = strstr(line, name) != NULL;
  fclose(f);
  return found;
}

/* First in this file: nothing before it has called into cuBLAS. */
TH_TEST(cuda_blas_loads_on_first_use) {
  TH_CHECK_EQ_INT(mapped("libcublasLt.so"), 0); /* not linked: not loaded at start */
  TH_CHECK_EQ_INT(mapped("libcublas.so"), 0);
  const char *why = kn_cuda_blas_error(); /* loads both, resolves every function */
  if (why) printf("  %s\n", why);
  TH_CHECK(why == NULL);
  TH_CHECK_EQ_INT(mapped("libcublasLt.so"), 1);
  /* a forwarded call reaches the library's own function */
  TH_CHECK_EQ_STR(cublasGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED),
                  "the requested functionality is not supported");
}

TH_TEST(cuda_device_count_never_negative) {
  int n = kn_cuda_device_count();
  TH_CHECK(n >= 0);
  printf("  CUDA devices visible: %d\n", n);
}

TH_TEST(cuda_create_rejects_bad_device) {
  int n = kn_cuda_device_count();
  struct kn_backend *be = (struct kn_backend *)1;
  TH_CHECK_EQ_INT(kn_cuda_backend_create(-1, &be), CM_ERR_INVAL);
  TH_CHECK(be == NULL);
  be = (struct kn_backend *)1;
  TH_CHECK_EQ_INT(kn_cuda_backend_create(n, &be), CM_ERR_INVAL); /* one past the last */
  TH_CHECK(be == NULL);
  TH_CHECK_EQ_INT(kn_cuda_backend_create(n + 1000, &be), CM_ERR_INVAL);
}

TH_TEST(cuda_memory_hooks_roundtrip) {
  need_device();
  struct kn_backend *be = NULL;
  TH_REQUIRE(kn_cuda_backend_create(0, &be) == 0 && be != NULL);
  TH_CHECK_EQ_STR(kn_backend_name(be), "cuda");
  enum { N = 1 << 20 };
  unsigned char *h = malloc(N), *back = malloc(N);
  TH_REQUIRE(h && back);
  for (int i = 0; i < N; i++)
    h[i] = (unsigned char)(i * 131 + 7);
  unsigned char *a = kn_alloc(be, N), *b = kn_alloc(be, N);
  TH_REQUIRE(a && b);
  TH_CHECK(((uintptr_t)a & 63) == 0);
  TH_CHECK_EQ_INT(kn_upload(be, a, h, N), 0);
  TH_CHECK_EQ_INT(kn_copy(be, b, a, N), 0);
  TH_CHECK_EQ_INT(kn_memset(be, b + 100, 0xab, 1000), 0);
  TH_CHECK_EQ_INT(kn_download(be, back, b, N), 0);
  int bad = 0;
  for (int i = 0; i < N; i++) {
    unsigned char want = i >= 100 && i < 1100 ? 0xab : h[i];
    bad += back[i] != want;
  }
  TH_CHECK_EQ_INT(bad, 0);
  TH_CHECK_EQ_INT(kn_sync(be), 0);
  TH_CHECK(kn_alloc(be, 0) == NULL);
  kn_free(be, a);
  kn_free(be, b);
  kn_free(be, NULL);
  free(h);
  free(back);
  kn_backend_destroy(be);
}

/* Thousands of small staged ops (wrapping the ring many times) and a few
 * huge ones (growing it), all queued without a sync in between: each
 * embedding must still see its own ids. */
TH_TEST(cuda_staging_ring_wraps_and_grows) {
  need_device();
  struct kn_backend *be = NULL;
  TH_REQUIRE(kn_cuda_backend_create(0, &be) == 0 && be != NULL);
  enum { V = 1000, H = 4, OPS = 3000, ROW = 4096, BIG = 600000 };
  float table[V * H];
  for (int i = 0; i < V * H; i++)
    table[i] = (float)i;
  float *tab_d = kn_alloc(be, sizeof(table));
  float *out_d = kn_alloc(be, (size_t)OPS * ROW * sizeof(float));
  float *big_d = kn_alloc(be, (size_t)BIG * H * sizeof(float));
  int32_t *ids = malloc((size_t)BIG * sizeof(int32_t));
  float *back = malloc((size_t)BIG * H * sizeof(float));
  TH_REQUIRE(tab_d && out_d && big_d && ids && back);
  TH_CHECK_EQ_INT(kn_upload(be, tab_d, table, sizeof(table)), 0);
  static int32_t small[ROW];
  for (int op = 0; op < OPS; op++) {
    int n = 1 + (op % 64) * 64; /* up to 16 KiB of ids: ~24 MiB staged in all */
    for (int t = 0; t < n; t++)
      small[t] = (op * 7 + t) % V;
    /* H = 1 views the table as [V * 4, 1]; ldo = 1 puts token t at element t of row op */
    TH_REQUIRE(
        kn_embed(be, out_d + (size_t)op * ROW, 1, tab_d, KN_DTYPE_F32, V, 1, small, n, 1.0f) == 0);
    if (op % 1000 == 999) {
      for (int t = 0; t < BIG; t++)
        ids[t] = (t * 13 + op) % V;
      TH_REQUIRE(kn_embed(be, big_d, H, tab_d, KN_DTYPE_F32, V, H, ids, BIG, 2.0f) == 0);
      TH_REQUIRE(kn_download(be, back, big_d, (size_t)BIG * H * sizeof(float)) == 0);
      int bad = 0;
      for (int t = 0; t < BIG; t++)
        for (int j = 0; j < H; j++)
          bad += back[(size_t)t * H + j] != 2.0f * table[ids[t] * H + j];
      TH_CHECK_EQ_INT(bad, 0);
    }
  }
  float *rows = malloc((size_t)OPS * ROW * sizeof(float));
  TH_REQUIRE(rows);
  TH_CHECK_EQ_INT(kn_download(be, rows, out_d, (size_t)OPS * ROW * sizeof(float)), 0);
  int bad = 0;
  for (int op = 0; op < OPS; op++) {
    int n = 1 + (op % 64) * 64;
    for (int t = 0; t < n; t++)
      bad += rows[(size_t)op * ROW + t] != table[(op * 7 + t) % V];
  }
  TH_CHECK_EQ_INT(bad, 0);
  free(rows);
  free(ids);
  free(back);
  kn_free(be, tab_d);
  kn_free(be, out_d);
  kn_free(be, big_d);
  kn_backend_destroy(be);
}

TH_TEST(cuda_rejects_bad_arguments_without_aborting) {
  need_device();
  struct kn_backend *be = NULL;
  TH_REQUIRE(kn_cuda_backend_create(0, &be) == 0 && be != NULL);
  float *buf = kn_alloc(be, 4096);
  TH_REQUIRE(buf);
  int32_t ids[2] = {0, 5};
  TH_CHECK_EQ_INT(kn_embed(be, buf, 4, buf, KN_DTYPE_F32, 5, 4, ids, 2, 1.0f), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(kn_embed(be, buf, 4, buf, (enum kn_dtype)99, 5, 4, ids, 1, 1.0f),
                  CM_ERR_UNSUPPORTED);
  TH_CHECK_EQ_INT(kn_matmul(be, buf, 2, buf, 4, buf, KN_DTYPE_F32, 2, 4, 4, 0), CM_ERR_INVAL);
  int32_t rows[1] = {9};
  TH_CHECK_EQ_INT(kn_matmul_rows(be, buf, 1, buf, 4, buf, KN_DTYPE_F32, 8, 4, rows, 1, 1),
                  CM_ERR_RANGE);
  float wts[8];
  TH_CHECK_EQ_INT(kn_router_topk(be, ids, wts, buf, 4, 1, 4, 5, NULL), CM_ERR_INVAL);
  /* the stream is still usable afterwards */
  TH_CHECK_EQ_INT(kn_memset(be, buf, 0, 4096), 0);
  TH_CHECK_EQ_INT(kn_sync(be), 0);
  kn_free(be, buf);
  kn_backend_destroy(be);
}
