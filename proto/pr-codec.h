/* pr-codec.h — how proto describes its messages (internal to proto/).
 *
 * Every wire record — a message body, or a record nested in one (sampling
 * parameters, logprobs, the per-sequence entries of STEP / RESULT / OUT, the
 * KV groups of READY) — is a msgpack map with small unsigned integer keys,
 * described once by a struct pr_rec: a table of struct pr_field indexed by
 * map key, each giving the member's type, its offset in the C struct
 * (offsetof), its bounds (value range, entries at most), its default, when it
 * is sent, and for nested records and arrays of them, their own table.
 * The tables live beside the messages (pr-msg-front.c, pr-msg-work.c), with
 * a `check` per record for what ties its fields together. The walkers read
 * the tables and know nothing of any message:
 *   pr-encode.c  the encoder, through msgpack-c's packer into a struct pr_buf,
 *                which is also the validator (the same walk writing nothing);
 *   pr-decode.c  the bounded decoder, over our own reader (pr-mp.h);
 *   pr-codec.c   defaults and the entry points of pr-msg.h;
 *   pr-msg-eq.c  equality.
 * A new field is one line in a table (and a key below); a new message, one
 * table and one line in pr-codec.c's list of types.
 *
 * Wire rules the tables encode: fields are written in key order, those whose
 * condition (`when`) is false left out. A decoder skips unknown keys (with
 * their values, nesting bounded), rejects a repeated key below PR_MAX_KEYS,
 * requires the PR_F_REQ fields, and leaves absent fields at their defaults. */
#ifndef LMSERVE_PR_CODEC_H
#define LMSERVE_PR_CODEC_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/cm-err.h"
#include "proto/pr-mp.h"
#include "proto/pr-msg.h"

#define PR_TRY(expr)                                                                               \
  do {                                                                                             \
    int pr_rc_ = (expr);                                                                           \
    if (pr_rc_) return pr_rc_;                                                                     \
  } while (0)

