/* gr-schema.c — JSON Schema to grammar (placeholder until the compiler lands). */
#include "common/cm-err.h"
#include "grammar/gr-impl.h"

int gr_schema_build(struct gr_nfa *n, const char *text, size_t len) {
  (void)text;
  (void)len;
  return gr_nfa_fail(n, CM_ERR_INVAL, "json_schema: not supported yet");
}
