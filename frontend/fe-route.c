/* fe-route.c — routes, auth and the engine-free answers (see fe-route.h). */
#include "frontend/fe-route.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-hash.h"
#include "common/cm-hex.h"
#include "common/cm-log.h"
#include "common/cm-time.h"
#include "frontend/fe-api-error.h"
#include "frontend/fe-api-resp.h"
#include "frontend/fe-cors.h"
#include "frontend/fe-http-buf.h"
#include "frontend/fe-rstore.h"
#include "lmserve-config.h"
#include "model/md-config.h"
#include "proto/pr-msg.h"

#define TAG                    "fe-route"
#define MAX_KEYS 256 /* API keys */
#define FE_ROUTE_MAX_RUN_LORAS 256 /* run-time LoRA adapters served at once */

struct fe_router {
  struct fe_route_config cfg;
  char *api_key; /* the keys' text, each key NUL-terminated in place */
  char *keys[MAX_KEYS];
  int n_keys; /* 0: no auth */
  char *model_name;
  struct fe_engine_hooks hooks;
  struct fe_metrics *metrics;
  struct fe_metric_ids ids;
  int64_t created;       /* GET /v1/models: seconds since the epoch */
  struct fe_buf scratch; /* /metrics and other bodies */
  struct fe_cors *cors;
  const struct fe_http_request *cur; /* the request being routed (its headers) */
  struct fe_rstore *store;           /* the Responses API's (NULL: off) */
  /* LoRA adapters loaded at run time (served as models), and the loads and unloads
   * the engine works on */
  struct fe_api_lora run_loras[FE_ROUTE_MAX_RUN_LORAS];
  int n_run_loras;
  struct lora_op *lora_ops;
};

/* A run-time LoRA load or unload the engine works on. */
struct lora_op {
  struct fe_router *r;
  struct fe_conn *c; /* NULL once the client left */
  int load;
  char *name, *path;
  uint64_t uid;
  struct lora_op *next;
};

typedef void (*route_fn)(struct fe_router *r, struct fe_conn *c, const char *body, size_t len);

struct route {
  const char *method;
  const char *path;
  route_fn fn;
  int open; /* needs no API key */
  enum fe_api_kind kind;
};

static void count_status(struct fe_router *r, int status) {
  fe_metrics_inc(r->metrics, r->ids.http_requests, 1);
  if (status >= 400 && status < 500) fe_metrics_inc(r->metrics, r->ids.http_client_errors, 1);
  if (status >= 500) fe_metrics_inc(r->metrics, r->ids.http_server_errors, 1);
}

static void reply(struct fe_router *r, struct fe_conn *c, int status, const char *ctype,
                  const char *extra, const char *body, size_t len) {
  count_status(r, status);
  fe_conn_respond(c, status, ctype, extra, body, len);
}

static void reply_error(struct fe_router *r, struct fe_conn *c, int status, const char *msg,
                        const char *param) {
  count_status(r, status);
  fe_conn_respond_error(c, status, msg, param);
}

static void on_health(struct fe_router *r, struct fe_conn *c, const char *body, size_t len) {
  if (r->hooks.ready && r->hooks.ready(r->hooks.ud))
    reply(r, c, 200, "application/json", NULL, "", 0);
  else
    reply_error(r, c, 503, "engine not ready", NULL);
}

static void on_version(struct fe_router *r, struct fe_conn *c, const char *body, size_t len) {
  static const char version[] = "{\"version\":\"" LMSERVE_VERSION "\"}";
  reply(r, c, 200, "application/json", NULL, version, sizeof(version) - 1);
}

/* The context length in force: the engine's when it knows one. */
static int64_t max_model_len(struct fe_router *r) {
  int64_t n = r->hooks.max_model_len ? r->hooks.max_model_len(r->hooks.ud) : 0;
  return n > 0 ? n : r->cfg.max_model_len;
}

/* One model object of /v1/models (vLLM's fields): id, served under r's name, or a LoRA
 * adapter of it (adapter: its path, the object's root; its parent is the model). */
static void model_object(struct fe_router *r, struct fe_buf *b, const char *id,
                         const char *adapter) {
  const char *root = adapter ? adapter : r->model_name;
  const int lora = adapter != NULL;
  fe_buf_puts(b, "{\"id\":");
  fe_buf_json_str(b, id, strlen(id));
  fe_buf_puts(b, ",\"object\":\"model\",\"created\":");
  fe_buf_i64(b, r->created);
  fe_buf_puts(b, ",\"owned_by\":\"lmserve\",\"root\":");
  fe_buf_json_str(b, root, strlen(root));
  fe_buf_puts(b, ",\"parent\":");
  if (lora)
    fe_buf_json_str(b, r->model_name, strlen(r->model_name));
  else
    fe_buf_puts(b, "null");
  fe_buf_puts(b, ",\"max_model_len\":");
  fe_buf_i64(b, max_model_len(r));
  fe_buf_puts(b, ",\"permission\":[]}");
}

static void reply_json(struct fe_router *r, struct fe_conn *c, struct fe_buf *b) {
  if (b->err)
    reply_error(r, c, 500, "out of memory", NULL);
  else
    reply(r, c, 200, "application/json", NULL, b->data, b->len);
}

/* GET /props (llama.cpp's): the defaults a request gets, the context, the model's
 * names and what its checkpoint gives (the engine's part). */
