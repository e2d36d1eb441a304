/* kn-cuda-impl.h — inside the CUDA backend: the context, the error-check
 * macros (one per foreign error domain, NCCL checks.h style), the pinned
 * staging ring and device scratch, and the extern "C" launchers that the
 * .cu files export (one .cu per op).
 *
 * This header is read by both the C glue (kn-cuda-*.c) and nvcc (*.cu); the
 * launchers take only plain C types and return a cudaError_t from
 * cudaGetLastError() after the launch, which the C side checks. */
#ifndef LMSERVE_KN_CUDA_IMPL_H
#define LMSERVE_KN_CUDA_IMPL_H
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "kernels/kn-backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- launchers (the .cu files) ------------------------------------------ */

/* One query row of an attention call as the device sees it (staged). */
struct kn_cuda_attn_row {
  int32_t q_row;  /* row of q / out */
  int32_t pos;    /* absolute position of the query */
  int32_t lo, hi; /* visible key positions [lo, hi] (an interval: see kn-cuda-attn.c) */
  int32_t bt_off; /* offset of its sequence's block table in the staged tables */
};

/* Consecutive query rows of one sequence that one block serves together,
 * sharing each K / V read (staged). */
struct kn_cuda_attn_tile {
  int32_t r0, nq; /* rows [r0, r0 + nq) of the row descriptors */
  int32_t lo, hi; /* union of their key intervals */
};

/* Everything the attention kernels need (passed by value). A block serves
 * `slots` (query row, query head) pairs: qt rows of a tile times the `chunk`
 * heads of one head chunk of one kv head's group. */
struct kn_cuda_attn_args {
  float *out;
  ptrdiff_t ldo;
  const float *q;
  ptrdiff_t ldq;
  const char *pool; /* device; n_pages * page_bytes bytes */
  size_t page_bytes, k_off, v_off;
  int block_tokens, n_kv_heads, head_dim;
  int n_heads, group;  /* query heads; group = n_heads / n_kv_heads */
  int n_chunks, chunk; /* head chunks per kv head, heads per chunk */
  int qt;              /* query rows per tile; qt * chunk <= slots */
  int slots;           /* (row, head) pairs per block: 1, 2, 4 or 8 */
  float scale, softcap;
  const struct kn_cuda_attn_row *rows;   /* device, [n_rows] */
  const struct kn_cuda_attn_tile *tiles; /* device, [n_tiles] */
  const int32_t *tables;                 /* device, concatenated block tables */
  int n_rows, n_tiles;
  int split_len;   /* keys per split (multiple of 32); with fit_split, the least */
  int n_split;     /* splits in the grid; 1 writes out directly */
  int fit_split;   /* 1 (step graphs, whose grid is fixed): each tile splits its own keys
                      over the n_split splits, split_len keys at least (kn_cuda_attn_split) */
  float *part_acc; /* device, [n_rows, n_heads, n_split, head_dim] */
  float *part_ml;  /* device, [n_rows, n_heads, n_split, 2]: max, sum */
  const float *k_scale, *v_scale; /* device [n_kv_heads] (an fp8 cache's), or NULL */
};

/* ids outside [0, vocab) give zero rows */
cudaError_t kn_cuda_launch_embed(cudaStream_t s, float *out, ptrdiff_t ldo, const void *table,
                                 enum kn_dtype tdt, int vocab, int H, const int32_t *ids, int T,
                                 float scale);
/* dst[t] = map[t] < 0 ? ids[t] : src[map[t]], t < T (all device memory) */
cudaError_t kn_cuda_launch_ids_take(cudaStream_t s, int32_t *dst, const int32_t *ids,
                                    const int32_t *src, const int32_t *map, int T);
cudaError_t kn_cuda_launch_rmsnorm(cudaStream_t s, float *out, ptrdiff_t ldo, const float *x,
                                   ptrdiff_t ldx, int rows, int d, const void *w, enum kn_dtype wdt,
                                   float eps, enum kn_norm_mode mode);
cudaError_t kn_cuda_launch_rope(cudaStream_t s, float *x, ptrdiff_t ldx, int T, int heads, int D,
                                const int32_t *pos, const float *inv_freq);
cudaError_t kn_cuda_launch_gelu_mul(cudaStream_t s, float *out, ptrdiff_t ldo, const float *gate,
                                    ptrdiff_t ldg, const float *up, ptrdiff_t ldu, int T, int N);
