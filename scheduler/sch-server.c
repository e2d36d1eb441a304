/* sch-server.c — the scheduler server's sockets and loop, and what frontends ask:
 * ADD (into the engine, or an ERR back), ABORT, PING (PONG with the engine's stats);
 * and DOWN, from a supervisor that saw a worker's process end.
 * Frontend sends never block: a frontend that cannot take its OUT or ERR loses its
 * requests (aborted, with a log line) rather than stalling everyone else. The worker
 * side (READY, STEP, RESULT, failures) is in sch-server-work.c. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-hash.h"
#include "common/cm-log.h"
#include "common/cm-time.h"
#include "scheduler/sch-server-impl.h"

#define TAG SCH_SRV_TAG

/* Messages taken from the frontend socket per loop turn, so that a flood of ADDs
 * cannot starve the step loop. */
#define FRONT_BATCH 1024

void sch_server_config_default(struct sch_server_config *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  cfg->world_size = 1;
  cfg->max_num_seqs = 256;
  cfg->max_num_batched_tokens = 8192;
  cfg->max_waiting = 4096;
  cfg->enable_prefix_caching = true;
  cfg->async_scheduling = true;
  cfg->worker_timeout_ms = 10000;
}

uint64_t sch_srv_random(struct sch_server *s) {
  return cm_splitmix64(&s->rng);
}

static uint64_t seed_entropy(void) {
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v))
    v = cm_time_wall_ns() ^ ((uint64_t)getpid() << 32) ^ cm_time_ns();
  return v;
}

/* ---- frontends ------------------------------------------------------------ */

static bool rid_eq(const struct pr_rid *a, const struct pr_rid *b) {
  return a->len == b->len && memcmp(a->id, b->id, a->len) == 0;
}

/* The index of the frontend with this routing id, added when new; -1 when the table is
 * full of frontends that still own requests. */
static int32_t front_index(struct sch_server *s, const struct pr_rid *rid) {
  int32_t unused = -1, idle = -1;
  for (int32_t i = 0; i < SCH_SRV_MAX_FRONTS; i++) {
    struct sch_front *f = &s->fronts[i];
    if (f->used && rid_eq(&f->rid, rid)) return i;
    if (unused < 0 && !f->used) unused = i;
    if (idle < 0 && f->used && f->num_live == 0) idle = i;
  }
  /* an idle frontend's entry is taken only when none is unused: it gets a new one
   * with its next message */
  int32_t spare = unused >= 0 ? unused : idle;
  if (spare < 0) return -1;
  struct sch_front *f = &s->fronts[spare];
  f->rid = *rid;
  f->used = true;
  f->num_live = 0;
  return spare;
}

void sch_srv_drop(struct sch_server *s, struct sch_req *r, bool in_engine) {
  if (in_engine && s->engine) {
    int rc = sch_engine_abort(s->engine, r->eid);
    CM_ASSERT(rc == 0 || rc == CM_ERR_NOENT);
  }
  s->fronts[r->front].num_live--;
  int32_t slot = r->lora_slot;
  r->lora_slot = 0;
  sch_reqs_remove(&s->reqs, r);
  if (slot) sch_srv_lora_release(s, slot);
}

/* Aborts every request of a frontend that stopped taking messages. */
static void front_lost(struct sch_server *s, int32_t front, int rc, const char *what) {
  int32_t n = 0;
  for (int32_t i = 0; i < s->reqs.cap && s->fronts[front].num_live > 0; i++) {
    struct sch_req *r = &s->reqs.slots[i];
    if (r->eid && r->front == front) {
      sch_srv_drop(s, r, true);
      n++;
    }
  }
  cm_warn(TAG, "frontend %d cannot take %s (%s): aborted its %d requests", (int)front, what,
          cm_strerror(rc), (int)n);
}

