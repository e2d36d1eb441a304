/* pr-samples.c — sample messages for proto's tests and fuzz corpus (see
 * pr-samples.h). Three variants per type: typical, minimal, maximal. */
#include "tests/unit/proto/pr-samples.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const enum pr_type types[] = {PR_ADD,  PR_ABORT, PR_PING,  PR_OUT,       PR_ERR,     PR_PONG,
                                     PR_STEP, PR_CTRL,  PR_READY, PR_RESULT,    PR_BEAT,    PR_FAIL,
                                     PR_DIST, PR_DOWN,  PR_LORA,  PR_LORA_DONE, PR_LORA_ACK};
static const char *const variants[] = {"typical", "minimal", "max"};

enum { NV = 3, BIG = 300 /* entries in the "large" arrays: past the 16-bit array header */ };

/* static storage the samples point into */
static uint32_t tok[BIG];
static uint32_t top_ids[(PR_MAX_DRAFT + 1) * PR_MAX_TOP_LOGPROBS];
static float lp[PR_MAX_DRAFT + 1];
static float top[(PR_MAX_DRAFT + 1) * PR_MAX_TOP_LOGPROBS];
static uint32_t ranks[PR_MAX_DRAFT + 1]; /* >= 1 */
static uint64_t ids[BIG];
static int32_t blocks[PR_MAX_KV_GROUPS][BIG];
static struct pr_i32s tables[4][PR_MAX_KV_GROUPS];
static struct pr_out_seq oseqs[4];
static struct pr_step_seq sseqs[4];
static struct pr_result_seq rseqs[4];
static struct pr_kv_group groups[PR_MAX_KV_GROUPS];
static char longstr[PR_MAX_STR + 1];
static uint8_t pixels[3 * 4 * 4]; /* a 4 x 4 RGB image */
static uint8_t clip[3 * (2 * 4 + 1)]; /* an audio clip: 3 frames of 2 mel bins, their mask */
static struct pr_image images[3];

static void fill_storage(void) {
  for (int i = 0; i < BIG; i++) {
    tok[i] = (uint32_t)(i * 7919u % 262144u);
    ids[i] = UINT64_MAX - (uint64_t)i * 1000003u;
  }
  tok[1] = UINT32_MAX;
  for (size_t i = 0; i < sizeof(top_ids) / sizeof(top_ids[0]); i++) {
    top_ids[i] = (uint32_t)(i * 31u);
    top[i] = -(float)i * 0.125f;
  }
  top[3] = -INFINITY;
  for (size_t i = 0; i < sizeof(lp) / sizeof(lp[0]); i++)
    lp[i] = -0.5f * (float)i;
  lp[2] = -INFINITY;
  for (size_t i = 0; i < sizeof(ranks) / sizeof(ranks[0]); i++)
    ranks[i] = 1 + (uint32_t)(i * 40503u % 262144u);
  ranks[1] = UINT32_MAX;
  for (int g = 0; g < PR_MAX_KV_GROUPS; g++)
    for (int i = 0; i < BIG; i++)
      blocks[g][i] = i % 5 == 0 ? -1 : g * 100000 + i;
  blocks[0][BIG - 1] = INT32_MAX;
  /* UTF-8: ASCII, 2-, 3- and 4-byte sequences, to exactly PR_MAX_STR bytes */
  const char *piece = "ab\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"; /* 12 bytes */
  size_t n = 0;
  while (n + 12 <= PR_MAX_STR)
    memcpy(longstr + n, piece, 12), n += 12;
  while (n < PR_MAX_STR)
    longstr[n++] = 'z';
  longstr[n] = 0;
}

