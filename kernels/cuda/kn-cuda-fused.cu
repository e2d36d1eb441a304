/* kn-cuda-fused.cu — the fused ops of kn-backend.h on the device, each one
 * launch where the unfused sequence takes two to six:
 *
 *   add_norm      one block per row: the post-norm of o, x = (x + o) * scale,
 *                 the next norm of x into h; the row of x stays in shared
 *                 memory between the two reductions.
 *   qkv_prep      one block per (token, head) of q, k and v: the head's norm,
 *                 RoPE on the normed pairs, and for k and v the store into the
 *                 page (k and v themselves are not written back).
 *   gemv_n        kn-cuda-gemv.cu's few-rows kernel over up to 4 weight
 *                 matrices of one input (Q, K, V), one warp per output row;
 *                 over e4m3 codes, kn-cuda-fp8.cu's, the scale last.
 *   gemv_glu      the same for a gate row and an up row at once, the GELU
 *                 multiply as the epilogue.
 *
 * Each does the unfused kernels' float operations in their order (the same
 * block sizes for the norms' sums, the same rounding of matmul inputs), so
 * the results match the sequence's; the backend checks that when it is made
 * (kn_fused_check) and leaves to the sequence whatever differs. */
#include "kernels/cuda/kn-cuda-dev.cuh"

/* The block size kn-cuda-rmsnorm.cu uses for rows of d: the norms' sums here
 * run over the same threads in the same order. */
__host__ __device__ static inline unsigned norm_threads(int d) {
  return d >= 2048 ? 512 : d >= 512 ? 256 : d >= 128 ? 128 : 32;
}

/* y * r, then times w[i] (MUL_W) or 1 + w[i] (MUL_ONE_PLUS_W), as rmsnorm_kernel
 * does; the products rounded on their own (__fmul_rn: never contracted into a
 * following add, which the unfused sequence does in another kernel). */
template <typename W>
__device__ __forceinline__ float norm_one(float y, float r, const W *w, int i, int mode) {
  y = __fmul_rn(y, r);
  if (mode == KN_NORM_MUL_W)
    y = __fmul_rn(y, kn_load(w, i));
  else if (mode == KN_NORM_MUL_ONE_PLUS_W)
    y = __fmul_rn(y, 1.0f + kn_load(w, i));
  return y;
}

/* ---- add + norm ------------------------------------------------------------ */

template <typename W>
__global__ void add_norm_kernel(float *x, ptrdiff_t ldx, const float *o, ptrdiff_t ldo, float *h,
                                ptrdiff_t ldh, int H, const W *post_w, const W *next_w, float scale,
                                float eps, int mode) {
  extern __shared__ float row[]; /* [H]: the new x */
  __shared__ float sh[33];
  float *xr = x + (ptrdiff_t)blockIdx.x * ldx;
  const float *orow = o + (ptrdiff_t)blockIdx.x * ldo;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < H; i += blockDim.x)
    ss = fmaf(orow[i], orow[i], ss);
  ss = kn_block_sum(ss, sh);
  float r = rsqrtf(ss / (float)H + eps);
  float ss2 = 0.0f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    float v = __fadd_rn(xr[i], norm_one(orow[i], r, post_w, i, mode));
    if (scale != 1.0f) v = __fmul_rn(v, scale);
    xr[i] = v;
    row[i] = v;
    ss2 = fmaf(v, v, ss2);
  }
  if (!h) return;
  ss2 = kn_block_sum(ss2, sh);
  float r2 = rsqrtf(ss2 / (float)H + eps);
  float *hr = h + (ptrdiff_t)blockIdx.x * ldh;
  for (int i = threadIdx.x; i < H; i += blockDim.x)
    hr[i] = norm_one(row[i], r2, next_w, i, mode);
}

