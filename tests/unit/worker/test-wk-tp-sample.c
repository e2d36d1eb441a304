/* test-wk-tp-sample.c — sampling a vocab-parallel head from the ranks'
 * candidate records against the one-rank sampler on the whole row
 * (kn_cpu_sample_row, whose math the sampler tests check against numpy): the
 * same token for greedy, top-k and closing top-p rows with penalties and any
 * seed, the same raw logprobs and top entries, and the rows that cannot be
 * decided from candidates are reported, not guessed. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-hash.h"
#include "kernels/cpu/kn-cpu-sample.h"
#include "tests/harness/th.h"
#include "worker/wk-tp-sample.h"

enum { V = 3072, MAXW = 4 };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double unif(void) {
  return (double)(cm_xorshift64(&rng) >> 11) * (1.0 / 9007199254740992.0);
}

/* logits with a few strong tokens over noise; spread scales the noise */
static void make_logits(float *l, float spread) {
  for (int i = 0; i < V; i++)
    l[i] = (float)(unif() * 2.0 - 1.0) * spread;
  for (int j = 0; j < 12; j++)
    l[(int)(unif() * V)] += 4.0f + (float)unif() * 4.0f;
}

/* Samples logits[V] split over `world` ranks; 0, 1 (undecided) or an error. */
static int tp_row(const float *logits, int world, const struct kn_sample_params *p,
                  struct kn_sample_out *out) {
  static struct wk_tp_rec recs[MAXW];
  static float work[V];
  static char scratch[1 << 16];
  TH_REQUIRE(wk_tp_sample_scratch_bytes(world) <= sizeof scratch);
  int vn = V / world;
  for (int k = 0; k < world; k++)
    wk_tp_sample_local(&recs[k], logits + (size_t)k * vn, k * vn, vn, V, p, work);
  return wk_tp_sample_merge(recs, world, 1, 0, V, p, scratch, out);
}

static void one_rank(const float *logits, const struct kn_sample_params *p,
                     struct kn_sample_out *out) {
  static float row[V];
  struct kn_cpu_sampler *s;
  TH_REQUIRE(kn_cpu_sampler_create(V, &s) == 0);
  memcpy(row, logits, sizeof row);
  TH_REQUIRE(kn_cpu_sample_row(s, row, p, out) == 0);
  kn_cpu_sampler_destroy(s);
}

static void same(const struct kn_sample_out *a, const struct kn_sample_out *b) {
  TH_CHECK_EQ_INT(a->token, b->token);
  TH_CHECK_NEAR(a->logprob, b->logprob, 1e-5);
  TH_CHECK_EQ_INT(a->n_top, b->n_top);
  for (int i = 0; i < a->n_top && i < b->n_top; i++) {
    TH_CHECK_EQ_INT(a->top_ids[i], b->top_ids[i]);
    TH_CHECK_NEAR(a->top_logprobs[i], b->top_logprobs[i], 1e-5);
  }
}

/* penalties on a few ids spread over every rank's slice */
static int32_t pen_ids[40], pen_counts[40];
static void with_penalties(struct kn_sample_params *p) {
  for (int i = 0; i < 40; i++) {
    pen_ids[i] = (int32_t)(unif() * V);
    pen_counts[i] = (int32_t)(unif() * 3);
  }
  pen_ids[7] = -1; /* an empty slot of the open-addressing table */
  p->pen_ids = pen_ids;
  p->pen_counts = pen_counts;
  p->n_pen = 40;
  p->repetition_penalty = 1.3f;
  p->frequency_penalty = 0.4f;
  p->presence_penalty = 0.2f;
}

TH_TEST(tp_sample_greedy_and_top_k_equal_one_rank) {
  static float logits[V];
  int worlds[] = {2, 3, 4};
  for (int it = 0; it < 120; it++) {
    make_logits(logits, 2.0f);
    struct kn_sample_params p;
    kn_sample_params_default(&p);
    int kind = it % 4;
    p.temperature = kind == 0 ? 0.0f : 0.5f + (float)unif();
    p.top_k = kind == 0 ? 0 : kind == 1 ? 1 + (int)(unif() * 64) : 40;
    p.min_p = kind == 3 ? 0.05f : 0.0f;
    p.top_p = kind == 2 ? 0.8f : 1.0f;
    p.seed = (uint64_t)it * 7919u;
    p.counter = (uint64_t)it;
    p.n_logprobs = it % 3 == 0 ? -1 : it % 3 == 1 ? 0 : 1 + it % KN_SAMPLE_MAX_LOGPROBS;
    if (it % 2) with_penalties(&p);
    TH_REQUIRE(wk_tp_sample_fits(&p, V));
    struct kn_sample_out want, got;
    one_rank(logits, &p, &want);
    for (int w = 0; w < 3; w++) {
      memset(&got, 0, sizeof got);
      TH_CHECK_EQ_INT(tp_row(logits, worlds[w], &p, &got), 0);
      same(&got, &want);
    }
  }
}

