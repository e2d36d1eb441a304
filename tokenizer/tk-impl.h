/* tk-impl.h — the tokenizer's internal layout, shared by tk-load.c
 * (building it from tokenizer.json), tk-bpe.c (the BPE model) and
 * tk-tokenizer.c (the encode / decode pipeline). Not part of the public API. */
#ifndef LMSERVE_TK_IMPL_H
#define LMSERVE_TK_IMPL_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tk-tokenizer.h"

#define TK_MAX_REPLACE 8   /* normalizer / decoder Replace steps */
#define TK_MAX_POST 8      /* special tokens before / after sequence A */

enum {
  TK_TOKF_PRESENT = 1 << 0, /* the id has a string */
  TK_TOKF_ADDED = 1 << 1,   /* an added token (matched before the model) */
  TK_TOKF_SPECIAL = 1 << 2, /* an added token marked special */
  TK_TOKF_BYTE = 1 << 3,    /* a byte-fallback token "<0xXX>" */
};

enum tk_split {
  TK_SPLIT_NONE = 0,
  TK_SPLIT_REMOVED,
  TK_SPLIT_ISOLATED,
  TK_SPLIT_MERGED_PREV,
  TK_SPLIT_MERGED_NEXT,
};

struct tk_replace {
  char *from, *to; /* NUL-terminated literal strings; from non-empty */
  size_t from_len, to_len; /* bytes */
};

/* One merge rule in the open-addressing table keyed by the id pair. */
struct tk_merge {
  uint64_t key;   /* (uint64)left_id << 32 | right_id; UINT64_MAX = empty */
  int32_t rank;   /* position in the merges list; lower merges first */
  int32_t result; /* id of left+right */
};

/* Byte trie of the added tokens, for leftmost-longest matching. */
struct tk_trie_node {
  int32_t child;   /* first child node, -1 none */
  int32_t sibling; /* next sibling, -1 none */
  int32_t id;      /* token ending here, -1 none */
  uint8_t byte;    /* edge label from the parent */
};

struct tk_tokenizer {
  char *blob;                 /* all token strings, back to back */
  size_t blob_len, blob_cap;  /* bytes */
  uint32_t *tok_off;          /* (n_ids) offset of each id's string in blob; tok_len,
                               * tok_flags and byte_of share its allocation */
  uint32_t *tok_len;          /* (n_ids) bytes */
  uint8_t *tok_flags;         /* (n_ids) TK_TOKF_* */
  int32_t n_ids;              /* ids are [0, n_ids) */
  int32_t n_model;            /* entries in the model vocab */

  uint64_t *vhash;            /* (vmask + 1) model vocab by string hash:
                               * tk_vtag() << 32 | (id + 1); 0 = empty */
  uint32_t vmask;
  struct tk_merge *mhash; /* (mmask + 1) merges by id pair */
  uint64_t mmask;
  int32_t n_merges;

  struct tk_trie_node *trie; /* node 0 is the root */
  int32_t n_trie, cap_trie;
  int32_t trie_root[256];        /* root's child for each first byte, -1 none */
  int32_t n_added;

  int32_t byte_id[256];          /* id of "<0xXX>", -1 when absent */
  int16_t *byte_of;              /* (n_ids) byte value of a byte token, else -1 */
  int32_t *bmp_id;               /* (0x10000) model id of each one-character token in the
                                  * Basic Multilingual Plane, -1 when not in the vocab */

  /* Word splitting inside a pre-token, for the word cache: with a
   * normalizer Replace(" " -> M), a pre-token may be cut before each run of
   * M that follows another character, unless a vocab token spans that
   * point ("cross" tokens like ">▁</"); no merge can cross a cut, so the
   * result equals BPE over the whole pre-token. */
  const char *marker;            /* M (the normalizer's replacement), NULL: no cuts */
  size_t marker_len;             /* bytes */
  int32_t cross_id[64];          /* tokens holding M right after another character */
  uint32_t cross_off[64];        /* byte offset of that M in the token */
  int n_cross;

  /* model */
  int32_t unk;                   /* -1 none */
  int fuse_unk, byte_fallback, ignore_merges;

