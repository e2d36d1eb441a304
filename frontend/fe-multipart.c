/* fe-multipart.c — multipart/form-data bodies (fe-multipart.h). */
#include "frontend/fe-multipart.h"

#include <string.h>

#include "common/cm-err.h"
#include "frontend/fe-http.h"

#define MAX_BOUNDARY 70 /* RFC 2046's limit */

static int is_ws(char c) {
  return c == ' ' || c == '\t';
}

/* One `; key=value` parameter list, as Content-Type and Content-Disposition
 * write them: the value of `key` (a token, or a quoted string without
 * backslashes) into *v, *vn. 1 when found, 0 when absent, -1 when malformed. */
static int param_of(const char *p, size_t n, const char *key, const char **v, size_t *vn) {
  size_t kl = strlen(key), i = 0;
  while (i < n) {
    while (i < n && p[i] != ';' && p[i] != '"')
      i++;
    if (i < n && p[i] == '"') { /* a quoted value of another parameter: skip it whole */
      const char *q = memchr(p + i + 1, '"', n - i - 1);
      if (!q) return -1;
      i = (size_t)(q - p) + 1;
      continue;
    }
    if (i >= n) break;
    i++; /* past ';' */
    while (i < n && is_ws(p[i]))
      i++;
    size_t k0 = i;
    while (i < n && p[i] != '=' && p[i] != ';' && !is_ws(p[i]))
      i++;
    int hit = i - k0 == kl && fe_http_str_eq_nocase(p + k0, kl, key);
    while (i < n && is_ws(p[i]))
      i++;
    if (i >= n || p[i] != '=') continue;
    i++;
    while (i < n && is_ws(p[i]))
      i++;
    size_t v0 = i, v1;
    if (i < n && p[i] == '"') {
      const char *q = memchr(p + i + 1, '"', n - i - 1);
      if (!q) return -1;
      v0 = i + 1;
      v1 = (size_t)(q - p);
      if (memchr(p + v0, '\\', v1 - v0)) return -1;
      i = v1 + 1;
    } else {
      while (i < n && p[i] != ';' && !is_ws(p[i]))
        i++;
      v1 = i;
    }
    if (hit) {
      *v = p + v0;
      *vn = v1 - v0;
      return 1;
    }
  }
  return 0;
}

/* The next "\r\n--" boundary at or after `from`; NULL when none. */
static const char *next_delim(const char *from, const char *end, const char *b, size_t bl) {
  while (from < end) {
    const char *p = memmem(from, (size_t)(end - from), "\r\n--", 4);
    if (!p) return NULL;
    if ((size_t)(end - p) >= 4 + bl && memcmp(p + 4, b, bl) == 0) return p;
    from = p + 1;
  }
  return NULL;
}

/* A part's header block [h, he): its Content-Disposition's name and filename
 * and its Content-Type. */
static int part_headers(const char *h, const char *he, struct fe_form_part *pt, size_t idx,
                        char *err, size_t errlen) {
  int disp = 0;
  while (h < he) {
    const char *eol = memmem(h, (size_t)(he - h), "\r\n", 2);
    const char *le = eol ? eol : he;
    const char *colon = memchr(h, ':', (size_t)(le - h));
    if (!colon)
      return cm_fail(err, errlen, CM_ERR_INVAL, "multipart part %zu: a header line without ':'",
                     idx);
    const char *v = colon + 1;
    while (v < le && is_ws(*v))
      v++;
    size_t vn = (size_t)(le - v);
    while (vn && is_ws(v[vn - 1]))
      vn--;
    size_t nn = (size_t)(colon - h);
    if (fe_http_str_eq_nocase(h, nn, "content-disposition")) {
      if (vn < 9 || !fe_http_str_eq_nocase(v, 9, "form-data") ||
          (vn > 9 && v[9] != ';' && !is_ws(v[9])))
        return cm_fail(err, errlen, CM_ERR_INVAL,
                       "multipart part %zu: Content-Disposition is not form-data", idx);
      if (param_of(v, vn, "name", &pt->name, &pt->name_len) != 1)
        return cm_fail(err, errlen, CM_ERR_INVAL,
                       "multipart part %zu: Content-Disposition has no name", idx);
      if (param_of(v, vn, "filename", &pt->filename, &pt->filename_len) < 0)
        return cm_fail(err, errlen, CM_ERR_INVAL,
                       "multipart part %zu: a malformed filename parameter", idx);
      disp = 1;
    } else if (fe_http_str_eq_nocase(h, nn, "content-type")) {
      pt->ctype = v;
      pt->ctype_len = vn;
    }
    h = eol ? eol + 2 : he;
  }
  if (!disp)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "multipart part %zu has no Content-Disposition: form-data; name=...", idx);
  return 0;
}

