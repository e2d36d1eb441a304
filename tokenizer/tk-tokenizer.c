/* tk-tokenizer.c — the tokenizer pipeline: added-token matching, normalizer,
 * pre-tokenizer, BPE per word, post-processor; and decoding (Replace,
 * ByteFallback, Fuse). Loading is in tk-load.c, the BPE model in
 * tk-bpe.c. */
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-grow.h"
#include "common/cm-utf8.h"
#include "tokenizer/tk-impl.h"

/* ---- accessors ---------------------------------------------------------- */

int32_t tk_n_vocab(const struct tk_tokenizer *tok) { return tok->n_ids; }
int32_t tk_bos(const struct tk_tokenizer *tok) { return tok->bos; }
int32_t tk_eos(const struct tk_tokenizer *tok) { return tok->eos; }
int32_t tk_pad(const struct tk_tokenizer *tok) { return tok->pad; }
int32_t tk_unk(const struct tk_tokenizer *tok) { return tok->unk; }

int tk_is_special(const struct tk_tokenizer *tok, int32_t id) {
  return id >= 0 && id < tok->n_ids && (tok->tok_flags[id] & TK_TOKF_SPECIAL) != 0;
}

int tk_is_added(const struct tk_tokenizer *tok, int32_t id) {
  return id >= 0 && id < tok->n_ids && (tok->tok_flags[id] & TK_TOKF_ADDED) != 0;
}

void tk_merge_ranks(const struct tk_tokenizer *tok, int32_t *ranks) {
  for (int32_t i = 0; i < tok->n_ids; i++)
    ranks[i] = -1;
  for (uint64_t i = 0; tok->mhash && i <= tok->mmask; i++) {
    const struct tk_merge *m = &tok->mhash[i];
    if (m->key == UINT64_MAX || m->result < 0 || m->result >= tok->n_ids) continue;
    if (ranks[m->result] < 0 || m->rank < ranks[m->result]) ranks[m->result] = m->rank;
  }
}

int32_t tk_n_merges(const struct tk_tokenizer *tok) {
  return tok->n_merges;
}

void tk_merge_pairs(const struct tk_tokenizer *tok, int32_t *lr) {
  for (int64_t i = 0; i < 2 * (int64_t)tok->n_merges; i++)
    lr[i] = -1;
  for (uint64_t i = 0; tok->mhash && i <= tok->mmask; i++) {
    const struct tk_merge *m = &tok->mhash[i];
    if (m->key == UINT64_MAX || m->rank < 0 || m->rank >= tok->n_merges) continue;
    lr[2 * (int64_t)m->rank] = (int32_t)(m->key >> 32);
    lr[2 * (int64_t)m->rank + 1] = (int32_t)(m->key & 0xFFFFFFFFu);
  }
}

int tk_byte_value(const struct tk_tokenizer *tok, int32_t id) {
  return id >= 0 && id < tok->n_ids ? tok->byte_of[id] : -1;
}

const char *tk_token_str(const struct tk_tokenizer *tok, int32_t id, size_t *len) {
  if (id < 0 || id >= tok->n_ids) return NULL;
  *len = tok->tok_len[id];
  return tok->blob + tok->tok_off[id];
}

int32_t tk_find(const struct tk_tokenizer *tok, const char *s, size_t len) {
  /* added tokens first (they may lie outside the model vocab) */
  int32_t node = len ? tok->trie_root[(unsigned char)s[0]] : -1;
  for (size_t i = 1; node >= 0 && i < len; i++) {
    int32_t ch = tok->trie[node].child;
    while (ch >= 0 && tok->trie[ch].byte != (unsigned char)s[i]) ch = tok->trie[ch].sibling;
    node = ch;
  }
  if (node >= 0 && tok->trie[node].id >= 0) return tok->trie[node].id;
  return tk_vocab_get(tok, s, len);
}

/* ---- UTF-8 ----------------------------------------------------------------- */

int tk_utf8_valid(const char *str, size_t len) {
  const unsigned char *s = (const unsigned char *)str;
  for (size_t i = 0; i < len;) {
    size_t k = cm_utf8_len(s + i, len - i);
    if (!k) return 0;
    i += k;
  }
  return 1;
}

/* ---- encode ------------------------------------------------------------------ */

/* Applies one Replace to src into *dst; returns the new length or < 0. */
static long replace_into(const struct tk_replace *r, const char *src, size_t n, char **dst,
                         size_t *cap) {
  size_t bound = n / r->from_len * (r->to_len > r->from_len ? r->to_len : r->from_len) + n + 1;
  if (cm_grow(dst, cap, bound, 256)) return CM_ERR_NOMEM;
  char *o = *dst;
  size_t i = 0;
  while (i < n) {
    const char *hit = n - i >= r->from_len ? memchr(src + i, r->from[0], n - i) : NULL;
    while (hit && ((size_t)(hit - src) + r->from_len > n ||
                   memcmp(hit, r->from, r->from_len))) {
      size_t at = (size_t)(hit - src) + 1;
      hit = at < n ? memchr(src + at, r->from[0], n - at) : NULL;
    }
    size_t end = hit ? (size_t)(hit - src) : n;
    memcpy(o, src + i, end - i);
    o += end - i;
    if (!hit) break;
    memcpy(o, r->to, r->to_len);
    o += r->to_len;
    i = end + r->from_len;
  }
  return (long)(o - *dst);
}

