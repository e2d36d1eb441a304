/* wk-model.h — the model runtime: load a Gemma 3 / Gemma 4 checkpoint onto a
 * kernel backend, own the physical KV pool, and run the forward pass over a
 * ragged batch of sequences.
 *
 *   struct wk_model *m;
 *   wk_model_load(dir, be, &opts, &m, err, sizeof err);
 *   const struct wk_kv_spec *kv = wk_model_kv_spec(m);   // groups, page size
 *   ... the caller owns block tables (pages 0 .. wk_model_n_pages(m)-1) ...
 *   wk_model_forward(m, &batch, err, sizeof err);        // logits for requested rows
 *   wk_model_free(m);
 *
 * A forward call takes, per sequence, the token ids to run, the absolute
 * position of the first one and one block table per KV group covering every
 * position up to the last token. It writes those tokens' K/V into the pages
 * and returns logits (after the final softcap) and, when asked, the
 * final-normed hidden states of the last `n_out` tokens of each sequence,
 * in sequence order. Scratch memory is sized once at load for
 * opts.max_batch_tokens / opts.max_seqs: nothing is allocated per step.
 *
 * On the CPU backend the result rows of a sequence are bit-identical however
 * it is batched or its prompt chunked (see kernels/kn-backend.h). */
#ifndef LMSERVE_WK_MODEL_H
#define LMSERVE_WK_MODEL_H
#include <stddef.h>
#include <stdint.h>

#include "kernels/kn-backend.h"
#include "model/md-config.h"
#include "worker/wk-kv.h"

struct wk_model;

struct wk_model_opts {
  int max_batch_tokens; /* tokens per forward call; 0 = 512 */
  int max_seqs;         /* sequences per forward call; 0 = 64 */
  int kv_tokens;        /* pool capacity: pages for this many tokens in every group; 0 = 8192 */
  uint64_t kv_bytes;    /* pool size in bytes (rounded down to whole pages); overrides
                           kv_tokens when > 0 */
  double mem_util;      /* > 0 with kv_bytes == 0: the pool takes what is left of
                           device memory * mem_util once the weights and scratch are
                           allocated (wk_kv_bytes_for_util; backends with kn_mem_info) */
  int block_tokens;     /* positions per page of the largest group; 0 = 16 */
  int kv_dtype;         /* -1 / 0 default: f32 for f32 weights, bf16 otherwise;
                           else 1 + enum kn_dtype (1 = f32, 3 = bf16, 4 = fp8 e4m3):
                           wk_kv_dtype_parse */
  int quiet;            /* 1: no progress lines on stderr */
  int tp_rank, tp_size; /* tensor parallelism: this rank of tp_size (0 = 1) ranks, each
                           holding its shard (wk-shard.h); the backend must have
                           collectives when tp_size > 1 */
  int no_fast_prefill;  /* 1: KV-shared layers run every row of a prefill, not only the
                           rows whose output is read (wk_model_forward) */
  int mmap_weights;     /* host backends: 1 runs from the checkpoint's mapping (page
                           cache, shared between processes, 4 KiB pages); 0 copies the
                           weights into huge pages */
  int step_graphs;      /* WK_GRAPHS_*: decode steps as step graphs (wk-graph.c) */
  int max_graph_seqs;   /* largest bucket of step graphs; 0: max_seqs (at most 64 rows
                           of logits) */
  int graph_verify_tokens; /* > 1: also step graphs of speculative verification, whose
                              sequences each run a token and graph_verify_tokens - 1
                              drafts (wk-graph.c) */
  int quantization;     /* WK_QUANT_*: weights quantized at load (--quantization) */
  int fp8_reference;    /* 1: FP8 weights also where kn_fp8_weights says no, through the
                           backend's kn_matmul_fp8 (the CPU's reference: tests only) */
  /* LoRA adapters (wk_model_add_lora) loaded before the KV pool is sized, so that a pool
   * sized from a device's free memory sees theirs in use: adapter i + 1 is lora_names[i]
   * from lora_paths[i] */
  const char *const *lora_names;
  const char *const *lora_paths;
  int n_loras;
};

/* wk_model_opts.quantization. FP8: every linear layer's weight (attention,
 * MLP, per-layer-input projections; not the embedding, head, router or MoE
 * experts) to FP8 e4m3 with a scale per output feature, as vLLM's
 * --quantization fp8 does; needs a backend with FP8 kernels. */
