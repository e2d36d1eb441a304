/* wk-role.c — executes STEP plans: per-sequence state, checking a step,
 * building the ragged batch, one forward pass, sampling / draft
 * verification, draft proposals, and the RESULT message (see wk-role.h). */
#include "worker/wk-role.h"

#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-arena.h"
#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-hash.h"
#include "common/cm-log.h"
#include "common/cm-time.h"
#include "tokenizer/tk-tokenizer.h"
#include "worker/wk-encoder.h"
#include "worker/wk-grammar.h"
#include "worker/wk-ngram.h"

#define TOPN WK_MAX_LOGPROBS /* top logprobs kept per produced token */

/* ---- per-sequence state ------------------------------------------------------ */

struct rseq {
  uint64_t id;
  int used;
  int has_last; /* last holds the token this sequence sampled in its latest step */
  int32_t last; /* what PR_SEQ_PREV_TOKEN (async scheduling) runs next */
  int pend;     /* its latest step sampled it and is not finished: the token is
                   only in row pend_row of the backend's kept ids (kn_kept_ids) */
  int pend_row;
  uint64_t pend_no;  /* that step's launch number (rstep.no) */
  uint32_t accepted; /* drafts that step accepted: PREV_TOKEN runs after them */
  uint32_t n_prop;   /* drafts that step proposed, in prop (PR_SEQ_PREV_DRAFTS) */
  uint32_t prop[PR_MAX_DRAFT];
  uint32_t gen_end;  /* prompt + max_tokens (from NEW), 0 = not said */
  uint32_t n_prompt; /* prompt tokens (from NEW): later positions are generated ones */
  int prompt_top;    /* its prompt's logprobs (PR_SEQ_SCORE): top entries, -1 = not asked */
  int lora;          /* its LoRA adapter (from NEW), 0 = none */
  struct wk_sampling_params sp;
  struct wk_penalty_state pen;
  int32_t *bt[WK_MAX_KV_GROUPS]; /* [cap_bt[g]] page ids, -1 = freed by the window */
  int n_bt[WK_MAX_KV_GROUPS];
  int cap_bt[WK_MAX_KV_GROUPS];
  int32_t *bias_ids; /* [cap_bias] its logit_bias (sp points here), kept for the next */
  float *bias;       /* sequence of the slot */
  int cap_bias;
  /* bad_words: [cap_bad] the n_bad sequences' lengths, then their ids one after
   * another (kept like bias) */
  int32_t *bad;
  int n_bad, cap_bad;
  int32_t hist[PR_MAX_BAD_WORD_LEN - 1]; /* with bad words: its last generated tokens */
  int n_hist;
  uint32_t hist_end;     /* the position after hist's last */
  struct gr_matcher *gm; /* structured output: where the generated tokens stand, or NULL */
  uint32_t followed;     /* with gm: the position of the next token it follows (positions
                            from the prompt's end on are generated tokens) */
  struct wk_ngram_hist ctx; /* with n-gram drafts: its tokens so far */
};

/* What a step holds from its launch to its finish. Two of them: the next step may
 * launch while this one's results are still to be read (pipelined steps). */
struct rstep {
  struct pr_step view;         /* the step as PREV_TOKEN / PREV_DRAFTS complete it */
  struct rseq **cur;           /* [max_seqs] state of each step sequence */
  int *row0;                   /* [max_seqs] first logits row of each sequence, -1 none */
  struct pr_step_seq *eseq;    /* [max_seqs] the completed sequences (view.seqs) */
  uint32_t *etok;              /* [max_seqs] the tokens PREV_TOKEN runs */
  int32_t *prev;               /* [max_seqs] kept-id row of each first token, -1 none */
  struct kn_sample_params *kp; /* [max_rows] rows sampled on the backend, or NULL */
  struct kn_sample_out *ko;    /* [max_rows] their results */
  int dev_step;                /* the step samples on the backend */
  int rows;                    /* rows it samples */
  uint64_t no;                 /* launch number */
  int *srow0;                  /* [max_seqs] first scored row of each sequence, -1 none */
  struct kn_sample_out *sc;    /* [max_T] the scored rows' results (made at the first) */
  int32_t *sc_rank;            /* [max_T] their tokens' ranks (made with sc) */
};

struct wk_role {
  struct wk_model *model, *draft;
  int ngram_min, ngram_max; /* n-gram drafts (no draft model): the match's lengths */
  int max_seqs, max_draft, max_T, vocab, hidden, n_groups, n_pages, max_pos;
  uint32_t rank;
  int max_blocks[WK_MAX_KV_GROUPS]; /* blocks a table may hold: covers max_pos */
  struct rseq *seqs;                /* [cap_seqs] */
  int cap_seqs;
  struct cm_arena fixed; /* seqs and the arrays below sized at create, freed together */
  int nomem;             /* an allocation from fixed failed */
  /* per-step scratch, sized at create */
  struct rstep st[2];      /* launched steps: st[head], then st[head ^ 1] when two are open */
  struct rstep *s;         /* the one being launched or finished */
  int head, n_open;        /* the oldest step launched and not finished; how many are */
  uint64_t launches;       /* steps launched */
  uint64_t pipelined;      /* of which while another was open */
  struct wk_seq_input *in; /* [max_seqs] */
  struct wk_encoder *enc;   /* image encoder cache, or NULL without a vision tower */
  struct wk_grammars *gram; /* structured outputs, or NULL until the first one */
  uint32_t *gbits;          /* [max_rows, mask words] each constrained row's mask */
  char *tokenizer;          /* where gram's vocabulary comes from, or NULL */
  char *tokenizer_gguf;     /* or this GGUF file's metadata, or NULL */
  /* gram built on a thread (wk_role_grammars_start) while steps run: gram_th holds
   * its result until the first constrained step joins it; gram_flags (atomic, read
   * by the heartbeat thread) is PR_BEAT_GRAMMARS once built, _FAILED once building
   * it failed (said once: it is not tried again) */
  struct gram_build *gram_th;
  unsigned gram_flags;
  struct wk_seq_embed *emb; /* [max_seqs * PR_MAX_IMAGES] image rows of the step */
  int32_t *bidir;           /* [max_seqs * PR_MAX_IMAGES * 2] their ranges */
  const struct pr_image **step_ims; /* [max_seqs * PR_MAX_IMAGES] the step's images */
  const float **step_rows;          /* [max_seqs * PR_MAX_IMAGES] their embeddings */
  int32_t *toks;           /* [max_T] tokens then drafts, per sequence */
  float *logits;           /* [max_rows, vocab] */
  float *hid;              /* [max_rows, hidden] final-normed states, or NULL */
  int max_rows;            /* rows of logits: sampled tokens + verified drafts */
  struct wk_sampler *sampler;
  /* draft proposal scratch (when draft != NULL) */
  struct wk_draft_input *din; /* [max_seqs] */
  int *dseq;                  /* [max_seqs] step index of each drafting sequence */
  int32_t *dtok;              /* [max_seqs] */
  struct gr_matcher **dgm;    /* [max_seqs] a constrained drafting row's matcher, ahead */
  float *dlog;                /* [dlog_rows, vocab] those rows' draft logits */
  int dlog_rows;
  float *hbuf[2];             /* [max_seqs, hidden] h_in / h_out, swapped per draft step */
  /* RESULT buffers */
  struct pr_result_seq *rs; /* [max_seqs] */
  uint32_t *rtok;           /* [max_seqs, PR_MAX_DRAFT + 1] */
  float *rlp;               /* [max_seqs, PR_MAX_DRAFT + 1] sampled logprobs */
  uint32_t *rtop_ids;       /* [max_seqs, PR_MAX_DRAFT + 1, TOPN] */
  float *rtop;              /* [max_seqs, PR_MAX_DRAFT + 1, TOPN] */
  uint32_t *rdraft;         /* [max_seqs, PR_MAX_DRAFT] */
  /* scored prompt rows (PR_SEQ_SCORE), made at the first: the tokens each row scores
   * [max_T], and their RESULT entries ([max_T], [max_T, TOPN] twice) */
  int32_t *sc_ids;
  float *rplp;
  uint32_t *rplp_rank;
  uint32_t *rplp_ids;
  float *rplp_top;
};

static void gram_build_free(struct gram_build *b);
static int score_room(struct wk_role *r, char *err, size_t errlen);

static struct rseq *seq_find(struct wk_role *r, uint64_t id) {
  for (int i = 0; i < r->cap_seqs; i++)
    if (r->seqs[i].used && r->seqs[i].id == id) return &r->seqs[i];
  return NULL;
}

static void seq_drop(struct wk_role *r, struct rseq *q) {
  wk_grammars_release(r->gram, q->gm);
  q->gm = NULL;
  q->used = 0;
  q->has_last = 0;
  q->pend = 0;
  q->n_prop = 0;
  wk_penalty_reset(&q->pen);
  wk_ngram_reset(&q->ctx);
  for (int g = 0; g < WK_MAX_KV_GROUPS; g++)
    q->n_bt[g] = 0;
}

/* The logit biases of sp in q's own arrays, which q->sp then points to, with room
 * after them for a row's bans (one per bad-word sequence, row_params). */
static int keep_bias(struct rseq *q, const struct pr_sampling *sp) {
  const int n = (int)sp->bias_ids.n, room = n + (int)sp->bad_lens.n;
  if (room > q->cap_bias) {
    int32_t *ids = realloc(q->bias_ids, sizeof(*ids) * (size_t)room);
    if (ids) q->bias_ids = ids;
    float *b = ids ? realloc(q->bias, sizeof(*b) * (size_t)room) : NULL;
    if (!b) return CM_ERR_NOMEM;
    q->bias = b;
    q->cap_bias = room;
  }
  for (int i = 0; i < n; i++) {
    q->bias_ids[i] = (int32_t)sp->bias_ids.v[i];
    q->bias[i] = sp->bias.v[i];
  }
  q->sp.bias_ids = q->bias_ids;
  q->sp.bias = q->bias;
  q->sp.n_bias = n;
  q->sp.bias_only = sp->bias_only && n > 0;
  return 0;
}

