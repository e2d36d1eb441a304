/* test-cuda-lora.c — LoRA adapters on the device: the tiny Gemma 3 and Gemma 4 (f32
 * weights) with two adapters from tests/reference/make_lora.py, loaded on the CUDA
 * backend (step graphs captured) and on the CPU's; a prefill of three sequences
 * (adapter 1, none, adapter 2) and decode steps of the same three, then of the base
 * sequence alone (a step the graphs replay), give every row's logits within 1e-3 of
 * the CPU's range; each adapter moves them far more. Skipped, loudly, without a
 * device or without numpy. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-fs.h"
#include "common/cm-proc.h"
#include "kernels/cuda/kn-cuda.h"
#include "kernels/kn-backend.h"
#include "tests/harness/th.h"
#include "tests/unit/worker/wk-test-util.h"

#define NSEQ  3
#define PRE   24 /* prompt tokens */
#define STEPS 6  /* decode steps of all three */
#define TOL   1e-3

struct side {
  struct wk_model *m;
  struct wk_page_alloc pa;
  struct wk_seq_blocks blk[NSEQ];
};

static void load(struct kn_backend *be, const char *dir, char ad[2][4200], struct side *s) {
  memset(s, 0, sizeof(*s));
  struct wk_model_opts o = {.max_batch_tokens = 256,
                            .max_seqs = 8,
                            .kv_tokens = 2048,
                            .quiet = 1,
                            .step_graphs = WK_GRAPHS_CAPTURE};
  char err[768];
  if (wk_model_load(dir, be, &o, &s->m, err, sizeof(err)) ||
      wk_model_add_lora(s->m, "one", ad[0], err, sizeof(err)) ||
      wk_model_add_lora(s->m, "two", ad[1], err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "load: %s", err);
    th_stop();
  }
  TH_REQUIRE(wk_page_alloc_init(&s->pa, wk_model_n_pages(s->m)) == 0);
  const struct wk_kv_spec *kv = wk_model_kv_spec(s->m);
  for (int i = 0; i < NSEQ; i++)
    TH_REQUIRE(wk_seq_blocks_reserve(&s->blk[i], kv, &s->pa, PRE + STEPS + 2) == 0);
}

static void unload(struct side *s) {
  for (int i = 0; i < NSEQ; i++)
    wk_seq_blocks_release(&s->blk[i], wk_model_kv_spec(s->m), &s->pa);
  wk_page_alloc_free(&s->pa);
  wk_model_free(s->m);
}

/* Sequences [s0, s0 + n) run k tokens each from position p0 (every row out). */
static void step(struct side *s, const int32_t (*tok)[PRE + STEPS + 2], int s0, int n, int p0,
                 int k, float *out) {
  static const int lora[NSEQ] = {1, 0, 2};
  const struct wk_kv_spec *kv = wk_model_kv_spec(s->m);
  struct wk_seq_input in[NSEQ];
  for (int i = 0; i < n; i++) {
    int q = s0 + i;
    memset(&in[i], 0, sizeof(in[i]));
    in[i] = (struct wk_seq_input){
        .tokens = tok[q] + p0, .n_tokens = k, .pos0 = p0, .n_out = k, .lora = lora[q]};
    wkt_seq_pages(&in[i], kv, &s->blk[q]);
  }
  struct wk_batch b = {.seqs = in, .n_seqs = n, .logits = out};
  char err[512];
  if (wk_model_forward(s->m, &b, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "forward: %s", err);
    th_stop();
  }
}

static void check_arch(struct kn_backend *dev, const char *python, const char *arch) {
  char dir[256], ad[2][4200];
  TH_REQUIRE(wkt_make_model(dir, sizeof(dir), arch, 0, 0, MD_ST_F32, 41) == 0);
  for (int i = 0; i < 2; i++) {
    snprintf(ad[i], sizeof(ad[i]), "%s/ad%d", dir, i);
    th_reference(python, "make_lora.py", dir, ad[i], "--rank", i ? "16" : "4", "--std-b", "0.05",
                 "--seed", i ? "2" : "1");
  }
  struct kn_backend *cpu = wkt_cpu_backend(2);
  struct side d, c;
  load(dev, dir, ad, &d);
  load(cpu, dir, ad, &c);
  int V = wk_model_config(c.m)->vocab;
  static int32_t tok[NSEQ][PRE + STEPS + 2];
  for (int s = 0; s < NSEQ; s++)
    for (int p = 0; p < PRE + STEPS + 2; p++)
      tok[s][p] = /* sequences 0 and 1 alike: what tells them apart is the adapter */
          (int32_t)((uint32_t)((s ? s : 1) * 7919 + p * 104729 + 13) % (uint32_t)(V - 8)) + 4;
  size_t most = (size_t)NSEQ * PRE * V;
  float *ld = malloc(sizeof(float) * most), *lc = malloc(sizeof(float) * most);
  TH_REQUIRE(ld && lc);
  double worst = 0;
  step(&d, tok, 0, NSEQ, 0, PRE, ld);
  step(&c, tok, 0, NSEQ, 0, PRE, lc);
  worst = fmax(worst, wkt_rel_err(ld, lc, most));
  /* the adapters are seen: sequence 0 (adapter 1) against the same tokens' base run */
  double moved = wkt_rel_err(lc, lc + (size_t)PRE * V, (size_t)PRE * V);
  for (int t = 0; t < STEPS; t++) {
    step(&d, tok, 0, NSEQ, PRE + t, 1, ld);
    step(&c, tok, 0, NSEQ, PRE + t, 1, lc);
    worst = fmax(worst, wkt_rel_err(ld, lc, (size_t)NSEQ * V));
  }
  step(&d, tok, 1, 1, PRE + STEPS, 1, ld); /* the base sequence alone: a graph's step */
  step(&c, tok, 1, 1, PRE + STEPS, 1, lc);
  worst = fmax(worst, wkt_rel_err(ld, lc, (size_t)V));
  printf("%s: device against the CPU %.3g of the range; sequences 0 and 1 differ by %.3g\n", arch,
         worst, moved);
  TH_CHECK(worst < TOL);
  TH_CHECK(moved > 100 * TOL);
  free(ld);
  free(lc);
  unload(&d);
  unload(&c);
  kn_backend_destroy(cpu);
  cm_rmtree(dir);
}

TH_TEST(cuda_lora_matches_cpu) {
  int n = kn_cuda_device_count();
  if (n <= 0) TH_SKIP("no CUDA device visible");
  const char *python = th_require_numpy("LoRA adapters on the device", "make_lora.py");
  struct kn_backend *be;
  TH_REQUIRE(kn_cuda_backend_create(0, &be) == 0);
  check_arch(be, python, "gemma3");
  check_arch(be, python, "gemma4");
  kn_backend_destroy(be);
}
