/* test-cuda-dense.c — the CUDA backend's dense ops against the CPU oracle on
 * random inputs over a grid of shapes, dtypes and strides: embedding,
 * RMSNorm (three forms, in place), matmul (f32 / f16 / bf16 weights,
 * accumulate, K = 0), the head with its softcap, row-subset matmul, RoPE, GELU gating, elementwise
 * ops, copy_rows, argmax and the router's top-k. Skips loudly without a device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "kernels/cuda/kn-cuda.h"
#include "kernels/kn-backend.h"
#include "tests/harness/th.h"
#include "tests/unit/cuda/cuda-test-util.h"

static const enum kn_dtype k_wdts[] = {KN_DTYPE_F32, KN_DTYPE_F16, KN_DTYPE_BF16};

/* Tolerance of a GEMM with weights of type dt: half-precision GEMMs round
 * the activations to the weights' type first. */
static double gemm_tol(enum kn_dtype dt) {
  return dt == KN_DTYPE_F32 ? 1e-9 : dt == KN_DTYPE_F16 ? 1e-6 : 3e-5;
}

TH_TEST(cuda_embed) {
  struct ct_env e;
  ct_open(&e, 1);
  const int vocab = 97;
  const int Hs[] = {1, 64, 1000}, Ts[] = {1, 5, 33};
  for (size_t di = 0; di < 3; di++)
    for (size_t hi = 0; hi < 3; hi++)
      for (size_t ti = 0; ti < 3; ti++) {
        enum kn_dtype dt = k_wdts[di];
        int H = Hs[hi], T = Ts[ti];
        ptrdiff_t ldo = H + 3;
        size_t total = (size_t)T * (size_t)ldo;
        void *table = ct_weights(&e, dt, (size_t)vocab * H, 2.0f);
        int32_t ids[33];
        for (int t = 0; t < T; t++)
          ids[t] = ct_rand_int(&e, vocab);
        ids[0] = vocab - 1;
        struct ct_out o;
        ct_out_init(&e, &o, total, 0);
        void *table_d = ct_up(&e, table, (size_t)vocab * H * kn_dtype_size(dt));
        TH_CHECK(kn_embed(e.cpu, o.ref, ldo, table, dt, vocab, H, ids, T, 1.5f) == 0);
        TH_CHECK(kn_embed(e.gpu, o.dev, ldo, table_d, dt, vocab, H, ids, T, 1.5f) == 0);
        ct_out_check(&e, &o, T, H, ldo, 0.0, "embed %s H=%d T=%d", kn_dtype_name(dt), H, T);
        kn_free(e.gpu, table_d);
        free(table);
      }
  ct_close(&e);
}

TH_TEST(cuda_rmsnorm) {
  struct ct_env e;
  ct_open(&e, 2);
  const int rows_v[] = {1, 4, 33}, ds[] = {1, 7, 256, 512, 2560};
  for (int mode = 0; mode < 3; mode++)
    for (size_t di = 0; di < 3; di++)
      for (size_t ri = 0; ri < 3; ri++)
        for (size_t ci = 0; ci < 5; ci++)
          for (int inplace = 0; inplace < 2; inplace++) {
            enum kn_dtype dt = k_wdts[di];
            if (mode == KN_NORM_NO_W && di > 0) continue;
            int rows = rows_v[ri], d = ds[ci];
            ptrdiff_t ldx = d + 5, ldo = inplace ? ldx : d + 2;
            size_t tx = (size_t)rows * ldx, to = (size_t)rows * ldo;
            float *x = malloc(tx * sizeof(float));
            TH_REQUIRE(x);
            ct_fill(&e, x, tx, 3.0f);
            void *w = mode == KN_NORM_NO_W ? NULL : ct_weights(&e, dt, (size_t)d, 1.0f);
            float *ref = inplace ? x : ct_sentinel(to);
            float *got = ct_sentinel(to);
            float *x_d = ct_up(&e, x, tx * sizeof(float));
            float *out_d = inplace ? x_d : ct_up(&e, got, to * sizeof(float));
            void *w_d = w ? ct_up(&e, w, (size_t)d * kn_dtype_size(dt)) : NULL;
            enum kn_norm_mode m = (enum kn_norm_mode)mode;
            TH_CHECK(kn_rmsnorm(e.gpu, out_d, ldo, x_d, ldx, rows, d, w_d, dt, 1e-6f, m) == 0);
            TH_CHECK(kn_rmsnorm(e.cpu, ref, ldo, x, ldx, rows, d, w, dt, 1e-6f, m) == 0);
            ct_down(&e, got, out_d, to * sizeof(float));
            char what[96];
            snprintf(what, sizeof(what), "rmsnorm mode %d %s rows=%d d=%d%s", mode,
                     kn_dtype_name(dt), rows, d, inplace ? " in place" : "");
            ct_compare(what, ref, got, rows, d, ldo, to, 1e-10);
            kn_free(e.gpu, x_d);
            if (!inplace) kn_free(e.gpu, out_d);
            kn_free(e.gpu, w_d);
            if (!inplace) free(ref);
            free(x);
            free(w);
            free(got);
          }
  ct_close(&e);
}

