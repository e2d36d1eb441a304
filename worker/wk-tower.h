/* wk-tower.h — weight binding and the clippable linear shared by the
 * encoder towers (wk-vision.c, wk-vision-g4.c, wk-audio-g4.c).
 *
 * A binder carries the first failure: every call is a no-op once b->rc is
 * set, and a failing call sets it with one sentence in b->err naming the
 * tensor (the tower's name, `what`, first), so a tower binds all its weights
 * and checks b->rc once. */
#ifndef LMSERVE_WK_TOWER_H
#define LMSERVE_WK_TOWER_H
#include <stddef.h>
#include <stdint.h>

#include "kernels/kn-backend.h"

struct md_st;
struct md_tensor;
struct wk_owned;

struct wk_tower_binder {
  struct kn_backend *be;
  struct wk_owned *owned; /* buffers made here */
  const struct md_st *st;
  const char *what; /* "vision tower", "audio tower": the messages' subject */
  char *err;
  size_t errlen;
  int rc; /* first failure */
};

/* The tensor `name` with exactly the dims given, in a float dtype. */
const struct md_tensor *wk_tower_tensor(struct wk_tower_binder *b, const char *name, int ndim,
                                        const int64_t *dims);
/* Backend memory holding `bytes` of host data (the data itself on backends
 * whose memory is the host's, unless copy). */
const void *wk_tower_place(struct wk_tower_binder *b, const void *data, size_t bytes, int copy);
/* The tensor `name` (dims as given) widened to f32 in backend memory. */
const float *wk_tower_f32(struct wk_tower_binder *b, int ndim, const int64_t *dims,
                          const char *name);
/* The same for a vector of n elements named by a format. */
const float *wk_tower_vec(struct wk_tower_binder *b, int64_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A weight matrix [rows, cols] in backend memory, in its checkpoint dtype,
 * with the clip bounds of a Gemma4ClippableLinear (infinite for a plain
 * nn.Linear, or a tower without clipped linears). */
struct wk_clin {
  const void *w;
  enum kn_dtype dt;
  float in_lo, in_hi, out_lo, out_hi;
};

/* The plain linear `name` [rows, cols] (no bounds). */
struct wk_clin wk_tower_linear(struct wk_tower_binder *b, int64_t rows, int64_t cols,
                               const char *name);
/* A Gemma4ClippableLinear: PREFIX.linear.weight [rows, cols] and, when
 * clipped, its four bounds PREFIX.input_min, input_max, output_min,
 * output_max (one float each, 0-d as torch saves a scalar buffer, or [1];
 * refused when NaN or crossed). */
struct wk_clin wk_tower_clin(struct wk_tower_binder *b, int64_t rows, int64_t cols, int clipped,
                             const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* out[T, N] (stride N) = the clippable linear m of in[T, K] (stride K):
 * the input clamped into scratch (at least T K floats, backend memory) when
 * its bounds are finite, kn_matmul, the output clamped in place. */
int wk_clin_run(struct kn_backend *be, float *scratch, float *out, const float *in,
                const struct wk_clin *m, int T, int N, int K);

#endif
