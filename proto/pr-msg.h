/* pr-msg.h — lmserve's wire messages and their msgpack codec.
 *
 * Every ZeroMQ message is multipart:
 *   frame 0: 2 bytes = { message type (enum pr_type), protocol version (PR_VERSION) }
 *   frame 1: a msgpack map with small unsigned integer keys (the PR_K_* keys in
 *            pr-codec.h); nested records are maps too, arrays are msgpack arrays.
 * No raw frames follow in version 1: a receiver rejects extra frames. Bulk bytes
 * (an image's pixels) travel as msgpack bin inside frame 1.
 *
 * Each message (and each record nested in one) is described once, as a table
 * of its fields — key, type, bounds, offset into the structs below — in
 * pr-msg-front.c and pr-msg-work.c; one encoder (msgpack-c's packer), one
 * bounded decoder, the validator and pr_msg_equal walk those tables.
 *
 * Decoding is bounded: every declared array/map/string length is checked against
 * the bytes left before anything is allocated, nesting is capped at PR_MAX_DEPTH,
 * integers and floats are type- and range-checked, unknown map keys are skipped,
 * duplicated known keys are rejected. Decoded arrays and strings live in a
 * caller-provided struct cm_arena whose cap bounds what one message can make us
 * allocate; nothing in the decoded struct points into the input buffer, so the
 * input may be freed right after the call. Bad input returns a negative cm_err
 * code (CM_ERR_PARSE, _TRUNC, _RANGE, _DEPTH, _TOOBIG, _UNKNOWN, _VERSION,
 * _NOMEM when the arena cap is hit) and never aborts.
 *
 * Encoding checks the same bounds and invariants (pr_msg_validate) so that we
 * never send what a peer would refuse, and writes into a reusable struct pr_buf.
 *
 * Conventions: token ids are u32; request/sequence ids u64; times are wall-clock
 * nanoseconds since the Unix epoch (cm_time_wall_ns) unless a field says "ns
 * duration"; a struct pr_*s slice with n == 0 may have v == NULL.
 *
 * Sending: pr_msg_init(&m, PR_STEP), fill m.u.step (slices and record arrays
 * borrow the caller's memory, nothing is copied until encoding), then
 * pr_sock_send() (pr-zmq.h) or pr_msg_encode() into a reused struct pr_buf.
 *
 * Receiving: one arena per socket, e.g. cm_arena_init(&a, 1 << 20, 256 << 20);
 * per message pr_sock_recv(..., &a, ...) or pr_msg_decode(), use the message,
 * cm_arena_reset(&a). A first chunk as large as a usual message means no
 * allocation per message. Size the cap for the largest legitimate message:
 * decoded u32 arrays take up to 4 bytes per encoded byte, records more; past
 * the cap decoding fails with CM_ERR_NOMEM instead of growing. */
#ifndef LMSERVE_PR_MSG_H
#define LMSERVE_PR_MSG_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm-arena.h"

#define PR_VERSION          1           /* protocol version carried in frame 0 */
#define PR_HDR_LEN          2           /* bytes of frame 0 */
#define PR_MAX_DEPTH        16          /* msgpack nesting levels a decoder accepts */
#define PR_MAX_STR          4096        /* bytes of a message string (ERR, FAIL, CTRL text) */
#define PR_MAX_TOP_LOGPROBS 64          /* top-k logprob entries per token */
#define PR_MAX_KV_GROUPS    16          /* KV-cache groups (block tables per sequence) */
#define PR_MAX_DRAFT        64          /* draft tokens per sequence and step */
#define PR_MAX_MSG_DEFAULT  (64u << 20) /* bytes; default ZMQ_MAXMSGSIZE and encode cap */
#define PR_MAX_IMAGES       64          /* media items (images and audio clips) per request */
#define PR_MAX_IMAGE_SIDE   65535       /* px, an image's width or height (pr_image) */

