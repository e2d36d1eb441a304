/* th-gguf.h — GGUF files changed for tests: a file read whole, and its
 * image rebuilt with metadata pairs changed, dropped or added and tensors
 * renamed or given fewer rows, so that a test can make a bad file, or a file
 * as another converter writes it, from a good one. Header-only: a test that
 * includes it links model/ (md_gguf). */
#ifndef LMSERVE_TH_GGUF_H
#define LMSERVE_TH_GGUF_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/md-gguf.h"
#include "tests/harness/th-buf.h"
#include "tests/harness/th.h"

/* The file at path, read whole into *lenp bytes, and its open directory *g. */
static inline uint8_t *th_gguf_slurp(const char *path, size_t *lenp, struct md_gguf **g) {
  char err[512];
  FILE *f = fopen(path, "rb");
  TH_REQUIRE(f != NULL);
  fseek(f, 0, SEEK_END);
  size_t len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *bytes = malloc(len);
  TH_REQUIRE(bytes && fread(bytes, 1, len, f) == len);
  fclose(f);
  TH_REQUIRE(md_gguf_open_mem(bytes, len, path, g, err, sizeof(err)) == 0);
  *lenp = len;
  return bytes;
}

/* What a rebuild changes; NULL members change nothing. */
struct th_gguf_edit {
  /* pair kv: 0 kept, -1 dropped, 1 written anew by the callback into b (its
   * value only, type first: the key is written) */
  int (*kv)(const struct md_gguf_kv *kv, struct th_buf *b, void *arg);
  /* pairs added at the end: n_add of them, each written whole (key, type,
   * value) by add(i) */
  int n_add;
  void (*add)(int i, struct th_buf *b, void *arg);
  /* tensor t's name (out[n], its own on entry) and dimensions (ne[t->n_dims],
   * its own on entry: fewer rows keep the data's first ones) */
  void (*tensor)(const struct md_gguf_tensor *t, char *name, size_t n, uint64_t *ne, void *arg);
  void *arg;
};

/* One pair changed: `key` (NULL: none) dropped (drop), or given the value
 * put(val) writes (type first), added at the end when the file has none:
 * th_gguf_pair_edit makes the edit. */
struct th_gguf_pair {
  const char *key;
  int drop;
  void (*put)(struct th_buf *b, const void *val);
  const void *val;
};

static inline int th_gguf_pair_kv(const struct md_gguf_kv *kv, struct th_buf *b, void *arg) {
  const struct th_gguf_pair *p = arg;
  if (!p->key || strcmp(kv->key, p->key)) return 0;
  if (p->drop) return -1;
  p->put(b, p->val);
  return 1;
}

static inline void th_gguf_pair_add(int i, struct th_buf *b, void *arg) {
  const struct th_gguf_pair *p = arg;
  th_buf_str(b, p->key);
  p->put(b, p->val);
}

/* The edit of pair change p to g's file. */
static inline struct th_gguf_edit th_gguf_pair_edit(const struct md_gguf *g,
                                                    const struct th_gguf_pair *p) {
  return (struct th_gguf_edit){.kv = th_gguf_pair_kv,
                               .n_add = p->key && !p->drop && !md_gguf_find_kv(g, p->key),
                               .add = th_gguf_pair_add,
                               .arg = (void *)p};
}

/* Writes a string array of g's pair kv with its first n elements (type, then
 * the array), for an edit's kv callback. */
static inline void th_gguf_put_strs(struct th_buf *b, const struct md_gguf_kv *kv, uint64_t n) {
  th_buf_u32(b, MD_GGUF_ARRAY);
  th_buf_u32(b, MD_GGUF_STRING);
  th_buf_u64(b, n);
  uint64_t pos = 0;
  const char *s;
  size_t len;
  for (uint64_t i = 0; i < n && md_gguf_arr_next_str(kv, &pos, &s, &len) == 0; i++) {
    th_buf_u64(b, len);
    th_buf_put(b, s, len);
  }
}

/* g's file (bytes[len]) as a new image with edit e; every tensor's data
 * where it was; *data_at: where the data section starts. */
