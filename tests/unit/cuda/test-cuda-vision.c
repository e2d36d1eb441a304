/* test-cuda-vision.c — the CUDA backend's vision encoder ops (kn_layernorm,
 * kn_bias_act, kn_avg_pool2d; Gemma 4's kn_clamp, kn_avg_pool_grid,
 * kn_standardize) against the CPU oracle over odd shapes, weight dtypes, row
 * strides and in place; and whole generated vision towers (wk_vision_encode,
 * wk_vision_g4_encode) on the device against the CPU. Skips loudly without a
 * device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-fs.h"
#include "kernels/kn-backend.h"
#include "tests/harness/th.h"
#include "tests/unit/cuda/cuda-test-util.h"
#include "tests/unit/worker/wk-test-util.h"
#include "tools/tl-tiny-spec.h"
#include "worker/wk-vision-g4.h"
#include "worker/wk-vision.h"

static const enum kn_dtype k_wdts[] = {KN_DTYPE_F32, KN_DTYPE_F16, KN_DTYPE_BF16};

TH_TEST(cuda_layernorm) {
  struct ct_env e;
  ct_open(&e, 21);
  const int rows_v[] = {1, 5, 67}, ds[] = {1, 7, 72, 1152, 4304};
  for (size_t di = 0; di < 3; di++)
    for (size_t ri = 0; ri < 3; ri++)
      for (size_t ci = 0; ci < 5; ci++)
        for (int inplace = 0; inplace < 2; inplace++) {
          enum kn_dtype dt = k_wdts[di];
          int rows = rows_v[ri], d = ds[ci];
          ptrdiff_t ldx = d + 3, ldo = inplace ? ldx : d + 6;
          size_t tx = (size_t)rows * ldx, to = (size_t)rows * ldo;
          float *x = malloc(tx * sizeof(float));
          TH_REQUIRE(x);
          ct_fill(&e, x, tx, 3.0f);
          for (size_t i = 0; i < tx; i++)
            x[i] += 1.0f;
          void *w = ct_weights(&e, dt, (size_t)d, 1.0f), *b = ct_weights(&e, dt, (size_t)d, 0.5f);
          float *ref = inplace ? x : ct_sentinel(to);
          float *got = ct_sentinel(to);
          float *x_d = ct_up(&e, x, tx * sizeof(float));
          float *out_d = inplace ? x_d : ct_up(&e, got, to * sizeof(float));
          void *w_d = ct_up(&e, w, (size_t)d * kn_dtype_size(dt));
          void *b_d = ct_up(&e, b, (size_t)d * kn_dtype_size(dt));
          TH_CHECK(kn_layernorm(e.gpu, out_d, ldo, x_d, ldx, rows, d, w_d, b_d, dt, 1e-6f) == 0);
          TH_CHECK(kn_layernorm(e.cpu, ref, ldo, x, ldx, rows, d, w, b, dt, 1e-6f) == 0);
          ct_down(&e, got, out_d, to * sizeof(float));
          char what[96];
          snprintf(what, sizeof(what), "layernorm %s rows=%d d=%d%s", kn_dtype_name(dt), rows, d,
                   inplace ? " in place" : "");
          /* d = 1 normalises to exactly the bias on both */
          ct_compare(what, ref, got, rows, d, ldo, to, 1e-10);
          kn_free(e.gpu, x_d);
          if (!inplace) kn_free(e.gpu, out_d);
          kn_free(e.gpu, w_d);
          kn_free(e.gpu, b_d);
          if (!inplace) free(ref);
          free(x);
          free(w);
          free(b);
          free(got);
        }
  ct_close(&e);
}

TH_TEST(cuda_bias_act) {
  struct ct_env e;
  ct_open(&e, 22);
  const int Ts[] = {1, 9, 300}, Ns[] = {1, 33, 1152, 4304};
  for (int act = 0; act < 2; act++)
    for (int with_bias = 0; with_bias < 2; with_bias++)
      for (size_t ti = 0; ti < 3; ti++)
        for (size_t ni = 0; ni < 4; ni++) {
          int T = Ts[ti], N = Ns[ni];
          ptrdiff_t ldx = N + 2, ldo = N + 5;
          size_t tx = (size_t)T * ldx, to = (size_t)T * ldo;
          struct ct_in x, bias;
          ct_in_init(&e, &x, tx, 4.0f);
          ct_in_init(&e, &bias, (size_t)N, 1.0f);
          struct ct_out o;
          ct_out_init(&e, &o, to, 0);
          enum kn_act a = act ? KN_ACT_GELU_TANH : KN_ACT_NONE;
          TH_CHECK(kn_bias_act(e.gpu, o.dev, ldo, x.dev, ldx, with_bias ? bias.dev : NULL, T, N,
                               a) == 0);
          TH_CHECK(kn_bias_act(e.cpu, o.ref, ldo, x.host, ldx, with_bias ? bias.host : NULL, T, N,
                               a) == 0);
          ct_out_check(&e, &o, T, N, ldo, 1e-10, "bias_act act=%d bias=%d T=%d N=%d", act,
                       with_bias, T, N);
          ct_in_free(&e, &x);
          ct_in_free(&e, &bias);
        }
  ct_close(&e);
}

