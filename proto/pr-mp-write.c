/* pr-mp-write.c — struct pr_buf, the growable buffer behind msgpack-c's
 * packer (see pr-mp.h), and pr_pack_numbers, the one thing the packer lacks:
 * whole arrays of numbers without a callback per element.
 *
 * The buffer grows by doubling up to `max` bytes and is reused across
 * messages; the first failed write (CM_ERR_TOOBIG past `max`, CM_ERR_NOMEM)
 * sticks in `err` and turns later writes into no-ops until pr_buf_reset. */
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "proto/pr-mp.h"

void pr_buf_init(struct pr_buf *b, size_t max) {
  memset(b, 0, sizeof(*b));
  b->max = max ? max : PR_MAX_MSG_DEFAULT;
}

void pr_buf_reset(struct pr_buf *b) {
  b->len = 0;
  b->err = 0;
}

void pr_buf_free(struct pr_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
  b->err = 0;
}

int pr_buf_grow(struct pr_buf *b, size_t n) {
  if (b->err) return b->err;
  if (n > b->max || b->len > b->max - n) return b->err = CM_ERR_TOOBIG;
  if (b->len + n <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 256;
  if (cap > b->max) cap = b->max; /* cap <= max: room within cap is room within max */
  while (cap < b->len + n)
    cap = cap > b->max / 2 ? b->max : cap * 2;
  uint8_t *d = realloc(b->data, cap);
  if (!d) return b->err = CM_ERR_NOMEM;
  b->data = d;
  b->cap = cap;
  return 0;
}

/* The packer's callback for a chunk: appends at a cursor with room known to
 * be there. Seen at the call site, it compiles to a plain store per value. */
static int cursor_write(void *data, const char *p, size_t n) {
  uint8_t **cur = data;
  memcpy(*cur, p, n);
  *cur += n;
  return 0;
}

#define CHUNK 256 /* values packed between two checks of the buffer's room */

/* v[i .. end) through the cursor packer */
#define PACK_EACH(T, pack)                                                                         \
  for (uint32_t j = i; j < end; j++)                                                               \
  pack(&pk, ((const T *)v)[j])

void pr_pack_numbers(struct pr_buf *b, enum pr_num kind, const void *v, uint32_t n) {
  const size_t worst = kind == PR_NUM_U64 ? 9 : 5; /* bytes of one packed value */
  uint8_t tmp[CHUNK * 9], *cur;
  msgpack_packer pk;
  msgpack_packer_init(&pk, b, pr_buf_write);
  if (kind == PR_NUM_U8) {
    msgpack_pack_bin(&pk, n);
    msgpack_pack_bin_body(&pk, v, n);
    return;
  }
  msgpack_pack_array(&pk, n);
  msgpack_packer_init(&pk, &cur, cursor_write);
  for (uint32_t i = 0; i < n; i += CHUNK) {
    uint32_t end = n - i < CHUNK ? n : i + CHUNK;
    /* straight into the buffer when the worst case fits, else by the stack */
    int direct = !b->err && b->cap - b->len >= (end - i) * worst;
    uint8_t *start = direct ? b->data + b->len : tmp;
    cur = start;
    switch (kind) {
    case PR_NUM_U32: PACK_EACH(uint32_t, msgpack_pack_uint32); break;
    case PR_NUM_U64: PACK_EACH(uint64_t, msgpack_pack_uint64); break;
    case PR_NUM_I32: PACK_EACH(int32_t, msgpack_pack_int32); break;
    case PR_NUM_F32: PACK_EACH(float, msgpack_pack_float); break;
    case PR_NUM_U8: break; /* written above */
    }
    if (direct)
      b->len += (size_t)(cur - start);
    else
      pr_buf_write(b, (const char *)tmp, (size_t)(cur - tmp));
  }
}
