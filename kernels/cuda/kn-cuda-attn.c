/* kn-cuda-attn.c — host side of paged attention: turns the ragged batch of
 * sequences into one descriptor per query row (its visible key interval and
 * where its block table lies) and tiles of consecutive rows of a sequence
 * that one block serves together, stages tables, rows and tiles in one
 * pinned reservation, picks the key split (flash decoding) so that small
 * batches with long contexts still fill the device, and launches.
 *
 * Visible keys form an interval: a query at position p sees [p - window + 1, p]
 * (or [0, p] without a window), and every bidirectional range [b, e) that
 * contains p also contains p, so their union with the causal interval is one
 * interval [lo, hi]. The kernels therefore need no per-key mask. */
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-log.h"
#include "kernels/cuda/kn-cuda-impl.h"

#define ATTN_MAX_CHUNK 8  /* (row, head) slots per block at most */
#define ATTN_TILE      32 /* keys per tile; split lengths are multiples of it */
/* Keys per split at least. A block walks its split in 32-key tiles one after
 * another, so a long context with few (tile, kv head) blocks is latency-bound:
 * with 256 here, a 1b-shaped decode step (one KV head, 4 blocks a layer)
 * took 4 ms more after 1024 tokens than after 16 on an H200; 64 gives it 16
 * blocks. Splits are added only where the blocks alone do not fill the
 * device (below). */
#define ATTN_MIN_SPLIT     64
#define ATTN_BLOCKS_PER_SM 4

static size_t align16(size_t n) {
  return (n + 15) & ~(size_t)15;
}

/* Visible key interval of the query at position p of seq s. */
static void key_interval(const struct kn_attn_seq *s, int window, int p, int *lo, int *hi) {
  int l = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
  int h = p;
  for (int r = 0; r < s->n_bidir; r++) {
    int b = s->bidir[2 * r], e = s->bidir[2 * r + 1];
    if (b < e && p >= b && p < e) {
      if (b < l) l = b;
      if (e - 1 > h) h = e - 1;
    }
  }
  *lo = l;
  *hi = h;
}

/* Blocks of seq s that its queries can reach: entries [0, return value). */
static int blocks_needed(const struct kn_attn_seq *s, int window, int block_tokens) {
  int max_hi = 0;
  for (int i = 0; i < s->n_q; i++) {
    int lo, hi;
    key_interval(s, window, s->pos0 + i, &lo, &hi);
    if (hi > max_hi) max_hi = hi;
  }
  return max_hi / block_tokens + 1;
}

/* Smallest of 1, 2, 4, 8 that is >= n (n <= 8). */
static int pow2_slots(int n) {
  int s = 1;
  while (s < n)
    s *= 2;
  return s;
}

