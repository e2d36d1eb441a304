/* test-api-errors.c — `lmserve serve --api-key K --max-model-len 256` on a
 * tiny Gemma 4, given requests it must refuse: without the key every route
 * but /health is a 401; malformed JSON, wrong types, out-of-range values,
 * an unknown model, a prompt past the context length, a huge body and
 * oversized headers each get the right status in OpenAI's error envelope
 * (param naming the field for validation errors), and after each the
 * server still completes a request. The audio endpoints refuse a clip for
 * this model without an audio tower. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/api/api-serve.h"

#define KEY "sekret-key"
/* 8 samples of 16-bit mono PCM at 16 kHz, as a WAV, in base64 */
#define TINY_WAV "UklGRjQAAABXQVZFZm10IBAAAAABAAEAgD4AAAB9AAACABAAZGF0YRAAAAAAAOgD0AfoAwAAGPww+Bj8"
#define MAX_LEN  256

static struct as_server g_srv;
static double g_5xx; /* lmserve:http_server_errors_total once ready */

static struct as_server *server(void) {
  if (!g_srv.port) {
    th_proc_init(600);
    g_srv.api_key = KEY;
    as_start(&g_srv, 0, (char *[]){"--max-model-len", "256", NULL});
    g_5xx = as_metric(&g_srv, "lmserve:http_server_errors_total");
  }
  return &g_srv;
}

/* The server answers a small completion after whatever came before. */
static void check_still_serving(int line) {
  struct as_resp r;
  int st = as_post(server(), "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2}", &r);
  json_t *j = as_json(&r);
  if (st != 200 || !as_jstr(j, "choices", 0, "text"))
    th_fail(__FILE__, line, "not serving after a bad request: %d %s", st, r.body);
  json_decref(j);
  as_resp_free(&r);
}

TH_TEST(api_auth) {
  struct as_server *s = server();
  static const struct {
    const char *method, *path, *body;
  } routes[] = {
      {"GET", "/version", NULL},
      {"GET", "/v1/models", NULL},
      {"GET", "/metrics", NULL},
      {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2}"},
      {"POST", "/v1/chat/completions",
       "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2}"},
      {"POST", "/tokenize", "{\"prompt\":\"hi\"}"},
      {"POST", "/detokenize", "{\"tokens\":[2,9259]}"},
  };
  static const char *const bad[] = {"", "Authorization: Bearer wrong\r\n",
                                    "Authorization: Basic c2VrcmV0LWtleQ==\r\n",
                                    "Authorization: Bearer sekret-key-and-more\r\n"};
  struct as_resp r;
  for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
      as_request(s, routes[i].method, routes[i].path, bad[k], routes[i].body, &r);
      if (r.status != 401)
        fprintf(stderr, "%s %s with '%s'\n", routes[i].method, routes[i].path, bad[k]);
      as_check_error(&r, 401, NULL);
      as_resp_free(&r);
    }
    /* the key opens it (a lowercase scheme too) */
    TH_CHECK_EQ_INT(as_request(s, routes[i].method, routes[i].path,
                               "Authorization: bearer " KEY "\r\n", routes[i].body, &r),
                    200);
    as_resp_free(&r);
  }
  /* /health needs no key */
  TH_CHECK_EQ_INT(as_request(s, "GET", "/health", "", NULL, &r), 200);
  as_resp_free(&r);
  check_still_serving(__LINE__);
}

/* Several keys (--api-key's, a comma apart, and --api-key-file's, one a line): each
 * opens the API, by Authorization or X-Api-Key; a comment line of the file does not,
 * nor does any other string. A key file that is not there stops serve with its name. */
