/* md-gguf.c — the GGUF reader: a cursor over the mapped bytes that refuses
 * anything past the end, counts no file could hold, bad types, and tensors
 * whose bytes would not lie inside the data section. */
#include "model/md-gguf.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"

#define MAX_KEY      65536      /* bytes of a key or a tensor name */
#define MAX_ALIGN    (1u << 20) /* general.alignment */
#define GGUF_MAGIC_0 'G'

struct md_gguf {
  const uint8_t *base; /* the file */
  size_t len;
  void *map; /* munmap'd on close (NULL: memory the caller owns) */
  char name[256];
  uint32_t version;
  int n_kv, n_tensors;
  struct md_gguf_kv *kv;          /* [n_kv]; kv's block holds the arrays below too */
  struct md_gguf_tensor *tensors; /* [n_tensors] */
  int *by_name;                   /* [n_tensors] tensor indexes sorted by name */
  char *strings;                  /* the keys' and names' copies */
  uint64_t data_bytes;
};

struct cur {
  const uint8_t *p, *end;
  struct md_gguf *g;
  char *err;
  size_t errlen;
  const char *where; /* for messages */
  long long idx;
};

static int trunc_at(struct cur *c) {
  return cm_fail(c->err, c->errlen, CM_ERR_TRUNC, "%s: truncated in %s %lld", c->g->name, c->where,
                 c->idx);
}

static int take(struct cur *c, size_t n, const uint8_t **out) {
  if ((size_t)(c->end - c->p) < n) return trunc_at(c);
  *out = c->p;
  c->p += n;
  return 0;
}

