/* tk-spm.c — a tokenizer from a SentencePiece-style vocabulary (GGUF files'
 * tokens, scores and token types), built the way Hugging Face converts a
 * SentencePiece BPE model such as Gemma's: every two pieces whose
 * concatenation is a third become a merge, ranked by that piece's score, and
 * the result is written as tokenizer.json text for the one loader every
 * tokenizer goes through (tk_load_json). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-grow.h"
#include "model/md-gguf.h"
#include "tokenizer/tk-tokenizer.h"

struct sb {
  char *p;
  size_t n, cap;
  int oom;
};

static void sb_put(struct sb *b, const char *s, size_t n) {
  if (b->oom) return;
  if (cm_grow(&b->p, &b->cap, b->n + n + 1, 1 << 20)) {
    b->oom = 1;
    return;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
}

static void sb_cs(struct sb *b, const char *s) {
  sb_put(b, s, strlen(s));
}

/* s[n] as a JSON string. */
static void sb_json(struct sb *b, const char *s, size_t n) {
  sb_put(b, "\"", 1);
  size_t run = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    sb_put(b, s + run, i - run);
    char esc[8];
    if (c == '"' || c == '\\')
      snprintf(esc, sizeof(esc), "\\%c", c);
    else if (c == '\n')
      snprintf(esc, sizeof(esc), "\\n");
    else if (c == '\t')
      snprintf(esc, sizeof(esc), "\\t");
    else
      snprintf(esc, sizeof(esc), "\\u%04x", c);
    sb_cs(b, esc);
    run = i + 1;
  }
  sb_put(b, s + run, n - run);
  sb_put(b, "\"", 1);
}

/* ---- pieces by their bytes ------------------------------------------------------- */

struct vmap {
  int32_t *slot; /* id + 1; 0 empty */
  uint64_t mask;
  const struct tk_spm *v;
};

