/* tk-detok.c — streaming detokenization (see tk-detok.h). It mirrors
 * tk_decode() step for step, but returns the text as it becomes final. */
#include "tokenizer/tk-detok.h"

#include <stdlib.h>

#include "common/cm-err.h"
#include "tokenizer/tk-impl.h"

struct tk_detok {
  const struct tk_tokenizer *tok;
  int skip_special;
  int first;        /* no token emitted yet (for the decoder-less " " join) */
  char *out;        /* the piece returned by the last call */
  size_t out_len, out_cap; /* bytes */
  char *run;        /* pending byte-fallback bytes */
  size_t run_len, run_cap; /* bytes */
};

int tk_detok_create(const struct tk_tokenizer *tok, int skip_special, struct tk_detok **out) {
  struct tk_detok *d = calloc(1, sizeof *d);
  if (!d) return CM_ERR_NOMEM;
  d->tok = tok;
  d->skip_special = skip_special;
  /* room for typical pieces and runs up front: steady state never grows */
  d->out_cap = 256;
  d->run_cap = 64;
  d->out = malloc(d->out_cap);
  d->run = malloc(d->run_cap);
  if (!d->out || !d->run) {
    tk_detok_free(d);
    return CM_ERR_NOMEM;
  }
  tk_detok_reset(d);
  *out = d;
  return 0;
}

void tk_detok_free(struct tk_detok *d) {
  if (!d) return;
  free(d->out);
  free(d->run);
  free(d);
}

void tk_detok_reset(struct tk_detok *d) {
  d->first = 1;
  d->out_len = 0;
  d->run_len = 0;
  d->out[0] = 0;
}

size_t tk_detok_pending(const struct tk_detok *d) { return d->run_len; }

static int flush_run(struct tk_detok *d) {
  if (!d->run_len) return 0;
  int rc = tk_bytes_append((const uint8_t *)d->run, d->run_len, &d->out, &d->out_len,
                               &d->out_cap);
  d->run_len = 0;
  return rc;
}

int tk_detok_push(struct tk_detok *d, int32_t id, const char **piece, size_t *len) {
  const struct tk_tokenizer *tok = d->tok;
  int rc = 0;
  d->out_len = 0;
  d->out[0] = 0;
  *piece = d->out;
  *len = 0;
  if (id < 0 || id >= tok->n_ids) return CM_ERR_RANGE;
  if (d->skip_special && (tok->tok_flags[id] & TK_TOKF_SPECIAL)) return 0;
  if (!tok->has_decoder) {
    if (!d->first) rc = tk_buf_put(&d->out, &d->out_len, &d->out_cap, " ", 1);
    if (!rc)
      rc = tk_buf_put(&d->out, &d->out_len, &d->out_cap, tok->blob + tok->tok_off[id],
                          tok->tok_len[id]);
    d->first = 0;
  } else if (tok->dec_byte_fallback && tok->byte_of[id] >= 0) {
    char b = (char)tok->byte_of[id];
    rc = tk_buf_put(&d->run, &d->run_len, &d->run_cap, &b, 1);
  } else {
    rc = flush_run(d);
    if (!rc) rc = tk_piece_append(tok, id, &d->out, &d->out_len, &d->out_cap);
  }
  *piece = d->out;
  *len = d->out_len;
  return rc;
}

int tk_detok_flush(struct tk_detok *d, const char **piece, size_t *len) {
  d->out_len = 0;
  d->out[0] = 0;
  int rc = flush_run(d);
  *piece = d->out;
  *len = d->out_len;
  return rc;
}
