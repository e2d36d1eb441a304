/* sch-server-work.c — the scheduler server's worker side: READY (agreement between
 * ranks, then the engine), heartbeats and failures, and the step cycle: plan, one STEP
 * encoded once and sent to every rank, RESULT from rank 0, apply, one OUT per
 * frontend. One step is in flight at a time, or two with async scheduling (the
 * next planned and sent while the workers run one; RESULTs come in step order). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-log.h"
#include "common/cm-time.h"
#include "scheduler/sch-server-impl.h"

#define TAG SCH_SRV_TAG

int sch_srv_work_init(struct sch_server *s) {
  int32_t n = s->cfg.max_num_seqs;
  size_t ws = (size_t)s->cfg.world_size;
  /* one allocation for the per-rank arrays and one for the per-sequence ones, each
   * led by the array with the widest alignment */
  s->ranks =
      calloc(1, ws * (sizeof(*s->ranks) + sizeof(*s->dist.waiting) + sizeof(*s->dist.asked)));
  s->step_seqs =
      calloc(1, (size_t)n * (sizeof(*s->step_seqs) + SCH_MAX_GROUPS * sizeof(*s->step_tables) +
                             sizeof(*s->results)));
  s->outs = calloc((size_t)n, sizeof(*s->outs));
  s->out_order = calloc((size_t)n, sizeof(*s->out_order));
  s->cap_pending_free = 1024;
  s->pending_free = malloc(s->cap_pending_free * sizeof(*s->pending_free));
  pr_buf_init(&s->step_buf, PR_MAX_MSG_DEFAULT);
  s->cap_seqs = s->cap_outs = n;
  if (!s->ranks || !s->step_seqs || !s->outs || !s->out_order || !s->pending_free)
    return CM_ERR_NOMEM;
  s->dist.waiting = (struct pr_rid *)(s->ranks + ws);
  s->dist.asked = (bool *)(s->dist.waiting + ws);
  s->step_tables = (struct pr_i32s *)(s->step_seqs + n);
  s->results = (struct sch_seq_result *)(s->step_tables + (size_t)n * SCH_MAX_GROUPS);
  for (int32_t r = 0; r < s->cfg.world_size; r++)
    s->ranks[r].fd = -1;
  return 0;
}

void sch_srv_work_free(struct sch_server *s) {
  sch_engine_destroy(s->engine);
  s->engine = NULL;
  free(s->ranks);     /* the dist arrays with it */
  free(s->step_seqs); /* step_tables and results with it */
  free(s->step_images);
  free(s->outs);
  free(s->out_order);
  free(s->pending_free);
  pr_buf_free(&s->step_buf);
}

bool sch_srv_has_work(struct sch_server *s) {
  if (!s->engine) return false;
  struct sch_engine_stats st;
  sch_engine_stats(s->engine, &st);
  return st.num_running + st.num_waiting > 0;
}

/* ---- failures ---------------------------------------------------------------- */

/* Rank r is gone or broken: the step in flight fails, every live request gets ERR and
 * is dropped, the KV cache counts as lost, and service stops until all ranks are READY
 * again. A request that had sent no token yet gets CM_ERR_AGAIN: nothing of it reached
 * the client, so its frontend may submit it again once the workers are back. */
static void fail_rank(struct sch_server *s, int32_t r, int code, const char *why) {
  cm_error(TAG, "worker rank %d failed: %s", (int)r, why);
  /* the group is broken: its ranks start again and form a new one, whose id the new
   * rank 0 offers; the old id must not be relayed to a new rank that asks first */
  s->dist.n = 0;
  if (s->ranks[r].ready) {
    s->ranks[r].ready = false;
    s->num_ready--;
  }
  if (!s->serving) return;
  s->serving = false;
  if (s->num_in_flight) {
    sch_engine_step_failed(s->engine);
    s->num_in_flight = 0;
  }
  int32_t n = 0, n_retry = 0;
  for (int32_t i = 0; i < s->reqs.cap; i++) {
    struct sch_req *q = &s->reqs.slots[i];
    if (!q->eid) continue;
    int32_t front = q->front;
    uint64_t id = q->request_id;
    bool started = q->first_token_ns != 0;
    sch_srv_drop(s, q, true);
    if (started)
      sch_srv_send_err(s, front, id, code < 0 ? code : CM_ERR_IO, "worker rank %d failed: %s",
                       (int)r, why);
    else
      sch_srv_send_err(s, front, id, CM_ERR_AGAIN,
                       "worker rank %d failed: %s (the request had produced nothing yet)", (int)r,
                       why);
    n++;
    n_retry += !started;
  }
  sch_engine_reset_kv(s->engine);
  sch_srv_lora_reset(s, "a worker rank failed while the LoRA adapter loaded");
  cm_warn(TAG, "service stopped (%d of %d ranks ready); %d requests failed (%d before any output)",
          (int)s->num_ready, (int)s->cfg.world_size, (int)n, (int)n_retry);
}

/* ---- connections and supervisors ---------------------------------------------------- */

void sch_srv_work_monitor(struct sch_server *s) {
  int ev = 0, fd = -1;
  while (s->work_mon && pr_monitor_recv(s->work_mon, &ev, &fd) != CM_ERR_AGAIN) {
    if (ev != ZMQ_EVENT_DISCONNECTED || fd < 0) continue;
    /* the fd was closed right after the event was queued and is read here before
     * any message of a later connection that reuses its number */
    for (int32_t r = 0; r < s->cfg.world_size; r++) {
      struct sch_rank *k = &s->ranks[r];
      if (!k->known || k->fd != fd) continue;
      k->fd = -1;
      if (k->ready) fail_rank(s, r, CM_ERR_CLOSED, "its connection closed (the process ended?)");
    }
  }
}

