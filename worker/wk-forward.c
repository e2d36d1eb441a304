/* wk-forward.c — the Gemma 3 / Gemma 4 forward pass over a ragged batch,
 * written against the kernel backend table (kernels/kn-backend.h).
 *
 * Per layer (transformers' Gemma3/Gemma4 DecoderLayer):
 *   h = input_norm(x); q = RoPE(q_norm(h Wq))
 *   storing layers: k = RoPE(k_norm(h Wk)); v = h Wv (or raw h Wk with
 *     attention_k_eq_v); Gemma 4: v = v_norm(v) (weightless); write K/V pages
 *   attn over the pages of the layer it reads (its own, or its KV source's)
 *   x += post_attn_norm(attn Wo)
 *   m = down(gelu_tanh(gate(h')) * up(h')) with h' = pre_ffn_norm(x)
 *   MoE: m = post_ffn_norm_1(m) + post_ffn_norm_2(experts(pre_ffn_norm_2(x)))
 *        routed by softmax top-k of (norm(x) * scale * H^-0.5) Wr
 *   x += post_ffn_norm(m)
 *   PLE: x += post_ple_norm(ple_proj(gelu_tanh(ple_gate(x)) * ple[:, i]))
 *   x *= layer_scalar
 * then final norm, tied head, optional final softcap.
 *
 * Written with the fused ops (kn-backend.h) where they apply: Q, K, V as one
 * kn_matmul_n; the q/k norms, RoPE, v norm and KV write as one kn_qkv_prep;
 * gate and up with their GELU-multiply as one kn_matmul_glu; each residual add
 * with the norm before it, the layer scalar and the next block's norm (the
 * next layer's input norm included) as one kn_add_norm. A backend without a
 * fused op runs the unfused sequence, with the same results. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "worker/wk-model-impl.h"
#include "worker/wk-model.h"
#include "worker/wk-tp-sample.h"

/* Runs a kernel call; on failure reports the op, the layer and the code. */
#define K(call)                                                                                    \
  do {                                                                                             \
    int rc_ = (call);                                                                              \
    if (rc_)                                                                                       \
      return cm_fail(err, errlen, rc_, "forward: layer %d: %s failed: %s", layer, #call,           \
                     cm_strerror(rc_));                                                            \
  } while (0)

static struct kn_kv_view layer_view(const struct wk_model *m, int layer) {
  const struct wk_kv_spec *kv = &m->kv;
  const struct wk_kv_group *G = &kv->groups[kv->layer_group[layer]];
  struct kn_kv_view v = {
      .pool = m->pool,
      .page_bytes = kv->page_bytes,
      .n_pages = m->n_pages,
      .k_off = kv->layer_k_off[layer],
      .v_off = kv->layer_v_off[layer],
      .block_tokens = G->block_tokens,
      .n_kv_heads = G->n_kv_heads,
      .head_dim = G->head_dim,
      .dtype = kv->dtype,
  };
  /* an fp8 cache with the checkpoint's scales: those of the layer that stores it (an
   * assistant's layers hold their target layer's) */
  int from = m->cfg.layers[layer].kv_source;
  const struct wk_layer_w *src = &m->layers[from >= 0 ? from : layer];
  if (kv->dtype == KN_DTYPE_F8E4M3) {
    v.k_scale = src->k_scale;
    v.v_scale = src->v_scale;
  }
  return v;
}

int wk_linear(struct wk_model *m, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
              const struct wk_w *w, int T) {
  if (w->dt == KN_DTYPE_F8E4M3)
    return kn_matmul_fp8(m->be, out, ldo, in, ldi, w->p, w->scale, T, w->rows, w->cols, 0);
  return kn_matmul(m->be, out, ldo, in, ldi, w->p, w->dt, T, w->rows, w->cols, 0);
}

/* Matrix e of a stack of expert matrices, as a weight of its own. */
static struct wk_w expert_mat(const struct wk_w *w, int e) {
  struct wk_w x = *w;
  x.p = (const char *)w->p + (size_t)e * (size_t)w->rows * kn_row_bytes(w->dt, (size_t)w->cols);
  x.n_mat = 1;
  return x;
}

/* Checks the batch and fills ids, positions, slot mappings and the
 * per-group attention descriptors. Returns T (tokens) or a negative cm_err. */
