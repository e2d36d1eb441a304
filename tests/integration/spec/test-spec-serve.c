/* test-spec-serve.c — speculative decoding with the Gemma 4 MTP assistant
 * through `lmserve serve`, driven over HTTP.
 *
 *   - greedy answers with speculation on (K = 1, 3, 5) are identical, token
 *     for token (text, logprobs' tokens and values, finish reason, usage), to
 *     those with it off, for 32 concurrent requests of mixed lengths, several
 *     of whose prompts are longer than the model's sliding window; the pair
 *     used (make-tiny-model --echo --echo-leak with an --agree assistant)
 *     accepts some drafts and rejects others, so every acceptance length
 *     occurs; the spec_decode_* counters are consistent (per position too) and
 *     the KV pool is back at zero usage once the requests are done;
 *   - an assistant that agrees with its target (--echo / --agree) has its
 *     drafts accepted: acceptance length about K + 1 and about K + 1 times
 *     fewer target steps than tokens;
 *   - n-gram drafts (--speculative-model ngram) likewise give the answers
 *     without speculation, on one rank and two, and see the prompt tokens
 *     the prefix cache held. */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/harness/th-http.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

static char tmp[256];

static int make_tmp(void) {
  return th_tmpdir("spec", tmp, sizeof(tmp));
}

/* lmserve make-tiny-model ARGS... --out tmp/NAME into path[300]. */
static int make_model(char *path, const char *name, char *const *args) {
  snprintf(path, 300, "%s/%s", tmp, name);
  char *argv[16] = {th_lmserve_bin(), "make-tiny-model"};
  int n = 2;
  for (int i = 0; args[i] && n < 12; i++)
    argv[n++] = args[i];
  argv[n++] = "--out";
  argv[n++] = path;
  argv[n] = NULL;
  char *out = NULL, *err = NULL;
  int rc = th_run(argv, NULL, NULL, 0, 120000, &out, &err);
  if (rc) fprintf(stderr, "make-tiny-model %s: %s\n", name, err ? err : "");
  free(out), free(err);
  return rc;
}

/* An echo target (make-tiny-model --arch gemma4 --echo, then extra) in tmp/name and its
 * agreeing assistant in tmp/aname, their paths in model and assistant [300]. Skips the
 * test when the target has no Gemma tokenizer. */
static void make_pair(char *model, const char *name, char *const *extra, char *assistant,
                      const char *aname) {
  TH_REQUIRE(make_tmp() == 0);
  char *args[8] = {"--arch", "gemma4", "--echo"};
  for (int i = 0; extra[i] && i < 4; i++)
    args[3 + i] = extra[i];
  TH_REQUIRE(make_model(model, name, args) == 0);
  char tokpath[400];
  snprintf(tokpath, sizeof(tokpath), "%s/tokenizer.json", model);
  if (access(tokpath, R_OK) != 0) TH_SKIP("no Gemma tokenizer in the tiny model (run tools/setup)");
  TH_REQUIRE(make_model(assistant, aname,
                        (char *[]){"--arch", "gemma4-assistant", "--agree", "--target", model,
                                   NULL}) == 0);
}

/* ---- the server --------------------------------------------------------------- */

struct srv {
  struct th_proc p;
  int port;
};

/* lmserve serve on `model`, speculating with `assistant` (NULL: none; "ngram": n-gram
 * drafts of suffixes of 1 .. 3 tokens), with `tp` ranks (0: one, the default), and
 * speculation off while `off` requests or more run (0: never). */
static int srv_start_off(struct srv *s, const char *model, const char *assistant, int k, int tp,
                         int off) {
  char k_s[16], tp_s[16], off_s[16];
  snprintf(k_s, sizeof(k_s), "%d", k);
  snprintf(tp_s, sizeof(tp_s), "%d", tp);
  snprintf(off_s, sizeof(off_s), "%d", off);
  char *args[14], **a = args;
  if (assistant) {
    *a++ = "--speculative-model", *a++ = (char *)assistant;
    *a++ = "--num-speculative-tokens", *a++ = k_s;
  }
  if (assistant && !strcmp(assistant, "ngram"))
    *a++ = "--ngram-prompt-lookup-min", *a++ = "1", *a++ = "--ngram-prompt-lookup-max", *a++ = "3";
  if (tp) *a++ = "--tensor-parallel-size", *a++ = tp_s;
  if (off) *a++ = "--speculative-disable-by-batch-size", *a++ = off_s;
  *a = NULL;
  s->port = th_serve_start(&s->p, model, args);
  return s->port > 0 ? 0 : -1;
}

