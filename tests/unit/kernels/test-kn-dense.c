/* test-kn-dense.c — the CPU backend's dense ops: SIMD against reference (NMSE,
 * NaN/Inf, sentinels), closed-form checks of the reference, batch invariance
 * of matmul (bit-exact), and argument validation. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu-impl.h"
#include "tests/unit/kernels/kn-test-util.h"

/* gelu_tanh written out from its definition, in double. */
static double gelu_closed_form(double g) {
  return 0.5 * g * (1.0 + tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)));
}

static const enum kn_dtype wdts[] = {KN_DTYPE_F32, KN_DTYPE_F16, KN_DTYPE_BF16};

/* ---- matmul ------------------------------------------------------------- */

/* One matmul on both backends into guarded outputs with row stride ldo > N. */
static void check_matmul(struct kn_backend *ref, struct kn_backend *simd, enum kn_dtype dt, int T,
                         int N, int K, int accumulate) {
  int ldi = K + 3, ldo = N + 5;
  float *in = kt_rand_f32((size_t)T * ldi, 1.0f);
  void *w = kt_rand_tensor(dt, (size_t)N * K, 0.5f);
  size_t n_out = (size_t)(T - 1) * ldo + N;
  float *o_ref = kt_guarded(n_out), *o_simd = kt_guarded(n_out);
  for (int t = 0; t < T; t++)
    for (int j = 0; j < N; j++) {
      float init = accumulate ? kt_uniform() : 0.0f;
      if (!accumulate) continue;
      o_ref[(size_t)t * ldo + j] = init;
      o_simd[(size_t)t * ldo + j] = init;
    }
  TH_CHECK_EQ_INT(kn_matmul(ref, o_ref, ldo, in, ldi, w, dt, T, N, K, accumulate), 0);
  TH_CHECK_EQ_INT(kn_matmul(simd, o_simd, ldo, in, ldi, w, dt, T, N, K, accumulate), 0);
  TH_CHECK(kt_guards_ok(o_ref, n_out));
  TH_CHECK(kt_guards_ok(o_simd, n_out));
  double worst = 0.0;
  int gaps_ok = 1;
  for (int t = 0; t < T; t++) {
    const float *a = o_simd + (size_t)t * ldo, *b = o_ref + (size_t)t * ldo;
    double e = kt_nmse(a, b, (size_t)N);
    if (e > worst) worst = e;
    if (!kt_all_finite(a, (size_t)N)) worst = INFINITY;
    if (t + 1 < T)
      for (int j = N; j < ldo; j++)
        gaps_ok &= kt_is_sentinel(a + j) && kt_is_sentinel(b + j);
  }
  TH_CHECK(gaps_ok);
  if (getenv("KT_VERBOSE"))
    printf("matmul %s T=%d N=%d K=%d nmse %g\n", kn_dtype_name(dt), T, N, K, worst);
  if (!(worst < 1e-12))
    th_fail(__FILE__, __LINE__, "matmul %s T=%d N=%d K=%d acc=%d: nmse %g", kn_dtype_name(dt), T, N,
            K, accumulate, worst);
  free(in);
  free(w);
  kt_guarded_free(o_ref);
  kt_guarded_free(o_simd);
}

TH_TEST(matmul_simd_matches_reference) {
  struct kn_backend *ref = kt_backend(KN_CPU_ISA_REF, 2), *simd = kt_backend(KN_CPU_ISA_AVX512, 2);
  static const int shapes[][3] = {{1, 1, 1},      {1, 7, 5},   {1, 64, 640}, {3, 33, 17},
                                  {8, 9, 64},     {9, 64, 31}, {37, 50, 72}, {64, 130, 256},
                                  {1, 300, 1000}, {70, 5, 9}};
  kt_seed(1);
  for (size_t d = 0; d < CM_ARRAY_LEN(wdts); d++)
    for (size_t s = 0; s < CM_ARRAY_LEN(shapes); s++)
      for (int acc = 0; acc < 2; acc++)
        check_matmul(ref, simd, wdts[d], shapes[s][0], shapes[s][1], shapes[s][2], acc);
  kn_backend_destroy(ref);
  kn_backend_destroy(simd);
}

/* A row's output alone (T = 1) equals its output inside batches of other sizes,
 * on 1 or 2 threads, on every path (matvec, tiles, edges): bit for bit. */
static void check_matmul_invariance(enum kn_cpu_isa isa) {
  /* 1 thread, and more threads than this machine likely has (late joiners) */
  struct kn_backend *be1 = kt_backend(isa, 1), *be2 = kt_backend(isa, 5);
  static const int Ks[] = {5, 64, 67, 640};
  static const int Ts[] = {2, 4, 7, 8, 9, 37, 70};
  kt_seed(2);
  for (size_t d = 0; d < CM_ARRAY_LEN(wdts); d++)
    for (size_t ki = 0; ki < CM_ARRAY_LEN(Ks); ki++) {
      int K = Ks[ki], N = 47, Tmax = 70;
      float *in = kt_rand_f32((size_t)Tmax * K, 1.0f);
      void *w = kt_rand_tensor(wdts[d], (size_t)N * K, 0.5f);
      float *alone = malloc((size_t)Tmax * N * sizeof(float));
      float *batch = malloc((size_t)Tmax * N * sizeof(float));
      TH_REQUIRE(alone && batch);
      for (int t = 0; t < Tmax; t++)
        TH_REQUIRE(kn_matmul(be1, alone + (size_t)t * N, N, in + (size_t)t * K, K, w, wdts[d], 1, N,
                             K, 0) == 0);
      for (size_t ti = 0; ti < CM_ARRAY_LEN(Ts); ti++) {
        int T = Ts[ti];
        for (int start = 0; start + T <= Tmax; start += T) {
          struct kn_backend *be = (start / T) & 1 ? be1 : be2;
          TH_REQUIRE(kn_matmul(be, batch, N, in + (size_t)start * K, K, w, wdts[d], T, N, K, 0) ==
                     0);
          if (!kt_bits_equal(batch, alone + (size_t)start * N, (size_t)T * N))
            th_fail(__FILE__, __LINE__, "%s matmul %s K=%d: rows %d..%d differ in a batch of %d",
                    kn_backend_name(be1), kn_dtype_name(wdts[d]), K, start, start + T - 1, T);
        }
      }
      /* matmul_rows computes the same elements with the same arithmetic */
      int32_t rows[3] = {46, 0, 17};
      float got[3];
      TH_REQUIRE(kn_matmul_rows(be2, got, 3, in, K, w, wdts[d], N, K, rows, 3, 1) == 0);
      TH_CHECK(got[0] == alone[46] && got[1] == alone[0] && got[2] == alone[17]);
      free(in);
      free(w);
      free(alone);
      free(batch);
    }
  kn_backend_destroy(be1);
  kn_backend_destroy(be2);
}

TH_TEST(matmul_batch_invariant_simd) {
  check_matmul_invariance(KN_CPU_ISA_AVX512);
}
TH_TEST(matmul_batch_invariant_ref) {
  check_matmul_invariance(KN_CPU_ISA_REF);
}

/* ---- each instruction set forced in turn --------------------------------- */

static struct kn_backend *isa_backend(enum kn_cpu_isa isa, int threads) {
  return kt_isa_backend_mode(isa, threads, 0);
}

/* Every 17th row of a 255-row batch bit-equal to the row alone, for each
 * weight dtype (label names the table in a failure). */
static void check_rows_alone(struct kn_backend *be, const char *label) {
  for (size_t d = 0; d < CM_ARRAY_LEN(wdts); d++) {
    int T = 255, N = 47, K = 645;
    float *in = kt_rand_f32((size_t)T * K, 1.0f);
    void *w = kt_rand_tensor(wdts[d], (size_t)N * K, 0.5f);
    float *batch = malloc(sizeof(float) * (size_t)T * N), one[47];
    TH_REQUIRE(batch);
    TH_REQUIRE(kn_matmul(be, batch, N, in, K, w, wdts[d], T, N, K, 0) == 0);
    for (int t = 0; t < T; t += 17) {
      TH_REQUIRE(kn_matmul(be, one, N, in + (size_t)t * K, K, w, wdts[d], 1, N, K, 0) == 0);
      if (!kt_bits_equal(one, batch + (size_t)t * N, (size_t)N))
        th_fail(__FILE__, __LINE__, "%s (%s) %s: row %d of 255 differs from the row alone", label,
                kn_backend_name(be), kn_dtype_name(wdts[d]), t);
    }
    free(in);
    free(w);
    free(batch);
  }
}

