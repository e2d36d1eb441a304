/* wk-model-impl.h — the body of struct wk_model, shared by the loader
 * (wk-model.c) and the forward pass (wk-forward.c). Not for other modules. */
#ifndef LMSERVE_WK_MODEL_IMPL_H
#define LMSERVE_WK_MODEL_IMPL_H
#include "kernels/kn-backend.h"
#include "worker/wk-model.h"
#include "worker/wk-safetensors.h"

/* A weight matrix or table in backend memory. */
struct wk_w {
  const void *p; /* NULL when absent */
  enum kn_dtype dt;
};

struct wk_layer_w {
  struct wk_w wq;               /* [n_heads * D, H] */
  struct wk_w wk;               /* [n_kv * D, H]; absent on KV-shared layers */
  struct wk_w wv;               /* [n_kv * D, H]; absent on shared and k_eq_v layers */
  struct wk_w wo;               /* [H, n_heads * D] */
  const float *q_norm, *k_norm; /* [D] f32 */
  const float *in_norm, *post_attn_norm, *pre_ffn_norm, *post_ffn_norm; /* [H] f32 */
  struct wk_w w_gate, w_up; /* [F, H] (F = layer ffn_dim) */
  struct wk_w w_down;       /* [H, F] */
  /* MoE */
  struct wk_w router;                                           /* [E, H] */
  const float *router_scale;                                    /* [H] */
  const float *expert_scale;                                    /* [E] */
  struct wk_w experts_gate_up;                                  /* [E, 2I, H] */
  struct wk_w experts_down;                                     /* [E, H, I] */
  const float *pre_ffn_norm2, *post_ffn_norm1, *post_ffn_norm2; /* [H] */
  /* PLE */
  struct wk_w ple_gate;       /* [P, H] */
  struct wk_w ple_proj;       /* [H, P] */
  const float *ple_post_norm; /* [H] */
  float layer_scalar;         /* 1 when absent */
};

struct wk_model {
  struct kn_backend *be;
  struct wk_config cfg;
  struct wk_kv_spec kv;
  struct wk_st *st;
  char dir[1024];
  int n_pages;
  int max_T, max_seqs, max_out; /* tokens, sequences, output rows per logits chunk */

  /* weights */
  struct wk_w embed;          /* [V, H] (also the tied lm_head) */
  struct wk_w lm_head;        /* [V, H]: embed unless untied */
  struct wk_w ple_embed;      /* [Vp, L * P] */
  struct wk_w ple_model_proj; /* [L * P, H] */
  const float *ple_proj_norm; /* [P] */
  const float *final_norm;    /* [H] */
  struct wk_layer_w *layers;  /* [L] */
  float embed_scale;          /* sqrt(H) rounded to the embedding dtype */
  float ple_embed_scale;      /* sqrt(P) rounded likewise */
  enum kn_norm_mode norm_mode;
  float *inv_freq[2]; /* [D/2] per layer kind, backend memory */
  uint64_t weight_bytes, bytes_per_token;

  /* backend allocations to free (f32 copies of vectors, scratch, pool) */
  void **owned;
  int n_owned, cap_owned;

  void *pool; /* n_pages * kv.page_bytes bytes */

  /* scratch, backend memory (T = max_T rows) */
  float *x;             /* [T, H] residual stream */
  float *h;             /* [T, H] normed input of a block */
  float *o;             /* [T, H] block output */
  float *o2;            /* [T, H] MoE path output / PLE projection */
  float *q;             /* [T, n_heads * Dmax] */
  float *k;             /* [T, kvdim_max] */
  float *v;             /* [T, kvdim_max] */
  float *attn;          /* [T, n_heads * Dmax] */
  float *gate;          /* [T, Fmax] */
  float *up;            /* [T, Fmax] */
  float *ple;           /* [T, L * P] per-layer inputs */
  float *ple_tmp;       /* [T, L * P] token part */
  float *g_small;       /* [T, P] */
  float *router_logits; /* [T, E] */
  float *ex_h;          /* [1, 2I] */
  float *ex_y;          /* [1, H] */
  float *sel;           /* [max_out, H] rows selected for output */
  float *logits;        /* [max_out, V] */

  /* host scratch */
  int32_t *ids;             /* [T] */
  int32_t *pos;             /* [T] */
  int32_t *slots;           /* [n_groups][T] */
  struct kn_attn_seq *aseq; /* [n_groups][max_seqs] */
  int32_t *moe_ids;         /* [T, k] */
  float *moe_w;             /* [T, k] */
  int32_t *out_rows;        /* [T] row index of each output */
};

/* Allocates backend memory owned by the model (freed with it). */
void *wk_model_alloc(struct wk_model *m, size_t bytes);

#endif