TH_TEST(api_auth_several_keys) {
  th_proc_init(600);
  struct as_server s = {.api_key = "k-one"};
  as_start(&s, 0, NULL); /* (only to make the folder and the model: then again, with keys) */
  as_stop(&s);
  char file[400];
  snprintf(file, sizeof(file), "%s/keys.txt", s.dir);
  FILE *f = fopen(file, "w");
  TH_REQUIRE(f != NULL);
  fputs("# rotated on Mondays, k-old\nk-three\n\n  k-four  \n", f);
  fclose(f);
  struct as_server k = {.api_key = "k-one"};
  as_start(&k, 0, (char *[]){"--api-key", "k-one, k-two", "--api-key-file", file, NULL});
  static const struct {
    const char *hdr;
    int status;
  } cases[] = {
      {"Authorization: Bearer k-one\r\n", 200},
      {"Authorization: Bearer k-two\r\n", 200},
      {"Authorization: Bearer k-three\r\n", 200},
      {"X-Api-Key: k-four\r\n", 200},
      {"Authorization: Bearer k-one, k-two\r\n", 401},
      {"Authorization: Bearer k-five\r\n", 401},
      {"Authorization: Bearer # rotated on Mondays\r\n", 401},
      {"Authorization: Bearer k-old\r\n", 401},
      {"X-Api-Key: \r\n", 401},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    struct as_resp r;
    as_request(&k, "GET", "/v1/models", cases[i].hdr, NULL, &r);
    if (r.status != cases[i].status) fprintf(stderr, "with '%s': %d\n", cases[i].hdr, r.status);
    TH_CHECK_EQ_INT(r.status, cases[i].status);
    as_resp_free(&r);
  }
  as_stop(&k);
  struct th_out o = {0};
  snprintf(file, sizeof(file), "%s/none.txt", s.dir);
  char port[16];
  snprintf(port, sizeof(port), "%d", th_free_port());
  int rc = th_lmserve(&o, 120000, "serve", "--model", k.model, "--port", port, "--api-key-file",
                      file, NULL);
  TH_CHECK(rc != 0);
  TH_CHECK(o.err && strstr(o.err, "none.txt") && strstr(o.err, "No such file"));
  th_out_free(&o);
  /* a file without a key (only comments) does not leave the API open */
  f = fopen(file, "w");
  TH_REQUIRE(f != NULL);
  fputs("# none yet\n\n", f);
  fclose(f);
  rc = th_lmserve(&o, 120000, "serve", "--model", k.model, "--port", port, "--api-key-file", file,
                  NULL);
  TH_CHECK(rc != 0);
  TH_CHECK(o.err && strstr(o.err, "holds no key"));
  th_out_free(&o);
}

TH_TEST(api_bad_input_matrix) {
  static const struct {
    const char *path, *body;
    int status;
    const char *param; /* NULL: null */
  } cases[] = {
      /* not JSON, or not an object */
      {"/v1/completions", "{\"prompt\":\"hi\"", 400, NULL},
      {"/v1/chat/completions", "{messages: []}", 400, NULL},
      {"/v1/completions", "", 400, NULL},
      {"/v1/completions", "[1,2]", 400, NULL},
      {"/v1/completions", "\"hi\"", 400, NULL},
      /* wrong types */
      {"/v1/completions", "{\"prompt\":5}", 400, "prompt"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":\"5\"}", 400, "max_tokens"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"temperature\":\"hot\"}", 400, "temperature"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"stream\":\"yes\"}", 400, "stream"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"stop\":5}", 400, "stop"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"seed\":\"x\"}", 400, "seed"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"n\":1.5}", 400, "n"},
      {"/v1/chat/completions", "{\"messages\":\"hi\"}", 400, "messages"},
      {"/v1/chat/completions", "{\"max_tokens\":3}", 400, "messages"},
      {"/v1/chat/completions", "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400,
       "messages[0].role"},
      /* the model */
      {"/v1/completions", "{\"model\":\"gpt-4\",\"prompt\":\"hi\"}", 404, "model"},
      {"/v1/chat/completions",
       "{\"model\":\"nope\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 404, "model"},
      /* out of range */
      {"/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":-1}", 400, "max_tokens"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":0}", 400, "max_tokens"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"top_p\":1.5}", 400, "top_p"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"top_p\":0}", 400, "top_p"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"temperature\":-1}", 400, "temperature"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"n\":0}", 400, "n"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"logprobs\":50}", 400, "logprobs"},
      {"/v1/completions", "{\"prompt\":\"hi\",\"frequency_penalty\":5}", 400, "frequency_penalty"},
      {"/v1/completions", "{\"prompt\":[]}", 400, "prompt"},
      /* token ids the model does not have */
      {"/v1/completions", "{\"prompt\":[2,999999999]}", 400, "prompt"},
      {"/v1/completions", "{\"prompt\":[2,-4]}", 400, "prompt"},
      {"/v1/completions", "{\"prompt\":[2,262144],\"max_tokens\":2}", 400, "prompt"},
      {"/detokenize", "{\"tokens\":[\"a\"]}", 400, "tokens"},
      {"/detokenize", "{\"tokens\":[999999999]}", 400, "tokens"},
      /* past the context length */
      {"/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":300}", 400, "max_tokens"},
      /* audio: this checkpoint has no audio tower (a good WAV is refused naming its part);
       * a part of the wrong shape, or outside a user message, is refused as such */
      {"/v1/chat/completions",
       "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\"},"
       "{\"type\":\"input_audio\",\"input_audio\":{\"data\":\"" TINY_WAV "\",\"format\":"
       "\"wav\"}}]}]}",
       400, "messages[0].content[1].input_audio"},
      {"/v1/chat/completions",
       "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\","
       "\"input_audio\":{\"data\":\"" TINY_WAV "\"}}]}]}",
       400, "messages[0].content[0]"},
      {"/v1/chat/completions",
       "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\","
       "\"content\":[{\"type\":\"input_audio\",\"input_audio\":{\"data\":\"" TINY_WAV
       "\",\"format\":\"wav\"}}]}]}",
       400, "messages[1].content[0]"},
      {"/v1/chat/completions",
       "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_video\"}]}]}", 400,
       "messages[0].content[0]"},
  };
  struct as_resp r;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    as_post(server(), cases[i].path, cases[i].body, &r);
    if (r.status != cases[i].status) fprintf(stderr, "case %zu: %s\n", i, cases[i].body);
    as_check_error(&r, cases[i].status, cases[i].param);
    as_resp_free(&r);
    check_still_serving(__LINE__);
  }
  /* an unknown route and a wrong method are errors in the envelope too */
  as_get(server(), "/v1/nothing", &r);
  as_check_error(&r, 404, NULL);
  as_resp_free(&r);
  as_get(server(), "/v1/completions", &r);
  as_check_error(&r, 405, NULL);
  as_resp_free(&r);
}

