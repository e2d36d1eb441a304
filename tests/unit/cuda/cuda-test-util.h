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

/* An op's output on both backends: ref (the oracle's) and got (the device's, read back),
 * n floats each, and dev, the device buffer the op writes. They start as sentinels, or
 * (amp > 0: an op that accumulates) as the same random values in [-amp, amp). */
struct ct_out {
  float *ref, *got, *dev;
  size_t n;
};
void ct_out_init(struct ct_env *e, struct ct_out *o, size_t n, float amp);
/* Reads dev back into got, compares it with ref as ct_compare does (naming the case with
 * the printf-style fmt) and frees the three buffers. */
void ct_out_check_at(const char *file, int line, struct ct_env *e, struct ct_out *o, int rows,
                     int cols, ptrdiff_t ld, double tol, const char *fmt, ...)
    __attribute__((format(printf, 9, 10)));
#define ct_out_check(e, o, rows, cols, ld, tol, ...)                                               \
  ct_out_check_at(__FILE__, __LINE__, (e), (o), (rows), (cols), (ld), (tol), __VA_ARGS__)

/* An op's input: n floats in [-amp, amp) on the host and their device copy. */
struct ct_in {
  float *host, *dev;
};
void ct_in_init(struct ct_env *e, struct ct_in *in, size_t n, float amp);
void ct_in_free(struct ct_env *e, struct ct_in *in);

/* A matmul's operands, on the host and uploaded: n_in floats of input in [-amp, amp)
 * (filled first) and n_w weights of type dt in [-1, 1). */
struct ct_gemm {
  float *in, *in_d;
  void *w, *w_d;
};
void ct_gemm_init(struct ct_env *e, struct ct_gemm *g, enum kn_dtype dt, size_t n_in, float amp,
                  size_t n_w);
void ct_gemm_free(struct ct_env *e, struct ct_gemm *g);

#endif
