/* test-gr-regex.c — the regex front end: constructs, errors with their
 * offsets, limits, and conformance against JavaScript's RegExp (node) over
 * random walks of our automata and near misses. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "grammar/gr.h"
#include "tests/harness/th.h"
#include "tests/unit/grammar/gt-util.h"

static int rx_match(const char *pat, const char *s) {
  struct gr_grammar *g;
  char err[256];
  if (gr_compile(GR_REGEX, pat, strlen(pat), &g, err, sizeof err)) {
    fprintf(stderr, "  compile %s: %s\n", pat, err);
    return -1;
  }
  int ok = gt_takes(g, s, strlen(s));
  gr_grammar_free(g);
  return ok;
}

TH_TEST(regex_basics) {
  static const struct {
    const char *pat, *text;
    int match;
  } cases[] = {
      {"[0-9]{3}-[a-z]+", "123-abc", 1},
      {"[0-9]{3}-[a-z]+", "123-", 0},
      {"^abc$", "abc", 1},
      {"a|b|", "", 1},
      {"(?<year>\\d{4})-(?:\\d\\d)", "2024-05", 1},
      {".", "\xe6\x97\xa5", 1},
      {".", "\n", 0},
      {"\\u{1F600}+", "\xf0\x9f\x98\x80\xf0\x9f\x98\x80", 1},
      {"\\uD83D\\uDE00", "\xf0\x9f\x98\x80", 1},
      {"[^a]", "\xc3\xa9", 1},
      {"a{2,3}?", "aaa", 1},
      {"a{2,3}?", "aaaa", 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int got = rx_match(cases[i].pat, cases[i].text);
    if (got != cases[i].match)
      th_fail(__FILE__, __LINE__, "/%s/ on \"%s\": %d, want %d", cases[i].pat, cases[i].text, got,
              cases[i].match);
  }
}

TH_TEST(regex_errors) {
  gt_expect_err(GR_REGEX, "(ab", CM_ERR_INVAL, "unbalanced '(' at 0");
  gt_expect_err(GR_REGEX, "ab)", CM_ERR_INVAL, "unbalanced ')' at 2");
  gt_expect_err(GR_REGEX, "a(?=b)", CM_ERR_INVAL, "lookahead is not supported at 1");
  gt_expect_err(GR_REGEX, "(?<!a)b", CM_ERR_INVAL, "lookbehind is not supported at 0");
  gt_expect_err(GR_REGEX, "(a)\\1", CM_ERR_INVAL, "backreference is not supported at 3");
  gt_expect_err(GR_REGEX, "\\bfoo", CM_ERR_INVAL, "word boundary");
  gt_expect_err(GR_REGEX, "(?i)abc", CM_ERR_INVAL, "flags are not supported at 0");
  gt_expect_err(GR_REGEX, "*a", CM_ERR_INVAL, "nothing to repeat at 0");
  gt_expect_err(GR_REGEX, "a**", CM_ERR_INVAL, "nothing to repeat at 2");
  gt_expect_err(GR_REGEX, "[b-a]", CM_ERR_INVAL, "range out of order");
  gt_expect_err(GR_REGEX, "[abc", CM_ERR_INVAL, "unterminated '[' at 0");
  gt_expect_err(GR_REGEX, "a{3,1}", CM_ERR_INVAL, "out of order");
  gt_expect_err(GR_REGEX, "a^b", CM_ERR_INVAL, "anchor '^'");
  gt_expect_err(GR_REGEX, "\\p{L}", CM_ERR_INVAL, "property");
  gt_expect_err(GR_REGEX, "a{1,100000}", CM_ERR_TOOBIG, "repetition count");
  gt_expect_err(GR_REGEX, "(a{1000}){1000}", CM_ERR_TOOBIG, "automaton states");
  gt_expect_err(GR_REGEX, "(a|b)*a(a|b){20}", CM_ERR_TOOBIG, "automaton states");
  gt_expect_err(GR_REGEX, "[^\\s\\S]", CM_ERR_INVAL, "matches no text");
  gt_expect_err(GR_REGEX, "\\", CM_ERR_INVAL, "lone");
  gt_expect_err(GR_REGEX, "\xff", CM_ERR_INVAL, "invalid UTF-8 at 0");
  char deep[1200];
  memset(deep, '(', 600);
  memset(deep + 600, ')', 600);
  deep[1199] = 0;
  struct gr_grammar *g = NULL;
  char err[256];
  TH_CHECK(gr_compile(GR_REGEX, deep, 1199, &g, err, sizeof err) < 0);
  TH_CHECK(g == NULL);
}

/* ---- conformance against JavaScript ------------------------------------- */
static const char *corpus[] = {
    "abc",
    "a|b|c",
    "ab*c",
    "ab+c?",
    "(ab)+",
    "(?:ab|cd)*e",
    "a{3}",
    "a{2,}b",
    "a{1,4}b{0,2}",
    "(a|bc){2,3}",
    "x*?y+?z??",
    "a{2,5}?",
    "[abc]+",
    "[a-z0-9_]{1,8}",
    "[^a-z]+",
    "[^\\d\\s]*",
    "[\\w-]+@[\\w-]+\\.[a-z]{2,4}",
    "\\d{3}-\\d{4}",
    "\\D\\W\\S",
    "\\s+",
    "[\\s\\S]{0,3}",
    ".+",
    ".{2}x",
    "\\t\\n\\r\\f\\v",
    "\\x41\\x7a",
    "\\u00e9+",
    "\\u{1F600}|\\u{10FFFF}",
    "[\\u0400-\\u04FF]+",
    "[\\u{1F300}-\\u{1F5FF}]{1,2}",
    "[α-ω]+",
    "日本語?",
    "😀+",
    "[😀-😂]",
    "[^\\u0000-\\u007f]+",
    "\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\/\\^\\$\\\\",
    "[\\]\\[\\-]+",
    "[a\\-z]",
    "[-a]",
    "[a-]",
    "\\cJ",
    "\\0",
    "(?<name>[a-z]+)=(?<val>\\d+)",
    "^[A-Z][a-z]*$",
    "^a|b$",
    "((a|b)(c|d)?)+",
    "(a*)*",
    "(a|)+b",
    "(|a)(|b)",
    "[0-9]+(\\.[0-9]+)?([eE][+-]?[0-9]+)?",
    "-?(0|[1-9]\\d*)",
    "[A-Fa-f0-9]{8}-[A-Fa-f0-9]{4}",
    "(\\d{1,3}\\.){3}\\d{1,3}",
    "https?://[a-z.]+(/[a-z]*)*",
    "[^\"\\\\]*",
    "[\\b]",
    "[.]+",
    "a{0}b",
    "(?:)",
    "[^]",
    "[]|a",
    "\\u0041\\u{42}C",
    "(?:\\p)?x",
    "[\\d-z]",
    "a(?=b)",
    "\\bx",
    "a{,5}",
    "x{",
    "[\\x00-\\x1f]+",
    "ab|abc|abcd",
    "(\\s*,\\s*[a-z]+)*",
};

