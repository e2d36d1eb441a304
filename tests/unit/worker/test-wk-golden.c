/* test-wk-golden.c — lmserve's forward pass against Hugging Face
 * transformers' own Gemma3ForCausalLM / Gemma4ForCausalLM, through fixtures
 * made by tests/reference/make_fixtures.py (float32 weights, the logits of
 * every prompt position, the greedy continuation). Per fixture: max |logit
 * error| < 1e-3 of the logit range and the exact greedy tokens, with the
 * prompt run in one chunk, in 5-token chunks and token by token.
 * On the CPU backend, and on the CUDA backend where a device is visible
 * (f32 weights: full-f32 SGEMM; KV cache f32 on both); the CUDA cases skip,
 * saying so, without one. With an fp8 (e4m3) KV cache (--kv-cache-dtype fp8),
 * Gemma 3 on the CPU and the GPU: the logits within FP8_KV_TOL of the range
 * (e4m3 keeps 3 mantissa bits of every K and V) and, on the CPU, the same bits
 * however the prompt is chunked. Without fixtures each test skips, saying how to make
 * them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/kn-cpu.h"
#include "lmserve-config.h"
#if LMSERVE_HAVE_CUDA
#include "kernels/cuda/kn-cuda.h"
#endif
#include "model/md-safetensors.h"
#include "tests/harness/th.h"
#include "tests/unit/worker/wk-test-util.h"
#include "worker/wk-greedy.h"
#include "worker/wk-model.h"

/* The error an e4m3 KV cache may add to the logits, as a share of their range:
 * on the Gemma 3 fixture 0.049 measured (a bf16 cache: 0.0025), the bound
 * twice that. The random Gemma 4 fixture (attention scale 1, sharp softmax) moves
 * 18% of its range with a bf16 cache already, too sensitive to bound an fp8 one. */
#define FP8_KV_TOL 0.1

/* Fixture `name`'s golden tensors (its folder in dir), after skipping a CUDA test
 * (`what`) without a device: before anything is opened, so a skip leaves nothing
 * behind. */
static struct md_st *open_golden(const char *name, int cuda, const char *what, char *dir) {
  char why[160];
#if LMSERVE_HAVE_CUDA
  snprintf(why, sizeof(why), "no CUDA device visible: %s", what);
  if (cuda && kn_cuda_device_count() <= 0) TH_SKIP(why);
#else
  snprintf(why, sizeof(why), "a build without CUDA: %s", what);
  if (cuda) TH_SKIP(why);
#endif
  char args[64];
  snprintf(args, sizeof(args), " --only %s", name);
  return wkt_golden_open(name, args, dir);
}

/* Fixture `name` (in dir) loaded with mo on a new CPU or CUDA backend (*be), or the
 * test stops. */
static struct wk_model *load(const char *name, const char *dir, int cuda,
                             const struct wk_model_opts *mo, struct kn_backend **be) {
  char err[512] = "";
  *be = NULL;
  if (cuda) {
#if LMSERVE_HAVE_CUDA
    TH_REQUIRE(kn_cuda_backend_create(0, be) == 0);
#endif
  } else {
    TH_REQUIRE(kn_cpu_backend_create(2, be) == 0);
  }
  struct wk_model *m = NULL;
  if (wk_model_load(dir, *be, mo, &m, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "%s: %s", name, err);
    th_stop();
  }
  return m;
}

