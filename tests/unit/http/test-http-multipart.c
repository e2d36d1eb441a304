/* test-http-multipart.c — multipart/form-data bodies (frontend/fe-multipart.c)
 * and the audio endpoints' forms (fe-api-audio.c): good bodies as curl and the
 * OpenAI clients write them, a table of bad ones, and every prefix of a good
 * body. Bodies sit right before a PROT_NONE guard page, so reading one byte
 * too far crashes the test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "frontend/fe-api.h"
#include "frontend/fe-b64.h"
#include "frontend/fe-multipart.h"
#include "tests/harness/th-guard.h"
#include "tests/harness/th.h"

static int parse(const char *ctype, const char *body, size_t len, struct fe_form_part *p, size_t *n,
                 char *err, size_t errlen) {
  struct th_guarded g = th_guard(body, len);
  int rc =
      fe_multipart_parse(ctype, strlen(ctype), g.data, len, p, FE_FORM_MAX_PARTS, n, err, errlen);
  /* the parts point into the guarded copy: check them before it goes */
  static char copy[4][64];
  for (size_t i = 0; !rc && i < *n && i < 4; i++) {
    size_t k = p[i].len < 63 ? p[i].len : 63;
    memcpy(copy[i], p[i].data, k);
    copy[i][k] = 0;
    p[i].data = copy[i];
    p[i].name = NULL; /* the copy's names are gone with it: tests look at data */
  }
  th_unguard(&g);
  return rc;
}

static const char body1[] =
    "preamble to ignore\r\n"
    "--XyZ\r\n"
    "Content-Disposition: form-data; name=\"model\"\r\n"
    "\r\n"
    "gemma\r\n"
    "--XyZ\r\n"
    "content-disposition: form-data; name=\"file\"; filename=\"a b.wav\"\r\n"
    "Content-Type: audio/wav\r\n"
    "\r\n"
    "RIFF\r\n--Xy\r\n\r\nz\r\n"
    "--XyZ\r\n"
    "Content-Disposition: form-data; name=\"empty\"\r\n"
    "\r\n"
    "\r\n"
    "--XyZ--\r\n"
    "epilogue";

TH_TEST(multipart_parts_as_written) {
  struct fe_form_part p[FE_FORM_MAX_PARTS];
  size_t n;
  char err[256];
  struct th_guarded g = th_guard(body1, sizeof(body1) - 1);
  const char *ct = "multipart/form-data; boundary=XyZ";
  TH_CHECK_EQ_INT(fe_multipart_parse(ct, strlen(ct), g.data, sizeof(body1) - 1, p,
                                     FE_FORM_MAX_PARTS, &n, err, sizeof(err)),
                  0);
  TH_REQUIRE(n == 3);
  TH_CHECK(p[0].name_len == 5 && !memcmp(p[0].name, "model", 5));
  TH_CHECK(p[0].len == 5 && !memcmp(p[0].data, "gemma", 5) && !p[0].filename);
  TH_CHECK(p[1].name_len == 4 && !memcmp(p[1].name, "file", 4));
  TH_CHECK(p[1].filename_len == 7 && !memcmp(p[1].filename, "a b.wav", 7));
  TH_CHECK(p[1].ctype_len == 9 && !memcmp(p[1].ctype, "audio/wav", 9));
  /* CR, LF and a near-boundary inside the data are data */
  TH_CHECK(p[1].len == 15 && !memcmp(p[1].data, "RIFF\r\n--Xy\r\n\r\nz", 15));
  TH_CHECK_EQ_INT(p[2].len, 0);
  TH_CHECK(fe_form_find(p, n, "file") == &p[1] && !fe_form_find(p, n, "fil"));
  /* a quoted boundary, another parameter before it, the type's case */
  const char *ct2 = "Multipart/Form-Data; charset=\"a;b\"; boundary=\"XyZ\"";
  TH_CHECK_EQ_INT(fe_multipart_parse(ct2, strlen(ct2), g.data, sizeof(body1) - 1, p,
                                     FE_FORM_MAX_PARTS, &n, err, sizeof(err)),
                  0);
  TH_CHECK_EQ_INT(n, 3);
  th_unguard(&g);
}

