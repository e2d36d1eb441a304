/* test-steady.c — streaming has no allocation per token in steady state:
 * after a short warm-up, pushing thousands of ids through tk_detok and the
 * pieces through tk_stop makes no malloc / calloc / realloc call. The
 * allocator is counted by wrapping glibc's entry points, so the test only
 * runs in builds without AddressSanitizer (which owns malloc there). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tk-detok.h"
#include "tokenizer/tk-stop.h"
#include "tokenizer/tk-tokenizer.h"
#include "tests/harness/th.h"
#include "tt-util.h"

#if defined(__SANITIZE_ADDRESS__)
#define TT_COUNT_ALLOCS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TT_COUNT_ALLOCS 0
#endif
#endif
#ifndef TT_COUNT_ALLOCS
#define TT_COUNT_ALLOCS 1
#endif

static long n_allocs;

#if TT_COUNT_ALLOCS
void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t m);
void *__libc_realloc(void *p, size_t n);
void *malloc(size_t n);
void *calloc(size_t n, size_t m);
void *realloc(void *p, size_t n);
void *malloc(size_t n) {
  n_allocs++;
  return __libc_malloc(n);
}
void *calloc(size_t n, size_t m) {
  n_allocs++;
  return __libc_calloc(n, m);
}
void *realloc(void *p, size_t n) {
  n_allocs++;
  return __libc_realloc(p, n);
}
#endif

TH_TEST(stream_no_alloc_steady_state) {
  if (!TT_COUNT_ALLOCS) TH_SKIP("allocation counting needs a build without AddressSanitizer");
  const struct tk_tokenizer *tok = tt_gemma();
  size_t len;
  char *text = tt_read_file(tt_fixture("corpus/long-runs.txt"), &len);
  char *more = tt_read_file(tt_fixture("corpus/mixed.txt"), NULL);
  TH_REQUIRE(text && more);
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  TH_REQUIRE(tk_encode(tok, NULL, text, len, TK_DEFAULT, &ids, &n, &cap) == 0);
  TH_REQUIRE(n > 500);
  TH_REQUIRE(n_allocs > 0); /* the counter sees this library's allocations */
  struct tk_detok *d;
  struct tk_stop *s;
  const char *stops[] = {"never appears here", "\x01\x02"};
  size_t lens[] = {18, 2};
  TH_REQUIRE(tk_detok_create(tok, 1, &d) == 0);
  TH_REQUIRE(tk_stop_create(stops, lens, 2, &s) == 0);
  const char *p, *o;
  size_t pl, ol;
  int hit;
  for (size_t i = 0; i < 100; i++) { /* warm-up */
    tk_detok_push(d, ids[i], &p, &pl);
    tk_stop_push(s, p, pl, &o, &ol, &hit);
  }
  long before = n_allocs;
  size_t total = 0;
  for (size_t i = 100; i < n; i++) {
    TH_CHECK_EQ_INT(tk_detok_push(d, ids[i], &p, &pl), 0);
    TH_CHECK_EQ_INT(tk_stop_push(s, p, pl, &o, &ol, &hit), 0);
    total += ol;
  }
  long during = n_allocs - before;
  TH_CHECK_EQ_INT(during, 0);
  TH_CHECK(total > 1000);
  tk_stop_free(s);
  tk_detok_free(d);
  free(ids);
  free(text);
  free(more);
}
