/* wk-tower.c — what the encoder towers share: their state, weight binding,
 * the clippable linear and the scratch KV pages (wk-tower.h). */
#include "worker/wk-tower.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/cm-err.h"
#include "kernels/kn-dtype.h"
#include "kernels/kn-quant.h"
#include "model/md-safetensors.h"
#include "worker/wk-owned.h"

void wk_tower_free(struct wk_tower *t) {
  if (!t) return;
  wk_owned_free(&t->owned, t->be);
  cm_arena_free(&t->host);
  md_st_close(t->st);
  free(t);
}

int wk_tower_load(const struct wk_tower_kind *k, const char *dir, struct kn_backend *be,
                  const void *opts, struct wk_tower **out, char *err, size_t errlen) {
  *out = NULL;
  if (!dir || !be)
    return cm_fail(err, errlen, CM_ERR_INVAL, "%s: no directory or backend", k->what);
  struct wk_tower *t = calloc(1, k->size);
  if (!t) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  t->be = be;
  cm_arena_init(&t->host, 64u << 10, 0);
  int rc = md_config_load(dir, &t->cfg, err, errlen);
  t->text_hidden = t->cfg.hidden;
  if (rc || (rc = k->setup(t, dir, opts, err, errlen)) ||
      (rc = k->mmproj && t->cfg.gguf ? md_st_open_mmproj(dir, &t->st, err, errlen)
                                     : md_st_open_dir(dir, &t->st, err, errlen)) ||
      (rc = k->bind(t, err, errlen)) || (rc = k->scratch(t, err, errlen))) {
    wk_tower_free(t);
    return rc;
  }
  *out = t;
  return 0;
}

void *wk_tower_alloc(struct wk_tower *t, size_t bytes) {
  return wk_owned_alloc(&t->owned, t->be, bytes);
}

int wk_tower_floats(struct wk_tower *t, size_t n, float **const *bufs, size_t count) {
  for (size_t i = 0; i < count; i++)
    if (!(*bufs[i] = wk_tower_alloc(t, n * sizeof(float)))) return CM_ERR_NOMEM;
  return 0;
}

int wk_tower_ints(struct wk_tower *t, size_t n, int32_t **const *bufs, size_t count) {
  for (size_t i = 0; i < count; i++)
    if (!(*bufs[i] = cm_arena_alloc(&t->host, n * sizeof(int32_t)))) return CM_ERR_NOMEM;
  return 0;
}

int wk_tower_prefix(const struct md_st *st, const char *const *prefixes, int n, const char *probe) {
  for (int i = 0; i < n; i++) {
    char name[256];
    snprintf(name, sizeof(name), "%s%s", prefixes[i], probe);
    if (md_st_find(st, name)) return i;
  }
  return -1;
}

struct wk_tower_binder wk_tower_bind(struct wk_tower *t, const char *what, char *err,
                                     size_t errlen) {
  return (struct wk_tower_binder){
      .be = t->be, .owned = &t->owned, .st = t->st, .what = what, .err = err, .errlen = errlen};
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *dims) {
  size_t l = 0;
  buf[0] = 0;
  for (int i = 0; i < ndim && l < n; i++)
    l += (size_t)snprintf(buf + l, n - l, "%s%lld", i ? ", " : "", (long long)dims[i]);
}

/* The tensor `name` with exactly the dims given, in a float dtype or, with
 * blocks, in a block format, its rows whole blocks: one be has kernels for
 * (blocks 1), or any (2: read on the host, wk_tower_row). */
static const struct md_tensor *tensor_of(struct wk_tower_binder *b, const char *name, int ndim,
                                         const int64_t *dims, int blocks) {
  if (b->rc) return NULL;
  const struct md_tensor *t = md_st_find(b->st, name);
  if (!t) {
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_NOENT, "%s: tensor %s missing", b->what, name);
    return NULL;
  }
  int ok = t->ndim == ndim;
  for (int i = 0; ok && i < ndim; i++)
    ok = t->shape[i] == dims[i];
  if (!ok) {
    char want[96], got[96];
    shape_str(want, sizeof(want), ndim, dims);
    shape_str(got, sizeof(got), t->ndim, t->shape);
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_SHAPE,
                    "%s: tensor %s has shape [%s], the config says [%s]", b->what, name, got, want);
    return NULL;
  }
  if (blocks && t->dtype >= MD_ST_Q8_0 && t->dtype <= MD_ST_Q2_K) {
    const enum kn_dtype dt = wk_weight_dtype(t);
    int be = kn_block_elems(dt);
    const unsigned need =
        KN_CAP_BLOCK_WEIGHTS | (kn_dtype_lowbit(dt) ? (unsigned)KN_CAP_BLOCK_LOWBIT : 0u);
    if ((blocks == 1 && !kn_backend_has(b->be, need)) || dims[ndim - 1] % be) {
      b->rc = cm_fail(b->err, b->errlen, CM_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s, and %s",
                      b->what, name, t->dtype_name,
                      dims[ndim - 1] % be ? "its rows are not whole blocks"
                                          : "this backend has no kernels for block formats");
      return NULL;
    }
    return t;
  }
  if (t->dtype != MD_ST_F32 && t->dtype != MD_ST_F16 && t->dtype != MD_ST_BF16) {
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_UNSUPPORTED,
                    "%s: tensor %s has dtype %s (F32, F16, BF16%s are supported)", b->what, name,
                    t->dtype_name, blocks ? " and ggml's block formats" : "");
    return NULL;
  }
  return t;
}

