/* fe-api-req.c — parses and validates OpenAI request bodies with Jansson
 * (see fe-api.h). Ranges follow the OpenAI reference and vLLM's checks. */
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-hash.h"
#include "frontend/fe-api-error.h"
#include "frontend/fe-api-resp.h"
#include "frontend/fe-api.h"
#include "grammar/gr.h"
#include "model/md-config.h"
#include "model/md-vision-g4.h"

struct pctx {
  struct fe_api_request *r;
  struct fe_api_error *err;
  const struct fe_api_model *model; /* NULL: nothing known of the checkpoint */
  int native;                       /* Gemma 4's tool notation in the history and answers */
  struct fe_api_grammar_check *constraint; /* the constraint's check; NULL: none yet */
  const struct md_sampling *defaults;      /* the checkpoint's; NULL: none */
  const struct fe_api_config *cfg;         /* the server's limits and policy */
};

__attribute__((format(printf, 4, 5))) static int fail(struct pctx *p, int status, const char *param,
                                                      const char *fmt, ...) {
  p->err->status = status;
  snprintf(p->err->param, sizeof(p->err->param), "%s", param ? param : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->err->message, sizeof(p->err->message), fmt, ap);
  va_end(ap);
  return status == 404 ? CM_ERR_NOENT : CM_ERR_INVAL;
}

static int nomem(struct pctx *p) {
  p->err->status = 413;
  p->err->param[0] = 0;
  snprintf(p->err->message, sizeof(p->err->message), "request too large to hold in memory");
  return CM_ERR_NOMEM;
}

/* ---- typed field readers: absent or null keeps the default ---------------- */

static const char *type_name(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a number";
  case JSON_TRUE:
  case JSON_FALSE: return "a boolean";
  default: return "null";
  }
}

/* A number in [lo, hi]; lo_open / hi_open make that end exclusive. */
static int get_number(struct pctx *p, json_t *o, const char *key, double lo, int lo_open, double hi,
                      int hi_open, double *out) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_number(v))
    return fail(p, 400, key, "'%s' must be a number, not %s", key, type_name(v));
  double x = json_number_value(v);
  if ((lo_open ? x <= lo : x < lo) || (hi_open ? x >= hi : x > hi))
    return fail(p, 400, key, "'%s' must be in %s%g, %g%s, got %g", key, lo_open ? "(" : "[", lo, hi,
                hi_open ? ")" : "]", x);
  *out = x;
  return 0;
}

static int get_int(struct pctx *p, json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out,
                   int *present) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_integer(v))
    return fail(p, 400, key, "'%s' must be an integer, not %s", key, type_name(v));
  int64_t x = json_integer_value(v);
  if (x < lo || x > hi)
    return fail(p, 400, key, "'%s' must be in [%" PRId64 ", %" PRId64 "], got %" PRId64, key, lo,
                hi, x);
  *out = x;
  if (present) *present = 1;
  return 0;
}

static int get_bool(struct pctx *p, json_t *o, const char *key, int *out) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_boolean(v))
    return fail(p, 400, key, "'%s' must be a boolean, not %s", key, type_name(v));
  *out = json_is_true(v);
  return 0;
}

static const char *dup_str(struct pctx *p, json_t *s, size_t *len) {
  size_t n = json_string_length(s);
  if (len) *len = n;
  return cm_arena_strndup(&p->r->arena, json_string_value(s), n);
}

/* ---- prompts and messages ------------------------------------------------- */

/* An array of token ids into *ids / *n. */
static int token_ids(struct pctx *p, json_t *arr, const char *param, const int32_t **ids,
                     size_t *n) {
  size_t k = json_array_size(arr);
  int32_t *v = cm_arena_alloc(&p->r->arena, (k ? k : 1) * sizeof(int32_t));
  if (!v) return nomem(p);
  for (size_t i = 0; i < k; i++) {
    json_t *e = json_array_get(arr, i);
    if (!json_is_integer(e))
      return fail(p, 400, param, "'%s' must hold token ids (integers); item %zu is %s", param, i,
                  type_name(e));
    if (json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX)
      return fail(p, 400, param,
                  "'%s' item %zu: token id %" JSON_INTEGER_FORMAT " is outside the vocabulary",
                  param, i, json_integer_value(e));
    v[i] = (int32_t)json_integer_value(e);
  }
  *ids = v;
  *n = k;
  return 0;
}

static int parse_prompt(struct pctx *p, json_t *body) {
  struct fe_api_request *r = p->r;
  json_t *v = json_object_get(body, "prompt");
  if (!v || json_is_null(v)) return fail(p, 400, "prompt", "'prompt' is required");
  size_t np = json_is_array(v) ? json_array_size(v) : 1;
  int nested = json_is_array(v) && np > 0 &&
               (json_is_string(json_array_get(v, 0)) || json_is_array(json_array_get(v, 0)));
  if (json_is_array(v) && !nested) np = 1; /* one prompt as token ids */
  if (!json_is_string(v) && !json_is_array(v))
    return fail(p, 400, "prompt",
                "'prompt' must be a string, an array of strings or token ids, not %s",
                type_name(v));
  if (json_is_array(v) && json_array_size(v) == 0)
    return fail(p, 400, "prompt", "'prompt' must not be empty");
  if (np > FE_API_MAX_PROMPTS)
    return fail(p, 400, "prompt", "at most %d prompts per request, got %zu", FE_API_MAX_PROMPTS,
                np);
  r->prompts = cm_arena_calloc(&r->arena, np, sizeof(*r->prompts));
  if (!r->prompts) return nomem(p);
  r->n_prompts = np;
  for (size_t i = 0; i < np; i++) {
    json_t *e = nested ? json_array_get(v, i) : v;
    struct fe_api_prompt *pr = &r->prompts[i];
    if (json_is_string(e)) {
      if (!(pr->text = dup_str(p, e, &pr->text_len))) return nomem(p);
    } else if (json_is_array(e)) {
      if (json_array_size(e) == 0)
        return fail(p, 400, "prompt", "a token-id prompt must not be empty");
      int rc = token_ids(p, e, "prompt", &pr->ids, &pr->n_ids);
      if (rc) return rc;
    } else {
      return fail(p, 400, "prompt", "prompt %zu must be a string or an array of token ids, not %s",
                  i, type_name(e));
    }
  }
  return 0;
}

/* An image_url part's URL: {"url": "..."} (OpenAI; "detail" is accepted and
 * ignored) or the URL string itself. NULL when it is neither. */
static json_t *image_url_of(json_t *part) {
  json_t *u = json_object_get(part, "image_url");
  if (json_is_string(u)) return u;
  json_t *url = json_is_object(u) ? json_object_get(u, "url") : NULL;
  return json_is_string(url) ? url : NULL;
}

/* An input_audio part's {"data": BASE64, "format": "wav" | "mp3"} (OpenAI),
 * or NULL when it is not that shape. */
static json_t *input_audio_of(json_t *part, const char **format) {
  json_t *a = json_object_get(part, "input_audio");
  json_t *data = json_is_object(a) ? json_object_get(a, "data") : NULL;
  json_t *fmt = json_is_object(a) ? json_object_get(a, "format") : NULL;
  if (!json_is_string(data) || !json_is_string(fmt) ||
      strlen(json_string_value(fmt)) != json_string_length(fmt)) /* no NUL inside */
    return NULL;
  *format = json_string_value(fmt);
  return data;
}

/* Content: a string, or a list of {"type":"text","text":...},
 * {"type":"image_url","image_url":{"url":...}} and
 * {"type":"input_audio","input_audio":{"data":...,"format":...}} parts. */
static int parse_content(struct pctx *p, json_t *c, size_t idx, struct fe_api_message *m) {
  char param[64];
  snprintf(param, sizeof(param), "messages[%zu].content", idx);
  if (json_is_string(c)) {
    m->content = dup_str(p, c, &m->content_len);
    return m->content ? 0 : nomem(p);
  }
  if (json_is_null(c) && m->role == FE_API_ROLE_ASSISTANT) {
    m->content = "";
    return 0;
  }
  if (!json_is_array(c))
    return fail(p, 400, param, "'%s' must be a string or a list of content parts, not %s", param,
                type_name(c));
  size_t total = 0, n = json_array_size(c), n_text = 0, n_img = 0;
  for (size_t k = 0; k < n; k++) {
    json_t *part = json_array_get(c, k), *type = json_object_get(part, "type");
    json_t *text = json_object_get(part, "text");
    char pp[96];
    snprintf(pp, sizeof(pp), "%s[%zu]", param, k);
    if (!json_is_object(part) || !json_is_string(type))
      return fail(p, 400, pp, "part %zu of '%s' must be an object with a 'type'", k, param);
    const char *ts = json_string_value(type), *fmt = NULL;
    int is_audio = !strcmp(ts, "input_audio");
    if (is_audio || !strcmp(ts, "image_url")) {
      if (!is_audio && !image_url_of(part))
        return fail(p, 400, pp, "image part %zu of '%s' needs 'image_url': {\"url\": \"...\"}",
                    k, param);
      if (is_audio && !input_audio_of(part, &fmt))
        return fail(p, 400, pp,
                    "audio part %zu of '%s' needs 'input_audio': {\"data\": BASE64, "
                    "\"format\": \"wav\" or \"mp3\"}",
                    k, param);
      if (m->role != FE_API_ROLE_USER)
        return fail(p, 400, pp, "%s are taken in user messages only",
                    is_audio ? "audio clips" : "images");
      n_img++;
      continue;
    }
    if (strcmp(ts, "text") != 0)
      return fail(p, 400, pp,
                  "content part type '%.40s' is not supported ('text', 'image_url' or "
                  "'input_audio')",
                  ts);
    if (!json_is_string(text))
      return fail(p, 400, pp, "text part %zu of '%s' needs a string 'text'", k, param);
    total += json_string_length(text) + (n_text ? 1 : 0);
    n_text++;
  }
  char *s = cm_arena_alloc(&p->r->arena, total + 1);
  if (!s) return nomem(p);
  struct fe_api_part *parts = NULL;
  if (n_img && !(parts = cm_arena_calloc(&p->r->arena, n, sizeof(*parts)))) return nomem(p);
  size_t o = 0;
  for (size_t k = 0, t = 0; k < n; k++) {
    json_t *part = json_array_get(c, k), *text = json_object_get(part, "text");
    const char *ts = json_string_value(json_object_get(part, "type")), *fmt = NULL;
    int is_audio = !strcmp(ts, "input_audio");
    if (is_audio || !strcmp(ts, "image_url")) {
      struct fe_api_image *im = &p->r->images[p->r->n_images++];
      json_t *url = is_audio ? input_audio_of(part, &fmt) : image_url_of(part);
      if (!(im->url = dup_str(p, url, &im->url_len))) return nomem(p);
      im->audio = is_audio;
      if (is_audio) { /* fe-audio names a format it does not take */
        snprintf(im->format, sizeof(im->format), "%s", fmt);
        p->r->n_audio++;
      }
      /* a message or part takes more than 4 bytes of a body of at most 16 GiB: its
       * index fits 32 bits, and the name fits param */
      snprintf(im->param, sizeof(im->param), "messages[%u].content[%u].%s", (unsigned)idx,
               (unsigned)k, ts);
      parts[k].is_image = !is_audio;
      parts[k].is_audio = is_audio;
      continue;
    }
    if (t++) s[o++] = '\n';
    memcpy(s + o, json_string_value(text), json_string_length(text));
    o += json_string_length(text);
    if (parts && !(parts[k].text = dup_str(p, text, &parts[k].text_len))) return nomem(p);
  }
  s[o] = 0;
  m->content = s;
  m->content_len = o;
  m->parts = parts;
  m->n_parts = parts ? n : 0;
  return 0;
}

