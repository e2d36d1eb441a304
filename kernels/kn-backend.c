/* kn-backend.c — the public kernel API: argument validation shared by every
 * backend, then a call through the backend's ops table.
 *
 * Everything that input can make wrong (sizes, strides, dtypes, token ids,
 * slot mappings, block tables, bidirectional ranges) is checked here and
 * returned as a negative cm_err, so backends only see valid calls. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-log.h"
#include "common/cm-time.h"
#include "kernels/kn-backend-impl.h"
#include "kernels/kn-quant.h"

/* ---- $LMSERVE_OP_PROFILE ----------------------------------------------------
 * Where a step's time goes, op by op. With LMSERVE_OP_PROFILE=1 every op
 * waits for its backend (ops->sync) before it returns, its time is summed
 * under its name, and the time between ops (the caller's host work, memory
 * hooks) under "(between ops)", gaps of 0.1 s or more left out as idle; the
 * table goes to stderr when the backend is destroyed. The waits serialise
 * host and device: the sum is the step as it would run with no overlap,
 * which finds the op or the host gap that dominates. With
 * LMSERVE_OP_PROFILE=host nothing waits: the times are what each call costs
 * the host (a device backend's launch overhead). Off (one pointer test per
 * op) unless set. */
#define KN_PROF_OPS 64
struct kn_op_profile {
  int host_only; /* LMSERVE_OP_PROFILE=host: no waits */
  double t0, last_end, between;
  long n_between;
  int n;
  struct {
    const char *name;
    long calls;
    double s;
  } op[KN_PROF_OPS];
};

void kn__prof_begin(struct kn_backend *be) {
  be->prof->t0 = cm_time_s();
}

int kn__prof_end(struct kn_backend *be, const char *name, int rc) {
  struct kn_op_profile *p = be->prof;
  if (!p->host_only && be->ops->sync) {
    int err = be->ops->sync(be->ctx); /* an asynchronous failure of the op surfaces here */
    if (!rc) rc = err;
  }
  double now = cm_time_s();
  int i = 0;
  while (i < p->n && strcmp(p->op[i].name, name))
    i++;
  if (i == p->n && p->n < KN_PROF_OPS) p->op[p->n++].name = name;
  if (i < p->n) {
    p->op[i].calls++;
    p->op[i].s += now - p->t0;
  }
  if (p->last_end > 0 && p->t0 - p->last_end < 0.1) { /* longer: idle (loading, waiting) */
    p->between += p->t0 - p->last_end;
    p->n_between++;
  }
  p->last_end = now;
  return rc;
}

static void prof_print(const struct kn_backend *be) {
  const struct kn_op_profile *p = be->prof;
  double total = p->between;
  for (int i = 0; i < p->n; i++)
    total += p->op[i].s;
  fprintf(stderr, "op profile (%s backend, %s): %.3f s\n", be->ops->name,
          p->host_only ? "host time of each call, not waited for" : "each op waited for", total);
  fprintf(stderr, "  %-22s %9s %11s %10s %6s\n", "op", "calls", "total ms", "mean us", "share");
  int done[KN_PROF_OPS] = {0};
  for (int k = 0; k < p->n; k++) { /* by time, largest first */
    int b = -1;
    for (int i = 0; i < p->n; i++)
      if (!done[i] && (b < 0 || p->op[i].s > p->op[b].s)) b = i;
    done[b] = 1;
    fprintf(stderr, "  %-22s %9ld %11.3f %10.2f %5.1f%%\n", p->op[b].name, p->op[b].calls,
            p->op[b].s * 1e3, p->op[b].s * 1e6 / (double)p->op[b].calls,
            total > 0 ? 100 * p->op[b].s / total : 0);
  }
  fprintf(stderr, "  %-22s %9ld %11.3f %10.2f %5.1f%%\n", "(between ops)", p->n_between,
          p->between * 1e3, p->n_between ? p->between * 1e6 / (double)p->n_between : 0,
          total > 0 ? 100 * p->between / total : 0);
}

struct kn_backend *kn_backend_wrap(const struct kn_backend_ops *ops, void *ctx) {
  struct kn_backend *be = calloc(1, sizeof(*be));
  if (!be) return NULL;
  be->ops = ops;
  be->caps = ops->caps;
  be->ctx = ctx;
  if (!ops->kept_ids && !(be->kept = malloc(sizeof(int32_t) * KN_KEPT_IDS_MAX))) {
    free(be);
    return NULL;
  }
  const char *e = getenv("LMSERVE_OP_PROFILE");
  if (e && *e && strcmp(e, "0") && (be->prof = calloc(1, sizeof(*be->prof)))) /* NULL: none */
    be->prof->host_only = !strcmp(e, "host");
  return be;
}

