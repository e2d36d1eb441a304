/* test-worker-sched.c — `lmserve scheduler` and `lmserve worker` as real
 * processes on a tiny model, driven by a fake frontend (a DEALER speaking
 * ADD / PING): greedy completions equal `lmserve generate` with small step
 * budgets (chunked prefill, mixed batches, prefix-cache hits), seeded
 * sampling is repeatable alone and batched, and speculative decoding with
 * the MTP assistant keeps greedy output unchanged. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "common/cm-err.h"
#include "common/cm-time.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/wk-test-sched.h"

#define NREQ 4
#define NGEN 12

struct req {
  uint64_t id;
  uint32_t prompt[40];
  int n_prompt;
  int64_t seed; /* -1 greedy */
  uint32_t out[NGEN + 8];
  int n_out;
  int logprobs; /* -1 none */
  int lp_ok;    /* OUT entries whose logprobs matched their tokens */
  int lp_bad;
  int finish;
  int err;
};

struct env {
  struct wts w; /* model paths and the temp dir */
  char front[600], work[600];
  struct th_proc sched, worker;
  void *ctx;
  struct pr_sock *sock;
  struct cm_arena arena;
};

static int env_start(struct env *e, const char *name, int spec) {
  memset(e, 0, sizeof(*e));
  if (wts_model(&e->w, "gemma4", name)) return -1;
  char assistant[500];
  if (spec && wts_assistant(&e->w, assistant, sizeof(assistant))) return -1;
  snprintf(e->front, sizeof(e->front), "%s-front.sock", e->w.endpoint);
  snprintf(e->work, sizeof(e->work), "%s-work.sock", e->w.endpoint);
  if (th_proc_spawnl(&e->sched, NULL, 0, NULL, th_lmserve_bin(), "scheduler", "--model", e->w.model,
                     "--frontend-endpoint", e->front, "--worker-endpoint", e->work,
                     "--max-num-seqs", "4", "--max-num-batched-tokens", "16",
                     "--num-speculative-tokens", spec ? "3" : "0", NULL))
    return -1;
  char *drafts[] = {"--speculative-model", assistant, "--num-speculative-tokens", "3", NULL};
  if (th_proc_spawnl(&e->worker, NULL, 0, spec ? drafts : NULL, th_lmserve_bin(), "worker",
                     "--model", e->w.model, "--scheduler", e->work, "--kv-cache-memory", "4M",
                     "--max-num-batched-tokens", "16", "--max-num-seqs", "4", "--threads", "1",
                     NULL))
    return -1;
  cm_arena_init(&e->arena, 1u << 16, 64u << 20);
  if (!(e->ctx = zmq_ctx_new())) return -1;
  if (pr_sock_open(e->ctx, ZMQ_DEALER, 0, &e->sock) || pr_sock_connect(e->sock, e->front) ||
      pr_sock_set_timeouts(e->sock, 200, 5000))
    return -1;
  /* wait until the scheduler reports the worker ready */
  uint64_t end = cm_time_ns() + 60000000000ull;
  while (cm_time_ns() < end) {
    struct pr_msg m;
    pr_msg_init(&m, PR_PING);
    m.u.ping.nonce = 1;
    if (pr_sock_send(e->sock, NULL, &m, 0)) return -1;
    cm_arena_reset(&e->arena);
    if (pr_sock_recv(e->sock, NULL, &m, &e->arena, 0) == 0 && m.type == PR_PONG &&
        m.u.pong.workers_ready == 1)
      return 0;
  }
  return -1;
}

static void env_stop(struct env *e) {
  th_proc_stop(&e->sched, 5000);
  th_proc_stop(&e->worker, 5000);
  pr_sock_close(e->sock);
  if (e->ctx) zmq_ctx_term(e->ctx);
  cm_arena_free(&e->arena);
}

static void req_init(struct req *r, uint64_t id, int n_prompt, uint32_t salt, int64_t seed) {
  memset(r, 0, sizeof(*r));
  r->id = id;
  r->n_prompt = n_prompt;
  r->seed = seed;
  r->logprobs = -1;
  r->prompt[0] = 2;
  for (int i = 1; i < n_prompt; i++)
    r->prompt[i] = (uint32_t)((salt * 7919u + (uint32_t)i * 104729u) % 200000u) + 10;
}

static int send_add(struct env *e, const struct req *r) {
  struct pr_msg m;
  pr_msg_init(&m, PR_ADD);
  m.u.add.request_id = r->id;
  m.u.add.prompt.v = r->prompt;
  m.u.add.prompt.n = (uint32_t)r->n_prompt;
  m.u.add.max_tokens = NGEN;
  m.u.add.sampling.ignore_eos = true;
  m.u.add.sampling.temperature = r->seed >= 0 ? 1.0f : 0.0f;
  m.u.add.sampling.has_seed = r->seed >= 0;
  m.u.add.sampling.seed = r->seed >= 0 ? (uint64_t)r->seed : 0;
  m.u.add.sampling.logprobs = r->logprobs;
  m.u.add.arrival_ns = cm_time_wall_ns();
  return pr_sock_send(e->sock, NULL, &m, 0);
}