/* The bad words of sp in q's own array: the sequences' lengths, then their ids. */
static int keep_bad_words(struct rseq *q, const struct pr_sampling *sp) {
  const int ns = (int)sp->bad_lens.n, need = ns + (int)sp->bad_ids.n;
  q->n_bad = q->n_hist = 0;
  q->hist_end = 0;
  if (need > q->cap_bad) {
    int32_t *b = realloc(q->bad, sizeof(*b) * (size_t)need);
    if (!b) return CM_ERR_NOMEM;
    q->bad = b;
    q->cap_bad = need;
  }
  for (int i = 0; i < ns; i++)
    q->bad[i] = (int32_t)sp->bad_lens.v[i];
  for (int i = ns; i < need; i++)
    q->bad[i] = (int32_t)sp->bad_ids.v[i - ns];
  q->n_bad = ns;
  return 0;
}

/* q generated token id at position pos: its bad-word history follows (a position
 * it has seen is passed over). CM_ERR_INVAL for a position past the next. */
static int hist_push(struct rseq *q, uint32_t pos, int32_t id) {
  if (!q->n_bad || pos < q->hist_end) return 0;
  if (pos > q->hist_end) return CM_ERR_INVAL;
  if (q->n_hist == PR_MAX_BAD_WORD_LEN - 1) {
    memmove(q->hist, q->hist + 1, sizeof(q->hist[0]) * (size_t)(q->n_hist - 1));
    q->n_hist--;
  }
  q->hist[q->n_hist++] = id;
  q->hist_end++;
  return 0;
}

/* The parameters of q's next row, whose draw follows its history and the n tokens
 * tok[] drawn before it in this step: q->sp, or with bad words that row's end,
 * q->sp with a bias of 2 KN_SAMPLE_NEVER (after its own, in keep_bias's room) on each
 * token that would end one (as vLLM bans them: the word's other tokens the last ones
 * generated); finite, so that a row its structured output leaves nothing else is
 * still drawn. */
static const struct wk_sampling_params *row_params(struct rseq *q, const uint32_t *tok, uint32_t n,
                                                   struct wk_sampling_params *sp) {
  int nb = q->sp.n_bias, have = q->n_hist + (int)n;
  const int32_t *ids = q->bad + q->n_bad;
  for (int i = 0; i < q->n_bad; ids += q->bad[i++]) {
    int pre = q->bad[i] - 1, k = 0;
    if (pre > have) continue;
    for (; k < pre; k++) { /* the k-th of the last pre tokens */
      int j = have - pre + k;
      if ((j < q->n_hist ? q->hist[j] : (int32_t)tok[j - q->n_hist]) != ids[k]) break;
    }
    if (k == pre) q->bias_ids[nb] = ids[pre], q->bias[nb++] = 2.0f * KN_SAMPLE_NEVER;
  }
  if (nb == q->sp.n_bias) return &q->sp;
  *sp = q->sp;
  sp->n_bias = nb;
  return sp;
}

/* A free slot (memory of earlier sequences is reused). */
static struct rseq *seq_slot(struct wk_role *r) {
  for (int i = 0; i < r->cap_seqs; i++)
    if (!r->seqs[i].used) return &r->seqs[i];
  return NULL;
}

static int table_put(struct rseq *q, int g, const int32_t *ids, int n, int append) {
  int base = append ? q->n_bt[g] : 0;
  if (base + n > q->cap_bt[g]) {
    int cap = CM_MAX(16, q->cap_bt[g]);
    while (cap < base + n)
      cap *= 2;
    int32_t *t = realloc(q->bt[g], sizeof(int32_t) * (size_t)cap);
    if (!t) return CM_ERR_NOMEM;
    q->bt[g] = t;
    q->cap_bt[g] = cap;
  }
  if (n) memcpy(q->bt[g] + base, ids, sizeof(int32_t) * (size_t)n);
  q->n_bt[g] = base + n;
  return 0;
}

/* ---- create / destroy -------------------------------------------------------- */

/* bytes from the role's fixed arena; NULL (and r->nomem set) when out of memory */
static void *fixed(struct wk_role *r, size_t bytes) {
  void *p = cm_arena_alloc(&r->fixed, bytes);
  if (!p) r->nomem = 1;
  return p;
}

/* n zeroed elements of size bytes from the fixed arena, as fixed() */
static void *zeroed(struct wk_role *r, size_t n, size_t size) {
  void *p = cm_arena_calloc(&r->fixed, n, size);
  if (!p) r->nomem = 1;
  return p;
}

int wk_role_create(struct wk_model *model, struct wk_model *draft, const struct wk_role_opts *o,
                   struct wk_role **out) {
  int ngram = o->ngram_max > 0;
  if (!model || !o || o->max_seqs < 1 || o->max_draft < 0 || o->max_draft > PR_MAX_DRAFT ||
      (o->max_draft > 0 && !draft && !ngram) || (draft && ngram) ||
      (ngram && (o->ngram_min < 1 || o->ngram_min > o->ngram_max)))
    return CM_ERR_INVAL;
  struct wk_role *r = calloc(1, sizeof(*r));
  if (!r) return CM_ERR_NOMEM;
  const struct md_config *c = wk_model_config(model);
  const struct wk_kv_spec *kv = wk_model_kv_spec(model);
  r->model = model;
  r->draft = draft;
  r->ngram_min = ngram ? o->ngram_min : 0;
  r->ngram_max = ngram ? o->ngram_max : 0;
  r->tokenizer = o->tokenizer ? strdup(o->tokenizer) : NULL;
  r->tokenizer_gguf = !o->tokenizer && o->tokenizer_gguf ? strdup(o->tokenizer_gguf) : NULL;
  r->rank = o->rank;
  r->max_seqs = CM_MIN(o->max_seqs, wk_model_max_seqs(model));
  r->max_draft = o->max_draft;
  r->max_T = wk_model_max_batch_tokens(model);
  r->vocab = c->vocab;
  r->hidden = c->hidden;
  r->n_groups = kv->n_groups;
  r->n_pages = wk_model_n_pages(model);
  r->max_pos = c->max_pos > 0 ? c->max_pos : (1 << 30);
  for (int g = 0; g < kv->n_groups; g++)
    r->max_blocks[g] = r->max_pos / kv->groups[g].block_tokens + 2;
  r->max_rows = CM_MIN(r->max_seqs * (1 + r->max_draft), r->max_T);
  /* states outlive a step while the scheduler keeps preempted or queued
   * sequences around: room for several steps' worth */
  r->cap_seqs = 4 * r->max_seqs + 64;
  size_t S = (size_t)r->max_seqs, D1 = PR_MAX_DRAFT + 1;
  cm_arena_init(&r->fixed, 64u << 10, 0);
  r->seqs = zeroed(r, (size_t)r->cap_seqs, sizeof(*r->seqs));
  for (int k = 0; k < 2; k++) {
    struct rstep *t = &r->st[k];
    t->cur = zeroed(r, S, sizeof(*t->cur));
    t->eseq = fixed(r, sizeof(*t->eseq) * S);
    t->etok = fixed(r, sizeof(uint32_t) * S);
    t->row0 = fixed(r, sizeof(int) * S);
    t->prev = fixed(r, sizeof(int32_t) * S);
    t->srow0 = fixed(r, sizeof(int) * S);
    if (o->device_sampling) {
      t->kp = zeroed(r, (size_t)r->max_rows, sizeof(*t->kp));
      t->ko = zeroed(r, (size_t)r->max_rows, sizeof(*t->ko));
    }
  }
  r->s = &r->st[0];
  r->in = zeroed(r, S, sizeof(*r->in));
  r->toks = fixed(r, sizeof(int32_t) * (size_t)r->max_T);
  r->logits = fixed(r, sizeof(float) * (size_t)r->max_rows * (size_t)r->vocab);
  (void)wk_sampler_create(r->vocab, &r->sampler); /* NULL on failure: checked below */
  r->rs = zeroed(r, S, sizeof(*r->rs));
  r->rtok = fixed(r, sizeof(uint32_t) * S * D1);
  r->rlp = fixed(r, sizeof(float) * S * D1);
  r->rtop_ids = fixed(r, sizeof(uint32_t) * S * D1 * TOPN);
  r->rtop = fixed(r, sizeof(float) * S * D1 * TOPN);
  r->rdraft = fixed(r, sizeof(uint32_t) * S * PR_MAX_DRAFT);
  if (draft) {
    r->hid = fixed(r, sizeof(float) * (size_t)r->max_rows * (size_t)r->hidden);
    r->din = zeroed(r, S, sizeof(*r->din));
    r->dseq = fixed(r, sizeof(int) * S);
    r->dtok = fixed(r, sizeof(int32_t) * S);
    r->dgm = zeroed(r, S, sizeof(*r->dgm));
    r->hbuf[0] = fixed(r, sizeof(float) * S * (size_t)r->hidden);
    r->hbuf[1] = fixed(r, sizeof(float) * S * (size_t)r->hidden);
  }
  if (o->vision || o->vision_g4 || o->audio.tower) {
    r->emb = zeroed(r, S * PR_MAX_IMAGES, sizeof(*r->emb));
    r->bidir = zeroed(r, S * PR_MAX_IMAGES * 2, sizeof(*r->bidir));
    r->step_ims = zeroed(r, S * PR_MAX_IMAGES, sizeof(*r->step_ims));
    r->step_rows = zeroed(r, S * PR_MAX_IMAGES, sizeof(*r->step_rows));
  }
  if (r->nomem || !r->sampler) {
    wk_role_destroy(r);
    return CM_ERR_NOMEM;
  }
  for (int i = 0; i < r->cap_seqs; i++)
    wk_penalty_init(&r->seqs[i].pen);
  if ((o->vision && wk_encoder_create(o->vision, 0, &r->enc)) ||
      (!o->vision && (o->vision_g4 || o->audio.tower) &&
       wk_encoder_create_g4(o->vision_g4, &o->audio, 0, &r->enc))) {
    wk_role_destroy(r);
    return CM_ERR_NOMEM;
  }
  *out = r;
  return 0;
}

