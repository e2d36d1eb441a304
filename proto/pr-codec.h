/* pr-codec.h — what the per-message codec files share (internal to proto/):
 * map-key tables, decode helpers for slices, strings and shared records, and
 * the per-message encode/decode/validate functions that pr-codec.c dispatches.
 *
 * Every record is a msgpack map with unsigned integer keys below 64. Decoders
 * skip unknown keys (with their values, nesting bounded), reject a repeated
 * known key, and require the keys named in each record's "required" mask.
 * Absent optional fields keep the values pr_msg_init() gives them. */
#ifndef LMSERVE_PR_CODEC_H
#define LMSERVE_PR_CODEC_H
#include <stdint.h>

#include "common/cm-arena.h"
#include "proto/pr-mp.h"
#include "proto/pr-msg.h"

#define PR_TRY(expr)                                                                               \
  do {                                                                                             \
    int pr_rc_ = (expr);                                                                           \
    if (pr_rc_) return pr_rc_;                                                                     \
  } while (0)

/* Loops over the entries of a map record: `k` gets each entry's key, known or
 * PR_KEY_NONE; the body reads (or skips) the value. Needs `int pr_rc_loop`. */
#define PR_MAP_FOR(r, level, seen, n, i, k)                                                        \
  PR_TRY(pr_rd_map((r), &(n)));                                                                    \
  for (uint32_t i = 0; i < (n); i++)                                                               \
    if ((pr_rc_loop = pr_dec_key((r), &(seen), (level), &(k))) != 0)                               \
      return pr_rc_loop;                                                                           \
    else

#define PR_KEY_NONE UINT32_MAX /* a key to ignore (its value is already skipped) */
#define PR_BIT(k)   (1ull << (k))

/* Nesting level at which each kind of record sits (the top-level map is 1);
 * unknown values below a record are skipped with PR_MAX_DEPTH - level levels. */
#define PR_LVL_TOP 1
#define PR_LVL_REC 3 /* a record in an array of the top-level map */
#define PR_LVL_SUB 2 /* a record that is a value of the top-level map */

/* ---- keys ---- */
enum {
  PR_K_SAMP_TEMPERATURE,
  PR_K_SAMP_TOP_P,
  PR_K_SAMP_TOP_K,
  PR_K_SAMP_MIN_P,
  PR_K_SAMP_PRESENCE,
  PR_K_SAMP_FREQUENCY,
  PR_K_SAMP_REPETITION,
  PR_K_SAMP_SEED,
  PR_K_SAMP_LOGPROBS,
  PR_K_SAMP_IGNORE_EOS
};
enum { PR_K_LP_N_TOP, PR_K_LP_SAMPLED, PR_K_LP_TOP_IDS, PR_K_LP_TOP };
enum {
  PR_K_ADD_ID,
  PR_K_ADD_PROMPT,
  PR_K_ADD_SAMPLING,
  PR_K_ADD_MAX_TOKENS,
  PR_K_ADD_MIN_TOKENS,
  PR_K_ADD_STOP_IDS,
  PR_K_ADD_PRIORITY,
  PR_K_ADD_ARRIVAL
};
enum { PR_K_ABORT_IDS };
enum { PR_K_PING_NONCE, PR_K_PING_SEND };
enum { PR_K_OUT_SEQS };
enum {
  PR_K_OSEQ_ID,
  PR_K_OSEQ_TOKENS,
  PR_K_OSEQ_LOGPROBS,
  PR_K_OSEQ_FINISH,
  PR_K_OSEQ_STOP_TOKEN,
  PR_K_OSEQ_N_PROMPT,
  PR_K_OSEQ_N_CACHED,
  PR_K_OSEQ_QUEUED,
  PR_K_OSEQ_SCHEDULED,
  PR_K_OSEQ_FIRST_TOKEN
};
enum { PR_K_ERR_ID, PR_K_ERR_CODE, PR_K_ERR_MESSAGE };
enum {
  PR_K_PONG_NONCE,
  PR_K_PONG_PING_SEND,
  PR_K_PONG_RUNNING,
  PR_K_PONG_WAITING,
  PR_K_PONG_KV_USAGE,
  PR_K_PONG_WORKERS_READY,
  PR_K_PONG_WORLD_SIZE,
  PR_K_PONG_MAX_MODEL_LEN,
  PR_K_PONG_PC_QUERIES,
  PR_K_PONG_PC_HITS,
  PR_K_PONG_PREEMPTIONS,
  PR_K_PONG_SPEC_DRAFTS,
  PR_K_PONG_SPEC_DRAFT_TOKENS,
  PR_K_PONG_SPEC_ACCEPTED,
  PR_K_PONG_PROMPT_TOKENS,
  PR_K_PONG_GEN_TOKENS,
  PR_K_PONG_SPEC_ACCEPTED_POS, /* array of uint */
  PR_K_PONG__COUNT
};
enum { PR_K_STEP_ID, PR_K_STEP_SEQS, PR_K_STEP_FREE };
enum {
  PR_K_SSEQ_ID,
  PR_K_SSEQ_FLAGS,
  PR_K_SSEQ_START,
  PR_K_SSEQ_TOKENS,
  PR_K_SSEQ_DRAFTS,
  PR_K_SSEQ_NUM_DRAFT,
  PR_K_SSEQ_TABLES,
  PR_K_SSEQ_SAMPLING
};
enum { PR_K_CTRL_OP, PR_K_CTRL_ARG, PR_K_CTRL_TEXT };
enum {
  PR_K_READY_RANK,
  PR_K_READY_WORLD,
  PR_K_READY_BLOCKS,
  PR_K_READY_GROUPS,
  PR_K_READY_VOCAB,
  PR_K_READY_MAX_LEN,
  PR_K_READY_EOS,
  PR_K_READY_MAX_DRAFT,
  PR_K_READY_MAX_SEQS,
  PR_K_READY_MAX_TOKENS
};
enum { PR_K_GRP_BLOCK_TOKENS, PR_K_GRP_LAYERS, PR_K_GRP_BYTES, PR_K_GRP_WINDOW };
enum { PR_K_RES_RANK, PR_K_RES_STEP, PR_K_RES_SEQS };
enum { PR_K_RSEQ_ID, PR_K_RSEQ_TOKENS, PR_K_RSEQ_ACCEPTED, PR_K_RSEQ_LOGPROBS, PR_K_RSEQ_DRAFTS };
enum { PR_K_BEAT_RANK, PR_K_BEAT_STEP, PR_K_BEAT_TIME };
enum { PR_K_FAIL_RANK, PR_K_FAIL_STEP, PR_K_FAIL_CODE, PR_K_FAIL_MESSAGE };

