/* test-worker.c — `lmserve worker` as a real process against a fake
 * scheduler (a ROUTER bound on an ipc endpoint in a temp dir): READY fields,
 * greedy STEP output equal to `lmserve generate`, chunked prefill, batching
 * invariance, seeded sampling, logprobs, malformed steps answered with FAIL,
 * heartbeats, CTRL shutdown and SIGTERM. The fake scheduler is wk-test-sched.c. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "common/cm-time.h"
#include "lmserve-config.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/wk-test-sched.h"

#define NGEN 8 /* tokens generated per greedy check */

static const uint32_t k_prompt_a[] = {2, 651, 1234, 99, 7, 3000, 42, 17, 555, 8};
static const uint32_t k_prompt_b[] = {2, 9, 4444, 123, 77};

/* ---- the READY / greedy / batching / sampling walk on one worker ------------------ */

/* Runs `n` sequences to NGEN tokens each, all in the same steps; prompt
 * chunks of `chunk` tokens (0 = whole prompt). */
static void run_together(struct wts *w, struct wts_seq *seqs, int n, int chunk) {
  for (int i = 0; i < n; i++)
    wts_seq_begin(w, &seqs[i]);
  for (int guard = 0; guard < 200; guard++) {
    int busy = 0;
    for (int i = 0; i < n; i++)
      busy |= seqs[i].n_out < NGEN;
    if (!busy) return;
    TH_REQUIRE(wts_step_run(w, seqs, n, chunk, NGEN) == 0);
  }
  TH_REQUIRE(!"too many steps");
}

static void check_tokens(const uint32_t *a, int na, const uint32_t *b, int nb) {
  TH_CHECK_EQ_INT(na, nb);
  for (int i = 0; i < na && i < nb; i++)
    if (a[i] != b[i]) {
      th_fail(__FILE__, __LINE__, "token %d: %u != %u", i, a[i], b[i]);
      return;
    }
}

