/* test-stop.c — the stop-string matcher: stops split across pieces, the
 * hold-back bound, earliest match wins, UTF-8 stays whole, and a brute-force
 * comparison over every way of cutting a text into pieces. */
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "tokenizer/tk-stop.h"
#include "tokenizer/tk-tokenizer.h"
#include "tests/harness/th.h"

/* Streams `text` cut at the given sizes; returns the released text. */
static char *run(struct tk_stop *s, const char *text, const size_t *cuts, size_t ncuts,
                 int *hit, size_t *max_held) {
  size_t len = strlen(text), at = 0, ol = 0;
  char *acc = calloc(len + 1, 1);
  *hit = -1;
  *max_held = 0;
  tk_stop_reset(s);
  for (size_t c = 0; at < len; c++) {
    size_t n = c < ncuts ? cuts[c] : len - at;
    if (n > len - at) n = len - at;
    const char *o;
    size_t on;
    int h;
    tk_stop_push(s, text + at, n, &o, &on, &h);
    memcpy(acc + ol, o, on);
    ol += on;
    if (tk_stop_pending(s) > *max_held) *max_held = tk_stop_pending(s);
    if (h >= 0) *hit = h;
    at += n;
  }
  const char *o;
  size_t on;
  tk_stop_flush(s, &o, &on);
  memcpy(acc + ol, o, on);
  return acc;
}

TH_TEST(stop_across_pieces) {
  const char *stops[] = {"</end>", "STOP"};
  size_t lens[] = {6, 4};
  struct tk_stop *s;
  TH_REQUIRE(tk_stop_create(stops, lens, 2, &s) == 0);
  TH_CHECK_EQ_INT(tk_stop_max_len(s), 6);
  const char *o;
  size_t on;
  int hit;
  TH_CHECK_EQ_INT(tk_stop_push(s, "hello </e", 9, &o, &on, &hit), 0);
  TH_CHECK_EQ_STR(o, "hello ");
  TH_CHECK_EQ_INT(hit, -1);
  TH_CHECK_EQ_INT(tk_stop_pending(s), 3);
  TH_CHECK_EQ_INT(tk_stop_push(s, "nx", 2, &o, &on, &hit), 0); /* "</enx": not a stop */
  TH_CHECK_EQ_STR(o, "</enx");
  TH_CHECK_EQ_INT(tk_stop_push(s, " </", 3, &o, &on, &hit), 0);
  TH_CHECK_EQ_STR(o, " ");
  TH_CHECK_EQ_INT(tk_stop_push(s, "end> more", 9, &o, &on, &hit), 0);
  TH_CHECK_EQ_INT(hit, 0);
  TH_CHECK_EQ_INT(on, 0);
  TH_CHECK_EQ_INT(tk_stop_push(s, "later", 5, &o, &on, &hit), 0);
  TH_CHECK_EQ_INT(on, 0);
  /* earliest start wins over list order */
  tk_stop_reset(s);
  TH_CHECK_EQ_INT(tk_stop_push(s, "a STOP b </end>", 15, &o, &on, &hit), 0);
  TH_CHECK_EQ_INT(hit, 1);
  TH_CHECK_EQ_STR(o, "a ");
  tk_stop_free(s);
  /* empty stop strings are refused; no stops releases everything */
  size_t zero = 0;
  TH_CHECK_EQ_INT(tk_stop_create(stops, &zero, 1, &s), CM_ERR_INVAL);
  TH_REQUIRE(tk_stop_create(NULL, NULL, 0, &s) == 0);
  TH_CHECK_EQ_INT(tk_stop_push(s, "abc", 3, &o, &on, &hit), 0);
  TH_CHECK_EQ_STR(o, "abc");
  tk_stop_free(s);
}

TH_TEST(stop_utf8_holdback) {
  const char *stops[] = {"\xe4\xb8\xad\xe6\x96\x87"}; /* "中文" */
  size_t lens[] = {6};
  struct tk_stop *s;
  TH_REQUIRE(tk_stop_create(stops, lens, 1, &s) == 0);
  const char *o;
  size_t on;
  int hit;
  TH_CHECK_EQ_INT(tk_stop_push(s, "x\xe4\xb8\xad", 4, &o, &on, &hit), 0);
  TH_CHECK_EQ_STR(o, "x");
  TH_CHECK_EQ_INT(tk_stop_push(s, "\xe4\xb8\xad", 3, &o, &on, &hit), 0);
  TH_CHECK_EQ_STR(o, "\xe4\xb8\xad");
  TH_CHECK(tk_utf8_valid(o, on));
  TH_CHECK_EQ_INT(tk_stop_flush(s, &o, &on), 0);
  TH_CHECK_EQ_STR(o, "\xe4\xb8\xad");
  tk_stop_free(s);
}

/* Every split of the text into two or three pieces gives the same output
 * as the whole text at once: the text before the first stop. */
TH_TEST(stop_all_splits) {
  const char *stops[] = {"ab", "bca", "\n\n", "xyzzy"};
  size_t lens[] = {2, 3, 2, 5};
  const char *texts[] = {"xxbcaab", "hello\n\nworld", "xyzzxyzzy!", "no stop here at all", "b", ""};
  struct tk_stop *s;
  TH_REQUIRE(tk_stop_create(stops, lens, 4, &s) == 0);
  for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
    size_t len = strlen(texts[t]);
    /* expected: cut at the earliest stop */
    size_t cut = len;
    int want = -1;
    for (size_t k = 0; k < 4; k++) {
      const char *p = strstr(texts[t], stops[k]);
      if (p && (size_t)(p - texts[t]) < cut) cut = (size_t)(p - texts[t]), want = (int)k;
    }
    for (size_t i = 0; i <= len; i++)
      for (size_t j = 0; i + j <= len; j++) {
        size_t cuts[3] = {i, j, len - i - j};
        int hit;
        size_t held;
        char *got = run(s, texts[t], cuts, 3, &hit, &held);
        if (strlen(got) != cut || strncmp(got, texts[t], cut) || hit != want || held > 4)
          th_fail(__FILE__, __LINE__, "text %zu cuts %zu/%zu: got \"%s\" hit %d held %zu", t, i,
                  j, got, hit, held);
        free(got);
      }
  }
  tk_stop_free(s);
}
