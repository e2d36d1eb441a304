/* kn-cpu-ref.c — reference C versions of the CPU backend's kernels (dense
 * ops and paged attention).
 *
 * Plain, obviously correct code: reductions accumulate in double in index
 * order, then round once to f32. These are the oracle the SIMD (and CUDA)
 * kernels are tested against, and what LMSERVE_KERNELS=ref runs.
 *
 * Attention, for each query head of the GQA group: scores over every visible
 * key in increasing position order, an exact softmax in double (running
 * maximum, rescaled sums), the weighted sum of V in double, rounded once to
 * f32. Keys and values are read from the pages through the block table. */
#include <math.h>

#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/kn-dtype.h"

/* ---- matmul ------------------------------------------------------------- */

static void dot_ref(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi, const void *w,
                    enum kn_dtype dt, int K, int T, int n, int accumulate) {
  for (int t = 0; t < T; t++) {
    const float *x = in + (ptrdiff_t)t * ldi;
    for (int j = 0; j < n; j++) {
      const char *row = (const char *)w + (size_t)j * (size_t)K * kn_dtype_size(dt);
      double acc = 0.0;
      for (int k = 0; k < K; k++)
        acc += (double)x[k] * (double)kn_load_f32(row, dt, (size_t)k);
      float *o = out + (ptrdiff_t)t * ldo + j;
      *o = accumulate ? (float)((double)*o + acc) : (float)acc;
    }
  }
}

static void dot_ref_f32(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi, const void *w,
                        int K, int T, int n, int accumulate) {
  dot_ref(out, ldo, in, ldi, w, KN_DTYPE_F32, K, T, n, accumulate);
}

static void dot_ref_f16(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi, const void *w,
                        int K, int T, int n, int accumulate) {
  dot_ref(out, ldo, in, ldi, w, KN_DTYPE_F16, K, T, n, accumulate);
}

static void dot_ref_bf16(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi, const void *w,
                         int K, int T, int n, int accumulate) {
  dot_ref(out, ldo, in, ldi, w, KN_DTYPE_BF16, K, T, n, accumulate);
}

static void widen_ref(float *dst, const void *src, enum kn_dtype dt, size_t n) {
  for (size_t i = 0; i < n; i++)
    dst[i] = kn_load_f32(src, dt, i);
}

/* ---- norms and elementwise --------------------------------------------- */

static void rmsnorm_ref(float *out, const float *x, int d, const void *w, enum kn_dtype wdt,
                        float eps, enum kn_norm_mode mode) {
  double ss = 0.0;
  for (int i = 0; i < d; i++)
    ss += (double)x[i] * (double)x[i];
  float r = (float)(1.0 / sqrt(ss / d + (double)eps));
  kn_cpu_norm_scale(out, x, 0, d, r, w, wdt, mode);
}

float kn_cpu_gelu_tanh_ref(float g) {
  /* 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), in double, rounded once */
  double x = g;
  double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  return (float)(0.5 * x * (1.0 + tanh(u)));
}

static void gelu_mul_ref(float *out, const float *gate, const float *up, int n) {
  for (int i = 0; i < n; i++)
    out[i] = kn_cpu_gelu_tanh_ref(gate[i]) * up[i];
}

static void add_ref(float *out, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    out[i] = a[i] + b[i];
}

static void mul_ref(float *out, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    out[i] = a[i] * b[i];
}

static void scale_ref(float *out, const float *a, float s, size_t n) {
  for (size_t i = 0; i < n; i++)
    out[i] = a[i] * s;
}

static void softcap_ref(float *out, const float *a, float cap, size_t n) {
  for (size_t i = 0; i < n; i++)
    out[i] = (float)(tanh((double)a[i] / cap) * cap);
}

/* ---- attention ---------------------------------------------------------- */

void kn_cpu_attn_range(const struct kn_attn_seq *seq, int window, int p, int *lo, int *hi) {
  int l = window > 0 ? p - window + 1 : 0;
  int h = p;
  if (l < 0) l = 0;
  for (int r = 0; r < seq->n_bidir; r++) {
    int b = seq->bidir[2 * r], e = seq->bidir[2 * r + 1];
    if (p >= b && p < e) {
      if (b < l) l = b;
      if (e - 1 > h) h = e - 1;
    }
  }
  *lo = l;
  *hi = h;
}

void kn_cpu_attn_ref(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq, int i,
                     int kvh, int g0, int ng) {
  const struct kn_kv_view *view = job->view;
  const int D = view->head_dim;
  const int group = job->n_heads / view->n_kv_heads;
  const int p = seq->pos0 + i;
  const int row = seq->q_begin + i;
  int lo, hi;
  kn_cpu_attn_range(seq, job->window, p, &lo, &hi);

  for (int g = g0; g < g0 + ng; g++) {
    int h = kvh * group + g;
    const float *q = job->q + (ptrdiff_t)row * job->ldq + (ptrdiff_t)h * D;
    float *out = job->out + (ptrdiff_t)row * job->ldo + (ptrdiff_t)h * D;
    double acc[KN_MAX_HEAD_DIM];
    double m = -INFINITY, l = 0.0;
    for (int d = 0; d < D; d++)
      acc[d] = 0.0;
    for (int j = lo; j <= hi; j++) {
      if (!kn_cpu_attn_visible(seq, job->window, p, j)) continue;
      const void *k = kn_cpu_kv_addr(view, seq, j, kvh, 0);
      const void *v = kn_cpu_kv_addr(view, seq, j, kvh, 1);
      double s = 0.0;
      for (int d = 0; d < D; d++)
        s += (double)q[d] * (double)kn_cpu_kv_value(k, view->dtype, d, view->k_scale, kvh);
      s *= job->scale;
      if (job->softcap > 0.0f) s = tanh(s / job->softcap) * job->softcap;
      if (s > m) {
        double c = exp(m - s); /* 0 for the first key */
        l *= c;
        for (int d = 0; d < D; d++)
          acc[d] *= c;
        m = s;
      }
      double e = exp(s - m);
      l += e;
      for (int d = 0; d < D; d++)
        acc[d] += e * (double)kn_cpu_kv_value(v, view->dtype, d, view->v_scale, kvh);
    }
    /* p itself is always visible, so l >= 1 */
    for (int d = 0; d < D; d++)
      out[d] = (float)(acc[d] / l);
  }
}

void kn_cpu_dsp_init_ref(struct kn_cpu_dsp *dsp) {
  dsp->isa = KN_CPU_ISA_REF;
  dsp->matvec[KN_DTYPE_F32] = dot_ref_f32;
  dsp->matvec[KN_DTYPE_F16] = dot_ref_f16;
  dsp->matvec[KN_DTYPE_BF16] = dot_ref_bf16;
  dsp->tile_f32 = dot_ref_f32;
  dsp->tile_min_t = 1 << 30; /* the reference never widens */
  dsp->tile_tokens = 1;
  dsp->bf16_tokens = 1; /* for dot_bf16 where a table has one: rows after rows */
  dsp->bf16_rows = 8;   /* AVX-512-BF16's groups of 4, two at least */
  dsp->widen = widen_ref;
  dsp->rmsnorm = rmsnorm_ref;
  dsp->gelu_mul = gelu_mul_ref;
  dsp->add = add_ref;
  dsp->mul = mul_ref;
  dsp->scale = scale_ref;
  dsp->softcap = softcap_ref;
  dsp->attn = kn_cpu_attn_ref;
}
