/* kn-backend-impl.h — what a backend implements: the ops table behind the
 * opaque struct kn_backend. Only backends include this; users of kernels
 * include kn-backend.h.
 *
 * The public wrappers (kn-backend.c) validate every argument that input could
 * make wrong (sizes, strides, token ids, slot mappings, block tables) before
 * they call an op, so an op may assume:
 *   - sizes > 0 (an op with an empty shape is not called), strides >= row length,
 *   - dtypes are valid and supported by the backend (see `supports`),
 *   - every index it will read is inside its table / the pool. */
#ifndef LMSERVE_KN_BACKEND_IMPL_H
#define LMSERVE_KN_BACKEND_IMPL_H
#include "common/cm-err.h"
#include "kernels/kn-backend.h"
#include "kernels/kn-registry.h"

struct kn_backend_ops {
  const char *name; /* for logs: kn_backend_name */
  unsigned caps;    /* KN_CAP_* (kn-backend.h) */
  void (*destroy)(void *ctx);
  const char *(*matmul_inputs)(void *ctx); /* kn_backend_matmul_inputs; NULL: "f32" */

  void *(*alloc)(void *ctx, size_t bytes);
  void (*free)(void *ctx, void *p);
  int (*upload)(void *ctx, void *dst, const void *src, size_t bytes);
  int (*download)(void *ctx, void *dst, const void *src, size_t bytes);
  int (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
  int (*memset)(void *ctx, void *dst, int c, size_t bytes);
  int (*sync)(void *ctx);
  int (*mem_info)(void *ctx, size_t *free_bytes, size_t *total_bytes); /* NULL: unsupported */
  /* kn_weights_prepare (NULL: every weight stays as it is) */
  int (*weights_prepare)(void *ctx, void *w, enum kn_dtype *dt, int n, int K);

  int (*embed)(void *ctx, float *out, ptrdiff_t ldo, const void *table, enum kn_dtype tdt, int H,
               const int32_t *ids, int T, float scale);
  int (*rmsnorm)(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx, int rows,
                 int d, const void *w, enum kn_dtype wdt, float eps, enum kn_norm_mode mode);
  int (*matmul)(void *ctx, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi, const void *w,
                enum kn_dtype wdt, int T, int N, int K, int accumulate);
  /* matmul then softcap of every output; NULL: kn_matmul_softcap runs the two */
  int (*matmul_softcap)(void *ctx, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                        const void *w, enum kn_dtype wdt, int T, int N, int K, float cap);
  /* argmax of matmul (softcapped when cap > 0) per row, the outputs not
   * written anywhere; NULL: kn_matmul_argmax runs them through its scratch */
  int (*matmul_argmax)(void *ctx, int32_t *ids, float *max_out, const float *in, ptrdiff_t ldi,
                       const void *w, enum kn_dtype wdt, int T, int N, int K, float cap);
  /* kn_matmul_argmax_masked; NULL: not supported */
  int (*matmul_argmax_masked)(void *ctx, int32_t *ids, float *max_out, const float *in,
                              ptrdiff_t ldi, const void *w, enum kn_dtype wdt, int T, int N, int K,
                              float cap, const uint32_t *const *allow);
  int (*matmul_rows)(void *ctx, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                     const void *w, enum kn_dtype wdt, int K, const int32_t *rows, int n_rows,
                     int T);
  /* kn_matmul_fp8; fp8_weights: kn_fp8_weights (NULL: no) */
  int (*matmul_fp8)(void *ctx, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                    const uint8_t *w, const float *scale, int T, int N, int K, int accumulate);
  int (*fp8_weights)(void *ctx, char *why, size_t whylen);
  int (*rope)(void *ctx, float *x, ptrdiff_t ldx, int T, int heads, int D, const int32_t *pos,
              const float *inv_freq);
  int (*gelu_mul)(void *ctx, float *out, ptrdiff_t ldo, const float *gate, ptrdiff_t ldg,
                  const float *up, ptrdiff_t ldu, int T, int N);
  int (*add)(void *ctx, float *out, const float *a, const float *b, size_t n);
  int (*mul)(void *ctx, float *out, const float *a, const float *b, size_t n);
  int (*scale)(void *ctx, float *out, const float *a, float s, size_t n);
  int (*softcap)(void *ctx, float *out, const float *a, float cap, size_t n);
  int (*copy_rows)(void *ctx, float *dst, ptrdiff_t ldd, const float *src, ptrdiff_t lds, int rows,
                   int cols);
  /* fused ops (kn-backend.h); NULL, or CM_ERR_UNSUPPORTED from the op (a call
   * it declines): the public call runs the unfused sequence instead */
  int (*add_norm)(void *ctx, float *x, ptrdiff_t ldx, float *o, ptrdiff_t ldo, float *h,
                  ptrdiff_t ldh, int T, int H, const void *post_w, const void *next_w,
                  enum kn_dtype wdt, float scale, float eps, enum kn_norm_mode mode);
  int (*qkv_prep)(void *ctx, const struct kn_qkv_prep_args *p, int T);
  int (*matmul_n)(void *ctx, const float *in, ptrdiff_t ldi, enum kn_dtype wdt, int T, int K,
                  const struct kn_mm_part *parts, int n_parts);
  int (*matmul_glu)(void *ctx, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                    const void *wg, const float *sg, const void *wu, const float *su,
                    enum kn_dtype wdt, int T, int N, int K);
  int (*argmax)(void *ctx, int32_t *ids, float *max_out, const float *logits, ptrdiff_t ld, int T,
                int V);
  int (*router_topk)(void *ctx, int32_t *ids, float *weights, const float *logits, ptrdiff_t ld,
                     int T, int E, int k, const float *expert_scale);
  int (*sample)(void *ctx, struct kn_sample_out *out, const float *logits, ptrdiff_t ld, int T,
                int V, const struct kn_sample_params *params);
  int (*kv_write)(void *ctx, const struct kn_kv_view *view, const int32_t *slot_mapping,
                  const float *k, ptrdiff_t ldk, const float *v, ptrdiff_t ldv, int T);
  int (*attention)(void *ctx, float *out, ptrdiff_t ldo, const float *q, ptrdiff_t ldq,
                   const struct kn_kv_view *view, const struct kn_attn_seq *seqs, int n_seqs,
                   int n_heads, int window, float scale, float softcap);

  /* vision encoder ops; NULL: CM_ERR_UNSUPPORTED */
  int (*layernorm)(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx, int rows,
                   int d, const void *w, const void *b, enum kn_dtype wdt, float eps);
  int (*bias_act)(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                  const float *bias, int T, int N, enum kn_act act);
  int (*avg_pool2d)(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx, int n_img,
                    int side, int k, int C);
  int (*clamp)(void *ctx, float *out, const float *a, float lo, float hi, size_t n);
  int (*avg_pool_grid)(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx, int gw,
                       int gh, int k, int C, float scale);
  int (*standardize)(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx, int rows,
                     int d, const float *bias, const float *scale);

  /* audio encoder ops (kn-audio.c); NULL, or CM_ERR_UNSUPPORTED from the op:
   * the public call runs the host definition instead */
  int (*conv3x3_s2)(void *ctx, float *out, const float *x, const float *w, int T, int F, int Cin,
                    int Cout);
  int (*dwconv_causal)(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                       const float *w, const int32_t *first, int T, int C, int K);
  int (*local_attn_rel)(void *ctx, float *out, ptrdiff_t ldo, const float *q, ptrdiff_t ldq,
                        const float *k, ptrdiff_t ldk, const float *v, ptrdiff_t ldv,
                        const float *rel, const int32_t *span, int T, int heads, int hd, int dmin,
                        int dmax, float cap);

  /* collectives (KN_CAP_ALLREDUCE; kn-backend.h): the public wrappers check the
   * arguments and that the backend has joined a group before they call these */
  int (*comm_id_new)(void *ctx, struct kn_comm_id *id);
  int (*comm_join)(void *ctx, const struct kn_comm_id *id, int rank, int world, int timeout_ms);
  int (*all_reduce_sum)(void *ctx, float *buf, size_t n);
  int (*all_gather)(void *ctx, const void *mine, size_t bytes, void *all);

  /* ids kept on the backend (kn_kept_ids, kn_ids_take, kn_embed_dev). kept_ids NULL:
   * backend memory is the host's and kn-ids.c does all three there; else kept_ids
   * gives the [KN_KEPT_IDS_MAX] buffer where argmax and sample leave the ids of
   * calls of up to that many rows, and the other two are the backend's own. */
  int32_t *(*kept_ids)(void *ctx);
  /* kn_sample_takes_masks; NULL: when backend memory is the host's */
  int (*sample_masks)(void *ctx);
  int (*ids_take)(void *ctx, int32_t *dst, const int32_t *ids, const int32_t *src,
                  const int32_t *map, int T);
  int (*embed_dev)(void *ctx, float *out, ptrdiff_t ldo, const void *table, enum kn_dtype tdt,
                   int vocab, int H, const int32_t *ids, int T, float scale);

  /* step graphs (kn-backend.h); graph_new NULL: none. The wrappers check the
   * modes' order and pass the backend's own graph object. */
  int (*graph_new)(void *ctx, int max_keys, void **g);
  int (*graph_begin)(void *ctx, void *g, int mode);
  int (*graph_end)(void *ctx, void *g, int ok);
  void (*graph_free)(void *ctx, void *g);
};

struct kn_op_profile; /* kn-backend.c: $LMSERVE_OP_PROFILE's per-op times */

struct kn_backend {
  const struct kn_backend_ops *ops;
  unsigned caps;              /* KN_CAP_*: ops->caps, less KN_CAP_BLOCK_WEIGHTS when the
                                 backend's check of its block kernels failed at creation */
  void *ctx;                  /* owned; ops->destroy frees it */
  int comm_world;             /* ranks of the group joined by kn_comm_join; 0: none yet */
  struct kn_op_profile *prof; /* NULL unless $LMSERVE_OP_PROFILE is set */
  int32_t *kept;              /* [KN_KEPT_IDS_MAX] host copy of the kept ids (no kept_ids op) */
  int n_kept;                 /* rows kn_kept_ids answers */
};

/* After a sampling call of T rows that returned rc: what kn_kept_ids answers from
 * now on; on a backend of host memory the ids (each `stride` bytes after the
 * last, from ids) are copied into be->kept. */
void kn__keep_ids(struct kn_backend *be, int rc, const int32_t *ids, size_t stride, int T);

/* ---- for the public wrappers (kn-backend.c, kn-fused.c) -------------------- */

/* Start and end of a profiled op call (kn-backend.c's $LMSERVE_OP_PROFILE);
 * the end returns rc. */
void kn__prof_begin(struct kn_backend *be);
int kn__prof_end(struct kn_backend *be, const char *name, int rc);

/* Calls op `name` of be, or answers CM_ERR_UNSUPPORTED when the backend lacks it. */
#define KN_CALL(name, ...)                                                                         \
  (!be->ops->name ? CM_ERR_UNSUPPORTED                                                             \
   : !be->prof                                                                                     \
       ? be->ops->name(be->ctx, __VA_ARGS__)                                                       \
       : (kn__prof_begin(be), kn__prof_end(be, #name, be->ops->name(be->ctx, __VA_ARGS__))))

static inline int kn__valid_weight_dtype(enum kn_dtype dt) {
  return dt == KN_DTYPE_F32 || dt == KN_DTYPE_F16 || dt == KN_DTYPE_BF16;
}

/* A weight a matmul or an embedding may take on be: the element types, or one
 * of the block formats (kn-quant.h) where be has KN_CAP_BLOCK_WEIGHTS (and
 * KN_CAP_BLOCK_LOWBIT for those of kn_dtype_lowbit) and the rows (K elements)
 * are whole blocks. 0, CM_ERR_UNSUPPORTED or CM_ERR_INVAL. */
static inline int kn__check_matmul_dtype(const struct kn_backend *be, enum kn_dtype dt, int K) {
  if (kn__valid_weight_dtype(dt)) return 0;
  if (!kn_block_elems(dt) || !(be->caps & KN_CAP_BLOCK_WEIGHTS)) return CM_ERR_UNSUPPORTED;
  if (kn_dtype_lowbit(dt) && !(be->caps & KN_CAP_BLOCK_LOWBIT)) return CM_ERR_UNSUPPORTED;
  if (kn_dtype_x16(dt) && !be->ops->weights_prepare) return CM_ERR_UNSUPPORTED; /* not its own */
  return K % kn_block_elems(dt) ? CM_ERR_INVAL : 0;
}

/* kn_embed's op for T ids (each in [-1, vocab)), a table in an X16 layout
 * (kn_weights_prepare: host memory) included: its rows as their format's first. */
int kn__embed_rows(struct kn_backend *be, float *out, ptrdiff_t ldo, const void *table,
                   enum kn_dtype tdt, int vocab, int H, const int32_t *ids, int T, float scale);

/* A [rows, cols] operand with row stride ld: ld >= cols (ld may be anything when
 * rows == 1, as long as it is not negative). */
static inline int kn__valid_ld(ptrdiff_t ld, int rows, int cols) {
  if (ld < 0) return 0;
  return rows <= 1 || ld >= cols;
}

/* kn_kv_write's checks of its arguments (0 or a cm_err), for the ops that write K/V. */
int kn__check_kv_write(const struct kn_kv_view *view, const int32_t *slot_mapping, const float *k,
                       ptrdiff_t ldk, const float *v, ptrdiff_t ldv, int T);

/* The unfused sequences the fused ops stand for (kn-fused.c), on valid
 * arguments: what a fused kernel is checked against. */
int kn__seq_add_norm(struct kn_backend *be, float *x, ptrdiff_t ldx, float *o, ptrdiff_t ldo,
                     float *h, ptrdiff_t ldh, int T, int H, const void *post_w, const void *next_w,
                     enum kn_dtype wdt, float scale, float eps, enum kn_norm_mode mode);
int kn__seq_qkv_prep(struct kn_backend *be, const struct kn_qkv_prep_args *p, int T);
int kn__seq_matmul_n(struct kn_backend *be, const float *in, ptrdiff_t ldi, enum kn_dtype wdt,
                     int T, int K, const struct kn_mm_part *parts, int n_parts);
int kn__seq_matmul_glu(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *in,
                       ptrdiff_t ldi, const void *wg, const float *sg, const void *wu,
                       const float *su, enum kn_dtype wdt, int T, int N, int K, float *scratch);

/* The fused ops, as bits of kn_fused_check's answer. */
enum {
  KN_FUSED_ADD_NORM = 1u << 0,
  KN_FUSED_QKV_PREP = 1u << 1,
  KN_FUSED_MATMUL_N = 1u << 2,
  KN_FUSED_MATMUL_GLU = 1u << 3,
  KN_FUSED_MATMUL_N_FP8 = 1u << 4, /* the two matmul ops over FP8 weights, checked apart */
  KN_FUSED_MATMUL_GLU_FP8 = 1u << 5,
};

/* Each fused op be has (ops->add_norm, ...) against its unfused sequence on be
 * itself, over small random problems (kn-fused-check.c: odd sizes, the norm
 * modes, scales, weight and KV dtypes, FP8 weights where be has
 * kn_matmul_fp8, layers with and without K/V). Returns
 * the KN_FUSED_* bits of the ops that differ by more than tol (the largest
 * difference over the largest magnitude of the sequence's result; 0: the same
 * bits) or whose call failed, and names the first in why[whylen]. A backend
 * runs it when it is made and stops using what fails. */
unsigned kn_fused_check(struct kn_backend *be, double tol, char *why, size_t whylen);

/* The block-format ops of be (kn_matmul at T = 1, 3 accumulating, 8, 13 and
 * 37; kn_matmul_argmax with a softcap at T = 2, 13 and 37; kn_embed;
 * kn_embed_dev)
 * for every block format (those of kn_dtype_lowbit on random blocks), on rows
 * of 3 blocks and 37 outputs, against the
 * host's reference (kn-block-check.c): kn_dequant_row's values, rounded to
 * bf16 with the inputs in calls of more than bf16_above rows, products
 * summed in double. A matmul output may differ by tol times the sum of its
 * products' magnitudes; embeddings must be the reference's bits. Returns the
 * formats that failed (bits 1u << dtype) and names the first failure in
 * why[whylen]. A backend with KN_CAP_BLOCK_WEIGHTS runs it when it is made. */
unsigned kn_block_check(struct kn_backend *be, int bf16_above, double tol, char *why,
                        size_t whylen);

/* Wraps ops + ctx into a backend handle (malloc'd); NULL on failure (the
 * caller then still owns ctx). */
struct kn_backend *kn_backend_wrap(const struct kn_backend_ops *ops, void *ctx);

/* ---- the registry (kn-registry.h) ----------------------------------------- */

/* One entry of the registry: how a backend is named, found usable, and made. */
struct kn_backend_reg {
  const char *name;    /* what --device takes: "cpu", "cuda" */
  const char *summary; /* one line for listings */
  int priority;        /* the automatic choice takes the usable entry with the
                          highest priority (the earlier one on a tie) */
  unsigned caps;       /* KN_CAP_* of every backend that create makes (KN_CAP_BLOCK_WEIGHTS:
                          unless its check at creation failed) */
  /* 0 when a backend can be made here, else a negative cm_err with the
   * reason in why[whylen] ("no CUDA device is visible"). Cheap enough to
   * call once per process; never aborts. */
  int (*probe)(char *why, size_t whylen);
  /* Makes a backend with o (never NULL); 0 and *out, or a negative cm_err
   * with the reason in err[errlen]. Called only after probe said 0. */
  int (*create)(const struct kn_backend_opts *o, struct kn_backend **out, char *err, size_t errlen);
};

/* The entries each backend defines (kernels/cpu, kernels/cuda). */
extern const struct kn_backend_reg kn_cpu_backend_reg;
extern const struct kn_backend_reg kn_cuda_backend_reg;

/* kn_backend_choose over an explicit table of n entries (the registry's own
 * choice is this over the built-in table; tests pass tables of their own).
 * name NULL, "" or "auto" is the automatic choice; no environment is read. */
int kn_backend_choose_from(const struct kn_backend_reg *const *table, int n, const char *name,
                           const struct kn_backend_reg **out, char *err, size_t errlen);

#endif
