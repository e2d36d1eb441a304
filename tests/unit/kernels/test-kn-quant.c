/* test-kn-quant.c — ggml's block formats (kernels/kn-quant.h): every format's
 * dequantization and quantization against tests/reference/
 * ggml_blocks_ref.py (numpy, from the formats' definitions), bit for bit, and
 * the quantization against ggml's own (llama.cpp's libggml-base.so, where
 * tools/setup installed it); the
 * CPU backend's matmul, softcapped matmul, greedy head and embedding over
 * block weights against the same ops over the dequantized f32 weights, bit
 * for bit, on every kernel table and in the bf16 mode; rows that are not
 * whole blocks refused; and a backend without KN_CAP_BLOCK_WEIGHTS (or
 * KN_CAP_BLOCK_LOWBIT) refusing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "common/cm-proc.h"
#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/kn-backend-impl.h"
#include "kernels/kn-quant.h"
#include "kernels/kn-registry.h"
#include "tests/harness/th-proc.h"
#include "tests/unit/kernels/kn-test-util.h"

/* the formats kn_quantize_row writes */
static const enum kn_dtype made[] = {KN_DTYPE_Q8_0, KN_DTYPE_Q4_0, KN_DTYPE_Q4_1, KN_DTYPE_Q5_0,
                                     KN_DTYPE_Q5_1, KN_DTYPE_Q4_K, KN_DTYPE_Q5_K, KN_DTYPE_Q6_K};
/* every format the kernels read: those, and the ones read from llama.cpp's files only */
static const enum kn_dtype all[] = {KN_DTYPE_Q8_0, KN_DTYPE_Q4_0,   KN_DTYPE_Q4_1,   KN_DTYPE_Q5_0,
                                    KN_DTYPE_Q5_1, KN_DTYPE_Q4_K,   KN_DTYPE_Q5_K,   KN_DTYPE_Q6_K,
                                    KN_DTYPE_Q3_K, KN_DTYPE_IQ4_NL, KN_DTYPE_IQ4_XS, KN_DTYPE_Q2_K};

/* n rows of K random elements of block format dt (kn_random_blocks: random
 * bytes, every f16 scale a small finite value of either sign). */
static uint8_t *rand_blocks(enum kn_dtype dt, int rows, int K) {
  size_t bb = kn_block_bytes(dt), nb = (size_t)rows * (size_t)K / (size_t)kn_block_elems(dt);
  uint8_t *b = malloc(nb * bb);
  TH_REQUIRE(b != NULL);
  uint64_t rng = (uint64_t)kt_next() << 1 | 1;
  kn_random_blocks(dt, b, nb, &rng);
  return b;
}

/* Runs the numpy reference: mode over in[in_bytes] into out[out_bytes] (lib:
 * the shared library of mode "ggml", else NULL). */
static void reference_lib(const char *mode, const char *lib, enum kn_dtype dt, const void *in,
                          size_t in_bytes, void *out, size_t out_bytes) {
  const char *py = th_require_numpy("the block formats", "ggml_blocks_ref.py");
  char dir[] = "/tmp/lmserve-quant-XXXXXX", a[64], b[64], script[4200], log[4096];
  TH_REQUIRE(mkdtemp(dir) != NULL);
  snprintf(a, sizeof(a), "%s/in", dir);
  snprintf(b, sizeof(b), "%s/out", dir);
  snprintf(script, sizeof(script), "%s/reference/ggml_blocks_ref.py", th_tests_dir());
  FILE *f = fopen(a, "wb");
  TH_REQUIRE(f && fwrite(in, 1, in_bytes, f) == in_bytes);
  fclose(f);
  char *argv[] = {(char *)py, script, (char *)mode, (char *)kn_dtype_name(dt),
                  a,          b,      (char *)lib,  NULL};
  int rc = cm_run_capture(argv, log, sizeof(log));
  if (rc) {
    th_fail(__FILE__, __LINE__, "ggml_blocks_ref.py %s %s: %d\n%s", mode, kn_dtype_name(dt), rc,
            log);
    th_stop();
  }
  f = fopen(b, "rb");
  TH_REQUIRE(f && fread(out, 1, out_bytes, f) == out_bytes && fgetc(f) == EOF);
  fclose(f);
  unlink(a);
  unlink(b);
  rmdir(dir);
}

static void reference(const char *mode, enum kn_dtype dt, const void *in, size_t in_bytes,
                      void *out, size_t out_bytes) {
  reference_lib(mode, NULL, dt, in, in_bytes, out, out_bytes);
}

/* Every format's kn_dequant_row, row by row, against reference_lib's mode (lib
 * as it takes it) on `rows` random rows of 1024 elements, bit for bit. */
