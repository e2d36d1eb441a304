/* test-cuda-graph.c — step graphs (CUDA graphs of decode and verification steps,
 * worker/wk-graph.c) on the device: replaying a bucket gives the bits of the same
 * padded step run uncaptured, for every bucket a shrinking batch passes through,
 * as the block tables grow and as a sliding window's pages leave them — decode
 * steps of one token, and verification steps of a token and its drafts (every
 * row's logits); and the replayed model agrees with one run op by op
 * (--enforce-eager) to the device's rounding. Skipped, loudly, without a device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "kernels/cuda/kn-cuda.h"
#include "kernels/kn-backend.h"
#include "tests/harness/th.h"
#include "tests/unit/worker/wk-test-util.h"
#include "worker/wk-kv.h"
#include "worker/wk-model.h"

#define NSEQ 5
#define MAXP 150 /* positions of the longest sequence */

struct model {
  struct wk_model *m;
  struct wk_page_alloc pa;
  struct wk_seq_blocks blk[NSEQ];
  int32_t freed[NSEQ][WK_MAX_KV_GROUPS][64]; /* pages a window dropped, restored at the end */
};

/* The model in dir, with step graphs (graphs) of decode steps and, for R > 1, of
 * verification steps of R tokens a sequence. */
static void load(struct kn_backend *be, const char *dir, int graphs, int R, struct model *md) {
  memset(md, 0, sizeof(*md));
  struct wk_model_opts o = {.max_batch_tokens = 512,
                            .max_seqs = 8,
                            .kv_tokens = 4096,
                            .quiet = 1,
                            .step_graphs = graphs ? WK_GRAPHS_CAPTURE : WK_GRAPHS_OFF,
                            .graph_verify_tokens = R > 1 ? R : 0};
  char err[256];
  if (wk_model_load(dir, be, &o, &md->m, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "load: %s", err);
    th_stop();
  }
  TH_REQUIRE(wk_page_alloc_init(&md->pa, wk_model_n_pages(md->m)) == 0);
}

static void unload(struct model *md) {
  const struct wk_kv_spec *kv = wk_model_kv_spec(md->m);
  for (int i = 0; i < NSEQ; i++) {
    for (int g = 0; g < kv->n_groups; g++)
      for (int b = 0; b < md->blk[i].n[g] && b < 64; b++)
        if (md->blk[i].table[g][b] < 0) md->blk[i].table[g][b] = md->freed[i][g][b];
    wk_seq_blocks_release(&md->blk[i], kv, &md->pa);
  }
  wk_page_alloc_free(&md->pa);
  wk_model_free(md->m);
}

/* Tokens sequence s runs next: a prefill of `pre` when it has run none, else R (a
 * token and R - 1 drafts), fewer at its end. */
static int next_tokens(const int *len, const int *done, int s, int pre, int R) {
  return done[s] ? CM_MIN(R, len[s] - done[s]) : pre;
}

/* The step of every sequence s with done[s] < len[s] (next_tokens of it, every row's
 * logits out but a prefill's last only); drops the pages a sliding window has left
 * behind (-1 in the table, as the scheduler frees them). */
static int fill_step(struct model *md, const int32_t (*tok)[MAXP], const int *len, const int *done,
                     int pre, int R, struct wk_seq_input *in) {
  const struct wk_kv_spec *kv = wk_model_kv_spec(md->m);
  int n = 0;
  for (int s = 0; s < NSEQ; s++) {
    if (done[s] >= len[s]) continue;
    int k = next_tokens(len, done, s, pre, R);
    TH_REQUIRE(wk_seq_blocks_reserve(&md->blk[s], kv, &md->pa, done[s] + k) == 0);
    for (int g = 0; g < kv->n_groups; g++) {
      const struct wk_kv_group *G = &kv->groups[g];
      for (int b = 0; G->window && b < md->blk[s].n[g] && b < 64; b++)
        if ((b + 1) * G->block_tokens <= done[s] - G->window && md->blk[s].table[g][b] >= 0) {
          md->freed[s][g][b] = md->blk[s].table[g][b];
          md->blk[s].table[g][b] = -1;
        }
    }
    memset(&in[n], 0, sizeof(in[n]));
    in[n].tokens = tok[s] + done[s];
    in[n].n_tokens = k;
    in[n].pos0 = done[s];
    in[n].n_out = done[s] ? k : 1;
    wkt_seq_pages(&in[n], kv, &md->blk[s]);
    n++;
  }
  return n;
}

