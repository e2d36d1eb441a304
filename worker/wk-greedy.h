/* wk-greedy.h — greedy generation for one sequence on a loaded model, with
 * its prompt prefilled in chunks, through the paged KV pool and per-group
 * block tables exactly as the serving path drives wk_model_forward.
 * Used by `lmserve generate`, the benchmark and the tests. */
#ifndef LMSERVE_WK_GREEDY_H
#define LMSERVE_WK_GREEDY_H
#include <stdint.h>

#include "worker/wk-kv.h"
#include "worker/wk-model.h"

struct wk_greedy_opts {
  int chunk;       /* prefill chunk in tokens; 0 = the whole prompt at once
                      (capped by the model's max batch tokens) */
  int max_new;     /* tokens to generate */
  int stop_at_eos; /* 1: stop after an eos id of the config */
  float *logits;   /* optional host [max_new, vocab]: the logits each new
                      token was chosen from */
};

/* Runs prompt[0..n_prompt) then decodes greedily (argmax, first index on
 * ties). Pages come from `pa` and are returned before the call ends.
 * out: [max_new]; *n_gen receives the count. Returns 0 or a negative cm_err
 * with the reason in err. */
int wk_greedy_generate(struct wk_model *m, struct wk_page_alloc *pa, const int32_t *prompt,
                       int n_prompt, const struct wk_greedy_opts *o, int32_t *out, int *n_gen,
                       char *err, size_t errlen);

/* Greedy generation with speculative decoding: each round the draft model
 * proposes k tokens (all at the last accepted position), the target verifies
 * them in one step and keeps the longest prefix equal to its own argmax, plus
 * its own next token. The tokens are exactly wk_greedy_generate's (on the
 * CPU backend: bit-identical logits however positions are batched).
 * *drafted / *accepted count proposed and accepted draft tokens. */
int wk_greedy_generate_spec(struct wk_model *m, struct wk_model *draft, struct wk_page_alloc *pa,
                            const int32_t *prompt, int n_prompt, const struct wk_greedy_opts *o,
                            int k, int32_t *out, int *n_gen, int *drafted, int *accepted, char *err,
                            size_t errlen);

/* Proposes up to kk draft tokens (drafts[0..*n), *n <= kk; 0 runs the round without
 * drafts) after `token`, the last emitted token, given the last accepted position p
 * (its K/V are in blk's pages) and its final-normed hidden state h (host [hidden]). */
typedef int (*wk_propose_fn)(void *ctx, const struct wk_seq_blocks *blk, int32_t token, int p,
                             const float *h, int kk, int32_t *drafts, int *n, char *err,
                             size_t errlen);

/* wk_greedy_generate_spec with any proposer (tests use an oracle). */
int wk_greedy_generate_spec_fn(struct wk_model *m, struct wk_page_alloc *pa, const int32_t *prompt,
                               int n_prompt, const struct wk_greedy_opts *o, int k,
                               wk_propose_fn propose, void *ctx, int32_t *out, int *n_gen,
                               int *drafted, int *accepted, char *err, size_t errlen);

/* wk_greedy_generate_spec with n-gram drafts (wk-ngram.h: suffixes of min_n .. max_n
 * tokens looked up in the prompt and the tokens so far) instead of a draft model. */
int wk_greedy_generate_ngram(struct wk_model *m, struct wk_page_alloc *pa, const int32_t *prompt,
                             int n_prompt, const struct wk_greedy_opts *o, int k, int min_n,
                             int max_n, int32_t *out, int *n_gen, int *drafted, int *accepted,
                             char *err, size_t errlen);

/* Index of the largest of v[0..n) (first on ties; NaN never wins). */
int32_t wk_argmax(const float *v, int n);

#endif
