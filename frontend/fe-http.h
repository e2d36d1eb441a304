/* fe-http.h — an HTTP/1.1 request parser that allocates nothing.
 *
 * fe_http_parse_request() reads one request head (request line + header
 * fields) from the caller's buffer and fills a struct whose pointers point
 * into that buffer: the buffer must outlive the struct. It is incremental:
 * on a partial head it returns CM_ERR_AGAIN and the caller calls again with
 * more bytes (the whole head from its start). It is pipelining-safe: it
 * consumes exactly the head, and the body is delimited exactly by
 * Content-Length or by the chunked decoder below, so the bytes after one
 * request are the start of the next.
 *
 * It is strict where leniency lets requests be smuggled: both Content-Length
 * and Transfer-Encoding, an invalid or repeated Content-Length, a transfer
 * coding other than "chunked", obs-fold, a bare CR, whitespace before the
 * colon and control bytes in a field are all errors. A line may end in CRLF
 * or a lone LF (RFC 9112 §2.2 lets recipients accept the latter). */
#ifndef LMSERVE_FE_HTTP_H
#define LMSERVE_FE_HTTP_H
#include <stddef.h>
#include <stdint.h>

struct fe_http_header {
  const char *name;  /* points into the caller's buffer; not NUL-terminated */
  size_t name_len;   /* bytes */
  const char *value; /* surrounding whitespace trimmed */
  size_t value_len;  /* bytes */
};

struct fe_http_request {
  const char *method;
  size_t method_len;
  const char *target; /* request-target as sent, e.g. "/v1/models?x=1" */
  size_t target_len;
  const char *path; /* target up to '?', no query */
  size_t path_len;
  int minor_version;              /* HTTP/1.<minor_version>: 0 or 1 */
  struct fe_http_header *headers; /* the caller's array */
  size_t n_headers;
  /* derived from the headers */
  int64_t content_length; /* bytes; -1 when absent */
  int chunked;            /* Transfer-Encoding: chunked */
  int keep_alive;         /* 1.1 default on, 1.0 default off, Connection overrides */
  int expect_continue;    /* Expect: 100-continue */
  size_t head_len;        /* bytes of the head, through the empty line */
  const char *error;      /* static text naming the problem when parsing failed */
};

/* Parses the head at buf[0..len). `headers` has room for max_headers
 * entries. Returns the head's length in bytes (> 0) when complete,
 * CM_ERR_AGAIN when more bytes are needed, CM_ERR_TOOBIG when there are
 * more than max_headers fields, CM_ERR_UNSUPPORTED for a transfer coding or
 * HTTP version we do not speak (501/505), or CM_ERR_PARSE for a malformed
 * head (400); req->error says why. */
int fe_http_parse_request(const char *buf, size_t len, struct fe_http_request *req,
                          struct fe_http_header *headers, size_t max_headers);

/* Case-insensitive lookup; returns the first header named `name` or NULL. */
const struct fe_http_header *fe_http_find_header(const struct fe_http_request *req,
                                                 const char *name);

/* Case-insensitive comparison of a counted string with a C string. */
int fe_http_str_eq_nocase(const char *s, size_t n, const char *lit);

/* ---- chunked transfer coding ------------------------------------------ */

/* Limits on the parts of a chunked body that are not data. */
#define FE_HTTP_CHUNK_LINE_MAX 4096u /* bytes: size line with extensions */
#define FE_HTTP_TRAILER_MAX    8192u /* bytes: all trailer fields together */

struct fe_http_chunked {
  int state;          /* internal */
  int saw_digit;      /* internal */
  uint64_t remaining; /* bytes of the current chunk's data still to come */
  size_t line_len;    /* bytes of the current size or trailer line so far */
  size_t trailer_len; /* bytes of trailers so far */
  uint64_t total;     /* bytes of data decoded so far */
  int done;           /* 1 once the last chunk and trailers are consumed */
  const char *error;  /* static text naming the problem after an error */
};

void fe_http_chunked_init(struct fe_http_chunked *d);

/* Decodes in[0..n). Data bytes are copied (memmove) to out, which may
 * alias the input as long as out <= in: output never overtakes input. This
 * call writes at most out_cap data bytes (pass the room left under the body
 * limit); *out_len receives the number written.
 * Returns the number of input bytes consumed (stopping right after the
 * final CRLF once d->done is set, so what follows is the next request), or
 * CM_ERR_PARSE for a malformed body, CM_ERR_TOOBIG when the data would pass
 * out_cap or a size line or the trailers pass their limits. A chunk whose
 * declared size passes out_cap is refused while its size line is read, as
 * soon as the digits say so: the caller never waits for its data. */
int64_t fe_http_chunked_decode(struct fe_http_chunked *d, const char *in, size_t n, char *out,
                               size_t out_cap, size_t *out_len);

/* The reason phrase of a status code ("Not Found"); "Unknown" if unlisted. */
const char *fe_http_status_text(int status);

#endif
