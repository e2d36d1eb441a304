/* test-http-server.c — fe_server with an in-process handler that answers
 * asynchronously: SSE streams (chat and completion chunks, usage, [DONE])
 * written from a timer, chunked framing on HTTP/1.1 and close-delimited on
 * HTTP/1.0, and the abort callback when the client goes away mid-stream.
 * The loop runs on the test's main thread; a client thread drives it. */
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "common/cm-err.h"
#include "frontend/fe-api.h"
#include "frontend/fe-server.h"
#include "frontend/fe-sse.h"
#include "tests/harness/th-http.h"
#include "tests/harness/th.h"

struct stream_job {
  uv_timer_t timer;
  struct fe_sse_stream sse;
  struct fe_api_request req;
  int sent;
  int aborted;
  int hang;    /* never finish on its own: wait for the client to go away */
  int n_words; /* deltas before the final chunk */
};

struct fixture {
  uv_loop_t loop;
  uv_async_t stop;
  uv_async_t drain;
  int drained; /* fe_server_drain was called */
  struct fe_server *srv;
  int port;
  int aborts;   /* abort callbacks seen */
  int finished; /* streams ended */
};

static struct fixture fx;

static void job_closed(uv_handle_t *h) {
  struct stream_job *j = h->data;
  fe_api_request_free(&j->req);
  free(j);
}

static void job_end(struct stream_job *j) {
  struct fe_api_usage u = {3, (int64_t)j->sent};
  fe_sse_end(&j->sse, &u);
  fx.finished++;
  uv_timer_stop(&j->timer);
  uv_close((uv_handle_t *)&j->timer, job_closed);
}

static void on_abort(void *ud) {
  struct stream_job *j = ud;
  j->aborted = 1;
  __atomic_add_fetch(&fx.aborts, 1, __ATOMIC_SEQ_CST);
}

static void on_tick(uv_timer_t *t) {
  struct stream_job *j = t->data;
  if (j->aborted) { /* the client left: finish to release the connection */
    job_end(j);
    return;
  }
  if (j->hang) {
    struct fe_api_choice c = {0, ".", 1, NULL, NULL, 0, 0};
    fe_sse_send(&j->sse, &c);
    return;
  }
  static const char *const words[] = {"Hel", "lo", " wor", "ld"};
  if (j->sent < j->n_words) {
    const char *w = j->n_words == 4 ? words[j->sent] : "w";
    struct fe_api_choice c = {0, w, strlen(w), NULL, NULL, 0, 0};
    TH_CHECK(fe_sse_send(&j->sse, &c) == 0);
    j->sent++;
    return;
  }
  struct fe_api_choice last = {0, "", 0, "stop", NULL, 0, 0};
  fe_sse_send(&j->sse, &last);
  job_end(j);
}

static void handler(void *ud, struct fe_conn *c, const struct fe_http_request *req,
                    const char *body, size_t len) {
  (void)ud;
  enum fe_api_kind kind =
      req->path_len == 5 && !memcmp(req->path, "/chat", 5) ? FE_API_CHAT : FE_API_COMPLETION;
  if (req->path_len == 5 && !memcmp(req->path, "/hang", 5)) kind = FE_API_COMPLETION;
  if (req->path_len == 6 && !memcmp(req->path, "/large", 6)) { /* past write_hard_limit */
    size_t n = (size_t)20 << 20;
    char *big = malloc(n);
    if (!big) {
      fe_conn_respond_error(c, 500, "out of memory", NULL);
      return;
    }
    memset(big, 'z', n);
    fe_conn_respond(c, 200, "text/plain", NULL, big, n);
    free(big);
    return;
  }
  if (req->path_len == 5 && !memcmp(req->path, "/busy", 5)) {
    fe_conn_respond_error_hdr(c, 429, "queue full", NULL, "Retry-After: 1\r\n");
    return;
  }
  struct fe_api_config cfg = {"m", 100};
  struct stream_job *j = calloc(1, sizeof(*j));
  struct fe_api_error err;
  if (!j || fe_api_parse_request(kind, body, len, &cfg, &j->req, &err) != 0) {
    free(j);
    fe_conn_respond_error(c, 400, "bad test request", NULL);
    return;
  }
  j->hang = req->path_len == 5 && !memcmp(req->path, "/hang", 5);
  j->n_words = req->path_len == 5 && !memcmp(req->path, "/slow", 5) ? 200 : 4;
  fe_conn_set_abort_cb(c, on_abort, j);
  fe_sse_begin(&j->sse, c, &j->req, kind == FE_API_CHAT ? "chatcmpl-" : "cmpl-", 1700000000);
  uv_timer_init(&fx.loop, &j->timer);
  j->timer.data = j;
  uv_timer_start(&j->timer, on_tick, 2, 2);
}

