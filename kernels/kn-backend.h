/* kn-backend.h — the kernel backend interface: memory hooks and the ops that
 * the Gemma 3 / Gemma 4 forward pass needs.
 *
 * A backend is an opaque handle (a table of function pointers plus a context,
 * see kn-backend-impl.h). The CPU backend (kernels/cpu/kn-cpu.h) is the oracle;
 * the CUDA backend implements the same table on the device.
 *
 * Memory contract:
 *   - Tensor pointers (activations, weights, KV pool, RoPE tables, logits) are
 *     BACKEND memory: obtained from kn_alloc (or, on the CPU backend, any host
 *     memory, since its hooks are the identity).
 *   - Small index arrays (token ids, positions, slot mappings, block tables,
 *     sequence descriptors, bidirectional ranges) and the results of argmax /
 *     top-k are HOST memory; the backend stages them as it needs.
 *   - Activations are f32, rows contiguous; "ld" arguments are row strides in
 *     elements (floats), >= the row length.
 *   - Outputs may alias inputs only where an op says so.
 *
 * Every op returns 0 or a negative cm_err code (cm-err.h): CM_ERR_INVAL for a
 * bad argument (negative sizes, NULL, stride too small), CM_ERR_UNSUPPORTED for
 * a dtype/shape the backend does not handle, CM_ERR_RANGE for an index (token
 * id, page id, block-table entry) outside its table. Ops never abort on such
 * input.
 *
 * Batch invariance: on the CPU backend every output row is computed with a
 * fixed reduction order that depends only on that row's inputs (and, for
 * attention, on absolute positions): the same bits whatever the batch size T,
 * the other rows of the call, the thread count or how a prompt was chunked.
 *
 * Threads: a backend handle is used by one thread at a time (ops run their
 * own worker threads inside); separate handles are independent. */
#ifndef LMSERVE_KN_BACKEND_H
#define LMSERVE_KN_BACKEND_H
#include <stddef.h>
#include <stdint.h>

#include "kernels/kn-dtype.h"

struct kn_backend;

/* ---- lifetime and memory ------------------------------------------------ */

/* Destroys a backend made by kn_backend_open (kn-registry.h) or a
 * kn_*_backend_create(); NULL is a no-op. */
void kn_backend_destroy(struct kn_backend *be);
/* For logs and metrics only: "cpu-ref", "cpu-avx2", "cpu-avx2vnni", "cpu-avx512",
 * "cpu-avx512bf16", "cpu-amx" (the CPU backend and its kernel set), "cuda". Behaviour is
 * chosen by capability (kn_backend_has), never by this name. */
const char *kn_backend_name(const struct kn_backend *be);
/* For logs and metrics only: the precision the matmuls take their inputs in,
 * "f32" (the CPU's default), "bf16" (the CPU's --dtype bfloat16) or "weights"
 * (CUDA: narrowed to the weights' type, bf16 or f16; f32 weights stay f32). */
const char *kn_backend_matmul_inputs(const struct kn_backend *be);

/* What a backend can do, as bits of kn_backend_caps(). A registered backend
 * (kn-registry.h) announces the same bits before it is created (a made one
 * may lack KN_CAP_BLOCK_WEIGHTS, below). */
enum kn_backend_cap {
  /* Backend memory is the process's host memory: kn_alloc'd pointers are
   * ordinary pointers and any host buffer (an mmap'd checkpoint) may be
   * passed where backend memory is expected. Without it, backend memory is a
   * device's, reached only through kn_upload / kn_download, and kn_mem_info
   * reports how much of it is free. */
  KN_CAP_HOST_MEMORY = 1u << 0,
  /* kn_sample runs on the backend itself, where the logits are: only token
   * ids and logprobs come back to the host. */
  KN_CAP_SAMPLE = 1u << 1,
  /* Collectives across the ranks of a tensor-parallel group: kn_comm_join,
   * kn_all_reduce_sum, kn_all_gather. */
  KN_CAP_ALLREDUCE = 1u << 2,
  /* Weights in ggml's block formats (kn-quant.h: Q8_0, Q4_0, ... Q6_K) for
   * kn_matmul, kn_matmul_softcap, kn_matmul_argmax and kn_embed: each block
   * dequantized exactly as kn_dequant_row does, then the f32 arithmetic of an
   * f32 weight. Rows of whole blocks. A backend whose block kernels fail
   * their check when it is made (kn_block_check) goes without it, though
   * its registry entry announces it. */
  KN_CAP_BLOCK_WEIGHTS = 1u << 3,
  /* The block formats llama.cpp's 2- and 3-bit and non-linear files add
   * (Q3_K, IQ4_NL, IQ4_XS, Q2_K: kn_dtype_lowbit) as KN_CAP_BLOCK_WEIGHTS has
   * the others; dropped alone where only their kernels fail the check. */
  KN_CAP_BLOCK_LOWBIT = 1u << 4,
};

/* The KN_CAP_* bits of be (0 for NULL). */
unsigned kn_backend_caps(const struct kn_backend *be);
/* 1 when be has every bit of caps, else 0. */
int kn_backend_has(const struct kn_backend *be, unsigned caps);

