/* fe-engine.c — the serving path's engine: model files (tokenizer, chat
 * template, EOS ids), the DEALER socket to the scheduler polled on the
 * libuv loop with a monitor of its connection, PING/PONG (readiness, load
 * metrics), message dispatch, the request-id map, and what happens when the
 * engine loses the requests in flight: parking those that produced nothing
 * and sending them again once it is back (see fe-engine.h). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-log.h"
#include "common/cm-time.h"
#include "frontend/fe-engine-impl.h"
#include "model/md-config.h"
#include "model/md-gguf.h"

#define TAG "fe-engine"

/* ---- request-id map ------------------------------------------------------ */

static size_t map_slot(uint64_t id, size_t cap) {
  uint64_t h = id * 0x9e3779b97f4a7c15ull;
  return (size_t)(h >> 17) & (cap - 1);
}

int fe_eng_map_put(struct fe_engine *e, struct fe_eng_choice *c) {
  if ((e->map_n + 1) * 2 > e->map_cap) { /* keep the load under 1/2 */
    size_t cap = e->map_cap ? e->map_cap * 2 : 256;
    struct fe_eng_choice **m = calloc(cap, sizeof(*m));
    if (!m) return CM_ERR_NOMEM;
    for (size_t i = 0; i < e->map_cap; i++) {
      if (!e->map[i]) continue;
      size_t j = map_slot(e->map[i]->id, cap);
      while (m[j])
        j = (j + 1) & (cap - 1);
      m[j] = e->map[i];
    }
    free(e->map);
    e->map = m;
    e->map_cap = cap;
  }
  size_t j = map_slot(c->id, e->map_cap);
  while (e->map[j])
    j = (j + 1) & (e->map_cap - 1);
  e->map[j] = c;
  e->map_n++;
  return 0;
}

struct fe_eng_choice *fe_eng_map_get(struct fe_engine *e, uint64_t id) {
  if (!e->map_cap) return NULL;
  for (size_t j = map_slot(id, e->map_cap); e->map[j]; j = (j + 1) & (e->map_cap - 1))
    if (e->map[j]->id == id) return e->map[j];
  return NULL;
}

void fe_eng_map_del(struct fe_engine *e, uint64_t id) {
  if (!e->map_cap) return;
  size_t mask = e->map_cap - 1, j = map_slot(id, e->map_cap);
  while (e->map[j] && e->map[j]->id != id)
    j = (j + 1) & mask;
  if (!e->map[j]) return;
  e->map[j] = NULL;
  e->map_n--;
  /* backward-shift deletion: re-place the rest of the cluster */
  for (size_t k = (j + 1) & mask; e->map[k]; k = (k + 1) & mask) {
    struct fe_eng_choice *c = e->map[k];
    e->map[k] = NULL;
    size_t s = map_slot(c->id, e->map_cap);
    while (e->map[s])
      s = (s + 1) & mask;
    e->map[s] = c;
  }
}

/* ---- replicas ------------------------------------------------------------ */

int fe_eng_send(struct fe_replica *p, const struct pr_msg *m) {
  int rc = pr_sock_send(p->sock, NULL, m, PR_DONTWAIT);
  /* the fd is edge-triggered: a send may have consumed the readable edge */
  fe_eng_pump(p->e);
  return rc;
}

int fe_eng_rep_ready(const struct fe_replica *p) {
  return p->last_pong_ns && p->workers_ok &&
         cm_time_ns() - p->last_pong_ns <= (uint64_t)p->e->cfg.ready_ms * 1000000ull;
}

void fe_eng_req_attach(struct fe_eng_req *r, struct fe_replica *p) {
  if (r->rep && !r->parked) r->rep->n_reqs--;
  r->rep = p;
  if (p && !r->parked) p->n_reqs++;
}

/* How busy p is: its scheduler's running + waiting, or this frontend's requests
 * there when more (they may not have reached the scheduler's last PONG yet), plus
 * up to 4 more as its KV cache fills (a full cache preempts and queues). */
static double rep_load(const struct fe_replica *p) {
  int64_t sched = p->have_pong ? (int64_t)p->last_pong.num_running + p->last_pong.num_waiting : 0;
  double kv = p->have_pong ? p->last_pong.kv_usage : 0;
  return (double)(sched > p->n_reqs ? sched : p->n_reqs) + 4.0 * kv;
}

/* A hash of ids[0, n): FNV-1a over the ids, never 0. */
static uint64_t prefix_key(const uint32_t *ids, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)n;
  for (size_t i = 0; i < n; i++)
    h = (h ^ ids[i]) * 0x100000001b3ull;
  return h ? h : 1;
}

/* The prefixes routing remembers: 16, 32, 64, ... tokens, up to the prompt's length. */
#define FE_ENG_AFF_MIN 16
#define FE_ENG_AFF_MAX 65536

