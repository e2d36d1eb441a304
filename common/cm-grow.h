/* cm-grow.h — room in a heap buffer that grows by doubling: of bytes (text
 * being built, a string scratch, a pool of strings) or of items (a table). */
#ifndef LMSERVE_CM_GROW_H
#define LMSERVE_CM_GROW_H
#include <stddef.h>

/* Makes room for need bytes in *buf (*cap bytes allocated; NULL and 0 before
 * anything is): the capacity doubles, from first when nothing is allocated
 * yet, until need fits. Returns 0, or CM_ERR_NOMEM with *buf and *cap as they
 * were. */
int cm_grow(char **buf, size_t *cap, size_t need, size_t first);

/* The same for an array of items of `size` bytes each, counted in ints: arr is
 * the address of the array's pointer (of any object type; NULL before anything
 * is allocated), *cap the items allocated. Room for need items; the capacity
 * doubles from first and stops at INT_MAX. Returns 0, or CM_ERR_NOMEM with the
 * array and *cap as they were. */
int cm_grow_items(void *arr, int *cap, int need, size_t size, int first);

#endif