void sch_srv_work_down(struct sch_server *s, const struct pr_down *m) {
  if (m->rank >= (uint32_t)s->cfg.world_size) {
    cm_warn(TAG, "DOWN for rank %u of a world of %d: ignored", m->rank, (int)s->cfg.world_size);
    return;
  }
  struct sch_rank *k = &s->ranks[m->rank];
  if (!k->ready || (m->pid && k->pid && m->pid != k->pid)) {
    cm_debug(TAG, "DOWN for rank %u (pid %u): not the rank's ready process", m->rank, m->pid);
    return;
  }
  char why[PR_MAX_STR + 64];
  snprintf(why, sizeof(why), "its process %u ended (%s)", m->pid,
           m->message && *m->message ? m->message : "reported by its supervisor");
  fail_rank(s, (int32_t)m->rank, CM_ERR_CLOSED, why);
}

/* ---- READY --------------------------------------------------------------------- */

static bool info_agrees(const struct sch_model_info *a, const struct sch_model_info *b) {
  if (a->num_groups != b->num_groups || a->vocab_size != b->vocab_size ||
      a->max_draft != b->max_draft || a->num_eos != b->num_eos ||
      a->image_tokens != b->image_tokens || a->image_bytes != b->image_bytes ||
      a->image_varsize != b->image_varsize || a->audio_tokens != b->audio_tokens ||
      a->audio_bytes != b->audio_bytes || a->n_lora != b->n_lora || a->lora_sum != b->lora_sum)
    return false;
  for (int32_t g = 0; g < a->num_groups; g++)
    if (a->groups[g].block_tokens != b->groups[g].block_tokens ||
        a->groups[g].window != b->groups[g].window)
      return false;
  return a->shard_sum == b->shard_sum &&
         memcmp(a->eos, b->eos, (size_t)a->num_eos * sizeof(a->eos[0])) == 0;
}

static int info_from_ready(const struct pr_ready *m, struct sch_model_info *o, char *why,
                           size_t len) {
  memset(o, 0, sizeof(*o));
  if (m->n_groups < 1 || m->n_groups > SCH_MAX_GROUPS)
    return snprintf(why, len, "%u KV groups (1..%d supported)", m->n_groups, SCH_MAX_GROUPS), -1;
  if (m->eos_ids.n > SCH_MAX_EOS_IDS)
    return snprintf(why, len, "%u eos ids (at most %d)", m->eos_ids.n, SCH_MAX_EOS_IDS), -1;
  if (m->kv_blocks < 1 || m->vocab_size < 1 || m->vocab_size > INT32_MAX || m->max_model_len < 1)
    return snprintf(why, len, "kv_blocks, vocab_size and max_model_len must be >= 1"), -1;
  o->num_groups = (int32_t)m->n_groups;
  for (uint32_t g = 0; g < m->n_groups; g++) {
    const struct pr_kv_group *k = &m->groups[g];
    if (k->block_tokens < 1 || k->block_tokens > (1u << 20) || k->sliding_window > INT32_MAX)
      return snprintf(why, len, "group %u: block_tokens %u / window %u", g, k->block_tokens,
                      k->sliding_window),
             -1;
    o->groups[g].block_tokens = (int32_t)k->block_tokens;
    o->groups[g].window = (int32_t)k->sliding_window;
  }
  o->vocab_size = m->vocab_size;
  o->max_model_len = m->max_model_len;
  o->max_draft = m->max_draft;
  o->image_tokens = m->image_tokens;
  o->image_bytes = m->image_bytes;
  o->image_varsize = m->image_varsize;
  o->audio_tokens = m->audio_tokens;
  o->audio_bytes = m->audio_bytes;
  o->n_lora = m->n_lora;
  o->lora_sum = m->lora_sum;
  o->shard_sum = m->shard_sum;
  o->num_eos = (int32_t)m->eos_ids.n;
  for (uint32_t i = 0; i < m->eos_ids.n; i++) {
    if (m->eos_ids.v[i] >= m->vocab_size)
      return snprintf(why, len, "eos id %u outside the vocabulary", m->eos_ids.v[i]), -1;
    o->eos[i] = (int32_t)m->eos_ids.v[i];
  }
  return 0;
}

/* A step must fit every rank's scratch: the engine's limits are the smaller
 * of the scheduler's flags and what each rank said it takes (0: not said). */
static void clamp_to_ranks(const struct sch_server *s, struct sch_engine_config *ec) {
  int32_t seqs = ec->max_num_seqs, toks = ec->max_num_batched_tokens;
  for (int32_t r = 0; r < s->cfg.world_size; r++) {
    const struct sch_rank *k = &s->ranks[r];
    if (k->max_num_seqs > 0 && k->max_num_seqs < (uint32_t)seqs) seqs = (int32_t)k->max_num_seqs;
    if (k->max_num_batched_tokens > 0 && k->max_num_batched_tokens < (uint32_t)toks)
      toks = (int32_t)k->max_num_batched_tokens;
  }
  if (seqs != ec->max_num_seqs || toks != ec->max_num_batched_tokens)
    cm_warn(TAG,
            "the workers take at most %d sequences and %d tokens per step: "
            "--max-num-seqs %d and --max-num-batched-tokens %d lowered to those",
            (int)seqs, (int)toks, (int)ec->max_num_seqs, (int)ec->max_num_batched_tokens);
  ec->max_num_seqs = seqs;
  ec->max_num_batched_tokens = toks;
}