/* One matmul (or row-subset matmul when rows != NULL) case on both backends. */
static void matmul_case(struct ct_env *e, enum kn_dtype dt, int T, int N, int K, int accumulate,
                        ptrdiff_t ldi, ptrdiff_t ldo, int n_w, const int32_t *rows) {
  int n_out = N; /* output columns: N, or n_rows for the subset form */
  int wrows = rows ? n_w : N;
  size_t ti = (size_t)T * (size_t)(ldi > K ? ldi : K) + 1, to = (size_t)(T - 1) * ldo + n_out;
  struct ct_gemm g;
  ct_gemm_init(e, &g, dt, ti, 1.0f, (size_t)wrows * K + 1);
  struct ct_out o;
  ct_out_init(e, &o, to, accumulate ? 1.0f : 0.0f);
  if (rows) {
    TH_CHECK(kn_matmul_rows(e->cpu, o.ref, ldo, g.in, ldi, g.w, dt, n_w, K, rows, N, T) == 0);
    TH_CHECK(kn_matmul_rows(e->gpu, o.dev, ldo, g.in_d, ldi, g.w_d, dt, n_w, K, rows, N, T) == 0);
  } else {
    TH_CHECK(kn_matmul(e->cpu, o.ref, ldo, g.in, ldi, g.w, dt, T, N, K, accumulate) == 0);
    TH_CHECK(kn_matmul(e->gpu, o.dev, ldo, g.in_d, ldi, g.w_d, dt, T, N, K, accumulate) == 0);
  }
  ct_out_check(e, &o, T, n_out, T == 1 ? n_out : ldo, gemm_tol(dt),
               "%s %s T=%d N=%d K=%d acc=%d ldi=%td ldo=%td", rows ? "matmul_rows" : "matmul",
               kn_dtype_name(dt), T, N, K, accumulate, ldi, ldo);
  ct_gemm_free(e, &g);
}

TH_TEST(cuda_matmul) {
  struct ct_env e;
  ct_open(&e, 3);
  static const int shapes[][3] = {{1, 1, 1},       {1, 64, 256},     {7, 33, 100}, {64, 256, 512},
                                  {130, 300, 257}, {48, 1024, 1536}, {3, 5, 0},    {1, 2560, 640}};
  for (size_t di = 0; di < 3; di++)
    for (size_t si = 0; si < CM_ARRAY_LEN(shapes); si++)
      for (int acc = 0; acc < 2; acc++) {
        int T = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        matmul_case(&e, k_wdts[di], T, N, K, acc, K + 3, N + 1, 0, NULL);
        if (T == 1) matmul_case(&e, k_wdts[di], T, N, K, acc, 0, 1, 0, NULL); /* any ld, 1 row */
      }
  ct_close(&e);
}

/* Few rows with K % 8 == 0 and 16-byte aligned input rows: the one-launch
 * kernel (kn-cuda-gemv.cu) for bf16 / f16 weights, at every T it takes and
 * one past it (cuBLAS), with a tail of vectors past a multiple of 32 lanes. */
