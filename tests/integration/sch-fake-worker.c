/* sch-fake-worker.c — a worker rank for the scheduler's integration tests. It speaks
 * the real protocol (READY, STEP, RESULT, BEAT, FAIL, CTRL) over a DEALER socket and
 * runs the trivial deterministic model of sch-fake-model.h. It keeps every sequence's
 * token history and a simulated paged KV memory (per block slot: token and position
 * written there), and checks each STEP: positions continue where the sequence stopped,
 * decode tokens are the ones it sampled, block tables cover every position run, and
 * reading the whole context through the tables (the full group) and the window (the
 * sliding group) finds exactly the sequence's tokens. A violation is answered with
 * FAIL (and logged), so the scheduler reports it to the test as an ERR.
 *
 *   sch-fake-worker --endpoint EP [--rank R] [--world-size N] [--blocks B]
 *                   [--beat-ms MS] [--max-draft K] [--slow-ms MS] [--fail-at-step S]
 *                   [--empty-results] [--grammar-ms MS] [--grammar-fail]
 *
 * --grammar-ms: after CTRL GRAMMARS, BEAT says PR_BEAT_GRAMMARS MS later (at once, as
 * the real worker does); a NEW sequence with a structured output before that fails.
 * --grammar-fail: BEAT says PR_BEAT_GRAMMARS_FAILED instead, and a structured output
 * always fails. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-args.h"
#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-time.h"
#include "proto/pr-zmq.h"
#include "tests/integration/sch-fake-model.h"

#define NGROUPS  2
#define MAX_SEQS 2048
#define MAX_BT   16

static const uint32_t k_bt[NGROUPS] = {16, 8};  /* tokens per block: full, sliding */
static const uint32_t k_win[NGROUPS] = {0, 20}; /* sliding window, tokens */

struct slot {
  int32_t tok, pos; /* what was written: token id and its position; pos -1 = never */
};

struct fseq {
  uint64_t id;
  bool used;
  uint32_t ntok; /* tokens in KV: history[0..ntok) */
  uint32_t history[SCH_FAKE_MAXLEN + 128];
  int64_t last_sampled; /* -1 = none */
  uint32_t accepted;    /* drafts its latest sampling step accepted */
  uint32_t n_prop;      /* drafts that step proposed, in prop */
  uint32_t prop[PR_MAX_DRAFT];
  uint32_t gen_end; /* prompt + max_tokens (from NEW), 0 = not said */
  struct pr_sampling sampling;
};

struct fake {
  uint32_t rank, world, max_draft;
  uint64_t blocks, fail_at_step;
  uint64_t steps_taken; /* STEPs received (their ids skip the empty plans never sent) */
  int slow_ms;
  int64_t grammar_ms;  /* --grammar-ms */
  bool grammar_fail;   /* --grammar-fail */
  uint64_t grammar_at; /* when the structured-output state is "built" (0: not asked) */
  uint32_t flags;      /* what BEAT says */
  bool empty_results; /* also list non-sampling sequences, with no tokens */
  struct slot *kv;    /* [blocks][MAX_BT] */
  struct fseq *seqs;  /* [MAX_SEQS] */
  struct pr_sock *sock;
  char why[512];
  /* RESULT buffers */
  struct pr_result_seq rs[MAX_SEQS];
  uint32_t rtok[MAX_SEQS][PR_MAX_DRAFT + 1];
  float rlp[MAX_SEQS][PR_MAX_DRAFT + 1];
  uint32_t rdraft[MAX_SEQS][PR_MAX_DRAFT];
};

static struct fseq *find(struct fake *f, uint64_t id) {
  for (int i = 0; i < MAX_SEQS; i++)
    if (f->seqs[i].used && f->seqs[i].id == id) return &f->seqs[i];
  return NULL;
}

static struct fseq *create(struct fake *f, uint64_t id) {
  struct fseq *q = find(f, id);
  for (int i = 0; !q && i < MAX_SEQS; i++)
    if (!f->seqs[i].used) q = &f->seqs[i];
  if (!q) return NULL;
  memset(q, 0, sizeof(*q));
  q->used = true;
  q->id = id;
  q->last_sampled = -1;
  return q;
}

static int bad(struct fake *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(struct fake *f, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->why, sizeof(f->why), fmt, ap);
  va_end(ap);
  return -1;
}
#define BAD(...) bad(f, __VA_ARGS__)

