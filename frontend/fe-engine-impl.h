/* fe-engine-impl.h — the serving path's structs, shared by fe-engine.c
 * (socket, PING/PONG, dispatch), fe-engine-req.c (submit: tokenize, ADD)
 * and fe-engine-out.c (OUT/ERR: text, stop strings, answers). Not for use
 * outside fe-engine*.c. */
#ifndef LMSERVE_FE_ENGINE_IMPL_H
#define LMSERVE_FE_ENGINE_IMPL_H
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/cm-arena.h"
#include "frontend/fe-api-resp.h"
#include "frontend/fe-api.h"
#include "frontend/fe-engine.h"
#include "frontend/fe-http-buf.h"
#include "frontend/fe-http-metrics.h"
#include "frontend/fe-sse.h"
#include "proto/pr-msg.h"
#include "proto/pr-zmq.h"
#include "tokenizer/tk-chat.h"
#include "tokenizer/tk-detok.h"
#include "tokenizer/tk-stop.h"
#include "tokenizer/tk-tokenizer.h"

#define FE_ENG_MAX_EOS      8    /* eos ids from generation_config.json */
#define FE_ENG_MAX_REPLICAS 16   /* schedulers one frontend routes over */
#define FE_ENG_AFFINITY     4096 /* prompt prefixes remembered for routing */
/* times a request that lost its engine before any output is sent again */
#define FE_ENG_MAX_RETRIES 3

/* One logprob entry of a generated token. */
struct fe_eng_lp {
  int32_t id;     /* sampled token (an echoed prompt's token) */
  float logprob;  /* nats; NaN: none (the prompt's first token) */
  uint32_t top_i; /* index of its first top entry in choice.tops */
  uint32_t n_top; /* top entries */
};

/* One of the most likely tokens at a generated token's place. */
struct fe_eng_top {
  int32_t id;
  float logprob; /* nats */
};

/* One choice = one scheduler request id. */
struct fe_eng_choice {
  struct fe_eng_req *req;
  uint64_t id;  /* scheduler request id */
  int index;    /* choice index in the response */
  int prompt_i; /* which prompt of the request */
  int live;     /* the scheduler still runs it (no final OUT, no ABORT sent) */
  int done;     /* finished: finish_reason is set */
  const char *finish_reason;
  const char *stop_str; /* the request's stop string that ended it, or NULL */
  struct tk_detok *detok;
  struct tk_stop *stop;
  struct fe_buf text;    /* non-streamed: all released text; streamed: this OUT's delta */
  struct fe_buf logged;  /* --enable-log-outputs: the released text (up to the log's cut) */
  size_t logged_bytes;   /* of it released in all */
  struct fe_g4_split *g4;  /* the request reads Gemma 4's notation (api->g4): the text goes
                            * through it into g4_out; NULL: plain text */
  struct fe_g4_out g4_out; /* content (then moved to text), reasoning and calls; streamed:
                            * this OUT's */
  size_t n_calls;          /* calls begun so far in a stream (the next index) */
  size_t tool_args_sent;   /* a streamed tool-call answer: bytes of its last call's arguments
                            * sent */
  size_t text_sent;      /* bytes of text sent before (completions text_offset) */
  int streamed;          /* a chunk of it went out (before: text holds its echo) */
  int64_t n_gen;         /* tokens generated */
  double cum_lp;         /* best_of above n: the sum of their logprobs (the raw model's) */
  int64_t n_thought;     /* of them, Gemma 4's thinking channel's (its markers too) */
  int in_thought;        /* the last token was in that channel, or opened it */
  int64_t n_cached;      /* its prompt's tokens the prefix cache served (first output's) */
  uint64_t last_ns;      /* monotonic time of the last OUT with tokens */
  struct fe_eng_lp *lps; /* (n_lps) logprobs of the tokens (non-streamed: all; streamed:
                          * this OUT's) */
  size_t n_lps, cap_lps;
  struct fe_eng_top *tops; /* (n_top_all) top entries behind lps */
  size_t n_top_all, cap_top;
  int32_t *ids; /* return_token_ids: (n_ids) the tokens generated (streamed: this OUT's) */
  size_t n_ids, cap_ids;
  int32_t *prompt_ids; /* return_token_ids or prompt logprobs: (n_prompt_ids) its prompt's,
                          malloc'd */
  size_t n_prompt_ids;
  /* its prompt's logprobs (api->prompt_logprobs >= 0), from its first output: tokens
   * 1 .. n_prompt_ids - 1 (plp, plp_rank [n_plp]; plp_top [n_plp, plp_k]; malloc'd) */
  float *plp;
  uint32_t *plp_rank;
  struct fe_eng_top *plp_top;
  size_t n_plp;
  uint32_t plp_k;
  int have_plp;
  /* the ADD this choice was sent with, kept until its first output so that it can be
   * sent again when the engine loses it; its slices point into add_ids */
  struct pr_add add;
  uint32_t *add_ids; /* malloc'd: prompt ids, then stop ids; NULL: nothing kept */
};

