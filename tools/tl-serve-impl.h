/* tl-serve-impl.h — `lmserve serve`'s state, shared by tl-serve.c (flags, the
 * default model, command lines, start-up and shutdown) and tl-serve-sup.c
 * (the children and their supervision: reaping, DOWN, PING/PONG, restarts
 * with back-off). Not for use outside those two files. */
#ifndef LMSERVE_TL_SERVE_IMPL_H
#define LMSERVE_TL_SERVE_IMPL_H
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/cm-arena.h"
#include "common/cm-args.h"
#include "frontend/fe-main.h"
#include "proto/pr-zmq.h"

#define TL_MAX_DP 8 /* model replicas (--data-parallel-size) */
#define TL_MAX_TP 8 /* worker ranks per replica (--tensor-parallel-size) */
/* every rank of every replica, a scheduler each, and the frontend */
#define TL_MAX_CHILDREN (TL_MAX_DP * (TL_MAX_TP + 1) + 1)
#define TL_MAX_ARGS     64

struct tl_child {
  const char *role; /* "worker", "scheduler", "frontend" */
  int engine;       /* the replica of a worker or scheduler, else -1 */
  int rank;         /* worker rank, else -1 */
  pid_t pid;        /* 0 once reaped */
  int status;       /* wait status once reaped */
};

/* Where the engine (scheduler + worker group) is in its life. */
enum tl_phase {
  TL_STARTING, /* processes started, not all ranks ready yet */
  TL_UP,       /* serving */
  TL_BACKOFF,  /* failed: waiting for the old processes to go and the back-off to pass */
};

/* One model replica (an engine): a scheduler and its tensor-parallel worker
 * group, with its own endpoints, control socket and restart state. */
struct tl_engine {
  int index;
  char ep_front[PATH_MAX + 32], ep_work[PATH_MAX + 32];
  struct pr_sock *ctl; /* DEALER to the scheduler's frontend endpoint: PING, DOWN */
  uint64_t ping_nonce; /* last PING sent */
  uint64_t min_nonce;  /* PONGs to older PINGs say nothing of the current phase */
  double last_ping_t;  /* cm_time_s */
  double last_pong_t;  /* cm_time_s of the current scheduler's last PONG (or its start) */
  enum tl_phase phase;
  double phase_t;     /* cm_time_s when the phase began */
  double restart_at;  /* TL_BACKOFF: when to start again */
  double backoff_s;   /* the next back-off */
  int restart_sched;  /* TL_BACKOFF: the scheduler restarts too */
  int start_failures; /* engine deaths in a row before it was ready */
  char last_failure[256];
};

