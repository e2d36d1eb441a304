/* wk-kv.c — KV groups, page layout and bytes per token from a config; a
 * free-list page allocator and growable per-sequence block tables. */
#include "worker/wk-kv.h"

#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"

int wk_kv_spec_build(const struct md_config *cfg, enum kn_dtype dtype, int block_tokens,
                     struct wk_kv_spec *out) {
  memset(out, 0, sizeof(*out));
  if (dtype != KN_DTYPE_F32 && dtype != KN_DTYPE_BF16 && dtype != KN_DTYPE_F8E4M3)
    return CM_ERR_UNSUPPORTED;
  if (block_tokens <= 0) block_tokens = 16;
  if (block_tokens > 4096) return CM_ERR_INVAL;
  out->dtype = dtype;
  out->n_layers = cfg->n_layers;
  size_t elt = kn_dtype_size(dtype);
  /* groups of the storing layers, in order of first appearance */
  for (int i = 0; i < cfg->n_layers; i++) {
    const struct md_layer_cfg *l = &cfg->layers[i];
    out->layer_group[i] = -1;
    if (l->kv_shared) continue;
    int g;
    for (g = 0; g < out->n_groups; g++) {
      const struct wk_kv_group *G = &out->groups[g];
      if (G->kind == l->kind && G->head_dim == l->head_dim && G->n_kv_heads == l->n_kv_heads) break;
    }
    if (g == out->n_groups) {
      if (g == WK_MAX_KV_GROUPS) return CM_ERR_UNSUPPORTED;
      out->n_groups++;
      struct wk_kv_group *G = &out->groups[g];
      G->kind = l->kind;
      G->head_dim = l->head_dim;
      G->n_kv_heads = l->n_kv_heads;
      G->window = l->kind == MD_LAYER_SLIDING ? cfg->sliding_window : 0;
    }
    struct wk_kv_group *G = &out->groups[g];
    G->layers[G->n_layers++] = i;
    G->bytes_per_token += 2 * (size_t)l->n_kv_heads * (size_t)l->head_dim * elt;
    out->layer_group[i] = g;
  }
  if (out->n_groups == 0) return 0;
  size_t max_bpt = 0;
  for (int g = 0; g < out->n_groups; g++)
    max_bpt = CM_MAX(max_bpt, out->groups[g].bytes_per_token);
  out->page_bytes = max_bpt * (size_t)block_tokens;
  for (int g = 0; g < out->n_groups; g++) {
    struct wk_kv_group *G = &out->groups[g];
    G->block_tokens = (int)(out->page_bytes / G->bytes_per_token);
    size_t off = 0;
    for (int j = 0; j < G->n_layers; j++) {
      int li = G->layers[j];
      size_t half = (size_t)G->block_tokens * (size_t)G->n_kv_heads * (size_t)G->head_dim * elt;
      out->layer_k_off[li] = off;
      out->layer_v_off[li] = off + half;
      off += 2 * half;
    }
    CM_ASSERT(off <= out->page_bytes);
  }
  /* shared layers read their source's group and offsets */
  for (int i = 0; i < cfg->n_layers; i++) {
    const struct md_layer_cfg *l = &cfg->layers[i];
    if (!l->kv_shared || l->kv_source < 0) continue;
    int src = l->kv_source;
    out->layer_group[i] = out->layer_group[src];
    out->layer_k_off[i] = out->layer_k_off[src];
    out->layer_v_off[i] = out->layer_v_off[src];
  }
  return 0;
}

size_t wk_kv_bytes_per_token(const struct wk_kv_spec *s) {
  size_t b = 0;
  for (int g = 0; g < s->n_groups; g++)
    b += s->groups[g].bytes_per_token;
  return b;
}

int wk_kv_blocks_for(const struct wk_kv_spec *s, int g, int n_tokens) {
  int bt = s->groups[g].block_tokens;
  return (n_tokens + bt - 1) / bt;
}

/* ---- page allocator -------------------------------------------------------- */

int wk_page_alloc_init(struct wk_page_alloc *a, int n_pages) {
  memset(a, 0, sizeof(*a));
  if (n_pages < 0) return CM_ERR_INVAL;
  a->free_list = malloc(sizeof(int32_t) * (size_t)(n_pages ? n_pages : 1));
  if (!a->free_list) return CM_ERR_NOMEM;
  /* hand out low page ids first */
  for (int i = 0; i < n_pages; i++)
    a->free_list[i] = n_pages - 1 - i;
  a->n_free = a->n_pages = n_pages;
  return 0;
}

void wk_page_alloc_free(struct wk_page_alloc *a) {
  free(a->free_list);
  memset(a, 0, sizeof(*a));
}

int32_t wk_page_alloc_get(struct wk_page_alloc *a) {
  return a->n_free ? a->free_list[--a->n_free] : -1;
}

void wk_page_alloc_put(struct wk_page_alloc *a, int32_t page) {
  CM_ASSERT(page >= 0 && page < a->n_pages && a->n_free < a->n_pages);
  a->free_list[a->n_free++] = page;
}

int wk_seq_blocks_reserve(struct wk_seq_blocks *b, const struct wk_kv_spec *s,
                          struct wk_page_alloc *a, int n_tokens) {
  for (int g = 0; g < s->n_groups; g++) {
    int need = wk_kv_blocks_for(s, g, n_tokens);
    if (need > b->cap[g]) {
      int nc = CM_MAX(need, b->cap[g] * 2);
      int32_t *nt = realloc(b->table[g], sizeof(int32_t) * (size_t)nc);
      if (!nt) return CM_ERR_NOMEM;
      b->table[g] = nt;
      b->cap[g] = nc;
    }
    while (b->n[g] < need) {
      int32_t p = wk_page_alloc_get(a);
      if (p < 0) return CM_ERR_FULL;
      b->table[g][b->n[g]++] = p;
    }
  }
  return 0;
}

void wk_seq_blocks_release(struct wk_seq_blocks *b, const struct wk_kv_spec *s,
                           struct wk_page_alloc *a) {
  for (int g = 0; g < s->n_groups; g++) {
    for (int i = 0; i < b->n[g]; i++)
      wk_page_alloc_put(a, b->table[g][i]);
    free(b->table[g]);
  }
  memset(b, 0, sizeof(*b));
}

int wk_kv_bytes_for_util(double util, uint64_t total, uint64_t free, uint64_t *kv_bytes) {
  *kv_bytes = 0;
  if (!(util > 0.0 && util <= 1.0) || free > total) return CM_ERR_INVAL;
  uint64_t used = total - free;
  /* total * util in integer bytes, exact for util = 1 */
  uint64_t budget = util >= 1.0 ? total : (uint64_t)((double)total * util);
  if (budget <= used) return CM_ERR_NOMEM;
  *kv_bytes = budget - used;
  return 0;
}
