/* api-serve.c — the tiny model, `lmserve serve`, and the HTTP client of the
 * OpenAI-API integration tests (see api-serve.h). */
#include "tests/integration/api/api-serve.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/harness/th-http.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

#define AS_POLL_MS  180000 /* longest silence an answer may have */
/* ---- the model and the server ---------------------------------------------- */

static void make_model(struct as_server *s, int max_pos) {
  TH_REQUIRE(th_tmpdir("api", s->dir, sizeof(s->dir)) == 0);
  snprintf(s->model, sizeof(s->model), "%s/m", s->dir);
  snprintf(s->log, sizeof(s->log), "%s/serve.log", s->dir);
  struct th_out o = {0};
  int rc = s->audio       ? th_lmserve(&o, 180000, "make-tiny-model", "--arch", "gemma4", "--audio",
                                       "--vision", "--chat-format", "gemma4", "--out", s->model, "--seed",
                                       "1", "--audio-shape", s->audio_defaults ? "tiny-default" : "tiny",
                                       "--preset", s->gguf ? "tiny-e" : "tiny", NULL)
           : s->vision_g4 ? th_lmserve(&o, 180000, "make-tiny-model", "--arch", "gemma4",
                                       "--vision", "--bidir-vision", "--chat-format", "gemma4",
                                       "--out", s->model, "--seed", "1", NULL)
           : s->vision ? th_lmserve(&o, 180000, "make-tiny-model", "--arch", "gemma3", "--vision",
                                    "--out", s->model, "--seed", "1", NULL)
                       : th_lmserve(&o, 180000, "make-tiny-model", "--arch", "gemma4", "--out",
                                    s->model, "--seed", "1", "--chat-format",
                                    s->gemma4_chat ? "gemma4" : "gemma3", NULL);
  if (rc != 0) fprintf(stderr, "make-tiny-model: %s\n", o.err ? o.err : "");
  th_out_free(&o);
  TH_REQUIRE(rc == 0);
  char path[400];
  snprintf(path, sizeof(path), "%s/tokenizer.json", s->model);
  if (access(path, R_OK) != 0) TH_SKIP("no Gemma tokenizer in the tiny model (run tools/setup)");
  if (s->gguf) { /* dir/g/model.gguf, and the tower as llama.cpp's mmproj file in dir */
    char g[270], out[300];
    snprintf(g, sizeof(g), "%s/g", s->dir);
    snprintf(out, sizeof(out), "%s/model.gguf", g);
    snprintf(s->mmproj, sizeof(s->mmproj), "%s/mmproj-model-f16.gguf", s->dir);
    TH_REQUIRE(mkdir(g, 0755) == 0);
    rc = th_lmserve(&o, 180000, "export-gguf", "--model", s->model, "--out", out, "--mmproj",
                    s->mmproj, NULL);
    if (rc != 0) fprintf(stderr, "export-gguf: %s\n", o.err ? o.err : "");
    th_out_free(&o);
    TH_REQUIRE(rc == 0);
    snprintf(s->model, sizeof(s->model), "%s", out);
  }
  if (max_pos <= 0) return;
  snprintf(path, sizeof(path), "%s/config.json", s->model);
  json_t *cfg = json_load_file(path, 0, NULL);
  TH_REQUIRE(cfg != NULL);
  TH_REQUIRE(json_object_set_new(cfg, "max_position_embeddings", json_integer(max_pos)) == 0);
  TH_REQUIRE(json_dump_file(cfg, path, JSON_INDENT(2)) == 0);
  json_decref(cfg);
}

/* Copies the end of serve's log to stderr; fails the test when any of
 * its processes reported a sanitizer error (ASan builds). */
static void dump_log(const struct as_server *s) {
  FILE *f = fopen(s->log, "r");
  if (!f) return;
  size_t n = 0, k;
  char *all = NULL, chunk[65536];
  while ((k = fread(chunk, 1, sizeof(chunk), f)) > 0) {
    all = realloc(all, n + k + 1);
    TH_REQUIRE(all != NULL);
    memcpy(all + n, chunk, k);
    n += k;
  }
  fclose(f);
  if (!all) return;
  all[n] = 0;
  static const char *const bad[] = {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                                    "runtime error:"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    const char *hit = strstr(all, bad[i]);
    if (hit) th_fail(__FILE__, __LINE__, "serve's log reports a sanitizer error:\n%.4000s", hit);
  }
  fprintf(stderr, "---- end of serve's log (%s) ----\n%s\n----\n", s->log,
          n > 6000 ? all + n - 6000 : all);
  free(all);
}

