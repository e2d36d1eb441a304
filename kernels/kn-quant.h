/* kn-quant.h — ggml's block formats (GGUF files' Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1, Q4_K, Q5_K, Q6_K, and Q3_K, IQ4_NL, IQ4_XS, Q2_K): the reference dequantization of a row,
 * which defines what every kernel computes (the dequantized value, in f32, then the f32 arithmetic
 * of an f32 weight), and the quantization of a row for the formats --quantization and lmserve
 * quantize make.
 *
 * Layouts (little-endian, f16 scales):
 *   Q8_0  32 elements, 34 bytes: d, int8 q[32]              x = d * q
 *   Q4_0  32, 18: d, q[16] (low nibbles elements 0..15, high 16..31)
 *                                                           x = d * (q - 8)
 *   Q4_1  32, 20: d, m, q[16]                               x = d * q + m
 *   Q5_0  32, 22: d, qh (u32: bit j the 5th bit of element j), q[16]
 *                                                           x = d * (q - 16)
 *   Q5_1  32, 24: d, m, qh, q[16]                           x = d * q + m
 *   Q4_K  256, 144: d, dmin, 12 bytes of eight 6-bit (scale, min) pairs,
 *         q[128] (64 elements per 32 bytes: low nibbles, then high)
 *                                                           x = d*sc * q - dmin*mn
 *   Q5_K  256, 176: d, dmin, scales[12], qh[32], q[128]     as Q4_K with a 5th bit
 *   Q6_K  256, 210: ql[128], qh[64], int8 scales[16], d     x = d * sc * (q - 32)
 *   Q3_K  256, 110: hmask[32], q[64] (2 bits each), 12 bytes of sixteen 6-bit
 *         scales (kn_q3k_scales), d. Chunk c of 32 elements (c < 8): q's bytes
 *         32 (c / 4) .. + 31 shifted right by 2 (c % 4), less 4 where bit c of
 *         hmask's byte of the same element is clear; its first 16 elements take
 *         scale 2 c, the others 2 c + 1             x = (d * (sc - 32)) * q
 *   IQ4_NL 32, 18: d, q[16] as Q4_0's             x = d * kn_iq4_levels[q]
 *   IQ4_XS 256, 136: d, sh (u16), sl[4], q[128]: sub-block j of 32 (its 16
 *         bytes of q as Q4_0's) has the 6-bit scale sl's nibble j (low for j
 *         even) under sh's bits 2 j, 2 j + 1    x = (d * (sc - 32)) * levels[q]
 *   Q2_K  256, 84: scales[16] (a 4-bit scale under a 4-bit min), q[64] (2
 *         bits each, as Q3_K's), d, dmin: sub-block j of 16 (chunk c of 32 as
 *         Q3_K's, without hmask)                x = (d * sc) * q - dmin * mn
 * The last four are read, not written (kn_quantize_row refuses them). */
#ifndef LMSERVE_KN_QUANT_H
#define LMSERVE_KN_QUANT_H
#include <stddef.h>
#include <stdint.h>

#include "kernels/kn-dtype.h"

/* The little-endian u16 and u32 at p (blocks are bytes: no alignment), and the
 * f16 at p as f32: the blocks' scales and Q5's fifth bits. */
static inline uint16_t kn_le16(const uint8_t *p) {
  return (uint16_t)(p[0] | p[1] << 8);
}
static inline uint32_t kn_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline float kn_le_f16(const uint8_t *p) {
  return kn_f16_to_f32(kn_le16(p));
}

/* The K-quants' (Q4_K, Q5_K) eight 6-bit scales and eight mins from their 12
 * bytes q, one a byte: scale j < 4 is q[j]'s low 6 bits, min j < 4 q[j + 4]'s;
 * scale 4 + i is q[8 + i]'s low nibble under q[i]'s top two bits, min 4 + i
 * q[8 + i]'s high nibble under q[4 + i]'s top two. */
