/* wk-ngram.c — n-gram (prompt lookup) drafts: see wk-ngram.h. */
#include "worker/wk-ngram.h"

#include <jansson.h>
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

/* The integer member `key` of o into *v, within [lo, hi]; absent: *v stays. 0 or -1 (said). */
static int spec_int(const char *prog, json_t *o, const char *key, int64_t lo, int64_t hi,
                    int64_t *v) {
  json_t *x = json_object_get(o, key);
  if (!x) return 0;
  if (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > hi) {
    fprintf(stderr, "%s: --speculative-config: %s must be an integer in [%lld, %lld]\n", prog, key,
            (long long)lo, (long long)hi);
    return -1;
  }
  *v = json_integer_value(x);
  return 0;
}

int wk_spec_config_args(const char *prog, const char *json, bool flags_given, int64_t max_k,
                        char *model_buf, size_t cap, struct wk_spec_json *out) {
  static const char *const keys[] = {"method",
                                     "model",
                                     "num_speculative_tokens",
                                     "prompt_lookup_max",
                                     "prompt_lookup_min",
                                     "disable_by_batch_size"};
  memset(out, 0, sizeof(*out));
  if (flags_given) {
    fprintf(stderr, "%s: --speculative-config or the separate speculative flags, not both\n", prog);
    return -1;
  }
  json_error_t je;
  json_t *o = json_loads(json, JSON_REJECT_DUPLICATES, &je);
  int rc = -1;
  if (!json_is_object(o)) {
    fprintf(stderr, "%s: --speculative-config must be a JSON object%s%s\n", prog, o ? "" : ": ",
            o ? "" : je.text);
    goto done;
  }
  const char *key;
  json_t *v;
  json_object_foreach(o, key, v) {
    size_t i = 0;
    while (i < sizeof(keys) / sizeof(keys[0]) && strcmp(key, keys[i]) != 0)
      i++;
    if (i == sizeof(keys) / sizeof(keys[0])) {
      fprintf(stderr,
              "%s: --speculative-config: \"%s\" is not taken (lmserve takes method, model, "
              "num_speculative_tokens, prompt_lookup_max, prompt_lookup_min and "
              "disable_by_batch_size)\n",
              prog, key);
      goto done;
    }
    if (i < 2 && !json_is_string(v)) {
      fprintf(stderr, "%s: --speculative-config: %s must be a string\n", prog, key);
      goto done;
    }
  }
  const char *method = json_string_value(json_object_get(o, "method"));
  const char *path = json_string_value(json_object_get(o, "model"));
  int ngram = method ? strcmp(method, "ngram") == 0
                     : path && (strcmp(path, "ngram") == 0 || strcmp(path, "[ngram]") == 0);
  if (method && !ngram && strcmp(method, "mtp") != 0 && strcmp(method, "draft_model") != 0) {
    fprintf(stderr,
            "%s: --speculative-config: method \"%s\" is not served (ngram, or mtp with a Gemma 4 "
            "assistant as model)\n",
            prog, method);
    goto done;
  }
  if (method && !ngram && path && (strcmp(path, "ngram") == 0 || strcmp(path, "[ngram]") == 0)) {
    fprintf(stderr, "%s: --speculative-config: method %s takes an assistant checkpoint as model\n",
            prog, method);
    goto done;
  }
  if (method && ngram && path) {
    fprintf(stderr, "%s: --speculative-config: method ngram takes no model\n", prog);
    goto done;
  }
  if (!ngram && !path) {
    fprintf(stderr, "%s: --speculative-config: model (the assistant checkpoint) is missing\n",
            prog);
    goto done;
  }
  if (!ngram &&
      (json_object_get(o, "prompt_lookup_max") || json_object_get(o, "prompt_lookup_min"))) {
    fprintf(stderr, "%s: --speculative-config: prompt_lookup_max and _min are for method ngram\n",
            prog);
    goto done;
  }
  if (spec_int(prog, o, "num_speculative_tokens", 1, max_k, &out->k) ||
      spec_int(prog, o, "prompt_lookup_max", 1, 1024, &out->ngram_max) ||
      spec_int(prog, o, "prompt_lookup_min", 1, 1024, &out->ngram_min) ||
      spec_int(prog, o, "disable_by_batch_size", 2, 65536, &out->disable_batch))
    goto done;
  if (!ngram && strlen(path) >= cap) {
    fprintf(stderr, "%s: --speculative-config: model path too long\n", prog);
    goto done;
  }
  snprintf(model_buf, cap, "%s", ngram ? "ngram" : path);
  out->model = model_buf;
  rc = 0;
done:
  json_decref(o);
  return rc;
}
