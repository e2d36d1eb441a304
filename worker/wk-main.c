/* wk-main.c — the `lmserve worker` process: creates the kernel backend,
 * loads the model (and the assistant model for speculative decoding),
 * connects a DEALER socket to the scheduler, announces itself with READY and
 * then serves STEP plans (wk-role.h) until CTRL shutdown or SIGTERM.
 *
 * Heartbeats: a forward pass can take longer than the scheduler's heartbeat
 * period, and the step cannot be interrupted between layers, so a second
 * thread sends BEAT every --heartbeat-interval (1 s). Both threads use the one DEALER socket
 * (the scheduler knows a rank by its routing id, so a second socket would be
 * a stranger to it); a mutex serialises every call on it, which also gives
 * ZeroMQ the memory barrier it asks for when a socket changes threads. The
 * main thread holds the mutex only while it polls (at most 100 ms) or
 * sends, never during a step. Mutexes are not fair, so a beat thread that
 * waits for the lock while the main thread polls in a loop could starve:
 * instead, whoever holds the socket sends the BEAT once one is due
 * (the main thread after each poll while idle, the beat thread while a
 * step runs), and both read the time of the last one from last_beat_ns.
 *
 * A monitor on the socket sees the scheduler's connection close (the
 * scheduler died, or its host): a new scheduler would not know this rank, so
 * it ends (status 1) for its supervisor to start it again.
 *
 * Exit codes: 0 after CTRL shutdown or SIGTERM/SIGINT, 2 for bad flags or
 * an unsupported configuration, 1 when the model or the socket fails or the
 * scheduler goes away. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/cm-args.h"
#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-log.h"
#include "common/cm-time.h"
#include "kernels/kn-registry.h"
#include "model/md-audio-g4.h"
#include "model/md-config.h"
#include "model/md-lora-list.h"
#include "proto/pr-zmq.h"
#include "worker/wk-audio-g4.h"
#include "worker/wk-main.h"
#include "worker/wk-model.h"
#include "worker/wk-ngram.h"
#include "worker/wk-role.h"
#include "worker/wk-vision-g4.h"
#include "worker/wk-vision.h"

#define TAG           "worker"
#define BEAT_CHECK_MS 100 /* how often the beat thread looks at the clock, at most */
#define POLL_MS       100 /* how long the main thread holds the socket per poll */
#define TERM_GRACE_S  3   /* after SIGTERM, a step still running this long ends the process */
#define AHEAD_WAIT_MS                                                                              \
  5 /* how long an open step that a scheduler planning ahead sent                                  \
       waits for the next STEP before it is answered */

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

struct wk_proc {
  uint32_t rank;
  uint64_t beat_ns; /* heartbeat period */
  struct pr_sock *sock;
  void *mon;             /* PAIR: sock's DISCONNECTED events (main thread, under mu) */
  pthread_mutex_t mu;    /* guards sock */
  uint64_t last_step;    /* last finished step id (atomic access) */
  uint64_t last_beat_ns; /* cm_time_ns of the last BEAT sent (atomic access) */
  int quit;              /* set by the main thread when it leaves (atomic access) */
  int announced;         /* READY was sent (atomic access) */
  struct wk_role *role;  /* its structured-output flags go with every BEAT */
  unsigned beat_flags;   /* the flags the last BEAT said (atomic access) */
  /* what READY says (sent again when the scheduler asks: PR_CTRL_ANNOUNCE) */
  struct wk_model *model;
  struct kn_backend *be;
  uint32_t world, max_draft, max_seqs, max_tokens;
  uint32_t audio_tokens, audio_bytes; /* the longest clip's; 0 without an audio tower */
  uint64_t lora_sum;                  /* --lora-modules' (md_lora_list_sum) */
  int max_lora_rank;                  /* --max-lora-rank (0: any), for run-time adapters too */
  pthread_mutex_t quit_mu; /* with quit_cv: wakes the beat thread */
  pthread_cond_t quit_cv;
};

static int send_locked(struct wk_proc *p, const struct pr_msg *m) {
  pthread_mutex_lock(&p->mu);
  int rc = pr_sock_send(p->sock, NULL, m, 0);
  pthread_mutex_unlock(&p->mu);
  return rc;
}

static void send_fail(struct wk_proc *p, uint64_t step_id, int code, const char *why) {
  struct pr_msg m;
  pr_msg_init(&m, PR_FAIL);
  m.u.fail.rank = p->rank;
  m.u.fail.step_id = step_id;
  m.u.fail.code = code < 0 ? code : CM_ERR_INVAL;
  m.u.fail.message = why;
  int rc = send_locked(p, &m);
  if (rc) cm_error(TAG, "cannot send FAIL: %s", cm_strerror(rc));
}

/* CTRL LORA_LOAD (answered with LORA_ACK) and LORA_DROP: a run-time adapter in or out
 * of its slot. The open step, if any, has answered before: no forward runs meanwhile. */
static void lora_ctrl(struct wk_proc *p, const struct pr_ctrl *c) {
  int slot = (int)(c->arg & 0xff) <= PR_MAX_LORAS && c->arg > 0 ? (int)(c->arg & 0xff) : 0;
  if (c->op == PR_CTRL_LORA_DROP) {
    wk_model_drop_lora(p->model, slot);
    cm_info(TAG, "LoRA slot %d freed", slot);
    return;
  }
  char err[512] = "";
  int rc = !slot || !c->text
               ? cm_fail(err, sizeof(err), CM_ERR_INVAL,
                         "LORA_LOAD needs a slot (1 .. %d) and a path", PR_MAX_LORAS)
               : wk_model_set_lora(p->model, slot, c->text, p->max_lora_rank, err, sizeof(err));
  if (rc)
    cm_warn(TAG, "LoRA slot %d: %s", slot, err);
  else
    cm_info(TAG, "LoRA adapter %s loaded into slot %d", c->text, slot);
  struct pr_msg m;
  pr_msg_init(&m, PR_LORA_ACK);
  m.u.lora.nonce = (uint64_t)c->arg;
  m.u.lora.rank = p->rank;
  m.u.lora.slot = (uint32_t)slot;
  m.u.lora.code = rc;
  m.u.lora.message = err;
  int src = send_locked(p, &m);
  if (src) cm_error(TAG, "cannot send LORA_ACK: %s", cm_strerror(src));
}

