/* gt-util.h — helpers of the grammar tests: vocabularies (a toy one, the real
 * Gemma one), random walks of a grammar, and an oracle process. */
#ifndef LMSERVE_GT_UTIL_H
#define LMSERVE_GT_UTIL_H
#include <stddef.h>
#include <stdint.h>

#include "common/cm-hash.h" /* cm_splitmix64: the tests' random numbers */
#include "grammar/gr.h"

/* A small vocabulary: all single bytes, common JSON fragments, words. */
struct gr_vocab *gt_vocab_toy(void);
/* The Gemma 3 tokenizer's 262,144 tokens ("▁" as a space, <0xNN> as that
 * byte, special tokens length 0); NULL when the file is missing. */
struct gr_vocab *gt_vocab_gemma(void);
/* A random walk of m's language into buf (at most cap - 1 bytes, NUL-ended):
 * its length, or -1 when it could not finish within cap. m is advanced. */
int gt_walk(struct gr_matcher *m, uint64_t *rng, char *buf, size_t cap, int stop_pct);
/* Runs cmd with input on stdin; its stdout (malloc'd, NUL-ended) or NULL. */
char *gt_run(const char *cmd, const char *input);
/* Asks tests/reference/json_oracle.py whether each text is a JSON object (no
 * schema) or valid against schema: 1 / 0 each (malloc'd), or NULL when the
 * oracle is missing or skips. */
int *gt_py_check(const char *schema, char **texts, size_t n);
/* 1 when `prog` runs (node, python3). */
int gt_have(const char *prog);

/* 1 when g takes the n bytes of t whole: accepted in one call and accepting
 * at the end. */
int gt_takes(const struct gr_grammar *g, const char *t, size_t n);
/* Checks that compiling text as kind fails with code and an error message
 * containing msg, and leaves no grammar; a failed check names the text. */
void gt_expect_err(enum gr_kind kind, const char *text, int code, const char *msg);
/* Compiles the n bytes of t as kind for tests of random texts (no crash, no
 * leak): when refused, checks that there is a message and no grammar and
 * returns 0; when compiled, masks v for a matcher of it, takes a random byte
 * walk and returns 1. */
int gt_compile_and_poke(enum gr_kind kind, const char *t, size_t n, const struct gr_vocab *v,
                        uint64_t *rng);
/* Feeds 3,000 random texts, each prefix and then 1 to max_pieces pieces
 * drawn from pieces[npieces] (rng from seed), to gt_compile_and_poke with the
 * toy vocabulary; checks that more than 100 compiled and more than 100 were
 * refused. */
void gt_random_texts(enum gr_kind kind, const char *prefix, const char *const *pieces,
                     size_t npieces, int max_pieces, uint64_t seed);
/* runs random token walks of g under v (at most max_tokens each, rng from
 * seed): the texts that finished, each and the array malloc'd, their count in
 * *n; free with gt_texts_free. */
char **gt_generations(const struct gr_grammar *g, const struct gr_vocab *v, int runs,
                      int max_tokens, uint64_t seed, size_t *n);
void gt_texts_free(char **texts, size_t n);

#endif
