/* fe-api-audio.c — POST /v1/audio/transcriptions and /v1/audio/translations
 * (OpenAI's audio API, as vLLM serves it for audio chat models): the
 * multipart form turned into the chat request a Gemma audio model answers,
 * one user turn holding the instruction and the clip (fe-api.h). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "frontend/fe-api.h"
#include "frontend/fe-b64.h"
#include "frontend/fe-multipart.h"

/* ISO 639-1 codes and the names the instruction uses */
static const char *const langs[][2] = {
    {"af", "Afrikaans"},  {"ar", "Arabic"},     {"bg", "Bulgarian"}, {"bn", "Bengali"},
    {"ca", "Catalan"},    {"cs", "Czech"},      {"cy", "Welsh"},     {"da", "Danish"},
    {"de", "German"},     {"el", "Greek"},      {"en", "English"},   {"es", "Spanish"},
    {"et", "Estonian"},   {"fa", "Persian"},    {"fi", "Finnish"},   {"fr", "French"},
    {"gu", "Gujarati"},   {"he", "Hebrew"},     {"hi", "Hindi"},     {"hr", "Croatian"},
    {"hu", "Hungarian"},  {"id", "Indonesian"}, {"is", "Icelandic"}, {"it", "Italian"},
    {"ja", "Japanese"},   {"kn", "Kannada"},    {"ko", "Korean"},    {"lt", "Lithuanian"},
    {"lv", "Latvian"},    {"ml", "Malayalam"},  {"mr", "Marathi"},   {"ms", "Malay"},
    {"nl", "Dutch"},      {"no", "Norwegian"},  {"pa", "Punjabi"},   {"pl", "Polish"},
    {"pt", "Portuguese"}, {"ro", "Romanian"},   {"ru", "Russian"},   {"sk", "Slovak"},
    {"sl", "Slovenian"},  {"sr", "Serbian"},    {"sv", "Swedish"},   {"sw", "Swahili"},
    {"ta", "Tamil"},      {"te", "Telugu"},     {"th", "Thai"},      {"tl", "Tagalog"},
    {"tr", "Turkish"},    {"uk", "Ukrainian"},  {"ur", "Urdu"},      {"vi", "Vietnamese"},
    {"zh", "Chinese"},
};

static int fail(struct fe_api_error *err, const char *param, const char *msg) {
  err->status = 400;
  snprintf(err->param, sizeof(err->param), "%s", param ? param : "");
  snprintf(err->message, sizeof(err->message), "%s", msg);
  return CM_ERR_INVAL;
}

static int oom(struct fe_api_error *err) {
  err->status = 500;
  snprintf(err->message, sizeof(err->message), "out of memory");
  return CM_ERR_NOMEM;
}

/* 1 when a field's value is exactly lit. */
static int value_is(const struct fe_form_part *p, const char *lit) {
  size_t n = strlen(lit);
  return p->len == n && !memcmp(p->data, lit, n);
}

/* A text field's value as a NUL-terminated copy in buf; 0, or -1 when too long. */
static int field(const struct fe_form_part *p, char *buf, size_t cap) {
  if (p->len >= cap) return -1;
  memcpy(buf, p->data, p->len);
  buf[p->len] = 0;
  return 0;
}

/* The sampling fields vLLM's audio endpoints take besides temperature, with
 * their JSON types: each is handed to the chat request's own checks. */
static const struct {
  const char *name;
  int integer;
} sampling[] = {
    {"temperature", 0},
    {"top_p", 0},
    {"top_k", 1},
    {"min_p", 0},
    {"seed", 1},
    {"repetition_penalty", 0},
    {"presence_penalty", 0},
    {"frequency_penalty", 0},
    {"max_completion_tokens", 1},
};

/* OpenAI's fields that ask for what these endpoints do not give */
static const char *const refused[] = {"prompt", "timestamp_granularities[]", "include[]",
                                      "chunking_strategy"};

static int add_sampling(json_t *req, const struct fe_form_part *parts, size_t n,
                        struct fe_api_error *err) {
  char v[64], msg[160];
  for (size_t i = 0; i < sizeof(sampling) / sizeof(sampling[0]); i++) {
    const struct fe_form_part *p = fe_form_find(parts, n, sampling[i].name);
    if (!p) continue;
    char *end = NULL;
    json_t *j = NULL;
    if (field(p, v, sizeof(v)) == 0 && v[0]) {
      if (sampling[i].integer) {
        long long x = strtoll(v, &end, 10);
        if (end && !*end) j = json_integer(x);
      } else {
        double x = strtod(v, &end);
        if (end && !*end) j = json_real(x);
      }
    }
    if (!j) {
      snprintf(msg, sizeof(msg), "'%s' must be %s", sampling[i].name,
               sampling[i].integer ? "an integer" : "a number");
      return fail(err, sampling[i].name, msg);
    }
    json_object_set_new(req, sampling[i].name, j);
  }
  return 0;
}

/* A language field's name for the instruction: 0 with *name NULL when the
 * field is absent or empty, -1 (err filled) when the code is not one we know. */
static int lang_name(const struct fe_form_part *p, const char *field_name, const char **name,
                     struct fe_api_error *err) {
  *name = NULL;
  if (!p || !p->len) return 0;
  char code[8], msg[160];
  if (field(p, code, sizeof(code)) == 0)
    for (size_t i = 0; i < sizeof(langs) / sizeof(langs[0]) && !*name; i++)
      if (!strcmp(code, langs[i][0])) *name = langs[i][1];
  if (*name) return 0;
  snprintf(msg, sizeof(msg),
           "'%s' must be an ISO 639-1 code this server knows (\"en\", \"de\", \"fr\", ...)",
           field_name);
  return fail(err, field_name, msg);
}

