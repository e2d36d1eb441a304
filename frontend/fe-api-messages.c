/* fe-api-messages.c — POST /v1/messages and /v1/messages/count_tokens
 * (Anthropic's Messages API, as vLLM and llama.cpp's server take it): the
 * request turned into the chat request underneath it (fe-api.h). The answer's
 * content blocks and stream events are fe-messages.c's. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "frontend/fe-api-conv.h"
#include "frontend/fe-api.h"

#define MAX_MESSAGES 4096 /* messages; the chat parse caps the rest */

struct mctx {
  struct fe_conv cv;  /* the chat messages, each with its origin ("messages[3]") */
  json_t *parts;      /* a user turn's text and image parts not yet pushed */
  json_t *images;     /* each image block, "messages[2].content[1]", in the chat request's order */
  const char *format; /* the field the response_format came from */
};

/* The user turn's pending parts, as one user message from `from`. */
static int flush_user(struct mctx *c, const char *from) {
  if (!json_array_size(c->parts)) return 0;
  json_t *parts = c->parts;
  if (!(c->parts = json_array())) {
    json_decref(parts);
    return fe_conv_oom(c->cv.err);
  }
  return fe_conv_push(&c->cv, json_pack("{s:s, s:o}", "role", "user", "content", parts), from);
}

/* Adds part x (taken) to the pending user turn; an image's block is `from`. */
static int add_part(struct mctx *c, json_t *x, const char *from) {
  if (!x || json_array_append_new(c->parts, x)) return fe_conv_oom(c->cv.err);
  if (from && json_array_append_new(c->images, json_string(from))) return fe_conv_oom(c->cv.err);
  return 0;
}

/* An image block's source as chat's image_url part (new); NULL with err set. */
static json_t *image_part(struct mctx *c, json_t *blk, const char *pp) {
  json_t *src = json_object_get(blk, "source");
  const char *ty = json_string_value(json_object_get(src, "type"));
  char sp[128];
  snprintf(sp, sizeof(sp), "%s.source", pp);
  if (ty && !strcmp(ty, "base64")) {
    const char *mt = json_string_value(json_object_get(src, "media_type"));
    json_t *data = json_object_get(src, "data");
    if (!mt || !json_is_string(data)) {
      fe_conv_fail(c->cv.err, sp, "'%s' needs a string 'media_type' and base64 'data'", sp);
      return NULL;
    }
    size_t ml = strlen(mt), dl = json_string_length(data);
    char *url = malloc(ml + dl + 16);
    if (!url) {
      fe_conv_oom(c->cv.err);
      return NULL;
    }
    int n = snprintf(url, ml + 16, "data:%s;base64,", mt);
    memcpy(url + n, json_string_value(data), dl);
    json_t *p =
        json_pack("{s:s, s:{s:s%}}", "type", "image_url", "image_url", "url", url, (size_t)n + dl);
    free(url);
    if (!p) fe_conv_oom(c->cv.err);
    return p;
  }
  if (ty && !strcmp(ty, "url")) {
    json_t *url = json_object_get(src, "url");
    if (!json_is_string(url)) {
      fe_conv_fail(c->cv.err, sp, "'%s' needs a string 'url'", sp);
      return NULL;
    }
    json_t *p = json_pack("{s:s, s:{s:O}}", "type", "image_url", "image_url", "url", url);
    if (!p) fe_conv_oom(c->cv.err);
    return p;
  }
  fe_conv_fail(
      c->cv.err, sp,
      "'%s.type' must be base64 or url (files are not served here: send the image's bytes)", sp);
  return NULL;
}

/* A tool_result block's content (a string, or text and image blocks) as one
 * string (new), its texts a line apart; its images go to the pending user turn,
 * which follows the tool messages (as vLLM puts them). */
