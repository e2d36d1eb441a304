/* kn-cpu-amx.c — the bf16 mode's matmul and attention on AMX-BF16 tiles, for
 * every T, decode included.
 *
 * The weights are the tiles' A operand as they lie in memory: 16 rows by one
 * block of 32 k, 64 bytes a row at the matrix's own row stride. Nothing is
 * repacked or copied at load, so the tiles cost no memory and no load time;
 * only the edges (rows past n, k past K) go through a zero-padded 1 KiB
 * buffer. The inputs are the B operand. round_bf16 writes them already in the
 * tiles' layout: per group of 16 tokens and block of 32 k, one 1 KiB tile
 * whose row i holds the pairs (k = 2i, 2i + 1) of the 16 tokens. The tiles
 * compute C = W x^T, 16 features by 16 tokens, summed over the k-blocks in
 * order; each C is then written back transposed.
 *
 * Batch invariance: C's element (feature f, token t) depends only on W's row
 * f, token t's inputs and the order of the k-blocks, never on the other rows
 * or tokens in the tiles. Every output, whatever T or n, is the same sequence
 * of tdpbf16ps over the k-blocks from zero. Decode (T = 1) runs the same
 * tiles with 15 zero tokens, so it gets prefill's bits. The tiles' sums are not
 * vdpbf16ps's, so every matmul of bf16 weights in the mode switches at once.
 * So does the attention (below): its Q·K and P·V run on the tiles too, decode
 * and prefill alike.
 *
 * This file is compiled twice. Here, the tile instructions are inline
 * assembly with memory clobbers: gcc 12's intrinsics for tile loads declare no
 * memory read, so the edge buffers' stores could be dropped. As
 * kn-cpu-amx-emu.c (KN_AMX_EMULATE), each instruction is a C function written
 * from the pseudocode of Intel's instruction reference (the SDM). The
 * emulated table's matmul runs on every processor, its attention on those
 * with AVX-512-BF16 (the code around the tiles is AVX-512), so the tests check
 * the layouts, the edges and the invariance without the tiles, and the real
 * tiles where the processor has them. kn_cpu_has_amx runs both on a matmul and
 * an attention before the table is used. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/kn-cpu-avx2.h"
#include "kernels/cpu/kn-cpu-avx512bf16.h"
#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/kn-dtype.h"
#include "kernels/kn-quant.h"

#ifdef KN_AMX_EMULATE
#define AMX_FN(name) kn_cpu_amx_##name##_emu
#define AMX_TARGET
#else
#include <cpuid.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/cm-log.h"
#define AMX_FN(name) kn_cpu_amx_##name
#define AMX_TARGET   __attribute__((target("avx2,fma,avx512f,avx512dq,avx512bw,avx512vl,avx512bf16")))
#endif

/* The tile configuration (palette 1): every tile 16 rows of 64 bytes. */
struct amx_cfg {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
_Static_assert(sizeof(struct amx_cfg) == 64, "the tile configuration is 64 bytes");
static const struct amx_cfg amx_cfg16 = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

#ifdef KN_AMX_EMULATE
/* The eight tile registers. */
struct amx_tiles {
  _Alignas(64) unsigned char reg[8][1024];
};
#define AMX_STATE                                                                                  \
  struct amx_tiles amx_regs_;                                                                      \
  struct amx_tiles *const amx_ = &amx_regs_
#define T_CFG(c)         ((void)(c))
#define T_LOAD(t, p, s)  emu_load(amx_, t, p, s)
#define T_STORE(t, p, s) emu_store(amx_, t, p, s)
#define T_ZERO(t)        memset(amx_->reg[t], 0, 1024)
#define T_DP(c, a, b)    emu_dp(amx_, c, a, b)
#define T_RELEASE()      ((void)amx_)

static void emu_load(struct amx_tiles *r, int t, const void *p, ptrdiff_t stride) {
  for (int i = 0; i < 16; i++)
    memcpy(r->reg[t] + 64 * i, (const char *)p + i * stride, 64);
}

static void emu_store(struct amx_tiles *r, int t, void *p, ptrdiff_t stride) {
  for (int i = 0; i < 16; i++)
    memcpy((char *)p + i * stride, r->reg[t] + 64 * i, 64);
}

/* A bf16 input as tdpbf16ps reads it: denormals are zero. */
static float emu_in(uint16_t h) {
  return kn_bf16_to_f32((h & 0x7f80) ? h : (uint16_t)(h & 0x8000));
}

/* Its outputs: denormals flushed to zero. */
static float emu_ftz(float v) {
  return fabsf(v) < 1.17549435e-38f ? copysignf(0.0f, v) : v;
}

/* tdpbf16ps c, a, b as the pseudocode of Intel's instruction reference (SDM)
 * has it: for each row m and column n of c, the even and the odd products of
 * a's row m and b's column n (a[m][2k] * b[k][2n], a[m][2k+1] * b[k][2n+1],
 * k < 16) summed apart, each by fused multiply-adds from zero, then the two
 * sums added and the result added to c[m][n]; inputs' denormals read as
 * zero, outputs' flushed, rounding to nearest even. The tiles need not give
 * these bits (kn_cpu_has_amx compares them with a tolerance), only sums of
 * the same products. */
static void emu_dp(struct amx_tiles *r, int c, int a, int b) {
  float C[256];
  uint16_t A[512], B[512];
  memcpy(C, r->reg[c], sizeof(C));
  memcpy(A, r->reg[a], sizeof(A));
  memcpy(B, r->reg[b], sizeof(B));
  for (int m = 0; m < 16; m++)
    for (int n = 0; n < 16; n++) {
      float even = 0.0f, odd = 0.0f;
      for (int k = 0; k < 16; k++) {
        even = emu_ftz(fmaf(emu_in(A[m * 32 + 2 * k]), emu_in(B[k * 32 + 2 * n]), even));
        odd = emu_ftz(fmaf(emu_in(A[m * 32 + 2 * k + 1]), emu_in(B[k * 32 + 2 * n + 1]), odd));
      }
      C[m * 16 + n] = emu_ftz(C[m * 16 + n] + emu_ftz(even + odd));
    }
  memcpy(r->reg[c], C, sizeof(C));
}
#else
#define AMX_STATE
#define T_CFG(c) __asm__ volatile("ldtilecfg %0" ::"m"(*(c)))
#define T_LOAD(t, p, s)                                                                            \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"((const void *)(p)), "r"((long)(s))        \
                   : "memory")
#define T_STORE(t, p, s)                                                                           \
  __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"((void *)(p)), "r"((long)(s))          \
                   : "memory")
#define T_ZERO(t)     __asm__ volatile("tilezero %%tmm" #t ::)
#define T_DP(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define T_RELEASE()   __asm__ volatile("tilerelease" ::)
#endif

/* The q8 mode's tiles (below): C 16 rows of 16 int32, A 16 rows of 32 bytes,
 * B 8 rows of 64 bytes; tdpbssd (A and B signed) and tdpbsud (B unsigned). */
#ifdef KN_AMX_EMULATE
#define T_LOADA(t, p, s) emu_load_rows(amx_, t, p, s, 16, 32)
#define T_LOADB(t, p, s) emu_load_rows(amx_, t, p, s, 8, 64)
#define T_DPSS(c, a, b)  emu_dpb(amx_, c, a, b, 1)
#define T_DPSU(c, a, b)  emu_dpb(amx_, c, a, b, 0)

/* A tile of rows by colsb bytes, zeros past them (tileloadd's shape). */
static void emu_load_rows(struct amx_tiles *r, int t, const void *p, ptrdiff_t stride, int rows,
                          int colsb) {
  memset(r->reg[t], 0, 1024);
  for (int i = 0; i < rows; i++)
    memcpy(r->reg[t] + 64 * i, (const char *)p + i * stride, (size_t)colsb);
}

/* tdpbssd / tdpbsud c, a, b as the SDM's pseudocode has them for these
 * shapes: c[m][n] += the sum over k < 32 of a[m][k] (signed) times b's
 * row k / 4, byte 4 n + k % 4 (signed or unsigned), in 32-bit integers (no
 * sum here comes near their range: exact). */
