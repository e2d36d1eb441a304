/* wk-model-impl.h — the body of struct wk_model, shared by the loader
 * (wk-model.c) and the forward pass (wk-forward.c). Not for other modules. */
#ifndef LMSERVE_WK_MODEL_IMPL_H
#define LMSERVE_WK_MODEL_IMPL_H
#include "common/cm-arena.h"
#include "common/cm-huge.h"
#include "kernels/kn-backend.h"
#include "model/md-lora.h"
#include "model/md-safetensors.h"
#include "worker/wk-model.h"
#include "worker/wk-owned.h"
#include "worker/wk-shard.h"
#include "worker/wk-tp-sample.h"

/* How a weight splits over tensor-parallel ranks (Megatron layout). The shape a
 * rank holds follows from the rule alone, so the forward pass needs no rank tests. */
enum wk_shard {
  WK_SHARD_FULL = 0, /* every rank holds all of it (router, PLE, draft projections) */
  WK_SHARD_ROWS,     /* output rows split: Q/K/V (by head), gate/up, vocab-parallel
                        embedding and head; each rank computes its own slice of outputs */
  WK_SHARD_COLS,     /* input columns split: O and down; each rank's output is a
                        partial sum, all-reduced over the ranks */
};

/* One rank's greedy answer for one row: its maximum and where (full-vocabulary id). */
struct wk_pair {
  float max;
  int32_t id;
};

/* A weight matrix (or a stack of n_mat matrices, the MoE experts) in backend memory:
 * this rank's slice of it, described once at load time. */
struct wk_w {
  const void *p; /* NULL when absent; [n_mat, rows, cols] row-major */
  enum kn_dtype dt;
  const float *scale;  /* KN_DTYPE_F8E4M3 only: [rows] f32 per output feature */
  int rows, cols;      /* this rank's shape of one matrix (rows = outputs) */
  int n_mat;           /* 1, or E for a stack of expert matrices */
  enum wk_shard shard; /* how the full tensor was split */
  int off;             /* first row (ROWS) or column (COLS) of the full tensor held here */
};

struct wk_layer_w {
  struct wk_w wq;               /* [n_heads * D, H] */
  struct wk_w wk;               /* [n_kv * D, H]; absent on KV-shared layers */
  struct wk_w wv;               /* [n_kv * D, H]; absent on shared and k_eq_v layers */
  struct wk_w wo;               /* [H, n_heads * D] */
  const float *q_norm, *k_norm; /* [D] f32 */
  const float *k_scale, *v_scale; /* [local kv heads] f32: an fp8 cache's scales from the
                                     checkpoint (md_config.kv_scales), or NULL (1) */
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

/* The host memory weights are copied into (wk-model.c, arena_reserve). */
struct wk_copy {
  void *dst;
  const void *src;
  size_t bytes;
};

struct wk_arena {
  struct cm_huge mem;   /* the reservation; mem.base NULL: no arena */
  size_t used;          /* bytes from mem.base handed out */
  struct wk_copy *todo; /* copies into it, run in parallel once every tensor is bound */
  int n_todo, cap_todo;
};

struct wk_load_progress {
  uint64_t total, done, next; /* checkpoint bytes; a line each time done passes next */
  int loud;
};

#define WK_MAX_BUCKETS                                                                             \
  24                           /* step graph buckets: 1, 2, 4, ..., 2048 sequences, of one token   \
                                  and of a token with its drafts */
#define WK_GRAPH_MAX_TOKENS 16 /* tokens a sequence of a verification bucket runs, at most */

struct wk_model {
  struct kn_backend *be;
  struct md_config cfg;      /* this rank's shapes (wk_config_shard): heads, widths */
  struct md_config full;     /* the checkpoint's config */
  struct wk_shard_plan plan; /* this rank's place in its tensor-parallel group */
  struct wk_kv_spec kv;
  struct md_st *st;
  char dir[1024];
  int n_pages;
  int max_T, max_seqs, max_out; /* tokens, sequences, output rows per logits chunk */
  int first_shared;             /* every layer from here on is KV-shared (n_layers: none) */
  int fast_prefill;             /* 1: rows nobody reads are dropped before first_shared */
  int quant_fp8;                /* --quantization fp8: linear weights quantized at load */
  int quant_block;              /* --quantization q8_0|q4_0|q4_k: the block format (enum kn_dtype)
                                   linear weights and the embedding / head are quantized to at
                                   load; 0: none */

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
  uint64_t block_bytes; /* of weight_bytes: matrices in ggml's block formats */

  /* backend allocations to free (f32 copies of vectors, scratch, pool) */
  struct wk_owned owned;
  struct wk_arena arena;
  struct wk_load_progress progress;

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
  float *ex_in;         /* [T, H] the rows routed to one expert */
  float *ex_h;          /* [T, 2I] */
  float *ex_y;          /* [T, H] */
  int *ex_count;        /* [n_experts + 1] host: bucket bounds */
  int32_t *ex_tok;      /* [T * top_k] host: tokens by expert */
  float *ex_wt;         /* [T * top_k] host: their routing weights */
  float *sel;           /* [max_out, H] rows selected for output */
  float *logits;        /* [max_out, V] */

