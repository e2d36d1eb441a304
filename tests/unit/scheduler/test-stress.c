/* test-stress.c — randomized scheduling: thousands of steps with random arrivals,
 * prompt lengths (many sharing prefixes), stop conditions, aborts in every state (also
 * while a step is in flight) and speculative results with random acceptance, over small
 * pools that force preemption. After every plan and every apply it checks the engine's
 * invariants and the plan's promises; at the end every request that was not aborted
 * must have produced exactly the tokens plain decoding gives, and the pool must be
 * empty again. */
#include <stdio.h>
#include <stdlib.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-hash.h"
#include "scheduler/sch-engine-impl.h"
#include "tests/harness/th.h"
#include "tests/unit/scheduler/sch-test-util.h"

#define MAX_REQS 4096
#define MAX_LEN  128

struct tracked {
  uint64_t id;
  int32_t prompt[MAX_LEN];
  int32_t plen, max_tokens, stop_id;
  bool ignore_eos, live, aborted, finished;
  int32_t out[MAX_LEN];
  int32_t nout;
  int32_t proposed; /* drafts its last applied result proposed */
  enum sch_finish fin;
  int64_t arrived, done; /* steps */
};

/* What a KV slot holds: the token whose key/value was written, and its position. */
struct slot {
  int32_t tok, pos;
};

struct stress {
  struct sch_engine *e;
  struct sch_engine_config cfg;
  struct tracked *reqs; /* [MAX_REQS], index = id - 1 */
  int32_t nreqs;
  uint64_t rng;
  int64_t steps, rejected, aborted_inflight, failed, resets;
  int32_t prefixes[4][MAX_LEN];
  struct slot *kv; /* [num_blocks, maxbt] the fake workers' KV memory */
  int32_t maxbt;
  int64_t kv_reads; /* key positions verified */
  int64_t moved;    /* async decodes run after drafts their step in flight accepted */
};

static uint64_t rnd(struct stress *s, uint64_t n) {
  return cm_xorshift64(&s->rng) % n;
}

static bool is_eos(const struct sch_engine_config *c, int32_t t) {
  for (int32_t i = 0; i < c->num_eos_ids; i++)
    if (c->eos_ids[i] == t) return true;
  return false;
}

/* What plain decoding produces for r, and why it ends. */
static int32_t expected(const struct stress *s, const struct tracked *r, int32_t *out,
                        enum sch_finish *fin) {
  int32_t prev = r->prompt[r->plen - 1], n = 0;
  *fin = SCH_FINISH_LENGTH;
  while (n < r->max_tokens) {
    int32_t t = fake_next(prev, r->plen + n);
    out[n++] = prev = t;
    if ((!r->ignore_eos && is_eos(&s->cfg, t)) || t == r->stop_id) {
      *fin = SCH_FINISH_STOP;
      break;
    }
  }
  return n;
}

static void arrive(struct stress *s) {
  if (s->nreqs >= MAX_REQS) return;
  struct tracked *r = &s->reqs[s->nreqs];
  memset(r, 0, sizeof(*r));
  r->id = (uint64_t)s->nreqs + 1;
  r->plen = 1 + (int32_t)rnd(s, 70);
  int32_t shared = rnd(s, 3) ? (int32_t)rnd(s, (uint64_t)r->plen + 1) : 0;
  const int32_t *pre = s->prefixes[rnd(s, 4)];
  for (int32_t i = 0; i < r->plen; i++)
    r->prompt[i] = i < shared ? pre[i] : 10 + (int32_t)rnd(s, 1000);
  r->max_tokens = 1 + (int32_t)rnd(s, rnd(s, 4) ? 20 : 60);
  r->ignore_eos = rnd(s, 4) == 0;
  r->stop_id = rnd(s, 3) == 0 ? 10 + (int32_t)rnd(s, 1000) : -1;
  struct sch_request_params p = {0};
  p.id = r->id;
  p.prompt = r->prompt;
  p.prompt_len = r->plen;
  p.max_tokens = r->max_tokens;
  p.ignore_eos = r->ignore_eos;
  p.stop_token_ids = &r->stop_id;
  p.num_stop_token_ids = r->stop_id >= 0;
  p.priority = s->cfg.max_waiting > 100 ? (int32_t)rnd(s, 3) : 0;
  char err[256];
  int rc = sch_engine_add(s->e, &p, err, sizeof(err));
  if (rc == CM_ERR_TOOBIG || rc == CM_ERR_FULL) {
    TH_CHECK(rc == CM_ERR_FULL || r->plen + r->max_tokens > s->cfg.max_model_len ||
             strstr(err, "KV cache blocks") != NULL);
    s->rejected++;
    return;
  }
  TH_REQUIRE(rc == 0);
  r->live = true;
  r->arrived = s->steps;
  s->nreqs++;
}