static json_t *result_text(struct mctx *c, json_t *v, const char *pp) {
  if (!v || json_is_null(v)) return json_string("");
  if (json_is_string(v)) return json_copy(v);
  char cp[160];
  snprintf(cp, sizeof(cp), "%s.content", pp);
  if (!json_is_array(v)) {
    fe_conv_fail(c->cv.err, cp, "'%s' must be a string or a list of text blocks", cp);
    return NULL;
  }
  size_t total = 0, k;
  json_t *b;
  json_array_foreach(v, k, b) {
    const char *t = json_string_value(json_object_get(b, "type"));
    char bp[192];
    snprintf(bp, sizeof(bp), "%s[%zu]", cp, k);
    if (t && !strcmp(t, "image")) {
      json_t *x = image_part(c, b, bp);
      if (!x || add_part(c, x, bp)) return NULL;
      continue;
    }
    if (!t || strcmp(t, "text") || !json_is_string(json_object_get(b, "text"))) {
      fe_conv_fail(c->cv.err, bp, "'%s' must be a text or an image block (type '%.40s')", bp,
                   t ? t : "missing");
      return NULL;
    }
    total += json_string_length(json_object_get(b, "text")) + 1;
  }
  char *s = malloc(total + 1);
  if (!s) {
    fe_conv_oom(c->cv.err);
    return NULL;
  }
  size_t o = 0;
  json_array_foreach(v, k, b) { /* the blocks' texts, a line apart */
    json_t *t = json_object_get(b, "text");
    if (!json_is_string(t)) continue; /* an image */
    if (o) s[o++] = '\n';
    memcpy(s + o, json_string_value(t), json_string_length(t));
    o += json_string_length(t);
  }
  json_t *r = json_stringn(s, o);
  free(s);
  if (!r) fe_conv_oom(c->cv.err);
  return r;
}

/* A user message's content: each tool_result block a tool message, in their
 * order, then one user turn of the results' images and the text and image blocks
 * (vLLM's order: the results answer the calls of the turn before, and a turn
 * between them would part them). */
static int user_message(struct mctx *c, json_t *content, const char *param) {
  if (json_is_string(content))
    return fe_conv_push(&c->cv, json_pack("{s:s, s:O}", "role", "user", "content", content), param);
  size_t k;
  json_t *blk;
  json_array_foreach(content, k, blk) { /* the results */
    char pp[128], ip[160];
    snprintf(pp, sizeof(pp), "%s.content[%zu]", param, k);
    const char *t = json_string_value(json_object_get(blk, "type"));
    if (!t) return fe_conv_fail(c->cv.err, pp, "'%s' must be an object with a 'type'", pp);
    if (strcmp(t, "tool_result")) continue;
    json_t *id = json_object_get(blk, "tool_use_id");
    snprintf(ip, sizeof(ip), "%s.tool_use_id", pp);
    if (!json_is_string(id)) return fe_conv_fail(c->cv.err, ip, "'%s' must be a string", ip);
    json_t *text = result_text(c, json_object_get(blk, "content"), pp);
    if (!text) return CM_ERR_INVAL;
    int rc = fe_conv_push(
        &c->cv, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content", text),
        pp);
    if (rc) return rc;
  }
  json_array_foreach(content, k, blk) { /* the rest */
    char pp[128];
    snprintf(pp, sizeof(pp), "%s.content[%zu]", param, k);
    const char *t = json_string_value(json_object_get(blk, "type"));
    int rc;
    if (!strcmp(t, "tool_result")) {
      continue;
    } else if (!strcmp(t, "text")) {
      json_t *text = json_object_get(blk, "text");
      if (!json_is_string(text))
        return fe_conv_fail(c->cv.err, pp, "'%s' needs a string 'text'", pp);
      rc = add_part(c, json_pack("{s:s, s:O}", "type", "text", "text", text), NULL);
    } else if (!strcmp(t, "image")) {
      json_t *x = image_part(c, blk, pp);
      rc = x ? add_part(c, x, pp) : CM_ERR_INVAL;
    } else {
      rc = fe_conv_fail(
          c->cv.err, pp,
          "content block type '%.40s' is not supported in a user turn here (text, image, "
          "tool_result)",
          t);
    }
    if (rc) return rc;
  }
  return flush_user(c, param);
}

/* An assistant message's content: its text blocks joined, tool_use blocks as
 * tool_calls; thinking blocks are dropped, as Gemma's chat templates drop earlier
 * thoughts. */
