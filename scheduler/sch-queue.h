/* sch-queue.h — the scheduler's request containers: the waiting queue (ordered by
 * priority, then arrival), the running array (admission order) and the id map of every
 * live request. Intrusive: the links live in struct sch_request, so moving a request
 * between containers allocates nothing. The queue does not own the requests. */
#ifndef LMSERVE_SCH_QUEUE_H
#define LMSERVE_SCH_QUEUE_H

#include <stdint.h>

#include "scheduler/sch-request.h"

struct sch_queue {
  struct sch_request *wait_head, *wait_tail; /* waiting list, best first */
  int32_t num_waiting;
  struct sch_request **running; /* [max_running] in admission order */
  int32_t num_running;
  int32_t max_running;
  struct sch_request **buckets; /* [mask + 1] id map chains */
  uint64_t mask;
  int32_t num_live; /* requests in the map */
};

/* max_running: the running cap; max_live sizes the id map (chains stay short up to it;
 * more still works). Returns 0 or CM_ERR_NOMEM / CM_ERR_INVAL. */
int sch_queue_init(struct sch_queue *q, int32_t max_running, int32_t max_live);
void sch_queue_free(struct sch_queue *q);

void sch_queue_map_add(struct sch_queue *q, struct sch_request *r);
void sch_queue_map_remove(struct sch_queue *q, struct sch_request *r);
struct sch_request *sch_queue_find(const struct sch_queue *q, uint64_t id);

/* Inserts by (priority, arrival_seq): a preempted request goes back before every
 * request of its priority that arrived after it. */
void sch_queue_wait_insert(struct sch_queue *q, struct sch_request *r);
void sch_queue_wait_remove(struct sch_queue *q, struct sch_request *r);
static inline struct sch_request *sch_queue_wait_front(const struct sch_queue *q) {
  return q->wait_head;
}

/* Appends to the running array (the caller checks the cap). */
void sch_queue_run_push(struct sch_queue *q, struct sch_request *r);
/* Removes from the running array, keeping the order of the others. */
void sch_queue_run_remove(struct sch_queue *q, struct sch_request *r);

#endif
