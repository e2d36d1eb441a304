/* tk-load.c — builds a struct tk_tokenizer from a Hugging Face tokenizer.json.
 *
 * The file is read whole and scanned in place (tk-json.h): the model's
 * vocab and merges stream straight into hash tables; the small sections
 * (normalizer, pre_tokenizer, post_processor, decoder, added_tokens) go
 * through Jansson (tk-conf.c). Anything this tokenizer does not
 * implement is refused with a message naming the field (see tk-tokenizer.h
 * for what is supported). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "common/cm-grow.h"
#include "tokenizer/tk-json.h"
#include "tokenizer/tk-load.h"

int tk_ld_err(struct tk_ld *l, int code, const char *fmt, ...) {
  if (l->err && l->errlen) {
    int n = snprintf(l->err, l->errlen, "tokenizer.json: ");
    if (n > 0 && (size_t)n < l->errlen) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(l->err + n, l->errlen - (size_t)n, fmt, ap);
      va_end(ap);
    }
  }
  return code;
}

int tk_blob_add(struct tk_tokenizer *tok, const char *s, size_t len, uint32_t *off) {
  if (tok->blob_len + len + 1 > UINT32_MAX) return CM_ERR_TOOBIG;
  if (cm_grow(&tok->blob, &tok->blob_cap, tok->blob_len + len + 1, 1 << 20)) return CM_ERR_NOMEM;
  memcpy(tok->blob + tok->blob_len, s, len);
  tok->blob[tok->blob_len + len] = 0;
  *off = (uint32_t)tok->blob_len;
  tok->blob_len += len + 1;
  return 0;
}

/* Turns a failed scan into the load's error: a lack of memory passes
 * through; anything else is malformed JSON at the scanner's first error,
 * in the named section ("model.vocab"), or in the file's own structure
 * when section is NULL. */
static int ld_malformed(struct tk_ld *l, const struct tk_json *t, int rc, const char *section) {
  if (rc == CM_ERR_NOMEM) return rc;
  if (section)
    return tk_ld_err(l, CM_ERR_PARSE, "%s: malformed JSON near byte %zu of the section", section,
                     t->err_off);
  return tk_ld_err(l, CM_ERR_PARSE, "malformed JSON near byte %zu", t->err_off);
}

/* ---- model.vocab ---------------------------------------------------------- */

static int ld_vocab(struct tk_ld *l, const char *text, size_t len) {
  struct tk_tokenizer *tok = l->tok;
  struct tk_json t;
  int rc;
  tk_json_init(&t, text, len);
  if ((rc = tk_json_expect(&t, '{'))) goto parse;
  if (tk_json_peek(&t) == '}') {
    tk_json_free(&t);
    return tk_ld_err(l, CM_ERR_PARSE, "model.vocab is empty");
  }
  do {
    const char *s;
    size_t n;
    int64_t id;
    if ((rc = tk_json_string(&t, &s, &n)) || (rc = tk_json_expect(&t, ':')) ||
        (rc = tk_json_int(&t, &id)))
      goto parse;
    if (id < 0 || id >= (1 << 24)) { /* s is t's scratch: the message first */
      rc = tk_ld_err(l, CM_ERR_RANGE, "model.vocab: id %lld of \"%.40s\" out of range",
                     (long long)id, s);
      tk_json_free(&t);
      return rc;
    }
    if (l->n_v == l->cap_v) {
      size_t nc = l->cap_v ? l->cap_v * 2 : 65536;
      struct tk_ld_vocab *v = realloc(l->v, nc * sizeof *v);
      if (!v) {
        tk_json_free(&t);
        return CM_ERR_NOMEM;
      }
      l->v = v;
      l->cap_v = nc;
    }
    uint32_t off;
    if ((rc = tk_blob_add(tok, s, n, &off))) {
      tk_json_free(&t);
      return rc;
    }
    l->v[l->n_v++] = (struct tk_ld_vocab){off, (uint32_t)n, (int32_t)id};
  } while ((rc = tk_json_more(&t, '}')) == 1);
parse:
  tk_json_free(&t);
  return rc < 0 ? ld_malformed(l, &t, rc, "model.vocab") : 0;
}

