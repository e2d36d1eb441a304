/* test-cuda-fused.c — the CUDA backend's fused ops (kn-cuda-fused.cu): its
 * check when it was made found every fused kernel equal to its unfused
 * sequence (none turned off); each fused op on the device against the CPU
 * oracle's on the same inputs (the matmuls over bf16, f16, f32 and FP8
 * weights), decode-sized and past the kernels' limits (where they decline
 * and the sequence runs). Skips loudly without a device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kn-cuda.h"
#include "kernels/kn-backend-impl.h"
#include "tests/harness/th.h"
#include "tests/unit/cuda/cuda-test-util.h"

TH_TEST(cuda_fused_check_passes) {
  struct ct_env e;
  ct_open(&e, 41);
  char why[256];
  unsigned bad = kn_fused_check(e.gpu, 1e-5, why, sizeof why);
  if (bad) th_fail(__FILE__, __LINE__, "fused kernels 0x%x differ: %s", bad, why);
  ct_close(&e);
}

TH_TEST(cuda_add_norm_matches_cpu) {
  struct ct_env e;
  ct_open(&e, 42);
  static const int Hs[] = {640, 1152, 2560, 13000}; /* the last past the kernel's row limit */
  for (size_t hi = 0; hi < 4; hi++)
    for (int T = 1; T <= 9; T += 4) {
      int H = Hs[hi];
      size_t n = (size_t)T * H;
      float *x = malloc(sizeof(float) * n), *o = malloc(sizeof(float) * n);
      float *pw = malloc(sizeof(float) * H), *nw = malloc(sizeof(float) * H);
      TH_REQUIRE(x && o && pw && nw);
      ct_fill(&e, x, n, 3.0f);
      ct_fill(&e, o, n, 1.0f);
      ct_fill(&e, pw, (size_t)H, 1.0f);
      ct_fill(&e, nw, (size_t)H, 1.0f);
      float *xd = ct_up(&e, x, sizeof(float) * n), *od = ct_up(&e, o, sizeof(float) * n);
      float *pwd = ct_up(&e, pw, sizeof(float) * H), *nwd = ct_up(&e, nw, sizeof(float) * H);
      struct ct_out h;
      ct_out_init(&e, &h, n, 0);
      TH_REQUIRE(kn_add_norm(e.cpu, x, H, o, H, h.ref, H, T, H, pw, nw, KN_DTYPE_F32, 0.8f, 1e-6f,
                             KN_NORM_MUL_W) == 0);
      TH_REQUIRE(kn_add_norm(e.gpu, xd, H, od, H, h.dev, H, T, H, pwd, nwd, KN_DTYPE_F32, 0.8f,
                             1e-6f, KN_NORM_MUL_W) == 0);
      float *xg = malloc(sizeof(float) * n);
      TH_REQUIRE(xg);
      ct_down(&e, xg, xd, sizeof(float) * n);
      ct_compare("add_norm x", x, xg, T, H, H, n, 1e-10);
      ct_out_check(&e, &h, T, H, H, 1e-10, "add_norm h H=%d T=%d", H, T);
      kn_free(e.gpu, xd), kn_free(e.gpu, od), kn_free(e.gpu, pwd), kn_free(e.gpu, nwd);
      free(x), free(o), free(pw), free(nw), free(xg);
    }
  ct_close(&e);
}