void kn_backend_destroy(struct kn_backend *be) {
  if (!be) return;
  if (be->prof) prof_print(be);
  if (be->ops->destroy) be->ops->destroy(be->ctx);
  free(be->prof);
  free(be->kept);
  free(be);
}

const char *kn_backend_name(const struct kn_backend *be) {
  return be ? be->ops->name : "none";
}

const char *kn_backend_matmul_inputs(const struct kn_backend *be) {
  return be && be->ops->matmul_inputs ? be->ops->matmul_inputs(be->ctx) : "f32";
}

unsigned kn_backend_caps(const struct kn_backend *be) {
  return be ? be->caps : 0;
}

int kn_backend_has(const struct kn_backend *be, unsigned caps) {
  return be && (be->caps & caps) == caps;
}

/* ---- memory ------------------------------------------------------------- */

void *kn_alloc(struct kn_backend *be, size_t bytes) {
  if (!be || bytes == 0) return NULL;
  return be->ops->alloc(be->ctx, bytes);
}

void kn_free(struct kn_backend *be, void *p) {
  if (be && p) be->ops->free(be->ctx, p);
}

int kn_upload(struct kn_backend *be, void *dst, const void *src, size_t bytes) {
  if (!be || (bytes && (!dst || !src))) return CM_ERR_INVAL;
  return bytes ? KN_CALL(upload, dst, src, bytes) : 0;
}

int kn_download(struct kn_backend *be, void *dst, const void *src, size_t bytes) {
  if (!be || (bytes && (!dst || !src))) return CM_ERR_INVAL;
  return bytes ? KN_CALL(download, dst, src, bytes) : 0;
}

int kn_copy(struct kn_backend *be, void *dst, const void *src, size_t bytes) {
  if (!be || (bytes && (!dst || !src))) return CM_ERR_INVAL;
  return bytes ? KN_CALL(copy, dst, src, bytes) : 0;
}

int kn_memset(struct kn_backend *be, void *dst, int c, size_t bytes) {
  if (!be || (bytes && !dst)) return CM_ERR_INVAL;
  return bytes ? KN_CALL(memset, dst, c, bytes) : 0;
}

int kn_sync(struct kn_backend *be) {
  if (!be) return CM_ERR_INVAL;
  return be->ops->sync(be->ctx);
}

int kn_mem_info(struct kn_backend *be, size_t *free_bytes, size_t *total_bytes) {
  if (!be || !free_bytes || !total_bytes) return CM_ERR_INVAL;
  return KN_CALL(mem_info, free_bytes, total_bytes);
}

int kn_weights_prepare(struct kn_backend *be, void *w, enum kn_dtype *dt, int n, int K) {
  if (!be || !dt || n < 0 || K < 0 || (n && !w)) return CM_ERR_INVAL;
  if (!be->ops->weights_prepare || !n || !K) return 0;
  return be->ops->weights_prepare(be->ctx, w, dt, n, K);
}

/* ---- step graphs ----------------------------------------------------------- */

struct kn_graph {
  void *impl; /* the backend's */
  int done;   /* the last mode that ended well: 0, KN_GRAPH_MEASURE or KN_GRAPH_CAPTURE+ */
  int mode;   /* the mode now, 0: none */
};

int kn_graph_new(struct kn_backend *be, int max_keys, struct kn_graph **out) {
  if (!be || !out || max_keys < 1) return CM_ERR_INVAL;
  *out = NULL;
  if (!be->ops->graph_new) return CM_ERR_UNSUPPORTED;
  struct kn_graph *g = calloc(1, sizeof(*g));
  if (!g) return CM_ERR_NOMEM;
  int err = be->ops->graph_new(be->ctx, max_keys, &g->impl);
  if (err) {
    free(g);
    return err;
  }
  *out = g;
  return 0;
}

int kn_graph_begin(struct kn_backend *be, struct kn_graph *g, enum kn_graph_mode mode) {
  if (!be || !g || g->mode) return CM_ERR_INVAL;
  /* measure first, capture after a measure, replay after a capture */
  int ok = mode == KN_GRAPH_MEASURE || (mode == KN_GRAPH_CAPTURE && g->done == KN_GRAPH_MEASURE) ||
           (mode == KN_GRAPH_REPLAY && g->done >= KN_GRAPH_CAPTURE);
  if (!ok) return CM_ERR_INVAL;
  int err = be->ops->graph_begin(be->ctx, g->impl, (int)mode);
  if (!err) g->mode = (int)mode;
  return err;
}

