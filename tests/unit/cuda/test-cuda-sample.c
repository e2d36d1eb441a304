/* test-cuda-sample.c — kn_sample on the device against the CPU oracle
 * (kernels/cpu/kn-cpu-sample.c): greedy rows (with penalties, NaN, padded
 * strides) equal exactly; raw logprobs and top logprobs within float
 * rounding; seeded draws stay inside the CPU's filtered set (top-k, top-p,
 * min-p, penalties, ties at the boundaries) and follow its probabilities
 * (chi-square); the same seed gives the same token alone or batched; a row
 * with nothing finite is refused; masked rows (structured outputs) as the CPU
 * draws them. Skips loudly without a device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu-sample.h"
#include "kernels/kn-backend.h"
#include "tests/harness/th.h"
#include "tests/unit/cuda/cuda-test-util.h"

static struct kn_sample_params params_default(void) {
  struct kn_sample_params p;
  kn_sample_params_default(&p);
  return p;
}

/* Penalty state shared by the tests: five ids, one seen in the prompt only. */
static const int32_t k_pen_ids[5] = {1, 4, 9, 16, -1};
static const int32_t k_pen_counts[5] = {2, 0, 1, 3, 0};

static void with_penalties(struct kn_sample_params *p) {
  p->repetition_penalty = 1.3f;
  p->frequency_penalty = 0.4f;
  p->presence_penalty = 0.3f;
  p->pen_ids = k_pen_ids;
  p->pen_counts = k_pen_counts;
  p->n_pen = 5;
}

static void check_logprobs(const char *what, int t, const struct kn_sample_out *ref,
                           const struct kn_sample_out *got, double tol) {
  TH_CHECK_EQ_INT(got->n_top, ref->n_top);
  if (fabs(got->logprob - ref->logprob) > tol)
    th_fail(__FILE__, __LINE__, "%s row %d: logprob cpu %g cuda %g", what, t, ref->logprob,
            got->logprob);
  for (int j = 0; j < ref->n_top && j < got->n_top; j++)
    if (got->top_ids[j] != ref->top_ids[j] ||
        fabs(got->top_logprobs[j] - ref->top_logprobs[j]) > tol)
      th_fail(__FILE__, __LINE__, "%s row %d: top %d cpu %d (%g) cuda %d (%g)", what, t, j,
              ref->top_ids[j], ref->top_logprobs[j], got->top_ids[j], got->top_logprobs[j]);
}

/* ---- greedy rows and logprobs --------------------------------------------- */

TH_TEST(cuda_sample_greedy_and_logprobs) {
  struct ct_env e;
  ct_open(&e, 21);
  const int Vs[] = {1000, 262144}, Ts[] = {1, 5, 33};
  for (size_t vi = 0; vi < 2; vi++)
    for (size_t ti = 0; ti < 3; ti++) {
      int V = Vs[vi], T = Ts[ti];
      ptrdiff_t ld = V + 3;
      size_t total = (size_t)T * (size_t)ld;
      float *x = malloc(sizeof(float) * total);
      TH_REQUIRE(x);
      ct_fill(&e, x, total, 6.0f);
      for (int t = 0; t < T; t++) { /* id 1 leads unless penalised, then id 2 does */
        x[(ptrdiff_t)t * ld + 1] = 10.0f;
        x[(ptrdiff_t)t * ld + 2] = 9.5f;
      }
      if (T > 1) x[ld + 5] = NAN; /* NaN never wins */
      struct kn_sample_params *p = calloc((size_t)T, sizeof(*p));
      struct kn_sample_out *ref = calloc((size_t)T, sizeof(*ref));
      struct kn_sample_out *got = calloc((size_t)T, sizeof(*got));
      TH_REQUIRE(p && ref && got);
      for (int t = 0; t < T; t++) {
        p[t] = params_default();
        p[t].temperature = 0.0f;
        if (t % 2) with_penalties(&p[t]);
        p[t].n_logprobs = t % 3 == 0 ? 5 : t % 3 == 1 ? 0 : -1;
        if (t == T - 1) p[t].n_logprobs = KN_SAMPLE_MAX_LOGPROBS;
      }
      float *x_d = ct_up(&e, x, total * sizeof(float));
      TH_CHECK(kn_sample(e.cpu, ref, x, ld, T, V, p) == 0);
      TH_CHECK(kn_sample(e.gpu, got, x_d, ld, T, V, p) == 0);
      char what[64];
      snprintf(what, sizeof(what), "greedy V=%d T=%d", V, T);
      for (int t = 0; t < T; t++) {
        if (got[t].token != ref[t].token)
          th_fail(__FILE__, __LINE__, "%s row %d: cpu %d cuda %d", what, t, ref[t].token,
                  got[t].token);
        if (t != 1) check_logprobs(what, t, &ref[t], &got[t], 2e-4);
      }
      /* the input stays as it was */
      float *back = malloc(sizeof(float) * total);
      TH_REQUIRE(back);
      ct_down(&e, back, x_d, total * sizeof(float));
      TH_CHECK(memcmp(back, x, total * sizeof(float)) == 0);
      free(back);
      kn_free(e.gpu, x_d);
      free(x);
      free(p);
      free(ref);
      free(got);
    }
  ct_close(&e);
}

