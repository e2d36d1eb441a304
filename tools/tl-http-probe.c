/* tl-http-probe.c — a blocking HTTP(S) GET that reads only the status line. */
#include "tools/tl-http-probe.h"

#include <errno.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "common/cm-time.h"

static int wait_fd(int fd, short events, double deadline) {
  for (;;) {
    double left = deadline - cm_time_s();
    if (left <= 0) return CM_ERR_TIMEOUT;
    struct pollfd p = {fd, events, 0};
    int r = poll(&p, 1, (int)(left * 1000) + 1);
    if (r > 0) return 0;
    if (r < 0 && errno != EINTR) return CM_ERR_IO;
  }
}

/* A connected non-blocking socket to host:port, or a negative cm_err. */
static int connect_to(const char *host, int port, double deadline) {
  char portbuf[16];
  snprintf(portbuf, sizeof(portbuf), "%d", port);
  struct addrinfo hints = {0}, *ai = NULL;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, portbuf, &hints, &ai) != 0 || !ai) return CM_ERR_NOENT;
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int rc = CM_ERR_IO;
  if (fd < 0) goto out;
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) goto out;
  if ((rc = wait_fd(fd, POLLOUT, deadline))) goto out;
  int soerr = 0;
  socklen_t sl = sizeof(soerr);
  rc = getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr != 0 ? CM_ERR_IO : 0;
out:
  freeaddrinfo(ai);
  if (rc && fd >= 0) close(fd);
  return rc ? rc : fd;
}

static int format_request(char *req, size_t size, const char *host, int port, const char *path) {
  int n = snprintf(req, size, "GET %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n", path,
                   host, port);
  return n < 0 || (size_t)n >= size ? CM_ERR_TOOBIG : n;
}

static int parse_status(const char *buf) {
  int status;
  return sscanf(buf, "HTTP/1.%*d %d", &status) == 1 ? status : CM_ERR_PARSE;
}

int tl_http_probe(const char *host, int port, const char *path, int timeout_ms) {
  double deadline = cm_time_s() + timeout_ms / 1000.0;
  int fd = connect_to(host, port, deadline);
  if (fd < 0) return fd;
  char req[512];
  int rc = CM_ERR_IO, n = format_request(req, sizeof(req), host, port, path);
  if (n < 0 || write(fd, req, (size_t)n) != n) goto out;
  char buf[64];
  size_t got = 0;
  while (got < sizeof(buf) - 1) {
    if ((rc = wait_fd(fd, POLLIN, deadline))) goto out;
    ssize_t k = read(fd, buf + got, sizeof(buf) - 1 - got);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) break;
    got += (size_t)k;
    if (memchr(buf, '\n', got)) break;
  }
  buf[got] = 0;
  rc = parse_status(buf);
out:
  close(fd);
  return rc;
}

/* Waits for what an SSL call that returned `r` needs; 0 to call it again. */
static int ssl_wait(SSL *ssl, int fd, int r, double deadline) {
  switch (SSL_get_error(ssl, r)) {
  case SSL_ERROR_WANT_READ: return wait_fd(fd, POLLIN, deadline);
  case SSL_ERROR_WANT_WRITE: return wait_fd(fd, POLLOUT, deadline);
  default: return CM_ERR_IO;
  }
}

int tl_https_probe(const char *host, int port, const char *path, int timeout_ms,
                   const char *cert_file, const char *key_file) {
  double deadline = cm_time_s() + timeout_ms / 1000.0;
  int fd = connect_to(host, port, deadline);
  if (fd < 0) return fd;
  int rc = CM_ERR_IO, r;
  SSL *ssl = NULL;
  SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
  if (!ctx) goto out;
  SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
  if (cert_file && key_file &&
      (SSL_CTX_use_certificate_chain_file(ctx, cert_file) != 1 ||
       SSL_CTX_use_PrivateKey_file(ctx, key_file, SSL_FILETYPE_PEM) != 1))
    goto out;
  if (!(ssl = SSL_new(ctx)) || SSL_set_fd(ssl, fd) != 1) goto out;
  while ((r = SSL_connect(ssl)) != 1)
    if ((rc = ssl_wait(ssl, fd, r, deadline))) goto out;
  char req[512];
  int n = format_request(req, sizeof(req), host, port, path);
  if (n < 0) goto out;
  while ((r = SSL_write(ssl, req, n)) <= 0)
    if ((rc = ssl_wait(ssl, fd, r, deadline))) goto out;
  char buf[64];
  size_t got = 0;
  while (got < sizeof(buf) - 1 && !memchr(buf, '\n', got)) {
    r = SSL_read(ssl, buf + got, (int)(sizeof(buf) - 1 - got));
    if (r > 0) {
      got += (size_t)r;
    } else if (ssl_wait(ssl, fd, r, deadline) != 0) {
      break;
    }
  }
  buf[got] = 0;
  rc = parse_status(buf);
out:
  ERR_clear_error();
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  close(fd);
  return rc;
}
