/* tl-run-batch.c — `lmserve run-batch`: a file of requests in OpenAI's batch
 * format run through the server, as vLLM's `vllm run-batch` does.
 *
 *   lmserve run-batch -i requests.jsonl -o results.jsonl --model DIR [serve's options]
 *   lmserve run-batch -i requests.jsonl -o results.jsonl --url http://HOST:PORT
 *
 * Each input line is a request: {"custom_id": "...", "method": "POST", "url":
 * "/v1/chat/completions", "body": {...}} (any POST endpoint the server takes:
 * completions, chat completions, responses, messages, tokenize). Each output line,
 * in the input's order, is its result: {"id": "batch_req_...", "custom_id": ...,
 * "response": {"status_code": 200, "request_id": ..., "body": {...}}, "error":
 * null}. A request the server refused has its status and error body there (as
 * OpenAI's batches report them); a line that is not a request, or one the server
 * never answered, has "response": null and "error": {"code", "message"}. Blank
 * lines are skipped.
 *
 * Without --url, run-batch starts `lmserve serve` with the options it does not
 * take itself, on a free port of 127.0.0.1, waits for it to be ready, and stops it
 * at the end. At most --max-concurrency requests are in flight.
 *
 * Exit status: 0 once every line has its result (some may be errors), 1 when the
 * input cannot be read, the output written or the server started, or when the
 * server answered none of the requests sent, 2 for a usage mistake. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm-args.h"
#include "common/cm-err.h"
#include "common/cm-time.h"
#include "frontend/fe-api-resp.h"
#include "tools/tl-http-client.h"
#include "tools/tl-main.h"

#define PROG "lmserve run-batch"

struct rb_line {
  char *in;      /* the input line (malloc'd; freed once sent) */
  size_t lineno; /* 1-based, for messages */
  char *out;     /* its result line (malloc'd), NULL until done */
};

struct rb_state {
  struct tl_url u;
  const char *api_key;
  double timeout_s; /* a request unanswered this long is given up */
  long lost;        /* requests sent that got no answer */
  struct rb_line *lines;
  size_t n, next, done;
  long ok, refused;
  pthread_mutex_t mu;
  pthread_cond_t cv;
};

/* {"id", "custom_id", "response", "error"} as one line (malloc'd); takes response. */
static char *result_line(json_t *custom_id, json_t *response, const char *code,
                         const char *message) {
  char id[48];
  fe_api_make_id(id, sizeof(id), "batch_req_");
  json_t *o =
      json_pack("{s:s, s:O, s:o, s:o}", "id", id, "custom_id", custom_id ? custom_id : json_null(),
                "response", response ? response : json_null(), "error",
                code ? json_pack("{s:s, s:s}", "code", code, "message", message) : json_null());
  char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(o);
  return s;
}