static int srv_start_tp(struct srv *s, const char *model, const char *assistant, int k, int tp) {
  return srv_start_off(s, model, assistant, k, tp, 0);
}

static int srv_start(struct srv *s, const char *model, const char *assistant, int k) {
  return srv_start_tp(s, model, assistant, k, 0);
}

static void srv_stop(struct srv *s) {
  th_proc_stop(&s->p, 20000);
}

/* The engine's gauges and spec_decode_* counters reach /metrics with the
 * scheduler's PONG, every 500 ms: once the answers are in, waits (up to 30 s)
 * until no request runs, the KV pool is empty and those values have stayed
 * the same over two reads more than two PONG periods apart. Returns the last
 * /metrics text (malloc'd) and *idle. */
static char *wait_idle(struct srv *s, int *idle) {
  static const char *const names[] = {
      "lmserve:num_requests_running",
      "lmserve:num_requests_waiting",
      "lmserve:kv_cache_usage_perc",
      "lmserve:spec_decode_num_drafts_total",
      "lmserve:spec_decode_num_draft_tokens_total",
      "lmserve:spec_decode_num_accepted_tokens_total",
      "lmserve:spec_decode_num_accepted_tokens_per_pos_total",
  };
  enum { NN = sizeof(names) / sizeof(names[0]) };
  double prev[NN];
  int have_prev = 0;
  char *m = NULL;
  *idle = 0;
  for (int i = 0; i < 25; i++) {
    usleep(1200000);
    free(m);
    if (th_http(s->port, "GET", "/metrics", NULL, 240000, &m) != 200) continue;
    double v[NN];
    for (int j = 0; j < NN; j++)
      v[j] = th_metric(m, names[j], NULL);
    int zero = v[0] == 0 && v[1] == 0 && v[2] == 0;
    if (zero && have_prev && !memcmp(v, prev, sizeof(v))) {
      *idle = 1;
      break;
    }
    memcpy(prev, v, sizeof(v));
    have_prev = zero;
  }
  return m;
}

/* ---- concurrent requests ---------------------------------------------------- */

#define NREQ 32
/* An ASan + UBSan debug build runs the kernels unoptimised, ~20 times slower:
 * fewer generated tokens there (the prompts stay as long). */
#ifdef __SANITIZE_ADDRESS__
#define GEN_MIN      2
#define GEN_SPAN     6
#define AGREE_TOKENS 17
#else
#define GEN_MIN      6
#define GEN_SPAN     17
#define AGREE_TOKENS 41
#endif

/* Request i: a prompt of 3 .. 152 ids (the tiny model's window is 64),
 * GEN_MIN .. GEN_MIN + GEN_SPAN - 1 greedy tokens, logprobs of the chosen
 * token; every third one constrained by a regex, every fourth with bad words. */
static void build_jobs(struct th_job *jobs, int n) {
  uint32_t x = 12345;
  for (int i = 0; i < n; i++) {
    int len = 3 + (i * 37) % 150, max_tokens = GEN_MIN + (i * 7) % GEN_SPAN;
    /* every third a structured output: its drafts are proposed within its mask; every
     * fourth bans words, whose drafts are verified with the bans their position has */
    th_job_make(&jobs[i], len, &x,
                "\"max_tokens\":%d,\"temperature\":0,\"logprobs\":0,\"stream\":false%s%s",
                max_tokens,
                i % 3 == 1 ? ",\"structured_outputs\":{\"regex\":\"[a-z]+( [a-z]+)*\"}" : "",
                i % 4 == 2 ? ",\"bad_words\":[\"a\",\"e\",\"the\",\"s t\"]" : "");
  }
}

/* Checks the spec_decode_* counters of a run with K draft tokens (some_off: speculation
 * was off while many requests ran, and may not have drafted at all). */