/* Image and audio parts across the messages (counted before parsing, so the
 * request's array is allocated once). */
static size_t count_images(json_t *msgs) {
  size_t n = 0;
  for (size_t i = 0; i < json_array_size(msgs); i++) {
    json_t *c = json_object_get(json_array_get(msgs, i), "content");
    for (size_t k = 0; json_is_array(c) && k < json_array_size(c); k++) {
      json_t *type = json_object_get(json_array_get(c, k), "type");
      if (json_is_string(type) && (!strcmp(json_string_value(type), "image_url") ||
                                   !strcmp(json_string_value(type), "input_audio")))
        n++;
    }
  }
  return n;
}

static int parse_messages(struct pctx *p, json_t *body) {
  struct fe_api_request *r = p->r;
  json_t *v = json_object_get(body, "messages");
  if (!v || json_is_null(v)) return fail(p, 400, "messages", "'messages' is required");
  if (!json_is_array(v))
    return fail(p, 400, "messages", "'messages' must be an array, not %s", type_name(v));
  size_t n = json_array_size(v);
  if (n == 0) return fail(p, 400, "messages", "'messages' must not be empty");
  r->messages = cm_arena_calloc(&r->arena, n, sizeof(*r->messages));
  if (!r->messages) return nomem(p);
  r->n_messages = n;
  size_t n_img = count_images(v);
  if (n_img > FE_API_MAX_IMAGES)
    return fail(p, 400, "messages", "%zu images and audio clips in one request; at most %d", n_img,
                FE_API_MAX_IMAGES);
  if (n_img && !(r->images = cm_arena_calloc(&r->arena, n_img, sizeof(*r->images))))
    return nomem(p);
  for (size_t i = 0; i < n; i++) {
    json_t *m = json_array_get(v, i);
    char param[64];
    snprintf(param, sizeof(param), "messages[%zu]", i);
    if (!json_is_object(m))
      return fail(p, 400, param, "'%s' must be an object, not %s", param, type_name(m));
    json_t *role = json_object_get(m, "role");
    snprintf(param, sizeof(param), "messages[%zu].role", i);
    if (!json_is_string(role)) return fail(p, 400, param, "'%s' must be a string", param);
    const char *rs = json_string_value(role);
    if (!strcmp(rs, "system") || !strcmp(rs, "developer"))
      r->messages[i].role = FE_API_ROLE_SYSTEM;
    else if (!strcmp(rs, "user"))
      r->messages[i].role = FE_API_ROLE_USER;
    else if (!strcmp(rs, "assistant"))
      r->messages[i].role = FE_API_ROLE_ASSISTANT;
    else
      return fail(p, 400, param, "unsupported role '%.40s' (system, user or assistant)", rs);
    json_t *c = json_object_get(m, "content");
    json_t *tc = json_object_get(m, "tool_calls"), *tr = json_object_get(m, "tool_responses");
    /* OpenAI: an assistant's content is required unless it makes tool calls */
    if (!c && r->messages[i].role == FE_API_ROLE_ASSISTANT && tc && !json_is_null(tc))
      c = json_null();
    if (!c) {
      snprintf(param, sizeof(param), "messages[%zu].content", i);
      return fail(p, 400, param, "'%s' is required", param);
    }
    int rc = parse_content(p, c, i, &r->messages[i]);
    if (rc) return rc;
    if (p->native && ((tc && !json_is_null(tc)) || tr)) { /* written by rewrite_messages */
      json_t *x = json_object();
      if (tc && !json_is_null(tc)) json_object_set(x, "tool_calls", tc);
      if (tr) json_object_set(x, "tool_responses", tr);
      char *t = json_dumps(x, JSON_COMPACT);
      json_decref(x);
      r->messages[i].extra = t ? cm_arena_strndup(&r->arena, t, strlen(t)) : NULL;
      free(t);
      if (!r->messages[i].extra) return nomem(p);
    }
  }
  return 0;
}

/* ---- sampling and output options ---------------------------------------- */

static int parse_stop(struct pctx *p, json_t *body) {
  struct fe_api_request *r = p->r;
  json_t *v = json_object_get(body, "stop");
  if (v && !json_is_null(v)) {
    size_t n = json_is_string(v) ? 1 : json_is_array(v) ? json_array_size(v) : 0;
    if (!json_is_string(v) && !json_is_array(v))
      return fail(p, 400, "stop", "'stop' must be a string or an array of strings, not %s",
                  type_name(v));
    if (n > FE_API_MAX_STOP)
      return fail(p, 400, "stop", "at most %d stop strings, got %zu", FE_API_MAX_STOP, n);
    r->stop = cm_arena_calloc(&r->arena, n ? n : 1, sizeof(char *));
    if (!r->stop) return nomem(p);
    for (size_t i = 0; i < n; i++) {
      json_t *e = json_is_string(v) ? v : json_array_get(v, i);
      if (!json_is_string(e))
        return fail(p, 400, "stop", "stop item %zu must be a string, not %s", i, type_name(e));
      if (json_string_length(e) == 0) return fail(p, 400, "stop", "stop strings must not be empty");
      if (!(r->stop[i] = dup_str(p, e, NULL))) return nomem(p);
    }
    r->n_stop = n;
  }
  v = json_object_get(body, "stop_token_ids");
  if (v && !json_is_null(v)) {
    if (!json_is_array(v))
      return fail(p, 400, "stop_token_ids", "'stop_token_ids' must be an array of integers");
    if (json_array_size(v) > FE_API_MAX_STOP_TOKEN_IDS)
      return fail(p, 400, "stop_token_ids", "at most %d stop token ids", FE_API_MAX_STOP_TOKEN_IDS);
    const int32_t *ids;
    int rc = token_ids(p, v, "stop_token_ids", &ids, &r->n_stop_token_ids);
    if (rc) return rc;
    r->stop_token_ids = (int32_t *)ids;
  }
  return 0;
}

/* body's `key` unless absent or null (*v NULL): an object (or an array) of at most
 * max `noun`s, *n of them; else a 400 saying it must be `must`. */
static int get_collection(struct pctx *p, json_t *body, const char *key, int object,
                          const char *must, size_t max, const char *noun, json_t **v, size_t *n) {
  *v = json_object_get(body, key);
  *n = 0;
  if (!*v || json_is_null(*v)) {
    *v = NULL;
    return 0;
  }
  if (object ? !json_is_object(*v) : !json_is_array(*v))
    return fail(p, 400, key, "'%s' must be %s", key, must);
  *n = object ? json_object_size(*v) : json_array_size(*v);
  if (*n > max) return fail(p, 400, key, "'%s' holds %zu %s, at most %zu", key, *n, noun, max);
  return 0;
}

/* logit_bias: {"<token id>": bias in [-100, 100]}. The ids are checked
 * against the vocabulary by the serving path, which knows it. */
static int parse_logit_bias(struct pctx *p, json_t *body) {
  struct fe_api_request *r = p->r;
  json_t *v;
  size_t n;
  int rc = get_collection(p, body, "logit_bias", 1, "an object of token ids to biases",
                          FE_API_MAX_LOGIT_BIAS, "tokens", &v, &n);
  if (rc || !v) return rc;
  r->logit_bias_ids = cm_arena_alloc(&r->arena, (n ? n : 1) * sizeof(int32_t));
  r->logit_bias = cm_arena_alloc(&r->arena, (n ? n : 1) * sizeof(float));
  if (!r->logit_bias_ids || !r->logit_bias) return nomem(p);
  const char *key;
  json_t *b;
  json_object_foreach(v, key, b) {
    const char *k = key;
    int64_t id = 0;
    if (*k == '-' && k[1] >= '0' && k[1] <= '9') k++; /* a negative id is outside, said below */
    size_t nd = strlen(k);
    if (!nd || strspn(k, "0123456789") != nd)
      return fail(p, 400, "logit_bias", "'logit_bias' keys must be token ids, not '%.40s'", key);
    for (; nd <= 10 && *k; k++) /* 10 digits cannot overflow */
      id = id * 10 + (*k - '0');
    if (*key == '-' || nd > 10 || id > INT32_MAX)
      return fail(p, 400, "logit_bias", "'logit_bias': token id %.40s is outside the vocabulary",
                  key);
    if (!json_is_number(b) || json_number_value(b) < -100 || json_number_value(b) > 100)
      return fail(p, 400, "logit_bias",
                  "'logit_bias': the bias of token %.40s must be a number in [-100, 100]", key);
    r->logit_bias_ids[r->n_logit_bias] = (int32_t)id;
    r->logit_bias[r->n_logit_bias++] = (float)json_number_value(b);
  }
  return 0;
}

/* bad_words (vLLM's): a list of non-empty strings, tokenized with the prompt. */
static int parse_bad_words(struct pctx *p, json_t *body) {
  struct fe_api_request *r = p->r;
  json_t *v;
  size_t n;
  int rc = get_collection(p, body, "bad_words", 0, "an array of strings", FE_API_MAX_BAD_WORDS,
                          "words", &v, &n);
  if (rc || !n) return rc;
  if (!(r->bad_words = cm_arena_alloc(&r->arena, n * sizeof(*r->bad_words)))) return nomem(p);
  for (size_t i = 0; i < n; i++) {
    json_t *w = json_array_get(v, i);
    if (!json_is_string(w))
      return fail(p, 400, "bad_words", "'bad_words' item %zu must be a string, not %s", i,
                  type_name(w));
    const char *t = json_string_value(w); /* kept without its leading white space */
    size_t len = json_string_length(w), lead = 0;
    while (lead < len && strchr(" \t\n\r\v\f", t[lead]))
      lead++;
    if (lead == len) return fail(p, 400, "bad_words", "'bad_words' item %zu is empty", i);
    if (len > FE_API_MAX_BAD_WORD_BYTES)
      return fail(p, 400, "bad_words", "'bad_words' item %zu is %zu bytes, at most %d", i, len,
                  FE_API_MAX_BAD_WORD_BYTES);
    if (!(r->bad_words[i] = cm_arena_strndup(&r->arena, t + lead, len - lead))) return nomem(p);
  }
  r->n_bad_words = n;
  return 0;
}

/* The sampler's biases (fe_api_request.bias_ids): logit_bias's, or with
 * allowed_token_ids (vLLM's) each allowed id once, with its logit_bias or 0, and
 * only those drawn. */