static void start_service(struct sch_server *s) {
  struct sch_model_info want = s->info;
  uint64_t blocks = UINT64_MAX;
  uint32_t mml = UINT32_MAX;
  for (int32_t r = 0; r < s->cfg.world_size; r++) {
    blocks = CM_MIN(blocks, s->ranks[r].kv_blocks);
    mml = CM_MIN(mml, s->ranks[r].max_model_len);
  }
  if (s->cfg.max_model_len > 0 && (uint32_t)s->cfg.max_model_len > mml)
    cm_warn(TAG,
            "--max-model-len %d is past the %u tokens the workers serve (the model's context "
            "length): serving %u",
            (int)s->cfg.max_model_len, mml, mml);
  if (s->cfg.max_model_len > 0) mml = CM_MIN(mml, (uint32_t)s->cfg.max_model_len);
  want.max_model_len = CM_MIN(mml, (uint32_t)INT32_MAX);
  want.num_blocks = (int64_t)CM_MIN(blocks, (uint64_t)INT32_MAX);
  if (!s->engine || !info_agrees(&want, &s->engine_info) ||
      want.num_blocks != s->engine_info.num_blocks ||
      want.max_model_len != s->engine_info.max_model_len) {
    CM_ASSERT(s->reqs.num_live == 0);
    struct sch_engine_config ec;
    sch_engine_config_default(&ec);
    ec.num_blocks = (int32_t)want.num_blocks;
    ec.num_groups = want.num_groups;
    memcpy(ec.groups, want.groups, sizeof(ec.groups));
    ec.max_num_seqs = s->cfg.max_num_seqs;
    ec.max_num_batched_tokens = s->cfg.max_num_batched_tokens;
    clamp_to_ranks(s, &ec);
    ec.max_model_len = (int32_t)want.max_model_len;
    ec.max_waiting = s->cfg.max_waiting;
    ec.num_spec_tokens = (int32_t)CM_MIN((uint32_t)s->cfg.num_spec_tokens, want.max_draft);
    ec.spec_disable_batch = s->cfg.spec_disable_batch;
    if (ec.num_spec_tokens < s->cfg.num_spec_tokens)
      cm_warn(TAG, "workers propose at most %u drafts: %d speculative tokens instead of %d",
              want.max_draft, (int)ec.num_spec_tokens, (int)s->cfg.num_spec_tokens);
    ec.vocab_size = (int32_t)want.vocab_size;
    memcpy(ec.eos_ids, want.eos, sizeof(ec.eos_ids));
    ec.num_eos_ids = want.num_eos;
    ec.enable_prefix_caching = s->cfg.enable_prefix_caching;
    ec.async_scheduling = s->cfg.async_scheduling;
    ec.hash_key = s->hash_key;
    /* a step's images travel inside one STEP message: half of it at most */
    ec.max_image_bytes_per_step = PR_MAX_MSG_DEFAULT / 2;
    char err[256] = "";
    struct sch_engine *e = NULL;
    s->max_in_flight = ec.async_scheduling ? 2 : 1;
    int rc = sch_engine_create(&ec, &e, err, sizeof(err));
    if (rc) {
      cm_error(TAG, "cannot build the engine from the workers' READY: %s", err);
      return;
    }
    sch_engine_destroy(s->engine);
    s->engine = e;
    s->engine_info = want;
    s->speculative = ec.num_spec_tokens > 0;
    s->engine_grammars = true; /* a new engine starts without the hold */
  }
  s->serving = true;
  cm_info(TAG, "serving: %d rank(s), %lld KV blocks, %d group(s), vocab %u, max_model_len %u",
          (int)s->cfg.world_size, (long long)want.num_blocks, (int)want.num_groups, want.vocab_size,
          want.max_model_len);
}

static void on_ready(struct sch_server *s, const struct pr_rid *from, const struct pr_ready *m) {
  char why[256];
  if (m->world_size != (uint32_t)s->cfg.world_size || m->rank >= m->world_size) {
    cm_error(TAG, "READY from rank %u of %u refused: this scheduler expects world size %d", m->rank,
             m->world_size, (int)s->cfg.world_size);
    return;
  }
  int32_t r = (int32_t)m->rank;
  struct sch_model_info info;
  if (info_from_ready(m, &info, why, sizeof(why))) {
    cm_error(TAG, "READY from rank %d refused: %s", (int)r, why);
    return;
  }
  if (s->ranks[r].ready) fail_rank(s, r, CM_ERR_CLOSED, "restarted (a second READY)");
  if (s->num_ready > 0 && !info_agrees(&info, &s->info)) {
    cm_error(TAG,
             "READY from rank %d refused: its groups, vocabulary, eos ids, drafts or model "
             "shard checksum differ from the other ranks'",
             (int)r);
    return;
  }
  if (s->num_ready == 0) s->info = info;
  struct sch_rank *k = &s->ranks[r];
  k->rid = *from;
  k->fd = from->fd;
  k->pid = m->pid;
  k->known = k->ready = true;
  k->beat_flags = 0;
  k->grammars_asked = false;
  k->last_seen_ns = cm_time_ns();
  k->kv_blocks = m->kv_blocks;
  k->max_model_len = m->max_model_len;
  k->max_num_seqs = m->max_num_seqs;
  k->max_num_batched_tokens = m->max_num_batched_tokens;
  snprintf(k->kernels, sizeof(k->kernels), "%s", m->kernels ? m->kernels : "");
  snprintf(k->matmul_inputs, sizeof(k->matmul_inputs), "%s",
           m->matmul_inputs ? m->matmul_inputs : "");
  s->num_ready++;
  cm_info(TAG, "worker rank %d ready: %llu KV blocks, %u group(s) (%d of %d ready)", (int)r,
          (unsigned long long)m->kv_blocks, m->n_groups, (int)s->num_ready, (int)s->cfg.world_size);
  if (s->num_ready == s->cfg.world_size) start_service(s);
  sch_srv_grammars(s);
}

