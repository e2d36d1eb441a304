/* md-safetensors.c — bounded safetensors header parsing over mmap'd files,
 * sharded checkpoints via model.safetensors.index.json, and the header
 * writer used by make-tiny-model. */
#include "model/md-safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-grow.h"
#include "model/md-config.h"

struct st_map {
  void *base;  /* mmap'd region, or NULL for md_st_open_mem */
  size_t len;  /* bytes */
  char *fname; /* base name */
  int owned;   /* base is the owner's mapping (md_st_owner_pages): it unmaps it */
};

struct md_st {
  struct st_map *maps;
  int n_maps;
  struct md_tensor *t; /* sorted by name after open */
  int n, cap;
  void **copies; /* aligned copies of misaligned tensors */
  int n_copies;
  void (*owner_free)(void *); /* md_st_new's owner of the tensors' bytes */
  void *owner;
  uint64_t bytes;
};

const char *md_st_dtype_name(enum md_st_dtype dt) {
  static const char *names[] = {"F32",  "F16",  "BF16",   "I64",    "I32",  "F8_E4M3", "?",
                                "Q8_0", "Q4_0", "Q4_1",   "Q5_0",   "Q5_1", "Q4_K",    "Q5_K",
                                "Q6_K", "Q3_K", "IQ4_NL", "IQ4_XS", "Q2_K"};
  return (unsigned)dt <= MD_ST_Q2_K ? names[dt] : "?";
}

size_t md_st_dtype_size(enum md_st_dtype dt) {
  static const size_t sizes[] = {4, 2, 2, 8, 4, 1, 0};
  return (unsigned)dt <= MD_ST_OTHER ? sizes[dt] : 0;
}

/* safetensors' own dtypes only: the block formats come from GGUF files */
static enum md_st_dtype dtype_from_name(const char *s) {
  for (int i = 0; i < MD_ST_OTHER; i++)
    if (!strcmp(s, md_st_dtype_name((enum md_st_dtype)i))) return (enum md_st_dtype)i;
  return MD_ST_OTHER;
}

static int cmp_tensor(const void *a, const void *b) {
  return strcmp(((const struct md_tensor *)a)->name, ((const struct md_tensor *)b)->name);
}

void md_st_close(struct md_st *st) {
  if (!st) return;
  for (int i = 0; i < st->n; i++)
    free((char *)st->t[i].name);
  free(st->t);
  for (int i = 0; i < st->n_copies; i++)
    free(st->copies[i]);
  free(st->copies);
  for (int i = 0; i < st->n_maps; i++) {
    if (st->maps[i].base && !st->maps[i].owned) munmap(st->maps[i].base, st->maps[i].len);
    free(st->maps[i].fname);
  }
  free(st->maps);
  if (st->owner_free) st->owner_free(st->owner);
  free(st);
}

void md_st_drop_pages(struct md_st *st) {
  for (int i = 0; i < st->n_maps; i++)
    if (st->maps[i].base) (void)madvise(st->maps[i].base, st->maps[i].len, MADV_DONTNEED);
}

/* madvise DONTNEED on the pages of [p, p + n) that lie in the mapping
 * [base, base + len); 1 when the range is inside it. */
static int drop_in(void *base, size_t len, const void *p, size_t n) {
  uintptr_t b = (uintptr_t)base, a = (uintptr_t)p;
  if (!base || a < b || a - b > len || n > len - (a - b)) return 0;
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t lo = a & ~(uintptr_t)(pg - 1), hi = (a + n + pg - 1) & ~(uintptr_t)(pg - 1);
  if (hi > b + len) hi = b + len; /* the mapping's last page may be partial */
  if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
  return 1;
}

void md_st_drop_range(struct md_st *st, const void *p, size_t n) {
  for (int i = 0; i < st->n_maps; i++)
    if (drop_in(st->maps[i].base, st->maps[i].len, p, n)) return;
}