static void abort_random(struct stress *s, bool inflight) {
  if (s->nreqs == 0) return;
  struct tracked *r = &s->reqs[rnd(s, (uint64_t)s->nreqs)];
  if (!r->live) return;
  TH_CHECK_EQ_INT(sch_engine_abort(s->e, r->id), 0);
  r->live = false;
  r->aborted = true;
  s->aborted_inflight += inflight;
}

/* The plan's promises: budget and cap, tables that cover what runs, and no block that
 * one sequence writes is shared with another table or holds cached content. */
static void check_plan(struct stress *s, const struct sch_plan *plan) {
  const struct sch_engine_config *c = &s->cfg;
  TH_CHECK(plan->num_tokens <= c->max_num_batched_tokens);
  TH_CHECK(plan->num_seqs <= c->max_num_seqs);
  int32_t total = 0;
  for (int32_t i = 0; i < plan->num_seqs; i++) {
    const struct sch_plan_seq *q = &plan->seqs[i];
    struct tracked *r = &s->reqs[q->req_id - 1];
    TH_REQUIRE(r->live);
    total += q->num_tokens + q->num_draft;
    int32_t end = q->start_pos + q->num_tokens + q->num_draft;
    TH_CHECK(q->num_tokens >= 1 && end <= r->plen + r->max_tokens);
    TH_CHECK(q->num_draft == 0 || (q->num_tokens == 1 && q->sample));
    /* the tokens to run are the request's own: prompt, then what it generated; a
     * decode behind a step in flight (async) runs the token that step samples, which
     * goes right after the outputs taken so far */
    if (q->tokens[0] == SCH_TOKEN_PREV) {
      TH_CHECK(s->cfg.async_scheduling && q->num_tokens == 1 && q->sample);
      TH_CHECK_EQ_INT(q->start_pos, r->plen + r->nout);
    } else {
      /* no draft slots past the drafts its last result proposed */
      TH_CHECK(q->num_draft <= r->proposed);
    }
    for (int32_t j = q->tokens[0] == SCH_TOKEN_PREV; j < q->num_tokens; j++) {
      int32_t pos = q->start_pos + j;
      int32_t want = pos < r->plen ? r->prompt[pos] : r->out[pos - r->plen];
      if (q->tokens[j] != want) {
        th_fail(__FILE__, __LINE__, "request %llu position %d: token %d, want %d",
                (unsigned long long)q->req_id, (int)pos, (int)q->tokens[j], (int)want);
        th_stop();
      }
    }
    for (int32_t g = 0; g < c->num_groups; g++) {
      int32_t bt = c->groups[g].block_tokens, w = c->groups[g].window;
      TH_REQUIRE(q->num_blocks[g] * bt >= end);
      int32_t lo = w > 0 ? q->start_pos - w + 1 : 0;
      if (lo < 0) lo = 0;
      for (int32_t b = lo / bt; b < q->num_blocks[g]; b++) {
        int32_t id = q->block_table[g][b];
        TH_REQUIRE(id >= 0);
        if ((b + 1) * bt <= q->start_pos) continue; /* read only */
        /* written this step: private and not registered as cached content */
        TH_CHECK_EQ_INT(sch_block_pool_refcount(s->e->pool, id), 1);
        TH_CHECK(!sch_block_pool_is_hashed(s->e->pool, id) || (b + 1) * bt <= q->start_pos);
      }
    }
  }
  TH_CHECK_EQ_INT(total, plan->num_tokens);
}

/* The token at pos: the prompt's, an output taken, or past those (the accepted drafts
 * of a step whose result is not applied yet, async; past a stop too, where that step's
 * result will end the request) the fake model's continuation. */
