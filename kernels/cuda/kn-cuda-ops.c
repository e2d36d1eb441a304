/* kn-cuda-ops.c — host side of the CUDA backend's small ops: stage the host
 * index arrays (token ids, positions, slot mappings), launch the kernel on
 * the backend's stream, and for the reductions whose results belong to the
 * host (argmax, router top-k) copy them back through a pinned buffer and
 * wait. Arguments arrive validated by kn-backend.c. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-hash.h"
#include "common/cm-log.h"
#include "kernels/cuda/kn-cuda-impl.h"

int kn_cuda_op_embed(void *ctx, float *out, ptrdiff_t ldo, const void *table, enum kn_dtype tdt,
                     int H, const int32_t *ids, int T, float scale) {
  struct kn_cuda_ctx *c = ctx;
  void *ids_d;
  int err = kn_cuda_enter(c);
  if (!err) err = kn_cuda_stage(c, ids, (size_t)T * sizeof(int32_t), &ids_d);
  if (err) return err;
  /* the ids were checked against the table on the host: INT32_MAX bounds nothing */
  KN_CUDA_RUN(c,
              kn_cuda_launch_embed(c->stream, out, ldo, table, tdt, INT32_MAX, H, ids_d, T, scale));
  return 0;
}

/* ---- ids kept on the device (kn_kept_ids, kn_ids_take, kn_embed_dev) ------------ */

int32_t *kn_cuda_op_kept_ids(void *ctx) {
  struct kn_cuda_ctx *c = ctx;
  return c->ids_ok ? c->kept_d : NULL; /* NULL: steps embed from the host's ids */
}

int kn_cuda_ids_check(struct kn_backend *be, struct kn_cuda_ctx *c) {
  enum { V = 5, H = 8, T = 4, NS = 3 };
  float table[V * H], got[T * H];
  for (int i = 0; i < V * H; i++)
    table[i] = 0.5f * (float)(i + 1);
  /* rows: id 2; src[2] = 3; id 7, outside the table (a zero row); src[0] = 4 */
  const int32_t src[NS] = {4, 1, 3}, ids[T] = {2, 0, 7, 1}, map[T] = {-1, 2, -1, 0};
  const int32_t want_ids[T] = {2, 3, -1, 4};
  float *table_d = kn_alloc(be, sizeof(table)), *out_d = kn_alloc(be, sizeof(got));
  int32_t *src_d = kn_alloc(be, sizeof(src)), *dst_d = kn_alloc(be, sizeof(ids));
  c->ids_ok = 1; /* for the check's own calls */
  int err = table_d && out_d && src_d && dst_d ? 0 : CM_ERR_NOMEM;
  if (!err) err = kn_upload(be, table_d, table, sizeof(table));
  if (!err) err = kn_upload(be, src_d, src, sizeof(src));
  if (!err) err = kn_ids_take(be, dst_d, ids, src_d, NS, map, T);
  if (!err) err = kn_embed_dev(be, out_d, H, table_d, KN_DTYPE_F32, V, H, dst_d, T, 2.0f);
  if (!err) err = kn_download(be, got, out_d, sizeof(got));
  int same = !err;
  for (int t = 0; same && t < T; t++)
    for (int h = 0; h < H; h++)
      same &= got[t * H + h] == (want_ids[t] < 0 ? 0.0f : 2.0f * table[want_ids[t] * H + h]);
  c->ids_ok = same;
  if (!same)
    cm_warn("cuda",
            "sampled ids stay on the host between steps: the device's id gather and "
            "embedding failed their check (%s)",
            err ? cm_strerror(err) : "wrong rows");
  kn_free(be, table_d), kn_free(be, out_d), kn_free(be, src_d), kn_free(be, dst_d);
  return err == CM_ERR_DEVICE ? err : 0;
}

