/* test-cuda-quant.c — weights in ggml's block formats on the device
 * (kn-cuda-quant.c, kn-cuda-quant.cu): the backend offers them
 * (KN_CAP_BLOCK_WEIGHTS and KN_CAP_BLOCK_LOWBIT, its check at creation
 * passed); for every format the
 * few-rows matmul (T <= 32 in launches of 8: exact f32 values, so the CPU's
 * results to f32 rounding), the bf16 tiles through cuBLAS (more rows, over
 * several tiles),
 * the greedy head with a softcap and the embeddings against the CPU oracle
 * on the same bytes, with odd row counts and rows of several blocks; and a
 * tensor-parallel cut of the columns along whole blocks, and one of the rows
 * from an odd row on. Skips loudly without a device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kn-cuda-impl.h"
#include "kernels/kn-backend-impl.h"
#include "kernels/kn-quant.h"
#include "tests/harness/th.h"
#include "tests/unit/cuda/cuda-test-util.h"

/* NMSE against the CPU's f32 results: the few-rows kernel differs by the
 * order of its f32 sums, the tiles by bf16 operands (about 2^-9 each) */
#define TOL_GEMV 1e-10
#define TOL_TILE 1e-4

static const enum kn_dtype k_fmts[] = {
    KN_DTYPE_Q8_0, KN_DTYPE_Q4_0, KN_DTYPE_Q4_1, KN_DTYPE_Q5_0,   KN_DTYPE_Q5_1,   KN_DTYPE_Q4_K,
    KN_DTYPE_Q5_K, KN_DTYPE_Q6_K, KN_DTYPE_Q3_K, KN_DTYPE_IQ4_NL, KN_DTYPE_IQ4_XS, KN_DTYPE_Q2_K};
#define N_FMTS (sizeof(k_fmts) / sizeof(k_fmts[0]))

/* N rows of K elements quantized to dt from random values (the formats of
 * llama.cpp's files that nothing here writes: random blocks; malloc'd). */
static uint8_t *q_weights(struct ct_env *e, enum kn_dtype dt, int N, int K) {
  size_t rb = kn_row_bytes(dt, (size_t)K);
  uint8_t *w = malloc(rb * (size_t)N);
  float *row = malloc(sizeof(float) * (size_t)K);
  TH_REQUIRE(w && row && rb);
  if (kn_dtype_lowbit(dt)) {
    uint64_t rng = 0x6c6f77626974ull + (uint64_t)N * 31u + (uint64_t)K;
    kn_random_blocks(dt, w, rb * (size_t)N / kn_block_bytes(dt), &rng);
  } else {
    for (int n = 0; n < N; n++) {
      ct_fill(e, row, (size_t)K, 1.0f);
      TH_REQUIRE(kn_quantize_row(dt, row, w + (size_t)n * rb, (size_t)K) == 0);
    }
  }
  free(row);
  return w;
}

/* out[T, N] (stride ldo) {=, +=} in[T, K] (stride ldi) · W on both backends,
 * W the N rows at w (host) / w_d (device), compared. */
static void matmul_case(struct ct_env *e, enum kn_dtype dt, const float *in, const float *in_d,
                        ptrdiff_t ldi, const uint8_t *w, const void *w_d, int T, int N, int K,
                        int acc, const char *what) {
  const ptrdiff_t ldo = N + 3;
  struct ct_out o;
  ct_out_init(e, &o, (size_t)T * (size_t)ldo, acc ? 1.0f : 0.0f);
  TH_CHECK(kn_matmul(e->cpu, o.ref, ldo, in, ldi, w, dt, T, N, K, acc) == 0);
  TH_CHECK(kn_matmul(e->gpu, o.dev, ldo, in_d, ldi, w_d, dt, T, N, K, acc) == 0);
  ct_out_check(e, &o, T, N, ldo, T <= KN_CUDA_QGEMV_T ? TOL_GEMV : TOL_TILE,
               "%s %s T=%d N=%d K=%d acc=%d", kn_dtype_name(dt), what, T, N, K, acc);
}

TH_TEST(cuda_block_weights_offered_and_checked) {
  struct ct_env e;
  ct_open(&e, 71);
  TH_CHECK(kn_backend_has(e.gpu, KN_CAP_BLOCK_WEIGHTS | KN_CAP_BLOCK_LOWBIT));
  char why[256];
  /* bf16 operands above the few-rows kernel's rows, as the backend's own check
   * has them (none where LMSERVE_CUDA_GEMV=0 turned that kernel off) */
  const struct kn_cuda_ctx *c = e.gpu->ctx;
  const int f32_rows = c->qgemv ? KN_CUDA_QGEMV_T : 0;
  unsigned bad = kn_block_check(e.gpu, f32_rows, 3e-5, why, sizeof why);
  if (bad) printf("# block check: formats 0x%x failed: %s\n", bad, why);
  TH_CHECK_EQ_INT(bad, 0);
  ct_close(&e);
}

