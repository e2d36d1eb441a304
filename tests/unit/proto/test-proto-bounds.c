/* test-proto-bounds.c — hostile inputs against every message decoder: huge
 * declared lengths (`dd ff ff ff ff` and friends), deep nesting, arena caps,
 * wrong types, out-of-range numbers, duplicate and unknown keys, bad strings.
 * This executable is linked with -Wl,--wrap=malloc,calloc,realloc so the
 * tests can count the bytes our code asks the C library for. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-arena.h"
#include "common/cm-err.h"
#include "proto/pr-codec.h"
#include "proto/pr-mp.h"
#include "proto/pr-msg.h"
#include "tests/harness/th.h"

/* ---- malloc accounting (link-time wrapping) ---- */
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
static size_t g_alloc_bytes; /* bytes requested since the last reset */

void *__wrap_malloc(size_t n) {
  g_alloc_bytes += n;
  return __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t size) {
  g_alloc_bytes += n * size;
  return __real_calloc(n, size);
}
void *__wrap_realloc(void *p, size_t n) {
  g_alloc_bytes += n;
  return __real_realloc(p, n);
}

static const enum pr_type all_types[] = {PR_ADD,  PR_ABORT, PR_PING, PR_OUT,   PR_ERR,
                                         PR_PONG, PR_STEP,  PR_CTRL, PR_READY, PR_RESULT,
                                         PR_BEAT, PR_FAIL,  PR_DIST, PR_DOWN};

#define SMALL (64u << 10) /* bytes: what a hostile input may make us allocate */

/* Decodes `body` (copied to an exact-size heap block) as `type` with a fresh
 * arena of cap `cap`; returns the result and the bytes malloc'd / the arena
 * peak during the call. */
static int decode(enum pr_type type, const void *body, size_t len, size_t cap, size_t *mallocd,
                  size_t *peak) {
  uint8_t *copy = malloc(len ? len : 1);
  memcpy(copy, body, len);
  struct cm_arena a;
  struct pr_msg m;
  cm_arena_init(&a, 1024, cap);
  g_alloc_bytes = 0;
  int rc = pr_msg_decode_body(type, copy, len, &a, &m);
  if (mallocd) *mallocd = g_alloc_bytes;
  if (peak) *peak = a.peak;
  cm_arena_free(&a);
  free(copy);
  return rc;
}

static int decode_buf(enum pr_type type, const struct pr_buf *b) {
  if (b->err) return 1; /* a test bug: make it visible as "decoded" */
  return decode(type, b->data, b->len, 1u << 20, NULL, NULL);
}

/* The famous five bytes, and the other huge declared lengths, as the whole
 * body and as a value of a key, against every message type. */
TH_TEST(huge_declared_lengths_fail_small) {
  static const uint8_t bodies[][8] = {
      {0xdd, 0xff, 0xff, 0xff, 0xff},       /* array32 of 2^32-1 */
      {0xdf, 0xff, 0xff, 0xff, 0xff},       /* map32 */
      {0xdb, 0xff, 0xff, 0xff, 0xff},       /* str32 */
      {0xc6, 0xff, 0xff, 0xff, 0xff},       /* bin32 */
      {0xc9, 0xff, 0xff, 0xff, 0xff, 0x01}, /* ext32 */
      {0xdc, 0xff, 0xff},                   /* array16 */
      {0xde, 0xff, 0xff},                   /* map16 */
  };
  static const size_t lens[] = {5, 5, 5, 5, 6, 3, 3};
  for (size_t t = 0; t < sizeof(all_types) / sizeof(all_types[0]); t++) {
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
      for (uint8_t key = 0; key < 8; key++) {
        uint8_t body[16];
        size_t n = 0;
        if (key < 7) body[n++] = 0x81, body[n++] = key; /* {key: value} */
        memcpy(body + n, bodies[i], lens[i]);
        n += lens[i];
        size_t mallocd, peak;
        int rc = decode(all_types[t], body, n, 1u << 30, &mallocd, &peak);
        if (rc >= 0)
          th_fail(__FILE__, __LINE__, "type %d body %zu key %d: decoded", all_types[t], i, key);
        TH_CHECK(mallocd < SMALL);
        TH_CHECK(peak < SMALL);
      }
    }
  }
  /* exactly the five bytes, with an unlimited arena */
  size_t mallocd = 1, peak = 1;
  const uint8_t five[5] = {0xdd, 0xff, 0xff, 0xff, 0xff};
  TH_CHECK_EQ_INT(decode(PR_ADD, five, 5, 0, &mallocd, &peak), CM_ERR_PARSE); /* not a map */
  TH_CHECK_EQ_INT(mallocd, 0);
  TH_CHECK_EQ_INT(peak, 0);
  /* and where an array is expected: ADD's prompt */
  const uint8_t keyed[7] = {0x81, PR_K_ADD_PROMPT, 0xdd, 0xff, 0xff, 0xff, 0xff};
  TH_CHECK_EQ_INT(decode(PR_ADD, keyed, 7, 0, &mallocd, &peak), CM_ERR_TOOBIG);
  TH_CHECK_EQ_INT(mallocd, 0);
  TH_CHECK_EQ_INT(peak, 0);
}

