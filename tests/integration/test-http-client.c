/* test-http-client.c — the server starter and the blocking HTTP client of
 * the HTTP integration tests (see test-http-client.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/test-http-client.h"

/* ---- the server under test ---------------------------------------------- */

void hc_frontend_start(struct server *s, const char *url_prefix, char *const *flags) {
  memset(s, 0, sizeof(*s));
  /* (its stderr is a pipe read once, at the end: an access log line a request, thousands
   * of them in the limits' tests, would fill it and stall the frontend) */
  TH_REQUIRE(th_proc_spawnl(&s->p, NULL, 1, flags, th_lmserve_bin(), "frontend", "--port", "0",
                            "--served-model-name", "tiny", "--disable-access-log", NULL) == 0);
  s->port = hc_read_url_port(&s->p, url_prefix);
}

/* Starts the frontend on a free port with short limits; reads the port
 * from the "listening on http://127.0.0.1:PORT" line. */
void hc_server_start_with(struct server *s, const char *api_key, const char *body_timeout,
                          const char *max_conns) {
  char *flags[24] = {"--max-model-len",   "512",  "--max-body-size", "4096",
                     "--max-header-size", "2048", "--max-headers",   "20",
                     "--header-timeout",  "0.6",  "--body-timeout",  (char *)body_timeout,
                     "--idle-timeout",    "0.8"};
  char **f = flags + 14;
  if (api_key) *f++ = "--api-key", *f++ = (char *)api_key;
  if (max_conns) *f++ = "--max-connections", *f++ = (char *)max_conns;
  hc_frontend_start(s, "http://127.0.0.1:", flags);
}

int hc_read_url_port(struct th_proc *p, const char *prefix) {
  char line[512];
  size_t n = 0;
  struct pollfd pf = {p->out_fd, POLLIN, 0};
  while (n < sizeof(line) - 1 && poll(&pf, 1, 10000) > 0) {
    ssize_t k = read(p->out_fd, line + n, 1);
    if (k <= 0) break;
    n += (size_t)k;
    if (line[n - 1] == '\n') break;
  }
  line[n] = 0;
  const char *u = strstr(line, prefix);
  if (!u) th_fail(__FILE__, __LINE__, "no %s URL printed: '%s'", prefix, line);
  TH_REQUIRE(u != NULL);
  int port = atoi(u + strlen(prefix));
  TH_REQUIRE(port > 0);
  return port;
}

void hc_server_start(struct server *s, const char *api_key) {
  hc_server_start_with(s, api_key, "0.6", NULL);
}

void hc_server_open(struct server *s, const char *api_key, struct conn *c) {
  hc_server_start(s, api_key);
  TH_REQUIRE(hc_conn_open(c, s->port) == 0);
}

/* Copies what the server wrote to stderr into the test's log. */
void hc_dump_server_stderr(struct server *s) {
  size_t n = 0;
  char *e = th_read_all(s->p.err_fd, 2000, &n);
  if (e && n) fprintf(stderr, "---- server stderr ----\n%s\n-----------------------\n", e);
  free(e);
}

/* SIGTERM must make it drain and exit 0 promptly. */
void hc_server_stop(struct server *s) {
  if (th_proc_check_exit(&s->p, SIGTERM, 5000) != 0) hc_dump_server_stderr(s);
  th_proc_stop(&s->p, 1000);
}

/* ---- a blocking client ---------------------------------------------------- */

int hc_conn_open(struct conn *c, int port) {
  c->len = 0;
  c->fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int one = 1;
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return connect(c->fd, (struct sockaddr *)&a, sizeof(a));
}

void hc_conn_close(struct conn *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
}