static void emu_dpb(struct amx_tiles *r, int c, int a, int b, int bsigned) {
  int32_t C[256];
  memcpy(C, r->reg[c], sizeof(C));
  const int8_t *A = (const int8_t *)r->reg[a];
  const uint8_t *B = r->reg[b];
  for (int m = 0; m < 16; m++)
    for (int n = 0; n < 16; n++) {
      int32_t sum = C[m * 16 + n];
      for (int k = 0; k < 32; k++) {
        const uint8_t bv = B[64 * (k / 4) + 4 * n + k % 4];
        sum += (int32_t)A[64 * m + k] * (bsigned ? (int32_t)(int8_t)bv : (int32_t)bv);
      }
      C[m * 16 + n] = sum;
    }
  memcpy(r->reg[c], C, sizeof(C));
}
#else
#define T_LOADA(t, p, s) T_LOAD(t, p, s)
#define T_LOADB(t, p, s) T_LOAD(t, p, s)
#define T_DPSS(c, a, b)  __asm__ volatile("tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define T_DPSU(c, a, b)  __asm__ volatile("tdpbsud %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#endif

/* Input (t, k) in the tiles' layout, ldx = kn_cpu_bf16_row(K): groups of 16
 * tokens, each a run of 1 KiB tiles, one per block of 32 k. */
static inline size_t amx_at(int t, int k, ptrdiff_t ldx) {
  return (size_t)(t >> 4) * 16 * (size_t)ldx + (size_t)(k >> 5) * 512 +
         (size_t)((k & 31) >> 1) * 32 + (size_t)(t & 15) * 2 + (size_t)(k & 1);
}

/* The offsets of a tile's column, in its 4-byte elements. */
KN_BF16 static inline __m512i amx_column(void) {
  return _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
}

/* One token's block of 32 inputs at x, the first r of them (kn_bf16_round32),
 * its 16 pairs scattered down the B tile's column that starts at col. */
KN_BF16 static inline void amx_put_column(int *col, const float *x, int r) {
  _mm512_i32scatter_epi32(col, amx_column(), kn_bf16_round32(x, r), 4);
}

#ifdef KN_AMX_EMULATE
/* f32 to bf16 as vcvtne2ps2bf16 rounds: to nearest even, denormals to zero,
 * NaN kept quiet. */
static uint16_t round_one(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if (!(u & 0x7f800000u)) return (uint16_t)((u >> 16) & 0x8000u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* kn_cpu_dsp.round_bf16 for the tiles: T tokens (up to the next 16 with
 * zeros) of K inputs (zeros up to ldd) into the layout of amx_at. */
void AMX_FN(round_rows)(uint16_t *dst, ptrdiff_t ldd, const float *in, ptrdiff_t ldi, int T,
                        int K) {
  const int T16 = (T + 15) & ~15;
  for (int t = 0; t < T16; t++)
    for (int k = 0; k < (int)ldd; k++)
      dst[amx_at(t, k, ldd)] = t < T && k < K ? round_one(in[(ptrdiff_t)t * ldi + k]) : 0;
}
#else
/* The same on AVX-512-BF16: each token's block of 32 rounded by one
 * vcvtne2ps2bf16, its 16 pairs scattered down the tile's column. */
AMX_TARGET void AMX_FN(round_rows)(uint16_t *dst, ptrdiff_t ldd, const float *in, ptrdiff_t ldi,
                                   int T, int K) {
  const int T16 = (T + 15) & ~15, KB = (int)(ldd / 32);
  /* the last group's padding tokens: zeros, at once (decode has 15) */
  if (T16 > T) memset(dst + (size_t)(T16 - 16) * (size_t)ldd, 0, (size_t)32 * (size_t)ldd);
  for (int t = 0; t < T; t++)
    for (int b = 0; b < KB; b++)
      amx_put_column((int *)(dst + amx_at(t & ~15, 32 * b, ldd)) + (t & 15),
                     in + (ptrdiff_t)t * ldi + 32 * b, K - 32 * b);
}
#endif

/* Rows [0, nr) and k [0, kr) of a 16-row block of W at w (row stride K),
 * zeros elsewhere, as one A tile at dst. The tile registers are the caller's
 * to save in the ABI, and this runs while C tiles hold sums: the real
 * table's version calls nothing (masked loads, which do not fault past the
 * rows' ends). */
#ifdef KN_AMX_EMULATE
static void amx_edge(uint16_t *dst, const uint16_t *w, int K, int nr, int kr) {
  if (kr > 32) kr = 32;
  memset(dst, 0, 1024);
  for (int r = 0; r < nr; r++)
    memcpy(dst + 32 * r, w + (size_t)r * K, (size_t)kr * 2);
}
#else
AMX_TARGET static inline __attribute__((always_inline)) void
amx_edge(uint16_t *dst, const uint16_t *w, int K, int nr, int kr) {
  const __mmask32 m = kr >= 32 ? 0xffffffffu : (__mmask32)((1u << kr) - 1);
  for (int r = 0; r < 16; r++)
    _mm512_store_si512(dst + 32 * r, r < nr ? _mm512_maskz_loadu_epi16(m, w + (size_t)r * K)
                                            : _mm512_setzero_si512());
}
#endif
/* The same, for the tests. */
AMX_TARGET void AMX_FN(edge)(uint16_t *dst, const uint16_t *w, int K, int nr, int kr) {
  amx_edge(dst, w, K, nr, kr);
}

/* Writes (acc: adds) C, 16 features by 16 tokens (c[16 f + t]), to out: nf
 * features, nt tokens. */
#ifdef KN_AMX_EMULATE
void AMX_FN(put)(float *out, ptrdiff_t ldo, const float *c, int nf, int nt, int acc) {
  for (int t = 0; t < nt; t++) {
    float *o = out + (ptrdiff_t)t * ldo;
    for (int f = 0; f < nf; f++)
      o[f] = acc ? o[f] + c[16 * f + t] : c[16 * f + t];
  }
}
#else
/* ... each token's column gathered, stored under a mask. */
AMX_TARGET void AMX_FN(put)(float *out, ptrdiff_t ldo, const float *c, int nf, int nt, int acc) {
  const __mmask16 m = (__mmask16)((1u << nf) - 1);
  for (int t = 0; t < nt; t++) {
    float *o = out + (ptrdiff_t)t * ldo;
    __m512 v = _mm512_i32gather_ps(amx_column(), c + t, 4);
    if (acc) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, o), v);
    _mm512_mask_storeu_ps(o, m, v);
  }
}
#endif

/* kn_cpu_dsp.dot_bf16 on the tiles: groups of 32 weight rows (two A tiles)
 * against pairs of token groups (two B tiles), four C tiles. x is in the
 * layout of amx_at with ldx = kn_cpu_bf16_row(K). */