TH_TEST(cuda_matmul_few_rows) {
  struct ct_env e;
  ct_open(&e, 4);
  /* the kernel passed its check when the backend was made, unless turned off */
  const char *gv = getenv("LMSERVE_CUDA_GEMV");
  if (!gv || strcmp(gv, "0")) TH_CHECK(kn_cuda_backend_gemv(e.gpu));
  static const int shapes[][2] = {{37, 1160}, {300, 640}, {1024, 64}, {96, 1152}, {5, 8}};
  for (size_t di = 0; di < 3; di++)
    for (size_t si = 0; si < CM_ARRAY_LEN(shapes); si++)
      for (int T = 1; T <= 9; T++)
        for (int acc = 0; acc < 2; acc++) {
          int N = shapes[si][0], K = shapes[si][1];
          matmul_case(&e, k_wdts[di], T, N, K, acc, K + 4, N + 3, 0, NULL);
          /* input rows not 16-byte aligned: cuBLAS */
          if (T == 2) matmul_case(&e, k_wdts[di], T, N, K, acc, K + 3, N + 3, 0, NULL);
        }
  ct_close(&e);
}

/* The head with its softcap (the backend-neutral matmul + softcap path on
 * CUDA) against the CPU's fused one, over strided rows. */
TH_TEST(cuda_matmul_softcap) {
  struct ct_env e;
  ct_open(&e, 5);
  static const int shapes[][3] = {{1, 4096, 64}, {4, 1000, 64}, {33, 257, 100}};
  for (size_t di = 0; di < 3; di++)
    for (size_t si = 0; si < CM_ARRAY_LEN(shapes); si++) {
      int T = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
      ptrdiff_t ldo = N + 3;
      enum kn_dtype dt = k_wdts[di];
      struct ct_gemm g;
      ct_gemm_init(&e, &g, dt, (size_t)T * K, 4.0f, (size_t)N * K);
      struct ct_out o;
      ct_out_init(&e, &o, (size_t)(T - 1) * ldo + N, 0);
      TH_CHECK(kn_matmul_softcap(e.cpu, o.ref, ldo, g.in, K, g.w, dt, T, N, K, 5.0f) == 0);
      TH_CHECK(kn_matmul_softcap(e.gpu, o.dev, ldo, g.in_d, K, g.w_d, dt, T, N, K, 5.0f) == 0);
      ct_out_check(&e, &o, T, N, ldo, gemm_tol(dt), "matmul_softcap %s T=%d N=%d K=%d",
                   kn_dtype_name(dt), T, N, K);
      ct_gemm_free(&e, &g);
    }
  ct_close(&e);
}

/* kn_matmul_argmax on a backend without a fused version: the product (and
 * softcap) into the caller's scratch, then kn_argmax; the same answers as
 * those calls made one by one on the GPU. */
TH_TEST(cuda_matmul_argmax) {
  struct ct_env e;
  ct_open(&e, 6);
  static const int shapes[][3] = {{1, 4096, 64}, {32, 5000, 64}, {3, 257, 100}};
  for (size_t di = 0; di < 3; di++)
    for (size_t si = 0; si < CM_ARRAY_LEN(shapes); si++)
      for (int c = 0; c < 2; c++) {
        int T = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        float cap = c ? 30.0f : 0.0f;
        enum kn_dtype dt = k_wdts[di];
        size_t to = (size_t)T * N;
        float *zeros = calloc(to, sizeof(float));
        TH_REQUIRE(zeros);
        struct ct_gemm g;
        ct_gemm_init(&e, &g, dt, (size_t)T * K, 4.0f, (size_t)N * K);
        float *out_d = ct_up(&e, zeros, to * sizeof(float));
        float *scratch_d = ct_up(&e, zeros, to * sizeof(float));
        int32_t ids_a[32], ids_b[32];
        float max_a[32], max_b[32];
        if (c)
          TH_CHECK(kn_matmul_softcap(e.gpu, out_d, N, g.in_d, K, g.w_d, dt, T, N, K, cap) == 0);
        else
          TH_CHECK(kn_matmul(e.gpu, out_d, N, g.in_d, K, g.w_d, dt, T, N, K, 0) == 0);
        TH_CHECK(kn_argmax(e.gpu, ids_a, max_a, out_d, N, T, N) == 0);
        TH_CHECK(kn_matmul_argmax(e.gpu, ids_b, max_b, g.in_d, K, g.w_d, dt, T, N, K, cap,
                                  scratch_d) == 0);
        for (int t = 0; t < T; t++)
          TH_CHECK(ids_a[t] == ids_b[t] && max_a[t] == max_b[t]);
        kn_free(e.gpu, out_d);
        kn_free(e.gpu, scratch_d);
        free(zeros);
        ct_gemm_free(&e, &g);
      }
  ct_close(&e);
}

