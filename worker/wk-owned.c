/* wk-owned.c — a list of owned backend buffers (see wk-owned.h). */
#include "worker/wk-owned.h"

#include <stdlib.h>

void *wk_owned_alloc(struct wk_owned *o, struct kn_backend *be, size_t bytes) {
  if (o->n == o->cap) {
    int nc = o->cap ? o->cap * 2 : 64;
    void **nb = realloc(o->bufs, sizeof(*nb) * (size_t)nc);
    if (!nb) return NULL;
    o->bufs = nb;
    o->cap = nc;
  }
  void *p = kn_alloc(be, bytes ? bytes : 64);
  if (p) o->bufs[o->n++] = p;
  return p;
}

void wk_owned_free(struct wk_owned *o, struct kn_backend *be) {
  for (int i = 0; i < o->n; i++)
    kn_free(be, o->bufs[i]);
  free(o->bufs);
  *o = (struct wk_owned){0};
}
