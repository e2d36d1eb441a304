/* fe-multipart.h — multipart/form-data bodies (RFC 7578), as the OpenAI audio
 * endpoints take them: each part's name, filename, content type and data,
 * as pointers into the caller's body. Nothing is allocated or copied.
 *
 *   struct fe_form_part parts[FE_FORM_MAX_PARTS];
 *   size_t n;
 *   if (fe_multipart_parse(ctype, ctype_len, body, len, parts, FE_FORM_MAX_PARTS, &n,
 *                          err, sizeof err) == 0) ... parts[0..n) ...
 *
 * The boundary comes from the Content-Type header's `boundary` parameter
 * (a token or a quoted string, 1..70 characters). Parts are delimited by
 * CRLF "--" boundary; the preamble before the first delimiter and the epilogue
 * after the closing one are ignored. Each part's headers end at its first
 * CRLF CRLF; Content-Disposition must be form-data with a name. A part's data
 * runs to the next delimiter, so it may hold any bytes, CR and LF included.
 *
 * Errors (CM_ERR_INVAL, one sentence in err for the client): not
 * multipart/form-data, no or a bad boundary, no closing delimiter, a part
 * without headers' end, a part without a Content-Disposition name, more than
 * max parts (CM_ERR_TOOBIG). */
#ifndef LMSERVE_FE_MULTIPART_H
#define LMSERVE_FE_MULTIPART_H
#include <stddef.h>

#define FE_FORM_MAX_PARTS 32

struct fe_form_part {
  const char *name; /* the field's name (not NUL-terminated); never NULL */
  size_t name_len;
  const char *filename; /* the filename parameter, or NULL when the part has none */
  size_t filename_len;
  const char *ctype; /* the part's Content-Type value, or NULL */
  size_t ctype_len;
  const char *data; /* the part's bytes */
  size_t len;
};

int fe_multipart_parse(const char *ctype, size_t ctype_len, const char *body, size_t len,
                       struct fe_form_part *parts, size_t max, size_t *n, char *err, size_t errlen);

/* The first part named `name`, or NULL. */
const struct fe_form_part *fe_form_find(const struct fe_form_part *parts, size_t n,
                                        const char *name);

#endif