TH_TEST(cuda_block_matmul_matches_cpu) {
  struct ct_env e;
  ct_open(&e, 72);
  /* T, N, blocks a row: the few-rows kernel up to 32 rows (in launches of
   * 8; two and four weight rows a warp from 4096 and 8192 rows, and N not
   * a multiple of them), then tiles */
  static const int shapes[][3] = {{1, 37, 5},   {3, 129, 3},  {8, 301, 2},  {9, 77, 3},
                                  {17, 301, 4}, {32, 45, 2},  {33, 45, 3},  {70, 1031, 2},
                                  {1, 8195, 1}, {4, 4101, 2}, {8, 9001, 1}, {11, 4096, 1}};
  for (size_t f = 0; f < N_FMTS; f++)
    for (size_t s = 0; s < 2 * sizeof(shapes) / sizeof(shapes[0]); s++) {
      const enum kn_dtype dt = k_fmts[f];
      const int *sh = shapes[s / 2];
      const int T = sh[0], N = sh[1], K = sh[2] * kn_block_elems(dt);
      /* input rows at odd offsets (read a float at a time), then 16-byte
       * aligned (read in vectors) */
      const ptrdiff_t ldi = s % 2 ? K : K + 5;
      struct ct_in in;
      ct_in_init(&e, &in, (size_t)T * ldi, 3.0f);
      uint8_t *w = q_weights(&e, dt, N, K);
      void *w_d = ct_up(&e, w, kn_row_bytes(dt, (size_t)K) * (size_t)N);
      for (int acc = 0; acc < 2; acc++)
        matmul_case(&e, dt, in.host, in.dev, ldi, w, w_d, T, N, K, acc, "matmul");
      ct_in_free(&e, &in);
      kn_free(e.gpu, w_d);
      free(w);
    }
  ct_close(&e);
}

/* One input row with 2 and 4 octets a lane in flight
 * ($LMSERVE_CUDA_QGEMV_OCTETS): the same bits as one, at every rows-a-warp
 * count, with rows whose octets are not a multiple of the lanes' (lanes past
 * a row's end) and N not a multiple of the rows a warp (a warp past N). */
TH_TEST(cuda_block_matmul_octets_same_bits) {
  struct ct_env e;
  ct_open(&e, 76);
  struct kn_cuda_ctx *c = e.gpu->ctx;
  static const int Ns[] = {37, 130}; /* rpw is passed, so small N take every path */
  for (size_t f = 0; f < N_FMTS; f++)
    for (int big = 0; big < 2; big++)
      for (size_t ni = 0; ni < sizeof(Ns) / sizeof(Ns[0]); ni++) {
        const enum kn_dtype dt = k_fmts[f];
        const int qk = kn_block_elems(dt), K = (qk == 256 ? (big ? 5 : 1) : (big ? 37 : 5)) * qk;
        const int N = Ns[ni];
        struct ct_in in;
        ct_in_init(&e, &in, (size_t)K, 3.0f);
        uint8_t *w = q_weights(&e, dt, N, K);
        void *w_d = ct_up(&e, w, kn_row_bytes(dt, (size_t)K) * (size_t)N);
        float *init = malloc(sizeof(float) * (size_t)N), *ref = malloc(sizeof(float) * (size_t)N),
              *got = malloc(sizeof(float) * (size_t)N);
        TH_REQUIRE(init && ref && got);
        ct_fill(&e, init, (size_t)N, 1.0f);
        for (int rpw = 1; rpw <= 4; rpw *= 2)
          for (int acc = 0; acc < 2; acc++)
            for (int oct = 1; oct <= 4; oct *= 2) {
              float *o_d = ct_up(&e, init, sizeof(float) * (size_t)N);
              TH_CHECK_EQ_INT(kn_cuda_launch_qgemv(c->stream, o_d, N, in.dev, K, w_d, dt, 1, N, K,
                                                   rpw, oct, acc),
                              cudaSuccess);
              TH_CHECK_EQ_INT(cudaStreamSynchronize(c->stream), cudaSuccess);
              ct_down(&e, oct == 1 ? ref : got, o_d, sizeof(float) * (size_t)N);
              kn_free(e.gpu, o_d);
              if (oct > 1 && memcmp(ref, got, sizeof(float) * (size_t)N)) {
                int n = 0;
                while (n < N - 1 && ref[n] == got[n])
                  n++;
                th_fail(__FILE__, __LINE__,
                        "%s N=%d K=%d rpw=%d acc=%d: %d octets a lane gave %.9g at row %d, one "
                        "gave %.9g",
                        kn_dtype_name(dt), N, K, rpw, acc, oct, got[n], n, ref[n]);
              }
            }
        free(init);
        free(ref);
        free(got);
        ct_in_free(&e, &in);
        kn_free(e.gpu, w_d);
        free(w);
      }
  ct_close(&e);
}

