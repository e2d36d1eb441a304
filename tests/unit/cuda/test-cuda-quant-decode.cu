/* test-cuda-quant-decode.cu — the device kernels' decode of ggml's block
 * formats (kn-cuda-quant.cuh: row_oct<DT>, which the few-rows matmul, the
 * bf16 tiles and the embedding all read through) run on the host: every
 * format's rows, quantized from random values and made of random bytes
 * (finite scales; the formats of llama.cpp's files that nothing here writes,
 * random bytes only), give kn_dequant_row's bits octet by octet. Needs no
 * device, so the CPU-only runs check the indexing of every layout. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kn-cuda-quant.cuh"
extern "C" {
#include "kernels/kn-quant.h"
#define _Noreturn [[noreturn]] /* th.h is C11 */
#include "tests/harness/th.h"
#undef _Noreturn
}

enum { ROW_BLOCKS = 3, ROWS = 300 };

static uint64_t g_rng = 0x71756e74;

static uint32_t next_u32() {
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(g_rng >> 32);
}

/* Row r of the case: quantized from values of a few magnitudes (with zeros),
 * or for every third row, and every row of the formats kn_quantize_row cannot
 * write, random blocks (kn_random_blocks: finite scales). */
static void make_row(enum kn_dtype dt, int r, uint8_t *q, float *x, int K) {
  if (!kn_dtype_lowbit(dt) && r % 3 != 2) {
    for (int k = 0; k < K; k++)
      x[k] = k % 17 == 5 ? 0.0f
                         : ((float)(next_u32() >> 8) / 16777216.0f - 0.5f) * (float)(1 + r % 9);
    TH_REQUIRE(kn_quantize_row(dt, x, q, (size_t)K) == 0);
    return;
  }
  uint64_t s = (uint64_t)next_u32() << 1 | 1;
  kn_random_blocks(dt, q, (size_t)K / (size_t)kn_block_elems(dt), &s);
}

template <int DT> static void check_format() {
  const enum kn_dtype dt = (enum kn_dtype)DT;
  const int K = ROW_BLOCKS * kn_block_elems(dt);
  uint8_t *q = (uint8_t *)malloc(kn_row_bytes(dt, (size_t)K));
  float *x = (float *)malloc(sizeof(float) * K), *ref = (float *)malloc(sizeof(float) * K),
        *got = (float *)malloc(sizeof(float) * K);
  TH_REQUIRE(q && x && ref && got);
  for (int r = 0; r < ROWS; r++) {
    make_row(dt, r, q, x, K);
    kn_dequant_row(dt, q, ref, (size_t)K);
    for (int o = 0; o < K / 8; o++)
      row_oct<DT>(q, o, got + 8 * o);
    for (int k = 0; k < K; k++)
      if (memcmp(&ref[k], &got[k], sizeof(float))) {
        th_fail(__FILE__, __LINE__, "%s row %d element %d: %.9g, kn_dequant_row %.9g",
                kn_dtype_name(dt), r, k, got[k], ref[k]);
        r = ROWS;
        break;
      }
  }
  free(q), free(x), free(ref), free(got);
}

TH_TEST(block_decode_gives_the_reference_bits) {
  check_format<KN_DTYPE_Q8_0>();
  check_format<KN_DTYPE_Q4_0>();
  check_format<KN_DTYPE_Q4_1>();
  check_format<KN_DTYPE_Q5_0>();
  check_format<KN_DTYPE_Q5_1>();
  check_format<KN_DTYPE_Q4_K>();
  check_format<KN_DTYPE_Q5_K>();
  check_format<KN_DTYPE_Q6_K>();
  check_format<KN_DTYPE_Q3_K>();
  check_format<KN_DTYPE_IQ4_NL>();
  check_format<KN_DTYPE_IQ4_XS>();
  check_format<KN_DTYPE_Q2_K>();
}