static uint32_t rd32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const uint8_t *p) {
  return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

static int take32(struct cur *c, uint32_t *v) {
  const uint8_t *p = NULL;
  int rc = take(c, 4, &p);
  if (!rc) *v = rd32(p);
  return rc;
}

static int take64(struct cur *c, uint64_t *v) {
  const uint8_t *p = NULL;
  int rc = take(c, 8, &p);
  if (!rc) *v = rd64(p);
  return rc;
}

/* A string: its bytes and length (not copied). */
static int take_str(struct cur *c, const uint8_t **s, uint64_t *len) {
  int rc = take64(c, len);
  if (rc) return rc;
  if (*len > (uint64_t)(c->end - c->p)) return trunc_at(c);
  *s = c->p;
  c->p += *len;
  return 0;
}

/* Bytes of one scalar of type t (0: STRING, ARRAY or unknown). */
static size_t scalar_size(uint32_t t) {
  switch (t) {
  case MD_GGUF_U8:
  case MD_GGUF_I8:
  case MD_GGUF_BOOL: return 1;
  case MD_GGUF_U16:
  case MD_GGUF_I16: return 2;
  case MD_GGUF_U32:
  case MD_GGUF_I32:
  case MD_GGUF_F32: return 4;
  case MD_GGUF_U64:
  case MD_GGUF_I64:
  case MD_GGUF_F64: return 8;
  default: return 0;
  }
}

static size_t align16(size_t n) {
  return (n + 15) & ~(size_t)15;
}

static int bad_type(struct cur *c, uint32_t t) {
  return cm_fail(c->err, c->errlen, CM_ERR_PARSE, "%s: %s %lld has value type %u (0..12)",
                 c->g->name, c->where, c->idx, t);
}

/* Skips one value of type t (arrays of arrays are refused). */
static int skip_value(struct cur *c, uint32_t t, int in_array) {
  size_t sz = scalar_size(t);
  const uint8_t *p = NULL;
  if (sz) return take(c, sz, &p);
  if (t == MD_GGUF_STRING) {
    uint64_t len;
    return take_str(c, &p, &len);
  }
  if (t != MD_GGUF_ARRAY || in_array) return bad_type(c, t);
  return CM_ERR_INVAL; /* the caller reads arrays */
}

/* Reads an entry's key or a tensor's name (what: which) into the string
 * arena: *out is the copy at *strings, NUL-terminated, and *strings moves past
 * it. */
static int take_name(struct cur *c, const char *what, char **strings, const char **out) {
  const uint8_t *s = NULL;
  uint64_t len = 0;
  int rc = take_str(c, &s, &len);
  if (rc) return rc;
  if (len == 0 || len > MAX_KEY || memchr(s, 0, (size_t)len))
    return cm_fail(c->err, c->errlen, CM_ERR_PARSE,
                   "%s: %s %lld's %s is empty, too long or holds a NUL", c->g->name, c->where,
                   c->idx, what);
  memcpy(*strings, s, (size_t)len);
  (*strings)[len] = 0;
  *out = *strings;
  *strings += len + 1;
  return 0;
}

static int read_kv(struct cur *c, struct md_gguf_kv *kv, char **strings) {
  uint32_t t;
  int rc = take_name(c, "key", strings, &kv->key);
  if (rc) return rc;
  if ((rc = take32(c, &t))) return rc;
  kv->type = (enum md_gguf_vtype)t;
  kv->n = 1;
  if (t != MD_GGUF_ARRAY) {
    kv->val = c->p;
    rc = skip_value(c, t, 0);
    kv->bytes = (uint64_t)(c->p - kv->val);
    return rc;
  }
  uint32_t at;
  uint64_t n;
  if ((rc = take32(c, &at)) || (rc = take64(c, &n))) return rc;
  if (at == MD_GGUF_ARRAY || (at != MD_GGUF_STRING && !scalar_size(at))) return bad_type(c, at);
  kv->arr_type = (enum md_gguf_vtype)at;
  kv->n = n;
  kv->val = c->p;
  size_t sz = scalar_size(at);
  if (sz) {
    if (n > (uint64_t)(c->end - c->p) / sz) return trunc_at(c);
    c->p += n * sz;
    kv->bytes = n * sz;
    return 0;
  }
  if (n > (uint64_t)(c->end - c->p) / 8) return trunc_at(c); /* 8 bytes a string at least */
  for (uint64_t i = 0; i < n; i++)
    if ((rc = skip_value(c, at, 1))) return rc;
  kv->bytes = (uint64_t)(c->p - kv->val);
  return 0;
}

static int by_name_cmp(const void *a, const void *b, void *g) {
  const struct md_gguf *gg = g;
  return strcmp(gg->tensors[*(const int *)a].name, gg->tensors[*(const int *)b].name);
}

/* ggml's tensor types: elements and bytes per block, and the name; a zero
 * entry is a type we do not read. */
static const struct {
  uint16_t elems, bytes;
  const char *name;
} ggml_types[] = {[MD_GGML_F32] = {1, 4, "f32"},          [MD_GGML_F16] = {1, 2, "f16"},
                  [MD_GGML_BF16] = {1, 2, "bf16"},        [MD_GGML_Q4_0] = {32, 18, "q4_0"},
                  [MD_GGML_Q4_1] = {32, 20, "q4_1"},      [MD_GGML_Q5_0] = {32, 22, "q5_0"},
                  [MD_GGML_Q5_1] = {32, 24, "q5_1"},      [MD_GGML_Q8_0] = {32, 34, "q8_0"},
                  [MD_GGML_Q8_1] = {32, 36, "q8_1"},      [MD_GGML_Q2_K] = {256, 84, "q2_k"},
                  [MD_GGML_Q3_K] = {256, 110, "q3_k"},    [MD_GGML_Q4_K] = {256, 144, "q4_k"},
                  [MD_GGML_Q5_K] = {256, 176, "q5_k"},    [MD_GGML_Q6_K] = {256, 210, "q6_k"},
                  [MD_GGML_Q8_K] = {256, 292, "q8_k"},    [MD_GGML_IQ4_NL] = {32, 18, "iq4_nl"},
                  [MD_GGML_IQ4_XS] = {256, 136, "iq4_xs"}};

int md_ggml_block_elems(uint32_t type) {
  return type < CM_ARRAY_LEN(ggml_types) ? ggml_types[type].elems : 0;
}

uint64_t md_ggml_row_bytes(uint32_t type, uint64_t n) {
  uint64_t be = (uint64_t)md_ggml_block_elems(type);
  if (!be) return 0;
  uint64_t bb = ggml_types[type].bytes;
  if (n % be || n / be > UINT64_MAX / bb) return 0;
  return n / be * bb;
}

const char *md_ggml_type_name(uint32_t type, char *buf, size_t buflen) {
  if (md_ggml_block_elems(type)) return ggml_types[type].name;
  snprintf(buf, buflen, "type %u", type);
  return buf;
}

static int read_tensor(struct cur *c, struct md_gguf_tensor *t, char **strings) {
  uint32_t nd;
  int rc = take_name(c, "name", strings, &t->name);
  if (rc) return rc;
  if ((rc = take32(c, &nd))) return rc;
  if (nd < 1 || nd > MD_GGUF_MAX_DIMS)
    return cm_fail(c->err, c->errlen, CM_ERR_SHAPE, "%s: tensor %s has %u dimensions (1..4)",
                   c->g->name, t->name, nd);
  t->n_dims = (int)nd;
  uint64_t count = 1;
  for (int d = 0; d < MD_GGUF_MAX_DIMS; d++) {
    uint64_t v = 1;
    if (d < (int)nd && (rc = take64(c, &v))) return rc;
    if (v == 0 || v > (uint64_t)INT64_MAX / count)
      return cm_fail(c->err, c->errlen, CM_ERR_SHAPE, "%s: tensor %s: dimension %d is %llu",
                     c->g->name, t->name, d, (unsigned long long)v);
    count *= v;
    t->ne[d] = (int64_t)v;
  }
  if ((rc = take32(c, &t->type)) || (rc = take64(c, &t->offset))) return rc;
  uint64_t row = md_ggml_row_bytes(t->type, (uint64_t)t->ne[0]);
  if (!row && md_ggml_block_elems(t->type)) {
    char tb[32];
    return cm_fail(c->err, c->errlen, CM_ERR_SHAPE,
                   "%s: tensor %s: %lld elements a row is not a whole number of %s blocks (%d)",
                   c->g->name, t->name, (long long)t->ne[0], md_ggml_type_name(t->type, tb, 32),
                   md_ggml_block_elems(t->type));
  }
  if (row) {
    uint64_t rows = count / (uint64_t)t->ne[0];
    if (rows > UINT64_MAX / row) return trunc_at(c);
    t->nbytes = (size_t)(rows * row);
  }
  return 0;
}

int md_gguf_open_mem(const void *buf, size_t len, const char *name, struct md_gguf **out, char *err,
                     size_t errlen) {
  *out = NULL;
  struct md_gguf *g = calloc(1, sizeof(*g));
  if (!g) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  g->base = buf;
  g->len = len;
  snprintf(g->name, sizeof(g->name), "%s", name ? name : "gguf");
  struct cur c = {g->base, g->base + len, g, err, errlen, "the header", 0};
  const uint8_t *magic = NULL;
  uint64_t nt, nkv;
  int rc = take(&c, 4, &magic);
  if (!rc && memcmp(magic, "GGUF", 4))
    rc = cm_fail(err, errlen, CM_ERR_PARSE, "%s: not a GGUF file (no GGUF magic)", g->name);
  if (!rc) rc = take32(&c, &g->version);
  if (!rc && g->version != 2 && g->version != 3)
    rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED, "%s: GGUF version %u (2 and 3 are read)", g->name,
                 g->version);
  if (!rc) rc = take64(&c, &nt);
  if (!rc) rc = take64(&c, &nkv);
  /* every entry takes more than 16 bytes: counts no file this size could hold are refused */
  if (!rc && (nt > len / 16 || nkv > len / 16 || nt > INT32_MAX || nkv > INT32_MAX))
    rc = cm_fail(err, errlen, CM_ERR_RANGE,
                 "%s: %llu tensors and %llu metadata entries in %zu "
                 "bytes",
                 g->name, (unsigned long long)nt, (unsigned long long)nkv, len);
  if (rc) goto fail;
  g->n_kv = (int)nkv;
  g->n_tensors = (int)nt;
  /* one block: the zeroed arrays, then the strings (every copied string is
   * shorter than the file) */
  size_t kv_bytes = align16((size_t)nkv * sizeof(*g->kv));
  size_t t_bytes = align16((size_t)nt * sizeof(*g->tensors));
  size_t arrays = kv_bytes + t_bytes + align16((size_t)nt * sizeof(int));
  char *block = malloc(arrays + len + 1);
  if (!block) {
    rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
    goto fail;
  }
  memset(block, 0, arrays);
  g->kv = (struct md_gguf_kv *)block;
  g->tensors = (struct md_gguf_tensor *)(block + kv_bytes);
  g->by_name = (int *)(block + kv_bytes + t_bytes);
  g->strings = block + arrays;
  char *s = g->strings;
  uint32_t align = 32;
  c.where = "metadata entry";
  for (int i = 0; i < g->n_kv && !rc; i++) {
    c.idx = i;
    rc = read_kv(&c, &g->kv[i], &s);
    for (int j = 0; !rc && j < i; j++)
      if (!strcmp(g->kv[j].key, g->kv[i].key))
        rc = cm_fail(err, errlen, CM_ERR_PARSE, "%s: metadata key %s appears twice", g->name,
                     g->kv[i].key);
  }
  if (rc) goto fail;
  const struct md_gguf_kv *a = md_gguf_find_kv(g, "general.alignment");
  if (a) {
    int64_t v;
    if (md_gguf_get_int(g, "general.alignment", &v) || v < 1 || v > MAX_ALIGN || (v & (v - 1))) {
      rc = cm_fail(err, errlen, CM_ERR_PARSE,
                   "%s: general.alignment must be a power of two up to %u", g->name, MAX_ALIGN);
      goto fail;
    }
    align = (uint32_t)v;
  }
  c.where = "tensor";
  for (int i = 0; i < g->n_tensors && !rc; i++) {
    c.idx = i;
    rc = read_tensor(&c, &g->tensors[i], &s);
    g->by_name[i] = i;
  }
  if (rc) goto fail;
  qsort_r(g->by_name, (size_t)g->n_tensors, sizeof(int), by_name_cmp, g);
  for (int i = 1; i < g->n_tensors; i++)
    if (!strcmp(g->tensors[g->by_name[i]].name, g->tensors[g->by_name[i - 1]].name)) {
      rc = cm_fail(err, errlen, CM_ERR_PARSE, "%s: tensor %s appears twice", g->name,
                   g->tensors[g->by_name[i]].name);
      goto fail;
    }
  size_t head = (size_t)(c.p - g->base);
  size_t data = (head + align - 1) / align * align;
  if (g->n_tensors && data > len) {
    rc = cm_fail(err, errlen, CM_ERR_TRUNC, "%s: truncated before the data section", g->name);
    goto fail;
  }
  size_t dlen = data <= len ? len - data : 0;
  for (int i = 0; i < g->n_tensors; i++) {
    struct md_gguf_tensor *t = &g->tensors[i];
    if (t->offset % align) {
      rc = cm_fail(err, errlen, CM_ERR_PARSE,
                   "%s: tensor %s: offset %llu is not a multiple of "
                   "the alignment %u",
                   g->name, t->name, (unsigned long long)t->offset, align);
      goto fail;
    }
    if (!t->nbytes) continue; /* an unknown type: refused when bound */
    if (t->offset > dlen || t->nbytes > dlen - t->offset) {
      rc = cm_fail(err, errlen, CM_ERR_TRUNC,
                   "%s: tensor %s: bytes [%llu, %llu) outside the %zu "
                   "data bytes",
                   g->name, t->name, (unsigned long long)t->offset,
                   (unsigned long long)(t->offset + t->nbytes), dlen);
      goto fail;
    }
    t->data = g->base + data + t->offset;
    g->data_bytes += t->nbytes;
  }
  *out = g;
  return 0;
fail:
  md_gguf_close(g);
  return rc;
}