enum kn_cuda_eltwise { KN_CUDA_ADD, KN_CUDA_MUL, KN_CUDA_SCALE, KN_CUDA_SOFTCAP };
/* out = a op b (ADD, MUL) or a op s (SCALE: a * s, SOFTCAP: tanh(a / s) * s). */
cudaError_t kn_cuda_launch_eltwise(cudaStream_t st, enum kn_cuda_eltwise op, float *out,
                                   const float *a, const float *b, float s, size_t n);
/* dst[n] (dtype dt: F16 or BF16) = src[n] rounded to nearest even. */
cudaError_t kn_cuda_launch_narrow(cudaStream_t s, void *dst, enum kn_dtype dt, const float *src,
                                  ptrdiff_t lds, int rows, int cols);
/* out[t, n] (+)= sum_k in[t, k] rounded to wdt (bf16 / f16) * w[n, k] for
 * t < T <= KN_CUDA_GEMV_MAX_T, one warp per n, in one launch; needs K % 8 == 0
 * and w, in and every row of in (ldi) 16-byte aligned (kn_cuda_gemv_fits). */
#define KN_CUDA_GEMV_MAX_T 8
cudaError_t kn_cuda_launch_gemv(cudaStream_t s, float *out, ptrdiff_t ldo, const float *in,
                                ptrdiff_t ldi, const void *w, enum kn_dtype wdt, int T, int N,
                                int K, int accumulate);
static inline int kn_cuda_gemv_fits(const float *in, ptrdiff_t ldi, const void *w,
                                    enum kn_dtype wdt, int T, int K) {
  return (wdt == KN_DTYPE_BF16 || wdt == KN_DTYPE_F16) && T >= 1 && T <= KN_CUDA_GEMV_MAX_T &&
         K > 0 && K % 8 == 0 && (uintptr_t)in % 16 == 0 && (uintptr_t)w % 16 == 0 &&
         (T == 1 || ldi % 4 == 0);
}
/* FP8 weights (kn-cuda-fp8.cu): the few-rows kernel (T <= 8, K % 16 == 0,
 * 16-byte aligned w, in and rows of in); codes widened to bf16; inputs
 * quantized per row to e4m3 (sa[t] = largest |in[t, :]| / 448); the epilogue
 * out[t, n] (+)= tmp[t, n] * scale[n] (* sa[t]). A call of up to
 * KN_CUDA_FP8_GEMV_T rows that kn_cuda_fp8_gemv_fits takes runs the few-rows
 * kernel in launches of at most KN_CUDA_GEMV_MAX_T rows (kn_matmul_fp8, and
 * the fused matmuls over FP8 weights). */
#define KN_CUDA_FP8_GEMV_T 32
static inline int kn_cuda_fp8_gemv_fits(const float *in, ptrdiff_t ldi, const void *w, int T,
                                        int K) {
  return T >= 1 && T <= KN_CUDA_FP8_GEMV_T && K % 16 == 0 && (uintptr_t)in % 16 == 0 &&
         (uintptr_t)w % 16 == 0 && (T == 1 || ldi % 4 == 0);
}
cudaError_t kn_cuda_launch_gemv_fp8(cudaStream_t s, float *out, ptrdiff_t ldo, const float *in,
                                    ptrdiff_t ldi, const void *w, const float *scale, int T, int N,
                                    int K, int accumulate);
cudaError_t kn_cuda_launch_fp8_dequant(cudaStream_t s, void *dst, const void *w, size_t n);
cudaError_t kn_cuda_launch_fp8_quant_rows(cudaStream_t s, void *codes, float *sa, const float *in,
                                          ptrdiff_t ldi, int T, int K);
cudaError_t kn_cuda_launch_fp8_epilogue(cudaStream_t s, float *out, ptrdiff_t ldo, const float *tmp,
                                        const float *scale, const float *sa, int T, int N,
                                        int accumulate);

/* Weights in ggml's block formats (kn-cuda-quant.cu), rows of K elements
 * of whole blocks of wdt, each block dequantized exactly as kn_dequant_row:
 * the few-rows matmul out[t, n] (+)= sum_k in[t, k] * w[n, k] in f32 for
 * t < T <= KN_CUDA_GEMV_MAX_T, a warp per rpw rows n (1, 2 or 4; 0: chosen
 * by N), for T = 1 with octets (1, 2 or 4) octets a lane in flight, the same
 * bits (calls of up to KN_CUDA_QGEMV_T rows run it in launches of 8); the
 * tile dst[r, :] (bf16, row stride K) = rows r < rows of w; the embedding
 * (ids outside [0, vocab) give zero rows). */