int kn_graph_end(struct kn_backend *be, struct kn_graph *g, int ok) {
  if (!be || !g || !g->mode) return CM_ERR_INVAL;
  int mode = g->mode;
  g->mode = 0;
  int err = be->ops->graph_end(be->ctx, g->impl, ok);
  if (ok && !err && mode != KN_GRAPH_REPLAY) g->done = mode;
  if ((!ok || err) && mode == KN_GRAPH_CAPTURE) g->done = KN_GRAPH_MEASURE; /* dropped */
  return err;
}

void kn_graph_free(struct kn_backend *be, struct kn_graph *g) {
  if (!be || !g) return;
  if (g->mode) (void)kn_graph_end(be, g, 0);
  be->ops->graph_free(be->ctx, g->impl);
  free(g);
}

/* ---- validation helpers ------------------------------------------------- */

/* ---- collectives ---------------------------------------------------------- */

int kn_comm_id_new(struct kn_backend *be, struct kn_comm_id *id) {
  if (!be || !id) return CM_ERR_INVAL;
  memset(id, 0, sizeof(*id));
  return KN_CALL(comm_id_new, id);
}

int kn_comm_join(struct kn_backend *be, const struct kn_comm_id *id, int rank, int world,
                 int timeout_ms) {
  if (!be || world < 1 || rank < 0 || rank >= world || timeout_ms < 1) return CM_ERR_INVAL;
  if (be->comm_world) return CM_ERR_STATE; /* one group per backend */
  if (world == 1) {
    be->comm_world = 1;
    return 0;
  }
  if (!id) return CM_ERR_INVAL;
  int rc = KN_CALL(comm_join, id, rank, world, timeout_ms);
  if (!rc) be->comm_world = world;
  return rc;
}

int kn_comm_world(const struct kn_backend *be) {
  return be && be->comm_world > 1 ? be->comm_world : 1;
}

int kn_all_reduce_sum(struct kn_backend *be, float *buf, size_t n) {
  if (!be) return CM_ERR_INVAL;
  if (n == 0 || kn_comm_world(be) == 1) return 0;
  if (!buf) return CM_ERR_INVAL;
  return KN_CALL(all_reduce_sum, buf, n);
}

int kn_all_gather(struct kn_backend *be, const void *mine, size_t bytes, void *all) {
  if (!be) return CM_ERR_INVAL;
  if (bytes == 0) return 0;
  if (!mine || !all) return CM_ERR_INVAL;
  if (kn_comm_world(be) == 1) return kn_copy(be, all, mine, bytes);
  return KN_CALL(all_gather, mine, bytes, all);
}

/* ---- dense ops ---------------------------------------------------------- */

int kn_embed(struct kn_backend *be, float *out, ptrdiff_t ldo, const void *table, enum kn_dtype tdt,
             int vocab, int H, const int32_t *ids, int T, float scale) {
  if (!be || T < 0 || H < 0 || vocab < 0) return CM_ERR_INVAL;
  if (T == 0 || H == 0) return 0;
  if (!out || !table || !ids || !kn__valid_ld(ldo, T, H)) return CM_ERR_INVAL;
  int derr = kn__check_matmul_dtype(be, tdt, H);
  if (derr) return derr;
  for (int t = 0; t < T; t++) {
    if (ids[t] < -1 || ids[t] >= vocab) {
      cm_debug("kn", "embed: token id %d outside [0, %d)", (int)ids[t], vocab);
      return CM_ERR_RANGE;
    }
  }
  return kn__embed_rows(be, out, ldo, table, tdt, vocab, H, ids, T, scale);
}

int kn__embed_rows(struct kn_backend *be, float *out, ptrdiff_t ldo, const void *table,
                   enum kn_dtype tdt, int vocab, int H, const int32_t *ids, int T, float scale) {
  if (!kn_dtype_x16(tdt)) return KN_CALL(embed, out, ldo, table, tdt, H, ids, T, scale);
  const size_t rb = kn_row_bytes(tdt, (size_t)H);
  uint8_t *rows = malloc(rb * (size_t)T);
  int32_t *at = malloc(sizeof(int32_t) * (size_t)T);
  int rc = rows && at ? 0 : CM_ERR_NOMEM;
  for (int t = 0; t < T && !rc; t++) {
    at[t] = ids[t] < 0 ? -1 : t;
    if (ids[t] >= 0) kn_x16_row(tdt, table, vocab, H, ids[t], rows + (size_t)t * rb);
  }
  if (!rc) rc = KN_CALL(embed, out, ldo, rows, kn_dtype_rows_of(tdt), H, at, T, scale);
  free(rows);
  free(at);
  return rc;
}