enum pr_type {
  /* frontend -> scheduler */
  PR_ADD = 1,
  PR_ABORT = 2,
  PR_PING = 3,
  /* supervisor (lmserve serve, or any frontend-side peer) -> scheduler */
  PR_DOWN = 4,
  /* frontend -> scheduler */
  PR_LORA = 5,
  /* scheduler -> frontend */
  PR_OUT = 16,
  PR_ERR = 17,
  PR_PONG = 18,
  PR_LORA_DONE = 19,
  /* scheduler -> workers */
  PR_STEP = 32,
  PR_CTRL = 33,
  /* worker -> scheduler */
  PR_READY = 48,
  PR_RESULT = 49,
  PR_BEAT = 50,
  PR_FAIL = 51,
  /* scheduler <-> workers, at start-up */
  PR_DIST = 52,
  /* worker -> scheduler */
  PR_LORA_ACK = 53,
};

/* ---- slices: decoded ones live in the decode arena --------------------- */
struct pr_u32s {
  const uint32_t *v;
  uint32_t n;
};
struct pr_u64s {
  const uint64_t *v;
  uint32_t n;
};
struct pr_i32s {
  const int32_t *v;
  uint32_t n;
};
struct pr_f32s {
  const float *v;
  uint32_t n;
};
struct pr_bytes { /* one msgpack bin */
  const uint8_t *v;
  uint32_t n;
};

/* ---- shared records ------------------------------------------------------ */

/* Sampling parameters of one request; pr_sampling_default() gives the values a
 * decoder assumes for absent fields. Ranges are checked on both ends. */
struct pr_sampling {
  float temperature;        /* >= 0; 0 = greedy */
  float top_p;              /* (0, 1]; 1 = off */
  int32_t top_k;            /* >= -1; 0 or -1 = off */
  float min_p;              /* [0, 1]; 0 = off */
  float presence_penalty;   /* [-2, 2]; 0 = off */
  float frequency_penalty;  /* [-2, 2]; 0 = off */
  float repetition_penalty; /* (0, 100]; 1 = off */
  uint64_t seed;            /* valid when has_seed */
  bool has_seed;
  int32_t logprobs; /* top logprobs per token, -1 = none, 0 = only the sampled token's */
  bool ignore_eos;
  /* Structured output: what the tokens must spell (grammar/gr.h's enum gr_kind,
   * 0 = none) and its text (a regex, a JSON array of choices, a JSON Schema; empty
   * for JSON mode), at most PR_MAX_GRAMMAR_BYTES. Compiled by the frontend (a bad
   * one never gets here) and again, from the same text, by the workers. */
  uint32_t grammar_kind;
  struct pr_bytes grammar;
  /* OpenAI's logit_bias: bias.v[i] in [-100, 100] added to token bias_ids.v[i]'s
   * logit, as many of each (at most PR_MAX_LOGIT_BIAS) */
  struct pr_u32s bias_ids;
  struct pr_f32s bias;
  /* vLLM's allowed_token_ids: only the tokens of bias_ids (each once, 1 to
   * PR_MAX_LOGIT_BIAS of them, biased or with bias 0) may be drawn */
  bool bias_only;
  /* vLLM's bad_words, as token sequences one after another in bad_ids (sequence i
   * has bad_lens.v[i] ids, 1 to PR_MAX_BAD_WORD_LEN): a token that would end one of
   * them after the tokens generated before it may not be drawn */
  struct pr_u32s bad_ids;
  struct pr_u32s bad_lens;
  /* vLLM's prompt_logprobs: the logprob of each prompt token after the first, given
   * the tokens before it, with this many top entries (-1 = not asked; at most
   * PR_MAX_TOP_LOGPROBS). The scheduler computes such a prompt in full (no prefix-cache
   * hit) and the workers score its rows (PR_SEQ_SCORE). */
  int32_t prompt_logprobs;
  /* the LoRA adapter the request runs with: 1 .. PR_MAX_LORAS, the workers' n-th
   * (--lora-modules order, READY's n_lora); 0 = the base model */
  uint32_t lora;
};