/* The KV slot of position p in group g, or NULL (with f->why) when the table lacks it. */
static struct slot *slot_at(struct fake *f, const struct pr_step_seq *s, uint32_t g, uint32_t p) {
  uint32_t i = p / k_bt[g];
  if (i >= s->block_tables[g].n) {
    BAD("seq %llu: group %u has %u blocks, position %u needs block %u",
        (unsigned long long)s->seq_id, g, s->block_tables[g].n, p, i);
    return NULL;
  }
  int32_t b = s->block_tables[g].v[i];
  if (b < 0 || (uint64_t)b >= f->blocks) {
    BAD("seq %llu: group %u block %u of position %u is %d", (unsigned long long)s->seq_id, g, i, p,
        (int)b);
    return NULL;
  }
  return &f->kv[(size_t)b * MAX_BT + p % k_bt[g]];
}

static int write_kv(struct fake *f, const struct pr_step_seq *s, uint32_t p, uint32_t tok) {
  for (uint32_t g = 0; g < NGROUPS; g++) {
    struct slot *sl = slot_at(f, s, g, p);
    if (!sl) return -1;
    sl->tok = (int32_t)tok;
    sl->pos = (int32_t)p;
  }
  return 0;
}

/* Attention of query position q: every key it sees must be the sequence's own. */
static int read_kv(struct fake *f, const struct pr_step_seq *s, const struct fseq *q, uint32_t qp) {
  for (uint32_t g = 0; g < NGROUPS; g++) {
    uint32_t lo = k_win[g] && qp + 1 > k_win[g] ? qp + 1 - k_win[g] : 0;
    for (uint32_t p = lo; p <= qp; p++) {
      struct slot *sl = slot_at(f, s, g, p);
      if (!sl) return -1;
      if (sl->pos != (int32_t)p || sl->tok != (int32_t)q->history[p])
        return BAD("seq %llu: group %u position %u reads (token %d, position %d), want token %u",
                   (unsigned long long)s->seq_id, g, p, sl->tok, sl->pos, q->history[p]);
    }
  }
  return 0;
}