static size_t utf8_next(const char *s, size_t i, size_t n) {
  i++;
  while (i < n && ((unsigned char)s[i] & 0xc0) == 0x80)
    i++;
  return i;
}

/* A near miss of s (valid UTF-8 in, valid UTF-8 out) into out; its length. */
static size_t mutate(const char *s, size_t n, uint64_t *rng, char *out) {
  static const char *ins[] = {"a", "0", " ", "\n", "-", "\xc3\xa9", "\xf0\x9f\x98\x80",
                              "b", "z", ".", "_",  "A", "\t",       "9",
                              "x", "@"};
  size_t cuts[512], nc = 0;
  for (size_t i = 0; i < n && nc < 511; i = utf8_next(s, i, n))
    cuts[nc++] = i;
  cuts[nc] = n;
  size_t at = nc ? cuts[cm_splitmix64(rng) % (nc + 1 > 1 ? nc + 1 : 1)] : 0;
  if (at > n) at = n;
  const char *w = ins[cm_splitmix64(rng) % (sizeof ins / sizeof ins[0])];
  uint64_t op = cm_splitmix64(rng) % 4;
  memcpy(out, s, at);
  if (op == 3) { /* duplicate a prefix */
    memcpy(out + at, s, n);
    return at + n;
  }
  /* insert (0) w at `at`, delete (1) the code point there, or replace (2) it
   * with w: s goes on after that code point, or at it when inserting */
  size_t rest = op == 0 || at == n ? at : utf8_next(s, at, n);
  size_t k = at;
  if (op != 1) {
    memcpy(out + k, w, strlen(w));
    k += strlen(w);
  }
  memcpy(out + k, s + rest, n - rest);
  return k + n - rest;
}