static void check_dequant(const char *mode, const char *lib, int rows) {
  for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
    enum kn_dtype dt = all[i];
    int K = 1024;
    uint8_t *b = rand_blocks(dt, rows, K);
    size_t n = (size_t)rows * K;
    float *got = malloc(n * 4), *want = malloc(n * 4);
    TH_REQUIRE(got && want);
    for (int r = 0; r < rows; r++)
      kn_dequant_row(dt, b + r * kn_row_bytes(dt, (size_t)K), got + (size_t)r * K, (size_t)K);
    reference_lib(mode, lib, dt, b, (size_t)rows * kn_row_bytes(dt, (size_t)K), want, n * 4);
    size_t bad = 0;
    for (size_t j = 0; j < n; j++)
      bad += memcmp(&got[j], &want[j], 4) != 0;
    if (bad)
      th_fail(__FILE__, __LINE__, "%s %s: %zu of %zu values differ (first: %g vs %g)", mode,
              kn_dtype_name(dt), bad, n, (double)got[0], (double)want[0]);
    free(b), free(got), free(want);
  }
}

TH_TEST(dequantization_matches_numpy) {
  kt_seed(3);
  check_dequant("deq", NULL, 6);
}

TH_TEST(quantization_matches_numpy) {
  kt_seed(4);
  for (size_t i = 0; i < sizeof(made) / sizeof(made[0]); i++) {
    enum kn_dtype dt = made[i];
    int K = 256 * 5;
    float *x = malloc(sizeof(float) * K);
    TH_REQUIRE(x != NULL);
    for (int j = 0; j < K; j++)
      x[j] = kt_uniform() * (j < 640 ? 1.0f : 30.0f);
    for (int j = 0; j < 32; j++) /* a block of zeros, one of a repeated value */
      x[64 + j] = 0.0f, x[96 + j] = 0.25f;
    x[130] = -2.0f, x[131] = 2.0f; /* equal magnitudes: the first decides the sign */
    for (int j = 0; j < 256; j++)  /* a K-block of zeros, one of positive values */
      x[256 + j] = 0.0f, x[512 + j] = 0.5f + 0.5f * kt_uniform() * kt_uniform();
    size_t bytes = kn_row_bytes(dt, (size_t)K);
    uint8_t *got = malloc(bytes), *want = malloc(bytes);
    TH_REQUIRE(got && want && kn_quantize_row(dt, x, got, (size_t)K) == 0);
    reference("quant", dt, x, sizeof(float) * K, want, bytes);
    size_t bad = 0;
    for (size_t j = 0; j < bytes; j++)
      bad += got[j] != want[j];
    if (bad)
      th_fail(__FILE__, __LINE__, "%s: %zu of %zu bytes differ", kn_dtype_name(dt), bad, bytes);
    /* and back: within half a step of each block's scale */
    float *y = malloc(sizeof(float) * K);
    kn_dequant_row(dt, got, y, (size_t)K);
    TH_CHECK(y[64] == 0.0f || dt == KN_DTYPE_Q4_1 || dt == KN_DTYPE_Q5_1);
    TH_CHECK(y[300] == 0.0f);
    double err = 0, ref = 0; /* the K-quants fit: a small relative error */
    for (int j = 0; j < K; j++)
      err += (double)(y[j] - x[j]) * (y[j] - x[j]), ref += (double)x[j] * x[j];
    TH_CHECK(err <
             (dt == KN_DTYPE_Q4_K || dt == KN_DTYPE_Q4_0 || dt == KN_DTYPE_Q4_1 ? 1e-2 : 3e-3) *
                 ref);
    free(x), free(got), free(want), free(y);
  }
  float x[32] = {0};
  uint8_t b[40];
  TH_CHECK_EQ_INT(kn_quantize_row(KN_DTYPE_F16, x, b, 16), CM_ERR_UNSUPPORTED);
  TH_CHECK_EQ_INT(kn_quantize_row(KN_DTYPE_IQ4_NL, x, b, 32), CM_ERR_UNSUPPORTED);
  TH_CHECK_EQ_INT(kn_quantize_row(KN_DTYPE_Q4_K, x, b, 32), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_quantize_row(KN_DTYPE_Q8_0, x, b, 16), CM_ERR_INVAL);
}

/* The libggml-base.so of llama.cpp's npm build (tools/llamacpp) into lib[1400];
 * skips the test, saying what was not checked, where it is missing. */
static void need_libggml(char *lib, const char *what) {
  snprintf(lib, 1400,
           "%s/../tools/llamacpp/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/"
           "libggml-base.so",
           th_tests_dir());
  static char why[256];
  snprintf(why, sizeof(why),
           "tools/llamacpp's libggml-base.so is missing (run tools/setup): %s not checked "
           "against ggml's own",
           what);
  if (access(lib, R_OK)) TH_SKIP(why);
}

/* Every format's dequantization against ggml's own (its dequantize_row_*), bit
 * for bit, on random blocks. */
TH_TEST(dequantization_matches_libggml) {
  char lib[1400];
  need_libggml(lib, "the dequantizations were");
  kt_seed(9);
  check_dequant("ggmldeq", lib, 3);
}

/* Every quantizer against ggml's own (quantize_row_*_ref of the libggml-base.so
 * in llama.cpp's npm build, tools/llamacpp): the same bytes, on rows of
 * several magnitudes, a block of zeros, a constant one and a positive one. */