/* Runs one sequence of a step; fills the result at *rs when it samples. */
static int run_seq(struct fake *f, uint64_t step_id, const struct pr_step_seq *s, uint32_t ri,
                   bool *sampled) {
  *sampled = false;
  if (s->n_groups != NGROUPS)
    return BAD("seq %llu: %u block tables", (unsigned long long)s->seq_id, s->n_groups);
  if (s->tokens.n == 0) return BAD("seq %llu: no tokens", (unsigned long long)s->seq_id);
  if ((s->flags & PR_SEQ_PREV_DRAFTS) && !(s->flags & PR_SEQ_PREV_TOKEN))
    return BAD("seq %llu: PREV_DRAFTS without PREV_TOKEN", (unsigned long long)s->seq_id);
  uint32_t start = s->start_pos;
  struct fseq *q;
  if (s->flags & PR_SEQ_NEW) {
    if (!(q = create(f, s->seq_id))) return BAD("too many sequences");
    if (!s->sampling.has_seed)
      return BAD("seq %llu: NEW without a seed", (unsigned long long)s->seq_id);
    if (s->sampling.grammar_kind && !(f->flags & PR_BEAT_GRAMMARS))
      return BAD("seq %llu: a structured output before this rank said it can follow one",
                 (unsigned long long)s->seq_id);
    q->sampling = s->sampling;
    q->gen_end = s->max_tokens ? s->num_prompt + s->max_tokens : 0;
    /* a prefix-cache hit: the context before start_pos is already in the blocks */
    for (uint32_t p = 0; p < s->start_pos; p++) {
      struct slot *sl = slot_at(f, s, 0, p);
      if (!sl) return -1;
      if (sl->pos != (int32_t)p)
        return BAD("seq %llu: cached position %u holds position %d", (unsigned long long)s->seq_id,
                   p, sl->pos);
      q->history[p] = (uint32_t)sl->tok;
    }
    q->ntok = s->start_pos;
  } else {
    if (!(q = find(f, s->seq_id)))
      return BAD("seq %llu: unknown and not NEW", (unsigned long long)s->seq_id);
    /* async scheduling: a decode behind a step that accepted drafts runs after them */
    if (s->flags & PR_SEQ_PREV_TOKEN) start += q->accepted;
    if (start != q->ntok)
      return BAD("seq %llu: starts at %u (%u sent), has %u tokens", (unsigned long long)s->seq_id,
                 start, s->start_pos, q->ntok);
  }
  /* the drafts to verify: sent, or those it proposed last (PREV_DRAFTS), no more than the
   * step's slots nor past max_tokens */
  struct pr_u32s drafts = s->draft_tokens;
  if (s->flags & PR_SEQ_PREV_DRAFTS) {
    int64_t room = q->gen_end ? (int64_t)q->gen_end - start - 2 : 0;
    uint32_t n = CM_MIN(s->num_draft, q->n_prop);
    drafts = (struct pr_u32s){q->prop, (uint32_t)CM_MAX(0, CM_MIN((int64_t)n, room))};
  }
  uint32_t end = start + s->tokens.n + drafts.n;
  if (end > SCH_FAKE_MAXLEN)
    return BAD("seq %llu: runs to position %u", (unsigned long long)s->seq_id, end);
  /* async scheduling: the token to run is the one this worker sampled last */
  const uint32_t *toks = s->tokens.v;
  uint32_t prev;
  if (s->flags & PR_SEQ_PREV_TOKEN) {
    if ((s->flags & (PR_SEQ_NEW | PR_SEQ_PREFILL)) || s->tokens.n != 1 || q->last_sampled < 0)
      return BAD("seq %llu: PREV_TOKEN without a sampled token before it",
                 (unsigned long long)s->seq_id);
    prev = (uint32_t)q->last_sampled;
    toks = &prev;
  }
  if (!(s->flags & (PR_SEQ_NEW | PR_SEQ_PREFILL)) && q->last_sampled >= 0 &&
      toks[0] != (uint32_t)q->last_sampled)
    return BAD("seq %llu: decodes token %u, sampled %lld", (unsigned long long)s->seq_id, toks[0],
               (long long)q->last_sampled);
  for (uint32_t i = 0; i < s->tokens.n; i++) {
    if (toks[i] >= SCH_FAKE_VOCAB) return BAD("token %u outside the vocabulary", toks[i]);
    q->history[start + i] = toks[i];
    if (write_kv(f, s, start + i, toks[i])) return -1;
  }
  q->ntok = start + s->tokens.n;
  for (uint32_t i = 0; i < drafts.n; i++)
    if (write_kv(f, s, q->ntok + i, drafts.v[i])) return -1;
  /* the last token's slots for the drafts must exist too (num_draft reserved them) */
  if (drafts.n > s->num_draft) return BAD("more drafts than draft slots");
  if (read_kv(f, s, q, q->ntok - 1)) return -1;
  if (!(s->flags & PR_SEQ_SAMPLE)) return 0;

  /* sample, then verify drafts: each draft equal to the model's token is accepted */
  struct pr_result_seq *rs = &f->rs[ri];
  memset(rs, 0, sizeof(*rs));
  rs->seq_id = s->seq_id;
  uint32_t n = 0;
  uint32_t next = sch_fake_next(q->history, q->ntok);
  for (uint32_t i = 0; i < drafts.n && drafts.v[i] == next; i++) {
    f->rtok[ri][n++] = next;
    q->history[q->ntok++] = next;
    if (read_kv(f, s, q, q->ntok - 1)) return -1;
    next = sch_fake_next(q->history, q->ntok);
  }
  rs->num_accepted = q->accepted = n;
  rs->num_verified = drafts.n;
  f->rtok[ri][n++] = next;
  q->last_sampled = next;
  rs->tokens = (struct pr_u32s){f->rtok[ri], n};
  if (q->sampling.logprobs >= 0) {
    for (uint32_t i = 0; i < n; i++)
      f->rlp[ri][i] = -(float)(f->rtok[ri][i] % 10) / 10.0f;
    rs->logprobs.sampled = (struct pr_f32s){f->rlp[ri], n};
  }
  /* propose the model's true continuation, with the last draft wrong on odd steps */
  uint32_t k = CM_MIN(s->num_draft, f->max_draft);
  if (k) {
    uint32_t tmp[SCH_FAKE_MAXLEN + 2 * PR_MAX_DRAFT + 2];
    memcpy(tmp, q->history, q->ntok * sizeof(uint32_t));
    uint32_t len = q->ntok;
    tmp[len++] = next;
    for (uint32_t i = 0; i < k; i++) {
      f->rdraft[ri][i] = sch_fake_next(tmp, len);
      tmp[len++] = f->rdraft[ri][i];
    }
    if (step_id % 2) f->rdraft[ri][k - 1] = (f->rdraft[ri][k - 1] + 1) % SCH_FAKE_VOCAB;
    rs->drafts = (struct pr_u32s){f->rdraft[ri], k};
  }
  memcpy(q->prop, f->rdraft[ri], k * sizeof(uint32_t));
  q->n_prop = k;
  *sampled = true;
  return 0;
}

