/* wk-model.c — loading a checkpoint onto a backend: binding and checking
 * every tensor the forward pass reads, RoPE tables, the physical KV pool and
 * the scratch buffers (sized once here; the forward pass allocates nothing). */
#include "worker/wk-model.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-log.h"
#include "kernels/kn-quant.h"
#include "worker/wk-model-impl.h"

struct binder {
  struct wk_model *m;
  char *err;
  size_t errlen;
  int rc;
  enum { W_ANY, W_LINEAR, W_EMBED, W_EXPERTS } role; /* what the matrix being bound is (bind_as) */
  int mat;    /* binding a matrix (bind_mat): it may be in a block format (GGUF) */
  int quant;  /* --quantization fp8: linear weights quantized to FP8 as they are bound */
  int blockq; /* --quantization q8_0|q4_0|q4_k: the block format (enum kn_dtype) linear weights
                 and the embedding / head are quantized to as they are bound; 0: none */
};

#define WK_MAX_PAGES (INT32_MAX / 4096) /* pages a KV pool may have */

/* Host memory that lives as long as the model (from m->host). */
static void *host_alloc(struct wk_model *m, size_t bytes) {
  return cm_arena_alloc(&m->host, bytes);
}

static void *host_calloc(struct wk_model *m, size_t n, size_t size) {
  return cm_arena_calloc(&m->host, n, size);
}

void *wk_model_alloc(struct wk_model *m, size_t bytes) {
  return wk_owned_alloc(&m->owned, m->be, bytes);
}

/* Weights in host memory. A decode step streams every weight once, and from
 * the checkpoint's page cache (4 KiB pages) it walks the page tables every
 * 4 KiB; so by default the weights are copied into one reservation of
 * anonymous memory with transparent huge pages asked for, each tensor on a
 * 64-byte line (BENCHMARKS.md, "Weights in huge pages"). The reservation is
 * the checkpoint's size: what a tensor-parallel rank leaves unused is never
 * touched. After loading it turns read-only. */
static int arena_reserve(struct wk_model *m) {
  size_t want = (size_t)md_st_data_bytes(m->st) + (size_t)64 * (size_t)md_st_count(m->st);
  return cm_huge_map(want, &m->arena.mem);
}

/* Memory for bytes of this rank's weights: the arena's next line, or backend
 * memory (a device backend, weights left in the mapping, or past the arena). */
static void *weight_alloc(struct wk_model *m, size_t bytes) {
  struct wk_arena *a = &m->arena;
  size_t at = (a->used + 63) & ~(size_t)63;
  if (!a->mem.base || at > a->mem.len || bytes > a->mem.len - at) return wk_model_alloc(m, bytes);
  a->used = at + bytes;
  return a->mem.base + at;
}

/* Counts bytes of the checkpoint read; every tenth of a big one is a line. */
static void load_progress(struct wk_model *m, size_t bytes) {
  struct wk_load_progress *lp = &m->progress;
  lp->done += bytes;
  if (!lp->loud || lp->done < lp->next) return;
  fprintf(stderr, "lmserve: loading %s: %3d%% (%.2f / %.2f GB)\n", m->dir,
          (int)(100.0 * (double)lp->done / (double)lp->total), (double)lp->done / 1e9,
          (double)lp->total / 1e9);
  lp->next = lp->done + lp->total / 10;
}

/* Backend-resident copy of checkpoint bytes (the mapping itself where backend
 * memory is the host's and the weights stay in the page cache). A copy into
 * the arena is queued for copy_weights. */
static const void *place(struct wk_model *m, const void *data, size_t bytes) {
  struct wk_arena *a = &m->arena;
  if (kn_backend_has(m->be, KN_CAP_HOST_MEMORY) && !a->mem.base) return data;
  void *p = weight_alloc(m, bytes);
  if (!p) return NULL;
  if (a->mem.base) {
    if (a->n_todo == a->cap_todo) {
      int nc = a->cap_todo ? 2 * a->cap_todo : 256;
      struct wk_copy *nt = realloc(a->todo, sizeof(*nt) * (size_t)nc);
      if (!nt) return NULL;
      a->todo = nt;
      a->cap_todo = nc;
    }
    a->todo[a->n_todo++] = (struct wk_copy){p, data, bytes};
    return p;
  }
  if (kn_upload(m->be, p, data, bytes)) return NULL;
  load_progress(m, bytes);
  return p;
}

/* The queued copies, in pieces of COPY_PIECE bytes that threads take in turn:
 * most of a copy's time is the kernel zeroing the new huge pages on first
 * touch, which runs in parallel like the copy itself. */
#define COPY_PIECE       ((size_t)4 << 20)
#define COPY_MAX_THREADS 16

struct copy_run {
  struct md_st *st; /* the mapped files, whose pages each piece lets go of */
  const struct wk_copy *todo;
  int n_todo;
  atomic_size_t next;  /* the next piece, numbered over every copy */
  atomic_size_t bytes; /* bytes copied */
  size_t n_pieces;
};

/* Pieces a copy of bytes takes (an empty copy takes one, of no bytes). */
static size_t pieces_of(size_t bytes) {
  return bytes ? (bytes + COPY_PIECE - 1) / COPY_PIECE : 1;
}

/* Copies the pieces taken from run->next; 1 when none was left. */
static int copy_some(struct copy_run *run, int *job, size_t *first) {
  size_t piece = atomic_fetch_add(&run->next, 1);
  if (piece >= run->n_pieces) return 1;
  /* pieces are numbered in copy order and taken in increasing order, so each
   * thread finds its copy by walking forward from where it last was */
  while (*job < run->n_todo) {
    size_t n = pieces_of(run->todo[*job].bytes);
    if (piece < *first + n) break;
    *first += n;
    (*job)++;
  }
  const struct wk_copy *c = &run->todo[*job];
  size_t off = (piece - *first) * COPY_PIECE;
  size_t len = c->bytes - off < COPY_PIECE ? c->bytes - off : COPY_PIECE;
  memcpy((unsigned char *)c->dst + off, (const unsigned char *)c->src + off, len);
  md_st_drop_range(run->st, (const unsigned char *)c->src + off, len); /* peak: not file + copy */
  atomic_fetch_add(&run->bytes, len);
  return 0;
}

static void *copy_thread(void *arg) {
  struct copy_run *run = arg;
  int job = 0;
  size_t first = 0;
  while (!copy_some(run, &job, &first)) {
  }
  return NULL;
}

static void copy_weights(struct wk_model *m) {
  struct wk_arena *a = &m->arena;
  struct copy_run run = {.st = m->st, .todo = a->todo, .n_todo = a->n_todo};
  for (int i = 0; i < a->n_todo; i++)
    run.n_pieces += pieces_of(a->todo[i].bytes);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  size_t n_threads = cores > 1 ? (size_t)cores : 1;
  if (n_threads > COPY_MAX_THREADS) n_threads = COPY_MAX_THREADS;
  if (n_threads > run.n_pieces) n_threads = run.n_pieces ? run.n_pieces : 1;
  pthread_t th[COPY_MAX_THREADS];
  size_t started = 0;
  while (started + 1 < n_threads && !pthread_create(&th[started], NULL, copy_thread, &run))
    started++;
  int job = 0;
  size_t first = 0, reported = 0;
  while (!copy_some(&run, &job, &first)) { /* this thread copies too, and reports */
    size_t done = atomic_load(&run.bytes);
    load_progress(m, done - reported);
    reported = done;
  }
  for (size_t i = 0; i < started; i++)
    pthread_join(th[i], NULL);
  free(a->todo);
  a->todo = NULL;
  a->n_todo = a->cap_todo = 0;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
  size_t len = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < ndim && len < n; d++)
    len += (size_t)snprintf(buf + len, n - len, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (len < n) snprintf(buf + len, n - len, "]");
}

/* Looks a tensor up and checks its shape (d2 < 0: 2-D, d1 < 0: 1-D). */
static const struct md_tensor *lookup(struct binder *b, int required, int64_t d0, int64_t d1,
                                      int64_t d2, const char *name) {
  if (b->rc) return NULL;
  const struct md_tensor *t = md_st_find(b->m->st, name);
  if (!t) {
    if (required)
      b->rc = cm_fail(b->err, b->errlen, CM_ERR_NOENT, "%s: tensor %s missing", b->m->dir, name);
    return NULL;
  }
  int64_t want[3] = {d0, d1, d2};
  int nd = d1 < 0 ? 1 : d2 < 0 ? 2 : 3;
  int ok = t->ndim == nd;
  for (int d = 0; ok && d < nd; d++)
    ok = t->shape[d] == want[d];
  if (!ok) {
    char got[96], exp[96];
    shape_str(got, sizeof(got), t->ndim, t->shape);
    shape_str(exp, sizeof(exp), nd, want);
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_SHAPE, "%s: tensor %s has shape %s, expected %s",
                    t->file, name, got, exp);
    return NULL;
  }
  if (t->dtype != MD_ST_F32 && t->dtype != MD_ST_F16 && t->dtype != MD_ST_BF16 &&
      !(t->dtype == MD_ST_F8E4M3 && b->role == W_LINEAR) && !(t->dtype >= MD_ST_Q8_0 && b->mat)) {
    b->rc =
        cm_fail(b->err, b->errlen, CM_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s (%s)", t->file,
                name, t->dtype_name,
                b->role == W_LINEAR ? "supported: F32, F16, BF16, F8_E4M3"
                                    : "supported: F32, F16, BF16; F8_E4M3 only for linear layers");
    return NULL;
  }
  return t;
}

