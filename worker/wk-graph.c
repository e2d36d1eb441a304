/* wk-graph.c — decode and verification steps as step graphs
 * (kernels/kn-backend.h's kn_graph_*: CUDA graphs on the CUDA backend).
 *
 * A step whose n sequences each run and sample the same number R of tokens
 * (R = 1: a decode; R = 1 + K: speculative verification of K drafts, as the
 * worker's steps are once every sequence has its drafts), with no images,
 * runs padded to the smallest bucket B >= n of 1, 2, 4, ... sequences of R
 * tokens: sequences n .. B-1 are padding rows (wk_seq_input.pad: R tokens 0
 * at positions 0 .. R-1 against page 0, no KV write, no output). The padded
 * step's trunk, final norm and head logits are one fixed sequence of ops for
 * every step of the bucket, so its graph, captured once at load, replays
 * them: the ops only write their host arrays, and one launch runs them all.
 * Every row is an output row, so the final norm runs over all of them in
 * place of the eager forward's gather; the real rows come first, and their
 * logits (and final-normed states, which drafting reads) then go through the
 * same head code as an eager step (argmax, sampling, download), outside the
 * graph, which never waits for the device.
 *
 * What runs differs from the eager step only in attention's launch shape: a
 * graph plans for contexts of max_position_embeddings keys (kn_graph_new),
 * so the key split, and with it the order of the partial sums, may differ
 * from the eager plan's; a step replayed and the same padded step run
 * uncaptured give the same bits, and load checks that for every bucket
 * before it keeps the graphs. A replay that cannot run (a staged array of
 * another size: a bug, logged once) runs the step eagerly instead.
 *
 * Not in graphs (eager, as before): prefill and mixed steps, verification
 * steps whose sequences have different numbers of drafts (the first decode
 * after a prefill, near max_tokens), the assistant's drafting steps, tensor
 * parallelism (the collectives stay outside captures for now), MoE layers
 * (the router's top-k waits for the device). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-log.h"
#include "common/cm-time.h"
#include "worker/wk-model-impl.h"
#include "worker/wk-model.h"

int wk_graph_bucket(const struct wk_model *m, const struct wk_batch *b) {
  if (!m->n_buckets || !b || !b->seqs || (!b->logits && !b->sampled)) return -1;
  int n = b->n_seqs;
  if (n < 1) return -1;
  int R = b->seqs[0].n_tokens;
  for (int s = 0; s < n; s++) {
    const struct wk_seq_input *q = &b->seqs[s];
    if (q->n_tokens != R || q->n_out != R || q->n_score || q->pad || q->n_embeds || q->n_bidir ||
        q->lora) /* an adapter's runs are not in the graphs */
      return -1;
  }
  int k = 0;
  while (k < m->n_buckets && (m->bucket_tokens[k] != R || m->bucket_seqs[k] < n))
    k++;
  if (k == m->n_buckets) return -1;
  /* a bucket whose graph was not kept runs as an ordinary step */
  return m->graphs[k] || m->graph_mode == WK_GRAPHS_PAD ? k : -1;
}

/* b's sequences, then padding rows up to bucket k's size, in m->gseqs. */
static struct wk_batch padded(struct wk_model *m, const struct wk_batch *b, int k) {
  int B = m->bucket_seqs[k];
  memcpy(m->gseqs, b->seqs, sizeof(*b->seqs) * (size_t)b->n_seqs);
  for (int s = b->n_seqs; s < B; s++) {
    struct wk_seq_input *q = &m->gseqs[s];
    memset(q, 0, sizeof(*q));
    q->tokens = m->pad_tokens;
    q->n_tokens = m->bucket_tokens[k];
    q->pad = 1;
    for (int g = 0; g < m->kv.n_groups; g++) {
      q->block_tables[g] = m->pad_table;
      q->n_blocks[g] = 1;
    }
  }
  struct wk_batch pb = *b;
  pb.seqs = m->gseqs;
  pb.n_seqs = B;
  return pb;
}