int kn_rmsnorm(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
               int rows, int d, const void *w, enum kn_dtype wdt, float eps,
               enum kn_norm_mode mode) {
  if (!be || rows < 0 || d < 0) return CM_ERR_INVAL;
  if (rows == 0 || d == 0) return 0;
  if (!out || !x || !kn__valid_ld(ldo, rows, d) || !kn__valid_ld(ldx, rows, d)) return CM_ERR_INVAL;
  if (mode != KN_NORM_MUL_W && mode != KN_NORM_MUL_ONE_PLUS_W && mode != KN_NORM_NO_W)
    return CM_ERR_INVAL;
  if (mode != KN_NORM_NO_W) {
    if (!w) return CM_ERR_INVAL;
    if (!kn__valid_weight_dtype(wdt)) return CM_ERR_UNSUPPORTED;
  }
  if (!(eps >= 0.0f)) return CM_ERR_INVAL;
  return KN_CALL(rmsnorm, out, ldo, x, ldx, rows, d, w, wdt, eps, mode);
}

int kn_matmul(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
              const void *w, enum kn_dtype wdt, int T, int N, int K, int accumulate) {
  if (!be || T < 0 || N < 0 || K < 0) return CM_ERR_INVAL;
  if (T == 0 || N == 0) return 0;
  if (!out || !kn__valid_ld(ldo, T, N)) return CM_ERR_INVAL;
  if (K > 0 && (!in || !w || !kn__valid_ld(ldi, T, K))) return CM_ERR_INVAL;
  int derr = kn__check_matmul_dtype(be, wdt, K);
  if (derr) return derr;
  return KN_CALL(matmul, out, ldo, in, ldi, w, wdt, T, N, K, accumulate);
}

int kn_matmul_softcap(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *in,
                      ptrdiff_t ldi, const void *w, enum kn_dtype wdt, int T, int N, int K,
                      float cap) {
  if (!be || T < 0 || N < 0 || K < 0 || !(cap > 0.0f)) return CM_ERR_INVAL;
  if (T == 0 || N == 0) return 0;
  if (!out || !kn__valid_ld(ldo, T, N)) return CM_ERR_INVAL;
  if (K > 0 && (!in || !w || !kn__valid_ld(ldi, T, K))) return CM_ERR_INVAL;
  int derr = kn__check_matmul_dtype(be, wdt, K);
  if (derr) return derr;
  if (be->ops->matmul_softcap)
    return KN_CALL(matmul_softcap, out, ldo, in, ldi, w, wdt, T, N, K, cap);
  int rc = KN_CALL(matmul, out, ldo, in, ldi, w, wdt, T, N, K, 0);
  if (rc) return rc;
  if (ldo == N) return KN_CALL(softcap, out, out, cap, (size_t)T * (size_t)N);
  for (int t = 0; t < T && !rc; t++)
    rc = KN_CALL(softcap, out + (ptrdiff_t)t * ldo, out + (ptrdiff_t)t * ldo, cap, (size_t)N);
  return rc;
}

int kn_matmul_argmax(struct kn_backend *be, int32_t *ids, float *max_out, const float *in,
                     ptrdiff_t ldi, const void *w, enum kn_dtype wdt, int T, int N, int K,
                     float cap, float *scratch) {
  if (be) be->n_kept = 0; /* kept again only by a call that succeeds */
  if (!be || T < 0 || N <= 0 || K < 0 || !(cap >= 0.0f)) return CM_ERR_INVAL;
  if (T == 0) return 0;
  if (!ids || (K > 0 && (!in || !w || !kn__valid_ld(ldi, T, K)))) return CM_ERR_INVAL;
  int derr = kn__check_matmul_dtype(be, wdt, K);
  if (derr) return derr;
  if (be->ops->matmul_argmax) { /* CM_ERR_UNSUPPORTED (a block format it has not): scratch */
    int rc = KN_CALL(matmul_argmax, ids, max_out, in, ldi, w, wdt, T, N, K, cap);
    if (rc != CM_ERR_UNSUPPORTED) {
      kn__keep_ids(be, rc, ids, sizeof(*ids), T);
      return rc;
    }
  }
  if (!scratch) return CM_ERR_INVAL;
  int rc = cap > 0.0f ? kn_matmul_softcap(be, scratch, N, in, ldi, w, wdt, T, N, K, cap)
                      : kn_matmul(be, scratch, N, in, ldi, w, wdt, T, N, K, 0);
  return rc ? rc : kn_argmax(be, ids, max_out, scratch, N, T, N);
}

