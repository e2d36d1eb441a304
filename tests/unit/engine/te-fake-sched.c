/* te-fake-sched.c — the scripted scheduler of the serving-path tests (see
 * te-fake-sched.h). */
#include "te-fake-sched.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/cm-err.h"
#include "common/cm-time.h"
#include "proto/pr-zmq.h"

#define MAX_LIVE 256

struct live {
  uint64_t id;
  uint32_t pos, max_tokens;
  int forever, err_after, logprobs, junk;
};

struct te_sched {
  void *ctx;
  struct pr_sock *sock;
  pthread_t th;
  pthread_mutex_t mu;
  int stop, mute;
  uint64_t gen_total; /* PONG generation_tokens */
  struct pr_rid peer;
  int have_peer;
  int32_t script[256];
  int n_script;
  int32_t eos;
  uint32_t max_model_len;
  struct live live[MAX_LIVE];
  int n_live;
  struct te_add adds[TE_MAX_ADDS];
  int n_adds;
  uint64_t aborted[TE_MAX_ADDS];
  int n_aborted;
};

static void send_err(struct te_sched *s, uint64_t id, int code, const char *msg) {
  struct pr_msg m;
  pr_msg_init(&m, PR_ERR);
  m.u.err.request_id = id;
  m.u.err.code = code;
  m.u.err.message = msg;
  pr_sock_send(s->sock, &s->peer, &m, 0);
}

static void on_msg(struct te_sched *s, const struct pr_msg *m) {
  if (m->type == PR_PING) {
    struct pr_msg o;
    pr_msg_init(&o, PR_PONG);
    o.u.pong.nonce = m->u.ping.nonce;
    o.u.pong.ping_send_ns = m->u.ping.send_ns;
    o.u.pong.workers_ready = 1;
    o.u.pong.world_size = 1;
    o.u.pong.max_model_len = s->max_model_len;
    o.u.pong.num_running = (uint32_t)s->n_live;
    o.u.pong.kv_usage = 0.25;
    o.u.pong.prefix_cache_queries = 100;
    o.u.pong.prefix_cache_hits = 40;
    o.u.pong.generation_tokens = __atomic_load_n(&s->gen_total, __ATOMIC_SEQ_CST);
    pr_sock_send(s->sock, &s->peer, &o, 0);
  } else if (m->type == PR_ADD) {
    const struct pr_add *a = &m->u.add;
    pthread_mutex_lock(&s->mu);
    if (s->n_adds < TE_MAX_ADDS) {
      struct te_add *r = &s->adds[s->n_adds++];
      memset(r, 0, sizeof(*r));
      r->id = a->request_id;
      r->n_prompt = a->prompt.n;
      for (uint32_t i = 0; i < a->prompt.n && i < 128; i++)
        r->prompt[i] = a->prompt.v[i];
      r->max_tokens = a->max_tokens;
      r->n_stop_ids = a->stop_token_ids.n;
      r->has_seed = a->sampling.has_seed;
      r->seed = a->sampling.seed;
      r->logprobs = a->sampling.logprobs;
    }
    pthread_mutex_unlock(&s->mu);
    if (a->max_tokens == 7) {
      send_err(s, a->request_id, CM_ERR_INVAL, "fake: refused");
    } else if (a->max_tokens == 9) {
      send_err(s, a->request_id, CM_ERR_DEVICE, "fake: device lost");
    } else if (s->n_live < MAX_LIVE) {
      struct live *l = &s->live[s->n_live++];
      memset(l, 0, sizeof(*l));
      l->id = a->request_id;
      l->max_tokens = a->max_tokens;
      l->forever = a->max_tokens == 50;
      l->err_after = a->max_tokens == 11 ? 2 : -1;
      l->junk = a->max_tokens == 13;
      l->logprobs = a->sampling.logprobs;
    }
  } else if (m->type == PR_ABORT) {
    for (uint32_t i = 0; i < m->u.abort.request_ids.n; i++) {
      uint64_t id = m->u.abort.request_ids.v[i];
      pthread_mutex_lock(&s->mu);
      if (s->n_aborted < TE_MAX_ADDS) s->aborted[s->n_aborted++] = id;
      pthread_mutex_unlock(&s->mu);
      for (int k = 0; k < s->n_live; k++)
        if (s->live[k].id == id) s->live[k--] = s->live[--s->n_live];
    }
  }
}