/* Q8_0, Q4_0, Q4_K: every linear layer's weight and the embedding / head to
 * ggml's block format (kernels/kn-quant.h), row by row as `lmserve quantize`
 * writes a GGUF file of that type (Q4_K rows that are not whole 256-blocks
 * as Q5_0); the same block kernels as a GGUF file's; needs a backend with
 * KN_CAP_BLOCK_WEIGHTS (the CPU; CUDA where its block kernels passed their
 * check at start-up). */
enum {
  WK_QUANT_NONE = 0,
  WK_QUANT_FP8 = 1,
  WK_QUANT_Q8_0 = 2,
  WK_QUANT_Q4_0 = 3,
  WK_QUANT_Q4_K = 4
};
#define WK_QUANT_HELP                                                                              \
  "quantize the weights at load: fp8 (linear layers to FP8 e4m3, a scale per output channel; "     \
  "GPUs with FP8 tensor cores, compute capability 8.9+), or q8_0, q4_0, q4_k (linear layers and "  \
  "the embedding / head to ggml's block formats, as lmserve quantize writes them; rows that are "  \
  "not whole 256-blocks of q4_k, or that tensor parallelism cannot cut in them, as q5_0; the "     \
  "CPU; with --dtype q8 every block-format matrix takes 8-bit inputs)"
/* --quantization: "none" / "" (0), "fp8", "q8_0", "q4_0" or "q4_k" into *out; CM_ERR_INVAL with
 * a sentence in err. */
int wk_quantization_parse(const char *s, int *out, char *err, size_t errlen);

/* wk_model_opts.step_graphs. CAPTURE: decode-only steps of up to max_graph_seqs
 * sequences (and verification steps whose sequences all run graph_verify_tokens
 * tokens) run padded to a bucket of 1, 2, 4, ... sequences and replay that
 * bucket's graph, captured and checked at load, on backends that have graphs
 * (CUDA; elsewhere, or with tensor parallelism or MoE layers, nothing changes);
 * PAD: the same padding without graphs, on any backend (tests). */
enum { WK_GRAPHS_OFF = 0, WK_GRAPHS_CAPTURE = 1, WK_GRAPHS_PAD = 2 };
/* --enforce-eager (vLLM's flag: worker, serve, generate, bench model) */
#define WK_EAGER_HELP                                                                              \
  "run every step op by op: no step graphs (CUDA graphs of decode steps, captured at start-up)"

/* The --mmap flag's help (worker, serve, bench model): mmap_weights. */
#define WK_MMAP_HELP                                                                               \
  "keep the weights in the checkpoint's page cache (4 KiB pages, shared between processes) "       \
  "instead of a copy in huge pages (CPU)"

/* Loads DIR (config.json, safetensors, generation_config.json). `be` must
 * outlive the model. Returns 0 or a negative cm_err with a one-line reason
 * naming the file and tensor in err. */
int wk_model_load(const char *dir, struct kn_backend *be, const struct wk_model_opts *opts,
                  struct wk_model **out, char *err, size_t errlen);
void wk_model_free(struct wk_model *m);

const struct md_config *wk_model_config(const struct wk_model *m);
struct kn_backend *wk_model_backend(const struct wk_model *m);
const struct wk_kv_spec *wk_model_kv_spec(const struct wk_model *m);
int wk_model_n_pages(const struct wk_model *m); /* pages in the physical pool */
int wk_model_max_batch_tokens(const struct wk_model *m);
int wk_model_max_seqs(const struct wk_model *m);
/* Bytes of weights read for one decode token (every matrix once, plus one
 * embedding row per table). */
uint64_t wk_model_weight_bytes_per_token(const struct wk_model *m);
uint64_t wk_model_weight_bytes(const struct wk_model *m);
/* Of those, the bytes of matrices in ggml's block formats (a GGUF file's, or
 * --quantization's). */
uint64_t wk_model_block_bytes(const struct wk_model *m);
/* A checksum of the config and this rank's shard shapes: equal on every rank of a
 * tensor-parallel group that loaded the same checkpoint at the same size. */
uint64_t wk_model_shard_sum(const struct wk_model *m);

/* LoRA adapters (PEFT's layout, model/md-lora.h), loaded after the model: adapter
 * number wk_model_n_lora(m) + 1, which a sequence names in wk_seq_input.lora. Each
 * adapted projection of a sequence that names it adds scale * (x A^T) B^T to its
 * output; under tensor parallelism A and B are cut as the projection's weight is.
 * 0, or a negative cm_err with a one-line reason naming the adapter in err. */
