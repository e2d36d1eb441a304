/* kn-cuda-quant.cu — ggml's block formats (kn-quant.h: Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) on the device, from the packed bytes:
 *
 *   - the few-rows matmul (T <= KN_CUDA_GEMV_MAX_T a launch): one warp per weight
 *     row, each lane dequantizing 8 consecutive elements at a time (exact
 *     f32 values) and multiplying them with every input row in f32;
 *   - the dequantized tile for cuBLAS: rows of a matrix as bf16 in scratch;
 *   - the embedding: rows of a block-format table gathered and dequantized.
 *
 * Everything goes through one device function per format, oct<F>(), which
 * writes elements 8j .. 8j + 7 of a block with kn_dequant_row's float
 * operations in its order (explicit _rn intrinsics, so that nvcc fuses no
 * multiply-add the reference does not): the values are its bits. */
#include "kernels/cuda/kn-cuda-dev.cuh"

/* The f16 at p (no alignment: blocks are bytes), widened (exact). */
__device__ __forceinline__ float q_f16(const uint8_t *p) {
  return __half2float(__ushort_as_half((unsigned short)(p[0] | p[1] << 8)));
}

/* The formats, by their dtype; QK elements and BYTES bytes a block. */
template <int DT> struct qfmt;

#define KN_QFMT(dt, qk, bytes)                                                                     \
  template <> struct qfmt<dt> {                                                                    \
    enum { QK = qk, BYTES = bytes };                                                               \
  }
KN_QFMT(KN_DTYPE_Q8_0, 32, 34);
KN_QFMT(KN_DTYPE_Q4_0, 32, 18);
KN_QFMT(KN_DTYPE_Q4_1, 32, 20);
KN_QFMT(KN_DTYPE_Q5_0, 32, 22);
KN_QFMT(KN_DTYPE_Q5_1, 32, 24);
KN_QFMT(KN_DTYPE_Q4_K, 256, 144);
KN_QFMT(KN_DTYPE_Q5_K, 256, 176);
KN_QFMT(KN_DTYPE_Q6_K, 256, 210);
#undef KN_QFMT

/* Q4_0 .. Q5_1: element e's 4 low bits (low nibbles hold 0..15, high ones 16..31). */
__device__ __forceinline__ int q_nib32(const uint8_t *q, int e) {
  return e < 16 ? q[e] & 0xF : q[e - 16] >> 4;
}

