/* sch-engine.c — the engine's life cycle: configuration, admission of requests, aborts,
 * statistics and the invariant check. Planning and applying results: sch-planner.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "scheduler/sch-engine-impl.h"

void sch_engine_config_default(struct sch_engine_config *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  cfg->num_groups = 1;
  cfg->groups[0].block_tokens = 16;
  cfg->groups[0].window = 0;
  cfg->max_num_seqs = 256;
  cfg->max_num_batched_tokens = 8192;
  cfg->max_waiting = 4096;
  cfg->enable_prefix_caching = true;
  cfg->hash_key = 0x6c6d73657276652dull;
}

static int check_config(const struct sch_engine_config *c, char *err, size_t err_len) {
  if (c->num_blocks <= 0) return cm_fail(err, err_len, CM_ERR_INVAL, "num_blocks must be positive");
  if (c->num_groups < 1 || c->num_groups > SCH_MAX_GROUPS)
    return cm_fail(err, err_len, CM_ERR_INVAL, "num_groups must be 1..%d", SCH_MAX_GROUPS);
  for (int32_t g = 0; g < c->num_groups; g++)
    if (c->groups[g].block_tokens < 1 || c->groups[g].block_tokens > 4096 ||
        c->groups[g].window < 0)
      return cm_fail(err, err_len, CM_ERR_INVAL, "KV group %d: bad block size %d or window %d", (int)g,
                     (int)c->groups[g].block_tokens, (int)c->groups[g].window);
  if (c->max_num_seqs < 1 || c->max_num_seqs > (1 << 20))
    return cm_fail(err, err_len, CM_ERR_INVAL, "max_num_seqs must be 1..%d", 1 << 20);
  if (c->max_model_len < 1) return cm_fail(err, err_len, CM_ERR_INVAL, "max_model_len must be positive");
  if (c->num_spec_tokens < 0 || c->num_spec_tokens > SCH_MAX_SPEC_TOKENS)
    return cm_fail(err, err_len, CM_ERR_INVAL, "num_spec_tokens must be 0..64");
  if (c->spec_disable_batch < 0 || c->spec_disable_batch == 1)
    return cm_fail(err, err_len, CM_ERR_INVAL, "spec_disable_batch must be 0 or at least 2");
  if (c->max_num_batched_tokens < 1 + c->num_spec_tokens)
    return cm_fail(err, err_len, CM_ERR_INVAL, "max_num_batched_tokens must hold one decode with its drafts");
  if (c->max_waiting < 1) return cm_fail(err, err_len, CM_ERR_INVAL, "max_waiting must be at least 1");
  if (c->long_prefill_threshold < 0)
    return cm_fail(err, err_len, CM_ERR_INVAL, "long_prefill_threshold must not be negative");
  if (c->num_eos_ids < 0 || c->num_eos_ids > SCH_MAX_EOS_IDS)
    return cm_fail(err, err_len, CM_ERR_INVAL, "at most %d eos ids", SCH_MAX_EOS_IDS);
  if (c->vocab_size < 0) return cm_fail(err, err_len, CM_ERR_INVAL, "vocab_size must not be negative");
  return 0;
}

int sch_engine_create(const struct sch_engine_config *cfg, struct sch_engine **out, char *err,
                      size_t err_len) {
  *out = NULL;
  int rc = check_config(cfg, err, err_len);
  if (rc) return rc;
  int32_t maxbt = 0;
  for (int32_t g = 0; g < cfg->num_groups; g++)
    maxbt = CM_MAX(maxbt, cfg->groups[g].block_tokens);
  struct sch_engine *e = calloc(1, sizeof(*e));
  if (!e) return CM_ERR_NOMEM;
  e->cfg = *cfg;
  e->grammars_ready = true;
  int32_t ns = cfg->max_num_seqs;
  rc = sch_block_pool_create(cfg->num_blocks, maxbt, &e->pool);
  if (rc) goto fail;
  rc = sch_kv_create(e->pool, cfg->groups, cfg->num_groups, cfg->enable_prefix_caching,
                     cfg->hash_key, &e->kv);
  if (rc) goto fail;
  rc = sch_queue_init(&e->q, ns, ns + cfg->max_waiting);
  if (rc) goto fail;
  rc = CM_ERR_NOMEM;
  e->gone_cap = ns;
  for (int i = 0; i < 2; i++) {
    e->plan_seqs[i] = calloc((size_t)ns, sizeof(*e->plan_seqs[i]));
    e->plan_reqs[i] = calloc((size_t)ns, sizeof(*e->plan_reqs[i]));
    if (!e->plan_seqs[i] || !e->plan_reqs[i]) goto fail;
  }
  e->gone[0] = calloc((size_t)ns, sizeof(uint64_t));
  e->gone[1] = calloc((size_t)ns, sizeof(uint64_t));
  e->preempted = calloc((size_t)ns, sizeof(uint64_t));
  e->outs = calloc((size_t)ns, sizeof(*e->outs));
  e->out_tokens = calloc((size_t)ns * (size_t)(cfg->num_spec_tokens + 1), sizeof(int32_t));
  if (!e->gone[0] || !e->gone[1] || !e->preempted || !e->outs || !e->out_tokens) goto fail;
  *out = e;
  return 0;
fail:
  if (rc == CM_ERR_INVAL) cm_fail(err, err_len, CM_ERR_INVAL, "invalid KV configuration");
  sch_engine_destroy(e);
  return rc;
}

void sch_engine_destroy(struct sch_engine *e) {
  if (!e) return;
  while (e->q.num_running > 0)
    sch_engine_drop(e, e->q.running[e->q.num_running - 1]);
  while (e->q.wait_head)
    sch_engine_drop(e, e->q.wait_head);
  sch_queue_free(&e->q);
  sch_kv_destroy(e->kv);
  sch_block_pool_destroy(e->pool);
  for (int i = 0; i < 2; i++) {
    free(e->plan_seqs[i]);
    free(e->plan_reqs[i]);
  }
  free(e->gone[0]);
  free(e->gone[1]);
  free(e->preempted);
  free(e->outs);
  free(e->out_tokens);
  free(e);
}

/* ---- requests ------------------------------------------------------------------- */

