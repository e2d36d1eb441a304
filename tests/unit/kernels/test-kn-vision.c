/* test-kn-vision.c — the vision encoder ops (kn_layernorm, kn_bias_act with
 * every activation, kn_avg_pool2d; Gemma 4's kn_clamp, kn_avg_pool_grid, kn_standardize, and
 * kn_rope over half-head rows as the 2D RoPE) on the CPU backend against plain loops written here
 * from the definitions (in double), over odd shapes and row strides, with sentinel-guarded outputs
 * (the gaps between rows must stay untouched), in place, on 1 and several threads (bit-identical),
 * and argument checks. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "tests/unit/kernels/kn-test-util.h"

static const enum kn_dtype wdts[] = {KN_DTYPE_F32, KN_DTYPE_F16, KN_DTYPE_BF16};

/* |a - b| <= tol * max(1, |b|) for every row element; gaps stay sentinels. */
static void check_rows(const char *what, const float *got, const double *want, int rows, int cols,
                       ptrdiff_t ld, double tol) {
  double worst = 0.0;
  int gaps_ok = 1;
  for (int r = 0; r < rows; r++) {
    for (int c = 0; c < cols; c++) {
      double g = got[(size_t)r * ld + c], w = want[(size_t)r * cols + c];
      double e = fabs(g - w) / fmax(1.0, fabs(w));
      if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
    if (r + 1 < rows)
      for (ptrdiff_t c = cols; c < ld; c++)
        gaps_ok &= kt_is_sentinel(got + (size_t)r * ld + c);
  }
  TH_CHECK(gaps_ok);
  if (!(worst <= tol))
    th_fail(__FILE__, __LINE__, "%s %dx%d ld %td: error %g > %g", what, rows, cols, ld, worst, tol);
}

/* ---- layernorm ------------------------------------------------------------ */

static void check_layernorm(struct kn_backend *be, enum kn_dtype dt, int rows, int d) {
  int ldx = d + 3, ldo = d + 5;
  float *x = kt_rand_f32((size_t)rows * ldx, 2.0f);
  for (size_t i = 0; i < (size_t)rows * ldx; i++)
    x[i] += 0.75f; /* a mean far from 0: the centring matters */
  void *w = kt_rand_tensor(dt, (size_t)d, 1.0f), *b = kt_rand_tensor(dt, (size_t)d, 0.5f);
  float eps = 1e-6f;
  double *want = malloc(sizeof(double) * (size_t)rows * d);
  TH_REQUIRE(want);
  for (int r = 0; r < rows; r++) {
    const float *xr = x + (size_t)r * ldx;
    double mean = 0, var = 0;
    for (int i = 0; i < d; i++)
      mean += xr[i];
    mean /= d;
    for (int i = 0; i < d; i++)
      var += (xr[i] - mean) * (xr[i] - mean);
    var /= d;
    for (int i = 0; i < d; i++)
      want[(size_t)r * d + i] = (xr[i] - mean) / sqrt(var + eps) * kn_load_f32(w, dt, (size_t)i) +
                                kn_load_f32(b, dt, (size_t)i);
  }
  size_t n_out = (size_t)(rows - 1) * ldo + d;
  float *out = kt_guarded(n_out);
  TH_CHECK_EQ_INT(kn_layernorm(be, out, ldo, x, ldx, rows, d, w, b, dt, eps), 0);
  TH_CHECK(kt_guards_ok(out, n_out));
  check_rows("layernorm", out, want, rows, d, ldo, 1e-5);
  /* in place, same stride: the same bits */
  float *inplace = malloc(sizeof(float) * (size_t)rows * ldx);
  TH_REQUIRE(inplace);
  memcpy(inplace, x, sizeof(float) * (size_t)rows * ldx);
  TH_CHECK_EQ_INT(kn_layernorm(be, inplace, ldx, inplace, ldx, rows, d, w, b, dt, eps), 0);
  TH_CHECK(kt_rows_equal(inplace, ldx, out, ldo, rows, d));
  free(inplace);
  kt_guarded_free(out);
  free(want);
  free(x);
  free(w);
  free(b);
}

TH_TEST(layernorm_matches_definition) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_AVX512, 3);
  static const int shapes[][2] = {{1, 1},   {1, 7},     {3, 32},  {5, 33},
                                  {17, 72}, {64, 1152}, {2, 4304}};
  kt_seed(11);
  for (size_t d = 0; d < CM_ARRAY_LEN(wdts); d++)
    for (size_t s = 0; s < CM_ARRAY_LEN(shapes); s++)
      check_layernorm(be, wdts[d], shapes[s][0], shapes[s][1]);
  kn_backend_destroy(be);
}

