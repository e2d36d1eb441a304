/* wk-lora.c — LoRA adapters on the model's projections.
 *
 * An adapter (model/md-lora.h) is loaded into backend memory as f32: for each
 * adapted projection A [r, in] and B [out, r] times the adapter's scale, cut as
 * the projection's weight is (wk-shard.h): a weight split by output rows (Q, K,
 * V, gate, up) keeps A whole and its rows of B; one split by input columns (O,
 * down) keeps its columns of A and B whole, so that its partial sum joins the
 * weight's in the all-reduce that follows (the sum of B (A_r x_r) over the ranks
 * is B (A x)). KV-shared layers compute no K or V, so an adapter's K and V there
 * are not loaded: they change nothing, as in transformers.
 *
 * The adapters of --lora-modules take slots 1 .. n_lora, in order, for the process's
 * life; those loaded at run time (wk_model_set_lora, the scheduler's CTRL LORA_LOAD)
 * take the slots after them, up to WK_MAX_LORAS, each in memory of its own that
 * wk_model_drop_lora frees.
 *
 * A batch's sequences name their adapter (wk_seq_input.lora); the rows of
 * neighbouring sequences with the same adapter form a run, and each run adds
 * (x A^T) B^T to a projection's output with two kn_matmul calls, the second
 * accumulating. A row's result depends only on the row (kn_matmul's rows are
 * independent), so batching keeps its bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "proto/pr-msg.h"
#include "worker/wk-model-impl.h"
#include "worker/wk-model.h"

#define WK_MAX_LORAS PR_MAX_LORAS

static const struct wk_w *base_w(const struct wk_layer_w *w, enum md_lora_mod mod) {
  switch (mod) {
  case MD_LORA_Q: return &w->wq;
  case MD_LORA_K: return &w->wk;
  case MD_LORA_V: return &w->wv;
  case MD_LORA_O: return &w->wo;
  case MD_LORA_GATE: return &w->w_gate;
  case MD_LORA_UP: return &w->w_up;
  case MD_LORA_DOWN: return &w->w_down;
  default: return NULL;
  }
}

/* rows x cols floats of t from (r0, c0), times mul, into new backend memory *out of
 * the adapter o's. */
static int upload(struct wk_model *m, struct wk_lora *o, const struct md_tensor *t, int r0,
                  int rows, int c0, int cols, float mul, float **out) {
  size_t n = (size_t)rows * (size_t)cols;
  float *host = malloc(sizeof(float) * n);
  if (!host) return CM_ERR_NOMEM;
  int rc = md_lora_read_f32(t, r0, rows, c0, cols, mul, host);
  float *dev = rc ? NULL : wk_owned_alloc(&o->owned, m->be, sizeof(float) * n);
  if (!rc && !dev) rc = CM_ERR_NOMEM;
  if (!rc) rc = kn_upload(m->be, dev, host, sizeof(float) * n);
  free(host);
  *out = dev;
  return rc;
}

static int load_mods(struct wk_model *m, const struct md_lora *l, struct wk_lora *o, char *err,
                     size_t errlen) {
  for (int layer = 0; layer < m->cfg.n_layers; layer++) {
    for (int mod = 0; mod < MD_LORA_N_MODS; mod++) {
      const struct md_lora_mod_w *mw = &l->mods[layer][mod];
      const struct wk_w *w = base_w(&m->layers[layer], (enum md_lora_mod)mod);
      if (!mw->a || !w->p) continue; /* not adapted, or a KV-shared layer's K / V */
      int in, out;
      if (md_lora_dims(&m->full, layer, (enum md_lora_mod)mod, &in, &out))
        return cm_fail(err, errlen, CM_ERR_INVAL, "layer %d has no %s", layer,
                       md_lora_mod_name((enum md_lora_mod)mod));
      /* where this rank's slice lies: the weight's rows (ROWS) or columns (COLS) */
      int r0 = w->shard == WK_SHARD_ROWS ? w->off : 0;
      int c0 = w->shard == WK_SHARD_COLS ? w->off : 0;
      if (r0 + w->rows > out || c0 + w->cols > in)
        return cm_fail(err, errlen, CM_ERR_INVAL,
                       "layer %d %s: the weight's slice [%d + %d, %d + %d] is outside [%d, %d]",
                       layer, md_lora_mod_name((enum md_lora_mod)mod), r0, w->rows, c0, w->cols,
                       out, in);
      struct wk_lora_w *d = &o->w[layer][mod];
      int rc = upload(m, o, mw->a, 0, l->rank, c0, w->cols, 1.0f, &d->a);
      if (!rc) rc = upload(m, o, mw->b, r0, w->rows, 0, l->rank, (float)l->scale, &d->b);
      if (rc)
        return cm_fail(err, errlen, rc, "layer %d %s: %s", layer,
                       md_lora_mod_name((enum md_lora_mod)mod), cm_strerror(rc));
      d->rows = w->rows;
      d->cols = w->cols;
    }
  }
  return 0;
}

