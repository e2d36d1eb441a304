/* fe-api-responses.c — POST /v1/responses (OpenAI's Responses API, as vLLM
 * serves it): the request turned into the chat request underneath it, and the
 * fields its answer echoes (fe-api.h). The answer's items and events are
 * fe-responses.c's. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "frontend/fe-api-conv.h"
#include "frontend/fe-api-resp.h"
#include "frontend/fe-api.h"
#include "frontend/fe-rstore.h"

#define MAX_ITEMS 4096 /* input items; the chat parse caps the rest */

struct rctx {
  struct fe_conv cv;       /* the chat messages, each with its input item ("input[3]") */
  struct fe_rstore *store; /* NULL: none */
  size_t conv_from; /* messages from here on are the conversation (before: the instructions) */
  json_t *items;    /* the input items, each with its id, for the store */
};

/* An input item as the store lists it: a copy with its type and an id. */
static int keep_item(struct rctx *c, json_t *it, const char *type) {
  json_t *x = json_deep_copy(it);
  if (!x || json_array_append_new(c->items, x)) return fe_conv_oom(c->cv.err);
  if (!json_object_get(x, "type")) json_object_set_new(x, "type", json_string(type));
  if (!json_is_string(json_object_get(x, "id"))) {
    char id[48];
    fe_api_make_id(id, sizeof(id), !strcmp(type, "message") ? "msg_" : "fc_");
    json_object_set_new(x, "id", json_string(id));
  }
  return 0;
}

/* The chat content of a message item's content (a string, or input_text,
 * output_text, input_image and input_audio parts), new; NULL with err set. */
static json_t *content_of(struct rctx *c, json_t *v, const char *param, int assistant) {
  if (json_is_string(v)) return json_copy(v);
  if (!json_is_array(v)) {
    fe_conv_fail(c->cv.err, param, "'%s' must be a string or a list of content parts", param);
    return NULL;
  }
  json_t *parts = json_array();
  size_t k;
  json_t *part;
  json_array_foreach(v, k, part) {
    char pp[128];
    snprintf(pp, sizeof(pp), "%s[%zu]", param, k);
    const char *t = json_string_value(json_object_get(part, "type"));
    json_t *text = json_object_get(part, "text"), *x = NULL;
    if (!t) {
      fe_conv_fail(c->cv.err, pp, "'%s' must be an object with a 'type'", pp);
    } else if (!strcmp(t, "input_text") || !strcmp(t, "output_text")) {
      if (json_is_string(text))
        x = json_pack("{s:s, s:O}", "type", "text", "text", text);
      else
        fe_conv_fail(c->cv.err, pp, "'%s' needs a string 'text'", pp);
    } else if (!strcmp(t, "input_image") && !assistant) {
      json_t *url = json_object_get(part, "image_url"), *detail = json_object_get(part, "detail");
      if (fe_conv_given(part, "file_id"))
        fe_conv_fail(c->cv.err, pp,
                     "'%s': file ids are not served here; send the image as 'image_url'", pp);
      else if (!json_is_string(url))
        fe_conv_fail(c->cv.err, pp, "'%s' needs 'image_url', a data:, file:// or http(s):// URL",
                     pp);
      else
        x = json_pack("{s:s, s:{s:O}}", "type", "image_url", "image_url", "url", url);
      if (x && json_is_string(detail))
        json_object_set(json_object_get(x, "image_url"), "detail", detail);
    } else if (!strcmp(t, "input_audio") && !assistant) {
      x = json_deep_copy(part); /* chat's form: {"input_audio": {"data", "format"}} */
    } else if (!strcmp(t, "refusal") && assistant) {
      continue; /* nothing the model said */
    } else {
      fe_conv_fail(c->cv.err, pp,
                   "content part type '%.40s' is not supported here ('input_text', 'input_image', "
                   "'input_audio'; an assistant's 'output_text')",
                   t);
    }
    if (!x) {
      json_decref(parts);
      return NULL;
    }
    json_array_append_new(parts, x);
  }
  return parts;
}

