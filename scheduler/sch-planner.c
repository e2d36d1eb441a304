/* sch-planner.c — the step planner: continuous batching of decodes and chunked prefills
 * under the token budget and the running cap, KV allocation for every group,
 * preemption by recompute, and applying the sampled tokens of a step (stop conditions,
 * prefix-cache registration, rollback of rejected drafts). Nothing here allocates: the
 * plan and the outputs live in buffers sized at create. */
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "scheduler/sch-engine-impl.h"

/* ---- plan ----------------------------------------------------------------------- */

static const int32_t k_token_prev = SCH_TOKEN_PREV;

/* Whether r is in the step being planned. */
static bool planned(const struct sch_engine *e, const struct sch_request *r) {
  const struct sch_req_sched *sc = &r->sched[e->cur_slot];
  return sc->step == e->step_id && sc->index >= 0;
}

/* Where r stands for the step being planned: its computed tokens and its tokens once
 * the step in flight (async scheduling) is done, as if that step accepted none of its
 * drafts: it samples one more when it samples r (*prev: that token is not known yet),
 * and up to *ahead accepted drafts before it move r's later positions (the workers
 * know by how much). Returns whether a step in flight runs r. */
static bool planned_view(struct sch_engine *e, struct sch_request *r, int32_t *computed,
                         int32_t *tokens, bool *prev, int32_t *ahead) {
  *computed = r->num_computed;
  *tokens = r->num_tokens;
  *prev = false;
  *ahead = 0;
  struct sch_req_sched *f = e->num_in_flight ? sch_engine_flight_sched(e, r, 0) : NULL;
  if (!f) return false;
  *computed += f->tokens;
  if (f->sample) {
    *tokens += 1;
    *prev = true;
    *ahead = f->draft;
  }
  return true;
}

/* Adds n tokens of r from position `from` (k draft slots after them, `propose` drafts
 * proposed after them) to the plan; prev: the first is the token the step in flight
 * samples. */
static void add_seq(struct sch_engine *e, struct sch_request *r, int32_t from, int32_t ntok,
                    int32_t n, int32_t k, int32_t propose, bool is_new, bool prev) {
  CM_ASSERT(e->plan_num[e->cur_slot] < e->cfg.max_num_seqs);
  int32_t idx = e->plan_num[e->cur_slot]++;
  struct sch_plan_seq *s = &e->plan_seqs[e->cur_slot][idx];
  memset(s, 0, sizeof(*s));
  s->req_id = r->id;
  s->tokens = prev ? &k_token_prev : r->tokens + from;
  s->num_tokens = n;
  s->start_pos = from;
  s->num_draft = k;
  s->num_propose = propose;
  s->sample = from + n == ntok;
  s->is_new = is_new;
  s->num_prompt = r->num_prompt;
  s->max_tokens = r->max_tokens;
  s->num_cached = r->num_cached;
  s->sampling = r->sampling;
  s->sampling_len = r->sampling_len;
  for (int32_t g = 0; g < e->cfg.num_groups; g++) {
    s->block_table[g] = r->kv.table[g];
    s->num_blocks[g] = r->kv.len[g];
  }
  int32_t i = 0, end = from + n;
  while (i < r->num_images && r->images[i].pos + r->images[i].num_tokens <= from)
    i++;
  s->images = r->images + i;
  while (i < r->num_images && r->images[i].pos < end)
    i++;
  s->num_images = (int32_t)(r->images + i - s->images);
  for (int32_t j = 0; j < s->num_images; j++)
    e->plan_image_bytes += s->images[j].len;
  e->plan_reqs[e->cur_slot][idx] = r;
  r->sched[e->cur_slot] = (struct sch_req_sched){e->step_id, n, k, idx, s->sample};
}

/* The running request to preempt: not yet scheduled this step, lowest priority (largest
 * value), most recently admitted among equals. */
static struct sch_request *pick_victim(struct sch_engine *e) {
  struct sch_request *v = NULL;
  for (int32_t i = 0; i < e->q.num_running; i++) {
    struct sch_request *r = e->q.running[i];
    if (planned(e, r)) continue;
    if (!v || r->priority > v->priority ||
        (r->priority == v->priority && r->admit_seq > v->admit_seq))
      v = r;
  }
  return v;
}

