/* fe-server.c — the connections of the HTTP/1.1 server (see fe-server.h):
 * per-connection read buffers, request framing, limits and timeouts, the
 * write queue with backpressure, answering, and graceful close. Under TLS
 * (fe-tls.h) the ciphertext read is decrypted into the read buffer and the
 * write queue is encrypted on its way out; framing, limits and timeouts are
 * the same. The listener and the server's lifetime are in fe-server-listen.c. */
#include "frontend/fe-server.h"
#include "frontend/fe-server-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-log.h"
#include "common/cm-time.h"
#include "frontend/fe-api-error.h"
#include "frontend/fe-http-buf.h"

static void process(struct fe_conn *c);
static void conn_close(struct fe_conn *c, int abort_request);

/* ---- lifetime ------------------------------------------------------------ */

static void conn_maybe_free(struct fe_conn *c) {
  if (c->handles || c->busy) return;
  struct fe_server *s = c->srv;
  if (c->prev)
    c->prev->next = c->next;
  else
    s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  s->n_conns--;
  fe_buf_free(&c->pend);
  fe_buf_free(&c->fly);
  fe_buf_free(&c->tout);
  fe_buf_free(&c->alert);
  fe_tls_conn_destroy(c->tls);
  free(c->tin);
  free(c->rbuf);
  free(c->hdrs);
  free(c);
  fe_server__maybe_free(s);
}

static void on_handle_close(uv_handle_t *h) {
  struct fe_conn *c = h->data;
  c->handles--;
  conn_maybe_free(c);
}

static void conn_close(struct fe_conn *c, int abort_request) {
  if (c->closed) return;
  c->closed = 1;
  c->state = ST_CLOSING;
  if (c->busy && c->abort_cb && abort_request) {
    void (*cb)(void *) = c->abort_cb;
    c->abort_cb = NULL;
    cb(c->abort_ud);
  }
  uv_close((uv_handle_t *)&c->tcp, on_handle_close);
  uv_close((uv_handle_t *)&c->timer, on_handle_close);
  uv_close((uv_handle_t *)&c->wtimer, on_handle_close);
}

/* ---- timers ---------------------------------------------------------------- */

static void on_timer(uv_timer_t *t);

static void set_timer(struct fe_conn *c, enum timer_mode mode) {
  if (c->closed) return;
  uint64_t ms = 0;
  switch (mode) {
  case TM_IDLE: ms = c->srv->lim.idle_timeout_ms; break;
  case TM_HEAD: ms = c->srv->lim.header_timeout_ms; break;
  case TM_BODY: ms = c->srv->lim.body_timeout_ms; break;
  case TM_LINGER: ms = FE_LINGER_MS; break;
  case TM_NONE: break;
  }
  c->timer_mode = mode;
  uv_timer_stop(&c->timer);
  if (mode != TM_NONE) uv_timer_start(&c->timer, on_timer, ms, 0);
}

/* ---- writing --------------------------------------------------------------- */

static size_t queued(const struct fe_conn *c) {
  return c->pend.len + c->tout.len + c->fly.len;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);
static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf);

static void tls_pump(struct fe_conn *c);

static void start_reading(struct fe_conn *c) {
  if (c->reading || c->closed) return;
  if (c->state != ST_CLOSING && (queued(c) > c->srv->lim.write_high_water || c->rlen >= c->rcap))
    return;
  if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0) c->reading = 1;
  /* records read while rbuf was full still wait inside the TLS state */
  if (c->reading && c->tls && c->tls_done && c->state != ST_CLOSING && fe_tls_conn_pending(c->tls))
    tls_pump(c);
}

static void stop_reading(struct fe_conn *c) {
  if (!c->reading || c->closed) return;
  uv_read_stop((uv_stream_t *)&c->tcp);
  c->reading = 0;
}

static void on_shutdown(uv_shutdown_t *req, int status) {
  struct fe_conn *c = req->data;
  if (status < 0) conn_close(c, 1);
}

static void on_alert_write(uv_write_t *w, int status) {
  (void)w;
  (void)status; /* a client that went away misses only the close_notify */
}