TH_TEST(cuda_matmul_rows) {
  struct ct_env e;
  ct_open(&e, 4);
  const int n_w = 50;
  static const int cases[][3] = {{1, 1, 64}, {9, 17, 128}, {4, 60, 300}, {33, 5, 1}};
  for (size_t di = 0; di < 3; di++)
    for (size_t ci = 0; ci < CM_ARRAY_LEN(cases); ci++) {
      int T = cases[ci][0], n = cases[ci][1], K = cases[ci][2];
      int32_t rows[64];
      for (int j = 0; j < n; j++)
        rows[j] = ct_rand_int(&e, n_w); /* repeats allowed */
      rows[0] = n_w - 1;
      matmul_case(&e, k_wdts[di], T, n, K, 0, K + 2, n + 3, n_w, rows);
    }
  ct_close(&e);
}

TH_TEST(cuda_rope) {
  struct ct_env e;
  ct_open(&e, 5);
  const int Ts[] = {1, 9}, heads_v[] = {1, 4}, Ds[] = {2, 64, 256, 512};
  for (size_t ti = 0; ti < 2; ti++)
    for (size_t hi = 0; hi < 2; hi++)
      for (size_t di = 0; di < 4; di++) {
        int T = Ts[ti], heads = heads_v[hi], D = Ds[di];
        ptrdiff_t ldx = (ptrdiff_t)heads * D + 4;
        size_t total = (size_t)T * ldx;
        float *x = malloc(total * sizeof(float)), *got = malloc(total * sizeof(float));
        float inv[256];
        int32_t pos[9];
        TH_REQUIRE(x && got);
        ct_fill(&e, x, total, 2.0f);
        for (int i = 0; i < D / 2; i++) /* last quarter zero: partial rotary */
          inv[i] = i >= D * 3 / 8 && D >= 8 ? 0.0f : powf(10000.0f, -2.0f * i / D);
        for (int t = 0; t < T; t++)
          pos[t] = ct_rand_int(&e, 200000);
        pos[0] = 0;
        float *x_d = ct_up(&e, x, total * sizeof(float));
        float *inv_d = ct_up(&e, inv, (size_t)(D / 2) * sizeof(float));
        TH_CHECK(kn_rope(e.gpu, x_d, ldx, T, heads, D, pos, inv_d) == 0);
        TH_CHECK(kn_rope(e.cpu, x, ldx, T, heads, D, pos, inv) == 0);
        ct_down(&e, got, x_d, total * sizeof(float));
        char what[96];
        snprintf(what, sizeof(what), "rope T=%d heads=%d D=%d", T, heads, D);
        ct_compare(what, x, got, T, heads * D, ldx, total, 1e-10);
        kn_free(e.gpu, x_d);
        kn_free(e.gpu, inv_d);
        free(x);
        free(got);
      }
  ct_close(&e);
}

TH_TEST(cuda_gelu_mul) {
  struct ct_env e;
  ct_open(&e, 6);
  const int Ts[] = {1, 7}, Ns[] = {1, 1000, 4097};
  for (size_t ti = 0; ti < 2; ti++)
    for (size_t ni = 0; ni < 3; ni++)
      for (int alias = 0; alias < 2; alias++) {
        int T = Ts[ti], N = Ns[ni];
        ptrdiff_t ld = N + 3;
        size_t total = (size_t)T * ld;
        float *g = malloc(total * sizeof(float)), *u = malloc(total * sizeof(float));
        TH_REQUIRE(g && u);
        ct_fill(&e, g, total, 5.0f);
        ct_fill(&e, u, total, 2.0f);
        float *ref = alias ? g : ct_sentinel(total), *got = ct_sentinel(total);
        float *g_d = ct_up(&e, g, total * sizeof(float)),
              *u_d = ct_up(&e, u, total * sizeof(float));
        float *o_d = alias ? g_d : ct_up(&e, got, total * sizeof(float));
        TH_CHECK(kn_gelu_mul(e.gpu, o_d, ld, g_d, ld, u_d, ld, T, N) == 0);
        TH_CHECK(kn_gelu_mul(e.cpu, ref, ld, g, ld, u, ld, T, N) == 0);
        ct_down(&e, got, o_d, total * sizeof(float));
        char what[96];
        snprintf(what, sizeof(what), "gelu_mul T=%d N=%d%s", T, N, alias ? " aliased" : "");
        ct_compare(what, ref, got, T, N, ld, total, 1e-10);
        kn_free(e.gpu, g_d);
        kn_free(e.gpu, u_d);
        if (!alias) {
          kn_free(e.gpu, o_d);
          free(ref);
        }
        free(g);
        free(u);
        free(got);
      }
  ct_close(&e);
}