int kn_cuda_mask_check(struct kn_backend *be, struct kn_cuda_ctx *c) {
  /* rows: greedy under a sparse mask, greedy under a dense one, sampled (top-k,
   * penalties) under a mask, sampled without; V not a multiple of 32 */
  enum { V = 1000, T = 4, W = (V + 31) / 32 };
  float logits[T * V], refused[T * V];
  uint32_t masks[T][W];
  memset(masks, 0, sizeof(masks));
  uint64_t s = 0x6d61736b;
  for (int i = 0; i < T * V; i++)
    logits[i] = (float)(cm_splitmix64(&s) >> 40) / (float)(1 << 24) * 8.0f - 4.0f;
  for (int t = 0; t < T; t++)
    for (int v = 0; v < V; v++)
      if (t == 0 ? v % 97 == 5 : t == 1 ? v % 13 != 0 : t == 2 ? v % 3 == 1 : 1)
        masks[t][v / 32] |= 1u << (v % 32);
  const int32_t pen_ids[3] = {1, 4, 7}, pen_counts[3] = {2, 0, 1};
  struct kn_sample_params p[T], q[T];
  for (int t = 0; t < T; t++) {
    kn_sample_params_default(&p[t]);
    p[t].temperature = t < 2 ? 0.0f : 0.9f;
    p[t].seed = 11 + (uint64_t)t;
    p[t].counter = 3;
    p[t].allow = t < 3 ? masks[t] : NULL;
    for (int v = 0; v < V; v++)
      refused[t * V + v] = (masks[t][v / 32] >> (v % 32)) & 1 ? logits[t * V + v] : -INFINITY;
  }
  p[2].top_k = 40;
  p[2].repetition_penalty = 1.3f;
  p[2].frequency_penalty = 0.5f;
  p[2].pen_ids = pen_ids;
  p[2].pen_counts = pen_counts;
  p[2].n_pen = 3;
  memcpy(q, p, sizeof(q));
  for (int t = 0; t < T; t++)
    q[t].allow = NULL;
  struct kn_sample_out got[T], want[T];
  float *a_d = kn_alloc(be, sizeof(logits)), *b_d = kn_alloc(be, sizeof(refused));
  c->mask_ok = 1; /* for the check's own calls */
  int err = a_d && b_d ? 0 : CM_ERR_NOMEM;
  if (!err) err = kn_upload(be, a_d, logits, sizeof(logits));
  if (!err) err = kn_upload(be, b_d, refused, sizeof(refused));
  if (!err) err = kn_sample(be, got, a_d, V, T, V, p);
  if (!err) err = kn_sample(be, want, b_d, V, T, V, q);
  int same = !err;
  for (int t = 0; same && t < T; t++)
    same = got[t].token == want[t].token && got[t].token >= 0 && got[t].token < V &&
           ((masks[t][got[t].token / 32] >> (got[t].token % 32)) & 1);
  /* a mask that allows nothing: CM_ERR_INVAL, as on the CPU */
  memset(masks[0], 0, sizeof(masks[0]));
  if (same && kn_sample(be, got, a_d, V, 1, V, p) != CM_ERR_INVAL) same = 0;
  c->mask_ok = same;
  if (!same)
    cm_warn("cuda",
            "structured outputs' rows are masked and drawn on the host: the device's masked "
            "draw failed its check (%s)",
            err ? cm_strerror(err) : "other tokens");
  kn_free(be, a_d), kn_free(be, b_d);
  return err == CM_ERR_DEVICE ? err : 0;
}

int kn_cuda_op_ids_take(void *ctx, int32_t *dst, const int32_t *ids, const int32_t *src,
                        const int32_t *map, int T) {
  struct kn_cuda_ctx *c = ctx;
  void *ids_d, *map_d;
  int err = kn_cuda_enter(c);
  if (!err) err = kn_cuda_stage(c, ids, (size_t)T * sizeof(int32_t), &ids_d);
  if (!err) err = kn_cuda_stage(c, map, (size_t)T * sizeof(int32_t), &map_d);
  if (err) return err;
  KN_CUDA_RUN(c, kn_cuda_launch_ids_take(c->stream, dst, ids_d, src, map_d, T));
  return 0;
}