/* Sends TLS close_notify ahead of the FIN, unless answer bytes are still
 * queued behind the write in flight (they would come after the alert). */
static void tls_close_notify(struct fe_conn *c) {
  if (!c->tls || !c->tls_done || c->pend.len || c->tout.len) return;
  fe_tls_conn_shutdown(c->tls);
  if (fe_tls_conn_take(c->tls, &c->alert) != 0 || !c->alert.len) return;
  uv_buf_t b = uv_buf_init(c->alert.data, (unsigned)c->alert.len);
  uv_write(&c->areq, (uv_stream_t *)&c->tcp, &b, 1, on_alert_write);
}

/* Sends FIN, then reads and discards until EOF or a short linger timer: an
 * immediate close with unread input would reset the connection and could
 * destroy the answer in flight. */
static void begin_close(struct fe_conn *c) {
  if (c->closed || c->shut) return;
  c->shut = 1;
  c->state = ST_CLOSING;
  c->sreq.data = c;
  tls_close_notify(c);
  if (uv_shutdown(&c->sreq, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
    conn_close(c, 1);
    return;
  }
  set_timer(c, TM_LINGER);
  start_reading(c);
}

static void flush(struct fe_conn *c);

static void on_write_stall(uv_timer_t *t) {
  struct fe_conn *c = t->data;
  cm_warn(TAG, "closing a connection that stopped reading its responses (%zu bytes queued)",
          queued(c));
  conn_close(c, 1);
}

/* Over high water, the client must keep reading: each write that completes
 * restarts the stall timer, and falling below high water stops it. */
static void watch_stall(struct fe_conn *c) {
  if (c->closed) return;
  if (queued(c) > c->srv->lim.write_high_water)
    uv_timer_start(&c->wtimer, on_write_stall, c->srv->lim.body_timeout_ms, 0);
  else
    uv_timer_stop(&c->wtimer);
}

static void on_write(uv_write_t *w, int status) {
  struct fe_conn *c = w->data;
  c->writing = 0;
  fe_buf_reset(&c->fly);
  if (c->fly.size > FE_KEEP_WBUF) fe_buf_free(&c->fly); /* a large answer went out */
  if (status < 0) {
    conn_close(c, 1);
    return;
  }
  flush(c);
  watch_stall(c);
  if (!c->closed && c->state != ST_CLOSING && !c->busy) process(c);
  if (!c->closed) start_reading(c);
}

/* Under TLS: encrypts the plaintext queued into `tout` (with whatever
 * handshake or alert records the TLS state has to send). Returns 0 or a
 * negative cm_err. */
static int tls_seal(struct fe_conn *c) {
  if (c->pend.len && c->tls_done) {
    int rc = fe_tls_conn_write(c->tls, c->pend.data, c->pend.len);
    if (rc) return rc;
    fe_buf_reset(&c->pend);
    if (c->pend.size > FE_KEEP_WBUF) fe_buf_free(&c->pend);
  }
  return fe_tls_conn_take(c->tls, &c->tout);
}

static void flush(struct fe_conn *c) {
  if (c->closed || c->writing) return;
  struct fe_buf *out = &c->pend; /* the bytes for the wire */
  if (c->tls) {
    if (tls_seal(c) != 0) {
      conn_close(c, 1);
      return;
    }
    out = &c->tout;
  }
  if (out->len) {
    uv_buf_t b = uv_buf_init(out->data, (unsigned)out->len);
    int n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    if (n < 0 && n != UV_EAGAIN) {
      conn_close(c, 1);
      return;
    }
    if (n > 0) {
      memmove(out->data, out->data + n, out->len - (size_t)n);
      out->len -= (size_t)n;
    }
  }
  if (out->len) {
    struct fe_buf t = c->fly;
    c->fly = *out;
    *out = t;
    fe_buf_reset(out);
    uv_buf_t b = uv_buf_init(c->fly.data, (unsigned)c->fly.len);
    c->wreq.data = c;
    if (uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &b, 1, on_write) != 0) {
      conn_close(c, 1);
      return;
    }
    c->writing = 1;
    if (!uv_is_active((uv_handle_t *)&c->wtimer)) watch_stall(c);
    return;
  }
  fe_buf_reset(out);
  if (out->size > FE_KEEP_WBUF) fe_buf_free(out);
  if (c->pend.len) return; /* under TLS, plaintext that waits for the handshake */
  if (c->close_after && !c->busy) begin_close(c);
}

