/* kn-cpu-ops.c — the CPU backend's ops: split each op into per-thread shares
 * and call the kernel table (kn-cpu-impl.h) on them.
 *
 * Shares never split an output element: matmul splits output features (and
 * token blocks), norms and elementwise ops split rows or flat ranges,
 * attention hands out (sequence, query, kv head, head chunk) items. Arguments were
 * validated by kn-backend.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/cpu/kn-cpu-sample.h"
#include "kernels/kn-backend-impl.h"
#include "kernels/kn-quant.h"

/* Below this much work (multiply-adds or elements) an op runs on one thread. */
#define PAR_MIN_WORK (1 << 15)
/* Bytes of weights per matvec work unit. */
#define MATVEC_UNIT_BYTES (256 * 1024)
/* Output features per matmul_argmax unit at most (whole chunks). */
#define ARGMAX_UNIT_ROWS 2048
/* Bytes of widened f32 weights per tile chunk (fits L2 with the inputs). */
#define TILE_CHUNK_BYTES (128 * 1024)
/* Bytes of input rows per tile block: the block stays in L1 while the
 * chunk's weight rows stream past it from L2. */
#define TILE_X_BYTES (8 * 1024)
/* Bytes of packed f32 weights per chunk when the table packs. */
#define PACK_CHUNK_BYTES (32 * 1024)

/* Units per claim: all of them (run on the caller) when the whole op is
 * smaller than PAR_MIN_WORK, else `grain`. */
static long long grain_for(double work, long long n_units, long long grain) {
  return work < PAR_MIN_WORK ? n_units : grain;
}

/* ---- matmul ------------------------------------------------------------- */

struct mm_task {
  struct kn_cpu_ctx *ctx;
  float *out;
  ptrdiff_t ldo;
  const float *in;
  ptrdiff_t ldi;
  const char *w; /* [N, K] */
  enum kn_dtype dt;
  int T, N, K, acc;
  float cap; /* > 0: softcap each unit's outputs while they are in cache */
  int chunk; /* output features per work unit */
  int tile;  /* widen + tile_f32 instead of matvec */
  size_t deq; /* block formats in the tile path: where in the thread's scratch (floats)
                 a unit's rows are dequantized before they are packed or tiled */
  int bf;    /* bf16 mode: dot_bf16 over ctx->xb (row stride ldx) */
  ptrdiff_t ldx;
  int tok;                  /* argmax: tok_argmax over ctx->xt instead of units and argmax rows */
  size_t wbuf;              /* floats of per-thread scratch the unit's kernels use */
  int achunk;               /* argmax: output features per unit, whole chunks */
  ptrdiff_t ldu;            /* argmax: the row stride of a unit's outputs */
  struct kn_cpu_best *best; /* argmax: [units, T] each unit's row maxima */
  const uint32_t *const *allow; /* argmax: [T] each row's mask, or NULL (kn_matmul_argmax_masked) */
};

/* Softcaps outputs [0, n) of every token at out (stride ldo): elementwise, so
 * the same bits as one softcap over the whole rows afterwards. */
static void cap_unit(const struct mm_task *m, float *out, ptrdiff_t ldo, int n) {
  for (int t = 0; t < m->T; t++) {
    float *o = out + (ptrdiff_t)t * ldo;
    m->ctx->dsp.softcap(o, o, m->cap, (size_t)n);
  }
}

/* Computes outputs [n0, n0 + n) of every token into out (stride ldo; out[0]
 * is feature n0), softcapped when m->cap > 0. */
static void mm_unit(const struct mm_task *m, float *out, ptrdiff_t ldo, int n0, int n, int ith) {
  const struct kn_cpu_dsp *dsp = &m->ctx->dsp;
  const char *w = m->w + (size_t)n0 * kn_row_bytes(m->dt, (size_t)m->K);
  float *buf = m->ctx->scratch[ith];
  enum kn_dtype dt = m->dt;
  if (m->tile && kn_block_elems(dt)) { /* exact f32 values first, then as an f32 weight */
    float *d = buf + m->deq;
    if (dsp->deq_rows[dt])
      dsp->deq_rows[dt](d, w, m->K, n);
    else
      for (int j = 0; j < n; j++)
        kn_dequant_row(dt, w + (size_t)j * kn_row_bytes(dt, (size_t)m->K), d + (size_t)j * m->K,
                       (size_t)m->K);
    w = (const char *)d;
    dt = KN_DTYPE_F32;
  }
  if (m->bf || !m->tile) {
    if (m->bf)
      dsp->dot_bf16(out, ldo, m->ctx->xb, m->ldx, (const uint16_t *)w, m->K, m->T, n, m->acc);
    else
      dsp->matvec[m->dt](out, ldo, m->in, m->ldi, w, m->K, m->T, n, m->acc);
    if (m->cap > 0.0f) cap_unit(m, out, ldo, n);
    return;
  }
  const float *wf = (const float *)w;
  if (dsp->pack) {
    dsp->pack(buf, w, dt, m->K, n);
    wf = buf;
  } else if (dt != KN_DTYPE_F32) {
    dsp->widen(buf, w, dt, (size_t)n * (size_t)m->K);
    wf = buf;
  }
  int tblk = TILE_X_BYTES / (4 * m->K);
  int tt = dsp->tile_tokens;
  tblk = tblk < tt ? tt : tblk - tblk % tt;
  for (int t0 = 0; t0 < m->T; t0 += tblk) {
    int tb = m->T - t0 < tblk ? m->T - t0 : tblk;
    dsp->tile_f32(out + (ptrdiff_t)t0 * ldo, ldo, m->in + (ptrdiff_t)t0 * m->ldi, m->ldi, wf, m->K,
                  tb, n, m->acc);
  }
  if (m->cap > 0.0f) cap_unit(m, out, ldo, n);
}

static void mm_run(void *arg, long long u0, long long u1, int ith) {
  struct mm_task *m = arg;
  for (long long u = u0; u < u1; u++) {
    int n0 = (int)u * m->chunk;
    mm_unit(m, m->out + n0, m->ldo, n0, m->N - n0 < m->chunk ? m->N - n0 : m->chunk, ith);
  }
}

/* Makes the 64-byte aligned buffer *p (*cap elements of size bytes) hold n
 * (its contents are not kept); 0 or CM_ERR_NOMEM. */
static int grow_buf(void **p, size_t *cap, size_t n, size_t size) {
  if (n <= *cap) return 0;
  void *q = aligned_alloc(64, (n * size + 63) & ~(size_t)63);
  if (!q) return CM_ERR_NOMEM;
  free(*p);
  *p = q;
  *cap = n;
  return 0;
}

/* Lays the T x K inputs out for tok_argmax in ctx->xt: per group of 16 tokens,
 * K rounded up to 8 rows of 16 floats (token t of the group in lane t), zero
 * past K and past T. */
static int tok_inputs(struct kn_cpu_ctx *ctx, const float *in, ptrdiff_t ldi, int T, int K) {
  const int Kp = (K + 7) & ~7, G = (T + 15) / 16;
  int rc = grow_buf((void **)&ctx->xt, &ctx->xt_floats, (size_t)G * (size_t)Kp * 16, 4);
  if (rc) return rc;
  for (int g = 0; g < G; g++) {
    float *xg = ctx->xt + (size_t)g * Kp * 16;
    for (int k = 0; k < Kp; k++)
      for (int l = 0; l < 16; l++) {
        int t = 16 * g + l;
        xg[(size_t)k * 16 + l] = t < T && k < K ? in[(ptrdiff_t)t * ldi + k] : 0.0f;
      }
  }
  return 0;
}

/* Rows [r0, r1) of in rounded to bf16, kept in f32, into dst (stride K). */
struct round_task {
  const float *in;
  ptrdiff_t ldi;
  float *dst;
  int K;
};

static void round_run(void *arg, long long r0, long long r1, int ith) {
  const struct round_task *r = arg;
  (void)ith;
  for (long long t = r0; t < r1; t++)
    for (int k = 0; k < r->K; k++)
      r->dst[t * r->K + k] = kn_bf16_to_f32(kn_f32_to_bf16(r->in[t * r->ldi + k]));
}

/* The bf16 mode's inputs (ctx->bf16) for a matmul over weights of dtype
 * dt: T rows of K rounded to bf16, into ctx->xb as dsp.round_bf16 lays them
 * out when dot_bf16 takes dt (*bf set, *ldx its row stride), else in f32
 * into ctx->xr (*in and *ldi moved there). Nothing in the default mode. */