  /* host scratch; every host array of the model (layers, the ex_ and tp_
   * arrays, token_ordering ...) comes from the arena host, sized at load */
  struct cm_arena host;
  int32_t *ids;             /* [T] */
  int32_t *ids_map;         /* [T] row of kn_kept_ids that token t takes on the backend
                               (wk_batch.prev_rows), -1: ids[t] */
  int32_t *ids_dev;         /* backend [T] the ids the embeddings read (one rank), or NULL */
  int32_t *pos;             /* [T] */
  int32_t *slots;           /* [n_groups][T] */
  struct kn_attn_seq *aseq; /* [n_groups][max_seqs] */
  int32_t *moe_ids;         /* [T, k] */
  float *moe_w;             /* [T, k] */
  int32_t *out_rows;        /* [T] row index of each output, then of each scored row */
  int n_scored;             /* scored rows of the batch wk_fw_prepare took */
  int32_t *score_ids;       /* [T] their tokens (wk_seq_input.score_ids, in batch order) */
  struct kn_sample_params *score_params; /* [max_out] */
  float *score_row;         /* [V] host: a scored row's logits (backends with their own memory) */
  int32_t *head_ids;        /* [max_out] greedy tokens straight from the head */
  /* tensor parallelism (plan.world > 1) only */
  int32_t *ids_local;         /* [T] ids in this rank's vocabulary rows, -1 elsewhere */
  float *head_max;            /* [max_out] this rank's greedy maxima */
  struct wk_pair *pairs_host; /* [max_out * (1 + world)]: mine, then everyone's */
  struct wk_pair *pairs;      /* backend [max_out] */
  struct wk_pair *pairs_all;  /* backend [world, max_out] */
  float *gathered;            /* backend [world, max_out, V / world] head slices */
  /* sampled rows decided from the ranks' candidates (wk-tp-sample.h) */
  struct wk_tp_rec *recs_host; /* [max_out * (1 + world)]: mine, then everyone's */
  struct wk_tp_rec *recs;      /* backend [max_out] */
  struct wk_tp_rec *recs_all;  /* backend [world, max_out] */
  void *tp_scratch;            /* wk_tp_sample_scratch_bytes(world) */
  float *tp_work;              /* [V / world] a row being processed */
  uint8_t *tp_full;            /* [max_out] 1: the row is sampled from the gathered logits */
  float *head_host;            /* [max_out, V / world] the slice on the host (device backends) */

  /* Gemma 4 MTP assistant only (target != NULL) */
  struct wk_model *target;    /* whose embedding and KV pages the draft reads */
  struct wk_w pre_proj;       /* [h, 2B] */
  struct wk_w post_proj;      /* [B, h] */
  struct wk_w centroids;      /* [C, h] when use_ordered_embeddings */
  int32_t *token_ordering;    /* host [V]: C groups of V / C token ids */
  float *cat;                 /* [T, 2B] concat(target embedding, h_in) */
  float *hout;                /* [T, B] */
  float *cent;                /* [1, C] centroid logits of one row */
  float *cand_logits;         /* [1, top_k * V / C] */
  float *host_cent;           /* host [C] */
  int32_t *cand;              /* host [top_k * V / C] candidate token ids */
  struct wk_seq_input *dseqs; /* host [max_seqs] */

  /* LoRA adapters (wk-lora.c) */
  struct wk_lora *loras;        /* [PR_MAX_LORAS] slot i + 1 (w NULL: empty); NULL: none yet */
  int n_lora, lora_rank;        /* --lora-modules' (slots 1 .. n_lora), the largest rank */
  float *lora_tmp;              /* backend [T, lora_rank]: x A^T of a run */
  struct wk_lora_run *lora_run; /* host [max_seqs]: the batch's runs of rows with an adapter */
  int n_lora_run;