int kn_cuda_op_embed_dev(void *ctx, float *out, ptrdiff_t ldo, const void *table, enum kn_dtype tdt,
                         int vocab, int H, const int32_t *ids, int T, float scale) {
  struct kn_cuda_ctx *c = ctx;
  int err = kn_cuda_enter(c);
  if (err) return err;
  KN_CUDA_RUN(c, kn_cuda_launch_embed(c->stream, out, ldo, table, tdt, vocab, H, ids, T, scale));
  return 0;
}

/* Keeps the T ids at ids_d (each `stride` bytes after the last) in kept_d, on the
 * stream, when there are at most KN_KEPT_IDS_MAX (kn__keep_ids says how many). */
static int keep_ids(struct kn_cuda_ctx *c, const int32_t *ids_d, size_t stride, int T) {
  if (T > KN_KEPT_IDS_MAX) return 0;
  KN_CUDA_CHECK(cudaMemcpy2DAsync(c->kept_d, sizeof(int32_t), ids_d, stride, sizeof(int32_t),
                                  (size_t)T, cudaMemcpyDeviceToDevice, c->stream));
  return 0;
}

int kn_cuda_op_rmsnorm(void *ctx, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                       int rows, int d, const void *w, enum kn_dtype wdt, float eps,
                       enum kn_norm_mode mode) {
  struct kn_cuda_ctx *c = ctx;
  int err = kn_cuda_enter(c);
  if (err) return err;
  KN_CUDA_RUN(c, kn_cuda_launch_rmsnorm(c->stream, out, ldo, x, ldx, rows, d, w, wdt, eps, mode));
  return 0;
}

int kn_cuda_op_rope(void *ctx, float *x, ptrdiff_t ldx, int T, int heads, int D, const int32_t *pos,
                    const float *inv_freq) {
  struct kn_cuda_ctx *c = ctx;
  void *pos_d;
  int err = kn_cuda_enter(c);
  if (!err) err = kn_cuda_stage(c, pos, (size_t)T * sizeof(int32_t), &pos_d);
  if (err) return err;
  KN_CUDA_RUN(c, kn_cuda_launch_rope(c->stream, x, ldx, T, heads, D, pos_d, inv_freq));
  return 0;
}

int kn_cuda_op_gelu_mul(void *ctx, float *out, ptrdiff_t ldo, const float *gate, ptrdiff_t ldg,
                        const float *up, ptrdiff_t ldu, int T, int N) {
  struct kn_cuda_ctx *c = ctx;
  int err = kn_cuda_enter(c);
  if (err) return err;
  KN_CUDA_RUN(c, kn_cuda_launch_gelu_mul(c->stream, out, ldo, gate, ldg, up, ldu, T, N));
  return 0;
}

static int eltwise(void *ctx, enum kn_cuda_eltwise op, float *out, const float *a, const float *b,
                   float s, size_t n) {
  struct kn_cuda_ctx *c = ctx;
  int err = kn_cuda_enter(c);
  if (err) return err;
  KN_CUDA_RUN(c, kn_cuda_launch_eltwise(c->stream, op, out, a, b, s, n));
  return 0;
}

int kn_cuda_op_add(void *ctx, float *out, const float *a, const float *b, size_t n) {
  return eltwise(ctx, KN_CUDA_ADD, out, a, b, 0.0f, n);
}

int kn_cuda_op_mul(void *ctx, float *out, const float *a, const float *b, size_t n) {
  return eltwise(ctx, KN_CUDA_MUL, out, a, b, 0.0f, n);
}

int kn_cuda_op_scale(void *ctx, float *out, const float *a, float s, size_t n) {
  return eltwise(ctx, KN_CUDA_SCALE, out, a, NULL, s, n);
}