/* Preemption by recompute: every block goes back (cached ones to the LRU list, where a
 * later prefix match may find them), and the request waits again with its generated
 * tokens part of what it recomputes. The workers learn it from the plan being built
 * (in_plan) or else from the next plan's finished list. */
static void preempt(struct sch_engine *e, struct sch_request *r, bool in_plan) {
  sch_engine_unplan(e, r); /* a step in flight that runs it: its result is dropped */
  sch_kv_free(e->kv, &r->kv);
  sch_queue_run_remove(&e->q, r);
  r->num_computed = 0;
  r->proposed = 0; /* the workers forget its drafts; its last prefill chunk proposes again */
  r->state = SCH_REQ_PREEMPTED;
  r->num_preemptions++;
  if (r->in_worker && in_plan) {
    CM_ASSERT(e->num_preempted < e->cfg.max_num_seqs);
    e->preempted[e->num_preempted++] = r->id;
  } else if (r->in_worker) {
    sch_engine_note_gone(e, r->id);
  }
  r->in_worker = false;
  sch_queue_wait_insert(&e->q, r);
  e->num_preemptions++;
}

/* Drafts a decode of r with ntok tokens may verify: at most K, and no more than the
 * tokens the request may still generate after that step's own; none while
 * spec_disable_batch or more requests run (counted as the plan goes: admissions add,
 * preemptions take away). */
static int32_t proposals(const struct sch_engine *e, const struct sch_request *r, int32_t ntok) {
  if (e->cfg.spec_disable_batch > 0 && e->q.num_running >= e->cfg.spec_disable_batch) return 0;
  int32_t k = CM_MIN(e->cfg.num_spec_tokens, r->max_tokens - (ntok - r->num_prompt) - 1);
  return k > 0 ? k : 0;
}

/* Draft slots for a decode of r with ntok tokens: its proposals, within what the
 * budget leaves. */
static int32_t draft_slots(const struct sch_engine *e, const struct sch_request *r, int32_t ntok,
                           int32_t budget) {
  int32_t k = CM_MIN(proposals(e, r, ntok), budget - 1);
  return k > 0 ? k : 0;
}

/* The end of the positions a decode of r may write: end when the step in flight accepts
 * none of its drafts; each one it accepts moves them on by one, up to `ahead`, within
 * the request's length (the step in flight drafted no further than max_tokens, and the
 * workers verify no drafts past it: PR_SEQ_PREV_DRAFTS). */
static int32_t decode_reach(const struct sch_request *r, int32_t end, int32_t ahead) {
  return CM_MIN(end + ahead, r->max_len);
}

/* Tokens one prefill chunk may take: what the budget leaves, within the threshold.
 * (A decode's single token is within any threshold.) */
static int32_t prefill_cap(const struct sch_engine *e, int32_t budget) {
  int32_t t = e->cfg.long_prefill_threshold;
  return t > 0 && t < budget ? t : budget;
}

/* Where a chunk of a request's tokens [start, end) may end without cutting an image:
 * end itself, or, when it falls inside an image, the image's start, or when the chunk
 * begins at or inside that image, its end if `limit` tokens from start allow it. An
 * image that would take the step's image bytes past max_image_bytes_per_step ends the
 * chunk at its start (the step's first image always goes). start: nothing this step. */
static int32_t chunk_end(const struct sch_engine *e, const struct sch_request *r, int32_t start,
                         int32_t end, int32_t limit) {
  uint64_t cap = e->cfg.max_image_bytes_per_step, used = e->plan_image_bytes;
  for (int32_t i = 0; i < r->num_images; i++) {
    int32_t b = r->images[i].pos, x = b + r->images[i].num_tokens;
    if (x <= start) continue;
    if (b >= end) break;
    if (cap && used > 0 && used + r->images[i].len > cap) return b > start ? b : start;
    used += r->images[i].len;
    if (end >= x) continue;
    if (b > start) return b;
    return x - start <= limit ? x : start;
  }
  return end;
}

/* Schedules the running requests: pass 0 the decodes, pass 1 the prefills. Returns
 * whether any request was preempted. A step is never empty while requests run: the last
 * unscheduled one, beside scheduled ones, preempts only itself, and alone it fits
 * (admission checked that it fits the whole pool). */
