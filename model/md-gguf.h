/* md-gguf.h — GGUF files (llama.cpp's checkpoint format, versions 2 and 3),
 * read with every count, length and offset checked against the file: the
 * metadata (key → typed value, arrays included) and the tensor directory
 * (name, shape, ggml type, where its bytes are). No tensor data is read here;
 * a tensor's bytes are a pointer into the mapping.
 *
 * Layout (little-endian): "GGUF", u32 version, u64 tensor count, u64 metadata
 * count; each metadata entry a string key, a u32 value type and the value;
 * each tensor a string name, u32 n_dims (<= 4), u64 dims (innermost first),
 * u32 ggml type, u64 offset into the data section; the data section starts at
 * the next multiple of general.alignment (32 when absent). A string is a u64
 * length and its bytes. */
#ifndef LMSERVE_MD_GGUF_H
#define LMSERVE_MD_GGUF_H
#include <stddef.h>
#include <stdint.h>

/* Metadata value types. */
enum md_gguf_vtype {
  MD_GGUF_U8 = 0,
  MD_GGUF_I8 = 1,
  MD_GGUF_U16 = 2,
  MD_GGUF_I16 = 3,
  MD_GGUF_U32 = 4,
  MD_GGUF_I32 = 5,
  MD_GGUF_F32 = 6,
  MD_GGUF_BOOL = 7,
  MD_GGUF_STRING = 8,
  MD_GGUF_ARRAY = 9,
  MD_GGUF_U64 = 10,
  MD_GGUF_I64 = 11,
  MD_GGUF_F64 = 12,
};

/* ggml tensor types this project knows the size of (others are listed with
 * nbytes 0 and refused when bound). */
enum md_ggml_type {
  MD_GGML_F32 = 0,
  MD_GGML_F16 = 1,
  MD_GGML_Q4_0 = 2,
  MD_GGML_Q4_1 = 3,
  MD_GGML_Q5_0 = 6,
  MD_GGML_Q5_1 = 7,
  MD_GGML_Q8_0 = 8,
  MD_GGML_Q8_1 = 9,
  MD_GGML_Q2_K = 10,
  MD_GGML_Q3_K = 11,
  MD_GGML_Q4_K = 12,
  MD_GGML_Q5_K = 13,
  MD_GGML_Q6_K = 14,
  MD_GGML_Q8_K = 15,
  MD_GGML_IQ4_NL = 20,
  MD_GGML_IQ4_XS = 23,
  MD_GGML_BF16 = 30,
};

#define MD_GGUF_MAX_DIMS 4

struct md_gguf_kv {
  const char *key; /* NUL-terminated copy */
  enum md_gguf_vtype type;
  enum md_gguf_vtype arr_type; /* ARRAY: its elements' type (not ARRAY) */
  uint64_t n;                  /* ARRAY: elements; else 1 */
  const uint8_t *val;          /* the value's bytes in the file (an ARRAY's first element;
                                  a STRING's u64 length) */
  uint64_t bytes;              /* how many there are from val */
};

struct md_gguf_tensor {
  const char *name; /* NUL-terminated copy */
  int n_dims;
  int64_t ne[MD_GGUF_MAX_DIMS]; /* elements per dimension, innermost first; 1 past n_dims */
  uint32_t type;                /* enum md_ggml_type, or another ggml type */
  uint64_t offset;              /* into the data section */
  const void *data;             /* inside the file, nbytes long; NULL for an unknown type */
  size_t nbytes;                /* 0 for an unknown type */
};

struct md_gguf;

/* Maps and reads path. 0, or a negative cm_err with a sentence naming the
 * file and what is wrong ("x.gguf: truncated in tensor 12's name"). */
int md_gguf_open(const char *path, struct md_gguf **out, char *err, size_t errlen);
/* The same over bytes already in memory (not copied: buf must outlive the
 * handle); name is used in messages. For tests and fuzzing. */
