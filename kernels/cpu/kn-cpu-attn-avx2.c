/* kn-cpu-attn-avx2.c — AVX2 paged attention for one (query, kv head): online
 * softmax over key blocks aligned to absolute positions.
 *
 * For a query at absolute position p, the visible key range [lo, hi] is cut
 * into blocks [b, b + KN_ATTN_BLOCK) with b a multiple of KN_ATTN_BLOCK. Each
 * block's scores are computed (invisible keys are -inf), the running maximum,
 * the rescale of the running sum and accumulator, and the V accumulation run
 * in position order. Everything depends only on p, the keys and the query, so
 * a row gets the same bits alone or batched, and whether its prompt was
 * attended in one chunk, several, or token by token. The query heads of a GQA
 * group share each K load; V is accumulated with 64 dims of a head in
 * registers across the block's visible keys. Head dims that are not a
 * multiple of 8 use the reference kernel.
 *
 * Rows that all see exactly the same keys (an image's bidirectional range)
 * also go as tiles of KN_ATTN_TILE rows (attn_tile): block by block, each row
 * scores the block and folds it in (update_block, shared with the single-row
 * path) while the block's K and V are in L1, so the key range is read once per
 * tile instead of once per row, and each row's bits are those it gets alone. */
#include <math.h>

#include "kernels/cpu/kn-cpu-avx2.h"
#include "kernels/cpu/kn-cpu-impl.h"

KN_AVX2 static inline __m256 kv_ld(const void *base, int d, int bf16) {
  if (bf16) return kn_avx2_bf16((const uint16_t *)base + d);
  return _mm256_loadu_ps((const float *)base + d);
}

/* q . k over D (a multiple of 8): four accumulators over 32-element steps,
 * the rest of the 8-element steps into the first, then (a0 + a1) + (a2 + a3)
 * and the fixed horizontal sum. */
KN_AVX2 static inline float dot_qk(const float *q, const void *k, int D, int bf16) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int d = 0;
  for (; d + 32 <= D; d += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), kv_ld(k, d, bf16), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), kv_ld(k, d + 8, bf16), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 16), kv_ld(k, d + 16, bf16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 24), kv_ld(k, d + 24, bf16), a3);
  }
  for (; d < D; d += 8)
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), kv_ld(k, d, bf16), a0);
  return kn_avx2_hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

/* One key block of one query head: the block's scores s[KN_ATTN_BLOCK] (-inf
 * where invisible) fold into the running maximum *m and sum *l, and p_j v_j of
 * the visible keys (vp, at block offsets vj, in position order) into acc. */