/* Sizes the id tables for ids [0, n_ids) and fills in the model vocab. */
static int ld_ids(struct tk_ld *l, int32_t n_ids) {
  struct tk_tokenizer *tok = l->tok;
  tok->n_ids = n_ids;
  /* the per-id tables in one allocation, widest first */
  size_t n = (size_t)n_ids;
  tok->tok_off = calloc(n, sizeof *tok->tok_off + sizeof *tok->tok_len + sizeof *tok->byte_of +
                               sizeof *tok->tok_flags);
  uint32_t hsize = 1024;
  while (hsize < l->n_v * 2) hsize *= 2;
  tok->vhash = malloc(hsize * sizeof *tok->vhash);
  if (!tok->tok_off || !tok->vhash) return CM_ERR_NOMEM;
  tok->tok_len = tok->tok_off + n;
  tok->byte_of = (int16_t *)(tok->tok_len + n);
  tok->tok_flags = (uint8_t *)(tok->byte_of + n);
  tok->vmask = hsize - 1;
  memset(tok->vhash, 0, hsize * sizeof *tok->vhash);
  for (int32_t i = 0; i < n_ids; i++) tok->byte_of[i] = -1;
  for (size_t i = 0; i < l->n_v; i++) {
    const struct tk_ld_vocab *v = &l->v[i];
    int32_t id = v->id;
    if (tok->tok_flags[id] & TK_TOKF_PRESENT)
      return tk_ld_err(l, CM_ERR_PARSE, "model.vocab: id %d appears twice", id);
    tok->tok_off[id] = v->off;
    tok->tok_len[id] = v->len;
    tok->tok_flags[id] = TK_TOKF_PRESENT;
    const char *s = tok->blob + v->off;
    uint64_t hash = tk_hash(s, v->len);
    uint32_t h = (uint32_t)hash & tok->vmask;
    while (tok->vhash[h]) {
      uint64_t e = tok->vhash[h];
      int32_t o = (int32_t)(uint32_t)e - 1;
      if ((uint32_t)(e >> 32) == tk_vtag(hash, v->len) && tok->tok_len[o] == v->len &&
          !memcmp(tok->blob + tok->tok_off[o], s, v->len))
        return tk_ld_err(l, CM_ERR_PARSE, "model.vocab: \"%.40s\" appears twice", s);
      h = (h + 1) & tok->vmask;
    }
    tok->vhash[h] = (uint64_t)tk_vtag(hash, v->len) << 32 | (uint32_t)(id + 1);
  }
  tok->n_model = (int32_t)l->n_v;
  return 0;
}

/* ---- model.merges --------------------------------------------------------- */

/* Merges are resolved in batches so that the cache misses of their vocab
 * lookups overlap: hash all keys and prefetch their slots, then the
 * candidate ids' string offsets, then the strings, then verify. */
#define TK_MBATCH 64

struct mbatch {
  int n;
  int32_t rank[TK_MBATCH];
  size_t off[TK_MBATCH], na[TK_MBATCH], nb[TK_MBATCH]; /* bytes; a then b in pool */
  uint64_t hash[TK_MBATCH][3];  /* a, b, a+b */
  int32_t cand[TK_MBATCH][3];   /* probable id (first slot), -1 unknown */
  char *pool;
  size_t pool_len, pool_cap; /* bytes */
};

static int mb_add(struct mbatch *b, int32_t rank, const char *x, size_t nx, const char *y,
                  size_t ny) {
  if (cm_grow(&b->pool, &b->pool_cap, b->pool_len + nx + ny, 8192)) return CM_ERR_NOMEM;
  int i = b->n++;
  b->rank[i] = rank;
  b->off[i] = b->pool_len;
  b->na[i] = nx;
  b->nb[i] = ny;
  memcpy(b->pool + b->pool_len, x, nx);
  memcpy(b->pool + b->pool_len + nx, y, ny);
  b->pool_len += nx + ny;
  return 0;
}

static void mb_key(const struct mbatch *b, int i, int k, const char **s, size_t *n) {
  *s = b->pool + b->off[i] + (k == 1 ? b->na[i] : 0);
  *n = k == 0 ? b->na[i] : k == 1 ? b->nb[i] : b->na[i] + b->nb[i];
}

