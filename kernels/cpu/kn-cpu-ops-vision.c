/* kn-cpu-ops-vision.c — the CPU backend's vision encoder ops: LayerNorm with
 * bias, the bias + activation of a Linear layer, and average pooling of
 * square patch grids (SigLIP); clamping, pooling of rectangular grids with a
 * scale, and feature-wise standardisation (Gemma 4's tower) (kn-backend.h).
 *
 * Plain C only, like kn-cpu-ref.c: reductions accumulate in double in index
 * order and round once to f32, so they are their own reference and every
 * output row depends only on its inputs (batch invariant). They cost little
 * next to the encoder's matmuls and attention; threads split rows. Arguments
 * were validated by kn-backend.c. */
#include <math.h>

#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/kn-backend-impl.h"
#include "kernels/kn-dtype.h"

/* Below this much work (elements) an op runs on the calling thread. */
#define VISION_PAR_MIN (1 << 15)

enum { V_LAYERNORM, V_BIAS_ACT, V_POOL, V_CLAMP, V_POOL_GRID, V_STANDARDIZE };

#define CLAMP_CHUNK 4096 /* floats per unit of kn_clamp's work */

struct vision_task {
  int op;
  float *out;
  ptrdiff_t ldo;
  const float *x;
  ptrdiff_t ldx;
  int d; /* row length (features) */
  /* layernorm */
  const void *w, *b;
  enum kn_dtype wdt;
  float eps;
  /* bias_act */
  const float *bias;
  enum kn_act act;
  /* avg_pool2d; avg_pool_grid (side = gw, os = gw / k) */
  int side, k, os;
  float scale; /* avg_pool_grid */
  /* clamp */
  float lo, hi;
  size_t n;
  /* standardize */
  const float *sbias, *sscale;
};

static void layernorm_row(const struct vision_task *t, float *o, const float *x) {
  int d = t->d;
  double sum = 0.0;
  for (int i = 0; i < d; i++)
    sum += (double)x[i];
  double mean = sum / d, ss = 0.0;
  for (int i = 0; i < d; i++) {
    double c = (double)x[i] - mean;
    ss += c * c;
  }
  double rstd = 1.0 / sqrt(ss / d + (double)t->eps);
  for (int i = 0; i < d; i++) {
    float y = (float)(((double)x[i] - mean) * rstd);
    o[i] = y * kn_load_f32(t->w, t->wdt, (size_t)i) + kn_load_f32(t->b, t->wdt, (size_t)i);
  }
}

static void bias_act_row(const struct vision_task *t, float *o, const float *x) {
  for (int i = 0; i < t->d; i++) {
    float v = t->bias ? x[i] + t->bias[i] : x[i];
    switch (t->act) {
    case KN_ACT_GELU_TANH: v = kn_cpu_gelu_tanh_ref(v); break;
    case KN_ACT_SILU: v = v / (1.0f + expf(-v)); break;
    case KN_ACT_RELU: v = v < 0.0f ? 0.0f : v; break;
    case KN_ACT_SIGMOID: v = 1.0f / (1.0f + expf(-v)); break;
    default: break;
    }
    o[i] = v;
  }
}

/* Output row r of the pooled grids. */
static void pool_row(const struct vision_task *t, long long r) {
  int os = t->os, k = t->k, side = t->side;
  long long img = r / ((long long)os * os);
  int rr = (int)(r % ((long long)os * os)), R = rr / os, Q = rr % os;
  float *o = t->out + r * t->ldo;
  const float *base = t->x + (img * side * side) * t->ldx;
  double inv = 1.0 / ((double)k * k);
  for (int c = 0; c < t->d; c++) {
    double acc = 0.0;
    for (int y = 0; y < k; y++)
      for (int z = 0; z < k; z++)
        acc += (double)base[((long long)(R * k + y) * side + (Q * k + z)) * t->ldx + c];
    o[c] = (float)(acc * inv);
  }
}

/* Output row r of a pooled rectangular grid: the window's sum in double, in
 * row-major order over the window, times scale / k^2. */
static void pool_grid_row(const struct vision_task *t, long long r) {
  int k = t->k, gw = t->side, os = t->os;
  int Y = (int)(r / os), X = (int)(r % os);
  float *o = t->out + r * t->ldo;
  double f = (double)t->scale / ((double)k * k);
  for (int c = 0; c < t->d; c++) {
    double acc = 0.0;
    for (int j = 0; j < k; j++)
      for (int i = 0; i < k; i++)
        acc += (double)t->x[((long long)(Y * k + j) * gw + (X * k + i)) * t->ldx + c];
    o[c] = (float)(acc * f);
  }
}

