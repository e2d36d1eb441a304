/* test-proto-codec.c — the message codec: round trips of every message type
 * (typical, minimal, maximal), canonical re-encoding, msgpack-c's own reader
 * agreeing with our encoder, truncation at every offset, trailing bytes, and
 * the header frame. Hostile inputs are in test-proto-bounds.c. */
#include <math.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-arena.h"
#include "common/cm-err.h"
#include "proto/pr-msg.h"
#include "tests/harness/th.h"
#include "tests/unit/proto/pr-samples.h"

#define ARENA_CAP (4u << 20) /* bytes */

/* Sample i encoded: the message, its encoding in a fresh exact-size heap copy
 * (so that ASan sees any read past its end), and an arena to decode into. */
struct sample {
  struct pr_msg m;
  const char *name;
  uint8_t *enc;
  size_t len; /* bytes */
  struct cm_arena a;
};

/* Builds and encodes sample i into s: 0, or -1 (the failure recorded). */
static int sample_init(struct sample *s, int i) {
  struct pr_buf b;
  pr_buf_init(&b, 0);
  prs_build(i, &s->m, &s->name);
  int rc = pr_msg_encode(&s->m, &b);
  if (rc) {
    th_fail(__FILE__, __LINE__, "%s: encode failed: %s", s->name, cm_strerror(rc));
    pr_buf_free(&b);
    return -1;
  }
  s->enc = malloc(b.len);
  memcpy(s->enc, b.data, b.len);
  s->len = b.len;
  pr_buf_free(&b);
  cm_arena_init(&s->a, 4096, ARENA_CAP);
  return 0;
}

static void sample_free(struct sample *s) {
  cm_arena_free(&s->a);
  free(s->enc);
}

TH_TEST(roundtrip_every_message) {
  TH_REQUIRE(prs_count() == 51);
  for (int i = 0; i < prs_count(); i++) {
    struct sample s;
    TH_REQUIRE(sample_init(&s, i) == 0);
    struct pr_msg d, d2;
    int rc = pr_msg_decode_body(s.m.type, s.enc, s.len, &s.a, &d);
    if (rc)
      th_fail(__FILE__, __LINE__, "%s: decode: %s", s.name, cm_strerror(rc));
    else if (!pr_msg_equal(&s.m, &d))
      th_fail(__FILE__, __LINE__, "%s: round trip differs", s.name);
    /* the decoded message re-encodes to the same bytes */
    struct pr_buf b;
    pr_buf_init(&b, 0);
    if (!rc) {
      TH_CHECK_EQ_INT(pr_msg_encode(&d, &b), 0);
      TH_CHECK(b.len == s.len && memcmp(b.data, s.enc, s.len) == 0);
      TH_CHECK_EQ_INT(pr_msg_decode_body(d.type, b.data, b.len, &s.a, &d2), 0);
      TH_CHECK(pr_msg_equal(&d, &d2));
    }
    pr_buf_free(&b);
    sample_free(&s);
  }
}

TH_TEST(roundtrip_with_header_frame) {
  for (int i = 0; i < prs_count(); i++) {
    struct sample s;
    TH_REQUIRE(sample_init(&s, i) == 0);
    uint8_t hdr[PR_HDR_LEN];
    pr_msg_header(s.m.type, hdr);
    TH_CHECK_EQ_INT(hdr[0], s.m.type);
    TH_CHECK_EQ_INT(hdr[1], PR_VERSION);
    struct pr_msg d;
    TH_CHECK_EQ_INT(pr_msg_decode(hdr, sizeof(hdr), s.enc, s.len, &s.a, &d), 0);
    TH_CHECK(d.type == s.m.type);
    sample_free(&s);
  }
}

/* Our encoder's output is valid msgpack for msgpack-c's reader (used here on
 * trusted bytes only): one top-level map that consumes the whole buffer. */
TH_TEST(msgpack_c_reads_our_encoding) {
  for (int i = 0; i < prs_count(); i++) {
    struct sample s;
    TH_REQUIRE(sample_init(&s, i) == 0);
    size_t off = 0;
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    msgpack_unpack_return ret = msgpack_unpack_next(&up, (const char *)s.enc, s.len, &off);
    if (ret != MSGPACK_UNPACK_SUCCESS || off != s.len)
      th_fail(__FILE__, __LINE__, "%s: msgpack-c: ret %d, off %zu of %zu", s.name, (int)ret, off,
              s.len);
    else
      TH_CHECK(up.data.type == MSGPACK_OBJECT_MAP);
    msgpack_unpacked_destroy(&up);
    sample_free(&s);
  }
}