/* A matrix of more rows than one tile holds (64 MiB of bf16 rows of 4096):
 * the tiles' offsets into the weights and the output. */
TH_TEST(cuda_block_matmul_over_several_tiles) {
  struct ct_env e;
  ct_open(&e, 73);
  const int T = 40, N = 8192 + 8192 / 2 + 37, K = 4096;
  const enum kn_dtype dts[] = {KN_DTYPE_Q4_0, KN_DTYPE_Q6_K, KN_DTYPE_Q3_K};
  struct ct_in in;
  ct_in_init(&e, &in, (size_t)T * K, 3.0f);
  for (size_t i = 0; i < sizeof(dts) / sizeof(dts[0]); i++) {
    uint8_t *w = q_weights(&e, dts[i], N, K);
    void *w_d = ct_up(&e, w, kn_row_bytes(dts[i], (size_t)K) * (size_t)N);
    matmul_case(&e, dts[i], in.host, in.dev, K, w, w_d, T, N, K, 0, "tiles");
    kn_free(e.gpu, w_d);
    free(w);
  }
  ct_in_free(&e, &in);
  ct_close(&e);
}

/* Tensor parallelism: the columns cut in two along whole blocks (each half's
 * rows repacked as a rank holds them, the second accumulated onto the
 * first), and the rows from an odd row on (a pointer into the matrix, as a
 * rank's share of the rows). Each against the CPU's product of the same rows. */
TH_TEST(cuda_block_tensor_parallel_cuts) {
  struct ct_env e;
  ct_open(&e, 74);
  static const int Ts[] = {2, 8, 19, 41};
  for (size_t f = 0; f < N_FMTS; f++)
    for (size_t ti = 0; ti < sizeof(Ts) / sizeof(Ts[0]); ti++) {
      const enum kn_dtype dt = k_fmts[f];
      const int T = Ts[ti], N = 83, nb = 4, K = nb * kn_block_elems(dt), Kh = K / 2, r0 = 7;
      const size_t rb = kn_row_bytes(dt, (size_t)K), hb = rb / 2;
      struct ct_in in;
      ct_in_init(&e, &in, (size_t)T * K, 3.0f);
      uint8_t *w = q_weights(&e, dt, N, K), *halves = malloc(rb * (size_t)N);
      TH_REQUIRE(halves);
      for (int n = 0; n < N; n++) { /* rank 0's half rows, then rank 1's */
        memcpy(halves + (size_t)n * hb, w + (size_t)n * rb, hb);
        memcpy(halves + (size_t)N * hb + (size_t)n * hb, w + (size_t)n * rb + hb, hb);
      }
      void *w_d = ct_up(&e, w, rb * (size_t)N), *h_d = ct_up(&e, halves, rb * (size_t)N);
      struct ct_out o;
      ct_out_init(&e, &o, (size_t)T * N, 0.0f);
      TH_CHECK(kn_matmul(e.cpu, o.ref, N, in.host, K, w, dt, T, N, K, 0) == 0);
      TH_CHECK(kn_matmul(e.gpu, o.dev, N, in.dev, K, h_d, dt, T, N, Kh, 0) == 0);
      TH_CHECK(kn_matmul(e.gpu, o.dev, N, in.dev + Kh, K, (char *)h_d + (size_t)N * hb, dt, T, N,
                         Kh, 1) == 0);
      ct_out_check(&e, &o, T, N, N, T <= KN_CUDA_QGEMV_T ? TOL_GEMV : TOL_TILE,
                   "%s column cut T=%d", kn_dtype_name(dt), T);
      /* rows [r0, N) of the same product, written from column 0 (ct_out_check compares
       * the first N - r0 columns of each token; the rest must stay untouched) */
      ct_out_init(&e, &o, (size_t)T * N, 0.0f);
      TH_CHECK(kn_matmul(e.cpu, o.ref, N, in.host, K, w + (size_t)r0 * rb, dt, T, N - r0, K, 0) ==
               0);
      TH_CHECK(kn_matmul(e.gpu, o.dev, N, in.dev, K, (char *)w_d + (size_t)r0 * rb, dt, T, N - r0,
                         K, 0) == 0);
      ct_out_check(&e, &o, T, N - r0, N, T <= KN_CUDA_QGEMV_T ? TOL_GEMV : TOL_TILE,
                   "%s row cut T=%d", kn_dtype_name(dt), T);
      ct_in_free(&e, &in);
      kn_free(e.gpu, w_d), kn_free(e.gpu, h_d);
      free(w), free(halves);
    }
  ct_close(&e);
}

