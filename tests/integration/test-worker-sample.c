/* test-worker-sample.c — the worker's two sampling paths agree: logits
 * downloaded and sampled on the host (--no-device-sampling) and kn_sample
 * on the model's backend (--device-sampling, the default on CUDA). On the
 * CPU backend both run the same math (kernels/cpu/kn-cpu-sample.c), so the
 * tokens and logprobs must be identical, for greedy and seeded sequences
 * with top-k, min-p, penalties and logprobs, batched and chunked; this checks
 * the wiring (counters, penalty state, parameters, result rows). */
#include <string.h>

#include "tests/harness/th.h"
#include "tests/integration/wk-test-sched.h"

#define NGEN  8
#define NSEQS 4

static const uint32_t k_prompt_a[] = {2, 651, 1234, 99, 7, 3000, 42, 17, 555, 8};
static const uint32_t k_prompt_b[] = {2, 9, 4444, 123, 77};

/* Runs the four test sequences together (prompt chunks of 3) on a worker
 * started with `flag`. */
static void run(const char *flag, struct wts_seq *s) {
  struct wts w;
  TH_REQUIRE(wts_model(&w, "gemma4", "m4") == 0);
  char *extra[] = {(char *)flag, NULL};
  TH_REQUIRE(wts_start(&w, w.model, extra) == 0);
  wts_seq_init(&s[0], 1, k_prompt_a, 10, -1); /* greedy, with top logprobs */
  s[0].logprobs = 3;
  wts_seq_init(&s[1], 2, k_prompt_b, 5, 42); /* seeded, temperature 1 */
  s[1].logprobs = 0;
  wts_seq_init(&s[2], 3, k_prompt_a, 10, 7); /* top-k and min-p */
  s[2].top_k = 40;
  s[2].min_p = 0.02f;
  wts_seq_init(&s[3], 4, k_prompt_b, 5, 9); /* penalties over prompt and output */
  s[3].penalty = 0.7f;
  s[3].logprobs = 2;
  for (int i = 0; i < NSEQS; i++)
    wts_seq_begin(&w, &s[i]);
  for (int guard = 0; guard < 200; guard++) {
    int busy = 0;
    for (int i = 0; i < NSEQS; i++)
      busy |= s[i].n_out < NGEN;
    if (!busy) break;
    TH_REQUIRE(wts_step_run(&w, s, NSEQS, 3, NGEN) == 0);
  }
  wts_close(&w);
}

TH_TEST(worker_device_sampling_matches_host) {
  th_proc_init(180);
  static struct wts_seq host[NSEQS], dev[NSEQS];
  run("--no-device-sampling", host);
  run("--device-sampling", dev);
  for (int i = 0; i < NSEQS; i++) {
    TH_CHECK_EQ_INT(host[i].n_out, NGEN);
    TH_CHECK_EQ_INT(dev[i].n_out, host[i].n_out);
    for (int k = 0; k < host[i].n_out && k < dev[i].n_out; k++) {
      if (dev[i].out[k] != host[i].out[k]) {
        th_fail(__FILE__, __LINE__, "sequence %d token %d: host %u, device path %u", i, k,
                host[i].out[k], dev[i].out[k]);
        break;
      }
      if (host[i].logprobs >= 0) TH_CHECK(dev[i].lp[k] == host[i].lp[k]);
    }
    TH_CHECK_EQ_INT(dev[i].n_top, host[i].n_top);
    for (int k = 0; k < host[i].n_out && k < dev[i].n_out; k++)
      for (int t = 0; t < host[i].n_top && t < WTS_MAX_TOP; t++) {
        TH_CHECK_EQ_INT(dev[i].top_ids[k][t], host[i].top_ids[k][t]);
        TH_CHECK(dev[i].top[k][t] == host[i].top[k][t]);
      }
  }
  /* the sequences really were sampled: the seeded ones are not all greedy */
  int differs = 0;
  for (int k = 0; k < NGEN; k++)
    differs |= host[2].out[k] != host[0].out[k];
  TH_CHECK(differs);
}
