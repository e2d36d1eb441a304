/* kn-cpu-q8-avx2.c — the q8 mode's integer dot products (kn_cpu_dsp.q8dot) in
 * AVX2, with kn-cpu-q8.c's bits: weight blocks against inputs rounded to Q8_0
 * blocks, four products summed exactly at a time (vpmaddubsw + vpmaddwd).
 *
 * Register tiles of kn-cpu-q8-tile.h: 8 tokens (prefill) or 8 rows (a few
 * tokens) in a register's lanes, each a block's one integer. */
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kn-cpu-avx2.h"
#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/kn-quant.h"

#define Q8T_ATTR KN_AVX2
#define Q8T_VNNI 0
#define Q8T_ZMM  0
#include "kernels/cpu/kn-cpu-q8-tile.h"

void kn_cpu_dsp_init_q8_avx2(struct kn_cpu_dsp *dsp) {
  q8t_init(dsp);
}
