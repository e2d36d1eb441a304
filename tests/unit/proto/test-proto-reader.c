/* test-proto-reader.c — the msgpack primitives in pr-mp.h: every integer
 * width and sign through msgpack-c's packer (into a struct pr_buf) and our
 * reader, non-canonical encodings, range refusals that leave the reader where
 * it was, floats, containers checked against the bytes left, skipping every
 * format byte, the buffer's cap, and pr_pack_numbers. */
#include <math.h>
#include <string.h>

#include "common/cm-err.h"
#include "proto/pr-mp.h"
#include "tests/harness/th.h"

static const int64_t ints[] = {
    0,        1,     31,           127,          128,       255,       256,
    65535,    65536, 4294967295ll, 4294967296ll, INT64_MAX, -1,        -32,
    -33,      -128,  -129,         -32768,       -32769,    INT32_MIN, (int64_t)INT32_MIN - 1,
    INT64_MIN};

TH_TEST(integers_every_width) {
  struct pr_buf b;
  pr_buf_init(&b, 0);
  msgpack_packer *pk = PR_PACKER(&b);
  for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
    msgpack_pack_int64(pk, ints[i]);
  msgpack_pack_uint64(pk, UINT64_MAX);
  TH_REQUIRE(b.err == 0);
  struct pr_rd r;
  pr_rd_init(&r, b.data, b.len);
  for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
    int64_t v = 12345;
    TH_CHECK_EQ_INT(pr_rd_int(&r, INT64_MIN, INT64_MAX, &v), 0);
    TH_CHECK(v == ints[i]);
  }
  uint64_t u;
  TH_CHECK_EQ_INT(pr_rd_u64(&r, &u), 0);
  TH_CHECK(u == UINT64_MAX);
  TH_CHECK_EQ_INT(pr_rd_left(&r), 0);
  TH_CHECK_EQ_INT(pr_rd_u64(&r, &u), CM_ERR_TRUNC);
  /* shortest forms */
  pr_buf_reset(&b);
  msgpack_pack_uint64(pk, 127), msgpack_pack_uint64(pk, 128), msgpack_pack_int64(pk, -32),
      msgpack_pack_int64(pk, -33);
  static const uint8_t want[] = {0x7f, 0xcc, 0x80, 0xe0, 0xd0, 0xdf};
  TH_CHECK(b.len == sizeof(want) && memcmp(b.data, want, sizeof(want)) == 0);
  pr_buf_free(&b);
}