int sch_engine_add(struct sch_engine *e, const struct sch_request_params *p, char *err,
                   size_t err_len) {
  if (err && err_len) err[0] = '\0';
  if (sch_queue_find(&e->q, p->id)) {
    cm_fail(err, err_len, CM_ERR_INVAL, "request id %llu is already in use", (unsigned long long)p->id);
    return CM_ERR_INVAL;
  }
  if (e->q.num_waiting >= e->cfg.max_waiting) {
    cm_fail(err, err_len, CM_ERR_INVAL, "the queue is full (%d requests waiting)", (int)e->q.num_waiting);
    return CM_ERR_FULL;
  }
  struct sch_request *r;
  int rc = sch_request_create(&e->cfg, e->kv, p, &r, err, err_len);
  if (rc) return rc;
  r->arrival_seq = e->next_arrival++;
  sch_queue_map_add(&e->q, r);
  sch_queue_wait_insert(&e->q, r);
  return 0;
}

void sch_engine_unplan(struct sch_engine *e, struct sch_request *r) {
  for (int32_t i = 0; i < e->num_in_flight; i++) {
    struct sch_req_sched *sc = sch_engine_flight_sched(e, r, i);
    if (sc) e->plan_reqs[e->flight_slot[i]][sc->index] = NULL;
  }
  memset(r->sched, 0, sizeof(r->sched));
  r->sched[0].index = r->sched[1].index = -1;
}

void sch_engine_note_gone(struct sch_engine *e, uint64_t id) {
  int32_t c = e->gone_cur;
  CM_ASSERT(e->gone_num[c] < e->gone_cap);
  e->gone[c][e->gone_num[c]++] = id;
}

void sch_engine_drop(struct sch_engine *e, struct sch_request *r) {
  if (r->state == SCH_REQ_RUNNING) {
    sch_kv_free(e->kv, &r->kv);
    sch_queue_run_remove(&e->q, r);
  } else {
    sch_queue_wait_remove(&e->q, r);
  }
  if (r->in_worker) sch_engine_note_gone(e, r->id);
  sch_engine_unplan(e, r);
  r->state = SCH_REQ_FINISHED;
  sch_queue_map_remove(&e->q, r);
  sch_request_destroy(r);
}

int sch_engine_abort(struct sch_engine *e, uint64_t id) {
  struct sch_request *r = sch_queue_find(&e->q, id);
  if (!r) return CM_ERR_NOENT;
  sch_engine_drop(e, r);
  return 0;
}

/* ---- stats and checks ----------------------------------------------------------- */

bool sch_engine_set_grammars(struct sch_engine *e, bool ready) {
  e->grammars_ready = ready;
  for (const struct sch_request *r = e->q.wait_head; r; r = r->next)
    if (r->constrained) return true;
  return false;
}

void sch_engine_set_lora(struct sch_engine *e, int32_t slot, bool ready) {
  if (slot < 1 || slot > 64) return;
  uint64_t bit = 1ull << (slot - 1);
  e->lora_ready = ready ? e->lora_ready | bit : e->lora_ready & ~bit;
}