/* Every matmul path of one table (matvec, tile, edges; odd row counts around
 * the tile sizes, K not a multiple of 8 or 32) against the reference, and
 * each row of a 255-row batch bit-equal to the row alone. */
static void check_isa_matmul(enum kn_cpu_isa isa) {
  /* be first: it may skip the test, which must leave nothing allocated */
  struct kn_backend *be = isa_backend(isa, 2), *ref = kt_backend(KN_CPU_ISA_REF, 1);
  static const int Ts[] = {1, 11, 15, 16, 17, 255}, Ks[] = {1, 31, 33, 100, 645}, Ns[] = {7, 47, 130};
  kt_seed(7);
  for (size_t d = 0; d < CM_ARRAY_LEN(wdts); d++)
    for (size_t ti = 0; ti < CM_ARRAY_LEN(Ts); ti++)
      for (size_t ki = 0; ki < CM_ARRAY_LEN(Ks); ki++)
        for (size_t ni = 0; ni < CM_ARRAY_LEN(Ns); ni++)
          check_matmul(ref, be, wdts[d], Ts[ti], Ns[ni], Ks[ki], (int)((ti + ki + ni) & 1));
  check_rows_alone(be, kn_cpu_isa_name(isa));
  kn_backend_destroy(ref);
  kn_backend_destroy(be);
}

TH_TEST(isa_avx2_matmul_every_path) {
  check_isa_matmul(KN_CPU_ISA_AVX2);
}
TH_TEST(isa_avx512_matmul_every_path) {
  check_isa_matmul(KN_CPU_ISA_AVX512);
}

/* A processor with AVX-512-BF16 runs the AVX-512 table in the default mode. */
TH_TEST(isa_avx512bf16_default_mode_is_the_avx512_table) {
  kt_require_isa(KN_CPU_ISA_AVX512BF16);
  struct kn_backend *be = kt_backend(KN_CPU_ISA_AVX512BF16, 1);
  TH_CHECK_EQ_STR(kn_backend_name(be), "cpu-avx512");
  kn_backend_destroy(be);
}

/* ---- the bf16 mode --------------------------------------------------------- */

/* in[t, k] rounded to bf16 times W, in double, and the sum of the products'
 * magnitudes (the scale of an f32 summation's error). */
static void bf16_ref(const float *in, const void *w, enum kn_dtype dt, int t, int j, int K,
                     double *dot, double *mag) {
  double s = 0.0, a = 0.0;
  for (int k = 0; k < K; k++) {
    double p = (double)kn_bf16_to_f32(kn_f32_to_bf16(in[(size_t)t * K + k])) *
               (double)kn_load_f32(w, dt, (size_t)j * K + k);
    s += p;
    a += fabs(p);
  }
  *dot = s;
  *mag = a;
}

/* Worst |got - ref| / (sum |products| + |init|) over T x N outputs (acc:
 * ref is init plus the products). */