/* A constant row normalises to the bias (variance 0, eps > 0). */
TH_TEST(layernorm_constant_row_gives_bias) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_REF, 1);
  float x[5] = {3, 3, 3, 3, 3}, w[5] = {1, 2, 3, 4, 5}, b[5] = {-1, 0, 1, 2, 3}, out[5];
  TH_CHECK_EQ_INT(kn_layernorm(be, out, 5, x, 5, 1, 5, w, b, KN_DTYPE_F32, 1e-6f), 0);
  for (int i = 0; i < 5; i++)
    TH_CHECK(out[i] == b[i]);
  kn_backend_destroy(be);
}

/* ---- bias + activation ---------------------------------------------------- */

static double gelu_def(double g) {
  return 0.5 * g * (1.0 + tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)));
}

static void check_bias_act(struct kn_backend *be, int T, int N, enum kn_act act, int with_bias) {
  int ldx = N + 2, ldo = N + 7;
  float *x = kt_rand_f32((size_t)T * ldx, 4.0f);
  float *bias = with_bias ? kt_rand_f32((size_t)N, 1.0f) : NULL;
  double *want = malloc(sizeof(double) * (size_t)T * N);
  TH_REQUIRE(want);
  for (int t = 0; t < T; t++)
    for (int j = 0; j < N; j++) {
      double v = (double)x[(size_t)t * ldx + j] + (bias ? (double)bias[j] : 0.0);
      want[(size_t)t * N + j] = act == KN_ACT_GELU_TANH ? gelu_def(v)
                                : act == KN_ACT_SILU    ? v / (1.0 + exp(-v))
                                : act == KN_ACT_RELU    ? (v < 0 ? 0.0 : v)
                                : act == KN_ACT_SIGMOID ? 1.0 / (1.0 + exp(-v))
                                                        : v;
    }
  size_t n_out = (size_t)(T - 1) * ldo + N;
  float *out = kt_guarded(n_out);
  TH_CHECK_EQ_INT(kn_bias_act(be, out, ldo, x, ldx, bias, T, N, act), 0);
  TH_CHECK(kt_guards_ok(out, n_out));
  char what[64];
  snprintf(what, sizeof(what), "bias_act(act %d, bias %d)", (int)act, with_bias);
  check_rows(what, out, want, T, N, ldo, 1e-6);
  /* in place */
  TH_CHECK_EQ_INT(kn_bias_act(be, x, ldx, x, ldx, bias, T, N, act), 0);
  TH_CHECK(kt_rows_equal(x, ldx, out, ldo, T, N));
  kt_guarded_free(out);
  free(want);
  free(x);
  free(bias);
}

TH_TEST(bias_act_matches_definition) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_AVX512, 3);
  static const int shapes[][2] = {{1, 1}, {1, 9}, {3, 31}, {7, 64}, {65, 129}, {300, 257}};
  kt_seed(12);
  for (size_t s = 0; s < CM_ARRAY_LEN(shapes); s++)
    for (int a = KN_ACT_NONE; a <= KN_ACT_SIGMOID; a++)
      for (int wb = 0; wb < 2; wb++)
        check_bias_act(be, shapes[s][0], shapes[s][1], (enum kn_act)a, wb);
  kn_backend_destroy(be);
}

