/* fe-engine-beam.c — beam search (vLLM's use_beam_search) as the frontend runs it,
 * as vLLM's serving layer does: a step asks each live beam's next token of the
 * engine as a one-token request (the prompt plus the beam's tokens, whose blocks
 * the prefix cache holds from the step before) with its 2 w best raw logprobs,
 * w = n the beams. Each candidate extends its beam by one token with its
 * logprob; one that is an EOS id (unless ignore_eos) or one of the request's
 * stop_token_ids completes its beam, and the w best of the others live on. After max_tokens steps
 * the live beams complete too, and the w best completed ones, by cumulative logprob over their
 * length (prompt included, a final EOS not) to the power length_penalty, are the answer's choices,
 * best first: each goes through the choice's ordinary output path (detokenizer, stop strings,
 * logprobs) as one OUT would.
 *
 * While searching, choice pi * w + j runs prompt pi's beam j under a request id
 * of its own for each step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-time.h"
#include "frontend/fe-engine-impl.h"

struct beam {
  int32_t *toks;    /* [n] generated tokens */
  float *lps;       /* [n] their logprobs */
  int32_t *top_ids; /* [n, k] the best at each step (k: the request's logprobs) */
  float *top;
  size_t n;
  double cum; /* the sum of lps */
  int stop;   /* ended with an EOS */
};

struct beam_set {  /* one prompt's */
  int32_t *prompt; /* [n_prompt + max_tokens]: the prompt, then a step's beam */
  size_t n_prompt;
  int64_t max_tokens;
  struct beam *live; /* [w] */
  int n_live;
  struct beam *fin; /* [cap_fin] completed */
  int n_fin, cap_fin;
  int pending;  /* live beams whose step has not come back */
  int32_t *cid; /* [w, C] each live beam's candidates */
  float *clp;   /* [w, C] */
  int *cn;      /* [w] */
};

struct fe_eng_beams {
  int w, C, k; /* beams, candidates per beam, top entries kept per token */
  struct beam_set *set;
  size_t n_set;
};

static void beam_free(struct beam *b) {
  free(b->toks);
  free(b->lps);
  free(b->top_ids);
  free(b->top);
  memset(b, 0, sizeof(*b));
}

/* *to = from extended by token id (logprob lp, the step's best top[0 .. k)). */
static int beam_extend(struct beam *to, const struct beam *from, int k, int32_t id, float lp,
                       const int32_t *top_ids, const float *top) {
  size_t n = from->n + 1;
  memset(to, 0, sizeof(*to));
  to->toks = malloc(n * sizeof(*to->toks));
  to->lps = malloc(n * sizeof(*to->lps));
  to->top_ids = malloc((k ? n * (size_t)k : 1) * sizeof(*to->top_ids));
  to->top = malloc((k ? n * (size_t)k : 1) * sizeof(*to->top));
  if (!to->toks || !to->lps || !to->top_ids || !to->top) {
    beam_free(to);
    return CM_ERR_NOMEM;
  }
  if (from->n) {
    memcpy(to->toks, from->toks, from->n * sizeof(*to->toks));
    memcpy(to->lps, from->lps, from->n * sizeof(*to->lps));
    if (k) {
      memcpy(to->top_ids, from->top_ids, from->n * (size_t)k * sizeof(*to->top_ids));
      memcpy(to->top, from->top, from->n * (size_t)k * sizeof(*to->top));
    }
  }
  to->toks[from->n] = id;
  to->lps[from->n] = lp;
  for (int c = 0; c < k; c++) {
    to->top_ids[from->n * (size_t)k + (size_t)c] = top_ids[c];
    to->top[from->n * (size_t)k + (size_t)c] = top[c];
  }
  to->n = n;
  to->cum = from->cum + lp;
  return 0;
}

/* vLLM's beam score: the cumulative logprob over the length (prompt included, a final
 * EOS or stop id not) to the power length_penalty. */
static double score(const struct fe_eng_req *r, const struct beam_set *bs, const struct beam *b) {
  double len = (double)(bs->n_prompt + b->n - (b->stop ? 1 : 0));
  return b->cum / pow(len > 0 ? len : 1, r->api->length_penalty);
}

