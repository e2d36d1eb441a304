/* sch-request.c — admission checks, construction and stop conditions of a request. */
#include "scheduler/sch-request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-time.h"
#include "scheduler/sch-hash.h"

/* Tokens of room after the prompt that a new request starts with. */
#define SCH_REQUEST_HEADROOM 16

/* Images lie inside the prompt, in order, apart, each small enough for one step. */
static int check_images(const struct sch_engine_config *cfg, const struct sch_request_params *p,
                        char *err, size_t err_len) {
  if (p->num_images < 0 || p->num_images > SCH_MAX_IMAGES || (p->num_images > 0 && !p->images))
    return cm_fail(err, err_len, CM_ERR_TOOBIG, "%d images given, at most %d are allowed",
                   (int)p->num_images, SCH_MAX_IMAGES);
  int64_t end = 0;
  for (int32_t i = 0; i < p->num_images; i++) {
    const struct sch_image *m = &p->images[i];
    if (m->pos < end || m->num_tokens < 1 || (int64_t)m->pos + m->num_tokens > p->prompt_len ||
        (m->len > 0 && !m->data))
      return cm_fail(err, err_len, CM_ERR_INVAL,
                     "image %d: its tokens [%d, %lld) are not inside the prompt (%d tokens) "
                     "after the image before it",
                     (int)i, (int)m->pos, (long long)m->pos + m->num_tokens, (int)p->prompt_len);
    if (m->num_tokens > cfg->max_num_batched_tokens)
      return cm_fail(err, err_len, CM_ERR_TOOBIG,
                     "image %d takes %d tokens, more than one step's %d "
                     "(--max-num-batched-tokens): an image is never split across steps",
                     (int)i, (int)m->num_tokens, (int)cfg->max_num_batched_tokens);
    end = (int64_t)m->pos + m->num_tokens;
  }
  return 0;
}

/* The prefix-cache key of soft token k of a media item (an image, an audio
 * clip: kind) with content hash h. */
static int32_t image_key(uint64_t h, uint32_t kind, int32_t k) {
  uint64_t x = cm_mix64(h ^ cm_mix64((uint64_t)(uint32_t)k + SCH_HASH_K2 + ((uint64_t)kind << 32)));
  return (int32_t)(0x80000000u | (uint32_t)(x & 0x7fffffffu));
}

static void free_images(struct sch_request *r) {
  for (int32_t i = 0; r->images && i < r->num_images; i++)
    free((void *)r->images[i].data);
  free(r->images);
  r->images = NULL;
  r->num_images = 0;
}

/* Copies the images and their payloads, and builds the keys (r->tokens holds the
 * prompt, r->cap entries allocated). */
static int copy_images(struct sch_request *r, const struct sch_request_params *p) {
  r->images = calloc((size_t)p->num_images, sizeof(*r->images));
  r->keys = malloc((size_t)r->cap * sizeof(*r->keys));
  if (!r->images || !r->keys) return CM_ERR_NOMEM;
  r->num_images = p->num_images;
  for (int32_t i = 0; i < p->num_images; i++) {
    struct sch_image *m = &r->images[i];
    *m = p->images[i];
    m->data = NULL;
    if (p->images[i].len) {
      void *d = malloc(p->images[i].len);
      if (!d) return CM_ERR_NOMEM;
      memcpy(d, p->images[i].data, p->images[i].len);
      m->data = d;
    }
  }
  memcpy(r->keys, p->prompt, (size_t)p->prompt_len * sizeof(*r->keys));
  for (int32_t i = 0; i < r->num_images; i++)
    for (int32_t k = 0; k < r->images[i].num_tokens; k++)
      r->keys[r->images[i].pos + k] = image_key(r->images[i].hash, r->images[i].kind, k);
  return 0;
}

