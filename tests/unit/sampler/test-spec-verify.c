/* test-spec-verify.c — speculative decoding's rejection sampler
 * (wk_sample_verify) keeps the target distribution.
 *
 * For small vocabularies, many seeded draws (the request's seed and token
 * index fix every uniform number, so the counts are the same on every run)
 * are put to a chi-square test against the target's processed distribution
 * (temperature, top-k, top-p applied, as wk_sampler_dist gives it), at
 * significance 0.001: for every draft token, for drafts outside the kept set,
 * and for the pair of tokens a two-draft chain emits (accepted drafts, then
 * the replacement or the next step's own draw). The same counts from a
 * deliberately wrong verifier (on rejection it draws from the target without
 * removing the draft) must fail the same test, so the test can fail. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "tests/harness/th.h"
#include "worker/wk-sampler.h"

#define V     8
#define DRAWS 40000L

/* Chi-square critical values at p = 0.001 for df = 1 .. 7, and df = 63. */
static const double k_crit[8] = {0, 10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322};
#define CRIT_63 103.442

/* chi-square of counts against probabilities over the cells with p > 0;
 * *df receives (cells with p > 0) - 1; a count in a cell with p == 0 makes
 * it infinite. */
static double chi2(const long *counts, const double *p, int n, long draws, int *df) {
  double x = 0;
  int cells = 0;
  for (int i = 0; i < n; i++) {
    double e = p[i] * (double)draws;
    if (e > 0) {
      x += ((double)counts[i] - e) * ((double)counts[i] - e) / e;
      cells++;
    } else if (counts[i]) {
      x = INFINITY;
    }
  }
  *df = cells - 1;
  return x;
}

/* The processed target distribution of logits l under p, dense over V. */
static void target_dist(struct wk_sampler *s, const float *l, const struct wk_sampling_params *p,
                        double *out) {
  float tmp[V];
  memcpy(tmp, l, sizeof(tmp));
  const int32_t *ids;
  const float *probs;
  int n = 0;
  for (int i = 0; i < V; i++)
    out[i] = 0;
  TH_REQUIRE(wk_sampler_dist(s, tmp, p, NULL, &ids, &probs, &n) == 0);
  for (int i = 0; i < n; i++)
    out[ids[i]] = probs[i];
}

/* The wrong verifier: accepts the draft with probability p(draft), but on
 * rejection draws from the whole target distribution (the draft included). */
static int32_t wrong_verify(const double *q, uint64_t seed, uint64_t t, int32_t draft) {
  if (wk_sampler_uniform(seed, t, 1) < q[draft]) return draft;
  double u = wk_sampler_uniform(seed, t, 2), cum = 0;
  for (int i = 0; i < V; i++) {
    cum += q[i];
    if (u < cum) return i;
  }
  return V - 1;
}

struct setting {
  const char *name;
  float logits[V];
  float temperature;
  int top_k;
  float top_p;
};

static const struct setting k_settings[] = {
    {"peaked, t=1", {2.5f, 1.0f, 0.3f, 0.0f, -0.5f, -1.0f, -2.0f, -3.0f}, 1.0f, 0, 1.0f},
    {"flat, t=0.7", {0.1f, 0.0f, 0.2f, -0.1f, 0.05f, 0.15f, -0.2f, 0.0f}, 0.7f, 0, 1.0f},
    {"top-k 5, t=1.3", {1.0f, 0.5f, 2.0f, -1.0f, 0.0f, 1.5f, -0.5f, 0.8f}, 1.3f, 5, 1.0f},
    {"top-p 0.8", {1.2f, 0.4f, 0.9f, -0.3f, 0.1f, 0.6f, -1.0f, 0.0f}, 1.0f, 0, 0.8f},
};