int md_gguf_open(const char *path, struct md_gguf **out, char *err, size_t errlen) {
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return cm_fail(err, errlen, CM_ERR_NOENT, "%s: cannot open: %m", path);
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size < 4) {
    close(fd);
    return cm_fail(err, errlen, CM_ERR_PARSE, "%s: not a GGUF file", path);
  }
  void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return cm_fail(err, errlen, CM_ERR_NOMEM, "%s: cannot map: %m", path);
  const char *base = strrchr(path, '/');
  int rc = md_gguf_open_mem(map, (size_t)st.st_size, base ? base + 1 : path, out, err, errlen);
  if (rc) {
    munmap(map, (size_t)st.st_size);
    return rc;
  }
  (*out)->map = map;
  return 0;
}

int md_gguf_probe(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return CM_ERR_NOENT;
  char m[4];
  ssize_t n = read(fd, m, 4);
  close(fd);
  return n == 4 && !memcmp(m, "GGUF", 4);
}

void *md_gguf_mapping(const struct md_gguf *g, size_t *len) {
  *len = g->map ? g->len : 0;
  return g->map;
}

void md_gguf_close(struct md_gguf *g) {
  if (!g) return;
  if (g->map) munmap(g->map, g->len);
  free(g->kv); /* and the arrays and strings in its block */
  free(g);
}