TH_TEST(worker_gemma4_steps) {
  th_proc_init(120);
  struct wts w;
  TH_REQUIRE(wts_model(&w, "gemma4", "m4") == 0);
  TH_REQUIRE(wts_start(&w, w.model, NULL) == 0);
  /* READY agrees with the model */
  TH_CHECK_EQ_INT(w.ready.rank, 0);
  TH_CHECK_EQ_INT(w.ready.world_size, 1);
  TH_CHECK_EQ_INT(w.ready.vocab_size, 262144);
  TH_CHECK_EQ_INT(w.ready.max_model_len, 8192);
  TH_CHECK_EQ_INT(w.ready.max_draft, 0);
  TH_CHECK_EQ_INT(w.ready.n_groups, 2);
  TH_CHECK(w.ready.kv_blocks > 8);
  int n_sliding = 0, layers = 0;
  for (uint32_t g = 0; g < w.ready.n_groups; g++) {
    n_sliding += w.groups[g].sliding_window == 64;
    layers += (int)w.groups[g].n_layers;
    TH_CHECK(w.groups[g].bytes_per_token > 0);
    TH_CHECK(w.groups[g].block_tokens >= 1);
  }
  TH_CHECK_EQ_INT(n_sliding, 1);
  TH_CHECK_EQ_INT(layers, 4); /* 6 layers, the last 2 share the cache of earlier ones */
  TH_CHECK_EQ_INT(w.n_eos, 2);
  TH_CHECK(w.eos[0] == 1 || w.eos[1] == 1);
  TH_CHECK(w.eos[0] == 106 || w.eos[1] == 106);

  /* greedy: one prefill + decodes equals `lmserve generate` */
  uint32_t ref_a[NGEN], ref_b[NGEN];
  TH_REQUIRE(wts_generate(&w, k_prompt_a, 10, NGEN, ref_a) == NGEN);
  TH_REQUIRE(wts_generate(&w, k_prompt_b, 5, NGEN, ref_b) == NGEN);
  struct wts_seq s[2];
  wts_seq_init(&s[0], 1, k_prompt_a, 10, -1);
  run_together(&w, s, 1, 0);
  check_tokens(s[0].out, s[0].n_out, ref_a, NGEN);
  /* the same prompt in chunks of 3 (tables appended as the sequence grows) */
  wts_seq_init(&s[0], 2, k_prompt_a, 10, -1);
  run_together(&w, s, 1, 3);
  check_tokens(s[0].out, s[0].n_out, ref_a, NGEN);
  /* two sequences in the same steps */
  wts_seq_init(&s[0], 3, k_prompt_a, 10, -1);
  wts_seq_init(&s[1], 4, k_prompt_b, 5, -1);
  run_together(&w, s, 2, 4);
  check_tokens(s[0].out, s[0].n_out, ref_a, NGEN);
  check_tokens(s[1].out, s[1].n_out, ref_b, NGEN);

  /* seeded sampling at temperature 1: repeatable alone and batched */
  uint32_t alone[NGEN];
  wts_seq_init(&s[0], 5, k_prompt_a, 10, 42);
  run_together(&w, s, 1, 0);
  memcpy(alone, s[0].out, sizeof(alone));
  wts_seq_init(&s[0], 6, k_prompt_a, 10, 42);
  run_together(&w, s, 1, 0);
  check_tokens(s[0].out, s[0].n_out, alone, NGEN);
  wts_seq_init(&s[0], 7, k_prompt_b, 5, 42);
  wts_seq_init(&s[1], 8, k_prompt_a, 10, 42);
  run_together(&w, s, 2, 3);
  check_tokens(s[1].out, s[1].n_out, alone, NGEN);
  /* preemption by recompute: the sequence stops after 4 tokens, comes back
   * NEW with prompt + those tokens as its prefill, and goes on with the
   * same draws (the counter is the absolute position) */
  {
    struct wts_seq p;
    wts_seq_init(&p, 14, k_prompt_a, 10, 42);
    wts_seq_begin(&w, &p);
    for (int g = 0; g < 20 && p.n_out < 4; g++)
      TH_REQUIRE(wts_step_run(&w, &p, 1, 0, 4) == 0);
    check_tokens(p.out, p.n_out, alone, 4);
    uint32_t again_prompt[14];
    memcpy(again_prompt, k_prompt_a, sizeof(k_prompt_a));
    memcpy(again_prompt + 10, p.out, 4 * sizeof(uint32_t));
    wts_seq_init(&p, 14, again_prompt, 14, 42);
    wts_seq_begin(&w, &p);
    for (int g = 0; g < 20 && p.n_out < NGEN - 4; g++)
      TH_REQUIRE(wts_step_run(&w, &p, 1, 5, NGEN - 4) == 0);
    check_tokens(p.out, p.n_out, alone + 4, NGEN - 4);
  }

  /* another seed draws other tokens (262144 near-uniform choices) */
  wts_seq_init(&s[0], 9, k_prompt_a, 10, 43);
  run_together(&w, s, 1, 0);
  TH_CHECK(memcmp(s[0].out, alone, sizeof(alone)) != 0);
  TH_CHECK(memcmp(alone, ref_a, sizeof(alone)) != 0);

  /* temperature 1 with top-k 1, or with min-p 1, keeps only the best token */
  wts_seq_init(&s[0], 11, k_prompt_a, 10, 42);
  s[0].top_k = 1;
  wts_seq_init(&s[1], 12, k_prompt_b, 5, 42);
  s[1].min_p = 1.0f;
  run_together(&w, s, 2, 4);
  check_tokens(s[0].out, s[0].n_out, ref_a, NGEN);
  check_tokens(s[1].out, s[1].n_out, ref_b, NGEN);

  /* logprobs: greedy token is the top entry, raw logprobs <= 0 */
  wts_seq_init(&s[0], 10, k_prompt_b, 5, -1);
  s[0].logprobs = 3;
  run_together(&w, s, 1, 0);
  check_tokens(s[0].out, s[0].n_out, ref_b, NGEN);
  TH_CHECK_EQ_INT(s[0].n_top, 3);
  for (int i = 0; i < NGEN; i++) {
    TH_CHECK(s[0].lp[i] <= 0);
    TH_CHECK(s[0].top_ids[i][0] == s[0].out[i]);
    TH_CHECK(s[0].top[i][0] == s[0].lp[i]);
    TH_CHECK(s[0].top[i][1] <= s[0].top[i][0] && s[0].top[i][2] <= s[0].top[i][1]);
  }
  TH_CHECK_EQ_INT(w.n_fail, 0);

  /* malformed steps: FAIL with a reason, and the worker serves the next one */
  for (int kind = 0; kind < WTS_BAD_KINDS; kind++) {
    int code = 0;
    char why[256] = "";
    TH_CHECK(wts_bad_step(&w, kind, &code, why, sizeof(why)) == 0);
    TH_CHECK(code < 0);
    TH_CHECK(why[0] != 0);
    fprintf(stderr, "bad step %d: %d %s\n", kind, code, why);
    wts_seq_init(&s[0], 100 + (uint64_t)kind, k_prompt_b, 5, -1);
    run_together(&w, s, 1, 0);
    check_tokens(s[0].out, s[0].n_out, ref_b, NGEN);
  }
  /* a message that is not msgpack at all */
  TH_CHECK(wts_send_garbage(&w) == 0);
  wts_seq_init(&s[0], 200, k_prompt_a, 10, -1);
  run_together(&w, s, 1, 0);
  check_tokens(s[0].out, s[0].n_out, ref_a, NGEN);

  /* heartbeats while idle */
  int beats = w.n_beats;
  wts_idle(&w, 2500);
  TH_CHECK(w.n_beats - beats >= 2);
  TH_CHECK(w.last_beat_step == w.next_step - 1);

  /* CTRL shutdown: exit 0 */
  TH_CHECK(wts_shutdown(&w) == 0);
  th_proc_check_exit(&w.proc, 0, 10000);
  wts_close(&w);
}