static int mb_flush(struct tk_ld *l, struct mbatch *b) {
  struct tk_tokenizer *tok = l->tok;
  const char *s;
  size_t n;
  for (int i = 0; i < b->n; i++)
    for (int k = 0; k < 3; k++) {
      mb_key(b, i, k, &s, &n);
      b->hash[i][k] = tk_hash(s, n);
      __builtin_prefetch(&tok->vhash[(uint32_t)b->hash[i][k] & tok->vmask]);
    }
  for (int i = 0; i < b->n; i++)
    for (int k = 0; k < 3; k++) {
      mb_key(b, i, k, &s, &n);
      uint64_t e = tok->vhash[(uint32_t)b->hash[i][k] & tok->vmask];
      b->cand[i][k] = -1;
      if (e && (uint32_t)(e >> 32) == tk_vtag(b->hash[i][k], n)) {
        int32_t id = (int32_t)(uint32_t)e - 1;
        b->cand[i][k] = id;
        __builtin_prefetch(&tok->tok_off[id]);
        __builtin_prefetch(&tok->tok_len[id]);
      }
    }
  for (int i = 0; i < b->n; i++)
    for (int k = 0; k < 3; k++)
      if (b->cand[i][k] >= 0) __builtin_prefetch(tok->blob + tok->tok_off[b->cand[i][k]]);
  int32_t ids[TK_MBATCH][3];
  for (int i = 0; i < b->n; i++) {
    for (int k = 0; k < 3; k++) {
      mb_key(b, i, k, &s, &n);
      int32_t c = b->cand[i][k];
      if (c >= 0 && tok->tok_len[c] == n && !memcmp(tok->blob + tok->tok_off[c], s, n))
        ids[i][k] = c;
      else
        ids[i][k] = tk_vocab_get(tok, s, n); /* collisions and longer probes */
    }
    if (ids[i][0] < 0 || ids[i][1] < 0) {
      int k = ids[i][0] < 0 ? 0 : 1;
      mb_key(b, i, k, &s, &n);
      return tk_ld_err(l, CM_ERR_PARSE, "model.merges[%d]: \"%.*s\" is not in the vocab",
                           b->rank[i], (int)(n < 40 ? n : 40), s);
    }
    if (ids[i][2] < 0)
      return tk_ld_err(l, CM_ERR_PARSE,
                           "model.merges[%d]: the merged token is not in the vocab", b->rank[i]);
    uint64_t key = (uint64_t)(uint32_t)ids[i][0] << 32 | (uint32_t)ids[i][1];
    b->hash[i][0] = tk_hash((const char *)&key, sizeof key) & tok->mmask;
    __builtin_prefetch(&tok->mhash[b->hash[i][0]], 1);
  }
  /* in rank order: a repeated pair keeps the later rank, as HF's map does */
  for (int i = 0; i < b->n; i++) {
    uint64_t key = (uint64_t)(uint32_t)ids[i][0] << 32 | (uint32_t)ids[i][1];
    uint64_t h = b->hash[i][0];
    while (tok->mhash[h].key != UINT64_MAX && tok->mhash[h].key != key) h = (h + 1) & tok->mmask;
    tok->mhash[h].key = key;
    tok->mhash[h].rank = b->rank[i];
    tok->mhash[h].result = ids[i][2];
  }
  b->n = 0;
  b->pool_len = 0;
  return 0;
}

