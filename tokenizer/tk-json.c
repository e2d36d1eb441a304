/* tk-json.c — the in-place JSON pull scanner used to load tokenizer.json
 * quickly (see tk-json.h). Strings are checked for valid escapes;
 * \uXXXX escapes (with surrogate pairs) are decoded to UTF-8. */
#include "tokenizer/tk-json.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-grow.h"
#include "common/cm-hex.h"

void tk_json_init(struct tk_json *t, const char *text, size_t len) {
  memset(t, 0, sizeof *t);
  t->start = text;
  t->p = text;
  t->end = text + len;
}

void tk_json_free(struct tk_json *t) {
  free(t->sbuf);
  t->sbuf = NULL;
  t->scap = 0;
}

static int tj_fail(struct tk_json *t) {
  if (!t->err_off) t->err_off = (size_t)(t->p - t->start);
  return CM_ERR_PARSE;
}

static void tj_ws(struct tk_json *t) {
  while (t->p < t->end && (*t->p == ' ' || *t->p == '\n' || *t->p == '\r' || *t->p == '\t'))
    t->p++;
}

char tk_json_peek(struct tk_json *t) {
  tj_ws(t);
  return t->p < t->end ? *t->p : 0;
}

int tk_json_expect(struct tk_json *t, char c) {
  tj_ws(t);
  if (t->p >= t->end || *t->p != c) return tj_fail(t);
  t->p++;
  return 0;
}

int tk_json_more(struct tk_json *t, char close) {
  tj_ws(t);
  if (t->p >= t->end) return tj_fail(t);
  if (*t->p == ',') {
    t->p++;
    return 1;
  }
  if (*t->p == close) {
    t->p++;
    return 0;
  }
  return tj_fail(t);
}

static int tj_hex4(const char *p, uint32_t *v) {
  uint32_t x = 0;
  for (int i = 0; i < 4; i++) {
    int d = cm_hex_digit((unsigned char)p[i]);
    if (d < 0) return -1;
    x = x << 4 | (uint32_t)d;
  }
  *v = x;
  return 0;
}

