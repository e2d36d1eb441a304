/* fe-cors.c — cross-origin requests (see fe-cors.h). */
#include "frontend/fe-cors.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/cm-err.h"

/* what "*" allows of the methods, as the middleware lists them */
#define ALL_METHODS "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"
#define MAX_ITEM    256 /* bytes of one origin, method or header name */

struct list {
  char **v;
  size_t n;
  int any; /* "*" was in it */
};

/* headers a page may always send (CORS-safelisted) */
static char *safelisted_v[] = {"accept", "accept-language", "content-language", "content-type"};
static const struct list safelisted = {safelisted_v, 4, 0};

struct fe_cors {
  struct list origins, methods, headers; /* methods upper-case, headers lower-case */
  int credentials;
  char methods_hdr[1024]; /* Access-Control-Allow-Methods' value */
  char headers_hdr[1024]; /* Access-Control-Allow-Headers' value (headers not "*") */
};

static void list_free(struct list *l) {
  for (size_t i = 0; i < l->n; i++)
    free(l->v[i]);
  free(l->v);
}

/* json (NULL: ["*"]) into l, each string's case folded by fold (NULL: kept). */
static int parse_list(const char *flag, const char *json, int (*fold)(int), struct list *l,
                      char *why, size_t whylen) {
  if (!json) {
    l->any = 1;
    return 0;
  }
  json_t *a = json_loads(json, 0, NULL);
  int rc = CM_ERR_INVAL;
  if (!json_is_array(a)) {
    snprintf(why, whylen, "--%s must be a JSON list of strings (e.g. '[\"*\"]'), not %s", flag,
             json);
    goto done;
  }
  if (!(l->v = calloc(json_array_size(a) + 1, sizeof(char *)))) {
    rc = CM_ERR_NOMEM;
    goto done;
  }
  size_t i;
  json_t *e;
  json_array_foreach(a, i, e) {
    const char *s = json_string_value(e);
    size_t n = s ? strlen(s) : 0;
    int bad = !s || n == 0 || n >= MAX_ITEM || n != json_string_length(e);
    for (size_t k = 0; !bad && k < n; k++)
      bad = (unsigned char)s[k] < 0x21 || s[k] == 0x7f || s[k] == ',';
    if (bad) {
      snprintf(why, whylen,
               "--%s: item %zu is not a name (a non-empty string of at most %d printable "
               "characters, no spaces or commas)",
               flag, i, MAX_ITEM - 1);
      goto done;
    }
    if (!strcmp(s, "*")) l->any = 1;
    if (!(l->v[l->n] = strdup(s))) {
      rc = CM_ERR_NOMEM;
      goto done;
    }
    for (char *p = l->v[l->n]; fold && *p; p++)
      *p = (char)fold((unsigned char)*p);
    l->n++;
  }
  rc = 0;
done:
  json_decref(a);
  return rc;
}

/* 1 when s[n] is in l (with nocase, letters' case aside). */
static int list_has(const struct list *l, const char *s, size_t n, int nocase) {
  for (size_t i = 0; i < l->n; i++)
    if (strlen(l->v[i]) == n && !(nocase ? strncasecmp : strncmp)(l->v[i], s, n)) return 1;
  return 0;
}

/* l's items but "*" appended to the NUL-terminated list in buf, ", " between. */
static void join(char *buf, size_t size, const struct list *l) {
  size_t at = strlen(buf);
  for (size_t i = 0; i < l->n && at < size; i++)
    if (strcmp(l->v[i], "*"))
      at += (size_t)snprintf(buf + at, size - at, "%s%s", at ? ", " : "", l->v[i]);
}

int fe_cors_create(const char *origins, const char *methods, const char *headers, int credentials,
                   struct fe_cors **out, char *why, size_t whylen) {
  struct fe_cors *k = calloc(1, sizeof(*k));
  if (!k) return CM_ERR_NOMEM;
  int rc = parse_list("allowed-origins", origins, NULL, &k->origins, why, whylen);
  if (!rc) rc = parse_list("allowed-methods", methods, toupper, &k->methods, why, whylen);
  if (!rc) rc = parse_list("allowed-headers", headers, tolower, &k->headers, why, whylen);
  if (rc) {
    if (rc == CM_ERR_NOMEM) snprintf(why, whylen, "out of memory");
    fe_cors_destroy(k);
    return rc;
  }
  k->credentials = credentials;
  if (k->methods.any)
    snprintf(k->methods_hdr, sizeof(k->methods_hdr), "%s", ALL_METHODS);
  else
    join(k->methods_hdr, sizeof(k->methods_hdr), &k->methods);
  join(k->headers_hdr, sizeof(k->headers_hdr), &safelisted);
  join(k->headers_hdr, sizeof(k->headers_hdr), &k->headers);
  *out = k;
  return 0;
}