void sch_srv_send_err(struct sch_server *s, int32_t front, uint64_t request_id, int code,
                      const char *fmt, ...) {
  char text[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  struct pr_msg m;
  pr_msg_init(&m, PR_ERR);
  m.u.err.request_id = request_id;
  m.u.err.code = code < 0 ? code : CM_ERR_INVAL;
  m.u.err.message = text;
  int rc = pr_sock_send(s->front_sock, &s->fronts[front].rid, &m, PR_DONTWAIT);
  if (rc) front_lost(s, front, rc, "ERR");
}

void sch_srv_send_out(struct sch_server *s, int32_t front, struct pr_out_seq *outs, uint32_t n) {
  struct pr_msg m;
  pr_msg_init(&m, PR_OUT);
  m.u.out.seqs = outs;
  m.u.out.n_seqs = n;
  int rc = pr_sock_send(s->front_sock, &s->fronts[front].rid, &m, PR_DONTWAIT);
  if (rc) front_lost(s, front, rc, "OUT");
}

/* The request's images and audio clips as the engine takes them, checked
 * against what the workers said one item may be (READY). 0 or a negative
 * cm_err with the reason in err. */
static int add_images(const struct sch_server *s, const struct pr_add *a, struct sch_image *out,
                      char *err, size_t errlen) {
  for (uint32_t i = 0; i < a->n_images; i++) {
    const struct pr_image *m = &a->images[i];
    if (m->kind == PR_MEDIA_AUDIO) { /* features of any length up to the longest clip's */
      if (!s->info.audio_tokens)
        return cm_fail(err, errlen, CM_ERR_UNSUPPORTED, "this model does not take audio");
      if (m->n_tokens > s->info.audio_tokens || m->pixels.n > s->info.audio_bytes)
        return cm_fail(err, errlen, CM_ERR_INVAL,
                       "item %u: an audio clip of %u tokens and %u bytes of features; the model "
                       "takes clips of at most %u and %u",
                       i, m->n_tokens, m->pixels.n, s->info.audio_tokens, s->info.audio_bytes);
    } else if (!s->info.image_tokens) {
      return cm_fail(err, errlen, CM_ERR_UNSUPPORTED, "this model does not take images");
    } else if (s->info.image_varsize) { /* sized per image, up to the most the workers take */
      if (!m->width || m->n_tokens > s->info.image_tokens || m->pixels.n > s->info.image_bytes)
        return cm_fail(err, errlen, CM_ERR_INVAL,
                       "image %u: %u tokens and %u bytes of pixels (%ux%u); the model takes "
                       "sized images of at most %u and %u",
                       i, m->n_tokens, m->pixels.n, m->width, m->height, s->info.image_tokens,
                       s->info.image_bytes);
    } else if (m->n_tokens != s->info.image_tokens || m->pixels.n != s->info.image_bytes) {
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "image %u: %u tokens and %u bytes of pixels; the model takes %u and %u", i,
                     m->n_tokens, m->pixels.n, s->info.image_tokens, s->info.image_bytes);
    }
    out[i] = (struct sch_image){(int32_t)m->pos, (int32_t)m->n_tokens,
                                m->hash,         m->pixels.v,
                                m->pixels.n,     m->width,
                                m->height,       m->kind};
  }
  return 0;
}

/* the blob's parts after the struct: their byte offsets and the end */
static void blob_parts(const struct pr_sampling *sp, size_t at[5]) {
  at[0] = sizeof(*sp);                                 /* grammar */
  at[1] = at[0] + ((sp->grammar.n + 3u) & ~(size_t)3); /* bias_ids */
  at[2] = at[1] + 4 * (size_t)sp->bias_ids.n;          /* bias */
  at[3] = at[2] + 4 * (size_t)sp->bias_ids.n;          /* bad_ids */
  at[4] = at[3] + 4 * (size_t)sp->bad_ids.n;           /* bad_lens */
}

