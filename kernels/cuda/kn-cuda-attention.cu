/* kn-cuda-attention.cu — paged attention for a ragged batch of prefill chunks
 * and decodes, flash-decoding style (split-K).
 *
 * Grid: x = tile (up to qt consecutive query rows of one sequence),
 * y = kv head x head chunk, z = key split. A block serves NS "slots", each a
 * (query row, query head) pair of the same kv head, so every K / V row it
 * reads from the pages (f32 or bf16) is used NS times: decodes fill the slots
 * with the GQA group's heads, prefill chunks with several query rows too.
 * It walks its split of the tile's key interval in tiles of ATTN_TILE keys
 * with an online softmax per slot (keys outside a slot's own interval score
 * -inf). With one split it writes the output; otherwise it leaves
 * (max, sum, acc) partials that attn_combine_kernel merges per (row, head).
 *
 * Shapes: q[T, n_heads, D] (token stride ldq), out likewise (ldo), D <= 512:
 * thread t owns output elements t + c * ATTN_THREADS, c < ATTN_DC. */
#include <math.h>

#include "kernels/cuda/kn-cuda-dev.cuh"

#define ATTN_THREADS 128 /* 4 warps */
#define ATTN_WARPS   (ATTN_THREADS / 32)
#define ATTN_TILE    32 /* keys per tile */
#define ATTN_MAX_D   512
#define ATTN_DC      (ATTN_MAX_D / ATTN_THREADS)
#define ATTN_PV      4 /* keys whose V rows are loaded together */

/* Key j's scores (a warp's partial dot products part[s] for each slot),
 * reduced, scaled, softcapped, -inf outside each slot's visible keys. */
template <int NS>
__device__ __forceinline__ void put_scores(float (*ps)[ATTN_TILE], const float *part, int j,
                                           int pos, const int *s_lo, const int *s_hi, float scale,
                                           float softcap, int lane) {
#pragma unroll
  for (int s = 0; s < NS; s++) {
    float sc = kn_warp_sum(part[s]) * scale;
    if (softcap > 0.0f) sc = tanhf(sc / softcap) * softcap;
    if (lane == 0) ps[s][j] = pos >= s_lo[s] && pos <= s_hi[s] ? sc : -INFINITY;
  }
}

/* Keys per split of a tile: the plan's, or (fit_split) the tile's own keys
 * spread over the grid's splits, rounded up to ATTN_TILE, split_len at least. */
__device__ __forceinline__ int tile_split(const struct kn_cuda_attn_args &a,
                                          const struct kn_cuda_attn_tile &t) {
  if (!a.fit_split) return a.split_len;
  int len = t.hi - t.lo + 1;
  int s = (len + a.n_split - 1) / a.n_split;
  s = (s + ATTN_TILE - 1) / ATTN_TILE * ATTN_TILE;
  return max(s, a.split_len);
}