static void on_props(struct fe_router *r, struct fe_conn *c, const char *body, size_t len) {
  const struct md_sampling *d = r->cfg.defaults;
  const unsigned has = d ? d->has : 0;
  struct fe_buf *b = &r->scratch;
  fe_buf_reset(b);
  fe_buf_puts(b, "{\"default_generation_settings\":{\"n_ctx\":");
  fe_buf_i64(b, max_model_len(r));
  fe_buf_puts(b, ",\"params\":{\"n_predict\":");
  fe_buf_i64(b, has & MD_SAMPLE_MAX_TOKENS ? d->max_tokens : -1);
  fe_buf_printf(b,
                ",\"seed\":-1,\"temperature\":%.17g,\"top_k\":%d,\"top_p\":%.17g,\"min_p\":%.17g,"
                "\"repeat_penalty\":%.17g,\"presence_penalty\":0,\"frequency_penalty\":0}},",
                has & MD_SAMPLE_TEMPERATURE ? d->temperature : 1.0,
                has & MD_SAMPLE_TOP_K ? (int)d->top_k : -1, has & MD_SAMPLE_TOP_P ? d->top_p : 1.0,
                has & MD_SAMPLE_MIN_P ? d->min_p : 0.0,
                has & MD_SAMPLE_REPETITION_PENALTY ? d->repetition_penalty : 1.0);
  fe_buf_puts(b, "\"model_alias\":");
  fe_buf_json_str(b, r->model_name, strlen(r->model_name));
  fe_buf_puts(b, ",");
  if (r->hooks.props) r->hooks.props(r->hooks.ud, b);
  fe_buf_puts(b, "\"build_info\":\"lmserve " LMSERVE_VERSION "\"}");
  reply_json(r, c, b);
}

static void on_models(struct fe_router *r, struct fe_conn *c, const char *body, size_t len) {
  struct fe_buf *b = &r->scratch;
  fe_buf_reset(b);
  fe_buf_puts(b, "{\"object\":\"list\",\"data\":[");
  for (int i = -1; i < r->cfg.n_aliases; i++) { /* the name, then its aliases */
    if (i >= 0) fe_buf_puts(b, ",");
    model_object(r, b, i < 0 ? r->model_name : r->cfg.aliases[i], NULL);
  }
  for (int i = 0; i < r->cfg.n_loras; i++) { /* then the adapters */
    fe_buf_puts(b, ",");
    model_object(r, b, r->cfg.lora_names[i], r->cfg.lora_paths[i]);
  }
  for (int i = 0; i < r->n_run_loras; i++) { /* and those loaded since */
    fe_buf_puts(b, ",");
    model_object(r, b, r->run_loras[i].name, r->run_loras[i].path);
  }
  fe_buf_puts(b, "]}");
  reply_json(r, c, b);
}

/* GET /v1/models/{model} (OpenAI's retrieve): the model object of a name it is served
 * under (percent-decoded: clients encode a '/' in the name), else a 404. */
static void on_model(struct fe_router *r, struct fe_conn *c, const char *body, size_t len) {
  static const char pre[] = "/v1/models/";
  const char *p = r->cur->path + sizeof(pre) - 1;
  size_t n = r->cur->path_len - (sizeof(pre) - 1), k = 0;
  char id[512];
  for (size_t i = 0; i < n && k + 1 < sizeof(id); i++, k++) {
    int hi, lo;
    if (p[i] == '%' && i + 2 < n && (hi = cm_hex_digit(p[i + 1])) >= 0 &&
        (lo = cm_hex_digit(p[i + 2])) >= 0) {
      id[k] = (char)(hi << 4 | lo);
      i += 2;
    } else {
      id[k] = p[i];
    }
  }
  id[k] = 0;
  int whole = k < sizeof(id) - 1 && k == strlen(id); /* not cut, no NUL decoded */
  int served = whole && !strcmp(id, r->model_name);
  for (int i = 0; !served && whole && i < r->cfg.n_aliases; i++)
    served = !strcmp(id, r->cfg.aliases[i]);
  const char *adapter = NULL;
  for (int i = 0; !served && whole && i < r->cfg.n_loras; i++)
    if (!strcmp(id, r->cfg.lora_names[i])) served = 1, adapter = r->cfg.lora_paths[i];
  for (int i = 0; !served && whole && i < r->n_run_loras; i++)
    if (!strcmp(id, r->run_loras[i].name)) served = 1, adapter = r->run_loras[i].path;
  if (!served) {
    char msg[160];
    snprintf(msg, sizeof(msg), "The model '%.100s' does not exist.", id);
    reply_error(r, c, 404, msg, "model");
    return;
  }
  struct fe_buf *b = &r->scratch;
  fe_buf_reset(b);
  model_object(r, b, id, adapter);
  reply_json(r, c, b);
}

static void on_metrics(struct fe_router *r, struct fe_conn *c, const char *body, size_t len) {
  fe_buf_reset(&r->scratch);
  count_status(r, 200); /* counted before rendering so the answer includes itself */
  if (fe_metrics_render(r->metrics, &r->scratch) != 0) {
    fe_conn_respond_error(c, 500, "metrics too large to render", NULL);
    return;
  }
  fe_conn_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, r->scratch.data,
                  r->scratch.len);
}

static struct fe_api_config api_config(struct fe_router *r) {
  struct fe_api_config acfg = {r->model_name,
                               max_model_len(r),
                               r->hooks.model ? r->hooks.model(r->hooks.ud) : NULL,
                               r->cfg.default_template_kwargs,
                               r->cfg.defaults,
                               r->cfg.aliases,
                               r->cfg.n_aliases,
                               r->cfg.lora_names,
                               r->cfg.n_loras,
                               r->cfg.lora_sum,
                               r->store,
                               r->cfg.max_logprobs,
                               r->cfg.fcfs,
                               r->run_loras,
                               r->n_run_loras};
  return acfg;
}

/* The request's X-Request-Id into req->client_id (with --enable-request-id-headers
 * one made when it has none, and the answer's header): 0, or -1 after a 400. */
