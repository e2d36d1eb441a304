/* fuzz-grammar.c — fuzz target for the structured-output compilers
 * (grammar/: regex, choice, JSON object, JSON Schema, GBNF, the span kind)
 * and, for what compiles, the matcher over a small vocabulary. The first
 * byte picks the kind (1 + byte % 6), the second seeds the walk, the rest is
 * the request's text. gr_compile must return 0 with a grammar, or a negative
 * cm_err with a one-line reason and no grammar; a grammar must then prepare,
 * mask, report its forced text, take the input's bytes or refuse them, and
 * walk (the worker's calls on every step), all within the grammar's limits.
 * Any other outcome aborts (a finding). A request's grammar reaches the
 * frontend (the 400 check) and every worker (the masks), so a crash here is
 * a crash of a serving process. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "grammar/gr.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Every byte alone, some multi-byte pieces of JSON and text, control tokens
 * (no bytes) and a special token by id (the span kind's open and close). */
static struct gr_vocab *vocab(void) {
  static struct gr_vocab *v;
  if (v) return v;
  static const char *const pieces[] = {"{\"",  "\":",  "\",\"", "}",    "]",    "null",
                                       "true", "fals", "e",     "12",   "-3.5", "  ",
                                       "\n",   "\\u",  "\\\"",  "key",  "ü",    "中",
                                       "🙂",    "ab",   "abc",   "0x1F", "\t",   "\"}"};
  enum { NP = sizeof pieces / sizeof pieces[0], NCTL = 2, NSPEC = 2 };
  static uint8_t bytes[256], spec[NSPEC][GR_TOKEN_LEN];
  const uint8_t *b[256 + NP + NCTL + NSPEC];
  uint32_t l[256 + NP + NCTL + NSPEC];
  int32_t n = 0;
  for (int i = 0; i < 256; i++, n++) {
    bytes[i] = (uint8_t)i;
    b[n] = &bytes[i], l[n] = 1;
  }
  for (int i = 0; i < NP; i++, n++)
    b[n] = (const uint8_t *)pieces[i], l[n] = (uint32_t)strlen(pieces[i]);
  for (int i = 0; i < NCTL; i++, n++)
    b[n] = bytes, l[n] = 0;
  for (int i = 0; i < NSPEC; i++, n++) { /* ids 5 and 6 */
    gr_token_bytes(5 + i, spec[i]);
    b[n] = spec[i], l[n] = GR_TOKEN_LEN;
  }
  if (gr_vocab_create(b, l, n, &v)) abort();
  return v;
}

static void poke(struct gr_grammar *g, const uint8_t *text, size_t len, uint64_t seed) {
  struct gr_vocab *v = vocab();
  if (gr_grammar_prepare(g)) return; /* out of memory only */
  struct gr_matcher *m = gr_matcher_new(g);
  if (!m) return;
  const int32_t nv = gr_vocab_size(v);
  uint32_t *bits = calloc((size_t)(nv + 31) / 32, sizeof *bits);
  if (bits && gr_matcher_mask(m, v, bits) == 0) {
    /* a masked token must be accepted; take the first one's step on a copy */
    for (int32_t i = 0; i < nv; i++)
      if (bits[i / 32] >> (i % 32) & 1) {
        struct gr_matcher *c = gr_matcher_clone(m);
        if (c && gr_matcher_accept_token(c, v, i)) abort();
        gr_matcher_free(c);
        break;
      }
  }
  free(bits);
  uint8_t forced[64];
  if (gr_matcher_forced(m, forced, sizeof forced) > sizeof forced) abort();
  /* the request's own bytes: taken or refused, the state unchanged when refused */
  struct gr_matcher *c = gr_matcher_clone(m);
  if (c) {
    int before = gr_matcher_is_accepting(c);
    if (gr_matcher_accept_bytes(c, text, len) && gr_matcher_is_accepting(c) != before) abort();
    gr_matcher_free(c);
  }
  char buf[512];
  int steps = 0;
  int k = gr_random_walk(m, v, &seed, 24, buf, sizeof buf, NULL, &steps);
  if (k >= (int)sizeof buf || steps > 24) abort();
  gr_matcher_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  const enum gr_kind kind = (enum gr_kind)(1 + data[0] % 6);
  const uint64_t seed = data[1];
  const char *text = (const char *)data + 2;
  size_t len = size - 2;
  struct gr_grammar *g = NULL;
  char err[256] = "";
  int rc = gr_compile(kind, text, len, &g, err, sizeof err);
  if (rc) {
    if (rc > 0 || rc <= CM_ERR__LAST || g || !err[0] || strchr(err, '\n')) abort();
    return 0;
  }
  if (!g) abort();
  poke(g, (const uint8_t *)text, len, seed);
  gr_grammar_free(g);
  return 0;
}
