/* pr-msg-front.c — the records of the messages between frontend and
 * scheduler: ADD, ABORT, PING (frontend -> scheduler), DOWN (a supervisor ->
 * scheduler) and OUT, ERR, PONG (back), and the two records other messages
 * share, sampling parameters and logprobs. Each is a table of fields (pr-codec.h: key, type,
 * bounds, offset) plus, where fields depend on each other, a check; the walkers in pr-encode.c,
 * pr-decode.c, pr-codec.c and pr-msg-eq.c do the rest. */
#include <float.h>
#include <math.h>

#include "common/cm-err.h"
#include "proto/pr-codec.h"

/* ======================================================================== */
/* shared records                                                            */

/* Ranges are closed; (0, x] is written [FLT_TRUE_MIN, x]. */
static const struct pr_field sampling_fields[] = {
    [PR_K_SAMP_TEMPERATURE] = {PR_FLOAT(sampling, temperature, 0, FLT_MAX), .def = 1},
    [PR_K_SAMP_TOP_P] = {PR_FLOAT(sampling, top_p, FLT_TRUE_MIN, 1), .def = 1},
    [PR_K_SAMP_TOP_K] = {PR_INT(sampling, top_k, -1, INT32_MAX)},
    [PR_K_SAMP_MIN_P] = {PR_FLOAT(sampling, min_p, 0, 1)},
    [PR_K_SAMP_PRESENCE] = {PR_FLOAT(sampling, presence_penalty, -2, 2)},
    [PR_K_SAMP_FREQUENCY] = {PR_FLOAT(sampling, frequency_penalty, -2, 2)},
    [PR_K_SAMP_REPETITION] = {PR_FLOAT(sampling, repetition_penalty, FLT_TRUE_MIN, 100), .def = 1},
    [PR_K_SAMP_SEED] = {PR_U(sampling, seed), PR_WHEN(PR_IF_FLAG, sampling, has_seed)},
    [PR_K_SAMP_LOGPROBS] = {PR_INT(sampling, logprobs, -1, PR_MAX_TOP_LOGPROBS), .def = -1},
    [PR_K_SAMP_IGNORE_EOS] = {PR_BOOL(sampling, ignore_eos)},
    [PR_K_SAMP_GRAMMAR_KIND] = {PR_UINT(sampling, grammar_kind, PR_MAX_GRAMMAR_KIND),
                                PR_WHEN(PR_IF_NONZERO, sampling, grammar_kind)},
    [PR_K_SAMP_GRAMMAR] = {PR_SLICE_(sampling, grammar, PR_NUM_U8, PR_MAX_GRAMMAR_BYTES), .any = 1,
                           PR_WHEN(PR_IF_NONZERO, sampling, grammar_kind)},
    [PR_K_SAMP_BIAS_IDS] = {PR_U32S(sampling, bias_ids, PR_MAX_LOGIT_BIAS),
                            PR_WHEN(PR_IF_NONZERO, sampling, bias_ids.n)},
    [PR_K_SAMP_BIAS] = {PR_F32S(sampling, bias, -100, 100),
                        PR_WHEN(PR_IF_NONZERO, sampling, bias.n)},
    [PR_K_SAMP_BIAS_ONLY] = {PR_BOOL(sampling, bias_only),
                             PR_WHEN(PR_IF_NONZERO, sampling, bias_ids.n)},
    [PR_K_SAMP_BAD_IDS] = {PR_U32S(sampling, bad_ids, PR_MAX_BAD_WORD_IDS),
                           PR_WHEN(PR_IF_NONZERO, sampling, bad_ids.n)},
    [PR_K_SAMP_BAD_LENS] = {PR_SLICE_(sampling, bad_lens, PR_NUM_U32, PR_MAX_BAD_WORD_IDS),
                            .min = 1, .max = PR_MAX_BAD_WORD_LEN,
                            PR_WHEN(PR_IF_NONZERO, sampling, bad_lens.n)},
    [PR_K_SAMP_PROMPT_LOGPROBS] = {PR_INT(sampling, prompt_logprobs, -1, PR_MAX_TOP_LOGPROBS),
                                   .def = -1},
    [PR_K_SAMP_LORA] = {PR_UINT(sampling, lora, PR_MAX_LORAS),
                        PR_WHEN(PR_IF_NONZERO, sampling, lora)},
};