extern "C" cudaError_t kn_cuda_launch_add_norm(cudaStream_t s, float *x, ptrdiff_t ldx,
                                               const float *o, ptrdiff_t ldo, float *h,
                                               ptrdiff_t ldh, int T, int H, const void *post_w,
                                               const void *next_w, enum kn_dtype wdt, float scale,
                                               float eps, enum kn_norm_mode mode) {
  if ((size_t)H * sizeof(float) > 48 * 1024) return cudaErrorInvalidValue;
  dim3 grid((unsigned)T), block(norm_threads(H));
  size_t smem = (size_t)H * sizeof(float);
  int m = (int)mode;
  if (mode == KN_NORM_NO_W) wdt = KN_DTYPE_F32; /* weights unused (may be NULL) */
  switch (wdt) {
  case KN_DTYPE_F32:
    add_norm_kernel<<<grid, block, smem, s>>>(x, ldx, o, ldo, h, ldh, H, (const float *)post_w,
                                              (const float *)next_w, scale, eps, m);
    break;
  case KN_DTYPE_F16:
    add_norm_kernel<<<grid, block, smem, s>>>(x, ldx, o, ldo, h, ldh, H, (const __half *)post_w,
                                              (const __half *)next_w, scale, eps, m);
    break;
  case KN_DTYPE_BF16:
    add_norm_kernel<<<grid, block, smem, s>>>(x, ldx, o, ldo, h, ldh, H,
                                              (const __nv_bfloat16 *)post_w,
                                              (const __nv_bfloat16 *)next_w, scale, eps, m);
    break;
  default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

/* ---- q/k norm, RoPE, KV write ------------------------------------------------ */

/* Block (t, j): j < nh is q head j, then kvh k heads, then kvh v heads. */
template <typename C> __global__ void qkv_prep_kernel(struct kn_cuda_qkv_args a) {
  __shared__ float sh[33];
  extern __shared__ float head[]; /* [D]: the normed head */
  int t = blockIdx.x, j = blockIdx.y, D = a.D, hd = D / 2;
  int kind = j < a.nh ? 0 : j < a.nh + a.kvh ? 1 : 2; /* q, k, v */
  int hh = kind == 0 ? j : kind == 1 ? j - a.nh : j - a.nh - a.kvh;
  const float *src = kind == 0   ? a.q + (ptrdiff_t)t * a.ldq + (ptrdiff_t)hh * D
                     : kind == 1 ? a.k + (ptrdiff_t)t * a.ldk + (ptrdiff_t)hh * D
                                 : a.v + (ptrdiff_t)t * a.ldv + (ptrdiff_t)hh * D;
  int slot = kind ? a.slots[t] : 0;
  if (kind && slot < 0) return; /* a token whose K/V is not kept */
  int mode = kind == 2 ? (a.v_norm ? KN_NORM_NO_W : -1) : a.mode;
  const float *w = kind == 0 ? a.q_w : a.k_w;
  float r = 1.0f;
  if (mode >= 0) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x)
      ss = fmaf(src[i], src[i], ss);
    ss = kn_block_sum(ss, sh);
    r = rsqrtf(ss / (float)D + a.eps);
  }
  for (int i = threadIdx.x; i < D; i += blockDim.x)
    head[i] = mode >= 0 ? norm_one(src[i], r, w, i, mode) : src[i];
  __syncthreads();
  if (kind < 2) { /* RoPE on the normed pairs, as rope_kernel */
    float p = (float)a.pos[t];
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
      float ang = p * a.inv_freq[i];
      float sn, cs;
      sincosf(ang, &sn, &cs);
      float x0 = head[i], x1 = head[i + hd];
      head[i] = x0 * cs - x1 * sn;
      head[i + hd] = x1 * cs + x0 * sn;
    }
    __syncthreads();
  }
  if (kind == 0) {
    float *dst = a.q + (ptrdiff_t)t * a.ldq + (ptrdiff_t)hh * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x)
      dst[i] = head[i];
    return;
  }
  char *page = a.pool + (size_t)(slot / a.block_tokens) * a.page_bytes;
  C *dst = (C *)(page + (kind == 1 ? a.k_off : a.v_off)) +
           ((size_t)(slot % a.block_tokens) * (size_t)a.kvh + (size_t)hh) * (size_t)D;
  const float *sc = kind == 1 ? a.k_scale : a.v_scale; /* an fp8 cache's, or NULL */
  for (int i = threadIdx.x; i < D; i += blockDim.x)
    kn_store(dst, i, sc ? __fdiv_rn(head[i], sc[hh]) : head[i]);
}

