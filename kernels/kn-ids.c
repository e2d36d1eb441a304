/* kn-ids.c — ids that stay on the backend (kn-backend.h): what the latest
 * sampling call kept, a step's ids with some rows taken from backend memory,
 * and the embedding of ids in backend memory. A backend of host memory (the
 * CPU) has no ops of its own for them: its backend memory is the host's, so
 * they are done here, the embedding through the backend's own kn_embed op. */
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-log.h"
#include "kernels/kn-backend-impl.h"

void kn__keep_ids(struct kn_backend *be, int rc, const int32_t *ids, size_t stride, int T) {
  be->n_kept = !rc && T > 0 && T <= KN_KEPT_IDS_MAX ? T : 0;
  if (!be->kept) return; /* a device: its ops kept them where they ran */
  for (int t = 0; t < be->n_kept; t++)
    be->kept[t] = *(const int32_t *)(const void *)((const char *)ids + (size_t)t * stride);
}

int kn_kept_ids(struct kn_backend *be, const int32_t **ids) {
  if (!be || !ids) return CM_ERR_INVAL;
  *ids = be->ops->kept_ids ? be->ops->kept_ids(be->ctx) : be->kept;
  return be->n_kept;
}

int kn_ids_take(struct kn_backend *be, int32_t *dst, const int32_t *ids, const int32_t *src,
                int n_src, const int32_t *map, int T) {
  if (!be || T < 0 || n_src < 0) return CM_ERR_INVAL;
  if (T == 0) return 0;
  if (!dst || !ids || !map) return CM_ERR_INVAL;
  for (int t = 0; t < T; t++)
    if (map[t] >= n_src || (map[t] >= 0 && !src)) {
      cm_debug("kn", "ids_take: row %d takes id %d of %d", t, (int)map[t], n_src);
      return CM_ERR_RANGE;
    }
  if (be->ops->kept_ids) return KN_CALL(ids_take, dst, ids, src, map, T);
  for (int t = 0; t < T; t++) /* host memory */
    dst[t] = map[t] < 0 ? ids[t] : src[map[t]];
  return 0;
}

#define KN_EMBED_CHUNK 256 /* ids checked on the host per kn_embed op call */

int kn_embed_dev(struct kn_backend *be, float *out, ptrdiff_t ldo, const void *table,
                 enum kn_dtype tdt, int vocab, int H, const int32_t *ids, int T, float scale) {
  if (!be || T < 0 || H < 0 || vocab < 0) return CM_ERR_INVAL;
  if (T == 0 || H == 0) return 0;
  if (!out || !table || !ids || !kn__valid_ld(ldo, T, H)) return CM_ERR_INVAL;
  int rc = kn__check_matmul_dtype(be, tdt, H);
  if (rc) return rc;
  if (be->ops->kept_ids) return KN_CALL(embed_dev, out, ldo, table, tdt, vocab, H, ids, T, scale);
  int32_t local[KN_EMBED_CHUNK]; /* the ids as kn_embed's op takes them: -1 for a zero row */
  for (int t0 = 0; t0 < T && !rc; t0 += KN_EMBED_CHUNK) {
    int n = T - t0 < KN_EMBED_CHUNK ? T - t0 : KN_EMBED_CHUNK;
    for (int j = 0; j < n; j++)
      local[j] = ids[t0 + j] >= 0 && ids[t0 + j] < vocab ? ids[t0 + j] : -1;
    rc = kn__embed_rows(be, out + (ptrdiff_t)t0 * ldo, ldo, table, tdt, vocab, H, local, n, scale);
  }
  return rc;
}