static void on_drain(uv_async_t *a) {
  fe_server_drain(fx.srv);
  __atomic_store_n(&fx.drained, 1, __ATOMIC_SEQ_CST);
  uv_close((uv_handle_t *)a, NULL);
}

static void on_stop(uv_async_t *a) {
  if (!uv_is_closing((uv_handle_t *)&fx.drain)) uv_close((uv_handle_t *)&fx.drain, NULL);
  fe_server_destroy(fx.srv);
  uv_close((uv_handle_t *)a, NULL);
}

/* ---- client side (its own thread) ---------------------------------------- */

/* Reads until EOF or until `until` appears; returns a malloc'd string. */
static char *read_until(int fd, const char *until) {
  size_t cap = 1 << 16, n = 0;
  char *b = malloc(cap);
  for (;;) {
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, 5000) <= 0) break;
    ssize_t k = recv(fd, b + n, cap - n - 1, 0);
    if (k <= 0) break;
    n += (size_t)k;
    b[n] = 0;
    if (until && strstr(b, until)) break;
  }
  b[n] = 0;
  return b;
}

/* Reads and counts bytes until `want` arrived or the peer stops sending. */
static size_t read_count(int fd, size_t want) {
  char buf[65536];
  size_t got = 0;
  while (got < want) {
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, 5000) <= 0) break;
    ssize_t k = recv(fd, buf, sizeof(buf), 0);
    if (k <= 0) break;
    got += (size_t)k;
  }
  return got;
}

static void send_req(int fd, const char *path, const char *version, const char *body) {
  char req[1024];
  int n = snprintf(req, sizeof(req), "POST %s HTTP/%s\r\nHost: t\r\nContent-Length: %zu\r\n\r\n%s",
                   path, version, strlen(body), body);
  send(fd, req, (size_t)n, MSG_NOSIGNAL);
}

static char client_result[256];