TH_TEST(cuda_eltwise) {
  struct ct_env e;
  ct_open(&e, 7);
  const size_t ns[] = {1, 1000, (1u << 20) + 3};
  for (size_t ni = 0; ni < 3; ni++)
    for (int op = 0; op < 4; op++) {
      size_t n = ns[ni];
      float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
      float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
      TH_REQUIRE(a && b && ref && got);
      ct_fill(&e, a, n, 100.0f);
      ct_fill(&e, b, n, 3.0f);
      float *a_d = ct_up(&e, a, n * sizeof(float)), *b_d = ct_up(&e, b, n * sizeof(float));
      int rc_cpu = -1, rc_gpu = -1;
      switch (op) {
      case 0:
        rc_cpu = kn_add(e.cpu, ref, a, b, n);
        rc_gpu = kn_add(e.gpu, a_d, a_d, b_d, n); /* out aliases a */
        break;
      case 1:
        rc_cpu = kn_mul(e.cpu, ref, a, b, n);
        rc_gpu = kn_mul(e.gpu, a_d, a_d, b_d, n);
        break;
      case 2:
        rc_cpu = kn_scale(e.cpu, ref, a, 0.37f, n);
        rc_gpu = kn_scale(e.gpu, a_d, a_d, 0.37f, n);
        break;
      default:
        rc_cpu = kn_softcap(e.cpu, ref, a, 30.0f, n);
        rc_gpu = kn_softcap(e.gpu, a_d, a_d, 30.0f, n);
        break;
      }
      TH_CHECK(rc_cpu == 0 && rc_gpu == 0);
      ct_down(&e, got, a_d, n * sizeof(float));
      char what[64];
      snprintf(what, sizeof(what), "eltwise op %d n=%zu", op, n);
      ct_compare(what, ref, got, 1, (int)n, (ptrdiff_t)n, n, op == 3 ? 1e-10 : 0.0);
      kn_free(e.gpu, a_d);
      kn_free(e.gpu, b_d);
      free(a);
      free(b);
      free(ref);
      free(got);
    }
  ct_close(&e);
}

TH_TEST(cuda_copy_rows) {
  struct ct_env e;
  ct_open(&e, 8);
  static const int cases[][4] = {{1, 1, 0, 0}, {1, 300, 0, 7}, {17, 1, 3, 2}, {17, 300, 301, 310}};
  for (size_t ci = 0; ci < CM_ARRAY_LEN(cases); ci++) {
    int rows = cases[ci][0], cols = cases[ci][1];
    ptrdiff_t ldd = cases[ci][2], lds = cases[ci][3];
    size_t td = (size_t)(rows - 1) * ldd + cols, ts = (size_t)(rows - 1) * lds + cols;
    struct ct_in src;
    ct_in_init(&e, &src, ts, 10.0f);
    struct ct_out o;
    ct_out_init(&e, &o, td, 0);
    TH_CHECK(kn_copy_rows(e.cpu, o.ref, ldd, src.host, lds, rows, cols) == 0);
    TH_CHECK(kn_copy_rows(e.gpu, o.dev, ldd, src.dev, lds, rows, cols) == 0);
    ct_out_check(&e, &o, rows, cols, rows == 1 ? cols : ldd, 0.0, "copy_rows");
    ct_in_free(&e, &src);
  }
  ct_close(&e);
}