void md_st_owner_pages(struct md_st *st, void *base, size_t len) {
  struct st_map *m = &st->maps[st->n_maps - 1];
  m->base = base;
  m->len = len;
  m->owned = 1;
}

/* Appends tensor t under a copy of name, as found in file, and counts its
 * bytes. */
static int st_push(struct md_st *st, struct md_tensor t, const char *name, const char *file) {
  if (cm_grow_items(&st->t, &st->cap, st->n + 1, sizeof(*st->t), 64)) return CM_ERR_NOMEM;
  t.name = strdup(name);
  if (!t.name) return CM_ERR_NOMEM;
  t.file = file;
  st->t[st->n++] = t;
  st->bytes += t.nbytes;
  return 0;
}

/* Parses one file image `buf[len]` and appends its tensors. */
static int st_parse(struct md_st *st, const unsigned char *buf, size_t len, const char *fname,
                    char *err, size_t errlen) {
  if (len < 8) return cm_fail(err, errlen, CM_ERR_TRUNC, "%s: shorter than 8 bytes", fname);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--)
    hlen = (hlen << 8) | buf[i];
  if (hlen > MD_ST_MAX_HEADER)
    return cm_fail(err, errlen, CM_ERR_TOOBIG, "%s: header of %llu bytes is too large", fname,
                   (unsigned long long)hlen);
  if (hlen > len - 8)
    return cm_fail(err, errlen, CM_ERR_TRUNC, "%s: header length %llu passes the end of the file",
                   fname, (unsigned long long)hlen);
  const unsigned char *data = buf + 8 + hlen;
  size_t data_len = len - 8 - (size_t)hlen;
  json_error_t jerr;
  json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return cm_fail(err, errlen, CM_ERR_PARSE, "%s: header JSON: %s (column %d)", fname, jerr.text,
                   jerr.column);
  int rc = 0;
  if (!json_is_object(root)) {
    rc = cm_fail(err, errlen, CM_ERR_PARSE, "%s: header is not a JSON object", fname);
    goto done;
  }
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) {
    if (!strcmp(key, "__metadata__")) continue;
    if (!json_is_object(val)) {
      rc = cm_fail(err, errlen, CM_ERR_PARSE, "%s: tensor %s: entry is not an object", fname, key);
      goto done;
    }
    const json_t *dt = json_object_get(val, "dtype"), *sh = json_object_get(val, "shape"),
                 *off = json_object_get(val, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(off) ||
        json_array_size(off) != 2) {
      rc = cm_fail(err, errlen, CM_ERR_PARSE, "%s: tensor %s: dtype, shape or data_offsets missing",
                   fname, key);
      goto done;
    }
    struct md_tensor t = {0};
    snprintf(t.dtype_name, sizeof(t.dtype_name), "%s", json_string_value(dt));
    t.dtype = dtype_from_name(json_string_value(dt));
    size_t nd = json_array_size(sh);
    if (nd > MD_ST_MAX_DIMS) {
      rc = cm_fail(err, errlen, CM_ERR_SHAPE, "%s: tensor %s: %zu dimensions (at most %d)", fname,
                   key, nd, MD_ST_MAX_DIMS);
      goto done;
    }
    t.ndim = (int)nd;
    uint64_t count = 1;
    for (size_t d = 0; d < nd; d++) {
      const json_t *e = json_array_get(sh, d);
      json_int_t v = json_is_integer(e) ? json_integer_value(e) : -1;
      if (v < 0 || v > ((json_int_t)1 << 40)) {
        rc =
            cm_fail(err, errlen, CM_ERR_SHAPE, "%s: tensor %s: bad shape entry %zu", fname, key, d);
        goto done;
      }
      t.shape[d] = v;
      if (v && count > UINT64_MAX / (uint64_t)v) {
        rc = cm_fail(err, errlen, CM_ERR_TOOBIG, "%s: tensor %s: shape overflows", fname, key);
        goto done;
      }
      count *= (uint64_t)v;
    }
    const json_t *b0 = json_array_get(off, 0), *b1 = json_array_get(off, 1);
    json_int_t o0 = json_is_integer(b0) ? json_integer_value(b0) : -1;
    json_int_t o1 = json_is_integer(b1) ? json_integer_value(b1) : -1;
    if (o0 < 0 || o1 < o0 || (uint64_t)o1 > data_len) {
      rc = cm_fail(err, errlen, CM_ERR_RANGE,
                   "%s: tensor %s: data_offsets [%lld, %lld] outside the %zu data bytes", fname,
                   key, (long long)o0, (long long)o1, data_len);
      goto done;
    }
    t.nbytes = (size_t)(o1 - o0);
    size_t esz = md_st_dtype_size(t.dtype);
    if (esz) {
      if (count > UINT64_MAX / esz || count * esz != t.nbytes) {
        rc = cm_fail(err, errlen, CM_ERR_SHAPE,
                     "%s: tensor %s: %zu data bytes do not match its shape and dtype %s", fname,
                     key, t.nbytes, t.dtype_name);
        goto done;
      }
    }
    t.data = data + o0;
    if (esz && ((uintptr_t)t.data % esz) && t.nbytes) {
      void *copy = malloc(t.nbytes);
      void **nc = realloc(st->copies, sizeof(void *) * (size_t)(st->n_copies + 1));
      if (!copy || !nc) {
        free(copy);
        if (nc) st->copies = nc;
        rc = cm_fail(err, errlen, CM_ERR_NOMEM, "%s: out of memory", fname);
        goto done;
      }
      st->copies = nc;
      memcpy(copy, t.data, t.nbytes);
      st->copies[st->n_copies++] = copy;
      t.data = copy;
    }
    if (st_push(st, t, key, fname)) {
      rc = cm_fail(err, errlen, CM_ERR_NOMEM, "%s: out of memory", fname);
      goto done;
    }
  }
