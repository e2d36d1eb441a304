/* wk-greedy.c — chunked prefill + greedy decode of one sequence through the
 * paged KV pool (see wk-greedy.h). */
#include "worker/wk-greedy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "worker/wk-ngram.h"

int32_t wk_argmax(const float *v, int n) {
  int32_t best = 0;
  float bv = 0;
  int have = 0;
  for (int i = 0; i < n; i++) {
    if (v[i] != v[i]) continue; /* NaN */
    if (!have || v[i] > bv) {
      bv = v[i];
      best = i;
      have = 1;
    }
  }
  return best;
}

static int is_eos(const struct md_config *c, int32_t id) {
  for (int i = 0; i < c->n_eos; i++)
    if (c->eos_ids[i] == id) return 1;
  return 0;
}

/* Runs tokens[0..n) at position pos0 and returns the logits (and, when
 * hidden is not NULL, the final-normed states) of its last n_out tokens. */
static int step_out(struct wk_model *m, struct wk_page_alloc *pa, struct wk_seq_blocks *blk,
                    const int32_t *tokens, int n, int pos0, int n_out, float *logits, float *hidden,
                    char *err, size_t errlen) {
  const struct wk_kv_spec *kv = wk_model_kv_spec(m);
  int rc = wk_seq_blocks_reserve(blk, kv, pa, pos0 + n);
  if (rc) {
    snprintf(err, errlen, "KV pool exhausted at position %d (%d pages)", pos0 + n, pa->n_pages);
    return rc;
  }
  struct wk_seq_input s = {.tokens = tokens, .n_tokens = n, .pos0 = pos0, .n_out = n_out};
  for (int g = 0; g < kv->n_groups; g++) {
    s.block_tables[g] = blk->table[g];
    s.n_blocks[g] = blk->n[g];
  }
  struct wk_batch b = {.seqs = &s, .n_seqs = 1, .logits = logits, .hidden = hidden};
  return wk_model_forward(m, &b, err, errlen);
}

static int step(struct wk_model *m, struct wk_page_alloc *pa, struct wk_seq_blocks *blk,
                const int32_t *tokens, int n, int pos0, float *logits, char *err, size_t errlen) {
  return step_out(m, pa, blk, tokens, n, pos0, logits ? 1 : 0, logits, NULL, err, errlen);
}

int wk_greedy_generate(struct wk_model *m, struct wk_page_alloc *pa, const int32_t *prompt,
                       int n_prompt, const struct wk_greedy_opts *o, int32_t *out, int *n_gen,
                       char *err, size_t errlen) {
  const struct md_config *c = wk_model_config(m);
  int V = c->vocab, rc = 0;
  *n_gen = 0;
  if (n_prompt < 1) {
    snprintf(err, errlen, "empty prompt");
    return CM_ERR_INVAL;
  }
  int chunk = o->chunk > 0 ? o->chunk : n_prompt;
  chunk = CM_MIN(chunk, wk_model_max_batch_tokens(m));
  float *logits = malloc(sizeof(float) * (size_t)V);
  if (!logits) return CM_ERR_NOMEM;
  struct wk_seq_blocks blk = {0};
  for (int p = 0; p < n_prompt && !rc; p += chunk) {
    int n = CM_MIN(chunk, n_prompt - p);
    rc = step(m, pa, &blk, prompt + p, n, p, p + n == n_prompt ? logits : NULL, err, errlen);
  }
  int pos = n_prompt;
  for (int i = 0; i < o->max_new && !rc; i++) {
    if (o->logits) memcpy(o->logits + (size_t)i * V, logits, sizeof(float) * (size_t)V);
    int32_t tok = wk_argmax(logits, V);
    out[(*n_gen)++] = tok;
    if ((o->stop_at_eos && is_eos(c, tok)) || i + 1 == o->max_new) break;
    rc = step(m, pa, &blk, &tok, 1, pos++, logits, err, errlen);
  }
  wk_seq_blocks_release(&blk, wk_model_kv_spec(m), pa);
  free(logits);
  return rc;
}