void wk_role_destroy(struct wk_role *r) {
  if (!r) return;
  for (int i = 0; r->seqs && i < r->cap_seqs; i++) {
    wk_penalty_free(&r->seqs[i].pen);
    wk_ngram_free(&r->seqs[i].ctx);
    for (int g = 0; g < WK_MAX_KV_GROUPS; g++)
      free(r->seqs[i].bt[g]);
    free(r->seqs[i].bias_ids);
    free(r->seqs[i].bias);
    free(r->seqs[i].bad);
  }
  wk_encoder_free(r->enc);
  gram_build_free(r->gram_th);
  wk_grammars_free(r->gram);
  free(r->gbits);
  for (int k = 0; k < 2; k++) {
    free(r->st[k].sc);
    free(r->st[k].sc_rank);
  }
  free(r->sc_ids);
  free(r->rplp);
  free(r->rplp_rank);
  free(r->rplp_ids);
  free(r->rplp_top);
  free(r->tokenizer);
  free(r->tokenizer_gguf);
  wk_sampler_destroy(r->sampler);
  free(r->dlog);
  cm_arena_free(&r->fixed); /* dgm's matchers live within a step */
  free(r);
}

/* What building the structured-output state takes and gives, apart from the role
 * so that a thread may do it (wk_role_grammars_start). */
struct gram_build {
  char *tokenizer, *gguf; /* the role's sources (one of them) */
  int32_t vocab;
  int eos[MD_MAX_EOS], n_eos;
  struct wk_grammars *out; /* the result, or NULL with why */
  int rc;
  char why[256];
  pthread_t th;
  int threaded;    /* th runs it and is to be joined */
  unsigned *flags; /* with th: the role's gram_flags, set when it is done */
};

/* Makes b->out from the tokenizer: the frontend's (tokenizer.json, or a GGUF file's
 * metadata). */
static void gram_build_run(struct gram_build *b) {
  struct tk_tokenizer *tok = NULL;
  b->rc = b->tokenizer ? tk_load(b->tokenizer, &tok, b->why, sizeof(b->why))
                       : tk_load_gguf(b->gguf, &tok, NULL, b->why, sizeof(b->why));
  if (!b->rc) {
    b->rc = wk_grammars_create(tok, b->vocab, b->eos, b->n_eos, &b->out);
    snprintf(b->why, sizeof(b->why), "%s", cm_strerror(b->rc));
  }
  tk_free(tok);
  /* the tokenizer's ~37 MB (262,144 tokens' maps and merges) go back to the
     system now, not at some later allocation: it was needed only for the pieces */
  malloc_trim(0);
}

static void *gram_build_main(void *arg) {
  struct gram_build *b = arg;
  uint64_t t0 = cm_time_ns();
  gram_build_run(b);
  if (b->rc)
    cm_warn("worker", "structured outputs: %s: %s", b->tokenizer ? b->tokenizer : b->gguf, b->why);
  else
    cm_info("worker", "structured-output state built in %.2f s", (double)(cm_time_ns() - t0) / 1e9);
  __atomic_store_n(b->flags, b->rc ? PR_BEAT_GRAMMARS_FAILED : PR_BEAT_GRAMMARS, __ATOMIC_RELEASE);
  return NULL;
}

static void gram_build_free(struct gram_build *b) {
  if (!b) return;
  if (b->threaded) pthread_join(b->th, NULL);
  wk_grammars_free(b->out);
  free(b);
}

static struct gram_build *gram_build_new(const struct wk_role *r) {
  struct gram_build *b = calloc(1, sizeof(*b));
  if (!b) return NULL;
  b->tokenizer = r->tokenizer;
  b->gguf = r->tokenizer_gguf;
  b->vocab = r->vocab;
  const struct md_config *c = wk_model_config(r->model);
  b->n_eos = c->n_eos;
  memcpy(b->eos, c->eos_ids, sizeof(int) * (size_t)c->n_eos);
  return b;
}

/* Takes b's result into r (and frees b). */
static int gram_install(struct wk_role *r, struct gram_build *b, char *err, size_t errlen) {
  if (b->threaded) pthread_join(b->th, NULL);
  b->threaded = 0;
  int rc = b->rc;
  if (!rc) {
    r->gram = b->out;
    b->out = NULL;
  } else {
    cm_fail(err, errlen, CM_ERR_UNSUPPORTED, "structured outputs: %s: %s",
            r->tokenizer ? r->tokenizer : r->tokenizer_gguf, b->why);
  }
  gram_build_free(b);
  __atomic_store_n(&r->gram_flags, rc ? PR_BEAT_GRAMMARS_FAILED : PR_BEAT_GRAMMARS,
                   __ATOMIC_RELEASE);
  return rc ? CM_ERR_UNSUPPORTED : 0;
}

/* The structured-output state, on first use: the thread's that
 * wk_role_grammars_start began (waiting for it), else made here. */
static int grammars(struct wk_role *r, char *err, size_t errlen) {
  if (r->gram) return 0;
  if (r->gram_th) {
    struct gram_build *b = r->gram_th;
    r->gram_th = NULL;
    return gram_install(r, b, err, errlen);
  }
  int have = r->tokenizer || r->tokenizer_gguf, rc = 0;
  struct gram_build *b = NULL;
  if (!have || wk_role_grammars_flags(r) == PR_BEAT_GRAMMARS_FAILED)
    rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                 "structured outputs need the model's tokenizer (tokenizer.json or a GGUF "
                 "file's)%s",
                 have ? ", which did not load" : "");
  else if (!(b = gram_build_new(r)))
    rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for structured outputs");
  if (rc) { /* said to the scheduler too, which then refuses constrained requests */
    __atomic_store_n(&r->gram_flags, PR_BEAT_GRAMMARS_FAILED, __ATOMIC_RELEASE);
    return rc;
  }
  gram_build_run(b);
  return gram_install(r, b, err, errlen);
}

void wk_role_grammars_start(struct wk_role *r) {
  if (r->gram || r->gram_th || wk_role_grammars_flags(r)) return;
  struct gram_build *b = r->tokenizer || r->tokenizer_gguf ? gram_build_new(r) : NULL;
  if (b) {
    b->threaded = 1;
    b->flags = &r->gram_flags;
    if (!pthread_create(&b->th, NULL, gram_build_main, b)) {
      r->gram_th = b; /* it says it is done when a step or wk_role_grammars_flags looks */
      return;
    }
    b->threaded = 0;
    gram_build_free(b);
  }
  /* no thread (no tokenizer, no memory): here and now, so that the flags say
     how it went and the scheduler holds no request for it */
  char err[256];
  (void)grammars(r, err, sizeof(err));
}

unsigned wk_role_grammars_flags(struct wk_role *r) {
  return __atomic_load_n(&r->gram_flags, __ATOMIC_ACQUIRE);
}

void wk_role_reset(struct wk_role *r) {
  r->n_open = 0; /* open steps are dropped with the sequences */
  for (int i = 0; i < r->cap_seqs; i++)
    if (r->seqs[i].used) seq_drop(r, &r->seqs[i]);
}

int wk_role_n_seqs(const struct wk_role *r) {
  int n = 0;
  for (int i = 0; i < r->cap_seqs; i++)
    n += r->seqs[i].used;
  return n;
}

void wk_role_sampling(const struct pr_sampling *in, uint64_t fallback_seed,
                      struct wk_sampling_params *out) {
  wk_sampling_params_default(out);
  out->temperature = in->temperature;
  out->top_k = in->top_k > 0 ? in->top_k : 0;
  out->top_p = in->top_p;
  out->min_p = in->min_p;
  out->presence_penalty = in->presence_penalty;
  out->frequency_penalty = in->frequency_penalty;
  out->repetition_penalty = in->repetition_penalty;
  out->seed = in->has_seed ? in->seed : fallback_seed;
  out->n_logprobs = in->logprobs < 0 ? -1 : CM_MIN(in->logprobs, WK_MAX_LOGPROBS);
}

/* A splitmix64 mix: the seed of a request that gave none. */
static uint64_t mix64(uint64_t x) {
  return cm_splitmix64(&x);
}

/* ---- checking a step (nothing changes until it passes) ------------------------- */

/* The first id of ids outside a vocabulary of `vocab`, or NULL. */
static const uint32_t *outside_vocab(const struct pr_u32s *ids, int vocab) {
  for (uint32_t j = 0; j < ids->n; j++)
    if (ids->v[j] >= (uint32_t)vocab) return &ids->v[j];
  return NULL;
}

/* Whether sequence id is in the step's free list (dropped before the step runs). */
static int freed_by(const struct pr_step *st, uint64_t id) {
  for (uint32_t j = 0; j < st->free_ids.n; j++)
    if (st->free_ids.v[j] == id) return 1;
  return 0;
}

/* The step as the sequences' own state completes it (async scheduling), in *out: a
 * PR_SEQ_PREV_TOKEN sequence runs the token it sampled last, moved on by the drafts its
 * step accepted, and with PR_SEQ_PREV_DRAFTS verifies the drafts that step proposed — no
 * more than num_draft, nor past its max_tokens: what a synchronous step would send. A
 * sequence without that state stays as sent, for check_step to refuse. */