#define PR_MAX_KEYS 64 /* map keys 0..63 are ours; larger ones are skipped as unknown */

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
  PR_K_SAMP_IGNORE_EOS,
  PR_K_SAMP_GRAMMAR_KIND,
  PR_K_SAMP_GRAMMAR,
  PR_K_SAMP_BIAS_IDS,
  PR_K_SAMP_BIAS,
  PR_K_SAMP_BIAS_ONLY,
  PR_K_SAMP_BAD_IDS,
  PR_K_SAMP_BAD_LENS,
  PR_K_SAMP_PROMPT_LOGPROBS,
  PR_K_SAMP_LORA
};
enum { PR_K_LP_N_TOP, PR_K_LP_SAMPLED, PR_K_LP_TOP_IDS, PR_K_LP_TOP, PR_K_LP_RANKS };
enum {
  PR_K_ADD_ID,
  PR_K_ADD_PROMPT,
  PR_K_ADD_SAMPLING,
  PR_K_ADD_MAX_TOKENS,
  PR_K_ADD_MIN_TOKENS,
  PR_K_ADD_STOP_IDS,
  PR_K_ADD_PRIORITY,
  PR_K_ADD_ARRIVAL,
  PR_K_ADD_IMAGES,
  PR_K_ADD_CACHE_SALT,
  PR_K_ADD_LORA_SUM,
  PR_K_ADD_LORA_UID,
  PR_K_ADD_LORA_PATH
};
enum {
  PR_K_IMG_POS,
  PR_K_IMG_N_TOKENS,
  PR_K_IMG_HASH,
  PR_K_IMG_PIXELS,
  PR_K_IMG_WIDTH,
  PR_K_IMG_HEIGHT,
  PR_K_IMG_KIND
};
enum { PR_K_ABORT_IDS };
enum { PR_K_PING_NONCE, PR_K_PING_SEND };
enum { PR_K_DOWN_RANK, PR_K_DOWN_PID, PR_K_DOWN_MESSAGE };
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
  PR_K_OSEQ_FIRST_TOKEN,
  PR_K_OSEQ_PROMPT_LOGPROBS
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
  PR_K_PONG_KERNELS,
  PR_K_PONG_MATMUL_INPUTS,
  PR_K_PONG_MAX_NUM_SEQS,
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
  PR_K_SSEQ_SAMPLING,
  PR_K_SSEQ_IMAGES,
  PR_K_SSEQ_N_PROMPT,
  PR_K_SSEQ_GENERATED,
  PR_K_SSEQ_MAX_TOKENS,
  PR_K_SSEQ_BEFORE,
  PR_K_SSEQ_PROMPT_NEXT
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
  PR_K_READY_MAX_TOKENS,
  PR_K_READY_SHARD_SUM,
  PR_K_READY_PID,
  PR_K_READY_IMAGE_TOKENS,
  PR_K_READY_IMAGE_BYTES,
  PR_K_READY_KERNELS,
  PR_K_READY_MATMUL_INPUTS,
  PR_K_READY_IMAGE_VARSIZE,
  PR_K_READY_AUDIO_TOKENS,
  PR_K_READY_AUDIO_BYTES,
  PR_K_READY_N_LORA,
  PR_K_READY_LORA_SUM,
};
enum { PR_K_GRP_BLOCK_TOKENS, PR_K_GRP_LAYERS, PR_K_GRP_BYTES, PR_K_GRP_WINDOW };
enum { PR_K_RES_RANK, PR_K_RES_STEP, PR_K_RES_SEQS };
enum {
  PR_K_RSEQ_ID,
  PR_K_RSEQ_TOKENS,
  PR_K_RSEQ_ACCEPTED,
  PR_K_RSEQ_LOGPROBS,
  PR_K_RSEQ_DRAFTS,
  PR_K_RSEQ_VERIFIED,
  PR_K_RSEQ_PROMPT_LOGPROBS,
  PR_K_RSEQ_PROMPT_POS,
};
enum { PR_K_BEAT_RANK, PR_K_BEAT_STEP, PR_K_BEAT_TIME, PR_K_BEAT_FLAGS };
enum { PR_K_FAIL_RANK, PR_K_FAIL_STEP, PR_K_FAIL_CODE, PR_K_FAIL_MESSAGE };
enum { PR_K_DIST_RANK, PR_K_DIST_WORLD, PR_K_DIST_ID };
enum {
  PR_K_LORA_NONCE,
  PR_K_LORA_OP,
  PR_K_LORA_UID,
  PR_K_LORA_PATH,
  PR_K_LORA_RANK,
  PR_K_LORA_SLOT,
  PR_K_LORA_CODE,
  PR_K_LORA_MESSAGE
};

/* ---- field descriptors ---- */

enum pr_ft {
  PR_FT_NONE,   /* no field has this key: a decoder skips its value */
  PR_FT_UINT,   /* unsigned integer of `size` bytes (1, 4, 8) in [min, max] */
  PR_FT_INT,    /* signed integer of `size` bytes (4, 8) in [min, max] */
  PR_FT_BOOL,   /* bool */
  PR_FT_FLOAT,  /* float (size 4, float32 on the wire) or double (8, float64) in [lo, hi] */
  PR_FT_STR,    /* const char *: <= PR_MAX_STR bytes of UTF-8 without NUL */
  PR_FT_SLICE,  /* struct pr_u32s/_u64s/_i32s/_f32s (`num`): <= max_n entries,
                 * each in [min, max] (integers) or [lo, hi] (floats) */
  PR_FT_INLINE, /* uint64_t[max_n] in place, its uint32_t count at `count` */
  PR_FT_REC,    /* a record in place, described by `sub` */
  PR_FT_ARRAY,  /* a pointer to `count` (uint32_t) elements of `size` bytes,
                 * <= max_n, each described by `elem` at its offset 0 */
};

/* When a field is sent (pr_field_sent); a decoder accepts it either way. */
enum pr_when {
  PR_ALWAYS,
  PR_IF_FLAG,    /* when the bool at `cond` is true; decoding the field sets it */
  PR_IF_NONZERO, /* when the unsigned integer at `cond` (any width) is not 0 */
  PR_IF_BITS,    /* when the uint32_t at `cond` has a bit of `mask`; otherwise the
                  * field means nothing: a decoder resets it to its defaults and
                  * validation skips it */
  PR_IF_SET,     /* (strings) when not NULL; absent stays NULL, not "" */
};

