/* test-api-tls.c — `lmserve serve` over HTTPS (--ssl-keyfile, --ssl-certfile
 * forwarded to its frontend; its readiness probe speaks TLS) on a tiny
 * Gemma 4, with certificates made at test time: a streamed chat (SSE over
 * TLS, chunked) and keep-alive requests around it from a C client, then the
 * official `openai` npm client with the test CA (NODE_EXTRA_CA_CERTS),
 * streaming and not. With --ssl-ca-certs serve comes up too (its probe
 * presents the server certificate, which the CA signed) and clients need a
 * certificate. Node's part skips, loudly, without node or
 * node_modules/openai. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/api/api-serve.h"
#include "tests/integration/test-tls-client.h"

#define API_KEY "tls-test-key"
#define NAME "tiny"

static char *post(char *out, size_t size, const char *path, const char *body) {
  snprintf(out, size,
           "POST %s HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " API_KEY
           "\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
           path, strlen(body), body);
  return out;
}

/* Node and the openai package, or a reason to skip. */
static const char *node_missing(void) {
  if (th_node_major() < 18)
    return "no node 18 or newer on PATH: the openai client over HTTPS did not run";
  if (!th_npm_has("openai"))
    return "node_modules/openai is missing (run tools/setup): the openai client over HTTPS did "
           "not run";
  return NULL;
}

/* GET /health over a fresh HTTPS connection (with the client certificate
 * cert/key, or none): its status, or -1 when the server refused the client. */
static int health(const struct as_server *s, const struct tt_pki *pki, const char *cert,
                  const char *key) {
  struct tt_conn c;
  struct resp r;
  if (tt_open(&c, s->port, pki->ca, cert, key) != 0) return -1;
  int ok = tt_send(&c, "GET /health HTTP/1.1\r\nHost: t\r\n\r\n") == 0 &&
           tt_read_resp(&c, &r, 10000) == 0;
  tt_close(&c);
  return ok ? r.status : -1;
}

/* Certificates in a new temporary folder, then serve over HTTPS with them
 * (and with --ssl-ca-certs when client_certs). */
static void start(struct as_server *s, struct tt_pki *pki, const char *name, int client_certs) {
  char dir[256];
  TH_REQUIRE(th_tmpdir(name, dir, sizeof(dir)) == 0);
  tt_make_pki(dir, pki);
  memset(s, 0, sizeof(*s));
  s->api_key = API_KEY;
  /* without client certificates the list ends before --ssl-ca-certs */
  as_start(s, 0,
           (char *[]){"--served-model-name", NAME, "--max-model-len", "256", "--ssl-keyfile",
                      pki->srv_key, "--ssl-certfile", pki->srv_cert,
                      client_certs ? "--ssl-ca-certs" : NULL, pki->ca, NULL});
}

TH_TEST(api_tls_sse_and_openai_client) {
  th_proc_init(900);
  struct tt_pki pki;
  struct as_server s;
  start(&s, &pki, "api-tls", 0);
  struct tt_conn c;
  struct resp r;
  char req[1024];
  TH_CHECK_EQ_INT(health(&s, &pki, NULL, NULL), 200);
  TH_REQUIRE(tt_open(&c, s.port, pki.ca, NULL, NULL) == 0);
  /* SSE over TLS, then a plain answer, on one keep-alive connection */
  TH_REQUIRE(tt_send(&c, post(req, sizeof(req), "/v1/chat/completions",
                              "{\"model\":\"" NAME "\",\"messages\":[{\"role\":\"user\","
                              "\"content\":\"hi\"}],\"max_tokens\":6,\"temperature\":0,"
                              "\"ignore_eos\":true,\"stream\":true,\"stream_options\":"
                              "{\"include_usage\":true}}")) == 0);
  TH_REQUIRE(tt_read_resp(&c, &r, 60000) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  TH_CHECK(strstr(r.head, "text/event-stream") != NULL);
  char text[4096];
  json_t *usage = NULL;
  int events = as_sse_text(r.body, 0, text, sizeof(text), &usage);
  TH_CHECK(events >= 2);
  TH_CHECK(usage && json_integer_value(json_object_get(usage, "completion_tokens")) == 6);
  json_decref(usage);
  /* and a plain answer after it, on the same connection */
  TH_REQUIRE(tt_send(&c, post(req, sizeof(req), "/v1/completions",
                              "{\"prompt\":\"hi\",\"max_tokens\":3,\"ignore_eos\":true}")) == 0);
  TH_REQUIRE(tt_read_resp(&c, &r, 60000) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  TH_CHECK(strstr(r.body, "\"completion_tokens\":3") != NULL);
  tt_close(&c);

  const char *why = node_missing();
  if (!why) {
    char url[96], key[64], model[64], ca[340], script[1024];
    snprintf(url, sizeof(url), "LMSERVE_URL=https://localhost:%d/v1", s.port);
    snprintf(key, sizeof(key), "LMSERVE_KEY=%s", API_KEY);
    snprintf(model, sizeof(model), "LMSERVE_MODEL=%s", NAME);
    snprintf(ca, sizeof(ca), "NODE_EXTRA_CA_CERTS=%s", pki.ca);
    snprintf(script, sizeof(script), "%s/integration/api/api-tls.mjs", th_tests_dir());
    char *env[] = {url, key, model, ca, "NO_COLOR=1", NULL};
    th_node_test(script, env, 600000);
  }
  as_stop(&s);
  if (why) TH_SKIP(why);
}

/* serve with --ssl-ca-certs: ready (the probe presents the server's own
 * certificate), and only clients with a certificate the CA signed get in. */
TH_TEST(api_tls_client_certificates) {
  th_proc_init(900);
  struct tt_pki pki;
  struct as_server s;
  start(&s, &pki, "api-tls-ca", 1);
  TH_CHECK_EQ_INT(health(&s, &pki, NULL, NULL), -1);
  TH_CHECK_EQ_INT(health(&s, &pki, pki.bad_cert, pki.bad_key), -1);
  TH_CHECK_EQ_INT(health(&s, &pki, pki.cli_cert, pki.cli_key), 200);
  as_stop(&s);
}