static int bf16_inputs(struct kn_cpu_ctx *ctx, enum kn_dtype dt, int T, int K, const float **in,
                       ptrdiff_t *ldi, int *bf, ptrdiff_t *ldx) {
  if (!ctx->bf16) return 0;
  if (ctx->dsp.dot_bf16 && dt == KN_DTYPE_BF16) {
    const int row = kn_cpu_bf16_row(K), align = ctx->dsp.bf16_tokens;
    const size_t tokens = (size_t)(T + align - 1) / (size_t)align * (size_t)align;
    int rc = grow_buf((void **)&ctx->xb, &ctx->xb_elems, tokens * (size_t)row, 2);
    if (rc) return rc;
    ctx->dsp.round_bf16(ctx->xb, row, *in, *ldi, T, K);
    *bf = 1;
    *ldx = row;
    return 0;
  }
  int rc = grow_buf((void **)&ctx->xr, &ctx->xr_floats, (size_t)T * (size_t)K, 4);
  if (rc) return rc;
  struct round_task rt = {*in, *ldi, ctx->xr, K};
  kn_cpu_pool_run(ctx->pool, T, grain_for((double)T * K, T, 16), round_run, &rt);
  *in = ctx->xr;
  *ldi = K;
  return 0;
}

/* Chooses the kernels and the work units of m (T, N > 0, K > 0 set; argmax:
 * for matmul_argmax) and readies what they need: the transposed inputs,
 * m->wbuf. */
static int mm_plan(struct kn_cpu_ctx *ctx, struct mm_task *m, int argmax) {
  const int T = m->T, N = m->N, K = m->K, nth = ctx->n_threads;
  const struct kn_cpu_dsp *dsp = &ctx->dsp;
  int rc = bf16_inputs(ctx, m->dt, T, K, &m->in, &m->ldi, &m->bf, &m->ldx);
  if (rc) return rc;
  m->tok = !m->bf && argmax && dsp->tok_argmax && T >= dsp->tok_min_t && K <= dsp->tok_max_k;
  m->tile = !m->bf && !m->tok && T >= dsp->tile_min_t && (long long)T * K >= dsp->tile_min_tk;
  /* a block format without a matvec in this table: dequantized rows, tiled */
  const int blk = kn_block_elems(m->dt) > 0;
  if (blk && !dsp->matvec[m->dt]) m->tile = 1;
  m->wbuf = 0;
  m->deq = 0;
  /* matvec units: about MATVEC_UNIT_BYTES of weights, small enough that a
   * thread preempted mid-unit (the machine may be shared) delays the op
   * little, but at least 4 units per thread */
  long long row_bytes = (long long)kn_row_bytes(m->dt, (size_t)K);
  long long mv = MATVEC_UNIT_BYTES / row_bytes, most = (N + nth * 4 - 1) / (nth * 4);
  if (mv > most) mv = most;
  if (m->bf) { /* whole row groups of dot_bf16, at least two */
    const long long r = dsp->bf16_rows;
    m->chunk = (int)(mv < 2 * r ? 2 * r : (mv + r - 1) / r * r);
  } else if (m->tok) {
    if ((rc = tok_inputs(ctx, m->in, m->ldi, T, K))) return rc;
    m->wbuf = kn_cpu_tok_argmax_floats(K, T);
    m->chunk = (int)((mv + 15) & ~15LL);
  } else if (m->tile && dsp->pack) {
    /* groups of packed rows about PACK_CHUNK_BYTES together (L1) */
    long long c = PACK_CHUNK_BYTES / (4LL * K);
    c = c < KN_PACK_GROUP ? KN_PACK_GROUP : c > 256 ? 256 : c - c % KN_PACK_GROUP;
    m->chunk = (int)c;
    m->wbuf = kn_cpu_packed_floats(K, m->chunk);
  } else if (m->tile) {
    long long c = TILE_CHUNK_BYTES / (4LL * K);
    c = c < 3 ? 3 : c > 63 ? 63 : c - c % 3;
    m->chunk = (int)c;
    if (m->dt != KN_DTYPE_F32 && !blk) m->wbuf = (size_t)m->chunk * (size_t)K;
  } else {
    m->chunk = (int)((mv < 16 ? 16 : mv + 3) & ~3LL); /* multiples of 4 rows */
  }
  if (m->tile && blk) { /* the dequantized rows after what the tile path uses */
    m->deq = (m->wbuf + 15) & ~(size_t)15;
    m->wbuf = m->deq + (size_t)m->chunk * (size_t)K;
  }
  return 0;
}

/* ---- the q8 mode: block-format weights against inputs in Q8_0 blocks ---------- */

/* One matrix of a q8 call: its outputs, weights and work units (units
 * [u0, u0 + units) of the call, `chunk` rows each). */
struct q8_part {
  float *out;
  ptrdiff_t ldo;
  const uint8_t *w;
  int N, chunk;
  long long u0;
};

/* A q8 call: one or more matrices against the same prepared inputs (kn_matmul,
 * kn_matmul_n's parts), or a gated MLP's pair (glu: parts[0] the gate rows
 * into out, parts[1] the same up rows into the thread's scratch, then
 * gelu_mul over the unit's rows). */
struct q8_task {
  struct kn_cpu_ctx *ctx;
  struct kn_cpu_q8_in x;
  size_t row_bytes;
  enum kn_dtype dt;
  int T, K, acc, glu, n_parts;
  float cap;
  struct q8_part parts[KN_MM_MAX_PARTS];
};

/* n rows of a q8 call from w into o: an X16 weight's groups on the table's
 * matrix tiles where it has them and the call KN_CPU_Q8_TILE_TOKENS tokens,
 * the rest (or all) with its q8dot; the same bits either way. */
static void q8_rows(const struct kn_cpu_dsp *dsp, enum kn_dtype dt, float *o, ptrdiff_t ldo,
                    const struct kn_cpu_q8_in *x, const uint8_t *w, size_t row_bytes, int K, int T,
                    int n, int acc) {
  const int ng = n / KN_X16_ROWS * KN_X16_ROWS;
  if (dsp->q8tiles[dt] && T >= KN_CPU_Q8_TILE_TOKENS && ng > 0) {
    dsp->q8tiles[dt](o, ldo, x, w, row_bytes, K, T, ng, acc);
    if (n > ng)
      dsp->q8dot[dt](o + ng, ldo, x, w + (size_t)ng * row_bytes, row_bytes, K, T, n - ng, acc);
    return;
  }
  dsp->q8dot[dt](o, ldo, x, w, row_bytes, K, T, n, acc);
}

static void q8_run(void *arg, long long u0, long long u1, int ith) {
  const struct q8_task *q = arg;
  const struct kn_cpu_dsp *dsp = &q->ctx->dsp;
  for (long long u = u0; u < u1; u++) {
    int p = 0;
    while (p + 1 < q->n_parts && u >= q->parts[p + 1].u0)
      p++;
    const struct q8_part *pt = &q->parts[p];
    const int n0 = (int)(u - pt->u0) * pt->chunk,
              n = pt->N - n0 < pt->chunk ? pt->N - n0 : pt->chunk;
    float *o = pt->out + n0;
    q8_rows(dsp, q->dt, o, pt->ldo, &q->x, pt->w + (size_t)n0 * q->row_bytes, q->row_bytes, q->K,
            q->T, n, q->acc);
    if (q->glu) { /* the up rows beside, then the gate's GELU times them in place */
      const struct q8_part *up = &q->parts[1];
      float *ub = q->ctx->scratch[ith];
      q8_rows(dsp, q->dt, ub, n, &q->x, up->w + (size_t)n0 * q->row_bytes, q->row_bytes, q->K, q->T,
              n, 0);
      for (int t = 0; t < q->T; t++)
        dsp->gelu_mul(o + (ptrdiff_t)t * pt->ldo, o + (ptrdiff_t)t * pt->ldo, ub + (size_t)t * n,
                      n);
    }
    for (int t = 0; t < q->T && q->cap > 0.0f; t++)
      dsp->softcap(o + (ptrdiff_t)t * pt->ldo, o + (ptrdiff_t)t * pt->ldo, q->cap, (size_t)n);
  }
}