/* POST path with body; the status (0: no answer) and the answer's body (malloc'd). */
static int post(const struct rb_state *st, const char *path, const char *body, char **out) {
  *out = NULL;
  int fd = tl_url_connect(&st->u);
  if (fd < 0) return 0;
  struct timeval tv = {(time_t)st->timeout_s,
                       (suseconds_t)((st->timeout_s - (double)(time_t)st->timeout_s) * 1e6)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  char head[1024], auth[600] = "";
  if (st->api_key) snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", st->api_key);
  size_t len = strlen(body);
  snprintf(head, sizeof(head),
           "POST %s%s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n%s"
           "Content-Length: %zu\r\nConnection: close\r\n\r\n",
           st->u.base_path, path, st->u.host, auth, len);
  struct tl_buf b = {0};
  if (tl_write_all(fd, head, strlen(head)) == 0) /* (an early answer, a 413, ends the write) */
    tl_write_all(fd, body, len);
  while (tl_buf_read(&b, fd) > 0) {
  }
  close(fd);
  int status = tl_http_status(b.p);
  const char *at = b.p ? strstr(b.p, "\r\n\r\n") : NULL;
  if (status && at) *out = strdup(at + 4);
  free(b.p);
  return *out ? status : 0;
}

/* The result of input line l. */
static char *run_line(struct rb_state *st, const struct rb_line *l) {
  char msg[256];
  json_error_t je;
  json_t *req = json_loads(l->in, 0, &je);
  if (!json_is_object(req)) {
    snprintf(msg, sizeof(msg), "line %zu: %s", l->lineno,
             req ? "a request must be a JSON object" : je.text);
    json_decref(req);
    return result_line(NULL, NULL, "invalid_request", msg);
  }
  json_t *cid = json_object_get(req, "custom_id"), *body = json_object_get(req, "body");
  const char *method = json_string_value(json_object_get(req, "method"));
  const char *url = json_string_value(json_object_get(req, "url"));
  const char *why = !json_is_string(cid)                ? "'custom_id' must be a string"
                    : !method || strcmp(method, "POST") ? "'method' must be \"POST\""
                    : !url || url[0] != '/' || strchr(url, ' ') || strchr(url, '\r') ||
                            strchr(url, '\n') || strlen(url) > 200
                        ? "'url' must be an endpoint's path, such as \"/v1/chat/completions\""
                    : !json_is_object(body)                         ? "'body' must be an object"
                    : json_is_true(json_object_get(body, "stream")) ? "'body.stream' is not "
                                                                      "supported in a batch"
                                                                    : NULL;
  char *line = NULL;
  if (why) {
    snprintf(msg, sizeof(msg), "line %zu: %s", l->lineno, why);
    line = result_line(json_is_string(cid) ? cid : NULL, NULL, "invalid_request", msg);
  } else {
    char *b = json_dumps(body, JSON_COMPACT);
    char *answer = NULL;
    int status = b ? post(st, url, b, &answer) : 0;
    free(b);
    json_t *ab = answer ? json_loads(answer, 0, NULL) : NULL;
    free(answer);
    if (!status || !ab) {
      snprintf(msg, sizeof(msg), "line %zu: %s", l->lineno,
               status ? "the server's answer is not JSON" : "the server did not answer");
      line = result_line(cid, NULL, "server_error", msg);
      __atomic_add_fetch(&st->lost, 1, __ATOMIC_RELAXED);
    } else {
      char rid[48];
      const char *aid = json_string_value(json_object_get(ab, "id"));
      if (!aid) fe_api_make_id(rid, sizeof(rid), "req_");
      line = result_line(cid,
                         json_pack("{s:i, s:s, s:o}", "status_code", status, "request_id",
                                   aid ? aid : rid, "body", ab),
                         NULL, NULL);
      __atomic_add_fetch(status == 200 ? &st->ok : &st->refused, 1, __ATOMIC_RELAXED);
    }
  }
  json_decref(req);
  return line;
}

static const char no_line[] = "";

static void *worker(void *arg) {
  struct rb_state *st = arg;
  for (;;) {
    pthread_mutex_lock(&st->mu);
    size_t i = st->next < st->n ? st->next++ : SIZE_MAX;
    pthread_mutex_unlock(&st->mu);
    if (i == SIZE_MAX) return NULL;
    char *out = run_line(st, &st->lines[i]);
    pthread_mutex_lock(&st->mu);
    free(st->lines[i].in);
    st->lines[i].in = NULL;
    st->lines[i].out = out ? out : (char *)no_line; /* (out of memory: an empty line) */
    st->done++;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
  }
}

/* The input's non-blank lines into st->lines: 0, or -1 (said why). */
static int read_input(FILE *f, const char *name, struct rb_state *st) {
  size_t cap = 0, lineno = 0;
  char *buf = NULL;
  size_t bcap = 0;
  ssize_t k;
  while ((k = getline(&buf, &bcap, f)) >= 0) {
    lineno++;
    while (k > 0 && (buf[k - 1] == '\n' || buf[k - 1] == '\r'))
      buf[--k] = 0;
    size_t sp = strspn(buf, " \t");
    if (!buf[sp]) continue;
    if (st->n == cap) {
      cap = cap ? 2 * cap : 256;
      struct rb_line *nl = realloc(st->lines, cap * sizeof(*nl));
      if (!nl) break;
      st->lines = nl;
    }
    st->lines[st->n] = (struct rb_line){strdup(buf), lineno, NULL};
    if (!st->lines[st->n].in) break;
    st->n++;
  }
  int bad = ferror(f) || !feof(f);
  free(buf);
  if (bad) fprintf(stderr, PROG ": %s: %s\n", name, ferror(f) ? strerror(errno) : "out of memory");
  return bad ? -1 : 0;
}

/* A free TCP port of 127.0.0.1 (0 when none). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof(a);
  int port = 0;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &al) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

/* `lmserve serve` with args on port; its pid, or -1. */
static pid_t start_serve(char **args, int n_args, int port) {
  char self[PATH_MAX], portbuf[16];
  ssize_t k = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (k <= 0) return -1;
  self[k] = 0;
  snprintf(portbuf, sizeof(portbuf), "%d", port);
  char **argv = calloc((size_t)n_args + 8, sizeof(char *));
  if (!argv) return -1;
  int a = 0;
  argv[a++] = self;
  argv[a++] = "serve";
  for (int i = 0; i < n_args; i++)
    argv[a++] = args[i];
  argv[a++] = "--host";
  argv[a++] = "127.0.0.1";
  argv[a++] = "--port";
  argv[a++] = portbuf;
  argv[a] = NULL;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* serve goes when run-batch does, however it ends */
    if (getppid() != parent) _exit(127);
    signal(SIGPIPE, SIG_DFL);
    unsetenv("LMSERVE_API_KEY");        /* run-batch sends no key to the serve it started */
    dup2(STDERR_FILENO, STDOUT_FILENO); /* serve's words go to stderr: stdout may be the output */
    execv(self, argv);
    _exit(127);
  }
  free(argv);
  return pid;
}

