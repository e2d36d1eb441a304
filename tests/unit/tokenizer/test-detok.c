/* test-detok.c — streaming detokenization: pieces concatenate to the full
 * decode on every corpus document (with and without skip_special), byte
 * runs are held back whole, and the steady state does not grow buffers. */
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "tokenizer/tk-detok.h"
#include "tokenizer/tk-tokenizer.h"
#include "tests/harness/th.h"
#include "tt-util.h"

static const char *const docs[] = {"prose.txt", "code.txt", "cjk.txt", "emoji.txt",
                                   "byte-fallback.txt", "specials.txt", "long-runs.txt",
                                   "combining.txt", "whitespace.txt", "arabic.txt"};

TH_TEST(detok_stream_equals_decode) {
  const struct tk_tokenizer *tok = tt_gemma();
  for (size_t d = 0; d < sizeof docs / sizeof docs[0]; d++) {
    char rel[256];
    snprintf(rel, sizeof rel, "corpus/%s", docs[d]);
    size_t len;
    char *text = tt_read_file(tt_fixture(rel), &len);
    TH_REQUIRE(text);
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    TH_REQUIRE(tk_encode(tok, NULL, text, len, TK_DEFAULT, &ids, &n, &cap) == 0);
    for (int skip = 0; skip < 2; skip++) {
      char *full = NULL, *acc = NULL;
      size_t fl = 0, fc = 0, al = 0;
      TH_REQUIRE(tk_decode(tok, ids, n, skip, &full, &fl, &fc) == 0);
      acc = malloc(fl + 1);
      struct tk_detok *dt;
      TH_REQUIRE(tk_detok_create(tok, skip, &dt) == 0);
      const char *p;
      size_t pl;
      int bad = 0;
      for (size_t i = 0; i < n; i++) {
        TH_CHECK_EQ_INT(tk_detok_push(dt, ids[i], &p, &pl), 0);
        if (al + pl > fl) bad = 1;
        else memcpy(acc + al, p, pl), al += pl;
        /* every piece is whole UTF-8 */
        if (!tk_utf8_valid(p, pl)) bad = 1;
      }
      TH_CHECK_EQ_INT(tk_detok_flush(dt, &p, &pl), 0);
      if (al + pl > fl) bad = 1;
      else memcpy(acc + al, p, pl), al += pl;
      if (bad || al != fl || memcmp(acc, full, fl))
        th_fail(__FILE__, __LINE__, "%s skip=%d: stream differs from decode", docs[d], skip);
      tk_detok_free(dt);
      free(acc);
      free(full);
    }
    free(ids);
    free(text);
  }
}

TH_TEST(detok_byte_runs) {
  const struct tk_tokenizer *tok = tt_gemma();
  struct tk_detok *dt;
  TH_REQUIRE(tk_detok_create(tok, 1, &dt) == 0);
  int32_t e4 = tk_find(tok, "<0xE4>", 6), b8 = tk_find(tok, "<0xB8>", 6),
          ad = tk_find(tok, "<0xAD>", 6), hello = 9259;
  const char *p;
  size_t pl;
  TH_CHECK_EQ_INT(tk_detok_push(dt, hello, &p, &pl), 0);
  TH_CHECK_EQ_STR(p, "Hello");
  TH_CHECK_EQ_INT(tk_detok_push(dt, e4, &p, &pl), 0);
  TH_CHECK_EQ_INT(pl, 0);
  TH_CHECK_EQ_INT(tk_detok_push(dt, b8, &p, &pl), 0);
  TH_CHECK_EQ_INT(tk_detok_pending(dt), 2);
  TH_CHECK_EQ_INT(tk_detok_push(dt, 1, &p, &pl), 0); /* <eos> skipped: run goes on */
  TH_CHECK_EQ_INT(pl, 0);
  TH_CHECK_EQ_INT(tk_detok_push(dt, ad, &p, &pl), 0);
  TH_CHECK_EQ_INT(pl, 0);
  TH_CHECK_EQ_INT(tk_detok_push(dt, hello, &p, &pl), 0);
  TH_CHECK_EQ_STR(p, "\xe4\xb8\xadHello");
  /* an incomplete run ends as U+FFFD per byte, as the full decode does */
  TH_CHECK_EQ_INT(tk_detok_push(dt, e4, &p, &pl), 0);
  TH_CHECK_EQ_INT(tk_detok_push(dt, b8, &p, &pl), 0);
  TH_CHECK_EQ_INT(tk_detok_flush(dt, &p, &pl), 0);
  TH_CHECK_EQ_STR(p, "\xef\xbf\xbd\xef\xbf\xbd");
  TH_CHECK_EQ_INT(tk_detok_push(dt, -5, &p, &pl), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(tk_detok_push(dt, tk_n_vocab(tok), &p, &pl), CM_ERR_RANGE);
  tk_detok_reset(dt);
  TH_CHECK_EQ_INT(tk_detok_pending(dt), 0);
  tk_detok_free(dt);
}