TH_TEST(quantization_matches_libggml) {
  char lib[1400];
  need_libggml(lib, "the quantizers were");
  kt_seed(6);
  int K = 256 * 12;
  float *x = malloc(sizeof(float) * K);
  TH_REQUIRE(x != NULL);
  for (int j = 0; j < K; j++) {
    float scale[] = {1.0f, 1e-3f, 40.0f, 0.05f};
    x[j] = kt_uniform() * kt_uniform() * 3.0f * scale[(j / 512) % 4];
  }
  for (int j = 0; j < 256; j++)
    x[j] = 0.0f, x[256 + j] = -0.7f, x[768 + j] = fabsf(x[768 + j]) + 0.01f;
  for (size_t i = 0; i < sizeof(made) / sizeof(made[0]); i++) {
    enum kn_dtype dt = made[i];
    size_t bytes = kn_row_bytes(dt, (size_t)K);
    uint8_t *got = malloc(bytes), *want = malloc(bytes);
    TH_REQUIRE(got && want && kn_quantize_row(dt, x, got, (size_t)K) == 0);
    reference_lib("ggml", lib, dt, x, sizeof(float) * K, want, bytes);
    size_t bad = 0;
    for (size_t j = 0; j < bytes; j++)
      bad += got[j] != want[j];
    if (bad)
      th_fail(__FILE__, __LINE__, "%s: %zu of %zu bytes differ from ggml's", kn_dtype_name(dt), bad,
              bytes);
    free(got), free(want);
  }
  free(x);
}

/* The CPU ops over block weights give the bits of the same ops over the
 * dequantized f32 weights (T = 1, 3, 40 and 70: the matvec and the tile paths,
 * the latter on every table from T = 64). */
static void check_ops(struct kn_backend *be, const char *what) {
  kt_seed(5);
  for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
    enum kn_dtype dt = all[i];
    int K = 512, N = 37;
    uint8_t *w = rand_blocks(dt, N, K);
    float *wf = malloc(sizeof(float) * N * K);
    TH_REQUIRE(wf != NULL);
    for (int r = 0; r < N; r++)
      kn_dequant_row(dt, w + r * kn_row_bytes(dt, (size_t)K), wf + (size_t)r * K, (size_t)K);
    static const int Ts[] = {1, 3, 40, 70};
    for (int ti = 0; ti < 4; ti++) {
      int T = Ts[ti];
      float *in = kt_rand_tensor(KN_DTYPE_F32, (size_t)T * K, 2.0f);
      float *a = malloc(sizeof(float) * T * N), *b = malloc(sizeof(float) * T * N);
      float *scr = malloc(sizeof(float) * T * N);
      int32_t ia[70], ib[70];
      TH_REQUIRE(a && b && scr);
      for (int acc = 0; acc < 2; acc++) {
        for (int j = 0; j < T * N; j++)
          a[j] = b[j] = 0.5f;
        TH_REQUIRE(kn_matmul(be, a, N, in, K, w, dt, T, N, K, acc) == 0);
        TH_REQUIRE(kn_matmul(be, b, N, in, K, wf, KN_DTYPE_F32, T, N, K, acc) == 0);
        if (memcmp(a, b, sizeof(float) * T * N))
          th_fail(__FILE__, __LINE__, "%s %s T=%d acc=%d: matmul differs", what, kn_dtype_name(dt),
                  T, acc);
      }
      TH_REQUIRE(kn_matmul_softcap(be, a, N, in, K, w, dt, T, N, K, 30.0f) == 0);
      TH_REQUIRE(kn_matmul_softcap(be, b, N, in, K, wf, KN_DTYPE_F32, T, N, K, 30.0f) == 0);
      TH_CHECK(!memcmp(a, b, sizeof(float) * T * N));
      TH_REQUIRE(kn_matmul_argmax(be, ia, NULL, in, K, w, dt, T, N, K, 0.0f, scr) == 0);
      TH_REQUIRE(kn_matmul_argmax(be, ib, NULL, in, K, wf, KN_DTYPE_F32, T, N, K, 0.0f, scr) == 0);
      TH_CHECK(!memcmp(ia, ib, sizeof(int32_t) * T));
      free(in), free(a), free(b), free(scr);
    }
    int32_t ids[4] = {0, 36, 5, -1};
    float *e = malloc(sizeof(float) * 4 * K);
    TH_REQUIRE(e && kn_embed(be, e, K, w, dt, N, K, ids, 4, 1.5f) == 0);
    for (int t = 0; t < 3; t++)
      for (int k = 0; k < K; k++)
        if (e[t * K + k] != wf[(size_t)ids[t] * K + k] * 1.5f) {
          th_fail(__FILE__, __LINE__, "%s embed row %d", kn_dtype_name(dt), ids[t]);
          t = 3;
          break;
        }
    TH_CHECK(e[3 * K] == 0.0f);
    /* rows that are not whole blocks */
    float o[4];
    TH_CHECK_EQ_INT(kn_matmul(be, o, 1, wf, K, w, dt, 1, 1, kn_block_elems(dt) + 16, 0),
                    CM_ERR_INVAL);
    free(e), free(w), free(wf);
  }
}