static int beat_due(struct wk_proc *p) {
  if (!__atomic_load_n(&p->announced, __ATOMIC_ACQUIRE)) return 0; /* no BEAT before READY */
  uint64_t last = __atomic_load_n(&p->last_beat_ns, __ATOMIC_ACQUIRE);
  /* a change of the flags is said at once: the scheduler holds constrained requests
     back until every rank has the structured-output state */
  return cm_time_ns() - last >= p->beat_ns ||
         (p->role &&
          wk_role_grammars_flags(p->role) != __atomic_load_n(&p->beat_flags, __ATOMIC_ACQUIRE));
}

/* Sends a BEAT; the caller holds p->mu. */
static void beat_send_locked(struct wk_proc *p) {
  struct pr_msg m;
  pr_msg_init(&m, PR_BEAT);
  m.u.beat.rank = p->rank;
  m.u.beat.last_step_id = __atomic_load_n(&p->last_step, __ATOMIC_ACQUIRE);
  m.u.beat.time_ns = cm_time_wall_ns();
  m.u.beat.flags = p->role ? wk_role_grammars_flags(p->role) : 0;
  __atomic_store_n(&p->beat_flags, m.u.beat.flags, __ATOMIC_RELEASE);
  (void)pr_sock_send(p->sock, NULL, &m, PR_DONTWAIT);
  __atomic_store_n(&p->last_beat_ns, cm_time_ns(), __ATOMIC_RELEASE);
}

/* The heartbeat thread: a BEAT whenever one is due and the main thread has
 * not sent it (it is in a step), until quit. After SIGTERM it also ends the
 * process when the main thread is stuck in a long step. */
static void *beat_main(void *arg) {
  struct wk_proc *p = arg;
  uint64_t stop_seen = 0;
  pthread_mutex_lock(&p->quit_mu);
  while (!__atomic_load_n(&p->quit, __ATOMIC_ACQUIRE)) {
    pthread_mutex_unlock(&p->quit_mu);
    if (beat_due(p)) {
      pthread_mutex_lock(&p->mu);
      if (beat_due(p)) beat_send_locked(p);
      pthread_mutex_unlock(&p->mu);
    }
    if (g_stop) {
      uint64_t now = cm_time_ns();
      if (!stop_seen) stop_seen = now;
      if (now - stop_seen > (uint64_t)TERM_GRACE_S * 1000000000ull) {
        cm_info(TAG, "stopping during a long step");
        _exit(0);
      }
    }
    pthread_mutex_lock(&p->quit_mu);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t wait_ns = CM_MIN((uint64_t)BEAT_CHECK_MS * 1000000ull, p->beat_ns / 2);
    ts.tv_nsec += (long)wait_ns;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    if (!__atomic_load_n(&p->quit, __ATOMIC_ACQUIRE))
      pthread_cond_timedwait(&p->quit_cv, &p->quit_mu, &ts);
  }
  pthread_mutex_unlock(&p->quit_mu);
  return NULL;
}

/* READY: the model's KV layout and vocabulary, and the largest step this
 * rank was sized for (max_seqs sequences, max_tokens tokens with drafts). */
static int send_ready(struct wk_proc *p) {
  struct wk_model *m = p->model;
  uint32_t world = p->world, max_draft = p->max_draft, max_seqs = p->max_seqs,
           max_tokens = p->max_tokens;
  const struct md_config *c = wk_model_config(m);
  const struct wk_kv_spec *kv = wk_model_kv_spec(m);
  struct pr_kv_group groups[WK_MAX_KV_GROUPS];
  uint32_t eos[MD_MAX_EOS];
  for (int g = 0; g < kv->n_groups; g++) {
    groups[g] = (struct pr_kv_group){
        .block_tokens = (uint32_t)kv->groups[g].block_tokens,
        .n_layers = (uint32_t)kv->groups[g].n_layers,
        .bytes_per_token = kv->groups[g].bytes_per_token,
        .sliding_window = (uint32_t)kv->groups[g].window,
    };
  }
  for (int i = 0; i < c->n_eos; i++)
    eos[i] = (uint32_t)c->eos_ids[i];
  struct pr_msg msg;
  pr_msg_init(&msg, PR_READY);
  struct pr_ready *r = &msg.u.ready;
  r->rank = p->rank;
  r->world_size = world;
  r->kv_blocks = (uint64_t)wk_model_n_pages(m);
  r->groups = groups;
  r->n_groups = (uint32_t)kv->n_groups;
  r->vocab_size = (uint32_t)c->vocab;
  r->max_model_len = (uint32_t)c->max_pos;
  r->eos_ids.v = eos;
  r->eos_ids.n = (uint32_t)c->n_eos;
  r->max_draft = max_draft;
  r->max_num_seqs = max_seqs;
  r->max_num_batched_tokens = max_tokens;
  r->shard_sum = wk_model_shard_sum(m);
  r->pid = (uint32_t)getpid();
  r->kernels = kn_backend_name(p->be);
  r->matmul_inputs = kn_backend_matmul_inputs(p->be);
  if (c->vision.present) {
    const struct md_vision_cfg *v = &c->vision;
    r->image_tokens = (uint32_t)v->mm_tokens;
    r->image_bytes = (uint32_t)((size_t)v->pre.width * (size_t)v->pre.height * (size_t)v->channels);
  } else if (c->vision_g4.present) { /* sized per image: the most one may have */
    const struct md_vision_g4_cfg *v = &c->vision_g4;
    r->image_tokens = MD_G4_MAX_SOFT_TOKENS;
    r->image_bytes = (uint32_t)((size_t)MD_G4_MAX_SOFT_TOKENS * (size_t)(v->pool * v->pool) *
                                (size_t)(v->patch * v->patch) * 3);
    r->image_varsize = 1;
  }
  r->n_lora = (uint32_t)wk_model_n_lora(m);
  r->lora_sum = p->lora_sum;
  r->audio_tokens = p->audio_tokens;
  r->audio_bytes = p->audio_bytes;
  return send_locked(p, &msg);
}