static void resolve_prev(struct wk_role *r, const struct pr_step *st, struct pr_step *out) {
  *out = *st;
  if (st->n_seqs > (uint32_t)r->max_seqs) return;
  for (uint32_t i = 0; i < st->n_seqs; i++) {
    const struct pr_step_seq *s = &st->seqs[i];
    struct rseq *q = (s->flags & PR_SEQ_PREV_TOKEN) ? seq_find(r, s->seq_id) : NULL;
    r->s->prev[i] = -1;
    if (!q || !(q->has_last || q->pend) || freed_by(st, s->seq_id)) continue;
    if (out->seqs == st->seqs) {
      memcpy(r->s->eseq, st->seqs, sizeof(*r->s->eseq) * st->n_seqs);
      out->seqs = r->s->eseq;
    }
    struct pr_step_seq *e = &r->s->eseq[i];
    /* a token the open step sampled is still on the backend: the forward takes it
     * from there (wk_batch.prev_rows), 0 stands in for it on the host */
    r->s->etok[i] = q->pend ? 0 : (uint32_t)q->last;
    if (q->pend) r->s->prev[i] = q->pend_row;
    e->tokens = (struct pr_u32s){&r->s->etok[i], 1};
    e->start_pos += q->accepted;
    if (s->flags & PR_SEQ_PREV_DRAFTS) {
      /* a synchronous step gives the token at p at most gen_end - p - 2 drafts */
      int64_t room = q->gen_end ? (int64_t)q->gen_end - e->start_pos - 2 : 0;
      int64_t n = CM_MIN((int64_t)CM_MIN(s->num_draft, q->n_prop), room);
      e->draft_tokens = (struct pr_u32s){q->prop, (uint32_t)CM_MAX(n, 0)};
    }
  }
}

static int check_step(struct wk_role *r, const struct pr_step *st, char *err, size_t errlen) {
  if (st->n_seqs > (uint32_t)r->max_seqs)
    return cm_fail(err, errlen, CM_ERR_TOOBIG, "step %llu: %u sequences (at most %d)",
                   (unsigned long long)st->step_id, st->n_seqs, r->max_seqs);
  int64_t T = 0, rows = 0, n_new = 0;
  for (uint32_t i = 0; i < st->n_seqs; i++) {
    const struct pr_step_seq *s = &st->seqs[i];
    unsigned long long id = (unsigned long long)s->seq_id;
    for (uint32_t j = 0; j < i; j++)
      if (st->seqs[j].seq_id == s->seq_id)
        return cm_fail(err, errlen, CM_ERR_INVAL, "sequence %llu appears twice in one step", id);
    if (s->flags & ~(uint32_t)PR_SEQ_FLAGS_ALL)
      return cm_fail(err, errlen, CM_ERR_INVAL, "sequence %llu: unknown flags 0x%x", id, s->flags);
    int is_new = !!(s->flags & PR_SEQ_NEW), append = !!(s->flags & PR_SEQ_APPEND_BLOCKS);
    if (is_new && append)
      return cm_fail(err, errlen, CM_ERR_INVAL, "sequence %llu: APPEND_BLOCKS with NEW", id);
    struct rseq *q = seq_find(r, s->seq_id);
    if (q && freed_by(st, s->seq_id)) q = NULL; /* dropped before the step runs */
    if (!is_new && !q)
      return cm_fail(err, errlen, CM_ERR_STATE, "sequence %llu is unknown (no NEW step, or freed)",
                     id);
    if (is_new && !q) n_new++;
    uint32_t nt = s->tokens.n + s->draft_tokens.n;
    if (nt == 0) return cm_fail(err, errlen, CM_ERR_INVAL, "sequence %llu: no tokens", id);
    if ((uint64_t)s->start_pos + nt > (uint64_t)r->max_pos)
      return cm_fail(err, errlen, CM_ERR_RANGE,
                     "sequence %llu: positions up to %llu exceed the model "
                     "length %d",
                     id, (unsigned long long)s->start_pos + nt, r->max_pos);
    T += nt;
    if (T > r->max_T)
      return cm_fail(err, errlen, CM_ERR_TOOBIG, "step %llu: more than %d tokens",
                     (unsigned long long)st->step_id, r->max_T);
    const char *what = "token";
    const uint32_t *bad = outside_vocab(&s->tokens, r->vocab);
    if (!bad) {
      what = "draft";
      bad = outside_vocab(&s->draft_tokens, r->vocab);
    }
    if (!bad && (bad = outside_vocab(&s->before, r->vocab))) what = "earlier token";
    if (bad)
      return cm_fail(err, errlen, CM_ERR_RANGE,
                     "sequence %llu: %s id %u outside the vocabulary (%d)", id, what, *bad,
                     r->vocab);
    if (s->draft_tokens.n > (uint32_t)r->max_draft || s->num_draft > (uint32_t)r->max_draft)
      return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                     "sequence %llu: %u drafts to verify, %u to "
                     "propose; this worker drafts at most %d",
                     id, s->draft_tokens.n, s->num_draft, r->max_draft);
    if ((s->draft_tokens.n || s->num_draft) && !(s->flags & PR_SEQ_SAMPLE))
      return cm_fail(err, errlen, CM_ERR_INVAL, "sequence %llu: drafts without SAMPLE", id);
    int own_drafts = !!(s->flags & PR_SEQ_PREV_DRAFTS); /* resolve_prev put them in */
    if ((s->flags & PR_SEQ_PREV_TOKEN) &&
        (is_new || !q || !(q->has_last || q->pend) || s->tokens.n != 1 ||
         (s->draft_tokens.n && !own_drafts) || (s->flags & PR_SEQ_PREFILL)))
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "sequence %llu: PREV_TOKEN needs one token to run after a step that "
                     "sampled this sequence",
                     id);
    if (own_drafts && !(s->flags & PR_SEQ_PREV_TOKEN))
      return cm_fail(err, errlen, CM_ERR_INVAL, "sequence %llu: PREV_DRAFTS without PREV_TOKEN",
                     id);
    if (s->tokens.n == 0 && s->draft_tokens.n)
      /* the first draft is checked against the logits of the token before it */
      return cm_fail(err, errlen, CM_ERR_INVAL, "sequence %llu: drafts without a token before them",
                     id);
    if (is_new && s->sampling.lora && !wk_model_has_lora(r->model, (int)s->sampling.lora))
      return cm_fail(err, errlen, CM_ERR_RANGE,
                     "sequence %llu: LoRA adapter %u, which this worker does not hold", id,
                     s->sampling.lora);
    if (is_new && s->sampling.grammar_kind) {
      int rc = grammars(r, err, errlen);
      if (rc) return rc;
    }
    if (s->n_images && !r->enc)
      return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                     "sequence %llu: images or audio, and this "
                     "model has no encoder for them",
                     id);
    for (uint32_t j = 0; j < s->n_images; j++) {
      int rc = wk_encoder_check(r->enc, &s->images[j], err, errlen);
      if (rc) return rc;
    }
    if (s->flags & PR_SEQ_SAMPLE) rows += 1 + s->draft_tokens.n;
    if (s->flags & PR_SEQ_SCORE) {
      int top = is_new ? s->sampling.prompt_logprobs : q->prompt_top;
      if (top < 0 || !(s->flags & PR_SEQ_PREFILL) || s->draft_tokens.n)
        return cm_fail(err, errlen, CM_ERR_INVAL,
                       "sequence %llu: SCORE needs a prompt chunk without drafts of a sequence "
                       "that asked its prompt's logprobs",
                       id);
      if (!(s->flags & PR_SEQ_SAMPLE) && s->prompt_next >= (uint32_t)r->vocab)
        return cm_fail(err, errlen, CM_ERR_RANGE,
                       "sequence %llu: prompt token id %u outside the vocabulary (%d)", id,
                       s->prompt_next, r->vocab);
    }
    if (s->n_groups != 0 && s->n_groups != (uint32_t)r->n_groups)
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "sequence %llu: %u block tables (the model has %d KV "
                     "groups)",
                     id, s->n_groups, r->n_groups);
    if (is_new && s->n_groups == 0)
      return cm_fail(err, errlen, CM_ERR_INVAL, "sequence %llu: NEW without block tables", id);
    for (uint32_t g = 0; g < s->n_groups; g++) {
      const struct pr_i32s *t = &s->block_tables[g];
      int64_t have = append && q ? q->n_bt[g] : 0;
      if (have + t->n > r->max_blocks[g])
        return cm_fail(err, errlen, CM_ERR_TOOBIG,
                       "sequence %llu: group %u table of %lld blocks "
                       "(at most %d)",
                       id, g, (long long)(have + t->n), r->max_blocks[g]);
      for (uint32_t j = 0; j < t->n; j++)
        if (t->v[j] < -1 || t->v[j] >= r->n_pages)
          return cm_fail(err, errlen, CM_ERR_RANGE,
                         "sequence %llu: group %u block %d outside the "
                         "pool (%d pages)",
                         id, g, t->v[j], r->n_pages);
    }
  }
  if (rows > r->max_rows)
    return cm_fail(err, errlen, CM_ERR_TOOBIG, "step %llu: %lld sampled rows (at most %d)",
                   (unsigned long long)st->step_id, (long long)rows, r->max_rows);
  int free_slots = 0;
  for (int i = 0; i < r->cap_seqs; i++) {
    if (!r->seqs[i].used) {
      free_slots++;
      continue;
    }
    for (uint32_t j = 0; j < st->free_ids.n; j++)
      if (st->free_ids.v[j] == r->seqs[i].id) {
        free_slots++;
        break;
      }
  }
  if (n_new > free_slots)
    return cm_fail(err, errlen, CM_ERR_FULL, "no room for %lld new sequences (%d states held)",
                   (long long)n_new, wk_role_n_seqs(r));
  return 0;
}

