/* test-tls.c — `lmserve frontend` over HTTPS (--ssl-keyfile, --ssl-certfile,
 * --ssl-ca-certs) with certificates made at test time: keep-alive and
 * pipelining, client certificates required and verified, and the hostile
 * clients of test-http-limits.c over TLS (garbage for a handshake, plain
 * HTTP to the TLS port, slowloris handshakes and heads, the connection
 * limit). Every case ends by checking the server still serves. Start-up
 * errors (missing or mismatched files) are configuration errors. */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/harness/th-http.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/test-http-client.h"
#include "tests/integration/test-tls-client.h"

#define MODELS "GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n"

static struct tt_pki pki;

static void make_pki(void) {
  char dir[256];
  TH_REQUIRE(th_tmpdir("tls", dir, sizeof(dir)) == 0);
  tt_make_pki(dir, &pki);
}

/* `lmserve frontend` on a free port over HTTPS with short limits (header
 * timeout 0.6 s, idle 0.8 s), with --ssl-ca-certs ca and --max-connections
 * max_conns when given. */
static void start(struct server *s, const char *ca, const char *max_conns) {
  char *flags[16] = {"--ssl-keyfile",    pki.srv_key, "--ssl-certfile", pki.srv_cert,
                     "--header-timeout", "0.6",       "--idle-timeout", "0.8",
                     "--body-timeout",   "0.6"};
  char **f = flags + 10;
  if (ca) *f++ = "--ssl-ca-certs", *f++ = (char *)ca;
  if (max_conns) *f++ = "--max-connections", *f++ = (char *)max_conns;
  hc_frontend_start(s, "https://127.0.0.1:", flags);
}

/* The server's stderr so far (malloc'd). */
static char *server_log(struct server *s) {
  size_t n = 0;
  char *e = th_read_all(s->p.err_fd, 300, &n);
  return e ? e : strdup("");
}