int kn_cuda_op_softcap(void *ctx, float *out, const float *a, float cap, size_t n) {
  return eltwise(ctx, KN_CUDA_SOFTCAP, out, a, NULL, cap, n);
}

int kn_cuda_op_copy_rows(void *ctx, float *dst, ptrdiff_t ldd, const float *src, ptrdiff_t lds,
                         int rows, int cols) {
  struct kn_cuda_ctx *c = ctx;
  int err = kn_cuda_enter(c);
  if (err) return err;
  size_t width = (size_t)cols * sizeof(float);
  /* a single row may come with any stride; cudaMemcpy2D wants pitch >= width */
  size_t dp = rows == 1 ? width : (size_t)ldd * sizeof(float);
  size_t sp = rows == 1 ? width : (size_t)lds * sizeof(float);
  KN_CUDA_RUN(c, cudaMemcpy2DAsync(dst, dp, src, sp, width, (size_t)rows, cudaMemcpyDeviceToDevice,
                                   c->stream));
  return 0;
}

int kn_cuda_op_kv_write(void *ctx, const struct kn_kv_view *view, const int32_t *slot_mapping,
                        const float *k, ptrdiff_t ldk, const float *v, ptrdiff_t ldv, int T) {
  struct kn_cuda_ctx *c = ctx;
  void *slots_d;
  int err = kn_cuda_check_view(view);
  if (!err) err = kn_cuda_enter(c);
  if (!err) err = kn_cuda_stage(c, slot_mapping, (size_t)T * sizeof(int32_t), &slots_d);
  if (err) return err;
  KN_CUDA_RUN(c, kn_cuda_launch_kv_write(c->stream, view, slots_d, k, ldk, v, ldv, T));
  return 0;
}

/* ---- reductions with host results ----------------------------------------- */

/* n ids then n floats in device scratch, contiguous so that one copy brings
 * both back to the pinned host buffer. */
struct id_val_result {
  int32_t *ids_d; /* (n) */
  float *vals_d;  /* (n) */
  void *host;     /* n * 8 bytes */
  size_t n;
};

static int result_begin(struct kn_cuda_ctx *c, size_t n, struct id_val_result *r) {
  void *dev;
  int err = kn_cuda_graph_refuse(c, "a reduction to the host");
  if (!err) err = kn_cuda_enter(c);
  if (!err) err = kn_cuda_scratch(c, n * 8, &dev);
  if (!err) err = kn_cuda_result_host(c, n * 8, &r->host);
  if (err) return err;
  r->ids_d = dev;
  r->vals_d = (float *)(r->ids_d + n);
  r->n = n;
  return 0;
}

/* After the launch: waits for it and copies the ids and (vals not NULL) the
 * values out. */
static int result_end(struct kn_cuda_ctx *c, const struct id_val_result *r, int32_t *ids,
                      float *vals) {
  KN_CUDA_CHECK(cudaMemcpyAsync(r->host, r->ids_d, r->n * 8, cudaMemcpyDeviceToHost, c->stream));
  KN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
  memcpy(ids, r->host, r->n * sizeof(int32_t));
  if (vals) memcpy(vals, (const int32_t *)r->host + r->n, r->n * sizeof(float));
  return 0;
}

int kn_cuda_op_argmax(void *ctx, int32_t *ids, float *max_out, const float *logits, ptrdiff_t ld,
                      int T, int V) {
  struct kn_cuda_ctx *c = ctx;
  struct id_val_result r;
  int err = result_begin(c, (size_t)T, &r);
  if (err) return err;
  KN_CUDA_RUN(c, kn_cuda_launch_argmax(c->stream, r.ids_d, r.vals_d, logits, ld, T, V));
  if ((err = keep_ids(c, r.ids_d, sizeof(int32_t), T))) return err;
  return result_end(c, &r, ids, max_out);
}