static void check_spec_metrics(const char *m, int k, int some_off, double *drafts_out,
                               double *accepted_out) {
  double drafts = th_metric(m, "lmserve:spec_decode_num_drafts_total", NULL);
  double tokens = th_metric(m, "lmserve:spec_decode_num_draft_tokens_total", NULL);
  double accepted = th_metric(m, "lmserve:spec_decode_num_accepted_tokens_total", NULL);
  fprintf(stderr, "K=%d: %.0f drafts, %.0f draft tokens, %.0f accepted, acceptance length %.2f\n",
          k, drafts, tokens, accepted, drafts > 0 ? 1 + accepted / drafts : 0);
  TH_CHECK(drafts > 0 || some_off);
  TH_CHECK(tokens >= drafts && tokens <= k * drafts);
  TH_CHECK(accepted >= 0 && accepted <= tokens);
  /* per position: each accepted run of a counts once at positions 0 .. a-1 */
  double sum = 0, prev = drafts;
  for (int pos = 0; pos < 70; pos++) {
    char label[32];
    snprintf(label, sizeof(label), "position=\"%d\"", pos);
    double v = th_metric(m, "lmserve:spec_decode_num_accepted_tokens_per_pos_total", label);
    if (v < 0) break;
    TH_CHECK(pos < k);
    TH_CHECK(v <= prev);
    prev = v;
    sum += v;
  }
  TH_CHECK_NEAR(sum, accepted, 0);
  *drafts_out = drafts;
  *accepted_out = accepted;
}

/* got[0..n) through serve on model speculating k tokens with assistant, on tp ranks (0:
 * one), speculation off while `off` requests or more run (0: never): the answers must be
 * ref's, the KV pool back at zero usage and the spec_decode_* counters consistent; the
 * draft tokens and the accepted ones in *tokens, *accepted. */
static void check_spec_off(const struct th_job *ref, struct th_job *got, int n, const char *model,
                           const char *assistant, int k, int tp, int off, double *tokens,
                           double *accepted) {
  struct srv s;
  TH_REQUIRE(srv_start_off(&s, model, assistant, k, tp, off) == 0);
  th_http_run_jobs(got, n, s.port);
  int idle;
  char *m = wait_idle(&s, &idle);
  TH_CHECK(idle); /* every KV block is back */
  char what[32];
  snprintf(what, sizeof(what), "K=%d, tp %d", k, tp);
  th_jobs_check_same(ref, got, n, what);
  double drafts;
  check_spec_metrics(m, k, off > 0, &drafts, accepted);
  *tokens = th_metric(m, "lmserve:spec_decode_num_draft_tokens_total", NULL);
  free(m);
  srv_stop(&s);
}

static void check_spec_run(const struct th_job *ref, struct th_job *got, int n, const char *model,
                           const char *assistant, int k, int tp, double *tokens, double *accepted) {
  check_spec_off(ref, got, n, model, assistant, k, tp, 0, tokens, accepted);
}

TH_TEST(spec_greedy_equals_plain_through_serve) {
  th_proc_init(1500);
  char model[300], assistant[300];
  make_pair(model, "m", (char *[]){"--echo-leak", "0.25", NULL}, assistant, "a");
  static struct th_job ref[NREQ], got[NREQ];
  build_jobs(ref, NREQ);
  build_jobs(got, NREQ);

  /* the reference: speculation off */
  struct srv s;
  TH_REQUIRE(srv_start(&s, model, NULL, 0) == 0);
  th_http_run_jobs(ref, NREQ, s.port);
  int idle;
  char *m = wait_idle(&s, &idle);
  TH_CHECK(idle);
  TH_CHECK(th_metric(m, "lmserve:spec_decode_num_drafts_total", NULL) == 0);
  free(m);
  srv_stop(&s);
  th_jobs_check_answered(ref, NREQ);

  /* K, and speculation off while that many requests or more run (the steps between
   * then follow one another as plain ones do, and drafting starts and stops) */
  static const int ks[][2] = {{1, 0}, {3, 0}, {5, 0}, {3, 6}};
  double accepted_any = 0, rejected_any = 0;
  for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++) {
    double tokens, accepted;
    check_spec_off(ref, got, NREQ, model, assistant, ks[ki][0], 0, ks[ki][1], &tokens, &accepted);
    accepted_any += accepted;
    rejected_any += tokens - accepted;
  }
  /* the pair accepts some drafts and rejects others */
  TH_CHECK(accepted_any > 0);
  TH_CHECK(rejected_any > 0);
  th_http_jobs_free(ref, NREQ);
  th_http_jobs_free(got, NREQ);
}