TH_TEST(worker_gemma3_greedy_and_sigterm) {
  th_proc_init(90);
  struct wts w;
  TH_REQUIRE(wts_model(&w, "gemma3", "m3") == 0);
  TH_REQUIRE(wts_start(&w, w.model, NULL) == 0);
  TH_CHECK(w.ready.n_groups >= 1);
  uint32_t ref[NGEN];
  TH_REQUIRE(wts_generate(&w, k_prompt_a, 10, NGEN, ref) == NGEN);
  struct wts_seq s[2];
  wts_seq_init(&s[0], 1, k_prompt_a, 10, -1);
  wts_seq_init(&s[1], 2, k_prompt_b, 5, 7);
  run_together(&w, s, 2, 4);
  check_tokens(s[0].out, s[0].n_out, ref, NGEN);
  th_proc_check_exit(&w.proc, SIGTERM, 10000);
  wts_close(&w);
}

/* ---- speculative decoding with the MTP assistant ----------------------------------- */

#define NSPEC 16

TH_TEST(worker_speculative_greedy) {
  th_proc_init(120);
  struct wts w;
  TH_REQUIRE(wts_model(&w, "gemma4", "m4s") == 0);
  char assistant[500];
  TH_REQUIRE(wts_assistant(&w, assistant, sizeof(assistant)) == 0);
  char *extra[] = {"--speculative-model", assistant, "--num-speculative-tokens", "3", NULL};
  TH_REQUIRE(wts_start(&w, w.model, extra) == 0);
  TH_CHECK_EQ_INT(w.ready.max_draft, 3);
  uint32_t ref[NSPEC];
  TH_REQUIRE(wts_generate(&w, k_prompt_a, 10, NSPEC, ref) == NSPEC);

  /* the worker's own drafts: greedy output is exactly the plain greedy output */
  struct wts_seq s;
  uint32_t drafts[3], next[3];
  int acc = 0, total_acc = 0, steps = 0;
  wts_seq_init(&s, 1, k_prompt_a, 10, -1);
  TH_REQUIRE(wts_spec_step(&w, &s, 3, NULL, 0, drafts, &acc) == 0);
  TH_CHECK_EQ_INT(w.n_drafts, 3); /* the assistant always proposes K */
  while (s.n_out < NSPEC && steps < 40) {
    TH_REQUIRE(wts_spec_step(&w, &s, 3, drafts, 3, next, &acc) == 0);
    memcpy(drafts, next, sizeof(drafts));
    total_acc += acc;
    steps++;
  }
  fprintf(stderr, "speculative: %d steps, %d drafts accepted\n", steps, total_acc);
  TH_REQUIRE(s.n_out >= NSPEC);
  check_tokens(s.out, NSPEC, ref, NSPEC);
  wts_seq_end(&w, &s);

  /* drafts that are the true continuation are all accepted, plus one more */
  wts_seq_init(&s, 2, k_prompt_a, 10, -1);
  TH_REQUIRE(wts_spec_step(&w, &s, 3, NULL, 0, next, &acc) == 0);
  TH_CHECK_EQ_INT(s.n_out, 1);
  TH_REQUIRE(wts_spec_step(&w, &s, 3, ref + 1, 3, next, &acc) == 0);
  TH_CHECK_EQ_INT(acc, 3);
  TH_CHECK_EQ_INT(s.n_out, 5);
  /* a wrong first draft is rejected and replaced by the greedy token */
  uint32_t wrong[3] = {(ref[5] + 1) % 262144, ref[6], ref[7]};
  TH_REQUIRE(wts_spec_step(&w, &s, 3, wrong, 3, next, &acc) == 0);
  TH_CHECK_EQ_INT(acc, 0);
  TH_CHECK_EQ_INT(s.n_out, 6);
  /* and the sequence goes on from the right place */
  TH_REQUIRE(wts_spec_step(&w, &s, 3, ref + 6, 2, next, &acc) == 0);
  TH_CHECK_EQ_INT(acc, 2);
  TH_CHECK_EQ_INT(s.n_out, 9);
  check_tokens(s.out, s.n_out, ref, 9);
  wts_seq_end(&w, &s);

  /* temperature 1 with a seed: rejection sampling over the same drafts
   * gives the same tokens on a repeat */
  uint32_t first[NSPEC];
  for (int rep = 0; rep < 2; rep++) {
    wts_seq_init(&s, 10 + (uint64_t)rep, k_prompt_b, 5, 77);
    TH_REQUIRE(wts_spec_step(&w, &s, 3, NULL, 0, drafts, &acc) == 0);
    steps = 0;
    while (s.n_out < NSPEC && steps < 40) {
      TH_REQUIRE(wts_spec_step(&w, &s, 3, drafts, 3, next, &acc) == 0);
      memcpy(drafts, next, sizeof(drafts));
      steps++;
    }
    TH_REQUIRE(s.n_out >= NSPEC);
    if (rep == 0)
      memcpy(first, s.out, sizeof(first));
    else
      check_tokens(s.out, NSPEC, first, NSPEC);
    wts_seq_end(&w, &s);
  }
  TH_CHECK_EQ_INT(w.n_fail, 0);

  /* drafts need the token before them in the same step */
  int code = 0;
  char why[256] = "";
  TH_CHECK(wts_bad_step(&w, 7, &code, why, sizeof(why)) == 0);
  TH_CHECK_EQ_INT(code, CM_ERR_INVAL);
  TH_CHECK(strstr(why, "before them") != NULL);
  wts_close(&w);
}

