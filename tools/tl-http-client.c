/* tl-http-client.c — see tl-http-client.h. */
#include "tools/tl-http-client.h"

#include <errno.h>
#include <jansson.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "common/cm-grow.h"

int tl_url_parse(const char *url, struct tl_url *c) {
  const char *u = url;
  if (strncmp(u, "http://", 7) != 0) return CM_ERR_INVAL;
  u += 7;
  const char *slash = strchr(u, '/');
  size_t hostport = slash ? (size_t)(slash - u) : strlen(u);
  const char *colon = memchr(u, ':', hostport);
  size_t hl = colon ? (size_t)(colon - u) : hostport;
  if (hl == 0 || hl >= sizeof(c->host)) return CM_ERR_INVAL;
  memcpy(c->host, u, hl);
  c->host[hl] = 0;
  if (colon) {
    size_t pl = hostport - hl - 1;
    if (pl == 0 || pl >= sizeof(c->port)) return CM_ERR_INVAL;
    memcpy(c->port, colon + 1, pl);
    c->port[pl] = 0;
  } else {
    strcpy(c->port, "80");
  }
  c->base_path[0] = 0;
  if (slash) {
    snprintf(c->base_path, sizeof(c->base_path), "%s", slash);
    size_t bl = strlen(c->base_path);
    while (bl && c->base_path[bl - 1] == '/')
      c->base_path[--bl] = 0;
    if (bl >= 3 && !strcmp(c->base_path + bl - 3, "/v1")) c->base_path[bl - 3] = 0;
  }
  return 0;
}

int tl_url_connect(const struct tl_url *c) {
  struct addrinfo hints = {0}, *ai = NULL;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(c->host, c->port, &hints, &ai) != 0 || !ai) return -1;
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    close(fd);
    fd = -1;
  }
  freeaddrinfo(ai);
  return fd;
}

int tl_write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

int tl_buf_reserve(struct tl_buf *b, size_t extra) {
  return cm_grow(&b->p, &b->cap, b->n + extra + 1, 8192) ? -1 : 0;
}

long tl_buf_read(struct tl_buf *b, int fd) {
  if (tl_buf_reserve(b, 16384)) return -1;
  for (;;) {
    ssize_t k = read(fd, b->p + b->n, b->cap - b->n - 1);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return -1;
    b->n += (size_t)k;
    b->p[b->n] = 0;
    return (long)k;
  }
}

char *tl_http_get(const struct tl_url *c, const char *path, const char *api_key) {
  int fd = tl_url_connect(c);
  if (fd < 0) return NULL;
  char req[2048], auth[600] = "";
  if (api_key) snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", api_key);
  snprintf(req, sizeof(req), "GET %s%s HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n",
           c->base_path, path, c->host, auth);
  struct tl_buf b = {0};
  if (tl_write_all(fd, req, strlen(req)) == 0)
    while (tl_buf_read(&b, fd) > 0) {
    }
  close(fd);
  return b.p;
}

int tl_http_first_model(const struct tl_url *u, const char *api_key, char *out, size_t size) {
  char *r = tl_http_get(u, "/v1/models", api_key);
  if (!r) return CM_ERR_IO;
  const char *b = strstr(r, "\r\n\r\n");
  json_t *j = b ? json_loads(b + 4, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
  const char *id =
      json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
  int rc = id && *id ? 0 : CM_ERR_PARSE;
  if (!rc) snprintf(out, size, "%s", id);
  json_decref(j);
  free(r);
  return rc;
}

int tl_http_status(const char *resp) {
  int status = 0;
  if (!resp || sscanf(resp, "HTTP/1.%*d %d", &status) != 1) return 0;
  return status;
}

double tl_metric_sum(const char *text, const char *name) {
  double total = 0;
  size_t nl = strlen(name);
  for (const char *p = text; p && *p;) {
    const char *eol = strchr(p, '\n');
    if (*p != '#' && !strncmp(p, name, nl) && (p[nl] == ' ' || p[nl] == '{')) {
      const char *sp = p + nl;
      if (*sp == '{') sp = strchr(sp, '}');
      if (sp) total += strtod(sp + 1, NULL);
    }
    p = eol ? eol + 1 : NULL;
  }
  return total;
}