TH_TEST(verify_keeps_the_target_distribution) {
  struct wk_sampler *s = NULL;
  TH_CHECK(wk_sampler_create(V, &s) == 0);
  TH_REQUIRE(s);
  for (size_t si = 0; si < sizeof(k_settings) / sizeof(k_settings[0]); si++) {
    const struct setting *st = &k_settings[si];
    struct wk_sampling_params p;
    wk_sampling_params_default(&p);
    p.temperature = st->temperature;
    p.top_k = st->top_k;
    p.top_p = st->top_p;
    p.seed = 1000 + si;
    double q[V];
    target_dist(s, st->logits, &p, q);
    for (int32_t draft = 0; draft < V; draft++) {
      long counts[V] = {0}, wrong[V] = {0}, acc = 0;
      for (long t = 0; t < DRAWS; t++) {
        float l[V];
        memcpy(l, st->logits, sizeof(l));
        struct wk_sample_result r;
        int accepted = -1;
        TH_REQUIRE(wk_sample_verify(s, l, &p, NULL, (uint64_t)t, draft, NULL, &accepted, &r) == 0);
        TH_REQUIRE(r.token >= 0 && r.token < V);
        counts[r.token]++;
        acc += accepted;
        if (accepted) TH_CHECK(r.token == draft);
        if (!accepted) TH_CHECK(r.token != draft);
        wrong[wrong_verify(q, p.seed, (uint64_t)t, draft)]++;
      }
      int df, dfw;
      double x = chi2(counts, q, V, DRAWS, &df), xw = chi2(wrong, q, V, DRAWS, &dfw);
      TH_REQUIRE(df >= 1 && df <= 7);
      fprintf(stderr,
              "%-15s draft %d: p %.3f, chi-square %6.2f (df %d, critical %.2f), wrong %9.2f\n",
              st->name, draft, q[draft], x, df, k_crit[df], xw);
      if (!(x < k_crit[df]))
        th_fail(__FILE__, __LINE__, "%s, draft %d: chi-square %.2f >= %.2f (df %d)", st->name,
                draft, x, k_crit[df], df);
      /* acceptance rate is p_target(draft) (0 outside the kept set) */
      TH_CHECK_NEAR((double)acc / DRAWS, q[draft], 0.015);
      /* the wrong verifier over-weights the draft whenever the draft is
       * possible and not certain: the test sees it */
      if (q[draft] > 0.05 && q[draft] < 0.95 && !(xw > k_crit[dfw]))
        th_fail(__FILE__, __LINE__, "%s, draft %d: the wrong verifier passes (%.2f)", st->name,
                draft, xw);
    }
  }
  wk_sampler_destroy(s);
}

/* A two-draft chain as the worker runs it: verify d1 against row 1; if taken,
 * verify d2 against row 2 (else row 2 is drawn by the next step, at the next
 * token index). The emitted pair is distributed as P x Q. */
TH_TEST(verify_chain_pair_distribution) {
  struct wk_sampler *s = NULL;
  TH_CHECK(wk_sampler_create(V, &s) == 0);
  TH_REQUIRE(s);
  static const float row1[V] = {1.5f, 1.0f, 0.2f, 0.0f, -0.5f, -1.0f, 0.5f, -2.0f};
  static const float row2[V] = {-1.0f, 0.3f, 1.1f, 0.4f, 0.0f, 0.9f, -0.3f, 0.2f};
  struct wk_sampling_params p;
  wk_sampling_params_default(&p);
  p.seed = 4242;
  double P[V], Q[V], PQ[V * V];
  target_dist(s, row1, &p, P);
  target_dist(s, row2, &p, Q);
  for (int a = 0; a < V; a++)
    for (int b = 0; b < V; b++)
      PQ[a * V + b] = P[a] * Q[b];
  const int32_t d1 = 0, d2 = 2; /* the likeliest tokens: long runs accepted */
  static long counts[V * V], wrong[V * V];
  long both = 0;
  for (long n = 0; n < DRAWS; n++) {
    uint64_t t = (uint64_t)n * 2; /* token indexes t (first) and t + 1 (second) */
    float l[V];
    struct wk_sample_result r1, r2, next;
    int acc1, acc2 = 0;
    memcpy(l, row1, sizeof(l));
    TH_REQUIRE(wk_sample_verify(s, l, &p, NULL, t, d1, NULL, &acc1, &r1) == 0);
    memcpy(l, row2, sizeof(l));
    TH_REQUIRE(wk_sample(s, l, &p, NULL, t + 1, &next) == 0); /* the next step's own draw */
    memcpy(l, row2, sizeof(l));
    if (acc1)
      TH_REQUIRE(wk_sample_verify(s, l, &p, NULL, t + 1, d2, NULL, &acc2, &r2) == 0);
    else
      r2 = next;
    counts[r1.token * V + r2.token]++;
    both += acc1 && acc2;
    int32_t w1 = wrong_verify(P, p.seed, t, d1);
    int32_t w2 = w1 == d1 ? wrong_verify(Q, p.seed, t + 1, d2) : next.token;
    wrong[w1 * V + w2]++;
  }
  int df, dfw;
  double x = chi2(counts, PQ, V * V, DRAWS, &df), xw = chi2(wrong, PQ, V * V, DRAWS, &dfw);
  TH_REQUIRE(df == 63 && dfw == 63);
  fprintf(stderr, "pairs: chi-square %.2f (df 63, critical %.2f), wrong %.2f\n", x, CRIT_63, xw);
  if (!(x < CRIT_63)) th_fail(__FILE__, __LINE__, "pair chi-square %.2f >= %.2f", x, CRIT_63);
  if (!(xw > CRIT_63)) th_fail(__FILE__, __LINE__, "the wrong verifier's pairs pass (%.2f)", xw);
  /* both drafts taken with probability P(d1) Q(d2) */
  TH_CHECK_NEAR((double)both / DRAWS, P[d1] * Q[d2], 0.015);
  wk_sampler_destroy(s);
}