static void *client(void *arg) {
  (void)arg;
  client_result[0] = 0;
  /* 1: chat stream on HTTP/1.1 with usage */
  int fd = th_http_connect(fx.port);
  send_req(fd, "/chat", "1.1",
           "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true,\"stream_"
           "options\":{\"include_usage\":true}}");
  char *b = read_until(fd, "0\r\n\r\n");
  json_t *ev[16];
  int done = 0, n = th_sse_events(b, ev, 16, &done);
  const char *fail = NULL;
  if (!strstr(b, "HTTP/1.1 200") || !strstr(b, "Transfer-Encoding: chunked") ||
      !strstr(b, "text/event-stream"))
    fail = "chat: bad head";
  else if (n != 6 || !done)
    fail = "chat: want 6 events and [DONE]";
  else {
    json_t *d0 = json_object_get(json_array_get(json_object_get(ev[0], "choices"), 0), "delta");
    json_t *d1 = json_object_get(json_array_get(json_object_get(ev[1], "choices"), 0), "delta");
    json_t *c4 = json_array_get(json_object_get(ev[4], "choices"), 0);
    if (!json_is_string(json_object_get(d0, "role")) ||
        strcmp(json_string_value(json_object_get(d0, "content")), "Hel"))
      fail = "chat: first delta lacks role or content";
    else if (json_object_get(d1, "role") ||
             strcmp(json_string_value(json_object_get(d1, "content")), "lo"))
      fail = "chat: later delta has a role";
    else if (!json_is_string(json_object_get(c4, "finish_reason")))
      fail = "chat: last choice chunk lacks finish_reason";
    else if (json_array_size(json_object_get(ev[5], "choices")) != 0 ||
             json_integer_value(json_object_get(json_object_get(ev[5], "usage"), "total_tokens")) !=
                 7)
      fail = "chat: bad usage chunk";
    else if (strcmp(json_string_value(json_object_get(ev[0], "object")), "chat.completion.chunk"))
      fail = "chat: bad object";
  }
  th_sse_free(ev, n);
  free(b);
  /* 2: the same connection is kept alive: a completion stream without usage */
  if (!fail) {
    send_req(fd, "/cmpl", "1.1", "{\"prompt\":\"x\",\"stream\":true}");
    b = read_until(fd, "0\r\n\r\n");
    n = th_sse_events(b, ev, 16, &done);
    if (n != 5 || !done)
      fail = "completion: want 5 events and [DONE]";
    else if (strcmp(json_string_value(json_object_get(ev[0], "object")), "text_completion"))
      fail = "completion: bad object";
    th_sse_free(ev, n);
    free(b);
  }
  /* a body large enough that the read buffer grows after the head was
   * parsed: the handler must still see a valid head (path, method) */
  if (!fail) {
    size_t plen = 40000;
    char *big = malloc(plen + 64);
    int k = sprintf(big, "{\"stream\":true,\"prompt\":\"");
    memset(big + k, 'x', plen);
    k += (int)plen;
    k += sprintf(big + k, "\"}");
    char head[256];
    int hn = snprintf(head, sizeof(head),
                      "POST /cmpl HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n", k);
    send(fd, head, (size_t)hn, MSG_NOSIGNAL);
    usleep(20000);
    send(fd, big, (size_t)k, MSG_NOSIGNAL);
    free(big);
    b = read_until(fd, "0\r\n\r\n");
    n = th_sse_events(b, ev, 16, &done);
    if (n != 5 || !done) fail = "large body: want 5 events and [DONE]";
    th_sse_free(ev, n);
    free(b);
  }
  /* one answer larger than write_hard_limit goes out whole */
  if (!fail) {
    send_req(fd, "/large", "1.1", "{}");
    size_t want = ((size_t)20 << 20) + 100; /* body + head */
    if (read_count(fd, want) < want) fail = "large answer: cut short";
  }
  /* and a 429 with Retry-After on it */
  if (!fail) {
    send_req(fd, "/busy", "1.1", "{}");
    b = read_until(fd, "}}");
    if (!strstr(b, "HTTP/1.1 429") || !strstr(b, "Retry-After: 1\r\n") ||
        !strstr(b, "\"code\":429"))
      fail = "429: bad answer";
    free(b);
  }
  close(fd);
  /* 3: HTTP/1.0: no chunking, the body ends when the server closes */
  if (!fail) {
    fd = th_http_connect(fx.port);
    send_req(fd, "/cmpl", "1.0", "{\"prompt\":\"x\",\"stream\":true}");
    b = read_until(fd, NULL);
    n = th_sse_events(b, ev, 16, &done);
    if (strstr(b, "chunked") || n != 5 || !done)
      fail = "http/1.0 stream: want close-delimited events";
    th_sse_free(ev, n);
    free(b);
    close(fd);
  }
  /* 4: a client that leaves mid-stream fires the abort callback */
  if (!fail) {
    fd = th_http_connect(fx.port);
    send_req(fd, "/hang", "1.1", "{\"prompt\":\"x\",\"stream\":true}");
    b = read_until(fd, "data: ");
    free(b);
    close(fd);
    for (int i = 0; i < 200 && __atomic_load_n(&fx.aborts, __ATOMIC_SEQ_CST) == 0; i++)
      usleep(10000);
    if (__atomic_load_n(&fx.aborts, __ATOMIC_SEQ_CST) != 1)
      fail = "no abort callback after disconnect";
  }
  /* 5: draining: a stream in progress runs to its end (then its
   * connection closes); a new request gets 503 with Connection: close */
  if (!fail) {
    fd = th_http_connect(fx.port);
    send_req(fd, "/slow", "1.1", "{\"prompt\":\"x\",\"stream\":true}");
    b = read_until(fd, "data: ");
    free(b);
    uv_async_send(&fx.drain);
    for (int i = 0; i < 2000 && !__atomic_load_n(&fx.drained, __ATOMIC_SEQ_CST); i++)
      usleep(1000);
    int fd2 = th_http_connect(fx.port);
    send_req(fd2, "/cmpl", "1.1", "{\"prompt\":\"x\",\"stream\":true}");
    b = read_until(fd2, NULL);
    if (!strstr(b, "HTTP/1.1 503") || !strstr(b, "Connection: close"))
      fail = "drain: a new request was not answered 503";
    free(b);
    close(fd2);
    b = read_until(fd, NULL); /* EOF: the server closes after the stream */
    if (!fail && (!strstr(b, "data: [DONE]") || !strstr(b, "\r\n0\r\n\r\n")))
      fail = "drain: the stream in progress did not finish";
    free(b);
    close(fd);
  }
  if (fail) snprintf(client_result, sizeof(client_result), "%s", fail);
  uv_async_send(&fx.stop);
  return NULL;
}

