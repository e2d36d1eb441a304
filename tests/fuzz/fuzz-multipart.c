/* fuzz-multipart.c — fuzz target for the audio endpoints' bodies
 * (frontend/fe-multipart.c, fe-api-audio.c): the input's first line is the
 * Content-Type, the rest the body. It goes through fe_multipart_parse, whose
 * parts must lie inside the body, and through fe_api_parse_audio for both
 * endpoints, which must give a chat request of one turn with one clip or a
 * 4xx/5xx with a message; any other outcome aborts (a finding). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "frontend/fe-api.h"
#include "frontend/fe-multipart.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int inside(const char *p, size_t n, const char *body, size_t len) {
  return p >= body && p <= body + len && n <= (size_t)(body + len - p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *nl = memchr(data, '\n', size);
  size_t cl = nl ? (size_t)(nl - (const char *)data) : size;
  char *ctype = malloc(cl + 1), *body = malloc(size - cl + 1);
  if (!ctype || !body) abort();
  memcpy(ctype, data, cl);
  ctype[cl] = 0;
  size_t len = nl ? size - cl - 1 : 0;
  memcpy(body, nl ? nl + 1 : "", len);
  struct fe_form_part p[FE_FORM_MAX_PARTS];
  size_t n = 0;
  char err[256] = "";
  int rc = fe_multipart_parse(ctype, cl, body, len, p, FE_FORM_MAX_PARTS, &n, err, sizeof(err));
  if (rc == 0) {
    if (n > FE_FORM_MAX_PARTS) abort();
    for (size_t i = 0; i < n; i++)
      if (!p[i].name || !inside(p[i].name, p[i].name_len, body, len) ||
          !inside(p[i].data, p[i].len, body, len) ||
          (p[i].filename && !inside(p[i].filename, p[i].filename_len, body, len)) ||
          (p[i].ctype && !inside(p[i].ctype, p[i].ctype_len, body, len)))
        abort();
  } else if (rc > 0 || !err[0]) {
    abort();
  }
  static const struct fe_api_config cfg = {"m", 64};
  for (int t = 0; t < 2; t++) {
    struct fe_api_request r;
    struct fe_api_error e;
    if (fe_api_parse_audio(t, ctype, cl, body, len, &cfg, &r, &e) != 0) {
      if (e.status < 400 || e.status > 599 || !e.message[0]) abort();
      continue;
    }
    if (r.kind != FE_API_CHAT || r.n_messages != 1 || r.n_audio != 1 || !r.audio_api) abort();
    fe_api_request_free(&r);
  }
  free(ctype);
  free(body);
  return 0;
}
