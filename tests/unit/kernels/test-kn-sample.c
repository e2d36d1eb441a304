/* test-kn-sample.c — the CPU backend's kn_sample op, the oracle of the
 * device versions: argument checks, the logits left untouched, greedy rows
 * equal to kn_argmax of the penalised (and biased) logits, rows independent of their batch,
 * seeded reproducibility, a chi-square of seeded draws against the processed
 * distribution, and raw logprobs against a double-precision log-softmax. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu-sample.h"
#include "tests/unit/kernels/kn-test-util.h"

static struct kn_sample_params params_default(void) {
  struct kn_sample_params p;
  kn_sample_params_default(&p);
  return p;
}

static struct kn_backend *cpu(void) {
  struct kn_backend *be = NULL;
  TH_REQUIRE(kn_cpu_backend_create(1, &be) == 0);
  return be;
}

TH_TEST(sample_rejects_bad_arguments) {
  struct kn_backend *be = cpu();
  float x[16] = {0};
  struct kn_sample_out o, o2[2];
  struct kn_sample_params p = params_default(), p2[2] = {params_default(), params_default()};
  TH_CHECK_EQ_INT(kn_sample(be, &o, x, 8, 1, 8, &p), 0);
  TH_CHECK_EQ_INT(kn_sample(be, o2, x, 8, 2, 8, p2), 0);
  TH_CHECK_EQ_INT(kn_sample(be, o2, x, 7, 2, 8, p2), CM_ERR_INVAL); /* ld < V */
  TH_CHECK_EQ_INT(kn_sample(be, &o, x, 8, 0, 8, &p), 0);
  TH_CHECK_EQ_INT(kn_sample(be, &o, x, 8, 1, 0, &p), CM_ERR_INVAL);
  struct kn_sample_params bad[6];
  for (int i = 0; i < 6; i++)
    bad[i] = params_default();
  bad[0].temperature = -1.0f;
  bad[1].top_p = 0.0f;
  bad[2].min_p = 1.5f;
  bad[3].repetition_penalty = 0.0f;
  bad[4].n_logprobs = KN_SAMPLE_MAX_LOGPROBS + 1;
  bad[5].n_pen = 2; /* arrays missing */
  for (int i = 0; i < 6; i++)
    TH_CHECK_EQ_INT(kn_sample(be, &o, x, 8, 1, 8, &bad[i]), CM_ERR_INVAL);
  /* nothing finite to sample from */
  float ninf[4] = {-INFINITY, -INFINITY, NAN, -INFINITY};
  TH_CHECK_EQ_INT(kn_sample(be, &o, ninf, 4, 1, 4, &p), CM_ERR_INVAL);
  kn_backend_destroy(be);
}

/* Greedy rows with penalties: the argmax of the penalised logits, computed
 * here by hand; the input rows stay as they were. */