/* ---- speculative decoding with n-gram drafts ------------------------------------------- */

/* The drafts by definition: for n = max_n .. min_n, the first place where the last n
 * of t[0..L) occur with a token after them; up to k tokens from there. */
static int lookup(const uint32_t *t, int L, int min_n, int max_n, int k, uint32_t *out) {
  for (int n = max_n; n >= min_n; n--)
    for (int s = 0; n < L && s + n < L; s++)
      if (!memcmp(t + s, t + L - n, sizeof(uint32_t) * (size_t)n)) {
        int c = 0;
        for (int j = s + n; j < L && c < k; j++)
          out[c++] = t[j];
        return c;
      }
  return 0;
}

/* s's prompt and output so far, in t; returns how many. */
static int seq_tokens(const struct wts_seq *s, uint32_t *t) {
  memcpy(t, s->prompt, sizeof(uint32_t) * (size_t)s->n_prompt);
  memcpy(t + s->n_prompt, s->out, sizeof(uint32_t) * (size_t)s->n_out);
  return s->n_prompt + s->n_out;
}

/* Runs s to NSPEC tokens with the worker's own n-gram drafts (K 4, suffixes of 1 .. 3),
 * checking each step's proposals against the definition over the prompt and the
 * tokens so far; returns the drafts accepted. */
