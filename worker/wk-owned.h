/* wk-owned.h — the backend buffers one object owns (a model, a vision tower):
 * allocated one by one as weights are bound and scratch is laid out, freed
 * together with the object. */
#ifndef LMSERVE_WK_OWNED_H
#define LMSERVE_WK_OWNED_H
#include <stddef.h>

#include "kernels/kn-backend.h"

struct wk_owned {
  void **bufs; /* [n] backend buffers, room for cap */
  int n, cap;
};

/* kn_alloc(be, bytes) (a zero-byte request gets a small buffer), kept in o;
 * NULL when out of memory. */
void *wk_owned_alloc(struct wk_owned *o, struct kn_backend *be, size_t bytes);
/* Frees every buffer in o and the list itself; o is empty afterwards. */
void wk_owned_free(struct wk_owned *o, struct kn_backend *be);

/* A checkpoint tensor's element type as the kernels name it (its bytes
 * unchanged: float, FP8 and ggml's block formats). */
struct md_tensor;
enum kn_dtype wk_weight_dtype(const struct md_tensor *t);

#endif
