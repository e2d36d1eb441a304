/* bench-cuda-ops.c — throughput of the CUDA backend's heavy ops on the
 * device: paged decode attention (bandwidth of the K/V bytes it must read),
 * prefill attention and the dense GEMMs (TFLOP/s), the row-wise ops
 * (bandwidth). A meson benchmark (`meson test --benchmark cuda-ops-bench`);
 * exits 77 without a device. Inputs are random; results are not checked here
 * (the cuda-backend-ops test does that). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-time.h"
#include "kernels/cuda/kn-cuda.h"
#include "kernels/kn-backend.h"

#define CHECK(x)                                                                                   \
  do {                                                                                             \
    int rc_ = (x);                                                                                 \
    if (rc_) {                                                                                     \
      fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #x, rc_);                      \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static struct kn_backend *g_be;

/* Device buffer of bytes filled with small random values of dtype dt. */
static void *dev_random(size_t bytes, enum kn_dtype dt) {
  size_t n = bytes / kn_dtype_size(dt);
  void *h = malloc(bytes), *d = kn_alloc(g_be, bytes);
  if (!h || !d) {
    fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
    exit(1);
  }
  uint32_t s = 12345;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    kn_store_f32(h, dt, i, (float)((s >> 8) & 0xffff) / 65536.0f - 0.5f);
  }
  CHECK(kn_upload(g_be, d, h, bytes));
  free(h);
  return d;
}

/* Seconds per call of fn over enough repetitions (after a warm-up). */
typedef void (*bench_fn)(void *arg);
static double time_it(bench_fn fn, void *arg) {
  fn(arg);
  CHECK(kn_sync(g_be));
  int reps = 1;
  for (;;) {
    uint64_t t0 = cm_time_ns();
    for (int i = 0; i < reps; i++)
      fn(arg);
    CHECK(kn_sync(g_be));
    double s = (double)(cm_time_ns() - t0) * 1e-9;
    if (s > 0.2 || reps >= 1 << 14) return s / reps;
    reps *= 4;
  }
}

/* ---- attention ------------------------------------------------------------ */

struct attn_bench {
  struct kn_kv_view view;
  struct kn_attn_seq *seqs;
  int n_seqs, n_heads;
  float *q, *out;
  ptrdiff_t ld;
};

static void attn_run(void *p) {
  struct attn_bench *b = p;
  CHECK(kn_attention(g_be, b->out, b->ld, b->q, b->ld, &b->view, b->seqs, b->n_seqs, b->n_heads, 0,
                     0.0625f, 0.0f));
}

/* B sequences of context L each running n_q query tokens (1: decode). */
static void bench_attention(const char *what, int B, int L, int n_q, int n_heads, int n_kv, int D) {
  struct attn_bench b;
  memset(&b, 0, sizeof(b));
  const int bt = 16;
  int blocks = (L + bt - 1) / bt;
  b.view.block_tokens = bt;
  b.view.n_kv_heads = n_kv;
  b.view.head_dim = D;
  b.view.dtype = KN_DTYPE_BF16;
  size_t blk = (size_t)bt * n_kv * D * 2;
  b.view.k_off = 0;
  b.view.v_off = blk;
  b.view.page_bytes = 2 * blk;
  b.view.n_pages = B * blocks;
  b.view.pool = dev_random((size_t)b.view.n_pages * b.view.page_bytes, KN_DTYPE_BF16);
  b.n_seqs = B;
  b.n_heads = n_heads;
  b.ld = (ptrdiff_t)n_heads * D;
  b.q = dev_random((size_t)B * n_q * b.ld * sizeof(float), KN_DTYPE_F32);
  b.out = kn_alloc(g_be, (size_t)B * n_q * b.ld * sizeof(float));
  b.seqs = calloc((size_t)B, sizeof(*b.seqs));
  int32_t *tables = malloc((size_t)B * blocks * sizeof(int32_t));
  if (!b.out || !b.seqs || !tables) exit(1);
  for (int i = 0; i < B * blocks; i++)
    tables[i] = (int32_t)((i * 7919L) % (B * blocks));
  for (int s = 0; s < B; s++) {
    b.seqs[s].q_begin = s * n_q;
    b.seqs[s].n_q = n_q;
    b.seqs[s].pos0 = L - n_q;
    b.seqs[s].block_table = tables + (size_t)s * blocks;
    b.seqs[s].n_blocks = blocks;
  }
  double t = time_it(attn_run, &b);
  double kv_bytes = (double)B * L * n_kv * D * 2 * 2; /* K and V, bf16 */
  double flops = 4.0 * B * n_heads * D * ((double)n_q * L - (double)n_q * (n_q - 1) / 2);
  printf("attention %-28s B=%-4d L=%-6d n_q=%-5d H=%d/%d D=%d: %9.1f us  %7.0f GB/s KV  %6.1f "
         "TFLOP/s\n",
         what, B, L, n_q, n_heads, n_kv, D, t * 1e6, kv_bytes / t * 1e-9, flops / t * 1e-12);
  kn_free(g_be, b.view.pool);
  kn_free(g_be, b.q);
  kn_free(g_be, b.out);
  free(b.seqs);
  free(tables);
}

