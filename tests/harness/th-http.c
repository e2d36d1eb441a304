/* th-http.c — see th-http.h. */
#include "tests/harness/th-http.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/harness/th.h"

int th_http_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void th_http_send(int fd, const char *method, const char *path, const char *body) {
  char head[512];
  size_t blen = body ? strlen(body) : 0;
  int hn = snprintf(head, sizeof(head),
                    "%s %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: "
                    "application/json\r\nContent-Length: %zu\r\n\r\n",
                    method, path, blen);
  send(fd, head, (size_t)hn, MSG_NOSIGNAL);
  if (blen) send(fd, body, blen, MSG_NOSIGNAL);
}

int th_http_post_open(int port, const char *path, const char *body) {
  int fd = th_http_connect(port);
  TH_REQUIRE(fd >= 0);
  th_http_send(fd, "POST", path, body);
  return fd;
}

int th_http_read(int fd, int timeout_ms, char **out) {
  size_t cap = 1 << 16, n = 0;
  char *b = malloc(cap);
  for (;;) {
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, timeout_ms) <= 0) break;
    if (n + 4096 > cap) b = realloc(b, cap *= 2);
    ssize_t k = recv(fd, b + n, cap - n - 1, 0);
    if (k <= 0) break;
    n += (size_t)k;
  }
  b[n] = 0;
  int status = -1;
  sscanf(b, "HTTP/1.%*d %d", &status);
  *out = calloc(1, n + 1);
  char *hend = strstr(b, "\r\n\r\n");
  if (hend) {
    const char *p = hend + 4;
    const char *te = strstr(b, "Transfer-Encoding: chunked");
    if (te && te < hend) {
      size_t o = 0;
      while (p < b + n) {
        unsigned long len = strtoul(p, NULL, 16);
        const char *d = strstr(p, "\r\n");
        if (!d || len == 0) break;
        memcpy(*out + o, d + 2, len);
        o += len;
        p = d + 2 + len + 2;
      }
    } else {
      memcpy(*out, p, (size_t)(b + n - p));
    }
  }
  free(b);
  return status;
}

int th_http_on(int fd, const char *method, const char *path, const char *body, int timeout_ms,
               char **out) {
  if (fd < 0) {
    *out = calloc(1, 1);
    return -1;
  }
  th_http_send(fd, method, path, body);
  int status = th_http_read(fd, timeout_ms, out);
  close(fd);
  return status;
}

int th_http(int port, const char *method, const char *path, const char *body, int timeout_ms,
            char **out) {
  return th_http_on(th_http_connect(port), method, path, body, timeout_ms, out);
}

double th_metric(const char *text, const char *name, const char *label) {
  double total = -1;
  size_t nl = strlen(name);
  for (const char *p = text; p && *p;) {
    const char *eol = strchr(p, '\n');
    if (*p != '#' && !strncmp(p, name, nl) && (p[nl] == ' ' || p[nl] == '{')) {
      const char *v = p + nl, *end = p[nl] == '{' ? strchr(p + nl, '}') : v;
      const char *l = label ? strstr(p + nl, label) : NULL;
      if (end && (!label || (l && l < end)))
        total = (total < 0 ? 0 : total) + strtod(end + (end == v ? 0 : 1), NULL);
    }
    p = eol ? eol + 1 : NULL;
  }
  return total;
}

int th_sse_events(const char *body, json_t **out, int max, int *done) {
  int n = 0;
  *done = 0;
  for (const char *p = strstr(body, "data: "); p; p = strstr(p + 6, "data: ")) {
    const char *e = strstr(p, "\n\n");
    if (!e) break;
    if (!strncmp(p + 6, "[DONE]", 6)) {
      *done = 1;
      continue;
    }
    if (n < max) out[n++] = json_loadb(p + 6, (size_t)(e - p - 6), 0, NULL);
  }
  return n;
}

void th_sse_free(json_t **ev, int n) {
  for (int i = 0; i < n; i++)
    json_decref(ev[i]);
}

/* ---- a batch of completions ------------------------------------------------------ */

struct job_arg {
  struct th_job *job;
  int port;
};

static void *run_job(void *arg) {
  struct job_arg *a = arg;
  struct th_job *j = a->job;
  char *b = NULL;
  j->status = th_http(a->port, "POST", "/v1/completions", j->body, 240000, &b);
  json_t *r = b ? json_loads(b, 0, NULL) : NULL;
  if (!r && b && *b) fprintf(stderr, "status %d: %s\n", j->status, b);
  free(b);
  if (r) {
    json_t *keep =
        json_pack("{s:O?,s:O?}", "choice", json_array_get(json_object_get(r, "choices"), 0),
                  "usage", json_object_get(r, "usage"));
    j->answer = keep ? json_dumps(keep, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
    json_decref(keep);
    json_decref(r);
  }
  return NULL;
}

void th_http_run_jobs(struct th_job *jobs, int n, int port) {
  pthread_t th[TH_MAX_JOBS];
  struct job_arg args[TH_MAX_JOBS];
  int started = 0;
  if (n > TH_MAX_JOBS) n = TH_MAX_JOBS;
  for (int i = 0; i < n; i++) {
    jobs[i].status = -1;
    free(jobs[i].answer);
    jobs[i].answer = NULL;
    args[i] = (struct job_arg){&jobs[i], port};
    if (pthread_create(&th[i], NULL, run_job, &args[i]) != 0) break; /* status stays -1 */
    started++;
  }
  for (int i = 0; i < started; i++)
    pthread_join(th[i], NULL);
}

void th_job_make(struct th_job *job, int len, uint32_t *x, const char *members, ...) {
  char *p = job->body;
  size_t cap = sizeof(job->body);
  int o = snprintf(p, cap, "{\"prompt\":[2");
  for (int t = 1; t < len && (size_t)o < cap; t++) {
    *x = *x * 1664525u + 1013904223u;
    o += snprintf(p + o, cap - (size_t)o, ",%u", 1000 + (*x >> 8) % 200000);
  }
  if ((size_t)o < cap) o += snprintf(p + o, cap - (size_t)o, "],");
  if ((size_t)o < cap) {
    va_list ap;
    va_start(ap, members);
    o += vsnprintf(p + o, cap - (size_t)o, members, ap);
    va_end(ap);
  }
  if ((size_t)o < cap) snprintf(p + o, cap - (size_t)o, "}");
  job->answer = NULL;
}

void th_jobs_check_answered(const struct th_job *jobs, int n) {
  for (int i = 0; i < n; i++) {
    if (jobs[i].status != 200)
      fprintf(stderr, "request %d: %d %s\n", i, jobs[i].status,
              jobs[i].answer ? jobs[i].answer : "");
    TH_CHECK_EQ_INT(jobs[i].status, 200);
    TH_REQUIRE(jobs[i].answer != NULL);
  }
}

void th_jobs_check_same(const struct th_job *want, const struct th_job *got, int n,
                        const char *what) {
  int same = 0;
  for (int i = 0; i < n; i++) {
    TH_CHECK_EQ_INT(got[i].status, 200);
    if (got[i].answer && !strcmp(got[i].answer, want[i].answer))
      same++;
    else
      fprintf(stderr, "%s, request %d:\n  want %s\n  got  %s\n", what, i, want[i].answer,
              got[i].answer ? got[i].answer : "(none)");
  }
  TH_CHECK_EQ_INT(same, n);
}

void th_http_jobs_free(struct th_job *jobs, int n) {
  for (int i = 0; i < n; i++) {
    free(jobs[i].answer);
    jobs[i].answer = NULL;
  }
}