int32_t sch_srv_grammars_failed(const struct sch_server *s) {
  for (int32_t r = 0; r < s->cfg.world_size; r++)
    if (s->ranks[r].ready && (s->ranks[r].beat_flags & PR_BEAT_GRAMMARS_FAILED)) return r;
  return -1;
}

void sch_srv_grammars(struct sch_server *s) {
  if (!s->want_grammars) return;
  bool all = s->num_ready == s->cfg.world_size;
  const uint32_t have = PR_BEAT_GRAMMARS | PR_BEAT_GRAMMARS_FAILED;
  for (int32_t r = 0; r < s->cfg.world_size; r++) {
    struct sch_rank *k = &s->ranks[r];
    if (!k->ready || (k->beat_flags & have)) continue;
    all = false;
    if (k->grammars_asked) continue;
    struct pr_msg m;
    pr_msg_init(&m, PR_CTRL);
    m.u.ctrl.op = PR_CTRL_GRAMMARS;
    int rc = pr_sock_send(s->work_sock, &k->rid, &m, 0);
    k->grammars_asked = rc == 0;
    if (rc)
      cm_warn(TAG, "cannot ask worker rank %d to build the structured-output state: %s", (int)r,
              cm_strerror(rc));
    else
      cm_info(TAG, "asked worker rank %d to build the structured-output state", (int)r);
  }
  if (!s->engine) return;
  int32_t failed = sch_srv_grammars_failed(s);
  if (failed >= 0) {
    /* the constrained requests cannot run: each gets an ERR, the others go on */
    all = false;
    int32_t n = 0;
    for (int32_t i = 0; i < s->reqs.cap; i++) {
      struct sch_req *q = &s->reqs.slots[i];
      if (!q->eid || !q->constrained) continue;
      int32_t front = q->front;
      uint64_t id = q->request_id;
      sch_srv_drop(s, q, true);
      sch_srv_send_err(s, front, id, CM_ERR_IO, SCH_SRV_GRAMMARS_FAILED, (int)failed);
      n++;
    }
    if (n) cm_warn(TAG, SCH_SRV_GRAMMARS_FAILED "; %d requests refused", (int)failed, (int)n);
  }
  bool was = s->engine_grammars;
  bool waiting = sch_engine_set_grammars(s->engine, all);
  s->engine_grammars = all;
  if (all && !was) {
    if (waiting)
      cm_info(TAG, "every rank has the structured-output state: constrained requests run");
    s->plan_idle = false;
  }
}

/* ---- RESULT -> apply -> OUT --------------------------------------------------- */

static int grow_outs(struct sch_server *s, int32_t n) {
  if (n <= s->cap_outs) return 0;
  struct pr_out_seq *o = realloc(s->outs, (size_t)n * sizeof(*o));
  if (!o) return CM_ERR_NOMEM;
  s->outs = o;
  int32_t *ord = realloc(s->out_order, (size_t)n * sizeof(*ord));
  if (!ord) return CM_ERR_NOMEM;
  s->out_order = ord;
  s->cap_outs = n;
  return 0;
}

static void fill_logprobs(const struct pr_result_seq *rs, int32_t n, struct pr_logprobs *lp) {
  memset(lp, 0, sizeof(*lp));
  if (!rs || rs->logprobs.sampled.n < (uint32_t)n || n == 0) return;
  lp->n_top = rs->logprobs.n_top;
  lp->sampled = (struct pr_f32s){rs->logprobs.sampled.v, (uint32_t)n};
  if (lp->n_top) {
    lp->top_ids = (struct pr_u32s){rs->logprobs.top_ids.v, (uint32_t)n * lp->n_top};
    lp->top = (struct pr_f32s){rs->logprobs.top.v, (uint32_t)n * lp->n_top};
  }
}

/* Takes the prompt logprobs of a RESULT's scored rows into r: those that extend
 * what r holds (a chunk run again after a preemption gives some twice). */
static void take_prompt_logprobs(struct sch_req *r, const struct pr_result_seq *rs) {
  const struct pr_logprobs *lp = &rs->prompt_logprobs;
  uint32_t total = r->num_prompt ? r->num_prompt - 1 : 0, k = (uint32_t)r->prompt_lp;
  if (r->prompt_lp < 0 || !r->plp || !lp->sampled.n || lp->n_top < k || rs->prompt_pos == 0 ||
      rs->prompt_pos > r->plp_have + 1)
    return;
  for (uint32_t j = 0; j < lp->sampled.n; j++) {
    uint64_t t = (uint64_t)rs->prompt_pos + j; /* the prompt token's index, 1 .. total */
    if (t <= r->plp_have) continue;
    if (t > total) break;
    size_t at = (size_t)(t - 1);
    r->plp[at] = lp->sampled.v[j];
    r->plp_rank[at] = lp->ranks.n == lp->sampled.n ? lp->ranks.v[j] : 0;
    for (uint32_t c = 0; c < k; c++) {
      r->plp_ids[at * k + c] = lp->top_ids.v[(size_t)j * lp->n_top + c];
      r->plp_top[at * k + c] = lp->top.v[(size_t)j * lp->n_top + c];
    }
    r->plp_have = (uint32_t)t;
  }
}