TH_TEST(cuda_argmax) {
  struct ct_env e;
  ct_open(&e, 9);
  const int Ts[] = {1, 5, 64}, Vs[] = {1, 7, 262144};
  for (size_t ti = 0; ti < 3; ti++)
    for (size_t vi = 0; vi < 3; vi++) {
      int T = Ts[ti], V = Vs[vi];
      ptrdiff_t ld = V + 3;
      size_t total = (size_t)T * ld;
      float *x = malloc(total * sizeof(float));
      TH_REQUIRE(x);
      ct_fill(&e, x, total, 20.0f);
      for (int t = 0; t < T; t++) {
        float *row = x + (size_t)t * ld;
        int kind = t % 5;
        if (kind == 1 && V > 2) { /* a tie for the maximum: the first wins */
          int a = ct_rand_int(&e, V), b = ct_rand_int(&e, V);
          row[a] = row[b] = 50.0f;
        } else if (kind == 2) { /* NaN never wins */
          for (int i = 0; i < V; i += 3)
            row[i] = NAN;
        } else if (kind == 3) { /* all NaN: index 0 */
          for (int i = 0; i < V; i++)
            row[i] = NAN;
        } else if (kind == 4) {
          for (int i = 0; i < V; i++)
            row[i] = -INFINITY;
        }
      }
      int32_t ids_c[64], ids_g[64];
      float max_c[64], max_g[64];
      float *x_d = ct_up(&e, x, total * sizeof(float));
      TH_CHECK(kn_argmax(e.cpu, ids_c, max_c, x, ld, T, V) == 0);
      TH_CHECK(kn_argmax(e.gpu, ids_g, max_g, x_d, ld, T, V) == 0);
      for (int t = 0; t < T; t++) {
        if (ids_c[t] != ids_g[t] || !(max_c[t] == max_g[t] || (isnan(max_c[t]) && isnan(max_g[t]))))
          th_fail(__FILE__, __LINE__, "argmax T=%d V=%d row %d: cpu %d (%g), cuda %d (%g)", T, V, t,
                  (int)ids_c[t], max_c[t], (int)ids_g[t], max_g[t]);
      }
      TH_CHECK(kn_argmax(e.gpu, ids_g, NULL, x_d, ld, T, V) == 0); /* max_out may be NULL */
      for (int t = 0; t < T; t++)
        TH_CHECK_EQ_INT(ids_g[t], ids_c[t]);
      kn_free(e.gpu, x_d);
      free(x);
    }
  ct_close(&e);
}

TH_TEST(cuda_router_topk) {
  struct ct_env e;
  ct_open(&e, 10);
  const int Ts[] = {1, 17}, Es[] = {4, 8, 64, 128}, ks[] = {1, 2, 4, 8};
  for (size_t ti = 0; ti < 2; ti++)
    for (size_t ei = 0; ei < 4; ei++)
      for (size_t ki = 0; ki < 4; ki++)
        for (int scaled = 0; scaled < 2; scaled++) {
          int T = Ts[ti], E = Es[ei], k = ks[ki];
          if (k > E) continue;
          ptrdiff_t ld = E + 1;
          size_t total = (size_t)T * ld;
          float *x = malloc(total * sizeof(float)), sc[128];
          TH_REQUIRE(x);
          ct_fill(&e, x, total, 4.0f);
          for (int i = 0; i < E; i++)
            sc[i] = 0.5f + (float)i / E;
          if (T > 1) {
            x[ld + 1] = x[ld + 2] = 9.0f; /* a tie: lower index first */
            x[2 * ld] = NAN;              /* NaN is never taken while a number is left */
          }
          float *x_d = ct_up(&e, x, total * sizeof(float));
          float *sc_d = ct_up(&e, sc, sizeof(sc));
          int32_t ids_c[17 * 8], ids_g[17 * 8];
          float w_c[17 * 8], w_g[17 * 8];
          TH_CHECK(kn_router_topk(e.cpu, ids_c, w_c, x, ld, T, E, k, scaled ? sc : NULL) == 0);
          TH_CHECK(kn_router_topk(e.gpu, ids_g, w_g, x_d, ld, T, E, k, scaled ? sc_d : NULL) == 0);
          int bad = 0;
          for (int i = 0; i < T * k; i++)
            bad += ids_c[i] != ids_g[i];
          if (bad)
            th_fail(__FILE__, __LINE__, "router_topk T=%d E=%d k=%d: %d ids differ", T, E, k, bad);
          char what[80];
          snprintf(what, sizeof(what), "router_topk weights T=%d E=%d k=%d scaled=%d", T, E, k,
                   scaled);
          /* rows with a NaN logit have NaN probabilities on both sides */
          ct_compare(what, w_c, w_g, T, k, k, (size_t)T * k, 1e-10);
          kn_free(e.gpu, x_d);
          kn_free(e.gpu, sc_d);
          free(x);
        }
  ct_close(&e);
}