/* The part of a weight a rank binds: n rows (WK_SHARD_ROWS) or columns (COLS) from
 * off; halves = 2 for a stack of two row blocks split alike (the experts' fused
 * gate_up: gate rows [off, off + n) and up rows [I + off, I + off + n)). n = 0: all. */
struct cut {
  int off, n, halves;
};

/* The row of the full [R, C] matrix that row r of this rank's row cut is:
 * with halves = 2 the cut takes its rows from both halves alike. */
static int cut_row(struct cut cut, int R, int r) {
  return (r / cut.n) * (R / cut.halves) + cut.off + r % cut.n;
}

/* This rank's [n_mat, rows, cols] slice of a [n_mat, R, C] tensor, gathered into new
 * backend memory (a column slice, or rows from both halves, are not contiguous). */
static const void *gather(struct binder *b, const struct md_tensor *t, enum wk_shard shard,
                          struct cut cut, int n_mat, int R, int C) {
  enum kn_dtype dt = wk_weight_dtype(t);
  int rows = shard == WK_SHARD_ROWS ? cut.n * cut.halves : R;
  int cols = shard == WK_SHARD_COLS ? cut.n : C;
  /* rows of block formats are cut along whole blocks (bind_mat checked it) */
  size_t row_bytes = kn_row_bytes(dt, (size_t)cols), full = kn_row_bytes(dt, (size_t)C);
  size_t col0 = shard == WK_SHARD_COLS ? kn_row_bytes(dt, (size_t)cut.off) : 0;
  size_t bytes = (size_t)n_mat * (size_t)rows * row_bytes;
  unsigned char *host = malloc(bytes ? bytes : 1);
  if (!host) return NULL;
  const unsigned char *src = t->data;
  for (int e = 0; e < n_mat; e++)
    for (int r = 0; r < rows; r++) {
      int sr = shard == WK_SHARD_ROWS ? cut_row(cut, R, r) : r;
      memcpy(host + ((size_t)e * rows + (size_t)r) * row_bytes,
             src + ((size_t)e * R + (size_t)sr) * full + col0, row_bytes);
    }
  void *p = weight_alloc(b->m, bytes);
  if (p && kn_upload(b->m->be, p, host, bytes)) p = NULL;
  load_progress(b->m, bytes);
  free(host);
  return p;
}

/* n scales from tensor t (named name) into out: its elements off .. off + n - 1 when
 * `each`, else its one element n times; CM_ERR_RANGE at the first that is not finite
 * and positive. */
static int positive_scales(const struct md_tensor *t, const char *name, int each, int off, int n,
                           float *out, char *err, size_t errlen) {
  for (int i = 0; i < n; i++) {
    float v = kn_load_f32(t->data, wk_weight_dtype(t), each ? (size_t)(off + i) : 0);
    if (!(v > 0.0f) || !isfinite(v))
      return cm_fail(err, errlen, CM_ERR_RANGE, "%s: %s[%d] is %g (scales must be positive)",
                     t->file, name, each ? off + i : 0, (double)v);
    out[i] = v;
  }
  return 0;
}

/* The per-feature scales of FP8 checkpoint weight t (its "...weight_scale":
 * [R, 1], [R], [1] or a scalar, f32 / bf16 / f16, every one finite and
 * positive) for rows [off, off + rows) into scale. */
static int fp8_scales(struct binder *b, const struct md_tensor *t, int R, int off, int rows,
                      float *scale, const char *name) {
  char sname[272];
  size_t n = strlen(name);
  if (n < 6 || strcmp(name + n - 6, "weight"))
    return cm_fail(b->err, b->errlen, CM_ERR_UNSUPPORTED, "%s: FP8 tensor %s is not a weight",
                   t->file, name);
  snprintf(sname, sizeof(sname), "%s_scale", name);
  const struct md_tensor *s = md_st_find(b->m->st, sname);
  if (!s)
    return cm_fail(b->err, b->errlen, CM_ERR_NOENT, "%s: FP8 tensor %s has no %s", t->file, name,
                   sname);
  int64_t count = 1;
  for (int d = 0; d < s->ndim; d++)
    count *= s->shape[d];
  int per_row = count == R && (s->ndim == 1 || (s->ndim == 2 && s->shape[1] == 1));
  int per_tensor = count == 1 && s->ndim <= 2;
  if ((!per_row && !per_tensor) ||
      (s->dtype != MD_ST_F32 && s->dtype != MD_ST_BF16 && s->dtype != MD_ST_F16)) {
    char got[96];
    shape_str(got, sizeof(got), s->ndim, s->shape);
    return cm_fail(b->err, b->errlen, CM_ERR_SHAPE,
                   "%s: %s has shape %s and dtype %s (expected [%d, 1], [%d] or one value, "
                   "F32 / BF16 / F16: per-channel or per-tensor scales)",
                   s->file, sname, got, s->dtype_name, R, R);
  }
  return positive_scales(s, sname, per_row, off, rows, scale, b->err, b->errlen);
}

/* Binds linear weight t (full shape [R, C]; w's cut already set) as FP8 e4m3
 * with a scale per output feature: the checkpoint's codes and scales, or the
 * bf16 / f16 / f32 weight quantized here (kn_fp8_quantize_rows). A column
 * slice is quantized with the scales of its whole rows, so every tensor-
 * parallel cut holds the codes of the unsplit model. */
static void bind_fp8(struct binder *b, struct wk_w *w, const struct md_tensor *t, int R, int C,
                     const char *name) {
  if (w->n_mat != 1) {
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_UNSUPPORTED, "%s: %s: FP8 stacks are not supported",
                    t->file, name);
    return;
  }
  int rows = w->rows, cols = w->cols;
  int r0 = w->shard == WK_SHARD_ROWS ? w->off : 0, c0 = w->shard == WK_SHARD_COLS ? w->off : 0;
  size_t qbytes = (size_t)rows * (size_t)cols;
  uint8_t *q = malloc(qbytes ? qbytes : 1);
  float *scale = malloc(sizeof(float) * (size_t)rows), *amax = NULL;
  int rc = q && scale ? 0 : CM_ERR_NOMEM;
  if (!rc && t->dtype == MD_ST_F8E4M3) {
    for (int r = 0; r < rows; r++)
      memcpy(q + (size_t)r * (size_t)cols,
             (const uint8_t *)t->data + (size_t)(r0 + r) * (size_t)C + (size_t)c0, (size_t)cols);
    rc = fp8_scales(b, t, R, r0, rows, scale, name);
    if (rc) {
      b->rc = rc;
      goto done;
    }
  } else if (!rc) {
    enum kn_dtype dt = wk_weight_dtype(t);
    if (cols != C && !(amax = malloc(sizeof(float) * (size_t)rows))) rc = CM_ERR_NOMEM;
    for (int r = 0; !rc && amax && r < rows; r++) { /* the whole row's largest magnitude */
      float big = 0.0f;
      for (int k = 0; k < C; k++) {
        float a = fabsf(kn_load_f32(t->data, dt, (size_t)(r0 + r) * (size_t)C + (size_t)k));
        big = a > big || a != a ? a : big;
      }
      amax[r] = big;
    }
    const char *src =
        (const char *)t->data + ((size_t)r0 * (size_t)C + (size_t)c0) * kn_dtype_size(dt);
    if (!rc && kn_fp8_quantize_rows(q, scale, src, dt, C, rows, cols, amax)) {
      b->rc = cm_fail(b->err, b->errlen, CM_ERR_RANGE,
                      "%s: %s holds a value that is not finite: it cannot be quantized to FP8",
                      t->file, name);
      goto done;
    }
  }
  void *qd = rc ? NULL : weight_alloc(b->m, qbytes);
  float *sd = rc ? NULL : wk_model_alloc(b->m, sizeof(float) * (size_t)rows);
  if (!qd || !sd || kn_upload(b->m->be, qd, q, qbytes) ||
      kn_upload(b->m->be, sd, scale, sizeof(float) * (size_t)rows)) {
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_NOMEM, "out of memory placing %s as FP8", name);
    goto done;
  }
  w->p = qd;
  w->scale = sd;
  w->dt = KN_DTYPE_F8E4M3;
  b->m->weight_bytes += qbytes + sizeof(float) * (size_t)rows;
  load_progress(b->m, (size_t)rows * (size_t)cols * kn_dtype_size(wk_weight_dtype(t)));
done:
  free(q);
  free(scale);
  free(amax);
}

/* bind_mat of a weight in role r. W_LINEAR, a linear layer's weight [d0, d1]:
 * stored as FP8 in the checkpoint, or quantized to FP8 here under
 * --quantization fp8. W_EMBED, the embedding or the head. W_EXPERTS, a stack
 * of MoE expert matrices (FP8 leaves them as they are). All three are
 * quantized to a block format under --quantization q8_0|q4_0|q4_k, as lmserve
 * quantize writes them. */
#define bind_as(b, r, ...)                                                                         \
  do {                                                                                             \
    (b)->role = (r);                                                                               \
    bind_mat((b), __VA_ARGS__);                                                                    \
    (b)->role = W_ANY;                                                                             \
  } while (0)