/* Whether token id completes a beam: an EOS id (unless ignore_eos), a stop id. */
static int is_stop(const struct fe_eng_req *r, int32_t id) {
  const struct fe_api_request *q = r->api;
  for (int i = 0; i < r->e->n_eos && !q->ignore_eos; i++)
    if (r->e->eos[i] == id) return 1;
  for (size_t i = 0; i < q->n_stop_token_ids; i++)
    if (q->stop_token_ids[i] == id) return 1;
  return 0;
}

/* Sends beam j of prompt pi's next step under a new request id. */
static int send_step(struct fe_eng_req *r, size_t pi, int j) {
  struct fe_engine *e = r->e;
  struct fe_eng_beams *bm = r->beams;
  struct beam_set *bs = &bm->set[pi];
  struct fe_eng_choice *ch = &r->ch[pi * (size_t)bm->w + (size_t)j];
  const struct beam *b = &bs->live[j];
  fe_eng_map_del(e, ch->id); /* the map finds a choice by its id: out first */
  ch->id = e->next_id++;
  int rc = fe_eng_map_put(e, ch);
  if (rc) return rc;
  if (b->n) memcpy(bs->prompt + bs->n_prompt, b->toks, b->n * sizeof(*b->toks));
  struct pr_msg m;
  pr_msg_init(&m, PR_ADD);
  struct pr_add *a = &m.u.add;
  a->request_id = ch->id;
  a->prompt = (struct pr_u32s){(const uint32_t *)bs->prompt, (uint32_t)(bs->n_prompt + b->n)};
  a->sampling.temperature = 0; /* the token drawn is not read: its logprobs are */
  a->sampling.logprobs = bm->C;
  a->sampling.ignore_eos = true; /* an EOS or stop candidate completes its beam here */
  a->max_tokens = 1;
  a->priority = r->api->priority;
  a->arrival_ns = cm_time_wall_ns();
  a->cache_salt = r->api->cache_salt;
  a->sampling.lora = (uint32_t)r->api->lora;
  a->lora_sum = r->api->lora_sum;
  a->lora_uid = r->api->lora_uid;
  a->lora_path = r->api->lora_path;
  a->images = r->images;
  a->n_images = (uint32_t)r->n_images;
  if ((rc = fe_eng_send_add(r, ch, &m))) return rc;
  bs->cn[j] = 0; /* its candidates: those this step's answer gives */
  ch->live = 1;
  bs->pending++;
  return 0;
}

struct cand {
  double cum;
  int j, c; /* its beam, its place among the beam's candidates */
};

static int cand_cmp(const void *a, const void *b) {
  const struct cand *x = a, *y = b;
  if (x->cum != y->cum) return x->cum > y->cum ? -1 : 1;
  return x->j != y->j ? x->j - y->j : x->c - y->c;
}

static int fin_push(struct beam_set *bs, struct beam *b) {
  if (bs->n_fin == bs->cap_fin) {
    int cap = bs->cap_fin ? 2 * bs->cap_fin : 16;
    struct beam *f = realloc(bs->fin, (size_t)cap * sizeof(*f));
    if (!f) return CM_ERR_NOMEM;
    bs->fin = f;
    bs->cap_fin = cap;
  }
  bs->fin[bs->n_fin++] = *b;
  memset(b, 0, sizeof(*b));
  return 0;
}

struct fin_ctx {
  const struct fe_eng_req *r;
  const struct beam_set *bs;
};

/* best score first */
static int fin_cmp(const void *a, const void *b, void *arg) {
  const struct fin_ctx *x = arg;
  double sa = score(x->r, x->bs, a), sb = score(x->r, x->bs, b);
  return sa > sb ? -1 : sa < sb ? 1 : 0;
}

/* Prompt pi's search is over: its best w completed beams through their choices'
 * output path, best first (a prompt with fewer leaves the rest empty). */
