/* test-kn-dtype.c — the scalar f16 / bf16 / fp8 e4m3 conversions of kn-dtype.h:
 * exact widening, round-to-nearest-even narrowing (checked against the
 * processor's F16C conversion where present, against hand values, and for e4m3
 * against a search over every code), specials. */
#include <float.h>
#include <immintrin.h>
#include <cpuid.h>
#include <math.h>

#include "kernels/kn-dtype.h"
#include "tests/harness/th.h"

static uint32_t rng = 12345;
static uint32_t next32(void) {
  rng ^= rng << 13;
  rng ^= rng >> 17;
  rng ^= rng << 5;
  return rng;
}

TH_TEST(f16_round_trip_all_values) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = kn_f16_to_f32((uint16_t)h);
    uint16_t back = kn_f32_to_f16(f);
    int is_nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff);
    if (is_nan)
      bad += !isnan(f) || ((back & 0x7c00) != 0x7c00) || !(back & 0x3ff);
    else
      bad += back != h;
  }
  TH_CHECK_EQ_INT(bad, 0);
  TH_CHECK(kn_f16_to_f32(0x3c00) == 1.0f);
  TH_CHECK(kn_f16_to_f32(0x0001) == ldexpf(1.0f, -24)); /* smallest subnormal */
  TH_CHECK(kn_f16_to_f32(0x7bff) == 65504.0f);
  TH_CHECK(isinf(kn_f16_to_f32(0xfc00)) && kn_f16_to_f32(0xfc00) < 0);
}

TH_TEST(f16_narrowing_hand_values) {
  TH_CHECK_EQ_INT(kn_f32_to_f16(1.0f), 0x3c00);
  TH_CHECK_EQ_INT(kn_f32_to_f16(-2.0f), 0xc000);
  TH_CHECK_EQ_INT(kn_f32_to_f16(65504.0f), 0x7bff);
  TH_CHECK_EQ_INT(kn_f32_to_f16(65519.0f), 0x7bff); /* below the halfway point */
  TH_CHECK_EQ_INT(kn_f32_to_f16(65520.0f), 0x7c00); /* halfway rounds to even: inf */
  TH_CHECK_EQ_INT(kn_f32_to_f16(1e10f), 0x7c00);
  TH_CHECK_EQ_INT(kn_f32_to_f16(ldexpf(1.0f, -25)), 0x0000); /* tie to even zero */
  TH_CHECK_EQ_INT(kn_f32_to_f16(ldexpf(1.5f, -25)), 0x0001);
  TH_CHECK_EQ_INT(kn_f32_to_f16(ldexpf(3.0f, -25)), 0x0002);        /* 1.5 ulp ties to even 2 */
  TH_CHECK_EQ_INT(kn_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00); /* tie: even */
  TH_CHECK_EQ_INT(kn_f32_to_f16(1.0f + ldexpf(3.0f, -11)), 0x3c02);
  TH_CHECK_EQ_INT(kn_f32_to_f16(-0.0f), 0x8000);
  TH_CHECK((kn_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (kn_f32_to_f16(NAN) & 0x3ff));
}

__attribute__((target("f16c"))) static uint16_t hw_f16(float f) {
  return (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0);
}

TH_TEST(f16_narrowing_matches_f16c) {
  unsigned a, b, c, d; /* CPUID leaf 1, ECX bit 29: clang 14 lacks the "f16c" name */
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 29))) TH_SKIP("no F16C on this processor");
  int bad = 0;
  for (int i = 0; i < 2000000; i++) {
    uint32_t u = next32();
    /* bias towards the f16 range: exponents 100..150 */
    if (i & 1) u = (u & 0x807fffffu) | ((100u + (u >> 8) % 51u) << 23);
    float f;
    memcpy(&f, &u, 4);
    if (isnan(f)) continue;
    bad += kn_f32_to_f16(f) != hw_f16(f);
  }
  TH_CHECK_EQ_INT(bad, 0);
}

TH_TEST(bf16_conversions) {
  TH_CHECK_EQ_INT(kn_f32_to_bf16(1.0f), 0x3f80);
  TH_CHECK(kn_bf16_to_f32(0x3f80) == 1.0f);
  /* 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties to even 1 */
  TH_CHECK_EQ_INT(kn_f32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3f80);
  TH_CHECK_EQ_INT(kn_f32_to_bf16(1.0f + ldexpf(3.0f, -8)), 0x3f82);
  TH_CHECK_EQ_INT(kn_f32_to_bf16(1.0f + ldexpf(1.0f, -8) + ldexpf(1.0f, -20)), 0x3f81);
  TH_CHECK_EQ_INT(kn_f32_to_bf16(3.3895314e38f), 0x7f7f); /* the largest bf16 */
  TH_CHECK_EQ_INT(kn_f32_to_bf16(FLT_MAX), 0x7f80);       /* past its half ulp: inf */
  uint16_t n = kn_f32_to_bf16(NAN);
  TH_CHECK((n & 0x7f80) == 0x7f80 && (n & 0x7f));
  /* round trip of every bf16 that is not NaN */
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = kn_bf16_to_f32((uint16_t)h);
    if (isnan(f)) continue;
    bad += kn_f32_to_bf16(f) != h;
  }
  TH_CHECK_EQ_INT(bad, 0);
  /* narrowing picks the nearer neighbour (ties even) on random values */
  bad = 0;
  for (int i = 0; i < 1000000; i++) {
    uint32_t u = next32() % 0x7f7f0000u; /* positive, below the largest bf16 */
    float f;
    memcpy(&f, &u, 4);
    uint16_t b = kn_f32_to_bf16(f);
    double lo = kn_bf16_to_f32((uint16_t)(u >> 16)), hi = kn_bf16_to_f32((uint16_t)((u >> 16) + 1));
    double dl = f - lo, dh = hi - f;
    uint16_t want = dl < dh   ? (uint16_t)(u >> 16)
                    : dl > dh ? (uint16_t)((u >> 16) + 1)
                              : (((u >> 16) & 1) ? (uint16_t)((u >> 16) + 1) : (uint16_t)(u >> 16));
    bad += b != want;
  }
  TH_CHECK_EQ_INT(bad, 0);
  TH_CHECK_EQ_INT(kn_dtype_size(KN_DTYPE_BF16), 2);
  TH_CHECK_EQ_INT(kn_dtype_size((enum kn_dtype)9), 0);
}