int wk_fw_prepare(struct wk_model *m, const struct wk_batch *b, int *n_out, char *err,
                  size_t errlen) {
  const struct md_config *c = &m->cfg;
  if (!b || b->n_seqs < 1 || !b->seqs)
    return cm_fail(err, errlen, CM_ERR_INVAL, "forward: empty batch");
  if (b->n_seqs > m->max_seqs)
    return cm_fail(err, errlen, CM_ERR_TOOBIG, "forward: %d sequences (at most %d)", b->n_seqs,
                   m->max_seqs);
  /* outputs first, then the scored rows: their places in out_rows */
  int T = 0, R = 0, R_all = 0, S = 0;
  for (int s = 0; s < b->n_seqs; s++) {
    const struct wk_seq_input *q = &b->seqs[s];
    if (q->n_tokens < 1 || !q->tokens || q->pos0 < 0 || q->pos0 > (1 << 30) || q->n_out < 0 ||
        q->n_score < 0 || q->n_out > q->n_tokens || q->n_score > q->n_tokens - q->n_out)
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "forward: sequence %d: bad token count, position or output count", s);
    if (q->n_score && (!q->score_ids || !b->scored || b->score_top < 0 ||
                       b->score_top > KN_SAMPLE_MAX_LOGPROBS || q->pad))
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "forward: sequence %d: scored rows need their ids, a place for their "
                     "results and 0..%d top entries",
                     s, KN_SAMPLE_MAX_LOGPROBS);
    R_all += q->n_out;
  }
  for (int s = 0; s < b->n_seqs; s++) {
    const struct wk_seq_input *q = &b->seqs[s];
    if (q->n_tokens > m->max_T - T)
      return cm_fail(err, errlen, CM_ERR_TOOBIG, "forward: more than %d tokens in one batch",
                     m->max_T);
    int prev = b->prev_rows && !q->pad ? b->prev_rows[s] : -1;
    if (prev >= 0) {
      const int32_t *kept;
      if (!m->ids_dev)
        return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                       "forward: sequence %d: ids kept on the backend, which this model does not "
                       "take (tensor parallelism, or a backend whose id ops failed their check)",
                       s);
      if (prev >= kn_kept_ids(m->be, &kept))
        return cm_fail(err, errlen, CM_ERR_RANGE,
                       "forward: sequence %d: no kept id in row %d of the latest sampling", s,
                       prev);
    }
    for (int j = 0; j < q->n_tokens; j++) {
      int32_t id = prev >= 0 && j == 0 ? 0 : q->tokens[j]; /* 0: the kept id stands in */
      m->ids_map[T + j] = prev >= 0 && j == 0 ? prev : -1;
      if (id < 0 || id >= c->vocab || (c->ple_dim && id >= c->ple_vocab))
        return cm_fail(err, errlen, CM_ERR_RANGE,
                       "forward: sequence %d: token id %d outside the vocabulary (%d)", s, id,
                       c->vocab);
      m->ids[T + j] = id;
      m->pos[T + j] = q->pos0 + j;
    }
    if (q->n_bidir < 0 || (q->n_bidir > 0 && !q->bidir))
      return cm_fail(err, errlen, CM_ERR_INVAL, "forward: sequence %d: bad bidirectional ranges",
                     s);
    for (int r = 0; r < q->n_bidir; r++) {
      int b0 = q->bidir[2 * r], b1 = q->bidir[2 * r + 1];
      int meets = b0 < q->pos0 + q->n_tokens && b1 > q->pos0;
      if (b0 < 0 || b1 <= b0 || (meets && b1 > q->pos0 + q->n_tokens))
        return cm_fail(err, errlen, CM_ERR_INVAL,
                       "forward: sequence %d: bidirectional range [%d, %d) must end inside the "
                       "step's tokens [%d, %d)",
                       s, b0, b1, q->pos0, q->pos0 + q->n_tokens);
    }
    if (q->n_embeds < 0 || (q->n_embeds > 0 && !q->embeds))
      return cm_fail(err, errlen, CM_ERR_INVAL, "forward: sequence %d: bad embedding rows", s);
    for (int r = 0; r < q->n_embeds; r++)
      if (q->embeds[r].pos < 0 || q->embeds[r].n < 1 || !q->embeds[r].rows)
        return cm_fail(err, errlen, CM_ERR_INVAL, "forward: sequence %d: bad embedding rows %d", s,
                       r);
    /* transformers' Gemma 4 looks up a soft token's per-layer embedding (and its
     * token embedding, which the rows replace) as the pad token's
     * (Gemma4Model.forward: llm_input_ids[multimodal_mask] = pad_token_id) */
    for (int r = 0; c->ple_dim && r < q->n_embeds; r++) {
      int lo = CM_MAX(q->embeds[r].pos, q->pos0);
      int hi = CM_MIN(q->embeds[r].pos + q->embeds[r].n, q->pos0 + q->n_tokens);
      for (int p = lo; p < hi; p++)
        m->ids[T + p - q->pos0] = c->pad_id;
    }
    if (q->pad && (q->n_out != 0 || q->n_embeds || q->n_bidir))
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "forward: sequence %d: a padding row has no output, images or ranges", s);
    for (int j = 0; j < q->n_out; j++)
      m->out_rows[R + j] = T + q->n_tokens - q->n_out + j;
    for (int j = 0; j < q->n_score; j++) {
      int32_t id = q->score_ids[j];
      if (id < 0 || id >= c->vocab)
        return cm_fail(err, errlen, CM_ERR_RANGE,
                       "forward: sequence %d: scored token id %d outside the vocabulary (%d)", s,
                       id, c->vocab);
      m->out_rows[R_all + S + j] = T + q->n_tokens - q->n_out - q->n_score + j;
      m->score_ids[S + j] = id;
    }
    for (int g = 0; g < m->kv.n_groups; g++) {
      const struct wk_kv_group *G = &m->kv.groups[g];
      int32_t *slots = m->slots + (size_t)g * (size_t)m->max_T;
      for (int j = 0; j < q->n_tokens; j++) {
        int p = q->pos0 + j, blk = p / G->block_tokens;
        int32_t page = blk < q->n_blocks[g] && q->block_tables[g] ? q->block_tables[g][blk] : -1;
        if (page < 0 || page >= m->n_pages)
          return cm_fail(err, errlen, CM_ERR_RANGE,
                         "forward: sequence %d: KV group %d has no valid block for position %d", s,
                         g, p);
        slots[T + j] = q->pad ? -1 : page * G->block_tokens + p % G->block_tokens;
      }
      struct kn_attn_seq *a = &m->aseq[(size_t)g * (size_t)m->max_seqs + (size_t)s];
      a->q_begin = T;
      a->n_q = q->n_tokens;
      a->pos0 = q->pos0;
      a->block_table = q->block_tables[g];
      a->n_blocks = q->n_blocks[g];
      /* which layers see an image whole: md_image_bidir, the one switch */
      int bd = q->n_bidir && md_image_bidir(c, G->kind);
      a->bidir = bd ? q->bidir : NULL;
      a->n_bidir = bd ? q->n_bidir : 0;
    }
    T += q->n_tokens;
    R += q->n_out;
    S += q->n_score;
  }
  int rc = wk_lora_runs(m, b, err, errlen);
  if (rc) return rc;
  *n_out = R;
  m->n_scored = S;
  return T;
}