/* A q8 matmul's T inputs (in, ldi floats apart) prepared as struct
 * kn_cpu_q8_in has them for the weights' offset (shift: its log2, 0 for
 * none), a token a unit (dsp.q8_prep: Q8_0 blocks as llama.cpp rounds them,
 * their scales in f32, each lane's input sum times -(1 << shift)); with xi, a
 * group of KN_CPU_Q8_GROUP tokens a unit, then put side by side (the padding
 * of the last group is zeroed before). */
struct q8_prep {
  const struct kn_cpu_dsp *dsp;
  const float *in;
  ptrdiff_t ldi;
  uint8_t *q;
  float *d;
  int32_t *s;
  int32_t *o;
  int8_t *xi; /* NULL: not side by side */
  float *di;
  int32_t *si;
  size_t ldq;
  int T, K, shift;
};

static void q8_prep_run(void *arg, long long u0, long long u1, int ith) {
  const struct q8_prep *p = arg;
  const int B = p->K / 32, per = p->xi ? KN_CPU_Q8_GROUP : 1; /* a token, or a group */
  (void)ith;
  for (long long u = u0; u < u1; u++) {
    const int t0 = (int)u * per, nt = p->T - t0 < per ? p->T - t0 : per;
    for (int t = t0; t < t0 + nt; t++) {
      int32_t *st = p->s + (size_t)t * (size_t)B * 8;
      p->dsp->q8_prep(p->in + (ptrdiff_t)t * p->ldi, p->K, p->q + (size_t)t * p->ldq,
                      p->d + (size_t)t * (size_t)B, st, p->shift);
      for (int b = 0; p->o && b < B; b++) { /* each block's offset term */
        const int32_t *l = st + (size_t)b * 8;
        p->o[(size_t)t * (size_t)B + (size_t)b] =
            l[0] + l[1] + l[2] + l[3] + l[4] + l[5] + l[6] + l[7];
      }
    }
    if (!p->xi) continue;
    for (int b = 0; b < B; b++) { /* the group's tokens side by side, written in order */
      const size_t gb = (size_t)u * (size_t)B + (size_t)b;
      int8_t *xi = p->xi + gb * 8 * 4 * KN_CPU_Q8_GROUP;
      for (int j = 0; j < 8; j++)
        for (int l = 0; l < nt; l++)
          memcpy(xi + 4 * KN_CPU_Q8_GROUP * j + 4 * l,
                 p->q + (size_t)(t0 + l) * p->ldq + (size_t)b * 34 + 2 + 4 * j, 4);
      for (int l = 0; l < nt; l++) {
        const size_t at = (size_t)(t0 + l) * (size_t)B + (size_t)b;
        p->di[gb * KN_CPU_Q8_GROUP + (size_t)l] = p->d[at];
        p->si[gb * KN_CPU_Q8_GROUP + (size_t)l] = p->o[at];
      }
    }
  }
}

/* The unit after a part's last one. */
static long long q8_part_end(const struct q8_part *pt) {
  return pt->u0 + (pt->N + pt->chunk - 1) / pt->chunk;
}

/* Prepares in[T, K] as the q8 kernels take it for weights of dtype dt, into
 * ctx's buffers (q->x). */
static int q8_inputs(struct kn_cpu_ctx *ctx, const float *in, ptrdiff_t ldi, enum kn_dtype dt,
                     int T, int K, struct q8_task *q) {
  size_t ldx = kn_row_bytes(KN_DTYPE_Q8_0, (size_t)K);
  int rc = grow_buf((void **)&ctx->xq, &ctx->xq_bytes, (size_t)T * ldx, 1);
  if (rc) return rc;
  const size_t B = (size_t)K / 32;
  if ((rc = grow_buf((void **)&ctx->xs, &ctx->xs_n, (size_t)T * B * 8, 4))) return rc;
  if ((rc = grow_buf((void **)&ctx->xd, &ctx->xd_n, (size_t)T * B, 4))) return rc;
  if ((rc = grow_buf((void **)&ctx->xo, &ctx->xo_n, (size_t)T * B, 4))) return rc;
  const enum kn_dtype rdt = kn_dtype_rows_of(dt);
  /* formats with a min (they take the block's input sum) and the K-quants */
  const int mink = rdt == KN_DTYPE_Q4_1 || rdt == KN_DTYPE_Q5_1 || rdt == KN_DTYPE_Q4_K ||
                   rdt == KN_DTYPE_Q5_K || rdt == KN_DTYPE_Q6_K;
  struct q8_prep p = {.dsp = &ctx->dsp,
                      .in = in,
                      .ldi = ldi,
                      .q = ctx->xq,
                      .d = ctx->xd,
                      .s = ctx->xs,
                      /* the block sums (the formats with an X16 layout: all) */
                      .o = kn_dtype_x16_of(rdt) != KN_DTYPE__COUNT || mink ? ctx->xo : NULL,
                      .ldq = ldx,
                      .T = T,
                      .K = K,
                      .shift =
                          rdt == KN_DTYPE_Q3_K   ? 2 /* q + 4 unsigned */
                          : rdt == KN_DTYPE_Q4_0 ? 3
                          : rdt == KN_DTYPE_Q5_0 ? 4
                          : rdt == KN_DTYPE_Q6_K ? 5
                          : rdt == KN_DTYPE_Q8_0 || rdt == KN_DTYPE_IQ4_NL || rdt == KN_DTYPE_IQ4_XS
                              ? 7 /* w + 128 unsigned (VNNI) */
                              : 0};
  if (!kn_dtype_x16(dt) && (dt == KN_DTYPE_Q4_0 || dt == KN_DTYPE_Q8_0 || mink) &&
      T >= KN_CPU_Q8_TOKENS) {
    const size_t GS = KN_CPU_Q8_GROUP, G = ((size_t)T + GS - 1) / GS, xb = B * 8 * 4 * GS;
    if ((rc = grow_buf((void **)&ctx->xp, &ctx->xp_bytes, G * (xb + 2 * B * 4 * GS), 1))) return rc;
    p.xi = (int8_t *)ctx->xp;
    p.di = (float *)(ctx->xp + G * xb);
    p.si = (int32_t *)(ctx->xp + G * xb + G * B * 4 * GS);
    if (T % GS) { /* the last group's padding: zero inputs, scales and sums */
      memset(p.xi + (G - 1) * xb, 0, xb);
      memset(p.di + (G - 1) * B * GS, 0, B * 4 * GS);
      memset(p.si + (G - 1) * B * GS, 0, B * 4 * GS);
    }
  }
  const long long units = p.xi ? (T + KN_CPU_Q8_GROUP - 1) / KN_CPU_Q8_GROUP : T;
  kn_cpu_pool_run(ctx->pool, units, grain_for((double)T * K * 16, units, 1), q8_prep_run, &p);
  q->ctx = ctx;
  q->x = (struct kn_cpu_q8_in){.q = ctx->xq,
                               .d = ctx->xd,
                               .s = ctx->xs,
                               .o = p.o,
                               .xi = p.xi,
                               .di = p.di,
                               .si = p.si,
                               .ldq = ldx};
  q->row_bytes = kn_row_bytes(dt, (size_t)K);
  q->dt = dt;
  q->T = T;
  q->K = K;
  return 0;
}

/* Adds a matrix of N rows to q (units of about MATVEC_UNIT_BYTES / per_row
 * rows, at least 4 units per thread, whole groups of KN_X16_ROWS: a unit
 * starts at a multiple of 16 rows, as X16 layouts need); its units follow
 * the parts before it. */
static void q8_add_part(struct q8_task *q, float *out, ptrdiff_t ldo, const void *w, int N,
                        size_t per_row) {
  struct q8_part *pt = &q->parts[q->n_parts];
  const int nth = q->ctx->n_threads;
  long long c = MATVEC_UNIT_BYTES / (long long)per_row;
  long long most = (N + 4LL * nth - 1) / (4LL * nth);
  c = c > most ? most : c;
  *pt = (struct q8_part){
      .out = out,
      .ldo = ldo,
      .w = w,
      .N = N,
      .chunk =
          (int)(c < KN_X16_ROWS ? KN_X16_ROWS : (c + KN_X16_ROWS - 1) / KN_X16_ROWS * KN_X16_ROWS),
      .u0 = q->n_parts ? q8_part_end(&q->parts[q->n_parts - 1]) : 0};
  q->n_parts++;
}

/* Runs q's units (those of its parts; a GLU's, its gate's) on the pool. */
static void q8_launch(struct q8_task *q, double work) {
  long long units = q8_part_end(&q->parts[q->glu ? 0 : q->n_parts - 1]);
  kn_cpu_pool_run(q->ctx->pool, units, grain_for(work, units, 1), q8_run, q);
}