static int ngram_run(struct wts *w, struct wts_seq *s) {
  uint32_t drafts[4], next[4], t[200], want[4];
  int acc = 0, total = 0, nd = 0, steps = 0;
  TH_REQUIRE(wts_spec_step(w, s, 4, NULL, 0, drafts, &acc) == 0);
  for (;;) {
    int L = seq_tokens(s, t), n = lookup(t, L, 1, 3, 4, want);
    TH_CHECK_EQ_INT(w->n_drafts, n);
    if (w->n_drafts != n || memcmp(drafts, want, sizeof(uint32_t) * (size_t)n)) {
      th_fail(__FILE__, __LINE__, "step %d: the drafts are not the lookup's", steps);
      return total;
    }
    if (s->n_out >= NSPEC || steps++ == 40) break;
    nd = w->n_drafts;
    TH_REQUIRE(wts_spec_step(w, s, 4, drafts, nd, next, &acc) == 0);
    memcpy(drafts, next, sizeof(drafts));
    total += acc;
  }
  TH_REQUIRE(s->n_out >= NSPEC);
  return total;
}

/* The counts `lmserve generate` says on stderr with drafts: 0, or -1 without them. */
static int generate_counts(const char *err, int *proposed, int *taken) {
  static const char who[] = "lmserve generate: ";
  for (const char *l = err ? strstr(err, who) : NULL; l; l = strstr(l + 1, who))
    if (sscanf(l, "lmserve generate: %d draft tokens proposed, %d accepted", proposed, taken) == 2)
      return 0;
  return -1;
}

/* The first step of sequence id (the 11 tokens cp) on an echo model, from position
 * `cached` (`resumed` of them generated ones; the tokens before it sent when
 * send_before): it samples cp's last token again; returns the drafts proposed. */
static int echo_first_step(struct wts *w, uint64_t id, const uint32_t *cp, int cached, int resumed,
                           int send_before, uint32_t *drafts) {
  struct wts_seq s;
  int acc;
  wts_seq_init(&s, id, cp, 11, -1);
  s.cached = cached;
  s.resumed = resumed;
  s.send_before = send_before;
  TH_REQUIRE(wts_spec_step(w, &s, 4, NULL, 0, drafts, &acc) == 0);
  TH_CHECK_EQ_INT(s.out[0], cp[10]);
  wts_seq_end(w, &s);
  return w->n_drafts;
}

