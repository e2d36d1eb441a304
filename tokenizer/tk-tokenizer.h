/* tk-tokenizer.h — the tokenizer library: Hugging Face tokenizer.json (BPE).
 *
 * Supported tokenizer.json (everything else is refused at load time with a
 * clear error naming the field, and CM_ERR_UNSUPPORTED):
 *   model          BPE: vocab, merges ("a b" strings or [a, b] pairs), unk_token,
 *                  fuse_unk, byte_fallback (<0xXX> tokens), ignore_merges;
 *                  dropout, continuing_subword_prefix, end_of_word_suffix null
 *   normalizer     null, Replace{String}, or a Sequence of Replace{String}
 *   pre_tokenizer  null, or Split{String, behavior Removed | Isolated |
 *                  MergedWithPrevious | MergedWithNext, invert false}
 *   post_processor null, or TemplateProcessing whose `single` is special tokens
 *                  around Sequence A (for Gemma: <bos> A)
 *   decoder        null, or a Sequence of Replace{String}, ByteFallback, Fuse
 *   added_tokens   matched leftmost-longest on the raw text before anything
 *                  else (as Hugging Face's AddedVocabulary does); lstrip,
 *                  rstrip, single_word and normalized must be false
 *
 * encode() gives exactly what Hugging Face's tokenizer.encode(text) gives
 * (add_special_tokens=True by default: the post-processor's BOS). Decoding
 * follows Hugging Face's decode(ids, skip_special_tokens).
 *
 * Thread safety: a loaded tokenizer is immutable except for its word cache;
 * use one tk_state per thread (encode takes one) or NULL for a private,
 * cache-less call. Threads that come and go (a thread pool) borrow states
 * from the tokenizer's own pool: tk_state_acquire / tk_state_release. */
#ifndef LMSERVE_TK_TOKENIZER_H
#define LMSERVE_TK_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>

struct tk_tokenizer;        /* a loaded tokenizer (opaque, immutable) */
struct tk_state;  /* per-thread scratch and word cache for encode */

/* Loads `path`: a tokenizer.json file or a directory holding one. On error
 * returns a negative cm_err and, when errbuf is given, a one-line reason
 * ("tokenizer.json: model.type \"WordPiece\" is not supported"). */
int tk_load(const char *path, struct tk_tokenizer **out, char *errbuf, size_t errlen);
void tk_free(struct tk_tokenizer *tok);

/* Number of ids (vocab plus added tokens beyond it); valid ids are [0, n). */
int32_t tk_n_vocab(const struct tk_tokenizer *tok);

/* Special ids; -1 when the tokenizer has none. eos is "<eos>" when present. */
int32_t tk_bos(const struct tk_tokenizer *tok);
int32_t tk_eos(const struct tk_tokenizer *tok);
int32_t tk_pad(const struct tk_tokenizer *tok);
int32_t tk_unk(const struct tk_tokenizer *tok);
/* Id of an exact token string (vocab or added), or -1. */
int32_t tk_find(const struct tk_tokenizer *tok, const char *s, size_t len);
/* 1 when `id` is an added token marked special (skipped by skip_special). */
int tk_is_special(const struct tk_tokenizer *tok, int32_t id);
/* Byte value 0..255 when `id` is a byte-fallback token "<0xXX>", else -1. */
int tk_byte_value(const struct tk_tokenizer *tok, int32_t id);

/* The raw token string of `id` (e.g. "▁Hello", "<0x0A>", "<bos>"), not NUL
 * terminated; NULL for an invalid id. */
const char *tk_token_str(const struct tk_tokenizer *tok, int32_t id, size_t *len);
/* 1 when `id` is an added token (matched before the model: special or not). */
int tk_is_added(const struct tk_tokenizer *tok, int32_t id);
/* ranks[id] (for every id < tk_n_vocab) = the rank of the first merge whose
 * result is id, or -1 when no merge makes it: a SentencePiece-style score
 * (its negation) that orders merges as the BPE model does (export-gguf). */
void tk_merge_ranks(const struct tk_tokenizer *tok, int32_t *ranks);
/* The BPE model's merges in rank order: lr[2 i] and lr[2 i + 1], the left and
 * right ids of merge i, for i < tk_n_merges (a rank no merge has: -1, -1). */
int32_t tk_n_merges(const struct tk_tokenizer *tok);
void tk_merge_pairs(const struct tk_tokenizer *tok, int32_t *lr);

/* The same from tokenizer.json's text (len bytes, copied). */
int tk_load_json(const char *text, size_t len, struct tk_tokenizer **out, char *errbuf,
                 size_t errlen);

/* A SentencePiece-style vocabulary, as GGUF files carry it (tokenizer.ggml.model
 * "llama": tokens, scores, token types), for tk_load_spm. */
