/* test-async.c — async scheduling (the scheduler plans step N+1 while the
 * workers run step N, and a decode runs the token its previous step sampled)
 * through `lmserve serve`, driven over HTTP: the answers are those of
 * synchronous scheduling, token for token (text, logprobs, finish reason,
 * usage), for concurrent requests that mix greedy and seeded sampling,
 * penalties, stop strings, end-of-sequence and max_tokens of 1 and 2 — on
 * one rank, with a KV pool small enough to preempt, with tensor parallelism
 * 2, and with MTP drafts; and so are they when the workers pipeline their
 * steps (LMSERVE_PIPELINE=1: a step's forward launched before the previous step is
 * answered, taking that step's tokens from the backend), which they must be seen to
 * do; streams cut mid-answer leave no request running and no KV block held. */
#include <ctype.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness/th-http.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

struct srv {
  struct th_proc p;
  int port;
};

/* lmserve serve on model, one thread a worker, with extra flags (NULL-terminated,
 * at most 7) and env entries (NULL-terminated, or NULL). */
static int srv_start(struct srv *s, const char *model, char *const *extra, char *const *env) {
  char *flags[10] = {"--threads", "1"};
  for (int i = 0; extra && extra[i] && i < 7; i++)
    flags[2 + i] = extra[i];
  s->port = th_serve_start_env(&s->p, model, env, flags);
  return s->port > 0 ? 0 : -1;
}

/* Stops the server; with pipelined not NULL, first reads what it says as it ends
 * and sums the workers' closing counts ("rank R: N steps pipelined") into it. */
static void srv_stop_counting(struct srv *s, long *pipelined) {
  if (pipelined) {
    th_proc_signal(&s->p, SIGTERM);
    size_t len = 0;
    char *said = th_read_all(s->p.err_fd, 30000, &len);
    *pipelined = 0;
    for (const char *at = said; at && (at = strstr(at, " steps pipelined")); at++) {
      const char *n = at;
      while (n > said && isdigit((unsigned char)n[-1]))
        n--;
      *pipelined += strtol(n, NULL, 10);
    }
    free(said);
  }
  th_proc_stop(&s->p, 20000);
}

static void srv_stop(struct srv *s) {
  srv_stop_counting(s, NULL);
}

/* The workers' environment for pipelined steps on the CPU (off there by default). */
#define PIPELINED                                                                                  \
  { "LMSERVE_PIPELINE=1", NULL }

/* Waits (up to 30 s) for no running or waiting request and an empty KV pool. */
static int wait_idle(struct srv *s) {
  for (int i = 0; i < 60; i++) {
    char *m = NULL;
    int ok = th_http(s->port, "GET", "/metrics", NULL, 60000, &m) == 200 &&
             th_metric(m, "lmserve:num_requests_running", NULL) == 0 &&
             th_metric(m, "lmserve:num_requests_waiting", NULL) == 0 &&
             th_metric(m, "lmserve:kv_cache_usage_perc", NULL) == 0;
    free(m);
    if (ok) return 1;
    usleep(500000);
  }
  return 0;
}

/* ---- the requests ------------------------------------------------------------- */

#define NREQ 16
#ifdef __SANITIZE_ADDRESS__
#define GEN 6 /* the sanitizer tree's kernels are ~20 times slower */
#else
#define GEN 20
#endif

/* 1: requests without penalties (kinds 2 and 4 seeded, 5 greedy), so that every decode
 * may run pipelined (a sequence with penalties waits for its counts) */
static int no_penalties;

/* Request i: a prompt of 4 .. 90 ids and one of the kinds below. */
static void build_jobs(struct th_job *jobs, int n) {
  uint32_t x = 777;
  for (int i = 0; i < n; i++) {
    int len = 4 + (i * 29) % 87;
    const char *kind;
    switch (i % 6) {
    case 0: kind = "\"temperature\":0,\"logprobs\":2"; break;
    case 1: kind = "\"temperature\":0.9,\"top_p\":0.9,\"seed\":11,\"logprobs\":0"; break;
    case 2:
      kind = "\"temperature\":0.7,\"top_k\":40,\"presence_penalty\":0.5,"
             "\"frequency_penalty\":0.3,\"seed\":5";
      break;
    case 3: kind = "\"temperature\":0,\"stop\":[\"e\",\"a \"]"; break;
    case 4: kind = "\"temperature\":1.0,\"repetition_penalty\":1.2,\"seed\":3"; break;
    default: kind = "\"temperature\":0,\"ignore_eos\":true"; break;
    }
    if (no_penalties && (i % 6 == 2 || i % 6 == 4))
      kind = i % 6 == 2 ? "\"temperature\":0.8,\"top_k\":20,\"seed\":5,\"logprobs\":3"
                        : "\"temperature\":0,\"ignore_eos\":true,\"logprobs\":1";
    int max_tokens = i == 4 ? 1 : i == 9 ? 2 : GEN - (i % 5);
    th_job_make(&jobs[i], len, &x, "\"max_tokens\":%d,%s,\"stream\":false", max_tokens, kind);
  }
}