int kn_cuda_op_router_topk(void *ctx, int32_t *ids, float *weights, const float *logits,
                           ptrdiff_t ld, int T, int E, int k, const float *expert_scale) {
  struct kn_cuda_ctx *c = ctx;
  if (E > KN_CUDA_TOPK_MAX_E) {
    cm_debug("cuda", "router_topk: %d experts (at most %d)", E, KN_CUDA_TOPK_MAX_E);
    return CM_ERR_UNSUPPORTED;
  }
  struct id_val_result r;
  int err = result_begin(c, (size_t)T * (size_t)k, &r);
  if (err) return err;
  KN_CUDA_CHECK(
      kn_cuda_launch_router_topk(c->stream, r.ids_d, r.vals_d, logits, ld, T, E, k, expert_scale));
  return result_end(c, &r, ids, weights);
}

/* ---- sampling ---------------------------------------------------------------- */

/* the penalty arrays staged right after the row descriptors stay aligned */
_Static_assert(sizeof(struct kn_cuda_sample_row) % 8 == 0, "row descriptors of 8-byte multiples");

static int penalised(const struct kn_sample_params *p) {
  return p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f ||
         p->presence_penalty != 0.0f;
}

/* Penalty entries of the penalised rows that kn_sample stages (ids in [0, V)). */
static size_t count_penalties(const struct kn_sample_params *p, int T, int V) {
  size_t n = 0;
  for (int t = 0; t < T; t++)
    if (penalised(&p[t]))
      for (int j = 0; j < p[t].n_pen; j++)
        n += p[t].pen_ids[j] >= 0 && p[t].pen_ids[j] < V;
  return n;
}

/* The device's view of row t, its penalty entries appended at ids / counts
 * from *k on (advancing *k). */
static void fill_row(const struct kn_sample_params *p, int V, struct kn_cuda_sample_row *r,
                     int32_t *ids, int32_t *counts, size_t *k) {
  memset(r, 0, sizeof(*r));
  r->inv_t = p->temperature < 1e-5f ? 0.0f : 1.0f / p->temperature;
  r->log_min_p = p->min_p > 0 ? logf(p->min_p) : -INFINITY;
  r->top_p = p->top_p;
  r->top_k = p->top_k > 0 && p->top_k < V ? p->top_k : 0;
  r->n_logprobs = p->n_logprobs < 0 ? -1 : p->n_logprobs;
  r->presence = p->presence_penalty;
  r->frequency = p->frequency_penalty;
  r->repetition = p->repetition_penalty;
  r->seed = p->seed;
  r->counter = p->counter;
  r->pen_off = (int32_t)*k;
  r->mask_off = -1;
  if (penalised(p))
    for (int j = 0; j < p->n_pen; j++)
      if (p->pen_ids[j] >= 0 && p->pen_ids[j] < V) {
        ids[*k] = p->pen_ids[j];
        counts[(*k)++] = p->pen_counts[j];
      }
  r->n_pen = (int32_t)*k - r->pen_off;
}

/* 1 when mask (words of V bits) allows a token of [0, V). */
static int allows_any(const uint32_t *mask, int V) {
  for (int w = 0; w < V / 32; w++)
    if (mask[w]) return 1;
  return V % 32 && (mask[V / 32] & ((1u << (V % 32)) - 1));
}

int kn_cuda_op_sample_masks(void *ctx) {
  return ((struct kn_cuda_ctx *)ctx)->mask_ok;
}