static int assistant_message(struct mctx *c, json_t *content, const char *param) {
  if (json_is_string(content))
    return fe_conv_push(&c->cv, json_pack("{s:s, s:O}", "role", "assistant", "content", content),
                        param);
  json_t *calls = json_array();
  struct {
    char *s;
    size_t n;
  } text = {NULL, 0};
  int rc = calls ? 0 : fe_conv_oom(c->cv.err);
  size_t k;
  json_t *blk;
  json_array_foreach(content, k, blk) {
    if (rc) break;
    char pp[128];
    snprintf(pp, sizeof(pp), "%s.content[%zu]", param, k);
    const char *t = json_string_value(json_object_get(blk, "type"));
    if (!t) {
      rc = fe_conv_fail(c->cv.err, pp, "'%s' must be an object with a 'type'", pp);
    } else if (!strcmp(t, "text")) {
      json_t *tx = json_object_get(blk, "text");
      if (!json_is_string(tx)) {
        rc = fe_conv_fail(c->cv.err, pp, "'%s' needs a string 'text'", pp);
        break;
      }
      size_t n = json_string_length(tx);
      char *s = realloc(text.s, text.n + n + 1);
      if (!s) {
        rc = fe_conv_oom(c->cv.err);
        break;
      }
      memcpy(s + text.n, json_string_value(tx), n);
      text.s = s;
      text.n += n;
    } else if (!strcmp(t, "tool_use")) {
      json_t *id = json_object_get(blk, "id"), *name = json_object_get(blk, "name");
      json_t *input = json_object_get(blk, "input");
      const char *miss = !json_is_string(id)      ? "id"
                         : !json_is_string(name)  ? "name"
                         : !json_is_object(input) ? "input"
                                                  : NULL;
      if (miss) {
        char mp[160];
        snprintf(mp, sizeof(mp), "%s.%s", pp, miss);
        rc = fe_conv_fail(c->cv.err, mp, "'%s' must be %s", mp,
                          strcmp(miss, "input") ? "a string" : "an object");
        break;
      }
      char *args = json_dumps(input, JSON_COMPACT | JSON_PRESERVE_ORDER);
      json_t *call = args ? json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function",
                                      "function", "name", name, "arguments", args)
                          : NULL;
      free(args);
      if (!call || json_array_append_new(calls, call)) rc = fe_conv_oom(c->cv.err);
    } else if (strcmp(t, "thinking") && strcmp(t, "redacted_thinking")) {
      rc = fe_conv_fail(
          c->cv.err, pp,
          "content block type '%.40s' is not supported in an assistant turn here (text, "
          "tool_use, thinking)",
          t);
    }
  }
  if (!rc) {
    json_t *m =
        json_pack("{s:s, s:o}", "role", "assistant", "content",
                  text.n || !json_array_size(calls) ? json_stringn(text.s ? text.s : "", text.n)
                                                    : json_null());
    if (m && json_array_size(calls)) json_object_set(m, "tool_calls", calls);
    rc = fe_conv_push(&c->cv, m, param);
  }
  free(text.s);
  json_decref(calls);
  return rc;
}

/* system: a string, or text blocks (joined, as vLLM and llama.cpp's server join
 * them), as a system turn. */
static int system_of(struct mctx *c, json_t *sys) {
  if (!sys || json_is_null(sys)) return 0;
  if (json_is_string(sys))
    return fe_conv_push(&c->cv, json_pack("{s:s, s:O}", "role", "system", "content", sys),
                        "system");
  if (!json_is_array(sys))
    return fe_conv_fail(c->cv.err, "system", "'system' must be a string or a list of text blocks");
  json_t *text = json_string(""), *blk;
  size_t k;
  json_array_foreach(sys, k, blk) {
    json_t *tx = json_object_get(blk, "text");
    const char *t = json_string_value(json_object_get(blk, "type"));
    if (!t || strcmp(t, "text") || !json_is_string(tx)) {
      char pp[64];
      snprintf(pp, sizeof(pp), "system[%zu]", k);
      json_decref(text);
      return fe_conv_fail(c->cv.err, pp,
                          "'%s' must be a text block ({\"type\": \"text\", \"text\": ...})", pp);
    }
    size_t a = json_string_length(text), b = json_string_length(tx);
    char *s = malloc(a + b + 1);
    if (!s) {
      json_decref(text);
      return fe_conv_oom(c->cv.err);
    }
    memcpy(s, json_string_value(text), a);
    memcpy(s + a, json_string_value(tx), b);
    json_t *nt = json_stringn(s, a + b);
    free(s);
    json_decref(text);
    if (!(text = nt)) return fe_conv_oom(c->cv.err);
  }
  return fe_conv_push(&c->cv, json_pack("{s:s, s:o}", "role", "system", "content", text), "system");
}