#define KN_CUDA_QGEMV_T 32
cudaError_t kn_cuda_launch_qgemv(cudaStream_t s, float *out, ptrdiff_t ldo, const float *in,
                                 ptrdiff_t ldi, const void *w, enum kn_dtype wdt, int T, int N,
                                 int K, int rpw, int octets, int accumulate);
cudaError_t kn_cuda_launch_qtile(cudaStream_t s, void *dst, const void *w, enum kn_dtype wdt,
                                 int rows, int K);
cudaError_t kn_cuda_launch_qembed(cudaStream_t s, float *out, ptrdiff_t ldo, const void *table,
                                  enum kn_dtype tdt, int vocab, int H, const int32_t *ids, int T,
                                  float scale);
/* dst[j, :] = w[rows[j], :] for j < n_rows; rows of row_bytes bytes (a multiple of 2). */
cudaError_t kn_cuda_launch_gather_rows(cudaStream_t s, void *dst, const void *w, size_t row_bytes,
                                       const int32_t *rows, int n_rows);
cudaError_t kn_cuda_launch_kv_write(cudaStream_t s, const struct kn_kv_view *view,
                                    const int32_t *slots, const float *k, ptrdiff_t ldk,
                                    const float *v, ptrdiff_t ldv, int T);
cudaError_t kn_cuda_launch_attention(cudaStream_t s, const struct kn_cuda_attn_args *a,
                                     enum kn_dtype kv_dtype);
/* The fused ops (kn-cuda-fused.cu): kn_add_norm's arithmetic on device
 * buffers, rows of H <= 12288. */
cudaError_t kn_cuda_launch_add_norm(cudaStream_t s, float *x, ptrdiff_t ldx, const float *o,
                                    ptrdiff_t ldo, float *h, ptrdiff_t ldh, int T, int H,
                                    const void *post_w, const void *next_w, enum kn_dtype wdt,
                                    float scale, float eps, enum kn_norm_mode mode);
/* kn_qkv_prep as the device sees it: f32 norm weights, pos and slots staged. */
struct kn_cuda_qkv_args {
  float *q;
  const float *k, *v; /* NULL: no K/V */
  ptrdiff_t ldq, ldk, ldv;
  int nh, kvh, D;
  const float *q_w, *k_w; /* [D] f32 */
  float eps;
  int mode, v_norm;
  const int32_t *pos, *slots; /* [T] device */
  const float *inv_freq;
  char *pool;
  size_t page_bytes, k_off, v_off;
  int block_tokens;
  const float *k_scale, *v_scale; /* device [kvh] (an fp8 cache's), or NULL */
};
cudaError_t kn_cuda_launch_qkv_prep(cudaStream_t s, const struct kn_cuda_qkv_args *a, int T,
                                    enum kn_dtype kv_dtype);
/* Up to KN_MM_MAX_PARTS (4) weight matrices of one input for the few-rows
 * kernel: part p writes out[p] (stride ldo[p]) from w[p] (times scale[p][r]
 * per output row r for e4m3 codes, NULL otherwise), and owns the rows
 * [first[p], first[p + 1]) of the launch. */
struct kn_cuda_gemv_parts {
  float *out[4];
  ptrdiff_t ldo[4];
  const void *w[4];
  const float *scale[4];
  int first[5];
  int n;
};
cudaError_t kn_cuda_launch_gemv_n(cudaStream_t s, const struct kn_cuda_gemv_parts *g,
                                  const float *in, ptrdiff_t ldi, enum kn_dtype wdt, int T, int K);
/* out[t, n] = gelu_tanh(round(in[t]) · wg[n]) * (round(in[t]) · wu[n]), t < T <= 8;
 * for e4m3 codes (wdt KN_DTYPE_F8E4M3) each dot product times sg[n], su[n]
 * (NULL for other weights). */
cudaError_t kn_cuda_launch_gemv_glu(cudaStream_t s, float *out, ptrdiff_t ldo, const float *in,
                                    ptrdiff_t ldi, const void *wg, const float *sg, const void *wu,
                                    const float *su, enum kn_dtype wdt, int T, int N, int K);

/* ids[T], maxv[T] (device) = argmax of each row. */
cudaError_t kn_cuda_launch_argmax(cudaStream_t s, int32_t *ids, float *maxv, const float *logits,
                                  ptrdiff_t ld, int T, int V);