int wk_greedy_generate_spec_fn(struct wk_model *m, struct wk_page_alloc *pa, const int32_t *prompt,
                               int n_prompt, const struct wk_greedy_opts *o, int k,
                               wk_propose_fn propose, void *ctx, int32_t *out, int *n_gen,
                               int *drafted, int *accepted, char *err, size_t errlen) {
  const struct md_config *c = wk_model_config(m);
  int V = c->vocab, H = c->hidden, rc = 0;
  *n_gen = *drafted = *accepted = 0;
  if (n_prompt < 1 || k < 1 || k + 1 > wk_model_max_batch_tokens(m)) {
    snprintf(err, errlen, "speculative decoding needs a prompt and 1 <= k < max batch tokens");
    return CM_ERR_INVAL;
  }
  int chunk = o->chunk > 0 ? o->chunk : n_prompt;
  chunk = CM_MIN(chunk, wk_model_max_batch_tokens(m));
  float *logits = malloc(sizeof(float) * (size_t)V * (size_t)(k + 1));
  float *hidden = malloc(sizeof(float) * (size_t)H * (size_t)(k + 1));
  float *hacc = malloc(sizeof(float) * (size_t)H);
  int32_t *toks = malloc(sizeof(int32_t) * (size_t)(k + 1));
  struct wk_seq_blocks blk = {0};
  if (!logits || !hidden || !hacc || !toks) {
    rc = CM_ERR_NOMEM;
    goto done;
  }
  for (int p = 0; p < n_prompt && !rc; p += chunk) {
    int n = CM_MIN(chunk, n_prompt - p), last = p + n == n_prompt;
    rc = step_out(m, pa, &blk, prompt + p, n, p, last, last ? logits : NULL, last ? hidden : NULL,
                  err, errlen);
  }
  int p = n_prompt - 1; /* last accepted position: its K/V are in the pages */
  memcpy(hacc, hidden, sizeof(float) * (size_t)H);
  const float *cur = logits; /* the row `next` was chosen from */
  int32_t next = wk_argmax(cur, V);
  while (!rc) {
    if (o->logits) memcpy(o->logits + (size_t)*n_gen * V, cur, sizeof(float) * (size_t)V);
    out[(*n_gen)++] = next;
    if ((o->stop_at_eos && is_eos(c, next)) || *n_gen == o->max_new) break;
    int kk = CM_MIN(k, o->max_new - *n_gen);
    toks[0] = next;
    int nd = kk;
    rc = propose(ctx, &blk, next, p, hacc, kk, toks + 1, &nd, err, errlen);
    if (rc) break;
    if (nd < 0 || nd > kk) {
      snprintf(err, errlen, "the proposer made %d drafts of %d", nd, kk);
      rc = CM_ERR_STATE;
      break;
    }
    kk = nd;
    *drafted += kk;
    rc = step_out(m, pa, &blk, toks, kk + 1, p + 1, kk + 1, logits, hidden, err, errlen);
    if (rc) break;
    int j = 0, stop = 0;
    while (j < kk && toks[j + 1] == wk_argmax(logits + (size_t)j * V, V)) {
      if (o->logits)
        memcpy(o->logits + (size_t)*n_gen * V, logits + (size_t)j * V, sizeof(float) * (size_t)V);
      out[(*n_gen)++] = toks[j + 1];
      (*accepted)++;
      j++;
      if ((o->stop_at_eos && is_eos(c, toks[j])) || *n_gen == o->max_new) {
        stop = 1;
        break;
      }
    }
    if (stop) break;
    cur = logits + (size_t)j * V;
    next = wk_argmax(cur, V);
    p += 1 + j;
    memcpy(hacc, hidden + (size_t)j * H, sizeof(float) * (size_t)H);
  }
done:
  wk_seq_blocks_release(&blk, wk_model_kv_spec(m), pa);
  free(logits);
  free(hidden);
  free(hacc);
  free(toks);
  return rc;
}