TH_TEST(cpu_block_weights_give_the_dequantized_bits) {
  for (int isa = KN_CPU_ISA_REF; isa <= KN_CPU_ISA_AVX512; isa++) {
    struct kn_backend *be = NULL;
    TH_REQUIRE(kn_cpu_backend_create_isa(2, (enum kn_cpu_isa)isa, &be) == 0);
    check_ops(be, kn_backend_name(be));
    kn_backend_destroy(be);
  }
  struct kn_backend *be = NULL;
  TH_REQUIRE(kn_cpu_backend_create_mode(2, KN_CPU_ISA_BEST, 1, &be) == 0);
  check_ops(be, "bf16 mode");
  kn_backend_destroy(be);
  /* (the q8 mode: q8_mode_integer_dot_products, every format) */
}

/* The q8 mode (--dtype q8): weights of every block format against inputs
 * rounded to Q8_0 blocks. Every table gives the reference's bits at every T (the decode
 * kernel, full and partial register tiles); the results are the exact integer
 * block sums times the scales (a double computation) to f32 accumulation, and
 * near the f32 mode's; a row's result does not depend on the rows beside it or
 * on T (each token alone gives its bits in the batch, and so does a cut of the
 * rows, as a tensor-parallel rank takes them). */
static void check_q8_mode(enum kn_dtype dt, int K, int N, int T) {
  float *wf = kt_rand_tensor(KN_DTYPE_F32, (size_t)N * K, 1.0f);
  float *in = kt_rand_tensor(KN_DTYPE_F32, (size_t)T * K, 3.0f);
  size_t rb = kn_row_bytes(dt, (size_t)K), xb = kn_row_bytes(KN_DTYPE_Q8_0, (size_t)K);
  uint8_t *w = malloc(rb * N), *xq = malloc(xb * T);
  float *ref = malloc(sizeof(float) * T * N), *got = malloc(sizeof(float) * T * N);
  float *f32 = malloc(sizeof(float) * T * N), *one = malloc(sizeof(float) * N);
  TH_REQUIRE(w && xq && ref && got && f32 && one);
  if (kn_dtype_lowbit(dt)) { /* read from files only: random blocks */
    uint8_t *rw = rand_blocks(dt, N, K);
    memcpy(w, rw, rb * N);
    free(rw);
  } else {
    for (int r = 0; r < N; r++)
      TH_REQUIRE(kn_quantize_row(dt, wf + (size_t)r * K, w + r * rb, (size_t)K) == 0);
  }
  for (int t = 0; t < T; t++)
    TH_REQUIRE(kn_quantize_row(KN_DTYPE_Q8_0, in + (size_t)t * K, xq + t * xb, (size_t)K) == 0);
  const int cut = N / 3 | 1; /* a rank's rows: [cut, N) */
  /* the rows as the q8 mode lays them out at load (16 side by side) */
  uint8_t *xw = malloc(rb * N);
  enum kn_dtype xdt = dt;
  TH_REQUIRE(xw != NULL);
  memcpy(xw, w, rb * N);
  {
    struct kn_backend *be = NULL;
    TH_REQUIRE(kn_cpu_backend_create_mode(2, KN_CPU_ISA_BEST, 2, &be) == 0);
    TH_REQUIRE(kn_weights_prepare(be, xw, &xdt, N, K) == 0);
    kn_backend_destroy(be);
  }
  const int x16 = kn_dtype_x16(xdt);
  TH_CHECK(x16 == (N >= KN_X16_ROWS)); /* every block format has its layout */
  TH_CHECK(x16 == (memcmp(xw, w, rb * N) != 0));
  /* every table, then the best one with its X16 matmuls of 16 tokens and
   * more on the AMX-INT8 tiles, emulated */
  for (int isa = KN_CPU_ISA_REF; isa <= KN_CPU_ISA_AVX512 + 1; isa++) {
    struct kn_backend *be = NULL;
    if (isa > KN_CPU_ISA_AVX512)
      TH_REQUIRE(kn_cpu_backend_create_q8_amx_emulated(2, &be) == 0);
    else
      TH_REQUIRE(kn_cpu_backend_create_mode(2, (enum kn_cpu_isa)isa, 2, &be) == 0);
    TH_REQUIRE(kn_matmul(be, got, N, in, K, w, dt, T, N, K, 0) == 0);
    if (isa == KN_CPU_ISA_REF)
      memcpy(ref, got, sizeof(float) * T * N);
    else if (memcmp(ref, got, sizeof(float) * T * N))
      th_fail(__FILE__, __LINE__, "%s K=%d T=%d %s: q8 mode differs from the reference",
              kn_dtype_name(dt), K, T, kn_backend_name(be));
    if (x16) { /* the same bits from the rows side by side, whole and from a group on */
      TH_REQUIRE(kn_matmul(be, got, N, in, K, xw, xdt, T, N, K, 0) == 0);
      if (memcmp(ref, got, sizeof(float) * T * N))
        th_fail(__FILE__, __LINE__, "%s K=%d T=%d N=%d %s: differs from the reference",
                kn_dtype_name(xdt), K, T, N, kn_backend_name(be));
      for (size_t i = 0; i < (size_t)T * N; i++)
        got[i] = 1.0f;
      TH_REQUIRE(kn_matmul(be, got + KN_X16_ROWS, N, in, K, xw + KN_X16_ROWS * rb, xdt, T,
                           N - KN_X16_ROWS, K, 1) == 0);
      for (int t = 0; t < T; t++)
        for (int n = KN_X16_ROWS; n < N; n++)
          if (got[t * N + n] != 1.0f + ref[t * N + n]) {
            th_fail(__FILE__, __LINE__, "%s K=%d T=%d %s: rows from 16, token %d row %d",
                    kn_dtype_name(xdt), K, T, kn_backend_name(be), t, n);
            t = T;
            break;
          }
    }
    /* the greedy head (kn_matmul_argmax, plain and softcapped): each token's
     * first maximum of the outputs kn_matmul(_softcap) gives, rows as a file
     * has them or side by side */
    for (int x = 0; x <= x16; x++)
      for (int capped = 0; capped < 2; capped++) {
        const void *wx = x ? (const void *)xw : (const void *)w;
        const enum kn_dtype dx = x ? xdt : dt;
        const float cap = capped ? 4.0f : 0.0f;
        if (capped) TH_REQUIRE(kn_matmul_softcap(be, f32, N, in, K, wx, dx, T, N, K, cap) == 0);
        const float *o = capped ? f32 : ref;
        int32_t *ids = malloc(sizeof(int32_t) * T);
        float *mx = malloc(sizeof(float) * T), *scr = malloc(sizeof(float) * T * N);
        TH_REQUIRE(ids && mx && scr);
        TH_REQUIRE(kn_matmul_argmax(be, ids, mx, in, K, wx, dx, T, N, K, cap, scr) == 0);
        for (int t = 0; t < T; t++) {
          int want = 0;
          for (int n = 1; n < N; n++)
            if (o[t * N + n] > o[t * N + want]) want = n;
          if (ids[t] != want || mx[t] != o[t * N + want]) {
            th_fail(__FILE__, __LINE__, "%s K=%d T=%d %s cap %g: token %d argmax %d, want %d",
                    kn_dtype_name(dx), K, T, kn_backend_name(be), (double)cap, t, ids[t], want);
            break;
          }
        }
        /* with a mask (a structured output's): every third output allowed,
         * a token's row none at all (-1) */
        uint32_t *words = calloc((size_t)T * (size_t)((N + 31) / 32), sizeof(uint32_t));
        const uint32_t **allow = malloc(sizeof(*allow) * T);
        TH_REQUIRE(words && allow);
        for (int t = 0; t < T; t++) {
          uint32_t *wt = words + (size_t)t * (size_t)((N + 31) / 32);
          for (int n = (t + capped) % 3; n < N && t != T / 2; n += 3)
            wt[n / 32] |= 1u << (n % 32);
          allow[t] = wt;
        }
        TH_REQUIRE(kn_matmul_argmax_masked(be, ids, mx, in, K, wx, dx, T, N, K, cap, allow) == 0);
        for (int t = 0; t < T; t++) {
          int want = -1;
          for (int n = 0; n < N; n++)
            if ((allow[t][n / 32] >> (n % 32) & 1) && (want < 0 || o[t * N + n] > o[t * N + want]))
              want = n;
          if (ids[t] != want || (want >= 0 && mx[t] != o[t * N + want])) {
            th_fail(__FILE__, __LINE__,
                    "%s K=%d T=%d %s cap %g: token %d masked argmax %d, want %d", kn_dtype_name(dx),
                    K, T, kn_backend_name(be), (double)cap, t, ids[t], want);
            break;
          }
        }
        free(words), free(allow);
        free(ids), free(mx), free(scr);
      }
    for (int t = 0; t<T; t += T> 8 ? T / 5 + 1 : 1) { /* one token alone */
      TH_REQUIRE(kn_matmul(be, one, N, in + (size_t)t * K, K, w, dt, 1, N, K, 0) == 0);
      if (memcmp(one, ref + (size_t)t * N, sizeof(float) * N))
        th_fail(__FILE__, __LINE__, "%s K=%d T=%d %s: token %d alone differs", kn_dtype_name(dt), K,
                T, kn_backend_name(be), t);
    }
    /* the rows from cut on, accumulated onto ones */
    for (size_t i = 0; i < (size_t)T * N; i++)
      got[i] = 1.0f;
    TH_REQUIRE(kn_matmul(be, got + cut, N, in, K, w + cut * rb, dt, T, N - cut, K, 1) == 0);
    for (int t = 0; t < T; t++)
      for (int n = cut; n < N; n++)
        if (got[t * N + n] != 1.0f + ref[t * N + n]) {
          th_fail(__FILE__, __LINE__, "%s K=%d T=%d %s: rows from %d, token %d row %d",
                  kn_dtype_name(dt), K, T, kn_backend_name(be), cut, t, n);
          t = T;
          break;
        }
    kn_backend_destroy(be);
  }
  /* the definition in double, and the f32 mode */
  struct kn_backend *be = NULL;
  TH_REQUIRE(kn_cpu_backend_create(2, &be) == 0);
  TH_REQUIRE(kn_matmul(be, f32, N, in, K, w, dt, T, N, K, 0) == 0);
  if (x16) { /* the f32 mode has no kernels for the layout; an embedding gathers its rows */
    TH_CHECK_EQ_INT(kn_matmul(be, got, N, in, K, xw, xdt, T, N, K, 0), CM_ERR_UNSUPPORTED);
    const int32_t ids[4] = {N - 1, 17, -1, 0}; /* a row past the groups, in one, none */
    float *ea = malloc(sizeof(float) * 4 * K), *eb = malloc(sizeof(float) * 4 * K);
    TH_REQUIRE(ea && eb);
    TH_REQUIRE(kn_embed(be, ea, K, w, dt, N, K, ids, 4, 0.5f) == 0);
    TH_REQUIRE(kn_embed(be, eb, K, xw, xdt, N, K, ids, 4, 0.5f) == 0);
    TH_CHECK(!memcmp(ea, eb, sizeof(float) * 4 * K));
    TH_REQUIRE(kn_embed_dev(be, eb, K, xw, xdt, N, K, ids, 4, 0.5f) == 0);
    TH_CHECK(!memcmp(ea, eb, sizeof(float) * 4 * K));
    free(ea), free(eb);
  }
  kn_backend_destroy(be);
  double worst = 0, big = 0, far = 0;
  float *wv = malloc(sizeof(float) * K), *xv = malloc(sizeof(float) * K);
  TH_REQUIRE(wv && xv);
  for (int t = 0; t < T; t++)
    for (int n = 0; n < N; n++) {
      double s = 0;
      kn_dequant_row(dt, w + n * rb, wv, (size_t)K);
      kn_dequant_row(KN_DTYPE_Q8_0, xq + t * xb, xv, (size_t)K);
      for (int j = 0; j < K; j++)
        s += (double)wv[j] * xv[j];
      big = fmax(big, fabs(s));
      worst = fmax(worst, fabs(s - ref[t * N + n]));
      far = fmax(far, fabs((double)f32[t * N + n] - ref[t * N + n]));
    }
  if (T == 5 && N == 45)
    printf("# %s K=%d q8 mode: %.2g from the exact sums, %.2g from the f32 mode (largest %.3g)\n",
           kn_dtype_name(dt), K, worst, far, big);
  TH_CHECK(worst <= 1e-5 * big);
  TH_CHECK(far > 0 && far <= 0.05 * big);
  free(wf), free(in), free(w), free(xq), free(ref), free(got), free(f32), free(one), free(wv),
      free(xv), free(xw);
}