static bool schedule_running(struct sch_engine *e, int32_t *budget_io) {
  bool preempted = false;
  int32_t budget = *budget_io;
  for (int pass = 0; pass < 2; pass++) {
    for (int32_t i = 0; i < e->q.num_running && budget > 0; i++) {
      struct sch_request *r = e->q.running[i];
      if (planned(e, r)) continue;
      int32_t from, ntok, ahead;
      bool prev;
      if (planned_view(e, r, &from, &ntok, &prev, &ahead))
        /* the blocks the step in flight fills are offered to the prefix cache now, as
         * apply would: the allocation below may free them from a sliding window, and a
         * request that finds them runs after that step */
        sch_kv_commit(e->kv, &r->kv, sch_request_keys(r), from);
      /* the step in flight brings it to max_tokens: it ends when that step is applied */
      if (prev && ntok - r->num_prompt >= r->max_tokens) continue;
      int32_t remaining = ntok - from;
      CM_ASSERT(remaining >= 1);
      bool decode = remaining == 1;
      if (decode != (pass == 0)) continue;
      int32_t n = CM_MIN(remaining, prefill_cap(e, budget));
      n = chunk_end(e, r, from, from + n, budget) - from;
      if (n == 0) continue; /* an image that does not fit what is left of this step */
      /* a decode verifies the drafts the last result proposed: without a step in
       * flight that result is known, and slots past its drafts would hold nothing */
      int32_t kb = decode ? draft_slots(e, r, ntok, budget) : 0;
      int32_t k = prev ? kb : CM_MIN(kb, r->proposed);
      int32_t end = from + n + k, reach = prev ? decode_reach(r, end, ahead) : end;
      /* room for the step's positions and for the tokens apply will append */
      if (sch_request_reserve(r, e->kv, reach + 1) != 0) continue; /* out of memory: skip */
      bool self = false;
      while (!self && sch_kv_allocate(e->kv, &r->kv, sch_request_keys(r), from, reach) != 0) {
        struct sch_request *v = pick_victim(e);
        CM_ASSERT(v != NULL); /* r itself is a candidate */
        int32_t vi = v->run_index;
        preempt(e, v, true);
        preempted = true;
        if (vi <= i) i--;
        /* r had the weakest claim: the others keep their blocks and the loop goes on */
        self = v == r;
      }
      if (self) continue;
      /* a decode proposes as many drafts as the budget would let it verify (more than
       * it verifies when the last proposals fell short); a final prefill chunk, what its
       * first decode (ntok + 1 tokens) may verify */
      int32_t propose = decode ? kb : from + n == ntok ? proposals(e, r, ntok + 1) : 0;
      add_seq(e, r, from, ntok, n, k, propose, false, prev);
      budget -= n + k;
    }
  }
  *budget_io = budget;
  return preempted;
}

/* Admits waiting requests in queue order while the budget, the running cap and the
 * pool allow; the first that does not fit blocks the rest (FCFS). Constrained
 * requests wait aside while the workers lack the structured-output state. */
static void schedule_waiting(struct sch_engine *e, int32_t *budget) {
  struct sch_request *next = e->q.wait_head;
  while (*budget > 0 && e->q.num_running < e->cfg.max_num_seqs && next) {
    struct sch_request *r = next;
    next = r->next;
    if (r->constrained && !e->grammars_ready) continue;
    if (r->lora_slot && !(e->lora_ready >> (r->lora_slot - 1) & 1)) continue; /* loading */
    if (sch_request_reserve(r, e->kv, r->num_tokens + 1) != 0) return; /* out of memory */
    const int32_t *keys = sch_request_keys(r);
    int32_t h = sch_kv_prefix_match(e->kv, &r->kv, keys, r->num_tokens);
    if (r->score_prompt) h = 0; /* its prompt's rows are scored: all of them run */
    int32_t n = CM_MIN(r->num_tokens - h, prefill_cap(e, *budget));
    n = chunk_end(e, r, h, h + n, *budget) - h;
    if (n == 0) return; /* its next image waits for a step with room */
    if (sch_kv_allocate(e->kv, &r->kv, keys, h, h + n) != 0) return;
    if (!r->counted) {
      sch_kv_count_query(e->kv, r->num_tokens, h);
      r->num_cached = h;
      r->counted = true;
    }
    r->num_computed = h;
    sch_queue_wait_remove(&e->q, r);
    r->state = SCH_REQ_RUNNING;
    r->admit_seq = e->next_admit++;
    sch_queue_run_push(&e->q, r);
    r->in_worker = true;
    int32_t propose = h + n == r->num_tokens ? proposals(e, r, r->num_tokens + 1) : 0;
    add_seq(e, r, h, r->num_tokens, n, 0, propose, true, false);
    *budget -= n;
  }
}