/* MoE block for T rows: m->o2 = experts(pre_ffn_norm_2(x)) with top-k routing
 * on norm(x). Grouped by expert: the rows routed to expert e are gathered and
 * run through its two matrices as one matmul each (a step reads each chosen
 * expert's weights once, not once per token), then scaled by their routing
 * weights and added to their tokens' rows. Experts go in ascending order, so
 * each token sums its experts in ascending expert order, as one token at a time
 * would. */
static int moe_block(struct wk_model *m, const struct wk_layer_w *w, int T, int layer, char *err,
                     size_t errlen) {
  const struct md_config *c = &m->cfg;
  struct kn_backend *be = m->be;
  int H = c->hidden, E = c->n_experts, I = c->moe_ffn, k = c->top_k_experts;
  float eps = (float)c->eps;
  K(kn_rmsnorm(be, m->h, H, m->x, H, T, H, w->router_scale, KN_DTYPE_F32, eps, KN_NORM_MUL_W));
  K(kn_scale(be, m->h, m->h, (float)(1.0 / sqrt((double)H)), (size_t)T * H));
  K(wk_linear(m, m->router_logits, E, m->h, H, &w->router, T));
  K(kn_router_topk(be, m->moe_ids, m->moe_w, m->router_logits, E, T, E, k, w->expert_scale));
  K(kn_rmsnorm(be, m->h, H, m->x, H, T, H, w->pre_ffn_norm2, KN_DTYPE_F32, eps, m->norm_mode));
  K(kn_memset(be, m->o2, 0, sizeof(float) * (size_t)T * H));
  /* bucket the (token, weight) pairs by expert: counting sort, tokens ascending */
  int *count = m->ex_count; /* [E + 1] */
  memset(count, 0, sizeof(int) * (size_t)(E + 1));
  for (int i = 0; i < T * k; i++) {
    int e = m->moe_ids[i];
    if (e < 0 || e >= E) return cm_fail(err, errlen, CM_ERR_RANGE, "forward: bad expert %d", e);
    count[e + 1]++;
  }
  for (int e = 0; e < E; e++)
    count[e + 1] += count[e];
  for (int i = 0; i < T * k; i++) {
    int at = count[m->moe_ids[i]]++;
    m->ex_tok[at] = i / k;
    m->ex_wt[at] = m->moe_w[i];
  }
  for (int e = E - 1; e >= 0; e--) /* back to each bucket's start */
    count[e + 1] = count[e];
  count[0] = 0;
  for (int e = 0; e < E; e++) {
    int n = count[e + 1] - count[e];
    if (!n) continue;
    const int32_t *tok = m->ex_tok + count[e];
    const float *wt = m->ex_wt + count[e];
    struct wk_w gu = expert_mat(&w->experts_gate_up, e), dn = expert_mat(&w->experts_down, e);
    K(kn_embed(be, m->ex_in, H, m->h, KN_DTYPE_F32, T, H, tok, n, 1.0f)); /* gather */
    K(wk_linear(m, m->ex_h, 2 * I, m->ex_in, H, &gu, n));
    K(kn_gelu_mul(be, m->ex_h, 2 * I, m->ex_h, 2 * I, m->ex_h + I, 2 * I, n, I));
    K(wk_linear(m, m->ex_y, H, m->ex_h, 2 * I, &dn, n));
    for (int j = 0; j < n; j++) {
      float *y = m->ex_y + (size_t)j * H, *o = m->o2 + (size_t)tok[j] * H;
      K(kn_scale(be, y, y, wt[j], (size_t)H));
      K(kn_add(be, o, o, y, (size_t)H));
    }
  }
  return 0;
}

/* Whether a layer's Q, K and V (gate and up) can go through one kn_matmul_n
 * (kn_matmul_glu): the same dtype and input width (FP8 with each weight's
 * per-feature scales). */
static int same_kind(const struct wk_w *a, const struct wk_w *b) {
  return a->dt == b->dt && a->cols == b->cols;
}

/* q = h Wq, and on a layer that stores K/V, k = h Wk and v = h Wv (or the raw k
 * with attention_k_eq_v): one kn_matmul_n where the dtypes agree. */
static int project_qkv(struct wk_model *m, const struct wk_layer_w *w, const struct md_layer_cfg *l,
                       int T, int layer, char *err, size_t errlen) {
  int H = m->cfg.hidden, qd = m->cfg.n_heads * l->head_dim, kvd = l->n_kv_heads * l->head_dim;
  if (l->kv_shared) {
    K(wk_linear(m, m->q, qd, m->h, H, &w->wq, T));
    if (m->n_lora_run) K(wk_lora_apply(m, layer, MD_LORA_Q, m->q, qd, m->h, H));
    return 0;
  }
  int with_v = !l->k_eq_v;
  if (same_kind(&w->wq, &w->wk) && (!with_v || same_kind(&w->wq, &w->wv))) {
    struct kn_mm_part parts[3] = {{m->q, qd, w->wq.p, w->wq.rows, w->wq.scale},
                                  {m->k, kvd, w->wk.p, w->wk.rows, w->wk.scale},
                                  {m->v, kvd, with_v ? w->wv.p : NULL, w->wv.rows, w->wv.scale}};
    K(kn_matmul_n(m->be, m->h, H, w->wq.dt, T, H, parts, 2 + with_v));
  } else {
    K(wk_linear(m, m->q, qd, m->h, H, &w->wq, T));
    K(wk_linear(m, m->k, kvd, m->h, H, &w->wk, T));
    if (with_v) K(wk_linear(m, m->v, kvd, m->h, H, &w->wv, T));
  }
  if (m->n_lora_run) {
    K(wk_lora_apply(m, layer, MD_LORA_Q, m->q, qd, m->h, H));
    K(wk_lora_apply(m, layer, MD_LORA_K, m->k, kvd, m->h, H));
    if (with_v) K(wk_lora_apply(m, layer, MD_LORA_V, m->v, kvd, m->h, H));
  }
  if (!with_v) K(kn_copy_rows(m->be, m->v, kvd, m->k, kvd, T, kvd));
  return 0;
}