int wk_model_add_lora(struct wk_model *m, const char *name, const char *dir, char *err,
                      size_t errlen);
int wk_model_n_lora(const struct wk_model *m);
/* A LoRA adapter loaded at run time (the scheduler's CTRL LORA_LOAD) into slot `slot`,
 * after wk_model_n_lora's and up to PR_MAX_LORAS, in place of the one there; max_rank
 * > 0 refuses a higher rank. 0, or a negative cm_err with the reason (the slot is
 * then empty). */
int wk_model_set_lora(struct wk_model *m, int slot, const char *dir, int max_rank, char *err,
                      size_t errlen);
/* Frees slot `slot`'s run-time adapter (the list's stay). */
void wk_model_drop_lora(struct wk_model *m, int slot);
/* Frees every run-time adapter. */
void wk_model_drop_run_time_loras(struct wk_model *m);
/* Whether slot `slot` holds an adapter. */
int wk_model_has_lora(const struct wk_model *m, int slot);
/* Adapter lora's rank (1 .. wk_model_n_lora). */
int wk_model_lora_rank(const struct wk_model *m, int lora);

/* Rows that replace token embeddings: an image's soft tokens at absolute
 * positions pos .. pos + n - 1. Only the positions a step runs are read. */
struct wk_seq_embed {
  int pos;           /* absolute position of rows[0] */
  int n;             /* rows, >= 1 */
  const float *rows; /* host [n, hidden] */
};

/* One sequence of a batch (host memory; not retained after the call). */
struct wk_seq_input {
  const int32_t *tokens;                         /* [n_tokens] */
  int n_tokens;                                  /* >= 1 */
  int pos0;                                      /* absolute position of tokens[0] */
  const int32_t *block_tables[WK_MAX_KV_GROUPS]; /* per KV group: page ids */
  int n_blocks[WK_MAX_KV_GROUPS];
  int n_out;            /* outputs for its last n_out tokens (0..n_tokens) */
  int n_score;          /* rows scored (wk_batch.scored): the n_score tokens before those
                           n_out, each for the raw logprob of score_ids[j] after it (a
                           prompt's logprobs); n_out + n_score <= n_tokens */
  const int32_t *score_ids; /* [n_score] the token each scored row is asked about */
  const int32_t *bidir; /* [n_bidir, 2] absolute position ranges [begin, end) attended
                           bidirectionally (an image's tokens), or NULL; a range that
                           meets this step's tokens must end inside them (it may begin
                           before them: those positions' K/V are in the pages); applied
                           in the layers md_image_bidir names for the model */
  int n_bidir;
  const struct wk_seq_embed *embeds; /* [n_embeds] replaced embeddings (taken as they
                                        are: no embedding scale), or NULL */
  int n_embeds;
  int lora; /* the LoRA adapter it runs with: a slot that holds one (wk_model_has_lora), 0 =
               none */
  int pad;  /* 1: a padding row, as CUDA-graph buckets fill a decode step up to a fixed
              size: its one token runs at pos0 (inside the first block) against the page
              block_tables[g][0], writes no KV (slot -1) and has no output (n_out 0);
              the other rows' results are those of the step without it */
};

struct wk_batch {
  const struct wk_seq_input *seqs;
  int n_seqs;
  float *logits; /* host [sum n_out, vocab] or NULL */
  float *hidden; /* host [sum n_out, hidden] final-normed states, or NULL */
  /* Sampling on the backend instead of returning logits (then logits is
   * ignored): sample[sum n_out] (host) are the rows' parameters, the tokens
   * and raw logprobs land in sampled[sum n_out] (host); only those leave the
   * device. See kn_sample for what differs from the CPU's draws. */
  const struct kn_sample_params *sample;
  struct kn_sample_out *sampled;
  /* Scored rows (wk_seq_input.n_score), in sequence order, host [sum n_score]: token =
   * its score id, logprob = that token's raw logprob (the log-softmax of the row's
   * logits), and the row's score_top (0..KN_SAMPLE_MAX_LOGPROBS) largest, as kn_sample
   * reports them. They are scored before the outputs are sampled, so that kn_kept_ids
   * are the outputs' where there are any. Needed when a sequence scores rows. */
  struct kn_sample_out *scored;
  int score_top;
  int32_t *score_ranks; /* host [sum n_score] or NULL: each scored token's rank, 1 + the
                           tokens whose logit is larger */
  /* Device-resident steps: prev_rows[s] >= 0 (host [n_seqs], or NULL for none)
   * runs sequence s's first token as the id the backend's latest sampling call
   * gave in that row (kn_kept_ids: the previous step's token, which the host
   * has not read yet), whatever tokens[0] says. One rank only (CM_ERR_UNSUPPORTED
   * under tensor parallelism); a row past the kept ones: CM_ERR_RANGE. */
  const int32_t *prev_rows;
  /* When set, called before the first row samples (maybe more than once): the
   * rows' masks (sample[].allow, the pointers set already) are complete once it
   * returns 0, so that a worker computes them while the device runs the pass;
   * nonzero fails the step with that error. */
  int (*masks_ready)(void *arg);
  void *masks_arg;
};