/* Spot checks of field encodings through msgpack-c: ADD's request id (key 0)
 * and PONG's kv usage (float64 under key 4). */
/* Unpacks sample i (named want) with msgpack-c into up: the top-level map. */
static msgpack_object_map *unpack_sample(int i, const char *want, struct sample *s,
                                         msgpack_unpacked *up) {
  TH_REQUIRE(sample_init(s, i) == 0);
  TH_CHECK_EQ_STR(s->name, want);
  size_t off = 0;
  msgpack_unpacked_init(up);
  TH_REQUIRE(msgpack_unpack_next(up, (const char *)s->enc, s->len, &off) == MSGPACK_UNPACK_SUCCESS);
  return &up->data.via.map;
}

TH_TEST(msgpack_c_sees_our_fields) {
  struct sample s;
  msgpack_unpacked up;
  msgpack_object_map *map = unpack_sample(2, "add-max", &s, &up);
  TH_CHECK_EQ_INT(map->size, 10); /* images are absent; the cache salt is key 9, then the
                                    LoRA list's sum key 10 */
  TH_CHECK(map->ptr[8].key.via.u64 == 9 && map->ptr[8].val.via.u64 == UINT64_MAX);
  TH_CHECK(map->ptr[9].key.via.u64 == 10 && map->ptr[9].val.via.u64 == UINT64_MAX);
  TH_CHECK(map->ptr[0].key.type == MSGPACK_OBJECT_POSITIVE_INTEGER);
  TH_CHECK(map->ptr[0].key.via.u64 == 0);
  TH_CHECK(map->ptr[0].val.via.u64 == UINT64_MAX);
  TH_CHECK(map->ptr[1].val.type == MSGPACK_OBJECT_ARRAY);
  TH_CHECK_EQ_INT(map->ptr[1].val.via.array.size, 300);
  msgpack_unpacked_destroy(&up);
  sample_free(&s);

  map = unpack_sample(15, "pong-typical", &s, &up);
  TH_CHECK(map->ptr[4].key.via.u64 == 4);
  TH_CHECK(map->ptr[4].val.type == MSGPACK_OBJECT_FLOAT64);
  TH_CHECK_NEAR(map->ptr[4].val.via.f64, 0.4375, 0);
  msgpack_unpacked_destroy(&up);
  sample_free(&s);
}

/* Every prefix of a valid message fails cleanly; decoding the whole message
 * afterwards still works. Large messages (over 8 KiB) are cut at every offset
 * of their first and last 2 KiB and every 31st in between. */
TH_TEST(truncation_at_every_offset_fails) {
  for (int i = 0; i < prs_count(); i++) {
    struct sample s;
    TH_REQUIRE(sample_init(&s, i) == 0);
    struct pr_msg d;
    int bad = 0;
    for (size_t cut = 0; cut < s.len; cut++) {
      if (s.len > 8192 && cut > 2048 && cut < s.len - 2048 && cut % 31) continue;
      uint8_t *pre = malloc(cut ? cut : 1);
      memcpy(pre, s.enc, cut);
      int rc = pr_msg_decode_body(s.m.type, pre, cut, &s.a, &d);
      free(pre);
      cm_arena_reset(&s.a);
      if (rc >= 0 && !bad++)
        th_fail(__FILE__, __LINE__, "%s: prefix of %zu/%zu bytes decoded", s.name, cut, s.len);
    }
    TH_CHECK_EQ_INT(pr_msg_decode_body(s.m.type, s.enc, s.len, &s.a, &d), 0);
    sample_free(&s);
  }
}

TH_TEST(trailing_bytes_fail) {
  for (int i = 0; i < prs_count(); i++) {
    struct sample s;
    TH_REQUIRE(sample_init(&s, i) == 0);
    uint8_t *more = malloc(s.len + 1);
    memcpy(more, s.enc, s.len);
    more[s.len] = 0x00;
    struct pr_msg d;
    TH_CHECK_EQ_INT(pr_msg_decode_body(s.m.type, more, s.len + 1, &s.a, &d), CM_ERR_PARSE);
    free(more);
    sample_free(&s);
  }
}

