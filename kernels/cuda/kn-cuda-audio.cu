/* kn-cuda-audio.cu — the audio encoder ops (kn-backend.h; their plain C
 * definitions are kernels/kn-audio.c), f32 sums:
 *   - conv3x3_s2: block x = output position (t, f), threads over the output
 *     channels; the block first loads the 3 x 3 x Cin input patch (zeros
 *     outside the grid) into shared memory, then each thread walks its
 *     channel's weights in the definition's order;
 *   - dwconv_causal: one thread per (row, channel), K taps;
 *   - local_attn_rel: one warp per (row, head): each key's two dot products
 *     (lanes over the head's elements, a butterfly sum), the capped logits in
 *     the warp's slice of shared memory, then max, exponentials and the
 *     weighted sum of values, each lane over its elements. */
#include "kernels/cuda/kn-cuda-dev.cuh"

#define CONV_PAD 4

__global__ void conv3x3_s2_kernel(float *out, const float *x, const float *w, int T, int F, int Cin,
                                  int Cout, int Fo) {
  /* [3][3][Cin], then CONV_PAD zeros: compute-sanitizer (sm_90) reported
   * the compiled sum loop's 12-byte reads from the patch's last float on */
  extern __shared__ float patch[];
  long long p = blockIdx.x;
  int t = (int)(p / Fo), f = (int)(p % Fo);
  for (int e = threadIdx.x; e < 9 * Cin + CONV_PAD; e += blockDim.x) {
    int ab = e / Cin, i = e % Cin, ti = 2 * t - 1 + ab / 3, fi = 2 * f - 1 + ab % 3;
    patch[e] = e >= 9 * Cin || ti < 0 || ti >= T || fi < 0 || fi >= F
                   ? 0.0f
                   : x[((long long)ti * F + fi) * Cin + i];
  }
  __syncthreads();
  for (int o = threadIdx.x; o < Cout; o += blockDim.x) {
    const float *wo = w + (long long)o * 9 * Cin;
    float acc = 0.0f;
    for (int e = 0; e < 9 * Cin; e++)
      acc = fmaf(wo[e], patch[e], acc);
    out[p * Cout + o] = acc;
  }
}

extern "C" cudaError_t kn_cuda_launch_conv3x3_s2(cudaStream_t s, float *out, const float *x,
                                                 const float *w, int T, int F, int Cin, int Cout) {
  int To = (T + 1) / 2, Fo = (F + 1) / 2;
  unsigned threads = Cout >= 256 ? 256 : (unsigned)((Cout + 31) / 32 * 32);
  size_t shm = sizeof(float) * (9 * (size_t)Cin + CONV_PAD);
  conv3x3_s2_kernel<<<(unsigned)((long long)To * Fo), threads, shm, s>>>(out, x, w, T, F, Cin, Cout,
                                                                         Fo);
  return cudaGetLastError();
}

__global__ void dwconv_causal_kernel(float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                                     const float *w, const int32_t *first, int t0, int C, int K) {
  int t = t0 + (int)blockIdx.y;
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int j = 0; j < K; j++) {
    int r = t - K + 1 + j;
    if (r >= first[t]) acc = fmaf(w[(long long)c * K + j], x[(ptrdiff_t)r * ldx + c], acc);
  }
  out[(ptrdiff_t)t * ldo + c] = acc;
}

extern "C" cudaError_t kn_cuda_launch_dwconv_causal(cudaStream_t s, float *out, ptrdiff_t ldo,
                                                    const float *x, ptrdiff_t ldx, const float *w,
                                                    const int32_t *first, int T, int C, int K) {
  kn_row_slices(T, C, [&](int t0, dim3 grid) {
    dwconv_causal_kernel<<<grid, 256, 0, s>>>(out, ldo, x, ldx, w, first, t0, C, K);
  });
  return cudaGetLastError();
}

#define LA_WARPS 4 /* warps (row, head pairs) per block */

__global__ void local_attn_rel_kernel(float *out, ptrdiff_t ldo, const float *q, ptrdiff_t ldq,
                                      const float *k, ptrdiff_t ldk, const float *v, ptrdiff_t ldv,
                                      const float *rel, const int32_t *span, int T, int heads,
                                      int hd, int dmin, int dmax, float cap) {
  __shared__ float logit[LA_WARPS][KN_LOCAL_ATTN_MAX_KEYS];
  int wid = threadIdx.x / 32, lane = threadIdx.x % 32;
  long long item = (long long)blockIdx.x * LA_WARPS + wid;
  if (item >= (long long)T * heads) return;
  int t = (int)(item / heads), h = (int)(item % heads);
  int lo = max(t - dmax, span[2 * t]), hi = min(t - dmin, span[2 * t + 1] - 1);
  const float *qt = q + (ptrdiff_t)t * ldq + h * hd;
  float *o = out + (ptrdiff_t)t * ldo + h * hd;
  float *l = logit[wid];
  float m = -INFINITY;
  for (int s = lo; s <= hi; s++) {
    const float *ks = k + (ptrdiff_t)s * ldk + h * hd;
    const float *r = rel + (long long)(t - s - dmin) * heads * hd + h * hd;
    float ac = 0.0f, bd = 0.0f;
    for (int e = lane; e < hd; e += 32) {
      ac = fmaf(qt[e], ks[e], ac);
      bd = fmaf(qt[e], r[e], bd);
    }
    for (int off = 16; off > 0; off /= 2) {
      ac += __shfl_xor_sync(0xffffffffu, ac, off);
      bd += __shfl_xor_sync(0xffffffffu, bd, off);
    }
    float z = cap * tanhf((ac + bd) / cap);
    if (lane == 0) l[s - lo] = z;
    m = fmaxf(m, z);
  }
  __syncwarp();
  float sum = 0.0f;
  for (int s = lo; s <= hi; s++)
    sum += __expf(l[s - lo] - m);
  for (int e = lane; e < hd; e += 32) {
    float acc = 0.0f;
    for (int s = lo; s <= hi; s++)
      acc = fmaf(__expf(l[s - lo] - m), v[(ptrdiff_t)s * ldv + h * hd + e], acc);
    o[e] = hi < lo ? 0.0f : acc / sum;
  }
}

extern "C" cudaError_t kn_cuda_launch_local_attn_rel(cudaStream_t s, float *out, ptrdiff_t ldo,
                                                     const float *q, ptrdiff_t ldq, const float *k,
                                                     ptrdiff_t ldk, const float *v, ptrdiff_t ldv,
                                                     const float *rel, const int32_t *span, int T,
                                                     int heads, int hd, int dmin, int dmax,
                                                     float cap) {
  long long items = (long long)T * heads;
  unsigned blocks = (unsigned)((items + LA_WARPS - 1) / LA_WARPS);
  local_attn_rel_kernel<<<blocks, 32 * LA_WARPS, 0, s>>>(out, ldo, q, ldq, k, ldk, v, ldv, rel,
                                                         span, T, heads, hd, dmin, dmax, cap);
  return cudaGetLastError();
}