/* Backend memory, 64-byte aligned, uninitialised. NULL on failure or bytes == 0. */
void *kn_alloc(struct kn_backend *be, size_t bytes);
void kn_free(struct kn_backend *be, void *p);
/* Host -> backend, backend -> host, backend -> backend copies; 0 or cm_err. */
int kn_upload(struct kn_backend *be, void *dst, const void *src, size_t bytes);
int kn_download(struct kn_backend *be, void *dst, const void *src, size_t bytes);
int kn_copy(struct kn_backend *be, void *dst, const void *src, size_t bytes);
/* Sets bytes of backend memory to byte value c. */
int kn_memset(struct kn_backend *be, void *dst, int c, size_t bytes);
/* Waits until every op issued so far has finished (no-op on CPU). */
int kn_sync(struct kn_backend *be);
/* Device memory: *free_bytes and *total_bytes of the backend's device (what
 * other processes hold counts as in use). CM_ERR_UNSUPPORTED on backends
 * whose memory is the host's (CPU). */
int kn_mem_info(struct kn_backend *be, size_t *free_bytes, size_t *total_bytes);

/* Lets be lay a weight out for its kernels: the n rows of K elements of *dt at
 * w (be's memory, writable) may be rearranged in place into a layout of be's
 * own, which *dt then names (the CPU's q8 mode: Q8_0, Q4_0 and Q5_0 rows as
 * KN_DTYPE_Q8_0_X16, _Q4_0_X16 and _Q5_0_X16, kn-quant.h). Such a weight goes
 * only, with all its n rows, to kn_matmul, kn_matmul_softcap, kn_matmul_n,
 * kn_matmul_glu, kn_matmul_argmax(_masked), kn_embed and kn_embed_dev (vocab
 * n), on be. 0 (*dt unchanged where be keeps the rows as they are) or a cm_err. */
int kn_weights_prepare(struct kn_backend *be, void *w, enum kn_dtype *dt, int n, int K);

/* ---- collectives (KN_CAP_ALLREDUCE) -------------------------------------- */

/* What joins the ranks of one tensor-parallel group: made by rank 0 with
 * kn_comm_id_new and handed to every rank (the scheduler relays it in a DIST
 * message; no shared file system). Opaque bytes: the CPU backend's shared
 * memory segment name, or NCCL's unique id. */
#define KN_COMM_ID_BYTES 128
struct kn_comm_id {
  unsigned char bytes[KN_COMM_ID_BYTES] __attribute__((aligned(8))); /* read as uint32 words */
};

/* Makes a fresh id for a new group (rank 0 only). */
int kn_comm_id_new(struct kn_backend *be, struct kn_comm_id *id);
/* Joins be to the group of `world` ranks named by id as `rank`. Every rank calls it;
 * it returns once the group is formed, or CM_ERR_TIMEOUT after timeout_ms (ranks load
 * their weights at different speeds: give them time). A collective that a peer never
 * joins (it died or stopped) fails within KN_COMM_CALL_TIMEOUT_MS, and every
 * collective after a failure fails at once: the caller reports it and exits. world 1
 * needs no id. A backend joins one group, once. */
#define KN_COMM_CALL_TIMEOUT_MS 1000
int kn_comm_join(struct kn_backend *be, const struct kn_comm_id *id, int rank, int world,
                 int timeout_ms);
/* Ranks in be's group (1 when it joined none). */
int kn_comm_world(const struct kn_backend *be);
/* buf[n] (backend memory) = its sum over the group's ranks, in place; the same bits
 * on every rank. A no-op in a group of one. */
int kn_all_reduce_sum(struct kn_backend *be, float *buf, size_t n);
/* all[world][bytes] (backend memory) = every rank's mine[bytes], in rank order. */
int kn_all_gather(struct kn_backend *be, const void *mine, size_t bytes, void *all);

/* ---- dense ops ---------------------------------------------------------- */

/* out[T, H] (row stride ldo) = table[ids[t], :] * scale.
 * table: [vocab, H] of dtype tdt (backend memory); ids: [T] host.
 * An id of -1 gives a zero row (on a vocab-parallel rank, a token whose row another
 * rank holds); any other id outside [0, vocab) gives CM_ERR_RANGE (nothing written). */
int kn_embed(struct kn_backend *be, float *out, ptrdiff_t ldo, const void *table, enum kn_dtype tdt,
             int vocab, int H, const int32_t *ids, int T, float scale);

enum kn_norm_mode {
  KN_NORM_MUL_W = 0,          /* Gemma 4: x * rsqrt(mean(x^2) + eps) * w */
  KN_NORM_MUL_ONE_PLUS_W = 1, /* Gemma 3: x * rsqrt(mean(x^2) + eps) * (1 + w) */
  KN_NORM_NO_W = 2,           /* weightless: x * rsqrt(mean(x^2) + eps) */
};

/* RMSNorm of `rows` rows of d elements, in f32:
 *   out[r, :] (stride ldo) = norm(x[r, :] (stride ldx)) with weight w[d] (dtype wdt;
 *   ignored for KN_NORM_NO_W, may be NULL then).
 * Per head: rows = T * heads, d = head_dim, ld = head_dim (contiguous heads) —
 * or call once per token with the token stride. out == x (same ld) is allowed. */
int kn_rmsnorm(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
               int rows, int d, const void *w, enum kn_dtype wdt, float eps,
               enum kn_norm_mode mode);

/* out[T, N] (stride ldo) {=, +=} in[T, K] (stride ldi) · W[N, K]^T.
 * W: Hugging Face layout, row n is output feature n, contiguous [N, K] of dtype wdt.
 * accumulate != 0 adds into out. out must not alias in. */
int kn_matmul(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
              const void *w, enum kn_dtype wdt, int T, int N, int K, int accumulate);

/* out[T, N] = tanh(o / cap) * cap for o = in[T, K] · W[N, K]^T (cap > 0): the
 * vocabulary head with its final softcap. The same bits as kn_matmul followed
 * by kn_softcap on the rows; a backend may do both while the outputs are in
 * cache instead of in two passes over T x N floats. */
