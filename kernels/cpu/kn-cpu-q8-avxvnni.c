/* kn-cpu-q8-avxvnni.c — the q8 mode's register tiles (kn-cpu-q8-tile.h) as
 * the AVX2 tiles lay them, 8 tokens or rows to a 256-bit register, with
 * AVX-VNNI's vpdpbusd (VEX-encoded: processors with AVX-VNNI and no AVX-512)
 * summing four products into a lane in one instruction where AVX2 takes
 * vpmaddubsw + vpmaddwd + vpaddd: Q8_0 as w + 128 unsigned against x (no
 * signs), the 4- and 5-bit formats' nibbles as they are. The reference's
 * bits (kn-cpu-q8.c), as every table. */
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kn-cpu-avx2.h"
#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/kn-quant.h"

#define Q8T_ATTR    __attribute__((target("avx2,fma,f16c,avxvnni")))
#define Q8T_VNNI    0
#define Q8T_AVXVNNI 1
#define Q8T_ZMM     0
#include "kernels/cpu/kn-cpu-q8-tile.h"

void kn_cpu_dsp_init_q8_avxvnni(struct kn_cpu_dsp *dsp) {
  q8t_init(dsp);
  dsp->isa = KN_CPU_ISA_AVX2VNNI;
}