/* Greedy verification is exact: the draft is taken iff it is the argmax,
 * and the replacement is the argmax. */
TH_TEST(verify_greedy_is_argmax) {
  struct wk_sampler *s = NULL;
  TH_CHECK(wk_sampler_create(V, &s) == 0);
  TH_REQUIRE(s);
  struct wk_sampling_params p;
  wk_sampling_params_default(&p);
  p.temperature = 0;
  for (size_t si = 0; si < sizeof(k_settings) / sizeof(k_settings[0]); si++) {
    int32_t best = 0;
    for (int i = 1; i < V; i++)
      if (k_settings[si].logits[i] > k_settings[si].logits[best]) best = i;
    for (int32_t draft = 0; draft < V; draft++) {
      float l[V];
      memcpy(l, k_settings[si].logits, sizeof(l));
      struct wk_sample_result r;
      int accepted = -1;
      TH_REQUIRE(wk_sample_verify(s, l, &p, NULL, (uint64_t)draft, draft, NULL, &accepted, &r) ==
                 0);
      TH_CHECK_EQ_INT(accepted, draft == best);
      TH_CHECK_EQ_INT(r.token, best);
    }
  }
  wk_sampler_destroy(s);
}

/* The verifier's token is the draw sampling without drafts makes at the same
 * position (seed, token index): whichever draft it is offered, a seeded
 * request's tokens are those of plain sampling, accepted or not. */
TH_TEST(verify_gives_the_plain_draw) {
  struct wk_sampler *s = NULL;
  TH_CHECK(wk_sampler_create(V, &s) == 0);
  TH_REQUIRE(s);
  long accepted_any = 0, rejected_any = 0;
  for (size_t si = 0; si < sizeof(k_settings) / sizeof(k_settings[0]); si++)
    for (uint64_t t = 0; t < 300; t++)
      for (int32_t draft = 0; draft < V; draft++) {
        struct wk_sampling_params p;
        wk_sampling_params_default(&p);
        p.temperature = k_settings[si].temperature;
        p.top_k = k_settings[si].top_k;
        p.top_p = k_settings[si].top_p;
        p.seed = 1234 + si;
        float l1[V], l2[V];
        memcpy(l1, k_settings[si].logits, sizeof(l1));
        memcpy(l2, k_settings[si].logits, sizeof(l2));
        struct wk_sample_result plain, r;
        int accepted = -1;
        TH_REQUIRE(wk_sample(s, l1, &p, NULL, t, &plain) == 0);
        TH_REQUIRE(wk_sample_verify(s, l2, &p, NULL, t, draft, NULL, &accepted, &r) == 0);
        TH_CHECK_EQ_INT(r.token, plain.token);
        TH_CHECK_EQ_INT(accepted, plain.token == draft);
        accepted_any += accepted;
        rejected_any += !accepted;
      }
  TH_CHECK(accepted_any > 0 && rejected_any > 0);
  wk_sampler_destroy(s);
}
