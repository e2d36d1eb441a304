/* sch-engine-impl.h — the body of struct sch_engine, shared by sch-engine.c (requests,
 * aborts, stats, checks) and sch-planner.c (plan and apply). Not for other modules. */
#ifndef LMSERVE_SCH_ENGINE_IMPL_H
#define LMSERVE_SCH_ENGINE_IMPL_H

#include "scheduler/sch-block-pool.h"
#include "scheduler/sch-engine.h"
#include "scheduler/sch-kv.h"
#include "scheduler/sch-queue.h"
#include "scheduler/sch-request.h"

struct sch_engine {
  struct sch_engine_config cfg;
  struct sch_block_pool *pool;
  struct sch_kv *kv;
  struct sch_queue q;

  /* Two plan slots, rebuilt in place: the step in flight and, with
   * async_scheduling, the one planned behind it (a plan takes the slot no step in
   * flight holds). */
  struct sch_plan_seq *plan_seqs[2]; /* [max_num_seqs] each */
  struct sch_request **plan_reqs[2]; /* [max_num_seqs] request of each plan entry, NULL
                                        once aborted, finished or preempted */
  int32_t plan_num[2];               /* entries of each slot */
  uint64_t plan_image_bytes;         /* image payload bytes of the step being planned */
  int32_t num_in_flight;             /* 0, 1, or 2 with async_scheduling */
  uint64_t flight_step[2];           /* the steps in flight, oldest first */
  int32_t flight_slot[2];            /* their plan slots */
  int32_t cur_slot;                  /* the slot of the step being planned */
  uint64_t step_id;                  /* the latest planned */

  /* ids the workers may forget: double-buffered so that the plan's list stays valid
   * while apply and abort fill the next one */
  uint64_t *gone[2]; /* [gone_cap] each */
  int32_t gone_num[2];
  int32_t gone_cur; /* the buffer being filled */
  int32_t gone_cap;
  uint64_t *preempted; /* [max_num_seqs] preempted by the current plan */
  int32_t num_preempted;

  /* outputs of apply */
  struct sch_output *outs; /* [max_num_seqs] */
  int32_t *out_tokens;     /* [max_num_seqs * (num_spec_tokens + 1)] */

  bool grammars_ready; /* sch_engine_set_grammars */
  uint64_t lora_ready; /* bit slot - 1: the workers hold that run-time LoRA slot */
  uint64_t next_arrival;
  uint64_t next_admit;
  uint64_t num_preemptions;
  uint64_t spec_drafts, spec_draft_tokens, spec_accepted;
  uint64_t spec_accepted_pos[SCH_MAX_SPEC_TOKENS]; /* see sch_engine_stats */
};

/* r's entry in the step in flight in slot i, or NULL. */
static inline struct sch_req_sched *sch_engine_flight_sched(struct sch_engine *e,
                                                            struct sch_request *r, int32_t i) {
  if (i >= e->num_in_flight) return NULL;
  int32_t slot = e->flight_slot[i];
  struct sch_req_sched *sc = &r->sched[slot];
  return sc->step == e->flight_step[i] && sc->index >= 0 ? sc : NULL;
}

/* Takes r out of every step in flight (it was aborted, finished or preempted): the
 * workers still run those steps, and their results for r are ignored. */
void sch_engine_unplan(struct sch_engine *e, struct sch_request *r);

/* Records that the workers may forget request id (it left the running set). */
void sch_engine_note_gone(struct sch_engine *e, uint64_t id);
/* Releases a finished or aborted request: blocks, queues, map, memory. */
void sch_engine_drop(struct sch_engine *e, struct sch_request *r);

#endif
