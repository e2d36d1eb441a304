/* wk-tower.h — what the encoder towers (wk-vision.c, wk-vision-g4.c,
 * wk-audio-g4.c) share: the state every tower holds, weight binding, the
 * clippable linear and the scratch KV pages of whole-image attention.
 *
 * A binder carries the first failure: every call is a no-op once b->rc is
 * set, and a failing call sets it with one sentence in b->err naming the
 * tensor (the tower's name, `what`, first), so a tower binds all its weights
 * and checks b->rc once. */
#ifndef LMSERVE_WK_TOWER_H
#define LMSERVE_WK_TOWER_H
#include <stddef.h>
#include <stdint.h>

#include "common/cm-arena.h"
#include "kernels/kn-backend.h"
#include "model/md-config.h"
#include "worker/wk-owned.h"

struct md_st;
struct md_tensor;

/* What every tower holds: its backend, checkpoint and config, and the
 * memory it owns. A tower's struct begins with one, as its member t. */
struct wk_tower {
  struct kn_backend *be;
  struct md_st *st; /* open while host-memory backends point into its mappings */
  struct md_config cfg;
  int text_hidden;       /* H: width of the output embeddings (the text model's hidden) */
  struct cm_arena host;  /* host arrays */
  struct wk_owned owned; /* backend buffers */
};

/* How a tower of one kind loads. Once its config is read, setup checks it
 * (the tower's own section there, its sizes within limits) and derives the
 * tower's sizes; then, the checkpoint open, bind binds the weights and
 * scratch lays out a pass's buffers. Each gets the tower's struct as the
 * struct wk_tower it begins with; 0 or a negative cm_err with the reason in
 * err. */
struct wk_tower_kind {
  const char *what; /* "vision tower": the subject of the messages */
  size_t size;      /* bytes of the tower's struct */
  int (*setup)(struct wk_tower *t, const char *dir, const void *opts, char *err, size_t errlen);
  int (*bind)(struct wk_tower *t, char *err, size_t errlen);
  int (*scratch)(struct wk_tower *t, char *err, size_t errlen);
  int mmproj; /* 1: a GGUF model's tower is in the mmproj file beside it */
};

/* A tower of kind k (opts its own options) from the checkpoint in dir on be
 * (which must outlive it) into *out: 0, or a negative cm_err with the
 * reason in err and *out NULL. */
int wk_tower_load(const struct wk_tower_kind *k, const char *dir, struct kn_backend *be,
                  const void *opts, struct wk_tower **out, char *err, size_t errlen);
/* Frees a tower wk_tower_load made, all it owns (NULL is a no-op). */
void wk_tower_free(struct wk_tower *t);

/* A backend buffer of bytes that t owns (NULL when out of memory). */
void *wk_tower_alloc(struct wk_tower *t, size_t bytes);
/* count backend buffers of n floats each into *bufs[i], owned by t: 0, or
 * CM_ERR_NOMEM when one cannot be had. */
int wk_tower_floats(struct wk_tower *t, size_t n, float **const *bufs, size_t count);
#define WK_TOWER_FLOATS(t, n, ...)                                                                 \
  wk_tower_floats((t), (n), (float **const[]){__VA_ARGS__},                                        \
                  sizeof((float **const[]){__VA_ARGS__}) / sizeof(float **))
/* The same for host arrays of n int32 each, from t's arena. */
int wk_tower_ints(struct wk_tower *t, size_t n, int32_t **const *bufs, size_t count);
#define WK_TOWER_INTS(t, n, ...)                                                                   \
  wk_tower_ints((t), (n), (int32_t * *const[]){__VA_ARGS__},                                       \
                sizeof((int32_t **const[]){__VA_ARGS__}) / sizeof(int32_t **))
/* The first of n prefixes under which st holds the tensor PREFIX probe:
 * its index, or -1 when none does. */
int wk_tower_prefix(const struct md_st *st, const char *const *prefixes, int n, const char *probe);

struct wk_tower_binder {
  struct kn_backend *be;
  struct wk_owned *owned; /* buffers made here */
  const struct md_st *st;
  const char *what; /* "vision tower", "audio tower": the messages' subject */
  char *err;
  size_t errlen;
  int rc; /* first failure */
};