static int ld_merges(struct tk_ld *l, const char *text, size_t len) {
  struct tk_tokenizer *tok = l->tok;
  struct tk_json t;
  struct mbatch mb = {0};
  char *first = NULL;
  size_t firstcap = 0;
  int rc;
  /* size the table from the commas: one per entry ("a b" strings) or two
   * ([a, b] pairs) */
  size_t est = 1;
  for (size_t i = 0; i < len; i++) est += text[i] == ',';
  const char *first_el = text + 1;
  while (first_el < text + len && (*first_el == ' ' || *first_el == '\n')) first_el++;
  if (first_el < text + len && *first_el == '[') est = est / 2 + 1;
  uint64_t hsize = 1024;
  while (hsize < est * 2) hsize *= 2;
  tok->mhash = malloc(hsize * sizeof *tok->mhash);
  if (!tok->mhash) return CM_ERR_NOMEM;
  tok->mmask = hsize - 1;
  for (uint64_t i = 0; i < hsize; i++) tok->mhash[i].key = UINT64_MAX;
  tk_json_init(&t, text, len);
  if ((rc = tk_json_expect(&t, '['))) goto parse;
  int32_t rank = 0;
  if (tk_json_peek(&t) == ']') goto done;
  do {
    const char *s;
    size_t n;
    if (tk_json_peek(&t) == '"') {
      if ((rc = tk_json_string(&t, &s, &n))) goto parse;
      const char *sp = memchr(s, ' ', n);
      if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp - s) - 1)) {
        rc = tk_ld_err(l, CM_ERR_PARSE, "model.merges[%d]: \"%.40s\" is not two tokens", rank, s);
        goto out;
      }
      rc = mb_add(&mb, rank, s, (size_t)(sp - s), sp + 1, n - (size_t)(sp - s) - 1);
    } else {
      size_t n1;
      if ((rc = tk_json_expect(&t, '[')) || (rc = tk_json_string(&t, &s, &n1))) goto parse;
      if (n1 + 1 > firstcap) {
        char *f = realloc(first, n1 + 64);
        if (!f) {
          rc = CM_ERR_NOMEM;
          goto out;
        }
        first = f;
        firstcap = n1 + 64;
      }
      memcpy(first, s, n1);
      if ((rc = tk_json_expect(&t, ',')) || (rc = tk_json_string(&t, &s, &n)) ||
          (rc = tk_json_expect(&t, ']')))
        goto parse;
      rc = mb_add(&mb, rank, first, n1, s, n);
    }
    if (!rc && mb.n == TK_MBATCH) rc = mb_flush(l, &mb);
    if (rc) goto out;
    rank++;
  } while ((rc = tk_json_more(&t, ']')) == 1);
  if (rc < 0) goto parse;
done:
  if ((rc = mb_flush(l, &mb))) goto out;
  tok->n_merges = rank;
  goto out;
parse:
  rc = ld_malformed(l, &t, rc, "model.merges");
out:
  tk_json_free(&t);
  free(mb.pool);
  free(first);
  return rc;
}

/* ---- the file ------------------------------------------------------------- */

static int ld_read_file(struct tk_ld *l, const char *path, char **buf, size_t *len) {
  struct stat sb;
  char *full = NULL;
  if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
    size_t n = strlen(path) + sizeof "/tokenizer.json";
    full = malloc(n);
    if (!full) return CM_ERR_NOMEM;
    snprintf(full, n, "%s/tokenizer.json", path);
    path = full;
  }
  int rc = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
    rc = errno == ENOENT ? CM_ERR_NOENT : CM_ERR_IO;
    if (l->err) snprintf(l->err, l->errlen, "%s: %s", path, fd < 0 ? strerror(errno) :
                         "not a regular file");
    goto out;
  }
  if (sb.st_size > (off_t)1 << 31) {
    rc = tk_ld_err(l, CM_ERR_TOOBIG, "file larger than 2 GiB");
    goto out;
  }
  *len = (size_t)sb.st_size;
  *buf = malloc(*len + 1);
  if (!*buf) {
    rc = CM_ERR_NOMEM;
    goto out;
  }
  size_t got = 0;
  while (got < *len) {
    ssize_t r = read(fd, *buf + got, *len - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      rc = tk_ld_err(l, CM_ERR_IO, "read failed");
      goto out;
    }
    got += (size_t)r;
  }
  (*buf)[*len] = 0;
out:
  if (fd >= 0) close(fd);
  free(full);
  return rc;
}

struct span {
  const char *s;
  size_t n; /* bytes; 0 = absent */
};

/* Scans the top-level object and the model object, recording the raw
 * span of each section we use. */
