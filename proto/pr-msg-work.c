/* pr-msg-work.c — the records of the messages between scheduler and
 * workers: STEP, CTRL (scheduler -> workers), READY, RESULT, BEAT, FAIL
 * (back) and DIST (both ways, at start-up). Each is a table of fields (pr-codec.h: key, type,
 * bounds, offset) plus, where fields depend on each other, a check; the walkers in pr-encode.c,
 * pr-decode.c, pr-codec.c and pr-msg-eq.c do the rest. */
#include "common/cm-err.h"
#include "proto/pr-codec.h"

/* ======================================================================== */
/* STEP, CTRL                                                                */

/* Sampling parameters travel only with PR_SEQ_NEW (the worker keeps them for
 * the sequence's life); a decoder resets them to the defaults otherwise. */
static const struct pr_field step_seq_fields[] = {
    [PR_K_SSEQ_ID] = {PR_U(step_seq, seq_id), .flags = PR_F_REQ},
    [PR_K_SSEQ_FLAGS] = {PR_UINT(step_seq, flags, PR_SEQ_FLAGS_ALL)},
    [PR_K_SSEQ_START] = {PR_U(step_seq, start_pos)},
    [PR_K_SSEQ_TOKENS] = {PR_U32S(step_seq, tokens, UINT32_MAX)},
    [PR_K_SSEQ_DRAFTS] = {PR_U32S(step_seq, draft_tokens, PR_MAX_DRAFT)},
    [PR_K_SSEQ_NUM_DRAFT] = {PR_UINT(step_seq, num_draft, PR_MAX_DRAFT)},
    /* block ids, -1 where the sliding window freed the block */
    [PR_K_SSEQ_TABLES] = {PR_ARRAY(step_seq, block_tables, n_groups, PR_MAX_KV_GROUPS,
                                   PR_ELEM_I32S(-1))},
    [PR_K_SSEQ_SAMPLING] = {PR_SUB(step_seq, sampling, pr_rec_sampling),
                            PR_WHEN(PR_IF_BITS, step_seq, flags), .mask = PR_SEQ_NEW},
    [PR_K_SSEQ_IMAGES] = {PR_ARRAY(step_seq, images, n_images, PR_MAX_IMAGES,
                                   PR_ELEM_REC(pr_rec_image)),
                          PR_WHEN(PR_IF_NONZERO, step_seq, n_images)},
    [PR_K_SSEQ_N_PROMPT] = {PR_U(step_seq, num_prompt), PR_WHEN(PR_IF_BITS, step_seq, flags),
                            .mask = PR_SEQ_NEW},
    [PR_K_SSEQ_GENERATED] = {PR_U32S(step_seq, generated, UINT32_MAX),
                             PR_WHEN(PR_IF_BITS, step_seq, flags), .mask = PR_SEQ_NEW},
    [PR_K_SSEQ_MAX_TOKENS] = {PR_U(step_seq, max_tokens), PR_WHEN(PR_IF_BITS, step_seq, flags),
                              .mask = PR_SEQ_NEW},
    [PR_K_SSEQ_BEFORE] = {PR_U32S(step_seq, before, UINT32_MAX),
                          PR_WHEN(PR_IF_BITS, step_seq, flags), .mask = PR_SEQ_NEW},
    [PR_K_SSEQ_PROMPT_NEXT] = {PR_U(step_seq, prompt_next), PR_WHEN(PR_IF_BITS, step_seq, flags),
                               .mask = PR_SEQ_SCORE},
};

static int check_step_seq(const void *rec) {
  const struct pr_step_seq *s = rec;
  if ((s->flags & PR_SEQ_NEW) && (s->flags & PR_SEQ_APPEND_BLOCKS)) return CM_ERR_INVAL;
  if (s->before.n && s->before.n != s->start_pos) return CM_ERR_INVAL;
  if ((s->flags & PR_SEQ_PREV_DRAFTS) &&
      (!(s->flags & PR_SEQ_PREV_TOKEN) || s->draft_tokens.n || !s->num_draft))
    return CM_ERR_INVAL;
  /* a prompt chunk's rows are scored; no drafts among them */
  if ((s->flags & PR_SEQ_SCORE) &&
      (!(s->flags & PR_SEQ_PREFILL) || (s->flags & PR_SEQ_PREV_TOKEN) || s->draft_tokens.n))
    return CM_ERR_INVAL;
  PR_TRY(pr_check_images(s->images, s->n_images));
  /* each image ends inside the step's tokens */
  uint64_t end = (uint64_t)s->start_pos + s->tokens.n;
  for (uint32_t i = 0; i < s->n_images; i++)
    if ((uint64_t)s->images[i].pos + s->images[i].n_tokens > end ||
        (uint64_t)s->images[i].pos + s->images[i].n_tokens <= s->start_pos)
      return CM_ERR_RANGE;
  return 0;
}
static const struct pr_rec step_seq_rec = PR_REC(step_seq, step_seq_fields, check_step_seq);

