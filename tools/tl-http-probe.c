/* tl-http-probe.c — a blocking HTTP GET that reads only the status line. */
#include "tools/tl-http-probe.h"

#include <errno.h>
#include <netdb.h>
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

int tl_http_probe(const char *host, int port, const char *path, int timeout_ms) {
  double deadline = cm_time_s() + timeout_ms / 1000.0;
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
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr != 0) {
    rc = CM_ERR_IO;
    goto out;
  }
  char req[512];
  int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n",
                   path, host, port);
  if (n < 0 || (size_t)n >= sizeof(req) || write(fd, req, (size_t)n) != n) {
    rc = CM_ERR_IO;
    goto out;
  }
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
  int status;
  if (sscanf(buf, "HTTP/1.%*d %d", &status) == 1) rc = status;
  else rc = CM_ERR_PARSE;
out:
  if (fd >= 0) close(fd);
  freeaddrinfo(ai);
  return rc;
}
