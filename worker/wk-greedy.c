/* wk-greedy.c — chunked prefill + greedy decode of one sequence through the
 * paged KV pool (see wk-greedy.h). */
#include "worker/wk-greedy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"

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

static int is_eos(const struct wk_config *c, int32_t id) {
  for (int i = 0; i < c->n_eos; i++)
    if (c->eos_ids[i] == id) return 1;
  return 0;
}

/* Runs tokens[0..n) at position pos0 and, when logits is not NULL, returns
 * the last token's logits. */
static int step(struct wk_model *m, struct wk_page_alloc *pa, struct wk_seq_blocks *blk,
                const int32_t *tokens, int n, int pos0, float *logits, char *err, size_t errlen) {
  const struct wk_kv_spec *kv = wk_model_kv_spec(m);
  int rc = wk_seq_blocks_reserve(blk, kv, pa, pos0 + n);
  if (rc) {
    snprintf(err, errlen, "KV pool exhausted at position %d (%d pages)", pos0 + n, pa->n_pages);
    return rc;
  }
  struct wk_seq_input s = {.tokens = tokens, .n_tokens = n, .pos0 = pos0, .n_out = logits ? 1 : 0};
  for (int g = 0; g < kv->n_groups; g++) {
    s.block_tables[g] = blk->table[g];
    s.n_blocks[g] = blk->n[g];
  }
  struct wk_batch b = {.seqs = &s, .n_seqs = 1, .logits = logits};
  return wk_model_forward(m, &b, err, errlen);
}

int wk_greedy_generate(struct wk_model *m, struct wk_page_alloc *pa, const int32_t *prompt,
                       int n_prompt, const struct wk_greedy_opts *o, int32_t *out, int *n_gen,
                       char *err, size_t errlen) {
  const struct wk_config *c = wk_model_config(m);
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