#define PR_MAX_GRAMMAR_KIND  6
#define PR_MAX_GRAMMAR_BYTES 32768
#define PR_MAX_LOGIT_BIAS    1024
#define PR_MAX_BAD_WORD_LEN  32   /* tokens of one bad_words sequence */
#define PR_MAX_BAD_WORD_IDS  2048 /* tokens of all of a request's */
#define PR_MAX_LORAS         64   /* LoRA adapters a model is served with */

/* Logprobs of n_tokens generated tokens. Either empty (sampled.n == 0, n_top == 0)
 * or sampled.n == n_tokens and top_ids.n == top.n == n_tokens * n_top. */
struct pr_logprobs {
  uint32_t n_top;         /* top entries per token, <= PR_MAX_TOP_LOGPROBS */
  struct pr_f32s sampled; /* (n_tokens) logprob of each sampled token; nats, <= 0 or -inf */
  struct pr_u32s top_ids; /* (n_tokens, n_top) token ids, best first */
  struct pr_f32s top;     /* (n_tokens, n_top) their logprobs */
  struct pr_u32s ranks;   /* (n_tokens) or empty: each token's rank, 1 + the tokens more
                             likely (a prompt's logprobs) */
};

enum pr_finish {
  PR_FINISH_NONE = 0,   /* still running */
  PR_FINISH_STOP = 1,   /* EOS or a stop token id */
  PR_FINISH_LENGTH = 2, /* max_tokens or the model length */
  PR_FINISH_ABORT = 3,  /* aborted by the client */
  PR_FINISH_ERROR = 4,  /* failed; an ERR message says why */
};

/* A media item of a prompt (an image or an audio clip): the run of its soft
 * tokens, its content hash and its data, by kind:
 *   PR_MEDIA_IMAGE: pixels as the vision tower's processor resized them: 8-bit
 *     RGB, interleaved, rows top to bottom ([height, width, channels]); the
 *     worker rescales and normalises them (Gemma 3: model/md-vision-preproc.h)
 *     or cuts them into patches (Gemma 4: md_g4_image_patches). Gemma 3's
 *     images all have the processor's size and send none; Gemma 4's vary per
 *     image and send theirs (width x height x 3 == data.n, both or neither).
 *   PR_MEDIA_AUDIO: Gemma 4's log-mel features and their frame mask
 *     (model/md-audio-g4.h): width = mel bins, height = frames, data = the
 *     features [height][width] as little-endian f32, then the mask [height]
 *     (one byte a frame: 1 valid, 0 padding); width x height x 4 + height ==
 *     data.n, both sides always sent. The worker runs the audio tower
 *     (worker/wk-audio-g4.h) over them.
 * The soft tokens of a clip attend causally (transformers' Gemma 4 gives only
 * vision tokens the bidirectional mask); an image's each other both ways. */
enum pr_media {
  PR_MEDIA_IMAGE = 0,
  PR_MEDIA_AUDIO = 1,
  PR_MEDIA_MAX = 1,
};

struct pr_image {
  uint32_t pos;           /* ADD: index in the prompt of its first soft token;
                             STEP: its absolute position */
  uint32_t n_tokens;      /* soft tokens, >= 1 */
  uint64_t hash;          /* content hash of the data (and its shape and kind) */
  struct pr_bytes pixels; /* the data (an image's pixels, a clip's features and mask) */
  uint32_t width, height; /* image: px, <= PR_MAX_IMAGE_SIDE, 0 = not sent (the model's one
                             size); audio: mel bins and frames */
  uint32_t kind;          /* enum pr_media; 0 = an image */
};

