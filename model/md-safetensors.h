/* md-safetensors.h — read-only access to safetensors checkpoints (mmap'd),
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
#ifndef LMSERVE_MD_SAFETENSORS_H
#define LMSERVE_MD_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define MD_ST_MAX_DIMS   4
#define MD_ST_MAX_HEADER (256u << 20) /* bytes */

enum md_st_dtype {
  MD_ST_F32 = 0,
  MD_ST_F16 = 1,
  MD_ST_BF16 = 2, /* the first three equal enum kn_dtype */
  MD_ST_I64 = 3,
  MD_ST_I32 = 4,
  MD_ST_F8E4M3 = 5, /* "F8_E4M3": FP8 checkpoints' linear weights */
  MD_ST_OTHER = 6,  /* any other dtype: refused when bound */
  /* ggml's block formats, from GGUF files only (kernels/kn-quant.h); rows of whole blocks,
   * sizes from the file's reader */
  MD_ST_Q8_0 = 7,
  MD_ST_Q4_0 = 8,
  MD_ST_Q4_1 = 9,
  MD_ST_Q5_0 = 10,
  MD_ST_Q5_1 = 11,
  MD_ST_Q4_K = 12,
  MD_ST_Q5_K = 13,
  MD_ST_Q6_K = 14,
  MD_ST_Q3_K = 15, /* these four: kernels' KN_CAP_BLOCK_LOWBIT */
  MD_ST_IQ4_NL = 16,
  MD_ST_IQ4_XS = 17,
  MD_ST_Q2_K = 18,
};

struct md_tensor {
  const char *name; /* NUL-terminated, owned by the md_st */
  const char *file; /* base name of the file holding it */
  enum md_st_dtype dtype;
  char dtype_name[8]; /* as written in the header ("BF16", "F8_E4M3", ...) */
  int ndim;
  int64_t shape[MD_ST_MAX_DIMS];
  const void *data; /* mmap'd (or aligned copy), nbytes long */
  size_t nbytes;
};

struct md_st; /* an open checkpoint: one or more mmap'd files */

/* Opens DIR/model.safetensors, or every shard named by
 * DIR/model.safetensors.index.json. Returns 0 or a negative cm_err with a
 * one-line reason naming the file in err. */
int md_st_open_dir(const char *dir, struct md_st **out, char *err, size_t errlen);
/* Opens one .safetensors file. */
int md_st_open_file(const char *path, struct md_st **out, char *err, size_t errlen);
/* Parses a safetensors image already in memory (not copied: buf must outlive
 * the handle). For tests and fuzzing. */
int md_st_open_mem(const void *buf, size_t len, const char *name, struct md_st **out, char *err,
                   size_t errlen);
void md_st_close(struct md_st *st);
/* Lets go of this process's pages of the mapped files (madvise DONTNEED): the
 * page cache keeps them and a later read of a tensor faults them back in. */
void md_st_drop_pages(struct md_st *st);
/* The same for the pages that hold [p, p + n), when that range lies in one of
 * the mapped files (anything else, such as an aligned copy, is left alone):
 * a loader copying tensors out lets go of each piece once copied. */
void md_st_drop_range(struct md_st *st, const void *p, size_t n);

/* The tensor called `name`, or NULL. */
const struct md_tensor *md_st_find(const struct md_st *st, const char *name);
/* Where a checkpoint's text stack sits: the first of "model.language_model."
 * (multimodal), "language_model.model." (older multimodal), "model." (CausalLM)
 * and "" (a bare text model) under which embed_tokens.weight is found; NULL when
 * none is. */
const char *md_st_text_prefix(const struct md_st *st);
int md_st_count(const struct md_st *st);
const struct md_tensor *md_st_get(const struct md_st *st, int i); /* sorted by name */
uint64_t md_st_data_bytes(const struct md_st *st);                /* sum of tensor bytes */

const char *md_st_dtype_name(enum md_st_dtype dt);
size_t md_st_dtype_size(enum md_st_dtype dt); /* bytes per element; 0 for block formats */

/* A directory of tensors read from another format (GGUF: md-tensors-gguf.c): made
 * empty (fname for messages; owner, when not NULL, freed with owner_free when
 * the directory is closed: what the tensors' data points into), filled with
 * md_st_add (the name is copied, data is not), then sealed (sorted, names
 * checked unique) before use. */
int md_st_new(const char *fname, void (*owner_free)(void *), void *owner, struct md_st **out);
int md_st_add(struct md_st *st, const struct md_tensor *t);
int md_st_seal(struct md_st *st, char *err, size_t errlen);
/* A directory over several files (a GGUF model split in parts): the tensors
 * md_st_add adds from now on are in file fname (their md_tensor.file). */
int md_st_add_file(struct md_st *st, const char *fname);
/* The owner's mapping (page-aligned base, len bytes) of the file being added
 * (md_st_new's, or the last md_st_add_file's), whose pages md_st_drop_pages
 * and md_st_drop_range let go too; the owner still unmaps it. */
void md_st_owner_pages(struct md_st *st, void *base, size_t len);
/* md_st_new's owner when it was given with owner_free, else NULL. */
void *md_st_owner(const struct md_st *st, void (*owner_free)(void *));
/* A GGUF file as a directory under the Hugging Face names the loader binds
 * (llama.cpp's token_embd.weight is model.embed_tokens.weight, ...), shapes
 * outermost first (md-tensors-gguf.c). The directory keeps the file open:
 * md_st_gguf gives it (its metadata for md_config_from_gguf, so that a load
 * reads the file once), NULL for a directory of safetensors files. */
int md_st_open_gguf(const char *path, struct md_st **out, char *err, size_t errlen);
struct md_gguf;
const struct md_gguf *md_st_gguf(const struct md_st *st);
/* The tensors of the mmproj file beside a GGUF model (md_model_mmproj_path),
 * under Hugging Face's names for Gemma 3's vision tower and projector, or
 * Gemma 4's vision and audio towers and embedders. */
int md_st_open_mmproj(const char *model, struct md_st **out, char *err, size_t errlen);
/* Transformers' name for the tensor g of a Gemma 4 mmproj file (llama.cpp's
 * gemma4v / gemma4a layout) into out[n]: 1, or 0 for a tensor the towers do
 * not read (a bias, a key scale, a name of another projector). */
int md_g4_mmproj_name(const char *g, char *out, size_t n);

/* ---- writer --------------------------------------------------------------- */

struct md_st_entry {
  const char *name;
  enum md_st_dtype dtype; /* not MD_ST_OTHER */
  int ndim;
  int64_t shape[MD_ST_MAX_DIMS];
};

/* Writes the 8-byte length and the JSON header for `n` tensors laid out in
 * the given order; the caller then writes exactly each tensor's bytes, in
 * that order. Returns 0 or a negative cm_err. */
int md_st_write_header(FILE *f, const struct md_st_entry *e, int n);

#endif
