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
  return gt_takes(g, t, strlen(t));
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

TH_TEST(ebnf_errors) {
  gt_expect_err(GR_GRAMMAR, "root ::= a\n", CM_ERR_INVAL, "rule 'a' used at 9 is not defined");
  gt_expect_err(GR_GRAMMAR, "start ::= \"x\"\n", CM_ERR_INVAL, "no 'root' rule");
  gt_expect_err(GR_GRAMMAR, "root ::= \"x\n", CM_ERR_INVAL, "unterminated string at 9");
  gt_expect_err(GR_GRAMMAR, "root ::= \"x\" ; \"y\"\n", CM_ERR_INVAL, "unexpected character at 13");
  gt_expect_err(GR_GRAMMAR, "root ::= \"x\"\nroot ::= \"y\"\n", CM_ERR_INVAL,
                "rule defined twice at 13");
  gt_expect_err(GR_GRAMMAR, "root ::= (\"x\"\n", CM_ERR_INVAL, "unbalanced '(' at 9");
  gt_expect_err(GR_GRAMMAR, "root ::= \"x\"{1,100000}\n", CM_ERR_TOOBIG, "repetition count");
  gt_expect_err(GR_GRAMMAR, "root ::= [a-\n", CM_ERR_INVAL, "unterminated character class");
  gt_expect_err(GR_GRAMMAR, "root = \"x\"\n", CM_ERR_INVAL, "expected '::='");
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
  gt_expect_err(GR_GRAMMAR, deep, CM_ERR_TOOBIG, "nested deeper");
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
      gr_matcher_accept_bytes(m, (const uint8_t *)buf, (size_t)(cm_splitmix64(&rng) % (uint64_t)k));
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
  gt_random_texts(GR_GRAMMAR, "root ::= ", bits_of, sizeof bits_of / sizeof bits_of[0], 14, 77);
}

/* A vocabulary of a few texts and two control tokens spelled as gr.h says. */
static struct gr_vocab *vocab_with_tokens(void) {
  static const char *const words[] = {"a", "b", "{", "}", "\"", ":", "x", "1", "<", "|", ">"};
  enum { NW = sizeof(words) / sizeof(words[0]) };
  uint8_t tok[2][GR_TOKEN_LEN];
  const uint8_t *bytes[NW + 3];
  uint32_t lens[NW + 3];
  for (int i = 0; i < NW; i++)
    bytes[i] = (const uint8_t *)words[i], lens[i] = (uint32_t)strlen(words[i]);
  gr_token_bytes(100, tok[0]);
  gr_token_bytes(70000, tok[1]);
  bytes[NW] = tok[0], lens[NW] = GR_TOKEN_LEN;         /* id NW: special token 100 */
  bytes[NW + 1] = tok[1], lens[NW + 1] = GR_TOKEN_LEN; /* id NW + 1: special token 70000 */
  bytes[NW + 2] = (const uint8_t *)"", lens[NW + 2] = 0;
  struct gr_vocab *v = NULL;
  return gr_vocab_create(bytes, lens, NW + 3, &v) ? NULL : v;
}

static int bit(const uint32_t *bits, int i) {
  return (int)(bits[i / 32] >> (i % 32) & 1);
}

