/* kn-cuda-attention.cu — paged attention for a ragged batch of prefill chunks
 * and decodes, flash-decoding style (split-K).
 *
 * Grid: x = query row (one per query token of the batch), y = kv head x head
 * chunk (up to ATTN_GROUP query heads of one GQA group share each K/V read),
 * z = key split. A block walks its split of the row's visible key interval
 * [lo, hi] in tiles of ATTN_TILE keys with an online softmax, reading K and V
 * straight from the pages (f32 or bf16). With one split it writes the output;
 * otherwise it leaves (max, sum, acc) partials that attn_combine_kernel merges.
 *
 * Shapes: q[T, n_heads, D] (token stride ldq), out likewise (ldo),
 * D <= 512 (ATTN_THREADS * DC elements per thread, DC <= 4). */
#include <math.h>

#include "kernels/cuda/kn-cuda-dev.cuh"

#define ATTN_THREADS 128 /* 4 warps */
#define ATTN_WARPS (ATTN_THREADS / 32)
#define ATTN_TILE 32  /* keys per tile; a multiple of ATTN_WARPS */
#define ATTN_GROUP 8  /* query heads per block at most */
#define ATTN_MAX_D 512

/* Byte offset of key position `pos`'s row for kv head kvh within the pool
 * (add k_off or v_off). */
__device__ __forceinline__ size_t kv_row_offset(const struct kn_cuda_attn_args &a, int bt_off,
                                                int pos, int kvh, size_t elt) {
  int page = a.tables[bt_off + pos / a.block_tokens];
  int slot = pos % a.block_tokens;
  return (size_t)page * a.page_bytes +
         ((size_t)slot * (size_t)a.n_kv_heads + (size_t)kvh) * (size_t)a.head_dim * elt;
}

template <typename KT, int DC>
__global__ void __launch_bounds__(ATTN_THREADS) attn_split_kernel(const struct kn_cuda_attn_args a) {
  __shared__ float qs[ATTN_GROUP][ATTN_MAX_D]; /* the block's query heads */
  __shared__ float ps[ATTN_GROUP][ATTN_TILE];  /* scores, then probabilities */
  __shared__ size_t kbase[ATTN_TILE];          /* pool byte offsets of the tile's rows */
  __shared__ float m_s[ATTN_GROUP], l_s[ATTN_GROUP], corr_s[ATTN_GROUP];

  const struct kn_cuda_attn_row row = a.rows[blockIdx.x];
  const int kvh = blockIdx.y / a.n_chunks;
  const int g0 = (blockIdx.y % a.n_chunks) * a.chunk;
  const int gn = min(a.chunk, a.group - g0);
  const int head0 = kvh * a.group + g0;
  const int D = a.head_dim;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const size_t elt = sizeof(KT);

  int k_begin = row.lo + (int)blockIdx.z * a.split_len;
  if (k_begin > row.hi) return; /* this row has fewer splits; combine knows */
  int k_end = min(row.hi + 1, k_begin + a.split_len);

  for (int i = tid; i < ATTN_GROUP * D; i += ATTN_THREADS) {
    int g = i / D, d = i % D;
    qs[g][d] = g < gn ? a.q[(ptrdiff_t)row.q_row * a.ldq + (ptrdiff_t)(head0 + g) * D + d] : 0.0f;
  }
  if (tid < ATTN_GROUP) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  float acc[ATTN_GROUP][DC];
#pragma unroll
  for (int g = 0; g < ATTN_GROUP; g++)
#pragma unroll
    for (int c = 0; c < DC; c++) acc[g][c] = 0.0f;

  for (int t0 = k_begin; t0 < k_end; t0 += ATTN_TILE) {
    const int nk = min(ATTN_TILE, k_end - t0);
    if (tid < nk) kbase[tid] = kv_row_offset(a, row.bt_off, t0 + tid, kvh, elt);
    __syncthreads();

    /* scores: warp w takes keys w, w + ATTN_WARPS, ...; lanes split D */
    for (int j = warp; j < nk; j += ATTN_WARPS) {
      const KT *kp = (const KT *)(a.pool + kbase[j] + a.k_off);
      float part[ATTN_GROUP];
#pragma unroll
      for (int g = 0; g < ATTN_GROUP; g++) part[g] = 0.0f;
      for (int d = lane; d < D; d += 32) {
        float kv = kn_load(kp, d);
#pragma unroll
        for (int g = 0; g < ATTN_GROUP; g++) part[g] = fmaf(qs[g][d], kv, part[g]);
      }
#pragma unroll
      for (int g = 0; g < ATTN_GROUP; g++) {
        float sc = kn_warp_sum(part[g]) * a.scale;
        if (a.softcap > 0.0f) sc = tanhf(sc / a.softcap) * a.softcap;
        if (lane == 0) ps[g][j] = sc;
      }
    }
    __syncthreads();

    /* online softmax: one thread per query head */
    if (tid < gn) {
      float mold = m_s[tid], mx = mold;
      for (int j = 0; j < nk; j++) mx = fmaxf(mx, ps[tid][j]);
      float corr = mold == -INFINITY ? 0.0f : expf(mold - mx);
      float sum = 0.0f;
      for (int j = 0; j < nk; j++) {
        float e = expf(ps[tid][j] - mx);
        ps[tid][j] = e;
        sum += e;
      }
      l_s[tid] = l_s[tid] * corr + sum;
      m_s[tid] = mx;
      corr_s[tid] = corr;
    }
    __syncthreads();

    /* acc = acc * corr + p · V; thread tid owns elements tid + c * ATTN_THREADS */
#pragma unroll
    for (int g = 0; g < ATTN_GROUP; g++) {
      float cr = g < gn ? corr_s[g] : 0.0f;
#pragma unroll
      for (int c = 0; c < DC; c++) acc[g][c] *= cr;
    }
    for (int j = 0; j < nk; j++) {
      const KT *vp = (const KT *)(a.pool + kbase[j] + a.v_off);
#pragma unroll
      for (int c = 0; c < DC; c++) {
        int d = tid + c * ATTN_THREADS;
        if (d < D) {
          float vv = kn_load(vp, d);
#pragma unroll
          for (int g = 0; g < ATTN_GROUP; g++) acc[g][c] = fmaf(ps[g][j], vv, acc[g][c]);
        }
      }
    }
    __syncthreads(); /* ps and kbase are rewritten by the next tile */
  }

  if (a.n_split == 1) {
#pragma unroll
    for (int g = 0; g < ATTN_GROUP; g++) {
      if (g >= gn) break;
      float inv = l_s[g] > 0.0f ? 1.0f / l_s[g] : 0.0f;
      float *o = a.out + (ptrdiff_t)row.q_row * a.ldo + (ptrdiff_t)(head0 + g) * D;
#pragma unroll
      for (int c = 0; c < DC; c++) {
        int d = tid + c * ATTN_THREADS;
        if (d < D) o[d] = acc[g][c] * inv;
      }
    }
  } else {
#pragma unroll
    for (int g = 0; g < ATTN_GROUP; g++) {
      if (g >= gn) break;
      size_t idx = ((size_t)blockIdx.x * a.n_heads + (size_t)(head0 + g)) * a.n_split + blockIdx.z;
      float *pa = a.part_acc + idx * (size_t)D;
#pragma unroll
      for (int c = 0; c < DC; c++) {
        int d = tid + c * ATTN_THREADS;
        if (d < D) pa[d] = acc[g][c];
      }
      if (tid == 0) {
        a.part_ml[2 * idx] = m_s[g];
        a.part_ml[2 * idx + 1] = l_s[g];
      }
    }
  }
}

