/* cm-arena.c — bump allocator with a cap (see cm-arena.h). */
#include "common/cm-arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct cm_arena_chunk {
  struct cm_arena_chunk *next;
  size_t size; /* bytes of data[] */
  size_t off;  /* bytes used */
  _Alignas(16) unsigned char data[];
};

void cm_arena_init(struct cm_arena *a, size_t chunk_size, size_t cap) {
  memset(a, 0, sizeof(*a));
  a->chunk_size = chunk_size ? chunk_size : 4096;
  a->cap = cap;
}

void cm_arena_free(struct cm_arena *a) {
  struct cm_arena_chunk *c = a->head;
  while (c) {
    struct cm_arena_chunk *n = c->next;
    free(c);
    c = n;
  }
  a->head = NULL;
  a->reserved = 0;
  a->used = 0;
}

void cm_arena_reset(struct cm_arena *a) {
  struct cm_arena_chunk *c = a->head;
  if (!c) return;
  /* keep the oldest chunk (usually the default-sized one) */
  while (c->next) {
    struct cm_arena_chunk *n = c->next;
    a->reserved -= c->size;
    free(c);
    c = n;
  }
  c->off = 0;
  a->head = c;
  a->used = 0;
}

void *cm_arena_alloc(struct cm_arena *a, size_t size) {
  size_t need = (size + 15u) & ~(size_t)15u;
  if (need < size) return NULL; /* overflow */
  struct cm_arena_chunk *c = a->head;
  if (!c || c->size - c->off < need) {
    size_t csize = need > a->chunk_size ? need : a->chunk_size;
    if (a->cap && (csize > a->cap || a->reserved > a->cap - csize)) {
      /* try a chunk of exactly what is needed before giving up */
      csize = need;
      if (csize > a->cap || a->reserved > a->cap - csize) return NULL;
    }
    if (csize > SIZE_MAX - sizeof(*c)) return NULL;
    struct cm_arena_chunk *n = malloc(sizeof(*n) + csize);
    if (!n) return NULL;
    n->size = csize;
    n->off = 0;
    n->next = c;
    a->head = n;
    a->reserved += csize;
    if (a->reserved > a->peak) a->peak = a->reserved;
    c = n;
  }
  void *p = c->data + c->off;
  c->off += need;
  a->used += need;
  return p;
}

void *cm_arena_calloc(struct cm_arena *a, size_t n, size_t size) {
  if (size && n > SIZE_MAX / size) return NULL;
  void *p = cm_arena_alloc(a, n * size);
  if (p) memset(p, 0, n * size);
  return p;
}

char *cm_arena_strndup(struct cm_arena *a, const char *s, size_t n) {
  char *p = cm_arena_alloc(a, n + 1);
  if (!p) return NULL;
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}