/* Queues bytes. The hard limit is checked before appending, so one large
 * answer always fits (up to the buffer's own cap) and only answers piling
 * up behind a reader that does not read close the connection. */
static int queue(struct fe_conn *c, const char *p, size_t n) {
  if (c->closed) return CM_ERR_CLOSED;
  if (queued(c) > c->srv->lim.write_hard_limit) {
    cm_warn(TAG, "closing a connection that does not read its responses (%zu bytes queued)",
            queued(c));
    conn_close(c, 1);
    return CM_ERR_CLOSED;
  }
  if (fe_buf_append(&c->pend, p, n) != 0) {
    cm_warn(TAG, "closing a connection: an answer of %zu bytes does not fit its buffer", n);
    conn_close(c, 1);
    return CM_ERR_CLOSED;
  }
  if (queued(c) > c->srv->lim.write_high_water) {
    stop_reading(c);
    if (!uv_is_active((uv_handle_t *)&c->wtimer))
      uv_timer_start(&c->wtimer, on_write_stall, c->srv->lim.body_timeout_ms, 0);
  }
  return 0;
}

/* Appends a response head to the queue. content_length < 0: streamed. */
/* The Date header (RFC 9110 §6.6.1), rebuilt at most once a second. */
static const char *date_header(struct fe_server *s) {
  time_t now = time(NULL);
  if ((int64_t)now != s->date_s) {
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(s->date, sizeof(s->date), "Date: %a, %d %b %Y %H:%M:%S GMT\r\n", &tm);
    s->date_s = (int64_t)now;
  }
  return s->date;
}

static int write_head(struct fe_conn *c, int status, const char *ctype, const char *extra,
                      int64_t content_length) {
  char head[512];
  const char *conn_hdr = !c->keep_alive  ? "Connection: close\r\n"
                         : c->minor == 0 ? "Connection: keep-alive\r\n"
                                         : "";
  char len_hdr[64] = "";
  if (content_length >= 0)
    snprintf(len_hdr, sizeof(len_hdr), "Content-Length: %lld\r\n", (long long)content_length);
  else if (c->chunked_out)
    snprintf(len_hdr, sizeof(len_hdr), "Transfer-Encoding: chunked\r\n");
  int n = snprintf(head, sizeof(head),
                   "HTTP/1.1 %d %s\r\nServer: lmserve\r\n%sContent-Type: %s\r\n%s%s", status,
                   fe_http_status_text(status), date_header(c->srv),
                   ctype ? ctype : "application/json", len_hdr, conn_hdr);
  if (n < 0 || (size_t)n >= sizeof(head)) return CM_ERR_TOOBIG;
  int rc = queue(c, head, (size_t)n);
  if (!rc && c->busy && c->answer_hdrs[0]) rc = queue(c, c->answer_hdrs, strlen(c->answer_hdrs));
  if (!rc && extra) rc = queue(c, extra, strlen(extra));
  if (!rc) rc = queue(c, "\r\n", 2);
  return rc;
}

/* Answers a request the server rejects itself, then closes. */
static void error_close(struct fe_conn *c, int status, const char *msg) {
  struct fe_buf *b = &c->srv->scratch;
  fe_buf_reset(b);
  fe_api_error_body(b, status, msg, NULL);
  c->keep_alive = 0;
  c->close_after = 1;
  c->state = ST_CLOSING;
  set_timer(c, TM_NONE);
  if (write_head(c, status, "application/json", NULL, (int64_t)b->len) == 0)
    queue(c, b->data, b->len);
  if (c->srv->access_log) /* (no request the handler saw: its line is not known here) */
    cm_info(TAG, "%s \"-\" %d 0.000 s %zu bytes", c->peer, status, b->len);
  flush(c);
}

