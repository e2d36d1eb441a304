/* fuzz-gguf.c — fuzz target for model/'s GGUF reader. The reader must return
 * 0 or a negative cm_err with a message; what it yields must lie inside the
 * input: every metadata value's bytes, every string of an array, every known
 * tensor's bytes. Any other outcome aborts (a finding). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "model/md-gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void inside(const uint8_t *base, size_t size, const void *p, uint64_t n) {
  const uint8_t *q = p;
  if (q < base || q > base + size || n > (uint64_t)(base + size - q)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct md_gguf *g = NULL;
  char err[256] = "";
  int rc = md_gguf_open_mem(data, size, "fuzz.gguf", &g, err, sizeof(err));
  if (rc > 0 || (rc < 0 && (rc <= CM_ERR__LAST || !err[0]))) abort();
  if (rc) return 0;
  for (int i = 0; i < md_gguf_kv_count(g); i++) {
    const struct md_gguf_kv *kv = md_gguf_kv_at(g, i);
    inside(data, size, kv->val, kv->bytes);
    if (md_gguf_find_kv(g, kv->key) != kv) abort();
    if (kv->type == MD_GGUF_ARRAY && kv->arr_type == MD_GGUF_STRING) {
      uint64_t pos = 0, n = 0;
      const char *s;
      size_t len;
      while (md_gguf_arr_next_str(kv, &pos, &s, &len) == 0) {
        inside(data, size, s, len);
        n++;
      }
      if (n != kv->n) abort();
    }
  }
  for (int i = 0; i < md_gguf_tensor_count(g); i++) {
    const struct md_gguf_tensor *t = md_gguf_tensor_at(g, i);
    if (t->nbytes) inside(data, size, t->data, t->nbytes);
    if (md_gguf_find_tensor(g, t->name) != t) abort();
  }
  md_gguf_close(g);
  return 0;
}
