/* wk-gguf-util.h — GGUF files changed for the worker unit tests: a file read
 * whole, and its image rebuilt with one metadata pair dropped, changed or
 * added and its tensors renamed, so that a test can make bad files from a
 * good one. */
#ifndef LMSERVE_WK_GGUF_UTIL_H
#define LMSERVE_WK_GGUF_UTIL_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/md-gguf.h"
#include "tests/harness/th-buf.h"
#include "tests/harness/th.h"

/* The file at path, read whole into *lenp bytes, and its open directory *g. */
static inline uint8_t *wkt_gguf_slurp(const char *path, size_t *lenp, struct md_gguf **g) {
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

/* Writes a metadata value (its type first) for a rebuilt file. */
typedef void (*wkt_gguf_put_fn)(struct th_buf *b, const void *arg);
/* A tensor's name in a rebuilt file (out[n]) for its name in the file. */
typedef void (*wkt_gguf_rename_fn)(const char *name, char *out, size_t n);

/* g's file (bytes[len]) as a new image: the pair `key` (NULL: none) dropped
 * when put is NULL, else given the value put(arg) writes (added at the end
 * when the file has none); every tensor named as rename makes it (NULL: as
 * it is), its data where it was; *data_at: where the data section starts. */
static inline struct th_buf wkt_gguf_rebuild(const struct md_gguf *g, const uint8_t *bytes,
                                             size_t len, const char *key, wkt_gguf_put_fn put,
                                             const void *arg, wkt_gguf_rename_fn rename,
                                             size_t *data_at) {
  struct th_buf b = {0};
  int nkv = md_gguf_kv_count(g), nt = md_gguf_tensor_count(g);
  int found = key && md_gguf_find_kv(g, key);
  th_buf_put(&b, "GGUF", 4);
  th_buf_u32(&b, 3);
  th_buf_u64(&b, (uint64_t)nt);
  th_buf_u64(&b, (uint64_t)(nkv - (found && !put) + (key && !found && put)));
  for (int i = 0; i < nkv; i++) {
    const struct md_gguf_kv *kv = md_gguf_kv_at(g, i);
    if (key && !strcmp(kv->key, key)) {
      if (put) {
        th_buf_str(&b, kv->key);
        put(&b, arg);
      }
      continue;
    }
    th_buf_str(&b, kv->key);
    th_buf_u32(&b, kv->type);
    if (kv->type == MD_GGUF_ARRAY) {
      th_buf_u32(&b, kv->arr_type);
      th_buf_u64(&b, kv->n);
    }
    th_buf_put(&b, kv->val, (size_t)kv->bytes);
  }
  if (key && !found && put) {
    th_buf_str(&b, key);
    put(&b, arg);
  }
  const uint8_t *data = NULL;
  for (int i = 0; i < nt; i++) {
    const struct md_gguf_tensor *t = md_gguf_tensor_at(g, i);
    char name[256];
    if (rename)
      rename(t->name, name, sizeof(name));
    else
      snprintf(name, sizeof(name), "%s", t->name);
    th_buf_str(&b, name);
    th_buf_u32(&b, (uint32_t)t->n_dims);
    for (int d = 0; d < t->n_dims; d++)
      th_buf_u64(&b, (uint64_t)t->ne[d]);
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

#endif