static int merge_allowed(struct pctx *p) {
  struct fe_api_request *r = p->r;
  size_t n = r->n_allowed_token_ids;
  if (!n) {
    r->bias_ids = r->logit_bias_ids;
    r->bias = r->logit_bias;
    r->n_bias = r->n_logit_bias;
    return 0;
  }
  if (n > FE_API_MAX_LOGIT_BIAS)
    return fail(p, 400, "allowed_token_ids", "'allowed_token_ids' holds %zu tokens, at most %d", n,
                FE_API_MAX_LOGIT_BIAS);
  r->bias_ids = cm_arena_alloc(&r->arena, n * sizeof(int32_t));
  r->bias = cm_arena_alloc(&r->arena, n * sizeof(float));
  if (!r->bias_ids || !r->bias) return nomem(p);
  for (size_t i = 0; i < n; i++) {
    int32_t id = r->allowed_token_ids[i];
    size_t k = 0;
    while (k < r->n_bias && r->bias_ids[k] != id)
      k++;
    if (k < r->n_bias) continue; /* listed twice */
    float b = 0;
    for (size_t j = 0; j < r->n_logit_bias; j++)
      if (r->logit_bias_ids[j] == id) b = r->logit_bias[j];
    r->bias_ids[r->n_bias] = id;
    r->bias[r->n_bias++] = b;
  }
  r->allowed_only = 1;
  return 0;
}

/* Fields we recognise but do not implement: reject rather than ignore (OpenAI's,
 * and vLLM's extensions of the same requests). A field at its "off" value
 * (null, false, "", [] or {}) asks for nothing and passes. */
/* truncate_prompt_tokens (vLLM's): -1, or a count of 1 and more within
 * max_model_len (where known). */
static int parse_truncation(struct pctx *p, json_t *body, const struct fe_api_config *cfg) {
  int64_t k = 0;
  int present = 0, rc = get_int(p, body, "truncate_prompt_tokens", -1, INT32_MAX, &k, &present);
  if (rc || !present) return rc;
  if (k == 0)
    return fail(
        p, 400, "truncate_prompt_tokens",
        "'truncate_prompt_tokens' must be -1 (the last max_model_len tokens) or at least 1");
  if (cfg->max_model_len > 0 && k > cfg->max_model_len)
    return fail(p, 400, "truncate_prompt_tokens",
                "'truncate_prompt_tokens' (%" PRId64 ") is greater than max_model_len (%" PRId64
                "): choose a smaller truncation",
                k, (int64_t)cfg->max_model_len);
  p->r->truncate_prompt_tokens = (int32_t)k;
  return 0;
}

/* cache_salt (vLLM's): a non-empty string, hashed to the prefix cache's salt
 * (never 0, which is none). */
static int parse_cache_salt(struct pctx *p, json_t *body) {
  json_t *v = json_object_get(body, "cache_salt");
  if (!v || json_is_null(v)) return 0;
  if (!json_is_string(v) || json_string_length(v) == 0)
    return fail(p, 400, "cache_salt", "'cache_salt' must be a non-empty string");
  const unsigned char *s = (const unsigned char *)json_string_value(v);
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a, then mixed */
  for (size_t i = 0; i < json_string_length(v); i++)
    h = (h ^ s[i]) * 0x100000001b3ull;
  h = cm_mix64(h);
  p->r->cache_salt = h ? h : 1;
  return 0;
}

/* add_generation_prompt, and continue_final_message (vLLM's): the last
 * message left open for the model to continue, never with a generation
 * prompt after it. */
static int parse_generation_prompt(struct pctx *p, json_t *body) {
  struct fe_api_request *r = p->r;
  int rc = get_bool(p, body, "add_generation_prompt", &r->add_generation_prompt);
  if (!rc) rc = get_bool(p, body, "continue_final_message", &r->continue_final_message);
  if (!rc && r->continue_final_message && r->add_generation_prompt)
    return fail(p, 400, "continue_final_message",
                "'continue_final_message' and 'add_generation_prompt' cannot both be true (set "
                "'add_generation_prompt' to false to continue the last message)");
  return rc;
}

static int reject_unsupported(struct pctx *p, json_t *body) {
  static const char *const keys[] = {"suffix", "functions", "function_call", "chat_template"};
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
    if (p->r->kind == FE_API_CHAT && strcmp(keys[i], "suffix")) continue; /* chat's own */
    json_t *v = json_object_get(body, keys[i]);
    if (v && !json_is_null(v) && !json_is_false(v) &&
        !(json_is_array(v) && json_array_size(v) == 0) &&
        !(json_is_object(v) && json_object_size(v) == 0) &&
        !(json_is_string(v) && json_string_length(v) == 0))
      return fail(p, 400, keys[i], "'%s' is not supported", keys[i]);
  }
  return 0;
}

/* ---- structured outputs ------------------------------------------------------ */

/* Queues text (which the arena, or the program, holds) to be compiled before the
 * request is: fe_api_check_grammars. *out (may be NULL): the check. */
static int defer_compile(struct pctx *p, int kind, const char *text, size_t len, const char *param,
                         struct fe_api_grammar_check **out) {
  struct fe_api_grammar_check *c = cm_arena_alloc(&p->r->arena, sizeof(*c)), **at = &p->r->checks;
  if (!c) return nomem(p);
  *c = (struct fe_api_grammar_check){NULL, kind, text, len, ""};
  snprintf(c->param, sizeof(c->param), "%s", param);
  while (*at)
    at = &(*at)->next;
  *at = c;
  if (out) *out = c;
  return 0;
}

int fe_api_check_grammars(const struct fe_api_request *r, struct fe_api_error *err) {
  memset(err, 0, sizeof(*err));
  for (const struct fe_api_grammar_check *c = r->checks; c; c = c->next) {
    struct gr_grammar *g = NULL;
    char why[256];
    int rc = gr_compile((enum gr_kind)c->kind, c->text, c->len, &g, why, sizeof(why));
    gr_grammar_free(g);
    if (!rc) continue;
    snprintf(err->param, sizeof(err->param), "%s", rc == CM_ERR_NOMEM ? "" : c->param);
    if (rc == CM_ERR_NOMEM) {
      err->status = 413;
      snprintf(err->message, sizeof(err->message), "request too large to hold in memory");
    } else {
      err->status = 400;
      snprintf(err->message, sizeof(err->message), "'%.63s': %.250s", c->param, why);
    }
    return rc;
  }
  return 0;
}

/* Takes one constraint (kind, its text as JSON or a string) for the request, from
 * field `param`; a second one is a 400. */
static int set_constraint(struct pctx *p, const char *param, int kind, json_t *v) {
  struct fe_api_request *r = p->r;
  if (r->grammar_kind)
    return fail(p, 400, param,
                "'%s': only one of response_format, structured_outputs and the "
                "guided_* fields may constrain a request (%s already does)",
                param, r->grammar_param);
  const char *s = NULL;
  char *dumped = NULL;
  if (kind == GR_REGEX || kind == GR_GRAMMAR) {
    if (!json_is_string(v))
      return fail(p, 400, param, "'%s' must be a string (%s)", param,
                  kind == GR_REGEX ? "a regex" : "a grammar in GBNF notation");
    s = json_string_value(v);
  } else if (kind == GR_CHOICE) {
    if (!json_is_array(v) || json_array_size(v) == 0)
      return fail(p, 400, param, "'%s' must be a non-empty array of strings", param);
    size_t i;
    json_t *c;
    json_array_foreach(v, i, c) {
      if (!json_is_string(c)) return fail(p, 400, param, "'%s[%zu]' must be a string", param, i);
    }
  } else if (kind == GR_JSON_SCHEMA) {
    if (json_is_string(v)) { /* vLLM takes a schema as JSON text too */
      json_error_t je;
      json_t *o = json_loads(json_string_value(v), JSON_REJECT_DUPLICATES, &je);
      if (!o) return fail(p, 400, param, "'%s' is not valid JSON: %.120s", param, je.text);
      dumped = json_dumps(o, JSON_COMPACT);
      json_decref(o);
    } else if (!json_is_object(v) && !json_is_boolean(v)) {
      return fail(p, 400, param, "'%s' must be a JSON Schema (an object)", param);
    }
  }
  if (!s && kind != GR_JSON_OBJECT && !dumped) dumped = json_dumps(v, JSON_COMPACT);
  if (!s && dumped) s = dumped;
  if (kind != GR_JSON_OBJECT && !s) return nomem(p);
  size_t len = s ? strlen(s) : 0;
  int rc = 0;
  if (len > FE_API_MAX_GRAMMAR)
    rc = fail(p, 400, param, "'%s' takes %zu bytes, at most %d are allowed", param, len,
              FE_API_MAX_GRAMMAR);
  if (!rc && len) {
    char *t = cm_arena_alloc(&r->arena, len + 1);
    if (!t)
      rc = nomem(p);
    else
      memcpy(t, s, len + 1);
    r->grammar = t;
  }
  /* compiled before anything is queued, so that a bad one is a 400; the workers
   * compile the same text again */
  if (!rc) rc = defer_compile(p, kind, len ? r->grammar : "", len, param, &p->constraint);
  free(dumped);
  if (rc) return rc;
  r->grammar_kind = kind;
  r->grammar_len = len;
  snprintf(r->grammar_param, sizeof(r->grammar_param), "%s", param);
  return 0;
}

/* response_format (OpenAI), structured_outputs (vLLM: json, regex, choice, grammar,
 * json_object) and vLLM's older guided_json / guided_regex / guided_choice. */
static int parse_structured(struct pctx *p, json_t *body) {
  int rc;
  json_t *rf = json_object_get(body, "response_format");
  if (rf && !json_is_null(rf)) {
    json_t *t = json_object_get(rf, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : NULL;
    if (!json_is_object(rf) || !type)
      return fail(p, 400, "response_format",
                  "'response_format' must be an object with a 'type': text, json_object or "
                  "json_schema");
    if (!strcmp(type, "json_object")) {
      if ((rc = set_constraint(p, "response_format", GR_JSON_OBJECT, NULL))) return rc;
    } else if (!strcmp(type, "json_schema")) {
      json_t *js = json_object_get(rf, "json_schema");
      json_t *schema = json_is_object(js) ? json_object_get(js, "schema") : NULL;
      if (!schema)
        return fail(p, 400, "response_format.json_schema",
                    "'response_format.json_schema' must be an object with a 'schema'");
      if ((rc = set_constraint(p, "response_format.json_schema.schema", GR_JSON_SCHEMA, schema)))
        return rc;
    } else if (strcmp(type, "text") != 0) {
      return fail(p, 400, "response_format.type",
                  "'response_format.type' must be text, json_object or json_schema, not '%.40s'",
                  type);
    }
  }
  /* the kinds by their names in structured_outputs; guided_<name> is vLLM's older field */
  static const struct {
    const char *name;
    int kind;
  } kinds[] = {{"json", GR_JSON_SCHEMA},
               {"regex", GR_REGEX},
               {"choice", GR_CHOICE},
               {"grammar", GR_GRAMMAR}};
  char param[48];
  json_t *so = json_object_get(body, "structured_outputs");
  if (so && !json_is_null(so)) {
    if (!json_is_object(so))
      return fail(p, 400, "structured_outputs", "'structured_outputs' must be an object");
    const char *key;
    json_t *v;
    json_object_foreach(so, key, v) {
      if (json_is_null(v)) continue;
      size_t i = 0;
      while (i < sizeof(kinds) / sizeof(kinds[0]) && strcmp(key, kinds[i].name))
        i++;
      if (i < sizeof(kinds) / sizeof(kinds[0])) {
        snprintf(param, sizeof(param), "structured_outputs.%s", kinds[i].name);
        if ((rc = set_constraint(p, param, kinds[i].kind, v))) return rc;
      } else if (!strcmp(key, "json_object")) {
        if (!json_is_boolean(v))
          return fail(p, 400, "structured_outputs.json_object",
                      "'structured_outputs.json_object' must be a boolean");
        if (json_is_true(v) &&
            (rc = set_constraint(p, "structured_outputs.json_object", GR_JSON_OBJECT, NULL)))
          return rc;
      } else if (!strcmp(key, "disable_any_whitespace") || !strcmp(key, "disable_fallback") ||
                 !strcmp(key, "disable_additional_properties") ||
                 !strcmp(key, "whitespace_pattern")) {
        /* vLLM's backend options: whitespace here is always bounded, nothing falls back */
      } else {
        return fail(p, 400, "structured_outputs",
                    "'structured_outputs.%.40s' is not supported "
                    "(json, regex, choice, grammar, json_object are)",
                    key);
      }
    }
  }
  for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
    snprintf(param, sizeof(param), "guided_%s", kinds[i].name);
    json_t *v = json_object_get(body, param);
    if (v && !json_is_null(v) && (rc = set_constraint(p, param, kinds[i].kind, v))) return rc;
  }
  return 0;
}