/* The graph's part of a padded step of T rows: trunk, final norm, head logits. */
static int body(struct wk_model *m, const struct wk_batch *pb, int T, char *err, size_t errlen) {
  const struct md_config *c = &m->cfg;
  int n_seqs, H = c->hidden;
  T = wk_fw_trunk(m, pb, T, T, 0, &n_seqs, err, errlen);
  if (T < 0) return T;
  int rc = kn_rmsnorm(m->be, m->sel, H, m->x, H, T, H, m->final_norm, KN_DTYPE_F32, (float)c->eps,
                      m->norm_mode);
  if (rc) return cm_fail(err, errlen, rc, "forward: final norm failed: %s", cm_strerror(rc));
  return wk_fw_logits(m, T, err, errlen);
}

/* Runs the padded step pb in graph g's mode (NULL: uncaptured). */
static int run_mode(struct wk_model *m, struct kn_graph *g, enum kn_graph_mode mode,
                    const struct wk_batch *pb, char *err, size_t errlen) {
  int R, rc;
  int T = wk_fw_prepare(m, pb, &R, err, errlen);
  if (T < 0) return T;
  if (!g) return body(m, pb, T, err, errlen);
  if ((rc = kn_graph_begin(m->be, g, mode)))
    return cm_fail(err, errlen, rc, "step graph: cannot begin: %s", cm_strerror(rc));
  rc = body(m, pb, T, err, errlen);
  int end = kn_graph_end(m->be, g, rc == 0);
  if (!rc && end) rc = cm_fail(err, errlen, end, "step graph of %d rows: %s", T, cm_strerror(end));
  return rc;
}

int wk_graph_forward(struct wk_model *m, const struct wk_batch *b, int k, char *err,
                     size_t errlen) {
  struct wk_batch pb = padded(m, b, k);
  int rc = -1;
  m->bucket_steps[k]++;
  if (m->graphs[k]) {
    rc = run_mode(m, m->graphs[k], KN_GRAPH_REPLAY, &pb, err, errlen);
    if (rc) { /* nothing ran: this step, and the bucket from now on, run uncaptured */
      cm_warn("wk", "step graph of %d rows dropped: %s", pb.n_seqs, err);
      kn_graph_free(m->be, m->graphs[k]);
      m->graphs[k] = NULL;
    }
  }
  if (rc && (rc = run_mode(m, NULL, 0, &pb, err, errlen))) return rc;
  int n = b->n_seqs * m->bucket_tokens[k], H = m->cfg.hidden; /* the real rows, first */
  if (b->hidden) rc = kn_download(m->be, b->hidden, m->sel, sizeof(float) * (size_t)n * H);
  if (!rc) rc = wk_fw_head(m, b, 0, n, 1, err, errlen);
  if (!rc) rc = kn_sync(m->be);
  return rc;
}

int wk_model_graph_check(struct wk_model *m, const struct wk_batch *b, char *err, size_t errlen) {
  int k = wk_graph_bucket(m, b);
  if (k < 0 || !m->graphs[k])
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED, "this step replays no step graph");
  struct wk_batch pb = padded(m, b, k);
  int B = pb.n_seqs * m->bucket_tokens[k]; /* rows */
  size_t bytes = sizeof(float) * (size_t)B * (size_t)m->lm_head.rows;
  float *want = malloc(bytes), *got = malloc(bytes);
  struct kn_graph *g = NULL;
  int rc = want && got ? 0 : CM_ERR_NOMEM;
  /* a fresh graph's measuring run is the uncaptured step with the graph's shapes */
  if (!rc) rc = kn_graph_new(m->be, m->cfg.max_pos, &g);
  if (!rc) rc = run_mode(m, g, KN_GRAPH_MEASURE, &pb, err, errlen);
  if (!rc) rc = kn_download(m->be, want, m->logits, bytes);
  if (!rc) rc = run_mode(m, m->graphs[k], KN_GRAPH_REPLAY, &pb, err, errlen);
  if (!rc) rc = kn_download(m->be, got, m->logits, bytes);
  if (!rc && memcmp(want, got, bytes)) {
    size_t i = 0;
    while (!memcmp(&want[i], &got[i], sizeof(float)))
      i++;
    rc = 1;
    cm_fail(err, errlen, 0, "bucket of %d rows: logit %zu of row %zu is %.9g replayed, %.9g not", B,
            i % (size_t)m->lm_head.rows, i / (size_t)m->lm_head.rows, (double)got[i],
            (double)want[i]);
  } else if (rc < 0 && !err[0]) {
    cm_fail(err, errlen, rc, "graph check: %s", cm_strerror(rc));
  }
  kn_graph_free(m->be, g);
  free(want);
  free(got);
  return rc;
}

