/* wk-test-sched.c — the fake scheduler of the worker's integration tests
 * (see wk-test-sched.h). */
#include "tests/integration/wk-test-sched.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "common/cm-time.h"
#include "tests/harness/th.h"

static char g_tmp[256];

int wts_model(struct wts *w, const char *arch, const char *name) {
  memset(w, 0, sizeof(*w));
  if (!g_tmp[0] && th_tmpdir("wk", g_tmp, sizeof(g_tmp))) return -1;
  snprintf(w->model, sizeof(w->model), "%s/%s", g_tmp, name);
  snprintf(w->endpoint, sizeof(w->endpoint), "ipc://%s/%s.sock", g_tmp, name);
  struct th_out o = {0};
  int rc = th_lmserve(&o, 60000, "make-tiny-model", "--arch", arch, "--out", w->model, "--seed",
                      "1", NULL);
  if (rc) fprintf(stderr, "make-tiny-model: %d %s\n", rc, o.err ? o.err : "");
  th_out_free(&o);
  return rc ? -1 : 0;
}

int wts_assistant(const struct wts *w, char *path, size_t size) {
  snprintf(path, size, "%s-assistant", w->model);
  struct th_out o = {0};
  int rc = th_lmserve(&o, 60000, "make-tiny-model", "--arch", "gemma4-assistant", "--target",
                      w->model, "--out", path, "--seed", "1", NULL);
  th_out_free(&o);
  return rc ? -1 : 0;
}

/* Receives one message of type `want` (or FAIL when want is RESULT) within
 * ms; heartbeats are counted on the way. 0 or -1 (timeout). */
static int recv_want(struct wts *w, enum pr_type want, int ms, struct pr_msg *m) {
  uint64_t end = cm_time_ns() + (uint64_t)ms * 1000000ull;
  while (cm_time_ns() < end) {
    struct pr_rid from;
    cm_arena_reset(&w->arena);
    int rc = pr_sock_recv(w->sock, &from, m, &w->arena, 0);
    if (rc == CM_ERR_AGAIN) continue;
    if (rc) {
      fprintf(stderr, "fake scheduler: bad message: %s\n", cm_strerror(rc));
      return -1;
    }
    if (m->type == PR_BEAT) {
      w->n_beats++;
      w->last_beat_step = m->u.beat.last_step_id;
      w->beat_flags = m->u.beat.flags;
      if (want != PR_BEAT) continue;
    }
    if (m->type == PR_READY) w->rid = from;
    if (m->type == PR_FAIL) {
      w->n_fail++;
      fprintf(stderr, "fake scheduler: FAIL step %llu: %s\n", (unsigned long long)m->u.fail.step_id,
              m->u.fail.message);
    }
    if (m->type == want || (want == PR_RESULT && m->type == PR_FAIL)) return 0;
  }
  return -1;
}

int wts_start(struct wts *w, const char *model, char *const *extra) {
  cm_arena_init(&w->arena, 1u << 16, 64u << 20);
  w->next_step = 1;
  if (!(w->ctx = zmq_ctx_new())) return -1;
  if (pr_sock_open(w->ctx, ZMQ_ROUTER, 0, &w->sock) || pr_sock_bind(w->sock, w->endpoint) ||
      pr_sock_set_timeouts(w->sock, 200, 5000))
    return -1;
  if (th_proc_spawnl(&w->proc, w->env, 0, extra, th_lmserve_bin(), "worker", "--model", model,
                     "--scheduler", w->endpoint, TH_TINY_WORKER_ARGS, NULL))
    return -1;
  w->started = 1;
  struct pr_msg m;
  if (recv_want(w, PR_READY, 60000, &m)) return -1;
  w->ready = m.u.ready;
  for (uint32_t g = 0; g < m.u.ready.n_groups && g < PR_MAX_KV_GROUPS; g++)
    w->groups[g] = m.u.ready.groups[g];
  w->ready.groups = w->groups;
  w->n_eos = (int)(m.u.ready.eos_ids.n < 16 ? m.u.ready.eos_ids.n : 16);
  for (int i = 0; i < w->n_eos; i++)
    w->eos[i] = m.u.ready.eos_ids.v[i];
  w->ready.eos_ids.v = w->eos;
  w->page_used = calloc(w->ready.kv_blocks, 1);
  return w->page_used ? 0 : -1;
}