TH_TEST(header_frame_checks) {
  enum pr_type t;
  uint8_t ok[2] = {PR_STEP, PR_VERSION};
  TH_CHECK_EQ_INT(pr_msg_decode_header(ok, 2, &t), 0);
  TH_CHECK(t == PR_STEP);
  uint8_t unknown[2] = {99, PR_VERSION};
  TH_CHECK_EQ_INT(pr_msg_decode_header(unknown, 2, &t), CM_ERR_UNKNOWN);
  uint8_t zero[2] = {0, PR_VERSION};
  TH_CHECK_EQ_INT(pr_msg_decode_header(zero, 2, &t), CM_ERR_UNKNOWN);
  uint8_t version[2] = {PR_ADD, PR_VERSION + 1};
  TH_CHECK_EQ_INT(pr_msg_decode_header(version, 2, &t), CM_ERR_VERSION);
  uint8_t v0[2] = {PR_ADD, 0};
  TH_CHECK_EQ_INT(pr_msg_decode_header(v0, 2, &t), CM_ERR_VERSION);
  uint8_t three[3] = {PR_ADD, PR_VERSION, 0};
  TH_CHECK_EQ_INT(pr_msg_decode_header(three, 3, &t), CM_ERR_PARSE);
  TH_CHECK_EQ_INT(pr_msg_decode_header(three, 1, &t), CM_ERR_PARSE);
  TH_CHECK_EQ_INT(pr_msg_decode_header(three, 0, &t), CM_ERR_PARSE);
  /* every byte value: known types accepted, all others refused */
  int known = 0;
  for (int b = 0; b < 256; b++) {
    uint8_t h[2] = {(uint8_t)b, PR_VERSION};
    int rc = pr_msg_decode_header(h, 2, &t);
    TH_CHECK(rc == 0 || rc == CM_ERR_UNKNOWN);
    known += rc == 0;
    TH_CHECK(pr_type_known((unsigned)b) == (rc == 0));
  }
  TH_CHECK_EQ_INT(known, 17);
  /* decode_body refuses an unknown type too */
  struct cm_arena a;
  struct pr_msg d;
  cm_arena_init(&a, 0, 1024);
  uint8_t empty_map = 0x80;
  TH_CHECK_EQ_INT(pr_msg_decode_body((enum pr_type)77, &empty_map, 1, &a, &d), CM_ERR_UNKNOWN);
  TH_CHECK_EQ_INT(pr_msg_decode_body(PR_PING, &empty_map, 1, &a, &d), 0);
  cm_arena_free(&a);
  TH_CHECK_EQ_STR(pr_type_name(PR_RESULT), "RESULT");
  TH_CHECK_EQ_STR(pr_type_name((enum pr_type)200), "?");
}

