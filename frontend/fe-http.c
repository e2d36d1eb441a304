/* fe-http.c — the HTTP/1.1 request-head parser and the chunked body decoder
 * (see fe-http.h for the contract). Nothing here allocates; every pointer
 * handed out points into the caller's buffer. */
#include "frontend/fe-http.h"

#include <string.h>

#include "common/cm-err.h"
#include "common/cm-hex.h"

/* ---- character classes (RFC 9110 §5.6.2) ------------------------------ */

static int is_tchar(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return 1;
  return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* field-value bytes: HTAB, SP, VCHAR, obs-text */
static int is_field_byte(unsigned char c) {
  return c == '\t' || (c >= 0x20 && c != 0x7f);
}

static unsigned char lower(unsigned char c) {
  return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

int fe_http_str_eq_nocase(const char *s, size_t n, const char *lit) {
  size_t m = strlen(lit);
  if (n != m) return 0;
  for (size_t i = 0; i < n; i++)
    if (lower((unsigned char)s[i]) != lower((unsigned char)lit[i])) return 0;
  return 1;
}

const struct fe_http_header *fe_http_find_header(const struct fe_http_request *req,
                                                 const char *name) {
  for (size_t i = 0; i < req->n_headers; i++)
    if (fe_http_str_eq_nocase(req->headers[i].name, req->headers[i].name_len, name))
      return &req->headers[i];
  return NULL;
}

/* Finds the line starting at buf[pos]. Sets [*start, *start + *n) to the
 * line without its CRLF / LF and *next to the byte after the LF. Returns 0,
 * CM_ERR_AGAIN when no LF is there yet, CM_ERR_PARSE for a bare CR. */
static int next_line(const char *buf, size_t len, size_t pos, size_t *start, size_t *n,
                     size_t *next, const char **why) {
  const char *lf = memchr(buf + pos, '\n', len - pos);
  size_t end = lf ? (size_t)(lf - buf) : len;
  const char *cr = memchr(buf + pos, '\r', end - pos);
  if (cr) {
    size_t at = (size_t)(cr - buf);
    if (at + 1 < end || (at + 1 == end && !lf)) {
      if (at + 1 == len) return CM_ERR_AGAIN; /* CR is the last byte so far */
      *why = "bare CR in the request head";
      return CM_ERR_PARSE;
    }
  }
  if (!lf) return CM_ERR_AGAIN;
  *start = pos;
  *n = end - pos - (cr ? 1 : 0);
  *next = end + 1;
  return 0;
}

static int parse_request_line(const char *line, size_t n, struct fe_http_request *req) {
  size_t i = 0;
  while (i < n && is_tchar((unsigned char)line[i]))
    i++;
  if (i == 0 || i >= n || line[i] != ' ') {
    req->error = "malformed request line (method)";
    return CM_ERR_PARSE;
  }
  req->method = line;
  req->method_len = i;
  size_t t0 = ++i;
  while (i < n && (unsigned char)line[i] > 0x20 && (unsigned char)line[i] < 0x7f)
    i++;
  if (i == t0 || i >= n || line[i] != ' ') {
    req->error = "malformed request line (target)";
    return CM_ERR_PARSE;
  }
  req->target = line + t0;
  req->target_len = i - t0;
  const char *q = memchr(req->target, '?', req->target_len);
  req->path = req->target;
  req->path_len = q ? (size_t)(q - req->target) : req->target_len;
  i++;
  if (n - i != 8 || memcmp(line + i, "HTTP/", 5) != 0 || line[i + 6] != '.' || line[i + 5] < '0' ||
      line[i + 5] > '9' || line[i + 7] < '0' || line[i + 7] > '9') {
    req->error = "malformed request line (version)";
    return CM_ERR_PARSE;
  }
  if (line[i + 5] != '1' || line[i + 7] > '1') {
    req->error = "HTTP version not supported";
    return CM_ERR_UNSUPPORTED;
  }
  req->minor_version = line[i + 7] - '0';
  return 0;
}

/* Content-Length: 1*DIGIT, nothing else (no sign, no list). */
static int parse_content_length(const char *v, size_t n, int64_t *out) {
  if (n == 0 || n > 18) return CM_ERR_PARSE; /* 18 digits cannot overflow int64 */
  int64_t x = 0;
  for (size_t i = 0; i < n; i++) {
    if (v[i] < '0' || v[i] > '9') return CM_ERR_PARSE;
    x = x * 10 + (v[i] - '0');
  }
  *out = x;
  return 0;
}

/* Scans a comma-separated Connection value for "close" and "keep-alive". */
static void scan_connection(const char *v, size_t n, int *close_, int *keep) {
  size_t i = 0;
  while (i < n) {
    while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
      i++;
    size_t s = i;
    while (i < n && v[i] != ',' && v[i] != ' ' && v[i] != '\t')
      i++;
    if (fe_http_str_eq_nocase(v + s, i - s, "close")) *close_ = 1;
    if (fe_http_str_eq_nocase(v + s, i - s, "keep-alive")) *keep = 1;
  }
}

/* Checks one header field's meaning; updates the derived request fields. */
static int apply_header(struct fe_http_request *req, const struct fe_http_header *h, int *seen_cl,
                        int *seen_te, int *n_host, int *conn_close, int *conn_keep) {
  if (fe_http_str_eq_nocase(h->name, h->name_len, "content-length")) {
    if (*seen_cl) {
      req->error = "duplicate Content-Length";
      return CM_ERR_PARSE;
    }
    *seen_cl = 1;
    if (parse_content_length(h->value, h->value_len, &req->content_length) != 0) {
      req->error = "invalid Content-Length";
      return CM_ERR_PARSE;
    }
  } else if (fe_http_str_eq_nocase(h->name, h->name_len, "transfer-encoding")) {
    if (*seen_te) {
      req->error = "repeated Transfer-Encoding";
      return CM_ERR_PARSE;
    }
    *seen_te = 1;
    if (!fe_http_str_eq_nocase(h->value, h->value_len, "chunked")) {
      req->error = "unsupported transfer coding (only chunked is accepted)";
      return CM_ERR_UNSUPPORTED;
    }
    req->chunked = 1;
  } else if (fe_http_str_eq_nocase(h->name, h->name_len, "host")) {
    if (++*n_host > 1) {
      req->error = "more than one Host header";
      return CM_ERR_PARSE;
    }
  } else if (fe_http_str_eq_nocase(h->name, h->name_len, "connection")) {
    scan_connection(h->value, h->value_len, conn_close, conn_keep);
  } else if (fe_http_str_eq_nocase(h->name, h->name_len, "expect")) {
    if (fe_http_str_eq_nocase(h->value, h->value_len, "100-continue")) req->expect_continue = 1;
  }
  return 0;
}

int fe_http_parse_request(const char *buf, size_t len, struct fe_http_request *req,
                          struct fe_http_header *headers, size_t max_headers) {
  memset(req, 0, sizeof(*req));
  req->headers = headers;
  req->content_length = -1;
  size_t pos = 0, s, n, next;
  int rc;
  /* RFC 9112 §2.2: ignore empty lines before the request line (a client
   * may send a stray CRLF after a body). */
  for (;;) {
    if ((rc = next_line(buf, len, pos, &s, &n, &next, &req->error)) != 0) return rc;
    if (n != 0) break;
    pos = next;
  }
  if ((rc = parse_request_line(buf + s, n, req)) != 0) return rc;
  pos = next;
  int seen_cl = 0, seen_te = 0, n_host = 0, conn_close = 0, conn_keep = 0;
  for (;;) {
    if ((rc = next_line(buf, len, pos, &s, &n, &next, &req->error)) != 0) return rc;
    pos = next;
    if (n == 0) break;
    const char *line = buf + s;
    if (line[0] == ' ' || line[0] == '\t') {
      req->error = "obsolete line folding in a header";
      return CM_ERR_PARSE;
    }
    size_t i = 0;
    while (i < n && is_tchar((unsigned char)line[i]))
      i++;
    if (i == 0 || i >= n || line[i] != ':') {
      req->error = "malformed header field name";
      return CM_ERR_PARSE;
    }
    if (req->n_headers == max_headers) {
      req->error = "too many header fields";
      return CM_ERR_TOOBIG;
    }
    struct fe_http_header *h = &headers[req->n_headers];
    h->name = line;
    h->name_len = i;
    i++;
    while (i < n && (line[i] == ' ' || line[i] == '\t'))
      i++;
    size_t v0 = i, vend = i;
    for (; i < n; i++) {
      unsigned char c = (unsigned char)line[i];
      if (!is_field_byte(c)) {
        req->error = "control character in a header value";
        return CM_ERR_PARSE;
      }
      if (c != ' ' && c != '\t') vend = i + 1;
    }
    h->value = line + v0;
    h->value_len = vend - v0;
    req->n_headers++;
    if ((rc = apply_header(req, h, &seen_cl, &seen_te, &n_host, &conn_close, &conn_keep)) != 0)
      return rc;
  }
  if (seen_cl && seen_te) {
    req->error = "both Content-Length and Transfer-Encoding";
    return CM_ERR_PARSE;
  }
  if (seen_te && req->minor_version == 0) {
    req->error = "Transfer-Encoding in an HTTP/1.0 request";
    return CM_ERR_PARSE;
  }
  if (req->minor_version == 1 && n_host == 0) {
    req->error = "missing Host header";
    return CM_ERR_PARSE;
  }
  req->keep_alive = req->minor_version == 1 ? !conn_close : (conn_keep && !conn_close);
  req->head_len = pos;
  return (int)pos;
}

/* ---- chunked transfer coding (RFC 9112 §7.1) --------------------------- */

enum {
  CK_SIZE,         /* hex digits of the chunk size */
  CK_EXT,          /* chunk extensions up to the line end */
  CK_SIZE_CR,      /* CR seen on the size line, LF must follow */
  CK_DATA,         /* chunk data */
  CK_DATA_CR,      /* CRLF after the data */
  CK_DATA_LF,      /* LF after the data's CR */
  CK_TRAILER,      /* start of a trailer line (or the final empty line) */
  CK_TRAILER_LINE, /* inside a trailer field */
  CK_TRAILER_CR,   /* CR inside a trailer line, LF must follow */
  CK_END_CR,       /* CR of the final empty line */
};

#define CK_SIZE_MAX ((uint64_t)1 << 62) /* bytes; larger sizes are rejected */

void fe_http_chunked_init(struct fe_http_chunked *d) {
  memset(d, 0, sizeof(*d));
  d->state = CK_SIZE;
}

static int64_t ck_fail(struct fe_http_chunked *d, const char *why, int err) {
  d->error = why;
  return err;
}

/* Called at the LF that ends a size line. */
static void ck_size_line_done(struct fe_http_chunked *d) {
  d->line_len = 0;
  d->saw_digit = 0;
  d->state = d->remaining == 0 ? CK_TRAILER : CK_DATA;
}

int64_t fe_http_chunked_decode(struct fe_http_chunked *d, const char *in, size_t n, char *out,
                               size_t out_cap, size_t *out_len) {
  size_t i = 0, w = 0;
  *out_len = 0;
  while (i < n && !d->done) {
    unsigned char c = (unsigned char)in[i];
    int trailer = d->state == CK_TRAILER || d->state == CK_TRAILER_LINE;
    switch (d->state) {
    case CK_SIZE: {
      int h = cm_hex_digit(c);
      if (h >= 0) {
        if (d->remaining >= CK_SIZE_MAX >> 4)
          return ck_fail(d, "chunk size too large", CM_ERR_TOOBIG);
        d->remaining = d->remaining << 4 | (uint64_t)h;
        d->saw_digit = 1;
        /* more digits only make it larger: a chunk that cannot fit under
         * the limit is refused now, not after its bytes were waited for */
        if (d->remaining > (uint64_t)(out_cap - w))
          return ck_fail(d, "chunk size exceeds the body size limit", CM_ERR_TOOBIG);
      } else if (!d->saw_digit) {
        return ck_fail(d, "invalid chunk size", CM_ERR_PARSE);
      } else if (c == ';' || c == ' ' || c == '\t') {
        d->state = CK_EXT;
      } else if (c == '\r') {
        d->state = CK_SIZE_CR;
      } else if (c == '\n') {
        ck_size_line_done(d);
      } else {
        return ck_fail(d, "invalid chunk size", CM_ERR_PARSE);
      }
      if (d->state != CK_DATA && d->state != CK_TRAILER && ++d->line_len > FE_HTTP_CHUNK_LINE_MAX)
        return ck_fail(d, "chunk size line too long", CM_ERR_TOOBIG);
      break;
    }
    case CK_EXT:
      if (c == '\r')
        d->state = CK_SIZE_CR;
      else if (c == '\n')
        ck_size_line_done(d);
      else if (!is_field_byte(c))
        return ck_fail(d, "control character in a chunk extension", CM_ERR_PARSE);
      else if (++d->line_len > FE_HTTP_CHUNK_LINE_MAX)
        return ck_fail(d, "chunk size line too long", CM_ERR_TOOBIG);
      break;
    case CK_SIZE_CR:
      if (c != '\n') return ck_fail(d, "bare CR in a chunk size line", CM_ERR_PARSE);
      ck_size_line_done(d);
      break;
    case CK_DATA: {
      size_t k = n - i;
      if ((uint64_t)k > d->remaining) k = (size_t)d->remaining;
      if (w + k > out_cap) return ck_fail(d, "chunked body too large", CM_ERR_TOOBIG);
      memmove(out + w, in + i, k);
      w += k;
      i += k;
      d->total += k;
      d->remaining -= k;
      *out_len = w;
      if (d->remaining == 0) d->state = CK_DATA_CR;
      continue; /* consumed k bytes */
    }
    case CK_DATA_CR:
      if (c == '\r')
        d->state = CK_DATA_LF;
      else if (c == '\n')
        d->state = CK_SIZE;
      else
        return ck_fail(d, "missing CRLF after chunk data", CM_ERR_PARSE);
      break;
    case CK_DATA_LF:
      if (c != '\n') return ck_fail(d, "missing LF after chunk data", CM_ERR_PARSE);
      d->state = CK_SIZE;
      break;
    case CK_TRAILER:
      if (c == '\r')
        d->state = CK_END_CR;
      else if (c == '\n')
        d->done = 1;
      else if (c == ' ' || c == '\t' || !is_field_byte(c))
        return ck_fail(d, "malformed trailer field", CM_ERR_PARSE);
      else
        d->state = CK_TRAILER_LINE;
      break;
    case CK_TRAILER_LINE:
      if (c == '\r')
        d->state = CK_TRAILER_CR;
      else if (c == '\n')
        d->state = CK_TRAILER;
      else if (!is_field_byte(c))
        return ck_fail(d, "control character in a trailer", CM_ERR_PARSE);
      break;
    case CK_TRAILER_CR:
      if (c != '\n') return ck_fail(d, "bare CR in a trailer", CM_ERR_PARSE);
      d->state = CK_TRAILER;
      break;
    case CK_END_CR:
      if (c != '\n') return ck_fail(d, "bare CR after the last chunk", CM_ERR_PARSE);
      d->done = 1;
      break;
    default: return ck_fail(d, "decoder in a bad state", CM_ERR_STATE);
    }
    /* the byte was one of the state's; trailer lines count against their cap */
    if (trailer && ++d->trailer_len > FE_HTTP_TRAILER_MAX)
      return ck_fail(d, "trailers too large", CM_ERR_TOOBIG);
    i++;
  }
  return (int64_t)i;
}

/* ---- status codes ------------------------------------------------------ */

const char *fe_http_status_text(int status) {
  switch (status) {
  case 100: return "Continue";
  case 200: return "OK";
  case 204: return "No Content";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 408: return "Request Timeout";
  case 411: return "Length Required";
  case 413: return "Content Too Large";
  case 414: return "URI Too Long";
  case 415: return "Unsupported Media Type";
  case 422: return "Unprocessable Content";
  case 429: return "Too Many Requests";
  case 431: return "Request Header Fields Too Large";
  case 500: return "Internal Server Error";
  case 501: return "Not Implemented";
  case 503: return "Service Unavailable";
  case 505: return "HTTP Version Not Supported";
  default: return "Unknown";
  }
}
