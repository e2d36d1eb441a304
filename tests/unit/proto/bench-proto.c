/* bench-proto.c — throughput of the message codec and the latency of a
 * DEALER/ROUTER round trip over ipc, for messages shaped like a busy server's:
 *   step-256     STEP: 256 decoding sequences, 1 token each, 2 KV groups x 64 blocks
 *   step-prefill STEP: one new sequence with an 8192-token prompt chunk
 *   out-256      OUT: 256 sequences, 1 token each, no logprobs
 *   result-256   RESULT: 256 sequences, 1 token each, 5 top logprobs
 * Codec figures are thread CPU time per message; the round trip is wall time.
 * Not a test: run build/tests/unit/proto/bench-proto [iterations]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "common/cm-time.h"
#include "proto/pr-msg.h"
#include "proto/pr-zmq.h"

#define NSEQ   256
#define NBLK   64
#define PROMPT 8192

static uint32_t toks[PROMPT];
static int32_t blocks[2][NBLK];
static struct pr_i32s tables[NSEQ][2];
static struct pr_step_seq sseqs[NSEQ];
static struct pr_out_seq oseqs[NSEQ];
static struct pr_result_seq rseqs[NSEQ];
static float lps[NSEQ * 5];
static uint32_t top_ids[NSEQ * 5];

static void build_step(struct pr_msg *m, int prefill) {
  pr_msg_init(m, PR_STEP);
  m->u.step.step_id = 1000;
  m->u.step.seqs = sseqs;
  m->u.step.n_seqs = prefill ? 1 : NSEQ;
  for (int i = 0; i < NSEQ; i++) {
    struct pr_step_seq *s = &sseqs[i];
    memset(s, 0, sizeof(*s));
    pr_sampling_default(&s->sampling);
    s->seq_id = 1000000 + (uint64_t)i;
    s->flags = prefill ? PR_SEQ_NEW | PR_SEQ_PREFILL | PR_SEQ_SAMPLE : PR_SEQ_SAMPLE;
    s->start_pos = prefill ? 0 : 1000 + (uint32_t)i;
    s->tokens = (struct pr_u32s){toks + i, prefill ? PROMPT : 1};
    s->n_groups = 2;
    s->block_tables = tables[i];
    tables[i][0] = (struct pr_i32s){blocks[0], NBLK};
    tables[i][1] = (struct pr_i32s){blocks[1], NBLK};
  }
}

static void build_out(struct pr_msg *m) {
  pr_msg_init(m, PR_OUT);
  m->u.out.seqs = oseqs;
  m->u.out.n_seqs = NSEQ;
  for (int i = 0; i < NSEQ; i++) {
    memset(&oseqs[i], 0, sizeof(oseqs[i]));
    oseqs[i].request_id = (uint64_t)i;
    oseqs[i].tokens = (struct pr_u32s){toks + i, 1};
    oseqs[i].stop_token = -1;
    oseqs[i].n_prompt_tokens = 500;
    oseqs[i].queued_ns = 1795000000000000000ull;
    oseqs[i].scheduled_ns = oseqs[i].queued_ns + 1000;
    oseqs[i].first_token_ns = oseqs[i].queued_ns + 2000;
  }
}

static void build_result(struct pr_msg *m) {
  pr_msg_init(m, PR_RESULT);
  m->u.result.step_id = 1000;
  m->u.result.seqs = rseqs;
  m->u.result.n_seqs = NSEQ;
  for (int i = 0; i < NSEQ; i++) {
    memset(&rseqs[i], 0, sizeof(rseqs[i]));
    rseqs[i].seq_id = (uint64_t)i;
    rseqs[i].tokens = (struct pr_u32s){toks + i, 1};
    rseqs[i].logprobs.n_top = 5;
    rseqs[i].logprobs.sampled = (struct pr_f32s){lps + i, 1};
    rseqs[i].logprobs.top_ids = (struct pr_u32s){top_ids + 5 * i, 5};
    rseqs[i].logprobs.top = (struct pr_f32s){lps + 5 * i, 5};
  }
}

/* CPU time of this thread, ns: the codec numbers stay meaningful on a
 * machine shared with other work. */