/* ---- reading and framing --------------------------------------------------- */

/* Makes room for a read in rbuf, doubling it up to rcap. */
static void grow_rbuf(struct fe_conn *c) {
  if (c->rsize - c->rlen < FE_READ_CHUNK && c->rsize < c->rcap) {
    size_t ns = c->rsize ? c->rsize * 2 : FE_READ_CHUNK;
    while (ns - c->rlen < FE_READ_CHUNK && ns < c->rcap)
      ns *= 2;
    if (ns > c->rcap) ns = c->rcap;
    char *p = realloc(c->rbuf, ns);
    if (p) {
      c->rbuf = p;
      c->rsize = ns;
      c->head_stale = 1; /* the head's pointers may point into the old block */
    }
  }
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  struct fe_conn *c = h->data;
  (void)hint;
  if (c->tls) { /* ciphertext: decrypted into rbuf by tls_pump */
    *buf = uv_buf_init(c->tin, FE_READ_CHUNK);
    return;
  }
  if (c->state == ST_CLOSING) c->rlen = 0; /* discarding */
  grow_rbuf(c);
  *buf = uv_buf_init(c->rbuf + c->rlen, (unsigned)(c->rsize - c->rlen));
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  struct fe_conn *c = st->data;
  if (nread == 0) return;
  if (nread == UV_ENOBUFS) { /* buffer full while the handler works */
    stop_reading(c);
    return;
  }
  if (nread < 0) { /* EOF or error: the client is gone */
    conn_close(c, 1);
    return;
  }
  if (c->state == ST_CLOSING) return; /* lingering: discard */
  if (c->tls) {
    if (fe_tls_conn_feed(c->tls, buf->base, (size_t)nread) != 0)
      conn_close(c, 1);
    else
      tls_pump(c);
    return;
  }
  c->rlen += (size_t)nread;
  if (c->state == ST_BODY_CL || c->state == ST_BODY_CHUNKED) set_timer(c, TM_BODY);
  if (c->rlen >= c->rcap) stop_reading(c);
  if (!c->busy) process(c);
}

/* The request in hand as the access log names it (c->what, c->quiet): its method,
 * path and version, the client's control bytes and quotes made harmless. */
static void access_what(struct fe_conn *c) {
  const struct fe_http_request *q = &c->req;
  static const char *const quiet[] = {"/health", "/ping", "/metrics"};
  c->quiet = 0;
  for (size_t i = 0; i < sizeof(quiet) / sizeof(quiet[0]); i++)
    c->quiet |= q->path_len == strlen(quiet[i]) && !memcmp(q->path, quiet[i], q->path_len);
  size_t o = 0, cap = sizeof(c->what) - 24;
  for (size_t i = 0; i < q->method_len && o < 16; i++)
    c->what[o++] = q->method[i] > 32 && q->method[i] < 127 ? q->method[i] : '?';
  c->what[o++] = ' ';
  for (size_t i = 0; i < q->path_len && o < cap; i++)
    c->what[o++] = q->path[i] > 32 && q->path[i] < 127 && q->path[i] != '"' ? q->path[i] : '?';
  snprintf(c->what + o, sizeof(c->what) - o, "%s HTTP/1.%d", o >= cap ? "..." : "", c->minor);
}

/* The access log's line of the request in hand (fe_server_set_access_log). */
static void access_line(struct fe_conn *c) {
  if (!c->srv->access_log) return;
  double s = (double)(cm_time_ns() - c->t0_ns) / 1e9;
  int status = c->status ? c->status : 499;
  cm_log(c->quiet ? CM_LOG_DEBUG : CM_LOG_INFO, TAG, "%s \"%s\" %d %.3f s %llu bytes", c->peer,
         c->what, status, s, (unsigned long long)c->bytes);
}