/* ids[T, k], weights[T, k] (device); E <= KN_CUDA_TOPK_MAX_E. */
#define KN_CUDA_TOPK_MAX_E 4096
cudaError_t kn_cuda_launch_router_topk(cudaStream_t s, int32_t *ids, float *weights,
                                       const float *logits, ptrdiff_t ld, int T, int E, int k,
                                       const float *expert_scale);

/* The vision encoder ops (kn-backend.h), one .cu each. */
cudaError_t kn_cuda_launch_layernorm(cudaStream_t s, float *out, ptrdiff_t ldo, const float *x,
                                     ptrdiff_t ldx, int rows, int d, const void *w, const void *b,
                                     enum kn_dtype wdt, float eps);
cudaError_t kn_cuda_launch_bias_act(cudaStream_t s, float *out, ptrdiff_t ldo, const float *x,
                                    ptrdiff_t ldx, const float *bias, int T, int N,
                                    enum kn_act act);
cudaError_t kn_cuda_launch_avg_pool2d(cudaStream_t s, float *out, ptrdiff_t ldo, const float *x,
                                      ptrdiff_t ldx, int n_img, int side, int k, int C);
/* Gemma 4's tower (kn-cuda-eltwise.cu, kn-cuda-avg-pool.cu, kn-cuda-bias-act.cu). */
cudaError_t kn_cuda_launch_clamp(cudaStream_t s, float *out, const float *a, float lo, float hi,
                                 size_t n);
cudaError_t kn_cuda_launch_avg_pool_grid(cudaStream_t s, float *out, ptrdiff_t ldo, const float *x,
                                         ptrdiff_t ldx, int gw, int gh, int k, int C, float scale);
cudaError_t kn_cuda_launch_standardize(cudaStream_t s, float *out, ptrdiff_t ldo, const float *x,
                                       ptrdiff_t ldx, const float *bias, const float *scale, int T,
                                       int N);
/* Gemma 4's audio encoder (kn-cuda-audio.cu). */
cudaError_t kn_cuda_launch_conv3x3_s2(cudaStream_t s, float *out, const float *x, const float *w,
                                      int T, int F, int Cin, int Cout);
cudaError_t kn_cuda_launch_dwconv_causal(cudaStream_t s, float *out, ptrdiff_t ldo, const float *x,
                                         ptrdiff_t ldx, const float *w, const int32_t *first, int T,
                                         int C, int K);
cudaError_t kn_cuda_launch_local_attn_rel(cudaStream_t s, float *out, ptrdiff_t ldo, const float *q,
                                          ptrdiff_t ldq, const float *k, ptrdiff_t ldk,
                                          const float *v, ptrdiff_t ldv, const float *rel,
                                          const int32_t *span, int T, int heads, int hd, int dmin,
                                          int dmax, float cap);

/* One row of a kn_sample call as the device sees it (staged). */
struct kn_cuda_sample_row {
  float inv_t;     /* 1 / temperature (the host's float division); 0 = greedy */
  float log_min_p; /* logf(min_p) on the host (the CPU's cut); -inf = off */
  float top_p;     /* 1 = off */
  int32_t top_k;   /* 0 = off (also when >= V) */
  int32_t n_logprobs;
  int32_t pen_off, n_pen; /* this row's entries in the staged penalty arrays */
  float presence, frequency, repetition;
  int32_t mask_off; /* this row's mask in the staged masks (words); -1: none */
  uint64_t seed, counter;
};
/* out[T] (device) = one sampled token (and raw logprobs) per row of
 * logits[T, V]. With pen_ids (device, the rows' entries concatenated; ids in
 * [0, V), each once per row) the penalised entries are written into work
 * (device, [T, V] holding a copy of the rows, ldw == V) first; then with
 * masks (device, (V + 31) / 32 words from each masked row's mask_off) -inf is
 * written into work wherever a row's mask refuses (work a copy as with
 * pen_ids); without either, work == logits and ldw == ld. A row with nothing
 * finite gets token -1. */
cudaError_t kn_cuda_launch_sample(cudaStream_t s, struct kn_sample_out *out, const float *logits,
                                  ptrdiff_t ld, float *work, ptrdiff_t ldw, int T, int V,
                                  const struct kn_cuda_sample_row *rows, const int32_t *pen_ids,
                                  const int32_t *pen_counts, const uint32_t *masks);

#ifdef __cplusplus
}
#endif

/* ---- the backend context (C side only) ---------------------------------- */
#ifndef __CUDACC__
#include <cublas_v2.h>

#define KN_CUDA_STAGE_SEGS 4 /* segments of the pinned staging ring */