static int q8_mm(struct kn_cpu_ctx *ctx, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                 const void *w, enum kn_dtype dt, int T, int N, int K, int acc, float cap) {
  struct q8_task q = {.acc = acc, .cap = cap};
  int rc = q8_inputs(ctx, in, ldi, dt, T, K, &q);
  if (rc) return rc;
  q8_add_part(&q, out, ldo, w, N, q.row_bytes);
  q8_launch(&q, (double)T * N * K);
  return 0;
}

/* kn_matmul_n in the q8 mode: the inputs prepared once, every part's rows in
 * one pool task (each output as kn_matmul computes it). Other weights: the
 * sequence. */
static int cpu_matmul_n(void *p, const float *in, ptrdiff_t ldi, enum kn_dtype wdt, int T, int K,
                        const struct kn_mm_part *parts, int n_parts) {
  struct kn_cpu_ctx *ctx = p;
  if (!ctx->q8 || !ctx->dsp.q8dot[wdt] || n_parts > KN_MM_MAX_PARTS) return CM_ERR_UNSUPPORTED;
  struct q8_task q = {0};
  int rc = q8_inputs(ctx, in, ldi, wdt, T, K, &q);
  if (rc) return rc;
  double work = 0.0;
  for (int i = 0; i < n_parts; i++)
    if (parts[i].N > 0) {
      q8_add_part(&q, parts[i].out, parts[i].ldo, parts[i].w, parts[i].N, q.row_bytes);
      work += (double)T * parts[i].N * K;
    }
  if (q.n_parts) q8_launch(&q, work);
  return 0;
}

/* kn_matmul_glu in the q8 mode: each unit computes its gate rows into out and
 * the same up rows into the thread's scratch, then gelu_mul over them (the
 * sequence's bits: gelu_mul is elementwise). Other weights: the sequence. */
static int cpu_matmul_glu(void *p, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                          const void *wg, const float *sg, const void *wu, const float *su,
                          enum kn_dtype wdt, int T, int N, int K) {
  struct kn_cpu_ctx *ctx = p;
  if (!ctx->q8 || !ctx->dsp.q8dot[wdt] || sg || su) return CM_ERR_UNSUPPORTED;
  struct q8_task q = {.glu = 1};
  int rc = q8_inputs(ctx, in, ldi, wdt, T, K, &q);
  if (rc) return rc;
  q8_add_part(&q, out, ldo, wg, N, 2 * q.row_bytes);
  q8_add_part(&q, NULL, 0, wu, N, 2 * q.row_bytes);
  if ((rc = kn_cpu_ctx_scratch(ctx, (size_t)T * (size_t)q.parts[0].chunk))) return rc;
  q8_launch(&q, 2.0 * T * N * K);
  return 0;
}

/* kn_weights_prepare: in the q8 mode, the block formats' rows side by side in
 * groups of 16 (kn-quant.h's X16 layouts), which its kernels read with
 * no sums across lanes. */
static int cpu_weights_prepare(void *p, void *w, enum kn_dtype *dt, int n, int K) {
  struct kn_cpu_ctx *ctx = p;
  const enum kn_dtype x = kn_dtype_x16_of(*dt);
  if (!ctx->q8 || x == KN_DTYPE__COUNT || !ctx->dsp.q8dot[x] || n < KN_X16_ROWS ||
      K % kn_block_elems(*dt))
    return 0;
  int rc = kn_x16_pack(*dt, w, n, K);
  if (!rc) *dt = x;
  return rc;
}

static int mm(struct kn_cpu_ctx *ctx, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
              const void *w, enum kn_dtype wdt, int T, int N, int K, int accumulate, float cap) {
  if (K == 0) {
    for (int t = 0; t < T && !accumulate; t++) {
      memset(out + (ptrdiff_t)t * ldo, 0, N * 4u);
      if (cap > 0.0f) ctx->dsp.softcap(out + (ptrdiff_t)t * ldo, out + (ptrdiff_t)t * ldo, cap, N);
    }
    return 0;
  }
  if (ctx->q8 && ctx->dsp.q8dot[wdt])
    return q8_mm(ctx, out, ldo, in, ldi, w, wdt, T, N, K, accumulate, cap);
  if (kn_dtype_x16(wdt)) return CM_ERR_UNSUPPORTED; /* the q8 mode's layout */
  struct mm_task m = {.ctx = ctx,
                      .out = out,
                      .ldo = ldo,
                      .in = in,
                      .ldi = ldi,
                      .w = w,
                      .dt = wdt,
                      .T = T,
                      .N = N,
                      .K = K,
                      .acc = accumulate,
                      .cap = cap};
  int rc = mm_plan(ctx, &m, 0);
  if (rc || (rc = kn_cpu_ctx_scratch(ctx, m.wbuf))) return rc;
  long long units = (N + m.chunk - 1) / m.chunk;
  kn_cpu_pool_run(ctx->pool, units, grain_for((double)T * N * K, units, 1), mm_run, &m);
  return 0;
}

/* Output features per work unit of a matmul over rows widened to f32 first
 * (FP8): about TILE_CHUNK_BYTES of them. */
static int widened_chunk(int N, int K) {
  long long c = TILE_CHUNK_BYTES / (4LL * K);
  return (int)(c < 1 ? 1 : c > N ? N : c);
}

static int cpu_matmul(void *p, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                      const void *w, enum kn_dtype wdt, int T, int N, int K, int accumulate) {
  return mm(p, out, ldo, in, ldi, w, wdt, T, N, K, accumulate, 0.0f);
}

static int cpu_matmul_softcap(void *p, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                              const void *w, enum kn_dtype wdt, int T, int N, int K, float cap) {
  return mm(p, out, ldo, in, ldi, w, wdt, T, N, K, 0, cap);
}

/* ---- FP8 weights ----------------------------------------------------------- */

float kn_cpu_e4m3[256];
__attribute__((constructor)) static void e4m3_table(void) {
  for (int c = 0; c < 256; c++)
    kn_cpu_e4m3[c] = kn_f8e4m3_to_f32((uint8_t)c);
}

struct fp8_task {
  struct kn_cpu_ctx *ctx;
  float *out;
  ptrdiff_t ldo;
  const float *x; /* [T, K] the inputs rounded to bf16 */
  const uint8_t *w;
  const float *scale;
  int T, N, K, acc, chunk;
};

/* Features [n0, n0 + n) of each unit: the rows widened exactly through the
 * table, the f32 kernel's dot products of them with the rounded inputs (exact
 * products), then the scale. */
static void fp8_run(void *arg, long long u0, long long u1, int ith) {
  const struct fp8_task *f = arg;
  float *wf = f->ctx->scratch[ith], *dots = wf + (size_t)f->chunk * (size_t)f->K;
  for (long long u = u0; u < u1; u++) {
    int n0 = (int)u * f->chunk, n = f->N - n0 < f->chunk ? f->N - n0 : f->chunk;
    const uint8_t *w = f->w + (size_t)n0 * (size_t)f->K;
    for (size_t i = 0; i < (size_t)n * (size_t)f->K; i++)
      wf[i] = kn_cpu_e4m3[w[i]];
    f->ctx->dsp.matvec[KN_DTYPE_F32](dots, n, f->x, f->K, wf, f->K, f->T, n, 0);
    for (int t = 0; t < f->T; t++) {
      float *o = f->out + (ptrdiff_t)t * f->ldo + n0;
      const float *d = dots + (size_t)t * (size_t)n;
      for (int j = 0; j < n; j++) {
        float v = d[j] * f->scale[n0 + j];
        o[j] = f->acc ? o[j] + v : v;
      }
    }
  }
}

static int cpu_matmul_fp8(void *p, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                          const uint8_t *w, const float *scale, int T, int N, int K,
                          int accumulate) {
  struct kn_cpu_ctx *ctx = p;
  if (K == 0) {
    for (int t = 0; t < T && !accumulate; t++)
      memset(out + (ptrdiff_t)t * ldo, 0, N * 4u);
    return 0;
  }
  int rc = grow_buf((void **)&ctx->xr, &ctx->xr_floats, (size_t)T * (size_t)K, 4);
  if (rc) return rc;
  struct round_task rt = {in, ldi, ctx->xr, K};
  kn_cpu_pool_run(ctx->pool, T, grain_for((double)T * K, T, 16), round_run, &rt);
  struct fp8_task f = {ctx, out, ldo, ctx->xr, w, scale, T, N, K, accumulate, widened_chunk(N, K)};
  if ((rc = kn_cpu_ctx_scratch(ctx, (size_t)f.chunk * ((size_t)K + (size_t)T)))) return rc;
  long long units = (N + f.chunk - 1) / f.chunk;
  kn_cpu_pool_run(ctx->pool, units, grain_for((double)T * N * K, units, 1), fp8_run, &f);
  return 0;
}