int wk_fw_run_layer(struct wk_model *m, int layer, int T, int n_seqs, int h_ready, char *err,
                    size_t errlen) {
  const struct md_config *c = &m->cfg;
  const struct md_layer_cfg *l = &c->layers[layer];
  const struct wk_layer_w *w = &m->layers[layer];
  struct kn_backend *be = m->be;
  int H = c->hidden, nh = c->n_heads, D = l->head_dim, qd = nh * D;
  int kvd = l->n_kv_heads * D, F = l->ffn_dim;
  float eps = (float)c->eps;
  enum kn_norm_mode nm = m->norm_mode;
  size_t TH = (size_t)T * H;
  int tp = m->plan.world > 1;
  /* the next layer's normed input, made while x is in cache by this layer's last add */
  const float *next_norm = layer + 1 < c->n_layers ? m->layers[layer + 1].in_norm : NULL;
  float scale = c->arch != MD_ARCH_GEMMA3 ? w->layer_scalar : 1.0f;

  /* attention */
  if (!h_ready) K(kn_rmsnorm(be, m->h, H, m->x, H, T, H, w->in_norm, KN_DTYPE_F32, eps, nm));
  int rc = project_qkv(m, w, l, T, layer, err, errlen);
  if (rc) return rc;
  int g = m->kv.layer_group[layer];
  struct kn_kv_view view = layer_view(m, layer);
  struct kn_qkv_prep_args prep = {
      .q = m->q,
      .ldq = qd,
      .n_heads = nh,
      .k = l->kv_shared ? NULL : m->k,
      .v = l->kv_shared ? NULL : m->v,
      .ldk = kvd,
      .ldv = kvd,
      .q_w = w->q_norm,
      .k_w = w->k_norm,
      .wdt = KN_DTYPE_F32,
      .eps = eps,
      .mode = nm,
      .v_norm = c->arch != MD_ARCH_GEMMA3,
      .pos = m->pos,
      .inv_freq = m->inv_freq[l->kind],
      .view = &view,
      .slots = m->slots + (size_t)g * (size_t)m->max_T,
  };
  K(kn_qkv_prep(be, &prep, T));
  int window = l->kind == MD_LAYER_SLIDING ? c->sliding_window : 0;
  K(kn_attention(be, m->attn, qd, m->q, qd, &view, m->aseq + (size_t)g * (size_t)m->max_seqs,
                 n_seqs, nh, window, (float)c->attn_scale, (float)c->attn_softcap));
  K(wk_linear(m, m->o, H, m->attn, qd, &w->wo, T));
  if (m->n_lora_run) K(wk_lora_apply(m, layer, MD_LORA_O, m->o, H, m->attn, qd));
  if (tp) K(kn_all_reduce_sum(be, m->o, TH)); /* O is split by input columns */
  K(kn_add_norm(be, m->x, H, m->o, H, m->h, H, T, H, w->post_attn_norm, w->pre_ffn_norm,
                KN_DTYPE_F32, 1.0f, eps, nm));

  /* MLP (+ MoE) */
  /* an adapted gate or up adds its term before the GELU product: not fused then */
  int glu_lora =
      m->n_lora_run && (wk_lora_any(m, layer, MD_LORA_GATE) || wk_lora_any(m, layer, MD_LORA_UP));
  if (same_kind(&w->w_gate, &w->w_up) && !glu_lora) {
    K(kn_matmul_glu(be, m->gate, F, m->h, H, w->w_gate.p, w->w_gate.scale, w->w_up.p, w->w_up.scale,
                    w->w_gate.dt, T, F, H, m->up));
  } else {
    K(wk_linear(m, m->gate, F, m->h, H, &w->w_gate, T));
    K(wk_linear(m, m->up, F, m->h, H, &w->w_up, T));
    if (glu_lora) {
      K(wk_lora_apply(m, layer, MD_LORA_GATE, m->gate, F, m->h, H));
      K(wk_lora_apply(m, layer, MD_LORA_UP, m->up, F, m->h, H));
    }
    K(kn_gelu_mul(be, m->gate, F, m->gate, F, m->up, F, T, F));
  }
  K(wk_linear(m, m->o, H, m->gate, F, &w->w_down, T));
  if (m->n_lora_run) K(wk_lora_apply(m, layer, MD_LORA_DOWN, m->o, H, m->gate, F));
  if (tp) K(kn_all_reduce_sum(be, m->o, TH)); /* down is split by input columns */
  if (c->moe) {
    K(kn_rmsnorm(be, m->o, H, m->o, H, T, H, w->post_ffn_norm1, KN_DTYPE_F32, eps, nm));
    rc = moe_block(m, w, T, layer, err, errlen);
    if (rc) return rc;
    if (tp) K(kn_all_reduce_sum(be, m->o2, TH)); /* each expert's width is split */
    K(kn_rmsnorm(be, m->o2, H, m->o2, H, T, H, w->post_ffn_norm2, KN_DTYPE_F32, eps, nm));
    K(kn_add(be, m->o, m->o, m->o2, TH));
  }
  if (!c->ple_dim) {
    K(kn_add_norm(be, m->x, H, m->o, H, next_norm ? m->h : NULL, H, T, H, w->post_ffn_norm,
                  next_norm, KN_DTYPE_F32, scale, eps, nm));
    return 0;
  }
  K(kn_add_norm(be, m->x, H, m->o, H, NULL, H, T, H, w->post_ffn_norm, NULL, KN_DTYPE_F32, 1.0f,
                eps, nm));

  /* per-layer embeddings */
  int P = c->ple_dim, LP = c->n_layers * P;
  K(wk_linear(m, m->g_small, P, m->x, H, &w->ple_gate, T));
  K(kn_gelu_mul(be, m->g_small, P, m->g_small, P, m->ple + (size_t)layer * P, LP, T, P));
  K(wk_linear(m, m->o2, H, m->g_small, P, &w->ple_proj, T));
  K(kn_add_norm(be, m->x, H, m->o2, H, next_norm ? m->h : NULL, H, T, H, w->ple_post_norm,
                next_norm, KN_DTYPE_F32, scale, eps, nm));
  return 0;
}