TH_TEST(server_sse_streams_abort_and_drain) {
  memset(&fx, 0, sizeof(fx));
  TH_REQUIRE(uv_loop_init(&fx.loop) == 0);
  struct fe_server_limits lim;
  fe_server_limits_default(&lim);
  TH_REQUIRE(fe_server_create(&fx.loop, "127.0.0.1", 0, &lim, handler, NULL, &fx.srv) == 0);
  fx.port = fe_server_port(fx.srv);
  uv_async_init(&fx.loop, &fx.stop, on_stop);
  uv_async_init(&fx.loop, &fx.drain, on_drain);
  pthread_t th;
  TH_REQUIRE(pthread_create(&th, NULL, client, NULL) == 0);
  uv_run(&fx.loop, UV_RUN_DEFAULT);
  pthread_join(th, NULL);
  if (client_result[0]) th_fail(__FILE__, __LINE__, "%s", client_result);
  TH_CHECK_EQ_INT(fx.aborts, 1);
  TH_CHECK_EQ_INT(fx.finished, 6);
  TH_CHECK_EQ_INT(uv_loop_close(&fx.loop), 0);
}

/* ---- the router with an engine plugged into its hooks ------------------------ */

#include "frontend/fe-api-resp.h"
#include "frontend/fe-route.h"

static int hook_submits;

static int hook_ready(void *ud) {
  (void)ud;
  return 1;
}

/* Answers at once with a canned completion; refuses the prompt "fail". */
static int hook_submit(void *ud, struct fe_conn *c, struct fe_api_request *req, const char **why) {
  (void)ud;
  hook_submits++;
  if (req->kind == FE_API_COMPLETION && req->prompts[0].text &&
      !strcmp(req->prompts[0].text, "fail")) {
    *why = "queue full";
    return CM_ERR_FULL;
  }
  struct fe_buf b;
  fe_buf_init(&b, 0);
  struct fe_api_resp_meta m = {"cmpl-x", 1, req->model};
  struct fe_api_choice ch = {0, "ok", 2, "length", NULL, 0, 0};
  struct fe_api_usage u = {5, req->max_tokens};
  if (req->kind == FE_API_CHAT)
    fe_api_write_chat(&b, &m, &ch, 1, &u);
  else
    fe_api_write_completion(&b, &m, &ch, 1, &u);
  fe_conn_respond(c, 200, "application/json", NULL, b.data, b.len);
  fe_buf_free(&b);
  fe_api_request_free(req);
  free(req);
  return 0;
}

static char router_result[256];