static void send_fail(struct fake *f, uint64_t step_id, const char *why) {
  fprintf(stderr, "sch-fake-worker rank %u: step %llu: %s\n", f->rank, (unsigned long long)step_id,
          why);
  struct pr_msg m;
  pr_msg_init(&m, PR_FAIL);
  m.u.fail = (struct pr_fail){f->rank, step_id, CM_ERR_STATE, why};
  pr_sock_send(f->sock, NULL, &m, 0);
}

static void on_step(struct fake *f, const struct pr_step *st) {
  if (f->slow_ms) cm_time_sleep_ns((uint64_t)f->slow_ms * 1000000ull);
  if (f->fail_at_step && ++f->steps_taken >= f->fail_at_step) {
    send_fail(f, st->step_id, "injected failure");
    f->fail_at_step = 0;
    return;
  }
  for (uint32_t i = 0; i < st->free_ids.n; i++) {
    struct fseq *q = find(f, st->free_ids.v[i]);
    if (q) q->used = false;
  }
  if (st->n_seqs > MAX_SEQS) return send_fail(f, st->step_id, "too many sequences");
  uint32_t nr = 0;
  for (uint32_t i = 0; i < st->n_seqs; i++) {
    bool sampled;
    if (run_seq(f, st->step_id, &st->seqs[i], nr, &sampled))
      return send_fail(f, st->step_id, f->why);
    if (sampled) {
      nr++;
    } else if (f->empty_results) {
      memset(&f->rs[nr], 0, sizeof(f->rs[nr]));
      f->rs[nr++].seq_id = st->seqs[i].seq_id;
    }
  }
  if (f->rank != 0) return;
  struct pr_msg m;
  pr_msg_init(&m, PR_RESULT);
  m.u.result = (struct pr_result){f->rank, st->step_id, f->rs, nr};
  int rc = pr_sock_send(f->sock, NULL, &m, 0);
  if (rc) fprintf(stderr, "sch-fake-worker: RESULT not sent: %s\n", cm_strerror(rc));
}