/* Decodes body as every message type with an unlimited arena: each must fail
 * with `want` and allocate less than SMALL. */
static void every_type_fails_small(const uint8_t *body, size_t n, int want) {
  for (size_t t = 0; t < sizeof(all_types) / sizeof(all_types[0]); t++) {
    size_t mallocd, peak;
    int rc = decode(all_types[t], body, n, 0, &mallocd, &peak);
    if (rc != want || mallocd >= SMALL || peak >= SMALL)
      th_fail(__FILE__, __LINE__, "type %d: rc %d (want %d), %zu bytes malloc'd, arena peak %zu",
              all_types[t], rc, want, mallocd, peak);
  }
}

/* 40 nested arrays: as the body (not a map), and under an unknown key where
 * the skipper must stop at PR_MAX_DEPTH. */
TH_TEST(deep_nesting_fails) {
  uint8_t body[64];
  size_t n = 0;
  for (int i = 0; i < 40; i++)
    body[n++] = 0x91;
  body[n++] = 0x00;
  every_type_fails_small(body, n, CM_ERR_PARSE);
  uint8_t keyed[80];
  size_t k = 0;
  keyed[k++] = 0x81;
  keyed[k++] = 0x3f; /* key 63: known to no record */
  memcpy(keyed + k, body, n);
  k += n;
  every_type_fails_small(keyed, k, CM_ERR_DEPTH);
  /* the same through maps: {63: {0: {0: ... }}} */
  uint8_t maps[96];
  size_t mn = 0;
  maps[mn++] = 0x81;
  maps[mn++] = 0x3f;
  for (int i = 0; i < 40; i++)
    maps[mn++] = 0x81, maps[mn++] = 0x00;
  maps[mn++] = 0xc0;
  TH_CHECK_EQ_INT(decode(PR_STEP, maps, mn, 0, NULL, NULL), CM_ERR_DEPTH);
  /* nesting just inside the limit is skipped, one more level is not */
  uint8_t shallow[32];
  size_t s = 0;
  shallow[s++] = 0x81;
  shallow[s++] = 0x3f;
  /* the top-level map plus PR_MAX_DEPTH - 1 arrays: PR_MAX_DEPTH levels */
  for (int i = 0; i < PR_MAX_DEPTH - 1; i++)
    shallow[s++] = 0x91;
  shallow[s++] = 0xc0;
  TH_CHECK_EQ_INT(decode(PR_PING, shallow, s, 0, NULL, NULL), 0);
  shallow[2 + PR_MAX_DEPTH - 1] = 0x91;
  shallow[2 + PR_MAX_DEPTH] = 0xc0;
  TH_CHECK_EQ_INT(decode(PR_PING, shallow, s + 1, 0, NULL, NULL), CM_ERR_DEPTH);
}

/* b made again as the start of an ADD body: a map of n_keys members whose
 * first are the request id (1), max_tokens (1) and the prompt's array header
 * of n_prompt tokens, which the caller writes next. */
static void add_head(struct pr_buf *b, uint32_t n_keys, uint32_t n_prompt) {
  msgpack_packer *pk = PR_PACKER(b);
  pr_buf_reset(b);
  msgpack_pack_map(pk, n_keys);
  msgpack_pack_uint64(pk, PR_K_ADD_ID), msgpack_pack_uint64(pk, 1);
  msgpack_pack_uint64(pk, PR_K_ADD_MAX_TOKENS), msgpack_pack_uint64(pk, 1);
  msgpack_pack_uint64(pk, PR_K_ADD_PROMPT), msgpack_pack_array(pk, n_prompt);
}

