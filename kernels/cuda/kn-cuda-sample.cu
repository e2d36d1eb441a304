/* kn-cuda-sample.cu — sampling on the device (kn_sample): only token ids and
 * the requested logprobs leave the GPU.
 *
 * Two kernels:
 *   - penalties: for rows with repetition / frequency / presence penalties,
 *     rewrites the penalised entries of a copy of the row (the C side copies
 *     the rows first), with the CPU's float operations, unfused;
 *   - sample: one block per row. Greedy rows take the argmax of the
 *     (penalised) row, as kn_argmax. Random rows compute l = row * (1 / T),
 *     the max m, the min-p cut m + log(min_p), then find the top-k and top-p
 *     boundaries by radix selection over an order-preserving 32-bit key of l
 *     (four 8-bit digit passes; ties at the boundary resolved by id with four
 *     more passes, rarely needed), and draw by an exponential race: the kept
 *     token with the largest (l - m) - log(E_i), E_i ~ Exp(1) from a hash of
 *     (seed, counter, id), which picks token i with probability exactly
 *     p_i / sum p over the kept set.
 *
 * The order of the candidates is (l descending, id ascending), the CPU's.
 * Top-p masses are fixed-point integers (exp(l - m) * 2^40), so the sums and
 * therefore the boundaries do not depend on the order of atomic additions:
 * a row gives the same token on one device whatever the batch. Logprobs are
 * the raw row's log-softmax (float sums; the CPU sums in double). */
#include <math.h>

#include "kernels/cuda/kn-cuda-dev.cuh"

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS   (SAMPLE_THREADS / 32)
#define NONE_ID        KN_NONE_ID
#define FX_ONE         1099511627776.0f /* 2^40: the fixed-point unit of a mass */

enum sample_level {
  LV_MINP = 0, /* processed logits >= the min-p cut (never NaN) */
  LV_TOPK = 1, /* ... and within the top-k boundary */
  LV_KEPT = 2, /* ... and within the top-p boundary: the candidate set */
  LV_RAW = 3,  /* raw logits that are not NaN (top logprobs) */
};

struct row_ctx {
  const float *w;   /* [V] processed source: the penalised row */
  const float *raw; /* [V] the raw row */
  float inv_t, m, cut;
  uint32_t kkey, pkey; /* top-k / top-p boundaries: (key, id) pairs ... */
  int kid, pid;        /* ... kept when before or equal in the order */
};

struct sample_smem {
  unsigned int cnt[256];
  unsigned long long mass[256];
  float wv[SAMPLE_WARPS];
  int wi[SAMPLE_WARPS];
  unsigned long long wu[SAMPLE_WARPS];
  /* selection state, written by thread 0 */
  uint32_t prefix, r, last_cnt;
  unsigned long long acc;
  int all, tie_r;
  float bcast_f;
  int bcast_i;
  unsigned long long bcast_u;
  int n_top;
  int32_t top_ids[KN_SAMPLE_MAX_LOGPROBS];
  float top_l[KN_SAMPLE_MAX_LOGPROBS];
};

/* ---- keys, masses, random numbers -------------------------------------- */