int kn_matmul_softcap(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *in,
                      ptrdiff_t ldi, const void *w, enum kn_dtype wdt, int T, int N, int K,
                      float cap);

/* ids[t] (host) = kn_argmax of row t of in[T, K] · W[N, K]^T, softcapped
 * first when cap > 0, and max_out[t] (host, may be NULL) its maximum: the
 * same answers as kn_matmul or kn_matmul_softcap followed by kn_argmax, for
 * greedy decoding. A backend may find each row's maximum while the outputs
 * are in cache, without writing them; one that does not computes them into
 * scratch ([T, N], stride N, backend memory), which is left undefined. */
int kn_matmul_argmax(struct kn_backend *be, int32_t *ids, float *max_out, const float *in,
                     ptrdiff_t ldi, const void *w, enum kn_dtype wdt, int T, int N, int K,
                     float cap, float *scratch);

/* kn_matmul_argmax over the outputs each row allows: allow[t] (host, [(N + 31) /
 * 32] words: bit n % 32 of word n / 32 set when output n may win; NULL: every
 * one) as a structured output's mask (kn_sample_params.allow) restricts a greedy
 * draw: ids[t] is the first maximum of row t's allowed outputs, what kn_sample
 * draws for a greedy row with that mask, without the outputs written, and
 * max_out[t] (host, may be NULL) that maximum. A row that allows none (or only
 * NaN) gets id -1 and NaN. CM_ERR_UNSUPPORTED where the backend has no such op
 * (the caller computes the logits and samples them). */
int kn_matmul_argmax_masked(struct kn_backend *be, int32_t *ids, float *max_out, const float *in,
                            ptrdiff_t ldi, const void *w, enum kn_dtype wdt, int T, int N, int K,
                            float cap, const uint32_t *const *allow);

/* FP8 weights (--quantization fp8, FP8 checkpoints): out[T, N] (stride ldo)
 * {=, +=} scale[n] * (in[T, K] rounded to bf16 · e4m3(W)[N, K]^T), with W
 * [N, K] e4m3 codes (OCP E4M3FN, kn-dtype.h) and scale [N] f32 per output
 * feature, both backend memory. Products are exact in f32 (8 + 4 significant
 * bits), sums are f32 in an order the backend picks, so backends agree to
 * rounding, not to the bit. A backend whose kn_fp8_weights says so may, from
 * KN_FP8_ACT_MIN_T rows on, also quantize each input row to e4m3 with scale
 * (its largest magnitude) / 448 and multiply on FP8 tensor cores (vLLM's
 * per-token dynamic scheme); the CPU never does. CM_ERR_UNSUPPORTED where the
 * backend has no FP8 kernels. */
int kn_matmul_fp8(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                  const uint8_t *w, const float *scale, int T, int N, int K, int accumulate);
#define KN_FP8_ACT_MIN_T 64

/* Whether be has FP8 weight kernels worth serving with (tensor cores with
 * FP8: compute capability 8.9 or newer, kernels that passed their check):
 * 0, or CM_ERR_UNSUPPORTED with the reason in why[whylen]. The CPU answers
 * no: its kn_matmul_fp8 is the reference the device kernels are checked
 * against, not a serving path (FP8 halves no CPU bound that bf16 has). */
int kn_fp8_weights(struct kn_backend *be, char *why, size_t whylen);

/* Quantizes a [N, K] weight to e4m3 per output feature, as --quantization
 * fp8 does: scale[n] = (largest |w[n, k]|, in f32) / 448 (1 for an all-zero
 * row) and q[n, k] = e4m3(w[n, k] / scale[n]) (f32 division, round to
 * nearest even, saturating). w: host [N, K] of wdt with row stride ldw
 * elements; q: host [N, K]; amax (may be NULL): the rows' largest magnitudes
 * to use instead of w's own (a column slice quantized as its whole row).
 * 0, or CM_ERR_RANGE at the first row with a value that is not finite. */
int kn_fp8_quantize_rows(uint8_t *q, float *scale, const void *w, enum kn_dtype wdt, ptrdiff_t ldw,
                         int N, int K, const float *amax);

/* Like kn_matmul over a subset of W's rows: out[T, n] = in[T, K] · W[rows[j], :]^T
 * for j < n_rows. rows: [n_rows] host; W has n_w rows; a row id outside
 * [0, n_w) gives CM_ERR_RANGE. Same per-element arithmetic as kn_matmul. */
int kn_matmul_rows(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                   const void *w, enum kn_dtype wdt, int n_w, int K, const int32_t *rows,
                   int n_rows, int T);

/* RoPE, rotate-half form, in place on x[T, heads, D] (token stride ldx floats,
 * heads contiguous with stride D). For pair i < D/2 of each head:
 *   a = pos[t] * inv_freq[i] (f32), c = cos(a), s = sin(a)
 *   x[i] <- x[i] * c - x[i + D/2] * s;   x[i + D/2] <- x[i + D/2] * c + x[i] * s
 * inv_freq: [D/2] backend memory (linear scaling divides it by the factor;
 * zero entries are the identity, which expresses partial / proportional RoPE).
 * pos: [T] host, >= 0. D must be even. */
int kn_rope(struct kn_backend *be, float *x, ptrdiff_t ldx, int T, int heads, int D,
            const int32_t *pos, const float *inv_freq);

/* out[T, N] = gelu_tanh(gate[T, N]) * up[T, N], each with its own row stride.
 * gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
 * out may alias gate or up (same stride). */
int kn_gelu_mul(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *gate, ptrdiff_t ldg,
                const float *up, ptrdiff_t ldu, int T, int N);