void fe_cors_destroy(struct fe_cors *k) {
  if (!k) return;
  list_free(&k->origins);
  list_free(&k->methods);
  list_free(&k->headers);
  free(k);
}

/* Every name of a comma-separated header list v[n] allowed. */
static int headers_allowed(const struct fe_cors *k, const char *v, size_t n) {
  if (k->headers.any) return 1;
  size_t i = 0;
  while (i < n) {
    while (i < n && (v[i] == ',' || v[i] == ' ' || v[i] == '\t'))
      i++;
    size_t s = i;
    while (i < n && v[i] != ',')
      i++;
    size_t e = i;
    while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t'))
      e--;
    if (e == s) continue;
    if (!list_has(&safelisted, v + s, e - s, 1) && !list_has(&k->headers, v + s, e - s, 1))
      return 0;
  }
  return 1;
}

/* No control characters, under max bytes: what may be echoed in a header line. */
static int echoable(const char *v, size_t n, size_t max) {
  if (n == 0 || n >= max) return 0;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)v[i] < 0x20 || v[i] == 0x7f) return 0;
  return 1;
}

int fe_cors_handle(const struct fe_cors *k, struct fe_conn *c, const struct fe_http_request *req) {
  const struct fe_http_header *o = fe_http_find_header(req, "origin");
  if (!o) return 0;
  /* "*" needs no echo; an origin named back must be one a header line can hold */
  int origin_ok = (k->origins.any && !k->credentials) ||
                  (echoable(o->value, o->value_len, MAX_ITEM) &&
                   (k->origins.any || list_has(&k->origins, o->value, o->value_len, 0)));
  /* the Access-Control-Allow-Origin line (and Vary where it names the origin) */
  char allow[MAX_ITEM + 96] = "";
  if (k->origins.any && !k->credentials)
    snprintf(allow, sizeof(allow), "Access-Control-Allow-Origin: *\r\n");
  else if (origin_ok)
    snprintf(allow, sizeof(allow), "Access-Control-Allow-Origin: %.*s\r\nVary: Origin\r\n",
             (int)o->value_len, o->value);
  const char *cred = k->credentials ? "Access-Control-Allow-Credentials: true\r\n" : "";
  const struct fe_http_header *rm = NULL, *rh = NULL;
  if (req->method_len == 7 && !memcmp(req->method, "OPTIONS", 7))
    rm = fe_http_find_header(req, "access-control-request-method");
  if (!rm) {
    char lines[FE_CONN_HEADERS_MAX];
    if (origin_ok) {
      snprintf(lines, sizeof(lines), "%s%s", allow, cred);
      fe_conn_set_headers(c, lines);
    }
    return 0;
  }
  /* a preflight */
  rh = fe_http_find_header(req, "access-control-request-headers");
  int method_ok = k->methods.any || list_has(&k->methods, rm->value, rm->value_len, 0);
  int headers_ok = !rh || headers_allowed(k, rh->value, rh->value_len);
  if (!origin_ok || !method_ok || !headers_ok) {
    char body[96];
    snprintf(body, sizeof(body), "Disallowed CORS %s%s%s%s%s", !origin_ok ? "origin" : "",
             !origin_ok && (!method_ok || !headers_ok) ? ", " : "", !method_ok ? "method" : "",
             !method_ok && !headers_ok ? ", " : "", !headers_ok ? "headers" : "");
    fe_conn_respond(c, 400, "text/plain; charset=utf-8", NULL, body, strlen(body));
    return 400;
  }
  char hdrs[3072], allow_h[1100];
  if (!k->headers.any)
    snprintf(allow_h, sizeof(allow_h), "Access-Control-Allow-Headers: %s\r\n", k->headers_hdr);
  else if (rh && echoable(rh->value, rh->value_len, FE_CONN_HEADERS_MAX - 64))
    snprintf(allow_h, sizeof(allow_h), "Access-Control-Allow-Headers: %.*s\r\n", (int)rh->value_len,
             rh->value);
  else
    allow_h[0] = 0;
  snprintf(hdrs, sizeof(hdrs),
           "%sAccess-Control-Allow-Methods: %s\r\n%sAccess-Control-Max-Age: 600\r\n%s", allow,
           k->methods_hdr, allow_h, cred);
  fe_conn_respond(c, 200, "text/plain; charset=utf-8", hdrs, "OK", 2);
  return 200;
}