struct kn_cuda_ctx {
  int device;
  int n_sm; /* streaming multiprocessors */
  cudaStream_t stream;
  cublasHandle_t blas;

  /* Staging ring for host index arrays: KN_CUDA_STAGE_SEGS segments of
   * seg_bytes each, pinned on the host and mirrored on the device. A segment is
   * reused only after the event recorded when it was left has completed. */
  unsigned char *stage_host; /* pinned, KN_CUDA_STAGE_SEGS * seg_bytes bytes */
  unsigned char *stage_dev;  /* device, same size */
  size_t seg_bytes;          /* bytes per segment */
  int seg;                   /* current segment */
  size_t seg_used;           /* bytes used in the current segment */
  cudaEvent_t seg_done[KN_CUDA_STAGE_SEGS];
  int seg_pending[KN_CUDA_STAGE_SEGS]; /* seg_done[i] recorded and not yet waited for */

  /* Device scratch shared by the ops (converted activations, gathered rows,
   * attention partials, reduction results); stream order makes reuse safe. */
  void *scratch;
  size_t scratch_bytes;

  /* [KN_KEPT_IDS_MAX] device: the ids of the latest argmax or sample call of up to
   * that many rows (kn_kept_ids), copied there on the stream before the results
   * go to the host; fixed for the backend's lifetime (step graphs read it). */
  int32_t *kept_d;
  int mask_ok; /* kn_sample takes masks: its masked draw passed kn_cuda_mask_check */
  int ids_ok; /* kn_ids_take and kn_embed_dev passed their check (kn_cuda_ids_check): the
                 kept ids are offered (kn_kept_ids), else steps embed from host ids */
  int audio_ok; /* the audio encoder's ops passed kn_cuda_audio_check: else they answer
                   CM_ERR_UNSUPPORTED and kn-audio.c runs them on the host */

  /* Pinned host buffer for results copied back (argmax, top-k). */
  void *result_host;
  size_t result_bytes;

  /* 1: matmuls of few rows run kn_cuda_launch_gemv (checked against the
   * cuBLAS path when the backend is made; $LMSERVE_CUDA_GEMV=0 turns it off) */
  int gemv;

  /* KN_FUSED_* bits (kn-backend-impl.h) of the fused kernels that failed
   * their check when the backend was made: those calls run the unfused
   * sequence ($LMSERVE_FUSED=0: all of them). */
  unsigned fused_off;

  /* The tensor-parallel group (kn-cuda-nccl.c), or NULL. */
  struct kn_cuda_nccl *nccl;

  /* The step graph whose mode the ops run in (kn-cuda-graph.c), or NULL, and
   * that mode (enum kn_graph_mode; 0: none). */
  struct kn_cuda_graph *graph;
  int graph_mode;
  /* cuBLAS's workspace, ours and fixed, so that a capture allocates nothing */
  void *blas_ws;
  /* Block-format weights (kn-cuda-quant.c): 1 when matmuls of few rows run
   * the dequantizing kernel ($LMSERVE_CUDA_GEMV=0: the tiles for every T);
   * rows a tile, 0 for the byte budget (the check sets a few) */
  int qgemv;
  int qtile_rows;
  /* weight rows a warp of the few-rows kernel: 1, 2 or 4
   * ($LMSERVE_CUDA_QGEMV_ROWS, for A/B runs), 0 (the default): by the rows */
  int qgemv_rows;
  /* its octets a lane in flight at one input row: 1 (the default), 2 or 4
   * ($LMSERVE_CUDA_QGEMV_OCTETS, for A/B runs) */
  int qgemv_octets;
  /* FP8 weights (kn-cuda-fp8.c): compute capability (89 = 8.9), which paths
   * passed their check, cuBLASLt's handle and workspace (NULL below 8.9) */
  int cc;
  int fp8_ok, fp8_gemv, fp8_lt;
  void *lt; /* cublasLtHandle_t (its header is read only by kn-cuda-fp8.c) */
  void *lt_ws;
};

/* An op's kernel launch (or cuBLAS call): skipped while a graph replays, since
 * the graph launches it; the op's host work (staging its arrays) still runs. */
#define KN_CUDA_RUN(c, call)                                                                       \
  do {                                                                                             \
    if ((c)->graph_mode != KN_GRAPH_REPLAY) KN_CUDA_CHECK(call);                                   \
  } while (0)
#define KN_CUBLAS_RUN(c, call)                                                                     \
  do {                                                                                             \
    if ((c)->graph_mode != KN_GRAPH_REPLAY) KN_CUBLAS_CHECK(call);                                 \
  } while (0)