TH_TEST(spec_agreeing_assistant_is_accepted) {
  th_proc_init(600);
  char model[300], assistant[300];
  make_pair(model, "e", (char *[]){NULL}, assistant, "ea");
  enum { N = 4, MAXTOK = AGREE_TOKENS, K = 3 };
  static struct th_job jobs[NREQ];
  build_jobs(jobs, N);
  for (int i = 0; i < N; i++) { /* a fixed length, past any end-of-sequence id */
    char *tail = strstr(jobs[i].body, "\"max_tokens\"");
    snprintf(tail, sizeof(jobs[i].body) - (size_t)(tail - jobs[i].body),
             "\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true}", MAXTOK);
  }
  struct srv s;
  TH_REQUIRE(srv_start(&s, model, assistant, K) == 0);
  th_http_run_jobs(jobs, N, s.port);
  int idle;
  char *m = wait_idle(&s, &idle);
  TH_CHECK(idle);
  for (int i = 0; i < N; i++) {
    TH_CHECK_EQ_INT(jobs[i].status, 200);
    char want[48];
    snprintf(want, sizeof(want), "\"completion_tokens\":%d", MAXTOK);
    TH_CHECK(jobs[i].answer && strstr(jobs[i].answer, want));
    free(jobs[i].answer);
  }
  double drafts, accepted;
  check_spec_metrics(m, K, 0, &drafts, &accepted);
  double tokens = th_metric(m, "lmserve:spec_decode_num_draft_tokens_total", NULL);
  /* acceptance about K: all drafts taken (a draft slot cut short near
   * max_tokens is not proposed at all) */
  TH_CHECK(accepted >= 0.95 * tokens);
  TH_CHECK(1 + accepted / drafts >= 1 + 0.9 * K);
  /* fewer target steps: after the prefill's token, one step per K + 1
   * tokens instead of one per token */
  int plain_steps = N * (MAXTOK - 1), spec_bound = N * ((MAXTOK - 1 + K) / (K + 1) + 1);
  fprintf(stderr, "%.0f target decode steps with drafts (plain decoding: %d)\n", drafts,
          plain_steps);
  TH_CHECK(drafts <= spec_bound);
  TH_CHECK(drafts < plain_steps / 2);
  /* every position of the draft accepted (nearly) every time it was drafted:
   * position 0 in every draft, later ones in all but each request's last
   * draft, which max_tokens may cut short */
  for (int pos = 0; pos < K; pos++) {
    char label[32];
    snprintf(label, sizeof(label), "position=\"%d\"", pos);
    double v = th_metric(m, "lmserve:spec_decode_num_accepted_tokens_per_pos_total", label);
    TH_CHECK(v >= 0.9 * (pos == 0 ? drafts : drafts - N));
  }
  free(m);
  srv_stop(&s);
}

/* ---- n-gram drafts ------------------------------------------------------------------ */

/* The jobs without their logprobs. */
static void drop_logprobs(struct th_job *jobs, int n) {
  static const char lp[] = "\"logprobs\":0,";
  for (int i = 0; i < n; i++) {
    char *at = strstr(jobs[i].body, lp);
    if (at) memmove(at, at + sizeof(lp) - 1, strlen(at + sizeof(lp) - 1) + 1);
  }
}

/* A random Gemma 3 model's greedy text soon repeats itself, which n-gram drafts
 * (--speculative-model ngram) look up: its answers with them are the answers without,
 * token for token, on one rank and on two, with structured outputs and bad words among
 * the requests; some drafts are accepted and some rejected. */