static int32_t true_token(const struct tracked *r, int32_t pos) {
  if (pos < r->plen) return r->prompt[pos];
  if (pos - r->plen < r->nout) return r->out[pos - r->plen];
  int32_t t = r->nout ? r->out[r->nout - 1] : r->prompt[r->plen - 1];
  for (int32_t p = r->plen + r->nout; p <= pos; p++)
    t = fake_next(t, p);
  return t;
}

static struct slot *slot_of(struct stress *s, const struct sch_plan_seq *q, int32_t g,
                            int32_t pos) {
  int32_t bt = s->cfg.groups[g].block_tokens;
  TH_REQUIRE(pos / bt < q->num_blocks[g]);
  int32_t id = q->block_table[g][pos / bt];
  TH_REQUIRE(id >= 0 && id < s->cfg.num_blocks);
  return &s->kv[(size_t)id * (size_t)s->maxbt + (size_t)(pos % bt)];
}

/* Plays the workers' KV memory: first every sequence's attention reads the keys before
 * its step (all of them for a full group, the window for a sliding one) through its
 * tables and checks each holds the right token at the right position — so shared prefix
 * blocks, holes, rollbacks and recomputes are all checked by content — then the step
 * writes its tokens and its drafts (accepted ones true, rejected ones garbage). */
static void simulate_kv(struct stress *s, const struct sch_plan *plan,
                        const struct fake_worker *w) {
  for (int32_t i = 0; i < plan->num_seqs; i++) {
    const struct sch_plan_seq *q = &plan->seqs[i];
    const struct tracked *r = &s->reqs[q->req_id - 1];
    for (int32_t g = 0; g < s->cfg.num_groups; g++) {
      int32_t win = s->cfg.groups[g].window;
      int32_t lo = win > 0 && q->start_pos - win + 1 > 0 ? q->start_pos - win + 1 : 0;
      for (int32_t p = lo; p < q->start_pos; p++) {
        const struct slot *sl = slot_of(s, q, g, p);
        if (sl->pos != p || sl->tok != true_token(r, p)) {
          th_fail(__FILE__, __LINE__,
                  "request %llu group %d: key %d holds token %d of position %d, want %d",
                  (unsigned long long)q->req_id, (int)g, (int)p, (int)sl->tok, (int)sl->pos,
                  (int)true_token(r, p));
          th_stop();
        }
      }
      s->kv_reads += q->start_pos - lo;
    }
  }
  for (int32_t i = 0; i < plan->num_seqs; i++) {
    const struct sch_plan_seq *q = &plan->seqs[i];
    const struct sch_seq_result *res = NULL;
    for (int32_t j = 0; j < w->num; j++)
      if (w->res[j].req_id == q->req_id) res = &w->res[j];
    for (int32_t g = 0; g < s->cfg.num_groups; g++) {
      for (int32_t j = 0; j < q->num_tokens; j++)
        *slot_of(s, q, g, q->start_pos + j) = (struct slot){q->tokens[j], q->start_pos + j};
      for (int32_t d = 1; d <= q->num_draft; d++) {
        TH_REQUIRE(res != NULL);
        int32_t pos = q->start_pos + q->num_tokens - 1 + d;
        int32_t tok = d < res->num_tokens ? res->tokens[d - 1] : -7;
        *slot_of(s, q, g, pos) = (struct slot){tok, pos};
      }
    }
  }
}

/* Feeds apply a corrupted copy of the results (one missing, too many tokens, a token
 * out of the vocabulary, a duplicate): each must be refused and change nothing. */