/* ---- matmul --------------------------------------------------------------- */

struct mm_bench {
  float *out, *in;
  void *w;
  enum kn_dtype dt;
  int T, N, K;
};

static void mm_run(void *p) {
  struct mm_bench *m = p;
  CHECK(kn_matmul(g_be, m->out, m->N, m->in, m->K, m->w, m->dt, m->T, m->N, m->K, 0));
}

static void bench_matmul(enum kn_dtype dt, int T, int N, int K) {
  struct mm_bench m = {0};
  m.dt = dt;
  m.T = T;
  m.N = N;
  m.K = K;
  m.w = dev_random((size_t)N * K * kn_dtype_size(dt), dt);
  m.in = dev_random((size_t)T * K * sizeof(float), KN_DTYPE_F32);
  m.out = kn_alloc(g_be, (size_t)T * N * sizeof(float));
  if (!m.out) exit(1);
  double t = time_it(mm_run, &m);
  double wbytes = (double)N * K * kn_dtype_size(dt);
  printf("matmul %-4s T=%-5d N=%-6d K=%-6d: %9.1f us  %7.0f GB/s weights  %6.1f TFLOP/s\n",
         kn_dtype_name(dt), T, N, K, t * 1e6, wbytes / t * 1e-9, 2.0 * T * N * K / t * 1e-12);
  kn_free(g_be, m.w);
  kn_free(g_be, m.in);
  kn_free(g_be, m.out);
}

/* ---- row-wise ops ----------------------------------------------------------- */

struct row_bench {
  float *x, *y;
  void *w;
  int rows, d;
};

static void norm_run(void *p) {
  struct row_bench *r = p;
  CHECK(kn_rmsnorm(g_be, r->y, r->d, r->x, r->d, r->rows, r->d, r->w, KN_DTYPE_BF16, 1e-6f,
                   KN_NORM_MUL_ONE_PLUS_W));
}

static void gelu_run(void *p) {
  struct row_bench *r = p;
  CHECK(kn_gelu_mul(g_be, r->y, r->d, r->x, r->d, r->y, r->d, r->rows, r->d));
}

static void bench_rows(int rows, int d) {
  struct row_bench r = {0};
  r.rows = rows;
  r.d = d;
  r.x = dev_random((size_t)rows * d * sizeof(float), KN_DTYPE_F32);
  r.y = dev_random((size_t)rows * d * sizeof(float), KN_DTYPE_F32);
  r.w = dev_random((size_t)d * 2, KN_DTYPE_BF16);
  double bytes = 2.0 * rows * d * sizeof(float);
  double t = time_it(norm_run, &r);
  printf("rmsnorm  rows=%-5d d=%-6d: %9.1f us  %7.0f GB/s\n", rows, d, t * 1e6, bytes / t * 1e-9);
  t = time_it(gelu_run, &r);
  printf("gelu_mul rows=%-5d N=%-6d: %9.1f us  %7.0f GB/s\n", rows, d, t * 1e6,
         1.5 * bytes / t * 1e-9);
  kn_free(g_be, r.x);
  kn_free(g_be, r.y);
  kn_free(g_be, r.w);
}

int main(void) {
  int n = kn_cuda_device_count();
  if (n <= 0) {
    printf("SKIPPED: no CUDA device visible: %d devices\n", n);
    return 77;
  }
  int err = kn_cuda_backend_create(0, &g_be);
  if (err) {
    fprintf(stderr, "kn_cuda_backend_create: %d\n", err);
    return 1;
  }
  /* Gemma 3 27B-like layer shapes: 32 query heads, 16 kv heads, head dim 128;
   * Gemma 4 global layers: head dim 512 */
  bench_attention("decode gqa2 d128", 1, 32768, 1, 32, 16, 128);
  bench_attention("decode gqa2 d128", 32, 4096, 1, 32, 16, 128);
  bench_attention("decode gqa2 d128", 128, 2048, 1, 32, 16, 128);
  bench_attention("decode gqa2 d256", 64, 4096, 1, 16, 8, 256);
  bench_attention("decode gqa8 d512", 16, 8192, 1, 16, 2, 512);
  bench_attention("prefill gqa2 d128", 1, 2048, 2048, 32, 16, 128);
  bench_attention("prefill gqa2 d256", 1, 4096, 512, 16, 8, 256);
  const enum kn_dtype dts[] = {KN_DTYPE_BF16, KN_DTYPE_F16, KN_DTYPE_F32};
  for (int i = 0; i < 3; i++) {
    bench_matmul(dts[i], 1, 5376, 5376);
    bench_matmul(dts[i], 32, 21504, 5376);
    bench_matmul(dts[i], 2048, 5376, 5376);
  }
  bench_rows(1, 5376);
  bench_rows(2048, 5376);
  kn_backend_destroy(g_be);
  return 0;
}