/* Binds matrix t (full shape [R, C]; w's cut already set) quantized here to
 * block format q (--quantization q8_0|q4_0|q4_k), row by row as lmserve
 * quantize writes it (kn_quantize_row). A tensor-parallel column cut falls on
 * whole blocks of q (bind_mat picks q so). */
static void bind_block(struct binder *b, struct wk_w *w, const struct md_tensor *t, enum kn_dtype q,
                       struct cut cut, int R, int C, const char *name) {
  int be = kn_block_elems(q), rows = w->rows, cols = w->cols;
  int c0 = w->shard == WK_SHARD_COLS ? w->off : 0;
  if (c0 % be || cols % be) {
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_UNSUPPORTED,
                    "%s: %s (%s at load) cannot be split at column %d: tensor-parallel cuts of "
                    "block formats fall on whole blocks of %d",
                    t->file, name, kn_dtype_name(q), c0 % be ? c0 : c0 + cols, be);
    return;
  }
  enum kn_dtype src = wk_weight_dtype(t);
  size_t rb = kn_row_bytes(q, (size_t)cols), n = (size_t)w->n_mat * (size_t)rows, bytes = n * rb;
  uint8_t *host = malloc(bytes ? bytes : 1);
  float *row = malloc(sizeof(float) * (size_t)cols);
  void *p = host && row ? weight_alloc(b->m, bytes) : NULL;
  for (size_t i = 0; p && i < n; i++) {
    int e = (int)(i / (size_t)rows), r = (int)(i % (size_t)rows);
    int sr = w->shard == WK_SHARD_ROWS && rows != R ? cut_row(cut, R, r) : r;
    size_t at = ((size_t)e * (size_t)R + (size_t)sr) * (size_t)C + (size_t)c0;
    for (int k = 0; k < cols; k++)
      row[k] = kn_load_f32(t->data, src, at + (size_t)k);
    CM_ASSERT(kn_quantize_row(q, row, host + i * rb, (size_t)cols) == 0);
  }
  if (!p || kn_upload(b->m->be, p, host, bytes))
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_NOMEM, "out of memory placing %s as %s", name,
                    kn_dtype_name(q));
  w->p = p;
  w->dt = q;
  b->m->weight_bytes += bytes;
  b->m->block_bytes += bytes;
  load_progress(b->m, n * (size_t)cols * kn_dtype_size(src));
  free(host);
  free(row);
}

/* Whether a matrix (or a stack of expert matrices) in a block format (GGUF)
 * can be bound here: a backend with block kernels, a tensor-parallel cut by columns along whole
 * blocks, not under --quantization fp8. */
static int block_ok(struct binder *b, const struct md_tensor *t, enum wk_shard shard,
                    struct cut cut, const char *name) {
  enum kn_dtype dt = wk_weight_dtype(t);
  int be = kn_block_elems(dt);
  if (!kn_backend_has(b->m->be, KN_CAP_BLOCK_WEIGHTS))
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_UNSUPPORTED,
                    "%s: %s is %s, and the %s backend has no kernels for block formats that "
                    "passed its check at start-up (the CPU has)",
                    t->file, name, kn_dtype_name(dt), kn_backend_name(b->m->be));
  else if (kn_dtype_lowbit(dt) && !kn_backend_has(b->m->be, KN_CAP_BLOCK_LOWBIT))
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_UNSUPPORTED,
                    "%s: %s is %s, and the %s backend has no kernels for q2_k, q3_k, iq4_nl "
                    "and iq4_xs that passed its check at start-up (the CPU has): run a file of "
                    "other types (Q4_K_M, Q4_0, Q8_0) here",
                    t->file, name, kn_dtype_name(dt), kn_backend_name(b->m->be));
  else if (b->quant && b->role == W_LINEAR)
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_INVAL,
                    "--quantization fp8: %s is already quantized (%s)", name, kn_dtype_name(dt));
  else if (shard == WK_SHARD_COLS && cut.n && (cut.off % be || cut.n % be))
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_UNSUPPORTED,
                    "%s: %s (%s) cannot be split at column %d: tensor-parallel cuts of block "
                    "formats fall on whole blocks of %d",
                    t->file, name, kn_dtype_name(dt), cut.off % be ? cut.off : cut.off + cut.n, be);
  return b->rc == 0;
}

/* Binds a weight of full shape [d0, d1] (d2 < 0) or a stack [d0, d1, d2] of d0
 * matrices: this rank's cut of it under its shard rule, with its shape. */
static void bind_mat(struct binder *b, struct wk_w *w, enum wk_shard shard, struct cut cut,
                     int required, int64_t d0, int64_t d1, int64_t d2, const char *fmt, ...)
    __attribute__((format(printf, 9, 10)));
static void bind_mat(struct binder *b, struct wk_w *w, enum wk_shard shard, struct cut cut,
                     int required, int64_t d0, int64_t d1, int64_t d2, const char *fmt, ...) {
  char name[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof(name), fmt, ap);
  va_end(ap);
  b->mat = 1;
  const struct md_tensor *t = lookup(b, required, d0, d1, d2, name);
  b->mat = 0;
  *w = (struct wk_w){.shard = shard};
  if (!t) return;
  w->dt = wk_weight_dtype(t);
  if (kn_block_elems(w->dt) && !block_ok(b, t, shard, cut, name)) return;
  w->n_mat = d2 < 0 ? 1 : (int)d0;
  int R = (int)(d2 < 0 ? d0 : d1), C = (int)(d2 < 0 ? d1 : d2);
  if (cut.halves < 1) cut.halves = 1;
  int whole = shard == WK_SHARD_FULL || cut.n == 0 ||
              (shard == WK_SHARD_ROWS ? cut.n * cut.halves == R : cut.n == C);
  w->rows = whole || shard != WK_SHARD_ROWS ? R : cut.n * cut.halves;
  w->cols = whole || shard != WK_SHARD_COLS ? C : cut.n;
  w->off = whole ? 0 : cut.off;
  if (w->dt == KN_DTYPE_F8E4M3 || (b->role == W_LINEAR && b->quant)) {
    bind_fp8(b, w, t, R, C, name);
    return;
  }
  if (b->blockq && b->role != W_ANY && kn_dtype_size(w->dt) && w->dt != KN_DTYPE_F8E4M3) {
    /* the format is whole blocks of the row and of this rank's column cut: an
     * MLP's cut falls on them where it can (ffn_units); Q4_K under a cut that
     * cannot (a rank's 128 of the attention output's 512 columns) is its fallback,
     * Q5_0, as a row that is not whole 256-blocks is (a GGUF file's Q4_K cannot
     * be cut there: block_ok) */
    size_t k = (size_t)C;
    if (shard == WK_SHARD_COLS && !whole)
      k = (size_t)cm_gcd(cm_gcd(k, (size_t)w->off), (size_t)w->cols);
    enum kn_dtype q = kn_quant_row_type((enum kn_dtype)b->blockq, k);
    if (q != KN_DTYPE__COUNT) {
      bind_block(b, w, t, q, cut, R, C, name);
      return;
    }
  }
  size_t bytes = (size_t)w->n_mat * (size_t)w->rows * kn_row_bytes(w->dt, (size_t)w->cols);
  if (whole)
    w->p = place(b->m, t->data, t->nbytes);
  else if (shard == WK_SHARD_ROWS && cut.halves == 1 && w->n_mat == 1) /* contiguous rows */
    w->p = place(b->m, (const char *)t->data + (size_t)cut.off * bytes / (size_t)cut.n, bytes);
  else
    w->p = gather(b, t, shard, cut, w->n_mat, R, C);
  if (!w->p) b->rc = cm_fail(b->err, b->errlen, CM_ERR_NOMEM, "out of memory placing %s", name);
  b->m->weight_bytes += bytes;
  if (kn_block_elems(w->dt)) b->m->block_bytes += bytes;
}

/* A 1-D tensor of n elements converted to f32 in backend memory. */
static const float *bind_vec(struct binder *b, int required, int64_t n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static const float *bind_vec(struct binder *b, int required, int64_t n, const char *fmt, ...) {
  char name[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof(name), fmt, ap);
  va_end(ap);
  const struct md_tensor *t = lookup(b, required, n, -1, -1, name);
  if (!t) return NULL;
  float *host = malloc(sizeof(float) * (size_t)n);
  float *dev = wk_model_alloc(b->m, sizeof(float) * (size_t)n);
  if (!host || !dev) {
    free(host);
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_NOMEM, "out of memory for %s", name);
    return NULL;
  }
  for (int64_t i = 0; i < n; i++)
    host[i] = kn_load_f32(t->data, (enum kn_dtype)t->dtype, (size_t)i);
  if (kn_upload(b->m->be, dev, host, sizeof(float) * (size_t)n))
    b->rc = cm_fail(b->err, b->errlen, CM_ERR_DEVICE, "upload of %s failed", name);
  free(host);
  b->m->weight_bytes += t->nbytes;
  return dev;
}

static float round_to(enum kn_dtype dt, double v) {
  if (dt == KN_DTYPE_BF16) return kn_bf16_to_f32(kn_f32_to_bf16((float)v));
  if (dt == KN_DTYPE_F16) return kn_f16_to_f32(kn_f32_to_f16((float)v));
  return (float)v;
}

