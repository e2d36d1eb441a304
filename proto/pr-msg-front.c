/* pr-msg-front.c — codec of the messages between frontend and scheduler:
 * ADD, ABORT, PING (frontend -> scheduler) and OUT, ERR, PONG (back).
 * Each message has an encoder, a bounded decoder and a validator; the key
 * tables are in pr-codec.h. */
#include <math.h>
#include <string.h>

#include "common/cm-err.h"
#include "proto/pr-codec.h"

/* ======================================================================== */
/* ADD                                                                       */

void pr_enc_add(struct pr_buf *b, const struct pr_add *m) {
  pr_wr_map(b, 8);
  pr_wr_uint(b, PR_K_ADD_ID), pr_wr_uint(b, m->request_id);
  pr_wr_uint(b, PR_K_ADD_PROMPT), pr_enc_u32s(b, m->prompt);
  pr_wr_uint(b, PR_K_ADD_SAMPLING), pr_enc_sampling(b, &m->sampling);
  pr_wr_uint(b, PR_K_ADD_MAX_TOKENS), pr_wr_uint(b, m->max_tokens);
  pr_wr_uint(b, PR_K_ADD_MIN_TOKENS), pr_wr_uint(b, m->min_tokens);
  pr_wr_uint(b, PR_K_ADD_STOP_IDS), pr_enc_u32s(b, m->stop_token_ids);
  pr_wr_uint(b, PR_K_ADD_PRIORITY), pr_wr_int(b, m->priority);
  pr_wr_uint(b, PR_K_ADD_ARRIVAL), pr_wr_uint(b, m->arrival_ns);
}

int pr_dec_add(struct pr_rd *r, struct cm_arena *a, struct pr_add *m) {
  const uint64_t required =
      PR_BIT(PR_K_ADD_ID) | PR_BIT(PR_K_ADD_PROMPT) | PR_BIT(PR_K_ADD_MAX_TOKENS);
  uint64_t seen = 0;
  uint32_t n, k;
  int pr_rc_loop;
  PR_MAP_FOR(r, PR_LVL_TOP, seen, n, i, k) {
    switch (k) {
    case PR_KEY_NONE: break;
    case PR_K_ADD_ID: PR_TRY(pr_rd_u64(r, &m->request_id)); break;
    case PR_K_ADD_PROMPT: PR_TRY(pr_dec_u32s(r, a, UINT32_MAX, &m->prompt)); break;
    case PR_K_ADD_SAMPLING: PR_TRY(pr_dec_sampling(r, PR_LVL_SUB, &m->sampling)); break;
    case PR_K_ADD_MAX_TOKENS: PR_TRY(pr_rd_u32(r, &m->max_tokens)); break;
    case PR_K_ADD_MIN_TOKENS: PR_TRY(pr_rd_u32(r, &m->min_tokens)); break;
    case PR_K_ADD_STOP_IDS: PR_TRY(pr_dec_u32s(r, a, UINT32_MAX, &m->stop_token_ids)); break;
    case PR_K_ADD_PRIORITY: PR_TRY(pr_rd_i32(r, &m->priority)); break;
    case PR_K_ADD_ARRIVAL: PR_TRY(pr_rd_u64(r, &m->arrival_ns)); break;
    default: PR_TRY(pr_dec_skip(r, PR_LVL_TOP)); break;
    }
  }
  return (seen & required) == required ? 0 : CM_ERR_PARSE;
}

int pr_check_add(const struct pr_add *m) {
  PR_TRY(pr_check_slice(m->prompt.v, m->prompt.n));
  PR_TRY(pr_check_slice(m->stop_token_ids.v, m->stop_token_ids.n));
  if (m->prompt.n == 0) return CM_ERR_INVAL;
  if (m->max_tokens == 0 || m->min_tokens > m->max_tokens) return CM_ERR_RANGE;
  return pr_check_sampling(&m->sampling);
}

/* ======================================================================== */
/* ABORT, PING                                                               */

void pr_enc_abort(struct pr_buf *b, const struct pr_abort *m) {
  pr_wr_map(b, 1);
  pr_wr_uint(b, PR_K_ABORT_IDS), pr_enc_u64s(b, m->request_ids);
}

int pr_dec_abort(struct pr_rd *r, struct cm_arena *a, struct pr_abort *m) {
  uint64_t seen = 0;
  uint32_t n, k;
  int pr_rc_loop;
  PR_MAP_FOR(r, PR_LVL_TOP, seen, n, i, k) {
    switch (k) {
    case PR_KEY_NONE: break;
    case PR_K_ABORT_IDS: PR_TRY(pr_dec_u64s(r, a, &m->request_ids)); break;
    default: PR_TRY(pr_dec_skip(r, PR_LVL_TOP)); break;
    }
  }
  return 0;
}