struct tk_spm {
  int32_t n;               /* tokens: ids [0, n) */
  const char *const *text; /* [n] each token's bytes (UTF-8) */
  const uint32_t *len;     /* [n] bytes */
  const float *score;      /* [n] merge priority: a higher score merges first */
  const int32_t *type;     /* [n] TK_SPM_* */
  int add_bos;             /* 1: encoding starts with bos */
  int32_t bos;             /* -1: none */
  /* Merges given as they are (GGUF files of tokenizer.ggml.model "gemma4"),
   * in rank order: merge i joins merge_text[2 i] (merge_len[2 i] bytes) and
   * merge_text[2 i + 1]; n_merges 0: derived from the scores as below. */
  int64_t n_merges;
  const char *const *merge_text;
  const uint32_t *merge_len;
};
enum {
  TK_SPM_NORMAL = 1,
  TK_SPM_UNKNOWN = 2,
  TK_SPM_CONTROL = 3,
  TK_SPM_USER = 4,
  TK_SPM_UNUSED = 5,
  TK_SPM_BYTE = 6,
};

/* A tokenizer from such a vocabulary, built as Hugging Face converts a
 * SentencePiece BPE model (Gemma's): the pieces a BPE vocabulary; a merge for
 * every two pieces that make a third, ordered by that piece's score (highest
 * first), then the longer left part, the longer right part, then piece and
 * part ids; control, unknown and user-defined pieces matched before the model
 * (the first two special); byte pieces "<0xXX>" the byte fallback; " "
 * normalized to U+2581 and split after, decoded back. 0, or a cm_err with a
 * sentence in errbuf. */
int tk_load_spm(const struct tk_spm *v, struct tk_tokenizer **out, char *errbuf, size_t errlen);

/* The tokenizer of a GGUF file's metadata through tk_load_spm: tokens, scores,
 * token_type, bos_token_id, add_bos_token, with tokenizer.ggml.model "llama"
 * (SentencePiece: merges from the scores) or "gemma4" (llama.cpp's converter's
 * Gemma 4 vocabulary: the merges of tokenizer.ggml.merges, "left right", as
 * tokenizer.json lists them; the same pipeline: Gemma 4's tokenizer.json is a
 * BPE over U+2581-escaped text with byte fallback and no pre-split), and its
 * chat template (tokenizer.chat_template; *chat_template NULL when absent,
 * else malloc'd, NUL-terminated; chat_template may be NULL). */
int tk_load_gguf(const char *path, struct tk_tokenizer **out, char **chat_template, char *errbuf,
                 size_t errlen);
/* The same from a GGUF file already open (path for messages); g is only read. */
struct md_gguf;
int tk_from_gguf(const struct md_gguf *g, const char *path, struct tk_tokenizer **out,
                 char **chat_template, char *errbuf, size_t errlen);

/* Per-thread state: scratch buffers and a word cache (bounded). */
int tk_state_create(const struct tk_tokenizer *tok, struct tk_state **out);
void tk_state_free(struct tk_state *st);

/* States shared by callers on several threads (thread-safe): acquire hands
 * out an idle state of the tokenizer's pool, or a new one, for the caller's
 * use alone; release gives it back (the pool keeps a few, frees the rest).
 * Every acquired state must be released before tk_free. */
int tk_state_acquire(const struct tk_tokenizer *tok, struct tk_state **out);
void tk_state_release(const struct tk_tokenizer *tok, struct tk_state *st);

enum {
  TK_ADD_SPECIAL = 1 << 0,   /* run the post-processor (BOS) */
  TK_MATCH_SPECIAL = 1 << 1, /* match special added tokens in the text */
  TK_DEFAULT = TK_ADD_SPECIAL | TK_MATCH_SPECIAL, /* = HF encode(text) */
};

/* Encodes `len` bytes of UTF-8 `text`. Ids are appended to *ids (a malloc'd
 * array of capacity *cap, grown with realloc; may start NULL/0); *n_ids is
 * set to the count. Without TK_MATCH_SPECIAL, added tokens marked
 * special are not matched (their text is encoded as ordinary text, like
 * Hugging Face's split_special_tokens=True); non-special added tokens are
 * always matched. Returns 0, CM_ERR_INVAL for invalid UTF-8, CM_ERR_NOMEM. */
int tk_encode(const struct tk_tokenizer *tok, struct tk_state *st, const char *text, size_t len,
                  unsigned flags, int32_t **ids, size_t *n_ids, size_t *cap);

/* Decodes ids to text like Hugging Face's decode(ids, skip_special_tokens).
 * The result is written to *out (malloc'd, grown with realloc, capacity
 * *cap; NUL terminated), its length in *out_len. Returns 0, CM_ERR_RANGE for
 * an id outside [0, n_vocab), CM_ERR_NOMEM. */
int tk_decode(const struct tk_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                  char **out, size_t *out_len, size_t *cap);

/* The text one token contributes after the decoder's per-token steps
 * (Replace), without byte fallback: "<0x41>" stays as is. For streaming use
 * tk_detok (tk-detok.h), which also handles byte-fallback runs. */
int tk_token_to_piece(const struct tk_tokenizer *tok, int32_t id, char *buf, size_t buflen,
                          size_t *len);

/* 1 when `s` is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
int tk_utf8_valid(const char *s, size_t len);

#endif