/* Waits until GET /health answers 200 (0), serve ends or the time runs out (-1). */
static int wait_ready(const struct tl_url *u, pid_t *pid, double timeout_s) {
  double t0 = (double)cm_time_ns() / 1e9;
  for (;;) {
    int ws; /* (serve first: a server that took the port it could not bind is not it) */
    if (waitpid(*pid, &ws, WNOHANG) == *pid) {
      *pid = -1; /* (reaped: its number may be another process's by now) */
      fprintf(stderr, PROG ": lmserve serve ended before it was ready\n");
      return -1;
    }
    char *r = tl_http_get(u, "/health", NULL);
    int status = tl_http_status(r);
    free(r);
    if (status == 200) return 0;
    if ((double)cm_time_ns() / 1e9 - t0 > timeout_s) {
      fprintf(stderr, PROG ": lmserve serve was not ready after %.0f s\n", timeout_s);
      return -1;
    }
    cm_time_sleep_ns(200000000ull);
  }
}

/* run-batch's own flags, taking their values: 1 when argv[i] is one (*i moved past
 * its value), 0 when it is serve's, -1 for a flag without its value. */
static int own_flag(int argc, char **argv, int *i, const char **dst[]) {
  static const char *const names[][2] = {
      {"-i", "--input-file"},     {"-o", "--output-file"},     {NULL, "--url"},
      {NULL, "--api-key"},        {NULL, "--max-concurrency"}, {NULL, "--ready-timeout"},
      {NULL, "--request-timeout"}};
  const char *a = argv[*i];
  for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
    size_t nl = strlen(names[k][1]);
    if ((names[k][0] && !strcmp(a, names[k][0])) || !strcmp(a, names[k][1])) {
      if (*i + 1 >= argc) return -1;
      *dst[k] = argv[++*i];
      return 1;
    }
    if (!strncmp(a, names[k][1], nl) && a[nl] == '=') {
      *dst[k] = a + nl + 1;
      return 1;
    }
  }
  return 0;
}