static int ld_scan(struct tk_ld *l, const char *buf, size_t len, struct span *sec, struct span *vocab,
                   struct span *merges, struct span *model_rest) {
  static const char *const names[] = {"added_tokens", "normalizer", "pre_tokenizer",
                                      "post_processor", "decoder"};
  struct tk_json t;
  int rc;
  tk_json_init(&t, buf, len);
  if ((rc = tk_json_expect(&t, '{'))) goto parse;
  if (tk_json_peek(&t) == '}') {
    rc = CM_ERR_PARSE; /* an empty object has no model */
    goto parse;
  }
  do {
    const char *k;
    size_t kn;
    if ((rc = tk_json_string(&t, &k, &kn)) || (rc = tk_json_expect(&t, ':'))) goto parse;
    struct span *dst = NULL;
    for (size_t i = 0; i < 5; i++)
      if (!strcmp(k, names[i])) dst = &sec[i];
    if (strcmp(k, "model")) {
      const char *vs;
      size_t vn;
      if ((rc = tk_json_skip(&t, &vs, &vn))) goto parse;
      if (dst) *dst = (struct span){vs, vn};
      continue;
    }
    /* model: stream past vocab and merges, keep the scalar options */
    if ((rc = tk_json_expect(&t, '{'))) goto parse;
    model_rest->s = t.p - 1;
    if (tk_json_peek(&t) != '}') {
      do {
        const char *mk;
        size_t mn;
        if ((rc = tk_json_string(&t, &mk, &mn)) || (rc = tk_json_expect(&t, ':'))) goto parse;
        struct span *md = !strcmp(mk, "vocab") ? vocab : !strcmp(mk, "merges") ? merges : NULL;
        const char *vs;
        size_t vn;
        if ((rc = tk_json_skip(&t, &vs, &vn))) goto parse;
        if (md) *md = (struct span){vs, vn};
      } while ((rc = tk_json_more(&t, '}')) == 1);
      if (rc < 0) goto parse;
    } else {
      t.p++;
    }
    model_rest->n = (size_t)(t.p - model_rest->s);
  } while ((rc = tk_json_more(&t, '}')) == 1);
parse:
  tk_json_free(&t);
  return rc < 0 ? ld_malformed(l, &t, rc, NULL) : 0;
}

/* The model object without vocab and merges, for its scalar options: a
 * compact copy with those two values replaced by 0. */
static json_t *ld_model_scalars(struct tk_ld *l, struct span rest, struct span vocab,
                                struct span merges, int *rc) {
  char *copy = malloc(rest.n + 1);
  if (!copy) {
    *rc = CM_ERR_NOMEM;
    return NULL;
  }
  struct span cut[2] = {vocab, merges};
  if (cut[0].n && cut[1].n && cut[1].s < cut[0].s) {
    struct span t = cut[0];
    cut[0] = cut[1];
    cut[1] = t;
  }
  size_t n = 0;
  const char *p = rest.s;
  for (int i = 0; i < 2; i++) {
    if (!cut[i].n) continue;
    memcpy(copy + n, p, (size_t)(cut[i].s - p));
    n += (size_t)(cut[i].s - p);
    copy[n++] = '0';
    p = cut[i].s + cut[i].n;
  }
  memcpy(copy + n, p, (size_t)(rest.s + rest.n - p));
  n += (size_t)(rest.s + rest.n - p);
  json_t *m = tk_ld_section(l, copy, n, "model", rc);
  free(copy);
  return m;
}

void tk_free(struct tk_tokenizer *tok) {
  if (!tok) return;
  tk_state_pool_free(tok);
  free(tok->blob);
  free(tok->tok_off); /* tok_len, byte_of and tok_flags with it */
  free(tok->bmp_id);
  free(tok->vhash);
  free(tok->mhash);
  free(tok->trie);
  for (int i = 0; i < tok->n_norm; i++) {
    free(tok->norm[i].from);
    free(tok->norm[i].to);
  }
  for (int i = 0; i < tok->n_dec; i++) {
    free(tok->dec[i].from);
    free(tok->dec[i].to);
  }
  free(tok->split_pat);
  free(tok);
}

static int load_buf(struct tk_ld *lp, char *buf, size_t len, struct tk_tokenizer **out);

int tk_load(const char *path, struct tk_tokenizer **out, char *errbuf, size_t errlen) {
  struct tk_ld l = {.err = errbuf, .errlen = errlen};
  char *buf = NULL;
  size_t len = 0;
  *out = NULL;
  if (errbuf && errlen) errbuf[0] = 0;
  int rc = ld_read_file(&l, path, &buf, &len);
  if (rc) {
    free(buf);
    return rc;
  }
  return load_buf(&l, buf, len, out);
}

