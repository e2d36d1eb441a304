/* bench-grammar.c — compile times and token-mask times at V = 262,144 (the
 * Gemma tokenizer) while following random valid generations: for each
 * grammar, the median compile time, then mask p50 / p99 / max in µs over
 * every step of several generations (a random allowed token each step).
 *
 *   build/tests/unit/grammar/bench-grammar [generations] [max_tokens] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-time.h"
#include "grammar/gr.h"
#include "tests/unit/grammar/gt-util.h"

static const struct {
  const char *name;
  enum gr_kind kind;
  const char *text;
} cases[] = {
    {"regex phone", GR_REGEX, "\\+?[0-9]{1,3}[ -]?\\(?[0-9]{3}\\)?[ -]?[0-9]{3}-[0-9]{4}"},
    {"regex words", GR_REGEX, "([A-Z][a-z]+ ){2,6}[a-z]+[.!?]"},
    {"choice 20", GR_CHOICE,
     "[\"positive\",\"negative\",\"neutral\",\"mixed\",\"unknown\",\"very positive\","
     "\"very negative\",\"slightly positive\",\"slightly negative\",\"sarcastic\",\"angry\","
     "\"happy\",\"sad\",\"surprised\",\"fearful\",\"disgusted\",\"calm\",\"excited\","
     "\"bored\",\"confused\"]"},
    {"json_object", GR_JSON_OBJECT, ""},
    {"gbnf arithmetic", GR_GRAMMAR,
     "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= factor ((\"*\" | \"/\") "
     "factor)*\nfactor ::= [0-9]+ | \"(\" expr \")\"\n"},
    {"schema person", GR_JSON_SCHEMA,
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},"
     "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},\"email\":{\"type\":"
     "\"string\",\"format\":\"email\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":"
     "\"string\",\"maxLength\":12},\"maxItems\":5},\"active\":{\"type\":\"boolean\"}},"
     "\"required\":[\"name\",\"age\"]}"},
    {"schema tree ($ref)", GR_JSON_SCHEMA,
     "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"value\":{\"type\":"
     "\"number\"},\"kind\":{\"enum\":[\"leaf\",\"inner\"]},\"children\":{\"type\":\"array\","
     "\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":3}},\"required\":[\"value\",\"kind\"],"
     "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}"},
};

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int gens = argc > 1 ? atoi(argv[1]) : 20;
  int max_tokens = argc > 2 ? atoi(argv[2]) : 200;
  uint64_t t0 = cm_time_ns();
  struct gr_vocab *v = gt_vocab_gemma();
  if (!v) {
    fprintf(stderr, "bench-grammar: the Gemma tokenizer is missing (run tools/setup)\n");
    return 77;
  }
  printf("vocabulary: %d tokens, trie built in %.1f ms (with tokenizer.json parsing)\n",
         gr_vocab_size(v), (double)(cm_time_ns() - t0) / 1e6);
  printf("%-20s %10s %8s %9s %9s %9s %9s %7s %12s\n", "grammar", "compile", "masks", "p50 us",
         "p99 us", "mean us", "max us", "done", "cold mean us");
  double *us = malloc((size_t)gens * (size_t)max_tokens * sizeof *us);
  double *step = malloc((size_t)max_tokens * sizeof *step);
  char *buf = malloc(1 << 20);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    double ct[21];
    struct gr_grammar *g = NULL;
    char err[256];
    int bad = 0;
    for (int i = 0; i < 21; i++) {
      struct gr_grammar *x = NULL;
      uint64_t a = cm_time_ns();
      if (gr_compile(cases[c].kind, cases[c].text, strlen(cases[c].text), &x, err, sizeof err)) {
        printf("%-20s refused: %s\n", cases[c].name, err);
        bad = 1;
        break;
      }
      ct[i] = (double)(cm_time_ns() - a) / 1e3;
      if (i == 0)
        g = x;
      else
        gr_grammar_free(x);
    }
    if (bad) continue;
    qsort(ct, 21, sizeof *ct, cmp_d);
    size_t n = 0, n_first = 0;
    double first_sum = 0;
    int done = 0;
    uint64_t rng = 1234 + c;
    for (int r = 0; r < gens; r++) {
      struct gr_matcher *m = gr_matcher_new(g);
      for (int t = 0; t < max_tokens; t++)
        step[t] = -1;
      done += gt_generate(m, v, &rng, buf, 1 << 20, max_tokens, step) >= 0;
      for (int t = 0; t < max_tokens && step[t] >= 0; t++) {
        us[n++] = step[t];
        if (r == 0) first_sum += step[t], n_first++; /* the first: the cache starts empty */
      }
      gr_matcher_free(m);
    }
    qsort(us, n, sizeof *us, cmp_d);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
      sum += us[i];
    printf("%-20s %7.0f us %8zu %9.1f %9.1f %9.1f %9.0f %3d/%-3d %12.1f\n", cases[c].name, ct[10],
           n, n ? us[n / 2] : 0, n ? us[(size_t)(0.99 * (double)(n - 1))] : 0,
           n ? sum / (double)n : 0, n ? us[n - 1] : 0, done, gens,
           n_first ? first_sum / (double)n_first : 0);
    gr_grammar_free(g);
  }
  free(us);
  free(step);
  free(buf);
  gr_vocab_free(v);
  return 0;
}