TH_TEST(regex_conformance_vs_javascript) {
  if (!gt_have("node")) TH_SKIP("node is not installed: the JavaScript RegExp oracle is missing");
  size_t np = sizeof corpus / sizeof corpus[0];
  json_t *req = json_array();
  char **texts[sizeof corpus / sizeof corpus[0]];
  size_t *lens[sizeof corpus / sizeof corpus[0]];
  int *ours[sizeof corpus / sizeof corpus[0]];
  size_t counts[sizeof corpus / sizeof corpus[0]];
  int refused[sizeof corpus / sizeof corpus[0]];
  memset(refused, 0, sizeof refused);
  uint64_t rng = 12345;
  enum { PER = 60 };
  char buf[600], mut[1400];
  for (size_t p = 0; p < np; p++) {
    struct gr_grammar *g = NULL;
    char err[256];
    texts[p] = calloc(PER, sizeof(char *));
    lens[p] = calloc(PER, sizeof(size_t));
    ours[p] = calloc(PER, sizeof(int));
    counts[p] = 0;
    json_t *arr = json_array();
    int rc = gr_compile(GR_REGEX, corpus[p], strlen(corpus[p]), &g, err, sizeof err);
    if (rc) {
      /* refused: JS must accept it, and it must be a construct we refuse */
      refused[p] = 1;
      fprintf(stderr, "  refused /%s/: %s\n", corpus[p], err);
      json_array_append_new(req, json_pack("{s:s,s:o}", "p", corpus[p], "s", arr));
      continue;
    }
    size_t k = 0;
    for (int w = 0; w < PER / 2; w++) {
      struct gr_matcher *m = gr_matcher_new(g);
      int n = gt_walk(m, &rng, buf, 300, 25);
      gr_matcher_free(m);
      if (n < 0) continue;
      texts[p][k] = malloc((size_t)n + 1);
      memcpy(texts[p][k], buf, (size_t)n + 1);
      lens[p][k++] = (size_t)n;
      size_t mn = mutate(buf, (size_t)n, &rng, mut);
      texts[p][k] = malloc(mn + 1);
      memcpy(texts[p][k], mut, mn);
      lens[p][k++] = mn;
    }
    counts[p] = k;
    for (size_t i = 0; i < k; i++) {
      ours[p][i] = gt_takes(g, texts[p][i], lens[p][i]);
      json_array_append_new(arr, json_stringn(texts[p][i], lens[p][i]));
    }
    json_array_append_new(req, json_pack("{s:s,s:o}", "p", corpus[p], "s", arr));
    gr_grammar_free(g);
  }
  char *in = json_dumps(req, JSON_COMPACT);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "node %s/reference/regex_oracle.mjs", th_tests_dir());
  char *out = gt_run(cmd, in);
  free(in);
  json_decref(req);
  TH_REQUIRE(out != NULL);
  json_error_t je;
  json_t *res = json_loads(out, 0, &je);
  free(out);
  TH_REQUIRE(json_is_array(res) && json_array_size(res) == np);
  size_t checked = 0, positives = 0, mismatches = 0;
  for (size_t p = 0; p < np; p++) {
    json_t *r = json_array_get(res, p);
    /* what JS refuses we refuse; what we refuse (and JS takes) is a construct
     * we do not support, said so in the error */
    if (json_is_null(r) && !refused[p])
      th_fail(__FILE__, __LINE__, "node refuses pattern %s, we take it", corpus[p]);
    for (size_t i = 0; i < counts[p]; i++) {
      int js = json_is_true(json_array_get(r, i));
      checked++;
      positives += js;
      if (js != ours[p][i] && mismatches++ < 20)
        th_fail(__FILE__, __LINE__, "/%s/ on \"%.*s\": js %d, ours %d", corpus[p], (int)lens[p][i],
                texts[p][i], js, ours[p][i]);
    }
    for (size_t i = 0; i < counts[p]; i++)
      free(texts[p][i]);
    free(texts[p]);
    free(lens[p]);
    free(ours[p]);
  }
  json_decref(res);
  fprintf(stderr,
          "  %zu patterns, %zu strings checked against RegExp (%zu matching), %zu mismatches\n", np,
          checked, positives, mismatches);
  TH_CHECK(checked > np * 20);
  TH_CHECK_EQ_INT(mismatches, 0);
}

/* Random patterns from regex syntax: every one compiles or is refused with a
 * message, and what compiles can be matched and masked (no crash, no leak). */
TH_TEST(regex_random_patterns_never_crash) {
  static const char *atoms[] = {"a",   "b",          "(",  ")",      "|",    "*",   "+",   "?",
                                "{2}", "{1,3}",      "{,", "[",      "]",    "^",   "$",   "\\",
                                "\\d", "\\u{1F600}", ".",  "[^a-c]", "(?:",  "(?=", "\\1", "é",
                                "{",   "}",          "-",  "\\x4",   "\\u00"};
  gt_random_texts(GR_REGEX, "", atoms, sizeof atoms / sizeof atoms[0], 12, 31337);
}