/* ---- frontend -> scheduler ----------------------------------------------- */
struct pr_add {
  uint64_t request_id;   /* unique per frontend connection (ROUTER peer) */
  struct pr_u32s prompt; /* (n_prompt) prompt token ids, n >= 1 */
  struct pr_sampling sampling;
  uint32_t max_tokens;           /* tokens to generate at most, >= 1 */
  uint32_t min_tokens;           /* tokens before EOS/stop ids count, <= max_tokens */
  struct pr_u32s stop_token_ids; /* extra stop ids besides the model's EOS ids */
  int32_t priority;              /* lower runs sooner (vLLM's convention); 0 = default */
  uint64_t arrival_ns;           /* wall clock when the frontend accepted the request */
  struct pr_image *images;       /* (n_images) images and audio clips in prompt order, runs
                                    apart, inside the prompt */
  uint32_t n_images;             /* <= PR_MAX_IMAGES */
  uint64_t cache_salt;           /* the prefix cache's salt (vLLM's cache_salt, hashed; 0: none):
                                    only requests with the same salt share cached blocks */
  uint64_t lora_sum;             /* with sampling.lora: the sender's adapter list (names and
                                    order, md_lora_list_sum), which must be the workers' */
  /* a LoRA adapter loaded at run time (LORA): its id (never 0) and its folder or file,
   * which the scheduler has its workers load when it holds no adapter of that id;
   * 0 and NULL: none (sampling.lora and lora_sum are then 0) */
  uint64_t lora_uid;
  const char *lora_path;
};

struct pr_abort {
  struct pr_u64s request_ids;
};

struct pr_ping {
  uint64_t nonce;   /* echoed in PONG */
  uint64_t send_ns; /* wall clock at send */
};

/* LORA (frontend -> scheduler): a LoRA adapter loaded at run time (POST
 * /v1/load_lora_adapter) or unloaded. The scheduler gives a loaded adapter a slot, has
 * every worker rank load it there (CTRL LORA_LOAD, each answering LORA_ACK) and
 * answers LORA_DONE with the same nonce once they all have; requests name it by uid
 * (pr_add.lora_uid). Unloading frees the slot once no request runs with it.
 * LORA_DONE (scheduler -> frontend): nonce, code and message. LORA_ACK (worker ->
 * scheduler): rank, slot, code and message. */
enum pr_lora_op {
  PR_LORA_LOAD = 1,
  PR_LORA_UNLOAD = 2,
};
struct pr_lora {
  uint64_t nonce;      /* LORA, LORA_DONE: the frontend's, answered with it; LORA_ACK: the
                          CTRL LORA_LOAD's arg */
  uint32_t op;         /* LORA: enum pr_lora_op */
  uint64_t uid;        /* LORA: the adapter's id (never 0) */
  const char *path;    /* LORA load: its folder or GGUF file */
  uint32_t rank;       /* LORA_ACK: the worker's rank */
  uint32_t slot;       /* LORA_ACK: the slot it loaded (CTRL LORA_LOAD's arg) */
  int32_t code;        /* LORA_DONE, LORA_ACK: 0 or a negative cm_err */
  const char *message; /* why, when code is not 0 (sent as "" when NULL) */
};

/* DOWN: a worker rank's process has ended (its supervisor reaped it). The scheduler
 * fails the rank at once, as if its heartbeats had stopped, when rank and pid match
 * the rank's READY (pid 0 matches any process of that rank). */
struct pr_down {
  uint32_t rank;
  uint32_t pid;        /* the process that ended; 0 = not said */
  const char *message; /* how it ended ("killed by signal 9"); never NULL after decode */
};

/* ---- scheduler -> frontend ----------------------------------------------- */
struct pr_out_seq {
  uint64_t request_id;
  struct pr_u32s tokens;       /* (n_new) token ids generated since the last OUT */
  struct pr_logprobs logprobs; /* over `tokens`; empty when the request asked none */
  uint8_t finish;              /* enum pr_finish */
  int64_t stop_token;          /* token id that gave PR_FINISH_STOP, -1 = none */
  uint32_t n_prompt_tokens;    /* tokens */
  uint32_t n_cached_tokens;    /* prompt tokens served from the prefix cache */
  uint64_t queued_ns;          /* wall clock entering the queue, 0 = unknown */
  uint64_t scheduled_ns;       /* wall clock of the first schedule, 0 = not yet */
  uint64_t first_token_ns;     /* wall clock of the first generated token, 0 = not yet */
  /* with the request's first tokens, when it asked them (pr_sampling.prompt_logprobs):
   * the logprobs of prompt tokens 1 .. n_prompt_tokens - 1 (sampled.v[i] is token i + 1's,
   * given those before it; the top entries are that position's best) */
  struct pr_logprobs prompt_logprobs;
};