TH_TEST(q8_mode_integer_dot_products) {
  kt_seed(8);
  static const int Ts[] = {1, 2, 3, 4, 5, 16, 33, 256};
  static const enum kn_dtype q8[] = {
      KN_DTYPE_Q8_0, KN_DTYPE_Q4_0, KN_DTYPE_Q4_1,   KN_DTYPE_Q5_0,   KN_DTYPE_Q5_1, KN_DTYPE_Q4_K,
      KN_DTYPE_Q5_K, KN_DTYPE_Q6_K, KN_DTYPE_IQ4_NL, KN_DTYPE_IQ4_XS, KN_DTYPE_Q3_K, KN_DTYPE_Q2_K};
  for (size_t i = 0; i < sizeof(q8) / sizeof(q8[0]); i++) {
    const enum kn_dtype dt = q8[i];
    const int sb = kn_block_elems(dt) == 256; /* K-quants: whole super-blocks */
    for (size_t k = 0; k < sizeof(Ts) / sizeof(Ts[0]); k++) {
      /* an even and an odd count of blocks (a K-quant's are even: 24, 8) */
      check_q8_mode(dt, sb ? 768 : 640, Ts[k] > 33 ? 7 : 45, Ts[k]);
      check_q8_mode(dt, sb ? 256 : 608, Ts[k] > 33 ? 13 : 45, Ts[k]);
    }
  }
  check_q8_mode(KN_DTYPE_Q4_0, 32, 7, 3); /* one block */
  /* rows side by side at prefill's token counts, over more than one block of
   * tokens (the inputs a sweep of X16 groups keeps in L2) */
  check_q8_mode(KN_DTYPE_Q4_0, 640, 40, 256);
  check_q8_mode(KN_DTYPE_Q5_0, 640, 40, 256);
  check_q8_mode(KN_DTYPE_Q4_1, 640, 40, 256);
  check_q8_mode(KN_DTYPE_Q5_1, 640, 40, 256);
  check_q8_mode(KN_DTYPE_IQ4_NL, 640, 40, 256);
  check_q8_mode(KN_DTYPE_Q8_0, 4096, 33, 100);
  /* two X16 groups a tile: 300 rows give each of two threads units of three
   * groups (one pair, one alone, then the rows past the groups); 33 tokens
   * one past the last tile of four; and one or two tokens against groups
   * larger than L1's share (4096 long rows) */
  static const enum kn_dtype pairs[] = {KN_DTYPE_Q8_0, KN_DTYPE_Q4_0, KN_DTYPE_Q4_1,
                                        KN_DTYPE_Q5_0, KN_DTYPE_Q5_1, KN_DTYPE_IQ4_NL};
  for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
    check_q8_mode(pairs[i], 640, 300, 33);
    check_q8_mode(pairs[i], 4096, 300, 1);
    check_q8_mode(pairs[i], 4096, 300, 2);
  }
  /* IQ4_XS's sub-blocks on the same tiles (its rows whole super-blocks) */
  check_q8_mode(KN_DTYPE_IQ4_XS, 768, 300, 33);
  check_q8_mode(KN_DTYPE_IQ4_XS, 4096, 300, 1);
  check_q8_mode(KN_DTYPE_IQ4_XS, 4096, 300, 2);
  check_q8_mode(KN_DTYPE_IQ4_XS, 768, 40, 256);
  check_q8_mode(KN_DTYPE_Q4_K, 768, 40, 256);
  check_q8_mode(KN_DTYPE_Q5_K, 768, 40, 256);
  check_q8_mode(KN_DTYPE_Q6_K, 768, 40, 256);
  check_q8_mode(KN_DTYPE_Q3_K, 768, 40, 256);
  check_q8_mode(KN_DTYPE_Q2_K, 768, 40, 256);
  /* the K-quants' last group of tokens on the tiles five long, past two of 16 */
  static const enum kn_dtype kq[] = {KN_DTYPE_Q4_K, KN_DTYPE_Q5_K, KN_DTYPE_Q6_K, KN_DTYPE_Q3_K,
                                     KN_DTYPE_Q2_K};
  for (size_t i = 0; i < sizeof(kq) / sizeof(kq[0]); i++)
    check_q8_mode(kq[i], 512, 40, 37);
  int mode = -1;
  char err[128];
  TH_CHECK(kn_backend_dtype_parse("q8", &mode, err, sizeof(err)) == 0 && mode == 2);
}