TH_TEST(api_prompt_too_long) {
  /* a text prompt of more than MAX_LEN tokens: 400 naming both numbers */
  size_t cap = 64 * 1024;
  char *words = malloc(cap), *body = malloc(cap + 64);
  TH_REQUIRE(words && body);
  size_t n = 0;
  for (int i = 0; i < 400; i++)
    n += (size_t)snprintf(words + n, cap - n, "word%d ", i);
  snprintf(body, cap + 64, "{\"prompt\":\"%s\"}", words);
  struct as_resp r;
  TH_CHECK_EQ_INT(as_post(server(), "/tokenize", body, &r), 200);
  json_t *j = as_json(&r);
  long long count = json_integer_value(json_object_get(j, "count"));
  json_decref(j);
  as_resp_free(&r);
  TH_CHECK(count > MAX_LEN);
  snprintf(body, cap + 64, "{\"prompt\":\"%s\",\"max_tokens\":4}", words);
  as_post(server(), "/v1/completions", body, &r);
  as_check_error(&r, 400, "prompt");
  char num[32];
  snprintf(num, sizeof(num), "%lld", count);
  TH_CHECK(strstr(r.body, "256") != NULL);
  TH_CHECK(strstr(r.body, num) != NULL);
  as_resp_free(&r);
  /* the same as chat */
  snprintf(body, cap + 64, "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}]}", words);
  as_post(server(), "/v1/chat/completions", body, &r);
  TH_CHECK_EQ_INT(r.status, 400);
  TH_CHECK(strstr(r.body, "256") != NULL);
  as_resp_free(&r);
  /* and as token ids */
  n = (size_t)snprintf(body, cap, "{\"prompt\":[2");
  for (int i = 0; i < 299; i++)
    n += (size_t)snprintf(body + n, cap - n, ",9259");
  snprintf(body + n, cap - n, "],\"max_tokens\":1}");
  as_post(server(), "/v1/completions", body, &r);
  as_check_error(&r, 400, "prompt");
  TH_CHECK(strstr(r.body, "256") && strstr(r.body, "300"));
  as_resp_free(&r);
  free(words);
  free(body);
  check_still_serving(__LINE__);
}

/* Sends raw bytes on a new connection and reads the answer. */
static int raw(const char *data, size_t n, struct as_resp *r) {
  int fd = as_connect(server());
  TH_REQUIRE(fd >= 0);
  while (n) {
    ssize_t k = send(fd, data, n, MSG_NOSIGNAL);
    if (k <= 0) break; /* the server may answer and close first */
    data += k;
    n -= (size_t)k;
  }
  return as_read_answer(fd, r);
}

