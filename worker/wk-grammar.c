/* wk-grammar.c — see wk-grammar.h. */
#include "worker/wk-grammar.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-hash.h"
#include "common/cm-log.h"
#include "tokenizer/tk-tokenizer.h"

#define WK_GRAMMAR_CACHE 32 /* compiled grammars kept */
#define WK_MAX_EOS_IDS   8

struct cached {
  struct gr_grammar *g; /* NULL: a free entry */
  uint64_t key;         /* hash of (kind, text) */
  uint32_t kind;
  uint8_t *text;
  size_t len;
  int users;     /* live matchers of g */
  uint64_t used; /* tick of the last lookup */
};

struct wk_grammars {
  struct gr_vocab *vocab;
  int32_t n_vocab;
  int eos[WK_MAX_EOS_IDS];
  int n_eos;
  struct cached cache[WK_GRAMMAR_CACHE];
  uint64_t tick;
  /* which cache entry each live matcher came from: a matcher's grammar is kept
   * while it lives */
  struct gr_matcher **owners_m;
  int *owners_c;
  int n_owners, cap_owners;
};

int wk_grammars_create(const struct tk_tokenizer *tok, int32_t vocab, const int *eos, int n_eos,
                       struct wk_grammars **out) {
  *out = NULL;
  if (!tok || vocab < 1 || n_eos < 0) return CM_ERR_INVAL;
  struct wk_grammars *g = calloc(1, sizeof(*g));
  const uint8_t **bytes = calloc((size_t)vocab, sizeof(*bytes));
  uint32_t *lens = calloc((size_t)vocab, sizeof(*lens));
  size_t cap = 1 << 20, used = 0;
  uint8_t *blob = malloc(cap);
  int rc = g && bytes && lens && blob ? 0 : CM_ERR_NOMEM;
  size_t *offs = rc ? NULL : calloc((size_t)vocab, sizeof(size_t));
  if (!rc && !offs) rc = CM_ERR_NOMEM;
  int32_t n_tok = tk_n_vocab(tok);
  for (int32_t id = 0; id < vocab && !rc; id++) {
    char piece[512];
    size_t n = 0;
    int bv = id < n_tok ? tk_byte_value(tok, id) : -1;
    if (id >= n_tok) {
      n = 0;
    } else if (tk_is_special(tok, id)) {
      /* a control token: only a grammar that names it allows it (gr.h's GR_TOKEN_BYTE) */
      gr_token_bytes(id, (uint8_t *)piece);
      n = GR_TOKEN_LEN;
    } else if (bv == GR_TOKEN_BYTE) {
      n = 0; /* would spell the start of a control token's bytes */
    } else if (bv >= 0) {
      piece[0] = (char)bv;
      n = 1;
    } else if (tk_token_to_piece(tok, id, piece, sizeof(piece), &n) != 0) {
      n = 0;
    }
    if (used + n > cap) {
      while (used + n > cap)
        cap *= 2;
      uint8_t *b = realloc(blob, cap);
      if (!b) {
        rc = CM_ERR_NOMEM;
        break;
      }
      blob = b;
    }
    memcpy(blob + used, piece, n);
    offs[id] = used;
    lens[id] = (uint32_t)n;
    used += n;
  }
  for (int32_t id = 0; id < vocab && !rc; id++)
    bytes[id] = blob + offs[id];
  if (!rc) rc = gr_vocab_create(bytes, lens, vocab, &g->vocab);
  free(offs);
  free(bytes);
  free(lens);
  free(blob);
  if (!rc) {
    g->n_vocab = vocab;
    g->n_eos = n_eos < WK_MAX_EOS_IDS ? n_eos : WK_MAX_EOS_IDS;
    for (int i = 0; i < g->n_eos; i++)
      g->eos[i] = eos[i];
  }
  if (rc) {
    wk_grammars_free(g);
    return rc;
  }
  *out = g;
  return 0;
}

const struct gr_vocab *wk_grammars_vocab(const struct wk_grammars *g) {
  return g->vocab;
}

void wk_grammars_free(struct wk_grammars *g) {
  if (!g) return;
  for (int i = 0; i < g->n_owners; i++)
    gr_matcher_free(g->owners_m[i]);
  for (int i = 0; i < WK_GRAMMAR_CACHE; i++) {
    gr_grammar_free(g->cache[i].g);
    free(g->cache[i].text);
  }
  gr_vocab_free(g->vocab);
  free(g->owners_m);
  free(g->owners_c);
  free(g);
}

/* The cache entry for (kind, text): found, or compiled into a free or the least
 * recently used unused entry. -1 with err on failure. */
