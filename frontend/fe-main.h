/* fe-main.h — entry point of the frontend role, called by tools/lmserve.c. */
#ifndef LMSERVE_FE_MAIN_H
#define LMSERVE_FE_MAIN_H
#include <stddef.h>
#include <stdint.h>

#include "common/cm-log.h"

int fe_frontend_main(int argc, char **argv);

/* 1 when json is what --default-chat-template-kwargs takes: a JSON object whose
 * enable_thinking, if there, is a boolean. */
int fe_main_template_kwargs_ok(const char *json);

/* --chat-template's help, the same on serve and frontend. 0 when value is a
 * template the frontend can use (a file, or the template itself), else the
 * reason in why. */
#define FE_MAIN_CHAT_TEMPLATE_HELP                                                                 \
  "the chat template in place of the model's: a Jinja file, or the template itself (as vLLM's "    \
  "flag)"
int fe_main_chat_template_check(const char *value, char *why, size_t whylen);

/* CORS's options (fe-cors.h), the same on serve and frontend: vLLM's flags. */
#define FE_MAIN_CORS_OPTS(origins, methods, headers, credentials)                                  \
  {"allowed-origins", CM_OPT_STR, &(origins), "JSON",                                              \
   "origins a browser page may call from (CORS), a JSON list: '[\"https://app.example\"]' "        \
   "(default [\"*\"]: any)"},                                                                      \
      {"allowed-methods", CM_OPT_STR, &(methods), "JSON",                                          \
       "methods a cross-origin page may use, a JSON list (default [\"*\"])"},                      \
      {"allowed-headers", CM_OPT_STR, &(headers), "JSON",                                          \
       "request headers a cross-origin page may send, a JSON list (default [\"*\"])"},             \
  {                                                                                                \
    "allow-credentials", CM_OPT_BOOL, &(credentials), NULL,                                        \
        "cross-origin pages may send credentials (cookies, Authorization); the allowed origin "    \
        "is then named, never \"*\""                                                               \
  }
/* The operators' log lines (fe_engine_config's log_*), flags of serve and frontend. */
struct fe_main_log {
  int requests, no_requests, outputs, no_stats;
  int64_t max_len; /* 0: all */
  double stats_s;  /* seconds between stats lines */
};
#define FE_MAIN_LOG_OPTS(l)                                                                        \
  {"enable-log-requests", CM_OPT_BOOL, &(l).requests, NULL,                                        \
   "an info line for each request received: its prompt's text and token ids and its sampling "     \
   "parameters (vLLM's flag; without it no prompt is logged)"},                                    \
      {"disable-log-requests", CM_OPT_BOOL, &(l).no_requests, NULL,                                \
       "no such line, whatever --enable-log-requests says (vLLM's older flag)"},                   \
      {"enable-log-outputs", CM_OPT_BOOL, &(l).outputs, NULL,                                      \
       "an info line for each choice finished: its finish reason, its tokens and its text "        \
       "(vLLM's flag)"},                                                                           \
      {"max-log-len",                                                                              \
       CM_OPT_INT,                                                                                 \
       &(l).max_len,                                                                               \
       "N",                                                                                        \
       "those lines keep each text's first N bytes and each id list's first N ids (default: all)", \
       1,                                                                                          \
       INT32_MAX},                                                                                 \
      {"disable-log-stats", CM_OPT_BOOL, &(l).no_stats, NULL,                                      \
       "no stats lines (by default each replica's prompt and generation tokens/s, running and "    \
       "waiting requests, KV cache use and prefix cache hits every --log-stats-interval "          \
       "seconds: info while it works, debug while idle)"},                                         \
  {                                                                                                \
    "log-stats-interval", CM_OPT_DOUBLE, &(l).stats_s, "S",                                        \
        "seconds between stats lines (10; at least 0.5, the period they are checked at)", 0, 0,    \
        0.5, 86400                                                                                 \
  }

/* vLLM's request policy and its server's log level, flags of serve and frontend. */
struct fe_main_policy {
  int64_t max_logprobs;      /* 0: 20 */
  const char *scheduling;    /* "fcfs" or "priority" (NULL: priority) */
  const char *uvicorn_level; /* the frontend's log level by uvicorn's names (NULL: as set) */
};
#define FE_MAIN_POLICY_OPTS(pl)                                                                    \
  {"max-logprobs",                                                                                 \
   CM_OPT_INT,                                                                                     \
   &(pl).max_logprobs,                                                                             \
   "N",                                                                                            \
   "most top logprobs a request may ask for (logprobs, top_logprobs, prompt_logprobs), as "        \
   "vLLM's flag (20)",                                                                             \
   1,                                                                                              \
   64},                                                                                            \
      {"scheduling-policy", CM_OPT_STR, &(pl).scheduling, "fcfs|priority",                         \
       "priority (the default here): a request's priority orders the queue, lower first; fcfs "    \
       "(vLLM's default): arrival alone does, and a request with a priority other than 0 is a "    \
       "400"},                                                                                     \
  {                                                                                                \
    "uvicorn-log-level", CM_OPT_STR, &(pl).uvicorn_level, "LEVEL",                                 \
        "the frontend's log level by uvicorn's names (vLLM's flag): critical, error, warning, "    \
        "info, debug or trace; warning and above keep the access log out"                          \
  }