/* One token for every live sequence, in one OUT. */
static void tick(struct te_sched *s) {
  if (!s->n_live || !s->have_peer) return;
  struct pr_out_seq seqs[MAX_LIVE];
  uint32_t toks[MAX_LIVE];
  float lps[MAX_LIVE], top_lps[MAX_LIVE * 2];
  uint32_t top_ids[MAX_LIVE * 2];
  int n = 0;
  for (int k = 0; k < s->n_live; k++) {
    struct live *l = &s->live[k];
    if (l->err_after >= 0 && (int)l->pos == l->err_after) {
      send_err(s, l->id, CM_ERR_DEVICE, "fake: failed mid-stream");
      s->live[k--] = s->live[--s->n_live];
      continue;
    }
    if (l->junk && l->pos == 0) { /* what a confused scheduler might send */
      uint32_t bad = 999999999u;
      struct pr_out_seq j[2];
      memset(j, 0, sizeof(j));
      j[0].request_id = l->id; /* a token outside the vocabulary */
      j[0].tokens.v = &bad;
      j[0].tokens.n = 1;
      j[0].stop_token = -1;
      j[1].request_id = 424242; /* a request nobody sent */
      j[1].tokens.v = &bad;
      j[1].tokens.n = 1;
      j[1].stop_token = -1;
      j[1].finish = PR_FINISH_STOP;
      struct pr_msg jm;
      pr_msg_init(&jm, PR_OUT);
      jm.u.out.seqs = j;
      jm.u.out.n_seqs = 2;
      pr_sock_send(s->sock, &s->peer, &jm, 0);
      send_err(s, 0, CM_ERR_PARSE, "fake: about no request");
      send_err(s, 434343, CM_ERR_INVAL, "fake: about an unknown request");
      struct pr_msg step;
      pr_msg_init(&step, PR_BEAT); /* not a frontend message */
      pr_sock_send(s->sock, &s->peer, &step, 0);
    }
    struct pr_out_seq *o = &seqs[n];
    memset(o, 0, sizeof(*o));
    o->request_id = l->id;
    o->stop_token = -1;
    int at_end = !l->forever && (int)l->pos >= s->n_script;
    toks[n] = at_end ? (uint32_t)s->eos : (uint32_t)s->script[l->pos % (uint32_t)s->n_script];
    l->pos++;
    o->tokens.v = &toks[n];
    o->tokens.n = 1;
    if (l->logprobs >= 0) {
      lps[n] = -0.5f;
      top_ids[2 * n] = toks[n];
      top_ids[2 * n + 1] = toks[n] + 1;
      top_lps[2 * n] = -0.5f;
      top_lps[2 * n + 1] = -1.5f;
      o->logprobs.n_top = l->logprobs > 0 ? 2 : 0;
      o->logprobs.sampled.v = &lps[n];
      o->logprobs.sampled.n = 1;
      if (l->logprobs > 0) {
        o->logprobs.top_ids.v = &top_ids[2 * n];
        o->logprobs.top_ids.n = 2;
        o->logprobs.top.v = &top_lps[2 * n];
        o->logprobs.top.n = 2;
      }
    }
    if (at_end) {
      o->finish = PR_FINISH_STOP;
      o->stop_token = s->eos;
    } else if (!l->forever && l->pos >= l->max_tokens) {
      o->finish = PR_FINISH_LENGTH;
    }
    if (o->finish) s->live[k--] = s->live[--s->n_live];
    n++;
  }
  if (!n) return;
  struct pr_msg m;
  pr_msg_init(&m, PR_OUT);
  m.u.out.seqs = seqs;
  m.u.out.n_seqs = (uint32_t)n;
  pr_sock_send(s->sock, &s->peer, &m, 0);
}

