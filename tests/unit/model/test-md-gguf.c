/* test-md-gguf.c — the GGUF reader on images built here byte by byte: every
 * metadata type and the typed reads, string arrays walked in order, tensors
 * at aligned offsets (general.alignment too), and what it refuses: every
 * truncation of a valid file, counts no file could hold, bad value types,
 * duplicate keys and names, offsets outside the data or off the alignment,
 * rows that are not whole blocks; unknown tensor types listed without data;
 * a file's pages let go of by its tensor directory (md_st_drop_pages, and a
 * range's with md_st_drop_range), so a worker that copied the weights does
 * not also hold the mapping; the split keys of a model in parts and the
 * parts' names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "model/md-gguf.h"
#include "model/md-safetensors.h"
#include "tests/harness/th-buf.h"
#include "tests/harness/th.h"

/* A file of 2 tensors: "a" f32 [3, 2] at 0 and "b" q8_0 [64] (2 blocks) after it, with
 * metadata of every type; align: general.alignment (0: none, the default 32). */
static struct th_buf make(uint32_t align, uint32_t b_type) {
  struct th_buf b = {0};
  th_buf_put(&b, "GGUF", 4);
  th_buf_u32(&b, 3);
  th_buf_u64(&b, 2);             /* tensors */
  th_buf_u64(&b, align ? 8 : 7); /* metadata */
  th_buf_str(&b, "general.architecture");
  th_buf_u32(&b, MD_GGUF_STRING);
  th_buf_str(&b, "gemma3");
  th_buf_str(&b, "gemma3.block_count");
  th_buf_u32(&b, MD_GGUF_U32);
  th_buf_u32(&b, 26);
  th_buf_str(&b, "gemma3.attention.layer_norm_rms_epsilon");
  th_buf_u32(&b, MD_GGUF_F32);
  float eps = 1e-6f;
  uint32_t eu;
  memcpy(&eu, &eps, 4);
  th_buf_u32(&b, eu);
  th_buf_str(&b, "x.neg");
  th_buf_u32(&b, MD_GGUF_I8);
  th_buf_put(&b, "\xfe", 1); /* -2 */
  th_buf_str(&b, "x.flag");
  th_buf_u32(&b, MD_GGUF_BOOL);
  th_buf_put(&b, "\x01", 1);
  th_buf_str(&b, "tokenizer.ggml.tokens");
  th_buf_u32(&b, MD_GGUF_ARRAY);
  th_buf_u32(&b, MD_GGUF_STRING);
  th_buf_u64(&b, 3);
  th_buf_str(&b, "<pad>");
  th_buf_str(&b, "");
  th_buf_str(&b, "\xe2\x96\x81hi");
  th_buf_str(&b, "tokenizer.ggml.scores");
  th_buf_u32(&b, MD_GGUF_ARRAY);
  th_buf_u32(&b, MD_GGUF_F32);
  th_buf_u64(&b, 2);
  th_buf_u32(&b, eu);
  th_buf_u32(&b, 0);
  if (align) {
    th_buf_str(&b, "general.alignment");
    th_buf_u32(&b, MD_GGUF_U32);
    th_buf_u32(&b, align);
  }
  uint32_t al = align ? align : 32;
  th_buf_str(&b, "a");
  th_buf_u32(&b, 2);
  th_buf_u64(&b, 3);
  th_buf_u64(&b, 2);
  th_buf_u32(&b, MD_GGML_F32);
  th_buf_u64(&b, 0);
  th_buf_str(&b, "b");
  th_buf_u32(&b, 1);
  th_buf_u64(&b, 64);
  th_buf_u32(&b, b_type);
  th_buf_u64(&b, (24 + al - 1) / al * al);
  th_buf_pad(&b, al);
  for (int i = 0; i < 6; i++) {
    float v = (float)i;
    th_buf_put(&b, &v, 4);
  }
  th_buf_pad(&b, al);
  for (int i = 0; i < 68; i++)
    th_buf_put(&b, "\x11", 1);
  return b;
}

static int open_buf(const struct th_buf *b, struct md_gguf **g, char *err) {
  return md_gguf_open_mem(b->p, b->n, "t.gguf", g, err, 256);
}