int md_gguf_open_mem(const void *buf, size_t len, const char *name, struct md_gguf **out, char *err,
                     size_t errlen);
void md_gguf_close(struct md_gguf *g);
/* The file's mapping md_gguf_open made (*len its bytes), or NULL for memory
 * the caller owns (md_gguf_open_mem). */
void *md_gguf_mapping(const struct md_gguf *g, size_t *len);
/* 1 when the first bytes of the file at path say GGUF, 0 when not, a
 * negative cm_err when it cannot be read. */
int md_gguf_probe(const char *path);

uint32_t md_gguf_version(const struct md_gguf *g);
int md_gguf_kv_count(const struct md_gguf *g);
const struct md_gguf_kv *md_gguf_kv_at(const struct md_gguf *g, int i);
const struct md_gguf_kv *md_gguf_find_kv(const struct md_gguf *g, const char *key);
int md_gguf_tensor_count(const struct md_gguf *g);
const struct md_gguf_tensor *md_gguf_tensor_at(const struct md_gguf *g, int i);
const struct md_gguf_tensor *md_gguf_find_tensor(const struct md_gguf *g, const char *name);
uint64_t md_gguf_data_bytes(const struct md_gguf *g); /* sum of the known tensors' bytes */

/* A model split in parts as llama.cpp's gguf-split and converter write it:
 * PREFIX-00001-of-0000N.gguf .. PREFIX-0000N-of-0000N.gguf, each a GGUF file
 * with split.no (its index from 0), split.count (N) and split.tensors.count
 * (the tensors of all parts); the first part holds the metadata. *no and
 * *count: 0 and 1 for a file that is not split. 0, or CM_ERR_PARSE with a
 * sentence naming the file (a key of another type, a count past
 * MD_GGUF_MAX_SPLITS, an index not below the count). */
#define MD_GGUF_MAX_SPLITS 99999
int md_gguf_split(const struct md_gguf *g, int *no, int *count, char *err, size_t errlen);
/* Part no (from 0) of the model whose first part is the file at first, into
 * out[n]: 0, or CM_ERR_INVAL when first's name does not end in
 * -00001-of-COUNT.gguf (five digits each). */
int md_gguf_split_path(const char *first, int no, int count, char *out, size_t n);

/* Typed reads of a metadata value: 0, CM_ERR_NOENT (absent) or CM_ERR_PARSE
 * (another type; integers convert between widths when the value fits). */
int md_gguf_get_int(const struct md_gguf *g, const char *key, int64_t *out);
int md_gguf_get_f64(const struct md_gguf *g, const char *key, double *out); /* F32, F64, ints */
int md_gguf_get_bool(const struct md_gguf *g, const char *key, int *out);
int md_gguf_get_str(const struct md_gguf *g, const char *key, const char **s, size_t *len);

/* Element i of an array of numbers (as md_gguf_get_int / get_f64 convert). */
int md_gguf_arr_int(const struct md_gguf_kv *kv, uint64_t i, int64_t *out);
int md_gguf_arr_f64(const struct md_gguf_kv *kv, uint64_t i, double *out);
/* Walks an array of strings in order: *pos starts at 0; each call gives the
 * next element (not NUL-terminated) and 0, or CM_ERR_NOENT past the end. */
int md_gguf_arr_next_str(const struct md_gguf_kv *kv, uint64_t *pos, const char **s, size_t *len);

/* A ggml type's name ("q4_0", ...; "type N" for unknown ones: buf holds it),
 * and the bytes of n elements of it (0: unknown type, or n not a whole number
 * of blocks). */
const char *md_ggml_type_name(uint32_t type, char *buf, size_t buflen);
uint64_t md_ggml_row_bytes(uint32_t type, uint64_t n);
/* Elements per block of a ggml type (1 for F32 / F16 / BF16; 0: unknown). */
int md_ggml_block_elems(uint32_t type);

#endif
