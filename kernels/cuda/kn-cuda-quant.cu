/* kn-cuda-quant.cu — ggml's block formats (kn-quant.h: Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, and Q3_K, IQ4_NL, IQ4_XS, Q2_K) on the
 * device, from the packed bytes:
 *
 *   - the few-rows matmul (T <= KN_CUDA_GEMV_MAX_T a launch): a warp per one
 *     to four weight rows, each lane loading 8 consecutive elements of every
 *     input row, then dequantizing the same 8 of each weight row (exact f32
 *     values) and multiplying them into the f32 sums (fused multiply-adds);
 *   - the dequantized tile for cuBLAS: rows of a matrix as bf16 in scratch;
 *   - the embedding: rows of a block-format table gathered and dequantized.
 *
 * Everything goes through the per-format decode of kn-cuda-quant.cuh
 * (row_oct<DT>: 8 elements at a time, kn_dequant_row's bits). */
#include "kernels/cuda/kn-cuda-dev.cuh"
#include "kernels/cuda/kn-cuda-quant.cuh"

/* ---- the few-rows matmul --------------------------------------------------- */

/* Weight rows a warp, at most: each lane's inputs, loaded once, serve them
 * all (four rows read a quarter of the inputs that one row a warp would). */
#define KN_QGEMV_RPW 4

/* The 8 inputs at xt, read in two 16-byte vectors where vec (xt aligned). */
__device__ __forceinline__ void in_oct(const float *xt, int vec, float x[8]) {
  if (vec) {
    const float4 a = __ldg(reinterpret_cast<const float4 *>(xt)),
                 b = __ldg(reinterpret_cast<const float4 *>(xt) + 1);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
    x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; i++)
      x[i] = __ldg(xt + i);
  }
}

/* Warp i's rows n0 = i * rpw .. n0 + rpw - 1 (rpw <= KN_QGEMV_RPW):
 * out[t, n] (+)= sum_k in[t, k] * w[n, k] for t < TT, the weights dequantized
 * exactly, then f32 fused multiply-adds, each lane over its octets in order.
 * vec: in and its rows are 16-byte aligned, and read in 16-byte vectors. */
template <int DT, int TT>
__global__ void qgemv_kernel(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                             const uint8_t *w, size_t row_bytes, int N, int K, int rpw, int vec,
                             int accumulate) {
  const int n0 = kn_warp_id() * rpw, lane = threadIdx.x & 31;
  if (n0 >= N) return;
  const int nr = N - n0 < rpw ? N - n0 : rpw; /* the same in every lane */
  const uint8_t *row = w + (size_t)n0 * row_bytes;
  float acc[KN_QGEMV_RPW][TT] = {};
  for (int o = lane; o < K / 8; o += 32) {
    float x[TT][8];
#pragma unroll
    for (int t = 0; t < TT; t++)
      in_oct(in + (ptrdiff_t)t * ldi + 8 * o, vec, x[t]);
#pragma unroll
    for (int r = 0; r < KN_QGEMV_RPW; r++) {
      if (r >= nr) break;
      float v[8];
      row_oct<DT>(row + (size_t)r * row_bytes, o, v);
#pragma unroll
      for (int t = 0; t < TT; t++)
#pragma unroll
        for (int i = 0; i < 8; i++)
          acc[r][t] = fmaf(v[i], x[t][i], acc[r][t]);
    }
  }
#pragma unroll
  for (int r = 0; r < KN_QGEMV_RPW; r++)
    if (r < nr) kn_gemv_store<TT>(acc[r], out, ldo, n0 + r, lane, accumulate);
}

/* qgemv_kernel for one input row with U octets a lane in flight (U = 2 or 4)
 * and RPW rows a warp fixed at compile time. Every load is unconditional: a
 * lane past the row's end reads the row's last octet again and a warp past N
 * its last row again, only their sums are skipped, so that all U x RPW
 * octets' loads can be issued before the first sum (one octet a row in
 * flight per lane leaves the memory waiting). A lane still adds its octets in
 * the order o, o + 32, o + 64, ..., so the sums are qgemv_kernel's bits.
 * For A/B runs against it ($LMSERVE_CUDA_QGEMV_OCTETS). */
template <int DT, int RPW, int U>
__global__ void qgemv_octets_kernel(float *out, const float *in, const uint8_t *w,
                                    size_t row_bytes, int N, int K, int vec, int accumulate) {
  const int n0 = kn_warp_id() * RPW, lane = threadIdx.x & 31, n_oct = K / 8;
  if (n0 >= N) return;
  const int nr = N - n0 < RPW ? N - n0 : RPW; /* the same in every lane */
  const uint8_t *row = w + (size_t)n0 * row_bytes;
  float acc[RPW][1] = {};
  for (int o0 = lane; o0 < n_oct; o0 += 32 * U) {
    float x[U][8], v[U][RPW][8];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int o = min(o0 + 32 * u, n_oct - 1);
      in_oct(in + 8 * o, vec, x[u]);
#pragma unroll
      for (int r = 0; r < RPW; r++)
        row_oct<DT>(row + (size_t)min(r, nr - 1) * row_bytes, o, v[u][r]);
    }
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
      for (int r = 0; r < RPW; r++)
        if (o0 + 32 * u < n_oct && r < nr)
#pragma unroll
          for (int i = 0; i < 8; i++)
            acc[r][0] = fmaf(v[u][r][i], x[u][i], acc[r][0]);
  }
#pragma unroll
  for (int r = 0; r < RPW; r++)
    if (r < nr) kn_gemv_store<1>(acc[r], out, 0, n0 + r, lane, accumulate);
}

