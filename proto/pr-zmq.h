/* pr-zmq.h — ZeroMQ helpers: sockets with our options, sending and receiving
 * one lmserve message (pr-msg.h), endpoint naming, and the check macro that
 * turns zmq errors into cm_err codes where they happen.
 *
 *   void *ctx = zmq_ctx_new();
 *   struct pr_sock *s;
 *   if ((rc = pr_sock_open(ctx, ZMQ_DEALER, 0, &s))) ...
 *   pr_sock_connect(s, "ipc:///run/user/1000/lmserve/sched.sock");
 *   pr_sock_send(s, NULL, &msg, 0);
 *   rc = pr_sock_recv(s, NULL, &reply, &arena, PR_DONTWAIT);  // CM_ERR_AGAIN: nothing yet
 *
 * On the wire a message is [routing id (ROUTER side only)] + frame 0 (2 bytes:
 * type, version) + frame 1 (msgpack body). pr_sock_recv always consumes every
 * frame of a message, even when it refuses it, so one bad message never
 * desynchronises the stream. With libuv, poll pr_sock_fd() and drain while
 * pr_sock_events() says ZMQ_POLLIN: the fd is edge-triggered. */
#ifndef LMSERVE_PR_ZMQ_H
#define LMSERVE_PR_ZMQ_H
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "common/cm-log.h"
#include "proto/pr-msg.h"

/* zmq errno -> cm_err code (EAGAIN -> CM_ERR_AGAIN, ETERM -> CM_ERR_CLOSED, ...). */
int pr_zmq_err(int zmq_errno);

/* For a zmq call returning -1 on failure: logs file, line, call and zmq's
 * message, then returns the cm_err code from the enclosing function. The
 * expected conditions (EAGAIN, EINTR, EHOSTUNREACH: a ROUTER peer that left)
 * log at debug level only. The _GOTO form stores the code in `res` and jumps. */
