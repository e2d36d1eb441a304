/* kn-audio.c — the audio encoder ops (kn-backend.h): their plain C
 * definitions (kn-audio.h), the public calls' argument checks, and the host
 * path a call takes where its backend has no op (or declined it). */
#include "kernels/kn-audio.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-log.h"
#include "kernels/kn-backend-impl.h"

/* ---- definitions ------------------------------------------------------------ */

void kn_ref_conv3x3_s2(float *out, const float *x, const float *w, int T, int F, int Cin, int Cout,
                       long long p0, long long p1) {
  int Fo = (F + 1) / 2;
  for (long long p = p0; p < p1; p++) {
    int t = (int)(p / Fo), f = (int)(p % Fo);
    float *o = out + p * Cout;
    for (int oc = 0; oc < Cout; oc++) {
      const float *wo = w + (size_t)oc * 9 * Cin;
      double acc = 0.0;
      for (int a = 0; a < 3; a++) {
        int ti = 2 * t - 1 + a;
        if (ti < 0 || ti >= T) continue;
        for (int b = 0; b < 3; b++) {
          int fi = 2 * f - 1 + b;
          if (fi < 0 || fi >= F) continue;
          const float *xi = x + ((size_t)ti * F + fi) * Cin, *wi = wo + (a * 3 + b) * Cin;
          for (int i = 0; i < Cin; i++)
            acc += (double)wi[i] * (double)xi[i];
        }
      }
      o[oc] = (float)acc;
    }
  }
}

void kn_ref_dwconv_causal(float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx, const float *w,
                          const int32_t *first, int C, int K, int t0, int t1) {
  for (int t = t0; t < t1; t++) {
    float *o = out + (ptrdiff_t)t * ldo;
    for (int c = 0; c < C; c++) {
      double acc = 0.0;
      for (int j = 0; j < K; j++) {
        int s = t - K + 1 + j;
        if (s >= first[t]) acc += (double)w[(size_t)c * K + j] * (double)x[(ptrdiff_t)s * ldx + c];
      }
      o[c] = (float)acc;
    }
  }
}

void kn_ref_local_attn_rel(float *out, ptrdiff_t ldo, const float *q, ptrdiff_t ldq, const float *k,
                           ptrdiff_t ldk, const float *v, ptrdiff_t ldv, const float *rel,
                           const int32_t *span, int heads, int hd, int dmin, int dmax, float cap,
                           int t0, int t1) {
  double l[KN_LOCAL_ATTN_MAX_KEYS];
  size_t W = (size_t)heads * hd;
  for (int t = t0; t < t1; t++) {
    /* keys s in [lo, hi]: d = t - s in [dmin, dmax], inside t's sequence */
    int lo = t - dmax, hi = t - dmin;
    if (lo < span[2 * t]) lo = span[2 * t];
    if (hi > span[2 * t + 1] - 1) hi = span[2 * t + 1] - 1;
    for (int h = 0; h < heads; h++) {
      const float *qt = q + (ptrdiff_t)t * ldq + h * hd;
      float *o = out + (ptrdiff_t)t * ldo + h * hd;
      double m = -INFINITY;
      for (int s = lo; s <= hi; s++) {
        const float *ks = k + (ptrdiff_t)s * ldk + h * hd;
        const float *r = rel + (size_t)(t - s - dmin) * W + h * hd;
        double ac = 0.0, bd = 0.0;
        for (int e = 0; e < hd; e++) {
          ac += (double)qt[e] * (double)ks[e];
          bd += (double)qt[e] * (double)r[e];
        }
        double z = (double)cap * tanh((ac + bd) / (double)cap);
        l[s - lo] = z;
        if (z > m) m = z;
      }
      double sum = 0.0;
      for (int s = lo; s <= hi; s++) {
        l[s - lo] = exp(l[s - lo] - m);
        sum += l[s - lo];
      }
      for (int e = 0; e < hd; e++) {
        double acc = 0.0;
        for (int s = lo; s <= hi; s++)
          acc += l[s - lo] * (double)v[(ptrdiff_t)s * ldv + h * hd + e];
        o[e] = hi < lo ? 0.0f : (float)(acc / sum); /* sum >= 1 when there is a key */
      }
    }
  }
}

/* ---- the host path ---------------------------------------------------------- */

/* Says once per process which op runs on the host instead of be. */
static void note_host(const struct kn_backend *be, const char *op) {
  static int said;
  if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
    cm_warn("kernels", "%s (and any other audio op %s lacks) runs on the host", op, be->ops->name);
}

/* Host copies of n floats of backend memory (into a malloc'd buffer). */
static float *fetch(struct kn_backend *be, const float *src, size_t n, int *rc) {
  if (*rc) return NULL;
  float *h = malloc(n * sizeof(float));
  if (!h)
    *rc = CM_ERR_NOMEM;
  else if ((*rc = kn_download(be, h, src, n * sizeof(float)))) {
    free(h);
    h = NULL;
  }
  return h;
}

/* Floats a [rows, cols] operand of row stride ld spans. */
static size_t span_of(int rows, ptrdiff_t ld, int cols) {
  return rows ? (size_t)(rows - 1) * (size_t)ld + (size_t)cols : 0;
}

/* ---- public calls ------------------------------------------------------------ */

