/* kn-dtype.h — element types of kernel tensors and scalar conversions.
 *
 * Activations are always f32. Weights may be f32, f16 (IEEE binary16) or bf16
 * (the top 16 bits of an f32). The KV cache is f32, bf16 or fp8 e4m3 (OCP
 * E4M3FN: bias 7, no infinities, largest finite 448). The conversions here are
 * exact scalar versions (round-to-nearest-even when narrowing, NaN kept a quiet
 * NaN; e4m3 saturates to +-448, as CUDA's __NV_SATFINITE conversion does); SIMD
 * and device kernels must produce the same bits. */
#ifndef LMSERVE_KN_DTYPE_H
#define LMSERVE_KN_DTYPE_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum kn_dtype {
  KN_DTYPE_F32 = 0,
  KN_DTYPE_F16 = 1,
  KN_DTYPE_BF16 = 2,
  KN_DTYPE_F8E4M3 = 3, /* the KV cache (--kv-cache-dtype fp8, scale 1), kn_matmul_fp8's weights */
  /* ggml's block formats (kn-quant.h): weights only, in rows of whole blocks */
  KN_DTYPE_Q8_0 = 4,
  KN_DTYPE_Q4_0 = 5,
  KN_DTYPE_Q4_1 = 6,
  KN_DTYPE_Q5_0 = 7,
  KN_DTYPE_Q5_1 = 8,
  KN_DTYPE_Q4_K = 9,
  KN_DTYPE_Q5_K = 10,
  KN_DTYPE_Q6_K = 11,
  /* every block format's rows as the CPU's q8 mode lays them out at load
   * (kn_weights_prepare; kn-quant.h's kn_x16_pack): blocks of 16 rows side by side */
  KN_DTYPE_Q8_0_X16 = 12,
  KN_DTYPE_Q4_0_X16 = 13,
  KN_DTYPE_Q5_0_X16 = 14,
  KN_DTYPE_Q4_K_X16 = 15,
  KN_DTYPE_Q6_K_X16 = 16,
  KN_DTYPE_Q5_K_X16 = 17,
  KN_DTYPE_Q4_1_X16 = 18,
  KN_DTYPE_Q5_1_X16 = 19,
  /* more of ggml's block formats, read from llama.cpp's files (Q2_K, Q3_K_S/M/L,
   * IQ4_NL, IQ4_XS), where a backend has KN_CAP_BLOCK_LOWBIT */
  KN_DTYPE_Q3_K = 20,
  KN_DTYPE_IQ4_NL = 21,
  KN_DTYPE_IQ4_XS = 22,
  KN_DTYPE_Q2_K = 23,
  /* those formats' rows in the q8 mode's layout */
  KN_DTYPE_IQ4_NL_X16 = 24,
  KN_DTYPE_IQ4_XS_X16 = 25,
  KN_DTYPE_Q3_K_X16 = 26,
  KN_DTYPE_Q2_K_X16 = 27,
  KN_DTYPE__COUNT = 28,
};

/* Bytes per element; 0 for an unknown value and for the block formats
 * (kn_row_bytes gives theirs). */
static inline size_t kn_dtype_size(enum kn_dtype dt) {
  switch (dt) {
  case KN_DTYPE_F32: return 4;
  case KN_DTYPE_F16: return 2;
  case KN_DTYPE_BF16: return 2;
  case KN_DTYPE_F8E4M3: return 1;
  default: return 0;
  }
}