/* ---- decode helpers (pr-codec.c) ---- */

/* Reads the key of the next map entry. Unknown keys (not an unsigned integer
 * below 64) are skipped with their value and give *key = PR_KEY_NONE; a key
 * already in *seen is an error (CM_ERR_PARSE). */
int pr_dec_key(struct pr_rd *r, uint64_t *seen, int level, uint32_t *key);
/* Skips the value of a key this record does not know. */
int pr_dec_skip(struct pr_rd *r, int level);
/* Token-id / id arrays of at most max_n entries (CM_ERR_TOOBIG beyond). */
int pr_dec_u32s(struct pr_rd *r, struct cm_arena *a, uint32_t max_n, struct pr_u32s *out);
int pr_dec_u64s(struct pr_rd *r, struct cm_arena *a, struct pr_u64s *out);
/* Block ids: each >= -1. */
int pr_dec_blocks(struct pr_rd *r, struct cm_arena *a, struct pr_i32s *out);
/* Logprob values: no NaN, no +inf. */
int pr_dec_logprob_f32s(struct pr_rd *r, struct cm_arena *a, struct pr_f32s *out);
/* A float field: any msgpack number within float's range, or +-inf; NaN and
 * finite values beyond FLT_MAX are refused (CM_ERR_RANGE). Callers check
 * finer ranges in pr_check_*. */
int pr_dec_f32(struct pr_rd *r, float *out);
/* A string: <= PR_MAX_STR bytes, valid UTF-8, no NUL; copied NUL-terminated. */
int pr_dec_str(struct pr_rd *r, struct cm_arena *a, const char **out);
/* Room for n records of `size` bytes, zeroed; NULL-safe for n == 0. */
int pr_dec_records(struct cm_arena *a, uint32_t n, size_t size, void **out);
int pr_dec_sampling(struct pr_rd *r, int level, struct pr_sampling *s);
int pr_dec_logprobs(struct pr_rd *r, struct cm_arena *a, int level, struct pr_logprobs *lp);

/* ---- encode helpers ---- */
void pr_enc_u32s(struct pr_buf *b, struct pr_u32s s);
void pr_enc_u64s(struct pr_buf *b, struct pr_u64s s);
void pr_enc_i32s(struct pr_buf *b, struct pr_i32s s);
void pr_enc_f32s(struct pr_buf *b, struct pr_f32s s);
void pr_enc_str(struct pr_buf *b, const char *s); /* NULL is "" */
void pr_enc_sampling(struct pr_buf *b, const struct pr_sampling *s);
void pr_enc_logprobs(struct pr_buf *b, const struct pr_logprobs *lp);

/* ---- validation helpers ---- */
int pr_check_sampling(const struct pr_sampling *s);
int pr_check_logprobs(const struct pr_logprobs *lp, uint32_t n_tokens);
int pr_check_str(const char *s);               /* NULL is fine */
int pr_check_slice(const void *v, uint32_t n); /* v may be NULL only when n == 0 */

/* ---- per-message functions (pr-msg-front.c, pr-msg-work.c) ---- */
#define PR_DECLARE_CODEC(name, T)                                                                  \
  void pr_enc_##name(struct pr_buf *b, const T *m);                                                \
  int pr_dec_##name(struct pr_rd *r, struct cm_arena *a, T *m);                                    \
  int pr_check_##name(const T *m);
PR_DECLARE_CODEC(add, struct pr_add)
PR_DECLARE_CODEC(abort, struct pr_abort)
PR_DECLARE_CODEC(ping, struct pr_ping)
PR_DECLARE_CODEC(out, struct pr_out)
PR_DECLARE_CODEC(err, struct pr_err)
PR_DECLARE_CODEC(pong, struct pr_pong)
PR_DECLARE_CODEC(step, struct pr_step)
PR_DECLARE_CODEC(ctrl, struct pr_ctrl)
PR_DECLARE_CODEC(ready, struct pr_ready)
PR_DECLARE_CODEC(result, struct pr_result)
PR_DECLARE_CODEC(beat, struct pr_beat)
PR_DECLARE_CODEC(fail, struct pr_fail)
#undef PR_DECLARE_CODEC

#endif
