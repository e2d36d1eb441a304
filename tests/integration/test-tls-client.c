/* test-tls-client.c — the test PKI and the blocking HTTPS client of the TLS
 * tests (see test-tls-client.h). */
#include "tests/integration/test-tls-client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tests/harness/th-http.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

/* ---- certificates ----------------------------------------------------------- */

void tt_make_pki(const char *dir, struct tt_pki *k) {
  char *ver[] = {"openssl", "version", NULL};
  if (th_run(ver, NULL, NULL, 0, 20000, NULL, NULL) != 0)
    TH_SKIP("no `openssl` command (Debian's openssl package): the TLS test did not run");
  char script[4096];
  snprintf(script, sizeof(script),
           "set -e; cd '%s'\n"
           "ossl() { openssl \"$@\" 2>/dev/null; }\n"
           "ossl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
           "-subj '/CN=lmserve test CA'\n"
           "ossl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.pem "
           "-days 2 -subj '/CN=another CA'\n"
           "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > srv.ext\n"
           "ossl req -newkey rsa:2048 -nodes -keyout srv.key -out srv.csr -subj '/CN=localhost'\n"
           "ossl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem "
           "-days 2 -extfile srv.ext\n"
           "ossl req -newkey rsa:2048 -nodes -keyout cli.key -out cli.csr -subj '/CN=client'\n"
           "ossl x509 -req -in cli.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out cli.pem "
           "-days 2\n"
           "ossl req -newkey rsa:2048 -nodes -keyout bad.key -out bad.csr -subj '/CN=stranger'\n"
           "ossl x509 -req -in bad.csr -CA other-ca.pem -CAkey other-ca.key -CAcreateserial "
           "-out bad.pem -days 2\n",
           dir);
  char *argv[] = {"/bin/sh", "-c", script, NULL};
  char *err = NULL;
  int rc = th_run(argv, NULL, NULL, 0, 120000, NULL, &err);
  if (rc != 0) fprintf(stderr, "making the test certificates failed: %s\n", err ? err : "");
  free(err);
  TH_REQUIRE(rc == 0);
  snprintf(k->ca, sizeof(k->ca), "%s/ca.pem", dir);
  snprintf(k->srv_cert, sizeof(k->srv_cert), "%s/srv.pem", dir);
  snprintf(k->srv_key, sizeof(k->srv_key), "%s/srv.key", dir);
  snprintf(k->cli_cert, sizeof(k->cli_cert), "%s/cli.pem", dir);
  snprintf(k->cli_key, sizeof(k->cli_key), "%s/cli.key", dir);
  snprintf(k->bad_cert, sizeof(k->bad_cert), "%s/bad.pem", dir);
  snprintf(k->bad_key, sizeof(k->bad_key), "%s/bad.key", dir);
  snprintf(k->other_ca, sizeof(k->other_ca), "%s/other-ca.pem", dir);
}

/* ---- the client ----------------------------------------------------------- */

double tt_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int tt_tcp_closed(int fd, int timeout_ms, size_t *got) {
  double end = tt_now_s() + timeout_ms / 1000.0;
  size_t n = 0;
  char buf[4096];
  for (;;) {
    int left = (int)((end - tt_now_s()) * 1000);
    if (left <= 0) break;
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, left) <= 0) break;
    ssize_t k = recv(fd, buf, sizeof(buf), 0);
    if (k <= 0) {
      if (got) *got = n;
      return 1;
    }
    n += (size_t)k;
  }
  if (got) *got = n;
  return 0;
}

void tt_close(struct tt_conn *c) {
  if (c->ssl) SSL_free(c->ssl);
  if (c->ctx) SSL_CTX_free(c->ctx);
  if (c->fd >= 0) close(c->fd);
  c->ssl = NULL;
  c->ctx = NULL;
  c->fd = -1;
  ERR_clear_error();
}

int tt_open(struct tt_conn *c, int port, const char *ca, const char *cert, const char *key) {
  c->len = 0;
  c->ssl = NULL;
  c->ctx = SSL_CTX_new(TLS_client_method());
  c->fd = th_http_connect(port);
  if (!c->ctx || c->fd < 0) goto fail;
  SSL_CTX_set_verify(c->ctx, SSL_VERIFY_PEER, NULL);
  if (SSL_CTX_load_verify_locations(c->ctx, ca, NULL) != 1) goto fail;
  if (cert && (SSL_CTX_use_certificate_chain_file(c->ctx, cert) != 1 ||
               SSL_CTX_use_PrivateKey_file(c->ctx, key, SSL_FILETYPE_PEM) != 1))
    goto fail;
  struct timeval tv = {10, 0}; /* a blocking client that cannot hang the test */
  setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (!(c->ssl = SSL_new(c->ctx)) || SSL_set_fd(c->ssl, c->fd) != 1) goto fail;
  SSL_set_tlsext_host_name(c->ssl, "localhost");
  SSL_set1_host(c->ssl, "127.0.0.1");
  if (SSL_connect(c->ssl) != 1) goto fail;
  return 0;
fail:
  tt_close(c);
  return -1;
}

int tt_send(struct tt_conn *c, const char *s) {
  size_t n = strlen(s);
  while (n) {
    int k = SSL_write(c->ssl, s, (int)n);
    if (k <= 0) return -1;
    s += k;
    n -= (size_t)k;
  }
  return 0;
}

/* Reads more into c->buf within the deadline: bytes read, 0 on close, -1 on
 * timeout or error. */
static int fill(struct tt_conn *c, double end) {
  if (c->len >= sizeof(c->buf)) return -1;
  if (SSL_pending(c->ssl) == 0) {
    int left = (int)((end - tt_now_s()) * 1000);
    struct pollfd pf = {c->fd, POLLIN, 0};
    if (left <= 0 || poll(&pf, 1, left) <= 0) return -1;
  }
  int k = SSL_read(c->ssl, c->buf + c->len, (int)(sizeof(c->buf) - c->len));
  if (k > 0) {
    c->len += (size_t)k;
    return k;
  }
  int e = SSL_get_error(c->ssl, k);
  ERR_clear_error();
  if (e == SSL_ERROR_WANT_READ) return fill(c, end); /* a record without data (tickets) */
  return e == SSL_ERROR_ZERO_RETURN || e == SSL_ERROR_SYSCALL ? 0 : -1;
}

static ssize_t fill_for(void *c, int timeout_ms) {
  return fill(c, tt_now_s() + timeout_ms / 1000.0);
}

int tt_read_resp(struct tt_conn *c, struct resp *r, int timeout_ms) {
  struct hc_source src = {c->buf, &c->len, sizeof(c->buf), fill_for, c};
  return hc_parse_resp(&src, r, timeout_ms);
}

int tt_closed_by_server(struct tt_conn *c, int timeout_ms) {
  double end = tt_now_s() + timeout_ms / 1000.0;
  for (;;) {
    int k = fill(c, end);
    if (k == 0) return 1;
    if (k < 0) return tt_now_s() < end; /* an error before the deadline: closed */
    c->len = 0;                         /* data instead: discard and go on */
  }
}