static int parse_sampling(struct pctx *p, json_t *body) {
  struct fe_api_request *r = p->r;
  int rc, present = 0;
  int64_t x;
  if ((rc = get_int(p, body, "max_tokens", 1, INT32_MAX, &r->max_tokens, NULL))) return rc;
  if (r->kind == FE_API_CHAT &&
      (rc = get_int(p, body, "max_completion_tokens", 1, INT32_MAX, &r->max_tokens, NULL)))
    return rc;
  /* the checkpoint's max_new_tokens caps every request (vLLM's --generation-config) */
  const struct md_sampling *d = p->defaults;
  if (d && (d->has & MD_SAMPLE_MAX_TOKENS) && (r->max_tokens < 0 || r->max_tokens > d->max_tokens))
    r->max_tokens = d->max_tokens;
  if ((rc = get_int(p, body, "min_tokens", 0, INT32_MAX, &r->min_tokens, NULL))) return rc;
  if (r->max_tokens >= 0 && r->min_tokens > r->max_tokens)
    return fail(p, 400, "min_tokens",
                "'min_tokens' (%" PRId64 ") must not exceed max_tokens (%" PRId64 ")",
                r->min_tokens, r->max_tokens);
  if ((rc = get_number(p, body, "temperature", 0, 0, 2, 0, &r->temperature))) return rc;
  if ((rc = get_number(p, body, "top_p", 0, 1, 1, 0, &r->top_p))) return rc;
  x = r->top_k;
  if ((rc = get_int(p, body, "top_k", -1, INT32_MAX, &x, NULL))) return rc;
  r->top_k = x == 0 ? -1 : (int32_t)x; /* 0 means off, as in vLLM */
  if ((rc = get_number(p, body, "min_p", 0, 0, 1, 0, &r->min_p))) return rc;
  if ((rc = get_number(p, body, "presence_penalty", -2, 0, 2, 0, &r->presence_penalty))) return rc;
  if ((rc = get_number(p, body, "frequency_penalty", -2, 0, 2, 0, &r->frequency_penalty)))
    return rc;
  if ((rc = get_number(p, body, "repetition_penalty", 0, 1, 2, 0, &r->repetition_penalty)))
    return rc;
  if ((rc = get_int(p, body, "seed", INT64_MIN, INT64_MAX, &r->seed, &r->has_seed))) return rc;
  x = 1;
  if ((rc = get_int(p, body, "n", 1, FE_API_MAX_N, &x, NULL))) return rc;
  r->n = (int)x;
  int64_t best_of = r->n;
  if ((rc = get_int(p, body, "best_of", 1, FE_API_MAX_N, &best_of, &present))) return rc;
  if (best_of < r->n)
    return fail(p, 400, "best_of", "'best_of' (%lld) must be at least n (%d)", (long long)best_of,
                r->n);
  if (best_of > r->n) { /* run best_of, keep n: parse_best_of checks what it meets */
    r->n_keep = r->n;
    r->n = (int)best_of;
  }
  if (r->n_prompts * (size_t)r->n > FE_API_MAX_PROMPTS) /* choices: n of each prompt, in order */
    return fail(p, 400, r->n_keep ? "best_of" : "n",
                "%s (%d) times the %zu prompts is more than %d choices",
                r->n_keep ? "best_of" : "n", r->n, r->n_prompts, FE_API_MAX_PROMPTS);
  if ((rc = parse_stop(p, body))) return rc;
  if ((rc = get_bool(p, body, "ignore_eos", &r->ignore_eos))) return rc;
  if ((rc = get_bool(p, body, "skip_special_tokens", &r->skip_special_tokens))) return rc;
  if ((rc = get_bool(p, body, "include_stop_str_in_output", &r->include_stop_str_in_output)))
    return rc;
  x = 0;
  if ((rc = get_int(p, body, "priority", INT32_MIN, INT32_MAX, &x, NULL))) return rc;
  if (x && p->cfg->fcfs)
    return fail(p, 400, "priority",
                "'priority' is %lld, and this server schedules first come, first served "
                "(--scheduling-policy fcfs)",
                (long long)x);
  r->priority = (int32_t)x;
  if ((rc = parse_logit_bias(p, body))) return rc;
  json_t *at = json_object_get(body, "allowed_token_ids");
  if (at && !json_is_null(at)) {
    if (!json_is_array(at))
      return fail(p, 400, "allowed_token_ids", "'allowed_token_ids' must be an array of token ids");
    const int32_t *ids;
    if ((rc = token_ids(p, at, "allowed_token_ids", &ids, &r->n_allowed_token_ids))) return rc;
    r->allowed_token_ids = (int32_t *)ids;
  }
  if ((rc = merge_allowed(p))) return rc;
  if ((rc = parse_bad_words(p, body))) return rc;
  json_t *user = json_object_get(body, "user");
  if (user && !json_is_null(user) && !json_is_string(user))
    return fail(p, 400, "user", "'user' must be a string");
  if ((rc = reject_unsupported(p, body))) return rc;
  return parse_structured(p, body);
}