/* The q8 mode's input rows: every table rounds them as kn_quantize_row does
 * (halves away from zero, where a vector round would go to even), with the
 * same scales and lane sums, on blocks made to hit those cases. */
TH_TEST(q8_inputs_rounded_as_the_reference_on_every_table) {
  enum { K = 32 * 8 };
  float x[K];
  kt_seed(11);
  float *r = kt_rand_tensor(KN_DTYPE_F32, K, 3.0f);
  memcpy(x, r, sizeof x);
  free(r);
  for (int j = 0; j < 32; j++) { /* amax 127: d 1, so x * id = x, halves exactly */
    x[j] = (float)(j - 16) + 0.5f;
    x[32 + j] = 0.0f;                                    /* a zero block */
    x[64 + j] = (j - 16) * 1e-9f;                        /* d under f16's smallest */
    x[96 + j] = (j & 1 ? -1.0f : 1.0f) * 0.49999997f;    /* below a half, not one */
    x[128 + j] = (j & 1 ? -1.0f : 1.0f) * j * 2.5f / 31; /* amax 2.5 */
  }
  x[31] = x[96] = 127.0f; /* d 1 in the block below a half too */
  uint8_t q0[K / 32 * 34], q1[K / 32 * 34];
  float d0[K / 32], d1[K / 32];
  int32_t s0[K / 4], s1[K / 4];
  struct kn_backend *ref = NULL;
  TH_REQUIRE(kn_cpu_backend_create_mode(2, KN_CPU_ISA_REF, 1, &ref) == 0);
  const struct kn_cpu_dsp *rd = &((struct kn_cpu_ctx *)ref->ctx)->dsp;
  for (int isa = KN_CPU_ISA_REF; isa <= KN_CPU_ISA_AVX512; isa++) {
    struct kn_backend *be = NULL;
    TH_REQUIRE(kn_cpu_backend_create_mode(2, (enum kn_cpu_isa)isa, 1, &be) == 0);
    const struct kn_cpu_dsp *dsp = &((struct kn_cpu_ctx *)be->ctx)->dsp;
    for (int shift = 0; shift <= 7; shift += 7) {
      rd->q8_prep(x, K, q0, d0, s0, shift);
      dsp->q8_prep(x, K, q1, d1, s1, shift);
      TH_CHECK(memcmp(q0, q1, sizeof q0) == 0);
      TH_CHECK(memcmp(d0, d1, sizeof d0) == 0);
      TH_CHECK(memcmp(s0, s1, sizeof s0) == 0);
    }
    kn_backend_destroy(be);
  }
  /* the reference itself: the halves went away from zero */
  TH_REQUIRE(kn_quantize_row(KN_DTYPE_Q8_0, x, q0, K) == 0);
  TH_CHECK_EQ_INT((int8_t)q0[2 + 18], 3);  /* 2.5 */
  TH_CHECK_EQ_INT((int8_t)q0[2 + 13], -3); /* -2.5 */
  TH_CHECK_EQ_INT((int8_t)q0[3 * 34 + 3], 0);
  kn_backend_destroy(ref);
}