/* ---- fp8 e4m3 ------------------------------------------------------------ */

/* The oracle, from the format's definition alone: the value of code c (sign,
 * 4 exponent bits of bias 7, 3 mantissa bits; 0x7f / 0xff NaN, no infinities). */
static double e4m3_value(int c) {
  int e = (c >> 3) & 15, m = c & 7;
  double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
  return (c & 0x80) ? -v : v;
}

/* The code nearest x by search over every finite code, ties to the even
 * mantissa, beyond 448 the largest: what the narrowing must give. */
static int e4m3_nearest(float x) {
  double ax = fabs((double)x);
  int best = 0;
  double bd = INFINITY;
  for (int c = 0; c <= 0x7e; c++) {
    double d = fabs(e4m3_value(c) - ax);
    if (d < bd || (d == bd && !(c & 1))) {
      bd = d;
      best = c;
    }
  }
  return best | (signbit(x) ? 0x80 : 0);
}

TH_TEST(f8e4m3_widening_all_codes) {
  for (int c = 0; c < 256; c++) {
    float f = kn_f8e4m3_to_f32((uint8_t)c);
    if ((c & 0x7f) == 0x7f) {
      TH_CHECK(isnan(f));
      continue;
    }
    if ((double)f != e4m3_value(c) || (signbit(f) != 0) != ((c & 0x80) != 0))
      th_fail(__FILE__, __LINE__, "code 0x%02x widens to %.9g, want %.9g", c, f, e4m3_value(c));
    TH_CHECK_EQ_INT(kn_f32_to_f8e4m3(f), c); /* every value narrows back to itself */
  }
  TH_CHECK(kn_f8e4m3_to_f32(0x7e) == 448.0f);
  TH_CHECK(kn_f8e4m3_to_f32(0x01) == ldexpf(1.0f, -9)); /* smallest subnormal */
  TH_CHECK(kn_f8e4m3_to_f32(0x08) == ldexpf(1.0f, -6)); /* smallest normal */
}

/* Every midpoint between neighbouring codes (a tie: to the even code) and a hair
 * either side of it, random values over the whole range, and the specials. */
TH_TEST(f8e4m3_narrowing_matches_nearest) {
  int bad = 0;
  for (int c = 0; c < 0x7e; c++) {
    float lo = (float)e4m3_value(c), hi = (float)e4m3_value(c + 1);
    float mid = (float)((e4m3_value(c) + e4m3_value(c + 1)) / 2); /* exact in f32 */
    const float xs[] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY), lo, hi};
    for (int s = 0; s < 2; s++)
      for (size_t i = 0; i < sizeof(xs) / sizeof(xs[0]); i++) {
        float x = s ? -xs[i] : xs[i];
        int got = kn_f32_to_f8e4m3(x), want = e4m3_nearest(x);
        if (got != want && bad++ < 8)
          th_fail(__FILE__, __LINE__, "%.9g narrows to 0x%02x, want 0x%02x", x, got, want);
      }
  }
  for (int i = 0; i < 200000; i++) {
    float x = ldexpf((float)(next32() & 0xffffff) / 16777216.0f, (int)(next32() % 24) - 14);
    if (next32() & 1) x = -x;
    int got = kn_f32_to_f8e4m3(x), want = e4m3_nearest(x);
    if (got != want && bad++ < 8)
      th_fail(__FILE__, __LINE__, "%.9g narrows to 0x%02x, want 0x%02x", x, got, want);
  }
  TH_CHECK_EQ_INT(bad, 0);
  TH_CHECK_EQ_INT(kn_f32_to_f8e4m3(464.0f), 0x7e); /* would round to 480: saturates */
  TH_CHECK_EQ_INT(kn_f32_to_f8e4m3(1e30f), 0x7e);
  TH_CHECK_EQ_INT(kn_f32_to_f8e4m3(-INFINITY), 0xfe);
  TH_CHECK_EQ_INT(kn_f32_to_f8e4m3(NAN) & 0x7f, 0x7f);
  TH_CHECK_EQ_INT(kn_f32_to_f8e4m3(-0.0f), 0x80);
  TH_CHECK_EQ_INT(kn_f32_to_f8e4m3(ldexpf(1.0f, -10)), 0x00);  /* half the smallest: even 0 */
  TH_CHECK_EQ_INT(kn_f32_to_f8e4m3(ldexpf(3.0f, -10)), 0x02);  /* 1.5 ulp: even 2 */
  TH_CHECK_EQ_INT(kn_f32_to_f8e4m3(ldexpf(15.0f, -10)), 0x08); /* to the smallest normal */
}