static void dispatch(struct fe_conn *c, const char *body, size_t len, size_t consumed) {
  if (c->head_stale) { /* the buffer grew while the body arrived: point into it again */
    int rc = fe_http_parse_request(c->rbuf, c->head_len, &c->req, c->hdrs, c->srv->lim.max_headers);
    CM_ASSERT(rc == (int)c->head_len);
    c->head_stale = 0;
  }
  c->consumed = consumed;
  c->state = ST_BUSY;
  c->busy = 1;
  c->streaming = 0;
  c->chunked_out = 0;
  c->head_only = c->req.method_len == 4 && memcmp(c->req.method, "HEAD", 4) == 0;
  c->answer_hdrs[0] = 0;
  c->anthropic = 0;
  c->t0_ns = cm_time_ns();
  c->status = 0;
  c->bytes = 0;
  if (c->srv->access_log) access_what(c);
  c->abort_cb = NULL;
  c->srv->n_busy++;
  set_timer(c, TM_NONE);
  c->srv->cb(c->srv->ud, c, &c->req, body, len);
}

static int parse_error_status(int rc) {
  switch (rc) {
  case CM_ERR_TOOBIG: return 431;
  case CM_ERR_UNSUPPORTED: return 501;
  default: return 400;
  }
}

static void start_body(struct fe_conn *c) {
  const struct fe_server_limits *l = &c->srv->lim;
  c->minor = c->req.minor_version;
  c->keep_alive = c->req.keep_alive;
  if (c->req.chunked) {
    c->state = ST_BODY_CHUNKED;
    fe_http_chunked_init(&c->ck);
    c->body_len = 0;
    c->scan = c->head_len;
  } else {
    int64_t cl = c->req.content_length < 0 ? 0 : c->req.content_length;
    if ((uint64_t)cl > l->max_body_bytes) {
      error_close(c, 413, "request body too large");
      return;
    }
    c->state = ST_BODY_CL;
    c->body_need = (size_t)cl;
  }
  int complete = c->state == ST_BODY_CL && c->rlen - c->head_len >= c->body_need;
  if (c->req.expect_continue && c->minor == 1 && !complete)
    if (queue(c, "HTTP/1.1 100 Continue\r\n\r\n", 25) == 0) flush(c);
  set_timer(c, TM_BODY);
}

/* Parses and hands out as many buffered requests as the connection's state
 * allows. */
static void process(struct fe_conn *c) {
  if (c->in_process) return;
  c->in_process = 1;
  const struct fe_server_limits *l = &c->srv->lim;
  /* a connection whose answers are not being read gets no new requests */
  while (!c->closed && !c->busy && c->state != ST_CLOSING && queued(c) <= l->write_high_water) {
    if (c->state == ST_HEAD) {
      if (c->rlen == 0) {
        if (c->srv->draining) {
          begin_close(c);
          break;
        }
        set_timer(c, TM_IDLE);
        break;
      }
      int rc = fe_http_parse_request(c->rbuf, c->rlen, &c->req, c->hdrs, l->max_headers);
      if (rc == CM_ERR_AGAIN) {
        if (c->rlen > l->max_header_bytes)
          error_close(c, 431, "request header fields too large");
        else if (c->timer_mode != TM_HEAD)
          set_timer(c, TM_HEAD);
        break;
      }
      if (rc < 0) {
        int st = parse_error_status(rc);
        if (rc == CM_ERR_UNSUPPORTED && c->req.error && strstr(c->req.error, "version")) st = 505;
        error_close(c, st, c->req.error ? c->req.error : "malformed request");
        break;
      }
      if ((size_t)rc > l->max_header_bytes) {
        error_close(c, 431, "request header fields too large");
        break;
      }
      c->head_len = (size_t)rc;
      c->head_stale = 0;
      if (c->srv->draining) {
        error_close(c, 503, "server is shutting down");
        break;
      }
      start_body(c);
      continue;
    }
    if (c->state == ST_BODY_CL) {
      if (c->rlen - c->head_len < c->body_need) break;
      dispatch(c, c->rbuf + c->head_len, c->body_need, c->head_len + c->body_need);
      continue;
    }
    if (c->state == ST_BODY_CHUNKED) {
      size_t got = 0;
      int64_t used = fe_http_chunked_decode(&c->ck, c->rbuf + c->scan, c->rlen - c->scan,
                                            c->rbuf + c->head_len + c->body_len,
                                            l->max_body_bytes - c->body_len, &got);
      if (used < 0) {
        error_close(c, used == CM_ERR_TOOBIG ? 413 : 400, c->ck.error);
        break;
      }
      c->body_len += got;
      c->scan += (size_t)used;
      if (c->ck.done) {
        dispatch(c, c->rbuf + c->head_len, c->body_len, c->scan);
        continue;
      }
      size_t dst = c->head_len + c->body_len; /* compact: drop the framing */
      memmove(c->rbuf + dst, c->rbuf + c->scan, c->rlen - c->scan);
      c->rlen -= c->scan - dst;
      c->scan = dst;
      break;
    }
    break;
  }
  c->in_process = 0;
}