/* Elements 8j .. 8j + 7 of the block at b into v. */
template <int DT> __device__ __forceinline__ void oct(const uint8_t *b, int j, float v[8]) {
  const int e0 = 8 * j;
  if (DT == KN_DTYPE_Q8_0) {
    float d = q_f16(b);
#pragma unroll
    for (int i = 0; i < 8; i++)
      v[i] = __fmul_rn((float)(int8_t)b[2 + e0 + i], d);
  } else if (DT == KN_DTYPE_Q4_0) {
    float d = q_f16(b);
#pragma unroll
    for (int i = 0; i < 8; i++)
      v[i] = __fmul_rn((float)(q_nib32(b + 2, e0 + i) - 8), d);
  } else if (DT == KN_DTYPE_Q4_1) {
    float d = q_f16(b), m = q_f16(b + 2);
#pragma unroll
    for (int i = 0; i < 8; i++)
      v[i] = __fadd_rn(__fmul_rn((float)q_nib32(b + 4, e0 + i), d), m);
  } else if (DT == KN_DTYPE_Q5_0 || DT == KN_DTYPE_Q5_1) {
    const int one = DT == KN_DTYPE_Q5_1;
    float d = q_f16(b), m = one ? q_f16(b + 2) : 0.0f;
    const uint8_t *h = b + (one ? 4 : 2), *q = b + (one ? 8 : 6);
    uint32_t qh = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 |
                  (uint32_t)h[3] << 24; /* bit e: element e's fifth bit */
#pragma unroll
    for (int i = 0; i < 8; i++) {
      int e = e0 + i, x = q_nib32(q, e) | (int)((qh >> e) & 1u) << 4;
      v[i] = one ? __fadd_rn(__fmul_rn((float)x, d), m) : __fmul_rn((float)(x - 16), d);
    }
  } else if (DT == KN_DTYPE_Q4_K || DT == KN_DTYPE_Q5_K) {
    /* 64 elements per 32 bytes of q: sub-block s = e / 32 (its 6-bit scale
     * and min), low nibbles for even s, high for odd; Q5_K's fifth bit of
     * element e is bit s of qh[e % 32] */
    const int five = DT == KN_DTYPE_Q5_K, s = e0 / 32, l0 = e0 % 32;
    const uint8_t *sc = b + 4, *qh = b + 16, *q = b + (five ? 48 : 16) + 32 * (s / 2);
    int scv, mnv;
    if (s < 4) {
      scv = sc[s] & 63;
      mnv = sc[s + 4] & 63;
    } else {
      scv = (sc[s + 4] & 0xF) | (sc[s - 4] >> 6) << 4;
      mnv = (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
    }
    float d1 = __fmul_rn(q_f16(b), (float)scv), m1 = __fmul_rn(q_f16(b + 2), (float)mnv);
#pragma unroll
    for (int i = 0; i < 8; i++) {
      int l = l0 + i, x = (s & 1 ? q[l] >> 4 : q[l] & 0xF);
      if (five) x += (qh[l] >> s) & 1 ? 16 : 0;
      v[i] = __fsub_rn(__fmul_rn(d1, (float)x), m1);
    }
  } else { /* Q6_K */
    /* halves of 128 elements; in each, quarter g of 32: ql[l + 32 (g & 1)]'s
     * nibble g >> 1, qh[l]'s bits 2g, 2g + 1, scale (l / 16) + 2g */
    const int n = e0 / 128, g = (e0 % 128) / 32, l0 = e0 % 32;
    const uint8_t *ql = b + 64 * n + 32 * (g & 1), *qh = b + 128 + 32 * n;
    const float dsc = __fmul_rn(q_f16(b + 208), (float)(int8_t)b[192 + 8 * n + l0 / 16 + 2 * g]);
#pragma unroll
    for (int i = 0; i < 8; i++) {
      int l = l0 + i;
      int x = ((ql[l] >> (4 * (g >> 1))) & 0xF) | ((qh[l] >> (2 * g)) & 3) << 4;
      v[i] = __fmul_rn(dsc, (float)(x - 32));
    }
  }
}

/* Element octet o of a row of whole blocks at row (o < K / 8). */
template <int DT> __device__ __forceinline__ void row_oct(const uint8_t *row, int o, float v[8]) {
  constexpr int per = qfmt<DT>::QK / 8;
  oct<DT>(row + (size_t)(o / per) * qfmt<DT>::BYTES, o % per, v);
}

/* ---- the few-rows matmul --------------------------------------------------- */

/* One warp per weight row n: out[t, n] (+)= sum_k in[t, k] * w[n, k] for t < TT,
 * the weights dequantized exactly, f32 products and sums. */
template <int DT, int TT>
__global__ void qgemv_kernel(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                             const uint8_t *w, size_t row_bytes, int N, int K, int accumulate) {
  int n = kn_warp_id(), lane = threadIdx.x & 31;
  if (n >= N) return;
  const uint8_t *row = w + (size_t)n * row_bytes;
  float acc[TT] = {};
  for (int o = lane; o < K / 8; o += 32) {
    float v[8];
    row_oct<DT>(row, o, v);
#pragma unroll
    for (int t = 0; t < TT; t++) {
      const float *x = in + (ptrdiff_t)t * ldi + 8 * o;
#pragma unroll
      for (int i = 0; i < 8; i++)
        acc[t] = fmaf(v[i], __ldg(x + i), acc[t]);
    }
  }
  kn_gemv_store<TT>(acc, out, ldo, n, lane, accumulate);
}

template <int DT>
static cudaError_t qgemv(cudaStream_t s, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                         const void *w, int T, int N, int K, int accumulate) {
  const dim3 grid = kn_gemv_grid(N), block(32 * KN_GEMV_WARPS);
  const uint8_t *wb = (const uint8_t *)w;
  const size_t rb = (size_t)(K / qfmt<DT>::QK) * qfmt<DT>::BYTES;
  switch (T) {
#define KN_QGEMV_CASE(tt)                                                                          \
  case tt:                                                                                         \
    qgemv_kernel<DT, tt><<<grid, block, 0, s>>>(out, ldo, in, ldi, wb, rb, N, K, accumulate);      \
    break;
    KN_GEMV_T_CASES(KN_QGEMV_CASE)
#undef KN_QGEMV_CASE
  default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

/* ---- the dequantized tile -------------------------------------------------- */

/* dst[r, :] (bf16, K per row) = rows r < rows of w, one thread per octet. */
template <int DT>
__global__ void qtile_kernel(__nv_bfloat16 *dst, const uint8_t *w, size_t row_bytes, int rows,
                             int K) {
  const size_t per_row = (size_t)(K / 8), n = (size_t)rows * per_row;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t r = i / per_row;
    int o = (int)(i % per_row);
    float v[8];
    row_oct<DT>(w + r * row_bytes, o, v);
    __nv_bfloat16 *d = dst + r * (size_t)K + 8 * (size_t)o;
#pragma unroll
    for (int k = 0; k < 8; k++)
      kn_store(d, k, v[k]);
  }
}

template <int DT>
static cudaError_t qtile(cudaStream_t s, void *dst, const void *w, int rows, int K) {
  const size_t rb = (size_t)(K / qfmt<DT>::QK) * qfmt<DT>::BYTES;
  qtile_kernel<DT><<<kn_grid((size_t)rows * (size_t)(K / 8), 256, 65535), 256, 0, s>>>(
      (__nv_bfloat16 *)dst, (const uint8_t *)w, rb, rows, K);
  return cudaGetLastError();
}

/* ---- the embedding --------------------------------------------------------- */

/* out[t, :] = dequantized table row ids[t] * scale, one block per token; an id
 * outside [0, vocab) is a zero row (as kn-cuda-embed.cu's). */
template <int DT>
__global__ void qembed_kernel(float *out, ptrdiff_t ldo, const uint8_t *table, size_t row_bytes,
                              int vocab, int H, const int32_t *ids, float scale) {
  const int t = blockIdx.x, id = ids[t];
  float *o = out + (ptrdiff_t)t * ldo;
  for (int oc = threadIdx.x; oc < H / 8; oc += blockDim.x) {
    float v[8];
    if (id >= 0 && id < vocab) row_oct<DT>(table + (size_t)id * row_bytes, oc, v);
#pragma unroll
    for (int i = 0; i < 8; i++)
      o[8 * oc + i] = id >= 0 && id < vocab ? __fmul_rn(v[i], scale) : 0.0f;
  }
}

template <int DT>
static cudaError_t qembed(cudaStream_t s, float *out, ptrdiff_t ldo, const void *table, int vocab,
                          int H, const int32_t *ids, int T, float scale) {
  const size_t rb = (size_t)(H / qfmt<DT>::QK) * qfmt<DT>::BYTES;
  qembed_kernel<DT><<<T, 128, 0, s>>>(out, ldo, (const uint8_t *)table, rb, vocab, H, ids, scale);
  return cudaGetLastError();
}

/* ---- launchers ------------------------------------------------------------- */

/* Calls fn<DT>(args...) for the block format dt; cudaErrorInvalidValue for the others. */
#define KN_QDISPATCH(dt, fn, ...)                                                                  \
  switch (dt) {                                                                                    \
  case KN_DTYPE_Q8_0: return fn<KN_DTYPE_Q8_0>(__VA_ARGS__);                                       \
  case KN_DTYPE_Q4_0: return fn<KN_DTYPE_Q4_0>(__VA_ARGS__);                                       \
  case KN_DTYPE_Q4_1: return fn<KN_DTYPE_Q4_1>(__VA_ARGS__);                                       \
  case KN_DTYPE_Q5_0: return fn<KN_DTYPE_Q5_0>(__VA_ARGS__);                                       \
  case KN_DTYPE_Q5_1: return fn<KN_DTYPE_Q5_1>(__VA_ARGS__);                                       \
  case KN_DTYPE_Q4_K: return fn<KN_DTYPE_Q4_K>(__VA_ARGS__);                                       \
  case KN_DTYPE_Q5_K: return fn<KN_DTYPE_Q5_K>(__VA_ARGS__);                                       \
  case KN_DTYPE_Q6_K: return fn<KN_DTYPE_Q6_K>(__VA_ARGS__);                                       \
  default: return cudaErrorInvalidValue;                                                           \
  }

extern "C" cudaError_t kn_cuda_launch_qgemv(cudaStream_t s, float *out, ptrdiff_t ldo,
                                            const float *in, ptrdiff_t ldi, const void *w,
                                            enum kn_dtype wdt, int T, int N, int K,
                                            int accumulate) {
  if (N <= 0 || T <= 0) return cudaSuccess;
  KN_QDISPATCH(wdt, qgemv, s, out, ldo, in, ldi, w, T, N, K, accumulate)
}

extern "C" cudaError_t kn_cuda_launch_qtile(cudaStream_t s, void *dst, const void *w,
                                            enum kn_dtype wdt, int rows, int K) {
  if (rows <= 0 || K <= 0) return cudaSuccess;
  KN_QDISPATCH(wdt, qtile, s, dst, w, rows, K)
}

extern "C" cudaError_t kn_cuda_launch_qembed(cudaStream_t s, float *out, ptrdiff_t ldo,
                                             const void *table, enum kn_dtype tdt, int vocab, int H,
                                             const int32_t *ids, int T, float scale) {
  if (T <= 0 || H <= 0) return cudaSuccess;
  KN_QDISPATCH(tdt, qembed, s, out, ldo, table, vocab, H, ids, T, scale)
}