TH_TEST(cuda_matmul_n_and_glu_match_cpu) {
  struct ct_env e;
  ct_open(&e, 43);
  static const enum kn_dtype dts[] = {KN_DTYPE_BF16, KN_DTYPE_F16, KN_DTYPE_F32};
  const int K = 1152, N = 256;
  for (size_t di = 0; di < 3; di++)
    for (int T = 1; T <= 12; T += 11) { /* 12: past the few-rows kernel, the sequence runs */
      enum kn_dtype dt = dts[di];
      void *wg = ct_weights(&e, dt, (size_t)N * K, 0.05f),
           *wu = ct_weights(&e, dt, (size_t)N * K, 0.05f);
      float *in = malloc(sizeof(float) * T * K);
      TH_REQUIRE(in);
      ct_fill(&e, in, (size_t)T * K, 1.0f);
      size_t wb = (size_t)N * K * kn_dtype_size(dt);
      void *wgd = ct_up(&e, wg, wb), *wud = ct_up(&e, wu, wb);
      float *ind = ct_up(&e, in, sizeof(float) * T * K);
      struct ct_out a, b, g;
      ct_out_init(&e, &a, (size_t)T * N, 0);
      ct_out_init(&e, &b, (size_t)T * N, 0);
      ct_out_init(&e, &g, (size_t)T * N, 0);
      struct kn_mm_part pc[2] = {{a.ref, N, wg, N}, {b.ref, N, wu, N}};
      struct kn_mm_part pg[2] = {{a.dev, N, wgd, N}, {b.dev, N, wud, N}};
      TH_REQUIRE(kn_matmul_n(e.cpu, in, K, dt, T, K, pc, 2) == 0);
      TH_REQUIRE(kn_matmul_n(e.gpu, ind, K, dt, T, K, pg, 2) == 0);
      float *scratch_c = malloc(sizeof(float) * T * N),
            *scratch_g = kn_alloc(e.gpu, sizeof(float) * T * N);
      TH_REQUIRE(scratch_c && scratch_g);
      TH_REQUIRE(
          kn_matmul_glu(e.cpu, g.ref, N, in, K, wg, NULL, wu, NULL, dt, T, N, K, scratch_c) == 0);
      TH_REQUIRE(kn_matmul_glu(e.gpu, g.dev, N, ind, K, wgd, NULL, wud, NULL, dt, T, N, K,
                               scratch_g) == 0);
      double tol = dt == KN_DTYPE_F32 ? 1e-9 : 3e-5;
      ct_out_check(&e, &a, T, N, N, tol, "matmul_n gate %s T=%d", kn_dtype_name(dt), T);
      ct_out_check(&e, &b, T, N, N, tol, "matmul_n up %s T=%d", kn_dtype_name(dt), T);
      ct_out_check(&e, &g, T, N, N, 2 * tol, "matmul_glu %s T=%d", kn_dtype_name(dt), T);
      kn_free(e.gpu, wgd), kn_free(e.gpu, wud), kn_free(e.gpu, ind), kn_free(e.gpu, scratch_g);
      free(wg), free(wu), free(in), free(scratch_c);
    }
  ct_close(&e);
}

/* A random [N, K] weight quantized per output feature as --quantization fp8
 * does: codes and scales on the host (malloc'd) and their device copies. */
struct fp8_w {
  uint8_t *q;
  float *s;
  void *q_d;
  float *s_d;
};

static void fp8_w_init(struct ct_env *e, struct fp8_w *w, int N, int K) {
  float *wf = malloc(sizeof(float) * (size_t)N * K);
  w->q = malloc((size_t)N * K);
  w->s = malloc(sizeof(float) * (size_t)N);
  TH_REQUIRE(wf && w->q && w->s);
  ct_fill(e, wf, (size_t)N * K, 0.05f);
  TH_REQUIRE(kn_fp8_quantize_rows(w->q, w->s, wf, KN_DTYPE_F32, K, N, K, NULL) == 0);
  free(wf);
  w->q_d = ct_up(e, w->q, (size_t)N * K);
  w->s_d = ct_up(e, w->s, sizeof(float) * (size_t)N);
}

static void fp8_w_free(struct ct_env *e, struct fp8_w *w) {
  kn_free(e->gpu, w->q_d), kn_free(e->gpu, w->s_d);
  free(w->q), free(w->s);
}

/* FP8 weights through the fused ops on the device against the CPU oracle on
 * the same codes and scales: the fused few-rows kernels (T <= 32, several
 * launches past 8 rows), and past them the sequence of kn_matmul_fp8 (the
 * widened GEMM at 33; from KN_FP8_ACT_MIN_T rows cuBLASLt's FP8 GEMM, whose
 * inputs lose bits to e4m3: test-cuda-fp8's NMSE bound of 1e-3). */
