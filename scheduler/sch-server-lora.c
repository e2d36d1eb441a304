/* sch-server-lora.c — LoRA adapters loaded at run time (the frontend's POST
 * /v1/load_lora_adapter), in the slots after the workers' --lora-modules list.
 *
 * An adapter is named by the frontend's id (uid) and its path. The first LORA load or
 * ADD that names an adapter no slot holds takes a free slot, or the one used longest
 * ago that no request runs with, and sends every rank CTRL LORA_LOAD; the slot is
 * ready when every rank has answered LORA_ACK. Meanwhile the requests that name it
 * wait (admission passes them over, sch_engine_set_lora) and so do the frontends'
 * LORA loads (their LORA_DONE goes out then). A rank that could not load it fails the
 * slot: its requests get an ERR with the rank's reason, the loads a LORA_DONE with it,
 * and the slot is free again (a later request tries anew). A LORA unload frees the slot
 * once no request runs with it. A failed rank empties every slot: the requests are
 * gone with it, and a request that names an adapter again loads it again, since its
 * ADD carries the path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-hash.h"
#include "common/cm-log.h"
#include "common/cm-time.h"
#include "scheduler/sch-server-impl.h"

#define TAG "sch"

/* Seconds every rank may take to load an adapter before the load fails. */
#define SCH_LORA_LOAD_TIMEOUT_S 600

/* Sends LORA_DONE for (front, nonce). */
static void send_done(struct sch_server *s, int32_t front, uint64_t nonce, int code,
                      const char *msg) {
  if (front < 0 || front >= SCH_SRV_MAX_FRONTS) return;
  struct pr_msg m;
  pr_msg_init(&m, PR_LORA_DONE);
  m.u.lora.nonce = nonce;
  m.u.lora.code = code;
  m.u.lora.message = msg;
  int rc = pr_sock_send(s->front_sock, &s->fronts[front].rid, &m, PR_DONTWAIT);
  if (rc) cm_warn(TAG, "frontend %d: LORA_DONE not sent: %s", (int)front, cm_strerror(rc));
}

/* Sends CTRL op (LORA_LOAD with the path, LORA_DROP) with arg (the slot, and for a load
 * its number above the low 8 bits) to every ready rank; how many it went to. */
static int32_t send_ctrl(struct sch_server *s, uint32_t op, int64_t arg, const char *path) {
  const int32_t slot = (int32_t)(arg & 0xff);
  int32_t n = 0;
  for (int32_t r = 0; r < s->cfg.world_size; r++) {
    struct sch_rank *k = &s->ranks[r];
    if (!k->ready) continue;
    struct pr_msg m;
    pr_msg_init(&m, PR_CTRL);
    m.u.ctrl.op = op;
    m.u.ctrl.arg = arg;
    m.u.ctrl.text = path;
    int rc = pr_sock_send(s->work_sock, &k->rid, &m, 0);
    if (rc)
      cm_warn(TAG, "worker rank %d: CTRL for LoRA slot %d not sent: %s", (int)r, (int)slot,
              cm_strerror(rc));
    else
      n++;
  }
  return n;
}

static struct sch_lora_slot *slot_of(struct sch_server *s, int32_t slot) {
  return slot > (int32_t)s->info.n_lora && slot <= PR_MAX_LORAS ? &s->loras[slot] : NULL;
}

/* Empties slot i: its loads are answered with (code, msg) when code is not 0; the ranks
 * sent its adapter free it (after loading it, when they still are). */
static void slot_clear(struct sch_server *s, int32_t i, int code, const char *msg) {
  struct sch_lora_slot *l = &s->loras[i];
  if (l->uid && l->gen) send_ctrl(s, PR_CTRL_LORA_DROP, i, NULL);
  for (int32_t w = 0; w < l->n_wait; w++) {
    send_done(s, l->wait[w].front, l->wait[w].nonce, code, msg);
    s->fronts[l->wait[w].front].num_live--;
  }
  if (s->engine) sch_engine_set_lora(s->engine, i, false);
  free(l->path);
  memset(l, 0, sizeof(*l));
}

/* The slot adapter uid has, or would take: one that holds (or loads) it, else a free
 * one, else the idle one used longest ago. Its number (nothing changes), or a negative
 * cm_err with the reason in err. */