AMX_TARGET void AMX_FN(dot)(float *out, ptrdiff_t ldo, const uint16_t *x, ptrdiff_t ldx,
                            const uint16_t *w, int K, int T, int n, int acc) {
  AMX_STATE;
  _Alignas(64) uint16_t pad[2][512];
  _Alignas(64) float c[4][256];
  const int KB = (int)(ldx / 32), KF = K / 32, G = (T + 15) / 16;
  const ptrdiff_t ws = (ptrdiff_t)K * 2, gs = (ptrdiff_t)16 * ldx;
  T_CFG(&amx_cfg16);
  for (int n0 = 0; n0 < n; n0 += 32) {
    const int nr0 = n - n0 < 16 ? n - n0 : 16, nr1 = n - n0 - 16 < 16 ? n - n0 - 16 : 16;
    const uint16_t *w0 = w + (size_t)n0 * K, *w1 = w0 + (size_t)16 * K;
    /* small batches stream the weights: the next group's lines of each block
     * are asked for while this one's are used */
    const int ahead = G <= 2 && n0 + 32 < n ? (n - n0 - 32 < 32 ? n - n0 - 32 : 32) : 0;
    for (int g = 0; g < G; g += 2) {
      const int two = g + 1 < G;
      const uint16_t *x0 = x + g * gs, *x1 = x0 + gs;
      T_ZERO(0);
      T_ZERO(1);
      T_ZERO(2);
      T_ZERO(3);
      for (int b = 0; b < KB; b++) {
        for (int r = 0; r < ahead; r++)
          __builtin_prefetch(w0 + (size_t)(32 + r) * K + 32 * b);
        if (nr0 == 16 && b < KF) {
          T_LOAD(4, w0 + 32 * b, ws);
        } else {
          amx_edge(pad[0], w0 + 32 * b, K, nr0, K - 32 * b);
          T_LOAD(4, pad[0], 64);
        }
        T_LOAD(6, x0 + 512 * b, 64);
        T_DP(0, 4, 6);
        if (two) {
          T_LOAD(7, x1 + 512 * b, 64);
          T_DP(1, 4, 7);
        }
        if (nr1 > 0) {
          if (nr1 == 16 && b < KF) {
            T_LOAD(5, w1 + 32 * b, ws);
          } else {
            amx_edge(pad[1], w1 + 32 * b, K, nr1, K - 32 * b);
            T_LOAD(5, pad[1], 64);
          }
          T_DP(2, 5, 6);
          if (two) T_DP(3, 5, 7);
        }
      }
      const int nt0 = T - 16 * g < 16 ? T - 16 * g : 16;
      const int nt1 = !two ? 0 : T - 16 * (g + 1) < 16 ? T - 16 * (g + 1) : 16;
      float *o0 = out + (ptrdiff_t)16 * g * ldo + n0, *o1 = o0 + (ptrdiff_t)16 * ldo;
      /* all four stored before any is written out: a call may clobber tiles */
      T_STORE(0, c[0], 64);
      if (two) T_STORE(1, c[1], 64);
      if (nr1 > 0) T_STORE(2, c[2], 64);
      if (nr1 > 0 && two) T_STORE(3, c[3], 64);
      AMX_FN(put)(o0, ldo, c[0], nr0, nt0, acc);
      if (two) AMX_FN(put)(o1, ldo, c[1], nr0, nt1, acc);
      if (nr1 > 0) AMX_FN(put)(o0 + 16, ldo, c[2], nr1, nt0, acc);
      if (nr1 > 0 && two) AMX_FN(put)(o1 + 16, ldo, c[3], nr1, nt1, acc);
    }
  }
  T_RELEASE();
}

/* ---- the q8 mode's X16 weights on AMX-INT8 ----------------------------------
 *
 * Matmuls of Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, Q4_K, Q5_K and Q6_K weights in their X16
 * layout (kn-quant.h) against inputs rounded to Q8_0 blocks (struct
 * kn_cpu_q8_in), per 32-element block (a K-quant's sub-block) one tile
 * product C = X W^T, 16 tokens by 16 rows:
 *   - A: the 16 tokens' 32 quants of the block, a row each, read where they
 *     lie (ldq apart; a last group of fewer tokens through a zeroed copy);
 *   - B: the group's 16 rows as their X16 block holds them, four bytes of
 *     each row side by side, a tile row per four elements: the layout the
 *     tiles take. Q8_0: the quants in place, signed (tdpbssd). The others:
 *     their unsigned quants (nibbles, with the fifth bits where there are)
 *     unpacked into a copy (tdpbsud);
 *   - C: per element p, the exact sum of the block's 32 products, which goes
 *     into the accumulator as in every q8 kernel, block after block from
 *     zero: Q4_0 and Q5_0 with the offset's term added to p first (-8 or -16
 *     times the block's input sum, x->o), acc = fma((float)p, dw * dx, acc);
 *     the formats with a min then acc = fma((float)sx, m * dx, acc) (x->o the
 *     sum sx); the K-quants' dw = d * sc and m = -(dmin * min) per sub-block.
 *     kn_cpu_dsp.q8dot's bits, whatever T and n.
 * Two blocks go at a time (two A, two B, two C), so that one product's
 * latency overlaps the other's, and each group's B tiles serve up to
 * AMX_Q8_GROUPS groups of 16 tokens.
 * Q6_K has two scales a 32-element block, one a half: its blocks go one at a
 * time, the A tile against two B tiles, each with one half's tile rows (its
 * quants q - 32, signed: tdpbssd) and the other's zero. C0 and C1 are the
 * halves' exact sums p0 and p1, and p = sc0 p0 + sc1 p1 goes into the
 * accumulator with dw the row's d (q8dot_min_ref's integer and product). */
#define AMX_Q8_GROUPS 4

enum amx_q8_kind { AQ_Q8_0, AQ_Q4_0, AQ_Q5_0, AQ_Q4_1, AQ_Q5_1, AQ_Q4_K, AQ_Q5_K, AQ_Q6_K };

static const struct amx_cfg amx_cfg_q8 = {
    .palette = 1,
    .colsb = {64, 64, 32, 32, 64, 64},
    .rows = {16, 16, 16, 16, 8, 8},
};

/* A group's bytes of one block (the K-quants: one super-block). */
static inline size_t aq_group_bytes(enum amx_q8_kind k) {
  static const unsigned char bytes[] = {34, 18, 22, 20, 24, 144, 176, 210};
  return (size_t)bytes[k] * KN_X16_ROWS;
}

/* 16 rows of a block's nibbles as a B tile, plus 16 in the bytes that a
 * fifth bit marks. A 32-element block's (hi < 0): tile row c < 4 the low
 * nibbles of the 64 bytes at nib + 64 c, row 4 + c their high nibbles, Q5_0's
 * and Q5_1's fifth bits from their planes (pl: plane 2 c for the low, 2 c + 1
 * for the high nibbles). A K-quant sub-block's: row c < 8 the low (hi 0) or
 * high (hi 1) nibbles of nib + 64 c, Q5_K's fifth bits bit j of qh's bytes. */
#ifdef KN_AMX_EMULATE
static void aq_unpack(uint8_t *dst, const uint8_t *nib, int hi, const uint8_t *pl,
                      const uint8_t *qh, int j) {
  for (int c = 0; c < 8; c++)
    for (int i = 0; i < 64; i++) {
      const int h = hi < 0 ? c >= 4 : hi, q = hi < 0 ? c % 4 : c;
      int v = h ? nib[64 * q + i] >> 4 : nib[64 * q + i] & 0x0F;
      if (pl && (pl[16 * q + 8 * h + i / 8] >> i % 8 & 1)) v |= 16;
      if (qh && (qh[64 * c + i] >> j & 1)) v |= 16;
      dst[64 * c + i] = (uint8_t)v;
    }
}
#else
AMX_TARGET static inline __attribute__((always_inline)) void
aq_unpack(uint8_t *dst, const uint8_t *nib, int hi, const uint8_t *pl, const uint8_t *qh, int j) {
  const __m512i lo = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
  for (int c = 0; c < 8; c++) {
    const int h = hi < 0 ? c >= 4 : hi, q = hi < 0 ? c % 4 : c;
    const __m512i v = _mm512_loadu_si512(nib + 64 * q);
    __m512i x = _mm512_and_si512(h ? _mm512_srli_epi16(v, 4) : v, lo);
    if (pl) {
      uint64_t m;
      memcpy(&m, pl + 16 * q + 8 * h, 8);
      x = _mm512_or_si512(x, _mm512_maskz_mov_epi8(m, sixteen));
    }
    if (qh) {
      const __mmask64 m =
          _mm512_test_epi8_mask(_mm512_loadu_si512(qh + 64 * c), _mm512_set1_epi8((char)(1 << j)));
      x = _mm512_or_si512(x, _mm512_maskz_mov_epi8(m, sixteen));
    }
    _mm512_store_si512(dst + 64 * c, x);
  }
}
#endif

/* Block b of the group at g (gb bytes a block) as a B tile: where it lies
 * (Q8_0), or unpacked into buf. */
