/* pr-msg-work.c — codec of the messages between scheduler and workers:
 * STEP, CTRL (scheduler -> workers) and READY, RESULT, BEAT, FAIL (back).
 * Each message has an encoder, a bounded decoder and a validator; the key
 * tables are in pr-codec.h. */
#include <string.h>

#include "common/cm-err.h"
#include "proto/pr-codec.h"

/* ======================================================================== */
/* STEP                                                                      */

/* Sampling parameters travel only with PR_SEQ_NEW (the worker keeps them for
 * the sequence's life); a decoder resets them to the defaults otherwise. */
static void enc_step_seq(struct pr_buf *b, const struct pr_step_seq *s) {
  bool samp = (s->flags & PR_SEQ_NEW) != 0;
  pr_wr_map(b, samp ? 8 : 7);
  pr_wr_uint(b, PR_K_SSEQ_ID), pr_wr_uint(b, s->seq_id);
  pr_wr_uint(b, PR_K_SSEQ_FLAGS), pr_wr_uint(b, s->flags);
  pr_wr_uint(b, PR_K_SSEQ_START), pr_wr_uint(b, s->start_pos);
  pr_wr_uint(b, PR_K_SSEQ_TOKENS), pr_enc_u32s(b, s->tokens);
  pr_wr_uint(b, PR_K_SSEQ_DRAFTS), pr_enc_u32s(b, s->draft_tokens);
  pr_wr_uint(b, PR_K_SSEQ_NUM_DRAFT), pr_wr_uint(b, s->num_draft);
  pr_wr_uint(b, PR_K_SSEQ_TABLES), pr_wr_array(b, s->n_groups);
  for (uint32_t g = 0; g < s->n_groups; g++)
    pr_enc_i32s(b, s->block_tables[g]);
  if (samp) pr_wr_uint(b, PR_K_SSEQ_SAMPLING), pr_enc_sampling(b, &s->sampling);
}

void pr_enc_step(struct pr_buf *b, const struct pr_step *m) {
  pr_wr_map(b, 3);
  pr_wr_uint(b, PR_K_STEP_ID), pr_wr_uint(b, m->step_id);
  pr_wr_uint(b, PR_K_STEP_SEQS), pr_wr_array(b, m->n_seqs);
  for (uint32_t i = 0; i < m->n_seqs; i++)
    enc_step_seq(b, &m->seqs[i]);
  pr_wr_uint(b, PR_K_STEP_FREE), pr_enc_u64s(b, m->free_ids);
}

static int dec_step_seq(struct pr_rd *r, struct cm_arena *a, struct pr_step_seq *s) {
  uint64_t seen = 0, v;
  uint32_t n, k;
  int pr_rc_loop;
  void *mem;
  pr_sampling_default(&s->sampling);
  PR_MAP_FOR(r, PR_LVL_REC, seen, n, i, k) {
    switch (k) {
    case PR_KEY_NONE: break;
    case PR_K_SSEQ_ID: PR_TRY(pr_rd_u64(r, &s->seq_id)); break;
    case PR_K_SSEQ_FLAGS:
      PR_TRY(pr_rd_uint(r, PR_SEQ_FLAGS_ALL, &v));
      s->flags = (uint32_t)v;
      break;
    case PR_K_SSEQ_START: PR_TRY(pr_rd_u32(r, &s->start_pos)); break;
    case PR_K_SSEQ_TOKENS: PR_TRY(pr_dec_u32s(r, a, UINT32_MAX, &s->tokens)); break;
    case PR_K_SSEQ_DRAFTS: PR_TRY(pr_dec_u32s(r, a, PR_MAX_DRAFT, &s->draft_tokens)); break;
    case PR_K_SSEQ_NUM_DRAFT:
      PR_TRY(pr_rd_uint(r, PR_MAX_DRAFT, &v));
      s->num_draft = (uint32_t)v;
      break;
    case PR_K_SSEQ_TABLES:
      PR_TRY(pr_rd_array(r, &s->n_groups));
      if (s->n_groups > PR_MAX_KV_GROUPS) return CM_ERR_TOOBIG;
      PR_TRY(pr_dec_records(a, s->n_groups, sizeof(*s->block_tables), &mem));
      s->block_tables = mem;
      for (uint32_t g = 0; g < s->n_groups; g++)
        PR_TRY(pr_dec_blocks(r, a, &s->block_tables[g]));
      break;
    case PR_K_SSEQ_SAMPLING: PR_TRY(pr_dec_sampling(r, PR_LVL_REC + 1, &s->sampling)); break;
    default: PR_TRY(pr_dec_skip(r, PR_LVL_REC)); break;
    }
  }
  if (!(s->flags & PR_SEQ_NEW)) pr_sampling_default(&s->sampling);
  return seen & PR_BIT(PR_K_SSEQ_ID) ? 0 : CM_ERR_PARSE;
}

