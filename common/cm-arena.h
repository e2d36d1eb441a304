/* cm-arena.h — a bump allocator with a hard cap.
 *
 * Memory comes from malloc'd chunks; cm_arena_reset() keeps the first chunk
 * for reuse, cm_arena_free() returns everything. Allocation past `cap` bytes
 * (the sum of chunk sizes) fails with NULL instead of growing: decoders of
 * untrusted bytes use the cap to bound what a message can make us allocate.
 * `peak` records the most bytes ever reserved, for tests. */
#ifndef LMSERVE_CM_ARENA_H
#define LMSERVE_CM_ARENA_H
#include <stddef.h>

struct cm_arena_chunk;

struct cm_arena {
  struct cm_arena_chunk *head; /* newest chunk first */
  size_t chunk_size;           /* bytes; default size of a new chunk */
  size_t cap;                  /* bytes; 0 = unlimited */
  size_t reserved;             /* bytes held in chunks now */
  size_t peak;                 /* bytes; max of `reserved` over the arena's life */
  size_t used;                 /* bytes handed out since the last reset */
};

void cm_arena_init(struct cm_arena *a, size_t chunk_size, size_t cap);
void cm_arena_free(struct cm_arena *a);
void cm_arena_reset(struct cm_arena *a);
/* Returns `size` bytes aligned to 16, or NULL when the cap would be passed. */
void *cm_arena_alloc(struct cm_arena *a, size_t size);
void *cm_arena_calloc(struct cm_arena *a, size_t n, size_t size);
char *cm_arena_strndup(struct cm_arena *a, const char *s, size_t n);

#endif