AMX_TARGET static inline __attribute__((always_inline)) const uint8_t *
aq_btile(enum amx_q8_kind k, const uint8_t *g, size_t gb, int b, uint8_t *buf) {
  if (k >= AQ_Q4_K) {
    const uint8_t *sb = g + (size_t)(b / 8) * gb;
    const int j = b % 8;
    aq_unpack(buf, sb + 256 + 512 * (j / 2), j & 1, NULL, k == AQ_Q5_K ? sb + 2304 : NULL, j);
    return buf;
  }
  const uint8_t *blk = g + (size_t)b * gb;
  if (k == AQ_Q8_0) return blk + 32;
  const int h = k == AQ_Q4_1 || k == AQ_Q5_1 ? 64 : 32; /* the scales (and mins) */
  aq_unpack(buf, blk + h, -1, k == AQ_Q5_0 || k == AQ_Q5_1 ? blk + h + 256 : NULL, NULL, 0);
  return buf;
}

/* Block b's 16 row scales dw and, for the formats with a min, the 16 values
 * m each weight adds (the K-quants': d * sc and -(dmin * min) of sub-block b
 * % 8, each rounded once). */
#ifdef KN_AMX_EMULATE
static void aq_scales(enum amx_q8_kind k, const uint8_t *g, size_t gb, int b, float *dw,
                      float *mw) {
  if (k >= AQ_Q4_K) {
    const uint8_t *sb = g + (size_t)(b / 8) * gb;
    const int j = b % 8;
    for (int r = 0; r < 16; r++) {
      uint8_t q[12];
      for (int w = 0; w < 3; w++)
        memcpy(q + 4 * w, sb + 64 + 64 * w + 4 * r, 4);
      const int sc = j < 4 ? q[j] & 63 : (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
      const int mn = j < 4 ? q[j + 4] & 63 : (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
      dw[r] = kn_le_f16(sb + 2 * r) * (float)sc;
      mw[r] = -(kn_le_f16(sb + 32 + 2 * r) * (float)mn);
    }
    return;
  }
  const uint8_t *blk = g + (size_t)b * gb;
  for (int r = 0; r < 16; r++) {
    dw[r] = kn_le_f16(blk + 2 * r);
    mw[r] = k == AQ_Q4_1 || k == AQ_Q5_1 ? kn_le_f16(blk + 32 + 2 * r) : 0.0f;
  }
}
#else
AMX_TARGET static inline __attribute__((always_inline)) void
aq_scales(enum amx_q8_kind k, const uint8_t *g, size_t gb, int b, float *dw, float *mw) {
  if (k >= AQ_Q4_K) {
    const uint8_t *sb = g + (size_t)(b / 8) * gb;
    const int j = b % 8;
    const __m512i d0 = _mm512_loadu_si512(sb + 64), d1 = _mm512_loadu_si512(sb + 128),
                  d2 = _mm512_loadu_si512(sb + 192), six = _mm512_set1_epi32(63),
                  four = _mm512_set1_epi32(0x0F), two = _mm512_set1_epi32(3);
    __m512i sc, mn;
    if (j < 4) {
      sc = _mm512_and_si512(_mm512_srli_epi32(d0, 8 * j), six);
      mn = _mm512_and_si512(_mm512_srli_epi32(d1, 8 * j), six);
    } else {
      const unsigned s = 8 * (unsigned)(j - 4);
      const __m512i c2 = _mm512_srli_epi32(d2, s);
      sc = _mm512_or_si512(
          _mm512_and_si512(c2, four),
          _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(d0, s + 6), two), 4));
      mn = _mm512_or_si512(
          _mm512_and_si512(_mm512_srli_epi32(c2, 4), four),
          _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(d1, s + 6), two), 4));
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sb));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sb + 32)));
    _mm512_store_ps(dw, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
    _mm512_store_ps(
        mw, _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn))));
    return;
  }
  const uint8_t *blk = g + (size_t)b * gb;
  _mm512_store_ps(dw, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk)));
  _mm512_store_ps(mw, k == AQ_Q4_1 || k == AQ_Q5_1
                          ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)))
                          : _mm512_setzero_ps());
}
#endif

/* Q6_K's sub-block b of the group at g (gb bytes a super-block): tile rows
 * 0-3 of lo and 4-7 of hi (the halves' elements four at a time; the other
 * rows stay zero) its quants q - 32, from the bytes of ql's quads 16 h + 8
 * (c & 1) + k (the high nibbles from c & 2) and qh's quads 8 h + k (bits 2
 * (c & 3) and up), c = b % 8, h = c / 4; the rows' scales of the halves s0
 * and s1 (bytes 2 c and 2 c + 1 of the 16) and their d, dw. */
#ifdef KN_AMX_EMULATE
static void aq_q6(const uint8_t *g, size_t gb, int b, uint8_t *lo, uint8_t *hi, int32_t *s0,
                  int32_t *s1, float *dw) {
  const uint8_t *sb = g + (size_t)(b / 8) * gb;
  const int c = b % 8, h = c / 4, p = c % 4;
  for (int k = 0; k < 8; k++) {
    const uint8_t *ql = sb + 288 + 64 * (16 * h + 8 * (p & 1) + k),
                  *qh = sb + 2336 + 64 * (8 * h + k);
    for (int i = 0; i < 64; i++) {
      const int v = ((p >= 2 ? ql[i] >> 4 : ql[i]) & 0x0F) | ((qh[i] >> (2 * p)) & 3) << 4;
      (k < 4 ? lo : hi)[64 * k + i] = (uint8_t)(int8_t)(v - 32);
    }
  }
  for (int r = 0; r < 16; r++) {
    const uint8_t *sc = sb + 32 + 64 * (c / 2) + 4 * r + 2 * (c & 1);
    s0[r] = (int8_t)sc[0];
    s1[r] = (int8_t)sc[1];
    dw[r] = kn_le_f16(sb + 2 * r);
  }
}

/* The first nt tokens' p = s0 c0 + s1 c1, row by row, into c0. */
static void aq_q6_sum(int32_t *c0, const int32_t *c1, const int32_t *s0, const int32_t *s1,
                      int nt) {
  for (int m = 0; m < nt; m++)
    for (int r = 0; r < 16; r++)
      c0[16 * m + r] = s0[r] * c0[16 * m + r] + s1[r] * c1[16 * m + r];
}
#else
AMX_TARGET static inline __attribute__((always_inline)) void aq_q6(const uint8_t *g, size_t gb,
                                                                   int b, uint8_t *lo, uint8_t *hi,
                                                                   int32_t *s0, int32_t *s1,
                                                                   float *dw) {
  const uint8_t *sb = g + (size_t)(b / 8) * gb;
  const int c = b % 8, h = c / 4, p = c % 4;
  const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(3), k32 = _mm512_set1_epi8(32);
  for (int k = 0; k < 8; k++) {
    __m512i l = _mm512_loadu_si512(sb + 288 + 64 * (16 * h + 8 * (p & 1) + k));
    const __m512i q = _mm512_loadu_si512(sb + 2336 + 64 * (8 * h + k));
    if (p >= 2) l = _mm512_srli_epi16(l, 4);
    /* the shifts within 16-bit lanes: each byte keeps its own bits after the masks */
    const __m512i up = _mm512_and_si512(_mm512_srli_epi16(q, (unsigned)(2 * p)), m2);
    const __m512i v = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_slli_epi16(up, 4));
    _mm512_store_si512((k < 4 ? lo : hi) + 64 * k, _mm512_sub_epi8(v, k32));
  }
  const __m512i sc = _mm512_loadu_si512(sb + 32 + 64 * (c / 2));
  const unsigned at = 16 * (unsigned)(c & 1);
  _mm512_store_si512(s0, _mm512_srai_epi32(_mm512_slli_epi32(sc, 24 - at), 24));
  _mm512_store_si512(s1, _mm512_srai_epi32(_mm512_slli_epi32(sc, 16 - at), 24));
  _mm512_store_ps(dw, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sb)));
}