/* A well-formed array whose elements need more memory than the arena's cap. */
TH_TEST(arena_cap_bounds_allocation) {
  struct pr_buf b;
  pr_buf_init(&b, 0);
  msgpack_packer *pk = PR_PACKER(&b);
  add_head(&b, 3, 100000);
  for (int i = 0; i < 100000; i++)
    msgpack_pack_uint64(pk, 7);
  TH_REQUIRE(b.err == 0);
  size_t mallocd, peak;
  TH_CHECK_EQ_INT(decode(PR_ADD, b.data, b.len, SMALL, &mallocd, &peak), CM_ERR_NOMEM);
  TH_CHECK(mallocd <= SMALL + 1024 && peak <= SMALL);
  TH_CHECK_EQ_INT(decode(PR_ADD, b.data, b.len, 1u << 20, &mallocd, &peak), 0);
  TH_CHECK(peak >= 400000);
  pr_buf_free(&b);
}

/* {key: <value written by the code after it>} as a body, through the caller's pk. */
#define ONE(b, key, ...)                                                                           \
  do {                                                                                             \
    pr_buf_reset(b);                                                                               \
    msgpack_pack_map(pk, 1);                                                                       \
    msgpack_pack_uint64(pk, (key));                                                                \
    __VA_ARGS__;                                                                                   \
  } while (0)

TH_TEST(wrong_types_and_ranges) {
  struct pr_buf b;
  pr_buf_init(&b, 0);
  msgpack_packer *pk = PR_PACKER(&b);
  ONE(&b, PR_K_PING_NONCE, msgpack_pack_str_with_body(pk, "x", 1));
  TH_CHECK_EQ_INT(decode_buf(PR_PING, &b), CM_ERR_PARSE);
  ONE(&b, PR_K_PING_NONCE, msgpack_pack_int64(pk, -1));
  TH_CHECK_EQ_INT(decode_buf(PR_PING, &b), CM_ERR_RANGE);
  ONE(&b, PR_K_PING_NONCE, msgpack_pack_double(pk, 1.0));
  TH_CHECK_EQ_INT(decode_buf(PR_PING, &b), CM_ERR_PARSE);
  ONE(&b, PR_K_PING_NONCE, msgpack_pack_nil(pk));
  TH_CHECK_EQ_INT(decode_buf(PR_PING, &b), CM_ERR_PARSE);
  ONE(&b, PR_K_BEAT_RANK, msgpack_pack_uint64(pk, 1ull << 32));
  TH_CHECK_EQ_INT(decode_buf(PR_BEAT, &b), CM_ERR_RANGE);
  ONE(&b, PR_K_BEAT_RANK, msgpack_pack_uint64(pk, UINT32_MAX));
  TH_CHECK_EQ_INT(decode_buf(PR_BEAT, &b), 0);
  /* a flag this build does not know is out of range, not ignored */
  for (uint64_t f = PR_BEAT_FLAGS_ALL; f <= PR_BEAT_FLAGS_ALL + 1; f++) {
    pr_buf_reset(&b);
    msgpack_pack_map(pk, 2);
    msgpack_pack_uint64(pk, PR_K_BEAT_RANK);
    msgpack_pack_uint64(pk, 0);
    msgpack_pack_uint64(pk, PR_K_BEAT_FLAGS);
    msgpack_pack_uint64(pk, f);
    TH_CHECK_EQ_INT(decode_buf(PR_BEAT, &b), f == PR_BEAT_FLAGS_ALL ? 0 : CM_ERR_RANGE);
  }
  ONE(&b, PR_K_FAIL_CODE, msgpack_pack_int64(pk, (int64_t)INT32_MIN - 1));
  TH_CHECK_EQ_INT(decode_buf(PR_FAIL, &b), CM_ERR_RANGE);
  ONE(&b, PR_K_CTRL_OP, msgpack_pack_uint64(pk, 9));
  TH_CHECK_EQ_INT(decode_buf(PR_CTRL, &b), CM_ERR_UNKNOWN);
  ONE(&b, PR_K_PONG_KV_USAGE, msgpack_pack_double(pk, 1.5));
  TH_CHECK_EQ_INT(decode_buf(PR_PONG, &b), CM_ERR_RANGE);
  ONE(&b, PR_K_PONG_KV_USAGE, msgpack_pack_double(pk, NAN));
  TH_CHECK_EQ_INT(decode_buf(PR_PONG, &b), CM_ERR_RANGE);
  ONE(&b, PR_K_PONG_KV_USAGE, msgpack_pack_uint64(pk, 1)); /* an integer where a float goes */
  TH_CHECK_EQ_INT(decode_buf(PR_PONG, &b), 0);
  /* a top-level array instead of a map */
  pr_buf_reset(&b);
  msgpack_pack_array(pk, 1), msgpack_pack_uint64(pk, 1);
  TH_CHECK_EQ_INT(decode_buf(PR_PING, &b), CM_ERR_PARSE);
  /* missing required keys */
  pr_buf_reset(&b);
  msgpack_pack_map(pk, 0);
  TH_CHECK_EQ_INT(decode_buf(PR_ADD, &b), CM_ERR_PARSE);
  TH_CHECK_EQ_INT(decode_buf(PR_STEP, &b), CM_ERR_PARSE);
  TH_CHECK_EQ_INT(decode_buf(PR_READY, &b), CM_ERR_PARSE);
  TH_CHECK_EQ_INT(decode_buf(PR_ABORT, &b), 0);
  pr_buf_free(&b);
}