struct fe_replica *fe_eng_route(struct fe_engine *e, const uint32_t *ids, size_t n) {
  struct fe_replica *best = NULL;
  for (int i = 0; i < e->n_rep; i++) {
    struct fe_replica *p = &e->rep[i];
    if (fe_eng_rep_ready(p) && (!best || rep_load(p) < rep_load(best))) best = p;
  }
  if (!best || e->n_rep == 1) return best;
  /* the longest remembered prefix wins while its replica is not much busier:
   * within 2 requests, or half again the least busy one's load */
  double slack = rep_load(best) / 2 > 2 ? rep_load(best) / 2 : 2;
  size_t top = FE_ENG_AFF_MIN;
  while (top * 2 <= n && top * 2 <= FE_ENG_AFF_MAX)
    top *= 2;
  struct fe_replica *pick = best;
  for (size_t len = top; len >= FE_ENG_AFF_MIN && len <= n; len /= 2) {
    uint64_t key = prefix_key(ids, len);
    const struct fe_eng_affinity *a = &e->aff[key & (FE_ENG_AFFINITY - 1)];
    if (a->key != key || a->rep < 0 || a->rep >= e->n_rep) continue;
    struct fe_replica *p = &e->rep[a->rep];
    if (fe_eng_rep_ready(p) && rep_load(p) <= rep_load(best) + slack) pick = p;
    break; /* the longest one known decides */
  }
  for (size_t len = FE_ENG_AFF_MIN; len <= n && len <= FE_ENG_AFF_MAX; len *= 2) {
    uint64_t key = prefix_key(ids, len);
    e->aff[key & (FE_ENG_AFFINITY - 1)] = (struct fe_eng_affinity){key, pick->index};
  }
  return pick;
}

static void fail_all(struct fe_engine *e, int status, const char *msg) {
  while (e->reqs)
    fe_eng_req_fail(e->reqs, status, msg, NULL); /* unlinks and frees the request */
}

/* ---- losing a replica, and sending again ------------------------------------ */

int fe_eng_send_add(struct fe_eng_req *r, struct fe_eng_choice *ch, const struct pr_msg *m) {
  CM_ASSERT(m->type == PR_ADD && r->rep);
  fe_eng_choice_forget_add(ch);
  const struct pr_add *a = &m->u.add;
  size_t n = (size_t)a->prompt.n + a->stop_token_ids.n;
  uint32_t *ids = malloc((n ? n : 1) * sizeof(*ids));
  if (ids) { /* without the copy the choice cannot be sent again: it fails instead */
    if (a->prompt.n) memcpy(ids, a->prompt.v, a->prompt.n * sizeof(*ids));
    if (a->stop_token_ids.n)
      memcpy(ids + a->prompt.n, a->stop_token_ids.v, a->stop_token_ids.n * sizeof(*ids));
    ch->add = *a;
    ch->add.prompt.v = ids;
    ch->add.stop_token_ids.v = ids + a->prompt.n;
    ch->add_ids = ids;
  }
  return pr_sock_send(r->rep->sock, NULL, m, PR_DONTWAIT);
}

void fe_eng_choice_forget_add(struct fe_eng_choice *ch) {
  free(ch->add_ids);
  ch->add_ids = NULL;
}

int fe_eng_req_retryable(const struct fe_eng_req *r) {
  if (r->sse_on || r->busy || r->answering || r->gone || r->retries >= FE_ENG_MAX_RETRIES) return 0;
  int n_sent = 0; /* choices with an ADD to send again */
  for (int k = 0; k < r->n_ch; k++) {
    const struct fe_eng_choice *ch = &r->ch[k];
    if (r->beams) { /* the search lives here: its pending steps are sent again, the
                     * beams between steps and the prompts searched wait */
      n_sent += ch->add_ids != NULL;
      continue;
    }
    if (ch->done || ch->n_gen > 0 || !ch->add_ids) return 0;
    n_sent++;
  }
  return n_sent > 0;
}

void fe_eng_req_park(struct fe_eng_req *r) {
  struct fe_engine *e = r->e;
  /* an ADD still queued for a scheduler that comes back must not run there twice */
  fe_eng_abort_live(r);
  fe_eng_req_unmap(r);
  if (!r->parked) {
    if (r->rep) r->rep->n_reqs--;
    r->parked = 1;
    e->n_parked++;
  }
  if (!r->parked_ns) r->parked_ns = cm_time_ns();
}

void fe_eng_lost(struct fe_replica *p, const char *why) {
  struct fe_engine *e = p->e;
  p->workers_ok = 0; /* until a PONG says the replica is whole again */
  int was_pumping = e->pumping;
  e->pumping = 1; /* nothing received while the list changes under us */
  int n_parked = 0, n_failed = 0;
  char msg[256];
  if (e->n_rep > 1)
    snprintf(msg, sizeof(msg), "the engine (replica %d) failed: %s", p->index, why);
  else
    snprintf(msg, sizeof(msg), "the engine failed: %s", why);
  for (;;) {
    struct fe_eng_req *r = e->reqs;
    while (r && (r->rep != p || r->parked || r->busy || r->answering))
      r = r->next;
    if (!r) break;
    if (fe_eng_req_retryable(r)) {
      fe_eng_req_park(r);
      n_parked++;
    } else {
      fe_eng_req_fail(r, 503, msg, NULL); /* unlinks and frees it */
      n_failed++;
    }
  }
  if (n_parked || n_failed)
    cm_error(TAG, "%s: %d request(s) failed, %d waiting to be sent again", msg, n_failed, n_parked);
  else
    cm_error(TAG, "%s", msg);
  fe_eng_lora_lost(p);
  e->pumping = was_pumping;
  if (!was_pumping) fe_eng_pump(e);
}