static inline struct th_buf th_gguf_rebuild(const struct md_gguf *g, const uint8_t *bytes,
                                            size_t len, const struct th_gguf_edit *e,
                                            size_t *data_at) {
  struct th_buf b = {0}, kvs = {0};
  int nkv = md_gguf_kv_count(g), nt = md_gguf_tensor_count(g), out_kv = 0;
  for (int i = 0; i < nkv; i++) {
    const struct md_gguf_kv *kv = md_gguf_kv_at(g, i);
    struct th_buf v = {0};
    int what = e->kv ? e->kv(kv, &v, e->arg) : 0;
    if (what < 0) {
      free(v.p);
      continue;
    }
    out_kv++;
    th_buf_str(&kvs, kv->key);
    if (what > 0) {
      th_buf_put(&kvs, v.p, v.n);
    } else {
      th_buf_u32(&kvs, kv->type);
      if (kv->type == MD_GGUF_ARRAY) {
        th_buf_u32(&kvs, kv->arr_type);
        th_buf_u64(&kvs, kv->n);
      }
      th_buf_put(&kvs, kv->val, (size_t)kv->bytes);
    }
    free(v.p);
  }
  for (int i = 0; i < e->n_add; i++, out_kv++)
    e->add(i, &kvs, e->arg);
  th_buf_put(&b, "GGUF", 4);
  th_buf_u32(&b, 3);
  th_buf_u64(&b, (uint64_t)nt);
  th_buf_u64(&b, (uint64_t)out_kv);
  th_buf_put(&b, kvs.p, kvs.n);
  free(kvs.p);
  const uint8_t *data = NULL;
  for (int i = 0; i < nt; i++) {
    const struct md_gguf_tensor *t = md_gguf_tensor_at(g, i);
    char name[256];
    uint64_t ne[8];
    snprintf(name, sizeof(name), "%s", t->name);
    for (int d = 0; d < t->n_dims && d < 8; d++)
      ne[d] = (uint64_t)t->ne[d];
    if (e->tensor) e->tensor(t, name, sizeof(name), ne, e->arg);
    th_buf_str(&b, name);
    th_buf_u32(&b, (uint32_t)t->n_dims);
    for (int d = 0; d < t->n_dims; d++)
      th_buf_u64(&b, ne[d]);
    th_buf_u32(&b, t->type);
    th_buf_u64(&b, t->offset);
    if (!t->offset) data = t->data;
  }
  TH_REQUIRE(data != NULL);
  while (b.n % 32)
    th_buf_put(&b, "", 1);
  *data_at = b.n;
  th_buf_put(&b, data, len - (size_t)(data - bytes));
  return b;
}

/* ---- a vocabulary cut as llama.cpp's converter cuts Gemma 3's ---------------- */

struct th_gguf_cut {
  uint64_t n; /* tokens kept */
};

static inline int th_gguf_cut_kv(const struct md_gguf_kv *kv, struct th_buf *b, void *arg) {
  uint64_t n = ((const struct th_gguf_cut *)arg)->n;
  if (kv->type != MD_GGUF_ARRAY || kv->n <= n || strncmp(kv->key, "tokenizer.ggml.", 15)) return 0;
  if (kv->arr_type == MD_GGUF_STRING) {
    th_gguf_put_strs(b, kv, n);
    return 1;
  }
  if (kv->bytes % kv->n) return 0; /* not fixed-size elements */
  th_buf_u32(b, MD_GGUF_ARRAY);
  th_buf_u32(b, kv->arr_type);
  th_buf_u64(b, n);
  th_buf_put(b, kv->val, (size_t)(kv->bytes / kv->n * n));
  return 1;
}

static inline void th_gguf_cut_rows(const struct md_gguf_tensor *t, char *name, size_t len,
                                    uint64_t *ne, void *arg) {
  uint64_t n = ((const struct th_gguf_cut *)arg)->n;
  if ((!strcmp(t->name, "token_embd.weight") || !strcmp(t->name, "output.weight")) && ne[1] > n)
    ne[1] = n;
}

/* The GGUF file in as out, its vocabulary (the tokenizer.ggml.* arrays) and
 * its embedding and output rows cut to the first n: Gemma 3's file as
 * llama.cpp's converter writes it, whose token_embd holds tokenizer.model's
 * 262144 pieces and not the checkpoint's 262208 rows. */
static inline void th_gguf_cut_vocab(const char *in, const char *out, uint64_t n) {
  struct md_gguf *g = NULL;
  size_t len, base;
  uint8_t *bytes = th_gguf_slurp(in, &len, &g);
  struct th_gguf_cut cut = {n};
  struct th_gguf_edit e = {.kv = th_gguf_cut_kv, .tensor = th_gguf_cut_rows, .arg = &cut};
  struct th_buf b = th_gguf_rebuild(g, bytes, len, &e, &base);
  FILE *f = fopen(out, "wb");
  TH_REQUIRE(f != NULL && fwrite(b.p, 1, b.n, f) == b.n && fclose(f) == 0);
  md_gguf_close(g);
  free(b.p);
  free(bytes);
}

#endif