static int messages_of(struct mctx *c, json_t *msgs) {
  if (!json_is_array(msgs) || !json_array_size(msgs))
    return fe_conv_fail(c->cv.err, "messages", "'messages' must be a non-empty list");
  if (json_array_size(msgs) > MAX_MESSAGES)
    return fe_conv_fail(c->cv.err, "messages", "%zu messages; at most %d", json_array_size(msgs),
                        MAX_MESSAGES);
  size_t i;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    char param[32], pp[48];
    snprintf(param, sizeof(param), "messages[%zu]", i);
    if (!json_is_object(m)) return fe_conv_fail(c->cv.err, param, "'%s' must be an object", param);
    const char *role = json_string_value(json_object_get(m, "role"));
    snprintf(pp, sizeof(pp), "%s.role", param);
    if (!role || (strcmp(role, "user") && strcmp(role, "assistant")))
      return fe_conv_fail(
          c->cv.err, pp,
          "'%s' must be user or assistant (the system prompt is the top-level 'system')", pp);
    json_t *content = json_object_get(m, "content");
    snprintf(pp, sizeof(pp), "%s.content", param);
    if (!json_is_string(content) && !json_is_array(content))
      return fe_conv_fail(c->cv.err, pp, "'%s' must be a string or a list of content blocks", pp);
    int rc = strcmp(role, "user") ? assistant_message(c, content, param)
                                  : user_message(c, content, param);
    if (rc) return rc;
  }
  return 0;
}

/* tools: client tools ({"name", "description", "input_schema"}, "type" absent or
 * "custom") as chat's function tools. */
static int tools_of(struct fe_api_error *err, json_t *tools, json_t **out) {
  *out = NULL;
  if (!tools || json_is_null(tools)) return 0;
  if (!json_is_array(tools)) return fe_conv_fail(err, "tools", "'tools' must be a list");
  json_t *a = json_array();
  size_t i;
  json_t *t;
  json_array_foreach(tools, i, t) {
    char pp[64];
    snprintf(pp, sizeof(pp), "tools[%zu]", i);
    if (!json_is_object(t)) {
      json_decref(a);
      return fe_conv_fail(err, pp, "'%s' must be an object (name, description, input_schema)", pp);
    }
    const char *ty = json_string_value(json_object_get(t, "type"));
    if (fe_conv_given(t, "type") && (!ty || strcmp(ty, "custom"))) {
      json_decref(a);
      return fe_conv_fail(
          err, pp,
          "'%s' is a '%.48s' tool: only custom tools (name, description, input_schema) "
          "are served here, not Anthropic's server or client tools",
          pp, ty ? ty : "?");
    }
    static const char *const keys[][2] = {{"name", "name"},
                                          {"description", "description"},
                                          {"input_schema", "parameters"},
                                          {"strict", "strict"}};
    json_t *fn = json_object();
    for (size_t k = 0; fn && k < sizeof(keys) / sizeof(keys[0]); k++)
      if (json_object_get(t, keys[k][0]) &&
          json_object_set(fn, keys[k][1], json_object_get(t, keys[k][0]))) {
        json_decref(fn);
        fn = NULL;
      }
    if (!fn || !a ||
        json_array_append_new(a, json_pack("{s:s, s:o}", "type", "function", "function", fn))) {
      json_decref(a);
      return fe_conv_oom(err);
    }
  }
  *out = a;
  return 0;
}

/* tool_choice: {"type": auto | any | tool (with "name") | none}, and
 * disable_parallel_tool_use; as chat's tool_choice and parallel_tool_calls. */
