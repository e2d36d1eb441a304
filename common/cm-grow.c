/* cm-grow.c — growing byte buffers (see cm-grow.h). */
#include "common/cm-grow.h"

#include <stdint.h>
#include <stdlib.h>

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