void wts_close(struct wts *w) {
  if (w->started) th_proc_stop(&w->proc, 2000);
  w->started = 0;
  pr_sock_close(w->sock);
  w->sock = NULL;
  if (w->ctx) zmq_ctx_term(w->ctx);
  w->ctx = NULL;
  cm_arena_free(&w->arena);
  free(w->page_used);
  w->page_used = NULL;
}

int wts_generate(struct wts *w, const uint32_t *prompt, int n, int max_tokens, uint32_t *out) {
  return th_generate(w->model, prompt, n, max_tokens, 60000, out);
}

void wts_seq_init(struct wts_seq *s, uint64_t id, const uint32_t *prompt, int n, int64_t seed) {
  memset(s, 0, sizeof(*s));
  s->id = id;
  s->prompt = prompt;
  s->n_prompt = n;
  s->seed = seed;
  s->logprobs = -1;
}

void wts_seq_begin(struct wts *w, struct wts_seq *s) {
  (void)w;
  s->pos = s->n_out = 0;
  s->done = 0;
  memset(s->n_bt, 0, sizeof(s->n_bt));
  memset(s->sent_bt, 0, sizeof(s->sent_bt));
}

static int32_t page_get(struct wts *w) {
  for (uint64_t i = 0; i < w->ready.kv_blocks; i++)
    if (!w->page_used[i]) {
      w->page_used[i] = 1;
      return (int32_t)i;
    }
  return -1;
}

static void seq_release(struct wts *w, struct wts_seq *s) {
  for (uint32_t g = 0; g < w->ready.n_groups; g++)
    for (int j = 0; j < s->n_bt[g]; j++)
      w->page_used[s->bt[g][j]] = 0;
  memset(s->n_bt, 0, sizeof(s->n_bt));
}

/* Grows s's tables to cover positions [0, n_tok). */
static int seq_reserve(struct wts *w, struct wts_seq *s, int n_tok) {
  for (uint32_t g = 0; g < w->ready.n_groups; g++) {
    int need = (n_tok + (int)w->groups[g].block_tokens - 1) / (int)w->groups[g].block_tokens;
    while (s->n_bt[g] < need) {
      if (s->n_bt[g] == WTS_MAX_BT) return -1;
      int32_t p = page_get(w);
      if (p < 0) return -1;
      s->bt[g][s->n_bt[g]++] = p;
    }
  }
  return 0;
}