done:
  json_decref(root);
  return rc;
}

static int st_finish(struct md_st *st, char *err, size_t errlen) {
  if (st->n > 1) qsort(st->t, (size_t)st->n, sizeof(*st->t), cmp_tensor); /* (NULL, 0): undefined */
  for (int i = 1; i < st->n; i++)
    if (!strcmp(st->t[i].name, st->t[i - 1].name))
      return cm_fail(err, errlen, CM_ERR_INVAL, "tensor %s appears in both %s and %s",
                     st->t[i].name, st->t[i - 1].file, st->t[i].file);
  return 0;
}

static int st_add_map(struct md_st *st, void *base, size_t len, const char *fname) {
  struct st_map *nm = realloc(st->maps, sizeof(*nm) * (size_t)(st->n_maps + 1));
  if (!nm) return CM_ERR_NOMEM;
  st->maps = nm;
  nm[st->n_maps].base = base;
  nm[st->n_maps].len = len;
  nm[st->n_maps].owned = 0;
  nm[st->n_maps].fname = strdup(fname);
  if (!nm[st->n_maps].fname) return CM_ERR_NOMEM;
  st->n_maps++;
  return 0;
}

/* mmaps `path` and parses it into st. */
static int st_map_file(struct md_st *st, const char *path, char *err, size_t errlen) {
  const char *slash = strrchr(path, '/');
  const char *fname = slash ? slash + 1 : path;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return cm_fail(err, errlen, errno == ENOENT ? CM_ERR_NOENT : CM_ERR_IO, "%s: %s", path,
                   strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
    close(fd);
    return cm_fail(err, errlen, CM_ERR_IO, "%s: not a regular file", path);
  }
  size_t len = (size_t)sb.st_size;
  if (len < 8) {
    close(fd);
    return cm_fail(err, errlen, CM_ERR_TRUNC, "%s: shorter than 8 bytes", path);
  }
  void *base = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (base == MAP_FAILED)
    return cm_fail(err, errlen, CM_ERR_IO, "%s: mmap: %s", path, strerror(errno));
  int rc = st_add_map(st, base, len, fname);
  if (rc) {
    munmap(base, len);
    return cm_fail(err, errlen, rc, "%s: out of memory", path);
  }
  return st_parse(st, base, len, st->maps[st->n_maps - 1].fname, err, errlen);
}