int sch_request_create(const struct sch_engine_config *cfg, const struct sch_kv *kv,
                       const struct sch_request_params *p, struct sch_request **out, char *err,
                       size_t err_len) {
  *out = NULL;
  if (err && err_len) err[0] = '\0';
  if (p->prompt_len <= 0 || !p->prompt)
    return cm_fail(err, err_len, CM_ERR_INVAL, "the prompt is empty");
  if (p->max_tokens < 1)
    return cm_fail(err, err_len, CM_ERR_INVAL, "max_tokens must be at least 1, got %d",
                    (int)p->max_tokens);
  for (int32_t i = 0; i < p->prompt_len; i++)
    if (p->prompt[i] < 0 || (cfg->vocab_size > 0 && p->prompt[i] >= cfg->vocab_size))
      return cm_fail(err, err_len, CM_ERR_INVAL, "prompt token %d has id %d, outside the vocabulary of %d", (int)i,
                      (int)p->prompt[i], (int)cfg->vocab_size);
  int64_t total = (int64_t)p->prompt_len + p->max_tokens;
  if (total > cfg->max_model_len)
    return cm_fail(err, err_len, CM_ERR_TOOBIG, "this model's maximum context length is %lld tokens, but the request "
                    "asks for %lld (%d in the prompt plus max_tokens)",
                    (long long)cfg->max_model_len, (long long)total, (int)p->prompt_len);
  int64_t step = (int64_t)cfg->max_num_batched_tokens + cfg->num_spec_tokens;
  int64_t need = sch_kv_worst_case_blocks(kv, total, step);
  if (need > cfg->num_blocks)
    return cm_fail(err, err_len, CM_ERR_TOOBIG, "the request needs %lld KV cache blocks for %lld tokens but the whole "
                    "cache has %lld",
                    (long long)need, (long long)total, (long long)cfg->num_blocks);
  if (p->num_stop_token_ids < 0 || p->num_stop_token_ids > SCH_MAX_STOP_IDS ||
      (p->num_stop_token_ids > 0 && !p->stop_token_ids))
    return cm_fail(err, err_len, CM_ERR_TOOBIG, "%d stop token ids given, at most %d are allowed",
                    (int)p->num_stop_token_ids, SCH_MAX_STOP_IDS);
  if (p->sampling_len > SCH_MAX_SAMPLING_BYTES || (p->sampling_len > 0 && !p->sampling))
    return cm_fail(err, err_len, CM_ERR_TOOBIG, "sampling parameters take %zu bytes, at most %d are allowed", p->sampling_len,
                    SCH_MAX_SAMPLING_BYTES);

  int rc = check_images(cfg, p, err, err_len);
  if (rc) return rc;

  struct sch_request *r = calloc(1, sizeof(*r));
  if (!r) goto nomem;
  r->max_len = (int32_t)total;
  r->cap = (int32_t)CM_MIN(total, (int64_t)p->prompt_len + SCH_REQUEST_HEADROOM);
  r->tokens = malloc((size_t)r->cap * sizeof(*r->tokens));
  r->stop_ids = malloc((size_t)(p->num_stop_token_ids + 1) * sizeof(*r->stop_ids));
  r->sampling = malloc(p->sampling_len + 1);
  if (!r->tokens || !r->stop_ids || !r->sampling) goto nomem;
  if (sch_kv_seq_init(kv, &r->kv, r->cap) != 0) goto nomem;
  r->kv.salt = p->cache_salt;
  memcpy(r->tokens, p->prompt, (size_t)p->prompt_len * sizeof(*r->tokens));
  if (p->num_stop_token_ids > 0)
    memcpy(r->stop_ids, p->stop_token_ids, (size_t)p->num_stop_token_ids * sizeof(int32_t));
  if (p->sampling_len > 0) memcpy(r->sampling, p->sampling, p->sampling_len);
  if (p->num_images > 0 && copy_images(r, p) != 0) goto nomem;
  r->id = p->id;
  r->state = SCH_REQ_WAITING;
  r->num_prompt = r->num_tokens = p->prompt_len;
  r->max_tokens = p->max_tokens;
  r->priority = p->priority;
  r->arrival_ns = p->arrival_ns ? p->arrival_ns : cm_time_ns();
  r->num_stop = p->num_stop_token_ids;
  r->ignore_eos = p->ignore_eos;
  r->constrained = p->constrained;
  r->lora_slot = p->lora_slot;
  r->score_prompt = p->score_prompt;
  r->sampling_len = p->sampling_len;
  r->run_index = -1;
  r->sched[0].index = r->sched[1].index = -1;
  *out = r;
  return 0;
nomem:
  sch_request_destroy(r); /* the KV sequence too, once it has its tables */
  return cm_fail(err, err_len, CM_ERR_NOMEM, "out of memory");
}

int sch_request_reserve(struct sch_request *r, const struct sch_kv *kv, int32_t ntokens) {
  if (ntokens > r->max_len) ntokens = r->max_len;
  if (ntokens <= r->cap) return 0;
  int32_t want =
      (int32_t)CM_MIN((int64_t)r->max_len, CM_MAX((int64_t)ntokens, 2 * (int64_t)r->cap));
  int32_t *t = realloc(r->tokens, (size_t)want * sizeof(*t));
  if (!t) return CM_ERR_NOMEM;
  r->tokens = t;
  if (r->keys) {
    int32_t *k = realloc(r->keys, (size_t)want * sizeof(*k));
    if (!k) return CM_ERR_NOMEM;
    r->keys = k;
  }
  if (sch_kv_seq_reserve(kv, &r->kv, want) != 0) return CM_ERR_NOMEM;
  r->cap = want;
  return 0;
}

void sch_request_destroy(struct sch_request *r) {
  if (!r) return;
  sch_kv_seq_release(&r->kv);
  free_images(r);
  free(r->keys);
  free(r->tokens);
  free(r->stop_ids);
  free(r->sampling);
  free(r);
}

static bool is_stop(const struct sch_request *r, const struct sch_engine_config *cfg, int32_t t) {
  if (!r->ignore_eos)
    for (int32_t i = 0; i < cfg->num_eos_ids; i++)
      if (cfg->eos_ids[i] == t) return true;
  for (int32_t i = 0; i < r->num_stop; i++)
    if (r->stop_ids[i] == t) return true;
  return false;
}

int32_t sch_request_append(struct sch_request *r, const int32_t *tokens, int32_t n,
                           const struct sch_engine_config *cfg, enum sch_finish *finish) {
  *finish = SCH_FINISH_NONE;
  int32_t k = 0;
  while (k < n && *finish == SCH_FINISH_NONE) {
    CM_ASSERT(r->num_tokens < r->cap);
    int32_t t = tokens[k++];
    if (r->keys) r->keys[r->num_tokens] = t;
    r->tokens[r->num_tokens++] = t;
    if (is_stop(r, cfg, t))
      *finish = SCH_FINISH_STOP;
    else if (sch_request_num_generated(r) >= r->max_tokens || r->num_tokens >= cfg->max_model_len)
      *finish = SCH_FINISH_LENGTH;
  }
  return k;
}
