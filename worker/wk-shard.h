/* wk-shard.h — how a model splits over tensor-parallel ranks (Megatron layout).
 *
 * Rank r of N holds:
 *   - query heads [r * nh/N, (r + 1) * nh/N) of every layer (Q rows, O columns);
 *   - the KV heads those query heads read: KV heads [r * kvh/N, ...) when the layer has at
 *     least N of them, else the one KV head its query heads share (replicated over
 *     N / kvh ranks), so its KV pool holds only its heads;
 *   - an N-th of each MLP's intermediate width (gate/up rows, down columns) and of each
 *     MoE expert's (every rank holds every expert, split by its intermediate dimension:
 *     routing then needs no exchange and every rank does the same work whatever the
 *     router picks, where experts-by-rank would idle the ranks whose experts are not
 *     chosen in a step). Where an N-th would cut a block of the down projection's
 *     format (Gemma 3 1b's 6912 columns of Q4_K over two ranks: 3456 is 13.5 blocks of
 *     256), the ranks hold whole blocks instead, the first ones one more (14 and 13),
 *     so that every rank's columns are the file's blocks as they are;
 *   - V/N rows of the embedding and of the head (vocab-parallel).
 * Norms, the router, the per-layer-embedding weights and the MTP assistant's projections
 * are replicated. An all-reduce(sum) follows the attention output projection and the MLP
 * down projection (and the MoE experts), and the vocab-parallel embedding.
 *
 * wk_config_shard turns the full config into this rank's config: the same fields with the
 * per-rank counts (n_heads, each layer's n_kv_heads and ffn_dim, moe_ffn), so that the KV
 * plan and the forward pass read per-rank shapes from it without testing the rank. */
#ifndef LMSERVE_WK_SHARD_H
#define LMSERVE_WK_SHARD_H

#include <stddef.h>

#include "model/md-config.h"

#define WK_MAX_TP 64 /* ranks in one tensor-parallel group */

/* The widths the MLPs' cuts must fall on: the block of their down projections'
 * formats (1: any element). */
struct wk_shard_units {
  int ffn[MD_MAX_LAYERS]; /* each layer's MLP */
  int moe;                /* the experts' (one width in every layer) */
};

/* Where this rank's slice starts in each full dimension. */
struct wk_shard_plan {
  int rank, world;
  int vocab0, vocab_n;         /* embedding / head rows held: [vocab0, vocab0 + vocab_n) */
  int q_head0;                 /* first query head (all layers) */
  int kv_head0[MD_MAX_LAYERS]; /* per layer: first KV head held */
  int ffn0[MD_MAX_LAYERS];     /* per layer: first MLP intermediate column held */
  int moe0;                    /* first column of each expert's intermediate width held */
  struct wk_shard_units units; /* the widths the cuts follow where they are not even shares
                                  (1 where they are; 0 with one rank): alike on every rank */
};

/* Fills `local` (this rank's config) and `plan` from the full config, or returns
 * CM_ERR_INVAL with a message naming the dimension that cannot be split over `world`
 * ranks. rank in [0, world); world = 1 gives local == *full. units: where the
 * MLPs' and experts' cuts must fall (NULL: anywhere). */
int wk_config_shard(const struct md_config *full, int rank, int world,
                    const struct wk_shard_units *units, struct md_config *local,
                    struct wk_shard_plan *plan, char *err, size_t errlen);

#endif