static void finish(struct fe_eng_req *r, size_t pi) {
  struct fe_eng_beams *bm = r->beams;
  struct beam_set *bs = &bm->set[pi];
  struct fin_ctx x = {r, bs};
  qsort_r(bs->fin, (size_t)bs->n_fin, sizeof(*bs->fin), fin_cmp, &x);
  for (int j = 0; j < bm->w; j++) {
    struct fe_eng_choice *ch = &r->ch[pi * (size_t)bm->w + (size_t)j];
    if (j >= bs->n_fin) {
      ch->done = 1;
      ch->finish_reason = "length";
      r->n_done++;
      fe_eng_log_finished(ch);
      continue;
    }
    const struct beam *b = &bs->fin[j];
    struct pr_out_seq s;
    memset(&s, 0, sizeof(s));
    s.request_id = ch->id;
    s.tokens = (struct pr_u32s){(const uint32_t *)b->toks, (uint32_t)b->n};
    if (r->api->logprobs >= 0)
      s.logprobs = (struct pr_logprobs){(uint32_t)bm->k,
                                        {b->lps, (uint32_t)b->n},
                                        {(const uint32_t *)b->top_ids, (uint32_t)(b->n * bm->k)},
                                        {b->top, (uint32_t)(b->n * bm->k)},
                                        {NULL, 0}};
    s.finish = b->stop ? PR_FINISH_STOP : PR_FINISH_LENGTH;
    s.stop_token = b->stop ? b->toks[b->n - 1] : -1;
    /* n_prompt_tokens 0: the steps counted their prefix-cache lookups */
    fe_eng_on_seq(r->e, ch, &s);
  }
}

/* Every live beam of prompt pi came back: the candidates extend them; EOS ones
 * complete, the w best others live on, or complete too after max_tokens. */
static int step_done(struct fe_eng_req *r, size_t pi) {
  struct fe_eng_beams *bm = r->beams;
  struct beam_set *bs = &bm->set[pi];
  int w = bm->w, C = bm->C, rc = 0, n_c = 0;
  struct cand *cs = malloc((size_t)(w * C) * sizeof(*cs));
  struct beam *next = calloc((size_t)w, sizeof(*next));
  if (!cs || !next) rc = CM_ERR_NOMEM;
  for (int j = 0; j < bs->n_live && !rc; j++)
    for (int c = 0; c < bs->cn[j] && !rc; c++) {
      int32_t id = bs->cid[j * C + c];
      float lp = bs->clp[j * C + c];
      if (is_stop(r, id)) {
        struct beam done;
        rc = beam_extend(&done, &bs->live[j], bm->k, id, lp, &bs->cid[j * C], &bs->clp[j * C]);
        done.stop = 1;
        if (!rc && (rc = fin_push(bs, &done))) beam_free(&done);
      } else {
        cs[n_c++] = (struct cand){bs->live[j].cum + lp, j, c};
      }
    }
  if (!rc) qsort(cs, (size_t)n_c, sizeof(*cs), cand_cmp);
  int n_next = n_c < w ? n_c : w;
  for (int i = 0; i < n_next && !rc; i++) {
    int j = cs[i].j, c = cs[i].c;
    rc = beam_extend(&next[i], &bs->live[j], bm->k, bs->cid[j * C + c], bs->clp[j * C + c],
                     &bs->cid[j * C], &bs->clp[j * C]);
  }
  for (int j = 0; j < bs->n_live; j++)
    beam_free(&bs->live[j]);
  free(cs);
  if (rc) {
    for (int i = 0; i < n_next; i++)
      beam_free(&next[i]);
    free(next);
    return rc;
  }
  free(bs->live);
  bs->live = next;
  bs->n_live = n_next;
  int last = !n_next || (int64_t)next[0].n >= bs->max_tokens;
  for (int i = 0; i < n_next && last && !rc; i++) /* out of steps: they complete as they are */
    rc = fin_push(bs, &next[i]);
  if (last) {
    bs->n_live = 0;
    if (!rc) finish(r, pi);
    return rc;
  }
  for (int j = 0; j < n_next && !rc; j++)
    rc = send_step(r, pi, j);
  return rc;
}