TH_TEST(gguf_reads_metadata_and_tensors) {
  for (int ai = 0; ai < 2; ai++) {
    struct th_buf b = make(ai ? 64 : 0, MD_GGML_Q8_0);
    struct md_gguf *g = NULL;
    char err[256] = "";
    if (open_buf(&b, &g, err)) {
      th_fail(__FILE__, __LINE__, "%s", err);
      th_stop();
    }
    TH_CHECK_EQ_INT((int)md_gguf_version(g), 3);
    const char *s;
    size_t n;
    TH_REQUIRE(md_gguf_get_str(g, "general.architecture", &s, &n) == 0);
    TH_CHECK(n == 6 && !memcmp(s, "gemma3", 6));
    int64_t v;
    double f;
    int flag;
    TH_CHECK(md_gguf_get_int(g, "gemma3.block_count", &v) == 0 && v == 26);
    TH_CHECK(md_gguf_get_int(g, "x.neg", &v) == 0 && v == -2);
    TH_CHECK(md_gguf_get_f64(g, "gemma3.attention.layer_norm_rms_epsilon", &f) == 0 &&
             f == (double)1e-6f);
    TH_CHECK(md_gguf_get_f64(g, "gemma3.block_count", &f) == 0 && f == 26.0);
    TH_CHECK(md_gguf_get_bool(g, "x.flag", &flag) == 0 && flag == 1);
    TH_CHECK_EQ_INT(md_gguf_get_int(g, "general.architecture", &v), CM_ERR_PARSE);
    TH_CHECK_EQ_INT(md_gguf_get_int(g, "x.flag", &v), CM_ERR_PARSE);
    TH_CHECK_EQ_INT(md_gguf_get_bool(g, "x.neg", &flag), CM_ERR_PARSE);
    TH_CHECK_EQ_INT(md_gguf_get_int(g, "nope", &v), CM_ERR_NOENT);
    const struct md_gguf_kv *tok = md_gguf_find_kv(g, "tokenizer.ggml.tokens");
    TH_REQUIRE(tok && tok->type == MD_GGUF_ARRAY && tok->n == 3);
    uint64_t pos = 0;
    const char *want[] = {"<pad>", "", "\xe2\x96\x81hi"};
    for (int i = 0; i < 3; i++) {
      TH_REQUIRE(md_gguf_arr_next_str(tok, &pos, &s, &n) == 0);
      TH_CHECK(n == strlen(want[i]) && !memcmp(s, want[i], n));
    }
    TH_CHECK_EQ_INT(md_gguf_arr_next_str(tok, &pos, &s, &n), CM_ERR_NOENT);
    const struct md_gguf_kv *sc = md_gguf_find_kv(g, "tokenizer.ggml.scores");
    TH_CHECK(md_gguf_arr_f64(sc, 0, &f) == 0 && f == (double)1e-6f);
    TH_CHECK_EQ_INT(md_gguf_arr_f64(sc, 2, &f), CM_ERR_PARSE);
    TH_CHECK_EQ_INT(md_gguf_arr_int(tok, 0, &v), CM_ERR_PARSE);
    TH_CHECK_EQ_INT(md_gguf_tensor_count(g), 2);
    const struct md_gguf_tensor *a = md_gguf_find_tensor(g, "a"), *q = md_gguf_find_tensor(g, "b");
    TH_REQUIRE(a && q && !md_gguf_find_tensor(g, "c"));
    TH_CHECK(a->n_dims == 2 && a->ne[0] == 3 && a->ne[1] == 2 && a->ne[2] == 1 && a->nbytes == 24);
    TH_CHECK(((const float *)a->data)[5] == 5.0f);
    TH_CHECK(q->nbytes == 68 && ((const uint8_t *)q->data)[67] == 0x11);
    TH_CHECK((size_t)((const uint8_t *)a->data - b.p) % (ai ? 64 : 32) == 0);
    TH_CHECK(md_gguf_data_bytes(g) == 92);
    md_gguf_close(g);
    free(b.p);
  }
}

TH_TEST(gguf_refuses_every_truncation) {
  struct th_buf b = make(0, MD_GGML_Q8_0);
  for (size_t n = 0; n < b.n; n++) {
    struct md_gguf *g = NULL;
    char err[256] = "";
    int rc = md_gguf_open_mem(b.p, n, "t.gguf", &g, err, sizeof(err));
    if (rc >= 0 || !err[0]) {
      th_fail(__FILE__, __LINE__, "%zu of %zu bytes: rc %d '%s'", n, b.n, rc, err);
      md_gguf_close(g);
      break;
    }
  }
  free(b.p);
}

