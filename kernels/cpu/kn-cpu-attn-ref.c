/* kn-cpu-attn-ref.c — reference paged attention for one (query, kv head).
 *
 * For each query head of the GQA group: scores over every visible key in
 * increasing position order, an exact softmax in double (running maximum,
 * rescaled sums), the weighted sum of V in double, rounded once to f32. Keys
 * and values are read from the pages through the block table. */
#include <math.h>

#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/kn-dtype.h"

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
                     int kvh) {
  const struct kn_kv_view *view = job->view;
  const int D = view->head_dim;
  const int group = job->n_heads / view->n_kv_heads;
  const int p = seq->pos0 + i;
  const int row = seq->q_begin + i;
  int lo, hi;
  kn_cpu_attn_range(seq, job->window, p, &lo, &hi);

  for (int g = 0; g < group; g++) {
    int h = kvh * group + g;
    const float *q = job->q + (ptrdiff_t)row * job->ldq + (ptrdiff_t)h * D;
    float *out = job->out + (ptrdiff_t)row * job->ldo + (ptrdiff_t)h * D;
    double acc[KN_MAX_HEAD_DIM];
    double m = -INFINITY, l = 0.0;
    for (int d = 0; d < D; d++) acc[d] = 0.0;
    for (int j = lo; j <= hi; j++) {
      if (!kn_cpu_attn_visible(seq, job->window, p, j)) continue;
      const void *k = kn_cpu_kv_addr(view, seq, j, kvh, 0);
      const void *v = kn_cpu_kv_addr(view, seq, j, kvh, 1);
      double s = 0.0;
      for (int d = 0; d < D; d++) s += (double)q[d] * (double)kn_load_f32(k, view->dtype, (size_t)d);
      s *= job->scale;
      if (job->softcap > 0.0f) s = tanh(s / job->softcap) * job->softcap;
      if (s > m) {
        double c = exp(m - s); /* 0 for the first key */
        l *= c;
        for (int d = 0; d < D; d++) acc[d] *= c;
        m = s;
      }
      double e = exp(s - m);
      l += e;
      for (int d = 0; d < D; d++) acc[d] += e * (double)kn_load_f32(v, view->dtype, (size_t)d);
    }
    /* p itself is always visible, so l >= 1 */
    for (int d = 0; d < D; d++) out[d] = (float)(acc[d] / l);
  }
}
