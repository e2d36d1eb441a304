/* test-http.c — `lmserve frontend` driven over real sockets by a small
 * blocking HTTP client: routes, auth, keep-alive, pipelining, limits (413,
 * 431, 400), slowloris timeouts, HTTP/1.0, backpressure, and a clean exit on
 * SIGTERM. After every bad request the server must go on serving. */
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

static char *bin(void) {
  char *b = getenv("LMSERVE_BIN");
  return b ? b : "build/tools/lmserve";
}

/* ---- the server under test ---------------------------------------------- */

struct server {
  struct th_proc p;
  int port;
};

/* Starts the frontend on a free port with short limits; reads the port
 * from the "listening on http://127.0.0.1:PORT" line. */
static void server_start_with(struct server *s, const char *api_key, const char *body_timeout,
                              const char *max_conns) {
  char *argv[32];
  int a = 0;
  argv[a++] = bin();
  argv[a++] = "frontend";
  argv[a++] = "--port";
  argv[a++] = "0";
  argv[a++] = "--served-model-name";
  argv[a++] = "tiny";
  argv[a++] = "--max-model-len";
  argv[a++] = "512";
  argv[a++] = "--max-body-size";
  argv[a++] = "4096";
  argv[a++] = "--max-header-size";
  argv[a++] = "2048";
  argv[a++] = "--max-headers";
  argv[a++] = "20";
  argv[a++] = "--header-timeout";
  argv[a++] = "0.6";
  argv[a++] = "--body-timeout";
  argv[a++] = (char *)body_timeout;
  argv[a++] = "--idle-timeout";
  argv[a++] = "0.8";
  if (api_key) {
    argv[a++] = "--api-key";
    argv[a++] = (char *)api_key;
  }
  if (max_conns) {
    argv[a++] = "--max-connections";
    argv[a++] = (char *)max_conns;
  }
  argv[a] = NULL;
  memset(s, 0, sizeof(*s));
  TH_REQUIRE(th_proc_spawn(&s->p, argv, NULL, 1) == 0);
  char line[512];
  size_t n = 0;
  struct pollfd pf = {s->p.out_fd, POLLIN, 0};
  while (n < sizeof(line) - 1 && poll(&pf, 1, 10000) > 0) {
    ssize_t k = read(s->p.out_fd, line + n, 1);
    if (k <= 0) break;
    n += (size_t)k;
    if (line[n - 1] == '\n') break;
  }
  line[n] = 0;
  const char *u = strstr(line, "http://127.0.0.1:");
  if (!u) th_fail(__FILE__, __LINE__, "no URL printed: '%s'", line);
  TH_REQUIRE(u != NULL);
  s->port = atoi(u + strlen("http://127.0.0.1:"));
  TH_REQUIRE(s->port > 0);
}

static void server_start(struct server *s, const char *api_key) {
  server_start_with(s, api_key, "0.6", NULL);
}

/* Copies what the server wrote to stderr into the test's log. */
static void dump_server_stderr(struct server *s) {
  size_t n = 0;
  char *e = th_read_all(s->p.err_fd, 2000, &n);
  if (e && n) fprintf(stderr, "---- server stderr ----\n%s\n-----------------------\n", e);
  free(e);
}

/* SIGTERM must make it drain and exit 0 promptly. */
static void server_stop(struct server *s) {
  th_proc_signal(&s->p, SIGTERM);
  int rc = th_proc_wait(&s->p, 5000);
  TH_CHECK_EQ_INT(rc, 0);
  if (rc == 0) {
    TH_CHECK(WIFEXITED(s->p.status));
    TH_CHECK_EQ_INT(WEXITSTATUS(s->p.status), 0);
    if (!WIFEXITED(s->p.status) || WEXITSTATUS(s->p.status) != 0) dump_server_stderr(s);
  }
  th_proc_stop(&s->p, 1000);
}

/* ---- a blocking client ---------------------------------------------------- */

struct conn {
  int fd;
  char buf[1 << 16]; /* received, not yet consumed */
  size_t len;
};