/* A message item: {"role", "content"} ("type": "message" optional). */
static int message_item(struct rctx *c, json_t *it, const char *param) {
  char pp[128];
  snprintf(pp, sizeof(pp), "%s.role", param);
  const char *role = json_string_value(json_object_get(it, "role"));
  if (!role || (strcmp(role, "user") && strcmp(role, "system") && strcmp(role, "developer") &&
                strcmp(role, "assistant")))
    return fe_conv_fail(c->cv.err, pp, "'%s' must be user, assistant, system or developer", pp);
  int assistant = !strcmp(role, "assistant");
  snprintf(pp, sizeof(pp), "%s.content", param);
  json_t *v = json_object_get(it, "content");
  if (!v) return fe_conv_fail(c->cv.err, pp, "'%s' is required", pp);
  json_t *content = content_of(c, v, pp, assistant);
  if (!content) return CM_ERR_INVAL;
  if (assistant && json_is_array(content)) { /* the text joined, as the model wrote it */
    size_t total = 0, k;
    json_t *part;
    json_array_foreach(content, k, part) total += json_string_length(json_object_get(part, "text"));
    char *s = malloc(total + 1);
    size_t o = 0;
    json_array_foreach(content, k, part) {
      json_t *t = json_object_get(part, "text");
      if (s) memcpy(s + o, json_string_value(t), json_string_length(t));
      o += json_string_length(t);
    }
    json_decref(content);
    content = s ? json_stringn(s, total) : NULL;
    free(s);
    if (!content) return fe_conv_oom(c->cv.err);
  }
  return fe_conv_push(&c->cv, json_pack("{s:s, s:o}", "role", role, "content", content), param);
}

/* A function_call item: a tool call of the assistant's turn; calls in a row, and
 * a message just before them, are one assistant turn. */
static int call_item(struct rctx *c, json_t *it, const char *param) {
  json_t *id = json_object_get(it, "call_id"), *name = json_object_get(it, "name");
  json_t *args = json_object_get(it, "arguments");
  char pp[128];
  const char *miss = !json_is_string(id)     ? "call_id"
                     : !json_is_string(name) ? "name"
                     : !json_is_string(args) ? "arguments"
                                             : NULL;
  if (miss) {
    snprintf(pp, sizeof(pp), "%s.%s", param, miss);
    return fe_conv_fail(c->cv.err, pp, "'%s' must be a string", pp);
  }
  json_t *call = json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type", "function", "function",
                           "name", name, "arguments", args);
  if (!call) return fe_conv_oom(c->cv.err);
  size_t n = json_array_size(c->cv.msgs);
  json_t *last = n ? json_array_get(c->cv.msgs, n - 1) : NULL;
  const char *role = json_string_value(json_object_get(last, "role"));
  if (role && !strcmp(role, "assistant")) {
    json_t *calls = json_object_get(last, "tool_calls");
    if (!calls) json_object_set_new(last, "tool_calls", calls = json_array());
    return json_array_append_new(calls, call) ? fe_conv_oom(c->cv.err) : 0;
  }
  return fe_conv_push(
      &c->cv, json_pack("{s:s, s:n, s:[o]}", "role", "assistant", "content", "tool_calls", call),
      param);
}

/* A function_call_output item: the call's result, a tool message. */
static int output_item(struct rctx *c, json_t *it, const char *param) {
  json_t *id = json_object_get(it, "call_id"), *out = json_object_get(it, "output");
  char pp[128];
  snprintf(pp, sizeof(pp), "%s.%s", param, json_is_string(id) ? "output" : "call_id");
  if (!json_is_string(id)) return fe_conv_fail(c->cv.err, pp, "'%s' must be a string", pp);
  json_t *content = content_of(c, out ? out : json_null(), pp, 0);
  if (!content) return CM_ERR_INVAL;
  return fe_conv_push(
      &c->cv, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content", content),
      param);
}