struct pr_out {
  struct pr_out_seq *seqs; /* (n_seqs) */
  uint32_t n_seqs;
};

struct pr_err {
  uint64_t request_id; /* 0 when the error is not about one request */
  int32_t code;        /* negative cm_err code */
  const char *message; /* UTF-8, no NUL, <= PR_MAX_STR bytes; never NULL after decode */
};

struct pr_pong {
  uint64_t nonce;                    /* from the PING */
  uint64_t ping_send_ns;             /* from the PING, for round-trip time */
  uint32_t num_running;              /* requests */
  uint32_t num_waiting;              /* requests */
  double kv_usage;                   /* fraction of KV blocks in use, [0, 1] */
  uint32_t workers_ready;            /* ranks that reported READY */
  uint32_t world_size;               /* ranks expected */
  uint32_t max_model_len;            /* tokens; 0 until the workers are ready */
  uint32_t max_num_seqs;             /* requests it runs at once (--max-num-seqs); 0: unknown */
  uint64_t prefix_cache_queries;     /* tokens looked up (cumulative) */
  uint64_t prefix_cache_hits;        /* tokens found (cumulative) */
  uint64_t num_preemptions;          /* cumulative */
  uint64_t spec_num_drafts;          /* cumulative */
  uint64_t spec_num_draft_tokens;    /* cumulative */
  uint64_t spec_num_accepted_tokens; /* cumulative */
  uint64_t prompt_tokens;            /* cumulative, computed prompt tokens */
  uint64_t generation_tokens;        /* cumulative */
  /* cumulative accepted draft tokens by position in the draft (0 = first);
   * entries 0 .. n_spec_pos-1, n_spec_pos <= PR_MAX_DRAFT */
  uint32_t n_spec_pos;
  uint64_t spec_accepted_per_pos[PR_MAX_DRAFT];
  /* rank 0's READY kernels and matmul_inputs; NULL until a worker said them */
  const char *kernels;
  const char *matmul_inputs;
};

/* ---- scheduler -> workers ------------------------------------------------ */
enum pr_seq_flags {
  PR_SEQ_NEW = 1u << 0,           /* first step of this sequence (or first after preemption):
                                   * the worker (re)creates its state; sampling is valid */
  PR_SEQ_SAMPLE = 1u << 1,        /* sample a token after this step's last position */
  PR_SEQ_PREFILL = 1u << 2,       /* tokens are a prompt chunk */
  PR_SEQ_FINISHED = 1u << 3,      /* last step: free worker-side state after it */
  PR_SEQ_APPEND_BLOCKS = 1u << 4, /* block_tables hold only blocks appended to the tables
                                   * the worker already has (not with PR_SEQ_NEW) */
  PR_SEQ_PREV_TOKEN = 1u << 5,    /* async scheduling: the one token to run is the one this
                                   * sequence sampled in its previous step, which the
                                   * scheduler does not know yet (tokens.v[0] is 0); it runs
                                   * at start_pos plus the drafts that step accepted (the
                                   * scheduler plans as if it accepted none, and its blocks
                                   * cover the positions of every acceptance) */
  PR_SEQ_PREV_DRAFTS = 1u << 6,   /* with PREV_TOKEN, no draft_tokens and num_draft > 0: verify
                                   * the drafts this sequence proposed in its previous step,
                                   * at most num_draft and no more than its max_tokens leave
                                   * room for (the count synchronous steps would send) */
  PR_SEQ_SCORE = 1u << 7,         /* with PREFILL, for prompt logprobs: each of the chunk's
                                   * rows but a sampling one scores the prompt token after it
                                   * (the last row, without SAMPLE, scores prompt_next), and
                                   * the RESULT carries their logprobs (prompt_logprobs) */
  PR_SEQ_FLAGS_ALL = 0xffu,
};