/* Slot o's adapter and its memory freed; the slot is empty. */
static void lora_clear(struct wk_model *m, struct wk_lora *o) {
  wk_owned_free(&o->owned, m->be);
  free(o->w);
  memset(o, 0, sizeof(*o));
}

/* The adapter in dir into the empty slot `slot` (max_rank > 0: refused above it). */
static int lora_load(struct wk_model *m, int slot, const char *name, const char *dir, int max_rank,
                     char *err, size_t errlen) {
  char why[768] = "";
  if (m->target)
    return cm_fail(err, errlen, CM_ERR_INVAL, "LoRA adapter %s: an assistant model takes none",
                   name);
  if (!m->loras && !(m->loras = calloc(WK_MAX_LORAS, sizeof(*m->loras))))
    return cm_fail(err, errlen, CM_ERR_NOMEM, "LoRA adapter %s: out of memory", name);
  struct md_lora *l = NULL;
  int rc = md_lora_open(dir, &m->full, &l, why, sizeof(why));
  if (rc) return cm_fail(err, errlen, rc, "LoRA adapter %s: %s", name, why);
  if (max_rank > 0 && l->rank > max_rank) {
    int r = l->rank;
    md_lora_close(l);
    return cm_fail(err, errlen, CM_ERR_RANGE,
                   "LoRA adapter %s has rank %d, above --max-lora-rank %d", name, r, max_rank);
  }
  struct wk_lora *o = &m->loras[slot - 1];
  o->rank = l->rank;
  o->w = calloc((size_t)m->cfg.n_layers, sizeof(*o->w));
  rc = o->w ? load_mods(m, l, o, why, sizeof(why)) : CM_ERR_NOMEM;
  md_lora_close(l);
  if (!rc && !m->lora_run && !(m->lora_run = calloc((size_t)m->max_seqs, sizeof(*m->lora_run))))
    rc = CM_ERR_NOMEM;
  if (!rc && o->rank > m->lora_rank) { /* (the smaller scratch stays with the model's memory) */
    float *tmp = wk_model_alloc(m, sizeof(float) * (size_t)m->max_T * (size_t)o->rank);
    if (!tmp)
      rc = CM_ERR_NOMEM;
    else
      m->lora_tmp = tmp, m->lora_rank = o->rank;
  }
  if (rc) {
    lora_clear(m, o);
    return cm_fail(err, errlen, rc, "LoRA adapter %s (%s): %s", name, dir,
                   why[0] ? why : cm_strerror(rc));
  }
  return 0;
}

int wk_model_add_lora(struct wk_model *m, const char *name, const char *dir, char *err,
                      size_t errlen) {
  if (m->n_lora >= WK_MAX_LORAS)
    return cm_fail(err, errlen, CM_ERR_TOOBIG, "LoRA adapter %s: more than %d adapters", name,
                   WK_MAX_LORAS);
  if (m->loras && m->loras[m->n_lora].w) /* (a run-time adapter would be overwritten) */
    return cm_fail(err, errlen, CM_ERR_INVAL, "LoRA adapter %s: slot %d is taken", name,
                   m->n_lora + 1);
  int rc = lora_load(m, m->n_lora + 1, name, dir, 0, err, errlen);
  if (!rc) m->n_lora++;
  return rc;
}