const struct md_tensor *wk_tower_tensor(struct wk_tower_binder *b, const char *name, int ndim,
                                        const int64_t *dims) {
  return tensor_of(b, name, ndim, dims, 0);
}

const struct md_tensor *wk_tower_matrix(struct wk_tower_binder *b, const char *name, int64_t rows,
                                        int64_t cols, int host) {
  return tensor_of(b, name, 2, (const int64_t[]){rows, cols}, host ? 2 : 1);
}

void wk_tower_row(const struct md_tensor *t, int64_t r, int64_t K, float *dst) {
  enum kn_dtype dt = wk_weight_dtype(t);
  if (kn_block_elems(dt)) {
    kn_dequant_row(dt, (const uint8_t *)t->data + (size_t)r * kn_row_bytes(dt, (size_t)K), dst,
                   (size_t)K);
    return;
  }
  for (int64_t k = 0; k < K; k++)
    dst[k] = kn_load_f32(t->data, dt, (size_t)(r * K + k));
}

const void *wk_tower_place(struct wk_tower_binder *b, const void *data, size_t bytes, int copy) {
  if (b->rc) return NULL;
  if (!copy && kn_backend_has(b->be, KN_CAP_HOST_MEMORY)) return data;
  void *p = wk_owned_alloc(b->owned, b->be, bytes);
  if (!p || kn_upload(b->be, p, data, bytes)) {
    b->rc = cm_fail(b->err, b->errlen, p ? CM_ERR_DEVICE : CM_ERR_NOMEM,
                    "%s: cannot place %zu bytes of weights", b->what, bytes);
    return NULL;
  }
  return p;
}

const float *wk_tower_f32(struct wk_tower_binder *b, int ndim, const int64_t *dims,
                          const char *name) {
  const struct md_tensor *t = wk_tower_tensor(b, name, ndim, dims);
  if (!t) return NULL;
  size_t n = t->nbytes / md_st_dtype_size(t->dtype);
  float *host = malloc(sizeof(float) * (n ? n : 1));
  if (!host) {
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_NOMEM, "out of memory for %s", name);
    return NULL;
  }
  for (size_t i = 0; i < n; i++)
    host[i] = kn_load_f32(t->data, (enum kn_dtype)t->dtype, i);
  const float *p = wk_tower_place(b, host, n * sizeof(float), 1);
  free(host);
  return p;
}

const float *wk_tower_vec(struct wk_tower_binder *b, int64_t n, const char *fmt, ...) {
  char name[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof(name), fmt, ap);
  va_end(ap);
  return wk_tower_f32(b, 1, (const int64_t[]){n}, name);
}

struct wk_clin wk_tower_linear(struct wk_tower_binder *b, int64_t rows, int64_t cols,
                               const char *name) {
  struct wk_clin m = {
      .in_lo = -INFINITY, .in_hi = INFINITY, .out_lo = -INFINITY, .out_hi = INFINITY};
  const struct md_tensor *t = wk_tower_matrix(b, name, rows, cols, 0);
  if (!t) return m;
  m.dt = wk_weight_dtype(t);
  m.w = wk_tower_place(b, t->data, t->nbytes, 0);
  return m;
}