#define PR_ZMQ_LOG_(call, e)                                                                       \
  do {                                                                                             \
    if ((e) != EAGAIN && (e) != EINTR && (e) != EHOSTUNREACH)                                      \
      cm_error("pr", "%s:%d: %s: %s", __FILE__, __LINE__, #call, zmq_strerror(e));                 \
    else                                                                                           \
      cm_debug("pr", "%s:%d: %s: %s", __FILE__, __LINE__, #call, zmq_strerror(e));                 \
  } while (0)
#define PR_ZMQ_CHECK(call)                                                                         \
  do {                                                                                             \
    if ((call) == -1) {                                                                            \
      int pr_ze_ = zmq_errno();                                                                    \
      PR_ZMQ_LOG_(call, pr_ze_);                                                                   \
      return pr_zmq_err(pr_ze_);                                                                   \
    }                                                                                              \
  } while (0)
#define PR_ZMQ_CHECK_GOTO(call, res, label)                                                        \
  do {                                                                                             \
    if ((call) == -1) {                                                                            \
      int pr_ze_ = zmq_errno();                                                                    \
      PR_ZMQ_LOG_(call, pr_ze_);                                                                   \
      (res) = pr_zmq_err(pr_ze_);                                                                  \
      goto label;                                                                                  \
    }                                                                                              \
  } while (0)

#define PR_DONTWAIT ZMQ_DONTWAIT
#define PR_RID_MAX  255 /* bytes; ZeroMQ's routing-id limit */

/* A ROUTER peer's routing id. */
struct pr_rid {
  uint8_t len; /* bytes, 1..PR_RID_MAX */
  uint8_t id[PR_RID_MAX];
  int32_t fd; /* receiving side: the file descriptor of the connection the message came on
               * (ipc://, tcp://), matched against pr_monitor_recv's; -1 = unknown. Not part
               * of the peer's identity: pr_sock_send ignores it */
};

struct pr_sock; /* opaque: a zmq socket plus its reusable encode buffer */

/* Opens a socket of `zmq_type` (ZMQ_DEALER, ZMQ_ROUTER, ZMQ_PUB, ...) with
 * ZMQ_LINGER 0, ZMQ_MAXMSGSIZE `max_msg` bytes (0 = PR_MAX_MSG_DEFAULT; also
 * caps what we encode) and, for ROUTER, ZMQ_ROUTER_MANDATORY. */
int pr_sock_open(void *zmq_ctx, int zmq_type, size_t max_msg, struct pr_sock **out);
void pr_sock_close(struct pr_sock *s); /* NULL is fine */
int pr_sock_bind(struct pr_sock *s, const char *endpoint);
int pr_sock_connect(struct pr_sock *s, const char *endpoint);
/* Sets ZMQ_ROUTING_ID (before connect), 1..PR_RID_MAX bytes. */
int pr_sock_set_rid(struct pr_sock *s, const void *id, size_t len);
/* Sets ZMQ_RCVTIMEO / ZMQ_SNDTIMEO in ms (-1 = block); a timeout gives CM_ERR_AGAIN. */
int pr_sock_set_timeouts(struct pr_sock *s, int recv_ms, int send_ms);
void *pr_sock_zmq(struct pr_sock *s);               /* the raw zmq socket */
int pr_sock_fd(struct pr_sock *s, int *fd);         /* ZMQ_FD, for uv_poll_t */
int pr_sock_events(struct pr_sock *s, int *events); /* ZMQ_EVENTS: ZMQ_POLLIN|ZMQ_POLLOUT */

/* Encodes and sends `m`. `to` is required on a ROUTER socket (CM_ERR_INVAL
 * without it) and ignored elsewhere. flags: 0 or PR_DONTWAIT. Errors: the
 * encoder's, CM_ERR_AGAIN (would block), CM_ERR_CLOSED (unknown ROUTER peer
 * or context terminated). */
int pr_sock_send(struct pr_sock *s, const struct pr_rid *to, const struct pr_msg *m, int flags);
/* Receives and decodes one message into *out, its arrays and strings in
 * `arena` (the caller resets it between messages). On a ROUTER socket *from
 * gets the sender (pass it back to pr_sock_send to reply); it is filled even
 * when decoding fails, so the sender can be told. Errors: CM_ERR_AGAIN,
 * CM_ERR_PARSE for a wrong frame count, and any pr_msg_decode error. */
int pr_sock_recv(struct pr_sock *s, struct pr_rid *from, struct pr_msg *out, struct cm_arena *arena,
                 int flags);

/* ---- connection events ---- */

/* A socket monitor: ZeroMQ reports the connections of socket `s` (the events, a
 * mask of ZMQ_EVENT_*) on an inproc PAIR socket of the same context, which
 * *pair_out is (close it with pr_monitor_close before closing s). Poll it with
 * zmq_poll, or poll its ZMQ_FD and read until ZMQ_EVENTS has no ZMQ_POLLIN: the fd
 * only signals an event that arrives after a read found none. */
int pr_monitor_open(void *zmq_ctx, struct pr_sock *s, int events, void **pair_out);
/* One event from the monitor: its ZMQ_EVENT_* in *event and its value in *value (for
 * ZMQ_EVENT_DISCONNECTED and ZMQ_EVENT_ACCEPTED the connection's file descriptor).
 * CM_ERR_AGAIN when none is waiting. */
int pr_monitor_recv(void *pair, int *event, int *value);
/* Stops the monitor of s and closes the PAIR socket (NULL pair is a no-op). */
void pr_monitor_close(struct pr_sock *s, void *pair);

/* ---- endpoints (pr-endpoint.c) ---- */

/* The directory for ipc endpoints: `base` when given, else $LMSERVE_RUNTIME_DIR,
 * else $XDG_RUNTIME_DIR/lmserve, else /tmp/lmserve-<uid>. Missing components
 * are created with mode 0700; the last one must be a directory (not a symlink)
 * owned by us, and is set to 0700. Errors: CM_ERR_TOOBIG (path too long),
 * CM_ERR_INVAL (not ours / not a directory), CM_ERR_IO. */
int pr_runtime_dir(const char *base, char *out, size_t out_len);
/* The endpoint for `name`: "tcp://", "ipc://" and "inproc://" endpoints pass
 * through; a bare name ([A-Za-z0-9._-], 1..64 bytes) becomes
 * "ipc://<dir>/<name>.sock". Errors: CM_ERR_INVAL (bad name, or a bare name
 * with dir NULL), CM_ERR_TOOBIG (longer than an AF_UNIX path or out_len). */
int pr_endpoint(const char *dir, const char *name, char *out, size_t out_len);

#endif
