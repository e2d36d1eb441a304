/* fe-cors.h — cross-origin requests from browsers (CORS), answered as vLLM's
 * server answers them: its --allowed-origins, --allowed-methods and
 * --allowed-headers (JSON lists of strings, each ["*"] by default) and
 * --allow-credentials (off), the rules of the CORS middleware it runs.
 *
 * A request without an Origin header is not a cross-origin one: nothing
 * changes. A preflight (OPTIONS with Origin and Access-Control-Request-Method)
 * is answered here, before routing and the API key (browsers send none with
 * it): 200 "OK" with Access-Control-Allow-Origin, -Methods, -Headers,
 * -Max-Age (600) and -Credentials where on, or 400 naming what is disallowed
 * (origin, method, headers). Any other request from an allowed origin gets
 * Access-Control-Allow-Origin on its answer, whatever the answer: "*" when
 * every origin is allowed without credentials, else the origin itself with
 * Vary: Origin. A disallowed origin's request is served without them (the
 * browser then withholds the answer from the page). */
#ifndef LMSERVE_FE_CORS_H
#define LMSERVE_FE_CORS_H
#include <stddef.h>

#include "frontend/fe-http.h"
#include "frontend/fe-server.h"

struct fe_cors;

/* origins, methods, headers: JSON lists of strings (NULL: ["*"]). 0, or
 * CM_ERR_INVAL with the flag and what is wrong in why. */
int fe_cors_create(const char *origins, const char *methods, const char *headers, int credentials,
                   struct fe_cors **out, char *why, size_t whylen);
void fe_cors_destroy(struct fe_cors *k);

/* A preflight: answered on c, its status returned (200 or 400). Otherwise 0,
 * the CORS headers of an allowed origin set on c's answer (fe_conn_set_headers). */
int fe_cors_handle(const struct fe_cors *k, struct fe_conn *c, const struct fe_http_request *req);

#endif