size_t sch_srv_sampling_to_blob(const struct pr_sampling *sp, uint8_t *blob) {
  size_t at[5];
  blob_parts(sp, at);
  struct pr_sampling c = *sp;
  memset(blob + at[0], 0, at[1] - at[0]);
  if (sp->grammar.n) memcpy(blob + at[0], sp->grammar.v, sp->grammar.n);
  if (sp->bias_ids.n) {
    memcpy(blob + at[1], sp->bias_ids.v, at[2] - at[1]);
    memcpy(blob + at[2], sp->bias.v, at[3] - at[2]);
  }
  if (sp->bad_ids.n) memcpy(blob + at[3], sp->bad_ids.v, at[4] - at[3]);
  if (sp->bad_lens.n) memcpy(blob + at[4], sp->bad_lens.v, 4 * (size_t)sp->bad_lens.n);
  c.grammar.v = NULL;
  c.bias_ids.v = NULL;
  c.bias.v = NULL;
  c.bad_ids.v = NULL;
  c.bad_lens.v = NULL;
  memcpy(blob, &c, sizeof(c));
  return at[4] + 4 * (size_t)sp->bad_lens.n;
}

void sch_srv_sampling_from_blob(const uint8_t *blob, size_t len, struct pr_sampling *sp) {
  memcpy(sp, blob, sizeof(*sp));
  size_t at[5];
  blob_parts(sp, at);
  CM_ASSERT(len == at[4] + 4 * (size_t)sp->bad_lens.n);
  sp->grammar.v = blob + at[0];
  sp->bias_ids.v = (const uint32_t *)(const void *)(blob + at[1]);
  sp->bias.v = (const float *)(const void *)(blob + at[2]);
  sp->bad_ids.v = (const uint32_t *)(const void *)(blob + at[3]);
  sp->bad_lens.v = (const uint32_t *)(const void *)(blob + at[4]);
}

