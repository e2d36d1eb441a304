/* fe-route.h — the frontend's HTTP routes (DESIGN.md, "HTTP API"): auth,
 * dispatch by method and path, and the answers that need no engine.
 *
 *   GET  /health               200 once the engine's ready hook says so, 503 before
 *   GET  /version              {"version": "..."}
 *   GET  /props                llama.cpp's: the context, sampling defaults, names and
 *                              what the checkpoint gives (the engine's props hook)
 *   GET  /v1/models            the served model with its max_model_len (the
 *                              engine's once it reported one)
 *   GET  /metrics              Prometheus text
 *   POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize
 *                              validated here, then handed to the engine's
 *                              submit hook (503 "engine not ready" without one)
 *
 * Unknown paths are 404, a known path with the wrong method is 405 (with
 * Allow). With an API key every route but /health needs
 * `Authorization: Bearer KEY` (compared in constant time), else 401. */
#ifndef LMSERVE_FE_ROUTE_H
#define LMSERVE_FE_ROUTE_H
#include <stddef.h>
#include <stdint.h>

#include "frontend/fe-api.h"
#include "frontend/fe-http-metrics.h"
#include "frontend/fe-server.h"

struct fe_router;

/* What a run-time LoRA load or unload came to: 0, or a negative cm_err and why. */
typedef void (*fe_lora_done_fn)(void *arg, int code, const char *msg);

/* What the serving path plugs in. Every member may be NULL. */
struct fe_engine_hooks {
  /* 1 when a round trip to the scheduler and workers succeeded lately. */
  int (*ready)(void *ud);
  /* Takes a validated request: on 0 it owns *req (free it with
   * fe_api_request_free) and answers `c` later; on a negative cm_err the
   * router answers with `why` (or a generic message) and frees req:
   * CM_ERR_FULL is 429 with Retry-After, anything else 503. */
  int (*submit)(void *ud, struct fe_conn *c, struct fe_api_request *req, const char **why);
  void *ud;
  /* The context length the engine enforces (tokens), for /v1/models and
   * the router's length checks; NULL or <= 0: the configured one. */
  int64_t (*max_model_len)(void *ud);
  /* What the checkpoint offers (Gemma 4's markers, native tools) for request
   * parsing; NULL: nothing known. */
  const struct fe_api_model *(*model)(void *ud);
  /* GET /props: the engine's members of the object (`"key":value,` each, comma
   * after), what the checkpoint gives: its path, chat template, BOS and EOS tokens,
   * and which media it takes; NULL: none. */
  void (*props)(void *ud, struct fe_buf *out);
  /* POST /v1/load_lora_adapter and /v1/unload_lora_adapter: op (proto's PR_LORA_LOAD,
   * PR_LORA_UNLOAD) of run-time adapter uid at path, to every replica; done(arg, ...)
   * once they have answered. 0, or a negative cm_err (done is then never called). */
  int (*lora)(void *ud, int op, uint64_t uid, const char *path, fe_lora_done_fn done, void *arg);
};

struct fe_route_config {
  const char *api_key;    /* NULL or "": no auth; several keys a comma or a line apart, any
                             of which opens the API (blank ones and lines that begin
                             with '#' are not keys) */
  const char *model_name; /* the served model's name */
  int64_t max_model_len;  /* tokens */
  /* --default-chat-template-kwargs: a JSON object's text (NULL: none) */
  const char *default_template_kwargs;
  /* CORS (fe-cors.h): --allowed-origins, --allowed-methods, --allowed-headers (JSON
     lists; NULL: ["*"]) and --allow-credentials */
  const char *allowed_origins, *allowed_methods, *allowed_headers;
  int allow_credentials;
  /* the checkpoint's sampling defaults (--generation-config; NULL: none), which
   * outlive the router */
  const struct md_sampling *defaults;
  /* further names of the model (listed after it by /v1/models), which outlive the
   * router */
  const char *const *aliases;
  int n_aliases;
  /* the LoRA adapters (--lora-modules), listed as models whose parent is the served
   * model, which outlive the router: names, paths, and the list's md_lora_list_sum */
  const char *const *lora_names;
  const char *const *lora_paths;
  int n_loras;
  uint64_t lora_sum;
  uint64_t responses_store; /* bytes for the Responses API's store (fe-rstore.h); 0: none */
  int request_id_headers;   /* --enable-request-id-headers: every answer of the engine's
                               routes carries X-Request-Id (the client's, or one made) */
  int max_logprobs;         /* fe_api_config's (--max-logprobs; 0: 20) */
  int runtime_lora;         /* --allow-runtime-lora-updating: POST /v1/load_lora_adapter and
                               /v1/unload_lora_adapter are served (else 404) */
  int fcfs;                 /* fe_api_config's (--scheduling-policy fcfs) */
};

/* 0, or a negative cm_err (CM_ERR_INVAL: a CORS list that is not one, the
 * reason in why when given). */
int fe_router_create(const struct fe_route_config *cfg, struct fe_router **out, char *why,
                     size_t whylen);
void fe_router_destroy(struct fe_router *r);
void fe_router_set_hooks(struct fe_router *r, const struct fe_engine_hooks *hooks);
struct fe_metrics *fe_router_metrics(struct fe_router *r);
const struct fe_metric_ids *fe_router_metric_ids(const struct fe_router *r);

/* The fe_server request callback; `ud` is the router. */
void fe_router_handle(void *ud, struct fe_conn *c, const struct fe_http_request *req,
                      const char *body, size_t body_len);

/* Constant-time check of an Authorization header value against the key. */
int fe_route_auth_ok(const char *header, size_t len, const char *key);

#endif
