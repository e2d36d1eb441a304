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

/* Anthropic's envelope (POST /v1/messages): {"type":"error","error":{"type":
 * "invalid_request_error","message":"..."}}, the type by status as Anthropic's API
 * names them (400 and other 4xx invalid_request_error, 401 authentication_error, 403
 * permission_error, 404 not_found_error, 413 request_too_large, 429 rate_limit_error,
 * 503 and 529 overloaded_error, other 5xx api_error). */
const char *fe_api_anthropic_error_type(int status);
int fe_api_anthropic_error_body(struct fe_buf *b, int status, const char *message);

/* Locates the value a JSON syntax error lies in. `pos` is the byte offset
 * Jansson's json_error_t.position gives for body[0..len). When the error is
 * inside one value (a number too large for its type, NaN or Infinity, a bad
 * literal, a broken string), writes that value's field path to `param` the
 * way validation errors name fields ("seed", "messages[1].content",
 * "stream_options.include_usage"; positions inside arrays of token ids and
 * keys that are not names, such as logit_bias's token ids, name the field
 * that holds them) and returns 1. Otherwise (the error is in the structure,
 * or the value is the body itself) returns 0. */
int fe_api_json_error_param(const char *body, size_t len, size_t pos, char *param, size_t size);

#endif
