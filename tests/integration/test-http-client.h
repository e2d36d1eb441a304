/* test-http-client.h — what the HTTP integration tests share: starting
 * `lmserve frontend` with short limits on a free port, and a small blocking
 * HTTP/1.1 client (keep-alive, pipelining, Content-Length and chunked
 * answers) written for the tests. */
#ifndef LMSERVE_TEST_HTTP_CLIENT_H
#define LMSERVE_TEST_HTTP_CLIENT_H
#include <stddef.h>
#include <sys/types.h>

#include "tests/harness/th-proc.h"

/* a running `lmserve frontend` */
struct server {
  struct th_proc p;
  int port; /* the port it printed */
};

/* one client connection with its receive buffer */
struct conn {
  int fd;
  char buf[1 << 16]; /* received, not yet consumed */
  size_t len;
};

/* one parsed answer (chunked bodies de-chunked) */
struct resp {
  int status;
  char head[4096];
  char body[65536];
  size_t body_len;
};

#define GET(path, key) "GET " path " HTTP/1.1\r\nHost: t\r\n" key "\r\n"
#define KEY            "Authorization: Bearer sekret\r\n"

/* `lmserve frontend --port 0 --served-model-name tiny FLAGS...` (flags NULL-terminated),
 * its output captured; the port from its first line, after url_prefix. */
void hc_frontend_start(struct server *s, const char *url_prefix, char *const *flags);
void hc_server_start_with(struct server *s, const char *api_key, const char *body_timeout,
                          const char *max_conns);
void hc_server_start(struct server *s, const char *api_key);
/* hc_server_start, then one client connection c to it (the test stops without one). */
void hc_server_open(struct server *s, const char *api_key, struct conn *c);
/* Reads the first line a started server printed (within 10 s) and returns the
 * port after `prefix` in it ("http://127.0.0.1:"); fails the test without one. */
int hc_read_url_port(struct th_proc *p, const char *prefix);
void hc_dump_server_stderr(struct server *s);
void hc_server_stop(struct server *s);
int hc_conn_open(struct conn *c, int port);
void hc_conn_close(struct conn *c);
int hc_send_all(struct conn *c, const char *p, size_t n);
int hc_send_str(struct conn *c, const char *s);
ssize_t hc_fill(struct conn *c, int timeout_ms);
const char *hc_find_header(const struct resp *r, const char *name);
void hc_consume(struct conn *c, size_t n);

/* Where hc_parse_resp reads an answer from: a receive buffer (buf[cap], *len bytes in
 * it) and fill, which reads more into it within timeout_ms: the bytes read, 0 when the
 * peer closed, -1 on a timeout, an error or a full buffer. */
struct hc_source {
  char *buf;
  size_t *len;
  size_t cap;
  ssize_t (*fill)(void *conn, int timeout_ms);
  void *conn;
};
/* Reads one answer (Content-Length, chunked, or delimited by close) from src into r,
 * each wait for more bytes at most timeout_ms; what it read leaves the buffer. Returns 0
 * (an interim 100 too), or -1 when the connection closed or timed out first. */
int hc_parse_resp(const struct hc_source *src, struct resp *r, int timeout_ms);
/* hc_parse_resp from c. */
int hc_read_resp(struct conn *c, struct resp *r, int timeout_ms);
int hc_closed_by_server(struct conn *c, int timeout_ms);
int hc_do_req(struct conn *c, const char *req, struct resp *r);
/* hc_do_req on a fresh connection to port (closed after): 0, or -1 (the answer in *r). */
int hc_request(int port, const char *req, struct resp *r);
void hc_check_alive(struct server *s);
void hc_post(char *out, size_t size, const char *path, const char *body);
double hc_now_s(void);

#endif
