/* test-http-parse.c — the request-head parser and the chunked decoder:
 * tables of good and bad requests, pipelining, and every input fed split at
 * every byte. Inputs sit right before a PROT_NONE guard page, so reading one
 * byte too far crashes the test. */
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "frontend/fe-http.h"
#include "tests/harness/th-guard.h"
#include "tests/harness/th.h"

static int parse_guarded(const char *s, size_t n, struct fe_http_request *req,
                         struct fe_http_header *h, size_t maxh) {
  struct th_guarded g = th_guard(s, n);
  int rc = fe_http_parse_request(g.data, n, req, h, maxh);
  th_unguard(&g);
  return rc;
}

struct case_ {
  const char *in;
  int want; /* > 0: head length expected == strlen(in); or an error code */
};

static const struct case_ good[] = {
    {"GET / HTTP/1.1\r\nHost: a\r\n\r\n", 1},
    {"GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n", 1},
    {"GET / HTTP/1.0\r\n\r\n", 1},
    {"GET / HTTP/1.1\nHost: a\n\n", 1},
    {"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 1},
    {"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n\r\n", 1},
    {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n", 1},
    {"GET / HTTP/1.1\r\nHost: a\r\nX-Empty:\r\nX-Sp:   v  \t\r\n\r\n", 1},
    {"GET / HTTP/1.1\r\nHost: a\r\nX-Obs: caf\xc3\xa9\r\n\r\n", 1},
    {"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", 1},
};

static const struct case_ bad[] = {
    {"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
     CM_ERR_PARSE},
    {"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
     CM_ERR_PARSE},
    {"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1,1\r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: \r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x10\r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", CM_ERR_UNSUPPORTED},
    {"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", CM_ERR_UNSUPPORTED},
    {"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: "
     "chunked\r\n\r\n",
     CM_ERR_PARSE},
    {"GET / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\rc\r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/1.1\rHost: a\r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/1.1\r\nHost : a\r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/1.1\r\n: a\r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\x01\r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\x7f\r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/1.1\r\nHost: a\r\nX-A\r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/1.1\r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", CM_ERR_PARSE},
    {"GET  / HTTP/1.1\r\nHost: a\r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/1.1 \r\nHost: a\r\n\r\n", CM_ERR_PARSE},
    {"GET /\x01 HTTP/1.1\r\nHost: a\r\n\r\n", CM_ERR_PARSE},
    {"GET / http/1.1\r\nHost: a\r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/1.10\r\nHost: a\r\n\r\n", CM_ERR_PARSE},
    {"GET / HTTP/2.0\r\nHost: a\r\n\r\n", CM_ERR_UNSUPPORTED},
    {"G(T / HTTP/1.1\r\nHost: a\r\n\r\n", CM_ERR_PARSE},
    {" GET / HTTP/1.1\r\nHost: a\r\n\r\n", CM_ERR_PARSE},
    {"GET\r\n\r\n", CM_ERR_PARSE},
};

TH_TEST(http_parse_good_table) {
  struct fe_http_header h[16];
  struct fe_http_request req;
  for (size_t i = 0; i < CM_ARRAY_LEN(good); i++) {
    size_t n = strlen(good[i].in);
    int rc = parse_guarded(good[i].in, n, &req, h, 16);
    if (rc != (int)n)
      th_fail(__FILE__, __LINE__, "good[%zu] rc %d (%s)", i, rc, req.error ? req.error : "");
  }
}

TH_TEST(http_parse_bad_table) {
  struct fe_http_header h[16];
  struct fe_http_request req;
  for (size_t i = 0; i < CM_ARRAY_LEN(bad); i++) {
    const char *s = bad[i].in;
    size_t n = strlen(s);
    int rc = parse_guarded(s, n, &req, h, 16);
    if (rc != bad[i].want)
      th_fail(__FILE__, __LINE__, "bad[%zu] rc %d want %d", i, rc, bad[i].want);
    else
      TH_CHECK(req.error != NULL);
  }
  /* a NUL inside a header name (strlen would stop there) */
  static const char nul[] = "GET / HTTP/1.1\r\nHost: a\r\nX\0Y: 1\r\n\r\n";
  TH_CHECK_EQ_INT(parse_guarded(nul, sizeof(nul) - 1, &req, h, 16), CM_ERR_PARSE);
}

TH_TEST(http_parse_fields) {
  struct fe_http_header h[8];
  struct fe_http_request r;
  const char *s = "POST /v1/chat/completions?a=b HTTP/1.1\r\nHost: x\r\n"
                  "Content-Length: 42\r\nConnection: foo, Close\r\nExpect: 100-continue\r\n"
                  "Authorization:   Bearer k  \r\n\r\nBODY";
  struct th_guarded g = th_guard(s, strlen(s));
  int rc = fe_http_parse_request(g.data, strlen(s), &r, h, 8);
  TH_REQUIRE(rc == (int)(strlen(s) - 4));
  TH_CHECK(r.method_len == 4 && memcmp(r.method, "POST", 4) == 0);
  TH_CHECK(r.path_len == strlen("/v1/chat/completions"));
  TH_CHECK(r.target_len == strlen("/v1/chat/completions?a=b"));
  TH_CHECK_EQ_INT(r.minor_version, 1);
  TH_CHECK_EQ_INT(r.content_length, 42);
  TH_CHECK_EQ_INT(r.keep_alive, 0);
  TH_CHECK_EQ_INT(r.expect_continue, 1);
  TH_CHECK_EQ_INT(r.n_headers, 5);
  const struct fe_http_header *a = fe_http_find_header(&r, "authorization");
  TH_REQUIRE(a != NULL);
  TH_CHECK(a->value_len == 8 && memcmp(a->value, "Bearer k", 8) == 0);
  th_unguard(&g);

  const char *s10 = "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n";
  TH_REQUIRE(parse_guarded(s10, strlen(s10), &r, h, 8) == (int)strlen(s10));
  TH_CHECK_EQ_INT(r.keep_alive, 1);
  TH_CHECK_EQ_INT(r.minor_version, 0);
  TH_CHECK_EQ_INT(r.content_length, -1);
  const char *s10b = "GET / HTTP/1.0\r\n\r\n";
  TH_REQUIRE(parse_guarded(s10b, strlen(s10b), &r, h, 8) == (int)strlen(s10b));
  TH_CHECK_EQ_INT(r.keep_alive, 0);
}

TH_TEST(http_parse_too_many_headers) {
  struct fe_http_header h[4];
  struct fe_http_request r;
  const char *s = "GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n";
  TH_CHECK_EQ_INT(parse_guarded(s, strlen(s), &r, h, 3), CM_ERR_TOOBIG);
  TH_CHECK(parse_guarded(s, strlen(s), &r, h, 4) == (int)strlen(s));
}

/* Every prefix of a good request is "need more"; every prefix of a bad one
 * is "need more" or the same error. */
TH_TEST(http_parse_every_prefix) {
  struct fe_http_header h[16];
  struct fe_http_request req;
  for (size_t i = 0; i < CM_ARRAY_LEN(good); i++) {
    size_t n = strlen(good[i].in);
    for (size_t k = 0; k < n; k++) {
      int rc = parse_guarded(good[i].in, k, &req, h, 16);
      if (rc != CM_ERR_AGAIN) th_fail(__FILE__, __LINE__, "good[%zu] prefix %zu rc %d", i, k, rc);
    }
  }
  for (size_t i = 0; i < CM_ARRAY_LEN(bad); i++) {
    size_t n = strlen(bad[i].in);
    for (size_t k = 0; k < n; k++) {
      int rc = parse_guarded(bad[i].in, k, &req, h, 16);
      if (rc != CM_ERR_AGAIN && rc != bad[i].want)
        th_fail(__FILE__, __LINE__, "bad[%zu] prefix %zu rc %d", i, k, rc);
    }
  }
}

/* Three pipelined requests in one buffer, bodies by Content-Length and
 * chunked, parsed one after another. */
TH_TEST(http_pipelined) {
  const char *s = "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
                  "POST /b HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                  "3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nTrailer: x\r\n\r\n"
                  "GET /c HTTP/1.1\r\nHost: h\r\n\r\n";
  size_t n = strlen(s);
  struct th_guarded g = th_guard(s, n);
  struct fe_http_header h[8];
  struct fe_http_request r;
  size_t pos = 0;
  int rc = fe_http_parse_request(g.data, n, &r, h, 8);
  TH_REQUIRE(rc > 0);
  TH_CHECK(r.path_len == 2 && memcmp(r.path, "/a", 2) == 0);
  pos = (size_t)rc;
  TH_CHECK(memcmp(g.data + pos, "hello", 5) == 0);
  pos += (size_t)r.content_length;
  rc = fe_http_parse_request(g.data + pos, n - pos, &r, h, 8);
  TH_REQUIRE(rc > 0);
  TH_CHECK(r.chunked == 1 && memcmp(r.path, "/b", 2) == 0);
  pos += (size_t)rc;
  char body[16];
  struct fe_http_chunked d;
  fe_http_chunked_init(&d);
  size_t got = 0;
  int64_t used = fe_http_chunked_decode(&d, g.data + pos, n - pos, body, sizeof(body), &got);
  TH_REQUIRE(used > 0 && d.done);
  TH_CHECK(got == 5 && memcmp(body, "abcde", 5) == 0);
  pos += (size_t)used;
  rc = fe_http_parse_request(g.data + pos, n - pos, &r, h, 8);
  TH_REQUIRE(rc > 0);
  TH_CHECK(memcmp(r.path, "/c", 2) == 0);
  TH_CHECK_EQ_INT(pos + (size_t)rc, n);
  th_unguard(&g);
}

/* Decodes `s` fed in two parts split at `cut`; returns the decoded body in
 * out (NUL-terminated) or the error code. */
static int64_t decode_split(const char *s, size_t n, size_t cut, char *out, size_t cap,
                            struct fe_http_chunked *d) {
  fe_http_chunked_init(d);
  size_t total = 0, got = 0, pos = 0;
  size_t ends[2] = {cut, n};
  for (int part = 0; part < 2 && !d->done; part++) {
    struct th_guarded g = th_guard(s + pos, ends[part] - pos);
    int64_t used =
        fe_http_chunked_decode(d, g.data, ends[part] - pos, out + total, cap - total, &got);
    th_unguard(&g);
    if (used < 0) return used;
    total += got;
    pos += (size_t)used;
    if (!d->done && pos != ends[part]) return -1000; /* must consume all when not done */
  }
  out[total] = 0;
  return d->done ? (int64_t)pos : CM_ERR_AGAIN;
}

TH_TEST(http_chunked_every_split) {
  static const struct {
    const char *in, *want;
  } ok[] = {
      {"5\r\nhello\r\n0\r\n\r\n", "hello"},
      {"5\nhello\n0\n\n", "hello"},
      {"1;a=b;c\r\nx\r\nA\r\n0123456789\r\n0\r\n\r\n", "x0123456789"},
      {"0\r\nX-T: 1\r\nY: 2\r\n\r\n", ""},
      {"00003 \r\nabc\r\n0\r\n\r\n", "abc"},
  };
  char out[64];
  struct fe_http_chunked d;
  for (size_t i = 0; i < CM_ARRAY_LEN(ok); i++) {
    size_t n = strlen(ok[i].in);
    for (size_t cut = 0; cut <= n; cut++) {
      int64_t rc = decode_split(ok[i].in, n, cut, out, sizeof(out) - 1, &d);
      if (rc != (int64_t)n || strcmp(out, ok[i].want) != 0)
        th_fail(__FILE__, __LINE__, "ok[%zu] cut %zu rc %lld", i, cut, (long long)rc);
    }
  }
  static const char *const badc[] = {
      "x\r\n",
      "\r\n",
      "-1\r\n",
      "5\r\nhelloX\r\n",
      "5\r\nhello\r\r\n",
      "3\rabc",
      "fffffffffffffffffff\r\n",
      "0\r\n bad\r\n\r\n",
      "0\r\nA: \x01\r\n\r\n",
      "1;\x01\r\nx\r\n",
      "0\r\n\rX",
  };
  for (size_t i = 0; i < CM_ARRAY_LEN(badc); i++) {
    size_t n = strlen(badc[i]);
    for (size_t cut = 0; cut <= n; cut++) {
      int64_t rc = decode_split(badc[i], n, cut, out, sizeof(out) - 1, &d);
      if (rc != CM_ERR_PARSE && rc != CM_ERR_TOOBIG)
        th_fail(__FILE__, __LINE__, "bad chunked[%zu] cut %zu rc %lld", i, cut, (long long)rc);
    }
  }
}

TH_TEST(http_chunked_limits) {
  char out[8];
  size_t got;
  struct fe_http_chunked d;
  fe_http_chunked_init(&d);
  const char *s = "9\r\n123456789\r\n0\r\n\r\n";
  TH_CHECK_EQ_INT(fe_http_chunked_decode(&d, s, strlen(s), out, sizeof(out), &got), CM_ERR_TOOBIG);
  /* a size line longer than the limit */
  size_t n = FE_HTTP_CHUNK_LINE_MAX + 16;
  char *big = malloc(n);
  TH_REQUIRE(big);
  memset(big, '0', n);
  fe_http_chunked_init(&d);
  TH_CHECK_EQ_INT(fe_http_chunked_decode(&d, big, n, out, sizeof(out), &got), CM_ERR_TOOBIG);
  free(big);
  /* a declared size past the room left is refused on its size line, before
   * any of its data (and before the line ends) */
  fe_http_chunked_init(&d);
  TH_CHECK_EQ_INT(fe_http_chunked_decode(&d, "10", 2, out, sizeof(out), &got), CM_ERR_TOOBIG);
  TH_CHECK(got == 0 && d.error && strstr(d.error, "limit"));
  fe_http_chunked_init(&d);
  s = "4\r\nabcd\r\n";
  TH_CHECK_EQ_INT(fe_http_chunked_decode(&d, s, strlen(s), out, sizeof(out), &got),
                  (int64_t)strlen(s));
  TH_CHECK_EQ_INT(got, 4);
  TH_CHECK_EQ_INT(fe_http_chunked_decode(&d, "5\r\n", 3, out + 4, sizeof(out) - 4, &got),
                  CM_ERR_TOOBIG);
  fe_http_chunked_init(&d); /* exactly the room left is fine */
  s = "8\r\n";
  TH_CHECK_EQ_INT(fe_http_chunked_decode(&d, s, strlen(s), out, sizeof(out), &got), 3);
  /* sizes that overflow 64 bits, with and without leading zeros */
  static const char *const huge[] = {"ffffffffffffffffffffffff\r\n",
                                     "00000000000000000000010000000000000000000\r\n",
                                     "7fffffffffffffff;ext\r\n"};
  for (size_t i = 0; i < CM_ARRAY_LEN(huge); i++) {
    fe_http_chunked_init(&d);
    TH_CHECK_EQ_INT(fe_http_chunked_decode(&d, huge[i], strlen(huge[i]), out, sizeof(out), &got),
                    CM_ERR_TOOBIG);
  }
  /* in place: output aliases input */
  char buf[] = "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
  fe_http_chunked_init(&d);
  int64_t used = fe_http_chunked_decode(&d, buf, strlen(buf), buf, sizeof(buf), &got);
  TH_CHECK_EQ_INT(used, (int64_t)strlen("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"));
  TH_CHECK(got == 5 && memcmp(buf, "abcde", 5) == 0);
}