static const struct pr_field step_fields[] = {
    [PR_K_STEP_ID] = {PR_U(step, step_id), .flags = PR_F_REQ},
    [PR_K_STEP_SEQS] = {PR_ARRAY(step, seqs, n_seqs, UINT32_MAX, PR_ELEM_REC(step_seq_rec))},
    [PR_K_STEP_FREE] = {PR_U64S(step, free_ids)},
};
const struct pr_rec pr_rec_step = PR_REC(step, step_fields, NULL);

static const struct pr_field ctrl_fields[] = {
    [PR_K_CTRL_OP] = {PR_UINT(ctrl, op, PR_CTRL_OP_MAX), .min = 1, .flags = PR_F_REQ | PR_F_ENUM},
    [PR_K_CTRL_ARG] = {PR_I(ctrl, arg)},
    [PR_K_CTRL_TEXT] = {PR_STR(ctrl, text), .when = PR_IF_SET},
};
const struct pr_rec pr_rec_ctrl = PR_REC(ctrl, ctrl_fields, NULL);

/* ======================================================================== */
/* READY                                                                     */

static const struct pr_field kv_group_fields[] = {
    [PR_K_GRP_BLOCK_TOKENS] = {PR_UINT(kv_group, block_tokens, UINT32_MAX), .min = 1},
    [PR_K_GRP_LAYERS] = {PR_U(kv_group, n_layers)},
    [PR_K_GRP_BYTES] = {PR_U(kv_group, bytes_per_token)},
    [PR_K_GRP_WINDOW] = {PR_U(kv_group, sliding_window)},
};
static const struct pr_rec kv_group_rec = PR_REC(kv_group, kv_group_fields, NULL);

static const struct pr_field ready_fields[] = {
    [PR_K_READY_RANK] = {PR_U(ready, rank), .flags = PR_F_REQ},
    [PR_K_READY_WORLD] = {PR_UINT(ready, world_size, UINT32_MAX), .min = 1, .flags = PR_F_REQ},
    [PR_K_READY_BLOCKS] = {PR_U(ready, kv_blocks)},
    [PR_K_READY_GROUPS] = {PR_ARRAY(ready, groups, n_groups, PR_MAX_KV_GROUPS,
                                    PR_ELEM_REC(kv_group_rec)),
                           .flags = PR_F_REQ},
    [PR_K_READY_VOCAB] = {PR_U(ready, vocab_size)},
    [PR_K_READY_MAX_LEN] = {PR_U(ready, max_model_len)},
    [PR_K_READY_EOS] = {PR_U32S(ready, eos_ids, UINT32_MAX)},
    [PR_K_READY_MAX_DRAFT] = {PR_UINT(ready, max_draft, PR_MAX_DRAFT)},
    [PR_K_READY_MAX_SEQS] = {PR_U(ready, max_num_seqs)},
    [PR_K_READY_MAX_TOKENS] = {PR_U(ready, max_num_batched_tokens)},
    [PR_K_READY_SHARD_SUM] = {PR_U(ready, shard_sum)},
    [PR_K_READY_PID] = {PR_U(ready, pid)},
    [PR_K_READY_IMAGE_TOKENS] = {PR_U(ready, image_tokens),
                                 PR_WHEN(PR_IF_NONZERO, ready, image_tokens)},
    [PR_K_READY_IMAGE_BYTES] = {PR_U(ready, image_bytes),
                                PR_WHEN(PR_IF_NONZERO, ready, image_bytes)},
    [PR_K_READY_KERNELS] = {PR_STR(ready, kernels), .when = PR_IF_SET},
    [PR_K_READY_MATMUL_INPUTS] = {PR_STR(ready, matmul_inputs), .when = PR_IF_SET},
    [PR_K_READY_IMAGE_VARSIZE] = {PR_UINT(ready, image_varsize, 1),
                                  PR_WHEN(PR_IF_NONZERO, ready, image_varsize)},
    [PR_K_READY_AUDIO_TOKENS] = {PR_U(ready, audio_tokens),
                                 PR_WHEN(PR_IF_NONZERO, ready, audio_tokens)},
    [PR_K_READY_AUDIO_BYTES] = {PR_U(ready, audio_bytes),
                                PR_WHEN(PR_IF_NONZERO, ready, audio_bytes)},
    [PR_K_READY_N_LORA] = {PR_UINT(ready, n_lora, PR_MAX_LORAS),
                           PR_WHEN(PR_IF_NONZERO, ready, n_lora)},
    [PR_K_READY_LORA_SUM] = {PR_U(ready, lora_sum), PR_WHEN(PR_IF_NONZERO, ready, lora_sum)},
};