/* Starts serve once; 0 when it printed its URL. */
static int try_start(struct as_server *s, char *const extra[]) {
  s->port = th_free_port();
  TH_REQUIRE(s->port > 0);
  char port[16], logenv[340];
  snprintf(port, sizeof(port), "%d", s->port);
  snprintf(logenv, sizeof(logenv), "AS_SERVE_LOG=%s", s->log);
  /* serve's stderr goes to a file: nobody has to drain it */
  char *argv[48] = {"/bin/sh",         "-c",     "exec \"$0\" \"$@\" 2>>\"$AS_SERVE_LOG\"",
                    th_lmserve_bin(),  "serve",  "--model",
                    s->model,          "--port", port,
                    "--drain-timeout", "20"};
  int a = 11;
  if (s->api_key) {
    argv[a++] = "--api-key";
    argv[a++] = (char *)s->api_key;
  }
  if (s->gguf) {
    argv[a++] = "--mmproj";
    argv[a++] = s->mmproj;
  }
  for (int i = 0; extra && extra[i] && a < 46; i++)
    argv[a++] = extra[i];
  argv[a] = NULL;
  char *env[] = {logenv, NULL};
  TH_REQUIRE(th_proc_spawn(&s->p, argv, env, 1) == 0);
  if (th_proc_wait_output(&s->p, "lmserve: serving", AS_POLL_MS) == 0) return 0;
  th_proc_stop(&s->p, 5000);
  return -1;
}

void as_start(struct as_server *s, int max_pos, char *const extra[]) {
  const char *key = s->api_key;
  int vision = s->vision, vision_g4 = s->vision_g4, gemma4_chat = s->gemma4_chat, audio = s->audio,
      gguf = s->gguf, audio_defaults = s->audio_defaults;
  void (*prepare)(struct as_server *) = s->prepare;
  memset(s, 0, sizeof(*s));
  s->gguf = gguf;
  s->audio_defaults = audio_defaults;
  s->prepare = prepare;
  s->audio = audio;
  s->api_key = key;
  s->vision = vision;
  s->vision_g4 = vision_g4;
  s->gemma4_chat = gemma4_chat;
  make_model(s, max_pos);
  if (s->prepare) s->prepare(s);
  /* a port taken between free_port and serve's bind: try another */
  for (int i = 0; i < 3; i++)
    if (try_start(s, extra) == 0) return;
  dump_log(s);
  TH_REQUIRE(!"lmserve serve did not start");
}

void as_stop(struct as_server *s) {
  th_proc_check_exit(&s->p, SIGTERM, 60000);
  th_proc_stop(&s->p, 1000);
  dump_log(s);
}

/* ---- HTTP ---------------------------------------------------------------------- */

static int send_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* Connects and sends the whole request; returns the socket or -1. */
static int send_body(const struct as_server *s, const char *method, const char *path,
                     const char *headers, const char *ctype, const char *body, size_t blen) {
  int fd = th_http_connect(s->port);
  if (fd < 0) return -1;
  char auth[300] = "";
  if (!headers && s->api_key)
    snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", s->api_key);
  char head[8192];
  int hn = snprintf(head, sizeof(head),
                    "%s %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n%s%s"
                    "Content-Type: %s\r\nContent-Length: %zu\r\n\r\n",
                    method, path, headers ? headers : "", auth, ctype, blen);
  if (hn < 0 || (size_t)hn >= sizeof(head) || send_all(fd, head, (size_t)hn) != 0 ||
      (blen && send_all(fd, body, blen) != 0)) {
    close(fd);
    return -1;
  }
  return fd;
}

static int send_request(const struct as_server *s, const char *method, const char *path,
                        const char *headers, const char *body) {
  return send_body(s, method, path, headers, "application/json", body, body ? strlen(body) : 0);
}

/* Splits a raw answer into status, head and (de-chunked) body; frees raw. */
static void parse_answer(char *raw, size_t n, struct as_resp *r) {
  memset(r, 0, sizeof(*r));
  r->status = -1;
  r->head = calloc(1, 1);
  r->body = calloc(1, 1);
  char *hend = raw ? strstr(raw, "\r\n\r\n") : NULL;
  if (!hend) {
    free(raw);
    return;
  }
  sscanf(raw, "HTTP/1.%*d %d", &r->status);
  free(r->head);
  r->head = strndup(raw, (size_t)(hend - raw) + 2);
  const char *p = hend + 4, *end = raw + n;
  free(r->body);
  r->body = calloc(1, (size_t)(end - p) + 1);
  char te[64];
  if (as_header(r, "Transfer-Encoding", te, sizeof(te)) && !strcasecmp(te, "chunked")) {
    while (p < end) {
      char *d;
      unsigned long len = strtoul(p, &d, 16);
      d = strstr(d, "\r\n");
      if (!d || len == 0 || d + 2 + len > end) break;
      memcpy(r->body + r->body_len, d + 2, len);
      r->body_len += len;
      p = d + 2 + len + 2;
    }
  } else {
    r->body_len = (size_t)(end - p);
    memcpy(r->body, p, r->body_len);
  }
  free(raw);
}