/* The encoder refuses what a decoder would refuse. */
TH_TEST(encode_validates) {
  struct pr_buf b;
  struct pr_msg m;
  pr_buf_init(&b, 0);
  const uint32_t toks[3] = {1, 2, 3};
  const float lps[3] = {-1, -2, -3};

  pr_msg_init(&m, PR_ADD);
  m.u.add.request_id = 1;
  m.u.add.max_tokens = 4;
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), CM_ERR_INVAL); /* empty prompt */
  m.u.add.prompt = (struct pr_u32s){toks, 3};
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), 0);
  m.u.add.min_tokens = 5;
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), CM_ERR_RANGE);
  m.u.add.min_tokens = 0;
  m.u.add.sampling.top_p = 0.0f;
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), CM_ERR_RANGE);
  m.u.add.sampling.top_p = 1.0f;
  m.u.add.sampling.temperature = NAN;
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), CM_ERR_RANGE);
  m.u.add.sampling.temperature = 0.0f;
  m.u.add.sampling.logprobs = PR_MAX_TOP_LOGPROBS + 1;
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), CM_ERR_RANGE);
  m.u.add.sampling.logprobs = -1;
  /* an image's size (Gemma 4): both sides or neither, matching its pixel bytes */
  uint8_t px[2 * 3 * 3] = {0};
  struct pr_image im = {.pos = 0, .n_tokens = 1, .pixels = {px, sizeof(px)}, .width = 3};
  m.u.add.images = &im;
  m.u.add.n_images = 1;
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), CM_ERR_INVAL); /* no height */
  im.height = 3;
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), CM_ERR_INVAL); /* 27 bytes' size, 18 sent */
  im.height = 2;
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), 0);
  im.width = PR_MAX_IMAGE_SIDE + 1;
  TH_CHECK(pr_msg_encode(&m, &b) < 0);
  /* an audio clip: mels x frames f32 and a mask byte a frame, both sides sent */
  uint8_t feat[3 * (2 * 4 + 1)] = {0};
  im = (struct pr_image){
      .pos = 0, .n_tokens = 1, .pixels = {feat, sizeof(feat)}, .kind = PR_MEDIA_AUDIO};
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), CM_ERR_INVAL); /* no shape */
  im.width = 2, im.height = 3;
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), 0);
  im.pixels.n--; /* a byte short of the mask */
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), CM_ERR_INVAL);
  im.pixels.n++;
  im.width = 3; /* features of 3 bins would need 39 bytes */
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), CM_ERR_INVAL);
  im.width = 2;
  im.kind = PR_MEDIA_MAX + 1;
  TH_CHECK(pr_msg_encode(&m, &b) < 0);
  m.u.add.n_images = 0;
  m.u.add.images = NULL;
  m.u.add.stop_token_ids = (struct pr_u32s){NULL, 2};
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), CM_ERR_INVAL);

  struct pr_out_seq s = {.request_id = 1, .tokens = {toks, 3}, .stop_token = -1};
  pr_msg_init(&m, PR_OUT);
  m.u.out.seqs = &s;
  m.u.out.n_seqs = 1;
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), 0);
  s.logprobs.sampled = (struct pr_f32s){lps, 2}; /* 2 logprobs for 3 tokens */
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), CM_ERR_INVAL);
  s.logprobs.sampled.n = 3;
  s.logprobs.n_top = 1; /* top arrays missing */
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), CM_ERR_INVAL);
  s.logprobs.top_ids = (struct pr_u32s){toks, 3};
  s.logprobs.top = (struct pr_f32s){lps, 3};
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), 0);
  s.n_cached_tokens = 1; /* more cached than prompt tokens */
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), CM_ERR_RANGE);

  pr_msg_init(&m, PR_ERR);
  m.u.err.message = "bad \xff byte";
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), CM_ERR_PARSE);
  m.u.err.message = NULL; /* encoded as "" */
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), 0);

  pr_msg_init(&m, PR_READY);
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), CM_ERR_RANGE); /* world size 0 */
  pr_msg_init(&m, PR_CTRL);
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), CM_ERR_UNKNOWN); /* op 0 */
  m.type = (enum pr_type)99;
  TH_CHECK_EQ_INT(pr_msg_encode(&m, &b), CM_ERR_UNKNOWN);

  /* a buffer capped below the message size */
  struct pr_buf small;
  pr_buf_init(&small, 16);
  struct pr_msg big;
  const char *name;
  prs_build(0, &big, &name);
  TH_CHECK_EQ_INT(pr_msg_encode(&big, &small), CM_ERR_TOOBIG);
  pr_buf_free(&small);
  pr_buf_free(&b);
}

/* Step sequences carry sampling only with PR_SEQ_NEW. */
TH_TEST(step_sampling_only_when_new) {
  struct pr_step_seq s;
  memset(&s, 0, sizeof(s));
  s.seq_id = 3;
  pr_sampling_default(&s.sampling);
  s.sampling.temperature = 0.0f;
  struct pr_msg m, d;
  pr_msg_init(&m, PR_STEP);
  m.u.step.step_id = 1;
  m.u.step.seqs = &s;
  m.u.step.n_seqs = 1;
  struct pr_buf b;
  pr_buf_init(&b, 0);
  struct cm_arena a;
  cm_arena_init(&a, 0, 1 << 16);
  TH_REQUIRE(pr_msg_encode(&m, &b) == 0);
  TH_REQUIRE(pr_msg_decode_body(PR_STEP, b.data, b.len, &a, &d) == 0);
  TH_CHECK(d.u.step.seqs[0].sampling.temperature == 1.0f); /* not sent: default */
  s.flags = PR_SEQ_NEW;
  TH_REQUIRE(pr_msg_encode(&m, &b) == 0);
  TH_REQUIRE(pr_msg_decode_body(PR_STEP, b.data, b.len, &a, &d) == 0);
  TH_CHECK(d.u.step.seqs[0].sampling.temperature == 0.0f);
  TH_CHECK(pr_msg_equal(&m, &d));
  pr_buf_free(&b);
  cm_arena_free(&a);
}

