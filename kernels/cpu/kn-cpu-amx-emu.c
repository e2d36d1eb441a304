/* kn-cpu-amx-emu.c — kn-cpu-amx.c's kernels with each tile instruction a C
 * function (kn_cpu_dsp_init_amx_emulated): the tests' check of the AMX table's
 * layout, edges and batch invariance on processors without the tiles. */
#define KN_AMX_EMULATE 1
#include "kernels/cpu/kn-cpu-amx.c"