  /* Step graphs (wk-graph.c): steps whose every sequence runs and samples the
   * same number of tokens (a decode's one; a token and its drafts when
   * verifying) run padded to the smallest bucket of that many tokens that
   * holds their sequences, replaying the bucket's graph where one was
   * captured */
  int n_buckets;
  int bucket_seqs[WK_MAX_BUCKETS];         /* 1, 2, 4, ... of each token count */
  int bucket_tokens[WK_MAX_BUCKETS];       /* tokens per sequence: 1, or 1 + drafts */
  struct kn_graph *graphs[WK_MAX_BUCKETS]; /* NULL: the bucket runs eagerly */
  uint64_t bucket_steps[WK_MAX_BUCKETS];   /* steps run padded to each bucket */
  struct wk_seq_input *gseqs;              /* host [largest bucket]: the padded step */
  int32_t pad_tokens[WK_GRAPH_MAX_TOKENS]; /* a padding row's tokens (0) */
  int32_t pad_table[1];                    /* and its block table */
  int graph_mode;                          /* WK_GRAPHS_* (wk-model.h) */
};

/* out[T, w->rows] = in[T, w->cols] . W^T: the one entry point of every dense weight
 * (wk-forward.c); the shape comes from the weight, never from the caller. */
int wk_linear(struct wk_model *m, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
              const struct wk_w *w, int T);

/* out[T, table->cols] = table rows of m->ids[0, T) * scale; on a vocab-parallel rank the
 * rows it holds, all-reduced with the other ranks' (wk-forward.c). */
int wk_embed_tokens(struct wk_model *m, float *out, const struct wk_w *table, float scale, int T);

/* Allocates backend memory owned by the model (freed with it). */
void *wk_model_alloc(struct wk_model *m, size_t bytes);

/* One adapted projection on this rank: A [rank, cols] and B [rows, rank] (B times the
 * adapter's scale), f32 in backend memory, cut as the projection's weight. */
struct wk_lora_w {
  float *a, *b; /* NULL: not adapted */
  int rows, cols;
};
struct wk_lora {
  int rank;
  struct wk_lora_w (*w)[MD_LORA_N_MODS]; /* [n_layers]; NULL: an empty slot */
  struct wk_owned owned;                 /* its backend memory */
};
/* Rows [t0, t0 + n) of a batch run with adapter `lora` (1-based). */
struct wk_lora_run {
  int t0, n, lora;
};
/* Appends rows [t0, t0 + n) with adapter lora to m->lora_run (joined to the last
 * run where they continue it). */
void wk_lora_push(struct wk_model *m, int t0, int n, int lora);
void wk_lora_free(struct wk_model *m);
/* Fills m->lora_run from the batch (wk_fw_prepare): CM_ERR_RANGE for an adapter
 * number the model does not have. */
int wk_lora_runs(struct wk_model *m, const struct wk_batch *b, char *err, size_t errlen);
/* Whether any run of this batch adapts `mod` of `layer`. */
int wk_lora_any(const struct wk_model *m, int layer, enum md_lora_mod mod);
/* out[t] += B (A in[t]) for each run's rows t whose adapter adapts `mod` of `layer`. */
int wk_lora_apply(struct wk_model *m, int layer, enum md_lora_mod mod, float *out, ptrdiff_t ldo,
                  const float *in, ptrdiff_t ldi);

/* wk-forward.c: checks a batch and fills ids, positions, slots and attention
 * descriptors (returns T or a negative cm_err); runs one decoder layer on m->x.
 * A layer leaves the next layer's normed input (its in_norm of x) in m->h, made
 * by its last fused add; h_ready says m->h already holds this layer's (every
 * layer but the first, unless rows of x moved in between). */
/* *n_out: the outputs, out_rows[0 .. *n_out); m->n_scored scored rows follow them. */
int wk_fw_prepare(struct wk_model *m, const struct wk_batch *b, int *n_out, char *err,
                  size_t errlen);
int wk_fw_run_layer(struct wk_model *m, int layer, int T, int n_seqs, int h_ready, char *err,
                    size_t errlen);
/* The embeddings and every layer over the T rows wk_fw_prepare filled, into
 * m->x. drop: rows nobody reads (R: outputs and scored rows) leave before the KV-shared
 * layers (fast prefill); returns the rows left (*n_seqs their sequences), or
 * a negative cm_err. */
int wk_fw_trunk(struct wk_model *m, const struct wk_batch *b, int T, int R, int drop, int *n_seqs,
                char *err, size_t errlen);
/* m->logits[n, V / world] = the head (and final softcap) of m->sel's n rows. */
int wk_fw_logits(struct wk_model *m, int n, char *err, size_t errlen);
/* Output rows [start, start + n) of b from m->sel's final-normed rows: sampled
 * tokens or logits as b asks; have_logits: m->logits holds their logits. */
int wk_fw_head(struct wk_model *m, const struct wk_batch *b, int start, int n, int have_logits,
               char *err, size_t errlen);

/* Step graphs (wk-graph.c): the bucket step b runs in (padded up to its size),
 * or -1 for the eager forward. */
int wk_graph_bucket(const struct wk_model *m, const struct wk_batch *b);
int wk_graph_forward(struct wk_model *m, const struct wk_batch *b, int bucket, char *err,
                     size_t errlen);
/* Makes the buckets (mode WK_GRAPHS_*, up to max_bucket sequences; 0: as
 * many as the model's sizes allow) of decode steps and, with verify_tokens >
 * 1, of verification steps of that many tokens a sequence, and for
 * WK_GRAPHS_CAPTURE captures and checks their graphs; 0, or a negative cm_err
 * for a device failure. */
int wk_graph_init(struct wk_model *m, int mode, int max_bucket, int verify_tokens, char *err,
                  size_t errlen);
void wk_graph_free(struct wk_model *m);

/* wk-model.c: the shared loader; target != NULL loads a gemma4_assistant. */
int wk_model_load_as(const char *dir, struct kn_backend *be, const struct wk_model_opts *opts,
                     struct wk_model *target, struct wk_model **out, char *err, size_t errlen);

#endif
