/* pr-msg-eq.c — pr_msg_equal: field-by-field comparison of two messages, as
 * the round-trip tests and the fuzz target need it. Floats compare bitwise (a
 * round trip must be exact); slices compare by length and contents, so an
 * empty slice equals another whatever its pointer. ERR/FAIL messages treat
 * NULL as "" (that is how they are encoded); CTRL text keeps NULL distinct. */
#include <string.h>

#include "proto/pr-msg.h"

#define EQ(f)  (a->f == b->f)
#define FEQ(f) (memcmp(&a->f, &b->f, sizeof(float)) == 0)

static bool slice_eq(const void *x, const void *y, uint32_t nx, uint32_t ny, size_t elem) {
  if (nx != ny) return false;
  return nx == 0 || memcmp(x, y, (size_t)nx * elem) == 0;
}
#define SEQ(f) slice_eq(a->f.v, b->f.v, a->f.n, b->f.n, sizeof(*a->f.v))

static bool str_eq(const char *x, const char *y, bool null_is_empty) {
  if (null_is_empty) {
    x = x ? x : "";
    y = y ? y : "";
  }
  if (!x || !y) return x == y;
  return strcmp(x, y) == 0;
}

static bool sampling_eq(const struct pr_sampling *a, const struct pr_sampling *b) {
  return FEQ(temperature) && FEQ(top_p) && EQ(top_k) && FEQ(min_p) && FEQ(presence_penalty) &&
         FEQ(frequency_penalty) && FEQ(repetition_penalty) && EQ(has_seed) &&
         (!a->has_seed || EQ(seed)) && EQ(logprobs) && EQ(ignore_eos);
}

static bool logprobs_eq(const struct pr_logprobs *a, const struct pr_logprobs *b) {
  return EQ(n_top) && SEQ(sampled) && SEQ(top_ids) && SEQ(top);
}

static bool add_eq(const struct pr_add *a, const struct pr_add *b) {
  return EQ(request_id) && SEQ(prompt) && sampling_eq(&a->sampling, &b->sampling) &&
         EQ(max_tokens) && EQ(min_tokens) && SEQ(stop_token_ids) && EQ(priority) && EQ(arrival_ns);
}

static bool out_seq_eq(const struct pr_out_seq *a, const struct pr_out_seq *b) {
  return EQ(request_id) && SEQ(tokens) && logprobs_eq(&a->logprobs, &b->logprobs) && EQ(finish) &&
         EQ(stop_token) && EQ(n_prompt_tokens) && EQ(n_cached_tokens) && EQ(queued_ns) &&
         EQ(scheduled_ns) && EQ(first_token_ns);
}

static bool out_eq(const struct pr_out *a, const struct pr_out *b) {
  if (!EQ(n_seqs)) return false;
  for (uint32_t i = 0; i < a->n_seqs; i++)
    if (!out_seq_eq(&a->seqs[i], &b->seqs[i])) return false;
  return true;
}

static bool pong_eq(const struct pr_pong *a, const struct pr_pong *b) {
  return EQ(nonce) && EQ(ping_send_ns) && EQ(num_running) && EQ(num_waiting) &&
         memcmp(&a->kv_usage, &b->kv_usage, sizeof(double)) == 0 && EQ(workers_ready) &&
         EQ(world_size) && EQ(max_model_len) && EQ(prefix_cache_queries) && EQ(prefix_cache_hits) &&
         EQ(num_preemptions) && EQ(spec_num_drafts) && EQ(spec_num_draft_tokens) &&
         EQ(spec_num_accepted_tokens) && EQ(prompt_tokens) && EQ(generation_tokens) &&
         EQ(n_spec_pos) &&
         !memcmp(a->spec_accepted_per_pos, b->spec_accepted_per_pos,
                 sizeof(uint64_t) * (a->n_spec_pos < PR_MAX_DRAFT ? a->n_spec_pos : PR_MAX_DRAFT));
}