TH_TEST(cuda_fp8_matmul_n_and_glu_match_cpu) {
  struct ct_env e;
  ct_open(&e, 45);
  const int K = 1168, NQ = 264, NKV = 72; /* N not multiples of 16 */
  const enum kn_dtype dt = KN_DTYPE_F8E4M3;
  struct fp8_w wq, wk, wv, wg, wu;
  fp8_w_init(&e, &wq, NQ, K);
  fp8_w_init(&e, &wk, NKV, K);
  fp8_w_init(&e, &wv, NKV, K);
  fp8_w_init(&e, &wg, NQ, K);
  fp8_w_init(&e, &wu, NQ, K);
  static const int Ts[] = {1, 3, 8, 21, 33, 70};
  for (size_t ti = 0; ti < sizeof(Ts) / sizeof(Ts[0]); ti++) {
    int T = Ts[ti];
    double tol = T >= KN_FP8_ACT_MIN_T ? 1e-3 : 1e-10;
    float *in = malloc(sizeof(float) * (size_t)T * K), *scratch_c = malloc(sizeof(float) * T * NQ);
    TH_REQUIRE(in && scratch_c);
    ct_fill(&e, in, (size_t)T * K, 3.0f);
    float *ind = ct_up(&e, in, sizeof(float) * (size_t)T * K);
    float *scratch_g = kn_alloc(e.gpu, sizeof(float) * (size_t)T * NQ);
    TH_REQUIRE(scratch_g);
    struct ct_out q, k, v, g;
    ct_out_init(&e, &q, (size_t)T * NQ, 0);
    ct_out_init(&e, &k, (size_t)T * NKV, 0);
    ct_out_init(&e, &v, (size_t)T * NKV, 0);
    ct_out_init(&e, &g, (size_t)T * NQ, 0);
    struct kn_mm_part pc[3] = {
        {q.ref, NQ, wq.q, NQ, wq.s}, {k.ref, NKV, wk.q, NKV, wk.s}, {v.ref, NKV, wv.q, NKV, wv.s}};
    struct kn_mm_part pg[3] = {{q.dev, NQ, wq.q_d, NQ, wq.s_d},
                               {k.dev, NKV, wk.q_d, NKV, wk.s_d},
                               {v.dev, NKV, wv.q_d, NKV, wv.s_d}};
    TH_REQUIRE(kn_matmul_n(e.cpu, in, K, dt, T, K, pc, 3) == 0);
    TH_REQUIRE(kn_matmul_n(e.gpu, ind, K, dt, T, K, pg, 3) == 0);
    TH_REQUIRE(kn_matmul_glu(e.cpu, g.ref, NQ, in, K, wg.q, wg.s, wu.q, wu.s, dt, T, NQ, K,
                             scratch_c) == 0);
    TH_REQUIRE(kn_matmul_glu(e.gpu, g.dev, NQ, ind, K, wg.q_d, wg.s_d, wu.q_d, wu.s_d, dt, T, NQ, K,
                             scratch_g) == 0);
    ct_out_check(&e, &q, T, NQ, NQ, tol, "fp8 matmul_n q T=%d", T);
    ct_out_check(&e, &k, T, NKV, NKV, tol, "fp8 matmul_n k T=%d", T);
    ct_out_check(&e, &v, T, NKV, NKV, tol, "fp8 matmul_n v T=%d", T);
    /* the GELU product compounds the two matmuls' errors */
    ct_out_check(&e, &g, T, NQ, NQ, 4 * tol, "fp8 matmul_glu T=%d", T);
    kn_free(e.gpu, ind), kn_free(e.gpu, scratch_g);
    free(in), free(scratch_c);
  }
  fp8_w_free(&e, &wq), fp8_w_free(&e, &wk), fp8_w_free(&e, &wv);
  fp8_w_free(&e, &wg), fp8_w_free(&e, &wu);
  ct_close(&e);
}

/* One decode-sized layer's q/k/v through kn_qkv_prep on both backends: q and
 * the pages compared (bf16 pages: one rounding of values within 1e-6). */