TH_TEST(multipart_bad_bodies_are_named) {
  static const struct {
    const char *ctype, *body, *says;
  } bad[] = {
      {"application/json", "{}", "multipart/form-data"},
      {"multipart/form-datax; boundary=a", "--a--", "multipart/form-data"},
      {"multipart/form-data", "--a--", "boundary"},
      {"multipart/form-data; boundary=", "--a--", "boundary"},
      {"multipart/form-data; boundary=\"a", "--a--", "boundary"},
      {"multipart/form-data; boundary=a", "no delimiter", "without its boundary"},
      {"multipart/form-data; boundary=a", "--a\r\nContent-Disposition: form-data; name=x\r\n\r\nv",
       "closing boundary"},
      {"multipart/form-data; boundary=a", "--a", "closing boundary"},
      {"multipart/form-data; boundary=a", "--aX\r\n", "not followed by CRLF"},
      {"multipart/form-data; boundary=a", "--a\r\nContent-Disposition: form-data; name=x\r\n--a--",
       "headers do not end"},
      {"multipart/form-data; boundary=a", "--a\r\n\r\nv\r\n--a--", "no Content-Disposition"},
      {"multipart/form-data; boundary=a", "--a\r\nX-Other: 1\r\n\r\nv\r\n--a--",
       "no Content-Disposition"},
      {"multipart/form-data; boundary=a",
       "--a\r\nContent-Disposition: attachment; name=x\r\n\r\nv\r\n--a--", "not form-data"},
      {"multipart/form-data; boundary=a",
       "--a\r\nContent-Disposition: form-data; filename=y\r\n\r\nv\r\n--a--", "has no name"},
      {"multipart/form-data; boundary=a",
       "--a\r\nContent-Disposition: form-data; name=x; filename=\"y\r\n\r\nv\r\n--a--", "filename"},
      {"multipart/form-data; boundary=a", "--a\r\nno colon here\r\n\r\nv\r\n--a--", "':'"},
  };
  struct fe_form_part p[FE_FORM_MAX_PARTS];
  size_t n;
  char err[256];
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    err[0] = 0;
    int rc = parse(bad[i].ctype, bad[i].body, strlen(bad[i].body), p, &n, err, sizeof(err));
    if (rc == 0 || !strstr(err, bad[i].says))
      fprintf(stderr, "bad body %zu: rc %d, '%s' (wanted '%s')\n", i, rc, err, bad[i].says);
    TH_CHECK(rc == CM_ERR_INVAL && strstr(err, bad[i].says));
  }
  /* more parts than the caller has room for */
  char many[4096] = "";
  for (int i = 0; i < FE_FORM_MAX_PARTS + 1; i++)
    strcat(many, "--a\r\nContent-Disposition: form-data; name=f\r\n\r\nv\r\n");
  strcat(many, "--a--");
  TH_CHECK_EQ_INT(
      parse("multipart/form-data; boundary=a", many, strlen(many), p, &n, err, sizeof(err)),
      CM_ERR_TOOBIG);
}

/* Every prefix of a good body ends cleanly: parsed (only once the closing
 * delimiter is in) or refused, never read past. */
TH_TEST(multipart_every_prefix) {
  struct fe_form_part p[FE_FORM_MAX_PARTS];
  size_t n;
  char err[256];
  const size_t len = sizeof(body1) - 1, closed = (size_t)(strstr(body1, "--XyZ--") - body1) + 7;
  for (size_t k = 0; k <= len; k++) {
    int rc = parse("multipart/form-data; boundary=XyZ", body1, k, p, &n, err, sizeof(err));
    TH_CHECK(k >= closed ? rc == 0 && n == 3 : rc == CM_ERR_INVAL);
  }
}