/* kn_ids_take and kn_embed_dev against the host's answer on a small problem, on be
 * (made from c): sets c->ids_ok, warning when they differ; 0, or a device error. */
int kn_cuda_ids_check(struct kn_backend *be, struct kn_cuda_ctx *c);
/* Checks kn_sample's masks (greedy and sampled rows, penalties, a vocabulary that
 * is not a multiple of 32) against the same rows drawn from logits with -inf
 * where the masks refuse: sets c->mask_ok, warning when they differ (masked rows
 * are then drawn on the host); 0, or a device error. */
int kn_cuda_mask_check(struct kn_backend *be, struct kn_cuda_ctx *c);
/* The audio encoder's ops (kn-cuda-ops-audio.c) against their plain C
 * definitions on small problems: sets c->audio_ok, warning when they differ;
 * 0, or a device error. */
int kn_cuda_audio_check(struct kn_backend *be, struct kn_cuda_ctx *c);
int kn_cuda_op_sample_masks(void *ctx);

/* Step graphs (kn-cuda-graph.c): the ops table's entries, and what staging and
 * scratch call in a graph's modes. */
int kn_cuda_graph_new(void *ctx, int max_keys, void **g);
int kn_cuda_graph_begin(void *ctx, void *g, int mode);
int kn_cuda_graph_end(void *ctx, void *g, int ok);
void kn_cuda_graph_free(void *ctx, void *g);
/* capture / replay: the next slot of the arena for an array of bytes */
int kn_cuda_graph_slot(struct kn_cuda_ctx *c, size_t bytes, void **host, void **dev);
/* capture / replay: the graph's scratch, if it holds bytes */
int kn_cuda_graph_scratch(struct kn_cuda_ctx *c, size_t bytes, void **dev);
/* measure: notes a staged array's bytes (scratch 0) or a scratch request (stage 0) */
int kn_cuda_graph_note(struct kn_cuda_ctx *c, size_t stage_bytes, size_t scratch_bytes);
/* The context length attention plans for in a graph mode, else 0. */
int kn_cuda_graph_keys(const struct kn_cuda_ctx *c);
/* 0 outside graph modes; else CM_ERR_UNSUPPORTED, logged with the op's name:
 * for the ops that wait for the device or talk to other ranks. */
int kn_cuda_graph_refuse(const struct kn_cuda_ctx *c, const char *op);

/* NCCL collectives (kn-cuda-nccl.c; only in builds with NCCL). */
struct kn_backend_ops;
void kn_cuda_nccl_fill(struct kn_backend_ops *ops);
void kn_cuda_nccl_destroy(struct kn_cuda_ctx *c);

/* Converts a failed CUDA / cuBLAS call into a cm_err code, logging where. */
int kn_cuda_fail(cudaError_t e, const char *expr, const char *file, int line);
int kn_cublas_fail(cublasStatus_t st, const char *expr, const char *file, int line);

/* The bodies of the check macros below, one pair per foreign domain: `call`
 * returns a status of type T that is `ok` on success; a failure goes through
 * `fail` (which logs expr, the call's text, and where), then is returned, or
 * stored in err before a goto label. */
#define KN_CHECK_RETURN_(T, ok, fail, call, expr)                                                  \
  do {                                                                                             \
    T kn_st_ = (call);                                                                             \
    if (kn_st_ != (ok)) return fail(kn_st_, expr, __FILE__, __LINE__);                             \
  } while (0)
#define KN_CHECK_GOTO_(T, ok, fail, call, expr, err, label)                                        \
  do {                                                                                             \
    T kn_st_ = (call);                                                                             \
    if (kn_st_ != (ok)) {                                                                          \
      (err) = fail(kn_st_, expr, __FILE__, __LINE__);                                              \
      goto label;                                                                                  \
    }                                                                                              \
  } while (0)

