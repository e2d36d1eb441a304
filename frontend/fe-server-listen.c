/* fe-server-listen.c — the HTTP server's listener and lifetime: limits,
 * binding, accepting, draining and destruction (see fe-server.h). */
#include <netdb.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-log.h"
#include "frontend/fe-server-impl.h"
#include "frontend/fe-server.h"

void fe_server_limits_default(struct fe_server_limits *l) {
  l->max_header_bytes = 16 << 10;
  l->max_headers = 100;
  l->max_body_bytes = 32 << 20;
  l->header_timeout_ms = 10000;
  l->body_timeout_ms = 30000;
  l->idle_timeout_ms = 5000;
  l->max_connections = 4096;
  l->write_high_water = 256 << 10;
  l->write_hard_limit = 16 << 20;
}

void fe_server__maybe_free(struct fe_server *s) {
  if (!s->destroying || s->n_conns || s->listener_open) return;
  fe_buf_free(&s->scratch);
  fe_tls_destroy(s->tls);
  free(s);
}

static void on_connection(uv_stream_t *ls, int status) {
  struct fe_server *s = ls->data;
  if (status < 0) {
    cm_warn(TAG, "accept failed: %s", uv_strerror(status));
    return;
  }
  fe_conn__accept(s, ls);
}

int fe_server_create(uv_loop_t *loop, const char *host, int port,
                     const struct fe_server_limits *limits, fe_server_request_cb cb, void *ud,
                     struct fe_server **out) {
  struct sockaddr_storage addr;
  if (uv_ip4_addr(host, port, (struct sockaddr_in *)&addr) != 0 &&
      uv_ip6_addr(host, port, (struct sockaddr_in6 *)&addr) != 0) {
    /* a name such as "localhost": its first address */
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int gai = getaddrinfo(host, NULL, &hints, &res);
    if (gai != 0 || !res || res->ai_addrlen > sizeof(addr)) {
      cm_error(TAG, "cannot resolve listen address '%s': %s", host,
               gai ? gai_strerror(gai) : "no address");
      if (res) freeaddrinfo(res);
      return CM_ERR_INVAL;
    }
    memcpy(&addr, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (addr.ss_family == AF_INET6)
      ((struct sockaddr_in6 *)&addr)->sin6_port = htons((uint16_t)port);
    else
      ((struct sockaddr_in *)&addr)->sin_port = htons((uint16_t)port);
  }
  struct fe_server *s = calloc(1, sizeof(*s));
  if (!s) return CM_ERR_NOMEM;
  s->loop = loop;
  s->lim = *limits;
  s->cb = cb;
  s->ud = ud;
  fe_buf_init(&s->scratch, 0);
  uv_tcp_init(loop, &s->listener);
  s->listener.data = s;
  s->listener_open = 1;
  int rc = uv_tcp_bind(&s->listener, (struct sockaddr *)&addr, 0);
  if (!rc) rc = uv_listen((uv_stream_t *)&s->listener, 1024, on_connection);
  if (rc) {
    cm_error(TAG, "cannot listen on %s:%d: %s", host, port, uv_strerror(rc));
    s->destroying = 1;
    fe_server_destroy(s);
    return CM_ERR_IO;
  }
  struct sockaddr_storage bound;
  int blen = sizeof(bound);
  uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &blen);
  s->port = bound.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&bound)->sin6_port)
                                        : ntohs(((struct sockaddr_in *)&bound)->sin_port);
  s->access_log = 1;
  *out = s;
  return 0;
}

int fe_server_port(const struct fe_server *s) {
  return s->port;
}
void fe_server_set_tls(struct fe_server *s, struct fe_tls *tls) {
  s->tls = tls;
}

int fe_server_draining(const struct fe_server *s) {
  return s->draining;
}
int fe_server_busy(const struct fe_server *s) {
  return s->n_busy;
}
int fe_server_connections(const struct fe_server *s) {
  return s->n_conns;
}

int fe_server_writing(const struct fe_server *s) {
  int n = 0;
  for (const struct fe_conn *c = s->conns; c; c = c->next)
    n += !c->closed && (c->pend.len || c->tout.len || c->fly.len);
  return n;
}

void fe_server_set_access_log(struct fe_server *s, int on) {
  s->access_log = on;
}

void fe_server_drain(struct fe_server *s) {
  s->draining = 1;
  for (struct fe_conn *c = s->conns, *n; c; c = n) {
    n = c->next;
    if (!c->busy && c->state == ST_HEAD && c->rlen == 0) fe_conn__begin_close(c);
  }
}

static void on_listener_close(uv_handle_t *h) {
  struct fe_server *s = h->data;
  s->listener_open = 0;
  fe_server__maybe_free(s);
}

void fe_server_destroy(struct fe_server *s) {
  s->destroying = 1;
  for (struct fe_conn *c = s->conns; c; c = c->next)
    fe_conn__close(c, 1);
  if (!uv_is_closing((uv_handle_t *)&s->listener))
    uv_close((uv_handle_t *)&s->listener, on_listener_close);
}