/* ---- average pooling -------------------------------------------------------- */

static void check_pool(struct kn_backend *be, int n_img, int side, int k, int C) {
  int ldx = C + 1, ldo = C + 4, os = side / k;
  int in_rows = n_img * side * side, out_rows = n_img * os * os;
  float *x = kt_rand_f32((size_t)in_rows * ldx, 3.0f);
  double *want = calloc((size_t)out_rows * C, sizeof(double));
  TH_REQUIRE(want);
  /* walk the input grid: each patch adds to the window holding it */
  for (int i = 0; i < n_img; i++)
    for (int r = 0; r < os * k; r++)
      for (int c = 0; c < os * k; c++) {
        const float *px = x + ((size_t)i * side * side + (size_t)r * side + c) * ldx;
        double *o = want + ((size_t)i * os * os + (size_t)(r / k) * os + c / k) * C;
        for (int f = 0; f < C; f++)
          o[f] += px[f] / ((double)k * k);
      }
  size_t n_out = (size_t)(out_rows - 1) * ldo + C;
  float *out = kt_guarded(n_out);
  TH_CHECK_EQ_INT(kn_avg_pool2d(be, out, ldo, x, ldx, n_img, side, k, C), 0);
  TH_CHECK(kt_guards_ok(out, n_out));
  char what[64];
  snprintf(what, sizeof(what), "avg_pool2d(%d images, side %d, k %d)", n_img, side, k);
  check_rows(what, out, want, out_rows, C, ldo, 1e-6);
  kt_guarded_free(out);
  free(want);
  free(x);
}

TH_TEST(avg_pool2d_matches_definition) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_AVX512, 3);
  /* n_img, side, k, C: exact tilings, trailing rows/columns dropped (7 / 2,
   * 10 / 3), k = 1 (a copy), k = side (one mean per image) */
  static const int shapes[][4] = {{1, 8, 2, 5}, {2, 8, 4, 3},  {3, 7, 2, 9},  {1, 10, 3, 17},
                                  {2, 4, 1, 6}, {1, 5, 5, 33}, {1, 64, 4, 7}, {2, 16, 4, 32}};
  kt_seed(13);
  for (size_t s = 0; s < CM_ARRAY_LEN(shapes); s++)
    check_pool(be, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3]);
  kn_backend_destroy(be);
}

/* ---- Gemma 4's ops ------------------------------------------------------------ */

/* kn_clamp as torch.clamp: bounds finite or infinite, NaN kept, in place. */
TH_TEST(clamp_matches_definition) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_AVX512, 3);
  kt_seed(21);
  size_t n = 3 * 4096 + 77; /* several chunks and a partial one */
  float *x = kt_rand_f32(n, 4.0f);
  x[5] = NAN;
  x[6] = INFINITY;
  x[7] = -INFINITY;
  static const float bounds[][2] = {
      {-1.5f, 2.25f}, {-INFINITY, 0.5f}, {0.0f, INFINITY}, {1.0f, 1.0f}, {-INFINITY, INFINITY}};
  float *out = kt_guarded(n);
  for (size_t b = 0; b < CM_ARRAY_LEN(bounds); b++) {
    float lo = bounds[b][0], hi = bounds[b][1];
    TH_CHECK_EQ_INT(kn_clamp(be, out, x, lo, hi, n), 0);
    TH_CHECK(kt_guards_ok(out, n));
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
      float want = isnan(x[i]) ? NAN : x[i] < lo ? lo : x[i] > hi ? hi : x[i];
      ok &= isnan(want) ? isnan(out[i]) : out[i] == want;
    }
    if (!ok) th_fail(__FILE__, __LINE__, "clamp to [%g, %g] differs from the definition", lo, hi);
  }
  /* in place */
  float *y = malloc(sizeof(float) * n);
  TH_REQUIRE(y);
  memcpy(y, x, sizeof(float) * n);
  TH_CHECK_EQ_INT(kn_clamp(be, y, y, -1.5f, 2.25f, n), 0);
  TH_CHECK_EQ_INT(kn_clamp(be, out, x, -1.5f, 2.25f, n), 0);
  TH_CHECK(memcmp(y, out, sizeof(float) * n) == 0);
  free(y);
  kt_guarded_free(out);
  free(x);
  kn_backend_destroy(be);
}