TH_TEST(cuda_avg_pool2d) {
  struct ct_env e;
  ct_open(&e, 23);
  /* n_img, side, k, C: Gemma 3's 64 -> 16 grid, ragged tilings, one window */
  static const int cases[][4] = {{1, 64, 4, 1152}, {3, 7, 2, 9},   {2, 10, 3, 300},
                                 {1, 5, 5, 33},    {2, 16, 4, 32}, {1, 8, 1, 1}};
  for (size_t ci = 0; ci < CM_ARRAY_LEN(cases); ci++) {
    int n = cases[ci][0], side = cases[ci][1], k = cases[ci][2], C = cases[ci][3];
    int os = side / k, in_rows = n * side * side, out_rows = n * os * os;
    ptrdiff_t ldx = C + 1, ldo = C + 3;
    size_t tx = (size_t)in_rows * ldx, to = (size_t)out_rows * ldo;
    struct ct_in x;
    ct_in_init(&e, &x, tx, 2.0f);
    struct ct_out o;
    ct_out_init(&e, &o, to, 0);
    TH_CHECK(kn_avg_pool2d(e.gpu, o.dev, ldo, x.dev, ldx, n, side, k, C) == 0);
    TH_CHECK(kn_avg_pool2d(e.cpu, o.ref, ldo, x.host, ldx, n, side, k, C) == 0);
    ct_out_check(&e, &o, out_rows, C, ldo, 1e-10, "avg_pool2d n=%d side=%d k=%d C=%d", n, side, k,
                 C);
    ct_in_free(&e, &x);
  }
  ct_close(&e);
}

/* A generated tower (f32 weights) on the device against the CPU. */
TH_TEST(cuda_vision_encode) {
  struct ct_env e;
  ct_open(&e, 24);
  char dir[4096], err[512] = "";
  struct tl_tiny_opts o = {.arch = "gemma3", .preset = "tiny", .vocab = 512, .vision = 1};
  wkt_make_tiny(dir, sizeof(dir), &o, 3, MD_ST_F32);
  struct wk_vision *vc = NULL, *vg = NULL;
  struct wk_vision_opts vo = {.max_images = 2};
  TH_REQUIRE(wk_vision_load(dir, e.cpu, &vo, &vc, err, sizeof(err)) == 0);
  TH_REQUIRE(wk_vision_load(dir, e.gpu, &vo, &vg, err, sizeof(err)) == 0);
  const struct md_vision_cfg *c = wk_vision_config(vc);
  int n = 3, H = wk_vision_text_hidden(vc);
  size_t n_px = (size_t)n * c->channels * c->image_size * c->image_size;
  size_t n_out = (size_t)n * c->mm_tokens * H;
  float *px = malloc(n_px * sizeof(float)), *ref = malloc(n_out * 4), *got = malloc(n_out * 4);
  TH_REQUIRE(px && ref && got);
  ct_fill(&e, px, n_px, 1.0f);
  TH_CHECK(wk_vision_encode(vc, px, n, ref, err, sizeof(err)) == 0);
  TH_CHECK(wk_vision_encode(vg, px, n, got, err, sizeof(err)) == 0);
  ct_compare("vision encode", ref, got, (int)(n_out / (size_t)H), H, H, n_out, 1e-9);
  free(px);
  free(ref);
  free(got);
  wk_vision_free(vc);
  wk_vision_free(vg);
  cm_rmtree(dir);
  ct_close(&e);
}

/* ---- Gemma 4's ops and tower --------------------------------------------------- */

