/* tl-http-client.h — the blocking HTTP/1.1 client pieces the load tools share
 * (`bench serve`, `bench soak`): a parsed base URL, a connection, whole writes,
 * a growable buffer, a whole GET, and sums over Prometheus text. */
#ifndef LMSERVE_TL_HTTP_CLIENT_H
#define LMSERVE_TL_HTTP_CLIENT_H
#include <stddef.h>

struct tl_url {
  char host[256];
  char port[16];
  char base_path[256]; /* "" or "/prefix" before /v1 */
};

/* Parses http://HOST[:PORT][/prefix[/v1]]: 0 or CM_ERR_INVAL. */
int tl_url_parse(const char *url, struct tl_url *u);
/* A connected TCP socket (close-on-exec), or -1. */
int tl_url_connect(const struct tl_url *u);
/* Writes all n bytes (EINTR retried): 0 or -1. */
int tl_write_all(int fd, const char *p, size_t n);

struct tl_buf {
  char *p; /* NUL-terminated after each tl_buf_read */
  size_t n, cap;
};
/* Room for extra more bytes (and a NUL): 0 or -1. */
int tl_buf_reserve(struct tl_buf *b, size_t extra);
/* Reads what fd has into b (blocking read): bytes read, 0 at EOF, -1 on error. */
long tl_buf_read(struct tl_buf *b, int fd);

/* GET base_path + path with an optional bearer token; the whole response
 * (status line, headers, body) as a malloc'd string, or NULL. */
char *tl_http_get(const struct tl_url *u, const char *path, const char *api_key);
/* The id of the first model GET /v1/models lists, into out[size]: 0, CM_ERR_IO
 * when the server does not answer, CM_ERR_PARSE when the answer names none. */
int tl_http_first_model(const struct tl_url *u, const char *api_key, char *out, size_t size);
/* The status code of a response text (0 when it has none). */
int tl_http_status(const char *resp);

/* Sum of every sample of a Prometheus metric `name` (any labels) in text. */
double tl_metric_sum(const char *text, const char *name);

#endif
