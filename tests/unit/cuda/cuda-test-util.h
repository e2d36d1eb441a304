/* cuda-test-util.h — shared pieces of the CUDA op tests: a CPU-oracle + CUDA
 * backend pair, a seeded generator, device upload / download helpers and the
 * comparison (normalised mean squared error over the valid elements, exact
 * equality of everything an op must leave untouched, NaN / Inf checks). */
#ifndef LMSERVE_TESTS_CUDA_TEST_UTIL_H
#define LMSERVE_TESTS_CUDA_TEST_UTIL_H
#include <stddef.h>
#include <stdint.h>

#include "kernels/kn-backend.h"

struct ct_env {
  struct kn_backend *cpu; /* the oracle */
  struct kn_backend *gpu;
  uint64_t rng;
};

/* Skips the calling test loudly when no CUDA device is visible; otherwise
 * creates both backends (failing the test when that fails). */
void ct_open(struct ct_env *e, uint64_t seed);
void ct_close(struct ct_env *e);

/* Uniform in [-amp, amp). */
float ct_rand(struct ct_env *e, float amp);
int ct_rand_int(struct ct_env *e, int n); /* [0, n) */
void ct_fill(struct ct_env *e, float *x, size_t n, float amp);
/* n random values in [-amp, amp) stored as dtype dt (malloc'd, caller frees). */
void *ct_weights(struct ct_env *e, enum kn_dtype dt, size_t n, float amp);

/* Device copy of host[bytes] (kn_free it); fails the test on error. */
void *ct_up(struct ct_env *e, const void *host, size_t bytes);
void ct_down(struct ct_env *e, void *host, const void *dev, size_t bytes);

/* Compares got with ref over rows x cols (row stride ld, total elements
 * total): the NMSE of the valid elements must be <= tol, a non-finite value
 * in got must match a non-finite one in ref, and every element outside the
 * valid region must be bit-identical. Reports failures with `what`. */
void ct_compare_at(const char *file, int line, const char *what, const float *ref, const float *got,
                   int rows, int cols, ptrdiff_t ld, size_t total, double tol);
#define ct_compare(what, ref, got, rows, cols, ld, total, tol)                                     \
  ct_compare_at(__FILE__, __LINE__, (what), (ref), (got), (rows), (cols), (ld), (total), (tol))

/* Buffer of n floats filled with a sentinel pattern (malloc'd). */
float *ct_sentinel(size_t n);

#endif