int wk_embed_tokens(struct wk_model *m, float *out, const struct wk_w *table, float scale, int T) {
  struct kn_backend *be = m->be;
  const struct wk_shard_plan *p = &m->plan;
  int H = table->cols;
  if (p->world == 1)
    return kn_embed(be, out, H, table->p, table->dt, table->rows, H, m->ids, T, scale);
  for (int t = 0; t < T; t++) {
    int32_t id = m->ids[t] - (int32_t)table->off;
    m->ids_local[t] = id >= 0 && id < table->rows ? id : -1; /* another rank's row */
  }
  int rc = kn_embed(be, out, H, table->p, table->dt, table->rows, H, m->ids_local, T, scale);
  return rc ? rc : kn_all_reduce_sum(be, out, (size_t)T * (size_t)H);
}

/* Every rank's `bytes` of host data side by side: mine goes up to dev_mine, the
 * ranks all-gather into dev_all, and all (host, world * bytes, rank order) comes
 * back down. */
static int gather_host(struct wk_model *m, const void *mine, void *dev_mine, void *dev_all,
                       void *all, size_t bytes) {
  struct kn_backend *be = m->be;
  int rc = kn_upload(be, dev_mine, mine, bytes);
  if (!rc) rc = kn_all_gather(be, dev_mine, bytes, dev_all);
  if (!rc) rc = kn_download(be, all, dev_all, bytes * (size_t)m->plan.world);
  return rc;
}

/* The greedy head of a vocab-parallel rank: every rank's (maximum, argmax) for rows
 * [0, n) gathered, and the first maximum over the ranks in vocabulary order (ranks hold
 * ascending slices), so the token is the one the whole head's argmax would give. A
 * NaN never wins; all-NaN rows give 0, as kn_argmax does. */
static int merge_argmax(struct wk_model *m, int n) {
  int world = m->plan.world;
  struct wk_pair *mine = m->pairs_host, *all = m->pairs_host + m->max_out;
  for (int r = 0; r < n; r++)
    mine[r] = (struct wk_pair){m->head_max[r], m->head_ids[r] + (int32_t)m->lm_head.off};
  int rc = gather_host(m, mine, m->pairs, m->pairs_all, all, sizeof(struct wk_pair) * (size_t)n);
  if (rc) return rc;
  for (int r = 0; r < n; r++) {
    int32_t best = 0;
    float bv = 0.0f;
    int found = 0;
    for (int k = 0; k < world; k++) {
      const struct wk_pair *q = &all[(size_t)k * (size_t)n + (size_t)r];
      if (q->max != q->max) continue;
      if (!found || q->max > bv) {
        best = q->id;
        bv = q->max;
        found = 1;
      }
    }
    m->head_ids[r] = best;
  }
  return 0;
}

/* logits[n, V] from the vocab-parallel head's per-rank [n, V / world] slices. */
static int gather_logits(struct wk_model *m, int n) {
  struct kn_backend *be = m->be;
  int world = m->plan.world, vn = m->lm_head.rows, V = vn * world;
  size_t bytes = sizeof(float) * (size_t)n * (size_t)vn;
  int rc = kn_all_gather(be, m->logits, bytes, m->gathered);
  for (int k = 0; k < world && !rc; k++)
    rc = kn_copy_rows(be, m->logits + (size_t)k * (size_t)vn, V,
                      m->gathered + (size_t)k * (size_t)n * (size_t)vn, vn, n, vn);
  return rc;
}

/* KV-shared fast prefill. The layers from m->first_shared on write no KV, so
 * a row's result there matters only if somebody reads it: the rows with
 * output or a score (out_rows, each sequence's last n_score + n_out). Keeps
 * those rows of x, the positions and the per-layer inputs, renumbers out_rows
 * and the attention descriptors (each sequence's queries become those last
 * tokens; keys still come from every position the earlier layers wrote), and
 * returns the new row count; *n_seqs becomes the sequences that still have
 * rows. Exact: every op after this point is row-wise but attention, which
 * reads the pages. */
static int drop_unread_rows(struct wk_model *m, const struct wk_batch *b, int R, int *n_seqs,
                            char *err, size_t errlen) {
  const struct md_config *c = &m->cfg;
  struct kn_backend *be = m->be;
  int H = c->hidden, layer = m->first_shared;
  size_t LP = (size_t)c->n_layers * (size_t)c->ple_dim;
  int src = 0, dst = 0, kept = 0, o = 0, sc = R - m->n_scored;
  m->n_lora_run = 0; /* the adapters' runs again, over the kept rows */
  for (int s = 0; s < b->n_seqs; s++) {
    const struct wk_seq_input *q = &b->seqs[s];
    int n = q->n_out + q->n_score, from = src + q->n_tokens - n;
    src += q->n_tokens;
    if (!n) continue;
    if (q->lora && !q->pad) wk_lora_push(m, dst, n, q->lora);
    for (int j = 0; j < q->n_score; j++)
      m->out_rows[sc++] = dst + j;
    for (int j = 0; j < q->n_out; j++)
      m->out_rows[o++] = dst + q->n_score + j;
    /* rows only move down (dst < from); overlapping runs go a row at a time, in order */
    for (int r = 0, step = from - dst >= n ? n : 1; from != dst && r < n; r += step) {
      size_t d = (size_t)(dst + r), f = (size_t)(from + r);
      K(kn_copy_rows(be, m->x + d * H, H, m->x + f * H, H, step, H));
      if (LP)
        K(kn_copy_rows(be, m->ple + d * LP, (ptrdiff_t)LP, m->ple + f * LP, (ptrdiff_t)LP, step,
                       (int)LP));
    }
    memmove(m->pos + dst, m->pos + from, sizeof(int32_t) * (size_t)n);
    for (int g = 0; g < m->kv.n_groups; g++) {
      struct kn_attn_seq *a = m->aseq + (size_t)g * (size_t)m->max_seqs;
      a[kept] = a[s];
      a[kept].q_begin = dst;
      a[kept].n_q = n;
      a[kept].pos0 = q->pos0 + q->n_tokens - n;
    }
    dst += n;
    kept++;
  }
  *n_seqs = kept;
  return dst;
}

