/* sch-server.h — the `lmserve scheduler` process's server: a ROUTER socket for
 * frontends and one for workers, the request table that maps (frontend, request id)
 * to engine ids, and the loop that drives the engine (sch-engine.h) one step at a
 * time: STEP to every rank, RESULT from rank 0, OUT to the owning frontends.
 *
 *   struct sch_server_config cfg;
 *   sch_server_config_default(&cfg);
 *   cfg.frontend_endpoint = "ipc:///run/.../front.sock"; ...
 *   sch_server_create(&cfg, &srv);
 *   sch_server_run(srv, &stop_flag);   // returns when *stop_flag becomes nonzero
 *   sch_server_destroy(srv);           // sends CTRL shutdown to the workers
 *
 * Service starts when all world_size ranks sent an agreeing READY. A rank fails on its
 * FAIL, on silence longer than worker_timeout_ms (missed heartbeats: a hung process),
 * when its connection closes (a socket monitor on the worker socket: the process died,
 * on this host or another), or on a supervisor's DOWN naming its process. A failure
 * fails every live request with ERR — CM_ERR_AGAIN for those that had produced no
 * token yet, which a frontend may submit again — and stops service (PONG's
 * workers_ready < world_size) until the rank is READY again.
 * Wire facts the workers rely on: STEP's seq_id is the scheduler's engine id (unique
 * over the process's life, never reused); free_ids are to be dropped before the step's
 * sequences run; PR_SEQ_FINISHED is never set (a finished sequence shows up in a later
 * STEP's free_ids); draft_tokens are the drafts the previous RESULT proposed. */
#ifndef LMSERVE_SCH_SERVER_H
#define LMSERVE_SCH_SERVER_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

struct sch_server_config {
  const char *frontend_endpoint; /* endpoint to bind for frontends (ROUTER) */
  const char *worker_endpoint;   /* endpoint to bind for workers (ROUTER) */
  const char *model_dir;         /* for logging only; may be NULL */
  int32_t world_size;            /* ranks expected, >= 1 */
  int32_t max_num_seqs;          /* running requests at most */
  int32_t max_num_batched_tokens;
  int32_t max_model_len;   /* tokens; 0 = the workers' value, else min(this, theirs) */
  int32_t num_spec_tokens; /* draft slots per decode; capped by the workers' max_draft */
  int32_t spec_disable_batch; /* no drafts while this many requests or more run (0: never) */
  int32_t max_waiting;     /* queued requests at most */
  bool enable_prefix_caching;
  bool async_scheduling;      /* plan step N+1 while step N runs */
  uint32_t worker_timeout_ms; /* silence after which a rank counts as failed */
};

void sch_server_config_default(struct sch_server_config *cfg);

struct sch_server;

/* Binds both sockets. Returns 0 or a negative cm_err (with a log line). */
int sch_server_create(const struct sch_server_config *cfg, struct sch_server **out);
/* Serves until *stop becomes nonzero (a signal handler sets it). Returns 0, or a
 * negative cm_err when the sockets themselves fail. */
int sch_server_run(struct sch_server *s, volatile sig_atomic_t *stop);
/* Tells the workers to shut down (CTRL), fails live requests, frees everything. */
void sch_server_destroy(struct sch_server *s);

#endif