/* Sends a parked request's choices again under new ids, to a ready replica. */
static void resubmit(struct fe_eng_req *r, struct fe_replica *p) {
  struct fe_engine *e = r->e;
  r->parked = 0;
  e->n_parked--;
  r->rep = NULL;
  fe_eng_req_attach(r, p);
  r->retries++;
  for (int k = 0; k < r->n_ch; k++) {
    struct fe_eng_choice *ch = &r->ch[k];
    if (!ch->add_ids) continue; /* a beam between steps (fe_eng_req_retryable) */
    ch->id = e->next_id++;
    if (fe_eng_map_put(e, ch) != 0) {
      ch->id = 0;
      fe_eng_req_fail(r, 500, "out of memory", NULL);
      return;
    }
    struct pr_msg m;
    pr_msg_init(&m, PR_ADD);
    m.u.add = ch->add;
    m.u.add.request_id = ch->id;
    m.u.add.arrival_ns = cm_time_wall_ns();
    int rc = pr_sock_send(p->sock, NULL, &m, PR_DONTWAIT);
    if (rc) {
      char msg[160];
      snprintf(msg, sizeof(msg), "cannot queue the request at the scheduler again: %s",
               cm_strerror(rc));
      fe_eng_req_fail(r, 503, msg, NULL);
      return;
    }
    ch->live = 1;
  }
}

/* Parked requests: sent again once a replica is ready, failed past retry_ms. */
static void parked_tend(struct fe_engine *e) {
  if (!e->n_parked) return;
  int was_pumping = e->pumping;
  e->pumping = 1;
  uint64_t now = cm_time_ns(), limit = (uint64_t)e->cfg.retry_ms * 1000000ull;
  int ready = fe_engine_ready(e), n_sent = 0;
  for (;;) {
    struct fe_eng_req *r = e->reqs;
    while (r && !(r->parked && (ready || now - r->parked_ns > limit)))
      r = r->next;
    if (!r) break;
    const struct pr_add *a = &r->ch[0].add;
    for (int k = 0; !r->ch[k].add_ids && k + 1 < r->n_ch; k++)
      a = &r->ch[k + 1].add; /* a beam search's first pending step */
    struct fe_replica *p = ready ? fe_eng_route(e, a->prompt.v, a->prompt.n) : NULL;
    if (p) {
      resubmit(r, p); /* unparks it, or fails it */
      n_sent++;
    } else {
      char msg[160];
      snprintf(msg, sizeof(msg), "the engine failed and was not back within %.0f s",
               (double)e->cfg.retry_ms / 1e3);
      fe_eng_req_fail(r, 503, msg, NULL); /* unlinks and frees it */
    }
  }
  if (n_sent) cm_info(TAG, "the engine is back: %d request(s) sent again", n_sent);
  e->pumping = was_pumping;
  if (!was_pumping) fe_eng_pump(e);
}

/* The monitor of a replica's DEALER: a closed connection means its scheduler is
 * gone (it died, or its host did). ZeroMQ reconnects by itself. */
static void on_mon_poll(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  struct fe_replica *p = h->data;
  /* reading until ZMQ_EVENTS says nothing is left also re-arms the fd, which only
   * signals a message that arrives after a read found none */
  int lost = 0;
  for (;;) {
    int ev = 0, event = 0, value = 0;
    size_t len = sizeof(ev);
    if (zmq_getsockopt(p->mon, ZMQ_EVENTS, &ev, &len) != 0 || !(ev & ZMQ_POLLIN)) break;
    int rc = pr_monitor_recv(p->mon, &event, &value);
    if (rc == CM_ERR_AGAIN) break;
    if (rc == 0 && event == ZMQ_EVENT_DISCONNECTED) lost = 1;
  }
  if (lost) fe_eng_lost(p, "the connection to the scheduler closed");
}

_Static_assert(FE_ENG_MAX_REPLICAS <= FE_METRICS_MAX_REPLICAS,
               "every replica has its own metrics series");

static void on_pong(struct fe_replica *p, const struct pr_pong *pg) {
  struct fe_engine *e = p->e;
  /* the scheduler's totals only grow: smaller ones mean a new scheduler
   * answers on the endpoint, and the requests in flight died with the old */
  if (p->have_pong && fe_eng_pong_restarted(&p->last_pong, pg)) {
    if (p->n_reqs > 0)
      fe_eng_lost(p, "the scheduler restarted");
    else
      fe_eng_lora_lost(p); /* (its loads and unloads will not be answered) */
  }
  p->last_pong_ns = cm_time_ns();
  p->workers_ok = pg->world_size > 0 && pg->workers_ready == pg->world_size;
  if (pg->max_model_len) p->pong_max_model_len = pg->max_model_len;
  if (e->metrics) {
    struct fe_metrics *m = e->metrics;
    size_t i = (size_t)p->index;
    const struct fe_replica_metric_ids *ri = &e->mid.rep[p->index];
    fe_metrics_set_at(m, e->mid.num_requests_running, i, pg->num_running);
    fe_metrics_set_at(m, e->mid.num_requests_waiting, i, pg->num_waiting);
    fe_metrics_set_at(m, e->mid.kv_cache_usage_perc, i, pg->kv_usage);
    if (pg->kernels) {
      static const char *const keys[] = {"kernels", "matmul_inputs"};
      const char *values[] = {pg->kernels, pg->matmul_inputs};
      fe_metrics_set_info_at(m, e->mid.engine_info, i, keys, values, 2);
    }
    /* PONG counters are cumulative at each scheduler: add what is new (a
     * restarted scheduler starts again from 0) */
#define DELTA(field, id)                                                                           \
  do {                                                                                             \
    uint64_t prev_ = p->have_pong ? p->last_pong.field : 0;                                        \
    uint64_t d_ = pg->field >= prev_ ? pg->field - prev_ : pg->field;                              \
    if (d_) fe_metrics_inc(m, ri->id, (double)d_);                                                 \
  } while (0)
    DELTA(prefix_cache_queries, prefix_cache_queries);
    DELTA(prefix_cache_hits, prefix_cache_hits);
    DELTA(spec_num_drafts, spec_decode_num_drafts);
    DELTA(spec_num_draft_tokens, spec_decode_num_draft_tokens);
    DELTA(spec_num_accepted_tokens, spec_decode_num_accepted_tokens);
    DELTA(num_preemptions, num_preemptions);
#undef DELTA
    for (uint32_t k = 0; k < pg->n_spec_pos && k < PR_MAX_DRAFT; k++) {
      uint64_t prev =
          p->have_pong && k < p->last_pong.n_spec_pos ? p->last_pong.spec_accepted_per_pos[k] : 0;
      uint64_t d = pg->spec_accepted_per_pos[k] >= prev ? pg->spec_accepted_per_pos[k] - prev
                                                        : pg->spec_accepted_per_pos[k];
      if (d) fe_metrics_inc_at(m, ri->spec_decode_num_accepted_tokens_per_pos, k, (double)d);
    }
  }
  p->last_pong = *pg;
  p->have_pong = 1;
  parked_tend(e);
}