static int32_t pick(struct sch_server *s, uint64_t uid, const char *path, char *err,
                    size_t errlen) {
  int32_t first = (int32_t)s->info.n_lora + 1, at = 0;
  for (int32_t i = first; i <= PR_MAX_LORAS; i++)
    if (s->loras[i].uid == uid) return i;
  if (!s->serving)
    return cm_fail(err, errlen, CM_ERR_AGAIN, "the workers are not ready (LoRA adapter %s)", path);
  for (int32_t i = first; i <= PR_MAX_LORAS && !at; i++)
    if (!s->loras[i].uid) at = i;
  for (int32_t i = first, none_free = !at; none_free && i <= PR_MAX_LORAS; i++) {
    const struct sch_lora_slot *l = &s->loras[i]; /* (none holds a request or a load) */
    if (l->ready && !l->refs && !l->n_wait && (!at || l->used < s->loras[at].used)) at = i;
  }
  if (!at)
    return cm_fail(err, errlen, CM_ERR_FULL,
                   "every run-time LoRA slot (%d) has requests running with its adapter",
                   PR_MAX_LORAS - first + 1);
  return at;
}

/* pick's slot, taken: when it does not hold the adapter, emptied and sent LORA_LOAD. */
static int32_t take(struct sch_server *s, uint64_t uid, const char *path, char *err,
                    size_t errlen) {
  int32_t at = pick(s, uid, path, err, errlen);
  if (at < 0) return at;
  struct sch_lora_slot *l = &s->loras[at];
  if (l->uid == uid) {
    l->used = ++s->lora_tick;
    return at;
  }
  if (l->uid) cm_info(TAG, "LoRA slot %d: %s makes way for %s", (int)at, l->path, path);
  slot_clear(s, at, 0, NULL);
  if (!(l->path = strdup(path))) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  l->uid = uid;
  l->used = ++s->lora_tick;
  l->gen = ++s->lora_gen;
  l->load_ns = cm_time_ns();
  l->expect = send_ctrl(s, PR_CTRL_LORA_LOAD, (int64_t)(l->gen << 8 | (uint64_t)at), path);
  if (l->expect < s->cfg.world_size) {
    slot_clear(s, at, 0, NULL);
    return cm_fail(err, errlen, CM_ERR_AGAIN, "LoRA adapter %s could not be sent to every rank",
                   path);
  }
  cm_info(TAG, "LoRA adapter %s: loading into slot %d", path, (int)at);
  return at;
}

int32_t sch_srv_lora_pick(struct sch_server *s, uint64_t uid, const char *path, char *err,
                          size_t errlen) {
  return pick(s, uid, path, err, errlen);
}

int32_t sch_srv_lora_acquire(struct sch_server *s, uint64_t uid, const char *path, char *err,
                             size_t errlen) {
  int32_t slot = take(s, uid, path, err, errlen);
  if (slot > 0) s->loras[slot].refs++;
  return slot;
}

/* Frees slot i when it is to go and nothing holds it. */
static void maybe_unload(struct sch_server *s, int32_t i) {
  struct sch_lora_slot *l = &s->loras[i];
  if (!l->uid || !l->unload || l->refs || l->n_wait) return;
  cm_info(TAG, "LoRA slot %d (%s) unloaded", (int)i, l->path);
  slot_clear(s, i, 0, NULL);
}

void sch_srv_lora_release(struct sch_server *s, int32_t slot) {
  struct sch_lora_slot *l = slot_of(s, slot);
  if (!l || !l->uid || l->refs <= 0) return;
  l->refs--;
  maybe_unload(s, slot);
}

