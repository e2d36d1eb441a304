/* test-kn-argmax.c — the AVX2 (and AVX-512) argmax of a row against the reference: the
 * same index (the first of the largest non-NaN value) and the same value
 * bits, on rows with NaNs, infinities, signed zeros, ties and every tail
 * length, and on vocabulary-sized rows. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kn-cpu-impl.h"
#include "tests/harness/th.h"

static uint32_t rng = 12345;
static uint32_t next(void) {
  rng = rng * 1664525u + 1013904223u;
  return rng >> 8;
}

/* A value from a small set, so that ties and special values are frequent. */
static float pick(int kind) {
  static const float vals[] = {0.0f, -0.0f, 1.0f, -1.0f, 2.5f, INFINITY, -INFINITY};
  uint32_t r = next();
  if (kind == 0) return (float)((int)(r % 2001) - 1000) * 0.01f; /* many distinct values */
  if (r % 9 == 0) return NAN;
  return vals[r % (sizeof(vals) / sizeof(vals[0]))];
}

static int same(const float *row, int n) {
  float a, b;
  int ia = kn_cpu_argmax_row_ref(row, n, &a), ib = kn_cpu_argmax_row_avx2(row, n, &b);
  if (ia != ib) return 0;
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
  if (memcmp(&a, &b, sizeof(a))) return 0;
  if (kn_cpu_isa_detect() >= KN_CPU_ISA_AVX512) { /* the AVX-512 version: the same answers */
    ib = kn_cpu_argmax_row_avx512(row, n, &b);
    if (ia != ib || memcmp(&a, &b, sizeof(a))) return 0;
  }
  return 1;
}

TH_TEST(argmax_avx2_equals_reference) {
  if (kn_cpu_isa_detect() < KN_CPU_ISA_AVX2)
    TH_SKIP("no AVX2 on this processor (or LMSERVE_KERNELS=ref)");
  float row[200];
  int bad = 0;
  for (int n = 1; n <= 200; n++)
    for (int rep = 0; rep < 40; rep++) {
      int kind = rep % 3;
      for (int i = 0; i < n; i++)
        row[i] = pick(kind);
      if (rep % 5 == 4)
        for (int i = 0; i < n; i++)
          row[i] = NAN; /* nothing but NaN: -1 */
      if (!same(row, n)) {
        if (bad++ < 5) th_fail(__FILE__, __LINE__, "row of %d (case %d) differs", n, rep);
      }
    }
  TH_CHECK_EQ_INT(bad, 0);
  /* specific rows: the first of equal maxima, -0 before +0, -inf only */
  float r1[17] = {1, 3, 3, NAN, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3};
  float m;
  TH_CHECK_EQ_INT(kn_cpu_argmax_row_avx2(r1, 17, &m), 1);
  float r2[10] = {-1, -0.0f, 0.0f, -2, -3, -4, -5, -6, -7, -0.0f};
  TH_CHECK_EQ_INT(kn_cpu_argmax_row_avx2(r2, 10, &m), 1);
  TH_CHECK(signbit(m));
  float r3[9] = {NAN, -INFINITY, NAN, -INFINITY, NAN, NAN, NAN, NAN, NAN};
  TH_CHECK_EQ_INT(kn_cpu_argmax_row_avx2(r3, 9, &m), 1);
  TH_CHECK(isinf(m) && m < 0);
  /* vocabulary-sized rows, the maximum in the tail, the middle, the start */
  enum { V = 262144 + 5 };
  float *big = malloc(sizeof(float) * V);
  int at[] = {V - 1, V - 6, 131071, 0};
  for (size_t k = 0; k < sizeof(at) / sizeof(at[0]); k++) {
    for (int i = 0; i < V; i++)
      big[i] = pick(0);
    big[at[k]] = 50.0f;
    TH_CHECK(same(big, V));
    TH_CHECK_EQ_INT(kn_cpu_argmax_row_avx2(big, V, &m), at[k]);
  }
  free(big);
}