/* ---- matmul then argmax -------------------------------------------------- */

/* Each unit finds each token's first maximum over its rows: tok_argmax with
 * the outputs in registers, or else the matmul's own kernels into the
 * thread's scratch (after their part, rows padded so they do not alias in L1)
 * and argmax rows there. The caller merges the units in order: the first unit
 * holding the overall maximum has its first index. No output reaches memory
 * beyond L2. */
/* kn_cpu_argmax_row over the outputs i of row[0, n) whose feature n0 + i allow
 * has: the first maximum of those that are not NaN (-1: none). The words that
 * allow at least half their outputs join a run for the vector argmax, the
 * outputs they refuse made NaN in row (which the argmax skips); the other
 * words go bit by bit: the cost follows what the mask allows. */
static int argmax_allowed(float *row, int n, const uint32_t *allow, int n0, float *max_out) {
  int best = -1, run = 0; /* run: where the run not yet searched starts */
  float bm = NAN;
  for (int i = 0;;) {
    int f = n0 + i, k = 32 - (f & 31);
    if (k > n - i) k = n - i;
    uint32_t full = k == 32 ? 0xffffffffu : (1u << k) - 1,
             word = i < n ? (allow[f >> 5] >> (f & 31)) & full : 0;
    if (i < n && 2 * __builtin_popcount(word) >= k) {
      for (uint32_t b = ~word & full; b; b &= b - 1)
        row[i + __builtin_ctz(b)] = NAN;
      i += k;
      continue;
    }
    if (i > run) { /* the run before this word */
      float mx;
      int r = kn_cpu_argmax_row(row + run, i - run, &mx);
      if (r >= 0 && (best < 0 || mx > bm)) best = run + r, bm = mx;
    }
    if (i >= n) break;
    for (uint32_t b = word; b; b &= b - 1) {
      int j = i + __builtin_ctz(b);
      float v = row[j];
      if (v == v && (best < 0 || v > bm)) best = j, bm = v;
    }
    i += k;
    run = i;
  }
  *max_out = bm;
  return best;
}

/* A unit's T rows of outputs ub (row stride ldu) of features n0 .. n0 + n - 1:
 * each token's first maximum among them (over what allow[t] allows) into
 * best[t]. */
static void unit_best(struct kn_cpu_best *best, float *ub, ptrdiff_t ldu, int T, int n0, int n,
                      const uint32_t *const *allow) {
  for (int t = 0; t < T; t++) {
    struct kn_cpu_best *b = &best[t];
    const uint32_t *a = allow ? allow[t] : NULL;
    int i = a ? argmax_allowed(ub + (ptrdiff_t)t * ldu, n, a, n0, &b->max)
              : kn_cpu_argmax_row(ub + (ptrdiff_t)t * ldu, n, &b->max);
    b->id = i < 0 ? -1 : n0 + i;
  }
}

static void mm_argmax_run(void *arg, long long u0, long long u1, int ith) {
  struct mm_task *m = arg;
  float *ub = m->ctx->scratch[ith] + ((m->wbuf + 15) & ~(size_t)15);
  const struct kn_cpu_dsp *dsp = &m->ctx->dsp;
  for (long long u = u0; u < u1; u++) {
    int n0 = (int)u * m->achunk, n = m->N - n0 < m->achunk ? m->N - n0 : m->achunk;
    if (m->tok) {
      const char *w = m->w + (size_t)n0 * (size_t)m->K * kn_dtype_size(m->dt);
      dsp->tok_argmax(m->best + u * m->T, n0, m->ctx->xt, m->T, w, m->dt, m->K, n, m->cap, m->allow,
                      m->ctx->scratch[ith]);
      continue;
    }
    for (int c0 = 0; c0 < n; c0 += m->chunk)
      mm_unit(m, ub + c0, m->ldu, n0 + c0, n - c0 < m->chunk ? n - c0 : m->chunk, ith);
    unit_best(m->best + u * m->T, ub, m->ldu, m->T, n0, n, m->allow);
  }
}

/* The units' maxima merged in order (the first unit holding the overall
 * maximum has its first index) into ids and max_out. */
static void merge_best(const struct kn_cpu_best *best, long long units, int T, int32_t *ids,
                       float *max_out, const uint32_t *const *allow) {
  for (int t = 0; t < T; t++) {
    int32_t id = -1;
    float mx = NAN;
    for (long long u = 0; u < units; u++) {
      const struct kn_cpu_best *b = &best[u * T + t];
      if (b->id >= 0 && (id < 0 || b->max > mx)) {
        id = b->id;
        mx = b->max;
      }
    }
    /* as kn_cpu_op_argmax, a row of NaN gives 0; a masked row that allows nothing, -1 */
    ids[t] = id >= 0 ? id : allow && allow[t] ? -1 : 0;
    if (max_out) max_out[t] = mx;
  }
}

/* ctx->best room for n entries. */
static int best_room(struct kn_cpu_ctx *ctx, size_t n) {
  if (n <= ctx->best_cap) return 0;
  struct kn_cpu_best *nb = malloc(n * sizeof(*nb));
  if (!nb) return CM_ERR_NOMEM;
  free(ctx->best);
  ctx->best = nb;
  ctx->best_cap = n;
  return 0;
}

/* matmul_argmax in the q8 mode: each unit's outputs as kn_matmul(_softcap)
 * computes them (q8_run's kernels and softcap) into the thread's scratch, then
 * each token's first maximum there; the outputs reach nothing beyond L2. */
struct q8_argmax {
  struct q8_task q;
  struct kn_cpu_best *best;
  const uint32_t *const *allow;
  ptrdiff_t ldu;
};

static void q8_argmax_run(void *arg, long long u0, long long u1, int ith) {
  const struct q8_argmax *a = arg;
  const struct q8_task *q = &a->q;
  const struct q8_part *pt = &q->parts[0];
  const struct kn_cpu_dsp *dsp = &q->ctx->dsp;
  float *ub = q->ctx->scratch[ith];
  for (long long u = u0; u < u1; u++) {
    const int n0 = (int)u * pt->chunk, n = pt->N - n0 < pt->chunk ? pt->N - n0 : pt->chunk;
    dsp->q8dot[q->dt](ub, a->ldu, &q->x, pt->w + (size_t)n0 * q->row_bytes, q->row_bytes, q->K,
                      q->T, n, 0);
    for (int t = 0; t < q->T && q->cap > 0.0f; t++)
      dsp->softcap(ub + (ptrdiff_t)t * a->ldu, ub + (ptrdiff_t)t * a->ldu, q->cap, (size_t)n);
    unit_best(a->best + u * q->T, ub, a->ldu, q->T, n0, n, a->allow);
  }
}

static int q8_argmax(struct kn_cpu_ctx *ctx, int32_t *ids, float *max_out, const float *in,
                     ptrdiff_t ldi, const void *w, enum kn_dtype wdt, int T, int N, int K,
                     float cap, const uint32_t *const *allow) {
  struct q8_argmax a = {.q = {.cap = cap}, .allow = allow};
  int rc = q8_inputs(ctx, in, ldi, wdt, T, K, &a.q);
  if (rc) return rc;
  q8_add_part(&a.q, NULL, 0, w, N, a.q.row_bytes);
  const long long units = q8_part_end(&a.q.parts[0]);
  a.ldu = ((ptrdiff_t)a.q.parts[0].chunk + 15) / 16 * 16 + 16; /* rows apart in L1's sets */
  if ((rc = best_room(ctx, (size_t)units * (size_t)T)) ||
      (rc = kn_cpu_ctx_scratch(ctx, (size_t)T * (size_t)a.ldu)))
    return rc;
  a.best = ctx->best;
  kn_cpu_pool_run(ctx->pool, units, grain_for((double)T * N * K, units, 1), q8_argmax_run, &a);
  merge_best(ctx->best, units, T, ids, max_out, allow);
  return 0;
}

/* matmul_argmax, and with allow (masks: tok_argmax's lanes take what their rows
 * allow, or the outputs in the thread's scratch and the argmax over what each
 * row allows) matmul_argmax_masked */