static inline const char *kn_dtype_name(enum kn_dtype dt) {
  switch (dt) {
  case KN_DTYPE_F32: return "f32";
  case KN_DTYPE_F16: return "f16";
  case KN_DTYPE_BF16: return "bf16";
  case KN_DTYPE_F8E4M3: return "fp8_e4m3";
  case KN_DTYPE_Q8_0: return "q8_0";
  case KN_DTYPE_Q4_0: return "q4_0";
  case KN_DTYPE_Q4_1: return "q4_1";
  case KN_DTYPE_Q5_0: return "q5_0";
  case KN_DTYPE_Q5_1: return "q5_1";
  case KN_DTYPE_Q4_K: return "q4_k";
  case KN_DTYPE_Q5_K: return "q5_k";
  case KN_DTYPE_Q6_K: return "q6_k";
  case KN_DTYPE_Q8_0_X16: return "q8_0x16";
  case KN_DTYPE_Q4_0_X16: return "q4_0x16";
  case KN_DTYPE_Q5_0_X16: return "q5_0x16";
  case KN_DTYPE_Q4_K_X16: return "q4_kx16";
  case KN_DTYPE_Q6_K_X16: return "q6_kx16";
  case KN_DTYPE_Q5_K_X16: return "q5_kx16";
  case KN_DTYPE_Q4_1_X16: return "q4_1x16";
  case KN_DTYPE_Q5_1_X16: return "q5_1x16";
  case KN_DTYPE_Q3_K: return "q3_k";
  case KN_DTYPE_IQ4_NL: return "iq4_nl";
  case KN_DTYPE_IQ4_XS: return "iq4_xs";
  case KN_DTYPE_Q2_K: return "q2_k";
  case KN_DTYPE_IQ4_NL_X16: return "iq4_nlx16";
  case KN_DTYPE_IQ4_XS_X16: return "iq4_xsx16";
  case KN_DTYPE_Q3_K_X16: return "q3_kx16";
  case KN_DTYPE_Q2_K_X16: return "q2_kx16";
  default: return "?";
  }
}

/* Elements and bytes per block of a block format; 0 for the others. */
static inline int kn_block_elems(enum kn_dtype dt) {
  switch (dt) {
  case KN_DTYPE_Q8_0:
  case KN_DTYPE_Q4_0:
  case KN_DTYPE_Q4_1:
  case KN_DTYPE_Q5_0:
  case KN_DTYPE_Q5_1:
  case KN_DTYPE_Q8_0_X16:
  case KN_DTYPE_Q4_0_X16:
  case KN_DTYPE_Q5_0_X16:
  case KN_DTYPE_Q4_1_X16:
  case KN_DTYPE_Q5_1_X16:
  case KN_DTYPE_IQ4_NL:
  case KN_DTYPE_IQ4_NL_X16: return 32;
  case KN_DTYPE_Q4_K:
  case KN_DTYPE_Q5_K:
  case KN_DTYPE_Q6_K:
  case KN_DTYPE_Q4_K_X16:
  case KN_DTYPE_Q5_K_X16:
  case KN_DTYPE_Q6_K_X16:
  case KN_DTYPE_Q3_K:
  case KN_DTYPE_Q3_K_X16:
  case KN_DTYPE_IQ4_XS:
  case KN_DTYPE_IQ4_XS_X16:
  case KN_DTYPE_Q2_K:
  case KN_DTYPE_Q2_K_X16: return 256;
  default: return 0;
  }
}

static inline size_t kn_block_bytes(enum kn_dtype dt) {
  switch (dt) {
  case KN_DTYPE_Q8_0:
  case KN_DTYPE_Q8_0_X16: return 34;
  case KN_DTYPE_Q4_0:
  case KN_DTYPE_Q4_0_X16: return 18;
  case KN_DTYPE_Q4_1:
  case KN_DTYPE_Q4_1_X16: return 20;
  case KN_DTYPE_Q5_0:
  case KN_DTYPE_Q5_0_X16: return 22;
  case KN_DTYPE_Q5_1:
  case KN_DTYPE_Q5_1_X16: return 24;
  case KN_DTYPE_Q4_K:
  case KN_DTYPE_Q4_K_X16: return 144;
  case KN_DTYPE_Q5_K:
  case KN_DTYPE_Q5_K_X16: return 176;
  case KN_DTYPE_Q6_K:
  case KN_DTYPE_Q6_K_X16: return 210;
  case KN_DTYPE_Q3_K:
  case KN_DTYPE_Q3_K_X16: return 110;
  case KN_DTYPE_IQ4_NL:
  case KN_DTYPE_IQ4_NL_X16: return 18;
  case KN_DTYPE_IQ4_XS:
  case KN_DTYPE_IQ4_XS_X16: return 136;
  case KN_DTYPE_Q2_K:
  case KN_DTYPE_Q2_K_X16: return 84;
  default: return 0;
  }
}