KN_AVX2 static inline void update_block(float *s, const void *const *vp, const int *vj, int n_vis,
                                        float *m, float *l, float *acc, int D, int bf16) {
  __m256 v0 = _mm256_load_ps(&s[0]), v1 = _mm256_load_ps(&s[8]);
  __m256 v2 = _mm256_load_ps(&s[16]), v3 = _mm256_load_ps(&s[24]);
  float bm = kn_avx2_hmax(_mm256_max_ps(_mm256_max_ps(v0, v1), _mm256_max_ps(v2, v3)));
  float mnew = bm > *m ? bm : *m;
  __m256 mv = _mm256_set1_ps(mnew);
  float corr = _mm256_cvtss_f32(kn_avx2_exp(_mm256_set1_ps(*m - mnew)));
  v0 = kn_avx2_exp(_mm256_sub_ps(v0, mv));
  v1 = kn_avx2_exp(_mm256_sub_ps(v1, mv));
  v2 = kn_avx2_exp(_mm256_sub_ps(v2, mv));
  v3 = kn_avx2_exp(_mm256_sub_ps(v3, mv));
  _mm256_store_ps(&s[0], v0);
  _mm256_store_ps(&s[8], v1);
  _mm256_store_ps(&s[16], v2);
  _mm256_store_ps(&s[24], v3);
  float bsum = kn_avx2_hsum(_mm256_add_ps(_mm256_add_ps(v0, v1), _mm256_add_ps(v2, v3)));
  *l = *l * corr + bsum;
  *m = mnew;
  /* acc = acc * corr, then acc += p_j v_j over the visible keys in position
   * order; 64 (or 32, 8) dims at a time stay in registers across the keys */
  const __m256 cv = _mm256_set1_ps(corr);
  const float *pg = s;
  float *ag = acc;
  int d = 0;
  for (; d + 64 <= D; d += 64) { /* eight independent chains */
    __m256 a0 = _mm256_mul_ps(_mm256_load_ps(ag + d), cv);
    __m256 a1 = _mm256_mul_ps(_mm256_load_ps(ag + d + 8), cv);
    __m256 a2 = _mm256_mul_ps(_mm256_load_ps(ag + d + 16), cv);
    __m256 a3 = _mm256_mul_ps(_mm256_load_ps(ag + d + 24), cv);
    __m256 a4 = _mm256_mul_ps(_mm256_load_ps(ag + d + 32), cv);
    __m256 a5 = _mm256_mul_ps(_mm256_load_ps(ag + d + 40), cv);
    __m256 a6 = _mm256_mul_ps(_mm256_load_ps(ag + d + 48), cv);
    __m256 a7 = _mm256_mul_ps(_mm256_load_ps(ag + d + 56), cv);
    for (int n = 0; n < n_vis; n++) {
      __m256 pv = _mm256_set1_ps(pg[vj[n]]);
      const void *v = vp[n];
      a0 = _mm256_fmadd_ps(pv, kv_ld(v, d, bf16), a0);
      a1 = _mm256_fmadd_ps(pv, kv_ld(v, d + 8, bf16), a1);
      a2 = _mm256_fmadd_ps(pv, kv_ld(v, d + 16, bf16), a2);
      a3 = _mm256_fmadd_ps(pv, kv_ld(v, d + 24, bf16), a3);
      a4 = _mm256_fmadd_ps(pv, kv_ld(v, d + 32, bf16), a4);
      a5 = _mm256_fmadd_ps(pv, kv_ld(v, d + 40, bf16), a5);
      a6 = _mm256_fmadd_ps(pv, kv_ld(v, d + 48, bf16), a6);
      a7 = _mm256_fmadd_ps(pv, kv_ld(v, d + 56, bf16), a7);
    }
    _mm256_store_ps(ag + d, a0);
    _mm256_store_ps(ag + d + 8, a1);
    _mm256_store_ps(ag + d + 16, a2);
    _mm256_store_ps(ag + d + 24, a3);
    _mm256_store_ps(ag + d + 32, a4);
    _mm256_store_ps(ag + d + 40, a5);
    _mm256_store_ps(ag + d + 48, a6);
    _mm256_store_ps(ag + d + 56, a7);
  }
  for (; d + 32 <= D; d += 32) {
    __m256 a0 = _mm256_mul_ps(_mm256_load_ps(ag + d), cv);
    __m256 a1 = _mm256_mul_ps(_mm256_load_ps(ag + d + 8), cv);
    __m256 a2 = _mm256_mul_ps(_mm256_load_ps(ag + d + 16), cv);
    __m256 a3 = _mm256_mul_ps(_mm256_load_ps(ag + d + 24), cv);
    for (int n = 0; n < n_vis; n++) {
      __m256 pv = _mm256_set1_ps(pg[vj[n]]);
      a0 = _mm256_fmadd_ps(pv, kv_ld(vp[n], d, bf16), a0);
      a1 = _mm256_fmadd_ps(pv, kv_ld(vp[n], d + 8, bf16), a1);
      a2 = _mm256_fmadd_ps(pv, kv_ld(vp[n], d + 16, bf16), a2);
      a3 = _mm256_fmadd_ps(pv, kv_ld(vp[n], d + 24, bf16), a3);
    }
    _mm256_store_ps(ag + d, a0);
    _mm256_store_ps(ag + d + 8, a1);
    _mm256_store_ps(ag + d + 16, a2);
    _mm256_store_ps(ag + d + 24, a3);
  }
  for (; d < D; d += 8) {
    __m256 a0 = _mm256_mul_ps(_mm256_load_ps(ag + d), cv);
    for (int n = 0; n < n_vis; n++)
      a0 = _mm256_fmadd_ps(_mm256_set1_ps(pg[vj[n]]), kv_ld(vp[n], d, bf16), a0);
    _mm256_store_ps(ag + d, a0);
  }
}