TH_TEST(sample_greedy_is_argmax_of_penalised) {
  struct kn_backend *be = cpu();
  enum { T = 6, V = 3000, LD = 3011 };
  kt_seed(5);
  float *x = kt_rand_f32((size_t)T * LD, 4.0f), *keep = malloc(sizeof(float) * T * LD);
  float *pen = malloc(sizeof(float) * V);
  TH_REQUIRE(keep && pen);
  memcpy(keep, x, sizeof(float) * T * LD);
  struct kn_sample_params p[T];
  struct kn_sample_out o[T];
  int32_t ids[T][4], counts[T][4];
  for (int t = 0; t < T; t++) {
    p[t] = params_default();
    p[t].temperature = 0.0f;
    p[t].repetition_penalty = 1.0f + 0.2f * (float)t;
    p[t].frequency_penalty = 0.3f * (float)(t % 3);
    p[t].presence_penalty = t & 1 ? 1.5f : 0.0f;
    int32_t best;
    TH_CHECK(kn_argmax(be, &best, NULL, x + (ptrdiff_t)t * LD, LD, 1, V) == 0);
    /* penalise the leader and a few others (one seen only in the prompt) */
    int32_t cand[4] = {best, (best + 7) % V, (best + 100) % V, -1};
    for (int j = 0; j < 4; j++) {
      ids[t][j] = cand[j];
      counts[t][j] = j == 1 ? 0 : j + 1;
    }
    p[t].pen_ids = ids[t];
    p[t].pen_counts = counts[t];
    p[t].n_pen = 4;
  }
  TH_REQUIRE(kn_sample(be, o, x, LD, T, V, p) == 0);
  TH_CHECK(memcmp(x, keep, sizeof(float) * T * LD) == 0);
  for (int t = 0; t < T; t++) {
    memcpy(pen, x + (ptrdiff_t)t * LD, sizeof(float) * V);
    for (int j = 0; j < 3; j++) {
      float l = pen[ids[t][j]], r = p[t].repetition_penalty;
      if (r != 1.0f) l = l > 0 ? l / r : l * r;
      if (counts[t][j] > 0) {
        l -= p[t].frequency_penalty * (float)counts[t][j];
        if (p[t].presence_penalty != 0.0f) l -= p[t].presence_penalty;
      }
      pen[ids[t][j]] = l;
    }
    int32_t want;
    TH_CHECK(kn_argmax(be, &want, NULL, pen, V, 1, V) == 0);
    TH_CHECK_EQ_INT(o[t].token, want);
  }
  free(x);
  free(keep);
  free(pen);
  kn_backend_destroy(be);
}

/* Logit biases: greedy rows take the argmax of logits + bias (after a penalty on the
 * same token), ids outside the vocabulary are skipped, the logits stay untouched and
 * the logprobs raw; a row with a bias is not kn_argmax's; bad arrays are refused. */
TH_TEST(sample_logit_bias) {
  struct kn_backend *be = cpu();
  enum { V = 500 };
  kt_seed(9);
  float *x = kt_rand_f32(V, 2.0f), *keep = malloc(sizeof(float) * V),
        *b = malloc(sizeof(float) * V);
  TH_REQUIRE(keep && b);
  memcpy(keep, x, sizeof(float) * V);
  int32_t best;
  TH_REQUIRE(kn_argmax(be, &best, NULL, x, V, 1, V) == 0);
  const int32_t bias_ids[4] = {best, (best + 3) % V, V + 7, -2};
  const float bias[4] = {-30.0f, 25.0f, 100.0f, 100.0f};
  const int32_t pen_ids[1] = {(best + 3) % V}, pen_counts[1] = {2};
  struct kn_sample_params p = params_default();
  p.temperature = 0.0f;
  p.frequency_penalty = 0.5f;
  p.pen_ids = pen_ids;
  p.pen_counts = pen_counts;
  p.n_pen = 1;
  p.bias_ids = bias_ids;
  p.bias = bias;
  p.n_bias = 4;
  p.n_logprobs = 2;
  TH_CHECK(!kn_sample_is_argmax(&p));
  struct kn_sample_out o;
  TH_REQUIRE(kn_sample(be, &o, x, V, 1, V, &p) == 0);
  TH_CHECK(memcmp(x, keep, sizeof(float) * V) == 0);
  memcpy(b, x, sizeof(float) * V);
  b[(best + 3) % V] -= 0.5f * 2.0f; /* the penalty first */
  b[best] += -30.0f;
  b[(best + 3) % V] += 25.0f;
  int32_t want;
  TH_REQUIRE(kn_argmax(be, &want, NULL, b, V, 1, V) == 0);
  TH_CHECK_EQ_INT(want, (best + 3) % V);
  TH_CHECK_EQ_INT(o.token, want);
  /* raw logprobs: the top entry is the unbiased leader */
  TH_CHECK_EQ_INT(o.n_top, 2);
  TH_CHECK_EQ_INT(o.top_ids[0], best);
  TH_CHECK(o.logprob < o.top_logprobs[0]);
  p.bias = NULL;
  TH_CHECK_EQ_INT(kn_sample(be, &o, x, V, 1, V, &p), CM_ERR_INVAL);
  p.bias = bias;
  p.n_bias = -1;
  TH_CHECK_EQ_INT(kn_sample(be, &o, x, V, 1, V, &p), CM_ERR_INVAL);
  free(x);
  free(keep);
  free(b);
  kn_backend_destroy(be);
}