static int ask(int fd, const char *req, const char *until, char **out) {
  send(fd, req, strlen(req), MSG_NOSIGNAL);
  *out = read_until(fd, until);
  int status = 0;
  sscanf(*out, "HTTP/1.1 %d", &status);
  return status;
}

/* POSTs body to /v1/completions with the router's key on fd: the status; the answer in
 * *out. */
static int ask_completion(int fd, const char *body, char **out) {
  char req[512];
  snprintf(req, sizeof(req),
           "POST /v1/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer k\r\nContent-Length: "
           "%zu\r\n\r\n%s",
           strlen(body), body);
  return ask(fd, req, "}}", out);
}

static void *router_client(void *arg) {
  (void)arg;
  const char *fail = NULL;
  int fd = th_http_connect(fx.port);
  char *b = NULL;
  if (ask(fd, "GET /health HTTP/1.1\r\nHost: t\r\n\r\n", "\r\n\r\n", &b) != 200)
    fail = "health: want 200 once ready";
  /* /health carries no body: read only the head */
  free(b);
  b = NULL;
  close(fd);
  fd = th_http_connect(fx.port);
  static const char body[] = "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":7}";
  if (!fail && (ask_completion(fd, body, &b) != 200 || !strstr(b, "\"text\":\"ok\"") ||
                !strstr(b, "\"total_tokens\":12") || !strstr(b, "\"model\":\"m\"")))
    fail = "completion through the submit hook";
  free(b);
  b = NULL;
  static const char bad[] = "{\"prompt\":\"hi\",\"max_tokens\":-7}";
  if (!fail && (ask_completion(fd, bad, &b) != 400 || !strstr(b, "max_tokens")))
    fail = "bad request must not reach the hook";
  free(b);
  b = NULL;
  static const char refused[] = "{\"prompt\":\"fail\"}";
  if (!fail && (ask_completion(fd, refused, &b) != 429 || !strstr(b, "queue full") ||
                !strstr(b, "Retry-After: 1\r\n")))
    fail = "a submit refused for a full queue is 429 with Retry-After and its reason";
  free(b);
  b = NULL;
  close(fd);
  if (fail) snprintf(router_result, sizeof(router_result), "%s", fail);
  uv_async_send(&fx.stop);
  return NULL;
}

static void on_router_stop(uv_async_t *a) {
  fe_server_destroy(fx.srv);
  uv_close((uv_handle_t *)a, NULL);
}

TH_TEST(router_engine_hooks) {
  memset(&fx, 0, sizeof(fx));
  hook_submits = 0;
  TH_REQUIRE(uv_loop_init(&fx.loop) == 0);
  struct fe_route_config rc = {"k", "m", 100};
  struct fe_router *router;
  TH_REQUIRE(fe_router_create(&rc, &router, NULL, 0) == 0);
  struct fe_engine_hooks hooks = {hook_ready, hook_submit, NULL};
  fe_router_set_hooks(router, &hooks);
  struct fe_server_limits lim;
  fe_server_limits_default(&lim);
  TH_REQUIRE(fe_server_create(&fx.loop, "127.0.0.1", 0, &lim, fe_router_handle, router, &fx.srv) ==
             0);
  fx.port = fe_server_port(fx.srv);
  uv_async_init(&fx.loop, &fx.stop, on_router_stop);
  pthread_t th;
  TH_REQUIRE(pthread_create(&th, NULL, router_client, NULL) == 0);
  uv_run(&fx.loop, UV_RUN_DEFAULT);
  pthread_join(th, NULL);
  if (router_result[0]) th_fail(__FILE__, __LINE__, "%s", router_result);
  TH_CHECK_EQ_INT(hook_submits, 2);
  const struct fe_metric_ids *ids = fe_router_metric_ids(router);
  TH_CHECK(fe_metrics_value(fe_router_metrics(router), ids->http_client_errors) >= 1);
  fe_router_destroy(router);
  TH_CHECK_EQ_INT(uv_loop_close(&fx.loop), 0);
}