/* Order-preserving key of a non-NaN float (-0 is +0, as the CPU's ==). */
__device__ __forceinline__ uint32_t fkey(float l) {
  if (l == 0.0f) l = 0.0f;
  uint32_t b = __float_as_uint(l);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* (key, id) at or before the boundary (tk, ti) in the order (key desc, id asc)? */
__device__ __forceinline__ bool within(uint32_t key, int i, uint32_t tk, int ti) {
  return key > tk || (key == tk && i <= ti);
}

__device__ __forceinline__ unsigned long long fx_mass(float l, float m) {
  return (unsigned long long)(expf(__fsub_rn(l, m)) * FX_ONE);
}

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* -log(E), E ~ Exp(1), for token i of a row whose stream base is `base`. */
__device__ __forceinline__ float race_noise(uint64_t base, int i) {
  uint64_t z = mix64(base ^ ((uint64_t)(uint32_t)i * 0xD1B54A32D192ED03ull));
  float u = ((float)(z >> 40) + 0.5f) * (1.0f / 16777216.0f); /* (0, 1) */
  return -logf(-logf(u));
}

/* Element i at `level`: its value and key; false when not a member. */
__device__ __forceinline__ bool member(const row_ctx &c, int level, int i, float *lv,
                                       uint32_t *kv) {
  float l = level == LV_RAW ? c.raw[i] : __fmul_rn(c.w[i], c.inv_t);
  *lv = l;
  if (level == LV_RAW) {
    if (isnan(l)) return false;
    *kv = fkey(l);
    return true;
  }
  if (!(l >= c.cut)) return false;
  uint32_t k = fkey(l);
  *kv = k;
  if (level >= LV_TOPK && !within(k, i, c.kkey, c.kid)) return false;
  if (level >= LV_KEPT && !within(k, i, c.pkey, c.pid)) return false;
  return true;
}

/* ---- block reductions ---------------------------------------------------- */

__device__ float block_max(float v, sample_smem &s) {
  v = kn_warp_max(v);
  if ((threadIdx.x & 31) == 0) s.wv[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float r = s.wv[0];
    for (int k = 1; k < SAMPLE_WARPS; k++)
      r = fmaxf(r, s.wv[k]);
    s.bcast_f = r;
  }
  __syncthreads();
  return s.bcast_f;
}

__device__ float block_sum(float v, sample_smem &s) {
  v = kn_warp_sum(v);
  if ((threadIdx.x & 31) == 0) s.wv[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float r = 0.0f;
    for (int k = 0; k < SAMPLE_WARPS; k++)
      r += s.wv[k];
    s.bcast_f = r;
  }
  __syncthreads();
  return s.bcast_f;
}

__device__ unsigned long long block_sum_u64(unsigned long long v, sample_smem &s) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) s.wu[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long r = 0;
    for (int k = 0; k < SAMPLE_WARPS; k++)
      r += s.wu[k];
    s.bcast_u = r;
  }
  __syncthreads();
  return s.bcast_u;
}

/* The block's best (value, id) of every thread's candidate; NONE_ID when none. */
__device__ int block_best(float v, int i, sample_smem &s) {
  kn_block_best<kn_beats>(v, i, s.wv, s.wi);
  if (threadIdx.x == 0) s.bcast_i = i;
  __syncthreads();
  return s.bcast_i;
}

/* ---- radix selection of a boundary ----------------------------------------- */

/* Histogram of one 8-bit digit over the members of `level`: by key (desc
 * order) among those whose key matches prefix under mask, or, when tie_key is
 * given (by_id), by id among the members whose key is tie_key. */
__device__ void hist_pass(const row_ctx &c, int level, int V, int shift, uint32_t mask, bool by_id,
                          uint32_t tie_key, bool weighted, sample_smem &s) {
  for (int b = threadIdx.x; b < 256; b += blockDim.x) {
    s.cnt[b] = 0;
    s.mass[b] = 0;
  }
  __syncthreads();
  uint32_t prefix = s.prefix;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    float l;
    uint32_t k;
    if (!member(c, level, i, &l, &k)) continue;
    uint32_t x = by_id ? (uint32_t)i : k;
    if (by_id && k != tie_key) continue;
    if ((x & mask) != prefix) continue;
    uint32_t d = (x >> shift) & 255u;
    atomicAdd(&s.cnt[d], 1u);
    if (weighted) atomicAdd(&s.mass[d], fx_mass(l, c.m));
  }
  __syncthreads();
}

/* Finds the boundary (*tk, *ti) of a prefix of the members of `level` in the
 * order (key desc, id asc): with target == 0, the member of rank r (0-based);
 * otherwise (top-p) the last member whose mass before it is < target (the
 * masses are fx_mass; target >= 1). When the prefix is every member,
 * *tk = 0 and *ti = NONE_ID (which every member is within). */
