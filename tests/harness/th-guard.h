/* th-guard.h — inputs that end right at a page that faults when read
 * (PROT_NONE), for parser tests: reading one byte past the input crashes
 * the test instead of passing unseen (picohttpparser's habit). */
#ifndef LMSERVE_TH_GUARD_H
#define LMSERVE_TH_GUARD_H
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct th_guarded {
  char *map;
  size_t map_len;
  char *data; /* the copy: its last byte is the last before the guard page */
};

/* A copy of s[0..n) that ends exactly at a guard page; th_unguard frees it. */
static inline struct th_guarded th_guard(const char *s, size_t n) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  size_t pages = (n + pg - 1) / pg + 1;
  struct th_guarded g;
  g.map_len = pages * pg;
  g.map = mmap(NULL, g.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (g.map == MAP_FAILED) abort();
  if (mprotect(g.map + (pages - 1) * pg, pg, PROT_NONE) != 0) abort();
  g.data = g.map + (pages - 1) * pg - n;
  memcpy(g.data, s, n);
  return g;
}

static inline void th_unguard(struct th_guarded *g) {
  munmap(g->map, g->map_len);
}

#endif