/* Appends what is readable on fd to *buf; 0 at EOF, 1 on more, -1 on error. */
static int read_some(int fd, char **buf, size_t *n, size_t *cap) {
  if (*n + 65536 + 1 > *cap) {
    *cap = (*n + 65536 + 1) * 2;
    *buf = realloc(*buf, *cap);
    TH_REQUIRE(*buf != NULL);
  }
  ssize_t k = recv(fd, *buf + *n, *cap - *n - 1, 0);
  if (k < 0) return errno == EINTR || errno == EAGAIN ? 1 : -1;
  *n += (size_t)k;
  (*buf)[*n] = 0;
  return k > 0;
}

int as_connect(const struct as_server *s) {
  return th_http_connect(s->port);
}

int as_read_answer(int fd, struct as_resp *r) {
  char *buf = NULL;
  size_t n = 0, cap = 0;
  while (fd >= 0) {
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, AS_POLL_MS) <= 0 || read_some(fd, &buf, &n, &cap) <= 0) break;
  }
  if (fd >= 0) close(fd);
  parse_answer(buf, n, r);
  return r->status;
}

int as_request(const struct as_server *s, const char *method, const char *path, const char *headers,
               const char *body, struct as_resp *r) {
  return as_read_answer(send_request(s, method, path, headers, body), r);
}

int as_post_bytes(const struct as_server *s, const char *path, const char *ctype, const char *body,
                  size_t len, struct as_resp *r) {
  return as_read_answer(send_body(s, "POST", path, NULL, ctype, body, len), r);
}

int as_get(const struct as_server *s, const char *path, struct as_resp *r) {
  return as_request(s, "GET", path, NULL, NULL, r);
}

int as_post(const struct as_server *s, const char *path, const char *body, struct as_resp *r) {
  return as_request(s, "POST", path, NULL, body, r);
}

void as_resp_free(struct as_resp *r) {
  free(r->head);
  free(r->body);
  memset(r, 0, sizeof(*r));
}

json_t *as_json(const struct as_resp *r) {
  return r->body ? json_loadb(r->body, r->body_len, 0, NULL) : NULL;
}

int as_header(const struct as_resp *r, const char *name, char *out, size_t size) {
  size_t nl = strlen(name);
  for (const char *l = r->head ? strstr(r->head, "\r\n") : NULL; l; l = strstr(l + 2, "\r\n")) {
    const char *h = l + 2;
    if (strncasecmp(h, name, nl) || h[nl] != ':') continue;
    h += nl + 1;
    while (*h == ' ')
      h++;
    size_t k = strcspn(h, "\r");
    snprintf(out, size, "%.*s", (int)k, h);
    return 1;
  }
  return 0;
}

