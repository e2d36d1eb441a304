/* fe-tok-load.h — internals shared by the two halves of the tokenizer.json
 * loader: fe-tok-load.c (the file, vocab, merges) and fe-tok-conf.c (the
 * small sections: normalizer, pre_tokenizer, post_processor, decoder,
 * model options, added tokens, derived tables). Not a public header. */
#ifndef LMSERVE_FE_TOK_LOAD_H
#define LMSERVE_FE_TOK_LOAD_H
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "frontend/fe-tok-impl.h"

struct fe_tok_ld {
  struct fe_tok *tok;
  char *err;
  size_t errlen;
  /* vocab entries as read, before the id arrays are sized */
  uint32_t *v_off, *v_len;
  int32_t *v_id;
  size_t n_v, cap_v;
};

/* Writes "tokenizer.json: <message>" to the caller's error buffer; returns code. */
int fe_tok_ld_err(struct fe_tok_ld *l, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Appends a NUL-terminated copy of s to the token blob; *off is its offset. */
int fe_tok_blob_add(struct fe_tok *tok, const char *s, size_t len, uint32_t *off);

/* Parses a small section with Jansson (NULL and *rc set on error). */
json_t *fe_tok_ld_section(struct fe_tok_ld *l, const char *s, size_t n, const char *name, int *rc);
int fe_tok_ld_normalizer(struct fe_tok_ld *l, json_t *n);
int fe_tok_ld_pre_tokenizer(struct fe_tok_ld *l, json_t *p);
int fe_tok_ld_post_processor(struct fe_tok_ld *l, json_t *p);
int fe_tok_ld_decoder(struct fe_tok_ld *l, json_t *d);
int fe_tok_ld_model_opts(struct fe_tok_ld *l, json_t *m);
/* The highest added id (first pass, to size the id tables). */
int fe_tok_ld_added_max(struct fe_tok_ld *l, json_t *arr, int32_t *max_id);
int fe_tok_ld_added(struct fe_tok_ld *l, json_t *arr);
/* Byte-fallback ids and the one-character table. */
int fe_tok_ld_bytes(struct fe_tok *tok);
/* The word-cut marker and its cross tokens. */
void fe_tok_ld_cross(struct fe_tok *tok);

#endif