TH_TEST(spec_ngram_equals_plain_through_serve) {
  th_proc_init(1500);
  char model[300];
  TH_REQUIRE(make_tmp() == 0);
  TH_REQUIRE(make_model(model, "g3", (char *[]){"--arch", "gemma3", NULL}) == 0);
  char tokpath[400];
  snprintf(tokpath, sizeof(tokpath), "%s/tokenizer.json", model);
  if (access(tokpath, R_OK) != 0) TH_SKIP("no Gemma tokenizer in the tiny model (run tools/setup)");
  static struct th_job ref[NREQ], got[NREQ];
  /* against the answers without drafts on as many ranks; on two, tokens only (a step
   * whose drafts are verified on the host takes its rows' logprobs from the gathered
   * logits, which sum in another order than the ranks' merged ones: the last digit
   * moves) */
  /* ranks, K, speculation off at that many running requests (0: never) */
  static const int runs[][3] = {{0, 3, 0}, {0, 5, 0}, {0, 3, 6}, {2, 3, 0}};
  double accepted_any = 0, rejected_any = 0;
  for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
    if (i == 0 || runs[i][0] != runs[i - 1][0]) {
      if (i) th_http_jobs_free(ref, NREQ);
      build_jobs(ref, NREQ);
      if (runs[i][0] > 1) drop_logprobs(ref, NREQ);
      struct srv s;
      TH_REQUIRE(srv_start_tp(&s, model, NULL, 0, runs[i][0]) == 0);
      th_http_run_jobs(ref, NREQ, s.port);
      srv_stop(&s);
      th_jobs_check_answered(ref, NREQ);
    }
    build_jobs(got, NREQ);
    if (runs[i][0] > 1) drop_logprobs(got, NREQ);
    double tokens, accepted;
    check_spec_off(ref, got, NREQ, model, "ngram", runs[i][1], runs[i][0], runs[i][2], &tokens,
                   &accepted);
    accepted_any += accepted;
    rejected_any += tokens - accepted;
    th_http_jobs_free(got, NREQ);
  }
  TH_CHECK(accepted_any > 0);
  TH_CHECK(rejected_any > 0);
  th_http_jobs_free(ref, NREQ);

  /* sampled requests with seeds (a temperature at which the random model still repeats
   * itself, and not always): the draw at a position is the draw without drafts */
  uint32_t x = 99;
  for (int i = 0; i < 8; i++) {
    th_job_make(&ref[i], 20 + 11 * i, &x,
                "\"max_tokens\":%d,\"temperature\":0.05,\"top_p\":0.95,\"seed\":%d,"
                "\"logprobs\":1,\"stream\":false",
                GEN_MIN + GEN_SPAN, 1000 + i);
    memcpy(&got[i], &ref[i], sizeof(got[i]));
  }
  struct srv s;
  TH_REQUIRE(srv_start(&s, model, NULL, 0) == 0);
  th_http_run_jobs(ref, 8, s.port);
  srv_stop(&s);
  th_jobs_check_answered(ref, 8);
  double tokens, accepted;
  check_spec_run(ref, got, 8, model, "ngram", 3, 0, &tokens, &accepted);
  th_http_jobs_free(ref, 8);
  th_http_jobs_free(got, 8);
}

/* The spec_decode_* counters and the prefix cache's hits, once the server is idle. */
static void ngram_counts(struct srv *s, double *v) {
  int idle;
  char *m = wait_idle(s, &idle);
  TH_CHECK(idle);
  v[0] = th_metric(m, "lmserve:spec_decode_num_drafts_total", NULL);
  v[1] = th_metric(m, "lmserve:spec_decode_num_draft_tokens_total", NULL);
  v[2] = th_metric(m, "lmserve:spec_decode_num_accepted_tokens_total", NULL);
  v[3] = th_metric(m, "lmserve:prefix_cache_hits_total", NULL);
  free(m);
}

/* A prompt the prefix cache holds runs only its tail, and the workers look drafts up
 * in the tokens before it too (the scheduler sends them with the sequence's first
 * step): the same requests one after another, twice, draft and accept exactly as
 * often the second time, when every prompt but its last block comes from the cache. */