/* Samples rows [0, n) of a vocab-parallel head from the ranks' candidate
 * records (wk-tp-sample.h) into out[n]. Returns how many rows the records
 * could not decide (m->tp_full[r] = 1 for each; all n when some row's params
 * need the whole distribution, before any exchange), or a negative cm_err.
 * Every rank decides alike: the params are the same on all ranks, and so are
 * the gathered records. */
static int tp_sample(struct wk_model *m, const struct kn_sample_params *p,
                     struct kn_sample_out *out, int n) {
  struct kn_backend *be = m->be;
  int world = m->plan.world, vn = m->lm_head.rows, V = vn * world;
  int fits = 1;
  for (int r = 0; r < n; r++)
    fits &= wk_tp_sample_fits(&p[r], V);
  if (n <= 0) return 0;
  memset(m->tp_full, !fits, (size_t)n);
  if (!fits) return n;
  const float *head = m->logits;
  int rc = 0;
  if (m->head_host) {
    head = m->head_host;
    rc = kn_download(be, m->head_host, m->logits, sizeof(float) * (size_t)n * (size_t)vn);
  }
  struct wk_tp_rec *mine = m->recs_host, *all = m->recs_host + m->max_out;
  for (int r = 0; r < n && !rc; r++)
    wk_tp_sample_local(&mine[r], head + (size_t)r * (size_t)vn, (int32_t)m->lm_head.off, vn, V,
                       &p[r], m->tp_work);
  if (!rc)
    rc = gather_host(m, mine, m->recs, m->recs_all, all, sizeof(struct wk_tp_rec) * (size_t)n);
  int undecided = 0;
  for (int r = 0; r < n && !rc; r++) {
    rc = wk_tp_sample_merge(all, world, n, r, V, &p[r], m->tp_scratch, &out[r]);
    if (rc == 1) {
      m->tp_full[r] = 1;
      undecided++;
      rc = 0;
    }
  }
  return rc ? rc : undecided;
}

/* Whether all n rows sample their argmax (kn_sample_is_argmax). */
static int all_argmax(const struct kn_sample_params *p, int n) {
  for (int r = 0; r < n; r++)
    if (!kn_sample_is_argmax(&p[r])) return 0;
  return 1;
}

/* The greedy head's tokens (m->head_ids) as rows [start, start + n)'s draws. */
static int greedy_out(const struct wk_model *m, const struct wk_batch *b, int start, int n) {
  for (int r = 0; r < n; r++) {
    struct kn_sample_out *o = &b->sampled[start + r];
    o->token = m->head_ids[r];
    o->logprob = 0.0f;
    o->n_top = 0;
  }
  return 0;
}

#define WK_HEAD_MAX_ROWS 512 /* masked greedy rows one head call takes (more: the logits) */

/* Rows that are greedy, some under a structured output's mask: the argmax of what
 * each allows (kn_matmul_argmax_masked), the logits never written. */
static int masked_argmax(const struct kn_sample_params *p, int n) {
  int masks = 0;
  for (int r = 0; r < n; r++) {
    struct kn_sample_params q = p[r];
    masks |= q.allow != NULL;
    q.allow = NULL;
    if (!kn_sample_is_argmax(&q)) return 0;
  }
  return masks;
}

/* Writes the sequences' given embedding rows (images' soft tokens) over the
 * token embeddings of the positions this step runs. */
static int put_embeds(struct wk_model *m, const struct wk_batch *b) {
  int H = m->cfg.hidden;
  for (int s = 0, t0 = 0; s < b->n_seqs; t0 += b->seqs[s].n_tokens, s++) {
    const struct wk_seq_input *q = &b->seqs[s];
    for (int r = 0; r < q->n_embeds; r++) {
      const struct wk_seq_embed *e = &q->embeds[r];
      int lo = CM_MAX(e->pos, q->pos0), hi = CM_MIN(e->pos + e->n, q->pos0 + q->n_tokens);
      if (lo >= hi) continue;
      int rc = kn_upload(m->be, m->x + (size_t)(t0 + lo - q->pos0) * H,
                         e->rows + (size_t)(lo - e->pos) * H, sizeof(float) * (size_t)(hi - lo) * H);
      if (rc) return rc;
    }
  }
  return 0;
}