static const char *find_lit(const char *s, size_t n, const char *pat, size_t pn) {
  if (pn > n) return NULL;
  const char *end = s + n - pn + 1;
  for (const char *p = s; p < end; p++) {
    p = memchr(p, pat[0], (size_t)(end - p));
    if (!p) return NULL;
    if (!memcmp(p, pat, pn)) return p;
  }
  return NULL;
}

/* Normalizes and pre-tokenizes one segment between added tokens and runs
 * BPE on each word. */
static int encode_segment(struct tk_state *st, const char *s, size_t n, int32_t **ids,
                          size_t *n_ids, size_t *cap) {
  const struct tk_tokenizer *tok = st->tok;
  if (!n) return 0;
  for (int k = 0; k < tok->n_norm; k++) {
    char **dst = (k & 1) ? &st->norm2 : &st->norm;
    size_t *dcap = (k & 1) ? &st->norm2_cap : &st->norm_cap;
    long r = replace_into(&tok->norm[k], s, n, dst, dcap);
    if (r < 0) return (int)r;
    s = *dst;
    n = (size_t)r;
  }
  if (tok->split == TK_SPLIT_NONE) return tk_bpe_word(st, s, n, ids, n_ids, cap);
  size_t start = 0, i = 0;
  const size_t pn = tok->split_len;
  int rc = 0;
  while (i < n && !rc) {
    const char *hit = find_lit(s + i, n - i, tok->split_pat, pn);
    if (!hit) break;
    size_t at = (size_t)(hit - s);
    switch (tok->split) {
    case TK_SPLIT_MERGED_PREV:
      rc = tk_bpe_word(st, s + start, at + pn - start, ids, n_ids, cap);
      start = at + pn;
      break;
    case TK_SPLIT_MERGED_NEXT:
      rc = tk_bpe_word(st, s + start, at - start, ids, n_ids, cap);
      start = at;
      break;
    case TK_SPLIT_ISOLATED:
      rc = tk_bpe_word(st, s + start, at - start, ids, n_ids, cap);
      if (!rc) rc = tk_bpe_word(st, s + at, pn, ids, n_ids, cap);
      start = at + pn;
      break;
    default: /* removed */
      rc = tk_bpe_word(st, s + start, at - start, ids, n_ids, cap);
      start = at + pn;
      break;
    }
    i = at + pn;
  }
  if (!rc && start < n) rc = tk_bpe_word(st, s + start, n - start, ids, n_ids, cap);
  return rc;
}

/* Longest added token starting at s (leftmost-longest is then a left to
 * right scan); returns its byte length and id, or 0. */
static size_t match_added(const struct tk_tokenizer *tok, const char *s, size_t n, int match_special,
                          int32_t *id) {
  int32_t node = tok->trie_root[(unsigned char)s[0]];
  size_t best = 0;
  for (size_t i = 1; node >= 0; i++) {
    int32_t t = tok->trie[node].id;
    if (t >= 0 && (match_special || !(tok->tok_flags[t] & TK_TOKF_SPECIAL))) {
      best = i;
      *id = t;
    }
    if (i == n) break;
    int32_t ch = tok->trie[node].child;
    while (ch >= 0 && tok->trie[ch].byte != (unsigned char)s[i]) ch = tok->trie[ch].sibling;
    node = ch;
  }
  return best;
}

int tk_encode(const struct tk_tokenizer *tok, struct tk_state *st, const char *text, size_t len,
                  unsigned flags, int32_t **ids, size_t *n_ids, size_t *cap) {
  struct tk_state local = {.tok = tok};
  int rc = 0;
  *n_ids = 0;
  if (!tk_utf8_valid(text, len)) return CM_ERR_INVAL;
  if (!st) st = &local;
  if (flags & TK_ADD_SPECIAL)
    for (int i = 0; i < tok->n_post_pre && !rc; i++)
      rc = tk_ids_push(ids, n_ids, cap, tok->post_pre[i]);
  const int ms = (flags & TK_MATCH_SPECIAL) != 0;
  size_t seg = 0, i = 0;
  while (i < len && !rc) {
    int32_t id;
    size_t m = tok->n_added ? match_added(tok, text + i, len - i, ms, &id) : 0;
    if (!m) {
      i++;
      continue;
    }
    rc = encode_segment(st, text + seg, i - seg, ids, n_ids, cap);
    if (!rc) rc = tk_ids_push(ids, n_ids, cap, id);
    i += m;
    seg = i;
  }
  if (!rc) rc = encode_segment(st, text + seg, len - seg, ids, n_ids, cap);
  if (flags & TK_ADD_SPECIAL)
    for (int k = 0; k < tok->n_post_suf && !rc; k++)
      rc = tk_ids_push(ids, n_ids, cap, tok->post_suf[k]);
  if (st == &local) {
    free(local.norm);
    free(local.norm2);
    free(local.syms);
    free(local.heap);
  }
  return rc;
}

