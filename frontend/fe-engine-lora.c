/* fe-engine-lora.c — LoRA adapters loaded and unloaded at run time, as the engine
 * does them: one LORA to every replica's scheduler, the router told once each has
 * answered LORA_DONE (scheduler/sch-server-lora.c has its workers load the adapter
 * before it answers).
 *
 * A load counts when every replica that answered loaded it; a replica not ready when
 * it is sent is skipped (its requests load the adapter when they name it, their ADD
 * carrying the path), but one at least must answer. A replica lost meanwhile (or whose
 * scheduler restarted), or no answer in FE_ENG_LORA_TIMEOUT_S, fails the load; so does
 * any replica's refusal, and every replica it went to is then told to unload it. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-log.h"
#include "common/cm-time.h"
#include "frontend/fe-engine-impl.h"

#define TAG "fe-engine"

/* Seconds a load may take: an adapter of a large model is read and cut on every rank. */
#define FE_ENG_LORA_TIMEOUT_S 600

struct fe_eng_lora_op {
  uint64_t nonce;
  int op;
  uint64_t uid;
  uint8_t sent[FE_ENG_MAX_REPLICAS];    /* sent */
  uint8_t waiting[FE_ENG_MAX_REPLICAS]; /* sent, not answered */
  int n_waiting;
  int code; /* the first failure */
  char msg[512];
  uint64_t t0; /* monotonic */
  fe_lora_done_fn done;
  void *arg;
  struct fe_eng_lora_op *next;
};

static int send_lora(struct fe_replica *p, uint64_t nonce, int op, uint64_t uid, const char *path) {
  struct pr_msg m;
  pr_msg_init(&m, PR_LORA);
  m.u.lora.nonce = nonce;
  m.u.lora.op = (uint32_t)op;
  m.u.lora.uid = uid;
  m.u.lora.path = path;
  return fe_eng_send(p, &m);
}

/* o's first failure, unless it has one. */
__attribute__((format(printf, 3, 4))) static void fail(struct fe_eng_lora_op *o, int code,
                                                       const char *fmt, ...) {
  if (o->code) return;
  o->code = code < 0 ? code : CM_ERR_IO;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(o->msg, sizeof(o->msg), fmt, ap);
  va_end(ap);
}

/* Unlinks o, tells its router, frees it. */
static void finish(struct fe_engine *e, struct fe_eng_lora_op *o) {
  struct fe_eng_lora_op **at = &e->lora_ops;
  while (*at && *at != o)
    at = &(*at)->next;
  if (*at) *at = o->next;
  if (o->code && o->op == PR_LORA_LOAD) /* none keeps what the others refused (nor one */
    for (int i = 0; i < e->n_rep; i++)  /* still loading it: it frees it once loaded) */
      if (o->sent[i]) send_lora(&e->rep[i], 0, PR_LORA_UNLOAD, o->uid, NULL);
  o->done(o->arg, o->code, o->code ? o->msg : NULL);
  free(o);
}

int fe_eng_lora(void *ud, int op, uint64_t uid, const char *path, fe_lora_done_fn done, void *arg) {
  struct fe_engine *e = ud;
  struct fe_eng_lora_op *o = calloc(1, sizeof(*o));
  if (!o) return CM_ERR_NOMEM;
  o->nonce = ++e->lora_nonce;
  o->op = op;
  o->uid = uid;
  o->t0 = cm_time_ns();
  o->done = done;
  o->arg = arg;
  /* nothing received while the LORAs go out: a sender descheduled after its send may
   * find the answer waiting when it runs again, before the op is linked */
  int was_pumping = e->pumping;
  e->pumping = 1;
  for (int i = 0; i < e->n_rep; i++) {
    struct fe_replica *p = &e->rep[i];
    if (!fe_eng_rep_ready(p)) continue; /* (its requests load it when they name it) */
    int rc = send_lora(p, o->nonce, op, uid, path);
    if (rc) {
      cm_warn(TAG, "LORA to %s not sent: %s", p->endpoint, cm_strerror(rc));
      continue;
    }
    o->sent[i] = o->waiting[i] = 1;
    o->n_waiting++;
  }
  int rc = 0;
  if (o->n_waiting) {
    o->next = e->lora_ops;
    e->lora_ops = o;
  } else {
    free(o);
    rc = CM_ERR_AGAIN;
  }
  e->pumping = was_pumping;
  if (!was_pumping) fe_eng_pump(e);
  return rc;
}

void fe_eng_on_lora_done(struct fe_replica *p, const struct pr_lora *m) {
  struct fe_engine *e = p->e;
  struct fe_eng_lora_op *o = e->lora_ops;
  while (o && o->nonce != m->nonce)
    o = o->next;
  if (!o || !o->waiting[p->index]) return; /* (an unload sent after a failed load) */
  o->waiting[p->index] = 0;
  o->n_waiting--;
  if (m->code)
    fail(o, m->code, "%s", m->message && *m->message ? m->message : cm_strerror(m->code));
  if (!o->n_waiting) finish(e, o);
}

void fe_eng_lora_lost(struct fe_replica *p) {
  struct fe_engine *e = p->e;
  for (struct fe_eng_lora_op *o = e->lora_ops, *next; o; o = next) {
    next = o->next;
    if (!o->waiting[p->index]) continue;
    o->waiting[p->index] = 0;
    o->n_waiting--;
    fail(o, CM_ERR_AGAIN, "the scheduler %s was lost before it answered; load the adapter again",
         p->endpoint);
    if (!o->n_waiting) finish(e, o);
  }
}

void fe_eng_lora_tick(struct fe_engine *e, uint64_t now) {
  /* nothing received while the list is walked: an answer would free the op after this */
  int was_pumping = e->pumping;
  e->pumping = 1;
  for (struct fe_eng_lora_op *o = e->lora_ops, *next; o; o = next) {
    next = o->next;
    if (now - o->t0 < (uint64_t)FE_ENG_LORA_TIMEOUT_S * 1000000000ull) continue;
    fail(o, CM_ERR_TIMEOUT, "the workers did not load the adapter in %d s", FE_ENG_LORA_TIMEOUT_S);
    finish(e, o);
  }
  e->pumping = was_pumping;
  if (!was_pumping) fe_eng_pump(e);
}

void fe_eng_lora_free(struct fe_engine *e) {
  while (e->lora_ops) {
    struct fe_eng_lora_op *o = e->lora_ops;
    e->lora_ops = o->next;
    free(o);
  }
}