int pr_dec_step(struct pr_rd *r, struct cm_arena *a, struct pr_step *m) {
  uint64_t seen = 0;
  uint32_t n, k;
  int pr_rc_loop;
  void *mem;
  PR_MAP_FOR(r, PR_LVL_TOP, seen, n, i, k) {
    switch (k) {
    case PR_KEY_NONE: break;
    case PR_K_STEP_ID: PR_TRY(pr_rd_u64(r, &m->step_id)); break;
    case PR_K_STEP_SEQS:
      PR_TRY(pr_rd_array(r, &m->n_seqs));
      PR_TRY(pr_dec_records(a, m->n_seqs, sizeof(*m->seqs), &mem));
      m->seqs = mem;
      for (uint32_t j = 0; j < m->n_seqs; j++)
        PR_TRY(dec_step_seq(r, a, &m->seqs[j]));
      break;
    case PR_K_STEP_FREE: PR_TRY(pr_dec_u64s(r, a, &m->free_ids)); break;
    default: PR_TRY(pr_dec_skip(r, PR_LVL_TOP)); break;
    }
  }
  return seen & PR_BIT(PR_K_STEP_ID) ? 0 : CM_ERR_PARSE;
}

int pr_check_step(const struct pr_step *m) {
  PR_TRY(pr_check_slice(m->seqs, m->n_seqs));
  PR_TRY(pr_check_slice(m->free_ids.v, m->free_ids.n));
  for (uint32_t i = 0; i < m->n_seqs; i++) {
    const struct pr_step_seq *s = &m->seqs[i];
    if (s->flags & ~(uint32_t)PR_SEQ_FLAGS_ALL) return CM_ERR_RANGE;
    if ((s->flags & PR_SEQ_NEW) && (s->flags & PR_SEQ_APPEND_BLOCKS)) return CM_ERR_INVAL;
    PR_TRY(pr_check_slice(s->tokens.v, s->tokens.n));
    PR_TRY(pr_check_slice(s->draft_tokens.v, s->draft_tokens.n));
    PR_TRY(pr_check_slice(s->block_tables, s->n_groups));
    if (s->draft_tokens.n > PR_MAX_DRAFT || s->num_draft > PR_MAX_DRAFT) return CM_ERR_RANGE;
    if (s->n_groups > PR_MAX_KV_GROUPS) return CM_ERR_RANGE;
    for (uint32_t g = 0; g < s->n_groups; g++) {
      struct pr_i32s t = s->block_tables[g];
      PR_TRY(pr_check_slice(t.v, t.n));
      for (uint32_t j = 0; j < t.n; j++)
        if (t.v[j] < -1) return CM_ERR_RANGE;
    }
    if (s->flags & PR_SEQ_NEW) PR_TRY(pr_check_sampling(&s->sampling));
  }
  return 0;
}

/* ======================================================================== */
/* CTRL                                                                      */