/* allowed_token_ids (bias_only): greedy rows take the best allowed token after the
 * biases, seeded draws at any temperature only allowed ones (every one of them over
 * many draws), logprobs stay raw; an empty or oversized list is refused. */
TH_TEST(sample_allowed_tokens_only) {
  struct kn_backend *be = cpu();
  enum { V = 700, K = 5 };
  kt_seed(11);
  float *x = kt_rand_f32(V, 2.0f);
  int32_t best;
  TH_REQUIRE(kn_argmax(be, &best, NULL, x, V, 1, V) == 0);
  const int32_t ids[K] = {(best + 1) % V, (best + 50) % V, (best + 99) % V, (best + 300) % V,
                          (best + 601) % V};
  float bias[K] = {0, 0, 0, 0, 0};
  struct kn_sample_params p = params_default();
  p.temperature = 0.0f;
  p.bias_ids = ids;
  p.bias = bias;
  p.n_bias = K;
  p.bias_only = 1;
  p.n_logprobs = 1;
  TH_CHECK(!kn_sample_is_argmax(&p));
  struct kn_sample_out o;
  TH_REQUIRE(kn_sample(be, &o, x, V, 1, V, &p) == 0);
  int want = 0;
  for (int k = 1; k < K; k++)
    if (x[ids[k]] > x[ids[want]]) want = k;
  TH_CHECK_EQ_INT(o.token, ids[want]);
  TH_CHECK_EQ_INT(o.top_ids[0], best); /* raw: the disallowed leader */
  /* a bias moves the choice within the set */
  int other = (want + 1) % K;
  bias[other] = x[ids[want]] - x[ids[other]] + 1.0f;
  TH_REQUIRE(kn_sample(be, &o, x, V, 1, V, &p) == 0);
  TH_CHECK_EQ_INT(o.token, ids[other]);
  bias[other] = 0;
  /* seeded draws: a flat row over a high temperature still stays in the set */
  int seen[K] = {0};
  p.temperature = 5.0f;
  p.seed = 77;
  for (int c = 0; c < 400; c++) {
    p.counter = (uint64_t)c;
    TH_REQUIRE(kn_sample(be, &o, x, V, 1, V, &p) == 0);
    int k = 0;
    while (k < K && ids[k] != o.token)
      k++;
    TH_CHECK(k < K);
    if (k < K) seen[k]++;
  }
  for (int k = 0; k < K; k++)
    TH_CHECK(seen[k] > 0);
  p.n_bias = 0;
  TH_CHECK_EQ_INT(kn_sample(be, &o, x, V, 1, V, &p), CM_ERR_INVAL);
  p.n_bias = KN_SAMPLE_MAX_BIAS + 1;
  TH_CHECK_EQ_INT(kn_sample(be, &o, x, V, 1, V, &p), CM_ERR_INVAL);
  free(x);
  kn_backend_destroy(be);
}

/* Random rows: a row's token depends on its seed and counter only, not on
 * the other rows of the call; the same seed gives the same token. */