/* ---- the filtered distribution -------------------------------------------- */

/* Draws N tokens for `row` (R rows per call, seeds 0..N-1) on the device and
 * checks them against the CPU's processed distribution: every token inside
 * the kept set (or the next candidate in order, when allow_next: a top-p
 * boundary may move by one token under float sums), and a chi-square over
 * bins with at least 5 expected draws. */
static void check_draws(struct ct_env *e, const char *what, const float *row, int V,
                        struct kn_sample_params p, int N, int R, int allow_next) {
  struct kn_cpu_sampler *s = NULL;
  TH_CHECK(kn_cpu_sampler_create(V, &s) == 0);
  float *work = malloc(sizeof(float) * (size_t)V);
  double *expect = calloc((size_t)V, sizeof(double));
  int *hist = calloc((size_t)V, sizeof(int));
  float *rows = malloc(sizeof(float) * (size_t)V * (size_t)R);
  struct kn_sample_params *ps = malloc(sizeof(*ps) * (size_t)R);
  struct kn_sample_out *o = malloc(sizeof(*o) * (size_t)R);
  TH_REQUIRE(s && work && expect && hist && rows && ps && o);
  memcpy(work, row, sizeof(float) * (size_t)V);
  const int32_t *ids;
  const float *probs;
  int n;
  TH_REQUIRE(kn_cpu_sample_dist(s, work, &p, &ids, &probs, &n) == 0);
  for (int i = 0; i < n; i++)
    expect[ids[i]] = (double)probs[i] * N;
  /* the best candidate the CPU left out, in (processed logit desc, id asc) order */
  int next = -1;
  for (int i = 0; i < V; i++)
    if (expect[i] == 0 && !isnan(work[i]) && (next < 0 || work[i] > work[next])) next = i;
  for (int r = 0; r < R; r++)
    memcpy(rows + (size_t)r * V, row, sizeof(float) * (size_t)V);
  float *rows_d = ct_up(e, rows, sizeof(float) * (size_t)V * (size_t)R);
  for (int k0 = 0; k0 < N; k0 += R) {
    int m = N - k0 < R ? N - k0 : R;
    for (int r = 0; r < m; r++) {
      ps[r] = p;
      ps[r].seed = (uint64_t)(k0 + r);
      ps[r].counter = 3;
    }
    TH_REQUIRE(kn_sample(e->gpu, o, rows_d, V, m, V, ps) == 0);
    for (int r = 0; r < m; r++) {
      TH_REQUIRE(o[r].token >= 0 && o[r].token < V);
      hist[o[r].token]++;
    }
  }
  int outside = 0, at_next = 0;
  double chi2 = 0, rest_e = 0, rest_o = 0;
  int df = -1;
  for (int i = 0; i < V; i++) {
    if (expect[i] == 0) {
      if (i == next && allow_next)
        at_next += hist[i];
      else
        outside += hist[i];
    } else if (expect[i] < 5) {
      rest_e += expect[i];
      rest_o += hist[i];
    } else {
      chi2 += (hist[i] - expect[i]) * (hist[i] - expect[i]) / expect[i];
      df++;
    }
  }
  if (rest_e > 0) {
    chi2 += (rest_o - rest_e) * (rest_o - rest_e) / rest_e;
    df++;
  }
  if (outside) th_fail(__FILE__, __LINE__, "%s: %d draws outside the CPU's set", what, outside);
  if (at_next > N / 100)
    th_fail(__FILE__, __LINE__, "%s: %d draws of the first token the CPU left out", what, at_next);
  if (df > 0 && chi2 > df + 6.0 * sqrt(2.0 * df) + 10)
    th_fail(__FILE__, __LINE__, "%s: chi-square %.1f with %d degrees of freedom", what, chi2, df);
  kn_free(e->gpu, rows_d);
  kn_cpu_sampler_destroy(s);
  free(work);
  free(expect);
  free(hist);
  free(rows);
  free(ps);
  free(o);
}