/* Elementwise over n contiguous floats; out may alias any input. */
int kn_add(struct kn_backend *be, float *out, const float *a, const float *b, size_t n);
int kn_mul(struct kn_backend *be, float *out, const float *a, const float *b, size_t n);
int kn_scale(struct kn_backend *be, float *out, const float *a, float s, size_t n);
/* out = tanh(a / cap) * cap; cap > 0. */
int kn_softcap(struct kn_backend *be, float *out, const float *a, float cap, size_t n);

/* 2-D f32 copy: dst[rows, cols] (stride ldd) = src[rows, cols] (stride lds)
 * (concatenations, slices of fused projections). Must not overlap. */
int kn_copy_rows(struct kn_backend *be, float *dst, ptrdiff_t ldd, const float *src, ptrdiff_t lds,
                 int rows, int cols);

/* ---- fused ops (kn-fused.c) ---------------------------------------------------
 * Each is the sequence of unfused ops its comment spells out, with its
 * results: a backend that has the op saves launches and passes over memory,
 * one that lacks it runs the sequence. The CPU backend gives the sequence's
 * bits; others agree with it within float rounding, and check their fused
 * kernels against the sequence when they are made (falling back to it, loudly,
 * if they differ). LMSERVE_FUSED=0 in the environment runs the sequences on
 * every backend (A/B comparisons). */

/* 0 when LMSERVE_FUSED=0 turned the fused ops off (read once), else 1. */
int kn_fused_enabled(void);

/* Gemma's sandwich-norm residual step, per row t < T of H elements:
 *   o[t] = rmsnorm(o[t], post_w);  x[t] = (x[t] + o[t]) * scale;
 *   h[t] = rmsnorm(x[t], next_w)   when h is not NULL
 * (kn_rmsnorm, kn_add, kn_scale — skipped when scale is 1 — and kn_rmsnorm):
 * a block's output joining the residual stream, and the next block's normed
 * input in the same pass. post_w, next_w: [H] of dtype wdt (ignored, may be
 * NULL, in KN_NORM_NO_W mode). o is left undefined (a fused kernel need not
 * write it back); x, o and h must not overlap. */
int kn_add_norm(struct kn_backend *be, float *x, ptrdiff_t ldx, float *o, ptrdiff_t ldo, float *h,
                ptrdiff_t ldh, int T, int H, const void *post_w, const void *next_w,
                enum kn_dtype wdt, float scale, float eps, enum kn_norm_mode mode);

/* One layer's attention inputs after its projections (kn_qkv_prep). */
struct kn_qkv_prep_args {
  float *q; /* [T, n_heads, D] (token stride ldq): normed and rotated in place */
  ptrdiff_t ldq;
  int n_heads;
  float *k, *v;          /* [T, view->n_kv_heads, D] (strides ldk, ldv), or both NULL: a
                            layer that reads another layer's cache writes nothing */
  ptrdiff_t ldk, ldv;    /* k and v are left undefined */
  const void *q_w, *k_w; /* [D] of dtype wdt (unused in KN_NORM_NO_W mode) */
  enum kn_dtype wdt;
  float eps;
  enum kn_norm_mode mode;
  int v_norm;                    /* 1: v gets a weightless RMSNorm (Gemma 4) */
  const int32_t *pos;            /* [T] host, >= 0 */
  const float *inv_freq;         /* [D / 2] backend memory, as kn_rope takes it */
  const struct kn_kv_view *view; /* D = view->head_dim; where K and V go */
  const int32_t *slots;          /* [T] host, as kn_kv_write's slot_mapping */
};

/* Per token t < T:
 *   q[t, h] = rope(rmsnorm(q[t, h], q_w), pos[t])             for h < n_heads
 * and when k is not NULL, for h < view->n_kv_heads:
 *   k[t, h] = rope(rmsnorm(k[t, h], k_w), pos[t]);  v[t, h] = rmsnorm(v[t, h]) if v_norm
 * then K and V written to the pages as kn_kv_write writes them (kn_rmsnorm
 * per head, kn_rope, kn_kv_write). */
int kn_qkv_prep(struct kn_backend *be, const struct kn_qkv_prep_args *p, int T);

/* One output of kn_matmul_n: out[T, N] (stride ldo) = in · W[N, K]^T. */
struct kn_mm_part {
  float *out;
  ptrdiff_t ldo;
  const void *w; /* [N, K] of the op's wdt (e4m3 codes for KN_DTYPE_F8E4M3) */
  int N;
  const float *scale; /* [N] f32 backend memory: the per-feature scales of FP8
                         weights (wdt KN_DTYPE_F8E4M3, required), else NULL */
};
#define KN_MM_MAX_PARTS 4

/* Several matmuls of one input (Q, K and V of a layer): each part as
 * kn_matmul(be, part.out, part.ldo, in, ldi, part.w, wdt, T, part.N, K, 0),
 * or for FP8 weights (wdt KN_DTYPE_F8E4M3) as
 * kn_matmul_fp8(be, part.out, part.ldo, in, ldi, part.w, part.scale, T, part.N, K, 0),
 * the same per-element arithmetic, in one launch where the backend can
 * (block formats: the CPU's q8 mode prepares the inputs once for all parts).
 * 1 <= n_parts <= KN_MM_MAX_PARTS; outputs must not overlap each other or in.
 * A part's scale missing for FP8, or given for another wdt: CM_ERR_INVAL. */
int kn_matmul_n(struct kn_backend *be, const float *in, ptrdiff_t ldi, enum kn_dtype wdt, int T,
                int K, const struct kn_mm_part *parts, int n_parts);

