/* test-sampler.c — the worker's sampler against hand-computed values, a
 * brute-force reference (full sort), and chi-square tests of the sampling
 * and rejection-sampling distributions. */
#include <math.h>
#include <stdlib.h>

#include "common/cm-err.h"
#include "tests/harness/th.h"
#include "worker/wk-sampler.h"

static void fill_logp(float *l, const double *p, int n) {
  for (int i = 0; i < n; i++) l[i] = (float)log(p[i]);
}

/* A sampler over a vocabulary of n tokens. */
static struct wk_sampler *new_sampler(int n) {
  struct wk_sampler *s = NULL;
  TH_REQUIRE(wk_sampler_create(n, &s) == 0 && s);
  return s;
}

/* The default sampling parameters. */
static struct wk_sampling_params params(void) {
  struct wk_sampling_params p;
  wk_sampling_params_default(&p);
  return p;
}

/* The default parameters with a filter: temperature t, top-p, min-p and top-k. */
static struct wk_sampling_params filtered(float t, float top_p, float min_p, int top_k) {
  struct wk_sampling_params p = params();
  p.temperature = t;
  p.top_p = top_p;
  p.min_p = min_p;
  p.top_k = top_k;
  return p;
}

TH_TEST(greedy_and_penalties) {
  struct wk_sampler *s = new_sampler(6);
  struct wk_sampling_params p = params();
  p.temperature = 0;
  float l[6] = {1, 3, 2, -1, 0.5f, 2.9f};
  struct wk_sample_result r;
  TH_CHECK_EQ_INT(wk_sample(s, l, &p, NULL, 0, &r), 0);
  TH_CHECK_EQ_INT(r.token, 1);

  /* repetition 2: 3 -> 1.5 (positive divided), -1 -> -2 (negative multiplied) */
  struct wk_penalty_state st;
  wk_penalty_init(&st);
  int32_t prompt[] = {1, 3};
  TH_REQUIRE(wk_penalty_add_prompt(&st, prompt, 2) == 0);
  float l2[6] = {1, 3, 2, -1, 0.5f, 2.9f};
  p.repetition_penalty = 2;
  TH_CHECK_EQ_INT(wk_sample(s, l2, &p, &st, 0, &r), 0);
  TH_CHECK_NEAR(l2[1], 1.5, 1e-6);
  TH_CHECK_NEAR(l2[3], -2, 1e-6);
  TH_CHECK_EQ_INT(r.token, 5);

  /* frequency 0.5 x count 3 and presence 1 on token 5: 2.9 - 1.5 - 1 */
  p.repetition_penalty = 1;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 1;
  for (int i = 0; i < 3; i++) TH_REQUIRE(wk_penalty_add_output(&st, 5) == 0);
  float l3[6] = {1, 3, 2, -1, 0.5f, 2.9f};
  TH_CHECK_EQ_INT(wk_sample(s, l3, &p, &st, 0, &r), 0);
  TH_CHECK_NEAR(l3[5], 0.4, 1e-6);
  TH_CHECK_NEAR(l3[1], 3, 0); /* prompt-only tokens get no frequency/presence penalty */
  TH_CHECK_EQ_INT(r.token, 1);
  wk_penalty_free(&st);
  wk_sampler_destroy(s);
}