static int conn_open(struct conn *c, int port) {
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

static void conn_close(struct conn *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
}

static int send_all(struct conn *c, const char *p, size_t n) {
  while (n) {
    ssize_t k = send(c->fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

static int send_str(struct conn *c, const char *s) {
  return send_all(c, s, strlen(s));
}

/* Reads more bytes; 0 on EOF, -1 on timeout or error, else bytes read. */
static ssize_t fill(struct conn *c, int timeout_ms) {
  struct pollfd pf = {c->fd, POLLIN, 0};
  if (poll(&pf, 1, timeout_ms) <= 0) return -1;
  if (c->len == sizeof(c->buf)) return -1;
  ssize_t k = recv(c->fd, c->buf + c->len, sizeof(c->buf) - c->len, 0);
  if (k > 0) c->len += (size_t)k;
  return k < 0 ? -1 : k;
}

struct resp {
  int status;
  char head[4096];
  char body[65536];
  size_t body_len;
};

static const char *find_header(const struct resp *r, const char *name) {
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

static void consume(struct conn *c, size_t n) {
  memmove(c->buf, c->buf + n, c->len - n);
  c->len -= n;
}

/* Reads one response (Content-Length or chunked). Returns 0, or -1 when the
 * connection closed or timed out first. */
static int read_resp(struct conn *c, struct resp *r, int timeout_ms) {
  memset(r, 0, sizeof(*r));
  char *end;
  while (!(end = memmem(c->buf, c->len, "\r\n\r\n", 4)))
    if (fill(c, timeout_ms) <= 0) return -1;
  size_t hl = (size_t)(end - c->buf) + 4;
  if (hl >= sizeof(r->head)) return -1;
  memcpy(r->head, c->buf, hl);
  r->head[hl] = 0;
  consume(c, hl);
  if (sscanf(r->head, "HTTP/1.%*d %d", &r->status) != 1) return -1;
  if (r->status == 100) return 0;
  const char *cl = find_header(r, "Content-Length");
  const char *te = find_header(r, "Transfer-Encoding");
  if (cl) {
    size_t n = (size_t)atol(cl);
    if (n >= sizeof(r->body)) return -1;
    while (c->len < n)
      if (fill(c, timeout_ms) <= 0) return -1;
    memcpy(r->body, c->buf, n);
    r->body_len = n;
    consume(c, n);
  } else if (te && !strcasecmp(te, "chunked")) {
    for (;;) {
      char *le;
      while (!(le = memmem(c->buf, c->len, "\r\n", 2)))
        if (fill(c, timeout_ms) <= 0) return -1;
      size_t sz = strtoul(c->buf, NULL, 16), ll = (size_t)(le - c->buf) + 2;
      while (c->len < ll + sz + 2)
        if (fill(c, timeout_ms) <= 0) return -1;
      if (r->body_len + sz >= sizeof(r->body)) return -1;
      memcpy(r->body + r->body_len, c->buf + ll, sz);
      r->body_len += sz;
      consume(c, ll + sz + 2);
      if (sz == 0) break;
    }
  } else { /* delimited by close */
    while (fill(c, timeout_ms) > 0) {
    }
    size_t n = c->len < sizeof(r->body) ? c->len : sizeof(r->body) - 1;
    memcpy(r->body, c->buf, n);
    r->body_len = n;
    consume(c, n);
  }
  r->body[r->body_len] = 0;
  return 0;
}

/* 1 when the server closed the connection within timeout_ms. */
static int closed_by_server(struct conn *c, int timeout_ms) {
  for (;;) {
    ssize_t k = fill(c, timeout_ms);
    if (k == 0) return 1;
    if (k < 0) return errno == ECONNRESET;
  }
}

static int do_req(struct conn *c, const char *req, struct resp *r) {
  if (send_str(c, req) != 0) return -1;
  return read_resp(c, r, 5000);
}

#define GET(path, key) "GET " path " HTTP/1.1\r\nHost: t\r\n" key "\r\n"
#define KEY            "Authorization: Bearer sekret\r\n"

static void check_alive(struct server *s) {
  struct conn c;
  TH_REQUIRE(conn_open(&c, s->port) == 0);
  struct resp r;
  TH_CHECK(do_req(&c, GET("/version", KEY), &r) == 0 && r.status == 200);
  conn_close(&c);
}

static void post(char *out, size_t size, const char *path, const char *body) {
  snprintf(out, size,
           "POST %s HTTP/1.1\r\nHost: t\r\n" KEY "Content-Type: application/json\r\n"
           "Content-Length: %zu\r\n\r\n%s",
           path, strlen(body), body);
}

/* ---- tests -------------------------------------------------------------------- */

TH_TEST(http_routes_keepalive) {
  th_proc_init(60);
  struct server s;
  server_start(&s, "sekret");
  struct conn c;
  TH_REQUIRE(conn_open(&c, s.port) == 0);
  struct resp r;
  /* all on one keep-alive connection, good and bad requests mixed */
  TH_REQUIRE(do_req(&c, GET("/health", ""), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 503);
  TH_CHECK(strstr(r.body, "\"error\"") && strstr(r.body, "\"code\":503"));
  /* HEAD: the same status and Content-Length, no body; the connection
   * goes on (a body would be read as the next answer) */
  TH_REQUIRE(send_str(&c, "HEAD /health HTTP/1.1\r\nHost: t\r\n\r\n") == 0);
  char *e;
  while (!(e = memmem(c.buf, c.len, "\r\n\r\n", 4)))
    TH_REQUIRE(fill(&c, 5000) > 0);
  TH_CHECK(strncmp(c.buf, "HTTP/1.1 503", 12) == 0);
  TH_CHECK(memmem(c.buf, c.len, "Content-Length: 9", 17) != NULL);
  consume(&c, (size_t)(e - c.buf) + 4);
  TH_REQUIRE(do_req(&c, GET("/v1/models", ""), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 401);
  TH_CHECK(strstr(r.body, "\"code\":401") != NULL);
  TH_REQUIRE(do_req(&c, GET("/v1/models", "Authorization: Bearer wrong\r\n"), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 401);
  TH_REQUIRE(do_req(&c, GET("/v1/models", KEY), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  TH_CHECK(strstr(r.body, "\"object\":\"list\"") && strstr(r.body, "\"id\":\"tiny\"") &&
           strstr(r.body, "\"max_model_len\":512") && strstr(r.body, "\"object\":\"model\""));
  TH_REQUIRE(do_req(&c, GET("/version", KEY), &r) == 0);
  TH_CHECK(r.status == 200 && strstr(r.body, "\"version\"") != NULL);
  TH_CHECK(find_header(&r, "Date") && strstr(find_header(&r, "Date"), " GMT") != NULL);
  TH_REQUIRE(do_req(&c, GET("/nope", KEY), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 404);
  TH_CHECK(strstr(r.body, "\"code\":404") != NULL);
  TH_REQUIRE(do_req(&c, "DELETE /v1/models HTTP/1.1\r\nHost: t\r\n" KEY "\r\n", &r) == 0);
  TH_CHECK_EQ_INT(r.status, 405);
  TH_CHECK(find_header(&r, "Allow") && !strcmp(find_header(&r, "Allow"), "GET"));
  TH_REQUIRE(do_req(&c, GET("/v1/completions", KEY), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 405);
  char req[2048];
  post(req, sizeof(req), "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"hi\",\"top_p\":1.5}");
  TH_REQUIRE(do_req(&c, req, &r) == 0);
  TH_CHECK_EQ_INT(r.status, 400);
  TH_CHECK(strstr(r.body, "\"param\":\"top_p\"") != NULL);
  post(req, sizeof(req), "/v1/completions", "{\"model\":\"big\",\"prompt\":\"hi\"}");
  TH_REQUIRE(do_req(&c, req, &r) == 0);
  TH_CHECK_EQ_INT(r.status, 404);
  TH_CHECK(strstr(r.body, "\"code\":404") && strstr(r.body, "big"));
  post(req, sizeof(req), "/v1/chat/completions",
       "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":-3}");
  TH_REQUIRE(do_req(&c, req, &r) == 0);
  TH_CHECK_EQ_INT(r.status, 400);
  post(req, sizeof(req), "/v1/chat/completions", "{not json");
  TH_REQUIRE(do_req(&c, req, &r) == 0);
  TH_CHECK_EQ_INT(r.status, 400);
  post(req, sizeof(req), "/v1/completions", "{\"prompt\":[1,2,3],\"max_tokens\":600}");
  TH_REQUIRE(do_req(&c, req, &r) == 0);
  TH_CHECK_EQ_INT(r.status, 400);
  TH_CHECK(strstr(r.body, "512") && strstr(r.body, "603"));
  post(
      req, sizeof(req), "/v1/chat/completions",
      "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true}");
  TH_REQUIRE(do_req(&c, req, &r) == 0);
  TH_CHECK_EQ_INT(r.status, 503); /* valid, but no engine yet */
  TH_CHECK(strstr(r.body, "engine not ready") != NULL);
  post(req, sizeof(req), "/tokenize", "{\"prompt\":\"hi\"}");
  TH_REQUIRE(do_req(&c, req, &r) == 0);
  TH_CHECK_EQ_INT(r.status, 503);
  post(req, sizeof(req), "/detokenize", "{\"tokens\":\"x\"}");
  TH_REQUIRE(do_req(&c, req, &r) == 0);
  TH_CHECK_EQ_INT(r.status, 400);
  TH_REQUIRE(do_req(&c, GET("/metrics", KEY), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  TH_CHECK(strstr(r.body, "# TYPE lmserve:prompt_tokens_total counter") != NULL);
  TH_CHECK(strstr(r.body,
                  "lmserve:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"+Inf\"}") !=
           NULL);
  TH_CHECK(strstr(r.body, "lmserve:http_client_errors_total{model_name=\"tiny\"}") != NULL);
  conn_close(&c);
  server_stop(&s);
}

TH_TEST(http_pipelining_and_chunked) {
  th_proc_init(60);
  struct server s;
  server_start(&s, "sekret");
  struct conn c;
  TH_REQUIRE(conn_open(&c, s.port) == 0);
  const char *body = "{\"prompt\":\"x\",\"n\":0}";
  char all[4096];
  int n = snprintf(
      all, sizeof(all),
      GET("/version", KEY) GET(
          "/nope", KEY) "POST /v1/completions HTTP/1.1\r\nHost: t\r\n" KEY
                        "Content-Length: %zu\r\n\r\n%s"
                        "POST /v1/completions HTTP/1.1\r\nHost: t\r\n" KEY
                        "Transfer-Encoding: chunked\r\n\r\n"
                        "5\r\n{\"pro\r\nb;ext=1\r\nmpt\":\"x\",\"n\r\n4\r\n\":0}\r\n0\r\n\r\n" GET(
                            "/v1/models", KEY),
      strlen(body), body);
  /* the whole batch in one write, then again one byte per write */
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 0) {
      TH_REQUIRE(send_all(&c, all, (size_t)n) == 0);
    } else {
      for (int i = 0; i < n; i++)
        TH_REQUIRE(send_all(&c, all + i, 1) == 0);
    }
    struct resp r;
    static const int want[] = {200, 404, 400, 400, 200};
    for (size_t i = 0; i < 5; i++) {
      TH_REQUIRE(read_resp(&c, &r, 5000) == 0);
      TH_CHECK_EQ_INT(r.status, want[i]);
      if (i == 2 || i == 3) TH_CHECK(strstr(r.body, "\"param\":\"n\"") != NULL);
    }
    TH_CHECK(strstr(r.body, "\"max_model_len\"") != NULL);
  }
  /* Expect: 100-continue gets the interim answer before the body */
  char head[512];
  snprintf(head, sizeof(head),
           "POST /v1/completions HTTP/1.1\r\nHost: t\r\n" KEY
           "Expect: 100-continue\r\nContent-Length: %zu\r\n\r\n",
           strlen(body));
  TH_REQUIRE(send_str(&c, head) == 0);
  struct resp r;
  TH_REQUIRE(read_resp(&c, &r, 5000) == 0);
  TH_CHECK_EQ_INT(r.status, 100);
  TH_REQUIRE(send_str(&c, body) == 0);
  TH_REQUIRE(read_resp(&c, &r, 5000) == 0);
  TH_CHECK_EQ_INT(r.status, 400);
  conn_close(&c);
  server_stop(&s);
}

/* A request the server rejects itself: it answers `want` with the error
 * envelope and closes; a new connection still works. */
static void expect_reject(struct server *s, const char *req, size_t len, int want) {
  struct conn c;
  TH_REQUIRE(conn_open(&c, s->port) == 0);
  send_all(&c, req, len);
  struct resp r;
  int rc = read_resp(&c, &r, 5000);
  TH_CHECK_EQ_INT(rc, 0);
  if (rc == 0) {
    if (r.status != want)
      th_fail(__FILE__, __LINE__, "want %d, got %d: %.80s", want, r.status, req);
    TH_CHECK(strstr(r.body, "\"error\"") != NULL);
    TH_CHECK(find_header(&r, "Connection") && !strcasecmp(find_header(&r, "Connection"), "close"));
  }
  TH_CHECK(closed_by_server(&c, 6000));
  conn_close(&c);
  check_alive(s);
}

TH_TEST(http_limits) {
  th_proc_init(60);
  struct server s;
  server_start(&s, "sekret");
  char big[16384];
  /* 413: declared body over --max-body-size */
  snprintf(big, sizeof(big),
           "POST /v1/completions HTTP/1.1\r\nHost: t\r\n" KEY "Content-Length: 5000\r\n\r\n");
  expect_reject(&s, big, strlen(big), 413);
  /* 413: a chunked body that grows past it */
  int n = snprintf(big, sizeof(big),
                   "POST /v1/completions HTTP/1.1\r\nHost: t\r\n" KEY
                   "Transfer-Encoding: chunked\r\n\r\n1400\r\n");
  memset(big + n, 'a', 5200);
  expect_reject(&s, big, (size_t)n + 5200, 413);
  /* 431: a head over --max-header-size */
  n = snprintf(big, sizeof(big), "GET /version HTTP/1.1\r\nHost: t\r\nX-Big: ");
  memset(big + n, 'b', 3000);
  n += 3000;
  n += snprintf(big + n, sizeof(big) - (size_t)n, "\r\n\r\n");
  expect_reject(&s, big, (size_t)n, 431);
  /* 431: more fields than --max-headers */
  n = snprintf(big, sizeof(big), "GET /version HTTP/1.1\r\nHost: t\r\n");
  for (int i = 0; i < 25; i++)
    n += snprintf(big + n, sizeof(big) - (size_t)n, "X-%d: v\r\n", i);
  n += snprintf(big + n, sizeof(big) - (size_t)n, "\r\n");
  expect_reject(&s, big, (size_t)n, 431);
  /* 400: request smuggling shapes and garbage */
  static const char *const bad400[] = {
      "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: "
      "chunked\r\n\r\n0\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: "
      "4\r\n\r\nabcd",
      "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: -3\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
      "GET /version HTTP/1.1\r\nHost: t\r\nX: a\r\n folded\r\n\r\n",
      "GET /version HTTP/1.1\r\nHost: t\rX: a\r\n\r\n",
      "\x16\x03\x01\x02\xff\xfc\x03\x03\r\n\r\n",
      "GET /version HTTP/1.1\r\n\r\n",
  };
  for (size_t i = 0; i < sizeof(bad400) / sizeof(bad400[0]); i++)
    expect_reject(&s, bad400[i], strlen(bad400[i]), 400);
  static const char *const te =
      "POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n";
  expect_reject(&s, te, strlen(te), 501);
  static const char *const v2 = "GET / HTTP/2.0\r\nHost: t\r\n\r\n";
  expect_reject(&s, v2, strlen(v2), 505);
  server_stop(&s);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

TH_TEST(http_slowloris_and_idle) {
  th_proc_init(60);
  struct server s;
  server_start(&s, NULL);
  /* a head dribbled slower than --header-timeout 0.6 s: 408 and close,
   * even though bytes keep arriving */
  struct conn c;
  TH_REQUIRE(conn_open(&c, s.port) == 0);
  double t0 = now_s();
  const char *part = "GET /version HTTP/1.1\r\nHost: t\r\nX-A: 1\r\n";
  struct resp r;
  int got = -1;
  for (size_t i = 0; i < strlen(part); i++) {
    if (send_all(&c, part + i, 1) != 0) break;
    struct pollfd pf = {c.fd, POLLIN, 0};
    if (poll(&pf, 1, 100) > 0) break;
  }
  got = read_resp(&c, &r, 6000);
  double dt = now_s() - t0;
  TH_CHECK_EQ_INT(got, 0);
  TH_CHECK_EQ_INT(r.status, 408);
  TH_CHECK(dt >= 0.5 && dt < 6.0);
  TH_CHECK(closed_by_server(&c, 6000));
  conn_close(&c);
  /* a connection that sends nothing is closed after the header timeout */
  TH_REQUIRE(conn_open(&c, s.port) == 0);
  t0 = now_s();
  TH_CHECK(closed_by_server(&c, 6000));
  dt = now_s() - t0;
  TH_CHECK(dt >= 0.5 && dt < 6.0);
  conn_close(&c);
  /* a body slower than --body-timeout: 408 */
  TH_REQUIRE(conn_open(&c, s.port) == 0);
  TH_REQUIRE(
      send_str(&c, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{") ==
      0);
  TH_REQUIRE(read_resp(&c, &r, 6000) == 0);
  TH_CHECK_EQ_INT(r.status, 408);
  conn_close(&c);
  /* keep-alive: an idle connection closes after --idle-timeout 0.8 s, and
   * not before */
  TH_REQUIRE(conn_open(&c, s.port) == 0);
  TH_REQUIRE(do_req(&c, GET("/version", ""), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  t0 = now_s();
  usleep(300000);
  TH_REQUIRE(do_req(&c, GET("/version", ""), &r) == 0); /* still open at 0.3 s */
  t0 = now_s();
  TH_CHECK(closed_by_server(&c, 6000));
  dt = now_s() - t0;
  TH_CHECK(dt >= 0.7 && dt < 6.0);
  conn_close(&c);
  check_alive(&s);
  server_stop(&s);
}

TH_TEST(http_10_and_connection_close) {
  th_proc_init(60);
  struct server s;
  server_start(&s, NULL);
  struct conn c;
  struct resp r;
  TH_REQUIRE(conn_open(&c, s.port) == 0);
  TH_REQUIRE(do_req(&c, "GET /version HTTP/1.0\r\n\r\n", &r) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  TH_CHECK(closed_by_server(&c, 6000));
  conn_close(&c);
  TH_REQUIRE(conn_open(&c, s.port) == 0);
  TH_REQUIRE(do_req(&c, "GET /version HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &r) == 0);
  TH_CHECK(find_header(&r, "Connection") &&
           !strcasecmp(find_header(&r, "Connection"), "keep-alive"));
  TH_REQUIRE(do_req(&c, "GET /version HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &r) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  conn_close(&c);
  TH_REQUIRE(conn_open(&c, s.port) == 0);
  TH_REQUIRE(do_req(&c, "GET /version HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", &r) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  TH_CHECK(closed_by_server(&c, 6000));
  conn_close(&c);
  server_stop(&s);
}

/* Sends as much of all[0..n) as the server takes without blocking for
 * 300 ms; returns the bytes sent. */
static size_t send_until_blocked(struct conn *c, const char *all, size_t n) {
  size_t sent = 0;
  while (sent < n) {
    struct pollfd pf = {c->fd, POLLOUT, 0};
    if (poll(&pf, 1, 300) <= 0) break;
    ssize_t k = send(c->fd, all + sent, n - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k <= 0) break;
    sent += (size_t)k;
  }
  return sent;
}

/* Requests padded near --max-header-size, so that a few thousand of them
 * outgrow what the kernel's socket buffers absorb. */
#define PADDED_GET "GET /v1/models HTTP/1.1\r\nHost: t\r\nX-Pad: " PAD "\r\n\r\n"
#define PAD16      "pppppppppppppppp"
#define PAD128     PAD16 PAD16 PAD16 PAD16 PAD16 PAD16 PAD16 PAD16
#define PAD        PAD128 PAD128 PAD128 PAD128 PAD128 PAD128 PAD128 PAD128 PAD128 PAD128 PAD128 PAD128

static char *many_requests(size_t count, size_t *len) {
  const char *one = PADDED_GET;
  size_t n1 = strlen(one);
  char *all = malloc(n1 * count);
  if (!all) return NULL;
  for (size_t i = 0; i < count; i++)
    memcpy(all + i * n1, one, n1);
  *len = n1 * count;
  return all;
}

/* A client that pipelines many requests before reading: the server serves
 * others meanwhile and answers every request in order once the client
 * reads (its queue stays under the stall timeout: --body-timeout 5). */
TH_TEST(http_backpressure) {
  th_proc_init(60);
  struct server s;
  server_start_with(&s, NULL, "5", NULL);
  struct conn c;
  TH_REQUIRE(conn_open(&c, s.port) == 0);
  size_t n1 = strlen(PADDED_GET), total;
  char *all = many_requests(12000, &total);
  TH_REQUIRE(all);
  size_t sent = send_until_blocked(&c, all, total);
  check_alive(&s); /* others are served meanwhile */
  size_t want = sent / n1, seen = 0;
  struct resp r;
  while (seen < want && read_resp(&c, &r, 5000) == 0 && r.status == 200)
    seen++;
  TH_CHECK_EQ_INT(seen, want);
  TH_CHECK(want > 1000);
  free(all);
  conn_close(&c);
  server_stop(&s);
}

/* A client that never reads its answers: once the server's queue for it
 * passes the high-water mark, the server stops reading it (bounded memory)
 * and drops it when the queue has made no progress for the write-stall
 * timeout (--body-timeout 0.6 s). The stall timer runs only over high
 * water, so the drop shows the bound was reached. */
TH_TEST(http_slow_reader_dropped) {
  th_proc_init(60);
  struct server s;
  server_start(&s, NULL);
  struct conn c;
  TH_REQUIRE(conn_open(&c, s.port) == 0);
  int rcv = 4096;
  setsockopt(c.fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
  size_t n1 = strlen(PADDED_GET), total;
  char *all = many_requests(12000, &total);
  TH_REQUIRE(all);
  size_t sent = send_until_blocked(&c, all, total);
  usleep(2000000);
  size_t want = sent / n1, seen = 0;
  struct resp r;
  while (seen < want && read_resp(&c, &r, 6000) == 0)
    seen++;
  TH_CHECK(seen < want);
  free(all);
  conn_close(&c);
  check_alive(&s);
  server_stop(&s);
}

/* Flag mistakes exit 2 and a taken port exits 1, each with a clear line. */
TH_TEST(http_cli_errors) {
  th_proc_init(60);
  char *out = NULL, *err = NULL;
  char *a1[] = {bin(), "frontend", "--port", "99999", NULL};
  TH_CHECK_EQ_INT(th_run(a1, NULL, NULL, 0, 10000, &out, &err), 2);
  TH_CHECK(err && strstr(err, "--port") != NULL);
  free(out);
  free(err);
  char *a2[] = {bin(), "frontend", "--max-body-size", "lots", NULL};
  TH_CHECK_EQ_INT(th_run(a2, NULL, NULL, 0, 10000, &out, &err), 2);
  free(out);
  free(err);
  struct server s;
  server_start(&s, NULL);
  char port[16];
  snprintf(port, sizeof(port), "%d", s.port);
  char *a3[] = {bin(), "frontend", "--port", port, NULL};
  TH_CHECK_EQ_INT(th_run(a3, NULL, NULL, 0, 10000, &out, &err), 1);
  TH_CHECK(err && strstr(err, "address already in use") != NULL);
  free(out);
  free(err);
  check_alive(&s);
  server_stop(&s);
}

/* Random damage to valid request streams, sent in random pieces over many
 * connections, some reset abruptly mid-request: the server must stay up
 * and keep answering (under ASan this also checks its memory safety). */
TH_TEST(http_random_damage) {
  th_proc_init(getenv("LMSERVE_TEST_DAMAGE_ITERS") ? 0 : 90);
  struct server s;
  server_start(&s, NULL);
  static const char *const seeds[] = {
      "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: "
      "27\r\n\r\n{\"prompt\":\"hi\",\"n\":2}     "
      "GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n",
      "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
      "10\r\n{\"messages\":[{\"\r\n1e\r\nrole\":\"user\",\"content\":\"x\"}]}\r\n0\r\n\r\n",
      "GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /metrics HTTP/1.1\r\nHost: t\r\n"
      "Expect: 100-continue\r\n\r\n",
  };
  /* LMSERVE_TEST_DAMAGE_SEED / _ITERS run other or longer sequences */
  const char *seed_env = getenv("LMSERVE_TEST_DAMAGE_SEED");
  const char *iters_env = getenv("LMSERVE_TEST_DAMAGE_ITERS");
  uint64_t rng = seed_env ? strtoull(seed_env, NULL, 0) : 0x9e3779b97f4a7c15ull;
  int iters = iters_env ? atoi(iters_env) : 300;
  char buf[1024];
  for (int it = 0; it < iters; it++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    const char *seed = seeds[(rng >> 33) % 3];
    size_t n = strlen(seed);
    memcpy(buf, seed, n);
    int edits = (int)((rng >> 40) % 4);
    for (int e = 0; e < edits; e++) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      size_t at = (size_t)(rng >> 20) % n;
      switch ((rng >> 50) % 4) {
      case 0: buf[at] ^= (char)(1u << ((rng >> 8) % 8)); break;    /* flip a bit */
      case 1: n = at + 1; break;                                   /* truncate */
      case 2: buf[at] = "\r\n: 0\x00\x7f"[(rng >> 12) % 7]; break; /* a framing byte */
      default:                                                     /* duplicate a span */
        if (n + 40 < sizeof(buf)) {
          memmove(buf + at + 40, buf + at, n - at);
          n += 40;
        }
      }
    }
    struct conn c;
    if (conn_open(&c, s.port) != 0) {
      th_fail(__FILE__, __LINE__, "connect failed at iteration %d", it);
      dump_server_stderr(&s);
      break;
    }
    /* in two pieces, cut at a random place */
    size_t cut = n ? (size_t)(rng >> 7) % n : 0;
    send_all(&c, buf, cut);
    send_all(&c, buf + cut, n - cut);
    if (rng & 1) { /* read whatever comes, briefly */
      struct resp r;
      while (read_resp(&c, &r, 50) == 0) {
      }
    }
    if (rng & 2) { /* reset instead of closing */
      struct linger lg = {1, 0};
      setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    }
    conn_close(&c);
  }
  check_alive(&s);
  server_stop(&s);
}

/* Past --max-connections a new connection gets 503 and is closed; once one
 * closes, a new one is served again. */
TH_TEST(http_max_connections) {
  th_proc_init(60);
  struct server s;
  server_start_with(&s, NULL, "0.6", "3");
  struct conn c[4];
  struct resp r;
  for (int i = 0; i < 3; i++) {
    TH_REQUIRE(conn_open(&c[i], s.port) == 0);
    TH_REQUIRE(do_req(&c[i], GET("/version", ""), &r) == 0);
    TH_CHECK_EQ_INT(r.status, 200);
  }
  TH_REQUIRE(conn_open(&c[3], s.port) == 0);
  TH_REQUIRE(read_resp(&c[3], &r, 5000) == 0);
  TH_CHECK_EQ_INT(r.status, 503);
  TH_CHECK(strstr(r.body, "too many connections") != NULL);
  TH_CHECK(closed_by_server(&c[3], 6000));
  conn_close(&c[3]);
  conn_close(&c[0]);
  /* the server notices the closes soon: retry for a while */
  int status = 0;
  for (int tries = 0; tries < 50 && status != 200; tries++) {
    usleep(100000);
    TH_REQUIRE(conn_open(&c[3], s.port) == 0);
    if (do_req(&c[3], GET("/version", ""), &r) == 0) status = r.status;
    if (status != 200) conn_close(&c[3]);
  }
  TH_CHECK_EQ_INT(status, 200);
  for (int i = 1; i < 4; i++)
    conn_close(&c[i]);
  server_stop(&s);
}