/* The gated MLP's first half: out[T, N] = gelu_tanh(in · Wg^T) * (in · Wu^T)
 * for Wg, Wu [N, K] of dtype wdt (kn_matmul of each, then kn_gelu_mul): a
 * backend may multiply the gate and up rows together and apply the GELU as
 * the epilogue. FP8 weights (wdt KN_DTYPE_F8E4M3): Wg, Wu e4m3 codes with
 * their per-feature scales sg, su ([N] f32 backend memory), each matmul
 * kn_matmul_fp8; sg and su must be NULL for any other wdt (CM_ERR_INVAL
 * otherwise, and when FP8 lacks one). scratch: [T, N] backend memory (stride
 * N) for a backend that runs the sequence (left undefined), NULL when the
 * caller knows it is not needed (kn_matmul_glu then answers CM_ERR_INVAL if
 * it is). */
int kn_matmul_glu(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                  const void *wg, const float *sg, const void *wu, const float *su,
                  enum kn_dtype wdt, int T, int N, int K, float *scratch);

/* ---- vision encoder ops (SigLIP) ----------------------------------------- */

/* LayerNorm of `rows` rows of d elements, in f32:
 *   out[r, :] (stride ldo) = (x - mean) / sqrt(var + eps) * w + b
 * over x[r, :] (stride ldx), var the biased (population) variance; w[d], b[d]
 * of dtype wdt (backend memory). out == x (same ld) is allowed. */
int kn_layernorm(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                 int rows, int d, const void *w, const void *b, enum kn_dtype wdt, float eps);

enum kn_act {
  KN_ACT_NONE = 0,      /* identity: a bias add */
  KN_ACT_GELU_TANH = 1, /* gelu_tanh as in kn_gelu_mul */
  KN_ACT_SILU = 2,      /* v / (1 + exp(-v)) */
  KN_ACT_RELU = 3,      /* max(v, 0) (NaN stays NaN) */
  KN_ACT_SIGMOID = 4,   /* 1 / (1 + exp(-v)) */
};

/* out[T, N] (stride ldo) = act(x[T, N] (stride ldx) + bias[N]): the bias and
 * activation of a Linear layer. bias: f32 backend memory, or NULL (no bias).
 * out == x (same ld) is allowed. */
int kn_bias_act(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                const float *bias, int T, int N, enum kn_act act);

/* Average pooling of square patch grids with kernel = stride = k (no padding;
 * trailing rows and columns that fill no whole window are dropped, as in
 * torch's AvgPool2d). x holds n_img grids of side x side rows of C features
 * (row stride ldx): patch (r, c) of image i is row i * side^2 + r * side + c.
 * With os = side / k (>= 1), out row i * os^2 + R * os + Q (stride ldo) is
 * the mean of the k x k patches (R * k + y, Q * k + z), y, z < k. */
int kn_avg_pool2d(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                  int n_img, int side, int k, int C);

/* ---- vision encoder ops (Gemma 4) ----------------------------------------
 * The 2D RoPE of Gemma 4's tower needs no op of its own: kn_rope over rows of
 * half-heads (row stride head_dim, one position per row) rotates each half by
 * its own axis. */

/* out = min(max(a, lo), hi) over n contiguous floats, as torch.clamp (NaN
 * stays NaN); lo <= hi (either may be infinite). out may alias a. */
int kn_clamp(struct kn_backend *be, float *out, const float *a, float lo, float hi, size_t n);

/* Average pooling of one gw x gh patch grid (patch (y, x) is row y * gw + x
 * of x[, C] with row stride ldx) with kernel = stride = k, times scale: out
 * row Y * (gw / k) + X (stride ldo) = scale * the mean of the k x k patches
 * (Y * k + j, X * k + i), summed in that order (j, then i). gw and gh must be
 * multiples of k (CM_ERR_SHAPE otherwise). */
int kn_avg_pool_grid(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *x,
                     ptrdiff_t ldx, int gw, int gh, int k, int C, float scale);

/* out[r, c] (stride ldo) = (x[r, c] (stride ldx) - bias[c]) * scale[c] for r <
 * rows, c < d: a feature-wise standardisation. bias, scale: [d] f32 backend
 * memory. out == x (same ld) is allowed. */
int kn_standardize(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                   int rows, int d, const float *bias, const float *scale);

/* ---- audio encoder ops (Gemma 4's Conformer; kn-audio.c) ------------------
 * Each has a plain C definition (kn_ref_* in kn-audio.h) that the CPU backend
 * runs and a device backend is checked against; where a backend lacks the
 * op, or declined it after a failed check, the call runs that definition on
 * the host (the inputs downloaded, the output uploaded: slow, correct). */

/* A 3 x 3 convolution with stride 2 and zero padding 1 over one T x F grid
 * of Cin channels, channels last: x [T, F, Cin] and out [To, Fo, Cout], both
 * contiguous, To = (T + 1) / 2, Fo = (F + 1) / 2:
 *   out[t, f, o] = sum over a, b < 3 and i < Cin (in that order) of
 *                  w[o, a, b, i] x[2t - 1 + a, 2f - 1 + b, i]   (0 outside)
 * w: [Cout, 3, 3, Cin] f32 backend memory (torch's Conv2d weight [Cout, Cin,
 * 3, 3] with the input channel moved last), no bias. out must not alias x. */
int kn_conv3x3_s2(struct kn_backend *be, float *out, const float *x, const float *w, int T, int F,
                  int Cin, int Cout);