TH_TEST(integers_noncanonical_and_ranges) {
  static const uint8_t wide5[] = {0xcf, 0, 0, 0, 0, 0, 0, 0, 5};
  struct pr_rd r;
  uint32_t v32;
  pr_rd_init(&r, wide5, sizeof(wide5));
  TH_CHECK_EQ_INT(pr_rd_u32(&r, &v32), 0);
  TH_CHECK_EQ_INT(v32, 5);
  static const uint8_t neg_wide[] = {0xd3, 0, 0, 0, 0, 0, 0, 0, 7}; /* int64 7 */
  pr_rd_init(&r, neg_wide, sizeof(neg_wide));
  TH_CHECK_EQ_INT(pr_rd_u32(&r, &v32), 0);
  TH_CHECK_EQ_INT(v32, 7);
  static const uint8_t big[] = {0xcf, 0, 0, 0, 1, 0, 0, 0, 0}; /* 2^32 */
  pr_rd_init(&r, big, sizeof(big));
  TH_CHECK_EQ_INT(pr_rd_u32(&r, &v32), CM_ERR_RANGE);
  TH_CHECK(r.p == big); /* a refused number is not consumed */
  static const uint8_t minus1[] = {0xff};
  uint64_t u;
  pr_rd_init(&r, minus1, 1);
  TH_CHECK_EQ_INT(pr_rd_u64(&r, &u), CM_ERR_RANGE);
  TH_CHECK(r.p == minus1);
  int32_t i32;
  static const uint8_t i64min[] = {0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0};
  pr_rd_init(&r, i64min, sizeof(i64min));
  TH_CHECK_EQ_INT(pr_rd_i32(&r, &i32), CM_ERR_RANGE);
  static const uint8_t u64max[] = {0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  int64_t s;
  pr_rd_init(&r, u64max, sizeof(u64max));
  TH_CHECK_EQ_INT(pr_rd_int(&r, INT64_MIN, INT64_MAX, &s), CM_ERR_RANGE);
  /* truncated payloads */
  for (size_t n = 1; n < sizeof(u64max); n++) {
    pr_rd_init(&r, u64max, n);
    TH_CHECK_EQ_INT(pr_rd_u64(&r, &u), CM_ERR_TRUNC);
  }
  /* not integers */
  static const uint8_t others[] = {0xc0, 0xc2, 0xca, 0xa1, 0x90, 0x80, 0xc1, 0xc4};
  for (size_t i = 0; i < sizeof(others); i++) {
    pr_rd_init(&r, &others[i], 1);
    TH_CHECK_EQ_INT(pr_rd_u64(&r, &u), CM_ERR_PARSE);
  }
}

TH_TEST(floats_and_bools) {
  struct pr_buf b;
  pr_buf_init(&b, 0);
  msgpack_packer *pk = PR_PACKER(&b);
  msgpack_pack_float(pk, 0.1f), msgpack_pack_double(pk, 0.1), msgpack_pack_int64(pk, -7),
      msgpack_pack_float(pk, -INFINITY);
  msgpack_pack_true(pk), msgpack_pack_false(pk), msgpack_pack_nil(pk);
  struct pr_rd r;
  double d;
  int t;
  pr_rd_init(&r, b.data, b.len);
  TH_CHECK_EQ_INT(pr_rd_f64(&r, &d), 0);
  TH_CHECK(d == (double)0.1f);
  TH_CHECK_EQ_INT(pr_rd_f64(&r, &d), 0);
  TH_CHECK(d == 0.1);
  TH_CHECK_EQ_INT(pr_rd_f64(&r, &d), 0);
  TH_CHECK(d == -7.0);
  TH_CHECK_EQ_INT(pr_rd_f64(&r, &d), 0);
  TH_CHECK(isinf(d) && d < 0);
  TH_CHECK_EQ_INT(pr_rd_bool(&r, &t), 0);
  TH_CHECK_EQ_INT(t, 1);
  TH_CHECK_EQ_INT(pr_rd_bool(&r, &t), 0);
  TH_CHECK_EQ_INT(t, 0);
  TH_CHECK_EQ_INT(pr_rd_bool(&r, &t), CM_ERR_PARSE);
  TH_CHECK_EQ_INT(pr_rd_f64(&r, &d), CM_ERR_PARSE);
  static const uint8_t cut[] = {0xcb, 1, 2, 3};
  pr_rd_init(&r, cut, sizeof(cut));
  TH_CHECK_EQ_INT(pr_rd_f64(&r, &d), CM_ERR_TRUNC);
  pr_buf_free(&b);
}

TH_TEST(containers_checked_against_bytes_left) {
  struct pr_rd r;
  uint32_t n;
  static const uint8_t a3[] = {0x93, 1, 2, 3};
  pr_rd_init(&r, a3, sizeof(a3));
  TH_CHECK_EQ_INT(pr_rd_array(&r, &n), 0);
  TH_CHECK_EQ_INT(n, 3);
  pr_rd_init(&r, a3, 3); /* declares 3, holds 2 */
  TH_CHECK_EQ_INT(pr_rd_array(&r, &n), CM_ERR_TOOBIG);
  static const uint8_t a16[] = {0xdc, 0x00, 0x02, 0xc0, 0xc0};
  pr_rd_init(&r, a16, sizeof(a16));
  TH_CHECK_EQ_INT(pr_rd_array(&r, &n), 0);
  TH_CHECK_EQ_INT(n, 2);
  static const uint8_t m2[] = {0x82, 1, 2, 3};
  pr_rd_init(&r, m2, sizeof(m2));
  TH_CHECK_EQ_INT(pr_rd_map(&r, &n), CM_ERR_TOOBIG); /* 2 entries need 4 bytes */
  static const uint8_t m32[] = {0xdf, 0, 0, 0, 1, 1, 2};
  pr_rd_init(&r, m32, sizeof(m32));
  TH_CHECK_EQ_INT(pr_rd_map(&r, &n), 0);
  TH_CHECK_EQ_INT(n, 1);
  static const uint8_t a32cut[] = {0xdd, 0, 0};
  pr_rd_init(&r, a32cut, sizeof(a32cut));
  TH_CHECK_EQ_INT(pr_rd_array(&r, &n), CM_ERR_TRUNC);
  TH_CHECK(r.p == a32cut);
  /* strings point into the buffer */
  static const uint8_t s8[] = {0xd9, 3, 'a', 'b', 'c'};
  const char *s;
  pr_rd_init(&r, s8, sizeof(s8));
  TH_CHECK_EQ_INT(pr_rd_str(&r, &s, &n), 0);
  TH_CHECK(s == (const char *)s8 + 2 && n == 3);
  pr_rd_init(&r, s8, 4);
  TH_CHECK_EQ_INT(pr_rd_str(&r, &s, &n), CM_ERR_TRUNC);
  pr_rd_init(&r, a3, sizeof(a3));
  TH_CHECK_EQ_INT(pr_rd_str(&r, &s, &n), CM_ERR_PARSE);
}

TH_TEST(skip_every_format) {
  /* one value of each kind; skipping them all ends exactly at the end */
  static const uint8_t vals[] = {
      0x05,                                              /* fixint */
      0xe5,                                              /* negative fixint */
      0xc0, 0xc2, 0xc3,                                  /* nil false true */
      0x92, 0x01, 0xa1, 'x',                             /* fixarray */
      0x81, 0x01, 0x80,                                  /* fixmap */
      0xa2, 'h',  'i',                                   /* fixstr */
      0xc4, 0x02, 0xaa, 0xbb,                            /* bin8 */
      0xc5, 0x00, 0x01, 0xcc,                            /* bin16 */
      0xc6, 0x00, 0x00, 0x00, 0x00,                      /* bin32 empty */
      0xc7, 0x01, 0x05, 0xee,                            /* ext8 */
      0xc8, 0x00, 0x00, 0x05,                            /* ext16 empty */
      0xc9, 0x00, 0x00, 0x00, 0x01, 0x05, 0x01,          /* ext32 */
      0xca, 0,    0,    0,    0,                         /* float32 */
      0xcb, 0,    0,    0,    0,    0,    0,    0,    0, /* float64 */
      0xcc, 1,    0xcd, 1,    2,    0xce, 1,    2,    3,    4,    0xcf, 1,  2,    3,
      4,    5,    6,    7,    8,    0xd0, 1,    0xd1, 1,    2,    0xd2, 1,  2,    3,
      4,    0xd3, 1,    2,    3,    4,    5,    6,    7,    8,    0xd4, 1,  1, /* fixext1 */
      0xd5, 1,    1,    2,                                                     /* fixext2 */
      0xd6, 1,    1,    2,    3,    4,                                         /* fixext4 */
      0xd7, 1,    1,    2,    3,    4,    5,    6,    7,    8,                 /* fixext8 */
      0xd8, 1,    1,    2,    3,    4,    5,    6,    7,    8,    9,    10, 11,   12,
      13,   14,   15,   16, /* fixext16 */
      0xd9, 1,    'a',  0xda, 0,    1,    'b',  0xdb, 0,    0,    0,    1,  'c',  0xdc,
      0,    1,    0xc0, 0xdd, 0,    0,    0,    1,    0xc0, 0xde, 0,    1,  0xc0, 0xc0,
      0xdf, 0,    0,    0,    1,    0xc0, 0xc0,
  };
  struct pr_rd r;
  pr_rd_init(&r, vals, sizeof(vals));
  int count = 0;
  while (pr_rd_left(&r) > 0) {
    int rc = pr_rd_skip(&r, 4);
    if (rc) {
      th_fail(__FILE__, __LINE__, "skip %d at offset %zu: %s", count, (size_t)(r.p - vals),
              cm_strerror(rc));
      break;
    }
    count++;
  }
  TH_CHECK_EQ_INT(count, 36);
  /* every prefix of the whole run fails cleanly or stops at a value boundary */
  for (size_t n = 0; n < sizeof(vals); n++) {
    pr_rd_init(&r, vals, n);
    int rc = 0;
    while (pr_rd_left(&r) > 0 && (rc = pr_rd_skip(&r, 4)) == 0) {
    }
    TH_CHECK(rc == 0 || rc == CM_ERR_TRUNC || rc == CM_ERR_TOOBIG);
  }
  static const uint8_t never[] = {0xc1};
  pr_rd_init(&r, never, 1);
  TH_CHECK_EQ_INT(pr_rd_skip(&r, 4), CM_ERR_PARSE);
  static const uint8_t ext_huge[] = {0xc9, 0xff, 0xff, 0xff, 0xff, 0x01};
  pr_rd_init(&r, ext_huge, sizeof(ext_huge));
  TH_CHECK_EQ_INT(pr_rd_skip(&r, 4), CM_ERR_TRUNC);
  static const uint8_t nest[] = {0x91, 0x91, 0x91, 0x00};
  pr_rd_init(&r, nest, sizeof(nest));
  TH_CHECK_EQ_INT(pr_rd_skip(&r, 2), CM_ERR_DEPTH);
  pr_rd_init(&r, nest, sizeof(nest));
  TH_CHECK_EQ_INT(pr_rd_skip(&r, 3), 0);
}

TH_TEST(writer_cap_and_reuse) {
  struct pr_buf b;
  pr_buf_init(&b, 8);
  msgpack_packer *pk = PR_PACKER(&b);
  msgpack_pack_str_with_body(pk, "12345678", 8); /* 9 bytes with its header */
  TH_CHECK_EQ_INT(b.err, CM_ERR_TOOBIG);
  pr_buf_reset(&b);
  TH_CHECK_EQ_INT(b.err, 0);
  msgpack_pack_str_with_body(pk, "1234567", 7);
  TH_CHECK_EQ_INT(b.err, 0);
  TH_CHECK_EQ_INT(b.len, 8);
  pr_buf_free(&b);
  /* string headers at each width */
  static char s[70000];
  memset(s, 'q', sizeof(s));
  pr_buf_init(&b, 0);
  const size_t lens[] = {0, 31, 32, 255, 256, 65535, 65536};
  for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
    msgpack_pack_str_with_body(pk, s, lens[i]);
  struct pr_rd r;
  pr_rd_init(&r, b.data, b.len);
  for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
    const char *p;
    uint32_t n;
    TH_CHECK_EQ_INT(pr_rd_str(&r, &p, &n), 0);
    TH_CHECK_EQ_INT(n, lens[i]);
  }
  TH_CHECK_EQ_INT(pr_rd_left(&r), 0);
  pr_buf_free(&b);
}