static int lookup(struct wk_grammars *g, uint32_t kind, const uint8_t *text, size_t len, char *err,
                  size_t errlen) {
  uint64_t key = 0xcbf29ce484222325ull ^ kind; /* FNV-1a over the text, then mixed */
  for (size_t i = 0; i < len; i++)
    key = (key ^ text[i]) * 0x100000001b3ull;
  key = cm_mix64(key);
  int victim = -1;
  g->tick++;
  for (int i = 0; i < WK_GRAMMAR_CACHE; i++) {
    struct cached *c = &g->cache[i];
    if (c->g && c->key == key && c->kind == kind && c->len == len &&
        (!len || !memcmp(c->text, text, len))) {
      c->used = g->tick;
      return i;
    }
    if (!c->g) {
      if (victim < 0 || g->cache[victim].g) victim = i;
    } else if (!c->users &&
               (victim < 0 || (g->cache[victim].g && c->used < g->cache[victim].used))) {
      victim = i;
    }
  }
  if (victim < 0) {
    cm_fail(err, errlen, CM_ERR_FULL, "structured output: %d grammars in use at once",
            WK_GRAMMAR_CACHE);
    return -1;
  }
  struct cached *c = &g->cache[victim];
  gr_grammar_free(c->g);
  free(c->text);
  memset(c, 0, sizeof(*c));
  c->text = malloc(len ? len : 1);
  if (!c->text) {
    cm_fail(err, errlen, CM_ERR_NOMEM, "structured output: out of memory");
    return -1;
  }
  char why[256];
  int rc =
      gr_compile((enum gr_kind)kind, len ? (const char *)text : "", len, &c->g, why, sizeof(why));
  if (!rc && (rc = gr_grammar_prepare(c->g))) /* before its first mask, not in it */
    snprintf(why, sizeof why, "out of memory");
  if (rc) {
    free(c->text);
    memset(c, 0, sizeof(*c));
    cm_fail(err, errlen, rc, "structured output: %s", why);
    return -1;
  }
  if (len) memcpy(c->text, text, len);
  c->key = key;
  c->kind = kind;
  c->len = len;
  c->used = g->tick;
  return victim;
}

int wk_grammars_matcher(struct wk_grammars *g, uint32_t kind, const uint8_t *text, size_t len,
                        struct gr_matcher **out, char *err, size_t errlen) {
  *out = NULL;
  int i = lookup(g, kind, text, len, err, errlen);
  if (i < 0) return CM_ERR_INVAL;
  if (g->n_owners == g->cap_owners) {
    int cap = g->cap_owners ? 2 * g->cap_owners : 64;
    struct gr_matcher **m = realloc(g->owners_m, sizeof(*m) * (size_t)cap);
    if (m) g->owners_m = m;
    int *c = realloc(g->owners_c, sizeof(*c) * (size_t)cap);
    if (c) g->owners_c = c;
    if (!m || !c) return cm_fail(err, errlen, CM_ERR_NOMEM, "structured output: out of memory");
    g->cap_owners = cap;
  }
  struct gr_matcher *m = gr_matcher_new(g->cache[i].g);
  if (!m) return cm_fail(err, errlen, CM_ERR_NOMEM, "structured output: out of memory");
  g->owners_m[g->n_owners] = m;
  g->owners_c[g->n_owners++] = i;
  g->cache[i].users++;
  *out = m;
  return 0;
}

void wk_grammars_release(struct wk_grammars *g, struct gr_matcher *m) {
  if (!g || !m) return;
  for (int i = 0; i < g->n_owners; i++)
    if (g->owners_m[i] == m) {
      g->cache[g->owners_c[i]].users--;
      g->owners_m[i] = g->owners_m[g->n_owners - 1];
      g->owners_c[i] = g->owners_c[g->n_owners - 1];
      g->n_owners--;
      break;
    }
  gr_matcher_free(m);
}

int wk_grammars_is_eos(const struct wk_grammars *g, int32_t id) {
  for (int i = 0; i < g->n_eos; i++)
    if (g->eos[i] == id) return 1;
  return 0;
}

size_t wk_grammars_mask_words(const struct wk_grammars *g) {
  return ((size_t)g->n_vocab + 31) / 32;
}

int wk_grammars_fill(struct wk_grammars *g, struct gr_matcher *m, uint32_t *bits) {
  return gr_matcher_mask(m, g->vocab, bits);
}

void wk_grammars_allow_eos(const struct wk_grammars *g, const struct gr_matcher *m,
                           uint32_t *bits) {
  int accept = gr_matcher_is_accepting(m);
  for (int i = 0; i < g->n_eos; i++)
    if (g->eos[i] >= 0 && g->eos[i] < g->n_vocab) {
      uint32_t bit = 1u << (g->eos[i] % 32);
      bits[g->eos[i] / 32] = accept ? bits[g->eos[i] / 32] | bit : bits[g->eos[i] / 32] & ~bit;
    }
}

int wk_grammars_accept(struct wk_grammars *g, struct gr_matcher *m, int32_t id) {
  if (wk_grammars_is_eos(g, id)) return 0;
  return gr_matcher_accept_token(m, g->vocab, id);
}