TH_TEST(top_p_min_p_top_k_by_hand) {
  struct wk_sampler *s = new_sampler(4);
  const double probs[4] = {0.15, 0.5, 0.05, 0.3};
  float l[4];
  struct wk_sampling_params p = params();
  const int32_t *ids;
  const float *pr;
  int n;
  /* top-p 0.7: 0.5 then 0.3 reaches 0.8 >= 0.7 -> {1, 3} renormalised */
  p.top_p = 0.7f;
  fill_logp(l, probs, 4);
  TH_REQUIRE(wk_sampler_dist(s, l, &p, NULL, &ids, &pr, &n) == 0);
  TH_CHECK_EQ_INT(n, 2);
  TH_CHECK_EQ_INT(ids[0], 1);
  TH_CHECK_EQ_INT(ids[1], 3);
  TH_CHECK_NEAR(pr[0], 0.625, 1e-6);
  TH_CHECK_NEAR(pr[1], 0.375, 1e-6);
  /* min-p 0.2: keep p >= 0.1 -> {1, 3, 0} */
  p.top_p = 1;
  p.min_p = 0.2f;
  fill_logp(l, probs, 4);
  TH_REQUIRE(wk_sampler_dist(s, l, &p, NULL, &ids, &pr, &n) == 0);
  TH_CHECK_EQ_INT(n, 3);
  double sum = 0;
  for (int i = 0; i < n; i++) {
    sum += pr[i];
    TH_CHECK(ids[i] != 2);
  }
  TH_CHECK_NEAR(sum, 1, 1e-6);
  /* top-k 1 is the argmax at any temperature */
  p.min_p = 0;
  p.top_k = 1;
  p.temperature = 1.7f;
  for (uint64_t t = 0; t < 50; t++) {
    struct wk_sample_result r;
    fill_logp(l, probs, 4);
    TH_REQUIRE(wk_sample(s, l, &p, NULL, t, &r) == 0);
    TH_CHECK_EQ_INT(r.token, 1);
  }
  /* bad params are an error, not a crash */
  p.top_p = 0;
  TH_CHECK_EQ_INT(wk_sampler_dist(s, l, &p, NULL, &ids, &pr, &n), CM_ERR_INVAL);
  wk_sampler_destroy(s);
}

/* Brute-force reference: sort everything, apply min-p, top-k, top-p. */
struct ref_c {
  double l;
  int id;
};
static int ref_cmp(const void *a, const void *b) {
  const struct ref_c *x = a, *y = b;
  if (x->l != y->l) return x->l > y->l ? -1 : 1;
  return x->id - y->id;
}

TH_TEST(large_vocab_matches_full_sort) {
  const int V = 262144;
  struct wk_sampler *s = new_sampler(V);
  float *l = malloc(V * sizeof(float)), *orig = malloc(V * sizeof(float));
  struct ref_c *rc = malloc(V * sizeof(*rc));
  double *rp = malloc(V * sizeof(double));
  TH_REQUIRE(s && l && orig && rc && rp);
  uint64_t x = 12345;
  for (int i = 0; i < V; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    orig[i] = (float)((double)(x >> 11) / 9007199254740992.0 * 12.0 - 6.0);
  }
  const struct wk_sampling_params cases[] = {
      filtered(1, 0.9f, 0, 0),   filtered(0.7f, 0.5f, 0, 0), filtered(1.3f, 0.95f, 0.01f, 0),
      filtered(1, 0.8f, 0, 500), filtered(1, 1, 0.3f, 0),    filtered(0.5f, 0.99f, 0, 40)};
  for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
    struct wk_sampling_params p = cases[c];
    memcpy(l, orig, V * sizeof(float));
    const int32_t *ids;
    const float *pr;
    int n;
    TH_REQUIRE(wk_sampler_dist(s, l, &p, NULL, &ids, &pr, &n) == 0);
    /* reference */
    double m = -1e30;
    for (int i = 0; i < V; i++) {
      rc[i].l = (double)(orig[i] * (1.0f / p.temperature));
      rc[i].id = i;
      if (rc[i].l > m) m = rc[i].l;
    }
    qsort(rc, V, sizeof(*rc), ref_cmp);
    int nn = V;
    if (p.min_p > 0) {
      double cut = m + log((double)p.min_p);
      while (nn > 1 && rc[nn - 1].l < cut) nn--;
    }
    if (p.top_k > 0 && p.top_k < nn) nn = p.top_k;
    double z = 0;
    for (int i = 0; i < nn; i++) z += exp(rc[i].l - m);
    int keep = nn;
    if (p.top_p < 1) {
      double cum = 0;
      for (int i = 0; i < nn; i++) {
        if (cum >= p.top_p * z) {
          keep = i;
          break;
        }
        cum += exp(rc[i].l - m);
      }
    }
    if (p.top_p < 1 || p.top_k > 0) {
      TH_CHECK_EQ_INT(n, keep);
      for (int i = 0; i < keep && i < n; i++) TH_CHECK_EQ_INT(ids[i], rc[i].id);
    } else {
      TH_CHECK_EQ_INT(n, keep); /* unsorted set: same size */
    }
    double sum = 0;
    for (int i = 0; i < n; i++) sum += pr[i];
    TH_CHECK_NEAR(sum, 1.0, 1e-4);
  }
  free(l);
  free(orig);
  free(rc);
  free(rp);
  wk_sampler_destroy(s);
}

