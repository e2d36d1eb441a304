/* fe-api-conv.c — see fe-api-conv.h. */
#include "frontend/fe-api-conv.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"

int fe_conv_fail(struct fe_api_error *err, const char *param, const char *fmt, ...) {
  err->status = 400;
  snprintf(err->param, sizeof(err->param), "%s", param ? param : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->message, sizeof(err->message), fmt, ap);
  va_end(ap);
  return CM_ERR_INVAL;
}

int fe_conv_oom(struct fe_api_error *err) {
  err->status = 413;
  err->param[0] = 0;
  snprintf(err->message, sizeof(err->message), "request too large to hold in memory");
  return CM_ERR_NOMEM;
}

int fe_conv_given(const json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return v && !json_is_null(v);
}

int fe_conv_body(enum fe_api_kind kind, const char *body, size_t len,
                 const struct fe_api_config *cfg, struct fe_api_request *out,
                 struct fe_api_error *err, json_t **b) {
  *b = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
  if (json_is_object(*b)) return 0;
  json_decref(*b);
  *b = NULL;
  int rc = fe_api_parse_request(kind, body, len, cfg, out, err);
  if (!rc) { /* cannot be: it refused it as JSON */
    fe_api_request_free(out);
    rc = fe_conv_fail(err, NULL, "the request body must be a JSON object");
  }
  return rc;
}

int fe_conv_push(struct fe_conv *c, json_t *m, const char *from) {
  size_t i = json_array_size(c->msgs);
  if (!m || json_array_append_new(c->msgs, m)) return fe_conv_oom(c->err);
  if (i >= c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 16;
    char **o = realloc(c->origin, cap * sizeof(*o));
    if (!o) return fe_conv_oom(c->err);
    memset(o + c->cap, 0, (cap - c->cap) * sizeof(*o));
    c->origin = o;
    c->cap = cap;
  }
  if (!(c->origin[i] = strdup(from))) return fe_conv_oom(c->err);
  return 0;
}

void fe_conv_free(struct fe_conv *c) {
  for (size_t i = 0; c->origin && i < c->cap; i++)
    free(c->origin[i]);
  free(c->origin);
  c->origin = NULL;
  c->cap = 0;
}

int fe_conv_rename(const char *param, char *const *origin, size_t n, const char *call_id,
                   const char *format, char *out, size_t cap) {
  size_t i;
  int k = 0;
  if (sscanf(param, "messages[%zu]%n", &i, &k) == 1 && k > 0 && i < n)
    snprintf(out, cap, "%s%s", origin[i],
             !strcmp(param + k, ".tool_call_id") ? call_id : param + k);
  else if (!strncmp(param, "response_format", 15))
    snprintf(out, cap, "%s%s", format,
             strncmp(param + 15, ".json_schema", 12) ? param + 15 : param + 27);
  else if (!strncmp(param, "tools[", 6) && strstr(param, "].function."))
    snprintf(out, cap, "%.*s%s", (int)(strstr(param, "].function.") - param + 2), param,
             strstr(param, "].function.") + 11);
  else
    return 0;
  return 1;
}
