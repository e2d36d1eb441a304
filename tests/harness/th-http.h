/* th-http.h — one HTTP/1.1 request on a fresh loopback connection, for the
 * integration tests that drive a whole server (richer clients live beside
 * the tests that need keep-alive, pipelining or streams). */
#ifndef LMSERVE_TH_HTTP_H
#define LMSERVE_TH_HTTP_H
#include <stdint.h>

/* A TCP connection to 127.0.0.1:port: the socket, or -1. */
int th_http_connect(int port);

/* Sends `method path` with `body` (JSON, may be NULL) and Connection: close
 * on fd. */
void th_http_send(int fd, const char *method, const char *path, const char *body);

/* A POST of body (JSON) to path on a fresh connection to port, left open for the caller
 * to read the answer from: the socket; the test stops when it cannot connect. */
int th_http_post_open(int port, const char *path, const char *body);

/* Reads fd until the server closes it or timeout_ms passes without data.
 * Returns the status (-1: no answer) and in *out the body, de-chunked
 * (malloc'd, always set; the caller frees it). Leaves fd open. */
int th_http_read(int fd, int timeout_ms, char **out);

/* th_http_send on fd, a fresh connection (-1: none, then the answer is -1 and an empty
 * body), then th_http_read; closes it. */
int th_http_on(int fd, const char *method, const char *path, const char *body, int timeout_ms,
               char **out);

/* th_http_on a fresh connection to 127.0.0.1:port. */
int th_http(int port, const char *method, const char *path, const char *body, int timeout_ms,
            char **out);

/* The sum of the samples of metric `name` in a /metrics text (those whose label set
 * holds the text `label`, when label is not NULL); -1 when there is none. */
double th_metric(const char *text, const char *name, const char *label);

/* The JSON payloads of the "data: " events of an SSE body (de-chunked or raw: chunk-size
 * lines never start with "data: "), at most max of them in out (json_decref each); *done
 * when a [DONE] event came. Returns how many. */
struct json_t;
int th_sse_events(const char *body, struct json_t **out, int max, int *done);
/* json_decref of ev[0..n). */
void th_sse_free(struct json_t **ev, int n);

/* One /v1/completions request of a batch sent all at once (th_http_run_jobs). */
#define TH_MAX_JOBS 64
struct th_job {
  char body[4096]; /* the request's JSON */
  int status;      /* the answer's HTTP status, -1: none */
  char *answer;    /* choices[0] and usage of the answer, canonical JSON (sorted keys,
                      compact), to compare answers as text; NULL without one (malloc'd) */
};
/* POSTs every job's body to /v1/completions on 127.0.0.1:port at once, a thread
 * each (n <= TH_MAX_JOBS), and fills status and answer (a previous answer is
 * freed first). An answer that is not JSON is printed on stderr. */
void th_http_run_jobs(struct th_job *jobs, int n, int port);
/* Frees the jobs' answers. */
void th_http_jobs_free(struct th_job *jobs, int n);
/* A fresh job (no answer) whose body is {"prompt":[2, then len - 1 ids in [1000, 201000)
 * from the generator *x (advanced), and then the request's other members, printf-style
 * ("\"max_tokens\":%d,\"stream\":false"), and the closing brace. */
void th_job_make(struct th_job *job, int len, uint32_t *x, const char *members, ...)
    __attribute__((format(printf, 4, 5)));
/* Checks (test checks) that each of jobs[0..n) was answered 200 and has an answer, saying
 * which did not on stderr; the test stops at one without an answer. */
void th_jobs_check_answered(const struct th_job *jobs, int n);
/* Checks that each of got[0..n) was answered 200 with want's answer, each that was not
 * shown on stderr under `what`. */
void th_jobs_check_same(const struct th_job *want, const struct th_job *got, int n,
                        const char *what);

#endif