/* ---- the fuzz target's seed corpus (tests/fuzz/corpus/proto/) ----
 * One file per sample: its type byte then its encoding; plus hostile inputs.
 * With LMSERVE_WRITE_CORPUS=1 in the environment the files are (re)written
 * first; either way they must match what the codec produces now. */

static const struct {
  const char *name;
  uint8_t bytes[48];
  size_t len;
} nasty[] = {
    {"nasty-five-bytes", {PR_ADD, 0xdd, 0xff, 0xff, 0xff, 0xff}, 6},
    {"nasty-prompt-array32", {PR_ADD, 0x81, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff}, 8},
    {"nasty-map32", {PR_STEP, 0xdf, 0xff, 0xff, 0xff, 0xff}, 6},
    {"nasty-str32", {PR_ERR, 0x81, 0x02, 0xdb, 0xff, 0xff, 0xff, 0xff}, 8},
    {"nasty-ext32", {PR_PING, 0x81, 0x3f, 0xc9, 0xff, 0xff, 0xff, 0xff, 0x01}, 9},
    {"nasty-deep-arrays",
     {PR_STEP, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91,
      0x91,    0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91,
      0x91,    0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x00},
     42},
    {"nasty-deep-unknown-key",
     {PR_PING, 0x81, 0x3f, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91,
      0x91,    0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x00},
     24},
    {"nasty-unknown-type", {0xc8, 0x80}, 2},
    {"nasty-duplicate-key", {PR_PING, 0x82, 0x00, 0x01, 0x00, 0x02}, 6},
    {"nasty-never-byte", {PR_BEAT, 0x81, 0x00, 0xc1}, 4},
    {"nasty-nan-kv-usage",
     {PR_PONG, 0x81, 0x04, 0xcb, 0x7f, 0xf8, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},
     12},
    {"nasty-overlong-utf8", {PR_FAIL, 0x83, 0x00, 0x00, 0x02, 0xff, 0x03, 0xa2, 0xc0, 0x80}, 10},
    {"nasty-type-only", {PR_RESULT}, 1},
};

static int corpus_file_check(const char *dir, const char *name, const uint8_t *bytes, size_t len,
                             int write) {
  char path[1024];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  if (write) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(bytes, 1, len, f) != len) {
      if (f) fclose(f);
      th_fail(__FILE__, __LINE__, "cannot write %s", path);
      return -1;
    }
    fclose(f);
  }
  FILE *f = fopen(path, "rb");
  if (!f) {
    th_fail(__FILE__, __LINE__, "corpus file %s missing (LMSERVE_WRITE_CORPUS=1 writes it)", path);
    return -1;
  }
  uint8_t *got = malloc(len + 1);
  size_t n = fread(got, 1, len + 1, f);
  fclose(f);
  int same = n == len && memcmp(got, bytes, len) == 0;
  free(got);
  if (!same) th_fail(__FILE__, __LINE__, "corpus file %s is stale", path);
  return same ? 0 : -1;
}

TH_TEST(fuzz_corpus_is_current) {
  char dir[1024];
  snprintf(dir, sizeof(dir), "%s/fuzz/corpus/proto", th_tests_dir());
  const char *w = getenv("LMSERVE_WRITE_CORPUS");
  int write = w && strcmp(w, "1") == 0;
  for (int i = 0; i < prs_count(); i++) {
    struct sample s;
    TH_REQUIRE(sample_init(&s, i) == 0);
    uint8_t *file = malloc(s.len + 1);
    file[0] = (uint8_t)s.m.type;
    memcpy(file + 1, s.enc, s.len);
    corpus_file_check(dir, s.name, file, s.len + 1, write);
    free(file);
    sample_free(&s);
  }
  struct cm_arena a;
  cm_arena_init(&a, 1024, 1u << 16);
  for (size_t i = 0; i < sizeof(nasty) / sizeof(nasty[0]); i++) {
    struct pr_msg d;
    int rc = pr_msg_decode_body((enum pr_type)nasty[i].bytes[0], nasty[i].bytes + 1,
                                nasty[i].len - 1, &a, &d);
    if (rc >= 0) th_fail(__FILE__, __LINE__, "%s decoded", nasty[i].name);
    TH_CHECK(a.peak < (64u << 10));
    cm_arena_reset(&a);
    corpus_file_check(dir, nasty[i].name, nasty[i].bytes, nasty[i].len, write);
  }
  cm_arena_free(&a);
}