static void golden_kv(const char *name, int cuda, enum kn_dtype kvdt) {
  char dir[4096], err[512] = "";
  struct md_st *g = open_golden(name, cuda, "the CUDA golden comparison", dir);
  const struct md_tensor *ti = md_st_find(g, "input_ids"), *tl = md_st_find(g, "logits"),
                         *tg = md_st_find(g, "greedy");
  TH_REQUIRE(ti && tl && tg && ti->dtype == MD_ST_I64 && tl->dtype == MD_ST_F32 &&
             tg->dtype == MD_ST_I64 && tl->ndim == 2);
  int T = (int)ti->shape[0], V = (int)tl->shape[1], N = (int)tg->shape[0];
  TH_REQUIRE(tl->shape[0] == T);
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)T),
          *want_greedy = malloc(sizeof(int32_t) * (size_t)N);
  for (int i = 0; i < T; i++)
    ids[i] = (int32_t)((const int64_t *)ti->data)[i];
  for (int i = 0; i < N; i++)
    want_greedy[i] = (int32_t)((const int64_t *)tg->data)[i];
  const float *want = tl->data;

  struct kn_backend *be;
  struct wk_model_opts mo = {.max_batch_tokens = T,
                             .max_seqs = 1,
                             .kv_tokens = T + N + 1,
                             .kv_dtype = 1 + (int)kvdt,
                             .quiet = 1};
  struct wk_model *m = load(name, dir, cuda, &mo, &be);
  TH_REQUIRE(wk_model_config(m)->vocab == V);
  struct wk_page_alloc pa;
  wk_page_alloc_init(&pa, wk_model_n_pages(m));
  float *got = malloc(sizeof(float) * (size_t)T * V);
  float *first = malloc(sizeof(float) * (size_t)T * V); /* the one-chunk logits */
  TH_REQUIRE(got && first);
  double tol = kvdt == KN_DTYPE_F32 ? 1e-3 : FP8_KV_TOL;
  double lo = 1e300, hi = -1e300;
  for (size_t i = 0; i < (size_t)T * V; i++) {
    lo = want[i] < lo ? want[i] : lo;
    hi = want[i] > hi ? want[i] : hi;
  }
  const int chunks[] = {T, 5, 1};
  const struct wk_kv_spec *kv = wk_model_kv_spec(m);
  for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
    struct wk_seq_blocks blk = {0};
    for (int p = 0; p < T; p += chunks[c]) {
      int n = chunks[c] < T - p ? chunks[c] : T - p;
      TH_REQUIRE(wk_seq_blocks_reserve(&blk, kv, &pa, p + n) == 0);
      struct wk_seq_input s = {.tokens = ids + p, .n_tokens = n, .pos0 = p, .n_out = n};
      wkt_seq_pages(&s, kv, &blk);
      struct wk_batch b = {.seqs = &s, .n_seqs = 1, .logits = got + (size_t)p * V};
      TH_REQUIRE(wk_model_forward(m, &b, err, sizeof(err)) == 0);
    }
    wk_seq_blocks_release(&blk, kv, &pa);
    double maxerr = 0;
    for (size_t i = 0; i < (size_t)T * V; i++) {
      double e = fabs((double)got[i] - want[i]);
      maxerr = e > maxerr ? e : maxerr;
    }
    fprintf(stderr, "%s (%s, %s KV cache): chunk %d: max |logit error| %.3g, logit range %.3g\n",
            name, kn_backend_name(be), kn_dtype_name(kvdt), chunks[c], maxerr, hi - lo);
    if (!(maxerr < tol * (hi - lo)))
      th_fail(__FILE__, __LINE__, "%s: chunk %d: max |logit error| %g >= %g x range %g", name,
              chunks[c], maxerr, tol, hi - lo);
    if (c == 0) memcpy(first, got, sizeof(float) * (size_t)T * V);
    if (!cuda && c > 0 && memcmp(first, got, sizeof(float) * (size_t)T * V))
      th_fail(__FILE__, __LINE__, "%s: chunk %d: logits differ from the one-chunk run", name,
              chunks[c]);
    if (kvdt != KN_DTYPE_F32) continue; /* an fp8 cache may flip a near tie: no greedy check */
    int32_t *gen = malloc(sizeof(int32_t) * (size_t)N);
    int n_gen = 0;
    struct wk_greedy_opts go = {.chunk = chunks[c], .max_new = N};
    TH_REQUIRE(wk_greedy_generate(m, &pa, ids, T, &go, gen, &n_gen, err, sizeof(err)) == 0);
    if (n_gen != N || memcmp(gen, want_greedy, sizeof(int32_t) * (size_t)N)) {
      char a[512] = "", b2[512] = "";
      for (int i = 0; i < n_gen; i++)
        snprintf(a + strlen(a), sizeof(a) - strlen(a), " %d", gen[i]);
      for (int i = 0; i < N; i++)
        snprintf(b2 + strlen(b2), sizeof(b2) - strlen(b2), " %d", want_greedy[i]);
      th_fail(__FILE__, __LINE__, "%s: chunk %d: greedy [%s ] != transformers [%s ]", name,
              chunks[c], a, b2);
    }
    free(gen);
  }
  free(got);
  free(first);
  free(ids);
  free(want_greedy);
  wk_page_alloc_free(&pa);
  wk_model_free(m);
  kn_backend_destroy(be);
  md_st_close(g);
}