struct tl_serve {
  /* flags */
  const char *model, *host, *api_key, *spec_model, *device, *dtype;
  const char *api_key_file; /* the frontend's --api-key-file */
  /* --served-model-name: the name, then its aliases (their values live as long as the
   * process) */
  const struct cm_strs *served_names;
  const struct cm_strs
      *lora_modules; /* --lora-modules NAME=PATH, to the workers and the frontend */
  int enable_lora;   /* vLLM's --enable-lora: taken, changes nothing */
  int runtime_lora;  /* the frontend's --allow-runtime-lora-updating */
  int64_t max_lora_rank; /* --max-lora-rank, to the workers (0: any) */
  const char *media_dir, *limit_mm, *max_image_bytes, *max_image_pixels; /* the frontend's */
  const char *mm_kwargs;       /* the frontend's --mm-processor-kwargs */
  const char *responses_store; /* the frontend's --responses-store-size */
  const char *template_kwargs; /* the frontend's --default-chat-template-kwargs */
  const char *gen_config;      /* the frontend's --generation-config (NULL: auto) */
  const char *gen_override;    /* the frontend's --override-generation-config */
  const char *chat_template;   /* the frontend's --chat-template */
  const char *cors_origins, *cors_methods, *cors_headers; /* the frontend's CORS lists */
  int cors_credentials;
  int prompt_details;                      /* the frontend's --enable-prompt-tokens-details */
  int trust_template;                      /* the frontend's --trust-request-chat-template */
  int no_access_log;                       /* the frontend's --disable-access-log */
  int id_headers;                          /* the frontend's --enable-request-id-headers */
  struct fe_main_log log;                  /* the frontend's log flags (FE_MAIN_LOG_OPTS) */
  struct fe_main_policy policy;            /* and its policy flags (FE_MAIN_POLICY_OPTS) */
  const char *ssl_key, *ssl_cert, *ssl_ca; /* the frontend's HTTPS (--ssl-*) */
  char ssl_abs[3][PATH_MAX];               /* their absolute paths, which those point to */
  int64_t dp; /* model replicas, each a scheduler and its worker group */
  int64_t port, max_num_seqs, max_batched, max_model_len, block_size, tp, spec_k, threads;
  int64_t ngram_max, ngram_min; /* --ngram-prompt-lookup-max / -min, 0 = not given */
  int64_t spec_disable;         /* --speculative-disable-by-batch-size, 0 = not given */
  int64_t ready_timeout_s, drain_timeout_s;
  double beat_s;              /* worker heartbeat period, seconds */
  int64_t beat_limit;         /* heartbeats missed before a role counts as hung */
  int64_t max_start_failures; /* engine deaths in a row before readiness that end serve */
  uint64_t kv_bytes;
  double gpu_mem_util; /* CUDA workers: share of device memory (KV pool sized from the rest) */
  int kv_seen;         /* --kv-cache-memory given: it wins over gpu_mem_util */
  int prefix_caching;
  int async_scheduling; /* --async-scheduling (on) */
  const char *kv_cache_dtype; /* --kv-cache-dtype, checked before any role starts */
  int mmap_weights; /* --mmap: CPU workers keep the weights in the page cache */
  int enforce_eager; /* --enforce-eager: workers capture no step graphs */
  const char *quantization; /* --quantization, checked before any role starts */
  const char *tokenizer;    /* --tokenizer as given */
  char tok_dir[4096];       /* its real path ("" without the flag) */
  const char *mmproj;       /* --mmproj as given */
  char mmproj_path[4096];   /* its real path ("" without the flag) */
  /* state */
  char run_dir[PATH_MAX]; /* 0700 folder holding the ipc:// endpoints */
  char model_dir[PATH_MAX + 64];
  struct tl_child children[TL_MAX_CHILDREN];
  int n_children;
  /* supervision (see the top of tl-serve.c) */
  void *zctx;
  struct cm_arena ctl_arena;
  struct tl_engine eng[TL_MAX_DP]; /* (dp) the replicas */
};

struct tl_argv {
  char *v[TL_MAX_ARGS + 1];
  char nums[TL_MAX_ARGS][24]; /* storage for numeric values */
  int n, n_nums;
};

/* The stop signal caught (0: none). */
extern volatile sig_atomic_t tl_serve_stop_signal;

/* tl-serve.c */
const char *tl_srv_self_exe(void);
int tl_srv_start_workers(struct tl_serve *s, struct tl_engine *e);
int tl_srv_start_scheduler(struct tl_serve *s, struct tl_engine *e);

/* tl-serve-sup.c: children */
/* Starts `lmserve ARGS` as role (of replica engine, rank) in that role's slot
 * (reused by a restart). */
int tl_srv_spawn(struct tl_serve *s, const char *role, int engine, int rank, struct tl_argv *a);
/* How a reaped child ended: "exited with status 1", "killed by signal 9 (Killed)". */
const char *tl_srv_exit_text(const struct tl_child *c, char *buf, size_t len);
/* "worker rank 1 (pid 123)", "scheduler (pid 124)". */
const char *tl_srv_child_name(const struct tl_child *c, char *buf, size_t len);
/* Reaps one exited child: the newly dead one, or NULL. */
struct tl_child *tl_srv_reap(struct tl_serve *s);
/* Frontend first (it drains), then the scheduler, then the workers. */
void tl_srv_stop_all(struct tl_serve *s);

/* tl-serve-sup.c: supervision */
/* A fresh control socket to replica e's scheduler. */
int tl_srv_ctl_open(struct tl_serve *s, struct tl_engine *e);
/* Serves until a stop signal or a failure that ends serve; the exit code. */
int tl_srv_supervise(struct tl_serve *s);

#endif