/* A depthwise causal convolution along rows: out[t, c] (stride ldo) = sum
 * over j < K of w[c, j] x[t - K + 1 + j, c] (stride ldx), where rows before
 * first[t] read as 0 (first: host [T], the first row of t's sequence, <= t,
 * so sequences packed one after another do not see each other). w: [C, K]
 * f32 backend memory. out must not alias x. */
int kn_dwconv_causal(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *x,
                     ptrdiff_t ldx, const float *w, const int32_t *first, int T, int C, int K);

/* The most keys a row of kn_local_attn_rel may see (dmax - dmin + 1). */
#define KN_LOCAL_ATTN_MAX_KEYS 256

/* Local attention with relative-position logits (a Conformer's): for row t
 * < T and head h < heads (hd elements at offset h * hd of each row), the key
 * rows s of t's sequence (span: host [T][2], [begin, end) of t's sequence,
 * begin <= t < end) with d = t - s in [dmin, dmax] take part with logit
 *   l_s = cap tanh((q_t . k_s + q_t . rel[d - dmin]) / cap)
 * (the dot products each in f32 or better, then added; rel: [dmax - dmin + 1,
 * heads * hd] f32 backend memory, contiguous), and out_t = sum_s
 * softmax(l)_s v_s. A row that sees no key gets zeros. dmax - dmin + 1 is at
 * most KN_LOCAL_ATTN_MAX_KEYS; cap > 0. out must not alias the inputs. */
int kn_local_attn_rel(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *q,
                      ptrdiff_t ldq, const float *k, ptrdiff_t ldk, const float *v, ptrdiff_t ldv,
                      const float *rel, const int32_t *span, int T, int heads, int hd, int dmin,
                      int dmax, float cap);

/* ---- reductions whose results go to the host ------------------------------ */

/* ids[t] (host) = index of the maximum of logits[t, :V] (stride ld); the first
 * one on ties; NaN never wins (a row of NaN gives 0). max_out (host, may be NULL)
 * receives the maximum values. */
int kn_argmax(struct kn_backend *be, int32_t *ids, float *max_out, const float *logits,
              ptrdiff_t ld, int T, int V);

/* MoE router: for each row t of logits[T, E] (stride ld): p = softmax(row),
 * the k largest p (ties: lower index first) in descending order, renormalised to
 * sum 1, each multiplied by expert_scale[id] when expert_scale (backend memory, [E])
 * is not NULL. ids[T, k], weights[T, k]: host. 1 <= k <= E. */
int kn_router_topk(struct kn_backend *be, int32_t *ids, float *weights, const float *logits,
                   ptrdiff_t ld, int T, int E, int k, const float *expert_scale);

/* ---- sampling ------------------------------------------------------------ */

#define KN_SAMPLE_MAX_LOGPROBS 20
#define KN_SAMPLE_MAX_BIAS     2048 /* bias_ids of a bias_only row */
/* What a bias_only row's unlisted tokens (and a bad word's last token) become: no draw
 * takes one while another token has a real logit (exp of the gap is 0 in double), yet
 * the row stays finite, so that a row whose other constraints leave only such tokens
 * (a structured output's mask disjoint from allowed_token_ids) is still drawn */
#define KN_SAMPLE_NEVER (-1e30f)

/* Sampling parameters of one logits row (host memory). Processing order (as
 * vLLM's sampler): repetition / frequency / presence penalties on the raw
 * logits, the logit biases, then temperature (greedy below 1e-5: the argmax of the penalised
 * logits), min-p, top-k, top-p, renormalise, draw. */
struct kn_sample_params {
  float temperature;        /* >= 0; < 1e-5 = greedy */
  int top_k;                /* <= 0 or >= V: off */
  float top_p;              /* (0, 1]; 1 = off */
  float min_p;              /* [0, 1]; 0 = off */
  float presence_penalty;   /* subtracted once from tokens generated before; 0 = off */
  float frequency_penalty;  /* subtracted per generation of the token; 0 = off */
  float repetition_penalty; /* > 0; 1 = off: l > 0 ? l / r : l * r for prompt and output tokens */
  uint64_t seed;            /* the request's seed */
  uint64_t counter;         /* index of the token being sampled: the draw's counter */
  int n_logprobs;           /* -1: none; 0: the sampled token's; k <= 20: also the top k */
  /* Penalty state: the tokens seen so far, each once, with how often it was
   * generated (0 = in the prompt only). Entries with an id < 0 or >= V are
   * skipped (an open-addressing table may be passed as is). */
  const int32_t *pen_ids;    /* [n_pen] host */
  const int32_t *pen_counts; /* [n_pen] host */
  int n_pen;
  /* OpenAI's logit_bias: bias[i] added to token bias_ids[i]'s logit after the
   * penalties (ids outside [0, V) skipped). Logprobs stay the raw model's.
   * Backends where kn_sample_takes_bias is 0 answer CM_ERR_UNSUPPORTED for a row
   * with one. */
  const int32_t *bias_ids; /* [n_bias] host */
  const float *bias;       /* [n_bias] host */
  int n_bias;
  /* vLLM's allowed_token_ids: 1 when only the tokens of bias_ids may be drawn (each
   * listed once, at most KN_SAMPLE_MAX_BIAS; the others are KN_SAMPLE_NEVER after the
   * biases) */
  int bias_only;
  /* A structured output's mask (host, [(V + 31) / 32] words: bit id % 32 of word
   * id / 32 set when token id may be drawn), applied after the penalties and
   * before everything else; NULL: every token. Logprobs stay the raw model's.
   * Backends where kn_sample_takes_masks is 0 answer CM_ERR_UNSUPPORTED for a row
   * with one. */
  const uint32_t *allow;
};