#define KN_CUDA_CHECK(call) KN_CHECK_RETURN_(cudaError_t, cudaSuccess, kn_cuda_fail, call, #call)
#define KN_CUDA_CHECK_GOTO(call, err, label)                                                       \
  KN_CHECK_GOTO_(cudaError_t, cudaSuccess, kn_cuda_fail, call, #call, err, label)
#define KN_CUBLAS_CHECK(call)                                                                      \
  KN_CHECK_RETURN_(cublasStatus_t, CUBLAS_STATUS_SUCCESS, kn_cublas_fail, call, #call)
#define KN_CUBLAS_CHECK_GOTO(call, err, label)                                                     \
  KN_CHECK_GOTO_(cublasStatus_t, CUBLAS_STATUS_SUCCESS, kn_cublas_fail, call, #call, err, label)

/* Why cuBLAS / cuBLASLt could not be loaded (kn-cuda-blas.c loads them on
 * first use), or NULL once they are. */
const char *kn_cuda_blas_error(void);

/* Makes ctx's device current in the calling thread (0 or cm_err). */
int kn_cuda_enter(struct kn_cuda_ctx *c);

/* Reserves bytes (16-byte aligned) in the staging ring: *host is where to
 * write them, *dev where the device will read them once kn_cuda_stage_push
 * has been called. Waits only when a segment from the previous lap is still in
 * flight. 0 or cm_err. */
int kn_cuda_stage_alloc(struct kn_cuda_ctx *c, size_t bytes, void **host, void **dev);
/* Issues the host -> device copy of a reservation on the stream. */
int kn_cuda_stage_push(struct kn_cuda_ctx *c, const void *host, void *dev, size_t bytes);
/* alloc + memcpy + push: *dev receives the device copy of src[bytes]. */
int kn_cuda_stage(struct kn_cuda_ctx *c, const void *src, size_t bytes, void **dev);

/* Device scratch of at least bytes (grows, synchronising, when too small). */
int kn_cuda_scratch(struct kn_cuda_ctx *c, size_t bytes, void **dev);
/* Pinned host buffer of at least bytes for results. */
int kn_cuda_result_host(struct kn_cuda_ctx *c, size_t bytes, void **host);

/* 0 when every K / V element of the view is aligned to its size (a
 * misaligned device access would poison the CUDA context), else CM_ERR_INVAL. */
int kn_cuda_check_view(const struct kn_kv_view *v);

/* FP8 weights (kn-cuda-fp8.c): the op, whether FP8 is served, the check of
 * every path (run when the backend is made), the cuBLASLt teardown. */
int kn_cuda_op_matmul_fp8(void *ctx, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                          const uint8_t *w, const float *scale, int T, int N, int K,
                          int accumulate);
int kn_cuda_op_fp8_weights(void *ctx, char *why, size_t whylen);
int kn_cuda_fp8_check(struct kn_cuda_ctx *c);
void kn_cuda_fp8_destroy(struct kn_cuda_ctx *c);

/* Op glue (kn-cuda-ops.c, kn-cuda-gemm.c, kn-cuda-attn.c). */
int kn_cuda_op_embed(void *ctx, float *out, ptrdiff_t ldo, const void *table, enum kn_dtype tdt,
                     int H, const int32_t *ids, int T, float scale);
int kn_cuda_op_rmsnorm(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                       int rows, int d, const void *w, enum kn_dtype wdt, float eps,
                       enum kn_norm_mode mode);
int kn_cuda_op_rope(void *ctx, float *x, ptrdiff_t ldx, int T, int heads, int D, const int32_t *pos,
                    const float *inv_freq);
int kn_cuda_op_gelu_mul(void *ctx, float *out, ptrdiff_t ldo, const float *gate, ptrdiff_t ldg,
                        const float *up, ptrdiff_t ldu, int T, int N);
int kn_cuda_op_add(void *ctx, float *out, const float *a, const float *b, size_t n);
int kn_cuda_op_mul(void *ctx, float *out, const float *a, const float *b, size_t n);
int kn_cuda_op_scale(void *ctx, float *out, const float *a, float s, size_t n);
int kn_cuda_op_softcap(void *ctx, float *out, const float *a, float cap, size_t n);
int kn_cuda_op_copy_rows(void *ctx, float *dst, ptrdiff_t ldd, const float *src, ptrdiff_t lds,
                         int rows, int cols);
/* The fused ops (kn-cuda-fused.c); each declines (CM_ERR_UNSUPPORTED) what
 * its kernel does not take or what failed the check. */
int kn_cuda_op_add_norm(void *ctx, float *x, ptrdiff_t ldx, float *o, ptrdiff_t ldo, float *h,
                        ptrdiff_t ldh, int T, int H, const void *post_w, const void *next_w,
                        enum kn_dtype wdt, float scale, float eps, enum kn_norm_mode mode);
int kn_cuda_op_qkv_prep(void *ctx, const struct kn_qkv_prep_args *p, int T);
int kn_cuda_op_matmul_n(void *ctx, const float *in, ptrdiff_t ldi, enum kn_dtype wdt, int T, int K,
                        const struct kn_mm_part *parts, int n_parts);
int kn_cuda_op_matmul_glu(void *ctx, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                          const void *wg, const float *sg, const void *wu, const float *su,
                          enum kn_dtype wdt, int T, int N, int K);
/* Checks the fused kernels of a new backend against the unfused sequences
 * (kn_fused_check) and turns off what differs, saying so; an error only when
 * the check broke the device context. */
struct kn_backend;
int kn_cuda_fused_check(struct kn_backend *be);
int kn_cuda_op_argmax(void *ctx, int32_t *ids, float *max_out, const float *logits, ptrdiff_t ld,
                      int T, int V);
int kn_cuda_op_router_topk(void *ctx, int32_t *ids, float *weights, const float *logits,
                           ptrdiff_t ld, int T, int E, int k, const float *expert_scale);
int32_t *kn_cuda_op_kept_ids(void *ctx);
int kn_cuda_op_ids_take(void *ctx, int32_t *dst, const int32_t *ids, const int32_t *src,
                        const int32_t *map, int T);
int kn_cuda_op_embed_dev(void *ctx, float *out, ptrdiff_t ldo, const void *table, enum kn_dtype tdt,
                         int vocab, int H, const int32_t *ids, int T, float scale);
int kn_cuda_op_sample(void *ctx, struct kn_sample_out *out, const float *logits, ptrdiff_t ld,
                      int T, int V, const struct kn_sample_params *params);
int kn_cuda_op_kv_write(void *ctx, const struct kn_kv_view *view, const int32_t *slot_mapping,
                        const float *k, ptrdiff_t ldk, const float *v, ptrdiff_t ldv, int T);
/* Block-format weights (kn-cuda-quant.c): the matmul (T, N, K > 0), and
 * kn_block_check run on a new backend, which drops KN_CAP_BLOCK_WEIGHTS and
 * KN_CAP_BLOCK_LOWBIT from be, saying why, when a kernel differs (only the
 * latter where only formats of kn_dtype_lowbit did); an error only when the check broke
 * the device context. */
int kn_cuda_matmul_q(struct kn_cuda_ctx *c, float *out, ptrdiff_t ldo, const float *in,
                     ptrdiff_t ldi, const void *w, enum kn_dtype wdt, int T, int N, int K,
                     int accumulate);
int kn_cuda_quant_check(struct kn_backend *be, struct kn_cuda_ctx *c);
/* The few-rows matmul kernel against the cuBLAS path on bf16 and f16 weights
 * at T = 1, 3 and 8 (kn-cuda-gemm.c): 0 when they agree, else a cm_err (logged). */
int kn_cuda_gemv_check(struct kn_cuda_ctx *c);
int kn_cuda_op_matmul(void *ctx, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                      const void *w, enum kn_dtype wdt, int T, int N, int K, int accumulate);
int kn_cuda_op_matmul_rows(void *ctx, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                           const void *w, enum kn_dtype wdt, int K, const int32_t *rows, int n_rows,
                           int T);
int kn_cuda_op_attention(void *ctx, float *out, ptrdiff_t ldo, const float *q, ptrdiff_t ldq,
                         const struct kn_kv_view *view, const struct kn_attn_seq *seqs, int n_seqs,
                         int n_heads, int window, float scale, float softcap);
int kn_cuda_op_layernorm(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                         int rows, int d, const void *w, const void *b, enum kn_dtype wdt,
                         float eps);
int kn_cuda_op_bias_act(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                        const float *bias, int T, int N, enum kn_act act);
int kn_cuda_op_avg_pool2d(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                          int n_img, int side, int k, int C);
int kn_cuda_op_clamp(void *ctx, float *out, const float *a, float lo, float hi, size_t n);
int kn_cuda_op_avg_pool_grid(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                             int gw, int gh, int k, int C, float scale);
int kn_cuda_op_standardize(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                           int rows, int d, const float *bias, const float *scale);
int kn_cuda_op_conv3x3_s2(void *ctx, float *out, const float *x, const float *w, int T, int F,
                          int Cin, int Cout);
int kn_cuda_op_dwconv_causal(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                             const float *w, const int32_t *first, int T, int C, int K);
int kn_cuda_op_local_attn_rel(void *ctx, float *out, ptrdiff_t ldo, const float *q, ptrdiff_t ldq,
                              const float *k, ptrdiff_t ldk, const float *v, ptrdiff_t ldv,
                              const float *rel, const int32_t *span, int T, int heads, int hd,
                              int dmin, int dmax, float cap);
#endif /* !__CUDACC__ */

#endif