TH_TEST(map_keys) {
  struct pr_rd r;
  uint64_t k;
  static const uint8_t keys[] = {0x07, 0xa1, 'x', 0xff, 0xcf, 0,    0,    0,
                                 1,    0,    0,   0,    0,    0x92, 0x01, 0x02};
  pr_rd_init(&r, keys, sizeof(keys));
  TH_CHECK_EQ_INT(pr_rd_key(&r, 4, &k), 0);
  TH_CHECK(k == 7);
  TH_CHECK_EQ_INT(pr_rd_key(&r, 4, &k), 0); /* a string key: skipped, unknown */
  TH_CHECK(k == UINT64_MAX);
  TH_CHECK_EQ_INT(pr_rd_key(&r, 4, &k), 0); /* negative */
  TH_CHECK(k == UINT64_MAX);
  TH_CHECK_EQ_INT(pr_rd_key(&r, 4, &k), 0); /* >= 2^32 */
  TH_CHECK(k == UINT64_MAX);
  TH_CHECK_EQ_INT(pr_rd_key(&r, 0, &k), CM_ERR_DEPTH); /* an array, no depth left */
  TH_CHECK_EQ_INT(pr_rd_key(&r, 1, &k), 0);
  TH_CHECK_EQ_INT(pr_rd_left(&r), 0);
}