/* An ADD with a sampling map holding one field. */
static int add_with_sampling(struct pr_buf *b, uint32_t key, double v) {
  msgpack_packer *pk = PR_PACKER(b);
  add_head(b, 4, 1);
  msgpack_pack_uint64(pk, 2);
  msgpack_pack_uint64(pk, PR_K_ADD_SAMPLING), msgpack_pack_map(pk, 1), msgpack_pack_uint64(pk, key),
      msgpack_pack_double(pk, v);
  return decode_buf(PR_ADD, b);
}

TH_TEST(sampling_ranges) {
  struct pr_buf b;
  pr_buf_init(&b, 0);
  TH_CHECK_EQ_INT(add_with_sampling(&b, PR_K_SAMP_TEMPERATURE, 0.0), 0);
  TH_CHECK_EQ_INT(add_with_sampling(&b, PR_K_SAMP_TEMPERATURE, -0.5), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(add_with_sampling(&b, PR_K_SAMP_TEMPERATURE, NAN), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(add_with_sampling(&b, PR_K_SAMP_TEMPERATURE, INFINITY), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(add_with_sampling(&b, PR_K_SAMP_TEMPERATURE, 1e39), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(add_with_sampling(&b, PR_K_SAMP_TOP_P, 0.0), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(add_with_sampling(&b, PR_K_SAMP_TOP_P, 1.01), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(add_with_sampling(&b, PR_K_SAMP_MIN_P, -0.1), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(add_with_sampling(&b, PR_K_SAMP_PRESENCE, 2.5), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(add_with_sampling(&b, PR_K_SAMP_REPETITION, 0.0), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(add_with_sampling(&b, PR_K_SAMP_TOP_K, 5.0), CM_ERR_PARSE); /* float */
  pr_buf_free(&b);
}

TH_TEST(keys_duplicate_unknown) {
  struct pr_buf b;
  pr_buf_init(&b, 0);
  msgpack_packer *pk = PR_PACKER(&b);
  msgpack_pack_map(pk, 2);
  msgpack_pack_uint64(pk, PR_K_PING_NONCE), msgpack_pack_uint64(pk, 1);
  msgpack_pack_uint64(pk, PR_K_PING_NONCE), msgpack_pack_uint64(pk, 2);
  TH_CHECK_EQ_INT(decode_buf(PR_PING, &b), CM_ERR_PARSE);
  /* unknown keys of every kind are skipped, values nested or not */
  pr_buf_reset(&b);
  msgpack_pack_map(pk, 6);
  msgpack_pack_uint64(pk, 50), msgpack_pack_map(pk, 1), msgpack_pack_str_with_body(pk, "k", 1),
      msgpack_pack_array(pk, 2), msgpack_pack_nil(pk), msgpack_pack_float(pk, 1.0f);
  msgpack_pack_str_with_body(pk, "nonce", 5), msgpack_pack_uint64(pk, 9);
  msgpack_pack_int64(pk, -3), msgpack_pack_true(pk);
  msgpack_pack_uint64(pk, 1ull << 40), msgpack_pack_str_with_body(pk, "v", 1);
  msgpack_pack_uint64(pk, PR_K_PING_NONCE), msgpack_pack_uint64(pk, 77);
  msgpack_pack_array(pk, 1), msgpack_pack_uint64(pk, 0),
      msgpack_pack_uint64(pk, 0); /* an array as key */
  TH_REQUIRE(b.err == 0);
  struct cm_arena a;
  struct pr_msg m;
  cm_arena_init(&a, 0, 1 << 16);
  TH_CHECK_EQ_INT(pr_msg_decode_body(PR_PING, b.data, b.len, &a, &m), 0);
  TH_CHECK(m.u.ping.nonce == 77);
  cm_arena_free(&a);
  pr_buf_free(&b);
}

TH_TEST(strings_checked) {
  struct pr_buf b;
  pr_buf_init(&b, 0);
  msgpack_packer *pk = PR_PACKER(&b);
  static const struct {
    const char *s;
    size_t n;
    int rc;
  } cases[] = {
      {"plain", 5, 0},
      {"caf\xc3\xa9 \xf0\x9f\x98\x80", 10, 0},
      {"nul\0inside", 10, CM_ERR_PARSE},
      {"\xc0\x80", 2, CM_ERR_PARSE},         /* overlong NUL */
      {"\xed\xa0\x80", 3, CM_ERR_PARSE},     /* surrogate */
      {"\xf4\x90\x80\x80", 4, CM_ERR_PARSE}, /* past U+10FFFF */
      {"\xe2\x82", 2, CM_ERR_PARSE},         /* cut sequence */
      {"\x80", 1, CM_ERR_PARSE},             /* lone continuation */
      {"\xff", 1, CM_ERR_PARSE},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    pr_buf_reset(&b);
    msgpack_pack_map(pk, 2);
    msgpack_pack_uint64(pk, PR_K_ERR_CODE), msgpack_pack_int64(pk, -2);
    msgpack_pack_uint64(pk, PR_K_ERR_MESSAGE),
        msgpack_pack_str_with_body(pk, cases[i].s, cases[i].n);
    int rc = decode_buf(PR_ERR, &b);
    if (rc != cases[i].rc) th_fail(__FILE__, __LINE__, "string case %zu: rc %d", i, rc);
  }
  /* length limit */
  char *big = malloc(PR_MAX_STR + 1);
  memset(big, 'a', PR_MAX_STR + 1);
  pr_buf_reset(&b);
  msgpack_pack_map(pk, 2);
  msgpack_pack_uint64(pk, PR_K_FAIL_RANK), msgpack_pack_uint64(pk, 0);
  msgpack_pack_uint64(pk, PR_K_FAIL_CODE), msgpack_pack_int64(pk, -1);
  size_t head = b.len;
  TH_CHECK_EQ_INT(decode_buf(PR_FAIL, &b), 0);
  b.data[0] = 0x83;
  msgpack_pack_uint64(pk, PR_K_FAIL_MESSAGE), msgpack_pack_str_with_body(pk, big, PR_MAX_STR);
  TH_CHECK_EQ_INT(decode_buf(PR_FAIL, &b), 0);
  b.len = head;
  msgpack_pack_uint64(pk, PR_K_FAIL_MESSAGE), msgpack_pack_str_with_body(pk, big, PR_MAX_STR + 1);
  TH_CHECK_EQ_INT(decode_buf(PR_FAIL, &b), CM_ERR_TOOBIG);
  free(big);
  pr_buf_free(&b);
}

/* b made again as a STEP or RESULT body {id_key: 1, seqs_key: [{...}]} whose
 * one sequence record is a map of n_keys members, written next. */
static void one_seq(struct pr_buf *b, uint32_t id_key, uint32_t seqs_key, uint32_t n_keys) {
  msgpack_packer *pk = PR_PACKER(b);
  pr_buf_reset(b);
  msgpack_pack_map(pk, 2);
  msgpack_pack_uint64(pk, id_key), msgpack_pack_uint64(pk, 1);
  msgpack_pack_uint64(pk, seqs_key), msgpack_pack_array(pk, 1), msgpack_pack_map(pk, n_keys);
}

/* Limits inside STEP / RESULT / OUT records. */
TH_TEST(record_limits) {
  struct pr_buf b;
  pr_buf_init(&b, 0);
  msgpack_packer *pk = PR_PACKER(&b);
  /* STEP with one sequence whose `field` is written by the code after it */
#define STEP_SEQ(field_key, ...)                                                                   \
  do {                                                                                             \
    one_seq(&b, PR_K_STEP_ID, PR_K_STEP_SEQS, 2);                                                  \
    msgpack_pack_uint64(pk, PR_K_SSEQ_ID), msgpack_pack_uint64(pk, 5);                             \
    msgpack_pack_uint64(pk, (field_key));                                                          \
    __VA_ARGS__;                                                                                   \
  } while (0)
  STEP_SEQ(PR_K_SSEQ_TABLES, msgpack_pack_array(pk, PR_MAX_KV_GROUPS + 1);
           for (int g = 0; g <= PR_MAX_KV_GROUPS; g++) msgpack_pack_array(pk, 0));
  TH_CHECK_EQ_INT(decode_buf(PR_STEP, &b), CM_ERR_TOOBIG);
  STEP_SEQ(PR_K_SSEQ_TABLES, msgpack_pack_array(pk, PR_MAX_KV_GROUPS);
           for (int g = 0; g < PR_MAX_KV_GROUPS; g++) msgpack_pack_array(pk, 0));
  TH_CHECK_EQ_INT(decode_buf(PR_STEP, &b), 0);
  STEP_SEQ(PR_K_SSEQ_TABLES, msgpack_pack_array(pk, 1); msgpack_pack_array(pk, 2);
           msgpack_pack_int64(pk, -1); msgpack_pack_int64(pk, -2));
  TH_CHECK_EQ_INT(decode_buf(PR_STEP, &b), CM_ERR_RANGE);
  STEP_SEQ(PR_K_SSEQ_DRAFTS, msgpack_pack_array(pk, PR_MAX_DRAFT + 1);
           for (int i = 0; i <= PR_MAX_DRAFT; i++) msgpack_pack_uint64(pk, 1));
  TH_CHECK_EQ_INT(decode_buf(PR_STEP, &b), CM_ERR_TOOBIG);
  STEP_SEQ(PR_K_SSEQ_NUM_DRAFT, msgpack_pack_uint64(pk, PR_MAX_DRAFT + 1));
  TH_CHECK_EQ_INT(decode_buf(PR_STEP, &b), CM_ERR_RANGE);
  STEP_SEQ(PR_K_SSEQ_FLAGS, msgpack_pack_uint64(pk, PR_SEQ_FLAGS_ALL + 1));
  TH_CHECK_EQ_INT(decode_buf(PR_STEP, &b), CM_ERR_RANGE);
  STEP_SEQ(PR_K_SSEQ_FLAGS, msgpack_pack_uint64(pk, PR_SEQ_NEW | PR_SEQ_APPEND_BLOCKS));
  TH_CHECK_EQ_INT(decode_buf(PR_STEP, &b), CM_ERR_INVAL);
  STEP_SEQ(PR_K_SSEQ_FLAGS, msgpack_pack_uint64(pk, PR_SEQ_SAMPLE | PR_SEQ_APPEND_BLOCKS));
  TH_CHECK_EQ_INT(decode_buf(PR_STEP, &b), 0);
  /* the drafts of the step before: only with its token, with slots for them and none
   * sent (flags, then num_draft and draft tokens where n > 2) */
  static const struct {
    uint32_t flags, num_draft, n_drafts;
    int want;
  } prev[] = {
      {PR_SEQ_SAMPLE | PR_SEQ_PREV_DRAFTS, 2, 0, CM_ERR_INVAL},
      {PR_SEQ_SAMPLE | PR_SEQ_PREV_TOKEN | PR_SEQ_PREV_DRAFTS, 0, 0, CM_ERR_INVAL},
      {PR_SEQ_SAMPLE | PR_SEQ_PREV_TOKEN | PR_SEQ_PREV_DRAFTS, 2, 0, 0},
      {PR_SEQ_SAMPLE | PR_SEQ_PREV_TOKEN | PR_SEQ_PREV_DRAFTS, 2, 1, CM_ERR_INVAL},
  };
  for (size_t i = 0; i < sizeof(prev) / sizeof(prev[0]); i++) {
    one_seq(&b, PR_K_STEP_ID, PR_K_STEP_SEQS, 4);
    msgpack_pack_uint64(pk, PR_K_SSEQ_ID), msgpack_pack_uint64(pk, 5);
    msgpack_pack_uint64(pk, PR_K_SSEQ_FLAGS), msgpack_pack_uint64(pk, prev[i].flags);
    msgpack_pack_uint64(pk, PR_K_SSEQ_NUM_DRAFT), msgpack_pack_uint64(pk, prev[i].num_draft);
    msgpack_pack_uint64(pk, PR_K_SSEQ_DRAFTS), msgpack_pack_array(pk, prev[i].n_drafts);
    for (uint32_t k = 0; k < prev[i].n_drafts; k++)
      msgpack_pack_uint64(pk, 7);
    TH_CHECK_EQ_INT(decode_buf(PR_STEP, &b), prev[i].want);
  }
  STEP_SEQ(PR_K_SSEQ_SAMPLING, msgpack_pack_map(pk, 1); msgpack_pack_uint64(pk, PR_K_SAMP_TOP_P);
           msgpack_pack_float(pk, 2.0f));
  TH_CHECK_EQ_INT(decode_buf(PR_STEP, &b), CM_ERR_RANGE);
  /* a sequence record without its id */
  one_seq(&b, PR_K_STEP_ID, PR_K_STEP_SEQS, 0);
  TH_CHECK_EQ_INT(decode_buf(PR_STEP, &b), CM_ERR_PARSE);

  /* RESULT with one sequence (id 1, one token) whose `field` is written by
   * the code after it: more accepted drafts than tokens; logprobs that
   * disagree */
#define RESULT_SEQ(field_key, ...)                                                                 \
  do {                                                                                             \
    one_seq(&b, PR_K_RES_STEP, PR_K_RES_SEQS, 3);                                                  \
    msgpack_pack_uint64(pk, PR_K_RSEQ_ID), msgpack_pack_uint64(pk, 1);                             \
    msgpack_pack_uint64(pk, PR_K_RSEQ_TOKENS), msgpack_pack_array(pk, 1);                          \
    msgpack_pack_uint64(pk, 1);                                                                    \
    msgpack_pack_uint64(pk, (field_key));                                                          \
    __VA_ARGS__;                                                                                   \
  } while (0)
  RESULT_SEQ(PR_K_RSEQ_ACCEPTED, msgpack_pack_uint64(pk, 2));
  TH_CHECK_EQ_INT(decode_buf(PR_RESULT, &b), CM_ERR_RANGE);
  /* more accepted drafts than verified ones; more verified than a step holds */
  RESULT_SEQ(PR_K_RSEQ_ACCEPTED, msgpack_pack_uint64(pk, 1));
  TH_CHECK_EQ_INT(decode_buf(PR_RESULT, &b), CM_ERR_RANGE);
  RESULT_SEQ(PR_K_RSEQ_VERIFIED, msgpack_pack_uint64(pk, PR_MAX_DRAFT + 1));
  TH_CHECK_EQ_INT(decode_buf(PR_RESULT, &b), CM_ERR_RANGE);
  RESULT_SEQ(PR_K_RSEQ_VERIFIED, msgpack_pack_uint64(pk, PR_MAX_DRAFT));
  TH_CHECK_EQ_INT(decode_buf(PR_RESULT, &b), 0);
  RESULT_SEQ(PR_K_RSEQ_LOGPROBS, msgpack_pack_map(pk, 1); msgpack_pack_uint64(pk, PR_K_LP_SAMPLED);
             msgpack_pack_array(pk, 2); msgpack_pack_float(pk, -1); msgpack_pack_float(pk, -1));
  TH_CHECK_EQ_INT(decode_buf(PR_RESULT, &b), CM_ERR_INVAL);
  RESULT_SEQ(PR_K_RSEQ_LOGPROBS, msgpack_pack_map(pk, 1); msgpack_pack_uint64(pk, PR_K_LP_SAMPLED);
             msgpack_pack_array(pk, 1); msgpack_pack_float(pk, INFINITY));
  TH_CHECK_EQ_INT(decode_buf(PR_RESULT, &b), CM_ERR_RANGE);
  RESULT_SEQ(PR_K_RSEQ_LOGPROBS, msgpack_pack_map(pk, 1); msgpack_pack_uint64(pk, PR_K_LP_N_TOP);
             msgpack_pack_uint64(pk, PR_MAX_TOP_LOGPROBS + 1));
  TH_CHECK_EQ_INT(decode_buf(PR_RESULT, &b), CM_ERR_RANGE);
  /* a scored prompt row: at position 0 (no token before it), ranks that disagree with
   * the logprobs, a rank of 0; then one that holds */
#define PROMPT_LP(pos, n_ranks, rank)                                                              \
  do {                                                                                             \
    one_seq(&b, PR_K_RES_STEP, PR_K_RES_SEQS, 4);                                                  \
    msgpack_pack_uint64(pk, PR_K_RSEQ_ID), msgpack_pack_uint64(pk, 1);                             \
    msgpack_pack_uint64(pk, PR_K_RSEQ_TOKENS), msgpack_pack_array(pk, 0);                          \
    msgpack_pack_uint64(pk, PR_K_RSEQ_PROMPT_LOGPROBS), msgpack_pack_map(pk, 2);                   \
    msgpack_pack_uint64(pk, PR_K_LP_SAMPLED), msgpack_pack_array(pk, 1);                           \
    msgpack_pack_float(pk, -1);                                                                    \
    msgpack_pack_uint64(pk, PR_K_LP_RANKS), msgpack_pack_array(pk, (n_ranks));                     \
    for (int i_ = 0; i_ < (n_ranks); i_++)                                                         \
      msgpack_pack_uint64(pk, (rank));                                                             \
    msgpack_pack_uint64(pk, PR_K_RSEQ_PROMPT_POS), msgpack_pack_uint64(pk, (pos));                 \
  } while (0)
  PROMPT_LP(0, 1, 1);
  TH_CHECK_EQ_INT(decode_buf(PR_RESULT, &b), CM_ERR_RANGE);
  PROMPT_LP(3, 2, 1);
  TH_CHECK_EQ_INT(decode_buf(PR_RESULT, &b), CM_ERR_INVAL);
  PROMPT_LP(3, 1, 0);
  TH_CHECK_EQ_INT(decode_buf(PR_RESULT, &b), CM_ERR_RANGE);
  PROMPT_LP(3, 1, 7);
  TH_CHECK_EQ_INT(decode_buf(PR_RESULT, &b), 0);
#undef PROMPT_LP

  /* OUT: finish reason and stop token out of range */
  pr_buf_reset(&b);
  msgpack_pack_map(pk, 1);
  msgpack_pack_uint64(pk, PR_K_OUT_SEQS), msgpack_pack_array(pk, 1), msgpack_pack_map(pk, 2);
  msgpack_pack_uint64(pk, PR_K_OSEQ_ID), msgpack_pack_uint64(pk, 1);
  size_t at = b.len;
  msgpack_pack_uint64(pk, PR_K_OSEQ_FINISH), msgpack_pack_uint64(pk, PR_FINISH_ERROR + 1);
  TH_CHECK_EQ_INT(decode_buf(PR_OUT, &b), CM_ERR_RANGE);
  b.len = at;
  msgpack_pack_uint64(pk, PR_K_OSEQ_STOP_TOKEN), msgpack_pack_int64(pk, -2);
  TH_CHECK_EQ_INT(decode_buf(PR_OUT, &b), CM_ERR_RANGE);
  b.len = at;
  msgpack_pack_uint64(pk, PR_K_OSEQ_STOP_TOKEN), msgpack_pack_int64(pk, 106);
  TH_CHECK_EQ_INT(decode_buf(PR_OUT, &b), 0);

  /* READY: rank outside the world, too many groups */
  pr_buf_reset(&b);
  msgpack_pack_map(pk, 3);
  msgpack_pack_uint64(pk, PR_K_READY_RANK), msgpack_pack_uint64(pk, 2);
  msgpack_pack_uint64(pk, PR_K_READY_WORLD), msgpack_pack_uint64(pk, 2);
  msgpack_pack_uint64(pk, PR_K_READY_GROUPS), msgpack_pack_array(pk, 1), msgpack_pack_map(pk, 1);
  msgpack_pack_uint64(pk, PR_K_GRP_BLOCK_TOKENS), msgpack_pack_uint64(pk, 16);
  TH_CHECK_EQ_INT(decode_buf(PR_READY, &b), CM_ERR_RANGE);
  b.data[2] = 1; /* rank 1 */
  TH_CHECK_EQ_INT(decode_buf(PR_READY, &b), 0);
  /* the group without block_tokens: its default 0 is outside the bounds */
  b.data[b.len - 2] = PR_K_GRP_LAYERS;
  TH_CHECK_EQ_INT(decode_buf(PR_READY, &b), CM_ERR_RANGE);
  pr_buf_free(&b);
}

/* The decoder holds absent numbers to their bounds but leaves an absent
 * nested record at its defaults unchecked: those defaults must validate, in
 * every record reachable from a message. */
static void nested_defaults_validate(const struct pr_rec *rec) {
  for (uint32_t k = 0; k < rec->n_fields; k++) {
    const struct pr_field *f = &rec->fields[k];
    if (f->type == PR_FT_REC) {
      union {
        max_align_t align;
        uint8_t bytes[1024];
      } mem;
      TH_REQUIRE(f->sub->size <= sizeof(mem));
      memset(&mem, 0, sizeof(mem));
      pr_rec_defaults(f->sub, &mem);
      if (pr_rec_put(NULL, f->sub, &mem) != 0)
        th_fail(__FILE__, __LINE__, "key %u: the defaults of its record do not validate", k);
      nested_defaults_validate(f->sub);
    } else if (f->type == PR_FT_ARRAY && f->elem->type == PR_FT_REC) {
      nested_defaults_validate(f->elem->sub);
    }
  }
}

TH_TEST(nested_record_defaults_validate) {
  for (size_t t = 0; t < sizeof(all_types) / sizeof(all_types[0]); t++) {
    const struct pr_rec *rec = pr_rec_of(all_types[t]);
    TH_REQUIRE(rec != NULL);
    nested_defaults_validate(rec);
  }
  struct pr_sampling s;
  pr_sampling_default(&s);
  TH_CHECK(s.temperature == 1.0f && s.top_p == 1.0f && s.repetition_penalty == 1.0f);
  TH_CHECK(s.logprobs == -1 && s.prompt_logprobs == -1 && s.top_k == 0 && !s.has_seed);
}