/* ---- TLS ------------------------------------------------------------------- */

/* A failed handshake or a bad record: send the alert OpenSSL made, if any,
 * then close. A request in progress cannot be answered any more. */
static void tls_fail(struct fe_conn *c) {
  if (c->busy) {
    conn_close(c, 1);
    return;
  }
  c->keep_alive = 0;
  c->close_after = 1;
  c->state = ST_CLOSING;
  set_timer(c, TM_LINGER); /* closes even when the alert cannot be sent */
  flush(c);
}

/* Advances the handshake over the ciphertext fed so far, then decrypts what
 * it can into rbuf and frames requests as on_read does for plain bytes. The
 * handshake runs under the header timeout set at accept; ciphertext that
 * does not yet make a whole record turns an idle keep-alive connection's
 * timer into the header timeout, as a partial plain head does. */
static void tls_pump(struct fe_conn *c) {
  if (!c->tls_done) {
    int rc = fe_tls_conn_handshake(c->tls);
    if (rc < 0) {
      tls_fail(c);
      return;
    }
    flush(c); /* the handshake's records */
    if (rc == 0 || c->closed) return;
    c->tls_done = 1;
    if (c->tls_over_limit) {
      error_close(c, 503, "too many connections");
      return;
    }
  }
  size_t before = c->rlen;
  for (;;) {
    if (c->rlen >= c->rcap) {
      stop_reading(c);
      break;
    }
    grow_rbuf(c);
    if (c->rsize == c->rlen) break; /* out of memory: what is buffered goes first */
    long n = fe_tls_conn_read(c->tls, c->rbuf + c->rlen, c->rsize - c->rlen);
    if (n == 0) break;
    if (n < 0) {
      if (n == CM_ERR_CLOSED)
        conn_close(c, 1); /* close_notify: the client is gone, as on EOF */
      else
        tls_fail(c);
      return;
    }
    c->rlen += (size_t)n;
  }
  flush(c); /* records the TLS state sends on its own (session tickets) */
  if (c->closed) return;
  if (c->rlen > before) {
    if (c->state == ST_BODY_CL || c->state == ST_BODY_CHUNKED) set_timer(c, TM_BODY);
    if (!c->busy) process(c);
  } else if (!c->busy && c->state == ST_HEAD && c->timer_mode == TM_IDLE) {
    set_timer(c, TM_HEAD);
  }
}

/* The handler finished its answer: release the request's bytes and go on
 * with the next pipelined request. */
static void finish(struct fe_conn *c) {
  CM_ASSERT(c->busy);
  access_line(c);
  c->busy = 0;
  c->srv->n_busy--;
  c->abort_cb = NULL;
  if (c->closed) {
    conn_maybe_free(c);
    return;
  }
  memmove(c->rbuf, c->rbuf + c->consumed, c->rlen - c->consumed);
  c->rlen -= c->consumed;
  c->consumed = 0;
  c->state = ST_HEAD;
  /* give back what a large body needed, so idle connections stay small */
  if (c->rsize > 4 * FE_READ_CHUNK && c->rlen <= FE_READ_CHUNK) {
    char *p = realloc(c->rbuf, 2 * FE_READ_CHUNK);
    if (p) {
      c->rbuf = p;
      c->rsize = 2 * FE_READ_CHUNK;
    }
  }
  if (!c->keep_alive || c->srv->draining) {
    c->close_after = 1;
    c->state = ST_CLOSING;
  }
  flush(c);
  if (c->closed) return;
  if (c->state != ST_CLOSING) process(c);
  if (!c->closed) start_reading(c);
}