/* Sends the outputs of one applied step, one OUT per frontend. */
static void send_outputs(struct sch_server *s, const struct pr_result *res,
                         const struct sch_outputs *outs) {
  if (outs->num == 0) return;
  if (grow_outs(s, outs->num)) {
    cm_error(TAG, "out of memory for %d outputs", (int)outs->num);
    return;
  }
  uint64_t wall = cm_time_wall_ns();
  int32_t n = 0;
  for (int32_t i = 0; i < outs->num; i++) {
    const struct sch_output *o = &outs->items[i];
    struct sch_req *r = sch_reqs_by_eid(&s->reqs, o->req_id);
    if (!r) continue;
    struct pr_out_seq *q = &s->outs[n];
    memset(q, 0, sizeof(*q));
    q->request_id = r->request_id;
    q->tokens = (struct pr_u32s){(const uint32_t *)o->new_tokens, (uint32_t)o->num_new};
    if (r->logprobs >= 0 && r->result >= 0)
      fill_logprobs(&res->seqs[r->result], o->num_new, &q->logprobs);
    /* the prompt's logprobs with the first tokens, when every one came (else none: the
     * frontend fails the request) */
    if (r->prompt_lp >= 0 && !r->plp_sent && o->num_new > 0) {
      r->plp_sent = true;
      uint32_t have = r->plp_have, k = (uint32_t)r->prompt_lp;
      if (have && have + 1 == r->num_prompt)
        q->prompt_logprobs = (struct pr_logprobs){k,
                                                  {r->plp, have},
                                                  {r->plp_ids, k ? have * k : 0},
                                                  {r->plp_top, k ? have * k : 0},
                                                  {r->plp_rank, have}};
    }
    q->finish = o->finish == SCH_FINISH_STOP     ? PR_FINISH_STOP
                : o->finish == SCH_FINISH_LENGTH ? PR_FINISH_LENGTH
                                                 : PR_FINISH_NONE;
    q->stop_token = o->finish == SCH_FINISH_STOP && o->num_new > 0
                        ? (int64_t)o->new_tokens[o->num_new - 1]
                        : -1;
    q->n_prompt_tokens = r->num_prompt;
    q->n_cached_tokens = (uint32_t)(o->num_cached > 0 ? o->num_cached : 0);
    if (o->num_new > 0 && r->first_token_ns == 0) r->first_token_ns = wall;
    q->queued_ns = r->queued_ns;
    q->scheduled_ns = r->scheduled_ns;
    q->first_token_ns = r->first_token_ns;
    s->generation_tokens += (uint64_t)o->num_new;
    s->out_order[n] = r->front;
    n++;
  }
  /* one OUT per frontend: gather each frontend's outputs into a run in place (there
   * are few frontends, so the quadratic worst case is the number of frontends times
   * the outputs) and send it */
  int32_t start = 0;
  while (start < n) {
    int32_t f = s->out_order[start], end = start + 1;
    for (int32_t j = start + 1; j < n; j++) {
      if (s->out_order[j] != f) continue;
      struct pr_out_seq t = s->outs[end];
      s->outs[end] = s->outs[j];
      s->outs[j] = t;
      int32_t tf = s->out_order[end];
      s->out_order[end] = s->out_order[j];
      s->out_order[j] = tf;
      end++;
    }
    sch_srv_send_out(s, f, &s->outs[start], (uint32_t)(end - start));
    start = end;
  }
  /* finished: the engine has already let it go (its prompt logprobs went out above) */
  for (int32_t i = 0; i < outs->num; i++) {
    struct sch_req *r = sch_reqs_by_eid(&s->reqs, outs->items[i].req_id);
    if (r && outs->items[i].finish != SCH_FINISH_NONE) sch_srv_drop(s, r, false);
  }
}

static void on_result(struct sch_server *s, int32_t rank, const struct pr_result *m,
                      uint64_t t_recv) {
  if (rank != 0) {
    cm_warn(TAG, "RESULT from rank %d dropped: only rank 0 answers steps", (int)rank);
    return;
  }
  if (!s->num_in_flight || m->step_id != s->flight_id[0]) {
    if (s->num_in_flight)
      cm_warn(TAG, "RESULT for step %llu dropped: step %llu is the oldest in flight",
              (unsigned long long)m->step_id, (unsigned long long)s->flight_id[0]);
    else
      cm_warn(TAG, "RESULT for step %llu dropped: no step is in flight",
              (unsigned long long)m->step_id);
    return;
  }
  if (m->n_seqs > (uint32_t)s->cap_seqs) {
    fail_rank(s, 0, CM_ERR_INVAL, "RESULT with more sequences than a step has");
    return;
  }
  s->step_ns_round += cm_time_ns() - s->flight_sent_ns[0];
  int32_t nres = 0;
  for (uint32_t i = 0; i < m->n_seqs; i++) {
    const struct pr_result_seq *rs = &m->seqs[i];
    if (rs->tokens.n == 0) continue; /* a sequence that sampled nothing (a prefill chunk) */
    for (uint32_t j = 0; j < rs->tokens.n; j++)
      if (rs->tokens.v[j] >= s->engine_info.vocab_size) {
        fail_rank(s, 0, CM_ERR_RANGE, "RESULT holds a token outside the vocabulary");
        return;
      }
    s->results[nres++] = (struct sch_seq_result){
        rs->seq_id, (const int32_t *)rs->tokens.v, (int32_t)rs->tokens.n, (int32_t)rs->num_verified,
        (int32_t)CM_MIN(rs->drafts.n, (uint32_t)PR_MAX_DRAFT)};
  }
  struct sch_outputs outs;
  uint64_t te = cm_time_ns();
  int rc = sch_engine_apply(s->engine, s->results, nres, &outs);
  s->step_ns_engine += cm_time_ns() - te;
  if (rc) {
    fail_rank(s, 0, rc, "RESULT does not match its step");
    return;
  }
  s->num_in_flight--;
  s->flight_id[0] = s->flight_id[1];
  s->flight_sent_ns[0] = s->flight_sent_ns[1];
  s->plan_idle = false;
  for (uint32_t i = 0; i < m->n_seqs; i++) {
    struct sch_req *r = sch_reqs_by_eid(&s->reqs, m->seqs[i].seq_id);
    if (!r) continue;
    r->result = (int32_t)i;
    take_prompt_logprobs(r, &m->seqs[i]);
    uint32_t nd = CM_MIN(m->seqs[i].drafts.n, (uint32_t)PR_MAX_DRAFT);
    if (nd) memcpy(r->drafts, m->seqs[i].drafts.v, nd * sizeof(uint32_t));
    r->num_drafts = nd;
  }
  send_outputs(s, m, &outs);
  for (uint32_t i = 0; i < m->n_seqs; i++) {
    struct sch_req *r = sch_reqs_by_eid(&s->reqs, m->seqs[i].seq_id);
    if (r) r->result = -1;
  }
  s->num_steps++;
  s->step_ns_apply += cm_time_ns() - t_recv;
}