int kn_cuda_op_attention(void *ctx, float *out, ptrdiff_t ldo, const float *q, ptrdiff_t ldq,
                         const struct kn_kv_view *view, const struct kn_attn_seq *seqs, int n_seqs,
                         int n_heads, int window, float scale, float softcap) {
  struct kn_cuda_ctx *c = ctx;
  int err = kn_cuda_check_view(view);
  if (!err) err = kn_cuda_enter(c);
  if (err) return err;

  /* slots per block: the GQA group's heads (in chunks of at most 8), and for
   * prefill chunks as many query rows as fit beside them */
  int group = n_heads / view->n_kv_heads;
  int n_chunks = (group + ATTN_MAX_CHUNK - 1) / ATTN_MAX_CHUNK;
  int chunk = (group + n_chunks - 1) / n_chunks;
  int max_nq = 0;
  for (int i = 0; i < n_seqs; i++)
    if (seqs[i].n_q > max_nq) max_nq = seqs[i].n_q;
  int slots = max_nq > 1 ? ATTN_MAX_CHUNK : pow2_slots(chunk);
  int qt = slots / chunk;

  /* in a step graph's modes the shapes are those of contexts of graph_keys
   * keys, whatever this step's are (kn-cuda-graph.c) */
  int graph_keys = kn_cuda_graph_keys(c);
  int graph_blocks = graph_keys ? (graph_keys - 1) / view->block_tokens + 1 : 0;

  /* pass 1: sizes */
  long long n_rows = 0, n_tab = 0, n_tiles = 0;
  for (int i = 0; i < n_seqs; i++) {
    if (seqs[i].n_q <= 0) continue;
    n_rows += seqs[i].n_q;
    n_tiles += (seqs[i].n_q + qt - 1) / qt;
    int nb = blocks_needed(&seqs[i], window, view->block_tokens);
    if (graph_keys && nb > graph_blocks) {
      cm_debug("cuda", "attention: a context past the step graph's %d keys", graph_keys);
      return CM_ERR_INVAL;
    }
    n_tab += graph_keys ? graph_blocks : nb;
  }
  if (n_rows == 0) return 0;
  if (n_rows > INT32_MAX || n_tab > INT32_MAX) return CM_ERR_UNSUPPORTED;
  if ((long long)view->n_kv_heads * n_chunks > 65535) return CM_ERR_UNSUPPORTED;

  size_t tab_bytes = align16((size_t)n_tab * sizeof(int32_t));
  size_t row_bytes = align16((size_t)n_rows * sizeof(struct kn_cuda_attn_row));
  size_t tile_bytes = (size_t)n_tiles * sizeof(struct kn_cuda_attn_tile);
  void *host, *dev;
  err = kn_cuda_stage_alloc(c, tab_bytes + row_bytes + tile_bytes, &host, &dev);
  if (err) return err;
  int32_t *tab_h = host;
  struct kn_cuda_attn_row *rows_h = (struct kn_cuda_attn_row *)((char *)host + tab_bytes);
  struct kn_cuda_attn_tile *tiles_h =
      (struct kn_cuda_attn_tile *)((char *)host + tab_bytes + row_bytes);

  /* pass 2: tables, row descriptors, tiles */
  int r = 0, ti = 0, off = 0, max_len = 1;
  for (int i = 0; i < n_seqs; i++) {
    const struct kn_attn_seq *s = &seqs[i];
    if (s->n_q <= 0) continue;
    int nb = graph_keys ? graph_blocks : blocks_needed(s, window, view->block_tokens);
    /* entries no query can see may be -1 and are never read; the needed ones
     * were checked by kn-backend.c */
    int have = nb < s->n_blocks ? nb : s->n_blocks;
    memcpy(tab_h + off, s->block_table, (size_t)have * sizeof(int32_t));
    for (int b = have; b < nb; b++)
      tab_h[off + b] = -1;
    for (int j = 0; j < s->n_q; j++, r++) {
      struct kn_cuda_attn_row *row = &rows_h[r];
      row->q_row = s->q_begin + j;
      row->pos = s->pos0 + j;
      key_interval(s, window, row->pos, &row->lo, &row->hi);
      row->bt_off = off;
      if (j % qt == 0) {
        struct kn_cuda_attn_tile *t = &tiles_h[ti++];
        t->r0 = r;
        t->nq = 0;
        t->lo = row->lo;
        t->hi = row->hi;
      }
      struct kn_cuda_attn_tile *t = &tiles_h[ti - 1];
      t->nq++;
      if (row->lo < t->lo) t->lo = row->lo;
      if (row->hi > t->hi) t->hi = row->hi;
      if (t->hi - t->lo + 1 > max_len) max_len = t->hi - t->lo + 1;
    }
    off += nb;
  }
  err = kn_cuda_stage_push(c, host, dev, tab_bytes + row_bytes + tile_bytes);
  if (err) return err;

  struct kn_cuda_attn_args a;
  memset(&a, 0, sizeof(a));
  a.out = out;
  a.ldo = ldo;
  a.q = q;
  a.ldq = ldq;
  a.pool = view->pool;
  a.page_bytes = view->page_bytes;
  a.k_off = view->k_off;
  a.k_scale = view->k_scale;
  a.v_scale = view->v_scale;
  a.v_off = view->v_off;
  a.block_tokens = view->block_tokens;
  a.n_kv_heads = view->n_kv_heads;
  a.head_dim = view->head_dim;
  a.n_heads = n_heads;
  a.group = group;
  a.n_chunks = n_chunks;
  a.chunk = chunk;
  a.qt = qt;
  a.slots = slots;
  a.scale = scale;
  a.softcap = softcap;
  a.tables = dev;
  a.rows = (const struct kn_cuda_attn_row *)((const char *)dev + tab_bytes);
  a.tiles = (const struct kn_cuda_attn_tile *)((const char *)dev + tab_bytes + row_bytes);
  a.n_rows = (int)n_rows;
  a.n_tiles = (int)n_tiles;

  /* split the keys when the (tile, head chunk) blocks alone do not fill the GPU;
   * a graph plans for its longest context, and the blocks of splits that start
   * past a tile's keys return at once (the combine skips them) */
  if (graph_keys) max_len = graph_keys;
  long long items = n_tiles * view->n_kv_heads * n_chunks;
  long long want = ((long long)c->n_sm * ATTN_BLOCKS_PER_SM + items - 1) / items;
  long long by_len = (max_len + ATTN_MIN_SPLIT - 1) / ATTN_MIN_SPLIT;
  long long n_split = want < by_len ? want : by_len;
  if (n_split < 1) n_split = 1;
  long long split_len = (max_len + n_split - 1) / n_split;
  split_len = (split_len + ATTN_TILE - 1) / ATTN_TILE * ATTN_TILE;
  n_split = (max_len + split_len - 1) / split_len;
  if (n_split > 65535) return CM_ERR_UNSUPPORTED;
  a.split_len = (int)split_len;
  a.n_split = (int)n_split;
  if (graph_keys && n_split > 1) {
    /* the grid is planned for the longest context, but each tile spreads its own
     * keys over it (at least ATTN_MIN_SPLIT a split), so a short context is not
     * walked by one block in long splits */
    a.fit_split = 1;
    a.split_len = ATTN_MIN_SPLIT;
  }
  if (n_split > 1) {
    size_t parts = (size_t)n_rows * (size_t)n_heads * (size_t)n_split;
    size_t acc_bytes = parts * (size_t)view->head_dim * sizeof(float);
    void *scratch;
    err = kn_cuda_scratch(c, acc_bytes + parts * 2 * sizeof(float), &scratch);
    if (err) return err;
    a.part_acc = scratch;
    a.part_ml = (float *)((char *)scratch + acc_bytes);
  }
  KN_CUDA_RUN(c, kn_cuda_launch_attention(c->stream, &a, view->dtype));
  return 0;
}
