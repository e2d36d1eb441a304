/* wk-draft.c — one step of the Gemma 4 MTP assistant (draft model) for a
 * batch of sequences, reading the target's embedding and KV pages (see
 * wk-model.h and MODELS.md). */
#include <stdio.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "worker/wk-model-impl.h"
#include "worker/wk-model.h"

#define K(call)                                                                                    \
  do {                                                                                             \
    int rc_ = (call);                                                                              \
    if (rc_) return cm_fail(err, errlen, rc_, "draft: %s failed: %s", #call, cm_strerror(rc_));    \
  } while (0)

int wk_draft_load(const char *dir, struct wk_model *target, const struct wk_model_opts *opts,
                  struct wk_model **out, char *err, size_t errlen) {
  if (!target) return cm_fail(err, errlen, CM_ERR_INVAL, "%s: a draft model needs its target", dir);
  return wk_model_load_as(dir, target->be, opts, target, out, err, errlen);
}

/* The k largest of v[0..n) by one pass with insertion into out[0..k), largest
 * first, equal values in index order, NaN never taken: the order the
 * selection below makes. Returns how many were found. */
static int top_k_in_order(const float *v, int n, int k, int *out) {
  int have = 0;
  for (int i = 0; i < n; i++) {
    float x = v[i];
    if (x != x) continue;
    if (have == k && !(x > v[out[have - 1]])) continue;
    int j = have < k ? have++ : have - 1; /* full: the smallest drops out */
    while (j > 0 && x > v[out[j - 1]]) {
      out[j] = out[j - 1];
      j--;
    }
    out[j] = i;
  }
  return have;
}

/* Token of row t with ordered embeddings: the top centroid_top_k centroids
 * of d (ties: lower index), their candidate ids, argmax of d . embed over
 * them (first candidate on ties). */
static int ordered_token(struct wk_model *m, const float *d, int32_t *tok, char *err,
                         size_t errlen) {
  const struct md_config *c = &m->cfg;
  struct kn_backend *be = m->be;
  int C = c->num_centroids, k = c->centroid_top_k, per = c->vocab / C, h = c->hidden;
  K(wk_linear(m, m->cent, C, d, h, &m->centroids, 1));
  K(kn_download(be, m->host_cent, m->cent, sizeof(float) * (size_t)C));
  int n = 0;
  enum { FAST_K = 64 };
  if (k <= FAST_K) {
    int top[FAST_K], found = top_k_in_order(m->host_cent, C, k, top);
    for (int j = 0; j < found; j++) {
      memcpy(m->cand + n, m->token_ordering + (size_t)top[j] * per, sizeof(int32_t) * (size_t)per);
      n += per;
    }
    k = 0; /* done: the loop below is for larger k */
  }
  for (int j = 0; j < k; j++) { /* selection of the k largest, in order */
    int best = -1;
    for (int i = 0; i < C; i++) {
      float v = m->host_cent[i];
      if (v != v) continue; /* NaN: never chosen */
      if (best < 0 || v > m->host_cent[best]) best = i;
    }
    if (best < 0) break;
    memcpy(m->cand + n, m->token_ordering + (size_t)best * per, sizeof(int32_t) * (size_t)per);
    n += per;
    m->host_cent[best] = __builtin_nanf(""); /* chosen: excluded from later rounds */
  }
  if (!n) return cm_fail(err, errlen, CM_ERR_RANGE, "draft: centroid logits are all NaN");
  K(kn_matmul_rows(be, m->cand_logits, n, d, h, m->lm_head.p, m->lm_head.dt, c->vocab, h, m->cand,
                   n, 1));
  int32_t j;
  K(kn_argmax(be, &j, NULL, m->cand_logits, n, 1, n));
  *tok = m->cand[j];
  return 0;
}

int wk_draft_step(struct wk_model *m, const struct wk_draft_input *in, int n, int32_t *tokens_out,
                  float *h_out, float *logits, char *err, size_t errlen) {
  if (!m->target) return cm_fail(err, errlen, CM_ERR_INVAL, "draft: not a draft model");
  if (n < 1 || n > m->max_seqs || n > m->max_T || !in || !tokens_out || !h_out)
    return cm_fail(err, errlen, CM_ERR_INVAL, "draft: bad batch of %d sequences", n);
  const struct md_config *c = &m->cfg;
  const struct wk_model *t = m->target;
  struct kn_backend *be = m->be;
  int h = c->hidden, B = c->backbone_hidden, V = c->vocab;
  for (int s = 0; s < n; s++) {
    struct wk_seq_input *q = &m->dseqs[s];
    memset(q, 0, sizeof(*q));
    q->tokens = &in[s].token;
    q->n_tokens = 1;
    q->pos0 = in[s].pos;
    q->n_out = 1;
    for (int g = 0; g < m->kv.n_groups; g++) {
      q->block_tables[g] = in[s].block_tables[g];
      q->n_blocks[g] = in[s].n_blocks[g];
    }
    if (!in[s].h_in) return cm_fail(err, errlen, CM_ERR_INVAL, "draft: sequence %d has no h_in", s);
  }
  struct wk_batch b = {.seqs = m->dseqs, .n_seqs = n};
  int R = 0, T = wk_fw_prepare(m, &b, &R, err, errlen);
  if (T < 0) return T;
  CM_ASSERT(T == n && R == n);
  /* x = pre_projection([target_embed(tok) * sqrt(B), h_in]) */
  if (m->plan.world == 1) {
    K(kn_embed(be, m->cat, 2 * B, t->embed.p, t->embed.dt, t->embed.rows, B, m->ids, T,
               t->embed_scale));
  } else { /* the target's vocab-parallel embedding: contiguous rows, then into cat */
    K(wk_embed_tokens(m, m->hout, &t->embed, t->embed_scale, T));
    K(kn_copy_rows(be, m->cat, 2 * B, m->hout, B, T, B));
  }
  for (int s = 0; s < n; s++)
    K(kn_upload(be, m->cat + (size_t)s * 2 * B + B, in[s].h_in, sizeof(float) * (size_t)B));
  K(wk_linear(m, m->x, h, m->cat, 2 * B, &m->pre_proj, T));
  for (int layer = 0; layer < c->n_layers; layer++) {
    int rc = wk_fw_run_layer(m, layer, T, n, layer > 0, err, errlen);
    if (rc) return rc;
  }
  /* d = norm(x); h_out = post_projection(d) */
  K(kn_rmsnorm(be, m->h, h, m->x, h, T, h, m->final_norm, KN_DTYPE_F32, (float)c->eps,
               m->norm_mode));
  K(wk_linear(m, m->hout, B, m->h, h, &m->post_proj, T));
  K(kn_download(be, h_out, m->hout, sizeof(float) * (size_t)T * B));
  int some = 0; /* rows that asked for their logits */
  for (int s = 0; s < n; s++)
    some |= in[s].logits != NULL;
  for (int start = 0; start < T && (logits || some || !c->use_ordered_embeddings);
       start += m->max_out) {
    int rows = CM_MIN(m->max_out, T - start), dense = logits != NULL;
    for (int s = start; s < start + rows; s++)
      dense |= in[s].logits != NULL;
    const float *hs = m->h + (size_t)start * h;
    if (!dense) { /* tokens only: the argmax straight from the head */
      if (!c->use_ordered_embeddings)
        K(kn_matmul_argmax(be, tokens_out + start, NULL, hs, h, m->lm_head.p, m->lm_head.dt, rows,
                           V, h, 0.0f, m->logits));
      continue;
    }
    K(wk_linear(m, m->logits, V, hs, h, &m->lm_head, rows));
    if (logits)
      K(kn_download(be, logits + (size_t)start * V, m->logits, sizeof(float) * (size_t)rows * V));
    for (int s = start; s < start + rows; s++)
      if (in[s].logits)
        K(kn_download(be, in[s].logits, m->logits + (size_t)(s - start) * V,
                      sizeof(float) * (size_t)V));
    if (!c->use_ordered_embeddings)
      K(kn_argmax(be, tokens_out + start, NULL, m->logits, V, rows, V));
  }
  if (c->use_ordered_embeddings)
    for (int s = 0; s < T; s++) {
      int rc = ordered_token(m, m->h + (size_t)s * h, &tokens_out[s], err, errlen);
      if (rc) return rc;
    }
  return kn_sync(be);
}