int pr_check_abort(const struct pr_abort *m) {
  return pr_check_slice(m->request_ids.v, m->request_ids.n);
}

void pr_enc_ping(struct pr_buf *b, const struct pr_ping *m) {
  pr_wr_map(b, 2);
  pr_wr_uint(b, PR_K_PING_NONCE), pr_wr_uint(b, m->nonce);
  pr_wr_uint(b, PR_K_PING_SEND), pr_wr_uint(b, m->send_ns);
}

int pr_dec_ping(struct pr_rd *r, struct cm_arena *a, struct pr_ping *m) {
  uint64_t seen = 0;
  uint32_t n, k;
  int pr_rc_loop;
  (void)a;
  PR_MAP_FOR(r, PR_LVL_TOP, seen, n, i, k) {
    switch (k) {
    case PR_KEY_NONE: break;
    case PR_K_PING_NONCE: PR_TRY(pr_rd_u64(r, &m->nonce)); break;
    case PR_K_PING_SEND: PR_TRY(pr_rd_u64(r, &m->send_ns)); break;
    default: PR_TRY(pr_dec_skip(r, PR_LVL_TOP)); break;
    }
  }
  return 0;
}

int pr_check_ping(const struct pr_ping *m) {
  (void)m;
  return 0;
}

/* ======================================================================== */
/* OUT                                                                       */

static void enc_out_seq(struct pr_buf *b, const struct pr_out_seq *s) {
  bool lp = s->logprobs.sampled.n > 0;
  pr_wr_map(b, lp ? 10 : 9);
  pr_wr_uint(b, PR_K_OSEQ_ID), pr_wr_uint(b, s->request_id);
  pr_wr_uint(b, PR_K_OSEQ_TOKENS), pr_enc_u32s(b, s->tokens);
  if (lp) pr_wr_uint(b, PR_K_OSEQ_LOGPROBS), pr_enc_logprobs(b, &s->logprobs);
  pr_wr_uint(b, PR_K_OSEQ_FINISH), pr_wr_uint(b, s->finish);
  pr_wr_uint(b, PR_K_OSEQ_STOP_TOKEN), pr_wr_int(b, s->stop_token);
  pr_wr_uint(b, PR_K_OSEQ_N_PROMPT), pr_wr_uint(b, s->n_prompt_tokens);
  pr_wr_uint(b, PR_K_OSEQ_N_CACHED), pr_wr_uint(b, s->n_cached_tokens);
  pr_wr_uint(b, PR_K_OSEQ_QUEUED), pr_wr_uint(b, s->queued_ns);
  pr_wr_uint(b, PR_K_OSEQ_SCHEDULED), pr_wr_uint(b, s->scheduled_ns);
  pr_wr_uint(b, PR_K_OSEQ_FIRST_TOKEN), pr_wr_uint(b, s->first_token_ns);
}

void pr_enc_out(struct pr_buf *b, const struct pr_out *m) {
  pr_wr_map(b, 1);
  pr_wr_uint(b, PR_K_OUT_SEQS), pr_wr_array(b, m->n_seqs);
  for (uint32_t i = 0; i < m->n_seqs; i++)
    enc_out_seq(b, &m->seqs[i]);
}

static int dec_out_seq(struct pr_rd *r, struct cm_arena *a, struct pr_out_seq *s) {
  uint64_t seen = 0, v;
  uint32_t n, k;
  int64_t x;
  int pr_rc_loop;
  s->stop_token = -1;
  PR_MAP_FOR(r, PR_LVL_REC, seen, n, i, k) {
    switch (k) {
    case PR_KEY_NONE: break;
    case PR_K_OSEQ_ID: PR_TRY(pr_rd_u64(r, &s->request_id)); break;
    case PR_K_OSEQ_TOKENS: PR_TRY(pr_dec_u32s(r, a, UINT32_MAX, &s->tokens)); break;
    case PR_K_OSEQ_LOGPROBS: PR_TRY(pr_dec_logprobs(r, a, PR_LVL_REC + 1, &s->logprobs)); break;
    case PR_K_OSEQ_FINISH:
      PR_TRY(pr_rd_uint(r, PR_FINISH_ERROR, &v));
      s->finish = (uint8_t)v;
      break;
    case PR_K_OSEQ_STOP_TOKEN:
      PR_TRY(pr_rd_int(r, -1, UINT32_MAX, &x));
      s->stop_token = x;
      break;
    case PR_K_OSEQ_N_PROMPT: PR_TRY(pr_rd_u32(r, &s->n_prompt_tokens)); break;
    case PR_K_OSEQ_N_CACHED: PR_TRY(pr_rd_u32(r, &s->n_cached_tokens)); break;
    case PR_K_OSEQ_QUEUED: PR_TRY(pr_rd_u64(r, &s->queued_ns)); break;
    case PR_K_OSEQ_SCHEDULED: PR_TRY(pr_rd_u64(r, &s->scheduled_ns)); break;
    case PR_K_OSEQ_FIRST_TOKEN: PR_TRY(pr_rd_u64(r, &s->first_token_ns)); break;
    default: PR_TRY(pr_dec_skip(r, PR_LVL_REC)); break;
    }
  }
  return seen & PR_BIT(PR_K_OSEQ_ID) ? 0 : CM_ERR_PARSE;
}