TH_TEST(worker_ngram_drafts) {
  th_proc_init(120);
  struct wts w;
  TH_REQUIRE(wts_model(&w, "gemma3", "m3n") == 0);
  char *extra[] = {"--speculative-model",
                   "ngram",
                   "--num-speculative-tokens",
                   "4",
                   "--ngram-prompt-lookup-max",
                   "3",
                   "--ngram-prompt-lookup-min",
                   "1",
                   NULL};
  TH_REQUIRE(wts_start(&w, w.model, extra) == 0);
  TH_CHECK_EQ_INT(w.ready.max_draft, 4);
  /* a prompt that repeats itself, and a random model's greedy output, which soon
   * repeats too */
  static const uint32_t prompt[] = {2, 651, 1234, 99, 7, 3000, 651, 1234, 99, 8, 651, 1234};
  enum { NP = sizeof(prompt) / sizeof(prompt[0]) };
  uint32_t ref[NSPEC];
  TH_REQUIRE(wts_generate(&w, prompt, NP, NSPEC, ref) == NSPEC);
  struct wts_seq s;
  wts_seq_init(&s, 1, prompt, NP, -1);
  int accepted = ngram_run(&w, &s);
  fprintf(stderr, "n-gram drafts: %d accepted\n", accepted);
  check_tokens(s.out, NSPEC, ref, NSPEC); /* greedy: the tokens without drafts */
  wts_seq_end(&w, &s);

  /* seeded sampling: the tokens the same seed draws without drafts */
  struct wts_seq plain;
  wts_seq_init(&plain, 10, prompt, NP, 1234);
  run_together(&w, &plain, 1, 0);
  wts_seq_end(&w, &plain);
  wts_seq_init(&s, 11, prompt, NP, 1234);
  (void)ngram_run(&w, &s);
  check_tokens(s.out, NGEN, plain.out, NGEN);
  wts_seq_end(&w, &s);

  /* lmserve generate --draft ngram: the same tokens as without, drafts accepted */
  const char *ids = "2,651,1234,99,7,3000,651,1234,99,8,651,1234";
  struct th_out plain_out = {0}, ngram_out = {0};
  TH_REQUIRE(th_lmserve(&plain_out, 60000, "generate", "--model", w.model, "--prompt-ids", ids,
                        "--max-tokens", "16", "--ignore-eos", "--threads", "1", NULL) == 0);
  TH_REQUIRE(th_lmserve(&ngram_out, 60000, "generate", "--model", w.model, "--prompt-ids", ids,
                        "--max-tokens", "16", "--ignore-eos", "--threads", "1", "--draft", "ngram",
                        "--draft-tokens", "4", "--ngram-prompt-lookup-min", "1",
                        "--ngram-prompt-lookup-max", "3", NULL) == 0);
  TH_CHECK(plain_out.out && ngram_out.out && !strcmp(plain_out.out, ngram_out.out));
  int proposed = 0, taken = 0;
  TH_CHECK(generate_counts(ngram_out.err, &proposed, &taken) == 0);
  TH_CHECK(taken > 0 && taken <= proposed);
  th_out_free(&plain_out);
  th_out_free(&ngram_out);

  TH_CHECK_EQ_INT(w.n_fail, 0);
  wts_close(&w);

  /* a prefix-cache hit: the tokens before the step come in `before`, and the drafts are
   * looked up among them too. An echo model (its greedy token is the current one,
   * whatever the context: the pages' K/V do not matter) samples 1234 after the prompt,
   * whose earliest 1234 (position 2, among the cached ones) gives the drafts */
  TH_REQUIRE(wts_model(&w, "gemma3", "m4n") == 0);
  char echo[500];
  snprintf(echo, sizeof(echo), "%s-echo", w.model);
  struct th_out o = {0};
  TH_REQUIRE(th_lmserve(&o, 60000, "make-tiny-model", "--arch", "gemma4", "--echo", "--out", echo,
                        NULL) == 0);
  th_out_free(&o);
  TH_REQUIRE(wts_start(&w, echo, extra) == 0);
  static const uint32_t cp[] = {2, 651, 1234, 99, 7, 651, 1234, 50, 60, 651, 1234};
  static const uint32_t want[] = {99, 7, 651, 1234};
  uint32_t drafts[4];
  TH_CHECK_EQ_INT(echo_first_step(&w, 20, cp, 8, 0, 1, drafts), 4);
  TH_CHECK(!memcmp(drafts, want, sizeof(want)));
  /* a preempted request run again after a prefix-cache hit: its last token, a generated
   * one, comes alone and without PREFILL, and counts all the same */
  TH_CHECK_EQ_INT(echo_first_step(&w, 23, cp, 10, 3, 1, drafts), 4);
  TH_CHECK(!memcmp(drafts, want, sizeof(want)));
  /* without them the history has a gap: no drafts, and no failure */
  TH_CHECK_EQ_INT(echo_first_step(&w, 21, cp, 8, 0, 0, drafts), 0);
  /* the whole prompt in the step: the same drafts */
  TH_CHECK_EQ_INT(echo_first_step(&w, 22, cp, 0, 0, 0, drafts), 4);
  TH_CHECK(!memcmp(drafts, want, sizeof(want)));
  TH_CHECK_EQ_INT(w.n_fail, 0);
  wts_close(&w);
}