/* Receives one message, waiting at most wait_ms. CM_ERR_AGAIN: nothing. */
static int recv_wait(struct wk_proc *p, struct pr_msg *m, struct cm_arena *a, int wait_ms) {
  pthread_mutex_lock(&p->mu);
  zmq_pollitem_t it[2] = {{.socket = pr_sock_zmq(p->sock), .events = ZMQ_POLLIN},
                          {.socket = p->mon, .events = ZMQ_POLLIN}};
  int n = zmq_poll(it, p->mon ? 2 : 1, wait_ms);
  int rc = CM_ERR_AGAIN;
  if (n > 0 && (it[0].revents & ZMQ_POLLIN)) rc = pr_sock_recv(p->sock, NULL, m, a, PR_DONTWAIT);
  /* the scheduler is gone (dead, or its host): the rank cannot serve a new one, which
   * would not know it; it ends, and its supervisor starts it again */
  int ev = 0, fd = -1;
  while (rc == CM_ERR_AGAIN && n > 0 && p->mon && pr_monitor_recv(p->mon, &ev, &fd) == 0)
    if (ev == ZMQ_EVENT_DISCONNECTED) {
      cm_error(TAG, "rank %u: the connection to the scheduler closed", p->rank);
      rc = CM_ERR_CLOSED;
    }
  if (beat_due(p)) beat_send_locked(p);
  pthread_mutex_unlock(&p->mu);
  return rc;
}

static int recv_one(struct wk_proc *p, struct pr_msg *m, struct cm_arena *a) {
  return recv_wait(p, m, a, POLL_MS);
}

/* Forms the tensor-parallel group: rank 0 makes the group's id and offers it to the
 * scheduler in a DIST; the others ask with an empty DIST and wait for the scheduler to
 * relay it. Then every rank joins the backend's group (which returns once all have).
 * Returns 0 or a negative cm_err with the reason in err. */
static int join_group(struct wk_proc *p, struct kn_backend *be, uint32_t world, int timeout_ms,
                      char *err, size_t errlen) {
  struct kn_comm_id id;
  struct pr_msg m;
  pr_msg_init(&m, PR_DIST);
  m.u.dist.rank = p->rank;
  m.u.dist.world_size = world;
  int rc;
  if (p->rank == 0) {
    if ((rc = kn_comm_id_new(be, &id)))
      return cm_fail(err, errlen, rc, "cannot make the group's id: %s", cm_strerror(rc));
    m.u.dist.comm_id = (struct pr_u32s){(uint32_t *)(void *)id.bytes, PR_MAX_COMM_ID};
  }
  if ((rc = send_locked(p, &m)))
    return cm_fail(err, errlen, rc, "cannot send DIST: %s", cm_strerror(rc));
  if (p->rank != 0) { /* wait for the scheduler's answer */
    struct cm_arena arena;
    cm_arena_init(&arena, 4096, 1u << 20);
    uint64_t deadline = cm_time_ns() + (uint64_t)timeout_ms * 1000000ull;
    rc = CM_ERR_TIMEOUT;
    while (!g_stop && cm_time_ns() < deadline) {
      cm_arena_reset(&arena);
      struct pr_msg in;
      int r = recv_one(p, &in, &arena);
      if (r == CM_ERR_AGAIN) continue;
      if (r) {
        rc = r;
        break;
      }
      if (in.type != PR_DIST || in.u.dist.comm_id.n != PR_MAX_COMM_ID) {
        cm_warn(TAG, "%s while waiting for the group's id; ignored", pr_type_name(in.type));
        continue;
      }
      memcpy(id.bytes, in.u.dist.comm_id.v, sizeof(id.bytes));
      rc = 0;
      break;
    }
    cm_arena_free(&arena);
    if (rc)
      return cm_fail(err, errlen, rc, "no tensor-parallel group id from the scheduler: %s",
                     cm_strerror(rc));
  }
  if ((rc = kn_comm_join(be, &id, (int)p->rank, (int)world, timeout_ms)))
    return cm_fail(err, errlen, rc, "cannot join the tensor-parallel group of %u: %s", world,
                   cm_strerror(rc));
  return 0;
}

/* Answers step `id`: RESULT res from rank 0 when rc is 0, else FAIL with err. 1 when
 * the worker must end (*status set): the socket closed, or the tensor-parallel group
 * failed. */
static int answer(struct wk_proc *p, uint32_t world, uint64_t id, int rc, const struct pr_msg *res,
                  const char *err, int *status) {
  __atomic_store_n(&p->last_step, id, __ATOMIC_RELEASE);
  if (rc) {
    cm_warn(TAG, "step %llu refused: %s", (unsigned long long)id, err);
    send_fail(p, id, rc, err[0] ? err : cm_strerror(rc));
    if (world > 1 && (rc == CM_ERR_CLOSED || rc == CM_ERR_TIMEOUT)) {
      /* a peer died or stopped: the group cannot step again */
      cm_error(TAG, "the tensor-parallel group failed; exiting");
      *status = 1;
      return 1;
    }
    return 0;
  }
  if (p->rank == 0 && (rc = send_locked(p, res))) {
    cm_error(TAG, "cannot send RESULT: %s", cm_strerror(rc));
    if (rc == CM_ERR_CLOSED) {
      *status = 1;
      return 1;
    }
  }
  return 0;
}