static int bind_all(struct wk_model *m, char *err, size_t errlen) {
  const struct md_config *c = &m->full, *lc = &m->cfg;
  const struct wk_shard_plan *sp = &m->plan;
  struct binder b = {
      .m = m, .err = err, .errlen = errlen, .quant = m->quant_fp8, .blockq = m->quant_block};
  const char *P = md_st_text_prefix(m->st);
  if (!P)
    return cm_fail(err, errlen, CM_ERR_NOENT,
                   "%s: no embed_tokens.weight under model.language_model., model. or the root",
                   m->dir);
  int H = c->hidden, L = c->n_layers, V = c->vocab;
  /* the assistant's own table is only its head, replicated so that every rank drafts the
   * same tokens from the same (all-reduced) hidden state */
  int assistant = c->arch == MD_ARCH_GEMMA4_ASSISTANT;
  struct cut vcut = assistant ? (struct cut){0} : (struct cut){sp->vocab0, sp->vocab_n, 1};
  /* an assistant's head that picks its candidates' rows (kn_matmul_rows, rows of
   * f32, f16 or bf16) stays as stored under --quantization q8_0 | q4_0 | q4_k */
  const int blockq = b.blockq;
  if (assistant && c->use_ordered_embeddings) b.blockq = 0;
  bind_as(&b, W_EMBED, &m->embed, assistant ? WK_SHARD_FULL : WK_SHARD_ROWS, vcut, 1, V, H, -1,
          "%sembed_tokens.weight", P);
  if (c->tie_embeddings) {
    m->lm_head = m->embed;
  } else {
    bind_as(&b, W_EMBED, &m->lm_head, assistant ? WK_SHARD_FULL : WK_SHARD_ROWS, vcut, 1, V, H, -1,
            "lm_head.weight");
  }
  b.blockq = blockq;
  m->final_norm = bind_vec(&b, 1, H, "%snorm.weight", P);
  if (c->ple_dim) {
    int LP = L * c->ple_dim;
    bind_mat(&b, &m->ple_embed, WK_SHARD_FULL, (struct cut){0}, 1, c->ple_vocab, LP, -1,
             "%sembed_tokens_per_layer.weight", P);
    bind_as(&b, W_LINEAR, &m->ple_model_proj, WK_SHARD_FULL, (struct cut){0}, 1, LP, H, -1,
            "%sper_layer_model_projection.weight", P);
    m->ple_proj_norm = bind_vec(&b, 1, c->ple_dim, "%sper_layer_projection_norm.weight", P);
  }
  m->layers = host_calloc(m, (size_t)L, sizeof(*m->layers));
  if (!m->layers) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  int gemma4 = c->arch != MD_ARCH_GEMMA3;
  for (int i = 0; i < L && !b.rc; i++) {
    const struct md_layer_cfg *l = &c->layers[i];
    struct wk_layer_w *w = &m->layers[i];
    int D = l->head_dim, qd = c->n_heads * D, kvd = l->n_kv_heads * D, F = l->ffn_dim;
    int lF = lc->layers[i].ffn_dim, lkv = lc->layers[i].n_kv_heads;
    struct cut kvcut = {sp->kv_head0[i] * D, lkv * D, 1}, ffcut = {sp->ffn0[i], lF, 1};
    char lp[160];
    snprintf(lp, sizeof(lp), "%slayers.%d.", P, i);
    bind_as(&b, W_LINEAR, &w->wq, WK_SHARD_ROWS, (struct cut){sp->q_head0 * D, lc->n_heads * D, 1},
            1, qd, H, -1, "%sself_attn.q_proj.weight", lp);
    bind_as(&b, W_LINEAR, &w->wo, WK_SHARD_COLS, (struct cut){sp->q_head0 * D, lc->n_heads * D, 1},
            1, H, qd, -1, "%sself_attn.o_proj.weight", lp);
    w->q_norm = bind_vec(&b, 1, D, "%sself_attn.q_norm.weight", lp);
    if (!l->kv_shared) {
      bind_as(&b, W_LINEAR, &w->wk, WK_SHARD_ROWS, kvcut, 1, kvd, H, -1,
              "%sself_attn.k_proj.weight", lp);
      if (!l->k_eq_v)
        bind_as(&b, W_LINEAR, &w->wv, WK_SHARD_ROWS, kvcut, 1, kvd, H, -1,
                "%sself_attn.v_proj.weight", lp);
      w->k_norm = bind_vec(&b, 1, D, "%sself_attn.k_norm.weight", lp);
    }
    w->in_norm = bind_vec(&b, 1, H, "%sinput_layernorm.weight", lp);
    w->post_attn_norm = bind_vec(&b, 1, H, "%spost_attention_layernorm.weight", lp);
    w->pre_ffn_norm = bind_vec(&b, 1, H, "%spre_feedforward_layernorm.weight", lp);
    w->post_ffn_norm = bind_vec(&b, 1, H, "%spost_feedforward_layernorm.weight", lp);
    bind_as(&b, W_LINEAR, &w->w_gate, WK_SHARD_ROWS, ffcut, 1, F, H, -1, "%smlp.gate_proj.weight",
            lp);
    bind_as(&b, W_LINEAR, &w->w_up, WK_SHARD_ROWS, ffcut, 1, F, H, -1, "%smlp.up_proj.weight", lp);
    bind_as(&b, W_LINEAR, &w->w_down, WK_SHARD_COLS, ffcut, 1, H, F, -1, "%smlp.down_proj.weight",
            lp);
    if (c->moe) {
      int E = c->n_experts, I = c->moe_ffn;
      bind_mat(&b, &w->router, WK_SHARD_FULL, (struct cut){0}, 1, E, H, -1, "%srouter.proj.weight",
               lp);
      w->router_scale = bind_vec(&b, 1, H, "%srouter.scale", lp);
      /* optional in a GGUF file, as llama.cpp reads it (ffn_down_exps.scale): 1 */
      w->expert_scale = bind_vec(&b, !c->gguf, E, "%srouter.per_expert_scale", lp);
      bind_as(&b, W_EXPERTS, &w->experts_gate_up, WK_SHARD_ROWS,
              (struct cut){sp->moe0, lc->moe_ffn, 2}, 1, E, 2 * I, H, "%sexperts.gate_up_proj", lp);
      bind_as(&b, W_EXPERTS, &w->experts_down, WK_SHARD_COLS,
              (struct cut){sp->moe0, lc->moe_ffn, 1}, 1, E, H, I, "%sexperts.down_proj", lp);
      w->pre_ffn_norm2 = bind_vec(&b, 1, H, "%spre_feedforward_layernorm_2.weight", lp);
      w->post_ffn_norm1 = bind_vec(&b, 1, H, "%spost_feedforward_layernorm_1.weight", lp);
      w->post_ffn_norm2 = bind_vec(&b, 1, H, "%spost_feedforward_layernorm_2.weight", lp);
    }
    if (c->ple_dim) {
      bind_as(&b, W_LINEAR, &w->ple_gate, WK_SHARD_FULL, (struct cut){0}, 1, c->ple_dim, H, -1,
              "%sper_layer_input_gate.weight", lp);
      bind_as(&b, W_LINEAR, &w->ple_proj, WK_SHARD_FULL, (struct cut){0}, 1, H, c->ple_dim, -1,
              "%sper_layer_projection.weight", lp);
      w->ple_post_norm = bind_vec(&b, 1, H, "%spost_per_layer_input_norm.weight", lp);
    }
    w->layer_scalar = 1.0f;
    if (gemma4 && !b.rc) {
      char name[200];
      snprintf(name, sizeof(name), "%slayer_scalar", lp);
      const struct md_tensor *t = lookup(&b, 0, 1, -1, -1, name);
      if (t) w->layer_scalar = kn_load_f32(t->data, (enum kn_dtype)t->dtype, 0);
    }
  }
  if (b.rc) return b.rc;
  /* GGUF files store Gemma 3's norm weights as 1 + w (llama.cpp multiplies by w) */
  m->norm_mode = gemma4 || c->gguf ? KN_NORM_MUL_W : KN_NORM_MUL_ONE_PLUS_W;
  m->embed_scale = round_to(m->embed.dt, sqrt((double)H));
  if (c->ple_dim) m->ple_embed_scale = round_to(m->ple_embed.dt, sqrt((double)c->ple_dim));
  /* bytes per decode token: every matrix once plus one row of each table */
  uint64_t erow = kn_row_bytes(m->embed.dt, (size_t)H), table = (uint64_t)m->embed.rows * erow;
  m->bytes_per_token = m->weight_bytes - table + erow;
  if (c->tie_embeddings) m->bytes_per_token += table; /* the tied head reads it all */
  if (c->ple_dim) {
    uint64_t row = kn_row_bytes(m->ple_embed.dt, (size_t)L * (size_t)c->ple_dim);
    m->bytes_per_token -= (uint64_t)c->ple_vocab * row - row;
  }
  if (c->moe)
    for (int i = 0; i < L; i++) {
      const struct wk_layer_w *w = &m->layers[i];
      uint64_t ex = (uint64_t)w->experts_gate_up.n_mat *
                    ((uint64_t)w->experts_gate_up.rows *
                         kn_row_bytes(w->experts_gate_up.dt, (size_t)w->experts_gate_up.cols) +
                     (uint64_t)w->experts_down.rows *
                         kn_row_bytes(w->experts_down.dt, (size_t)w->experts_down.cols));
      m->bytes_per_token -= ex - ex / c->n_experts * c->top_k_experts;
    }
  return 0;
}