int fe_eng_beam_start(struct fe_eng_req *r, size_t pi, const int32_t *ids, size_t n,
                      int64_t max_tokens) {
  const struct fe_api_request *q = r->api;
  if (!r->beams) {
    struct fe_eng_beams *bm = calloc(1, sizeof(*bm));
    size_t n_set = (size_t)r->n_ch / (size_t)q->n; /* the prompts (a chat's one) */
    if (!bm || !(bm->set = calloc(n_set, sizeof(*bm->set)))) {
      free(bm);
      return CM_ERR_NOMEM;
    }
    bm->n_set = n_set;
    bm->w = q->n;
    bm->k = q->logprobs > 0 ? q->logprobs : 0;
    /* 2 w candidates, and the request's top logprobs among them */
    bm->C = 2 * bm->w > bm->k ? 2 * bm->w : bm->k;
    r->beams = bm;
  }
  struct fe_eng_beams *bm = r->beams;
  struct beam_set *bs = &bm->set[pi];
  int w = bm->w, C = bm->C;
  bs->prompt = malloc((n + (size_t)max_tokens) * sizeof(*bs->prompt));
  bs->live = calloc((size_t)w, sizeof(*bs->live));
  bs->cid = malloc((size_t)(w * C) * sizeof(*bs->cid));
  bs->clp = malloc((size_t)(w * C) * sizeof(*bs->clp));
  bs->cn = calloc((size_t)w, sizeof(*bs->cn));
  if (!bs->prompt || !bs->live || !bs->cid || !bs->clp || !bs->cn) return CM_ERR_NOMEM;
  memcpy(bs->prompt, ids, n * sizeof(*ids));
  bs->n_prompt = n;
  bs->max_tokens = max_tokens;
  bs->n_live = 1; /* the prompt alone */
  return send_step(r, pi, 0);
}

void fe_eng_beam_on_seq(struct fe_engine *e, struct fe_eng_choice *ch, const struct pr_out_seq *s) {
  struct fe_eng_req *r = ch->req;
  struct fe_eng_beams *bm = r->beams;
  size_t pi = (size_t)ch->index / (size_t)bm->w;
  int j = ch->index % bm->w, C = bm->C;
  struct beam_set *bs = &bm->set[pi];
  (void)e;
  if (!ch->live || j >= bs->n_live) return;
  if (s->tokens.n) fe_eng_count_lookup(r, s); /* each step is a request of the engine's */
  if (s->tokens.n && s->logprobs.sampled.n == s->tokens.n && s->logprobs.n_top) {
    int n = 0; /* its best entries with a logprob (a small vocabulary pads with -inf) */
    for (uint32_t c = 0; c < s->logprobs.n_top && n < C; c++)
      if (s->logprobs.top.v[c] > -INFINITY) {
        bs->cid[j * C + n] = (int32_t)s->logprobs.top_ids.v[c];
        bs->clp[j * C + n++] = s->logprobs.top.v[c];
      }
    bs->cn[j] = n;
    for (int c = n; c < C; c++) { /* the top entries a token reports: none past these */
      bs->cid[j * C + c] = 0;
      bs->clp[j * C + c] = -INFINITY;
    }
  }
  if (s->finish == PR_FINISH_NONE) return;
  ch->live = 0;
  fe_eng_choice_forget_add(ch);
  if (s->finish == PR_FINISH_ERROR || s->finish == PR_FINISH_ABORT) {
    fe_eng_req_fail(r, 500,
                    s->finish == PR_FINISH_ERROR ? "generation failed in the engine"
                                                 : "the engine aborted a beam's step",
                    NULL);
    return;
  }
  if (--bs->pending) return;
  int rc = step_done(r, pi);
  if (rc)
    fe_eng_req_fail(r, rc == CM_ERR_NOMEM ? 500 : 503,
                    rc == CM_ERR_NOMEM ? "out of memory" : "cannot queue a beam's next step", NULL);
}

void fe_eng_beam_free(struct fe_eng_req *r) {
  struct fe_eng_beams *bm = r->beams;
  if (!bm) return;
  for (size_t i = 0; i < bm->n_set; i++) {
    struct beam_set *bs = &bm->set[i];
    for (int j = 0; bs->live && j < bm->w; j++)
      beam_free(&bs->live[j]);
    for (int j = 0; j < bs->n_fin; j++)
      beam_free(&bs->fin[j]);
    free(bs->live);
    free(bs->fin);
    free(bs->prompt);
    free(bs->cid);
    free(bs->clp);
    free(bs->cn);
  }
  free(bm->set);
  free(bm);
  r->beams = NULL;
}