/* ---- heartbeats while a step runs ------------------------------------------------------ */

TH_TEST(worker_beats_during_a_long_step) {
  th_proc_init(120);
  struct wts w;
  TH_REQUIRE(wts_model(&w, "gemma4", "m4l") == 0);
  /* the reference kernels and one thread make a long prefill take a few
   * seconds */
  char *env[] = {"LMSERVE_KERNELS=ref", NULL};
  char *extra[] = {"--max-num-batched-tokens", "2048", NULL};
  w.env = env;
  TH_REQUIRE(wts_start(&w, w.model, extra) == 0);
#ifdef __SANITIZE_ADDRESS__
  enum { NP = 300 }; /* ASan makes a step of reference kernels ten times slower */
#else
  enum { NP = 1500 };
#endif
  static uint32_t prompt[NP];
  prompt[0] = 2;
  for (int i = 1; i < NP; i++)
    prompt[i] = 10 + (uint32_t)i * 37u % 200000u;
  wts_idle(&w, 1200); /* the beat after READY */
  struct wts_seq s;
  wts_seq_init(&s, 1, prompt, NP, -1);
  wts_seq_begin(&w, &s);
  int beats = w.n_beats;
  uint64_t t0 = cm_time_ns();
  TH_REQUIRE(wts_step_run(&w, &s, 1, 0, 1) == 0);
  double secs = (double)(cm_time_ns() - t0) / 1e9;
  int during = w.n_beats - beats;
  fprintf(stderr, "%d-token step: %.2f s, %d beats during it\n", NP, secs, during);
  TH_CHECK_EQ_INT(s.n_out, 1);
  if (secs < 1.5) {
    wts_close(&w);
    TH_SKIP("the step was too short to check heartbeats during it");
  }
  TH_CHECK(during >= 1 && during >= (int)secs - 1);
  wts_close(&w);
}

/* CTRL GRAMMARS: the worker builds the structured-output state beside its steps and
 * says so in a BEAT at once (not a period later); a worker without a tokenizer says
 * that building it failed. */
static uint32_t grammars_flags_after_ctrl(struct wts *w) {
  TH_REQUIRE(wts_ctrl(w, PR_CTRL_GRAMMARS) == 0);
  for (int i = 0; i < 600 && !w->beat_flags; i++)
    wts_idle(w, 100);
  return w->beat_flags;
}

TH_TEST(worker_builds_the_grammars_when_asked) {
  th_proc_init(120);
  struct wts w;
  TH_REQUIRE(wts_model(&w, "gemma3", "mg") == 0);
  char *extra[] = {"--heartbeat-interval", "60", NULL};
  TH_REQUIRE(wts_start(&w, w.model, extra) == 0);
  TH_CHECK_EQ_INT(w.beat_flags, 0);
  uint64_t t0 = cm_time_ns();
  TH_CHECK_EQ_INT(grammars_flags_after_ctrl(&w), PR_BEAT_GRAMMARS);
  /* within the heartbeat period: the change was said at once */
  TH_CHECK(cm_time_ns() - t0 < 50ull * 1000000000ull);
  uint32_t ref[NGEN];
  TH_REQUIRE(wts_generate(&w, k_prompt_a, 10, NGEN, ref) == NGEN);
  struct wts_seq s;
  wts_seq_init(&s, 1, k_prompt_a, 10, -1);
  run_together(&w, &s, 1, 4);
  check_tokens(s.out, s.n_out, ref, NGEN);
  wts_close(&w);

  /* the same checkpoint without its tokenizer */
  char path[512];
  snprintf(path, sizeof(path), "%s/tokenizer.json", w.model);
  TH_REQUIRE(unlink(path) == 0);
  w.beat_flags = 0;
  TH_REQUIRE(wts_start(&w, w.model, extra) == 0);
  TH_CHECK_EQ_INT(grammars_flags_after_ctrl(&w), PR_BEAT_GRAMMARS_FAILED);
  wts_close(&w);
}