int md_st_open_file(const char *path, struct md_st **out, char *err, size_t errlen) {
  struct md_st *st = calloc(1, sizeof(*st));
  if (!st) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  int rc = st_map_file(st, path, err, errlen);
  if (!rc) rc = st_finish(st, err, errlen);
  if (rc) {
    md_st_close(st);
    return rc;
  }
  *out = st;
  return 0;
}

int md_st_new(const char *fname, void (*owner_free)(void *), void *owner, struct md_st **out) {
  *out = NULL;
  struct md_st *st = calloc(1, sizeof(*st));
  if (!st) return CM_ERR_NOMEM;
  if (st_add_map(st, NULL, 0, fname)) {
    md_st_close(st);
    return CM_ERR_NOMEM;
  }
  st->owner_free = owner_free;
  st->owner = owner;
  *out = st;
  return 0;
}

void *md_st_owner(const struct md_st *st, void (*owner_free)(void *)) {
  return st && owner_free && st->owner_free == owner_free ? st->owner : NULL;
}

int md_st_add_file(struct md_st *st, const char *fname) {
  return st_add_map(st, NULL, 0, fname);
}

int md_st_add(struct md_st *st, const struct md_tensor *t) {
  return st_push(st, *t, t->name, st->maps[st->n_maps - 1].fname);
}

int md_st_seal(struct md_st *st, char *err, size_t errlen) {
  return st_finish(st, err, errlen);
}

int md_st_open_mem(const void *buf, size_t len, const char *name, struct md_st **out, char *err,
                   size_t errlen) {
  struct md_st *st = calloc(1, sizeof(*st));
  if (!st) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  int rc = st_add_map(st, NULL, 0, name);
  if (!rc) rc = st_parse(st, buf, len, st->maps[0].fname, err, errlen);
  if (!rc) rc = st_finish(st, err, errlen);
  if (rc) {
    md_st_close(st);
    return rc;
  }
  *out = st;
  return 0;
}

/* A shard name from the index must be a plain file name in the directory. */
static int shard_name_ok(const char *s) {
  size_t n = strlen(s);
  return n > 0 && n < 256 && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

int md_st_open_dir(const char *dir, struct md_st **out, char *err, size_t errlen) {
  char path[4096];
  int g = md_model_gguf_path(dir, path, sizeof(path), err, errlen);
  if (g < 0) return g;
  if (g) return md_st_open_gguf(path, out, err, errlen);
  snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
  char *text = NULL;
  size_t len = 0;
  int rc = md_read_file(path, 64u << 20, &text, &len);
  if (rc == CM_ERR_NOENT) {
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    if (access(path, F_OK))
      return cm_fail(err, errlen, CM_ERR_NOENT,
                     "%s: neither model.safetensors nor model.safetensors.index.json found", dir);
    return md_st_open_file(path, out, err, errlen);
  }
  if (rc) return cm_fail(err, errlen, rc, "%s: %s", path, cm_strerror(rc));
  json_error_t jerr;
  json_t *root = json_loadb(text, len, 0, &jerr);
  free(text);
  if (!root)
    return cm_fail(err, errlen, CM_ERR_PARSE, "model.safetensors.index.json: line %d: %s",
                   jerr.line, jerr.text);
  struct md_st *st = NULL;
  const json_t *wm = json_object_get(root, "weight_map");
  if (!json_is_object(wm)) {
    rc = cm_fail(err, errlen, CM_ERR_PARSE, "model.safetensors.index.json: weight_map missing");
    goto fail;
  }
  st = calloc(1, sizeof(*st));
  if (!st) {
    rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
    goto fail;
  }
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)wm, key, val) {
    const char *f = json_is_string(val) ? json_string_value(val) : "";
    if (!shard_name_ok(f)) {
      rc = cm_fail(err, errlen, CM_ERR_INVAL,
                   "model.safetensors.index.json: tensor %s: bad shard name \"%s\"", key, f);
      goto fail;
    }
    int seen = 0;
    for (int i = 0; i < st->n_maps && !seen; i++)
      seen = !strcmp(st->maps[i].fname, f);
    if (seen) continue;
    snprintf(path, sizeof(path), "%s/%s", dir, f);
    if ((rc = st_map_file(st, path, err, errlen))) goto fail;
  }
  if ((rc = st_finish(st, err, errlen))) goto fail;
  json_object_foreach((json_t *)wm, key, val) {
    const struct md_tensor *t = md_st_find(st, key);
    if (!t || strcmp(t->file, json_string_value(val))) {
      rc =
          cm_fail(err, errlen, CM_ERR_NOENT, "model.safetensors.index.json: tensor %s is not in %s",
                  key, json_string_value(val));
      goto fail;
    }
  }
  json_decref(root);
  *out = st;
  return 0;
