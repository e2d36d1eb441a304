/* fe-api-error.c — builds the OpenAI error envelope (see fe-api-error.h). */
#include "frontend/fe-api-error.h"

#include <string.h>

const char *fe_api_error_type(int status) {
  switch (status) {
  case 400: return "BadRequestError";
  case 401: return "AuthenticationError";
  case 403: return "PermissionDeniedError";
  case 404: return "NotFoundError";
  case 405: return "MethodNotAllowedError";
  case 408: return "RequestTimeoutError";
  case 413: return "RequestTooLargeError";
  case 422: return "UnprocessableEntityError";
  case 429: return "RateLimitError";
  case 431: return "RequestHeaderFieldsTooLargeError";
  case 501: return "NotImplementedError";
  case 503: return "ServiceUnavailableError";
  case 505: return "HTTPVersionNotSupportedError";
  default: return status >= 500 ? "InternalServerError" : "BadRequestError";
  }
}

int fe_api_error_body(struct fe_buf *b, int status, const char *message, const char *param) {
  fe_buf_puts(b, "{\"error\":{\"message\":");
  fe_buf_json_str(b, message, strlen(message));
  fe_buf_puts(b, ",\"type\":\"");
  fe_buf_puts(b, fe_api_error_type(status));
  fe_buf_puts(b, "\",\"param\":");
  if (param)
    fe_buf_json_str(b, param, strlen(param));
  else
    fe_buf_puts(b, "null");
  fe_buf_puts(b, ",\"code\":");
  fe_buf_i64(b, status);
  return fe_buf_puts(b, "}}");
}