/* Merges the splits of one (row, head): grid x = row, y = head. */
__global__ void attn_combine_kernel(const struct kn_cuda_attn_args a) {
  const struct kn_cuda_attn_row row = a.rows[blockIdx.x];
  const int h = blockIdx.y, D = a.head_dim;
  const int ns = (row.hi - row.lo) / a.split_len + 1; /* splits this row used */
  const size_t base = ((size_t)blockIdx.x * a.n_heads + (size_t)h) * a.n_split;
  float M = -INFINITY;
  for (int s = 0; s < ns; s++) M = fmaxf(M, a.part_ml[2 * (base + s)]);
  float L = 0.0f;
  for (int s = 0; s < ns; s++) {
    float m = a.part_ml[2 * (base + s)];
    if (m != -INFINITY) L += expf(m - M) * a.part_ml[2 * (base + s) + 1];
  }
  float inv = L > 0.0f ? 1.0f / L : 0.0f;
  float *o = a.out + (ptrdiff_t)row.q_row * a.ldo + (ptrdiff_t)h * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float v = 0.0f;
    for (int s = 0; s < ns; s++) {
      float m = a.part_ml[2 * (base + s)];
      if (m != -INFINITY) v += expf(m - M) * a.part_acc[(base + s) * (size_t)D + d];
    }
    o[d] = v * inv;
  }
}

template <typename KT>
static void launch_split(cudaStream_t s, const struct kn_cuda_attn_args *a, dim3 grid) {
  int dc = (a->head_dim + ATTN_THREADS - 1) / ATTN_THREADS;
  switch (dc) {
  case 1: attn_split_kernel<KT, 1><<<grid, ATTN_THREADS, 0, s>>>(*a); break;
  case 2: attn_split_kernel<KT, 2><<<grid, ATTN_THREADS, 0, s>>>(*a); break;
  case 3: attn_split_kernel<KT, 3><<<grid, ATTN_THREADS, 0, s>>>(*a); break;
  default: attn_split_kernel<KT, 4><<<grid, ATTN_THREADS, 0, s>>>(*a); break;
  }
}

extern "C" cudaError_t kn_cuda_launch_attention(cudaStream_t s, const struct kn_cuda_attn_args *a,
                                                enum kn_dtype kv_dtype) {
  if (a->head_dim > ATTN_MAX_D || a->chunk > ATTN_GROUP || a->chunk < 1 ||
      a->split_len % ATTN_TILE)
    return cudaErrorInvalidValue;
  /* rows go on grid x (2^31 - 1), kv heads x chunks on y and splits on z (65535) */
  dim3 grid((unsigned)a->n_rows, (unsigned)(a->n_kv_heads * a->n_chunks), (unsigned)a->n_split);
  switch (kv_dtype) {
  case KN_DTYPE_F32: launch_split<float>(s, a, grid); break;
  case KN_DTYPE_BF16: launch_split<__nv_bfloat16>(s, a, grid); break;
  default: return cudaErrorInvalidValue;
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || a->n_split == 1) return e;
  attn_combine_kernel<<<dim3((unsigned)a->n_rows, (unsigned)a->n_heads), 128, 0, s>>>(*a);
  return cudaGetLastError();
}
