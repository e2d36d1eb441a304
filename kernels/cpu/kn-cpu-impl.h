/* kn-cpu-impl.h — inside the CPU backend: the thread pool, the per-ISA kernel
 * table (dav1d style: filled with the reference C versions, then overridden by
 * SIMD versions the processor supports) and the backend context.
 *
 * Batch invariance rests on two rules every kernel here follows:
 *   1. an output element (a matmul dot product, a norm row, one query head of
 *      attention) is computed by exactly one call of one kernel, whatever the
 *      threading; and
 *   2. within a kernel table, all variants that compute the same element (the
 *      small-T matvec and the prefill tile kernel, tile edges, matmul_rows) use
 *      the same sequence of floating-point operations for it. */
#ifndef LMSERVE_KN_CPU_IMPL_H
#define LMSERVE_KN_CPU_IMPL_H
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/kn-cpu.h"
#include "kernels/kn-backend.h"

#define KN_CPU_MAX_THREADS 64
/* Key positions per online-softmax block in attention; blocks start at
 * multiples of this absolute position, so a query's reduction order does not
 * depend on how its prompt was chunked. */
#define KN_ATTN_BLOCK 32
/* Key positions per span: a row's visible keys are cut into spans [s, s +
 * KN_ATTN_SPAN) at multiples of this absolute position (whole blocks); each
 * span is folded block by block from an empty state (m = -inf, l = 0, a zero
 * accumulator), and the spans' states are merged in position order
 * (kn_cpu_attn_merge). A span's state depends only on its keys and the query,
 * so a decode row's spans can run on different threads, each reading only its
 * own keys' K and V, and merge to the bits the row gets in one walk. */
#define KN_ATTN_SPAN 128
_Static_assert(KN_ATTN_SPAN % KN_ATTN_BLOCK == 0, "a span is whole blocks");
/* Query heads of one GQA group processed together per pass (stack buffers). */
#define KN_ATTN_MAX_GROUP 8
/* query rows an attention work item takes (kn_cpu_attn_tile_fn) */
#define KN_ATTN_TILE 16

/* ---- thread pool (kn-cpu-pool.c) ---------------------------------------- */

struct kn_cpu_pool;
/* Runs units [u0, u1) of a task on thread ith (0 = the caller; indexes
 * per-thread scratch). */
typedef void (*kn_cpu_task_fn)(void *arg, long long u0, long long u1, int ith);

int kn_cpu_pool_create(int n_threads, struct kn_cpu_pool **out);
void kn_cpu_pool_destroy(struct kn_cpu_pool *pool);
int kn_cpu_pool_threads(const struct kn_cpu_pool *pool);
/* Runs units [0, n_units) of fn, claimed grain at a time by the caller and
 * the workers; returns when all are done. grain >= n_units runs everything
 * on the caller. */
void kn_cpu_pool_run(struct kn_cpu_pool *pool, long long n_units, long long grain,
                     kn_cpu_task_fn fn, void *arg);

/* ---- kernel table ----------------------------------------------------- */

/* A row's first maximum within one work unit (id -1: every entry NaN). */
struct kn_cpu_best {
  float max;
  int32_t id;
};

/* Floats of scratch tok_argmax needs (kn-cpu-avx512.c): up to 48 widened
 * rows, and per group of 16 tokens the running maxima (softcapped and raw),
 * their features and the masks' words over a block of rows (3 each). */
static inline size_t kn_cpu_tok_argmax_floats(int K, int T) {
  return (size_t)48 * (size_t)((K + 7) & ~7) + 16 + (size_t)6 * 16 * (size_t)((T + 15) / 16);
}

/* out[t * ldo + j] {=, +=} dot(in[t * ldi + 0..K), W row j) for t < T, j < n,
 * where W row j starts at w + j * K elements of the kernel's dtype. */
typedef void (*kn_cpu_dot_fn)(float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                              const void *w, int K, int T, int n, int accumulate);

/* One attention call as the kernels see it. */
struct kn_cpu_attn_job {
  float *out;
  ptrdiff_t ldo;
  const float *q;
  ptrdiff_t ldq;
  const struct kn_kv_view *view;
  const struct kn_attn_seq *seqs;
  int n_heads;
  int window;
  float scale;
  float softcap;
};

/* Computes query heads g0 .. g0 + ng - 1 of kv head kvh's GQA group for
 * query i (0 <= i < n_q) of sequence seq. Each head's arithmetic is the same
 * whichever heads share the call. */
typedef void (*kn_cpu_attn_fn)(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq,
                               int i, int kvh, int g0, int ng);
/* Rows i0 .. i0 + nr - 1 (nr <= KN_ATTN_TILE) of seq, each with its own
 * visible keys, together (rows that see the same keys of a block share it),
 * with the bits kn_cpu_attn_fn gives each row alone; NULL where the ISA has
 * none (rows then go one by one). */
typedef void (*kn_cpu_attn_tile_fn)(const struct kn_cpu_attn_job *job,
                                    const struct kn_attn_seq *seq, int i0, int nr, int kvh, int g0,
                                    int ng);

/* One span of a row's attention (KN_ATTN_SPAN): its keys [k0, k1) and, per
 * query head h of the call (h - g0), the state the span's fold leaves: m[h],
 * l[h] and the accumulator acc + h * D (kn_cpu_attn_merge's operands); sink
 * takes the D outputs the kernel writes of each head, which nobody reads. */
struct kn_cpu_attn_part {
  int k0, k1;
  float *m, *l, *acc, *sink;
};
typedef void (*kn_cpu_attn_part_fn)(const struct kn_cpu_attn_job *job,
                                    const struct kn_attn_seq *seq, int i, int kvh, int g0, int ng,
                                    struct kn_cpu_attn_part *part);

/* The q8 mode's inputs of one matmul (kn_cpu_dsp.q8dot), T tokens of K / 32
 * blocks, prepared once a call (q8_mm in kn-cpu-ops.c) for the weights' dtype:
 * q the tokens rounded to Q8_0 blocks (kn_quantize_row), d their scales as
 * f32, s each lane's sum of its four inputs (sum (q - 8) x = sum q x - 8 sum x)
 * times the weights' offset negated where they have one (Q4_0: -8, Q5_0: -16,
 * Q6_K: -32, Q8_0: -128 for w + 128 unsigned; the others: the sum).
 *
 * For every format but Q5_0 and at least KN_CPU_Q8_TOKENS tokens, the same
 * with tokens side by side (NULL otherwise): groups of KN_CPU_Q8_GROUP (32)
 * tokens, the last one padded with zeros, in each group block b's elements
 * 4j .. 4j + 3 of every token in turn (xi: [T / 32][K / 32][8][32][4] bytes),
 * so that one 32-bit broadcast of four weights meets the four inputs of a
 * register's tokens; di the scales ([T / 32][K / 32][32]) and si the blocks'
 * input sums times the offset ([T / 32][K / 32][32]: the sum of s's 8
 * lanes). The reference reads q alone.
 *
 * The X16 weights (every block format's: kn-quant.h), and Q5_0
 * rows, take the inputs of their rows' format, never side by side (xi NULL at
 * every T; in the X16 layouts the rows are),
 * and a call's n rows start at a multiple of 16 of the tensor's: its groups of
 * 16 first, then n % 16 rows as they were (the tensor's last ones). */
