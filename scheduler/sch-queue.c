/* sch-queue.c — waiting list, running array and id map of the scheduler. */
#include "scheduler/sch-queue.h"

#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "scheduler/sch-hash.h"

int sch_queue_init(struct sch_queue *q, int32_t max_running, int32_t max_live) {
  memset(q, 0, sizeof(*q));
  if (max_running <= 0 || max_live <= 0) return CM_ERR_INVAL;
  size_t nb = 16;
  while (nb < (size_t)max_live)
    nb <<= 1;
  q->running = calloc((size_t)max_running, sizeof(*q->running));
  q->buckets = calloc(nb, sizeof(*q->buckets));
  if (!q->running || !q->buckets) {
    sch_queue_free(q);
    return CM_ERR_NOMEM;
  }
  q->max_running = max_running;
  q->mask = nb - 1;
  return 0;
}

void sch_queue_free(struct sch_queue *q) {
  free(q->running);
  free(q->buckets);
  memset(q, 0, sizeof(*q));
}

/* ---- id map --------------------------------------------------------------------- */

static struct sch_request **bucket_of(const struct sch_queue *q, uint64_t id) {
  return &q->buckets[cm_mix64(id) & q->mask];
}

void sch_queue_map_add(struct sch_queue *q, struct sch_request *r) {
  struct sch_request **b = bucket_of(q, r->id);
  r->hnext = *b;
  *b = r;
  q->num_live++;
}

void sch_queue_map_remove(struct sch_queue *q, struct sch_request *r) {
  struct sch_request **link = bucket_of(q, r->id);
  while (*link != r) {
    CM_ASSERT(*link != NULL);
    link = &(*link)->hnext;
  }
  *link = r->hnext;
  r->hnext = NULL;
  q->num_live--;
}

struct sch_request *sch_queue_find(const struct sch_queue *q, uint64_t id) {
  for (struct sch_request *r = *bucket_of(q, id); r; r = r->hnext)
    if (r->id == id) return r;
  return NULL;
}

/* ---- waiting list --------------------------------------------------------------- */

static int goes_before(const struct sch_request *a, const struct sch_request *b) {
  if (a->priority != b->priority) return a->priority < b->priority;
  return a->arrival_seq < b->arrival_seq;
}

void sch_queue_wait_insert(struct sch_queue *q, struct sch_request *r) {
  /* new arrivals belong at the tail: walk from there */
  struct sch_request *after = q->wait_tail;
  while (after && goes_before(r, after))
    after = after->prev;
  r->prev = after;
  r->next = after ? after->next : q->wait_head;
  if (r->next)
    r->next->prev = r;
  else
    q->wait_tail = r;
  if (after)
    after->next = r;
  else
    q->wait_head = r;
  q->num_waiting++;
}

void sch_queue_wait_remove(struct sch_queue *q, struct sch_request *r) {
  if (r->prev)
    r->prev->next = r->next;
  else
    q->wait_head = r->next;
  if (r->next)
    r->next->prev = r->prev;
  else
    q->wait_tail = r->prev;
  r->prev = r->next = NULL;
  q->num_waiting--;
}

/* ---- running array -------------------------------------------------------------- */

void sch_queue_run_push(struct sch_queue *q, struct sch_request *r) {
  CM_ASSERT(q->num_running < q->max_running);
  r->run_index = q->num_running;
  q->running[q->num_running++] = r;
}

void sch_queue_run_remove(struct sch_queue *q, struct sch_request *r) {
  int32_t i = r->run_index;
  CM_ASSERT(i >= 0 && i < q->num_running && q->running[i] == r);
  for (int32_t j = i + 1; j < q->num_running; j++) {
    q->running[j - 1] = q->running[j];
    q->running[j - 1]->run_index = j - 1;
  }
  q->num_running--;
  r->run_index = -1;
}