/* The CPU's matmul and embedding behind an alias table, one result nudged for
 * one format: what a broken block kernel does (kn_block_check must say so). */
static const struct kn_backend_ops *g_cpu;
static int wrong_matmul(void *ctx, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                        const void *w, enum kn_dtype wdt, int T, int N, int K, int accumulate) {
  int rc = g_cpu->matmul(ctx, out, ldo, in, ldi, w, wdt, T, N, K, accumulate);
  if (!rc && wdt == KN_DTYPE_Q5_K && T > 32) /* a fifth of one product (~0.5 here) */
    out[(ptrdiff_t)(T - 1) * ldo + N / 2] += 0.1f;
  return rc;
}
static int wrong_pad_matmul(void *ctx, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                            const void *w, enum kn_dtype wdt, int T, int N, int K, int accumulate) {
  int rc = g_cpu->matmul(ctx, out, ldo, in, ldi, w, wdt, T, N, K, accumulate);
  if (!rc && wdt == KN_DTYPE_Q6_K && T == 8) out[N] = 0.0f; /* a column past N */
  return rc;
}
static int wrong_embed(void *ctx, float *out, ptrdiff_t ldo, const void *table, enum kn_dtype tdt,
                       int H, const int32_t *ids, int T, float scale) {
  int rc = g_cpu->embed(ctx, out, ldo, table, tdt, H, ids, T, scale);
  if (!rc && tdt == KN_DTYPE_Q4_1) out[H - 1] = nextafterf(out[H - 1], INFINITY); /* one ulp */
  return rc;
}