KN_AVX2 static void attn_group(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq,
                               int i, int kvh, int g0, int ng, int bf16) {
  const struct kn_kv_view *view = job->view;
  const int D = view->head_dim;
  const int group = job->n_heads / view->n_kv_heads;
  const int p = seq->pos0 + i;
  const int row = seq->q_begin + i;
  const float *q[KN_ATTN_MAX_GROUP];
  float m[KN_ATTN_MAX_GROUP], l[KN_ATTN_MAX_GROUP];
  _Alignas(32) float s[KN_ATTN_MAX_GROUP][KN_ATTN_BLOCK];
  _Alignas(32) float acc[KN_ATTN_MAX_GROUP][KN_MAX_HEAD_DIM];
  int lo, hi;
  kn_cpu_attn_range(seq, job->window, p, &lo, &hi);
  for (int g = 0; g < ng; g++) {
    q[g] = job->q + (ptrdiff_t)row * job->ldq + (ptrdiff_t)(kvh * group + g0 + g) * D;
    m[g] = -INFINITY;
    l[g] = 0.0f;
    for (int d = 0; d < D; d += 8)
      _mm256_store_ps(&acc[g][d], _mm256_setzero_ps());
  }

  for (int b = lo - lo % KN_ATTN_BLOCK; b <= hi; b += KN_ATTN_BLOCK) {
    const void *vp[KN_ATTN_BLOCK]; /* V of the visible keys of the block, in order */
    int vj[KN_ATTN_BLOCK], n_vis = 0;
    for (int jj = 0; jj < KN_ATTN_BLOCK; jj++) {
      int j = b + jj;
      if (j < lo || j > hi || !kn_cpu_attn_visible(seq, job->window, p, j)) {
        for (int g = 0; g < ng; g++)
          s[g][jj] = -INFINITY;
        continue;
      }
      vp[n_vis] = kn_cpu_kv_addr(view, seq, j, kvh, 1);
      vj[n_vis++] = jj;
      const void *k = kn_cpu_kv_addr(view, seq, j, kvh, 0);
      for (int g = 0; g < ng; g++) {
        float sc = dot_qk(q[g], k, D, bf16) * job->scale;
        if (job->softcap > 0.0f) sc = (float)(tanh((double)sc / job->softcap) * job->softcap);
        s[g][jj] = sc;
      }
    }
    if (!n_vis) continue;
    for (int g = 0; g < ng; g++)
      update_block(s[g], vp, vj, n_vis, &m[g], &l[g], acc[g], D, bf16);
  }

  for (int g = 0; g < ng; g++) {
    float *out = job->out + (ptrdiff_t)row * job->ldo + (ptrdiff_t)(kvh * group + g0 + g) * D;
    __m256 lv = _mm256_set1_ps(l[g]);
    for (int d = 0; d < D; d += 8)
      _mm256_storeu_ps(out + d, _mm256_div_ps(_mm256_load_ps(&acc[g][d]), lv));
  }
}

/* Rows i0 .. i0 + nr - 1 of seq that all see exactly keys [0, hi] (rows of an
 * image's bidirectional range, kn_cpu_attn_tile_ok): block by block, every
 * row's scores and update run while the block's K and V are in L1, instead of
 * each row streaming the whole key range. Each row's arithmetic is the one
 * attn_group does for it (same scores, same block order, same updates), so the
 * bits do not depend on the tiling. */