/* ---- decode -------------------------------------------------------------------- */

int tk_buf_put(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
  if (cm_grow(buf, cap, *len + n + 1, 256)) return CM_ERR_NOMEM;
  memcpy(*buf + *len, s, n);
  *len += n;
  (*buf)[*len] = 0;
  return 0;
}

int tk_piece_append(const struct tk_tokenizer *tok, int32_t id, char **buf, size_t *len,
                        size_t *cap) {
  const char *s = tok->blob + tok->tok_off[id];
  size_t n = tok->tok_len[id];
  if (tok->n_dec == 1) {
    /* the common case (Gemma: "▁" -> " "), straight into the output */
    const struct tk_replace *r = &tok->dec[0];
    size_t bound = n / r->from_len * (r->to_len > r->from_len ? r->to_len : r->from_len) + n;
    if (cm_grow(buf, cap, *len + bound + 1, 256)) return CM_ERR_NOMEM;
    char *dst = *buf + *len;
    size_t dcap = bound + 1;
    long w = replace_into(r, s, n, &dst, &dcap);
    if (w < 0) return (int)w;
    *len += (size_t)w;
    (*buf)[*len] = 0;
    return 0;
  }
  if (tok->n_dec == 0) return tk_buf_put(buf, len, cap, s, n);
  /* several Replace steps: ping-pong through two temporaries */
  char *a = NULL, *b = NULL;
  size_t ac = 0, bc = 0;
  int rc = 0;
  for (int k = 0; k < tok->n_dec && !rc; k++) {
    char **dst = (k & 1) ? &b : &a;
    size_t *dc = (k & 1) ? &bc : &ac;
    long w = replace_into(&tok->dec[k], s, n, dst, dc);
    if (w < 0) rc = (int)w;
    else s = *dst, n = (size_t)w;
  }
  if (!rc) rc = tk_buf_put(buf, len, cap, s, n);
  free(a);
  free(b);
  return rc;
}

int tk_bytes_append(const uint8_t *run, size_t n, char **buf, size_t *len, size_t *cap) {
  if (tk_utf8_valid((const char *)run, n)) return tk_buf_put(buf, len, cap, (const char *)run, n);
  for (size_t i = 0; i < n; i++) {
    int rc = tk_buf_put(buf, len, cap, "\xEF\xBF\xBD", 3);
    if (rc) return rc;
  }
  return 0;
}

int tk_decode(const struct tk_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                  char **out, size_t *out_len, size_t *cap) {
  char *run = NULL; /* the pending run of byte-fallback bytes */
  size_t nrun = 0, runcap = 0;
  int rc = 0, first = 1;
  *out_len = 0;
  if (cm_grow(out, cap, 1, 256)) return CM_ERR_NOMEM;
  (*out)[0] = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    int32_t id = ids[i];
    if (id < 0 || id >= tok->n_ids) {
      rc = CM_ERR_RANGE;
      break;
    }
    if (skip_special && (tok->tok_flags[id] & TK_TOKF_SPECIAL)) continue;
    if (!tok->has_decoder) {
      if (!first) rc = tk_buf_put(out, out_len, cap, " ", 1);
      if (!rc) rc = tk_buf_put(out, out_len, cap, tok->blob + tok->tok_off[id],
                                   tok->tok_len[id]);
      first = 0;
      continue;
    }
    if (tok->dec_byte_fallback && tok->byte_of[id] >= 0) {
      char b = (char)tok->byte_of[id];
      rc = tk_buf_put(&run, &nrun, &runcap, &b, 1);
      continue;
    }
    if (nrun) {
      rc = tk_bytes_append((const uint8_t *)run, nrun, out, out_len, cap);
      nrun = 0;
    }
    if (!rc) rc = tk_piece_append(tok, id, out, out_len, cap);
  }
  if (!rc && nrun) rc = tk_bytes_append((const uint8_t *)run, nrun, out, out_len, cap);
  free(run);
  return rc;
}

int tk_token_to_piece(const struct tk_tokenizer *tok, int32_t id, char *buf, size_t buflen,
                          size_t *len) {
  if (id < 0 || id >= tok->n_ids) return CM_ERR_RANGE;
  char *tmp = NULL;
  size_t n = 0, cap = 0;
  int rc = tk_piece_append(tok, id, &tmp, &n, &cap);
  if (!rc && n + 1 > buflen) rc = CM_ERR_TOOBIG;
  if (!rc) {
    memcpy(buf, tmp, n);
    buf[n] = 0;
    *len = n;
  }
  free(tmp);
  return rc;
}