static void check_pool_grid(struct kn_backend *be, int gw, int gh, int k, int C, float scale) {
  int ldx = C + 2, ldo = C + 3, ow = gw / k, out_rows = (gw / k) * (gh / k);
  float *x = kt_rand_f32((size_t)gw * gh * ldx, 3.0f);
  double *want = calloc((size_t)out_rows * C, sizeof(double));
  TH_REQUIRE(want);
  /* Gemma4VisionPooler's rule: patch (x, y) goes to window x / k + (gw / k) (y / k) */
  for (int y = 0; y < gh; y++)
    for (int xx = 0; xx < gw; xx++) {
      const float *px = x + ((size_t)y * gw + xx) * ldx;
      double *o = want + ((size_t)(y / k) * ow + xx / k) * C;
      for (int f = 0; f < C; f++)
        o[f] += px[f] / ((double)k * k) * scale;
    }
  size_t n_out = (size_t)(out_rows - 1) * ldo + C;
  float *out = kt_guarded(n_out);
  TH_CHECK_EQ_INT(kn_avg_pool_grid(be, out, ldo, x, ldx, gw, gh, k, C, scale), 0);
  TH_CHECK(kt_guards_ok(out, n_out));
  char what[80];
  snprintf(what, sizeof(what), "avg_pool_grid(%d x %d, k %d, scale %g)", gw, gh, k, scale);
  check_rows(what, out, want, out_rows, C, ldo, 1e-6);
  kt_guarded_free(out);
  free(want);
  free(x);
}

TH_TEST(avg_pool_grid_matches_definition) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_AVX512, 3);
  /* gw, gh, k, C: wide, tall, square, k = 1, one window */
  static const int shapes[][4] = {{9, 6, 3, 5}, {3, 21, 3, 8}, {12, 12, 3, 17},
                                  {4, 2, 1, 3}, {3, 3, 3, 33}, {27, 21, 3, 32}};
  kt_seed(22);
  for (size_t s = 0; s < CM_ARRAY_LEN(shapes); s++)
    check_pool_grid(be, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3],
                    s % 2 ? 1.0f : (float)sqrt(32.0));
  kn_backend_destroy(be);
}

TH_TEST(standardize_matches_definition) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_AVX512, 3);
  kt_seed(23);
  int rows = 37, d = 45, ldx = d + 1, ldo = d + 6;
  float *x = kt_rand_f32((size_t)rows * ldx, 3.0f), *b = kt_rand_f32((size_t)d, 1.0f);
  float *sc = kt_rand_f32((size_t)d, 2.0f);
  double *want = malloc(sizeof(double) * (size_t)rows * d);
  TH_REQUIRE(want);
  for (int r = 0; r < rows; r++)
    for (int i = 0; i < d; i++) /* one f32 subtraction and one f32 product, as torch does */
      want[(size_t)r * d + i] = (float)((float)(x[(size_t)r * ldx + i] - b[i]) * sc[i]);
  size_t n_out = (size_t)(rows - 1) * ldo + d;
  float *out = kt_guarded(n_out);
  TH_CHECK_EQ_INT(kn_standardize(be, out, ldo, x, ldx, rows, d, b, sc), 0);
  TH_CHECK(kt_guards_ok(out, n_out));
  check_rows("standardize", out, want, rows, d, ldo, 0.0);
  /* in place */
  TH_CHECK_EQ_INT(kn_standardize(be, x, ldx, x, ldx, rows, d, b, sc), 0);
  TH_CHECK(kt_rows_equal(x, ldx, out, ldo, rows, d));
  kt_guarded_free(out);
  free(want);
  free(x);
  free(b);
  free(sc);
  kn_backend_destroy(be);
}

