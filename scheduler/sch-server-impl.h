/* sch-server-impl.h — the scheduler server's state, shared by its files:
 * sch-server.c (sockets, loop, frontend messages), sch-server-work.c (workers:
 * READY, heartbeats, failures, STEP and RESULT) and sch-server-reqs.c (the table
 * of live requests). Not for use outside scheduler/sch-server*.c. */
#ifndef LMSERVE_SCH_SERVER_IMPL_H
#define LMSERVE_SCH_SERVER_IMPL_H

#include "common/cm-arena.h"
#include "proto/pr-msg.h"
#include "proto/pr-zmq.h"
#include "scheduler/sch-engine.h"
#include "scheduler/sch-server.h"

#define SCH_SRV_TAG        "sch"
#define SCH_SRV_MAX_FRONTS 256       /* frontends known at once */
#define SCH_SRV_MAX_RANKS  1024      /* world size at most */
#define SCH_SRV_SLOT_BITS  24        /* low bits of an engine id: the request slot */
#define SCH_SRV_MAX_SLOTS  (1 << 20) /* live requests at most */
/* `before` tokens a STEP carries for n-gram lookups alone (about 20 MB of msgpack,
 * within PR_MAX_MSG_DEFAULT with the rest of a large step) */
#define SCH_SPEC_BEFORE_MAX (4u << 20)

/* A frontend (ROUTER peer on the frontend socket). */
struct sch_front {
  struct pr_rid rid;
  bool used;
  int32_t num_live; /* requests it owns */
};

/* One live request. */
/* The ERR of a structured output while a rank cannot follow one (its rank). */
#define SCH_SRV_GRAMMARS_FAILED                                                                    \
  "structured outputs are unavailable: worker rank %d could not build the structured-output "      \
  "state (its log says why)"

struct sch_req {
  uint64_t eid;        /* engine id: (serial << SCH_SRV_SLOT_BITS) | slot; 0 = free slot */
  uint64_t request_id; /* the frontend's id */
  int32_t front;       /* index into fronts[] */
  int32_t next;        /* next slot in the same key bucket, -1 = end */
  int32_t logprobs;    /* from the sampling params: -1 = none */
  uint32_t num_prompt; /* tokens */
  uint64_t queued_ns, scheduled_ns, first_token_ns; /* wall clock, 0 = not yet */
  int32_t result;         /* index of its result in the RESULT being applied, -1 = none */
  bool constrained;       /* a structured output */
  uint32_t num_drafts;    /* drafts proposed by the last RESULT */
  uint32_t drafts[PR_MAX_DRAFT];
  /* its prompt's logprobs (pr_sampling.prompt_logprobs): -1 = not asked, else the top
   * entries per token. The workers' scored rows fill prompt tokens 1 .. plp_have
   * (plp [num_prompt - 1], plp_ids and plp_top [num_prompt - 1, prompt_lp]; malloc'd),
   * which go out with its first tokens (plp_sent) */
  int32_t prompt_lp;
  uint32_t plp_have;
  bool plp_sent;
  float *plp;
  uint32_t *plp_rank; /* [num_prompt - 1] */
  uint32_t *plp_ids;
  float *plp_top;
  int32_t lora_slot; /* the run-time LoRA slot it holds (sch-server-lora.c); 0: none */
};

/* A run-time LoRA adapter's slot (sch-server-lora.c). */
#define SCH_LORA_WAITERS 8
struct sch_lora_slot {
  uint64_t uid;          /* the adapter's id (the frontend's); 0: a free slot */
  char *path;            /* malloc'd */
  int32_t refs;          /* requests that run with it */
  bool ready;            /* every rank holds it */
  bool unload;           /* freed once nothing holds it */
  int32_t expect, acked; /* ranks sent LORA_LOAD, and those that answered */
  uint64_t gen;          /* the load's number (its LORA_ACKs echo it); 0: none sent */
  uint64_t load_ns;      /* monotonic: when LORA_LOAD was sent */
  int code;              /* the first refusal (a rank's LORA_ACK) */
  char msg[384];
  uint64_t used; /* lora_tick when last named */
  int32_t n_wait;
  struct {
    int32_t front;
    uint64_t nonce;
  } wait[SCH_LORA_WAITERS]; /* the frontends' LORA loads waiting for LORA_DONE */
};