fail:
  md_st_close(st);
  json_decref(root);
  return rc;
}

const struct md_tensor *md_st_find(const struct md_st *st, const char *name) {
  struct md_tensor key = {.name = name};
  return bsearch(&key, st->t, (size_t)st->n, sizeof(*st->t), cmp_tensor);
}

const char *md_st_text_prefix(const struct md_st *st) {
  static const char *prefixes[] = {"model.language_model.", "language_model.model.", "model.", ""};
  char name[128];
  for (size_t i = 0; i < CM_ARRAY_LEN(prefixes); i++) {
    snprintf(name, sizeof(name), "%sembed_tokens.weight", prefixes[i]);
    if (md_st_find(st, name)) return prefixes[i];
  }
  return NULL;
}

int md_st_count(const struct md_st *st) {
  return st->n;
}

const struct md_tensor *md_st_get(const struct md_st *st, int i) {
  return i >= 0 && i < st->n ? &st->t[i] : NULL;
}

uint64_t md_st_data_bytes(const struct md_st *st) {
  return st->bytes;
}

/* ---- writer --------------------------------------------------------------- */

int md_st_write_header(FILE *f, const struct md_st_entry *e, int n) {
  json_t *root = json_object();
  if (!root) return CM_ERR_NOMEM;
  int rc = 0;
  json_object_set_new(root, "__metadata__", json_pack("{s:s}", "format", "pt"));
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    size_t esz = md_st_dtype_size(e[i].dtype);
    if (!esz || e[i].ndim < 0 || e[i].ndim > MD_ST_MAX_DIMS) {
      rc = CM_ERR_INVAL;
      goto done;
    }
    uint64_t bytes = esz;
    json_t *shape = json_array();
    for (int d = 0; d < e[i].ndim; d++) {
      bytes *= (uint64_t)e[i].shape[d];
      json_array_append_new(shape, json_integer(e[i].shape[d]));
    }
    json_t *ent = json_object();
    json_object_set_new(ent, "dtype", json_string(md_st_dtype_name(e[i].dtype)));
    json_object_set_new(ent, "shape", shape);
    json_object_set_new(ent, "data_offsets",
                        json_pack("[I,I]", (json_int_t)off, (json_int_t)(off + bytes)));
    json_object_set_new(root, e[i].name, ent);
    off += bytes;
  }
  char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
  if (!s) {
    rc = CM_ERR_NOMEM;
    goto done;
  }
  size_t len = strlen(s), padded = (len + 7) & ~(size_t)7;
  unsigned char hdr[8];
  for (int i = 0; i < 8; i++)
    hdr[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  if (fwrite(hdr, 1, 8, f) != 8 || fwrite(s, 1, len, f) != len) rc = CM_ERR_IO;
  for (size_t i = len; i < padded && !rc; i++)
    if (fputc(' ', f) == EOF) rc = CM_ERR_IO;
  free(s);
done:
  json_decref(root);
  return rc;
}
