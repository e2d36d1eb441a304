/* fe-server.h — the frontend's HTTP/1.1 server on a libuv loop.
 *
 * It accepts connections, reads each into a per-connection buffer, parses
 * requests with fe-http.h (keep-alive and pipelining: one request is handed
 * out at a time per connection, responses go back in order), enforces the
 * limits below, and answers protocol errors itself with the OpenAI error
 * envelope (400, 408, 413, 431, 501, 503 while draining or over the
 * connection limit, 505).
 *
 * The handler gets each complete request (head + decoded body) and answers
 * it, now or later, with exactly one of fe_conn_respond*() or with
 * fe_conn_stream_begin() ... fe_conn_stream_end(). The request's pointers
 * (headers, body) are valid only during the callback: copy what you keep.
 * The fe_conn pointer stays valid until the answer is finished, even when
 * the client goes away: then the abort callback fires once, further writes
 * return CM_ERR_CLOSED, and the handler must still finish the answer (which
 * releases the connection).
 *
 * Writes are queued in two reused buffers per connection. Past
 * write_high_water queued bytes the server stops reading from the
 * connection; past write_hard_limit it gives up on the slow reader: closes
 * the connection and fires the abort callback.
 *
 * With fe_server_set_tls the server speaks HTTPS instead (fe-tls.h): the
 * same requests, answers and limits, the handshake counted in the header
 * timeout. */
#ifndef LMSERVE_FE_SERVER_H
#define LMSERVE_FE_SERVER_H
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "frontend/fe-http.h"

struct fe_server;
struct fe_conn;

struct fe_server_limits {
  size_t max_header_bytes;    /* bytes of a request head; more is 431 */
  size_t max_headers;         /* header fields per request; more is 431 */
  size_t max_body_bytes;      /* bytes of a decoded body; more is 413 */
  uint32_t header_timeout_ms; /* from a request's first byte to its full head; 408 */
  uint32_t body_timeout_ms;   /* longest wait between two reads of a body (408), and
                                 longest write stall while over write_high_water */
  uint32_t idle_timeout_ms;   /* keep-alive: idle connection is closed after this */
  int max_connections;        /* more are answered 503 and closed */
  size_t write_high_water;    /* bytes queued: stop reading the connection */
  size_t write_hard_limit;    /* bytes queued: close the slow reader */
};

/* Defaults: 16 KiB head, 100 fields, 32 MiB body, 10 s head, 30 s body,
 * 5 s idle, 4096 connections, 256 KiB high water, 16 MiB hard limit. */
void fe_server_limits_default(struct fe_server_limits *l);

typedef void (*fe_server_request_cb)(void *ud, struct fe_conn *c, const struct fe_http_request *req,
                                     const char *body, size_t body_len);

/* Creates a server on `loop` and binds host:port (port 0 picks a free one;
 * fe_server_port tells which). Returns 0 or a negative cm_err; logs why. */
int fe_server_create(uv_loop_t *loop, const char *host, int port,
                     const struct fe_server_limits *limits, fe_server_request_cb cb, void *ud,
                     struct fe_server **out);
int fe_server_port(const struct fe_server *s);
struct fe_tls;
/* Serves HTTPS from now on: connections accepted after the call speak TLS
 * (fe-tls.h). The server takes `tls` and destroys it with itself. */
void fe_server_set_tls(struct fe_server *s, struct fe_tls *tls);
/* A log line (cm-log's info level; debug for /health, /ping and /metrics) for each
 * request answered, as uvicorn's access log and llama.cpp's server write them:
 *   127.0.0.1:50422 "POST /v1/chat/completions HTTP/1.1" 200 0.534 s 1234 bytes
 * (the body's bytes; a stream's time runs to its end). On by default. */
void fe_server_set_access_log(struct fe_server *s, int on);
/* Stops accepting work: idle connections close, new requests get 503 with
 * Connection: close; requests in progress go on. */
void fe_server_drain(struct fe_server *s);
int fe_server_draining(const struct fe_server *s);
/* Requests handed to the handler and not yet finished. */
int fe_server_busy(const struct fe_server *s);
int fe_server_connections(const struct fe_server *s);
/* Connections with answer bytes still queued (not yet handed to the kernel). */
int fe_server_writing(const struct fe_server *s);
/* Closes the listener and every connection (aborting requests in
 * progress), then frees the server once libuv has closed every handle:
 * run the loop after this. */
void fe_server_destroy(struct fe_server *s);

/* ---- answering a request ------------------------------------------------ */

/* A complete response with a Content-Length body (copied). `extra_headers`
 * is NULL or "Name: value\r\n" lines. Returns 0 or CM_ERR_CLOSED. The body
 * is left out (its length kept) when the request was HEAD. */
int fe_conn_respond(struct fe_conn *c, int status, const char *content_type,
                    const char *extra_headers, const char *body, size_t len);
/* An error response: OpenAI's envelope (see fe-api-error.h), or Anthropic's for a
 * request the router marked (fe_conn_set_anthropic). */
int fe_conn_respond_error(struct fe_conn *c, int status, const char *message, const char *param);
/* The same with extra header lines, e.g. "Retry-After: 1\r\n" on a 429. */
int fe_conn_respond_error_hdr(struct fe_conn *c, int status, const char *message, const char *param,
                              const char *extra_headers);
/* Starts a streamed response: chunked on HTTP/1.1, delimited by closing the
 * connection on HTTP/1.0. */
int fe_conn_stream_begin(struct fe_conn *c, int status, const char *content_type,
                         const char *extra_headers);
/* Queues data of a streamed response. Returns 0, or CM_ERR_CLOSED when the
 * client is gone (or was closed as a slow reader). */
int fe_conn_stream_write(struct fe_conn *c, const char *data, size_t len);
/* Ends a streamed response (and releases the connection to the server). */
int fe_conn_stream_end(struct fe_conn *c);

/* Header lines ("Name: value\r\n" each) that the answer to the request in hand
 * carries, whichever fe_conn_respond* or fe_conn_stream_begin gives it (the
 * router's CORS headers). Copied; CM_ERR_TOOBIG past FE_CONN_HEADERS_MAX - 1
 * bytes. */
#define FE_CONN_HEADERS_MAX 1024
int fe_conn_set_headers(struct fe_conn *c, const char *lines);
/* The same, after those already set. */
int fe_conn_add_headers(struct fe_conn *c, const char *lines);

/* The request in hand is Anthropic's Messages API's: its errors carry that API's
 * envelope (fe_api_anthropic_error_body). For that request only. */
void fe_conn_set_anthropic(struct fe_conn *c);

/* The callback fires at most once, when the client disconnects (or is
 * dropped as a slow reader) before the answer is finished. */
void fe_conn_set_abort_cb(struct fe_conn *c, void (*cb)(void *ud), void *ud);
int fe_conn_closed(const struct fe_conn *c);
size_t fe_conn_write_queued(const struct fe_conn *c); /* bytes */

#endif
