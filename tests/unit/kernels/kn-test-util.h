/* kn-test-util.h — helpers for the kernel tests: a seeded generator, random
 * tensors in any dtype, the normalised mean squared error (NMSE) with NaN/Inf
 * checks, sentinel-guarded output buffers, and backends per instruction set. */
#ifndef LMSERVE_KN_TEST_UTIL_H
#define LMSERVE_KN_TEST_UTIL_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kn-cpu.h"
#include "kernels/kn-backend.h"
#include "tests/harness/th.h"

/* ---- random numbers (xorshift64*, reproducible) ------------------------- */

static uint64_t kt_state = 0x9e3779b97f4a7c15ull;

static inline void kt_seed(uint64_t s) {
  kt_state = s * 0x9e3779b97f4a7c15ull + 1;
}

static inline uint64_t kt_next(void) {
  kt_state ^= kt_state >> 12;
  kt_state ^= kt_state << 25;
  kt_state ^= kt_state >> 27;
  return kt_state * 0x2545f4914f6cdd1dull;
}

/* Uniform in [-1, 1). */
static inline float kt_uniform(void) {
  return (float)((kt_next() >> 40) * (2.0 / 16777216.0) - 1.0);
}

static inline int kt_int(int n) {
  return (int)(kt_next() % (uint64_t)n);
}

/* n random values in [-amp, amp) stored as dtype dt (malloc'd). */
static inline void *kt_rand_tensor(enum kn_dtype dt, size_t n, float amp) {
  void *p = malloc(n * kn_dtype_size(dt) + 64);
  TH_REQUIRE(p);
  for (size_t i = 0; i < n; i++)
    kn_store_f32(p, dt, i, kt_uniform() * amp);
  return p;
}

static inline float *kt_rand_f32(size_t n, float amp) {
  return (float *)kt_rand_tensor(KN_DTYPE_F32, n, amp);
}

/* ---- sentinel-guarded outputs ------------------------------------------- */

#define KT_GUARD    64         /* floats of sentinel before and after */
#define KT_SENTINEL 0x7fc0dead /* a NaN pattern no kernel produces */

/* n floats of usable space between two sentinel zones; the usable space is
 * sentinel-filled too (cells a kernel must not touch stay so). */
static inline float *kt_guarded(size_t n) {
  uint32_t *p = malloc((n + 2 * KT_GUARD) * sizeof(float));
  TH_REQUIRE(p);
  for (size_t i = 0; i < n + 2 * KT_GUARD; i++)
    p[i] = KT_SENTINEL;
  return (float *)(p + KT_GUARD);
}

static inline int kt_is_sentinel(const float *f) {
  uint32_t u;
  memcpy(&u, f, 4);
  return u == KT_SENTINEL;
}

/* 1 when both guard zones are intact. */
static inline int kt_guards_ok(const float *p, size_t n) {
  for (size_t i = 1; i <= KT_GUARD; i++)
    if (!kt_is_sentinel(p - i) || !kt_is_sentinel(p + n + i - 1)) return 0;
  return 1;
}

static inline void kt_guarded_free(float *p) {
  if (p) free(p - KT_GUARD);
}

/* ---- comparisons -------------------------------------------------------- */

/* sum (a - b)^2 / sum b^2 over n elements at stride 1; INFINITY when a holds a
 * NaN/Inf that b does not. */
static inline double kt_nmse(const float *a, const float *b, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(a[i]) && isfinite(b[i])) return INFINITY;
    double d = (double)a[i] - (double)b[i];
    num += d * d;
    den += (double)b[i] * (double)b[i];
  }
  return den > 0.0 ? num / den : num;
}

static inline int kt_all_finite(const float *a, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(a[i])) return 0;
  return 1;
}

static inline int kt_bits_equal(const float *a, const float *b, size_t n) {
  return memcmp(a, b, n * sizeof(float)) == 0;
}

/* kt_bits_equal over rows x cols of two strided matrices (row strides lda, ldb). */
static inline int kt_rows_equal(const float *a, ptrdiff_t lda, const float *b, ptrdiff_t ldb,
                                int rows, int cols) {
  for (int r = 0; r < rows; r++)
    if (!kt_bits_equal(a + (ptrdiff_t)r * lda, b + (ptrdiff_t)r * ldb, (size_t)cols)) return 0;
  return 1;
}

/* ---- backends ----------------------------------------------------------- */

/* The reference backend and the best SIMD one (NULL when the processor has no
 * SIMD set; tests then compare the reference with itself and say so). */
static inline struct kn_backend *kt_backend(enum kn_cpu_isa isa, int threads) {
  struct kn_backend *be = NULL;
  TH_REQUIRE(kn_cpu_backend_create_isa(threads, isa, &be) == 0 && be);
  return be;
}

/* Skips the test, saying so, when this processor (under LMSERVE_KERNELS's cap:
 * kn_cpu_isa_detect) lacks `isa`. A skip leaves the test at once, so a test
 * calls this (or kt_isa_backend_mode) before it allocates anything: what it
 * holds then is never freed, and the sanitizer tree fails on the leak. */
static inline void kt_require_isa(enum kn_cpu_isa isa) {
  if (kn_cpu_isa_detect() >= isa) return;
  char why[160];
  snprintf(why, sizeof(why), "this processor%s has no %s: its kernel table was not checked",
           getenv("LMSERVE_KERNELS") ? " (under LMSERVE_KERNELS)" : "", kn_cpu_isa_name(isa));
  TH_SKIP(why);
}

/* The best table of the default mode on this processor (under the cap): the
 * default mode stops at AVX-512. */
static inline enum kn_cpu_isa kt_vector_isa(void) {
  enum kn_cpu_isa isa = kn_cpu_isa_detect();
  return isa > KN_CPU_ISA_AVX512 ? KN_CPU_ISA_AVX512 : isa;
}

/* A backend forced to exactly `isa` (CI machines differ: every table runs
 * where it can); bf16: the bf16 mode. Skips as kt_require_isa does, before
 * it allocates: call it before anything else the test allocates. */
static inline struct kn_backend *kt_isa_backend_mode(enum kn_cpu_isa isa, int threads, int bf16) {
  kt_require_isa(isa);
  struct kn_backend *be = NULL;
  TH_REQUIRE(kn_cpu_backend_create_mode(threads, isa, bf16, &be) == 0 && be);
  char name[32];
  snprintf(name, sizeof(name), "cpu-%s", kn_cpu_isa_name(isa));
  if (strcmp(kn_backend_name(be), name) != 0) { /* the detection and the backend disagree */
    th_fail(__FILE__, __LINE__, "asked for %s (bf16 mode %d), the backend is %s", name, bf16,
            kn_backend_name(be));
    kn_backend_destroy(be);
    th_stop();
  }
  return be;
}

#endif