/* a grammar's text only with a kind (JSON mode has none); a bias per biased id;
 * bias_only with ids; bad_lens adding up to bad_ids */
static int check_sampling(const void *rec) {
  const struct pr_sampling *m = rec;
  uint64_t bad = 0;
  for (uint32_t i = 0; i < m->bad_lens.n; i++)
    bad += m->bad_lens.v[i];
  return (!m->grammar_kind && m->grammar.n) || m->bias.n != m->bias_ids.n ||
                 (m->bias_only && !m->bias_ids.n) || bad != m->bad_ids.n
             ? CM_ERR_INVAL
             : 0;
}
const struct pr_rec pr_rec_sampling = PR_REC(sampling, sampling_fields, check_sampling);

/* Logprob values: any float but NaN and +inf. */
static const struct pr_field logprobs_fields[] = {
    [PR_K_LP_N_TOP] = {PR_UINT(logprobs, n_top, PR_MAX_TOP_LOGPROBS)},
    [PR_K_LP_SAMPLED] = {PR_F32S(logprobs, sampled, -INFINITY, FLT_MAX)},
    [PR_K_LP_TOP_IDS] = {PR_U32S(logprobs, top_ids, UINT32_MAX)},
    [PR_K_LP_TOP] = {PR_F32S(logprobs, top, -INFINITY, FLT_MAX)},
    [PR_K_LP_RANKS] = {PR_SLICE_(logprobs, ranks, PR_NUM_U32, UINT32_MAX), .min = 1,
                       .max = UINT32_MAX, PR_WHEN(PR_IF_NONZERO, logprobs, ranks.n)},
};

/* Empty, or n_top entries per sampled token; agreement with the token count
 * is the enclosing record's to check (pr_check_lp_tokens). */
static int check_logprobs(const void *rec) {
  const struct pr_logprobs *lp = rec;
  if (lp->sampled.n == 0)
    return lp->n_top || lp->top_ids.n || lp->top.n || lp->ranks.n ? CM_ERR_INVAL : 0;
  uint64_t want = (uint64_t)lp->sampled.n * lp->n_top;
  if (lp->ranks.n && lp->ranks.n != lp->sampled.n) return CM_ERR_INVAL;
  return lp->top_ids.n == want && lp->top.n == want ? 0 : CM_ERR_INVAL;
}
const struct pr_rec pr_rec_logprobs = PR_REC(logprobs, logprobs_fields, check_logprobs);

int pr_check_lp_tokens(const struct pr_logprobs *lp, uint32_t n_tokens) {
  return lp->sampled.n == 0 || lp->sampled.n == n_tokens ? 0 : CM_ERR_INVAL;
}

/* ======================================================================== */
/* images (ADD and STEP)                                                     */

static const struct pr_field image_fields[] = {
    [PR_K_IMG_POS] = {PR_U(image, pos), .flags = PR_F_REQ},
    [PR_K_IMG_N_TOKENS] = {PR_UINT(image, n_tokens, UINT32_MAX), .min = 1, .flags = PR_F_REQ},
    [PR_K_IMG_HASH] = {PR_U(image, hash)},
    [PR_K_IMG_PIXELS] = {PR_BYTES(image, pixels)},
    [PR_K_IMG_WIDTH] = {PR_UINT(image, width, PR_MAX_IMAGE_SIDE),
                        PR_WHEN(PR_IF_NONZERO, image, width)},
    [PR_K_IMG_HEIGHT] = {PR_UINT(image, height, PR_MAX_IMAGE_SIDE),
                         PR_WHEN(PR_IF_NONZERO, image, height)},
    [PR_K_IMG_KIND] = {PR_UINT(image, kind, PR_MEDIA_MAX), PR_WHEN(PR_IF_NONZERO, image, kind)},
};