/* The matrix starts at a multiple of 4. Its blocks then start at even
 * addresses (every block size is even), q_ld64's aligned words are aligned,
 * and the 2 bytes it may read before a block are inside the matrix (an
 * earlier block). */
static bool blocks_aligned(const void *w) {
  return (uintptr_t)w % 4 == 0;
}

template <int DT>
static cudaError_t qgemv(cudaStream_t s, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                         const void *w, int T, int N, int K, int rpw, int octets, int accumulate) {
  /* rows of whole blocks only, at addresses the loads take */
  if (K % qfmt<DT>::QK || !blocks_aligned(w)) return cudaErrorInvalidValue;
  /* several rows a warp only where the rows still fill the device */
  if (!rpw) rpw = N >= 8192 ? KN_QGEMV_RPW : N >= 4096 ? 2 : 1;
  if (rpw != 1 && rpw != 2 && rpw != KN_QGEMV_RPW) return cudaErrorInvalidValue;
  if (octets != 1 && octets != 2 && octets != 4) return cudaErrorInvalidValue;
  const int vec = (uintptr_t)in % 16 == 0 && (T == 1 || ldi % 4 == 0);
  const dim3 grid = kn_gemv_grid((N + rpw - 1) / rpw), block(32 * KN_GEMV_WARPS);
  const uint8_t *wb = (const uint8_t *)w;
  const size_t rb = (size_t)(K / qfmt<DT>::QK) * qfmt<DT>::BYTES;
  if (T == 1 && octets > 1) {
    switch (rpw * 8 + octets) {
#define KN_QGEMV_OCT(r, u)                                                                         \
  case r * 8 + u:                                                                                  \
    qgemv_octets_kernel<DT, r, u><<<grid, block, 0, s>>>(out, in, wb, rb, N, K, vec, accumulate);  \
    break;
      KN_QGEMV_OCT(1, 2) KN_QGEMV_OCT(1, 4) KN_QGEMV_OCT(2, 2) KN_QGEMV_OCT(2, 4)
      KN_QGEMV_OCT(4, 2) KN_QGEMV_OCT(4, 4)
#undef KN_QGEMV_OCT
    }
    return cudaGetLastError();
  }
  switch (T) {
#define KN_QGEMV_CASE(tt)                                                                          \
  case tt:                                                                                         \
    qgemv_kernel<DT, tt><<<grid, block, 0, s>>>(out, ldo, in, ldi, wb, rb, N, K, rpw, vec,      \
                                                 accumulate);                                      \
    break;
    KN_GEMV_T_CASES(KN_QGEMV_CASE)
#undef KN_QGEMV_CASE
  default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

/* ---- the dequantized tile -------------------------------------------------- */

/* dst[r, :] (bf16, K per row) = rows r < rows of w, one thread per octet, whose
 * eight values (16 bytes: K is whole blocks and dst comes from the allocator, so
 * every octet is 16-byte aligned) go out in one store. */
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
    union {
      __nv_bfloat162 h[4];
      uint4 u;
    } oct;
#pragma unroll
    for (int k = 0; k < 4; k++)
      oct.h[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]); /* .x, the lower address */
    *reinterpret_cast<uint4 *>(dst + r * (size_t)K + 8 * (size_t)o) = oct.u;
  }
}

template <int DT>
static cudaError_t qtile(cudaStream_t s, void *dst, const void *w, int rows, int K) {
  if (K % qfmt<DT>::QK || !blocks_aligned(w)) return cudaErrorInvalidValue;
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
  if (H % qfmt<DT>::QK || !blocks_aligned(table)) return cudaErrorInvalidValue;
  const size_t rb = (size_t)(H / qfmt<DT>::QK) * qfmt<DT>::BYTES;
  qembed_kernel<DT><<<T, 128, 0, s>>>(out, ldo, (const uint8_t *)table, rb, vocab, H, ids, scale);
  return cudaGetLastError();
}

/* ---- launchers ------------------------------------------------------------- */

/* f(qtag<DT>()) for the block format dt (KN_QFORMATS); cudaErrorInvalidValue for the others. */
template <int DT> struct qtag {
  enum { value = DT };
};
template <typename F> static cudaError_t qdispatch(enum kn_dtype dt, F f) {
  switch (dt) {
#define KN_QCASE(d, qk, bytes)                                                                     \
  case d: return f(qtag<d>());
    KN_QFORMATS(KN_QCASE)
#undef KN_QCASE
  default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t kn_cuda_launch_qgemv(cudaStream_t s, float *out, ptrdiff_t ldo,
                                            const float *in, ptrdiff_t ldi, const void *w,
                                            enum kn_dtype wdt, int T, int N, int K, int rpw,
                                            int octets, int accumulate) {
  if (N <= 0 || T <= 0) return cudaSuccess;
  return qdispatch(wdt, [&](auto f) {
    return qgemv<decltype(f)::value>(s, out, ldo, in, ldi, w, T, N, K, rpw, octets, accumulate);
  });
}

extern "C" cudaError_t kn_cuda_launch_qtile(cudaStream_t s, void *dst, const void *w,
                                            enum kn_dtype wdt, int rows, int K) {
  if (rows <= 0 || K <= 0) return cudaSuccess;
  return qdispatch(wdt, [&](auto f) { return qtile<decltype(f)::value>(s, dst, w, rows, K); });
}

extern "C" cudaError_t kn_cuda_launch_qembed(cudaStream_t s, float *out, ptrdiff_t ldo,
                                             const void *table, enum kn_dtype tdt, int vocab, int H,
                                             const int32_t *ids, int T, float scale) {
  if (T <= 0 || H <= 0) return cudaSuccess;
  return qdispatch(tdt, [&](auto f) {
    return qembed<decltype(f)::value>(s, out, ldo, table, vocab, H, ids, T, scale);
  });
}