/* ---- the step ---------------------------------------------------------------------- */

/* Drops the state of the sequences in free_ids. */
static void drop_freed(struct wk_role *r, const struct pr_step *st) {
  for (uint32_t j = 0; j < st->free_ids.n; j++) {
    struct rseq *q = seq_find(r, st->free_ids.v[j]);
    if (q) seq_drop(r, q);
  }
}

/* Whether sequence s's drafts can be verified from backend-sampled rows:
 * greedy without penalties, where verification is "the draft is the row's
 * argmax" (wk_sample_verify's greedy rule) and each row's token is the argmax
 * whatever the drafts before it. Other requests are verified on the host
 * (penalties grow along the drafts). */
static int verify_on_backend(struct wk_role *r, const struct pr_step_seq *s) {
  struct wk_sampling_params sp;
  const struct rseq *q = (s->flags & PR_SEQ_NEW) ? NULL : seq_find(r, s->seq_id);
  if (q)
    sp = q->sp;
  else
    wk_role_sampling(&s->sampling, 0, &sp);
  return sp.temperature < 1e-5f && sp.presence_penalty == 0 && sp.frequency_penalty == 0 &&
         sp.repetition_penalty == 1;
}

/* Penalty state of n tokens at positions pos.. that q ran but did not sample here:
 * prompt tokens below its prompt's end, generated ones (re-run after a preemption, or
 * from the prefix cache) from there on, as when they were sampled. */
static int penalize(struct rseq *q, const int32_t *ids, uint32_t pos, uint32_t n) {
  uint32_t np = pos < q->n_prompt ? CM_MIN(n, q->n_prompt - pos) : 0;
  int rc = np ? wk_penalty_add_prompt(&q->pen, ids, (int)np) : 0;
  for (uint32_t j = np; j < n && !rc; j++)
    rc = wk_penalty_add_output(&q->pen, ids[j]);
  return rc;
}

/* Applies frees, NEW, block tables and prompt penalties, and fills the batch. */
static int apply_step(struct wk_role *r, const struct pr_step *st, struct wk_batch *b, char *err,
                      size_t errlen) {
  drop_freed(r, st);
  if (r->enc) wk_encoder_begin_step(r->enc);
  int T = 0, rows = 0, want_hidden = 0, n_ims = 0, n_sc = 0, sc_top = 0;
  /* drafts to verify need the whole distribution on the host, but greedy ones */
  int dev = r->s->kp != NULL;
  for (uint32_t i = 0; i < st->n_seqs && dev; i++)
    if (st->seqs[i].draft_tokens.n && !verify_on_backend(r, &st->seqs[i])) dev = 0;
  /* rows with a structured output: a backend whose kn_sample takes masks (the CPU's;
   * CUDA's once checked) samples them; on others they are masked on the host */
  int takes = kn_sample_takes_masks(wk_model_backend(r->model));
  /* rows with logit biases likewise, on a backend whose kn_sample takes them */
  int biases = kn_sample_takes_bias(wk_model_backend(r->model));
  for (uint32_t i = 0; i < st->n_seqs && dev && (!takes || !biases); i++) {
    const struct pr_step_seq *s = &st->seqs[i];
    const struct rseq *q = (s->flags & PR_SEQ_NEW) ? NULL : seq_find(r, s->seq_id);
    if (!(s->flags & PR_SEQ_SAMPLE)) continue;
    if (!takes && (q ? q->gm != NULL : s->sampling.grammar_kind != 0)) dev = 0;
    if (!biases && (q ? q->sp.n_bias : (int)s->sampling.bias_ids.n)) dev = 0;
  }
  /* rows with bad words: their bans follow the tokens drawn, on the host */
  for (uint32_t i = 0; i < st->n_seqs && dev; i++) {
    const struct pr_step_seq *s = &st->seqs[i];
    const struct rseq *q = (s->flags & PR_SEQ_NEW) ? NULL : seq_find(r, s->seq_id);
    if ((s->flags & PR_SEQ_SAMPLE) && (q ? q->n_bad : (int)s->sampling.bad_lens.n)) dev = 0;
  }
  for (uint32_t i = 0; i < st->n_seqs; i++) {
    const struct pr_step_seq *s = &st->seqs[i];
    struct rseq *q = seq_find(r, s->seq_id);
    if (s->flags & PR_SEQ_NEW) {
      if (q) seq_drop(r, q);
      q = seq_slot(r);
      CM_ASSERT(q); /* check_step counted the free slots */
      q->used = 1;
      q->id = s->seq_id;
      wk_role_sampling(&s->sampling, mix64(s->seq_id ^ (uint64_t)(uintptr_t)r), &q->sp);
      if (keep_bias(q, &s->sampling) || keep_bad_words(q, &s->sampling))
        return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for logit biases");
      q->hist_end = s->num_prompt;
      if (q->n_bad && s->start_pos > s->num_prompt &&
          s->num_prompt + s->generated.n != s->start_pos)
        return cm_fail(err, errlen, CM_ERR_INVAL,
                       "sequence %llu: %u generated tokens do not reach position %u",
                       (unsigned long long)s->seq_id, s->generated.n, s->start_pos);
      for (uint32_t j = 0; q->n_bad && j < s->generated.n; j++)
        (void)hist_push(q, s->num_prompt + j, (int32_t)s->generated.v[j]);
      q->gen_end = s->max_tokens ? s->num_prompt + s->max_tokens : 0;
      q->n_prompt = s->num_prompt;
      q->lora = (int)s->sampling.lora;
      q->prompt_top =
          s->sampling.prompt_logprobs < 0 ? -1 : CM_MIN(s->sampling.prompt_logprobs, TOPN);
      if (s->before.n && s->before.n != s->start_pos)
        return cm_fail(err, errlen, CM_ERR_INVAL, "sequence %llu: %u tokens before position %u",
                       (unsigned long long)s->seq_id, s->before.n, s->start_pos);
      if (penalize(q, (const int32_t *)s->before.v, 0, s->before.n) ||
          (r->ngram_max && wk_ngram_put(&q->ctx, 0, (const int32_t *)s->before.v, s->before.n)))
        return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for a sequence's token history");
      if (s->sampling.grammar_kind) {
        int rc = wk_grammars_matcher(r->gram, s->sampling.grammar_kind, s->sampling.grammar.v,
                                     s->sampling.grammar.n, &q->gm, err, errlen);
        if (rc) return rc;
        /* resumed after a preemption: the tokens generated before this step */
        q->followed = s->num_prompt;
        if (s->generated.n && s->num_prompt + s->generated.n != s->start_pos)
          return cm_fail(err, errlen, CM_ERR_INVAL,
                         "sequence %llu: %u generated tokens do not reach position %u",
                         (unsigned long long)s->seq_id, s->generated.n, s->start_pos);
        for (uint32_t j = 0; j < s->generated.n; j++, q->followed++)
          if (wk_grammars_accept(r->gram, q->gm, (int32_t)s->generated.v[j]))
            return cm_fail(err, errlen, CM_ERR_INVAL,
                           "sequence %llu: generated token %u leaves its structured output",
                           (unsigned long long)s->seq_id, s->generated.v[j]);
      }
    }
    CM_ASSERT(q);
    r->s->cur[i] = q;
    int append = !!(s->flags & PR_SEQ_APPEND_BLOCKS);
    for (uint32_t g = 0; g < s->n_groups; g++)
      if (table_put(q, (int)g, s->block_tables[g].v, (int)s->block_tables[g].n, append))
        return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for block tables");
    int32_t *t = r->toks + T;
    for (uint32_t j = 0; j < s->tokens.n; j++)
      t[j] = (int32_t)s->tokens.v[j];
    for (uint32_t j = 0; j < s->draft_tokens.n; j++)
      t[s->tokens.n + j] = (int32_t)s->draft_tokens.v[j];
    /* the n-gram history takes every token a step names (those it holds are passed over):
     * a resumed sequence's last token may come alone, without PREFILL */
    if (((s->flags & PR_SEQ_PREFILL) && penalize(q, t, s->start_pos, s->tokens.n)) ||
        (r->ngram_max && !(s->flags & PR_SEQ_PREV_TOKEN) &&
         wk_ngram_put(&q->ctx, s->start_pos, t, s->tokens.n)))
      return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for a sequence's token history");
    /* generated tokens run again after a preemption: the bad words' history too */
    for (uint32_t j = 0; q->n_bad && (s->flags & PR_SEQ_PREFILL) && j < s->tokens.n; j++)
      if (hist_push(q, s->start_pos + j, t[j]))
        return cm_fail(err, errlen, CM_ERR_INVAL,
                       "sequence %llu: token %u runs past its generated ones (%u)",
                       (unsigned long long)s->seq_id, s->start_pos + j, q->hist_end);
    /* generated tokens run again after a preemption: the matcher follows those it has
     * not seen (the ones it sampled itself it followed then) */
    for (uint32_t j = 0; q->gm && j < s->tokens.n; j++) {
      uint32_t pos = s->start_pos + j;
      if (pos < q->followed) continue;
      if (pos > q->followed || wk_grammars_accept(r->gram, q->gm, t[j]))
        return cm_fail(err, errlen, CM_ERR_INVAL,
                       "sequence %llu: generated token %d at %u leaves its structured output",
                       (unsigned long long)s->seq_id, (int)t[j], pos);
      q->followed++;
    }
    struct wk_seq_input *in = &r->in[i];
    memset(in, 0, sizeof(*in));
    in->tokens = t;
    in->n_tokens = (int)(s->tokens.n + s->draft_tokens.n);
    in->pos0 = (int)s->start_pos;
    in->lora = q->lora;
    for (int g = 0; g < r->n_groups; g++) {
      in->block_tables[g] = q->bt[g];
      in->n_blocks[g] = q->n_bt[g];
    }
    if (s->n_images) { /* the rows come from the encoder below, for the whole step */
      struct wk_seq_embed *emb = r->emb + (size_t)i * PR_MAX_IMAGES;
      int32_t *bd = r->bidir + (size_t)i * PR_MAX_IMAGES * 2;
      int n_bd = 0; /* an image's tokens see each other; a clip's are causal */
      for (uint32_t j = 0; j < s->n_images; j++) {
        const struct pr_image *im = &s->images[j];
        emb[j] = (struct wk_seq_embed){(int)im->pos, (int)im->n_tokens, NULL};
        if (im->kind != PR_MEDIA_AUDIO) {
          bd[2 * n_bd] = (int32_t)im->pos;
          bd[2 * n_bd++ + 1] = (int32_t)(im->pos + im->n_tokens);
        }
        r->step_ims[n_ims++] = im;
      }
      in->embeds = emb;
      in->n_embeds = (int)s->n_images;
      in->bidir = n_bd ? bd : NULL;
      in->n_bidir = n_bd;
    }
    r->s->row0[i] = -1;
    if (s->flags & PR_SEQ_SAMPLE) {
      in->n_out = 1 + (int)s->draft_tokens.n;
      r->s->row0[i] = rows;
      if (dev) /* one row per token sampled: the step's own, then one per draft */
        for (int k = 0; k < in->n_out; k++)
          wk_sampling_to_kn(&q->sp, &q->pen, (uint64_t)s->start_pos + s->tokens.n + (uint64_t)k,
                            &r->s->kp[rows + k]);
      rows += in->n_out;
      if (s->num_draft) want_hidden = 1;
    }
    /* a prompt chunk's rows before its sampling one score the token after each */
    r->s->srow0[i] = -1;
    int n_score = (s->flags & PR_SEQ_SCORE) ? in->n_tokens - in->n_out : 0;
    if (n_score > 0) {
      int rc = score_room(r, err, errlen);
      if (rc) return rc;
      for (int j = 0; j < n_score; j++)
        r->sc_ids[n_sc + j] = j + 1 < in->n_tokens ? t[j + 1] : (int32_t)s->prompt_next;
      in->n_score = n_score;
      in->score_ids = r->sc_ids + n_sc;
      r->s->srow0[i] = n_sc;
      n_sc += n_score;
      sc_top = CM_MAX(sc_top, q->prompt_top);
    }
    T += in->n_tokens;
  }
  if (n_ims) { /* every image of the step through the encoder cache at once */
    int rc = wk_encoder_get_many(r->enc, r->step_ims, n_ims, r->step_rows, err, errlen);
    if (rc) return rc;
    for (uint32_t i = 0, k = 0; i < st->n_seqs; i++)
      for (uint32_t j = 0; j < st->seqs[i].n_images; j++)
        r->emb[(size_t)i * PR_MAX_IMAGES + j].rows = r->step_rows[k++];
  }
  b->seqs = r->in;
  b->n_seqs = (int)st->n_seqs;
  b->logits = rows && !dev ? r->logits : NULL;
  b->prev_rows = NULL;
  for (uint32_t i = 0; i < st->n_seqs; i++)
    if (r->s->prev[i] >= 0) b->prev_rows = r->s->prev;
  r->s->rows = rows;
  b->sample = dev ? r->s->kp : NULL;
  b->sampled = rows && dev ? r->s->ko : NULL;
  r->s->dev_step = dev;
  b->hidden = want_hidden ? r->hid : NULL;
  b->scored = n_sc ? r->s->sc : NULL;
  b->score_ranks = n_sc ? r->s->sc_rank : NULL;
  b->score_top = sc_top;
  return 0;
}