/* One configuration of serve: its flags (up to a NULL), what the run is called, the
 * environment it adds (up to a NULL) and, with LMSERVE_PIPELINE=1, whether its workers
 * must say they pipelined some steps (one rank, no drafts: where they can). */
struct run {
  char *flags[8];
  const char *what;
  char *env[3];
  int must_pipeline;
};

/* Runs the jobs against a server started as run says; its answers in jobs. */
static void answers(struct th_job *jobs, const char *model, const struct run *run) {
  struct srv s;
  long pipelined = 0;
  TH_REQUIRE(srv_start(&s, model, run->flags, run->env) == 0);
  th_http_run_jobs(jobs, NREQ, s.port);
  TH_CHECK(wait_idle(&s));
  srv_stop_counting(&s, run->must_pipeline ? &pipelined : NULL);
  th_jobs_check_answered(jobs, NREQ);
  if (run->must_pipeline && pipelined <= 0)
    th_fail(__FILE__, __LINE__, "%s: the workers pipelined no step", run->what);
}

/* Serve's answers to the requests on `model` under each of runs[0..n): those of runs
 * 1.. must be those of run 0. */
static void answers_equal_on(const char *model, const struct run *runs, int n) {
  static struct th_job want[NREQ], got[NREQ];
  build_jobs(want, NREQ);
  build_jobs(got, NREQ);
  answers(want, model, &runs[0]);
  for (int i = 1; i < n; i++) {
    answers(got, model, &runs[i]);
    th_jobs_check_same(want, got, NREQ, runs[i].what);
  }
  th_http_jobs_free(want, NREQ);
  th_http_jobs_free(got, NREQ);
}

/* answers_equal_on the tiny model `name` (seed). */
static void answers_equal(const char *name, int seed, const struct run *runs, int n) {
  char model[320];
  th_tiny_gemma4_or_skip(name, seed, model, sizeof(model));
  answers_equal_on(model, runs, n);
}

/* Synchronous steps against asynchronous ones on the tiny model `name` (seed): plain,
 * with a pool of a few requests' worth (50 pages of 16 tokens in two groups: requests
 * wait and running ones are preempted, the scheduler's closing log line counts 4), and
 * both with the workers' steps pipelined (with must, the workers must say they did
 * some: where no sequence's penalties hold every step back). */
static void sync_async_equal(const char *name, int seed, int must) {
  const struct run runs[] = {
      {{"--no-async-scheduling"}, "sync"},
      {{"--async-scheduling"}, "async"},
      {{"--kv-cache-memory", "600K", "--max-num-seqs", "16"}, "async, small KV pool"},
      {{"--async-scheduling"}, "async, pipelined worker steps", PIPELINED, must},
      {{"--kv-cache-memory", "600K", "--max-num-seqs", "16"},
       "async, small KV pool, pipelined worker steps",
       PIPELINED,
       must},
  };
  answers_equal(name, seed, runs, 5);
}

TH_TEST(async_answers_equal_sync) {
  th_proc_init(1500);
  sync_async_equal("async", 3, 0);
}

/* Requests whose every decode may run pipelined (no penalties): the workers launch step
 * N + 1 before they answer step N, its tokens taken from step N's sampled ids on the
 * backend, for many steps of many sequences, and the answers stay those of synchronous
 * steps. */
TH_TEST(async_pipelined_steps_equal_sync) {
  th_proc_init(1500);
  no_penalties = 1;
  sync_async_equal("async-pipe", 6, 1);
}

TH_TEST(async_tensor_parallel_2_equals_sync) {
  th_proc_init(1500);
  const struct run runs[] = {
      {{"--tensor-parallel-size", "2", "--no-async-scheduling"}, "sync, tensor parallel 2"},
      {{"--tensor-parallel-size", "2"}, "async, tensor parallel 2"},
      /* the ranks' ids meet on the host: the workers run each step whole */
      {{"--tensor-parallel-size", "2"}, "async, tensor parallel 2, pipelining asked", PIPELINED},
  };
  answers_equal("async-tp", 4, runs, 3);
}

