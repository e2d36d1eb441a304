/* cm-huge.h — anonymous memory on 2 MiB boundaries with transparent huge
 * pages asked for (madvise; a hint, THP may be off): for memory a hot loop
 * streams through (the CPU workers' weights, the bandwidth probe), where 4 KiB
 * pages cost a page walk every 4 KiB.
 *
 *   struct cm_huge h;
 *   if (cm_huge_map(bytes, &h)) ...;   // h.base, h.len >= bytes
 *   cm_huge_unmap(&h);
 *
 * The mapping is MAP_NORESERVE: pages never touched cost nothing. */
#ifndef LMSERVE_CM_HUGE_H
#define LMSERVE_CM_HUGE_H
#include <stddef.h>

#define CM_HUGE_PAGE ((size_t)2 << 20)

struct cm_huge {
  void *map; /* the mapping, map_len bytes */
  size_t map_len;
  unsigned char *base; /* its first 2 MiB boundary */
  size_t len;          /* bytes from base: whole 2 MiB pages, at least those asked for */
};

/* Maps at least bytes; 0, or CM_ERR_NOMEM (h zeroed). */
int cm_huge_map(size_t bytes, struct cm_huge *h);
/* Unmaps h (nothing when it holds no mapping) and zeroes it. */
void cm_huge_unmap(struct cm_huge *h);

#endif