/* 1 when be's kn_sample takes masks (kn_sample_params.allow): the CPU backend's
 * always; CUDA's once its masked draw passed its check at start-up (rows drawn
 * as from logits with -inf where the mask refuses). */
int kn_sample_takes_masks(struct kn_backend *be);

/* 1 when be's kn_sample takes logit biases (kn_sample_params.bias): the
 * backends whose memory is the host's (the CPU's). */
int kn_sample_takes_bias(struct kn_backend *be);

/* What kn_sample returns per row (host memory). Logprobs are those of the
 * RAW model distribution (log-softmax of the logits before any processing),
 * as vLLM reports them by default. */
struct kn_sample_out {
  int32_t token;
  float logprob;                           /* raw logprob of token (n_logprobs >= 0), else 0 */
  int n_top;                               /* entries in top_ids / top_logprobs: n_logprobs or 0 */
  int32_t top_ids[KN_SAMPLE_MAX_LOGPROBS]; /* largest raw logits first, lower id on ties */
  float top_logprobs[KN_SAMPLE_MAX_LOGPROBS];
};

/* Fills p with "off" for everything: temperature 1, no filters, no
 * penalties, no logprobs, seed and counter 0. */
void kn_sample_params_default(struct kn_sample_params *p);

/* 0 when p is valid (temperature >= 0, top_p in (0, 1], min_p in [0, 1],
 * repetition_penalty > 0, n_logprobs <= KN_SAMPLE_MAX_LOGPROBS, the penalty
 * arrays present when n_pen > 0, the bias arrays when n_bias > 0), else
 * CM_ERR_INVAL. */
int kn_sample_params_check(const struct kn_sample_params *p);

/* 1 when kn_sample's answer for a row with params p is its kn_argmax and
 * nothing else (valid, greedy, no penalty, no bias, no logprobs): the token
 * kn_matmul_argmax finds, with logprob 0 and no top entries. */
int kn_sample_is_argmax(const struct kn_sample_params *p);

/* Samples one token per row of logits[T, V] (stride ld, backend memory, left
 * unchanged) with params[T] (host); out[T] (host). Waits for the result.
 *
 * What is guaranteed across backends:
 *   - greedy rows: exactly kn_argmax of the penalised logits (the penalties
 *     are the same float operations everywhere);
 *   - random rows: a draw from the filtered distribution (the candidate set
 *     after min-p / top-k / top-p and its renormalised probabilities), which
 *     agrees with the CPU's within float rounding of the sums (a token at the
 *     top-p boundary may differ); the draw itself is backend-specific but
 *     depends only on (seed, counter, logits, params): the same on one device
 *     whatever the batch;
 *   - logprobs: the raw log-softmax within float rounding; top ids exact
 *     except at ties.
 * The CPU backend's draw is the worker sampler's (worker/wk-sampler.h): one
 * uniform from (seed, counter) walked down the cumulative distribution.
 * A row whose logits are all NaN or -inf after processing gives CM_ERR_INVAL. */
int kn_sample(struct kn_backend *be, struct kn_sample_out *out, const float *logits, ptrdiff_t ld,
              int T, int V, const struct kn_sample_params *params);

/* ---- ids that stay on the backend (device-resident steps) ------------------
 *
 * A step's sampled ids can feed the next step's embedding without a round trip
 * through the host: the sampling calls keep their ids where they computed them,
 * kn_ids_take puts some of them among a step's host ids, and kn_embed_dev looks
 * the result up. All three may be recorded in a step graph (their host arrays
 * are staged; the kept ids' buffer never moves). */

#define KN_KEPT_IDS_MAX 4096 /* rows a sampling call keeps, at most */

/* The ids of be's latest kn_sample (its tokens), kn_argmax, kn_matmul_argmax or
 * kn_matmul_argmax_masked call, one per row, in backend memory at *ids: the same
 * pointer for the backend's lifetime, its contents replaced by the next such call
 * (on a device, when that call runs on the stream). Returns how many: that call's
 * T, or 0 when it failed, had more than KN_KEPT_IDS_MAX rows, or none was made. */
int kn_kept_ids(struct kn_backend *be, const int32_t **ids);

/* dst[t] (backend memory, [T]) = map[t] < 0 ? ids[t] : src[map[t]]: a step's
 * token ids with some rows taken from backend memory (src [n_src], such as
 * kn_kept_ids) that the host never reads. ids, map: [T] host, staged as
 * kn_embed's ids are; src is read when the op runs on the backend. A map entry
 * >= n_src gives CM_ERR_RANGE (nothing written). */
int kn_ids_take(struct kn_backend *be, int32_t *dst, const int32_t *ids, const int32_t *src,
                int n_src, const int32_t *map, int T);

/* kn_embed with ids[T] in backend memory (kn_ids_take's dst): the host cannot
 * check them, so any id outside [0, vocab) gives a zero row (as -1 does in
 * kn_embed) instead of an error. */
int kn_embed_dev(struct kn_backend *be, float *out, ptrdiff_t ldo, const void *table,
                 enum kn_dtype tdt, int vocab, int H, const int32_t *ids, int T, float scale);

/* ---- paged KV cache and attention --------------------------------------- */

/* Where one layer's K and V live in the physical pool. The pool is n_pages
 * pages of page_bytes each. Layer L's K for token slot s (0 <= s < block_tokens)
 * of page p, kv head h, is at
 *   pool + p * page_bytes + k_off + (s * n_kv_heads + h) * head_dim * elt
 * and V likewise with v_off (elt = kn_dtype_size(dtype)). A page holds
 * block_tokens consecutive positions of a sequence for all layers of a group. */