TH_TEST(cuda_qkv_prep_matches_cpu) {
  struct ct_env e;
  ct_open(&e, 44);
  static const int Ds[] = {256, 512};
  for (int di = 0; di < 2; di++)
    for (int with_kv = 0; with_kv < 2; with_kv++) {
      const int T = 3, nh = 8, kvh = 2, D = Ds[di], bt = 16, n_pages = 6;
      size_t blk = (size_t)bt * kvh * D * 2;
      struct kn_kv_view view = {.page_bytes = 2 * blk,
                                .n_pages = n_pages,
                                .k_off = 0,
                                .v_off = blk,
                                .block_tokens = bt,
                                .n_kv_heads = kvh,
                                .head_dim = D,
                                .dtype = KN_DTYPE_BF16};
      size_t pool = (size_t)n_pages * view.page_bytes, nq = (size_t)T * nh * D,
             nk = (size_t)T * kvh * D;
      float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk),
            *v = malloc(sizeof(float) * nk), *qw = malloc(sizeof(float) * D),
            *kw = malloc(sizeof(float) * D), *freq = malloc(sizeof(float) * D / 2);
      unsigned char *pc = calloc(1, pool), *pg = malloc(pool);
      TH_REQUIRE(q && k && v && qw && kw && freq && pc && pg);
      ct_fill(&e, q, nq, 3.0f), ct_fill(&e, k, nk, 3.0f), ct_fill(&e, v, nk, 3.0f);
      ct_fill(&e, qw, (size_t)D, 1.0f), ct_fill(&e, kw, (size_t)D, 1.0f);
      for (int i = 0; i < D / 2; i++)
        freq[i] = powf(1e6f, -2.0f * (float)i / (float)D);
      int32_t pos[3] = {700, 4095, 131000}, slots[3] = {5, 40, 81};
      float *qd = ct_up(&e, q, sizeof(float) * nq), *kd = ct_up(&e, k, sizeof(float) * nk);
      float *vd = ct_up(&e, v, sizeof(float) * nk), *qwd = ct_up(&e, qw, sizeof(float) * D);
      float *kwd = ct_up(&e, kw, sizeof(float) * D), *fd = ct_up(&e, freq, sizeof(float) * D / 2);
      void *pd = ct_up(&e, pc, pool);
      struct kn_qkv_prep_args a = {.q = q,
                                   .ldq = (ptrdiff_t)nh * D,
                                   .n_heads = nh,
                                   .k = with_kv ? k : NULL,
                                   .v = with_kv ? v : NULL,
                                   .ldk = (ptrdiff_t)kvh * D,
                                   .ldv = (ptrdiff_t)kvh * D,
                                   .q_w = qw,
                                   .k_w = kw,
                                   .wdt = KN_DTYPE_F32,
                                   .eps = 1e-6f,
                                   .mode = KN_NORM_MUL_W,
                                   .v_norm = 1,
                                   .pos = pos,
                                   .inv_freq = freq,
                                   .view = &view,
                                   .slots = slots};
      view.pool = pc;
      TH_REQUIRE(kn_qkv_prep(e.cpu, &a, T) == 0);
      struct kn_kv_view vg = view;
      vg.pool = pd;
      a.q = qd, a.k = with_kv ? kd : NULL, a.v = with_kv ? vd : NULL, a.q_w = qwd, a.k_w = kwd;
      a.inv_freq = fd, a.view = &vg;
      TH_REQUIRE(kn_qkv_prep(e.gpu, &a, T) == 0);
      float *qg = malloc(sizeof(float) * nq);
      TH_REQUIRE(qg);
      ct_down(&e, qg, qd, sizeof(float) * nq);
      ct_down(&e, pg, pd, pool);
      ct_compare("qkv_prep q", q, qg, T, nh * D, (ptrdiff_t)nh * D, nq, 1e-10);
      size_t ne = pool / 2, worse = 0;
      for (size_t i = 0; i < ne; i++) {
        float x = kn_bf16_to_f32(((uint16_t *)pc)[i]), y = kn_bf16_to_f32(((uint16_t *)pg)[i]);
        worse += !(fabsf(x - y) <= 1e-2f * fabsf(x) + 1e-6f);
      }
      if (worse) th_fail(__FILE__, __LINE__, "D=%d: %zu page elements differ", D, worse);
      kn_free(e.gpu, qd), kn_free(e.gpu, kd), kn_free(e.gpu, vd), kn_free(e.gpu, qwd);
      kn_free(e.gpu, kwd), kn_free(e.gpu, fd), kn_free(e.gpu, pd);
      free(q), free(k), free(v), free(qw), free(kw), free(freq), free(pc), free(pg), free(qg);
    }
  ct_close(&e);
}