static bool step_seq_eq(const struct pr_step_seq *a, const struct pr_step_seq *b) {
  if (!(EQ(seq_id) && EQ(flags) && EQ(start_pos) && SEQ(tokens) && SEQ(draft_tokens) &&
        EQ(num_draft) && EQ(n_groups) && sampling_eq(&a->sampling, &b->sampling)))
    return false;
  for (uint32_t g = 0; g < a->n_groups; g++)
    if (!SEQ(block_tables[g])) return false;
  return true;
}

static bool step_eq(const struct pr_step *a, const struct pr_step *b) {
  if (!(EQ(step_id) && EQ(n_seqs) && SEQ(free_ids))) return false;
  for (uint32_t i = 0; i < a->n_seqs; i++)
    if (!step_seq_eq(&a->seqs[i], &b->seqs[i])) return false;
  return true;
}

static bool ready_eq(const struct pr_ready *a, const struct pr_ready *b) {
  if (!(EQ(rank) && EQ(world_size) && EQ(kv_blocks) && EQ(n_groups) && EQ(vocab_size) &&
        EQ(max_model_len) && SEQ(eos_ids) && EQ(max_draft) && EQ(max_num_seqs) &&
        EQ(max_num_batched_tokens)))
    return false;
  for (uint32_t g = 0; g < a->n_groups; g++) {
    const struct pr_kv_group *x = &a->groups[g], *y = &b->groups[g];
    if (x->block_tokens != y->block_tokens || x->n_layers != y->n_layers ||
        x->bytes_per_token != y->bytes_per_token || x->sliding_window != y->sliding_window)
      return false;
  }
  return true;
}

static bool result_seq_eq(const struct pr_result_seq *a, const struct pr_result_seq *b) {
  return EQ(seq_id) && SEQ(tokens) && EQ(num_accepted) && logprobs_eq(&a->logprobs, &b->logprobs) &&
         SEQ(drafts);
}

static bool result_eq(const struct pr_result *a, const struct pr_result *b) {
  if (!(EQ(rank) && EQ(step_id) && EQ(n_seqs))) return false;
  for (uint32_t i = 0; i < a->n_seqs; i++)
    if (!result_seq_eq(&a->seqs[i], &b->seqs[i])) return false;
  return true;
}

bool pr_msg_equal(const struct pr_msg *x, const struct pr_msg *y) {
  if (x->type != y->type) return false;
  switch (x->type) {
  case PR_ADD: return add_eq(&x->u.add, &y->u.add);
  case PR_ABORT: {
    const struct pr_abort *a = &x->u.abort, *b = &y->u.abort;
    return SEQ(request_ids);
  }
  case PR_PING: {
    const struct pr_ping *a = &x->u.ping, *b = &y->u.ping;
    return EQ(nonce) && EQ(send_ns);
  }
  case PR_OUT: return out_eq(&x->u.out, &y->u.out);
  case PR_ERR: {
    const struct pr_err *a = &x->u.err, *b = &y->u.err;
    return EQ(request_id) && EQ(code) && str_eq(a->message, b->message, true);
  }
  case PR_PONG: return pong_eq(&x->u.pong, &y->u.pong);
  case PR_STEP: return step_eq(&x->u.step, &y->u.step);
  case PR_CTRL: {
    const struct pr_ctrl *a = &x->u.ctrl, *b = &y->u.ctrl;
    return EQ(op) && EQ(arg) && str_eq(a->text, b->text, false);
  }
  case PR_READY: return ready_eq(&x->u.ready, &y->u.ready);
  case PR_RESULT: return result_eq(&x->u.result, &y->u.result);
  case PR_BEAT: {
    const struct pr_beat *a = &x->u.beat, *b = &y->u.beat;
    return EQ(rank) && EQ(last_step_id) && EQ(time_ns);
  }
  case PR_FAIL: {
    const struct pr_fail *a = &x->u.fail, *b = &y->u.fail;
    return EQ(rank) && EQ(step_id) && EQ(code) && str_eq(a->message, b->message, true);
  }
  }
  return false;
}