/* Checks pl's values (a sentence on stderr naming `prog` and the flag when one is
 * off); 0, or -1. *fcfs and *level: what they ask (*level untouched without one). */
int fe_main_policy_check(const char *prog, const struct fe_main_policy *pl, int *fcfs,
                         enum cm_log_level *level);

/* 0 when the CORS lists are JSON lists of names, else the reason in why. */
int fe_main_cors_check(const char *origins, const char *methods, const char *headers, char *why,
                       size_t whylen);

/* --enable-prompt-tokens-details's help, the same on serve and frontend. */
#define FE_MAIN_PROMPT_DETAILS_HELP                                                                \
  "answers' usage reports prompt_tokens_details.cached_tokens: the prompt tokens the prefix "      \
  "cache served (as vLLM's flag)"
#define FE_MAIN_API_KEY_HELP                                                                       \
  "require the key: 'Authorization: Bearer KEY' or 'X-Api-Key: KEY'; several keys a comma apart "  \
  "(also LMSERVE_API_KEY)"
#define FE_MAIN_API_KEY_FILE_HELP                                                                  \
  "keys from FILE, one a line (blank lines and lines that begin with '#' skipped), besides "       \
  "--api-key's"

/* --api-key's keys and those of --api-key-file, as the frontend's router takes them. */
int fe_main_read_keys(const char *keys, const char *path, char **out);

#define FE_MAIN_ID_HEADERS_HELP                                                                    \
  "answers carry X-Request-Id: the client's, or one made (vLLM's flag); either way the answer's "  \
  "id is made of it"
#define FE_MAIN_ACCESS_LOG_HELP                                                                    \
  "no log line per request answered (by default one, as uvicorn's access log: client, method, "    \
  "path, status, seconds, body bytes; /health, /ping and /metrics at debug level)"
#define FE_MAIN_TRUST_TEMPLATE_HELP                                                                \
  "chat requests may carry their own chat_template (or chat_template_kwargs.chat_template), "      \
  "rendered in place of the model's; without it such a request is a 400 (as vLLM's flag)"

/* --responses-store-size's help, the same on serve and frontend. */
#define FE_MAIN_RSTORE_HELP                                                                        \
  "memory for the Responses API's stored responses (previous_response_id, GET "                    \
  "/v1/responses/ID), the oldest dropped past it; 0 stores none (64M)"

/* --served-model-name's help, the same on serve and frontend. */
#define FE_MAIN_SERVED_NAME_HELP                                                                   \
  "model name clients use (default: --model as given, as vLLM's; 'default' without one); "         \
  "several (repeated, or comma-separated): the first is the name, the others answer too"

/* --generation-config and --override-generation-config's help, the same on serve and
 * frontend (vLLM's flags; model/md-config.h's md_sampling_load). */
#define FE_MAIN_GEN_CONFIG_HELP                                                                    \
  "sampling defaults for the fields a request leaves out: auto (the checkpoint's "                 \
  "generation_config.json: temperature, top_p, top_k, min_p, repetition_penalty; its "             \
  "max_new_tokens caps every request), vllm (none), or a folder's (default auto)"
#define FE_MAIN_GEN_OVERRIDE_HELP                                                                  \
  "a JSON object over --generation-config's values, e.g. '{\"temperature\": 0.5}'"
struct md_sampling;
/* The defaults s holds, as "temperature 1, top_k 64" for the log. */
void fe_main_sampling_text(const struct md_sampling *s, char *out, size_t size);

/* --limit-mm-per-prompt's help, the same on serve and frontend (both check the
 * spec with fe-mm.h's fe_mm_parse_limit). */
#define FE_MAIN_LIMIT_MM_ARG "image=N,audio=M"
#define FE_MAIN_LIMIT_MM_HELP                                                                      \
  "images and audio clips per prompt at most (image=16,audio=16; 0 turns a modality off); "        \
  "JSON {\"image\": N, \"audio\": M} too"

#endif