#define KN_CPU_Q8_TOKENS      5
#define KN_CPU_Q8_TILE_TOKENS 16 /* kn_cpu_dsp.q8tiles: a group of 16 tokens and more */
#define KN_CPU_Q8_GROUP       32
struct kn_cpu_q8_in {
  const uint8_t *q;  /* [T][ldq] Q8_0 blocks */
  const float *d;    /* [T][K / 32] */
  const int32_t *s;  /* [T][K / 32][8] */
  const int32_t *o;  /* [T][K / 32] s's 8 lanes summed (the one-integer formats; else NULL) */
  const int8_t *xi;  /* [T / 32][K / 32][8][32][4] */
  const float *di;   /* [T / 32][K / 32][32] */
  const int32_t *si; /* [T / 32][K / 32][32] */
  size_t ldq;        /* bytes */
};

struct kn_cpu_dsp {
  enum kn_cpu_isa isa;
  /* Small T: reads W in its own dtype, each weight row once per call. */
  kn_cpu_dot_fn matvec[KN_DTYPE__COUNT];
  /* n packed rows of K elements of a block format at w (kn_row_bytes apart) as f32
   * rows K apart at dst, kn_dequant_row's values (NULL: kn_dequant_row). */
  void (*deq_rows[KN_DTYPE__COUNT])(float *dst, const void *w, int K, int n);
  /* Large T: f32 weights in tiles; other dtypes are widened into a scratch
   * buffer first (exact), then tiled. Same arithmetic per element as matvec.
   * With pack set, tile_f32 takes the rows as pack left them (every dtype,
   * f32 included, is packed first) instead of plain f32 rows. */
  kn_cpu_dot_fn tile_f32;
  int tile_min_t;  /* T from which matmul uses widen (or pack) + tile_f32 */
  int tile_min_tk; /* ... provided T * K is at least this (0: any) */
  int tile_tokens; /* tokens per tile_f32 register tile (token blocks are multiples) */
  /* Widens n elements of dtype dt to f32 (exact). */
  void (*widen)(float *dst, const void *src, enum kn_dtype dt, size_t n);
  /* Widens n rows of K elements into tile_f32's layout at dst, which holds
   * kn_cpu_packed_floats(K, n) floats; NULL: plain widened rows. */
  void (*pack)(float *dst, const void *src, enum kn_dtype dt, int K, int n);
  /* The greedy head (kn-cpu-avx512.c; NULL: none): each token's first
   * maximum over rows [0, n) of w against the T tokens in xt (the inputs as
   * kn-cpu-ops.c's tok_inputs lays them out), softcapped when cap > 0, as
   * feature n0 + row into best[T]; the outputs are not written. With allow
   * (NULL: every row allows every feature), token t's maximum is over the
   * features its mask allow[t] has (allow[t] NULL: all; id -1: none). wbuf
   * holds kn_cpu_tok_argmax_floats(K, T). Used from T = tok_min_t when K is
   * at most tok_max_k; same arithmetic per output as matvec. */
  void (*tok_argmax)(struct kn_cpu_best *best, int n0, const float *xt, int T, const void *w,
                     enum kn_dtype dt, int K, int n, float cap, const uint32_t *const *allow,
                     float *wbuf);
  int tok_min_t;
  int tok_max_k;

  /* One row of d elements. */
  void (*rmsnorm)(float *out, const float *x, int d, const void *w, enum kn_dtype wdt, float eps,
                  enum kn_norm_mode mode);
  void (*gelu_mul)(float *out, const float *gate, const float *up, int n);
  void (*add)(float *out, const float *a, const float *b, size_t n);
  void (*mul)(float *out, const float *a, const float *b, size_t n);
  void (*scale)(float *out, const float *a, float s, size_t n);
  void (*softcap)(float *out, const float *a, float cap, size_t n);

  kn_cpu_attn_fn attn;
  kn_cpu_attn_tile_fn attn_tile; /* or NULL */
  /* One span of one row (head dims a multiple of 8): attn's arithmetic over
   * the keys part->k0 .. part->k1 - 1 only, each head's state left in part
   * (cpu_attention's split of a decode row over the threads); NULL where the
   * table's attn walks no spans (the reference). */
  kn_cpu_attn_part_fn attn_part;
  /* The bf16 mode's attention where the processor has bf16 dot products
   * (kn-cpu-attn-bf16.c: queries and probabilities rounded to bf16; NULL
   * elsewhere: the mode keeps attn and attn_tile). */
  kn_cpu_attn_fn attn_bf16;
  kn_cpu_attn_tile_fn attn_tile_bf16;

  /* The bf16 mode's matmul where the processor has bf16 dot products
   * (kn-cpu-avx512bf16.c; NULL elsewhere: the inputs are rounded to bf16 in
   * f32 and go to the kernels above). round_bf16 writes T rows of K inputs
   * rounded to bf16 (to nearest even), zero up to kn_cpu_bf16_row(K);
   * denormal inputs become zero there (the instructions treat them so),
   * where the rounding of the other tables keeps them;
   * dot_bf16 is kn_cpu_dot_fn's contract over those rows (stride ldx
   * elements) and bf16 weight rows. */
  void (*round_bf16)(uint16_t *dst, ptrdiff_t ldd, const float *in, ptrdiff_t ldi, int T, int K);
  void (*dot_bf16)(float *out, ptrdiff_t ldo, const uint16_t *x, ptrdiff_t ldx, const uint16_t *w,
                   int K, int T, int n, int accumulate);
  /* round_bf16 writes (and dot_bf16 may read) the inputs up to T rounded up
   * to a multiple of bf16_tokens, in a layout of the kernels' own (the AMX
   * tiles'; row after row elsewhere) of kn_cpu_bf16_row(K) elements per
   * token; dot_bf16's work units are multiples of bf16_rows rows. */
  int bf16_tokens;
  int bf16_rows;