/* The request table: slots addressed by engine id, and buckets by (front, request_id). */
struct sch_reqs {
  struct sch_req *slots; /* [cap] */
  int32_t cap, num_live;
  int32_t *free_list; /* [cap] free slot indices, a stack */
  int32_t num_free;
  int32_t *buckets; /* [nbuckets] first slot per key hash, -1 = empty */
  int32_t nbuckets; /* power of two */
  uint64_t serial;  /* grows per request; keeps engine ids unique */
};

int sch_reqs_init(struct sch_reqs *t, int32_t cap);
void sch_reqs_free(struct sch_reqs *t);
/* A new slot for (front, request_id), or NULL when the table is full. */
struct sch_req *sch_reqs_add(struct sch_reqs *t, int32_t front, uint64_t request_id);
struct sch_req *sch_reqs_find(struct sch_reqs *t, int32_t front, uint64_t request_id);
struct sch_req *sch_reqs_by_eid(struct sch_reqs *t, uint64_t eid);
void sch_reqs_remove(struct sch_reqs *t, struct sch_req *r);

/* A worker rank. */
struct sch_rank {
  struct pr_rid rid;
  bool known;            /* rid is valid */
  bool ready;            /* sent an agreeing READY and has not failed since */
  uint64_t last_seen_ns; /* monotonic, last message from it */
  uint64_t kv_blocks, last_step_id;
  uint32_t max_model_len;                        /* tokens, from its READY */
  uint32_t max_num_seqs, max_num_batched_tokens; /* largest step it takes; 0 = not said */
  int32_t fd;   /* its connection's fd at our end (the monitor's DISCONNECTED names it); -1 */
  uint32_t pid; /* its process id from READY (matched by DOWN); 0 = not said */
  /* from READY, for PONG (metrics): its kernel set and matmul input precision; "" = not said */
  char kernels[48], matmul_inputs[16];
  uint32_t beat_flags; /* its latest BEAT's (0 from READY on) */
  bool grammars_asked; /* sent PR_CTRL_GRAMMARS since its READY */
};

/* What the ranks agreed on (from READY). */
struct sch_model_info {
  int32_t num_groups;
  struct sch_kv_group_cfg groups[SCH_MAX_GROUPS];
  uint32_t vocab_size, max_model_len, max_draft;
  int32_t num_eos;
  int32_t eos[SCH_MAX_EOS_IDS];
  int64_t num_blocks; /* min over the ranks' kv_blocks (set when service starts) */
  uint64_t shard_sum; /* the model and shard shapes every rank of the group must have */
  uint32_t image_tokens, image_bytes; /* per image (the most, with image_varsize); 0 = no images */
  uint32_t image_varsize;             /* 1: images vary in size and carry it (Gemma 4) */
  uint32_t audio_tokens, audio_bytes; /* the most per audio clip; 0 = no audio */
  uint32_t n_lora;                    /* LoRA adapters the workers hold */
  uint64_t lora_sum;                  /* their list's sum (names and order) */
};

/* The tensor-parallel group's comm id (DIST): offered by rank 0, relayed to every
 * rank that asked. */
struct sch_dist {
  uint32_t id[PR_MAX_COMM_ID];
  uint32_t n;             /* words of id; 0: rank 0 has not offered one yet */
  struct pr_rid *waiting; /* [world_size]: who asked, by rank */
  bool *asked;            /* [world_size] */
};

