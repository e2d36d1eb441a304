/* wk-role.h — the step executor of `lmserve worker`: turns one STEP plan from
 * the scheduler (proto/pr-msg.h) into one forward pass over a ragged batch,
 * samples (every rank alike: the seeds and logits agree) and fills the RESULT
 * message that rank 0 sends.
 *
 *   struct wk_role *r;
 *   wk_role_create(model, draft_or_NULL, &opts, &r);
 *   for each STEP: rc = wk_role_step(r, &msg.u.step, &result, err, sizeof err);
 *                  rc == 0: send `result` (PR_RESULT); else send FAIL with err.
 *   wk_role_destroy(r);
 *
 * Per-sequence worker state lives here: sampling parameters (from the step
 * that carries PR_SEQ_NEW), penalty state (prompt tokens from PR_SEQ_PREFILL
 * chunks, counts of sampled tokens) and one block table per KV group
 * (replaced, or extended with PR_SEQ_APPEND_BLOCKS), and what its latest
 * sampling step gave: the token it sampled, which a step flagging
 * PR_SEQ_PREV_TOKEN runs after the drafts that step accepted (async
 * scheduling: the scheduler sent that step before it knew either), and the
 * drafts it proposed, which PR_SEQ_PREV_DRAFTS verifies — as many as a
 * synchronous step would send (num_draft, and none past the request's
 * max_tokens). State is dropped for ids in free_ids and after a step that
 * flags PR_SEQ_FINISHED.
 *
 * A bad step (unknown sequence without NEW, token ids outside the
 * vocabulary, blocks outside the pool, too many tokens or sequences, draft
 * requests the worker cannot serve) is refused as a whole, before any state
 * changes (except that free_ids are still dropped), with a negative cm_err
 * and a one-line reason; the executor stays usable. Nothing is allocated per step except when a
 * block table outgrows its capacity (amortised doubling).
 *
 * A sequence's images and audio clips (STEP's pr_image records) come with
 * the chunks that run their soft tokens: their embeddings (wk-encoder.h,
 * cached by content) replace those rows as they are (not scaled, as
 * transformers' Gemma 4 writes them); each image's tokens attend to each other
 * both ways, a clip's causally (Gemma 4's bidirectional mask is for vision
 * tokens only).
 *
 * Seeded draws use the absolute position of the token being produced as the
 * counter (start_pos + tokens run before it), so a request's tokens do not
 * depend on batching, chunking or preemption.
 *
 * The result message borrows the executor's buffers: it stays valid until
 * the next wk_role_step call. */
#ifndef LMSERVE_WK_ROLE_H
#define LMSERVE_WK_ROLE_H
#include <stddef.h>
#include <stdint.h>

#include "proto/pr-msg.h"
#include "worker/wk-encoder.h"
#include "worker/wk-model.h"
#include "worker/wk-sampler.h"
#include "worker/wk-vision-g4.h"
#include "worker/wk-vision.h"

struct wk_role;

struct wk_role_opts {
  int max_seqs;        /* sequences per step (--max-num-seqs), >= 1 */
  int max_draft;       /* drafts per sequence and step (K); 0 without an assistant model
                          or n-gram drafts */
  int ngram_min, ngram_max; /* ngram_max > 0 (and no assistant model): drafts by prompt
                               lookup (wk-ngram.h), suffixes of ngram_min .. ngram_max
                               tokens */
  uint32_t rank;       /* copied into RESULT */
  int device_sampling; /* 1: steps without drafts to verify sample with kn_sample on the
                          model's backend (CUDA: only token ids leave the device) */
  struct wk_vision *vision; /* the image encoder (Gemma 3), or NULL: steps with images
                               are refused. It must outlive the executor. */
  struct wk_vision_g4 *vision_g4; /* the same for Gemma 4 (images of any size); at most
                                     one of the two */
  struct wk_encoder_audio audio;  /* Gemma 4's audio tower (tower NULL: steps with audio are
                                     refused) and its clips' shape; it must outlive the
                                     executor */
  const char *tokenizer;          /* tokenizer.json (or its folder) giving the vocabulary's bytes to
                                     structured outputs (wk-grammar.h), loaded with the first one */
  const char *tokenizer_gguf;     /* without one: a GGUF file whose metadata's tokenizer gives
                                     them (tk_load_gguf); both NULL: sequences with a grammar are
                                     refused */
};