  /* The q8 mode's matmul over block-format weights (kn-cpu-q8.c, AVX2 in
   * kn-cpu-q8-avx2.c): x holds T tokens' inputs as Q8_0 blocks and what the
   * kernels take of them prepared once (struct kn_cpu_q8_in), w n rows of
   * row_bytes. Q8_0, Q4_0, Q5_0, IQ4_NL and IQ4_XS, per output: for each
   * block b (IQ4_XS: sub-block) in order, p = the exact sum of its 32 integer
   * products (the weights' offsets applied; IQ4's levels), acc = fma((float)p, dw_b * dx_b, acc)
   * from acc = 0. Q4_1, Q5_1 and the K-quants the same a 32-element block (a K-quant's sub-block),
   * the formats with a min m_b then adding fma((float)sx_b, m_b * dx_b) (sx_b the block's input
   * sum), Q6_K's, Q3_K's and Q2_K's p its halves' sums times their scales, Q2_K's min their mins
   * times their input sums (kn-cpu-q8.c's q8dot_min_ref). NULL: the dtype has none (f32 inputs
   * then). */
  void (*q8dot[KN_DTYPE__COUNT])(float *out, ptrdiff_t ldo, const struct kn_cpu_q8_in *x,
                                 const uint8_t *w, size_t row_bytes, int K, int T, int n,
                                 int accumulate);
  /* The same bits for an X16 weight's groups alone (n a multiple of 16) on
   * matrix tiles, where the table has them (AMX-INT8: Q8_0 .. Q6_K; not IQ4_NL, IQ4_XS, Q3_K,
   * Q2_K), taken at KN_CPU_Q8_TILE_TOKENS tokens and more (kn-cpu-ops.c's q8_rows); NULL otherwise.
   */
  void (*q8tiles[KN_DTYPE__COUNT])(float *out, ptrdiff_t ldo, const struct kn_cpu_q8_in *x,
                                   const uint8_t *w, size_t row_bytes, int K, int T, int n,
                                   int accumulate);
  /* One input row x[K] as the q8 kernels take it: q its Q8_0 blocks as
   * kn_quantize_row rounds them, d their scales in f32, s each lane's sum of
   * its four inputs times -(1 << shift) (shift 0: the sum itself); struct
   * kn_cpu_q8_in. Every table gives kn_quantize_row's bits. */
  void (*q8_prep)(const float *x, int K, uint8_t *q, float *d, int32_t *s, int shift);
};

/* Elements of one input row as round_bf16 lays it out. */
static inline int kn_cpu_bf16_row(int K) {
  return (K + 31) & ~31;
}

/* Features per group of the AVX-512 packed layout (kn-cpu-avx512.c). */
#define KN_PACK_GROUP 8
/* Floats of n packed rows of K elements. */
static inline size_t kn_cpu_packed_floats(int K, int n) {
  return (size_t)(n + KN_PACK_GROUP - 1) / KN_PACK_GROUP * KN_PACK_GROUP * (size_t)((K + 7) / 8) *
         8;
}

void kn_cpu_dsp_init_ref(struct kn_cpu_dsp *dsp);
/* A table's q8 entries: prep, and its functions q8dot_<format> (q8dot_q8_0 ..
 * q8dot_q6_k, q8dot_iq4_nl, q8dot_iq4_xs, q8dot_q3_k, q8dot_q2_k, and the X16 layouts'
 * q8dot_q8_0x16 .. q8dot_q2_kx16), every table naming them alike. */
#define KN_CPU_Q8_FILL(dsp, prep)                                                                  \
  do {                                                                                             \
    (dsp)->q8_prep = (prep);                                                                       \
    (dsp)->q8dot[KN_DTYPE_Q8_0] = q8dot_q8_0;                                                      \
    (dsp)->q8dot[KN_DTYPE_Q4_0] = q8dot_q4_0;                                                      \
    (dsp)->q8dot[KN_DTYPE_Q8_0_X16] = q8dot_q8_0x16;                                               \
    (dsp)->q8dot[KN_DTYPE_Q4_0_X16] = q8dot_q4_0x16;                                               \
    (dsp)->q8dot[KN_DTYPE_Q5_0_X16] = q8dot_q5_0x16;                                               \
    (dsp)->q8dot[KN_DTYPE_Q4_K_X16] = q8dot_q4_kx16;                                               \
    (dsp)->q8dot[KN_DTYPE_Q5_K_X16] = q8dot_q5_kx16;                                               \
    (dsp)->q8dot[KN_DTYPE_Q6_K_X16] = q8dot_q6_kx16;                                               \
    (dsp)->q8dot[KN_DTYPE_Q4_1_X16] = q8dot_q4_1x16;                                               \
    (dsp)->q8dot[KN_DTYPE_Q5_1_X16] = q8dot_q5_1x16;                                               \
    (dsp)->q8dot[KN_DTYPE_Q4_1] = q8dot_q4_1;                                                      \
    (dsp)->q8dot[KN_DTYPE_Q5_0] = q8dot_q5_0;                                                      \
    (dsp)->q8dot[KN_DTYPE_Q5_1] = q8dot_q5_1;                                                      \
    (dsp)->q8dot[KN_DTYPE_Q4_K] = q8dot_q4_k;                                                      \
    (dsp)->q8dot[KN_DTYPE_Q5_K] = q8dot_q5_k;                                                      \
    (dsp)->q8dot[KN_DTYPE_Q6_K] = q8dot_q6_k;                                                      \
    (dsp)->q8dot[KN_DTYPE_IQ4_NL] = q8dot_iq4_nl;                                                  \
    (dsp)->q8dot[KN_DTYPE_IQ4_NL_X16] = q8dot_iq4_nlx16;                                           \
    (dsp)->q8dot[KN_DTYPE_IQ4_XS] = q8dot_iq4_xs;                                                  \
    (dsp)->q8dot[KN_DTYPE_IQ4_XS_X16] = q8dot_iq4_xsx16;                                           \
    (dsp)->q8dot[KN_DTYPE_Q3_K] = q8dot_q3_k;                                                      \
    (dsp)->q8dot[KN_DTYPE_Q3_K_X16] = q8dot_q3_kx16;                                               \
    (dsp)->q8dot[KN_DTYPE_Q2_K] = q8dot_q2_k;                                                      \
    (dsp)->q8dot[KN_DTYPE_Q2_K_X16] = q8dot_q2_kx16;                                               \
  } while (0)
/* The q8 mode's reference dot products (kn-cpu-q8.c). */
void kn_cpu_dsp_init_q8_ref(struct kn_cpu_dsp *dsp);
/* Override with AVX2+FMA+F16C versions (call only when the processor has them). */
void kn_cpu_dsp_init_avx2(struct kn_cpu_dsp *dsp);
/* matvec[] of the block formats (kn-cpu-quant-avx2.c): the AVX2 f32 matvec's
 * bits over the dequantized rows, reading the packed ones (needs AVX2). */