static int request_id(struct fe_router *r, struct fe_conn *c, struct fe_api_request *req) {
  const struct fe_http_header *h = r->cur ? fe_http_find_header(r->cur, "x-request-id") : NULL;
  char made[48];
  const char *v = h ? h->value : NULL;
  size_t n = h ? h->value_len : 0;
  int bad = h && (n == 0 || n > FE_API_MAX_REQUEST_ID);
  for (size_t i = 0; h && i < n; i++)
    bad |=
        !((v[i] >= 'a' && v[i] <= 'z') || (v[i] >= 'A' && v[i] <= 'Z') ||
          (v[i] >= '0' && v[i] <= '9') || v[i] == '.' || v[i] == '_' || v[i] == ':' || v[i] == '-');
  if (bad) {
    reply_error(r, c, 400,
                "X-Request-Id must be 1 to 128 characters of letters, digits, '.', '_', ':' "
                "and '-'",
                NULL);
    return -1;
  }
  if (!h && r->cfg.request_id_headers) {
    fe_api_make_id(made, sizeof(made), "");
    v = made;
    n = strlen(made);
  }
  if (!v) return 0;
  if (!(req->client_id = cm_arena_strndup(&req->arena, v, n))) {
    reply_error(r, c, 500, "out of memory", NULL);
    return -1;
  }
  if (r->cfg.request_id_headers) {
    char line[FE_API_MAX_REQUEST_ID + 20];
    snprintf(line, sizeof(line), "X-Request-Id: %s\r\n", req->client_id);
    fe_conn_add_headers(c, line);
  }
  return 0;
}

/* Hands a parsed request to the engine, which answers it (or answers why not). */
static void submit(struct fe_router *r, struct fe_conn *c, struct fe_api_request req) {
  const char *why = NULL;
  if (request_id(r, c, &req)) {
    fe_api_request_free(&req);
    return;
  }
  if (r->hooks.submit) {
    fe_metrics_inc(r->metrics, r->ids.http_requests, 1); /* the engine answers it */
    struct fe_api_request *owned = malloc(sizeof(*owned));
    int rc = CM_ERR_NOMEM;
    if (owned) {
      *owned = req;
      if ((rc = r->hooks.submit(r->hooks.ud, c, owned, &why)) == 0) return;
      fe_api_request_free(owned);
      free(owned);
    } else {
      fe_api_request_free(&req);
    }
    if (rc == CM_ERR_FULL) /* the queue is full: the client may retry shortly */
      fe_conn_respond_error_hdr(c, 429, why ? why : "too many requests", NULL,
                                "Retry-After: 1\r\n");
    else
      fe_conn_respond_error(c, 503, why ? why : "engine not ready", NULL);
    return;
  }
  fe_api_request_free(&req);
  reply_error(r, c, 503, "engine not ready", NULL);
}

/* A request of `kind` parsed and submitted; template_only: /apply-template's (a
 * /tokenize request that must have messages). */
static void on_engine_as(struct fe_router *r, struct fe_conn *c, const char *body, size_t len,
                         enum fe_api_kind kind, int template_only) {
  struct fe_api_config acfg = api_config(r);
  struct fe_api_request req;
  struct fe_api_error err;
  if (fe_api_parse_request(kind, body, len, &acfg, &req, &err) != 0) {
    reply_error(r, c, err.status, err.message, err.param[0] ? err.param : NULL);
    return;
  }
  if (template_only && !req.n_messages) {
    fe_api_request_free(&req);
    reply_error(r, c, 400, "'messages' is required: the chat to render", "messages");
    return;
  }
  req.template_only = template_only;
  submit(r, c, req);
}

static void on_engine(struct fe_router *r, struct fe_conn *c, const char *body, size_t len,
                      enum fe_api_kind kind) {
  on_engine_as(r, c, body, len, kind, 0);
}

static void on_audio(struct fe_router *r, struct fe_conn *c, const char *body, size_t len,
                     int translate) {
  struct fe_api_config acfg = api_config(r);
  const struct fe_http_header *h = fe_http_find_header(r->cur, "content-type");
  struct fe_api_request req;
  struct fe_api_error err;
  if (fe_api_parse_audio(translate, h ? h->value : NULL, h ? h->value_len : 0, body, len, &acfg,
                         &req, &err) != 0) {
    reply_error(r, c, err.status, err.message, err.param[0] ? err.param : NULL);
    return;
  }
  submit(r, c, req);
}

static void on_completions(struct fe_router *r, struct fe_conn *c, const char *b, size_t n) {
  on_engine(r, c, b, n, FE_API_COMPLETION);
}
static void on_chat(struct fe_router *r, struct fe_conn *c, const char *b, size_t n) {
  on_engine(r, c, b, n, FE_API_CHAT);
}
/* POST /invocations (vLLM's SageMaker route): a body with "messages" is a chat
 * completion, one with "prompt" a completion (a body that is not JSON: the
 * completion's parse says so); any other is a 400. */
static void on_invocations(struct fe_router *r, struct fe_conn *c, const char *b, size_t n) {
  json_t *j = json_loadb(b, n, 0, NULL);
  int parsed = j != NULL, chat = json_object_get(j, "messages") != NULL,
      prompt = json_object_get(j, "prompt") != NULL;
  json_decref(j);
  if (parsed && !chat && !prompt) {
    reply_error(r, c, 400,
                "/invocations takes a chat completion's body (with 'messages') or a "
                "completion's (with 'prompt')",
                NULL);
    return;
  }
  on_engine(r, c, b, n, chat ? FE_API_CHAT : FE_API_COMPLETION);
}
/* POST /v1/responses: OpenAI's Responses API, a chat request underneath */
static void on_responses(struct fe_router *r, struct fe_conn *c, const char *b, size_t n) {
  struct fe_api_config acfg = api_config(r);
  struct fe_api_request req;
  struct fe_api_error err;
  if (fe_api_parse_responses(b, n, &acfg, &req, &err) != 0) {
    reply_error(r, c, err.status, err.message, err.param[0] ? err.param : NULL);
    return;
  }
  submit(r, c, req);
}
/* POST /v1/messages: Anthropic's Messages API, a chat request underneath; and (count)
 * its count_tokens, a /tokenize request underneath */