/* A step of B real sequences of R tokens for the load-time check: token j of
 * sequence i is ((i * R + j) * 7919 + 11) mod V at position j on page i (its
 * own page in every group). tokens: [B * R]. */
static void check_step(struct wk_model *m, int B, int R, int32_t *tokens, int32_t *pages,
                       struct wk_seq_input *seqs) {
  const struct md_config *c = &m->cfg;
  int V = c->ple_dim ? CM_MIN(c->vocab, c->ple_vocab) : c->vocab;
  for (int i = 0; i < B; i++) {
    for (int j = 0; j < R; j++)
      tokens[i * R + j] = (int32_t)(((int64_t)(i * R + j) * 7919 + 11) % V);
    pages[i] = i;
    memset(&seqs[i], 0, sizeof(seqs[i]));
    seqs[i].tokens = &tokens[i * R];
    seqs[i].n_tokens = R;
    seqs[i].n_out = R;
    for (int g = 0; g < m->kv.n_groups; g++) {
      seqs[i].block_tables[g] = &pages[i];
      seqs[i].n_blocks[g] = 1;
    }
  }
}

/* Measures, captures and replays bucket k's graph on a check step, and
 * compares the logits of the uncaptured run, the capture's run and the replay
 * bit for bit. 1: kept; 0: dropped (why logged); negative: a device error. */
static int capture_bucket(struct wk_model *m, int k, float *want, float *got, char *err,
                          size_t errlen) {
  int B = m->bucket_seqs[k], R = m->bucket_tokens[k], Vl = m->lm_head.rows;
  size_t bytes = sizeof(float) * (size_t)B * (size_t)R * (size_t)Vl;
  int32_t *tokens = malloc(sizeof(int32_t) * (size_t)(R + 1) * (size_t)B);
  struct wk_seq_input *seqs = calloc((size_t)B, sizeof(*seqs));
  struct kn_graph *g = NULL;
  int rc = tokens && seqs ? 0 : CM_ERR_NOMEM;
  if (!rc) rc = kn_graph_new(m->be, m->cfg.max_pos, &g);
  if (rc) goto done;
  check_step(m, B, R, tokens, tokens + (size_t)B * R, seqs);
  struct wk_batch cb = {.seqs = seqs, .n_seqs = B};
  static const enum kn_graph_mode modes[3] = {KN_GRAPH_MEASURE, KN_GRAPH_CAPTURE, KN_GRAPH_REPLAY};
  for (int i = 0; i < 3 && !rc; i++) {
    rc = run_mode(m, g, modes[i], &cb, err, errlen);
    if (!rc) rc = kn_download(m->be, i ? got : want, m->logits, bytes);
    if (!rc && i && memcmp(want, got, bytes)) {
      double worst = 0;
      for (size_t j = 0; j < (size_t)B * (size_t)R * (size_t)Vl; j++)
        worst = fmax(worst, fabs((double)want[j] - (double)got[j]));
      cm_warn("wk",
              "step graph of %d sequences of %d tokens: its %s differs from the uncaptured run "
              "(by up to %g): that bucket runs eagerly",
              B, R, i == 1 ? "capture" : "replay", worst);
      rc = 1;
    }
  }
  if (rc < 0 && rc != CM_ERR_NOMEM && rc != CM_ERR_DEVICE) {
    cm_warn("wk", "step graph of %d sequences of %d tokens not kept: %s", B, R, err);
    rc = 1;
  }
done:
  if (rc == 0)
    m->graphs[k] = g;
  else
    kn_graph_free(m->be, g);
  free(tokens);
  free(seqs);
  return rc == 0 ? 1 : rc > 0 ? 0 : rc;
}

/* The buckets of sequences of R tokens: 1, 2, 4, ... sequences while their rows fit
 * the step (top sequences, max_out rows of logits, max_T tokens). */
static void add_buckets(struct wk_model *m, int R, int top) {
  for (int B = 1;
       B <= top && B * R <= CM_MIN(m->max_out, m->max_T) && m->n_buckets < WK_MAX_BUCKETS; B *= 2) {
    m->bucket_seqs[m->n_buckets] = B;
    m->bucket_tokens[m->n_buckets++] = R;
  }
}