struct fe_eng_req {
  struct fe_engine *e;
  struct fe_replica *rep; /* where its choices run (NULL while parked before routing) */
  struct fe_conn *conn;
  struct fe_api_request *api;
  struct fe_eng_choice *ch; /* (n_ch) = n_prompts * n */
  int n_ch;
  int n_done;
  int64_t *n_prompt;    /* (api->n_prompts) prompt tokens of each prompt */
  int64_t prompt_total; /* tokens over all prompts */
  int stream;
  int sse_on;         /* the SSE stream has begun */
  int busy;           /* an OUT is being processed: defer frees */
  int gone;           /* the client left while busy or answering */
  int answering;      /* the final answer is being written: defer frees */
  int fail_status;    /* set while busy: fail once the OUT is processed */
  int parked;         /* lost with its engine before any output: waits to be sent again */
  int retries;        /* times it was sent again */
  uint64_t parked_ns; /* monotonic: when it was first parked */
  char fail_msg[256];
  struct fe_sse_stream sse;
  char id[160];      /* the answer's id: its prefix, then the client's or a random one */
  int64_t created;   /* Unix seconds */
  uint64_t start_ns; /* monotonic */
  int first_token_seen;
  uint64_t first_token_ns;      /* monotonic, here: when the first token arrived */
  int64_t max_tokens_param;     /* tokens the request may generate (request_params_max_tokens) */
  int have_sched_times;         /* queue_s and prefill_s are known (from the scheduler's OUT) */
  double queue_s, prefill_s;    /* s, measured on the scheduler's clock */
  struct fe_eng_beams *beams;   /* use_beam_search: the search's state (fe-engine-beam.c) */
  struct pr_image *images;      /* (n_images) what every choice's ADD carries */
  struct fe_mm_image *mm;       /* (n_images) their pixels (owned) */
  size_t n_images;
  struct fe_eng_req *prev, *next;
};

/* One model replica: a scheduler (and its worker group) behind its own
 * DEALER, watched by a monitor of its connection and PINGed. */
struct fe_replica {
  struct fe_engine *e;
  int index;            /* the replica label of its metrics */
  char *endpoint;       /* the scheduler's frontend endpoint */
  struct pr_sock *sock; /* DEALER */
  void *mon;            /* PAIR: the DEALER's DISCONNECTED events */
  uv_poll_t poll;       /* on the DEALER's ZMQ_FD */
  uv_poll_t mon_poll;   /* on mon's ZMQ_FD */
  int handles;          /* of poll and mon_poll, open */
  uint64_t ping_nonce;
  int ping_soon;         /* PING once the messages at hand are dispatched */
  uint64_t last_pong_ns; /* monotonic; 0: none yet */
  int workers_ok;        /* last PONG: workers_ready == world_size > 0 */
  int64_t pong_max_model_len;
  struct pr_pong last_pong; /* cumulative counters seen last */
  int have_pong;
  struct pr_pong logged_pong; /* the counters of the last stats line (fe-engine-log.c) */
  int have_logged, stats_busy;
  int n_reqs; /* requests routed here and not parked */
};

/* A prompt prefix's hash and the replica its last request went to. */
struct fe_eng_affinity {
  uint64_t key; /* 0: empty */
  int rep;
};