/* Decode (R = 1) or verification (R tokens a sequence) steps of a shrinking batch. */
static void check_arch(struct kn_backend *be, const char *arch, int R) {
  char dir[256], err[256];
  TH_REQUIRE(wkt_make_model(dir, sizeof(dir), arch, 0, 0, MD_ST_BF16, 31) == 0);
  struct model gm, em;
  load(be, dir, 1, R, &gm);
  load(be, dir, 0, R, &em);
  int V = wk_model_config(gm.m)->vocab;
  static int32_t tok[NSEQ][MAXP];
  int len[NSEQ] = {MAXP, 97, 40, 121, 66}, done_g[NSEQ] = {0}, done_e[NSEQ] = {0};
  for (int s = 0; s < NSEQ; s++)
    for (int p = 0; p < MAXP; p++)
      tok[s][p] = (int32_t)((uint32_t)(s * 7919 + p * 104729 + 13) % (uint32_t)V);
  float *lg = malloc(sizeof(float) * NSEQ * (size_t)R * (size_t)V),
        *le = malloc(sizeof(float) * NSEQ * (size_t)R * (size_t)V);
  TH_REQUIRE(lg && le);
  int checked[8] = {0}, steps = 0;
  double worst = 0.0;
  for (;;) {
    struct wk_seq_input ig[NSEQ], ie[NSEQ];
    int n = fill_step(&gm, tok, len, done_g, 12, R, ig);
    TH_REQUIRE(fill_step(&em, tok, len, done_e, 12, R, ie) == n);
    if (!n) break;
    struct wk_batch bg = {.seqs = ig, .n_seqs = n, .logits = lg};
    struct wk_batch be_ = {.seqs = ie, .n_seqs = n, .logits = le};
    int uniform = 1, rows = 0; /* every sequence R tokens, all out: it replays a graph */
    for (int i = 0; i < n; i++) {
      uniform &= ig[i].n_tokens == R && ig[i].n_out == R;
      rows += ig[i].n_out;
    }
    if (uniform) {
      int rc = wk_model_graph_check(gm.m, &bg, err, sizeof(err));
      if (rc) th_fail(__FILE__, __LINE__, "%s: step %d of %d sequences: %s", arch, steps, n, err);
      int b = n <= 1 ? 0 : n <= 2 ? 1 : n <= 4 ? 2 : 3;
      checked[b]++;
    }
    TH_REQUIRE(wk_model_forward(gm.m, &bg, err, sizeof(err)) == 0);
    TH_REQUIRE(wk_model_forward(em.m, &be_, err, sizeof(err)) == 0);
    double lo = INFINITY, hi = -INFINITY, d = 0.0;
    for (size_t i = 0; i < (size_t)rows * (size_t)V; i++) {
      lo = fmin(lo, le[i]);
      hi = fmax(hi, le[i]);
      d = fmax(d, fabs((double)lg[i] - (double)le[i]));
    }
    worst = fmax(worst, d / (hi - lo));
    for (int s = 0; s < NSEQ; s++) {
      int k = next_tokens(len, done_g, s, 12, R);
      if (done_g[s] < len[s]) done_g[s] += k;
      if (done_e[s] < len[s]) done_e[s] += k;
    }
    steps++;
  }
  printf("%s, %d tokens a sequence: %d steps; graph checks per bucket (1, 2, 4, 8 sequences): "
         "%d %d %d %d; replayed vs eager logits differ by at most %.3g of their range\n",
         arch, R, steps, checked[0], checked[1], checked[2], checked[3], worst);
  TH_CHECK(checked[0] > 0 && checked[1] > 0 && checked[2] > 0 && checked[3] > 0);
  TH_CHECK(worst < 1e-4);
  free(lg);
  free(le);
  unload(&gm);
  unload(&em);
  wkt_rmdir(dir);
}