static int tool_choice_of(struct fe_api_error *err, json_t *tc, json_t *req) {
  if (!tc || json_is_null(tc)) return 0;
  const char *ty = json_string_value(json_object_get(tc, "type"));
  json_t *name = json_object_get(tc, "name"),
         *dp = json_object_get(tc, "disable_parallel_tool_use");
  if (!json_is_object(tc) || !ty ||
      (strcmp(ty, "auto") && strcmp(ty, "any") && strcmp(ty, "tool") && strcmp(ty, "none")))
    return fe_conv_fail(
        err, "tool_choice",
        "'tool_choice' must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": "
        "\"tool\", \"name\": ...} or {\"type\": \"none\"}");
  if (!strcmp(ty, "tool") && !json_is_string(name))
    return fe_conv_fail(err, "tool_choice.name", "'tool_choice.name' must be a string");
  if (dp && !json_is_boolean(dp))
    return fe_conv_fail(err, "tool_choice.disable_parallel_tool_use",
                        "'tool_choice.disable_parallel_tool_use' must be a boolean");
  json_t *v = !strcmp(ty, "tool")
                  ? json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name)
                  : json_string(!strcmp(ty, "any") ? "required" : ty);
  json_object_set_new(req, "tool_choice", v);
  if (json_is_true(dp)) json_object_set_new(req, "parallel_tool_calls", json_false());
  return 0;
}

/* thinking: {"type": "enabled", "budget_tokens": N} or {"type": "disabled"}: the
 * chat template's enable_thinking, over chat_template_kwargs'. */