/* ---- DIST ------------------------------------------------------------------------ */

/* Sends rank 0's comm id to every rank that asked for it. */
static void dist_answer(struct sch_server *s) {
  struct sch_dist *d = &s->dist;
  if (!d->n) return;
  for (int32_t r = 0; r < s->cfg.world_size; r++) {
    if (!d->asked[r]) continue;
    struct pr_msg m;
    pr_msg_init(&m, PR_DIST);
    m.u.dist.rank = (uint32_t)r;
    m.u.dist.world_size = (uint32_t)s->cfg.world_size;
    m.u.dist.comm_id = (struct pr_u32s){d->id, d->n};
    int rc = pr_sock_send(s->work_sock, &d->waiting[r], &m, 0);
    if (rc) cm_warn(TAG, "cannot send DIST to rank %d: %s", (int)r, cm_strerror(rc));
    d->asked[r] = false;
  }
}

static void on_dist(struct sch_server *s, const struct pr_rid *from, const struct pr_dist *m) {
  if (m->world_size != (uint32_t)s->cfg.world_size || m->rank >= m->world_size) {
    cm_error(TAG, "DIST from rank %u of %u refused: this scheduler expects world size %d", m->rank,
             m->world_size, (int)s->cfg.world_size);
    return;
  }
  struct sch_dist *d = &s->dist;
  if (m->rank == 0 && m->comm_id.n > 0) { /* a new group (a restarted rank 0 makes a new id) */
    memcpy(d->id, m->comm_id.v, sizeof(uint32_t) * m->comm_id.n);
    d->n = m->comm_id.n;
    cm_info(TAG, "rank 0 offered the tensor-parallel group's id; relaying it");
  } else if (m->comm_id.n == 0) {
    d->waiting[m->rank] = *from;
    d->asked[m->rank] = true;
  }
  dist_answer(s);
}

/* ---- receiving ------------------------------------------------------------------ */

static int32_t rank_of(struct sch_server *s, const struct pr_rid *rid) {
  for (int32_t r = 0; r < s->cfg.world_size; r++) {
    const struct sch_rank *k = &s->ranks[r];
    if (k->known && k->rid.len == rid->len && memcmp(k->rid.id, rid->id, rid->len) == 0) return r;
  }
  return -1;
}

void sch_srv_work_recv(struct sch_server *s) {
  for (;;) {
    struct pr_rid from = {0};
    struct pr_msg m;
    cm_arena_reset(&s->work_arena);
    uint64_t t0 = cm_time_ns();
    int rc = pr_sock_recv(s->work_sock, &from, &m, &s->work_arena, PR_DONTWAIT);
    if (rc == CM_ERR_AGAIN || rc == CM_ERR_CLOSED) return;
    int32_t r = rank_of(s, &from);
    if (rc) {
      cm_warn(TAG, "worker socket: bad message from %s dropped: %s",
              r >= 0 ? "a known rank" : "an unknown peer", cm_strerror(rc));
      continue;
    }
    if (m.type == PR_READY) {
      on_ready(s, &from, &m.u.ready);
      continue;
    }
    if (m.type == PR_DIST) {
      on_dist(s, &from, &m.u.dist);
      continue;
    }
    if (r < 0 && m.type == PR_BEAT) { /* a rank serving a scheduler before this one */
      struct pr_msg ask;
      pr_msg_init(&ask, PR_CTRL);
      ask.u.ctrl.op = PR_CTRL_ANNOUNCE;
      rc = pr_sock_send(s->work_sock, &from, &ask, 0);
      cm_info(TAG, "worker socket: a rank this scheduler does not know is beating; %s",
              rc ? "cannot ask it to announce itself" : "asked it to announce itself");
      continue;
    }
    if (r < 0) {
      cm_warn(TAG, "worker socket: %s from a peer that sent no READY; dropped",
              pr_type_name(m.type));
      continue;
    }
    s->ranks[r].last_seen_ns = cm_time_ns();
    switch (m.type) {
    case PR_RESULT: on_result(s, r, &m.u.result, t0); break;
    case PR_BEAT:
      s->ranks[r].last_step_id = m.u.beat.last_step_id;
      if (s->ranks[r].beat_flags != m.u.beat.flags) {
        s->ranks[r].beat_flags = m.u.beat.flags;
        sch_srv_grammars(s);
      }
      break;
    case PR_LORA_ACK: sch_srv_on_lora_ack(s, r, &m.u.lora); break;
    case PR_FAIL: {
      char why[PR_MAX_STR + 64];
      snprintf(why, sizeof(why), "%s", m.u.fail.message ? m.u.fail.message : "(no message)");
      fail_rank(s, r, m.u.fail.code, why);
      break;
    }
    default:
      cm_warn(TAG, "worker rank %d: %s is not a worker message; dropped", (int)r,
              pr_type_name(m.type));
      break;
    }
  }
}