static void golden(const char *name, int cuda) {
  golden_kv(name, cuda, KN_DTYPE_F32);
}

#define SCORE_TOP 5 /* top entries asked of each scored row */

/* A prompt's logprobs (scored rows, wk_seq_input.n_score) against the
 * log-softmax of transformers' logits: position p's row scores token p + 1,
 * the last row is an output, whose logits must be transformers' too. The
 * prompt runs in one chunk, in 5-token chunks (each chunk's last row then
 * scores the next chunk's first token) and token by token, beside a second
 * sequence of the same prompt in one chunk with only its last row's logits,
 * so that scored and output rows of two sequences share the steps (and, on
 * a model with KV-shared layers, the rows kept past the shared ones). Checks
 * each logprob within 2 x 1e-3 of the logit range and the top entries'
 * ids where transformers' next best differs by more than that. */
static void golden_scores(const char *name, int cuda) {
  char dir[4096], err[512] = "";
  struct md_st *g = open_golden(name, cuda, "the CUDA scored rows", dir);
  const struct md_tensor *ti = md_st_find(g, "input_ids"), *tl = md_st_find(g, "logits");
  TH_REQUIRE(ti && tl && ti->dtype == MD_ST_I64 && tl->dtype == MD_ST_F32 && tl->ndim == 2);
  int T = (int)ti->shape[0], V = (int)tl->shape[1];
  TH_REQUIRE(tl->shape[0] == T && T >= 3);
  const float *want = tl->data;
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)T);
  double *ref = malloc(sizeof(double) * (size_t)T * V); /* log-softmax of want */
  TH_REQUIRE(ids && ref);
  for (int i = 0; i < T; i++)
    ids[i] = (int32_t)((const int64_t *)ti->data)[i];
  double lo = 1e300, hi = -1e300;
  for (int p = 0; p < T; p++) {
    const float *w = want + (size_t)p * V;
    double mx = -1e300, z = 0;
    for (int v = 0; v < V; v++) {
      mx = w[v] > mx ? w[v] : mx;
      lo = w[v] < lo ? w[v] : lo;
      hi = w[v] > hi ? w[v] : hi;
    }
    for (int v = 0; v < V; v++)
      z += exp((double)w[v] - mx);
    for (int v = 0; v < V; v++)
      ref[(size_t)p * V + v] = (double)w[v] - mx - log(z);
  }
  double tol = 2e-3 * (hi - lo);

  struct kn_backend *be;
  struct wk_model_opts mo = {.max_batch_tokens = 2 * T,
                             .max_seqs = 2,
                             .kv_tokens = 2 * T + 2,
                             .kv_dtype = 1 + (int)KN_DTYPE_F32,
                             .quiet = 1};
  struct wk_model *m = load(name, dir, cuda, &mo, &be);
  TH_REQUIRE(wk_model_config(m)->vocab == V);
  struct wk_page_alloc pa;
  wk_page_alloc_init(&pa, wk_model_n_pages(m));
  const struct wk_kv_spec *kv = wk_model_kv_spec(m);
  struct kn_sample_out *sc = calloc((size_t)T, sizeof(*sc));
  int32_t *rank = calloc((size_t)T, sizeof(*rank));
  float *lg = malloc(sizeof(float) * 2 * (size_t)V);
  TH_REQUIRE(sc && lg && rank);
  const int chunks[] = {T, 5, 1};
  for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
    struct wk_seq_blocks blk = {0}, other = {0};
    TH_REQUIRE(wk_seq_blocks_reserve(&other, kv, &pa, T) == 0);
    int n_sc = 0;
    for (int p = 0; p < T; p += chunks[c]) {
      int n = chunks[c] < T - p ? chunks[c] : T - p, last = p + n == T;
      TH_REQUIRE(wk_seq_blocks_reserve(&blk, kv, &pa, p + n) == 0);
      struct wk_seq_input s[2] = {{.tokens = ids + p,
                                   .n_tokens = n,
                                   .pos0 = p,
                                   .n_out = last,
                                   .n_score = n - last,
                                   .score_ids = ids + p + 1},
                                  {.tokens = ids, .n_tokens = T, .pos0 = 0, .n_out = 1}};
      for (int gi = 0; gi < kv->n_groups; gi++) {
        s[0].block_tables[gi] = blk.table[gi];
        s[0].n_blocks[gi] = blk.n[gi];
        s[1].block_tables[gi] = other.table[gi];
        s[1].n_blocks[gi] = other.n[gi];
      }
      int both = p == 0; /* the other sequence runs with the first chunk */
      struct wk_batch b = {.seqs = both ? s + 0 : s,
                           .n_seqs = both ? 2 : 1,
                           .logits = lg,
                           .scored = sc + n_sc,
                           .score_top = SCORE_TOP,
                           .score_ranks = rank + n_sc};
      if (!s[0].n_out && !both) b.logits = NULL;
      TH_REQUIRE(wk_model_forward(m, &b, err, sizeof(err)) == 0);
      n_sc += s[0].n_score;
      /* the outputs in sequence order: this one's last row (when last), the other's */
      int row = 0;
      const float *outs[2] = {NULL, NULL};
      if (last) outs[0] = lg + (size_t)row++ * V;
      if (both) outs[1] = lg + (size_t)row++ * V;
      for (int k = 0; k < 2; k++) {
        if (!outs[k]) continue;
        const float *w = want + (size_t)(T - 1) * V;
        double e = 0;
        for (int v = 0; v < V; v++)
          e = fmax(e, fabs((double)outs[k][v] - w[v]));
        if (!(e < tol / 2))
          th_fail(__FILE__, __LINE__, "%s: chunk %d: output row %d: |logit error| %g", name,
                  chunks[c], k, e);
      }
    }
    TH_CHECK_EQ_INT(n_sc, T - 1);
    double maxerr = 0;
    for (int p = 0; p + 1 < T; p++) {
      const double *r = ref + (size_t)p * V;
      const struct kn_sample_out *o = &sc[p];
      TH_CHECK_EQ_INT(o->token, ids[p + 1]);
      TH_CHECK_EQ_INT(o->n_top, SCORE_TOP);
      maxerr = fmax(maxerr, fabs(o->logprob - r[ids[p + 1]]));
      /* its rank: 1 + transformers' more likely tokens, but near ties */
      int above = 0, near_t = 0;
      for (int v = 0; v < V; v++) {
        above += r[v] > r[ids[p + 1]] + tol;
        near_t += v != ids[p + 1] && fabs(r[v] - r[ids[p + 1]]) <= tol;
      }
      if (!(rank[p] >= 1 + above && rank[p] <= 1 + above + near_t))
        th_fail(__FILE__, __LINE__, "%s: chunk %d: position %d: rank %d, transformers' %d (+%d)",
                name, chunks[c], p, rank[p], 1 + above, near_t);
      for (int j = 0; j < o->n_top; j++) {
        maxerr = fmax(maxerr, fabs(o->top_logprobs[j] - r[o->top_ids[j]]));
        /* the j-th best of transformers', unless a near tie makes the order moot */
        int better = 0, near = 0;
        for (int v = 0; v < V; v++) {
          better += r[v] > r[o->top_ids[j]] + tol;
          near += fabs(r[v] - r[o->top_ids[j]]) <= tol;
        }
        if (!(better <= j && better + near > j))
          th_fail(__FILE__, __LINE__, "%s: chunk %d: position %d: top %d is token %d", name,
                  chunks[c], p, j, o->top_ids[j]);
      }
    }
    fprintf(stderr, "%s (%s): chunk %d: %d scored rows, max |logprob error| %.3g (range %.3g)\n",
            name, kn_backend_name(be), chunks[c], T - 1, maxerr, hi - lo);
    if (!(maxerr < tol))
      th_fail(__FILE__, __LINE__, "%s: chunk %d: max |logprob error| %g >= %g", name, chunks[c],
              maxerr, tol);
    wk_seq_blocks_release(&blk, kv, &pa);
    wk_seq_blocks_release(&other, kv, &pa);
  }
  /* a scored id outside the vocabulary is refused, and the model goes on */
  {
    struct wk_seq_blocks blk = {0};
    TH_REQUIRE(wk_seq_blocks_reserve(&blk, kv, &pa, 2) == 0);
    int32_t bad = V;
    struct wk_seq_input s = {
        .tokens = ids, .n_tokens = 2, .pos0 = 0, .n_score = 1, .score_ids = &bad};
    wkt_seq_pages(&s, kv, &blk);
    struct wk_batch b = {.seqs = &s, .n_seqs = 1, .scored = sc, .score_top = 1};
    TH_CHECK_EQ_INT(wk_model_forward(m, &b, err, sizeof(err)), CM_ERR_RANGE);
    TH_CHECK(strstr(err, "scored token id") != NULL);
    b.scored = NULL; /* nowhere to put the results */
    bad = 1;
    TH_CHECK_EQ_INT(wk_model_forward(m, &b, err, sizeof(err)), CM_ERR_INVAL);
    wk_seq_blocks_release(&blk, kv, &pa);
  }
  free(sc);
  free(rank);
  free(lg);
  free(ids);
  free(ref);
  wk_page_alloc_free(&pa);
  wk_model_free(m);
  kn_backend_destroy(be);
  md_st_close(g);
}

