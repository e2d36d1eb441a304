/* fe-server-impl.h — the insides of fe-server.h's server and connection,
 * shared by fe-server.c (connections) and fe-server-listen.c (listener,
 * lifetime). Nothing outside those two files includes it. */
#ifndef LMSERVE_FE_SERVER_IMPL_H
#define LMSERVE_FE_SERVER_IMPL_H
#include <stddef.h>
#include <uv.h>

#include "frontend/fe-http-buf.h"
#include "frontend/fe-http.h"
#include "frontend/fe-server.h"
#include "frontend/fe-tls.h"

#define TAG           "http"
#define FE_LINGER_MS  1000u             /* ms to drain a closing connection's input */
#define FE_READ_CHUNK 16384u            /* bytes: the least room offered to a read */
#define FE_KEEP_WBUF  ((size_t)1 << 20) /* bytes: larger write buffers are freed once empty */

enum conn_state {
  ST_HEAD,         /* reading a request head */
  ST_BODY_CL,      /* reading a Content-Length body */
  ST_BODY_CHUNKED, /* reading a chunked body */
  ST_BUSY,         /* the handler owns the request */
  ST_CLOSING,      /* answer sent, shutting down */
};

enum timer_mode { TM_NONE, TM_IDLE, TM_HEAD, TM_BODY, TM_LINGER };

struct fe_conn {
  uv_tcp_t tcp;
  uv_timer_t timer;  /* request and keep-alive timeouts */
  uv_timer_t wtimer; /* write stall: no progress while over high water */
  uv_write_t wreq;
  uv_shutdown_t sreq;
  struct fe_server *srv;
  struct fe_conn *prev, *next;

  char *rbuf;   /* bytes read and not yet consumed: [0, rlen) */
  size_t rlen;  /* bytes */
  size_t rsize; /* bytes allocated */
  size_t rcap;  /* bytes: the most rsize may grow to */

  enum conn_state state;
  struct fe_http_request req;
  struct fe_http_header *hdrs; /* (max_headers) */
  size_t head_len;             /* bytes of the current request's head */
  size_t body_need;            /* bytes of a Content-Length body */
  size_t body_len;             /* bytes of chunked body decoded so far */
  size_t scan;                 /* offset of the next undecoded chunked byte */
  size_t consumed;             /* bytes of rbuf the busy request occupies */
  struct fe_http_chunked ck;
  int minor, keep_alive;

  enum timer_mode timer_mode;
  int busy;        /* handed to the handler, answer not finished */
  int streaming;   /* a streamed answer has begun */
  int chunked_out; /* the streamed answer uses chunked coding */
  int head_only;   /* a HEAD request: the answer carries no body */
  char answer_hdrs[FE_CONN_HEADERS_MAX]; /* lines every answer to this request carries
                                            (fe_conn_set_headers): CORS */
  int anthropic;   /* errors in Anthropic's envelope (fe_conn_set_anthropic) */
  uint64_t t0_ns;  /* the request in hand: when it was handed to the handler */
  int status;      /* its answer's status (0: none yet) */
  uint64_t bytes;  /* its answer's body bytes */
  char peer[64];   /* "ADDR:PORT" of the client, for the access log */
  char what[300];  /* the request in hand's "METHOD PATH HTTP/1.x", made harmless */
  int quiet;       /* ... is a probe's (/health, /ping, /metrics): logged at debug level */
  int head_stale;  /* rbuf moved since the head was parsed: req's pointers are stale */
  int closed;      /* uv_close called */
  int close_after; /* close once the queued bytes are written */
  int handles;     /* open libuv handles */
  int reading;
  int in_process;
  int shut; /* uv_shutdown issued */
  void (*abort_cb)(void *ud);
  void *abort_ud;

  struct fe_buf pend; /* bytes queued, not yet handed to libuv (plaintext under TLS) */
  struct fe_buf fly;  /* bytes of the write in flight */
  int writing;

  /* TLS (NULL tls: plain HTTP). Reads land in `tin` and are decrypted into
   * rbuf; flush() encrypts `pend` into `tout`, which then goes out as
   * `pend` does without TLS. */
  struct fe_tls_conn *tls;
  char *tin;           /* (FE_READ_CHUNK) ciphertext of one read */
  struct fe_buf tout;  /* ciphertext queued, not yet handed to libuv */
  struct fe_buf alert; /* close_notify, written with areq */
  uv_write_t areq;
  int tls_done;       /* handshake complete */
  int tls_over_limit; /* over max_connections: answer 503 once the handshake is done */
};

struct fe_server {
  uv_loop_t *loop;
  uv_tcp_t listener;
  struct fe_server_limits lim;
  fe_server_request_cb cb;
  void *ud;
  struct fe_conn *conns;
  int n_conns, n_busy;
  int draining, destroying, listener_open;
  int port;
  struct fe_buf scratch; /* error bodies */
  char date[64];         /* "Date: ...\r\n" for the current second */
  int64_t date_s;        /* Unix second `date` was made for */
  struct fe_tls *tls;    /* NULL: plain HTTP; owned */
  int access_log;        /* a log line per request answered (fe_server_set_access_log) */
};

/* fe-server.c */
void fe_conn__accept(struct fe_server *s, uv_stream_t *listener);
void fe_conn__close(struct fe_conn *c, int abort_request);
void fe_conn__begin_close(struct fe_conn *c);
/* fe-server-listen.c: frees the server once destroyed and empty */
void fe_server__maybe_free(struct fe_server *s);

#endif