/* Gemma 4's 2D RoPE as two kn_rope calls over half-head rows (row stride
 * head_dim, one position per row): apply_multidimensional_rope's definition
 * (each half rotate-half with cos / sin of pos x inv_freq) in double. */
TH_TEST(rope_over_half_heads_is_2d_rope) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_AVX512, 2);
  kt_seed(24);
  int T = 11, nh = 3, hd = 16, half = hd / 2, nf = hd / 4;
  float *x = kt_rand_f32((size_t)T * nh * hd, 2.0f), inv[4];
  for (int i = 0; i < nf; i++)
    inv[i] = (float)(1.0 / pow(100.0, 2.0 * i / half));
  int32_t px[33], py[33];
  for (int t = 0; t < T; t++)
    for (int h = 0; h < nh; h++) {
      px[t * nh + h] = t % 4;
      py[t * nh + h] = t / 4 + 7;
    }
  double *want = malloc(sizeof(double) * (size_t)T * nh * hd);
  TH_REQUIRE(want);
  for (int r = 0; r < T * nh; r++)
    for (int axis = 0; axis < 2; axis++) {
      const float *xp = x + (size_t)r * hd + axis * half;
      double *w = want + (size_t)r * hd + axis * half;
      int pos = axis ? py[r] : px[r];
      for (int i = 0; i < nf; i++) {
        double a = (float)((float)pos * inv[i]), c = cos(a), s = sin(a);
        w[i] = xp[i] * c - xp[i + nf] * s;
        w[i + nf] = xp[i + nf] * c + xp[i] * s;
      }
    }
  TH_CHECK_EQ_INT(kn_rope(be, x, hd, T * nh, 1, half, px, inv), 0);
  TH_CHECK_EQ_INT(kn_rope(be, x + half, hd, T * nh, 1, half, py, inv), 0);
  check_rows("2D rope", x, want, T * nh, hd, hd, 1e-5);
  free(want);
  free(x);
  kn_backend_destroy(be);
}

/* ---- threads and arguments ---------------------------------------------------- */

/* Every op gives the same bits on one thread and on several. */
TH_TEST(vision_ops_thread_invariant) {
  struct kn_backend *be1 = kt_backend(KN_CPU_ISA_AVX512, 1),
                    *be4 = kt_backend(KN_CPU_ISA_AVX512, 4);
  int T = 256, N = 200, side = 16, k = 4;
  kt_seed(14);
  float *x = kt_rand_f32((size_t)T * N, 2.0f), *w = kt_rand_f32((size_t)N, 1.0f);
  float *b = kt_rand_f32((size_t)N, 1.0f);
  float *o1 = malloc(sizeof(float) * (size_t)T * N), *o4 = malloc(sizeof(float) * (size_t)T * N);
  TH_REQUIRE(o1 && o4);
  TH_REQUIRE(kn_layernorm(be1, o1, N, x, N, T, N, w, b, KN_DTYPE_F32, 1e-6f) == 0);
  TH_REQUIRE(kn_layernorm(be4, o4, N, x, N, T, N, w, b, KN_DTYPE_F32, 1e-6f) == 0);
  TH_CHECK(kt_bits_equal(o1, o4, (size_t)T * N));
  TH_REQUIRE(kn_bias_act(be1, o1, N, x, N, b, T, N, KN_ACT_GELU_TANH) == 0);
  TH_REQUIRE(kn_bias_act(be4, o4, N, x, N, b, T, N, KN_ACT_GELU_TANH) == 0);
  TH_CHECK(kt_bits_equal(o1, o4, (size_t)T * N));
  TH_REQUIRE(kn_avg_pool2d(be1, o1, N, x, N, 1, side, k, N) == 0);
  TH_REQUIRE(kn_avg_pool2d(be4, o4, N, x, N, 1, side, k, N) == 0);
  TH_CHECK(kt_bits_equal(o1, o4, (size_t)(side / k) * (side / k) * N));
  free(x);
  free(w);
  free(b);
  free(o1);
  free(o4);
  kn_backend_destroy(be1);
  kn_backend_destroy(be4);
}