int wk_graph_init(struct wk_model *m, int mode, int max_bucket, int verify_tokens, char *err,
                  size_t errlen) {
  const struct md_config *c = &m->cfg;
  if (!mode || !m->n_pages) return 0;
  int top = CM_MIN(m->max_seqs, m->n_pages);
  if (max_bucket > 0) top = CM_MIN(top, max_bucket);
  if (mode == WK_GRAPHS_CAPTURE) { /* a backend without graphs: nothing to say */
    struct kn_graph *probe = NULL;
    int rc = kn_graph_new(m->be, 1, &probe);
    kn_graph_free(m->be, probe);
    if (rc == CM_ERR_UNSUPPORTED &&
        (m->plan.world == 1 || kn_backend_has(m->be, KN_CAP_HOST_MEMORY)))
      return 0;
  }
  const char *why = NULL;
  if (c->n_experts)
    why = "MoE layers wait for the router's top-k";
  else if (m->plan.world > 1)
    why = "tensor-parallel collectives stay outside graphs";
  else if (getenv("LMSERVE_OP_PROFILE") && strcmp(getenv("LMSERVE_OP_PROFILE"), "0"))
    why = "$LMSERVE_OP_PROFILE times the ops one by one";
  if (why && mode == WK_GRAPHS_CAPTURE) {
    cm_info("wk", "decode steps run eagerly: %s", why);
    return 0;
  }
  add_buckets(m, 1, top);
  /* a padding row's tokens sit on one page of every group */
  int fits = verify_tokens > 1 && verify_tokens <= WK_GRAPH_MAX_TOKENS;
  for (int g = 0; fits && g < m->kv.n_groups; g++)
    fits = verify_tokens <= m->kv.groups[g].block_tokens;
  if (fits)
    add_buckets(m, verify_tokens, top);
  else if (verify_tokens > 1 && mode == WK_GRAPHS_CAPTURE)
    cm_info("wk",
            "verification steps of %d tokens a sequence run eagerly (graphs take up to %d, "
            "within a KV block)",
            verify_tokens, WK_GRAPH_MAX_TOKENS);
  if (!m->n_buckets) return 0;
  m->graph_mode = mode;
  int most_seqs = 0, most_rows = 0;
  for (int k = 0; k < m->n_buckets; k++) {
    most_seqs = CM_MAX(most_seqs, m->bucket_seqs[k]);
    most_rows = CM_MAX(most_rows, m->bucket_seqs[k] * m->bucket_tokens[k]);
  }
  m->gseqs = calloc((size_t)most_seqs, sizeof(*m->gseqs));
  if (!m->gseqs) return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory for step graphs");
  if (mode != WK_GRAPHS_CAPTURE) return 0; /* padded, uncaptured */

  size_t n = (size_t)most_rows * (size_t)m->lm_head.rows;
  float *want = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
  int rc = want && got ? 0 : CM_ERR_NOMEM, kept = 0;
  uint64_t t0 = cm_time_ns();
  for (int k = 0; k < m->n_buckets && rc >= 0; k++) {
    rc = capture_bucket(m, k, want, got, err, errlen);
    if (rc == CM_ERR_UNSUPPORTED && k == 0) { /* a backend without graphs */
      rc = 0;
      m->n_buckets = 0;
      break;
    }
    if (rc > 0) kept++;
  }
  free(want);
  free(got);
  if (rc < 0) {
    wk_graph_free(m);
    return cm_fail(err, errlen, rc, "step graphs: %s", err[0] ? err : cm_strerror(rc));
  }
  if (m->n_buckets)
    cm_info("wk", "step graphs: %d of %d buckets (1 .. %d sequences%s) captured in %.0f ms%s", kept,
            m->n_buckets, most_seqs, fits ? ", of one token and of a token with its drafts" : "",
            (double)(cm_time_ns() - t0) / 1e6,
            kept < m->n_buckets ? " (the others run eagerly, padded)" : "");
  return 0;
}

void wk_graph_free(struct wk_model *m) {
  for (int k = 0; k < m->n_buckets; k++) {
    kn_graph_free(m->be, m->graphs[k]);
    m->graphs[k] = NULL;
  }
  m->n_buckets = 0;
  free(m->gseqs);
  m->gseqs = NULL;
}