/* The scored rows' buffers, made when a step first scores. */
static int score_room(struct wk_role *r, char *err, size_t errlen) {
  size_t T = (size_t)r->max_T;
  struct rstep *t = r->s;
  if (!r->sc_ids) r->sc_ids = malloc(sizeof(*r->sc_ids) * T);
  if (!r->rplp) r->rplp = malloc(sizeof(*r->rplp) * T);
  if (!r->rplp_rank) r->rplp_rank = malloc(sizeof(*r->rplp_rank) * T);
  if (!r->rplp_ids) r->rplp_ids = malloc(sizeof(*r->rplp_ids) * T * TOPN);
  if (!r->rplp_top) r->rplp_top = malloc(sizeof(*r->rplp_top) * T * TOPN);
  if (!t->sc) t->sc = malloc(sizeof(*t->sc) * T);
  if (!t->sc_rank) t->sc_rank = malloc(sizeof(*t->sc_rank) * T);
  if (r->sc_ids && r->rplp && r->rplp_rank && r->rplp_ids && r->rplp_top && t->sc && t->sc_rank)
    return 0;
  return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for scored rows");
}

/* Step sequence i's scored rows into its RESULT entry: the logprobs of the prompt
 * tokens after start_pos, with the top entries the sequence asked. */
static void score_result(struct wk_role *r, const struct pr_step_seq *s, int i,
                         struct pr_result_seq *rs) {
  const struct rseq *q = r->s->cur[i];
  int row = r->s->srow0[i];
  uint32_t n = s->tokens.n - ((s->flags & PR_SEQ_SAMPLE) ? 1 : 0);
  uint32_t k = (uint32_t)q->prompt_top;
  float *lp = r->rplp + row;
  uint32_t *rank = r->rplp_rank + row;
  uint32_t *ids = r->rplp_ids + (size_t)row * TOPN;
  float *top = r->rplp_top + (size_t)row * TOPN;
  for (uint32_t j = 0; j < n; j++) {
    const struct kn_sample_out *o = &r->s->sc[row + (int)j];
    lp[j] = o->logprob;
    rank[j] = (uint32_t)r->s->sc_rank[row + (int)j];
    for (uint32_t c = 0; c < k; c++) {
      int have = (int)c < o->n_top;
      ids[j * k + c] = have ? (uint32_t)o->top_ids[c] : 0;
      top[j * k + c] = have ? o->top_logprobs[c] : -INFINITY;
    }
  }
  rs->prompt_logprobs = (struct pr_logprobs){k, {lp, n}, {ids, n * k}, {top, n * k}, {rank, n}};
  rs->prompt_pos = s->start_pos + 1;
}

/* Samples (or verifies drafts then samples) for step sequence i; fills rs. */
static int sample_seq(struct wk_role *r, const struct pr_step_seq *s, int i,
                      struct pr_result_seq *rs, int *last_row) {
  struct rseq *q = r->s->cur[i];
  size_t D1 = PR_MAX_DRAFT + 1;
  uint32_t *tok = r->rtok + (size_t)i * D1;
  float *lp = r->rlp + (size_t)i * D1;
  uint32_t *top_ids = r->rtop_ids + (size_t)i * D1 * TOPN;
  float *top = r->rtop + (size_t)i * D1 * TOPN;
  int n_top = q->sp.n_logprobs > 0 ? q->sp.n_logprobs : 0;
  uint32_t n = 0, accepted = 0;
  int rc = 0, row = r->s->row0[i];
  for (uint32_t k = 0; k <= s->draft_tokens.n; k++, row++) {
    float *lg = r->logits + (size_t)row * (size_t)r->vocab;
    uint64_t counter = (uint64_t)s->start_pos + s->tokens.n + k;
    struct wk_sample_result out;
    int acc = 0;
    /* a structured output's mask for this row, for the host's draw */
    const uint32_t *allow = q->gm ? r->gbits + (size_t)row * wk_grammars_mask_words(r->gram) : NULL;
    if (r->s->dev_step) { /* greedy: a draft is taken when it is the row's argmax */
      wk_sample_result_from_kn(&r->s->ko[row], &out);
      acc = k < s->draft_tokens.n && out.token == (int32_t)s->draft_tokens.v[k];
    } else {
      struct wk_sampling_params banned;
      const struct wk_sampling_params *sp = row_params(q, tok, n, &banned);
      if (k < s->draft_tokens.n)
        rc = wk_sample_verify(r->sampler, lg, sp, &q->pen, counter, (int32_t)s->draft_tokens.v[k],
                              allow, &acc, &out);
      else
        rc = wk_sample_masked(r->sampler, lg, sp, &q->pen, counter, allow, &out);
    }
    if (rc || (rc = hist_push(q, (uint32_t)counter, out.token))) return rc;
    if (r->ngram_max && (rc = wk_ngram_put(&q->ctx, (uint32_t)counter, &out.token, 1))) return rc;
    tok[n] = (uint32_t)out.token;
    if (q->sp.n_logprobs >= 0) {
      lp[n] = out.logprob;
      for (int j = 0; j < n_top; j++) {
        int have = j < out.n_top;
        top_ids[(size_t)n * (size_t)n_top + (size_t)j] = have ? (uint32_t)out.top_ids[j] : 0;
        top[(size_t)n * (size_t)n_top + (size_t)j] = have ? out.top_logprobs[j] : -INFINITY;
      }
    }
    n++;
    if ((rc = wk_penalty_add_output(&q->pen, out.token))) return rc;
    if (q->gm) {
      if ((rc = wk_grammars_accept(r->gram, q->gm, out.token))) return rc;
      q->followed = (uint32_t)counter + 1; /* counter is the sampled token's position */
    }
    if (k < s->draft_tokens.n && !acc) break;
    if (k < s->draft_tokens.n) accepted++;
  }
  *last_row = r->s->row0[i] + (int)accepted;
  memset(rs, 0, sizeof(*rs));
  rs->seq_id = s->seq_id;
  rs->tokens.v = tok;
  rs->tokens.n = n;
  rs->num_accepted = accepted;
  rs->num_verified = s->draft_tokens.n;
  if (q->sp.n_logprobs >= 0) {
    rs->logprobs.n_top = (uint32_t)n_top;
    rs->logprobs.sampled.v = lp;
    rs->logprobs.sampled.n = n;
    rs->logprobs.top_ids.v = top_ids;
    rs->logprobs.top_ids.n = n * (uint32_t)n_top;
    rs->logprobs.top.v = top;
    rs->logprobs.top.n = n * (uint32_t)n_top;
  }
  return 0;
}

