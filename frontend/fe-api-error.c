/* fe-api-error.c — builds the OpenAI error envelope (see fe-api-error.h). */
#include "frontend/fe-api-error.h"

#include <stdio.h>
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

/* ---- the field a JSON syntax error is in ---------------------------------- */

#define JP_MAX_DEPTH 32 /* deeper values are not named */

struct jp_frame {
  int is_obj;
  const char *key; /* objects: the current key, raw (points into the body) */
  size_t key_len;  /* bytes */
  size_t index;    /* arrays: the current element */
};

static int jp_is_name(const char *s, size_t n) {
  if (n == 0 || !((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z') || s[0] == '_'))
    return 0;
  for (size_t i = 1; i < n; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
          (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
      return 0;
  return 1;
}

/* The path of the innermost value: names joined with '.', array indices
 * only where a named field follows them. 0 when nothing is named. */
static int jp_path(const struct jp_frame *f, int depth, char *out, size_t size) {
  size_t o = 0, mark = 0; /* mark: the end of the last named part */
  out[0] = 0;
  for (int k = 0; k < depth; k++) {
    int n;
    if (f[k].is_obj) {
      if (!jp_is_name(f[k].key, f[k].key_len)) break;
      n = snprintf(out + o, size - o, "%s%.*s", o ? "." : "", (int)f[k].key_len, f[k].key);
    } else {
      n = snprintf(out + o, size - o, "[%zu]", f[k].index);
    }
    if (n < 0 || (size_t)n >= size - o) break; /* too long: name what fits */
    o += (size_t)n;
    if (f[k].is_obj) mark = o;
  }
  out[mark] = 0;
  return mark > 0;
}

/* The end of the token at body[s]: past the closing quote of a string (or
 * the body's end when unterminated), else past the run of characters a
 * number or literal is made of (at least one byte). */
static size_t jp_token_end(const char *b, size_t len, size_t s) {
  size_t i = s + 1;
  if (b[s] == '"') {
    while (i < len && b[i] != '"')
      i += b[i] == '\\' ? 2 : 1;
    return i < len ? i + 1 : len;
  }
  while (i < len && (b[i] == '+' || b[i] == '-' || b[i] == '.' || (b[i] >= '0' && b[i] <= '9') ||
                     (b[i] >= 'a' && b[i] <= 'z') || (b[i] >= 'A' && b[i] <= 'Z')))
    i++;
  return i;
}

int fe_api_json_error_param(const char *b, size_t len, size_t pos, char *param, size_t size) {
  enum { VALUE, VALUE_OR_END, KEY, KEY_OR_END, COLON, AFTER } st = VALUE;
  struct jp_frame f[JP_MAX_DEPTH];
  int depth = 0;
  if (size == 0 || pos == 0) return 0;
  if (pos > len) pos = len;
  size_t i = 0, at = pos - 1; /* the byte Jansson stopped at */
  while (i < pos) {
    char c = b[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      i++;
      continue;
    }
    switch (st) {
    case VALUE_OR_END:
      if (c == ']') { /* closed empty, as AFTER closes it */
        st = AFTER;
        continue;
      }
      st = VALUE;
      /* fallthrough */
    case VALUE:
      if (c == '{' || c == '[') {
        if (depth == JP_MAX_DEPTH) return 0;
        f[depth] = (struct jp_frame){c == '{', NULL, 0, 0};
        depth++;
        i++;
        st = c == '{' ? KEY_OR_END : VALUE_OR_END;
        continue;
      } else {
        size_t e = jp_token_end(b, len, i);
        if (at >= i && at <= e) return depth > 0 && jp_path(f, depth, param, size);
        i = e;
        st = AFTER;
        continue;
      }
    case KEY_OR_END:
      if (c == '}') { /* closed empty, as AFTER closes it */
        st = AFTER;
        continue;
      }
      /* fallthrough */
    case KEY:
      if (c != '"') return 0;
      {
        size_t e = jp_token_end(b, len, i);
        if (e < i + 2 || b[e - 1] != '"') return 0;
        f[depth - 1].key = b + i + 1;
        f[depth - 1].key_len = e - i - 2;
        i = e;
        st = COLON;
      }
      continue;
    case COLON:
      if (c != ':') return 0;
      i++;
      st = VALUE;
      continue;
    case AFTER:
      if (depth == 0) return 0;
      if (c == ',') {
        i++;
        if (f[depth - 1].is_obj) {
          st = KEY;
        } else {
          f[depth - 1].index++;
          st = VALUE;
        }
        continue;
      }
      if (c != (f[depth - 1].is_obj ? '}' : ']')) return 0;
      depth--;
      i++;
      continue;
    }
  }
  return 0;
}

/* ---- Anthropic's envelope ---------------------------------------------------- */

const char *fe_api_anthropic_error_type(int status) {
  switch (status) {
  case 401: return "authentication_error";
  case 403: return "permission_error";
  case 404: return "not_found_error";
  case 413: return "request_too_large";
  case 429: return "rate_limit_error";
  case 503:
  case 529: return "overloaded_error";
  default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

int fe_api_anthropic_error_body(struct fe_buf *b, int status, const char *message) {
  fe_buf_puts(b, "{\"type\":\"error\",\"error\":{\"type\":\"");
  fe_buf_puts(b, fe_api_anthropic_error_type(status));
  fe_buf_puts(b, "\",\"message\":");
  fe_buf_json_str(b, message, strlen(message));
  return fe_buf_puts(b, "}}");
}
