/* kn-cpu-q8-avx2.c — the q8 mode's integer dot products (kn_cpu_dsp.q8dot) in
 * AVX2, with kn-cpu-q8.c's bits: weight blocks against inputs rounded to Q8_0
 * blocks, four products summed exactly at a time (vpmaddubsw + vpmaddwd).
 *
 * Register tiles of kn-cpu-q8-tile.h: the formats summed by lanes run tiles
 * of Q8_R rows x Q8_U tokens (prefill), each weight block unpacked once for
 * the tile's tokens and each input block loaded once for its rows, and one
 * token (decode) streams Q8_R1 rows side by side; Q8_0 and Q4_0 put 8 tokens
 * (prefill) or 8 rows (decode) in a register's lanes. */
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kn-cpu-avx2.h"
#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/kn-quant.h"

/* AVX2 register tiles of 2 rows x 4 tokens (16 ymm registers), decode 4 rows. */
#define Q8T_ATTR KN_AVX2
#define Q8T_VNNI 0
#define Q8T_ZMM  0
#define Q8_R     2
#define Q8_U     4
#define Q8_R1    4
#include "kernels/cpu/kn-cpu-q8-tile.h"

void kn_cpu_dsp_init_q8_avx2(struct kn_cpu_dsp *dsp) {
  q8t_init(dsp);
}