/* An echo target whose logits leak a quarter of another token's (make-tiny-model --echo
 * --echo-leak 0.25: it says its context's tokens again) in th_tmpdir(name), its path in
 * model [320] (the folder in dir [256]). Skips the test without a Gemma tokenizer. */
static void echo_model(const char *name, char *dir, char *model) {
  char tok[400];
  TH_REQUIRE(th_tmpdir(name, dir, 256) == 0);
  snprintf(model, 320, "%s/m", dir);
  struct th_out o = {0};
  TH_REQUIRE(th_lmserve(&o, 120000, "make-tiny-model", "--arch", "gemma4", "--echo", "--echo-leak",
                        "0.25", "--out", model, NULL) == 0);
  th_out_free(&o);
  snprintf(tok, sizeof(tok), "%s/tokenizer.json", model);
  if (access(tok, R_OK) != 0) TH_SKIP("no Gemma tokenizer in the tiny model (run tools/setup)");
}

/* echo_model and an assistant that drafts what the echo would say: some drafts are
 * accepted and some rejected, so steps accept every number of them. Their paths in
 * model and assistant [320]. */
static void mtp_pair(char *model, char *assistant) {
  char tmp[256];
  echo_model("async-mtp", tmp, model);
  snprintf(assistant, 320, "%s/a", tmp);
  struct th_out o = {0};
  TH_REQUIRE(th_lmserve(&o, 120000, "make-tiny-model", "--arch", "gemma4-assistant", "--agree",
                        "--target", model, "--out", assistant, NULL) == 0);
  th_out_free(&o);
}

/* Speculative decoding with the MTP assistant: a step planned behind one that verifies
 * drafts runs after the drafts it accepted, which only the workers know, and verifies
 * the drafts it proposed. The answers, seeded ones too, are those of synchronous steps
 * without speculation (a verified row's token is the draw plain sampling makes there)
 * and of synchronous ones with it — on one rank, with a pool that preempts, and with
 * tensor parallelism 2. */
TH_TEST(async_mtp_drafts_equal_sync) {
  th_proc_init(1800);
  char model[320], assistant[320];
  mtp_pair(model, assistant);
  const struct run runs[] = {
      {{"--no-async-scheduling"}, "sync, no speculation"},
      {{"--speculative-model", assistant, "--num-speculative-tokens", "3", "--no-async-scheduling"},
       "sync, MTP K=3"},
      {{"--speculative-model", assistant, "--num-speculative-tokens", "3"}, "async, MTP K=3"},
      {{"--speculative-model", assistant, "--num-speculative-tokens", "3", "--kv-cache-memory",
        "600K"},
       "async, MTP K=3, small KV pool"},
      /* drafts need the verify result: the workers run each step whole */
      {{"--speculative-model", assistant, "--num-speculative-tokens", "3"},
       "async, MTP K=3, pipelining asked",
       PIPELINED},
  };
  answers_equal_on(model, runs, 4);
  const struct run tp[] = {
      {{"--tensor-parallel-size", "2", "--no-async-scheduling"},
       "sync, no speculation, tensor parallel 2"},
      {{"--speculative-model", assistant, "--num-speculative-tokens", "3", "--tensor-parallel-size",
        "2"},
       "async, MTP K=3, tensor parallel 2"},
  };
  answers_equal_on(model, tp, 2);
}

/* Speculation off while two requests or more run (--speculative-disable-by-batch-size):
 * those steps propose no drafts, and the workers launch each behind the open one as
 * plain steps go (they must say they pipelined some), while drafting starts again as
 * the last requests end. Requests without penalties, so that nothing else holds the
 * steps back; the answers are those of synchronous steps without speculation. */
TH_TEST(async_mtp_off_above_batch_size_pipelines) {
  th_proc_init(1200);
  char model[320], assistant[320];
  mtp_pair(model, assistant);
  no_penalties = 1;
  const struct run runs[] = {
      {{"--no-async-scheduling"}, "sync, no speculation"},
      {{"--speculative-model", assistant, "--num-speculative-tokens", "3",
        "--speculative-disable-by-batch-size", "2"},
       "async, MTP K=3 off at 2 running, pipelined worker steps",
       PIPELINED,
       1},
  };
  answers_equal_on(model, runs, 2);
  no_penalties = 0;
}