static int check_image(const void *rec) {
  const struct pr_image *m = rec;
  if ((uint64_t)m->pos + m->n_tokens > UINT32_MAX) return CM_ERR_RANGE;
  if (m->kind == PR_MEDIA_AUDIO) /* features [frames][mels] f32, then a mask byte a frame */
    return m->width && m->height &&
                   (uint64_t)m->height * ((uint64_t)m->width * 4 + 1) == m->pixels.n
               ? 0
               : CM_ERR_INVAL;
  /* a size is both sides or neither, and it is the pixels' */
  if ((m->width == 0) != (m->height == 0)) return CM_ERR_INVAL;
  if (m->width && (uint64_t)m->width * m->height * 3 != m->pixels.n) return CM_ERR_INVAL;
  return 0;
}
const struct pr_rec pr_rec_image = PR_REC(image, image_fields, check_image);

int pr_check_images(const struct pr_image *v, uint32_t n) {
  uint64_t end = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (v[i].pos < end) return CM_ERR_INVAL;
    end = (uint64_t)v[i].pos + v[i].n_tokens;
  }
  return 0;
}

/* ======================================================================== */
/* ADD, ABORT, PING                                                          */

static const struct pr_field add_fields[] = {
    [PR_K_ADD_ID] = {PR_U(add, request_id), .flags = PR_F_REQ},
    [PR_K_ADD_PROMPT] = {PR_U32S(add, prompt, UINT32_MAX), .flags = PR_F_REQ},
    [PR_K_ADD_SAMPLING] = {PR_SUB(add, sampling, pr_rec_sampling)},
    [PR_K_ADD_MAX_TOKENS] = {PR_UINT(add, max_tokens, UINT32_MAX), .min = 1, .flags = PR_F_REQ},
    [PR_K_ADD_MIN_TOKENS] = {PR_U(add, min_tokens)},
    [PR_K_ADD_STOP_IDS] = {PR_U32S(add, stop_token_ids, UINT32_MAX)},
    [PR_K_ADD_PRIORITY] = {PR_I(add, priority)},
    [PR_K_ADD_ARRIVAL] = {PR_U(add, arrival_ns)},
    [PR_K_ADD_IMAGES] = {PR_ARRAY(add, images, n_images, PR_MAX_IMAGES, PR_ELEM_REC(pr_rec_image)),
                         PR_WHEN(PR_IF_NONZERO, add, n_images)},
    [PR_K_ADD_CACHE_SALT] = {PR_U(add, cache_salt), PR_WHEN(PR_IF_NONZERO, add, cache_salt)},
    [PR_K_ADD_LORA_SUM] = {PR_U(add, lora_sum), PR_WHEN(PR_IF_NONZERO, add, lora_sum)},
    [PR_K_ADD_LORA_UID] = {PR_U(add, lora_uid), PR_WHEN(PR_IF_NONZERO, add, lora_uid)},
    [PR_K_ADD_LORA_PATH] = {PR_STR(add, lora_path), .when = PR_IF_SET},
};

static int check_add(const void *rec) {
  const struct pr_add *m = rec;
  if (m->prompt.n == 0) return CM_ERR_INVAL;
  if (m->min_tokens > m->max_tokens) return CM_ERR_RANGE;
  /* a run-time adapter: its id and its path, and no adapter of the list besides */
  if (!m->lora_uid != !(m->lora_path && *m->lora_path)) return CM_ERR_INVAL;
  if (m->lora_uid && (m->sampling.lora || m->lora_sum)) return CM_ERR_INVAL;
  PR_TRY(pr_check_images(m->images, m->n_images));
  return m->n_images && (uint64_t)m->images[m->n_images - 1].pos +
                                m->images[m->n_images - 1].n_tokens > m->prompt.n
             ? CM_ERR_RANGE
             : 0;
}
const struct pr_rec pr_rec_add = PR_REC(add, add_fields, check_add);