/* inv_freq[i] = theta^(-2i/D) / factor for i < rot_pairs, else 0 (identity),
 * computed in f32 as transformers does. */
static int build_rope(struct wk_model *m) {
  for (int kind = 0; kind < 2; kind++) {
    const struct md_rope *r = &m->cfg.rope[kind];
    int D = kind == MD_LAYER_FULL ? m->cfg.global_head_dim : m->cfg.head_dim;
    float host[KN_MAX_HEAD_DIM / 2];
    for (int i = 0; i < D / 2; i++) {
      if (i < r->rot_pairs) {
        float e = (float)(2 * i) / (float)D;
        float f = 1.0f / powf((float)r->theta, e);
        host[i] = f / (float)r->factor;
      } else {
        host[i] = 0.0f;
      }
    }
    m->inv_freq[kind] = wk_model_alloc(m, sizeof(float) * (size_t)(D / 2));
    if (!m->inv_freq[kind] ||
        kn_upload(m->be, m->inv_freq[kind], host, sizeof(float) * (size_t)(D / 2)))
      return CM_ERR_NOMEM;
  }
  return 0;
}

static int alloc_scratch(struct wk_model *m) {
  const struct md_config *c = &m->cfg;
  size_t T = (size_t)m->max_T;
  int Dmax = 0, kvd = 0, F = 0;
  for (int i = 0; i < c->n_layers; i++) {
    Dmax = CM_MAX(Dmax, c->layers[i].head_dim);
    kvd = CM_MAX(kvd, c->layers[i].n_kv_heads * c->layers[i].head_dim);
    F = CM_MAX(F, c->layers[i].ffn_dim);
  }
  size_t H = (size_t)c->hidden, LP = (size_t)c->n_layers * (size_t)c->ple_dim;
  size_t f = sizeof(float);
  m->max_out = (int)CM_MIN(T, CM_MAX((size_t)1, ((size_t)64 << 20) / ((size_t)c->vocab * f)));
#define A(field, n)                                                                                \
  do {                                                                                             \
    if (!(m->field = wk_model_alloc(m, (n)*f))) return CM_ERR_NOMEM;                               \
  } while (0)
  A(x, T * H);
  A(h, T * H);
  A(o, T * H);
  A(o2, T * H);
  A(q, T * (size_t)c->n_heads * (size_t)Dmax);
  A(attn, T * (size_t)c->n_heads * (size_t)Dmax);
  A(k, T * (size_t)kvd);
  A(v, T * (size_t)kvd);
  A(gate, T * (size_t)F);
  A(up, T * (size_t)F);
  if (LP) {
    A(ple, T * LP);
    A(ple_tmp, T * LP);
    A(g_small, T * (size_t)c->ple_dim);
  }
  if (c->moe) {
    A(router_logits, T * (size_t)c->n_experts);
    A(ex_in, T * H);
    A(ex_h, T * 2 * (size_t)c->moe_ffn);
    A(ex_y, T * H);
    m->ex_count = host_alloc(m, sizeof(int) * (size_t)(c->n_experts + 1));
    m->ex_tok = host_alloc(m, sizeof(int32_t) * T * (size_t)c->top_k_experts);
    m->ex_wt = host_alloc(m, sizeof(float) * T * (size_t)c->top_k_experts);
    if (!m->ex_count || !m->ex_tok || !m->ex_wt) return CM_ERR_NOMEM;
  }
  A(sel, (size_t)m->max_out * H);
  A(logits, (size_t)m->max_out * (size_t)c->vocab);
  int world = m->plan.world;
  if (world > 1) {
    A(gathered, (size_t)m->max_out * (size_t)c->vocab);
    size_t pb = sizeof(struct wk_pair) * (size_t)m->max_out;
    if (!(m->pairs = wk_model_alloc(m, pb)) || !(m->pairs_all = wk_model_alloc(m, pb * world)))
      return CM_ERR_NOMEM;
    m->ids_local = host_alloc(m, sizeof(int32_t) * T);
    m->head_max = host_alloc(m, sizeof(float) * (size_t)m->max_out);
    m->pairs_host = host_alloc(m, pb * (size_t)(1 + world));
    size_t rb = sizeof(struct wk_tp_rec) * (size_t)m->max_out;
    if (!(m->recs = wk_model_alloc(m, rb)) || !(m->recs_all = wk_model_alloc(m, rb * world)))
      return CM_ERR_NOMEM;
    m->recs_host = host_alloc(m, rb * (size_t)(1 + world));
    m->tp_scratch = host_alloc(m, wk_tp_sample_scratch_bytes(world));
    m->tp_work = host_alloc(m, f * (size_t)m->lm_head.rows);
    m->tp_full = host_alloc(m, (size_t)m->max_out);
    if (!kn_backend_has(m->be, KN_CAP_HOST_MEMORY))
      m->head_host = host_alloc(m, f * (size_t)m->max_out * (size_t)m->lm_head.rows);
    if (!m->ids_local || !m->head_max || !m->pairs_host || !m->recs_host || !m->tp_scratch ||
        !m->tp_work || !m->tp_full || (!kn_backend_has(m->be, KN_CAP_HOST_MEMORY) && !m->head_host))
      return CM_ERR_NOMEM;
  }
#undef A
  int G = CM_MAX(m->kv.n_groups, 1);
  m->ids = host_alloc(m, sizeof(int32_t) * T);
  m->ids_map = host_alloc(m, sizeof(int32_t) * T);
  const int32_t *kept = NULL; /* a backend that offers its sampled ids (kn_kept_ids) */
  kn_kept_ids(m->be, &kept);
  if (world == 1 && kept && !(m->ids_dev = wk_model_alloc(m, sizeof(int32_t) * T)))
    return CM_ERR_NOMEM;
  m->pos = host_alloc(m, sizeof(int32_t) * T);
  m->out_rows = host_alloc(m, sizeof(int32_t) * T);
  m->score_ids = host_alloc(m, sizeof(int32_t) * T);
  m->score_params = host_alloc(m, sizeof(struct kn_sample_params) * (size_t)m->max_out);
  if (!kn_backend_has(m->be, KN_CAP_HOST_MEMORY) &&
      !(m->score_row = host_alloc(m, sizeof(float) * (size_t)c->vocab)))
    return CM_ERR_NOMEM;
  m->head_ids = host_alloc(m, sizeof(int32_t) * (size_t)m->max_out);
  m->slots = host_alloc(m, sizeof(int32_t) * T * (size_t)G);
  m->aseq = host_calloc(m, (size_t)m->max_seqs * (size_t)G, sizeof(struct kn_attn_seq));
  int k = c->moe ? c->top_k_experts : 1;
  m->moe_ids = host_alloc(m, sizeof(int32_t) * T * (size_t)k);
  m->moe_w = host_alloc(m, sizeof(float) * T * (size_t)k);
  if (!m->ids || !m->ids_map || !m->pos || !m->out_rows || !m->score_ids || !m->score_params ||
      !m->head_ids || !m->slots || !m->aseq || !m->moe_ids || !m->moe_w)
    return CM_ERR_NOMEM;
  return 0;
}

/* Lets the backend lay weight w out for its kernels (kn_weights_prepare) when
 * only matmuls and kn_embed read it, it is one matrix and it lies in the arena
 * (written here, not yet read-only). A weight it cannot rearrange stays as it
 * is, which the kernels read as well. */
static void prepare_weight(struct wk_model *m, struct wk_w *w) {
  const struct wk_arena *a = &m->arena;
  const unsigned char *p = w->p;
  size_t bytes = (size_t)w->rows * kn_row_bytes(w->dt, (size_t)w->cols);
  if (!p || w->n_mat != 1 || p < a->mem.base || p + bytes > a->mem.base + a->mem.len) return;
  enum kn_dtype dt = w->dt;
  if (!kn_weights_prepare(m->be, (void *)w->p, &dt, w->rows, w->cols)) w->dt = dt;
}

/* Every layer's linear weights, the per-layer embeddings' projection, and the
 * embedding table with the head it may be (an assistant's own head picks rows:
 * kn_matmul_rows). */
static void prepare_weights(struct wk_model *m) {
  for (int l = 0; l < m->cfg.n_layers; l++) {
    struct wk_layer_w *w = &m->layers[l];
    struct wk_w *mats[] = {&w->wq,   &w->wk,     &w->wv,       &w->wo,      &w->w_gate,
                           &w->w_up, &w->w_down, &w->ple_gate, &w->ple_proj};
    for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++)
      prepare_weight(m, mats[i]);
  }
  prepare_weight(m, &m->ple_model_proj);
  const int tied = m->lm_head.p == m->embed.p, assistant = m->cfg.arch == MD_ARCH_GEMMA4_ASSISTANT;
  if (tied && assistant) return;
  prepare_weight(m, &m->embed);
  if (tied)
    m->lm_head = m->embed;
  else if (!assistant)
    prepare_weight(m, &m->lm_head);
}

/* Weights left in the mapping: reads every page of the checkpoint once so the
 * first step does not pay the page faults. Copied weights (to the arena or
 * to a device): the arena turns read-only and this process's pages of the
 * mapping are let go (the page cache keeps them for the next load). */
