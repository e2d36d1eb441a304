/* test-http.c — `lmserve frontend` driven over real sockets: routes, auth,
 * keep-alive, pipelining, chunked bodies, 100-continue, HEAD, errors the
 * server answers itself (400, 413, 431, 501, 505), HTTP/1.0, flag errors,
 * CORS (preflights and the headers of answers to other origins, with the
 * defaults and with lists), and a clean exit on SIGTERM. After every bad request the server must go
 * on serving. The client and the server starter are in test-http-client.c. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/test-http-client.h"

TH_TEST(http_routes_keepalive) {
  th_proc_init(60);
  struct server s;
  struct conn c;
  hc_server_open(&s, "sekret", &c);
  struct resp r;
  /* all on one keep-alive connection, good and bad requests mixed */
  TH_REQUIRE(hc_do_req(&c, GET("/health", ""), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 503);
  TH_CHECK(strstr(r.body, "\"error\"") && strstr(r.body, "\"code\":503"));
  /* HEAD: the same status and Content-Length, no body; the connection
   * goes on (a body would be read as the next answer) */
  TH_REQUIRE(hc_send_str(&c, "HEAD /health HTTP/1.1\r\nHost: t\r\n\r\n") == 0);
  char *e;
  while (!(e = memmem(c.buf, c.len, "\r\n\r\n", 4)))
    TH_REQUIRE(hc_fill(&c, 5000) > 0);
  TH_CHECK(strncmp(c.buf, "HTTP/1.1 503", 12) == 0);
  TH_CHECK(memmem(c.buf, c.len, "Content-Length: 9", 17) != NULL);
  hc_consume(&c, (size_t)(e - c.buf) + 4);
  TH_REQUIRE(hc_do_req(&c, GET("/v1/models", ""), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 401);
  TH_CHECK(strstr(r.body, "\"code\":401") != NULL);
  TH_REQUIRE(hc_do_req(&c, GET("/v1/models", "Authorization: Bearer wrong\r\n"), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 401);
  TH_REQUIRE(hc_do_req(&c, GET("/v1/models", KEY), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  TH_CHECK(strstr(r.body, "\"object\":\"list\"") && strstr(r.body, "\"id\":\"tiny\"") &&
           strstr(r.body, "\"max_model_len\":512") && strstr(r.body, "\"object\":\"model\""));
  TH_REQUIRE(hc_do_req(&c, GET("/version", KEY), &r) == 0);
  TH_CHECK(r.status == 200 && strstr(r.body, "\"version\"") != NULL);
  TH_CHECK(hc_find_header(&r, "Date") && strstr(hc_find_header(&r, "Date"), " GMT") != NULL);
  TH_REQUIRE(hc_do_req(&c, GET("/nope", KEY), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 404);
  TH_CHECK(strstr(r.body, "\"code\":404") != NULL);
  TH_REQUIRE(hc_do_req(&c, "DELETE /v1/models HTTP/1.1\r\nHost: t\r\n" KEY "\r\n", &r) == 0);
  TH_CHECK_EQ_INT(r.status, 405);
  TH_CHECK(hc_find_header(&r, "Allow") && !strcmp(hc_find_header(&r, "Allow"), "GET"));
  /* /ping (vLLM's, for SageMaker) answers as /health, by GET or POST, without a key */
  TH_REQUIRE(hc_do_req(&c, GET("/ping", ""), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 503);
  TH_REQUIRE(hc_do_req(&c, "POST /ping HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n", &r) == 0);
  TH_CHECK_EQ_INT(r.status, 503);
  TH_REQUIRE(hc_do_req(&c, "DELETE /ping HTTP/1.1\r\nHost: t\r\n\r\n", &r) == 0);
  TH_CHECK_EQ_INT(r.status, 405);
  TH_CHECK(hc_find_header(&r, "Allow") && !strcmp(hc_find_header(&r, "Allow"), "GET, POST"));
  TH_REQUIRE(hc_do_req(&c, GET("/v1/completions", KEY), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 405);
  /* requests refused, or valid without an engine yet: their status and what their
   * answers say */
  static const struct {
    const char *path, *body;
    int status;
    const char *says[2]; /* texts the answer holds (NULL: none) */
  } posts[] = {
      {"/v1/completions",
       "{\"model\":\"tiny\",\"prompt\":\"hi\",\"top_p\":1.5}",
       400,
       {"\"param\":\"top_p\""}},
      {"/v1/completions", "{\"model\":\"big\",\"prompt\":\"hi\"}", 404, {"\"code\":404", "big"}},
      {"/v1/chat/completions",
       "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":-3}", 400},
      {"/v1/chat/completions", "{not json", 400},
      {"/v1/completions", "{\"prompt\":[1,2,3],\"max_tokens\":600}", 400, {"512", "603"}},
      {"/v1/chat/completions",
       "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true}",
       503,
       {"engine not ready"}},
      {"/tokenize", "{\"prompt\":\"hi\"}", 503},
      {"/detokenize", "{\"tokens\":\"x\"}", 400},
  };
  char req[2048];
  for (size_t i = 0; i < sizeof(posts) / sizeof(posts[0]); i++) {
    hc_post(req, sizeof(req), posts[i].path, posts[i].body);
    TH_REQUIRE(hc_do_req(&c, req, &r) == 0);
    int said = 1;
    for (int k = 0; k < 2; k++)
      said = said && (!posts[i].says[k] || strstr(r.body, posts[i].says[k]));
    if (r.status != posts[i].status || !said)
      th_fail(__FILE__, __LINE__, "POST %s %s: %d %s (want %d)", posts[i].path, posts[i].body,
              r.status, r.body, posts[i].status);
  }
  TH_REQUIRE(hc_do_req(&c, GET("/metrics", KEY), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  TH_CHECK(strstr(r.body, "# TYPE lmserve:prompt_tokens_total counter") != NULL);
  TH_CHECK(strstr(r.body,
                  "lmserve:time_to_first_token_seconds_bucket{model_name=\"tiny\",replica=\"0\","
                  "le=\"+Inf\"}") != NULL);
  TH_CHECK(strstr(r.body, "lmserve:http_client_errors_total{model_name=\"tiny\"}") != NULL);
  hc_conn_close(&c);
  hc_server_stop(&s);
}

TH_TEST(http_pipelining_and_chunked) {
  th_proc_init(60);
  struct server s;
  struct conn c;
  hc_server_open(&s, "sekret", &c);
  const char *body = "{\"prompt\":\"x\",\"n\":0}";
  char all[4096];
  int n = snprintf(
      all, sizeof(all),
      GET("/version", KEY) GET(
          "/nope", KEY) "POST /v1/completions HTTP/1.1\r\nHost: t\r\n" KEY
                        "Content-Length: %zu\r\n\r\n%s"
                        "POST /v1/completions HTTP/1.1\r\nHost: t\r\n" KEY
                        "Transfer-Encoding: chunked\r\n\r\n"
                        "5\r\n{\"pro\r\nb;ext=1\r\nmpt\":\"x\",\"n\r\n4\r\n\":0}\r\n0\r\n\r\n" GET(
                            "/v1/models", KEY),
      strlen(body), body);
  /* the whole batch in one write, then again one byte per write */
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 0) {
      TH_REQUIRE(hc_send_all(&c, all, (size_t)n) == 0);
    } else {
      for (int i = 0; i < n; i++)
        TH_REQUIRE(hc_send_all(&c, all + i, 1) == 0);
    }
    struct resp r;
    static const int want[] = {200, 404, 400, 400, 200};
    for (size_t i = 0; i < 5; i++) {
      TH_REQUIRE(hc_read_resp(&c, &r, 5000) == 0);
      TH_CHECK_EQ_INT(r.status, want[i]);
      if (i == 2 || i == 3) TH_CHECK(strstr(r.body, "\"param\":\"n\"") != NULL);
    }
    TH_CHECK(strstr(r.body, "\"max_model_len\"") != NULL);
  }
  /* Expect: 100-continue gets the interim answer before the body */
  char head[512];
  snprintf(head, sizeof(head),
           "POST /v1/completions HTTP/1.1\r\nHost: t\r\n" KEY
           "Expect: 100-continue\r\nContent-Length: %zu\r\n\r\n",
           strlen(body));
  TH_REQUIRE(hc_send_str(&c, head) == 0);
  struct resp r;
  TH_REQUIRE(hc_read_resp(&c, &r, 5000) == 0);
  TH_CHECK_EQ_INT(r.status, 100);
  TH_REQUIRE(hc_send_str(&c, body) == 0);
  TH_REQUIRE(hc_read_resp(&c, &r, 5000) == 0);
  TH_CHECK_EQ_INT(r.status, 400);
  hc_conn_close(&c);
  hc_server_stop(&s);
}

/* A request the server rejects itself: it answers `want` with the error
 * envelope and closes; a new connection still works. */
static void expect_reject(struct server *s, const char *req, size_t len, int want) {
  struct conn c;
  TH_REQUIRE(hc_conn_open(&c, s->port) == 0);
  hc_send_all(&c, req, len);
  struct resp r;
  int rc = hc_read_resp(&c, &r, 5000);
  TH_CHECK_EQ_INT(rc, 0);
  if (rc == 0) {
    if (r.status != want)
      th_fail(__FILE__, __LINE__, "want %d, got %d: %.80s", want, r.status, req);
    TH_CHECK(strstr(r.body, "\"error\"") != NULL);
    TH_CHECK(hc_find_header(&r, "Connection") &&
             !strcasecmp(hc_find_header(&r, "Connection"), "close"));
  }
  TH_CHECK(hc_closed_by_server(&c, 6000));
  hc_conn_close(&c);
  hc_check_alive(s);
}

TH_TEST(http_limits) {
  th_proc_init(60);
  struct server s;
  hc_server_start(&s, "sekret");
  char big[16384];
  /* 413: declared body over --max-body-size */
  snprintf(big, sizeof(big),
           "POST /v1/completions HTTP/1.1\r\nHost: t\r\n" KEY "Content-Length: 5000\r\n\r\n");
  expect_reject(&s, big, strlen(big), 413);
  /* 413: a chunked body that grows past it */
  int n = snprintf(big, sizeof(big),
                   "POST /v1/completions HTTP/1.1\r\nHost: t\r\n" KEY
                   "Transfer-Encoding: chunked\r\n\r\n1400\r\n");
  memset(big + n, 'a', 5200);
  expect_reject(&s, big, (size_t)n + 5200, 413);
  /* 431: a head over --max-header-size */
  n = snprintf(big, sizeof(big), "GET /version HTTP/1.1\r\nHost: t\r\nX-Big: ");
  memset(big + n, 'b', 3000);
  n += 3000;
  n += snprintf(big + n, sizeof(big) - (size_t)n, "\r\n\r\n");
  expect_reject(&s, big, (size_t)n, 431);
  /* 431: more fields than --max-headers */
  n = snprintf(big, sizeof(big), "GET /version HTTP/1.1\r\nHost: t\r\n");
  for (int i = 0; i < 25; i++)
    n += snprintf(big + n, sizeof(big) - (size_t)n, "X-%d: v\r\n", i);
  n += snprintf(big + n, sizeof(big) - (size_t)n, "\r\n");
  expect_reject(&s, big, (size_t)n, 431);
  /* 400: request smuggling shapes and garbage */
  static const char *const bad400[] = {
      "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: "
      "chunked\r\n\r\n0\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: "
      "4\r\n\r\nabcd",
      "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: -3\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
      "GET /version HTTP/1.1\r\nHost: t\r\nX: a\r\n folded\r\n\r\n",
      "GET /version HTTP/1.1\r\nHost: t\rX: a\r\n\r\n",
      "\x16\x03\x01\x02\xff\xfc\x03\x03\r\n\r\n",
      "GET /version HTTP/1.1\r\n\r\n",
  };
  for (size_t i = 0; i < sizeof(bad400) / sizeof(bad400[0]); i++)
    expect_reject(&s, bad400[i], strlen(bad400[i]), 400);
  static const char *const te =
      "POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n";
  expect_reject(&s, te, strlen(te), 501);
  static const char *const v2 = "GET / HTTP/2.0\r\nHost: t\r\n\r\n";
  expect_reject(&s, v2, strlen(v2), 505);
  hc_server_stop(&s);
}

TH_TEST(http_10_and_connection_close) {
  th_proc_init(60);
  struct server s;
  struct conn c;
  struct resp r;
  hc_server_open(&s, NULL, &c);
  TH_REQUIRE(hc_do_req(&c, "GET /version HTTP/1.0\r\n\r\n", &r) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  TH_CHECK(hc_closed_by_server(&c, 6000));
  hc_conn_close(&c);
  TH_REQUIRE(hc_conn_open(&c, s.port) == 0);
  TH_REQUIRE(hc_do_req(&c, "GET /version HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &r) == 0);
  TH_CHECK(hc_find_header(&r, "Connection") &&
           !strcasecmp(hc_find_header(&r, "Connection"), "keep-alive"));
  TH_REQUIRE(hc_do_req(&c, "GET /version HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &r) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  hc_conn_close(&c);
  TH_REQUIRE(hc_conn_open(&c, s.port) == 0);
  TH_REQUIRE(hc_do_req(&c, "GET /version HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", &r) ==
             0);
  TH_CHECK_EQ_INT(r.status, 200);
  TH_CHECK(hc_closed_by_server(&c, 6000));
  hc_conn_close(&c);
  hc_server_stop(&s);
}

/* `lmserve ARGS...` (NULL-terminated) exits with `status`, its stderr naming
 * `names` where given. */
static void exits_with(int line, int status, const char *names, char *const *args) {
  char *argv[16] = {th_lmserve_bin()}, *out = NULL, *err = NULL;
  for (int i = 0; args[i] && i < 14; i++)
    argv[i + 1] = args[i];
  int rc = th_run(argv, NULL, NULL, 0, 10000, &out, &err);
  if (rc != status || (names && !(err && strstr(err, names))))
    th_fail(__FILE__, line, "%s ...: status %d (want %d), stderr %.300s", args[0], rc, status,
            err ? err : "");
  free(out);
  free(err);
}

/* Flag mistakes exit 2 and a taken port exits 1, each with a clear line. */
TH_TEST(http_cli_errors) {
  th_proc_init(60);
  exits_with(__LINE__, 2, "--port", (char *[]){"frontend", "--port", "99999", NULL});
  exits_with(__LINE__, 2, NULL, (char *[]){"frontend", "--max-body-size", "lots", NULL});
  struct server s;
  hc_server_start(&s, NULL);
  char port[16];
  snprintf(port, sizeof(port), "%d", s.port);
  exits_with(__LINE__, 1, "address already in use", (char *[]){"frontend", "--port", port, NULL});
  hc_check_alive(&s);
  hc_server_stop(&s);
}

#define PREFLIGHT(origin, method, headers)                                                         \
  "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: t\r\nOrigin: " origin                            \
  "\r\nAccess-Control-Request-Method: " method "\r\nAccess-Control-Request-Headers: " headers      \
  "\r\n\r\n"

/* The header's value, or "" where the answer has none. */
static const char *hv(const struct resp *r, const char *name) {
  const char *v = hc_find_header(r, name);
  return v ? v : "";
}

/* CORS as vLLM's server answers it: by default any origin ("*"), every method,
 * the headers asked; with lists, only what they name (the origin echoed with
 * Vary: Origin, credentials when allowed), a disallowed preflight a 400 naming
 * what is disallowed, and a disallowed origin's request served without the
 * headers. The API key is not asked of a preflight, and a 401 still carries
 * the headers a page needs to read it. */
TH_TEST(http_cors) {
  th_proc_init(60);
  struct server s;
  hc_frontend_start(&s, "http://127.0.0.1:", (char *[]){"--api-key", "sekret", NULL});
  struct resp r;
  TH_REQUIRE(hc_request(s.port,
                        PREFLIGHT("http://a.example", "POST", "authorization, content-type"),
                        &r) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  TH_CHECK_EQ_STR(hv(&r, "Access-Control-Allow-Origin"), "*");
  TH_CHECK(strstr(hv(&r, "Access-Control-Allow-Methods"), "POST") != NULL);
  TH_CHECK_EQ_STR(hv(&r, "Access-Control-Allow-Headers"), "authorization, content-type");
  TH_CHECK_EQ_STR(hv(&r, "Access-Control-Max-Age"), "600");
  TH_REQUIRE(hc_request(s.port, GET("/v1/models", "Origin: http://a.example\r\n" KEY), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  TH_CHECK_EQ_STR(hv(&r, "Access-Control-Allow-Origin"), "*");
  TH_REQUIRE(hc_request(s.port, GET("/v1/models", "Origin: http://a.example\r\n"), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 401);
  TH_CHECK_EQ_STR(hv(&r, "Access-Control-Allow-Origin"), "*");
  /* no Origin: no CORS headers */
  TH_REQUIRE(hc_request(s.port, GET("/v1/models", KEY), &r) == 0);
  TH_CHECK(hc_find_header(&r, "Access-Control-Allow-Origin") == NULL);
  hc_server_stop(&s);

  hc_frontend_start(&s, "http://127.0.0.1:",
                    (char *[]){"--allowed-origins", "[\"http://a.example\"]", "--allowed-methods",
                               "[\"GET\", \"post\"]", "--allowed-headers", "[\"Authorization\"]",
                               "--allow-credentials", NULL});
  TH_REQUIRE(hc_request(s.port,
                        PREFLIGHT("http://a.example", "POST", "Authorization, Content-Type"),
                        &r) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  TH_CHECK_EQ_STR(hv(&r, "Access-Control-Allow-Origin"), "http://a.example");
  TH_CHECK_EQ_STR(hv(&r, "Vary"), "Origin");
  TH_CHECK_EQ_STR(hv(&r, "Access-Control-Allow-Methods"), "GET, POST");
  TH_CHECK_EQ_STR(hv(&r, "Access-Control-Allow-Credentials"), "true");
  TH_CHECK(strstr(hv(&r, "Access-Control-Allow-Headers"), "authorization") != NULL);
  TH_REQUIRE(hc_request(s.port, PREFLIGHT("http://b.example", "PUT", "X-Other"), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 400);
  TH_CHECK(strstr(r.body, "Disallowed CORS origin, method, headers") != NULL);
  TH_CHECK(hc_find_header(&r, "Access-Control-Allow-Origin") == NULL);
  TH_REQUIRE(hc_request(s.port, PREFLIGHT("http://a.example", "POST", "X-Other"), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 400);
  TH_CHECK(strstr(r.body, "Disallowed CORS headers") != NULL);
  TH_REQUIRE(hc_request(s.port, GET("/v1/models", "Origin: http://a.example\r\n"), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  TH_CHECK_EQ_STR(hv(&r, "Access-Control-Allow-Origin"), "http://a.example");
  TH_CHECK_EQ_STR(hv(&r, "Access-Control-Allow-Credentials"), "true");
  TH_REQUIRE(hc_request(s.port, GET("/v1/models", "Origin: http://b.example\r\n"), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  TH_CHECK(hc_find_header(&r, "Access-Control-Allow-Origin") == NULL);
  hc_check_alive(&s);
  hc_server_stop(&s);

  /* lists that are not lists: exit 2 naming the flag */
  exits_with(__LINE__, 2, "--allowed-origins",
             (char *[]){"frontend", "--allowed-origins", "http://a.example", NULL});
  exits_with(__LINE__, 2, "--allowed-headers",
             (char *[]){"serve", "--allowed-headers", "[\"a b\"]", NULL});
}

/* --served-model-name several times (vLLM's several names): /v1/models lists the name
 * and then the others, a request may name any of them, another name is a 404. */
TH_TEST(http_served_model_names) {
  th_proc_init(60);
  struct server s;
  hc_frontend_start(
      &s, "http://127.0.0.1:", (char *[]){"--served-model-name", "tiny-alias,other", NULL});
  struct resp r;
  TH_REQUIRE(hc_request(s.port, GET("/v1/models", ""), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  const char *a = strstr(r.body, "\"id\":\"tiny\""), *b = strstr(r.body, "\"id\":\"tiny-alias\""),
             *o = strstr(r.body, "\"id\":\"other\"");
  TH_CHECK(a && b && o && a < b && b < o);
  char req[1024];
  hc_post(req, sizeof(req), "/v1/completions", "{\"model\":\"other\",\"prompt\":\"hi\"}");
  TH_REQUIRE(hc_request(s.port, req, &r) == 0);
  TH_CHECK_EQ_INT(r.status, 503); /* taken: no engine behind this frontend */
  hc_post(req, sizeof(req), "/v1/completions", "{\"model\":\"tiny-other\",\"prompt\":\"hi\"}");
  TH_REQUIRE(hc_request(s.port, req, &r) == 0);
  TH_CHECK_EQ_INT(r.status, 404);
  hc_server_stop(&s);
}