TH_TEST(cuda_gemma4_vision_ops) {
  struct ct_env e;
  ct_open(&e, 25);
  /* clamp: several bounds, in place */
  size_t n = 100003;
  struct ct_in x;
  ct_in_init(&e, &x, n, 4.0f);
  struct ct_out o;
  ct_out_init(&e, &o, n, 0);
  TH_CHECK(kn_clamp(e.gpu, o.dev, x.dev, -1.5f, 2.25f, n) == 0);
  TH_CHECK(kn_clamp(e.cpu, o.ref, x.host, -1.5f, 2.25f, n) == 0);
  ct_out_check(&e, &o, 1, (int)n, (ptrdiff_t)n, 0.0, "clamp n=%zu", n);
  ct_in_free(&e, &x);
  /* pooling of rectangular grids: gw, gh, k, C */
  static const int cases[][4] = {{27, 21, 3, 768}, {9, 63, 3, 32}, {3, 3, 3, 300}, {4, 2, 1, 7}};
  for (size_t ci = 0; ci < CM_ARRAY_LEN(cases); ci++) {
    int gw = cases[ci][0], gh = cases[ci][1], k = cases[ci][2], C = cases[ci][3];
    int in_rows = gw * gh, out_rows = (gw / k) * (gh / k);
    ptrdiff_t ldx = C + 1, ldo = C + 3;
    size_t tx = (size_t)in_rows * ldx, to = (size_t)out_rows * ldo;
    struct ct_in g;
    ct_in_init(&e, &g, tx, 2.0f);
    struct ct_out p;
    ct_out_init(&e, &p, to, 0);
    TH_CHECK(kn_avg_pool_grid(e.gpu, p.dev, ldo, g.dev, ldx, gw, gh, k, C, 27.7128f) == 0);
    TH_CHECK(kn_avg_pool_grid(e.cpu, p.ref, ldo, g.host, ldx, gw, gh, k, C, 27.7128f) == 0);
    ct_out_check(&e, &p, out_rows, C, ldo, 1e-10, "avg_pool_grid %dx%d k=%d C=%d", gw, gh, k, C);
    ct_in_free(&e, &g);
  }
  /* standardisation */
  int rows = 63, d = 768;
  size_t tx = (size_t)rows * d;
  struct ct_in y, b, sc;
  ct_in_init(&e, &y, tx, 3.0f);
  ct_in_init(&e, &b, (size_t)d, 1.0f);
  ct_in_init(&e, &sc, (size_t)d, 2.0f);
  struct ct_out q;
  ct_out_init(&e, &q, tx, 0);
  TH_CHECK(kn_standardize(e.gpu, q.dev, d, y.dev, d, rows, d, b.dev, sc.dev) == 0);
  TH_CHECK(kn_standardize(e.cpu, q.ref, d, y.host, d, rows, d, b.host, sc.host) == 0);
  ct_out_check(&e, &q, rows, d, d, 0.0, "standardize %dx%d", rows, d);
  ct_in_free(&e, &y);
  ct_in_free(&e, &b);
  ct_in_free(&e, &sc);
  ct_close(&e);
}

/* A generated Gemma 4 tower (f32 weights) on the device against the CPU: two
 * images of different shapes in one pass. */
TH_TEST(cuda_gemma4_vision_encode) {
  struct ct_env e;
  ct_open(&e, 26);
  char dir[4096], err[512] = "";
  struct tl_tiny_opts o = {.arch = "gemma4", .preset = "tiny", .vocab = 512, .vision = 1};
  wkt_make_tiny(dir, sizeof(dir), &o, 3, MD_ST_F32);
  struct wk_vision_g4 *vc = NULL, *vg = NULL;
  TH_REQUIRE(wk_vision_g4_load(dir, e.cpu, NULL, &vc, err, sizeof(err)) == 0);
  TH_REQUIRE(wk_vision_g4_load(dir, e.gpu, NULL, &vg, err, sizeof(err)) == 0);
  const struct md_vision_g4_cfg *c = wk_vision_g4_config(vc);
  static const int sizes[2][2] = {{640, 480}, {30, 200}};
  struct wk_g4_image ims[2];
  float *px[2];
  int32_t *pos[2];
  int tokens = 0, H = wk_vision_g4_text_hidden(vc);
  for (int i = 0; i < 2; i++) {
    struct md_g4_image info;
    TH_REQUIRE(md_g4_image_plan(&info, sizes[i][0], sizes[i][1], c, 70, err, sizeof(err)) == 0);
    px[i] = malloc(sizeof(float) * (size_t)info.max_patches * info.patch_dim);
    pos[i] = malloc(sizeof(int32_t) * 2 * (size_t)info.max_patches);
    TH_REQUIRE(px[i] && pos[i]);
    ct_fill(&e, px[i], (size_t)info.max_patches * info.patch_dim, 0.5f);
    for (int k = 0; k < info.max_patches; k++) {
      int real = k < info.n_patches;
      pos[i][2 * k] = real ? k % info.grid_w : -1;
      pos[i][2 * k + 1] = real ? k / info.grid_w : -1;
    }
    ims[i] = (struct wk_g4_image){.pixels = px[i], .pos = pos[i], .info = info};
    tokens += info.soft_tokens;
  }
  size_t n_out = (size_t)tokens * H;
  float *ref = malloc(n_out * 4), *got = malloc(n_out * 4);
  TH_REQUIRE(ref && got);
  TH_CHECK(wk_vision_g4_encode(vc, ims, 2, ref, err, sizeof(err)) == 0);
  if (wk_vision_g4_encode(vg, ims, 2, got, err, sizeof(err)))
    th_fail(__FILE__, __LINE__, "device encode: %s", err);
  else
    ct_compare("Gemma 4 vision encode", ref, got, tokens, H, H, n_out, 1e-9);
  for (int i = 0; i < 2; i++) {
    free(px[i]);
    free(pos[i]);
  }
  free(ref);
  free(got);
  wk_vision_g4_free(vc);
  wk_vision_g4_free(vg);
  cm_rmtree(dir);
  ct_close(&e);
}