int main(int argc, char **argv) {
  const char *ep = NULL;
  int empty_results = 0, grammar_fail = 0;
  int64_t rank = 0, world = 1, blocks = 256, beat_ms = 200, max_draft = 0, slow_ms = 0, fail_at = 0,
          grammar_ms = 0, n_lora = 0;
  struct cm_opt opts[] = {
      {"endpoint", CM_OPT_STR, &ep, "EP", "scheduler worker endpoint", 0, 0, 0, 0, NULL},
      {"rank", CM_OPT_INT, &rank, "R", "rank", 0, 1023, 0, 0, NULL},
      {"world-size", CM_OPT_INT, &world, "N", "ranks", 1, 1024, 0, 0, NULL},
      {"blocks", CM_OPT_INT, &blocks, "B", "KV blocks", 1, 1 << 20, 0, 0, NULL},
      {"beat-ms", CM_OPT_INT, &beat_ms, "MS", "heartbeat period", 1, 60000, 0, 0, NULL},
      {"max-draft", CM_OPT_INT, &max_draft, "K", "drafts proposed", 0, PR_MAX_DRAFT, 0, 0, NULL},
      {"slow-ms", CM_OPT_INT, &slow_ms, "MS", "sleep per step", 0, 10000, 0, 0, NULL},
      {"empty-results", CM_OPT_BOOL, &empty_results, NULL,
       "list non-sampling sequences in RESULT with no tokens", 0, 0, 0, 0, NULL},
      {"fail-at-step", CM_OPT_INT, &fail_at, "S", "answer FAIL to the S-th STEP received, once", 0,
       INT32_MAX, 0, 0, NULL},
      {"grammar-ms", CM_OPT_INT, &grammar_ms, "MS",
       "build the structured-output state in MS after CTRL GRAMMARS", 0, 60000, 0, 0, NULL},
      {"loras", CM_OPT_INT, &n_lora, "N",
       "say N LoRA adapters in READY, their list's sum SCH_FAKE_LORA_SUM + N", 0, PR_MAX_LORAS, 0,
       0, NULL},
      {"grammar-fail", CM_OPT_BOOL, &grammar_fail, NULL,
       "building the structured-output state fails", 0, 0, 0, 0, NULL},
      {0},
  };
  int rc = cm_args_parse("sch-fake-worker", "fake worker rank", opts, argc, argv, 1, NULL, 0, NULL);
  if (rc == CM_ARGS_HELP) return 0;
  if (rc < 0 || !ep) return 2;
  signal(SIGPIPE, SIG_IGN);
  static struct fake fk;
  struct fake *f = &fk;
  f->rank = (uint32_t)rank;
  f->world = (uint32_t)world;
  f->blocks = (uint64_t)blocks;
  f->max_draft = (uint32_t)max_draft;
  f->slow_ms = (int)slow_ms;
  f->empty_results = empty_results != 0;
  f->fail_at_step = (uint64_t)fail_at;
  f->grammar_ms = grammar_ms;
  f->grammar_fail = grammar_fail != 0;
  f->kv = malloc((size_t)blocks * MAX_BT * sizeof(*f->kv));
  f->seqs = calloc(MAX_SEQS, sizeof(*f->seqs));
  if (!f->kv || !f->seqs) return 1;
  for (size_t i = 0; i < (size_t)blocks * MAX_BT; i++)
    f->kv[i] = (struct slot){-1, -1};
  void *ctx = zmq_ctx_new();
  if ((rc = pr_sock_open(ctx, ZMQ_DEALER, 0, &f->sock)) || (rc = pr_sock_connect(f->sock, ep)))
    return 1;

  struct pr_kv_group groups[NGROUPS];
  for (int g = 0; g < NGROUPS; g++)
    groups[g] = (struct pr_kv_group){k_bt[g], 1, 64, k_win[g]};
  uint32_t eos[1] = {SCH_FAKE_EOS};
  struct pr_msg m;
  pr_msg_init(&m, PR_READY);
  m.u.ready = (struct pr_ready){f->rank,        f->world,        f->blocks, groups,      NGROUPS,
                                SCH_FAKE_VOCAB, SCH_FAKE_MAXLEN, {eos, 1},  f->max_draft};
  m.u.ready.n_lora = (uint32_t)n_lora;
  m.u.ready.lora_sum = n_lora ? SCH_FAKE_LORA_SUM + (uint64_t)n_lora : 0;
  if ((rc = pr_sock_send(f->sock, NULL, &m, 0))) return 1;

  struct cm_arena arena;
  cm_arena_init(&arena, 1 << 20, 256u << 20);
  uint64_t next_beat = cm_time_ns(), last_step = 0;
  int code = 0;
  for (;;) {
    uint64_t now = cm_time_ns();
    if (f->grammar_at && now >= f->grammar_at && !f->flags) {
      f->flags = f->grammar_fail ? PR_BEAT_GRAMMARS_FAILED : PR_BEAT_GRAMMARS;
      next_beat = now;
    }
    if (now >= next_beat) {
      pr_msg_init(&m, PR_BEAT);
      m.u.beat = (struct pr_beat){f->rank, last_step, cm_time_wall_ns(), f->flags};
      pr_sock_send(f->sock, NULL, &m, 0);
      next_beat = now + (uint64_t)beat_ms * 1000000ull;
    }
    zmq_pollitem_t it = {pr_sock_zmq(f->sock), 0, ZMQ_POLLIN, 0};
    long wait_ms = (long)beat_ms;
    if (f->grammar_at && !f->flags)
      wait_ms =
          CM_MIN(wait_ms, (long)((f->grammar_at - CM_MIN(now, f->grammar_at)) / 1000000u) + 1);
    if (zmq_poll(&it, 1, wait_ms) < 0 && zmq_errno() != EINTR) break;
    for (;;) {
      cm_arena_reset(&arena);
      rc = pr_sock_recv(f->sock, NULL, &m, &arena, PR_DONTWAIT);
      if (rc == CM_ERR_AGAIN) break;
      if (rc) {
        fprintf(stderr, "sch-fake-worker: bad message: %s\n", cm_strerror(rc));
        continue;
      }
      if (m.type == PR_STEP) {
        on_step(f, &m.u.step);
        last_step = m.u.step.step_id;
      } else if (m.type == PR_CTRL && m.u.ctrl.op == PR_CTRL_SHUTDOWN) {
        goto out;
      } else if (m.type == PR_CTRL && m.u.ctrl.op == PR_CTRL_GRAMMARS) {
        if (!f->grammar_at) f->grammar_at = cm_time_ns() + (uint64_t)f->grammar_ms * 1000000ull;
      } else {
        fprintf(stderr, "sch-fake-worker: unexpected %s\n", pr_type_name(m.type));
      }
    }
  }
  code = 1;
out:
  cm_arena_free(&arena);
  pr_sock_close(f->sock);
  zmq_ctx_term(ctx);
  free(f->kv);
  free(f->seqs);
  return code;
}