void kn_cpu_dsp_init_quant_avx2(struct kn_cpu_dsp *dsp);
/* X(suffix, dtype) for each block format with a matvec of its own. */
#define KN_CPU_QMV_FORMATS(X)                                                                      \
  X(q8_0, KN_DTYPE_Q8_0)                                                                           \
  X(q4_0, KN_DTYPE_Q4_0)                                                                           \
  X(q4_1, KN_DTYPE_Q4_1)                                                                           \
  X(q5_0, KN_DTYPE_Q5_0)                                                                           \
  X(q5_1, KN_DTYPE_Q5_1)                                                                           \
  X(q4_k, KN_DTYPE_Q4_K)                                                                           \
  X(q5_k, KN_DTYPE_Q5_K)                                                                           \
  X(q6_k, KN_DTYPE_Q6_K)                                                                           \
  X(q3_k, KN_DTYPE_Q3_K)                                                                           \
  X(iq4_nl, KN_DTYPE_IQ4_NL)                                                                       \
  X(iq4_xs, KN_DTYPE_IQ4_XS)                                                                       \
  X(q2_k, KN_DTYPE_Q2_K)
/* Those matvecs by dtype (NULL where none). */
extern const kn_cpu_dot_fn kn_cpu_qmv_avx2[KN_DTYPE__COUNT];
/* The same bits two rows to a 512-bit register (kn-cpu-quant-avx512.c; needs
 * AVX-512 F/DQ/BW/VL). */
void kn_cpu_dsp_init_quant_avx512(struct kn_cpu_dsp *dsp);
/* q8dot[] in AVX2 (kn-cpu-q8-avx2.c): kn-cpu-q8.c's bits (needs AVX2). */
void kn_cpu_dsp_init_q8_avx2(struct kn_cpu_dsp *dsp);
/* q8dot[] with AVX-512 VNNI tiles (kn-cpu-q8-vnni.c; needs kn_cpu_has_avx512vnni()). */
void kn_cpu_dsp_init_q8_vnni(struct kn_cpu_dsp *dsp);
int kn_cpu_has_avx512vnni(void);
/* q8dot[] of the AVX2 tiles with AVX-VNNI's 256-bit vpdpbusd (kn-cpu-q8-avxvnni.c;
 * needs kn_cpu_has_avxvnni()); the table then names itself KN_CPU_ISA_AVX2VNNI. */
void kn_cpu_dsp_init_q8_avxvnni(struct kn_cpu_dsp *dsp);
int kn_cpu_has_avxvnni(void);
int kn_cpu_has_avx2(void);
/* The AVX2 matvecs by weight dtype (the AVX-512 table hands them T = 1). */
extern const kn_cpu_dot_fn kn_cpu_matvec_avx2[KN_DTYPE__COUNT];
/* Then with AVX-512 F/DQ/BW/VL versions of some (on top of the AVX2 table). */
void kn_cpu_dsp_init_avx512(struct kn_cpu_dsp *dsp);
/* Adds the AVX-512-BF16 dot products to the AVX-512 table. */
void kn_cpu_dsp_init_avx512bf16(struct kn_cpu_dsp *dsp);
/* Whether the bf16 mode's own attention kernels (AVX-512-BF16 or AMX) take a
 * cache: bf16, head dims a multiple of 32; the others go to the AVX-512 table's. */
static inline int kn_cpu_attn_bf16_takes(const struct kn_kv_view *view) {
  return view->dtype == KN_DTYPE_BF16 && view->head_dim % 32 == 0;
}

/* The AMX-BF16 tiles for the bf16 mode's matmuls and attention (kn-cpu-amx.c)
 * on top of the AVX-512-BF16 table; kn_cpu_has_amx also asks Linux for the
 * tile state and checks the tiles against their emulation, once. The emulated
 * table (kn-cpu-amx-emu.c) replaces a table's dot_bf16 with the same kernel,
 * each tile instruction a C function, on any table; on the AVX-512-BF16 one
 * also its round_bf16 (the real table's) and its attention. */
void kn_cpu_dsp_init_amx(struct kn_cpu_dsp *dsp);
void kn_cpu_dsp_init_amx_emulated(struct kn_cpu_dsp *dsp);
int kn_cpu_has_amx(void);
/* The check kn_cpu_has_amx makes of the tiles' attention, on any pair of
 * bf16-mode attention kernels (AVX-512-BF16 needed): NULL, or what differed. */
const char *kn_cpu_amx_check_attention(kn_cpu_attn_tile_fn tile, kn_cpu_attn_fn row);
/* The q8 mode's X16 matmuls on AMX-INT8 tiles (kn_cpu_dsp.q8tiles, every
 * block format; kn-cpu-amx.c), where kn_cpu_has_amx_int8 (the tiles
 * checked against their emulation, once); the emulated ones on any processor
 * (tests). */
void kn_cpu_amx_q8_init(struct kn_cpu_dsp *dsp);
void kn_cpu_amx_q8_init_emu(struct kn_cpu_dsp *dsp);
int kn_cpu_has_amx_int8(void);
#define KN_CPU_AMX_Q8_DECL(SUF)                                                                     \
  void kn_cpu_amx_q8tiles_##SUF(float *out, ptrdiff_t ldo, const struct kn_cpu_q8_in *x,           \
                                const uint8_t *w, size_t row_bytes, int K, int T, int n, int acc); \
  void kn_cpu_amx_q8tiles_##SUF##_emu(float *out, ptrdiff_t ldo, const struct kn_cpu_q8_in *x,     \
                                      const uint8_t *w, size_t row_bytes, int K, int T, int n,     \
                                      int acc);
KN_CPU_AMX_Q8_DECL(q8_0)
KN_CPU_AMX_Q8_DECL(q4_0)
KN_CPU_AMX_Q8_DECL(q5_0)
KN_CPU_AMX_Q8_DECL(q4_1)
KN_CPU_AMX_Q8_DECL(q5_1)
KN_CPU_AMX_Q8_DECL(q4_k)
KN_CPU_AMX_Q8_DECL(q5_k)
KN_CPU_AMX_Q8_DECL(q6_k)
void kn_cpu_amx_round_rows(uint16_t *dst, ptrdiff_t ldd, const float *in, ptrdiff_t ldi, int T,
                           int K);
void kn_cpu_amx_round_rows_emu(uint16_t *dst, ptrdiff_t ldd, const float *in, ptrdiff_t ldi, int T,
                               int K);
void kn_cpu_amx_edge(uint16_t *dst, const uint16_t *w, int K, int nr, int kr);
void kn_cpu_amx_edge_emu(uint16_t *dst, const uint16_t *w, int K, int nr, int kr);
void kn_cpu_amx_put(float *out, ptrdiff_t ldo, const float *c, int nf, int nt, int acc);
void kn_cpu_amx_put_emu(float *out, ptrdiff_t ldo, const float *c, int nf, int nt, int acc);
void kn_cpu_amx_attn(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq, int i,
                     int kvh, int g0, int ng);
void kn_cpu_amx_attn_tile(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq, int i0,
                          int nr, int kvh, int g0, int ng);
void kn_cpu_amx_attn_emu(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq, int i,
                         int kvh, int g0, int ng);
void kn_cpu_amx_attn_tile_emu(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq,
                              int i0, int nr, int kvh, int g0, int ng);
void kn_cpu_amx_dot(float *out, ptrdiff_t ldo, const uint16_t *x, ptrdiff_t ldx, const uint16_t *w,
                    int K, int T, int n, int acc);