/* A form as the OpenAI clients send it to /v1/audio/transcriptions. */
static size_t form(char *out, size_t cap, const char *const *fields, const char *file,
                   size_t file_len) {
  size_t k = 0;
  for (size_t i = 0; fields[i]; i += 2)
    k += (size_t)snprintf(out + k, cap - k,
                          "--B\r\nContent-Disposition: form-data; name=\"%s\"\r\n\r\n%s\r\n",
                          fields[i], fields[i + 1]);
  if (file) {
    k += (size_t)snprintf(out + k, cap - k,
                          "--B\r\nContent-Disposition: form-data; name=\"file\"; "
                          "filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n");
    memcpy(out + k, file, file_len);
    k += file_len;
    k += (size_t)snprintf(out + k, cap - k, "\r\n");
  }
  k += (size_t)snprintf(out + k, cap - k, "--B--\r\n");
  return k;
}

static int audio(int translate, const char *const *fields, const char *file, size_t file_len,
                 struct fe_api_request *r, struct fe_api_error *e) {
  static const struct fe_api_config cfg = {"gemma", 0};
  static char body[8192];
  size_t n = form(body, sizeof(body), fields, file, file_len);
  const char *ct = "multipart/form-data; boundary=B";
  return fe_api_parse_audio(translate, ct, strlen(ct), body, n, &cfg, r, e);
}

static const char wav[] = "RIFF\x24\x00\x00\x00WAVEfmt junk that the decoder judges later";

TH_TEST(audio_form_becomes_a_chat_turn) {
  struct fe_api_request r;
  struct fe_api_error e;
  const char *f1[] = {
      "model", "gemma", "language", "de", "temperature", "0", "max_completion_tokens",
      "7",     "seed",  "3",        NULL};
  TH_REQUIRE(audio(0, f1, wav, sizeof(wav) - 1, &r, &e) == 0);
  TH_CHECK(r.kind == FE_API_CHAT && r.audio_api == FE_API_AUDIO_JSON && !r.stream);
  TH_CHECK(r.n_messages == 1 && r.messages[0].role == FE_API_ROLE_USER);
  TH_CHECK_EQ_STR(r.messages[0].content, "Transcribe this audio into German:");
  TH_REQUIRE(r.n_images == 1 && r.n_audio == 1 && r.images[0].audio && r.n_messages == 1);
  TH_CHECK_EQ_STR(r.images[0].format, "wav");
  TH_CHECK_EQ_STR(r.images[0].param, "file");
  uint8_t *raw;
  size_t raw_n;
  char err[128];
  TH_CHECK_EQ_INT(fe_b64_decode((const unsigned char *)r.images[0].url, r.images[0].url_len,
                                1 << 20, "audio", &raw, &raw_n, err, sizeof(err)),
                  0);
  TH_CHECK(raw_n == sizeof(wav) - 1 && !memcmp(raw, wav, raw_n)); /* the bytes, unchanged */
  free(raw);
  TH_CHECK(r.temperature == 0 && r.max_tokens == 7 && r.has_seed && r.seed == 3);
  fe_api_request_free(&r);
  /* translations, the text form, and bytes that are not WAV go to the MP3 decoder */
  const char *f2[] = {"response_format", "text", NULL};
  TH_REQUIRE(audio(1, f2, "ID3 not wav", 11, &r, &e) == 0);
  TH_CHECK_EQ_STR(r.messages[0].content, "Translate this audio into English:");
  TH_CHECK(r.temperature == 0); /* the endpoints' default */
  TH_CHECK(r.audio_api == FE_API_AUDIO_TEXT);
  TH_CHECK_EQ_STR(r.images[0].format, "mp3");
  fe_api_request_free(&r);
  const char *f3[] = {"language", "fr", "stream", "false", NULL};
  TH_REQUIRE(audio(1, f3, wav, sizeof(wav) - 1, &r, &e) == 0);
  TH_CHECK_EQ_STR(r.messages[0].content, "Translate this audio from French into English:");
  TH_CHECK(!r.stream);
  fe_api_request_free(&r);
  const char *f5[] = {"language", "ja", "to_language", "de", NULL};
  TH_REQUIRE(audio(1, f5, wav, sizeof(wav) - 1, &r, &e) == 0);
  TH_CHECK_EQ_STR(r.messages[0].content, "Translate this audio from Japanese into German:");
  fe_api_request_free(&r);
  const char *f4[] = {"stream", "true", NULL};
  TH_REQUIRE(audio(0, f4, wav, sizeof(wav) - 1, &r, &e) == 0);
  TH_CHECK(r.stream && r.audio_api == FE_API_AUDIO_JSON);
  fe_api_request_free(&r);
}

