/* pr-zmq.c — sockets, send and receive of lmserve messages (see pr-zmq.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "proto/pr-zmq.h"

struct pr_sock {
  void *zs;          /* zmq socket */
  int type;          /* ZMQ_DEALER, ZMQ_ROUTER, ... */
  struct pr_buf buf; /* encode buffer, reused */
};

int pr_zmq_err(int e) {
  switch (e) {
  case 0: return CM_OK;
  case EAGAIN:
  case EINTR: return CM_ERR_AGAIN;
  case ETERM:
  case ENOTSOCK:
  case EHOSTUNREACH:
  case ENOTCONN: return CM_ERR_CLOSED;
  case ENOMEM: return CM_ERR_NOMEM;
  case EMSGSIZE: return CM_ERR_TOOBIG;
  case EINVAL:
  case EPROTONOSUPPORT:
  case ENOCOMPATPROTO: return CM_ERR_INVAL;
  case ENOENT:
  case EADDRNOTAVAIL:
  case ENODEV: return CM_ERR_NOENT;
  case EFSM: return CM_ERR_STATE;
  default: return CM_ERR_IO;
  }
}

int pr_sock_open(void *zmq_ctx, int zmq_type, size_t max_msg, struct pr_sock **out) {
  int rc = 0, zero = 0, one = 1;
  *out = NULL;
  if (!zmq_ctx) return CM_ERR_INVAL;
  struct pr_sock *s = calloc(1, sizeof(*s));
  if (!s) return CM_ERR_NOMEM;
  if (!max_msg) max_msg = PR_MAX_MSG_DEFAULT;
  if (max_msg > INT64_MAX) max_msg = INT64_MAX;
  int64_t maxsz = (int64_t)max_msg;
  pr_buf_init(&s->buf, max_msg);
  s->type = zmq_type;
  s->zs = zmq_socket(zmq_ctx, zmq_type);
  if (!s->zs) {
    int e = zmq_errno();
    cm_error("pr", "zmq_socket(%d): %s", zmq_type, zmq_strerror(e));
    rc = pr_zmq_err(e);
    goto fail;
  }
  PR_ZMQ_CHECK_GOTO(zmq_setsockopt(s->zs, ZMQ_LINGER, &zero, sizeof(zero)), rc, fail);
  PR_ZMQ_CHECK_GOTO(zmq_setsockopt(s->zs, ZMQ_MAXMSGSIZE, &maxsz, sizeof(maxsz)), rc, fail);
  if (zmq_type == ZMQ_ROUTER)
    PR_ZMQ_CHECK_GOTO(zmq_setsockopt(s->zs, ZMQ_ROUTER_MANDATORY, &one, sizeof(one)), rc, fail);
  *out = s;
  return 0;
fail:
  pr_sock_close(s);
  return rc;
}

void pr_sock_close(struct pr_sock *s) {
  if (!s) return;
  if (s->zs) zmq_close(s->zs);
  pr_buf_free(&s->buf);
  free(s);
}

int pr_sock_bind(struct pr_sock *s, const char *endpoint) {
  PR_ZMQ_CHECK(zmq_bind(s->zs, endpoint));
  return 0;
}

int pr_sock_connect(struct pr_sock *s, const char *endpoint) {
  PR_ZMQ_CHECK(zmq_connect(s->zs, endpoint));
  return 0;
}

int pr_sock_set_rid(struct pr_sock *s, const void *id, size_t len) {
  if (len == 0 || len > PR_RID_MAX) return CM_ERR_INVAL;
  PR_ZMQ_CHECK(zmq_setsockopt(s->zs, ZMQ_ROUTING_ID, id, len));
  return 0;
}

int pr_sock_set_timeouts(struct pr_sock *s, int recv_ms, int send_ms) {
  PR_ZMQ_CHECK(zmq_setsockopt(s->zs, ZMQ_RCVTIMEO, &recv_ms, sizeof(recv_ms)));
  PR_ZMQ_CHECK(zmq_setsockopt(s->zs, ZMQ_SNDTIMEO, &send_ms, sizeof(send_ms)));
  return 0;
}

void *pr_sock_zmq(struct pr_sock *s) {
  return s->zs;
}

int pr_sock_fd(struct pr_sock *s, int *fd) {
  size_t len = sizeof(*fd);
  PR_ZMQ_CHECK(zmq_getsockopt(s->zs, ZMQ_FD, fd, &len));
  return 0;
}

int pr_sock_events(struct pr_sock *s, int *events) {
  size_t len = sizeof(*events);
  PR_ZMQ_CHECK(zmq_getsockopt(s->zs, ZMQ_EVENTS, events, &len));
  return 0;
}

int pr_sock_send(struct pr_sock *s, const struct pr_rid *to, const struct pr_msg *m, int flags) {
  uint8_t hdr[PR_HDR_LEN];
  int rc = pr_msg_encode(m, &s->buf);
  if (rc) {
    cm_error("pr", "cannot encode %s: %s", pr_type_name(m->type), cm_strerror(rc));
    return rc;
  }
  pr_msg_header(m->type, hdr);
  if (s->type == ZMQ_ROUTER) {
    if (!to || to->len == 0) return CM_ERR_INVAL;
    PR_ZMQ_CHECK(zmq_send(s->zs, to->id, to->len, flags | ZMQ_SNDMORE));
  }
  /* ZeroMQ queues a multipart message atomically: once the first frame is
   * accepted the others are too, so a later EAGAIN cannot split it. */
  PR_ZMQ_CHECK(zmq_send(s->zs, hdr, sizeof(hdr), flags | ZMQ_SNDMORE));
  PR_ZMQ_CHECK(zmq_send(s->zs, s->buf.data ? (void *)s->buf.data : (void *)hdr, s->buf.len, flags));
  return 0;
}