/* ---- answering ------------------------------------------------------------- */

int fe_conn_respond(struct fe_conn *c, int status, const char *content_type,
                    const char *extra_headers, const char *body, size_t len) {
  CM_ASSERT(c->busy && !c->streaming);
  int rc = CM_ERR_CLOSED;
  c->status = c->closed ? 499 : status; /* (nginx's: the client left before the answer) */
  c->bytes = c->closed || c->head_only ? 0 : len;
  if (!c->closed) {
    if (c->srv->draining) c->keep_alive = 0;
    rc = write_head(c, status, content_type, extra_headers, (int64_t)len);
    if (!rc && len && !c->head_only) rc = queue(c, body, len);
  }
  finish(c);
  return rc;
}

int fe_conn_respond_error_hdr(struct fe_conn *c, int status, const char *message, const char *param,
                              const char *extra_headers) {
  struct fe_buf *b = &c->srv->scratch;
  fe_buf_reset(b);
  if (c->anthropic)
    fe_api_anthropic_error_body(b, status, message);
  else
    fe_api_error_body(b, status, message, param);
  return fe_conn_respond(c, status, "application/json", extra_headers, b->data, b->len);
}

int fe_conn_respond_error(struct fe_conn *c, int status, const char *message, const char *param) {
  return fe_conn_respond_error_hdr(c, status, message, param, NULL);
}

int fe_conn_stream_begin(struct fe_conn *c, int status, const char *content_type,
                         const char *extra_headers) {
  CM_ASSERT(c->busy && !c->streaming);
  c->streaming = 1;
  c->status = c->closed ? 499 : status;
  if (c->closed) return CM_ERR_CLOSED;
  c->chunked_out = c->minor == 1;
  if (!c->chunked_out || c->srv->draining) c->keep_alive = 0;
  int rc = write_head(c, status, content_type, extra_headers, -1);
  if (!rc) flush(c);
  return c->closed ? CM_ERR_CLOSED : rc;
}

int fe_conn_stream_write(struct fe_conn *c, const char *data, size_t len) {
  CM_ASSERT(c->busy && c->streaming);
  if (c->closed) return CM_ERR_CLOSED;
  if (len == 0) return 0; /* an empty chunk would end the body */
  c->bytes += len;
  int rc = 0;
  if (c->chunked_out) {
    char size[24];
    int n = snprintf(size, sizeof(size), "%zx\r\n", len);
    rc = queue(c, size, (size_t)n);
    if (!rc) rc = queue(c, data, len);
    if (!rc) rc = queue(c, "\r\n", 2);
  } else {
    rc = queue(c, data, len);
  }
  if (!rc) flush(c);
  return c->closed ? CM_ERR_CLOSED : rc;
}

int fe_conn_stream_end(struct fe_conn *c) {
  CM_ASSERT(c->busy && c->streaming);
  int rc = CM_ERR_CLOSED;
  if (!c->closed) rc = c->chunked_out ? queue(c, "0\r\n\r\n", 5) : 0;
  c->streaming = 0;
  finish(c);
  return rc;
}

int fe_conn_add_headers(struct fe_conn *c, const char *lines) {
  size_t have = strlen(c->answer_hdrs), n = strlen(lines);
  if (have + n >= sizeof(c->answer_hdrs)) return CM_ERR_TOOBIG;
  memcpy(c->answer_hdrs + have, lines, n + 1);
  return 0;
}

void fe_conn_set_anthropic(struct fe_conn *c) {
  c->anthropic = 1;
}

int fe_conn_set_headers(struct fe_conn *c, const char *lines) {
  size_t n = strlen(lines);
  if (n >= sizeof(c->answer_hdrs)) return CM_ERR_TOOBIG;
  memcpy(c->answer_hdrs, lines, n + 1);
  return 0;
}