TH_TEST(api_oversized) {
  struct as_resp r;
  /* a body declared larger than serve's 32 MiB limit */
  const char *big = "POST /v1/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " KEY
                    "\r\nContent-Type: application/json\r\nContent-Length: 40000000\r\n\r\n"
                    "{\"prompt\":\"";
  raw(big, strlen(big), &r);
  as_check_error(&r, 413, NULL);
  as_resp_free(&r);
  check_still_serving(__LINE__);

  /* a chunked body that grows past it: sent until the server answers */
  int fd = as_connect(server());
  TH_REQUIRE(fd >= 0);
  const char *head = "POST /v1/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " KEY
                     "\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
  TH_REQUIRE(send(fd, head, strlen(head), MSG_NOSIGNAL) == (ssize_t)strlen(head));
  size_t chunk = 1u << 20;
  char *buf = malloc(chunk + 32);
  TH_REQUIRE(buf);
  int hn = snprintf(buf, 32, "%zx\r\n", chunk);
  memset(buf + hn, 'a', chunk);
  memcpy(buf + hn + chunk, "\r\n", 2);
  for (int i = 0; i < 48; i++) {
    size_t left = (size_t)hn + chunk + 2, off = 0;
    while (left) {
      ssize_t k = send(fd, buf + off, left, MSG_NOSIGNAL);
      if (k <= 0) break;
      off += (size_t)k;
      left -= (size_t)k;
    }
    if (left) break;
  }
  free(buf);
  as_read_answer(fd, &r);
  as_check_error(&r, 413, NULL);
  as_resp_free(&r);
  check_still_serving(__LINE__);

  /* one header line larger than serve's 16 KiB head limit */
  char *hdr = malloc(24 * 1024);
  TH_REQUIRE(hdr);
  int n = snprintf(hdr, 1024, "GET /v1/models HTTP/1.1\r\nHost: t\r\nX-Big: ");
  memset(hdr + n, 'x', 20000);
  snprintf(hdr + n + 20000, 64, "\r\n\r\n");
  raw(hdr, strlen(hdr), &r);
  as_check_error(&r, 431, NULL);
  as_resp_free(&r);
  /* more header fields than allowed (100) */
  n = snprintf(hdr, 1024, "GET /v1/models HTTP/1.1\r\nHost: t\r\n");
  for (int i = 0; i < 150; i++)
    n += snprintf(hdr + n, (size_t)(24 * 1024 - n), "X-H%d: v\r\n", i);
  snprintf(hdr + n, (size_t)(24 * 1024 - n), "\r\n");
  raw(hdr, strlen(hdr), &r);
  as_check_error(&r, 431, NULL);
  as_resp_free(&r);
  free(hdr);
  check_still_serving(__LINE__);
}

/* The audio endpoints on a model without an audio tower: the clip is a 400 naming
 * the form's file, streamed or not; without the key, a 401 like every route. */
TH_TEST(api_audio_endpoints_on_a_text_model) {
  /* a WAV of 8 samples of 16-bit mono PCM at 16 kHz: RIFF, fmt and data chunks */
  static const uint8_t wav[] = {
      'R', 'I',  'F', 'F',  52, 0,    0,   0,   'W', 'A',  'V',  'E',  'f',  'm',  't',
      ' ', 16,   0,   0,    0,  1,    0,   1,   0,   0x80, 0x3e, 0,    0,    0,    0x7d,
      0,   0,    2,   0,    16, 0,    'd', 'a', 't', 'a',  16,   0,    0,    0,    0,
      0,   0xe8, 3,   0xd0, 7,  0xe8, 3,   0,   0,   0x18, 0xfc, 0x30, 0xf8, 0x18, 0xfc};
  const size_t wav_n = sizeof(wav);
  const char *paths[] = {"/v1/audio/transcriptions", "/v1/audio/translations"};
  const char *ct = "multipart/form-data; boundary=q";
  for (int i = 0; i < 4; i++) {
    char body[512];
    int n = snprintf(body, 256,
                     "--q\r\nContent-Disposition: form-data; name=\"stream\"\r\n\r\n%s\r\n"
                     "--q\r\nContent-Disposition: form-data; name=\"file\"; "
                     "filename=\"a.wav\"\r\n\r\n",
                     i & 1 ? "true" : "false");
    memcpy(body + n, wav, wav_n);
    n += (int)wav_n;
    n += snprintf(body + n, 64, "\r\n--q--\r\n");
    struct as_resp r;
    as_post_bytes(server(), paths[i / 2], ct, body, (size_t)n, &r);
    as_check_error(&r, 400, "file");
    TH_CHECK(r.body && strstr(r.body, "does not take audio"));
    as_resp_free(&r);
  }
  struct as_resp r;
  as_request(server(), "POST", "/v1/audio/transcriptions", "X-None: 1\r\n", "{}", &r);
  TH_CHECK_EQ_INT(r.status, 401);
  as_resp_free(&r);
  check_still_serving(__LINE__);
}

TH_TEST(api_errors_stop) {
  /* nothing above was a 5xx (the SDKs would retry it) */
  TH_CHECK(as_metric(server(), "lmserve:http_server_errors_total") == g_5xx);
  TH_CHECK_EQ_INT(as_metric_wait(server(), "lmserve:num_requests_running", 0, 30000), 0);
  as_stop(server());
}