static double bf16_err(const float *got, const float *init, const float *in, const void *w,
                       enum kn_dtype dt, int T, int N, int K) {
  double worst = 0.0;
  for (int t = 0; t < T; t++)
    for (int j = 0; j < N; j++) {
      double dot, mag;
      bf16_ref(in, w, dt, t, j, K, &dot, &mag);
      double i0 = init ? init[(size_t)t * N + j] : 0.0;
      mag += fabs(i0);
      double e = fabs(got[(size_t)t * N + j] - (i0 + dot)) / (mag > 0 ? mag : 1.0);
      if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
  return worst;
}

/* The bf16 mode of one table: matmul (plain and accumulating), matmul_rows
 * and matmul_argmax against the rounded inputs' products in double, over odd
 * shapes; every row of a 255-row batch bit-equal to the row alone. */
static void check_bf16_backend(struct kn_backend *be, const char *label) {
  static const int Ts[] = {1, 2, 3, 5, 15, 16, 17, 255}, Ks[] = {1, 31, 32, 33, 100, 645},
                   Ns[] = {7, 47, 130};
  kt_seed(11);
  for (size_t d = 0; d < CM_ARRAY_LEN(wdts); d++)
    for (size_t ti = 0; ti < CM_ARRAY_LEN(Ts); ti++)
      for (size_t ki = 0; ki < CM_ARRAY_LEN(Ks); ki++)
        for (size_t ni = 0; ni < CM_ARRAY_LEN(Ns); ni++) {
          const enum kn_dtype dt = wdts[d];
          const int T = Ts[ti], K = Ks[ki], N = Ns[ni], acc = (int)((ti + ki + ni) & 1);
          float *in = kt_rand_f32((size_t)T * K, 1.0f);
          void *w = kt_rand_tensor(dt, (size_t)N * K, 0.5f);
          float *out = kt_rand_f32((size_t)T * N, 1.0f);
          float *init = malloc(sizeof(float) * (size_t)T * N);
          TH_REQUIRE(init);
          memcpy(init, out, sizeof(float) * (size_t)T * N);
          TH_REQUIRE(kn_matmul(be, out, N, in, K, w, dt, T, N, K, acc) == 0);
          double e = bf16_err(out, acc ? init : NULL, in, w, dt, T, N, K);
          /* f32 sums of up to 645 exact products: far below 2e-5 of their
           * magnitudes; f32 inputs instead of rounded ones miss by ~1e-3 */
          if (!(e < 2e-5))
            th_fail(__FILE__, __LINE__, "%s bf16 mode %s T=%d N=%d K=%d acc=%d: error %g", label,
                    kn_dtype_name(dt), T, N, K, acc, e);
          /* the whole rows through matmul_argmax: ids of the matmul's maxima */
          TH_REQUIRE(kn_matmul(be, out, N, in, K, w, dt, T, N, K, 0) == 0);
          int32_t *ids = malloc(sizeof(int32_t) * (size_t)T);
          TH_REQUIRE(ids);
          TH_REQUIRE(kn_matmul_argmax(be, ids, NULL, in, K, w, dt, T, N, K, 0.0f, NULL) == 0);
          for (int t = 0; t < T; t++) {
            int best = 0;
            for (int j = 1; j < N; j++)
              if (out[(size_t)t * N + j] > out[(size_t)t * N + best]) best = j;
            if (ids[t] != best)
              th_fail(__FILE__, __LINE__, "%s bf16 mode %s T=%d K=%d: argmax %d, matmul's %d",
                      label, kn_dtype_name(dt), T, K, ids[t], best);
          }
          /* matmul_rows: rows 5, 0 and N - 1 give the matmul's bits */
          const int32_t rows[3] = {5 % N, 0, N - 1};
          float sub[3 * 255];
          TH_REQUIRE(kn_matmul_rows(be, sub, 3, in, K, w, dt, N, K, rows, 3, T) == 0);
          for (int t = 0; t < T; t++)
            for (int r = 0; r < 3; r++)
              if (!kt_bits_equal(&sub[t * 3 + r], &out[(size_t)t * N + rows[r]], 1))
                th_fail(__FILE__, __LINE__, "%s bf16 mode %s T=%d K=%d: matmul_rows differs", label,
                        kn_dtype_name(dt), T, K);
          free(ids);
          free(in);
          free(w);
          free(out);
          free(init);
        }
  check_rows_alone(be, label);
}

static void check_bf16_mode(enum kn_cpu_isa isa) {
  struct kn_backend *be = kt_isa_backend_mode(isa, 2, 1);
  check_bf16_backend(be, kn_cpu_isa_name(isa));
  kn_backend_destroy(be);
}

TH_TEST(bf16_mode_ref) {
  check_bf16_mode(KN_CPU_ISA_REF);
}
TH_TEST(bf16_mode_avx2) {
  check_bf16_mode(KN_CPU_ISA_AVX2);
}
TH_TEST(bf16_mode_avx512) {
  check_bf16_mode(KN_CPU_ISA_AVX512);
}
TH_TEST(bf16_mode_avx512bf16) {
  check_bf16_mode(KN_CPU_ISA_AVX512BF16);
}
TH_TEST(bf16_mode_amx) {
  check_bf16_mode(KN_CPU_ISA_AMX);
}
/* The AMX table's layout, edges and invariance on any processor: its kernels
 * with each tile instruction emulated. */
TH_TEST(bf16_mode_amx_emulated) {
  struct kn_backend *be = NULL;
  TH_REQUIRE(kn_cpu_backend_create_amx_emulated(2, &be) == 0 && be);
  TH_CHECK_EQ_STR(kn_backend_name(be), "cpu-amx-emulated");
  check_bf16_backend(be, "amx-emulated");
  kn_backend_destroy(be);
}

/* The tiles' input layout written on AVX-512-BF16 (the AMX table's) bit-equal
 * to its C version (the emulated table's elsewhere), over every class of
 * value the rounding treats apart and token counts around the groups of 16. */
TH_TEST(amx_inputs_layout_same_bits) {
  kt_require_isa(KN_CPU_ISA_AVX512BF16); /* the layout's SIMD version */
  static const float special[] = {0.0f,      -0.0f,    1e-40f,        -1e-40f,     INFINITY,
                                  -INFINITY, NAN,      1.00390625f,   1.01171875f, -1.00390625f,
                                  3.4e38f,   65504.0f, 1.1754944e-38f};
  static const int Ts[] = {1, 15, 16, 17, 33}, Ks[] = {1, 31, 32, 33, 100};
  kt_seed(13);
  for (size_t ti = 0; ti < CM_ARRAY_LEN(Ts); ti++)
    for (size_t ki = 0; ki < CM_ARRAY_LEN(Ks); ki++) {
      const int T = Ts[ti], K = Ks[ki], row = (K + 31) & ~31, T16 = (T + 15) & ~15;
      float *in = kt_rand_f32((size_t)T * K, 4.0f);
      for (int i = 0; i < T * K; i += 7)
        in[i] = special[(size_t)i % CM_ARRAY_LEN(special)];
      uint16_t *a = malloc(2 * (size_t)T16 * row), *b = malloc(2 * (size_t)T16 * row);
      TH_REQUIRE(a && b);
      memset(a, 0xa5, 2 * (size_t)T16 * row);
      memset(b, 0x5a, 2 * (size_t)T16 * row);
      kn_cpu_amx_round_rows(a, row, in, K, T, K);
      kn_cpu_amx_round_rows_emu(b, row, in, K, T, K);
      if (memcmp(a, b, 2 * (size_t)T16 * row))
        th_fail(__FILE__, __LINE__, "T=%d K=%d: the AVX-512 layout differs from the C one", T, K);
      free(in);
      free(a);
      free(b);
    }
}

/* The default mode keeps f32 inputs: it is not the bf16 mode. */
/* The AMX table's write of a C tile (a gather per token on AVX-512) bit-equal
 * to its C version, plain and accumulating, for every count of features and
 * tokens; nothing outside them is written. */
TH_TEST(amx_output_write_same_bits) {
  kt_require_isa(KN_CPU_ISA_AVX512BF16); /* the output write's SIMD version */
  kt_seed(14);
  float *c = kt_rand_f32(256, 8.0f), *init = kt_rand_f32(16 * 20, 1.0f);
  float a[16 * 20], b[16 * 20];
  for (int acc = 0; acc < 2; acc++)
    for (int nf = 1; nf <= 16; nf++)
      for (int nt = 1; nt <= 16; nt++) {
        memcpy(a, init, sizeof(a));
        memcpy(b, init, sizeof(b));
        kn_cpu_amx_put(a, 20, c, nf, nt, acc);
        kn_cpu_amx_put_emu(b, 20, c, nf, nt, acc);
        if (!kt_bits_equal(a, b, 16 * 20))
          th_fail(__FILE__, __LINE__, "nf=%d nt=%d acc=%d: the AVX-512 write differs", nf, nt, acc);
        for (int t = 0; t < 16; t++)
          for (int f = 0; f < 20; f++)
            if ((t >= nt || f >= nf) && !kt_bits_equal(&b[t * 20 + f], &init[t * 20 + f], 1))
              th_fail(__FILE__, __LINE__, "nf=%d nt=%d: written outside the tile", nf, nt);
      }
  free(c);
  free(init);
}

/* The AMX table's edge tiles (rows past n, k past K: zeros), read with
 * masked loads, bit-equal to the C version's copies for every count of rows
 * and of k, the block at a matrix's very end. */
TH_TEST(amx_edge_tiles_same_bits) {
  kt_require_isa(KN_CPU_ISA_AVX512BF16); /* the edge tiles' SIMD version */
  const int K = 45;
  /* the block's last row ends right before a page that faults when read */
  const size_t page = (size_t)sysconf(_SC_PAGESIZE), bytes = 2 * 16 * (size_t)K;
  char *map = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TH_REQUIRE(map != MAP_FAILED && mprotect(map + page, page, PROT_NONE) == 0);
  uint16_t *w = (uint16_t *)(map + page - bytes);
  for (int i = 0; i < 16 * K; i++)
    w[i] = (uint16_t)(0x3f80 + i);
  _Alignas(64) uint16_t a[512], b[512];
  for (int nr = 1; nr <= 16; nr++)
    for (int k0 = 0; k0 < K; k0 += 32) {
      memset(a, 0x55, sizeof(a));
      memset(b, 0xaa, sizeof(b));
      kn_cpu_amx_edge(a, w + k0 + (size_t)(16 - nr) * K, K, nr, K - k0);
      kn_cpu_amx_edge_emu(b, w + k0 + (size_t)(16 - nr) * K, K, nr, K - k0);
      if (memcmp(a, b, sizeof(a)))
        th_fail(__FILE__, __LINE__, "nr=%d k0=%d: the masked edge differs", nr, k0);
    }
  munmap(map, 2 * page);
}

TH_TEST(bf16_mode_differs_from_the_default) {
  struct kn_backend *f = kt_backend(KN_CPU_ISA_REF, 1), *b = NULL;
  TH_REQUIRE(kn_cpu_backend_create_mode(1, KN_CPU_ISA_REF, 1, &b) == 0);
  kt_seed(12);
  int T = 3, N = 16, K = 100;
  float *in = kt_rand_f32((size_t)T * K, 1.0f);
  void *w = kt_rand_tensor(KN_DTYPE_BF16, (size_t)N * K, 0.5f);
  float of[48], ob[48];
  TH_REQUIRE(kn_matmul(f, of, N, in, K, w, KN_DTYPE_BF16, T, N, K, 0) == 0);
  TH_REQUIRE(kn_matmul(b, ob, N, in, K, w, KN_DTYPE_BF16, T, N, K, 0) == 0);
  TH_CHECK(bf16_err(ob, NULL, in, w, KN_DTYPE_BF16, T, N, K) < 2e-5);
  TH_CHECK(bf16_err(of, NULL, in, w, KN_DTYPE_BF16, T, N, K) > 2e-5);
  free(in);
  free(w);
  kn_backend_destroy(f);
  kn_backend_destroy(b);
}

/* The AVX2 and AVX-512 tables give the same bits (kn-cpu.h), for every path. */
TH_TEST(isa_avx2_and_avx512_give_the_same_bits) {
  struct kn_backend *a = isa_backend(KN_CPU_ISA_AVX512, 2), *b = kt_backend(KN_CPU_ISA_AVX2, 2);
  static const int Ts[] = {1, 2, 4, 11, 15, 16, 17, 64, 255}, Ks[] = {31, 64, 645};
  kt_seed(8);
  for (size_t d = 0; d < CM_ARRAY_LEN(wdts); d++)
    for (size_t ti = 0; ti < CM_ARRAY_LEN(Ts); ti++)
      for (size_t ki = 0; ki < CM_ARRAY_LEN(Ks); ki++) {
        int T = Ts[ti], K = Ks[ki], N = 47;
        float *in = kt_rand_f32((size_t)T * K, 1.0f);
        void *w = kt_rand_tensor(wdts[d], (size_t)N * K, 0.5f);
        float *oa = malloc(sizeof(float) * (size_t)T * N),
              *ob = malloc(sizeof(float) * (size_t)T * N);
        TH_REQUIRE(oa && ob);
        TH_REQUIRE(kn_matmul(a, oa, N, in, K, w, wdts[d], T, N, K, 0) == 0);
        TH_REQUIRE(kn_matmul(b, ob, N, in, K, w, wdts[d], T, N, K, 0) == 0);
        if (!kt_bits_equal(oa, ob, (size_t)T * N))
          th_fail(__FILE__, __LINE__, "%s T=%d K=%d: the AVX2 and AVX-512 tables differ",
                  kn_dtype_name(wdts[d]), T, K);
        free(in);
        free(w);
        free(oa);
        free(ob);
      }
  kn_backend_destroy(a);
  kn_backend_destroy(b);
}

/* kn_matmul_softcap is kn_matmul then kn_softcap of the rows, bit for bit,
 * on every path (matvec, tiles, edges) and both kernel sets; strided rows
 * keep their gaps. */
TH_TEST(matmul_softcap_is_matmul_then_softcap) {
  static const int shapes[][3] = {{1, 47, 64},  {3, 33, 17},   {4, 260, 64}, {12, 47, 64},
                                  {37, 50, 72}, {32, 300, 64}, {2, 9, 0}};
  kt_seed(11);
  for (int isa = 0; isa < 2; isa++) {
    struct kn_backend *be = kt_backend(isa ? KN_CPU_ISA_AVX512 : KN_CPU_ISA_REF, 2);
    for (size_t d = 0; d < CM_ARRAY_LEN(wdts); d++)
      for (size_t si = 0; si < CM_ARRAY_LEN(shapes); si++) {
        int T = shapes[si][0], N = shapes[si][1], K = shapes[si][2], ldo = N + 3;
        float *in = kt_rand_f32((size_t)T * (K + 1), 4.0f);
        void *w = kt_rand_tensor(wdts[d], (size_t)N * (K + 1), 2.0f);
        size_t n = (size_t)(T - 1) * ldo + N;
        float *a = kt_guarded(n), *b = kt_guarded(n);
        TH_REQUIRE(kn_matmul(be, a, ldo, in, K, w, wdts[d], T, N, K, 0) == 0);
        for (int t = 0; t < T; t++)
          TH_REQUIRE(kn_softcap(be, a + (size_t)t * ldo, a + (size_t)t * ldo, 1.5f, (size_t)N) ==
                     0);
        TH_REQUIRE(kn_matmul_softcap(be, b, ldo, in, K, w, wdts[d], T, N, K, 1.5f) == 0);
        TH_CHECK(kt_guards_ok(a, n) && kt_guards_ok(b, n));
        for (int t = 0; t < T; t++) {
          if (!kt_bits_equal(a + (size_t)t * ldo, b + (size_t)t * ldo, (size_t)N))
            th_fail(__FILE__, __LINE__, "%s %s T=%d N=%d K=%d: row %d differs", kn_backend_name(be),
                    kn_dtype_name(wdts[d]), T, N, K, t);
          if (t + 1 < T) TH_CHECK(kt_is_sentinel(b + (size_t)t * ldo + N));
        }
        /* saturated: |o| far above the cap gives +-cap */
        TH_CHECK(fabsf(b[0]) <= 1.5f);
        free(in);
        free(w);
        kt_guarded_free(a);
        kt_guarded_free(b);
      }
    float o;
    TH_CHECK_EQ_INT(kn_matmul_softcap(be, &o, 1, &o, 1, &o, KN_DTYPE_F32, 1, 1, 1, 0.0f),
                    CM_ERR_INVAL);
    kn_backend_destroy(be);
  }
}

TH_TEST(matmul_reference_closed_form) {
  struct kn_backend *ref = kt_backend(KN_CPU_ISA_REF, 1);
  /* [[1,2],[3,4]] x W rows (1,0),(0,1),(1,1) */
  float in[4] = {1, 2, 3, 4}, w[6] = {1, 0, 0, 1, 1, 1}, out[6];
  TH_REQUIRE(kn_matmul(ref, out, 3, in, 2, w, KN_DTYPE_F32, 2, 3, 2, 0) == 0);
  float want[6] = {1, 2, 3, 3, 4, 7};
  TH_CHECK(memcmp(out, want, sizeof(want)) == 0);
  TH_REQUIRE(kn_matmul(ref, out, 3, in, 2, w, KN_DTYPE_F32, 2, 3, 2, 1) == 0);
  TH_CHECK(out[5] == 14.0f && out[0] == 2.0f);
  kn_backend_destroy(ref);
}

/* ---- RMSNorm ------------------------------------------------------------ */

TH_TEST(rmsnorm_modes) {
  struct kn_backend *ref = kt_backend(KN_CPU_ISA_REF, 1), *simd = kt_backend(KN_CPU_ISA_AVX512, 2);
  /* closed form: x = (3, 4), mean square 12.5 */
  float x[2] = {3, 4}, w[2] = {1, -0.5f}, o[2];
  float r = (float)(1.0 / sqrt(12.5 + 1e-6));
  TH_REQUIRE(kn_rmsnorm(ref, o, 2, x, 2, 1, 2, NULL, KN_DTYPE_F32, 1e-6f, KN_NORM_NO_W) == 0);
  TH_CHECK_NEAR(o[0], 3 * r, 1e-6);
  TH_CHECK_NEAR(o[1], 4 * r, 1e-6);
  TH_REQUIRE(kn_rmsnorm(ref, o, 2, x, 2, 1, 2, w, KN_DTYPE_F32, 1e-6f, KN_NORM_MUL_W) == 0);
  TH_CHECK_NEAR(o[1], -2 * r, 1e-6);
  TH_REQUIRE(kn_rmsnorm(ref, o, 2, x, 2, 1, 2, w, KN_DTYPE_F32, 1e-6f, KN_NORM_MUL_ONE_PLUS_W) ==
             0);
  TH_CHECK_NEAR(o[0], 6 * r, 1e-6);
  TH_CHECK_NEAR(o[1], 2 * r, 1e-6);

  kt_seed(3);
  static const int ds[] = {1, 7, 64, 256, 517, 640};
  for (size_t di = 0; di < CM_ARRAY_LEN(ds); di++)
    for (size_t dt = 0; dt < CM_ARRAY_LEN(wdts); dt++)
      for (int mode = 0; mode < 3; mode++) {
        int d = ds[di], rows = 37, ld = d + 2;
        float *in = kt_rand_f32((size_t)rows * ld, 3.0f);
        void *wt = kt_rand_tensor(wdts[dt], (size_t)d, 1.0f);
        size_t n = (size_t)(rows - 1) * ld + d;
        float *a = kt_guarded(n), *b = kt_guarded(n);
        TH_REQUIRE(kn_rmsnorm(ref, a, ld, in, ld, rows, d, wt, wdts[dt], 1e-6f, mode) == 0);
        TH_REQUIRE(kn_rmsnorm(simd, b, ld, in, ld, rows, d, wt, wdts[dt], 1e-6f, mode) == 0);
        TH_CHECK(kt_guards_ok(a, n) && kt_guards_ok(b, n));
        for (int rr = 0; rr < rows; rr++) {
          double e = kt_nmse(b + (size_t)rr * ld, a + (size_t)rr * ld, (size_t)d);
          if (!(e < 1e-12)) th_fail(__FILE__, __LINE__, "rmsnorm d=%d mode=%d nmse %g", d, mode, e);
        }
        /* in place equals out of place */
        TH_REQUIRE(kn_rmsnorm(simd, in, ld, in, ld, rows, d, wt, wdts[dt], 1e-6f, mode) == 0);
        TH_CHECK(kt_rows_equal(in, ld, b, ld, rows, d));
        free(in);
        free(wt);
        kt_guarded_free(a);
        kt_guarded_free(b);
      }
  kn_backend_destroy(ref);
  kn_backend_destroy(simd);
}

/* ---- elementwise -------------------------------------------------------- */

TH_TEST(elementwise_ops) {
  struct kn_backend *ref = kt_backend(KN_CPU_ISA_REF, 1), *simd = kt_backend(KN_CPU_ISA_AVX512, 2);
  kt_seed(4);
  static const size_t ns[] = {1, 7, 8, 100, 100003};
  for (size_t ni = 0; ni < CM_ARRAY_LEN(ns); ni++) {
    size_t n = ns[ni];
    float *a = kt_rand_f32(n, 8.0f), *b = kt_rand_f32(n, 8.0f);
    float *r = kt_guarded(n), *s = kt_guarded(n);
    /* add, mul, scale are exact: identical bits */
    TH_REQUIRE(kn_add(ref, r, a, b, n) == 0 && kn_add(simd, s, a, b, n) == 0);
    TH_CHECK(kt_bits_equal(r, s, n) && r[0] == a[0] + b[0]);
    TH_REQUIRE(kn_mul(ref, r, a, b, n) == 0 && kn_mul(simd, s, a, b, n) == 0);
    TH_CHECK(kt_bits_equal(r, s, n) && r[n - 1] == a[n - 1] * b[n - 1]);
    TH_REQUIRE(kn_scale(ref, r, a, 0.125f, n) == 0 && kn_scale(simd, s, a, 0.125f, n) == 0);
    TH_CHECK(kt_bits_equal(r, s, n) && r[0] == a[0] * 0.125f);
    /* softcap: tanh(x / c) * c, approximated in SIMD */
    TH_REQUIRE(kn_softcap(ref, r, a, 3.0f, n) == 0 && kn_softcap(simd, s, a, 3.0f, n) == 0);
    TH_CHECK(kt_nmse(s, r, n) < 1e-12);
    TH_CHECK_NEAR(r[0], tanh(a[0] / 3.0) * 3.0, 1e-6);
    /* gelu_tanh(gate) * up as [T, N] rows */
    TH_REQUIRE(kn_gelu_mul(ref, r, 1, a, 1, b, 1, 1, (int)n) == 0);
    TH_REQUIRE(kn_gelu_mul(simd, s, 1, a, 1, b, 1, 1, (int)n) == 0);
    TH_CHECK(kt_nmse(s, r, n) < 1e-12);
    TH_CHECK(kt_guards_ok(r, n) && kt_guards_ok(s, n));
    /* in place: out == a */
    TH_REQUIRE(kn_add(ref, r, a, b, n) == 0);
    TH_REQUIRE(kn_add(simd, a, a, b, n) == 0);
    TH_CHECK(kt_bits_equal(a, r, n));
    free(a);
    free(b);
    kt_guarded_free(r);
    kt_guarded_free(s);
  }
  /* gelu_mul over strided [T, N] rows: every row as the reference, gaps untouched */
  {
    int T = 5, N = 37, ldg = 80, ldu = 90, ldo = 41;
    float *g = kt_rand_f32((size_t)T * ldg, 6.0f), *u = kt_rand_f32((size_t)T * ldu, 2.0f);
    size_t n = (size_t)(T - 1) * ldo + N;
    float *r = kt_guarded(n), *s = kt_guarded(n);
    TH_REQUIRE(kn_gelu_mul(ref, r, ldo, g, ldg, u, ldu, T, N) == 0);
    TH_REQUIRE(kn_gelu_mul(simd, s, ldo, g, ldg, u, ldu, T, N) == 0);
    TH_CHECK(kt_guards_ok(r, n) && kt_guards_ok(s, n));
    for (int t = 0; t < T; t++) {
      TH_CHECK(kt_nmse(s + t * ldo, r + t * ldo, (size_t)N) < 1e-12);
      if (t + 1 < T) TH_CHECK(kt_is_sentinel(s + t * ldo + N) && kt_is_sentinel(r + t * ldo + N));
      TH_CHECK_NEAR(r[t * ldo], gelu_closed_form(g[t * ldg]) * u[t * ldu], 1e-6);
    }
    free(g);
    free(u);
    kt_guarded_free(r);
    kt_guarded_free(s);
  }
  /* hand values of gelu_tanh: 0 -> 0, large -> identity, very negative -> 0 */
  float g[4] = {0.0f, 10.0f, -10.0f, 1.0f}, u[4] = {1, 1, 1, 1}, o[4];
  TH_REQUIRE(kn_gelu_mul(simd, o, 4, g, 4, u, 4, 1, 4) == 0);
  TH_CHECK(o[0] == 0.0f);
  TH_CHECK_NEAR(o[1], 10.0, 1e-5);
  TH_CHECK_NEAR(o[2], 0.0, 1e-6);
  TH_CHECK_NEAR(o[3], 0.8411919906082768, 1e-6);
  /* softcap saturates at +-cap, keeps NaN out of finite input */
  float big[3] = {1e30f, -1e30f, 0.0f};
  TH_REQUIRE(kn_softcap(simd, o, big, 30.0f, 3) == 0);
  TH_CHECK(o[0] == 30.0f && o[1] == -30.0f && o[2] == 0.0f);
  kn_backend_destroy(ref);
  kn_backend_destroy(simd);
}

/* kn_matmul_argmax gives kn_matmul(_softcap) then kn_argmax's answers (index
 * and maximum, bit for bit) on every path: matvec, tiles, 16 tokens across
 * the lanes, several work units, both kernel sets, with and without the
 * softcap. Rows 3, 5 and N - 2 are the same weights scaled up so that they
 * tie for the maximum within a unit and across units (the first must win); a
 * NaN weight makes feature 0 NaN for every token (a unit's first row);
 * token 1's outputs are large (softcapped, many tie at the cap with different
 * raw values), token 2's are all NaN (its answer: 0 and NaN, as kn_argmax
 * gives for a row of NaN), token 3's are NaN but for -inf at feature 7 and
 * the rare +inf. */
static void check_matmul_argmax(struct kn_backend *be, enum kn_dtype dt, int T, int N, int K,
                                float cap) {
  float *in = kt_rand_f32((size_t)T * (K + 2), 1.0f);
  void *w = kt_rand_tensor(dt, (size_t)N * K, 0.5f);
  for (int k = 0; k < K; k++) {
    float v = 3.0f * kn_load_f32(w, dt, (size_t)3 * K + k);
    kn_store_f32(w, dt, (size_t)3 * K + k, v);
    kn_store_f32(w, dt, (size_t)(N - 2) * K + k, v);
    if (N > 8) kn_store_f32(w, dt, (size_t)5 * K + k, v);
  }
  if (K > 0) kn_store_f32(w, dt, (size_t)K / 2, NAN);
  if (N > 8) /* row 7 all negative: -inf for token 3 */
    for (int k = 0; k < K; k++)
      kn_store_f32(w, dt, (size_t)7 * K + k, -0.25f - fabsf(kn_load_f32(w, dt, (size_t)7 * K + k)));
  for (int k = 0; k < K; k++) {
    if (T > 1) in[(size_t)1 * (K + 2) + k] *= 1e4f; /* softcapped: many ties at +-cap */
    if (T > 2) in[(size_t)2 * (K + 2) + k] = NAN;
    if (T > 3) in[(size_t)3 * (K + 2) + k] = INFINITY; /* NaN (mixed signs) or +-inf */
  }
  float *logits = malloc(sizeof(float) * (size_t)T * N),
        *scratch = malloc(sizeof(float) * (size_t)T * N);
  int32_t *ids_a = malloc(sizeof(int32_t) * T), *ids_b = malloc(sizeof(int32_t) * T);
  float *max_a = malloc(sizeof(float) * T), *max_b = malloc(sizeof(float) * T);
  TH_REQUIRE(logits && scratch && ids_a && ids_b && max_a && max_b);
  if (cap > 0.0f)
    TH_REQUIRE(kn_matmul_softcap(be, logits, N, in, K + 2, w, dt, T, N, K, cap) == 0);
  else
    TH_REQUIRE(kn_matmul(be, logits, N, in, K + 2, w, dt, T, N, K, 0) == 0);
  TH_REQUIRE(kn_argmax(be, ids_a, max_a, logits, N, T, N) == 0);
  TH_REQUIRE(kn_matmul_argmax(be, ids_b, max_b, in, K + 2, w, dt, T, N, K, cap, scratch) == 0);
  for (int t = 0; t < T; t++) {
    int same_max = isnan(max_a[t]) ? isnan(max_b[t]) : kt_bits_equal(&max_a[t], &max_b[t], 1);
    if (ids_a[t] != ids_b[t] || !same_max)
      th_fail(__FILE__, __LINE__,
              "%s %s T=%d N=%d K=%d cap=%g: token %d gives %d (%g), not %d (%g)",
              kn_backend_name(be), kn_dtype_name(dt), T, N, K, cap, t, ids_b[t], max_b[t], ids_a[t],
              max_a[t]);
  }
  free(in);
  free(w);
  free(logits);
  free(scratch);
  free(ids_a);
  free(ids_b);
  free(max_a);
  free(max_b);
}

/* check(be, ...) for every weight dtype, every shape {T, N, K} and the
 * softcaps 0 and 30. */
static void each_head_case(struct kn_backend *be, const int (*shapes)[3], size_t n_shapes,
                           void (*check)(struct kn_backend *, enum kn_dtype, int, int, int,
                                         float)) {
  for (size_t d = 0; d < CM_ARRAY_LEN(wdts); d++)
    for (size_t si = 0; si < n_shapes; si++)
      for (int c = 0; c < 2; c++)
        check(be, wdts[d], shapes[si][0], shapes[si][1], shapes[si][2], c ? 30.0f : 0.0f);
}

TH_TEST(matmul_argmax_is_matmul_then_argmax) {
  static const int shapes[][3] = {{1, 47, 64},    {3, 33, 17},   {8, 260, 64},    {16, 47, 64},
                                  {32, 9000, 64}, {37, 300, 67}, {20, 700, 640},  {4, 5, 0},
                                  {1, 40000, 64}, {20, 500, 88}, {64, 3000, 512}, {12, 3000, 640},
                                  {16, 300, 1152}};
  kt_seed(12);
  for (int isa = 0; isa < 2; isa++) {
    struct kn_backend *be = kt_backend(isa ? KN_CPU_ISA_AVX512 : KN_CPU_ISA_REF, 2);
    each_head_case(be, shapes, CM_ARRAY_LEN(shapes), check_matmul_argmax);
    kn_backend_destroy(be);
  }
}

/* kn_matmul_argmax_masked: each row's first maximum among the outputs its mask
 * allows (rows without a mask: all), the same token as the logits written by
 * kn_matmul (_softcap) and drawn by a greedy kn_sample with that mask, on every
 * table, in the bf16 mode too; a row allowing nothing gets -1. */
static void check_argmax_masked(struct kn_backend *be, enum kn_dtype dt, int T, int N, int K,
                                float cap) {
  float *in = kt_rand_f32((size_t)T * K, 1.0f);
  void *w = kt_rand_tensor(dt, (size_t)N * K, 0.5f);
  for (int k = 0; k < K; k++) /* ties: rows 3 and N - 2 alike */
    kn_store_f32(w, dt, (size_t)(N - 2) * K + k, kn_load_f32(w, dt, (size_t)3 * K + k));
  size_t words = ((size_t)N + 31) / 32;
  uint32_t *bits = calloc((size_t)T * words, sizeof(uint32_t));
  const uint32_t **allow = malloc(sizeof(*allow) * (size_t)T);
  float *logits = malloc(sizeof(float) * (size_t)T * N);
  int32_t *ids = malloc(sizeof(int32_t) * T);
  TH_REQUIRE(in && w && bits && allow && logits && ids);
  for (int t = 0; t < T; t++) {
    uint32_t *b = bits + (size_t)t * words;
    /* no mask, sparse, dense, the tie pair only, all but a few, a window of 40;
     * at T = 48 only the last two, so that most blocks of rows are allowed by
     * no row at all (the greedy head skips them) */
    int kind = T == 48 ? (t % 2 ? 3 : 5) : t % 5;
    for (int n = 0; n < N; n++)
      if ((kind == 1 && kt_int(9) == 0) || (kind == 2 && kt_int(5) != 0) ||
          (kind == 3 && (n == 3 || n == N - 2)) || (kind == 4 && (n < 40 || n >= 47)) ||
          (kind == 5 && n >= N / 2 && n < N / 2 + 40))
        b[n / 32] |= 1u << (n % 32);
    if (kind == 1) b[0] |= 1; /* never empty */
    allow[t] = kind ? b : NULL;
  }
  if (cap > 0.0f)
    TH_REQUIRE(kn_matmul_softcap(be, logits, N, in, K, w, dt, T, N, K, cap) == 0);
  else
    TH_REQUIRE(kn_matmul(be, logits, N, in, K, w, dt, T, N, K, 0) == 0);
  TH_REQUIRE(kn_matmul_argmax_masked(be, ids, NULL, in, K, w, dt, T, N, K, cap, allow) == 0);
  for (int t = 0; t < T; t++) {
    struct kn_sample_params p;
    kn_sample_params_default(&p);
    p.temperature = 0.0f;
    p.allow = allow[t];
    struct kn_sample_out o;
    TH_REQUIRE(kn_sample(be, &o, logits + (size_t)t * N, N, 1, N, &p) == 0);
    if (o.token != ids[t])
      th_fail(__FILE__, __LINE__, "%s %s T=%d N=%d K=%d cap=%g: row %d gives %d, not %d",
              kn_backend_name(be), kn_dtype_name(dt), T, N, K, cap, t, ids[t], o.token);
  }
  if (T > 1) { /* a row that allows nothing: -1, NaN */
    memset(bits + words, 0, sizeof(uint32_t) * words);
    allow[1] = bits + words;
    float mx[64];
    TH_REQUIRE(T <= 64 &&
               kn_matmul_argmax_masked(be, ids, mx, in, K, w, dt, T, N, K, cap, allow) == 0);
    TH_CHECK(ids[1] == -1 && isnan(mx[1]));
  }
  free(in), free(w), free(bits), free(allow), free(logits), free(ids);
}

TH_TEST(matmul_argmax_masked_is_the_masked_greedy_draw) {
  static const int shapes[][3] = {{1, 47, 64},   {3, 330, 17},   {8, 2600, 64},  {20, 700, 640},
                                  {37, 300, 67}, {64, 3000, 64}, {48, 5000, 64}, {17, 4099, 40}};
  kt_seed(21);
  for (int mode = 0; mode < 3; mode++) {
    enum kn_cpu_isa isa = mode == 0 ? KN_CPU_ISA_REF : kt_vector_isa();
    struct kn_backend *be = kt_isa_backend_mode(isa, 2, mode == 2);
    each_head_case(be, shapes, CM_ARRAY_LEN(shapes), check_argmax_masked);
    kn_backend_destroy(be);
  }
}

/* The AVX-512 softcap is monotone non-decreasing over every float (matmul's
 * greedy head skips the softcap of outputs whose raw value is not above the
 * raw value of the maximum so far, kn-cpu-avx512.c tok_argmax): every
 * non-negative float in order with cap 1 (so the kernel's tanh sees the value
 * itself), and negative ones mirror them exactly. The sanitizer tree, where
 * the sweep takes minutes, checks every 16th float (the same kernel code:
 * the full sweep runs in the plain tree). */
TH_TEST(softcap_is_monotone) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_AVX512, 1);
#ifdef __SANITIZE_ADDRESS__
  const uint32_t step = 16;