void kn_cpu_amx_dot_emu(float *out, ptrdiff_t ldo, const uint16_t *x, ptrdiff_t ldx,
                        const uint16_t *w, int K, int T, int n, int acc);
/* The attention kernels (kn_cpu_attn_fn, kn_cpu_attn_tile_fn): AVX2, the
 * AVX-512 table's (the same bits, wider tiles; both in kn-cpu-attn-avx2.c)
 * and the bf16 mode's on AVX-512-BF16 (kn-cpu-attn-bf16.c). */
void kn_cpu_attn_part_avx2(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq, int i,
                           int kvh, int g0, int ng, struct kn_cpu_attn_part *part);
void kn_cpu_attn_part_avx512(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq,
                             int i, int kvh, int g0, int ng, struct kn_cpu_attn_part *part);
void kn_cpu_attn_avx2(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq, int i,
                      int kvh, int g0, int ng);
void kn_cpu_attn_tile_avx2(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq, int i0,
                           int nr, int kvh, int g0, int ng);
void kn_cpu_attn_avx512(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq, int i,
                        int kvh, int g0, int ng);
void kn_cpu_attn_tile_avx512(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq,
                             int i0, int nr, int kvh, int g0, int ng);
void kn_cpu_attn_bf16(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq, int i,
                      int kvh, int g0, int ng);
void kn_cpu_attn_tile_bf16(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq, int i0,
                           int nr, int kvh, int g0, int ng);
int kn_cpu_has_avx512(void);
int kn_cpu_has_avx512bf16(void);
/* 1 on an AMD processor (kernel tuning that depends on the core). */
int kn_cpu_is_amd(void);

/* ---- the backend context ------------------------------------------------ */

struct kn_cpu_ctx {
  int n_threads;
  struct kn_cpu_dsp dsp;
  struct kn_cpu_pool *pool;
  /* per-thread scratch (matmul weight widening), grown by the calling thread
   * before a task is dispatched: scratch[i] holds scratch_floats floats */
  float *scratch[KN_CPU_MAX_THREADS];
  size_t scratch_floats;
  /* the inputs of the matmul_argmax in flight, transposed for tok_argmax */
  float *xt;
  size_t xt_floats;
  /* matmul_argmax: each work unit's row maxima */
  struct kn_cpu_best *best;
  size_t best_cap;
  /* attention: first work item of each sequence, [n_seqs + 1] */
  long long *seq_items;
  int seq_items_cap;
  /* attention: a decode row's span states (cpu_attention's split) */
  float *attn_st;
  size_t attn_st_n;
  /* kn_sample scratch for one vocabulary, one per pool thread (rows are
   * sampled in parallel; kn-cpu-sample.c), made by its thread when a row
   * first needs one */
  struct kn_cpu_sampler *samplers[KN_CPU_MAX_THREADS];
  /* q8 mode (kn_cpu_backend_create_mode, bf16 == 2): inputs of matmuls over Q8_0 /
   * Q4_0 weights rounded to Q8_0 blocks, into xq (grown on demand), as llama.cpp's
   * quantized dot products take them */
  int q8;
  uint8_t *xq;
  size_t xq_bytes;
  int32_t *xs; /* [T][K / 32][8] lane sums of xq's blocks (struct kn_cpu_q8_in) */
  size_t xs_n;
  int32_t *xo; /* [T][K / 32] the blocks' offset terms (struct kn_cpu_q8_in) */
  size_t xo_n;
  float *xd; /* [T][K / 32] xq's block scales (struct kn_cpu_q8_in) */
  size_t xd_n;
  uint8_t *xp; /* struct kn_cpu_q8_in's xi, di and si, one after the other */
  size_t xp_bytes;
  /* bf16 mode (kn_cpu_backend_create_mode): matmul inputs rounded to bf16,
   * into xb (dsp.round_bf16's rows) or xr (f32 rows), grown on demand */
  int bf16;
  uint16_t *xb;
  size_t xb_elems;
  float *xr;
  size_t xr_floats;
  /* the tensor-parallel group joined by kn_comm_join (kn-cpu-comm.c), or NULL */
  struct kn_shm_comm *comm;
  /* RoPE's cos and sin of the last calls (kn-cpu-ops-misc.c), one entry per
   * frequency table, the older one replaced */
  struct kn_cpu_rope_cache {
    int D, T, cap_T; /* head dim, positions held, room for */
    float inv_freq[KN_MAX_HEAD_DIM / 2];
    int32_t *pos;  /* [T] */
    float *cs;     /* [T][D / 2] cos, then [T][D / 2] sin at cs + cap_T * D / 2 */
    uint64_t used; /* rope_tick when last used */
  } rope[2];
  uint64_t rope_tick;
};

/* Makes every thread's scratch hold at least n floats; 0 or CM_ERR_NOMEM. */
int kn_cpu_ctx_scratch(struct kn_cpu_ctx *ctx, size_t n);
/* Fills ops with the CPU ops (kn-cpu-ops.c), all but the memory hooks. */
struct kn_backend_ops;
void kn_cpu_ops_fill(struct kn_backend_ops *ops);
/* Fills ops with the vision encoder ops (kn-cpu-ops-vision.c). */
void kn_cpu_vision_ops_fill(struct kn_backend_ops *ops);
/* Fills ops with the audio encoder ops (kn-cpu-ops-audio.c). */
void kn_cpu_audio_ops_fill(struct kn_backend_ops *ops);
/* Fills ops with the collectives over shared memory (kn-cpu-comm.c). */
void kn_cpu_comm_fill(struct kn_backend_ops *ops);

/* Ops without a kernel-table entry (kn-cpu-ops-misc.c); ctx is the kn_cpu_ctx. */
int kn_cpu_op_embed(void *ctx, float *out, ptrdiff_t ldo, const void *table, enum kn_dtype tdt,
                    int H, const int32_t *ids, int T, float scale);
int kn_cpu_op_rope(void *ctx, float *x, ptrdiff_t ldx, int T, int heads, int D, const int32_t *pos,
                   const float *inv_freq);
int kn_cpu_op_argmax(void *ctx, int32_t *ids, float *max_out, const float *logits, ptrdiff_t ld,
                     int T, int V);
/* First index of the largest non-NaN of row[0..n) (ties: the first; -0 and +0
 * are equal) and its value in *max_out; -1 and NaN when every entry is NaN.
 * The AVX2 (AVX-512) version needs kn_cpu_has_avx2() (kn_cpu_has_avx512())
 * and gives the same answers. */
int kn_cpu_argmax_row_ref(const float *row, int n, float *max_out);
/* The best of the three this processor runs. */
int kn_cpu_argmax_row(const float *row, int n, float *max_out);
int kn_cpu_argmax_row_avx2(const float *row, int n, float *max_out);
int kn_cpu_argmax_row_avx512(const float *row, int n, float *max_out);
/* The scaling half of RMSNorm over elements [i, d) of a row: out = x * r,
 * times w or 1 + w as mode says (the reference's loop, the AVX2 version's
 * scalar tail). */