int kn_matmul_argmax_masked(struct kn_backend *be, int32_t *ids, float *max_out, const float *in,
                            ptrdiff_t ldi, const void *w, enum kn_dtype wdt, int T, int N, int K,
                            float cap, const uint32_t *const *allow) {
  if (be) be->n_kept = 0; /* kept again only by a call that succeeds */
  if (!be || T < 0 || N <= 0 || K <= 0 || !(cap >= 0.0f)) return CM_ERR_INVAL;
  if (T == 0) return 0;
  if (!ids || !allow || !in || !w || !kn__valid_ld(ldi, T, K)) return CM_ERR_INVAL;
  int derr = kn__check_matmul_dtype(be, wdt, K);
  if (derr) return derr;
  if (!be->ops->matmul_argmax_masked) return CM_ERR_UNSUPPORTED;
  int rc = KN_CALL(matmul_argmax_masked, ids, max_out, in, ldi, w, wdt, T, N, K, cap, allow);
  kn__keep_ids(be, rc, ids, sizeof(*ids), T);
  return rc;
}

int kn_matmul_rows(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                   const void *w, enum kn_dtype wdt, int n_w, int K, const int32_t *rows,
                   int n_rows, int T) {
  if (!be || T < 0 || n_rows < 0 || K < 0 || n_w < 0) return CM_ERR_INVAL;
  if (T == 0 || n_rows == 0) return 0;
  if (!out || !rows || !kn__valid_ld(ldo, T, n_rows)) return CM_ERR_INVAL;
  if (K > 0 && (!in || !w || !kn__valid_ld(ldi, T, K))) return CM_ERR_INVAL;
  if (!kn__valid_weight_dtype(wdt)) return CM_ERR_UNSUPPORTED;
  for (int j = 0; j < n_rows; j++)
    if (rows[j] < 0 || rows[j] >= n_w) return CM_ERR_RANGE;
  return KN_CALL(matmul_rows, out, ldo, in, ldi, w, wdt, K, rows, n_rows, T);
}

int kn_rope(struct kn_backend *be, float *x, ptrdiff_t ldx, int T, int heads, int D,
            const int32_t *pos, const float *inv_freq) {
  if (!be || T < 0 || heads < 0 || D < 0 || (D & 1)) return CM_ERR_INVAL;
  if (T == 0 || heads == 0 || D == 0) return 0;
  if (!x || !pos || !inv_freq || !kn__valid_ld(ldx, T, heads * D)) return CM_ERR_INVAL;
  for (int t = 0; t < T; t++)
    if (pos[t] < 0) return CM_ERR_RANGE;
  return KN_CALL(rope, x, ldx, T, heads, D, pos, inv_freq);
}

int kn_gelu_mul(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *gate, ptrdiff_t ldg,
                const float *up, ptrdiff_t ldu, int T, int N) {
  if (!be || T < 0 || N < 0) return CM_ERR_INVAL;
  if (T == 0 || N == 0) return 0;
  if (!out || !gate || !up) return CM_ERR_INVAL;
  if (!kn__valid_ld(ldo, T, N) || !kn__valid_ld(ldg, T, N) || !kn__valid_ld(ldu, T, N))
    return CM_ERR_INVAL;
  return KN_CALL(gelu_mul, out, ldo, gate, ldg, up, ldu, T, N);
}

int kn_add(struct kn_backend *be, float *out, const float *a, const float *b, size_t n) {
  if (!be || (n && (!out || !a || !b))) return CM_ERR_INVAL;
  return n ? KN_CALL(add, out, a, b, n) : 0;
}

int kn_mul(struct kn_backend *be, float *out, const float *a, const float *b, size_t n) {
  if (!be || (n && (!out || !a || !b))) return CM_ERR_INVAL;
  return n ? KN_CALL(mul, out, a, b, n) : 0;
}

int kn_scale(struct kn_backend *be, float *out, const float *a, float s, size_t n) {
  if (!be || (n && (!out || !a))) return CM_ERR_INVAL;
  return n ? KN_CALL(scale, out, a, s, n) : 0;
}

int kn_softcap(struct kn_backend *be, float *out, const float *a, float cap, size_t n) {
  if (!be || (n && (!out || !a)) || !(cap > 0.0f)) return CM_ERR_INVAL;
  return n ? KN_CALL(softcap, out, a, cap, n) : 0;
}

int kn_copy_rows(struct kn_backend *be, float *dst, ptrdiff_t ldd, const float *src, ptrdiff_t lds,
                 int rows, int cols) {
  if (!be || rows < 0 || cols < 0) return CM_ERR_INVAL;
  if (rows == 0 || cols == 0) return 0;
  if (!dst || !src || !kn__valid_ld(ldd, rows, cols) || !kn__valid_ld(lds, rows, cols))
    return CM_ERR_INVAL;
  return KN_CALL(copy_rows, dst, ldd, src, lds, rows, cols);
}

/* ---- vision encoder ops --------------------------------------------------- */

