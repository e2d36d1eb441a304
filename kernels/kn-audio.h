/* kn-audio.h — the plain C definitions of the audio encoder ops of
 * kn-backend.h (kn_conv3x3_s2, kn_dwconv_causal, kn_local_attn_rel), over
 * host memory and a range of output rows so that a caller may split the
 * work: what the CPU backend runs, what a device backend is checked against
 * when it is made, and what the public calls run on the host where a
 * backend lacks an op. Sums are taken in double in the order the op's
 * comment gives and rounded once, so each output row depends only on its
 * inputs. Kernels only: callers use kn-backend.h. */
#ifndef LMSERVE_KN_AUDIO_H
#define LMSERVE_KN_AUDIO_H
#include <stddef.h>
#include <stdint.h>

/* Output positions [p0, p1) of To x Fo (position p = t Fo + f), every channel. */
void kn_ref_conv3x3_s2(float *out, const float *x, const float *w, int T, int F, int Cin, int Cout,
                       long long p0, long long p1);

/* Rows [t0, t1). */
void kn_ref_dwconv_causal(float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx, const float *w,
                          const int32_t *first, int C, int K, int t0, int t1);

/* Rows [t0, t1), every head. */
void kn_ref_local_attn_rel(float *out, ptrdiff_t ldo, const float *q, ptrdiff_t ldq, const float *k,
                           ptrdiff_t ldk, const float *v, ptrdiff_t ldv, const float *rel,
                           const int32_t *span, int heads, int hd, int dmin, int dmax, float cap,
                           int t0, int t1);

#endif
