/* wk-test-sched.h — a fake scheduler for the worker's integration tests: a
 * ROUTER socket bound on an ipc endpoint in a temp dir, a `lmserve worker`
 * child connected to it, a page allocator over the worker's pool, and STEP
 * builders that drive sequences through chunked prefill and decode. */
#ifndef LMSERVE_WK_TEST_SCHED_H
#define LMSERVE_WK_TEST_SCHED_H
#include <stddef.h>
#include <stdint.h>

#include "common/cm-arena.h"
#include "proto/pr-zmq.h"
#include "tests/harness/th-proc.h"

#define WTS_MAX_OUT   64  /* tokens a test sequence generates at most */
#define WTS_MAX_BT    128 /* blocks per group table */
#define WTS_MAX_TOP   8
#define WTS_BAD_KINDS 7

struct wts {
  char model[400];    /* checkpoint dir made by wts_model */
  char endpoint[500]; /* ipc:// endpoint the fake scheduler binds */
  void *ctx;
  struct pr_sock *sock;
  struct cm_arena arena;
  struct pr_rid rid; /* the worker's routing id, from READY */
  struct th_proc proc;
  int started;
  char *const *env;      /* extra "K=V" entries for the worker, or NULL */
  struct pr_ready ready; /* groups / eos_ids point into the arrays below */
  struct pr_kv_group groups[PR_MAX_KV_GROUPS];
  uint32_t eos[16];
  int n_eos;
  int n_beats, n_fail;
  uint32_t beat_flags; /* the latest BEAT's */
  uint64_t last_beat_step;
  uint64_t next_step;
  uint8_t *page_used; /* [ready.kv_blocks] */
  int n_drafts;       /* drafts the latest wts_spec_step's RESULT proposed */
};

struct wts_seq {
  uint64_t id;
  const uint32_t *prompt;
  int n_prompt;
  int64_t seed; /* -1: greedy; else temperature 1 with this seed */
  int logprobs; /* -1: none */
  int top_k;    /* 0: off */
  float min_p;  /* 0: off */
  float penalty; /* 0: off; else repetition 1 + penalty, frequency = presence = penalty */
  int pos;      /* tokens the worker has run */
  int n_out;
  uint32_t out[WTS_MAX_OUT];
  float lp[WTS_MAX_OUT];
  int n_top;
  uint32_t top_ids[WTS_MAX_OUT][WTS_MAX_TOP];
  float top[WTS_MAX_OUT][WTS_MAX_TOP];
  int32_t bt[PR_MAX_KV_GROUPS][WTS_MAX_BT]; /* pages per group */
  int n_bt[PR_MAX_KV_GROUPS];
  int sent_bt[PR_MAX_KV_GROUPS]; /* blocks the worker has been told of */
  int done;
  /* wts_spec_step's first step: the prompt from position `cached` on, as after a
   * prefix-cache hit (the K/V before it is whatever the pages hold), with the
   * tokens before it in the step's `before` when send_before */
  int cached, send_before;
  /* the prompt's last `resumed` tokens stand for generated ones (a preempted request run
   * again): num_prompt leaves them out, and a first step of one of them alone is not
   * PREFILL, as the scheduler sends it */
  int resumed;
};

/* Makes a tiny checkpoint (`arch` gemma3 | gemma4) in the test's temp dir
 * under `name`, and names an endpoint beside it. 0 or -1. */
int wts_model(struct wts *w, const char *arch, const char *name);
/* Makes w's MTP assistant (`make-tiny-model --arch gemma4-assistant --target`) beside
 * its model, at "<model>-assistant"; its path in path (size bytes). 0 or -1. */
int wts_assistant(const struct wts *w, char *path, size_t size);
/* Binds the ROUTER, starts the worker (extra: NULL-terminated extra args or
 * NULL) and waits for READY. 0 or -1. */
int wts_start(struct wts *w, const char *model, char *const *extra);
void wts_close(struct wts *w);
/* `lmserve generate` greedy ids (EOS ignored); returns how many or -1. */
int wts_generate(struct wts *w, const uint32_t *prompt, int n, int max_tokens, uint32_t *out);

void wts_seq_init(struct wts_seq *s, uint64_t id, const uint32_t *prompt, int n, int64_t seed);
void wts_seq_begin(struct wts *w, struct wts_seq *s);
/* One STEP for every unfinished sequence: a prompt chunk of `chunk` tokens
 * (0 = the rest) or one decode token; the step that samples token `ngen`
 * carries FINISHED. 0, or -1 when the worker answered FAIL or nothing. */
int wts_step_run(struct wts *w, struct wts_seq *seqs, int n, int chunk, int ngen);

/* One speculative STEP for s alone: the prompt (first call) or the last
 * token plus `drafts` to verify; asks for k new drafts. Appends the
 * accepted drafts and the next token to s->out; the proposals go to
 * drafts_out (w->n_drafts <= k of them). 0 or -1 (FAIL, no answer, bad
 * RESULT). */
int wts_spec_step(struct wts *w, struct wts_seq *s, int k, const uint32_t *drafts, int n_drafts,
                  uint32_t *drafts_out, int *n_accepted);
/* Returns s's pages to the test's allocator. */
void wts_seq_end(struct wts *w, struct wts_seq *s);

/* Sends a malformed STEP of `kind` (0..WTS_BAD_KINDS-1; 7: drafts with no
 * token before them, for a worker with an assistant) and waits for its
 * FAIL: 0 and the code and reason, or -1. */
int wts_bad_step(struct wts *w, int kind, int *code, char *why, size_t why_len);
/* Sends a message whose body is not msgpack; waits for FAIL. 0 or -1. */
int wts_send_garbage(struct wts *w);
/* Receives for `ms`, counting heartbeats. */
void wts_idle(struct wts *w, int ms);
int wts_shutdown(struct wts *w);
/* Sends CTRL op (no argument, no text). 0 or -1. */
int wts_ctrl(struct wts *w, uint32_t op);

#endif