static inline void kn_k_scales_mins(const uint8_t *q, uint64_t *sc, uint64_t *mn) {
  const uint32_t u0 = kn_le32(q), u1 = kn_le32(q + 4), u2 = kn_le32(q + 8);
  const uint32_t lo6 = 0x3f3f3f3f, top2 = 0x03030303, nib = 0x0f0f0f0f;
  *sc = (u0 & lo6) | (uint64_t)((u2 & nib) | ((u0 >> 6) & top2) << 4) << 32;
  *mn = (u1 & lo6) | (uint64_t)(((u2 >> 4) & nib) | ((u1 >> 6) & top2) << 4) << 32;
}

/* Q3_K's sixteen 6-bit scales from its 12 bytes q, less 32, one a byte of
 * sc: scale j < 4 is q[j]'s low nibble under bits 0-1 of q[8 + j], 4 + j
 * q[4 + j]'s low nibble under bits 2-3, 8 + j q[j]'s high nibble under bits
 * 4-5, 12 + j q[4 + j]'s high nibble under bits 6-7. */
static inline void kn_q3k_scales(const uint8_t *q, int8_t sc[16]) {
  for (int j = 0; j < 4; j++) {
    const int h = q[8 + j];
    sc[j] = (int8_t)(((q[j] & 0xF) | (h & 3) << 4) - 32);
    sc[4 + j] = (int8_t)(((q[4 + j] & 0xF) | (h >> 2 & 3) << 4) - 32);
    sc[8 + j] = (int8_t)(((q[j] >> 4) | (h >> 4 & 3) << 4) - 32);
    sc[12 + j] = (int8_t)(((q[4 + j] >> 4) | (h >> 6 & 3) << 4) - 32);
  }
}

/* IQ4_XS's scale of sub-block j (0..7) of the super-block at b, less 32. */
static inline int kn_iq4xs_scale(const uint8_t *b, int j) {
  return (((b[4 + j / 2] >> 4 * (j % 2)) & 0xF) | ((kn_le16(b + 2) >> 2 * j) & 3) << 4) - 32;
}

/* IQ4_NL's and IQ4_XS's 16 levels, a nibble's value (ggml's kvalues_iq4nl). */
extern const int8_t kn_iq4_levels[16];

/* dst[0, K) = the values of the K-element row at src (K whole blocks of dt). */
void kn_dequant_row(enum kn_dtype dt, const void *src, float *dst, size_t K);

/* The K-element row x as dt's blocks at dst, as ggml's reference quantizers
 * round (quantize_row_*_ref: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K;
 * the K-quants without an importance matrix). CM_ERR_UNSUPPORTED for other
 * dtypes, CM_ERR_INVAL when K is not whole blocks (256 for the K-quants). */
int kn_quantize_row(enum kn_dtype dt, const float *x, void *dst, size_t K);

/* The next value of the xorshift64* generator whose (nonzero) state is *s. */
static inline uint64_t kn_xorshift64s(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545f4914f6cdd1dull;
}

/* n blocks of the block format dt at dst, of random bytes (the xorshift state
 * *rng moves on) whose f16 scales are small and finite (below 0.02 in
 * magnitude at a block's start, 0.01 at its end: Q6_K's, Q3_K's and Q2_K's):
 * valid blocks of any format, those kn_quantize_row cannot write included,
 * for the checks of kernels (kn_block_check) and tests. */
void kn_random_blocks(enum kn_dtype dt, void *dst, size_t n, uint64_t *rng);

/* The block format a row of K elements is quantized to when dt is asked for:
 * dt where K is whole blocks of it, else llama.cpp's fallback to 32-element
 * blocks for rows that are not whole 256-blocks (Q4_K -> Q5_0, Q5_K -> Q5_1,
 * Q6_K -> Q8_0) where K is whole blocks of that, else KN_DTYPE__COUNT (the row
 * stays as it is). */
enum kn_dtype kn_quant_row_type(enum kn_dtype dt, size_t K);