struct sch_server {
  struct sch_server_config cfg;
  struct sch_dist dist;
  void *zctx;
  struct pr_sock *front_sock, *work_sock;
  void *work_mon; /* PAIR: DISCONNECTED events of the worker socket's connections */
  struct cm_arena front_arena, work_arena;

  struct sch_front fronts[SCH_SRV_MAX_FRONTS];
  struct sch_reqs reqs;

  struct sch_rank *ranks; /* [world_size]; dist's arrays share its allocation */
  int32_t num_ready;
  bool have_info;                    /* info holds the first READY's facts */
  struct sch_model_info info;        /* the agreed facts */
  struct sch_engine *engine;         /* NULL until all ranks are ready the first time */
  struct sch_model_info engine_info; /* what the engine was built from */
  bool speculative;                  /* the engine plans drafts: a NEW sequence's earlier
                                        tokens go with it (the workers may draft from them),
                                        up to SCH_SPEC_BEFORE_MAX a step */
  bool serving;                      /* all ranks ready and the engine built */
  bool engine_grammars;              /* what the engine was told (sch_engine_set_grammars) */
  bool want_grammars; /* a constrained request came: every rank builds the structured-output
                         state (sch_srv_grammars) */
  uint64_t hash_key;
  uint64_t rng; /* splitmix64 state for seeds */

  /* the steps in flight: sent, not yet answered (RESULTs come in step order) */
  bool plan_idle;        /* the last plan was empty: plan again only after a change */
  int32_t max_in_flight; /* 1, or 2 with async scheduling (the engine's config) */
  int32_t num_in_flight;
  uint64_t flight_id[2];      /* their step ids, oldest first */
  uint64_t flight_sent_ns[2]; /* when each was sent, monotonic */

  /* ids to hand to the workers as free_ids with the next STEP */
  uint64_t *pending_free;
  uint32_t num_pending_free, cap_pending_free;

  /* reusable buffers for STEP and OUT (no allocation per step once grown) */
  struct pr_buf step_buf;         /* STEP body, encoded once for every rank */
  struct pr_step_seq *step_seqs;  /* [cap_seqs]; step_tables and results share its allocation */
  struct pr_i32s *step_tables;    /* [cap_seqs * SCH_MAX_GROUPS] */
  struct pr_image *step_images;   /* [cap_step_images] the step's images, grown as needed */
  size_t cap_step_images;
  struct sch_seq_result *results; /* [cap_seqs] */
  struct pr_out_seq *outs;        /* [cap_outs] */
  int32_t *out_order;             /* [cap_outs] */
  int32_t cap_seqs, cap_outs;

  /* run-time LoRA adapters: slots info.n_lora + 1 .. PR_MAX_LORAS (sch-server-lora.c) */
  struct sch_lora_slot loras[PR_MAX_LORAS + 1];
  uint64_t lora_tick, lora_gen;

  /* cumulative */
  uint64_t prompt_tokens, generation_tokens;
  uint64_t num_steps;
  uint64_t num_steps_ahead; /* steps sent while another was in flight (async scheduling) */
  uint64_t step_ns_plan;   /* ns in plan + STEP encode + send */
  uint64_t step_ns_apply;  /* ns in RESULT decode + apply + OUT encode + send */
  uint64_t step_ns_engine; /* ns of those inside sch_engine_plan_step / _apply */
  uint64_t step_ns_round;  /* ns from STEP sent to RESULT received */
};

/* sch-server.c */
uint64_t sch_srv_random(struct sch_server *s);
/* A request's sampling parameters as the engine keeps them, one blob: the struct
 * (its pointers NULL), the grammar's text padded to 4 bytes, the biased ids, their
 * biases, the bad words' ids and their lengths. _to_blob writes sp's into blob (of
 * SCH_SRV_SAMPLING_BLOB_MAX bytes, 8-aligned) and returns its length; _from_blob sets
 * *sp from one, its pointers into the blob. */