static void sampling_typical(struct pr_sampling *s) {
  pr_sampling_default(s);
  s->temperature = 0.7f;
  s->top_p = 0.95f;
  s->top_k = 40;
  s->min_p = 0.05f;
  s->presence_penalty = 0.5f;
  s->frequency_penalty = -0.25f;
  s->repetition_penalty = 1.1f;
  s->has_seed = true;
  s->seed = 1234567890123ull;
  s->logprobs = 5;
  s->prompt_logprobs = 2;
  s->lora = 3;
  static const char re[] = "[0-9]{3}-[a-z]+";
  s->grammar_kind = 1; /* a regex */
  s->grammar = (struct pr_bytes){(const uint8_t *)re, sizeof(re) - 1};
  static const uint32_t bias_ids[3] = {7, 1000, 262143};
  static const float bias[3] = {-100.0f, 2.5f, 100.0f};
  s->bias_ids = (struct pr_u32s){bias_ids, 3};
  s->bias = (struct pr_f32s){bias, 3};
  s->bias_only = true;
  static const uint32_t bad_ids[5] = {10, 11, 12, 262143, 9};
  static const uint32_t bad_lens[3] = {3, 1, 1};
  s->bad_ids = (struct pr_u32s){bad_ids, 5};
  s->bad_lens = (struct pr_u32s){bad_lens, 3};
}

static void sampling_max(struct pr_sampling *s) {
  s->temperature = FLT_MAX;
  s->top_p = 1.0f;
  s->top_k = INT32_MAX;
  s->min_p = 1.0f;
  s->presence_penalty = -2.0f;
  s->frequency_penalty = 2.0f;
  s->repetition_penalty = 100.0f;
  s->has_seed = true;
  s->seed = UINT64_MAX;
  s->logprobs = PR_MAX_TOP_LOGPROBS;
  s->prompt_logprobs = PR_MAX_TOP_LOGPROBS;
  s->lora = PR_MAX_LORAS;
  s->ignore_eos = true;
  static uint8_t text[PR_MAX_GRAMMAR_BYTES];
  memset(text, 'x', sizeof(text));
  s->grammar_kind = PR_MAX_GRAMMAR_KIND;
  s->grammar = (struct pr_bytes){text, sizeof(text)};
}

/* logprobs over n tokens with k top entries each */
static struct pr_logprobs logprobs(uint32_t n, uint32_t k) {
  struct pr_logprobs l = {.n_top = k};
  l.sampled = (struct pr_f32s){lp, n};
  l.top_ids = (struct pr_u32s){top_ids, n * k};
  l.top = (struct pr_f32s){top, n * k};
  return l;
}

/* a prompt's: with each token's rank */
static struct pr_logprobs prompt_logprobs(uint32_t n, uint32_t k) {
  struct pr_logprobs l = logprobs(n, k);
  l.ranks = (struct pr_u32s){ranks, n};
  return l;
}