int as_post_many(const struct as_server *s, int n, const char *const paths[],
                 const char *const bodies[], struct as_resp out[]) {
  int *fd = calloc((size_t)n, sizeof(*fd));
  char **buf = calloc((size_t)n, sizeof(*buf));
  size_t *len = calloc((size_t)n, sizeof(*len)), *cap = calloc((size_t)n, sizeof(*cap));
  struct pollfd *pf = calloc((size_t)n, sizeof(*pf));
  TH_REQUIRE(fd && buf && len && cap && pf);
  int open = 0;
  for (int i = 0; i < n; i++)
    if ((fd[i] = send_request(s, "POST", paths[i], NULL, bodies[i])) >= 0) open++;
  while (open > 0) {
    for (int i = 0; i < n; i++)
      pf[i] = (struct pollfd){fd[i], POLLIN, 0}; /* fd -1 is ignored */
    if (poll(pf, (nfds_t)n, AS_POLL_MS) <= 0) break;
    for (int i = 0; i < n; i++) {
      if (fd[i] < 0 || !(pf[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      if (read_some(fd[i], &buf[i], &len[i], &cap[i]) <= 0) {
        close(fd[i]);
        fd[i] = -1;
        open--;
      }
    }
  }
  int answered = 0;
  for (int i = 0; i < n; i++) {
    if (fd[i] >= 0) close(fd[i]);
    parse_answer(buf[i], len[i], &out[i]);
    answered += out[i].status > 0;
  }
  free(fd), free(buf), free(len), free(cap), free(pf);
  return answered;
}

int as_stream_open(const struct as_server *s, const char *path, const char *body) {
  int fd = send_request(s, "POST", path, NULL, body);
  char *buf = NULL;
  size_t n = 0, cap = 0;
  while (fd >= 0 && !(buf && strstr(buf, "data: ") && strstr(strstr(buf, "data: "), "\n\n"))) {
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, AS_POLL_MS) <= 0 || read_some(fd, &buf, &n, &cap) <= 0) {
      close(fd);
      fd = -1;
    }
  }
  free(buf);
  return fd;
}

/* ---- answers ------------------------------------------------------------------- */

int as_sse_text(const char *body, int index, char *out, size_t size, json_t **usage) {
  int events = 0, done = 0, bad = 0;
  size_t o = 0;
  out[0] = 0;
  if (usage) *usage = NULL;
  for (const char *q = strstr(body, "data: "); q; q = strstr(q, "data: ")) {
    q += 6;
    const char *e = strstr(q, "\n\n");
    if (!e) return -1;
    if (done) bad = 1; /* nothing may follow [DONE] */
    if (!strncmp(q, "[DONE]", 6)) {
      done = 1;
      continue;
    }
    json_t *ev = json_loadb(q, (size_t)(e - q), 0, NULL);
    if (!json_is_object(ev)) {
      json_decref(ev);
      return -1;
    }
    events++;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(ev, "choices"), i, c) {
      if (json_integer_value(json_object_get(c, "index")) != index) continue;
      json_t *t = json_object_get(c, "text");
      if (!t) t = json_object_get(json_object_get(c, "delta"), "content");
      if (json_is_string(t) && o < size)
        o += (size_t)snprintf(out + o, size - o, "%s", json_string_value(t));
    }
    json_t *u = json_object_get(ev, "usage");
    if (usage && json_is_object(u)) {
      json_decref(*usage);
      *usage = json_incref(u);
    }
    json_decref(ev);
  }
  return done && !bad ? events : -1;
}

double as_metric(const struct as_server *s, const char *name) {
  struct as_resp r;
  double v = NAN;
  size_t nl = strlen(name);
  if (as_get(s, "/metrics", &r) == 200) {
    for (const char *l = r.body; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
      if (strncmp(l, name, nl) || (l[nl] != '{' && l[nl] != ' ')) continue;
      const char *sp = l + strcspn(l, "\n");
      while (sp > l && sp[-1] != ' ')
        sp--;
      v = strtod(sp, NULL);
      break;
    }
  }
  as_resp_free(&r);
  return v;
}

double as_metric_wait(const struct as_server *s, const char *name, double want, int timeout_ms) {
  double v = as_metric(s, name);
  for (int waited = 0; v != want && waited < timeout_ms; waited += 100) {
    usleep(100 * 1000);
    v = as_metric(s, name);
  }
  return v;
}

double as_metric_wait_min(const struct as_server *s, const char *name, double min, int timeout_ms) {
  double v = as_metric(s, name);
  for (int waited = 0; !(v >= min) && waited < timeout_ms; waited += 100) {
    usleep(100 * 1000);
    v = as_metric(s, name);
  }
  return v;
}

void as_check_error_at(const char *file, int line, const struct as_resp *r, int status,
                       const char *param) {
  json_t *j = as_json(r);
  json_t *e = json_object_get(j, "error");
  json_t *msg = json_object_get(e, "message"), *type = json_object_get(e, "type");
  json_t *p = json_object_get(e, "param"), *code = json_object_get(e, "code");
  int ok = r->status == status && json_is_object(e) && json_is_string(msg) &&
           json_string_length(msg) > 0 && json_is_string(type) && json_is_integer(code) &&
           json_integer_value(code) == status &&
           (param ? json_is_string(p) && !strcmp(json_string_value(p), param) : json_is_null(p));
  if (!ok)
    th_fail(file, line, "want %d with param %s in OpenAI's error envelope, got %d: %s", status,
            param ? param : "null", r->status, r->body ? r->body : "");
  json_decref(j);
}

const char *as_jstr(json_t *o, const char *k1, size_t i, const char *k2) {
  json_t *v = json_object_get(json_array_get(json_object_get(o, k1), i), k2);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

long long as_jint(json_t *o, const char *k1, const char *k2) {
  json_t *v = json_object_get(json_object_get(o, k1), k2);
  return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}