/* The format of a rows-interleaved dtype's rows (Q8_0 for Q8_0_X16), dt itself for the others. */
static inline enum kn_dtype kn_dtype_rows_of(enum kn_dtype dt) {
  switch (dt) {
  case KN_DTYPE_Q8_0_X16: return KN_DTYPE_Q8_0;
  case KN_DTYPE_Q4_0_X16: return KN_DTYPE_Q4_0;
  case KN_DTYPE_Q5_0_X16: return KN_DTYPE_Q5_0;
  case KN_DTYPE_Q4_K_X16: return KN_DTYPE_Q4_K;
  case KN_DTYPE_Q5_K_X16: return KN_DTYPE_Q5_K;
  case KN_DTYPE_Q4_1_X16: return KN_DTYPE_Q4_1;
  case KN_DTYPE_Q5_1_X16: return KN_DTYPE_Q5_1;
  case KN_DTYPE_Q6_K_X16: return KN_DTYPE_Q6_K;
  case KN_DTYPE_IQ4_NL_X16: return KN_DTYPE_IQ4_NL;
  case KN_DTYPE_IQ4_XS_X16: return KN_DTYPE_IQ4_XS;
  case KN_DTYPE_Q3_K_X16: return KN_DTYPE_Q3_K;
  case KN_DTYPE_Q2_K_X16: return KN_DTYPE_Q2_K;
  default: return dt;
  }
}

/* The rows-interleaved layout of dt's rows (KN_DTYPE_Q8_0_X16 for Q8_0,
 * _Q4_1_X16 and so on: every block format has one), KN_DTYPE__COUNT for the
 * other dtypes. */
static inline enum kn_dtype kn_dtype_x16_of(enum kn_dtype dt) {
  switch (dt) {
  case KN_DTYPE_Q8_0: return KN_DTYPE_Q8_0_X16;
  case KN_DTYPE_Q4_0: return KN_DTYPE_Q4_0_X16;
  case KN_DTYPE_Q5_0: return KN_DTYPE_Q5_0_X16;
  case KN_DTYPE_Q4_K: return KN_DTYPE_Q4_K_X16;
  case KN_DTYPE_Q5_K: return KN_DTYPE_Q5_K_X16;
  case KN_DTYPE_Q4_1: return KN_DTYPE_Q4_1_X16;
  case KN_DTYPE_Q5_1: return KN_DTYPE_Q5_1_X16;
  case KN_DTYPE_Q6_K: return KN_DTYPE_Q6_K_X16;
  case KN_DTYPE_IQ4_NL: return KN_DTYPE_IQ4_NL_X16;
  case KN_DTYPE_IQ4_XS: return KN_DTYPE_IQ4_XS_X16;
  case KN_DTYPE_Q3_K: return KN_DTYPE_Q3_K_X16;
  case KN_DTYPE_Q2_K: return KN_DTYPE_Q2_K_X16;
  default: return KN_DTYPE__COUNT;
  }
}

/* Whether dt is one of the block formats of KN_CAP_BLOCK_LOWBIT (Q3_K, IQ4_NL, IQ4_XS, Q2_K)
 * or a layout of their rows. */
static inline int kn_dtype_lowbit(enum kn_dtype dt) {
  const enum kn_dtype r = kn_dtype_rows_of(dt);
  return r >= KN_DTYPE_Q3_K && r <= KN_DTYPE_Q2_K;
}

/* Whether dt is a rows-interleaved layout (KN_DTYPE_Q8_0_X16 .. _Q5_1_X16,
 * _IQ4_NL_X16 .. _Q2_K_X16). */
static inline int kn_dtype_x16(enum kn_dtype dt) {
  return kn_dtype_rows_of(dt) != dt;
}

/* Bytes of a row of K elements of dt: K * size, or whole blocks (0: K is not a
 * whole number of dt's blocks, or dt is unknown). */
static inline size_t kn_row_bytes(enum kn_dtype dt, size_t K) {
  int be = kn_block_elems(dt);
  if (!be) return K * kn_dtype_size(dt);
  return K % (size_t)be ? 0 : K / (size_t)be * kn_block_bytes(dt);
}

static inline uint32_t kn_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static inline float kn_f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* ---- bf16 -------------------------------------------------------------- */

static inline float kn_bf16_to_f32(uint16_t h) {
  return kn_f32_from_bits((uint32_t)h << 16);
}

static inline uint16_t kn_f32_to_bf16(float f) {
  uint32_t u = kn_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
  return (uint16_t)(u >> 16);
}