AMX_TARGET static inline __attribute__((always_inline)) void
aq_q6_sum(int32_t *c0, const int32_t *c1, const int32_t *s0, const int32_t *s1, int nt) {
  const __m512i a = _mm512_load_si512(s0), b = _mm512_load_si512(s1);
  for (int m = 0; m < nt; m++)
    _mm512_store_si512(c0 + 16 * m,
                       _mm512_add_epi32(_mm512_mullo_epi32(a, _mm512_load_si512(c0 + 16 * m)),
                                        _mm512_mullo_epi32(b, _mm512_load_si512(c1 + 16 * m))));
}
#endif

/* The 32 quants of the first nt tokens' block at q (ldq apart), zeros after,
 * as one A tile at dst. The real table's version calls nothing: it runs while
 * B tiles hold weights, and the ABI leaves the tile registers to the callee. */
#ifdef KN_AMX_EMULATE
static void amx_q8_edge(uint8_t *dst, const uint8_t *q, size_t ldq, int nt) {
  memset(dst, 0, 16 * 32);
  for (int m = 0; m < nt; m++)
    memcpy(dst + 32 * m, q + (size_t)m * ldq, 32);
}
#else
AMX_TARGET static inline __attribute__((always_inline)) void
amx_q8_edge(uint8_t *dst, const uint8_t *q, size_t ldq, int nt) {
  for (int m = 0; m < 16; m++)
    _mm256_store_si256((__m256i *)(dst + 32 * m),
                       m < nt ? _mm256_loadu_si256((const __m256i *)(q + (size_t)m * ldq))
                              : _mm256_setzero_si256());
}
#endif

/* One block's C (c[16 m + r]: token m, row r) into acc[16 m + r] for the
 * first nt tokens: dw and mw the rows' (aq_scales), dx the tokens' scales and
 * o their blocks' offset terms or input sums (both B apart); with an offset
 * (off) o is added to the integer first, with a min (mn) it is sx. */
#ifdef KN_AMX_EMULATE
static void amx_q8_fold(float *acc, const int32_t *c, const float *dw, const float *mw,
                        const float *dx, const int32_t *o, int B, int nt, int off, int mn) {
  for (int m = 0; m < nt; m++)
    for (int r = 0; r < 16; r++) {
      const float x = dx[(size_t)m * B];
      const int32_t p = c[16 * m + r] + (off ? o[(size_t)m * B] : 0);
      float a = fmaf((float)p, dw[r] * x, acc[16 * m + r]);
      if (mn) a = fmaf((float)o[(size_t)m * B], mw[r] * x, a);
      acc[16 * m + r] = a;
    }
}
#else
AMX_TARGET static inline __attribute__((always_inline)) void
amx_q8_fold(float *acc, const int32_t *c, const float *dw, const float *mw, const float *dx,
            const int32_t *o, int B, int nt, int off, int mn) {
  const __m512 d = _mm512_load_ps(dw), mv = _mm512_load_ps(mw);
  for (int m = 0; m < nt; m++) {
    const __m512 x = _mm512_set1_ps(dx[(size_t)m * B]);
    __m512i p = _mm512_load_si512(c + 16 * m);
    if (off) p = _mm512_add_epi32(p, _mm512_set1_epi32(o[(size_t)m * B]));
    __m512 a =
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(d, x), _mm512_load_ps(acc + 16 * m));
    if (mn) a = _mm512_fmadd_ps(_mm512_set1_ps((float)o[(size_t)m * B]), _mm512_mul_ps(mv, x), a);
    _mm512_store_ps(acc + 16 * m, a);
  }
}
#endif

/* kn_cpu_dsp.q8tiles of format k's X16 rows: n (a multiple of 16) rows from w
 * against T tokens. */
AMX_TARGET static void amx_q8_tiles(const enum amx_q8_kind k, float *out, ptrdiff_t ldo,
                                    const struct kn_cpu_q8_in *x, const uint8_t *w,
                                    size_t row_bytes, int K, int T, int n, int accumulate) {
  AMX_STATE;
  _Alignas(64) uint8_t pa[2][16 * 32], pb[2][512] = {{0}}; /* Q6_K: the zero rows stay */
  _Alignas(64) int32_t c[2][256], s6[2][16] = {{0}};
  _Alignas(64) float acc[AMX_Q8_GROUPS][256], dw[2][16] = {{0}}, mw[2][16] = {{0}};
  const int q6 = k == AQ_Q6_K, B = K / 32, off = k == AQ_Q4_0 || k == AQ_Q5_0;
  const int mn = k >= AQ_Q4_1 && !q6;
  const size_t gb = aq_group_bytes(k), ldq = x->ldq;
  T_CFG(&amx_cfg_q8);
  for (int j = 0; j < n; j += KN_X16_ROWS) {
    const uint8_t *g = w + (size_t)j * row_bytes;
    for (int t0 = 0; t0 < T; t0 += 16 * AMX_Q8_GROUPS) {
      const int ng = (T - t0 + 15) / 16 < AMX_Q8_GROUPS ? (T - t0 + 15) / 16 : AMX_Q8_GROUPS;
      memset(acc, 0, sizeof(float) * 256 * (size_t)ng);
      for (int b = 0; b < B; b += q6 ? 1 : 2) {
        const int two = !q6 && b + 1 < B;
        if (q6) {
          aq_q6(g, gb, b, pb[0], pb[1], s6[0], s6[1], dw[0]);
          T_LOADB(4, pb[0], 64);
          T_LOADB(5, pb[1], 64);
        } else {
          aq_scales(k, g, gb, b, dw[0], mw[0]);
          T_LOADB(4, aq_btile(k, g, gb, b, pb[0]), 64);
        }
        if (two) {
          aq_scales(k, g, gb, b + 1, dw[1], mw[1]);
          T_LOADB(5, aq_btile(k, g, gb, b + 1, pb[1]), 64);
        }
        for (int i = 0; i < ng; i++) {
          const int t = t0 + 16 * i, nt = T - t < 16 ? T - t : 16;
          const uint8_t *q = x->q + (size_t)t * ldq + 34 * (size_t)b + 2;
          if (nt == 16) {
            T_LOADA(2, q, ldq);
            if (two) T_LOADA(3, q + 34, ldq);
          } else { /* the last tokens and zeros: no read past the inputs */
            amx_q8_edge(pa[0], q, ldq, nt);
            T_LOADA(2, pa[0], 32);
            if (two) {
              amx_q8_edge(pa[1], q + 34, ldq, nt);
              T_LOADA(3, pa[1], 32);
            }
          }
          T_ZERO(0);
          if (k == AQ_Q8_0 || q6)
            T_DPSS(0, 2, 4);
          else
            T_DPSU(0, 2, 4);
          if (q6) { /* the second half's B against the same A */
            T_ZERO(1);
            T_DPSS(1, 2, 5);
          } else if (two) {
            T_ZERO(1);
            if (k == AQ_Q8_0)
              T_DPSS(1, 3, 5);
            else
              T_DPSU(1, 3, 5);
          }
          T_STORE(0, c[0], 64);
          if (two || q6) T_STORE(1, c[1], 64);
          if (q6) aq_q6_sum(c[0], c[1], s6[0], s6[1], nt);
          const float *dx = x->d + (size_t)t * B + b;
          const int32_t *o = off || mn ? x->o + (size_t)t * B + b : NULL;
          amx_q8_fold(acc[i], c[0], dw[0], mw[0], dx, o, B, nt, off, mn);
          if (two)
            amx_q8_fold(acc[i], c[1], dw[1], mw[1], dx + 1, o ? o + 1 : NULL, B, nt, off, mn);
        }
      }
      for (int i = 0; i < ng; i++) {
        const int t = t0 + 16 * i, nt = T - t < 16 ? T - t : 16;
        for (int m = 0; m < nt; m++) {
          float *dst = out + (ptrdiff_t)(t + m) * ldo + j;
          for (int r = 0; r < KN_X16_ROWS; r++)
            dst[r] = accumulate ? dst[r] + acc[i][16 * m + r] : acc[i][16 * m + r];
        }
      }
    }
  }
  T_RELEASE();
}