static const struct pr_field abort_fields[] = {
    [PR_K_ABORT_IDS] = {PR_U64S(abort, request_ids)},
};
const struct pr_rec pr_rec_abort = PR_REC(abort, abort_fields, NULL);

static const struct pr_field ping_fields[] = {
    [PR_K_PING_NONCE] = {PR_U(ping, nonce)},
    [PR_K_PING_SEND] = {PR_U(ping, send_ns)},
};
const struct pr_rec pr_rec_ping = PR_REC(ping, ping_fields, NULL);

/* LORA, LORA_DONE and LORA_ACK: one record, each message sending what it has (a field
 * at its default is left out). */
static const struct pr_field lora_fields[] = {
    [PR_K_LORA_NONCE] = {PR_U(lora, nonce)},
    [PR_K_LORA_OP] = {PR_UINT(lora, op, PR_LORA_UNLOAD), .flags = PR_F_ENUM},
    [PR_K_LORA_UID] = {PR_U(lora, uid)},
    [PR_K_LORA_PATH] = {PR_STR(lora, path), .when = PR_IF_SET},
    [PR_K_LORA_RANK] = {PR_U(lora, rank)},
    [PR_K_LORA_SLOT] = {PR_UINT(lora, slot, PR_MAX_LORAS)},
    [PR_K_LORA_CODE] = {PR_I(lora, code)},
    [PR_K_LORA_MESSAGE] = {PR_STR(lora, message)},
};
const struct pr_rec pr_rec_lora = PR_REC(lora, lora_fields, NULL);

/* The message as in ERR: never NULL after decoding, NULL sent as "". */
static const struct pr_field down_fields[] = {
    [PR_K_DOWN_RANK] = {PR_U(down, rank), .flags = PR_F_REQ},
    [PR_K_DOWN_PID] = {PR_U(down, pid)},
    [PR_K_DOWN_MESSAGE] = {PR_STR(down, message)},
};
const struct pr_rec pr_rec_down = PR_REC(down, down_fields, NULL);

/* ======================================================================== */
/* OUT, ERR, PONG                                                            */

static const struct pr_field out_seq_fields[] = {
    [PR_K_OSEQ_ID] = {PR_U(out_seq, request_id), .flags = PR_F_REQ},
    [PR_K_OSEQ_TOKENS] = {PR_U32S(out_seq, tokens, UINT32_MAX)},
    [PR_K_OSEQ_LOGPROBS] = {PR_SUB(out_seq, logprobs, pr_rec_logprobs),
                            PR_WHEN(PR_IF_NONZERO, out_seq, logprobs.sampled.n)},
    [PR_K_OSEQ_FINISH] = {PR_UINT(out_seq, finish, PR_FINISH_ERROR)},
    [PR_K_OSEQ_STOP_TOKEN] = {PR_INT(out_seq, stop_token, -1, UINT32_MAX), .def = -1},
    [PR_K_OSEQ_N_PROMPT] = {PR_U(out_seq, n_prompt_tokens)},
    [PR_K_OSEQ_N_CACHED] = {PR_U(out_seq, n_cached_tokens)},
    [PR_K_OSEQ_QUEUED] = {PR_U(out_seq, queued_ns)},
    [PR_K_OSEQ_SCHEDULED] = {PR_U(out_seq, scheduled_ns)},
    [PR_K_OSEQ_FIRST_TOKEN] = {PR_U(out_seq, first_token_ns)},
    [PR_K_OSEQ_PROMPT_LOGPROBS] = {PR_SUB(out_seq, prompt_logprobs, pr_rec_logprobs),
                                   PR_WHEN(PR_IF_NONZERO, out_seq, prompt_logprobs.sampled.n)},
};