/* One clip bound: PREFIX.KEY, a tensor of one float. */
static float bound(struct wk_tower_binder *b, const char *prefix, const char *key) {
  char name[256];
  snprintf(name, sizeof(name), "%s.%s", prefix, key);
  if (b->rc) return 0.0f;
  const struct md_tensor *t = md_st_find(b->st, name);
  if (!t) {
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_NOENT, "%s: tensor %s missing (use_clipped_linears)",
                    b->what, name);
    return 0.0f;
  }
  size_t esz = md_st_dtype_size(t->dtype);
  if ((t->dtype != MD_ST_F32 && t->dtype != MD_ST_F16 && t->dtype != MD_ST_BF16) ||
      t->nbytes != esz || t->ndim > 1) {
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_SHAPE,
                    "%s: tensor %s is not one float (a %s tensor of %zu bytes)", b->what, name,
                    t->dtype_name, t->nbytes);
    return 0.0f;
  }
  float f = kn_load_f32(t->data, (enum kn_dtype)t->dtype, 0);
  if (isnan(f)) b->rc = cm_fail(b->err, b->errlen, CM_ERR_RANGE, "%s: %s is NaN", b->what, name);
  return f;
}

struct wk_clin wk_tower_clin(struct wk_tower_binder *b, int64_t rows, int64_t cols, int clipped,
                             const char *fmt, ...) {
  char prefix[224], name[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof(prefix), fmt, ap);
  va_end(ap);
  snprintf(name, sizeof(name), "%s.linear.weight", prefix);
  struct wk_clin m = wk_tower_linear(b, rows, cols, name);
  if (!clipped || b->rc) return m;
  m.in_lo = bound(b, prefix, "input_min");
  m.in_hi = bound(b, prefix, "input_max");
  m.out_lo = bound(b, prefix, "output_min");
  m.out_hi = bound(b, prefix, "output_max");
  if (!b->rc && (m.in_lo > m.in_hi || m.out_lo > m.out_hi))
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_RANGE,
                    "%s: %s's clip bounds are crossed (input [%g, %g], output [%g, %g])", b->what,
                    prefix, m.in_lo, m.in_hi, m.out_lo, m.out_hi);
  return m;
}

int wk_clin_run(struct kn_backend *be, float *scratch, float *out, const float *in,
                const struct wk_clin *m, int T, int N, int K) {
  int rc;
  if (isfinite(m->in_lo) || isfinite(m->in_hi)) {
    if ((rc = kn_clamp(be, scratch, in, m->in_lo, m->in_hi, (size_t)T * (size_t)K))) return rc;
    in = scratch;
  }
  if ((rc = kn_matmul(be, out, N, in, K, m->w, m->dt, T, N, K, 0))) return rc;
  if (isfinite(m->out_lo) || isfinite(m->out_hi))
    rc = kn_clamp(be, out, out, m->out_lo, m->out_hi, (size_t)T * (size_t)N);
  return rc;
}

int wk_tower_kv_alloc(struct wk_tower *t, struct wk_tower_kv *kv, int n_pages, int block_tokens,
                      int n_kv_heads, int head_dim, size_t max_rows, int max_seqs) {
  /* one layer's K (or V) per page */
  size_t half = (size_t)block_tokens * (size_t)n_kv_heads * (size_t)head_dim * sizeof(float);
  kv->view = (struct kn_kv_view){.page_bytes = 2 * half,
                                 .n_pages = n_pages,
                                 .k_off = 0,
                                 .v_off = half,
                                 .block_tokens = block_tokens,
                                 .n_kv_heads = n_kv_heads,
                                 .head_dim = head_dim,
                                 .dtype = KN_DTYPE_F32};
  kv->block_tables = cm_arena_alloc(&t->host, sizeof(int32_t) * (size_t)n_pages);
  kv->slots = cm_arena_alloc(&t->host, sizeof(int32_t) * max_rows);
  kv->bidir = cm_arena_alloc(&t->host, sizeof(int32_t) * 2 * (size_t)max_seqs);
  kv->seqs = cm_arena_calloc(&t->host, (size_t)max_seqs, sizeof(*kv->seqs));
  kv->view.pool = wk_tower_alloc(t, (size_t)n_pages * kv->view.page_bytes);
  if (!kv->block_tables || !kv->slots || !kv->bidir || !kv->seqs || !kv->view.pool)
    return CM_ERR_NOMEM;
  for (int i = 0; i < n_pages; i++)
    kv->block_tables[i] = i;
  return 0;
}

int wk_tower_kv_seq(struct wk_tower_kv *kv, int i, int row0, int n, int page0) {
  int bt = kv->view.block_tokens, pages = (n + bt - 1) / bt;
  for (int p = 0; p < n; p++)
    kv->slots[row0 + p] = page0 * bt + p;
  kv->bidir[2 * i] = 0;
  kv->bidir[2 * i + 1] = n;
  kv->seqs[i] = (struct kn_attn_seq){.q_begin = row0,
                                     .n_q = n,
                                     .pos0 = 0,
                                     .block_table = kv->block_tables + page0,
                                     .n_blocks = pages,
                                     .bidir = kv->bidir + 2 * i,
                                     .n_bidir = 1};
  return pages;
}
