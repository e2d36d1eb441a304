/* wk-kv.h — the KV-cache plan of a model and a simple page allocator.
 *
 * Layers are grouped by KV spec (layer kind, head dim, KV heads). Each group
 * has its own block table per sequence; every group draws pages from one
 * physical pool of equal-sized pages. A page of group g holds block_tokens(g)
 * consecutive positions of one sequence for all storing layers of g:
 *
 *   page = [layer 0 of g: K[block_tokens][n_kv_heads][head_dim], V[...same...]]
 *          [layer 1 of g: K, V] ...
 *
 * (exactly the kn_kv_view layout of kernels/kn-backend.h: k_off / v_off per
 * layer). KV-shared layers store nothing: they read their source layer's
 * K/V and so add no bytes. The group with the most bytes per token gets
 * `block_tokens` (default 16) positions per page; that fixes the page size,
 * and every other group gets floor(page_bytes / its bytes per token).
 *
 * Everything here derives from a md_config alone (no weights), so the
 * scheduler can size block tables from config.json. */
#ifndef LMSERVE_WK_KV_H
#define LMSERVE_WK_KV_H
#include <stddef.h>
#include <stdint.h>

#include "kernels/kn-dtype.h"
#include "model/md-config.h"

#define WK_MAX_KV_GROUPS 8

struct wk_kv_group {
  enum md_layer_kind kind;
  int head_dim; /* elements per head */
  int n_kv_heads;
  int window;                /* sliding window in tokens; 0 for full attention */
  int n_layers;              /* storing layers in this group */
  int layers[MD_MAX_LAYERS]; /* their indices, ascending */
  size_t bytes_per_token;    /* K and V of all its storing layers, bytes */
  int block_tokens;          /* positions per page */
};

struct wk_kv_spec {
  enum kn_dtype dtype; /* KN_DTYPE_F32 or KN_DTYPE_BF16 */
  int n_groups;
  struct wk_kv_group groups[WK_MAX_KV_GROUPS];
  size_t page_bytes; /* bytes per physical page */
  int n_layers;
  int layer_group[MD_MAX_LAYERS];    /* group each layer reads (its source's for shared layers);
                                        -1 for an assistant layer (reads the target) */
  size_t layer_k_off[MD_MAX_LAYERS]; /* bytes within a page of the layer it reads */
  size_t layer_v_off[MD_MAX_LAYERS];
};

/* Builds the plan. block_tokens: positions per page of the largest group
 * (0 = 16). Returns 0, or CM_ERR_INVAL / CM_ERR_UNSUPPORTED (too many groups,
 * a bad dtype). An assistant config yields zero groups. */
int wk_kv_spec_build(const struct md_config *cfg, enum kn_dtype dtype, int block_tokens,
                     struct wk_kv_spec *out);

/* Sum of all groups' bytes per token. */
size_t wk_kv_bytes_per_token(const struct wk_kv_spec *s);

/* Blocks group g needs to hold positions [0, n_tokens). */
int wk_kv_blocks_for(const struct wk_kv_spec *s, int g, int n_tokens);

/* KV pool bytes under a device memory utilisation target (vLLM's
 * --gpu-memory-utilization): total * util - (total - free), i.e. what is left
 * of the budget once everything already on the device (weights, scratch,
 * other processes) is counted. Returns 0 with *kv_bytes, CM_ERR_INVAL for
 * util outside (0, 1] or free > total, CM_ERR_NOMEM when the memory in use
 * already exceeds the budget (*kv_bytes = 0). */
int wk_kv_bytes_for_util(double util, uint64_t total, uint64_t free, uint64_t *kv_bytes);

/* ---- a simple page allocator (for generate, bench and tests; the
 *      scheduler keeps its own block manager) ---------------------------- */

struct wk_page_alloc {
  int32_t *free_list; /* [n_pages] */
  int n_free;
  int n_pages;
};

int wk_page_alloc_init(struct wk_page_alloc *a, int n_pages);
void wk_page_alloc_free(struct wk_page_alloc *a);
/* Returns a page id, or -1 when the pool is empty. */
int32_t wk_page_alloc_get(struct wk_page_alloc *a);
void wk_page_alloc_put(struct wk_page_alloc *a, int32_t page);

/* A sequence's block tables, one per group, grown on demand. */
struct wk_seq_blocks {
  int32_t *table[WK_MAX_KV_GROUPS]; /* [cap] page ids */
  int n[WK_MAX_KV_GROUPS];
  int cap[WK_MAX_KV_GROUPS];
};

/* Makes sure every group can hold positions [0, n_tokens). Returns 0 or
 * CM_ERR_FULL (pool exhausted; nothing is leaked: pages taken stay in the
 * tables) / CM_ERR_NOMEM. */
int wk_seq_blocks_reserve(struct wk_seq_blocks *b, const struct wk_kv_spec *s,
                          struct wk_page_alloc *a, int n_tokens);
/* Returns every page to the allocator and frees the tables. */
void wk_seq_blocks_release(struct wk_seq_blocks *b, const struct wk_kv_spec *s,
                           struct wk_page_alloc *a);

#endif
