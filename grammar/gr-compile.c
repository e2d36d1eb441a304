/* gr-compile.c — gr_compile: each kind's front end emits into one NFA, which
 * gr-dfa.c turns into the grammar; the grammar's hash and its release. */
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-hash.h"
#include "grammar/gr-impl.h"

#define GR_MAX_TEXT (1u << 20) /* bytes of a pattern, choice list or schema */

static uint64_t text_hash(enum gr_kind kind, const char *text, size_t len) {
  uint64_t h = cm_mix64(0x6772616d6d6172ull ^ (uint64_t)kind);
  if (kind == GR_JSON_OBJECT) return h;
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t w;
    memcpy(&w, text + i, 8);
    h = cm_mix64(h ^ w) + i;
  }
  uint64_t w = 0;
  memcpy(&w, text + i, len - i);
  return cm_mix64(h ^ w ^ ((uint64_t)len << 56));
}

int gr_compile(enum gr_kind kind, const char *text, size_t len, struct gr_grammar **out, char *err,
               size_t errlen) {
  *out = NULL;
  if (err && errlen) err[0] = 0;
  if (!text && len) return cm_fail(err, errlen, CM_ERR_INVAL, "grammar: no text");
  if (len > GR_MAX_TEXT)
    return cm_fail(err, errlen, CM_ERR_TOOBIG, "grammar: text longer than %u bytes", GR_MAX_TEXT);
  struct gr_nfa n;
  gr_nfa_init(&n, err, errlen);
  int rc;
  switch (kind) {
  case GR_REGEX: {
    uint32_t r = gr_nfa_rule(&n);
    gr_regex_emit(&n, text, len, GR_RX_FULL, 0, n.rule_start[r], n.rule_final[r], "regex");
    rc = n.rc;
    break;
  }
  case GR_CHOICE: rc = gr_choice_build(&n, text, len); break;
  case GR_JSON_OBJECT: rc = gr_json_object_build(&n); break;
  case GR_JSON_SCHEMA: rc = gr_schema_build(&n, text, len); break;
  case GR_GRAMMAR: rc = gr_ebnf_build(&n, text, len); break;
  default: rc = gr_nfa_fail(&n, CM_ERR_INVAL, "grammar: unknown kind %d", (int)kind); break;
  }
  struct gr_grammar *g = NULL;
  if (!rc) {
    g = calloc(1, sizeof *g);
    if (!g) rc = gr_nfa_fail(&n, CM_ERR_NOMEM, "grammar: out of memory");
  }
  if (!rc) {
    pthread_mutex_init(&g->lock, NULL);
    g->kind = kind;
    g->hash = text_hash(kind, text, len);
    rc = gr_determinize(&n, g);
  }
  gr_nfa_free(&n);
  if (rc) {
    gr_grammar_free(g);
    return rc;
  }
  *out = g;
  return 0;
}

void gr_grammar_free(struct gr_grammar *g) {
  if (!g) return;
  free(g->delta);
  free(g->flags);
  free(g->call_off);
  free(g->calls);
  gr_mask_cache_free(g->cache);
  free(g->reach);
  free(g->wall);
  free(g->loop);
  pthread_mutex_destroy(&g->lock);
  free(g);
}

uint64_t gr_grammar_hash(const struct gr_grammar *g) {
  return g->hash;
}