int tk_load_json(const char *text, size_t len, struct tk_tokenizer **out, char *errbuf,
                 size_t errlen) {
  struct tk_ld l = {.err = errbuf, .errlen = errlen};
  *out = NULL;
  if (errbuf && errlen) errbuf[0] = 0;
  char *buf = malloc(len + 1);
  if (!buf) return CM_ERR_NOMEM;
  memcpy(buf, text, len);
  buf[len] = 0;
  return load_buf(&l, buf, len, out);
}

/* Builds the tokenizer from tokenizer.json's text buf[len] (owned: freed here). */
static int load_buf(struct tk_ld *lp, char *buf, size_t len, struct tk_tokenizer **out) {
  struct tk_ld l = *lp;
  json_t *js[5] = {0}, *model = NULL;
  struct span sec[5] = {{0}}, vocab = {0}, merges = {0}, rest = {0};
  int rc;
  l.tok = calloc(1, sizeof *l.tok);
  if (!l.tok) {
    free(buf);
    return CM_ERR_NOMEM;
  }
  struct tk_tokenizer *tok = l.tok;
  memset(tok->trie_root, 0xff, sizeof tok->trie_root);
  if ((rc = tk_state_pool_init(tok))) goto fail;
  if ((rc = ld_scan(&l, buf, len, sec, &vocab, &merges, &rest))) goto fail;
  if (!rest.n) {
    rc = tk_ld_err(&l, CM_ERR_PARSE, "no \"model\" object");
    goto fail;
  }
  if (!(model = ld_model_scalars(&l, rest, vocab, merges, &rc))) goto fail;
  const char *mtype = json_string_value(json_object_get(model, "type"));
  if (!mtype || strcmp(mtype, "BPE")) {
    rc = tk_ld_err(&l, CM_ERR_UNSUPPORTED, "model.type \"%s\" is not supported (only BPE)",
                mtype ? mtype : "(missing)");
    goto fail;
  }
  if (!vocab.n) {
    rc = tk_ld_err(&l, CM_ERR_PARSE, "model.vocab is missing");
    goto fail;
  }
  static const char *const names[] = {"added_tokens", "normalizer", "pre_tokenizer",
                                      "post_processor", "decoder"};
  for (int i = 0; i < 5; i++) {
    if (!sec[i].n) js[i] = i == 0 ? json_array() : json_null();
    else if (!(js[i] = tk_ld_section(&l, sec[i].s, sec[i].n, names[i], &rc))) goto fail;
  }
  if ((rc = ld_vocab(&l, vocab.s, vocab.n))) goto fail;
  int32_t max_id = -1;
  for (size_t i = 0; i < l.n_v; i++)
    if (l.v[i].id > max_id) max_id = l.v[i].id;
  if ((rc = tk_ld_added_max(&l, js[0], &max_id))) goto fail;
  if ((rc = ld_ids(&l, max_id + 1))) goto fail;
  if (merges.n && (rc = ld_merges(&l, merges.s, merges.n))) goto fail;
  if ((rc = tk_ld_model_opts(&l, model)) || (rc = tk_ld_added(&l, js[0])) ||
      (rc = tk_ld_normalizer(&l, js[1])) || (rc = tk_ld_pre_tokenizer(&l, js[2])) ||
      (rc = tk_ld_post_processor(&l, js[3])) || (rc = tk_ld_decoder(&l, js[4])))
    goto fail;
  for (int32_t id = 0; id < tok->n_ids; id++)
    if (!(tok->tok_flags[id] & TK_TOKF_PRESENT)) {
      rc = tk_ld_err(&l, CM_ERR_PARSE, "id %d has no token (ids must be dense)", id);
      goto fail;
    }
  if ((rc = tk_ld_bytes(tok))) goto fail;
  tk_ld_cross(tok);
  tok->bos = tk_find(tok, "<bos>", 5);
  if (tok->bos < 0) tok->bos = tk_find(tok, "<s>", 3);
  if (tok->bos < 0 && tok->n_post_pre == 1) tok->bos = tok->post_pre[0];
  tok->eos = tk_find(tok, "<eos>", 5);
  if (tok->eos < 0) tok->eos = tk_find(tok, "</s>", 4);
  tok->pad = tk_find(tok, "<pad>", 5);
  rc = 0;
  *out = tok;
  tok = NULL;
fail:
  for (int i = 0; i < 5; i++) json_decref(js[i]);
  json_decref(model);
  free(buf);
  free(l.v);
  tk_free(tok);
  return rc;
}