static void on_add(struct sch_server *s, int32_t front, const struct pr_add *a) {
  if (!s->serving) {
    sch_srv_send_err(s, front, a->request_id, CM_ERR_AGAIN, "workers not ready (%d of %d)",
                     (int)s->num_ready, (int)s->cfg.world_size);
    return;
  }
  if (sch_reqs_find(&s->reqs, front, a->request_id)) {
    sch_srv_send_err(s, front, a->request_id, CM_ERR_INVAL, "request id %llu is already live",
                     (unsigned long long)a->request_id);
    return;
  }
  struct sch_req *r = sch_reqs_add(&s->reqs, front, a->request_id);
  if (!r) {
    sch_srv_send_err(s, front, a->request_id, CM_ERR_FULL, "too many live requests (%d)",
                     (int)s->reqs.cap);
    return;
  }
  s->fronts[front].num_live++;
  struct pr_sampling sp = a->sampling;
  if (!sp.has_seed) {
    /* a seed per request keeps its sampling reproducible across preemption and steps */
    sp.seed = sch_srv_random(s);
    sp.has_seed = true;
  }
  r->logprobs = sp.logprobs;
  r->num_prompt = a->prompt.n;
  r->prompt_lp = sp.prompt_logprobs;
  if (r->prompt_lp >= 0 && a->prompt.n > 1) {
    size_t n = a->prompt.n - 1, k = (size_t)r->prompt_lp;
    r->plp = malloc(sizeof(float) * n);
    r->plp_rank = malloc(sizeof(uint32_t) * n);
    r->plp_ids = k ? malloc(sizeof(uint32_t) * n * k) : NULL;
    r->plp_top = k ? malloc(sizeof(float) * n * k) : NULL;
    if (!r->plp || !r->plp_rank || (k && (!r->plp_ids || !r->plp_top))) {
      sch_srv_drop(s, r, false);
      sch_srv_send_err(s, front, a->request_id, CM_ERR_NOMEM,
                       "out of memory for the logprobs of %u prompt tokens", a->prompt.n);
      return;
    }
  }
  /* the engine keeps the parameters as one blob: the struct, then the grammar's text
   * (padded to 4 bytes), the biased ids, their biases, the bad words' ids and lengths
   * (the struct's pointers are set again from the blob when a step sends it,
   * sch_srv_sampling_from_blob) */
  _Alignas(8) uint8_t blob[SCH_SRV_SAMPLING_BLOB_MAX];
  size_t blob_len = sch_srv_sampling_to_blob(&sp, blob);
  r->queued_ns = cm_time_wall_ns();
  /* token ids are u32 on the wire; one above INT32_MAX reads as negative and the
   * engine refuses it like any id outside the vocabulary */
  struct sch_request_params p = {
      .id = r->eid,
      .prompt = (const int32_t *)a->prompt.v,
      .prompt_len = (int32_t)a->prompt.n,
      .max_tokens = a->max_tokens > INT32_MAX ? INT32_MAX : (int32_t)a->max_tokens,
      .stop_token_ids = (const int32_t *)a->stop_token_ids.v,
      .num_stop_token_ids = (int32_t)a->stop_token_ids.n,
      .ignore_eos = sp.ignore_eos,
      .priority = a->priority,
      .arrival_ns = 0,
      .sampling = blob,
      .sampling_len = blob_len,
      .cache_salt = a->cache_salt,
      .score_prompt = r->prompt_lp >= 0,
  };
  for (uint32_t i = 0; i < a->stop_token_ids.n; i++) {
    if (a->stop_token_ids.v[i] >= s->info.vocab_size) {
      sch_srv_drop(s, r, false);
      sch_srv_send_err(s, front, a->request_id, CM_ERR_INVAL,
                       "stop token id %u is outside the vocabulary (%u)",
                       (unsigned)a->stop_token_ids.v[i], (unsigned)s->info.vocab_size);
      return;
    }
  }
  if (sp.lora && (sp.lora > s->info.n_lora || a->lora_sum != s->info.lora_sum)) {
    sch_srv_drop(s, r, false);
    if (sp.lora > s->info.n_lora)
      sch_srv_send_err(s, front, a->request_id, CM_ERR_INVAL,
                       "LoRA adapter %u asked for, and the workers hold %u (--lora-modules)",
                       (unsigned)sp.lora, (unsigned)s->info.n_lora);
    else
      sch_srv_send_err(s, front, a->request_id, CM_ERR_INVAL,
                       "the frontend's LoRA adapters are not the workers' (--lora-modules must "
                       "name the same adapters in the same order on every role)");
    return;
  }
  /* an adapter's K/V differ from the base model's: its blocks are cached apart */
  if (sp.lora) p.cache_salt = cm_mix64(a->cache_salt ^ cm_mix64(0x4c6f5241ull + sp.lora));
  struct sch_image images[PR_MAX_IMAGES];
  char err[256] = "";
  int rc = add_images(s, a, images, err, sizeof(err));
  if (rc) {
    sch_srv_drop(s, r, false);
    sch_srv_send_err(s, front, a->request_id, rc, "%s", err);
    return;
  }
  p.images = images;
  p.num_images = (int32_t)a->n_images;
  p.constrained = r->constrained = sp.grammar_kind != 0;
  int32_t failed = p.constrained ? sch_srv_grammars_failed(s) : -1;
  if (failed >= 0) {
    sch_srv_drop(s, r, false);
    sch_srv_send_err(s, front, a->request_id, CM_ERR_IO, SCH_SRV_GRAMMARS_FAILED, (int)failed);
    return;
  }
  if (p.constrained && !s->want_grammars) {
    s->want_grammars = true;
    sch_srv_grammars(s);
  }
  if (a->lora_uid) { /* a run-time adapter: the slot it will have (taken once the engine
                       took the request, so that a request refused changes no slot) */
    int32_t slot = sch_srv_lora_pick(s, a->lora_uid, a->lora_path, err, sizeof(err));
    if (slot < 0) {
      sch_srv_drop(s, r, false);
      sch_srv_send_err(s, front, a->request_id, slot, "%s", err);
      return;
    }
    p.lora_slot = slot;
    sp.lora = (uint32_t)slot; /* what the workers read */
    p.sampling_len = sch_srv_sampling_to_blob(&sp, blob);
    /* (a slot holds other adapters in turn: the adapter's id keys its blocks) */
    p.cache_salt = sch_srv_lora_salt(a->cache_salt, a->lora_uid);
  }
  rc = sch_engine_add(s->engine, &p, err, sizeof(err));
  if (rc) {
    sch_srv_drop(s, r, false);
    sch_srv_send_err(s, front, a->request_id, rc, "%s", err[0] ? err : cm_strerror(rc));
    return;
  }
  if (a->lora_uid) { /* (the slot picked: nothing ran in between) */
    int32_t slot = sch_srv_lora_acquire(s, a->lora_uid, a->lora_path, err, sizeof(err));
    if (slot != p.lora_slot) {
      sch_srv_drop(s, r, true);
      if (slot > 0) sch_srv_lora_release(s, slot);
      sch_srv_send_err(s, front, a->request_id, slot < 0 ? slot : CM_ERR_INVAL, "%s",
                       slot < 0 ? err : "the LoRA slot changed");
      return;
    }
    r->lora_slot = slot;
  }
  s->plan_idle = false;
  cm_debug(TAG, "request %llu of frontend %d: engine id %llu, %u prompt tokens",
           (unsigned long long)a->request_id, (int)front, (unsigned long long)r->eid,
           (unsigned)a->prompt.n);
}