TH_TEST(cuda_sample_distribution) {
  struct ct_env e;
  ct_open(&e, 22);
  enum { V = 64 };
  float row[V];
  for (int i = 0; i < V; i++)
    row[i] = 0.11f * (float)((i * 37) % V) - 3.0f + 0.001f * (float)i;
  struct {
    const char *what;
    float temperature, top_p, min_p;
    int top_k, pen;
  } cases[] = {
      {"temperature", 1.0f, 1.0f, 0.0f, 0, 0},
      {"top-k", 0.7f, 1.0f, 0.0f, 10, 0},
      {"top-p", 1.0f, 0.8f, 0.0f, 0, 0},
      {"min-p", 1.3f, 1.0f, 0.05f, 0, 0},
      {"all + penalties", 1.1f, 0.9f, 0.01f, 20, 1},
  };
  for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
    struct kn_sample_params p = params_default();
    p.temperature = cases[c].temperature;
    p.top_p = cases[c].top_p;
    p.min_p = cases[c].min_p;
    p.top_k = cases[c].top_k;
    if (cases[c].pen) with_penalties(&p);
    check_draws(&e, cases[c].what, row, V, p, 40000, 4000, cases[c].top_p < 1.0f);
  }
  ct_close(&e);
}

/* Many exact ties at the top-k and top-p boundaries: the kept set is decided
 * by id (lower first), as on the CPU. */
TH_TEST(cuda_sample_ties_at_the_boundary) {
  struct ct_env e;
  ct_open(&e, 23);
  enum { V = 300 };
  float row[V];
  for (int i = 0; i < V; i++)
    row[i] = (float)((i * 7) % 3); /* 100 tokens each of 0, 1 and 2 */
  struct kn_sample_params p = params_default();
  p.top_k = 130; /* all the 2s and the 30 lowest ids among the 1s */
  check_draws(&e, "top-k ties", row, V, p, 30000, 3000, 0);
  p.top_k = 0;
  p.top_p = 0.5f; /* part of the 2s */
  check_draws(&e, "top-p ties", row, V, p, 30000, 3000, 1);
  ct_close(&e);
}

TH_TEST(cuda_sample_large_vocab) {
  struct ct_env e;
  ct_open(&e, 24);
  enum { V = 262144 };
  float *row = malloc(sizeof(float) * V);
  TH_REQUIRE(row);
  ct_fill(&e, row, V, 8.0f);
  struct kn_sample_params p = params_default();
  p.temperature = 0.8f;
  p.top_k = 40;
  p.top_p = 0.9f;
  with_penalties(&p);
  check_draws(&e, "V=262144 top-k 40 top-p 0.9", row, V, p, 4000, 200, 1);
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.2f;
  check_draws(&e, "V=262144 min-p 0.2", row, V, p, 4000, 200, 0);
  free(row);
  ct_close(&e);
}

/* ---- reproducibility and errors -------------------------------------------- */

TH_TEST(cuda_sample_seeded_reproducible) {
  struct ct_env e;
  ct_open(&e, 25);
  enum { T = 24, V = 5000 };
  struct ct_in x;
  ct_in_init(&e, &x, (size_t)T * V, 4.0f);
  struct kn_sample_params p[T];
  struct kn_sample_out a[T], b[T], one;
  for (int t = 0; t < T; t++) {
    p[t] = params_default();
    p[t].temperature = 1.0f + 0.05f * (float)t;
    p[t].top_k = t % 2 ? 100 : 0;
    p[t].top_p = t % 3 ? 0.95f : 1.0f;
    if (t % 4 == 0) with_penalties(&p[t]);
    p[t].seed = 77 + (uint64_t)t;
    p[t].counter = 12;
  }
  TH_REQUIRE(kn_sample(e.gpu, a, x.dev, V, T, V, p) == 0);
  TH_REQUIRE(kn_sample(e.gpu, b, x.dev, V, T, V, p) == 0);
  int moved = 0;
  for (int t = 0; t < T; t++) {
    TH_CHECK_EQ_INT(b[t].token, a[t].token);
    TH_REQUIRE(kn_sample(e.gpu, &one, x.dev + (size_t)t * V, V, 1, V, &p[t]) == 0);
    TH_CHECK_EQ_INT(one.token, a[t].token); /* alone = batched */
    p[t].counter++;
    TH_REQUIRE(kn_sample(e.gpu, &one, x.dev + (size_t)t * V, V, 1, V, &p[t]) == 0);
    moved += one.token != a[t].token;
  }
  TH_CHECK(moved > 0); /* the counter changes the draws */
  ct_in_free(&e, &x);
  ct_close(&e);
}