__device__ void select_boundary(const row_ctx &c, int level, int V, uint32_t r,
                                unsigned long long target, uint32_t *tk, int *ti, sample_smem &s) {
  const bool weighted = target != 0;
  if (threadIdx.x == 0) {
    s.prefix = 0;
    s.r = r;
    s.acc = 0;
    s.all = 0;
  }
  __syncthreads();
  uint32_t mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    hist_pass(c, level, V, shift, mask, false, 0, weighted, s);
    if (threadIdx.x == 0) {
      int b = 255;
      for (; b >= 0; b--) {
        if (weighted) {
          if (s.acc + s.mass[b] >= target) break;
          s.acc += s.mass[b];
        } else {
          if (s.r < s.cnt[b]) break;
          s.r -= s.cnt[b];
        }
      }
      if (b < 0)
        s.all = 1;
      else {
        s.prefix |= (uint32_t)b << shift;
        s.last_cnt = s.cnt[b];
      }
    }
    __syncthreads();
    if (s.all) {
      *tk = 0;
      *ti = NONE_ID;
      return;
    }
    mask |= 255u << shift;
  }
  const uint32_t key = s.prefix;
  __syncthreads(); /* every thread has read the key before thread 0 reuses s.prefix */
  if (threadIdx.x == 0) {
    /* how many of the tied members (in id order) the prefix takes */
    uint32_t n_eq = s.last_cnt, take = s.r + 1;
    if (weighted) {
      unsigned long long e = fx_mass(key_value(key), c.m);
      take = e == 0 ? n_eq : (uint32_t)min((unsigned long long)n_eq, (target - s.acc + e - 1) / e);
    }
    s.tie_r = take >= n_eq ? -1 : (int)take - 1;
    s.prefix = 0;
    s.r = (uint32_t)s.tie_r;
  }
  __syncthreads();
  if (s.tie_r < 0) {
    *tk = key;
    *ti = NONE_ID;
    return;
  }
  /* the tie_r-th smallest id among the tied members */
  mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    hist_pass(c, level, V, shift, mask, true, key, false, s);
    if (threadIdx.x == 0) {
      int b = 0;
      for (; b < 255 && s.r >= s.cnt[b]; b++)
        s.r -= s.cnt[b];
      s.prefix |= (uint32_t)b << shift;
    }
    __syncthreads();
    mask |= 255u << shift;
  }
  /* written last: tk / ti may be fields of the row_ctx the passes read */
  *tk = key;
  *ti = (int)s.prefix;
}

/* ---- raw logprobs ------------------------------------------------------------- */

__device__ void raw_logprobs(row_ctx &c, int V, int n, int32_t token, struct kn_sample_out *o,
                             sample_smem &s) {
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x)
    mx = fmaxf(mx, c.raw[i]);
  mx = block_max(mx, s);
  float z = 0.0f;
  for (int i = threadIdx.x; i < V; i += blockDim.x)
    z += expf(c.raw[i] - mx);
  z = block_sum(z, s);
  float lse = mx + logf(z);
  if (threadIdx.x == 0) {
    o->logprob = c.raw[token] - lse;
    o->n_top = n;
    s.n_top = 0;
  }
  if (n == 0) return;
  uint32_t tk;
  int ti;
  select_boundary(c, LV_RAW, V, (uint32_t)(n - 1), 0, &tk, &ti, s);
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    float l;
    uint32_t k;
    if (member(c, LV_RAW, i, &l, &k) && within(k, i, tk, ti)) {
      int slot = atomicAdd(&s.n_top, 1); /* < n: the prefix holds at most n members */
      s.top_ids[slot] = i;
      s.top_l[slot] = l;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int have = s.n_top;
    for (int a = 1; a < have; a++) /* insertion sort: value desc, id asc */
      for (int b = a; b > 0; b--) {
        uint32_t kb = fkey(s.top_l[b]), ka = fkey(s.top_l[b - 1]);
        if (!(kb > ka || (kb == ka && s.top_ids[b] < s.top_ids[b - 1]))) break;
        float tl = s.top_l[b];
        int32_t tid = s.top_ids[b];
        s.top_l[b] = s.top_l[b - 1];
        s.top_ids[b] = s.top_ids[b - 1];
        s.top_l[b - 1] = tl;
        s.top_ids[b - 1] = tid;
      }
    for (int j = 0; j < n; j++) {
      o->top_ids[j] = j < have ? s.top_ids[j] : 0;
      o->top_logprobs[j] = j < have ? s.top_l[j] - lse : -INFINITY;
    }
  }
}

/* ---- kernels ------------------------------------------------------------------ */