TH_TEST(audio_form_refusals_name_the_field) {
  static const struct {
    const char *k, *v, *param;
  } bad[] = {
      {"response_format", "verbose_json", "response_format"},
      {"language", "xx", "language"},
      {"language", "english", "language"},
      {"to_language", "de", "to_language"}, /* transcriptions have none */
      {"prompt", "earlier text", "prompt"},
      {"stream", "yes", "stream"},
      {"timestamp_granularities[]", "word", "timestamp_granularities[]"},
      {"temperature", "hot", "temperature"},
      {"temperature", "3", "temperature"},
      {"top_k", "1.5", "top_k"},
      {"max_completion_tokens", "0", "max_completion_tokens"},
      {"model", "other", "model"},
      {"model", "\xff\xfe", "model"},
  };
  struct fe_api_request r;
  struct fe_api_error e;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    const char *f[] = {bad[i].k, bad[i].v, NULL};
    int rc = audio(0, f, wav, sizeof(wav) - 1, &r, &e);
    if (rc == 0) fe_api_request_free(&r);
    if (rc == 0 || strcmp(e.param, bad[i].param))
      fprintf(stderr, "field %s=%s: rc %d, param '%s', '%s'\n", bad[i].k, bad[i].v, rc, e.param,
              e.message);
    TH_CHECK(rc != 0 && e.status >= 400 && e.status < 500 && !strcmp(e.param, bad[i].param));
  }
  const char *none[] = {NULL};
  TH_CHECK(audio(0, none, NULL, 0, &r, &e) != 0 && !strcmp(e.param, "file"));
  TH_CHECK(audio(0, none, "", 0, &r, &e) != 0 && !strcmp(e.param, "file"));
  static const struct fe_api_config cfg = {"gemma", 0};
  TH_CHECK(fe_api_parse_audio(0, "application/json", 16, "{}", 2, &cfg, &r, &e) != 0 &&
           e.status == 400);
}

TH_TEST(base64_encode_round_trips) {
  uint8_t bytes[64];
  for (size_t i = 0; i < sizeof(bytes); i++)
    bytes[i] = (uint8_t)(i * 37 + 11);
  for (size_t n = 0; n <= sizeof(bytes); n++) {
    char *s;
    size_t sl;
    TH_CHECK_EQ_INT(fe_b64_encode(bytes, n, &s, &sl), 0);
    TH_CHECK(sl == (n + 2) / 3 * 4 && strlen(s) == sl);
    if (n) {
      uint8_t *back;
      size_t bn;
      char err[128];
      TH_CHECK_EQ_INT(
          fe_b64_decode((const unsigned char *)s, sl, 1024, "x", &back, &bn, err, sizeof(err)), 0);
      TH_CHECK(bn == n && !memcmp(back, bytes, n));
      free(back);
    }
    free(s);
  }
  char *s;
  size_t sl;
  TH_CHECK_EQ_INT(fe_b64_encode((const uint8_t *)"Man", 3, &s, &sl), 0);
  TH_CHECK_EQ_STR(s, "TWFu"); /* RFC 4648's examples */
  free(s);
  TH_CHECK_EQ_INT(fe_b64_encode((const uint8_t *)"fo", 2, &s, &sl), 0);
  TH_CHECK_EQ_STR(s, "Zm8=");
  free(s);
  TH_CHECK_EQ_INT(fe_b64_encode((const uint8_t *)"f", 1, &s, &sl), 0);
  TH_CHECK_EQ_STR(s, "Zg==");
  free(s);
}