void fe_conn_set_abort_cb(struct fe_conn *c, void (*cb)(void *ud), void *ud) {
  c->abort_cb = cb;
  c->abort_ud = ud;
}

int fe_conn_closed(const struct fe_conn *c) {
  return c->closed;
}
size_t fe_conn_write_queued(const struct fe_conn *c) {
  return queued(c);
}

/* ---- timeouts and accepting -------------------------------------------------- */

static void on_timer(uv_timer_t *t) {
  struct fe_conn *c = t->data;
  switch (c->timer_mode) {
  case TM_IDLE:
    if (queued(c)) { /* still sending the last answer: not idle yet */
      set_timer(c, TM_IDLE);
      break;
    }
    conn_close(c, 0);
    break;
  case TM_LINGER: conn_close(c, 0); break;
  case TM_HEAD:
    if (c->rlen == 0)
      conn_close(c, 0); /* connected and sent nothing */
    else
      error_close(c, 408, "timed out reading the request head");
    break;
  case TM_BODY: error_close(c, 408, "timed out reading the request body"); break;
  case TM_NONE: break;
  }
}

/* Accepts one connection from the listener and starts reading it. */
void fe_conn__accept(struct fe_server *s, uv_stream_t *ls) {
  struct fe_conn *c = calloc(1, sizeof(*c));
  struct fe_http_header *h = calloc(s->lim.max_headers, sizeof(*h));
  if (!c || !h || uv_tcp_init(s->loop, &c->tcp) != 0) {
    cm_error(TAG, "out of memory accepting a connection");
    free(c);
    free(h);
    return;
  }
  c->srv = s;
  c->hdrs = h;
  c->handles = 1;
  c->tcp.data = c;
  uv_timer_init(s->loop, &c->timer);
  uv_timer_init(s->loop, &c->wtimer);
  c->timer.data = c;
  c->wtimer.data = c;
  c->handles = 3;
  c->rcap = s->lim.max_header_bytes + s->lim.max_body_bytes + 2 * FE_READ_CHUNK;
  c->keep_alive = 1;
  c->minor = 1;
  fe_buf_init(&c->pend, 0);
  fe_buf_init(&c->fly, 0);
  fe_buf_init(&c->tout, 0);
  fe_buf_init(&c->alert, 0);
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  s->n_conns++;
  if (uv_accept(ls, (uv_stream_t *)&c->tcp) != 0) {
    conn_close(c, 0);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  struct sockaddr_storage sa = {.ss_family = AF_UNSPEC};
  int sl = sizeof(sa);
  char ip[48] = "?";
  int port = 0;
  if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&sa, &sl) == 0) {
    if (sa.ss_family == AF_INET6) {
      uv_ip6_name((struct sockaddr_in6 *)&sa, ip, sizeof(ip));
      port = ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
    } else if (sa.ss_family == AF_INET) {
      uv_ip4_name((struct sockaddr_in *)&sa, ip, sizeof(ip));
      port = ntohs(((struct sockaddr_in *)&sa)->sin_port);
    }
  }
  snprintf(c->peer, sizeof(c->peer), sa.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", ip, port);
  if (s->tls) {
    if (fe_tls_conn_create(s->tls, &c->tls) != 0 || !(c->tin = malloc(FE_READ_CHUNK))) {
      cm_error(TAG, "out of memory accepting a TLS connection");
      conn_close(c, 0);
      return;
    }
    /* the 503 can only be sent once the handshake is done */
    c->tls_over_limit = s->n_conns > s->lim.max_connections;
  } else if (s->n_conns > s->lim.max_connections) {
    error_close(c, 503, "too many connections");
    return;
  }
  set_timer(c, TM_HEAD);
  start_reading(c);
}

void fe_conn__close(struct fe_conn *c, int abort_request) {
  conn_close(c, abort_request);
}
void fe_conn__begin_close(struct fe_conn *c) {
  begin_close(c);
}
