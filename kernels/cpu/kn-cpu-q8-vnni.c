/* kn-cpu-q8-vnni.c — the q8 mode's register tiles (kn-cpu-q8-tile.h) with
 * AVX-512 VNNI's vpdpbusd: four products summed into a lane in one
 * instruction (the same integer as vpmaddubsw + vpmaddwd), 16 tokens side by
 * side in 512-bit registers, a K-quant's sub-blocks in pairs for one token.
 * The reference's bits (kn-cpu-q8.c), as the AVX2 tiles. */
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kn-cpu-avx2.h"
#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/kn-quant.h"

#define Q8T_ATTR                                                                                   \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")))
#define Q8T_VNNI 1
#define Q8T_ZMM  1
#include "kernels/cpu/kn-cpu-q8-tile.h"

void kn_cpu_dsp_init_q8_vnni(struct kn_cpu_dsp *dsp) {
  q8t_init(dsp);
}