static void dispatch(struct fe_replica *p, const struct pr_msg *m) {
  switch (m->type) {
  case PR_PONG: on_pong(p, &m->u.pong); break;
  case PR_OUT: fe_eng_on_out(p->e, &m->u.out); break;
  case PR_ERR: fe_eng_on_err(p->e, &m->u.err); break;
  case PR_LORA_DONE: fe_eng_on_lora_done(p, &m->u.lora); break;
  default:
    cm_warn(TAG, "scheduler %s sent %s, not a frontend message; dropped", p->endpoint,
            pr_type_name(m->type));
  }
}

void fe_eng_pump(struct fe_engine *e) {
  if (e->pumping) { /* a send from inside dispatch: the outer loop drains again */
    e->repump = 1;
    return;
  }
  e->pumping = 1;
  do {
    e->repump = 0;
    for (int i = 0; i < e->n_rep; i++) {
      struct fe_replica *p = &e->rep[i];
      for (;;) {
        int ev = 0;
        if (!p->sock || pr_sock_events(p->sock, &ev) != 0 || !(ev & ZMQ_POLLIN)) break;
        struct pr_msg m;
        cm_arena_reset(&e->rx_arena);
        int rc = pr_sock_recv(p->sock, NULL, &m, &e->rx_arena, PR_DONTWAIT);
        if (rc == CM_ERR_AGAIN) break;
        if (rc == CM_ERR_CLOSED) break;
        if (rc) {
          cm_warn(TAG, "bad message from the scheduler %s dropped: %s", p->endpoint,
                  cm_strerror(rc));
          continue;
        }
        dispatch(p, &m);
      }
    }
  } while (e->repump);
  e->pumping = 0;
  for (int i = 0; i < e->n_rep; i++)
    if (e->rep[i].ping_soon) {
      e->rep[i].ping_soon = 0;
      fe_eng_ping(&e->rep[i]);
    }
}

static void on_poll(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  struct fe_replica *p = h->data;
  fe_eng_pump(p->e);
}

void fe_eng_ping(struct fe_replica *p) {
  struct pr_msg m;
  pr_msg_init(&m, PR_PING);
  m.u.ping.nonce = ++p->ping_nonce;
  m.u.ping.send_ns = cm_time_wall_ns();
  int rc = fe_eng_send(p, &m);
  if (rc && rc != CM_ERR_AGAIN) cm_debug(TAG, "PING %s: %s", p->endpoint, cm_strerror(rc));
}

static void on_timer(uv_timer_t *t) {
  struct fe_engine *e = t->data;
  uint64_t now = cm_time_ns();
  for (int i = 0; i < e->n_rep; i++) {
    struct fe_replica *p = &e->rep[i];
    uint64_t since = p->last_pong_ns ? p->last_pong_ns : e->created_ns;
    if (p->n_reqs > 0 && now - since > (uint64_t)e->cfg.dead_ms * 1000000ull) {
      char why[96];
      snprintf(why, sizeof(why), "no answer from the scheduler for %.1f s",
               (double)(now - since) / 1e9);
      fe_eng_lost(p, why);
    }
  }
  parked_tend(e);
  for (int i = 0; i < e->n_rep; i++)
    fe_eng_ping(&e->rep[i]);
  fe_eng_log_stats(e, now);
  fe_eng_lora_tick(e, now);
}

/* ---- model files --------------------------------------------------------- */

/* The stop ids: generation_config.json's eos_token_id (in the tokenizer's
 * folder), those a GGUF file's metadata names, else the tokenizer's EOS. */