TH_TEST(vision_ops_reject_bad_arguments) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_REF, 1);
  float x[64] = {0}, o[64], w[8] = {0}, b[8] = {0};
  TH_CHECK_EQ_INT(kn_layernorm(NULL, o, 8, x, 8, 1, 8, w, b, KN_DTYPE_F32, 1e-6f), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_layernorm(be, o, 8, x, 8, -1, 8, w, b, KN_DTYPE_F32, 1e-6f), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_layernorm(be, o, 4, x, 8, 2, 8, w, b, KN_DTYPE_F32, 1e-6f), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_layernorm(be, o, 8, x, 8, 2, 8, w, NULL, KN_DTYPE_F32, 1e-6f), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_layernorm(be, o, 8, x, 8, 2, 8, w, b, KN_DTYPE_F32, -1.0f), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_layernorm(be, o, 8, x, 8, 2, 8, w, b, (enum kn_dtype)99, 1e-6f),
                  CM_ERR_UNSUPPORTED);
  TH_CHECK_EQ_INT(kn_layernorm(be, o, 8, x, 8, 0, 8, w, b, KN_DTYPE_F32, 1e-6f), 0);
  TH_CHECK_EQ_INT(kn_bias_act(be, o, 8, x, 8, b, 2, 8, (enum kn_act)7), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_bias_act(be, o, 8, x, 7, b, 2, 8, KN_ACT_NONE), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_bias_act(be, NULL, 8, x, 8, b, 2, 8, KN_ACT_NONE), CM_ERR_INVAL);
  /* no bias, no activation: a copy */
  for (int i = 0; i < 16; i++)
    x[i] = (float)i;
  TH_CHECK_EQ_INT(kn_bias_act(be, o, 8, x, 8, NULL, 2, 8, KN_ACT_NONE), 0);
  TH_CHECK(kt_bits_equal(o, x, 16));
  TH_CHECK_EQ_INT(kn_avg_pool2d(be, o, 4, x, 4, 1, 2, 3, 4), CM_ERR_SHAPE);
  TH_CHECK_EQ_INT(kn_avg_pool2d(be, o, 4, x, 4, 1, 4, 0, 4), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_avg_pool2d(be, o, 4, x, 3, 1, 4, 2, 4), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_avg_pool2d(be, o, 4, x, 4, 0, 4, 2, 4), 0);
  TH_CHECK_EQ_INT(kn_clamp(be, o, x, 2.0f, 1.0f, 4), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_clamp(be, o, x, NAN, 1.0f, 4), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_clamp(be, NULL, x, 0.0f, 1.0f, 4), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_clamp(be, NULL, NULL, 0.0f, 1.0f, 0), 0);
  TH_CHECK_EQ_INT(kn_avg_pool_grid(be, o, 4, x, 4, 4, 3, 2, 4, 1.0f), CM_ERR_SHAPE);
  TH_CHECK_EQ_INT(kn_avg_pool_grid(be, o, 4, x, 4, 4, 2, 0, 4, 1.0f), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_avg_pool_grid(be, o, 4, x, 4, 4, 2, 2, 4, NAN), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_avg_pool_grid(be, o, 4, x, 3, 4, 2, 2, 4, 1.0f), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_avg_pool_grid(be, o, 4, x, 4, 0, 2, 2, 4, 1.0f), 0);
  TH_CHECK_EQ_INT(kn_standardize(be, o, 8, x, 8, 2, 8, NULL, w), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_standardize(be, o, 7, x, 8, 2, 8, b, w), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_standardize(be, o, 8, x, 8, 0, 8, b, w), 0);
  kn_backend_destroy(be);
}
