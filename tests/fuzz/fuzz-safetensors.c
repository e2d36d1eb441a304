/* fuzz-safetensors.c — fuzz target for model/'s untrusted-file parsers.
 *
 * Input: byte 0 selects the parser (even: a safetensors image, odd:
 * config.json text), the rest is the file. The parser must return 0 or a
 * negative cm_err code with a message; whatever a safetensors image yields
 * must lie inside the input and match its shape and dtype. Any other outcome
 * aborts (a finding). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "model/md-config.h"
#include "model/md-safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const uint8_t *body = data + 1;
  size_t n = size - 1;
  char err[256] = "";
  if (data[0] % 2 == 0) {
    struct md_st *st = NULL;
    int rc = md_st_open_mem(body, n, "fuzz.safetensors", &st, err, sizeof(err));
    if (rc > 0 || (rc < 0 && (rc <= CM_ERR__LAST || !err[0]))) abort();
    if (rc == 0) {
      for (int i = 0; i < md_st_count(st); i++) {
        const struct md_tensor *t = md_st_get(st, i);
        size_t esz = md_st_dtype_size(t->dtype);
        uint64_t count = 1;
        for (int d = 0; d < t->ndim; d++)
          count *= (uint64_t)t->shape[d];
        if (esz && count * esz != t->nbytes) abort();
        if (t->nbytes) {
          const uint8_t *p = t->data;
          /* either inside the input or an aligned copy; read both ends */
          volatile uint8_t x = p[0] ^ p[t->nbytes - 1];
          (void)x;
        }
        if (md_st_find(st, t->name) != t) abort();
      }
      md_st_close(st);
    }
  } else {
    struct md_config *c = malloc(sizeof(*c));
    if (!c) return 0;
    int rc = md_config_parse((const char *)body, n, c, err, sizeof(err));
    if (rc > 0 || (rc < 0 && !err[0])) abort();
    if (rc == 0)
      for (int i = 0; i < c->n_layers; i++) {
        const struct md_layer_cfg *l = &c->layers[i];
        if (l->head_dim < 2 || l->head_dim > 512 || l->n_kv_heads < 1 ||
            c->n_heads % l->n_kv_heads || l->kv_source >= c->n_layers)
          abort();
      }
    free(c);
  }
  return 0;
}