int wts_step_run(struct wts *w, struct wts_seq *seqs, int n, int chunk, int ngen) {
  struct pr_step_seq ss[16];
  struct pr_i32s tabs[16][PR_MAX_KV_GROUPS];
  struct wts_seq *who[16];
  uint32_t toks[16];
  int k = 0;
  for (int i = 0; i < n && k < 16; i++) {
    struct wts_seq *s = &seqs[i];
    if (s->done) continue;
    struct pr_step_seq *q = &ss[k];
    memset(q, 0, sizeof(*q));
    pr_sampling_default(&q->sampling);
    q->seq_id = s->id;
    q->start_pos = (uint32_t)s->pos;
    if (s->pos < s->n_prompt) {
      int c = chunk > 0 ? chunk : s->n_prompt;
      if (c > s->n_prompt - s->pos) c = s->n_prompt - s->pos;
      q->tokens.v = s->prompt + s->pos;
      q->tokens.n = (uint32_t)c;
      q->flags |= PR_SEQ_PREFILL;
      if (s->pos == 0) q->flags |= PR_SEQ_NEW;
      if (s->pos + c == s->n_prompt) q->flags |= PR_SEQ_SAMPLE;
    } else {
      toks[k] = s->out[s->n_out - 1];
      q->tokens.v = &toks[k];
      q->tokens.n = 1;
      q->flags |= PR_SEQ_SAMPLE;
    }
    if ((q->flags & PR_SEQ_SAMPLE) && s->n_out + 1 >= ngen) q->flags |= PR_SEQ_FINISHED;
    if (seq_reserve(w, s, s->pos + (int)q->tokens.n)) return -1;
    int grew = 0;
    for (uint32_t g = 0; g < w->ready.n_groups; g++) {
      int from = (q->flags & PR_SEQ_NEW) ? 0 : s->sent_bt[g];
      tabs[k][g].v = s->bt[g] + from;
      tabs[k][g].n = (uint32_t)(s->n_bt[g] - from);
      grew |= s->n_bt[g] > s->sent_bt[g];
      s->sent_bt[g] = s->n_bt[g];
    }
    if ((q->flags & PR_SEQ_NEW) || grew) {
      q->block_tables = tabs[k];
      q->n_groups = w->ready.n_groups;
      if (!(q->flags & PR_SEQ_NEW)) q->flags |= PR_SEQ_APPEND_BLOCKS;
    }
    if (q->flags & PR_SEQ_NEW) {
      q->sampling.temperature = s->seed >= 0 ? 1.0f : 0.0f;
      q->sampling.has_seed = s->seed >= 0;
      q->sampling.seed = s->seed >= 0 ? (uint64_t)s->seed : 0;
      q->sampling.logprobs = s->logprobs;
      q->sampling.top_k = s->top_k;
      q->sampling.min_p = s->min_p;
      if (s->penalty > 0) {
        q->sampling.repetition_penalty = 1.0f + s->penalty;
        q->sampling.frequency_penalty = q->sampling.presence_penalty = s->penalty;
      }
    }
    s->pos += (int)q->tokens.n;
    who[k++] = s;
  }
  if (!k) return 0;
  struct pr_msg m;
  pr_msg_init(&m, PR_STEP);
  m.u.step.step_id = w->next_step++;
  m.u.step.seqs = ss;
  m.u.step.n_seqs = (uint32_t)k;
  if (pr_sock_send(w->sock, &w->rid, &m, 0)) return -1;
  struct pr_msg r;
  if (recv_want(w, PR_RESULT, 30000, &r) || r.type != PR_RESULT ||
      r.u.result.step_id != m.u.step.step_id)
    return -1;
  for (uint32_t j = 0; j < r.u.result.n_seqs; j++) {
    const struct pr_result_seq *rs = &r.u.result.seqs[j];
    struct wts_seq *s = NULL;
    for (int i = 0; i < k; i++)
      if (who[i]->id == rs->seq_id) s = who[i];
    if (!s || rs->tokens.n != 1) return -1;
    if (s->n_out < WTS_MAX_OUT) {
      int o = s->n_out;
      s->out[o] = rs->tokens.v[0];
      if (rs->logprobs.sampled.n == 1) {
        s->lp[o] = rs->logprobs.sampled.v[0];
        s->n_top = (int)rs->logprobs.n_top;
        for (uint32_t t = 0; t < rs->logprobs.n_top && t < WTS_MAX_TOP; t++) {
          s->top_ids[o][t] = rs->logprobs.top_ids.v[t];
          s->top[o][t] = rs->logprobs.top.v[t];
        }
      }
      s->n_out++;
    }
    if (s->n_out >= ngen) {
      s->done = 1;
      seq_release(w, s);
    }
  }
  return 0;
}

void wts_seq_end(struct wts *w, struct wts_seq *s) {
  seq_release(w, s);
}