/* `model` (and `draft` when not NULL) must outlive the executor. Returns 0 or
 * CM_ERR_NOMEM / CM_ERR_INVAL. */
int wk_role_create(struct wk_model *model, struct wk_model *draft, const struct wk_role_opts *o,
                   struct wk_role **out);
void wk_role_destroy(struct wk_role *r);

/* Runs one step. On success fills *res (type PR_RESULT; one entry per
 * sequence flagged PR_SEQ_SAMPLE, in step order) and returns 0. On failure
 * returns a negative cm_err with the reason in err; state for the step's
 * sequences is unchanged when the step was refused before the forward pass. */
int wk_role_step(struct wk_role *r, const struct pr_step *step, struct pr_msg *res, char *err,
                 size_t errlen);

/* The same step in two halves, so that the next step's forward may run before
 * this one's results are read (pipelined steps, vLLM's async scheduling on the
 * worker's side):
 *
 *   wk_role_launch(r, N)      check, forward, sampling (on the backend)
 *   wk_role_launch(r, N + 1)  while N is open: its forward takes the tokens N
 *                             sampled from the backend (kn_kept_ids) for its
 *                             PR_SEQ_PREV_TOKEN rows, or CM_ERR_AGAIN with
 *                             nothing changed when it cannot (see below)
 *   wk_role_finish(r, &res)   N's results: tokens read, penalty counts and
 *                             structured-output matchers moved on, RESULT
 *   wk_role_finish(r, &res)   N + 1's
 *
 * A step launches while another is open only when nothing its sampling uses
 * depends on the open step's tokens: one rank, no drafts, no structured
 * outputs in it, no penalties for the sequences the open step sampled, none of
 * the open step's sequences freed, started again or finished, the open step
 * sampled on the backend and its ids kept there. Otherwise (CM_ERR_AGAIN) the
 * caller finishes the open step and launches it again: the sequential path.
 * Results are finished in launch order; a launch that fails leaves the open
 * step to finish as usual. At most two steps are open. The result message
 * borrows the executor's buffers until the next wk_role_finish. wk_role_step
 * is launch then finish, with none open. */
int wk_role_launch(struct wk_role *r, const struct pr_step *step, char *err, size_t errlen);
int wk_role_finish(struct wk_role *r, struct pr_msg *res, char *err, size_t errlen);
/* Steps launched and not finished (0, 1 or 2). */
int wk_role_open(const struct wk_role *r);
/* Steps launched while another was open, since create. */
uint64_t wk_role_pipelined(const struct wk_role *r);

/* Begins building the structured-output state (the vocabulary's trie, ~0.8 s and
 * ~40 MB at V = 262,144) on a thread of its own, so that the steps that run
 * meanwhile are not held (PR_CTRL_GRAMMARS); the first constrained step takes it,
 * waiting for it if it is not done. Without the call that step builds it. */
void wk_role_grammars_start(struct wk_role *r);
/* PR_BEAT_GRAMMARS once the state is built, PR_BEAT_GRAMMARS_FAILED once building
 * it failed, else 0. Any thread may ask. */
unsigned wk_role_grammars_flags(struct wk_role *r);

/* Drops every sequence's state (a new scheduler starts from nothing). */
void wk_role_reset(struct wk_role *r);

/* Sequences with worker-side state (for tests and logs). */
int wk_role_n_seqs(const struct wk_role *r);

/* Converts wire sampling parameters to the sampler's (seed chosen from
 * `fallback_seed` when the request has none). */
void wk_role_sampling(const struct pr_sampling *in, uint64_t fallback_seed,
                      struct wk_sampling_params *out);

#endif