static void build(enum pr_type t, int v, struct pr_msg *m) {
  pr_msg_init(m, t);
  switch (t) {
  case PR_ADD: {
    struct pr_add *a = &m->u.add;
    a->request_id = v == 2 ? UINT64_MAX : 42;
    a->prompt = (struct pr_u32s){tok, v == 0 ? 12 : v == 1 ? 1 : BIG};
    a->max_tokens = v == 2 ? UINT32_MAX : 16;
    a->min_tokens = v == 2 ? UINT32_MAX : v == 0 ? 2 : 0;
    if (v == 0) sampling_typical(&a->sampling), a->stop_token_ids = (struct pr_u32s){tok, 2};
    if (v == 2) sampling_max(&a->sampling), a->stop_token_ids = (struct pr_u32s){tok, BIG};
    a->priority = v == 2 ? INT32_MIN : v == 0 ? -3 : 0;
    a->arrival_ns = v == 2 ? UINT64_MAX : v == 0 ? 1795000000123456789ull : 0;
    /* v 0: a salt whose low 32 bits are 0 (once not sent: its test read 32 bits) */
    a->cache_salt = v == 2 ? UINT64_MAX : v == 0 ? 0x8badf00d00000000ull : 0;
    a->lora_sum = v == 2 ? UINT64_MAX : 0;
    if (v == 0) { /* an adapter loaded at run time, in place of one of the list */
      a->sampling.lora = 0;
      a->lora_uid = 0x8badf00d00000001ull;
      a->lora_path = "/srv/adapters/sql-lora";
    }
    if (v == 0) { /* two images of 3 and 2 soft tokens, an audio clip of 1 */
      for (size_t i = 0; i < sizeof(pixels); i++)
        pixels[i] = (uint8_t)(i * 37u);
      for (size_t i = 0; i < sizeof(clip); i++)
        clip[i] = (uint8_t)(i * 53u + 1u);
      images[0] = (struct pr_image){2, 3, 0x0123456789abcdefull, {pixels, sizeof(pixels)}, 4, 4};
      images[1] = (struct pr_image){7, 2, UINT64_MAX, {pixels, 12}};
      images[2] = (struct pr_image){10, 1, 5, {clip, sizeof(clip)}, 2, 3, PR_MEDIA_AUDIO};
      a->images = images;
      a->n_images = 3;
    }
    break;
  }
  case PR_ABORT:
    m->u.abort.request_ids = (struct pr_u64s){ids, v == 0 ? 3 : v == 1 ? 0 : BIG};
    break;
  case PR_PING:
    m->u.ping.nonce = v == 2 ? UINT64_MAX : (uint64_t)v * 77;
    m->u.ping.send_ns = v == 2 ? UINT64_MAX : v == 0 ? 1795000000000000000ull : 0;
    break;
  case PR_DOWN:
    m->u.down.rank = v == 2 ? UINT32_MAX : v == 0 ? 1 : 0;
    m->u.down.pid = v == 2 ? UINT32_MAX : v == 0 ? 4242 : 0;
    m->u.down.message = v == 0 ? "killed by signal 9 (Killed)" : v == 1 ? "" : longstr;
    break;
  case PR_OUT: {
    struct pr_out *o = &m->u.out;
    if (v == 1) break;
    o->seqs = oseqs;
    o->n_seqs = v == 0 ? 2 : 3;
    for (uint32_t i = 0; i < o->n_seqs; i++) {
      struct pr_out_seq *s = &oseqs[i];
      memset(s, 0, sizeof(*s));
      s->request_id = ids[i];
      s->stop_token = -1;
      s->n_prompt_tokens = 100 + i;
      s->n_cached_tokens = 16;
      s->queued_ns = 1795000000000000000ull + i;
      s->scheduled_ns = s->queued_ns + 1000;
      s->first_token_ns = s->queued_ns + 2000;
    }
    oseqs[0].tokens = (struct pr_u32s){tok, 3};
    oseqs[0].logprobs = logprobs(3, v == 2 ? PR_MAX_TOP_LOGPROBS : 2);
    /* the first tokens of a request that asked its prompt's logprobs */
    oseqs[0].prompt_logprobs =
        prompt_logprobs(v == 2 ? PR_MAX_DRAFT : 4, v == 2 ? PR_MAX_TOP_LOGPROBS : 1);
    oseqs[1].finish = PR_FINISH_STOP;
    oseqs[1].stop_token = 106;
    oseqs[1].tokens = (struct pr_u32s){tok, 1};
    if (v == 2) {
      oseqs[1].stop_token = UINT32_MAX;
      oseqs[2].tokens = (struct pr_u32s){tok, BIG};
      oseqs[2].finish = PR_FINISH_ERROR;
      oseqs[2].n_prompt_tokens = oseqs[2].n_cached_tokens = UINT32_MAX;
      oseqs[2].first_token_ns = UINT64_MAX;
    }
    break;
  }
  case PR_ERR:
    m->u.err.request_id = v == 2 ? UINT64_MAX : 9;
    m->u.err.code = v == 2 ? INT32_MIN : -2;
    m->u.err.message = v == 0   ? "prompt is longer than the model (\xe2\x80\x9c"
                                  "9000\xe2\x80\x9d)"
                       : v == 1 ? ""
                                : longstr;
    break;
  case PR_PONG: {
    struct pr_pong *p = &m->u.pong;
    if (v == 1) break;
    uint64_t big = v == 2 ? UINT64_MAX : 1000;
    p->nonce = big - 1;
    p->ping_send_ns = big - 2;
    p->num_running = v == 2 ? UINT32_MAX : 3;
    p->num_waiting = v == 2 ? UINT32_MAX : 7;
    p->kv_usage = v == 2 ? 1.0 : 0.4375;
    p->workers_ready = p->world_size = v == 2 ? UINT32_MAX : 2;
    p->max_model_len = v == 2 ? UINT32_MAX : 32768;
    p->max_num_seqs = v == 2 ? UINT32_MAX : 64;
    p->prefix_cache_queries = big - 3;
    p->prefix_cache_hits = big - 4;
    p->num_preemptions = big - 5;
    p->spec_num_drafts = big - 6;
    p->spec_num_draft_tokens = big - 7;
    p->spec_num_accepted_tokens = big - 8;
    p->prompt_tokens = big - 9;
    p->generation_tokens = big - 10;
    p->kernels = v == 0 ? "cpu-avx512bf16" : longstr;
    p->matmul_inputs = v == 0 ? "bf16" : "";
    p->n_spec_pos = v == 2 ? PR_MAX_DRAFT : 3;
    for (uint32_t i = 0; i < p->n_spec_pos; i++)
      p->spec_accepted_per_pos[i] = big - 11 - i;
    break;
  }
  case PR_STEP: {
    struct pr_step *s = &m->u.step;
    s->step_id = v == 2 ? UINT64_MAX : 5;
    if (v == 1) break;
    s->seqs = sseqs;
    s->n_seqs = 2;
    s->free_ids = (struct pr_u64s){ids, v == 2 ? BIG : 1};
    uint32_t ng = v == 2 ? PR_MAX_KV_GROUPS : 2;
    for (uint32_t i = 0; i < 2; i++) {
      struct pr_step_seq *q = &sseqs[i];
      memset(q, 0, sizeof(*q));
      pr_sampling_default(&q->sampling);
      q->seq_id = ids[i];
      q->n_groups = ng;
      q->block_tables = tables[i];
      for (uint32_t g = 0; g < ng; g++)
        tables[i][g] = (struct pr_i32s){blocks[g], v == 2 ? BIG : 3 + g};
    }
    sseqs[0].flags = PR_SEQ_NEW | PR_SEQ_PREFILL | PR_SEQ_SAMPLE | PR_SEQ_SCORE;
    sseqs[0].prompt_next = v == 2 ? UINT32_MAX : 262143;
    sseqs[0].tokens = (struct pr_u32s){tok, v == 2 ? BIG : 40};
    if (v == 0) { /* an image, then an audio clip, ending inside the chunk */
      images[0] = (struct pr_image){30, 6, 99, {pixels, sizeof(pixels)}};
      images[1] = (struct pr_image){36, 2, 7, {clip, sizeof(clip)}, 2, 3, PR_MEDIA_AUDIO};
      sseqs[0].images = images;
      sseqs[0].n_images = 2;
    }
    sseqs[0].num_draft = v == 2 ? PR_MAX_DRAFT : 3;
    sseqs[0].num_prompt = v == 2 ? UINT32_MAX : 31;
    sseqs[0].max_tokens = v == 2 ? UINT32_MAX : 64;
    if (v == 0) { /* a prefix-cache hit of 5 tokens, which the penalties count */
      sseqs[0].start_pos = 5;
      sseqs[0].before = (struct pr_u32s){tok, 5};
    }
    sseqs[0].generated = (struct pr_u32s){tok, v == 2 ? BIG : 9};
    if (v == 2)
      sampling_max(&sseqs[0].sampling);
    else
      sampling_typical(&sseqs[0].sampling);
    sseqs[1].flags = PR_SEQ_SAMPLE | (v == 2 ? PR_SEQ_FINISHED : PR_SEQ_APPEND_BLOCKS);
    sseqs[1].start_pos = v == 2 ? UINT32_MAX : 57;
    sseqs[1].tokens = (struct pr_u32s){tok, 1};
    sseqs[1].draft_tokens = (struct pr_u32s){tok + 1, v == 2 ? PR_MAX_DRAFT : 3};
    sseqs[1].num_draft = 3;
    if (v == 1) { /* async: the token and drafts of the step before, which the worker keeps */
      sseqs[1].flags |= PR_SEQ_PREV_TOKEN | PR_SEQ_PREV_DRAFTS;
      sseqs[1].draft_tokens = (struct pr_u32s){NULL, 0};
    }
    break;
  }
  case PR_CTRL:
    m->u.ctrl.op = v == 0 ? PR_CTRL_PROFILE_START : v == 1 ? PR_CTRL_SHUTDOWN : PR_CTRL_OP_MAX;
    m->u.ctrl.arg = v == 2 ? INT64_MIN : v == 0 ? 10 : 0;
    m->u.ctrl.text = v == 0 ? "/tmp/profile-out" : v == 2 ? longstr : NULL;
    break;
  case PR_READY: {
    struct pr_ready *r = &m->u.ready;
    r->world_size = v == 2 ? UINT32_MAX : 2;
    r->rank = v == 2 ? UINT32_MAX - 1 : v == 0 ? 1 : 0;
    r->kv_blocks = v == 2 ? UINT64_MAX : 4096;
    r->n_groups = v == 2 ? PR_MAX_KV_GROUPS : v == 0 ? 2 : 1;
    r->groups = groups;
    for (uint32_t g = 0; g < r->n_groups; g++) {
      groups[g] = (struct pr_kv_group){.block_tokens = 16,
                                       .n_layers = 7 + g,
                                       .bytes_per_token = 2048u * (g + 1),
                                       .sliding_window = g % 2 ? 0 : 512};
    }
    if (v == 2) groups[0] = (struct pr_kv_group){UINT32_MAX, UINT32_MAX, UINT64_MAX, UINT32_MAX};
    r->vocab_size = v == 2 ? UINT32_MAX : 262144;
    r->max_model_len = v == 2 ? UINT32_MAX : 32768;
    r->eos_ids = (struct pr_u32s){tok, v == 0 ? 2 : v == 1 ? 0 : BIG};
    r->max_draft = v == 2 ? PR_MAX_DRAFT : v == 0 ? 4 : 0;
    r->max_num_seqs = v == 2 ? UINT32_MAX : v == 0 ? 64 : 0;
    r->max_num_batched_tokens = v == 2 ? UINT32_MAX : v == 0 ? 2048 : 0;
    r->shard_sum = v == 2 ? UINT64_MAX : v == 0 ? 0x9e3779b97f4a7c15ull : 0;
    r->pid = v == 2 ? UINT32_MAX : v == 0 ? 31337 : 0;
    r->kernels = v == 0 ? "cuda" : v == 2 ? longstr : NULL;
    r->matmul_inputs = v == 0 ? "weights" : v == 2 ? "" : NULL;
    if (v == 0) r->image_tokens = 1120, r->image_bytes = 7741440, r->image_varsize = 1;
    if (v == 0) r->audio_tokens = 750, r->audio_bytes = 1538487;
    r->n_lora = v == 2 ? PR_MAX_LORAS : v == 0 ? 2 : 0;
    r->lora_sum = v == 2 ? UINT64_MAX : v == 0 ? 0x77aa000000000001ull : 0;
    break;
  }
  case PR_RESULT: {
    struct pr_result *r = &m->u.result;
    r->rank = 0;
    r->step_id = v == 2 ? UINT64_MAX : 5;
    if (v == 1) break;
    r->seqs = rseqs;
    r->n_seqs = 2;
    memset(rseqs, 0, sizeof(rseqs));
    rseqs[0].seq_id = ids[0];
    rseqs[0].tokens = (struct pr_u32s){tok, v == 2 ? PR_MAX_DRAFT + 1 : 3};
    rseqs[0].num_accepted = v == 2 ? PR_MAX_DRAFT : 2;
    rseqs[0].num_verified = v == 2 ? PR_MAX_DRAFT : 3;
    rseqs[0].logprobs = logprobs(rseqs[0].tokens.n, v == 2 ? PR_MAX_TOP_LOGPROBS : 1);
    rseqs[0].drafts = (struct pr_u32s){tok + 3, v == 2 ? PR_MAX_DRAFT : 3};
    rseqs[1].seq_id = ids[1];
    rseqs[1].tokens = (struct pr_u32s){tok + 1, 1};
    /* a scored prompt chunk's rows */
    rseqs[1].prompt_logprobs = prompt_logprobs(5, v == 2 ? PR_MAX_TOP_LOGPROBS : 2);
    rseqs[1].prompt_pos = v == 2 ? UINT32_MAX : 41;
    break;
  }
  case PR_BEAT:
    m->u.beat.rank = v == 2 ? UINT32_MAX : 1;
    m->u.beat.last_step_id = v == 2 ? UINT64_MAX : v == 0 ? 1234 : 0;
    m->u.beat.time_ns = v == 2 ? UINT64_MAX : v == 0 ? 1795000000000000000ull : 0;
    m->u.beat.flags = v == 2 ? PR_BEAT_FLAGS_ALL : v == 0 ? PR_BEAT_GRAMMARS : 0;
    break;
  case PR_LORA:
  case PR_LORA_DONE:
  case PR_LORA_ACK: {
    struct pr_lora *l = &m->u.lora;
    l->nonce = t == PR_LORA_ACK ? 0 : v == 2 ? UINT64_MAX : (uint64_t)v * 5 + 1;
    if (t == PR_LORA) {
      l->op = v == 1 ? PR_LORA_UNLOAD : PR_LORA_LOAD;
      l->uid = v == 2 ? UINT64_MAX : 0x1234567800000009ull;
      l->path = v == 0 ? "/srv/adapters/chat" : v == 2 ? longstr : NULL;
    } else {
      l->code = v == 2 ? INT32_MIN : v == 0 ? -2 : 0;
      l->message = v == 0 ? "adapter_config.json: no such file" : v == 1 ? "" : longstr;
      if (t == PR_LORA_ACK) {
        l->rank = v == 2 ? UINT32_MAX : v == 0 ? 1 : 0;
        l->slot = v == 2 ? PR_MAX_LORAS : 3;
      }
    }
    break;
  }
  case PR_FAIL:
    m->u.fail.rank = v == 2 ? UINT32_MAX : 1;
    m->u.fail.step_id = v == 2 ? UINT64_MAX : 8;
    m->u.fail.code = v == 2 ? INT32_MIN : -18;
    m->u.fail.message = v == 0 ? "CUDA out of memory" : v == 1 ? "" : longstr;
    break;
  case PR_DIST:
    m->u.dist.rank = v == 2 ? UINT32_MAX - 1 : v == 0 ? 1 : 0;
    m->u.dist.world_size = v == 2 ? UINT32_MAX : v == 0 ? 2 : 1;
    if (v != 1) m->u.dist.comm_id = (struct pr_u32s){tok, v == 2 ? PR_MAX_COMM_ID : 8};
    break;
  }
}

int prs_count(void) {
  return (int)(sizeof(types) / sizeof(types[0])) * NV;
}

void prs_build(int i, struct pr_msg *m, const char **name) {
  static char label[64];
  static int filled;
  if (!filled) fill_storage(), filled = 1;
  enum pr_type t = types[i / NV];
  int v = i % NV;
  build(t, v, m);
  snprintf(label, sizeof(label), "%s-%s", pr_type_name(t), variants[v]);
  for (char *p = label; *p; p++)
    if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
  if (name) *name = label;
}