/* The draft model as a proposer: k steps at the last accepted position. */
struct draft_ctx {
  struct wk_model *draft;
  const struct wk_kv_spec *kv;
  float *h; /* host [backbone hidden] */
};

static int draft_propose(void *vctx, const struct wk_seq_blocks *blk, int32_t token, int p,
                         const float *h, int kk, int32_t *drafts, int *n, char *err,
                         size_t errlen) {
  struct draft_ctx *d = vctx;
  memcpy(d->h, h, sizeof(float) * (size_t)wk_model_config(d->draft)->backbone_hidden);
  int32_t prev = token;
  for (int i = 0; i < kk; i++) {
    struct wk_draft_input di = {.token = prev, .pos = p, .h_in = d->h};
    for (int g = 0; g < d->kv->n_groups; g++) {
      di.block_tables[g] = blk->table[g];
      di.n_blocks[g] = blk->n[g];
    }
    int rc = wk_draft_step(d->draft, &di, 1, &drafts[i], d->h, NULL, err, errlen);
    if (rc) return rc;
    prev = drafts[i];
  }
  *n = kk;
  return 0;
}

int wk_greedy_generate_spec(struct wk_model *m, struct wk_model *draft, struct wk_page_alloc *pa,
                            const int32_t *prompt, int n_prompt, const struct wk_greedy_opts *o,
                            int k, int32_t *out, int *n_gen, int *drafted, int *accepted, char *err,
                            size_t errlen) {
  struct draft_ctx d = {draft, wk_model_kv_spec(m),
                        malloc(sizeof(float) * (size_t)wk_model_config(m)->hidden)};
  if (!d.h) return CM_ERR_NOMEM;
  int rc = wk_greedy_generate_spec_fn(m, pa, prompt, n_prompt, o, k, draft_propose, &d, out, n_gen,
                                      drafted, accepted, err, errlen);
  free(d.h);
  return rc;
}

/* n-gram drafts as a proposer: the prompt, then the tokens emitted so far (out[], which
 * the loop fills before it asks), looked up at each round. */
struct ngram_ctx {
  struct wk_ngram_hist h;
  const int32_t *prompt, *out;
  int n_prompt, min_n, max_n;
};

static int ngram_propose(void *vctx, const struct wk_seq_blocks *blk, int32_t token, int p,
                         const float *h, int kk, int32_t *drafts, int *n, char *err,
                         size_t errlen) {
  struct ngram_ctx *c = vctx;
  /* positions 0 .. p + 1: `token`, at p + 1, is out[]'s last */
  for (int q = c->h.n; q <= p + 1; q++) {
    int32_t t = q < c->n_prompt ? c->prompt[q] : c->out[q - c->n_prompt];
    if (wk_ngram_put(&c->h, (uint32_t)q, &t, 1))
      return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for the n-gram history");
  }
  *n = wk_ngram_propose(&c->h, c->min_n, c->max_n, kk, drafts);
  return 0;
}

int wk_greedy_generate_ngram(struct wk_model *m, struct wk_page_alloc *pa, const int32_t *prompt,
                             int n_prompt, const struct wk_greedy_opts *o, int k, int min_n,
                             int max_n, int32_t *out, int *n_gen, int *drafted, int *accepted,
                             char *err, size_t errlen) {
  struct ngram_ctx c = {
      .prompt = prompt, .out = out, .n_prompt = n_prompt, .min_n = min_n, .max_n = max_n};
  int rc = wk_greedy_generate_spec_fn(m, pa, prompt, n_prompt, o, k, ngram_propose, &c, out, n_gen,
                                      drafted, accepted, err, errlen);
  wk_ngram_free(&c.h);
  return rc;
}