static void messages(struct fe_router *r, struct fe_conn *c, const char *b, size_t n, int count) {
  struct fe_api_config acfg = api_config(r);
  struct fe_api_request req;
  struct fe_api_error err;
  if (fe_api_parse_messages(count, b, n, &acfg, &req, &err) != 0) {
    reply_error(r, c, err.status, err.message, err.param[0] ? err.param : NULL);
    return;
  }
  submit(r, c, req);
}
static void on_messages(struct fe_router *r, struct fe_conn *c, const char *b, size_t n) {
  messages(r, c, b, n, 0);
}
static void on_count_tokens(struct fe_router *r, struct fe_conn *c, const char *b, size_t n) {
  messages(r, c, b, n, 1);
}
/* ---- the Responses API's stored responses ------------------------------------ */

/* The query's value of `name` (NUL-terminated into out), or NULL. */
static const char *query_value(const struct fe_http_request *q, const char *name, char *out,
                               size_t cap) {
  const char *p = memchr(q->target, '?', q->target_len), *end = q->target + q->target_len;
  size_t n = strlen(name);
  while (p && p < end) {
    p++; /* past '?' or '&' */
    const char *amp = memchr(p, '&', (size_t)(end - p));
    const char *stop = amp ? amp : end;
    if ((size_t)(stop - p) > n && !memcmp(p, name, n) && p[n] == '=') {
      size_t len = (size_t)(stop - p) - n - 1;
      if (len >= cap) len = cap - 1;
      memcpy(out, p + n + 1, len);
      out[len] = 0;
      return out;
    }
    p = amp;
  }
  return NULL;
}

/* /v1/responses/{id}[/rest]: the stored entry, its id (into id, NUL-terminated) and
 * *rest (what follows its '/' as a NUL-terminated copy, "" for none). NULL (a 404
 * sent): no such response is stored. */
static const struct fe_rstore_entry *response_id(struct fe_router *r, struct fe_conn *c, char *id,
                                                 size_t cap, char *rest, size_t rest_cap) {
  static const char pre[] = "/v1/responses/";
  const char *p = r->cur->path + sizeof(pre) - 1, *end = r->cur->path + r->cur->path_len;
  const char *slash = memchr(p, '/', (size_t)(end - p));
  size_t n = (size_t)((slash ? slash : end) - p);
  size_t rn = slash ? (size_t)(end - slash - 1) : 0;
  snprintf(rest, rest_cap, "%.*s", (int)(rn < rest_cap ? rn : rest_cap - 1),
           slash ? slash + 1 : "");
  const struct fe_rstore_entry *e = r->store && n < cap ? fe_rstore_get(r->store, p, n) : NULL;
  if (!e) {
    char msg[200];
    snprintf(msg, sizeof(msg), "No response with id '%.*s' is stored here%s",
             (int)(n < 80 ? n : 80), p,
             r->store ? "" : " (the response store is off: --responses-store-size 0)");
    reply_error(r, c, 404, msg, "response_id");
    return NULL;
  }
  memcpy(id, p, n);
  id[n] = 0;
  return e;
}

/* GET /v1/responses/{id}: the stored response; .../input_items: its input items, a
 * list page (order desc by default, limit 1-100 (20), after an item's id). */