/* Sends the requests and collects OUT / ERR until each finished. 0 or -1. */
static int run_reqs(struct env *e, struct req *rs, int n) {
  for (int i = 0; i < n; i++)
    if (send_add(e, &rs[i])) return -1;
  int left = n;
  uint64_t end = cm_time_ns() + 60000000000ull;
  while (left && cm_time_ns() < end) {
    struct pr_msg m;
    cm_arena_reset(&e->arena);
    if (pr_sock_recv(e->sock, NULL, &m, &e->arena, 0)) continue;
    if (m.type == PR_ERR) {
      fprintf(stderr, "ERR %llu: %s\n", (unsigned long long)m.u.err.request_id, m.u.err.message);
      for (int i = 0; i < n; i++)
        if (rs[i].id == m.u.err.request_id && !rs[i].finish && !rs[i].err) {
          rs[i].err = m.u.err.code;
          left--;
        }
      continue;
    }
    if (m.type != PR_OUT) continue;
    for (uint32_t j = 0; j < m.u.out.n_seqs; j++) {
      const struct pr_out_seq *o = &m.u.out.seqs[j];
      for (int i = 0; i < n; i++) {
        struct req *r = &rs[i];
        if (r->id != o->request_id || r->finish || r->err) continue;
        for (uint32_t t = 0; t < o->tokens.n && r->n_out < NGEN + 8; t++)
          r->out[r->n_out++] = o->tokens.v[t];
        if (r->logprobs >= 0 && o->tokens.n) {
          /* greedy: the sampled token is the best of the raw distribution */
          const struct pr_logprobs *l = &o->logprobs;
          int ok = l->sampled.n == o->tokens.n && l->n_top == (uint32_t)r->logprobs;
          for (uint32_t t = 0; ok && t < o->tokens.n; t++)
            ok = l->sampled.v[t] <= 0 && l->top_ids.v[t * l->n_top] == o->tokens.v[t] &&
                 l->top.v[t * l->n_top] == l->sampled.v[t];
          if (ok)
            r->lp_ok++;
          else
            r->lp_bad++;
        }
        if (o->finish) {
          r->finish = o->finish;
          left--;
        }
      }
    }
  }
  return left ? -1 : 0;
}

static void check_same(const struct req *r, const uint32_t *ref, int n) {
  TH_CHECK_EQ_INT(r->err, 0);
  TH_CHECK_EQ_INT(r->finish, PR_FINISH_LENGTH);
  TH_CHECK_EQ_INT(r->n_out, n);
  for (int i = 0; i < n && i < r->n_out; i++)
    if (r->out[i] != ref[i]) {
      th_fail(__FILE__, __LINE__, "request %llu token %d: %u != %u", (unsigned long long)r->id, i,
              r->out[i], ref[i]);
      return;
    }
}

static void greedy_case(int spec) {
  th_proc_init(150);
  struct env e;
  TH_REQUIRE(env_start(&e, spec ? "ws-spec" : "ws", spec) == 0);
  struct req rs[NREQ];
  static const int lens[NREQ] = {10, 25, 5, 25};
  for (int i = 0; i < NREQ; i++)
    req_init(&rs[i], 100 + (uint64_t)i, lens[i], i == 3 ? 1 : (uint32_t)i, -1);
  rs[0].logprobs = 2;
  uint32_t ref[NREQ][NGEN];
  for (int i = 0; i < NREQ; i++)
    TH_REQUIRE(wts_generate(&e.w, rs[i].prompt, rs[i].n_prompt, NGEN, ref[i]) == NGEN);
  /* all at once: prompts of 25 tokens are chunked under a 16-token budget,
   * decodes share steps with prefill chunks, request 103 repeats 101's
   * prompt (prefix-cache hits once 101's blocks are full) */
  TH_REQUIRE(run_reqs(&e, rs, NREQ) == 0);
  for (int i = 0; i < NREQ; i++)
    check_same(&rs[i], ref[i], NGEN);
  TH_CHECK(rs[0].lp_ok > 0);
  TH_CHECK_EQ_INT(rs[0].lp_bad, 0);
  /* the same prompt again alone, after the others are done */
  struct req again;
  req_init(&again, 200, lens[1], 1, -1);
  TH_REQUIRE(run_reqs(&e, &again, 1) == 0);
  check_same(&again, ref[1], NGEN);
  env_stop(&e);
}

TH_TEST(scheduler_and_worker_greedy) {
  greedy_case(0);
}

TH_TEST(scheduler_and_worker_speculative_greedy) {
  greedy_case(1);
}

TH_TEST(scheduler_and_worker_seeded) {
  th_proc_init(150);
  struct env e;
  TH_REQUIRE(env_start(&e, "ws-seed", 0) == 0);
  struct req alone, rs[3];
  req_init(&alone, 1, 12, 5, 1234);
  TH_REQUIRE(run_reqs(&e, &alone, 1) == 0);
  TH_CHECK_EQ_INT(alone.n_out, NGEN);
  req_init(&rs[0], 2, 20, 6, 99);
  req_init(&rs[1], 3, 12, 5, 1234);
  req_init(&rs[2], 4, 12, 5, 1235);
  TH_REQUIRE(run_reqs(&e, rs, 3) == 0);
  check_same(&rs[1], alone.out, NGEN);
  TH_CHECK(memcmp(rs[2].out, alone.out, sizeof(uint32_t) * NGEN) != 0);
  env_stop(&e);
}