/* chi-square statistic of counts against probabilities */
static double chi2(const long *counts, const double *p, int n, long draws) {
  double x = 0;
  for (int i = 0; i < n; i++) {
    double e = p[i] * (double)draws;
    if (e > 0) x += (counts[i] - e) * (counts[i] - e) / e;
  }
  return x;
}

/* df = 7, p = 0.001 */
#define CHI2_CRIT_7 24.32
#define CHI2_CRIT_3 16.27 /* df 3, p = 0.001 */

/* The target distribution of the statistical tests, and how many draws they take. */
static const double k_probs[8] = {0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02};
#define DRAWS 100000L

TH_TEST(sampling_distribution_chi_square) {
  struct wk_sampler *s = new_sampler(8);
  struct wk_sampling_params p = params();
  p.seed = 7;
  long counts[8] = {0};
  float l[8];
  for (long t = 0; t < DRAWS; t++) {
    struct wk_sample_result r;
    fill_logp(l, k_probs, 8);
    TH_REQUIRE(wk_sample(s, l, &p, NULL, (uint64_t)t, &r) == 0);
    counts[r.token]++;
  }
  double x = chi2(counts, k_probs, 8, DRAWS);
  TH_CHECK(x < CHI2_CRIT_7);
  /* and the test can fail: the same counts against a wrong distribution */
  const double wrong[8] = {0.2, 0.3, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02};
  TH_CHECK(chi2(counts, wrong, 8, DRAWS) > CHI2_CRIT_7);
  wk_sampler_destroy(s);
}

/* DRAWS verifications of draft against k_probs (the draw's index as its
 * step) under allow (NULL for none): the tokens drawn counted into counts[8],
 * the number of drafts accepted returned. A rejected draft is never the token
 * drawn in its place. */
static long verify_draws(struct wk_sampler *s, const struct wk_sampling_params *p, int draft,
                         const uint32_t *allow, long counts[8]) {
  float l[8];
  long acc = 0;
  for (long t = 0; t < DRAWS; t++) {
    struct wk_sample_result r;
    int accepted = 0;
    fill_logp(l, k_probs, 8);
    TH_REQUIRE(wk_sample_verify(s, l, p, NULL, (uint64_t)t, draft, allow, &accepted, &r) == 0);
    TH_REQUIRE(r.token >= 0 && r.token < 8);
    counts[r.token]++;
    acc += accepted;
    if (!accepted) TH_CHECK(r.token != draft);
  }
  return acc;
}

/* One verification of draft against k_probs at step 0: the token, and in
 * *accepted whether the draft was. */
static int verify_once(struct wk_sampler *s, const struct wk_sampling_params *p, int draft,
                       const uint32_t *allow, int *accepted) {
  float l[8];
  struct wk_sample_result r;
  fill_logp(l, k_probs, 8);
  TH_REQUIRE(wk_sample_verify(s, l, p, NULL, 0, draft, allow, accepted, &r) == 0);
  return r.token;
}

TH_TEST(rejection_sampling_preserves_target) {
  struct wk_sampler *s = new_sampler(8);
  struct wk_sampling_params p = params();
  p.seed = 99;
  for (int draft = 0; draft < 8; draft += 3) {
    long counts[8] = {0};
    long acc = verify_draws(s, &p, draft, NULL, counts);
    TH_CHECK(chi2(counts, k_probs, 8, DRAWS) < CHI2_CRIT_7);
    /* acceptance rate is p_target(draft) */
    TH_CHECK_NEAR((double)acc / DRAWS, k_probs[draft], 0.01);
  }
  /* greedy verification is exact */
  p.temperature = 0;
  int accepted;
  int token = verify_once(s, &p, 0, NULL, &accepted);
  TH_CHECK(accepted && token == 0);
  token = verify_once(s, &p, 4, NULL, &accepted);
  TH_CHECK(!accepted && token == 0);
  wk_sampler_destroy(s);
}