static int input_items(struct rctx *c, json_t *input) {
  if (json_is_string(input)) {
    json_t *it = json_pack("{s:s, s:s, s:[{s:s, s:O}]}", "type", "message", "role", "user",
                           "content", "type", "input_text", "text", input);
    int rc = it ? keep_item(c, it, "message") : fe_conv_oom(c->cv.err);
    json_decref(it);
    return rc ? rc
              : fe_conv_push(&c->cv, json_pack("{s:s, s:O}", "role", "user", "content", input),
                             "input");
  }
  if (!json_is_array(input) || !json_array_size(input))
    return fe_conv_fail(c->cv.err, "input",
                        "'input' must be a string or a non-empty list of items");
  if (json_array_size(input) > MAX_ITEMS)
    return fe_conv_fail(c->cv.err, "input", "%zu input items; at most %d", json_array_size(input),
                        MAX_ITEMS);
  size_t i;
  json_t *it;
  json_array_foreach(input, i, it) {
    char param[32];
    snprintf(param, sizeof(param), "input[%zu]", i);
    if (!json_is_object(it)) return fe_conv_fail(c->cv.err, param, "'%s' must be an object", param);
    json_t *type = json_object_get(it, "type");
    const char *t = json_is_string(type) ? json_string_value(type) : type ? NULL : "message";
    int rc;
    if (!t)
      rc = fe_conv_fail(c->cv.err, param, "'%s.type' must be a string", param);
    else if (!strcmp(t, "message"))
      rc = message_item(c, it, param);
    else if (!strcmp(t, "function_call"))
      rc = call_item(c, it, param);
    else if (!strcmp(t, "function_call_output"))
      rc = output_item(c, it, param);
    else if (!strcmp(t, "reasoning"))
      rc = 0; /* an earlier thought: Gemma's template drops it from the history */
    else
      rc = fe_conv_fail(
          c->cv.err, param,
          "input item type '%.40s' is not supported (message, function_call, "
          "function_call_output, reasoning)%s",
          t, !strcmp(t, "item_reference") ? ": items are referred to by previous_response_id" : "");
    if (!rc) rc = keep_item(c, it, t);
    if (rc) return rc;
  }
  if (!json_array_size(c->cv.msgs))
    return fe_conv_fail(c->cv.err, "input", "'input' holds no message");
  return 0;
}

/* tools: function tools ({"type": "function", "name", "description",
 * "parameters", "strict"}) as chat's. */
static int tools_of(struct fe_api_error *err, json_t *tools, json_t **out) {
  *out = NULL;
  if (!tools || json_is_null(tools)) return 0;
  if (!json_is_array(tools)) return fe_conv_fail(err, "tools", "'tools' must be a list");
  json_t *a = json_array();
  size_t i;
  json_t *t;
  json_array_foreach(tools, i, t) {
    char pp[128];
    snprintf(pp, sizeof(pp), "tools[%zu].type", i);
    const char *ty = json_string_value(json_object_get(t, "type"));
    if (!ty || strcmp(ty, "function")) {
      json_decref(a);
      return fe_conv_fail(err, pp,
                          "'%s' is '%.40s': only function tools are served here (no hosted tools)",
                          pp, ty ? ty : "missing");
    }
    json_t *fn = json_object();
    static const char *const keys[] = {"name", "description", "parameters", "strict"};
    for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++)
      if (json_object_get(t, keys[k])) json_object_set(fn, keys[k], json_object_get(t, keys[k]));
    json_array_append_new(a, json_pack("{s:s, s:o}", "type", "function", "function", fn));
  }
  *out = a;
  return 0;
}

/* tool_choice: none, auto, required, or {"type": "function", "name"}. */
static int tool_choice_of(struct fe_api_error *err, json_t *tc, json_t **out) {
  *out = NULL;
  if (!tc || json_is_null(tc)) return 0;
  if (json_is_string(tc)) {
    *out = json_copy(tc);
    return 0;
  }
  const char *ty = json_string_value(json_object_get(tc, "type"));
  json_t *name = json_object_get(tc, "name");
  if (!ty || strcmp(ty, "function") || !json_is_string(name))
    return fe_conv_fail(err, "tool_choice",
                        "'tool_choice' must be none, auto, required or {\"type\": \"function\", "
                        "\"name\": ...}");
  *out = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
  return 0;
}