uint32_t md_gguf_version(const struct md_gguf *g) {
  return g->version;
}

int md_gguf_kv_count(const struct md_gguf *g) {
  return g->n_kv;
}

const struct md_gguf_kv *md_gguf_kv_at(const struct md_gguf *g, int i) {
  return i >= 0 && i < g->n_kv ? &g->kv[i] : NULL;
}

const struct md_gguf_kv *md_gguf_find_kv(const struct md_gguf *g, const char *key) {
  for (int i = 0; i < g->n_kv; i++)
    if (!strcmp(g->kv[i].key, key)) return &g->kv[i];
  return NULL;
}

int md_gguf_tensor_count(const struct md_gguf *g) {
  return g->n_tensors;
}

const struct md_gguf_tensor *md_gguf_tensor_at(const struct md_gguf *g, int i) {
  return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const struct md_gguf_tensor *md_gguf_find_tensor(const struct md_gguf *g, const char *name) {
  int lo = 0, hi = g->n_tensors - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2, c = strcmp(g->tensors[g->by_name[mid]].name, name);
    if (!c) return &g->tensors[g->by_name[mid]];
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  return NULL;
}

uint64_t md_gguf_data_bytes(const struct md_gguf *g) {
  return g->data_bytes;
}

/* A number of type t at p as an integer (0) or CM_ERR_PARSE (not an integer type). */
static int num_int(uint32_t t, const uint8_t *p, int64_t *out) {
  switch (t) {
  case MD_GGUF_U8: *out = p[0]; return 0;
  case MD_GGUF_I8: *out = (int8_t)p[0]; return 0;
  case MD_GGUF_BOOL: *out = p[0] != 0; return 0;
  case MD_GGUF_U16: *out = (uint16_t)(p[0] | p[1] << 8); return 0;
  case MD_GGUF_I16: *out = (int16_t)(p[0] | p[1] << 8); return 0;
  case MD_GGUF_U32: *out = rd32(p); return 0;
  case MD_GGUF_I32: *out = (int32_t)rd32(p); return 0;
  case MD_GGUF_I64: *out = (int64_t)rd64(p); return 0;
  case MD_GGUF_U64:
    if (rd64(p) > (uint64_t)INT64_MAX) return CM_ERR_PARSE;
    *out = (int64_t)rd64(p);
    return 0;
  default: return CM_ERR_PARSE;
  }
}

static int num_f64(uint32_t t, const uint8_t *p, double *out) {
  if (t == MD_GGUF_F32) {
    uint32_t u = rd32(p);
    float f;
    memcpy(&f, &u, 4);
    *out = f;
    return 0;
  }
  if (t == MD_GGUF_F64) {
    uint64_t u = rd64(p);
    memcpy(out, &u, 8);
    return 0;
  }
  int64_t v;
  int rc = num_int(t, p, &v);
  if (!rc) *out = (double)v;
  return rc;
}

int md_gguf_get_int(const struct md_gguf *g, const char *key, int64_t *out) {
  const struct md_gguf_kv *kv = md_gguf_find_kv(g, key);
  if (!kv) return CM_ERR_NOENT;
  return kv->type == MD_GGUF_BOOL ? CM_ERR_PARSE : num_int(kv->type, kv->val, out);
}

int md_gguf_get_f64(const struct md_gguf *g, const char *key, double *out) {
  const struct md_gguf_kv *kv = md_gguf_find_kv(g, key);
  if (!kv) return CM_ERR_NOENT;
  return kv->type == MD_GGUF_BOOL ? CM_ERR_PARSE : num_f64(kv->type, kv->val, out);
}

int md_gguf_get_bool(const struct md_gguf *g, const char *key, int *out) {
  const struct md_gguf_kv *kv = md_gguf_find_kv(g, key);
  if (!kv) return CM_ERR_NOENT;
  if (kv->type != MD_GGUF_BOOL) return CM_ERR_PARSE;
  *out = kv->val[0] != 0;
  return 0;
}

int md_gguf_get_str(const struct md_gguf *g, const char *key, const char **s, size_t *len) {
  const struct md_gguf_kv *kv = md_gguf_find_kv(g, key);
  if (!kv) return CM_ERR_NOENT;
  if (kv->type != MD_GGUF_STRING) return CM_ERR_PARSE;
  *len = (size_t)rd64(kv->val);
  *s = (const char *)kv->val + 8;
  return 0;
}

int md_gguf_arr_int(const struct md_gguf_kv *kv, uint64_t i, int64_t *out) {
  size_t sz = scalar_size(kv->arr_type);
  if (kv->type != MD_GGUF_ARRAY || !sz || i >= kv->n) return CM_ERR_PARSE;
  return num_int(kv->arr_type, kv->val + i * sz, out);
}

int md_gguf_arr_f64(const struct md_gguf_kv *kv, uint64_t i, double *out) {
  size_t sz = scalar_size(kv->arr_type);
  if (kv->type != MD_GGUF_ARRAY || !sz || i >= kv->n) return CM_ERR_PARSE;
  return num_f64(kv->arr_type, kv->val + i * sz, out);
}

int md_gguf_arr_next_str(const struct md_gguf_kv *kv, uint64_t *pos, const char **s, size_t *len) {
  if (kv->type != MD_GGUF_ARRAY || kv->arr_type != MD_GGUF_STRING) return CM_ERR_PARSE;
  /* *pos: the byte offset of the next element from kv->val; the reader checked every
   * element's extent, so the walk stays inside the file */
  if (*pos >= kv->bytes) return CM_ERR_NOENT;
  const uint8_t *p = kv->val + *pos;
  *len = (size_t)rd64(p);
  *s = (const char *)p + 8;
  *pos += 8 + *len;
  return 0;
}

int md_gguf_split(const struct md_gguf *g, int *no, int *count, char *err, size_t errlen) {
  int64_t n = 1, i = 0;
  int rn = md_gguf_get_int(g, "split.count", &n), ri = md_gguf_get_int(g, "split.no", &i);
  if ((rn && rn != CM_ERR_NOENT) || (ri && ri != CM_ERR_NOENT) || n < 1 || n > MD_GGUF_MAX_SPLITS ||
      i < 0 || i >= n)
    return cm_fail(err, errlen, CM_ERR_PARSE,
                   "%s: split.no and split.count must be integers, 0 <= split.no < split.count <= "
                   "%d",
                   g->name, MD_GGUF_MAX_SPLITS);
  *no = (int)i;
  *count = (int)n;
  return 0;
}

int md_gguf_split_path(const char *first, int no, int count, char *out, size_t n) {
  char tail[32];
  snprintf(tail, sizeof(tail), "-%05d-of-%05d.gguf", 1, count);
  size_t fl = strlen(first), tl = strlen(tail);
  if (fl <= tl || strcmp(first + fl - tl, tail)) return CM_ERR_INVAL;
  int w = snprintf(out, n, "%.*s-%05d-of-%05d.gguf", (int)(fl - tl), first, no + 1, count);
  return w < 0 || (size_t)w >= n ? CM_ERR_INVAL : 0;
}
