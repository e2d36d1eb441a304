/* fe-stop.h — stop strings over streamed text, one object per request.
 *
 * Text arrives in pieces (from fe_detok); a stop string may straddle piece
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
#ifndef LMSERVE_FE_STOP_H
#define LMSERVE_FE_STOP_H
#include <stddef.h>

struct fe_stop;

/* Copies `n` stop strings (lens[i] bytes each, > 0). n may be 0. */
int fe_stop_create(const char *const *stops, const size_t *lens, size_t n, struct fe_stop **out);
void fe_stop_free(struct fe_stop *s);
void fe_stop_reset(struct fe_stop *s);

/* Feeds a piece. *out / *out_len: text to release (may be empty). *hit is
 * set to the index of the stop string found, or -1. After a hit every
 * further push releases nothing. */
int fe_stop_push(struct fe_stop *s, const char *piece, size_t len, const char **out,
                 size_t *out_len, int *hit);
/* End of stream without a stop: releases the held-back tail. */
int fe_stop_flush(struct fe_stop *s, const char **out, size_t *out_len);
/* Bytes held back right now. */
size_t fe_stop_pending(const struct fe_stop *s);
/* Longest stop string, in bytes (0 when none). */
size_t fe_stop_max_len(const struct fe_stop *s);

#endif