struct pr_step_seq {
  uint64_t seq_id;              /* = request id */
  uint32_t flags;               /* enum pr_seq_flags */
  uint32_t start_pos;           /* position of tokens.v[0] */
  struct pr_u32s tokens;        /* tokens to run at start_pos.., drafts excluded */
  struct pr_u32s draft_tokens;  /* drafts to verify, run after `tokens` at positions
                                 * start_pos + tokens.n ..; <= PR_MAX_DRAFT */
  uint32_t num_draft;           /* drafts to propose after this step (K), <= PR_MAX_DRAFT */
  struct pr_i32s *block_tables; /* (n_groups) block ids per KV group, logical block order:
                                 * the whole table, or with PR_SEQ_APPEND_BLOCKS only the
                                 * new blocks (n_groups 0 = none this step); -1 = no block
                                 * (freed by the sliding window) */
  uint32_t n_groups;            /* <= PR_MAX_KV_GROUPS */
  struct pr_sampling sampling;  /* sent and valid only with PR_SEQ_NEW */
  struct pr_image *images;      /* (n_images) the images whose soft tokens meet this step's
                                 * tokens, with their pixels; each ends inside the step (the
                                 * first may begin before start_pos) */
  uint32_t n_images;            /* <= PR_MAX_IMAGES */
  uint32_t num_prompt;          /* with PR_SEQ_NEW: the request's prompt tokens; positions
                                 * from here on are generated ones (re-run after a
                                 * preemption), which a structured output's matcher follows */
  struct pr_u32s generated;     /* with PR_SEQ_NEW and a structured output: the tokens
                                 * generated before start_pos (their K/V may come from the
                                 * prefix cache, so the step does not run them) */
  uint32_t max_tokens;          /* with PR_SEQ_NEW: the request's max_tokens (0 = not said;
                                 * PR_SEQ_PREV_DRAFTS then verifies no drafts) */
  struct pr_u32s before;        /* with PR_SEQ_NEW and penalties (repetition, presence,
                                 * frequency) or speculative decoding: the tokens at
                                 * positions 0 .. start_pos - 1, which the step does not
                                 * run (a prefix-cache hit, a preempted request's), for the
                                 * penalties (prompt tokens below num_prompt, generated
                                 * ones from there) and n-gram drafts; empty, or start_pos
                                 * of them */
  uint32_t prompt_next;         /* with PR_SEQ_SCORE and without PR_SEQ_SAMPLE: the prompt
                                 * token after the chunk, which its last row scores */
};

struct pr_step {
  uint64_t step_id;         /* increasing */
  struct pr_step_seq *seqs; /* (n_seqs) */
  uint32_t n_seqs;
  struct pr_u64s free_ids; /* sequences whose worker-side state can be dropped */
};

enum pr_ctrl_op {
  PR_CTRL_SHUTDOWN = 1,      /* exit cleanly */
  PR_CTRL_PROFILE_START = 2, /* text = output path or NULL */
  PR_CTRL_PROFILE_STOP = 3,
  PR_CTRL_ANNOUNCE = 4,  /* to a worker: send READY again, dropping every sequence's state (the
                            scheduler does not know this rank: it restarted, or gave the rank up) */
  PR_CTRL_GRAMMARS = 5,  /* to a worker: build the structured-output state (its vocabulary's
                            trie) now, beside the steps it runs; BEAT says when it is there */
  PR_CTRL_LORA_LOAD = 6, /* to a worker: load the LoRA adapter at path `text` into the slot in
                            `arg`'s low 8 bits (after the list's, PR_MAX_LORAS at most),
                            replacing the one there; LORA_ACK answers, its nonce `arg` (the
                            bits above the slot number the scheduler's load) */
  PR_CTRL_LORA_DROP = 7, /* to a worker: free slot `arg`'s adapter */
  PR_CTRL_OP_MAX = 7,
};

struct pr_ctrl {
  uint32_t op;      /* enum pr_ctrl_op */
  int64_t arg;      /* op-specific, 0 by default */
  const char *text; /* op-specific, NULL when absent */
};