static int argmax_of(struct kn_cpu_ctx *ctx, int32_t *ids, float *max_out, const float *in,
                     ptrdiff_t ldi, const void *w, enum kn_dtype wdt, int T, int N, int K,
                     float cap, const uint32_t *const *allow) {
  if (K == 0) { /* every output is 0 (softcapped: 0) */
    for (int t = 0; t < T; t++) {
      ids[t] = 0;
      if (max_out) max_out[t] = 0.0f;
    }
    return 0;
  }
  if (ctx->q8 && ctx->dsp.q8dot[wdt]) /* the q8 mode's matmul, as kn_matmul has it */
    return q8_argmax(ctx, ids, max_out, in, ldi, w, wdt, T, N, K, cap, allow);
  if (kn_block_elems(wdt)) return CM_ERR_UNSUPPORTED; /* the caller's matmul and argmax */
  struct mm_task m = {
      .ctx = ctx, .in = in, .ldi = ldi, .w = w, .dt = wdt, .T = T, .N = N, .K = K, .cap = cap};
  m.allow = allow;
  int rc = mm_plan(ctx, &m, 1);
  if (rc) return rc;
  /* units of whole chunks, about ARGMAX_UNIT_ROWS or fewer (4 per thread):
   * the tile path's chunks are a few rows, too few to merge one by one */
  int nth = ctx->n_threads, most = (N + nth * 4 - 1) / (nth * 4);
  int per = (most < ARGMAX_UNIT_ROWS ? most : ARGMAX_UNIT_ROWS) / m.chunk;
  m.achunk = m.tok ? m.chunk : m.chunk * (per < 1 ? 1 : per);
  m.ldu = ((ptrdiff_t)m.achunk + 15) / 16 * 16 + 16;
  long long units = (N + m.achunk - 1) / m.achunk;
  if ((rc = best_room(ctx, (size_t)units * (size_t)T))) return rc;
  m.best = ctx->best;
  size_t need = m.tok ? m.wbuf : ((m.wbuf + 15) & ~(size_t)15) + (size_t)T * (size_t)m.ldu;
  if ((rc = kn_cpu_ctx_scratch(ctx, need))) return rc;
  kn_cpu_pool_run(ctx->pool, units, grain_for((double)T * N * K, units, 1), mm_argmax_run, &m);
  merge_best(m.best, units, T, ids, max_out, allow);
  return 0;
}

static int cpu_matmul_argmax(void *p, int32_t *ids, float *max_out, const float *in, ptrdiff_t ldi,
                             const void *w, enum kn_dtype wdt, int T, int N, int K, float cap) {
  return argmax_of(p, ids, max_out, in, ldi, w, wdt, T, N, K, cap, NULL);
}

static int cpu_matmul_argmax_masked(void *p, int32_t *ids, float *max_out, const float *in,
                                    ptrdiff_t ldi, const void *w, enum kn_dtype wdt, int T, int N,
                                    int K, float cap, const uint32_t *const *allow) {
  return argmax_of(p, ids, max_out, in, ldi, w, wdt, T, N, K, cap, allow);
}

struct mm_rows_task {
  struct kn_cpu_ctx *ctx;
  float *out;
  ptrdiff_t ldo;
  const float *in;
  ptrdiff_t ldi;
  const char *w;
  enum kn_dtype dt;
  int K, T, n_rows;
  const int32_t *rows;
  int bf; /* bf16 mode: dot_bf16 over ctx->xb (row stride ldx) */
  ptrdiff_t ldx;
};

static void mm_rows_run(void *arg, long long b, long long e, int ith) {
  struct mm_rows_task *m = arg;
  (void)ith;
  size_t row_bytes = (size_t)m->K * kn_dtype_size(m->dt);
  for (long long j = b; j < e; j++)
    if (m->bf)
      m->ctx->dsp.dot_bf16(m->out + j, m->ldo, m->ctx->xb, m->ldx,
                           (const uint16_t *)(m->w + (size_t)m->rows[j] * row_bytes), m->K, m->T, 1,
                           0);
    else
      m->ctx->dsp.matvec[m->dt](m->out + j, m->ldo, m->in, m->ldi,
                                m->w + (size_t)m->rows[j] * row_bytes, m->K, m->T, 1, 0);
}

static int cpu_matmul_rows(void *p, float *out, ptrdiff_t ldo, const float *in, ptrdiff_t ldi,
                           const void *w, enum kn_dtype wdt, int K, const int32_t *rows, int n_rows,
                           int T) {
  struct kn_cpu_ctx *ctx = p;
  if (K == 0) {
    for (int t = 0; t < T; t++)
      memset(out + (ptrdiff_t)t * ldo, 0, n_rows * 4u);
    return 0;
  }
  if (kn_dtype_x16(wdt)) return CM_ERR_UNSUPPORTED; /* rows of their own: not for a few rows */
  struct mm_rows_task m = {ctx, out, ldo, in, ldi, w, wdt, K, T, n_rows, rows, 0, 0};
  int rc = bf16_inputs(ctx, wdt, T, K, &m.in, &m.ldi, &m.bf, &m.ldx);
  if (rc) return rc;
  kn_cpu_pool_run(ctx->pool, n_rows, grain_for((double)T * n_rows * K, n_rows, 16), mm_rows_run,
                  &m);
  return 0;
}

/* ---- row-wise ops ------------------------------------------------------- */

struct rows_task {
  struct kn_cpu_ctx *ctx;
  int op; /* ROWS_* */
  float *out;
  ptrdiff_t ldo;
  const float *a;
  ptrdiff_t lda;
  const float *b;
  ptrdiff_t ldb;
  int rows, d;
  const void *w;
  enum kn_dtype wdt;
  float eps;
  enum kn_norm_mode mode;
};

enum { ROWS_NORM, ROWS_GELU, ROWS_COPY };

/* Rows per claim: about 16K elements. */
static long long rows_grain(int d) {
  return d >= 16384 ? 1 : 16384 / d;
}

static void rows_run(void *arg, long long b, long long e, int ith) {
  struct rows_task *r = arg;
  const struct kn_cpu_dsp *dsp = &r->ctx->dsp;
  (void)ith;
  for (long long i = b; i < e; i++) {
    float *o = r->out + i * r->ldo;
    const float *x = r->a + i * r->lda;
    switch (r->op) {
    case ROWS_NORM: dsp->rmsnorm(o, x, r->d, r->w, r->wdt, r->eps, r->mode); break;
    case ROWS_GELU: dsp->gelu_mul(o, x, r->b + i * r->ldb, r->d); break;
    case ROWS_COPY: memcpy(o, x, (size_t)r->d * sizeof(float)); break;
    }
  }
}

static int cpu_rmsnorm(void *p, float *out, ptrdiff_t ldo, const float *x, ptrdiff_t ldx, int rows,
                       int d, const void *w, enum kn_dtype wdt, float eps, enum kn_norm_mode mode) {
  struct kn_cpu_ctx *ctx = p;
  struct rows_task r = {.ctx = ctx,
                        .op = ROWS_NORM,
                        .out = out,
                        .ldo = ldo,
                        .a = x,
                        .lda = ldx,
                        .rows = rows,
                        .d = d,
                        .w = w,
                        .wdt = wdt,
                        .eps = eps,
                        .mode = mode};
  kn_cpu_pool_run(ctx->pool, rows, grain_for((double)rows * d, rows, rows_grain(d)), rows_run, &r);
  return 0;
}

static int cpu_gelu_mul(void *p, float *out, ptrdiff_t ldo, const float *gate, ptrdiff_t ldg,
                        const float *up, ptrdiff_t ldu, int T, int N) {
  struct kn_cpu_ctx *ctx = p;
  struct rows_task r = {.ctx = ctx,
                        .op = ROWS_GELU,
                        .out = out,
                        .ldo = ldo,
                        .a = gate,
                        .lda = ldg,
                        .b = up,
                        .ldb = ldu,
                        .rows = T,
                        .d = N};
  kn_cpu_pool_run(ctx->pool, T, grain_for(8.0 * T * N, T, rows_grain(N)), rows_run, &r);
  return 0;
}