  /* normalizer: Replace steps in order */
  struct tk_replace norm[TK_MAX_REPLACE];
  int n_norm;
  /* pre-tokenizer Split on a literal */
  enum tk_split split;
  char *split_pat;
  size_t split_len; /* bytes */
  /* post-processor (single): ids before and after sequence A */
  int32_t post_pre[TK_MAX_POST], post_suf[TK_MAX_POST];
  int n_post_pre, n_post_suf;
  /* decoder */
  struct tk_replace dec[TK_MAX_REPLACE];
  int n_dec;
  int dec_byte_fallback;
  int has_decoder;       /* 0: decode joins token strings with " " (HF's default) */

  int32_t bos, eos, pad; /* -1 none */

  /* states tk_state_acquire hands out; the pool is the one part of a loaded
   * tokenizer that changes, behind its own lock */
  struct tk_state_pool *pool;
};

#define TK_STATE_POOL_MAX 16 /* idle states kept */

struct tk_state_pool {
  pthread_mutex_t mu;
  struct tk_state *idle[TK_STATE_POOL_MAX];
  int n_idle;
};

int tk_state_pool_init(struct tk_tokenizer *tok);
void tk_state_pool_free(struct tk_tokenizer *tok);

/* One cached word: its ids live in the state's cache pool. */
struct tk_cache_ent {
  uint64_t hash;   /* 0 = empty */
  uint32_t w_off;  /* word bytes in the pool (bytes) */
  uint32_t w_len;
  uint32_t i_off;  /* ids in the id pool (ids) */
  uint32_t i_len;
};

struct tk_sym {
  int32_t id;          /* current token id */
  int32_t prev, next;  /* neighbour symbols, -1 at the ends */
  int32_t len;         /* bytes covered; 0 once merged away */
};

/* A candidate merge of the symbol at `pos` with its right neighbour; it is
 * stale once either symbol's id changed (ids only ever grow into longer
 * strings, so equal ids mean the same pair). */
struct tk_heap_ent {
  int32_t rank, pos, left, right, result;
};

struct tk_state {
  const struct tk_tokenizer *tok;
  char *norm, *norm2;      /* normalized segment scratch (two for chained Replace) */
  size_t norm_cap, norm2_cap; /* bytes */
  struct tk_sym *syms; /* BPE symbols scratch */
  size_t syms_cap;
  struct tk_heap_ent *heap;
  size_t heap_cap;
  /* word cache: open addressing, cleared wholesale when full */
  struct tk_cache_ent *cache; /* (TK_CACHE_SLOTS); the two pools share its allocation */
  uint32_t cache_used;
  char *cache_words;       /* word bytes pool */
  uint32_t cw_len, cw_cap;
  int32_t *cache_ids;      /* id pool */
  uint32_t ci_len, ci_cap;
};

#define TK_CACHE_SLOTS 16384u    /* power of two */
#define TK_CACHE_MAX_WORD 96     /* bytes; longer words are not cached */

uint64_t tk_hash(const char *s, size_t len);
/* A vocab slot's tag: 24 bits of the hash and the length (capped at 255),
 * so most mismatches are rejected without touching the strings. */
static inline uint32_t tk_vtag(uint64_t hash, size_t len) {
  return (uint32_t)(hash >> 40) << 8 | (uint32_t)(len < 255 ? len : 255);
}
int32_t tk_vocab_get(const struct tk_tokenizer *tok, const char *s, size_t len);
const struct tk_merge *tk_merge_get(const struct tk_tokenizer *tok, int32_t a, int32_t b);

/* Runs the BPE model on one pre-tokenized word; appends ids. */
int tk_bpe_word(struct tk_state *st, const char *w, size_t len, int32_t **ids,
                    size_t *n_ids, size_t *cap);
/* Appends the text of token `id` after the decoder's Replace steps to a
 * growable buffer (not NUL terminated). */
int tk_piece_append(const struct tk_tokenizer *tok, int32_t id, char **buf, size_t *len,
                        size_t *cap);
/* Appends a run of byte-fallback bytes as the ByteFallback decoder does: as
 * is when the whole run is valid UTF-8, else one U+FFFD per byte. */
int tk_bytes_append(const uint8_t *run, size_t n, char **buf, size_t *len, size_t *cap);
int tk_buf_put(char **buf, size_t *len, size_t *cap, const char *s, size_t n);
int tk_ids_push(int32_t **ids, size_t *n_ids, size_t *cap, int32_t id);

#endif