static void usage(FILE *f) {
  fprintf(f, "usage: " PROG " -i FILE -o FILE [--url URL] [--api-key KEY] [--max-concurrency N]\n"
             "                         [--ready-timeout S] [serve's options, e.g. --model DIR]\n\n"
             "Runs a file of requests in OpenAI's batch format (one JSON object a line:\n"
             "custom_id, method \"POST\", url, body) and writes each one's result, in order.\n\n"
             "  -i, --input-file FILE   the requests (- for standard input)\n"
             "  -o, --output-file FILE  the results (- for standard output)\n"
             "  --url URL               a running server (http://HOST:PORT); without it,\n"
             "                          `lmserve serve` is started with the other options\n"
             "  --api-key KEY           the running server's key (with --url)\n"
             "  --max-concurrency N     requests in flight at most (64)\n"
             "  --ready-timeout S       seconds to wait for the started server (1800)\n"
             "  --request-timeout S     seconds a request may take before it is given up (3600)\n");
}

int tl_run_batch_main(int argc, char **argv) {
  const char *in = NULL, *out = NULL, *url = NULL, *key = NULL, *conc_s = "64", *ready_s = "1800",
             *timeout_s = "3600";
  const char **dst[] = {&in, &out, &url, &key, &conc_s, &ready_s, &timeout_s};
  char **serve_args = calloc((size_t)argc + 1, sizeof(char *));
  int n_serve = 0;
  if (!serve_args) return 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      free(serve_args);
      return 0;
    }
    int r = own_flag(argc, argv, &i, dst);
    if (r < 0) {
      fprintf(stderr, PROG ": %s needs a value\n", argv[i]);
      free(serve_args);
      return 2;
    }
    if (!r) serve_args[n_serve++] = argv[i];
  }
  char *e1 = NULL, *e2 = NULL, *e3 = NULL;
  long conc = strtol(conc_s, &e1, 10);
  double ready = strtod(ready_s, &e2), req_timeout = strtod(timeout_s, &e3);
  if (*e1) conc = 0;
  if (*e2) ready = 0;
  if (*e3) req_timeout = 0;
  const char *why = !in                       ? "-i FILE (the requests) is required"
                    : !out                    ? "-o FILE (the results) is required"
                    : conc < 1 || conc > 4096 ? "--max-concurrency must be 1 to 4096"
                    : !(ready > 0)            ? "--ready-timeout must be a positive number"
                    : !(req_timeout > 0 && req_timeout < 1e7)
                        ? "--request-timeout must be a positive number of seconds"
                    : url && n_serve   ? "with --url, serve's options have no use"
                    : !url && key      ? "--api-key is for --url's server"
                    : !url && !n_serve ? "give --url, or serve's options (--model DIR)"
                                       : NULL;
  for (int i = 0; !why && i < n_serve; i++) {
    const char *a = serve_args[i];
    if (!strcmp(a, "--port") || !strncmp(a, "--port=", 7) || !strcmp(a, "--host") ||
        !strncmp(a, "--host=", 7))
      why = "--host and --port are run-batch's own choice (127.0.0.1, a free port)";
    else if (!strcmp(a, "--api-key-file") || !strncmp(a, "--api-key-file=", 15))
      why = "the serve run-batch starts takes no key (it listens on 127.0.0.1 only)";
    else if (!strcmp(a, "--"))
      why = "serve's options follow run-batch's own without a '--'";
  }
  if (why) {
    fprintf(stderr, PROG ": %s\n", why);
    usage(stderr);
    free(serve_args);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);

  struct rb_state st = {.api_key = key, .timeout_s = req_timeout};
  pthread_mutex_init(&st.mu, NULL);
  pthread_cond_init(&st.cv, NULL);
  FILE *fi = strcmp(in, "-") ? fopen(in, "r") : stdin;
  if (!fi) {
    fprintf(stderr, PROG ": %s: %s\n", in, strerror(errno));
    free(serve_args);
    return 1;
  }
  int rc = read_input(fi, in, &st);
  if (fi != stdin) fclose(fi);
  FILE *fo = rc ? NULL : strcmp(out, "-") ? fopen(out, "we") : stdout;
  if (!rc && !fo) {
    fprintf(stderr, PROG ": %s: %s\n", out, strerror(errno));
    rc = -1;
  }

  pid_t pid = -1;
  char urlbuf[64];
  if (!rc && !url) {
    int port = free_port();
    pid = port ? start_serve(serve_args, n_serve, port) : -1;
    snprintf(urlbuf, sizeof(urlbuf), "http://127.0.0.1:%d", port);
    url = urlbuf;
    if (pid < 0) {
      fprintf(stderr, PROG ": could not start lmserve serve\n");
      rc = -1;
    }
  }
  if (!rc && tl_url_parse(url, &st.u)) {
    fprintf(stderr, PROG ": --url must look like http://HOST:PORT, got '%s'\n", url);
    rc = -1;
  }
  if (!rc && pid > 0) rc = wait_ready(&st.u, &pid, ready);

  double t0 = (double)cm_time_ns() / 1e9;
  int n_threads = rc ? 0 : (int)(conc < (long)st.n ? conc : (long)st.n);
  pthread_t *th = calloc((size_t)n_threads + 1, sizeof(*th));
  int started = 0;
  for (; th && started < n_threads; started++)
    if (pthread_create(&th[started], NULL, worker, &st)) break;
  if (!rc && started == 0 && st.n) {
    fprintf(stderr, PROG ": no thread to send the requests\n");
    rc = -1;
  }
  /* the results in the input's order, each as soon as those before it are out */
  int write_failed = 0;
  for (size_t w = 0; !rc && w < st.n; w++) {
    pthread_mutex_lock(&st.mu);
    while (!st.lines[w].out)
      pthread_cond_wait(&st.cv, &st.mu);
    pthread_mutex_unlock(&st.mu);
    if (!write_failed && (fputs(st.lines[w].out, fo) < 0 || fputc('\n', fo) < 0)) write_failed = 1;
    if (st.lines[w].out != no_line) free(st.lines[w].out);
    st.lines[w].out = NULL;
  }
  for (int i = 0; i < started; i++)
    pthread_join(th[i], NULL);
  free(th);
  if (fo && (fflush(fo) || write_failed)) {
    fprintf(stderr, PROG ": %s: %s\n", out, strerror(errno));
    rc = -1;
  }
  if (fo && fo != stdout) fclose(fo);
  if (!rc)
    fprintf(stderr,
            PROG ": %zu requests in %.1f s: %ld answered, %ld refused by the server, %ld "
                 "not sent or not answered\n",
            st.n, (double)cm_time_ns() / 1e9 - t0, st.ok, st.refused,
            (long)st.n - st.ok - st.refused);
  if (!rc && st.lost && !st.ok && !st.refused) { /* every request sent went unanswered */
    fprintf(stderr, PROG ": the server answered none of the %ld requests sent\n", st.lost);
    rc = -1;
  }
  if (pid > 0) { /* serve drains and stops */
    kill(pid, SIGTERM);
    int ws;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
  }
  for (size_t i = 0; i < st.n; i++) {
    free(st.lines[i].in);
    if (st.lines[i].out != no_line) free(st.lines[i].out);
  }
  free(st.lines);
  free(serve_args);
  pthread_mutex_destroy(&st.mu);
  pthread_cond_destroy(&st.cv);
  return rc ? 1 : 0;
}