TH_TEST(worker_refuses_bad_flags) {
  th_proc_init(60);
  struct wts w;
  TH_REQUIRE(wts_model(&w, "gemma3", "m3b") == 0);
  struct th_out o = {0};
  TH_CHECK_EQ_INT(th_lmserve(&o, 30000, "worker", "--model", w.model, "--scheduler", w.endpoint,
                             "--rank", "2", "--world-size", "2", NULL),
                  2);
  TH_CHECK(o.err && strstr(o.err, "--rank 2 must be below --world-size 2"));
  /* 4 query heads cannot split over 8 ranks: refused before it connects */
  TH_CHECK_EQ_INT(th_lmserve(&o, 30000, "worker", "--model", w.model, "--scheduler", w.endpoint,
                             "--world-size", "8", NULL),
                  2);
  TH_CHECK(o.err && strstr(o.err, "num_attention_heads"));
  TH_CHECK_EQ_INT(th_lmserve(&o, 30000, "worker", "--model", "/nonexistent-model-dir",
                             "--scheduler", w.endpoint, NULL),
                  1);
  TH_CHECK(o.err && strstr(o.err, "nonexistent-model-dir"));
  /* n-gram lookup lengths without n-gram drafts, or the shortest above the longest */
  TH_CHECK_EQ_INT(th_lmserve(&o, 30000, "worker", "--model", w.model, "--scheduler", w.endpoint,
                             "--ngram-prompt-lookup-max", "3", NULL),
                  2);
  TH_CHECK(o.err && strstr(o.err, "needs --speculative-model ngram"));
  TH_CHECK_EQ_INT(th_lmserve(&o, 30000, "worker", "--model", w.model, "--scheduler", w.endpoint,
                             "--speculative-model", "[ngram]", "--ngram-prompt-lookup-min", "4",
                             "--ngram-prompt-lookup-max", "2", NULL),
                  2);
  TH_CHECK(o.err && strstr(o.err, "--ngram-prompt-lookup-min 4 is above"));
  /* vLLM's JSON form: a method it does not serve, a key it does not take, both forms */
  static const char *const bad_cfg[][2] = {
      {"{\"method\": \"eagle3\", \"model\": \"x\"}", "method \"eagle3\" is not served"},
      {"{\"method\": \"ngram\", \"acceptance_method\": \"typical\"}",
       "\"acceptance_method\" is not taken"},
      {"{\"method\": \"ngram\", \"disable_by_batch_size\": 1}", "must be an integer in [2, 65536]"},
      {"{\"method\": \"ngram\", \"num_speculative_tokens\": 0}", "must be an integer in [1, 64]"},
      {"[\"ngram\"]", "must be a JSON object"},
      {"{\"method\": \"mtp\", \"model\": \"ngram\"}", "takes an assistant checkpoint"},
  };
  for (size_t i = 0; i < sizeof(bad_cfg) / sizeof(bad_cfg[0]); i++) {
    TH_CHECK_EQ_INT(th_lmserve(&o, 30000, "worker", "--model", w.model, "--scheduler", w.endpoint,
                               "--speculative-config", bad_cfg[i][0], NULL),
                    2);
    TH_CHECK(o.err && strstr(o.err, bad_cfg[i][1]));
  }
  TH_CHECK_EQ_INT(th_lmserve(&o, 30000, "worker", "--model", w.model, "--scheduler", w.endpoint,
                             "--speculative-config", "{\"method\": \"ngram\"}",
                             "--num-speculative-tokens", "2", NULL),
                  2);
  TH_CHECK(o.err && strstr(o.err, "not both"));
#if !LMSERVE_HAVE_CUDA
  TH_CHECK_EQ_INT(th_lmserve(&o, 30000, "worker", "--model", w.model, "--scheduler", w.endpoint,
                             "--device", "cuda", NULL),
                  2);
  TH_CHECK(o.err && strstr(o.err, "no CUDA support"));
#endif
  th_out_free(&o);
  wts_close(&w);
}