#define DEF_AQ(SUF, KIND)                                                                          \
  AMX_TARGET void AMX_FN(q8tiles_##SUF)(float *out, ptrdiff_t ldo, const struct kn_cpu_q8_in *x,   \
                                        const uint8_t *w, size_t row_bytes, int K, int T, int n,   \
                                        int accumulate) {                                          \
    amx_q8_tiles(KIND, out, ldo, x, w, row_bytes, K, T, n, accumulate);                            \
  }
DEF_AQ(q8_0, AQ_Q8_0)
DEF_AQ(q4_0, AQ_Q4_0)
DEF_AQ(q5_0, AQ_Q5_0)
DEF_AQ(q4_1, AQ_Q4_1)
DEF_AQ(q5_1, AQ_Q5_1)
DEF_AQ(q4_k, AQ_Q4_K)
DEF_AQ(q5_k, AQ_Q5_K)
DEF_AQ(q6_k, AQ_Q6_K)

/* kn_cpu_dsp.q8tiles: this build's kernels (the tiles', or the emulated). */
void AMX_FN(q8_init)(struct kn_cpu_dsp *dsp) {
  dsp->q8tiles[KN_DTYPE_Q8_0_X16] = AMX_FN(q8tiles_q8_0);
  dsp->q8tiles[KN_DTYPE_Q4_0_X16] = AMX_FN(q8tiles_q4_0);
  dsp->q8tiles[KN_DTYPE_Q5_0_X16] = AMX_FN(q8tiles_q5_0);
  dsp->q8tiles[KN_DTYPE_Q4_1_X16] = AMX_FN(q8tiles_q4_1);
  dsp->q8tiles[KN_DTYPE_Q5_1_X16] = AMX_FN(q8tiles_q5_1);
  dsp->q8tiles[KN_DTYPE_Q4_K_X16] = AMX_FN(q8tiles_q4_k);
  dsp->q8tiles[KN_DTYPE_Q5_K_X16] = AMX_FN(q8tiles_q5_k);
  dsp->q8tiles[KN_DTYPE_Q6_K_X16] = AMX_FN(q8tiles_q6_k);
}

/* ---- attention ------------------------------------------------------------ */

/* The bf16 mode's paged attention on the tiles: the blocks, their order, the
 * online softmax and the vectors (query heads of rows) that share a block are
 * kn-cpu-attn-avx2.c's; the queries and the probabilities are rounded to bf16
 * as in kn-cpu-attn-bf16.c. Per key block and group of vectors:
 *   - S^T = K Q^T: A the block's visible key rows (16 keys by 32 dims, copied
 *     together), B the call's queries in round_rows' layout (a vector per
 *     column): C, 16 keys by 16 vectors, summed over the head dim's blocks of
 *     32 in order; then scaled (and softcapped) per vector;
 *   - the softmax step on each vector's scores, the visible keys'
 *     probabilities rounded to bf16 in pairs;
 *   - P V: A the probabilities (a vector per row, 16 pairs of keys), B the V
 *     rows two by two interleaved element by element, 16 dims a tile: C, 16
 *     vectors by 16 dims; the accumulator times the softmax's correction,
 *     plus C.
 * A vector's scores are its own column of C, its output its own rows, so its
 * bits do not depend on the call's other vectors: a decode row, a row in a
 * prefill tile, chunked or batched, all agree. There is no transposed copy of
 * the keys: the key rows are the A operand as they lie, and V is interleaved
 * in pairs as the AVX-512-BF16 kernel does already. */
struct amx_attn {
  struct kn_cpu_attn_vecs w;
  _Alignas(64) uint16_t qt[KN_MAX_HEAD_DIM / 32][512];      /* the queries (B) */
  _Alignas(64) uint16_t kb[KN_ATTN_BLOCK][KN_MAX_HEAD_DIM]; /* the visible keys (A) */
  _Alignas(64) uint16_t vt[KN_MAX_HEAD_DIM / 16][512];      /* V's pairs (B) */
#ifdef KN_AMX_EMULATE
  struct amx_tiles regs;
#endif
};
#ifdef KN_AMX_EMULATE
#define AMX_STATE_OF(a) struct amx_tiles *const amx_ = &(a)->regs
#else
#define AMX_STATE_OF(a) (void)(a)
#endif

/* Rows [0, nv) of a block's V, in pairs, as the B tiles of P V: tile s, row
 * i holds (V[2i][16 s + n], V[2i + 1][16 s + n]) for n < 16; pairs past the
 * block's are zero (their probabilities are, and 0 times a stale row could be
 * NaN). */
KN_BF16 static void amx_v_pairs(uint16_t (*vt)[512], const void *const *vp, int nv, int D) {
  static const uint16_t pick[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                    8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i lo = _mm512_loadu_si512(pick);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int i = 0; i < 16; i++) {
    const uint16_t *a = 2 * i < nv ? vp[2 * i] : NULL;
    const uint16_t *b = 2 * i + 1 < nv ? vp[2 * i + 1] : kn_bf16_zero_row;
    for (int d = 0; d < D; d += 32) {
      __m512i x = _mm512_setzero_si512(), y = x;
      if (a) {
        x = _mm512_loadu_si512(a + d);
        y = _mm512_loadu_si512(b + d);
      }
      _mm512_store_si512(&vt[d / 16][32 * i], _mm512_permutex2var_epi16(x, lo, y));
      _mm512_store_si512(&vt[d / 16 + 1][32 * i], _mm512_permutex2var_epi16(x, hi, y));
    }
  }
}

/* kn_cpu_attn_fold_fn: block b's keys in mask folded into vectors idx[0 .. k). */
KN_BF16 static void amx_fold(void *ctx, int b, uint32_t mask, const int *idx, int k) {
  struct amx_attn *a = ctx;
  AMX_STATE_OF(a);
  const struct kn_cpu_attn_job *job = a->w.job;
  const int D = job->view->head_dim;
  struct kn_cpu_attn_group g;
  kn_cpu_attn_group_take(&g, &a->w, b, mask, idx, k);
  const int nv = g.n_vis;
  _Alignas(64) float st[2][256];
  for (int h = 0; 16 * h < nv; h++) {
    /* 16 visible keys at one stride (a page's run of tokens) are loaded
     * where they lie; others are copied together first */
    const char *k0 = g.kp[16 * h];
    ptrdiff_t ks = 16 * h + 1 < nv ? (const char *)g.kp[16 * h + 1] - k0 : 0;
    int direct = 16 * h + 16 <= nv;
    for (int j = 2; direct && j < 16; j++)
      direct = (const char *)g.kp[16 * h + j] - k0 == j * ks;
    if (!direct) {
      for (int j = 16 * h; j < nv && j < 16 * h + 16; j++)
        memcpy(a->kb[j], g.kp[j], (size_t)D * 2);
      k0 = (const char *)a->kb[16 * h];
      ks = 2 * KN_MAX_HEAD_DIM;
    }
    T_ZERO(0);
    for (int d = 0; d < D; d += 32) {
      T_LOAD(4, k0 + 2 * d, ks);
      T_LOAD(6, a->qt[d / 32], 64);
      T_DP(0, 4, 6);
    }
    T_STORE(0, st[h], 64);
  }
  for (int j = 0; j < k; j++)
    for (int c = 0; c < nv; c++)
      g.s[j][g.vj[c]] = st[c >> 4][16 * (c & 15) + idx[j]] * job->scale;
  if (job->softcap > 0.0f) kn_cpu_attn_softcap(g.s, k, g.vj, nv, job->softcap);
  _Alignas(64) uint32_t pp[16][KN_ATTN_BLOCK / 2];
  float corr[16];
  memset(pp, 0, sizeof(pp));
  kn_bf16_block_probs(g.s, k, g.vj, nv, g.m, g.l, corr, pp);
  amx_v_pairs(a->vt, g.vp, nv, D);
  _Alignas(64) float ct[256];
  T_LOAD(4, pp, 64);
  for (int s = 0; s < D / 16; s++) {
    T_ZERO(0);
    T_LOAD(6, a->vt[s], 64);
    T_DP(0, 4, 6);
    T_STORE(0, ct, 64);
    for (int j = 0; j < k; j++) {
      float *o = g.acc[j] + 16 * s;
      _mm512_store_ps(o, _mm512_add_ps(_mm512_mul_ps(_mm512_load_ps(o), _mm512_set1_ps(corr[j])),
                                       _mm512_load_ps(ct + 16 * j)));
    }
  }
  kn_cpu_attn_group_give(&g, &a->w, idx, k);
}

