/* test-api-run-batch.c — `lmserve run-batch` (OpenAI's batch format, vLLM's
 * run-batch): a file of requests to every kind of endpoint, with lines that are
 * not requests, bodies the server refuses, an unknown path and a stream, run
 * against a serve the test started (--url, with its API key) and against a serve
 * run-batch starts itself (serve's options); each result line in the input's
 * order, each answer's content the one the same body gets when posted straight to
 * the server, each refusal the server's own status and error. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/api/api-serve.h"

#define KEY "batch-key"

/* the requests, one a line ("" is a blank line) */
static const char *const lines[] = {
    "{\"custom_id\":\"chat\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{"
    "\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi there\"}],"
    "\"max_tokens\":8,\"temperature\":1,\"seed\":3}}",
    "",
    "{\"custom_id\":\"cmpl\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{"
    "\"model\":\"tiny\",\"prompt\":\"Once upon a time\",\"max_tokens\":6,\"temperature\":0}}",
    "not json",
    "{\"custom_id\":\"hot\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{"
    "\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"temperature\":9}}",
    "{\"custom_id\":\"nowhere\",\"method\":\"POST\",\"url\":\"/v1/nothing\",\"body\":{}}",
    "{\"custom_id\":\"get\",\"method\":\"GET\",\"url\":\"/v1/models\",\"body\":{}}",
    "{\"custom_id\":\"stream\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{"
    "\"model\":\"tiny\",\"prompt\":\"a\",\"stream\":true}}",
    "{\"custom_id\":\"msg\",\"method\":\"POST\",\"url\":\"/v1/messages\",\"body\":{"
    "\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi there\"}],"
    "\"max_tokens\":5,\"temperature\":1,\"seed\":4}}",
    "{\"custom_id\":\"tok\",\"method\":\"POST\",\"url\":\"/tokenize\",\"body\":{"
    "\"model\":\"tiny\",\"prompt\":\"Hello world\"}}",
};
#define N_LINES (sizeof(lines) / sizeof(lines[0]))

/* what each non-blank line must give: its custom_id (NULL: null), the status (0: no
 * response, an error object instead) */
static const struct {
  const char *custom_id;
  int status;
} want[] = {{"chat", 200}, {"cmpl", 200}, {NULL, 0},    {"hot", 400}, {"nowhere", 404},
            {"get", 0},    {"stream", 0}, {"msg", 200}, {"tok", 200}};
#define N_WANT (sizeof(want) / sizeof(want[0]))

/* The part of an answer two runs must share: the generated text, the tokens. */
static char *content_of(json_t *body) {
  json_t *c0 = json_array_get(json_object_get(body, "choices"), 0);
  json_t *v = json_object_get(json_object_get(c0, "message"), "content");
  if (!v) v = json_object_get(c0, "text");
  if (!v) v = json_object_get(json_array_get(json_object_get(body, "content"), 0), "text");
  if (!v) v = json_object_get(body, "tokens");
  return v ? json_dumps(v, JSON_ENCODE_ANY) : NULL;
}

/* Checks the results file against want[] and, for the answers, against the same
 * bodies posted straight to s. */
static void check_results(const char *path, const struct as_server *s) {
  FILE *f = fopen(path, "r");
  TH_REQUIRE(f != NULL);
  char *buf = NULL;
  size_t cap = 0, n = 0;
  ssize_t k;
  size_t body_line = 0; /* which of lines[] the result is for */
  while ((k = getline(&buf, &cap, f)) > 0) {
    TH_REQUIRE(n < N_WANT);
    while (!lines[body_line][0])
      body_line++;
    json_error_t e;
    json_t *o = json_loads(buf, 0, &e);
    TH_REQUIRE(o != NULL);
    TH_CHECK(!strncmp(json_string_value(json_object_get(o, "id")), "batch_req_", 10));
    json_t *cid = json_object_get(o, "custom_id"), *resp = json_object_get(o, "response");
    json_t *err = json_object_get(o, "error");
    if (want[n].custom_id)
      TH_CHECK_EQ_STR(json_string_value(cid), want[n].custom_id);
    else
      TH_CHECK(json_is_null(cid));
    if (!want[n].status) {
      TH_CHECK(json_is_null(resp));
      TH_CHECK_EQ_STR(json_string_value(json_object_get(err, "code")), "invalid_request");
      TH_CHECK(strstr(json_string_value(json_object_get(err, "message")), "line ") != NULL);
    } else {
      TH_CHECK(json_is_null(err));
      TH_CHECK(json_integer_value(json_object_get(resp, "status_code")) == want[n].status);
      json_t *body = json_object_get(resp, "body");
      if (want[n].status != 200) {
        TH_CHECK(json_object_get(json_object_get(body, "error"), "message") != NULL);
      } else { /* the same body straight to the server: the same content */
        json_t *req = json_loads(lines[body_line], 0, NULL);
        char *rb = json_dumps(json_object_get(req, "body"), JSON_COMPACT);
        struct as_resp r;
        as_post(s, json_string_value(json_object_get(req, "url")), rb, &r);
        TH_CHECK_EQ_INT(r.status, 200);
        json_t *direct = as_json(&r);
        char *a = content_of(body), *b = content_of(direct);
        TH_REQUIRE(a && b);
        TH_CHECK_EQ_STR(a, b);
        const char *id = json_string_value(json_object_get(body, "id"));
        if (id) TH_CHECK_EQ_STR(json_string_value(json_object_get(resp, "request_id")), id);
        free(a);
        free(b);
        json_decref(direct);
        as_resp_free(&r);
        free(rb);
        json_decref(req);
      }
    }
    json_decref(o);
    n++;
    body_line++;
  }
  free(buf);
  fclose(f);
  TH_CHECK_EQ_INT((int)n, (int)N_WANT);
}