static uint64_t hash(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static int32_t vmap_find(const struct vmap *m, const char *s, size_t n) {
  for (uint64_t i = hash(s, n) & m->mask;; i = (i + 1) & m->mask) {
    int32_t id = m->slot[i] - 1;
    if (id < 0) return -1;
    if (m->v->len[id] == n && !memcmp(m->v->text[id], s, n)) return id;
  }
}

/* 0, or the first id whose text an earlier one has (-1 - id). */
static int vmap_build(struct vmap *m, const struct tk_spm *v) {
  uint64_t cap = 1;
  while (cap < (uint64_t)v->n * 2)
    cap <<= 1;
  m->slot = calloc(cap, sizeof(int32_t));
  if (!m->slot) return CM_ERR_NOMEM;
  m->mask = cap - 1;
  m->v = v;
  for (int32_t id = 0; id < v->n; id++) {
    if (vmap_find(m, v->text[id], v->len[id]) >= 0) return -1 - id;
    uint64_t i = hash(v->text[id], v->len[id]) & m->mask;
    while (m->slot[i])
      i = (i + 1) & m->mask;
    m->slot[i] = id + 1;
  }
  return 0;
}

/* ---- merges ------------------------------------------------------------------------ */

struct cand {
  int32_t l, r, p; /* left, right and merged piece ids */
  float score;     /* the merged piece's */
  int32_t ll, rl;  /* characters in left and right */
  int64_t seq;     /* order of generation: piece id, then (l, r) */
};

static int utf8_chars(const char *s, size_t n) {
  int c = 0;
  for (size_t i = 0; i < n; i++)
    c += ((unsigned char)s[i] & 0xC0) != 0x80;
  return c;
}

static int by_parts(const void *a, const void *b) {
  const struct cand *x = a, *y = b;
  if (x->l != y->l) return x->l < y->l ? -1 : 1;
  return x->r < y->r ? -1 : x->r > y->r;
}

static int by_rank(const void *a, const void *b) {
  const struct cand *x = a, *y = b;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  if (x->ll != y->ll) return x->ll > y->ll ? -1 : 1;
  if (x->rl != y->rl) return x->rl > y->rl ? -1 : 1;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int make_merges(const struct tk_spm *v, const struct vmap *m, struct cand **out,
                       int64_t *n_out) {
  int64_t n = 0, cap = 1 << 16;
  struct cand *c = malloc(sizeof(*c) * (size_t)cap);
  if (!c) return CM_ERR_NOMEM;
  for (int32_t p = 0; p < v->n; p++) {
    const char *s = v->text[p];
    size_t len = v->len[p];
    int64_t first = n;
    for (size_t i = 1; i < len; i++) {
      if (((unsigned char)s[i] & 0xC0) == 0x80) continue; /* inside a character */
      int32_t l = vmap_find(m, s, i), r = l < 0 ? -1 : vmap_find(m, s + i, len - i);
      if (r < 0) continue;
      if (n == cap) {
        struct cand *nc = realloc(c, sizeof(*c) * (size_t)(cap *= 2));
        if (!nc) {
          free(c);
          return CM_ERR_NOMEM;
        }
        c = nc;
      }
      c[n++] = (struct cand){l, r, p, v->score[p], utf8_chars(s, i), utf8_chars(s + i, len - i), 0};
    }
    qsort(c + first, (size_t)(n - first), sizeof(*c), by_parts);
    for (int64_t k = first; k < n; k++)
      c[k].seq = k;
  }
  qsort(c, (size_t)n, sizeof(*c), by_rank);
  *out = c;
  *n_out = n;
  return 0;
}

/* ---- tokenizer.json ---------------------------------------------------------------- */

static int is_added(int32_t type) {
  return type == TK_SPM_CONTROL || type == TK_SPM_UNKNOWN || type == TK_SPM_USER;
}

int tk_load_spm(const struct tk_spm *v, struct tk_tokenizer **out, char *errbuf, size_t errlen) {
  *out = NULL;
  if (!v || v->n < 1 || !v->text || !v->len || !v->score || !v->type)
    return cm_fail(errbuf, errlen, CM_ERR_INVAL, "an empty vocabulary");
  struct vmap m = {0};
  struct cand *mg = NULL;
  int64_t n_mg = 0;
  struct sb b = {0};
  int rc = vmap_build(&m, v);
  if (rc < 0 && rc != CM_ERR_NOMEM) {
    int32_t id = -1 - rc;
    rc =
        cm_fail(errbuf, errlen, CM_ERR_PARSE, "token %d (\"%.*s\") appears twice in the vocabulary",
                id, (int)(v->len[id] > 40 ? 40 : v->len[id]), v->text[id]);
    goto done;
  }
  if (rc || (!v->n_merges && (rc = make_merges(v, &m, &mg, &n_mg)))) {
    rc = cm_fail(errbuf, errlen, CM_ERR_NOMEM, "out of memory");
    goto done;
  }
  int32_t unk = -1;
  for (int32_t id = 0; id < v->n && unk < 0; id++)
    if (v->type[id] == TK_SPM_UNKNOWN) unk = id;
  char num[32];
  sb_cs(&b, "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[");
  int first = 1;
  for (int32_t id = 0; id < v->n; id++) {
    if (!is_added(v->type[id])) continue;
    snprintf(num, sizeof(num), "%s{\"id\":%d,\"content\":", first ? "" : ",", (int)id);
    sb_cs(&b, num);
    sb_json(&b, v->text[id], v->len[id]);
    sb_cs(&b, ",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,"
              "\"special\":");
    sb_cs(&b, v->type[id] == TK_SPM_USER ? "false}" : "true}");
    first = 0;
  }
  sb_cs(&b, "],\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":"
            "\"\\u2581\"},\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},"
            "\"behavior\":\"MergedWithPrevious\",\"invert\":false},\"post_processor\":");
  if (v->add_bos && v->bos >= 0 && v->bos < v->n) {
    sb_cs(&b, "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":");
    sb_json(&b, v->text[v->bos], v->len[v->bos]);
    sb_cs(&b,
          ",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[{"
          "\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"Sequence\":{\"id\":\"B\",\"type_id\":1}}],"
          "\"special_tokens\":{");
    sb_json(&b, v->text[v->bos], v->len[v->bos]);
    sb_cs(&b, ":{\"id\":");
    sb_json(&b, v->text[v->bos], v->len[v->bos]);
    snprintf(num, sizeof(num), ",\"ids\":[%d],\"tokens\":[", (int)v->bos);
    sb_cs(&b, num);
    sb_json(&b, v->text[v->bos], v->len[v->bos]);
    sb_cs(&b, "]}}}");
  } else {
    sb_cs(&b, "null");
  }
  sb_cs(&b, ",\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{"
            "\"String\":\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":"
            "\"Fuse\"}]},\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":");
  if (unk >= 0)
    sb_json(&b, v->text[unk], v->len[unk]);
  else
    sb_cs(&b, "null");
  sb_cs(&b, ",\"continuing_subword_prefix\":null,\"end_of_word_suffix\":null,\"fuse_unk\":true,"
            "\"byte_fallback\":true,\"ignore_merges\":false,\"vocab\":{");
  for (int32_t id = 0; id < v->n; id++) {
    if (id) sb_put(&b, ",", 1);
    sb_json(&b, v->text[id], v->len[id]);
    snprintf(num, sizeof(num), ":%d", (int)id);
    sb_cs(&b, num);
  }
  sb_cs(&b, "},\"merges\":[");
  for (int64_t k = 0; k < (v->n_merges ? v->n_merges : n_mg); k++) {
    sb_cs(&b, k ? ",[" : "[");
    for (int side = 0; side < 2; side++) {
      if (side) sb_put(&b, ",", 1);
      if (v->n_merges)
        sb_json(&b, v->merge_text[2 * k + side], v->merge_len[2 * k + side]);
      else
        sb_json(&b, v->text[side ? mg[k].r : mg[k].l], v->len[side ? mg[k].r : mg[k].l]);
    }
    sb_put(&b, "]", 1);
  }
  sb_cs(&b, "]}}");
  if (b.oom) {
    rc = cm_fail(errbuf, errlen, CM_ERR_NOMEM, "out of memory");
    goto done;
  }
  rc = tk_load_json(b.p, b.n, out, errbuf, errlen);
done:
  free(m.slot);
  free(mg);
  free(b.p);
  return rc;
}

/* ---- from a GGUF file ----------------------------------------------------------------- */

/* tokenizer.ggml.merges ("left right" strings, llama.cpp's converter's form of
 * tokenizer.json's merges) into v: the two sides split at the first space after
 * the first byte (a side never holds a space: the pipeline escapes them), into
 * *mtext (left, right, left, ...) and *mlen, which the caller frees. */
static int gguf_merges(const struct md_gguf *g, const char *path, struct tk_spm *v,
                       const char ***mtext, uint32_t **mlen, char *errbuf, size_t errlen) {
  const struct md_gguf_kv *mg = md_gguf_find_kv(g, "tokenizer.ggml.merges");
  if (!mg || mg->type != MD_GGUF_ARRAY || mg->arr_type != MD_GGUF_STRING || mg->n < 1 ||
      mg->n > INT32_MAX)
    return cm_fail(errbuf, errlen, CM_ERR_PARSE,
                   "%s: tokenizer.ggml.model \"gemma4\" needs tokenizer.ggml.merges, an array "
                   "of strings",
                   path);
  *mtext = calloc(2 * (size_t)mg->n, sizeof(**mtext));
  *mlen = calloc(2 * (size_t)mg->n, sizeof(**mlen));
  if (!*mtext || !*mlen) return cm_fail(errbuf, errlen, CM_ERR_NOMEM, "out of memory");
  uint64_t pos = 0;
  for (uint64_t i = 0; i < mg->n; i++) {
    const char *s;
    size_t l;
    const char *sp = NULL;
    if (!md_gguf_arr_next_str(mg, &pos, &s, &l) && l >= 3 && l <= UINT32_MAX)
      sp = memchr(s + 1, ' ', l - 2);
    if (!sp)
      return cm_fail(errbuf, errlen, CM_ERR_PARSE,
                     "%s: tokenizer.ggml.merges[%llu] is not two tokens apart by a space", path,
                     (unsigned long long)i);
    (*mtext)[2 * i] = s;
    (*mlen)[2 * i] = (uint32_t)(sp - s);
    (*mtext)[2 * i + 1] = sp + 1;
    (*mlen)[2 * i + 1] = (uint32_t)(l - (size_t)(sp - s) - 1);
  }
  v->n_merges = (int64_t)mg->n;
  return 0;
}

int tk_from_gguf(const struct md_gguf *g, const char *path, struct tk_tokenizer **out,
                 char **chat_template, char *errbuf, size_t errlen) {
  *out = NULL;
  if (chat_template) *chat_template = NULL;
  int rc = 0;
  const char *model = NULL;
  size_t ml = 0;
  const struct md_gguf_kv *toks = md_gguf_find_kv(g, "tokenizer.ggml.tokens"),
                          *scores = md_gguf_find_kv(g, "tokenizer.ggml.scores"),
                          *types = md_gguf_find_kv(g, "tokenizer.ggml.token_type");
  struct tk_spm v = {0};
  const char **text = NULL, **mtext = NULL;
  uint32_t *len = NULL, *mlen = NULL;
  float *score = NULL;
  int32_t *type = NULL;
  int gemma4 = 0;
  if (!md_gguf_get_str(g, "tokenizer.ggml.model", &model, &ml) && ml == 6 &&
      !memcmp(model, "gemma4", 6))
    gemma4 = 1;
  else if (!model || ml != 5 || memcmp(model, "llama", 5)) {
    rc = cm_fail(errbuf, errlen, CM_ERR_UNSUPPORTED,
                 "%s: tokenizer.ggml.model \"%.*s\" is not supported (llama: a SentencePiece "
                 "vocabulary; gemma4: Gemma 4's BPE); pass --tokenizer DIR",
                 path, model ? (int)ml : 6, model ? model : "(none)");
    goto done;
  }
  if (!toks || toks->type != MD_GGUF_ARRAY || toks->arr_type != MD_GGUF_STRING ||
      (scores ? scores->n != toks->n : !gemma4) || !types || types->n != toks->n || toks->n < 1 ||
      toks->n > INT32_MAX) {
    rc = cm_fail(errbuf, errlen, CM_ERR_PARSE,
                 "%s: tokenizer.ggml.tokens, .scores and .token_type must be arrays of one length",
                 path);
    goto done;
  }
  if (gemma4 && (rc = gguf_merges(g, path, &v, &mtext, &mlen, errbuf, errlen))) goto done;
  v.n = (int32_t)toks->n;
  text = calloc((size_t)v.n, sizeof(*text));
  len = calloc((size_t)v.n, sizeof(*len));
  score = calloc((size_t)v.n, sizeof(*score));
  type = calloc((size_t)v.n, sizeof(*type));
  if (!text || !len || !score || !type) {
    rc = cm_fail(errbuf, errlen, CM_ERR_NOMEM, "out of memory");
    goto done;
  }
  uint64_t pos = 0;
  for (int32_t i = 0; i < v.n; i++) {
    size_t l;
    double sc;
    int64_t ty;
    sc = 0.0;
    if (md_gguf_arr_next_str(toks, &pos, &text[i], &l) || l > UINT32_MAX ||
        (scores && md_gguf_arr_f64(scores, (uint64_t)i, &sc)) ||
        md_gguf_arr_int(types, (uint64_t)i, &ty)) {
      rc = cm_fail(errbuf, errlen, CM_ERR_PARSE, "%s: token %d of the vocabulary is malformed",
                   path, (int)i);
      goto done;
    }
    len[i] = (uint32_t)l;
    score[i] = (float)sc;
    type[i] = (int32_t)ty;
  }
  int64_t bos = -1;
  int add_bos = 1;
  md_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &bos);
  md_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos);
  v.text = text;
  v.len = len;
  v.score = score;
  v.type = type;
  v.bos = bos >= 0 && bos < v.n ? (int32_t)bos : -1;
  v.add_bos = add_bos;
  v.merge_text = mtext;
  v.merge_len = mlen;
  if ((rc = tk_load_spm(&v, out, errbuf, errlen))) goto done;
  const char *tmpl;
  size_t tl;
  if (chat_template && !md_gguf_get_str(g, "tokenizer.chat_template", &tmpl, &tl)) {
    if (!(*chat_template = malloc(tl + 1))) {
      tk_free(*out);
      *out = NULL;
      rc = cm_fail(errbuf, errlen, CM_ERR_NOMEM, "out of memory");
      goto done;
    }
    memcpy(*chat_template, tmpl, tl);
    (*chat_template)[tl] = 0;
  }
done:
  free(text);
  free(len);
  free(score);
  free(type);
  free(mtext);
  free(mlen);
  return rc;
}

int tk_load_gguf(const char *path, struct tk_tokenizer **out, char **chat_template, char *errbuf,
                 size_t errlen) {
  *out = NULL;
  if (chat_template) *chat_template = NULL;
  struct md_gguf *g = NULL;
  int rc = md_gguf_open(path, &g, errbuf, errlen);
  if (rc) return rc;
  rc = tk_from_gguf(g, path, out, chat_template, errbuf, errlen);
  md_gguf_close(g);
  return rc;
}