/* Backend 0; skips the test loudly where no CUDA device is visible. */
static struct kn_backend *open_device(void) {
  static char why[64];
  int n = kn_cuda_device_count();
  if (n <= 0) {
    snprintf(why, sizeof(why), "no CUDA device visible: %d devices", n);
    TH_SKIP(why);
  }
  struct kn_backend *be;
  TH_REQUIRE(kn_cuda_backend_create(0, &be) == 0);
  return be;
}

TH_TEST(cuda_step_graphs_replay_bit_identical) {
  struct kn_backend *be = open_device();
  check_arch(be, "gemma3", 1);
  check_arch(be, "gemma4", 1);
  kn_backend_destroy(be);
}

TH_TEST(cuda_verify_step_graphs_replay_bit_identical) {
  struct kn_backend *be = open_device();
  check_arch(be, "gemma3", 4);
  check_arch(be, "gemma4", 3);
  kn_backend_destroy(be);
}

/* What a backend without graphs answers, and the order the modes go in. */
TH_TEST(step_graph_modes_in_order) {
  struct kn_backend *be = open_device();
  struct kn_graph *g;
  TH_REQUIRE(kn_graph_new(be, 1024, &g) == 0);
  TH_CHECK_EQ_INT(kn_graph_begin(be, g, KN_GRAPH_CAPTURE), CM_ERR_INVAL); /* not measured */
  TH_CHECK_EQ_INT(kn_graph_begin(be, g, KN_GRAPH_REPLAY), CM_ERR_INVAL);  /* not captured */
  TH_REQUIRE(kn_graph_begin(be, g, KN_GRAPH_MEASURE) == 0);
  int32_t ids[3] = {1, 2, 3};
  float *out = kn_alloc(be, sizeof(float) * 3 * 8), host[24];
  float *table = kn_alloc(be, sizeof(float) * 4 * 8);
  TH_REQUIRE(out && table);
  TH_REQUIRE(kn_memset(be, table, 0, sizeof(float) * 32) == 0);
  TH_CHECK(kn_embed(be, out, 8, table, KN_DTYPE_F32, 4, 8, ids, 3, 1.0f) == 0);
  TH_CHECK_EQ_INT(kn_download(be, host, out, sizeof(host)), CM_ERR_UNSUPPORTED);
  TH_REQUIRE(kn_graph_end(be, g, 1) == 0);
  TH_REQUIRE(kn_graph_begin(be, g, KN_GRAPH_CAPTURE) == 0);
  TH_CHECK(kn_embed(be, out, 8, table, KN_DTYPE_F32, 4, 8, ids, 3, 1.0f) == 0);
  TH_REQUIRE(kn_graph_end(be, g, 1) == 0);
  TH_REQUIRE(kn_graph_begin(be, g, KN_GRAPH_REPLAY) == 0);
  /* another size than captured: refused, and nothing runs */
  TH_CHECK_EQ_INT(kn_embed(be, out, 8, table, KN_DTYPE_F32, 4, 8, ids, 2, 1.0f), CM_ERR_INVAL);
  TH_CHECK(kn_graph_end(be, g, 1) != 0);
  TH_REQUIRE(kn_graph_begin(be, g, KN_GRAPH_REPLAY) == 0);
  TH_CHECK(kn_embed(be, out, 8, table, KN_DTYPE_F32, 4, 8, ids, 3, 1.0f) == 0);
  TH_CHECK(kn_graph_end(be, g, 1) == 0);
  TH_CHECK(kn_sync(be) == 0);
  kn_graph_free(be, g);
  kn_free(be, out);
  kn_free(be, table);
  kn_backend_destroy(be);
}