/* b with the 8 bytes at `at` replaced by v (or the 4 bytes, for a 32-bit field). */
static void expect(struct th_buf *b, size_t at, uint64_t v, int width, int code, const char *word) {
  uint8_t save[8];
  memcpy(save, b->p + at, 8);
  for (int i = 0; i < width; i++)
    b->p[at + i] = (uint8_t)(v >> (8 * i));
  struct md_gguf *g = NULL;
  char err[256] = "";
  int rc = md_gguf_open_mem(b->p, b->n, "t.gguf", &g, err, sizeof(err));
  TH_CHECK_EQ_INT(rc, code);
  if (!strstr(err, word)) th_fail(__FILE__, __LINE__, "'%s' does not say '%s'", err, word);
  md_gguf_close(g);
  memcpy(b->p + at, save, 8);
}

/* Where a byte string first appears in b. */
static size_t find(const struct th_buf *b, const char *s, size_t n) {
  for (size_t i = 0; i + n <= b->n; i++)
    if (!memcmp(b->p + i, s, n)) return i;
  TH_REQUIRE(0);
  return 0;
}

TH_TEST(gguf_refuses_hostile_fields) {
  struct th_buf b = make(0, MD_GGML_Q8_0);
  expect(&b, 0, 0x46554746, 4, CM_ERR_PARSE, "not a GGUF file");
  expect(&b, 4, 1, 4, CM_ERR_UNSUPPORTED, "version 1");
  expect(&b, 8, UINT64_MAX, 8, CM_ERR_RANGE, "tensors");
  expect(&b, 16, 1ull << 40, 8, CM_ERR_RANGE, "metadata");
  /* a key's length past the end */
  expect(&b, 24, 1ull << 50, 8, CM_ERR_TRUNC, "metadata entry 0");
  /* the first value's type */
  size_t t0 = 24 + 8 + strlen("general.architecture");
  expect(&b, t0, 13, 4, CM_ERR_PARSE, "value type 13");
  /* an array of arrays, an array whose count no file holds */
  size_t arr = find(&b, "tokenizer.ggml.tokens", 21) + 21;
  expect(&b, arr + 4, MD_GGUF_ARRAY, 4, CM_ERR_PARSE, "value type 9");
  expect(&b, arr + 8, 1ull << 60, 8, CM_ERR_TRUNC, "metadata entry 5");
  /* tensor "b": its dims, type and offset */
  size_t tb = find(&b, "\x01\0\0\0\0\0\0\0b", 9) + 9;
  expect(&b, tb, 5, 4, CM_ERR_SHAPE, "5 dimensions");
  expect(&b, tb + 4, 0, 8, CM_ERR_SHAPE, "dimension 0 is 0");
  expect(&b, tb + 4, 40, 8, CM_ERR_SHAPE, "whole number of q8_0 blocks");
  expect(&b, tb + 12 + 4, 8, 8, CM_ERR_PARSE, "not a multiple of the alignment");
  expect(&b, tb + 12 + 4, 1ull << 40, 8, CM_ERR_TRUNC, "outside");
  /* a duplicate tensor name, a duplicate key */
  b.p[tb - 1] = 'a';
  expect(&b, 0, 0x46554747, 4, CM_ERR_PARSE, "tensor a appears twice");
  b.p[tb - 1] = 'b';
  size_t k2 = find(&b, "x.flag", 6);
  memcpy(b.p + k2, "x.neg\x00", 6);
  b.p[k2 - 8] = 5; /* its length */
  /* the key is now "x.neg" and one byte of it runs into the type: shorter key, the
   * reader sees other bytes; only require a clean refusal here */
  struct md_gguf *g = NULL;
  char err[256] = "";
  TH_CHECK(md_gguf_open_mem(b.p, b.n, "t.gguf", &g, err, sizeof(err)) < 0 && err[0]);
  free(b.p);
}