/* Receives one frame into `f`; *more says whether more follow. */
static int recv_frame(void *zs, zmq_msg_t *f, int flags, int *more) {
  PR_ZMQ_CHECK(zmq_msg_recv(f, zs, flags));
  *more = zmq_msg_more(f);
  return 0;
}

int pr_sock_recv(struct pr_sock *s, struct pr_rid *from, struct pr_msg *out, struct cm_arena *arena,
                 int flags) {
  zmq_msg_t f[3]; /* [rid,] header, body */
  int nf = 0, more = 1, rc = 0, extra = 0;
  int want = s->type == ZMQ_ROUTER ? 3 : 2;
  for (int i = 0; i < 3; i++)
    zmq_msg_init(&f[i]);

  /* only the first frame may block or say "nothing yet": the others of a
   * multipart message are already here */
  if ((rc = recv_frame(s->zs, &f[0], flags, &more))) goto done;
  nf = 1;
  while (more) {
    if (nf < 3) {
      rc = recv_frame(s->zs, &f[nf], 0, &more);
      if (rc) goto done;
      nf++;
    } else {
      zmq_msg_t junk;
      zmq_msg_init(&junk);
      rc = recv_frame(s->zs, &junk, 0, &more);
      zmq_msg_close(&junk);
      if (rc) goto done;
      extra++;
    }
  }
  int i = 0;
  if (s->type == ZMQ_ROUTER) {
    size_t n = zmq_msg_size(&f[0]);
    if (from) {
      from->len = (uint8_t)(n <= PR_RID_MAX ? n : 0);
      if (from->len) memcpy(from->id, zmq_msg_data(&f[0]), n);
      /* ZMQ_SRCFD: the fd a monitor's DISCONNECTED event names (-1 for inproc). Asked
       * of a frame that came over the wire: the routing id frame the ROUTER makes
       * from a peer's ZMQ_ROUTING_ID carries none */
      from->fd = zmq_msg_get(&f[nf > 1 ? 1 : 0], ZMQ_SRCFD);
    }
    i = 1;
  }
  if (nf != want || extra) {
    cm_warn("pr", "refused a message of %d frames (want %d)", nf + extra, want);
    rc = CM_ERR_PARSE;
    goto done;
  }
  rc = pr_msg_decode(zmq_msg_data(&f[i]), zmq_msg_size(&f[i]), zmq_msg_data(&f[i + 1]),
                     zmq_msg_size(&f[i + 1]), arena, out);
  if (rc) cm_warn("pr", "refused a message: %s", cm_strerror(rc));
done:
  for (int j = 0; j < 3; j++)
    zmq_msg_close(&f[j]);
  return rc;
}

/* ---- connection events ------------------------------------------------------ */

int pr_monitor_open(void *zmq_ctx, struct pr_sock *s, int events, void **pair_out) {
  int rc = 0, zero = 0;
  *pair_out = NULL;
  char addr[64];
  snprintf(addr, sizeof(addr), "inproc://pr-monitor-%p", (void *)s);
  PR_ZMQ_CHECK(zmq_socket_monitor(s->zs, addr, events));
  void *pair = zmq_socket(zmq_ctx, ZMQ_PAIR);
  if (!pair) {
    int e = zmq_errno();
    cm_error("pr", "zmq_socket(PAIR): %s", zmq_strerror(e));
    rc = pr_zmq_err(e);
    goto fail;
  }
  PR_ZMQ_CHECK_GOTO(zmq_setsockopt(pair, ZMQ_LINGER, &zero, sizeof(zero)), rc, fail);
  PR_ZMQ_CHECK_GOTO(zmq_connect(pair, addr), rc, fail);
  *pair_out = pair;
  return 0;
fail:
  if (pair) zmq_close(pair);
  zmq_socket_monitor(s->zs, NULL, 0);
  return rc;
}

int pr_monitor_recv(void *pair, int *event, int *value) {
  /* frame 1: the event (u16) and its value (u32), in host order; frame 2: the
   * endpoint's address */
  zmq_msg_t f;
  zmq_msg_init(&f);
  if (zmq_msg_recv(&f, pair, ZMQ_DONTWAIT) < 0) {
    int e = zmq_errno();
    zmq_msg_close(&f);
    return pr_zmq_err(e);
  }
  int rc = CM_ERR_PARSE;
  if (zmq_msg_size(&f) == 6) {
    uint16_t ev;
    uint32_t val;
    memcpy(&ev, zmq_msg_data(&f), sizeof(ev));
    memcpy(&val, (const uint8_t *)zmq_msg_data(&f) + 2, sizeof(val));
    *event = ev;
    *value = (int)val;
    rc = 0;
  }
  while (zmq_msg_more(&f)) { /* the address, and anything a later ZeroMQ adds */
    zmq_msg_close(&f);
    zmq_msg_init(&f);
    if (zmq_msg_recv(&f, pair, 0) < 0) break;
  }
  zmq_msg_close(&f);
  return rc;
}

void pr_monitor_close(struct pr_sock *s, void *pair) {
  if (!pair) return;
  if (s && s->zs) zmq_socket_monitor(s->zs, NULL, 0);
  zmq_close(pair);
}
