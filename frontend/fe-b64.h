/* fe-b64.h — standard-alphabet base64 payloads (image data: URLs, input_audio
 * data) decoded with the checks and messages both share. */
#ifndef LMSERVE_FE_B64_H
#define LMSERVE_FE_B64_H
#include <stddef.h>
#include <stdint.h>

/* Decodes p[0..len) ('=' padding optional, completing a multiple of 4 when
 * present) into *out (malloc'd, *n bytes; the caller frees it). what names the
 * payload in the messages ("image", "audio data"). The decoded size is known
 * before anything is decoded: over max_bytes is CM_ERR_TOOBIG; an empty
 * payload, a bad character (named with its offset), bad padding or a character
 * left over is CM_ERR_INVAL, with a sentence in err. */
int fe_b64_decode(const unsigned char *p, size_t len, size_t max_bytes, const char *what,
                  uint8_t **out, size_t *n, char *err, size_t errlen);

/* Encodes p[0..len) with '=' padding into *out (malloc'd, NUL-terminated, *n
 * characters; the caller frees it). CM_ERR_NOMEM, or 0. */
int fe_b64_encode(const uint8_t *p, size_t len, char **out, size_t *n);

#endif