TH_TEST(cuda_sample_nothing_finite) {
  struct ct_env e;
  ct_open(&e, 26);
  float x[2][8];
  for (int i = 0; i < 8; i++) {
    x[0][i] = (float)i;
    x[1][i] = i == 3 ? NAN : -INFINITY;
  }
  float *x_d = ct_up(&e, x, sizeof(x));
  struct kn_sample_params p[2] = {params_default(), params_default()};
  struct kn_sample_out o[2];
  TH_CHECK_EQ_INT(kn_sample(e.gpu, o, x_d, 8, 2, 8, p), CM_ERR_INVAL);
  p[1].temperature = 0.0f; /* greedy: kn_argmax's answer, index 0 */
  TH_REQUIRE(kn_sample(e.gpu, o, x_d, 8, 2, 8, p) == 0);
  TH_CHECK_EQ_INT(o[1].token, 0);
  TH_CHECK(o[0].token >= 0 && o[0].token < 8);
  kn_free(e.gpu, x_d);
  ct_close(&e);
}

/* ---- structured outputs' masks ----------------------------------------------- */

/* A mask of V tokens: every id with id % every == rest, and id 1 (leading). */
static uint32_t *make_mask(int V, int every, int rest) {
  uint32_t *m = calloc(((size_t)V + 31) / 32, sizeof(uint32_t));
  TH_REQUIRE(m);
  for (int i = 0; i < V; i++)
    if (i % every == rest || i == 1) m[i / 32] |= 1u << (i % 32);
  return m;
}

/* kn_sample with masks (kn_sample_params.allow): the device took them at start-up
 * (its check passed); greedy rows give the CPU's tokens and raw logprobs, masked or
 * not, penalised or not, in one call; seeded draws stay inside the CPU's masked set
 * and follow its probabilities; a mask that allows nothing is refused. */
TH_TEST(cuda_sample_masks) {
  struct ct_env e;
  ct_open(&e, 27);
  TH_REQUIRE(kn_sample_takes_masks(e.gpu));
  enum { V = 262143, T = 6 }; /* not a multiple of 32: the last word's tail */
  float *x = malloc(sizeof(float) * (size_t)T * V);
  TH_REQUIRE(x);
  ct_fill(&e, x, (size_t)T * V, 6.0f);
  uint32_t *sparse = make_mask(V, 997, 3), *dense = make_mask(V, 3, 1),
           *all_but = make_mask(V, 1, 0);
  all_but[0] &= ~(1u << 1); /* all but id 1, the leader */
  for (int t = 0; t < T; t++)
    x[(size_t)t * V + 1] = 12.0f;
  struct kn_sample_params p[T];
  struct kn_sample_out ref[T], got[T];
  for (int t = 0; t < T; t++) {
    p[t] = params_default();
    p[t].temperature = 0.0f;
    p[t].n_logprobs = t % 2 ? 3 : -1;
    if (t >= 3) with_penalties(&p[t]);
  }
  p[0].allow = sparse, p[1].allow = dense, p[2].allow = all_but, p[4].allow = all_but;
  float *x_d = ct_up(&e, x, sizeof(float) * (size_t)T * V);
  TH_REQUIRE(kn_sample(e.cpu, ref, x, V, T, V, p) == 0);
  TH_REQUIRE(kn_sample(e.gpu, got, x_d, V, T, V, p) == 0);
  for (int t = 0; t < T; t++) {
    if (got[t].token != ref[t].token)
      th_fail(__FILE__, __LINE__, "masked greedy row %d: cpu %d cuda %d", t, ref[t].token,
              got[t].token);
    check_logprobs("masked greedy", t, &ref[t], &got[t], 2e-4);
  }
  TH_CHECK(got[2].token != 1 && got[4].token != 1); /* the mask, not the logits, decided */
  float *y = malloc(sizeof(float) * 2 * (size_t)V); /* rows without a leader */
  TH_REQUIRE(y);
  ct_fill(&e, y, 2 * (size_t)V, 3.0f);
  struct kn_sample_params q = params_default();
  q.temperature = 0.8f;
  q.allow = dense;
  q.top_k = 50;
  with_penalties(&q);
  check_draws(&e, "masked 1 in 3, top-k 50, penalties", y, V, q, 4000, 200, 0);
  q = params_default();
  q.allow = sparse;
  check_draws(&e, "masked 1 in 997", y + V, V, q, 4000, 200, 0);
  uint32_t *none = calloc(((size_t)V + 31) / 32, sizeof(uint32_t));
  TH_REQUIRE(none);
  none[V / 32] = ~0u << (V % 32); /* only ids past V: nothing */
  p[0].allow = none;
  TH_CHECK_EQ_INT(kn_sample(e.gpu, got, x_d, V, 1, V, p), CM_ERR_INVAL);
  kn_free(e.gpu, x_d);
  free(x), free(y), free(sparse), free(dense), free(all_but), free(none);
  ct_close(&e);
}
