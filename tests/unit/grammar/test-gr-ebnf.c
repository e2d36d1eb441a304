/* test-gr-ebnf.c — GBNF grammars (GR_GRAMMAR): texts taken and refused,
 * recursion, quantifiers, escapes, comments and continuation lines; random
 * walks of an arithmetic grammar parsed by Python's own parser; masks equal
 * accept_token; errors with their offsets. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "grammar/gr.h"
#include "tests/harness/th.h"
#include "tests/unit/grammar/gt-util.h"

static const char *arith = "# arithmetic\n"
                           "root   ::= expr\n"
                           "expr   ::= term ((\"+\" | \"-\") term)*\n"
                           "term   ::= factor ((\"*\" | \"/\") factor)*\n"
                           "factor ::= num\n"
                           "         | \"(\" expr \")\"   # nested\n"
                           "num    ::= \"0\" | [1-9] [0-9]{0,3}\n";

static int takes(const struct gr_grammar *g, const char *t) {
  struct gr_matcher *m = gr_matcher_new(g);
  int ok =
      gr_matcher_accept_bytes(m, (const uint8_t *)t, strlen(t)) == 0 && gr_matcher_is_accepting(m);
  gr_matcher_free(m);
  return ok;
}

static struct gr_grammar *compile(const char *t) {
  struct gr_grammar *g = NULL;
  char err[256];
  if (gr_compile(GR_GRAMMAR, t, strlen(t), &g, err, sizeof err)) fprintf(stderr, "  %s\n", err);
  return g;
}

TH_TEST(ebnf_arithmetic) {
  struct gr_grammar *g = compile(arith);
  TH_REQUIRE(g);
  TH_CHECK(takes(g, "1+2*(3-4)"));
  TH_CHECK(takes(g, "((7))"));
  TH_CHECK(takes(g, "0"));
  TH_CHECK(takes(g, "1234/(5+(6*(7-8)))"));
  TH_CHECK(!takes(g, "1+"));
  TH_CHECK(!takes(g, "(1"));
  TH_CHECK(!takes(g, "1++2"));
  TH_CHECK(!takes(g, "01"));
  TH_CHECK(!takes(g, "12345"));
  TH_CHECK(!takes(g, ""));
  gr_grammar_free(g);
}

TH_TEST(ebnf_notation) {
  struct gr_grammar *g = compile("root ::= \"[\" ws (item (ws \",\" ws item)*)? ws \"]\"\n"
                                 "item ::= \"\\\"\" [^\"\\\\\\n]* \"\\\"\" | \"\\u00e9\"{2} | x?\n"
                                 "x ::= \"a\"+ \"\\x62\"\n"
                                 "ws ::= [ \\t]{0,2}\n");
  TH_REQUIRE(g);
  TH_CHECK(takes(g, "[]"));
  TH_CHECK(takes(g, "[ \"ab\", \xc3\xa9\xc3\xa9,aab ]"));
  TH_CHECK(takes(g, "[\"\"]"));
  TH_CHECK(takes(g, "[,]")); /* item may be empty (x?) */
  TH_CHECK(!takes(g, "[\xc3\xa9]"));
  TH_CHECK(!takes(g, "[\"a\nb\"]"));
  TH_CHECK(!takes(g, "[     ]"));
  gr_grammar_free(g);
}

static void expect_err(const char *t, int code, const char *msg) {
  struct gr_grammar *g = NULL;
  char err[256] = "";
  int rc = gr_compile(GR_GRAMMAR, t, strlen(t), &g, err, sizeof err);
  if (rc != code || !strstr(err, msg))
    th_fail(__FILE__, __LINE__, "%s: rc %d '%s' (want %d '%s')", t, rc, err, code, msg);
  TH_CHECK(g == NULL);
  gr_grammar_free(g);
}

TH_TEST(ebnf_errors) {
  expect_err("root ::= a\n", CM_ERR_INVAL, "rule 'a' used at 9 is not defined");
  expect_err("start ::= \"x\"\n", CM_ERR_INVAL, "no 'root' rule");
  expect_err("root ::= \"x\n", CM_ERR_INVAL, "unterminated string at 9");
  expect_err("root ::= \"x\" ; \"y\"\n", CM_ERR_INVAL, "unexpected character at 13");
  expect_err("root ::= \"x\"\nroot ::= \"y\"\n", CM_ERR_INVAL, "rule defined twice at 13");
  expect_err("root ::= (\"x\"\n", CM_ERR_INVAL, "unbalanced '(' at 9");
  expect_err("root ::= \"x\"{1,100000}\n", CM_ERR_TOOBIG, "repetition count");
  expect_err("root ::= [a-\n", CM_ERR_INVAL, "unterminated character class");
  expect_err("root = \"x\"\n", CM_ERR_INVAL, "expected '::='");
  /* left recursion is not refused: the stack bound keeps it finite */
  struct gr_grammar *g = compile("root ::= root \"x\" | \"y\"\n");
  TH_REQUIRE(g);
  TH_CHECK(takes(g, "y") && takes(g, "yxx") && !takes(g, "x"));
  gr_grammar_free(g);
  char deep[700];
  size_t k = (size_t)snprintf(deep, sizeof deep, "root ::= ");
  for (int i = 0; i < 200; i++)
    deep[k++] = '(';
  deep[k++] = '"', deep[k++] = 'x', deep[k++] = '"';
  for (int i = 0; i < 200; i++)
    deep[k++] = ')';
  deep[k] = 0;
  expect_err(deep, CM_ERR_TOOBIG, "nested deeper");
}