int sch_engine_plan_step(struct sch_engine *e, struct sch_plan *plan) {
  memset(plan, 0, sizeof(*plan));
  if (e->num_in_flight >= (e->cfg.async_scheduling ? 2 : 1)) return CM_ERR_STATE;
  e->step_id++;
  e->cur_slot = e->num_in_flight ? e->flight_slot[0] ^ 1 : 0;
  e->plan_num[e->cur_slot] = 0;
  e->plan_image_bytes = 0;
  e->num_preempted = 0;
  int32_t budget = e->cfg.max_num_batched_tokens;
  if (!schedule_running(e, &budget)) schedule_waiting(e, &budget);

  plan->step_id = e->step_id;
  plan->num_seqs = e->plan_num[e->cur_slot];
  plan->seqs = e->plan_seqs[e->cur_slot];
  plan->num_tokens = e->cfg.max_num_batched_tokens - budget;
  int32_t c = e->gone_cur;
  plan->finished = e->gone[c];
  plan->num_finished = e->gone_num[c];
  e->gone_cur = c ^ 1;
  e->gone_num[e->gone_cur] = 0;
  plan->preempted = e->preempted;
  plan->num_preempted = e->num_preempted;
  if (plan->num_seqs > 0) {
    e->flight_step[e->num_in_flight] = e->step_id;
    e->flight_slot[e->num_in_flight] = e->cur_slot;
    e->num_in_flight++;
  }
  return 0;
}

/* ---- apply ---------------------------------------------------------------------- */

/* The oldest step in flight is done (applied or failed). */
static void pop_flight(struct sch_engine *e) {
  e->num_in_flight--;
  e->flight_step[0] = e->flight_step[1];
  e->flight_slot[0] = e->flight_slot[1];
}

/* The oldest step in flight: its slot, whose plan apply takes. */
static int32_t applied_slot(const struct sch_engine *e) {
  return e->flight_slot[0];
}

static void clear_results(struct sch_engine *e) {
  int32_t sl = applied_slot(e);
  for (int32_t i = 0; i < e->plan_num[sl]; i++)
    if (e->plan_reqs[sl][i]) e->plan_reqs[sl][i]->result = NULL;
}

/* Matches results to the plan's sampling sequences; CM_ERR_INVAL if any is malformed,
 * duplicated or missing. */
static int match_results(struct sch_engine *e, const struct sch_seq_result *results, int32_t num) {
  clear_results(e);
  int32_t sl = applied_slot(e);
  for (int32_t j = 0; j < num; j++) {
    const struct sch_seq_result *res = &results[j];
    struct sch_request *r = sch_queue_find(&e->q, res->req_id);
    if (!r || r->state != SCH_REQ_RUNNING) continue;
    const struct sch_req_sched *sc = sch_engine_flight_sched(e, r, 0);
    if (!sc) continue; /* not in this step (any more) */
    const struct sch_plan_seq *s = &e->plan_seqs[sl][sc->index];
    if (!s->sample || r->result || !res->tokens || res->num_tokens < 1 ||
        res->num_tokens > 1 + sc->draft)
      goto bad;
    for (int32_t t = 0; t < res->num_tokens; t++)
      if (res->tokens[t] < 0 || (e->cfg.vocab_size > 0 && res->tokens[t] >= e->cfg.vocab_size))
        goto bad;
    r->result = res;
  }
  for (int32_t i = 0; i < e->plan_num[sl]; i++)
    if (e->plan_reqs[sl][i] && e->plan_seqs[sl][i].sample && !e->plan_reqs[sl][i]->result) goto bad;
  return 0;
bad:
  clear_results(e);
  return CM_ERR_INVAL;
}

