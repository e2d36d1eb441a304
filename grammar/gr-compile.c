/* gr-compile.c — gr_compile: each kind's front end emits into one NFA, which
 * gr-dfa.c turns into the grammar; the grammar's hash and its release. */
#include <stdio.h>
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

static int build(struct gr_nfa *n, enum gr_kind kind, const char *text, size_t len, int depth);

/* GR_AFTER_SPAN: "OPEN CLOSE KIND\n" then the inner constraint's text. The inner
 * constraint is built as rule 0 (every front end's root), moved to a rule of its
 * own, and rule 0 becomes: (OPEN any-text CLOSE)? inner. */
static int build_after_span(struct gr_nfa *n, const char *text, size_t len, int depth) {
  const char *nl = memchr(text, '\n', len);
  unsigned long open = 0, close = 0, kind = 0;
  char head[64];
  size_t hl = nl ? (size_t)(nl - text) : 0;
  int got = 0;
  if (nl && hl < sizeof(head)) {
    memcpy(head, text, hl);
    head[hl] = 0;
    int used = 0;
    got = sscanf(head, "%lu %lu %lu%n", &open, &close, &kind, &used) == 3 && (size_t)used == hl;
  }
  if (!got || open > GR_TOKEN_MAX || close > GR_TOKEN_MAX || kind == GR_AFTER_SPAN)
    return gr_nfa_fail(n, CM_ERR_INVAL,
                       "grammar: an after-span constraint starts with \"OPEN CLOSE KIND\\n\"");
  int rc = build(n, (enum gr_kind)kind, nl + 1, len - hl - 1, depth + 1);
  if (rc) return rc;
  uint32_t inner = gr_nfa_rule(n);
  if (n->rc) return n->rc;
  uint32_t t = n->rule_start[0];
  n->rule_start[0] = n->rule_start[inner], n->rule_start[inner] = t;
  t = n->rule_final[0];
  n->rule_final[0] = n->rule_final[inner], n->rule_final[inner] = t;
  for (size_t i = 0; i < n->n_e; i++) /* recursion back to the root: to the inner root */
    if (n->e[i].kind == GR_E_CALL && n->e[i].callee == 0) n->e[i].callee = inner;
  uint32_t mid = gr_nfa_state(n), span = gr_nfa_state(n);
  uint8_t b[GR_TOKEN_LEN];
  gr_nfa_eps(n, n->rule_start[0], mid);
  gr_token_bytes((int32_t)open, b);
  gr_nfa_lit(n, n->rule_start[0], span, (const char *)b, sizeof(b));
  gr_nfa_cps(n, span, span, 0, 0x10ffff);
  gr_token_bytes((int32_t)close, b);
  gr_nfa_lit(n, span, mid, (const char *)b, sizeof(b));
  gr_nfa_call(n, mid, n->rule_final[0], inner);
  return n->rc;
}

static int build(struct gr_nfa *n, enum gr_kind kind, const char *text, size_t len, int depth) {
  switch (kind) {
  case GR_REGEX: {
    uint32_t r = gr_nfa_rule(n);
    gr_regex_emit(n, text, len, GR_RX_FULL, 0, n->rule_start[r], n->rule_final[r], "regex");
    return n->rc;
  }
  case GR_CHOICE: return gr_choice_build(n, text, len);
  case GR_JSON_OBJECT: return gr_json_object_build(n);
  case GR_JSON_SCHEMA: return gr_schema_build(n, text, len);
  case GR_GRAMMAR: return gr_ebnf_build(n, text, len);
  case GR_AFTER_SPAN:
    if (!depth) return build_after_span(n, text, len, depth);
    /* fall through */
  default: return gr_nfa_fail(n, CM_ERR_INVAL, "grammar: unknown kind %d", (int)kind);
  }
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
  int rc = build(&n, kind, text, len, 0);
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
  gr_alpha_cache_free(g->alpha_cache);
  gr_plain_free(g);
  pthread_mutex_destroy(&g->lock);
  free(g);
}

uint64_t gr_grammar_hash(const struct gr_grammar *g) {
  return g->hash;
}