static int cpu_copy_rows(void *p, float *dst, ptrdiff_t ldd, const float *src, ptrdiff_t lds,
                         int rows, int cols) {
  struct kn_cpu_ctx *ctx = p;
  struct rows_task r = {.ctx = ctx,
                        .op = ROWS_COPY,
                        .out = dst,
                        .ldo = ldd,
                        .a = src,
                        .lda = lds,
                        .rows = rows,
                        .d = cols};
  kn_cpu_pool_run(ctx->pool, rows, rows, rows_run, &r);
  return 0;
}

/* kn_add_norm, a row at a time: the post-norm, the residual add and scale and
 * the next norm while the row is in cache, each with the kernel the unfused
 * op runs on a row (elementwise results do not depend on where an element
 * sits in a call), so the same bits as the sequence. */
struct add_norm_task {
  struct kn_cpu_ctx *ctx;
  float *x, *o, *h;
  ptrdiff_t ldx, ldo, ldh;
  int H;
  const void *post_w, *next_w;
  enum kn_dtype wdt;
  float scale, eps;
  enum kn_norm_mode mode;
};

static void add_norm_run(void *arg, long long b, long long e, int ith) {
  const struct add_norm_task *a = arg;
  const struct kn_cpu_dsp *dsp = &a->ctx->dsp;
  (void)ith;
  for (long long t = b; t < e; t++) {
    float *x = a->x + t * a->ldx, *o = a->o + t * a->ldo;
    dsp->rmsnorm(o, o, a->H, a->post_w, a->wdt, a->eps, a->mode);
    dsp->add(x, x, o, (size_t)a->H);
    if (a->scale != 1.0f) dsp->scale(x, x, a->scale, (size_t)a->H);
    if (a->h) dsp->rmsnorm(a->h + t * a->ldh, x, a->H, a->next_w, a->wdt, a->eps, a->mode);
  }
}

static int cpu_add_norm(void *p, float *x, ptrdiff_t ldx, float *o, ptrdiff_t ldo, float *h,
                        ptrdiff_t ldh, int T, int H, const void *post_w, const void *next_w,
                        enum kn_dtype wdt, float scale, float eps, enum kn_norm_mode mode) {
  struct kn_cpu_ctx *ctx = p;
  struct add_norm_task a = {ctx, x, o, h, ldx, ldo, ldh, H, post_w, next_w, wdt, scale, eps, mode};
  kn_cpu_pool_run(ctx->pool, T, grain_for(4.0 * T * H, T, rows_grain(H)), add_norm_run, &a);
  return 0;
}

/* ---- flat elementwise ops ----------------------------------------------- */

struct flat_task {
  struct kn_cpu_ctx *ctx;
  int op; /* FLAT_* */
  float *out;
  const float *a, *b;
  float s;
  size_t n;
};

enum { FLAT_ADD, FLAT_MUL, FLAT_SCALE, FLAT_SOFTCAP };

#define FLAT_UNIT 4096 /* elements per unit */

static void flat_run(void *arg, long long u0, long long u1, int ith) {
  struct flat_task *f = arg;
  const struct kn_cpu_dsp *dsp = &f->ctx->dsp;
  (void)ith;
  size_t b = (size_t)u0 * FLAT_UNIT, e = (size_t)u1 * FLAT_UNIT;
  if (e > f->n) e = f->n;
  size_t n = e - b;
  switch (f->op) {
  case FLAT_ADD: dsp->add(f->out + b, f->a + b, f->b + b, n); break;
  case FLAT_MUL: dsp->mul(f->out + b, f->a + b, f->b + b, n); break;
  case FLAT_SCALE: dsp->scale(f->out + b, f->a + b, f->s, n); break;
  case FLAT_SOFTCAP: dsp->softcap(f->out + b, f->a + b, f->s, n); break;
  }
}

static int flat(struct kn_cpu_ctx *ctx, int op, float *out, const float *a, const float *b, float s,
                size_t n, double cost) {
  struct flat_task f = {ctx, op, out, a, b, s, n};
  long long units = (long long)((n + FLAT_UNIT - 1) / FLAT_UNIT);
  kn_cpu_pool_run(ctx->pool, units, grain_for(cost * (double)n, units, 4), flat_run, &f);
  return 0;
}

static int cpu_add(void *p, float *out, const float *a, const float *b, size_t n) {
  return flat(p, FLAT_ADD, out, a, b, 0.0f, n, 0.25);
}
static int cpu_mul(void *p, float *out, const float *a, const float *b, size_t n) {
  return flat(p, FLAT_MUL, out, a, b, 0.0f, n, 0.25);
}
static int cpu_scale(void *p, float *out, const float *a, float s, size_t n) {
  return flat(p, FLAT_SCALE, out, a, NULL, s, n, 0.25);
}
static int cpu_softcap(void *p, float *out, const float *a, float cap, size_t n) {
  return flat(p, FLAT_SOFTCAP, out, a, NULL, cap, n, 8.0);
}

/* ---- attention ---------------------------------------------------------- */

struct attn_task {
  struct kn_cpu_ctx *ctx;
  struct kn_cpu_attn_job job;
  int n_seqs;
  int hsplit; /* head chunks per (query, kv head) item */
  int hper;   /* query heads per chunk */
  kn_cpu_attn_fn attn;
  kn_cpu_attn_tile_fn tile; /* or NULL */
};

/* Work items of a sequence's n query rows: tiles of KN_ATTN_TILE rows. */
static long long tiles(int n) {
  return ((long long)n + KN_ATTN_TILE - 1) / KN_ATTN_TILE;
}

static void attn_run(void *arg, long long u0, long long u1, int ith) {
  struct attn_task *a = arg;
  const long long *start = a->ctx->seq_items;
  int n_kv = a->job.view->n_kv_heads;
  (void)ith;
  for (long long it = u0; it < u1; it++) {
    int lo = 0, hi = a->n_seqs - 1; /* last sequence whose start <= it */
    while (lo < hi) {
      int mid = (lo + hi + 1) / 2;
      if (start[mid] <= it)
        lo = mid;
      else
        hi = mid - 1;
    }
    long long local = it - start[lo];
    int hc = (int)(local % a->hsplit);
    local /= a->hsplit;
    int g0 = hc * a->hper, group = a->job.n_heads / n_kv;
    int ng = group - g0 < a->hper ? group - g0 : a->hper;
    const struct kn_attn_seq *s = &a->job.seqs[lo];
    int i0 = (int)(local / n_kv) * KN_ATTN_TILE, kvh = (int)(local % n_kv);
    int nr = s->n_q - i0 < KN_ATTN_TILE ? s->n_q - i0 : KN_ATTN_TILE;
    if (ng <= 0) continue;
    if (nr > 1 && a->tile)
      a->tile(&a->job, s, i0, nr, kvh, g0, ng);
    else
      for (int r = 0; r < nr; r++)
        a->attn(&a->job, s, i0 + r, kvh, g0, ng);
  }
}

/* A lone decode row's spans over the threads: unit u is kv head u / ns's span
 * s0 + u % ns, its heads' states at st + u * per (the group's m, then l, then
 * their accumulators, then a sink for the kernel's own output); then a unit
 * per query head merges its spans (merge_run, D floats of acc each). */
struct attn_split {
  struct kn_cpu_attn_job job;
  kn_cpu_attn_part_fn part;
  int group, ns, s0;
  size_t per;
  float *st, *acc;
};

static void split_run(void *arg, long long u0, long long u1, int ith) {
  const struct attn_split *a = arg;
  const int G = a->group, D = a->job.view->head_dim;
  (void)ith;
  for (long long u = u0; u < u1; u++) {
    float *st = a->st + (size_t)u * a->per;
    const int s = a->s0 + (int)(u % a->ns);
    struct kn_cpu_attn_part part = {.k0 = s * KN_ATTN_SPAN,
                                    .k1 = (s + 1) * KN_ATTN_SPAN,
                                    .m = st,
                                    .l = st + G,
                                    .acc = st + 2 * G,
                                    .sink = st + 2 * G + (size_t)G * D};
    a->part(&a->job, a->job.seqs, 0, (int)(u / a->ns), 0, G, &part);
  }
}

/* Query head u of the row (kv head u / group): its spans' states merged in
 * position order, then over l into the output. */