/* text.format: text, json_object, or json_schema ({"name", "schema", "strict"}). */
static int format_of(struct fe_api_error *err, json_t *text, json_t **out) {
  *out = NULL;
  json_t *f = json_object_get(text, "format");
  if (!text || json_is_null(text) || !f || json_is_null(f)) return 0;
  const char *ty = json_string_value(json_object_get(f, "type"));
  if (ty && !strcmp(ty, "text")) return 0;
  if (ty && !strcmp(ty, "json_object")) {
    *out = json_pack("{s:s}", "type", "json_object");
    return 0;
  }
  if (!ty || strcmp(ty, "json_schema"))
    return fe_conv_fail(err, "text.format.type",
                        "'text.format.type' must be text, json_object or json_schema");
  json_t *js = json_object();
  static const char *const keys[] = {"name", "schema", "strict", "description"};
  for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++)
    if (json_object_get(f, keys[k])) json_object_set(js, keys[k], json_object_get(f, keys[k]));
  *out = json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js);
  return 0;
}

/* vLLM's sampling fields beyond OpenAI's, taken as chat takes them */
/* clang-format off */
static const char *const passed[] = {
    "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "min_tokens",
    "ignore_eos", "priority", "cache_salt", "mm_processor_kwargs", "chat_template_kwargs",
    "skip_special_tokens", "bad_words", "structured_outputs", "parallel_tool_calls", "stream",
    "user",
};
/* clang-format on */

/* Fields that ask for what this server does not give. */
static int refused(struct fe_api_error *err, json_t *b) {
  if (fe_conv_given(b, "conversation"))
    return fe_conv_fail(err, "conversation",
                        "'conversation' is not supported: conversations are not stored here");
  if (json_is_true(json_object_get(b, "background")))
    return fe_conv_fail(err, "background",
                        "'background' is not supported: responses are not stored here");
  json_t *mtc = json_object_get(b, "max_tool_calls");
  if (fe_conv_given(b, "max_tool_calls") && (!json_is_integer(mtc) || json_integer_value(mtc) < 0))
    return fe_conv_fail(err, "max_tool_calls", "'max_tool_calls' must be an integer >= 0");
  static const char *const hints[] = {"prompt_cache_key", "safety_identifier"};
  for (size_t i = 0; i < sizeof(hints) / sizeof(hints[0]); i++)
    if (fe_conv_given(b, hints[i]) && !json_is_string(json_object_get(b, hints[i])))
      return fe_conv_fail(err, hints[i], "'%s' must be a string", hints[i]);
  if (fe_conv_given(b, "prompt"))
    return fe_conv_fail(err, "prompt", "'prompt' (a stored prompt template) is not supported");
  json_t *inc = json_object_get(b, "include");
  if (inc && !json_is_null(inc) && !json_is_array(inc))
    return fe_conv_fail(err, "include", "'include' must be a list");
  size_t i;
  json_t *x;
  json_array_foreach(inc, i, x) {
    const char *s = json_string_value(x);
    /* reasoning.encrypted_content: a stateless client's way to carry thoughts to its
     * next turn; Gemma's chat templates drop earlier thoughts, so there is nothing to
     * carry, and reasoning items come without it */
    if (!s ||
        (strcmp(s, "message.output_text.logprobs") && strcmp(s, "reasoning.encrypted_content")))
      return fe_conv_fail(err, "include",
                          "'include' value '%.60s' is not supported (message.output_text.logprobs, "
                          "reasoning.encrypted_content)",
                          s ? s : "?");
  }
  return 0;
}

/* previous_response_id: the stored conversation it ends goes first (its
 * instructions do not: a request gives its own, as OpenAI's API has it). */
