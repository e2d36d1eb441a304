/* cm-grow.h — room in a heap buffer of bytes that grows by doubling (text
 * being built, a string scratch, a pool of strings). */
#ifndef LMSERVE_CM_GROW_H
#define LMSERVE_CM_GROW_H
#include <stddef.h>

/* Makes room for need bytes in *buf (*cap bytes allocated; NULL and 0 before
 * anything is): the capacity doubles, from first when nothing is allocated
 * yet, until need fits. Returns 0, or CM_ERR_NOMEM with *buf and *cap as they
 * were. */
int cm_grow(char **buf, size_t *cap, size_t need, size_t first);

#endif