#else
  const uint32_t step = 1;
#endif
  const uint32_t chunk = 1u << 20, end = 0x7f800000u; /* +inf */
  uint32_t *bits = malloc(sizeof(uint32_t) * chunk);
  float *x = malloc(sizeof(float) * chunk), *y = malloc(sizeof(float) * chunk);
  TH_REQUIRE(bits && x && y);
  float prev = 0.0f;
  uint32_t bad = 0, first_bad = 0, odd_bad = 0;
  for (uint32_t b0 = 0; b0 <= end; b0 += chunk * step) {
    /* chunk floats from b0 at the step, the last one +inf */
    uint32_t n = (end - b0) / step + 1 < chunk ? (end - b0) / step + 1 : chunk;
    for (uint32_t i = 0; i < n; i++)
      bits[i] = b0 + i * step;
    if (b0 + (uint64_t)chunk * step > end) bits[n - 1] = end;
    memcpy(x, bits, sizeof(float) * n);
    TH_REQUIRE(kn_softcap(be, y, x, 1.0f, n) == 0);
    for (uint32_t i = 0; i < n; i++) {
      if (y[i] < prev && !bad++) first_bad = bits[i];
      prev = y[i];
    }
    for (uint32_t i = 0; i < n; i += 4099) /* odd: f(-x) = -f(x) */
      x[i] = -x[i];
    TH_REQUIRE(kn_softcap(be, x, x, 1.0f, n) == 0);
    for (uint32_t i = 0; i < n; i += 4099)
      odd_bad += x[i] != -y[i];
  }
  if (bad)
    th_fail(__FILE__, __LINE__, "softcap decreases at %u floats, first at 0x%08x", bad, first_bad);
  TH_CHECK_EQ_INT((int)odd_bad, 0);
  TH_CHECK(prev == 1.0f);
  free(bits);
  free(x);
  free(y);
  kn_backend_destroy(be);
}