static int check_out_seq(const void *rec) {
  const struct pr_out_seq *s = rec;
  PR_TRY(pr_check_lp_tokens(&s->logprobs, s->tokens.n));
  if ((uint64_t)s->prompt_logprobs.sampled.n + 1 > (uint64_t)s->n_prompt_tokens &&
      s->prompt_logprobs.sampled.n)
    return CM_ERR_RANGE;
  return s->n_cached_tokens > s->n_prompt_tokens ? CM_ERR_RANGE : 0;
}
static const struct pr_rec out_seq_rec = PR_REC(out_seq, out_seq_fields, check_out_seq);

static const struct pr_field out_fields[] = {
    [PR_K_OUT_SEQS] = {PR_ARRAY(out, seqs, n_seqs, UINT32_MAX, PR_ELEM_REC(out_seq_rec))},
};
const struct pr_rec pr_rec_out = PR_REC(out, out_fields, NULL);

/* The message is never NULL after decoding ("" when absent); NULL is sent as "". */
static const struct pr_field err_fields[] = {
    [PR_K_ERR_ID] = {PR_U(err, request_id)},
    [PR_K_ERR_CODE] = {PR_I(err, code), .flags = PR_F_REQ},
    [PR_K_ERR_MESSAGE] = {PR_STR(err, message)},
};
const struct pr_rec pr_rec_err = PR_REC(err, err_fields, NULL);

/* A flat record of counters. spec_accepted_per_pos sends at most its
 * capacity (PR_MAX_DRAFT) entries whatever n_spec_pos says. */
static const struct pr_field pong_fields[] = {
    [PR_K_PONG_NONCE] = {PR_U(pong, nonce)},
    [PR_K_PONG_PING_SEND] = {PR_U(pong, ping_send_ns)},
    [PR_K_PONG_RUNNING] = {PR_U(pong, num_running)},
    [PR_K_PONG_WAITING] = {PR_U(pong, num_waiting)},
    [PR_K_PONG_KV_USAGE] = {PR_FLOAT(pong, kv_usage, 0, 1)},
    [PR_K_PONG_WORKERS_READY] = {PR_U(pong, workers_ready)},
    [PR_K_PONG_WORLD_SIZE] = {PR_U(pong, world_size)},
    [PR_K_PONG_MAX_MODEL_LEN] = {PR_U(pong, max_model_len)},
    [PR_K_PONG_PC_QUERIES] = {PR_U(pong, prefix_cache_queries)},
    [PR_K_PONG_PC_HITS] = {PR_U(pong, prefix_cache_hits)},
    [PR_K_PONG_PREEMPTIONS] = {PR_U(pong, num_preemptions)},
    [PR_K_PONG_SPEC_DRAFTS] = {PR_U(pong, spec_num_drafts)},
    [PR_K_PONG_SPEC_DRAFT_TOKENS] = {PR_U(pong, spec_num_draft_tokens)},
    [PR_K_PONG_SPEC_ACCEPTED] = {PR_U(pong, spec_num_accepted_tokens)},
    [PR_K_PONG_PROMPT_TOKENS] = {PR_U(pong, prompt_tokens)},
    [PR_K_PONG_GEN_TOKENS] = {PR_U(pong, generation_tokens)},
    [PR_K_PONG_SPEC_ACCEPTED_POS] = {PR_INLINE_U64S(pong, spec_accepted_per_pos, n_spec_pos)},
    [PR_K_PONG_KERNELS] = {PR_STR(pong, kernels), .when = PR_IF_SET},
    [PR_K_PONG_MATMUL_INPUTS] = {PR_STR(pong, matmul_inputs), .when = PR_IF_SET},
    [PR_K_PONG_MAX_NUM_SEQS] = {PR_U(pong, max_num_seqs)},
};

static int check_pong(const void *rec) {
  const struct pr_pong *m = rec;
  return m->workers_ready > m->world_size ? CM_ERR_RANGE : 0;
}
const struct pr_rec pr_rec_pong = PR_REC(pong, pong_fields, check_pong);