TH_TEST(gguf_lists_unknown_types_without_data) {
  struct th_buf b = make(0, 99);
  struct md_gguf *g = NULL;
  char err[256] = "", tb[32];
  TH_REQUIRE(open_buf(&b, &g, err) == 0);
  const struct md_gguf_tensor *q = md_gguf_find_tensor(g, "b");
  TH_CHECK(q && q->type == 99 && q->nbytes == 0 && q->data == NULL);
  TH_CHECK_EQ_STR(md_ggml_type_name(99, tb, sizeof(tb)), "type 99");
  TH_CHECK_EQ_STR(md_ggml_type_name(MD_GGML_Q4_K, tb, sizeof(tb)), "q4_k");
  TH_CHECK(md_ggml_row_bytes(MD_GGML_Q4_K, 512) == 288 &&
           md_ggml_row_bytes(MD_GGML_Q4_K, 100) == 0);
  TH_CHECK(md_ggml_block_elems(MD_GGML_Q6_K) == 256 && md_ggml_block_elems(MD_GGML_BF16) == 1);
  md_gguf_close(g);
  free(b.p);
}

TH_TEST(gguf_probe_and_open_files) {
  char path[] = "/tmp/lmserve-gguf-XXXXXX";
  int fd = mkstemp(path);
  TH_REQUIRE(fd >= 0);
  struct th_buf b = make(0, MD_GGML_Q8_0);
  TH_REQUIRE(write(fd, b.p, b.n) == (ssize_t)b.n);
  close(fd);
  TH_CHECK_EQ_INT(md_gguf_probe(path), 1);
  struct md_gguf *g = NULL;
  char err[256] = "";
  TH_CHECK_EQ_INT(md_gguf_open(path, &g, err, sizeof(err)), 0);
  md_gguf_close(g);
  TH_CHECK_EQ_INT(md_gguf_probe("/nonexistent/x.gguf"), CM_ERR_NOENT);
  TH_CHECK(md_gguf_open("/nonexistent/x.gguf", &g, err, sizeof(err)) < 0 && strstr(err, "x.gguf"));
  unlink(path);
  free(b.p);
}

/* This process's resident kB of the mapping that holds p (/proc/self/smaps). */
static long rss_kb_at(const void *p) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f) return -1;
  char line[512];
  int inside = 0;
  long kb = -1;
  while (kb < 0 && fgets(line, sizeof(line), f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2)
      inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
    else if (inside && !strncmp(line, "Rss:", 4))
      kb = strtol(line + 4, NULL, 10);
  }
  fclose(f);
  return kb;
}

TH_TEST(gguf_directory_lets_go_of_the_file_pages) {
  char path[] = "/tmp/lmserve-gguf-XXXXXX";
  int fd = mkstemp(path);
  TH_REQUIRE(fd >= 0);
  struct th_buf b = make(0, MD_GGML_Q8_0);
  size_t tail = (size_t)4 << 20; /* bytes after the data: pages to hold and let go */
  TH_REQUIRE(write(fd, b.p, b.n) == (ssize_t)b.n && ftruncate(fd, (off_t)(b.n + tail)) == 0);
  close(fd);
  struct md_st *st = NULL;
  char err[256] = "";
  TH_REQUIRE(md_st_open_gguf(path, &st, err, sizeof(err)) == 0);
  size_t len = 0;
  const unsigned char *map = md_gguf_mapping(md_st_gguf(st), &len);
  TH_REQUIRE(map != NULL && len == b.n + tail);
  volatile unsigned sink = 0;
  for (size_t off = 0; off < len; off += 4096)
    sink += map[off];
  long all = rss_kb_at(map);
  TH_CHECK(all >= (long)(tail >> 10));
  /* a range: its pages go, the rest stay */
  md_st_drop_range(st, map + b.n + tail / 2, tail / 2);
  long half = rss_kb_at(map);
  TH_CHECK(half <= all - (long)(tail >> 11) + 4 && half >= (long)(tail >> 11) - 4);
  /* memory outside the mappings is never touched */
  char *heap = malloc(1 << 16);
  TH_REQUIRE(heap != NULL);
  memset(heap, 0x5a, 1 << 16);
  md_st_drop_range(st, heap, 1 << 16);
  TH_CHECK(heap[0] == 0x5a && heap[(1 << 16) - 1] == 0x5a);
  free(heap);
  md_st_drop_pages(st);
  TH_CHECK_EQ_INT(rss_kb_at(map), 0);
  /* the bytes read again after the drop are the file's */
  const struct md_tensor *t = md_st_get(st, 0);
  TH_REQUIRE(t && t->nbytes > 0);
  size_t at = (size_t)((const unsigned char *)t->data - map);
  TH_CHECK(at + t->nbytes <= b.n && memcmp(t->data, b.p + at, t->nbytes) == 0);
  md_st_close(st);
  unlink(path);
  free(b.p);
  (void)sink;
}