int kn_cuda_op_sample(void *ctx, struct kn_sample_out *out, const float *logits, ptrdiff_t ld,
                      int T, int V, const struct kn_sample_params *params) {
  struct kn_cuda_ctx *c = ctx;
  const size_t words = ((size_t)V + 31) / 32;
  size_t n_mask = 0;
  for (int t = 0; t < T; t++)
    if (params[t].allow) {
      if (!c->mask_ok) return CM_ERR_UNSUPPORTED;               /* the host masks the row */
      if (!allows_any(params[t].allow, V)) return CM_ERR_INVAL; /* as on the CPU */
      n_mask++;
    }
  /* one staging reservation: the row descriptors, the penalty ids and counts, the
   * masks */
  size_t n_pen = count_penalties(params, T, V);
  size_t rows_bytes = (size_t)T * sizeof(struct kn_cuda_sample_row);
  size_t pen_bytes = 2 * n_pen * sizeof(int32_t);
  size_t bytes = rows_bytes + pen_bytes + n_mask * words * sizeof(uint32_t);
  void *h, *d;
  int err = kn_cuda_graph_refuse(c, "kn_sample");
  if (!err) err = kn_cuda_enter(c);
  if (!err) err = kn_cuda_stage_alloc(c, bytes, &h, &d);
  if (err) return err;
  struct kn_cuda_sample_row *rows = h;
  int32_t *ids = (int32_t *)((unsigned char *)h + rows_bytes), *counts = ids + n_pen;
  uint32_t *masks = (uint32_t *)((unsigned char *)h + rows_bytes + pen_bytes);
  size_t k = 0, m = 0;
  for (int t = 0; t < T; t++) {
    fill_row(&params[t], V, &rows[t], ids, counts, &k);
    if (params[t].allow) {
      rows[t].mask_off = (int32_t)(m * words);
      memcpy(masks + m++ * words, params[t].allow, words * sizeof(uint32_t));
    }
  }
  if ((err = kn_cuda_stage_push(c, h, d, bytes))) return err;
  const struct kn_cuda_sample_row *rows_d = d;
  int32_t *pen_ids_d = n_pen ? (int32_t *)((unsigned char *)d + rows_bytes) : NULL;
  int32_t *pen_counts_d = n_pen ? pen_ids_d + n_pen : NULL;
  const uint32_t *masks_d =
      n_mask ? (const uint32_t *)((unsigned char *)d + rows_bytes + pen_bytes) : NULL;

  /* scratch: the results, then (with penalties or masks) a copy of the rows to
   * process */
  size_t out_bytes = ((size_t)T * sizeof(struct kn_sample_out) + 255) / 256 * 256;
  size_t work_bytes = pen_ids_d || masks_d ? (size_t)T * (size_t)V * sizeof(float) : 0;
  void *dev, *host;
  if ((err = kn_cuda_scratch(c, out_bytes + work_bytes, &dev))) return err;
  if ((err = kn_cuda_result_host(c, (size_t)T * sizeof(struct kn_sample_out), &host))) return err;
  struct kn_sample_out *out_d = dev;
  float *work = (float *)logits;
  ptrdiff_t ldw = ld;
  if (work_bytes) {
    work = (float *)((unsigned char *)dev + out_bytes);
    ldw = V;
    KN_CUDA_CHECK(cudaMemcpy2DAsync(
        work, (size_t)V * sizeof(float), logits, (size_t)(T == 1 ? V : ld) * sizeof(float),
        (size_t)V * sizeof(float), (size_t)T, cudaMemcpyDeviceToDevice, c->stream));
  }
  KN_CUDA_RUN(c, kn_cuda_launch_sample(c->stream, out_d, logits, ld, work, ldw, T, V, rows_d,
                                       pen_ids_d, pen_counts_d, masks_d));
  if ((err = keep_ids(c, &out_d->token, sizeof(struct kn_sample_out), T))) return err;
  KN_CUDA_CHECK(cudaMemcpyAsync(host, out_d, (size_t)T * sizeof(struct kn_sample_out),
                                cudaMemcpyDeviceToHost, c->stream));
  KN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
  memcpy(out, host, (size_t)T * sizeof(struct kn_sample_out));
  for (int t = 0; t < T; t++)
    if (out[t].token < 0) {
      cm_debug("cuda", "sample: row %d has nothing finite to sample from", t);
      return CM_ERR_INVAL;
    }
  return 0;
}