static void merge_run(void *arg, long long u0, long long u1, int ith) {
  const struct attn_split *a = arg;
  const int G = a->group, D = a->job.view->head_dim;
  (void)ith;
  for (long long u = u0; u < u1; u++) {
    const int kvh = (int)(u / G), g = (int)(u % G);
    float M = -INFINITY, L = 0.0f, *ACC = a->acc + (size_t)u * D;
    for (int s = 0; s < a->ns; s++) {
      const float *st = a->st + (size_t)(kvh * a->ns + s) * a->per;
      kn_cpu_attn_merge(&M, &L, ACC, st[g], st[G + g], st + 2 * G + (size_t)g * D, D);
    }
    float *o = a->job.out + (ptrdiff_t)a->job.seqs->q_begin * a->job.ldo + (ptrdiff_t)u * D;
    for (int d = 0; d < D; d++)
      o[d] = ACC[d] / L;
  }
}

/* The one row of seqs[0] (n_q == 1) with its spans over the threads, when it
 * has at least two: each span's states (the table's attn_part), then per head
 * the spans merged in position order and the result over l, as the walk of
 * one thread does (kn_cpu_attn_span_end, kn_cpu_attn_walk_end): the same
 * bits. 1: done; 0: one span (nothing done). */
static int attention_split(struct kn_cpu_ctx *ctx, const struct kn_cpu_attn_job *job, int *rc) {
  const struct kn_kv_view *view = job->view;
  const struct kn_attn_seq *seq = job->seqs;
  int lo, hi;
  kn_cpu_attn_range(seq, job->window, seq->pos0, &lo, &hi);
  const int s0 = lo / KN_ATTN_SPAN, ns = hi / KN_ATTN_SPAN - s0 + 1;
  if (ns < 2) return 0;
  const int G = job->n_heads / view->n_kv_heads, D = view->head_dim, nkv = view->n_kv_heads;
  const size_t per = (size_t)G * (size_t)(D + 2) + (size_t)D;
  const long long units = (long long)nkv * ns, heads = (long long)nkv * G;
  if ((*rc = grow_buf((void **)&ctx->attn_st, &ctx->attn_st_n,
                      (size_t)units * per + (size_t)heads * (size_t)D, sizeof(float))))
    return 1;
  struct attn_split a = {
      *job, ctx->dsp.attn_part, G, ns, s0, per, ctx->attn_st, ctx->attn_st + (size_t)units * per};
  kn_cpu_pool_run(ctx->pool, units, 1, split_run, &a);
  kn_cpu_pool_run(ctx->pool, heads, 1, merge_run, &a);
  *rc = 0;
  return 1;
}

static int cpu_attention(void *p, float *out, ptrdiff_t ldo, const float *q, ptrdiff_t ldq,
                         const struct kn_kv_view *view, const struct kn_attn_seq *seqs, int n_seqs,
                         int n_heads, int window, float scale, float softcap) {
  struct kn_cpu_ctx *ctx = p;
  if (n_seqs + 1 > ctx->seq_items_cap) {
    int cap = n_seqs + 1 + 64;
    long long *s = realloc(ctx->seq_items, (size_t)cap * sizeof(long long));
    if (!s) return CM_ERR_NOMEM;
    ctx->seq_items = s;
    ctx->seq_items_cap = cap;
  }
  /* Fewer (query, kv head) items than threads, as in a single-sequence decode
   * with one kv head: split each GQA group's heads over the threads too (each
   * head's arithmetic does not depend on its neighbours), an item a thread, so
   * the heads of an item share its walk over the keys (each K and V vector
   * widened once for them; 4 heads on 2 threads: 2 items of 2 heads, 20-25%
   * faster than 4 items of one). */
  long long base = 0; /* items: row tiles x kv heads */
  for (int i = 0; i < n_seqs; i++)
    base += (long long)tiles(seqs[i].n_q) * view->n_kv_heads;
  int group = n_heads / view->n_kv_heads, hsplit = 1;
  if (base < ctx->n_threads) {
    long long want = (ctx->n_threads + base - 1) / (base ? base : 1);
    hsplit = want < group ? (int)want : group;
  }
  int hper = (group + hsplit - 1) / hsplit;
  long long items = 0;
  double work = 0;
  for (int i = 0; i < n_seqs; i++) {
    ctx->seq_items[i] = items;
    items += (long long)tiles(seqs[i].n_q) * view->n_kv_heads * hsplit;
    work += (double)seqs[i].n_q * n_heads * view->head_dim * (seqs[i].pos0 + seqs[i].n_q);
  }
  ctx->seq_items[n_seqs] = items;
  struct attn_task a = {.ctx = ctx,
                        .job = {out, ldo, q, ldq, view, seqs, n_heads, window, scale, softcap},
                        .n_seqs = n_seqs,
                        .hsplit = hsplit,
                        .hper = hper,
                        .attn = ctx->dsp.attn,
                        .tile = ctx->dsp.attn_tile};
  /* the bf16 mode's kernels take bf16 caches; an fp8 one stays on the default
   * table's, which widen it exactly as they load it */
  if (ctx->bf16 && ctx->dsp.attn_bf16 && view->dtype != KN_DTYPE_F8E4M3) {
    a.attn = ctx->dsp.attn_bf16;
    a.tile = ctx->dsp.attn_tile_bf16;
  }
  /* One sequence's decode row with fewer items than threads: its key spans
   * split over the threads instead of its heads, each thread reading only its
   * spans' K and V (a decode step's K and V come from memory: one thread's
   * walk over all of them ran at a third of the machine's bandwidth). */
  if (n_seqs == 1 && seqs[0].n_q == 1 && base < ctx->n_threads && a.attn == ctx->dsp.attn &&
      ctx->dsp.attn_part && view->head_dim % 8 == 0) {
    int rc;
    if (attention_split(ctx, &a.job, &rc)) return rc;
  }
  kn_cpu_pool_run(ctx->pool, items, grain_for(work, items, 1), attn_run, &a);
  return 0;
}

static int cpu_kv_write(void *p, const struct kn_kv_view *view, const int32_t *slot_mapping,
                        const float *k, ptrdiff_t ldk, const float *v, ptrdiff_t ldv, int T) {
  (void)p;
  size_t n = (size_t)view->n_kv_heads * (size_t)view->head_dim; /* elements per token */
  size_t elt = kn_dtype_size(view->dtype);
  for (int t = 0; t < T; t++) {
    int32_t s = slot_mapping[t];
    if (s < 0) continue;
    char *page = (char *)view->pool + (size_t)(s / view->block_tokens) * view->page_bytes;
    size_t off = (size_t)(s % view->block_tokens) * n * elt;
    for (int which = 0; which < 2; which++) {
      const float *src = which ? v : k, *scale = which ? view->v_scale : view->k_scale;
      if (!src) continue;
      src += (ptrdiff_t)t * (which ? ldv : ldk);
      char *dst = page + (which ? view->v_off : view->k_off) + off;
      if (view->dtype == KN_DTYPE_F32)
        memcpy(dst, src, n * sizeof(float));
      else if (scale) /* an fp8 cache with the checkpoint's scales */
        for (size_t i = 0; i < n; i++)
          kn_store_f32(dst, view->dtype, i, src[i] / scale[i / (size_t)view->head_dim]);
      else
        for (size_t i = 0; i < n; i++)
          kn_store_f32(dst, view->dtype, i, src[i]);
    }
  }
  return 0;
}

void kn_cpu_ops_fill(struct kn_backend_ops *ops) {
  ops->embed = kn_cpu_op_embed;
  ops->weights_prepare = cpu_weights_prepare;
  ops->rmsnorm = cpu_rmsnorm;
  ops->matmul = cpu_matmul;
  ops->matmul_rows = cpu_matmul_rows;
  ops->matmul_fp8 = cpu_matmul_fp8;
  ops->matmul_n = cpu_matmul_n;
  ops->matmul_glu = cpu_matmul_glu;
  ops->rope = kn_cpu_op_rope;
  ops->gelu_mul = cpu_gelu_mul;
  ops->add = cpu_add;
  ops->mul = cpu_mul;
  ops->scale = cpu_scale;
  ops->softcap = cpu_softcap;
  ops->matmul_softcap = cpu_matmul_softcap;
  ops->matmul_argmax = cpu_matmul_argmax;
  ops->matmul_argmax_masked = cpu_matmul_argmax_masked;
  ops->copy_rows = cpu_copy_rows;
  ops->add_norm = cpu_add_norm;
  ops->argmax = kn_cpu_op_argmax;
  ops->router_topk = kn_cpu_op_router_topk;
  ops->sample = kn_cpu_op_sample;
  ops->kv_write = cpu_kv_write;
  ops->attention = cpu_attention;
  kn_cpu_vision_ops_fill(ops);
  kn_cpu_audio_ops_fill(ops);
}
