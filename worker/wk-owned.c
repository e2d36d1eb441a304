/* wk-owned.c — a list of owned backend buffers (see wk-owned.h). */
#include "worker/wk-owned.h"

#include <stdlib.h>

#include "common/cm-grow.h"
#include "model/md-safetensors.h"

void *wk_owned_alloc(struct wk_owned *o, struct kn_backend *be, size_t bytes) {
  if (cm_grow_items(&o->bufs, &o->cap, o->n + 1, sizeof(*o->bufs), 64)) return NULL;
  void *p = kn_alloc(be, bytes ? bytes : 64);
  if (p) o->bufs[o->n++] = p;
  return p;
}

enum kn_dtype wk_weight_dtype(const struct md_tensor *t) {
  if (t->dtype >= MD_ST_Q3_K) return (enum kn_dtype)(KN_DTYPE_Q3_K + (t->dtype - MD_ST_Q3_K));
  if (t->dtype >= MD_ST_Q8_0) return (enum kn_dtype)(KN_DTYPE_Q8_0 + (t->dtype - MD_ST_Q8_0));
  return t->dtype == MD_ST_F8E4M3 ? KN_DTYPE_F8E4M3 : (enum kn_dtype)t->dtype;
}

void wk_owned_free(struct wk_owned *o, struct kn_backend *be) {
  for (int i = 0; i < o->n; i++)
    kn_free(be, o->bufs[i]);
  free(o->bufs);
  *o = (struct wk_owned){0};
}