int pr_dec_out(struct pr_rd *r, struct cm_arena *a, struct pr_out *m) {
  uint64_t seen = 0;
  uint32_t n, k;
  int pr_rc_loop;
  void *mem;
  PR_MAP_FOR(r, PR_LVL_TOP, seen, n, i, k) {
    switch (k) {
    case PR_KEY_NONE: break;
    case PR_K_OUT_SEQS:
      PR_TRY(pr_rd_array(r, &m->n_seqs));
      PR_TRY(pr_dec_records(a, m->n_seqs, sizeof(*m->seqs), &mem));
      m->seqs = mem;
      for (uint32_t j = 0; j < m->n_seqs; j++)
        PR_TRY(dec_out_seq(r, a, &m->seqs[j]));
      break;
    default: PR_TRY(pr_dec_skip(r, PR_LVL_TOP)); break;
    }
  }
  return 0;
}

int pr_check_out(const struct pr_out *m) {
  PR_TRY(pr_check_slice(m->seqs, m->n_seqs));
  for (uint32_t i = 0; i < m->n_seqs; i++) {
    const struct pr_out_seq *s = &m->seqs[i];
    PR_TRY(pr_check_slice(s->tokens.v, s->tokens.n));
    PR_TRY(pr_check_logprobs(&s->logprobs, s->tokens.n));
    if (s->finish > PR_FINISH_ERROR) return CM_ERR_RANGE;
    if (s->stop_token < -1 || s->stop_token > (int64_t)UINT32_MAX) return CM_ERR_RANGE;
    if (s->n_cached_tokens > s->n_prompt_tokens) return CM_ERR_RANGE;
  }
  return 0;
}

/* ======================================================================== */
/* ERR                                                                       */

void pr_enc_err(struct pr_buf *b, const struct pr_err *m) {
  pr_wr_map(b, 3);
  pr_wr_uint(b, PR_K_ERR_ID), pr_wr_uint(b, m->request_id);
  pr_wr_uint(b, PR_K_ERR_CODE), pr_wr_int(b, m->code);
  pr_wr_uint(b, PR_K_ERR_MESSAGE), pr_enc_str(b, m->message);
}

int pr_dec_err(struct pr_rd *r, struct cm_arena *a, struct pr_err *m) {
  uint64_t seen = 0;
  uint32_t n, k;
  int pr_rc_loop;
  m->message = "";
  PR_MAP_FOR(r, PR_LVL_TOP, seen, n, i, k) {
    switch (k) {
    case PR_KEY_NONE: break;
    case PR_K_ERR_ID: PR_TRY(pr_rd_u64(r, &m->request_id)); break;
    case PR_K_ERR_CODE: PR_TRY(pr_rd_i32(r, &m->code)); break;
    case PR_K_ERR_MESSAGE: PR_TRY(pr_dec_str(r, a, &m->message)); break;
    default: PR_TRY(pr_dec_skip(r, PR_LVL_TOP)); break;
    }
  }
  return seen & PR_BIT(PR_K_ERR_CODE) ? 0 : CM_ERR_PARSE;
}

int pr_check_err(const struct pr_err *m) {
  return pr_check_str(m->message);
}

/* ======================================================================== */
/* PONG: a flat record of counters, encoded in key order                     */