static inline void kn_cpu_norm_scale(float *out, const float *x, int i, int d, float r,
                                     const void *w, enum kn_dtype wdt, enum kn_norm_mode mode) {
  for (; i < d; i++) {
    float y = x[i] * r;
    if (mode == KN_NORM_MUL_W)
      y *= kn_load_f32(w, wdt, (size_t)i);
    else if (mode == KN_NORM_MUL_ONE_PLUS_W)
      y *= 1.0f + kn_load_f32(w, wdt, (size_t)i);
    out[i] = y;
  }
}

/* The scalar end of the SIMD versions: the first index from i on whose value
 * equals m (the row's maximum, found by the caller), or -1 and NaN where none
 * does (every entry NaN). */
static inline int kn_cpu_argmax_first_eq(const float *row, int i, int n, float m, float *max_out) {
  for (; i < n; i++)
    if (row[i] == m) {
      if (max_out) *max_out = row[i];
      return i;
    }
  if (max_out) *max_out = NAN;
  return -1;
}
int kn_cpu_op_router_topk(void *ctx, int32_t *ids, float *weights, const float *logits,
                          ptrdiff_t ld, int T, int E, int k, const float *expert_scale);

/* Every e4m3 code's value (kn_f8e4m3_to_f32), filled when the library loads
 * (kn-cpu-ops.c): the fp8 KV cache's and the FP8 weights' widening. */
extern float kn_cpu_e4m3[256];

/* Reference pieces other files reuse. */
float kn_cpu_gelu_tanh_ref(float g);
void kn_cpu_attn_ref(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq, int i,
                     int kvh, int g0, int ng);

/* Key range [*lo, *hi] (inclusive) a query at absolute position p of seq may
 * see, and whether key position j is visible to it. */
void kn_cpu_attn_range(const struct kn_attn_seq *seq, int window, int p, int *lo, int *hi);
static inline int kn_cpu_attn_visible(const struct kn_attn_seq *seq, int window, int p, int j) {
  if (j <= p && (window <= 0 || j > p - window)) return 1;
  for (int r = 0; r < seq->n_bidir; r++) {
    int b = seq->bidir[2 * r], e = seq->bidir[2 * r + 1];
    if (p >= b && p < e && j >= b && j < e) return 1;
  }
  return 0;
}
/* Softcaps the scores sc[r][col[j]] of nr rows and nk keys in place, as the
 * reference does: tanh(s / cap) * cap in double. */
static inline void kn_cpu_attn_softcap(float *const *sc, int nr, const int *col, int nk,
                                       float cap) {
  for (int r = 0; r < nr; r++)
    for (int j = 0; j < nk; j++) {
      float *p = &sc[r][col[j]];
      *p = (float)(tanh((double)*p / cap) * cap);
    }
}
/* Bit jj: key b + jj visible to the query at p whose range is [lo, hi] (b a
 * multiple of KN_ATTN_BLOCK). Without images that is the range itself. */
static inline uint32_t kn_cpu_attn_block_mask(const struct kn_attn_seq *seq, int window, int p,
                                              int lo, int hi, int b) {
  int a = lo > b ? lo : b, e = hi < b + KN_ATTN_BLOCK - 1 ? hi : b + KN_ATTN_BLOCK - 1;
  if (a > e) return 0;
  if (seq->n_bidir == 0) return (uint32_t)((((uint64_t)1 << (e - a + 1)) - 1) << (a - b));
  uint32_t m = 0;
  for (int j = a; j <= e; j++)
    if (kn_cpu_attn_visible(seq, window, p, j)) m |= 1u << (j - b);
  return m;
}

/* Address of kv head h of position pos in seq's pages (K when v == 0, else V). */
static inline const void *kn_cpu_kv_addr(const struct kn_kv_view *view,
                                         const struct kn_attn_seq *seq, int pos, int h, int v) {
  int32_t page = seq->block_table[pos / view->block_tokens];
  int slot = pos % view->block_tokens;
  size_t elt = kn_dtype_size(view->dtype);
  return (const char *)view->pool + (size_t)page * view->page_bytes +
         (v ? view->v_off : view->k_off) +
         ((size_t)slot * (size_t)view->n_kv_heads + (size_t)h) * (size_t)view->head_dim * elt;
}
/* Element d of a cached K or V row of kv head h: its value (kn_load_f32), times
 * scale[h] in f32 where an fp8 cache has scales (kn_kv_view.k_scale / v_scale). */
static inline float kn_cpu_kv_value(const void *row, enum kn_dtype dt, int d, const float *scale,
                                    int h) {
  float x = kn_load_f32(row, dt, (size_t)d);
  return scale ? x * scale[h] : x;
}

/* An fp8 cache's 256 code values for kv head h: kn_cpu_e4m3 itself, or times
 * scale[h] (f32 products) in tab, which the returned pointer is then. */
static inline const float *kn_cpu_e4m3_scaled(float *tab, const float *scale, int h) {
  if (!scale) return kn_cpu_e4m3;
  for (int c = 0; c < 256; c++)
    tab[c] = kn_cpu_e4m3[c] * scale[h];
  return tab;
}

/* The keys of block b that mask shows (bit jj: key b + jj), in position
 * order: their K and V rows of kv head kvh into kp and vp and their block
 * offsets into vj, each row asked for ahead of its use (the kernels read a
 * few keys at a time, which alone would meet each cold line late: a decode
 * step's keys come from L3 or memory). Returns how many. */
static inline int kn_cpu_attn_block_keys(const struct kn_kv_view *view,
                                         const struct kn_attn_seq *seq, int kvh, int b,
                                         uint32_t mask, const void **kp, const void **vp,
                                         int *vj) {
  const int bytes = view->head_dim * (int)kn_dtype_size(view->dtype);
  int n = 0;
  for (int jj = 0; jj < KN_ATTN_BLOCK; jj++) {
    if (!(mask >> jj & 1)) continue;
    kp[n] = kn_cpu_kv_addr(view, seq, b + jj, kvh, 0);
    vp[n] = kn_cpu_kv_addr(view, seq, b + jj, kvh, 1);
    for (int o = 0; o < bytes; o += 64) {
      __builtin_prefetch((const char *)kp[n] + o, 0, 3);
      __builtin_prefetch((const char *)vp[n] + o, 0, 3);
    }
    vj[n++] = jj;
  }
  return n;
}

/* Query vectors that share a walk, at most: a decode row's query heads, or a
 * prefill tile's rows of one head. */
#define KN_ATTN_MAX_VEC (KN_ATTN_TILE > KN_ATTN_MAX_GROUP ? KN_ATTN_TILE : KN_ATTN_MAX_GROUP)