TH_TEST(sample_seeded_rows_are_batch_invariant) {
  struct kn_backend *be = cpu();
  enum { T = 16, V = 500 };
  kt_seed(9);
  float *x = kt_rand_f32((size_t)T * V, 3.0f);
  struct kn_sample_params p[T];
  struct kn_sample_out all[T], one, again[T];
  for (int t = 0; t < T; t++) {
    p[t] = params_default();
    p[t].temperature = 0.8f;
    p[t].top_k = t % 4 ? 40 : 0;
    p[t].top_p = t % 3 ? 0.9f : 1.0f;
    p[t].min_p = t % 5 ? 0.02f : 0.0f;
    p[t].seed = 1000 + (uint64_t)t;
    p[t].counter = 7;
  }
  TH_REQUIRE(kn_sample(be, all, x, V, T, V, p) == 0);
  TH_REQUIRE(kn_sample(be, again, x, V, T, V, p) == 0);
  int differ = 0;
  for (int t = 0; t < T; t++) {
    TH_REQUIRE(kn_sample(be, &one, x + (ptrdiff_t)t * V, V, 1, V, &p[t]) == 0);
    TH_CHECK_EQ_INT(one.token, all[t].token);
    TH_CHECK_EQ_INT(again[t].token, all[t].token);
    p[t].seed += 1; /* another seed changes some draws */
    TH_REQUIRE(kn_sample(be, &one, x + (ptrdiff_t)t * V, V, 1, V, &p[t]) == 0);
    differ += one.token != all[t].token;
  }
  TH_CHECK(differ > 0);
  free(x);
  kn_backend_destroy(be);
}

/* Draws with many seeds follow the processed distribution (kn_cpu_sample_dist). */
/* The CPU op samples rows in parallel: a pool of 4 threads gives every row
 * (greedy with and without penalties, random, with logprobs) the same answer
 * bit for bit as one thread does. */
TH_TEST(sample_threads_agree) {
  struct kn_backend *one = cpu(), *four = NULL;
  TH_REQUIRE(kn_cpu_backend_create(4, &four) == 0);
  enum { T = 24, V = 3000 };
  kt_seed(11);
  float *x = kt_rand_f32((size_t)T * V, 4.0f);
  static const int32_t pen_ids[] = {5, 17, 2999, 40};
  static const int32_t pen_counts[] = {1, 0, 3, 2};
  struct kn_sample_params p[T];
  struct kn_sample_out a[T], b[T];
  for (int t = 0; t < T; t++) {
    p[t] = params_default();
    p[t].temperature = t % 3 == 0 ? 0.0f : 0.7f;
    p[t].repetition_penalty = t % 4 == 1 ? 1.3f : 1.0f;
    p[t].frequency_penalty = t % 6 == 3 ? 0.5f : 0.0f;
    p[t].pen_ids = pen_ids;
    p[t].pen_counts = pen_counts;
    p[t].n_pen = 4;
    p[t].top_k = t % 5 == 2 ? 20 : 0;
    p[t].n_logprobs = t % 2 ? 5 : t % 12 == 0 ? 3 : -1; /* rows 0, 12: greedy, logprobs */
    p[t].seed = 77 + (uint64_t)t;
    p[t].counter = (uint64_t)t;
  }
  TH_REQUIRE(kn_sample(one, a, x, V, T, V, p) == 0);
  TH_REQUIRE(kn_sample(four, b, x, V, T, V, p) == 0);
  for (int t = 0; t < T; t++) {
    TH_CHECK_EQ_INT(b[t].token, a[t].token);
    TH_CHECK(memcmp(&b[t].logprob, &a[t].logprob, sizeof(float)) == 0);
    TH_CHECK_EQ_INT(b[t].n_top, a[t].n_top);
    for (int k = 0; k < a[t].n_top; k++) {
      TH_CHECK_EQ_INT(b[t].top_ids[k], a[t].top_ids[k]);
      TH_CHECK(memcmp(&b[t].top_logprobs[k], &a[t].top_logprobs[k], sizeof(float)) == 0);
    }
  }
  /* a bad row among good ones is still refused */
  p[T / 2].top_p = 2.0f;
  TH_CHECK(kn_sample(four, b, x, V, T, V, p) != 0);
  free(x);
  kn_backend_destroy(one);
  kn_backend_destroy(four);
}