int fe_multipart_parse(const char *ctype, size_t ctype_len, const char *body, size_t len,
                       struct fe_form_part *parts, size_t max, size_t *n, char *err,
                       size_t errlen) {
  *n = 0;
  static const char mt[] = "multipart/form-data";
  const size_t ml = sizeof(mt) - 1;
  if (!ctype || ctype_len < ml || !fe_http_str_eq_nocase(ctype, ml, mt) ||
      (ctype_len > ml && ctype[ml] != ';' && !is_ws(ctype[ml])))
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "the body must be multipart/form-data (Content-Type: multipart/form-data; "
                   "boundary=...)");
  const char *b;
  size_t bl;
  int got = param_of(ctype + ml, ctype_len - ml, "boundary", &b, &bl);
  if (got != 1 || bl == 0 || bl > MAX_BOUNDARY)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "multipart/form-data needs a boundary parameter of 1 to %d characters",
                   MAX_BOUNDARY);
  const char *end = body + len, *p;
  /* the first delimiter: at the very start, or after a preamble's CRLF */
  if (len >= 2 + bl && body[0] == '-' && body[1] == '-' && memcmp(body + 2, b, bl) == 0)
    p = body;
  else if ((p = next_delim(body, end, b, bl)) != NULL)
    p += 2;
  else
    return cm_fail(err, errlen, CM_ERR_INVAL, "multipart body without its boundary");
  for (;;) { /* p: at "--" boundary */
    const char *q = p + 2 + bl;
    if (end - q >= 2 && q[0] == '-' && q[1] == '-') return 0; /* the closing delimiter */
    while (q < end && is_ws(*q))
      q++;
    if (end - q < 2 || q[0] != '\r' || q[1] != '\n')
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     end - q < 2 ? "multipart body ends without its closing boundary"
                                 : "multipart boundary not followed by CRLF");
    q += 2;
    if (*n == max)
      return cm_fail(err, errlen, CM_ERR_TOOBIG, "multipart body with more than %zu parts", max);
    struct fe_form_part *pt = &parts[*n];
    memset(pt, 0, sizeof(*pt));
    const char *d = next_delim(q, end, b, bl);
    if (!d)
      return cm_fail(err, errlen, CM_ERR_INVAL, "multipart body ends without its closing boundary");
    const char *he; /* the headers' end: the data begins after its CRLF CRLF */
    if (d - q >= 2 && q[0] == '\r' && q[1] == '\n')
      he = q; /* no headers at all */
    else if (!(he = memmem(q, (size_t)(d - q), "\r\n\r\n", 4)))
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "multipart part %zu: its headers do not end before the next boundary", *n);
    int rc = part_headers(q, he, pt, *n, err, errlen);
    if (rc) return rc;
    pt->data = he + (he == q ? 2 : 4); /* <= d: the CRLF CRLF lies before it */
    pt->len = (size_t)(d - pt->data);
    (*n)++;
    p = d + 2;
  }
}

const struct fe_form_part *fe_form_find(const struct fe_form_part *parts, size_t n,
                                        const char *name) {
  size_t nl = strlen(name);
  for (size_t i = 0; i < n; i++)
    if (parts[i].name_len == nl && memcmp(parts[i].name, name, nl) == 0) return &parts[i];
  return NULL;
}