/* A fresh HTTPS connection gets /v1/models. */
static void check_alive(struct server *s, const char *cert, const char *key) {
  struct tt_conn c;
  struct resp r;
  TH_REQUIRE(tt_open(&c, s->port, pki.ca, cert, key) == 0);
  TH_REQUIRE(tt_send(&c, MODELS) == 0);
  TH_REQUIRE(tt_read_resp(&c, &r, 5000) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  TH_CHECK(strstr(r.body, "\"tiny\"") != NULL);
  tt_close(&c);
}

TH_TEST(tls_keepalive_and_pipelining) {
  th_proc_init(120);
  make_pki();
  struct server s;
  start(&s, NULL, NULL);
  struct tt_conn c;
  struct resp r;
  TH_REQUIRE(tt_open(&c, s.port, pki.ca, NULL, NULL) == 0);
  /* keep-alive: several requests, one connection */
  for (int i = 0; i < 5; i++) {
    TH_REQUIRE(tt_send(&c, MODELS) == 0);
    TH_REQUIRE(tt_read_resp(&c, &r, 5000) == 0);
    TH_CHECK_EQ_INT(r.status, 200);
    TH_CHECK(strstr(r.body, "\"object\":\"list\"") != NULL);
  }
  /* pipelined: three requests in one TLS write, answered in order */
  TH_REQUIRE(tt_send(&c, MODELS "GET /version HTTP/1.1\r\nHost: t\r\n\r\n"
                                "GET /nope HTTP/1.1\r\nHost: t\r\n\r\n") == 0);
  TH_REQUIRE(tt_read_resp(&c, &r, 5000) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  TH_CHECK(strstr(r.body, "\"tiny\"") != NULL);
  TH_REQUIRE(tt_read_resp(&c, &r, 5000) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  TH_CHECK(strstr(r.body, "version") != NULL);
  TH_REQUIRE(tt_read_resp(&c, &r, 5000) == 0);
  TH_CHECK_EQ_INT(r.status, 404);
  /* a body over TLS (chunked): a 400 for bad JSON, the connection kept */
  TH_REQUIRE(tt_send(&c, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: "
                         "chunked\r\n\r\n5\r\n{nope\r\n0\r\n\r\n") == 0);
  TH_REQUIRE(tt_read_resp(&c, &r, 5000) == 0);
  TH_CHECK_EQ_INT(r.status, 400);
  /* a large answer: many pipelined requests, read only after all are sent */
  char many[64 * (sizeof(MODELS) - 1) + 1] = "";
  for (int i = 0; i < 64; i++)
    strcat(many, MODELS);
  TH_REQUIRE(tt_send(&c, many) == 0);
  for (int i = 0; i < 64; i++) {
    TH_REQUIRE(tt_read_resp(&c, &r, 5000) == 0);
    TH_CHECK_EQ_INT(r.status, 200);
  }
  /* idle keep-alive closes after --idle-timeout, with close_notify or FIN */
  double t0 = tt_now_s();
  TH_CHECK(tt_closed_by_server(&c, 6000));
  TH_CHECK(tt_now_s() - t0 >= 0.6);
  tt_close(&c);
  /* a client that does not trust the server's CA gives up */
  TH_CHECK(tt_open(&c, s.port, pki.other_ca, NULL, NULL) != 0);
  check_alive(&s, NULL, NULL);
  hc_server_stop(&s);
}

/* The hostile clients of test-http-limits.c, over TLS. */
TH_TEST(tls_hostile_clients) {
  th_proc_init(120);
  make_pki();
  struct server s;
  start(&s, NULL, "4");
  /* garbage instead of a ClientHello: closed, a log line */
  int fd = th_http_connect(s.port);
  TH_REQUIRE(fd >= 0);
  const char junk[] = "\x16\x03\x01\x00\x05hello, this is not TLS at all\r\n\r\n";
  TH_REQUIRE(send(fd, junk, sizeof(junk) - 1, MSG_NOSIGNAL) == (ssize_t)sizeof(junk) - 1);
  TH_CHECK(tt_tcp_closed(fd, 3000, NULL));
  close(fd);
  check_alive(&s, NULL, NULL);
  /* plain HTTP to the TLS port: no HTTP answer, closed, a clear log line */
  fd = th_http_connect(s.port);
  TH_REQUIRE(fd >= 0);
  TH_REQUIRE(send(fd, MODELS, strlen(MODELS), MSG_NOSIGNAL) == (ssize_t)strlen(MODELS));
  size_t got = 0;
  TH_CHECK(tt_tcp_closed(fd, 3000, &got));
  close(fd);
  check_alive(&s, NULL, NULL);
  char *log = server_log(&s);
  TH_CHECK(strstr(log, "sent plain HTTP to the TLS port") != NULL);
  TH_CHECK(strstr(log, "TLS handshake failed") != NULL);
  free(log);
  /* a complete handshake, then bytes that are no TLS record: closed, logged */
  struct tt_conn bad;
  TH_REQUIRE(tt_open(&bad, s.port, pki.ca, NULL, NULL) == 0);
  TH_REQUIRE(send(bad.fd, junk, sizeof(junk) - 1, MSG_NOSIGNAL) == (ssize_t)sizeof(junk) - 1);
  TH_CHECK(tt_tcp_closed(bad.fd, 3000, NULL));
  tt_close(&bad);
  check_alive(&s, NULL, NULL);
  log = server_log(&s);
  TH_CHECK(strstr(log, "after a bad TLS record") != NULL);
  free(log);
  /* slowloris handshake: a ClientHello dribbled byte by byte is cut off by
   * the header timeout (0.6 s) although bytes keep arriving */
  fd = th_http_connect(s.port);
  TH_REQUIRE(fd >= 0);
  double t0 = tt_now_s();
  const char hello[] = "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03";
  int closed = 0;
  for (size_t i = 0; i < sizeof(hello) - 1 && !closed; i++) {
    if (send(fd, hello + i, 1, MSG_NOSIGNAL) != 1) break;
    closed = tt_tcp_closed(fd, 200, NULL);
  }
  if (!closed) closed = tt_tcp_closed(fd, 6000, NULL);
  TH_CHECK(closed);
  TH_CHECK(tt_now_s() - t0 >= 0.5 && tt_now_s() - t0 < 6.0);
  close(fd);
  /* connected and silent: closed after the header timeout */
  fd = th_http_connect(s.port);
  TH_REQUIRE(fd >= 0);
  t0 = tt_now_s();
  TH_CHECK(tt_tcp_closed(fd, 6000, NULL));
  TH_CHECK(tt_now_s() - t0 >= 0.5);
  close(fd);
  /* slowloris head after the handshake: 408 over TLS, then closed */
  struct tt_conn c;
  struct resp r;
  TH_REQUIRE(tt_open(&c, s.port, pki.ca, NULL, NULL) == 0);
  const char *part = "GET /version HTTP/1.1\r\nHost: t\r\nX-A: 1\r\n";
  int answered = 0;
  for (size_t i = 0; part[i] && !answered; i++) {
    char one[2] = {part[i], 0};
    if (tt_send(&c, one) != 0) break;
    struct pollfd pf = {c.fd, POLLIN, 0};
    answered = poll(&pf, 1, 100) > 0;
  }
  TH_REQUIRE(tt_read_resp(&c, &r, 6000) == 0);
  TH_CHECK_EQ_INT(r.status, 408);
  TH_CHECK(tt_closed_by_server(&c, 6000));
  tt_close(&c);
  /* a body slower than --body-timeout: 408 */
  TH_REQUIRE(tt_open(&c, s.port, pki.ca, NULL, NULL) == 0);
  TH_REQUIRE(
      tt_send(&c, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 9\r\n\r\n{") == 0);
  TH_REQUIRE(tt_read_resp(&c, &r, 6000) == 0);
  TH_CHECK_EQ_INT(r.status, 408);
  tt_close(&c);
  /* the connection limit (4): the fifth gets 503 once its handshake is done */
  struct tt_conn held[4];
  for (int i = 0; i < 4; i++)
    TH_REQUIRE(tt_open(&held[i], s.port, pki.ca, NULL, NULL) == 0);
  TH_REQUIRE(tt_open(&c, s.port, pki.ca, NULL, NULL) == 0);
  TH_REQUIRE(tt_read_resp(&c, &r, 5000) == 0);
  TH_CHECK_EQ_INT(r.status, 503);
  tt_close(&c);
  for (int i = 0; i < 4; i++)
    tt_close(&held[i]);
  usleep(200000);
  check_alive(&s, NULL, NULL);
  /* drain: an idle keep-alive connection is closed, the process exits 0 */
  TH_REQUIRE(tt_open(&c, s.port, pki.ca, NULL, NULL) == 0);
  TH_REQUIRE(tt_send(&c, MODELS) == 0);
  TH_REQUIRE(tt_read_resp(&c, &r, 5000) == 0);
  th_proc_signal(&s.p, SIGTERM);
  TH_CHECK(tt_closed_by_server(&c, 5000));
  tt_close(&c);
  TH_CHECK_EQ_INT(th_proc_check_exit(&s.p, 0, 5000), 0);
  th_proc_stop(&s.p, 1000);
}

/* --ssl-ca-certs: a client must present a certificate the CA signed. */
TH_TEST(tls_client_certificates) {
  th_proc_init(120);
  make_pki();
  struct server s;
  start(&s, pki.ca, NULL);
  struct tt_conn c;
  struct resp r;
  /* no certificate: refused (under TLS 1.3 the client learns it on its
   * first read) */
  int ok = tt_open(&c, s.port, pki.ca, NULL, NULL) == 0 && tt_send(&c, MODELS) == 0 &&
           tt_read_resp(&c, &r, 5000) == 0;
  TH_CHECK(!ok);
  if (c.fd >= 0) tt_close(&c);
  /* a certificate from a CA the server does not trust: refused */
  ok = tt_open(&c, s.port, pki.ca, pki.bad_cert, pki.bad_key) == 0 && tt_send(&c, MODELS) == 0 &&
       tt_read_resp(&c, &r, 5000) == 0;
  TH_CHECK(!ok);
  if (c.fd >= 0) tt_close(&c);
  /* the right one: served */
  check_alive(&s, pki.cli_cert, pki.cli_key);
  char *log = server_log(&s);
  TH_CHECK(strstr(log, "client sent no certificate") != NULL);
  TH_CHECK(strstr(log, "client certificate:") != NULL);
  free(log);
  hc_server_stop(&s);
}

/* Bad files are configuration errors (exit 2) with the reason. */
TH_TEST(tls_config_errors) {
  th_proc_init(120);
  make_pki();
  const struct th_refusal cases[] = {
      {{"frontend", "--port", "0", "--ssl-keyfile", pki.srv_key},
       2,
       "needs both --ssl-keyfile and --ssl-certfile"},
      {{"frontend", "--port", "0", "--ssl-keyfile", "/nonexistent/key.pem", "--ssl-certfile",
        pki.srv_cert},
       2,
       "--ssl-keyfile /nonexistent/key.pem"},
      {{"frontend", "--port", "0", "--ssl-keyfile", pki.srv_key, "--ssl-certfile",
        "/nonexistent/cert.pem"},
       2,
       "--ssl-certfile /nonexistent/cert.pem"},
      {{"frontend", "--port", "0", "--ssl-keyfile", pki.cli_key, "--ssl-certfile", pki.srv_cert},
       2,
       "does not match"},
      {{"frontend", "--port", "0", "--ssl-keyfile", pki.srv_key, "--ssl-certfile", pki.srv_cert,
        "--ssl-ca-certs", pki.srv_key},
       2,
       "--ssl-ca-certs"},
      {{"serve", "--port", "1", "--ssl-keyfile", pki.cli_key, "--ssl-certfile", pki.srv_cert},
       2,
       "does not match"},
  };
  th_lmserve_refusals(cases, sizeof(cases) / sizeof(cases[0]), 20000);
}