/* The block walk of every CPU attention kernel, over the v->n query vectors
 * at absolute positions v->pos[i] (a row's heads share one and sit next to
 * each other): block by block over the union of their key ranges, the
 * vectors whose visible keys in the block are the same (every block below the
 * diagonal of a causal chunk, every block of an image) take it together while
 * its K and V are in L1, fold(ctx, b, mask, idx, k) for vectors idx[0 .. k);
 * a vector with a visible set of its own (the diagonal, a window's edge)
 * takes the block alone. A vector visits exactly the blocks it visits alone,
 * in the same order; with a fold that does the same operations per vector,
 * its bits are those it gets alone, whatever shares the walk. */
/* A walk's query vectors: the call they come from, and per vector its
 * absolute position, where it is written, its running max m and sum l in the
 * current span, a block's scores s (-inf where invisible) and its
 * accumulator; the spans before the current one merged (tm -inf: none yet);
 * with part, a span part's head of each vector (hd) and where its state goes. */
struct kn_cpu_attn_vecs {
  const struct kn_cpu_attn_job *job;
  const struct kn_attn_seq *seq;
  int kvh, n;
  struct kn_cpu_attn_part *part; /* NULL: every visible key, written to out */
  int pos[KN_ATTN_MAX_VEC], hd[KN_ATTN_MAX_VEC];
  float *out[KN_ATTN_MAX_VEC];
  float m[KN_ATTN_MAX_VEC], l[KN_ATTN_MAX_VEC];
  float tm[KN_ATTN_MAX_VEC], tl[KN_ATTN_MAX_VEC];
  _Alignas(64) float s[KN_ATTN_MAX_VEC][KN_ATTN_BLOCK];
  _Alignas(64) float acc[KN_ATTN_MAX_VEC][KN_MAX_HEAD_DIM];
  _Alignas(64) float tacc[KN_ATTN_MAX_VEC][KN_MAX_HEAD_DIM];
};

/* Merges a span's state (m, l, acc[D], D a multiple of 8) into the spans'
 * before it (*M, *L, ACC[D]): nothing for a span that saw no key (m = -inf),
 * a copy into an empty total (*M = -inf), else with mn = max(*M, m), a =
 * exp(*M - mn) and b = exp(m - mn) (libm's expf): *L = *L a + l b and ACC[d] =
 * ACC[d] a + acc[d] b, each product and sum rounded on its own (elementwise,
 * 8 at a time in whatever vectors the target has: the same bits in every
 * table). */
typedef float kn_cpu_f8 __attribute__((vector_size(32)));
static inline void kn_cpu_attn_merge(float *M, float *L, float *ACC, float m, float l,
                                     const float *acc, int D) {
  if (m == -INFINITY) return;
  if (*M == -INFINITY) {
    *M = m;
    *L = l;
    memcpy(ACC, acc, sizeof(float) * (size_t)D);
    return;
  }
  const float mn = m > *M ? m : *M, a = expf(*M - mn), b = expf(m - mn);
  *L = *L * a + l * b;
  for (int d = 0; d < D; d += 8) {
    kn_cpu_f8 x, y;
    memcpy(&x, ACC + d, sizeof(x));
    memcpy(&y, acc + d, sizeof(y));
    x = x * a + y * b;
    memcpy(ACC + d, &x, sizeof(x));
  }
  *M = mn;
}

/* The end of a span: each vector's state merged into its total and emptied. */
static inline void kn_cpu_attn_span_end(struct kn_cpu_attn_vecs *v) {
  const int D = v->job->view->head_dim;
  for (int i = 0; i < v->n; i++) {
    if (v->m[i] == -INFINITY) continue;
    kn_cpu_attn_merge(&v->tm[i], &v->tl[i], v->tacc[i], v->m[i], v->l[i], v->acc[i], D);
    v->m[i] = -INFINITY;
    v->l[i] = 0.0f;
    memset(v->acc[i], 0, sizeof(float) * (size_t)D);
  }
}

/* The end of a walk: each vector's last span merged into the spans before
 * it, the result back in m, l and acc (a vector whose keys lie in one span
 * keeps its state as it is); a span part's states then copied to v->part. */
static inline void kn_cpu_attn_walk_end(struct kn_cpu_attn_vecs *v) {
  const int D = v->job->view->head_dim;
  for (int i = 0; i < v->n; i++) {
    if (v->tm[i] != -INFINITY) {
      kn_cpu_attn_merge(&v->tm[i], &v->tl[i], v->tacc[i], v->m[i], v->l[i], v->acc[i], D);
      v->m[i] = v->tm[i];
      v->l[i] = v->tl[i];
      memcpy(v->acc[i], v->tacc[i], sizeof(float) * (size_t)D);
    }
    if (v->part) {
      const int h = v->hd[i];
      v->part->m[h] = v->m[i];
      v->part->l[h] = v->l[i];
      memcpy(v->part->acc + (size_t)h * (size_t)D, v->acc[i], sizeof(float) * (size_t)D);
    }
  }
}

/* The query vectors of one call into v, in sets of at most KN_ATTN_MAX_VEC,
 * each set then run(ctx, q) with q[i] the query of v's vector i: for one row
 * (nr == 1) a set per KN_ATTN_MAX_GROUP of its query heads g0 .. g0 + ng - 1,
 * for rows i0 .. i0 + nr - 1 (nr <= KN_ATTN_TILE) a set per head. Each vector
 * starts with m = -inf, l = 0 and a zero accumulator. */
typedef void (*kn_cpu_attn_run_fn)(void *ctx, const float *const *q);
/* The same for one row's span part (nr == 1): each vector's keys cut to
 * [part->k0, part->k1), its state left in part, its output written to
 * part->sink (part NULL: kn_cpu_attn_sets). */
static inline void kn_cpu_attn_sets_part(struct kn_cpu_attn_vecs *v,
                                         const struct kn_cpu_attn_job *job,
                                         const struct kn_attn_seq *seq, int i0, int nr, int kvh,
                                         int g0, int ng, struct kn_cpu_attn_part *part,
                                         kn_cpu_attn_run_fn run, void *ctx) {
  const int D = job->view->head_dim, group = job->n_heads / job->view->n_kv_heads;
  const int per = nr == 1 ? KN_ATTN_MAX_GROUP : 1; /* heads per set */
  const float *q[KN_ATTN_MAX_VEC];
  v->job = job;
  v->seq = seq;
  v->kvh = kvh;
  v->part = part;
  for (int g = g0; g < g0 + ng; g += per) {
    v->n = 0;
    for (int h = g; h < g0 + ng && h < g + per; h++)
      for (int r = 0; r < nr; r++) {
        ptrdiff_t row = seq->q_begin + i0 + r, col = (ptrdiff_t)(kvh * group + h) * D;
        int i = v->n++;
        v->pos[i] = seq->pos0 + i0 + r;
        v->hd[i] = h - g0;
        v->out[i] = part ? part->sink : job->out + row * job->ldo + col;
        v->m[i] = v->tm[i] = -INFINITY;
        v->l[i] = v->tl[i] = 0.0f;
        memset(v->acc[i], 0, sizeof(float) * (size_t)D);
        q[i] = job->q + row * job->ldq + col;
      }
    run(ctx, q);
  }
}
static inline void kn_cpu_attn_sets(struct kn_cpu_attn_vecs *v, const struct kn_cpu_attn_job *job,
                                    const struct kn_attn_seq *seq, int i0, int nr, int kvh, int g0,
                                    int ng, kn_cpu_attn_run_fn run, void *ctx) {
  kn_cpu_attn_sets_part(v, job, seq, i0, nr, kvh, g0, ng, NULL, run, ctx);
}