static int parse_output(struct pctx *p, json_t *body) {
  struct fe_api_request *r = p->r;
  int rc;
  const int64_t max_lp = p->cfg->max_logprobs > 0 ? p->cfg->max_logprobs : FE_API_MAX_LOGPROBS;
  if (r->kind == FE_API_COMPLETION) {
    int64_t lp = -1;
    if ((rc = get_int(p, body, "logprobs", 0, max_lp, &lp, NULL))) return rc;
    r->logprobs = (int)lp;
    if ((rc = get_bool(p, body, "echo", &r->echo))) return rc;
  } else {
    int want = 0, top_present = 0;
    int64_t top = 0;
    if ((rc = get_bool(p, body, "logprobs", &want))) return rc;
    if ((rc = get_int(p, body, "top_logprobs", 0, max_lp, &top, &top_present))) return rc;
    if (top_present && top > 0 && !want)
      return fail(p, 400, "top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
    r->logprobs = want ? (int)top : -1;
    if ((rc = get_bool(p, body, "echo", &r->echo))) return rc;
    if (r->echo && r->tool_answer)
      return fail(p, 400, "echo", "'echo' cannot be combined with tools");
  }
  if ((rc = get_bool(p, body, "return_tokens_as_token_ids", &r->tokens_as_ids))) return rc;
  if ((rc = get_bool(p, body, "return_token_ids", &r->return_token_ids))) return rc;
  if ((rc = get_bool(p, body, "stream", &r->stream))) return rc;
  int64_t plp = -1;
  int plp_given = 0;
  if ((rc = get_int(p, body, "prompt_logprobs", 0, max_lp, &plp, &plp_given))) return rc;
  if (plp_given && r->stream)
    return fail(p, 400, "prompt_logprobs",
                "'prompt_logprobs' is not available when 'stream' is true");
  r->prompt_logprobs = plp_given ? (int)plp : -1;
  /* the echoed prompt's tokens lead the logprobs (the first without one; streamed, in
   * the first chunk, as its text) */
  if (r->kind == FE_API_COMPLETION && r->echo && r->logprobs >= 0)
    r->prompt_logprobs = r->prompt_logprobs > r->logprobs ? r->prompt_logprobs : r->logprobs;
  json_t *so = json_object_get(body, "stream_options");
  if (so && !json_is_null(so)) {
    if (!r->stream)
      return fail(p, 400, "stream_options",
                  "'stream_options' is only allowed when 'stream' is true");
    if (!json_is_object(so))
      return fail(p, 400, "stream_options", "'stream_options' must be an object");
    if ((rc = get_bool(p, so, "include_usage", &r->include_usage))) {
      snprintf(p->err->param, sizeof(p->err->param), "stream_options.include_usage");
      return rc;
    }
    if ((rc = get_bool(p, so, "continuous_usage_stats", &r->continuous_usage))) {
      snprintf(p->err->param, sizeof(p->err->param), "stream_options.continuous_usage_stats");
      return rc;
    }
  }
  return 0;
}

/* use_beam_search (vLLM's) and its length_penalty. The beams rank candidates by the
 * raw model's logprobs and the answer comes whole, so what changes the draw (penalties,
 * biases, bans, allowed tokens, min_tokens, structured outputs, tools), a stream and
 * the prompt's logprobs are refused with it. */
static int parse_beam(struct pctx *p, json_t *body) {
  struct fe_api_request *r = p->r;
  int rc = get_bool(p, body, "use_beam_search", &r->beam);
  if (!rc) rc = get_number(p, body, "length_penalty", -10, 0, 10, 0, &r->length_penalty);
  if (rc || !r->beam) return rc;
  if (r->n_keep) /* the beams are ranked by their own score */
    return fail(p, 400, "best_of", "'best_of' above n cannot be combined with 'use_beam_search'");
  if (r->n > FE_API_MAX_BEAMS)
    return fail(p, 400, "n", "'n' (the beams) must be at most %d with 'use_beam_search'",
                FE_API_MAX_BEAMS);
  const char *no = r->stream                                                   ? "stream"
                   : r->prompt_logprobs >= 0 && !(r->echo && r->logprobs >= 0) ? "prompt_logprobs"
                   : r->echo && r->logprobs >= 0                               ? "echo"
                   : r->presence_penalty != 0                                  ? "presence_penalty"
                   : r->frequency_penalty != 0                                 ? "frequency_penalty"
                   : r->repetition_penalty != 1      ? "repetition_penalty"
                   : r->allowed_only                 ? "allowed_token_ids"
                   : r->n_bias > 0                   ? "logit_bias"
                   : r->n_bad_words > 0              ? "bad_words"
                   : r->min_tokens > 0               ? "min_tokens"
                   : r->grammar_kind != 0            ? "structured_outputs"
                   : r->tool_answer || r->tools_json ? "tools"
                                                     : NULL;
  if (no) return fail(p, 400, no, "'%s' cannot be combined with 'use_beam_search'", no);
  return 0;
}

/* best_of above n: the choices are ranked when all are done, so the answer cannot be
 * streamed (OpenAI's rule); parse_beam refuses it with a beam search. */
static int parse_best_of(struct pctx *p) {
  if (p->r->n_keep && p->r->stream)
    return fail(p, 400, "best_of", "'best_of' above n cannot be combined with 'stream'");
  return 0;
}

/* ---- entry points ----------------------------------------------------------- */

static int parse_model(struct pctx *p, json_t *body, const struct fe_api_config *cfg) {
  json_t *v = json_object_get(body, "model");
  if (!v || json_is_null(v)) {
    p->r->model = cfg->model_name;
    return 0;
  }
  if (!json_is_string(v))
    return fail(p, 400, "model", "'model' must be a string, not %s", type_name(v));
  const char *want = json_string_value(v);
  p->r->model = !strcmp(want, cfg->model_name) ? cfg->model_name : NULL;
  for (int i = 0; !p->r->model && i < cfg->n_aliases; i++)
    if (!strcmp(want, cfg->aliases[i])) p->r->model = cfg->aliases[i];
  for (int i = 0; !p->r->model && i < cfg->n_loras; i++)
    if (!strcmp(want, cfg->loras[i])) {
      p->r->model = cfg->loras[i];
      p->r->lora = i + 1;
      p->r->lora_sum = cfg->lora_sum;
    }
  for (int i = 0; !p->r->model && i < cfg->n_run_loras; i++)
    if (!strcmp(want, cfg->run_loras[i].name)) { /* copied: it may be unloaded meanwhile */
      const char *path = cfg->run_loras[i].path;
      p->r->lora_path = cm_arena_strndup(&p->r->arena, path, strlen(path));
      if (!p->r->lora_path || !(p->r->model = dup_str(p, v, NULL))) return nomem(p);
      p->r->lora_uid = cfg->run_loras[i].uid;
    }
  if (!p->r->model) return fail(p, 404, "model", "The model `%.200s` does not exist.", want);
  return 0;
}

/* vLLM's defaults, under the checkpoint's (d: NULL for none) where it has them. */
static void set_defaults(struct fe_api_request *r, enum fe_api_kind kind,
                         const struct md_sampling *d) {
  r->kind = kind;
  r->max_tokens = -1;
  unsigned has = d ? d->has : 0;
  r->temperature = has & MD_SAMPLE_TEMPERATURE ? d->temperature : 1.0;
  r->top_p = has & MD_SAMPLE_TOP_P ? d->top_p : 1.0;
  r->top_k = has & MD_SAMPLE_TOP_K ? d->top_k : -1;
  r->min_p = has & MD_SAMPLE_MIN_P ? d->min_p : 0.0;
  r->repetition_penalty = has & MD_SAMPLE_REPETITION_PENALTY ? d->repetition_penalty : 1.0;
  r->n = 1;
  r->length_penalty = 1.0;
  r->logprobs = -1;
  r->prompt_logprobs = -1;
  r->add_generation_prompt = 1;
  r->add_special_tokens = kind != FE_API_CHAT;
  r->skip_special_tokens = 1;
}

/* ---- tools: a JSON protocol any chat template can carry ----------------------------
 *
 * As llama.cpp's generic tool-call handler does: the system message lists the
 * tools (name, description, parameter schema) and asks for one JSON object,
 * {"tool_calls": [{"name": ..., "arguments": {...}}]} to call tools or
 * {"response": "..."} to answer; a constraint (a JSON Schema over the tools'
 * own parameter schemas) makes the answer one of those, calls only under
 * tool_choice "required" or a named tool. The history's assistant tool calls
 * become that object as the assistant's text, and tool results user turns of
 * {"tool_response": {"tool_call_id", "content"}}, so templates that know
 * only user and assistant turns (Gemma 3's) render them. */

#define FE_MAX_TOOLS 128

static int tool_name_ok(const char *s) {
  size_t n = strlen(s);
  if (n < 1 || n > 64) return 0;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
          (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-' || s[i] == '.'))
      return 0;
  return 1;
}

/* The tools' {name, description, parameters} into *out (a new array), each
 * parameter schema compiled alone first so that a bad one is named. */
static int read_tools(struct pctx *p, json_t *tools, json_t **out) {
  char param[96];
  if (!json_is_array(tools))
    return fail(p, 400, "tools", "'tools' must be an array of {\"type\": \"function\", ...}");
  if (json_array_size(tools) > FE_MAX_TOOLS)
    return fail(p, 400, "tools", "%zu tools; at most %d", json_array_size(tools), FE_MAX_TOOLS);
  json_t *list = json_array();
  if (!list) return nomem(p);
  size_t i;
  json_t *t;
  json_array_foreach(tools, i, t) {
    json_t *type = json_object_get(t, "type"), *fn = json_object_get(t, "function");
    snprintf(param, sizeof(param), "tools[%zu]", i);
    if (!json_is_object(t) || !json_is_string(type) ||
        strcmp(json_string_value(type), "function") || !json_is_object(fn)) {
      json_decref(list);
      return fail(p, 400, param, "'%s' must be {\"type\": \"function\", \"function\": {...}}",
                  param);
    }
    json_t *name = json_object_get(fn, "name"), *desc = json_object_get(fn, "description");
    json_t *params = json_object_get(fn, "parameters");
    snprintf(param, sizeof(param), "tools[%zu].function.name", i);
    if (!json_is_string(name) || !tool_name_ok(json_string_value(name))) {
      json_decref(list);
      return fail(p, 400, param, "'%s' must be 1 to 64 letters, digits, '_', '-' or '.'", param);
    }
    for (size_t k = 0; k < json_array_size(list); k++)
      if (!strcmp(json_string_value(json_object_get(json_array_get(list, k), "name")),
                  json_string_value(name))) {
        json_decref(list);
        return fail(p, 400, param, "tool '%.64s' is given twice", json_string_value(name));
      }
    snprintf(param, sizeof(param), "tools[%zu].function.description", i);
    if (desc && !json_is_null(desc) && !json_is_string(desc)) {
      json_decref(list);
      return fail(p, 400, param, "'%s' must be a string", param);
    }
    snprintf(param, sizeof(param), "tools[%zu].function.parameters", i);
    json_t *schema = params && !json_is_null(params)
                         ? json_incref(params)
                         : json_pack("{s:s, s:{}}", "type", "object", "properties");
    char why[256] = "";
    int crc = CM_ERR_NOMEM;
    if (schema && json_is_object(schema)) {
      json_t *ty = json_object_get(schema, "type");
      if (!json_is_string(ty) || strcmp(json_string_value(ty), "object")) {
        crc = CM_ERR_INVAL;
        snprintf(why, sizeof(why), "the parameters must be a schema of \"type\": \"object\"");
      } else {
        char *text = json_dumps(schema, JSON_COMPACT);
        const char *kept = text ? cm_arena_strndup(&p->r->arena, text, strlen(text)) : NULL;
        crc = kept ? 0 : CM_ERR_NOMEM;
        if (kept && defer_compile(p, GR_JSON_SCHEMA, kept, strlen(kept), param, NULL))
          crc = CM_ERR_NOMEM;
        free(text);
      }
    } else if (schema) {
      crc = CM_ERR_INVAL;
      snprintf(why, sizeof(why), "must be a JSON Schema object");
    }
    json_t *entry = crc ? NULL
                        : json_pack("{s:O, s:s, s:O}", "name", name, "description",
                                    desc && json_is_string(desc) ? json_string_value(desc) : "",
                                    "parameters", schema);
    json_decref(schema);
    if (crc || !entry || json_array_append_new(list, entry)) {
      json_decref(list);
      if (crc == CM_ERR_NOMEM || !crc) return nomem(p);
      return fail(p, 400, param, "'%s': %s", param, why);
    }
  }
  *out = list;
  return 0;
}

/* The answer's schema: calls of the allowed tools, or (auto) a response. */
static json_t *tools_schema(json_t *list, const char *only, int parallel, int allow_response) {
  json_t *calls = json_array();
  size_t i;
  json_t *t;
  json_array_foreach(list, i, t) {
    const char *name = json_string_value(json_object_get(t, "name"));
    if (only && strcmp(only, name)) continue;
    json_array_append_new(
        calls, json_pack("{s:s, s:{s:{s:s}, s:O}, s:[s,s], s:b}", "type", "object", "properties",
                         "name", "const", name, "arguments", json_object_get(t, "parameters"),
                         "required", "name", "arguments", "additionalProperties", 0));
  }
  json_t *items = json_pack("{s:o}", "anyOf", calls);
  json_t *arr = json_pack("{s:s, s:o, s:i}", "type", "array", "items", items, "minItems", 1);
  if (arr && !parallel) json_object_set_new(arr, "maxItems", json_integer(1));
  json_t *call_obj =
      json_pack("{s:s, s:{s:o}, s:[s], s:b}", "type", "object", "properties", "tool_calls", arr,
                "required", "tool_calls", "additionalProperties", 0);
  if (!allow_response) return call_obj;
  json_t *resp =
      json_pack("{s:s, s:{s:{s:s}}, s:[s], s:b}", "type", "object", "properties", "response",
                "type", "string", "required", "response", "additionalProperties", 0);
  return json_pack("{s:[o,o]}", "anyOf", call_obj, resp);
}

/* The instruction the system message gets. */
static char *tools_instruction(json_t *list, const char *only, int choice_required) {
  char *sigs = json_dumps(list, JSON_COMPACT);
  if (!sigs) return NULL;
  const char *how = only ? "You must call the tool named in this instruction: "
                    : choice_required
                        ? "You must call at least one tool: answer with {\"tool_calls\": "
                          "[...]}."
                        : "To call tools answer with {\"tool_calls\": [{\"name\": \"<tool "
                          "name>\", \"arguments\": {...}}]}; to answer without a tool, with "
                          "{\"response\": \"<your answer>\"}.";
  size_t n = strlen(sigs) + strlen(how) + (only ? strlen(only) : 0) + 512;
  char *s = malloc(n);
  if (s)
    snprintf(s, n,
             "You can call these tools (JSON Schema signatures):\n%s\n"
             "Answer with one JSON object. %s%s\n"
             "Tool results come back as {\"tool_response\": {\"tool_call_id\": ..., "
             "\"content\": ...}}.",
             sigs, how, only ? only : "");
  free(sigs);
  return s;
}

/* Tool message i's tool_call_id and content, both strings, else a 400 naming
 * the field (for the JSON protocol's history and Gemma 4's). */
static int tool_message(struct pctx *p, json_t *m, size_t i, json_t **id, json_t **c) {
  char param[96];
  *id = json_object_get(m, "tool_call_id");
  *c = json_object_get(m, "content");
  snprintf(param, sizeof(param), "messages[%zu].tool_call_id", i);
  if (!json_is_string(*id)) return fail(p, 400, param, "'%s' must be a string", param);
  snprintf(param, sizeof(param), "messages[%zu].content", i);
  if (!json_is_string(*c))
    return fail(p, 400, param, "'%s' of a tool message must be a string", param);
  return 0;
}

/* Assistant message i's tool_calls (tc) as *calls (a new array), each call's
 * name and its arguments parsed into an object: {name, arguments} for the
 * protocol's text, or (native, where arguments may come as an object already)
 * the request's {id, type, function} for Gemma 4's template (p->native); else a 400 naming
 * the call. */
static int read_calls(struct pctx *p, json_t *tc, size_t i, json_t **calls) {
  char param[96];
  snprintf(param, sizeof(param), "messages[%zu].tool_calls", i);
  *calls = json_array();
  int bad = !json_is_array(tc);
  size_t k;
  json_t *c;
  json_array_foreach(tc, k, c) {
    json_t *fn = json_object_get(c, "function");
    json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
    json_t *parsed = json_is_string(args) ? json_loads(json_string_value(args), 0, NULL)
                     : p->native && json_is_object(args) ? json_incref(args)
                                                         : NULL;
    if (!json_is_string(name) || !json_is_object(parsed)) {
      snprintf(param, sizeof(param), "messages[%zu].tool_calls[%zu].function", i, k);
      json_decref(parsed);
      bad = 1;
      break;
    }
    if (p->native)
      json_array_append_new(*calls, json_pack("{s:O?, s:s, s:{s:O, s:o}}", "id",
                                              json_object_get(c, "id"), "type", "function",
                                              "function", "name", name, "arguments", parsed));
    else
      json_array_append_new(*calls, json_pack("{s:O, s:o}", "name", name, "arguments", parsed));
  }
  if (bad) {
    json_decref(*calls);
    return fail(p, 400, param,
                "'%s' must hold a 'name' and 'arguments' as a JSON object in a string", param);
  }
  return 0;
}

/* The gathered tool results (pending, released) appended to out as one user turn. */
static void append_results(json_t *out, json_t *pending) {
  json_t *one = json_array_size(pending) == 1 ? json_array_get(pending, 0) : pending;
  char *txt = json_dumps(one, JSON_COMPACT);
  json_array_append_new(out, json_pack("{s:s, s:s}", "role", "user", "content", txt ? txt : ""));
  free(txt);
  json_decref(pending);
}

/* ---- tools in Gemma 4's own notation -------------------------------------------
 *
 * A checkpoint whose tokenizer has Gemma 4's tool tokens and whose template
 * renders `tools` gets them as they are: the template declares the tools and
 * writes the history's calls (arguments as objects: it formats them itself) and
 * results; the answer is read by fe-g4.c. Tool messages go into the assistant
 * turn that made the calls, as the template's "tool_responses" ({name, response}:
 * Gemma 4's template has no tool role), the call's name found by its id. */

/* Tool message i's result (id, content c) into last, the assistant turn with
 * the calls as written to the new history (NULL when there is none). */
static int native_result(struct pctx *p, json_t *last, size_t i, json_t *id, json_t *c) {
  const char *name = NULL;
  size_t k;
  json_t *call;
  json_array_foreach(last ? json_object_get(last, "tool_calls") : NULL, k, call) {
    json_t *cid = json_object_get(call, "id");
    if (json_is_string(cid) && !strcmp(json_string_value(cid), json_string_value(id)))
      name = json_string_value(json_object_get(json_object_get(call, "function"), "name"));
  }
  if (!name) {
    char param[96];
    snprintf(param, sizeof(param), "messages[%zu].tool_call_id", i);
    return fail(p, 400, param,
                "'%s': no call with id '%.64s' in an assistant turn before this tool message",
                param, json_string_value(id));
  }
  json_t *resp = json_loads(json_string_value(c), 0, NULL); /* an object stays one */
  if (!json_is_object(resp)) {
    json_decref(resp);
    resp = json_incref(c);
  }
  json_t *trs = json_object_get(last, "tool_responses");
  if (!trs) json_object_set_new(last, "tool_responses", trs = json_array());
  json_array_append_new(trs, json_pack("{s:s, s:o}", "name", name, "response", resp));
  return 0;
}

/* The history's tool turns written back into body's "messages" (a new array)
 * before they are parsed: in the protocol's form, with the instruction, or
 * (p->native) in Gemma 4's. */
static int rewrite_messages(struct pctx *p, json_t *body, const char *instruction) {
  json_t *in = json_object_get(body, "messages");
  if (!json_is_array(in)) return 0; /* parse_messages says what is wrong */
  json_t *out = json_array();
  if (!out) return nomem(p);
  json_t *pending = NULL; /* protocol: tool results gathered for one user turn */
  json_t *last = NULL;    /* native: the last assistant turn with calls, as written to out */
  int rc = 0;
  size_t i;
  json_t *m;
  json_array_foreach(in, i, m) {
    json_t *role = json_object_get(m, "role");
    const char *rs = json_is_string(role) ? json_string_value(role) : "";
    if (!strcmp(rs, "tool")) {
      json_t *id, *c;
      if ((rc = tool_message(p, m, i, &id, &c))) break;
      if (p->native) {
        if ((rc = native_result(p, last, i, id, c))) break;
        continue;
      }
      if (!pending) pending = json_array();
      json_array_append_new(
          pending, json_pack("{s:{s:O, s:O}}", "tool_response", "tool_call_id", id, "content", c));
      continue;
    }
    if (pending) { /* the results before this turn, as one user turn */
      append_results(out, pending);
      pending = NULL;
    }
    json_t *tc = json_is_object(m) ? json_object_get(m, "tool_calls") : NULL;
    if (!strcmp(rs, "assistant") && tc && !json_is_null(tc)) {
      json_t *calls;
      if ((rc = read_calls(p, tc, i, &calls))) break;
      if (p->native) { /* the turn with its calls in the request's form */
        last = json_copy(m);
        json_object_set_new(last, "tool_calls", calls);
        json_array_append_new(out, last);
        continue;
      }
      json_t *obj = json_pack("{s:o}", "tool_calls", calls);
      char *txt = json_dumps(obj, JSON_COMPACT);
      json_decref(obj);
      json_array_append_new(
          out, json_pack("{s:s, s:s}", "role", "assistant", "content", txt ? txt : ""));
      free(txt);
      continue;
    }
    last = NULL; /* results answer the calls just before them */
    json_array_append(out, m);
  }
  if (rc) {
    json_decref(out), json_decref(pending);
    return rc;
  }
  if (pending) append_results(out, pending);
  if (instruction) { /* into the system message, or one of its own first */
    json_t *first = json_array_get(out, 0);
    json_t *role = json_object_get(first, "role"), *c = json_object_get(first, "content");
    if (json_is_string(role) && !strcmp(json_string_value(role), "system") && json_is_string(c)) {
      size_t n = strlen(instruction) + json_string_length(c) + 3;
      char *s = malloc(n);
      if (s) snprintf(s, n, "%s\n\n%s", instruction, json_string_value(c));
      json_array_set_new(out, 0, json_pack("{s:s, s:s}", "role", "system", "content", s ? s : ""));
      free(s);
    } else {
      json_array_insert_new(out, 0,
                            json_pack("{s:s, s:s}", "role", "system", "content", instruction));
    }
  }
  json_object_set_new(body, "messages", out);
  return 0;
}

/* The tools for the template; calls read from the answer; under "required" or a
 * named tool, a grammar of calls in the notation. */
static int native_tools(struct pctx *p, json_t *list, const char *only, int required,
                        int parallel) {
  struct fe_api_request *r = p->r;
  json_t *decl = json_array();
  size_t i;
  json_t *t;
  json_array_foreach(list, i, t) {
    json_t *fn = json_pack("{s:O, s:O, s:O}", "name", json_object_get(t, "name"), "description",
                           json_object_get(t, "description"), "parameters",
                           json_object_get(t, "parameters"));
    json_array_append_new(decl, json_pack("{s:s, s:o}", "type", "function", "function", fn));
  }
  char *txt = json_dumps(decl, JSON_COMPACT);
  json_decref(decl);
  if (!txt || !(r->tools_json = cm_arena_strndup(&r->arena, txt, strlen(txt)))) {
    free(txt);
    return nomem(p);
  }
  free(txt);
  r->g4 |= FE_G4_TOOLS;
  if (!only && !required) return 0;
  char *gbnf = NULL, err[512], param[64];
  int grc =
      fe_g4_tools_grammar(list, only, parallel, p->model->marker, &gbnf, param, err, sizeof err);
  if (grc == CM_ERR_INVAL) return fail(p, 400, param, "%s", err);
  if (grc) return nomem(p);
  json_t *g = json_string(gbnf);
  free(gbnf);
  int rc = g ? set_constraint(p, "tools", GR_GRAMMAR, g) : nomem(p);
  json_decref(g);
  return rc;
}

/* Whether body has field k with a value other than null. */
static int given(json_t *body, const char *k) {
  json_t *v = json_object_get(body, k);
  return v && !json_is_null(v);
}

/* OpenAI's deprecated function calling, as its tools. functions [{name,
 * description, parameters}] are tools of type function with one call at most, and
 * function_call ("none", "auto" or {"name": ...}) is the tool_choice; the answer's
 * call goes back as message.function_call (fe_api_request.legacy_functions). In the
 * history an assistant turn's function_call is a tool call whose id is made from the
 * turn's index, and a "function" turn is that call's result. The body is rewritten
 * in place before the tools and messages are read. */
static int legacy_functions(struct pctx *p, json_t *body) {
  json_t *fns = json_object_get(body, "functions"), *fc = json_object_get(body, "function_call");
  const char *both = given(body, "tools") && given(body, "functions")             ? "functions"
                     : given(body, "tool_choice") && given(body, "function_call") ? "function_call"
                                                                                  : NULL;
  if (both)
    return fail(p, 400, both, "'%s' (OpenAI's older form of tools) cannot be combined with '%s'",
                both, strcmp(both, "functions") ? "tool_choice" : "tools");
  if (given(body, "functions")) {
    json_t *tools = json_array(), *f;
    size_t i;
    if (!tools) return nomem(p);
    if (!json_is_array(fns)) {
      json_decref(tools);
      return fail(p, 400, "functions", "'functions' must be an array of function objects");
    }
    json_array_foreach(fns, i, f) {
      if (!json_is_string(json_object_get(f, "name"))) {
        json_decref(tools);
        char param[48];
        snprintf(param, sizeof(param), "functions[%zu].name", i);
        return fail(p, 400, param, "'%s' (a string) is required", param);
      }
      json_array_append_new(tools, json_pack("{s:s, s:O}", "type", "function", "function", f));
    }
    json_object_set_new(body, "tools", tools);
    json_object_set_new(body, "parallel_tool_calls", json_false());
    p->r->legacy_functions = 1;
  }
  if (given(body, "function_call")) {
    json_t *name = json_object_get(fc, "name"), *choice = NULL;
    if (json_is_string(fc) &&
        (!strcmp(json_string_value(fc), "none") || !strcmp(json_string_value(fc), "auto")))
      choice = json_incref(fc);
    else if (json_is_object(fc) && json_is_string(name))
      choice = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    else
      return fail(p, 400, "function_call",
                  "'function_call' must be \"none\", \"auto\" or {\"name\": ...}");
    json_object_set_new(body, "tool_choice", choice);
  }
  json_t *msgs = json_object_get(body, "messages"), *m;
  char id[32] = "", param[64];
  size_t i;
  json_array_foreach(msgs, i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!role) continue; /* parse_messages says what is wrong */
    if (!strcmp(role, "assistant") && given(m, "function_call")) {
      snprintf(param, sizeof(param), "messages[%zu].function_call", i);
      if (given(m, "tool_calls"))
        return fail(p, 400, param, "'%s' cannot be combined with 'tool_calls'", param);
      snprintf(id, sizeof(id), "call_fn%zu", i);
      json_object_set_new(m, "tool_calls",
                          json_pack("[{s:s, s:s, s:O}]", "id", id, "type", "function", "function",
                                    json_object_get(m, "function_call")));
      json_object_del(m, "function_call");
    } else if (!strcmp(role, "function")) {
      snprintf(param, sizeof(param), "messages[%zu].role", i);
      if (!id[0])
        return fail(p, 400, param,
                    "a 'function' message answers an assistant message's 'function_call' "
                    "before it");
      json_object_set_new(m, "role", json_string("tool"));
      json_object_set_new(m, "tool_call_id", json_string(id));
    }
  }
  return 0;
}

static int parse_tools(struct pctx *p, json_t *body) {
  struct fe_api_request *r = p->r;
  json_t *tools = json_object_get(body, "tools"), *tc = json_object_get(body, "tool_choice");
  int has_tools =
      tools && !json_is_null(tools) && !(json_is_array(tools) && !json_array_size(tools));
  const char *choice = has_tools ? "auto" : "none", *only = NULL;
  if (tc && !json_is_null(tc)) {
    if (json_is_string(tc)) {
      choice = json_string_value(tc);
      if (strcmp(choice, "none") && strcmp(choice, "auto") && strcmp(choice, "required"))
        return fail(p, 400, "tool_choice",
                    "'tool_choice' must be none, auto, required or {\"type\": \"function\", "
                    "\"function\": {\"name\": ...}}");
    } else {
      json_t *fn = json_object_get(tc, "function"), *name = json_object_get(fn, "name");
      if (!json_is_object(tc) || !json_is_string(name))
        return fail(p, 400, "tool_choice.function.name",
                    "'tool_choice' names a tool as {\"type\": \"function\", \"function\": "
                    "{\"name\": ...}}");
      choice = "named";
      only = json_string_value(name);
    }
    if (strcmp(choice, "none") && !has_tools)
      return fail(p, 400, "tool_choice", "'tool_choice' without 'tools'");
  }
  int parallel = 1;
  int rc = get_bool(p, body, "parallel_tool_calls", &parallel);
  if (rc) return rc;
  json_t *list = NULL;
  if (has_tools && (rc = read_tools(p, tools, &list))) return rc;
  if (only) {
    int found = 0;
    for (size_t i = 0; i < json_array_size(list); i++)
      found |= !strcmp(json_string_value(json_object_get(json_array_get(list, i), "name")), only);
    if (!found) {
      json_decref(list);
      return fail(p, 400, "tool_choice.function.name",
                  "'tool_choice' names '%.64s', which is not "
                  "among the tools",
                  only);
    }
  }
  int active = has_tools && strcmp(choice, "none") != 0;
  if (p->native) {
    rc = rewrite_messages(p, body, NULL);
    if (!rc && active) rc = native_tools(p, list, only, !strcmp(choice, "required"), parallel);
    json_decref(list);
    return rc;
  }
  char *instruction = active ? tools_instruction(list, only, !strcmp(choice, "required")) : NULL;
  json_t *schema = active ? tools_schema(list, only, parallel, !strcmp(choice, "auto")) : NULL;
  json_decref(list);
  if (active && (!instruction || !schema)) {
    free(instruction);
    json_decref(schema);
    return nomem(p);
  }
  rc = rewrite_messages(p, body, instruction);
  free(instruction);
  if (!rc && active) {
    rc = set_constraint(p, "tools", GR_JSON_SCHEMA, schema);
    r->tool_answer = !rc;
  }
  json_decref(schema);
  return rc;
}

/* ---- the protocol's answer as it streams ---------------------------------------- */

struct ts {
  const char *t;
  size_t n, pos;
};

static void ts_ws(struct ts *s) {
  while (s->pos < s->n && (s->t[s->pos] == ' ' || s->t[s->pos] == '\n' || s->t[s->pos] == '\t' ||
                           s->t[s->pos] == '\r'))
    s->pos++;
}

/* c (after whitespace): 1 and past it, else 0. */
static int ts_byte(struct ts *s, char c) {
  ts_ws(s);
  if (s->pos >= s->n || s->t[s->pos] != c) return 0;
  s->pos++;
  return 1;
}

/* A whole JSON string (after whitespace): its inside's span, 1; else 0. */
static int ts_string(struct ts *s, size_t *at, size_t *len) {
  if (!ts_byte(s, '"')) return 0;
  size_t b = s->pos;
  for (; s->pos < s->n; s->pos++) {
    if (s->t[s->pos] == '\\') {
      s->pos++;
      continue;
    }
    if (s->t[s->pos] == '"') {
      *at = b;
      *len = s->pos++ - b;
      return 1;
    }
  }
  return 0;
}

static int ts_key(struct ts *s, const char *key) {
  size_t at, len;
  return ts_string(s, &at, &len) && len == strlen(key) && !memcmp(s->t + at, key, len) &&
         ts_byte(s, ':');
}

/* A JSON value from s->pos: 1 and past it when whole, else 0 (s->pos at the end). */
static int ts_value(struct ts *s) {
  int depth = 0, in_str = 0;
  for (; s->pos < s->n; s->pos++) {
    char c = s->t[s->pos];
    if (in_str) {
      if (c == '\\')
        s->pos++;
      else if (c == '"')
        in_str = 0;
      else
        continue;
      if (!in_str && !depth) return s->pos++, 1;
      continue;
    }
    if (c == '"')
      in_str = 1;
    else if (c == '{' || c == '[')
      depth++;
    else if (c == '}' || c == ']') {
      if (--depth <= 0) return s->pos++, 1;
    } else if (!depth && (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r'))
      return 1; /* a scalar ended */
  }
  return 0;
}

size_t fe_api_tool_scan(const char *text, size_t len, struct fe_api_tool_span *calls, size_t max) {
  struct ts s = {text, len, 0};
  size_t n = 0;
  if (!ts_byte(&s, '{') || !ts_key(&s, "tool_calls") || !ts_byte(&s, '[')) return 0;
  while (n < max) {
    struct fe_api_tool_span *c = &calls[n];
    /* the protocol's schema writes "name" before "arguments" */
    if (!ts_byte(&s, '{') || !ts_key(&s, "name") || !ts_string(&s, &c->name_at, &c->name_len))
      break;
    if (!ts_byte(&s, ',') || !ts_key(&s, "arguments")) break;
    ts_ws(&s);
    c->args_at = s.pos;
    c->args_done = ts_value(&s);
    /* a character cut at the end of the text waits for its other bytes */
    c->args_len =
        c->args_done ? s.pos - c->args_at : fe_utf8_whole(text + c->args_at, s.pos - c->args_at);
    n++;
    if (!c->args_done || !ts_byte(&s, '}') || !ts_byte(&s, ',')) break;
  }
  return n;
}

void fe_api_tool_answer(const char *text, size_t len, char **calls, char **content) {
  *calls = NULL;
  *content = NULL;
  json_t *o = json_loadb(text, len, 0, NULL);
  json_t *tc = json_object_get(o, "tool_calls"), *resp = json_object_get(o, "response");
  if (json_is_string(resp)) {
    *content = strndup(json_string_value(resp), json_string_length(resp));
  } else if (json_is_array(tc)) {
    /* the arguments as the model wrote them (what a stream sent), where the scan
     * reads the same calls */
    struct fe_api_tool_span sp[64];
    size_t n_sp = fe_api_tool_scan(text, len, sp, 64);
    int raw = n_sp == json_array_size(tc);
    json_t *out = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(tc, i, c) {
      char id[40];
      char *args = raw ? strndup(text + sp[i].args_at, sp[i].args_len)
                       : json_dumps(json_object_get(c, "arguments"), JSON_COMPACT);
      fe_api_make_id(id, sizeof(id), "call_");
      json_t *call = json_pack("{s:s, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function",
                               "name", json_object_get(c, "name"), "arguments", args ? args : "{}");
      json_array_append_new(out, call);
      free(args);
    }
    *calls = json_dumps(out, JSON_COMPACT);
    json_decref(out);
  }
  json_decref(o);
}

/* chat_template_kwargs (an object: its entries become the chat template's
 * variables, as vLLM passes them) over the server's defaults; documents (a list
 * of objects, for templates that take retrieved documents) as the variable
 * documents, as Hugging Face's apply_chat_template passes them; reasoning_effort
 * as enable_thinking. */
static int parse_template_kwargs(struct pctx *p, json_t *body, const struct fe_api_config *cfg) {
  struct fe_api_request *r = p->r;
  json_t *v = json_object_get(body, "chat_template_kwargs");
  if (v && !json_is_null(v) && !json_is_object(v))
    return fail(p, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object, not %s",
                type_name(v));
  json_t *kw = cfg->default_template_kwargs ? json_loads(cfg->default_template_kwargs, 0, NULL)
                                            : json_object();
  if (!json_is_object(kw)) {
    json_decref(kw);
    kw = json_object();
  }
  if (!kw) return nomem(p);
  if (json_is_object(v)) json_object_update(kw, v);
  json_t *docs = json_object_get(body, "documents");
  if (docs && !json_is_null(docs)) {
    size_t i;
    json_t *d;
    if (!json_is_array(docs)) {
      json_decref(kw);
      return fail(p, 400, "documents", "'documents' must be a list of objects, not %s",
                  type_name(docs));
    }
    json_array_foreach(docs, i, d) if (!json_is_object(d)) {
      char param[48];
      json_decref(kw);
      snprintf(param, sizeof(param), "documents[%zu]", i);
      return fail(p, 400, param, "'documents[%zu]' must be an object, not %s", i, type_name(d));
    }
    if (json_array_size(docs) && json_object_set(kw, "documents", docs)) {
      json_decref(kw);
      return nomem(p);
    }
  }
  /* reasoning_effort (OpenAI's): low, medium or high turns thinking on, none and minimal
   * off (the template's enable_thinking), unless the request's own chat_template_kwargs
   * names enable_thinking */
  json_t *eff = json_object_get(body, "reasoning_effort");
  const char *es = json_string_value(eff);
  if (eff && !json_is_null(eff)) {
    static const char *const efforts[] = {"none", "minimal", "low", "medium", "high"};
    size_t k = 0;
    while (es && k < 5 && strcmp(es, efforts[k]))
      k++;
    if (k == 5 || !es) {
      json_decref(kw);
      return fail(p, 400, "reasoning_effort",
                  "'reasoning_effort' must be none, minimal, low, medium or high");
    }
    if (!json_object_get(v, "enable_thinking"))
      json_object_set_new(kw, "enable_thinking", json_boolean(k >= 2));
  }
  json_t *th = json_object_get(kw, "enable_thinking");
  if (th && !json_is_null(th) && !json_is_boolean(th)) {
    json_decref(kw);
    return fail(p, 400, "chat_template_kwargs.enable_thinking",
                "'chat_template_kwargs.enable_thinking' must be a boolean, not %s", type_name(th));
  }
  r->thinking = json_is_true(th);
  /* the request's own template: the field, else chat_template_kwargs' (vLLM reads both) */
  json_t *ct = json_object_get(body, "chat_template");
  const char *ct_param = "chat_template";
  if (!ct || json_is_null(ct))
    ct = json_object_get(kw, "chat_template"), ct_param = "chat_template_kwargs.chat_template";
  if (ct && !json_is_null(ct)) {
    if (!json_is_string(ct) || !json_string_length(ct)) {
      json_decref(kw);
      return fail(p, 400, ct_param, "'%s' must be a chat template (a non-empty string)", ct_param);
    }
    if (!(r->chat_template =
              cm_arena_strndup(&r->arena, json_string_value(ct), json_string_length(ct)))) {
      json_decref(kw);
      return nomem(p);
    }
  }
  json_object_del(kw, "chat_template");
  int rc = 0;
  if (json_object_size(kw)) {
    char *t = json_dumps(kw, JSON_COMPACT);
    if (!t || !(r->template_kwargs = cm_arena_strndup(&r->arena, t, strlen(t)))) rc = nomem(p);
    free(t);
  }
  json_decref(kw);
  if (!rc && p->model && p->model->reasoning && r->kind == FE_API_CHAT) r->g4 |= FE_G4_REASONING;
  return rc;
}

/* With thinking on, a constraint starts where the thought ends: the grammar
 * becomes GR_AFTER_SPAN (<|channel> any text <channel|>, optional) before it. */
static int constrain_after_thought(struct pctx *p) {
  struct fe_api_request *r = p->r;
  const struct fe_api_model *mo = p->model;
  if (!r->grammar_kind || !r->thinking || !mo || !mo->reasoning) return 0;
  char head[64];
  int hl = snprintf(head, sizeof(head), "%d %d %d\n", (int)mo->marker[FE_G4_CHANNEL],
                    (int)mo->marker[FE_G4_CHANNEL_END], r->grammar_kind);
  size_t len = (size_t)hl + r->grammar_len;
  if (len > FE_API_MAX_GRAMMAR)
    return fail(p, 400, r->grammar_param,
                "'%s' takes %zu bytes after the thinking channel's prefix, at most %d are allowed",
                r->grammar_param, len, FE_API_MAX_GRAMMAR);
  char *t = cm_arena_alloc(&r->arena, len + 1);
  if (!t) return nomem(p);
  memcpy(t, head, (size_t)hl);
  if (r->grammar_len) memcpy(t + hl, r->grammar, r->grammar_len);
  t[len] = 0;
  /* the constraint's check compiles the whole, its own text within */
  p->constraint->kind = GR_AFTER_SPAN;
  p->constraint->text = t;
  p->constraint->len = len;
  r->grammar = t;
  r->grammar_len = len;
  r->grammar_kind = GR_AFTER_SPAN;
  return 0;
}

/* After native calls the model ends its turn with <|tool_response>: a stop id. */
static int stop_after_calls(struct pctx *p) {
  struct fe_api_request *r = p->r;
  int32_t stop = p->model ? p->model->marker[FE_G4_RESPONSE] : -1;
  if (!(r->g4 & FE_G4_TOOLS) || stop < 0) return 0;
  int32_t *ids = cm_arena_alloc(&r->arena, (r->n_stop_token_ids + 1) * sizeof(int32_t));
  if (!ids) return nomem(p);
  if (r->n_stop_token_ids) memcpy(ids, r->stop_token_ids, r->n_stop_token_ids * sizeof(int32_t));
  ids[r->n_stop_token_ids++] = stop;
  r->stop_token_ids = ids;
  return 0;
}

/* mm_processor_kwargs (vLLM's: the multimodal processor's settings for this
 * request): max_soft_tokens, Gemma 4's image budget, one of 70, 140, 280, 560,
 * 1120; other keys are not read. */
static int parse_mm_kwargs(struct pctx *p, json_t *body) {
  json_t *v = json_object_get(body, "mm_processor_kwargs");
  if (!v || json_is_null(v)) return 0;
  if (!json_is_object(v))
    return fail(p, 400, "mm_processor_kwargs", "'mm_processor_kwargs' must be an object, not %s",
                type_name(v));
  json_t *t = json_object_get(v, "max_soft_tokens");
  if (!t || json_is_null(t)) return 0;
  long long n = json_is_integer(t) ? (long long)json_integer_value(t) : -1;
  if (n < 1 || n > MD_G4_MAX_SOFT_TOKENS || !md_g4_soft_tokens_allowed((int)n))
    return fail(p, 400, "mm_processor_kwargs.max_soft_tokens",
                "'mm_processor_kwargs.max_soft_tokens' must be one of 70, 140, 280, 560, 1120");
  p->r->max_soft_tokens = (int)json_integer_value(t);
  return 0;
}

static int parse_body(struct pctx *p, json_t *body, const struct fe_api_config *cfg) {
  struct fe_api_request *r = p->r;
  int rc;
  if ((rc = parse_model(p, body, cfg))) return rc;
  switch (r->kind) {
  case FE_API_COMPLETION:
    if ((rc = parse_prompt(p, body))) return rc;
    /* vLLM's: <bos> before each text prompt (true), or not (a prompt that holds it) */
    if ((rc = get_bool(p, body, "add_special_tokens", &r->add_special_tokens))) return rc;
    break;
  case FE_API_CHAT:
    if ((rc = parse_template_kwargs(p, body, cfg))) return rc;
    if ((rc = legacy_functions(p, body))) return rc;
    if ((rc = parse_tools(p, body))) return rc;
    if ((rc = parse_messages(p, body))) return rc;
    if ((rc = parse_mm_kwargs(p, body))) return rc;
    if ((rc = parse_generation_prompt(p, body))) return rc;
    /* vLLM's: special tokens besides the template's (false: the template writes <bos>) */
    if ((rc = get_bool(p, body, "add_special_tokens", &r->add_special_tokens))) return rc;
    break;
  case FE_API_TOKENIZE:
    if (json_object_get(body, "messages")) {
      r->add_special_tokens = 0;
      if ((rc = parse_template_kwargs(p, body, cfg))) return rc;
      if ((rc = legacy_functions(p, body))) return rc;
      if ((rc = parse_tools(p, body))) return rc; /* the prompt the tools make, as vLLM's */
      if ((rc = parse_messages(p, body))) return rc;
      if ((rc = parse_mm_kwargs(p, body))) return rc;
      if ((rc = parse_generation_prompt(p, body))) return rc;
    } else {
      json_t *pr = json_object_get(body, "prompt");
      if (!json_is_string(pr))
        return fail(p, 400, "prompt", "'prompt' (a string) or 'messages' is required");
      if ((rc = parse_prompt(p, body))) return rc;
    }
    if ((rc = get_bool(p, body, "return_token_strs", &r->token_strs))) return rc;
    return get_bool(p, body, "add_special_tokens", &r->add_special_tokens);
  case FE_API_DETOKENIZE: {
    json_t *t = json_object_get(body, "tokens");
    if (!json_is_array(t))
      return fail(p, 400, "tokens", "'tokens' (an array of token ids) is required");
    r->prompts = cm_arena_calloc(&r->arena, 1, sizeof(*r->prompts));
    if (!r->prompts) return nomem(p);
    r->n_prompts = 1;
    return token_ids(p, t, "tokens", &r->prompts[0].ids, &r->prompts[0].n_ids);
  }
  }
  if ((rc = parse_sampling(p, body))) return rc;
  if ((rc = stop_after_calls(p))) return rc;
  if ((rc = constrain_after_thought(p))) return rc;
  if ((rc = parse_output(p, body))) return rc;
  if ((rc = parse_best_of(p))) return rc;
  if ((rc = parse_beam(p, body))) return rc;
  if ((rc = parse_truncation(p, body, cfg))) return rc;
  if ((rc = parse_cache_salt(p, body))) return rc;
  /* token-id prompts have known lengths: check them now (truncated ones once cut) */
  for (size_t i = 0; cfg->max_model_len > 0 && !r->truncate_prompt_tokens && i < r->n_prompts;
       i++) {
    if (!r->prompts[i].ids) continue;
    int64_t mt;
    if ((rc = fe_api_check_prompt_len(r, (int64_t)r->prompts[i].n_ids, cfg->max_model_len, &mt,
                                      p->err)))
      return rc;
  }
  return 0;
}

int fe_api_parse_request(enum fe_api_kind kind, const char *body, size_t len,
                         const struct fe_api_config *cfg, struct fe_api_request *out,
                         struct fe_api_error *err) {
  memset(out, 0, sizeof(*out));
  memset(err, 0, sizeof(*err));
  set_defaults(out, kind, cfg->defaults);
  struct pctx p = {out,  err,           cfg->model, cfg->model && cfg->model->native_tools,
                   NULL, cfg->defaults, cfg};
  json_error_t je;
  json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
  if (!root) {
    /* Jansson refuses numbers that do not fit (an integer past 64 bits, a
     * real past DBL_MAX), NaN or Infinity and broken strings while parsing:
     * name the field when the error lies in one value (not in the
     * structure around it: "... expected") */
    char param[sizeof(err->param)];
    enum json_error_code code = json_error_code(&je);
    int in_value = code == json_error_numeric_overflow || code == json_error_invalid_utf8 ||
                   (code == json_error_invalid_syntax && !strstr(je.text, "expected"));
    if (!in_value || !fe_api_json_error_param(body, len, (size_t)je.position, param, sizeof(param)))
      fail(&p, 400, NULL, "invalid JSON in the request body: %s (line %d, column %d)", je.text,
           je.line, je.column);
    else if (code == json_error_numeric_overflow)
      fail(&p, 400, param, "'%s' is out of range: %s", param, je.text);
    else
      fail(&p, 400, param, "'%s' is not a valid JSON value: %s (line %d, column %d)", param,
           je.text, je.line, je.column);
    return CM_ERR_PARSE;
  }
  if (!json_is_object(root)) {
    fail(&p, 400, NULL, "the request body must be a JSON object, not %s", type_name(root));
    json_decref(root);
    return CM_ERR_PARSE;
  }
  /* strings are copied out of Jansson: the arena holds at most a few
   * times the body (token ids widen to 4 bytes each) */
  cm_arena_init(&out->arena, 16384, 8 * len + (64u << 10));
  int rc = parse_body(&p, root, cfg);
  json_decref(root);
  if (rc) {
    cm_arena_free(&out->arena);
    memset(out, 0, sizeof(*out));
  }
  return rc;
}

void fe_api_request_free(struct fe_api_request *r) {
  cm_arena_free(&r->arena);
  memset(r, 0, sizeof(*r));
}

int fe_api_check_prompt_len(const struct fe_api_request *r, int64_t n_prompt_tokens,
                            int64_t max_model_len, int64_t *max_tokens_out,
                            struct fe_api_error *err) {
  const char *what = r->responses ? "input" : r->kind == FE_API_CHAT ? "messages" : "prompt";
  err->status = 400;
  if (n_prompt_tokens >= max_model_len) {
    snprintf(err->param, sizeof(err->param), "%s", what);
    snprintf(err->message, sizeof(err->message),
             "This model's maximum context length is %" PRId64
             " tokens. However, your request has %" PRId64
             " input tokens. Please reduce the length of the input %s.",
             max_model_len, n_prompt_tokens, what);
    return CM_ERR_RANGE;
  }
  if (r->max_tokens > 0 && n_prompt_tokens + r->max_tokens > max_model_len) {
    snprintf(err->param, sizeof(err->param), "max_tokens");
    snprintf(err->message, sizeof(err->message),
             "This model's maximum context length is %" PRId64
             " tokens. However, you requested %" PRId64 " tokens (%" PRId64 " in the %s, %" PRId64
             " in the completion). Please reduce the length of the "
             "%s or completion.",
             max_model_len, n_prompt_tokens + r->max_tokens, n_prompt_tokens, what, r->max_tokens,
             what);
    return CM_ERR_RANGE;
  }
  err->status = 0;
  *max_tokens_out = r->max_tokens > 0 ? r->max_tokens : max_model_len - n_prompt_tokens;
  return 0;
}