TH_TEST(spec_ngram_drafts_see_cached_prompts) {
  th_proc_init(600);
  char model[300];
  TH_REQUIRE(make_tmp() == 0);
  TH_REQUIRE(make_model(model, "g3c", (char *[]){"--arch", "gemma3", NULL}) == 0);
  enum { N = 4 };
  static struct th_job jobs[2][N];
  struct srv s; /* the flags as vLLM's JSON this time */
  s.port = th_serve_start(&s.p, model,
                          (char *[]){"--speculative-config",
                                     "{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                                     "\"prompt_lookup_min\": 1, \"prompt_lookup_max\": 3}",
                                     NULL});
  TH_REQUIRE(s.port > 0);
  double v[3][4];
  ngram_counts(&s, v[0]);
  for (int run = 0; run < 2; run++) {
    uint32_t x = 4242;
    for (int i = 0; i < N; i++) { /* prompts of 40 .. 100 ids, one request at a time */
      th_job_make(&jobs[run][i], 40 + 20 * i, &x,
                  "\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true", GEN_MIN + GEN_SPAN);
      th_http_run_jobs(&jobs[run][i], 1, s.port);
    }
    ngram_counts(&s, v[run + 1]);
  }
  th_jobs_check_same(jobs[0], jobs[1], N, "the cached prompts");
  double first[3], second[3];
  for (int j = 0; j < 3; j++) {
    first[j] = v[1][j] - v[0][j];
    second[j] = v[2][j] - v[1][j];
  }
  fprintf(stderr, "n-gram: %.0f/%.0f drafts, %.0f/%.0f tokens, %.0f/%.0f accepted; %.0f cached\n",
          first[0], second[0], first[1], second[1], first[2], second[2], v[2][3] - v[1][3]);
  TH_CHECK(v[2][3] - v[1][3] >= 32 * N); /* the second run's prompts came from the cache */
  TH_CHECK(first[1] > 0);
  TH_CHECK_NEAR(second[0], first[0], 0);
  TH_CHECK_NEAR(second[1], first[1], 0);
  TH_CHECK_NEAR(second[2], first[2], 0);
  th_http_jobs_free(jobs[0], N);
  th_http_jobs_free(jobs[1], N);
  srv_stop(&s);
}

/* ---- structured outputs --------------------------------------------------------- */

static const char *const k_constraints[] = {
    "\"structured_outputs\":{\"regex\":\"[a-z]{2,6}( [a-z]{2,6}){0,9}\\\\.\"}",
    "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"schema\":"
    "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"},\"s\":{\"type\":"
    "\"string\",\"maxLength\":12},\"l\":{\"type\":\"array\",\"items\":{\"enum\":[1,2,3]},"
    "\"maxItems\":6}},\"required\":[\"n\",\"s\",\"l\"],\"additionalProperties\":false}}}",
    "\"guided_choice\":[\"north by north west\",\"south\",\"east of eden\",\"west\"]",
    "\"response_format\":{\"type\":\"json_object\"}",
};
#define NCONS 4

/* Request i of n: a prompt of 3 .. 120 ids, constraint i % NCONS, greedy (no
 * logprobs: two ranks sum in another order, so only the tokens are compared). */
static void build_structured(struct th_job *jobs, int n) {
  uint32_t x = 777;
  for (int i = 0; i < n; i++) {
    int len = 3 + (i * 29) % 118;
    th_job_make(&jobs[i], len, &x, "\"max_tokens\":%d,\"temperature\":0,\"stream\":false,%s",
                AGREE_TOKENS, k_constraints[i % NCONS]);
  }
}

/* Structured outputs under speculation: each constrained row's drafts are
 * proposed within its mask (its matcher followed ahead on a copy) and each
 * verified row is masked by the state after the drafts before it. Greedy
 * answers equal those without speculation, on one rank and on two; and with
 * an assistant that agrees with its target the drafts are accepted, which
 * they could not be were they drawn outside the masks (the echo target's
 * unconstrained tokens are not text a grammar allows). */
TH_TEST(spec_structured_outputs_draft_within_their_masks) {
  th_proc_init(1500);
  char model[300], assistant[300];
  make_pair(model, "so", (char *[]){NULL}, assistant, "soa");
  enum { N = 8, K = 3 };
  static struct th_job ref[N], got[N];
  build_structured(ref, N);
  struct srv s;
  TH_REQUIRE(srv_start(&s, model, NULL, 0) == 0);
  th_http_run_jobs(ref, N, s.port);
  srv_stop(&s);
  th_jobs_check_answered(ref, N);
  for (int tp = 0; tp <= 2; tp += 2) {
    build_structured(got, N);
    double tokens, accepted;
    check_spec_run(ref, got, N, model, assistant, K, tp, &tokens, &accepted);
    TH_CHECK(accepted >= 0.8 * tokens);
    th_http_jobs_free(got, N);
  }
  th_http_jobs_free(ref, N);
}
