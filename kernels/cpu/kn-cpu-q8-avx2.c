/* kn-cpu-q8-avx2.c — the q8 mode's integer dot products (kn_cpu_dsp.q8dot) in
 * AVX2, with kn-cpu-q8.c's bits: weight blocks against inputs rounded to Q8_0
 * blocks, each lane's four products summed exactly (vpmaddubsw + vpmaddwd),
 * the sum times the two blocks' scales added into the lane's accumulator with
 * one rounding, even and odd blocks in two chains.
 *
 * Register tiles of kn-cpu-q8-tile.h: several tokens (prefill) run tiles of
 * Q8_R rows x Q8_U tokens, each weight block unpacked once for the tile's
 * tokens and each input block loaded once for its rows; one token (decode)
 * streams Q8_R1 rows side by side, sharing each input block. */
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kn-cpu-avx2.h"
#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/kn-quant.h"

/* AVX2 register tiles of 2 rows x 4 tokens (16 ymm registers), decode 4 rows. */
#define Q8T_ATTR KN_AVX2
#define Q8T_VNNI 0
#define Q8_R     2
#define Q8_U     4
#define Q8_R1    4
#include "kernels/cpu/kn-cpu-q8-tile.h"

void kn_cpu_dsp_init_q8_avx2(struct kn_cpu_dsp *dsp) {
  q8t_init(dsp);
}