/* The array readers take every integer encoding, fast path or not, and
 * refuse out-of-range elements; pr_pack_numbers matches the packer's
 * element by element form byte for byte. */
TH_TEST(number_arrays) {
  static const uint8_t mixed[] = {0x05, 0xcc, 0xc8, 0xcd, 0x01, 0x00, 0xce, 0, 1, 0,    0,
                                  0xcf, 0,    0,    0,    0,    0,    0,    0, 9, 0xd0, 0x07,
                                  0xd3, 0,    0,    0,    0,    0,    0,    0, 3};
  uint32_t u[7];
  struct pr_rd r;
  pr_rd_init(&r, mixed, sizeof(mixed));
  TH_REQUIRE(pr_rd_u32_array(&r, u, 7) == 0);
  const uint32_t want[7] = {5, 200, 256, 65536, 9, 7, 3};
  TH_CHECK(memcmp(u, want, sizeof(want)) == 0);
  TH_CHECK_EQ_INT(pr_rd_left(&r), 0);
  uint64_t w[7];
  pr_rd_init(&r, mixed, sizeof(mixed));
  TH_REQUIRE(pr_rd_u64_array(&r, w, 7) == 0);
  TH_CHECK(w[3] == 65536 && w[6] == 3);
  /* -1 allowed for block ids, -2 refused where it stands */
  static const uint8_t blocks[] = {0xff, 0x10, 0xfe};
  int32_t b[3];
  pr_rd_init(&r, blocks, sizeof(blocks));
  TH_CHECK_EQ_INT(pr_rd_i32_array(&r, -1, b, 3), CM_ERR_RANGE);
  TH_CHECK(b[0] == -1 && b[1] == 16);
  TH_CHECK(r.p == blocks + 2);
  static const uint8_t too_big[] = {0x01, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0};
  pr_rd_init(&r, too_big, sizeof(too_big));
  TH_CHECK_EQ_INT(pr_rd_u32_array(&r, u, 2), CM_ERR_RANGE);
  TH_CHECK(r.p == too_big + 1);
  static const uint8_t i32_big[] = {0xce, 0x80, 0, 0, 0};
  pr_rd_init(&r, i32_big, sizeof(i32_big));
  TH_CHECK_EQ_INT(pr_rd_i32_array(&r, -1, b, 1), CM_ERR_RANGE);
  for (size_t n = 0; n < sizeof(mixed); n++) { /* cut anywhere: never reads past */
    pr_rd_init(&r, mixed, n);
    TH_CHECK(pr_rd_u32_array(&r, u, 7) < 0);
  }
  /* whole arrays and element by element agree */
  static const int32_t iv[] = {-1,   0,      127,    128,       -32,       -33,   -128,
                               -129, -32768, -32769, INT32_MIN, INT32_MAX, 65535, 65536};
  static const uint32_t uv[] = {0, 127, 128, 255, 256, 65535, 65536, UINT32_MAX};
  static const uint64_t lv[] = {0, 1, UINT32_MAX, (uint64_t)UINT32_MAX + 1, UINT64_MAX};
  static const float fv[] = {0.0f, -1.5f, -INFINITY, 3.25e-20f};
  struct pr_buf x, y;
  pr_buf_init(&x, 0);
  pr_buf_init(&y, 0);
  msgpack_packer *pk_y = PR_PACKER(&y);
  pr_pack_numbers(&x, PR_NUM_I32, iv, 14), pr_pack_numbers(&x, PR_NUM_U32, uv, 8),
      pr_pack_numbers(&x, PR_NUM_U64, lv, 5);
  pr_pack_numbers(&x, PR_NUM_F32, fv, 4);
  msgpack_pack_array(pk_y, 14);
  for (int i = 0; i < 14; i++)
    msgpack_pack_int64(pk_y, iv[i]);
  msgpack_pack_array(pk_y, 8);
  for (int i = 0; i < 8; i++)
    msgpack_pack_uint64(pk_y, uv[i]);
  msgpack_pack_array(pk_y, 5);
  for (int i = 0; i < 5; i++)
    msgpack_pack_uint64(pk_y, lv[i]);
  msgpack_pack_array(pk_y, 4);
  for (int i = 0; i < 4; i++)
    msgpack_pack_float(pk_y, fv[i]);
  TH_CHECK(x.err == 0 && y.err == 0);
  TH_CHECK(x.len == y.len && memcmp(x.data, y.data, x.len) == 0);
  /* near the cap pr_pack_numbers goes by the stack and still fits exactly */
  struct pr_buf z;
  pr_buf_init(&z, 10);
  pr_pack_numbers(&z, PR_NUM_U32, uv, 5); /* 1 + 1+1+2+2+3 = 10 bytes: fits only exactly */
  TH_CHECK_EQ_INT(z.err, 0);
  TH_CHECK_EQ_INT(z.len, 10);
  pr_buf_free(&x);
  pr_buf_free(&y);
  pr_buf_free(&z);
}
