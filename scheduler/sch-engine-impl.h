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

  /* the plan, rebuilt in place every step */
  struct sch_plan_seq *plan_seqs; /* [max_num_seqs] */
  struct sch_request **plan_reqs; /* [max_num_seqs] request of each plan entry, NULL
                                     once aborted */
  int32_t plan_num;               /* entries in the step in flight */
  uint64_t plan_image_bytes;      /* image payload bytes of the step being planned */
  bool in_flight;
  uint64_t step_id;

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

  uint64_t next_arrival;
  uint64_t next_admit;
  uint64_t num_preemptions;
  uint64_t spec_drafts, spec_draft_tokens, spec_accepted;
  uint64_t spec_accepted_pos[SCH_MAX_SPEC_TOKENS]; /* see sch_engine_stats */
};

/* Records that the workers may forget request id (it left the running set). */
void sch_engine_note_gone(struct sch_engine *e, uint64_t id);
/* Releases a finished or aborted request: blocks, queues, map, memory. */
void sch_engine_drop(struct sch_engine *e, struct sch_request *r);

#endif