/* Penalties count every token before the one sampled, also those a step does not run:
 * prompt tokens the prefix cache holds, and a preempted request's generated tokens,
 * which it runs again as a prefill (or finds cached). Requests sharing a long prompt
 * prefix, greedy under repetition, presence and frequency penalties (so that every
 * earlier token can move the argmax), sent one after another so that each later one
 * finds the earlier ones' blocks, answer as with prefix caching off; and so do they
 * all at once in a pool small enough to preempt. */
TH_TEST(penalties_count_cached_and_recomputed_tokens) {
  th_proc_init(900);
  char dir[256], model[320];
  echo_model("async-pen", dir, model); /* it repeats tokens: the penalties move it off them */
  enum { N = 8 };
  static struct th_job want[N], got[N];
  for (int pass = 0; pass < 3; pass++) {
    struct th_job *jobs = pass ? got : want;
    th_http_jobs_free(jobs, N); /* the answers of the pass before */
    for (int i = 0; i < N; i++) {
      uint32_t x = 4242; /* every prompt begins with the same tokens */
      th_job_make(&jobs[i], 40 + 13 * i, &x,
                  "\"max_tokens\":60,\"temperature\":0,%s,\"stream\":false",
                  i % 4 ? "\"presence_penalty\":0.8,\"frequency_penalty\":0.5"
                        : "\"repetition_penalty\":1.4");
    }
    struct srv s;
    char *const off[] = {"--no-enable-prefix-caching", NULL};
    char *const tiny[] = {"--kv-cache-memory", "220K", "--max-num-seqs", "8", NULL};
    TH_REQUIRE(srv_start(&s, model, pass == 0 ? off : pass == 1 ? NULL : tiny, NULL) == 0);
    if (pass < 2)
      for (int i = 0; i < N; i++)
        th_http_run_jobs(&jobs[i], 1, s.port);
    else
      th_http_run_jobs(jobs, N, s.port);
    TH_CHECK(wait_idle(&s));
    if (pass) { /* the prefix cache did find the earlier prompts; how often the small pool
                 * preempted depends on how the requests overlap (17-22 times in a plain
                 * build on 2 cores, fewer in the sanitizer tree's slower steps) */
      char *m = NULL;
      TH_CHECK_EQ_INT(th_http(s.port, "GET", "/metrics", NULL, 60000, &m), 200);
      double hits = th_metric(m, "lmserve:prefix_cache_hits_total", NULL);
      double pre = th_metric(m, "lmserve:num_preemptions_total", NULL);
      fprintf(stderr, "pass %d: %.0f prefix-cache hits, %.0f preemptions\n", pass, hits, pre);
      if (pass == 1) TH_CHECK(hits > 100);
      free(m);
    }
    srv_stop(&s);
    th_jobs_check_answered(jobs, N);
    if (pass) th_jobs_check_same(want, got, N, pass == 1 ? "prefix cache" : "small KV pool");
  }
  th_http_jobs_free(want, N);
  th_http_jobs_free(got, N);
}

/* Streams cut after their first events: their requests are aborted while steps
 * that hold them are in flight; nothing stays running or held, and the server
 * answers the next request. */
TH_TEST(async_streams_cut_mid_answer) {
  th_proc_init(600);
  char model[320];
  th_tiny_gemma4_or_skip("async-cut", 5, model, sizeof model);
  struct srv s;
  TH_REQUIRE(srv_start(&s, model, (char *[]){NULL}, NULL) == 0);
  for (int i = 0; i < 6; i++) {
    int fd = th_http_post_open(s.port, "/v1/completions",
                               "{\"prompt\":\"the cut stream\",\"max_tokens\":200,\"ignore_eos\":"
                               "true,\"temperature\":0,\"stream\":true}");
    char buf[512];
    ssize_t got = 0;
    for (int k = 0; k < 1 + i % 3 && got >= 0; k++) /* a few reads: some tokens came */
      got = read(fd, buf, sizeof buf);
    close(fd);
  }
  TH_CHECK(wait_idle(&s));
  char *b = NULL;
  TH_CHECK_EQ_INT(th_http(s.port, "POST", "/v1/completions",
                          "{\"prompt\":\"after\",\"max_tokens\":3,\"temperature\":0}", 60000, &b),
                  200);
  free(b);
  srv_stop(&s);
}
