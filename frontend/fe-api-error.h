/* fe-api-error.h — the OpenAI error envelope every error response carries:
 *
 *   {"error":{"message":"...","type":"BadRequestError","param":"top_p","code":400}}
 *
 * `type` follows vLLM's names for the status class and `code` is the HTTP
 * status as a number (what vLLM answers, e.g. 404 for an unknown model);
 * `param` is the offending request field or null. */
#ifndef LMSERVE_FE_API_ERROR_H
#define LMSERVE_FE_API_ERROR_H
#include "frontend/fe-http-buf.h"

/* The error type name for an HTTP status ("BadRequestError" for 400). */
const char *fe_api_error_type(int status);

/* Appends the envelope; `param` may be NULL (written as null). Returns 0 or
 * the buffer's error. */
int fe_api_error_body(struct fe_buf *b, int status, const char *message, const char *param);

#endif
