/* cm-huge.c — see cm-huge.h. */
#include "common/cm-huge.h"

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "common/cm-err.h"

int cm_huge_map(size_t bytes, struct cm_huge *h) {
  memset(h, 0, sizeof(*h));
  if (bytes > SIZE_MAX - 2 * CM_HUGE_PAGE) return CM_ERR_NOMEM;
  size_t len = (bytes + CM_HUGE_PAGE - 1) & ~(CM_HUGE_PAGE - 1);
  size_t map_len = len + CM_HUGE_PAGE; /* room to start on a boundary */
  void *map = mmap(NULL, map_len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (map == MAP_FAILED) return CM_ERR_NOMEM;
  h->map = map;
  h->map_len = map_len;
  h->base = (unsigned char *)(((uintptr_t)map + CM_HUGE_PAGE - 1) & ~(uintptr_t)(CM_HUGE_PAGE - 1));
  h->len = len;
  (void)madvise(h->base, len, MADV_HUGEPAGE); /* a hint: THP may be off */
  return 0;
}

void cm_huge_unmap(struct cm_huge *h) {
  if (h->map) munmap(h->map, h->map_len);
  memset(h, 0, sizeof(*h));
}