static void bad_results(struct stress *s, const struct fake_worker *w) {
  static struct sch_seq_result bad[FAKE_MAX_SEQS + 1];
  static int32_t toks[FAKE_MAX_TOKENS + 1];
  int32_t victim = -1, draft = 0;
  for (int32_t j = 0; j < w->num && victim < 0; j++) {
    /* a result the engine still waits for (with async scheduling a request still live
     * may have left the step: preempted by the plan behind it) */
    struct sch_request *r = sch_queue_find(&s->e->q, w->res[j].req_id);
    const struct sch_req_sched *sc =
        r && r->state == SCH_REQ_RUNNING ? sch_engine_flight_sched(s->e, r, 0) : NULL;
    if (s->reqs[w->res[j].req_id - 1].live && sc) {
      victim = j;
      draft = sc->draft; /* the slots planned (the workers may have verified fewer) */
    }
  }
  if (victim < 0) return;
  int32_t n = w->num, kind = (int32_t)rnd(s, 4);
  memcpy(bad, w->res, (size_t)n * sizeof(*bad));
  memcpy(toks, bad[victim].tokens, (size_t)bad[victim].num_tokens * sizeof(int32_t));
  switch (kind) {
  case 0: bad[victim] = bad[--n]; break;
  case 1:
    toks[draft + 1] = 42;
    bad[victim].tokens = toks;
    bad[victim].num_tokens = draft + 2;
    break;
  case 2:
    toks[0] = rnd(s, 2) ? -1 : s->cfg.vocab_size;
    bad[victim].tokens = toks;
    break;
  default: bad[n++] = bad[victim]; break;
  }
  struct sch_outputs o;
  TH_CHECK_EQ_INT(sch_engine_apply(s->e, bad, n, &o), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(o.num, 0);
  CHECK_ENGINE(s->e);
}

static void take_outputs(struct stress *s, const struct sch_outputs *o) {
  for (int32_t i = 0; i < o->num; i++) {
    const struct sch_output *x = &o->items[i];
    struct tracked *r = &s->reqs[x->req_id - 1];
    TH_REQUIRE(r->live && r->nout + x->num_new <= r->max_tokens);
    memcpy(r->out + r->nout, x->new_tokens, (size_t)x->num_new * sizeof(int32_t));
    r->nout += x->num_new;
    TH_CHECK_EQ_INT(x->num_generated, r->nout);
    if (x->finish != SCH_FINISH_NONE) {
      r->live = false;
      r->finished = true;
      r->fin = x->finish;
      r->done = s->steps;
    }
  }
}

/* The results of the step the workers ran are applied (an abort may land just before,
 * and now and then a corrupted copy of them is refused first). */
static void apply_results(struct stress *s, const struct fake_worker *w, bool arrivals) {
  if (arrivals && rnd(s, 8) == 0) abort_random(s, true);
  if (rnd(s, 10) == 0) bad_results(s, w);
  struct sch_outputs o;
  TH_REQUIRE(sch_engine_apply(s->e, w->res, w->num, &o) == 0);
  CHECK_ENGINE(s->e);
  for (int32_t j = 0; j < w->num; j++)
    s->reqs[w->res[j].req_id - 1].proposed = w->res[j].num_proposed;
  take_outputs(s, &o);
}

/* The fake workers' KV memory holds nothing (start, or a worker that restarted). */
static void kv_wipe(struct stress *s) {
  for (size_t i = 0; i < (size_t)s->cfg.num_blocks * (size_t)s->maxbt; i++)
    s->kv[i] = (struct slot){-1, -1};
}

/* A worker failed the steps in flight; rarely it restarted and its KV memory is gone. */
static void worker_failed(struct stress *s) {
  if (rnd(s, 4) == 0) {
    sch_engine_reset_kv(s->e);
    kv_wipe(s);
    s->resets++;
  } else {
    sch_engine_step_failed(s->e);
    s->failed++;
  }
}

/* The run's state: requests, shared prefixes, the engine and the fake workers'
 * KV memory, all empty. */
static void stress_init(struct stress *s, const struct sch_engine_config *cfg, uint64_t seed) {
  memset(s, 0, sizeof(*s));
  s->cfg = *cfg;
  s->rng = seed;
  s->reqs = calloc(MAX_REQS, sizeof(*s->reqs));
  TH_REQUIRE(s->reqs != NULL);
  for (int p = 0; p < 4; p++)
    for (int i = 0; i < MAX_LEN; i++)
      s->prefixes[p][i] = 10 + (int32_t)rnd(s, 1000);
  char err[256];
  TH_REQUIRE(sch_engine_create(&s->cfg, &s->e, err, sizeof(err)) == 0);
  for (int32_t g = 0; g < cfg->num_groups; g++)
    if (cfg->groups[g].block_tokens > s->maxbt) s->maxbt = cfg->groups[g].block_tokens;
  s->kv = malloc((size_t)cfg->num_blocks * (size_t)s->maxbt * sizeof(*s->kv));
  TH_REQUIRE(s->kv != NULL);
  kv_wipe(s);
}

/* At the end: nothing runs or waits, no block is held, every request ended, and
 * each that was not aborted produced what plain decoding gives. Returns how many
 * finished; *max_wait: the most steps one took from arrival to its end. */
static int64_t check_outputs(struct stress *s, struct sch_engine_stats *st, int64_t *max_wait) {
  sch_engine_stats(s->e, st);
  TH_CHECK_EQ_INT(st->num_running + st->num_waiting, 0);
  TH_CHECK_EQ_INT(st->num_blocks_used, 0);
  TH_CHECK_NEAR(st->kv_usage, 0.0, 1e-12);
  int32_t want[MAX_LEN];
  int64_t finished = 0;
  *max_wait = 0;
  for (int32_t i = 0; i < s->nreqs; i++) {
    struct tracked *r = &s->reqs[i];
    TH_CHECK(!r->live); /* nobody starves: everything ended */
    if (r->aborted) continue;
    finished++;
    enum sch_finish fin;
    int32_t n = expected(s, r, want, &fin);
    if (n != r->nout || memcmp(want, r->out, (size_t)n * sizeof(int32_t)) != 0 || fin != r->fin) {
      th_fail(__FILE__, __LINE__, "request %llu: %d tokens (finish %d), want %d (finish %d)",
              (unsigned long long)r->id, (int)r->nout, (int)r->fin, (int)n, (int)fin);
      break;
    }
    if (r->done - r->arrived > *max_wait) *max_wait = r->done - r->arrived;
  }
  return finished;
}

static void stress_free(struct stress *s) {
  sch_engine_destroy(s->e);
  free(s->reqs);
  free(s->kv);
}

static void run(const struct sch_engine_config *cfg, uint64_t seed, int32_t steps) {
  struct stress s;
  stress_init(&s, cfg, seed);
  struct fake_worker *w = calloc(1, sizeof(*w));
  TH_REQUIRE(w != NULL);
  w->rng = seed * 7 + 1;
  int64_t idle = 0;
  for (s.steps = 0; s.steps < steps * 10; s.steps++) {
    bool arrivals = s.steps < steps;
    if (arrivals)
      if (rnd(&s, 5) < 2) arrive(&s);
    if (arrivals && rnd(&s, 10) == 0) abort_random(&s, false);
    struct sch_plan plan;
    TH_REQUIRE(sch_engine_plan_step(s.e, &plan) == 0);
    CHECK_ENGINE(s.e);
    check_plan(&s, &plan);
    struct sch_engine_stats st;
    sch_engine_stats(s.e, &st);
    if (plan.num_seqs == 0) {
      /* nothing runs only when nothing is left */
      TH_REQUIRE(st.num_running == 0 && st.num_waiting == 0);
      if (!arrivals && ++idle > 2) break;
      continue;
    }
    fake_answer(w, &plan, 0);
    simulate_kv(&s, &plan, w);
    if (arrivals && rnd(&s, 300) == 0) {
      worker_failed(&s);
      CHECK_ENGINE(s.e);
      continue;
    }
    apply_results(&s, w, arrivals);
  }
  struct sch_engine_stats st;
  int64_t max_wait, finished = check_outputs(&s, &st, &max_wait);
  printf("  seed %llu: %d requests (%lld finished, %lld rejected), %lld steps, %llu "
         "preemptions, prefix hits %llu/%llu tokens, %llu evictions, drafts %llu accepted "
         "%llu/%llu, longest request %lld steps, %lld keys verified, %lld failed steps, %lld KV "
         "resets\n",
         (unsigned long long)seed, (int)s.nreqs, (long long)finished, (long long)s.rejected,
         (long long)s.steps, (unsigned long long)st.num_preemptions,
         (unsigned long long)st.prefix_hits, (unsigned long long)st.prefix_queries,
         (unsigned long long)st.num_evictions, (unsigned long long)st.spec_num_drafts,
         (unsigned long long)st.spec_num_accepted_tokens,
         (unsigned long long)st.spec_num_draft_tokens, (long long)max_wait, (long long)s.kv_reads,
         (long long)s.failed, (long long)s.resets);
  TH_CHECK(finished > 0);
  /* under FCFS every request ends within a bounded number of steps (with priorities a
   * low one may wait as long as higher ones keep arriving) */
  if (cfg->max_waiting <= 100) TH_CHECK(max_wait < 1500);
  stress_free(&s);
  free(w);
}

/* ---- async scheduling: a step planned while the one before is in flight --------- */

/* A plan as the scheduler sends it (copied: the engine's pointers move). */
struct sent {
  struct sch_plan plan;
  struct sch_plan_seq *seqs;
  int32_t *toks, *tables;
};

static void sent_copy(struct sent *d, const struct sch_plan *p, int32_t ngroups) {
  size_t ntok = 0, ntab = 0;
  for (int32_t i = 0; i < p->num_seqs; i++) {
    ntok += (size_t)p->seqs[i].num_tokens;
    for (int32_t g = 0; g < ngroups; g++)
      ntab += (size_t)p->seqs[i].num_blocks[g];
  }
  d->plan = *p;
  d->seqs = malloc(sizeof(*d->seqs) * (size_t)(p->num_seqs + 1));
  d->toks = malloc(sizeof(int32_t) * (ntok + 1));
  d->tables = malloc(sizeof(int32_t) * (ntab + 1));
  TH_REQUIRE(d->seqs && d->toks && d->tables);
  int32_t *t = d->toks, *b = d->tables;
  for (int32_t i = 0; i < p->num_seqs; i++) {
    d->seqs[i] = p->seqs[i];
    memcpy(t, p->seqs[i].tokens, sizeof(int32_t) * (size_t)p->seqs[i].num_tokens);
    d->seqs[i].tokens = t;
    t += p->seqs[i].num_tokens;
    for (int32_t g = 0; g < ngroups; g++) {
      memcpy(b, p->seqs[i].block_table[g], sizeof(int32_t) * (size_t)p->seqs[i].num_blocks[g]);
      d->seqs[i].block_table[g] = b;
      b += p->seqs[i].num_blocks[g];
    }
  }
  d->plan.seqs = d->seqs;
}

static void sent_free(struct sent *d) {
  free(d->seqs), free(d->toks), free(d->tables);
}

/* What the workers keep of a sequence's latest sampling step. */
struct kept {
  int32_t last;     /* the token it sampled last (-1: none yet) */
  int32_t accepted; /* drafts that step accepted */
  int32_t proposed; /* drafts it proposed for the next step (its result's num_proposed) */
};

/* The workers take the next step as PR_SEQ_PREV_TOKEN / PR_SEQ_PREV_DRAFTS say: each
 * SCH_TOKEN_PREV becomes the token they sampled last for that sequence, which runs
 * after the drafts that step accepted, and it verifies the drafts that step proposed,
 * no more than max_tokens leave room for; then the step runs (a random number of
 * drafts accepted) and what it sampled and proposed is kept. */
static void run_sent(struct stress *s, struct sent *d, struct fake_worker *w, struct kept *kept) {
  for (int32_t i = 0; i < d->plan.num_seqs; i++) {
    struct sch_plan_seq *q = &d->seqs[i];
    if (q->tokens[0] != SCH_TOKEN_PREV) continue;
    const struct kept *k = &kept[q->req_id - 1];
    const struct tracked *r = &s->reqs[q->req_id - 1];
    TH_REQUIRE(k->last >= 0);
    ((int32_t *)q->tokens)[0] = k->last;
    q->start_pos += k->accepted;
    s->moved += k->accepted > 0;
    int32_t room = r->max_tokens - (q->start_pos + 1 - r->plen) - 1;
    q->num_draft = CM_MAX(0, CM_MIN(q->num_draft, CM_MIN(k->proposed, room)));
  }
  fake_answer(w, &d->plan, 0);
  simulate_kv(s, &d->plan, w);
  for (int32_t j = 0; j < w->num; j++) {
    struct kept *k = &kept[w->res[j].req_id - 1];
    k->last = w->res[j].tokens[w->res[j].num_tokens - 1];
    k->accepted = w->res[j].num_tokens - 1;
    k->proposed = w->res[j].num_proposed;
  }
}

/* The stress run with async scheduling: a step is planned while the one before it
 * is in flight, the workers run steps in order and results are applied in order;
 * aborts land between any two of those, and a request that stopped in step N still
 * runs in step N + 1; with drafts, step N + 1's positions move by the drafts step N
 * accepted, which only the workers know when it is planned. Every request must
 * produce what plain decoding gives. */
static void run_async_one(const struct sch_engine_config *cfg, uint64_t seed, int32_t steps) {
  struct sch_engine_config acfg = *cfg;
  acfg.async_scheduling = true;
  struct stress s;
  stress_init(&s, &acfg, seed);
  struct kept *last = malloc(sizeof(*last) * MAX_REQS);
  struct fake_worker *w = calloc(1, sizeof(*w));
  TH_REQUIRE(last && w);
  for (int32_t i = 0; i < MAX_REQS; i++)
    last[i] = (struct kept){-1, 0, 0};
  w->rng = seed * 7 + 1;
  struct sent q[2];
  int32_t nq = 0, idle = 0;
  int64_t ahead = 0; /* steps planned while another was in flight */
  for (s.steps = 0; s.steps < steps * 10; s.steps++) {
    bool arrivals = s.steps < steps;
    if (arrivals && rnd(&s, 5) < 2) arrive(&s);
    if (arrivals && rnd(&s, 10) == 0) abort_random(&s, nq > 0);
    bool empty = true;
    if (nq < 2) {
      struct sch_plan plan;
      TH_REQUIRE(sch_engine_plan_step(s.e, &plan) == 0);
      CHECK_ENGINE(s.e);
      check_plan(&s, &plan);
      empty = plan.num_seqs == 0;
      if (!empty) {
        ahead += nq;
        sent_copy(&q[nq++], &plan, cfg->num_groups);
      }
    } else {
      struct sch_plan refused;
      TH_CHECK_EQ_INT(sch_engine_plan_step(s.e, &refused), CM_ERR_STATE);
    }
    if (nq == 0) {
      struct sch_engine_stats st;
      sch_engine_stats(s.e, &st);
      TH_REQUIRE(st.num_running == 0 && st.num_waiting == 0); /* nothing left */
      if (!arrivals && ++idle > 2) break;
      continue;
    }
    if (nq < 2 && !empty) continue; /* plan the next one before the workers finish this */
    run_sent(&s, &q[0], w, last);
    if (arrivals && rnd(&s, 300) == 0) { /* a worker failed: every step in flight is lost */
      worker_failed(&s);
      for (int32_t i = 0; i < nq; i++)
        sent_free(&q[i]);
      nq = 0;
      CHECK_ENGINE(s.e);
      continue;
    }
    apply_results(&s, w, arrivals);
    sent_free(&q[0]);
    q[0] = q[1];
    nq--;
  }
  for (int32_t i = 0; i < nq; i++)
    sent_free(&q[i]);
  struct sch_engine_stats st;
  int64_t max_wait, finished = check_outputs(&s, &st, &max_wait);
  printf("  async seed %llu: %d requests (%lld finished), %lld steps, %lld planned ahead, "
         "%llu preemptions, drafts accepted %llu/%llu, %lld decodes moved by them, %lld keys "
         "verified, %lld failed steps, %lld KV resets\n",
         (unsigned long long)seed, (int)s.nreqs, (long long)finished, (long long)s.steps,
         (long long)ahead, (unsigned long long)st.num_preemptions,
         (unsigned long long)st.spec_num_accepted_tokens,
         (unsigned long long)st.spec_num_draft_tokens, (long long)s.moved, (long long)s.kv_reads,
         (long long)s.failed, (long long)s.resets);
  TH_CHECK(finished > 0 && ahead > s.steps / 4);
  if (cfg->num_spec_tokens > 0) TH_CHECK(s.moved > 100);
  stress_free(&s);
  free(w), free(last);
}

/* run_async_one from eight seeds: preemptions while a step is in flight, and the draft
 * counts they leave behind, come in many orders (seed, seed + 1000, ...). */
static void run_async(const struct sch_engine_config *cfg, uint64_t seed, int32_t steps) {
  for (uint64_t k = 0; k < 8; k++)
    run_async_one(cfg, seed + 1000 * k, steps);
}

static void base_config(struct sch_engine_config *c) {
  fake_config(c, 48, 4, 24, 8, MAX_LEN);
  c->max_waiting = 64;
  c->long_prefill_threshold = 0;
  c->vocab_size = 1010;
  c->num_eos_ids = 3;
  c->eos_ids[0] = 10;
  c->eos_ids[1] = 500;
  c->eos_ids[2] = 1000;
}

/* What a test changes in base_config: the fields it leaves 0 keep the base's values. */
struct variant {
  int32_t blocks, max_seqs, max_waiting, spec_tokens, long_prefill_threshold;
  bool no_prefix_cache;
  int32_t num_groups;
  struct sch_kv_group_cfg groups[SCH_MAX_GROUPS];
};

static void apply_variant(const struct variant *v, struct sch_engine_config *c) {
  base_config(c);
  if (v->num_groups) fake_groups(c, v->groups, v->num_groups);
  if (v->blocks) c->num_blocks = v->blocks;
  if (v->max_seqs) c->max_num_seqs = v->max_seqs;
  if (v->max_waiting) c->max_waiting = v->max_waiting; /* over 100: random priorities */
  if (v->spec_tokens) c->num_spec_tokens = v->spec_tokens;
  if (v->long_prefill_threshold) c->long_prefill_threshold = v->long_prefill_threshold;
  if (v->no_prefix_cache) c->enable_prefix_caching = false;
}

static void run_variant(const struct variant *v, uint64_t seed) {
  struct sch_engine_config c;
  base_config(&c);
  if (v->num_groups) fake_groups(&c, v->groups, v->num_groups);
  if (v->blocks) c.num_blocks = v->blocks;
  if (v->max_seqs) c.max_num_seqs = v->max_seqs;
  if (v->max_waiting) c.max_waiting = v->max_waiting; /* over 100: random priorities */
  if (v->spec_tokens) c.num_spec_tokens = v->spec_tokens;
  if (v->long_prefill_threshold) c.long_prefill_threshold = v->long_prefill_threshold;
  if (v->no_prefix_cache) c.enable_prefix_caching = false;
  run(&c, seed, 3000);
}

TH_TEST(stress_full_attention_prefix_cache) {
  run_variant(&(struct variant){0}, 1);
}

TH_TEST(stress_sliding_and_full_groups_with_drafts) {
  run_variant(
      &(struct variant){
          .num_groups = 2, .groups = {{8, 0}, {4, 12}}, .blocks = 64, .spec_tokens = 3},
      2);
}

TH_TEST(stress_no_cache_priorities_tiny_pool) {
  run_variant(&(struct variant){.no_prefix_cache = true,
                                .blocks = 20,
                                .max_waiting = 200,
                                .spec_tokens = 2,
                                .max_seqs = 5},
              3);
}

TH_TEST(stress_sliding_groups_tight_pool_prefix_cache) {
  run_variant(&(struct variant){.num_groups = 3,
                                .groups = {{4, 0}, {4, 9}, {2, 5}},
                                .blocks = 72,
                                .spec_tokens = 1,
                                .long_prefill_threshold = 7},
              4);
}

/* Async scheduling over the same scenarios, with their drafts. */
TH_TEST(stress_async_full_attention_prefix_cache) {
  struct sch_engine_config c;
  apply_variant(&(struct variant){0}, &c);
  run_async(&c, 11, 3000);
}

TH_TEST(stress_async_sliding_and_full_groups) {
  struct sch_engine_config c;
  apply_variant(
      &(struct variant){
          .num_groups = 2, .groups = {{8, 0}, {4, 12}}, .blocks = 64, .spec_tokens = 3},
      &c);
  run_async(&c, 12, 3000);
}

TH_TEST(stress_async_no_cache_priorities_tiny_pool) {
  struct sch_engine_config c;
  apply_variant(&(struct variant){.no_prefix_cache = true,
                                  .blocks = 20,
                                  .max_waiting = 200,
                                  .spec_tokens = 2,
                                  .max_seqs = 5},
                &c);
  run_async(&c, 13, 3000);
}

TH_TEST(stress_async_sliding_groups_tight_pool_prefix_cache) {
  struct sch_engine_config c;
  apply_variant(&(struct variant){.num_groups = 3,
                                  .groups = {{4, 0}, {4, 9}, {2, 5}},
                                  .blocks = 72,
                                  .spec_tokens = 1,
                                  .long_prefill_threshold = 7},
                &c);
  run_async(&c, 14, 3000);
}