static void finish_weights(struct wk_model *m) {
  struct wk_arena *a = &m->arena;
  if (a->mem.base) {
    copy_weights(m);
    prepare_weights(m);
    (void)mprotect(a->mem.base, a->mem.len, PROT_READ);
  }
  if (a->mem.base || !kn_backend_has(m->be, KN_CAP_HOST_MEMORY)) { /* copied: let go */
    md_st_drop_pages(m->st);
    return;
  }
  volatile unsigned char sink = 0;
  for (int i = 0; i < md_st_count(m->st); i++) {
    const struct md_tensor *t = md_st_get(m->st, i);
    const unsigned char *p = t->data;
    for (size_t off = 0; off < t->nbytes; off += 4096) {
      sink ^= p[off];
      load_progress(m, CM_MIN((size_t)4096, t->nbytes - off));
    }
  }
  (void)sink;
}

/* The assistant's own tensors, its checks against the target, and its view
 * of the target's KV pages: draft layer i reads the target's last storing
 * layer of its kind. */
/* An fp8 cache's scales from the checkpoint (md_config.kv_scales): every layer that
 * stores K/V has self_attn.k_scale and v_scale, one value (shape [] or [1]: per tensor)
 * or one per kv head ([n_kv_heads]: per attention head), f32 / bf16 / f16, finite and
 * positive; this rank keeps its kv heads' (wk_layer_w.k_scale / v_scale). */
static int bind_kv_scales(struct wk_model *m, char *err, size_t errlen) {
  const struct md_config *c = &m->full;
  const char *P = md_st_text_prefix(m->st);
  for (int i = 0; i < c->n_layers && P; i++) {
    const struct md_layer_cfg *l = &c->layers[i];
    if (l->kv_shared) continue;
    int n = m->cfg.layers[i].n_kv_heads, h0 = m->plan.kv_head0[i];
    for (int which = 0; which < 2; which++) {
      char name[256];
      snprintf(name, sizeof(name), "%slayers.%d.self_attn.%s_scale", P, i, which ? "v" : "k");
      const struct md_tensor *t = md_st_find(m->st, name);
      if (!t)
        return cm_fail(err, errlen, CM_ERR_NOENT,
                       "%s: tensor %s missing (quantization_config.kv_cache_scheme gives every "
                       "attention layer its KV cache scales)",
                       m->dir, name);
      int64_t count = 1;
      for (int d = 0; d < t->ndim; d++)
        count *= t->shape[d];
      int per_head = t->ndim == 1 && count == l->n_kv_heads && count > 1;
      if ((!per_head && (count != 1 || t->ndim > 1)) ||
          (t->dtype != MD_ST_F32 && t->dtype != MD_ST_BF16 && t->dtype != MD_ST_F16)) {
        char got[96];
        shape_str(got, sizeof(got), t->ndim, t->shape);
        return cm_fail(err, errlen, CM_ERR_SHAPE,
                       "%s: %s has shape %s and dtype %s (expected one value or [%d]: per tensor "
                       "or per kv head, F32 / BF16 / F16)",
                       t->file, name, got, t->dtype_name, l->n_kv_heads);
      }
      float host[256];
      if (n > 256) return cm_fail(err, errlen, CM_ERR_TOOBIG, "%s: %d kv heads", name, n);
      int rc = positive_scales(t, name, per_head, h0, n, host, err, errlen);
      if (rc) return rc;
      float *dev = wk_model_alloc(m, sizeof(float) * (size_t)n);
      if (!dev || kn_upload(m->be, dev, host, sizeof(float) * (size_t)n))
        return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for %s", name);
      if (which)
        m->layers[i].v_scale = dev;
      else
        m->layers[i].k_scale = dev;
    }
  }
  return 0;
}

static int bind_assistant(struct wk_model *m, struct wk_model *t, char *err, size_t errlen) {
  const struct md_config *c = &m->cfg, *tc = &t->cfg;
  struct binder b = {.m = m, .err = err, .errlen = errlen};
  if (tc->arch != MD_ARCH_GEMMA4 || tc->vocab != c->vocab || tc->hidden != c->backbone_hidden)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "%s: the assistant (vocab %d, backbone hidden %d) does not fit the target %s "
                   "(%s, vocab %d, hidden %d)",
                   m->dir, c->vocab, c->backbone_hidden, t->dir, tc->model_type, tc->vocab,
                   tc->hidden);
  int h = c->hidden, B = c->backbone_hidden;
  bind_mat(&b, &m->pre_proj, WK_SHARD_FULL, (struct cut){0}, 1, h, 2 * (int64_t)B, -1,
           "pre_projection.weight");
  bind_mat(&b, &m->post_proj, WK_SHARD_FULL, (struct cut){0}, 1, B, h, -1,
           "post_projection.weight");
  if (c->use_ordered_embeddings) {
    bind_mat(&b, &m->centroids, WK_SHARD_FULL, (struct cut){0}, 1, c->num_centroids, h, -1,
             "masked_embedding.centroids.weight");
    const struct md_tensor *o = md_st_find(m->st, "masked_embedding.token_ordering");
    if (!b.rc && (!o || o->ndim != 1 || o->shape[0] != c->vocab ||
                  (o->dtype != MD_ST_I64 && o->dtype != MD_ST_I32)))
      b.rc = cm_fail(err, errlen, CM_ERR_SHAPE,
                     "%s: tensor masked_embedding.token_ordering missing or not [%d] integers",
                     m->dir, c->vocab);
    if (!b.rc) {
      m->token_ordering = host_alloc(m, sizeof(int32_t) * (size_t)c->vocab);
      if (!m->token_ordering) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
      for (int i = 0; i < c->vocab; i++) {
        int64_t v =
            o->dtype == MD_ST_I64 ? ((const int64_t *)o->data)[i] : ((const int32_t *)o->data)[i];
        if (v < 0 || v >= c->vocab)
          return cm_fail(err, errlen, CM_ERR_RANGE,
                         "%s: masked_embedding.token_ordering[%d] = %lld outside the vocabulary",
                         m->dir, i, (long long)v);
        m->token_ordering[i] = (int32_t)v;
      }
    }
  }
  if (b.rc) return b.rc;
  m->kv = t->kv;
  m->kv.n_layers = c->n_layers;
  for (int i = 0; i < c->n_layers; i++) {
    const struct md_layer_cfg *l = &c->layers[i];
    int src = md_config_last_storing_layer(tc, l->kind);
    if (src < 0 || tc->layers[src].head_dim != l->head_dim ||
        tc->layers[src].n_kv_heads != l->n_kv_heads)
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "%s: draft layer %d (%s, head dim %d, %d KV heads) has no matching storing "
                     "layer in the target",
                     m->dir, i, l->kind == MD_LAYER_FULL ? "full" : "sliding", l->head_dim,
                     l->n_kv_heads);
    if (m->plan.kv_head0[i] != t->plan.kv_head0[src])
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "%s: draft layer %d reads KV head %d on tensor-parallel rank %d, where the "
                     "target holds KV head %d",
                     m->dir, i, m->plan.kv_head0[i], m->plan.rank, t->plan.kv_head0[src]);
    m->kv.layer_group[i] = t->kv.layer_group[src];
    m->kv.layer_k_off[i] = t->kv.layer_k_off[src];
    m->kv.layer_v_off[i] = t->kv.layer_v_off[src];
    m->layers[i].k_scale = t->layers[src].k_scale; /* an fp8 cache's, or NULL */
    m->layers[i].v_scale = t->layers[src].v_scale;
  }
  m->pool = t->pool;
  m->n_pages = t->n_pages;
  m->target = t;
  return 0;
}

static int alloc_draft_scratch(struct wk_model *m) {
  const struct md_config *c = &m->cfg;
  size_t T = (size_t)m->max_T, B = (size_t)c->backbone_hidden, f = sizeof(float);
  if (!(m->cat = wk_model_alloc(m, T * 2 * B * f)) || !(m->hout = wk_model_alloc(m, T * B * f)))
    return CM_ERR_NOMEM;
  m->dseqs = host_calloc(m, (size_t)m->max_seqs, sizeof(*m->dseqs));
  if (!m->dseqs) return CM_ERR_NOMEM;
  if (c->use_ordered_embeddings) {
    size_t n_cand = (size_t)c->centroid_top_k * (size_t)(c->vocab / c->num_centroids);
    m->cent = wk_model_alloc(m, (size_t)c->num_centroids * f);
    m->cand_logits = wk_model_alloc(m, n_cand * f);
    m->host_cent = host_alloc(m, (size_t)c->num_centroids * f);
    m->cand = host_alloc(m, n_cand * sizeof(int32_t));
    if (!m->cent || !m->cand_logits || !m->host_cent || !m->cand) return CM_ERR_NOMEM;
  }
  return 0;
}