/* Elementwise results do not depend on where an element sits in the call
 * (vector body or tail, which thread): a row alone equals the same row inside
 * a longer, differently aligned call, bit for bit. */
TH_TEST(elementwise_batch_invariant) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_AVX512, 2);
  kt_seed(7);
  int V = 1003, T = 70;
  float *x = kt_rand_f32((size_t)T * V, 40.0f), *u = kt_rand_f32((size_t)T * V, 1.0f);
  float *all = malloc(sizeof(float) * (size_t)T * V), *one = malloc(sizeof(float) * V);
  TH_REQUIRE(all && one);
  TH_REQUIRE(kn_softcap(be, all, x, 30.0f, (size_t)T * V) == 0);
  int bad = 0;
  for (int t = 0; t < T; t += 7) {
    TH_REQUIRE(kn_softcap(be, one, x + (size_t)t * V, 30.0f, (size_t)V) == 0);
    bad += !kt_bits_equal(one, all + (size_t)t * V, (size_t)V);
  }
  TH_REQUIRE(kn_gelu_mul(be, all, V, x, V, u, V, T, V) == 0);
  for (int t = 0; t < T; t += 7) {
    TH_REQUIRE(kn_gelu_mul(be, one, V, x + (size_t)t * V, V, u + (size_t)t * V, V, 1, V) == 0);
    bad += !kt_bits_equal(one, all + (size_t)t * V, (size_t)V);
  }
  TH_CHECK_EQ_INT(bad, 0);
  free(x);
  free(u);
  free(all);
  free(one);
  kn_backend_destroy(be);
}