__global__ void penalty_kernel(float *work, const float *logits, ptrdiff_t ld, int V,
                               const struct kn_cuda_sample_row *rows, const int32_t *pen_ids,
                               const int32_t *pen_counts) {
  const struct kn_cuda_sample_row R = rows[blockIdx.x];
  const float *raw = logits + (ptrdiff_t)blockIdx.x * ld;
  float *w = work + (ptrdiff_t)blockIdx.x * V;
  for (int j = threadIdx.x; j < R.n_pen; j += blockDim.x) {
    int32_t id = pen_ids[R.pen_off + j], n = pen_counts[R.pen_off + j];
    float l = raw[id];
    if (R.repetition != 1.0f) l = l > 0 ? __fdiv_rn(l, R.repetition) : __fmul_rn(l, R.repetition);
    if (n > 0) {
      l = __fsub_rn(l, __fmul_rn(R.frequency, (float)n));
      if (R.presence != 0.0f) l = __fsub_rn(l, R.presence);
    }
    w[id] = l;
  }
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(struct kn_sample_out *outs, const float *logits, ptrdiff_t ld, const float *work,
                  ptrdiff_t ldw, int V, const struct kn_cuda_sample_row *rows) {
  __shared__ sample_smem s;
  const struct kn_cuda_sample_row R = rows[blockIdx.x];
  struct kn_sample_out *o = outs + blockIdx.x;
  row_ctx c;
  c.raw = logits + (ptrdiff_t)blockIdx.x * ld;
  c.w = work + (ptrdiff_t)blockIdx.x * ldw;
  c.inv_t = R.inv_t;
  c.m = 0.0f;
  c.cut = -INFINITY;
  c.kkey = c.pkey = 0;
  c.kid = c.pid = NONE_ID;
  int token;
  if (R.inv_t == 0.0f) { /* greedy: kn_argmax of the penalised row */
    float bv = 0.0f;
    int bi = NONE_ID;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      float x = c.w[i];
      if (!isnan(x) && (bi == NONE_ID || x > bv)) {
        bv = x;
        bi = i;
      }
    }
    token = block_best(bv, bi, s);
    if (token == NONE_ID) token = 0;
  } else {
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
      mx = fmaxf(mx, __fmul_rn(c.w[i], c.inv_t));
    c.m = block_max(mx, s);
    if (!isfinite(c.m)) { /* nothing finite to sample from */
      if (threadIdx.x == 0) o->token = -1;
      return;
    }
    c.cut = R.log_min_p == -INFINITY ? -INFINITY : __fadd_rn(c.m, R.log_min_p);
    if (R.top_k > 0) select_boundary(c, LV_MINP, V, (uint32_t)(R.top_k - 1), 0, &c.kkey, &c.kid, s);
    if (R.top_p < 1.0f) {
      unsigned long long zc = 0;
      for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float l;
        uint32_t k;
        if (member(c, LV_TOPK, i, &l, &k)) zc += fx_mass(l, c.m);
      }
      zc = block_sum_u64(zc, s);
      unsigned long long target = (unsigned long long)((double)R.top_p * (double)zc);
      if (target == 0) target = 1; /* the best token is always kept */
      select_boundary(c, LV_TOPK, V, 0, target, &c.pkey, &c.pid, s);
    }
    uint64_t base = mix64(mix64(R.seed) ^ (R.counter * 0x9E3779B97F4A7C15ull + 0x5A17ull));
    float bv = 0.0f;
    int bi = NONE_ID;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      float l;
      uint32_t k;
      if (!member(c, LV_KEPT, i, &l, &k)) continue;
      float score = __fsub_rn(l, c.m) + race_noise(base, i);
      if (kn_beats(score, i, bv, bi)) {
        bv = score;
        bi = i;
      }
    }
    token = block_best(bv, bi, s);
  }
  if (threadIdx.x == 0) {
    o->token = token;
    o->logprob = 0.0f;
    o->n_top = 0;
  }
  if (R.n_logprobs >= 0) raw_logprobs(c, V, R.n_logprobs, token, o, s);
}

/* -inf wherever row blockIdx.y's mask refuses (after the penalties: they keep
 * -inf as -inf on the CPU too), a thread per logit, its word read by 32 at once */
__global__ void mask_kernel(float *work, ptrdiff_t ldw, int V,
                            const struct kn_cuda_sample_row *rows, const uint32_t *masks) {
  const int off = rows[blockIdx.y].mask_off;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (off < 0 || i >= V) return;
  if (!((masks[(size_t)off + (unsigned)i / 32] >> (i & 31)) & 1u))
    work[(ptrdiff_t)blockIdx.y * ldw + i] = -INFINITY;
}

extern "C" cudaError_t kn_cuda_launch_sample(cudaStream_t s, struct kn_sample_out *out,
                                             const float *logits, ptrdiff_t ld, float *work,
                                             ptrdiff_t ldw, int T, int V,
                                             const struct kn_cuda_sample_row *rows,
                                             const int32_t *pen_ids, const int32_t *pen_counts,
                                             const uint32_t *masks) {
  if (pen_ids) {
    penalty_kernel<<<dim3((unsigned)T), 256, 0, s>>>(work, logits, ld, V, rows, pen_ids,
                                                     pen_counts);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  if (masks) {
    mask_kernel<<<dim3((unsigned)((V + 255) / 256), (unsigned)T), 256, 0, s>>>(work, ldw, V, rows,
                                                                               masks);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  sample_kernel<<<dim3((unsigned)T), SAMPLE_THREADS, 0, s>>>(out, logits, ld, work, ldw, V, rows);
  return cudaGetLastError();
}