void sch_engine_stats(const struct sch_engine *e, struct sch_engine_stats *st) {
  memset(st, 0, sizeof(*st));
  st->num_running = e->q.num_running;
  st->num_waiting = e->q.num_waiting;
  st->kv_usage = sch_block_pool_usage(e->pool);
  st->num_blocks = sch_block_pool_num_blocks(e->pool);
  st->num_blocks_used = sch_block_pool_num_used(e->pool);
  st->num_blocks_cached_free = sch_block_pool_num_cached_free(e->pool);
  sch_kv_counters(e->kv, &st->prefix_queries, &st->prefix_hits);
  st->num_preemptions = e->num_preemptions;
  st->num_evictions = sch_block_pool_num_evictions(e->pool);
  st->num_steps = e->step_id;
  st->spec_num_drafts = e->spec_drafts;
  st->spec_num_draft_tokens = e->spec_draft_tokens;
  st->spec_num_accepted_tokens = e->spec_accepted;
  memcpy(st->spec_accepted_per_pos, e->spec_accepted_pos, sizeof(st->spec_accepted_per_pos));
}

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      snprintf(err, err_len, __VA_ARGS__);                                                         \
      rc = CM_ERR_STATE;                                                                           \
      goto out;                                                                                    \
    }                                                                                              \
  } while (0)

int sch_engine_check(const struct sch_engine *e, char *err, size_t err_len) {
  int rc = sch_block_pool_check(e->pool, err, err_len);
  if (rc) return rc;
  int32_t nb = sch_block_pool_num_blocks(e->pool), ng = e->cfg.num_groups;
  int32_t *refs = calloc((size_t)nb, sizeof(*refs));
  if (!refs) return CM_ERR_NOMEM;
  CHECK(e->q.num_running <= e->cfg.max_num_seqs, "%d running > max_num_seqs",
        (int)e->q.num_running);
  CHECK(e->q.num_running + e->q.num_waiting == e->q.num_live, "%d running + %d waiting != %d live",
        (int)e->q.num_running, (int)e->q.num_waiting, (int)e->q.num_live);
  for (int32_t i = 0; i < e->q.num_running; i++) {
    const struct sch_request *r = e->q.running[i];
    CHECK(r->state == SCH_REQ_RUNNING && r->run_index == i,
          "running[%d] is request %llu in "
          "state %d",
          (int)i, (unsigned long long)r->id, (int)r->state);
    CHECK(r->num_computed >= 0 && r->num_computed <= r->num_tokens && r->num_tokens <= r->cap &&
              r->cap <= r->max_len,
          "request %llu: computed %d, tokens %d, cap %d", (unsigned long long)r->id,
          (int)r->num_computed, (int)r->num_tokens, (int)r->cap);
    for (int32_t g = 0; g < ng; g++) {
      int32_t bt = e->cfg.groups[g].block_tokens;
      const struct sch_kv_seq *s = &r->kv;
      if (!e->num_in_flight)
        CHECK(s->len[g] == (r->num_computed + bt - 1) / bt,
              "request %llu group %d: %d blocks for %d computed tokens", (unsigned long long)r->id,
              (int)g, (int)s->len[g], (int)r->num_computed);
      for (int32_t j = 0; j < s->len[g]; j++) {
        int32_t id = s->table[g][j];
        if (id == SCH_BLOCK_HOLE) {
          CHECK(e->cfg.groups[g].window > 0 && j < s->first_live[g],
                "request %llu group %d: hole at %d", (unsigned long long)r->id, (int)g, (int)j);
          continue;
        }
        CHECK(id >= 0 && id < nb, "request %llu: block id %d", (unsigned long long)r->id, (int)id);
        refs[id]++;
      }
    }
  }
  for (const struct sch_request *r = e->q.wait_head; r; r = r->next) {
    CHECK(r->state == SCH_REQ_WAITING || r->state == SCH_REQ_PREEMPTED,
          "waiting request %llu in state %d", (unsigned long long)r->id, (int)r->state);
    CHECK(r->num_computed == 0 && sch_kv_seq_num_blocks(&r->kv, ng) == 0 && r->kv.len[0] == 0,
          "waiting request %llu holds KV", (unsigned long long)r->id);
    CHECK(!r->next || r->priority < r->next->priority ||
              (r->priority == r->next->priority && r->arrival_seq < r->next->arrival_seq),
          "waiting queue out of order at %llu", (unsigned long long)r->id);
  }
  for (int32_t id = 0; id < nb; id++)
    CHECK(refs[id] == sch_block_pool_refcount(e->pool, id),
          "block %d: %d tables hold it, refcount %d", (int)id, (int)refs[id],
          (int)sch_block_pool_refcount(e->pool, id));
out:
  free(refs);
  return rc;
}
