/* kn-cpu-q8-vnni.c — the q8 mode's register tiles (kn-cpu-q8-tile.h) with
 * AVX-512 VNNI's vpdpbusd on 256-bit registers: four products summed into a
 * lane in one instruction (the same integer as vpmaddubsw + vpmaddwd), and
 * AVX-512VL's 32 vector registers for tiles of 4 rows x 4 tokens. The
 * reference's bits (kn-cpu-q8.c), as the AVX2 tiles; one token of Q8_0 / Q4_0
 * keeps the AVX2 decode kernel. */
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kn-cpu-avx2.h"
#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/kn-quant.h"

#define Q8T_ATTR __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))
#define Q8T_VNNI 1
#define Q8_R     4
#define Q8_U     4
#include "kernels/cpu/kn-cpu-q8-tile.h"

/* Q8_0 and Q4_0: one token streams each row once (the decode kernel), more
 * run the tiles; the other formats run the tiles at every T. */
#define DEF_Q8DOT(SUF, DT)                                                                         \
  Q8T_ATTR static void q8dot_##SUF(float *out, ptrdiff_t ldo, const uint8_t *x, size_t ldx,        \
                                   const int32_t *xs, const uint8_t *w, size_t row_bytes, int K,   \
                                   int T, int n, int acc) {                                        \
    if (T == 1 && (DT == KN_DTYPE_Q8_0 || DT == KN_DTYPE_Q4_0))                                    \
      kn_cpu_q8_one_avx2(DT, out, x, xs, w, row_bytes, K, n, acc);                                 \
    else                                                                                           \
      tiled(tiles_##SUF, out, ldo, x, ldx, xs, w, row_bytes, K, T, n, acc);                        \
  }

DEF_Q8DOT(q8_0, KN_DTYPE_Q8_0)
DEF_Q8DOT(q4_0, KN_DTYPE_Q4_0)
DEF_Q8DOT(q4_1, KN_DTYPE_Q4_1)
DEF_Q8DOT(q5_0, KN_DTYPE_Q5_0)
DEF_Q8DOT(q5_1, KN_DTYPE_Q5_1)
DEF_Q8DOT(q4_k, KN_DTYPE_Q4_K)
DEF_Q8DOT(q5_k, KN_DTYPE_Q5_K)
DEF_Q8DOT(q6_k, KN_DTYPE_Q6_K)

void kn_cpu_dsp_init_q8_vnni(struct kn_cpu_dsp *dsp) {
  dsp->q8dot[KN_DTYPE_Q8_0] = q8dot_q8_0;
  dsp->q8dot[KN_DTYPE_Q4_0] = q8dot_q4_0;
  dsp->q8dot[KN_DTYPE_Q4_1] = q8dot_q4_1;
  dsp->q8dot[KN_DTYPE_Q5_0] = q8dot_q5_0;
  dsp->q8dot[KN_DTYPE_Q5_1] = q8dot_q5_1;
  dsp->q8dot[KN_DTYPE_Q4_K] = q8dot_q4_k;
  dsp->q8dot[KN_DTYPE_Q5_K] = q8dot_q5_k;
  dsp->q8dot[KN_DTYPE_Q6_K] = q8dot_q6_k;
}