static void load_eos(struct fe_engine *e, const char *tok_dir, const struct md_config *gguf) {
  for (int i = 0; gguf && i < gguf->n_eos && e->n_eos < FE_ENG_MAX_EOS; i++)
    e->eos[e->n_eos++] = gguf->eos_ids[i];
  char path[4096];
  snprintf(path, sizeof(path), "%s/generation_config.json", tok_dir);
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (root) {
    json_t *v = json_object_get(root, "eos_token_id");
    if (json_is_integer(v)) {
      e->eos[e->n_eos++] = (int32_t)json_integer_value(v);
    } else if (json_is_array(v)) {
      size_t i;
      json_t *x;
      json_array_foreach(v, i, x) {
        if (json_is_integer(x) && e->n_eos < FE_ENG_MAX_EOS)
          e->eos[e->n_eos++] = (int32_t)json_integer_value(x);
      }
    }
    json_decref(root);
  }
  int32_t n_vocab = tk_n_vocab(e->tok);
  int k = 0;
  for (int i = 0; i < e->n_eos; i++) /* drop ids the tokenizer does not have */
    if (e->eos[i] >= 0 && e->eos[i] < n_vocab) e->eos[k++] = e->eos[i];
  e->n_eos = k;
  if (e->n_eos == 0 && tk_eos(e->tok) >= 0) e->eos[e->n_eos++] = tk_eos(e->tok);
}

/* The template variables bos_token and eos_token of the tokenizer's own ids. */
static json_t *special_tokens_of(const struct tk_tokenizer *tok) {
  json_t *conf = json_object();
  size_t len;
  const char *s;
  if (conf && tk_bos(tok) >= 0 && (s = tk_token_str(tok, tk_bos(tok), &len)))
    json_object_set_new(conf, "bos_token", json_stringn(s, len));
  if (conf && tk_eos(tok) >= 0 && (s = tk_token_str(tok, tk_eos(tok), &len)))
    json_object_set_new(conf, "eos_token", json_stringn(s, len));
  return conf;
}

/* A GGUF file's own tokenizer and chat template (tk_from_gguf, over the file
 * opened for the config); without a template, chat completions are refused
 * (logged). */
static int gguf_tokenizer(struct fe_engine *e, const struct md_gguf *g, const char *path, char *err,
                          size_t errlen) {
  char *tmpl = NULL;
  int rc = tk_from_gguf(g, path, &e->tok, &tmpl, err, errlen);
  if (rc) {
    cm_error(TAG, "%s: tokenizer: %s", path, err[0] ? err : cm_strerror(rc));
    return rc;
  }
  if (!tmpl) return 0;
  json_t *conf = special_tokens_of(e->tok);
  rc = tk_chat_from_string(tmpl, strlen(tmpl), conf, &e->chat, err, errlen);
  json_decref(conf);
  free(tmpl);
  if (rc) cm_error(TAG, "%s: tokenizer.chat_template: %s", path, err[0] ? err : cm_strerror(rc));
  return rc;
}

/* The *_token variables of a template other than the model's: tok_dir's
 * tokenizer_config.json where there is one (as the model's own template's are),
 * else the tokenizer's BOS and EOS. */
static json_t *template_conf(struct fe_engine *e, const char *tok_dir) {
  char path[4096];
  json_t *conf = NULL;
  if (tok_dir) {
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", tok_dir);
    conf = json_load_file(path, 0, NULL);
  }
  return conf ? conf : special_tokens_of(e->tok);
}

/* --chat-template's template in place of the model's (its variables template_conf's). */
static int flag_template(struct fe_engine *e, const char *value, const char *tok_dir, char *err,
                         size_t errlen) {
  char *tmpl = NULL;
  int rc = tk_chat_template_arg(value, &tmpl, err, errlen);
  if (rc) {
    cm_error(TAG, "%s", err[0] ? err : cm_strerror(rc));
    return rc == CM_ERR_NOMEM ? rc : CM_ERR_INVAL;
  }
  json_t *conf = template_conf(e, tok_dir);
  struct tk_chat *chat = NULL;
  rc = tk_chat_from_string(tmpl, strlen(tmpl), conf, &chat, err, errlen);
  json_decref(conf);
  free(tmpl);
  if (rc) {
    cm_error(TAG, "--chat-template: %s", err[0] ? err : cm_strerror(rc));
    return rc == CM_ERR_NOMEM ? rc : CM_ERR_INVAL;
  }
  tk_chat_free(e->chat);
  e->chat = chat;
  cm_info(TAG, "chat template from --chat-template");
  return 0;
}

/* The tokenizer may know more ids than the model embeds (Gemma's lists
 * <image_soft_token> past the text vocabulary): prompt ids are checked
 * against config.json's vocab_size (top level or text_config) too. */
static void load_vocab(struct fe_engine *e, const struct md_config *gguf) {
  e->n_vocab = tk_n_vocab(e->tok);
  if (gguf) {
    if (gguf->vocab < e->n_vocab) e->n_vocab = gguf->vocab;
    return;
  }
  char path[4096];
  snprintf(path, sizeof(path), "%s/config.json", e->model_dir);
  json_t *root = json_load_file(path, 0, NULL);
  json_t *v = json_object_get(root, "vocab_size");
  if (!json_is_integer(v)) v = json_object_get(json_object_get(root, "text_config"), "vocab_size");
  if (json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < e->n_vocab)
    e->n_vocab = (int32_t)json_integer_value(v);
  json_decref(root);
}

static void close_cb(uv_handle_t *h) {
  struct fe_engine *e = h->data;
  e->handles_open--;
}

static void rep_close_cb(uv_handle_t *h) {
  struct fe_replica *p = h->data;
  p->e->handles_open--;
}

/* ---- lifecycle ------------------------------------------------------------- */