static size_t tj_put_utf8(char *o, uint32_t cp) {
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (char)(0xC0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xE0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (char)(0xF0 | (cp >> 18));
  o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  o[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

int tk_json_string(struct tk_json *t, const char **s, size_t *len) {
  tj_ws(t);
  if (t->p >= t->end || *t->p != '"') return tj_fail(t);
  const char *q = t->p + 1;
  /* fast path: no escapes, the string is returned in place; the caller
   * gets a NUL-terminated copy only when it needs one (see below) */
  const char *r = q;
  while (r < t->end && *r != '"' && *r != '\\' && (unsigned char)*r >= 0x20) r++;
  if (r >= t->end) return tj_fail(t);
  size_t n = (size_t)(r - q);
  if (*r == '"') {
    if (cm_grow(&t->sbuf, &t->scap, n + 1, 256)) return CM_ERR_NOMEM;
    memcpy(t->sbuf, q, n);
    t->sbuf[n] = 0;
    *s = t->sbuf;
    *len = n;
    t->p = r + 1;
    return 0;
  }
  /* slow path: decode escapes; output never exceeds input length */
  const char *e = r;
  while (e < t->end && *e != '"') {
    if (*e == '\\') e++;
    e++;
  }
  if (e >= t->end) return tj_fail(t);
  if (cm_grow(&t->sbuf, &t->scap, (size_t)(e - q) + 1, 256)) return CM_ERR_NOMEM;
  char *o = t->sbuf;
  const char *i = q;
  while (i < e) {
    unsigned char c = (unsigned char)*i;
    if (c < 0x20) {
      t->p = i;
      return tj_fail(t);
    }
    if (c != '\\') {
      *o++ = (char)c;
      i++;
      continue;
    }
    i++;
    if (i >= e) return tj_fail(t);
    switch (*i) {
    case '"': *o++ = '"'; break;
    case '\\': *o++ = '\\'; break;
    case '/': *o++ = '/'; break;
    case 'b': *o++ = '\b'; break;
    case 'f': *o++ = '\f'; break;
    case 'n': *o++ = '\n'; break;
    case 'r': *o++ = '\r'; break;
    case 't': *o++ = '\t'; break;
    case 'u': {
      uint32_t cp, lo;
      if (e - i < 5 || tj_hex4(i + 1, &cp)) {
        t->p = i;
        return tj_fail(t);
      }
      i += 4;
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (e - i < 7 || i[1] != '\\' || i[2] != 'u' || tj_hex4(i + 3, &lo) || lo < 0xDC00 ||
            lo > 0xDFFF) {
          t->p = i;
          return tj_fail(t);
        }
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        i += 6;
      } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
        t->p = i;
        return tj_fail(t);
      }
      o += tj_put_utf8(o, cp);
      break;
    }
    default:
      t->p = i;
      return tj_fail(t);
    }
    i++;
  }
  *o = 0;
  *s = t->sbuf;
  *len = (size_t)(o - t->sbuf);
  t->p = e + 1;
  return 0;
}

int tk_json_int(struct tk_json *t, int64_t *v) {
  tj_ws(t);
  const char *q = t->p;
  int neg = 0;
  if (q < t->end && *q == '-') {
    neg = 1;
    q++;
  }
  if (q >= t->end || *q < '0' || *q > '9') return tj_fail(t);
  int64_t x = 0;
  while (q < t->end && *q >= '0' && *q <= '9') {
    if (x > (INT64_MAX - 9) / 10) return tj_fail(t);
    x = x * 10 + (*q - '0');
    q++;
  }
  if (q < t->end && (*q == '.' || *q == 'e' || *q == 'E')) {
    t->p = q;
    return tj_fail(t);
  }
  t->p = q;
  *v = neg ? -x : x;
  return 0;
}

int tk_json_null(struct tk_json *t) {
  tj_ws(t);
  if (t->end - t->p >= 4 && !memcmp(t->p, "null", 4)) {
    t->p += 4;
    return 1;
  }
  return 0;
}

static int tj_skip_string(struct tk_json *t) {
  const char *q = t->p + 1;
  for (;;) {
    q = q < t->end ? memchr(q, '"', (size_t)(t->end - q)) : NULL;
    if (!q) return tj_fail(t);
    /* escaped when preceded by an odd number of backslashes */
    size_t bs = 0;
    while (q - bs > t->p + 1 && q[-1 - (ptrdiff_t)bs] == '\\') bs++;
    if (!(bs & 1)) break;
    q++;
  }
  t->p = q + 1;
  return 0;
}

/* Skips a value iteratively: strings are skipped as a whole, brackets are
 * counted against a small stack so mismatches are caught. */
int tk_json_skip(struct tk_json *t, const char **vstart, size_t *vlen) {
  char stack[TK_JSON_MAX_DEPTH];
  int depth = 0;
  tj_ws(t);
  const char *s0 = t->p;
  do {
    tj_ws(t);
    if (t->p >= t->end) return tj_fail(t);
    char c = *t->p;
    if (c == '"') {
      if (tj_skip_string(t)) return CM_ERR_PARSE;
    } else if (c == '{' || c == '[') {
      if (depth == TK_JSON_MAX_DEPTH) return tj_fail(t);
      stack[depth++] = c == '{' ? '}' : ']';
      t->p++;
    } else if (c == '}' || c == ']') {
      if (!depth || stack[depth - 1] != c) return tj_fail(t);
      depth--;
      t->p++;
    } else if (c == ',' || c == ':') {
      if (!depth) return tj_fail(t);
      t->p++;
    } else {
      const char *q = t->p;
      while (q < t->end && (*q == '-' || *q == '+' || *q == '.' || (*q >= '0' && *q <= '9') ||
                            (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z')))
        q++;
      if (q == t->p) return tj_fail(t);
      t->p = q;
    }
  } while (depth > 0);
  if (vstart) *vstart = s0;
  if (vlen) *vlen = (size_t)(t->p - s0);
  return 0;
}