int hc_send_all(struct conn *c, const char *p, size_t n) {
  while (n) {
    ssize_t k = send(c->fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

int hc_send_str(struct conn *c, const char *s) {
  return hc_send_all(c, s, strlen(s));
}

/* Reads more bytes; 0 on EOF, -1 on timeout or error, else bytes read. */
ssize_t hc_fill(struct conn *c, int timeout_ms) {
  struct pollfd pf = {c->fd, POLLIN, 0};
  if (poll(&pf, 1, timeout_ms) <= 0) return -1;
  if (c->len == sizeof(c->buf)) return -1;
  ssize_t k = recv(c->fd, c->buf + c->len, sizeof(c->buf) - c->len, 0);
  if (k > 0) c->len += (size_t)k;
  return k < 0 ? -1 : k;
}

const char *hc_find_header(const struct resp *r, const char *name) {
  static char v[256];
  size_t nl = strlen(name);
  for (const char *p = strstr(r->head, "\r\n"); p && p[2]; p = strstr(p + 2, "\r\n")) {
    const char *l = p + 2;
    if (!strncasecmp(l, name, nl) && l[nl] == ':') {
      const char *s = l + nl + 1;
      while (*s == ' ')
        s++;
      const char *e = strstr(s, "\r\n");
      size_t n = e ? (size_t)(e - s) : strlen(s);
      if (n >= sizeof(v)) n = sizeof(v) - 1;
      memcpy(v, s, n);
      v[n] = 0;
      return v;
    }
  }
  return NULL;
}

void hc_consume(struct conn *c, size_t n) {
  memmove(c->buf, c->buf + n, c->len - n);
  c->len -= n;
}

/* Drops the first n bytes of src's buffer. */
static void take(const struct hc_source *src, size_t n) {
  memmove(src->buf, src->buf + n, *src->len - n);
  *src->len -= n;
}

int hc_parse_resp(const struct hc_source *src, struct resp *r, int timeout_ms) {
  memset(r, 0, sizeof(*r));
  r->status = -1;
  char *b = src->buf, *end;
  while (!(end = memmem(b, *src->len, "\r\n\r\n", 4)))
    if (src->fill(src->conn, timeout_ms) <= 0) return -1;
  size_t hl = (size_t)(end - b) + 4;
  if (hl >= sizeof(r->head)) return -1;
  memcpy(r->head, b, hl);
  r->head[hl] = 0;
  take(src, hl);
  if (sscanf(r->head, "HTTP/1.%*d %d", &r->status) != 1) return -1;
  if (r->status == 100) return 0;
  const char *cl = hc_find_header(r, "Content-Length");
  const char *te = hc_find_header(r, "Transfer-Encoding");
  if (cl) {
    size_t n = (size_t)atol(cl);
    if (n >= sizeof(r->body)) return -1;
    while (*src->len < n)
      if (src->fill(src->conn, timeout_ms) <= 0) return -1;
    memcpy(r->body, b, n);
    r->body_len = n;
    take(src, n);
  } else if (te && !strcasecmp(te, "chunked")) {
    for (;;) { /* chunk size line, data, CRLF; a 0 chunk ends the body */
      char *le;
      while (!(le = memmem(b, *src->len, "\r\n", 2)))
        if (src->fill(src->conn, timeout_ms) <= 0) return -1;
      size_t sz = strtoul(b, NULL, 16), ll = (size_t)(le - b) + 2;
      while (*src->len < ll + sz + 2)
        if (src->fill(src->conn, timeout_ms) <= 0) return -1;
      if (r->body_len + sz >= sizeof(r->body)) return -1;
      memcpy(r->body + r->body_len, b + ll, sz);
      r->body_len += sz;
      take(src, ll + sz + 2);
      if (sz == 0) break;
    }
  } else { /* delimited by close */
    while (src->fill(src->conn, timeout_ms) > 0) {
    }
    size_t n = *src->len < sizeof(r->body) ? *src->len : sizeof(r->body) - 1;
    memcpy(r->body, b, n);
    r->body_len = n;
    take(src, n);
  }
  r->body[r->body_len] = 0;
  return 0;
}

static ssize_t fill_conn(void *c, int timeout_ms) {
  return hc_fill(c, timeout_ms);
}

int hc_read_resp(struct conn *c, struct resp *r, int timeout_ms) {
  struct hc_source src = {c->buf, &c->len, sizeof(c->buf), fill_conn, c};
  return hc_parse_resp(&src, r, timeout_ms);
}

/* 1 when the server closed the connection within timeout_ms. */
int hc_closed_by_server(struct conn *c, int timeout_ms) {
  for (;;) {
    ssize_t k = hc_fill(c, timeout_ms);
    if (k == 0) return 1;
    if (k < 0) return errno == ECONNRESET;
  }
}

int hc_do_req(struct conn *c, const char *req, struct resp *r) {
  if (hc_send_str(c, req) != 0) return -1;
  return hc_read_resp(c, r, 5000);
}

int hc_request(int port, const char *req, struct resp *r) {
  struct conn c;
  if (hc_conn_open(&c, port) != 0) return -1;
  int rc = hc_do_req(&c, req, r);
  hc_conn_close(&c);
  return rc;
}

void hc_check_alive(struct server *s) {
  struct conn c;
  TH_REQUIRE(hc_conn_open(&c, s->port) == 0);
  struct resp r;
  TH_CHECK(hc_do_req(&c, GET("/version", KEY), &r) == 0 && r.status == 200);
  hc_conn_close(&c);
}

void hc_post(char *out, size_t size, const char *path, const char *body) {
  snprintf(out, size,
           "POST %s HTTP/1.1\r\nHost: t\r\n" KEY "Content-Type: application/json\r\n"
           "Content-Length: %zu\r\n\r\n%s",
           path, strlen(body), body);
}

double hc_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