/* kn_cpu_attn_run_fn: a set of vectors, their queries rounded into the B
 * tiles, over their blocks (kn_cpu_attn_walk); then each written over l. */
KN_BF16 static void amx_attn_vectors(void *ctx, const float *const *q) {
  struct amx_attn *a = ctx;
  AMX_STATE_OF(a);
  struct kn_cpu_attn_vecs *w = &a->w;
  const int D = w->job->view->head_dim, n = w->n;
  for (int i = 0; i < 16; i++)
    for (int d = 0; d < D; d += 32)
      amx_put_column((int *)a->qt[d / 32] + i, i < n ? q[i] + d : NULL, i < n ? 32 : 0);
  T_CFG(&amx_cfg16);
  kn_cpu_attn_walk(w, amx_fold, a);
  T_RELEASE();
  for (int i = 0; i < n; i++) {
    __m512 lv = _mm512_set1_ps(w->l[i]);
    for (int d = 0; d < D; d += 16)
      _mm512_storeu_ps(w->out[i] + d, _mm512_div_ps(_mm512_load_ps(&w->acc[i][d]), lv));
  }
}

/* kn_cpu_attn_tile_fn of the bf16 mode on the tiles: rows i0 .. i0 + nr - 1, head by head. */
KN_BF16 void AMX_FN(attn_tile)(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq,
                               int i0, int nr, int kvh, int g0, int ng) {
  struct amx_attn a; /* not zeroed: kn_cpu_attn_sets sets what the walk reads */
  kn_cpu_attn_bf16_sets(&a.w, job, seq, i0, nr, kvh, g0, ng, amx_attn_vectors, &a);
}

/* kn_cpu_attn_fn of the bf16 mode on the tiles: query heads g0 .. g0 + ng - 1 of
 * row i, the tile of that one row. */
KN_BF16 void AMX_FN(attn)(const struct kn_cpu_attn_job *job, const struct kn_attn_seq *seq, int i,
                          int kvh, int g0, int ng) {
  AMX_FN(attn_tile)(job, seq, i, 1, kvh, g0, ng);
}

#ifdef KN_AMX_EMULATE
void kn_cpu_dsp_init_amx_emulated(struct kn_cpu_dsp *dsp) {
  /* the inputs' layout as the real table writes it where the table underneath
   * is AVX-512-BF16's (not where LMSERVE_KERNELS capped it lower) */
  const int simd = dsp->isa >= KN_CPU_ISA_AVX512BF16;
  dsp->round_bf16 = simd ? kn_cpu_amx_round_rows : kn_cpu_amx_round_rows_emu;
  dsp->dot_bf16 = kn_cpu_amx_dot_emu;
  if (simd) { /* its softmax and pairs are AVX-512 code */
    dsp->attn_bf16 = kn_cpu_amx_attn_emu;
    dsp->attn_tile_bf16 = kn_cpu_amx_attn_tile_emu;
  }
  dsp->bf16_tokens = 16;
  dsp->bf16_rows = 32;
}
#else
/* What the processor and the kernel allow: AMX-TILE and AMX-BF16 (CPUID leaf
 * 7, EDX bits 24 and 22), the tile state enabled in XCR0 (bits 17 and 18),
 * and this process's permission to use it, which Linux grants on request
 * (arch_prctl ARCH_REQ_XCOMP_PERM, since 5.16). 0 when all hold; 1 when the
 * processor has no tiles; -1 with *why when it has them but they are not
 * allowed. */
#define AMX_ARCH_GET_XCOMP_PERM 0x1022
#define AMX_ARCH_REQ_XCOMP_PERM 0x1023
#define AMX_XFEATURE_XTILEDATA  18
static int amx_allowed(const char **why) {
  unsigned a, b, c, d;
  if (!kn_cpu_has_avx512bf16() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 1;
  if (!((d >> 24) & 1) || !((d >> 22) & 1)) return 1;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return 1;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) {
    *why = "the kernel does not enable the tile state (XCR0)";
    return -1;
  }
  unsigned long perm = 0;
  if (syscall(SYS_arch_prctl, AMX_ARCH_REQ_XCOMP_PERM, AMX_XFEATURE_XTILEDATA) != 0 ||
      syscall(SYS_arch_prctl, AMX_ARCH_GET_XCOMP_PERM, &perm) != 0 ||
      !(perm & (1ul << AMX_XFEATURE_XTILEDATA))) {
    *why = "the kernel refused this process the tile state (arch_prctl ARCH_REQ_XCOMP_PERM)";
    return -1;
  }
  return 0;
}

/* The checks' inputs: a value in [-1, 1] in steps of 1e-3 from the generator s. */
static float amx_check_value(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return (float)((int)(*s >> 8) % 2001 - 1000) / 1000.0f;
}

/* The tiles against their emulation on one problem with every edge (19
 * tokens, 37 rows, K = 70), and a token alone against the batch: NULL, or
 * what differed. Run once before the table is used, so that a processor or
 * kernel that computes otherwise than the instruction reference says falls
 * back to the AVX-512-BF16 table instead of serving wrong numbers. */
static const char *amx_selfcheck(void) {
  enum { T = 19, N = 37, K = 70, LDX = 96 };
  static float in[T * K], got[T * N], want[T * N], one[N];
  static uint16_t w[N * K], x[32 * LDX], xv[32 * LDX], x1[16 * LDX];
  uint32_t s = 12345;
  for (int i = 0; i < T * K; i++)
    in[i] = amx_check_value(&s);
  for (int i = 0; i < N * K; i++)
    w[i] = kn_f32_to_bf16(amx_check_value(&s) / 2.0f);
  kn_cpu_amx_round_rows_emu(x, LDX, in, K, T, K);
  kn_cpu_amx_round_rows(xv, LDX, in, K, T, K);
  if (memcmp(x, xv, sizeof(x))) return "the inputs' layout differs from its C version";
  kn_cpu_amx_dot(got, N, x, LDX, w, K, T, N, 0);
  kn_cpu_amx_dot_emu(want, N, x, LDX, w, K, T, N, 0);
  for (int t = 0; t < T; t++)
    for (int j = 0; j < N; j++) {
      double mag = 0.0;
      for (int k = 0; k < K; k++)
        mag += fabs((double)kn_bf16_to_f32(x[amx_at(t, k, LDX)]) * kn_bf16_to_f32(w[j * K + k]));
      if (!(fabs((double)got[t * N + j] - want[t * N + j]) <= 1e-5 * mag + 1e-30))
        return "the tiles' sums differ from the emulated instructions'";
    }
  kn_cpu_amx_round_rows(x1, LDX, in + 5 * K, K, 1, K);
  kn_cpu_amx_dot(one, N, x1, LDX, w, K, 1, N, 0);
  if (memcmp(one, got + 5 * N, sizeof(one))) return "a token alone differs from the batch";
  return NULL;
}

/* The attention kernels tile and row against the emulated tiles' on a small
 * cache (40 tokens in 3 pages of 16, two query heads on one kv head, 64 dims):
 * every output within 0.02 (averages of V in [-1, 1]: a wrong layout misses by
 * far more; a score one ulp off may round a probability apart), and a row
 * alone bit-equal to its tile. NULL, or what differed. */