extern "C" cudaError_t kn_cuda_launch_qkv_prep(cudaStream_t s, const struct kn_cuda_qkv_args *a,
                                               int T, enum kn_dtype kv_dtype) {
  int heads = a->nh + (a->k ? 2 * a->kvh : 0);
  dim3 grid((unsigned)T, (unsigned)heads), block(norm_threads(a->D));
  size_t smem = (size_t)a->D * sizeof(float);
  switch (kv_dtype) {
  case KN_DTYPE_F32: qkv_prep_kernel<float><<<grid, block, smem, s>>>(*a); break;
  case KN_DTYPE_BF16: qkv_prep_kernel<__nv_bfloat16><<<grid, block, smem, s>>>(*a); break;
  case KN_DTYPE_F8E4M3: qkv_prep_kernel<__nv_fp8_e4m3><<<grid, block, smem, s>>>(*a); break;
  default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

/* ---- few-rows matmuls of one input --------------------------------------------- */

/* One warp per output row of all the parts together (part p owns rows
 * [first[p], first[p + 1])). W is the weights' element type: bf16 / f16, or
 * e4m3 codes (kn_gemv_dot's overload for them), whose sums take the part's
 * scale last, as kn-cuda-fp8.cu's few-rows kernel applies it. */
template <typename W, int TT>
__global__ void gemv_n_kernel(struct kn_cuda_gemv_parts g, const float *in, ptrdiff_t ldi, int K) {
  int n = kn_warp_id(), lane = threadIdx.x & 31;
  if (n >= g.first[g.n]) return;
  int p = 0;
  while (n >= g.first[p + 1])
    p++;
  int r = n - g.first[p];
  const float *scale = g.scale[p]; /* NULL but for e4m3 */
  float acc[TT] = {};
  kn_gemv_dot(acc, (const W *)g.w[p] + (size_t)r * (size_t)K, in, ldi, K, lane);
#pragma unroll
  for (int t = 0; t < TT; t++) {
    float s = kn_warp_sum(acc[t]);
    if (lane == 0) g.out[p][(ptrdiff_t)t * g.ldo[p] + r] = scale ? __fmul_rn(s, scale[r]) : s;
  }
}

/* One warp per output n: the gate row and the up row against every input row,
 * out[t, n] = gelu(gate) * up; for e4m3 codes each sum times its scale first
 * (rounded on its own: the sequence stores it before the GELU multiply). */
template <typename W, int TT>
__global__ void gemv_glu_kernel(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                                const W *wg, const float *sg, const W *wu, const float *su, int N,
                                int K) {
  int n = kn_warp_id(), lane = threadIdx.x & 31;
  if (n >= N) return;
  float ag[TT] = {}, au[TT] = {};
  kn_gemv_dot(ag, wg + (size_t)n * (size_t)K, in, ldi, K, lane);
  kn_gemv_dot(au, wu + (size_t)n * (size_t)K, in, ldi, K, lane);
#pragma unroll
  for (int t = 0; t < TT; t++) {
    float g = kn_warp_sum(ag[t]), u = kn_warp_sum(au[t]);
    if (lane == 0) {
      if (sg) {
        g = __fmul_rn(g, sg[n]);
        u = __fmul_rn(u, su[n]);
      }
      out[(ptrdiff_t)t * ldo + n] = kn_gelu_tanh(g) * u;
    }
  }
}

enum { WARPS = 8 };

template <typename W>
static cudaError_t launch_n(cudaStream_t s, const struct kn_cuda_gemv_parts *g, const float *in,
                            ptrdiff_t ldi, int T, int K) {
  dim3 grid((unsigned)((g->first[g->n] + WARPS - 1) / WARPS)), block(32 * WARPS);
  switch (T) {
#define KN_CASE(tt)                                                                                \
  case tt: gemv_n_kernel<W, tt><<<grid, block, 0, s>>>(*g, in, ldi, K); break;
    KN_CASE(1)
    KN_CASE(2) KN_CASE(3) KN_CASE(4) KN_CASE(5) KN_CASE(6) KN_CASE(7) KN_CASE(8)
#undef KN_CASE
        default : return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <typename W>
static cudaError_t launch_glu(cudaStream_t s, float *out, ptrdiff_t ldo, const float *in,
                              ptrdiff_t ldi, const void *wg, const float *sg, const void *wu,
                              const float *su, int T, int N, int K) {
  dim3 grid((unsigned)((N + WARPS - 1) / WARPS)), block(32 * WARPS);
  const W *g = (const W *)wg, *u = (const W *)wu;
  switch (T) {
#define KN_CASE(tt)                                                                                \
  case tt:                                                                                         \
    gemv_glu_kernel<W, tt><<<grid, block, 0, s>>>(out, ldo, in, ldi, g, sg, u, su, N, K);          \
    break;
    KN_CASE(1)
    KN_CASE(2) KN_CASE(3) KN_CASE(4) KN_CASE(5) KN_CASE(6) KN_CASE(7) KN_CASE(8)
#undef KN_CASE
        default : return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

extern "C" cudaError_t kn_cuda_launch_gemv_n(cudaStream_t s, const struct kn_cuda_gemv_parts *g,
                                             const float *in, ptrdiff_t ldi, enum kn_dtype wdt,
                                             int T, int K) {
  if (g->first[g->n] <= 0) return cudaSuccess;
  switch (wdt) {
  case KN_DTYPE_BF16: return launch_n<__nv_bfloat16>(s, g, in, ldi, T, K);
  case KN_DTYPE_F16: return launch_n<__half>(s, g, in, ldi, T, K);
  case KN_DTYPE_F8E4M3: return launch_n<__nv_fp8_e4m3>(s, g, in, ldi, T, K);
  default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t kn_cuda_launch_gemv_glu(cudaStream_t s, float *out, ptrdiff_t ldo,
                                               const float *in, ptrdiff_t ldi, const void *wg,
                                               const float *sg, const void *wu, const float *su,
                                               enum kn_dtype wdt, int T, int N, int K) {
  switch (wdt) {
  case KN_DTYPE_BF16:
    return launch_glu<__nv_bfloat16>(s, out, ldo, in, ldi, wg, NULL, wu, NULL, T, N, K);
  case KN_DTYPE_F16: return launch_glu<__half>(s, out, ldo, in, ldi, wg, NULL, wu, NULL, T, N, K);
  case KN_DTYPE_F8E4M3:
    if (!sg || !su) return cudaErrorInvalidValue;
    return launch_glu<__nv_fp8_e4m3>(s, out, ldo, in, ldi, wg, sg, wu, su, T, N, K);
  default: return cudaErrorInvalidValue;
  }
}