/* Finishes the oldest open step and answers it (as answer). */
static int finish_one(struct wk_proc *p, struct wk_role *role, uint32_t world, int *status) {
  struct pr_msg res;
  char err[512] = "";
  int rc = wk_role_finish(role, &res, err, sizeof(err));
  return answer(p, world, res.u.result.step_id, rc, &res, err, status);
}

/* Launches step m (with pipelining on it stays open; else it is finished) and answers
 * what finishes. *kept: 1 when m stays open (its message must outlive the call). */
static int run_step(struct wk_proc *p, struct wk_role *role, uint32_t world, int pipeline,
                    const struct pr_msg *m, int *kept, int *status) {
  char err[512] = "";
  *kept = 0;
  int rc = wk_role_launch(role, &m->u.step, err, sizeof(err));
  if (rc == CM_ERR_AGAIN) { /* it cannot overlap the open step: after it */
    if (finish_one(p, role, world, status)) return 1;
    rc = wk_role_launch(role, &m->u.step, err, sizeof(err));
  } else if (wk_role_open(role) == 2 || (rc && wk_role_open(role))) {
    /* m's forward is queued behind the open step, or failed: the open step answers first */
    if (finish_one(p, role, world, status)) return 1;
  }
  if (rc) return answer(p, world, m->u.step.step_id, rc, NULL, err, status);
  if (pipeline) {
    *kept = 1;
    return 0;
  }
  return finish_one(p, role, world, status);
}

/* The serving loop. With pipeline, a launched step stays open until the next
 * message is looked at: a STEP already waiting launches first (its forward
 * overlapping what is left of the open step) and the open step is answered
 * after; anything else, or nothing, answers the open step at once. The messages
 * of open steps live in their own arenas. Returns the exit status. */
static int serve(struct wk_proc *p, struct wk_role *role, uint32_t world, int pipeline) {
  struct cm_arena arenas[2];
  cm_arena_init(&arenas[0], 1u << 20, 512u << 20);
  cm_arena_init(&arenas[1], 1u << 20, 512u << 20);
  int ai = 0;    /* the arena of the next message: never the open step's */
  int ahead = 0; /* the open step ran a token of the step before (PR_SEQ_PREV_TOKEN): its
                    scheduler plans a step ahead, and the next one is on its way */
  char err[512];
  int status = 0;
  while (!g_stop) {
    struct pr_msg m;
    cm_arena_reset(&arenas[ai]);
    int rc;
    if (wk_role_open(role)) {
      rc = recv_wait(p, &m, &arenas[ai], ahead ? AHEAD_WAIT_MS : 0);
      if (rc || m.type != PR_STEP) { /* not a step to overlap: the open step answers now */
        if (finish_one(p, role, world, &status)) break;
        if (rc == CM_ERR_AGAIN) continue;
      }
    } else {
      rc = recv_one(p, &m, &arenas[ai]);
      if (rc == CM_ERR_AGAIN) continue;
    }
    if (rc == CM_ERR_CLOSED) {
      cm_error(TAG, "scheduler socket closed");
      status = 1;
      break;
    }
    if (rc) {
      snprintf(err, sizeof(err), "malformed message from the scheduler: %s", cm_strerror(rc));
      cm_warn(TAG, "%s", err);
      send_fail(p, 0, rc, err);
      continue;
    }
    if (m.type == PR_CTRL) {
      if (m.u.ctrl.op == PR_CTRL_SHUTDOWN) {
        cm_info(TAG, "shutdown requested by the scheduler");
        break;
      }
      if (m.u.ctrl.op == PR_CTRL_ANNOUNCE) { /* a restarted scheduler, or one that gave us up */
        wk_role_reset(role);
        wk_model_drop_run_time_loras(p->model); /* (it knows none of their slots) */
        rc = send_ready(p);
        __atomic_store_n(&p->beat_flags, 0, __ATOMIC_RELEASE); /* READY cleared them */
        cm_info(TAG, "the scheduler does not know this rank: sequence state dropped, READY %s",
                rc ? "could not be sent" : "sent again");
        continue;
      }
      if (m.u.ctrl.op == PR_CTRL_LORA_LOAD || m.u.ctrl.op == PR_CTRL_LORA_DROP) {
        lora_ctrl(p, &m.u.ctrl);
        continue;
      }
      if (m.u.ctrl.op == PR_CTRL_GRAMMARS) {
        if (!wk_role_grammars_flags(role)) cm_info(TAG, "building the structured-output state");
        wk_role_grammars_start(role);
        continue;
      }
      cm_warn(TAG, "CTRL op %u is not supported by this worker; ignored", m.u.ctrl.op);
      continue;
    }
    if (m.type != PR_STEP) {
      cm_warn(TAG, "unexpected %s message from the scheduler; ignored", pr_type_name(m.type));
      continue;
    }
    int kept = 0;
    if (run_step(p, role, world, pipeline, &m, &kept, &status)) break;
    ai ^= kept;
    ahead = 0;
    for (uint32_t i = 0; kept && i < m.u.step.n_seqs; i++)
      ahead |= !!(m.u.step.seqs[i].flags & PR_SEQ_PREV_TOKEN);
  }
  while (!status && wk_role_open(role) && !finish_one(p, role, world, &status))
    ;
  cm_arena_free(&arenas[0]);
  cm_arena_free(&arenas[1]);
  return status;
}

