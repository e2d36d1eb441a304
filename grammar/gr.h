/* gr.h — structured outputs: grammars compiled from a regex, a choice list, a
 * JSON mode, a JSON Schema or an EBNF grammar, and matchers that follow a generation token by
 * token and say which tokens of a vocabulary may come next.
 *
 *   struct gr_grammar *g;
 *   gr_compile(GR_REGEX, "[0-9]{3}-[a-z]+", len, &g, err, sizeof err);   // 0, or a 400's text
 *   struct gr_vocab *v;  gr_vocab_create(bytes, lens, n_vocab, &v);     // once per process
 *   struct gr_matcher *m = gr_matcher_new(g);
 *   gr_matcher_mask(m, v, bits);           // bit i: token i may come next
 *   gr_matcher_accept_token(m, v, id);     // after sampling; refuses a token outside the mask
 *   gr_matcher_is_accepting(m);            // the output so far is complete: EOS may come
 *
 * A grammar is over bytes (UTF-8 text); a vocabulary gives each token id the
 * bytes it decodes to (length 0: a control token no grammar ever allows: BOS,
 * EOS, <start_of_turn>; the caller allows EOS itself where the matcher
 * accepts). No HTTP, no tensors, no threads: grammars and vocabularies are
 * immutable once made and may be shared between threads; a matcher belongs
 * to one thread at a time. */
#ifndef LMSERVE_GR_H
#define LMSERVE_GR_H
#include <stddef.h>
#include <stdint.h>

struct gr_grammar;
struct gr_vocab;
struct gr_matcher;

/* What a request constrains its output with (vLLM's structured_outputs kinds). */
enum gr_kind {
  GR_REGEX = 1,       /* text: an ECMA-262 pattern, matched whole (as if ^(?:...)$) */
  GR_CHOICE = 2,      /* text: a JSON array of strings; the output is one of them */
  GR_JSON_OBJECT = 3, /* text ignored: any JSON object (response_format json_object) */
  GR_JSON_SCHEMA = 4, /* text: a JSON Schema (response_format json_schema) */
  GR_GRAMMAR = 5,     /* text: an EBNF grammar in GBNF notation (llama.cpp's; start rule `root`);
                       * `<[N]>` is special token N */
  /* text: "OPEN CLOSE KIND\n" (decimal token ids and a kind) and then that kind's
   * text: that constraint, optionally preceded by special token OPEN, any text,
   * special token CLOSE (a model's thinking before a constrained answer) */
  GR_AFTER_SPAN = 6,
};

/* Special tokens in grammars. A vocabulary holds no text for control tokens,
 * but a grammar may name one (GBNF's <[N]>, GR_AFTER_SPAN): such a token is
 * spelled, in the bytes the grammar and gr_vocab_create see, as GR_TOKEN_LEN
 * bytes: GR_TOKEN_BYTE and its id's three bytes, high first. 0xFF is never part
 * of UTF-8 text, so no text spells it — provided no other token of the
 * vocabulary starts with that byte (a byte-fallback token <0xFF> must be given
 * no bytes). */
#define GR_TOKEN_BYTE 0xFF
#define GR_TOKEN_LEN  4
#define GR_TOKEN_MAX  0xFFFFFF
/* b[GR_TOKEN_LEN]: the bytes of special token id (0 <= id <= GR_TOKEN_MAX). */
static inline void gr_token_bytes(int32_t id, uint8_t *b) {
  b[0] = GR_TOKEN_BYTE;
  b[1] = (uint8_t)(id >> 16);
  b[2] = (uint8_t)(id >> 8);
  b[3] = (uint8_t)id;
}

/* Compiles text[len] of kind. 0 and *out, or CM_ERR_INVAL (the request's fault:
 * err holds one line naming what is wrong and where: "regex: unbalanced ')' at
 * 7", "json_schema: keyword 'uniqueItems' at /properties/tags is not supported"),
 * CM_ERR_TOOBIG (the grammar would exceed the compiler's limits), CM_ERR_NOMEM. */
int gr_compile(enum gr_kind kind, const char *text, size_t len, struct gr_grammar **out, char *err,
               size_t errlen);
void gr_grammar_free(struct gr_grammar *g);
/* What masks need of g beyond its automaton (per state: how much plain text, which
 * runs of an alphabet it takes), made now instead of on g's first mask: what a
 * worker does once a grammar is compiled (a frontend that only checks a grammar
 * need not). 0, or CM_ERR_NOMEM. */
int gr_grammar_prepare(struct gr_grammar *g);
/* A hash of (kind, text) as compiled: equal inputs, equal hashes (caches). */
uint64_t gr_grammar_hash(const struct gr_grammar *g);

/* The vocabulary: token i is bytes[i][0 .. lens[i]) (copied). */
int gr_vocab_create(const uint8_t *const *bytes, const uint32_t *lens, int32_t n,
                    struct gr_vocab **out);
void gr_vocab_free(struct gr_vocab *v);
int32_t gr_vocab_size(const struct gr_vocab *v);
/* Token id's bytes (*bytes; NULL for an id outside the vocabulary) and their length. */
uint32_t gr_vocab_token(const struct gr_vocab *v, int32_t id, const uint8_t **bytes);

/* A matcher at the start of g's language (NULL: out of memory). */
struct gr_matcher *gr_matcher_new(const struct gr_grammar *g);
/* A copy of m's state (speculative positions: advance the copy, keep the original). */
struct gr_matcher *gr_matcher_clone(const struct gr_matcher *m);
/* m takes src's state (both of the same grammar). */
int gr_matcher_copy(struct gr_matcher *m, const struct gr_matcher *src);
void gr_matcher_free(struct gr_matcher *m);

/* Advances over bytes / token id's bytes: 0, or CM_ERR_INVAL when they leave the
 * language (m unchanged). */
int gr_matcher_accept_bytes(struct gr_matcher *m, const uint8_t *b, size_t n);
int gr_matcher_accept_token(struct gr_matcher *m, const struct gr_vocab *v, int32_t id);
/* 1 when the bytes so far are a whole sentence of the language (EOS may come). */
int gr_matcher_is_accepting(const struct gr_matcher *m);
/* 1 when some byte may follow (0: only EOS may come). */
int gr_matcher_can_continue(const struct gr_matcher *m);

/* bits[(gr_vocab_size(v) + 31) / 32]: bit i (bits[i / 32] >> (i % 32) & 1) set
 * when token i's bytes may come next. Control tokens (length 0) are clear. */
int gr_matcher_mask(struct gr_matcher *m, const struct gr_vocab *v, uint32_t *bits);

/* The bytes every continuation must start with, when there is only one way to go
 * (forced text; fast-forward), at most cap bytes into buf: their count. */
size_t gr_matcher_forced(const struct gr_matcher *m, uint8_t *buf, size_t cap);

/* A random valid generation from m's state (tests and benchmarks): up to
 * max_tokens steps, each masking the vocabulary (its time in µs into
 * mask_us[step] unless NULL) and taking a random allowed token, a third of the
 * time one that closes a string, object or array so that walks end; where m
 * accepts it stops with probability 1/4. The text into buf (NUL-ended; buf may
 * be NULL), the steps into *steps. Returns the text's length when the walk ended
 * where the grammar accepts, else -1 (stuck, cut at max_tokens, or the text
 * longer than cap - 1). rng: the walk's state (advanced). */
int gr_random_walk(struct gr_matcher *m, const struct gr_vocab *v, uint64_t *rng, int max_tokens,
                   char *buf, size_t cap, double *mask_us, int *steps);

#endif