int kn_layernorm(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                 int rows, int d, const void *w, const void *b, enum kn_dtype wdt, float eps) {
  if (!be || rows < 0 || d < 0) return CM_ERR_INVAL;
  if (rows == 0 || d == 0) return 0;
  if (!out || !x || !w || !b || !kn__valid_ld(ldo, rows, d) || !kn__valid_ld(ldx, rows, d))
    return CM_ERR_INVAL;
  if (!kn__valid_weight_dtype(wdt)) return CM_ERR_UNSUPPORTED;
  if (!(eps >= 0.0f)) return CM_ERR_INVAL;
  return KN_CALL(layernorm, out, ldo, x, ldx, rows, d, w, b, wdt, eps);
}

int kn_bias_act(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                const float *bias, int T, int N, enum kn_act act) {
  if (!be || T < 0 || N < 0) return CM_ERR_INVAL;
  if (act < KN_ACT_NONE || act > KN_ACT_SIGMOID) return CM_ERR_INVAL;
  if (T == 0 || N == 0) return 0;
  if (!out || !x || !kn__valid_ld(ldo, T, N) || !kn__valid_ld(ldx, T, N)) return CM_ERR_INVAL;
  if (!bias && act == KN_ACT_NONE) return out == x ? 0 : kn_copy_rows(be, out, ldo, x, ldx, T, N);
  return KN_CALL(bias_act, out, ldo, x, ldx, bias, T, N, act);
}

int kn_avg_pool2d(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                  int n_img, int side, int k, int C) {
  if (!be || n_img < 0 || side < 0 || k < 1 || C < 0) return CM_ERR_INVAL;
  if (n_img == 0 || C == 0) return 0;
  if (side < k) return CM_ERR_SHAPE;
  long long in_rows = (long long)n_img * side * side;
  long long os = side / k, out_rows = (long long)n_img * os * os;
  if (in_rows > INT32_MAX) return CM_ERR_TOOBIG;
  if (!out || !x || !kn__valid_ld(ldx, (int)in_rows, C) || !kn__valid_ld(ldo, (int)out_rows, C))
    return CM_ERR_INVAL;
  return KN_CALL(avg_pool2d, out, ldo, x, ldx, n_img, side, k, C);
}

int kn_clamp(struct kn_backend *be, float *out, const float *a, float lo, float hi, size_t n) {
  if (!be || (n && (!out || !a)) || isnan(lo) || isnan(hi) || lo > hi) return CM_ERR_INVAL;
  return n ? KN_CALL(clamp, out, a, lo, hi, n) : 0;
}

int kn_avg_pool_grid(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *x,
                     ptrdiff_t ldx, int gw, int gh, int k, int C, float scale) {
  if (!be || gw < 0 || gh < 0 || k < 1 || C < 0 || !isfinite(scale)) return CM_ERR_INVAL;
  if (gw == 0 || gh == 0 || C == 0) return 0;
  if (gw % k || gh % k) return CM_ERR_SHAPE;
  long long in_rows = (long long)gw * gh;
  if (in_rows > INT32_MAX) return CM_ERR_TOOBIG;
  int out_rows = (int)(in_rows / ((long long)k * k));
  if (!out || !x || !kn__valid_ld(ldx, (int)in_rows, C) || !kn__valid_ld(ldo, out_rows, C))
    return CM_ERR_INVAL;
  return KN_CALL(avg_pool_grid, out, ldo, x, ldx, gw, gh, k, C, scale);
}

int kn_standardize(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx,
                   int rows, int d, const float *bias, const float *scale) {
  if (!be || rows < 0 || d < 0) return CM_ERR_INVAL;
  if (rows == 0 || d == 0) return 0;
  if (!out || !x || !bias || !scale || !kn__valid_ld(ldo, rows, d) || !kn__valid_ld(ldx, rows, d))
    return CM_ERR_INVAL;
  return KN_CALL(standardize, out, ldo, x, ldx, rows, d, bias, scale);
}

int kn_argmax(struct kn_backend *be, int32_t *ids, float *max_out, const float *logits,
              ptrdiff_t ld, int T, int V) {
  if (be) be->n_kept = 0; /* kept again only by a call that succeeds */
  if (!be || T < 0 || V < 0) return CM_ERR_INVAL;
  if (T == 0) return 0;
  if (V == 0 || !ids || !logits || !kn__valid_ld(ld, T, V)) return CM_ERR_INVAL;
  int rc = KN_CALL(argmax, ids, max_out, logits, ld, T, V);
  kn__keep_ids(be, rc, ids, sizeof(*ids), T);
  return rc;
}