/* kn_cpu_attn_sets for a kernel of the bf16 mode: rows i0 .. i0 + nr - 1 through
 * run(ctx, ...), or, for a cache that mode does not take (kn_cpu_attn_bf16_takes),
 * through the AVX-512 table's kernel. */
static inline void kn_cpu_attn_bf16_sets(struct kn_cpu_attn_vecs *v,
                                         const struct kn_cpu_attn_job *job,
                                         const struct kn_attn_seq *seq, int i0, int nr, int kvh,
                                         int g0, int ng, kn_cpu_attn_run_fn run, void *ctx) {
  if (!kn_cpu_attn_bf16_takes(job->view))
    kn_cpu_attn_tile_avx512(job, seq, i0, nr, kvh, g0, ng);
  else
    kn_cpu_attn_sets(v, job, seq, i0, nr, kvh, g0, ng, run, ctx);
}

/* Vectors idx[0 .. k) of a walk taking block b together: their scores (reset
 * to -inf) and accumulators, copies of their m and l for the kernels' softmax
 * step, and the block's visible keys (kn_cpu_attn_block_keys; vp has room for
 * a partner of an odd last key). */
struct kn_cpu_attn_group {
  int n_vis;
  float *s[KN_ATTN_MAX_VEC], *acc[KN_ATTN_MAX_VEC];
  float m[KN_ATTN_MAX_VEC], l[KN_ATTN_MAX_VEC];
  const void *kp[KN_ATTN_BLOCK], *vp[KN_ATTN_BLOCK + 1];
  int vj[KN_ATTN_BLOCK];
};
static inline void kn_cpu_attn_group_take(struct kn_cpu_attn_group *g, struct kn_cpu_attn_vecs *v,
                                          int b, uint32_t mask, const int *idx, int k) {
  for (int j = 0; j < k; j++) {
    int i = idx[j];
    g->s[j] = v->s[i];
    g->acc[j] = v->acc[i];
    g->m[j] = v->m[i];
    g->l[j] = v->l[i];
    for (int jj = 0; jj < KN_ATTN_BLOCK; jj++)
      v->s[i][jj] = -INFINITY;
  }
  g->n_vis = kn_cpu_attn_block_keys(v->job->view, v->seq, v->kvh, b, mask, g->kp, g->vp, g->vj);
}
/* The group's m and l back to their vectors. */
static inline void kn_cpu_attn_group_give(const struct kn_cpu_attn_group *g,
                                          struct kn_cpu_attn_vecs *v, const int *idx, int k) {
  for (int j = 0; j < k; j++) {
    v->m[idx[j]] = g->m[j];
    v->l[idx[j]] = g->l[j];
  }
}

typedef void (*kn_cpu_attn_fold_fn)(void *ctx, int b, uint32_t mask, const int *idx, int k);
/* A kernel that can fold a block into vectors whose visible sets differ (each
 * vector's operations those it has alone) passes all: a block that at least
 * all_min vectors see goes to all(ctx, b, vis) once, vis[i] each vector's
 * visible keys (0: not this block). NULL: fold only. */
typedef void (*kn_cpu_attn_fold_all_fn)(void *ctx, int b, const uint32_t *vis);
/* Each span's end merges the vectors' states (kn_cpu_attn_span_end), and the
 * walk's end leaves each vector's whole result in its m, l and acc, or a span
 * part's in v->part (kn_cpu_attn_walk_end). */
static inline void kn_cpu_attn_walk_all(struct kn_cpu_attn_vecs *v, kn_cpu_attn_fold_fn fold,
                                        kn_cpu_attn_fold_all_fn all, int all_min, void *ctx) {
  const struct kn_attn_seq *seq = v->seq;
  const int window = v->job->window, n = v->n, *pos = v->pos;
  const int k0 = v->part ? v->part->k0 : 0, k1 = v->part ? v->part->k1 : INT_MAX;
  int lo[KN_ATTN_MAX_VEC], hi[KN_ATTN_MAX_VEC], first = INT_MAX, last = -1;
  for (int i = 0; i < n; i++) {
    kn_cpu_attn_range(seq, window, pos[i], &lo[i], &hi[i]);
    if (lo[i] < k0) lo[i] = k0;
    if (hi[i] > k1 - 1) hi[i] = k1 - 1;
    if (lo[i] > hi[i]) continue; /* nothing in the part (every block's mask is 0) */
    int b0 = lo[i] - lo[i] % KN_ATTN_BLOCK;
    if (b0 < first) first = b0;
    if (hi[i] > last) last = hi[i];
  }
  for (int b = first; b <= last; b += KN_ATTN_BLOCK) {
    uint32_t vis[KN_ATTN_MAX_VEC]; /* bit jj: key b + jj is visible to vector i */
    for (int i = 0; i < n; i++)
      vis[i] = i > 0 && pos[i] == pos[i - 1]
                   ? vis[i - 1]
                   : kn_cpu_attn_block_mask(seq, window, pos[i], lo[i], hi[i], b);
    int live = 0;
    for (int i = 0; all && i < n; i++)
      live += vis[i] != 0;
    if (all && live >= all_min) {
      all(ctx, b, vis);
    } else {
      for (int i = 0; i < n; i++) {
        uint32_t mask = vis[i];
        if (!mask) continue; /* done, or nothing to see in this block */
        int idx[KN_ATTN_MAX_VEC], k = 0;
        for (int i2 = i; i2 < n; i2++)
          if (vis[i2] == mask) {
            vis[i2] = 0;
            idx[k++] = i2;
          }
        fold(ctx, b, mask, idx, k);
      }
    }
    if ((b + KN_ATTN_BLOCK) % KN_ATTN_SPAN == 0 && b + KN_ATTN_BLOCK <= last)
      kn_cpu_attn_span_end(v);
  }
  kn_cpu_attn_walk_end(v);
}
static inline void kn_cpu_attn_walk(struct kn_cpu_attn_vecs *v, kn_cpu_attn_fold_fn fold,
                                    void *ctx) {
  kn_cpu_attn_walk_all(v, fold, NULL, 0, ctx);
}

#endif