int kn_conv3x3_s2(struct kn_backend *be, float *out, const float *x, const float *w, int T, int F,
                  int Cin, int Cout) {
  if (!be || T < 0 || F < 0 || Cin < 0 || Cout < 0) return CM_ERR_INVAL;
  if (!T || !F || !Cin || !Cout) return 0;
  if (!out || !x || !w) return CM_ERR_INVAL;
  long long To = (T + 1) / 2, Fo = (F + 1) / 2;
  if ((long long)T * F * Cin > INT32_MAX || To * Fo * Cout > INT32_MAX) return CM_ERR_TOOBIG;
  int rc = KN_CALL(conv3x3_s2, out, x, w, T, F, Cin, Cout);
  if (rc != CM_ERR_UNSUPPORTED) return rc;
  note_host(be, "kn_conv3x3_s2");
  size_t nx = (size_t)T * F * Cin, nw = (size_t)Cout * 9 * Cin, no = (size_t)(To * Fo * Cout);
  if (kn_backend_has(be, KN_CAP_HOST_MEMORY)) {
    kn_ref_conv3x3_s2(out, x, w, T, F, Cin, Cout, 0, To * Fo);
    return 0;
  }
  rc = 0;
  float *hx = fetch(be, x, nx, &rc), *hw = fetch(be, w, nw, &rc), *ho = malloc(no * sizeof(float));
  if (!rc && !ho) rc = CM_ERR_NOMEM;
  if (!rc) {
    kn_ref_conv3x3_s2(ho, hx, hw, T, F, Cin, Cout, 0, To * Fo);
    rc = kn_upload(be, out, ho, no * sizeof(float));
  }
  free(hx), free(hw), free(ho);
  return rc;
}

int kn_dwconv_causal(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *x,
                     ptrdiff_t ldx, const float *w, const int32_t *first, int T, int C, int K) {
  if (!be || T < 0 || C < 0 || K < 1) return CM_ERR_INVAL;
  if (!T || !C) return 0;
  if (!out || !x || !w || !first || !kn__valid_ld(ldo, T, C) || !kn__valid_ld(ldx, T, C))
    return CM_ERR_INVAL;
  for (int t = 0; t < T; t++)
    if (first[t] < 0 || first[t] > t) return CM_ERR_RANGE;
  int rc = KN_CALL(dwconv_causal, out, ldo, x, ldx, w, first, T, C, K);
  if (rc != CM_ERR_UNSUPPORTED) return rc;
  note_host(be, "kn_dwconv_causal");
  if (kn_backend_has(be, KN_CAP_HOST_MEMORY)) {
    kn_ref_dwconv_causal(out, ldo, x, ldx, w, first, C, K, 0, T);
    return 0;
  }
  rc = 0;
  size_t no = span_of(T, ldo, C);
  float *hx = fetch(be, x, span_of(T, ldx, C), &rc), *hw = fetch(be, w, (size_t)C * K, &rc);
  float *ho = fetch(be, out, no, &rc);
  if (!rc) {
    kn_ref_dwconv_causal(ho, ldo, hx, ldx, hw, first, C, K, 0, T);
    rc = kn_upload(be, out, ho, no * sizeof(float));
  }
  free(hx), free(hw), free(ho);
  return rc;
}

int kn_local_attn_rel(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *q,
                      ptrdiff_t ldq, const float *k, ptrdiff_t ldk, const float *v, ptrdiff_t ldv,
                      const float *rel, const int32_t *span, int T, int heads, int hd, int dmin,
                      int dmax, float cap) {
  if (!be || T < 0 || heads < 0 || hd < 0 || dmax < dmin || !(cap > 0.0f) || isinf(cap))
    return CM_ERR_INVAL;
  if (dmax - (long long)dmin + 1 > KN_LOCAL_ATTN_MAX_KEYS) return CM_ERR_TOOBIG;
  if (!T || !heads || !hd) return 0;
  int W = heads * hd;
  if (!out || !q || !k || !v || !rel || !span || !kn__valid_ld(ldo, T, W) ||
      !kn__valid_ld(ldq, T, W) || !kn__valid_ld(ldk, T, W) || !kn__valid_ld(ldv, T, W))
    return CM_ERR_INVAL;
  for (int t = 0; t < T; t++)
    if (span[2 * t] < 0 || span[2 * t] > t || span[2 * t + 1] <= t || span[2 * t + 1] > T)
      return CM_ERR_RANGE;
  int rc = KN_CALL(local_attn_rel, out, ldo, q, ldq, k, ldk, v, ldv, rel, span, T, heads, hd, dmin,
                   dmax, cap);
  if (rc != CM_ERR_UNSUPPORTED) return rc;
  note_host(be, "kn_local_attn_rel");
  if (kn_backend_has(be, KN_CAP_HOST_MEMORY)) {
    kn_ref_local_attn_rel(out, ldo, q, ldq, k, ldk, v, ldv, rel, span, heads, hd, dmin, dmax, cap,
                          0, T);
    return 0;
  }
  rc = 0;
  size_t no = span_of(T, ldo, W);
  float *hq = fetch(be, q, span_of(T, ldq, W), &rc), *hk = fetch(be, k, span_of(T, ldk, W), &rc);
  float *hv = fetch(be, v, span_of(T, ldv, W), &rc);
  float *hr = fetch(be, rel, (size_t)(dmax - dmin + 1) * W, &rc), *ho = fetch(be, out, no, &rc);
  if (!rc) {
    kn_ref_local_attn_rel(ho, ldo, hq, ldq, hk, ldk, hv, ldv, hr, span, heads, hd, dmin, dmax, cap,
                          0, T);
    rc = kn_upload(be, out, ho, no * sizeof(float));
  }
  free(hq), free(hk), free(hv), free(hr), free(ho);
  return rc;
}