/* The instruction, as vLLM words Gemma's: "Transcribe this audio[ into L]:";
 * "Translate this audio[ from L] into T:" (T: to_language, English by default). */
static int instruction(int translate, const struct fe_form_part *parts, size_t n, char *out,
                       size_t cap, struct fe_api_error *err) {
  const char *from, *to;
  if (lang_name(fe_form_find(parts, n, "language"), "language", &from, err) ||
      lang_name(fe_form_find(parts, n, "to_language"), "to_language", &to, err))
    return CM_ERR_INVAL;
  if (!translate && to) return fail(err, "to_language", "'to_language' is for translations");
  size_t k = (size_t)snprintf(out, cap, "%s this audio", translate ? "Translate" : "Transcribe");
  if (from && k < cap)
    k += (size_t)snprintf(out + k, cap - k, translate ? " from %s" : " into %s", from);
  if (translate && k < cap)
    k += (size_t)snprintf(out + k, cap - k, " into %s", to ? to : "English");
  if (k < cap) snprintf(out + k, cap - k, ":");
  return 0;
}

int fe_api_parse_audio(int translate, const char *ctype, size_t ctype_len, const char *body,
                       size_t len, const struct fe_api_config *cfg, struct fe_api_request *out,
                       struct fe_api_error *err) {
  memset(out, 0, sizeof(*out));
  memset(err, 0, sizeof(*err));
  struct fe_form_part parts[FE_FORM_MAX_PARTS];
  size_t n;
  char why[256];
  if (fe_multipart_parse(ctype, ctype_len, body, len, parts, FE_FORM_MAX_PARTS, &n, why,
                         sizeof(why)))
    return fail(err, NULL, why);
  const struct fe_form_part *file = fe_form_find(parts, n, "file");
  if (!file || !file->len)
    return fail(err, "file", "'file' is required: the audio clip (WAV or MP3) as a form part");
  char msg[200], text[96];
  for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
    const struct fe_form_part *p = fe_form_find(parts, n, refused[i]);
    if (!p) continue;
    snprintf(msg, sizeof(msg), "'%s' is not supported on this endpoint", refused[i]);
    return fail(err, refused[i], msg);
  }
  int stream = 0;
  const struct fe_form_part *sp = fe_form_find(parts, n, "stream");
  if (sp && value_is(sp, "true"))
    stream = 1;
  else if (sp && !value_is(sp, "false"))
    return fail(err, "stream", "'stream' must be true or false");
  int format = FE_API_AUDIO_JSON;
  const struct fe_form_part *rf = fe_form_find(parts, n, "response_format");
  if (rf) {
    if (value_is(rf, "text"))
      format = FE_API_AUDIO_TEXT;
    else if (!value_is(rf, "json"))
      return fail(err, "response_format", "'response_format' must be \"json\" or \"text\"");
  }
  int rc = instruction(translate, parts, n, text, sizeof(text), err);
  if (rc) return rc;
  /* WAV by its RIFF/RF64 header; anything else goes to the MP3 decoder, which
   * names what the bytes are when they are not MP3 either */
  const char *fmt = file->len >= 12 &&
                            (!memcmp(file->data, "RIFF", 4) || !memcmp(file->data, "RF64", 4)) &&
                            !memcmp(file->data + 8, "WAVE", 4)
                        ? "wav"
                        : "mp3";
  char *b64 = NULL;
  size_t b64_len;
  if (fe_b64_encode((const uint8_t *)file->data, file->len, &b64, &b64_len)) return oom(err);
  json_t *req = json_object(), *model = NULL;
  const struct fe_form_part *mp = fe_form_find(parts, n, "model");
  if (mp && !(model = json_stringn(mp->data, mp->len))) {
    free(b64);
    json_decref(req);
    return fail(err, "model", "'model' must be UTF-8 text");
  }
  json_t *msgs = json_pack("[{s:s, s:[{s:s, s:s}, {s:s, s:{s:s%, s:s}}]}]", "role", "user",
                           "content", "type", "text", "text", text, "type", "input_audio",
                           "input_audio", "data", b64, b64_len, "format", fmt);
  free(b64);
  rc = req && msgs ? 0 : CM_ERR_NOMEM;
  if (!rc) {
    json_object_set_new(req, "messages", msgs);
    msgs = NULL;
    /* OpenAI's and vLLM's default for these endpoints, where chat's is 1 */
    json_object_set_new(req, "temperature", json_real(0.0));
    if (model) json_object_set_new(req, "model", model), model = NULL;
    if (stream) json_object_set_new(req, "stream", json_true());
    rc = add_sampling(req, parts, n, err);
  }
  json_decref(msgs);
  json_decref(model);
  if (rc) {
    json_decref(req);
    return rc == CM_ERR_NOMEM ? oom(err) : rc;
  }
  char *js = json_dumps(req, JSON_COMPACT);
  json_decref(req);
  if (!js) return oom(err);
  rc = fe_api_parse_request(FE_API_CHAT, js, strlen(js), cfg, out, err);
  free(js);
  if (rc) { /* the chat request's own field names, in the form's terms */
    if (!strncmp(err->param, "messages", 8)) snprintf(err->param, sizeof(err->param), "file");
    if (!strcmp(err->param, "max_tokens"))
      snprintf(err->param, sizeof(err->param), "max_completion_tokens");
    return rc;
  }
  out->audio_api = format;
  snprintf(out->images[0].param, sizeof(out->images[0].param), "file"); /* for the decoder's errors */
  return 0;
}