/* Runs the batch. Returns 0, or CM_ERR_INVAL / CM_ERR_RANGE / CM_ERR_TOOBIG
 * for a bad batch (token id outside the vocabulary, too many tokens, a
 * missing or out-of-pool block) with the reason in err; the model stays
 * usable. */
int wk_model_forward(struct wk_model *m, const struct wk_batch *b, char *err, size_t errlen);

/* For tests of step graphs: runs decode step b (it must replay a captured
 * graph) twice, uncaptured with the graph's launch shapes and replayed.
 * 0 when the logits agree bit for bit, 1 when not (the first difference in
 * err), CM_ERR_UNSUPPORTED when b replays no graph, else a cm_err. Both runs
 * write the step's K/V (the same values): run b itself afterwards to go on. */
int wk_model_graph_check(struct wk_model *m, const struct wk_batch *b, char *err, size_t errlen);

/* ---- Gemma 4 MTP assistant (draft model) ----------------------------------
 *
 * A draft model is loaded against its target (which must outlive it): it
 * owns no KV cache, and draft layer i attends to the pages of the target's
 * last storing layer of its kind. One draft step, per sequence:
 *   e = target_embed(token) * sqrt(B); x = pre_projection([e, h_in]);
 *   the Q-only layers at the constant position `pos`; d = norm(x);
 *   h_out = post_projection(d) (the next step's h_in); the drafted token is
 *   argmax of d . embed (or, with use_ordered_embeddings, of the top
 *   centroids' candidate tokens only).
 * The first h_in is the target's final-normed hidden state (wk_batch.hidden)
 * at the last accepted position p, and every step of a round runs at p with
 * the target's block tables as they are. */

int wk_draft_load(const char *dir, struct wk_model *target, const struct wk_model_opts *opts,
                  struct wk_model **out, char *err, size_t errlen);

struct wk_draft_input {
  int32_t token; /* the token entering this step */
  int pos;       /* last accepted position p (its K/V are in the target's pages) */
  const int32_t *block_tables[WK_MAX_KV_GROUPS]; /* the target's tables */
  int n_blocks[WK_MAX_KV_GROUPS];
  const float *h_in; /* host [backbone_hidden] */
  float *logits;     /* host [vocab]: this row's dense logits too, or NULL (a structured
                        output's row picks its own draft among the tokens its mask allows) */
};

/* Runs one draft step for n sequences: tokens_out [n] (host), h_out [n, B]
 * (host), logits [n, vocab] (host, optional: the dense d . embed logits of
 * every row; in[s].logits asks for one row's).
 * Returns 0 or a negative cm_err with the reason in err. */
int wk_draft_step(struct wk_model *d, const struct wk_draft_input *in, int n, int32_t *tokens_out,
                  float *h_out, float *logits, char *err, size_t errlen);

/* --kv-cache-dtype (vLLM's): "auto" (0: f32 for f32 weights, else bf16), "bf16" /
 * "bfloat16", "fp8" / "fp8_e4m3" (e4m3, scale 1: half a bf16 cache's bytes), "f32" /
 * "float32" into *out as wk_model_opts.kv_dtype; CM_ERR_INVAL with a sentence in err. */
#define WK_KV_DTYPE_HELP                                                                           \
  "KV cache element type: auto (the weights' bf16, f32 for f32 weights), bf16, fp8 (e4m3, "        \
  "scale 1: twice the tokens in the same memory), f32"
int wk_kv_dtype_parse(const char *s, int *out, char *err, size_t errlen);

#endif
