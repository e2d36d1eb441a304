/* tk-stop.h — stop strings over streamed text, one object per request.
 *
 * Text arrives in pieces (from tk_detok); a stop string may straddle piece
 * boundaries. Each push returns the text that can be released now: all of
 * it except the longest tail that is still the beginning of some stop string
 * (so at most longest-stop − 1 bytes are held back, never part of a UTF-8
 * character, since the tail starts where a stop string's first character
 * would). When a stop string is found, the text before it is released, the
 * stop string and anything after it are dropped, and the matcher is done.
 * With several stop strings the one that starts first in the text wins
 * (the first listed on a tie).
 *
 * No allocation in steady state; returned text stays valid until the next
 * call on the object. */
#ifndef LMSERVE_TK_STOP_H
#define LMSERVE_TK_STOP_H
#include <stddef.h>

struct tk_stop;

/* Copies `n` stop strings (lens[i] bytes each, > 0). n may be 0. */
int tk_stop_create(const char *const *stops, const size_t *lens, size_t n, struct tk_stop **out);
void tk_stop_free(struct tk_stop *s);
void tk_stop_reset(struct tk_stop *s);

/* Feeds a piece. *out / *out_len: text to release (may be empty). *hit is
 * set to the index of the stop string found, or -1. After a hit every
 * further push releases nothing. */
int tk_stop_push(struct tk_stop *s, const char *piece, size_t len, const char **out,
                 size_t *out_len, int *hit);
/* End of stream without a stop: releases the held-back tail. */
int tk_stop_flush(struct tk_stop *s, const char **out, size_t *out_len);
/* Bytes held back right now. */
size_t tk_stop_pending(const struct tk_stop *s);
/* Longest stop string, in bytes (0 when none). */
size_t tk_stop_max_len(const struct tk_stop *s);

#endif
