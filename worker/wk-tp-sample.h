/* wk-tp-sample.h — sampling rows of a vocab-parallel LM head without
 * gathering their logits.
 *
 * Each rank holds the logits of its vocabulary slice. For a row whose
 * distribution is decided by its best few tokens, each rank sends a small
 * record: its best candidates by processed logit (penalties and temperature
 * applied, as kn_sample applies them), each with its raw logit; the max and
 * the exp-sum of its raw logits (the log-softmax normaliser) and, for top-p
 * without top-k, of its processed ones; its best raw logits for top
 * logprobs. Every rank receives every record (one all-gather of about 1 KB
 * per row and rank, against 4 V / N bytes of logits) and merges them the same
 * way, so all ranks hold the same token — the penalty state and the MTP
 * draft of every rank need it.
 *
 * The merge gives kn_sample's answer on the whole row (kernels/cpu/
 * kn-cpu-sample.c, same processing, same draw): exactly for greedy rows and
 * top-k rows (k <= WK_TP_CANDS; the global top k is within the union of the
 * ranks' top k), and for top-p rows without top-k when the nucleus closes
 * above every rank's last sent candidate (else the row needs the full
 * logits). Rows with no top-k/top-p bound, min-p without top-k, or a larger
 * top-k are sampled from the full logits. Logprobs are the raw log-softmax:
 * the normaliser is the ranks' sums combined, within float rounding of the
 * single-rank sum. */
#ifndef LMSERVE_WK_TP_SAMPLE_H
#define LMSERVE_WK_TP_SAMPLE_H
#include <stddef.h>
#include <stdint.h>

#include "kernels/kn-backend.h"

#define WK_TP_CANDS 64 /* candidates a rank sends for a top-p row; top-k rows send k */

struct wk_tp_cand {
  float l;   /* processed logit */
  float raw; /* raw logit */
  int32_t id;
};

/* One rank's record for one row (plain data: all-gathered as bytes). */
struct wk_tp_rec {
  double raw_sum; /* sum(exp(raw - raw_max)) over the slice (logprobs) */
  double p_sum;   /* sum(exp(l - p_max)) over the slice (top-p without top-k) */
  float raw_max;  /* the slice's largest raw logit */
  float p_max;    /* its largest processed logit */
  float floor;    /* the last candidate's l when the slice holds more tokens */
  int32_t n_cand; /* candidates sent, best first (l descending, lower id on ties) */
  int32_t more;   /* 1 when tokens of the slice were left out */
  int32_t n_top;  /* entries in top_raw / top_ids, best first */
  struct wk_tp_cand cand[WK_TP_CANDS];
  float top_raw[KN_SAMPLE_MAX_LOGPROBS];
  int32_t top_ids[KN_SAMPLE_MAX_LOGPROBS];
};

/* 1 when rows with params p (over a vocabulary of V) can be sampled from the
 * ranks' records (possibly falling back: wk_tp_sample_merge), 0 when they
 * need the full logits. Invalid params give 0 (kn_sample reports them). */
int wk_tp_sample_fits(const struct kn_sample_params *p, int V);

/* Fills rec for a row of this rank's slice: logits[n], the vocabulary
 * entries [off, off + n) of a vocabulary of V. work: [n] floats scratch. */
void wk_tp_sample_local(struct wk_tp_rec *rec, const float *logits, int32_t off, int n, int V,
                        const struct kn_sample_params *p, float *work);

/* Bytes of scratch wk_tp_sample_merge needs for `world` ranks. */
size_t wk_tp_sample_scratch_bytes(int world);

/* Merges row r's records of every rank — recs[k * n_rows + r] for rank k —
 * into *out (kn_sample's result). 0; 1 when the records cannot decide the row
 * (a top-p nucleus reaching below a rank's last candidate): sample it from
 * the full logits; CM_ERR_INVAL for a row with nothing finite. */
int wk_tp_sample_merge(const struct wk_tp_rec *recs, int world, int n_rows, int r, int V,
                       const struct kn_sample_params *p, void *scratch, struct kn_sample_out *out);

#endif