static int thinking_of(struct fe_api_error *err, json_t *th, json_t *req) {
  if (!th || json_is_null(th)) return 0;
  const char *ty = json_string_value(json_object_get(th, "type"));
  if (!json_is_object(th) || !ty || (strcmp(ty, "enabled") && strcmp(ty, "disabled")))
    return fe_conv_fail(
        err, "thinking",
        "'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": "
        "\"disabled\"}");
  json_t *bt = json_object_get(th, "budget_tokens");
  if (!strcmp(ty, "enabled") && (!json_is_integer(bt) || json_integer_value(bt) < 1024))
    return fe_conv_fail(err, "thinking.budget_tokens",
                        "'thinking.budget_tokens' must be an integer of at least 1024");
  json_t *kw = json_object_get(req, "chat_template_kwargs");
  if (kw && !json_is_null(kw) && !json_is_object(kw))
    return fe_conv_fail(err, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
  json_t *nk = json_is_object(kw) ? json_deep_copy(kw) : json_object();
  if (!nk) return fe_conv_oom(err);
  json_object_set_new(nk, "enable_thinking", json_boolean(!strcmp(ty, "enabled")));
  json_object_set_new(req, "chat_template_kwargs", nk);
  return 0;
}

/* output_format, or output_config.format (structured outputs): {"type":
 * "json_schema", "schema"} as chat's response_format. */
static int format_of(struct mctx *c, json_t *f, json_t *req, const char *param) {
  struct fe_api_error *err = c->cv.err;
  if (!f || json_is_null(f)) return 0;
  c->format = param;
  const char *ty = json_string_value(json_object_get(f, "type"));
  json_t *schema = json_object_get(f, "schema");
  if (json_object_get(req, "response_format"))
    return fe_conv_fail(err, param, "'%s': give output_format or output_config.format, not both",
                        param);
  if (!json_is_object(f) || !ty || strcmp(ty, "json_schema") || !json_is_object(schema))
    return fe_conv_fail(err, param, "'%s' must be {\"type\": \"json_schema\", \"schema\": {...}}",
                        param);
  json_object_set_new(req, "response_format",
                      json_pack("{s:s, s:{s:s, s:O}}", "type", "json_schema", "json_schema", "name",
                                "output", "schema", schema));
  return 0;
}

/* vLLM's sampling fields beyond Anthropic's, taken as chat takes them */
/* clang-format off */
static const char *const passed[] = {
    "temperature", "top_p", "top_k", "min_p", "seed", "stop_token_ids", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "logit_bias", "min_tokens", "ignore_eos",
    "priority", "cache_salt", "mm_processor_kwargs", "chat_template_kwargs",
    "skip_special_tokens", "bad_words", "structured_outputs", "stream",
};
/* clang-format on */

/* Fields that ask for what this server does not give. */
static int refused(struct fe_api_error *err, json_t *b) {
  static const char *const fields[] = {"container", "mcp_servers", "context_management"};
  for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
    if (fe_conv_given(b, fields[i]))
      return fe_conv_fail(err, fields[i], "'%s' is not supported by this server", fields[i]);
  json_t *md = json_object_get(b, "metadata");
  if (fe_conv_given(b, "metadata") && !json_is_object(md))
    return fe_conv_fail(err, "metadata", "'metadata' must be an object");
  json_t *uid = json_object_get(md, "user_id");
  if (uid && !json_is_null(uid) && !json_is_string(uid))
    return fe_conv_fail(err, "metadata.user_id", "'metadata.user_id' must be a string");
  if (fe_conv_given(b, "service_tier") && !json_is_string(json_object_get(b, "service_tier")))
    return fe_conv_fail(err, "service_tier", "'service_tier' must be a string");
  json_t *ss = json_object_get(b, "stop_sequences");
  if (fe_conv_given(b, "stop_sequences") && !json_is_array(ss))
    return fe_conv_fail(err, "stop_sequences", "'stop_sequences' must be a list of strings");
  return 0;
}

/* The chat request of body b (new). */
static int to_chat(struct mctx *c, json_t *b, int count, json_t **out) {
  int rc = refused(c->cv.err, b);
  if (rc) return rc;
  json_t *req = json_object();
  c->cv.msgs = json_array();
  if (!req || !c->cv.msgs || json_object_set_new(req, "messages", c->cv.msgs)) {
    json_decref(req);
    return fe_conv_oom(c->cv.err);
  }
  *out = req;
  if ((rc = system_of(c, json_object_get(b, "system")))) return rc;
  if ((rc = messages_of(c, json_object_get(b, "messages")))) return rc;
  if (!json_is_string(json_object_get(b, "model")))
    return fe_conv_fail(c->cv.err, "model", "'model' (a string) is required");
  json_object_set(req, "model", json_object_get(b, "model"));
  for (size_t k = 0; !count && k < sizeof(passed) / sizeof(passed[0]); k++) {
    json_t *v = json_object_get(b, passed[k]);
    if (v) json_object_set(req, passed[k], v);
  }
  if (count && json_object_get(b, "chat_template_kwargs"))
    json_object_set(req, "chat_template_kwargs", json_object_get(b, "chat_template_kwargs"));
  if (!count) {
    json_t *mt = json_object_get(b, "max_tokens");
    if (!mt || json_is_null(mt))
      return fe_conv_fail(c->cv.err, "max_tokens", "'max_tokens' is required");
    json_object_set(req, "max_tokens", mt);
    json_t *ss = json_object_get(b, "stop_sequences");
    if (json_array_size(ss)) json_object_set(req, "stop", ss);
  }
  json_t *x;
  if ((rc = tools_of(c->cv.err, json_object_get(b, "tools"), &x))) return rc;
  if (x) json_object_set_new(req, "tools", x);
  if ((rc = tool_choice_of(c->cv.err, json_object_get(b, "tool_choice"), req))) return rc;
  if ((rc = thinking_of(c->cv.err, json_object_get(b, "thinking"), req))) return rc;
  if (!count && (rc = format_of(c, json_object_get(b, "output_format"), req, "output_format")))
    return rc;
  json_t *oc = json_object_get(b, "output_config");
  if (fe_conv_given(b, "output_config")) {
    const char *key;
    json_t *v;
    if (!json_is_object(oc))
      return fe_conv_fail(c->cv.err, "output_config", "'output_config' must be an object");
    json_object_foreach(oc, key, v) {
      if (strcmp(key, "format"))
        return fe_conv_fail(c->cv.err, "output_config",
                            "'output_config.%.40s' is not supported by this server (format is)",
                            key);
    }
    if (!count && (rc = format_of(c, json_object_get(oc, "format"), req, "output_config.format")))
      return rc;
  }
  return 0;
}

/* A chat error's param in the Messages request's terms: messages[i] as the
 * message (or block) it came from, stop as stop_sequences, response_format as the
 * field it came from, a tool's function.parameters as its input_schema. */
static void rename_param(const struct mctx *c, char *param, size_t cap) {
  char out[sizeof(((struct fe_api_error *)0)->param)];
  if (!strcmp(param, "stop"))
    snprintf(out, sizeof(out), "stop_sequences");
  else if (!strncmp(param, "tools[", 6) && strstr(param, "].function.parameters"))
    snprintf(out, sizeof(out), "%.*sinput_schema%s",
             (int)(strstr(param, "].function.") - param + 2), param,
             strstr(param, "].function.parameters") + 21);
  else if (!strcmp(param, "tool_choice.function.name"))
    snprintf(out, sizeof(out), "tool_choice.name");
  else if (!strcmp(param, "parallel_tool_calls"))
    snprintf(out, sizeof(out), "tool_choice.disable_parallel_tool_use");
  else if (!fe_conv_rename(param, c->cv.origin, json_array_size(c->cv.msgs), ".tool_use_id",
                           c->format ? c->format : "output_format", out, sizeof(out)))
    return;
  snprintf(param, cap, "%s", out);
}

/* The chat parse's error in the Messages request's terms: its param, and the
 * param where the message names it. */
static void rename_error(const struct mctx *c, struct fe_api_error *err) {
  char was[sizeof(err->param)], msg[sizeof(err->message)];
  snprintf(was, sizeof(was), "%s", err->param);
  rename_param(c, err->param, sizeof(err->param));
  if (!was[0] || !strcmp(was, err->param)) return;
  size_t wl = strlen(was), o = 0;
  for (const char *p = err->message; *p && o + 1 < sizeof(msg);) {
    if (!strncmp(p, was, wl) && (p[wl] == '\'' || p[wl] == ':')) {
      o += (size_t)snprintf(msg + o, sizeof(msg) - o, "%s", err->param);
      p += wl;
    } else {
      msg[o++] = *p++;
    }
  }
  msg[o < sizeof(msg) ? o : sizeof(msg) - 1] = 0;
  snprintf(err->message, sizeof(err->message), "%s", msg);
}

int fe_api_parse_messages(int count, const char *body, size_t len, const struct fe_api_config *cfg,
                          struct fe_api_request *out, struct fe_api_error *err) {
  memset(out, 0, sizeof(*out));
  memset(err, 0, sizeof(*err));
  enum fe_api_kind kind = count ? FE_API_TOKENIZE : FE_API_CHAT;
  json_t *b;
  int brc = fe_conv_body(kind, body, len, cfg, out, err, &b);
  if (brc) return brc;
  struct mctx c = {{err}};
  c.parts = json_array();
  c.images = json_array();
  json_t *req = NULL;
  int rc = c.parts && c.images ? to_chat(&c, b, count, &req) : fe_conv_oom(err);
  char *js = rc ? NULL : json_dumps(req, JSON_COMPACT);
  if (!rc && !js) rc = fe_conv_oom(err);
  if (!rc) {
    rc = fe_api_parse_request(kind, js, strlen(js), cfg, out, err);
    if (rc) rename_error(&c, err);
    /* the media's errors come later: the k-th image is the k-th image block (the
     * chat parse names it where the tool turns' rewriting put it) */
    for (size_t i = 0; !rc && i < out->n_images; i++) {
      const char *blk = json_string_value(json_array_get(c.images, i));
      if (blk) snprintf(out->images[i].param, sizeof(out->images[i].param), "%s.source", blk);
    }
    for (struct fe_api_grammar_check *g = rc ? NULL : out->checks; g; g = g->next)
      rename_param(&c, g->param, sizeof(g->param)); /* and the grammars' */
    if (!rc) rename_param(&c, out->grammar_param, sizeof(out->grammar_param));
  }
  json_decref(req); /* (and c.cv.msgs) */
  json_decref(c.parts);
  json_decref(c.images);
  free(js);
  if (!rc) out->anthropic = count ? FE_API_ANTHROPIC_COUNT : FE_API_ANTHROPIC;
  fe_conv_free(&c.cv);
  json_decref(b);
  return rc;
}
