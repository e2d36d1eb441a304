/* wk-shard.c — a model's per-rank shapes under tensor parallelism (see wk-shard.h). */
#include "worker/wk-shard.h"

#include <stdio.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"

/* The KV heads rank r holds of a layer with kvh KV heads and nh query heads. */
static int kv_split(int nh, int kvh, int rank, int world, int *head0, int *n) {
  if (kvh >= world) {
    if (kvh % world) return -1;
    *n = kvh / world;
    *head0 = rank * *n;
    return 0;
  }
  if (world % kvh) return -1;
  /* each rank's query heads [rank * nh/world, ...) lie within one KV head's group of
   * nh/kvh query heads, since nh/world divides nh/kvh */
  *n = 1;
  *head0 = rank * (nh / world) / (nh / kvh);
  return 0;
}

/* The columns [*off, *off + *n) rank r holds of an MLP's intermediate width F: an even
 * share, or where that would cut a unit, whole units with the first (F / unit) % world
 * ranks one more. *unit becomes the width the cut follows (1 for the even share).
 * -1 where neither is possible. */
static int ffn_split(int F, int *unit, int rank, int world, int *off, int *n) {
  int u = *unit;
  if (F % world == 0 && F / world % u == 0) {
    *n = F / world;
    *off = rank * *n;
    *unit = 1;
    return 0;
  }
  if (u == 1 || F % u || F / u < world) return -1;
  int units = F / u, base = units / world, extra = units % world;
  *n = (base + (rank < extra)) * u;
  *off = (rank * base + CM_MIN(rank, extra)) * u;
  return 0;
}

/* The sentence's end that names the unit a cut failed to fall on ("" for 1). */
static const char *in_blocks(char *buf, size_t n, int unit) {
  buf[0] = 0;
  if (unit > 1) snprintf(buf, n, " in whole blocks of %d (its down_proj's format)", unit);
  return buf;
}

int wk_config_shard(const struct md_config *full, int rank, int world,
                    const struct wk_shard_units *units, struct md_config *local,
                    struct wk_shard_plan *plan, char *err, size_t errlen) {
  if (world < 1 || world > WK_MAX_TP)
    return cm_fail(err, errlen, CM_ERR_INVAL, "tensor-parallel size %d: must be 1..%d", world,
                   WK_MAX_TP);
  if (rank < 0 || rank >= world)
    return cm_fail(err, errlen, CM_ERR_INVAL, "rank %d outside the tensor-parallel group of %d",
                   rank, world);
  *local = *full;
  *plan = (struct wk_shard_plan){.rank = rank, .world = world, .vocab_n = full->vocab};
  if (world == 1) return 0;
  const struct md_config *c = full;
  const char *what = c->model_type;
  if (c->n_heads % world)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "%s: num_attention_heads = %d cannot be split over a tensor-parallel size of "
                   "%d",
                   what, c->n_heads, world);
  if (c->vocab % world)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "%s: vocab_size = %d cannot be split over a tensor-parallel size of %d (the "
                   "embedding and head are vocab-parallel)",
                   what, c->vocab, world);
  char blocks[96];
  int moe_unit = units && units->moe > 1 ? units->moe : 1;
  plan->units.moe = moe_unit;
  if (c->moe && ffn_split(c->moe_ffn, &plan->units.moe, rank, world, &plan->moe0, &local->moe_ffn))
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "%s: moe_intermediate_size = %d cannot be split over a tensor-parallel size of "
                   "%d%s",
                   what, c->moe_ffn, world, in_blocks(blocks, sizeof blocks, moe_unit));
  local->n_heads = c->n_heads / world;
  plan->q_head0 = rank * local->n_heads;
  plan->vocab_n = c->vocab / world;
  plan->vocab0 = rank * plan->vocab_n;
  for (int i = 0; i < c->n_layers; i++) {
    const struct md_layer_cfg *l = &c->layers[i];
    int n = 0, h0 = 0;
    if (kv_split(c->n_heads, l->n_kv_heads, rank, world, &h0, &n))
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "%s: layer %d has %d key/value heads: a tensor-parallel size of %d must "
                     "divide them or be a multiple of them",
                     what, i, l->n_kv_heads, world);
    int unit = units && units->ffn[i] > 1 ? units->ffn[i] : 1;
    plan->units.ffn[i] = unit;
    if (ffn_split(l->ffn_dim, &plan->units.ffn[i], rank, world, &plan->ffn0[i],
                  &local->layers[i].ffn_dim))
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "%s: layer %d: intermediate_size = %d cannot be split over a "
                     "tensor-parallel size of %d%s",
                     what, i, l->ffn_dim, world, in_blocks(blocks, sizeof blocks, unit));
    local->layers[i].n_kv_heads = n;
    plan->kv_head0[i] = h0;
  }
  /* the summary fields follow layer 0's sliding / full layers */
  local->ffn = c->ffn == c->layers[0].ffn_dim ? local->layers[0].ffn_dim : c->ffn / world;
  local->n_kv_heads = c->n_kv_heads >= world ? c->n_kv_heads / world : 1;
  if (c->n_global_kv_heads)
    local->n_global_kv_heads = c->n_global_kv_heads >= world ? c->n_global_kv_heads / world : 1;
  return 0;
}