TH_TEST(run_batch_against_a_server_and_its_own) {
  th_proc_init(900);
  struct as_server s = {.api_key = KEY};
  as_start(&s, 0, (char *[]){"--served-model-name", "tiny", "--max-model-len", "256", NULL});
  char in[400], out[400], out2[400], url[64];
  snprintf(in, sizeof(in), "%s/in.jsonl", s.dir);
  snprintf(out, sizeof(out), "%s/out.jsonl", s.dir);
  snprintf(out2, sizeof(out2), "%s/out2.jsonl", s.dir);
  snprintf(url, sizeof(url), "http://127.0.0.1:%d", s.port);
  FILE *f = fopen(in, "w");
  TH_REQUIRE(f != NULL);
  for (size_t i = 0; i < N_LINES; i++)
    fprintf(f, "%s\n", lines[i]);
  fclose(f);

  /* against the running server, with its key and two requests at a time */
  struct th_out o = {0};
  int rc = th_lmserve(&o, 300000, "run-batch", "-i", in, "-o", out, "--url", url, "--api-key", KEY,
                      "--max-concurrency", "2", NULL);
  if (rc) fprintf(stderr, "run-batch: %s\n", o.err ? o.err : "");
  TH_CHECK_EQ_INT(rc, 0);
  TH_CHECK(o.err && strstr(o.err, "9 requests") && strstr(o.err, "4 answered") &&
           strstr(o.err, "2 refused by the server"));
  th_out_free(&o);
  check_results(out, &s);

  /* run-batch's own serve on the same checkpoint: the same answers */
  rc = th_lmserve(&o, 300000, "run-batch", "-i", in, "-o", out2, "--model", s.model,
                  "--served-model-name", "tiny", "--max-model-len", "256", NULL);
  if (rc) fprintf(stderr, "run-batch: %s\n", o.err ? o.err : "");
  TH_CHECK_EQ_INT(rc, 0);
  th_out_free(&o);
  check_results(out2, &s);

  /* mistakes: no input, serve's port, a wrong key (each request refused, 401) */
  TH_CHECK_EQ_INT(th_lmserve(&o, 60000, "run-batch", "-o", out2, "--url", url, NULL), 2);
  th_out_free(&o);
  TH_CHECK_EQ_INT(th_lmserve(&o, 60000, "run-batch", "-i", in, "-o", out2, "--model", s.model,
                             "--port", "9", NULL),
                  2);
  th_out_free(&o);
  TH_CHECK_EQ_INT(th_lmserve(&o, 60000, "run-batch", "-i", in, "-o", out2, "--model", s.model,
                             "--api-key-file", in, NULL),
                  2);
  th_out_free(&o);
  /* nobody there: every request unanswered is an error line, and the run fails */
  char nobody[64];
  snprintf(nobody, sizeof(nobody), "http://127.0.0.1:%d", th_free_port());
  TH_CHECK_EQ_INT(th_lmserve(&o, 60000, "run-batch", "-i", in, "-o", out2, "--url", nobody, NULL),
                  1);
  TH_CHECK(o.err && strstr(o.err, "answered none"));
  th_out_free(&o);
  TH_CHECK_EQ_INT(
      th_lmserve(&o, 60000, "run-batch", "-i", "/nonexistent/x", "-o", out2, "--url", url, NULL),
      1);
  th_out_free(&o);
  TH_CHECK_EQ_INT(th_lmserve(&o, 60000, "run-batch", "-i", in, "-o", out2, "--url", url,
                             "--api-key", "no", NULL),
                  0);
  TH_CHECK(o.err && strstr(o.err, "0 answered"));
  th_out_free(&o);
  as_stop(&s);
}
