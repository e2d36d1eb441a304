/* fe-api-conv.h — what the translators of other APIs into the chat request share
 * (fe-api-responses.c: OpenAI's Responses API; fe-api-messages.c: Anthropic's
 * Messages API): their errors, and the chat messages they build, each with the
 * field of the request it came from ("input[3]", "messages[2].content[1]"), by which
 * a chat error's field is named back in the request's terms. */
#ifndef LMSERVE_FE_API_CONV_H
#define LMSERVE_FE_API_CONV_H
#include <jansson.h>
#include <stddef.h>

#include "frontend/fe-api.h"

/* A 400 naming param (NULL: none): CM_ERR_INVAL. */
int fe_conv_fail(struct fe_api_error *err, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A 413 for a request too large to hold: CM_ERR_NOMEM. */
int fe_conv_oom(struct fe_api_error *err);
/* Whether o has key, and not as null. */
int fe_conv_given(const json_t *o, const char *key);

/* The request body as a JSON object (*b, new): 0. A body that is not one gets the
 * chat parse's error for it (the parse of `kind` names what is wrong with the JSON):
 * the negative cm_err, err filled, out needing no freeing. */
int fe_conv_body(enum fe_api_kind kind, const char *body, size_t len,
                 const struct fe_api_config *cfg, struct fe_api_request *out,
                 struct fe_api_error *err, json_t **b);

struct fe_conv {
  struct fe_api_error *err;
  json_t *msgs;  /* the chat messages being built */
  char **origin; /* (cap) each message's origin (malloc'd) */
  size_t cap;
};

/* Appends chat message m (taken; NULL: out of memory) made from the field `from`:
 * 0 or fe_conv_oom's. */
int fe_conv_push(struct fe_conv *c, json_t *m, const char *from);
/* Frees the origins (the messages belong to the request they were put in). */
void fe_conv_free(struct fe_conv *c);

/* The renamings of a chat error's param that both translators make, written to
 * out (cap bytes): "messages[i]..." (i < n) as origin[i] and the rest, the rest's
 * ".tool_call_id" as call_id; "response_format..." as format and the rest, less
 * its ".json_schema" level; a tool's "tools[i].function.X" as "tools[i].X". 1
 * where one applies; 0, out untouched, where none does. */
int fe_conv_rename(const char *param, char *const *origin, size_t n, const char *call_id,
                   const char *format, char *out, size_t cap);

#endif