int kn_router_topk(struct kn_backend *be, int32_t *ids, float *weights, const float *logits,
                   ptrdiff_t ld, int T, int E, int k, const float *expert_scale) {
  if (!be || T < 0 || E <= 0 || k < 1 || k > E) return CM_ERR_INVAL;
  if (T == 0) return 0;
  if (!ids || !weights || !logits || !kn__valid_ld(ld, T, E)) return CM_ERR_INVAL;
  return KN_CALL(router_topk, ids, weights, logits, ld, T, E, k, expert_scale);
}

/* ---- sampling ------------------------------------------------------------- */

void kn_sample_params_default(struct kn_sample_params *p) {
  memset(p, 0, sizeof(*p));
  p->temperature = 1.0f;
  p->top_p = 1.0f;
  p->repetition_penalty = 1.0f;
  p->n_logprobs = -1;
}

int kn_sample_params_check(const struct kn_sample_params *p) {
  if (!p || !(p->temperature >= 0) || !(p->top_p > 0 && p->top_p <= 1) ||
      !(p->min_p >= 0 && p->min_p <= 1) || !(p->repetition_penalty > 0) ||
      p->n_logprobs > KN_SAMPLE_MAX_LOGPROBS || p->n_pen < 0 ||
      (p->n_pen > 0 && (!p->pen_ids || !p->pen_counts)) || p->n_bias < 0 ||
      (p->n_bias > 0 && (!p->bias_ids || !p->bias)) ||
      (p->bias_only && (p->n_bias < 1 || p->n_bias > KN_SAMPLE_MAX_BIAS)))
    return CM_ERR_INVAL;
  return 0;
}

int kn_sample_is_argmax(const struct kn_sample_params *p) {
  return !kn_sample_params_check(p) && p->temperature < 1e-5f && p->repetition_penalty == 1.0f &&
         p->frequency_penalty == 0.0f && p->presence_penalty == 0.0f && p->n_logprobs < 0 &&
         !p->allow && p->n_bias == 0;
}

int kn_sample_takes_bias(struct kn_backend *be) {
  return be && be->ops->sample && kn_backend_has(be, KN_CAP_HOST_MEMORY);
}

int kn_sample_takes_masks(struct kn_backend *be) {
  if (!be || !be->ops->sample) return 0;
  return be->ops->sample_masks ? be->ops->sample_masks(be->ctx)
                               : kn_backend_has(be, KN_CAP_HOST_MEMORY);
}

int kn_sample(struct kn_backend *be, struct kn_sample_out *out, const float *logits, ptrdiff_t ld,
              int T, int V, const struct kn_sample_params *params) {
  if (be) be->n_kept = 0; /* kept again only by a call that succeeds */
  if (!be || T < 0 || V <= 0) return CM_ERR_INVAL;
  if (T == 0) return 0;
  if (!out || !logits || !params || !kn__valid_ld(ld, T, V)) return CM_ERR_INVAL;
  for (int t = 0; t < T; t++) {
    if (kn_sample_params_check(&params[t])) return CM_ERR_INVAL;
    if (params[t].n_bias && !kn_sample_takes_bias(be)) return CM_ERR_UNSUPPORTED;
  }
  int rc = KN_CALL(sample, out, logits, ld, T, V, params);
  kn__keep_ids(be, rc, &out->token, sizeof(*out), T);
  return rc;
}

/* ---- KV cache and attention --------------------------------------------- */

static int valid_view(const struct kn_kv_view *v) {
  if (!v || !v->pool || v->n_pages <= 0 || v->block_tokens <= 0 || v->n_kv_heads <= 0)
    return CM_ERR_INVAL;
  if (v->head_dim <= 0 || v->head_dim > KN_MAX_HEAD_DIM) return CM_ERR_UNSUPPORTED;
  if (v->dtype != KN_DTYPE_F32 && v->dtype != KN_DTYPE_BF16 && v->dtype != KN_DTYPE_F8E4M3)
    return CM_ERR_UNSUPPORTED;
  if ((v->k_scale || v->v_scale) && v->dtype != KN_DTYPE_F8E4M3) return CM_ERR_INVAL;
  /* one layer's K (and V) block must fit inside a page */
  size_t blk = (size_t)v->block_tokens * (size_t)v->n_kv_heads * (size_t)v->head_dim *
               kn_dtype_size(v->dtype);
  if (v->k_off > v->page_bytes || v->page_bytes - v->k_off < blk) return CM_ERR_INVAL;
  if (v->v_off > v->page_bytes || v->page_bytes - v->v_off < blk) return CM_ERR_INVAL;
  return 0;
}