TH_TEST(ebnf_walks_parse_in_python) {
  struct gr_grammar *g = compile(arith);
  TH_REQUIRE(g);
  uint64_t rng = 5;
  json_t *arr = json_array();
  for (int i = 0; i < 200; i++) {
    struct gr_matcher *m = gr_matcher_new(g);
    char buf[400];
    if (gt_walk(m, &rng, buf, sizeof buf, 40) > 0) json_array_append_new(arr, json_string(buf));
    gr_matcher_free(m);
  }
  size_t n = json_array_size(arr);
  TH_CHECK(n > 50);
  char *in = json_dumps(arr, JSON_COMPACT);
  json_decref(arr);
  gr_grammar_free(g);
  if (!gt_have("python3")) {
    free(in);
    TH_SKIP("python3 is missing: no oracle");
  }
  char *out = gt_run("python3 -c 'import ast,json,sys; xs=json.load(sys.stdin); "
                     "print(sum(1 for x in xs if ast.parse(x, mode=\"eval\")))'",
                     in);
  free(in);
  TH_REQUIRE(out != NULL); /* a SyntaxError makes python exit non-zero */
  TH_CHECK_EQ_INT(strtol(out, NULL, 10), (long)n);
  free(out);
}

TH_TEST(ebnf_mask_equals_accept) {
  struct gr_grammar *g = compile(arith);
  struct gr_vocab *v = gt_vocab_toy();
  TH_REQUIRE(g && v);
  int32_t n = gr_vocab_size(v);
  uint32_t bits[64];
  uint64_t rng = 9;
  size_t bad = 0;
  for (int st = 0; st < 30; st++) {
    struct gr_matcher *m = gr_matcher_new(g);
    char buf[64];
    struct gr_matcher *w = gr_matcher_new(g);
    int k = gt_walk(w, &rng, buf, sizeof buf, 10);
    gr_matcher_free(w);
    if (k > 0)
      gr_matcher_accept_bytes(m, (const uint8_t *)buf, (size_t)(gt_rand(&rng) % (uint64_t)k));
    TH_REQUIRE(gr_matcher_mask(m, v, bits) == 0);
    struct gr_matcher *c = gr_matcher_clone(m);
    for (int32_t id = 0; id < n; id++) {
      TH_REQUIRE(gr_matcher_copy(c, m) == 0);
      int ok = gr_matcher_accept_token(c, v, id) == 0;
      if (ok != (int)(bits[id >> 5] >> (id & 31) & 1) && bad++ < 5)
        th_fail(__FILE__, __LINE__, "state %d token %d", st, id);
    }
    gr_matcher_free(c);
    gr_matcher_free(m);
  }
  TH_CHECK_EQ_INT(bad, 0);
  gr_vocab_free(v);
  gr_grammar_free(g);
}

/* Random texts from GBNF pieces: compiled or refused with a message, never a
 * crash; what compiles is matched and masked. */
TH_TEST(ebnf_random_never_crash) {
  static const char *bits_of[] = {"root ::= ", "a ::= ", "\n", " ",    "\"x\"", "\"\\n\"", "[a-c]",
                                  "[^x]",      "(",      ")",  "|",    "*",     "+",       "?",
                                  "{2}",       "{1,3}",  "a",  "root", "#c\n",  ".",       "\"",
                                  "[",         "::=",    "{",  "\\"};
  struct gr_vocab *v = gt_vocab_toy();
  TH_REQUIRE(v);
  uint32_t mask[64];
  uint64_t rng = 77;
  int ok = 0, refused = 0;
  for (int it = 0; it < 3000; it++) {
    char t[256];
    size_t k = (size_t)snprintf(t, sizeof t, "root ::= ");
    int n = 1 + (int)(gt_rand(&rng) % 14);
    for (int i = 0; i < n; i++) {
      const char *b = bits_of[gt_rand(&rng) % (sizeof bits_of / sizeof bits_of[0])];
      size_t l = strlen(b);
      if (k + l >= sizeof t) break;
      memcpy(t + k, b, l);
      k += l;
    }
    t[k] = 0;
    struct gr_grammar *g = NULL;
    char err[256] = "";
    if (gr_compile(GR_GRAMMAR, t, k, &g, err, sizeof err)) {
      refused++;
      TH_CHECK(err[0] != 0 && g == NULL);
      continue;
    }
    ok++;
    struct gr_matcher *m = gr_matcher_new(g);
    TH_REQUIRE(m);
    TH_CHECK(gr_matcher_mask(m, v, mask) == 0);
    char buf[64];
    gt_walk(m, &rng, buf, sizeof buf, 30);
    gr_matcher_free(m);
    gr_grammar_free(g);
  }
  fprintf(stderr, "  %d compiled, %d refused\n", ok, refused);
  TH_CHECK(ok > 100 && refused > 100);
  gr_vocab_free(v);
}
