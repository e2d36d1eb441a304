/* gr-schema-impl.h — what the JSON Schema compiler's files share: the
 * compiler's state and its error helper. Not for other modules. */
#ifndef LMSERVE_GR_SCHEMA_IMPL_H
#define LMSERVE_GR_SCHEMA_IMPL_H
#include <jansson.h>

#include "grammar/gr-impl.h"

#define SC_MAX_DEPTH 64   /* nested subschemas (without going through a rule) */
#define SC_MAX_PATH  512  /* bytes of a JSON pointer in messages */
#define SC_MAX_RULES 1024 /* subschemas that became rules */

struct sc_rule {
  const json_t *schema;
  uint32_t rule;
};

struct sc {
  struct gr_nfa *n;
  json_t *root;
  struct sc_rule *rules;
  uint32_t n_rules, cap_rules;
  json_t *keep; /* merged schemas (allOf) made here, freed at the end */
  int depth;
  const json_t *inlined[SC_MAX_DEPTH + 1]; /* $ref targets being inlined (anyOf) */
  int n_inlined;
};

/* Fails with "json_schema: keyword 'kw' at path is not supported (why)". */
int gr_sc_fail(struct sc *c, const char *path, const char *kw, const char *why);
/* Scalars (gr-schema-scalar.c): integers / numbers with their bounds and
 * multipleOf, strings with lengths, pattern and format. */
void gr_sc_numeric(struct sc *c, const json_t *s, const char *path, int integer, uint32_t from,
                   uint32_t to);
void gr_sc_string(struct sc *c, const json_t *s, const char *path, uint32_t from, uint32_t to);

#endif