/* The token a constrained row drafts: the largest of its draft logits among
 * those its matcher m allows (EOS where the output is complete), which m then
 * follows. -1 when the grammar allows nothing more. */
static int32_t masked_draft(struct wk_role *r, struct gr_matcher *m, const float *logits,
                            uint32_t *bits, int *rc) {
  if ((*rc = wk_grammars_fill(r->gram, m, bits))) return -1;
  wk_grammars_allow_eos(r->gram, m, bits);
  int32_t best = -1;
  for (int32_t w = 0; w < (r->vocab + 31) / 32; w++)
    for (uint32_t b = bits[w]; b; b &= b - 1) {
      int32_t id = w * 32 + __builtin_ctz(b);
      if (id < r->vocab && (best < 0 || logits[id] > logits[best])) best = id;
    }
  if (best >= 0 && wk_grammars_accept(r->gram, m, best)) best = -1;
  return best;
}

/* Runs the assistant for every sequence that asked for drafts: up to the
 * largest num_draft steps at the last accepted position, each sequence
 * keeping its own first num_draft proposals. A structured output's row drafts
 * within its mask, its matcher followed ahead on a copy; it stops early where
 * the grammar allows nothing more. */
static int propose_drafts(struct wk_role *r, const struct pr_step *st, const int *last_row,
                          char *err, size_t errlen) {
  int nd = 0, nc = 0, rc = 0;
  uint32_t kmax = 0;
  size_t H = (size_t)r->hidden, V = (size_t)r->vocab;
  for (uint32_t i = 0; i < st->n_seqs; i++) {
    const struct pr_step_seq *s = &st->seqs[i];
    if ((s->flags & PR_SEQ_SAMPLE) && s->num_draft && r->s->cur[i]->gm) nc++;
  }
  if (nc > r->dlog_rows) {
    float *d = realloc(r->dlog, sizeof(float) * (size_t)nc * V);
    if (!d) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for draft logits");
    r->dlog = d;
    r->dlog_rows = nc;
  }
  nc = 0;
  for (uint32_t i = 0; i < st->n_seqs; i++) {
    const struct pr_step_seq *s = &st->seqs[i];
    if (!(s->flags & PR_SEQ_SAMPLE) || !s->num_draft) continue;
    struct rseq *q = r->s->cur[i];
    struct wk_draft_input *d = &r->din[nd];
    memset(d, 0, sizeof(*d));
    r->dseq[nd] = (int)i;
    r->dgm[nd] = NULL;
    if (q->gm) {
      if (!(r->dgm[nd] = gr_matcher_clone(q->gm))) {
        rc = cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for a draft's matcher");
        break;
      }
      d->logits = r->dlog + (size_t)nc++ * V;
    }
    d->token = (int32_t)r->rtok[(size_t)i * (PR_MAX_DRAFT + 1) + r->rs[i].tokens.n - 1];
    d->pos = (int)(s->start_pos + s->tokens.n + r->rs[i].num_accepted) - 1;
    for (int g = 0; g < r->n_groups; g++) {
      d->block_tables[g] = q->bt[g];
      d->n_blocks[g] = q->n_bt[g];
    }
    memcpy(r->hbuf[0] + (size_t)nd * H, r->hid + (size_t)last_row[i] * H, sizeof(float) * H);
    r->rs[i].drafts.v = r->rdraft + (size_t)i * PR_MAX_DRAFT;
    r->rs[i].drafts.n = s->num_draft;
    kmax = CM_MAX(kmax, s->num_draft);
    nd++;
  }
  /* the masks' scratch: the rows' masks are used, and the draft follows the step */
  uint32_t *bits = r->gbits;
  for (uint32_t k = 0; k < kmax && !rc; k++) {
    float *hin = r->hbuf[k & 1], *hout = r->hbuf[(k + 1) & 1];
    for (int j = 0; j < nd; j++)
      r->din[j].h_in = hin + (size_t)j * H;
    if ((rc = wk_draft_step(r->draft, r->din, nd, r->dtok, hout, NULL, err, errlen))) break;
    for (int j = 0; j < nd && !rc; j++) {
      int i = r->dseq[j];
      if (r->dgm[j] && k < r->rs[i].drafts.n) {
        r->dtok[j] = masked_draft(r, r->dgm[j], r->din[j].logits, bits, &rc);
        if (rc) rc = cm_fail(err, errlen, rc, "token masks: %s", cm_strerror(rc));
        if (r->dtok[j] < 0) { /* nothing more to draft: the drafts so far */
          r->rs[i].drafts.n = k;
          r->dtok[j] = 0;
        }
      }
      if (k < r->rs[i].drafts.n) r->rdraft[(size_t)i * PR_MAX_DRAFT + k] = (uint32_t)r->dtok[j];
      r->din[j].token = r->dtok[j];
    }
  }
  for (int j = 0; j < nd; j++)
    gr_matcher_free(r->dgm[j]);
  return rc;
}

/* n-gram drafts for every sequence that asked for them, from its tokens so far
 * (the sampled ones included): each rank proposes the same. */
static void propose_ngrams(struct wk_role *r, const struct pr_step *st) {
  for (uint32_t i = 0; i < st->n_seqs; i++) {
    const struct pr_step_seq *s = &st->seqs[i];
    if (!(s->flags & PR_SEQ_SAMPLE) || !s->num_draft) continue;
    uint32_t *d = r->rdraft + (size_t)i * PR_MAX_DRAFT;
    int n = wk_ngram_propose(&r->s->cur[i]->ctx, r->ngram_min, r->ngram_max, (int)s->num_draft,
                             (int32_t *)d);
    r->rs[i].drafts = (struct pr_u32s){d, (uint32_t)n};
  }
}

/* The masks of the step's constrained rows, EOS allowed where the output so far
 * is complete. A sequence verifying drafts has one per row: row k's is its
 * matcher's state after drafts [0, k), followed on a copy. Rows past a draft the
 * grammar refuses are never reached (that draft is rejected): they repeat the
 * mask before them. */
struct mask_job {
  struct wk_role *r;
  const struct pr_step *st;
  int rc;
  pthread_t th;
  int running; /* th computes them and is not joined yet */
};

static int seq_masks(struct wk_role *r, const struct pr_step_seq *s, struct gr_matcher *gm,
                     uint32_t *bits) {
  size_t words = wk_grammars_mask_words(r->gram);
  uint32_t D = s->draft_tokens.n, k = 0;
  struct gr_matcher *m = D ? gr_matcher_clone(gm) : gm;
  if (!m) return CM_ERR_NOMEM;
  int rc = 0;
  for (;; k++) {
    uint32_t *b = bits + (size_t)k * words;
    if ((rc = wk_grammars_fill(r->gram, m, b))) break;
    wk_grammars_allow_eos(r->gram, m, b);
    int32_t t = k < D ? (int32_t)s->draft_tokens.v[k] : -1;
    if (k == D || wk_grammars_is_eos(r->gram, t) || wk_grammars_accept(r->gram, m, t)) break;
  }
  for (k++; !rc && k <= D; k++)
    memcpy(bits + (size_t)k * words, bits + (size_t)(k - 1) * words, sizeof(uint32_t) * words);
  if (m != gm) gr_matcher_free(m);
  return rc;
}

static void *fill_masks(void *arg) {
  struct mask_job *j = arg;
  struct wk_role *r = j->r;
  size_t words = wk_grammars_mask_words(r->gram);
  for (uint32_t i = 0; i < j->st->n_seqs && !j->rc; i++)
    if ((j->st->seqs[i].flags & PR_SEQ_SAMPLE) && r->s->cur[i]->gm)
      j->rc =
          seq_masks(r, &j->st->seqs[i], r->s->cur[i]->gm, r->gbits + (size_t)r->s->row0[i] * words);
  return NULL;
}

/* wk_batch.masks_ready: the thread computing the masks is done. */
static int masks_joined(void *arg) {
  struct mask_job *j = arg;
  if (j->running) pthread_join(j->th, NULL);
  j->running = 0;
  return j->rc;
}

/* The forward pass, and the constrained rows' masks, in a thread of their own
 * while a device runs the pass (the mask is needed only when the row samples):
 * where the step samples on a device whose kn_sample takes masks, the pass waits
 * for them before it samples (wk_batch.masks_ready); on other devices the host's
 * sampler applies them after. On the CPU, whose cores the pass already uses, they
 * are computed first when the pass's kn_sample applies them, else after. */
