/* tk-detok.h — incremental (streaming) detokenization, one object per request.
 *
 * Ids are pushed one at a time as the model produces them; each push returns
 * only text that is final: the concatenation of every piece (and the flush)
 * equals tk_decode() of all ids with the same skip_special. Text is never
 * cut inside a UTF-8 character: a run of byte-fallback tokens (<0xE4><0xB8>
 * <0xAD> for "中") is held back until a token that is not a byte ends it,
 * because Hugging Face's ByteFallback decoder judges the whole run at once
 * (valid UTF-8: its bytes; otherwise one U+FFFD per byte) — emitting part of
 * a run early could disagree with the final decode.
 *
 * No allocation in steady state: the object keeps its buffers and reuses
 * them; a piece stays valid until the next push / flush / reset. */
#ifndef LMSERVE_TK_DETOK_H
#define LMSERVE_TK_DETOK_H
#include <stddef.h>
#include <stdint.h>

struct tk_tokenizer;
struct tk_detok;

int tk_detok_create(const struct tk_tokenizer *tok, int skip_special, struct tk_detok **out);
void tk_detok_free(struct tk_detok *d);
/* Starts a new stream with the same settings (keeps the buffers). */
void tk_detok_reset(struct tk_detok *d);

/* Feeds one id. *piece / *len receive the newly final text (possibly empty,
 * NUL terminated). Returns 0, CM_ERR_RANGE for an invalid id, CM_ERR_NOMEM. */
int tk_detok_push(struct tk_detok *d, int32_t id, const char **piece, size_t *len);
/* Ends the stream: returns whatever was held back. */
int tk_detok_flush(struct tk_detok *d, const char **piece, size_t *len);
/* Bytes currently held back (a pending byte-fallback run). */
size_t tk_detok_pending(const struct tk_detok *d);

#endif