int wts_spec_step(struct wts *w, struct wts_seq *s, int k, const uint32_t *drafts, int n_drafts,
                  uint32_t *drafts_out, int *n_accepted) {
  struct pr_step_seq q;
  struct pr_i32s tabs[PR_MAX_KV_GROUPS];
  uint32_t last;
  memset(&q, 0, sizeof(q));
  pr_sampling_default(&q.sampling);
  q.seq_id = s->id;
  q.start_pos = (uint32_t)s->pos;
  q.num_draft = (uint32_t)k;
  q.flags = PR_SEQ_SAMPLE;
  if (s->pos == 0) {
    q.start_pos = (uint32_t)s->cached;
    q.tokens.v = s->prompt + s->cached;
    q.tokens.n = (uint32_t)(s->n_prompt - s->cached);
    q.num_prompt = (uint32_t)(s->n_prompt - s->resumed);
    if (s->send_before) q.before = (struct pr_u32s){s->prompt, (uint32_t)s->cached};
    q.flags |= PR_SEQ_NEW;
    if (q.tokens.n > 1 || q.start_pos < q.num_prompt) q.flags |= PR_SEQ_PREFILL;
    q.sampling.temperature = s->seed >= 0 ? 1.0f : 0.0f;
    q.sampling.has_seed = s->seed >= 0;
    q.sampling.seed = s->seed >= 0 ? (uint64_t)s->seed : 0;
  } else {
    last = s->out[s->n_out - 1];
    q.tokens.v = &last;
    q.tokens.n = 1;
    q.draft_tokens.v = drafts;
    q.draft_tokens.n = (uint32_t)n_drafts;
  }
  if (seq_reserve(w, s, (int)q.start_pos + (int)q.tokens.n + n_drafts)) return -1;
  for (uint32_t g = 0; g < w->ready.n_groups; g++) {
    int from = s->pos == 0 ? 0 : s->sent_bt[g];
    tabs[g].v = s->bt[g] + from;
    tabs[g].n = (uint32_t)(s->n_bt[g] - from);
    s->sent_bt[g] = s->n_bt[g];
  }
  q.block_tables = tabs;
  q.n_groups = w->ready.n_groups;
  if (s->pos) q.flags |= PR_SEQ_APPEND_BLOCKS;
  struct pr_msg m;
  pr_msg_init(&m, PR_STEP);
  m.u.step.step_id = w->next_step++;
  m.u.step.seqs = &q;
  m.u.step.n_seqs = 1;
  if (pr_sock_send(w->sock, &w->rid, &m, 0)) return -1;
  struct pr_msg r;
  if (recv_want(w, PR_RESULT, 30000, &r) || r.type != PR_RESULT || r.u.result.n_seqs != 1)
    return -1;
  const struct pr_result_seq *rs = &r.u.result.seqs[0];
  if (rs->seq_id != s->id || rs->tokens.n != rs->num_accepted + 1 ||
      rs->num_accepted > (uint32_t)n_drafts || rs->drafts.n > (uint32_t)k)
    return -1;
  for (uint32_t i = 0; i < rs->tokens.n && s->n_out < WTS_MAX_OUT; i++)
    s->out[s->n_out++] = rs->tokens.v[i];
  w->n_drafts = (int)rs->drafts.n;
  for (int i = 0; i < w->n_drafts; i++)
    drafts_out[i] = rs->drafts.v[i];
  s->pos = (int)q.start_pos + (int)q.tokens.n + (int)rs->num_accepted;
  *n_accepted = (int)rs->num_accepted;
  return 0;
}

