/* tk-load.h — internals shared by the two halves of the tokenizer.json
 * loader: tk-load.c (the file, vocab, merges) and tk-conf.c (the
 * small sections: normalizer, pre_tokenizer, post_processor, decoder,
 * model options, added tokens, derived tables). Not a public header. */
#ifndef LMSERVE_TK_LOAD_H
#define LMSERVE_TK_LOAD_H
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tk-impl.h"

/* A vocab entry as read, before the id arrays are sized. */
struct tk_ld_vocab {
  uint32_t off, len; /* the token's bytes in the blob */
  int32_t id;
};

struct tk_ld {
  struct tk_tokenizer *tok;
  char *err;
  size_t errlen;
  struct tk_ld_vocab *v; /* (n_v) */
  size_t n_v, cap_v;
};

/* Writes "tokenizer.json: <message>" to the caller's error buffer; returns code. */
int tk_ld_err(struct tk_ld *l, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Appends a NUL-terminated copy of s to the token blob; *off is its offset. */
int tk_blob_add(struct tk_tokenizer *tok, const char *s, size_t len, uint32_t *off);

/* Parses a small section with Jansson (NULL and *rc set on error). */
json_t *tk_ld_section(struct tk_ld *l, const char *s, size_t n, const char *name, int *rc);
int tk_ld_normalizer(struct tk_ld *l, json_t *n);
int tk_ld_pre_tokenizer(struct tk_ld *l, json_t *p);
int tk_ld_post_processor(struct tk_ld *l, json_t *p);
int tk_ld_decoder(struct tk_ld *l, json_t *d);
int tk_ld_model_opts(struct tk_ld *l, json_t *m);
/* The highest added id (first pass, to size the id tables). */
int tk_ld_added_max(struct tk_ld *l, json_t *arr, int32_t *max_id);
int tk_ld_added(struct tk_ld *l, json_t *arr);
/* Byte-fallback ids and the one-character table. */
int tk_ld_bytes(struct tk_tokenizer *tok);
/* The word-cut marker and its cross tokens. */
void tk_ld_cross(struct tk_tokenizer *tok);

#endif