static void on_abort(struct sch_server *s, int32_t front, const struct pr_abort *a) {
  for (uint32_t i = 0; i < a->request_ids.n; i++) {
    struct sch_req *r = sch_reqs_find(&s->reqs, front, a->request_ids.v[i]);
    if (r) sch_srv_drop(s, r, true);
  }
  s->plan_idle = false;
}

static void on_ping(struct sch_server *s, int32_t front, const struct pr_ping *p) {
  struct pr_msg m;
  pr_msg_init(&m, PR_PONG);
  struct pr_pong *o = &m.u.pong;
  o->nonce = p->nonce;
  o->ping_send_ns = p->send_ns;
  o->workers_ready = (uint32_t)s->num_ready;
  o->world_size = (uint32_t)s->cfg.world_size;
  if (s->engine) {
    struct sch_engine_stats st;
    sch_engine_stats(s->engine, &st);
    o->num_running = (uint32_t)st.num_running;
    o->num_waiting = (uint32_t)st.num_waiting;
    o->kv_usage = st.kv_usage < 0 ? 0 : st.kv_usage > 1 ? 1 : st.kv_usage;
    o->prefix_cache_queries = st.prefix_queries;
    o->prefix_cache_hits = st.prefix_hits;
    o->num_preemptions = st.num_preemptions;
    o->spec_num_drafts = st.spec_num_drafts;
    o->spec_num_draft_tokens = st.spec_num_draft_tokens;
    o->spec_num_accepted_tokens = st.spec_num_accepted_tokens;
    for (uint32_t i = 0; i < SCH_MAX_SPEC_TOKENS && i < PR_MAX_DRAFT; i++)
      if (st.spec_accepted_per_pos[i]) {
        o->spec_accepted_per_pos[i] = st.spec_accepted_per_pos[i];
        o->n_spec_pos = i + 1;
      }
  }
  if (s->serving) o->max_model_len = s->engine_info.max_model_len;
  o->max_num_seqs = (uint32_t)s->cfg.max_num_seqs;
  o->prompt_tokens = s->prompt_tokens;
  o->generation_tokens = s->generation_tokens;
  const struct sch_rank *r0 = &s->ranks[0]; /* what runs the model, as rank 0 said */
  if (r0->ready && r0->kernels[0]) o->kernels = r0->kernels;
  if (r0->ready && r0->matmul_inputs[0]) o->matmul_inputs = r0->matmul_inputs;
  int rc = pr_sock_send(s->front_sock, &s->fronts[front].rid, &m, PR_DONTWAIT);
  if (rc) front_lost(s, front, rc, "PONG");
}