/* ---- f16 (IEEE binary16) ----------------------------------------------- */

static inline float kn_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (man << 13); /* inf / NaN */
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13); /* normal: rebias 15 -> 127 */
  } else if (man == 0) {
    u = sign; /* zero */
  } else {
    /* subnormal: value = man * 2^-24, exact in f32 */
    float v = (float)man * (1.0f / 16777216.0f);
    u = sign | kn_f32_bits(v);
  }
  return kn_f32_from_bits(u);
}

static inline uint16_t kn_f32_to_f16(float f) {
  uint32_t u = kn_f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
  if (a < 0x38800000u) {
    /* result is subnormal or zero: value / 2^-24 rounded to an integer (RNE) */
    if (a < 0x33000000u) return sign; /* < 2^-25: rounds to zero (2^-25 ties to even 0) */
    uint32_t e = a >> 23;             /* 102..112 */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* m * 2^(e-150) / 2^-24 = m >> (126 - e) */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  /* normal: rebias, round the 13 dropped bits to nearest even */
  uint32_t r = a - 0x38000000u; /* exponent 127 -> 15 */
  r += 0xfffu + ((r >> 13) & 1u);
  return (uint16_t)(sign | (r >> 13));
}

/* ---- fp8 e4m3 ---------------------------------------------------------- */

/* Exact: every e4m3 value is an f32. Code 0x7f / 0xff is NaN. */
static inline float kn_f8e4m3_to_f32(uint8_t c) {
  uint32_t sign = (uint32_t)(c & 0x80u) << 24, e = (c >> 3) & 0xfu, m = c & 7u;
  if (e == 0xfu && m == 7u) return kn_f32_from_bits(0x7fc00000u | sign);
  if (e == 0) /* subnormal: m * 2^-9, exact in f32 */
    return kn_f32_from_bits(kn_f32_bits((float)m * (1.0f / 512.0f)) | sign);
  return kn_f32_from_bits(sign | ((e + 120u) << 23) | (m << 20)); /* rebias 7 -> 127 */
}

/* Round to nearest even; beyond +-448 (infinities too) the largest finite
 * value; NaN gives 0x7f. */
static inline uint8_t kn_f32_to_f8e4m3(float f) {
  uint32_t u = kn_f32_bits(f), a = u & 0x7fffffffu;
  uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  if (a > 0x7f800000u) return 0x7f;
  if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7eu); /* >= 448 */
  if (a < 0x3c800000u) {                    /* below 2^-6: a multiple of 2^-9, ties to even */
    float x = kn_f32_from_bits(a) * 512.0f; /* exact: a power-of-two scale */
    uint32_t q = (uint32_t)x;
    float rem = x - (float)q; /* exact */
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q++;
    return (uint8_t)(sign | q); /* q == 8 is 2^-6, the smallest normal */
  }
  uint32_t r = a - 0x3c000000u;     /* exponent 127 -> 7 */
  r += 0x7ffffu + ((r >> 20) & 1u); /* round the 20 dropped bits to nearest even */
  uint32_t c = r >> 20;
  return (uint8_t)(sign | (c > 0x7eu ? 0x7eu : c));
}

/* Element i of a tensor of type dt, as f32. */
static inline float kn_load_f32(const void *p, enum kn_dtype dt, size_t i) {
  switch (dt) {
  case KN_DTYPE_F16: return kn_f16_to_f32(((const uint16_t *)p)[i]);
  case KN_DTYPE_BF16: return kn_bf16_to_f32(((const uint16_t *)p)[i]);
  case KN_DTYPE_F8E4M3: return kn_f8e4m3_to_f32(((const uint8_t *)p)[i]);
  default: return ((const float *)p)[i];
  }
}

/* Stores f32 v as element i of type dt (rounding to nearest even). */
static inline void kn_store_f32(void *p, enum kn_dtype dt, size_t i, float v) {
  switch (dt) {
  case KN_DTYPE_F16: ((uint16_t *)p)[i] = kn_f32_to_f16(v); break;
  case KN_DTYPE_BF16: ((uint16_t *)p)[i] = kn_f32_to_bf16(v); break;
  case KN_DTYPE_F8E4M3: ((uint8_t *)p)[i] = kn_f32_to_f8e4m3(v); break;
  default: ((float *)p)[i] = v; break;
  }
}

#endif
