/* tk-json.h — a small pull scanner over a JSON text held in memory.
 *
 * tokenizer.json is 33 MB with 262144 vocab entries and ~515k merges: a
 * generic DOM parser spends most of a second building objects we throw
 * away. This scanner walks the text in place, decoding one string at a time
 * into a reusable buffer, so the loader streams vocab and merges straight
 * into its own tables and hands only the small sections to Jansson.
 *
 * Every function returns 0 or a negative cm_err (CM_ERR_PARSE with the byte
 * offset kept in `err_off`); nesting is capped at TK_JSON_MAX_DEPTH. */
#ifndef LMSERVE_TK_JSON_H
#define LMSERVE_TK_JSON_H
#include <stddef.h>
#include <stdint.h>

#define TK_JSON_MAX_DEPTH 64

struct tk_json {
  const char *start; /* the whole text */
  const char *p;     /* cursor */
  const char *end;   /* one past the last byte */
  char *sbuf;        /* decoded string scratch (owned, grown) */
  size_t scap;       /* bytes */
  size_t err_off;    /* byte offset of the first error */
};

void tk_json_init(struct tk_json *t, const char *text, size_t len);
void tk_json_free(struct tk_json *t);

/* Next non-space byte without consuming it, or 0 at the end. */
char tk_json_peek(struct tk_json *t);
/* Consumes `c` (after spaces) or fails. */
int tk_json_expect(struct tk_json *t, char c);
/* Inside an object or array after its first element: consumes ',' and
 * returns 1, or consumes `close` and returns 0. */
int tk_json_more(struct tk_json *t, char close);
/* Reads a string; *s points to the decoded bytes (valid until the next call;
 * either into the text or into sbuf), *len is its length. NUL terminated. */
int tk_json_string(struct tk_json *t, const char **s, size_t *len);
/* Reads an integer that fits int64. */
int tk_json_int(struct tk_json *t, int64_t *v);
/* Reads `null` and returns 1, or returns 0 leaving the cursor as it was. */
int tk_json_null(struct tk_json *t);
/* Skips one value of any kind; *vstart / *vlen (may be NULL) receive its
 * raw text span, for handing to a DOM parser. */
int tk_json_skip(struct tk_json *t, const char **vstart, size_t *vlen);

#endif