/* Chunk u of kn_clamp: comparisons that leave NaN as it is (torch.clamp). */
static void clamp_chunk(const struct vision_task *t, long long u) {
  size_t b = (size_t)u * CLAMP_CHUNK, e = b + CLAMP_CHUNK < t->n ? b + CLAMP_CHUNK : t->n;
  for (size_t i = b; i < e; i++) {
    float v = t->x[i];
    t->out[i] = v < t->lo ? t->lo : v > t->hi ? t->hi : v;
  }
}

static void standardize_row(const struct vision_task *t, float *o, const float *x) {
  for (int i = 0; i < t->d; i++)
    o[i] = (x[i] - t->sbias[i]) * t->sscale[i];
}

static void vision_run(void *arg, long long u0, long long u1, int ith) {
  const struct vision_task *t = arg;
  (void)ith;
  for (long long r = u0; r < u1; r++) {
    switch (t->op) {
    case V_LAYERNORM: layernorm_row(t, t->out + r * t->ldo, t->x + r * t->ldx); break;
    case V_BIAS_ACT: bias_act_row(t, t->out + r * t->ldo, t->x + r * t->ldx); break;
    case V_CLAMP: clamp_chunk(t, r); break;
    case V_POOL_GRID: pool_grid_row(t, r); break;
    case V_STANDARDIZE: standardize_row(t, t->out + r * t->ldo, t->x + r * t->ldx); break;
    default: pool_row(t, r); break;
    }
  }
}

/* Runs t (its op and that op's own fields set) over `rows` output rows of out
 * (row stride ldo) from the rows of x (stride ldx), d features each. */
static void run_rows(struct kn_cpu_ctx *ctx, struct vision_task *t, float *out, ptrdiff_t ldo,
                     const float *x, ptrdiff_t ldx, int d, long long rows, double work_per_row) {
  t->out = out;
  t->ldo = ldo;
  t->x = x;
  t->ldx = ldx;
  t->d = d;
  double work = work_per_row * (double)rows;
  long long grain = work < VISION_PAR_MIN ? rows : (long long)(VISION_PAR_MIN / work_per_row) + 1;
  kn_cpu_pool_run(ctx->pool, rows, grain, vision_run, t);
}

static int cpu_layernorm(void *p, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                         int rows, int d, const void *w, const void *b, enum kn_dtype wdt,
                         float eps) {
  struct vision_task t = {.op = V_LAYERNORM, .w = w, .b = b, .wdt = wdt, .eps = eps};
  run_rows(p, &t, out, ldo, x, ldx, d, rows, 3.0 * d);
  return 0;
}

static int cpu_bias_act(void *p, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                        const float *bias, int T, int N, enum kn_act act) {
  struct vision_task t = {.op = V_BIAS_ACT, .bias = bias, .act = act};
  run_rows(p, &t, out, ldo, x, ldx, N, T,
           act == KN_ACT_NONE || act == KN_ACT_RELU ? (double)N : 8.0 * N);
  return 0;
}

static int cpu_avg_pool2d(void *p, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                          int n_img, int side, int k, int C) {
  int os = side / k;
  struct vision_task t = {.op = V_POOL, .side = side, .k = k, .os = os};
  run_rows(p, &t, out, ldo, x, ldx, C, (long long)n_img * os * os, (double)C * k * k);
  return 0;
}

static int cpu_clamp(void *p, float *out, const float *a, float lo, float hi, size_t n) {
  struct vision_task t = {.op = V_CLAMP, .lo = lo, .hi = hi, .n = n};
  long long chunks = (long long)((n + CLAMP_CHUNK - 1) / CLAMP_CHUNK);
  run_rows(p, &t, out, 0, a, 0, 0, chunks, CLAMP_CHUNK);
  return 0;
}

static int cpu_avg_pool_grid(void *p, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                             int gw, int gh, int k, int C, float scale) {
  struct vision_task t = {.op = V_POOL_GRID, .side = gw, .k = k, .os = gw / k, .scale = scale};
  run_rows(p, &t, out, ldo, x, ldx, C, (long long)(gw / k) * (gh / k), (double)C * k * k);
  return 0;
}

static int cpu_standardize(void *p, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                           int rows, int d, const float *bias, const float *scale) {
  struct vision_task t = {.op = V_STANDARDIZE, .sbias = bias, .sscale = scale};
  run_rows(p, &t, out, ldo, x, ldx, d, rows, 2.0 * d);
  return 0;
}

void kn_cpu_vision_ops_fill(struct kn_backend_ops *ops) {
  ops->layernorm = cpu_layernorm;
  ops->bias_act = cpu_bias_act;
  ops->avg_pool2d = cpu_avg_pool2d;
  ops->clamp = cpu_clamp;
  ops->avg_pool_grid = cpu_avg_pool_grid;
  ops->standardize = cpu_standardize;
}