static int previous(struct rctx *c, json_t *id) {
  if (!id || json_is_null(id)) return 0;
  if (!json_is_string(id))
    return fe_conv_fail(c->cv.err, "previous_response_id",
                        "'previous_response_id' must be a string");
  if (!c->store)
    return fe_conv_fail(
        c->cv.err, "previous_response_id",
        "'previous_response_id' needs the response store, which is off on this server "
        "(--responses-store-size 0); send the conversation's items in 'input'");
  const struct fe_rstore_entry *e =
      fe_rstore_get(c->store, json_string_value(id), json_string_length(id));
  if (!e) {
    fe_conv_fail(c->cv.err, "previous_response_id", "no response '%.64s' is stored here",
                 json_string_value(id));
    c->cv.err->status = 404;
    return CM_ERR_NOENT;
  }
  json_t *conv = json_loads(e->conv, 0, NULL), *m;
  size_t i;
  int rc = conv ? 0 : fe_conv_oom(c->cv.err);
  json_array_foreach(conv, i, m) {
    if ((rc = fe_conv_push(&c->cv, json_incref(m), "previous_response_id"))) break;
  }
  json_decref(conv);
  return rc;
}

/* The chat request of body b (new), and the messages' origins. */
static int to_chat(struct rctx *c, json_t *b, json_t **out) {
  int rc = refused(c->cv.err, b);
  if (rc) return rc;
  json_t *req = json_object();
  c->cv.msgs = json_array();
  json_object_set_new(req, "messages", c->cv.msgs);
  *out = req;
  json_t *ins = json_object_get(b, "instructions");
  if (ins && !json_is_null(ins)) {
    if (!json_is_string(ins))
      return fe_conv_fail(c->cv.err, "instructions", "'instructions' must be a string");
    if ((rc = fe_conv_push(&c->cv, json_pack("{s:s, s:O}", "role", "system", "content", ins),
                           "instructions")))
      return rc;
  }
  c->conv_from = json_array_size(c->cv.msgs);
  if ((rc = previous(c, json_object_get(b, "previous_response_id")))) return rc;
  json_t *input = json_object_get(b, "input");
  if (!input || json_is_null(input)) return fe_conv_fail(c->cv.err, "input", "'input' is required");
  if ((rc = input_items(c, input))) return rc;
  if (json_object_get(b, "model")) json_object_set(req, "model", json_object_get(b, "model"));
  for (size_t k = 0; k < sizeof(passed) / sizeof(passed[0]); k++) {
    json_t *v = json_object_get(b, passed[k]);
    if (v) json_object_set(req, passed[k], v);
  }
  json_t *mo = json_object_get(b, "max_output_tokens");
  if (mo) json_object_set(req, "max_tokens", mo);
  json_t *x;
  if ((rc = tools_of(c->cv.err, json_object_get(b, "tools"), &x))) return rc;
  if (x) json_object_set_new(req, "tools", x);
  if ((rc = tool_choice_of(c->cv.err, json_object_get(b, "tool_choice"), &x))) return rc;
  if (x) json_object_set_new(req, "tool_choice", x);
  if ((rc = format_of(c->cv.err, json_object_get(b, "text"), &x))) return rc;
  if (x) json_object_set_new(req, "response_format", x);
  /* logprobs: include's message.output_text.logprobs (refused() checked it), or
   * top_logprobs */
  json_t *top = json_object_get(b, "top_logprobs"), *inc = json_object_get(b, "include");
  size_t i;
  int lps = top && !json_is_null(top);
  json_array_foreach(inc, i, x) lps |=
      !strcmp(json_string_value(x), "message.output_text.logprobs");
  if (lps) {
    json_object_set_new(req, "logprobs", json_true());
    if (top) json_object_set(req, "top_logprobs", top);
  }
  const char *tr = json_string_value(json_object_get(b, "truncation"));
  if (fe_conv_given(b, "truncation") && (!tr || (strcmp(tr, "auto") && strcmp(tr, "disabled"))))
    return fe_conv_fail(c->cv.err, "truncation", "'truncation' must be auto or disabled");

  /* reasoning.effort: chat's reasoning_effort (thinking on for low, medium, high) */
  json_t *rs = json_object_get(b, "reasoning");
  if (rs && !json_is_null(rs) && !json_is_object(rs))
    return fe_conv_fail(c->cv.err, "reasoning", "'reasoning' must be an object");
  json_t *eff = json_object_get(rs, "effort");
  if (eff) json_object_set(req, "reasoning_effort", eff);
  return 0;
}

