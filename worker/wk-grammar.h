/* wk-grammar.h — structured outputs in the worker: the vocabulary's bytes for
 * grammar/gr.h, compiled grammars cached by their text, and the two things
 * sampling does with a sequence's matcher: mask a logits row before it
 * samples (tokens the grammar does not allow next to -inf; the EOS ids only
 * where the output so far is complete), and follow the token it sampled.
 *
 * The frontend compiled the same text to check it; a worker compiles it
 * again on a sequence's first step (PR_SEQ_NEW) from the cache. Every rank
 * of a tensor-parallel group masks its full logits row alike. */
#ifndef LMSERVE_WK_GRAMMAR_H
#define LMSERVE_WK_GRAMMAR_H
#include <stddef.h>
#include <stdint.h>

#include "grammar/gr.h"

struct wk_grammars;
struct tk_tokenizer;

/* The vocabulary's bytes from tok (ids past it, and control tokens, have none),
 * for a model of `vocab` logits with EOS ids eos[n_eos]. */
int wk_grammars_create(const struct tk_tokenizer *tok, int32_t vocab, const int *eos, int n_eos,
                       struct wk_grammars **out);
void wk_grammars_free(struct wk_grammars *g);
/* The vocabulary's bytes as the grammars see them (control tokens spelled as
 * gr.h's GR_TOKEN_BYTE sequences). */
const struct gr_vocab *wk_grammars_vocab(const struct wk_grammars *g);

/* A matcher for (kind, text[len]) (compiled once per text while cached).
 * 0 and *out, or a negative cm_err with the reason in err. */
int wk_grammars_matcher(struct wk_grammars *g, uint32_t kind, const uint8_t *text, size_t len,
                        struct gr_matcher **out, char *err, size_t errlen);
/* Frees a matcher made by wk_grammars_matcher (NULL: no-op). */
void wk_grammars_release(struct wk_grammars *g, struct gr_matcher *m);

/* Words of a mask: (vocab + 31) / 32. */
size_t wk_grammars_mask_words(const struct wk_grammars *g);
/* bits[wk_grammars_mask_words(g)] = the tokens m allows next (gr_matcher_mask):
 * what a worker computes while the row's forward pass runs. 0, or CM_ERR_NOMEM. */
int wk_grammars_fill(struct wk_grammars *g, struct gr_matcher *m, uint32_t *bits);
/* Sets the EOS ids' bits of a mask from wk_grammars_fill when m accepts (a mask
 * handed to kn_sample). */
void wk_grammars_allow_eos(const struct wk_grammars *g, const struct gr_matcher *m, uint32_t *bits);
/* Whether id is one of the model's EOS ids. */
int wk_grammars_is_eos(const struct wk_grammars *g, int32_t id);
/* Follows token id (an EOS id: nothing to follow). 0, or CM_ERR_INVAL when
 * the grammar does not allow it (the caller sampled outside the mask). */
int wk_grammars_accept(struct wk_grammars *g, struct gr_matcher *m, int32_t id);

#endif