template <typename KT, int NS>
__global__ void __launch_bounds__(ATTN_THREADS)
    attn_split_kernel(const struct kn_cuda_attn_args a) {
  __shared__ float qs[NS][ATTN_MAX_D]; /* the slots' query vectors */
  __shared__ float ps[NS][ATTN_TILE];  /* scores, then probabilities */
  __shared__ size_t kbase[ATTN_TILE];  /* pool byte offsets of the tile's rows */
  __shared__ int s_lo[NS], s_hi[NS];   /* each slot's visible keys (empty if unused) */
  __shared__ float m_s[NS], l_s[NS], corr_s[NS];

  const struct kn_cuda_attn_tile tile = a.tiles[blockIdx.x];
  const int kvh = blockIdx.y / a.n_chunks;
  const int g0 = (blockIdx.y % a.n_chunks) * a.chunk;
  const int gn = min(a.chunk, a.group - g0);
  const int D = a.head_dim;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const size_t elt = sizeof(KT);

  /* an fp8 cache's scales for this kv head: each element read is value * scale */
  const float ksc = a.k_scale ? a.k_scale[kvh] : 1.0f, vsc = a.v_scale ? a.v_scale[kvh] : 1.0f;
  const int split = tile_split(a, tile);
  int k_begin = tile.lo + (int)blockIdx.z * split;
  if (k_begin > tile.hi) return; /* this tile has fewer splits; combine knows */
  int k_end = min(tile.hi + 1, k_begin + split);

  /* slot s = qi * chunk + g: query row tile.r0 + qi, head kvh * group + g0 + g */
  for (int i = tid; i < NS * D; i += ATTN_THREADS) {
    int s = i / D, d = i % D, qi = s / a.chunk, g = s % a.chunk;
    float v = 0.0f;
    if (qi < tile.nq && g < gn) {
      const struct kn_cuda_attn_row *r = &a.rows[tile.r0 + qi];
      v = a.q[(ptrdiff_t)r->q_row * a.ldq + (ptrdiff_t)(kvh * a.group + g0 + g) * D + d];
    }
    qs[s][d] = v;
  }
  if (tid < NS) {
    int qi = tid / a.chunk, g = tid % a.chunk;
    bool used = qi < tile.nq && g < gn;
    s_lo[tid] = used ? a.rows[tile.r0 + qi].lo : 1;
    s_hi[tid] = used ? a.rows[tile.r0 + qi].hi : 0;
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  const int bt_off = a.rows[tile.r0].bt_off;
  float acc[NS][ATTN_DC];
  bool d_ok[ATTN_DC]; /* this thread's output element c is inside D */
#pragma unroll
  for (int c = 0; c < ATTN_DC; c++)
    d_ok[c] = tid + c * ATTN_THREADS < D;
#pragma unroll
  for (int s = 0; s < NS; s++)
#pragma unroll
    for (int c = 0; c < ATTN_DC; c++)
      acc[s][c] = 0.0f;

  for (int t0 = k_begin; t0 < k_end; t0 += ATTN_TILE) {
    const int nk = min(ATTN_TILE, k_end - t0);
    if (tid < nk) {
      int pos = t0 + tid;
      int page = a.tables[bt_off + pos / a.block_tokens];
      int slot = pos % a.block_tokens;
      kbase[tid] = (size_t)page * a.page_bytes +
                   ((size_t)slot * (size_t)a.n_kv_heads + (size_t)kvh) * (size_t)D * elt;
    }
    __syncthreads();

    /* scores: warp w takes keys w, w + ATTN_WARPS, ..., two at a time so
     * that both keys' loads are in flight together; lanes split D. Each
     * key's sums are those it would get alone. */
    for (int j = warp; j < nk; j += 2 * ATTN_WARPS) {
      const int j2 = j + ATTN_WARPS;
      const bool two = j2 < nk; /* the same for the whole warp */
      const KT *kp = (const KT *)(a.pool + kbase[j] + a.k_off);
      const KT *kp2 = (const KT *)(a.pool + kbase[two ? j2 : j] + a.k_off);
      float part[NS], part2[NS];
#pragma unroll
      for (int s = 0; s < NS; s++)
        part[s] = part2[s] = 0.0f;
      for (int d = lane; d < D; d += 32) {
        float kv = __fmul_rn(kn_load(kp, d), ksc), kv2 = __fmul_rn(kn_load(kp2, d), ksc);
#pragma unroll
        for (int s = 0; s < NS; s++) {
          part[s] = fmaf(qs[s][d], kv, part[s]);
          part2[s] = fmaf(qs[s][d], kv2, part2[s]);
        }
      }
      put_scores<NS>(ps, part, j, t0 + j, s_lo, s_hi, a.scale, a.softcap, lane);
      if (two) put_scores<NS>(ps, part2, j2, t0 + j2, s_lo, s_hi, a.scale, a.softcap, lane);
    }
    __syncthreads();

    /* online softmax: one thread per slot */
    if (tid < NS) {
      float mold = m_s[tid], mx = mold;
      for (int j = 0; j < nk; j++)
        mx = fmaxf(mx, ps[tid][j]);
      if (mx == -INFINITY) { /* nothing visible yet: stay empty */
        for (int j = 0; j < nk; j++)
          ps[tid][j] = 0.0f;
        corr_s[tid] = 1.0f;
      } else {
        float corr = mold == -INFINITY ? 0.0f : expf(mold - mx);
        float sum = 0.0f;
        for (int j = 0; j < nk; j++) {
          float e = expf(ps[tid][j] - mx); /* 0 for -inf */
          ps[tid][j] = e;
          sum += e;
        }
        l_s[tid] = l_s[tid] * corr + sum;
        m_s[tid] = mx;
        corr_s[tid] = corr;
      }
    }
    __syncthreads();

    /* acc = acc * corr + p · V */
#pragma unroll
    for (int s = 0; s < NS; s++) {
      float cr = corr_s[s];
#pragma unroll
      for (int c = 0; c < ATTN_DC; c++)
        acc[s][c] *= cr;
    }
    /* ATTN_PV keys at a time: their V loads are all issued before the sums
     * use them (one load's latency per group, not per key); each acc element
     * still adds its keys in order, so the results are those of one key at a
     * time. Elements past D load nothing and are never written out. */
    int j = 0;
    for (; j + ATTN_PV <= nk; j += ATTN_PV) {
      float vv[ATTN_PV][ATTN_DC];
#pragma unroll
      for (int u = 0; u < ATTN_PV; u++) {
        const KT *vp = (const KT *)(a.pool + kbase[j + u] + a.v_off);
#pragma unroll
        for (int c = 0; c < ATTN_DC; c++)
          vv[u][c] = d_ok[c] ? __fmul_rn(kn_load(vp, tid + c * ATTN_THREADS), vsc) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < ATTN_PV; u++)
#pragma unroll
        for (int c = 0; c < ATTN_DC; c++)
#pragma unroll
          for (int s = 0; s < NS; s++)
            acc[s][c] = fmaf(ps[s][j + u], vv[u][c], acc[s][c]);
    }
    for (; j < nk; j++) {
      const KT *vp = (const KT *)(a.pool + kbase[j] + a.v_off);
#pragma unroll
      for (int c = 0; c < ATTN_DC; c++) {
        float vv = d_ok[c] ? __fmul_rn(kn_load(vp, tid + c * ATTN_THREADS), vsc) : 0.0f;
#pragma unroll
        for (int s = 0; s < NS; s++)
          acc[s][c] = fmaf(ps[s][j], vv, acc[s][c]);
      }
    }
    __syncthreads(); /* ps and kbase are rewritten by the next tile */
  }

#pragma unroll
  for (int s = 0; s < NS; s++) {
    int qi = s / a.chunk, g = s % a.chunk;
    if (qi >= tile.nq || g >= gn) continue;
    int r = tile.r0 + qi;
    int head = kvh * a.group + g0 + g;
    if (a.n_split == 1) {
      float inv = l_s[s] > 0.0f ? 1.0f / l_s[s] : 0.0f;
      float *o = a.out + (ptrdiff_t)a.rows[r].q_row * a.ldo + (ptrdiff_t)head * D;
#pragma unroll
      for (int c = 0; c < ATTN_DC; c++) {
        int d = tid + c * ATTN_THREADS;
        if (d < D) o[d] = acc[s][c] * inv;
      }
    } else {
      size_t idx = ((size_t)r * a.n_heads + (size_t)head) * a.n_split + blockIdx.z;
      float *pa = a.part_acc + idx * (size_t)D;
#pragma unroll
      for (int c = 0; c < ATTN_DC; c++) {
        int d = tid + c * ATTN_THREADS;
        if (d < D) pa[d] = acc[s][c];
      }
      if (tid == 0) {
        a.part_ml[2 * idx] = m_s[s];
        a.part_ml[2 * idx + 1] = l_s[s];
      }
    }
  }
}

/* Merges the splits of one (tile, head): grid x = tile, y = head. */
__global__ void attn_combine_kernel(const struct kn_cuda_attn_args a) {
  const struct kn_cuda_attn_tile tile = a.tiles[blockIdx.x];
  const int h = blockIdx.y, D = a.head_dim;
  const int ns = (tile.hi - tile.lo) / tile_split(a, tile) + 1; /* splits this tile used */
  for (int qi = 0; qi < tile.nq; qi++) {
    const int r = tile.r0 + qi;
    const size_t base = ((size_t)r * a.n_heads + (size_t)h) * a.n_split;
    float M = -INFINITY;
    for (int s = 0; s < ns; s++)
      M = fmaxf(M, a.part_ml[2 * (base + s)]);
    float L = 0.0f;
    for (int s = 0; s < ns; s++) {
      float m = a.part_ml[2 * (base + s)];
      if (m != -INFINITY) L += expf(m - M) * a.part_ml[2 * (base + s) + 1];
    }
    float inv = L > 0.0f ? 1.0f / L : 0.0f;
    float *o = a.out + (ptrdiff_t)a.rows[r].q_row * a.ldo + (ptrdiff_t)h * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      float v = 0.0f;
      for (int s = 0; s < ns; s++) {
        float m = a.part_ml[2 * (base + s)];
        if (m != -INFINITY) v += expf(m - M) * a.part_acc[(base + s) * (size_t)D + d];
      }
      o[d] = v * inv;
    }
  }
}