/* What the response object echoes of the request (its effective sampling). */
static json_t *echo_of(json_t *b, const struct fe_api_request *r, int stored) {
  json_t *e = json_object();
  json_t *tc = json_object_get(b, "tool_choice"), *tools = json_object_get(b, "tools");
  json_t *rs = json_object_get(b, "reasoning"), *text = json_object_get(b, "text");
  json_t *md = json_object_get(b, "metadata");
  json_object_set_new(e, "instructions", json_copy(json_object_get(b, "instructions")));
  if (!json_object_get(e, "instructions")) json_object_set_new(e, "instructions", json_null());
  json_object_set_new(e, "max_output_tokens",
                      fe_conv_given(b, "max_output_tokens") ? json_integer(r->max_tokens)
                                                            : json_null());
  json_object_set_new(e, "metadata", json_is_object(md) ? json_deep_copy(md) : json_object());
  json_object_set_new(e, "parallel_tool_calls",
                      json_boolean(!json_is_false(json_object_get(b, "parallel_tool_calls"))));
  json_t *prev = json_object_get(b, "previous_response_id");
  json_object_set_new(e, "previous_response_id",
                      json_is_string(prev) ? json_copy(prev) : json_null());
  json_object_set_new(e, "reasoning",
                      json_is_object(rs) ? json_deep_copy(rs)
                                         : json_pack("{s:n, s:n}", "effort", "summary"));
  json_object_set_new(e, "store", json_boolean(stored));
  json_object_set_new(e, "temperature", json_real(r->temperature));
  json_object_set_new(e, "text",
                      json_is_object(text) && json_object_get(text, "format")
                          ? json_deep_copy(text)
                          : json_pack("{s:{s:s}}", "format", "type", "text"));
  json_object_set_new(e, "tool_choice",
                      tc && !json_is_null(tc) ? json_deep_copy(tc) : json_string("auto"));
  json_object_set_new(e, "tools", json_is_array(tools) ? json_deep_copy(tools) : json_array());
  json_object_set_new(e, "top_logprobs", json_integer(r->logprobs > 0 ? r->logprobs : 0));
  json_object_set_new(e, "top_p", json_real(r->top_p));
  const char *tr = json_string_value(json_object_get(b, "truncation"));
  json_object_set_new(e, "truncation", json_string(tr ? tr : "disabled"));
  json_t *user = json_object_get(b, "user");
  json_object_set_new(e, "user", json_is_string(user) ? json_copy(user) : json_null());
  json_object_set_new(e, "background", json_false());
  json_object_set_new(e, "service_tier", json_string("default"));
  /* echoed as given, and nothing to do here: max_tool_calls counts calls to hosted
   * tools, which are not served; prompt_cache_key and safety_identifier are hints for
   * OpenAI's own routing */
  static const char *const as_given[] = {"max_tool_calls", "prompt_cache_key", "safety_identifier"};
  for (size_t i = 0; i < sizeof(as_given) / sizeof(as_given[0]); i++) {
    json_t *v = json_object_get(b, as_given[i]);
    json_object_set_new(e, as_given[i], v ? json_deep_copy(v) : json_null());
  }
  return e;
}

/* A chat error's param in the Responses request's terms: messages[i] as the
 * input item it came from, max_tokens as max_output_tokens, response_format as
 * text.format, a tool's function.X as its X. */