/* Creates the kernel backend through the registry: --device NAME, else
 * $LMSERVE_DEVICE (the test suite pins the CPU, whose results are exact),
 * else the first usable backend in preference order (CUDA where this build
 * has it and a GPU is visible, else the CPU). Returns 0, 2 for a name that
 * is unknown or cannot run here, 1 when creation fails. */
static int make_backend(const char *device, const struct kn_backend_opts *o,
                        struct kn_backend **be) {
  char err[512];
  const struct kn_backend_reg *reg;
  if (kn_backend_choose(device, &reg, err, sizeof(err))) {
    fprintf(stderr, "lmserve worker: %s%s\n", device ? "--device: " : "", err);
    return 2;
  }
  if (kn_backend_reg_create(reg, o, be, err, sizeof(err))) {
    fprintf(stderr, "lmserve worker: %s\n", err);
    return 1;
  }
  return 0;
}

/* This rank's index among the ranks on its host: --local-rank, else
 * $LOCAL_RANK (as torchrun sets it), else the global rank. -1 when
 * $LOCAL_RANK is not a number in [0, 1023]. */
static int local_rank_of(int64_t flag, int seen, int64_t rank) {
  if (seen) return (int)flag;
  const char *env = getenv("LOCAL_RANK");
  if (!env || !*env) return (int)rank;
  int64_t v;
  if (cm_parse_i64(env, &v) || v < 0 || v > 1023) return -1;
  return (int)v;
}

int wk_dtype_args(const char *who, const char *dtype, const char *kv_dtype, const char *quant,
                  int *bf16, int *kv_dtype_out, int *quant_out) {
  char why[160];
  if (kn_backend_dtype_parse(dtype, bf16, why, sizeof(why)) ||
      wk_kv_dtype_parse(kv_dtype, kv_dtype_out, why, sizeof(why)) ||
      wk_quantization_parse(quant, quant_out, why, sizeof(why))) {
    fprintf(stderr, "%s: %s\n", who, why);
    return -1;
  }
  return 0;
}