void sch_srv_work_check(struct sch_server *s) {
  uint64_t now = cm_time_ns(), limit = (uint64_t)s->cfg.worker_timeout_ms * 1000000ull;
  for (int32_t r = 0; r < s->cfg.world_size; r++) {
    struct sch_rank *k = &s->ranks[r];
    if (k->ready && now - k->last_seen_ns > limit) {
      char why[96];
      snprintf(why, sizeof(why), "no heartbeat for %.1f s", (double)(now - k->last_seen_ns) / 1e9);
      fail_rank(s, r, CM_ERR_TIMEOUT, why);
    }
  }
  sch_srv_lora_check(s);
}

/* ---- STEP ------------------------------------------------------------------------ */

static int pending_free_add(struct sch_server *s, const uint64_t *ids, int32_t n) {
  if (n <= 0) return 0;
  if (s->num_pending_free + (uint32_t)n > s->cap_pending_free) {
    uint32_t cap = CM_MAX(s->cap_pending_free * 2, s->num_pending_free + (uint32_t)n);
    uint64_t *p = realloc(s->pending_free, cap * sizeof(*p));
    if (!p) return CM_ERR_NOMEM;
    s->pending_free = p;
    s->cap_pending_free = cap;
  }
  memcpy(s->pending_free + s->num_pending_free, ids, (size_t)n * sizeof(*ids));
  s->num_pending_free += (uint32_t)n;
  return 0;
}