/* Connects replica i to its scheduler and starts watching it. */
static int rep_open(struct fe_engine *e, int i, const char *endpoint) {
  struct fe_replica *p = &e->rep[i];
  p->e = e;
  p->index = i;
  if (!(p->endpoint = strdup(endpoint))) return CM_ERR_NOMEM;
  int rc = pr_sock_open(e->zctx, ZMQ_DEALER, 0, &p->sock);
  if (rc) return rc;
  if ((rc = pr_sock_connect(p->sock, p->endpoint)) != 0) {
    cm_error(TAG, "cannot connect to the scheduler at %s: %s", p->endpoint, cm_strerror(rc));
    return rc;
  }
  /* the scheduler's death is seen when its connection closes, not at dead_ms */
  int fd = -1, mon_fd = -1;
  size_t mon_fd_len = sizeof(mon_fd);
  if ((rc = pr_sock_fd(p->sock, &fd)) != 0) return rc;
  if ((rc = pr_monitor_open(e->zctx, p->sock, ZMQ_EVENT_DISCONNECTED, &p->mon)) != 0) return rc;
  if (zmq_getsockopt(p->mon, ZMQ_FD, &mon_fd, &mon_fd_len) != 0) return CM_ERR_IO;
  if (uv_poll_init(e->loop, &p->poll, fd) != 0) return CM_ERR_IO;
  p->poll.data = p;
  p->handles++;
  e->handles_open++;
  if (uv_poll_init(e->loop, &p->mon_poll, mon_fd) != 0) return CM_ERR_IO;
  p->mon_poll.data = p;
  p->handles++;
  e->handles_open++;
  uv_poll_start(&p->poll, UV_READABLE, on_poll);
  uv_poll_start(&p->mon_poll, UV_READABLE, on_mon_poll);
  uv_unref((uv_handle_t *)&p->poll);
  uv_unref((uv_handle_t *)&p->mon_poll);
  on_mon_poll(&p->mon_poll, 0, 0); /* arms the monitor's fd */
  return 0;
}

/* Gemma 4's markers as special tokens of the tokenizer (never assumed ids): thoughts
 * are read apart when the channel tokens are there, tools go to the template in
 * their own notation when the tool tokens are there and the template writes the
 * tools it is given (a declaration of a probe tool shows in its output). */
static void load_markers(struct fe_engine *e) {
  struct fe_api_model *m = &e->model;
  for (int i = 0; i < FE_G4_N_MARKERS; i++) {
    const char *s = fe_g4_marker_str((enum fe_g4_marker)i);
    int32_t id = tk_find(e->tok, s, strlen(s));
    m->marker[i] = id >= 0 && id < e->n_vocab && tk_is_special(e->tok, id) ? id : -1;
  }
  m->reasoning = m->marker[FE_G4_CHANNEL] >= 0 && m->marker[FE_G4_CHANNEL_END] >= 0;
  int tools = m->marker[FE_G4_CALL] >= 0 && m->marker[FE_G4_CALL_END] >= 0 &&
              m->marker[FE_G4_QUOTE] >= 0 && e->chat;
  if (tools) {
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "hi");
    json_t *extra = json_pack("{s:[{s:s, s:{s:s, s:s, s:{s:s, s:{}}}}]}", "tools", "type",
                              "function", "function", "name", "lmserve_probe_tool", "description",
                              "", "parameters", "type", "object", "properties");
    char *out = NULL, why[256];
    size_t len = 0;
    tools = msgs && extra &&
            tk_chat_render(e->chat, msgs, 1, extra, &out, &len, why, sizeof(why)) == 0 &&
            strstr(out, "lmserve_probe_tool") != NULL;
    free(out);
    json_decref(msgs);
    json_decref(extra);
  }
  m->native_tools = tools;
  if (m->reasoning || m->native_tools)
    cm_info(TAG, "Gemma 4's notation: thinking channel %s, native tool calls %s",
            m->reasoning ? "read apart" : "absent", m->native_tools ? "on" : "off");
}