KN_AVX2 static void attn_tile(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq,
                              int i0, int nr, int hi, int kvh, int g, int bf16) {
  const struct kn_kv_view *view = job->view;
  const int D = view->head_dim;
  const int group = job->n_heads / view->n_kv_heads;
  const float *q[KN_ATTN_TILE];
  float m[KN_ATTN_TILE], l[KN_ATTN_TILE];
  _Alignas(32) float s[KN_ATTN_BLOCK];
  _Alignas(32) float acc[KN_ATTN_TILE][KN_MAX_HEAD_DIM];
  for (int r = 0; r < nr; r++) {
    q[r] = job->q + (ptrdiff_t)(seq->q_begin + i0 + r) * job->ldq + (ptrdiff_t)(kvh * group + g) * D;
    m[r] = -INFINITY;
    l[r] = 0.0f;
    for (int d = 0; d < D; d += 8)
      _mm256_store_ps(&acc[r][d], _mm256_setzero_ps());
  }
  for (int b = 0; b <= hi; b += KN_ATTN_BLOCK) {
    const void *kp[KN_ATTN_BLOCK], *vp[KN_ATTN_BLOCK];
    int vj[KN_ATTN_BLOCK], n_vis = 0;
    for (int jj = 0; jj < KN_ATTN_BLOCK && b + jj <= hi; jj++) {
      kp[n_vis] = kn_cpu_kv_addr(view, seq, b + jj, kvh, 0);
      vp[n_vis] = kn_cpu_kv_addr(view, seq, b + jj, kvh, 1);
      vj[n_vis] = jj;
      n_vis++;
    }
    for (int r = 0; r < nr; r++) {
      for (int jj = 0; jj < KN_ATTN_BLOCK; jj++) {
        if (jj >= n_vis) {
          s[jj] = -INFINITY;
          continue;
        }
        float sc = dot_qk(q[r], kp[jj], D, bf16) * job->scale;
        if (job->softcap > 0.0f) sc = (float)(tanh((double)sc / job->softcap) * job->softcap);
        s[jj] = sc;
      }
      update_block(s, vp, vj, n_vis, &m[r], &l[r], acc[r], D, bf16);
    }
  }
  for (int r = 0; r < nr; r++) {
    float *out = job->out + (ptrdiff_t)(seq->q_begin + i0 + r) * job->ldo +
                 (ptrdiff_t)(kvh * group + g) * D;
    __m256 lv = _mm256_set1_ps(l[r]);
    for (int d = 0; d < D; d += 8)
      _mm256_storeu_ps(out + d, _mm256_div_ps(_mm256_load_ps(&acc[r][d]), lv));
  }
}

void kn_cpu_attn_avx2(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq, int i,
                      int kvh, int g0, int ng);
void kn_cpu_attn_tile_avx2(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq,
                           int i0, int nr, int hi, int kvh, int g0, int ng);

void kn_cpu_attn_tile_avx2(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq,
                           int i0, int nr, int hi, int kvh, int g0, int ng) {
  if (job->view->head_dim & 7) { /* the reference kernel, row by row */
    for (int r = 0; r < nr; r++)
      kn_cpu_attn_ref(job, seq, i0 + r, kvh, g0, ng);
    return;
  }
  const int bf16 = job->view->dtype == KN_DTYPE_BF16;
  for (int g = g0; g < g0 + ng; g++)
    if (bf16)
      attn_tile(job, seq, i0, nr, hi, kvh, g, 1);
    else
      attn_tile(job, seq, i0, nr, hi, kvh, g, 0);
}

void kn_cpu_attn_avx2(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq, int i,
                      int kvh, int g0, int ng) {
  const struct kn_kv_view *view = job->view;
  if (view->head_dim & 7) {
    kn_cpu_attn_ref(job, seq, i, kvh, g0, ng);
    return;
  }
  const int bf16 = view->dtype == KN_DTYPE_BF16;
  for (int g = g0; g < g0 + ng; g += KN_ATTN_MAX_GROUP) {
    int n = g0 + ng - g < KN_ATTN_MAX_GROUP ? g0 + ng - g : KN_ATTN_MAX_GROUP;
    if (bf16)
      attn_group(job, seq, i, kvh, g, n, 1);
    else
      attn_group(job, seq, i, kvh, g, n, 0);
  }
}
