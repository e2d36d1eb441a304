/* test-wk-draft-golden.c — lmserve's MTP assistant draft step against Hugging
 * Face transformers' Gemma4AssistantForCausalLM, through the fixture
 * tests/fixtures/models/gemma4-assistant made by
 * tests/reference/make_fixtures.py: the target's logits and final-normed
 * hidden state at the last prompt position, then ASSIST_STEPS chained draft
 * steps at that position (token in, h_out, logits of the ordered-embedding
 * candidates, the drafted token). Errors are held to 1e-3 of each quantity's
 * range; the drafted tokens must be the same. Without the fixture the test
 * skips, saying how to make it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/kn-cpu.h"
#include "model/md-safetensors.h"
#include "tests/harness/th.h"
#include "tests/unit/worker/wk-test-util.h"
#include "worker/wk-greedy.h"
#include "worker/wk-model.h"

/* Largest |a - b| over n entries where mask (if any) is set, and the range of b there. */
static double max_err(const float *a, const float *b, const unsigned char *mask, size_t n,
                      double *range) {
  double e = 0, lo = INFINITY, hi = -INFINITY;
  for (size_t i = 0; i < n; i++) {
    if (mask && !mask[i]) continue;
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= e)) e = d; /* NaN counts as the largest */
    lo = b[i] < lo ? b[i] : lo;
    hi = b[i] > hi ? b[i] : hi;
  }
  *range = hi - lo;
  return e;
}

static const struct md_tensor *need(struct md_st *g, const char *name, enum md_st_dtype dt) {
  const struct md_tensor *t = md_st_find(g, name);
  if (!t || t->dtype != dt) {
    th_fail(__FILE__, __LINE__, "golden.safetensors: %s missing or of another dtype", name);
    th_stop();
  }
  return t;
}

static void check(const char *what, const float *got, const float *want, const unsigned char *mask,
                  size_t n) {
  double range, e = max_err(got, want, mask, n, &range);
  fprintf(stderr, "%s: max error %.3g, range %.3g\n", what, e, range);
  if (!(e < 1e-3 * range))
    th_fail(__FILE__, __LINE__, "%s: max error %g >= 1e-3 x range %g", what, e, range);
}

TH_TEST(golden_gemma4_assistant) {
  char dir[4096], tdir[4200], err[512] = "";
  struct md_st *g = wkt_golden_open("gemma4-assistant", " --only gemma4-assistant", dir);
  snprintf(tdir, sizeof(tdir), "%s/target", dir);
  const struct md_tensor *ti = need(g, "input_ids", MD_ST_I64),
                         *ttl = need(g, "target_logits", MD_ST_F32),
                         *thi = need(g, "h_in", MD_ST_F32), *tti = need(g, "tokens_in", MD_ST_I64),
                         *tl = need(g, "logits", MD_ST_F32), *tho = need(g, "h_out", MD_ST_F32),
                         *td = need(g, "drafts", MD_ST_I64);
  int T = (int)ti->shape[0], V = (int)ttl->shape[0], B = (int)thi->shape[0], K = (int)tti->shape[0];
  TH_REQUIRE(tl->ndim == 2 && tl->shape[0] == K && tl->shape[1] == V);
  TH_REQUIRE(tho->ndim == 2 && tho->shape[0] == K && tho->shape[1] == B);
  TH_REQUIRE(td->shape[0] == K);
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)T);
  for (int i = 0; i < T; i++)
    ids[i] = (int32_t)((const int64_t *)ti->data)[i];

  struct kn_backend *be = wkt_cpu_backend(2);
  struct wk_model_opts mo = {.max_batch_tokens = T,
                             .max_seqs = 1,
                             .kv_tokens = T + 1,
                             .kv_dtype = 1 + KN_DTYPE_F32,
                             .quiet = 1};
  struct wk_model *t = NULL, *d = NULL;
  if (wk_model_load(tdir, be, &mo, &t, err, sizeof(err)) ||
      wk_draft_load(dir, t, &mo, &d, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "gemma4-assistant: %s", err);
    th_stop();
  }
  TH_REQUIRE(wk_model_config(t)->vocab == V && wk_model_config(t)->hidden == B);

  /* the prompt through the target: logits and h at T-1 */
  const struct wk_kv_spec *kv = wk_model_kv_spec(t);
  struct wk_page_alloc pa;
  TH_REQUIRE(wk_page_alloc_init(&pa, wk_model_n_pages(t)) == 0);
  struct wk_seq_blocks blk = {0};
  TH_REQUIRE(wk_seq_blocks_reserve(&blk, kv, &pa, T) == 0);
  struct wk_seq_input s = {.tokens = ids, .n_tokens = T, .pos0 = 0, .n_out = 1};
  wkt_seq_pages(&s, kv, &blk);
  float *tlog = malloc(sizeof(float) * (size_t)V), *h = malloc(sizeof(float) * (size_t)B),
        *hout = malloc(sizeof(float) * (size_t)B), *dlog = malloc(sizeof(float) * (size_t)V);
  unsigned char *cand = malloc((size_t)V);
  struct wk_batch b = {.seqs = &s, .n_seqs = 1, .logits = tlog, .hidden = h};
  TH_REQUIRE(wk_model_forward(t, &b, err, sizeof(err)) == 0);
  check("target logits at T-1", tlog, ttl->data, NULL, (size_t)V);
  check("target h at T-1", h, thi->data, NULL, (size_t)B);
  int32_t tok = wk_argmax(tlog, V);
  TH_CHECK_EQ_INT(tok, ((const int64_t *)tti->data)[0]);

  /* chained draft steps at position T-1 */
  for (int k = 0; k < K; k++) {
    struct wk_draft_input in = {.token = tok, .pos = T - 1, .h_in = h};
    for (int gi = 0; gi < kv->n_groups; gi++) {
      in.block_tables[gi] = blk.table[gi];
      in.n_blocks[gi] = blk.n[gi];
    }
    int32_t drafted = -1;
    TH_REQUIRE(wk_draft_step(d, &in, 1, &drafted, hout, dlog, err, sizeof(err)) == 0);
    const float *want = (const float *)tl->data + (size_t)k * V;
    /* transformers fills the non-candidates with the row minimum */
    float lo = INFINITY;
    for (int i = 0; i < V; i++)
      lo = want[i] < lo ? want[i] : lo;
    int n_cand = 0;
    for (int i = 0; i < V; i++)
      n_cand += cand[i] = want[i] > lo;
    TH_CHECK(n_cand > 0 && n_cand < V);
    char what[64];
    snprintf(what, sizeof(what), "step %d: candidate logits (%d)", k, n_cand);
    check(what, dlog, want, cand, (size_t)V);
    snprintf(what, sizeof(what), "step %d: h_out", k);
    check(what, hout, (const float *)tho->data + (size_t)k * B, NULL, (size_t)B);
    int64_t want_tok = ((const int64_t *)td->data)[k];
    if (drafted != want_tok)
      th_fail(__FILE__, __LINE__, "step %d: drafted %d, transformers %lld", k, drafted,
              (long long)want_tok);
    tok = drafted;
    memcpy(h, hout, sizeof(float) * (size_t)B);
  }
  wk_seq_blocks_release(&blk, kv, &pa);
  wk_page_alloc_free(&pa);
  free(ids), free(tlog), free(h), free(hout), free(dlog), free(cand);
  wk_model_free(d);
  wk_model_free(t);
  kn_backend_destroy(be);
  md_st_close(g);
}