void pr_enc_ctrl(struct pr_buf *b, const struct pr_ctrl *m) {
  pr_wr_map(b, m->text ? 3 : 2);
  pr_wr_uint(b, PR_K_CTRL_OP), pr_wr_uint(b, m->op);
  pr_wr_uint(b, PR_K_CTRL_ARG), pr_wr_int(b, m->arg);
  if (m->text) pr_wr_uint(b, PR_K_CTRL_TEXT), pr_enc_str(b, m->text);
}

int pr_dec_ctrl(struct pr_rd *r, struct cm_arena *a, struct pr_ctrl *m) {
  uint64_t seen = 0, v;
  uint32_t n, k;
  int pr_rc_loop;
  PR_MAP_FOR(r, PR_LVL_TOP, seen, n, i, k) {
    switch (k) {
    case PR_KEY_NONE: break;
    case PR_K_CTRL_OP:
      PR_TRY(pr_rd_uint(r, UINT32_MAX, &v));
      if (v == 0 || v > PR_CTRL_OP_MAX) return CM_ERR_UNKNOWN;
      m->op = (uint32_t)v;
      break;
    case PR_K_CTRL_ARG: PR_TRY(pr_rd_int(r, INT64_MIN, INT64_MAX, &m->arg)); break;
    case PR_K_CTRL_TEXT: PR_TRY(pr_dec_str(r, a, &m->text)); break;
    default: PR_TRY(pr_dec_skip(r, PR_LVL_TOP)); break;
    }
  }
  return seen & PR_BIT(PR_K_CTRL_OP) ? 0 : CM_ERR_PARSE;
}

int pr_check_ctrl(const struct pr_ctrl *m) {
  if (m->op == 0 || m->op > PR_CTRL_OP_MAX) return CM_ERR_UNKNOWN;
  return pr_check_str(m->text);
}

/* ======================================================================== */
/* READY                                                                     */

void pr_enc_ready(struct pr_buf *b, const struct pr_ready *m) {
  pr_wr_map(b, 10);
  pr_wr_uint(b, PR_K_READY_RANK), pr_wr_uint(b, m->rank);
  pr_wr_uint(b, PR_K_READY_WORLD), pr_wr_uint(b, m->world_size);
  pr_wr_uint(b, PR_K_READY_BLOCKS), pr_wr_uint(b, m->kv_blocks);
  pr_wr_uint(b, PR_K_READY_GROUPS), pr_wr_array(b, m->n_groups);
  for (uint32_t g = 0; g < m->n_groups; g++) {
    const struct pr_kv_group *kg = &m->groups[g];
    pr_wr_map(b, 4);
    pr_wr_uint(b, PR_K_GRP_BLOCK_TOKENS), pr_wr_uint(b, kg->block_tokens);
    pr_wr_uint(b, PR_K_GRP_LAYERS), pr_wr_uint(b, kg->n_layers);
    pr_wr_uint(b, PR_K_GRP_BYTES), pr_wr_uint(b, kg->bytes_per_token);
    pr_wr_uint(b, PR_K_GRP_WINDOW), pr_wr_uint(b, kg->sliding_window);
  }
  pr_wr_uint(b, PR_K_READY_VOCAB), pr_wr_uint(b, m->vocab_size);
  pr_wr_uint(b, PR_K_READY_MAX_LEN), pr_wr_uint(b, m->max_model_len);
  pr_wr_uint(b, PR_K_READY_EOS), pr_enc_u32s(b, m->eos_ids);
  pr_wr_uint(b, PR_K_READY_MAX_DRAFT), pr_wr_uint(b, m->max_draft);
  pr_wr_uint(b, PR_K_READY_MAX_SEQS), pr_wr_uint(b, m->max_num_seqs);
  pr_wr_uint(b, PR_K_READY_MAX_TOKENS), pr_wr_uint(b, m->max_num_batched_tokens);
}