int wk_fw_trunk(struct wk_model *m, const struct wk_batch *b, int T, int R, int drop, int *n_seqs,
                char *err, size_t errlen) {
  const struct md_config *c = &m->cfg;
  struct kn_backend *be = m->be;
  int H = c->hidden, layer = -1;
  /* one rank: the ids go through the backend (kn_ids_take), where a previous step's
   * sampled ids may stand in for some (wk_batch.prev_rows); every step does it, so a
   * step graph's ops are the same with those rows or without */
  const int32_t *kept = NULL;
  int n_kept = m->ids_dev ? kn_kept_ids(be, &kept) : 0;
  if (m->ids_dev) {
    K(kn_ids_take(be, m->ids_dev, m->ids, kept, n_kept, m->ids_map, T));
    K(kn_embed_dev(be, m->x, H, m->embed.p, m->embed.dt, m->embed.rows, H, m->ids_dev, T,
                   m->embed_scale));
  } else {
    K(wk_embed_tokens(m, m->x, &m->embed, m->embed_scale, T));
  }
  K(put_embeds(m, b));
  if (c->ple_dim) {
    int P = c->ple_dim, LP = c->n_layers * P;
    size_t n = (size_t)T * LP;
    if (m->ids_dev)
      K(kn_embed_dev(be, m->ple_tmp, LP, m->ple_embed.p, m->ple_embed.dt, c->ple_vocab, LP,
                     m->ids_dev, T, m->ple_embed_scale));
    else
      K(kn_embed(be, m->ple_tmp, LP, m->ple_embed.p, m->ple_embed.dt, c->ple_vocab, LP, m->ids, T,
                 m->ple_embed_scale));
    K(wk_linear(m, m->ple, LP, m->x, H, &m->ple_model_proj, T));
    K(kn_scale(be, m->ple, m->ple, (float)(1.0 / sqrt((double)H)), n));
    K(kn_rmsnorm(be, m->ple, P, m->ple, P, T * c->n_layers, P, m->ple_proj_norm, KN_DTYPE_F32,
                 (float)c->eps, m->norm_mode));
    K(kn_add(be, m->ple, m->ple, m->ple_tmp, n));
    K(kn_scale(be, m->ple, m->ple, (float)M_SQRT1_2, n));
  }
  *n_seqs = b->n_seqs;
  for (layer = 0; layer < c->n_layers; layer++) {
    int h_ready = layer > 0; /* each layer leaves the next one's normed input in m->h */
    if (drop && layer == m->first_shared && m->fast_prefill && R < T) {
      T = drop_unread_rows(m, b, R, n_seqs, err, errlen);
      if (T <= 0) return T; /* 0: a prefill chunk with no output, nothing left to compute */
      h_ready = 0;          /* the kept rows' x moved; their norm is made again */
    }
    int rc = wk_fw_run_layer(m, layer, T, *n_seqs, h_ready, err, errlen);
    if (rc) return rc;
  }
  return T;
}

int wk_fw_logits(struct wk_model *m, int n, char *err, size_t errlen) {
  const struct md_config *c = &m->cfg;
  int H = c->hidden, Vl = m->lm_head.rows, layer = -1;
  if (c->final_softcap > 0)
    K(kn_matmul_softcap(m->be, m->logits, Vl, m->sel, H, m->lm_head.p, m->lm_head.dt, n, Vl, H,
                        (float)c->final_softcap));
  else
    K(wk_linear(m, m->logits, Vl, m->sel, H, &m->lm_head, n));
  return 0;
}

int wk_fw_head(struct wk_model *m, const struct wk_batch *b, int start, int n, int have_logits,
               char *err, size_t errlen) {
  const struct md_config *c = &m->cfg;
  struct kn_backend *be = m->be;
  int H = c->hidden, V = c->vocab, Vl = m->lm_head.rows, layer = -1;
  int tp = m->plan.world > 1;
  float cap = c->final_softcap > 0 ? (float)c->final_softcap : 0.0f;
  if (b->sampled && b->masks_ready) K(b->masks_ready(b->masks_arg));
  if (b->sampled && all_argmax(b->sample + start, n)) {
    /* greedy rows: the tokens straight from the head (kn_matmul_argmax gives
     * kn_argmax's answer over the logits without writing them) */
    if (have_logits)
      K(kn_argmax(be, m->head_ids, tp ? m->head_max : NULL, m->logits, Vl, n, Vl));
    else
      K(kn_matmul_argmax(be, m->head_ids, tp ? m->head_max : NULL, m->sel, H, m->lm_head.p,
                         m->lm_head.dt, n, Vl, H, cap, m->logits));
    if (tp) K(merge_argmax(m, n));
    return greedy_out(m, b, start, n);
  }
  /* greedy rows under masks: the argmax of what each allows; under tensor parallelism
   * each rank's over its slice (the masks' words cut at the slice: every rank's
   * starts at a multiple of 32 when the vocabulary is one of 32 x world), merged */
  if (b->sampled && !have_logits && masked_argmax(b->sample + start, n) &&
      (!tp || V % (32 * m->plan.world) == 0)) {
    const uint32_t *allow[WK_HEAD_MAX_ROWS];
    int rc = n <= WK_HEAD_MAX_ROWS ? 0 : CM_ERR_UNSUPPORTED;
    for (int r = 0; r < n && !rc; r++) {
      const uint32_t *a = b->sample[start + r].allow;
      allow[r] = a ? a + m->lm_head.off / 32 : NULL;
    }
    if (!rc)
      rc = kn_matmul_argmax_masked(be, m->head_ids, tp ? m->head_max : NULL, m->sel, H,
                                   m->lm_head.p, m->lm_head.dt, n, Vl, H, cap, allow);
    if (rc && rc != CM_ERR_UNSUPPORTED) K(rc);
    if (!rc && tp) { /* a slice that allows none: NaN, which never wins the merge */
      for (int r = 0; r < n; r++)
        if (m->head_ids[r] < 0) m->head_ids[r] = 0, m->head_max[r] = NAN;
      K(merge_argmax(m, n));
    }
    for (int r = 0; r < n && !rc && !tp; r++) /* a row that allows nothing */
      if (m->head_ids[r] < 0) K(CM_ERR_INVAL);
    if (!rc) return greedy_out(m, b, start, n);
  }
  if (!b->logits && !b->sampled) return 0;
  if (!have_logits) {
    int rc = wk_fw_logits(m, n, err, errlen);
    if (rc) return rc;
  }
  if (tp && b->sampled) { /* from the ranks' candidates, the full logits where needed */
    int full = tp_sample(m, b->sample + start, b->sampled + start, n);
    K(full < 0 ? full : 0);
    if (full) K(gather_logits(m, n));
    if (full == n) /* all of them: one call, its rows in parallel */
      K(kn_sample(be, b->sampled + start, m->logits, V, n, V, b->sample + start));
    for (int r = 0; r < n && full && full < n; r++)
      if (m->tp_full[r])
        K(kn_sample(be, b->sampled + start + r, m->logits + (size_t)r * V, V, 1, V,
                    b->sample + start + r));
    return 0;
  }
  if (tp) K(gather_logits(m, n));
  if (b->sampled)
    K(kn_sample(be, b->sampled + start, m->logits, V, n, V, b->sample + start));
  else
    K(kn_download(be, b->logits + (size_t)start * V, m->logits, sizeof(float) * (size_t)n * V));
  return 0;
}