enum {
  PR_F_REQ = 1 << 0,  /* a decoder refuses the record without it (CM_ERR_PARSE) */
  PR_F_ENUM = 1 << 1, /* values outside [min, max] are CM_ERR_UNKNOWN, not _RANGE */
};

struct pr_rec;

struct pr_field {
  uint8_t type;   /* enum pr_ft; 0 (PR_FT_NONE) for a key no field has */
  uint8_t num;    /* PR_FT_SLICE, PR_FT_INLINE: enum pr_num of the elements */
  uint8_t when;   /* enum pr_when */
  uint8_t flags;  /* PR_F_* */
  uint8_t any;    /* every value of the member is valid: validation skips it */
  uint8_t cond_size; /* bytes of what `when` tests (PR_IF_NONZERO: 1, 4 or 8) */
  uint32_t off;   /* bytes: offsetof the member in its record */
  uint32_t size;  /* bytes: of the member (numbers), of one element (PR_FT_ARRAY) */
  uint32_t count; /* bytes: offsetof the uint32_t count (PR_FT_INLINE, PR_FT_ARRAY) */
  uint32_t cond;  /* bytes: offsetof what `when` tests */
  uint32_t mask;  /* PR_IF_BITS */
  uint32_t max_n; /* entries at most (PR_FT_SLICE, PR_FT_INLINE, PR_FT_ARRAY) */
  int64_t min;    /* integers: value range (elements of integer slices) */
  uint64_t max;
  double lo, hi;               /* floats: value range (elements of float slices); NaN never */
  double def;                  /* the value of an absent number (0 unless given) */
  const struct pr_rec *sub;    /* PR_FT_REC */
  const struct pr_field *elem; /* PR_FT_ARRAY */
};

/* A record: its fields indexed by map key, keys 0 .. n_fields - 1. */
struct pr_rec {
  const struct pr_field *fields;
  uint32_t n_fields;
  uint32_t size; /* bytes of the C struct */
  /* What ties fields together, past each field's own bounds (checked
   * first); NULL when nothing does. Returns 0 or a negative cm_err code. */
  int (*check)(const void *rec);
};