struct kn_kv_view {
  void *pool;          /* backend memory, n_pages * page_bytes bytes */
  size_t page_bytes;   /* bytes per page */
  int n_pages;         /* pages in the pool */
  size_t k_off, v_off; /* bytes within a page for this layer's K and V */
  int block_tokens;    /* token positions per page for this layer's group */
  int n_kv_heads;
  int head_dim;        /* <= KN_MAX_HEAD_DIM */
  enum kn_dtype dtype; /* KN_DTYPE_F32, KN_DTYPE_BF16 or KN_DTYPE_F8E4M3 */
  /* An fp8 cache's scales: [n_kv_heads] f32 backend memory each, or NULL (1).
   * Element x of kv head h is stored as e4m3(x / k_scale[h]) (f32 division,
   * then kn_f32_to_f8e4m3) and read back as the f32 product e4m3 value *
   * k_scale[h]; V likewise with v_scale (the checkpoint's per-layer scales,
   * vLLM's k_scale / v_scale). Must be NULL for other dtypes. */
  const float *k_scale, *v_scale;
};

#define KN_MAX_HEAD_DIM 512

/* Writes k[T, n_kv_heads, head_dim] and v[...] (token strides ldk, ldv floats)
 * into the pages: token t goes to page slot_mapping[t] / block_tokens, slot
 * slot_mapping[t] % block_tokens; slot_mapping[t] < 0 skips the token.
 * slot_mapping: [T] host. A page outside the pool gives CM_ERR_RANGE (nothing
 * written). v may be NULL: only K is written. */
int kn_kv_write(struct kn_backend *be, const struct kn_kv_view *view, const int32_t *slot_mapping,
                const float *k, ptrdiff_t ldk, const float *v, ptrdiff_t ldv, int T);

/* One sequence's part of a ragged attention batch (host memory). */
struct kn_attn_seq {
  int q_begin;                /* first row of this sequence in q / out */
  int n_q;                    /* query tokens (1 for a decode) */
  int pos0;                   /* absolute position of its first query token */
  const int32_t *block_table; /* [n_blocks] page ids for this group; entry
                                 pos / block_tokens holds position pos. Entries
                                 no query can see (out of window) may be -1. */
  int n_blocks;
  const int32_t *bidir; /* [n_bidir, 2] ranges [begin, end) of absolute
                           positions attended bidirectionally, or NULL */
  int n_bidir;
};

/* out[T, n_heads, D] (token stride ldo) = softmax(scale * q k^T [softcapped]) v
 * for q[T, n_heads, D] (token stride ldq), D = view->head_dim, keys and values
 * read from the pages of `view` (write this step's K/V first).
 * The query at absolute position p sees key positions j with j <= p and
 * (window == 0 or j > p - window); if p lies in a bidir range [b, e) it also
 * sees every j in [b, e). GQA: query head h uses kv head
 * h / (n_heads / n_kv_heads); n_heads must be a multiple of n_kv_heads.
 * softcap > 0 applies tanh(s / softcap) * softcap to the scaled scores.
 * A needed block-table entry that is missing or outside the pool gives
 * CM_ERR_RANGE. Rows of out not covered by any sequence are left untouched. */
int kn_attention(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *q, ptrdiff_t ldq,
                 const struct kn_kv_view *view, const struct kn_attn_seq *seqs, int n_seqs,
                 int n_heads, int window, float scale, float softcap);

/* ---- step graphs (CUDA graphs) --------------------------------------------
 *
 * A backend that has them records the ops of one forward pass once and then
 * replays them with one launch, taking the launches off the host's critical
 * path. The calls between kn_graph_begin and kn_graph_end run in its mode:
 *   KN_GRAPH_MEASURE  the ops run as usual; the graph notes the sizes of the
 *                     host arrays they stage (ids, positions, slots, block
 *                     tables, attention rows) and the scratch they take;
 *   KN_GRAPH_CAPTURE  the ops are recorded, not run, reading their host
 *                     arrays from the graph's fixed input arena and their
 *                     scratch from the graph's own; kn_graph_end then runs the
 *                     graph once;
 *   KN_GRAPH_REPLAY   the ops only write their host arrays into the arena:
 *                     the same calls in the same order, each array the size
 *                     it had when captured, else the op fails (CM_ERR_INVAL)
 *                     and nothing has run; kn_graph_end copies the arena to
 *                     the device in one copy and launches the graph.
 * In all three, attention plans for contexts of up to max_keys keys (block
 * tables staged at that length, the key split chosen for it) so that launch
 * shapes do not depend on the step; a context past it fails the op. Graphs
 * hold only ops that never wait for the device: downloads, argmax, top-k,
 * sampling and collectives answer CM_ERR_UNSUPPORTED in these modes. The
 * modes go in order (measure, capture, then any number of replays).
 * kn_graph_end(be, g, 0) leaves the mode after a failed op: a replay has run
 * nothing, a capture is dropped. Backends without graphs answer
 * CM_ERR_UNSUPPORTED to kn_graph_new. */
struct kn_graph;
enum kn_graph_mode { KN_GRAPH_MEASURE = 1, KN_GRAPH_CAPTURE = 2, KN_GRAPH_REPLAY = 3 };
int kn_graph_new(struct kn_backend *be, int max_keys, struct kn_graph **out);
int kn_graph_begin(struct kn_backend *be, struct kn_graph *g, enum kn_graph_mode mode);
int kn_graph_end(struct kn_backend *be, struct kn_graph *g, int ok);
void kn_graph_free(struct kn_backend *be, struct kn_graph *g); /* NULL: no-op */

#endif