const char *kn_cpu_amx_check_attention(kn_cpu_attn_tile_fn tile, kn_cpu_attn_fn row) {
  enum { L = 40, H = 2, D = 64, BT = 16, PAGES = 3, PAGE = 2 * BT * D * 2 };
  static uint16_t pool[PAGES * PAGE / 2];
  static float q[L * H * D], got[L * H * D], want[L * H * D], one[L * H * D];
  static const int32_t table[PAGES] = {0, 1, 2};
  uint32_t s = 4242;
  for (size_t i = 0; i < sizeof(pool) / sizeof(pool[0]); i++)
    pool[i] = kn_f32_to_bf16(amx_check_value(&s));
  for (int i = 0; i < L * H * D; i++)
    q[i] = amx_check_value(&s);
  const struct kn_kv_view view = {.pool = pool,
                                  .page_bytes = PAGE,
                                  .n_pages = PAGES,
                                  .k_off = 0,
                                  .v_off = PAGE / 2,
                                  .block_tokens = BT,
                                  .n_kv_heads = 1,
                                  .head_dim = D,
                                  .dtype = KN_DTYPE_BF16};
  const struct kn_attn_seq seq = {.n_q = L, .block_table = table, .n_blocks = PAGES};
  struct kn_cpu_attn_job job = {.out = got,
                                .ldo = H * D,
                                .q = q,
                                .ldq = H * D,
                                .view = &view,
                                .seqs = &seq,
                                .n_heads = H,
                                .scale = 0.125f};
  for (int i0 = 0; i0 < L; i0 += 16)
    tile(&job, &seq, i0, L - i0 < 16 ? L - i0 : 16, 0, 0, H);
  job.out = want;
  for (int i0 = 0; i0 < L; i0 += 16)
    kn_cpu_amx_attn_tile_emu(&job, &seq, i0, L - i0 < 16 ? L - i0 : 16, 0, 0, H);
  job.out = one;
  row(&job, &seq, 37, 0, 0, H);
  for (int i = 0; i < L * H * D; i++)
    if (!(fabsf(got[i] - want[i]) <= 0.02f)) return "the attention differs from its emulation";
  if (memcmp(one + 37 * H * D, got + 37 * H * D, sizeof(float) * H * D))
    return "an attention row alone differs from its tile";
  return NULL;
}

static int amx_ok;
static void amx_probe(void) {
  const char *why = NULL;
  int rc = amx_allowed(&why);
  if (rc == 0 && (why = amx_selfcheck()) != NULL) rc = -1;
  if (rc == 0 && (why = kn_cpu_amx_check_attention(kn_cpu_amx_attn_tile, kn_cpu_amx_attn)) != NULL)
    rc = -1;
  if (rc < 0) cm_warn("kn", "AMX tiles present but not used: %s", why);
  amx_ok = rc == 0;
}

int kn_cpu_has_amx(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, amx_probe);
  return amx_ok;
}

double kn_cpu_amx_dp_rate(long n) {
  if (!kn_cpu_has_amx()) return -1.0;
  T_CFG(&amx_cfg16);
  T_ZERO(4);
  T_ZERO(5);
  T_ZERO(6);
  T_ZERO(7);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < n; i++) { /* four independent sums: throughput, not latency */
    T_DP(0, 4, 6);
    T_DP(1, 4, 7);
    T_DP(2, 5, 6);
    T_DP(3, 5, 7);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  T_RELEASE();
  double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  return s > 0.0 ? 4.0 * (double)n / s : -1.0;
}

/* The q8 tiles against their emulation, bit for bit, every format on one
 * problem with every edge (19 tokens: a group and three; 32 rows: two
 * groups; K = 96, a pair of blocks and one alone, or one K-quant super-block):
 * NULL, or what differed. */
typedef void (*amx_q8_fn)(float *, ptrdiff_t, const struct kn_cpu_q8_in *, const uint8_t *, size_t,
                          int, int, int, int);
static const char *amx_q8_selfcheck(void) {
  enum { T = 19, N = 32, KM = 256, BM = KM / 32 };
  static float in[T * KM], row[KM], got[T * N], want[T * N], d[T * BM];
  static uint8_t q[T * 34 * BM], w[N * 210];
  static int32_t o[T * BM];
  static const struct {
    enum kn_dtype dt;
    amx_q8_fn real, emu;
    int K, off; /* off: the offset's multiple of the input sum (0: the sum, for a min) */
  } fs[] = {
      {KN_DTYPE_Q8_0, kn_cpu_amx_q8tiles_q8_0, kn_cpu_amx_q8tiles_q8_0_emu, 96, 0},
      {KN_DTYPE_Q4_0, kn_cpu_amx_q8tiles_q4_0, kn_cpu_amx_q8tiles_q4_0_emu, 96, -8},
      {KN_DTYPE_Q5_0, kn_cpu_amx_q8tiles_q5_0, kn_cpu_amx_q8tiles_q5_0_emu, 96, -16},
      {KN_DTYPE_Q4_1, kn_cpu_amx_q8tiles_q4_1, kn_cpu_amx_q8tiles_q4_1_emu, 96, 0},
      {KN_DTYPE_Q5_1, kn_cpu_amx_q8tiles_q5_1, kn_cpu_amx_q8tiles_q5_1_emu, 96, 0},
      {KN_DTYPE_Q4_K, kn_cpu_amx_q8tiles_q4_k, kn_cpu_amx_q8tiles_q4_k_emu, 256, 0},
      {KN_DTYPE_Q5_K, kn_cpu_amx_q8tiles_q5_k, kn_cpu_amx_q8tiles_q5_k_emu, 256, 0},
      {KN_DTYPE_Q6_K, kn_cpu_amx_q8tiles_q6_k, kn_cpu_amx_q8tiles_q6_k_emu, 256, 0},
  };
  uint32_t s = 777;
  for (int i = 0; i < T * KM; i++)
    in[i] = amx_check_value(&s);
  for (size_t f = 0; f < sizeof(fs) / sizeof(fs[0]); f++) {
    const int K = fs[f].K, B = K / 32, ldq = 34 * B;
    for (int t = 0; t < T; t++) {
      if (kn_quantize_row(KN_DTYPE_Q8_0, in + t * KM, q + t * ldq, K)) return "no inputs";
      for (int b = 0; b < B; b++) {
        const uint8_t *blk = q + t * ldq + 34 * b;
        int sum = 0;
        for (int e = 0; e < 32; e++)
          sum += (int8_t)blk[2 + e];
        d[t * B + b] = kn_le_f16(blk);
        o[t * B + b] = fs[f].off ? fs[f].off * sum : sum;
      }
    }
    const struct kn_cpu_q8_in x = {.q = q, .d = d, .o = o, .ldq = (size_t)ldq};
    const size_t rb = kn_row_bytes(fs[f].dt, K);
    for (int r = 0; r < N; r++) {
      for (int k = 0; k < K; k++)
        row[k] = amx_check_value(&s);
      if (kn_quantize_row(fs[f].dt, row, w + r * rb, K)) return "no weights";
    }
    if (kn_x16_pack(fs[f].dt, w, N, K)) return "no X16 weights";
    fs[f].real(got, N, &x, w, rb, K, T, N, 0);
    fs[f].emu(want, N, &x, w, rb, K, T, N, 0);
    if (memcmp(got, want, sizeof(got))) return "the int8 tiles differ from the emulated ones";
  }
  return NULL;
}

/* AMX-INT8 (CPUID leaf 7, EDX bit 25) on a processor whose tiles
 * kn_cpu_has_amx allowed, and its tiles' check. */
static int amx_q8_ok;
static void amx_q8_probe(void) {
  unsigned a, b, c, d;
  if (!kn_cpu_has_amx() || !__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 25) & 1)) return;
  const char *why = amx_q8_selfcheck();
  if (why) cm_warn("kn", "AMX-INT8 tiles present but not used: %s", why);
  amx_q8_ok = why == NULL;
}

int kn_cpu_has_amx_int8(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, amx_q8_probe);
  return amx_q8_ok;
}

void kn_cpu_dsp_init_amx(struct kn_cpu_dsp *dsp) {
  dsp->isa = KN_CPU_ISA_AMX;
  dsp->round_bf16 = kn_cpu_amx_round_rows;
  dsp->dot_bf16 = kn_cpu_amx_dot;
  dsp->attn_bf16 = kn_cpu_amx_attn;
  dsp->attn_tile_bf16 = kn_cpu_amx_attn_tile;
  dsp->bf16_tokens = 16;
  dsp->bf16_rows = 32;
}
#endif