static void *run(void *arg) {
  struct te_sched *s = arg;
  struct cm_arena arena;
  cm_arena_init(&arena, 1u << 16, 64u << 20);
  uint64_t next_tick = cm_time_ns();
  while (!__atomic_load_n(&s->stop, __ATOMIC_SEQ_CST)) {
    zmq_pollitem_t it = {pr_sock_zmq(s->sock), 0, ZMQ_POLLIN, 0};
    zmq_poll(&it, 1, 1);
    for (;;) {
      struct pr_rid from = {0};
      struct pr_msg m;
      cm_arena_reset(&arena);
      int rc = pr_sock_recv(s->sock, &from, &m, &arena, PR_DONTWAIT);
      if (rc == CM_ERR_AGAIN || rc == CM_ERR_CLOSED) break;
      if (rc || __atomic_load_n(&s->mute, __ATOMIC_SEQ_CST)) continue;
      s->peer = from;
      s->have_peer = 1;
      on_msg(s, &m);
    }
    if (cm_time_ns() >= next_tick) {
      next_tick = cm_time_ns() + 2000000; /* 2 ms */
      if (!__atomic_load_n(&s->mute, __ATOMIC_SEQ_CST)) tick(s);
    }
  }
  cm_arena_free(&arena);
  return NULL;
}

int te_sched_start(const char *endpoint, const int32_t *script, int n, int32_t eos,
                   uint32_t max_model_len, struct te_sched **out) {
  struct te_sched *s = calloc(1, sizeof(*s));
  if (!s || n < 1 || n > 256) {
    free(s);
    return CM_ERR_INVAL;
  }
  memcpy(s->script, script, (size_t)n * sizeof(*script));
  s->n_script = n;
  s->eos = eos;
  s->max_model_len = max_model_len;
  pthread_mutex_init(&s->mu, NULL);
  s->ctx = zmq_ctx_new();
  int rc = pr_sock_open(s->ctx, ZMQ_ROUTER, 0, &s->sock);
  if (!rc) rc = pr_sock_bind(s->sock, endpoint);
  if (!rc && pthread_create(&s->th, NULL, run, s) != 0) rc = CM_ERR_NOMEM;
  if (rc) {
    pr_sock_close(s->sock);
    zmq_ctx_term(s->ctx);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return rc;
  }
  *out = s;
  return 0;
}

void te_sched_stop(struct te_sched *s) {
  if (!s) return;
  __atomic_store_n(&s->stop, 1, __ATOMIC_SEQ_CST);
  pthread_join(s->th, NULL);
  pr_sock_close(s->sock);
  zmq_ctx_term(s->ctx);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

void te_sched_mute(struct te_sched *s, int mute) {
  __atomic_store_n(&s->mute, mute, __ATOMIC_SEQ_CST);
}

void te_sched_set_gen_total(struct te_sched *s, uint64_t v) {
  __atomic_store_n(&s->gen_total, v, __ATOMIC_SEQ_CST);
}

int te_sched_adds(struct te_sched *s, struct te_add *out, int max) {
  pthread_mutex_lock(&s->mu);
  int n = s->n_adds < max ? s->n_adds : max;
  memcpy(out, s->adds, (size_t)n * sizeof(*out));
  pthread_mutex_unlock(&s->mu);
  return n;
}

int te_sched_aborted(struct te_sched *s, uint64_t id) {
  int found = 0;
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < s->n_aborted; i++)
    found |= s->aborted[i] == id;
  pthread_mutex_unlock(&s->mu);
  return found;
}
