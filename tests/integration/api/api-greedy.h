/* api-greedy.h — what the multimodal API tests (Gemma 3 and 4 images, audio)
 * share: a user message's image parts, greedy chat answers with their tokens'
 * bytes, /tokenize of a chat body, 400s naming a field, and the offline path
 * they are held to: a prompt's ids with given rows over its soft tokens
 * decoded greedily by wk_model_forward on the CPU backend, its tokens compared
 * with a served answer's. Every function requires success (TH_REQUIRE) or
 * fails the test. */
#ifndef LMSERVE_TESTS_API_GREEDY_H
#define LMSERVE_TESTS_API_GREEDY_H
#include <jansson.h>
#include <stdint.h>

#include "tests/integration/api/api-serve.h"
#include "worker/wk-model.h"

#define API_GEN 8 /* tokens each answer generates (max_tokens, ignore_eos) */

/* One greedy answer: its text, prompt_tokens and each token's bytes. */
struct api_answer {
  char text[1024];
  int prompt_tokens;
  char tok[API_GEN][64]; /* the logprobs' bytes, NUL-terminated */
  int tok_len[API_GEN];
};

/* A user message's content parts (a JSON array, the caller's): the text
 * before, an image_url part per url, then the text after unless NULL. */
json_t *api_image_parts(const char *before, const char *const urls[], int n_urls,
                        const char *after);
/* A greedy chat request's body (malloc'd): one user message of the content
 * parts (a JSON array, taken over), API_GEN tokens at temperature 0 with
 * ignore_eos and logprobs, mm_processor_kwargs when not NULL (taken over),
 * streamed when stream. */
char *api_greedy_body(json_t *parts, json_t *mm_kwargs, int stream);
/* A 200 chat answer of API_GEN tokens with logprobs into *a. */
void api_parse_answer(const struct as_resp *r, struct api_answer *a);
/* POST body to /v1/chat/completions; the answer into *a. */
void api_chat(const struct as_server *s, const char *body, struct api_answer *a);
/* /tokenize of a chat body's messages (and its mm_processor_kwargs): the ids
 * (malloc'd, with room for API_GEN more), *n of them. */
int32_t *api_tokenize(const struct as_server *s, const char *body_json, int *n);
/* The body is a 400 whose param is param. */
void api_refused(const struct as_server *s, const char *body, const char *param);

/* a and b both still answer body with want's text. */
void api_check_both(const struct as_server *a, const struct as_server *b, const char *body,
                    const struct api_answer *want);
/* The prompt of body, text_only's words with n_runs media after them: on s,
 * text_only's tokens and, from the first begin on, per medium begin,
 * soft[r] x media, end; a greedy answer to it (into *r) counts as many
 * prompt tokens. */
void api_check_prompt(const struct as_server *s, const char *text_only, const char *body,
                      int32_t begin, int32_t media, int32_t end, const int *soft, int n_runs,
                      struct api_answer *r);
/* What a multimodal request is held to: one asked twice on a and once on b
 * (a server whose short steps run it in chunks), two on both, the same text
 * each time, the same prompt tokens for two; two_s (two streamed) on b the
 * same text; other (one's words with another medium) on a another text. The
 * answers on a to one and two into *a1, *a2. */
void api_check_deterministic(const struct as_server *a, const struct as_server *b, const char *one,
                             const char *two, const char *two_s, const char *other,
                             struct api_answer *a1, struct api_answer *a2);

/* The offline path: the checkpoint in dir on the CPU backend (2 threads),
 * for prompts of up to max_prompt tokens; the tower's rows are the caller's. */
struct api_offline {
  struct kn_backend *be;
  struct wk_model *m;
};
void api_offline_open(struct api_offline *o, const char *dir, int max_prompt);
void api_offline_close(struct api_offline *o);
/* Greedy tokens of ids[0..n) with emb's rows over their soft tokens and
 * ranges [n_ranges][2] bidirectional (NULL: none): the whole prompt in one
 * forward, then one token per forward, into out[API_GEN]. */
void api_offline_greedy(struct api_offline *o, const int32_t *ids, int n,
                        const struct wk_seq_embed *emb, int n_emb, const int32_t *ranges,
                        int n_ranges, int32_t *out);
/* gen[API_GEN]'s bytes (dir's tokenizer) are want's; what names the prompt. */
void api_check_tokens(const char *dir, const int32_t *gen, const struct api_answer *want,
                      const char *what);

#endif