static void rename_param(char *param, size_t cap, char *const *origin, size_t n) {
  char out[sizeof(((struct fe_api_error *)0)->param)];
  if (!strcmp(param, "messages"))
    snprintf(out, sizeof(out), "input");
  else if (!strcmp(param, "max_tokens"))
    snprintf(out, sizeof(out), "max_output_tokens");
  else if (!strcmp(param, "logprobs"))
    snprintf(out, sizeof(out), "include");
  else if (!strcmp(param, "reasoning_effort"))
    snprintf(out, sizeof(out), "reasoning.effort");
  else if (!fe_conv_rename(param, origin, n, ".call_id", "text.format", out, sizeof(out)))
    return;
  snprintf(param, cap, "%s", out);
}

int fe_api_parse_responses(const char *body, size_t len, const struct fe_api_config *cfg,
                           struct fe_api_request *out, struct fe_api_error *err) {
  memset(out, 0, sizeof(*out));
  memset(err, 0, sizeof(*err));
  json_t *b;
  int brc = fe_conv_body(FE_API_CHAT, body, len, cfg, out, err, &b);
  if (brc) return brc;
  /* what the store keeps (store: false asks it not to) */
  struct fe_rstore *store = json_is_false(json_object_get(b, "store")) ? NULL : cfg->store;
  struct rctx c = {{err}, cfg->store};
  c.items = json_array();
  json_t *req = NULL;
  int rc = c.items ? to_chat(&c, b, &req) : fe_conv_oom(err);
  char *js = rc ? NULL : json_dumps(req, JSON_COMPACT);
  if (!rc && !js) rc = fe_conv_oom(err);
  size_t n = json_array_size(c.cv.msgs);
  char *conv = NULL, *items = NULL;
  if (!rc && store) { /* the conversation so far, and the items as given */
    json_t *cv = json_array();
    for (size_t i = c.conv_from; i < n; i++)
      json_array_append(cv, json_array_get(c.cv.msgs, i));
    conv = json_dumps(cv, JSON_COMPACT);
    items = json_dumps(c.items, JSON_COMPACT);
    json_decref(cv);
    if (!conv || !items) rc = fe_conv_oom(err);
  }
  json_decref(req); /* (and c.cv.msgs) */
  if (!rc) {
    rc = fe_api_parse_request(FE_API_CHAT, js, strlen(js), cfg, out, err);
    if (rc) rename_param(err->param, sizeof(err->param), c.cv.origin, n);
    for (size_t i = 0; !rc && i < out->n_images; i++) /* the media's errors come later */
      rename_param(out->images[i].param, sizeof(out->images[i].param), c.cv.origin, n);
    for (struct fe_api_grammar_check *g = rc ? NULL : out->checks; g; g = g->next)
      rename_param(g->param, sizeof(g->param), c.cv.origin, n); /* and the grammars' */
    if (!rc) rename_param(out->grammar_param, sizeof(out->grammar_param), c.cv.origin, n);
  }
  free(js);
  if (!rc) { /* truncation "auto": the oldest turns go until the chat fits */
    const char *tr = json_string_value(json_object_get(b, "truncation"));
    out->truncate_turns = tr && !strcmp(tr, "auto");
  }
  if (!rc) {
    json_t *e = echo_of(b, out, store != NULL);
    char *es = e ? json_dumps(e, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(e);
    out->responses = es ? cm_arena_strndup(&out->arena, es, strlen(es)) : NULL;
    free(es);
    if (store) {
      out->store = store;
      out->responses_conv = cm_arena_strndup(&out->arena, conv, strlen(conv));
      out->responses_input = cm_arena_strndup(&out->arena, items, strlen(items));
    }
    if (!out->responses || (store && (!out->responses_conv || !out->responses_input))) {
      fe_api_request_free(out);
      rc = fe_conv_oom(err);
    }
  }
  free(conv);
  free(items);
  fe_conv_free(&c.cv);
  json_decref(c.items);
  json_decref(b);
  return rc;
}
