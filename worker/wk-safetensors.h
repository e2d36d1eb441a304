/* wk-safetensors.h — read-only access to safetensors checkpoints (mmap'd),
 * and a small writer for generated checkpoints.
 *
 * File format: u64 little-endian header length N, N bytes of JSON
 *   {"__metadata__": {...}, "NAME": {"dtype": "BF16", "shape": [..],
 *    "data_offsets": [begin, end]}, ...}
 * then the data; offsets are relative to the first byte after the header.
 * The header is untrusted: its length is bounded by the file size and a cap,
 * every offset pair must lie inside the data, and the byte count must equal
 * the product of the shape times the element size (checked for overflow).
 * A tensor whose data is not aligned to its element size is copied into an
 * aligned buffer at open time. */
#ifndef LMSERVE_WK_SAFETENSORS_H
#define LMSERVE_WK_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define WK_ST_MAX_DIMS   4
#define WK_ST_MAX_HEADER (256u << 20) /* bytes */

enum wk_st_dtype {
  WK_ST_F32 = 0,
  WK_ST_F16 = 1,
  WK_ST_BF16 = 2, /* the first three equal enum kn_dtype */
  WK_ST_I64 = 3,
  WK_ST_I32 = 4,
  WK_ST_F8E4M3 = 5, /* "F8_E4M3": FP8 checkpoints' linear weights */
  WK_ST_OTHER = 6,  /* any other dtype: refused when bound */
  /* ggml's block formats, from GGUF files only (kernels/kn-quant.h); rows of whole blocks,
   * sizes from the file's reader */
  WK_ST_Q8_0 = 7,
  WK_ST_Q4_0 = 8,
  WK_ST_Q4_1 = 9,
  WK_ST_Q5_0 = 10,
  WK_ST_Q5_1 = 11,
  WK_ST_Q4_K = 12,
  WK_ST_Q5_K = 13,
  WK_ST_Q6_K = 14,
};

struct wk_tensor {
  const char *name; /* NUL-terminated, owned by the wk_st */
  const char *file; /* base name of the file holding it */
  enum wk_st_dtype dtype;
  char dtype_name[8]; /* as written in the header ("BF16", "F8_E4M3", ...) */
  int ndim;
  int64_t shape[WK_ST_MAX_DIMS];
  const void *data; /* mmap'd (or aligned copy), nbytes long */
  size_t nbytes;
};

struct wk_st; /* an open checkpoint: one or more mmap'd files */

/* Opens DIR/model.safetensors, or every shard named by
 * DIR/model.safetensors.index.json. Returns 0 or a negative cm_err with a
 * one-line reason naming the file in err. */
int wk_st_open_dir(const char *dir, struct wk_st **out, char *err, size_t errlen);
/* Opens one .safetensors file. */
int wk_st_open_file(const char *path, struct wk_st **out, char *err, size_t errlen);
/* Parses a safetensors image already in memory (not copied: buf must outlive
 * the handle). For tests and fuzzing. */
int wk_st_open_mem(const void *buf, size_t len, const char *name, struct wk_st **out, char *err,
                   size_t errlen);
void wk_st_close(struct wk_st *st);
/* Lets go of this process's pages of the mapped files (madvise DONTNEED): the
 * page cache keeps them and a later read of a tensor faults them back in. */
void wk_st_drop_pages(struct wk_st *st);

/* The tensor called `name`, or NULL. */
const struct wk_tensor *wk_st_find(const struct wk_st *st, const char *name);
int wk_st_count(const struct wk_st *st);
const struct wk_tensor *wk_st_get(const struct wk_st *st, int i); /* sorted by name */
uint64_t wk_st_data_bytes(const struct wk_st *st);                /* sum of tensor bytes */

const char *wk_st_dtype_name(enum wk_st_dtype dt);
size_t wk_st_dtype_size(enum wk_st_dtype dt); /* bytes per element; 0 for block formats */

/* A directory of tensors read from another format (GGUF: wk-gguf.c): made
 * empty (fname for messages; owner, when not NULL, freed with owner_free when
 * the directory is closed: what the tensors' data points into), filled with
 * wk_st_add (the name is copied, data is not), then sealed (sorted, names
 * checked unique) before use. */
int wk_st_new(const char *fname, void (*owner_free)(void *), void *owner, struct wk_st **out);
int wk_st_add(struct wk_st *st, const struct wk_tensor *t);
int wk_st_seal(struct wk_st *st, char *err, size_t errlen);
/* A GGUF file as a directory under the Hugging Face names the loader binds
 * (llama.cpp's token_embd.weight is model.embed_tokens.weight, ...), shapes
 * outermost first (wk-gguf.c). */
int wk_st_open_gguf(const char *path, struct wk_st **out, char *err, size_t errlen);

/* ---- writer --------------------------------------------------------------- */

struct wk_st_entry {
  const char *name;
  enum wk_st_dtype dtype; /* not WK_ST_OTHER */
  int ndim;
  int64_t shape[WK_ST_MAX_DIMS];
};

/* Writes the 8-byte length and the JSON header for `n` tensors laid out in
 * the given order; the caller then writes exactly each tensor's bytes, in
 * that order. Returns 0 or a negative cm_err. */
int wk_st_write_header(FILE *f, const struct wk_st_entry *e, int n);

#endif