struct fe_engine {
  uv_loop_t *loop;
  struct fe_router *router;
  struct fe_metrics *metrics; /* NULL: no metrics */
  struct fe_metric_ids mid;
  struct fe_engine_config cfg;
  char *model_name;
  char *model_dir;

  struct tk_tokenizer *tok;
  struct tk_state *tok_st;
  struct tk_chat *chat; /* NULL when the model has no chat template */
  json_t *chat_conf;    /* with --trust-request-chat-template: the *_token variables of a
                           request's own template (read by the pool's threads) */
  struct fe_mm mm;      /* image input; mm.enabled 0: images refused */
  int32_t eos[FE_ENG_MAX_EOS];
  int n_eos;
  int32_t n_vocab; /* ids a prompt may hold: the tokenizer's, capped by config.json's vocab_size */
  struct fe_api_model model; /* Gemma 4's markers, reasoning and native tools (fe-g4.h) */

  void *zctx;
  struct fe_replica rep[FE_ENG_MAX_REPLICAS]; /* (n_rep) one per scheduler */
  int n_rep;
  struct fe_eng_affinity aff[FE_ENG_AFFINITY]; /* prompt prefix -> the replica it went to */
  uv_timer_t timer;
  int handles_open;
  struct cm_arena rx_arena;
  int pumping, repump;

  uint64_t next_id;    /* scheduler request ids, unique over the replicas */
  uint64_t created_ns; /* monotonic */
  uint64_t stats_ns;   /* monotonic: the last stats lines */
  struct fe_eng_lora_op *lora_ops; /* run-time LoRA loads and unloads waiting for answers */
  uint64_t lora_nonce;

  /* request id -> choice: open addressing, linear probing */
  struct fe_eng_choice **map; /* (map_cap) */
  size_t map_cap, map_n;

  struct fe_eng_req *reqs; /* in flight (parked ones included) */
  int n_reqs;
  int n_parked; /* requests waiting for the engine to come back */

  /* scratch, reused */
  uint32_t *stop_ids; /* (cap) stop ids sent in ADD */
  size_t cap_stop_ids;
  struct fe_buf out;
  struct fe_buf tmp;
};

/* Whether PONG b comes from another scheduler than PONG a, on the same endpoint: its
 * totals, which only grow, went down. */
static inline int fe_eng_pong_restarted(const struct pr_pong *a, const struct pr_pong *b) {
  return b->generation_tokens < a->generation_tokens || b->prompt_tokens < a->prompt_tokens;
}

/* fe-engine-lora.c: run-time LoRA adapters (the router's lora hook) */
struct fe_eng_lora_op;
int fe_eng_lora(void *ud, int op, uint64_t uid, const char *path, fe_lora_done_fn done, void *arg);
/* A replica's LORA_DONE; a replica lost (its answers will not come); loads past their
 * time; everything freed (nothing told). */
void fe_eng_on_lora_done(struct fe_replica *p, const struct pr_lora *m);
void fe_eng_lora_lost(struct fe_replica *p);
void fe_eng_lora_tick(struct fe_engine *e, uint64_t now_ns);
void fe_eng_lora_free(struct fe_engine *e);

/* fe-engine-log.c: the operators' lines (fe_engine_config's log_*) */
/* Request r's prompt pi received: its text (NULL: given as ids), ids and parameters. */
void fe_eng_log_received(const struct fe_eng_req *r, size_t pi, const char *text, size_t text_len,
                         const int32_t *ids, size_t n_ids, int64_t max_tokens);
/* Text ch released, kept for its finished line. */
void fe_eng_log_keep(struct fe_eng_choice *ch, const char *t, size_t n);
/* ch finished: its reason, tokens and text. */
void fe_eng_log_finished(const struct fe_eng_choice *ch);
/* Each replica's throughput and load since the last lines, once log_stats_s passed. */
void fe_eng_log_stats(struct fe_engine *e, uint64_t now_ns);