static int dec_kv_group(struct pr_rd *r, struct pr_kv_group *g) {
  uint64_t seen = 0;
  uint32_t n, k;
  int pr_rc_loop;
  PR_MAP_FOR(r, PR_LVL_REC, seen, n, i, k) {
    switch (k) {
    case PR_KEY_NONE: break;
    case PR_K_GRP_BLOCK_TOKENS: PR_TRY(pr_rd_u32(r, &g->block_tokens)); break;
    case PR_K_GRP_LAYERS: PR_TRY(pr_rd_u32(r, &g->n_layers)); break;
    case PR_K_GRP_BYTES: PR_TRY(pr_rd_u64(r, &g->bytes_per_token)); break;
    case PR_K_GRP_WINDOW: PR_TRY(pr_rd_u32(r, &g->sliding_window)); break;
    default: PR_TRY(pr_dec_skip(r, PR_LVL_REC)); break;
    }
  }
  return 0;
}

int pr_dec_ready(struct pr_rd *r, struct cm_arena *a, struct pr_ready *m) {
  const uint64_t required =
      PR_BIT(PR_K_READY_RANK) | PR_BIT(PR_K_READY_WORLD) | PR_BIT(PR_K_READY_GROUPS);
  uint64_t seen = 0, v;
  uint32_t n, k;
  int pr_rc_loop;
  void *mem;
  PR_MAP_FOR(r, PR_LVL_TOP, seen, n, i, k) {
    switch (k) {
    case PR_KEY_NONE: break;
    case PR_K_READY_RANK: PR_TRY(pr_rd_u32(r, &m->rank)); break;
    case PR_K_READY_WORLD: PR_TRY(pr_rd_u32(r, &m->world_size)); break;
    case PR_K_READY_BLOCKS: PR_TRY(pr_rd_u64(r, &m->kv_blocks)); break;
    case PR_K_READY_GROUPS:
      PR_TRY(pr_rd_array(r, &m->n_groups));
      if (m->n_groups > PR_MAX_KV_GROUPS) return CM_ERR_TOOBIG;
      PR_TRY(pr_dec_records(a, m->n_groups, sizeof(*m->groups), &mem));
      m->groups = mem;
      for (uint32_t g = 0; g < m->n_groups; g++)
        PR_TRY(dec_kv_group(r, &m->groups[g]));
      break;
    case PR_K_READY_VOCAB: PR_TRY(pr_rd_u32(r, &m->vocab_size)); break;
    case PR_K_READY_MAX_LEN: PR_TRY(pr_rd_u32(r, &m->max_model_len)); break;
    case PR_K_READY_EOS: PR_TRY(pr_dec_u32s(r, a, UINT32_MAX, &m->eos_ids)); break;
    case PR_K_READY_MAX_DRAFT:
      PR_TRY(pr_rd_uint(r, PR_MAX_DRAFT, &v));
      m->max_draft = (uint32_t)v;
      break;
    case PR_K_READY_MAX_SEQS: PR_TRY(pr_rd_u32(r, &m->max_num_seqs)); break;
    case PR_K_READY_MAX_TOKENS: PR_TRY(pr_rd_u32(r, &m->max_num_batched_tokens)); break;
    default: PR_TRY(pr_dec_skip(r, PR_LVL_TOP)); break;
    }
  }
  return (seen & required) == required ? 0 : CM_ERR_PARSE;
}

int pr_check_ready(const struct pr_ready *m) {
  PR_TRY(pr_check_slice(m->groups, m->n_groups));
  PR_TRY(pr_check_slice(m->eos_ids.v, m->eos_ids.n));
  if (m->world_size == 0 || m->rank >= m->world_size) return CM_ERR_RANGE;
  if (m->n_groups == 0 || m->n_groups > PR_MAX_KV_GROUPS) return CM_ERR_RANGE;
  for (uint32_t g = 0; g < m->n_groups; g++)
    if (m->groups[g].block_tokens == 0) return CM_ERR_RANGE;
  if (m->max_draft > PR_MAX_DRAFT) return CM_ERR_RANGE;
  return 0;
}

/* ======================================================================== */
/* RESULT                                                                    */