int fe_engine_create(uv_loop_t *loop, struct fe_router *router, const struct fe_engine_config *cfg,
                     struct fe_engine **out) {
  struct fe_engine *e = calloc(1, sizeof(*e));
  if (!e) return CM_ERR_NOMEM;
  char err[512] = "";
  int rc = CM_ERR_NOMEM;
  struct md_config *gcfg = NULL; /* a GGUF model's config, while the engine is made */
  struct md_gguf *gguf = NULL;   /* the GGUF file, open until its tokenizer is read */
  e->loop = loop;
  e->router = router;
  e->cfg = *cfg;
  if (!e->cfg.ping_ms) e->cfg.ping_ms = 500;
  if (!e->cfg.ready_ms) e->cfg.ready_ms = 2000;
  if (!e->cfg.dead_ms) e->cfg.dead_ms = 10000;
  if (!e->cfg.retry_ms) e->cfg.retry_ms = 30000;
  e->created_ns = cm_time_ns();
  e->next_id = 1;
  fe_buf_init(&e->out, 0);
  fe_buf_init(&e->tmp, 0);
  cm_arena_init(&e->rx_arena, 1u << 16, 256u << 20);
  e->model_name = strdup(cfg->model_name ? cfg->model_name : "default");
  e->model_dir = strdup(cfg->model_dir ? cfg->model_dir : "");
  if (!e->model_name || !e->model_dir) goto fail;
  e->cfg.model_name = e->model_name;
  e->cfg.model_dir = e->model_dir;
  e->cfg.scheduler = NULL;
  e->cfg.schedulers = NULL;
  const char *one[1] = {cfg->scheduler};
  const char *const *eps = cfg->n_schedulers > 0 ? cfg->schedulers : one;
  int n_eps = cfg->n_schedulers > 0 ? cfg->n_schedulers : cfg->scheduler ? 1 : 0;
  if (router) {
    e->metrics = fe_router_metrics(router);
    e->mid = *fe_router_metric_ids(router);
  }
  if (e->metrics && n_eps > 1 && n_eps <= FE_ENG_MAX_REPLICAS &&
      (rc = fe_metrics_register_replicas(e->metrics, &e->mid, n_eps)) != 0) {
    cm_error(TAG, "cannot register the metrics of %d replicas: %s", n_eps, cm_strerror(rc));
    goto fail;
  }
  if (!*e->model_dir || n_eps < 1 || n_eps > FE_ENG_MAX_REPLICAS) {
    cm_error(TAG, "the engine needs a model directory and 1 to %d scheduler endpoints",
             FE_ENG_MAX_REPLICAS);
    rc = CM_ERR_INVAL;
    goto fail;
  }
  for (int i = 0; i < n_eps; i++)
    if (!eps[i] || !*eps[i]) {
      cm_error(TAG, "scheduler endpoint %d is empty", i);
      rc = CM_ERR_INVAL;
      goto fail;
    }
  /* a GGUF file gives the config (stop ids, vocabulary size); the tokenizer comes from a
   * folder */
  const char *tok_dir =
      cfg->tokenizer_dir && *cfg->tokenizer_dir ? cfg->tokenizer_dir : cfg->model_dir;
  char gguf_path[4096];
  int is_gguf = md_model_gguf_path(cfg->model_dir, gguf_path, sizeof(gguf_path), err, sizeof(err));
  if (is_gguf < 0) {
    cm_error(TAG, "%s", err);
    rc = is_gguf;
    goto fail;
  }
  if (is_gguf) {
    if (!(gcfg = malloc(sizeof(*gcfg))) ||
        (rc = md_gguf_open(gguf_path, &gguf, err, sizeof(err))) != 0 ||
        (rc = md_config_from_gguf_model(cfg->model_dir, gguf, gcfg, err, sizeof(err))) != 0) {
      cm_error(TAG, "%s: %s", gguf_path, gcfg ? err : "out of memory");
      rc = gcfg ? rc : CM_ERR_NOMEM;
      goto fail;
    }
  }
  if (is_gguf && tok_dir == cfg->model_dir) { /* everything from the file */
    if ((rc = gguf_tokenizer(e, gguf, gguf_path, err, sizeof(err))) != 0) goto fail;
  } else if ((rc = tk_load(tok_dir, &e->tok, err, sizeof(err))) != 0) {
    cm_error(TAG, "%s: tokenizer: %s", tok_dir, err[0] ? err : cm_strerror(rc));
    goto fail;
  }
  md_gguf_close(gguf);
  gguf = NULL;
  if ((rc = tk_state_create(e->tok, &e->tok_st)) != 0) goto fail;
  err[0] = 0;
  if (e->chat)
    rc = 0;
  else if (is_gguf && tok_dir == cfg->model_dir) /* the file has no chat template */
    rc = CM_ERR_NOENT;
  else
    rc = tk_chat_load(tok_dir, &e->chat, err, sizeof(err));
  if (rc == CM_ERR_NOENT && cfg->chat_template) {
    rc = 0; /* the flag's template serves */
  } else if (rc == CM_ERR_NOENT) {
    cm_warn(TAG, "%s: no chat template; chat completions will be refused", tok_dir);
    e->chat = NULL;
  } else if (rc) {
    cm_error(TAG, "%s: chat template: %s", tok_dir, err[0] ? err : cm_strerror(rc));
    goto fail;
  }
  if (cfg->chat_template &&
      (rc = flag_template(e, cfg->chat_template, is_gguf ? NULL : tok_dir, err, sizeof(err))) != 0)
    goto fail;
  if (cfg->trust_request_chat_template &&
      !(e->chat_conf = template_conf(e, is_gguf ? NULL : tok_dir))) {
    rc = CM_ERR_NOMEM;
    goto fail;
  }
  load_eos(e, tok_dir, gcfg);
  err[0] = 0;
  if ((rc = fe_mm_load(cfg->model_dir, gcfg, e->tok, &cfg->mm, &e->mm, err, sizeof(err))) != 0) {
    cm_error(TAG, "%s: image and audio input: %s", cfg->model_dir, err[0] ? err : cm_strerror(rc));
    goto fail;
  }
  if (e->mm.enabled && e->mm.g4)
    cm_info(TAG,
            "image input (Gemma 4): each at its own size, %d soft tokens by default "
            "(mm_processor_kwargs.max_soft_tokens), at most %d per prompt",
            e->mm.tokens, e->mm.limit);
  else if (e->mm.enabled)
    cm_info(TAG, "image input: %d x %d images, %d tokens each, at most %d per prompt",
            e->mm.width, e->mm.height, e->mm.tokens, e->mm.limit);
  if (e->mm.audio)
    cm_info(TAG, "audio input (Gemma 4): clips of up to %.0f s, %d mel bins, at most %d per prompt",
            e->mm.fe.max_samples / (double)e->mm.fe.sampling_rate, e->mm.fe.n_mel,
            e->mm.audio_limit);
  load_vocab(e, gcfg);
  free(gcfg);
  gcfg = NULL;
  load_markers(e);

  rc = CM_ERR_IO;
  if (!(e->zctx = zmq_ctx_new())) goto fail;
  uv_timer_init(loop, &e->timer);
  e->timer.data = e;
  e->handles_open = 1;
  for (int i = 0; i < n_eps; i++) {
    e->n_rep = i + 1;
    if ((rc = rep_open(e, i, eps[i])) != 0) goto fail;
  }
  uv_timer_start(&e->timer, on_timer, 0, e->cfg.ping_ms);
  uv_unref((uv_handle_t *)&e->timer);
  for (int i = 0; i < e->n_rep; i++)
    cm_info(TAG, "scheduler %s%s", e->rep[i].endpoint,
            e->n_rep > 1 ? " (a replica: requests are routed by load and prefix)" : "");
  cm_info(TAG, "%d EOS id(s); chat template %s", e->n_eos, e->chat ? "loaded" : "absent");
  *out = e;
  return 0;
fail:
  free(gcfg);
  md_gguf_close(gguf);
  fe_engine_destroy(e);
  return rc;
}