/* A file whose only metadata is the split keys given (-1: absent; type: the
 * values' metadata type). */
static struct th_buf split_file(int64_t no, int64_t count, uint32_t type) {
  struct th_buf b = {0};
  th_buf_put(&b, "GGUF", 4);
  th_buf_u32(&b, 3);
  th_buf_u64(&b, 0);
  th_buf_u64(&b, (uint64_t)(no >= 0) + (uint64_t)(count >= 0));
  const char *keys[2] = {"split.no", "split.count"};
  const int64_t vals[2] = {no, count};
  for (int k = 0; k < 2; k++) {
    if (vals[k] < 0) continue;
    th_buf_str(&b, keys[k]);
    th_buf_u32(&b, type);
    if (type == MD_GGUF_U16) {
      uint16_t v = (uint16_t)vals[k];
      th_buf_put(&b, &v, 2);
    } else if (type == MD_GGUF_STRING) {
      th_buf_str(&b, "1");
    } else {
      th_buf_u32(&b, (uint32_t)vals[k]);
    }
  }
  return b;
}

/* split.no / split.count as llama.cpp's gguf-split writes them (u16), or
 * absent (a file not split), and the parts' names from the first's. */
TH_TEST(gguf_split_keys_and_part_names) {
  static const struct {
    int64_t no, count;
    uint32_t type;
    int rc, want_no, want_count;
  } cases[] = {
      {-1, -1, MD_GGUF_U16, 0, 0, 1},
      {0, 3, MD_GGUF_U16, 0, 0, 3},
      {2, 3, MD_GGUF_U16, 0, 2, 3},
      {2, 3, MD_GGUF_I32, 0, 2, 3},
      {3, 3, MD_GGUF_U16, CM_ERR_PARSE, 0, 0},
      {0, 0, MD_GGUF_U16, CM_ERR_PARSE, 0, 0},
      {0, 100000, MD_GGUF_U32, CM_ERR_PARSE, 0, 0},
      {0, 2, MD_GGUF_STRING, CM_ERR_PARSE, 0, 0},
      {1, -1, MD_GGUF_U16, CM_ERR_PARSE, 0, 0},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    struct th_buf b = split_file(cases[i].no, cases[i].count, cases[i].type);
    struct md_gguf *g = NULL;
    char err[256] = "";
    TH_REQUIRE(md_gguf_open_mem(b.p, b.n, "s.gguf", &g, err, sizeof(err)) == 0);
    int no = -7, count = -7;
    TH_CHECK_EQ_INT(md_gguf_split(g, &no, &count, err, sizeof(err)), cases[i].rc);
    if (!cases[i].rc) {
      TH_CHECK_EQ_INT(no, cases[i].want_no);
      TH_CHECK_EQ_INT(count, cases[i].want_count);
    } else {
      TH_CHECK(strstr(err, "s.gguf: split.no") != NULL);
    }
    md_gguf_close(g);
    free(b.p);
  }
  char p[64];
  TH_CHECK_EQ_INT(md_gguf_split_path("d/m-00001-of-00003.gguf", 2, 3, p, sizeof(p)), 0);
  TH_CHECK(!strcmp(p, "d/m-00003-of-00003.gguf"));
  TH_CHECK_EQ_INT(md_gguf_split_path("m-00001-of-00004.gguf", 1, 3, p, sizeof(p)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(md_gguf_split_path("m-00002-of-00003.gguf", 1, 3, p, sizeof(p)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(md_gguf_split_path("m.gguf", 1, 3, p, sizeof(p)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(md_gguf_split_path("-00001-of-00003.gguf", 1, 3, p, sizeof(p)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(md_gguf_split_path("a-00001-of-00003.gguf", 1, 3, p, 8), CM_ERR_INVAL);
}
