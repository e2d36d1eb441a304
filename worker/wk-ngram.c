/* wk-ngram.c — n-gram (prompt lookup) drafts: see wk-ngram.h. */
#include "worker/wk-ngram.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-grow.h"

void wk_ngram_reset(struct wk_ngram_hist *h) {
  h->n = 0;
  h->broken = 0;
}

void wk_ngram_free(struct wk_ngram_hist *h) {
  free(h->v);
  memset(h, 0, sizeof(*h));
}

int wk_ngram_put(struct wk_ngram_hist *h, uint32_t pos, const int32_t *ids, uint32_t n) {
  if (h->broken || pos + (uint64_t)n <= (uint64_t)h->n) return 0;
  if (pos > (uint32_t)h->n || pos + (uint64_t)n > INT32_MAX) {
    h->broken = 1; /* the tokens before pos never came */
    return 0;
  }
  uint32_t skip = (uint32_t)h->n - pos;
  int need = (int)(pos + n);
  if (cm_grow_items(&h->v, &h->cap, need, sizeof(int32_t), 256)) {
    h->broken = 1;
    return CM_ERR_NOMEM;
  }
  memcpy(h->v + h->n, ids + skip, sizeof(int32_t) * (n - skip));
  h->n = need;
  return 0;
}

int wk_ngram_propose(const struct wk_ngram_hist *h, int min_n, int max_n, int k, int32_t *out) {
  const int32_t *t = h->v;
  int L = h->n;
  if (h->broken || k <= 0 || min_n < 1 || max_n < min_n || L < min_n + 1) return 0;
  /* One pass over the places e < L - 1 where the last token occurs: the match
   * ending at e is as long as the tokens before e and before the last agree, up
   * to max_n. The longest wins, the earliest among equals (only a longer match
   * replaces one). */
  int best = 0, end = -1;
  int32_t last = t[L - 1];
  for (int e = 0; e < L - 1; e++) {
    if (t[e] != last) continue;
    int m = 1;
    while (m < max_n && e - m >= 0 && t[e - m] == t[L - 1 - m])
      m++;
    if (m > best) {
      best = m;
      end = e;
      if (m == max_n) break; /* none longer, and this is the earliest of its length */
    }
  }
  if (best < min_n) return 0;
  int n = L - (end + 1) < k ? L - (end + 1) : k;
  memcpy(out, t + end + 1, sizeof(int32_t) * (size_t)n);
  return n;
}

int wk_spec_ngram_args(const char *prog, const char *spec, int64_t max_given, int64_t min_given,
                       int64_t *max_n, int64_t *min_n) {
  int ngram = spec && (strcmp(spec, "ngram") == 0 || strcmp(spec, "[ngram]") == 0);
  *max_n = *min_n = 0;
  if (!ngram) {
    if (max_given || min_given) {
      fprintf(stderr, "%s: --ngram-prompt-lookup-%s needs --speculative-model ngram\n", prog,
              max_given ? "max" : "min");
      return -1;
    }
    return 0;
  }
  *max_n = max_given ? max_given : min_given ? min_given : 5;
  *min_n = min_given ? min_given : max_given ? max_given : 5;
  if (*min_n > *max_n) {
    fprintf(stderr, "%s: --ngram-prompt-lookup-min %lld is above --ngram-prompt-lookup-max %lld\n",
            prog, (long long)*min_n, (long long)*max_n);
    return -1;
  }
  return 1;
}