/* fe-engine.c */
int fe_eng_send(struct fe_replica *p, const struct pr_msg *m);
/* Sends a PING to p now (the timer PINGs every replica every ping_ms). */
void fe_eng_ping(struct fe_replica *p);
/* 1 when p's last PONG is recent and reported all its workers ready. */
int fe_eng_rep_ready(const struct fe_replica *p);
/* The replica for a request whose first prompt is ids[n]: among the ready ones, the
 * one that took this prompt's longest remembered prefix unless it is much busier
 * than the least busy, else the least busy (running + waiting as its scheduler
 * reports them, or this frontend's requests there, whichever is larger, plus up to
 * 4 as its KV cache fills). Remembers the prompt's prefixes for it. NULL when no
 * replica is ready. */
struct fe_replica *fe_eng_route(struct fe_engine *e, const uint32_t *ids, size_t n);
/* Routes r to p (NULL: none), keeping the replicas' request counts. */
void fe_eng_req_attach(struct fe_eng_req *r, struct fe_replica *p);
/* Sends the ADD m of choice ch to its request's replica (without receiving: see
 * fe_eng_submit) and keeps a copy in ch, so that the choice can be sent again (to
 * any replica) if the engine loses it. */
int fe_eng_send_add(struct fe_eng_req *r, struct fe_eng_choice *ch, const struct pr_msg *m);
/* Drops ch's copy of its ADD. */
void fe_eng_choice_forget_add(struct fe_eng_choice *ch);
/* Replica p lost the requests in flight there (its scheduler went away or restarted,
 * or answers no more): those that produced nothing yet are parked, to be sent again
 * once a replica is ready (at most FE_ENG_MAX_RETRIES times, within retry_ms); the
 * others fail with a 503 (or an error event). p counts as not ready until a PONG
 * says otherwise. */
void fe_eng_lost(struct fe_replica *p, const char *why);
/* 1 when r may be parked: nothing of it reached the client and each choice's ADD is
 * kept. */
int fe_eng_req_retryable(const struct fe_eng_req *r);
/* Parks r: ABORTs its live choices, forgets their ids. */
void fe_eng_req_park(struct fe_eng_req *r);
void fe_eng_pump(struct fe_engine *e);
int fe_eng_map_put(struct fe_engine *e, struct fe_eng_choice *c);
struct fe_eng_choice *fe_eng_map_get(struct fe_engine *e, uint64_t id);
void fe_eng_map_del(struct fe_engine *e, uint64_t id);

/* fe-engine-req.c */
int fe_eng_submit(void *ud, struct fe_conn *c, struct fe_api_request *req, const char **why);
void fe_eng_req_free(struct fe_eng_req *r);

/* fe-engine-out.c */
void fe_eng_on_out(struct fe_engine *e, const struct pr_out *o);
/* The prefix-cache lookup of a scheduler request, from its first output s, into the
 * metrics at once (the scheduler's totals bring it again with the next PONG). */
void fe_eng_count_lookup(struct fe_eng_req *r, const struct pr_out_seq *s);
/* One sequence of an OUT for choice ch (its request busy): text, logprobs, finish. */
void fe_eng_on_seq(struct fe_engine *e, struct fe_eng_choice *ch, const struct pr_out_seq *s);
void fe_eng_on_err(struct fe_engine *e, const struct pr_err *er);
/* Fails every choice of r (ABORTs live ones) and answers the error. */
void fe_eng_req_fail(struct fe_eng_req *r, int status, const char *msg, const char *param);
void fe_eng_on_client_abort(void *ud);
/* Sends ABORT for the live choices of r. */
void fe_eng_abort_live(struct fe_eng_req *r);
/* Drops r's choices from the id map: later OUT / ERR for them are ignored. */
void fe_eng_req_unmap(struct fe_eng_req *r);

/* fe-engine-beam.c: use_beam_search. Starts prompt pi's search (ids[n], at most
 * max_tokens generated) once its w choices are made: its first step goes out. */
int fe_eng_beam_start(struct fe_eng_req *r, size_t pi, const int32_t *ids, size_t n,
                      int64_t max_tokens);
/* An OUT sequence of a searching choice (its request busy); the prompt's last
 * beams answered, its next step goes out or its choices get their beams. */
void fe_eng_beam_on_seq(struct fe_engine *e, struct fe_eng_choice *ch, const struct pr_out_seq *s);
void fe_eng_beam_free(struct fe_eng_req *r);

#endif