TH_TEST(sample_draws_follow_the_distribution) {
  struct kn_backend *be = cpu();
  enum { V = 40, N = 20000 };
  float x[V], work[V];
  for (int i = 0; i < V; i++)
    x[i] = 0.15f * (float)((i * 7) % V) - 2.0f;
  struct kn_sample_params p = params_default();
  p.temperature = 0.9f;
  p.top_k = 25;
  p.top_p = 0.95f;
  struct kn_cpu_sampler *s = NULL;
  TH_CHECK(kn_cpu_sampler_create(V, &s) == 0);
  TH_REQUIRE(s);
  const int32_t *ids;
  const float *probs;
  int n;
  memcpy(work, x, sizeof(x));
  TH_REQUIRE(kn_cpu_sample_dist(s, work, &p, &ids, &probs, &n) == 0);
  TH_CHECK(n > 2 && n <= 25);
  double expect[V] = {0};
  for (int i = 0; i < n; i++)
    expect[ids[i]] = (double)probs[i] * N;
  int hist[V] = {0};
  for (int k = 0; k < N; k++) {
    struct kn_sample_out o;
    p.seed = (uint64_t)k;
    TH_REQUIRE(kn_sample(be, &o, x, V, 1, V, &p) == 0);
    TH_REQUIRE(o.token >= 0 && o.token < V);
    hist[o.token]++;
  }
  double chi2 = 0;
  int df = -1, outside = 0;
  for (int i = 0; i < V; i++) {
    if (expect[i] == 0) {
      outside += hist[i];
      continue;
    }
    chi2 += (hist[i] - expect[i]) * (hist[i] - expect[i]) / expect[i];
    df++;
  }
  TH_CHECK_EQ_INT(outside, 0);
  /* far beyond the 99.9th percentile for these degrees of freedom */
  if (chi2 > df + 6.0 * sqrt(2.0 * df) + 10)
    th_fail(__FILE__, __LINE__, "chi-square %.1f with %d degrees of freedom", chi2, df);
  kn_cpu_sampler_destroy(s);
  kn_backend_destroy(be);
}

TH_TEST(sample_raw_logprobs) {
  struct kn_backend *be = cpu();
  enum { V = 1000 };
  kt_seed(3);
  float x[V];
  for (int i = 0; i < V; i++)
    x[i] = 5.0f * kt_uniform();
  struct kn_sample_params p = params_default();
  p.temperature = 0.5f;
  p.repetition_penalty = 1.4f; /* processing must not change the raw logprobs */
  int32_t pid[1] = {3}, pc[1] = {2};
  p.pen_ids = pid;
  p.pen_counts = pc;
  p.n_pen = 1;
  p.n_logprobs = 5;
  p.seed = 11;
  struct kn_sample_out o;
  TH_REQUIRE(kn_sample(be, &o, x, V, 1, V, &p) == 0);
  double m = -INFINITY, z = 0;
  for (int i = 0; i < V; i++)
    m = fmax(m, x[i]);
  for (int i = 0; i < V; i++)
    z += exp(x[i] - m);
  double lse = m + log(z);
  TH_CHECK_NEAR(o.logprob, x[o.token] - lse, 1e-5);
  TH_CHECK_EQ_INT(o.n_top, 5);
  for (int j = 0; j < 5; j++) {
    int better = 0; /* rank of top_ids[j] among the raw logits */
    for (int i = 0; i < V; i++)
      better += x[i] > x[o.top_ids[j]];
    TH_CHECK_EQ_INT(better, j);
    TH_CHECK_NEAR(o.top_logprobs[j], x[o.top_ids[j]] - lse, 1e-5);
  }
  p.n_logprobs = -1;
  TH_REQUIRE(kn_sample(be, &o, x, V, 1, V, &p) == 0);
  TH_CHECK_EQ_INT(o.n_top, 0);
  kn_backend_destroy(be);
}

/* A structured output's mask (kn_sample_params.allow): greedy rows take the best
 * allowed token, seeded rows draw only allowed ones, logprobs stay the raw
 * distribution's, the logits are left as they were, and kn_sample_is_argmax
 * says no (the fused greedy head knows no masks). */