/* ---- worker -> scheduler ------------------------------------------------- */
struct pr_kv_group {
  uint32_t block_tokens;    /* tokens per block */
  uint32_t n_layers;        /* layers that own cache in this group */
  uint64_t bytes_per_token; /* bytes of K+V per token over the group's layers, this rank */
  uint32_t sliding_window;  /* tokens; 0 = full attention */
};

struct pr_ready {
  uint32_t rank;
  uint32_t world_size;        /* >= 1, rank < world_size */
  uint64_t kv_blocks;         /* blocks in this rank's pool */
  struct pr_kv_group *groups; /* (n_groups) */
  uint32_t n_groups;          /* 1..PR_MAX_KV_GROUPS */
  uint32_t vocab_size;
  uint32_t max_model_len; /* tokens */
  struct pr_u32s eos_ids;
  uint32_t max_draft; /* drafts the assistant model proposes, 0 = none */
  /* the largest step this rank takes; 0 = not said (the scheduler's own
   * limits stand) */
  uint32_t max_num_seqs;           /* sequences per step */
  uint32_t max_num_batched_tokens; /* tokens per step, drafts included */
  /* checksum of the model's config and this rank's shard shapes: the ranks of one
   * tensor-parallel group must agree (0 = not said) */
  uint64_t shard_sum;
  uint32_t pid; /* the worker's process id on its host (matches DOWN); 0 = not said */
  /* images: soft tokens per image and bytes of one image's pixels (struct
   * pr_image); 0 = the model takes no images. With image_varsize (Gemma 4)
   * these are the largest an image may have, and each image carries its
   * width and height; without (Gemma 3) every image has exactly these. */
  uint32_t image_tokens;
  uint32_t image_bytes;
  uint32_t image_varsize; /* 0 or 1 */
  /* audio (PR_MEDIA_AUDIO items): the most soft tokens and data bytes one
   * clip may have (Gemma 4: a 30 s clip's); 0 = the model takes no audio */
  uint32_t audio_tokens;
  uint32_t audio_bytes;
  /* what runs the model, for logs and metrics: the kernel set ("cpu-avx512bf16",
   * "cuda") and the precision the matmuls take their inputs in ("f32", "bf16",
   * "weights": narrowed to the weights' type); NULL = not said */
  const char *kernels;
  const char *matmul_inputs;
  /* LoRA adapters loaded (--lora-modules), requests' sampling.lora 1 .. n_lora, and
   * their list's md_lora_list_sum (0 with none), which a request's ADD must match */
  uint32_t n_lora;
  uint64_t lora_sum;
};

struct pr_result_seq {
  uint64_t seq_id;
  struct pr_u32s tokens;       /* sampled tokens: accepted drafts then one more */
  uint32_t num_accepted;       /* drafts accepted, <= tokens.n */
  uint32_t num_verified;       /* drafts verified, >= num_accepted (those the step sent, or
                                * with PR_SEQ_PREV_DRAFTS those the worker took) */
  struct pr_logprobs logprobs; /* over `tokens` */
  struct pr_u32s drafts;       /* drafts proposed for the next step, <= PR_MAX_DRAFT */
  /* PR_SEQ_SCORE: the scored rows' logprobs, over the prompt tokens at prompt_pos ..
   * (start_pos + 1 ..): each token's given those before it, and the top entries */
  struct pr_logprobs prompt_logprobs;
  uint32_t prompt_pos;
};

struct pr_result {
  uint32_t rank;
  uint64_t step_id;
  struct pr_result_seq *seqs; /* (n_seqs) */
  uint32_t n_seqs;
};

/* pr_beat.flags */
enum pr_beat_flag {
  PR_BEAT_GRAMMARS = 1u << 0,        /* the structured-output state is built */
  PR_BEAT_GRAMMARS_FAILED = 1u << 1, /* building it failed (a constrained step says why) */
  PR_BEAT_FLAGS_ALL = (1u << 2) - 1,
};

struct pr_beat {
  uint32_t rank;
  uint64_t last_step_id;
  uint64_t time_ns; /* wall clock */
  uint32_t flags;   /* enum pr_beat_flag */
};