int sch_engine_apply(struct sch_engine *e, const struct sch_seq_result *results, int32_t num,
                     struct sch_outputs *outs) {
  outs->num = 0;
  outs->items = e->outs;
  if (!e->num_in_flight) return CM_ERR_STATE;
  if (num < 0 || (num > 0 && !results)) return CM_ERR_INVAL;
  int rc = match_results(e, results, num);
  if (rc) return rc;
  int32_t ntok = 0, sl = applied_slot(e);
  for (int32_t i = 0; i < e->plan_num[sl]; i++) {
    struct sch_request *r = e->plan_reqs[sl][i];
    if (!r) continue; /* aborted, finished or preempted while in flight */
    struct sch_req_sched *sc = &r->sched[sl];
    r->num_computed += sc->tokens;
    enum sch_finish fin = SCH_FINISH_NONE;
    if (e->plan_seqs[sl][i].sample) {
      const struct sch_seq_result *res = r->result;
      int32_t accepted = res->num_tokens - 1, before = r->num_tokens;
      int32_t k = sch_request_append(r, res->tokens, res->num_tokens, &e->cfg, &fin);
      int32_t *dst = e->out_tokens + ntok;
      memcpy(dst, r->tokens + before, (size_t)k * sizeof(*dst));
      ntok += k;
      /* the KV of accepted drafts was written at the positions after the step's token;
       * a stop inside the accepted run cuts them */
      r->num_computed = CM_MIN(r->num_computed + accepted, r->num_tokens);
      r->proposed = CM_MAX(res->num_proposed, 0);
      int32_t verified = CM_MIN(res->num_verified, sc->draft);
      if (verified > 0) {
        int32_t acc = CM_MIN(accepted, verified);
        e->spec_drafts++;
        e->spec_draft_tokens += (uint64_t)verified;
        e->spec_accepted += (uint64_t)acc;
        for (int32_t p = 0; p < acc && p < SCH_MAX_SPEC_TOKENS; p++)
          e->spec_accepted_pos[p]++;
      }
      struct sch_output *o = &e->outs[outs->num++];
      o->req_id = r->id;
      o->new_tokens = dst;
      o->num_new = k;
      o->finish = fin;
      o->num_prompt = r->num_prompt;
      o->num_generated = sch_request_num_generated(r);
      o->num_cached = r->num_cached;
      o->arrival_ns = r->arrival_ns;
    }
    r->result = NULL;
    sch_kv_commit(e->kv, &r->kv, sch_request_keys(r), r->num_computed);
    if (fin != SCH_FINISH_NONE) {
      sch_engine_drop(e, r); /* out of a later step in flight too */
      continue;
    }
    /* the slots of rejected drafts go back, unless a later step in flight holds them
     * (its positions moved by what this one accepted): that step's apply returns them */
    if (!sch_engine_flight_sched(e, r, 1)) sch_kv_rollback(e->kv, &r->kv, r->num_computed);
    *sc = (struct sch_req_sched){0, 0, 0, -1, false};
  }
  pop_flight(e);
  return 0;
}

/* ---- failures ------------------------------------------------------------------- */

void sch_engine_step_failed(struct sch_engine *e) {
  /* with async scheduling, a plan behind a step offered that step's blocks to the prefix
   * cache before it ran: their content is not to be trusted now */
  bool forget = e->cfg.async_scheduling && e->num_in_flight > 0;
  while (e->num_in_flight > 0) {
    int32_t sl = applied_slot(e);
    for (int32_t i = 0; i < e->plan_num[sl]; i++) {
      struct sch_request *r = e->plan_reqs[sl][i];
      if (r) preempt(e, r, false); /* out of every step in flight */
    }
    e->plan_num[sl] = 0;
    pop_flight(e);
  }
  if (forget) sch_block_pool_forget_cached(e->pool);
}

void sch_engine_reset_kv(struct sch_engine *e) {
  sch_engine_step_failed(e);
  while (e->q.num_running > 0)
    preempt(e, e->q.running[e->q.num_running - 1], false);
  sch_block_pool_forget_cached(e->pool);
}
