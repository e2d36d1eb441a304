/* fuzz-http.c — fuzz target for the frontend's decoders of untrusted
 * bytes: the input is a stream of pipelined requests, parsed the way the
 * server does (head, then a body by Content-Length or chunked; a head is
 * also checked against its shorter prefixes), and every body goes through
 * the OpenAI request validator as each of the four request kinds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "frontend/fe-api.h"
#include "frontend/fe-http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Validation either succeeds with sane fields or fails with a 4xx. */
static void validate(const char *body, size_t len) {
  static const struct fe_api_config cfg = {"m", 64};
  for (int k = FE_API_COMPLETION; k <= FE_API_DETOKENIZE; k++) {
    struct fe_api_request r;
    struct fe_api_error e;
    if (fe_api_parse_request((enum fe_api_kind)k, body, len, &cfg, &r, &e) != 0) {
      CM_ASSERT(e.status >= 400 && e.status < 500 && e.message[0]);
      continue;
    }
    if (fe_api_check_grammars(&r, &e) != 0) CM_ASSERT(e.status >= 400 && e.status < 500);
    CM_ASSERT(r.n >= 1 && r.temperature >= 0 && r.temperature <= 2 && r.top_p > 0 && r.top_p <= 1);
    CM_ASSERT(r.top_k == -1 || r.top_k >= 1);
    for (size_t i = 0; i < r.n_prompts; i++)
      CM_ASSERT(r.prompts[i].text || r.prompts[i].ids);
    fe_api_request_free(&r);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *buf = (const char *)data;
  struct fe_http_header h[32];
  struct fe_http_request r;
  size_t pos = 0;
  char *body = malloc(size + 1);
  if (!body) return 0;
  while (pos < size) {
    int rc = fe_http_parse_request(buf + pos, size - pos, &r, h, CM_ARRAY_LEN(h));
    if (rc <= 0) {
      CM_ASSERT(rc == CM_ERR_AGAIN || r.error != NULL);
      break;
    }
    CM_ASSERT((size_t)rc <= size - pos && r.n_headers <= CM_ARRAY_LEN(h));
    CM_ASSERT(r.path_len <= r.target_len && r.method_len > 0);
    /* a shorter prefix of a complete head is never complete */
    if (rc > 1) CM_ASSERT(fe_http_parse_request(buf + pos, (size_t)rc - 1, &r, h, 32) <= 0);
    rc = fe_http_parse_request(buf + pos, size - pos, &r, h, CM_ARRAY_LEN(h));
    pos += (size_t)rc;
    if (r.chunked) {
      struct fe_http_chunked d;
      fe_http_chunked_init(&d);
      size_t got = 0;
      /* feed in two halves to exercise resumption */
      size_t half = (size - pos) / 2, total = 0;
      int64_t u = fe_http_chunked_decode(&d, buf + pos, half, body, size, &got);
      if (u < 0) break;
      CM_ASSERT((size_t)u <= half && got <= (size_t)u);
      pos += (size_t)u;
      total += got;
      if (!d.done) {
        u = fe_http_chunked_decode(&d, buf + pos, size - pos, body + total, size - total, &got);
        if (u < 0) break;
        pos += (size_t)u;
        total += got;
      }
      CM_ASSERT(total == d.total);
      if (!d.done) break;
      validate(body, total);
    } else if (r.content_length > 0) {
      if ((uint64_t)r.content_length > size - pos) break;
      validate(buf + pos, (size_t)r.content_length);
      pos += (size_t)r.content_length;
    }
  }
  free(body);
  return 0;
}