struct pr_fail {
  uint32_t rank;
  uint64_t step_id;    /* 0 when not during a step */
  int32_t code;        /* negative cm_err code */
  const char *message; /* as in struct pr_err */
};

/* DIST: how the ranks of a tensor-parallel group find each other. Every rank sends
 * one when it starts: rank 0 with the group's id (its backend's kn_comm_id: a
 * shared-memory segment name, or NCCL's unique id), the others with an empty id (a
 * request). The scheduler answers every rank that asked with rank 0's id, as soon as
 * it has it; nothing else (no shared file system) carries it. */
#define PR_MAX_COMM_ID 32 /* uint32 words: 128 bytes */
struct pr_dist {
  uint32_t rank;
  uint32_t world_size;    /* >= 1, rank < world_size */
  struct pr_u32s comm_id; /* <= PR_MAX_COMM_ID words; empty: a request */
};

/* One decoded or to-be-encoded message. */
struct pr_msg {
  enum pr_type type;
  union {
    struct pr_add add;
    struct pr_abort abort;
    struct pr_ping ping;
    struct pr_down down;
    struct pr_out out;
    struct pr_err err;
    struct pr_pong pong;
    struct pr_step step;
    struct pr_ctrl ctrl;
    struct pr_ready ready;
    struct pr_result result;
    struct pr_beat beat;
    struct pr_fail fail;
    struct pr_dist dist;
    struct pr_lora lora; /* LORA, LORA_DONE, LORA_ACK */
  } u;
};

/* A growable byte buffer for encoding; reuse it across messages (no allocation
 * once it has grown). `max` (bytes) caps its growth: past it writes fail. */
struct pr_buf {
  uint8_t *data;
  size_t len; /* bytes written */
  size_t cap; /* bytes allocated */
  size_t max; /* bytes; growth limit */
  int err;    /* sticky: first error of the writes since the last reset */
};

void pr_buf_init(struct pr_buf *b, size_t max);
void pr_buf_reset(struct pr_buf *b); /* len = 0, err = 0; memory kept */
void pr_buf_free(struct pr_buf *b);

/* ---- codec ---------------------------------------------------------------- */

const char *pr_type_name(enum pr_type t); /* "ADD", ..., or "?" */
bool pr_type_known(unsigned t);

void pr_sampling_default(struct pr_sampling *s);
/* Zeroes *m, sets its type and the defaults a decoder assumes. */
void pr_msg_init(struct pr_msg *m, enum pr_type type);

/* Checks the invariants the decoder enforces (ranges, lengths that must agree).
 * Returns 0, CM_ERR_UNKNOWN for an unknown type, or CM_ERR_RANGE/_INVAL. */
int pr_msg_validate(const struct pr_msg *m);

/* Writes frame 0 for type `t`. */
void pr_msg_header(enum pr_type t, uint8_t hdr[PR_HDR_LEN]);
/* Encodes frame 1 into `body` (reset first). Returns 0, a pr_msg_validate
 * error, or CM_ERR_TOOBIG/_NOMEM when the buffer cannot hold it. */
int pr_msg_encode(const struct pr_msg *m, struct pr_buf *body);

/* Checks frame 0: CM_ERR_PARSE (not 2 bytes), CM_ERR_UNKNOWN, CM_ERR_VERSION. */
int pr_msg_decode_header(const void *hdr, size_t len, enum pr_type *type);
/* Decodes frame 1 of a message of type `type` into *out; arrays and strings go
 * into `arena`. On failure *out is unspecified and the arena may hold partial
 * allocations: reset it. */
int pr_msg_decode_body(enum pr_type type, const void *body, size_t len, struct cm_arena *arena,
                       struct pr_msg *out);
/* Both frames at once. */
int pr_msg_decode(const void *hdr, size_t hdr_len, const void *body, size_t body_len,
                  struct cm_arena *arena, struct pr_msg *out);

/* Field-by-field equality (floats bitwise), for tests and the fuzz target. */
bool pr_msg_equal(const struct pr_msg *a, const struct pr_msg *b);

#endif