void sch_srv_on_lora(struct sch_server *s, int32_t front, const struct pr_lora *m) {
  char err[512] = "";
  if (!m->uid || (m->op != PR_LORA_LOAD && m->op != PR_LORA_UNLOAD) ||
      (m->op == PR_LORA_LOAD && (!m->path || !*m->path))) {
    send_done(s, front, m->nonce, CM_ERR_INVAL, "LORA needs an op, a uid and (to load) a path");
    return;
  }
  if (m->op == PR_LORA_UNLOAD) {
    for (int32_t i = (int32_t)s->info.n_lora + 1; i <= PR_MAX_LORAS; i++)
      if (s->loras[i].uid == m->uid) {
        s->loras[i].unload = true;
        maybe_unload(s, i);
      }
    send_done(s, front, m->nonce, 0, NULL);
    return;
  }
  int32_t slot = take(s, m->uid, m->path, err, sizeof(err));
  if (slot < 0) {
    send_done(s, front, m->nonce, slot, err);
    return;
  }
  struct sch_lora_slot *l = &s->loras[slot];
  l->unload = false; /* (loaded again before it went) */
  if (l->ready) {
    send_done(s, front, m->nonce, 0, NULL);
    return;
  }
  if (l->n_wait == SCH_LORA_WAITERS) {
    send_done(s, front, m->nonce, CM_ERR_AGAIN, "too many loads of this adapter at once");
    return;
  }
  l->wait[l->n_wait].front = front;
  l->wait[l->n_wait++].nonce = m->nonce;
  s->fronts[front].num_live++; /* (its entry stays its own until answered) */
}

/* Slot i's load failed: its requests get an ERR, its loads a LORA_DONE, and the slot is
 * free again (a later request loads the adapter anew). */
static void slot_failed(struct sch_server *s, int32_t slot, int code, const char *why) {
  char msg[sizeof(s->loras[0].msg)];
  snprintf(msg, sizeof(msg), "%s", why);
  cm_warn(TAG, "LoRA adapter %s (slot %d): %s", s->loras[slot].path, (int)slot, msg);
  for (int32_t i = 0; i < s->reqs.cap; i++) {
    struct sch_req *q = &s->reqs.slots[i];
    if (!q->eid || q->lora_slot != slot) continue;
    int32_t front = q->front;
    uint64_t id = q->request_id;
    sch_srv_drop(s, q, true);
    sch_srv_send_err(s, front, id, code, "LoRA adapter: %s", msg);
  }
  slot_clear(s, slot, code, msg);
}

void sch_srv_on_lora_ack(struct sch_server *s, int32_t rank, const struct pr_lora *m) {
  struct sch_lora_slot *l = slot_of(s, (int32_t)m->slot);
  if (!l || !l->uid || l->ready || l->gen != m->nonce >> 8) { /* (a load since replaced) */
    cm_info(TAG, "worker rank %d: LORA_ACK of an earlier load into slot %u; dropped", (int)rank,
            (unsigned)m->slot);
    return;
  }
  int32_t slot = (int32_t)m->slot;
  if (m->code && !l->code) {
    l->code = m->code;
    snprintf(l->msg, sizeof(l->msg), "worker rank %d: %s", (int)rank,
             m->message && *m->message ? m->message : cm_strerror(m->code));
  }
  if (++l->acked < l->expect) return;
  if (l->code) {
    slot_failed(s, slot, l->code, l->msg);
    return;
  }
  l->ready = true;
  if (s->engine) sch_engine_set_lora(s->engine, slot, true);
  for (int32_t w = 0; w < l->n_wait; w++) {
    send_done(s, l->wait[w].front, l->wait[w].nonce, 0, NULL);
    s->fronts[l->wait[w].front].num_live--;
  }
  l->n_wait = 0;
  s->plan_idle = false;
  cm_info(TAG, "LoRA adapter %s ready in slot %d", l->path, (int)slot);
  maybe_unload(s, slot);
}

void sch_srv_lora_check(struct sch_server *s) {
  uint64_t now = cm_time_ns(), limit = (uint64_t)SCH_LORA_LOAD_TIMEOUT_S * 1000000000ull;
  for (int32_t i = 1; i <= PR_MAX_LORAS; i++) {
    const struct sch_lora_slot *l = &s->loras[i];
    if (l->uid && !l->ready && now - l->load_ns > limit)
      slot_failed(s, i, CM_ERR_TIMEOUT, "the workers did not load it in time");
  }
}

void sch_srv_lora_reset(struct sch_server *s, const char *why) {
  for (int32_t i = 1; i <= PR_MAX_LORAS; i++)
    if (s->loras[i].uid) slot_clear(s, i, CM_ERR_AGAIN, why);
}

uint64_t sch_srv_lora_salt(uint64_t salt, uint64_t uid) {
  return cm_mix64(salt ^ cm_mix64(0x52544c6f5241ull ^ uid));
}