static int check_ready(const void *rec) {
  const struct pr_ready *m = rec;
  return m->rank >= m->world_size || m->n_groups == 0 ? CM_ERR_RANGE : 0;
}
const struct pr_rec pr_rec_ready = PR_REC(ready, ready_fields, check_ready);

/* ======================================================================== */
/* RESULT, BEAT, FAIL                                                        */

static const struct pr_field result_seq_fields[] = {
    [PR_K_RSEQ_ID] = {PR_U(result_seq, seq_id), .flags = PR_F_REQ},
    [PR_K_RSEQ_TOKENS] = {PR_U32S(result_seq, tokens, PR_MAX_DRAFT + 1)},
    [PR_K_RSEQ_ACCEPTED] = {PR_U(result_seq, num_accepted)},
    [PR_K_RSEQ_LOGPROBS] = {PR_SUB(result_seq, logprobs, pr_rec_logprobs),
                            PR_WHEN(PR_IF_NONZERO, result_seq, logprobs.sampled.n)},
    [PR_K_RSEQ_DRAFTS] = {PR_U32S(result_seq, drafts, PR_MAX_DRAFT)},
    [PR_K_RSEQ_VERIFIED] = {PR_UINT(result_seq, num_verified, PR_MAX_DRAFT),
                            PR_WHEN(PR_IF_NONZERO, result_seq, num_verified)},
    [PR_K_RSEQ_PROMPT_LOGPROBS] = {PR_SUB(result_seq, prompt_logprobs, pr_rec_logprobs),
                                   PR_WHEN(PR_IF_NONZERO, result_seq, prompt_logprobs.sampled.n)},
    [PR_K_RSEQ_PROMPT_POS] = {PR_U(result_seq, prompt_pos),
                              PR_WHEN(PR_IF_NONZERO, result_seq, prompt_logprobs.sampled.n)},
};

static int check_result_seq(const void *rec) {
  const struct pr_result_seq *s = rec;
  if (s->num_accepted > s->tokens.n || s->num_accepted > s->num_verified) return CM_ERR_RANGE;
  /* scored prompt tokens are past the first */
  if (s->prompt_logprobs.sampled.n && s->prompt_pos == 0) return CM_ERR_RANGE;
  return pr_check_lp_tokens(&s->logprobs, s->tokens.n);
}
static const struct pr_rec result_seq_rec = PR_REC(result_seq, result_seq_fields, check_result_seq);

static const struct pr_field result_fields[] = {
    [PR_K_RES_RANK] = {PR_U(result, rank)},
    [PR_K_RES_STEP] = {PR_U(result, step_id), .flags = PR_F_REQ},
    [PR_K_RES_SEQS] = {PR_ARRAY(result, seqs, n_seqs, UINT32_MAX, PR_ELEM_REC(result_seq_rec))},
};
const struct pr_rec pr_rec_result = PR_REC(result, result_fields, NULL);

static const struct pr_field beat_fields[] = {
    [PR_K_BEAT_RANK] = {PR_U(beat, rank), .flags = PR_F_REQ},
    [PR_K_BEAT_STEP] = {PR_U(beat, last_step_id)},
    [PR_K_BEAT_TIME] = {PR_U(beat, time_ns)},
    [PR_K_BEAT_FLAGS] = {PR_UINT(beat, flags, PR_BEAT_FLAGS_ALL)},
};
const struct pr_rec pr_rec_beat = PR_REC(beat, beat_fields, NULL);

/* The message as in ERR: never NULL after decoding, NULL sent as "". */
static const struct pr_field fail_fields[] = {
    [PR_K_FAIL_RANK] = {PR_U(fail, rank), .flags = PR_F_REQ},
    [PR_K_FAIL_STEP] = {PR_U(fail, step_id)},
    [PR_K_FAIL_CODE] = {PR_I(fail, code), .flags = PR_F_REQ},
    [PR_K_FAIL_MESSAGE] = {PR_STR(fail, message)},
};
const struct pr_rec pr_rec_fail = PR_REC(fail, fail_fields, NULL);

/* ======================================================================== */
/* DIST                                                                      */

static const struct pr_field dist_fields[] = {
    [PR_K_DIST_RANK] = {PR_U(dist, rank), .flags = PR_F_REQ},
    [PR_K_DIST_WORLD] = {PR_UINT(dist, world_size, UINT32_MAX), .min = 1, .flags = PR_F_REQ},
    [PR_K_DIST_ID] = {PR_U32S(dist, comm_id, PR_MAX_COMM_ID)},
};

static int check_dist(const void *rec) {
  const struct pr_dist *m = rec;
  return m->rank >= m->world_size ? CM_ERR_RANGE : 0;
}
const struct pr_rec pr_rec_dist = PR_REC(dist, dist_fields, check_dist);