TH_TEST(sample_masks_allow_only_their_tokens) {
  struct kn_backend *be = cpu();
  TH_CHECK(kn_sample_takes_masks(be) && !kn_sample_takes_masks(NULL));
  enum { V = 100 };
  float x[V], keep[V];
  for (int i = 0; i < V; i++)
    x[i] = (float)((i * 37) % 101) / 10.0f;
  memcpy(keep, x, sizeof(x));
  uint32_t allow[(V + 31) / 32] = {0};
  int best = -1;
  for (int i = 3; i < V; i += 7) { /* allowed: 3, 10, 17, ... */
    allow[i / 32] |= 1u << (i % 32);
    if (best < 0 || x[i] > x[best]) best = i;
  }
  struct kn_sample_params p = params_default();
  p.temperature = 0.0f;
  p.allow = allow;
  p.n_logprobs = 0;
  TH_CHECK(!kn_sample_is_argmax(&p));
  struct kn_sample_out o;
  TH_REQUIRE(kn_sample(be, &o, x, V, 1, V, &p) == 0);
  TH_CHECK_EQ_INT(o.token, best);
  double z = 0;
  for (int i = 0; i < V; i++)
    z += exp((double)x[i]);
  TH_CHECK_NEAR(o.logprob, (double)x[best] - log(z), 1e-4); /* the raw distribution's */
  TH_CHECK(!memcmp(x, keep, sizeof(x)));
  p.temperature = 1.5f;
  p.n_logprobs = -1;
  for (uint64_t s = 0; s < 200; s++) {
    p.seed = s;
    TH_REQUIRE(kn_sample(be, &o, x, V, 1, V, &p) == 0);
    TH_CHECK(o.token >= 0 && o.token < V && (allow[o.token / 32] >> (o.token % 32) & 1));
  }
  kn_backend_destroy(be);
}

/* A mask samples from the allowed tokens compacted; it must draw exactly what
 * the dense way draws, where every token the mask refuses is -inf: same token
 * for every seed and setting, sparse masks and dense ones. */
TH_TEST(sample_masks_draw_as_minus_infinity_does) {
  struct kn_backend *be = cpu();
  enum { V = 4096 };
  static float x[V], dense[V];
  uint64_t r = 99;
  for (int i = 0; i < V; i++) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (float)((r >> 33) % 2000) / 200.0f - 5.0f;
  }
  static const struct {
    float t, top_p, min_p;
    int top_k;
  } set[] = {{0, 1, 0, 0},  {1, 1, 0, 0},    {0.7f, 0.9f, 0, 0},     {1.2f, 1, 0.05f, 0},
             {1, 1, 0, 20}, {1, 1, 0, 1000}, {1, 1, 0, 5000}, {0.8f, 0.8f, 0.01f, 40}};
  for (int density = 0; density < 4; density++) {
    uint32_t allow[V / 32] = {0};
    int every = density == 0 ? 9 : density == 1 ? 97 : 1000;
    for (int i = density; i < V; i += every)
      allow[i / 32] |= 1u << (i % 32);
    if (density == 3) /* dense: all but every fifth, whole words of ones among them */
      for (int i = 0; i < V; i++)
        if (i % 5 || (i >= 640 && i < 1280)) allow[i / 32] |= 1u << (i % 32);
    for (int i = 0; i < V; i++)
      dense[i] = allow[i / 32] >> (i % 32) & 1 ? x[i] : -INFINITY;
    for (size_t k = 0; k < sizeof set / sizeof set[0]; k++)
      for (uint64_t seed = 0; seed < 40; seed++) {
        struct kn_sample_params p = params_default();
        p.temperature = set[k].t;
        p.top_p = set[k].top_p;
        p.min_p = set[k].min_p;
        p.top_k = set[k].top_k;
        p.seed = seed;
        p.counter = seed * 3;
        struct kn_sample_out a, b;
        TH_REQUIRE(kn_sample(be, &b, dense, V, 1, V, &p) == 0);
        p.allow = allow;
        TH_REQUIRE(kn_sample(be, &a, x, V, 1, V, &p) == 0);
        if (a.token != b.token)
          th_fail(__FILE__, __LINE__, "density %d setting %zu seed %llu: %d vs %d", density, k,
                  (unsigned long long)seed, a.token, b.token);
      }
  }
  kn_backend_destroy(be);
}