TH_TEST(tp_sample_top_p_closes_within_candidates) {
  static float logits[V];
  int decided = 0;
  for (int it = 0; it < 60; it++) {
    make_logits(logits, 1.0f); /* a dozen strong tokens hold nearly all the mass */
    struct kn_sample_params p;
    kn_sample_params_default(&p);
    p.temperature = 0.7f;
    p.top_p = 0.9f;
    p.seed = 12345u + (uint64_t)it;
    p.counter = (uint64_t)it * 3u;
    p.n_logprobs = 5;
    TH_REQUIRE(wk_tp_sample_fits(&p, V));
    struct kn_sample_out want, got;
    one_rank(logits, &p, &want);
    int rc = tp_row(logits, 4, &p, &got);
    TH_CHECK_EQ_INT(rc, 0);
    if (rc == 0) {
      same(&got, &want);
      decided++;
    }
  }
  TH_CHECK_EQ_INT(decided, 60);
}

TH_TEST(tp_sample_wide_nucleus_asks_for_full_logits) {
  static float logits[V];
  for (int i = 0; i < V; i++)
    logits[i] = (float)(unif() * 0.01); /* nearly flat: the nucleus is most of the vocabulary */
  struct kn_sample_params p;
  kn_sample_params_default(&p);
  p.top_p = 0.95f;
  struct kn_sample_out out;
  TH_CHECK_EQ_INT(tp_row(logits, 2, &p, &out), 1);
}

TH_TEST(tp_sample_rows_that_need_everything) {
  struct kn_sample_params p;
  kn_sample_params_default(&p);
  p.temperature = 0.8f;
  TH_CHECK(!wk_tp_sample_fits(&p, V)); /* the whole distribution */
  p.top_k = WK_TP_CANDS + 1;
  TH_CHECK(!wk_tp_sample_fits(&p, V)); /* more than a record holds */
  p.top_k = 0;
  p.top_p = 0.9f;
  p.min_p = 0.1f;
  TH_CHECK(!wk_tp_sample_fits(&p, V)); /* min-p's mass is over the whole row */
  p.min_p = 0.0f;
  TH_CHECK(wk_tp_sample_fits(&p, V));
  p.top_p = 1.5f;
  TH_CHECK(!wk_tp_sample_fits(&p, V)); /* invalid: kn_sample says why */
}

TH_TEST(tp_sample_nan_and_inf_rows) {
  static float logits[V];
  for (int i = 0; i < V; i++)
    logits[i] = -INFINITY;
  struct kn_sample_params p;
  kn_sample_params_default(&p);
  p.top_k = 10;
  struct kn_sample_out out;
  TH_CHECK_EQ_INT(tp_row(logits, 2, &p, &out), CM_ERR_INVAL);
  for (int i = 0; i < V; i++)
    logits[i] = NAN;
  logits[V - 5] = 1.0f; /* the last rank's only finite logit */
  p.temperature = 0.0f;
  TH_CHECK_EQ_INT(tp_row(logits, 4, &p, &out), 0);
  TH_CHECK_EQ_INT(out.token, V - 5);
  p.temperature = 1.0f;
  TH_CHECK_EQ_INT(tp_row(logits, 4, &p, &out), 0);
  TH_CHECK_EQ_INT(out.token, V - 5);
}

/* allowed_token_ids: rows whose allowed tokens lie in one rank's slice (the
 * others all -inf after the mask) or spread over all, greedy, top-k and closing
 * top-p, give the one-rank answer. */
TH_TEST(tp_sample_allowed_tokens_equal_one_rank) {
  static float logits[V];
  int worlds[] = {2, 3, 4};
  int32_t ids[16];
  float bias[16];
  for (int it = 0; it < 60; it++) {
    make_logits(logits, 2.0f);
    int n = 1 + it % 16;
    for (int i = 0; i < n; i++) {
      /* even iterations: inside the first quarter of the vocabulary only */
      ids[i] = it % 2 ? (int32_t)(unif() * V) : (int32_t)(unif() * (V / 4));
      for (int j = 0; j < i; j++)
        if (ids[j] == ids[i]) ids[i] = (ids[i] + 1 + i) % (V / 4);
      bias[i] = i % 3 ? 0.0f : 1.5f;
    }
    struct kn_sample_params p;
    kn_sample_params_default(&p);
    int kind = it % 3;
    p.temperature = kind == 0 ? 0.0f : 0.7f;
    p.top_k = kind == 1 ? 4 : 0;
    p.top_p = kind == 2 ? 0.9f : 1.0f;
    p.seed = (uint64_t)it * 31u;
    p.counter = (uint64_t)it;
    p.n_logprobs = it % 4 == 0 ? -1 : 2;
    p.bias_ids = ids;
    p.bias = bias;
    p.n_bias = n;
    p.bias_only = 1;
    TH_REQUIRE(wk_tp_sample_fits(&p, V));
    struct kn_sample_out want, got;
    one_rank(logits, &p, &want);
    int in = 0;
    for (int i = 0; i < n; i++)
      in |= ids[i] == want.token;
    TH_CHECK(in);
    for (int w = 0; w < 3; w++) {
      memset(&got, 0, sizeof got);
      TH_CHECK_EQ_INT(tp_row(logits, worlds[w], &p, &got), 0);
      same(&got, &want);
    }
  }
}