int wts_bad_step(struct wts *w, int kind, int *code, char *why, size_t why_len) {
  static const uint32_t toks[100] = {2, 3, 4};
  uint32_t bad_tok[2] = {2, 0};
  int32_t pages[PR_MAX_KV_GROUPS][4];
  struct pr_i32s tabs[PR_MAX_KV_GROUPS];
  for (uint32_t g = 0; g < w->ready.n_groups; g++) {
    for (int j = 0; j < 4; j++)
      pages[g][j] = (int32_t)(g * 4 + (uint32_t)j);
    tabs[g].v = pages[g];
    tabs[g].n = 4;
  }
  struct pr_step_seq q;
  memset(&q, 0, sizeof(q));
  pr_sampling_default(&q.sampling);
  q.seq_id = 9000 + (uint64_t)kind;
  q.flags = PR_SEQ_NEW | PR_SEQ_PREFILL | PR_SEQ_SAMPLE;
  q.tokens.v = toks;
  q.tokens.n = 3;
  q.block_tables = tabs;
  q.n_groups = w->ready.n_groups;
  switch (kind) {
  case 0: /* token id outside the vocabulary */
    bad_tok[1] = w->ready.vocab_size + 5;
    q.tokens.v = bad_tok;
    q.tokens.n = 2;
    break;
  case 1: /* unknown sequence, no NEW */
    q.flags = PR_SEQ_SAMPLE;
    q.n_groups = 0;
    q.block_tables = NULL;
    q.start_pos = 3;
    break;
  case 2: /* a block outside the pool */ pages[0][0] = (int32_t)w->ready.kv_blocks + 10; break;
  case 3: /* more tokens than a step holds */ q.tokens.n = 100; break;
  case 4: /* drafts from a worker without an assistant model */ q.num_draft = 2; break;
  case 7: /* drafts with no token before them (needs an assistant model) */
    q.tokens.n = 0;
    q.draft_tokens.v = toks;
    q.draft_tokens.n = 2;
    break;
  case 5: /* positions past the model length */ q.start_pos = w->ready.max_model_len - 1; break;
  default: { /* a live sequence that the same step frees */
    struct pr_msg first;
    pr_msg_init(&first, PR_STEP);
    q.flags = PR_SEQ_NEW | PR_SEQ_PREFILL;
    first.u.step.step_id = w->next_step++;
    first.u.step.seqs = &q;
    first.u.step.n_seqs = 1;
    struct pr_msg r0;
    if (pr_sock_send(w->sock, &w->rid, &first, 0) || recv_want(w, PR_RESULT, 30000, &r0) ||
        r0.type != PR_RESULT || r0.u.result.n_seqs != 0)
      return -1;
    q.flags = PR_SEQ_SAMPLE;
    q.start_pos = 3;
    q.n_groups = 0;
    q.block_tables = NULL;
    break;
  }
  }
  struct pr_msg m;
  pr_msg_init(&m, PR_STEP);
  m.u.step.step_id = w->next_step++;
  m.u.step.seqs = &q;
  m.u.step.n_seqs = 1;
  if (kind == 6) {
    m.u.step.free_ids.v = &q.seq_id;
    m.u.step.free_ids.n = 1;
  }
  if (pr_sock_send(w->sock, &w->rid, &m, 0)) return -1;
  struct pr_msg r;
  if (recv_want(w, PR_RESULT, 30000, &r) || r.type != PR_FAIL ||
      r.u.fail.step_id != m.u.step.step_id)
    return -1;
  *code = r.u.fail.code;
  snprintf(why, why_len, "%s", r.u.fail.message);
  if (kind == 6) { /* the refused step still freed it: unknown on its own now */
    m.u.step.step_id = w->next_step++;
    m.u.step.free_ids.n = 0;
    if (pr_sock_send(w->sock, &w->rid, &m, 0) || recv_want(w, PR_RESULT, 30000, &r) ||
        r.type != PR_FAIL || !strstr(r.u.fail.message, "unknown"))
      return -1;
  }
  return 0;
}

int wts_send_garbage(struct wts *w) {
  void *z = pr_sock_zmq(w->sock);
  uint8_t hdr[PR_HDR_LEN];
  pr_msg_header(PR_STEP, hdr);
  uint8_t body[3] = {0xc1, 0xdd, 0xff};
  if (zmq_send(z, w->rid.id, w->rid.len, ZMQ_SNDMORE) < 0 ||
      zmq_send(z, hdr, sizeof(hdr), ZMQ_SNDMORE) < 0 || zmq_send(z, body, sizeof(body), 0) < 0)
    return -1;
  struct pr_msg r;
  if (recv_want(w, PR_RESULT, 30000, &r) || r.type != PR_FAIL) return -1;
  return r.u.fail.code < 0 ? 0 : -1;
}

void wts_idle(struct wts *w, int ms) {
  struct pr_msg m;
  (void)recv_want(w, PR_PING, ms, &m); /* never comes: counts beats until ms */
}

int wts_ctrl(struct wts *w, uint32_t op) {
  struct pr_msg m;
  pr_msg_init(&m, PR_CTRL);
  m.u.ctrl.op = op;
  return pr_sock_send(w->sock, &w->rid, &m, 0) ? -1 : 0;
}

int wts_shutdown(struct wts *w) {
  return wts_ctrl(w, PR_CTRL_SHUTDOWN);
}