TH_TEST(ebnf_special_tokens) {
  struct gr_grammar *g = compile("root ::= <[100]> \"a\"* <[70000]>");
  TH_REQUIRE(g);
  uint8_t t0[GR_TOKEN_LEN], t1[GR_TOKEN_LEN];
  gr_token_bytes(100, t0);
  gr_token_bytes(70000, t1);
  char s[16];
  memcpy(s, t0, 4), memcpy(s + 4, "aa", 2), memcpy(s + 6, t1, 4), s[10] = 0;
  struct gr_matcher *m = gr_matcher_new(g);
  TH_CHECK(gr_matcher_accept_bytes(m, (const uint8_t *)s, 10) == 0 && gr_matcher_is_accepting(m));
  gr_matcher_free(m);
  TH_CHECK(!takes(g, "<[100]>aa<[70000]>")); /* the notation is not the token */
  struct gr_vocab *v = vocab_with_tokens();
  TH_REQUIRE(v);
  m = gr_matcher_new(g);
  uint32_t bits[1];
  TH_REQUIRE(gr_matcher_mask(m, v, bits) == 0);
  TH_CHECK_EQ_INT(bits[0], 1u << 11); /* only token 100 */
  TH_CHECK(gr_matcher_accept_token(m, v, 11) == 0);
  TH_REQUIRE(gr_matcher_mask(m, v, bits) == 0);
  TH_CHECK(bit(bits, 0) && bit(bits, 12) && !bit(bits, 11) && !bit(bits, 1) && !bit(bits, 8));
  gr_matcher_free(m);
  gr_vocab_free(v);
  gr_grammar_free(g);
  static const char *const bad[] = {"root ::= <[]>", "root ::= <[12", "root ::= <[16777216]>",
                                    "root ::= <[1a]>"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    struct gr_grammar *b = NULL;
    char err[256];
    TH_CHECK(gr_compile(GR_GRAMMAR, bad[i], strlen(bad[i]), &b, err, sizeof err) == CM_ERR_INVAL);
    gr_grammar_free(b);
  }
}

TH_TEST(after_span_then_schema) {
  const char *t = "100 70000 4\n{\"type\":\"object\",\"required\":[\"x\"],\"properties\":"
                  "{\"x\":{\"type\":\"integer\"}},\"additionalProperties\":false}";
  struct gr_grammar *g = NULL;
  char err[256];
  TH_REQUIRE(gr_compile(GR_AFTER_SPAN, t, strlen(t), &g, err, sizeof err) == 0);
  TH_CHECK(takes(g, "{\"x\":1}"));
  TH_CHECK(!takes(g, "{\"y\":1}"));
  uint8_t t0[GR_TOKEN_LEN], t1[GR_TOKEN_LEN];
  gr_token_bytes(100, t0);
  gr_token_bytes(70000, t1);
  char s[64];
  size_t n = 0;
  memcpy(s + n, t0, 4), n += 4;
  memcpy(s + n, "thought\nany {text} <|x|>", 24), n += 24;
  memcpy(s + n, t1, 4), n += 4;
  memcpy(s + n, "{\"x\":12}", 8), n += 8;
  struct gr_matcher *m = gr_matcher_new(g);
  TH_CHECK(gr_matcher_accept_bytes(m, (const uint8_t *)s, n) == 0 && gr_matcher_is_accepting(m));
  gr_matcher_free(m);
  /* the span only first, and only once */
  m = gr_matcher_new(g);
  TH_CHECK(gr_matcher_accept_bytes(m, (const uint8_t *)"{\"x\":1}", 7) == 0);
  TH_CHECK(gr_matcher_accept_bytes(m, t0, 4) != 0);
  gr_matcher_free(m);
  m = gr_matcher_new(g);
  TH_CHECK(gr_matcher_accept_bytes(m, (const uint8_t *)s, 32) == 0);
  TH_CHECK(gr_matcher_accept_bytes(m, t0, 4) != 0);
  gr_matcher_free(m);
  gr_grammar_free(g);
  /* a recursive root stays itself inside: a $ref to "#" is not the span again */
  const char *r = "100 101 4\n{\"type\":\"object\",\"properties\":{\"c\":{\"$ref\":\"#\"}},"
                  "\"additionalProperties\":false}";
  TH_REQUIRE(gr_compile(GR_AFTER_SPAN, r, strlen(r), &g, err, sizeof err) == 0);
  TH_CHECK(takes(g, "{\"c\":{\"c\":{}}}"));
  gr_grammar_free(g);
  static const char *const bad[] = {"100 101\n{}",  "100 101 6\nx",  "x y 4\n{}",
                                    "100 101 4 {}", "100 101 9\n{}", "100 101 4\n{bad"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    TH_CHECK(gr_compile(GR_AFTER_SPAN, bad[i], strlen(bad[i]), &g, err, sizeof err) != 0);
  }
}
