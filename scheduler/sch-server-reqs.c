/* sch-server-reqs.c — the scheduler server's table of live requests. A request is
 * keyed two ways: by its engine id, whose low SCH_SRV_SLOT_BITS bits are its slot
 * (O(1) from a plan or an output back to the request), and by (frontend, request id)
 * through chained hash buckets (ADD duplicates, ABORT). The high bits of the engine id
 * are a serial number, so ids are never reused while the process lives. All memory is
 * taken at init: nothing is allocated per request. */
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "scheduler/sch-server-impl.h"

static uint32_t key_hash(int32_t front, uint64_t request_id) {
  uint64_t h = request_id * 0x9e3779b97f4a7c15ull ^ ((uint64_t)(uint32_t)front << 7);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 29;
  return (uint32_t)h;
}

int sch_reqs_init(struct sch_reqs *t, int32_t cap) {
  memset(t, 0, sizeof(*t));
  if (cap < 1 || cap > SCH_SRV_MAX_SLOTS) return CM_ERR_INVAL;
  int32_t nb = 1;
  while (nb < cap)
    nb <<= 1;
  t->slots = calloc((size_t)cap, sizeof(*t->slots));
  t->free_list = malloc((size_t)cap * sizeof(*t->free_list));
  t->buckets = malloc((size_t)nb * sizeof(*t->buckets));
  if (!t->slots || !t->free_list || !t->buckets) {
    sch_reqs_free(t);
    return CM_ERR_NOMEM;
  }
  t->cap = cap;
  t->nbuckets = nb;
  for (int32_t i = 0; i < nb; i++)
    t->buckets[i] = -1;
  /* hand out low slots first */
  for (int32_t i = 0; i < cap; i++)
    t->free_list[i] = cap - 1 - i;
  t->num_free = cap;
  return 0;
}

void sch_reqs_free(struct sch_reqs *t) {
  free(t->slots);
  free(t->free_list);
  free(t->buckets);
  memset(t, 0, sizeof(*t));
}

struct sch_req *sch_reqs_find(struct sch_reqs *t, int32_t front, uint64_t request_id) {
  int32_t i = t->buckets[key_hash(front, request_id) & (uint32_t)(t->nbuckets - 1)];
  while (i >= 0) {
    struct sch_req *r = &t->slots[i];
    if (r->front == front && r->request_id == request_id) return r;
    i = r->next;
  }
  return NULL;
}

struct sch_req *sch_reqs_add(struct sch_reqs *t, int32_t front, uint64_t request_id) {
  if (t->num_free == 0) return NULL;
  int32_t slot = t->free_list[--t->num_free];
  struct sch_req *r = &t->slots[slot];
  CM_ASSERT(r->eid == 0);
  memset(r, 0, sizeof(*r));
  t->serial++;
  r->eid = (t->serial << SCH_SRV_SLOT_BITS) | (uint64_t)slot;
  r->request_id = request_id;
  r->front = front;
  r->result = -1;
  r->logprobs = -1;
  r->prompt_lp = -1;
  uint32_t b = key_hash(front, request_id) & (uint32_t)(t->nbuckets - 1);
  r->next = t->buckets[b];
  t->buckets[b] = slot;
  t->num_live++;
  return r;
}

struct sch_req *sch_reqs_by_eid(struct sch_reqs *t, uint64_t eid) {
  uint64_t slot = eid & ((1ull << SCH_SRV_SLOT_BITS) - 1);
  if (eid == 0 || slot >= (uint64_t)t->cap) return NULL;
  struct sch_req *r = &t->slots[slot];
  return r->eid == eid ? r : NULL;
}

void sch_reqs_remove(struct sch_reqs *t, struct sch_req *r) {
  int32_t slot = (int32_t)(r - t->slots);
  CM_ASSERT(slot >= 0 && slot < t->cap && r->eid != 0);
  int32_t *link = &t->buckets[key_hash(r->front, r->request_id) & (uint32_t)(t->nbuckets - 1)];
  while (*link != slot) {
    CM_ASSERT(*link >= 0);
    link = &t->slots[*link].next;
  }
  *link = r->next;
  r->eid = 0;
  free(r->plp);
  free(r->plp_rank);
  free(r->plp_ids);
  free(r->plp_top);
  r->plp = r->plp_top = NULL;
  r->plp_ids = r->plp_rank = NULL;
  t->free_list[t->num_free++] = slot;
  t->num_live--;
}