TH_TEST(golden_gemma3) {
  golden("gemma3", 0);
}
TH_TEST(golden_gemma4) {
  golden("gemma4", 0);
}
TH_TEST(golden_gemma4_moe) {
  golden("gemma4-moe", 0);
}
/* the 26B's and 31B's attention: K as V on every full layer, no KV sharing, no
 * per-layer inputs */
TH_TEST(golden_gemma4_large) {
  golden("gemma4-large", 0);
}
TH_TEST(golden_gemma3_cuda) {
  golden("gemma3", 1);
}
TH_TEST(golden_gemma4_cuda) {
  golden("gemma4", 1);
}
TH_TEST(golden_gemma4_moe_cuda) {
  golden("gemma4-moe", 1);
}
TH_TEST(golden_gemma4_large_cuda) {
  golden("gemma4-large", 1);
}
TH_TEST(golden_scores_gemma3) {
  golden_scores("gemma3", 0);
}
TH_TEST(golden_scores_gemma4) {
  golden_scores("gemma4", 0);
}
TH_TEST(golden_scores_gemma3_cuda) {
  golden_scores("gemma3", 1);
}
TH_TEST(golden_scores_gemma4_cuda) {
  golden_scores("gemma4", 1);
}
TH_TEST(golden_gemma3_fp8_kv) {
  golden_kv("gemma3", 0, KN_DTYPE_F8E4M3);
}
TH_TEST(golden_gemma3_fp8_kv_cuda) {
  golden_kv("gemma3", 1, KN_DTYPE_F8E4M3);
}
