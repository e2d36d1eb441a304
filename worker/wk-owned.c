/* wk-owned.c — a list of owned backend buffers (see wk-owned.h). */
#include "worker/wk-owned.h"

#include <stdlib.h>

#include "common/cm-grow.h"

void *wk_owned_alloc(struct wk_owned *o, struct kn_backend *be, size_t bytes) {
  if (cm_grow_items(&o->bufs, &o->cap, o->n + 1, sizeof(*o->bufs), 64)) return NULL;
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