static int forward_and_masks(struct wk_role *r, const struct pr_step *st, struct wk_batch *b,
                             char *err, size_t errlen) {
  int masks = 0;
  for (uint32_t i = 0; i < st->n_seqs; i++)
    masks |= (st->seqs[i].flags & PR_SEQ_SAMPLE) && r->s->cur[i]->gm;
  if (masks && !r->gbits) {
    r->gbits = malloc(sizeof(uint32_t) * (size_t)r->max_rows * wk_grammars_mask_words(r->gram));
    if (!r->gbits) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for token masks");
  }
  struct mask_job job = {.r = r, .st = st};
  struct kn_backend *be = wk_model_backend(r->model);
  int host = kn_backend_has(be, KN_CAP_HOST_MEMORY);
  b->masks_ready = NULL;
  if (masks && r->s->dev_step && kn_sample_takes_masks(be)) { /* for the pass's kn_sample */
    size_t words = wk_grammars_mask_words(r->gram);
    for (uint32_t i = 0; i < st->n_seqs; i++)
      if ((st->seqs[i].flags & PR_SEQ_SAMPLE) && r->s->cur[i]->gm)
        for (int k = r->s->row0[i]; k <= r->s->row0[i] + (int)st->seqs[i].draft_tokens.n; k++)
          r->s->kp[k].allow = r->gbits + (size_t)k * words;
    job.running = !host && pthread_create(&job.th, NULL, fill_masks, &job) == 0;
    if (job.running) {
      b->masks_ready = masks_joined;
      b->masks_arg = &job;
    } else {
      fill_masks(&job);
    }
    masks = 0;
  }
  if (masks && !host) job.running = pthread_create(&job.th, NULL, fill_masks, &job) == 0;
  int failed = !job.running && job.rc; /* (the thread's rc is read once it is joined) */
  int rc = b->n_seqs && !failed ? wk_model_forward(r->model, b, err, errlen) : 0;
  b->masks_ready = NULL;
  if (job.running)
    masks_joined(&job);
  else if (masks && !rc)
    fill_masks(&job);
  if (!rc && job.rc) rc = cm_fail(err, errlen, job.rc, "token masks: %s", cm_strerror(job.rc));
  return rc;
}

/* ---- launch and finish ---------------------------------------------------------- */

static int step_has(const struct pr_step *st, uint64_t id) {
  for (uint32_t j = 0; j < st->n_seqs; j++)
    if (st->seqs[j].seq_id == id) return 1;
  return 0;
}

/* Whether step st asks any sequence for draft proposals. */
static int step_proposes(const struct pr_step *st) {
  for (uint32_t j = 0; j < st->n_seqs; j++)
    if ((st->seqs[j].flags & PR_SEQ_SAMPLE) && st->seqs[j].num_draft) return 1;
  return 0;
}

/* Whether `next` may launch while step o is open (its results not read): only the
 * forward of next may use what o sampled, so nothing of next may depend on host
 * state that o's finish changes. Not behind a step that proposes drafts (the
 * proposals read o's hidden rows, which next's forward would overwrite, and next
 * verifies them), nor with tensor parallelism (the merged ids come through the
 * host), structured outputs or penalties of a sequence o sampled (the matchers and
 * counts move with o's tokens), or a sequence o holds that next frees, starts again
 * or does not run from its token; and only when o's rows are the backend's kept ids.
 * A speculating engine's steps that propose nothing (prefill chunks, and every step
 * while the scheduler has speculation off) follow as plain ones do. */
static int can_follow(struct wk_role *r, const struct rstep *o, const struct pr_step *next) {
  const int32_t *kept;
  struct kn_backend *be = wk_model_backend(r->model);
  if (kn_comm_world(be) > 1) return 0;
  if ((r->draft || r->ngram_max) && step_proposes(&o->view)) return 0;
  if (o->rows && (!o->dev_step || kn_kept_ids(be, &kept) != o->rows || !kept)) return 0;
  for (uint32_t j = 0; j < next->free_ids.n; j++)
    if (step_has(&o->view, next->free_ids.v[j])) return 0;
  for (uint32_t i = 0; i < next->n_seqs; i++) {
    const struct pr_step_seq *s = &next->seqs[i];
    struct rseq *q = seq_find(r, s->seq_id);
    if ((s->flags & PR_SEQ_NEW) ? s->sampling.grammar_kind || step_has(&o->view, s->seq_id)
                                : q && q->gm)
      return 0;
    if (!q || !q->pend || q->pend_no != o->no) continue;
    const struct wk_sampling_params *sp = &q->sp;
    if (!(s->flags & PR_SEQ_PREV_TOKEN) || (s->flags & PR_SEQ_PREV_DRAFTS) ||
        sp->presence_penalty != 0 || sp->frequency_penalty != 0 || sp->repetition_penalty != 1)
      return 0;
  }
  for (uint32_t i = 0; i < o->view.n_seqs; i++) /* o drops these when it finishes */
    if ((o->view.seqs[i].flags & PR_SEQ_FINISHED) && step_has(next, o->view.seqs[i].seq_id))
      return 0;
  return 1;
}

int wk_role_launch(struct wk_role *r, const struct pr_step *sent, char *err, size_t errlen) {
  if (r->n_open == 2) return cm_fail(err, errlen, CM_ERR_STATE, "two steps are open already");
  r->s = &r->st[(r->head + r->n_open) & 1];
  struct pr_step *st = &r->s->view;
  resolve_prev(r, sent, st);
  if (r->n_open && (!can_follow(r, &r->st[r->head], sent) || check_step(r, st, err, errlen))) {
    err[0] = 0;
    return CM_ERR_AGAIN; /* nothing changed: after the open step */
  }
  int rc = check_step(r, st, err, errlen);
  if (rc) {
    drop_freed(r, st); /* the scheduler has let go of them whatever else the step holds */
    return rc;
  }
  struct wk_batch b = {0};
  r->s->no = ++r->launches;
  if ((rc = apply_step(r, st, &b, err, errlen))) return rc;
  if ((rc = forward_and_masks(r, st, &b, err, errlen))) return rc;
  for (uint32_t i = 0; i < st->n_seqs; i++) { /* a step that fails leaves no stale token */
    struct rseq *q = r->s->cur[i];
    if (!(st->seqs[i].flags & PR_SEQ_SAMPLE)) continue;
    q->has_last = 0;
    q->pend = r->s->dev_step;
    q->pend_row = r->s->row0[i];
    q->pend_no = r->s->no;
  }
  r->pipelined += r->n_open;
  r->n_open++;
  return 0;
}

int wk_role_finish(struct wk_role *r, struct pr_msg *res, char *err, size_t errlen) {
  if (!r->n_open) return cm_fail(err, errlen, CM_ERR_STATE, "no step is open");
  r->s = &r->st[r->head];
  r->head ^= 1;
  r->n_open--;
  const struct pr_step *st = &r->s->view;
  int rc;
  pr_msg_init(res, PR_RESULT);
  res->u.result.rank = r->rank;
  res->u.result.step_id = st->step_id;
  res->u.result.seqs = r->rs;
  int n_res = 0;
  int *last_row = r->s->row0; /* reused: row0 is read before last_row is written for each i */
  for (uint32_t i = 0; i < st->n_seqs; i++) /* a later step's launch may own pend now */
    if ((st->seqs[i].flags & PR_SEQ_SAMPLE) && r->s->cur[i]->pend_no == r->s->no)
      r->s->cur[i]->pend = 0;
  for (uint32_t i = 0; i < st->n_seqs; i++) {
    const struct pr_step_seq *s = &st->seqs[i];
    if (!(s->flags & PR_SEQ_SAMPLE)) continue;
    int lr = 0;
    if ((rc = sample_seq(r, s, (int)i, &r->rs[i], &lr)))
      return cm_fail(err, errlen, rc, "sequence %llu: sampling failed: %s",
                     (unsigned long long)s->seq_id, cm_strerror(rc));
    last_row[i] = lr;
    /* every rank samples alike (the seed and the logits agree), so each keeps it */
    r->s->cur[i]->last = (int32_t)r->rs[i].tokens.v[r->rs[i].tokens.n - 1];
    r->s->cur[i]->has_last = 1;
  }
  if (r->draft && (rc = propose_drafts(r, st, last_row, err, errlen))) return rc;
  if (r->ngram_max) propose_ngrams(r, st);
  /* what a later PREV_TOKEN / PREV_DRAFTS step takes from this one (the drafts it
   * verified are used by now) */
  for (uint32_t i = 0; i < st->n_seqs; i++) {
    if (!(st->seqs[i].flags & PR_SEQ_SAMPLE)) continue;
    struct rseq *q = r->s->cur[i];
    q->accepted = r->rs[i].num_accepted;
    q->n_prop = r->rs[i].drafts.n;
    if (q->n_prop) memcpy(q->prop, r->rs[i].drafts.v, sizeof(uint32_t) * q->n_prop);
  }
  /* the scored prompt rows: a sampled sequence's with its tokens, another's alone */
  for (uint32_t i = 0; i < st->n_seqs; i++) {
    const struct pr_step_seq *s = &st->seqs[i];
    if (r->s->srow0[i] < 0) continue;
    if (!(s->flags & PR_SEQ_SAMPLE)) {
      memset(&r->rs[i], 0, sizeof(r->rs[i]));
      r->rs[i].seq_id = s->seq_id;
    }
    score_result(r, s, (int)i, &r->rs[i]);
  }
  /* compact the sampled and scored sequences' results in step order */
  for (uint32_t i = 0; i < st->n_seqs; i++)
    if ((st->seqs[i].flags & PR_SEQ_SAMPLE) || r->s->srow0[i] >= 0) {
      if ((int)i != n_res) r->rs[n_res] = r->rs[i];
      n_res++;
    }
  res->u.result.n_seqs = (uint32_t)n_res;
  for (uint32_t i = 0; i < st->n_seqs; i++)
    if (st->seqs[i].flags & PR_SEQ_FINISHED) seq_drop(r, r->s->cur[i]);
  return 0;
}

int wk_role_step(struct wk_role *r, const struct pr_step *sent, struct pr_msg *res, char *err,
                 size_t errlen) {
  if (r->n_open) return cm_fail(err, errlen, CM_ERR_STATE, "a step is open");
  int rc = wk_role_launch(r, sent, err, errlen);
  return rc ? rc : wk_role_finish(r, res, err, errlen);
}

int wk_role_open(const struct wk_role *r) {
  return r->n_open;
}

uint64_t wk_role_pipelined(const struct wk_role *r) {
  return r->pipelined;
}