/* ---- embedding, copy_rows ------------------------------------------------ */

TH_TEST(embed_gathers_and_scales) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_AVX512, 2);
  kt_seed(5);
  for (size_t dt = 0; dt < CM_ARRAY_LEN(wdts); dt++) {
    int V = 50, H = 19, T = 4, ld = 23;
    void *table = kt_rand_tensor(wdts[dt], (size_t)V * H, 1.0f);
    int32_t ids[4] = {3, 49, 0, 3};
    size_t n = (size_t)(T - 1) * ld + H;
    float *o = kt_guarded(n);
    TH_REQUIRE(kn_embed(be, o, ld, table, wdts[dt], V, H, ids, T, 25.25f) == 0);
    TH_CHECK(kt_guards_ok(o, n));
    for (int t = 0; t < T; t++)
      for (int h = 0; h < H; h++)
        TH_CHECK(o[t * ld + h] == kn_load_f32(table, wdts[dt], (size_t)ids[t] * H + h) * 25.25f);
    TH_CHECK(kt_is_sentinel(o + H)); /* the gap between rows is untouched */
    int32_t bad[2] = {1, 50};
    TH_CHECK_EQ_INT(kn_embed(be, o, ld, table, wdts[dt], V, H, bad, 2, 1.0f), CM_ERR_RANGE);
    bad[1] = -2;
    TH_CHECK_EQ_INT(kn_embed(be, o, ld, table, wdts[dt], V, H, bad, 2, 1.0f), CM_ERR_RANGE);
    /* -1: a row another tensor-parallel rank holds, written as zeros */
    int32_t part[2] = {-1, 7};
    for (int h = 0; h < H; h++)
      o[h] = 9.0f;
    TH_REQUIRE(kn_embed(be, o, ld, table, wdts[dt], V, H, part, 2, 2.0f) == 0);
    for (int h = 0; h < H; h++) {
      TH_CHECK(o[h] == 0.0f);
      TH_CHECK(o[ld + h] == kn_load_f32(table, wdts[dt], (size_t)7 * H + h) * 2.0f);
    }
    TH_CHECK(kt_guards_ok(o, n));
    free(table);
    kt_guarded_free(o);
  }
  float src[6] = {1, 2, 3, 4, 5, 6}, dst[8] = {0};
  TH_REQUIRE(kn_copy_rows(be, dst, 4, src, 3, 2, 2) == 0);
  TH_CHECK(dst[0] == 1 && dst[1] == 2 && dst[2] == 0 && dst[4] == 4 && dst[5] == 5);
  kn_backend_destroy(be);
}

