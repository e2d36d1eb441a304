/* cm-grow.c — growing byte buffers (see cm-grow.h). */
#include "common/cm-grow.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"

int cm_grow(char **buf, size_t *cap, size_t need, size_t first) {
  if (need <= *cap) return 0;
  size_t nc = *cap ? *cap : first ? first : 1;
  while (nc < need)
    nc = nc > SIZE_MAX / 2 ? need : nc * 2;
  char *p = realloc(*buf, nc);
  if (!p) return CM_ERR_NOMEM;
  *buf = p;
  *cap = nc;
  return 0;
}

int cm_grow_items(void *arr, int *cap, int need, size_t size, int first) {
  if (need <= *cap) return 0;
  size_t nc = *cap > 0 ? (size_t)*cap : first > 0 ? (size_t)first : 1;
  while (nc < (size_t)need)
    nc *= 2;
  if (nc > INT_MAX) nc = INT_MAX;
  if (nc > SIZE_MAX / size) return CM_ERR_NOMEM;
  void *old; /* the caller's pointer, copied: it may be of any object type */
  memcpy(&old, arr, sizeof(old));
  void *p = realloc(old, nc * size);
  if (!p) return CM_ERR_NOMEM;
  memcpy(arr, &p, sizeof(p));
  *cap = (int)nc;
  return 0;
}