/* Sets o->kv_bytes from the device memory left under o->mem_util. */
static int size_pool(struct wk_model *m, struct wk_model_opts *o, char *err, size_t errlen) {
  size_t free_b = 0, total_b = 0;
  int rc = kn_mem_info(m->be, &free_b, &total_b);
  if (rc)
    return cm_fail(err, errlen, rc,
                   "a memory utilisation target needs a device backend (%s backend: %s); "
                   "give the KV pool size instead",
                   kn_backend_name(m->be), cm_strerror(rc));
  rc = wk_kv_bytes_for_util(o->mem_util, total_b, free_b, &o->kv_bytes);
  if (rc)
    return cm_fail(err, errlen, rc,
                   "no device memory left for the KV cache: %.2f of %.2f GiB is %.2f GiB, and "
                   "%.2f GiB are in use after the weights",
                   o->mem_util, (double)total_b / (1 << 30),
                   o->mem_util * (double)total_b / (1 << 30),
                   (double)(total_b - free_b) / (1 << 30));
  /* a small model on a large device: stay within the page ids the pool allows */
  uint64_t cap = (uint64_t)WK_MAX_PAGES * m->kv.page_bytes;
  if (o->kv_bytes > cap) o->kv_bytes = cap;
  if (!o->quiet)
    cm_info("wk", "KV pool: %.2f GiB (%.2f of %.2f GiB, %.2f GiB in use)",
            (double)o->kv_bytes / (1 << 30), o->mem_util, (double)total_b / (1 << 30),
            (double)(total_b - free_b) / (1 << 30));
  return 0;
}

/* FP8 weights (--quantization fp8, or a checkpoint's quantization_config) on a
 * backend that serves them (kn_fp8_weights), else a clear refusal: never a
 * silent fallback to the bf16 weights. */
static int check_fp8(struct wk_model *m, struct kn_backend *be, const struct wk_model_opts *o,
                     char *err, size_t errlen) {
  m->quant_fp8 = o->quantization == WK_QUANT_FP8;
  if (m->quant_fp8 && m->full.fp8)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "--quantization fp8: %s is already an FP8 checkpoint (its quantization_config "
                   "says so); load it without the flag",
                   m->dir);
  if (!m->quant_fp8 && !m->full.fp8) return 0;
  char why[256];
  if (!o->fp8_reference && kn_fp8_weights(be, why, sizeof(why)))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED, "%s%s: %s",
                   m->quant_fp8 ? "--quantization fp8 on " : "FP8 checkpoint ", m->dir, why);
  if (m->full.moe && !o->quiet)
    cm_info("wk", "%s: the MoE experts stay in their own dtype (FP8 covers the linear layers)",
            m->dir);
  return 0;
}

/* --quantization q8_0|q4_0|q4_k: a safetensors checkpoint of float weights on a
 * backend with block kernels, else a clear refusal. */
static int check_block_quant(struct wk_model *m, struct kn_backend *be,
                             const struct wk_model_opts *o, char *err, size_t errlen) {
  static const enum kn_dtype of[] = {[WK_QUANT_Q8_0] = KN_DTYPE_Q8_0,
                                     [WK_QUANT_Q4_0] = KN_DTYPE_Q4_0,
                                     [WK_QUANT_Q4_K] = KN_DTYPE_Q4_K};
  if (o->quantization < WK_QUANT_Q8_0 || o->quantization > WK_QUANT_Q4_K) return 0;
  enum kn_dtype q = of[o->quantization];
  const char *name = kn_dtype_name(q);
  if (m->full.gguf) {
    char hint[4200] = ""; /* lmserve quantize writes the block formats */
    if (q != KN_DTYPE_F8E4M3)
      snprintf(hint, sizeof(hint), " (or write a quantized file: lmserve quantize %s OUT.gguf %s)",
               m->dir, name);
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "--quantization %s: %s is a GGUF file, whose tensors carry their own types; "
                   "load it without the flag%s",
                   name, m->dir, hint);
  }
  if (m->full.fp8)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "--quantization %s: %s is already an FP8 checkpoint (its quantization_config "
                   "says so); load it without the flag",
                   name, m->dir);
  if (!kn_backend_has(be, KN_CAP_BLOCK_WEIGHTS))
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "--quantization %s on %s: the %s backend has no kernels for block formats that "
                   "passed its check at start-up (the CPU has)",
                   name, m->dir, kn_backend_name(be));
  m->quant_block = (int)q;
  return 0;
}

/* The width a down projection `name` of F columns is cut on under tensor
 * parallelism (wk_config_shard): the block of its format, a GGUF file's or the one
 * --quantization gives it, so that every rank's columns are whole blocks of it.
 * Under --quantization a format with fewer blocks than ranks gives way to its
 * fallback's (bind_mat then picks that format from the cut). */
static int down_unit(const struct wk_model *m, int world, const char *name, int F) {
  int u = 0;
  if (m->quant_block) {
    /* the row's format, else, with fewer of its blocks than ranks, the fallback of
     * rows that are not whole blocks (Q4_K's Q5_0, blocks of 32) */
    enum kn_dtype q = kn_quant_row_type((enum kn_dtype)m->quant_block, (size_t)F);
    if (q != KN_DTYPE__COUNT && F / kn_block_elems(q) < world)
      q = kn_quant_row_type((enum kn_dtype)m->quant_block, 32);
    if (q != KN_DTYPE__COUNT && F % kn_block_elems(q) == 0 && F / kn_block_elems(q) >= world)
      u = kn_block_elems(q);
  } else {
    const struct md_tensor *t = md_st_find(m->st, name);
    if (t) u = kn_block_elems(wk_weight_dtype(t));
  }
  return u > 1 ? u : 1;
}

/* Those widths for each layer's MLP and for the experts. */
static void ffn_units(const struct wk_model *m, int world, struct wk_shard_units *u) {
  const struct md_config *c = &m->full;
  const char *P = world > 1 ? md_st_text_prefix(m->st) : NULL;
  char name[200];
  u->moe = 1;
  for (int i = 0; i < c->n_layers; i++) {
    u->ffn[i] = 1;
    if (!P) continue;
    snprintf(name, sizeof name, "%slayers.%d.mlp.down_proj.weight", P, i);
    u->ffn[i] = down_unit(m, world, name, c->layers[i].ffn_dim);
    if (!c->moe) continue;
    /* every layer's experts are cut alike: the widest block of them all */
    snprintf(name, sizeof name, "%slayers.%d.experts.down_proj", P, i);
    int e = down_unit(m, world, name, c->moe_ffn);
    u->moe = u->moe / (int)cm_gcd((unsigned)u->moe, (unsigned)e) * e;
  }
}