/* ---- argmax and router -------------------------------------------------- */

TH_TEST(argmax_first_max_and_nan) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_AVX512, 2);
  float l[3][5] = {{1, 5, 2, 5, 0}, {NAN, -1, -3, NAN, -1}, {NAN, NAN, NAN, NAN, NAN}};
  int32_t ids[3];
  float mx[3];
  TH_REQUIRE(kn_argmax(be, ids, mx, &l[0][0], 5, 3, 5) == 0);
  TH_CHECK_EQ_INT(ids[0], 1);
  TH_CHECK(mx[0] == 5.0f);
  TH_CHECK_EQ_INT(ids[1], 1);
  TH_CHECK_EQ_INT(ids[2], 0);
  TH_CHECK(isnan(mx[2]));
  kn_backend_destroy(be);
}

TH_TEST(router_topk_hand_values) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_AVX512, 1);
  /* logits ln(1), ln(4), ln(2), ln(4), ln(1): probabilities 1/12, 4/12, 2/12, 4/12, 1/12 */
  float l[5] = {0.0f, logf(4), logf(2), logf(4), 0.0f};
  int32_t ids[3];
  float w[3];
  TH_REQUIRE(kn_router_topk(be, ids, w, l, 5, 1, 5, 3, NULL) == 0);
  TH_CHECK(ids[0] == 1 && ids[1] == 3 && ids[2] == 2); /* tie: lower index first */
  TH_CHECK_NEAR(w[0], 0.4, 1e-6);
  TH_CHECK_NEAR(w[1], 0.4, 1e-6);
  TH_CHECK_NEAR(w[2], 0.2, 1e-6);
  float scale[5] = {1, 2, 3, 0.5f, 1};
  TH_REQUIRE(kn_router_topk(be, ids, w, l, 5, 1, 5, 2, scale) == 0);
  TH_CHECK_NEAR(w[0], 1.0, 1e-6);  /* 0.5 * 2 */
  TH_CHECK_NEAR(w[1], 0.25, 1e-6); /* 0.5 * 0.5 */
  TH_CHECK_EQ_INT(kn_router_topk(be, ids, w, l, 5, 1, 5, 6, NULL), CM_ERR_INVAL);
  kn_backend_destroy(be);
}

/* ---- RoPE --------------------------------------------------------------- */

TH_TEST(rope_closed_form) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_AVX512, 2);
  kt_seed(6);
  int T = 3, heads = 2, D = 8, ld = heads * D + 4;
  float *x = kt_rand_f32((size_t)T * ld, 1.0f), *x0 = kt_rand_f32((size_t)T * ld, 1.0f);
  memcpy(x0, x, (size_t)T * ld * sizeof(float));
  float inv_freq[4] = {1.0f, 0.5f, 0.0f, 0.25f}; /* a zero entry is the identity */
  int32_t pos[3] = {0, 1, 7};
  TH_REQUIRE(kn_rope(be, x, ld, T, heads, D, pos, inv_freq) == 0);
  /* position 0 is the identity */
  TH_CHECK(kt_bits_equal(x, x0, (size_t)heads * D));
  for (int t = 1; t < T; t++)
    for (int h = 0; h < heads; h++)
      for (int i = 0; i < D / 2; i++) {
        const float *a = x0 + t * ld + h * D, *b = x + t * ld + h * D;
        double ang = (double)((float)pos[t] * inv_freq[i]);
        TH_CHECK_NEAR(b[i], a[i] * cos(ang) - a[i + D / 2] * sin(ang), 1e-6);
        TH_CHECK_NEAR(b[i + D / 2], a[i + D / 2] * cos(ang) + a[i] * sin(ang), 1e-6);
        if (i == 2) TH_CHECK(b[i] == a[i] && b[i + D / 2] == a[i + D / 2]);
      }
  /* the padding after the heads is untouched */
  TH_CHECK(x[ld - 1] == x0[ld - 1]);
  /* rotation keeps each pair's norm */
  int32_t badpos[1] = {-1};
  TH_CHECK_EQ_INT(kn_rope(be, x, ld, 1, heads, D, badpos, inv_freq), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(kn_rope(be, x, ld, 1, heads, 7, pos, inv_freq), CM_ERR_INVAL);
  free(x);
  free(x0);
  kn_backend_destroy(be);
}

