/* fe-rstore.h — the Responses API's store: finished responses kept in the
 * frontend's memory, so that a request can go on from one
 * (previous_response_id) and a client can read one back (GET
 * /v1/responses/{id}, its input items) or delete it.
 *
 * Each entry holds a response's JSON, the chat conversation it ends (the chat
 * messages before it, without the request's instructions, then its own output
 * as the assistant's turn: its text and calls; thoughts are dropped, as the chat
 * templates drop them), and its request's input items. The store keeps at most
 * `cap` bytes of them: past that the oldest go first. One frontend's store is its
 * own; the event loop's thread alone uses it. */
#ifndef LMSERVE_FE_RSTORE_H
#define LMSERVE_FE_RSTORE_H
#include <stddef.h>

struct fe_rstore;

struct fe_rstore_entry {
  const char *response; /* the response object's JSON, NUL-terminated */
  size_t response_len;  /* bytes */
  const char *conv;     /* the conversation it ends: a JSON array of chat messages */
  const char *input;    /* its request's input items: a JSON array, each with an "id" */
};

/* cap: bytes the entries may take (their texts); 0 is refused. 0 or CM_ERR_NOMEM. */
int fe_rstore_create(size_t cap, struct fe_rstore **out);
void fe_rstore_destroy(struct fe_rstore *s);

/* Keeps the finished response[0..len) (its "id" names it), with conv (the chat
 * messages before it, a JSON array's text) and input (its input items' JSON array).
 * Its output items become conv's last turn. Returns 0, CM_ERR_PARSE (not a
 * response object), CM_ERR_TOOBIG (larger than the whole cap: not kept) or
 * CM_ERR_NOMEM; the log says why one was not kept. */
int fe_rstore_put(struct fe_rstore *s, const char *response, size_t len, const char *conv,
                  const char *input);

/* The entry of response id[0..n), or NULL; valid until the next put or delete. */
const struct fe_rstore_entry *fe_rstore_get(const struct fe_rstore *s, const char *id, size_t n);

/* Forgets response id[0..n): 0, or CM_ERR_NOENT. */
int fe_rstore_delete(struct fe_rstore *s, const char *id, size_t n);

/* Entries and bytes held now. */
void fe_rstore_usage(const struct fe_rstore *s, size_t *entries, size_t *bytes);

#endif