int wk_model_load_as(const char *dir, struct kn_backend *be, const struct wk_model_opts *opts,
                     struct wk_model *target, struct wk_model **out, char *err, size_t errlen) {
  struct wk_model_opts o = opts ? *opts : (struct wk_model_opts){0};
  struct wk_model *m = calloc(1, sizeof(*m));
  if (!m) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  m->be = be;
  cm_arena_init(&m->host, 64u << 10, 0);
  snprintf(m->dir, sizeof(m->dir), "%s", dir);
  /* A GGUF file is opened once: its tensor directory first, the config from the
   * metadata of the same open file; a folder's config.json is read before its
   * tensors, whose absence is the error of a folder that has only a config. */
  char gguf_path[4096];
  int rc = md_model_gguf_path(dir, gguf_path, sizeof(gguf_path), err, errlen);
  if (rc > 0) {
    if (!(rc = md_st_open_gguf(gguf_path, &m->st, err, errlen)))
      rc = md_config_from_gguf_model(dir, md_st_gguf(m->st), &m->full, err, errlen);
  } else if (rc == 0) {
    rc = md_config_load(dir, &m->full, err, errlen);
  }
  if (rc) goto fail;
  int world = o.tp_size > 0 ? o.tp_size : 1;
  if (world > 1 && !kn_backend_has(be, KN_CAP_ALLREDUCE)) {
    rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                 "tensor-parallel size %d needs collectives, which the %s backend lacks", world,
                 kn_backend_name(be));
    goto fail;
  }
  if ((m->full.arch == MD_ARCH_GEMMA4_ASSISTANT) != (target != NULL)) {
    rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                 target ? "%s: not a gemma4_assistant checkpoint"
                        : "%s: a gemma4_assistant checkpoint runs only as a draft model of its "
                          "target",
                 dir);
    goto fail;
  }
  if ((rc = check_fp8(m, be, &o, err, errlen))) goto fail;
  if ((rc = check_block_quant(m, be, &o, err, errlen))) goto fail;
  if (!m->st && (rc = md_st_open_dir(dir, &m->st, err, errlen))) goto fail;
  struct wk_shard_units units;
  ffn_units(m, world, &units);
  if ((rc = wk_config_shard(&m->full, o.tp_rank, world, &units, &m->cfg, &m->plan, err, errlen)))
    goto fail;
  uint64_t total = md_st_data_bytes(m->st);
  m->progress = (struct wk_load_progress){
      .total = total, .next = total / 10, .loud = !o.quiet && total > (256ull << 20)};
  if (kn_backend_has(be, KN_CAP_HOST_MEMORY) && !o.mmap_weights && (rc = arena_reserve(m))) {
    rc = cm_fail(err, errlen, rc, "%s: cannot reserve %.2f GB for the weights", dir,
                 (double)total / 1e9);
    goto fail;
  }
  if ((rc = bind_all(m, err, errlen))) goto fail;
  m->max_T = o.max_batch_tokens > 0 ? o.max_batch_tokens : 512;
  m->max_seqs = o.max_seqs > 0 ? o.max_seqs : 64;
  m->first_shared = m->cfg.n_layers;
  while (m->first_shared > 0 && m->cfg.layers[m->first_shared - 1].kv_shared)
    m->first_shared--;
  m->fast_prefill = !o.no_fast_prefill;
  if (target) {
    if ((rc = bind_assistant(m, target, err, errlen))) goto fail;
    if ((rc = build_rope(m)) || (rc = alloc_scratch(m)) || (rc = alloc_draft_scratch(m))) {
      rc = cm_fail(err, errlen, rc, "%s: out of memory for scratch buffers", dir);
      goto fail;
    }
    finish_weights(m);
    *out = m;
    return 0;
  }
  enum kn_dtype kvdt = m->embed.dt == KN_DTYPE_F32 ? KN_DTYPE_F32 : KN_DTYPE_BF16;
  if (o.kv_dtype > 0) kvdt = (enum kn_dtype)(o.kv_dtype - 1);
  if ((rc = wk_kv_spec_build(&m->cfg, kvdt, o.block_tokens, &m->kv))) {
    rc = cm_fail(err, errlen, rc, "%s: cannot plan the KV cache (%s)", dir, cm_strerror(rc));
    goto fail;
  }
  if (m->full.kv_scales && kvdt == KN_DTYPE_F8E4M3) {
    if ((rc = bind_kv_scales(m, err, errlen))) goto fail;
  } else if (m->full.kv_scales && !o.quiet) {
    cm_info("wk",
            "%s: the checkpoint's KV cache scales apply to an fp8 cache "
            "(--kv-cache-dtype fp8); this one is %s",
            dir, kn_dtype_name(kvdt));
  }
  /* scratch first: a pool sized from the memory left must see it in use */
  if ((rc = build_rope(m)) || (rc = alloc_scratch(m))) {
    rc = cm_fail(err, errlen, rc, "%s: out of memory for scratch buffers", dir);
    goto fail;
  }
  for (int i = 0; i < o.n_loras; i++)
    if ((rc = wk_model_add_lora(m, o.lora_names[i], o.lora_paths[i], err, errlen))) goto fail;
  if (o.kv_bytes == 0 && o.mem_util > 0 && m->kv.n_groups && (rc = size_pool(m, &o, err, errlen)))
    goto fail;
  int kv_tokens = o.kv_tokens > 0 ? o.kv_tokens : 8192;
  for (int g = 0; g < m->kv.n_groups; g++)
    m->n_pages += wk_kv_blocks_for(&m->kv, g, kv_tokens);
  if (o.kv_bytes > 0 && m->kv.n_groups) {
    uint64_t pages = o.kv_bytes / m->kv.page_bytes;
    if (pages < 1 || pages > WK_MAX_PAGES) {
      rc = cm_fail(err, errlen, CM_ERR_RANGE,
                   "KV pool of %llu bytes: pages of %zu bytes give %llu pages",
                   (unsigned long long)o.kv_bytes, m->kv.page_bytes, (unsigned long long)pages);
      goto fail;
    }
    m->n_pages = (int)pages;
  }
  if (m->n_pages) {
    m->pool = wk_model_alloc(m, (size_t)m->n_pages * m->kv.page_bytes);
    if (!m->pool) {
      rc = cm_fail(err, errlen, CM_ERR_NOMEM, "cannot allocate a KV pool of %d pages x %zu bytes",
                   m->n_pages, m->kv.page_bytes);
      goto fail;
    }
    kn_memset(be, m->pool, 0, (size_t)m->n_pages * m->kv.page_bytes);
  }
  finish_weights(m);
  if ((rc = wk_graph_init(m, o.step_graphs, o.max_graph_seqs, o.graph_verify_tokens, err, errlen)))
    goto fail;
  if (!o.quiet)
    cm_info("wk",
            "loaded %s: %s, %d layers, hidden %d, vocab %d, %.1f MB of weights (%s), KV %zu "
            "B/token",
            dir, m->cfg.model_type, m->cfg.n_layers, m->cfg.hidden, m->cfg.vocab,
            (double)m->weight_bytes / 1e6,
            m->arena.mem.base                        ? "copied into huge pages"
            : kn_backend_has(be, KN_CAP_HOST_MEMORY) ? "in the page cache"
                                                     : "on the device",
            wk_kv_bytes_per_token(&m->kv));
  *out = m;
  return 0;
fail:
  wk_model_free(m);
  return rc;
}

int wk_model_load(const char *dir, struct kn_backend *be, const struct wk_model_opts *opts,
                  struct wk_model **out, char *err, size_t errlen) {
  return wk_model_load_as(dir, be, opts, NULL, out, err, errlen);
}

void wk_model_free(struct wk_model *m) {
  if (!m) return;
  wk_graph_free(m);
  wk_lora_free(m);
  wk_owned_free(&m->owned, m->be);
  cm_arena_free(&m->host);
  free(m->arena.todo);
  cm_huge_unmap(&m->arena.mem);
  md_st_close(m->st);
  free(m);
}

struct kn_backend *wk_model_backend(const struct wk_model *m) {
  return m->be;
}

const struct md_config *wk_model_config(const struct wk_model *m) {
  return &m->cfg;
}
const struct wk_kv_spec *wk_model_kv_spec(const struct wk_model *m) {
  return &m->kv;
}
int wk_model_n_pages(const struct wk_model *m) {
  return m->n_pages;
}
int wk_model_max_batch_tokens(const struct wk_model *m) {
  return m->max_T;
}
int wk_model_max_seqs(const struct wk_model *m) {
  return m->max_seqs;
}
uint64_t wk_model_weight_bytes_per_token(const struct wk_model *m) {
  return m->bytes_per_token;
}
uint64_t wk_model_weight_bytes(const struct wk_model *m) {
  return m->weight_bytes;
}
uint64_t wk_model_block_bytes(const struct wk_model *m) {
  return m->block_bytes;
}

/* FNV-1a over 64-bit words. */
static uint64_t mix(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; i++, v >>= 8)
    h = (h ^ (v & 0xff)) * 0x100000001b3ull;
  return h;
}

uint64_t wk_model_shard_sum(const struct wk_model *m) {
  const struct md_config *c = &m->cfg;
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char *p = c->model_type; *p; p++)
    h = mix(h, (unsigned char)*p);
  h = mix(h, (uint64_t)m->plan.world);
  /* where the MLPs' cuts fall: ranks that disagree would hold overlapping columns */
  h = mix(h, (uint64_t)(uint32_t)m->plan.units.moe);
  for (int i = 0; i < c->n_layers; i++)
    h = mix(h, (uint64_t)(uint32_t)m->plan.units.ffn[i]);
  int v[] = {
      c->vocab,        c->hidden,  c->n_layers,       c->n_heads,     c->moe ? c->n_experts : 0,
      m->full.moe_ffn, c->ple_dim, c->sliding_window, m->lm_head.rows};
  for (size_t i = 0; i < CM_ARRAY_LEN(v); i++)
    h = mix(h, (uint64_t)(uint32_t)v[i]);
  for (int i = 0; i < c->n_layers; i++) {
    const struct md_layer_cfg *l = &c->layers[i];
    h = mix(h, (uint64_t)l->kind << 48 | (uint64_t)l->head_dim << 32 |
                   (uint64_t)l->n_kv_heads << 16 | (uint64_t)l->kv_shared);
    /* the full width: ranks may hold unequal cuts of it (wk_config_shard) */
    h = mix(h, (uint64_t)(uint32_t)m->full.layers[i].ffn_dim);
  }
  return h;
}

int wk_quantization_parse(const char *s, int *out, char *err, size_t errlen) {
  if (!s || !*s || !strcmp(s, "none")) {
    *out = WK_QUANT_NONE;
    return 0;
  }
  static const struct {
    const char *name;
    int v;
  } names[] = {{"fp8", WK_QUANT_FP8},
               {"q8_0", WK_QUANT_Q8_0},
               {"q4_0", WK_QUANT_Q4_0},
               {"q4_k", WK_QUANT_Q4_K}};
  for (size_t i = 0; i < CM_ARRAY_LEN(names); i++)
    if (!strcmp(s, names[i].name)) {
      *out = names[i].v;
      return 0;
    }
  return cm_fail(err, errlen, CM_ERR_INVAL,
                 "--quantization '%s' is not one of none, fp8, q8_0, q4_0, q4_k (GGUF files carry "
                 "their own)",
                 s);
}

int wk_kv_dtype_parse(const char *s, int *out, char *err, size_t errlen) {
  static const struct {
    const char *name;
    int v;
  } names[] = {{"auto", 0},
               {"bf16", 1 + KN_DTYPE_BF16},
               {"bfloat16", 1 + KN_DTYPE_BF16},
               {"fp8", 1 + KN_DTYPE_F8E4M3},
               {"fp8_e4m3", 1 + KN_DTYPE_F8E4M3},
               {"f32", 1 + KN_DTYPE_F32},
               {"float32", 1 + KN_DTYPE_F32}};
  for (size_t i = 0; s && i < sizeof(names) / sizeof(names[0]); i++)
    if (!strcmp(s, names[i].name)) {
      *out = names[i].v;
      return 0;
    }
  return cm_fail(err, errlen, CM_ERR_INVAL,
                 "--kv-cache-dtype '%s' is not one of auto, bf16, fp8, f32 (fp8 is e4m3; fp8_e5m2 "
                 "is not supported)",
                 s ? s : "");
}
