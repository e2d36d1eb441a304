/* test-wk-fast-prefill.c — Gemma 4's KV-shared fast prefill (wk_model_forward
 * drops the rows nobody reads before the first KV-shared layer): the logits and
 * hidden states of every row that has output are those of the full computation,
 * for batches that mix a chunked prefill (chunks with no output at all), a
 * prompt with one output row, a prompt whose every row is read (prompt
 * logprobs), and decode steps on the cache the shortened prefills wrote; on the
 * dense and the MoE checkpoint. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu.h"
#include "tests/harness/th.h"
#include "tests/unit/worker/wk-test-util.h"
#include "worker/wk-greedy.h"
#include "worker/wk-kv.h"
#include "worker/wk-model.h"

enum { NA = 40, NB = 20, NC = 10, CH = 16, DEC = 5, MAXV = 512, MAXH = 64 };
enum { MAXROWS = NC + 2 };

/* Everything a run returns: per step, its output rows' logits and hidden states. */
struct trace {
  int n_rows;
  float logits[(NA / CH + 1 + DEC) * MAXROWS * MAXV];
  float hidden[(NA / CH + 1 + DEC) * MAXROWS * MAXH];
};

static void prompt(int32_t *p, int n, int V, uint32_t seed) {
  for (int i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = (int32_t)((seed >> 8) % (uint32_t)V);
  }
  p[0] = 2;
}

static int run(const char *dir, int fast, struct trace *tr) {
  struct kn_backend *be = NULL;
  struct wk_model *m = NULL;
  char err[256] = "";
  struct wk_model_opts o = {.max_batch_tokens = 3 * CH,
                            .max_seqs = 3,
                            .kv_tokens = 256,
                            .quiet = 1,
                            .kv_dtype = 1,
                            .no_fast_prefill = !fast};
  TH_REQUIRE(kn_cpu_backend_create(1, &be) == 0);
  if (wk_model_load(dir, be, &o, &m, err, sizeof err)) {
    th_fail(__FILE__, __LINE__, "load: %s", err);
    kn_backend_destroy(be);
    return -1;
  }
  const struct md_config *c = wk_model_config(m);
  int V = c->vocab, H = c->hidden;
  TH_REQUIRE(V <= MAXV && H <= MAXH);
  const struct wk_kv_spec *kv = wk_model_kv_spec(m);
  struct wk_page_alloc pa;
  TH_REQUIRE(wk_page_alloc_init(&pa, wk_model_n_pages(m)) == 0);
  struct wk_seq_blocks blk[3];
  memset(blk, 0, sizeof blk);
  static int32_t toks[3][NA + DEC];
  prompt(toks[0], NA, V, 21);
  prompt(toks[1], NB, V, 22);
  prompt(toks[2], NC, V, 23);
  int len[3] = {NA, NB, NC}, done[3] = {0, 0, 0};
  static float logits[MAXROWS * MAXV], hidden[MAXROWS * MAXH];
  tr->n_rows = 0;
  int rc = 0;
  for (int step = 0; !rc && step < NA / CH + 1 + DEC; step++) {
    struct wk_seq_input in[3];
    int k = 0, rows = 0;
    for (int s = 0; s < 3; s++) {
      int prefill = done[s] < len[s];
      if (!prefill && s != 0) continue; /* only a decodes after its prompt */
      if (!prefill && done[s] >= NA + DEC) continue;
      int n = prefill ? (len[s] - done[s] < CH ? len[s] - done[s] : CH) : 1;
      TH_REQUIRE(wk_seq_blocks_reserve(&blk[s], kv, &pa, done[s] + n) == 0);
      memset(&in[k], 0, sizeof in[k]);
      in[k].tokens = toks[s] + done[s];
      in[k].n_tokens = n;
      in[k].pos0 = done[s];
      /* outputs: the last token of a finished prompt; every token of C */
      in[k].n_out = s == 2 ? n : (done[s] + n == len[s] || !prefill ? 1 : 0);
      wkt_seq_pages(&in[k], kv, &blk[s]);
      rows += in[k].n_out;
      done[s] += n;
      k++;
    }
    if (!k) break;
    struct wk_batch b = {.seqs = in, .n_seqs = k, .logits = logits, .hidden = hidden};
    rc = wk_model_forward(m, &b, err, sizeof err);
    if (rc) {
      th_fail(__FILE__, __LINE__, "forward: %s", err);
      break;
    }
    TH_REQUIRE(rows <= MAXROWS);
    memcpy(tr->logits + (size_t)tr->n_rows * V, logits, sizeof(float) * (size_t)rows * V);
    memcpy(tr->hidden + (size_t)tr->n_rows * H, hidden, sizeof(float) * (size_t)rows * H);
    tr->n_rows += rows;
    /* A decodes its own greedy tokens */
    if (done[0] >= NA && done[0] < NA + DEC) {
      int row = 0;
      for (int j = 0; j < k && in[j].tokens != toks[0] + done[0] - in[j].n_tokens; j++)
        row += in[j].n_out;
      toks[0][done[0]] = wk_argmax(logits + (size_t)row * V, V);
    }
  }
  for (int s = 0; s < 3; s++)
    wk_seq_blocks_release(&blk[s], kv, &pa);
  wk_page_alloc_free(&pa);
  wk_model_free(m);
  kn_backend_destroy(be);
  return rc;
}

static void check(int moe) {
  char dir[512];
  TH_REQUIRE(wkt_make_model(dir, sizeof dir, "gemma4", moe, 0, MD_ST_BF16, 9) == 0);
  static struct trace full, fast;
  TH_REQUIRE(run(dir, 0, &full) == 0);
  TH_REQUIRE(run(dir, 1, &fast) == 0);
  TH_CHECK_EQ_INT(fast.n_rows, full.n_rows);
  TH_CHECK(full.n_rows == NC + 2 + DEC); /* C's rows, A's and B's last, A's decodes */
  size_t nl = (size_t)full.n_rows * MAXV, nh = (size_t)full.n_rows * MAXH;
  float worst = 0, scale = 0;
  for (size_t i = 0; i < nl; i++) {
    worst = fmaxf(worst, fabsf(fast.logits[i] - full.logits[i]));
    scale = fmaxf(scale, fabsf(full.logits[i]));
  }
  for (size_t i = 0; i < nh; i++)
    worst = fmaxf(worst, fabsf(fast.hidden[i] - full.hidden[i]));
  /* the same rows through the same row-wise kernels: equal up to the order of
   * sums in matmuls that saw another row count */
  if (!(worst <= 1e-5f * (scale > 1 ? scale : 1)))
    th_fail(__FILE__, __LINE__, "moe %d: fast prefill moves outputs by %g", moe, (double)worst);
  wkt_rmdir(dir);
}

TH_TEST(fast_prefill_gemma4_is_exact) {
  check(0);
}

TH_TEST(fast_prefill_gemma4_moe_is_exact) {
  check(1);
}