#define PR_REC(S, fields_, check_)                                                                 \
  { (fields_), sizeof(fields_) / sizeof((fields_)[0]), sizeof(struct pr_##S), (check_) }

/* ---- table entries: [PR_K_X] = {PR_U(add, max_tokens), .flags = PR_F_REQ} ----
 * S names the record's struct (pr_S), m its member. */
#define PR_MEMBER_(S, m) (((struct pr_##S *)0)->m)
#define PR_AT_(S, m)     .off = offsetof(struct pr_##S, m), .size = sizeof(PR_MEMBER_(S, m))
#define PR_UMAX_(S, m)   (~0ull >> (64 - 8 * sizeof(PR_MEMBER_(S, m))))
#define PR_IMAX_(S, m)   (~0ull >> (65 - 8 * sizeof(PR_MEMBER_(S, m))))
/* unsigned in [0, max] or its whole range */
#define PR_UINT(S, m, max_) .type = PR_FT_UINT, PR_AT_(S, m), .max = (max_)
#define PR_U(S, m)          PR_UINT(S, m, PR_UMAX_(S, m)), .any = 1
/* signed in [min, max] or its whole range */
#define PR_INT(S, m, min_, max_) .type = PR_FT_INT, PR_AT_(S, m), .min = (min_), .max = (max_)
#define PR_I(S, m)               PR_INT(S, m, -(int64_t)PR_IMAX_(S, m) - 1, PR_IMAX_(S, m)), .any = 1
#define PR_BOOL(S, m)            .type = PR_FT_BOOL, PR_AT_(S, m), .any = 1
#define PR_FLOAT(S, m, lo_, hi_) .type = PR_FT_FLOAT, PR_AT_(S, m), .lo = (lo_), .hi = (hi_)
#define PR_STR(S, m)             .type = PR_FT_STR, PR_AT_(S, m)
/* slices: at most max_n entries (UINT32_MAX: as many as the bytes allow) */
#define PR_SLICE_(S, m, num_, max_n_)                                                              \
  .type = PR_FT_SLICE, .num = (num_), PR_AT_(S, m), .max_n = (max_n_)
#define PR_U32S(S, m, max_n_)   PR_SLICE_(S, m, PR_NUM_U32, max_n_), .max = UINT32_MAX
#define PR_U64S(S, m)           PR_SLICE_(S, m, PR_NUM_U64, UINT32_MAX), .max = UINT64_MAX
#define PR_F32S(S, m, lo_, hi_) PR_SLICE_(S, m, PR_NUM_F32, UINT32_MAX), .lo = (lo_), .hi = (hi_)
#define PR_BYTES(S, m)          PR_SLICE_(S, m, PR_NUM_U8, UINT32_MAX), .any = 1
/* uint64_t m[N] with its count n_m */
#define PR_INLINE_U64S(S, m, n_m)                                                                  \
  .type = PR_FT_INLINE, .num = PR_NUM_U64, PR_AT_(S, m), .count = offsetof(struct pr_##S, n_m),    \
  .max = UINT64_MAX, .any = 1, .max_n = sizeof(PR_MEMBER_(S, m)) / sizeof(PR_MEMBER_(S, m)[0])
#define PR_SUB(S, m, rec_) .type = PR_FT_REC, PR_AT_(S, m), .sub = &(rec_)
/* m points to n_m elements (<= max_n), each described by the field *elem_ */
#define PR_ARRAY(S, m, n_m, max_n_, elem_)                                                         \
  .type = PR_FT_ARRAY, .off = offsetof(struct pr_##S, m), .size = sizeof(*PR_MEMBER_(S, m)),       \
  .count = offsetof(struct pr_##S, n_m), .max_n = (max_n_), .elem = (elem_)
/* array elements: records of `rec_`; block-id slices (struct pr_i32s) >= min_ */
#define PR_ELEM_REC(rec_) (&(const struct pr_field){.type = PR_FT_REC, .sub = &(rec_)})
#define PR_ELEM_I32S(min_)                                                                         \
  (&(const struct pr_field){.type = PR_FT_SLICE,                                                   \
                            .num = PR_NUM_I32,                                                     \
                            .size = sizeof(struct pr_i32s),                                        \
                            .max_n = UINT32_MAX,                                                   \
                            .min = (min_),                                                         \
                            .max = INT32_MAX})
/* conditions */
#define PR_WHEN(when_, S, m)                                                                       \
  .when = (when_), .cond = offsetof(struct pr_##S, m), .cond_size = sizeof(PR_MEMBER_(S, m))

/* ---- reading and writing members (`at`: the member's first byte) ---- */

/* The four slice structs of pr-msg.h, seen alike: one pointer, one count. */
struct pr_slice {
  const void *v;
  uint32_t n;
};

static inline struct pr_slice pr_slice_get(const uint8_t *at) {
  struct pr_slice s;
  memcpy(&s, at, sizeof(s));
  return s;
}

static inline uint32_t pr_u32_get(const uint8_t *at) {
  uint32_t v;
  memcpy(&v, at, sizeof(v));
  return v;
}

static inline uint64_t pr_uint_get(const uint8_t *at, uint32_t size) {
  if (size == 1) return *at;
  if (size == 4) return pr_u32_get(at);
  uint64_t v;
  memcpy(&v, at, sizeof(v));
  return v;
}

static inline int64_t pr_int_get(const uint8_t *at, uint32_t size) {
  if (size == 4) return (int32_t)pr_u32_get(at);
  int64_t v;
  memcpy(&v, at, sizeof(v));
  return v;
}

static inline double pr_float_get(const uint8_t *at, uint32_t size) {
  if (size == 4) {
    float f;
    memcpy(&f, at, sizeof(f));
    return f;
  }
  double d;
  memcpy(&d, at, sizeof(d));
  return d;
}

/* Bytes of one element of a slice of `num` (enum pr_num). */
static inline size_t pr_num_size(unsigned num) {
  return num == PR_NUM_U64 ? sizeof(uint64_t) : num == PR_NUM_U8 ? 1 : sizeof(uint32_t);
}

static inline void pr_uint_set(uint8_t *at, uint32_t size, uint64_t v) {
  if (size == 1) {
    *at = (uint8_t)v;
  } else if (size == 4) {
    uint32_t x = (uint32_t)v;
    memcpy(at, &x, sizeof(x));
  } else {
    memcpy(at, &v, sizeof(v));
  }
}

/* Whether field f of the record at `rec` is sent. */
static inline int pr_field_sent(const struct pr_field *f, const uint8_t *rec) {
  switch (f->when) {
  case PR_IF_FLAG: return *(const bool *)(rec + f->cond);
  case PR_IF_NONZERO: return pr_uint_get(rec + f->cond, f->cond_size) != 0;
  case PR_IF_BITS: return (pr_u32_get(rec + f->cond) & f->mask) != 0;
  case PR_IF_SET: return *(const char *const *)(rec + f->off) != NULL;
  default: return 1;
  }
}

/* ---- bounds ---- */

static inline int pr_uint_in(const struct pr_field *f, uint64_t v) {
  return v >= (uint64_t)f->min && v <= f->max;
}
static inline int pr_int_in(const struct pr_field *f, int64_t v) {
  return v >= f->min && (v < 0 || (uint64_t)v <= f->max);
}
static inline int pr_float_in(const struct pr_field *f, double v) {
  return v >= f->lo && v <= f->hi; /* false for NaN */
}
/* The error for a number outside its field's range. */
static inline int pr_range_err(const struct pr_field *f) {
  return f->flags & PR_F_ENUM ? CM_ERR_UNKNOWN : CM_ERR_RANGE;
}

/* Each of the n numbers at v (a slice of field f) within f's bounds:
 * 0 or CM_ERR_RANGE (pr-codec.c). */
int pr_check_numbers(const struct pr_field *f, const void *v, uint32_t n);
/* s[0..n) is UTF-8 without NUL: 0 or CM_ERR_PARSE (pr-codec.c). */
int pr_check_utf8(const char *s, size_t n);
/* Logprobs over n_tokens tokens: empty or one per token (pr-msg-front.c). */
int pr_check_lp_tokens(const struct pr_logprobs *lp, uint32_t n_tokens);

/* ---- the records (pr-msg-front.c, pr-msg-work.c) ---- */
extern const struct pr_rec pr_rec_sampling, pr_rec_logprobs, pr_rec_image;
/* Images in order, their runs apart: 0 or CM_ERR_INVAL. */
int pr_check_images(const struct pr_image *v, uint32_t n);
extern const struct pr_rec pr_rec_add, pr_rec_abort, pr_rec_ping, pr_rec_down, pr_rec_out,
    pr_rec_err, pr_rec_pong, pr_rec_lora;
extern const struct pr_rec pr_rec_step, pr_rec_ctrl, pr_rec_ready, pr_rec_result, pr_rec_beat,
    pr_rec_fail, pr_rec_dist;

/* ---- the walkers ---- */

/* The record of message type t, NULL when t is unknown (pr-codec.c). */
const struct pr_rec *pr_rec_of(unsigned t);
/* Defaults (pr-codec.c), of a zeroed record, of field f of the zeroed record
 * at `rec` (0 unless its table says), and field f back to its default. */
void pr_rec_defaults(const struct pr_rec *rec, void *at);
void pr_field_default(const struct pr_field *f, void *rec);
void pr_field_reset(const struct pr_field *f, void *rec);
/* Holds the record at `at` to its table (each field's bounds, then
 * rec->check, through nested records) and, unless b is NULL, appends it to
 * b (pr-encode.c). Returns 0 or the first violation; check b->err after. */
int pr_rec_put(struct pr_buf *b, const struct pr_rec *rec, const void *at);
/* The same for field f of the record at `at`, its key already in b. */
int pr_field_put(struct pr_buf *b, const struct pr_field *f, const void *at);
/* Decodes one record, the top-level map being level 1 (pr-decode.c). */
int pr_rec_decode(struct pr_rd *r, struct cm_arena *a, const struct pr_rec *rec, void *at,
                  int level);
/* Field-by-field equality, floats bitwise (pr-msg-eq.c). */
bool pr_rec_equal(const struct pr_rec *rec, const void *x, const void *y);

#endif