static void enc_result_seq(struct pr_buf *b, const struct pr_result_seq *s) {
  bool lp = s->logprobs.sampled.n > 0;
  pr_wr_map(b, lp ? 5 : 4);
  pr_wr_uint(b, PR_K_RSEQ_ID), pr_wr_uint(b, s->seq_id);
  pr_wr_uint(b, PR_K_RSEQ_TOKENS), pr_enc_u32s(b, s->tokens);
  pr_wr_uint(b, PR_K_RSEQ_ACCEPTED), pr_wr_uint(b, s->num_accepted);
  if (lp) pr_wr_uint(b, PR_K_RSEQ_LOGPROBS), pr_enc_logprobs(b, &s->logprobs);
  pr_wr_uint(b, PR_K_RSEQ_DRAFTS), pr_enc_u32s(b, s->drafts);
}

void pr_enc_result(struct pr_buf *b, const struct pr_result *m) {
  pr_wr_map(b, 3);
  pr_wr_uint(b, PR_K_RES_RANK), pr_wr_uint(b, m->rank);
  pr_wr_uint(b, PR_K_RES_STEP), pr_wr_uint(b, m->step_id);
  pr_wr_uint(b, PR_K_RES_SEQS), pr_wr_array(b, m->n_seqs);
  for (uint32_t i = 0; i < m->n_seqs; i++)
    enc_result_seq(b, &m->seqs[i]);
}

static int dec_result_seq(struct pr_rd *r, struct cm_arena *a, struct pr_result_seq *s) {
  uint64_t seen = 0;
  uint32_t n, k;
  int pr_rc_loop;
  PR_MAP_FOR(r, PR_LVL_REC, seen, n, i, k) {
    switch (k) {
    case PR_KEY_NONE: break;
    case PR_K_RSEQ_ID: PR_TRY(pr_rd_u64(r, &s->seq_id)); break;
    case PR_K_RSEQ_TOKENS: PR_TRY(pr_dec_u32s(r, a, PR_MAX_DRAFT + 1, &s->tokens)); break;
    case PR_K_RSEQ_ACCEPTED: PR_TRY(pr_rd_u32(r, &s->num_accepted)); break;
    case PR_K_RSEQ_LOGPROBS: PR_TRY(pr_dec_logprobs(r, a, PR_LVL_REC + 1, &s->logprobs)); break;
    case PR_K_RSEQ_DRAFTS: PR_TRY(pr_dec_u32s(r, a, PR_MAX_DRAFT, &s->drafts)); break;
    default: PR_TRY(pr_dec_skip(r, PR_LVL_REC)); break;
    }
  }
  return seen & PR_BIT(PR_K_RSEQ_ID) ? 0 : CM_ERR_PARSE;
}

int pr_dec_result(struct pr_rd *r, struct cm_arena *a, struct pr_result *m) {
  uint64_t seen = 0;
  uint32_t n, k;
  int pr_rc_loop;
  void *mem;
  PR_MAP_FOR(r, PR_LVL_TOP, seen, n, i, k) {
    switch (k) {
    case PR_KEY_NONE: break;
    case PR_K_RES_RANK: PR_TRY(pr_rd_u32(r, &m->rank)); break;
    case PR_K_RES_STEP: PR_TRY(pr_rd_u64(r, &m->step_id)); break;
    case PR_K_RES_SEQS:
      PR_TRY(pr_rd_array(r, &m->n_seqs));
      PR_TRY(pr_dec_records(a, m->n_seqs, sizeof(*m->seqs), &mem));
      m->seqs = mem;
      for (uint32_t j = 0; j < m->n_seqs; j++)
        PR_TRY(dec_result_seq(r, a, &m->seqs[j]));
      break;
    default: PR_TRY(pr_dec_skip(r, PR_LVL_TOP)); break;
    }
  }
  return seen & PR_BIT(PR_K_RES_STEP) ? 0 : CM_ERR_PARSE;
}