static void on_response_get(struct fe_router *r, struct fe_conn *c, const char *b, size_t n) {
  char id[128], v[128];
  char rest[32];
  const struct fe_rstore_entry *e = response_id(r, c, id, sizeof(id), rest, sizeof(rest));
  if (!e) return;
  if (!*rest) {
    if (query_value(r->cur, "stream", v, sizeof(v)) && !strcmp(v, "true")) {
      reply_error(r, c, 400, "a stored response is not streamed again; ask without stream=true",
                  "stream");
      return;
    }
    count_status(r, 200);
    fe_conn_respond(c, 200, "application/json", NULL, e->response, e->response_len);
    return;
  }
  if (strcmp(rest, "input_items") != 0) {
    reply_error(r, c, 404, "not found", NULL);
    return;
  }
  int64_t limit = 20;
  if (query_value(r->cur, "limit", v, sizeof(v))) {
    char *endp;
    limit = strtoll(v, &endp, 10);
    if (*endp || endp == v || limit < 1 || limit > 100) {
      reply_error(r, c, 400, "'limit' must be an integer from 1 to 100", "limit");
      return;
    }
  }
  int asc = 0;
  if (query_value(r->cur, "order", v, sizeof(v)) && strcmp(v, "desc")) {
    if (strcmp(v, "asc")) {
      reply_error(r, c, 400, "'order' must be asc or desc", "order");
      return;
    }
    asc = 1;
  }
  json_t *items = json_loads(e->input, 0, NULL), *page = json_array();
  size_t k = json_array_size(items), start = 0;
  const char *after = query_value(r->cur, "after", v, sizeof(v));
  if (after) {
    for (start = 0; start < k; start++) {
      size_t i = asc ? start : k - 1 - start;
      const char *iid = json_string_value(json_object_get(json_array_get(items, i), "id"));
      if (iid && !strcmp(iid, after)) break;
    }
    if (start == k) {
      json_decref(items);
      json_decref(page);
      reply_error(r, c, 400, "'after' names no input item of this response", "after");
      return;
    }
    start++;
  }
  for (size_t j = start; j < k && json_array_size(page) < (size_t)limit; j++)
    json_array_append(page, json_array_get(items, asc ? j : k - 1 - j));
  size_t got = json_array_size(page);
  json_t *first = got ? json_object_get(json_array_get(page, 0), "id") : NULL;
  json_t *last = got ? json_object_get(json_array_get(page, got - 1), "id") : NULL;
  json_t *out = json_pack("{s:s, s:o, s:O?, s:O?, s:b}", "object", "list", "data", page, "first_id",
                          first, "last_id", last, "has_more", start + got < k);
  char *s = out ? json_dumps(out, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(out);
  json_decref(items);
  if (!s) {
    reply_error(r, c, 500, "out of memory", NULL);
    return;
  }
  count_status(r, 200);
  fe_conn_respond(c, 200, "application/json", NULL, s, strlen(s));
  free(s);
}

/* DELETE /v1/responses/{id}: forgets it. */
static void on_response_delete(struct fe_router *r, struct fe_conn *c, const char *b, size_t n) {
  char id[128];
  char rest[32];
  if (!response_id(r, c, id, sizeof(id), rest, sizeof(rest))) return;
  if (*rest) {
    reply_error(r, c, 404, "not found", NULL);
    return;
  }
  fe_rstore_delete(r->store, id, strlen(id));
  struct fe_buf *out = &r->scratch;
  fe_buf_reset(out);
  fe_buf_puts(out, "{\"id\":");
  fe_buf_json_str(out, id, strlen(id));
  fe_buf_puts(out, ",\"object\":\"response\",\"deleted\":true}");
  reply_json(r, c, out);
}

/* POST /v1/responses/{id}/cancel: only background responses are cancelled, and none
 * run here. */
static void on_response_post(struct fe_router *r, struct fe_conn *c, const char *b, size_t n) {
  char id[128];
  char rest[32];
  if (!response_id(r, c, id, sizeof(id), rest, sizeof(rest))) return;
  if (strcmp(rest, "cancel") != 0) {
    reply_error(r, c, 404, "not found", NULL);
    return;
  }
  reply_error(r, c, 400, "only a background response can be cancelled, and this one has finished",
              NULL);
}

static void on_transcriptions(struct fe_router *r, struct fe_conn *c, const char *b, size_t n) {
  on_audio(r, c, b, n, 0);
}
static void on_translations(struct fe_router *r, struct fe_conn *c, const char *b, size_t n) {
  on_audio(r, c, b, n, 1);
}
static void on_tokenize(struct fe_router *r, struct fe_conn *c, const char *b, size_t n) {
  on_engine(r, c, b, n, FE_API_TOKENIZE);
}
static void on_detokenize(struct fe_router *r, struct fe_conn *c, const char *b, size_t n) {
  on_engine(r, c, b, n, FE_API_DETOKENIZE);
}
/* POST /apply-template (llama.cpp's): the chat of a /tokenize request's messages as
 * the template renders it, {"prompt": TEXT}, which /v1/completions then takes as it is */
static void on_apply_template(struct fe_router *r, struct fe_conn *c, const char *b, size_t n) {
  on_engine_as(r, c, b, n, FE_API_TOKENIZE, 1);
}

/* ---- run-time LoRA adapters (vLLM's /v1/load_lora_adapter, /v1/unload_lora_adapter) --- */

/* Whether a name is taken: the model's, an alias, an adapter's or one being loaded. */
static int name_taken(const struct fe_router *r, const char *name) {
  int taken = !strcmp(name, r->model_name);
  for (int i = 0; i < r->cfg.n_aliases; i++)
    taken |= !strcmp(name, r->cfg.aliases[i]);
  for (int i = 0; i < r->cfg.n_loras; i++)
    taken |= !strcmp(name, r->cfg.lora_names[i]);
  for (int i = 0; i < r->n_run_loras; i++)
    taken |= !strcmp(name, r->run_loras[i].name);
  for (const struct lora_op *o = r->lora_ops; o; o = o->next)
    taken |= o->load && !strcmp(name, o->name);
  return taken;
}

static void lora_op_free(struct lora_op *o) {
  free(o->name);
  free(o->path);
  free(o);
}

static void lora_unlink(struct fe_router *r, struct lora_op *o) {
  struct lora_op **at = &r->lora_ops;
  while (*at && *at != o)
    at = &(*at)->next;
  if (*at) *at = o->next;
}

/* The engine's answer to an unload: nothing waits for it (the name went at once). */
static void unload_done(void *arg, int code, const char *msg) {
  struct lora_op *o = arg;
  if (code) cm_warn(TAG, "LoRA adapter %s: unloading: %s", o->name, msg ? msg : cm_strerror(code));
  lora_unlink(o->r, o);
  lora_op_free(o);
}

/* The engine's answer to a load: an adapter every replica asked took is served from now
 * on. The answer goes to the connection whether or not the client is still there (a
 * connection is freed once answered). */
static void load_done(void *arg, int code, const char *msg) {
  struct lora_op *o = arg;
  struct fe_router *r = o->r;
  struct fe_conn *c = o->c;
  lora_unlink(r, o);
  char text[700];
  if (!code && r->n_run_loras < FE_ROUTE_MAX_RUN_LORAS) {
    int n =
        snprintf(text, sizeof(text), "Success: LoRA adapter '%.300s' added successfully.", o->name);
    cm_info(TAG, "LoRA adapter %s (%s) loaded", o->name, o->path);
    r->run_loras[r->n_run_loras++] = (struct fe_api_lora){o->name, o->path, o->uid};
    o->name = o->path = NULL;
    lora_op_free(o);
    reply(r, c, 200, "text/plain; charset=utf-8", NULL, text,
          n > 0 && (size_t)n < sizeof(text) ? (size_t)n : strlen(text));
    return;
  }
  const int past_cap = !code; /* (loaded by the workers, but no room for its name) */
  if (past_cap) code = CM_ERR_FULL, msg = "too many adapters loaded at run time: unload one first";
  int status = code == CM_ERR_NOENT                                                      ? 404
               : code == CM_ERR_AGAIN || code == CM_ERR_CLOSED || code == CM_ERR_TIMEOUT ? 503
               : code == CM_ERR_NOMEM                                                    ? 500
               : code == CM_ERR_FULL                                                     ? 429
                                                                                         : 400;
  snprintf(text, sizeof(text), "Loading the LoRA adapter failed: %s",
           msg ? msg : cm_strerror(code));
  cm_warn(TAG, "LoRA adapter %s (%s) not loaded: %s", o->name, o->path, text);
  if (past_cap && r->hooks.lora) { /* freed again */
    o->load = 0;
    o->c = NULL;
    o->next = r->lora_ops;
    r->lora_ops = o;
    if (r->hooks.lora(r->hooks.ud, PR_LORA_UNLOAD, o->uid, NULL, unload_done, o))
      unload_done(o, 0, NULL);
  } else {
    lora_op_free(o);
  }
  reply_error(r, c, status, text, "lora_path");
}

/* Whether s holds a control byte (which no name or path of ours carries into a log). */
static int has_control(const char *s) {
  for (; s && *s; s++)
    if ((unsigned char)*s < 0x20 || *s == 0x7f) return 1;
  return 0;
}

/* POST /v1/load_lora_adapter {"lora_name", "lora_path"} and /v1/unload_lora_adapter
 * {"lora_name"} (vLLM's, served with --allow-runtime-lora-updating). A load is served
 * under its name once the ready replicas' workers hold it (the others load it when a
 * request names it); an unload takes the name away at once, and each scheduler frees the
 * adapter once no request runs with it. */
static void on_lora_update(struct fe_router *r, struct fe_conn *c, const char *body, size_t len,
                           int load) {
  if (!r->cfg.runtime_lora) {
    reply_error(r, c, 404,
                "not found: adapters are loaded at run time with --allow-runtime-lora-updating",
                NULL);
    return;
  }
  json_t *j = json_loadb(body, len, 0, NULL);
  const char *name = json_string_value(json_object_get(j, "lora_name"));
  const char *path = json_string_value(json_object_get(j, "lora_path"));
  const char *why = NULL, *param = NULL;
  int status = 400;
  char msg[400];
  int at = -1;
  for (int i = 0; name && i < r->n_run_loras; i++)
    if (!strcmp(name, r->run_loras[i].name)) at = i;
  if (!json_is_object(j)) {
    why = "the body must be a JSON object";
  } else if (!name || !*name || (load && (!path || !*path))) {
    why = load ? "Both 'lora_name' and 'lora_path' must be provided."
               : "'lora_name' must be provided.";
    param = name && *name ? "lora_path" : "lora_name";
  } else if (strlen(name) > 256 || has_control(name)) {
    why = "'lora_name' must be at most 256 bytes, without control characters";
    param = "lora_name";
  } else if (load && (strlen(path) > PR_MAX_STR || has_control(path))) {
    why = "'lora_path' must be a path of at most 4096 bytes, without control characters";
    param = "lora_path";
  } else if (load && name_taken(r, name)) {
    snprintf(msg, sizeof(msg), "The lora adapter '%.256s' has already been loaded.", name);
    why = msg, param = "lora_name";
  } else if (load && r->n_run_loras >= FE_ROUTE_MAX_RUN_LORAS) {
    snprintf(msg, sizeof(msg), "at most %d adapters are loaded at run time: unload one first",
             FE_ROUTE_MAX_RUN_LORAS);
    why = msg, param = "lora_name";
  } else if (!load && at < 0) {
    int listed = 0;
    for (int i = 0; i < r->cfg.n_loras; i++)
      listed |= !strcmp(name, r->cfg.lora_names[i]);
    snprintf(msg, sizeof(msg),
             listed ? "The lora adapter '%.256s' was loaded at start (--lora-modules) and stays."
                    : "The lora adapter '%.256s' cannot be found.",
             name);
    why = msg, param = "lora_name", status = listed ? 400 : 404;
  } else if (load && !r->hooks.lora) {
    why = "engine not ready", status = 503;
  }
  struct lora_op *o = why ? NULL : calloc(1, sizeof(*o));
  if (!why && (!o || !(o->name = strdup(name)) || (load && !(o->path = strdup(path))))) {
    why = "out of memory", status = 500;
    if (o) lora_op_free(o);
    o = NULL;
  }
  json_decref(j);
  if (why) {
    reply_error(r, c, status, why, param);
    return;
  }
  o->r = r;
  o->c = c;
  o->load = load;
  if (!load) { /* no longer served: new requests cannot name it; those that run finish */
    o->uid = r->run_loras[at].uid;
    o->path = r->run_loras[at].path;
    free(r->run_loras[at].name);
    memmove(&r->run_loras[at], &r->run_loras[at + 1],
            sizeof(r->run_loras[0]) * (size_t)(r->n_run_loras - at - 1)); /* (listed in order) */
    r->n_run_loras--;
    char text[400];
    int n = snprintf(text, sizeof(text), "Success: LoRA adapter '%.300s' removed successfully.",
                     o->name);
    reply(r, c, 200, "text/plain; charset=utf-8", NULL, text,
          n > 0 && (size_t)n < sizeof(text) ? (size_t)n : strlen(text));
    cm_info(TAG, "LoRA adapter %s unloaded", o->name);
    o->c = NULL;
    o->next = r->lora_ops;
    r->lora_ops = o;
    if (!r->hooks.lora || r->hooks.lora(r->hooks.ud, PR_LORA_UNLOAD, o->uid, NULL, unload_done, o))
      unload_done(o, 0, NULL); /* (the schedulers free it when they make way for another) */
    return;
  }
  /* an id no other adapter of this frontend has had */
  static uint64_t serial;
  o->uid = cm_mix64(cm_time_wall_ns() ^ cm_mix64(++serial ^ (uint64_t)(uintptr_t)r)) | 1;
  o->next = r->lora_ops;
  r->lora_ops = o;
  int rc = r->hooks.lora(r->hooks.ud, PR_LORA_LOAD, o->uid, o->path, load_done, o);
  if (rc) load_done(o, rc, rc == CM_ERR_AGAIN ? "no replica is ready" : cm_strerror(rc));
}

static void on_load_lora(struct fe_router *r, struct fe_conn *c, const char *b, size_t n) {
  on_lora_update(r, c, b, n, 1);
}
static void on_unload_lora(struct fe_router *r, struct fe_conn *c, const char *b, size_t n) {
  on_lora_update(r, c, b, n, 0);
}

static const struct route routes[] = {
    {"GET", "/health", on_health, 1, 0},
    {"GET", "/ping", on_health, 1, 0}, /* vLLM's (SageMaker's) name for /health */
    {"POST", "/ping", on_health, 1, 0},
    {"GET", "/version", on_version, 0, 0},
    {"GET", "/props", on_props, 0, 0}, /* llama.cpp's */
    {"GET", "/v1/models", on_models, 0, 0},
    {"GET", "/v1/models/*", on_model, 0, 0}, /* any model's name after the slash */
    {"GET", "/metrics", on_metrics, 0, 0},
    {"POST", "/v1/completions", on_completions, 0, 0},
    {"POST", "/v1/chat/completions", on_chat, 0, 0},
    {"POST", "/v1/responses", on_responses, 0, 0},
    {"GET", "/v1/responses/*", on_response_get, 0, 0}, /* a stored response, its input items */
    {"DELETE", "/v1/responses/*", on_response_delete, 0, 0},
    {"POST", "/v1/responses/*", on_response_post, 0, 0}, /* .../cancel */
    {"POST", "/invocations", on_invocations, 0, 0},      /* vLLM's (SageMaker's) */
    {"POST", "/v1/messages", on_messages, 0, 0},         /* Anthropic's Messages API */
    {"POST", "/v1/messages/count_tokens", on_count_tokens, 0, 0},
    {"POST", "/v1/audio/transcriptions", on_transcriptions, 0, 0},
    {"POST", "/v1/audio/translations", on_translations, 0, 0},
    {"POST", "/tokenize", on_tokenize, 0, 0},
    {"POST", "/detokenize", on_detokenize, 0, 0},
    {"POST", "/apply-template", on_apply_template, 0, 0},
    {"POST", "/v1/load_lora_adapter", on_load_lora, 0, 0}, /* vLLM's */
    {"POST", "/v1/unload_lora_adapter", on_unload_lora, 0, 0},
};
#define N_ROUTES (sizeof(routes) / sizeof(routes[0]))

/* Whether got[0..n) is the key, in constant time in the key. */
static int key_eq(const unsigned char *got, size_t n, const char *key) {
  size_t k = strlen(key);
  /* constant time in the key: every byte of the key is compared whatever
   * the input, and the length difference is folded into the result */
  unsigned diff = (unsigned)(n ^ k);
  for (size_t j = 0; j < k; j++)
    diff |= (unsigned)(((j < n) ? got[j] : 0) ^ (unsigned char)key[j]);
  return diff == 0;
}

int fe_route_auth_ok(const char *h, size_t len, const char *key) {
  /* "Bearer" (any case), one or more spaces, the key */
  if (len < 7 || !fe_http_str_eq_nocase(h, 6, "bearer") || h[6] != ' ') return 0;
  size_t i = 6;
  while (i < len && h[i] == ' ')
    i++;
  return key_eq((const unsigned char *)h + i, len - i, key);
}

/* Whether the request carries one of the API keys: Authorization: Bearer KEY, or
 * Anthropic's X-Api-Key: KEY (its clients send that one). Every key is compared,
 * whichever matches. */
static int authorized(const struct fe_router *r, const struct fe_http_request *req) {
  const struct fe_http_header *h = fe_http_find_header(req, "authorization");
  const struct fe_http_header *x = fe_http_find_header(req, "x-api-key");
  int ok = 0;
  for (int i = 0; i < r->n_keys; i++) {
    ok |= h && fe_route_auth_ok(h->value, h->value_len, r->keys[i]);
    ok |= x && key_eq((const unsigned char *)x->value, x->value_len, r->keys[i]);
  }
  return ok;
}

/* The keys of r->api_key (split in place): lines, each a comma-separated list of
 * keys unless it begins with '#' (a comment, whatever it holds); the spaces around
 * a key are not part of it. */
static int split_keys(struct fe_router *r) {
  for (char *line = r->api_key; line && *line;) {
    size_t ln = strcspn(line, "\r\n");
    char *next = line[ln] ? line + ln + 1 : line + ln;
    line[ln] = 0;
    char *p = line + strspn(line, " \t");
    if (*p == '#') p += strlen(p);
    while (*p) {
      size_t n = strcspn(p, ",");
      char *end = p + n, *after = *end ? end + 1 : end;
      *end = 0;
      while (*p == ' ' || *p == '\t')
        p++;
      for (char *q = end; q > p && (q[-1] == ' ' || q[-1] == '\t');)
        *--q = 0;
      if (*p) {
        if (r->n_keys == MAX_KEYS) return CM_ERR_TOOBIG;
        r->keys[r->n_keys++] = p;
      }
      p = after;
    }
    line = next;
  }
  return 0;
}

/* Whether the request's path is p, or (p ending in a slash and a star) p up to its
 * slash and something after it. */
static int path_is(const struct fe_http_request *req, const char *p) {
  size_t n = strlen(p);
  if (n >= 2 && !strcmp(p + n - 2, "/*"))
    return req->path_len > n - 1 && memcmp(req->path, p, n - 1) == 0;
  return req->path_len == n && memcmp(req->path, p, req->path_len) == 0;
}

void fe_router_handle(void *ud, struct fe_conn *c, const struct fe_http_request *req,
                      const char *body, size_t body_len) {
  struct fe_router *r = ud;
  char allow[64] = "";                       /* the methods the path takes, for a 405 */
  int pre = fe_cors_handle(r->cors, c, req); /* a preflight, answered */
  if (pre) {
    count_status(r, pre);
    return;
  }
  for (size_t i = 0; i < N_ROUTES; i++) {
    if (!path_is(req, routes[i].path)) continue;
    int anthropic = !strncmp(routes[i].path, "/v1/messages", 12);
    if (anthropic) fe_conn_set_anthropic(c); /* its errors in its envelope (a 405 too) */
    size_t al = strlen(allow);
    snprintf(allow + al, sizeof(allow) - al, "%s%s", al ? ", " : "", routes[i].method);
    /* HEAD is GET without the body (the server drops it) */
    int head =
        req->method_len == 4 && !memcmp(req->method, "HEAD", 4) && !strcmp(routes[i].method, "GET");
    if (!head && (req->method_len != strlen(routes[i].method) ||
                  memcmp(req->method, routes[i].method, req->method_len) != 0))
      continue;
    if (!routes[i].open && r->n_keys) {
      if (!authorized(r, req)) {
        static const char msg[] =
            "invalid or missing API key (Authorization: Bearer KEY, or X-Api-Key: KEY)";
        count_status(r, 401);
        struct fe_buf *b = &r->scratch;
        fe_buf_reset(b);
        if (anthropic)
          fe_api_anthropic_error_body(b, 401, msg);
        else
          fe_api_error_body(b, 401, msg, NULL);
        fe_conn_respond(c, 401, "application/json", "WWW-Authenticate: Bearer\r\n", b->data,
                        b->len);
        return;
      }
    }
    r->cur = req;
    routes[i].fn(r, c, body, body_len);
    r->cur = NULL;
    return;
  }
  if (allow[0]) {
    char hdr[96];
    snprintf(hdr, sizeof(hdr), "Allow: %s\r\n", allow);
    count_status(r, 405);
    fe_conn_respond_error_hdr(c, 405, "method not allowed", NULL, hdr); /* (its API's envelope) */
    return;
  }
  reply_error(r, c, 404, "not found", NULL);
}

static char *dup_or_null(const char *s) {
  return s && *s ? strdup(s) : NULL;
}

int fe_router_create(const struct fe_route_config *cfg, struct fe_router **out, char *why,
                     size_t whylen) {
  struct fe_router *r = calloc(1, sizeof(*r));
  if (!r) return CM_ERR_NOMEM;
  char cwhy[256];
  int crc = fe_cors_create(cfg->allowed_origins, cfg->allowed_methods, cfg->allowed_headers,
                           cfg->allow_credentials, &r->cors, cwhy, sizeof(cwhy));
  if (crc) {
    if (why) snprintf(why, whylen, "%s", cwhy);
    free(r);
    return crc;
  }
  r->cfg = *cfg;
  r->api_key = dup_or_null(cfg->api_key);
  r->model_name = strdup(cfg->model_name);
  fe_buf_init(&r->scratch, 0);
  int rc = CM_ERR_NOMEM;
  if (!r->model_name || (cfg->api_key && *cfg->api_key && !r->api_key)) goto fail;
  if ((rc = split_keys(r)) != 0) {
    if (why) snprintf(why, whylen, "more than %d API keys", MAX_KEYS);
    goto fail;
  }
  if (cfg->api_key && *cfg->api_key && !r->n_keys) {
    if (why) snprintf(why, whylen, "the API key list holds no key");
    rc = CM_ERR_INVAL;
    goto fail;
  }
  if ((rc = fe_metrics_create(cfg->model_name, &r->metrics)) != 0) goto fail;
  if ((rc = fe_metrics_register_standard(r->metrics, &r->ids)) != 0) goto fail;
  r->created = (int64_t)(cm_time_wall_ns() / 1000000000ull);
  if (cfg->responses_store && (rc = fe_rstore_create(cfg->responses_store, &r->store)) != 0)
    goto fail;
  *out = r;
  return 0;
fail:
  fe_router_destroy(r);
  return rc;
}

void fe_router_destroy(struct fe_router *r) {
  if (!r) return;
  while (r->lora_ops) { /* (the engine, gone first, answers none of them) */
    struct lora_op *o = r->lora_ops;
    r->lora_ops = o->next;
    lora_op_free(o);
  }
  for (int i = 0; i < r->n_run_loras; i++) {
    free(r->run_loras[i].name);
    free(r->run_loras[i].path);
  }
  fe_metrics_destroy(r->metrics);
  fe_rstore_destroy(r->store);
  fe_cors_destroy(r->cors);
  fe_buf_free(&r->scratch);
  free(r->api_key);
  free(r->model_name);
  free(r);
}

void fe_router_set_hooks(struct fe_router *r, const struct fe_engine_hooks *hooks) {
  r->hooks = *hooks;
}
struct fe_metrics *fe_router_metrics(struct fe_router *r) {
  return r->metrics;
}
const struct fe_metric_ids *fe_router_metric_ids(const struct fe_router *r) {
  return &r->ids;
}