TH_TEST(block_check_passes_the_cpu_and_catches_a_wrong_kernel) {
  struct kn_backend *be = NULL;
  char why[256];
  TH_REQUIRE(kn_cpu_backend_create(2, &be) == 0);
  TH_CHECK_EQ_INT(kn_block_check(be, 1 << 30, 3e-5, why, sizeof why), 0);
  if (why[0]) fprintf(stderr, "%s\n", why);
  /* the CPU's exact f32 values are not the bf16 operands a tiled GEMM takes:
   * the tolerance tells the two apart in every format */
  const unsigned every = 0xff0u | 0xfu << KN_DTYPE_Q3_K; /* Q8_0 .. Q6_K, Q3_K .. Q2_K */
  TH_CHECK_EQ_INT(kn_block_check(be, 0, 3e-5, why, sizeof why), every);
  TH_CHECK(strstr(why, "q8_0 matmul T=1:") == why);
  g_cpu = be->ops;
  struct kn_backend_ops ops = *be->ops;
  struct kn_backend alias = {.ops = &ops, .caps = be->caps, .ctx = be->ctx};
  ops.matmul = wrong_matmul;
  TH_CHECK_EQ_INT(kn_block_check(&alias, 1 << 30, 3e-5, why, sizeof why), 1u << KN_DTYPE_Q5_K);
  TH_CHECK(strstr(why, "q5_k matmul T=37:") == why);
  ops.matmul = wrong_pad_matmul;
  TH_CHECK_EQ_INT(kn_block_check(&alias, 1 << 30, 3e-5, why, sizeof why), 1u << KN_DTYPE_Q6_K);
  TH_CHECK(strstr(why, "q6_k matmul T=8: wrote out[0, 37]") == why);
  ops.matmul = g_cpu->matmul;
  ops.embed = wrong_embed;
  TH_CHECK_EQ_INT(kn_block_check(&alias, 1 << 30, 3e-5, why, sizeof why), 1u << KN_DTYPE_Q4_1);
  TH_CHECK(strstr(why, "q4_1 embed:") == why);
  /* without the capability nothing runs, and every format says so */
  alias.caps = 0;
  TH_CHECK_EQ_INT(kn_block_check(&alias, 1 << 30, 3e-5, why, sizeof why), every);
  TH_CHECK(strstr(why, "q8_0 matmul T=1: ") == why);
  /* without KN_CAP_BLOCK_LOWBIT (a CUDA backend's, where those kernels failed
   * the check) the formats of kn_dtype_lowbit are refused by every op that
   * takes a weight, the others not, and the check fails only those */
  alias.ops = be->ops;
  alias.caps = be->caps & ~(unsigned)KN_CAP_BLOCK_LOWBIT;
  TH_CHECK_EQ_INT(kn_block_check(&alias, 1 << 30, 3e-5, why, sizeof why), 0xfu << KN_DTYPE_Q3_K);
  TH_CHECK(strstr(why, "q3_k matmul T=1: ") == why);
  const int K = 256;
  float in[256] = {0}, out[2], row[256];
  int32_t id = 0, best;
  for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
    const enum kn_dtype dt = all[i];
    const int want = kn_dtype_lowbit(dt) ? CM_ERR_UNSUPPORTED : 0;
    uint8_t *w = rand_blocks(dt, 2, K);
    TH_CHECK_EQ_INT(kn_matmul(&alias, out, 2, in, K, w, dt, 1, 2, K, 0), want);
    TH_CHECK_EQ_INT(kn_embed(&alias, row, K, w, dt, 2, K, &id, 1, 1.0f), want);
    TH_CHECK_EQ_INT(kn_matmul_argmax(&alias, &best, NULL, in, K, w, dt, 1, 2, K, 0.0f, out), want);
    free(w);
  }
  kn_backend_destroy(be);
}
