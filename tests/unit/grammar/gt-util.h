/* gt-util.h — helpers of the grammar tests: vocabularies (a toy one, the real
 * Gemma one), random walks of a grammar, and an oracle process. */
#ifndef LMSERVE_GT_UTIL_H
#define LMSERVE_GT_UTIL_H
#include <stddef.h>
#include <stdint.h>

#include "grammar/gr.h"

/* A small vocabulary: all single bytes, common JSON fragments, words. */
struct gr_vocab *gt_vocab_toy(void);
/* The Gemma 3 tokenizer's 262,144 tokens ("▁" as a space, <0xNN> as that
 * byte, special tokens length 0); NULL when the file is missing. */
struct gr_vocab *gt_vocab_gemma(void);
/* xorshift-style generator */
uint64_t gt_rand(uint64_t *s);
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

#endif