void pr_enc_pong(struct pr_buf *b, const struct pr_pong *m) {
  const uint64_t u[PR_K_PONG__COUNT] = {
      [PR_K_PONG_NONCE] = m->nonce,
      [PR_K_PONG_PING_SEND] = m->ping_send_ns,
      [PR_K_PONG_RUNNING] = m->num_running,
      [PR_K_PONG_WAITING] = m->num_waiting,
      [PR_K_PONG_WORKERS_READY] = m->workers_ready,
      [PR_K_PONG_WORLD_SIZE] = m->world_size,
      [PR_K_PONG_MAX_MODEL_LEN] = m->max_model_len,
      [PR_K_PONG_PC_QUERIES] = m->prefix_cache_queries,
      [PR_K_PONG_PC_HITS] = m->prefix_cache_hits,
      [PR_K_PONG_PREEMPTIONS] = m->num_preemptions,
      [PR_K_PONG_SPEC_DRAFTS] = m->spec_num_drafts,
      [PR_K_PONG_SPEC_DRAFT_TOKENS] = m->spec_num_draft_tokens,
      [PR_K_PONG_SPEC_ACCEPTED] = m->spec_num_accepted_tokens,
      [PR_K_PONG_PROMPT_TOKENS] = m->prompt_tokens,
      [PR_K_PONG_GEN_TOKENS] = m->generation_tokens,
  };
  pr_wr_map(b, PR_K_PONG__COUNT);
  for (uint32_t k = 0; k < PR_K_PONG__COUNT; k++) {
    pr_wr_uint(b, k);
    if (k == PR_K_PONG_KV_USAGE)
      pr_wr_f64(b, m->kv_usage);
    else if (k == PR_K_PONG_SPEC_ACCEPTED_POS)
      pr_wr_u64_array(b, m->spec_accepted_per_pos,
                      m->n_spec_pos < PR_MAX_DRAFT ? m->n_spec_pos : PR_MAX_DRAFT);
    else
      pr_wr_uint(b, u[k]);
  }
}

int pr_dec_pong(struct pr_rd *r, struct cm_arena *a, struct pr_pong *m) {
  uint64_t seen = 0;
  uint32_t n, k;
  int pr_rc_loop;
  (void)a;
  PR_MAP_FOR(r, PR_LVL_TOP, seen, n, i, k) {
    switch (k) {
    case PR_KEY_NONE: break;
    case PR_K_PONG_NONCE: PR_TRY(pr_rd_u64(r, &m->nonce)); break;
    case PR_K_PONG_PING_SEND: PR_TRY(pr_rd_u64(r, &m->ping_send_ns)); break;
    case PR_K_PONG_RUNNING: PR_TRY(pr_rd_u32(r, &m->num_running)); break;
    case PR_K_PONG_WAITING: PR_TRY(pr_rd_u32(r, &m->num_waiting)); break;
    case PR_K_PONG_KV_USAGE: PR_TRY(pr_rd_f64(r, &m->kv_usage)); break;
    case PR_K_PONG_WORKERS_READY: PR_TRY(pr_rd_u32(r, &m->workers_ready)); break;
    case PR_K_PONG_WORLD_SIZE: PR_TRY(pr_rd_u32(r, &m->world_size)); break;
    case PR_K_PONG_MAX_MODEL_LEN: PR_TRY(pr_rd_u32(r, &m->max_model_len)); break;
    case PR_K_PONG_PC_QUERIES: PR_TRY(pr_rd_u64(r, &m->prefix_cache_queries)); break;
    case PR_K_PONG_PC_HITS: PR_TRY(pr_rd_u64(r, &m->prefix_cache_hits)); break;
    case PR_K_PONG_PREEMPTIONS: PR_TRY(pr_rd_u64(r, &m->num_preemptions)); break;
    case PR_K_PONG_SPEC_DRAFTS: PR_TRY(pr_rd_u64(r, &m->spec_num_drafts)); break;
    case PR_K_PONG_SPEC_DRAFT_TOKENS: PR_TRY(pr_rd_u64(r, &m->spec_num_draft_tokens)); break;
    case PR_K_PONG_SPEC_ACCEPTED: PR_TRY(pr_rd_u64(r, &m->spec_num_accepted_tokens)); break;
    case PR_K_PONG_PROMPT_TOKENS: PR_TRY(pr_rd_u64(r, &m->prompt_tokens)); break;
    case PR_K_PONG_GEN_TOKENS: PR_TRY(pr_rd_u64(r, &m->generation_tokens)); break;
    case PR_K_PONG_SPEC_ACCEPTED_POS:
      PR_TRY(pr_rd_array(r, &m->n_spec_pos));
      if (m->n_spec_pos > PR_MAX_DRAFT) return CM_ERR_TOOBIG;
      PR_TRY(pr_rd_u64_array(r, m->spec_accepted_per_pos, m->n_spec_pos));
      break;
    default: PR_TRY(pr_dec_skip(r, PR_LVL_TOP)); break;
    }
  }
  return 0;
}

int pr_check_pong(const struct pr_pong *m) {
  if (!(m->kv_usage >= 0.0 && m->kv_usage <= 1.0)) return CM_ERR_RANGE;
  if (m->workers_ready > m->world_size) return CM_ERR_RANGE;
  return 0;
}