/* Sends the encoded STEP in step_buf to every rank; 0 or the first failing rank + 1. */
static int32_t send_step(struct sch_server *s) {
  uint8_t hdr[PR_HDR_LEN];
  pr_msg_header(PR_STEP, hdr);
  void *z = pr_sock_zmq(s->work_sock);
  for (int32_t r = 0; r < s->cfg.world_size; r++) {
    const struct sch_rank *k = &s->ranks[r];
    if (zmq_send(z, k->rid.id, k->rid.len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(z, hdr, sizeof(hdr), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(z, s->step_buf.data, s->step_buf.len, ZMQ_DONTWAIT) < 0)
      return r + 1;
  }
  return 0;
}

/* Room for the plan's images in s->step_images; 0 or CM_ERR_NOMEM. */
static int reserve_step_images(struct sch_server *s, const struct sch_plan *plan) {
  size_t need = 0;
  for (int32_t i = 0; i < plan->num_seqs; i++)
    need += (size_t)plan->seqs[i].num_images;
  if (need <= s->cap_step_images) return 0;
  size_t cap = CM_MAX(need, 2 * s->cap_step_images);
  struct pr_image *v = realloc(s->step_images, cap * sizeof(*v));
  if (!v) return CM_ERR_NOMEM;
  s->step_images = v;
  s->cap_step_images = cap;
  return 0;
}

void sch_srv_work_step(struct sch_server *s) {
  if (!s->serving || s->num_in_flight >= s->max_in_flight) return;
  uint64_t t0 = cm_time_ns();
  struct sch_plan plan;
  int rc = sch_engine_plan_step(s->engine, &plan);
  uint64_t t_planned = cm_time_ns();
  if (rc) {
    cm_error(TAG, "planning failed: %s", cm_strerror(rc));
    return;
  }
  if (pending_free_add(s, plan.finished, plan.num_finished) ||
      pending_free_add(s, plan.preempted, plan.num_preempted))
    cm_warn(TAG, "out of memory for free ids; some worker-side state lingers");
  /* an empty plan with work queued (nothing fits now) waits for the next change
   * (an ADD, an ABORT, a RESULT) instead of planning in a busy loop */
  s->plan_idle = plan.num_seqs == 0;
  if (plan.num_seqs == 0) return; /* free ids wait for the next STEP */
  s->step_ns_engine += t_planned - t0;
  CM_ASSERT(plan.num_seqs <= s->cap_seqs);
  uint64_t wall = cm_time_wall_ns();
  size_t used_images = 0;
  uint64_t spec_before = 0; /* `before` tokens this step carries for n-gram lookups alone */
  if (reserve_step_images(s, &plan) != 0) {
    /* the step never leaves: its sequences go back to recompute later */
    cm_error(TAG, "out of memory for step %llu's images", (unsigned long long)plan.step_id);
    sch_engine_step_failed(s->engine); /* the one in flight too: its RESULT is dropped */
    s->num_in_flight = 0;
    return;
  }
  for (int32_t i = 0; i < plan.num_seqs; i++) {
    const struct sch_plan_seq *p = &plan.seqs[i];
    struct pr_step_seq *q = &s->step_seqs[i];
    struct sch_req *r = sch_reqs_by_eid(&s->reqs, p->req_id);
    CM_ASSERT(r != NULL);
    memset(q, 0, sizeof(*q));
    q->seq_id = p->req_id;
    q->flags = (p->is_new ? PR_SEQ_NEW : 0) | (p->sample ? PR_SEQ_SAMPLE : 0) |
               (p->num_tokens > 1 || p->start_pos < p->num_prompt ? PR_SEQ_PREFILL : 0);
    q->start_pos = (uint32_t)p->start_pos;
    q->tokens = (struct pr_u32s){(const uint32_t *)p->tokens, (uint32_t)p->num_tokens};
    if (p->tokens[0] == SCH_TOKEN_PREV) {
      /* the token the step in flight samples, and the drafts it proposes: the workers
       * keep both */
      static const uint32_t placeholder = 0;
      CM_ASSERT(p->num_tokens == 1);
      q->flags |= PR_SEQ_PREV_TOKEN | (p->num_draft > 0 ? PR_SEQ_PREV_DRAFTS : 0);
      q->tokens = (struct pr_u32s){&placeholder, 1};
    } else {
      uint32_t nd = CM_MIN((uint32_t)p->num_draft, r->num_drafts);
      q->draft_tokens = (struct pr_u32s){r->drafts, nd};
    }
    /* a prompt chunk whose logprobs are still to come: its rows are scored, the
     * last one, before the prompt's end, for the token after the chunk */
    int32_t end = p->start_pos + p->num_tokens;
    if (r->prompt_lp >= 0 && r->plp_have + 1 < r->num_prompt && end <= p->num_prompt &&
        (p->sample || end < p->num_prompt) && !(q->flags & PR_SEQ_PREV_TOKEN)) {
      q->flags |= PR_SEQ_SCORE;
      if (!p->sample) q->prompt_next = (uint32_t)p->tokens[p->num_tokens];
    }
    q->num_draft = (uint32_t)p->num_propose;
    q->num_prompt = p->is_new ? (uint32_t)p->num_prompt : 0;
    q->max_tokens = p->is_new ? (uint32_t)p->max_tokens : 0;
    q->block_tables = &s->step_tables[i * SCH_MAX_GROUPS];
    q->n_groups = (uint32_t)s->engine_info.num_groups;
    for (int32_t g = 0; g < s->engine_info.num_groups; g++)
      q->block_tables[g] = (struct pr_i32s){p->block_table[g], (uint32_t)p->num_blocks[g]};
    if (p->is_new && p->sampling_len >= sizeof(struct pr_sampling)) {
      sch_srv_sampling_from_blob(p->sampling, p->sampling_len, &q->sampling);
      if ((q->sampling.grammar_kind || q->sampling.bad_lens.n) && p->start_pos > p->num_prompt) {
        /* resumed past generated tokens the prefix cache holds: the worker's matcher
         * and bad words follow them (p->tokens points into the request's tokens at
         * start_pos) */
        uint32_t n = (uint32_t)(p->start_pos - p->num_prompt);
        q->generated = (struct pr_u32s){(const uint32_t *)p->tokens - n, n};
      }
      const struct pr_sampling *sp = &q->sampling;
      /* the tokens the step does not run count for the penalties all the same, and n-gram
       * drafts are looked up among them: for those alone a step carries at most
       * SCH_SPEC_BEFORE_MAX (its message's size), a sequence past it goes without (its
       * workers then propose no n-gram drafts for it) */
      int pen =
          sp->presence_penalty != 0 || sp->frequency_penalty != 0 || sp->repetition_penalty != 1;
      int spec =
          !pen && s->speculative && spec_before + (uint64_t)p->start_pos <= SCH_SPEC_BEFORE_MAX;
      if (p->start_pos > 0 && (pen || spec)) {
        spec_before += spec ? (uint64_t)p->start_pos : 0;
        q->before =
            (struct pr_u32s){(const uint32_t *)p->tokens - p->start_pos, (uint32_t)p->start_pos};
      }
    } else {
      pr_sampling_default(&q->sampling);
    }
    if (p->num_images > 0) {
      q->images = s->step_images + used_images;
      q->n_images = (uint32_t)p->num_images;
      used_images += (size_t)p->num_images;
      for (int32_t j = 0; j < p->num_images; j++) {
        const struct sch_image *im = &p->images[j];
        q->images[j] = (struct pr_image){(uint32_t)im->pos, (uint32_t)im->num_tokens,
                                         im->hash,          {im->data, (uint32_t)im->len},
                                         im->width,         im->height,
                                         im->kind};
      }
    }
    if (p->start_pos < p->num_prompt)
      s->prompt_tokens += (uint64_t)CM_MIN(p->num_tokens, p->num_prompt - p->start_pos);
    if (r->scheduled_ns == 0) r->scheduled_ns = wall;
  }
  struct pr_msg m;
  pr_msg_init(&m, PR_STEP);
  m.u.step.step_id = plan.step_id;
  m.u.step.seqs = s->step_seqs;
  m.u.step.n_seqs = (uint32_t)plan.num_seqs;
  m.u.step.free_ids = (struct pr_u64s){s->pending_free, s->num_pending_free};
  CM_ASSERT(s->num_in_flight < 2);
  int32_t fi = s->num_in_flight++;
  s->flight_id[fi] = plan.step_id;
  s->num_steps_ahead += fi > 0;
  if ((rc = pr_msg_encode(&m, &s->step_buf))) {
    /* nothing a worker did: our own plan does not encode (too big for a message) */
    cm_error(TAG, "step %llu does not encode: %s", (unsigned long long)plan.step_id,
             cm_strerror(rc));
    fail_rank(s, 0, rc, "the scheduler could not encode a step");
    return;
  }
  int32_t bad = send_step(s);
  if (bad) {
    fail_rank(s, bad - 1, CM_ERR_CLOSED, "cannot take a STEP");
    return;
  }
  /* consumed drafts are not verified twice */
  for (int32_t i = 0; i < plan.num_seqs; i++) {
    struct sch_req *r = sch_reqs_by_eid(&s->reqs, plan.seqs[i].req_id);
    if (r) r->num_drafts = 0;
  }
  s->num_pending_free = 0;
  s->flight_sent_ns[fi] = cm_time_ns();
  s->step_ns_plan += s->flight_sent_ns[fi] - t0;
}

void sch_srv_work_shutdown(struct sch_server *s) {
  struct pr_msg m;
  pr_msg_init(&m, PR_CTRL);
  m.u.ctrl.op = PR_CTRL_SHUTDOWN;
  for (int32_t r = 0; s->ranks && r < s->cfg.world_size; r++)
    if (s->ranks[r].known) (void)pr_sock_send(s->work_sock, &s->ranks[r].rid, &m, PR_DONTWAIT);
}