/* With a structured output's mask the target is the masked distribution: a draft
 * the mask refuses is never accepted, and what is drawn keeps p(x | allowed). */
TH_TEST(rejection_sampling_under_a_mask) {
  struct wk_sampler *s = new_sampler(8);
  struct wk_sampling_params p = params();
  p.seed = 7;
  const uint32_t allow[1] = {1u << 1 | 1u << 3 | 1u << 4 | 1u << 6};
  double q[8] = {0}, z = 0;
  for (int i = 0; i < 8; i++)
    if (allow[0] >> i & 1) z += k_probs[i];
  for (int i = 0; i < 8; i++)
    q[i] = allow[0] >> i & 1 ? k_probs[i] / z : 0;
  for (int draft = 0; draft < 8; draft += 2) { /* 0 and 2 refused, 4 and 6 allowed */
    long counts[8] = {0};
    long acc = verify_draws(s, &p, draft, allow, counts);
    for (int i = 0; i < 8; i++)
      if (!q[i]) TH_CHECK_EQ_INT(counts[i], 0);
    long kept[4] = {counts[1], counts[3], counts[4], counts[6]};
    double qk[4] = {q[1], q[3], q[4], q[6]};
    TH_CHECK(chi2(kept, qk, 4, DRAWS) < CHI2_CRIT_3);
    TH_CHECK_NEAR((double)acc / DRAWS, q[draft], 0.01);
  }
  /* greedy: the masked argmax */
  p.temperature = 0;
  int accepted;
  int token = verify_once(s, &p, 0, allow, &accepted);
  int best = 1;
  for (int i = 0; i < 8; i++)
    if (q[i] > q[best]) best = i;
  TH_CHECK(!accepted && token == best);
  token = verify_once(s, &p, best, allow, &accepted);
  TH_CHECK(accepted && token == best);
  wk_sampler_destroy(s);
}

TH_TEST(seeded_reproducible_and_logprobs) {
  const int V = 1000;
  struct wk_sampler *s = new_sampler(V);
  float *l = malloc(V * sizeof(float)), *orig = malloc(V * sizeof(float));
  for (int i = 0; i < V; i++) orig[i] = (float)sin(i * 0.37) * 3.0f;
  struct wk_sampling_params p = params();
  p.seed = 42;
  p.top_p = 0.9f;
  p.n_logprobs = 5;
  int same = 1, differs = 0;
  for (uint64_t t = 0; t < 200; t++) {
    struct wk_sample_result a, b, c;
    memcpy(l, orig, V * sizeof(float));
    wk_sample(s, l, &p, NULL, t, &a);
    memcpy(l, orig, V * sizeof(float));
    wk_sample(s, l, &p, NULL, t, &b);
    same &= a.token == b.token;
    struct wk_sampling_params q = p;
    q.seed = 43;
    memcpy(l, orig, V * sizeof(float));
    wk_sample(s, l, &q, NULL, t, &c);
    differs |= a.token != c.token;
    /* raw logprobs: top-5 sorted, the sampled token's matches log-softmax */
    TH_CHECK_EQ_INT(a.n_top, 5);
    for (int k = 1; k < a.n_top; k++) TH_CHECK(a.top_logprobs[k - 1] >= a.top_logprobs[k]);
    double z = 0;
    for (int i = 0; i < V; i++) z += exp((double)orig[i]);
    TH_CHECK_NEAR(a.logprob, orig[a.token] - log(z), 1e-4);
    TH_CHECK_NEAR(a.top_logprobs[0], orig[a.top_ids[0]] - log(z), 1e-4);
  }
  TH_CHECK(same);
  TH_CHECK(differs);
  free(l);
  free(orig);
  wk_sampler_destroy(s);
}