/* m->sel[n, H] = the final norm of the rows out_rows[from ..] of m->x. */
static int select_rows(struct wk_model *m, int from, int n, char *err, size_t errlen) {
  const struct md_config *c = &m->cfg;
  int H = c->hidden, layer = -1;
  for (int r = 0; r < n; r++)
    K(kn_copy_rows(m->be, m->sel + (size_t)r * H, H, m->x + (size_t)m->out_rows[from + r] * H, H, 1,
                   H));
  K(kn_rmsnorm(m->be, m->sel, H, m->sel, H, n, H, m->final_norm, KN_DTYPE_F32, (float)c->eps,
               m->norm_mode));
  return 0;
}

/* One float of backend memory at p. */
static int fetch_float(struct kn_backend *be, const float *p, float *v) {
  return kn_download(be, v, p, sizeof(*v));
}

/* The scored rows (out_rows[R ..], m->n_scored of them) into b->scored: each
 * row's logits over the whole vocabulary (gathered under tensor parallelism),
 * their greedy kn_sample with score_top logprobs for the log-softmax's
 * normaliser and top entries, and the asked token's raw logprob: its entry
 * when it is among them, else its logit less the normaliser (the argmax's
 * logit less its logprob). */
static int score_rows(struct wk_model *m, const struct wk_batch *b, int R, char *err,
                      size_t errlen) {
  struct kn_backend *be = m->be;
  int V = m->cfg.vocab, layer = -1;
  for (int start = 0; start < m->n_scored; start += m->max_out) {
    int n = CM_MIN(m->max_out, m->n_scored - start);
    struct kn_sample_out *out = b->scored + start;
    K(select_rows(m, R + start, n, err, errlen));
    K(wk_fw_logits(m, n, err, errlen));
    if (m->plan.world > 1) K(gather_logits(m, n));
    for (int r = 0; r < n; r++) {
      struct kn_sample_params *p = &m->score_params[r];
      kn_sample_params_default(p);
      p->temperature = 0.0f;
      p->n_logprobs = b->score_top;
    }
    K(kn_sample(be, out, m->logits, V, n, V, m->score_params));
    for (int r = 0; r < n; r++) {
      int32_t id = m->score_ids[start + r], best = out[r].token, rank = 1;
      float lp = out[r].logprob;
      int j = 0;
      while (j < out[r].n_top && out[r].top_ids[j] != id)
        j++;
      if (j < out[r].n_top) { /* among the top entries: those more likely are too */
        lp = out[r].top_logprobs[j];
        for (int q = 0; q < j; q++)
          rank += out[r].top_logprobs[q] > lp;
      } else if (id != best || b->score_ranks) {
        const float *row = m->logits + (size_t)r * (size_t)V;
        float l_id, l_best;
        K(fetch_float(be, row + id, &l_id));
        K(fetch_float(be, row + best, &l_best));
        if (id != best) lp = l_id - (l_best - out[r].logprob);
        if (b->score_ranks) { /* 1 + the tokens with a larger logit */
          const float *h = row;
          if (m->score_row) K(kn_download(be, m->score_row, row, sizeof(float) * (size_t)V));
          if (m->score_row) h = m->score_row;
          for (int v = 0; v < V; v++)
            rank += h[v] > l_id;
        }
      }
      if (b->score_ranks) b->score_ranks[start + r] = rank;
      out[r].token = id;
      out[r].logprob = lp;
    }
  }
  return 0;
}

int wk_model_forward(struct wk_model *m, const struct wk_batch *b, char *err, size_t errlen) {
  const struct md_config *c = &m->cfg;
  struct kn_backend *be = m->be;
  int bucket = wk_graph_bucket(m, b);
  if (bucket >= 0) return wk_graph_forward(m, b, bucket, err, errlen);
  int R = 0, layer = -1, n_seqs;
  int T = wk_fw_prepare(m, b, &R, err, errlen);
  if (T < 0) return T;
  int H = c->hidden;
  T = wk_fw_trunk(m, b, T, R + m->n_scored, 1, &n_seqs, err, errlen);
  if (T < 0) return T;
  /* scored rows first: the outputs' sampling is then the backend's latest (kn_kept_ids) */
  if (m->n_scored && T > 0) K(score_rows(m, b, R, err, errlen));
  for (int start = 0; start < R && T > 0; start += m->max_out) {
    int n = CM_MIN(m->max_out, R - start);
    K(select_rows(m, start, n, err, errlen));
    if (b->hidden)
      K(kn_download(be, b->hidden + (size_t)start * H, m->sel, sizeof(float) * (size_t)n * H));
    int rc = wk_fw_head(m, b, start, n, 0, err, errlen);
    if (rc) return rc;
  }
  K(kn_sync(be));
  return 0;
}