/* A binder of t's weights (its checkpoint open). */
struct wk_tower_binder wk_tower_bind(struct wk_tower *t, const char *what, char *err,
                                     size_t errlen);

/* The tensor `name` with exactly the dims given, in a float dtype. */
const struct md_tensor *wk_tower_tensor(struct wk_tower_binder *b, const char *name, int ndim,
                                        const int64_t *dims);
/* A matrix [rows, cols] for a linear: in a float dtype, or in one of ggml's
 * block formats (an mmproj file quantized as llama.cpp's converter does with
 * --outtype q8_0) where cols is whole blocks and be has block kernels (or
 * whatever be has, with host: a matrix read on the host, wk_tower_row). */
const struct md_tensor *wk_tower_matrix(struct wk_tower_binder *b, const char *name, int64_t rows,
                                        int64_t cols, int host);
/* Row r (K elements) of such a matrix, host memory, as f32 values into dst. */
void wk_tower_row(const struct md_tensor *t, int64_t r, int64_t K, float *dst);
/* Backend memory holding `bytes` of host data (the data itself on backends
 * whose memory is the host's, unless copy). */
const void *wk_tower_place(struct wk_tower_binder *b, const void *data, size_t bytes, int copy);
/* The tensor `name` (dims as given) widened to f32 in backend memory. */
const float *wk_tower_f32(struct wk_tower_binder *b, int ndim, const int64_t *dims,
                          const char *name);
/* The same for a vector of n elements named by a format. */
const float *wk_tower_vec(struct wk_tower_binder *b, int64_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A weight matrix [rows, cols] in backend memory, in its checkpoint dtype,
 * with the clip bounds of a Gemma4ClippableLinear (infinite for a plain
 * nn.Linear, or a tower without clipped linears). */
struct wk_clin {
  const void *w;
  enum kn_dtype dt;
  float in_lo, in_hi, out_lo, out_hi;
};

/* The plain linear `name` [rows, cols] (no bounds). */
struct wk_clin wk_tower_linear(struct wk_tower_binder *b, int64_t rows, int64_t cols,
                               const char *name);
/* A Gemma4ClippableLinear: PREFIX.linear.weight [rows, cols] and, when
 * clipped, its four bounds PREFIX.input_min, input_max, output_min,
 * output_max (one float each, 0-d as torch saves a scalar buffer, or [1];
 * refused when NaN or crossed). */
struct wk_clin wk_tower_clin(struct wk_tower_binder *b, int64_t rows, int64_t cols, int clipped,
                             const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* out[T, N] (stride N) = the clippable linear m of in[T, K] (stride K):
 * the input clamped into scratch (at least T K floats, backend memory) when
 * its bounds are finite, kn_matmul, the output clamped in place. */
int wk_clin_run(struct kn_backend *be, float *scratch, float *out, const float *in,
                const struct wk_clin *m, int T, int N, int K);

/* Scratch KV pages (f32, one layer at a time) for attention over whole
 * inputs: each input one sequence whose whole span is a bidirectional
 * range, on pages of its own. */
struct wk_tower_kv {
  struct kn_kv_view view;
  int32_t *block_tables;    /* [n_pages] host: page i is i */
  int32_t *slots;           /* [max_rows] host */
  int32_t *bidir;           /* [max_seqs, 2] host */
  struct kn_attn_seq *seqs; /* [max_seqs] host */
};

/* kv's pages (n_pages of block_tokens positions, n_kv_heads x head_dim
 * each) and its host arrays for max_rows rows in max_seqs sequences, owned
 * by t. 0, or CM_ERR_NOMEM. */
int wk_tower_kv_alloc(struct wk_tower *t, struct wk_tower_kv *kv, int n_pages, int block_tokens,
                      int n_kv_heads, int head_dim, size_t max_rows, int max_seqs);
/* Sequence i: rows [row0, row0 + n) on the pages from page0 on. Returns the
 * pages it takes. */
int wk_tower_kv_seq(struct wk_tower_kv *kv, int i, int row0, int n, int page0);

#endif