static uint64_t cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void bench_codec(const char *name, const struct pr_msg *m, int iters) {
  struct pr_buf b;
  struct cm_arena a;
  struct pr_msg d;
  pr_buf_init(&b, 0);
  cm_arena_init(&a, 1 << 20, 64u << 20);
  uint64_t t0 = cpu_ns();
  for (int i = 0; i < iters; i++)
    if (pr_msg_encode(m, &b)) abort();
  uint64_t t1 = cpu_ns();
  for (int i = 0; i < iters; i++) {
    cm_arena_reset(&a);
    if (pr_msg_decode_body(m->type, b.data, b.len, &a, &d)) abort();
  }
  uint64_t t2 = cpu_ns();
  if (!pr_msg_equal(m, &d)) abort();
  double enc = (double)(t1 - t0) / iters, dec = (double)(t2 - t1) / iters;
  printf("%-13s %8zu bytes  encode %8.1f us (%6.0f MB/s)  decode %8.1f us (%6.0f MB/s)\n", name,
         b.len, enc / 1e3, (double)b.len / enc * 1e3, dec / 1e3, (double)b.len / dec * 1e3);
  pr_buf_free(&b);
  cm_arena_free(&a);
}

static int bench_rtt(const struct pr_msg *m, const char *name, int iters) {
  char base[256], dir[256], ep[300];
  snprintf(base, sizeof(base), "/tmp/lmserve-bench-proto-%d", (int)getpid());
  if (pr_runtime_dir(base, dir, sizeof(dir)) || pr_endpoint(dir, "bench", ep, sizeof(ep)))
    return -1;
  void *ctx = zmq_ctx_new();
  struct pr_sock *r, *d;
  struct cm_arena a;
  cm_arena_init(&a, 1 << 20, 64u << 20);
  if (pr_sock_open(ctx, ZMQ_ROUTER, 0, &r) || pr_sock_open(ctx, ZMQ_DEALER, 0, &d) ||
      pr_sock_bind(r, ep) || pr_sock_connect(d, ep))
    return -1;
  struct pr_msg got;
  struct pr_rid from;
  uint64_t t0 = 0;
  for (int i = -10; i < iters; i++) { /* 10 warm-up rounds */
    if (i == 0) t0 = cm_time_ns();
    if (pr_sock_send(d, NULL, m, 0) || pr_sock_recv(r, &from, &got, &a, 0)) return -1;
    cm_arena_reset(&a);
    if (pr_sock_send(r, &from, &got, 0) || pr_sock_recv(d, NULL, &got, &a, 0)) return -1;
    cm_arena_reset(&a);
  }
  double rtt = (double)(cm_time_ns() - t0) / iters;
  printf("ipc round trip %-13s %8.1f us (encode, send, receive, decode; both ways)\n", name,
         rtt / 1e3);
  pr_sock_close(d);
  pr_sock_close(r);
  zmq_ctx_term(ctx);
  cm_arena_free(&a);
  char path[400];
  snprintf(path, sizeof(path), "%s/bench.sock", dir);
  unlink(path);
  rmdir(dir);
  return 0;
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 2000;
  if (iters < 1) iters = 1;
  for (int i = 0; i < PROMPT; i++)
    toks[i] = (uint32_t)(i * 7919u % 262144u);
  for (int g = 0; g < 2; g++)
    for (int i = 0; i < NBLK; i++)
      blocks[g][i] = 5000 * g + i * 3;
  for (int i = 0; i < NSEQ * 5; i++)
    lps[i] = -0.01f * (float)i, top_ids[i] = (uint32_t)i;
  struct pr_msg m;
  build_step(&m, 0);
  bench_codec("step-256", &m, iters);
  if (bench_rtt(&m, "step-256", iters)) fprintf(stderr, "ipc round trip failed\n");
  build_step(&m, 1);
  bench_codec("step-prefill", &m, iters);
  build_out(&m);
  bench_codec("out-256", &m, iters);
  build_result(&m);
  bench_codec("result-256", &m, iters);
  pr_msg_init(&m, PR_PING);
  if (bench_rtt(&m, "ping", iters)) fprintf(stderr, "ipc round trip failed\n");
  return 0;
}