/* Takes up to FRONT_BATCH messages from the frontend socket. */
static int front_recv(struct sch_server *s) {
  for (int i = 0; i < FRONT_BATCH; i++) {
    struct pr_rid from = {0};
    struct pr_msg m;
    cm_arena_reset(&s->front_arena);
    int rc = pr_sock_recv(s->front_sock, &from, &m, &s->front_arena, PR_DONTWAIT);
    if (rc == CM_ERR_AGAIN) return 0;
    if (rc == CM_ERR_CLOSED) return rc;
    if (from.len == 0) {
      cm_warn(TAG, "frontend socket: a message without a routing id (%s)", cm_strerror(rc));
      continue;
    }
    int32_t front = front_index(s, &from);
    if (front < 0) {
      cm_warn(TAG, "frontend socket: too many frontends with live requests; message dropped");
      continue;
    }
    if (rc) {
      cm_warn(TAG, "frontend %d: bad message dropped: %s", (int)front, cm_strerror(rc));
      sch_srv_send_err(s, front, 0, rc, "bad message: %s", cm_strerror(rc));
      continue;
    }
    switch (m.type) {
    case PR_ADD: on_add(s, front, &m.u.add); break;
    case PR_ABORT: on_abort(s, front, &m.u.abort); break;
    case PR_PING: on_ping(s, front, &m.u.ping); break;
    case PR_DOWN: sch_srv_work_down(s, &m.u.down); break;
    case PR_LORA: sch_srv_on_lora(s, front, &m.u.lora); break;
    default:
      cm_warn(TAG, "frontend %d: %s is not a frontend message; dropped", (int)front,
              pr_type_name(m.type));
      sch_srv_send_err(s, front, 0, CM_ERR_UNKNOWN, "%s is not a frontend message",
                       pr_type_name(m.type));
      break;
    }
  }
  return 0;
}

/* ---- lifecycle -------------------------------------------------------------- */

int sch_server_create(const struct sch_server_config *cfg, struct sch_server **out) {
  *out = NULL;
  if (cfg->world_size < 1 || cfg->world_size > SCH_SRV_MAX_RANKS || cfg->max_num_seqs < 1 ||
      cfg->max_num_batched_tokens < 1 || cfg->max_waiting < 1 || !cfg->frontend_endpoint ||
      !cfg->worker_endpoint || cfg->worker_timeout_ms == 0) {
    cm_error(TAG, "invalid scheduler configuration");
    return CM_ERR_INVAL;
  }
  struct sch_server *s = calloc(1, sizeof(*s));
  if (!s) return CM_ERR_NOMEM;
  int rc = CM_ERR_NOMEM;
  s->cfg = *cfg;
  s->rng = seed_entropy();
  s->hash_key = sch_srv_random(s);
  cm_arena_init(&s->front_arena, 1 << 16, 256u << 20);
  cm_arena_init(&s->work_arena, 1 << 16, 256u << 20);
  if ((rc = sch_reqs_init(&s->reqs, cfg->max_num_seqs + cfg->max_waiting))) goto fail;
  if ((rc = sch_srv_work_init(s))) goto fail;
  rc = CM_ERR_IO;
  if (!(s->zctx = zmq_ctx_new())) goto fail;
  if ((rc = pr_sock_open(s->zctx, ZMQ_ROUTER, 0, &s->front_sock))) goto fail;
  if ((rc = pr_sock_open(s->zctx, ZMQ_ROUTER, 0, &s->work_sock))) goto fail;
  if ((rc = pr_sock_bind(s->front_sock, cfg->frontend_endpoint))) {
    cm_error(TAG, "cannot bind the frontend endpoint %s", cfg->frontend_endpoint);
    goto fail;
  }
  if ((rc = pr_sock_bind(s->work_sock, cfg->worker_endpoint))) {
    cm_error(TAG, "cannot bind the worker endpoint %s", cfg->worker_endpoint);
    goto fail;
  }
  /* a worker whose connection closes is failed at once, wherever it runs, rather
   * than when its heartbeats are missed */
  if ((rc = pr_monitor_open(s->zctx, s->work_sock, ZMQ_EVENT_DISCONNECTED, &s->work_mon))) {
    cm_error(TAG, "cannot monitor the worker socket's connections");
    goto fail;
  }
  cm_info(TAG, "model %s: frontends on %s, workers on %s, waiting for %d rank(s)",
          cfg->model_dir ? cfg->model_dir : "(unnamed)", cfg->frontend_endpoint,
          cfg->worker_endpoint, (int)cfg->world_size);
  *out = s;
  return 0;
fail:
  sch_server_destroy(s);
  return rc;
}

