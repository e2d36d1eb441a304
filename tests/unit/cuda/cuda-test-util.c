/* cuda-test-util.c — helpers for the CUDA op tests (see cuda-test-util.h). */
#include "tests/unit/cuda/cuda-test-util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu.h"
#include "kernels/cuda/kn-cuda.h"
#include "tests/harness/th.h"

static char g_skip_why[160];

void ct_open(struct ct_env *e, uint64_t seed) {
  memset(e, 0, sizeof(*e));
  int n = kn_cuda_device_count();
  if (n <= 0) {
    snprintf(g_skip_why, sizeof(g_skip_why),
             "no CUDA device visible: %d devices (the CPU oracle comparison needs one)", n);
    TH_SKIP(g_skip_why);
  }
  e->rng = seed * 0x9e3779b97f4a7c15ull + 1;
  TH_REQUIRE(kn_cpu_backend_create(0, &e->cpu) == 0);
  int err = kn_cuda_backend_create(0, &e->gpu);
  if (err) th_fail(__FILE__, __LINE__, "kn_cuda_backend_create: %s", cm_strerror(err));
  TH_REQUIRE(e->gpu != NULL);
}

void ct_close(struct ct_env *e) {
  kn_backend_destroy(e->gpu);
  kn_backend_destroy(e->cpu);
  e->gpu = e->cpu = NULL;
}

static uint64_t next(struct ct_env *e) {
  /* xorshift64* */
  e->rng ^= e->rng >> 12;
  e->rng ^= e->rng << 25;
  e->rng ^= e->rng >> 27;
  return e->rng * 0x2545f4914f6cdd1dull;
}

float ct_rand(struct ct_env *e, float amp) {
  double u = (double)(next(e) >> 11) * (1.0 / 9007199254740992.0); /* [0, 1) */
  return (float)((2.0 * u - 1.0) * amp);
}

int ct_rand_int(struct ct_env *e, int n) {
  return (int)(next(e) % (uint64_t)n);
}

void ct_fill(struct ct_env *e, float *x, size_t n, float amp) {
  for (size_t i = 0; i < n; i++)
    x[i] = ct_rand(e, amp);
}

void *ct_weights(struct ct_env *e, enum kn_dtype dt, size_t n, float amp) {
  void *w = malloc(n * kn_dtype_size(dt) + 1);
  TH_REQUIRE(w != NULL);
  for (size_t i = 0; i < n; i++)
    kn_store_f32(w, dt, i, ct_rand(e, amp));
  return w;
}

void *ct_up(struct ct_env *e, const void *host, size_t bytes) {
  void *d = kn_alloc(e->gpu, bytes);
  TH_REQUIRE(d != NULL);
  TH_REQUIRE(kn_upload(e->gpu, d, host, bytes) == 0);
  return d;
}

void ct_down(struct ct_env *e, void *host, const void *dev, size_t bytes) {
  TH_REQUIRE(kn_download(e->gpu, host, dev, bytes) == 0);
}

float *ct_sentinel(size_t n) {
  float *x = malloc((n ? n : 1) * sizeof(float));
  TH_REQUIRE(x != NULL);
  for (size_t i = 0; i < n; i++)
    x[i] = -12345.0f - (float)(i % 97);
  return x;
}

void ct_compare_at(const char *file, int line, const char *what, const float *ref, const float *got,
                   int rows, int cols, ptrdiff_t ld, size_t total, double tol) {
  double num = 0.0, den = 0.0;
  long long nonfinite = 0, outside = 0;
  size_t first_outside = 0;
  unsigned char *valid = calloc(total ? total : 1, 1);
  TH_REQUIRE(valid != NULL);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      size_t i = (size_t)r * (size_t)ld + (size_t)c;
      if (i >= total) continue;
      valid[i] = 1;
      double a = ref[i], b = got[i];
      if (!isfinite(a) || !isfinite(b)) {
        /* both non-finite of the same kind is agreement */
        if (!((isnan(a) && isnan(b)) || (isinf(a) && a == b))) nonfinite++;
        continue;
      }
      num += (a - b) * (a - b);
      den += a * a;
    }
  for (size_t i = 0; i < total; i++)
    if (!valid[i] && memcmp(&ref[i], &got[i], sizeof(float)) != 0) {
      if (!outside) first_outside = i;
      outside++;
    }
  free(valid);
  double nmse = den > 0.0 ? num / den : num;
  if (!(nmse <= tol) || nonfinite || outside)
    th_fail(file, line,
            "%s: nmse %.3g (tol %.3g), %lld non-finite mismatches, %lld elements outside "
            "[%d x %d] changed (first at %zu)",
            what, nmse, tol, nonfinite, outside, rows, cols, first_outside);
}

void ct_out_init(struct ct_env *e, struct ct_out *o, size_t n, float amp) {
  o->n = n;
  o->ref = ct_sentinel(n);
  o->got = ct_sentinel(n);
  if (amp > 0) {
    ct_fill(e, o->ref, n, amp);
    memcpy(o->got, o->ref, n * sizeof(float));
  }
  o->dev = ct_up(e, o->got, n * sizeof(float));
}

void ct_out_check_at(const char *file, int line, struct ct_env *e, struct ct_out *o, int rows,
                     int cols, ptrdiff_t ld, double tol, const char *fmt, ...) {
  char what[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof(what), fmt, ap);
  va_end(ap);
  ct_down(e, o->got, o->dev, o->n * sizeof(float));
  ct_compare_at(file, line, what, o->ref, o->got, rows, cols, ld, o->n, tol);
  kn_free(e->gpu, o->dev);
  free(o->ref);
  free(o->got);
  o->ref = o->got = o->dev = NULL;
}

void ct_in_init(struct ct_env *e, struct ct_in *in, size_t n, float amp) {
  in->host = malloc((n ? n : 1) * sizeof(float));
  TH_REQUIRE(in->host != NULL);
  ct_fill(e, in->host, n, amp);
  in->dev = ct_up(e, in->host, n * sizeof(float));
}

void ct_in_free(struct ct_env *e, struct ct_in *in) {
  kn_free(e->gpu, in->dev);
  free(in->host);
  in->host = in->dev = NULL;
}

void ct_gemm_init(struct ct_env *e, struct ct_gemm *g, enum kn_dtype dt, size_t n_in, float amp,
                  size_t n_w) {
  struct ct_in in; /* the input first: its values come before the weights' */
  ct_in_init(e, &in, n_in, amp);
  g->in = in.host;
  g->in_d = in.dev;
  g->w = ct_weights(e, dt, n_w, 1.0f);
  g->w_d = ct_up(e, g->w, n_w * kn_dtype_size(dt));
}

void ct_gemm_free(struct ct_env *e, struct ct_gemm *g) {
  kn_free(e->gpu, g->in_d);
  kn_free(e->gpu, g->w_d);
  free(g->in);
  free(g->w);
}