int wk_worker_main(int argc, char **argv) {
  const char *model_dir = NULL, *endpoint = NULL, *device = NULL, *spec_dir = NULL, *tok_dir = NULL,
             *mmproj = NULL;
  const char *dtype = "auto", *kv_dtype_s = "auto", *quant_s = "none";
  int64_t rank = 0, world = 1, block = 16, max_batched = 2048, max_seqs = 64, threads = 0,
          spec_k = 0, local_rank = 0;
  uint64_t kv_bytes = 0; /* 0: not given (CPU: 512M; CUDA: sized by --gpu-memory-utilization) */
  double mem_util = 0.9;
  int spec_k_seen = 0, kv_seen = 0, dev_sampling = -1, pipeline = -1, local_rank_seen = 0,
      use_mmap = 0, eager = 0;
  int64_t join_ms = 60000, max_lora_rank = 0, ngram_max = 0, ngram_min = 0;
  const char *spec_cfg = NULL;
  char spec_buf[4096];
  double beat_s = 1.0;
  struct cm_strs lora_args = {0};
  struct md_lora_module loras[CM_STRS_MAX];
  const struct cm_opt opts[] = {
      {"model", CM_OPT_STR, &model_dir, "PATH", MD_MODEL_HELP},
      {"scheduler", CM_OPT_STR, &endpoint, "ENDPOINT",
       "scheduler's worker endpoint (ipc:// or "
       "tcp://)"},
      {"rank", CM_OPT_INT, &rank, "R", "tensor-parallel rank (0)", 0, 1023},
      {"world-size", CM_OPT_INT, &world, "N", "tensor-parallel ranks (1)", 1, 1024},
      {"local-rank", CM_OPT_INT, &local_rank, "R",
       "this rank's index on its host; a GPU rank runs on device R modulo the devices visible "
       "($LOCAL_RANK, else --rank)",
       0, 1023, 0, 0, &local_rank_seen},
      {"kv-cache-memory", CM_OPT_SIZE, &kv_bytes, "BYTES",
       "KV cache pool size (CPU: 512M; CUDA: from --gpu-memory-utilization)", 0, 0, 0, 0, &kv_seen},
      {"gpu-memory-utilization", CM_OPT_DOUBLE, &mem_util, "F",
       "CUDA: share of device memory for weights, scratch and the KV cache, in (0, 1] (0.9)"},
      {"block-size", CM_OPT_INT, &block, "N", "tokens per KV block of the largest group (16)", 1,
       1024},
      {"max-num-batched-tokens", CM_OPT_INT, &max_batched, "N", "tokens per step (2048)", 1,
       1 << 20},
      {"max-num-seqs", CM_OPT_INT, &max_seqs, "N", "sequences per step (64)", 1, 65536},
      {"threads", CM_OPT_INT, &threads, "N",
       "CPU threads (default: one per core, divided among --world-size ranks)", 0, 1024},
      {"group-timeout", CM_OPT_INT, &join_ms, "MS",
       "how long the ranks of a tensor-parallel group wait for each other to form it (60000)", 100,
       3600000},
      {"heartbeat-interval", CM_OPT_DOUBLE, &beat_s, "S",
       "seconds between heartbeats to the scheduler, sent during long steps too (1)", 0, 0, 0.01,
       600, NULL},
      {"device", CM_OPT_STR, &device, "auto|cpu|cuda",
       "kernel backend ($LMSERVE_DEVICE, else auto: cuda when a GPU is visible, else cpu)"},
      {"dtype", CM_OPT_STR, &dtype, "auto|float32|bfloat16|q8", KN_DTYPE_HELP},
      {"kv-cache-dtype", CM_OPT_STR, &kv_dtype_s, "auto|bf16|fp8|f32", WK_KV_DTYPE_HELP},
      {"mmap", CM_OPT_BOOL, &use_mmap, NULL, WK_MMAP_HELP},
      {"enforce-eager", CM_OPT_BOOL, &eager, NULL, WK_EAGER_HELP},
      {"quantization", CM_OPT_STR, &quant_s, "none|fp8|q8_0|q4_0|q4_k", WK_QUANT_HELP},
      {"device-sampling", CM_OPT_BOOL, &dev_sampling, NULL,
       "sample with the backend's kn_sample: only token ids leave the device, rows in parallel "
       "(on)"},
      {"pipeline-steps", CM_OPT_BOOL, &pipeline, NULL,
       "launch a step that is already waiting before the previous one is answered, its "
       "forward taking the tokens that step sampled on the device ($LMSERVE_PIPELINE=0|1; on "
       "for device backends, off on the CPU, where it only delays each answer)"},
      {"mmproj", CM_OPT_STR, &mmproj, "FILE", MD_MMPROJ_HELP},
      {"lora-modules", CM_OPT_STRS, &lora_args, "NAME=PATH", MD_LORA_MODULES_HELP},
      {"max-lora-rank", CM_OPT_INT, &max_lora_rank, "N", MD_MAX_LORA_RANK_HELP, 1, 512},
      {"tokenizer", CM_OPT_STR, &tok_dir, "DIR",
       "the vocabulary of structured outputs from DIR's tokenizer.json, as the frontend's "
       "--tokenizer (default: the checkpoint's tokenizer.json, or a GGUF file's own)"},
      {"speculative-model", CM_OPT_STR, &spec_dir, "DIR|ngram", WK_SPEC_MODEL_HELP},
      {"num-speculative-tokens", CM_OPT_INT, &spec_k, "K",
       "drafts per step (with "
       "--speculative-model; 3)",
       1, PR_MAX_DRAFT, 0, 0, &spec_k_seen},
      {"ngram-prompt-lookup-max", CM_OPT_INT, &ngram_max, "N", WK_NGRAM_MAX_HELP, 1, 1024},
      {"ngram-prompt-lookup-min", CM_OPT_INT, &ngram_min, "N", WK_NGRAM_MIN_HELP, 1, 1024},
      {"speculative-config", CM_OPT_STR, &spec_cfg, "JSON", WK_SPEC_CONFIG_HELP},
      {0},
  };
  int rc = cm_args_parse("lmserve worker", "one worker rank: runs the scheduler's step plans", opts,
                         argc, argv, 1, NULL, 0, NULL);
  if (rc == CM_ARGS_HELP) return 0;
  if (rc) return 2;
  cm_log_init_from_env();
  if (!model_dir || !endpoint) {
    fprintf(stderr, "lmserve worker: --model DIR and --scheduler ENDPOINT are required\n");
    return 2;
  }
  char why[512];
  if (md_model_mmproj_arg(model_dir, mmproj, why, sizeof(why))) {
    fprintf(stderr, "lmserve worker: %s\n", why);
    return 2;
  }
  int n_lora = md_lora_modules(&lora_args, loras, why, sizeof(why));
  cm_strs_free(&lora_args);
  if (n_lora < 0) {
    fprintf(stderr, "lmserve worker: %s\n", why);
    return 2;
  }
  if (rank >= world) {
    fprintf(stderr, "lmserve worker: --rank %lld must be below --world-size %lld\n",
            (long long)rank, (long long)world);
    return 2;
  }
  if (!(mem_util > 0.0 && mem_util <= 1.0)) {
    fprintf(stderr, "lmserve worker: --gpu-memory-utilization must be in (0, 1] (got %g)\n",
            mem_util);
    return 2;
  }
  if (kv_seen && kv_bytes == 0) {
    fprintf(stderr, "lmserve worker: --kv-cache-memory must be more than 0 bytes\n");
    return 2;
  }
  if (spec_cfg) {
    bool flags = spec_dir || spec_k_seen || ngram_max || ngram_min;
    struct wk_spec_json sj;
    if (wk_spec_config_args("lmserve worker", spec_cfg, flags, PR_MAX_DRAFT, spec_buf,
                            sizeof(spec_buf), &sj))
      return 2;
    if (sj.disable_batch)
      cm_warn(TAG, "--speculative-config: disable_by_batch_size is the scheduler's "
                   "(--speculative-disable-by-batch-size); a worker has no use for it");
    spec_dir = sj.model;
    spec_k = sj.k;
    ngram_max = sj.ngram_max;
    ngram_min = sj.ngram_min;
    spec_k_seen = spec_k > 0;
  }
  if (spec_k_seen && !spec_dir) {
    fprintf(stderr, "lmserve worker: --num-speculative-tokens needs --speculative-model\n");
    return 2;
  }
  int ngram =
      wk_spec_ngram_args("lmserve worker", spec_dir, ngram_max, ngram_min, &ngram_max, &ngram_min);
  if (ngram < 0) return 2;
  int bf16 = 0, kv_dtype = 0, quant = 0;
  if (wk_dtype_args("lmserve worker", dtype, kv_dtype_s, quant_s, &bf16, &kv_dtype, &quant))
    return 2;
  if (threads == 0 && world > 1) { /* each rank owns its cores: cores / N */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    threads = cores / world > 0 ? cores / world : 1;
  }
  struct kn_backend_opts bo = {
      .n_threads = (int)threads,
      .local_rank = local_rank_of(local_rank, local_rank_seen, rank),
      .bf16 = bf16,
  };
  if (bo.local_rank < 0) {
    fprintf(stderr, "lmserve worker: LOCAL_RANK=%s is not a rank in [0, 1023]\n",
            getenv("LOCAL_RANK"));
    return 2;
  }
  if (spec_dir && !spec_k_seen) spec_k = 3;
  if (!spec_dir) spec_k = 0;

  int status = 1;
  char err[512] = "";
  struct kn_backend *be = NULL;
  struct wk_model *m = NULL, *draft = NULL;
  struct wk_role *role = NULL;
  struct wk_vision *vision = NULL;
  struct wk_vision_g4 *vision_g4 = NULL;
  struct wk_audio_g4 *audio_g4 = NULL;
  struct md_audio_fe_cfg *afe = NULL;
  void *zctx = NULL;
  struct wk_proc p = {.rank = (uint32_t)rank, .beat_ns = (uint64_t)(beat_s * 1e9)};
  pthread_t beat;
  int have_beat = 0;
  pthread_mutex_init(&p.mu, NULL);
  pthread_mutex_init(&p.quit_mu, NULL);
  pthread_cond_init(&p.quit_cv, NULL);

  struct sigaction sa = {0};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);

  if ((status = make_backend(device, &bo, &be))) goto done;
  status = 1;
  struct wk_model_opts mo = {
      .kv_dtype = kv_dtype,
      .max_batch_tokens = (int)(max_batched + max_seqs * spec_k),
      .max_seqs = (int)max_seqs,
      /* an explicit pool size wins; else a backend on host memory keeps its
       * fixed default and a device sizes the pool from what the weights leave */
      .kv_bytes = kv_seen                                  ? kv_bytes
                  : kn_backend_has(be, KN_CAP_HOST_MEMORY) ? 512ull << 20
                                                           : 0,
      .mem_util = mem_util,
      .block_tokens = (int)block,
      .quiet = 1,
      .tp_rank = (int)rank,
      .tp_size = (int)world,
      .mmap_weights = use_mmap,
      .step_graphs = eager ? WK_GRAPHS_OFF : WK_GRAPHS_CAPTURE,
      .graph_verify_tokens = spec_dir ? (int)(1 + spec_k) : 0, /* n-gram drafts too */
      .quantization = quant,
  };
  const char *lora_names[CM_STRS_MAX], *lora_paths[CM_STRS_MAX];
  for (int i = 0; i < n_lora; i++)
    lora_names[i] = loras[i].name, lora_paths[i] = loras[i].path;
  mo.lora_names = lora_names;
  mo.lora_paths = lora_paths;
  mo.n_loras = n_lora;
  if ((rc = wk_model_load(model_dir, be, &mo, &m, err, sizeof(err)))) {
    fprintf(stderr, "lmserve worker: %s\n", err);
    /* a model this build or this tensor-parallel size cannot run is a configuration error */
    if (rc == CM_ERR_INVAL || rc == CM_ERR_UNSUPPORTED) status = 2;
    goto done;
  }
  for (int i = 0; i < n_lora; i++)
    if (max_lora_rank && wk_model_lora_rank(m, i + 1) > max_lora_rank) {
      fprintf(stderr,
              "lmserve worker: --lora-modules: LoRA adapter %s has rank %d, above "
              "--max-lora-rank %lld\n",
              loras[i].name, wk_model_lora_rank(m, i + 1), (long long)max_lora_rank);
      status = 2;
      goto done;
    }
  p.lora_sum = md_lora_list_sum(loras, n_lora);
  p.max_lora_rank = (int)max_lora_rank;
  if (spec_dir && !ngram && (rc = wk_draft_load(spec_dir, m, &mo, &draft, err, sizeof(err)))) {
    fprintf(stderr, "lmserve worker: --speculative-model: %s\n", err);
    goto done;
  }
  if (wk_model_config(m)->vision.present &&
      (rc = wk_vision_load(model_dir, be, NULL, &vision, err, sizeof(err)))) {
    fprintf(stderr, "lmserve worker: the vision tower: %s\n", err);
    goto done;
  }
  if (wk_model_config(m)->vision_g4.present &&
      (rc = wk_vision_g4_load(model_dir, be, NULL, &vision_g4, err, sizeof(err)))) {
    fprintf(stderr, "lmserve worker: the vision tower: %s\n", err);
    goto done;
  }
  struct wk_encoder_audio audio = {0};
  if (wk_model_config(m)->audio_g4.present) { /* clips up to the extractor's longest */
    if (!(afe = malloc(sizeof(*afe))) ||
        (rc = md_audio_fe_load(model_dir, afe, err, sizeof(err)))) {
      fprintf(stderr, "lmserve worker: the audio feature extractor: %s\n",
              afe ? err : "out of memory");
      goto done;
    }
    audio.n_mel = afe->n_mel;
    audio.max_frames = (int)md_audio_fe_max_frames(afe);
    audio.max_tokens = md_audio_fe_max_tokens(afe);
    struct wk_audio_g4_opts ao = {.max_frames = audio.max_frames};
    if ((rc = wk_audio_g4_load(model_dir, be, &ao, &audio_g4, err, sizeof(err)))) {
      fprintf(stderr, "lmserve worker: the audio tower: %s\n", err);
      goto done;
    }
    audio.tower = audio_g4;
    p.audio_tokens = (uint32_t)audio.max_tokens;
    p.audio_bytes = (uint32_t)((size_t)audio.max_frames * ((size_t)audio.n_mel * 4 + 1));
  }
  if (dev_sampling == 1 && !kn_backend_has(be, KN_CAP_SAMPLE))
    cm_warn(TAG, "--device-sampling: the %s backend cannot sample: sampling on the host",
            kn_backend_name(be));
  /* structured outputs read the vocabulary's bytes from the frontend's tokenizer:
   * --tokenizer's folder, else the checkpoint's tokenizer.json, else a GGUF file's */
  char tok_path[4200], gguf_path[4096];
  snprintf(tok_path, sizeof(tok_path), "%s/tokenizer.json", tok_dir ? tok_dir : model_dir);
  int is_gguf =
      !tok_dir && md_model_gguf_path(model_dir, gguf_path, sizeof(gguf_path), err, sizeof(err)) > 0;
  struct wk_role_opts ro = {
      .max_seqs = (int)max_seqs,
      .max_draft = (int)spec_k,
      .ngram_min = (int)ngram_min,
      .ngram_max = (int)ngram_max,
      .rank = (uint32_t)rank,
      .device_sampling = dev_sampling != 0 && kn_backend_has(be, KN_CAP_SAMPLE),
      .vision = vision,
      .vision_g4 = vision_g4,
      .audio = audio,
      .tokenizer = !is_gguf && access(tok_path, R_OK) == 0 ? tok_path : NULL,
      .tokenizer_gguf = is_gguf ? gguf_path : NULL,
  };
  if ((rc = wk_role_create(m, draft, &ro, &role))) {
    fprintf(stderr, "lmserve worker: cannot create the step executor: %s\n", cm_strerror(rc));
    goto done;
  }
  if (!(zctx = zmq_ctx_new())) goto done;
  char rid[64];
  int rid_len = snprintf(rid, sizeof(rid), "worker-%lld-%ld", (long long)rank, (long)getpid());
  if ((rc = pr_sock_open(zctx, ZMQ_DEALER, 0, &p.sock)) ||
      (rc = pr_sock_set_rid(p.sock, rid, (size_t)rid_len)) ||
      (rc = pr_monitor_open(zctx, p.sock, ZMQ_EVENT_DISCONNECTED, &p.mon)) ||
      (rc = pr_sock_connect(p.sock, endpoint))) {
    fprintf(stderr, "lmserve worker: cannot connect to %s: %s\n", endpoint, cm_strerror(rc));
    goto done;
  }
  if (world > 1 && (rc = join_group(&p, be, (uint32_t)world, (int)join_ms, err, sizeof(err)))) {
    fprintf(stderr, "lmserve worker: rank %lld: %s\n", (long long)rank, err);
    goto done;
  }
  p.model = m;
  p.be = be;
  p.world = (uint32_t)world;
  p.max_draft = (uint32_t)spec_k;
  p.max_seqs = (uint32_t)max_seqs;
  p.max_tokens = (uint32_t)max_batched;
  p.role = role;
  if ((rc = send_ready(&p))) {
    fprintf(stderr, "lmserve worker: cannot send READY: %s\n", cm_strerror(rc));
    goto done;
  }
  __atomic_store_n(&p.announced, 1, __ATOMIC_RELEASE);
  cm_info(TAG, "rank %lld ready: %s kernels, --dtype %s, %d KV pages, %d groups, connected to %s",
          (long long)rank, kn_backend_name(be), dtype, wk_model_n_pages(m),
          wk_model_kv_spec(m)->n_groups, endpoint);
  if (rank == 0 && kn_backend_has(be, KN_CAP_HOST_MEMORY) && strcmp(dtype, "q8") != 0 &&
      wk_model_block_bytes(m) > 0)
    cm_info(TAG,
            "%.1f MB of block-format weights run with f32 inputs: exact to the dequantized "
            "model; --dtype q8 rounds their inputs to 8-bit blocks as llama.cpp does, and "
            "decodes faster",
            (double)wk_model_block_bytes(m) / 1e6);
  /* the beat thread must not take the signals: the main thread's polls see EINTR */
  sigset_t block_set, old_set;
  sigemptyset(&block_set);
  sigaddset(&block_set, SIGTERM);
  sigaddset(&block_set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &block_set, &old_set);
  have_beat = pthread_create(&beat, NULL, beat_main, &p) == 0;
  pthread_sigmask(SIG_SETMASK, &old_set, NULL);
  if (!have_beat) {
    fprintf(stderr, "lmserve worker: cannot start the heartbeat thread\n");
    goto done;
  }
  int host = kn_backend_has(be, KN_CAP_HOST_MEMORY);
  if (pipeline < 0) { /* the flag, else $LMSERVE_PIPELINE, else by the backend */
    const char *e = getenv("LMSERVE_PIPELINE");
    pipeline = e && *e ? strcmp(e, "0") != 0 : !host;
  }
  /* on a host backend only for tests and A/B runs: said, and counted at the end */
  if (pipeline && host)
    cm_warn(TAG, "rank %lld: pipelined steps on the %s backend", (long long)rank,
            kn_backend_name(be));
  status = serve(&p, role, (uint32_t)world, pipeline);
  if (pipeline)
    cm_log(host ? CM_LOG_WARN : CM_LOG_INFO, TAG, "rank %lld: %llu steps pipelined",
           (long long)rank, (unsigned long long)wk_role_pipelined(role));
done:
  if (have_beat) {
    pthread_mutex_lock(&p.quit_mu);
    __atomic_store_n(&p.quit, 1, __ATOMIC_RELEASE);
    pthread_cond_signal(&p.quit_cv);
    pthread_mutex_unlock(&p.quit_mu);
    pthread_join(beat, NULL);
  }
  pr_monitor_close(p.sock, p.mon);
  pr_sock_close(p.sock);
  if (zctx) zmq_ctx_term(zctx);
  wk_role_destroy(role);
  wk_vision_free(vision);
  wk_vision_g4_free(vision_g4);
  wk_audio_g4_free(audio_g4);
  free(afe);
  wk_model_free(draft);
  wk_model_free(m);
  kn_backend_destroy(be);
  pthread_cond_destroy(&p.quit_cv);
  pthread_mutex_destroy(&p.quit_mu);
  pthread_mutex_destroy(&p.mu);
  return status;
}