int kn__check_kv_write(const struct kn_kv_view *view, const int32_t *slot_mapping, const float *k,
                       ptrdiff_t ldk, const float *v, ptrdiff_t ldv, int T) {
  if (T < 0) return CM_ERR_INVAL;
  int err = valid_view(view);
  if (err || T == 0) return err;
  int row = view->n_kv_heads * view->head_dim;
  if (!slot_mapping || !k || !kn__valid_ld(ldk, T, row)) return CM_ERR_INVAL;
  if (v && !kn__valid_ld(ldv, T, row)) return CM_ERR_INVAL;
  long long n_slots = (long long)view->n_pages * view->block_tokens;
  for (int t = 0; t < T; t++) {
    if (slot_mapping[t] >= n_slots) {
      cm_debug("kn", "kv_write: slot %d outside the pool (%lld slots)", (int)slot_mapping[t],
               n_slots);
      return CM_ERR_RANGE;
    }
  }
  return 0;
}

int kn_kv_write(struct kn_backend *be, const struct kn_kv_view *view, const int32_t *slot_mapping,
                const float *k, ptrdiff_t ldk, const float *v, ptrdiff_t ldv, int T) {
  if (!be) return CM_ERR_INVAL;
  int err = kn__check_kv_write(view, slot_mapping, k, ldk, v, ldv, T);
  if (err || T == 0) return err;
  return KN_CALL(kv_write, view, slot_mapping, k, ldk, v, ldv, T);
}

/* Checks one sequence of an attention call: its rows, and that every block
 * some query of it can see holds a page of the pool. */
static int check_attn_seq(const struct kn_attn_seq *s, const struct kn_kv_view *view, int window) {
  if (s->q_begin < 0 || s->n_q < 0 || s->pos0 < 0) return CM_ERR_INVAL;
  if (s->n_q == 0) return 0;
  if ((long long)s->pos0 + s->n_q > INT32_MAX) return CM_ERR_RANGE;
  if ((long long)s->q_begin + s->n_q > INT32_MAX) return CM_ERR_RANGE;
  if (s->n_blocks < 0 || (s->n_blocks > 0 && !s->block_table)) return CM_ERR_INVAL;
  if (s->n_bidir < 0 || (s->n_bidir > 0 && !s->bidir)) return CM_ERR_INVAL;
  long long lo = (long long)s->pos0 - (window > 0 ? window - 1 : s->pos0);
  long long hi = (long long)s->pos0 + s->n_q - 1; /* inclusive */
  if (lo < 0) lo = 0;
  for (int r = 0; r < s->n_bidir; r++) {
    long long b = s->bidir[2 * r], e = s->bidir[2 * r + 1];
    if (b < 0 || e < b) return CM_ERR_INVAL;
    if (b == e) continue;
    /* a range matters only if some query of the chunk lies inside it */
    if (e - 1 < s->pos0 || b > hi) continue;
    if (b < lo) lo = b;
    if (e - 1 > hi) hi = e - 1;
  }
  long long bt = view->block_tokens;
  for (long long blk = lo / bt; blk <= hi / bt; blk++) {
    if (blk >= s->n_blocks) return CM_ERR_RANGE;
    int32_t page = s->block_table[blk];
    if (page < 0 || page >= view->n_pages) {
      cm_debug("kn", "attention: block %lld holds page %d (pool has %d)", blk, (int)page,
               view->n_pages);
      return CM_ERR_RANGE;
    }
  }
  return 0;
}

int kn_attention(struct kn_backend *be, float *out, ptrdiff_t ldo, const float *q, ptrdiff_t ldq,
                 const struct kn_kv_view *view, const struct kn_attn_seq *seqs, int n_seqs,
                 int n_heads, int window, float scale, float softcap) {
  if (!be || n_seqs < 0 || n_heads <= 0 || window < 0) return CM_ERR_INVAL;
  int err = valid_view(view);
  if (err) return err;
  if (n_seqs == 0) return 0;
  if (!out || !q || !seqs) return CM_ERR_INVAL;
  if (n_heads % view->n_kv_heads) return CM_ERR_SHAPE;
  if (!(softcap >= 0.0f) || scale != scale) return CM_ERR_INVAL;
  int row = n_heads * view->head_dim;
  int rows = 0;
  for (int i = 0; i < n_seqs; i++) {
    err = check_attn_seq(&seqs[i], view, window);
    if (err) return err;
    if (seqs[i].n_q > 0 && seqs[i].q_begin + seqs[i].n_q > rows)
      rows = seqs[i].q_begin + seqs[i].n_q;
  }
  if (rows == 0) return 0;
  if (!kn__valid_ld(ldo, rows, row) || !kn__valid_ld(ldq, rows, row)) return CM_ERR_INVAL;
  return KN_CALL(attention, out, ldo, q, ldq, view, seqs, n_seqs, n_heads, window, scale, softcap);
}