template <typename KT>
static void launch_split(cudaStream_t s, const struct kn_cuda_attn_args *a, dim3 grid) {
  switch (a->slots) {
  case 1: attn_split_kernel<KT, 1><<<grid, ATTN_THREADS, 0, s>>>(*a); break;
  case 2: attn_split_kernel<KT, 2><<<grid, ATTN_THREADS, 0, s>>>(*a); break;
  case 4: attn_split_kernel<KT, 4><<<grid, ATTN_THREADS, 0, s>>>(*a); break;
  default: attn_split_kernel<KT, 8><<<grid, ATTN_THREADS, 0, s>>>(*a); break;
  }
}

extern "C" cudaError_t kn_cuda_launch_attention(cudaStream_t s, const struct kn_cuda_attn_args *a,
                                                enum kn_dtype kv_dtype) {
  bool slots_ok = a->slots == 1 || a->slots == 2 || a->slots == 4 || a->slots == 8;
  if (a->head_dim > ATTN_MAX_D || !slots_ok || a->chunk < 1 || a->qt < 1 ||
      a->qt * a->chunk > a->slots || a->split_len % ATTN_TILE)
    return cudaErrorInvalidValue;
  /* tiles go on grid x (2^31 - 1), kv heads x chunks on y and splits on z (65535) */
  dim3 grid((unsigned)a->n_tiles, (unsigned)(a->n_kv_heads * a->n_chunks), (unsigned)a->n_split);
  switch (kv_dtype) {
  case KN_DTYPE_F32: launch_split<float>(s, a, grid); break;
  case KN_DTYPE_BF16: launch_split<__nv_bfloat16>(s, a, grid); break;
  case KN_DTYPE_F8E4M3: launch_split<__nv_fp8_e4m3>(s, a, grid); break;
  default: return cudaErrorInvalidValue;
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || a->n_split == 1) return e;
  attn_combine_kernel<<<dim3((unsigned)a->n_tiles, (unsigned)a->n_heads), 128, 0, s>>>(*a);
  return cudaGetLastError();
}