void sch_server_destroy(struct sch_server *s) {
  if (!s) return;
  if (s->work_sock) sch_srv_work_shutdown(s);
  for (int32_t i = 0; s->front_sock && i < s->reqs.cap; i++) {
    struct sch_req *r = &s->reqs.slots[i];
    if (!r->eid) continue;
    int32_t front = r->front;
    uint64_t id = r->request_id;
    sch_srv_drop(s, r, true);
    sch_srv_send_err(s, front, id, CM_ERR_CLOSED, "scheduler shutting down");
  }
  if (s->num_steps) {
    double n = (double)s->num_steps;
    struct sch_engine_stats est = {0};
    if (s->engine) sch_engine_stats(s->engine, &est);
    cm_info(TAG,
            "%llu steps (%llu sent while another was in flight, %llu preemptions); per step in "
            "the scheduler "
            "%.1f us (plan+send %.1f, result+apply+OUT %.1f; engine plan+apply %.1f); STEP to "
            "RESULT %.1f us",
            (unsigned long long)s->num_steps, (unsigned long long)s->num_steps_ahead,
            (unsigned long long)est.num_preemptions,
            (double)(s->step_ns_plan + s->step_ns_apply) / 1e3 / n,
            (double)s->step_ns_plan / 1e3 / n, (double)s->step_ns_apply / 1e3 / n,
            (double)s->step_ns_engine / 1e3 / n, (double)s->step_ns_round / 1e3 / n);
  }
  pr_monitor_close(s->work_sock, s->work_mon);
  pr_sock_close(s->front_sock);
  pr_sock_close(s->work_sock);
  if (s->zctx) zmq_ctx_term(s->zctx);
  for (int32_t i = 0; i <= PR_MAX_LORAS; i++)
    free(s->loras[i].path);
  sch_srv_work_free(s);
  sch_reqs_free(&s->reqs);
  cm_arena_free(&s->front_arena);
  cm_arena_free(&s->work_arena);
  free(s);
}

int sch_server_run(struct sch_server *s, volatile sig_atomic_t *stop) {
  zmq_pollitem_t items[3] = {
      {pr_sock_zmq(s->front_sock), 0, ZMQ_POLLIN, 0},
      {pr_sock_zmq(s->work_sock), 0, ZMQ_POLLIN, 0},
      {s->work_mon, 0, ZMQ_POLLIN, 0},
  };
  while (!*stop) {
    long timeout_ms = 100; /* heartbeat checks and the stop flag */
    if (s->serving && s->num_in_flight < s->max_in_flight && !s->plan_idle && sch_srv_has_work(s))
      timeout_ms = 0;
    if (zmq_poll(items, 3, timeout_ms) < 0) {
      int e = zmq_errno();
      if (e == EINTR) continue;
      cm_error(TAG, "zmq_poll: %s", zmq_strerror(e));
      return pr_zmq_err(e);
    }
    sch_srv_work_monitor(s); /* before the messages: see sch_srv_work_monitor */
    sch_srv_work_recv(s);
    int rc = front_recv(s);
    if (rc) return rc;
    sch_srv_work_check(s);
    sch_srv_work_step(s);
  }
  return 0;
}