/* Rows side by side (KN_DTYPE_Q8_0_X16 .. _Q5_1_X16, _IQ4_NL_X16 .. _Q2_K_X16):
 * the CPU's q8 mode lays the block formats' weights out so that one register
 * holds the same four elements of 16 rows, and one 32-bit broadcast of an
 * input's four meets them all (the kernels then need no sums across lanes;
 * llama.cpp repacks Q4_0 for its AVX2 and AVX-512 kernels the same way). In n
 * rows of K elements, rows [0, n / 16 * 16) go in groups of 16; group g's
 * block b (of K / 32) takes the bytes of the 16 rows' blocks b, at (g * K /
 * 32 + b) * 16 * block_bytes: the 16 scales (row i's f16 at 2 i), then the
 * quants four bytes of a row at a time, row i's bytes 4 c .. 4 c + 3 at 32 +
 * 64 c + 4 i (c < 4 for Q4_0 and Q5_0, < 8 for Q8_0); then, for Q5_0, the
 * fifth bits in 8 planes of 64 bits from 288: plane 2 c + h marks the bytes
 * of quad c's 64 (bit 4 i + k: row i's byte 4 c + k) whose low (h = 0) or
 * high (h = 1) nibble's weight takes 16, so that a register of quads gets its
 * fifth bits from one 64-bit mask. IQ4_NL as Q4_0. Q4_1 and Q5_1 the same,
 * with the 16 mins after the 16 scales (row i's at 32 + 2 i) and all else 32
 * bytes later. Q4_K's super-block b (of K / 256) takes the same place (16 * 144 bytes): the 16 d
 * (row i's f16 at 2 i), the 16 dmin (at 32 + 2 i), the 12 bytes of scales and mins as three dwords
 * (row i's dword k at 64 + 64 k + 4 i), then the 128 bytes of nibbles four at a time (row i's bytes
 * 4 c .. 4 c + 3 of them at 256 + 64 c + 4 i, c < 32); Q5_K's (16 * 176 bytes) the same, then qh's
 * 32 bytes (at 2304 + 64 c + 4 i, c < 8). Q6_K's (16 * 210 bytes): the 16 d (at 2 i), the 16 bytes
 * of scales as four dwords (row i's dword k at 32 + 64 k + 4 i), ql's 128 bytes four at a time (at
 * 288 + 64 c + 4 i, c < 32), qh's 64 (at 2336 + 64 c + 4 i, c < 16). IQ4_XS's (16 * 136 bytes): the
 * 16 d (at 2 i), the 16 dwords of scales_l (at 32 + 4 i), the 16 words of scales_h (at 96 + 2 i),
 * then the 128 bytes of nibbles four at a time (at 128 + 64 c + 4 i, c < 32: sub-block j's 16 bytes
 * are quads 4 j .. 4 j + 3, as a Q4_0 block's). Q3_K's (16 * 110 bytes): the 16 d (at 2 i), the 12
 * bytes of scales as three dwords (at 32 + 64 k + 4 i) whose bits are rearranged (scale s < 15 at
 * bit 6 (s % 5) of dword s / 5 as a 6-bit two's complement, less 32; scale 15's bits 2 k, 2 k + 1
 * at bits 30, 31 of dword k), hmask's 32 bytes four at a time (at 224 +
 * 64 c + 4 i, c < 8), q's 64 (at 736 + 64 c + 4 i, c < 16). Q2_K's (16 * 84 bytes): the 16 d (at 2
 * i), the 16 dmin (at 32 + 2 i), the 16 bytes of scales as four dwords (at 64 + 64 k + 4 i), q's 64
 * bytes (at 320 + 64 c + 4 i, c < 16). The last n % 16 rows stay as they were, after the
 * groups: a row still starts at r * row_bytes when r is a multiple of 16, and n rows take the bytes
 * they took. */
#define KN_X16_ROWS 16

/* Lays the n rows of K elements of block format dt at w out in place as dt's X16
 * layout. 0, CM_ERR_INVAL (another dt, K not whole blocks) or CM_ERR_NOMEM. */
int kn_x16_pack(enum kn_dtype dt, void *w, int n, int K);

/* Row r of the n rows of K elements in X16 layout xdt at w, as a row of its
 * format (kn_dtype_rows_of) into dst. */
void kn_x16_row(enum kn_dtype xdt, const void *w, int n, int K, int r, void *dst);
/* Block b of that row alone, as its format's block into dst. */
void kn_x16_block(enum kn_dtype xdt, const void *w, int n, int K, int r, int b, void *dst);

#endif