int wk_model_set_lora(struct wk_model *m, int slot, const char *dir, int max_rank, char *err,
                      size_t errlen) {
  if (slot <= m->n_lora || slot > WK_MAX_LORAS)
    return cm_fail(err, errlen, CM_ERR_RANGE, "LoRA slot %d: run-time adapters take slots %d to %d",
                   slot, m->n_lora + 1, WK_MAX_LORAS);
  wk_model_drop_lora(m, slot);
  char name[32];
  snprintf(name, sizeof(name), "in slot %d", slot);
  return lora_load(m, slot, name, dir, max_rank, err, errlen);
}

void wk_model_drop_lora(struct wk_model *m, int slot) {
  if (m->loras && slot > m->n_lora && slot <= WK_MAX_LORAS) lora_clear(m, &m->loras[slot - 1]);
}

void wk_model_drop_run_time_loras(struct wk_model *m) {
  for (int slot = m->n_lora + 1; slot <= WK_MAX_LORAS; slot++)
    wk_model_drop_lora(m, slot);
}

int wk_model_has_lora(const struct wk_model *m, int slot) {
  return slot >= 1 && slot <= WK_MAX_LORAS && m->loras && m->loras[slot - 1].w;
}

int wk_model_n_lora(const struct wk_model *m) {
  return m->n_lora;
}

int wk_model_lora_rank(const struct wk_model *m, int lora) {
  return m->loras[lora - 1].rank;
}

void wk_lora_free(struct wk_model *m) {
  for (int i = 0; m->loras && i < WK_MAX_LORAS; i++)
    lora_clear(m, &m->loras[i]);
  free(m->loras);
  free(m->lora_run);
  m->loras = NULL;
  m->lora_run = NULL;
  m->n_lora = 0;
}

void wk_lora_push(struct wk_model *m, int t0, int n, int lora) {
  struct wk_lora_run *last = m->n_lora_run ? &m->lora_run[m->n_lora_run - 1] : NULL;
  if (last && last->lora == lora && last->t0 + last->n == t0)
    last->n += n;
  else
    m->lora_run[m->n_lora_run++] = (struct wk_lora_run){t0, n, lora};
}

int wk_lora_runs(struct wk_model *m, const struct wk_batch *b, char *err, size_t errlen) {
  m->n_lora_run = 0;
  int T = 0;
  for (int s = 0; s < b->n_seqs; s++) {
    const struct wk_seq_input *q = &b->seqs[s];
    if (q->lora && !wk_model_has_lora(m, q->lora))
      return cm_fail(err, errlen, CM_ERR_RANGE,
                     "forward: sequence %d: LoRA adapter %d, which the model does not hold", s,
                     q->lora);
    if (q->lora && !q->pad) wk_lora_push(m, T, q->n_tokens, q->lora);
    T += q->n_tokens;
  }
  return 0;
}

int wk_lora_any(const struct wk_model *m, int layer, enum md_lora_mod mod) {
  for (int i = 0; i < m->n_lora_run; i++)
    if (m->loras[m->lora_run[i].lora - 1].w[layer][mod].a) return 1;
  return 0;
}

int wk_lora_apply(struct wk_model *m, int layer, enum md_lora_mod mod, float *out, ptrdiff_t ldo,
                  const float *in, ptrdiff_t ldi) {
  for (int i = 0; i < m->n_lora_run; i++) {
    const struct wk_lora_run *u = &m->lora_run[i];
    const struct wk_lora *l = &m->loras[u->lora - 1];
    const struct wk_lora_w *w = &l->w[layer][mod];
    if (!w->a) continue;
    int rc = kn_matmul(m->be, m->lora_tmp, l->rank, in + (ptrdiff_t)u->t0 * ldi, ldi, w->a,
                       KN_DTYPE_F32, u->n, l->rank, w->cols, 0);
    if (!rc)
      rc = kn_matmul(m->be, out + (ptrdiff_t)u->t0 * ldo, ldo, m->lora_tmp, l->rank, w->b,
                     KN_DTYPE_F32, u->n, w->rows, l->rank, 1);
    if (rc) return rc;
  }
  return 0;
}