void fe_engine_destroy(struct fe_engine *e) {
  if (!e) return;
  fail_all(e, 503, "the frontend is shutting down");
  fe_eng_lora_free(e);
  if (e->handles_open) {
    uv_close((uv_handle_t *)&e->timer, close_cb);
    for (int i = 0; i < e->n_rep; i++) {
      struct fe_replica *p = &e->rep[i];
      if (p->handles > 0) uv_close((uv_handle_t *)&p->poll, rep_close_cb);
      if (p->handles > 1) uv_close((uv_handle_t *)&p->mon_poll, rep_close_cb);
    }
    while (e->handles_open)
      uv_run(e->loop, UV_RUN_ONCE);
  }
  for (int i = 0; i < e->n_rep; i++) {
    pr_monitor_close(e->rep[i].sock, e->rep[i].mon);
    pr_sock_close(e->rep[i].sock);
    free(e->rep[i].endpoint);
  }
  if (e->zctx) zmq_ctx_term(e->zctx);
  cm_arena_free(&e->rx_arena);
  tk_chat_free(e->chat);
  json_decref(e->chat_conf);
  tk_state_free(e->tok_st);
  tk_free(e->tok);
  free(e->map);
  free(e->stop_ids);
  fe_buf_free(&e->out);
  fe_buf_free(&e->tmp);
  free(e->model_name);
  free(e->model_dir);
  free(e);
}

/* ---- hooks and queries ------------------------------------------------------ */

int fe_engine_ready(const struct fe_engine *e) {
  for (int i = 0; i < e->n_rep; i++)
    if (fe_eng_rep_ready(&e->rep[i])) return 1;
  return 0;
}

int64_t fe_engine_max_model_len(const struct fe_engine *e) {
  for (int i = 0; i < e->n_rep; i++)
    if (e->rep[i].pong_max_model_len) return e->rep[i].pong_max_model_len;
  return e->cfg.max_model_len;
}

int fe_engine_in_flight(const struct fe_engine *e) {
  return e->n_reqs;
}

static const struct fe_api_model *hook_model(void *ud) {
  struct fe_engine *e = ud;
  return &e->model;
}

static void hook_props(void *ud, struct fe_buf *b) {
  const struct fe_engine *e = ud;
  size_t n = 0;
  const char *s;
  fe_buf_puts(b, "\"model_path\":");
  fe_buf_json_str(b, e->model_dir, strlen(e->model_dir));
  fe_buf_printf(b, ",\"modalities\":{\"vision\":%s,\"audio\":%s},\"chat_template\":",
                e->mm.enabled ? "true" : "false", e->mm.audio ? "true" : "false");
  if (e->chat && (s = tk_chat_source(e->chat, &n)) != NULL)
    fe_buf_json_str(b, s, n);
  else
    fe_buf_puts(b, "null");
  const int32_t ids[2] = {tk_bos(e->tok), tk_eos(e->tok)};
  static const char *const keys[2] = {"bos_token", "eos_token"};
  for (int k = 0; k < 2; k++) {
    fe_buf_printf(b, ",\"%s\":", keys[k]);
    s = ids[k] >= 0 ? tk_token_str(e->tok, ids[k], &n) : NULL;
    if (s)
      fe_buf_json_str(b, s, n);
    else
      fe_buf_puts(b, "null");
  }
  /* llama.cpp's slots are the requests it runs at once: here each replica's
   * scheduler's --max-num-seqs, as its last PONG said (null before any) */
  int64_t slots = 0;
  for (int i = 0; i < e->n_rep; i++)
    if (e->rep[i].have_pong) slots += e->rep[i].last_pong.max_num_seqs;
  fe_buf_puts(b, ",\"total_slots\":");
  if (slots)
    fe_buf_i64(b, slots);
  else
    fe_buf_puts(b, "null");
  fe_buf_puts(b, ",");
}

static int hook_ready(void *ud) {
  return fe_engine_ready(ud);
}

static int64_t hook_max_model_len(void *ud) {
  return fe_engine_max_model_len(ud);
}

void fe_engine_hooks_get(struct fe_engine *e, struct fe_engine_hooks *out) {
  memset(out, 0, sizeof(*out));
  out->ready = hook_ready;
  out->submit = fe_eng_submit;
  out->max_model_len = hook_max_model_len;
  out->model = hook_model;
  out->props = hook_props;
  out->lora = fe_eng_lora;
  out->ud = e;
}