/* The CPU backend keeps the last two frequency tables' cos and sin for the
 * positions they were asked for, matched by contents: a call after any
 * history gives the bits a new backend gives, whether its table and positions
 * were held, changed in place at the same address, or evicted. */
TH_TEST(rope_cache_same_bits_as_cold) {
  struct kn_backend *warm = kt_backend(KN_CPU_ISA_AVX512, 2);
  kt_seed(16);
  enum { T = 5, HEADS = 3, DMAX = 16 };
  float f8a[4] = {1.0f, 0.5f, 0.125f, 0.01f}, f8b[4] = {0.9f, 0.3f, 0.0f, 0.02f};
  float f16[8] = {1.0f, 0.7f, 0.5f, 0.3f, 0.2f, 0.1f, 0.05f, 0.01f};
  int32_t pos[T] = {3, 4, 5, 6, 100};
  struct {
    const float *f;
    int D, T;
    int32_t bump; /* added to pos[1] before the call */
    float scale;  /* f8a[0] is multiplied by this before the call */
  } calls[] = {
      {f8a, 8, T, 0, 1},  {f8a, 8, T, 0, 1}, {f8b, 8, T, 0, 1},  {f8a, 8, T, 0, 1},
      {f16, 16, T, 0, 1}, {f8b, 8, T, 0, 1}, {f8b, 8, T, 7, 1},  {f8a, 8, T, 0, 1},
      {f8a, 8, T, 0, 2},  {f8a, 8, 2, 0, 1}, {f16, 16, T, 0, 1}, {f8a, 8, T, 0, 1},
  };
  float *x0 = kt_rand_f32((size_t)T * HEADS * DMAX, 1.0f);
  float x[T * HEADS * DMAX], y[T * HEADS * DMAX];
  for (size_t c = 0; c < sizeof(calls) / sizeof(calls[0]); c++) {
    pos[1] += calls[c].bump;
    f8a[0] *= calls[c].scale;
    int ld = HEADS * calls[c].D;
    memcpy(x, x0, sizeof(x));
    memcpy(y, x0, sizeof(y));
    struct kn_backend *cold = kt_backend(KN_CPU_ISA_AVX512, 2);
    TH_REQUIRE(kn_rope(warm, x, ld, calls[c].T, HEADS, calls[c].D, pos, calls[c].f) == 0);
    TH_REQUIRE(kn_rope(cold, y, ld, calls[c].T, HEADS, calls[c].D, pos, calls[c].f) == 0);
    if (!kt_bits_equal(x, y, (size_t)calls[c].T * ld))
      th_fail(__FILE__, __LINE__, "rope call %zu: the warm backend differs from a new one", c);
    TH_CHECK(!kt_bits_equal(x, x0, (size_t)calls[c].T * ld)); /* it rotated */
    kn_backend_destroy(cold);
  }
  free(x0);
  kn_backend_destroy(warm);
}

/* Every table rotates with the plain C table's bits: head dims whose halves
 * are whole vectors (256: Gemma's) and not (72: vectors and a scalar tail,
 * 8: none), over many positions. */
TH_TEST(rope_same_bits_on_every_table) {
  enum { T = 40, HEADS = 3 };
  static const int Ds[] = {256, 72, 8};
  kt_seed(17);
  int32_t pos[T];
  for (int t = 0; t < T; t++)
    pos[t] = t * 37 + 5;
  for (size_t di = 0; di < sizeof(Ds) / sizeof(Ds[0]); di++) {
    const int D = Ds[di], ld = HEADS * D + 3;
    float *x0 = kt_rand_f32((size_t)T * ld, 2.0f), *want = malloc(sizeof(float) * T * ld),
          *got = malloc(sizeof(float) * T * ld), inv_freq[128];
    TH_REQUIRE(want && got);
    for (int i = 0; i < D / 2; i++)
      inv_freq[i] = powf(10000.0f, -2.0f * (float)i / (float)D);
    for (int isa = KN_CPU_ISA_REF; isa <= KN_CPU_ISA_AVX512; isa++) {
      struct kn_backend *be = kt_backend((enum kn_cpu_isa)isa, 2);
      float *x = isa == KN_CPU_ISA_REF ? want : got;
      memcpy(x, x0, sizeof(float) * T * ld);
      TH_REQUIRE(kn_rope(be, x, ld, T, HEADS, D, pos, inv_freq) == 0);
      if (isa != KN_CPU_ISA_REF && !kt_bits_equal(want, got, (size_t)T * ld))
        th_fail(__FILE__, __LINE__, "rope D=%d: %s differs from the plain C table", D,
                kn_backend_name(be));
      kn_backend_destroy(be);
    }
    free(x0), free(want), free(got);
  }
}

/* ---- validation --------------------------------------------------------- */

TH_TEST(bad_arguments_are_errors) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_AVX512, 1);
  float a[16] = {0}, o[16];
  TH_CHECK_EQ_INT(kn_matmul(be, o, 4, a, 4, a, KN_DTYPE_F32, -1, 4, 4, 0), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_matmul(be, o, 2, a, 4, a, KN_DTYPE_F32, 2, 4, 4, 0), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_matmul(be, o, 4, a, 4, a, (enum kn_dtype)99, 2, 4, 4, 0), CM_ERR_UNSUPPORTED);
  TH_CHECK_EQ_INT(kn_matmul(be, NULL, 4, a, 4, a, KN_DTYPE_F32, 2, 4, 4, 0), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_matmul(be, o, 4, a, 4, a, KN_DTYPE_F32, 0, 4, 4, 0), 0);
  int32_t rows[1] = {4};
  TH_CHECK_EQ_INT(kn_matmul_rows(be, o, 1, a, 4, a, KN_DTYPE_F32, 4, 4, rows, 1, 1), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(kn_rmsnorm(be, o, 4, a, 4, 1, 4, NULL, KN_DTYPE_F32, 1e-6f, KN_NORM_MUL_W),
                  CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_softcap(be, o, a, 0.0f, 4), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_argmax(be, (int32_t *)o, NULL, a, 4, 1, 0), CM_ERR_INVAL);
  int32_t ids[2];
  TH_CHECK_EQ_INT(kn_matmul_argmax(be, NULL, NULL, a, 4, a, KN_DTYPE_F32, 2, 4, 4, 0.0f, o),
                  CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_matmul_argmax(be, ids, NULL, a, 4, a, KN_DTYPE_F32, 2, 0, 4, 0.0f, o),
                  CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_matmul_argmax(be, ids, NULL, a, 4, a, KN_DTYPE_F32, 2, 4, 4, -1.0f, o),
                  CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_matmul_argmax(be, ids, NULL, a, 4, a, KN_DTYPE_F32, 2, 4, 4, NAN, o),
                  CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_matmul_argmax(be, ids, NULL, a, 2, a, KN_DTYPE_F32, 2, 4, 4, 0.0f, o),
                  CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_matmul_argmax(be, ids, NULL, a, 4, a, (enum kn_dtype)99, 2, 4, 4, 0.0f, o),
                  CM_ERR_UNSUPPORTED);
  TH_CHECK(kn_alloc(be, 0) == NULL);
  void *p = kn_alloc(be, 100);
  TH_CHECK(p && ((uintptr_t)p & 63) == 0);
  TH_CHECK_EQ_INT(kn_upload(be, p, a, 64), 0);
  TH_CHECK_EQ_INT(kn_download(be, o, p, 64), 0);
  TH_CHECK(memcmp(o, a, 64) == 0);
  kn_free(be, p);
  kn_backend_destroy(be);
}
