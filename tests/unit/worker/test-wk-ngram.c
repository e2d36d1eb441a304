/* test-wk-ngram.c — n-gram (prompt lookup) drafts: the proposer against a
 * brute-force reading of its definition (every suffix length from the
 * longest down, every earlier place from the first) on random and repetitive
 * sequences, vLLM's documented example, and the history's positions (tokens
 * passed over, a gap). */
#include <stdint.h>
#include <string.h>

#include "tests/harness/th.h"
#include "worker/wk-ngram.h"

/* The definition, read directly: for n = max_n down to min_n, the first place
 * s (s + n < L, so at least one token follows) where t[s .. s+n) equals the last
 * n tokens; the drafts are the up to k tokens from s + n on. */
static int brute(const int32_t *t, int L, int min_n, int max_n, int k, int32_t *out) {
  for (int n = max_n; n >= min_n; n--) {
    if (n >= L) continue;
    for (int s = 0; s + n < L; s++) {
      if (memcmp(t + s, t + L - n, sizeof(int32_t) * (size_t)n) != 0) continue;
      int c = 0;
      for (int j = s + n; j < L && c < k; j++)
        out[c++] = t[j];
      return c;
    }
  }
  return 0;
}

static struct wk_ngram_hist hist_of(const int32_t *t, int L) {
  struct wk_ngram_hist h = {0};
  TH_REQUIRE(wk_ngram_put(&h, 0, t, (uint32_t)L) == 0);
  return h;
}

TH_TEST(ngram_vllm_example) {
  /* [1,2,3,4,2,3], min 2, max 3, k 4: [4,2,3] is not found earlier, [2,3] is, at
   * 1: the drafts are the three tokens after it */
  const int32_t t[] = {1, 2, 3, 4, 2, 3};
  struct wk_ngram_hist h = hist_of(t, 6);
  int32_t out[8];
  TH_CHECK_EQ_INT(wk_ngram_propose(&h, 2, 3, 4, out), 3);
  TH_CHECK(out[0] == 4 && out[1] == 2 && out[2] == 3);
  TH_CHECK_EQ_INT(wk_ngram_propose(&h, 2, 3, 2, out), 2);
  TH_CHECK(out[0] == 4 && out[1] == 2);
  TH_CHECK_EQ_INT(wk_ngram_propose(&h, 3, 3, 4, out), 0); /* no 3-gram repeats */
  TH_CHECK_EQ_INT(wk_ngram_propose(&h, 2, 3, 0, out), 0);
  wk_ngram_free(&h);
}

TH_TEST(ngram_longest_then_earliest) {
  /* the suffix [7,8,9]: [8,9] occurs at 1 and 5, [7,8,9] only at 4 — the longer
   * wins though it comes later */
  const int32_t t[] = {0, 8, 9, 1, 7, 8, 9, 2, 7, 8, 9};
  struct wk_ngram_hist h = hist_of(t, 11);
  int32_t out[4];
  TH_CHECK_EQ_INT(wk_ngram_propose(&h, 1, 4, 2, out), 2);
  TH_CHECK(out[0] == 2 && out[1] == 7);
  /* capped at 2: [8,9] at 1 is the earliest of that length */
  TH_CHECK_EQ_INT(wk_ngram_propose(&h, 1, 2, 2, out), 2);
  TH_CHECK(out[0] == 1 && out[1] == 7);
  wk_ngram_free(&h);
  /* a run of one token: the match may overlap the suffix */
  const int32_t r[] = {5, 5, 5, 5};
  h = hist_of(r, 4);
  TH_CHECK_EQ_INT(wk_ngram_propose(&h, 1, 2, 3, out), 2);
  TH_CHECK(out[0] == 5 && out[1] == 5);
  wk_ngram_free(&h);
}

TH_TEST(ngram_matches_the_definition) {
  uint32_t x = 2463534242u;
  int32_t t[300], a[70], b[70];
  int cases = 0, found = 0;
  for (int it = 0; it < 4000; it++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    int L = 1 + (int)(x % 300);
    int alphabet = 2 + (int)((x >> 9) % 12); /* small: many repeats */
    for (int i = 0; i < L; i++) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      t[i] = (int32_t)(x % (uint32_t)alphabet);
    }
    int max_n = 1 + (int)((x >> 3) % 8), min_n = 1 + (int)((x >> 7) % (uint32_t)max_n);
    int k = (int)((x >> 11) % 65);
    struct wk_ngram_hist h = hist_of(t, L);
    int na = wk_ngram_propose(&h, min_n, max_n, k, a), nb = brute(t, L, min_n, max_n, k, b);
    cases++;
    found += nb > 0;
    if (na != nb || memcmp(a, b, sizeof(int32_t) * (size_t)(na > 0 ? na : 0)) != 0) {
      th_fail(__FILE__, __LINE__, "case %d (L %d, n %d..%d, k %d): %d drafts, the definition %d",
              it, L, min_n, max_n, k, na, nb);
      wk_ngram_free(&h);
      return;
    }
    wk_ngram_free(&h);
  }
  TH_CHECK(found > cases / 4 && found < cases); /* both outcomes are exercised */
}

TH_TEST(ngram_history_positions) {
  const int32_t t[] = {3, 4, 5, 3, 4};
  struct wk_ngram_hist h = {0};
  int32_t out[4];
  TH_CHECK_EQ_INT(wk_ngram_put(&h, 0, t, 3), 0);
  /* positions 1 .. 4: 1 and 2 are there already */
  TH_CHECK_EQ_INT(wk_ngram_put(&h, 1, t + 1, 4), 0);
  TH_CHECK_EQ_INT(h.n, 5);
  TH_CHECK_EQ_INT(wk_ngram_propose(&h, 1, 3, 4, out), 3);
  TH_CHECK(out[0] == 5 && out[1] == 3 && out[2] == 4);
  /* a token seen again is passed over */
  TH_CHECK_EQ_INT(wk_ngram_put(&h, 4, t + 4, 1), 0);
  TH_CHECK_EQ_INT(h.n, 5);
  /* a gap: nothing more is proposed until the sequence starts again */
  TH_CHECK_EQ_INT(wk_ngram_put(&h, 7, t, 1), 0);
  TH_CHECK(h.broken);
  TH_CHECK_EQ_INT(wk_ngram_propose(&h, 1, 3, 4, out), 0);
  TH_CHECK_EQ_INT(wk_ngram_put(&h, 5, t, 1), 0);
  TH_CHECK_EQ_INT(wk_ngram_propose(&h, 1, 3, 4, out), 0);
  wk_ngram_reset(&h);
  TH_CHECK_EQ_INT(wk_ngram_put(&h, 0, t, 5), 0);
  TH_CHECK_EQ_INT(wk_ngram_propose(&h, 1, 3, 4, out), 3);
  wk_ngram_free(&h);
  /* shorter than min_n + 1: nothing */
  h = hist_of(t, 2);
  TH_CHECK_EQ_INT(wk_ngram_propose(&h, 2, 3, 4, out), 0);
  wk_ngram_free(&h);
}