/* The greedy head over a block-format vocabulary (tied embeddings in a GGUF
 * file), softcapped and not: each row's id is one the CPU's logits put
 * within the operands' rounding of their largest, and its max is that logit. */
TH_TEST(cuda_block_head_matches_cpu) {
  struct ct_env e;
  ct_open(&e, 75);
  static const int Ts[] = {1, 5, 12, 40};
  for (size_t f = 0; f < N_FMTS; f++)
    for (size_t ti = 0; ti < sizeof(Ts) / sizeof(Ts[0]); ti++)
      for (int c = 0; c < 2; c++) {
        const enum kn_dtype dt = k_fmts[f];
        const int T = Ts[ti], N = 2999, K = 2 * kn_block_elems(dt);
        const float cap = c ? 30.0f : 0.0f;
        float *ref = malloc(sizeof(float) * (size_t)T * N), *scratch = ct_sentinel((size_t)T * N);
        TH_REQUIRE(ref);
        struct ct_in in;
        ct_in_init(&e, &in, (size_t)T * K, 3.0f);
        uint8_t *w = q_weights(&e, dt, N, K);
        void *w_d = ct_up(&e, w, kn_row_bytes(dt, (size_t)K) * (size_t)N);
        float *s_d = ct_up(&e, scratch, sizeof(float) * (size_t)T * N);
        int32_t ids[40];
        float maxv[40];
        TH_CHECK((c ? kn_matmul_softcap(e.cpu, ref, N, in.host, K, w, dt, T, N, K, cap)
                    : kn_matmul(e.cpu, ref, N, in.host, K, w, dt, T, N, K, 0)) == 0);
        TH_CHECK(kn_matmul_argmax(e.gpu, ids, maxv, in.dev, K, w_d, dt, T, N, K, cap, s_d) == 0);
        for (int t = 0; t < T; t++) {
          const float *r = ref + (size_t)t * N;
          float best = r[0], lo = r[0];
          for (int n = 1; n < N; n++)
            best = fmaxf(best, r[n]), lo = fminf(lo, r[n]);
          double slack = (T <= KN_CUDA_QGEMV_T ? 1e-5 : 1e-2) * (best - lo);
          if (ids[t] < 0 || ids[t] >= N || !(r[ids[t]] >= best - slack) ||
              !(fabs(maxv[t] - r[ids[t]]) <= slack))
            th_fail(__FILE__, __LINE__, "%s head T=%d cap=%g row %d: id %d max %g, CPU's best %g",
                    kn_dtype_name(dt), T, cap, t, (int)ids[t], maxv[t], best);
        }
        ct_in_free(&e, &in);
        kn_free(e.gpu, w_d), kn_free(e.gpu, s_d);
        free(ref), free(scratch), free(w);
      }
  ct_close(&e);
}

/* Embeddings from a block-format table: the CPU's bits, from host ids (-1:
 * another rank's row, zero) and from device ids (outside the table: zero). */
TH_TEST(cuda_block_embed_matches_cpu) {
  struct ct_env e;
  ct_open(&e, 76);
  enum { T = 6 };
  const int32_t ids[T] = {0, 300, -1, 17, 17, 151};
  const int32_t dev_ids[T] = {299, 301, -1, 3, 1000, 0};
  for (size_t f = 0; f < N_FMTS; f++) {
    const enum kn_dtype dt = k_fmts[f];
    const int V = 301, H = 3 * kn_block_elems(dt);
    const ptrdiff_t ldo = H + 1;
    uint8_t *w = q_weights(&e, dt, V, H);
    void *w_d = ct_up(&e, w, kn_row_bytes(dt, (size_t)H) * (size_t)V);
    int32_t *ids_d = ct_up(&e, dev_ids, sizeof(dev_ids));
    struct ct_out o;
    ct_out_init(&e, &o, (size_t)T * ldo, 0.0f);
    TH_CHECK(kn_embed(e.cpu, o.ref, ldo, w, dt, V, H, ids, T, 1.5f) == 0);
    TH_CHECK(kn_embed(e.gpu, o.dev, ldo, w_d, dt, V, H, ids, T, 1.5f) == 0);
    ct_out_check(&e, &o, T, H, ldo, 0.0, "%s embed", kn_dtype_name(dt));
    ct_out_init(&e, &o, (size_t)T * ldo, 0.0f);
    TH_CHECK(kn_embed_dev(e.cpu, o.ref, ldo, w, dt, V, H, dev_ids, T, 0.75f) == 0);
    TH_CHECK(kn_embed_dev(e.gpu, o.dev, ldo, w_d, dt, V, H, ids_d, T, 0.75f) == 0);
    ct_out_check(&e, &o, T, H, ldo, 0.0, "%s embed_dev", kn_dtype_name(dt));
    kn_free(e.gpu, w_d), kn_free(e.gpu, ids_d);
    free(w);
  }
  ct_close(&e);
}
