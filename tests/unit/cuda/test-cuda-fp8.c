/* test-cuda-fp8.c — FP8 weights on the device (kn-cuda-fp8.c): the backend
 * serves them on compute capability 8.9+ (and says why not below); every
 * path of kn_matmul_fp8 (the few-rows kernel, the widened GEMM, cuBLASLt's
 * FP8 GEMM from KN_FP8_ACT_MIN_T rows) against the CPU's reference kernels
 * on the same codes and scales; a --quantization fp8 model on the device
 * against the same model on the CPU's reference. Skips loudly without a
 * device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kn-cuda.h"
#include "tests/harness/th.h"
#include "tests/unit/cuda/cuda-test-util.h"

TH_TEST(cuda_fp8_matmul_matches_cpu) {
  struct ct_env e;
  ct_open(&e, 81);
  char why[256] = "";
  int served = kn_fp8_weights(e.gpu, why, sizeof(why)) == 0;
  printf("# FP8 weights served: %s%s\n", served ? "yes" : "no: ", why);
  static const struct {
    int T, N, K;
    double tol; /* NMSE; from KN_FP8_ACT_MIN_T rows the device quantizes its inputs */
  } cases[] = {{1, 1152, 1152, 1e-10}, {3, 257, 320, 1e-10},  {8, 6912, 1152, 1e-10},
               {21, 256, 1152, 1e-10}, {40, 96, 1168, 1e-10}, {13, 33, 100, 1e-10},
               {64, 1024, 1152, 1e-3}, {200, 512, 2048, 1e-3}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    int T = cases[i].T, N = cases[i].N, K = cases[i].K;
    float *in = malloc(sizeof(float) * (size_t)T * K), *wf = malloc(sizeof(float) * (size_t)N * K);
    uint8_t *w = malloc((size_t)N * K);
    float *scale = malloc(sizeof(float) * (size_t)N);
    TH_REQUIRE(in && wf && w && scale);
    ct_fill(&e, in, (size_t)T * K, 3.0f);
    ct_fill(&e, wf, (size_t)N * K, 0.05f);
    TH_REQUIRE(kn_fp8_quantize_rows(w, scale, wf, KN_DTYPE_F32, K, N, K, NULL) == 0);
    float *in_d = ct_up(&e, in, sizeof(float) * (size_t)T * K);
    void *w_d = ct_up(&e, w, (size_t)N * K);
    float *s_d = ct_up(&e, scale, sizeof(float) * (size_t)N);
    for (int acc = 0; acc < 2; acc++) {
      struct ct_out o;
      ct_out_init(&e, &o, (size_t)T * N, acc ? 1.0f : 0.0f);
      TH_REQUIRE(kn_matmul_fp8(e.cpu, o.ref, N, in, K, w, scale, T, N, K, acc) == 0);
      TH_REQUIRE(kn_matmul_fp8(e.gpu, o.dev, N, in_d, K, w_d, s_d, T, N, K, acc) == 0);
      ct_out_check(&e, &o, T, N, N, cases[i].tol, "matmul_fp8 T=%d N=%d K=%d acc=%d", T, N, K, acc);
    }
    kn_free(e.gpu, in_d), kn_free(e.gpu, w_d), kn_free(e.gpu, s_d);
    free(in), free(wf), free(w), free(scale);
  }
  ct_close(&e);
}