int pr_check_result(const struct pr_result *m) {
  PR_TRY(pr_check_slice(m->seqs, m->n_seqs));
  for (uint32_t i = 0; i < m->n_seqs; i++) {
    const struct pr_result_seq *s = &m->seqs[i];
    PR_TRY(pr_check_slice(s->tokens.v, s->tokens.n));
    PR_TRY(pr_check_slice(s->drafts.v, s->drafts.n));
    if (s->tokens.n > PR_MAX_DRAFT + 1 || s->drafts.n > PR_MAX_DRAFT) return CM_ERR_RANGE;
    if (s->num_accepted > s->tokens.n) return CM_ERR_RANGE;
    PR_TRY(pr_check_logprobs(&s->logprobs, s->tokens.n));
  }
  return 0;
}

/* ======================================================================== */
/* BEAT, FAIL                                                                */

void pr_enc_beat(struct pr_buf *b, const struct pr_beat *m) {
  pr_wr_map(b, 3);
  pr_wr_uint(b, PR_K_BEAT_RANK), pr_wr_uint(b, m->rank);
  pr_wr_uint(b, PR_K_BEAT_STEP), pr_wr_uint(b, m->last_step_id);
  pr_wr_uint(b, PR_K_BEAT_TIME), pr_wr_uint(b, m->time_ns);
}

int pr_dec_beat(struct pr_rd *r, struct cm_arena *a, struct pr_beat *m) {
  uint64_t seen = 0;
  uint32_t n, k;
  int pr_rc_loop;
  (void)a;
  PR_MAP_FOR(r, PR_LVL_TOP, seen, n, i, k) {
    switch (k) {
    case PR_KEY_NONE: break;
    case PR_K_BEAT_RANK: PR_TRY(pr_rd_u32(r, &m->rank)); break;
    case PR_K_BEAT_STEP: PR_TRY(pr_rd_u64(r, &m->last_step_id)); break;
    case PR_K_BEAT_TIME: PR_TRY(pr_rd_u64(r, &m->time_ns)); break;
    default: PR_TRY(pr_dec_skip(r, PR_LVL_TOP)); break;
    }
  }
  return seen & PR_BIT(PR_K_BEAT_RANK) ? 0 : CM_ERR_PARSE;
}

int pr_check_beat(const struct pr_beat *m) {
  (void)m;
  return 0;
}

void pr_enc_fail(struct pr_buf *b, const struct pr_fail *m) {
  pr_wr_map(b, 4);
  pr_wr_uint(b, PR_K_FAIL_RANK), pr_wr_uint(b, m->rank);
  pr_wr_uint(b, PR_K_FAIL_STEP), pr_wr_uint(b, m->step_id);
  pr_wr_uint(b, PR_K_FAIL_CODE), pr_wr_int(b, m->code);
  pr_wr_uint(b, PR_K_FAIL_MESSAGE), pr_enc_str(b, m->message);
}

int pr_dec_fail(struct pr_rd *r, struct cm_arena *a, struct pr_fail *m) {
  const uint64_t required = PR_BIT(PR_K_FAIL_RANK) | PR_BIT(PR_K_FAIL_CODE);
  uint64_t seen = 0;
  uint32_t n, k;
  int pr_rc_loop;
  m->message = "";
  PR_MAP_FOR(r, PR_LVL_TOP, seen, n, i, k) {
    switch (k) {
    case PR_KEY_NONE: break;
    case PR_K_FAIL_RANK: PR_TRY(pr_rd_u32(r, &m->rank)); break;
    case PR_K_FAIL_STEP: PR_TRY(pr_rd_u64(r, &m->step_id)); break;
    case PR_K_FAIL_CODE: PR_TRY(pr_rd_i32(r, &m->code)); break;
    case PR_K_FAIL_MESSAGE: PR_TRY(pr_dec_str(r, a, &m->message)); break;
    default: PR_TRY(pr_dec_skip(r, PR_LVL_TOP)); break;
    }
  }
  return (seen & required) == required ? 0 : CM_ERR_PARSE;
}

int pr_check_fail(const struct pr_fail *m) {
  return pr_check_str(m->message);
}
