/* wk-ngram.h — n-gram (prompt lookup) drafts for speculative decoding: a
 * sequence's tokens so far, and the tokens that followed the earliest earlier
 * occurrence of its longest suffix, as vLLM's `ngram` method proposes them.
 * Plain host code: every rank of a tensor-parallel group keeps the same
 * history and proposes the same drafts. */
#ifndef LMSERVE_WK_NGRAM_H
#define LMSERVE_WK_NGRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The tokens at positions 0 .. n - 1 of one sequence. `broken`: a position was
 * skipped (the step did not carry the tokens before it), so nothing is proposed
 * until the sequence starts again. */
struct wk_ngram_hist {
  int32_t *v;
  int n, cap;
  int broken;
};

/* Empties h for a new sequence (its buffer is kept). */
void wk_ngram_reset(struct wk_ngram_hist *h);
void wk_ngram_free(struct wk_ngram_hist *h);

/* The n tokens ids[] at positions pos .. pos + n - 1: those below h->n are
 * passed over (already there), a gap before pos marks h broken. Returns 0 or
 * CM_ERR_NOMEM (h is then broken too). */
int wk_ngram_put(struct wk_ngram_hist *h, uint32_t pos, const int32_t *ids, uint32_t n);

/* Up to k drafts for the token after h's last, into out[]; returns how many (0
 * when nothing matches, h is broken, or h is shorter than min_n + 1). The match
 * is the longest suffix of h of min_n .. max_n tokens that also occurs earlier
 * with at least one token after it, at its earliest such place; the drafts are
 * the tokens after that occurrence, no more than h holds. */
int wk_ngram_propose(const struct wk_ngram_hist *h, int min_n, int max_n, int k, int32_t *out);

/* The flags (worker, serve): --speculative-model ngram (or vLLM's "[ngram]")
 * drafts by prompt lookup instead of an assistant model, with vLLM's
 * --ngram-prompt-lookup-max / -min. */
#define WK_SPEC_MODEL_HELP                                                                         \
  "Gemma 4 MTP assistant checkpoint, or `ngram`: drafts looked up in the sequence's own tokens "   \
  "(prompt lookup)"
#define WK_NGRAM_MAX_HELP                                                                          \
  "with --speculative-model ngram: the longest suffix matched (--ngram-prompt-lookup-min, "        \
  "else 5)"
#define WK_NGRAM_MIN_HELP                                                                          \
  "with --speculative-model ngram: the shortest suffix matched (--ngram-prompt-lookup-max, "       \
  "else 5)"

/* --speculative-config JSON (serve, worker): vLLM's form of the flags above,
 * an object of "method" ("ngram", or "mtp" / "draft_model" with "model" an assistant
 * checkpoint; without it, "model" as --speculative-model takes it),
 * "num_speculative_tokens" (1 .. max_k), with ngram "prompt_lookup_max" /
 * "prompt_lookup_min", and "disable_by_batch_size" (serve says it to the scheduler as
 * --speculative-disable-by-batch-size; a worker has no use for it). */
#define WK_SPEC_CONFIG_HELP                                                                        \
  "speculative decoding as vLLM's JSON, e.g. '{\"method\": \"ngram\", "                            \
  "\"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4}' (instead of the flags)"

/* What --speculative-config says: 0 = not given. */
struct wk_spec_json {
  const char *model;     /* "ngram", or the assistant's path (in the caller's buffer) */
  int64_t k;             /* num_speculative_tokens */
  int64_t ngram_max;     /* prompt_lookup_max */
  int64_t ngram_min;     /* prompt_lookup_min */
  int64_t disable_batch; /* disable_by_batch_size */
};

/* Parses json (--speculative-config) into *out, the assistant's path copied into
 * model_buf of cap bytes. 0, or -1 with the reason printed after prog on stderr
 * (flags_given: the separate flags it stands for were given too; not an object, a key
 * or method lmserve does not take, a value of the wrong type or out of range). */
int wk_spec_config_args(const char *prog, const char *json, bool flags_given, int64_t max_k,
                        char *model_buf, size_t cap, struct wk_spec_json *out);

/* Whether spec (--speculative-model, or NULL) asks for n-gram drafts: 1, with
 * the match lengths in *max_n and *min_n from the flags' values (0 = not given:
 * the other's, both 5 without either); 0 for an assistant model or none; -1
 * with the reason printed after prog on stderr (lookup flags without ngram, min
 * above max). */
int wk_spec_ngram_args(const char *prog, const char *spec, int64_t max_given, int64_t min_given,
                       int64_t *max_n, int64_t *min_n);

#endif