#define SCH_SRV_SAMPLING_BLOB_MAX                                                                  \
  (sizeof(struct pr_sampling) + PR_MAX_GRAMMAR_BYTES + 8 * PR_MAX_LOGIT_BIAS +                     \
   8 * PR_MAX_BAD_WORD_IDS)
size_t sch_srv_sampling_to_blob(const struct pr_sampling *sp, uint8_t *blob);
void sch_srv_sampling_from_blob(const uint8_t *blob, size_t len, struct pr_sampling *sp);
void sch_srv_send_err(struct sch_server *s, int32_t front, uint64_t request_id, int code,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Sends one OUT holding outs[0..n) to the frontend; on failure aborts its requests. */
void sch_srv_send_out(struct sch_server *s, int32_t front, struct pr_out_seq *outs, uint32_t n);
/* Drops a request from the engine (when it is there) and the table. */
void sch_srv_drop(struct sch_server *s, struct sch_req *r, bool in_engine);

/* sch-server-work.c */
int sch_srv_work_init(struct sch_server *s);
void sch_srv_work_free(struct sch_server *s);
void sch_srv_work_recv(struct sch_server *s);     /* drains the worker socket */
void sch_srv_work_monitor(struct sch_server *s);  /* drains the worker socket's monitor */
/* A supervisor's DOWN: the process of a rank has ended. */
void sch_srv_work_down(struct sch_server *s, const struct pr_down *m);
void sch_srv_work_check(struct sch_server *s);    /* heartbeat timeouts */
void sch_srv_work_step(struct sch_server *s);     /* plans and sends a step when idle */
void sch_srv_work_shutdown(struct sch_server *s); /* CTRL shutdown to every known rank */
/* Once a constrained request has come (want_grammars), asks every ready rank that has
 * not the structured-output state to build it, and tells the engine whether all have
 * it (constrained requests wait until then). While a rank says building it failed,
 * constrained requests get an ERR (sch_srv_grammars_failed) and the rest is served. */
void sch_srv_grammars(struct sch_server *s);
/* The ready rank whose BEAT says it could not build the structured-output state, or
 * -1. */
int32_t sch_srv_grammars_failed(const struct sch_server *s);
bool sch_srv_has_work(struct sch_server *s);

/* sch-server-lora.c */
/* The slot of run-time adapter uid at path, loading it when no slot holds it, with one
 * more request holding it: its number, or a negative cm_err (CM_ERR_FULL: every slot
 * has requests; CM_ERR_AGAIN: the workers are not ready) with the reason in err. */
int32_t sch_srv_lora_acquire(struct sch_server *s, uint64_t uid, const char *path, char *err,
                             size_t errlen);
/* The slot sch_srv_lora_acquire would give adapter uid now, changing nothing (or a
 * negative cm_err, as it). */
int32_t sch_srv_lora_pick(struct sch_server *s, uint64_t uid, const char *path, char *err,
                          size_t errlen);
/* A request that held slot `slot` is gone. */
void sch_srv_lora_release(struct sch_server *s, int32_t slot);
/* A frontend's LORA (load or unload); answered with LORA_DONE. */
void sch_srv_on_lora(struct sch_server *s, int32_t front, const struct pr_lora *m);
/* A rank's LORA_ACK. */
void sch_srv_on_lora_ack(struct sch_server *s, int32_t rank, const struct pr_lora *m);
/* Every slot emptied (a rank failed, or the scheduler stops): the loads waiting are
 * answered with why. */
void sch_srv_lora_reset(struct sch_server *s, const char *why);
/* Fails the slots whose load has taken longer than SCH_LORA_LOAD_TIMEOUT_S. */
void sch_srv_lora_check(struct sch_server *s);
/* The prefix cache's salt of a request with run-time adapter uid: its blocks apart
 * from the base model's and from every other adapter's, whatever slot it takes. */
uint64_t sch_srv_lora_salt(uint64_t salt, uint64_t uid);

#endif
